//! The hot path of `substitute("strict")`: the mode's `__torch_dispatch__`, in Rust.
//!
//! [`StrictDispatch`] is installed as the strict mode's bound `__torch_dispatch__` (PyTorch
//! looks the handler up on the mode object and checks that its `__self__` is the mode). Per op
//! overload it remembers what the Python side decided once ([`StrictDispatch::learn`]):
//! - no kernel binds the op: call it as usual, from here;
//! - a plan this path takes: bind the call's arguments to the kernel's tensors and statics, read
//!   the tensors through DLPack, run the dispatcher, and hand the outputs back as torch tensors;
//! - a plan it does not take (refused kernels, an output mask): the Python handler.
//!
//! Anything out of the ordinary in a call it takes (arguments that bind no variant, a strided,
//! non-CPU or non-DLPack tensor, a static it cannot read) goes to the Python handler before any
//! kernel runs, so fallback reasons and their records stay the Python side's; a dispatcher
//! fallback (the dispatcher has counted it) runs the original op from here. The Python
//! handler stays the one definition of what strict mode does; this is a faster way to the same
//! answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple, PyType};
use tpu_kernels::registration::StaticValue;
use tpu_kernels_registry::{DispatchError, HostTensor};

use crate::mode_handler::{ModeRef, call_args};
use crate::torch_bridge::{Imported, exchange_api, export_buffer, import_tensor, runtime};

/// A static argument slot: `(name, position, torch default, is a dtype)`.
#[derive(Debug)]
struct StaticSlot {
    name: &'static str,
    key: Py<PyString>,
    position: usize,
    default: Py<PyAny>,
    is_dtype: bool,
}

/// One binding of the op's kernels (see `_bindings.Variant`).
#[derive(Debug)]
struct Variant {
    tensors: Vec<(Py<PyString>, usize)>,
    statics: Vec<StaticSlot>,
    absent: Vec<(Py<PyString>, usize)>,
}

#[derive(Debug)]
struct Plan {
    key: String,
    variants: Vec<Variant>,
}

#[derive(Clone, Debug)]
enum Entry {
    /// No kernel binds the op.
    Passthrough,
    /// The Python handler takes every call.
    Python,
    Fast(Arc<Plan>),
}

/// What the handler knows, per op overload (keyed by the `OpOverload`'s address, which the
/// entry keeps alive), under one registry generation.
#[derive(Debug)]
struct Known {
    generation: usize,
    entries: HashMap<usize, (Py<PyAny>, Entry)>,
}

/// The bound `__torch_dispatch__` of a strict substitution mode.
#[pyclass(module = "tpu_kernels._native.torch_bridge", frozen)]
#[derive(Debug)]
pub struct StrictDispatch {
    mode: ModeRef,
    python: Py<PyAny>,
    tensor_type: Py<PyType>,
    known: Mutex<Known>,
}

fn arg<'py>(
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
    position: usize,
    key: &Bound<'py, PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if position < args.len() {
        return Ok(Some(args.get_item(position)?));
    }
    match kwargs {
        Some(kw) => kw.get_item(key),
        None => Ok(None),
    }
}

/// A variant as `learn` receives it: tensor slots, static slots, absent tensors.
type VariantSpec<'py> =
    (Bound<'py, PyAny>, Vec<(String, usize, Py<PyAny>, bool)>, Bound<'py, PyAny>);

type BoundCall<'py> = (Vec<Bound<'py, PyAny>>, Vec<(&'static str, StaticValue)>);

impl StrictDispatch {
    /// The first variant the call binds to, or `None` (the Python handler says why).
    fn bind<'py>(
        &self,
        py: Python<'py>,
        plan: &Plan,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Option<BoundCall<'py>>> {
        let tensor_type = self.tensor_type.bind(py);
        'variants: for v in &plan.variants {
            for (key, position) in &v.absent {
                if arg(args, kwargs, *position, key.bind(py))?.is_some_and(|a| !a.is_none()) {
                    continue 'variants;
                }
            }
            let mut tensors = Vec::with_capacity(v.tensors.len());
            for (key, position) in &v.tensors {
                match arg(args, kwargs, *position, key.bind(py))? {
                    Some(t) if t.is_instance(tensor_type)? => tensors.push(t),
                    _ => continue 'variants,
                }
            }
            let mut statics = Vec::with_capacity(v.statics.len());
            for s in &v.statics {
                let value = match arg(args, kwargs, s.position, s.key.bind(py))? {
                    Some(value) => value,
                    None => s.default.bind(py).clone(),
                };
                if value.is_none() {
                    continue;
                }
                let value = if s.is_dtype {
                    let text = value.str()?.to_string();
                    PyString::new(py, text.strip_prefix("torch.").unwrap_or(&text)).into_any()
                } else {
                    value
                };
                match crate::registry_api::static_value(py, s.name, &value) {
                    Ok(v) => statics.push((s.name, v)),
                    Err(_) => return Ok(None),
                }
            }
            return Ok(Some((tensors, statics)));
        }
        Ok(None)
    }

    /// The call through `plan`'s kernel: `Some(outputs)`, the original op's result after a
    /// dispatcher fallback, or `None` when the Python handler should take the call.
    fn run<'py>(
        &self,
        py: Python<'py>,
        plan: &Plan,
        func: &Bound<'py, PyAny>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some((tensors, statics)) = self.bind(py, plan, args, kwargs)? else {
            return Ok(None);
        };
        let mut imported: Vec<Imported> = Vec::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            match import_tensor(t, i) {
                Ok(t) if t.contiguous => imported.push(t),
                _ => return Ok(None),
            }
        }
        let rt = runtime(py)?;
        let inputs: Vec<HostTensor<'_>> = imported
            .iter()
            .map(|t| HostTensor { ty: &t.ty, data: t.bytes(), contiguous: true })
            .collect();
        match rt.dispatcher.call(&plan.key, &inputs, &statics) {
            Ok(mut buffers) => {
                let api = tensors.first().and_then(exchange_api);
                let on_tpu = imported.iter().any(|t| t.on_tpu);
                if buffers.len() == 1 {
                    let buffer = buffers
                        .pop()
                        .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("no output"))?;
                    return export_buffer(py, buffer, api.as_ref(), on_tpu).map(Some);
                }
                let outs = buffers
                    .into_iter()
                    .map(|b| export_buffer(py, b, api.as_ref(), on_tpu))
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(Some(PyTuple::new(py, outs)?.into_any()))
            }
            // An error in a kernel or in our code, which the policy says to raise (counted).
            Err(DispatchError::Fallback(f) | DispatchError::Forbidden(f))
                if f.reason.is_error() && crate::errors::raise_errors() =>
            {
                Err(crate::errors::raise(py, "InternalError", f.to_string()))
            }
            // Counted by the dispatcher: run the op as usual.
            Err(DispatchError::Fallback(_) | DispatchError::Forbidden(_)) => {
                func.call(args, kwargs).map(Some)
            }
            Err(_) => Ok(None),
        }
    }

    fn entry(&self, py: Python<'_>, func: &Bound<'_, PyAny>) -> Option<Entry> {
        let generation = runtime(py).ok()?.dispatcher.registry().generation();
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if known.generation != generation {
            known.generation = generation;
            known.entries.clear();
            return None;
        }
        known.entries.get(&(func.as_ptr() as usize)).map(|(_, e)| e.clone())
    }
}

