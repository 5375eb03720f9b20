//! Kernel libraries: a crate of `#[tpu_kernel]`s built as a `cdylib` and loaded at run time by
//! the host (`tpu_kernels.load_library(path)` in Python, `tpu_kernels_registry::library` in
//! Rust), in the spirit of `torch.ops.load_library`.
//!
//! The crate writes once, in its `lib.rs`:
//!
//! ```text
//! tpu_kernels::export_library!();
//! ```
//!
//! which exports one C symbol, [`ENTRY_SYMBOL`] (`tpuk_library`), returning a pointer to a
//! static [`LibraryTable`]. Only text and plain C types cross the boundary, never a Rust
//! struct, so the library and the host may be built by different compiler versions:
//!
//! - the table's first field is always the ABI version ([`ABI_VERSION`]), so a host can read it
//!   from a table of any version and refuse what it does not speak;
//! - the tpu-kernels version the library was built with ([`VERSION`]), which the host must match
//!   exactly (the description format and the emitted text are those of one version);
//! - `describe`: the crate's kernels as JSON text ([`describe`] documents the format);
//! - `emit`: the module text of (kernel, signature in the canonical spelling
//!   `"f32[8,128], f32[128]; eps=1e-6"`, platform name);
//! - `output_types`: a JSON list of the output types of (kernel, signature), for kernels whose
//!   output rule is a function or "build it" (`OutputRule::Fn`, `OutputRule::Build`);
//! - `accepts`: whether the kernel takes a signature (dtype, guards, and whatever else the
//!   record checks: a tiled kernel's plan), with the reason when it does not;
//! - `free_string`: frees a string the library allocated (every `out` string).
//!
//! Every entry point returns a status ([`status`]) and writes a NUL-terminated string to `*out`:
//! the result, or the error message. A panic inside the library is caught and returned as
//! [`status::PANIC`] with its message; it never unwinds into the host (a library built with
//! `panic = "abort"` aborts instead: do not build kernel libraries so).
//!
//! A cdylib links `tpu_kernels` statically, so [`crate::registered`] inside it also lists the
//! standard kernels; the library describes only its own crate's kernels (see
//! [`own_kernels`]).
//!
//! `unsafe` here is the C boundary only: reading the host's NUL-terminated arguments and
//! handing out and taking back the strings the library allocates.

use std::ffi::{CStr, CString, c_char};
use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::{BuildError, ErrorKind};
use crate::registration::{
    BindingKind, CacheKey, Guard, KernelRegistration, KernelSignature, OutputDType, OutputDim,
    OutputRule, OutputSpec, Platform, StaticKind, StaticValue,
};
use crate::types::{DType, TensorType};

/// The version of this ABI: the layout of [`LibraryTable`], the meaning of its functions and
/// statuses. Every version's table starts with `abi_version: u32`.
pub const ABI_VERSION: u32 = 1;

/// The tpu-kernels version this crate is (the library's, when compiled into a library).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// [`VERSION`], NUL-terminated, for the table.
#[doc(hidden)]
pub const VERSION_C: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(s) => s,
        Err(_) => panic!("the package version has no NUL inside"),
    };

/// The symbol a kernel library exports: `extern "C" fn() -> *const LibraryTable`.
pub const ENTRY_SYMBOL: &str = "tpuk_library";

/// What a library entry point returns.
pub mod status {
    /// Success: `*out` holds the result.
    pub const OK: i32 = 0;
    /// The request was refused (unknown kernel, a signature or platform that does not parse):
    /// `*out` holds the message.
    pub const ERROR: i32 = 1;
    /// The library panicked; `*out` holds the panic message.
    pub const PANIC: i32 = 2;
    /// `accepts`: the kernel does not take the signature; `*out` holds the reason.
    pub const DECLINED: i32 = 3;
    /// Building the module failed with a `BuildError` of kind number `status - BUILD` (see
    /// [`super::build_status`]); `*out` holds `op: message`.
    pub const BUILD: i32 = 16;
}

