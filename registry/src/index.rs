//! The index of registered kernels and kernel selection.
//!
//! Selection is a pure function of (op overload, call metadata: dtypes, shapes, contiguity,
//! static values, platform). Candidates for an op are ordered once, when the index is built:
//! priority (higher first), then specificity (a kernel whose guards strictly include another's,
//! on a subset of its dtypes and platforms, goes first), then name. Two kernels of equal priority
//! that can both match a call, neither more specific, are an error when the index is built.
//!
//! The index is immutable; [`Registry`] swaps in a new one on each runtime registration or
//! removal, so readers never lock and a failed registration leaves the registry as it was.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;
use rustc_hash::FxHashMap;
use tpu_kernels::registration::{
    Guard, KernelRegistration, KernelSignature, Platform, StaticValue,
};
use tpu_kernels::{Module, TensorType};

use crate::error::RegistryError;

/// `aten::gelu` means its default overload: `aten::gelu.default`. Names that already carry an
/// overload (`aten::add.Tensor`) are unchanged.
pub fn normalize_op(op: &str) -> String {
    let name = op.rsplit("::").next().unwrap_or(op);
    if name.contains('.') { op.to_owned() } else { format!("{op}.default") }
}

/// Checks an op name: `namespace::name` or `namespace::name.overload`, identifier characters.
pub fn validate_op(op: &str) -> Result<(), String> {
    let Some((ns, rest)) = op.split_once("::") else {
        return Err(format!("op `{op}` must be `namespace::name[.overload]`"));
    };
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
    };
    let (name, overload) = rest.split_once('.').unwrap_or((rest, "default"));
    if !ident(ns) || !ident(name) || !ident(overload) {
        return Err(format!(
            "op `{op}` must be `namespace::name[.overload]` with identifier parts"
        ));
    }
    Ok(())
}

/// Whether the entry function of module `text` takes an input with a symbolic dimension (a
/// module that does not read is left to the compiler to report).
fn has_symbolic_inputs(text: &str) -> bool {
    tpu_kernels::reader::parse_module(text).ok().is_some_and(|m| {
        m.main().is_ok_and(|f| {
            f.args.iter().any(|a| a.ty.shape.dims().iter().any(|d| d.as_static().is_none()))
        })
    })
}

/// Specialises a generic imported kernel (symbolic dimensions, several example signatures, or
/// static arguments) to one concrete call: the module text for `platform` with every shape
/// static. The Python package provides one per `register_jax` kernel (jax re-export, or jaxlib's
/// shape refinement of the symbolic module).
pub trait Specialiser: Send + Sync {
    fn specialise(&self, platform: Platform, sig: &KernelSignature) -> Result<String, String>;
}

/// Where a kernel's module comes from.
#[derive(Clone)]
pub enum KernelSource {
    /// Built per signature by Rust code (`#[tpu_kernel]` or a hand-written record).
    Built,
    /// Pre-lowered StableHLO text per platform (an imported Pallas/JAX kernel). A TPU-only
    /// payload (`tpu_custom_call`) is only ever listed under [`Platform::Tpu`]. A generic
    /// kernel carries its [`Specialiser`]; its `variants` are the example signature's modules.
    Imported {
        variants: Vec<(Platform, Arc<str>)>,
        fingerprint: String,
        specialiser: Option<Arc<dyn Specialiser>>,
    },
    /// A kernel of a kernel library loaded at run time ([`crate::library`]): the library emits
    /// its module text per (signature, platform) and, unless its record's output rule is data,
    /// gives its output types ([`Kernel::output_types`]).
    Library(Arc<crate::library::Library>),
}

impl fmt::Debug for KernelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelSource::Built => f.write_str("Built"),
            KernelSource::Library(library) => {
                f.debug_tuple("Library").field(&library.path()).finish()
            }
            KernelSource::Imported { variants, fingerprint, specialiser } => f
                .debug_struct("Imported")
                .field("platforms", &variants.iter().map(|(p, _)| *p).collect::<Vec<_>>())
                .field("fingerprint", fingerprint)
                .field("generic", &specialiser.is_some())
                .finish(),
        }
    }
}

/// A kernel in the index: its registration record and where its module comes from.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub record: KernelRegistration,
    pub source: KernelSource,
    /// Op overloads it replaces, normalised (`aten::gelu.default`).
    pub ops: Vec<String>,
    /// Registered at runtime (removable) rather than linked in.
    pub runtime: bool,
}

