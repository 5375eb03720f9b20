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
