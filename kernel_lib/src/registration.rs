//! The registration record every kernel submits, collected with `inventory`.
//!
//! A record is const data: what the kernel replaces, which dtypes and platforms it takes, its
//! static parameters with their cache-key policy, its canonical signatures (which the snapshot
//! tests and `tpuk check` iterate), and the function that builds its module for one concrete
//! signature. The `#[tpu_kernel]` attribute generates exactly this record; the standard kernels in
//! [`crate::kernels`] write it by hand with the same const constructors.
//!
//! The linker drops records from crates a binary never names: a binary or test that uses an
//! external kernel crate says `use that_crate as _;`.

use std::fmt;

use crate::builder::KernelBuilder;
use crate::error::BuildError;
use crate::ir::Module;
use crate::types::{DType, TensorType};

/// Where a kernel variant can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Platform {
    Cpu,
    Tpu,
    Cuda,
}

impl Platform {
    pub const ALL: [Platform; 3] = [Platform::Cpu, Platform::Tpu, Platform::Cuda];

    pub const fn name(self) -> &'static str {
        match self {
            Platform::Cpu => "cpu",
            Platform::Tpu => "tpu",
            Platform::Cuda => "cuda",
        }
    }
}

/// The kind of a static (non-tensor) parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaticKind {
    Int,
    Float,
    Bool,
    Str,
}

/// Whether a static parameter's value is part of the compile-cache key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKey {
    /// The value changes the emitted module: it is part of the key.
    Include,
    /// The value does not change the emitted module; the reason says why.
    Ignore { reason: &'static str },
}

/// A static parameter of a kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StaticParam {
    pub name: &'static str,
    pub kind: StaticKind,
    /// The value used when a call does not give one, in signature spelling (`1e-6`, `tanh`).
    pub default: Option<&'static str>,
    pub cache_key: CacheKey,
}

impl StaticParam {
    pub const fn new(name: &'static str, kind: StaticKind) -> StaticParam {
        StaticParam { name, kind, default: None, cache_key: CacheKey::Include }
    }

    pub const fn default(self, value: &'static str) -> StaticParam {
        StaticParam { default: Some(value), ..self }
    }

    pub const fn ignore_in_cache_key(self, reason: &'static str) -> StaticParam {
        StaticParam { cache_key: CacheKey::Ignore { reason }, ..self }
    }
}

/// A static argument value.
#[derive(Clone, Debug, PartialEq)]
pub enum StaticValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

impl StaticValue {
    /// Parses `text` as a value of `kind`.
    pub fn parse(kind: StaticKind, text: &str) -> Result<StaticValue, String> {
        let t = text.trim();
        match kind {
            StaticKind::Int => {
                t.parse().map(StaticValue::Int).map_err(|_| format!("`{t}` is not an integer"))
            }
            StaticKind::Float => {
                t.parse().map(StaticValue::Float).map_err(|_| format!("`{t}` is not a number"))
            }
            StaticKind::Bool => match t {
                "true" => Ok(StaticValue::Bool(true)),
                "false" => Ok(StaticValue::Bool(false)),
                _ => Err(format!("`{t}` is not `true` or `false`")),
            },
            StaticKind::Str => Ok(StaticValue::Str(t.trim_matches('"').to_owned())),
        }
    }
}

impl fmt::Display for StaticValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StaticValue::Int(v) => write!(f, "{v}"),
            StaticValue::Float(v) => write!(f, "{v:e}"),
            StaticValue::Bool(v) => write!(f, "{v}"),
            StaticValue::Str(s) => f.write_str(s),
        }
    }
}

/// One concrete signature: tensor types, then every static parameter's value.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelSignature {
    pub inputs: Vec<TensorType>,
    pub statics: Vec<(&'static str, StaticValue)>,
}