impl Kernel {
    /// A kernel linked in through `inventory`.
    pub fn from_static(record: &'static KernelRegistration) -> Kernel {
        let source = if record.is_imported() {
            let variants: Vec<(Platform, Arc<str>)> = [Platform::Tpu, Platform::Cpu]
                .into_iter()
                .filter_map(|p| record.imported_module(p).map(|m| (p, Arc::from(m.text))))
                .collect();
            let fingerprint = [Platform::Tpu, Platform::Cpu]
                .into_iter()
                .filter_map(|p| record.imported_module(p).map(|m| m.fingerprint))
                .collect::<Vec<_>>()
                .join("+");
            KernelSource::Imported { variants, fingerprint, specialiser: None }
        } else {
            KernelSource::Built
        };
        Kernel {
            record: *record,
            source,
            ops: record.ops.iter().map(|o| normalize_op(o)).collect(),
            runtime: false,
        }
    }

    pub fn name(&self) -> &'static str {
        self.record.name
    }

    /// `Ok` when this kernel applies to `call`, else why not.
    pub fn accepts(&self, call: &CallMeta<'_>) -> Result<(), String> {
        if !self.record.platforms.contains(&call.platform) {
            return Err(format!("platform {} not supported", call.platform.name()));
        }
        if let KernelSource::Imported { variants, .. } = &self.source
            && !variants.iter().any(|(p, _)| *p == call.platform)
        {
            return Err(format!("no {} variant", call.platform.name()));
        }
        if let Some(i) = call.contiguous.iter().position(|c| !c) {
            return Err(format!("input {i} is not contiguous"));
        }
        let all_given =
            self.record.statics.iter().all(|p| call.sig.statics.iter().any(|(n, _)| *n == p.name));
        if all_given {
            self.record.accepts(call.sig)?;
            self.library_accepts(call.sig)
        } else {
            let sig = self.complete_statics(call.sig.clone())?;
            self.record.accepts(&sig)?;
            self.library_accepts(&sig)
        }
    }

    /// A tiled library kernel's plan (whether its tiles fit the call), asked of its library;
    /// `Ok` for every other kernel, whose record holds all it checks.
    fn library_accepts(&self, sig: &KernelSignature) -> Result<(), String> {
        match &self.source {
            KernelSource::Library(library) if library.is_tiled(self.name()) => {
                library.accepts(self.name(), sig).map_err(|e| e.to_string())
            }
            _ => Ok(()),
        }
    }

    /// Whether the kernel is a tiled (Mosaic) kernel: its record says so, or, for a kernel of a
    /// loaded library, its library does (the host's copy of the record is not tiled).
    pub fn is_tiled(&self) -> bool {
        self.record.is_tiled()
            || matches!(&self.source, KernelSource::Library(l) if l.is_tiled(self.name()))
    }

    /// Fills static parameters a call left out from this kernel's defaults, in the kernel's
    /// order; an unknown or missing (no default) static is an error naming it.
    pub fn complete_statics(&self, mut sig: KernelSignature) -> Result<KernelSignature, String> {
        let mut statics = Vec::with_capacity(self.record.statics.len());
        for p in self.record.statics {
            match sig.statics.iter().position(|(n, _)| *n == p.name) {
                Some(i) => statics.push(sig.statics.swap_remove(i)),
                None => {
                    let Some(default) = p.default else {
                        return Err(format!("kernel `{}` needs static `{}`", self.name(), p.name));
                    };
                    let value = StaticValue::parse(p.kind, default).map_err(|e| {
                        format!("kernel `{}`, static `{}`: {e}", self.name(), p.name)
                    })?;
                    statics.push((p.name, value));
                }
            }
        }
        if let Some((extra, _)) = sig.statics.first() {
            return Err(format!("kernel `{}` has no static parameter `{extra}`", self.name()));
        }
        sig.statics = statics;
        Ok(sig)
    }

    /// Builds (or, for imported kernels, returns) the module text for `call`'s platform.
    pub fn module_text(
        &self,
        sig: &KernelSignature,
        platform: Platform,
    ) -> Result<ModuleText, RegistryError> {
        let module = self.own_module_text(sig, platform)?;
        if !crate::fault::corrupts(self.name()) {
            return Ok(module);
        }
        let text = crate::fault::corrupt_text(self.name(), &sig.inputs, &module.text).map_err(
            |message| RegistryError::Specialise { kernel: self.name().to_owned(), message },
        )?;
        Ok(ModuleText { text: Arc::from(text), module: None })
    }

    fn own_module_text(
        &self,
        sig: &KernelSignature,
        platform: Platform,
    ) -> Result<ModuleText, RegistryError> {
        match &self.source {
            KernelSource::Library(library) => {
                let text = library.module_text(self.name(), sig, platform)?;
                Ok(ModuleText { text: Arc::from(text), module: None })
            }
            KernelSource::Built if self.record.is_tiled() && platform == Platform::Tpu => {
                let text = self.record.emit_text(sig, platform).map_err(RegistryError::Build)?;
                Ok(ModuleText { text: Arc::from(text), module: None })
            }
            KernelSource::Built => {
                let module = self.record.emit(sig).map_err(RegistryError::Build)?;
                Ok(ModuleText { text: Arc::from(module.to_text()), module: Some(module) })
            }
            KernelSource::Imported { specialiser: Some(specialiser), .. } => {
                let text = specialiser.specialise(platform, sig).map_err(|message| {
                    RegistryError::Specialise { kernel: self.name().to_owned(), message }
                })?;
                Ok(ModuleText { text: Arc::from(text), module: None })
            }
            KernelSource::Imported { variants, .. } => {
                let text = variants
                    .iter()
                    .find(|(p, _)| *p == platform)
                    .map(|(_, text)| text.clone())
                    .ok_or_else(|| RegistryError::NoVariant {
                        kernel: self.name().to_owned(),
                        platform: platform.name(),
                    })?;
                if !has_symbolic_inputs(&text) {
                    return Ok(ModuleText { text, module: None });
                }
                // A module exported with symbolic shapes and linked in (no Python specialiser):
                // refined here, in Rust, to the call's static input types.
                let refined = tpu_kernels::refine::refine(&text, &sig.inputs).map_err(|e| {
                    RegistryError::Specialise {
                        kernel: self.name().to_owned(),
                        message: e.to_string(),
                    }
                })?;
                Ok(ModuleText { text: Arc::from(refined), module: None })
            }
        }
    }

    /// The output types for `sig` (statics completed), from the record's output rule; a
    /// library kernel whose rule is not data (a function, or "build it") asks its library; an
    /// imported kernel reads them from its CPU module specialised to `sig` (the export's own
    /// result types: the module the call would run).
    pub fn output_types(&self, sig: &KernelSignature) -> Result<Vec<TensorType>, String> {
        match (&self.source, self.record.output) {
            (KernelSource::Library(library), tpu_kernels::registration::OutputRule::Build) => {
                library.output_types(self.name(), sig).map_err(|e| e.to_string())
            }
            (KernelSource::Imported { .. }, _) => {
                let module = self.module_text(sig, Platform::Cpu).map_err(|e| e.to_string())?;
                let parsed = tpu_kernels::reader::parse_module(&module.text)
                    .map_err(|e| format!("kernel `{}`: its module: {e}", self.name()))?;
                let main = parsed.main().map_err(|e| format!("kernel `{}`: {e}", self.name()))?;
                let takes: Vec<&TensorType> = main.args.iter().map(|a| &a.ty).collect();
                if takes.len() != sig.inputs.len()
                    || takes.iter().zip(&sig.inputs).any(|(a, b)| *a != b)
                {
                    let takes: Vec<String> = takes.iter().map(|t| t.to_string()).collect();
                    return Err(format!(
                        "kernel `{}`: its module takes {}, not {}",
                        self.name(),
                        takes.join(", "),
                        sig.label()
                    ));
                }
                main.results
                    .iter()
                    .map(|r| {
                        if r.ty.shape.dims().iter().all(|d| d.as_static().is_some()) {
                            Ok(r.ty.clone())
                        } else {
                            Err(format!(
                                "kernel `{}`: its module at {} returns {}, whose shape is not \
                                 static",
                                self.name(),
                                sig.label(),
                                r.ty
                            ))
                        }
                    })
                    .collect()
            }
            _ => self.record.output_types(sig),
        }
    }

    /// Guards as a set, for specificity.
    fn guard_set(&self) -> Vec<Guard> {
        self.record.guards.to_vec()
    }

    /// Whether `self` is strictly more specific than `other`.
    fn more_specific_than(&self, other: &Kernel) -> bool {
        let (mine, theirs) = (self.guard_set(), other.guard_set());
        theirs.iter().all(|g| mine.contains(g))
            && mine.len() > theirs.len()
            && self.record.dtypes.iter().all(|d| other.record.dtypes.contains(d))
            && self.record.platforms.iter().all(|p| other.record.platforms.contains(p))
    }

    /// Whether some call could satisfy both kernels (conservative: true unless provably
    /// disjoint by dtype, platform, arity, a static value or a rank range).
    fn can_overlap(&self, other: &Kernel) -> bool {
        let (a, b) = (&self.record, &other.record);
        if !a.dtypes.iter().any(|d| b.dtypes.contains(d)) {
            return false;
        }
        if !a.platforms.iter().any(|p| b.platforms.contains(p)) {
            return false;
        }
        if !a.inputs.is_empty() && !b.inputs.is_empty() && a.inputs.len() != b.inputs.len() {
            return false;
        }
        for ga in a.guards {
            for gb in b.guards {
                match (ga, gb) {
                    (
                        Guard::StaticEq { name: n1, value: v1 },
                        Guard::StaticEq { name: n2, value: v2 },
                    ) if n1 == n2 && v1 != v2 => return false,
                    (
                        Guard::Rank { input: i1, min: lo1, max: hi1 },
                        Guard::Rank { input: i2, min: lo2, max: hi2 },
                    ) if i1 == i2 && (hi1 < lo2 || hi2 < lo1) => return false,
                    _ => {}
                }
            }
        }
        true
    }
}