/// `describe(out)`: the library's kernels as JSON.
pub type DescribeFn = unsafe extern "C" fn(out: *mut *mut c_char) -> i32;
/// `emit(kernel, signature, platform, out)`: the module text.
pub type EmitFn = unsafe extern "C" fn(
    kernel: *const c_char,
    signature: *const c_char,
    platform: *const c_char,
    out: *mut *mut c_char,
) -> i32;
/// `output_types(kernel, signature, out)`: a JSON list of output types (`["f32[8,128]"]`).
pub type OutputTypesFn = unsafe extern "C" fn(
    kernel: *const c_char,
    signature: *const c_char,
    out: *mut *mut c_char,
) -> i32;
/// `accepts(kernel, signature, out)`: [`status::OK`] (and an empty `*out`) when the kernel
/// takes the signature, [`status::DECLINED`] with the reason when it does not.
pub type AcceptsFn = unsafe extern "C" fn(
    kernel: *const c_char,
    signature: *const c_char,
    out: *mut *mut c_char,
) -> i32;
/// `free_string(s)`: frees a string the library wrote to an `out` (null is ignored).
pub type FreeStringFn = unsafe extern "C" fn(s: *mut c_char);

/// The table a kernel library's [`ENTRY_SYMBOL`] returns (ABI version 1). Static: it lives as
/// long as the library is loaded.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LibraryTable {
    /// Always first, in every ABI version.
    pub abi_version: u32,
    /// The tpu-kernels version the library was built with, NUL-terminated.
    pub tpu_kernels_version: *const c_char,
    /// The crate's name (`my_kernels`), NUL-terminated.
    pub crate_name: *const c_char,
    pub describe: DescribeFn,
    pub emit: EmitFn,
    pub output_types: OutputTypesFn,
    pub accepts: AcceptsFn,
    pub free_string: FreeStringFn,
}

// SAFETY: the table is immutable static data: two pointers to NUL-terminated string literals
// and function pointers; nothing in it is ever written after initialisation.
unsafe impl Sync for LibraryTable {}
// SAFETY: as above; the pointed-to strings are `'static` literals.
unsafe impl Send for LibraryTable {}

/// Exports the crate's kernels as a kernel library: writes the [`ENTRY_SYMBOL`] function.
/// Call it once, at the crate root of a crate built with `crate-type = ["cdylib", "rlib"]`.
///
/// Two crates that both export a library cannot be linked into one Rust binary (the symbol
/// would be defined twice); a binary links at most one of them.
#[macro_export]
macro_rules! export_library {
    () => {
        $crate::export_library!(@entry tpuk_library);
    };
    // Under another symbol name: for test fixtures that export several tables from one file.
    (@entry $symbol:ident) => {
        /// The kernel library's table (see `tpu_kernels::library`).
        #[unsafe(no_mangle)]
        pub extern "C" fn $symbol() -> *const $crate::library::LibraryTable {
            const CRATE: &str = env!("CARGO_CRATE_NAME");
            unsafe extern "C" fn describe(out: *mut *mut ::std::ffi::c_char) -> i32 {
                // SAFETY: the host passes a writable `out`, as the ABI requires.
                unsafe { $crate::library::describe(CRATE, out) }
            }
            unsafe extern "C" fn emit(
                kernel: *const ::std::ffi::c_char,
                signature: *const ::std::ffi::c_char,
                platform: *const ::std::ffi::c_char,
                out: *mut *mut ::std::ffi::c_char,
            ) -> i32 {
                // SAFETY: the host passes NUL-terminated strings and a writable `out`.
                unsafe { $crate::library::emit(CRATE, kernel, signature, platform, out) }
            }
            unsafe extern "C" fn output_types(
                kernel: *const ::std::ffi::c_char,
                signature: *const ::std::ffi::c_char,
                out: *mut *mut ::std::ffi::c_char,
            ) -> i32 {
                // SAFETY: the host passes NUL-terminated strings and a writable `out`.
                unsafe { $crate::library::output_types(CRATE, kernel, signature, out) }
            }
            unsafe extern "C" fn accepts(
                kernel: *const ::std::ffi::c_char,
                signature: *const ::std::ffi::c_char,
                out: *mut *mut ::std::ffi::c_char,
            ) -> i32 {
                // SAFETY: the host passes NUL-terminated strings and a writable `out`.
                unsafe { $crate::library::accepts(CRATE, kernel, signature, out) }
            }
            static TABLE: $crate::library::LibraryTable = $crate::library::LibraryTable {
                abi_version: $crate::library::ABI_VERSION,
                tpu_kernels_version: $crate::library::VERSION_C.as_ptr(),
                crate_name: match ::std::ffi::CStr::from_bytes_with_nul(
                    concat!(env!("CARGO_CRATE_NAME"), "\0").as_bytes(),
                ) {
                    Ok(s) => s.as_ptr(),
                    Err(_) => panic!("a crate name has no NUL inside"),
                },
                describe,
                emit,
                output_types,
                accepts,
                free_string: $crate::library::free_string,
            };
            &TABLE
        }
    };
}

