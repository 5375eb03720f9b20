//! Element types, dimensions, shapes and tensor types, printed exactly as StableHLO spells them.

use std::fmt;
use std::sync::Arc;

/// The element types a kernel can take or produce.
///
/// `Display` prints the MLIR spelling (`f32`, `bf16`, `i1`, `ui8`, `f8E4M3FN`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum DType {
    F32,
    F64,
    BF16,
    F16,
    I8,
    I16,
    I32,
    I64,
    U8,
    U32,
    Bool,
    F8E4M3FN,
    F8E5M2,
}

/// The broad class of an element type, used by the builder's type rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeClass {
    Float,
    SignedInt,
    UnsignedInt,
    Bool,
}

impl DType {
    /// Every element type, in a fixed order.
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U32,
        DType::Bool,
        DType::F8E4M3FN,
        DType::F8E5M2,
    ];

    /// The MLIR spelling of the element type.
    pub const fn mlir_name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "ui8",
            DType::U32 => "ui32",
            DType::Bool => "i1",
            DType::F8E4M3FN => "f8E4M3FN",
            DType::F8E5M2 => "f8E5M2",
        }
    }

    /// The short name users write in attributes and signatures (`f32`, `bf16`, `bool`, `u8`).
    pub const fn short_name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::Bool => "bool",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F8E5M2 => "f8e5m2",
            other => other.mlir_name(),
        }
    }

    /// Parses either spelling: the short name (`bool`, `u8`) or the MLIR one (`i1`, `ui8`).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.short_name() == name || d.mlir_name() == name)
    }

    pub const fn class(self) -> DTypeClass {
        match self {
            DType::F32
            | DType::F64
            | DType::BF16
            | DType::F16
            | DType::F8E4M3FN
            | DType::F8E5M2 => DTypeClass::Float,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 => DTypeClass::SignedInt,
            DType::U8 | DType::U32 => DTypeClass::UnsignedInt,
            DType::Bool => DTypeClass::Bool,
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(self.class(), DTypeClass::Float)
    }

    pub const fn is_integer(self) -> bool {
        matches!(self.class(), DTypeClass::SignedInt | DTypeClass::UnsignedInt)
    }

    pub const fn is_bool(self) -> bool {
        matches!(self, DType::Bool)
    }

    /// Width of one element in bits (`i1` counts as 1).
    pub const fn bits(self) -> u32 {
        match self {
            DType::Bool => 1,
            DType::I8 | DType::U8 | DType::F8E4M3FN | DType::F8E5M2 => 8,
            DType::I16 | DType::BF16 | DType::F16 => 16,
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F64 | DType::I64 => 64,
        }
    }

    /// Bytes one element occupies in a host buffer (`bool` takes one byte).
    pub const fn byte_size(self) -> usize {
        match self {
            DType::Bool => 1,
            other => (other.bits() / 8) as usize,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mlir_name())
    }
}

/// One dimension: a static size, or a symbol (printed `?`) whose name ties equal dimensions together.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    Static(u64),
    Symbolic(Arc<str>),
}

impl Dim {
    pub fn sym(name: &str) -> Dim {
        Dim::Symbolic(Arc::from(name))
    }

    pub fn as_static(&self) -> Option<u64> {
        match self {
            Dim::Static(n) => Some(*n),
            Dim::Symbolic(_) => None,
        }
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Dim {
        Dim::Static(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Static(n) => write!(f, "{n}"),
            Dim::Symbolic(_) => f.write_str("?"),
        }
    }
}

/// A list of dimensions; rank 0 is a scalar.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    pub fn of(dims: &[u64]) -> Shape {
        Shape(dims.iter().map(|&d| Dim::Static(d)).collect())
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    pub fn is_static(&self) -> bool {
        self.0.iter().all(|d| matches!(d, Dim::Static(_)))
    }

    /// The static sizes, or `None` if any dimension is symbolic.
    pub fn static_dims(&self) -> Option<Vec<u64>> {
        self.0.iter().map(Dim::as_static).collect()
    }

    /// The element count, or `None` if any dimension is symbolic (or the count overflows).
    pub fn num_elements(&self) -> Option<u64> {
        self.0.iter().try_fold(1u64, |acc, d| acc.checked_mul(d.as_static()?))
    }
}

