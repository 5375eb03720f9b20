//! The kernel IR: an arena of typed values per function, ops in regions, and the one table of
//! type rules ([`infer`]) that both the builder and the verifier use.

use std::collections::BTreeSet;
use std::fmt;

use crate::error::{OpError, op_err};
use crate::literal::Literal;
use crate::types::{DType, DTypeClass, Dim, Shape, TensorType};

/// A value of one function: an index into [`Function::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

/// A region of one function: an index into [`Function::regions`]. Region 0 is the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u32);

/// Which element types an op accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepts {
    Float,
    Int,
    SignedOrFloat,
    IntOrFloat,
    IntOrBool,
    Any,
}

impl Accepts {
    pub fn allows(self, dtype: DType) -> bool {
        let class = dtype.class();
        match self {
            Accepts::Float => class == DTypeClass::Float,
            Accepts::Int => matches!(class, DTypeClass::SignedInt | DTypeClass::UnsignedInt),
            Accepts::SignedOrFloat => matches!(class, DTypeClass::Float | DTypeClass::SignedInt),
            Accepts::IntOrFloat => class != DTypeClass::Bool,
            Accepts::IntOrBool => class != DTypeClass::Float,
            Accepts::Any => true,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Accepts::Float => "a float type",
            Accepts::Int => "an integer type",
            Accepts::SignedOrFloat => "a signed integer or float type",
            Accepts::IntOrFloat => "an integer or float type",
            Accepts::IntOrBool => "an integer or bool type",
            Accepts::Any => "any type",
        }
    }
}

/// Declares an elementwise op family once: variant, printed name, accepted element types.
macro_rules! elementwise_ops {
    ($(#[$meta:meta])* $enum:ident { $($variant:ident => $name:literal, $accepts:ident;)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $enum { $($variant,)* }

        impl $enum {
            pub const ALL: &'static [$enum] = &[$($enum::$variant,)*];

            /// The op's name as printed (`stablehlo.add`, `chlo.erf`).
            pub const fn name(self) -> &'static str {
                match self { $($enum::$variant => $name,)* }
            }

            pub const fn accepts(self) -> Accepts {
                match self { $($enum::$variant => Accepts::$accepts,)* }
            }
        }
    };
}

elementwise_ops! {
    /// Elementwise unary ops. `erf` is `chlo.erf`, which XLA expands to a rational approximation.
    UnaryOp {
        Negate => "stablehlo.negate", IntOrFloat;
        Abs => "stablehlo.abs", SignedOrFloat;
        Exp => "stablehlo.exponential", Float;
        Log => "stablehlo.log", Float;
        LogPlusOne => "stablehlo.log_plus_one", Float;
        Tanh => "stablehlo.tanh", Float;
        Logistic => "stablehlo.logistic", Float;
        Sqrt => "stablehlo.sqrt", Float;
        Rsqrt => "stablehlo.rsqrt", Float;
        Sine => "stablehlo.sine", Float;
        Cosine => "stablehlo.cosine", Float;
        Floor => "stablehlo.floor", Float;
        Ceil => "stablehlo.ceil", Float;
        Sign => "stablehlo.sign", SignedOrFloat;
        Not => "stablehlo.not", IntOrBool;
        Erf => "chlo.erf", Float;
    }
}

elementwise_ops! {
    /// Elementwise binary ops over operands of one type.
    BinaryOp {
        Add => "stablehlo.add", Any;
        Subtract => "stablehlo.subtract", IntOrFloat;
        Multiply => "stablehlo.multiply", Any;
        Divide => "stablehlo.divide", IntOrFloat;
        Remainder => "stablehlo.remainder", IntOrFloat;
        Maximum => "stablehlo.maximum", Any;
        Minimum => "stablehlo.minimum", Any;
        Power => "stablehlo.power", IntOrFloat;
        Atan2 => "stablehlo.atan2", Float;
        And => "stablehlo.and", IntOrBool;
        Or => "stablehlo.or", IntOrBool;
        Xor => "stablehlo.xor", IntOrBool;
        ShiftLeft => "stablehlo.shift_left", Int;
        ShiftRightLogical => "stablehlo.shift_right_logical", Int;
        ShiftRightArithmetic => "stablehlo.shift_right_arithmetic", Int;
    }
}

/// `stablehlo.compare` directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Eq,
    Ne,
    Ge,
    Gt,
    Le,
    Lt,
}

impl Direction {
    pub const fn name(self) -> &'static str {
        match self {
            Direction::Eq => "EQ",
            Direction::Ne => "NE",
            Direction::Ge => "GE",
            Direction::Gt => "GT",
            Direction::Le => "LE",
            Direction::Lt => "LT",
        }
    }
}

/// Precision of one `dot_general` operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    Default,
    High,
    Highest,
}

impl Precision {
    pub const fn name(self) -> &'static str {
        match self {
            Precision::Default => "DEFAULT",
            Precision::High => "HIGH",
            Precision::Highest => "HIGHEST",
        }
    }
}

/// `dot_general` dimension numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DotDims {
    pub lhs_batch: Vec<i64>,
    pub rhs_batch: Vec<i64>,
    pub lhs_contracting: Vec<i64>,
    pub rhs_contracting: Vec<i64>,
}

/// `gather` dimension numbers (StableHLO's): which result dims hold the slices
/// (`offset_dims`), which slice dims (of size 1) are dropped, which operand dims are batch dims
/// paired in order with dims of the indices (each index vector reads the operand at its own
/// position along them, as a batched gather: SPMD partitioning keeps them parallel), which
/// operand dim each component of an index vector starts, and which dim of the indices holds the
/// index vectors (its rank: one scalar index per position).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GatherDims {
    pub offset_dims: Vec<i64>,
    pub collapsed_slice_dims: Vec<i64>,
    pub operand_batching_dims: Vec<i64>,
    pub start_indices_batching_dims: Vec<i64>,
    pub start_index_map: Vec<i64>,
    pub index_vector_dim: i64,
}

/// `scatter` dimension numbers (StableHLO's): which dims of the updates are window dims, which
/// operand dims (of window size 1) the windows leave out, which operand dims are batch dims
/// paired in order with dims of the indices (left out of the windows too), which operand dim
/// each component of an index vector starts, and which dim of the indices holds the index
/// vectors (its rank: one scalar index per position).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScatterDims {
    pub update_window_dims: Vec<i64>,
    pub inserted_window_dims: Vec<i64>,
    pub input_batching_dims: Vec<i64>,
    pub scatter_indices_batching_dims: Vec<i64>,
    pub scatter_dims_to_operand_dims: Vec<i64>,
    pub index_vector_dim: i64,
}

