//! The PyTorch side of the extension, `tpu_kernels._native.torch_bridge`.
//!
//! - Eager dispatch: [`call`] takes torch tensors through DLPack (zero-copy: the kernel reads
//!   the tensor's memory where it is), runs the op's selected kernel through the dispatcher and
//!   hands the PJRT output buffers back as DLPack capsules that own them (zero-copy on the CPU
//!   plugin, whose device memory is host memory). A call that runs no kernel answers a
//!   fallback tuple instead, so the Python side runs the original op.
//! - Graphs: [`compile_graph`] lowers an ATen graph (the registry's graph JSON) to one
//!   StableHLO module with registered kernels inlined, compiles it once per graph and returns a
//!   [`GraphProgram`] that runs it on torch tensors.
//! - Metadata for the Python side: the kernels and their schema bindings, the ops a graph can
//!   lower, output types from a kernel's shape rule, and the counters behind `report()`.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use dlpark::ffi::{DLDevice, DLDeviceType, DLManagedTensor};
use dlpark::metadata::Dynamic;
use dlpark::python::consumer::exchange::ExchangeApi;
use dlpark::python::{ImportedDlpack, from_dlpack};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyString, PyTuple};
use tpu_kernels::registration::{BindingKind, KernelSignature, Platform, StaticKind, StaticValue};
use tpu_kernels::{DType, Shape, TensorType};
use tpu_kernels_registry::cache::CompileCache;
use tpu_kernels_registry::dispatch::{dtype_of, upload_input_cached};
use tpu_kernels_registry::graph::{
    self, Graph, IndexResolver, KernelCall, KernelResolver, OpCall, ShardSpec,
};
use tpu_kernels_registry::pjrt::{
    Buffer, CompileOptions, LoadedExecutable, OptionOverride, Program, ViewCache, interleave_policy,
};
use tpu_kernels_registry::tuning::{self, Tuner};
use tpu_kernels_registry::{
    CallMeta, DispatchError, Dispatcher, HostTensor, Index, LendError, LentRun, Registry,
    execute_lending, fault, normalize_op, with_pooled_outputs,
};

/// Counters of the graph path.
#[derive(Debug, Default)]
struct GraphStats {
    compiled: u64,
    memo_hits: u64,
    runs: u64,
    run_nanos: u64,
    /// Inputs a run read through a gathered copy (laid out otherwise than the program reads).
    inputs_gathered: u64,
    /// Inputs a run wrote an output into (donated: in place; or copied in).
    inputs_updated_in_place: u64,
    inputs_updated_by_copy: u64,
    /// Program outputs written into the caching allocator's blocks, and those whose block could
    /// not be had (a fresh buffer then).
    outputs_pooled: u64,
    outputs_pool_missed: u64,
    lower_errors: u64,
    /// Kernel name -> how many graph programs inlined it.
    kernels: BTreeMap<String, u64>,
    /// Kernel name -> how many times it ran inside a program run (once per inlined call).
    kernels_run: BTreeMap<String, u64>,
    /// Programs compiled under more than one set of settings (see `registry::tuning`).
    programs_tuned: u64,
    /// Program name -> what its tuner chose, once chosen.
    tuned: BTreeMap<String, tuning::Tuning>,
}

/// The process-wide runtime of the bridge: one PJRT CPU client, its dispatcher and the
/// compiled graph programs.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub(crate) dispatcher: Dispatcher,
    cache: Arc<CompileCache>,
    pub(crate) platform: Platform,
    programs: Mutex<HashMap<String, Arc<ProgramInner>>>,
    /// Views of the host memory graph programs' inputs occupied: a model's parameters (and
    /// whatever the allocator puts at the same addresses) are viewed once, not every run.
    views: ViewCache,
    graph_stats: Mutex<GraphStats>,
}

/// Views the graph path keeps: several models' parameters and activations.
const GRAPH_VIEWS: usize = 2048;

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

/// The runtime if it has started, without the GIL (the device's calls, which may come from
/// autograd's threads, find it started by `device_api`).
pub(crate) fn runtime_if_ready() -> Option<&'static Runtime> {
    RUNTIME.get().and_then(|r| r.as_ref().ok())
}

fn make_runtime(py: Python<'_>) -> Result<Runtime, String> {
    let registry = Registry::global().map_err(|e| format!("kernel registry: {e}"))?;
    // The extension's shared PJRT CPU client and compile cache (one plugin, one thread pool).
    let client = crate::runtime::cpu_client(py).map_err(|e| e.to_string())?;
    let cache = crate::runtime::cache();
    let dispatcher =
        Dispatcher::new(registry, client, cache.clone()).map_err(|e| format!("dispatcher: {e}"))?;
    let platform = dispatcher.platform();
    Ok(Runtime {
        dispatcher,
        cache,
        platform,
        programs: Mutex::new(HashMap::new()),
        views: ViewCache::with_capacity(GRAPH_VIEWS),
        graph_stats: Mutex::new(GraphStats::default()),
    })
}

pub(crate) fn runtime(py: Python<'_>) -> PyResult<&'static Runtime> {
    RUNTIME
        .get_or_init(|| make_runtime(py))
        .as_ref()
        .map_err(|e| PyRuntimeError::new_err(e.clone()))
}

// ----- DLPack in -----

/// A torch tensor imported through DLPack: the managed tensor keeps its memory alive.
pub(crate) struct Imported {
    _owner: ImportedDlpack,
    pub(crate) ty: TensorType,
    ptr: *const u8,
    len: usize,
    pub(crate) contiguous: bool,
    /// The tensor's sizes, element strides and first element (null when it has none), for
    /// reading it in another order ([`Imported::ordered`]).
    dims: Vec<i64>,
    strides: Vec<i64>,
    base: *const u8,
    element_bytes: usize,
    /// A tensor on the "tpu" device (its memory is host memory all the same).
    pub(crate) on_tpu: bool,
}

impl Imported {
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.len == 0 || self.ptr.is_null() {
            return &[];
        }
        // SAFETY: `ptr` and `len` come from the validated DLPack descriptor of a compact CPU
        // tensor (checked in `import_tensor`), whose memory `_owner` keeps alive as long as
        // `self`; nothing writes it while the kernel reads it (the Python caller holds the GIL
        // and the tensor for the whole call).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The elements in the row-major order of the dims taken in `order` (`order[k]` is the
    /// tensor dim that is dim `k` of the result): the memory in place when the tensor is laid
    /// out that way (a transposed tensor read in its physical order), else a gathered copy.
    pub(crate) fn ordered(&self, order: &[usize]) -> Cow<'_, [u8]> {
        let dims: Vec<i64> = order.iter().map(|&d| self.dims[d]).collect();
        let strides: Vec<i64> = order.iter().map(|&d| self.strides[d]).collect();
        let numel = dims.iter().product::<i64>().max(0) as usize;
        let esize = self.element_bytes;
        if numel == 0 || self.base.is_null() {
            return Cow::Borrowed(&[]);
        }
        if crate::tensor::row_major(&dims, Some(&strides)) {
            // SAFETY: dense row-major in this order: the `numel` elements are the bytes from
            // `base` on, inside the tensor that `_owner` keeps alive.
            return Cow::Borrowed(unsafe { std::slice::from_raw_parts(self.base, numel * esize) });
        }
        // SAFETY: `base`, `dims` and `strides` describe the tensor's elements (DLPack's
        // contract), inside the memory `_owner` keeps alive.
        Cow::Owned(unsafe { crate::tensor::gather(self.base, &dims, &strides, esize) })
    }
}

