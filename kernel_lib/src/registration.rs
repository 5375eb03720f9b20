//! The registration record every kernel submits, collected with `inventory`.
//!
//! A record is const data: what the kernel replaces, which dtypes and platforms it takes, its
//! static parameters with their cache-key policy, its canonical signatures (which the snapshot
//! tests and `tpuk check` iterate), how its parameters bind to the op's schema, the rule that
//! gives its output types without building it, and where its module comes from
//! ([`KernelSource`]: built from Rust for one concrete signature, or imported StableHLO text).
//! The `#[tpu_kernel]` attribute generates exactly this record with the const constructors
//! below; the standard kernels in [`crate::kernels`] use the attribute too.
//!
//! Op names in [`KernelRegistration::ops`] are full overload names, `ns::name.overload`; the
//! attribute normalises a bare `aten::gelu` to `aten::gelu.default`, as PyTorch names it.
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

impl StaticValue {
    /// Whether this value equals `text` read as a value of the same kind (`"1e-6"` and
    /// `"0.000001"` both match the float 1e-6). Does not allocate: guards call it per selection.
    pub fn matches_text(&self, text: &str) -> bool {
        match self {
            StaticValue::Str(s) => s == text,
            StaticValue::Int(i) => text.parse::<i64>() == Ok(*i),
            StaticValue::Float(f) => text.parse::<f64>() == Ok(*f),
            StaticValue::Bool(b) => text == if *b { "true" } else { "false" },
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
    /// Dimension `dim` of input `input` has exactly this size.
    DimEq { input: usize, dim: i64, size: u64 },
    /// Input `input` has exactly this element type.
    DTypeIs { input: usize, dtype: DType },
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
                Some(v) if v.matches_text(value) => Ok(()),
                Some(v) => Err(format!("static `{name}` is {v}, kernel needs {value}")),
                None => Err(format!("static `{name}` not given")),
            },
            Guard::Rank { input: i, min, max } => {
                let t = input(i)?;
                if (min..=max).contains(&t.rank()) {
                    Ok(())
                } else {
                    let needs = match max {
                        usize::MAX => format!("at least {min}"),
                        m if m == min => format!("{min}"),
                        m => format!("{min}..={m}"),
                    };
                    Err(format!("input {i} {t} has rank {}, kernel needs {needs}", t.rank()))
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
            Guard::DimEq { input: i, dim: d, size } => match dim(i, d)?.as_static() {
                Some(n) if n == size => Ok(()),
                _ => Err(format!("input {i} dim {d} is not {size}")),
            },
            Guard::DTypeIs { input: i, dtype } => {
                let t = input(i)?;
                if t.dtype == dtype {
                    Ok(())
                } else {
                    Err(format!("input {i} is {}, kernel needs {}", t.dtype, dtype))
                }
            }
        }
    }
}

/// Where a kernel's module comes from.
#[derive(Clone, Copy)]
pub enum KernelSource {
    /// Traced from Rust: builds the module for one concrete signature.
    Built(fn(&KernelSignature) -> Result<Module, BuildError>),
    /// Pre-lowered StableHLO text embedded at compile time, at most one variant per platform.
    /// The registry inlines these; [`KernelRegistration::emit`] refuses them.
    Imported { tpu: Option<ImportedModule>, cpu: Option<ImportedModule> },
    /// A tiled (Mosaic) kernel built per signature: its TPU variant is the `tpu_custom_call`
    /// module, every other platform runs its CPU twin. `plan` says, without building, whether
    /// the kernel takes a signature (its tile sizes divide the call's dims, its blocks fit):
    /// a signature it refuses is declined, not a failure.
    Tiled {
        kernel: fn(&KernelSignature) -> Result<crate::mosaic::Kernel, BuildError>,
        plan: fn(&KernelSignature) -> Result<(), String>,
    },
}

impl fmt::Debug for KernelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelSource::Built(_) => f.write_str("Built(..)"),
            KernelSource::Tiled { .. } => f.write_str("Tiled(..)"),
            KernelSource::Imported { tpu, cpu } => {
                f.debug_struct("Imported").field("tpu", tpu).field("cpu", cpu).finish()
            }
        }
    }
}

