//! The Rust runtime behind the "tpu" device (`tpu_kernels.device`).
//!
//! The device's C++ shim (`device/src/shim.cpp`, the module `tpu_kernels._device`) adapts
//! PyTorch's PrivateUse1 interfaces and calls back into this module through one table of C
//! functions, [`TpukDeviceApi`] (its C declaration is `device/src/tpuk_device.h`), handed over
//! as a capsule by [`device_api`]. Everything the device decides is decided here:
//! - **memory**: the caching allocator [`HostPool`] of 64-byte aligned host blocks, reused by
//!   size class as PyTorch's allocators do; the PJRT CPU client reads them in place;
//! - **kernels at the key**: a bound op's call arrives as its boxed arguments ([`TpukArg`]), is
//!   bound to the op's plan (the variants the Python side computed from the kernels' bindings,
//!   [`device_plan`]), and runs through the bridge's dispatcher; the outputs are PJRT buffers
//!   whose host memory becomes the output tensors' storage (no copy). A call no kernel takes is
//!   declined (counted with its reason) and runs in the shim's CPU fallback;
//! - **fallback accounting**: every op that reached the fallback, by op.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};
use tpu_kernels::registration::StaticValue;
use tpu_kernels::{DType, Shape, TensorType};
use tpu_kernels_registry::host_pool::{HostBlock, HostPool};
use tpu_kernels_registry::pjrt::Buffer;
use tpu_kernels_registry::{DispatchError, HostTensor};

use crate::torch_bridge::{runtime, runtime_if_ready};

// ----- the C ABI (mirrors device/src/tpuk_device.h) -----

const ABI: u32 = 6;
const MAX_RANK: usize = 16;

pub(crate) const KIND_NONE: i32 = 0;
pub(crate) const KIND_TENSOR: i32 = 1;
pub(crate) const KIND_INT: i32 = 2;
pub(crate) const KIND_DOUBLE: i32 = 3;
pub(crate) const KIND_BOOL: i32 = 4;
pub(crate) const KIND_INT_LIST: i32 = 5;
pub(crate) const KIND_BOOL_LIST: i32 = 6;
pub(crate) const KIND_STRING: i32 = 7;
// Kinds only `record` is given (the shim reads them from the schema's argument types).
pub(crate) const KIND_DTYPE: i32 = 9;
pub(crate) const KIND_LAYOUT: i32 = 10;
pub(crate) const KIND_MEMORY_FORMAT: i32 = 11;
pub(crate) const KIND_DEVICE: i32 = 12;
pub(crate) const KIND_TENSOR_LIST: i32 = 13;

pub(crate) const ON_CPU: i32 = 0;
pub(crate) const ON_TPU: i32 = 1;
const ON_OTHER: i32 = 2;

const RAN: i32 = 0;
const DECLINED: i32 = 1;
const ERROR: i32 = 2;

/// One argument of a boxed op call.
#[repr(C)]
#[derive(Debug)]
pub struct TpukArg {
    pub(crate) kind: i32,
    pub(crate) dtype: i32,
    pub(crate) device: i32,
    pub(crate) len: i32,
    pub(crate) data: *const c_void,
    pub(crate) sizes: *const i64,
    pub(crate) strides: *const i64,
    pub(crate) i: i64,
    pub(crate) d: f64,
}

/// A dense tensor argument over `data` (for the shim's replay of a recorded call).
pub(crate) fn tensor_arg(
    dtype: i32,
    data: *const c_void,
    sizes: &[i64],
    strides: &[i64],
) -> TpukArg {
    TpukArg {
        kind: KIND_TENSOR,
        dtype,
        device: ON_TPU,
        len: sizes.len() as i32,
        data,
        sizes: sizes.as_ptr(),
        strides: strides.as_ptr(),
        i: 0,
        d: 0.0,
    }
}

/// One output of a kernel call, as the shim wraps it into a tensor.
#[repr(C)]
#[derive(Debug)]
pub struct TpukOut {
    data: *mut c_void,
    handle: *mut c_void,
    dtype: i32,
    ndim: i32,
    absent: i32,
    reserved: i32,
    sizes: [i64; MAX_RANK],
}

/// The table the shim calls.
#[repr(C)]
#[derive(Debug)]
pub struct TpukDeviceApi {
    abi: u32,
    size: u32,
    alloc: extern "C" fn(usize, *mut *mut c_void) -> *mut c_void,
    free: extern "C" fn(*mut c_void),
    call: extern "C" fn(u32, *const TpukArg, usize, *mut TpukOut, usize) -> i32,
    release: extern "C" fn(*mut c_void),
    fell_back: extern "C" fn(usize, *const c_char, usize),
    adopted: extern "C" fn(isize),
    mode: extern "C" fn() -> i32,
    finite: extern "C" fn(*const TpukArg, usize) -> i32,
    check: extern "C" fn(
        *const c_char,
        usize,
        i32,
        i32,
        *const TpukArg,
        usize,
        *const TpukArg,
        isize,
    ) -> i32,
    message: extern "C" fn(*mut c_char, usize) -> usize,
    record: extern "C" fn(
        usize,
        *const TpukArg,
        usize,
        *const TpukArg,
        usize,
        *mut TpukOut,
        usize,
        *const crate::recorder::TpukOpInfo,
        *mut c_void,
    ) -> i32,
    flush: extern "C" fn(*const c_char, usize) -> i32,
    retire: extern "C" fn(*mut c_void, extern "C" fn(*mut c_void)),
    connect: extern "C" fn(*const crate::recorder::TpukRecordHooks),
    scalar: extern "C" fn(*const TpukArg, *mut u8, usize) -> i32,
}

static API: TpukDeviceApi = TpukDeviceApi {
    abi: ABI,
    size: std::mem::size_of::<TpukDeviceApi>() as u32,
    alloc: api_alloc,
    free: api_free,
    call: api_call,
    release: api_release,
    fell_back: api_fell_back,
    adopted: api_adopted,
    mode: api_mode,
    finite: api_finite,
    check: api_check,
    message: api_message,
    record: api_record,
    flush: crate::recorder::api_flush,
    retire: crate::recorder::api_retire,
    connect: crate::recorder::api_connect,
    scalar: api_scalar,
};

thread_local! {
    /// The calling thread's last error, for the shim to raise.
    static MESSAGE: RefCell<String> = const { RefCell::new(String::new()) };
}

pub(crate) fn set_message(m: String) {
    MESSAGE.with(|cell| *cell.borrow_mut() = m);
}

extern "C" fn api_message(buf: *mut c_char, cap: usize) -> usize {
    MESSAGE.with(|cell| {
        let m = cell.borrow();
        let n = m.len().min(cap);
        if n > 0 && !buf.is_null() {
            // SAFETY: the shim passes a buffer writable for `cap` bytes; `n <= cap`.
            unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), buf.cast::<u8>(), n) };
        }
        m.len()
    })
}