/// The DLPack C exchange table of `obj`'s type (torch tensors have one), if any.
pub(crate) fn exchange_api(obj: &Bound<'_, PyAny>) -> Option<ExchangeApi> {
    ExchangeApi::from_object(obj.as_borrowed()).ok().flatten()
}

/// Imports input `i`; `Err` is a bad-input reason (the call falls back). Through the producer's
/// C exchange table when it has one (no capsule, no Python call), else `__dlpack__`.
pub(crate) fn import_tensor(obj: &Bound<'_, PyAny>, i: usize) -> Result<Imported, String> {
    let owner = match exchange_api(obj) {
        Some(api) => {
            let (managed, _stream) = api
                .import_managed_no_sync(obj.as_borrowed())
                .map_err(|e| format!("input {i} is not a DLPack tensor: {e}"))?
                .into_parts();
            ImportedDlpack::Versioned(managed)
        }
        None => from_dlpack(obj.as_borrowed(), None, None)
            .map_err(|e| format!("input {i} is not a DLPack tensor: {e}"))?,
    };
    let t = owner.validate().map_err(|e| format!("input {i}: invalid DLPack tensor: {e}"))?;
    let device = t.device();
    // The "tpu" device's tensors export as DLPack's extension device; on the embedded default
    // their memory is host memory from the device's allocator, which the client reads in place.
    let on_tpu = device.device_type == DLDeviceType::EXTDEV && crate::device::installed();
    if on_tpu {
        // A tensor the native recorder has not computed yet is computed before it is read.
        crate::recorder::materialise("import")?;
    }
    if device.device_type != DLDeviceType::CPU && !on_tpu {
        return Err(format!(
            "input {i} is on DLPack device type {} (only CPU and tpu-device memory feed the PJRT CPU client)",
            device.device_type.0
        ));
    }
    let dtype = crate::tensor::dtype_of_dlpack(t.dtype()).ok_or_else(|| {
        format!(
            "input {i} has a DLPack dtype (code {}, {} bits) no kernel takes",
            t.dtype().code.0,
            t.dtype().bits
        )
    })?;
    let dims: Vec<u64> = t.shape().iter().map(|d| *d as u64).collect();
    let contiguous = crate::tensor::row_major(t.shape(), t.strides());
    let len = if contiguous { t.num_bytes() } else { 0 };
    let base = if t.shape().contains(&0) || t.data_ptr().is_null() {
        std::ptr::null()
    } else {
        t.data_ptr().cast::<u8>().wrapping_add(t.byte_offset() as usize)
    };
    let ptr = if len == 0 { std::ptr::null() } else { base };
    let shape = t.shape().to_vec();
    let strides = match t.strides() {
        Some(s) => s.to_vec(),
        None => compact_strides(&shape),
    };
    let element_bytes = (t.dtype().bits as usize).div_ceil(8) * t.dtype().lanes.max(1) as usize;
    let ty = TensorType::new(dtype, Shape::of(&dims));
    Ok(Imported {
        _owner: owner,
        ty,
        ptr,
        len,
        contiguous,
        dims: shape,
        strides,
        base,
        element_bytes,
        on_tpu,
    })
}

/// Row-major element strides of `dims`.
pub(crate) fn compact_strides(dims: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * dims[k + 1].max(1);
    }
    strides
}

fn import_all(tensors: &Bound<'_, PyList>) -> Result<Vec<Imported>, String> {
    // Sized up front: collecting through `Result` grows the vector by doubling, and the
    // reallocations of these large elements showed as 3% of a small graph program's run.
    let mut imported = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        imported.push(import_tensor(&t, i)?);
    }
    Ok(imported)
}

// ----- DLPack out -----

/// The owner of an exported buffer, dropped when the tensor (or capsule) dies. A device
/// tensor's buffer is counted as device memory (`torch.tpu.memory_allocated`), and its memory
/// may be an input of the native recorder's pending trace, which reads it at the flush: its
/// drop then waits for the flush, as the device's other frees do.
enum ExportedBuffer {
    /// Held for its drop.
    Host {
        _buffer: Buffer,
    },
    Device(Option<crate::device::Counted>),
}

impl Drop for ExportedBuffer {
    fn drop(&mut self) {
        if let ExportedBuffer::Device(counted) = self
            && let Some(c) = counted.take()
        {
            crate::recorder::drop_or_defer(Box::new(c));
        }
    }
}

/// `buffer` as a Python object that owns it and points at its memory: a torch tensor made by
/// the exchange table `api` when given (no capsule, no Python call), else a DLPack capsule.
/// With `on_tpu`, the tensor is on the "tpu" device (DLPack's extension device), and the
/// buffer's drop waits for the native recorder's flush while a trace is pending.
pub(crate) fn export_buffer<'py>(
    py: Python<'py>,
    buffer: Buffer,
    api: Option<&ExchangeApi>,
    on_tpu: bool,
) -> PyResult<Bound<'py, PyAny>> {
    export_buffer_as(py, buffer, api, None, on_tpu)
}

/// [`export_buffer`], seen through `order` when given: the buffer holds the dims of the
/// tensor in that order (`order[k]` is the tensor dim stored as the buffer's dim `k`), and the
/// tensor is the permuted view of it (strides, no copy).
fn export_buffer_as<'py>(
    py: Python<'py>,
    buffer: Buffer,
    api: Option<&ExchangeApi>,
    order: Option<&[usize]>,
    on_tpu: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let device = if on_tpu {
        DLDevice { device_type: DLDeviceType::EXTDEV, device_id: 0 }
    } else {
        DLDevice::CPU
    };
    let stored = buffer.dims().to_vec();
    let stored_strides = compact_strides(&stored);
    let (dims, strides) = match order {
        None => (stored, stored_strides),
        Some(order) if order.len() != stored.len() => {
            return Err(PyValueError::new_err(format!(
                "an output of rank {} cannot be viewed in dim order {order:?}",
                stored.len()
            )));
        }
        Some(order) => {
            let mut dims = vec![0i64; order.len()];
            let mut strides = vec![0i64; order.len()];
            for (k, &d) in order.iter().enumerate() {
                dims[d] = stored[k];
                strides[d] = stored_strides[k];
            }
            (dims, strides)
        }
    };
    let ty = buffer.element_type();
    let dtype = dtype_of(ty).and_then(crate::tensor::dlpack_of_dtype).ok_or_else(|| {
        PyTypeError::new_err(format!("output element type {ty:?} has no DLPack dtype"))
    })?;
    let ptr = if buffer.byte_size() == 0 {
        std::ptr::NonNull::<u64>::dangling().as_ptr().cast::<u8>()
    } else {
        buffer
            .read_in_place(|bytes| bytes.as_ptr())
            .map_err(|e| PyRuntimeError::new_err(format!("reading a kernel output: {e}")))?
    };
    fn export_err(e: impl std::fmt::Display) -> PyErr {
        PyRuntimeError::new_err(format!("DLPack export: {e}"))
    }
    let buffer = if on_tpu {
        ExportedBuffer::Device(Some(crate::device::Counted::new(buffer)))
    } else {
        ExportedBuffer::Host { _buffer: buffer }
    };
    if let Some(api) = api {
        let mut init =
            Dynamic::new(dims, strides).initialize(Box::new(buffer)).map_err(export_err)?;
        init.set_data(ptr.cast_mut().cast::<c_void>()).set_dtype(dtype).set_device(device);
        // SAFETY: as below (same buffer, pointer and layout), in the versioned ABI.
        let managed = unsafe { init.finish() };
        return api.managed_tensor_to_py_object_no_sync(managed, py);
    }
    let mut init = Dynamic::new(dims, strides)
        .initialize_as::<DLManagedTensor>(Box::new(buffer))
        .map_err(export_err)?;
    init.set_data(ptr.cast_mut().cast::<c_void>()).set_dtype(dtype).set_device(device);
    // SAFETY: `ptr` is the host address of the PJRT buffer owned by the managed tensor's
    // context (it lives until the consumer calls the deleter), the buffer is ready
    // (`read_in_place` waited), and its layout is dense row-major with exactly these dims and
    // this element type, which the metadata describes (row-major, or a permuted view of it).
    let managed = unsafe { init.finish() };
    managed.into_pyobject(py)
}

