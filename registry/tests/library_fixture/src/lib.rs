//! The test fixture of the kernel-library loader (`registry/tests/library.rs`): one file that
//! exports several tables, each under its own entry symbol and each breaking the ABI's
//! contract one way, and one real kernel whose canonical signature fails the loader's CPU
//! check. It exports no `tpuk_library`, so loading it the ordinary way is a missing symbol.

use std::ffi::c_char;

use tpu_kernels::library::{self, LibraryTable, status};
use tpu_kernels::{Tensor, tpu_kernel};

/// `log(x)`: NaN on the negative half of the loader's random inputs, so its CPU check fails.
#[tpu_kernel(op = "fixture::nan_log", output = same_as(x), canonical = ["f32[8,128]"])]
pub fn nan_log(x: Tensor) -> Tensor {
    x.log()
}

// The real table, as a library exports it, under another name.
tpu_kernels::export_library!(@entry tpuk_fixture_nan);

const CRATE: &str = env!("CARGO_CRATE_NAME");

unsafe extern "C" fn real_describe(out: *mut *mut c_char) -> i32 {
    // SAFETY: the loader passes a writable `out`.
    unsafe { library::describe(CRATE, out) }
}

unsafe extern "C" fn real_emit(
    kernel: *const c_char,
    signature: *const c_char,
    platform: *const c_char,
    out: *mut *mut c_char,
) -> i32 {
    // SAFETY: the loader passes NUL-terminated strings and a writable `out`.
    unsafe { library::emit(CRATE, kernel, signature, platform, out) }
}

unsafe extern "C" fn real_output_types(
    kernel: *const c_char,
    signature: *const c_char,
    out: *mut *mut c_char,
) -> i32 {
    // SAFETY: as above.
    unsafe { library::output_types(CRATE, kernel, signature, out) }
}

unsafe extern "C" fn real_accepts(
    kernel: *const c_char,
    signature: *const c_char,
    out: *mut *mut c_char,
) -> i32 {
    // SAFETY: as above.
    unsafe { library::accepts(CRATE, kernel, signature, out) }
}

/// The real description with `from` replaced by `to`.
///
/// # Safety
/// `out` must be writable.
unsafe fn edited_description(out: *mut *mut c_char, from: &str, to: &str) -> i32 {
    // SAFETY: forwarded.
    unsafe {
        library::respond(out, || {
            let own = library::own_kernels(CRATE).map_err(|m| (status::ERROR, m))?;
            let text = library::describe_json(CRATE, &own);
            assert!(text.contains(from), "the fixture's edit `{from}` no longer applies");
            Ok(text.replace(from, to))
        })
    }
}

unsafe extern "C" fn bad_json(out: *mut *mut c_char) -> i32 {
    // SAFETY: the loader passes a writable `out`.
    unsafe { library::respond(out, || Ok("{\"kernels\": [oops".to_owned())) }
}

unsafe extern "C" fn unknown_dtype(out: *mut *mut c_char) -> i32 {
    // SAFETY: the loader passes a writable `out`.
    unsafe { edited_description(out, "\"dtypes\": [\"f32\"]", "\"dtypes\": [\"f99\"]") }
}

unsafe extern "C" fn missing_backward(out: *mut *mut c_char) -> i32 {
    // SAFETY: the loader passes a writable `out`.
    unsafe { edited_description(out, "\"backward\": null", "\"backward\": \"nan_log_backward\"") }
}

/// Panics with `message`, quietly: the panic is the point, its report would only be noise in
/// the test output (this library's panic hook is its own; the host's is untouched).
fn quiet_panic(message: &str) -> ! {
    std::panic::set_hook(Box::new(|_| {}));
    panic!("{message}")
}

unsafe extern "C" fn describe_panics(out: *mut *mut c_char) -> i32 {
    // SAFETY: the loader passes a writable `out`.
    unsafe { library::respond(out, || quiet_panic("describe exploded")) }
}

unsafe extern "C" fn emit_panics(
    _kernel: *const c_char,
    _signature: *const c_char,
    _platform: *const c_char,
    out: *mut *mut c_char,
) -> i32 {
    // SAFETY: the loader passes a writable `out`.
    unsafe { library::respond(out, || quiet_panic("emit exploded")) }
}

const REAL: LibraryTable = LibraryTable {
    abi_version: library::ABI_VERSION,
    tpu_kernels_version: library::VERSION_C.as_ptr(),
    crate_name: c"tpuk_library_fixture".as_ptr(),
    describe: real_describe,
    emit: real_emit,
    output_types: real_output_types,
    accepts: real_accepts,
    free_string: library::free_string,
};

static FUTURE_ABI: LibraryTable = LibraryTable { abi_version: library::ABI_VERSION + 1, ..REAL };
static OLD_VERSION: LibraryTable =
    LibraryTable { tpu_kernels_version: c"0.0.1-old".as_ptr(), ..REAL };
static BAD_JSON: LibraryTable = LibraryTable { describe: bad_json, ..REAL };
static UNKNOWN_DTYPE: LibraryTable = LibraryTable { describe: unknown_dtype, ..REAL };
static MISSING_BACKWARD: LibraryTable = LibraryTable { describe: missing_backward, ..REAL };
static DESCRIBE_PANICS: LibraryTable = LibraryTable { describe: describe_panics, ..REAL };
static EMIT_PANICS: LibraryTable = LibraryTable { emit: emit_panics, ..REAL };

/// A table of the next ABI version.
#[unsafe(no_mangle)]
pub extern "C" fn tpuk_fixture_future_abi() -> *const LibraryTable {
    &FUTURE_ABI
}

/// A table built with another tpu-kernels version.
#[unsafe(no_mangle)]
pub extern "C" fn tpuk_fixture_old_version() -> *const LibraryTable {
    &OLD_VERSION
}

/// A description that is not JSON.
#[unsafe(no_mangle)]
pub extern "C" fn tpuk_fixture_bad_json() -> *const LibraryTable {
    &BAD_JSON
}

/// A record with an unknown dtype.
#[unsafe(no_mangle)]
pub extern "C" fn tpuk_fixture_unknown_dtype() -> *const LibraryTable {
    &UNKNOWN_DTYPE
}

/// A record whose backward kernel does not exist.
#[unsafe(no_mangle)]
pub extern "C" fn tpuk_fixture_missing_backward() -> *const LibraryTable {
    &MISSING_BACKWARD
}

/// A `describe` that panics.
#[unsafe(no_mangle)]
pub extern "C" fn tpuk_fixture_describe_panics() -> *const LibraryTable {
    &DESCRIBE_PANICS
}

/// An `emit` that panics.
#[unsafe(no_mangle)]
pub extern "C" fn tpuk_fixture_emit_panics() -> *const LibraryTable {
    &EMIT_PANICS
}

/// No table at all.
#[unsafe(no_mangle)]
pub extern "C" fn tpuk_fixture_null() -> *const LibraryTable {
    std::ptr::null()
}