// ----- c10 ScalarType codes -----

/// `DType` of a c10 `ScalarType` code (None: no kernel takes that type).
pub(crate) fn dtype_of_code(code: i32) -> Option<DType> {
    Some(match code {
        0 => DType::U8,
        1 => DType::I8,
        2 => DType::I16,
        3 => DType::I32,
        4 => DType::I64,
        5 => DType::F16,
        6 => DType::F32,
        7 => DType::F64,
        11 => DType::Bool,
        15 => DType::BF16,
        23 => DType::F8E5M2,
        24 => DType::F8E4M3FN,
        28 => DType::U32,
        _ => return None,
    })
}

pub(crate) fn code_of_dtype(dtype: DType) -> Option<i32> {
    Some(match dtype {
        DType::U8 => 0,
        DType::I8 => 1,
        DType::I16 => 2,
        DType::I32 => 3,
        DType::I64 => 4,
        DType::F16 => 5,
        DType::F32 => 6,
        DType::F64 => 7,
        DType::Bool => 11,
        DType::BF16 => 15,
        DType::F8E5M2 => 23,
        DType::F8E4M3FN => 24,
        DType::U32 => 28,
        _ => return None,
    })
}

/// torch's name of a `ScalarType` code without `torch.`, as kernels read dtype statics.
pub(crate) fn dtype_name_of_code(code: i64) -> Option<&'static str> {
    Some(match code {
        0 => "uint8",
        1 => "int8",
        2 => "int16",
        3 => "int32",
        4 => "int64",
        5 => "float16",
        6 => "float32",
        7 => "float64",
        8 => "complex32",
        9 => "complex64",
        10 => "complex128",
        11 => "bool",
        15 => "bfloat16",
        23 => "float8_e5m2",
        24 => "float8_e4m3fn",
        27 => "uint16",
        28 => "uint32",
        29 => "uint64",
        _ => return None,
    })
}

// ----- memory -----

/// The bytes of allocator blocks the device's tensors hold (placeholders included), kept apart
/// from [`Held`]: a free changes it without a lock.
static POOL_HELD: AtomicUsize = AtomicUsize::new(0);

/// Device memory by where it came from, live bytes: the allocator's blocks (size-class bytes),
/// kernel outputs (PJRT buffers whose memory became tensors: `outputs` the runtime allocated,
/// `pooled_outputs` written into the allocator's blocks), fallback results (blocks of
/// PyTorch's CPU allocator the device adopted); and the peak of their sum.
/// `peak_reserved` is the peak of the allocator's reserved bytes (pooled outputs included)
/// plus the runtime's outputs and the adopted results.
#[derive(Debug, Default)]
struct Held {
    outputs: usize,
    pooled_outputs: usize,
    adopted: usize,
    peak: usize,
    peak_reserved: usize,
}

impl Held {
    fn live(&self) -> usize {
        POOL_HELD.load(Ordering::Relaxed) + self.outputs + self.pooled_outputs + self.adopted
    }
}

static HELD: Mutex<Held> =
    Mutex::new(Held { outputs: 0, pooled_outputs: 0, adopted: 0, peak: 0, peak_reserved: 0 });

fn held(f: impl FnOnce(&mut Held)) {
    // Read without the allocator's lock, which is never held inside this one.
    let reserved = HostPool::global().reserved();
    let mut h = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    f(&mut h);
    h.peak = h.peak.max(h.live());
    h.peak_reserved = h.peak_reserved.max(reserved + h.outputs + h.adopted);
}

extern "C" fn api_adopted(bytes: isize) {
    held(|h| h.adopted = h.adopted.saturating_add_signed(bytes));
}

/// Says once, on the device's first use, which PJRT platform backs it (`TPUK_QUIET=1`: never).
fn announce() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        if std::env::var("TPUK_QUIET").is_ok_and(|v| v == "1") {
            return;
        }
        let platform = runtime_if_ready().map(|rt| rt.dispatcher.platform().name()).unwrap_or("?");
        let what = if platform == "cpu" { " (the XLA CPU plugin: no TPU in use)" } else { "" };
        eprintln!("[tpu_kernels] tpu device: PJRT platform '{platform}'{what}");
        let spin_set = ["GOMP_SPINCOUNT", "OMP_WAIT_POLICY"].iter().any(|k| std::env::var_os(k).is_some());
        if platform == "cpu" && !spin_set {
            eprintln!(
                "[tpu_kernels] torch's OpenMP workers spin after each parallel op and share the cores \
                 of the kernels that follow: set GOMP_SPINCOUNT={OPENMP_SPIN_COUNT} before starting \
                 Python, or import tpu_kernels before torch"
            );
        }
    });
}

extern "C" fn api_alloc(n: usize, ctx: *mut *mut c_void) -> *mut c_void {
    announce();
    match HostPool::global().allocate(n) {
        Ok(block) => {
            let size = block.size();
            held(|_| {
                POOL_HELD.fetch_add(size, Ordering::Relaxed);
            });
            let data = block.as_ptr().cast::<c_void>();
            // SAFETY: the shim passes a valid out-pointer.
            unsafe { *ctx = Box::into_raw(Box::new(block)).cast() };
            data
        }
        Err(e) => {
            set_message(e.to_string());
            std::ptr::null_mut()
        }
    }
}

/// Takes back an owner this module boxed for one of the shim's DataPtrs (a pool block, a kernel
/// output): `None` for a null context.
///
/// # Safety
/// `ctx` is null or the `Box<T>` handed to the shim with a DataPtr, whose deleter calls this
/// exactly once, when the storage dies.
unsafe fn reclaim<T>(ctx: *mut c_void) -> Option<Box<T>> {
    // SAFETY: the caller's contract: a `Box<T>` leaked for this DataPtr, reclaimed once.
    (!ctx.is_null()).then(|| unsafe { Box::from_raw(ctx.cast::<T>()) })
}

extern "C" fn api_free(ctx: *mut c_void) {
    // SAFETY: the context of a pool block's DataPtr is the `Box<HostBlock>` `api_alloc` made.
    let Some(block) = (unsafe { reclaim::<HostBlock>(ctx) }) else { return };
    crate::recorder::free_or_defer(*block);
}

/// Gives a block of the allocator back (counted).
pub(crate) fn free_block(block: HostBlock) {
    let size = block.size();
    // A decrease sets no peak: no lock of its own.
    let _ = POOL_HELD
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n.saturating_sub(size)));
    HostPool::global().free(block);
}

// ----- kernel outputs -----

/// What owns an output tensor's memory: a kernel's PJRT buffer, or a block of the allocator
/// the native recorder handed out as a placeholder.
enum Owner {
    Buffer(Counted),
    Placeholder(crate::recorder::Placeholder),
}

