//! The hot path of `substitute("fused")` on CPU tensors: the mode's `__torch_dispatch__`, in Rust.
//!
//! [`FusedDispatch`] is installed as the fused mode's bound `__torch_dispatch__`, as
//! [`crate::strict_mode::StrictDispatch`] is for strict mode. It records the calls that make up
//! most of a trace: a functional op that programs lower (no view, no in-place write, no random
//! numbers), on CPU tensors that are recorded values or inputs already known to the trace (or new
//! ones the Python side registers), with static arguments of plain types, whose output types
//! the handler has seen before. For those it does what the Python handler does: placeholder
//! outputs, the node in `mode.nodes` with its arguments as `FusedRef` / `FusedInput`, the
//! placeholders in `mode.produced` and `mode.pending_storages`, and the node's part of the
//! trace key (the same key the Python side's `_key_of` computes) folded into `mode.hash`.
//!
//! Every other call, and any call where something is out of the ordinary (a view of a pending
//! value, a lifted float, an argument type it does not know, output types it has not seen), goes
//! to the Python handler before anything is recorded, so the Python side stays the one
//! definition of what fused mode does: this is a faster way to the same trace.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyDict, PyFloat, PyInt, PyList, PySet, PyString, PyTuple, PyType, PyWeakrefReference,
};

use crate::mode_handler::{ModeRef, call_args};
use crate::torch_bridge::runtime;

/// Output-type entries kept (cleared when full, as the Python side's cache is).
const TYPES_CACHE_SIZE: usize = 65536;

/// A recorded value: output `out` of node `node` of the trace.
#[pyclass(module = "tpu_kernels._native.torch_bridge", frozen, eq, hash)]
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FusedRef {
    #[pyo3(get)]
    node: usize,
    #[pyo3(get)]
    out: usize,
}

#[pymethods]
impl FusedRef {
    #[new]
    fn new(node: usize, out: usize) -> FusedRef {
        FusedRef { node, out }
    }

    fn __repr__(&self) -> String {
        format!("FusedRef({}, {})", self.node, self.out)
    }
}

/// A program input: the trace's `index`-th input tensor.
#[pyclass(module = "tpu_kernels._native.torch_bridge", frozen, eq, hash)]
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FusedInput {
    #[pyo3(get)]
    index: usize,
}

#[pymethods]
impl FusedInput {
    #[new]
    fn new(index: usize) -> FusedInput {
        FusedInput { index }
    }

    fn __repr__(&self) -> String {
        format!("FusedInput({})", self.index)
    }
}

/// One output of an op: its placeholder's shape and `torch.empty`'s keyword arguments.
#[derive(Debug)]
struct Output {
    shape: Py<PyTuple>,
    dtype: Py<PyAny>,
    empty_kwargs: Py<PyDict>,
}

/// The output types of one op on one signature of arguments (`FusedMode._output_types`).
#[derive(Debug)]
struct Types {
    /// `None` for an output the call did not ask for.
    outs: Vec<Option<Output>>,
    shorts: Py<PyTuple>,
    single: bool,
    /// Every output is zero-dim.
    scalar: bool,
}

/// How calls of an op overload go.
#[derive(Debug)]
enum Plan {
    /// The Python handler takes them.
    Python,
    /// A functional op programs lower (its key).
    Plain(Py<PyString>),
    /// An in-place op, recorded as its functional op (that op's key, and the op).
    InPlace(Py<PyString>, Py<PyAny>),
    /// A view op (its key); whether graphs lower it.
    View(Py<PyString>, bool),
    /// An op programs do not lower, run at once unless it reads a pending value; `true`: one
    /// that reads only metadata, run at once always.
    Run(bool),
}

impl Plan {
    fn clone_ref(&self, py: Python<'_>) -> Plan {
        match self {
            Plan::Python => Plan::Python,
            Plan::Plain(k) => Plan::Plain(k.clone_ref(py)),
            Plan::InPlace(k, f) => Plan::InPlace(k.clone_ref(py), f.clone_ref(py)),
            Plan::View(k, l) => Plan::View(k.clone_ref(py), *l),
            Plan::Run(m) => Plan::Run(*m),
        }
    }
}

/// What the handlers know, per op overload (keyed by the `OpOverload`'s address, which the
/// entry keeps alive) and per signature, under one registry generation: shared by every fused
/// mode of the process, so a mode entered for each step learns nothing again.
#[derive(Debug, Default)]
struct Known {
    generation: usize,
    ops: HashMap<usize, (Py<PyAny>, Plan)>,
    types: HashMap<Vec<u64>, Arc<Types>>,
}

static KNOWN: LazyLock<Mutex<Known>> = LazyLock::new(Mutex::default);