impl KernelSignature {
    /// The value of static parameter `name`.
    pub fn get(&self, name: &str) -> Option<&StaticValue> {
        self.statics.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    pub fn int(&self, name: &str) -> Option<i64> {
        match self.get(name)? {
            StaticValue::Int(v) => Some(*v),
            _ => None,
        }
    }

    pub fn float(&self, name: &str) -> Option<f64> {
        match self.get(name)? {
            StaticValue::Float(v) => Some(*v),
            StaticValue::Int(v) => Some(*v as f64),
            _ => None,
        }
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        match self.get(name)? {
            StaticValue::Str(v) => Some(v),
            _ => None,
        }
    }

    /// A short, file-name-safe label: `f32_8x128-f32_128-eps=1e-6`.
    pub fn label(&self) -> String {
        let mut parts: Vec<String> = self
            .inputs
            .iter()
            .map(|t| {
                let dims: Vec<String> = t
                    .shape
                    .0
                    .iter()
                    .map(|d| match d {
                        crate::types::Dim::Static(n) => n.to_string(),
                        crate::types::Dim::Symbolic(s) => s.to_string(),
                    })
                    .collect();
                if dims.is_empty() {
                    t.dtype.short_name().to_owned()
                } else {
                    format!("{}_{}", t.dtype.short_name(), dims.join("x"))
                }
            })
            .collect();
        for (name, value) in &self.statics {
            parts.push(format!("{name}={value}"));
        }
        parts.join("-")
    }
}

/// A condition a call must meet for the kernel to apply. Inputs are numbered from 0; dimension
/// indices may count from the end (`-1` is the last).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// Static parameter `name` must have this value (signature spelling).
    StaticEq { name: &'static str, value: &'static str },
    /// Input `input` has a rank in `min..=max`.
    Rank { input: usize, min: usize, max: usize },
    /// Dimension `dim` of input `input` is a multiple of `by`.
    DivisibleBy { input: usize, dim: i64, by: u64 },
    /// Two dimensions must be equal.
    SameDim { a: (usize, i64), b: (usize, i64) },
    /// All inputs share the first input's element type.
    SameDType,
}

impl Guard {
    /// `Ok` when `sig` meets the guard, else the reason it does not.
    pub fn check(&self, sig: &KernelSignature) -> Result<(), String> {
        let input = |i: usize| {
            sig.inputs
                .get(i)
                .ok_or_else(|| format!("input {i} missing ({} given)", sig.inputs.len()))
        };
        let dim = |i: usize, d: i64| -> Result<crate::types::Dim, String> {
            let t = input(i)?;
            let k = crate::ir::normalize_axis(d, t.rank())
                .map_err(|e| format!("input {i} {t}: {}", e.message))?;
            Ok(t.shape.0[k].clone())
        };
        match *self {
            Guard::StaticEq { name, value } => match sig.get(name) {
                Some(v)
                    if v.to_string() == value || matches!(v, StaticValue::Str(s) if s == value) =>
                {
                    Ok(())
                }
                Some(v) => Err(format!("static `{name}` is {v}, kernel needs {value}")),
                None => Err(format!("static `{name}` not given")),
            },
            Guard::Rank { input: i, min, max } => {
                let t = input(i)?;
                if (min..=max).contains(&t.rank()) {
                    Ok(())
                } else {
                    Err(format!("input {i} {t} has rank {}, kernel needs {min}..={max}", t.rank()))
                }
            }
            Guard::DivisibleBy { input: i, dim: d, by } => match dim(i, d)?.as_static() {
                Some(n) if by != 0 && n % by == 0 => Ok(()),
                _ => Err(format!("input {i} dim {d} is not a multiple of {by}")),
            },
            Guard::SameDim { a, b } => {
                let (x, y) = (dim(a.0, a.1)?, dim(b.0, b.1)?);
                if x == y {
                    Ok(())
                } else {
                    Err(format!(
                        "input {} dim {} ({x}) != input {} dim {} ({y})",
                        a.0, a.1, b.0, b.1
                    ))
                }
            }
            Guard::SameDType => {
                let first = input(0)?.dtype;
                match sig.inputs.iter().find(|t| t.dtype != first) {
                    None => Ok(()),
                    Some(t) => Err(format!("inputs mix {first} and {}", t.dtype)),
                }
            }
        }
    }
}