/// A PJRT buffer whose memory a device tensor holds (a kernel's or a graph program's output),
/// counted as device memory from its making to its drop.
pub(crate) struct Counted(Buffer);

impl Counted {
    pub(crate) fn new(buffer: Buffer) -> Counted {
        let size = buffer.byte_size();
        if buffer.is_zero_copy() {
            held(|h| h.pooled_outputs += size);
        } else {
            held(|h| h.outputs += size);
        }
        Counted(buffer)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let size = self.0.byte_size();
        if self.0.is_zero_copy() {
            held(|h| h.pooled_outputs = h.pooled_outputs.saturating_sub(size));
        } else {
            held(|h| h.outputs = h.outputs.saturating_sub(size));
        }
    }
}

extern "C" fn api_release(handle: *mut c_void) {
    // SAFETY: an output's handle is the `Box<Owner>` `fill_output` or `fill_placeholder` made.
    let Some(owner) = (unsafe { reclaim::<Owner>(handle) }) else { return };
    match *owner {
        Owner::Buffer(b) => crate::recorder::drop_or_defer(Box::new(b)),
        Owner::Placeholder(p) => crate::recorder::release_placeholder(p),
    }
}

/// Hands a placeholder (a block nothing has written yet) to the shim as an output of `ty`.
pub(crate) fn fill_placeholder(
    out: &mut TpukOut,
    ty: &TensorType,
    p: crate::recorder::Placeholder,
) {
    // A recorded value's dims are static (the signature fixed them).
    let dims = &ty.shape.0;
    out.dtype = code_of_dtype(ty.dtype).unwrap_or(-1);
    out.ndim = dims.len() as i32;
    out.absent = 0;
    out.reserved = 0;
    for (k, d) in dims.iter().enumerate().take(MAX_RANK) {
        out.sizes[k] = d.as_static().unwrap_or(0) as i64;
    }
    out.data = p.0.as_ptr().cast();
    let size = p.0.size();
    held(|_| {
        POOL_HELD.fetch_add(size, Ordering::Relaxed);
    });
    out.handle = Box::into_raw(Box::new(Owner::Placeholder(p))).cast();
}

// ----- plans -----

/// A static argument slot: its name, position, and whether torch passes it as a dtype.
#[derive(Debug)]
struct StaticSlot {
    name: &'static str,
    position: usize,
    is_dtype: bool,
}

#[derive(Debug)]
struct Variant {
    tensors: Vec<usize>,
    statics: Vec<StaticSlot>,
    absent: Vec<usize>,
}

/// How calls of one bound op go.
#[derive(Debug)]
enum Plan {
    Kernels {
        key: String,
        variants: Vec<Variant>,
        /// Position of the op's `bool[]` output mask, when the kernels do not bind it.
        output_mask: Option<usize>,
        /// Strided inputs are gathered into contiguous ones.
        copy_strided: bool,
        /// Bound tensors the kernels update in place, in output order (an op like
        /// `tpuk::adamw_step`, whose schema writes them): their memory is lent to the kernel.
        lent: Vec<usize>,
    },
    /// Every call declines with this reason (the op's kernels were removed, or their binding
    /// refused).
    Declined { key: String, category: &'static str, reason: String },
}

#[derive(Debug, Default)]
struct Plans {
    by_key: HashMap<String, u32>,
    plans: Vec<Arc<Plan>>,
}

static PLANS: std::sync::LazyLock<RwLock<Plans>> =
    std::sync::LazyLock::new(|| RwLock::new(Plans::default()));

fn plan_of(op: u32) -> Option<Arc<Plan>> {
    let plans = PLANS.read().unwrap_or_else(PoisonError::into_inner);
    plans.plans.get(op as usize).cloned()
}

// ----- the kernel path -----

struct BoundCall<'a> {
    key: &'a str,
    tensors: Vec<&'a TpukArg>,
    statics: Vec<(&'static str, StaticValue)>,
}

/// The static value of argument `a`, or why it cannot be one.
fn static_of(a: &TpukArg, slot: &StaticSlot) -> Result<Option<StaticValue>, String> {
    Ok(Some(match a.kind {
        KIND_NONE => return Ok(None),
        KIND_INT if slot.is_dtype => {
            let name = dtype_name_of_code(a.i)
                .ok_or_else(|| format!("static `{}` is an unknown dtype (#{})", slot.name, a.i))?;
            StaticValue::Str(name.to_owned())
        }
        KIND_INT => StaticValue::Int(a.i),
        KIND_BOOL => StaticValue::Bool(a.i != 0),
        KIND_DOUBLE => StaticValue::Float(a.d),
        KIND_STRING => {
            let bytes = if a.i == 0 || a.data.is_null() {
                &[][..]
            } else {
                // SAFETY: the shim passes the string's bytes and length, alive for the call.
                unsafe { std::slice::from_raw_parts(a.data.cast::<u8>(), a.i as usize) }
            };
            StaticValue::Str(String::from_utf8_lossy(bytes).into_owned())
        }
        _ => {
            return Err(format!(
                "static `{}` is not a bool, int, float, str or dtype (kernels take no lists)",
                slot.name
            ));
        }
    }))
}

fn bind<'a>(
    key: &'a str,
    variants: &[Variant],
    args: &'a [TpukArg],
) -> Result<BoundCall<'a>, String> {
    let mut reasons: Vec<String> = Vec::new();
    'variants: for v in variants {
        for &p in &v.absent {
            if args.get(p).is_some_and(|a| a.kind != KIND_NONE) {
                reasons.push(format!("argument {p} is given; a variant's kernels do not take it"));
                continue 'variants;
            }
        }
        let mut tensors = Vec::with_capacity(v.tensors.len());
        for &p in &v.tensors {
            match args.get(p) {
                Some(a) if a.kind == KIND_TENSOR => tensors.push(a),
                _ => {
                    reasons.push(format!("argument {p} is not a tensor"));
                    continue 'variants;
                }
            }
        }
        let mut statics = Vec::with_capacity(v.statics.len());
        for s in &v.statics {
            let Some(a) = args.get(s.position) else {
                reasons.push(format!("static `{}` is missing", s.name));
                continue 'variants;
            };
            match static_of(a, s) {
                Ok(Some(value)) => statics.push((s.name, value)),
                Ok(None) => {}
                Err(m) => {
                    reasons.push(m);
                    continue 'variants;
                }
            }
        }
        return Ok(BoundCall { key, tensors, statics });
    }
    reasons.dedup();
    Err(reasons.join("; "))
}

/// A tensor argument's elements as the kernel reads them: in place when dense row-major, a
/// gathered copy when `gather` allows it, else why not.
enum Elements<'a> {
    InPlace(&'a [u8]),
    Gathered(Vec<u8>),
}

impl Elements<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Elements::InPlace(b) => b,
            Elements::Gathered(v) => v,
        }
    }
}

struct Input<'a> {
    ty: TensorType,
    elements: Elements<'a>,
}