/// The kernels the library crate `crate_name` defines, sorted by name: the registrations whose
/// module ([`KernelRegistration::module`], recorded by `#[tpu_kernel]`) is in that crate. The
/// standard kernels every library links in are `tpu_kernels`'s. Two kernels of one name are an
/// error naming it (the host would refuse them anyway).
pub fn own_kernels(crate_name: &str) -> Result<Vec<&'static KernelRegistration>, String> {
    let all = crate::registered();
    let mut own = Vec::new();
    for (i, k) in all.iter().enumerate() {
        let other = all
            .get(i + 1)
            .filter(|next| next.name == k.name)
            .or_else(|| i.checked_sub(1).map(|j| &all[j]).filter(|prev| prev.name == k.name));
        if let Some(other) = other {
            let standard = [k.crate_name(), other.crate_name()].contains(&"tpu_kernels");
            return Err(format!(
                "library `{crate_name}`: two kernels are named `{}`{}",
                k.name,
                if standard {
                    " (a kernel of the crate takes the name of a standard kernel of tpu-kernels)"
                } else {
                    ""
                }
            ));
        }
        if k.crate_name() == crate_name {
            own.push(*k);
        }
    }
    Ok(own)
}

/// The canonical spelling of `sig` (`"f32[8,128], f32[128]; eps=1e-6"`), which
/// [`KernelRegistration::parse_signature`] reads back to the same signature. A string static
/// that would not survive the round trip (a `,` or `;` in it, surrounding spaces or quotes) is
/// an error naming it.
pub fn signature_text(sig: &KernelSignature) -> Result<String, String> {
    let mut text = sig.inputs.iter().map(TensorType::short).collect::<Vec<_>>().join(", ");
    let mut statics = Vec::with_capacity(sig.statics.len());
    for (name, value) in &sig.statics {
        let spelled = value.to_string();
        if let StaticValue::Str(s) = value {
            let kept = StaticValue::parse(StaticKind::Str, s).is_ok_and(|v| v == *value);
            if s.contains([',', ';']) || !kept {
                return Err(format!(
                    "static `{name}` = {s:?} cannot be spelled in a signature (no `,` or `;`, no \
                     surrounding spaces or quotes)"
                ));
            }
        }
        statics.push(format!("{name}={spelled}"));
    }
    if !statics.is_empty() {
        text.push_str("; ");
        text.push_str(&statics.join(", "));
    }
    Ok(text)
}

/// The status of a `BuildError` of `kind` ([`status::BUILD`] plus the kind's number).
pub fn build_status(kind: ErrorKind) -> i32 {
    let n = match kind {
        ErrorKind::DType => 0,
        ErrorKind::Shape => 1,
        ErrorKind::Axis => 2,
        ErrorKind::DimensionNumbers => 3,
        ErrorKind::ForeignValue => 4,
        ErrorKind::Literal => 5,
        ErrorKind::Region => 6,
        ErrorKind::Symbol => 7,
        ErrorKind::Verify => 8,
        ErrorKind::Unsupported => 9,
        ErrorKind::Tiling => 10,
        ErrorKind::Coverage => 11,
        ErrorKind::VmemLimit => 12,
    };
    status::BUILD + n
}

/// The error kind of a build status, `None` for other statuses.
pub fn build_kind(status: i32) -> Option<ErrorKind> {
    const KINDS: [ErrorKind; 13] = [
        ErrorKind::DType,
        ErrorKind::Shape,
        ErrorKind::Axis,
        ErrorKind::DimensionNumbers,
        ErrorKind::ForeignValue,
        ErrorKind::Literal,
        ErrorKind::Region,
        ErrorKind::Symbol,
        ErrorKind::Verify,
        ErrorKind::Unsupported,
        ErrorKind::Tiling,
        ErrorKind::Coverage,
        ErrorKind::VmemLimit,
    ];
    let n = usize::try_from(status.checked_sub(status::BUILD)?).ok()?;
    KINDS.get(n).copied()
}

/// A failed request: a status and its message.
struct Refusal {
    status: i32,
    message: String,
}

impl Refusal {
    fn request(message: String) -> Refusal {
        Refusal { status: status::ERROR, message }
    }