/// The handlers' shared knowledge, dropped when the registry changed (what lowers changes).
fn known(py: Python<'_>) -> MutexGuard<'static, Known> {
    let generation = runtime(py).map_or(0, |rt| rt.dispatcher.registry().generation());
    let mut known = KNOWN.lock().unwrap_or_else(PoisonError::into_inner);
    if known.generation != generation {
        known.generation = generation;
        let old = (std::mem::take(&mut known.ops), std::mem::take(&mut known.types));
        // Dropped with the lock released: a Python object's deallocation may run Python code.
        drop(known);
        drop(old);
        known = KNOWN.lock().unwrap_or_else(PoisonError::into_inner);
    }
    known
}

/// Python objects the handler uses on every call.
#[derive(Debug)]
struct Kit {
    tensor: Py<PyType>,
    dtype: Py<PyType>,
    layout: Py<PyType>,
    memory_format: Py<PyType>,
    device: Py<PyType>,
    empty: Py<PyAny>,
    /// `torch._C.TensorBase.data_ptr`, which fused mode's patch of `Tensor.data_ptr` leaves.
    data_ptr: Py<PyAny>,
    /// The process-wide trace cache (`fused.TRACES`): its `lifted_ops`.
    traces: Py<PyAny>,
    /// The dtypes programs take, to their short names (`graph.DTYPES`).
    dtypes: Py<PyDict>,
    /// `fused._Lifted`, and the result types a float is lifted for (`_LIFTABLE_DTYPES`).
    lifted_class: Py<PyAny>,
    liftable: Py<PyAny>,
    /// A lifted float's part of the trace key: `("lifted",)`.
    lifted_key: Py<PyTuple>,
    r: Py<PyString>,
    i: Py<PyString>,
    b: Py<PyString>,
}

/// The bound `__torch_dispatch__` of a fused substitution mode.
#[pyclass(module = "tpu_kernels._native.torch_bridge", frozen)]
#[derive(Debug)]
pub struct FusedDispatch {
    mode: ModeRef,
    /// The Python side's plan of an op not seen yet (`planner(mode, func)`, see `learn`), and
    /// its handler, which takes the calls this path does not.
    planner: Py<PyAny>,
    python: Py<PyAny>,
    kit: Kit,
    /// Calls recorded here, and calls handed to the Python handler, since the last `take`.
    recorded: AtomicU64,
    handed: AtomicU64,
}

/// A tensor argument of a call: its recorded value, its input index, or a tensor the trace has
/// not seen.
enum Seen {
    Ref(usize, usize),
    /// Its input index and the storage address it was registered with.
    Input(usize, usize),
    New,
}

/// A call's argument as this path records it.
enum ArgKind<'py> {
    Tensor(Bound<'py, PyAny>),
    Tensors(Vec<Bound<'py, PyAny>>),
    Static(Bound<'py, PyAny>),
}

/// What a call is made of, worked out before anything is recorded.
struct Call<'py> {
    args: Vec<ArgKind<'py>>,
    kwargs: Vec<(Bound<'py, PyString>, Bound<'py, PyAny>)>,
    tensors: Vec<(Bound<'py, PyAny>, Seen)>,
    signature: Vec<u64>,
    /// Float arguments at positions the trace cache lifts into program inputs (`TRACES.lifted`):
    /// argument indices, and keyword argument indices in `kwargs`.
    lifted_args: Vec<usize>,
    lifted_kwargs: Vec<usize>,
}

fn encode_str(s: &str, out: &mut Vec<u64>) {
    out.push(s.len() as u64);
    for chunk in s.as_bytes().chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        out.push(u64::from_le_bytes(word));
    }
}

impl FusedDispatch {
    /// Appends a static argument's encoding to `sig`; false for a type this path does not take.
    fn static_signature(&self, py: Python<'_>, x: &Bound<'_, PyAny>, sig: &mut Vec<u64>) -> bool {
        if x.is_none() {
            sig.push(5);
        } else if let Ok(b) = x.cast::<PyBool>() {
            sig.extend([2, u64::from(b.is_true())]);
        } else if let Ok(i) = x.cast::<PyInt>() {
            let Ok(v) = i.extract::<i64>() else { return false };
            sig.extend([3, v as u64]);
        } else if let Ok(f) = x.cast::<PyFloat>() {
            sig.extend([4, f.value().to_bits()]);
        } else if let Ok(s) = x.cast::<PyString>() {
            let Ok(s) = s.to_str() else { return false };
            sig.push(6);
            encode_str(s, sig);
        } else if x.is_instance(self.kit.dtype.bind(py)).unwrap_or(false)
            || x.is_instance(self.kit.layout.bind(py)).unwrap_or(false)
            || x.is_instance(self.kit.memory_format.bind(py)).unwrap_or(false)
        {
            // Singletons, kept alive by torch.
            sig.extend([7, x.as_ptr() as u64]);
        } else if let Ok(l) = x.cast::<PyList>() {
            sig.extend([8, l.len() as u64]);
            for v in l.iter() {
                if !self.static_signature(py, &v, sig) {
                    return false;
                }
            }
        } else if let Ok(t) = x.cast::<PyTuple>() {
            sig.extend([9, t.len() as u64]);
            for v in t.iter() {
                if !self.static_signature(py, &v, sig) {
                    return false;
                }
            }
        } else {
            return false;
        }
        true
    }

    /// A tensor argument's part of the signature (dtype and shape, as the Python side's
    /// output-type key), or `None` when it is not a CPU tensor.
    fn tensor_signature(
        &self,
        py: Python<'_>,
        t: &Bound<'_, PyAny>,
        sig: &mut Vec<u64>,
    ) -> PyResult<bool> {
        if !t.getattr(pyo3::intern!(py, "is_cpu"))?.is_truthy()? {
            return Ok(false);
        }
        let dtype = t.getattr(pyo3::intern!(py, "dtype"))?;
        let shape = t.getattr(pyo3::intern!(py, "shape"))?;
        let shape = shape.cast::<PyTuple>()?;
        sig.extend([1, dtype.as_ptr() as u64, shape.len() as u64]);
        for d in shape.iter() {
            sig.push(d.extract::<i64>()? as u64);
        }
        Ok(true)
    }

    /// The recorded value `t` is (`mode.produced`), or its input index (`mode.input_ids`).
    fn seen(
        produced: &Bound<'_, PyDict>,
        input_ids: &Bound<'_, PyDict>,
        t: &Bound<'_, PyAny>,
    ) -> PyResult<Seen> {
        let py = t.py();
        let id = (t.as_ptr() as usize).into_pyobject(py)?;
        if !produced.is_empty()
            && let Some(hit) = produced.get_item(&id)?
        {
            let hit = hit.cast::<PyTuple>()?;
            let w = hit.get_item(2)?;
            if refers_to(&w, t)? {
                return Ok(Seen::Ref(hit.get_item(0)?.extract()?, hit.get_item(1)?.extract()?));
            }
        }
        if let Some(hit) = input_ids.get_item(&id)? {
            let hit = hit.cast::<PyTuple>()?;
            if hit.get_item(1)?.is(t) {
                return Ok(Seen::Input(hit.get_item(0)?.extract()?, hit.get_item(2)?.extract()?));
            }
        }
        Ok(Seen::New)
    }

    /// Whether `x`, at argument `position` of `op`, is a float the trace lifts (`_lifted_at`).
    fn lifted_at(
        &self,
        py: Python<'_>,
        op: &Bound<'_, PyString>,
        position: &Bound<'_, PyAny>,
        x: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        if !x.is_exact_instance_of::<PyFloat>() {
            return Ok(false);
        }
        let at = (op, position).into_pyobject(py)?;
        let traces = self.kit.traces.bind(py);
        Ok(traces.getattr(pyo3::intern!(py, "lifted"))?.contains(&at)?
            && !traces.getattr(pyo3::intern!(py, "not_liftable"))?.contains(&at)?)
    }

    /// The call's arguments and signature, or `None` when this path does not take it. `op`: the
    /// recorded op's key, when its float arguments may be lifted.
    fn inspect<'py>(
        &self,
        d: Dispatched<'_, 'py>,
        op: Option<&Bound<'py, PyString>>,
    ) -> PyResult<Option<Call<'py>>> {
        let Dispatched { py, mode, func, args, kwargs } = d;
        let lifting = match op {
            Some(op) => self.lifted(py, op)?,
            None => false,
        };
        let tensor = self.kit.tensor.bind(py);
        let produced = mode.getattr(pyo3::intern!(py, "produced"))?;
        let produced = produced.cast::<PyDict>()?;
        let input_ids = mode.getattr(pyo3::intern!(py, "input_ids"))?;
        let input_ids = input_ids.cast::<PyDict>()?;
        let mut call = Call {
            args: Vec::with_capacity(args.len()),
            kwargs: Vec::new(),
            tensors: Vec::with_capacity(4),
            signature: Vec::with_capacity(32),
            lifted_args: Vec::new(),
            lifted_kwargs: Vec::new(),
        };
        call.signature.push(func.as_ptr() as u64);
        for (position, a) in args.iter().enumerate() {
            if a.is_instance(tensor)? {
                if !self.tensor_signature(py, &a, &mut call.signature)? {
                    return Ok(None);
                }
                call.tensors.push((a.clone(), Self::seen(produced, input_ids, &a)?));
                call.args.push(ArgKind::Tensor(a));
                continue;
            }
            let items: Option<Vec<Bound<'py, PyAny>>> = if let Ok(l) = a.cast::<PyList>() {
                Some(l.iter().collect())
            } else if let Ok(t) = a.cast::<PyTuple>() {
                Some(t.iter().collect())
            } else {
                None
            };
            if let Some(items) = items
                && !items.is_empty()
                && items[0].is_instance(tensor)?
            {
                // A list of tensors (`cat`'s): every item a tensor, kept as a list.
                if a.cast::<PyList>().is_err() {
                    return Ok(None);
                }
                call.signature.extend([10, items.len() as u64]);
                for t in &items {
                    if !t.is_instance(tensor)?
                        || !self.tensor_signature(py, t, &mut call.signature)?
                    {
                        return Ok(None);
                    }
                    call.tensors.push((t.clone(), Self::seen(produced, input_ids, t)?));
                }
                call.args.push(ArgKind::Tensors(items));
                continue;
            }
            if let Some(op) = op
                && lifting
                && self.lifted_at(py, op, &position.into_pyobject(py)?.into_any(), &a)?
            {
                // Its value is no part of the output types (`_LIFTED_KEY`).
                call.signature.push(12);
                call.lifted_args.push(position);
            } else if !self.static_signature(py, &a, &mut call.signature) {
                return Ok(None);
            }
            call.args.push(ArgKind::Static(a));
        }
        if let Some(kwargs) = kwargs {
            for (k, v) in kwargs.iter() {
                let k = k.cast_into::<PyString>()?;
                let name = k.to_str()?;
                call.signature.push(11);
                encode_str(name, &mut call.signature);
                if v.is_instance(tensor)? {
                    return Ok(None);
                }
                if name == "device" && !v.is_none() {
                    // The CPU (a factory op's placeholders are CPU tensors); a copy to another
                    // device is the Python side's.
                    let cpu = match v.cast::<PyString>() {
                        Ok(s) => s.to_str()? == "cpu",
                        Err(_) => {
                            v.is_instance(self.kit.device.bind(py))?
                                && v.getattr(pyo3::intern!(py, "type"))?.eq("cpu")?
                                && v.getattr(pyo3::intern!(py, "index"))?.is_none()
                        }
                    };
                    if !cpu {
                        return Ok(None);
                    }
                    call.signature.push(13);
                    call.kwargs.push((k, v));
                    continue;
                }
                if let Some(op) = op
                    && lifting
                    && self.lifted_at(py, op, k.as_any(), &v)?
                {
                    call.signature.push(12);
                    call.lifted_kwargs.push(call.kwargs.len());
                } else if !self.static_signature(py, &v, &mut call.signature) {
                    return Ok(None);
                }
                call.kwargs.push((k, v));
            }
        }
        Ok(Some(call))
    }

    /// The output types of `func` (the call's op, or the functional op it is recorded as) on
    /// the call's arguments, learned from the Python side once per signature; `None` when the
    /// op's meta function gives none the program takes.
    fn types(
        &self,
        d: Dispatched<'_, '_>,
        func: &Bound<'_, PyAny>,
        signature: Vec<u64>,
    ) -> PyResult<Option<Arc<Types>>> {
        let Dispatched { py, mode, args, kwargs, .. } = d;
        if let Some(t) = known(py).types.get(&signature) {
            return Ok(Some(t.clone()));
        }
        let empty = PyDict::new(py);
        let found = mode.call_method1(
            pyo3::intern!(py, "_output_types"),
            (func, args, kwargs.unwrap_or(&empty)),
        )?;
        if found.is_none() {
            return Ok(None);
        }
        let found = found.cast::<PyTuple>()?;
        let typed = found.get_item(0)?;
        let present = found.get_item(3)?;
        let mut outs = Vec::new();
        let mut scalar = true;
        for (ty, here) in typed.try_iter()?.zip(present.try_iter()?) {
            let (shape, dtype): (Bound<'_, PyTuple>, Bound<'_, PyAny>) = ty?.extract()?;
            scalar &= shape.is_empty();
            if !here?.is_truthy()? {
                outs.push(None);
                continue;
            }
            let kw = PyDict::new(py);
            kw.set_item(pyo3::intern!(py, "dtype"), &dtype)?;
            kw.set_item(pyo3::intern!(py, "device"), pyo3::intern!(py, "cpu"))?;
            outs.push(Some(Output {
                shape: shape.unbind(),
                dtype: dtype.unbind(),
                empty_kwargs: kw.unbind(),
            }));
        }
        let types = Arc::new(Types {
            outs,
            shorts: found.get_item(1)?.cast_into::<PyTuple>()?.unbind(),
            single: found.get_item(2)?.is_truthy()?,
            scalar,
        });
        let mut known = known(py);
        if known.types.len() >= TYPES_CACHE_SIZE {
            known.types.clear();
        }
        known.types.insert(signature, types.clone());
        Ok(Some(types))
    }

    /// A static argument's part of the trace key, as the Python side's `_node_key` spells it.
    fn static_key<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(b) = x.cast::<PyBool>() {
            return Ok(PyTuple::new(
                py,
                [self.kit.b.bind(py).clone().into_any(), b.clone().into_any()],
            )?
            .into_any());
        }
        if let Ok(f) = x.cast::<PyFloat>() {
            let v = f.value();
            if v.is_nan() || v == 0.0 {
                let hex = f.call_method0(pyo3::intern!(py, "hex"))?;
                return Ok(PyTuple::new(py, [PyString::new(py, "f").into_any(), hex])?.into_any());
            }
            return Ok(x.clone());
        }
        if let Ok(l) = x.cast::<PyList>() {
            let items = l.iter().map(|v| self.static_key(py, &v)).collect::<PyResult<Vec<_>>>()?;
            return Ok(PyTuple::new(py, items)?.into_any());
        }
        if let Ok(t) = x.cast::<PyTuple>() {
            let items = t.iter().map(|v| self.static_key(py, &v)).collect::<PyResult<Vec<_>>>()?;
            return Ok(PyTuple::new(py, items)?.into_any());
        }
        Ok(x.clone())
    }

    /// Records node `func` over the call's arguments with outputs `outs` (every check passed):
    /// the node in `mode.nodes`, its outputs in `mode.produced` (and, unless it is a view, their
    /// memory in `mode.pending_storages`), its key folded into the trace's.
    #[allow(clippy::too_many_arguments)]
    fn record_node<'py>(
        &self,
        py: Python<'py>,
        mode: &Bound<'py, PyAny>,
        op: &Bound<'py, PyString>,
        func: &Bound<'py, PyAny>,
        call: &Call<'py>,
        outs: &[Option<Bound<'py, PyAny>>],
        shorts: Bound<'py, PyAny>,
        alias: bool,
        fresh: bool,
    ) -> PyResult<()> {
        // The arguments as recorded values and inputs (new inputs registered by the Python side).
        let mut refs: HashMap<usize, (Bound<'py, PyAny>, Bound<'py, PyAny>)> = HashMap::new();
        for (t, seen) in &call.tensors {
            let address = t.as_ptr() as usize;
            if refs.contains_key(&address) {
                continue;
            }
            let (arg, key) = match *seen {
                Seen::Ref(node, out) => (
                    Bound::new(py, FusedRef { node, out })?.into_any(),
                    PyTuple::new(
                        py,
                        [
                            self.kit.r.bind(py).clone().into_any(),
                            node.into_pyobject(py)?.into_any(),
                            out.into_pyobject(py)?.into_any(),
                        ],
                    )?
                    .into_any(),
                ),
                Seen::Input(index, _) => {
                    (Bound::new(py, FusedInput { index })?.into_any(), self.input_key(py, index)?)
                }
                Seen::New => {
                    let arg = mode.call_method1(pyo3::intern!(py, "_input_ref"), (t,))?;
                    let index: usize = arg.getattr(pyo3::intern!(py, "index"))?.extract()?;
                    (arg, self.input_key(py, index)?)
                }
            };
            refs.insert(address, (arg, key));
        }
        // Lifted floats become program inputs when the op's result type takes them (`_lift`).
        let lift_dtype = if call.lifted_args.is_empty() && call.lifted_kwargs.is_empty() {
            None
        } else {
            let first = shorts.cast::<PyTuple>()?.get_item(0)?;
            let first = first.cast::<PyString>()?.to_str()?.to_owned();
            let dtype = first.split('[').next().unwrap_or_default().to_owned();
            self.kit.liftable.bind(py).contains(&dtype)?.then_some(dtype)
        };
        let lifted_list = mode.getattr(pyo3::intern!(py, "lifted"))?;
        let lift = |position: Bound<'py, PyAny>,
                    x: &Bound<'py, PyAny>,
                    dtype: &str|
         -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
            let lifted_list = lifted_list.cast::<PyList>()?;
            let pos = PyTuple::new(py, [op.clone().into_any(), position])?;
            let arg = self.kit.lifted_class.bind(py).call1((lifted_list.len(), x, dtype, pos))?;
            lifted_list.append(&arg)?;
            Ok((arg, self.kit.lifted_key.bind(py).clone().into_any()))
        };
        let lookup = |t: &Bound<'py, PyAny>| {
            refs.get(&(t.as_ptr() as usize)).ok_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err("a tensor argument not mapped")
            })
        };
        let mut rargs = Vec::with_capacity(call.args.len());
        let mut arg_keys = Vec::with_capacity(call.args.len());
        for (position, a) in call.args.iter().enumerate() {
            match a {
                ArgKind::Static(x)
                    if lift_dtype.is_some() && call.lifted_args.contains(&position) =>
                {
                    let (arg, key) = lift(
                        position.into_pyobject(py)?.into_any(),
                        x,
                        lift_dtype.as_deref().unwrap_or_default(),
                    )?;
                    rargs.push(arg);
                    arg_keys.push(key);
                }
                ArgKind::Tensor(t) => {
                    let (arg, key) = lookup(t)?;
                    rargs.push(arg.clone());
                    arg_keys.push(key.clone());
                }
                ArgKind::Tensors(ts) => {
                    let mapped = ts.iter().map(lookup).collect::<PyResult<Vec<_>>>()?;
                    rargs.push(PyList::new(py, mapped.iter().map(|m| m.0.clone()))?.into_any());
                    arg_keys.push(PyTuple::new(py, mapped.iter().map(|m| m.1.clone()))?.into_any());
                }
                ArgKind::Static(x) => {
                    rargs.push(copy_list(x)?);
                    arg_keys.push(self.static_key(py, x)?);
                }
            }
        }
        let rkwargs = PyDict::new(py);
        let mut kwarg_keys = Vec::with_capacity(call.kwargs.len());
        for (i, (k, v)) in call.kwargs.iter().enumerate() {
            let (arg, key) = match &lift_dtype {
                Some(dtype) if call.lifted_kwargs.contains(&i) => {
                    lift(k.clone().into_any(), v, dtype)?
                }
                _ => (copy_list(v)?, self.static_key(py, v)?),
            };
            rkwargs.set_item(k, arg)?;
            let kv = PyTuple::new(py, [k.clone().into_any(), key])?;
            kwarg_keys.push((k.to_str()?.to_owned(), kv));
        }
        kwarg_keys.sort_by(|a, b| a.0.cmp(&b.0));
        let nodes = mode.getattr(pyo3::intern!(py, "nodes"))?;
        let nodes = nodes.cast::<PyList>()?;
        let index = nodes.len();
        let produced = mode.getattr(pyo3::intern!(py, "produced"))?;
        let produced = produced.cast::<PyDict>()?;
        let pending = mode.getattr(pyo3::intern!(py, "pending_storages"))?;
        let pending = pending.cast::<PyDict>()?;
        let mut weak = Vec::with_capacity(outs.len());
        for (i, o) in outs.iter().enumerate() {
            let Some(o) = o else {
                weak.push(py.None().into_bound(py));
                continue;
            };
            let w = PyWeakrefReference::new(o)?.into_any();
            let at = (index.into_pyobject(py)?, i.into_pyobject(py)?);
            produced.set_item(o.as_ptr() as usize, (&at.0, &at.1, &w))?;
            if alias {
                // A view shares its base's memory: never a program output of its own.
                weak.push(py.None().into_bound(py));
                continue;
            }
            let storage: usize = if fresh {
                // A fresh placeholder's data starts its storage.
                self.kit.data_ptr.bind(py).call1((o,))?.extract()?
            } else {
                storage_of(o)
            };
            if storage != 0 {
                pending.set_item(storage, (&w, (&at.0, &at.1)))?;
            }
            weak.push(w);
        }
        let alias_flag = PyBool::new(py, alias).to_owned().into_any();
        let node = PyTuple::new(
            py,
            [
                func.clone(),
                PyTuple::new(py, rargs)?.into_any(),
                rkwargs.into_any(),
                PyList::new(py, weak)?.into_any(),
                shorts,
                alias_flag.clone(),
            ],
        )?;
        nodes.append(node)?;
        if mode.getattr(pyo3::intern!(py, "keyable"))?.is_truthy()? {
            let kwargs_key = if kwarg_keys.is_empty() {
                PyTuple::empty(py)
            } else {
                PyTuple::new(py, kwarg_keys.into_iter().map(|(_, kv)| kv))?
            };
            let key = PyTuple::new(
                py,
                [
                    func.clone(),
                    PyTuple::new(py, arg_keys)?.into_any(),
                    kwargs_key.into_any(),
                    alias_flag,
                ],
            )?;
            let node_keys = mode.getattr(pyo3::intern!(py, "node_keys"))?;
            node_keys.cast::<PyList>()?.append(&key)?;
            let hash = (mode.getattr(pyo3::intern!(py, "hash"))?, key).into_pyobject(py)?.hash()?;
            mode.setattr(pyo3::intern!(py, "hash"), hash)?;
        }
        self.recorded.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn input_key<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Bound<'py, PyAny>> {
        Ok(PyTuple::new(
            py,
            [self.kit.i.bind(py).clone().into_any(), index.into_pyobject(py)?.into_any()],
        )?
        .into_any())
    }

    /// The checks a call makes before it is recorded here (as `FusedMode._dispatch` makes
    /// them): no argument a view of a pending value, and not bookkeeping on zero-dim values.
    fn common_checks(
        &self,
        py: Python<'_>,
        mode: &Bound<'_, PyAny>,
        call: &Call<'_>,
    ) -> PyResult<Checked> {
        let pending = mode.getattr(pyo3::intern!(py, "pending_storages"))?;
        let pending = pending.cast::<PyDict>()?;
        if !pending.is_empty() {
            for (t, seen) in &call.tensors {
                let aliases = match seen {
                    Seen::Ref(..) => false,
                    // Its memory, as registered: a pending value there (a view of an input
                    // written in place since) is the Python side's to look at.
                    Seen::Input(_, storage) => pending.contains(*storage)?,
                    Seen::New => mode
                        .call_method1(pyo3::intern!(py, "_pending_storage"), (t,))?
                        .is_truthy()?,
                };
                if aliases {
                    return Ok(Checked::Python);
                }
            }
        }
        let pending_any = call.tensors.iter().any(|(_, s)| matches!(s, Seen::Ref(..)));
        if !pending_any && !call.tensors.is_empty() {
            // Bookkeeping on zero-dim tensors that hold their values (an optimizer's step
            // count): run at once, the trace going on.
            let mut all_scalars = true;
            for (t, _) in &call.tensors {
                if t.getattr(pyo3::intern!(py, "ndim"))?.extract::<usize>()? != 0 {
                    all_scalars = false;
                    break;
                }
            }
            if all_scalars {
                return Ok(Checked::Scalars);
            }
        }
        Ok(Checked::Record(pending_any))
    }

    /// Whether a float argument of `op` may be lifted into a program input (the Python side
    /// records those).
    fn lifted(&self, py: Python<'_>, op: &Bound<'_, PyString>) -> PyResult<bool> {
        let lifted = self.kit.traces.bind(py).getattr(pyo3::intern!(py, "lifted_ops"))?;
        let lifted = lifted.cast::<PySet>()?;
        Ok(!lifted.is_empty() && lifted.contains(op)?)
    }

    /// A functional op recorded with fresh placeholders as outputs.
    fn plain<'py>(&self, d: Dispatched<'_, 'py>, op: &Bound<'py, PyString>) -> Outcome<'py> {
        let Dispatched { py, mode, func, args, kwargs } = d;
        let Some(mut call) = self.inspect(d, Some(op))? else {
            return Ok(None);
        };
        let pending_any = match self.common_checks(py, mode, &call)? {
            Checked::Record(pending_any) => pending_any,
            Checked::Scalars => return user_call(func, args, kwargs).map(Some),
            Checked::Python => return Ok(None),
        };
        let signature = std::mem::take(&mut call.signature);
        let Some(types) = self.types(d, func, signature)? else {
            return Ok(None);
        };
        if types.outs.is_empty() || types.scalar && !pending_any && !call.tensors.is_empty() {
            // A scalar of values that hold their memory (`attention_mask.all()`) runs now, as
            // the Python side runs it, so the read that follows ends no trace.
            return Ok(None);
        }
        let empty = self.kit.empty.bind(py);
        let mut outs: Vec<Option<Bound<'py, PyAny>>> = Vec::with_capacity(types.outs.len());
        for o in &types.outs {
            outs.push(match o {
                Some(o) => Some(empty.call((o.shape.bind(py),), Some(o.empty_kwargs.bind(py)))?),
                None => None,
            });
        }
        self.record_node(
            py,
            mode,
            op,
            func,
            &call,
            &outs,
            types.shorts.bind(py).clone().into_any(),
            false,
            true,
        )?;
        let mut outs = outs.into_iter().map(|o| o.unwrap_or_else(|| py.None().into_bound(py)));
        if types.single {
            return Ok(outs.next());
        }
        Ok(Some(PyTuple::new(py, outs)?.into_any()))
    }

    /// An in-place op recorded as its functional op `functional`, whose result the written
    /// tensor then stands for (`FusedMode._record_in_place`).
    fn in_place<'py>(
        &self,
        d: Dispatched<'_, 'py>,
        op: &Bound<'py, PyString>,
        functional: &Bound<'py, PyAny>,
    ) -> Outcome<'py> {
        let Dispatched { py, mode, func, args, kwargs } = d;
        let Some(mut call) = self.inspect(d, Some(op))? else {
            return Ok(None);
        };
        let Some(ArgKind::Tensor(target)) = call.args.first() else {
            return Ok(None);
        };
        let target = target.clone();
        match self.common_checks(py, mode, &call)? {
            Checked::Record(_) => {}
            Checked::Scalars => {
                // A write into memory a recorded op reads waits for the trace (the Python side
                // runs it after the flush).
                let nodes = mode.getattr(pyo3::intern!(py, "nodes"))?;
                if !nodes.cast::<PyList>()?.is_empty() {
                    let inputs = mode.getattr(pyo3::intern!(py, "input_storages"))?;
                    for (t, _) in &call.tensors {
                        if inputs.contains(storage_of(t))? {
                            return Ok(None);
                        }
                    }
                }
                return user_call(func, args, kwargs).map(Some);
            }
            Checked::Python => return Ok(None),
        }
        // Whether a recorded op may stand for the target's new value (`_writable`).
        let seen = &call.tensors[0].1;
        if let Seen::Ref(node, out) = *seen {
            let pinned = mode.getattr(pyo3::intern!(py, "pinned"))?;
            if let Some(hit) = pinned.cast::<PyDict>()?.get_item(target.as_ptr() as usize)? {
                let w = hit.cast::<PyTuple>()?.get_item(0)?;
                if refers_to(&w, &target)? {
                    return Ok(None);
                }
            }
            let nodes = mode.getattr(pyo3::intern!(py, "nodes"))?;
            let refs = nodes.get_item(node)?.get_item(3)?;
            if refs.get_item(out)?.is_none() {
                return Ok(None);
            }
        } else {
            let dtype = target.getattr(pyo3::intern!(py, "dtype"))?;
            if !self.kit.dtypes.bind(py).contains(dtype)?
                || !target.call_method0(pyo3::intern!(py, "is_contiguous"))?.is_truthy()?
            {
                return Ok(None);
            }
        }
        let signature = std::mem::take(&mut call.signature);
        let Some(types) = self.types(d, functional, signature)? else {
            return Ok(None);
        };
        let [Some(o)] = types.outs.as_slice() else {
            return Ok(None);
        };
        if !o.shape.bind(py).eq(target.getattr(pyo3::intern!(py, "shape"))?)?
            || !o.dtype.bind(py).is(&target.getattr(pyo3::intern!(py, "dtype"))?)
        {
            return Ok(None);
        }
        // `_retire`: its old value is no program output any more, or (memory it held before the
        // trace) its new value is written back at the flush.
        if let Seen::Ref(node, out) = *seen {
            let nodes = mode.getattr(pyo3::intern!(py, "nodes"))?;
            nodes.get_item(node)?.get_item(3)?.set_item(out, py.None())?;
        } else {
            let write_back = mode.getattr(pyo3::intern!(py, "write_back"))?;
            write_back.set_item(target.as_ptr() as usize, &target)?;
        }
        let outs = [Some(target.clone())];
        self.record_node(
            py,
            mode,
            op,
            functional,
            &call,
            &outs,
            types.shorts.bind(py).clone().into_any(),
            false,
            false,
        )?;
        Ok(Some(target))
    }

    /// A view op: run at once (it reads only metadata); over a recorded value it is also
    /// recorded, as an alias, and its output kept as a view of that value's memory (the view
    /// branch of `FusedMode._dispatch`).
    fn view<'py>(
        &self,
        d: Dispatched<'_, 'py>,
        op: &Bound<'py, PyString>,
        lowered: bool,
    ) -> Outcome<'py> {
        let Dispatched { py, mode, func, args, kwargs } = d;
        let Some(call) = self.inspect(d, None)? else {
            return Ok(None);
        };
        if !call.tensors.iter().any(|(_, s)| matches!(s, Seen::Ref(..))) {
            return user_call(func, args, kwargs).map(Some);
        }
        if lowered && self.lifted(py, op)? {
            return Ok(None);
        }
        let view_roots = mode.getattr(pyo3::intern!(py, "view_roots"))?;
        let view_roots = view_roots.cast::<PyDict>()?;
        let pinned = mode.getattr(pyo3::intern!(py, "pinned"))?;
        let geometry = mode.getattr(pyo3::intern!(py, "geometry"))?;
        let nodes = mode.getattr(pyo3::intern!(py, "nodes"))?;
        let mut root: Option<Bound<'py, PyAny>> = None;
        for (t, seen) in &call.tensors {
            let Seen::Ref(node, out) = *seen else { continue };
            // `_root`: the value whose memory `t` is.
            let id = t.as_ptr() as usize;
            let mut r = None;
            if let Some(hit) = view_roots.get_item(id)? {
                let hit = hit.cast::<PyTuple>()?;
                if refers_to(&hit.get_item(0)?, t)? {
                    r = Some(hit.get_item(1)?);
                }
            }
            if r.is_none() && !nodes.get_item(node)?.get_item(5)?.is_truthy()? {
                r = Some((node, out).into_pyobject(py)?.into_any());
            }
            let Some(r) = r else { continue };
            pinned.set_item(id, (PyWeakrefReference::new(t)?, &r))?;
            if !geometry.contains(&r)? {
                let g = (
                    PyTuple::new(
                        py,
                        t.getattr(pyo3::intern!(py, "shape"))?
                            .try_iter()?
                            .collect::<PyResult<Vec<_>>>()?,
                    )?,
                    t.call_method0(pyo3::intern!(py, "stride"))?,
                    t.call_method0(pyo3::intern!(py, "storage_offset"))?,
                );
                geometry.set_item(&r, g)?;
            }
            if root.is_none() {
                root = Some(r);
            }
        }
        let out = user_call(func, args, kwargs)?;
        let outs: Vec<Bound<'py, PyAny>> = match out.cast::<PyTuple>() {
            Ok(t) => t.iter().collect(),
            Err(_) => match out.cast::<PyList>() {
                Ok(l) => l.iter().collect(),
                Err(_) => vec![out.clone()],
            },
        };
        let tensor = self.kit.tensor.bind(py);
        if let Some(root) = &root {
            let views = mode.getattr(pyo3::intern!(py, "views"))?;
            let views = views.cast::<PyDict>()?;
            for o in &outs {
                if !o.is_instance(tensor)? {
                    continue;
                }
                let w = PyWeakrefReference::new(o)?;
                let list = match views.get_item(root)? {
                    Some(l) => l,
                    None => {
                        let l = PyList::empty(py).into_any();
                        views.set_item(root, &l)?;
                        l
                    }
                };
                list.cast::<PyList>()?.append(&w)?;
                view_roots.set_item(o.as_ptr() as usize, (&w, root))?;
            }
        }
        if lowered && !outs.is_empty() {
            let dtypes = self.kit.dtypes.bind(py);
            let mut shorts = Vec::with_capacity(outs.len());
            for o in &outs {
                if !o.is_instance(tensor)? {
                    return Ok(Some(out));
                }
                let Some(name) = dtypes.get_item(o.getattr(pyo3::intern!(py, "dtype"))?)? else {
                    return Ok(Some(out));
                };
                let shape = o.getattr(pyo3::intern!(py, "shape"))?;
                let dims = shape
                    .cast::<PyTuple>()?
                    .iter()
                    .map(|d| d.extract::<i64>().map(|d| d.to_string()))
                    .collect::<PyResult<Vec<_>>>()?;
                shorts.push(format!("{}[{}]", name.cast::<PyString>()?.to_str()?, dims.join(",")));
            }
            let outs: Vec<Option<Bound<'py, PyAny>>> = outs.into_iter().map(Some).collect();
            let shorts = PyTuple::new(py, shorts)?.into_any();
            self.record_node(py, mode, op, func, &call, &outs, shorts, true, false)?;
        }
        Ok(Some(out))
    }

    /// An op programs do not lower: run at once when it reads no pending value (the Python
    /// side materialises first otherwise, or answers a scalar read).
    fn run<'py>(&self, d: Dispatched<'_, 'py>) -> Outcome<'py> {
        let Dispatched { py, mode, func, args, kwargs } = d;
        let tensor = self.kit.tensor.bind(py);
        let mut tensors = Vec::new();
        collect_tensors(tensor, args.as_any(), &mut tensors, 0)?;
        if let Some(kwargs) = kwargs {
            collect_tensors(tensor, kwargs.as_any(), &mut tensors, 0)?;
        }
        if !tensors.is_empty() {
            let produced = mode.getattr(pyo3::intern!(py, "produced"))?;
            let input_ids = mode.getattr(pyo3::intern!(py, "input_ids"))?;
            let pending = mode.getattr(pyo3::intern!(py, "pending_storages"))?;
            let pending = pending.cast::<PyDict>()?;
            for t in &tensors {
                let touches =
                    match Self::seen(produced.cast::<PyDict>()?, input_ids.cast::<PyDict>()?, t)? {
                        Seen::Ref(..) => true,
                        _ if pending.is_empty() => false,
                        Seen::Input(_, storage) => pending.contains(storage)?,
                        Seen::New => mode
                            .call_method1(pyo3::intern!(py, "_pending_storage"), (t,))?
                            .is_truthy()?,
                    };
                if touches {
                    return Ok(None);
                }
            }
        }
        user_call(func, args, kwargs).map(Some)
    }

    fn plan(&self, func: &Bound<'_, PyAny>) -> Option<Plan> {
        known(func.py()).ops.get(&(func.as_ptr() as usize)).map(|(_, p)| p.clone_ref(func.py()))
    }
}