fn input<'a>(i: usize, a: &'a TpukArg, gather: bool) -> Result<Input<'a>, String> {
    if a.device != ON_TPU {
        return Err(format!("input {i} is not a tpu tensor"));
    }
    let dtype = dtype_of_code(a.dtype).ok_or_else(|| {
        format!("input {i} has a dtype (ScalarType #{}) no kernel takes", a.dtype)
    })?;
    let rank = a.len as usize;
    let (sizes, strides) = if rank == 0 {
        (&[][..], &[][..])
    } else {
        // SAFETY: the shim passes the tensor's sizes and strides arrays of `len` entries.
        unsafe {
            (std::slice::from_raw_parts(a.sizes, rank), std::slice::from_raw_parts(a.strides, rank))
        }
    };
    let dims: Vec<u64> = sizes.iter().map(|&d| d as u64).collect();
    let numel: usize = sizes.iter().map(|&d| d.max(0) as usize).product();
    let esize = dtype.byte_size();
    let ty = TensorType::new(dtype, Shape::of(&dims));
    if numel == 0 || a.data.is_null() {
        return Ok(Input { ty, elements: Elements::InPlace(&[]) });
    }
    if crate::tensor::row_major(sizes, Some(strides)) {
        // SAFETY: a dense row-major tensor: its `numel` elements are the bytes from its first
        // element on, inside its storage, which the boxed stack keeps alive for the call.
        let bytes = unsafe { std::slice::from_raw_parts(a.data.cast::<u8>(), numel * esize) };
        return Ok(Input { ty, elements: Elements::InPlace(bytes) });
    }
    if !gather {
        return Err(format!("input {i} is strided (strides {strides:?} for sizes {sizes:?})"));
    }
    // SAFETY: sizes and strides describe elements inside the tensor's storage (PyTorch's
    // invariant for a tensor), which the boxed stack keeps alive for the call.
    let gathered = unsafe { crate::tensor::gather(a.data.cast::<u8>(), sizes, strides, esize) };
    Ok(Input { ty, elements: Elements::Gathered(gathered) })
}

fn call(op: u32, args: &[TpukArg], outs: &mut [TpukOut]) -> i32 {
    announce();
    let Some(rt) = runtime_if_ready() else {
        set_message("the tpu device's runtime is not started".to_owned());
        return ERROR;
    };
    let Some(plan) = plan_of(op) else {
        set_message(format!("the tpu device has no op #{op}"));
        return ERROR;
    };
    let (key, variants, output_mask, copy_strided, lent) = match &*plan {
        Plan::Declined { key, category, reason } => {
            return decline(key, category, reason.clone());
        }
        Plan::Kernels { key, variants, output_mask, copy_strided, lent } => {
            (key.as_str(), variants, *output_mask, *copy_strided, lent)
        }
    };
    let bound = match bind(key, variants, args) {
        Ok(b) => b,
        Err(why) => {
            return decline(key, "bad_input", format!("arguments bind no kernel: {why}"));
        }
    };
    let mut inputs = Vec::with_capacity(bound.tensors.len());
    for (i, a) in bound.tensors.iter().enumerate() {
        match input(i, a, copy_strided) {
            Ok(t) => inputs.push(t),
            Err(why) => return decline(key, "bad_input", why),
        }
    }
    if let Some(&i) = lent
        .iter()
        .find(|&&i| !matches!(inputs.get(i).map(|t| &t.elements), Some(Elements::InPlace(_))))
    {
        return decline(key, "bad_input", format!("input {i}, updated in place, is strided"));
    }
    let host: Vec<HostTensor<'_>> = inputs
        .iter()
        .map(|t| HostTensor { ty: &t.ty, data: t.elements.bytes(), contiguous: true })
        .collect();
    let result = if lent.is_empty() {
        rt.dispatcher.call(bound.key, &host, &bound.statics)
    } else {
        // SAFETY: the lent inputs are the op's written arguments (its schema says so), dense
        // tensors read in place: their storage, which the boxed stack keeps alive and nothing
        // else touches during the call.
        unsafe { rt.dispatcher.call_in_place(bound.key, &host, &bound.statics, lent) }
    };
    let buffers = match result {
        Ok(b) => b,
        Err(DispatchError::Fallback(f))
            if f.reason.is_error() && (crate::errors::raise_errors() || mode() == MODE_DEBUG) =>
        {
            set_message(f.to_string());
            return ERROR;
        }
        Err(DispatchError::Forbidden(f)) => {
            set_message(format!("fallback forbidden: {f}"));
            return ERROR;
        }
        // Counted by the dispatcher.
        Err(_) => return DECLINED,
    };
    if mode() == MODE_DEBUG {
        let sig = tpu_kernels::registration::KernelSignature {
            inputs: inputs.iter().map(|t| t.ty.clone()).collect(),
            statics: bound.statics.clone(),
        };
        let contiguous = vec![true; inputs.len()];
        let meta = tpu_kernels_registry::CallMeta {
            sig: &sig,
            contiguous: &contiguous,
            platform: rt.dispatcher.platform(),
        };
        let kernel = rt
            .dispatcher
            .registry()
            .select(&tpu_kernels_registry::normalize_op(key), &meta)
            .ok()
            .map(|k| k.name().to_owned());
        LAST_KERNEL.with(|c| *c.borrow_mut() = kernel);
    }
    if buffers.len() != outs.len() {
        set_message(format!(
            "`{key}`: the kernel returned {} outputs where the op has {}",
            buffers.len(),
            outs.len()
        ));
        return ERROR;
    }
    let mask: Option<Vec<bool>> = output_mask.and_then(|p| args.get(p)).and_then(|a| {
        if a.kind != KIND_BOOL_LIST || a.data.is_null() {
            return None;
        }
        // SAFETY: the shim passes a bool list as `len` bytes alive for the call.
        let bytes = unsafe { std::slice::from_raw_parts(a.data.cast::<u8>(), a.len as usize) };
        Some(bytes.iter().map(|&b| b != 0).collect())
    });
    for (k, (buffer, out)) in buffers.into_iter().zip(outs.iter_mut()).enumerate() {
        *out = TpukOut {
            data: std::ptr::null_mut(),
            handle: std::ptr::null_mut(),
            dtype: 0,
            ndim: 0,
            absent: 0,
            reserved: 0,
            sizes: [0; MAX_RANK],
        };
        if mask.as_ref().is_some_and(|m| m.get(k) == Some(&false)) {
            out.absent = 1;
            continue;
        }
        if let Err(m) = fill_output(key, k, buffer, out) {
            set_message(m);
            return ERROR;
        }
    }
    RAN
}