    fn build(e: &BuildError) -> Refusal {
        Refusal { status: build_status(e.kind), message: format!("{}: {}", e.op, e.message) }
    }
}

/// Runs `body` with panics caught, writes its result or error to `*out`, returns the status.
///
/// # Safety
/// `out` must be null or valid for one pointer write.
unsafe fn answer(out: *mut *mut c_char, body: impl FnOnce() -> Result<String, Refusal>) -> i32 {
    if out.is_null() {
        return status::ERROR;
    }
    let (code, text) = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(text)) => (status::OK, text),
        Ok(Err(refusal)) => (refusal.status, refusal.message),
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            (status::PANIC, format!("the library panicked: {message}"))
        }
    };
    let c = CString::new(text.replace('\0', "\\0")).unwrap_or_default();
    // SAFETY: `out` is non-null and valid for a write (the caller's contract).
    unsafe { *out = c.into_raw() };
    code
}

/// Runs `body` with panics caught and writes its answer to `*out` (`Err((status, message))`):
/// what every entry point does, for hand-written tables (test fixtures).
///
/// # Safety
/// `out` must be null or valid for one pointer write.
#[doc(hidden)]
pub unsafe fn respond(
    out: *mut *mut c_char,
    body: impl FnOnce() -> Result<String, (i32, String)>,
) -> i32 {
    // SAFETY: forwarded from the caller.
    unsafe { answer(out, || body().map_err(|(status, message)| Refusal { status, message })) }
}

/// A host argument as text.
///
/// # Safety
/// `ptr` must be null or point to a NUL-terminated string that outlives the call.
unsafe fn arg<'a>(what: &str, ptr: *const c_char) -> Result<&'a str, Refusal> {
    if ptr.is_null() {
        return Err(Refusal::request(format!("{what} is a null pointer")));
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str().map_err(|_| Refusal::request(format!("{what} is not UTF-8")))
}

/// What a call on one kernel at one signature names: the kernel's name, its record (one of
/// crate `crate_name`'s) and the signature, parsed.
///
/// # Safety
/// As [`arg`], for `kernel` and `signature`.
unsafe fn kernel_call<'a>(
    crate_name: &str,
    kernel: *const c_char,
    signature: *const c_char,
) -> Result<(&'a str, &'static KernelRegistration, KernelSignature), Refusal> {
    // SAFETY: forwarded from the caller.
    let (name, sig_text) = unsafe { (arg("kernel", kernel)?, arg("signature", signature)?) };
    let reg = own_kernel(crate_name, name)?;
    let sig = reg.parse_signature(sig_text).map_err(Refusal::request)?;
    Ok((name, reg, sig))
}

/// The kernel `name` of crate `crate_name`.
fn own_kernel(crate_name: &str, name: &str) -> Result<&'static KernelRegistration, Refusal> {
    let own = own_kernels(crate_name).map_err(Refusal::request)?;
    own.iter().copied().find(|k| k.name == name).ok_or_else(|| {
        let names: Vec<&str> = own.iter().map(|k| k.name).collect();
        Refusal::request(format!(
            "library `{crate_name}` has no kernel `{name}` (it has: {})",
            if names.is_empty() { "none".to_owned() } else { names.join(", ") }
        ))
    })
}

fn platform_named(name: &str) -> Result<Platform, Refusal> {
    Platform::ALL
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| Refusal::request(format!("unknown platform `{name}` (cpu, tpu, cuda)")))
}

/// Whether the entry function of `text` takes an input with a symbolic dimension.
fn has_symbolic_inputs(text: &str) -> bool {
    crate::reader::parse_module(text).ok().is_some_and(|m| {
        m.main().is_ok_and(|f| {
            f.args.iter().any(|a| a.ty.shape.dims().iter().any(|d| d.as_static().is_none()))
        })
    })
}