/// The registration record of one kernel.
#[derive(Clone, Copy)]
pub struct KernelRegistration {
    /// Unique kernel name (the Rust function's name for `#[tpu_kernel]` kernels).
    pub name: &'static str,
    /// What it replaces: ATen overloads (`aten::gelu.default`) or new ops (`tpuk::rms_norm`).
    pub ops: &'static [&'static str],
    /// Names of the tensor parameters, in order.
    pub inputs: &'static [&'static str],
    pub statics: &'static [StaticParam],
    pub guards: &'static [Guard],
    /// Element types of the first input the kernel accepts (all tensors share one in the
    /// standard kernels).
    pub dtypes: &'static [DType],
    pub platforms: &'static [Platform],
    /// Higher wins when several kernels match.
    pub priority: i32,
    /// Signatures the snapshot tests and `tpuk check` exercise:
    /// `"f32[8,128], f32[128]; eps=1e-6"` (statics after `;`, defaults fill the rest).
    pub canonical: &'static [&'static str],
    /// Builds the module for one concrete signature.
    pub build: fn(&KernelSignature) -> Result<Module, BuildError>,
    pub doc: &'static str,
}

impl fmt::Debug for KernelRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelRegistration")
            .field("name", &self.name)
            .field("ops", &self.ops)
            .field("dtypes", &self.dtypes)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

inventory::collect!(KernelRegistration);

impl KernelRegistration {
    /// A record with no ops bound, f32 only, every platform, priority 0.
    pub const fn new(
        name: &'static str,
        build: fn(&KernelSignature) -> Result<Module, BuildError>,
    ) -> KernelRegistration {
        KernelRegistration {
            name,
            ops: &[],
            inputs: &[],
            statics: &[],
            guards: &[],
            dtypes: &[DType::F32],
            platforms: &Platform::ALL,
            priority: 0,
            canonical: &[],
            build,
            doc: "",
        }
    }

