//! Kernel libraries on the host: a user's crate of `#[tpu_kernel]`s built as a `cdylib` (see
//! `tpu_kernels::library` for the C ABI it exports), opened, checked and registered at run
//! time, in the spirit of `torch.ops.load_library`.
//!
//! [`load`] opens the file with `libloading`, reads the library's table, refuses an ABI version
//! or a tpu-kernels version other than this host's (naming both), parses the library's JSON
//! description into runtime [`Kernel`]s whose module text comes from the library's `emit` per
//! (signature, platform) ([`KernelSource::Library`]), and checks every kernel at every
//! canonical signature before anything is registered:
//!
//! - the library's kernel accepts the signature, and so do the guards the host rebuilt;
//! - each platform's module is emitted, parsed back with [`tpu_kernels::reader`], takes the
//!   signature's inputs and returns the output rule's types; no `tpu_custom_call` outside TPU;
//! - the CPU module is compiled and run on the PJRT CPU plugin with random inputs, and its
//!   outputs are finite ([`crate::check::run_kernel`]);
//! - with a topology, the TPU module is compiled with libtpu's compile-only path
//!   ([`crate::check::tpu_compile`]).
//!
//! Then every kernel is registered in one step ([`Registry::register_all`]). On any failure (a
//! file that is not a library, a missing symbol, a version mismatch, a bad record, a failing
//! canonical signature, a name clash) the registry is exactly as it was, and the error names
//! the library's path, the kernel and what was wrong.
//!
//! A library is never unloaded (like torch's): its kernels hold it in an `Arc`, their records'
//! `'static` data is leaked, and the handle is never closed, even when a load fails, since the
//! library's initialisers have run by then. Loading the same path again is a no-op that lists
//! the kernels it registered the first time (a rebuilt file at that path is not reloaded:
//! restart the process). Library kernels cannot be unregistered.
//!
//! `unsafe` here is the C boundary: opening the library, calling its table's functions and
//! reading the strings they return.

use std::collections::BTreeSet;
use std::ffi::{CStr, CString, c_char};
use std::fmt;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::Deserialize;
use tpu_kernels::library::{self as abi, LibraryTable, status};
use tpu_kernels::reader;
use tpu_kernels::registration::{
    Binding, BindingKind, Guard, KernelSignature, OutputDType, OutputDim, OutputRule, OutputSpec,
    Platform, StaticKind, StaticParam, StaticValue,
};
use tpu_kernels::{BuildError, DType, ErrorKind, KernelRegistration, Module, TensorType};

use crate::cache::CompileCache;
use crate::check;
use crate::error::RegistryError;
use crate::index::{Kernel, KernelSource, Registry, normalize_op};
use crate::pjrt::{Client, Topology};

/// An opened kernel library: its table, checked to be this host's ABI and tpu-kernels versions.
pub struct Library {
    path: PathBuf,
    crate_name: String,
    table: LibraryTable,
    /// Its tiled kernels, whose plan only the library can check (set once it is described).
    tiled: OnceLock<BTreeSet<String>>,
    /// Never closed (see the module documentation).
    _handle: ManuallyDrop<libloading::Library>,
}

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Library")
            .field("path", &self.path)
            .field("crate", &self.crate_name)
            .finish_non_exhaustive()
    }
}

/// Why a call into a library failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallError {
    /// The kernel's builder failed with a `BuildError` of this kind (`op: message`).
    Build { kind: ErrorKind, message: String },
    /// `accepts`: the kernel does not take the signature.
    Declined(String),
    /// The request was refused, the library panicked, or its answer made no sense.
    Failed(String),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Build { message, .. }
            | CallError::Declined(message)
            | CallError::Failed(message) => f.write_str(message),
        }
    }
}