/// The module text `reg` gives for `sig` on `platform`: [`KernelRegistration::emit_text`] (a
/// tiled kernel's TPU variant is its `tpu_custom_call` module, every other platform its twin),
/// or for an imported kernel the platform's variant, refined to the signature's static shapes
/// when it was exported with symbolic ones.
fn emit_text(
    reg: &KernelRegistration,
    sig: &KernelSignature,
    platform: Platform,
) -> Result<String, BuildError> {
    if !reg.is_imported() {
        return reg.emit_text(sig, platform);
    }
    let missing = || BuildError {
        kernel: reg.name.to_owned(),
        op: "emit",
        kind: ErrorKind::Symbol,
        message: format!("the import has no {} variant", platform.name()),
    };
    let text = reg.imported_module(platform).ok_or_else(missing)?.text;
    if !has_symbolic_inputs(text) {
        return Ok(text.to_owned());
    }
    crate::refine::refine(text, &sig.inputs).map_err(|e| BuildError {
        kernel: reg.name.to_owned(),
        op: "refine",
        kind: ErrorKind::Shape,
        message: e.to_string(),
    })
}

/// `describe` for crate `crate_name`: its kernels as JSON. The text is one object:
///
/// ```text
/// {"abi_version": 1, "tpu_kernels_version": "0.1.0", "crate": "my_kernels", "kernels": [K...]}
/// ```
///
/// and each kernel `K` carries every field of its [`KernelRegistration`] the host needs:
/// `name`, `ops`, `inputs`, `statics` (`{"name", "kind": int|float|bool|str, "default": text
/// or null, "cache_key": "include" or {"ignore": reason}}`), `schema`, `bindings` (`{"name",
/// "position", "kind": tensor|static, "index"}`), `guards` (`{"guard": rank|divisible_by|...,
/// ...fields}`), `dtypes` and `platforms` (short names), `priority`, `canonical`, `source`
/// (`built`, `imported`, or `tiled`: the host asks `accepts` whether its plan takes a call),
/// `output` (`{"rule": "specs", "specs": [...]}` with each spec `{"same_as": i}`,
/// `{"reduced": {"input", "dim"}}` or `{"shape": {"dtype": {"of": i} or {"fixed": dtype},
/// "dims": [{"of": {"input", "dim"}} or {"static": n}]}}`; or `{"rule": "fn"}` / `{"rule":
/// "build"}`, whose types come from `output_types`), `backward` (a name or null), `mutates`
/// (the inputs updated in place; only when there are any) and `doc`.
///
/// # Safety
/// `out` must be null or valid for one pointer write.
#[doc(hidden)]
pub unsafe fn describe(crate_name: &str, out: *mut *mut c_char) -> i32 {
    // SAFETY: forwarded from the caller.
    unsafe {
        answer(out, || {
            let own = own_kernels(crate_name).map_err(Refusal::request)?;
            Ok(describe_json(crate_name, &own))
        })
    }
}

/// `emit` for crate `crate_name`.
///
/// # Safety
/// Each pointer must be null or point to a NUL-terminated string; `out` must be null or valid
/// for one pointer write.
#[doc(hidden)]
pub unsafe fn emit(
    crate_name: &str,
    kernel: *const c_char,
    signature: *const c_char,
    platform: *const c_char,
    out: *mut *mut c_char,
) -> i32 {
    // SAFETY: forwarded from the caller.
    unsafe {
        answer(out, || {
            let (name, reg, sig) = kernel_call(crate_name, kernel, signature)?;
            let platform = platform_named(arg("platform", platform)?)?;
            if !reg.platforms.contains(&platform) {
                return Err(Refusal::request(format!(
                    "kernel `{name}` does not run on {}",
                    platform.name()
                )));
            }
            emit_text(reg, &sig, platform).map_err(|e| Refusal::build(&e))
        })
    }
}

/// `output_types` for crate `crate_name`.
///
/// # Safety
/// Each pointer must be null or point to a NUL-terminated string; `out` must be null or valid
/// for one pointer write.
#[doc(hidden)]
pub unsafe fn output_types(
    crate_name: &str,
    kernel: *const c_char,
    signature: *const c_char,
    out: *mut *mut c_char,
) -> i32 {
    // SAFETY: forwarded from the caller.
    unsafe {
        answer(out, || {
            let (name, reg, sig) = kernel_call(crate_name, kernel, signature)?;
            let types = match reg.output {
                // Through the builder, so a build error keeps its kind (a refusal stays one).
                OutputRule::Build if !reg.is_imported() => reg
                    .emit(&sig)
                    .map(|m| m.main().results.clone())
                    .map_err(|e| Refusal::build(&e))?,
                _ => reg
                    .output_types(&sig)
                    .map_err(|m| Refusal::request(format!("kernel `{name}`: output types: {m}")))?,
            };
            let mut json = String::from("[");
            for (i, t) in types.iter().enumerate() {
                if i > 0 {
                    json.push_str(", ");
                }
                json_str(&mut json, &t.short());
            }
            json.push(']');
            Ok(json)
        })
    }
}