/// The module a kernel gives for one signature.
#[derive(Clone, Debug)]
pub struct ModuleText {
    pub text: Arc<str>,
    /// The IR, for Rust-built kernels (imported ones are text only).
    pub module: Option<Module>,
}

/// What selection looks at.
#[derive(Clone, Copy, Debug)]
pub struct CallMeta<'a> {
    pub sig: &'a KernelSignature,
    /// Per input: whether it is dense row-major (kernels take contiguous inputs only).
    pub contiguous: &'a [bool],
    pub platform: Platform,
}

/// Why no kernel was selected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoKernel {
    /// No kernel is registered for the op; `known` lists the ops that have kernels.
    UnknownOp { op: String, known: Vec<String> },
    /// Kernels exist but none accepts the call: each candidate with the guard it failed.
    NoMatch { op: String, reasons: Vec<(String, String)> },
}

impl fmt::Display for NoKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoKernel::UnknownOp { op, known } => {
                write!(
                    f,
                    "no kernel registered for `{op}` (ops with kernels: {})",
                    known.join(", ")
                )
            }
            NoKernel::NoMatch { op, reasons } => {
                write!(f, "no kernel for `{op}` accepts the call:")?;
                for (k, r) in reasons {
                    write!(f, " `{k}`: {r};")?;
                }
                Ok(())
            }
        }
    }
}