/// `convolution` dimension numbers: where batch, feature and spatial dims sit in the input
/// (`lhs`), the kernel (`rhs`) and the output. Spatial dims pair up in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConvDims {
    pub input_batch: i64,
    pub input_feature: i64,
    pub input_spatial: Vec<i64>,
    pub kernel_input_feature: i64,
    pub kernel_output_feature: i64,
    pub kernel_spatial: Vec<i64>,
    pub output_batch: i64,
    pub output_feature: i64,
    pub output_spatial: Vec<i64>,
}

impl ConvDims {
    /// PyTorch's layout with `n` spatial dims: input and output `[N, C, *]`, kernel
    /// `[O, I, *]`.
    pub fn channels_first(n: usize) -> ConvDims {
        let spatial: Vec<i64> = (2..2 + n as i64).collect();
        ConvDims {
            input_batch: 0,
            input_feature: 1,
            input_spatial: spatial.clone(),
            kernel_input_feature: 1,
            kernel_output_feature: 0,
            kernel_spatial: spatial.clone(),
            output_batch: 0,
            output_feature: 1,
            output_spatial: spatial,
        }
    }
}

/// A convolution's window, one entry per spatial dim: strides, `(low, high)` padding (negative
/// crops), the input's dilation (transposed convolutions) and the kernel's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConvWindow {
    pub strides: Vec<i64>,
    pub padding: Vec<(i64, i64)>,
    pub lhs_dilation: Vec<i64>,
    pub rhs_dilation: Vec<i64>,
}

impl DotDims {
    /// Plain matrix product: `[.., M, K] x [K, N]` contracting lhs's last dim with rhs's first.
    pub fn matmul(lhs_rank: usize) -> DotDims {
        DotDims {
            lhs_contracting: vec![lhs_rank as i64 - 1],
            rhs_contracting: vec![0],
            ..DotDims::default()
        }
    }
}

/// An attribute value of a `stablehlo.composite`.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    I64(i64),
    F32(f32),
    Bool(bool),
    Str(String),
}

impl fmt::Display for AttrValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrValue::I64(v) => write!(f, "{v} : i64"),
            AttrValue::F32(v) => {
                f.write_str(&crate::literal::format_float(f64::from(*v), DType::F32))?;
                f.write_str(" : f32")
            }
            AttrValue::Bool(v) => write!(f, "{v}"),
            AttrValue::Str(s) => write!(f, "\"{}\"", escape(s)),
        }
    }
}

/// Escapes a string for an MLIR string attribute.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\22"),
            '\\' => out.push_str("\\5C"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// One operation. Operands are values defined before it; nested regions are owned by the function.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Unary(UnaryOp, ValueId),
    Binary(BinaryOp, ValueId, ValueId),
    Compare {
        direction: Direction,
        lhs: ValueId,
        rhs: ValueId,
    },
    Select {
        pred: ValueId,
        on_true: ValueId,
        on_false: ValueId,
    },
    Clamp {
        min: ValueId,
        operand: ValueId,
        max: ValueId,
    },
    Convert {
        operand: ValueId,
        to: DType,
    },
    BitcastConvert {
        operand: ValueId,
        to: DType,
    },
    Constant(Literal),
    Iota {
        ty: TensorType,
        dim: i64,
    },
    BroadcastInDim {
        operand: ValueId,
        ty: TensorType,
        dims: Vec<i64>,
    },
    Reshape {
        operand: ValueId,
        shape: Shape,
    },
    Transpose {
        operand: ValueId,
        perm: Vec<i64>,
    },
    Slice {
        operand: ValueId,
        start: Vec<i64>,
        limit: Vec<i64>,
        strides: Vec<i64>,
    },
    DynamicSlice {
        operand: ValueId,
        starts: Vec<ValueId>,
        sizes: Vec<i64>,
    },
    DynamicUpdateSlice {
        operand: ValueId,
        update: ValueId,
        starts: Vec<ValueId>,
    },
    /// Slices of `slice_sizes` of `operand` starting at the index vectors in `indices`, each
    /// start clamped into range (StableHLO's semantics).
    Gather {
        operand: ValueId,
        indices: ValueId,
        dims: GatherDims,
        slice_sizes: Vec<i64>,
    },
    /// `operand` with each window of `updates` combined into it at its index vector by `body`
    /// (the current element and the update, scalars, in; the new element out); a window that
    /// falls outside the operand is skipped (StableHLO's semantics).
    Scatter {
        operand: ValueId,
        indices: ValueId,
        updates: ValueId,
        dims: ScatterDims,
        args: Vec<ValueId>,
        body: RegionId,
    },
    Concatenate {
        operands: Vec<ValueId>,
        dim: i64,
    },
    Pad {
        operand: ValueId,
        value: ValueId,
        low: Vec<i64>,
        high: Vec<i64>,
        interior: Vec<i64>,
    },
    /// `args` are the body's block arguments: the N accumulators, then the N new elements.
    Reduce {
        operands: Vec<ValueId>,
        inits: Vec<ValueId>,
        dims: Vec<i64>,
        args: Vec<ValueId>,
        body: RegionId,
    },
    DotGeneral {
        lhs: ValueId,
        rhs: ValueId,
        dims: DotDims,
        precision: Option<[Precision; 2]>,
        out: Option<DType>,
    },
    Convolution {
        lhs: ValueId,
        rhs: ValueId,
        dims: ConvDims,
        window: ConvWindow,
        feature_group_count: u64,
        batch_group_count: u64,
    },
    Reverse {
        operand: ValueId,
        dims: Vec<i64>,
    },
    /// `args` are the comparator's block arguments: for each operand, the two elements
    /// compared (`lhs_0, rhs_0, lhs_1, rhs_1, ...`); it returns an `i1` scalar, "lhs first".
    Sort {
        operands: Vec<ValueId>,
        dim: i64,
        stable: bool,
        args: Vec<ValueId>,
        comparator: RegionId,
    },
    /// `args` are the loop-carried values, shared by the condition and body regions.
    While {
        operands: Vec<ValueId>,
        args: Vec<ValueId>,
        cond: RegionId,
        body: RegionId,
    },
    Case {
        index: ValueId,
        branches: Vec<RegionId>,
    },
    /// `operands` unchanged, as values the compiler cannot see through: it neither merges a
    /// result with another expression of the same value nor moves work across the barrier.
    OptimizationBarrier {
        operands: Vec<ValueId>,
    },
    Call {
        callee: String,
        args: Vec<ValueId>,
    },
    Composite {
        name: String,
        args: Vec<ValueId>,
        attributes: Vec<(String, AttrValue)>,
        decomposition: String,
        version: i32,
    },
}