/// `accepts` for crate `crate_name`.
///
/// # Safety
/// Each pointer must be null or point to a NUL-terminated string; `out` must be null or valid
/// for one pointer write.
#[doc(hidden)]
pub unsafe fn accepts(
    crate_name: &str,
    kernel: *const c_char,
    signature: *const c_char,
    out: *mut *mut c_char,
) -> i32 {
    // SAFETY: forwarded from the caller.
    unsafe {
        answer(out, || {
            let (_, reg, sig) = kernel_call(crate_name, kernel, signature)?;
            reg.accepts(&sig)
                .map(|()| String::new())
                .map_err(|message| Refusal { status: status::DECLINED, message })
        })
    }
}

/// `free_string`: takes back a string the library handed out.
///
/// # Safety
/// `s` must be null or a pointer this library wrote to an `out`, not freed before.
pub unsafe extern "C" fn free_string(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: `s` came from `CString::into_raw` in `answer` (the caller's contract).
        drop(unsafe { CString::from_raw(s) });
    }
}

// ----- the description -----

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_strs(out: &mut String, items: impl IntoIterator<Item = impl AsRef<str>>) {
    out.push('[');
    for (i, s) in items.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        json_str(out, s.as_ref());
    }
    out.push(']');
}

fn json_opt_str(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => json_str(out, s),
        None => out.push_str("null"),
    }
}

fn kind_name(kind: StaticKind) -> &'static str {
    match kind {
        StaticKind::Int => "int",
        StaticKind::Float => "float",
        StaticKind::Bool => "bool",
        StaticKind::Str => "str",
    }
}

fn dtype_json(out: &mut String, d: DType) {
    json_str(out, d.short_name());
}

fn guard_json(out: &mut String, g: &Guard) {
    match *g {
        Guard::StaticEq { name, value } => {
            out.push_str("{\"guard\": \"static_eq\", \"name\": ");
            json_str(out, name);
            out.push_str(", \"value\": ");
            json_str(out, value);
            out.push('}');
        }
        Guard::Rank { input, min, max } => {
            let max = if max == usize::MAX { "null".to_owned() } else { max.to_string() };
            let _ = write!(
                out,
                "{{\"guard\": \"rank\", \"input\": {input}, \"min\": {min}, \"max\": {max}}}"
            );
        }
        Guard::DivisibleBy { input, dim, by } => {
            let _ = write!(
                out,
                "{{\"guard\": \"divisible_by\", \"input\": {input}, \"dim\": {dim}, \"by\": {by}}}"
            );
        }
        Guard::SameDim { a, b } => {
            let _ = write!(
                out,
                "{{\"guard\": \"same_dim\", \"a\": [{}, {}], \"b\": [{}, {}]}}",
                a.0, a.1, b.0, b.1
            );
        }
        Guard::SameDType => out.push_str("{\"guard\": \"same_dtype\"}"),
        Guard::DimEq { input, dim, size } => {
            let _ = write!(
                out,
                "{{\"guard\": \"dim_eq\", \"input\": {input}, \"dim\": {dim}, \"size\": {size}}}"
            );
        }
        Guard::DTypeIs { input, dtype } => {
            let _ = write!(out, "{{\"guard\": \"dtype_is\", \"input\": {input}, \"dtype\": ");
            dtype_json(out, dtype);
            out.push('}');
        }
    }
}

fn spec_json(out: &mut String, s: &OutputSpec) {
    match *s {
        OutputSpec::SameAs(i) => {
            let _ = write!(out, "{{\"same_as\": {i}}}");
        }
        OutputSpec::Reduced { input, dim } => {
            let _ = write!(out, "{{\"reduced\": {{\"input\": {input}, \"dim\": {dim}}}}}");
        }
        OutputSpec::Shape { dtype, dims } => {
            out.push_str("{\"shape\": {\"dtype\": ");
            match dtype {
                OutputDType::Of(i) => {
                    let _ = write!(out, "{{\"of\": {i}}}");
                }
                OutputDType::Fixed(d) => {
                    out.push_str("{\"fixed\": ");
                    dtype_json(out, d);
                    out.push('}');
                }
            }
            out.push_str(", \"dims\": [");
            for (i, d) in dims.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                match *d {
                    OutputDim::Of { input, dim } => {
                        let _ = write!(out, "{{\"of\": {{\"input\": {input}, \"dim\": {dim}}}}}");
                    }
                    OutputDim::Static(n) => {
                        let _ = write!(out, "{{\"static\": {n}}}");
                    }
                }
            }
            out.push_str("]}}");
        }
    }
}