/// An immutable index: kernels by op (in selection order) and by name.
#[derive(Debug, Default)]
pub struct Index {
    by_op: FxHashMap<String, OpEntry>,
    by_name: BTreeMap<&'static str, Arc<Kernel>>,
    /// Tiled kernels go first on every platform, not only on a TPU (see [`Index::select`]).
    force_tiled: bool,
}

/// Whether `TPUK_FORCE_TILED` asks for tiled kernels on every platform (`1`, `true`, `on`).
pub fn force_tiled_from_env() -> bool {
    std::env::var("TPUK_FORCE_TILED").is_ok_and(|v| {
        matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "on" | "yes")
    })
}

/// The candidates of one op, in selection order, with a pre-filter on a static value.
#[derive(Debug)]
struct OpEntry {
    candidates: Vec<Arc<Kernel>>,
    split: Option<StaticSplit>,
}

/// When several candidates of an op are told apart by the value of one static parameter
/// (`approximate` for GELU): for each value, the candidates worth checking, in order.
#[derive(Debug)]
struct StaticSplit {
    name: &'static str,
    /// A value, and the candidates whose guard wants it or that do not look at this static.
    values: Vec<(&'static str, Vec<usize>)>,
    /// The candidates that do not look at this static (for any other value).
    others: Vec<usize>,
}

impl StaticSplit {
    fn build(candidates: &[Arc<Kernel>]) -> Option<StaticSplit> {
        let wanted = |k: &Kernel, name: &str| {
            k.record.guards.iter().find_map(|g| match g {
                Guard::StaticEq { name: n, value } if *n == name => Some(*value),
                _ => None,
            })
        };
        // The static most candidates pin down.
        let mut names: Vec<&'static str> = candidates
            .iter()
            .flat_map(|k| k.record.guards.iter())
            .filter_map(|g| match g {
                Guard::StaticEq { name, .. } => Some(*name),
                _ => None,
            })
            .collect();
        names.sort_unstable();
        let name = names
            .chunk_by(|a, b| a == b)
            .max_by_key(|run| run.len())
            .filter(|run| run.len() >= 2)
            .map(|run| run[0])?;
        let mut values: Vec<&'static str> =
            candidates.iter().filter_map(|k| wanted(k, name)).collect();
        values.sort_unstable();
        values.dedup();
        let others: Vec<usize> =
            (0..candidates.len()).filter(|&i| wanted(&candidates[i], name).is_none()).collect();
        let values = values
            .into_iter()
            .map(|v| {
                let idx = (0..candidates.len())
                    .filter(|&i| wanted(&candidates[i], name).is_none_or(|w| w == v))
                    .collect();
                (v, idx)
            })
            .collect();
        Some(StaticSplit { name, values, others })
    }