/// One imported StableHLO module, embedded in the binary.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ImportedModule {
    /// The file, relative to the manifest of the crate that imported it, as written.
    pub path: &'static str,
    /// The module text, verbatim (locations included).
    pub text: &'static str,
    /// [`crate::reader::content_fingerprint`] of the text: locations, whitespace and comments
    /// do not change it. Computed at compile time.
    pub fingerprint: &'static str,
}

impl fmt::Debug for ImportedModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportedModule")
            .field("path", &self.path)
            .field("fingerprint", &self.fingerprint)
            .field("len", &self.text.len())
            .finish()
    }
}

/// Which kernel parameter a schema argument feeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingKind {
    /// Tensor input number `index` (into [`KernelRegistration::inputs`]).
    Tensor { index: usize },
    /// Static parameter number `index` (into [`KernelRegistration::statics`]).
    Static { index: usize },
}

/// A kernel parameter bound to an argument of the op's schema, by name and position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The schema argument's name (`self`, `eps`).
    pub name: &'static str,
    /// Its position among the schema's arguments, from 0.
    pub position: usize,
    pub kind: BindingKind,
}

/// The element type of one output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputDType {
    /// The element type of input `n`.
    Of(usize),
    Fixed(DType),
}

/// One dimension of an output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputDim {
    /// Dimension `dim` of input `input` (negative counts from the end).
    Of {
        input: usize,
        dim: i64,
    },
    Static(u64),
}

/// The type of one output, as data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputSpec {
    /// The type of input `n`.
    SameAs(usize),
    /// The type of input `input` with dimension `dim` set to 1 (a keepdim reduction).
    Reduced { input: usize, dim: i64 },
    /// An element type and a list of dimensions.
    Shape { dtype: OutputDType, dims: &'static [OutputDim] },
}

/// How to compute a kernel's output types from a signature without building its module: the
/// rule PyTorch's fake (meta) function follows.
#[derive(Clone, Copy)]
pub enum OutputRule {
    /// Build the module and read `@main`'s result types (always right, costs a trace).
    Build,
    /// One spec per output, evaluated on the signature.
    Specs(&'static [OutputSpec]),
    /// A function of the signature.
    Fn(fn(&KernelSignature) -> Result<Vec<TensorType>, String>),
}

impl fmt::Debug for OutputRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutputRule::Build => f.write_str("Build"),
            OutputRule::Specs(s) => f.debug_tuple("Specs").field(s).finish(),
            OutputRule::Fn(_) => f.write_str("Fn(..)"),
        }
    }
}

impl OutputSpec {
    /// The output type this spec gives for `sig`.
    pub fn eval(&self, sig: &KernelSignature) -> Result<TensorType, String> {
        let input = |i: usize| {
            sig.inputs
                .get(i)
                .ok_or_else(|| format!("input {i} missing ({} given)", sig.inputs.len()))
        };
        let axis = |t: &TensorType, d: i64| {
            crate::ir::normalize_axis(d, t.rank()).map_err(|e| format!("{t}: {}", e.message))
        };
        match *self {
            OutputSpec::SameAs(i) => Ok(input(i)?.clone()),
            OutputSpec::Reduced { input: i, dim } => {
                let t = input(i)?;
                let k = axis(t, dim)?;
                let mut shape = t.shape.clone();
                shape.0[k] = crate::types::Dim::Static(1);
                Ok(t.with_shape(shape))
            }
            OutputSpec::Shape { dtype, dims } => {
                let dtype = match dtype {
                    OutputDType::Of(i) => input(i)?.dtype,
                    OutputDType::Fixed(d) => d,
                };
                let mut shape = Vec::with_capacity(dims.len());
                for d in dims {
                    shape.push(match *d {
                        OutputDim::Static(n) => crate::types::Dim::Static(n),
                        OutputDim::Of { input: i, dim } => {
                            let t = input(i)?;
                            t.shape.0[axis(t, dim)?].clone()
                        }
                    });
                }
                Ok(TensorType { dtype, shape: crate::types::Shape(shape) })
            }
        }
    }
}