/// Hands `buffer` to the shim as output `k`: its host address, its type and dims, and the
/// boxed buffer as the owner the shim releases.
fn fill_output(key: &str, k: usize, buffer: Buffer, out: &mut TpukOut) -> Result<(), String> {
    let dims = buffer.dims();
    if dims.len() > MAX_RANK {
        return Err(format!("`{key}`: output {k} has rank {} (at most {MAX_RANK})", dims.len()));
    }
    out.dtype = tpu_kernels_registry::dispatch::dtype_of(buffer.element_type())
        .and_then(code_of_dtype)
        .ok_or_else(|| format!("`{key}`: output {k} has a type torch has no dtype for"))?;
    out.ndim = dims.len() as i32;
    out.sizes[..dims.len()].copy_from_slice(dims);
    let data = if buffer.byte_size() == 0 {
        NonNull::<u64>::dangling().as_ptr().cast::<c_void>()
    } else {
        buffer
            .read_in_place(|bytes| bytes.as_ptr())
            .map_err(|e| format!("`{key}`: reading output {k}: {e}"))?
            .cast_mut()
            .cast::<c_void>()
    };
    out.data = data;
    out.handle = Box::into_raw(Box::new(Owner::Buffer(Counted::new(buffer)))).cast();
    Ok(())
}

extern "C" fn api_call(
    op: u32,
    args: *const TpukArg,
    nargs: usize,
    outs: *mut TpukOut,
    nouts: usize,
) -> i32 {
    let result =
        catch_unwind(AssertUnwindSafe(|| call(op, args_of(args, nargs), outs_of(outs, nouts))));
    result.unwrap_or_else(|_| {
        set_message(format!("internal error: the tpu device's call of op #{op} panicked"));
        ERROR
    })
}

#[allow(clippy::too_many_arguments)]
extern "C" fn api_record(
    key: usize,
    args: *const TpukArg,
    nargs: usize,
    into: *const TpukArg,
    ninto: usize,
    outs: *mut TpukOut,
    nouts: usize,
    info: *const crate::recorder::TpukOpInfo,
    call: *mut c_void,
) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let outs = outs_of(outs, nouts);
        crate::recorder::api_record(
            key,
            args_of(args, nargs),
            args_of(into, ninto),
            outs,
            info,
            call,
        )
    }));
    result.unwrap_or_else(|_| {
        set_message("internal error: the tpu device's recorder panicked".to_owned());
        ERROR
    })
}

/// `TpukDeviceApi::scalar`: see [`crate::recorder::scalar_read`].
extern "C" fn api_scalar(arg: *const TpukArg, out: *mut u8, len: usize) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(|| {
        if arg.is_null() || out.is_null() {
            return Ok(false);
        }
        // SAFETY: the shim passes one argument and a buffer of `len` bytes for the answer.
        let (arg, out) = unsafe { (&*arg, std::slice::from_raw_parts_mut(out, len)) };
        crate::recorder::scalar_read(arg, out)
    }));
    match result {
        Ok(Ok(true)) => RAN,
        Ok(Ok(false)) => DECLINED,
        Ok(Err(m)) => {
            set_message(format!("tpu fused mode: {m}"));
            ERROR
        }
        Err(_) => {
            set_message("internal error: the tpu device's scalar read panicked".to_owned());
            ERROR
        }
    }
}

// ----- accounting -----

/// Calls that ran in the CPU fallback, and calls of bound ops the device declined before the
/// dispatcher saw them (the dispatcher counts its own).
#[derive(Debug, Default)]
struct Counts {
    /// Operator handle address -> index in `fell_back`.
    by_handle: HashMap<usize, usize>,
    fell_back: Vec<(String, u64)>,
    /// Op -> category -> (count, last message, clock tick).
    declined: HashMap<String, HashMap<&'static str, (u64, String, u64)>>,
}

static COUNTS: Mutex<Option<Counts>> = Mutex::new(None);

fn with_counts<R>(f: impl FnOnce(&mut Counts) -> R) -> R {
    let mut guard = COUNTS.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(Counts::default))
}

extern "C" fn api_fell_back(key: usize, name: *const c_char, len: usize) {
    with_counts(|c| {
        if let Some(&i) = c.by_handle.get(&key) {
            c.fell_back[i].1 += 1;
            return;
        }
        let text = if name.is_null() || len == 0 {
            String::from("?")
        } else {
            // SAFETY: the shim passes the op's name, `len` bytes alive for the call.
            let bytes = unsafe { std::slice::from_raw_parts(name.cast::<u8>(), len) };
            String::from_utf8_lossy(bytes).into_owned()
        };
        c.by_handle.insert(key, c.fell_back.len());
        c.fell_back.push((text, 1));
    });
}

/// Counts a call of a bound op the device declined before the dispatcher saw it.
fn decline(key: &str, category: &'static str, message: String) -> i32 {
    let seq = tpu_kernels_registry::dispatch::next_fallback_seq();
    let message = format!("`{key}` falls back on the tpu device: {message}");
    with_counts(|c| {
        let per = match c.declined.get_mut(key) {
            Some(p) => p,
            None => c.declined.entry(key.to_owned()).or_default(),
        };
        let e = per.entry(category).or_insert((0, String::new(), 0));
        e.0 += 1;
        e.1 = message;
        e.2 = seq;
    });
    DECLINED
}

// ----- modes -----

const MODE_STRICT: i32 = 0;
const MODE_DEBUG: i32 = 1;
const MODE_FUSED: i32 = 2;
/// Fused mode with the native recorder (`crate::recorder`).
const MODE_RECORD: i32 = 3;

static MODE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(MODE_STRICT);

fn mode() -> i32 {
    MODE.load(std::sync::atomic::Ordering::Relaxed)
}

extern "C" fn api_mode() -> i32 {
    mode()
}