    /// The candidates to check for `sig`, or `None` when the call does not give the static.
    fn narrow(&self, sig: &KernelSignature) -> Option<&[usize]> {
        let value = sig.get(self.name)?;
        Some(
            self.values
                .iter()
                .find(|(v, _)| value.matches_text(v))
                .map_or(self.others.as_slice(), |(_, idx)| idx.as_slice()),
        )
    }
}

impl Index {
    /// Builds and checks an index: unique names, valid op names and canonical signatures,
    /// no ambiguity.
    pub fn build(kernels: Vec<Arc<Kernel>>) -> Result<Index, RegistryError> {
        let mut by_name = BTreeMap::new();
        for k in &kernels {
            validate_kernel(k)?;
            if by_name.insert(k.name(), k.clone()).is_some() {
                return Err(RegistryError::DuplicateName { name: k.name().to_owned() });
            }
        }
        for k in by_name.values() {
            if let Some(backward) = k.record.backward
                && !by_name.contains_key(backward)
            {
                return Err(RegistryError::InvalidKernel {
                    name: k.name().to_owned(),
                    message: format!("its backward kernel `{backward}` is not registered"),
                });
            }
        }
        let mut lists: BTreeMap<String, Vec<Arc<Kernel>>> = BTreeMap::new();
        // Iterate by name so candidate lists start in a deterministic order.
        for k in by_name.values() {
            for op in &k.ops {
                lists.entry(op.clone()).or_default().push(k.clone());
            }
        }
        let mut by_op = FxHashMap::default();
        for (op, mut list) in lists {
            order_candidates(&mut list);
            check_ambiguity(&op, &list)?;
            let split = StaticSplit::build(&list);
            by_op.insert(op, OpEntry { candidates: list, split });
        }
        Ok(Index { by_op, by_name, force_tiled: false })
    }

    /// This index with tiled kernels first on every platform (`true`), or on a TPU only.
    pub fn with_force_tiled(mut self, force: bool) -> Index {
        self.force_tiled = force;
        self
    }

    /// Whether tiled kernels go first on every platform.
    pub fn force_tiled(&self) -> bool {
        self.force_tiled
    }

    /// Whether selection for `platform` tries tiled kernels before the others: on a TPU (a
    /// tiled kernel is what runs there), and everywhere when forced.
    pub fn tiled_first(&self, platform: Platform) -> bool {
        platform == Platform::Tpu || self.force_tiled
    }

    /// The index of every kernel linked into the binary.
    pub fn from_inventory() -> Result<Index, RegistryError> {
        let kernels = tpu_kernels::registered()
            .into_iter()
            .map(|r| Arc::new(Kernel::from_static(r)))
            .collect();
        Index::build(kernels)
    }