/// The registration record of one kernel.
#[derive(Clone, Copy)]
pub struct KernelRegistration {
    /// Unique kernel name (the Rust function's name for `#[tpu_kernel]` kernels).
    pub name: &'static str,
    /// What it replaces, as full overload names: ATen overloads (`aten::gelu.default`) or new
    /// ops (`tpuk::rms_norm.default`).
    pub ops: &'static [&'static str],
    /// Names of the tensor parameters, in order.
    pub inputs: &'static [&'static str],
    pub statics: &'static [StaticParam],
    /// The op schema's positional argument names, in order (may include arguments the kernel
    /// does not take, such as `normalized_shape`).
    pub schema: &'static [&'static str],
    /// Where each kernel parameter sits in [`Self::schema`].
    pub bindings: &'static [Binding],
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
    /// Where the module comes from.
    pub source: KernelSource,
    /// The output types of a signature, without building.
    pub output: OutputRule,
    /// The kernel that computes this one's gradient, by name (checked when the registry is
    /// built).
    pub backward: Option<&'static str>,
    /// Tensor inputs the kernel updates in place, by name: output `k` is the new value of input
    /// `mutates[k]`, and the module marks that input for donation to it
    /// (`tf.aliasing_output = k`). The op it defines takes them as `Tensor(a!)` and does not
    /// return them.
    pub mutates: &'static [&'static str],
    pub doc: &'static str,
    /// The Rust module that defined the kernel (`module_path!()`, which `#[tpu_kernel]`
    /// records): which crate a registration belongs to, for kernel libraries. Empty for a
    /// record that does not say.
    pub module: &'static str,
}

impl fmt::Debug for KernelRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelRegistration")
            .field("name", &self.name)
            .field("ops", &self.ops)
            .field("dtypes", &self.dtypes)
            .field("priority", &self.priority)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

inventory::collect!(KernelRegistration);

impl KernelRegistration {
    /// A Rust-built record with no ops bound, f32 only, every platform, priority 0, outputs
    /// derived by building.
    pub const fn new(
        name: &'static str,
        build: fn(&KernelSignature) -> Result<Module, BuildError>,
    ) -> KernelRegistration {
        KernelRegistration::with_source(name, KernelSource::Built(build))
    }

    /// A tiled record: `kernel` builds the Mosaic kernel for one signature, `plan` checks
    /// whether it takes one (see [`KernelSource::Tiled`]).
    pub const fn tiled(
        name: &'static str,
        kernel: fn(&KernelSignature) -> Result<crate::mosaic::Kernel, BuildError>,
        plan: fn(&KernelSignature) -> Result<(), String>,
    ) -> KernelRegistration {
        KernelRegistration::with_source(name, KernelSource::Tiled { kernel, plan })
    }