fn slots(py: Python<'_>, list: &Bound<'_, PyAny>) -> PyResult<Vec<(Py<PyString>, usize)>> {
    list.try_iter()?
        .map(|item| {
            let (name, position): (String, usize) = item?.extract()?;
            Ok((PyString::intern(py, &name).unbind(), position))
        })
        .collect()
}

#[pymethods]
impl StrictDispatch {
    /// `mode`: the strict mode (held weakly); `python`: its Python handler, called as
    /// `python(func, types, args, kwargs)`; `tensor_type`: `torch.Tensor`.
    #[new]
    fn new(
        mode: &Bound<'_, PyAny>,
        python: Py<PyAny>,
        tensor_type: Py<PyType>,
    ) -> PyResult<StrictDispatch> {
        Ok(StrictDispatch {
            mode: ModeRef::new(mode)?,
            python,
            tensor_type,
            known: Mutex::new(Known { generation: 0, entries: HashMap::new() }),
        })
    }

    /// The mode this handler is bound to (PyTorch checks it).
    #[getter(__self__)]
    fn self_(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self.mode.as_self(py))
    }

    /// Records how calls of `func` go: `None` (no kernel binds it), `"python"` (the Python
    /// handler takes them), or `(key, [(tensor_slots, static_slots, absent), ...])` with
    /// `tensor_slots`/`absent` as `[(name, position)]` and `static_slots` as
    /// `[(name, position, default, is_dtype)]`.
    fn learn(&self, py: Python<'_>, func: Py<PyAny>, plan: &Bound<'_, PyAny>) -> PyResult<()> {
        let entry = if plan.is_none() {
            Entry::Passthrough
        } else if plan.extract::<String>().is_ok_and(|s| s == "python") {
            Entry::Python
        } else {
            let (key, variants): (String, Vec<Bound<'_, PyAny>>) = plan.extract()?;
            let mut parsed = Vec::with_capacity(variants.len());
            for v in variants {
                let (tensors, statics, absent): VariantSpec<'_> = v.extract()?;
                parsed.push(Variant {
                    tensors: slots(py, &tensors)?,
                    statics: statics
                        .into_iter()
                        .map(|(name, position, default, is_dtype)| StaticSlot {
                            key: PyString::intern(py, &name).unbind(),
                            name: crate::intern::intern(&name),
                            position,
                            default,
                            is_dtype,
                        })
                        .collect(),
                    absent: slots(py, &absent)?,
                });
            }
            Entry::Fast(Arc::new(Plan { key, variants: parsed }))
        };
        let generation = runtime(py)?.dispatcher.registry().generation();
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if known.generation != generation {
            known.generation = generation;
            known.entries.clear();
        }
        let address = func.as_ptr() as usize;
        known.entries.insert(address, (func, entry));
        Ok(())
    }

    #[pyo3(signature = (func, types, args=None, kwargs=None))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        func: &Bound<'py, PyAny>,
        types: &Bound<'py, PyAny>,
        args: Option<&Bound<'py, PyTuple>>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (args, kwargs) = call_args(py, args, kwargs);
        let args = &args;
        match self.entry(py, func) {
            Some(Entry::Passthrough) => func.call(args, kwargs),
            Some(Entry::Fast(plan)) => match self.run(py, &plan, func, args, kwargs)? {
                Some(out) => Ok(out),
                None => self.python.bind(py).call1((func, types, args, kwargs)),
            },
            Some(Entry::Python) | None => self.python.bind(py).call1((func, types, args, kwargs)),
        }
    }
}