fn kernel_json(out: &mut String, k: &KernelRegistration) {
    out.push_str("{\"name\": ");
    json_str(out, k.name);
    out.push_str(", \"ops\": ");
    json_strs(out, k.ops);
    out.push_str(", \"inputs\": ");
    json_strs(out, k.inputs);
    out.push_str(", \"statics\": [");
    for (i, p) in k.statics.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str("{\"name\": ");
        json_str(out, p.name);
        let _ = write!(out, ", \"kind\": \"{}\", \"default\": ", kind_name(p.kind));
        json_opt_str(out, p.default);
        out.push_str(", \"cache_key\": ");
        match p.cache_key {
            CacheKey::Include => out.push_str("\"include\""),
            CacheKey::Ignore { reason } => {
                out.push_str("{\"ignore\": ");
                json_str(out, reason);
                out.push('}');
            }
        }
        out.push('}');
    }
    out.push_str("], \"schema\": ");
    json_strs(out, k.schema);
    out.push_str(", \"bindings\": [");
    for (i, b) in k.bindings.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let (kind, index) = match b.kind {
            BindingKind::Tensor { index } => ("tensor", index),
            BindingKind::Static { index } => ("static", index),
        };
        out.push_str("{\"name\": ");
        json_str(out, b.name);
        let _ = write!(
            out,
            ", \"position\": {}, \"kind\": \"{kind}\", \"index\": {index}}}",
            b.position
        );
    }
    out.push_str("], \"guards\": [");
    for (i, g) in k.guards.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        guard_json(out, g);
    }
    out.push_str("], \"dtypes\": ");
    json_strs(out, k.dtypes.iter().map(|d| d.short_name()));
    out.push_str(", \"platforms\": ");
    json_strs(out, k.platforms.iter().map(|p| p.name()));
    let _ = write!(out, ", \"priority\": {}, \"canonical\": ", k.priority);
    json_strs(out, k.canonical);
    let source = if k.is_imported() {
        "imported"
    } else if k.is_tiled() {
        "tiled"
    } else {
        "built"
    };
    let _ = write!(out, ", \"source\": \"{source}\", \"output\": ");
    match k.output {
        OutputRule::Build => out.push_str("{\"rule\": \"build\"}"),
        OutputRule::Fn(_) => out.push_str("{\"rule\": \"fn\"}"),
        OutputRule::Specs(specs) => {
            out.push_str("{\"rule\": \"specs\", \"specs\": [");
            for (i, s) in specs.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                spec_json(out, s);
            }
            out.push_str("]}");
        }
    }
    out.push_str(", \"backward\": ");
    json_opt_str(out, k.backward);
    if !k.mutates.is_empty() {
        out.push_str(", \"mutates\": ");
        json_strs(out, k.mutates);
    }
    out.push_str(", \"doc\": ");
    json_str(out, k.doc);
    out.push('}');
}

