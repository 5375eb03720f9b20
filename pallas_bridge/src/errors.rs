//! Python exceptions: the classes live in `tpu_kernels.errors` (so each can subclass both the
//! package's base class and a builtin), and Rust raises them by name with the Rust message.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

/// The exception class `name` of `tpu_kernels.errors`, raised with `args`.
pub fn raise_with(py: Python<'_>, name: &str, args: Bound<'_, PyTuple>) -> PyErr {
    let class = py
        .import("tpu_kernels.errors")
        .and_then(|m| m.getattr(name))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match class {
        Ok(class) => match class.call1(args) {
            Ok(instance) => PyErr::from_value(instance),
            Err(e) => e,
        },
        Err(e) => PyRuntimeError::new_err(format!(
            "tpu_kernels.errors.{name} is unavailable ({e}); the message was: {args}"
        )),
    }
}

/// The exception class `name` of `tpu_kernels.errors` with one message.
pub fn raise(py: Python<'_>, name: &str, message: impl Into<String>) -> PyErr {
    match PyTuple::new(py, [message.into()]) {
        Ok(args) => raise_with(py, name, args),
        Err(e) => e,
    }
}

/// Whether an error in a kernel or in this project's code (a build, compile, lowering or
/// execute failure, a bug in the binding code) raises `InternalError` rather than falling back
/// to PyTorch. Off unless `TPUK_ON_ERROR=raise` is set or `tpu_kernels.set_error_policy`
/// turns it on.
pub fn raise_errors() -> bool {
    raise_flag().load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets [`raise_errors`]; returns the previous setting.
pub fn set_raise_errors(on: bool) -> bool {
    raise_flag().swap(on, std::sync::atomic::Ordering::Relaxed)
}

fn raise_flag() -> &'static std::sync::atomic::AtomicBool {
    static FLAG: std::sync::OnceLock<std::sync::atomic::AtomicBool> = std::sync::OnceLock::new();
    FLAG.get_or_init(|| {
        let on = std::env::var("TPUK_ON_ERROR").is_ok_and(|v| v.trim() == "raise");
        std::sync::atomic::AtomicBool::new(on)
    })
}