/// Exports every buffer, as torch tensors when `like` (an input) has an exchange table.
pub(crate) fn export_all<'py>(
    py: Python<'py>,
    buffers: Vec<Buffer>,
    like: Option<Bound<'py, PyAny>>,
    on_tpu: bool,
) -> PyResult<Bound<'py, PyList>> {
    let api = like.as_ref().and_then(exchange_api);
    let out = PyList::empty(py);
    for b in buffers {
        out.append(export_buffer(py, b, api.as_ref(), on_tpu)?)?;
    }
    Ok(out)
}

// ----- statics -----

fn statics_of(statics: &Bound<'_, PyList>) -> PyResult<Vec<(&'static str, StaticValue)>> {
    statics
        .iter()
        .map(|item| {
            let (name, value): (String, Bound<'_, PyAny>) = item.extract()?;
            Ok((
                crate::intern::intern(&name),
                crate::registry_api::static_value(item.py(), &name, &value)?,
            ))
        })
        .collect()
}

fn static_to_py<'py>(py: Python<'py>, v: &StaticValue) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        StaticValue::Int(i) => i.into_pyobject(py)?.into_any(),
        StaticValue::Float(f) => f.into_pyobject(py)?.into_any(),
        StaticValue::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        StaticValue::Str(s) => PyString::new(py, s).into_any(),
    })
}

// ----- eager calls -----

/// The kernel the registry selects for a call (what the dispatcher just ran).
fn selected(
    rt: &Runtime,
    op: &str,
    imported: &[Imported],
    statics: &[(&'static str, StaticValue)],
) -> Option<String> {
    let sig = KernelSignature {
        inputs: imported.iter().map(|t| t.ty.clone()).collect(),
        statics: statics.to_vec(),
    };
    let contiguous: Vec<bool> = imported.iter().map(|t| t.contiguous).collect();
    let meta = CallMeta { sig: &sig, contiguous: &contiguous, platform: rt.platform };
    rt.dispatcher.registry().select(&normalize_op(op), &meta).ok().map(|k| k.name().to_owned())
}

/// Runs `op` on `tensors` (torch tensors, DLPack producers) with `statics` (`[(name, value)]`)
/// through the selected kernel. Returns the output itself (a torch tensor, or a DLPack capsule
/// for producers without an exchange table) when there is one and `with_kernel` is false, else
/// `(kernel, [output, ...])` (the kernel's name only when `with_kernel`); when no kernel ran, a
/// 3-tuple `(kernel or None, category, message)`; category `dlpack` means an input could not
/// be imported (the dispatcher never saw the call, so its counters do not include it).
///
/// `lent` (positions of tensors, in the kernel's output order) makes it an in-place call: the
/// kernel writes the new values of those tensors into their own memory
/// ([`Dispatcher::call_in_place`]), and the answer is `(kernel, [other output, ...])`.
#[pyfunction]
#[pyo3(signature = (op, tensors, statics, with_kernel, lent = Vec::new()))]
fn call<'py>(
    py: Python<'py>,
    op: &str,
    tensors: &Bound<'py, PyList>,
    statics: &Bound<'py, PyList>,
    with_kernel: bool,
    lent: Vec<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let rt = runtime(py)?;
    let statics = statics_of(statics)?;
    let imported = match import_all(tensors) {
        Ok(v) => v,
        Err(reason) => {
            let op = normalize_op(op);
            return Ok(PyTuple::new(
                py,
                [
                    None::<String>.into_pyobject(py)?.into_any(),
                    // Not seen by the dispatcher (so not in its counters): the caller counts it.
                    "dlpack".into_pyobject(py)?.into_any(),
                    format!("`{op}` falls back: bad input: {reason}").into_pyobject(py)?.into_any(),
                ],
            )?
            .into_any());
        }
    };
    let inputs: Vec<HostTensor<'_>> = imported
        .iter()
        .map(|t| HostTensor { ty: &t.ty, data: t.bytes(), contiguous: t.contiguous })
        .collect();
    let on_tpu = imported.iter().any(|t| t.on_tpu);
    if !lent.is_empty() {
        if let Some(&i) = lent.iter().find(|&&i| imported.get(i).is_none_or(|t| !t.contiguous)) {
            let op = normalize_op(op);
            let message = format!(
                "`{op}` falls back: bad input: tensor {i}, updated in place, is not a contiguous \
                 tensor of the call"
            );
            return Ok((None::<String>, "dlpack", message).into_pyobject(py)?.into_any());
        }
        // SAFETY: the lent tensors are the caller's (Python holds them and the GIL for the
        // call), contiguous, and imported in place (`bytes` is their own memory); the op's
        // schema declares them written.
        let result = unsafe { rt.dispatcher.call_in_place(op, &inputs, &statics, &lent) };
        return match result {
            Ok(buffers) => {
                let kernel = if with_kernel { selected(rt, op, &imported, &statics) } else { None };
                Ok((kernel, export_all(py, buffers, tensors.iter().next(), on_tpu)?)
                    .into_pyobject(py)?
                    .into_any())
            }
            Err(DispatchError::Fallback(f) | DispatchError::Forbidden(f)) => {
                let message = f.to_string();
                Ok((f.kernel, f.reason.category(), message).into_pyobject(py)?.into_any())
            }
            Err(other) => Err(PyRuntimeError::new_err(other.to_string())),
        };
    }
    match rt.dispatcher.call(op, &inputs, &statics) {
        Ok(mut buffers) if !with_kernel && buffers.len() == 1 => {
            // The common case, answered with the tensor itself (no containers to allocate).
            let like = tensors.iter().next();
            let api = like.as_ref().and_then(exchange_api);
            let buffer = buffers.pop().ok_or_else(|| PyRuntimeError::new_err("no output"))?;
            export_buffer(py, buffer, api.as_ref(), on_tpu)
        }
        Ok(buffers) => {
            let kernel = if with_kernel { selected(rt, op, &imported, &statics) } else { None };
            Ok((kernel, export_all(py, buffers, tensors.iter().next(), on_tpu)?)
                .into_pyobject(py)?
                .into_any())
        }
        Err(DispatchError::Fallback(f) | DispatchError::Forbidden(f)) => {
            let message = f.to_string();
            Ok((f.kernel, f.reason.category(), message).into_pyobject(py)?.into_any())
        }
        Err(other) => Err(PyRuntimeError::new_err(other.to_string())),
    }
}

// ----- graphs -----

/// Binds graph nodes to registered kernels with the registry's own selection (guards,
/// priorities, platforms; Rust-built and imported kernels), recording which kernels it inlined,
/// once per node (pattern fusion asks about a fused node before lowering asks again).
struct RecordingResolver {
    inner: IndexResolver,
    /// (node, kernel) in graph order.
    used: RefCell<Vec<(String, String)>>,
    /// Kernels that run per shard in a manually sharded region (sharded programs), keyed by
    /// op or kernel name.
    manual: Vec<(String, ShardSpec)>,
    /// Kernels run per shard, in graph order, and why a kernel named in `manual` runs whole
    /// instead, per node.
    per_shard: RefCell<Vec<String>>,
    notes: RefCell<Vec<String>>,
}

impl RecordingResolver {
    /// The spec naming the call's op, or the kernel it resolved to (then that kernel only).
    fn manual_spec(&self, call: &OpCall<'_>, kernel: &str) -> Option<(&ShardSpec, Option<&str>)> {
        let op = normalize_op(call.op());
        if let Some((key, s)) = self.manual.iter().find(|(key, _)| key == kernel) {
            return Some((s, Some(key.as_str())));
        }
        self.manual.iter().find(|(key, _)| normalize_op(key) == op).map(|(_, s)| (s, None))
    }
}

impl KernelResolver for RecordingResolver {
    fn resolve(&self, call: &OpCall<'_>) -> Option<KernelCall> {
        let mut kernel_call = self.inner.resolve(call)?;
        if let Some((spec, only)) = self.manual_spec(call, &kernel_call.module.name) {
            match self.inner.resolve_manual(call, spec, only) {
                Ok(manual) => {
                    self.per_shard.borrow_mut().push(manual.module.name.clone());
                    kernel_call = manual;
                }
                Err(why) => self.notes.borrow_mut().push(format!(
                    "node `{}` ({}): runs whole, not per shard: {why}",
                    call.node.name,
                    call.op()
                )),
            }
        }
        let (node, kernel) = (call.node.name.clone(), kernel_call.module.name.clone());
        let mut used = self.used.borrow_mut();
        match used.iter_mut().find(|(n, _)| *n == node) {
            Some(entry) => entry.1 = kernel,
            None => used.push((node, kernel)),
        }
        Some(kernel_call)
    }
}

#[derive(Debug)]
struct ProgramInner {
    name: String,
    fingerprint: String,
    text: String,
    /// The program under each compile setting it was compiled with: the default first, then
    /// the variants it is tuned over (see `tuner`).
    executables: Vec<Arc<LoadedExecutable>>,
    /// Which of `executables` a run uses; `None` when there is one.
    tuner: Option<Tuner>,
    inputs: Vec<TensorType>,
    outputs: Vec<TensorType>,
    kernels: Vec<String>,
    /// `(input, output)`: the output is computed into the input's memory (donated).
    donations: Vec<(usize, usize)>,
    /// Outputs written into lent blocks of the caching allocator (extra parameters after the
    /// inputs, see `registry::with_pooled_outputs`).
    pooled: Vec<(usize, TensorType)>,
}

/// How a program's inputs and outputs cross its boundary: per input, the order in which the
/// program reads the tensor's dims (`[1, 0]`: a transposed tensor read in its physical order,
/// in place), per output the order in which the program stores the tensor's dims (the result is
/// the permuted view of it); `None` entries are row-major. Made once per program.
#[pyclass(name = "BoundaryLayout", frozen, module = "tpu_kernels._native.torch_bridge")]
#[derive(Debug)]
struct BoundaryLayout {
    inputs: Vec<Option<Vec<usize>>>,
    outputs: Vec<Option<Vec<usize>>>,
}

#[pymethods]
impl BoundaryLayout {
    #[new]
    fn new(
        inputs: Vec<Option<Vec<usize>>>,
        outputs: Vec<Option<Vec<usize>>>,
    ) -> PyResult<BoundaryLayout> {
        for (side, list) in [("input", &inputs), ("output", &outputs)] {
            for (i, order) in list.iter().enumerate() {
                if let Some(order) = order {
                    let mut seen = order.clone();
                    seen.sort_unstable();
                    if seen.iter().enumerate().any(|(k, &d)| k != d) {
                        return Err(PyValueError::new_err(format!(
                            "{side} {i}: {order:?} is not a permutation of the dims"
                        )));
                    }
                }
            }
        }
        Ok(BoundaryLayout { inputs, outputs })
    }
}

/// One ATen graph compiled to one StableHLO program.
#[pyclass(name = "GraphProgram", frozen, module = "tpu_kernels._native.torch_bridge")]
#[derive(Debug)]
pub(crate) struct GraphProgram {
    inner: Arc<ProgramInner>,
}

/// A tuner's view as Python sees it: `{"variants": [label, ...], "fastest_s": {label: seconds
/// or None}, "failed": [label, ...], "chosen": label or None}`.
fn tuning_dict<'py>(py: Python<'py>, seen: &tuning::Tuning) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let best = PyDict::new(py);
    let failed = PyList::empty(py);
    let labels = PyList::empty(py);
    for (label, fastest, rejected) in &seen.variants {
        labels.append(label)?;
        best.set_item(label, fastest)?;
        if *rejected {
            failed.append(label)?;
        }
    }
    d.set_item("variants", labels)?;
    d.set_item("fastest_s", best)?;
    d.set_item("failed", failed)?;
    d.set_item("chosen", seen.chosen)?;
    Ok(d)
}