/// The description of `kernels` as library `crate_name` (see [`describe`]).
pub fn describe_json(crate_name: &str, kernels: &[&KernelRegistration]) -> String {
    let mut out = format!("{{\"abi_version\": {ABI_VERSION}, \"tpu_kernels_version\": ");
    json_str(&mut out, VERSION);
    out.push_str(", \"crate\": ");
    json_str(&mut out, crate_name);
    out.push_str(", \"kernels\": [");
    for (i, k) in kernels.iter().enumerate() {
        out.push_str(if i > 0 { ",\n  " } else { "\n  " });
        kernel_json(&mut out, k);
    }
    out.push_str("\n]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_kernels_are_not_a_librarys_own() {
        // This test binary links tpu_kernels only: `registered()` is the standard set, and every
        // one of its records says it comes from `tpu_kernels`.
        let strays: Vec<(&str, &str)> = crate::registered()
            .iter()
            .filter(|k| k.crate_name() != "tpu_kernels")
            .map(|k| (k.name, k.module))
            .collect();
        assert!(strays.is_empty(), "standard kernels with another module: {strays:?}");
        assert!(own_kernels("std_only").expect("no clash").is_empty());
        assert!(!own_kernels("tpu_kernels").expect("no clash").is_empty());
    }

    #[test]
    fn signatures_round_trip_through_their_spelling() {
        let rms = crate::registered().into_iter().find(|k| k.name == "rms_norm").expect("rms");
        for text in ["f32[8,128], f32[128]; eps=1e-5", "bf16[3,5,128], bf16[128]; eps=0.1"] {
            let sig = rms.parse_signature(text).expect("parses");
            let spelled = signature_text(&sig).expect("spells");
            assert_eq!(rms.parse_signature(&spelled).expect("reads back"), sig, "{spelled}");
        }
        let sig = KernelSignature {
            inputs: vec![],
            statics: vec![("mode", StaticValue::Str("a,b".to_owned()))],
        };
        assert!(signature_text(&sig).expect_err("a comma").contains("static `mode`"));
    }

    #[test]
    fn build_statuses_round_trip_and_others_are_no_build_error() {
        for kind in [ErrorKind::DType, ErrorKind::Unsupported, ErrorKind::VmemLimit] {
            assert_eq!(build_kind(build_status(kind)), Some(kind));
        }
        for s in [
            status::OK,
            status::ERROR,
            status::PANIC,
            status::DECLINED,
            status::BUILD + 13,
            -1,
            i32::MIN,
        ] {
            assert_eq!(build_kind(s), None, "{s}");
        }
    }

    #[test]
    fn entry_points_answer_with_a_status_and_text_never_a_panic() {
        fn call(f: impl FnOnce(*mut *mut c_char) -> i32) -> (i32, String) {
            let mut out: *mut c_char = std::ptr::null_mut();
            let code = f(&mut out);
            assert!(!out.is_null());
            // SAFETY: `answer` wrote a string from `CString::into_raw`.
            let text = unsafe { CStr::from_ptr(out) }.to_string_lossy().into_owned();
            // SAFETY: freed once, as the ABI asks.
            unsafe { free_string(out) };
            (code, text)
        }
        let (code, text) = call(|out| unsafe { describe("std_only", out) });
        assert_eq!(code, status::OK);
        assert!(text.contains("\"kernels\": [\n]"), "{text}");
        let name = c"silu";
        let sig = c"f32[8,128]";
        let cpu = c"cpu";
        let (code, text) =
            call(|out| unsafe { emit("std_only", name.as_ptr(), sig.as_ptr(), cpu.as_ptr(), out) });
        assert_eq!(code, status::ERROR);
        assert!(text.contains("library `std_only` has no kernel `silu` (it has: none)"), "{text}");
        let (code, text) = call(|out| unsafe {
            answer(out, || -> Result<String, Refusal> { panic!("kernel body exploded") })
        });
        assert_eq!(code, status::PANIC);
        assert_eq!(text, "the library panicked: kernel body exploded");
        let (code, text) = call(|out| unsafe {
            emit("std_only", std::ptr::null(), sig.as_ptr(), cpu.as_ptr(), out)
        });
        assert_eq!((code, text.as_str()), (status::ERROR, "kernel is a null pointer"));
        // SAFETY: a null `out` is refused without a write.
        assert_eq!(unsafe { describe("std_only", std::ptr::null_mut()) }, status::ERROR);
    }

    #[test]
    fn the_description_is_json_with_every_field() {
        let rms = crate::registered().into_iter().find(|k| k.name == "rms_norm").expect("rms");
        let text = describe_json("demo", &[rms]);
        for field in [
            "\"name\": \"rms_norm\"",
            "\"ops\": [\"tpuk::rms_norm.default\"]",
            "\"cache_key\": \"include\"",
            "\"rule\": \"specs\"",
            "\"backward\": \"rms_norm_backward\"",
            "\"source\": \"built\"",
        ] {
            assert!(text.contains(field), "{field} missing from {text}");
        }
        assert!(!text.contains("\"mutates\""), "only kernels that update inputs say so: {text}");
        let adamw =
            crate::registered().into_iter().find(|k| k.name == "adamw_step").expect("adamw");
        let text = describe_json("demo", &[adamw]);
        let want = "\"mutates\": [\"param\", \"exp_avg\", \"exp_avg_sq\"]";
        assert!(text.contains(want), "{want} missing from {text}");
        let mut s = String::new();
        json_str(&mut s, "a\"b\\c\n\u{1}");
        assert_eq!(s, "\"a\\\"b\\\\c\\n\\u0001\"");
    }
}