/// One call of the handler: its mode, the op overload and the op's arguments.
#[derive(Clone, Copy)]
struct Dispatched<'a, 'py> {
    py: Python<'py>,
    mode: &'a Bound<'py, PyAny>,
    func: &'a Bound<'py, PyAny>,
    args: &'a Bound<'py, PyTuple>,
    kwargs: Option<&'a Bound<'py, PyDict>>,
}

/// What the checks before recording found (`FusedDispatch::common_checks`).
enum Checked {
    /// Record the call; whether an argument is a recorded value.
    Record(bool),
    /// Bookkeeping on zero-dim tensors that hold their values: run at once.
    Scalars,
    /// The Python handler's.
    Python,
}

/// How a call through this path ended: its outputs, `None` for the Python handler, or a failure.
type Outcome<'py> = Result<Option<Bound<'py, PyAny>>, Failure>;

/// A failure of this path: the op's own error, or one of the path itself.
enum Failure {
    User(PyErr),
    Internal(PyErr),
}

impl From<PyErr> for Failure {
    fn from(e: PyErr) -> Failure {
        Failure::Internal(e)
    }
}

impl From<pyo3::CastError<'_, '_>> for Failure {
    fn from(e: pyo3::CastError<'_, '_>) -> Failure {
        Failure::Internal(e.into())
    }
}