    /// An imported record: the module text for TPU and/or CPU; platforms are those given.
    pub const fn imported(
        name: &'static str,
        tpu: Option<ImportedModule>,
        cpu: Option<ImportedModule>,
    ) -> KernelRegistration {
        let platforms: &'static [Platform] = match (tpu.is_some(), cpu.is_some()) {
            (true, true) => &[Platform::Cpu, Platform::Tpu],
            (true, false) => &[Platform::Tpu],
            (false, true) => &[Platform::Cpu],
            (false, false) => &[],
        };
        KernelRegistration::with_source(name, KernelSource::Imported { tpu, cpu })
            .platforms(platforms)
    }

    const fn with_source(name: &'static str, source: KernelSource) -> KernelRegistration {
        KernelRegistration {
            name,
            ops: &[],
            inputs: &[],
            statics: &[],
            schema: &[],
            bindings: &[],
            guards: &[],
            dtypes: &[DType::F32],
            platforms: &Platform::ALL,
            priority: 0,
            canonical: &[],
            source,
            output: OutputRule::Build,
            backward: None,
            mutates: &[],
            doc: "",
            module: "",
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

    pub const fn schema(
        self,
        schema: &'static [&'static str],
        bindings: &'static [Binding],
    ) -> Self {
        KernelRegistration { schema, bindings, ..self }
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

    pub const fn output(self, output: OutputRule) -> Self {
        KernelRegistration { output, ..self }
    }

    pub const fn backward(self, kernel: &'static str) -> Self {
        KernelRegistration { backward: Some(kernel), ..self }
    }

    /// The inputs updated in place (see [`Self::mutates`]).
    pub const fn mutates(self, mutates: &'static [&'static str]) -> Self {
        KernelRegistration { mutates, ..self }
    }

    /// Positions of the inputs updated in place, in output order (`[i]` for output 0 first);
    /// an error names a `mutates` entry that is not a tensor input, or one given twice.
    pub fn mutated_inputs(&self) -> Result<Vec<usize>, String> {
        mutated_positions(self.name, self.inputs, self.mutates.iter().copied())
    }

    pub const fn doc(self, doc: &'static str) -> Self {
        KernelRegistration { doc, ..self }
    }

    /// The module that defines the kernel: `.module(module_path!())`.
    pub const fn module(self, module: &'static str) -> Self {
        KernelRegistration { module, ..self }
    }

    /// The crate that defined the kernel: the first segment of [`Self::module`].
    pub fn crate_name(&self) -> &'static str {
        self.module.split("::").next().unwrap_or("")
    }

    /// The static parameter `name`.
    pub fn static_param(&self, name: &str) -> Option<&'static StaticParam> {
        self.statics.iter().find(|p| p.name == name)
    }

    /// The binding of schema argument `name`.
    pub fn binding(&self, name: &str) -> Option<&'static Binding> {
        self.bindings.iter().find(|b| b.name == name)
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
        self.guards.iter().try_for_each(|g| g.check(sig))?;
        match self.source {
            KernelSource::Tiled { plan, .. } => plan(sig),
            _ => Ok(()),
        }
    }

    /// Builds the module for `sig`: the StableHLO every platform but a TPU runs (for a tiled
    /// kernel, its CPU twin). Imported kernels have no builder: this is an error naming the
    /// kernel; use [`Self::imported_module`].
    pub fn emit(&self, sig: &KernelSignature) -> Result<Module, BuildError> {
        let mut module = match self.source {
            KernelSource::Built(build) => build(sig)?,
            KernelSource::Tiled { kernel, .. } => {
                let k = kernel(sig)?;
                let outputs = self.tiled_output_types(sig)?;
                crate::mosaic::cpu_twin_for(&k, &sig.inputs, &outputs)?
            }
            KernelSource::Imported { .. } => Err(BuildError {
                kernel: self.name.to_owned(),
                op: "emit",
                kind: crate::ErrorKind::Symbol,
                message: "an imported kernel is not built: inline its module text \
                          (`imported_module`)"
                    .to_owned(),
            })?,
        };
        if !self.mutates.is_empty() {
            let mutated = self.mutated_inputs().map_err(|message| BuildError {
                kernel: self.name.to_owned(),
                op: "mutates",
                kind: crate::ErrorKind::Symbol,
                message,
            })?;
            mark_donations(self.name, &mut module, &mutated)?;
        }
        Ok(module)
    }

    /// The module text for `sig` on `platform`: for a tiled kernel on a TPU, the StableHLO
    /// module around its `tpu_custom_call` (the shipped Mosaic form); otherwise
    /// [`Self::emit`]'s module, printed.
    pub fn emit_text(
        &self,
        sig: &KernelSignature,
        platform: Platform,
    ) -> Result<String, BuildError> {
        match (self.source, platform) {
            (KernelSource::Tiled { kernel, .. }, Platform::Tpu) => {
                let k = kernel(sig)?;
                let outputs = self.tiled_output_types(sig)?;
                let mut text = crate::mosaic::custom_call_module_for(
                    &k,
                    crate::mosaic::Form::Shipped,
                    &sig.inputs,
                    &outputs,
                );
                // In-place inputs are donated at `@main` as in the CPU twin (the kernel's own
                // `aliases` make the custom call write its operand's buffer).
                let mutated = self.mutated_inputs().map_err(|message| BuildError {
                    kernel: self.name.to_owned(),
                    op: "mutates",
                    kind: crate::ErrorKind::Symbol,
                    message,
                })?;
                for (out, &arg) in mutated.iter().enumerate() {
                    let param = format!("%arg{arg}: {}", sig.inputs[arg]);
                    let marked = format!("{param} {{tf.aliasing_output = {out} : i32}}");
                    text = text.replacen(&param, &marked, 1);
                }
                Ok(text)
            }
            _ => self.emit(sig).map(|m| m.to_text()),
        }
    }

    /// The Mosaic kernel of a tiled record for `sig` (`None` for other records).
    pub fn tiled_kernel(
        &self,
        sig: &KernelSignature,
    ) -> Option<Result<crate::mosaic::Kernel, BuildError>> {
        match self.source {
            KernelSource::Tiled { kernel, .. } => Some(kernel(sig)),
            _ => None,
        }
    }

    /// Whether the record is a tiled (Mosaic) kernel.
    pub fn is_tiled(&self) -> bool {
        matches!(self.source, KernelSource::Tiled { .. })
    }

    fn tiled_output_types(&self, sig: &KernelSignature) -> Result<Vec<TensorType>, BuildError> {
        if let OutputRule::Build = self.output {
            return Err(BuildError {
                kernel: self.name.to_owned(),
                op: "output",
                kind: crate::ErrorKind::Shape,
                message: "a tiled kernel declares its output types (`output = ...`): its \
                          outputs are windows, not results read off a built module"
                    .to_owned(),
            });
        }
        self.output_types(sig).map_err(|message| BuildError {
            kernel: self.name.to_owned(),
            op: "output",
            kind: crate::ErrorKind::Shape,
            message,
        })
    }

    /// Whether the module is imported StableHLO text rather than built from Rust.
    pub fn is_imported(&self) -> bool {
        matches!(self.source, KernelSource::Imported { .. })
    }

    /// The imported module for `platform` (`None` for built kernels, and for platforms the
    /// import has no variant for; CUDA takes the CPU variant's plain StableHLO).
    pub fn imported_module(&self, platform: Platform) -> Option<&ImportedModule> {
        match &self.source {
            KernelSource::Built(_) | KernelSource::Tiled { .. } => None,
            KernelSource::Imported { tpu, cpu } => match platform {
                Platform::Tpu => tpu.as_ref(),
                Platform::Cpu | Platform::Cuda => cpu.as_ref(),
            },
        }
    }

    /// The output types for `sig`, computed by the output rule without building the module
    /// (unless the rule is [`OutputRule::Build`]).
    pub fn output_types(&self, sig: &KernelSignature) -> Result<Vec<TensorType>, String> {
        match self.output {
            OutputRule::Specs(specs) => specs.iter().map(|s| s.eval(sig)).collect(),
            OutputRule::Fn(f) => f(sig),
            OutputRule::Build => {
                self.emit(sig).map(|m| m.main().results.clone()).map_err(|e| e.to_string())
            }
        }
    }
}