thread_local! {
    /// The kernel the calling thread's last call ran (debug mode names it).
    static LAST_KERNEL: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// (NaN, Inf) counts of a floating tensor argument's elements (zero for anything else).
fn non_finite(a: &TpukArg) -> (u64, u64) {
    if a.kind != KIND_TENSOR || a.data.is_null() || a.device == ON_OTHER {
        return (0, 0);
    }
    let Some(dtype) = dtype_of_code(a.dtype) else { return (0, 0) };
    // (element bytes, exponent mask, mantissa mask), little-endian bit patterns.
    let (esize, exp, man): (usize, u64, u64) = match dtype {
        DType::F32 => (4, 0x7F80_0000, 0x007F_FFFF),
        DType::F64 => (8, 0x7FF0_0000_0000_0000, 0x000F_FFFF_FFFF_FFFF),
        DType::F16 => (2, 0x7C00, 0x03FF),
        DType::BF16 => (2, 0x7F80, 0x007F),
        _ => return (0, 0),
    };
    let rank = a.len as usize;
    // SAFETY: the shim passes the tensor's sizes and strides arrays of `len` entries.
    let (sizes, strides) = unsafe {
        if rank == 0 {
            (&[][..], &[][..])
        } else {
            (std::slice::from_raw_parts(a.sizes, rank), std::slice::from_raw_parts(a.strides, rank))
        }
    };
    let numel: usize = sizes.iter().map(|&d| d.max(0) as usize).product();
    let gathered;
    let bytes: &[u8] = if crate::tensor::row_major(sizes, Some(strides)) {
        // SAFETY: a dense row-major tensor's `numel` elements are the bytes from its first
        // element on, inside its storage, alive for the call (the shim holds the tensor).
        unsafe { std::slice::from_raw_parts(a.data.cast::<u8>(), numel * esize) }
    } else {
        // SAFETY: sizes and strides describe elements inside the tensor's storage, alive for
        // the call (PyTorch's invariant; the shim holds the tensor).
        gathered = unsafe { crate::tensor::gather(a.data.cast::<u8>(), sizes, strides, esize) };
        &gathered
    };
    let (mut nan, mut inf) = (0u64, 0u64);
    for chunk in bytes.chunks_exact(esize) {
        let mut raw = [0u8; 8];
        raw[..esize].copy_from_slice(chunk);
        let bits = u64::from_le_bytes(raw);
        if bits & exp == exp {
            if bits & man == 0 {
                inf += 1;
            } else {
                nan += 1;
            }
        }
    }
    (nan, inf)
}

/// The shim's `n` writable outputs at `ptr`.
fn outs_of<'a>(ptr: *mut TpukOut, n: usize) -> &'a mut [TpukOut] {
    if n == 0 || ptr.is_null() {
        &mut []
    } else {
        // SAFETY: the shim passes `n` writable outputs alive for the call.
        unsafe { std::slice::from_raw_parts_mut(ptr, n) }
    }
}

fn args_of<'a>(ptr: *const TpukArg, n: usize) -> &'a [TpukArg] {
    if n == 0 || ptr.is_null() {
        &[]
    } else {
        // SAFETY: the shim passes `n` initialised arguments alive for the call.
        unsafe { std::slice::from_raw_parts(ptr, n) }
    }
}

extern "C" fn api_finite(args: *const TpukArg, n: usize) -> i32 {
    let args = args_of(args, n);
    let finite = catch_unwind(AssertUnwindSafe(|| {
        args.iter().all(|a| match a.kind {
            KIND_DOUBLE => a.d.is_finite(),
            _ => non_finite(a) == (0, 0),
        })
    }));
    i32::from(finite.unwrap_or(true))
}

fn dims_of(a: &TpukArg) -> &[i64] {
    if a.kind != KIND_TENSOR || a.len == 0 || a.sizes.is_null() {
        return &[];
    }
    // SAFETY: the shim passes the tensor's `len` sizes, alive for the call.
    unsafe { std::slice::from_raw_parts(a.sizes, a.len as usize) }
}

fn describe(a: &TpukArg) -> String {
    if a.kind != KIND_TENSOR {
        return "None".to_owned();
    }
    let dtype = dtype_name_of_code(i64::from(a.dtype)).unwrap_or("?");
    format!("{dtype}{:?}", dims_of(a))
}

/// Ops whose outputs are uninitialised memory (never checked for NaN).
const UNINITIALISED: [&str; 5] =
    ["aten::empty", "aten::new_empty", "aten::_empty", "aten::resize", "aten::set_"];

/// `(op, output)` pairs whose dtype on PyTorch's CPU kernel (which kernels follow) is the
/// inputs' 16-bit type where the meta function says f32 (`_bindings.CPU_KEEPS_INPUT_DTYPE`).
static CPU_KEEPS_INPUT_DTYPE: RwLock<Vec<(String, usize)>> = RwLock::new(Vec::new());

fn check(
    name: &str,
    kernel: bool,
    inputs_finite: bool,
    outs: &[TpukArg],
    expected: Option<&[TpukArg]>,
) -> Result<(), String> {
    let who = if kernel {
        let k = LAST_KERNEL.with(|c| c.borrow().clone()).unwrap_or_else(|| "?".to_owned());
        format!("{name} (kernel {k})")
    } else {
        format!("{name} (no kernel: PyTorch's CPU kernel on the device)")
    };
    let compare = kernel || name.starts_with("aten::");
    if let Some(expected) = expected.filter(|_| compare) {
        if expected.len() != outs.len() {
            return Err(format!("{who}: {} outputs, the op gives {}", outs.len(), expected.len()));
        }
        for (i, (o, e)) in outs.iter().zip(expected).enumerate() {
            if (o.kind == KIND_TENSOR) != (e.kind == KIND_TENSOR) {
                return Err(format!(
                    "{who}: output {i} is {}, the op gives {}",
                    describe(o),
                    describe(e)
                ));
            }
            if o.kind != KIND_TENSOR {
                continue;
            }
            let (od, ed) = (dims_of(o), dims_of(e));
            let empty = |d: &[i64]| d.contains(&0);
            if !kernel && (empty(od) || empty(ed)) {
                continue;
            }
            let quirk = kernel
                && o.dtype != e.dtype
                && matches!(o.dtype, 5 | 15)
                && CPU_KEEPS_INPUT_DTYPE
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .any(|(k, j)| k == name && *j == i);
            if od != ed || (o.dtype != e.dtype && !quirk) {
                return Err(format!(
                    "{who}: output {i} is {}, the op gives {}",
                    describe(o),
                    describe(e)
                ));
            }
        }
    }
    if inputs_finite && !UNINITIALISED.iter().any(|p| name.starts_with(p)) {
        for (i, o) in outs.iter().enumerate() {
            let (nan, inf) = non_finite(o);
            if nan > 0 {
                return Err(format!(
                    "{who}: output {i} has {nan} NaN and {inf} Inf values from finite inputs"
                ));
            }
            if inf > 0 {
                // Often meant (a log of zero): reported once per op and line, as
                // `substitute("debug")` does, not raised.
                warn_inf(
                    &format!("{who}: output {i} has {inf} Inf values from finite inputs"),
                    name,
                )?;
            }
        }
    }
    Ok(())
}

/// Inf from finite inputs: a `RuntimeWarning` once per op and user line (an error when a
/// warnings filter turns it into one).
fn warn_inf(message: &str, op: &str) -> Result<(), String> {
    static WARNED: Mutex<Option<std::collections::HashSet<(String, String)>>> = Mutex::new(None);
    let line = user_line().unwrap_or_default();
    {
        let mut warned = WARNED.lock().unwrap_or_else(PoisonError::into_inner);
        if !warned.get_or_insert_with(Default::default).insert((op.to_owned(), line.clone())) {
            return Ok(());
        }
    }
    let at = if line.is_empty() { String::new() } else { format!(" (at {line})") };
    let text =
        format!("tpu debug mode: {message}{at}; debug mode reports this once per op and line");
    let c_text = std::ffi::CString::new(text.clone()).unwrap_or_default();
    Python::try_attach(|py| {
        let warning = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
        // Raised as the check's error, which adds the prefix and the line itself.
        PyErr::warn(py, &warning, &c_text, 1).map_err(|_| message.to_owned())
    })
    .unwrap_or(Ok(()))
}

/// `file:line` of the innermost Python frame outside torch and tpu_kernels, when there is one.
fn user_line() -> Option<String> {
    Python::try_attach(|py| {
        let modes = py.import("tpu_kernels.torch.modes").ok()?;
        let line = modes.getattr("_user_line").ok()?.call0().ok()?;
        line.extract::<String>().ok()
    })
    .flatten()
}

#[allow(clippy::too_many_arguments)]
extern "C" fn api_check(
    name: *const c_char,
    len: usize,
    kernel: i32,
    inputs_finite: i32,
    outs: *const TpukArg,
    nouts: usize,
    expected: *const TpukArg,
    nexpected: isize,
) -> i32 {
    let name = if name.is_null() || len == 0 {
        String::from("?")
    } else {
        // SAFETY: the shim passes the op's name, `len` bytes alive for the call.
        String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(name.cast::<u8>(), len) })
            .into_owned()
    };
    let outs = args_of(outs, nouts);
    let expected = usize::try_from(nexpected).ok().map(|n| args_of(expected, n));
    let result = catch_unwind(AssertUnwindSafe(|| {
        check(&name, kernel != 0, inputs_finite != 0, outs, expected)
    }));
    match result {
        Ok(Ok(())) => RAN,
        Ok(Err(m)) => {
            let at = user_line().map(|l| format!(" (at {l})")).unwrap_or_default();
            set_message(format!("tpu debug mode: {m}{at}"));
            ERROR
        }
        Err(_) => {
            set_message(format!("internal error: the tpu debug check of {name} panicked"));
            ERROR
        }
    }
}