/// Runs the op itself: its error is the user's.
fn user_call<'py>(
    func: &Bound<'py, PyAny>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> Result<Bound<'py, PyAny>, Failure> {
    func.call(args, kwargs).map_err(Failure::User)
}

/// The tensors in `x`, in lists, tuples and dicts too (`fused._tensors`).
fn collect_tensors<'py>(
    tensor: &Bound<'py, PyType>,
    x: &Bound<'py, PyAny>,
    out: &mut Vec<Bound<'py, PyAny>>,
    depth: usize,
) -> PyResult<()> {
    if depth > 8 {
        return Err(pyo3::exceptions::PyValueError::new_err("arguments nested too deep"));
    }
    if x.is_instance(tensor)? {
        out.push(x.clone());
    } else if let Ok(l) = x.cast::<PyList>() {
        for v in l.iter() {
            collect_tensors(tensor, &v, out, depth + 1)?;
        }
    } else if let Ok(t) = x.cast::<PyTuple>() {
        for v in t.iter() {
            collect_tensors(tensor, &v, out, depth + 1)?;
        }
    } else if let Ok(d) = x.cast::<PyDict>() {
        for v in d.values() {
            collect_tensors(tensor, &v, out, depth + 1)?;
        }
    }
    Ok(())
}

/// Keeps the plan of `func` as the Python side gives it (`FusedMode._native_plan`): `None` (the
/// Python handler takes its calls), `("plain", key)`, `("in_place", the functional op's key, the
/// functional op)`, `("view", key, lowered)` or `("run", metadata only)`. Returns it.
fn learn(func: Py<PyAny>, plan: &Bound<'_, PyAny>) -> PyResult<Plan> {
    let parsed = if plan.is_none() {
        Plan::Python
    } else {
        let plan = plan.cast::<PyTuple>()?;
        let kind: String = plan.get_item(0)?.extract()?;
        match kind.as_str() {
            "plain" => Plan::Plain(plan.get_item(1)?.cast_into::<PyString>()?.unbind()),
            "in_place" => Plan::InPlace(
                plan.get_item(1)?.cast_into::<PyString>()?.unbind(),
                plan.get_item(2)?.unbind(),
            ),
            "run" => Plan::Run(plan.get_item(1)?.is_truthy()?),
            "view" => Plan::View(
                plan.get_item(1)?.cast_into::<PyString>()?.unbind(),
                plan.get_item(2)?.is_truthy()?,
            ),
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "unknown fused plan {other:?}"
                )));
            }
        }
    };
    let address = func.as_ptr() as usize;
    let again = parsed.clone_ref(plan.py());
    known(plan.py()).ops.insert(address, (func, parsed));
    Ok(again)
}