fn short_types(types: &[TensorType]) -> Vec<String> {
    types.iter().map(TensorType::short).collect()
}

impl GraphProgram {
    /// The executable the next run uses, its index, and whether the run is timed for the tuner.
    fn choose(&self) -> (usize, &Arc<LoadedExecutable>, bool) {
        let p = &self.inner;
        let (v, timed) = p.tuner.as_ref().map_or((0, false), Tuner::pick);
        (v, &p.executables[v.min(p.executables.len() - 1)], timed)
    }

    /// Tells the tuner how the run of variant `v` went: its time, or its failure (the variant
    /// is then never chosen); records the choice once made.
    fn tuned_run(&self, rt: &Runtime, v: usize, timed: bool, outcome: Result<f64, ()>) {
        let Some(tuner) = &self.inner.tuner else { return };
        match outcome {
            Ok(seconds) if timed => tuner.record(v, seconds),
            Ok(_) => return,
            Err(()) => tuner.reject(v),
        }
        let seen = tuner.tuning();
        if seen.chosen.is_some()
            && let Ok(mut s) = rt.graph_stats.lock()
        {
            s.tuned.insert(self.inner.name.clone(), seen);
        }
    }

    /// Counts a run: its time, inputs gathered, kernels run, and inputs updated in place.
    fn count_run(&self, rt: &Runtime, start: Instant, gathered: u64, in_place: u64, by_copy: u64) {
        if let Ok(mut s) = rt.graph_stats.lock() {
            s.runs += 1;
            s.run_nanos += start.elapsed().as_nanos() as u64;
            s.inputs_gathered += gathered;
            s.inputs_updated_in_place += in_place;
            s.inputs_updated_by_copy += by_copy;
            for k in &self.inner.kernels {
                match s.kernels_run.get_mut(k) {
                    Some(n) => *n += 1,
                    None => {
                        s.kernels_run.insert(k.clone(), 1);
                    }
                }
            }
        }
    }
}