    pub const fn ops(self, ops: &'static [&'static str]) -> Self {
        KernelRegistration { ops, ..self }
    }

    pub const fn inputs(self, inputs: &'static [&'static str]) -> Self {
        KernelRegistration { inputs, ..self }
    }

    pub const fn statics(self, statics: &'static [StaticParam]) -> Self {
        KernelRegistration { statics, ..self }
    }

    pub const fn guards(self, guards: &'static [Guard]) -> Self {
        KernelRegistration { guards, ..self }
    }

    pub const fn dtypes(self, dtypes: &'static [DType]) -> Self {
        KernelRegistration { dtypes, ..self }
    }

    pub const fn platforms(self, platforms: &'static [Platform]) -> Self {
        KernelRegistration { platforms, ..self }
    }

    pub const fn priority(self, priority: i32) -> Self {
        KernelRegistration { priority, ..self }
    }

    pub const fn canonical(self, canonical: &'static [&'static str]) -> Self {
        KernelRegistration { canonical, ..self }
    }

    pub const fn doc(self, doc: &'static str) -> Self {
        KernelRegistration { doc, ..self }
    }

    /// Parses a signature in the canonical spelling against this kernel's parameters, filling
    /// statics from their defaults; every mismatch is an error naming the kernel.
    pub fn parse_signature(&self, text: &str) -> Result<KernelSignature, String> {
        let (tensors, statics) = text.split_once(';').unwrap_or((text, ""));
        let mut inputs = Vec::new();
        let mut depth = 0usize;
        let mut start = 0usize;
        for (i, c) in tensors.char_indices() {
            match c {
                '[' => depth += 1,
                ']' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    inputs.push(TensorType::parse_short(&tensors[start..i])?);
                    start = i + 1;
                }
                _ => {}
            }
        }
        if !tensors[start..].trim().is_empty() {
            inputs.push(TensorType::parse_short(&tensors[start..])?);
        }
        if !self.inputs.is_empty() && inputs.len() != self.inputs.len() {
            return Err(format!(
                "kernel `{}` takes {} tensors ({}), signature gives {}",
                self.name,
                self.inputs.len(),
                self.inputs.join(", "),
                inputs.len()
            ));
        }
        let mut given: Vec<(&str, &str)> = Vec::new();
        for item in statics.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((k, v)) = item.split_once('=') else {
                return Err(format!("static argument `{item}` is not `name=value`"));
            };
            let k = k.trim();
            if !self.statics.iter().any(|p| p.name == k) {
                let known: Vec<&str> = self.statics.iter().map(|p| p.name).collect();
                return Err(format!(
                    "kernel `{}` has no static parameter `{k}` (it has: {})",
                    self.name,
                    if known.is_empty() { "none".to_owned() } else { known.join(", ") }
                ));
            }
            given.push((k, v.trim()));
        }
        let mut values = Vec::with_capacity(self.statics.len());
        for p in self.statics {
            let text = given.iter().find(|(k, _)| *k == p.name).map(|(_, v)| *v).or(p.default);
            let Some(text) = text else {
                return Err(format!("kernel `{}` needs static argument `{}`", self.name, p.name));
            };
            let value = StaticValue::parse(p.kind, text)
                .map_err(|e| format!("kernel `{}`, static `{}`: {e}", self.name, p.name))?;
            values.push((p.name, value));
        }
        Ok(KernelSignature { inputs, statics: values })
    }

    /// The canonical signatures, parsed.
    pub fn canonical_signatures(&self) -> Result<Vec<KernelSignature>, String> {
        self.canonical.iter().map(|s| self.parse_signature(s)).collect()
    }

    /// `Ok` when the kernel applies to `sig` (dtype, arity and every guard), else the first
    /// reason it does not.
    pub fn accepts(&self, sig: &KernelSignature) -> Result<(), String> {
        let Some(first) = sig.inputs.first() else {
            return Err("no tensor inputs".to_owned());
        };
        if !self.inputs.is_empty() && sig.inputs.len() != self.inputs.len() {
            return Err(format!("takes {} tensors, got {}", self.inputs.len(), sig.inputs.len()));
        }
        if !self.dtypes.contains(&first.dtype) {
            let names: Vec<&str> = self.dtypes.iter().map(|d| d.short_name()).collect();
            return Err(format!(
                "dtype {} not in [{}]",
                first.dtype.short_name(),
                names.join(", ")
            ));
        }
        self.guards.iter().try_for_each(|g| g.check(sig))
    }

    /// Builds the module for `sig`.
    pub fn emit(&self, sig: &KernelSignature) -> Result<Module, BuildError> {
        (self.build)(sig)
    }
}

/// Every registered kernel, sorted by name (inventory's own order is unspecified).
pub fn registered() -> Vec<&'static KernelRegistration> {
    let mut all: Vec<&'static KernelRegistration> =
        inventory::iter::<KernelRegistration>.into_iter().collect();
    all.sort_by(|a, b| a.name.cmp(b.name));
    all
}

/// Runs `body` over a fresh builder for `sig.inputs` and finishes with its results: the shape of
/// every Rust kernel's `build` function.
pub fn build_with<F>(name: &str, sig: &KernelSignature, body: F) -> Result<Module, BuildError>
where
    F: for<'b> FnOnce(
        &'b KernelBuilder,
        &[crate::Tensor<'b>],
    ) -> Result<Vec<crate::Tensor<'b>>, BuildError>,
{
    let b = KernelBuilder::new(name, &sig.inputs);
    let args = b.args();
    let results = body(&b, &args)?;
    b.finish(&results)
}
