//! `tpu_kernels._device`: the "tpu" device's C++ shim (`src/shim.cpp`) as a Python module.
//!
//! The shim registers PyTorch's PrivateUse1 pieces when this module is loaded (the allocator,
//! the device guard, the fallback and the kernels every backend needs), so it must be imported
//! after `torch` and only by `tpu_kernels.device`, which renames the key "tpu" first. This
//! module only connects the shim to the Rust runtime in `tpu_kernels._native`: it hands over the
//! runtime's function table ([`install`]) and registers bound ops at the key ([`bind`]). What
//! runs where is decided behind that table, in `_native`.

use std::ffi::{CString, c_char};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule};

unsafe extern "C" {
    fn tpuk_shim_install(api: *const std::ffi::c_void, err: *mut c_char, cap: usize) -> i32;
    fn tpuk_shim_bind(
        ns: *const c_char,
        name: *const c_char,
        overload: *const c_char,
        id: u32,
        err: *mut c_char,
        cap: usize,
    ) -> i32;
    fn tpuk_shim_manual_seed(seed: u64);
    fn tpuk_shim_unboxed_records() -> u64;
    fn tpuk_shim_initial_seed() -> u64;
    fn tpuk_shim_seed() -> u64;
    fn tpuk_shim_rng_state(buf: *mut u8, cap: usize) -> usize;
    fn tpuk_shim_set_rng_state(data: *const u8, len: usize, err: *mut c_char, cap: usize) -> i32;
}

/// The capsule name `_native.device_api()` gives its table.
const API_CAPSULE: &std::ffi::CStr = c"tpu_kernels._native.device_api";

fn message(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn c_text(what: &str, s: &str) -> PyResult<CString> {
    CString::new(s).map_err(|_| PyValueError::new_err(format!("{what} `{s}` contains a NUL byte")))
}

/// Hands the runtime's function table (`tpu_kernels._native.device_api()`) to the shim.
#[pyfunction]
fn install(api: &Bound<'_, PyCapsule>) -> PyResult<()> {
    let ptr = api.pointer_checked(Some(API_CAPSULE)).map_err(|_| {
        PyValueError::new_err("not the capsule of tpu_kernels._native.device_api()")
    })?;
    let mut err = [0u8; 512];
    // SAFETY: the capsule's pointer is the `'static` table of `_native` (checked by name above;
    // the shim checks its ABI version and size); `err` is writable for its length.
    let rc = unsafe { tpuk_shim_install(ptr.as_ptr(), err.as_mut_ptr().cast(), err.len()) };
    if rc != 0 {
        return Err(PyRuntimeError::new_err(message(&err)));
    }
    Ok(())
}

/// Registers the kernel of `ns::name.overload` (overload `""` for the default one) at the key,
/// forwarding its calls to the runtime's op `id`.
#[pyfunction]
fn bind(ns: &str, name: &str, overload: &str, id: u32) -> PyResult<()> {
    let (ns, name, overload) =
        (c_text("namespace", ns)?, c_text("op", name)?, c_text("overload", overload)?);
    let mut err = [0u8; 512];
    // SAFETY: NUL-terminated strings that outlive the call; `err` is writable for its length.
    let rc = unsafe {
        tpuk_shim_bind(
            ns.as_ptr(),
            name.as_ptr(),
            overload.as_ptr(),
            id,
            err.as_mut_ptr().cast(),
            err.len(),
        )
    };
    if rc != 0 {
        return Err(PyRuntimeError::new_err(message(&err)));
    }
    Ok(())
}

/// How many calls the shim's unboxed entry recorded (fused mode, native recorder): pointwise
/// calls whose arguments reached `record` with nothing boxed.
#[pyfunction]
fn unboxed_records() -> u64 {
    // SAFETY: a plain call reading a counter.
    unsafe { tpuk_shim_unboxed_records() }
}

/// Seeds the generator the device's random ops draw from.
#[pyfunction]
fn manual_seed(seed: u64) {
    // SAFETY: a plain call; the shim locks the generator.
    unsafe { tpuk_shim_manual_seed(seed) }
}

/// Seeds the device's generator from a non-deterministic source and returns the seed.
#[pyfunction]
fn seed() -> u64 {
    // SAFETY: a plain call; the shim locks the generator.
    unsafe { tpuk_shim_seed() }
}

/// The seed the device's generator was last seeded with.
#[pyfunction]
fn initial_seed() -> u64 {
    // SAFETY: a plain call.
    unsafe { tpuk_shim_initial_seed() }
}

/// The device generator's state, as bytes (`torch.tpu.get_rng_state`).
#[pyfunction]
fn rng_state(py: Python<'_>) -> Bound<'_, PyBytes> {
    // SAFETY: a null buffer only asks for the size.
    let n = unsafe { tpuk_shim_rng_state(std::ptr::null_mut(), 0) };
    let mut buf = vec![0u8; n];
    // SAFETY: `buf` is writable for `n` bytes, the state's size.
    unsafe { tpuk_shim_rng_state(buf.as_mut_ptr(), buf.len()) };
    PyBytes::new(py, &buf)
}

/// Sets the device generator's state from bytes `rng_state` gave.
#[pyfunction]
fn set_rng_state(state: &[u8]) -> PyResult<()> {
    let mut err = [0u8; 512];
    // SAFETY: `state` is readable for its length; `err` is writable for its length.
    let rc = unsafe {
        tpuk_shim_set_rng_state(state.as_ptr(), state.len(), err.as_mut_ptr().cast(), err.len())
    };
    if rc != 0 {
        return Err(PyValueError::new_err(format!("not a tpu generator state: {}", message(&err))));
    }
    Ok(())
}

#[pymodule]
fn _device(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("TORCH_VERSION", env!("TPUK_TORCH_VERSION"))?;
    m.add_function(wrap_pyfunction!(install, m)?)?;
    m.add_function(wrap_pyfunction!(bind, m)?)?;
    m.add_function(wrap_pyfunction!(unboxed_records, m)?)?;
    m.add_function(wrap_pyfunction!(manual_seed, m)?)?;
    m.add_function(wrap_pyfunction!(seed, m)?)?;
    m.add_function(wrap_pyfunction!(initial_seed, m)?)?;
    m.add_function(wrap_pyfunction!(rng_state, m)?)?;
    m.add_function(wrap_pyfunction!(set_rng_state, m)?)?;
    Ok(())
}