impl GraphProgram {
    /// Runs the program on `host` (its inputs, read in place where PJRT can) with each
    /// `(input, output)` of `loans` lent: that output is written into the input's memory (its
    /// entry in the result is then `None`); pooled outputs get blocks of the caching allocator.
    /// Counts pooled outputs and tells the tuner how the run went. The error names the program.
    ///
    /// # Safety
    /// For each loan, `host[input].data` is memory the caller may write: valid for the call and
    /// read or written by no one else during it (other inputs excepted).
    pub(crate) unsafe fn run_lent(
        &self,
        rt: &Runtime,
        host: &[HostTensor<'_>],
        loans: &[(usize, usize)],
    ) -> Result<LentRun, String> {
        let p = &self.inner;
        if let Some(m) = fault::program_run(&p.name, &p.kernels) {
            return Err(format!("graph `{}`: execute failed: {m}", p.name));
        }
        let pooled: Vec<(usize, &TensorType)> = p.pooled.iter().map(|(k, t)| (*k, t)).collect();
        let (variant, executable, timed) = self.choose();
        let ran = Instant::now();
        // SAFETY: the caller's contract for the loans; pooled outputs' blocks come from the
        // allocator and belong to the outputs.
        let run = unsafe {
            execute_lending(rt.dispatcher.client(), &rt.views, executable, host, loans, &pooled)
        };
        match &run {
            Ok(_) => self.tuned_run(rt, variant, timed, Ok(ran.elapsed().as_secs_f64())),
            Err(LendError::Run(_)) => self.tuned_run(rt, variant, timed, Err(())),
            // Refused before anything ran: says nothing of the variant.
            Err(LendError::Input(_)) => {}
        }
        let run = run.map_err(|e| {
            let m = match e {
                LendError::Input(m) | LendError::Run(m) => m,
            };
            format!("graph `{}`: execute failed: {m}", p.name)
        })?;
        if let Ok(mut s) = rt.graph_stats.lock() {
            s.outputs_pooled += run.pooled;
            s.outputs_pool_missed += run.pool_missed;
        }
        Ok(run)
    }

    /// Counts a run of a program a Rust caller made (the device's recorder).
    pub(crate) fn count_native_run(
        &self,
        rt: &Runtime,
        start: Instant,
        in_place: u64,
        by_copy: u64,
    ) {
        self.count_run(rt, start, 0, in_place, by_copy);
    }
}

/// Lowers and compiles a graph (the registry's JSON) for a Rust caller (the device's
/// recorder), counted as `compile_graph` counts, without its memo (the caller keeps what it
/// compiled). `donations` as for `compile_graph`.
pub(crate) fn compile_graph_native(
    rt: &Runtime,
    json: &str,
    donations: &[(usize, usize)],
) -> Result<GraphProgram, GraphFailure> {
    match compile_inner(rt, json, &[], donations) {
        Ok(p) => {
            if let Ok(mut s) = rt.graph_stats.lock() {
                s.compiled += 1;
                for k in &p.kernels {
                    *s.kernels.entry(k.clone()).or_default() += 1;
                }
            }
            Ok(GraphProgram { inner: p })
        }
        Err(e) => {
            if let Ok(mut s) = rt.graph_stats.lock() {
                s.lower_errors += 1;
            }
            Err(e)
        }
    }
}

#[pymethods]
impl GraphProgram {
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// A content fingerprint of the lowered module.
    #[getter]
    fn fingerprint(&self) -> &str {
        &self.inner.fingerprint
    }

    /// The lowered StableHLO text.
    #[getter]
    fn text(&self) -> &str {
        &self.inner.text
    }

    /// Registered kernels inlined as private functions, in graph order.
    #[getter]
    fn kernels(&self) -> Vec<String> {
        self.inner.kernels.clone()
    }

    /// The compile settings this program is tuned over and how its runs under each went (see
    /// `tuning_dict`); None for a program compiled one way (see `registry::tuning`).
    #[getter]
    fn tuning<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.inner.tuner.as_ref().map(|t| tuning_dict(py, &t.tuning())).transpose()
    }

    #[getter]
    fn input_types(&self) -> Vec<String> {
        short_types(&self.inner.inputs)
    }

    #[getter]
    fn output_types(&self) -> Vec<String> {
        short_types(&self.inner.outputs)
    }

    /// Runs the program on `tensors` (CPU torch tensors of the graph's input types, any
    /// strides: a tensor not laid out as the program reads it is gathered into a copy);
    /// returns one torch tensor (or DLPack capsule) per output. With `layout`, the inputs and
    /// outputs it names cross in a permuted order (see [`BoundaryLayout`]).
    #[pyo3(signature = (tensors, layout = None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        tensors: &Bound<'py, PyList>,
        layout: Option<PyRef<'py, BoundaryLayout>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let rt = runtime(py)?;
        let p = &self.inner;
        let imported = import_all(tensors)
            .map_err(|e| PyValueError::new_err(format!("graph `{}`: {e}", p.name)))?;
        if imported.len() != p.inputs.len() {
            return Err(PyValueError::new_err(format!(
                "graph `{}` takes {} inputs, got {}",
                p.name,
                p.inputs.len(),
                imported.len()
            )));
        }
        let layout = layout.as_deref();
        let start = Instant::now();
        let mut data: Vec<Cow<'_, [u8]>> = Vec::with_capacity(imported.len());
        for (i, (t, want)) in imported.iter().zip(&p.inputs).enumerate() {
            let order = layout.and_then(|l| l.inputs.get(i)).and_then(Option::as_deref);
            let identity: Vec<usize>;
            let order = match order {
                Some(o) => o,
                None => {
                    identity = (0..t.dims.len()).collect();
                    &identity
                }
            };
            let seen: Vec<u64> =
                order.iter().map(|&d| t.dims.get(d).copied().unwrap_or(-1) as u64).collect();
            if t.ty.dtype != want.dtype
                || order.len() != t.dims.len()
                || Shape::of(&seen) != want.shape
            {
                return Err(PyValueError::new_err(format!(
                    "graph `{}`: input {i} is {}{}, the graph takes {want}",
                    p.name,
                    t.ty,
                    if order.iter().enumerate().all(|(k, &d)| k == d) {
                        String::new()
                    } else {
                        format!(" read in dim order {order:?}")
                    }
                )));
            }
            data.push(t.ordered(order));
        }
        let gathered = data.iter().filter(|d| matches!(d, Cow::Owned(_))).count() as u64;
        // Donated inputs read in place (the tensor's own memory) take their output's value; one
        // read through a copy keeps its output as a program output.
        let loans: Vec<(usize, usize)> = p
            .donations
            .iter()
            .copied()
            .filter(|&(i, _)| matches!(data.get(i), Some(Cow::Borrowed(_))))
            .collect();
        if !loans.is_empty() || !p.pooled.is_empty() {
            let host: Vec<HostTensor<'_>> = data
                .iter()
                .zip(&p.inputs)
                .map(|(bytes, ty)| HostTensor { ty, data: bytes, contiguous: true })
                .collect();
            // SAFETY: each loaned input is a graph input that an in-place op updates and
            // nothing else in the graph reads (`_donations` in the backend), read here in
            // place: its tensor's own memory, which the caller hands over to be written, as
            // AOT autograd writes a mutated input after the graph runs.
            let run =
                unsafe { self.run_lent(rt, &host, &loans) }.map_err(PyRuntimeError::new_err)?;
            let api = tensors.iter().next().as_ref().and_then(exchange_api);
            let on_tpu = imported.iter().any(|t| t.on_tpu);
            let exported = PyList::empty(py);
            for (j, b) in run.outputs.into_iter().enumerate() {
                match b {
                    Some(b) => {
                        let order =
                            layout.and_then(|l| l.outputs.get(j)).and_then(Option::as_deref);
                        exported.append(export_buffer_as(py, b, api.as_ref(), order, on_tpu)?)?;
                    }
                    None => exported.append(py.None())?,
                }
            }
            self.count_run(rt, start, gathered, run.in_place, run.by_copy);
            return Ok(exported);
        }
        let mut buffers = Vec::with_capacity(imported.len());
        for (i, (bytes, want)) in data.iter().zip(&p.inputs).enumerate() {
            let buffer = upload_input_cached(&rt.views, rt.dispatcher.client(), want, bytes)
                .map_err(|e| PyTypeError::new_err(format!("graph `{}`: input {i}: {e}", p.name)))?;
            buffers.push(buffer);
        }
        let refs: Vec<&Buffer> = buffers.iter().map(|b| &**b).collect();
        if let Some(m) = fault::program_run(&p.name, &p.kernels) {
            return Err(PyRuntimeError::new_err(format!(
                "graph `{}`: execute failed: {m}",
                p.name
            )));
        }
        let (variant, executable, timed) = self.choose();
        let ran = Instant::now();
        let outputs = executable.execute(&refs);
        let outcome = outputs.as_ref().map(|_| ran.elapsed().as_secs_f64()).map_err(|_| ());
        self.tuned_run(rt, variant, timed, outcome);
        let outputs = outputs.map_err(|e| {
            PyRuntimeError::new_err(format!("graph `{}`: execute failed: {e}", p.name))
        })?;
        let api = tensors.iter().next().as_ref().and_then(exchange_api);
        let on_tpu = imported.iter().any(|t| t.on_tpu);
        let exported = PyList::empty(py);
        for (j, b) in outputs.into_iter().enumerate() {
            let order = layout.and_then(|l| l.outputs.get(j)).and_then(Option::as_deref);
            exported.append(export_buffer_as(py, b, api.as_ref(), order, on_tpu)?)?;
        }
        self.count_run(rt, start, gathered, 0, 0);
        Ok(exported)
    }

    fn __repr__(&self) -> String {
        format!(
            "GraphProgram({}, {} inputs, {} outputs, kernels={:?})",
            self.inner.name,
            self.inner.inputs.len(),
            self.inner.outputs.len(),
            self.inner.kernels
        )
    }
}