    /// Selects the kernel for `op` and `call`. `op` must be normalised (see [`normalize_op`]).
    pub fn select(&self, op: &str, call: &CallMeta<'_>) -> Result<&Arc<Kernel>, NoKernel> {
        let Some(entry) = self.by_op.get(op) else {
            return Err(NoKernel::UnknownOp { op: op.to_owned(), known: self.ops() });
        };
        let candidates = &entry.candidates;
        let all: Vec<usize>;
        let order: &[usize] = match entry.split.as_ref().and_then(|s| s.narrow(call.sig)) {
            Some(narrowed) => narrowed,
            None => {
                all = (0..candidates.len()).collect();
                &all
            }
        };
        if self.tiled_first(call.platform) {
            for &i in order.iter().filter(|&&i| candidates[i].is_tiled()) {
                if candidates[i].accepts(call).is_ok() {
                    return Ok(&candidates[i]);
                }
            }
        }
        for &i in order {
            if candidates[i].accepts(call).is_ok() {
                return Ok(&candidates[i]);
            }
        }
        let reasons = candidates
            .iter()
            .map(|k| (k.name().to_owned(), k.accepts(call).err().unwrap_or_default()))
            .collect();
        Err(NoKernel::NoMatch { op: op.to_owned(), reasons })
    }

    /// Candidates for `op`, in selection order (before the tiled-first rule).
    pub fn candidates(&self, op: &str) -> &[Arc<Kernel>] {
        self.by_op.get(op).map(|e| e.candidates.as_slice()).unwrap_or(&[])
    }

    /// Candidates for `op` in the order selection tries them on `platform`: tiled kernels
    /// first where [`Self::tiled_first`] says so, then the rest, each part in priority order.
    pub fn candidates_for(&self, op: &str, platform: Platform) -> Vec<&Arc<Kernel>> {
        let all = self.candidates(op);
        if !self.tiled_first(platform) {
            return all.iter().collect();
        }
        let (tiled, rest): (Vec<&Arc<Kernel>>, Vec<&Arc<Kernel>>) =
            all.iter().partition(|k| k.is_tiled());
        tiled.into_iter().chain(rest).collect()
    }

    /// Every op with at least one kernel, sorted.
    pub fn ops(&self) -> Vec<String> {
        let mut ops: Vec<String> = self.by_op.keys().cloned().collect();
        ops.sort();
        ops
    }

    pub fn kernel(&self, name: &str) -> Option<&Arc<Kernel>> {
        self.by_name.get(name)
    }