/// A string of the library's, or an error saying which.
///
/// # Safety
/// `ptr` must be null or point to a NUL-terminated string that stays valid.
unsafe fn library_str(what: &str, ptr: *const c_char) -> Result<String, String> {
    if ptr.is_null() {
        return Err(format!("its table's {what} is a null pointer"));
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str().map(str::to_owned).map_err(|_| format!("its table's {what} is not UTF-8"))
}

/// A host argument for the library.
fn c_arg(what: &str, text: &str) -> Result<CString, CallError> {
    CString::new(text).map_err(|_| CallError::Failed(format!("the {what} `{text}` contains NUL")))
}

impl Library {
    /// Opens the kernel library at `path` and checks its versions.
    pub fn open(path: impl AsRef<Path>) -> Result<Library, RegistryError> {
        Library::open_entry(path, abi::ENTRY_SYMBOL)
    }

    /// [`Library::open`] through the entry symbol `entry`: for test fixtures that export
    /// several tables from one file.
    #[doc(hidden)]
    pub fn open_entry(path: impl AsRef<Path>, entry: &str) -> Result<Library, RegistryError> {
        let path = path.as_ref();
        let fail =
            |message: String| RegistryError::Library { path: path.display().to_string(), message };
        let canonical = path.canonicalize().map_err(|e| fail(format!("cannot open it: {e}")))?;
        if !canonical.is_file() {
            return Err(fail("it is not a file".to_owned()));
        }
        // SAFETY: loading a shared library runs its initialisers; a kernel library's are the
        // `inventory` registrations of its kernels. Loading arbitrary native code is what this
        // function is for, as `torch.ops.load_library` is: the caller names the file.
        let handle = unsafe { libloading::Library::new(&canonical) }
            .map_err(|e| fail(format!("it is not a loadable shared library: {e}")))?;
        // Never closed, whatever happens next (its initialisers have run).
        let handle = ManuallyDrop::new(handle);
        type Entry = unsafe extern "C" fn() -> *const LibraryTable;
        let symbol = format!("{entry}\0");
        // SAFETY: the symbol, when present, is the entry `export_library!` writes, of type
        // `Entry`; a file exporting the name with another type breaks the ABI's contract.
        let get = unsafe { handle.get::<Entry>(symbol.as_bytes()) }.map_err(|e| {
            fail(format!(
                "it has no `{entry}` symbol: not a kernel library (a cdylib crate whose lib.rs \
                 calls `tpu_kernels::export_library!()`) ({e})"
            ))
        })?;
        // SAFETY: the entry takes nothing and returns a pointer to its static table.
        let raw = unsafe { get() };
        if raw.is_null() {
            return Err(fail(format!("its `{entry}` returned a null table")));
        }
        // SAFETY: every ABI version's table starts with `abi_version: u32`, so this read is
        // valid whatever the library's version; nothing else is read before it matches.
        let abi_version = unsafe { raw.cast::<u32>().read() };
        if abi_version != abi::ABI_VERSION {
            return Err(fail(format!(
                "it speaks kernel-library ABI version {abi_version}, this host (tpu-kernels {}) \
                 speaks version {}: rebuild the library against tpu-kernels {}",
                abi::VERSION,
                abi::ABI_VERSION,
                abi::VERSION
            )));
        }
        // SAFETY: the version matches, so `raw` points to a static version-1 table.
        let table = unsafe { *raw };
        // SAFETY: the table's strings are NUL-terminated static literals (the ABI).
        let version = unsafe { library_str("tpu-kernels version", table.tpu_kernels_version) }
            .map_err(&fail)?;
        if version != abi::VERSION {
            return Err(fail(format!(
                "it was built with tpu-kernels {version}, this host is tpu-kernels {}: rebuild \
                 the library against tpu-kernels {}",
                abi::VERSION,
                abi::VERSION
            )));
        }
        // SAFETY: as above.
        let crate_name = unsafe { library_str("crate name", table.crate_name) }.map_err(&fail)?;
        Ok(Library { path: canonical, crate_name, table, tiled: OnceLock::new(), _handle: handle })
    }

    /// The library's file, canonical.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The name of the crate the library was built from.
    pub fn crate_name(&self) -> &str {
        &self.crate_name
    }

    /// Whether the library's kernel `kernel` is tiled (a Mosaic kernel: the library checks its
    /// plan in [`Library::accepts`], and emits a `tpu_custom_call` module for TPU).
    pub fn is_tiled(&self, kernel: &str) -> bool {
        self.tiled.get().is_some_and(|t| t.contains(kernel))
    }

    /// Calls one entry of the table; returns its status and text (freed by the library).
    fn call(&self, f: impl FnOnce(*mut *mut c_char) -> i32) -> (i32, String) {
        let mut out: *mut c_char = std::ptr::null_mut();
        let code = f(&mut out);
        if out.is_null() {
            return (code, String::new());
        }
        // SAFETY: the library wrote a NUL-terminated string it allocated (the ABI).
        let text = unsafe { CStr::from_ptr(out) }.to_string_lossy().into_owned();
        // SAFETY: handed back once, to the library that allocated it.
        unsafe { (self.table.free_string)(out) };
        (code, text)
    }

    fn answer(code: i32, text: String) -> Result<String, CallError> {
        match code {
            status::OK => Ok(text),
            status::DECLINED => Err(CallError::Declined(text)),
            status::ERROR | status::PANIC => Err(CallError::Failed(text)),
            other => match abi::build_kind(other) {
                Some(kind) => Err(CallError::Build { kind, message: text }),
                None => Err(CallError::Failed(format!("unknown status {other}: {text}"))),
            },
        }
    }

    /// The library's description of its kernels (JSON text).
    pub fn describe(&self) -> Result<String, CallError> {
        // SAFETY: `out` is a valid pointer slot; the function pointer is the table's.
        let (code, text) = self.call(|out| unsafe { (self.table.describe)(out) });
        Library::answer(code, text)
    }

    /// The module text of kernel `kernel` for `sig` on `platform`.
    pub fn emit(
        &self,
        kernel: &str,
        sig: &KernelSignature,
        platform: Platform,
    ) -> Result<String, CallError> {
        let name = c_arg("kernel name", kernel)?;
        let sig = c_arg("signature", &abi::signature_text(sig).map_err(CallError::Failed)?)?;
        let platform = c_arg("platform", platform.name())?;
        let (code, text) = self.call(|out| {
            // SAFETY: NUL-terminated arguments that outlive the call, a valid `out`.
            unsafe { (self.table.emit)(name.as_ptr(), sig.as_ptr(), platform.as_ptr(), out) }
        });
        Library::answer(code, text)
    }

    /// The output types of kernel `kernel` for `sig`, from the library (its output function,
    /// or its builder).
    pub fn output_types(
        &self,
        kernel: &str,
        sig: &KernelSignature,
    ) -> Result<Vec<TensorType>, CallError> {
        let name = c_arg("kernel name", kernel)?;
        let sig = c_arg("signature", &abi::signature_text(sig).map_err(CallError::Failed)?)?;
        let (code, text) = self.call(|out| {
            // SAFETY: NUL-terminated arguments that outlive the call, a valid `out`.
            unsafe { (self.table.output_types)(name.as_ptr(), sig.as_ptr(), out) }
        });
        let text = Library::answer(code, text)?;
        let names: Vec<String> = serde_json::from_str(&text).map_err(|e| {
            CallError::Failed(format!("output types `{text}` are not a JSON list of types: {e}"))
        })?;
        names.iter().map(|t| TensorType::parse_short(t).map_err(CallError::Failed)).collect()
    }

    /// Whether kernel `kernel` takes `sig`, as the library sees it (guards, and a tiled
    /// kernel's plan): `Err(CallError::Declined(reason))` when it does not.
    pub fn accepts(&self, kernel: &str, sig: &KernelSignature) -> Result<(), CallError> {
        let name = c_arg("kernel name", kernel)?;
        let sig = c_arg("signature", &abi::signature_text(sig).map_err(CallError::Failed)?)?;
        let (code, text) = self.call(|out| {
            // SAFETY: NUL-terminated arguments that outlive the call, a valid `out`.
            unsafe { (self.table.accepts)(name.as_ptr(), sig.as_ptr(), out) }
        });
        Library::answer(code, text).map(drop)
    }

    /// [`Library::emit`] as the registry reports it: a build failure keeps its kind (a kernel
    /// body's refusal stays `Unsupported`, a declined call), anything else names the library.
    pub(crate) fn module_text(
        &self,
        kernel: &str,
        sig: &KernelSignature,
        platform: Platform,
    ) -> Result<String, RegistryError> {
        self.emit(kernel, sig, platform).map_err(|e| match e {
            CallError::Build { kind, message } => RegistryError::Build(BuildError {
                kernel: kernel.to_owned(),
                op: "library emit",
                kind,
                message: format!("{message} (kernel library `{}`)", self.path.display()),
            }),
            other => RegistryError::Library {
                path: self.path.display().to_string(),
                message: format!(
                    "kernel `{kernel}`: emit for {} on {}: {other}",
                    sig.label(),
                    platform.name()
                ),
            },
        })
    }
}

// ----- the description -----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Description {
    abi_version: u32,
    tpu_kernels_version: String,
    #[serde(rename = "crate")]
    crate_name: String,
    kernels: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KernelDesc {
    name: String,
    ops: Vec<String>,
    inputs: Vec<String>,
    statics: Vec<StaticDesc>,
    schema: Vec<String>,
    bindings: Vec<BindingDesc>,
    guards: Vec<GuardDesc>,
    dtypes: Vec<String>,
    platforms: Vec<String>,
    priority: i32,
    canonical: Vec<String>,
    source: SourceDesc,
    output: OutputDesc,
    backward: Option<String>,
    #[serde(default)]
    mutates: Vec<String>,
    doc: String,
}

#[derive(Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SourceDesc {
    Built,
    Imported,
    Tiled,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StaticDesc {
    name: String,
    kind: KindDesc,
    default: Option<String>,
    cache_key: CacheKeyDesc,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KindDesc {
    Int,
    Float,
    Bool,
    Str,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum CacheKeyDesc {
    Include,
    Ignore(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BindingDesc {
    name: String,
    position: usize,
    kind: BindingKindDesc,
    index: usize,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum BindingKindDesc {
    Tensor,
    Static,
}

#[derive(Deserialize)]
#[serde(tag = "guard", rename_all = "snake_case", deny_unknown_fields)]
enum GuardDesc {
    StaticEq { name: String, value: String },
    Rank { input: usize, min: usize, max: Option<usize> },
    DivisibleBy { input: usize, dim: i64, by: u64 },
    SameDim { a: (usize, i64), b: (usize, i64) },
    SameDtype,
    DimEq { input: usize, dim: i64, size: u64 },
    DtypeIs { input: usize, dtype: String },
}

#[derive(Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case", deny_unknown_fields)]
enum OutputDesc {
    Specs { specs: Vec<SpecDesc> },
    Fn,
    Build,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum SpecDesc {
    SameAs(usize),
    Reduced { input: usize, dim: i64 },
    Shape { dtype: SpecDTypeDesc, dims: Vec<SpecDimDesc> },
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum SpecDTypeDesc {
    Of(usize),
    Fixed(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum SpecDimDesc {
    Of { input: usize, dim: i64 },
    Static(u64),
}

fn leak_str(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

fn leak_strs(items: &[String]) -> &'static [&'static str] {
    Box::leak(items.iter().map(|s| leak_str(s)).collect::<Vec<_>>().into_boxed_slice())
}

fn leak<T>(items: Vec<T>) -> &'static [T] {
    Box::leak(items.into_boxed_slice())
}

/// The `build` function of every library record: the module comes from the library.
fn library_kernel_has_no_builder(sig: &KernelSignature) -> Result<Module, BuildError> {
    Err(BuildError {
        kernel: "<library>".to_owned(),
        op: "emit",
        kind: ErrorKind::Symbol,
        message: format!(
            "this kernel comes from a kernel library loaded at run time and has no builder in \
             this binary; the registry asks the library for its module text (asked for {})",
            sig.label()
        ),
    })
}

fn dtype_named(name: &str) -> Result<DType, String> {
    DType::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = DType::ALL.iter().map(|d| d.short_name()).collect();
        format!("unknown dtype `{name}` (known: {})", known.join(", "))
    })
}

/// One kernel's record, rebuilt from its description with `'static` (leaked) data; every
/// inconsistency is an error (the caller names the kernel).
fn record_of(d: &KernelDesc) -> Result<KernelRegistration, String> {
    let ident = !d.name.is_empty()
        && d.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && !d.name.starts_with(|c: char| c.is_ascii_digit());
    if !ident {
        return Err("its name must match [A-Za-z_][A-Za-z0-9_.]*".to_owned());
    }
    if d.inputs.is_empty() {
        return Err("it takes no tensor inputs".to_owned());
    }
    let n_inputs = d.inputs.len();
    let input = |i: usize, what: &str| {
        if i < n_inputs {
            Ok(i)
        } else {
            Err(format!("{what} names input {i}, but the kernel takes {n_inputs}"))
        }
    };
    let mut statics = Vec::with_capacity(d.statics.len());
    for s in &d.statics {
        let kind = match s.kind {
            KindDesc::Int => StaticKind::Int,
            KindDesc::Float => StaticKind::Float,
            KindDesc::Bool => StaticKind::Bool,
            KindDesc::Str => StaticKind::Str,
        };
        let mut p = StaticParam::new(leak_str(&s.name), kind);
        if let Some(default) = &s.default {
            StaticValue::parse(kind, default)
                .map_err(|e| format!("static `{}`: default {e}", s.name))?;
            p = p.default(leak_str(default));
        }
        if let CacheKeyDesc::Ignore(reason) = &s.cache_key {
            p = p.ignore_in_cache_key(leak_str(reason));
        }
        statics.push(p);
    }
    let mut bindings = Vec::with_capacity(d.bindings.len());
    for b in &d.bindings {
        let kind = match b.kind {
            BindingKindDesc::Tensor => BindingKind::Tensor { index: input(b.index, "a binding")? },
            BindingKindDesc::Static if b.index < statics.len() => {
                BindingKind::Static { index: b.index }
            }
            BindingKindDesc::Static => {
                return Err(format!(
                    "binding `{}` names static {}, but the kernel has {}",
                    b.name,
                    b.index,
                    statics.len()
                ));
            }
        };
        if !d.schema.is_empty() && b.position >= d.schema.len() {
            return Err(format!(
                "binding `{}` sits at position {} of a schema of {} arguments",
                b.name,
                b.position,
                d.schema.len()
            ));
        }
        bindings.push(Binding { name: leak_str(&b.name), position: b.position, kind });
    }
    let mut guards = Vec::with_capacity(d.guards.len());
    for g in &d.guards {
        guards.push(match g {
            GuardDesc::StaticEq { name, value } => {
                Guard::StaticEq { name: leak_str(name), value: leak_str(value) }
            }
            GuardDesc::Rank { input: i, min, max } => Guard::Rank {
                input: input(*i, "a rank guard")?,
                min: *min,
                max: max.unwrap_or(usize::MAX),
            },
            GuardDesc::DivisibleBy { input: i, dim, by } => {
                Guard::DivisibleBy { input: input(*i, "a divisibility guard")?, dim: *dim, by: *by }
            }
            GuardDesc::SameDim { a, b } => Guard::SameDim {
                a: (input(a.0, "a same-dim guard")?, a.1),
                b: (input(b.0, "a same-dim guard")?, b.1),
            },
            GuardDesc::SameDtype => Guard::SameDType,
            GuardDesc::DimEq { input: i, dim, size } => {
                Guard::DimEq { input: input(*i, "a dim guard")?, dim: *dim, size: *size }
            }
            GuardDesc::DtypeIs { input: i, dtype } => {
                Guard::DTypeIs { input: input(*i, "a dtype guard")?, dtype: dtype_named(dtype)? }
            }
        });
    }
    let dtypes = d.dtypes.iter().map(|n| dtype_named(n)).collect::<Result<Vec<_>, _>>()?;
    let platforms = d
        .platforms
        .iter()
        .map(|n| {
            Platform::ALL
                .into_iter()
                .find(|p| p.name() == n)
                .ok_or_else(|| format!("unknown platform `{n}` (cpu, tpu, cuda)"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let output = match &d.output {
        // A function or "build it": the host asks the library (`Kernel::output_types`).
        OutputDesc::Fn | OutputDesc::Build => OutputRule::Build,
        OutputDesc::Specs { specs } => {
            let mut out = Vec::with_capacity(specs.len());
            for s in specs {
                out.push(match s {
                    SpecDesc::SameAs(i) => OutputSpec::SameAs(input(*i, "an output rule")?),
                    SpecDesc::Reduced { input: i, dim } => {
                        OutputSpec::Reduced { input: input(*i, "an output rule")?, dim: *dim }
                    }
                    SpecDesc::Shape { dtype, dims } => {
                        let dtype = match dtype {
                            SpecDTypeDesc::Of(i) => OutputDType::Of(input(*i, "an output rule")?),
                            SpecDTypeDesc::Fixed(n) => OutputDType::Fixed(dtype_named(n)?),
                        };
                        let mut ds = Vec::with_capacity(dims.len());
                        for dim in dims {
                            ds.push(match dim {
                                SpecDimDesc::Of { input: i, dim } => {
                                    OutputDim::Of { input: input(*i, "an output rule")?, dim: *dim }
                                }
                                SpecDimDesc::Static(n) => OutputDim::Static(*n),
                            });
                        }
                        OutputSpec::Shape { dtype, dims: leak(ds) }
                    }
                });
            }
            OutputRule::Specs(leak(out))
        }
    };
    let mut record = KernelRegistration::new(leak_str(&d.name), library_kernel_has_no_builder)
        .ops(leak_strs(&d.ops))
        .inputs(leak_strs(&d.inputs))
        .statics(leak(statics))
        .schema(leak_strs(&d.schema), leak(bindings))
        .guards(leak(guards))
        .dtypes(leak(dtypes))
        .platforms(leak(platforms))
        .priority(d.priority)
        .canonical(leak_strs(&d.canonical))
        .output(output)
        .mutates(leak_strs(&d.mutates))
        .doc(leak_str(&d.doc));
    if let Some(backward) = &d.backward {
        record = record.backward(leak_str(backward));
    }
    Ok(record)
}

/// The library's kernels, as runtime kernels (not registered).
fn kernels_of(library: &Arc<Library>) -> Result<Vec<Kernel>, RegistryError> {
    let path = library.path.display().to_string();
    let fail = |message: String| RegistryError::Library { path: path.clone(), message };
    let text = library.describe().map_err(|e| fail(format!("describe failed: {e}")))?;
    let description: Description = serde_json::from_str(&text)
        .map_err(|e| fail(format!("its description is not the JSON this host reads: {e}")))?;
    if description.abi_version != abi::ABI_VERSION
        || description.tpu_kernels_version != abi::VERSION
        || description.crate_name != library.crate_name
    {
        return Err(fail(format!(
            "its description (ABI {}, tpu-kernels {}, crate `{}`) disagrees with its table (ABI \
             {}, tpu-kernels {}, crate `{}`)",
            description.abi_version,
            description.tpu_kernels_version,
            description.crate_name,
            abi::ABI_VERSION,
            abi::VERSION,
            library.crate_name
        )));
    }
    if description.kernels.is_empty() {
        return Err(fail(format!(
            "it describes no kernels (does crate `{}` define any `#[tpu_kernel]`?)",
            library.crate_name
        )));
    }
    let mut kernels: Vec<Kernel> = Vec::with_capacity(description.kernels.len());
    let mut tiled = BTreeSet::new();
    for (i, value) in description.kernels.into_iter().enumerate() {
        let name = value
            .get("name")
            .and_then(|n| n.as_str())
            .map_or_else(|| format!("number {i}"), |n| format!("`{n}`"));
        let desc: KernelDesc = serde_json::from_value(value)
            .map_err(|e| fail(format!("kernel {name}: bad record: {e}")))?;
        let record =
            record_of(&desc).map_err(|e| fail(format!("kernel {name}: bad record: {e}")))?;
        if kernels.iter().any(|k| k.name() == record.name) {
            return Err(fail(format!("it describes two kernels named {name}")));
        }
        if desc.source == SourceDesc::Tiled {
            tiled.insert(desc.name.clone());
        }
        kernels.push(Kernel {
            ops: record.ops.iter().map(|o| normalize_op(o)).collect(),
            record,
            source: KernelSource::Library(library.clone()),
            runtime: true,
        });
    }
    if library.tiled.set(tiled).is_err() {
        return Err(fail("it was described twice".to_owned()));
    }
    Ok(kernels)
}

// ----- checks and loading -----

/// What loading checks each kernel with: the PJRT CPU client (and its compile cache) that runs
/// every CPU module, and a libtpu topology to compile TPU modules for, when given.
#[derive(Clone, Copy, Debug)]
pub struct Checks<'a> {
    pub client: &'a Client,
    pub cache: &'a CompileCache,
    pub topology: Option<&'a Topology>,
}

/// The checks one canonical signature passed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignatureCheck {
    pub signature: String,
    /// The platforms whose module was emitted and parsed back.
    pub parsed: Vec<&'static str>,
    /// The output types, as the output rule and every module agree.
    pub outputs: Vec<String>,
    /// What the CPU run did (`None`: the kernel does not run on CPU).
    pub cpu_run: Option<String>,
    /// What the TPU compile did (`None`: not done, or no TPU variant; see `tpu_compile_note`).
    pub tpu_compile: Option<String>,
    /// Why the TPU compile was not done, when it was not.
    pub tpu_compile_note: Option<String>,
}

/// The checks of one kernel, per canonical signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelCheck {
    pub kernel: String,
    pub signatures: Vec<SignatureCheck>,
}

/// A loaded library.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub library: Arc<Library>,
    /// Every kernel of the library, sorted by name.
    pub kernels: Vec<String>,
    /// `true` when the path was loaded before: nothing was checked or registered this time.
    pub already_loaded: bool,
    /// The checks of the kernels registered by this call.
    pub checks: Vec<KernelCheck>,
}

/// Loads the kernel library at `path` into `registry`: opens it, checks every kernel at every
/// canonical signature, and registers them all, or nothing (see the module documentation).
pub fn load(
    registry: &Registry,
    path: impl AsRef<Path>,
    checks: &Checks<'_>,
) -> Result<Loaded, RegistryError> {
    load_entry(registry, path, abi::ENTRY_SYMBOL, checks)
}

/// [`load`] through the entry symbol `entry` (test fixtures).
#[doc(hidden)]
pub fn load_entry(
    registry: &Registry,
    path: impl AsRef<Path>,
    entry: &str,
    checks: &Checks<'_>,
) -> Result<Loaded, RegistryError> {
    let library = Arc::new(Library::open_entry(path, entry)?);
    let shown = library.path.display().to_string();
    let fail = |message: String| RegistryError::Library { path: shown.clone(), message };
    let kernels = kernels_of(&library)?;
    let mut names: Vec<String> = kernels.iter().map(|k| k.name().to_owned()).collect();
    names.sort();
    let index = registry.index();
    let mut fresh = Vec::with_capacity(kernels.len());
    for k in kernels {
        let Some(existing) = index.kernel(k.name()) else {
            fresh.push(k);
            continue;
        };
        let origin = match &existing.source {
            KernelSource::Library(other) if other.path == library.path => continue,
            KernelSource::Library(other) => {
                format!("loaded from kernel library `{}`", other.path.display())
            }
            KernelSource::Imported { .. } => "imported at run time".to_owned(),
            _ if existing.runtime => "registered at run time".to_owned(),
            _ => "linked into this binary".to_owned(),
        };
        return Err(fail(format!(
            "kernel `{}` clashes with the registered kernel of that name ({origin}); nothing was \
             registered",
            k.name()
        )));
    }
    if fresh.is_empty() {
        return Ok(Loaded { library, kernels: names, already_loaded: true, checks: Vec::new() });
    }
    // The records and how they fit the index (ops, canonical spellings, backward pairings,
    // ambiguity) before the costly checks.
    registry
        .check_registrations(&fresh)
        .map_err(|e| fail(format!("{e}; nothing was registered")))?;
    let mut reports = Vec::with_capacity(fresh.len());
    for k in &fresh {
        let library_of = match &k.source {
            KernelSource::Library(l) => l,
            _ => unreachable!("every kernel of a library has its source"),
        };
        let mut signatures = Vec::with_capacity(k.record.canonical.len());
        if k.record.canonical.is_empty() {
            return Err(fail(format!(
                "kernel `{}` has no canonical signature to check it at (give it `canonical = \
                 [...]`); nothing was registered",
                k.name()
            )));
        }
        for text in k.record.canonical {
            let report = check_signature(k, library_of, text, checks).map_err(|e| {
                fail(format!(
                    "kernel `{}`, canonical signature `{text}`: {e}; nothing was registered",
                    k.name()
                ))
            })?;
            signatures.push(report);
        }
        reports.push(KernelCheck { kernel: k.name().to_owned(), signatures });
    }
    registry.register_all(fresh).map_err(|e| fail(format!("{e}; nothing was registered")))?;
    Ok(Loaded { library, kernels: names, already_loaded: false, checks: reports })
}

fn show(types: &[TensorType]) -> String {
    types.iter().map(TensorType::short).collect::<Vec<_>>().join(", ")
}

/// Every check of kernel `k` at canonical signature `text`.
fn check_signature(
    k: &Kernel,
    library: &Library,
    text: &str,
    checks: &Checks<'_>,
) -> Result<SignatureCheck, String> {
    let sig = k.record.parse_signature(text)?;
    library.accepts(k.name(), &sig).map_err(|e| match e {
        CallError::Declined(reason) => format!("the library's kernel does not take it: {reason}"),
        other => format!("accepts: {other}"),
    })?;
    k.record
        .accepts(&sig)
        .map_err(|e| format!("the kernel's guards, as the host read them, refuse it: {e}"))?;
    let outputs = k.output_types(&sig).map_err(|e| format!("output types: {e}"))?;
    let mut parsed = Vec::new();
    for &platform in k.record.platforms {
        let p = platform.name();
        let text = k.module_text(&sig, platform).map_err(|e| format!("{p} emit: {e}"))?.text;
        if platform != Platform::Tpu && text.contains("tpu_custom_call") {
            return Err(format!(
                "the {p} module calls `tpu_custom_call`, a TPU-only payload (give {p} a plain \
                 StableHLO module)"
            ));
        }
        check::parse_back(&text, &sig).map_err(|e| format!("{p} module: reader: {e}"))?;
        let module = reader::parse_module(&text).map_err(|e| format!("{p} module: {e}"))?;
        let main = module.main().map_err(|e| format!("{p} module: {e}"))?;
        let results: Vec<TensorType> = main.results.iter().map(|r| r.ty.clone()).collect();
        if results != outputs {
            return Err(format!(
                "the {p} module returns ({}) but the output rule gives ({})",
                show(&results),
                show(&outputs)
            ));
        }
        parsed.push(p);
    }
    let cpu_run = if k.record.platforms.contains(&Platform::Cpu) {
        let run = check::run_kernel(checks.client, checks.cache, k, &sig, Platform::Cpu, 1)
            .map_err(|e| format!("cpu run on the PJRT CPU plugin: {e}"))?;
        if run.non_finite > 0 {
            return Err(format!(
                "cpu run on the PJRT CPU plugin: {} non-finite output values from random inputs \
                 in [-2, 2)",
                run.non_finite
            ));
        }
        Some(format!(
            "ran on the PJRT CPU plugin with random inputs: finite outputs ({})",
            run.outputs.join(", ")
        ))
    } else {
        None
    };
    let (tpu_compile, tpu_compile_note) =
        match (k.record.platforms.contains(&Platform::Tpu), checks.topology) {
            (false, _) => (None, Some("no TPU variant".to_owned())),
            (true, None) => (None, Some("not done: no libtpu topology given".to_owned())),
            (true, Some(topology)) => {
                let report = check::tpu_compile(topology, k, &sig)
                    .map_err(|e| format!("tpu compile for {}: {e}", topology.name()))?;
                (
                    Some(format!(
                        "compiled for {} with libtpu ({} bytes)",
                        report.topology, report.executable_bytes
                    )),
                    None,
                )
            }
        };
    Ok(SignatureCheck {
        signature: text.to_owned(),
        parsed,
        outputs: outputs.iter().map(TensorType::short).collect(),
        cpu_run,
        tpu_compile,
        tpu_compile_note,
    })
}