/// Why a graph did not become a program: `declined` when a node is one no kernel takes and
/// the default table does not lower (an op, or arguments, it does not cover), else a failure.
pub(crate) struct GraphFailure {
    pub(crate) declined: bool,
    pub(crate) message: String,
}

impl From<String> for GraphFailure {
    fn from(message: String) -> GraphFailure {
        GraphFailure { declined: false, message }
    }
}

/// A graph (the registry's JSON) lowered for `platform`: the graph, its module and the kernels
/// it inlined, in graph order. `refused` names kernels never to inline.
pub(crate) fn lower_graph(
    rt: &Runtime,
    json: &str,
    refused: &[String],
    platform: Platform,
) -> Result<(Graph, tpu_kernels::ir::Module, Vec<String>), GraphFailure> {
    lower_graph_sharded(rt, json, refused, platform, Vec::new()).map(|(g, m, k, _)| (g, m, k))
}

/// What became of the kernels a sharded program runs per shard: those that do (kernel names,
/// in graph order) and why others run whole.
#[derive(Debug, Default)]
pub(crate) struct ManualLowering {
    pub(crate) per_shard: Vec<String>,
    pub(crate) notes: Vec<String>,
}

/// [`lower_graph`] for a sharded program: the kernels `manual` names run per shard in a
/// manually sharded region; also returns why any of them runs whole instead.
pub(crate) fn lower_graph_sharded(
    rt: &Runtime,
    json: &str,
    refused: &[String],
    platform: Platform,
    manual: Vec<(String, ShardSpec)>,
) -> Result<(Graph, tpu_kernels::ir::Module, Vec<String>, ManualLowering), GraphFailure> {
    let graph = Graph::from_json(json).map_err(|e| e.to_string())?;
    let mut index = rt.dispatcher.registry().index();
    if !refused.is_empty() {
        // Kernels whose binding the caller refused (a schema mismatch) are never inlined.
        let kept = index.kernels().filter(|k| !refused.iter().any(|r| r == k.name())).cloned();
        index = Arc::new(Index::build(kept.collect()).map_err(|e| e.to_string())?);
    }
    let resolver = RecordingResolver {
        inner: IndexResolver::new(index, platform),
        used: RefCell::new(Vec::new()),
        manual,
        per_shard: RefCell::new(Vec::new()),
        notes: RefCell::new(Vec::new()),
    };
    let module = graph::lower(&graph, &resolver).map_err(|e| GraphFailure {
        declined: matches!(
            e,
            graph::LowerError::UnsupportedOp { .. } | graph::LowerError::BadArgs { .. }
        ),
        message: e.to_string(),
    })?;
    let kernels = resolver.used.into_inner().into_iter().map(|(_, k)| k).collect();
    let manual = ManualLowering {
        per_shard: resolver.per_shard.into_inner(),
        notes: resolver.notes.into_inner(),
    };
    Ok((graph, module, kernels, manual))
}

fn compile_inner(
    rt: &Runtime,
    json: &str,
    refused: &[String],
    donations: &[(usize, usize)],
) -> Result<Arc<ProgramInner>, GraphFailure> {
    let (graph, mut module, kernels) = lower_graph(rt, json, refused, rt.platform)?;
    if let Some(main) = module.functions.first_mut() {
        for &(input, output) in donations {
            let (Some(param), Some(result)) = (main.params.get(input), main.results.get(output))
            else {
                return Err(format!(
                    "donation of input {input} to output {output}: the program has {} inputs and \
                     {} outputs",
                    main.params.len(),
                    main.results.len()
                )
                .into());
            };
            if param != result {
                return Err(format!(
                    "donation of input {input} ({param}) to output {output} ({result}): the types differ"
                )
                .into());
            }
            main.param_attrs[input]
                .push(("tf.aliasing_output".to_owned(), format!("{output} : i32")));
        }
    }
    let text = module.to_text();
    // Outputs large enough to pool are written into the caching allocator's blocks, lent to
    // each run as extra parameters, as eager kernel calls do (fresh buffers of that size fault
    // their pages in on every run).
    let (text, pooled) = match rt
        .dispatcher
        .pool_outputs_min_bytes()
        .and_then(|min| with_pooled_outputs(&text, min))
    {
        Some((wrapped, outputs)) => (wrapped, outputs),
        None => (text, Vec::new()),
    };
    let program = Program::text(text.clone());
    let options = CompileOptions::new();
    let key = rt.cache.key(rt.dispatcher.client(), &program, &options);
    let cached = rt
        .cache
        .get_or_compile(rt.dispatcher.client(), &program, &options)
        .map_err(|e| format!("compile failed: {e}"))?;
    let main = module.main();
    let mut executables = vec![cached.executable];
    let mut tuner = None;
    let moved: usize = main
        .params
        .iter()
        .chain(&main.results)
        .map(|t| t.shape.num_elements().unwrap_or(0) as usize * t.dtype.byte_size())
        .sum();
    if rt.dispatcher.client().platform() == "cpu"
        && tuning::tune_min_bytes().is_some_and(|min| moved >= min)
    {
        // A large program is also compiled under the other settings and tuned on its runs;
        // a variant that does not compile is left out (the default stands).
        let mut labels = vec!["default"];
        for (label, variant) in tuning::cpu_variants(&options).into_iter().skip(1) {
            if let Ok(c) = rt.cache.get_or_compile(rt.dispatcher.client(), &program, &variant) {
                executables.push(c.executable);
                labels.push(label);
            }
        }
        if labels.len() > 1 {
            tuner = Some(Tuner::new(labels));
            if let Ok(mut s) = rt.graph_stats.lock() {
                s.programs_tuned += 1;
            }
        }
    }
    Ok(Arc::new(ProgramInner {
        name: graph.name.clone(),
        fingerprint: key.to_hex(),
        text,
        executables,
        tuner,
        inputs: main.params.clone(),
        outputs: main.results.clone(),
        kernels,
        donations: donations.to_vec(),
        pooled,
    }))
}