// ----- Python API -----

static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the "tpu" device runs on this runtime: its tensors (DLPack's extension device) are
/// then host memory the bridge reads in place.
pub(crate) fn installed() -> bool {
    INSTALLED.load(std::sync::atomic::Ordering::Relaxed)
}

/// The table the shim calls, as a capsule for `tpu_kernels._device.install`; starts the
/// runtime (the PJRT client) first, so the device's calls never start it.
#[pyfunction]
pub(crate) fn device_api(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    runtime(py)?;
    INSTALLED.store(true, std::sync::atomic::Ordering::Relaxed);
    let ptr = NonNull::from(&API).cast::<c_void>();
    // SAFETY: `API` is a `'static` table, valid for the capsule's (and the process's) life.
    unsafe { PyCapsule::new_with_pointer(py, ptr, c"tpu_kernels._native.device_api") }
}

/// Records how calls of op `key` go on the device and returns its id (the same id for the same
/// op on every call). `plan` is `(variants, output_mask, copy_strided, lent)` with variants as
/// `[(tensor_positions, [(static, position, is_dtype)], absent_positions)]`, or
/// `(category, reason)` for an op whose every call declines.
#[pyfunction]
pub(crate) fn device_plan(key: &str, plan: &Bound<'_, PyAny>) -> PyResult<u32> {
    type VariantSpec = (Vec<usize>, Vec<(String, usize, bool)>, Vec<usize>);
    let parsed = if let Ok((variants, output_mask, copy_strided, lent)) =
        plan.extract::<(Vec<VariantSpec>, Option<usize>, bool, Vec<usize>)>()
    {
        Plan::Kernels {
            key: key.to_owned(),
            variants: variants
                .into_iter()
                .map(|(tensors, statics, absent)| Variant {
                    tensors,
                    statics: statics
                        .into_iter()
                        .map(|(name, position, is_dtype)| StaticSlot {
                            name: crate::intern::intern(&name),
                            position,
                            is_dtype,
                        })
                        .collect(),
                    absent,
                })
                .collect(),
            output_mask,
            copy_strided,
            lent,
        }
    } else if let Ok((category, reason)) = plan.extract::<(String, String)>() {
        let category = match category.as_str() {
            "schema_refused" => "schema_refused",
            "no_kernel" => "no_kernel",
            other => {
                return Err(PyValueError::new_err(format!("unknown decline category `{other}`")));
            }
        };
        Plan::Declined { key: key.to_owned(), category, reason }
    } else {
        return Err(PyValueError::new_err(format!("not a device plan for `{key}`: {plan}")));
    };
    let mut plans = PLANS.write().unwrap_or_else(PoisonError::into_inner);
    let plan = Arc::new(parsed);
    if let Some(&id) = plans.by_key.get(key) {
        plans.plans[id as usize] = plan;
        return Ok(id);
    }
    let id = u32::try_from(plans.plans.len())
        .map_err(|_| PyValueError::new_err("too many ops bound on the device"))?;
    plans.plans.push(plan);
    plans.by_key.insert(key.to_owned(), id);
    Ok(id)
}

/// Sets the device's eager mode: "strict", "debug", "fused" (recorded in Python, above the
/// device) or "fused_native" (recorded here, at the key). Leaving "fused_native" runs what was
/// recorded first.
#[pyfunction]
pub(crate) fn device_set_mode(mode: &str) -> PyResult<()> {
    let m = match mode {
        "strict" => MODE_STRICT,
        "debug" => MODE_DEBUG,
        "fused" => MODE_FUSED,
        "fused_native" => MODE_RECORD,
        other => {
            return Err(PyValueError::new_err(format!(
                "mode must be 'strict', 'debug', 'fused' or 'fused_native', not {other:?}"
            )));
        }
    };
    if m != MODE_RECORD {
        crate::recorder::materialise("mode change")
            .map_err(pyo3::exceptions::PyRuntimeError::new_err)?;
    }
    MODE.store(m, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Runs what the native recorder holds (`torch.tpu.synchronize()` in its mode); `reason` is
/// counted as the materialisation point.
#[pyfunction]
pub(crate) fn device_flush(py: Python<'_>, reason: &str) -> PyResult<()> {
    py.detach(|| crate::recorder::materialise(reason))
        .map_err(pyo3::exceptions::PyRuntimeError::new_err)
}

/// The outputs whose CPU dtype keeps the inputs' 16-bit type (see `CPU_KEEPS_INPUT_DTYPE`).
#[pyfunction]
pub(crate) fn device_cpu_keeps_input_dtype(pairs: Vec<(String, usize)>) {
    *CPU_KEEPS_INPUT_DTYPE.write().unwrap_or_else(PoisonError::into_inner) = pairs;
}

/// Asks libtpu for a TPU client and says what it answered: why no TPU can back the device here.
/// (On a TPU VM the client is created; running the device on it is the TPU execution seam
/// ARCHITECTURE.md describes, not built yet, which the answer says.)
#[pyfunction]
pub(crate) fn device_tpu_probe(py: Python<'_>) -> String {
    py.detach(|| match crate::runtime::libtpu() {
        Err(e) => format!("libtpu cannot be loaded: {e}"),
        Ok(plugin) => {
            match tpu_kernels_registry::pjrt::Client::new(
                &plugin,
                tpu_kernels_registry::pjrt::ClientOptions::new(),
            ) {
                Err(e) => format!("libtpu found no TPU: {e}"),
                Ok(client) => format!(
                    "libtpu opened {} TPU device(s), but the tpu device does not execute on them yet                      (ARCHITECTURE.md: the TPU execution seam)",
                    client.devices().len()
                ),
            }
        }
    })
}

/// The device's counters: the allocator's, the fallback's (op -> calls) and the calls the
/// kernel path declined before the dispatcher saw them (op -> category -> (count, last
/// message, clock tick)).
#[pyfunction]
pub(crate) fn device_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let s = HostPool::global().stats();
    let (live, outputs, pooled_outputs, adopted, peak, peak_reserved) = {
        let h = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        (h.live(), h.outputs, h.pooled_outputs, h.adopted, h.peak, h.peak_reserved)
    };
    let mem = PyDict::new(py);
    // Every byte tensors on the device hold, whoever allocated it.
    mem.set_item("allocated_bytes", live)?;
    mem.set_item("peak_allocated_bytes", peak)?;
    mem.set_item("reserved_bytes", s.reserved + outputs + adopted)?;
    mem.set_item("peak_reserved_bytes", peak_reserved.max(s.reserved + outputs + adopted))?;
    mem.set_item("kernel_output_bytes", outputs + pooled_outputs)?;
    mem.set_item("kernel_output_pooled_bytes", pooled_outputs)?;
    mem.set_item("fallback_result_bytes", adopted)?;
    // The caching allocator's own figures.
    mem.set_item("pool_allocated_bytes", s.allocated)?;
    mem.set_item("pool_peak_allocated_bytes", s.peak_allocated)?;
    mem.set_item("pool_reserved_bytes", s.reserved)?;
    mem.set_item("pool_peak_reserved_bytes", s.peak_reserved)?;
    mem.set_item("cached_bytes", s.cached)?;
    mem.set_item("cache_limit_bytes", s.limit)?;
    mem.set_item("allocs", s.allocs)?;
    mem.set_item("frees", s.frees)?;
    mem.set_item("cache_hits", s.cache_hits)?;
    mem.set_item("system_allocs", s.system_allocs)?;
    mem.set_item("system_frees", s.system_frees)?;
    mem.set_item("ooms", s.ooms)?;
    d.set_item("memory", mem)?;
    let fell = PyDict::new(py);
    let declined = PyDict::new(py);
    {
        let guard = COUNTS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = guard.as_ref() {
            for (op, n) in &c.fell_back {
                fell.set_item(op, n)?;
            }
            for (op, cats) in &c.declined {
                let per = PyDict::new(py);
                for (cat, (n, last, seq)) in cats {
                    per.set_item(*cat, (*n, last, *seq))?;
                }
                declined.set_item(op, per)?;
            }
        }
    }
    d.set_item("fallbacks", fell)?;
    d.set_item("declined", declined)?;
    let (st, entries, pending) = crate::recorder::stats();
    let rec = PyDict::new(py);
    rec.set_item("recorded", st.recorded)?;
    rec.set_item("pending", pending)?;
    rec.set_item("flushes", st.flushes)?;
    rec.set_item("programs_run", st.programs_run)?;
    rec.set_item("outputs_written", st.outputs_written)?;
    rec.set_item("reasons", st.reasons.into_iter().collect::<HashMap<_, _>>())?;
    rec.set_item("hits", st.hits)?;
    rec.set_item("misses", st.misses)?;
    rec.set_item("entries", entries)?;
    rec.set_item("signatures", st.signatures)?;
    rec.set_item("meta_runs", st.meta_runs)?;
    rec.set_item("declined", st.declined.into_iter().collect::<HashMap<_, _>>())?;
    rec.set_item("evictions", st.evictions)?;
    rec.set_item("last_eviction", st.last_eviction)?;
    rec.set_item("replays", st.replays)?;
    rec.set_item("replayed_calls", st.replayed_calls)?;
    rec.set_item("limit_replays", st.limit_replays)?;
    rec.set_item("last_limit", st.last_limit)?;
    rec.set_item("scalar_reads", st.scalar_reads)?;
    rec.set_item("scalar_read_calls", st.scalar_read_calls)?;
    rec.set_item("recompile_limit", crate::recorder::recompile_limit())?;
    // Estimated from the timed calls: their mean time, times the calls recorded.
    let per_call = st.record_nanos as f64 / st.record_timed.max(1) as f64;
    rec.set_item("record_time_s", per_call * st.recorded as f64 / 1e9)?;
    rec.set_item("record_timed_calls", st.record_timed)?;
    rec.set_item("record_timed_s", st.record_nanos as f64 / 1e9)?;
    rec.set_item("flush_time_s", st.flush_nanos as f64 / 1e9)?;
    rec.set_item("run_time_s", st.run_nanos as f64 / 1e9)?;
    rec.set_item("compile_time_s", st.compile_nanos as f64 / 1e9)?;
    d.set_item("recorder", rec)?;
    Ok(d)
}

/// Returns the allocator's cached blocks to the system (`torch.tpu.empty_cache()`).
#[pyfunction]
pub(crate) fn device_empty_cache() {
    HostPool::global().empty_cache();
}

/// Resets the allocator's peaks to the current figures.
#[pyfunction]
pub(crate) fn device_reset_peaks() {
    HostPool::global().reset_peaks();
    let reserved = HostPool::global().stats().reserved;
    let mut h = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    h.peak = h.live();
    h.peak_reserved = reserved + h.outputs + h.adopted;
}

/// The spin `import tpu_kernels` gives torch's OpenMP workers (libgomp's `GOMP_SPINCOUNT`
/// rounds) when it is imported before torch; see `tpu_kernels._openmp`.
pub(crate) const OPENMP_SPIN_COUNT: u32 = 5000;

pub(crate) fn register(m: &pyo3::Bound<'_, PyModule>) -> PyResult<()> {
    m.add("OPENMP_SPIN_COUNT", OPENMP_SPIN_COUNT)?;
    m.add_function(wrap_pyfunction!(device_api, m)?)?;
    m.add_function(wrap_pyfunction!(device_plan, m)?)?;
    m.add_function(wrap_pyfunction!(device_stats, m)?)?;
    m.add_function(wrap_pyfunction!(device_tpu_probe, m)?)?;
    m.add_function(wrap_pyfunction!(device_set_mode, m)?)?;
    m.add_function(wrap_pyfunction!(device_flush, m)?)?;
    m.add_function(wrap_pyfunction!(device_cpu_keeps_input_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(device_empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(device_reset_peaks, m)?)?;
    Ok(())
}