impl From<&[u64]> for Shape {
    fn from(dims: &[u64]) -> Shape {
        Shape::of(dims)
    }
}

impl<const N: usize> From<[u64; N]> for Shape {
    fn from(dims: [u64; N]) -> Shape {
        Shape::of(&dims)
    }
}

impl FromIterator<Dim> for Shape {
    fn from_iter<I: IntoIterator<Item = Dim>>(iter: I) -> Shape {
        Shape(iter.into_iter().collect())
    }
}

/// A ranked tensor type: `tensor<8x128xf32>`, `tensor<f32>`, `tensor<?x512xbf16>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType { dtype, shape: shape.into() }
    }

    pub fn scalar(dtype: DType) -> TensorType {
        TensorType { dtype, shape: Shape::scalar() }
    }

    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    pub fn with_dtype(&self, dtype: DType) -> TensorType {
        TensorType { dtype, shape: self.shape.clone() }
    }

    pub fn with_shape(&self, shape: Shape) -> TensorType {
        TensorType { dtype: self.dtype, shape }
    }

    /// Parses the short signature spelling `f32[8,128]` (symbols allowed: `bf16[B,128]`,
    /// scalars as `f32[]`).
    pub fn parse_short(text: &str) -> Result<TensorType, String> {
        let text = text.trim();
        let open = text.find('[').ok_or_else(|| format!("expected `dtype[dims]`, got `{text}`"))?;
        let Some(inner) = text[open + 1..].strip_suffix(']') else {
            return Err(format!("missing `]` in `{text}`"));
        };
        let dtype_name = &text[..open];
        let dtype = DType::from_name(dtype_name).ok_or_else(|| {
            let known: Vec<&str> = DType::ALL.iter().map(|d| d.short_name()).collect();
            format!("unknown dtype `{dtype_name}` (known: {})", known.join(", "))
        })?;
        let mut dims = Vec::new();
        if !inner.trim().is_empty() {
            for part in inner.split(',') {
                let part = part.trim();
                if let Ok(n) = part.parse::<u64>() {
                    dims.push(Dim::Static(n));
                } else if !part.is_empty()
                    && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !part.starts_with(|c: char| c.is_ascii_digit())
                {
                    dims.push(Dim::sym(part));
                } else {
                    return Err(format!("bad dimension `{part}` in `{text}`"));
                }
            }
        }
        Ok(TensorType { dtype, shape: Shape(dims) })
    }

    /// The short spelling, the inverse of [`TensorType::parse_short`].
    pub fn short(&self) -> String {
        let dims: Vec<String> = self
            .shape
            .0
            .iter()
            .map(|d| match d {
                Dim::Static(n) => n.to_string(),
                Dim::Symbolic(s) => s.to_string(),
            })
            .collect();
        format!("{}[{}]", self.dtype.short_name(), dims.join(","))
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.shape.0 {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_types_print_as_stablehlo() {
        assert_eq!(TensorType::new(DType::F32, [8, 128]).to_string(), "tensor<8x128xf32>");
        assert_eq!(TensorType::scalar(DType::Bool).to_string(), "tensor<i1>");
        assert_eq!(TensorType::new(DType::U8, [3]).to_string(), "tensor<3xui8>");
        let sym = TensorType { dtype: DType::BF16, shape: Shape(vec![Dim::sym("b"), 512.into()]) };
        assert_eq!(sym.to_string(), "tensor<?x512xbf16>");
        assert_eq!(TensorType::scalar(DType::F8E4M3FN).to_string(), "tensor<f8E4M3FN>");
    }

    #[test]
    fn short_signatures_round_trip() {
        for s in ["f32[8,128]", "bf16[B,128]", "bool[]", "u8[1]", "f8e5m2[2,3]"] {
            assert_eq!(TensorType::parse_short(s).unwrap().short(), s);
        }
        assert!(TensorType::parse_short("f33[1]").unwrap_err().contains("unknown dtype `f33`"));
        assert!(TensorType::parse_short("f32[1,-2]").unwrap_err().contains("bad dimension `-2`"));
        assert!(TensorType::parse_short("f32[1").unwrap_err().contains("missing `]`"));
    }

    #[test]
    fn dtype_names_parse_both_spellings() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.short_name()), Some(d));
            assert_eq!(DType::from_name(d.mlir_name()), Some(d));
        }
    }
}