/// Lowers a graph (the registry's JSON format) to one StableHLO program with the registered
/// kernels inlined, compiles it (memoised on the exact graph text, then through the compile
/// cache) and returns it. A graph with a node no kernel takes and the default table does not
/// lower raises `LoweringDeclined` (a `ValueError`) naming the nodes; any other failure
/// `ValueError`.
/// `refused` names kernels never to inline (their bindings were refused). `donations`
/// (`(input, output)` pairs) mark inputs whose memory takes an output's value
/// (`tf.aliasing_output`): a run writes that output there (see [`GraphProgram::run`]).
#[pyfunction]
#[pyo3(signature = (json, refused = Vec::new(), donations = Vec::new()))]
fn compile_graph(
    py: Python<'_>,
    json: &str,
    refused: Vec<String>,
    donations: Vec<(usize, usize)>,
) -> PyResult<GraphProgram> {
    let rt = runtime(py)?;
    // Injected faults (tests only) change what a graph lowers to: their generation is part of
    // the key.
    let memo_key = format!(
        "{json}\nrefused:{}\ndonations:{donations:?}\nfaults:{}",
        refused.join(","),
        fault::generation()
    );
    if let Some(p) = rt.programs.lock().ok().and_then(|m| m.get(&memo_key).cloned()) {
        if let Ok(mut s) = rt.graph_stats.lock() {
            s.memo_hits += 1;
        }
        return Ok(GraphProgram { inner: p });
    }
    match compile_inner(rt, json, &refused, &donations) {
        Ok(p) => {
            if let Ok(mut s) = rt.graph_stats.lock() {
                s.compiled += 1;
                for k in &p.kernels {
                    *s.kernels.entry(k.clone()).or_default() += 1;
                }
            }
            if let Ok(mut m) = rt.programs.lock() {
                m.insert(memo_key, p.clone());
            }
            Ok(GraphProgram { inner: p })
        }
        Err(e) => {
            if let Ok(mut s) = rt.graph_stats.lock() {
                s.lower_errors += 1;
            }
            if e.declined {
                Err(crate::errors::raise(py, "LoweringDeclined", e.message))
            } else {
                Err(PyValueError::new_err(e.message))
            }
        }
    }
}

/// The op overloads a graph can lower: the default ATen table and every op a kernel binds.
#[pyfunction]
fn supported_ops(py: Python<'_>) -> PyResult<Vec<String>> {
    let rt = runtime(py)?;
    let mut ops: Vec<String> = graph::supported_ops().into_iter().map(str::to_owned).collect();
    ops.extend(rt.dispatcher.registry().index().ops());
    ops.sort();
    ops.dedup();
    Ok(ops)
}

// ----- kernel metadata -----

fn kind_name(kind: StaticKind) -> &'static str {
    match kind {
        StaticKind::Int => "int",
        StaticKind::Float => "float",
        StaticKind::Bool => "bool",
        StaticKind::Str => "str",
    }
}

/// Every kernel in the registry with what the Python side binds by: ops, tensor inputs,
/// statics `(name, kind, default)`, the schema argument names, bindings
/// `(name, position, "tensor"|"static", index)`, dtypes, platforms, backward, doc.
#[pyfunction]
fn kernels<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
    let rt = runtime(py)?;
    let out = PyList::empty(py);
    let index = rt.dispatcher.registry().index();
    let mut all: Vec<_> = index.kernels().cloned().collect();
    all.sort_by(|a, b| a.name().cmp(b.name()));
    for k in all {
        let r = &k.record;
        let d = PyDict::new(py);
        d.set_item("name", r.name)?;
        d.set_item("ops", k.ops.clone())?;
        d.set_item("inputs", r.inputs.to_vec())?;
        let statics: Vec<(&str, &str, Option<&str>)> =
            r.statics.iter().map(|p| (p.name, kind_name(p.kind), p.default)).collect();
        d.set_item("statics", statics)?;
        d.set_item("schema", r.schema.to_vec())?;
        let bindings: Vec<(&str, usize, &str, usize)> = r
            .bindings
            .iter()
            .map(|b| match b.kind {
                BindingKind::Tensor { index } => (b.name, b.position, "tensor", index),
                BindingKind::Static { index } => (b.name, b.position, "static", index),
            })
            .collect();
        d.set_item("bindings", bindings)?;
        d.set_item("dtypes", r.dtypes.iter().map(|t| t.short_name()).collect::<Vec<_>>())?;
        d.set_item("platforms", r.platforms.iter().map(|p| p.name()).collect::<Vec<_>>())?;
        d.set_item("priority", r.priority)?;
        d.set_item("backward", r.backward)?;
        d.set_item("mutates", r.mutates.to_vec())?;
        d.set_item("runtime", k.runtime)?;
        d.set_item("doc", r.doc)?;
        d.set_item("canonical", r.canonical.to_vec())?;
        out.append(d)?;
    }
    Ok(out)
}

/// The output types `[(dtype, dims)]` kernel `name` gives for inputs `[(dtype, dims)]` and
/// `statics`, from its output rule (building the module when the rule says so).
#[pyfunction]
fn output_types(
    py: Python<'_>,
    name: &str,
    inputs: Vec<(String, Vec<u64>)>,
    statics: &Bound<'_, PyList>,
) -> PyResult<Vec<(String, Vec<u64>)>> {
    let kernel = crate::registry_api::kernel_named(py, name)?;
    let mut types = Vec::with_capacity(inputs.len());
    for (dtype, dims) in &inputs {
        let d = DType::from_name(dtype).ok_or_else(|| {
            PyTypeError::new_err(format!("kernel `{name}`: unknown dtype `{dtype}`"))
        })?;
        types.push(TensorType::new(d, Shape::of(dims)));
    }
    let sig = KernelSignature { inputs: types, statics: statics_of(statics)? };
    let sig = kernel.complete_statics(sig).map_err(PyValueError::new_err)?;
    let outs = kernel
        .output_types(&sig)
        .map_err(|e| PyValueError::new_err(format!("kernel `{name}`: {e}")))?;
    Ok(outs
        .iter()
        .map(|t| (t.dtype.short_name().to_owned(), t.shape.static_dims().unwrap_or_default()))
        .collect())
}

/// The next tick of the clock that orders fallback records (the registry's), for fallbacks
/// the Python side decides, so `report()` can tell which of an op's records is the latest.
#[pyfunction]
fn next_fallback_seq() -> u64 {
    tpu_kernels_registry::dispatch::next_fallback_seq()
}

