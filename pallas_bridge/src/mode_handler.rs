//! What the native `__torch_dispatch__` handlers of the substitution modes share
//! ([`crate::strict_mode::StrictDispatch`], [`crate::fused_mode::FusedDispatch`]).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple, PyWeakrefReference};

/// A handler's reference to its mode. Weak: the mode holds its handler (as its instance's
/// `__torch_dispatch__`), and a strong reference back would be a cycle no collector sees.
#[derive(Debug)]
pub(crate) struct ModeRef(Py<PyWeakrefReference>);

impl ModeRef {
    pub(crate) fn new(mode: &Bound<'_, PyAny>) -> PyResult<ModeRef> {
        Ok(ModeRef(PyWeakrefReference::new(mode)?.unbind()))
    }

    /// The mode, while it lives.
    pub(crate) fn get<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        self.0.bind(py).upgrade()
    }

    /// The handler's `__self__` (PyTorch checks that it is the mode): the mode, or None once it
    /// is gone.
    pub(crate) fn as_self(&self, py: Python<'_>) -> Py<PyAny> {
        self.get(py).map_or_else(|| py.None(), Bound::unbind)
    }
}

/// `__torch_dispatch__`'s arguments as the handlers take them: a tuple (empty when none came),
/// and keyword arguments only when there are some.
pub(crate) fn call_args<'a, 'py>(
    py: Python<'py>,
    args: Option<&Bound<'py, PyTuple>>,
    kwargs: Option<&'a Bound<'py, PyDict>>,
) -> (Bound<'py, PyTuple>, Option<&'a Bound<'py, PyDict>>) {
    (args.map_or_else(|| PyTuple::empty(py), Bound::clone), kwargs.filter(|k| !k.is_empty()))
}