impl Op {
    /// The printed name of the op.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Unary(u, _) => u.name(),
            Op::Binary(b, ..) => b.name(),
            Op::Compare { .. } => "stablehlo.compare",
            Op::Select { .. } => "stablehlo.select",
            Op::Clamp { .. } => "stablehlo.clamp",
            Op::Convert { .. } => "stablehlo.convert",
            Op::BitcastConvert { .. } => "stablehlo.bitcast_convert",
            Op::Constant(_) => "stablehlo.constant",
            Op::Iota { .. } => "stablehlo.iota",
            Op::BroadcastInDim { .. } => "stablehlo.broadcast_in_dim",
            Op::Reshape { .. } => "stablehlo.reshape",
            Op::Transpose { .. } => "stablehlo.transpose",
            Op::Slice { .. } => "stablehlo.slice",
            Op::DynamicSlice { .. } => "stablehlo.dynamic_slice",
            Op::DynamicUpdateSlice { .. } => "stablehlo.dynamic_update_slice",
            Op::Gather { .. } => "stablehlo.gather",
            Op::Scatter { .. } => "stablehlo.scatter",
            Op::Concatenate { .. } => "stablehlo.concatenate",
            Op::Pad { .. } => "stablehlo.pad",
            Op::Reduce { .. } => "stablehlo.reduce",
            Op::DotGeneral { .. } => "stablehlo.dot_general",
            Op::Convolution { .. } => "stablehlo.convolution",
            Op::Reverse { .. } => "stablehlo.reverse",
            Op::OptimizationBarrier { .. } => "stablehlo.optimization_barrier",
            Op::Sort { .. } => "stablehlo.sort",
            Op::While { .. } => "stablehlo.while",
            Op::Case { .. } => "stablehlo.case",
            Op::Call { .. } => "func.call",
            Op::Composite { .. } => "stablehlo.composite",
        }
    }

    /// Every value the op reads, in order (region block arguments are not operands).
    pub fn operands(&self) -> Vec<ValueId> {
        match self {
            Op::Unary(_, x) | Op::Convert { operand: x, .. } => vec![*x],
            Op::BitcastConvert { operand: x, .. }
            | Op::BroadcastInDim { operand: x, .. }
            | Op::Reshape { operand: x, .. }
            | Op::Transpose { operand: x, .. }
            | Op::Slice { operand: x, .. }
            | Op::Reverse { operand: x, .. } => vec![*x],
            Op::Binary(_, a, b) | Op::Compare { lhs: a, rhs: b, .. } => vec![*a, *b],
            Op::DotGeneral { lhs, rhs, .. } | Op::Convolution { lhs, rhs, .. } => {
                vec![*lhs, *rhs]
            }
            Op::Select { pred, on_true, on_false } => vec![*pred, *on_true, *on_false],
            Op::Clamp { min, operand, max } => vec![*min, *operand, *max],
            Op::Constant(_) | Op::Iota { .. } => vec![],
            Op::DynamicSlice { operand, starts, .. } => {
                std::iter::once(*operand).chain(starts.iter().copied()).collect()
            }
            Op::DynamicUpdateSlice { operand, update, starts } => {
                [*operand, *update].into_iter().chain(starts.iter().copied()).collect()
            }
            Op::Gather { operand, indices, .. } => vec![*operand, *indices],
            Op::Scatter { operand, indices, updates, .. } => vec![*operand, *indices, *updates],
            Op::Concatenate { operands, .. }
            | Op::While { operands, .. }
            | Op::Sort { operands, .. }
            | Op::OptimizationBarrier { operands } => operands.clone(),
            Op::Pad { operand, value, .. } => vec![*operand, *value],
            Op::Reduce { operands, inits, .. } => {
                operands.iter().chain(inits.iter()).copied().collect()
            }
            Op::Case { index, .. } => vec![*index],
            Op::Call { args, .. } | Op::Composite { args, .. } => args.clone(),
        }
    }

    /// Nested regions, in print order.
    pub fn regions(&self) -> Vec<RegionId> {
        match self {
            Op::Reduce { body, .. } | Op::Scatter { body, .. } => vec![*body],
            Op::Sort { comparator, .. } => vec![*comparator],
            Op::While { cond, body, .. } => vec![*cond, *body],
            Op::Case { branches, .. } => branches.clone(),
            _ => vec![],
        }
    }

    /// Block arguments the op's regions declare.
    pub fn region_args(&self) -> &[ValueId] {
        match self {
            Op::Reduce { args, .. }
            | Op::While { args, .. }
            | Op::Sort { args, .. }
            | Op::Scatter { args, .. } => args,
            _ => &[],
        }
    }
}

/// One op with the values it defines: a StableHLO [`Op`] by default; the Mosaic IR uses the
/// same record over its own ops.
#[derive(Clone, Debug, PartialEq)]
pub struct Instr<O = Op> {
    pub op: O,
    pub results: Vec<ValueId>,
}

/// A straight-line block of instructions ending in a return of `results`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Region {
    pub instrs: Vec<Instr>,
    pub results: Vec<ValueId>,
}

/// Public functions are entry points; private ones are reached by `func.call` or a composite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Visibility {
    Public,
    Private,
}

/// The types a function takes and returns.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Signature {
    pub params: Vec<TensorType>,
    pub results: Vec<TensorType>,
}

/// A function in the IR. Values `0..params.len()` are its parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub visibility: Visibility,
    pub params: Vec<TensorType>,
    /// Per-parameter attributes, printed in order (e.g. `tf.aliasing_output = 0 : i32`).
    pub param_attrs: Vec<Vec<(String, String)>>,
    pub results: Vec<TensorType>,
    /// Per-result attributes, printed in order (e.g. `mhlo.sharding = "{replicated}"`).
    pub result_attrs: Vec<Vec<(String, String)>>,
    /// The type of every value, indexed by [`ValueId`].
    pub values: Vec<TensorType>,
    pub regions: Vec<Region>,
}

impl Function {
    pub fn signature(&self) -> Signature {
        Signature { params: self.params.clone(), results: self.results.clone() }
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.values[v.0 as usize]
    }

    pub fn body(&self) -> &Region {
        &self.regions[0]
    }

    pub fn region(&self, r: RegionId) -> &Region {
        &self.regions[r.0 as usize]
    }
}

/// A function carried as verbatim StableHLO text (an imported kernel inlined as a private function).
#[derive(Clone, Debug, PartialEq)]
pub struct TextFunction {
    pub name: String,
    pub signature: Signature,
    /// The whole `func.func private @name(...) ... { ... }` text.
    pub text: String,
}

/// A StableHLO module: IR functions (the first is `@main`) and text functions.
#[derive(Clone, Debug, PartialEq)]
pub struct Module {
    pub name: String,
    pub num_partitions: u32,
    pub num_replicas: u32,
    pub functions: Vec<Function>,
    pub text_functions: Vec<TextFunction>,
}

impl Module {
    /// The entry point (`@main`).
    pub fn main(&self) -> &Function {
        &self.functions[0]
    }

    /// The signature of any function of the module by name.
    pub fn signature_of(&self, name: &str) -> Option<Signature> {
        self.functions.iter().find(|f| f.name == name).map(Function::signature).or_else(|| {
            self.text_functions.iter().find(|f| f.name == name).map(|f| f.signature.clone())
        })
    }