/// Positions in `inputs` of the names in `mutates`, in order: the inputs whose new values are
/// outputs `0..`. An error names an entry that is not an input, or one given twice.
pub fn mutated_positions<'n>(
    kernel: &str,
    inputs: &[&str],
    mutates: impl IntoIterator<Item = &'n str>,
) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for name in mutates {
        let Some(i) = inputs.iter().position(|n| *n == name) else {
            return Err(format!(
                "kernel `{kernel}` mutates `{name}`, which is not one of its tensor inputs ({})",
                inputs.join(", ")
            ));
        };
        if out.contains(&i) {
            return Err(format!("kernel `{kernel}` lists `{name}` twice in `mutates`"));
        }
        out.push(i);
    }
    Ok(out)
}

/// Marks each input in `mutated` (positions, in output order) for donation to its output:
/// `tf.aliasing_output = k` on `@main`'s parameter `mutated[k]`. The output must have the
/// input's type; an error names the kernel, the input and both types.
pub fn mark_donations(
    kernel: &str,
    module: &mut Module,
    mutated: &[usize],
) -> Result<(), BuildError> {
    let Some(main) = module.functions.first_mut() else {
        return Err(BuildError {
            kernel: kernel.to_owned(),
            op: "mutates",
            kind: crate::ErrorKind::Symbol,
            message: "the module has no @main".to_owned(),
        });
    };
    for (out, &arg) in mutated.iter().enumerate() {
        let fail = |message: String| BuildError {
            kernel: kernel.to_owned(),
            op: "mutates",
            kind: crate::ErrorKind::Shape,
            message,
        };
        let (Some(param), Some(result)) = (main.params.get(arg), main.results.get(out)) else {
            return Err(fail(format!(
                "input {arg} is updated in place as output {out}, but the module has {} inputs \
                 and {} outputs",
                main.params.len(),
                main.results.len()
            )));
        };
        if param != result {
            return Err(fail(format!(
                "input {arg} ({param}) is updated in place as output {out}, which is {result}: \
                 an in-place update keeps the input's type"
            )));
        }
        let value = format!("{out} : i32");
        let attrs = &mut main.param_attrs[arg];
        match attrs.iter_mut().find(|(k, _)| k == "tf.aliasing_output") {
            Some((_, v)) => *v = value,
            None => attrs.push(("tf.aliasing_output".to_owned(), value)),
        }
    }
    Ok(())
}