/// Whether weak reference `w` (a `weakref.ref` the Python side keeps) refers to `t`.
fn refers_to(w: &Bound<'_, PyAny>, t: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(w.cast::<PyWeakrefReference>()?.upgrade().is_some_and(|o| o.is(t)))
}

/// `x`, or a copy of it when it is a list (a recorded node's arguments are its own).
fn copy_list<'py>(x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    match x.cast::<PyList>() {
        Ok(l) => Ok(PyList::new(x.py(), l.iter())?.into_any()),
        Err(_) => Ok(x.clone()),
    }
}

/// The address of a tensor's storage (`fused._storage`), 0 when it has none.
fn storage_of(t: &Bound<'_, PyAny>) -> usize {
    let py = t.py();
    t.call_method0(pyo3::intern!(py, "untyped_storage"))
        .and_then(|s| s.call_method0(pyo3::intern!(py, "data_ptr")))
        .and_then(|p| p.extract())
        .unwrap_or(0)
}

#[pymethods]
impl FusedDispatch {
    /// `mode`: the fused mode (held weakly); `planner`: the Python side's plan of an op not seen
    /// yet, called as `planner(mode, func)`; `python`: its handler, called as
    /// `python(mode, func, types, args, kwargs)`; `kit`: `(torch.Tensor, torch.dtype, torch.layout,
    /// torch.memory_format, torch.device, torch.empty, TensorBase.data_ptr, the trace cache, graph.DTYPES,
    /// fused._Lifted, fused._LIFTABLE_DTYPES)`.
    #[new]
    fn new(
        mode: &Bound<'_, PyAny>,
        planner: Py<PyAny>,
        python: Py<PyAny>,
        kit: &Bound<'_, PyTuple>,
    ) -> PyResult<FusedDispatch> {
        let py = mode.py();
        let (
            tensor,
            dtype,
            layout,
            memory_format,
            device,
            empty,
            data_ptr,
            traces,
            dtypes,
            lifted_class,
            liftable,
        ) = kit.extract()?;
        Ok(FusedDispatch {
            mode: ModeRef::new(mode)?,
            planner,
            python,
            kit: Kit {
                tensor,
                dtype,
                layout,
                memory_format,
                device,
                empty,
                data_ptr,
                traces,
                dtypes,
                lifted_class,
                liftable,
                lifted_key: PyTuple::new(py, [PyString::intern(py, "lifted")])?.unbind(),
                r: PyString::intern(py, "r").unbind(),
                i: PyString::intern(py, "i").unbind(),
                b: PyString::intern(py, "b").unbind(),
            },
            recorded: AtomicU64::new(0),
            handed: AtomicU64::new(0),
        })
    }