    /// Every kernel, sorted by name.
    pub fn kernels(&self) -> impl Iterator<Item = &Arc<Kernel>> {
        self.by_name.values()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

fn validate_kernel(k: &Kernel) -> Result<(), RegistryError> {
    let invalid =
        |message: String| RegistryError::InvalidKernel { name: k.name().to_owned(), message };
    if k.ops.is_empty() {
        return Err(invalid("binds no op".to_owned()));
    }
    for op in k.record.ops.iter().map(|o| o as &str).chain(k.ops.iter().map(String::as_str)) {
        validate_op(op).map_err(invalid)?;
    }
    if k.record.dtypes.is_empty() {
        return Err(invalid("accepts no dtype".to_owned()));
    }
    if k.record.platforms.is_empty() {
        return Err(invalid("runs on no platform".to_owned()));
    }
    for sig in k.record.canonical {
        let parsed = k
            .record
            .parse_signature(sig)
            .map_err(|e| invalid(format!("canonical signature `{sig}`: {e}")))?;
        // A tiled kernel is built at each canonical signature: its tiling, coverage and VMEM
        // checks refuse it here, in Rust, before libtpu ever sees it.
        if let Some(built) = k.record.tiled_kernel(&parsed) {
            let kernel = built.map_err(|e| invalid(format!("canonical signature `{sig}`: {e}")))?;
            for target in [tpu_kernels::mosaic::Target::V5E, tpu_kernels::mosaic::Target::V6E] {
                tpu_kernels::mosaic::check::vmem(&kernel, target)
                    .map_err(|e| invalid(format!("canonical signature `{sig}`: {e}")))?;
            }
        }
    }
    Ok(())
}

fn order_candidates(list: &mut [Arc<Kernel>]) {
    list.sort_by(|a, b| {
        b.record
            .priority
            .cmp(&a.record.priority)
            .then_with(|| b.record.guards.len().cmp(&a.record.guards.len()))
            .then_with(|| a.name().cmp(b.name()))
    });
}

fn check_ambiguity(op: &str, list: &[Arc<Kernel>]) -> Result<(), RegistryError> {
    for (i, a) in list.iter().enumerate() {
        for b in &list[i + 1..] {
            if a.record.priority == b.record.priority
                && a.can_overlap(b)
                && !a.more_specific_than(b)
                && !b.more_specific_than(a)
            {
                let (x, y) = if a.name() < b.name() { (a, b) } else { (b, a) };
                return Err(RegistryError::Ambiguous {
                    op: op.to_owned(),
                    first: x.name().to_owned(),
                    second: y.name().to_owned(),
                    priority: a.record.priority,
                });
            }
        }
    }
    Ok(())
}

/// The process's registry: linked-in kernels plus runtime registrations, swapped atomically.
#[derive(Debug)]
pub struct Registry {
    index: ArcSwap<Index>,
    /// Runtime kernels, by name (the linked-in ones are rebuilt from inventory).
    runtime: Mutex<BTreeMap<&'static str, Arc<Kernel>>>,
}

impl Registry {
    /// A registry of the linked-in kernels (tiled kernels first everywhere when
    /// `TPUK_FORCE_TILED` is set, see [`Registry::set_force_tiled`]).
    pub fn new() -> Result<Registry, RegistryError> {
        let index = Index::from_inventory()?.with_force_tiled(force_tiled_from_env());
        Ok(Registry { index: ArcSwap::from_pointee(index), runtime: Mutex::new(BTreeMap::new()) })
    }

    /// The one registry of this process (Rust and Python registrations share it).
    pub fn global() -> Result<&'static Registry, RegistryError> {
        static GLOBAL: OnceLock<Result<Registry, RegistryError>> = OnceLock::new();
        GLOBAL.get_or_init(Registry::new).as_ref().map_err(Clone::clone)
    }

    /// The current index (cheap: an `Arc` clone; later registrations do not change it).
    pub fn index(&self) -> Arc<Index> {
        self.index.load_full()
    }

    /// Identifies the current index without taking a reference to it: it changes on every
    /// runtime registration or removal. Cheap enough for a per-call check.
    pub fn generation(&self) -> usize {
        Arc::as_ptr(&*self.index.load()) as usize
    }

    /// Selects a kernel for `op` (any spelling: `aten::gelu` or `aten::gelu.default`).
    pub fn select(&self, op: &str, call: &CallMeta<'_>) -> Result<Arc<Kernel>, NoKernel> {
        let index = self.index.load();
        let op = normalize_op(op);
        index.select(&op, call).cloned()
    }

    fn rebuild(
        &self,
        runtime: &BTreeMap<&'static str, Arc<Kernel>>,
    ) -> Result<Index, RegistryError> {
        let current = self.index.load();
        let mut kernels: Vec<Arc<Kernel>> =
            current.kernels().filter(|k| !k.runtime).cloned().collect();
        kernels.extend(runtime.values().cloned());
        Ok(Index::build(kernels)?.with_force_tiled(current.force_tiled()))
    }

    /// Makes selection try tiled kernels first on every platform (`true`: on the CPU their
    /// twin runs, so tests can run a tiled kernel end to end without a TPU), or on a TPU only
    /// (`false`, the default unless `TPUK_FORCE_TILED` is set). A new index, so every memo of
    /// an earlier selection is dropped.
    pub fn set_force_tiled(&self, force: bool) -> Result<(), RegistryError> {
        let runtime = self.runtime.lock().map_err(|_| RegistryError::Poisoned)?;
        let index = self.rebuild(&runtime)?.with_force_tiled(force);
        self.index.store(Arc::new(index));
        Ok(())
    }

    /// Whether tiled kernels go first on every platform.
    pub fn force_tiled(&self) -> bool {
        self.index.load().force_tiled()
    }

    /// Adds a kernel at runtime. On any error (invalid, duplicate name, ambiguity) the registry
    /// is exactly as it was.
    pub fn register(&self, mut kernel: Kernel) -> Result<Arc<Kernel>, RegistryError> {
        kernel.runtime = true;
        kernel.ops = kernel.ops.iter().map(|o| normalize_op(o)).collect();
        let kernel = Arc::new(kernel);
        let mut runtime = self.runtime.lock().map_err(|_| RegistryError::Poisoned)?;
        let mut next = runtime.clone();
        if next.insert(kernel.name(), kernel.clone()).is_some() {
            return Err(RegistryError::DuplicateName { name: kernel.name().to_owned() });
        }
        let index = self.rebuild(&next)?;
        self.index.store(Arc::new(index));
        *runtime = next;
        Ok(kernel)
    }

    /// The runtime kernels with `kernels` added, checked; the registry is unchanged.
    fn with_added(
        &self,
        runtime: &BTreeMap<&'static str, Arc<Kernel>>,
        kernels: Vec<Kernel>,
    ) -> Result<Added, RegistryError> {
        let mut next = runtime.clone();
        let mut added = Vec::with_capacity(kernels.len());
        for mut kernel in kernels {
            kernel.runtime = true;
            kernel.ops = kernel.ops.iter().map(|o| normalize_op(o)).collect();
            let kernel = Arc::new(kernel);
            if next.insert(kernel.name(), kernel.clone()).is_some() {
                return Err(RegistryError::DuplicateName { name: kernel.name().to_owned() });
            }
            added.push(kernel);
        }
        let index = self.rebuild(&next)?;
        Ok(Added { runtime: next, kernels: added, index })
    }

    /// Checks that [`Registry::register_all`] would take `kernels` now (names, records, ops,
    /// backward pairings, ambiguity) without registering them.
    pub fn check_registrations(&self, kernels: &[Kernel]) -> Result<(), RegistryError> {
        let runtime = self.runtime.lock().map_err(|_| RegistryError::Poisoned)?;
        self.with_added(&runtime, kernels.to_vec()).map(drop)
    }

    /// Adds several kernels at runtime in one step: all of them, or (on any error) none, the
    /// registry exactly as it was. Kernels may name each other as backward.
    pub fn register_all(&self, kernels: Vec<Kernel>) -> Result<Vec<Arc<Kernel>>, RegistryError> {
        let mut runtime = self.runtime.lock().map_err(|_| RegistryError::Poisoned)?;
        let added = self.with_added(&runtime, kernels)?;
        self.index.store(Arc::new(added.index));
        *runtime = added.runtime;
        Ok(added.kernels)
    }

    /// Removes a runtime-registered kernel. Linked-in kernels cannot be removed, nor can the
    /// kernels of a loaded library.
    pub fn unregister(&self, name: &str) -> Result<Arc<Kernel>, RegistryError> {
        let mut runtime = self.runtime.lock().map_err(|_| RegistryError::Poisoned)?;
        let mut next = runtime.clone();
        let Some(removed) = next.remove(name) else {
            let linked = self.index.load().kernel(name).is_some();
            return Err(RegistryError::NotRemovable { name: name.to_owned(), linked });
        };
        if let KernelSource::Library(library) = &removed.source {
            return Err(RegistryError::LoadedFromLibrary {
                name: name.to_owned(),
                path: library.path().display().to_string(),
            });
        }
        let index = self.rebuild(&next)?;
        self.index.store(Arc::new(index));
        *runtime = next;
        Ok(removed)
    }
}

/// What adding kernels would make: the runtime kernels, the added ones, the new index.
struct Added {
    runtime: BTreeMap<&'static str, Arc<Kernel>>,
    kernels: Vec<Arc<Kernel>>,
    index: Index,
}

/// Metadata of one input, for callers that have strides rather than a contiguity flag.
pub fn is_contiguous(ty: &TensorType, strides: &[i64]) -> bool {
    let Some(dims) = ty.shape.static_dims() else { return false };
    if dims.len() != strides.len() {
        return false;
    }
    let mut expected = 1i64;
    for (d, s) in dims.iter().zip(strides).rev() {
        if *d != 1 && *s != expected {
            return false;
        }
        expected *= *d as i64;
    }
    true
}

/// The platform name a PJRT plugin reports, as a [`Platform`].
pub fn platform_from_name(name: &str) -> Option<Platform> {
    match name.to_ascii_lowercase().as_str() {
        "cpu" | "host" => Some(Platform::Cpu),
        "tpu" => Some(Platform::Tpu),
        "cuda" | "gpu" => Some(Platform::Cuda),
        _ => None,
    }
}