    /// The module's StableHLO text, in the pretty syntax jax emits.
    pub fn to_text(&self) -> String {
        crate::printer::print_module(self)
    }
}

/// Normalises an axis that may count from the end (`-1` is the last) against `rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(op_err!(Axis, "axis {axis} out of range for rank {rank}"));
    }
    Ok(a as usize)
}

fn check_axes(what: &str, axes: &[i64], rank: usize) -> Result<(), OpError> {
    let mut seen = BTreeSet::new();
    for &a in axes {
        if a < 0 || a as usize >= rank {
            return Err(op_err!(Axis, "{what} {a} out of range for rank {rank}"));
        }
        if !seen.insert(a) {
            return Err(op_err!(Axis, "{what} {a} repeated in {axes:?}"));
        }
    }
    Ok(())
}

/// The checks a `gather` or `scatter` (`op`) makes on its indices: integers, index vectors
/// along `index_vector_dim` (the indices' rank: one scalar each), as many components as the
/// named map (`map`) lists. Returns `index_vector_dim`.
fn index_vectors(
    op: &str,
    idx: &TensorType,
    index_vector_dim: i64,
    map: (&str, &[i64]),
) -> Result<usize, OpError> {
    if !idx.dtype.is_integer() {
        return Err(op_err!(DType, "{op} indices {idx} are not integers"));
    }
    let ivd = index_vector_dim;
    if ivd < 0 || ivd as usize > idx.rank() {
        return Err(op_err!(
            DimensionNumbers,
            "{op} index_vector_dim {ivd} out of range for indices {idx}"
        ));
    }
    let ivd = ivd as usize;
    let vector = if ivd < idx.rank() { static_dim(&idx.shape.0[ivd], op, idx)? } else { 1 };
    let (name, listed) = map;
    if listed.len() as i64 != vector {
        return Err(op_err!(
            DimensionNumbers,
            "{op} index vectors of {vector} components, {name} {listed:?}"
        ));
    }
    Ok(ivd)
}

/// The checks a `gather` or `scatter` (`op`) makes on its batching dims: `operand` dims of `x`
/// paired in order with `indices` dims of `idx` (not its index-vector dim `ivd`), of equal
/// sizes, and none of them among the operand dims `taken` lists (`(name, dims)` pairs).
fn batching_dims(
    op: &str,
    (x, operand): (&TensorType, &[i64]),
    (idx, indices): (&TensorType, &[i64]),
    ivd: usize,
    taken: [(&str, &[i64]); 2],
) -> Result<(), OpError> {
    check_axes(&format!("{op} operand batching dim"), operand, x.rank())?;
    check_axes(&format!("{op} indices batching dim"), indices, idx.rank())?;
    if operand.len() != indices.len() {
        return Err(op_err!(
            DimensionNumbers,
            "{op} pairs operand batching dims {operand:?} with indices batching dims {indices:?}"
        ));
    }
    if indices.contains(&(ivd as i64)) {
        return Err(op_err!(
            DimensionNumbers,
            "{op} indices batching dims {indices:?} include index_vector_dim {ivd}"
        ));
    }
    for (&o, &i) in operand.iter().zip(indices) {
        let (a, b) = (&x.shape.0[o as usize], &idx.shape.0[i as usize]);
        if a != b {
            return Err(op_err!(
                Shape,
                "{op} batching dim {o} of {x} and dim {i} of indices {idx} differ"
            ));
        }
        if let Some((name, _)) = taken.iter().find(|(_, dims)| dims.contains(&o)) {
            return Err(op_err!(
                DimensionNumbers,
                "{op} operand batching dim {o} is also among its {name}"
            ));
        }
    }
    Ok(())
}

/// The result type of a `gather`, with the checks StableHLO's verifier makes.
fn infer_gather(
    x: &TensorType,
    idx: &TensorType,
    dims: &GatherDims,
    slice_sizes: &[i64],
) -> Result<TensorType, OpError> {
    let map = ("start_index_map", dims.start_index_map.as_slice());
    let ivd = index_vectors("gather", idx, dims.index_vector_dim, map)?;
    let (rank, idx_rank) = (x.rank(), idx.rank());
    check_axes("gather start_index_map dim", &dims.start_index_map, rank)?;
    check_axes("gather collapsed_slice_dim", &dims.collapsed_slice_dims, rank)?;
    let batching = dims.operand_batching_dims.as_slice();
    batching_dims(
        "gather",
        (x, batching),
        (idx, &dims.start_indices_batching_dims),
        ivd,
        [
            ("collapsed_slice_dims", &dims.collapsed_slice_dims),
            ("start_index_map", &dims.start_index_map),
        ],
    )?;
    if slice_sizes.len() != rank {
        return Err(op_err!(DimensionNumbers, "gather of {x} needs {rank} slice sizes"));
    }
    let mut offsets = Vec::new();
    for (i, &s) in slice_sizes.iter().enumerate() {
        let size = static_dim(&x.shape.0[i], "gather", x)?;
        if s < 0 || s > size {
            return Err(op_err!(DimensionNumbers, "slice size {s} exceeds dim {i} of {x}"));
        }
        if dims.collapsed_slice_dims.contains(&(i as i64)) || batching.contains(&(i as i64)) {
            if s > 1 {
                return Err(op_err!(
                    DimensionNumbers,
                    "gather collapses dim {i} of slice size {s} (at most 1)"
                ));
            }
        } else {
            offsets.push(s as u64);
        }
    }
    let out_rank = offsets.len() + idx_rank - usize::from(ivd < idx_rank);
    check_axes("gather offset_dim", &dims.offset_dims, out_rank)?;
    if dims.offset_dims.len() != offsets.len() || !dims.offset_dims.is_sorted() {
        return Err(op_err!(
            DimensionNumbers,
            "gather offset_dims {:?} must list {} result dims in order",
            dims.offset_dims,
            offsets.len()
        ));
    }
    let mut batch = (0..idx_rank).filter(|&d| d != ivd).map(|d| idx.shape.0[d].clone());
    let mut offsets = offsets.into_iter();
    let shape = (0..out_rank)
        .map(|d| {
            if dims.offset_dims.contains(&(d as i64)) {
                offsets.next().map(Dim::Static)
            } else {
                batch.next()
            }
        })
        .collect::<Option<Vec<Dim>>>()
        .ok_or_else(|| op_err!(DimensionNumbers, "gather result dims do not add up"))?;
    Ok(x.with_shape(Shape(shape)))
}