    /// The mode this handler is bound to (PyTorch checks it).
    #[getter(__self__)]
    fn self_(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self.mode.as_self(py))
    }

    /// Calls recorded by this handler and calls it handed to the Python handler since the last
    /// call, which resets both.
    fn take_counts(&self) -> (u64, u64) {
        (self.recorded.swap(0, Ordering::Relaxed), self.handed.swap(0, Ordering::Relaxed))
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
        let Some(mode) = self.mode.get(py) else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "the fused mode of this handler is gone",
            ));
        };
        let plan = match self.plan(func) {
            Some(plan) => plan,
            None => learn(func.clone().unbind(), &self.planner.bind(py).call1((&mode, func))?)?,
        };
        let d = Dispatched { py, mode: &mode, func, args, kwargs };
        let done = match &plan {
            Plan::Python => Ok(None),
            Plan::Plain(op) => self.plain(d, op.bind(py)),
            Plan::InPlace(op, f) => self.in_place(d, op.bind(py), f.bind(py)),
            Plan::View(op, lowered) => self.view(d, op.bind(py), *lowered),
            Plan::Run(true) => user_call(func, args, kwargs).map(Some),
            Plan::Run(false) => self.run(d),
        };
        match done {
            Ok(Some(out)) => return Ok(out),
            Ok(None) => {}
            // The op's own error (a view of a shape it cannot take): the user's, unchanged.
            Err(Failure::User(e)) => return Err(e),
            // This path failed: counted as the Python handler counts a recording failure,
            // and the op runs (or the error policy raises).
            Err(Failure::Internal(e)) => {
                return mode.call_method1(
                    pyo3::intern!(py, "_recording_failed"),
                    (func, args, kwargs.map_or_else(|| PyDict::new(py), Bound::clone), e.value(py)),
                );
            }
        }
        self.handed.fetch_add(1, Ordering::Relaxed);
        self.python.bind(py).call1((mode, func, types, args, kwargs))
    }
}