/// Every registered kernel, sorted by name (inventory's own order is unspecified).
pub fn registered() -> Vec<&'static KernelRegistration> {
    let mut all: Vec<&'static KernelRegistration> =
        inventory::iter::<KernelRegistration>.into_iter().collect();
    all.sort_by(|a, b| a.name.cmp(b.name));
    all
}

/// Runs `body` over a fresh builder for `sig.inputs` and finishes with its results: the shape of
/// a hand-written Rust kernel's `build` function.
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

/// What the code `#[tpu_kernel]` generates calls. Not a stable API; reached through
/// `tpu_kernels::__private`.
#[doc(hidden)]
pub mod macro_support {
    use super::{KernelRegistration, KernelSignature, StaticKind, StaticValue};
    use crate::{BuildError, ErrorKind, KernelBuilder, Module, Tensor, TensorType};

    /// A Rust type a static parameter can have.
    pub trait StaticArg<'s>: Sized {
        const KIND: StaticKind;
        fn from_value(value: &'s StaticValue) -> Option<Self>;
    }

    impl StaticArg<'_> for i64 {
        const KIND: StaticKind = StaticKind::Int;
        fn from_value(value: &StaticValue) -> Option<i64> {
            match value {
                StaticValue::Int(v) => Some(*v),
                _ => None,
            }
        }
    }

    impl StaticArg<'_> for f64 {
        const KIND: StaticKind = StaticKind::Float;
        fn from_value(value: &StaticValue) -> Option<f64> {
            match value {
                StaticValue::Float(v) => Some(*v),
                StaticValue::Int(v) => Some(*v as f64),
                _ => None,
            }
        }
    }

    impl StaticArg<'_> for bool {
        const KIND: StaticKind = StaticKind::Bool;
        fn from_value(value: &StaticValue) -> Option<bool> {
            match value {
                StaticValue::Bool(v) => Some(*v),
                _ => None,
            }
        }
    }

    impl<'s> StaticArg<'s> for &'s str {
        const KIND: StaticKind = StaticKind::Str;
        fn from_value(value: &'s StaticValue) -> Option<&'s str> {
            match value {
                StaticValue::Str(v) => Some(v),
                _ => None,
            }
        }
    }

    /// Dimension `pos` (negative: from the end) of input `input`, for a tiled kernel's plan.
    pub fn tiled_dim(sig: &KernelSignature, input: usize, pos: i64) -> Result<u64, String> {
        let t = sig.inputs.get(input).ok_or_else(|| format!("input {input} missing"))?;
        let dims =
            t.shape.static_dims().ok_or_else(|| format!("input {input} {t} has symbolic dims"))?;
        let i = if pos < 0 { dims.len() as i64 + pos } else { pos };
        usize::try_from(i)
            .ok()
            .and_then(|i| dims.get(i).copied())
            .ok_or_else(|| format!("input {input} {t} has no dim {pos}"))
    }

    /// The element count of input `input`.
    pub fn tiled_numel(sig: &KernelSignature, input: usize) -> Result<u64, String> {
        let t = sig.inputs.get(input).ok_or_else(|| format!("input {input} missing"))?;
        let dims =
            t.shape.static_dims().ok_or_else(|| format!("input {input} {t} has symbolic dims"))?;
        Ok(dims.iter().product())
    }

    /// A tile's value, refused when 0.
    pub fn tiled_named(name: &str, value: u64) -> Result<u64, String> {
        if value == 0 {
            return Err(format!("tile `{name}` is 0"));
        }
        Ok(value)
    }

    /// `a op b` of sizes; `/` must divide exactly, and nothing may overflow or go negative.
    pub fn tiled_op(op: char, a: u64, b: u64) -> Result<u64, String> {
        let r = match op {
            '+' => a.checked_add(b),
            '-' => a.checked_sub(b),
            '*' => a.checked_mul(b),
            '/' if b != 0 && a.is_multiple_of(b) => Some(a / b),
            '/' if b != 0 => return Err(format!("{b} does not divide {a}")),
            '%' if b != 0 => Some(a % b),
            _ => None,
        };
        r.ok_or_else(|| format!("{a} {op} {b} is not a size"))
    }

    /// `min`, `max`, `cdiv`, `round_up` and `tile(D, max, align)`: the largest multiple of
    /// `align` up to `max` that divides `D`, or `D` itself when `D <= max`.
    pub fn tiled_fn(f: &str, args: &[u64]) -> Result<u64, String> {
        let arg =
            |i: usize| args.get(i).copied().ok_or_else(|| format!("`{f}` lacks argument {i}"));
        match f {
            "min" => Ok(arg(0)?.min(arg(1)?)),
            "max" => Ok(arg(0)?.max(arg(1)?)),
            "cdiv" | "round_up" => {
                let (a, b) = (arg(0)?, arg(1)?);
                if b == 0 {
                    return Err(format!("`{f}({a}, 0)`"));
                }
                let up = a.div_ceil(b);
                if f == "cdiv" {
                    Ok(up)
                } else {
                    up.checked_mul(b).ok_or_else(|| format!("`round_up({a}, {b})` overflows"))
                }
            }
            "broadcast" => {
                let (m, d) = (arg(0)?, arg(1)?);
                if m == 1 || m == d {
                    Ok(m)
                } else {
                    Err(format!("a dim of {m} does not broadcast to {d} (only 1 or {d} does)"))
                }
            }
            "tile" => {
                let (d, max, align) = (arg(0)?, arg(1)?, arg(2)?);
                if d <= max {
                    return Ok(d);
                }
                if align == 0 {
                    return Err("`tile` with alignment 0".to_owned());
                }
                let mut t = max - max % align;
                while t >= align {
                    if d.is_multiple_of(t) {
                        return Ok(t);
                    }
                    t -= align;
                }
                Err(format!("no tile of at most {max} that is a multiple of {align} divides {d}"))
            }
            other => Err(format!("unknown size function `{other}`")),
        }
    }

    /// `array` as the kernel's window sees it: itself, or its `view` (the same element count),
    /// with a 64-bit integer element type narrowed to 32 bits ([`crate::mosaic::window_dtype`]:
    /// Mosaic has no 64-bit integers; the custom call's wrapper and the twin convert).
    pub fn tiled_view(array: &TensorType, view: &Option<Vec<u64>>) -> Result<TensorType, String> {
        let dtype = crate::mosaic::window_dtype(array.dtype);
        let Some(v) = view else { return Ok(TensorType { dtype, shape: array.shape.clone() }) };
        let n: Option<u64> = array.shape.static_dims().map(|d| d.iter().product());
        if n != Some(v.iter().product()) {
            return Err(format!("{array} cannot be viewed as {v:?}: another element count"));
        }
        Ok(TensorType::new(dtype, v.as_slice()))
    }

    /// The plan fits: each view has its array's element count, and blocks (double-buffered)
    /// plus scratch fit the smallest target's scoped VMEM (v5e's default), so the kernel
    /// compiles on every target it is built for.
    #[allow(clippy::too_many_arguments, reason = "one call, generated by the macro")]
    pub fn tiled_check_plan(
        reg: &KernelRegistration,
        sig: &KernelSignature,
        prefetch: usize,
        vmem_limit: Option<u64>,
        blocks: &[Vec<u64>],
        views: &[Option<Vec<u64>>],
        scratch: &[Vec<u64>],
        scratch_elem: &[u64],
    ) -> Result<(), String> {
        let outputs = reg.output_types(sig)?;
        for (p, table) in sig.inputs.iter().take(prefetch).enumerate() {
            if table.dtype != crate::types::DType::I32 || table.rank() != 1 {
                return Err(format!(
                    "its scalar-prefetch table {p} is {table}, not a 1-d i32 array"
                ));
            }
        }
        let arrays: Vec<&TensorType> = sig.inputs.iter().skip(prefetch).chain(&outputs).collect();
        let mut bytes = 0u64;
        let size = |dims: &[u64], elem: u64| {
            dims.iter().try_fold(elem, |acc, d| acc.checked_mul(*d)).unwrap_or(u64::MAX)
        };
        for ((a, b), v) in arrays.iter().zip(blocks).zip(views) {
            let seen = tiled_view(a, v)?;
            bytes = bytes.saturating_add(size(b, 2 * seen.dtype.byte_size() as u64));
        }
        for (s, e) in scratch.iter().zip(scratch_elem) {
            bytes = bytes.saturating_add(size(s, *e));
        }
        let target = crate::mosaic::Target::V5E;
        let (limit, whose) = match vmem_limit {
            Some(l) => (l, "its vmem_limit".to_owned()),
            None => (target.scoped_vmem_bytes, format!("{}'s scoped limit", target.name)),
        };
        if bytes > limit {
            return Err(format!(
                "its blocks (double-buffered) and scratch need {bytes} bytes of VMEM, over \
                 {whose} of {limit} bytes"
            ));
        }
        Ok(())
    }

    /// A plan's refusal as a build error: the kernel does not take the signature.
    pub fn tiled_declined(kernel: &str, message: String) -> BuildError {
        BuildError { kernel: kernel.to_owned(), op: "plan", kind: ErrorKind::Unsupported, message }
    }

    /// The output types of a tiled kernel's signature.
    pub fn tiled_outputs(
        reg: &KernelRegistration,
        sig: &KernelSignature,
    ) -> Result<Vec<TensorType>, BuildError> {
        reg.output_types(sig).map_err(|m| BuildError {
            kernel: reg.name.to_owned(),
            op: "output",
            kind: ErrorKind::Shape,
            message: m,
        })
    }

    fn signature_error(kernel: &str, message: String) -> BuildError {
        BuildError { kernel: kernel.to_owned(), op: "func.func", kind: ErrorKind::Axis, message }
    }

    /// The value of static parameter `name` in `sig`, or its default.
    pub fn static_arg<'s, T: StaticArg<'s>>(
        reg: &KernelRegistration,
        sig: &'s KernelSignature,
        name: &str,
        default: &'s Option<StaticValue>,
    ) -> Result<T, BuildError> {
        let value = sig.get(name).or(default.as_ref()).ok_or_else(|| {
            signature_error(reg.name, format!("static argument `{name}` not given"))
        })?;
        T::from_value(value).ok_or_else(|| {
            signature_error(
                reg.name,
                format!("static argument `{name}` is `{value}`, expected {:?}", T::KIND),
            )
        })
    }

    /// The default of static parameter `name`, parsed.
    pub fn static_default(reg: &KernelRegistration, name: &str) -> Option<StaticValue> {
        let p = reg.static_param(name)?;
        StaticValue::parse(p.kind, p.default?).ok()
    }

    /// Checks the arity, traces `body` over a fresh builder and finishes the module.
    pub fn trace<F>(
        reg: &KernelRegistration,
        sig: &KernelSignature,
        body: F,
    ) -> Result<Module, BuildError>
    where
        F: for<'b> FnOnce(&[Tensor<'b>]) -> Result<Vec<Tensor<'b>>, BuildError>,
    {
        if sig.inputs.len() != reg.inputs.len() {
            return Err(signature_error(
                reg.name,
                format!(
                    "takes {} tensors ({}), signature gives {}",
                    reg.inputs.len(),
                    reg.inputs.join(", "),
                    sig.inputs.len()
                ),
            ));
        }
        let b = KernelBuilder::new(reg.name, &sig.inputs);
        let args = b.args();
        let results = body(&args)?;
        b.finish(&results)
    }
}