/// The counters: per-op eager calls, substitutions, fallbacks with reasons, kernels; kernel
/// time; compile-cache and graph-program counters.
#[pyfunction]
fn stats<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let rt = runtime(py)?;
    let s = rt.dispatcher.stats();
    let d = PyDict::new(py);
    let ops = PyDict::new(py);
    for (op, st) in &s.ops {
        let o = PyDict::new(py);
        o.set_item("calls", st.calls)?;
        o.set_item("substituted", st.substituted)?;
        o.set_item(
            "fallbacks",
            st.fallbacks.iter().map(|(k, v)| (*k, *v)).collect::<BTreeMap<_, _>>(),
        )?;
        o.set_item("last_fallback", st.last_fallback.clone())?;
        o.set_item("last_fallback_seq", st.last_fallback_seq)?;
        o.set_item("kernels", st.kernels.clone())?;
        o.set_item("updated_in_place", st.updated_in_place)?;
        o.set_item("updated_by_copy", st.updated_by_copy)?;
        o.set_item("outputs_pooled", st.outputs_pooled)?;
        o.set_item("outputs_pool_missed", st.outputs_pool_missed)?;
        ops.set_item(op, o)?;
    }
    d.set_item("ops", ops)?;
    d.set_item("kernel_time_s", s.kernel_time.as_secs_f64())?;
    d.set_item("prepare_time_s", s.prepare_time.as_secs_f64())?;
    d.set_item(
        "cpu_execution",
        if crate::runtime::cpu_async() { "worker thread" } else { "calling thread" },
    )?;
    let malloc = PyDict::new(py);
    match tpu_kernels_registry::pjrt::malloc_policy() {
        Some(policy) => {
            malloc.set_item("policy", policy.name())?;
            malloc.set_item("detail", policy.detail())?;
        }
        None => {
            malloc.set_item("policy", "pending")?;
            malloc.set_item("detail", "decided when the first PJRT CPU client is created")?;
        }
    }
    d.set_item("cpu_malloc", malloc)?;
    let compile_options = PyDict::new(py);
    if rt.dispatcher.client().platform() == "cpu" {
        let options = CompileOptions::new();
        for (name, value) in options.for_client(rt.dispatcher.client()).overrides() {
            match value {
                OptionOverride::Int(i) => compile_options.set_item(name, *i)?,
                OptionOverride::Bool(b) => compile_options.set_item(name, *b)?,
                OptionOverride::Str(s) => compile_options.set_item(name, s)?,
            }
        }
        if let Some(option) = interleave_policy().and_then(Result::ok).and_then(|p| p.llvm_option())
        {
            compile_options.set_item("xla_backend_extra_options", option)?;
        }
    }
    d.set_item("cpu_compile_options", compile_options)?;
    let c = rt.cache.stats();
    let cache = PyDict::new(py);
    cache.set_item("memory_hits", c.memory_hits)?;
    cache.set_item("disk_hits", c.disk_hits)?;
    cache.set_item("misses", c.misses)?;
    cache.set_item("compiles", c.compiles)?;
    cache.set_item("compile_errors", c.compile_errors)?;
    cache.set_item("untrusted", c.untrusted)?;
    cache.set_item("compile_time_s", c.compile_time.as_secs_f64())?;
    d.set_item("cache", cache)?;
    let g = PyDict::new(py);
    if let Ok(gs) = rt.graph_stats.lock() {
        g.set_item("compiled", gs.compiled)?;
        g.set_item("memo_hits", gs.memo_hits)?;
        g.set_item("runs", gs.runs)?;
        g.set_item("run_time_s", gs.run_nanos as f64 * 1e-9)?;
        g.set_item("inputs_gathered", gs.inputs_gathered)?;
        g.set_item("view_misses", rt.views.misses())?;
        g.set_item("inputs_updated_in_place", gs.inputs_updated_in_place)?;
        g.set_item("inputs_updated_by_copy", gs.inputs_updated_by_copy)?;
        g.set_item("outputs_pooled", gs.outputs_pooled)?;
        g.set_item("outputs_pool_missed", gs.outputs_pool_missed)?;
        g.set_item("lower_errors", gs.lower_errors)?;
        g.set_item("kernels", gs.kernels.clone())?;
        g.set_item("kernels_run", gs.kernels_run.clone())?;
        g.set_item("programs_tuned", gs.programs_tuned)?;
        let tuned = PyDict::new(py);
        for (name, t) in &gs.tuned {
            tuned.set_item(name, tuning_dict(py, t)?)?;
        }
        g.set_item("tuned", tuned)?;
    }
    d.set_item("graphs", g)?;
    Ok(d)
}

/// Static values of a kernel's defaults, parsed (`{name: value}`), for building op schemas.
#[pyfunction]
fn static_defaults<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
    let kernel = crate::registry_api::kernel_named(py, name)?;
    let d = PyDict::new(py);
    for p in kernel.record.statics {
        if let Some(text) = p.default {
            let v = StaticValue::parse(p.kind, text).map_err(|e| {
                PyValueError::new_err(format!("kernel `{name}`, static `{}`: {e}", p.name))
            })?;
            d.set_item(p.name, static_to_py(py, &v)?)?;
        }
    }
    Ok(d)
}

/// Identifies the registry's current index (it is swapped on every runtime registration or
/// removal): `(address, kernel count)`; a change means the kernel table must be reread.
#[pyfunction]
fn registry_generation(py: Python<'_>) -> PyResult<(usize, usize)> {
    let rt = runtime(py)?;
    let index = rt.dispatcher.registry().index();
    Ok((Arc::as_ptr(&index) as usize, index.len()))
}

/// Replaces the injected faults (tests only; see `tpu_kernels.testing.inject_fault`): each is
/// `nan:KERNEL`, `offset:KERNEL`, `lower`, `run` or `run:KERNEL`. Nothing changes when one of
/// them does not parse (`ValueError` naming it).
#[pyfunction]
fn set_faults(specs: Vec<String>) -> PyResult<()> {
    let faults = specs
        .iter()
        .map(|s| fault::Fault::parse(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(PyValueError::new_err)?;
    fault::set(faults);
    Ok(())
}

/// Bumped by every `set_faults`: programs cached above the registry (fused mode's traces) key
/// on it, as the graph memo does, so a fault injected later reaches them.
#[pyfunction]
fn fault_generation() -> usize {
    fault::generation()
}

/// The injected faults, as `set_faults` spells them.
#[pyfunction]
fn faults() -> Vec<String> {
    fault::current()
        .into_iter()
        .map(|f| match f {
            fault::Fault::Nan { kernel } => format!("nan:{kernel}"),
            fault::Fault::Offset { kernel } => format!("offset:{kernel}"),
            fault::Fault::LowerError => "lower".to_owned(),
            fault::Fault::RunError { kernel: Some(k) } => format!("run:{k}"),
            fault::Fault::RunError { kernel: None } => "run".to_owned(),
            other => format!("{other:?}"),
        })
        .collect()
}

/// Sets whether an error in a kernel or in this project's code raises
/// (`tpu_kernels.set_error_policy`); returns the previous setting.
#[pyfunction]
fn set_raise_errors(on: bool) -> bool {
    crate::errors::set_raise_errors(on)
}

/// Whether an error in a kernel or in this project's code raises rather than falls back.
#[pyfunction]
fn raise_errors() -> bool {
    crate::errors::raise_errors()
}

/// Adds the `torch_bridge` submodule to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let sub = PyModule::new(py, "torch_bridge")?;
    sub.add_function(wrap_pyfunction!(call, &sub)?)?;
    sub.add_function(wrap_pyfunction!(compile_graph, &sub)?)?;
    sub.add_function(wrap_pyfunction!(supported_ops, &sub)?)?;
    sub.add_function(wrap_pyfunction!(kernels, &sub)?)?;
    sub.add_function(wrap_pyfunction!(output_types, &sub)?)?;
    sub.add_function(wrap_pyfunction!(static_defaults, &sub)?)?;
    sub.add_function(wrap_pyfunction!(stats, &sub)?)?;
    sub.add_function(wrap_pyfunction!(next_fallback_seq, &sub)?)?;
    sub.add_function(wrap_pyfunction!(registry_generation, &sub)?)?;
    sub.add_function(wrap_pyfunction!(fault_generation, &sub)?)?;
    sub.add_function(wrap_pyfunction!(set_faults, &sub)?)?;
    sub.add_function(wrap_pyfunction!(faults, &sub)?)?;
    sub.add_function(wrap_pyfunction!(set_raise_errors, &sub)?)?;
    sub.add_function(wrap_pyfunction!(raise_errors, &sub)?)?;
    sub.add_class::<GraphProgram>()?;
    crate::sharded::register(&sub)?;
    sub.add_class::<BoundaryLayout>()?;
    sub.add_class::<crate::strict_mode::StrictDispatch>()?;
    sub.add_class::<crate::fused_mode::FusedDispatch>()?;
    sub.add_class::<crate::fused_mode::FusedRef>()?;
    sub.add_class::<crate::fused_mode::FusedInput>()?;
    m.add_submodule(&sub)?;
    Ok(())
}