/// The checks StableHLO's verifier makes on a `scatter` of one operand.
fn check_scatter(
    x: &TensorType,
    idx: &TensorType,
    upd: &TensorType,
    dims: &ScatterDims,
) -> Result<(), OpError> {
    let map = ("scatter_dims_to_operand_dims", dims.scatter_dims_to_operand_dims.as_slice());
    let ivd = index_vectors("scatter", idx, dims.index_vector_dim, map)?;
    if upd.dtype != x.dtype {
        return Err(op_err!(DType, "scatter updates {upd} do not match operand {x}"));
    }
    let (rank, idx_rank) = (x.rank(), idx.rank());
    check_axes("scatter_dims_to_operand_dim", &dims.scatter_dims_to_operand_dims, rank)?;
    check_axes("scatter inserted_window_dim", &dims.inserted_window_dims, rank)?;
    let batching = dims.input_batching_dims.as_slice();
    batching_dims(
        "scatter",
        (x, batching),
        (idx, &dims.scatter_indices_batching_dims),
        ivd,
        [
            ("inserted_window_dims", &dims.inserted_window_dims),
            ("scatter_dims_to_operand_dims", &dims.scatter_dims_to_operand_dims),
        ],
    )?;
    let windows = &dims.update_window_dims;
    check_axes("scatter update_window_dim", windows, upd.rank())?;
    if !windows.is_sorted()
        || windows.len() + dims.inserted_window_dims.len() + batching.len() != rank
    {
        return Err(op_err!(
            DimensionNumbers,
            "scatter update_window_dims {windows:?}, inserted_window_dims {:?} and \
             input_batching_dims {batching:?} must cover the {rank} dims of {x}, in order",
            dims.inserted_window_dims
        ));
    }
    let batch: Vec<&Dim> = (0..idx_rank).filter(|&d| d != ivd).map(|d| &idx.shape.0[d]).collect();
    if upd.rank() != batch.len() + windows.len() {
        return Err(op_err!(
            Shape,
            "scatter updates {upd} need {} dims for indices {idx}",
            batch.len() + windows.len()
        ));
    }
    let mut batch = batch.into_iter();
    let mut window_of = (0..rank).filter(|d| {
        !dims.inserted_window_dims.contains(&(*d as i64)) && !batching.contains(&(*d as i64))
    });
    for (d, size) in upd.shape.0.iter().enumerate() {
        if windows.contains(&(d as i64)) {
            let Some(o) = window_of.next() else { break };
            let (size, limit) =
                (static_dim(size, "scatter", upd)?, static_dim(&x.shape.0[o], "scatter", x)?);
            if size > limit {
                return Err(op_err!(
                    Shape,
                    "scatter window dim {d} of {upd} exceeds dim {o} of {x}"
                ));
            }
        } else if batch.next() != Some(size) {
            return Err(op_err!(
                Shape,
                "scatter updates {upd} do not match the indices {idx} in dim {d}"
            ));
        }
    }
    Ok(())
}

/// The result type of a `convolution`, with the checks StableHLO's verifier makes.
fn infer_convolution(
    a: &TensorType,
    k: &TensorType,
    dims: &ConvDims,
    window: &ConvWindow,
    feature_groups: u64,
    batch_groups: u64,
) -> Result<TensorType, OpError> {
    if a.dtype != k.dtype {
        return Err(op_err!(DType, "element types differ: {a} vs {k}"));
    }
    accepts(Accepts::IntOrFloat, a)?;
    let n = dims.input_spatial.len();
    if a.rank() != n + 2 || k.rank() != n + 2 {
        return Err(op_err!(
            DimensionNumbers,
            "convolution with {n} spatial dims needs rank {} operands, got {a} and {k}",
            n + 2
        ));
    }
    let mut input_axes = vec![dims.input_batch, dims.input_feature];
    input_axes.extend(&dims.input_spatial);
    let mut kernel_axes = vec![dims.kernel_input_feature, dims.kernel_output_feature];
    kernel_axes.extend(&dims.kernel_spatial);
    let mut output_axes = vec![dims.output_batch, dims.output_feature];
    output_axes.extend(&dims.output_spatial);
    check_axes("input dimension", &input_axes, n + 2)?;
    check_axes("kernel dimension", &kernel_axes, n + 2)?;
    check_axes("output dimension", &output_axes, n + 2)?;
    if dims.kernel_spatial.len() != n || dims.output_spatial.len() != n {
        return Err(op_err!(DimensionNumbers, "spatial dims must pair up: {dims:?}"));
    }
    let per_dim = |v: &[i64], what: &str, least: i64| -> Result<(), OpError> {
        if v.len() != n {
            return Err(op_err!(DimensionNumbers, "{what} needs {n} entries, got {v:?}"));
        }
        if let Some(x) = v.iter().find(|&&x| x < least) {
            return Err(op_err!(DimensionNumbers, "{what} {x} < {least}"));
        }
        Ok(())
    };
    per_dim(&window.strides, "window stride", 1)?;
    per_dim(&window.lhs_dilation, "lhs dilation", 1)?;
    per_dim(&window.rhs_dilation, "rhs dilation", 1)?;
    if window.padding.len() != n {
        return Err(op_err!(DimensionNumbers, "padding needs {n} pairs, got {:?}", window.padding));
    }
    if feature_groups == 0 || batch_groups == 0 || (feature_groups > 1 && batch_groups > 1) {
        return Err(op_err!(
            DimensionNumbers,
            "group counts must be >= 1 and not both > 1: feature {feature_groups}, batch {batch_groups}"
        ));
    }
    let dim = |t: &TensorType, i: i64| static_dim(&t.shape.0[i as usize], "convolution", t);
    let (batch, features) = (dim(a, dims.input_batch)?, dim(a, dims.input_feature)?);
    let (k_in, k_out) = (dim(k, dims.kernel_input_feature)?, dim(k, dims.kernel_output_feature)?);
    let (fg, bg) = (feature_groups as i64, batch_groups as i64);
    if features % fg != 0 || features / fg != k_in {
        return Err(op_err!(
            Shape,
            "input features {features} / feature_group_count {fg} != kernel input features {k_in}"
        ));
    }
    if batch % bg != 0 || k_out % bg != 0 || k_out % fg != 0 {
        return Err(op_err!(
            Shape,
            "batch {batch} and kernel output features {k_out} must divide by the group counts"
        ));
    }
    let mut out = vec![Dim::Static(0); n + 2];
    out[dims.output_batch as usize] = Dim::Static((batch / bg) as u64);
    out[dims.output_feature as usize] = Dim::Static(k_out as u64);
    for i in 0..n {
        let x = dim(a, dims.input_spatial[i])?;
        let w = dim(k, dims.kernel_spatial[i])?;
        let (lo, hi) = window.padding[i];
        let dilated_x = if x == 0 { 0 } else { (x - 1) * window.lhs_dilation[i] + 1 };
        let padded = dilated_x + lo + hi;
        let dilated_w = if w == 0 { 0 } else { (w - 1) * window.rhs_dilation[i] + 1 };
        let size = if padded < dilated_w || padded == 0 {
            0
        } else {
            (padded - dilated_w) / window.strides[i] + 1
        };
        if padded < 0 {
            return Err(op_err!(DimensionNumbers, "padding makes spatial dim {i} of {a} negative"));
        }
        out[dims.output_spatial[i] as usize] = Dim::Static(size as u64);
    }
    Ok(TensorType { dtype: a.dtype, shape: Shape(out) })
}

fn static_dim(d: &Dim, what: &str, ty: &TensorType) -> Result<i64, OpError> {
    match d {
        Dim::Static(n) => Ok(*n as i64),
        Dim::Symbolic(s) => {
            Err(op_err!(Shape, "{what} needs a static dimension, {ty} has symbolic `{s}`"))
        }
    }
}

fn same_type(what: &str, a: &TensorType, b: &TensorType) -> Result<(), OpError> {
    if a.dtype != b.dtype {
        return Err(op_err!(DType, "{what}: element types differ: {a} vs {b}"));
    }
    if a.shape != b.shape {
        return Err(op_err!(Shape, "{what}: shapes differ: {a} vs {b}"));
    }
    Ok(())
}

fn scalar_int(what: &str, t: &TensorType) -> Result<(), OpError> {
    if t.rank() != 0 || !t.dtype.is_integer() {
        return Err(op_err!(DType, "{what} must be an integer scalar, got {t}"));
    }
    Ok(())
}

fn accepts(accepts: Accepts, t: &TensorType) -> Result<(), OpError> {
    if !accepts.allows(t.dtype) {
        return Err(op_err!(DType, "needs {}, got {t}", accepts.describe()));
    }
    Ok(())
}

/// The context type inference needs besides operand types: region contents and callee signatures.
pub trait InferCx {
    fn ty(&self, v: ValueId) -> &TensorType;
    fn region_result_types(&self, r: RegionId) -> Vec<TensorType>;
    fn callee(&self, name: &str) -> Option<Signature>;
}

/// The type rule of every op: checks operands and returns the result types.
pub fn infer(op: &Op, cx: &dyn InferCx) -> Result<Vec<TensorType>, OpError> {
    let ty = |v: &ValueId| cx.ty(*v).clone();
    let one = |t: TensorType| Ok(vec![t]);
    match op {
        Op::Unary(u, x) => {
            let t = ty(x);
            accepts(u.accepts(), &t)?;
            one(t)
        }
        Op::Binary(b, x, y) => {
            let (a, c) = (ty(x), ty(y));
            same_type("operands", &a, &c)?;
            accepts(b.accepts(), &a)?;
            one(a)
        }
        Op::Compare { lhs, rhs, .. } => {
            let (a, c) = (ty(lhs), ty(rhs));
            same_type("operands", &a, &c)?;
            one(a.with_dtype(DType::Bool))
        }
        Op::Select { pred, on_true, on_false } => {
            let (p, a, c) = (ty(pred), ty(on_true), ty(on_false));
            same_type("branches", &a, &c)?;
            if p.dtype != DType::Bool {
                return Err(op_err!(DType, "predicate must be i1, got {p}"));
            }
            if p.rank() != 0 && p.shape != a.shape {
                return Err(op_err!(Shape, "predicate {p} must be a scalar or match {a}"));
            }
            one(a)
        }
        Op::Clamp { min, operand, max } => {
            let (lo, x, hi) = (ty(min), ty(operand), ty(max));
            accepts(Accepts::IntOrFloat, &x)?;
            for bound in [&lo, &hi] {
                if bound.dtype != x.dtype {
                    return Err(op_err!(DType, "bound {bound} and operand {x} differ in type"));
                }
                if bound.rank() != 0 && bound.shape != x.shape {
                    return Err(op_err!(Shape, "bound {bound} must be a scalar or match {x}"));
                }
            }
            one(x)
        }
        Op::Convert { operand, to } => one(ty(operand).with_dtype(*to)),
        Op::BitcastConvert { operand, to } => {
            let x = ty(operand);
            let (from_bits, to_bits) = (x.dtype.bits(), to.bits());
            if x.dtype == DType::Bool || *to == DType::Bool {
                return Err(op_err!(DType, "cannot bitcast {x} to {to}: i1 has no bit layout"));
            }
            let mut dims = x.shape.0.clone();
            if from_bits > to_bits {
                dims.push(Dim::Static(u64::from(from_bits / to_bits)));
            } else if from_bits < to_bits {
                let want = u64::from(to_bits / from_bits);
                if dims.last().and_then(Dim::as_static) != Some(want) {
                    return Err(op_err!(
                        Shape,
                        "bitcast {x} to {to} needs a last dimension of {want}"
                    ));
                }
                dims.pop();
            }
            one(TensorType { dtype: *to, shape: Shape(dims) })
        }
        Op::Constant(lit) => one(lit.ty().clone()),
        Op::Iota { ty: t, dim } => {
            accepts(Accepts::IntOrFloat, t)?;
            check_axes("iota dimension", &[*dim], t.rank())?;
            one(t.clone())
        }
        Op::BroadcastInDim { operand, ty: out, dims } => {
            let x = ty(operand);
            if x.dtype != out.dtype {
                return Err(op_err!(DType, "cannot broadcast {x} to {out}: element types differ"));
            }
            if dims.len() != x.rank() {
                return Err(op_err!(
                    DimensionNumbers,
                    "broadcast dims {dims:?} must name one result dim per operand dim of {x}"
                ));
            }
            check_axes("broadcast dimension", dims, out.rank())?;
            for (i, &d) in dims.iter().enumerate() {
                let (src, dst) = (&x.shape.0[i], &out.shape.0[d as usize]);
                if src != dst && *src != Dim::Static(1) {
                    return Err(op_err!(
                        Shape,
                        "cannot broadcast {x} to {out}: operand dim {i} ({src}) vs result dim {d} ({dst})"
                    ));
                }
            }
            one(out.clone())
        }
        Op::Reshape { operand, shape } => {
            let x = ty(operand);
            let out = x.with_shape(shape.clone());
            let same = x.shape == *shape;
            match (x.shape.num_elements(), shape.num_elements()) {
                (Some(a), Some(b)) if a == b => one(out),
                _ if same => one(out),
                (Some(_), Some(_)) => {
                    Err(op_err!(Shape, "cannot reshape {x} to {out}: element counts differ"))
                }
                _ => Err(op_err!(Shape, "cannot reshape {x} to {out}: symbolic dimensions")),
            }
        }
        Op::Transpose { operand, perm } => {
            let x = ty(operand);
            if perm.len() != x.rank() {
                return Err(op_err!(
                    DimensionNumbers,
                    "permutation {perm:?} for {x} has wrong length"
                ));
            }
            check_axes("permutation entry", perm, x.rank())?;
            one(x.with_shape(perm.iter().map(|&p| x.shape.0[p as usize].clone()).collect()))
        }
        Op::Slice { operand, start, limit, strides } => {
            let x = ty(operand);
            let r = x.rank();
            if start.len() != r || limit.len() != r || strides.len() != r {
                return Err(op_err!(
                    DimensionNumbers,
                    "slice of {x} needs {r} starts, limits and strides, got {}, {}, {}",
                    start.len(),
                    limit.len(),
                    strides.len()
                ));
            }
            let mut dims = Vec::with_capacity(r);
            for i in 0..r {
                let size = static_dim(&x.shape.0[i], "slice", &x)?;
                let (s, l, st) = (start[i], limit[i], strides[i]);
                if s < 0 || l < s || l > size || st < 1 {
                    return Err(op_err!(
                        DimensionNumbers,
                        "slice {s}:{l}:{st} out of bounds for dim {i} of {x}"
                    ));
                }
                dims.push(Dim::Static(((l - s + st - 1) / st) as u64));
            }
            one(x.with_shape(Shape(dims)))
        }
        Op::DynamicSlice { operand, starts, sizes } => {
            let x = ty(operand);
            if starts.len() != x.rank() || sizes.len() != x.rank() {
                return Err(op_err!(
                    DimensionNumbers,
                    "dynamic_slice of {x} needs {} start indices and sizes",
                    x.rank()
                ));
            }
            check_indices(starts, cx)?;
            for (i, &s) in sizes.iter().enumerate() {
                let size = static_dim(&x.shape.0[i], "dynamic_slice", &x)?;
                if s < 0 || s > size {
                    return Err(op_err!(DimensionNumbers, "slice size {s} exceeds dim {i} of {x}"));
                }
            }
            one(x.with_shape(Shape::of(&sizes.iter().map(|&s| s as u64).collect::<Vec<_>>())))
        }
        Op::Gather { operand, indices, dims, slice_sizes } => {
            infer_gather(&ty(operand), &ty(indices), dims, slice_sizes).map(one)?
        }
        Op::Scatter { operand, indices, updates, dims, args, body } => {
            let x = ty(operand);
            check_scatter(&x, &ty(indices), &ty(updates), dims)?;
            let scalar = TensorType::scalar(x.dtype);
            let got: Vec<TensorType> = args.iter().map(&ty).collect();
            if got != [scalar.clone(), scalar.clone()] {
                return Err(op_err!(
                    Region,
                    "scatter's combiner takes {} but {x} needs two {scalar}",
                    list(&got)
                ));
            }
            let returns = cx.region_result_types(*body);
            if returns != [scalar.clone()] {
                return Err(op_err!(
                    Region,
                    "scatter's combiner returns {} but must return {scalar}",
                    list(&returns)
                ));
            }
            one(x)
        }
        Op::DynamicUpdateSlice { operand, update, starts } => {
            let (x, u) = (ty(operand), ty(update));
            if x.dtype != u.dtype || x.rank() != u.rank() {
                return Err(op_err!(DType, "update {u} does not fit operand {x}"));
            }
            if starts.len() != x.rank() {
                return Err(op_err!(DimensionNumbers, "{x} needs {} start indices", x.rank()));
            }
            check_indices(starts, cx)?;
            for i in 0..x.rank() {
                let (a, b) = (&x.shape.0[i], &u.shape.0[i]);
                if let (Some(a), Some(b)) = (a.as_static(), b.as_static()) {
                    if b > a {
                        return Err(op_err!(
                            Shape,
                            "update {u} larger than operand {x} in dim {i}"
                        ));
                    }
                } else if a != b {
                    return Err(op_err!(Shape, "update {u} vs operand {x}: symbolic dim {i}"));
                }
            }
            one(x)
        }
        Op::Concatenate { operands, dim } => {
            let Some(first) = operands.first().map(&ty) else {
                return Err(op_err!(DimensionNumbers, "concatenate needs at least one operand"));
            };
            check_axes("concatenate dimension", &[*dim], first.rank())?;
            let d = *dim as usize;
            let mut total = 0u64;
            for v in operands {
                let t = ty(v);
                if t.dtype != first.dtype || t.rank() != first.rank() {
                    return Err(op_err!(DType, "cannot concatenate {first} with {t}"));
                }
                for i in 0..t.rank() {
                    if i != d && t.shape.0[i] != first.shape.0[i] {
                        return Err(op_err!(Shape, "cannot concatenate {first} with {t}: dim {i}"));
                    }
                }
                total += static_dim(&t.shape.0[d], "concatenate", &t)? as u64;
            }
            let mut dims = first.shape.0.clone();
            dims[d] = Dim::Static(total);
            one(first.with_shape(Shape(dims)))
        }
        Op::Pad { operand, value, low, high, interior } => {
            let (x, v) = (ty(operand), ty(value));
            if v.rank() != 0 || v.dtype != x.dtype {
                return Err(op_err!(DType, "padding value must be a {} scalar, got {v}", x.dtype));
            }
            let r = x.rank();
            if low.len() != r || high.len() != r || interior.len() != r {
                return Err(op_err!(
                    DimensionNumbers,
                    "pad of {x} needs {r} low, high and interior"
                ));
            }
            let mut dims = Vec::with_capacity(r);
            for i in 0..r {
                let n = static_dim(&x.shape.0[i], "pad", &x)?;
                if interior[i] < 0 {
                    return Err(op_err!(DimensionNumbers, "interior padding {} < 0", interior[i]));
                }
                let size = low[i] + high[i] + n + (n - 1).max(0) * interior[i];
                if size < 0 {
                    return Err(op_err!(DimensionNumbers, "padding makes dim {i} of {x} negative"));
                }
                dims.push(Dim::Static(size as u64));
            }
            one(x.with_shape(Shape(dims)))
        }
        Op::Reduce { operands, inits, dims, args, body } => {
            let n = operands.len();
            if n == 0 || inits.len() != n {
                return Err(op_err!(
                    Region,
                    "reduce needs N operands and N inits, got {n} and {}",
                    inits.len()
                ));
            }
            let first = ty(&operands[0]);
            check_axes("reduce dimension", dims, first.rank())?;
            let mut out = Vec::with_capacity(n);
            for (v, init) in operands.iter().zip(inits) {
                let (t, i) = (ty(v), ty(init));
                if t.shape != first.shape {
                    return Err(op_err!(Shape, "reduce operands {first} and {t} differ in shape"));
                }
                if i.rank() != 0 || i.dtype != t.dtype {
                    return Err(op_err!(DType, "init {i} must be a {} scalar", t.dtype));
                }
                let kept =
                    t.shape.0.iter().enumerate().filter(|(k, _)| !dims.contains(&(*k as i64)));
                out.push(t.with_shape(kept.map(|(_, d)| d.clone()).collect()));
            }
            let want: Vec<TensorType> = inits.iter().map(&ty).collect();
            let arg_types: Vec<TensorType> = args.iter().map(&ty).collect();
            let doubled: Vec<TensorType> = want.iter().chain(want.iter()).cloned().collect();
            if arg_types != doubled {
                return Err(op_err!(
                    Region,
                    "reduce body takes {} arguments of the init types",
                    2 * n
                ));
            }
            let got = cx.region_result_types(*body);
            if got != want {
                return Err(op_err!(
                    Region,
                    "reduce body returns {} but must return {}",
                    list(&got),
                    list(&want)
                ));
            }
            Ok(out)
        }
        Op::DotGeneral { lhs, rhs, dims, out, .. } => {
            let (a, b) = (ty(lhs), ty(rhs));
            if a.dtype != b.dtype {
                return Err(op_err!(DType, "element types differ: {a} vs {b}"));
            }
            accepts(Accepts::IntOrFloat, &a)?;
            let DotDims { lhs_batch, rhs_batch, lhs_contracting, rhs_contracting } = dims;
            if lhs_batch.len() != rhs_batch.len() || lhs_contracting.len() != rhs_contracting.len()
            {
                return Err(op_err!(
                    DimensionNumbers,
                    "batch and contracting dims must pair up: {dims:?}"
                ));
            }
            let lhs_used: Vec<i64> = lhs_batch.iter().chain(lhs_contracting).copied().collect();
            let rhs_used: Vec<i64> = rhs_batch.iter().chain(rhs_contracting).copied().collect();
            check_axes("lhs dimension", &lhs_used, a.rank())?;
            check_axes("rhs dimension", &rhs_used, b.rank())?;
            for (l, r) in lhs_used.iter().zip(&rhs_used) {
                let (dl, dr) = (&a.shape.0[*l as usize], &b.shape.0[*r as usize]);
                if dl != dr {
                    return Err(op_err!(
                        Shape,
                        "lhs dim {l} ({dl}) of {a} != rhs dim {r} ({dr}) of {b}"
                    ));
                }
            }
            let mut shape: Vec<Dim> =
                lhs_batch.iter().map(|&d| a.shape.0[d as usize].clone()).collect();
            for (t, used) in [(&a, &lhs_used), (&b, &rhs_used)] {
                for (i, d) in t.shape.0.iter().enumerate() {
                    if !used.contains(&(i as i64)) {
                        shape.push(d.clone());
                    }
                }
            }
            one(TensorType { dtype: out.unwrap_or(a.dtype), shape: Shape(shape) })
        }
        Op::Convolution { lhs, rhs, dims, window, feature_group_count, batch_group_count } => {
            one(infer_convolution(
                &ty(lhs),
                &ty(rhs),
                dims,
                window,
                *feature_group_count,
                *batch_group_count,
            )?)
        }
        Op::Reverse { operand, dims } => {
            let t = ty(operand);
            check_axes("reverse dimension", dims, t.rank())?;
            one(t)
        }
        Op::Sort { operands, dim, args, comparator, .. } => {
            let Some(first) = operands.first().map(&ty) else {
                return Err(op_err!(Region, "sort needs at least one operand"));
            };
            check_axes("sort dimension", &[*dim], first.rank())?;
            let types: Vec<TensorType> = operands.iter().map(&ty).collect();
            if let Some(t) = types.iter().find(|t| t.shape != first.shape) {
                return Err(op_err!(Shape, "sort operands {first} and {t} differ in shape"));
            }
            let want: Vec<TensorType> = types
                .iter()
                .flat_map(|t| {
                    let s = TensorType::scalar(t.dtype);
                    [s.clone(), s]
                })
                .collect();
            let got: Vec<TensorType> = args.iter().map(&ty).collect();
            if got != want {
                return Err(op_err!(
                    Region,
                    "sort comparator takes {} but the operands need {}",
                    list(&got),
                    list(&want)
                ));
            }
            let returns = cx.region_result_types(*comparator);
            if returns != [TensorType::scalar(DType::Bool)] {
                return Err(op_err!(
                    Region,
                    "sort comparator returns {} but must return tensor<i1>",
                    list(&returns)
                ));
            }
            Ok(types)
        }
        Op::While { operands, args, cond, body } => {
            let types: Vec<TensorType> = operands.iter().map(&ty).collect();
            let arg_types: Vec<TensorType> = args.iter().map(&ty).collect();
            if arg_types != types {
                return Err(op_err!(
                    Region,
                    "while arguments {} must match operands {}",
                    list(&arg_types),
                    list(&types)
                ));
            }
            let c = cx.region_result_types(*cond);
            if c != [TensorType::scalar(DType::Bool)] {
                return Err(op_err!(
                    Region,
                    "while condition must return tensor<i1>, returns {}",
                    list(&c)
                ));
            }
            let b = cx.region_result_types(*body);
            if b != types {
                return Err(op_err!(
                    Region,
                    "while body returns {} but carries {}",
                    list(&b),
                    list(&types)
                ));
            }
            Ok(types)
        }
        Op::Case { index, branches } => {
            let i = ty(index);
            if i != TensorType::scalar(DType::I32) {
                return Err(op_err!(DType, "case index must be tensor<i32>, got {i}"));
            }
            let Some(first) = branches.first() else {
                return Err(op_err!(Region, "case needs at least one branch"));
            };
            let want = cx.region_result_types(*first);
            for (k, b) in branches.iter().enumerate() {
                let got = cx.region_result_types(*b);
                if got != want {
                    return Err(op_err!(
                        Region,
                        "case branch {k} returns {} but branch 0 returns {}",
                        list(&got),
                        list(&want)
                    ));
                }
            }
            Ok(want)
        }
        Op::OptimizationBarrier { operands } => {
            if operands.is_empty() {
                return Err(op_err!(Shape, "optimization_barrier needs at least one operand"));
            }
            Ok(operands.iter().map(&ty).collect())
        }
        Op::Call { callee, args } | Op::Composite { decomposition: callee, args, .. } => {
            let Some(sig) = cx.callee(callee) else {
                return Err(op_err!(Symbol, "no function `@{callee}` in the module"));
            };
            let got: Vec<TensorType> = args.iter().map(&ty).collect();
            if got != sig.params {
                return Err(op_err!(
                    DType,
                    "`@{callee}` takes {} but is given {}",
                    list(&sig.params),
                    list(&got)
                ));
            }
            Ok(sig.results)
        }
    }
}

fn check_indices(starts: &[ValueId], cx: &dyn InferCx) -> Result<(), OpError> {
    let Some(first) = starts.first() else { return Ok(()) };
    let t0 = cx.ty(*first).clone();
    for s in starts {
        let t = cx.ty(*s);
        scalar_int("start index", t)?;
        if t.dtype != t0.dtype {
            return Err(op_err!(DType, "start indices must share one type: {t0} vs {t}"));
        }
    }
    Ok(())
}

/// `(tensor<..>, tensor<..>)` for messages.
pub(crate) fn list(types: &[TensorType]) -> String {
    let parts: Vec<String> = types.iter().map(ToString::to_string).collect();
    format!("({})", parts.join(", "))
}
