//! The "tpu" device's native fused recorder (fused mode with `recorder="native"`).
//!
//! In this mode the shim hands each op call on the device to [`record`] before running it:
//! the kernels at the key and the boxed fallback alike. A call the recorder takes is not run:
//! its outputs are placeholders, tensors over blocks of the caching allocator that nothing has
//! written yet, and the call joins the pending trace. At a materialisation point (a call the
//! recorder declines, a copy to the host, `.item()` of a value not known exactly (see
//! [`scalar_read`]), the bridge importing a device tensor,
//! `torch.tpu.synchronize()`, a change of mode) [`flush`] lowers the trace to one graph program
//! through the same graph lowering the compiled path uses, and runs it with the memory of each
//! placeholder still referenced lent to the program as that output's destination: a placeholder
//! a user holds is filled in place, one nobody holds is never written. A value written back
//! over an input's memory (an optimizer's update) is written there by the program, the input
//! donated ([`Recorder::written_over_inputs`]).
//!
//! - **Output types** come from the op's meta function, which the shim runs only when this
//!   module asks for them ([`NEED_TYPES`]): once per op and argument signature (the types and
//!   static values of the arguments), cached with the verdict of lowering that one call as a
//!   graph of one node. A signature that does not lower is declined from then on, with its
//!   reason, so a trace always lowers.
//! - **Arguments**: a tensor whose memory is a placeholder's block, with the placeholder's
//!   dtype and element count, is that recorded value (a reshape of it when its dims differ);
//!   any other view of pending memory is declined (the shim flushes, then runs the call as
//!   strict mode does). Device memory not pending is a program input, read in place at the
//!   flush; while a trace is pending, memory an input reads does not go back to the allocator
//!   or to PJRT (its free is deferred to the flush's end: blocks, kernel and graph outputs,
//!   adopted fallback results), so an input freed before the flush keeps its bytes. Integer indices on the CPU in an index list are copied into a program input at the
//!   call ([`cpu_indices`]). The `self` of an op that takes only its type ([`SHAPE_ONLY_SELF`]: `x.zero_()`
//!   into fresh memory) is not read: the program gets zeros, and its memory goes back at once. Memory that only recorded calls wrote goes back when its storage dies.
//! - **The trace cache**: each recorded call appends its signature's id and its arguments'
//!   references to the trace's key; the flush adds which values are live. A key seen before
//!   runs its compiled program with no graph built, lowered or compiled.
//! - **Failures**: a program that fails to run is evicted (its key never served again) and the
//!   trace replays call by call on PyTorch's CPU kernels through the shim, which kept each
//!   recorded call's operator and non-tensor arguments.
//! - **The recompile limit**: a trace whose shapes keep changing (a mixture of experts' routing
//!   gives each expert a new token count every step) would compile a program at each miss. Each
//!   trace also has a structure, a hash of its calls and how they connect without their types;
//!   once [`recompile_limit`] programs were compiled for one structure, a miss of it replays on
//!   PyTorch instead of compiling, as Dynamo's `recompile_limit` sends a frame back to eager.
//!
//! Recording is process-wide behind one lock: the autograd engine records backward calls from
//! its own thread.

use std::collections::{BTreeMap, HashMap};

use rustc_hash::FxHashMap;
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tpu_kernels::{DType, Dim, Shape, TensorType};
use tpu_kernels_registry::HostTensor;
use tpu_kernels_registry::graph::{Arg, Graph, Input, Node, TensorRef};
use tpu_kernels_registry::host_pool::{HostBlock, HostPool};

use crate::device::{
    self, KIND_BOOL, KIND_BOOL_LIST, KIND_DEVICE, KIND_DOUBLE, KIND_DTYPE, KIND_INT, KIND_INT_LIST,
    KIND_LAYOUT, KIND_MEMORY_FORMAT, KIND_NONE, KIND_STRING, KIND_TENSOR, KIND_TENSOR_LIST, ON_TPU,
    TpukArg, TpukOut,
};
use crate::torch_bridge::{GraphProgram, Runtime, runtime_if_ready};

/// `record`'s answers (the first three are `call`'s).
pub(crate) const RECORDED: i32 = 0;
pub(crate) const DECLINED: i32 = 1;
pub(crate) const ERROR: i32 = 2;
/// The output-type cache has no entry for this signature: call again with the op's info.
pub(crate) const NEED_TYPES: i32 = 3;

/// Programs the trace cache keeps (least recently used dropped first).
const TRACE_CACHE_SIZE: usize = 64;

/// What the shim says of an op the first time a signature of it is recorded (`TpukOpInfo`).
#[repr(C)]
#[derive(Debug)]
pub struct TpukOpInfo {
    /// `ns::op.overload`.
    name: *const c_char,
    name_len: usize,
    /// The schema's argument names, each followed by `\n`.
    arg_names: *const c_char,
    arg_names_len: usize,
    /// The meta function's outputs (TPUK_NONE for an undefined one); `nexpected < 0` when the
    /// op has no meta function.
    expected: *const TpukArg,
    nexpected: isize,
}

/// The shim's side of recording (`TpukRecordHooks`): it keeps each recorded call's operator and
/// non-tensor arguments, replays one on PyTorch's CPU kernels, and drops what it kept.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TpukRecordHooks {
    /// Keeps the call `call` (the context `record` was given) and returns what it kept.
    keep: extern "C" fn(*mut c_void) -> *mut c_void,
    /// Runs a kept call with its tensor arguments (in stack order) over the memory `tensors`
    /// describe, writing its outputs into `outs` (dense, row-major). TPUK_RAN, or TPUK_ERROR
    /// with the error's text in the buffer.
    replay: extern "C" fn(
        *mut c_void,
        *const TpukArg,
        usize,
        *const TpukArg,
        usize,
        *mut c_char,
        usize,
    ) -> i32,
    drop: extern "C" fn(*mut c_void),
}

/// The shim's hooks table (static in the shim), once connected.
static HOOKS: std::sync::atomic::AtomicPtr<TpukRecordHooks> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

pub(crate) extern "C" fn api_connect(hooks: *const TpukRecordHooks) {
    HOOKS.store(hooks.cast_mut(), Ordering::Release);
}

fn hooks() -> Option<TpukRecordHooks> {
    // SAFETY: null, or the shim's static table, valid for the process's life.
    unsafe { HOOKS.load(Ordering::Acquire).as_ref() }.copied()
}

/// Whether a trace is pending: frees wait for the flush while it is.
static PENDING: AtomicBool = AtomicBool::new(false);

/// An op, as the recorder knows it.
#[derive(Debug)]
struct OpInfo {
    name: String,
    arg_names: Vec<String>,
    /// The op reads only its first argument's type, not its bytes (see [`SHAPE_ONLY_SELF`]).
    shape_only_self: bool,
}

/// Ops whose result takes only the type of `self` (argument 0), never its elements: the
/// functional forms of `zero_`, `fill_` and `copy_` (the in-place call's destination), and the
/// `_like` and `new_` creators. `x = torch.empty(..); x.zero_()` records `zero(x)` into `x`:
/// `x`'s memory is then no program input, so its free during the trace is not deferred to the
/// flush (strict mode's peak memory), and the program never reads its stale bytes.
const SHAPE_ONLY_SELF: &[&str] = &[
    "aten::zero.default",
    "aten::fill.Scalar",
    "aten::fill.Tensor",
    "aten::copy.default",
    "aten::zeros_like.default",
    "aten::ones_like.default",
    "aten::full_like.default",
    "aten::empty_like.default",
    "aten::new_zeros.default",
    "aten::new_ones.default",
    "aten::new_full.default",
    "aten::new_empty.default",
];

/// What the cache says of one signature.
#[derive(Debug)]
enum Verdict {
    /// `lifted`: the float arguments the program takes as zero-dim inputs of `outputs[0]`'s
    /// dtype (every other float is a constant, its value part of the trace's key).
    Records {
        id: i64,
        op: Arc<OpInfo>,
        outputs: Vec<TensorType>,
        lifted: Vec<usize>,
    },
    Declines {
        op: String,
        reason: String,
    },
}

/// Where a value's bytes are.
#[derive(Debug, Clone, Copy)]
enum Home {
    /// A placeholder's block (its start).
    Block(usize),
    /// A reshape or permute of another value (the same bytes).
    Alias(usize),
    /// A permute of an input (the input's bytes).
    Input(usize),
}

#[derive(Debug)]
struct Value {
    /// `(node, output)` in the trace.
    node: usize,
    out: usize,
    ty: TensorType,
    home: Home,
    /// Still referenced (a placeholder whose storage has not died).
    live: bool,
    /// Where a replay writes it when not densely at its home: the sizes and strides of the
    /// view of a pending value a call wrote it into.
    view: Option<(Vec<i64>, Vec<i64>)>,
    /// Its placeholder died and its block went back to the allocator (a replay computes it
    /// into scratch memory).
    freed: bool,
}

/// A device tensor argument: the value the graph reads (`graph`: a reshape or permute of
/// `base` where its dims differ), and the argument's geometry over `base`'s memory (for replay).
#[derive(Debug, Clone)]
struct ArgRef {
    graph: Ref,
    base: Ref,
    /// Empty for a pending value taken whole (its own dims, row-major: see `geometry`) and for
    /// a 0-dim argument.
    sizes: Vec<i64>,
    strides: Vec<i64>,
    /// Bytes from `base`'s first element to the argument's.
    offset: usize,
}

#[derive(Debug)]
struct RecNode {
    op: Arc<OpInfo>,
    args: Vec<Arg>,
    /// What each device tensor argument refers to: one entry per argument (None for one that
    /// is not a device tensor), but one per entry of a tensor list.
    refs: Vec<Option<ArgRef>>,
    /// The value of each output.
    outs: Vec<usize>,
    /// What the shim kept of the call (None for a reshape the recorder added).
    kept: Option<Kept>,
}

#[derive(Debug, Clone, Copy)]
enum Ref {
    Value(usize),
    Input(usize),
    /// A lifted float (`Recorder::lifted`).
    Lifted(usize),
}

/// A kept call, dropped through the shim's hook.
#[derive(Debug)]
struct Kept(*mut c_void);

// SAFETY: the shim's kept call is plain data (an operator handle and IValues without tensors),
// used under the recorder's lock.
unsafe impl Send for Kept {}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(h) = hooks() {
            (h.drop)(self.0);
        }
    }
}

#[derive(Debug)]
struct ExtInput {
    addr: usize,
    ty: TensorType,
    bytes: usize,
    /// A strided input (not dense in any order): its element sizes and strides, gathered into a
    /// dense copy at the flush.
    gather: Option<(Vec<i64>, Vec<i64>)>,
    /// Only its type is used (the `self` of a [`SHAPE_ONLY_SELF`] op): the program is given
    /// zeros of its size, and its memory may be freed and reused before the flush. Holds the
    /// bytes its view spans, which a replay's call gets as scratch memory.
    unread: Option<usize>,
}

/// A free waiting for the flush.
enum Deferred {
    Block(HostBlock),
    Drop(*mut c_void, extern "C" fn(*mut c_void)),
    Owned(Box<dyn Send>),
}

// SAFETY: a deferred drop is the shim's deleter of memory the device owns; it runs once, on
// whichever thread flushes.
unsafe impl Send for Deferred {}

impl Deferred {
    fn run(self) {
        match self {
            Deferred::Block(b) => device::free_block(b),
            Deferred::Drop(ctx, f) => f(ctx),
            Deferred::Owned(b) => drop(b),
        }
    }
}

struct Entry {
    program: GraphProgram,
    /// The program's donations: `(input, output)`.
    loans: Vec<(usize, usize)>,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Stats {
    pub(crate) recorded: u64,
    pub(crate) flushes: u64,
    pub(crate) programs_run: u64,
    pub(crate) outputs_written: u64,
    pub(crate) reasons: BTreeMap<String, u64>,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) signatures: u64,
    pub(crate) meta_runs: u64,
    pub(crate) declined: BTreeMap<String, (u64, String)>,
    pub(crate) evictions: u64,
    pub(crate) last_eviction: String,
    pub(crate) replays: u64,
    pub(crate) replayed_calls: u64,
    /// Time in `record` of the timed calls (one in [`RECORD_TIMED_EVERY`]), and their count.
    pub(crate) record_nanos: u64,
    pub(crate) record_timed: u64,
    pub(crate) flush_nanos: u64,
    /// Of `flush_nanos`: running programs (PJRT), and lowering and compiling them.
    pub(crate) run_nanos: u64,
    pub(crate) compile_nanos: u64,
    /// Misses replayed on PyTorch because their structure reached the recompile limit.
    pub(crate) limit_replays: u64,
    pub(crate) last_limit: String,
    /// Scalar reads answered without a flush ([`scalar_read`]), and the calls they replayed.
    pub(crate) scalar_reads: u64,
    pub(crate) scalar_read_calls: u64,
}

/// Programs compiled for one trace structure before its later misses replay instead:
/// `TPUK_FUSED_RECOMPILE_LIMIT`, else 8 (Dynamo's default `recompile_limit`).
pub(crate) fn recompile_limit() -> u32 {
    static LIMIT: std::sync::LazyLock<u32> = std::sync::LazyLock::new(|| {
        std::env::var("TPUK_FUSED_RECOMPILE_LIMIT")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(8)
    });
    *LIMIT
}

/// `h` with `x` folded in (the structure hash of a trace).
fn fold(h: u64, x: u64) -> u64 {
    (h.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95)
}

#[derive(Default)]
struct Recorder {
    ops: HashMap<usize, Arc<OpInfo>>,
    sigs: FxHashMap<Vec<i64>, Arc<Verdict>>,
    // The pending trace.
    nodes: Vec<RecNode>,
    values: Vec<Value>,
    inputs: Vec<ExtInput>,
    /// The row-major inputs read whole, by address: their index in `inputs`.
    whole_inputs: FxHashMap<usize, usize>,
    /// Lifted floats and CPU indices: their type and where their bytes are in `lifted_bytes`
    /// (program inputs after `inputs`).
    lifted: Vec<(TensorType, std::ops::Range<usize>)>,
    /// The lifted inputs' bytes, each starting a slot of its own. The arena keeps its memory
    /// from trace to trace, so a step's lifted inputs sit where the last step's did and find
    /// their PJRT views in the runtime's view cache: a float lifted at each step (a bias
    /// correction, say) otherwise got a fresh 4-byte allocation, and a new view, every run.
    lifted_bytes: Vec<LiftSlot>,
    /// Zeros, the bytes of the inputs only a type is taken of: kept from trace to trace (never
    /// written, only grown), so that their views are found again as the lifted inputs' are.
    zero_slots: Vec<LiftSlot>,
    /// Placeholder blocks of the pending trace: start -> (end, value).
    blocks: BTreeMap<usize, (usize, usize)>,
    /// Reshapes and permutes already recorded: (what, kind, params) -> value.
    derivations: FxHashMap<(i64, Derive, Vec<i64>), usize>,
    /// The last call's signature, its memory reused by the next.
    sig_scratch: Vec<i64>,
    /// The last call's output destinations, emptied, its memory reused by the next.
    dest_scratch: Vec<Dest>,
    key: Vec<i64>,
    /// The pending trace's structure: its calls' ops and argument references, no types.
    structure: u64,
    deferred: Vec<Deferred>,
    // The trace cache.
    traces: FxHashMap<Vec<i64>, (Arc<Entry>, u64)>,
    /// Programs compiled per trace structure.
    compiled: FxHashMap<u64, u32>,
    evicted: FxHashMap<Vec<i64>, String>,
    tick: u64,
    stats: Stats,
}

static RECORDER: std::sync::LazyLock<Mutex<Recorder>> =
    std::sync::LazyLock::new(|| Mutex::new(Recorder::default()));

fn recorder() -> std::sync::MutexGuard<'static, Recorder> {
    RECORDER.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The owner of a placeholder's block, behind the output handle the shim releases.
pub(crate) struct Placeholder(pub(crate) HostBlock);

/// A placeholder's storage died: its value is no longer an output; its block goes back.
pub(crate) fn release_placeholder(p: Placeholder) {
    let addr = p.0.as_ptr() as usize;
    if PENDING.load(Ordering::Acquire) {
        let mut r = recorder();
        if let Some((_, v)) = r.blocks.remove(&addr) {
            r.values[v].live = false;
            r.values[v].freed = true;
            // Nothing will write the block: it can serve a later placeholder of this trace.
            drop(r);
            device::free_block(p.0);
            return;
        }
        // An earlier trace's placeholder, now memory like any other: held for the flush only
        // when an input of this trace reads it.
        drop(r);
        return free_or_defer(p.0);
    }
    device::free_block(p.0);
}

/// Frees `block` now, or after the flush while a trace is pending and it is a program input
/// (the flush reads its bytes). The values recorded into it (by in-place or out= calls, into an
/// out= tensor PyTorch allocated) are no longer outputs; when no input of the trace reads its
/// bytes, nothing will, and it can serve a later allocation of this trace, as a placeholder's
/// block does (a fused step then holds no more memory than strict mode's).
pub(crate) fn free_or_defer(block: HostBlock) {
    if PENDING.load(Ordering::Acquire) {
        let mut r = recorder();
        if !r.nodes.is_empty() {
            let start = block.as_ptr() as usize;
            let end = start + block.size();
            let held: Vec<usize> = r.blocks.range(start..end).map(|(&a, _)| a).collect();
            let read = r.reads(start, end);
            for a in held {
                if let Some((_, v)) = r.blocks.remove(&a) {
                    r.values[v].live = false;
                    // A replay writes it into scratch memory: the block may serve another value.
                    r.values[v].freed = !read;
                }
            }
            if read {
                r.deferred.push(Deferred::Block(block));
                return;
            }
        }
    }
    device::free_block(block);
}

/// Drops `owned` (a kernel output's buffer) now, or after the flush while a trace is pending.
pub(crate) fn drop_or_defer<T: Send + 'static>(owned: Box<T>) {
    if PENDING.load(Ordering::Acquire) {
        let mut r = recorder();
        if !r.nodes.is_empty() {
            r.deferred.push(Deferred::Owned(owned));
            return;
        }
    }
    drop(owned);
}

pub(crate) extern "C" fn api_retire(ctx: *mut c_void, f: extern "C" fn(*mut c_void)) {
    if PENDING.load(Ordering::Acquire) {
        let mut r = recorder();
        if !r.nodes.is_empty() {
            r.deferred.push(Deferred::Drop(ctx, f));
            return;
        }
    }
    f(ctx);
}

// ----- arguments -----

fn tensor_dims(a: &TpukArg) -> &[i64] {
    if a.len <= 0 || a.sizes.is_null() {
        return &[];
    }
    // SAFETY: the shim passes a tensor's sizes array of `len` entries.
    unsafe { std::slice::from_raw_parts(a.sizes, a.len as usize) }
}

fn tensor_strides(a: &TpukArg) -> &[i64] {
    if a.len <= 0 || a.strides.is_null() {
        return &[];
    }
    // SAFETY: the shim passes a tensor's strides array of `len` entries.
    unsafe { std::slice::from_raw_parts(a.strides, a.len as usize) }
}

fn ints(a: &TpukArg) -> &[i64] {
    if a.len <= 0 || a.data.is_null() {
        return &[];
    }
    // SAFETY: the shim passes an int list as `len` int64s alive for the call.
    unsafe { std::slice::from_raw_parts(a.data.cast::<i64>(), a.len as usize) }
}

fn bytes(a: &TpukArg, n: usize) -> &[u8] {
    if n == 0 || a.data.is_null() {
        return &[];
    }
    // SAFETY: the shim passes a bool list (`len` bytes) or a string (`i` bytes) alive for the
    // call.
    unsafe { std::slice::from_raw_parts(a.data.cast::<u8>(), n) }
}

/// A tensor list's entries (each a tensor or `KIND_NONE`).
fn elements(a: &TpukArg) -> &[TpukArg] {
    if a.kind != KIND_TENSOR_LIST || a.len <= 0 || a.data.is_null() {
        return &[];
    }
    // SAFETY: the shim passes a tensor list as `len` TpukArgs alive for the call.
    unsafe { std::slice::from_raw_parts(a.data.cast::<TpukArg>(), a.len as usize) }
}

/// Whether device tensor `a` has type `ty`, its dims row-major.
fn same_geometry(a: &TpukArg, ty: &TensorType) -> bool {
    let dims = tensor_dims(a);
    device::dtype_of_code(a.dtype) == Some(ty.dtype)
        && ty.shape.0.len() == dims.len()
        && ty.shape.0.iter().zip(dims).all(|(d, &n)| *d == Dim::Static(n.max(0) as u64))
        && crate::tensor::row_major(dims, Some(tensor_strides(a)))
}

fn tensor_type(i: usize, a: &TpukArg) -> Result<TensorType, String> {
    let dtype = device::dtype_of_code(a.dtype).ok_or_else(|| {
        format!("argument {i} has a dtype (ScalarType #{}) the recorder does not take", a.dtype)
    })?;
    let shape: Shape = tensor_dims(a).iter().map(|&d| Dim::Static(d.max(0) as u64)).collect();
    Ok(TensorType::new(dtype, shape))
}

fn numel(ty: &TensorType) -> usize {
    ty.shape.num_elements().unwrap_or(0) as usize
}

/// The bytes an input spans, `[start, end)` (a strided one's, first element to last).
fn input_span(x: &ExtInput) -> (usize, usize) {
    let extent = match &x.gather {
        Some((sizes, strides)) => {
            let last: i64 = sizes.iter().zip(strides).map(|(&n, &st)| (n - 1).max(0) * st).sum();
            (last as usize + 1) * x.ty.dtype.byte_size()
        }
        None => x.bytes,
    };
    (x.addr, x.addr + extent)
}

/// The signature of a call (op, argument kinds, tensor types, static values), or why the
/// recorder does not take it.
fn signature(key: usize, args: &[TpukArg], sig: &mut Vec<i64>) -> Result<(), String> {
    sig.clear();
    sig.push(key as i64);
    sig.push(args.len() as i64);
    for (i, a) in args.iter().enumerate() {
        sig.push(i64::from(a.kind));
        match a.kind {
            KIND_TENSOR if a.device != ON_TPU => match cpu_scalar(a) {
                Some(arg) => {
                    sig.push(i64::from(a.dtype));
                    // A float's value is not part of the signature (see `float_at`).
                    sig.push(match arg {
                        Arg::Float(_) => 0,
                        Arg::Int(x) => x,
                        Arg::Bool(b) => i64::from(b),
                        _ => 0,
                    });
                }
                None => {
                    return Err(format!(
                        "argument {i} is not on the tpu device (nor a CPU scalar)"
                    ));
                }
            },
            // A tensor with no elements (an embedding bag's unused outputs) is recorded: it
            // reads no memory.
            KIND_TENSOR if tensor_dims(a).contains(&0) => {
                sig.push(i64::from(a.dtype));
                sig.push(tensor_dims(a).len() as i64);
                sig.extend_from_slice(tensor_dims(a));
            }
            KIND_TENSOR => device_tensor_signature(sig, a, || format!("argument {i}"))?,
            KIND_TENSOR_LIST => {
                let list = elements(a);
                sig.push(list.len() as i64);
                for (j, e) in list.iter().enumerate() {
                    sig.push(i64::from(e.kind));
                    match e.kind {
                        KIND_NONE => {}
                        KIND_TENSOR if e.device == ON_TPU => {
                            device_tensor_signature(sig, e, || {
                                format!("argument {i}'s tensor {j}")
                            })?
                        }
                        KIND_TENSOR if a.i == 1 && cpu_indices(e) => {
                            sig.push(-1);
                            device_tensor_signature(sig, e, || {
                                format!("argument {i}'s tensor {j}")
                            })?
                        }
                        _ => {
                            return Err(format!(
                                "argument {i}'s tensor {j} is not on the tpu device (nor \
                                 integer indices on the CPU)"
                            ));
                        }
                    }
                }
            }
            KIND_NONE => {}
            KIND_INT | KIND_BOOL | KIND_DTYPE | KIND_LAYOUT | KIND_MEMORY_FORMAT | KIND_DEVICE => {
                sig.push(a.i)
            }
            // A float's value is not part of the signature (see `float_at`).
            KIND_DOUBLE => {}
            KIND_INT_LIST => {
                let v = ints(a);
                sig.push(v.len() as i64);
                sig.extend_from_slice(v);
            }
            KIND_BOOL_LIST => {
                let v = bytes(a, a.len.max(0) as usize);
                sig.push(v.len() as i64);
                sig.extend(v.iter().map(|&b| i64::from(b)));
            }
            KIND_STRING => {
                let v = bytes(a, a.i.max(0) as usize);
                sig.push(v.len() as i64);
                sig.extend(v.iter().map(|&b| i64::from(b)));
            }
            _ => {
                return Err(format!(
                    "argument {i} is of a kind the recorder does not take (a generator, a scalar list, ...)"
                ));
            }
        }
    }
    Ok(())
}

/// A device tensor's part of a signature: dtype and dims (strides do not change output types;
/// how the tensor is read is part of the trace, its derivation nodes, not of the signature).
fn device_tensor_signature(
    sig: &mut Vec<i64>,
    a: &TpukArg,
    what: impl FnOnce() -> String,
) -> Result<(), String> {
    let dims = tensor_dims(a);
    if dims.contains(&0) || a.data.is_null() {
        return Err(format!("{} has no elements", what()));
    }
    sig.push(i64::from(a.dtype));
    sig.push(dims.len() as i64);
    sig.extend_from_slice(dims);
    Ok(())
}

/// Whether an entry of a `Tensor?[]` list is integer indices on the CPU, which PyTorch lets index a
/// device tensor (`x[:, torch.tensor([0, 2])]`, DLRM's pairs of its interaction): the recorder
/// copies them into a program input (their bytes are the call's, not the flush's).
fn cpu_indices(e: &TpukArg) -> bool {
    e.kind == KIND_TENSOR
        && e.device == device::ON_CPU
        && !e.data.is_null()
        && matches!(device::dtype_of_code(e.dtype), Some(DType::I64 | DType::I32))
}

/// A 0-dim CPU tensor argument (a Python number PyTorch wrapped, or a scalar tensor) as the
/// constant it holds.
fn cpu_scalar(a: &TpukArg) -> Option<Arg> {
    if a.device != device::ON_CPU || a.len != 0 || a.data.is_null() {
        return None;
    }
    let p = a.data;
    // SAFETY: a 0-dim CPU tensor's first element, of its dtype, alive for the call.
    unsafe {
        Some(match device::dtype_of_code(a.dtype)? {
            tpu_kernels::DType::F64 => Arg::Float(p.cast::<f64>().read_unaligned()),
            tpu_kernels::DType::F32 => Arg::Float(f64::from(p.cast::<f32>().read_unaligned())),
            tpu_kernels::DType::I64 => Arg::Int(p.cast::<i64>().read_unaligned()),
            tpu_kernels::DType::I32 => Arg::Int(i64::from(p.cast::<i32>().read_unaligned())),
            tpu_kernels::DType::Bool => Arg::Bool(p.cast::<u8>().read() != 0),
            _ => return None,
        })
    }
}

/// The dim order in which a tensor is dense (`order[k]` is the dim stored as physical dim `k`,
/// outermost first): the identity for a row-major tensor, `[1, 0]` for a transposed matrix;
/// None when it is not dense in any order.
fn dense_order(dims: &[i64], strides: &[i64]) -> Option<Vec<usize>> {
    if crate::tensor::row_major(dims, Some(strides)) {
        return Some((0..dims.len()).collect());
    }
    let mut order: Vec<usize> = (0..dims.len()).collect();
    // Larger strides outside; a dim of size 1 goes innermost among equals (its stride is free).
    order.sort_by(|&a, &b| {
        strides[b].cmp(&strides[a]).then((dims[a] == 1).cmp(&(dims[b] == 1))).then(a.cmp(&b))
    });
    let pd: Vec<i64> = order.iter().map(|&d| dims[d]).collect();
    let ps: Vec<i64> = order.iter().map(|&d| strides[d]).collect();
    crate::tensor::row_major(&pd, Some(&ps)).then_some(order)
}

fn memory_format_name(code: i64) -> Option<&'static str> {
    Some(match code {
        0 => "contiguous_format",
        1 => "preserve_format",
        2 => "channels_last",
        3 => "channels_last_3d",
        _ => return None,
    })
}

/// A non-tensor argument as the graph format writes it.
fn static_arg(i: usize, a: &TpukArg) -> Result<Arg, String> {
    Ok(match a.kind {
        KIND_TENSOR => {
            cpu_scalar(a).ok_or_else(|| format!("argument {i} is a tensor off the tpu device"))?
        }
        KIND_NONE => Arg::None,
        KIND_INT => Arg::Int(a.i),
        KIND_BOOL => Arg::Bool(a.i != 0),
        KIND_DOUBLE => Arg::Float(a.d),
        KIND_INT_LIST => Arg::IntList(ints(a).to_vec()),
        KIND_BOOL_LIST => {
            Arg::BoolList(bytes(a, a.len.max(0) as usize).iter().map(|&b| b != 0).collect())
        }
        KIND_STRING => {
            Arg::String(String::from_utf8_lossy(bytes(a, a.i.max(0) as usize)).into_owned())
        }
        KIND_DTYPE => Arg::Dtype(
            device::dtype_name_of_code(a.i)
                .ok_or_else(|| format!("argument {i} is an unknown dtype (#{})", a.i))?
                .to_owned(),
        ),
        KIND_LAYOUT if a.i == 0 => Arg::Layout("strided".to_owned()),
        KIND_LAYOUT => return Err(format!("argument {i} is a sparse layout")),
        KIND_MEMORY_FORMAT => Arg::MemoryFormat(
            memory_format_name(a.i)
                .ok_or_else(|| format!("argument {i} is an unknown memory format (#{})", a.i))?
                .to_owned(),
        ),
        KIND_DEVICE => Arg::Device("tpu:0".to_owned()),
        _ => return Err(format!("argument {i} is of a kind the recorder does not take")),
    })
}

fn text(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: the shim passes `len` bytes alive for the call.
    String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
        .into_owned()
}

/// The verdict on a new signature: the op's meta outputs, and whether the call lowers as a
/// graph of one node to those types.
fn judge(rt: &Runtime, op: &Arc<OpInfo>, args: &[TpukArg], info: &TpukOpInfo, id: i64) -> Verdict {
    let declines = |reason: String| Verdict::Declines { op: op.name.clone(), reason };
    if info.nexpected < 0 {
        return declines("the op has no meta function for these arguments".to_owned());
    }
    let expected = if info.nexpected == 0 || info.expected.is_null() {
        &[][..]
    } else {
        // SAFETY: the shim passes `nexpected` outputs alive for the call.
        unsafe { std::slice::from_raw_parts(info.expected, info.nexpected as usize) }
    };
    let mut outputs = Vec::with_capacity(expected.len());
    for (k, e) in expected.iter().enumerate() {
        if e.kind != KIND_TENSOR {
            return declines(format!("output {k} is not a tensor"));
        }
        match tensor_type(k, e) {
            Ok(t) => outputs.push(t),
            Err(m) => return declines(format!("output {k}: {m}")),
        }
    }
    if outputs.is_empty() {
        return declines("the op has no outputs".to_owned());
    }
    // Floats that change from step to step (a learning rate's bias correction) would make
    // every step a new trace: where the op's lowering takes them as zero-dim tensors, they are
    // program inputs.
    let floats: Vec<usize> = match outputs[0].dtype {
        DType::F32 | DType::F64 => {
            (0..args.len()).filter(|&i| float_at(&args[i]).is_some()).collect()
        }
        _ => Vec::new(),
    };
    let lower = |lifted: &[usize]| -> Result<(), String> {
        let graph = one_node_graph(op, args, &outputs, lifted)?;
        let (_, module, _) =
            crate::torch_bridge::lower_graph(rt, &graph.to_json(), &[], rt.platform)
                .map_err(|e| format!("its lowering: {}", e.message))?;
        let got = &module.main().results;
        if got != &outputs {
            let show =
                |ts: &[TensorType]| ts.iter().map(TensorType::short).collect::<Vec<_>>().join(", ");
            return Err(format!(
                "its lowering gives ({}) where torch gives ({})",
                show(got),
                show(&outputs)
            ));
        }
        Ok(())
    };
    if !floats.is_empty() && lower(&floats).is_ok() {
        return Verdict::Records { id, op: op.clone(), outputs, lifted: floats };
    }
    match lower(&[]) {
        Ok(()) => Verdict::Records { id, op: op.clone(), outputs, lifted: Vec::new() },
        Err(m) => declines(m),
    }
}

/// The float a non-tensor argument or a CPU scalar holds, if it is one.
fn float_at(a: &TpukArg) -> Option<f64> {
    match a.kind {
        KIND_DOUBLE => Some(a.d),
        KIND_TENSOR if a.device != ON_TPU => match cpu_scalar(a) {
            Some(Arg::Float(x)) => Some(x),
            _ => None,
        },
        _ => None,
    }
}

/// A float as the bytes of a zero-dim tensor of `dtype` (f32 or f64).
fn float_bytes(x: f64, dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F64 => x.to_le_bytes().to_vec(),
        _ => (x as f32).to_le_bytes().to_vec(),
    }
}

/// The call as a graph of one node whose tensor arguments, and the floats `lifted` names (as
/// zero-dim tensors of the first output's dtype), are the graph's inputs.
fn one_node_graph(
    op: &OpInfo,
    args: &[TpukArg],
    outputs: &[TensorType],
    lifted: &[usize],
) -> Result<Graph, String> {
    let mut inputs = Vec::new();
    let mut node_args = Vec::with_capacity(args.len());
    for (i, a) in args.iter().enumerate() {
        if lifted.contains(&i) {
            let name = format!("a{i}");
            inputs.push(Input {
                name: name.clone(),
                ty: TensorType::new(outputs[0].dtype, Shape::scalar()),
            });
            node_args.push(Arg::Tensor(TensorRef::new(name)));
        } else if a.kind == KIND_TENSOR && a.device == ON_TPU {
            let name = format!("a{i}");
            inputs.push(Input { name: name.clone(), ty: tensor_type(i, a)? });
            node_args.push(Arg::Tensor(TensorRef::new(name)));
        } else if a.kind == KIND_TENSOR_LIST {
            let mut list = Vec::new();
            for (j, e) in elements(a).iter().enumerate() {
                if e.kind == KIND_NONE {
                    list.push(None);
                    continue;
                }
                let name = format!("a{i}_{j}");
                inputs.push(Input { name: name.clone(), ty: tensor_type(i, e)? });
                list.push(Some(TensorRef::new(name)));
            }
            node_args.push(Arg::TensorList(list));
        } else {
            node_args.push(static_arg(i, a)?);
        }
    }
    Ok(Graph {
        version: tpu_kernels_registry::graph::FORMAT_VERSION,
        name: "recorded_call".to_owned(),
        inputs,
        nodes: vec![Node {
            name: "n".to_owned(),
            op: op.name.clone(),
            args: node_args,
            kwargs: BTreeMap::new(),
            arg_names: op.arg_names.clone(),
            outputs: outputs.to_vec(),
        }],
        outputs: (0..outputs.len()).map(|k| Some(TensorRef::output("n", k))).collect(),
    })
}

// ----- recording -----

impl Recorder {
    fn decline(&mut self, op: &str, reason: String) -> i32 {
        let e = self.stats.declined.entry(op.to_owned()).or_insert((0, String::new()));
        e.0 += 1;
        e.1 = reason;
        DECLINED
    }

    /// What a device tensor argument is (a recorded value, or an input read in place; a
    /// reshape or permute of one), or why it cannot be recorded (a view of pending memory).
    fn resolve(&mut self, i: usize, a: &TpukArg, unread: bool) -> Result<ArgRef, String> {
        // Most arguments are a pending value or an input taken whole: nothing to build or keep.
        if let Some(base) = self.whole_value(a).or_else(|| self.whole_input(a, unread)) {
            return Ok(ArgRef {
                graph: base,
                base,
                sizes: Vec::new(),
                strides: Vec::new(),
                offset: 0,
            });
        }
        let ty = tensor_type(i, a)?;
        let sizes = tensor_dims(a).to_vec();
        let strides = tensor_strides(a).to_vec();
        let esize = ty.dtype.byte_size();
        let addr = a.data as usize;
        let bytes = numel(&ty) * esize;
        let pending = self.blocks.range(..=addr).next_back().map(|(&s, &(e, v))| (s, e, v));
        if let Some((start, _, v)) = pending.filter(|&(_, e, _)| addr < e) {
            let offset = addr - start;
            if self.values[v].ty.dtype != ty.dtype || !offset.is_multiple_of(esize) {
                return Err(format!(
                    "argument {i} reinterprets a pending value ({})",
                    self.values[v].ty.short()
                ));
            }
            let graph = self
                .view_of(
                    v,
                    ViewOf { offset: (offset / esize) as i64, sizes: &sizes, strides: &strides },
                    ty,
                )
                .ok_or_else(|| {
                    format!(
                        "argument {i} is a view of a pending value ({}) the recorder cannot express \
                         (sizes {sizes:?}, strides {strides:?}, offset {})",
                        self.values[v].ty.short(),
                        offset / esize
                    )
                })?;
            return Ok(ArgRef { graph, base: Ref::Value(v), sizes, strides, offset });
        }
        if unread {
            // Only its type is used: an input of its logical type, given zeros at the flush.
            let last: i64 = sizes.iter().zip(&strides).map(|(&n, &st)| (n - 1).max(0) * st).sum();
            let span = Some(bytes.max((last as usize + 1) * esize));
            let k = match self
                .inputs
                .iter()
                .position(|x| x.unread == span && x.addr == addr && x.ty == ty)
            {
                Some(k) => k,
                None => {
                    self.inputs.push(ExtInput { addr, ty, bytes, gather: None, unread: span });
                    self.inputs.len() - 1
                }
            };
            let base = Ref::Input(k);
            return Ok(ArgRef { graph: base, base, sizes, strides, offset: 0 });
        }
        let Some(order) = dense_order(&sizes, &strides) else {
            // A strided view of memory no recorded call writes: gathered at the flush.
            let gather = Some((sizes.clone(), strides.clone()));
            let k = match self.inputs.iter().position(|x| {
                x.unread.is_none() && x.addr == addr && x.ty == ty && x.gather == gather
            }) {
                Some(k) => k,
                None => {
                    self.inputs.push(ExtInput {
                        addr,
                        ty: ty.clone(),
                        bytes,
                        gather,
                        unread: None,
                    });
                    self.inputs.len() - 1
                }
            };
            return Ok(ArgRef {
                graph: Ref::Input(k),
                base: Ref::Input(k),
                sizes,
                strides,
                offset: 0,
            });
        };
        // Dense in some dim order: read in place as stored (its dims in physical order), then
        // permuted back.
        let stored: Vec<u64> = order.iter().map(|&d| sizes[d].max(0) as u64).collect();
        let base_ty = TensorType::new(ty.dtype, Shape::of(&stored));
        let k = match self.inputs.iter().position(|x| {
            x.unread.is_none() && x.addr == addr && x.ty == base_ty && x.gather.is_none()
        }) {
            Some(k) => k,
            None => {
                self.inputs.push(ExtInput { addr, ty: base_ty, bytes, gather: None, unread: None });
                self.inputs.len() - 1
            }
        };
        let base = Ref::Input(k);
        let mut graph = base;
        if order.iter().enumerate().any(|(k, &d)| k != d) {
            graph = Ref::Value(self.derived(graph, Derive::Permute, inverse(&order), ty));
        } else if crate::tensor::row_major(&sizes, Some(&strides)) {
            // Found by `whole_input` from now on.
            self.whole_inputs.entry(addr).or_insert(k);
        }
        Ok(ArgRef { graph, base, sizes, strides, offset: 0 })
    }

    /// The pending value `a` is, whole: its block starts at `a`'s memory, and `a` has its type
    /// and dims, row-major.
    fn whole_value(&self, a: &TpukArg) -> Option<Ref> {
        let addr = a.data as usize;
        let (&start, &(end, v)) = self.blocks.range(..=addr).next_back()?;
        let same = start == addr && addr < end && same_geometry(a, &self.values[v].ty);
        same.then_some(Ref::Value(v))
    }

    /// The input `a` is, whole: an input already read at `a`'s memory with `a`'s type and dims,
    /// row-major, in memory no recorded call writes (a weight read again).
    fn whole_input(&self, a: &TpukArg, unread: bool) -> Option<Ref> {
        let addr = a.data as usize;
        let k = *self.whole_inputs.get(&addr).filter(|_| !unread)?;
        let x = &self.inputs[k];
        let pending = self.blocks.range(..=addr).next_back().is_some_and(|(_, &(e, _))| addr < e);
        let same = !pending && x.unread.is_none() && x.gather.is_none() && same_geometry(a, &x.ty);
        same.then_some(Ref::Input(k))
    }

    /// Value `v` (dense) seen through `view`, as reshapes, slices, a permute and an expand of
    /// it: a box of a reshape of it, or slices of its own dims split and permuted. None when it
    /// is neither (overlapping strides, a dim that steps).
    fn view_of(&mut self, v: usize, view: ViewOf<'_>, ty: TensorType) -> Option<Ref> {
        // The value itself, as most arguments are.
        if view.offset == 0
            && self.values[v].ty == ty
            && crate::tensor::row_major(view.sizes, Some(view.strides))
        {
            return Some(Ref::Value(v));
        }
        self.box_of_reshape(v, view, ty.clone()).or_else(|| self.view_in_value_dims(v, view, ty))
    }

    /// `v` through `view` when the view is a box of a reshape of it (each of its strides
    /// divides the next larger one).
    fn box_of_reshape(&mut self, v: usize, view: ViewOf<'_>, ty: TensorType) -> Option<Ref> {
        let ViewOf { offset, sizes, strides } = view;
        let n = numel(&self.values[v].ty) as i64;
        let dtype = ty.dtype;
        let as_value = |r: Ref| r;
        if (0..sizes.len()).any(|d| sizes[d] > 1 && strides[d] == 0) {
            // A broadcast: the view without its expanded dims, expanded.
            let reduced: Vec<i64> =
                (0..sizes.len()).map(|d| if strides[d] == 0 { 1 } else { sizes[d] }).collect();
            let rty = TensorType::new(
                dtype,
                Shape::of(&reduced.iter().map(|&x| x as u64).collect::<Vec<_>>()),
            );
            let inner = self.view_of(v, ViewOf { offset, sizes: &reduced, strides }, rty)?;
            return Some(Ref::Value(self.derived(inner, Derive::Expand, sizes.to_vec(), ty)));
        }
        if offset == 0 && crate::tensor::row_major(sizes, Some(strides)) && numel(&ty) as i64 == n {
            if self.values[v].ty == ty {
                return Some(Ref::Value(v));
            }
            let size = sizes.to_vec();
            return Some(Ref::Value(self.derived(Ref::Value(v), Derive::View, size, ty)));
        }
        // The dims that matter, outermost (largest stride) first.
        let mut dims: Vec<usize> = (0..sizes.len()).filter(|&d| sizes[d] > 1).collect();
        if dims.iter().any(|&d| strides[d] <= 0) {
            return None;
        }
        dims.sort_by(|&a, &b| strides[b].cmp(&strides[a]));
        for w in dims.windows(2) {
            if strides[w[0]] <= strides[w[1]] || strides[w[0]] % strides[w[1]] != 0 {
                return None;
            }
        }
        // The value reshaped so that each of those dims is one of its dims (the last one the
        // elements between consecutive ones of the innermost).
        let outer = dims.first().map_or(1, |&d| strides[d]);
        if outer <= 0 || n % outer != 0 {
            return None;
        }
        let mut r_dims = vec![n / outer];
        let mut r_strides = vec![outer];
        for w in dims.windows(2) {
            r_dims.push(strides[w[0]] / strides[w[1]]);
            r_strides.push(strides[w[1]]);
        }
        let inner = dims.last().map_or(1, |&d| strides[d]);
        if dims.is_empty() {
            r_dims = vec![n];
            r_strides = vec![1];
        } else {
            r_dims.push(inner);
            r_strides.push(1);
        }
        let mut rem = offset;
        let mut coord = Vec::with_capacity(r_dims.len());
        for &st in &r_strides {
            coord.push(rem / st);
            rem %= st;
        }
        let m = dims.len();
        for (k, &d) in dims.iter().enumerate() {
            if coord[k] + sizes[d] > r_dims[k] {
                return None;
            }
        }
        if coord[m] >= r_dims[m] {
            return None;
        }
        let typed = |d: &[i64]| {
            TensorType::new(dtype, Shape::of(&d.iter().map(|&x| x as u64).collect::<Vec<_>>()))
        };
        let mut cur = Ref::Value(v);
        if self.values[v]
            .ty
            .shape
            .static_dims()
            .unwrap_or_default()
            .iter()
            .map(|&x| x as i64)
            .collect::<Vec<_>>()
            != r_dims
        {
            cur = Ref::Value(self.derived(cur, Derive::View, r_dims.clone(), typed(&r_dims)));
        }
        let mut shape = r_dims.clone();
        for k in 0..=m {
            let len = if k < m { sizes[dims[k]] } else { 1 };
            if coord[k] == 0 && len == shape[k] {
                continue;
            }
            shape[k] = len;
            cur = Ref::Value(self.derived(
                cur,
                Derive::Slice,
                vec![k as i64, coord[k], coord[k] + len],
                typed(&shape),
            ));
        }
        // Drop the innermost reshape dim, then the dims in logical order, then the size-1 dims.
        Some(as_value(self.arrange(cur, &shape, &dims, sizes, ty)))
    }

    /// `cur` (of dims `shape`, whose dims of more than one element hold the view's dims
    /// `physical` in that order) reshaped to them, permuted to the view's order, and reshaped to
    /// the view's `sizes` (its size-1 dims).
    fn arrange(
        &mut self,
        mut cur: Ref,
        shape: &[i64],
        physical: &[usize],
        sizes: &[i64],
        ty: TensorType,
    ) -> Ref {
        let typed = |d: &[i64]| {
            TensorType::new(ty.dtype, Shape::of(&d.iter().map(|&x| x as u64).collect::<Vec<_>>()))
        };
        let split: Vec<i64> = physical.iter().map(|&d| sizes[d]).collect();
        if shape != split {
            cur = Ref::Value(self.derived(cur, Derive::View, split.clone(), typed(&split)));
        }
        let mut logical = physical.to_vec();
        logical.sort_unstable();
        if logical != physical {
            let perm: Vec<i64> = logical
                .iter()
                .map(|d| physical.iter().position(|x| x == d).unwrap_or(0) as i64)
                .collect();
            let permuted: Vec<i64> = logical.iter().map(|&d| sizes[d]).collect();
            cur = Ref::Value(self.derived(cur, Derive::Permute, perm, typed(&permuted)));
        }
        let now: Vec<i64> = logical.iter().map(|&d| sizes[d]).collect();
        if now != sizes {
            cur = Ref::Value(self.derived(cur, Derive::View, sizes.to_vec(), ty));
        }
        cur
    }

    /// `v` through `view` when each of the view's dims runs inside one of the value's own dims
    /// (a slice of the value, a dim of it split, the dims permuted:
    /// `x[:, 1:].reshape(..).permute(..)`): slices of the value, a reshape and a permute. None
    /// when a view dim crosses value dims, steps, or leaves the value.
    fn view_in_value_dims(&mut self, v: usize, view: ViewOf<'_>, ty: TensorType) -> Option<Ref> {
        let ViewOf { offset, sizes, strides } = view;
        let dims: Vec<i64> =
            self.values[v].ty.shape.static_dims()?.iter().map(|&x| x as i64).collect();
        let own = crate::torch_bridge::compact_strides(&dims);
        let n: i64 = dims.iter().product();
        if offset < 0 || offset >= n.max(1) {
            return None;
        }
        let coord: Vec<i64> =
            dims.iter().zip(&own).map(|(&d, &st)| (offset / st) % d.max(1)).collect();
        // The value dim each view dim (of more than one element) runs in, innermost first.
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); dims.len()];
        for d in (0..sizes.len()).filter(|&d| sizes[d] > 1) {
            let i = (0..dims.len()).rev().find(|&i| {
                strides[d] > 0 && strides[d] % own[i] == 0 && strides[d] < own[i] * dims[i]
            })?;
            groups[i].push(d);
        }
        // Within a value dim, the view dims split a run of consecutive indices.
        let mut lens = vec![1i64; dims.len()];
        let mut split: Vec<usize> = Vec::new();
        for (i, g) in groups.iter_mut().enumerate() {
            g.sort_by_key(|&d| std::cmp::Reverse(strides[d]));
            let mut unit = 1;
            for &d in g.iter().rev() {
                if strides[d] != unit * own[i] {
                    return None;
                }
                unit *= sizes[d];
            }
            if coord[i] + unit > dims[i] {
                return None;
            }
            lens[i] = unit;
            split.extend(g.iter().copied());
        }
        let typed = |d: &[i64]| {
            TensorType::new(ty.dtype, Shape::of(&d.iter().map(|&x| x as u64).collect::<Vec<_>>()))
        };
        let mut cur = Ref::Value(v);
        let mut shape = dims.clone();
        for i in 0..dims.len() {
            if coord[i] == 0 && lens[i] == dims[i] {
                continue;
            }
            shape[i] = lens[i];
            cur = Ref::Value(self.derived(
                cur,
                Derive::Slice,
                vec![i as i64, coord[i], coord[i] + lens[i]],
                typed(&shape),
            ));
        }
        // The split dims in the value's order, then the view's order, then its size-1 dims.
        Some(self.arrange(cur, &shape, &split, sizes, ty))
    }

    /// `aten::view` (to sizes `params`) or `aten::permute` (dims `params`) of `of`, as a value
    /// of type `ty`, recorded once per trace.
    fn derived(&mut self, of: Ref, kind: Derive, params: Vec<i64>, ty: TensorType) -> usize {
        let code = ref_code(of);
        if let Some(&r) = self.derivations.get(&(code, kind, params.clone())) {
            return r;
        }
        let op = builtin(match kind {
            Derive::View => 0,
            Derive::Permute => 1,
            Derive::Slice => 2,
            Derive::Expand => 3,
        });
        let node = self.nodes.len();
        let r = self.values.len();
        let home = match of {
            Ref::Value(v) => Home::Alias(v),
            Ref::Input(k) | Ref::Lifted(k) => Home::Input(k),
        };
        self.values.push(Value { node, out: 0, ty, home, live: false, view: None, freed: false });
        self.key.push(match kind {
            Derive::View => -1,
            Derive::Permute => -3,
            Derive::Slice => -5,
            Derive::Expand => -7,
        });
        self.key.push(code);
        self.key.push(params.len() as i64);
        self.key.extend_from_slice(&params);
        self.derivations.insert((code, kind, params.clone()), r);
        self.nodes.push(RecNode {
            op,
            args: match kind {
                Derive::Slice => vec![
                    Arg::Tensor(TensorRef::new(String::new())),
                    Arg::Int(params[0]),
                    Arg::Int(params[1]),
                    Arg::Int(params[2]),
                    Arg::Int(1),
                ],
                Derive::Expand => {
                    vec![
                        Arg::Tensor(TensorRef::new(String::new())),
                        Arg::IntList(params),
                        Arg::Bool(false),
                    ]
                }
                _ => vec![Arg::Tensor(TensorRef::new(String::new())), Arg::IntList(params)],
            },
            refs: match kind {
                Derive::Slice => vec![
                    Some(ArgRef {
                        graph: of,
                        base: of,
                        sizes: Vec::new(),
                        strides: Vec::new(),
                        offset: 0,
                    }),
                    None,
                    None,
                    None,
                    None,
                ],
                Derive::Expand => vec![
                    Some(ArgRef {
                        graph: of,
                        base: of,
                        sizes: Vec::new(),
                        strides: Vec::new(),
                        offset: 0,
                    }),
                    None,
                    None,
                ],
                _ => vec![
                    Some(ArgRef {
                        graph: of,
                        base: of,
                        sizes: Vec::new(),
                        strides: Vec::new(),
                        offset: 0,
                    }),
                    None,
                ],
            },
            outs: vec![r],
            kept: None,
        });
        r
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Derive {
    View,
    Permute,
    Slice,
    Expand,
}

/// The inverse of a permutation (`permute(x, inverse(order))` undoes reading `x`'s dims in
/// `order`).
fn inverse(order: &[usize]) -> Vec<i64> {
    let mut back = vec![0i64; order.len()];
    for (k, &d) in order.iter().enumerate() {
        back[d] = k as i64;
    }
    back
}

fn ref_code(r: Ref) -> i64 {
    match r {
        Ref::Value(v) => 3 * v as i64,
        Ref::Input(k) => 3 * k as i64 + 1,
        Ref::Lifted(j) => 3 * j as i64 + 2,
    }
}

/// A view of a pending value's elements: from element `offset`, `sizes` with `strides`.
#[derive(Clone, Copy)]
struct ViewOf<'a> {
    offset: i64,
    sizes: &'a [i64],
    strides: &'a [i64],
}

/// Where a recorded output goes: a fresh placeholder, or memory an in-place or out= call
/// writes (`replaces`: the pending value whose block it is).
enum Dest {
    Fresh(HostBlock),
    Into {
        addr: usize,
        end: usize,
        replaces: Option<usize>,
    },
    /// Into a slice of pending value `base`, whose block starts at `start`: the block's new
    /// value is the old one with that slice replaced (`aten::slice_scatter`).
    Scatter {
        base: usize,
        start: usize,
        end: usize,
        addr: usize,
        plan: ScatterPlan,
        view: (Vec<i64>, Vec<i64>),
    },
    /// Into memory laid out densely in dim order `order` (an output PyTorch allocated in its
    /// input's layout, or all of pending value `replaces` seen in another order): the block
    /// holds the result permuted.
    Permuted {
        addr: usize,
        end: usize,
        order: Vec<usize>,
        view: (Vec<i64>, Vec<i64>),
        replaces: Option<usize>,
    },
}

/// A view of a dense value that is one slice of a reshape of it: `reshape` (the value's
/// elements as these dims), sliced along `dim` from `begin` to `end` (every other dim whole),
/// which the written tensor's elements fill in order as `piece`.
struct ScatterPlan {
    reshape: Vec<i64>,
    piece: Vec<i64>,
    dim: i64,
    begin: i64,
    end: i64,
}

/// The scatter plan of the view `sizes`/`strides` from element `offset` of a dense value of
/// `n` elements, when it is one slice of a reshape of it.
fn scatter_plan(n: i64, offset: i64, sizes: &[i64], strides: &[i64]) -> Option<ScatterPlan> {
    let dims: Vec<usize> = (0..sizes.len()).filter(|&d| sizes[d] > 1).collect();
    if dims.iter().any(|&d| strides[d] <= 0) {
        return None;
    }
    // In logical order, strides strictly decreasing and each dividing the one before.
    for w in dims.windows(2) {
        if strides[w[0]] <= strides[w[1]] || strides[w[0]] % strides[w[1]] != 0 {
            return None;
        }
    }
    let outer = dims.first().map_or(1, |&d| strides[d]);
    if n % outer != 0 {
        return None;
    }
    let mut reshape = vec![n / outer];
    let mut r_strides = vec![outer];
    for w in dims.windows(2) {
        reshape.push(strides[w[0]] / strides[w[1]]);
        r_strides.push(strides[w[1]]);
    }
    if dims.is_empty() {
        reshape = vec![n];
        r_strides = vec![1];
    } else {
        let inner = strides[dims[dims.len() - 1]];
        reshape.push(inner);
        r_strides.push(1);
    }
    let mut rem = offset;
    let mut piece = reshape.clone();
    let mut cut = None;
    for (k, &st) in r_strides.iter().enumerate() {
        let c = rem / st;
        rem %= st;
        let len = if k < dims.len() { sizes[dims[k]] } else { 1 };
        if c + len > reshape[k] {
            return None;
        }
        if c != 0 || len != reshape[k] {
            if cut.is_some() {
                return None;
            }
            cut = Some((k as i64, c, c + len));
            piece[k] = len;
        }
    }
    let (dim, begin, end) = cut?;
    Some(ScatterPlan { reshape, piece, dim, begin, end })
}

/// The builtin ops derived nodes use: view, permute, slice, expand, slice_scatter.
fn builtin(k: usize) -> Arc<OpInfo> {
    static OPS: std::sync::LazyLock<Vec<Arc<OpInfo>>> = std::sync::LazyLock::new(|| {
        [
            ("aten::view.default", &["self", "size"][..]),
            ("aten::permute.default", &["self", "dims"]),
            ("aten::slice.Tensor", &["self", "dim", "start", "end", "step"]),
            ("aten::expand.default", &["self", "size", "implicit"]),
            ("aten::slice_scatter.default", &["self", "src", "dim", "start", "end", "step"]),
        ]
        .iter()
        .map(|(name, args)| {
            Arc::new(OpInfo {
                name: (*name).to_owned(),
                arg_names: args.iter().map(|a| (*a).to_owned()).collect(),
                shape_only_self: false,
            })
        })
        .collect()
    });
    OPS[k].clone()
}

/// A type's dims as torch's sizes.
fn dims_i64(ty: &TensorType) -> Vec<i64> {
    ty.shape.static_dims().unwrap_or_default().iter().map(|&x| x as i64).collect()
}

impl Recorder {
    /// Value `v` as a tensor of `dims` (a view of it when its own dims differ).
    fn as_dims(&mut self, v: usize, dims: &[i64]) -> Ref {
        let ty = &self.values[v].ty;
        if dims_i64(ty) == dims {
            return Ref::Value(v);
        }
        let typed = TensorType::new(
            ty.dtype,
            Shape::of(&dims.iter().map(|&x| x as u64).collect::<Vec<_>>()),
        );
        Ref::Value(self.derived(Ref::Value(v), Derive::View, dims.to_vec(), typed))
    }

    /// Records that value `v` was written into a slice of pending value `base` (its block at
    /// `start..end`): the block's new value is `base` with the slice replaced.
    fn scatter_into(&mut self, v: usize, base: usize, start: usize, end: usize, plan: ScatterPlan) {
        let dtype = self.values[base].ty.dtype;
        let typed = |d: &[i64]| {
            TensorType::new(dtype, Shape::of(&d.iter().map(|&x| x as u64).collect::<Vec<_>>()))
        };
        let base_dims = dims_i64(&self.values[base].ty);
        let whole = self.as_dims(base, &plan.reshape);
        let piece = self.as_dims(v, &plan.piece);
        let node = self.nodes.len();
        let scattered = self.values.len();
        self.values.push(Value {
            node,
            out: 0,
            ty: typed(&plan.reshape),
            home: Home::Block(start),
            live: false,
            view: None,
            freed: false,
        });
        self.key.extend_from_slice(&[
            -9,
            ref_code(whole),
            ref_code(piece),
            plan.dim,
            plan.begin,
            plan.end,
        ]);
        let tensor = |r: Ref| {
            Some(ArgRef { graph: r, base: r, sizes: Vec::new(), strides: Vec::new(), offset: 0 })
        };
        self.nodes.push(RecNode {
            op: builtin(4),
            args: vec![
                Arg::Tensor(TensorRef::new(String::new())),
                Arg::Tensor(TensorRef::new(String::new())),
                Arg::Int(plan.dim),
                Arg::Int(plan.begin),
                Arg::Int(plan.end),
                Arg::Int(1),
            ],
            refs: vec![tensor(whole), tensor(piece), None, None, None, None],
            outs: vec![scattered],
            kept: None,
        });
        let mut new = scattered;
        if base_dims != plan.reshape {
            new = self.derived(
                Ref::Value(scattered),
                Derive::View,
                base_dims.clone(),
                typed(&base_dims),
            );
        }
        // The block now holds the new value, a program output; the old one is overwritten.
        self.values[base].live = false;
        self.values[new].home = Home::Block(start);
        self.values[new].live = true;
        self.blocks.insert(start, (end, new));
    }

    /// The destination of output `k` written into `a`, or why not.
    fn written_dest(&self, k: usize, a: &TpukArg, ty: &TensorType) -> Result<Dest, String> {
        if a.kind != KIND_TENSOR || a.device != ON_TPU || a.data.is_null() {
            return Err(format!("written tensor {k} is not a tpu tensor with elements"));
        }
        let got = tensor_type(k, a)?;
        if &got != ty {
            return Err(format!(
                "written tensor {k} is {}, the op gives {}",
                got.short(),
                ty.short()
            ));
        }
        let (sizes, strides) = (tensor_dims(a), tensor_strides(a));
        let dense = crate::tensor::row_major(sizes, Some(strides));
        let addr = a.data as usize;
        let esize = ty.dtype.byte_size();
        let bytes = numel(ty) * esize;
        if bytes == 0 {
            return Err(format!("written tensor {k} has no elements"));
        }
        let pending = self.blocks.range(..=addr).next_back().map(|(&s, &(e, v))| (s, e, v));
        match pending.filter(|&(_, e, _)| addr < e) {
            // All of the value's elements, in its order (of its shape or another one).
            Some((start, end, v))
                if dense
                    && start == addr
                    && self.values[v].ty.dtype == ty.dtype
                    && numel(&self.values[v].ty) == numel(ty) =>
            {
                Ok(Dest::Into { addr, end, replaces: Some(v) })
            }
            // All of them, in another dim order (a channels-last view of the value).
            Some((start, end, v))
                if start == addr
                    && self.values[v].ty.dtype == ty.dtype
                    && numel(&self.values[v].ty) == numel(ty)
                    && dense_order(sizes, strides).is_some() =>
            {
                Ok(Dest::Permuted {
                    addr,
                    end,
                    order: dense_order(sizes, strides).unwrap_or_default(),
                    view: (sizes.to_vec(), strides.to_vec()),
                    replaces: Some(v),
                })
            }
            Some((start, end, v)) => {
                let base = &self.values[v].ty;
                let plan = (base.dtype == ty.dtype && (addr - start).is_multiple_of(esize))
                    .then(|| {
                        scatter_plan(
                            numel(base) as i64,
                            ((addr - start) / esize) as i64,
                            sizes,
                            strides,
                        )
                    })
                    .flatten()
                    .ok_or_else(|| {
                        format!(
                            "written tensor {k} is a view of a pending value ({}) the recorder \
                             cannot express (sizes {sizes:?}, strides {strides:?}, offset {})",
                            base.short(),
                            (addr - start) / esize
                        )
                    })?;
                Ok(Dest::Scatter {
                    base: v,
                    start,
                    end,
                    addr,
                    plan,
                    view: (sizes.to_vec(), strides.to_vec()),
                })
            }
            None if dense => Ok(Dest::Into { addr, end: addr + bytes, replaces: None }),
            None => match dense_order(sizes, strides) {
                Some(order) => Ok(Dest::Permuted {
                    addr,
                    end: addr + bytes,
                    order,
                    view: (sizes.to_vec(), strides.to_vec()),
                    replaces: None,
                }),
                None => Err(format!("written tensor {k} is strided")),
            },
        }
    }
}

/// One recorded call in this many is timed (see [`Stats::record_nanos`]).
const RECORD_TIMED_EVERY: u64 = 16;

thread_local! {
    static CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn record(
    key: usize,
    args: &[TpukArg],
    into: &[TpukArg],
    outs: &mut [TpukOut],
    info: Option<&TpukOpInfo>,
    call: *mut c_void,
) -> i32 {
    // A clock read costs a few percent of a call: one call in RECORD_TIMED_EVERY is timed.
    let start = CALLS.with(|n| {
        let k = n.get();
        n.set(k.wrapping_add(1));
        k.is_multiple_of(RECORD_TIMED_EVERY).then(Instant::now)
    });
    let Some(rt) = runtime_if_ready() else {
        device::set_message("the tpu device's runtime is not started".to_owned());
        return ERROR;
    };
    let mut r = recorder();
    // The signature is built in the recorder's scratch vector, kept for the next call.
    let mut sig = std::mem::take(&mut r.sig_scratch);
    if let Err(why) = signature(key, args, &mut sig) {
        r.sig_scratch = sig;
        let name = r.ops.get(&key).map(|o| o.name.clone());
        return r.decline(name.as_deref().unwrap_or("?"), why);
    }
    let known = r.sigs.get(&sig).cloned();
    let verdict = match known {
        Some(v) => {
            r.sig_scratch = sig;
            v
        }
        None => {
            let Some(info) = info else { return NEED_TYPES };
            r.stats.meta_runs += 1;
            let op = match r.ops.get(&key) {
                Some(o) => o.clone(),
                None => {
                    let names = text(info.arg_names, info.arg_names_len);
                    let name = text(info.name, info.name_len);
                    let op = Arc::new(OpInfo {
                        shape_only_self: SHAPE_ONLY_SELF.contains(&name.as_str()),
                        name,
                        arg_names: names.split_terminator('\n').map(str::to_owned).collect(),
                    });
                    r.ops.insert(key, op.clone());
                    op
                }
            };
            let id = r.sigs.len() as i64;
            let v = Arc::new(judge(rt, &op, args, info, id));
            r.sigs.insert(sig, v.clone());
            r.stats.signatures += 1;
            v
        }
    };
    let (id, op, types, lifted) = match &*verdict {
        Verdict::Declines { op, reason } => return r.decline(op, reason.clone()),
        Verdict::Records { id, op, outputs, lifted } => (*id, op.clone(), outputs, lifted),
    };
    let expected_outs = outs.len() + into.len();
    if types.len() != expected_outs {
        return r.decline(
            &op.name,
            format!("{} outputs where the op returns {expected_outs}", types.len()),
        );
    }
    // Resolve the arguments before changing anything, so a decline leaves the trace as it was.
    let mark = (r.nodes.len(), r.values.len(), r.inputs.len(), r.key.len(), r.lifted.len());
    let mut refs = Vec::with_capacity(args.len());
    let mut node_args = Vec::with_capacity(args.len());
    for (i, a) in args.iter().enumerate() {
        if lifted.contains(&i) {
            let x = float_at(a).unwrap_or_default();
            let ty = TensorType::new(types[0].dtype, Shape::scalar());
            refs.push(Some(r.lift(ty, &float_bytes(x, types[0].dtype))));
            node_args.push(Arg::Tensor(TensorRef::new(String::new())));
            continue;
        }
        if a.kind == KIND_TENSOR_LIST {
            let mut list = Vec::new();
            for e in elements(a) {
                if e.kind == KIND_NONE {
                    refs.push(None);
                    list.push(None);
                    continue;
                }
                if a.i == 1 && cpu_indices(e) {
                    // Copied now: a program input, as a lifted float is.
                    let ty = match tensor_type(i, e) {
                        Ok(t) => t,
                        Err(m) => {
                            r.rollback(mark);
                            return r.decline(&op.name, m);
                        }
                    };
                    // SAFETY: a CPU tensor's sizes and strides over its memory, alive for the
                    // call.
                    let data = unsafe {
                        crate::tensor::gather(
                            e.data.cast(),
                            tensor_dims(e),
                            tensor_strides(e),
                            ty.dtype.byte_size(),
                        )
                    };
                    refs.push(Some(r.lift(ty, &data)));
                    list.push(Some(TensorRef::new(String::new())));
                    continue;
                }
                match r.resolve(i, e, false) {
                    Ok(rf) => refs.push(Some(rf)),
                    Err(m) => {
                        r.rollback(mark);
                        return r.decline(&op.name, m);
                    }
                }
                list.push(Some(TensorRef::new(String::new())));
            }
            node_args.push(Arg::TensorList(list));
            continue;
        }
        let on_device = a.kind == KIND_TENSOR && a.device == ON_TPU;
        let resolved = if on_device {
            r.resolve(i, a, i == 0 && op.shape_only_self).map(Some)
        } else {
            Ok(None)
        };
        let arg = match &resolved {
            Ok(Some(_)) => Ok(Arg::Tensor(TensorRef::new(String::new()))),
            Ok(None) => static_arg(i, a),
            Err(m) => Err(m.clone()),
        };
        match (resolved, arg) {
            (Ok(rf), Ok(arg)) => {
                refs.push(rf);
                node_args.push(arg);
            }
            (Err(m), _) | (_, Err(m)) => {
                r.rollback(mark);
                return r.decline(&op.name, m);
            }
        }
    }
    let free = |mut dests: Vec<Dest>| {
        for d in dests.drain(..) {
            // Never handed out as a placeholder: not counted as held.
            if let Dest::Fresh(b) = d {
                HostPool::global().free(b);
            }
        }
    };
    // Kept for the next call, as the signature's vector is.
    let mut dests = std::mem::take(&mut r.dest_scratch);
    for (k, ty) in types.iter().enumerate() {
        let dest = match k.checked_sub(outs.len()).and_then(|w| into.get(w)) {
            Some(a) => match r.written_dest(k, a, ty) {
                Ok(d) => d,
                Err(m) => {
                    free(dests);
                    r.rollback(mark);
                    return r.decline(&op.name, m);
                }
            },
            None => match HostPool::global().allocate(numel(ty) * ty.dtype.byte_size()) {
                Ok(b) => Dest::Fresh(b),
                Err(e) => {
                    free(dests);
                    r.rollback(mark);
                    drop(r);
                    device::set_message(e.to_string());
                    return ERROR;
                }
            },
        };
        dests.push(dest);
    }
    let kept = match hooks().filter(|_| !call.is_null()).map(|h| (h.keep)(call)) {
        Some(k) if !k.is_null() => Kept(k),
        _ => {
            free(dests);
            r.rollback(mark);
            return r.decline(&op.name, "the shim could not keep the call".to_owned());
        }
    };
    let node = r.nodes.len();
    r.key.push(id);
    r.structure = fold(r.structure, key as u64);
    for rf in refs.iter().flatten() {
        r.key.push(ref_code(rf.graph));
        r.structure = fold(r.structure, ref_code(rf.graph) as u64);
    }
    // Floats left constants are part of the program: their values key it.
    for (i, a) in args.iter().enumerate() {
        if !lifted.contains(&i)
            && let Some(x) = float_at(a)
        {
            r.key.push(x.to_bits() as i64);
        }
    }
    let mut out_values = Vec::with_capacity(types.len());
    let mut scatters = Vec::new();
    let mut permutes = Vec::new();
    for (k, (ty, dest)) in types.iter().zip(dests.drain(..)).enumerate() {
        let v = r.values.len();
        let addr = match dest {
            Dest::Fresh(block) => {
                let addr = block.as_ptr() as usize;
                r.blocks.insert(addr, (addr + block.size(), v));
                device::fill_placeholder(&mut outs[k], ty, Placeholder(block));
                addr
            }
            Dest::Into { addr, end, replaces } => {
                if let Some(old) = replaces {
                    // The call overwrites that value's memory: it is no longer an output.
                    r.values[old].live = false;
                }
                r.blocks.insert(addr, (end, v));
                addr
            }
            Dest::Scatter { base, start, end, addr, plan, view } => {
                // The call's result, then the block's new value: the old one with the slice
                // replaced (recorded after the call's node, below).
                r.values.push(Value {
                    node,
                    out: k,
                    ty: ty.clone(),
                    home: Home::Block(addr),
                    live: false,
                    view: Some(view),
                    freed: false,
                });
                out_values.push(v);
                scatters.push((v, base, start, end, plan));
                continue;
            }
            Dest::Permuted { addr, end, order, view, replaces } => {
                if let Some(old) = replaces {
                    r.values[old].live = false;
                }
                r.values.push(Value {
                    node,
                    out: k,
                    ty: ty.clone(),
                    home: Home::Block(addr),
                    live: false,
                    view: Some(view),
                    freed: false,
                });
                out_values.push(v);
                permutes.push((v, addr, end, order));
                continue;
            }
        };
        r.values.push(Value {
            node,
            out: k,
            ty: ty.clone(),
            home: Home::Block(addr),
            live: true,
            view: None,
            freed: false,
        });
        out_values.push(v);
    }
    r.dest_scratch = dests;
    r.nodes.push(RecNode { op, args: node_args, refs, outs: out_values, kept: Some(kept) });
    for (v, base, start, end, plan) in scatters {
        r.scatter_into(v, base, start, end, plan);
    }
    for (v, addr, end, order) in permutes {
        // The block holds the result in its physical order: a permute of it, the program's
        // output there.
        let dims = r.values[v].ty.shape.static_dims().unwrap_or_default();
        let stored: Vec<u64> = order.iter().map(|&d| dims[d]).collect();
        let ty = TensorType::new(r.values[v].ty.dtype, Shape::of(&stored));
        let p = r.derived(
            Ref::Value(v),
            Derive::Permute,
            order.iter().map(|&d| d as i64).collect(),
            ty,
        );
        r.values[p].home = Home::Block(addr);
        r.values[p].live = true;
        r.blocks.insert(addr, (end, p));
    }
    PENDING.store(true, Ordering::Release);
    r.stats.recorded += 1;
    if let Some(start) = start {
        r.stats.record_nanos += start.elapsed().as_nanos() as u64;
        r.stats.record_timed += 1;
    }
    RECORDED
}

/// A unit of [`Recorder::lifted_bytes`]: aligned as the runtime's views of host memory need
/// (`VIEW_ALIGNMENT`).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct LiftSlot([u8; LIFT_SLOT]);

const LIFT_SLOT: usize = 64;

fn slot_bytes(slots: &[LiftSlot]) -> &[u8] {
    // SAFETY: `LiftSlot` is plain bytes (`repr(C)`, no padding: 64 bytes at alignment 64).
    unsafe { std::slice::from_raw_parts(slots.as_ptr().cast::<u8>(), slots.len() * LIFT_SLOT) }
}
const _: () = assert!(LIFT_SLOT == tpu_kernels_registry::pjrt::VIEW_ALIGNMENT);

impl Recorder {
    /// A program input of type `ty` holding `bytes`, taken at the call (a lifted float, CPU
    /// indices): the argument's reference to it.
    fn lift(&mut self, ty: TensorType, bytes: &[u8]) -> ArgRef {
        let j = self.lifted.len();
        let start = self.lifted_bytes.len() * LIFT_SLOT;
        let slots = bytes.len().div_ceil(LIFT_SLOT).max(1);
        self.lifted_bytes.resize(self.lifted_bytes.len() + slots, LiftSlot([0; LIFT_SLOT]));
        self.lifted_bytes_mut()[start..start + bytes.len()].copy_from_slice(bytes);
        self.lifted.push((ty, start..start + bytes.len()));
        let r = Ref::Lifted(j);
        ArgRef { graph: r, base: r, sizes: Vec::new(), strides: Vec::new(), offset: 0 }
    }

    /// The lifted inputs' arena as bytes.
    fn lifted_bytes(&self) -> &[u8] {
        slot_bytes(&self.lifted_bytes)
    }

    /// The zeros given to inputs only a type is taken of.
    fn zeros(&self) -> &[u8] {
        slot_bytes(&self.zero_slots)
    }

    fn lifted_bytes_mut(&mut self) -> &mut [u8] {
        let slots = &mut self.lifted_bytes;
        // SAFETY: `LiftSlot` is plain bytes (`repr(C)`, no padding: 64 bytes at alignment 64),
        // and the borrow is unique.
        unsafe {
            std::slice::from_raw_parts_mut(slots.as_mut_ptr().cast::<u8>(), slots.len() * LIFT_SLOT)
        }
    }

    /// Undoes a call's changes to the trace (a decline after its arguments were resolved).
    fn rollback(
        &mut self,
        (nodes, values, inputs, key, lifted): (usize, usize, usize, usize, usize),
    ) {
        if let Some((_, bytes)) = self.lifted.get(lifted) {
            self.lifted_bytes.truncate(bytes.start / LIFT_SLOT);
        }
        self.lifted.truncate(lifted);
        self.nodes.truncate(nodes);
        self.values.truncate(values);
        self.inputs.truncate(inputs);
        self.whole_inputs.retain(|_, k| *k < inputs);
        self.key.truncate(key);
        self.derivations.retain(|_, v| *v < values);
    }
}

pub(crate) fn api_record(
    key: usize,
    args: &[TpukArg],
    into: &[TpukArg],
    outs: &mut [TpukOut],
    info: *const TpukOpInfo,
    call: *mut c_void,
) -> i32 {
    // SAFETY: the shim passes null or an info alive for the call.
    let info = unsafe { info.as_ref() };
    record(key, args, into, outs, info, call)
}

// ----- the flush -----

impl Recorder {
    fn value_ref(&self, v: usize) -> TensorRef {
        let value = &self.values[v];
        TensorRef::output(format!("n{}", value.node), value.out)
    }

    /// What the graph calls a value, an input or a lifted float.
    fn graph_ref(&self, r: Ref) -> TensorRef {
        match r {
            Ref::Value(v) => self.value_ref(v),
            Ref::Input(k) => TensorRef::new(format!("in{k}")),
            Ref::Lifted(j) => TensorRef::new(format!("lift{j}")),
        }
    }

    /// The trace as a graph: its inputs, then one lent input per live value (`live`) but
    /// those written over an input (`over`, see [`Recorder::written_over_inputs`]).
    fn graph(&self, live: &[usize], over: &[(usize, usize)]) -> Graph {
        let mut inputs: Vec<Input> = self
            .inputs
            .iter()
            .enumerate()
            .map(|(k, x)| Input { name: format!("in{k}"), ty: x.ty.clone() })
            .collect();
        inputs.extend(
            self.lifted
                .iter()
                .enumerate()
                .map(|(j, (ty, _))| Input { name: format!("lift{j}"), ty: ty.clone() }),
        );
        inputs.extend(
            live.iter()
                .enumerate()
                .filter(|(j, _)| !over.iter().any(|&(_, o)| o == *j))
                .map(|(j, &v)| Input { name: format!("lent{j}"), ty: self.values[v].ty.clone() }),
        );
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| Node {
                name: format!("n{i}"),
                op: n.op.name.clone(),
                args: {
                    let mut refs =
                        n.refs.iter().map(|rf| rf.as_ref().map(|r| self.graph_ref(r.graph)));
                    n.args
                        .iter()
                        .map(|a| match a {
                            Arg::TensorList(list) => Arg::TensorList(
                                list.iter().map(|_| refs.next().flatten()).collect(),
                            ),
                            _ => refs.next().flatten().map_or_else(|| a.clone(), Arg::Tensor),
                        })
                        .collect()
                },
                kwargs: BTreeMap::new(),
                arg_names: n.op.arg_names.clone(),
                outputs: n.outs.iter().map(|&v| self.values[v].ty.clone()).collect(),
            })
            .collect();
        Graph {
            version: tpu_kernels_registry::graph::FORMAT_VERSION,
            name: "fused_native".to_owned(),
            inputs,
            nodes,
            outputs: live.iter().map(|&v| Some(self.value_ref(v))).collect(),
        }
    }

    /// The bytes of value `v` (a placeholder's block, or the value a reshape reads).
    fn home_of(&self, v: usize) -> usize {
        match self.values[v].home {
            Home::Block(addr) => addr,
            Home::Alias(src) => self.home_of(src),
            Home::Input(k) => self.inputs[k].addr,
        }
    }

    /// Whether an input of the pending trace reads memory in `[start, end)`.
    fn reads(&self, start: usize, end: usize) -> bool {
        self.inputs.iter().filter(|x| x.unread.is_none()).any(|x| {
            let (a, b) = input_span(x);
            a < end && b > start
        })
    }

    /// The live values (by their index in `live`) whose memory is exactly that of an input the
    /// trace reads whole, and which no other input or live value touches: `(input, index)`.
    /// An optimizer's parameters and states are such values: the program reads each and writes
    /// its new value back there. The program writes such an output into the input itself
    /// (donated), where a lent input of its own would share the input's memory, could not be
    /// donated, and would be written into a new buffer and copied back after the run.
    fn written_over_inputs(&self, live: &[usize]) -> Vec<(usize, usize)> {
        let spans: Vec<(usize, usize)> = live
            .iter()
            .map(|&v| {
                let start = self.home_of(v);
                (start, start + numel(&self.values[v].ty) * self.values[v].ty.dtype.byte_size())
            })
            .collect();
        let mut pairs = Vec::new();
        for (j, &v) in live.iter().enumerate() {
            let (start, end) = spans[j];
            if start == end {
                continue;
            }
            let Some(&k) = self.whole_inputs.get(&start) else { continue };
            let x = &self.inputs[k];
            if x.gather.is_some() || x.unread.is_some() || x.bytes != end - start {
                continue;
            }
            if x.ty != self.values[v].ty {
                continue;
            }
            let overlaps = |(a, b): (usize, usize)| a < end && b > start;
            let shared = self
                .inputs
                .iter()
                .enumerate()
                .any(|(k2, y)| k2 != k && y.unread.is_none() && overlaps(input_span(y)))
                || spans.iter().enumerate().any(|(j2, &sp)| j2 != j && overlaps(sp));
            if !shared {
                pairs.push((k, j));
            }
        }
        pairs
    }

    fn reset(&mut self) -> Vec<Deferred> {
        self.nodes.clear();
        self.values.clear();
        self.inputs.clear();
        self.whole_inputs.clear();
        self.lifted.clear();
        self.lifted_bytes.clear();
        self.blocks.clear();
        self.derivations.clear();
        self.key.clear();
        self.structure = 0;
        PENDING.store(false, Ordering::Release);
        std::mem::take(&mut self.deferred)
    }
}

/// Host views of the program's inputs: the trace's inputs, then the lent values' blocks.
///
/// # Safety
/// The inputs' memory is alive (device memory is not freed while a trace is pending) and the
/// lent blocks are the live placeholders', which only the program writes.
unsafe fn host_inputs<'a>(
    r: &'a Recorder,
    live: &'a [usize],
    over: &[(usize, usize)],
    gathered: &'a [Option<Vec<u8>>],
    zeros: &'a [u8],
) -> Vec<HostTensor<'a>> {
    let mut host = Vec::with_capacity(r.inputs.len() + r.lifted.len() + live.len());
    for (x, g) in r.inputs.iter().zip(gathered) {
        let data = match g {
            Some(bytes) => bytes.as_slice(),
            None if x.unread.is_some() => &zeros[..x.bytes],
            // No elements (its address may be null).
            None if x.bytes == 0 => &[],
            // SAFETY: the caller's contract: the input's bytes are alive.
            None => unsafe { std::slice::from_raw_parts(x.addr as *const u8, x.bytes) },
        };
        host.push(HostTensor { ty: &x.ty, data, contiguous: true });
    }
    let arena = r.lifted_bytes();
    for (ty, bytes) in &r.lifted {
        host.push(HostTensor { ty, data: &arena[bytes.clone()], contiguous: true });
    }
    for (j, &v) in live.iter().enumerate() {
        if over.iter().any(|&(_, o)| o == j) {
            continue;
        }
        let value = &r.values[v];
        let n = numel(&value.ty) * value.ty.dtype.byte_size();
        // SAFETY: a live placeholder's block, at least `n` bytes.
        let data = unsafe { std::slice::from_raw_parts(r.home_of(v) as *const u8, n) };
        host.push(HostTensor { ty: &value.ty, data, contiguous: true });
    }
    host
}

/// Runs the pending trace (see the module docs); `Err` is a message to raise at the
/// materialisation point (the trace is gone either way).
fn flush(reason: &str) -> Result<(), String> {
    let start = Instant::now();
    let mut r = recorder();
    if r.nodes.is_empty() {
        return Ok(());
    }
    let result = run_trace(&mut r, reason);
    r.stats.flush_nanos += start.elapsed().as_nanos() as u64;
    let deferred = r.reset();
    drop(r);
    for d in deferred {
        d.run();
    }
    result
}

fn run_trace(r: &mut Recorder, reason: &str) -> Result<(), String> {
    r.stats.flushes += 1;
    *r.stats.reasons.entry(reason.to_owned()).or_default() += 1;
    let live: Vec<usize> = (0..r.values.len()).filter(|&v| r.values[v].live).collect();
    if live.is_empty() {
        return Ok(());
    }
    let Some(rt) = runtime_if_ready() else {
        return Err("the tpu device's runtime is not started".to_owned());
    };
    let over = r.written_over_inputs(&live);
    let mut key = std::mem::take(&mut r.key);
    key.push(-2);
    key.extend(live.iter().map(|&v| v as i64));
    // Which outputs are written over an input is not in the recorded calls: the program
    // differs with it.
    key.push(-3);
    key.extend(over.iter().flat_map(|&(k, j)| [k as i64, j as i64]));
    let structure = live.iter().fold(fold(r.structure, u64::MAX), |h, &v| fold(h, v as u64));
    let compiled = r.compiled.get(&structure).copied().unwrap_or(0);
    if compiled >= recompile_limit()
        && !r.traces.contains_key(&key)
        && !r.evicted.contains_key(&key)
    {
        r.stats.limit_replays += 1;
        r.stats.last_limit = format!(
            "a trace of {} calls with shapes not seen before: {compiled} programs were compiled \
             for its structure, the recompile limit (TPUK_FUSED_RECOMPILE_LIMIT)",
            r.nodes.len()
        );
        return replay(r);
    }
    let failed = if let Some(why) = r.evicted.get(&key) {
        Err(format!("this trace's program was evicted from the trace cache: {why}"))
    } else {
        r.tick += 1;
        let tick = r.tick;
        let entry = match r.traces.get_mut(&key) {
            Some((e, used)) => {
                *used = tick;
                r.stats.hits += 1;
                Ok(e.clone())
            }
            None => {
                let t = Instant::now();
                let compiled = compile(rt, r, &live, &over);
                r.stats.compile_nanos += t.elapsed().as_nanos() as u64;
                *r.compiled.entry(structure).or_default() += 1;
                compiled
            }
            .map(|e| {
                r.stats.misses += 1;
                let e = Arc::new(e);
                if r.traces.len() >= TRACE_CACHE_SIZE
                    && let Some(oldest) =
                        r.traces.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| k.clone())
                {
                    r.traces.remove(&oldest);
                }
                r.traces.insert(key.clone(), (e.clone(), tick));
                e
            }),
        };
        let unread = r.inputs.iter().filter(|x| x.unread.is_some()).map(|x| x.bytes).max();
        let slots = unread.unwrap_or(0).div_ceil(LIFT_SLOT);
        if r.zero_slots.len() < slots {
            r.zero_slots.resize(slots, LiftSlot([0; LIFT_SLOT]));
        }
        entry.and_then(|e| {
            let t = Instant::now();
            let ran = run_entry(rt, r, &e, &live, &over);
            r.stats.run_nanos += t.elapsed().as_nanos() as u64;
            ran.inspect_err(|m| {
                r.traces.remove(&key);
                r.evicted.insert(key.clone(), m.clone());
                r.stats.evictions += 1;
                r.stats.last_eviction = m.clone();
            })
        })
    };
    // The key's memory serves the next trace's key (taken above, so that it is not regrown
    // from nothing, a reallocation at a time, while the next trace records).
    key.clear();
    r.key = key;
    match failed {
        Ok(()) => {
            r.stats.programs_run += 1;
            r.stats.outputs_written += live.len() as u64;
            Ok(())
        }
        Err(why) => {
            r.stats.replays += 1;
            replay(r).map_err(|m| {
                format!("the fused trace failed ({why}), and replaying it failed: {m}")
            })
        }
    }
}

fn compile(
    rt: &Runtime,
    r: &Recorder,
    live: &[usize],
    over: &[(usize, usize)],
) -> Result<Entry, String> {
    let graph = r.graph(live, over);
    let n = r.inputs.len() + r.lifted.len();
    let mut lent = n;
    let loans: Vec<(usize, usize)> = (0..live.len())
        .map(|j| match over.iter().find(|&&(_, o)| o == j) {
            Some(&(k, _)) => (k, j),
            None => {
                lent += 1;
                (lent - 1, j)
            }
        })
        .collect();
    let program = crate::torch_bridge::compile_graph_native(rt, &graph.to_json(), &loans)
        .map_err(|e| format!("the trace did not compile: {}", e.message))?;
    Ok(Entry { program, loans })
}

fn run_entry(
    rt: &Runtime,
    r: &Recorder,
    e: &Entry,
    live: &[usize],
    over: &[(usize, usize)],
) -> Result<(), String> {
    let start = Instant::now();
    let gathered: Vec<Option<Vec<u8>>> = r
        .inputs
        .iter()
        .map(|x| {
            x.gather.as_ref().map(|(sizes, strides)| {
                // SAFETY: the sizes and strides of a tensor over device memory, which stays
                // alive while the trace is pending.
                unsafe {
                    crate::tensor::gather(
                        x.addr as *const u8,
                        sizes,
                        strides,
                        x.ty.dtype.byte_size(),
                    )
                }
            })
        })
        .collect();
    // The inputs only a type is taken of share one buffer of zeros (see `Recorder::zeros`).
    let zeros = r.zeros();
    // SAFETY: device memory stays alive while the trace is pending; the lent blocks are live
    // placeholders', written by this program alone.
    let host = unsafe { host_inputs(r, live, over, &gathered, zeros) };
    // SAFETY: each loan is a lent value's block (see above), which no other input shares.
    let run = unsafe { e.program.run_lent(rt, &host, &e.loans) }?;
    for (j, out) in run.outputs.into_iter().enumerate() {
        let Some(buffer) = out else { continue };
        let dst = r.home_of(live[j]) as *mut u8;
        let ty = &r.values[live[j]].ty;
        let n = numel(ty) * ty.dtype.byte_size();
        buffer
            .read_in_place(|bytes| {
                // SAFETY: the value's block holds `n` bytes; the output is that value's type.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, n.min(bytes.len())) }
            })
            .map_err(|e| format!("reading output {j}: {e}"))?;
    }
    e.program.count_native_run(rt, start, run.in_place, run.by_copy);
    Ok(())
}

/// Replays the trace call by call on PyTorch's CPU kernels (through the shim), each value
/// into its placeholder's block, or a scratch block for a value nobody holds.
fn replay(r: &mut Recorder) -> Result<(), String> {
    let Some(h) = hooks() else { return Err("the shim keeps no calls".to_owned()) };
    let mut mem = ReplayMemory::default();
    let mut replayed = 0u64;
    let result = (|| {
        for v in 0..r.values.len() {
            if r.values[v].freed {
                mem.scratch(v, &r.values[v].ty)?;
            }
        }
        mem.unread_inputs(r)?;
        for i in 0..r.nodes.len() {
            if replay_call(r, &h, i, &mem, false)? {
                replayed += 1;
            }
        }
        Ok(())
    })();
    r.stats.replayed_calls += replayed;
    result
}

/// Scratch memory of replayed calls: for values (by the value whose block they would have
/// lived in), and for inputs only a type is taken of, which may have been freed and reused.
/// Goes back to the allocator when dropped.
#[derive(Default)]
struct ReplayMemory {
    values: HashMap<usize, HostBlock>,
    unread: HashMap<usize, HostBlock>,
}

impl ReplayMemory {
    fn scratch(&mut self, v: usize, ty: &TensorType) -> Result<(), String> {
        let b = HostPool::global()
            .allocate(numel(ty) * ty.dtype.byte_size())
            .map_err(|e| e.to_string())?;
        self.values.insert(v, b);
        Ok(())
    }

    fn unread_inputs(&mut self, r: &Recorder) -> Result<(), String> {
        for (k, x) in r.inputs.iter().enumerate() {
            if let Some(span) = x.unread {
                let b = HostPool::global().allocate(span).map_err(|e| e.to_string())?;
                self.unread.insert(k, b);
            }
        }
        Ok(())
    }
}

impl Drop for ReplayMemory {
    fn drop(&mut self) {
        // Scratch memory, never counted as held by a tensor.
        for (_, b) in self.values.drain().chain(self.unread.drain()) {
            HostPool::global().free(b);
        }
    }
}

/// The value whose memory `v` is (through its reshapes and permutes).
fn root(r: &Recorder, mut v: usize) -> usize {
    while let Home::Alias(src) = r.values[v].home {
        v = src;
    }
    v
}

/// Replays recorded call `i` on PyTorch's CPU kernels through the shim: `false` for a node the
/// recorder added (a reshape: its readers read its base). Its outputs go where their values
/// live (or their scratch), through the view a call wrote them by; `dense`: each into its
/// scratch block, dense (a scalar read).
fn replay_call(
    r: &Recorder,
    h: &TpukRecordHooks,
    i: usize,
    mem: &ReplayMemory,
    dense: bool,
) -> Result<bool, String> {
    let n = &r.nodes[i];
    let Some(kept) = &n.kept else { return Ok(false) };
    let at = |v: usize| -> usize {
        let v = root(r, v);
        mem.values.get(&v).map_or_else(|| r.home_of(v), |b| b.as_ptr() as usize)
    };
    // A value or an input taken whole kept no geometry: its own dims, row-major.
    let whole: Vec<Option<(Vec<i64>, Vec<i64>)>> = n
        .refs
        .iter()
        .flatten()
        .map(|rf| {
            let ty = match rf.base {
                _ if !rf.sizes.is_empty() => return None,
                Ref::Value(v) => &r.values[v].ty,
                Ref::Input(k) => &r.inputs[k].ty,
                Ref::Lifted(_) => return None,
            };
            let d = dims_i64(ty);
            let st = crate::torch_bridge::compact_strides(&d);
            Some((d, st))
        })
        .collect();
    let mut tensors: Vec<TpukArg> = Vec::new();
    for (rf, whole) in n.refs.iter().flatten().zip(&whole) {
        let (sizes, strides) = whole.as_ref().map_or((&rf.sizes, &rf.strides), |(d, st)| (d, st));
        let (dtype, addr) = match rf.base {
            Ref::Value(v) => (r.values[v].ty.dtype, at(v) + rf.offset),
            Ref::Input(k) => {
                let addr = mem.unread.get(&k).map_or(r.inputs[k].addr, |b| b.as_ptr() as usize);
                (r.inputs[k].ty.dtype, addr + rf.offset)
            }
            // The kept call holds the float itself.
            Ref::Lifted(_) => continue,
        };
        let code = device::code_of_dtype(dtype).unwrap_or(-1);
        tensors.push(device::tensor_arg(code, addr as *const c_void, sizes, strides));
    }
    let through_view = |v: usize| if dense { None } else { r.values[v].view.as_ref() };
    let geometry: Vec<(Vec<i64>, Vec<i64>)> = n
        .outs
        .iter()
        .map(|&v| {
            through_view(v).cloned().unwrap_or_else(|| {
                let d = dims_i64(&r.values[v].ty);
                let st = crate::torch_bridge::compact_strides(&d);
                (d, st)
            })
        })
        .collect();
    let outs: Vec<TpukArg> = n
        .outs
        .iter()
        .zip(&geometry)
        .map(|(&v, (d, st))| {
            let code = device::code_of_dtype(r.values[v].ty.dtype).unwrap_or(-1);
            let addr = match (through_view(v), r.values[v].home) {
                (Some(_), Home::Block(a)) => a,
                _ => at(v),
            };
            device::tensor_arg(code, addr as *const c_void, d, st)
        })
        .collect();
    let mut err = [0u8; 512];
    let rc = (h.replay)(
        kept.0,
        tensors.as_ptr(),
        tensors.len(),
        outs.as_ptr(),
        outs.len(),
        err.as_mut_ptr().cast(),
        err.len(),
    );
    if rc != RECORDED {
        let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
        return Err(format!("call {i} ({}): {}", n.op.name, String::from_utf8_lossy(&err[..end])));
    }
    Ok(true)
}

/// At most this many recorded calls are replayed to answer a scalar read without a flush.
const SCALAR_READ_CALLS: usize = 16;

/// The value of a one-element device tensor (what `.item()` reads) without running the
/// pending trace, when it is known exactly. Memory no recorded call writes holds its value
/// already. A pending value that at most [`SCALAR_READ_CALLS`] recorded calls compute, each
/// with integer or boolean outputs only, is replayed on PyTorch's CPU kernels into scratch
/// memory: exact there as in the program, so the trace goes on and computes the same value at
/// its flush. A mask's `.all()` that drives Python control flow (transformers' attention masks)
/// then ends no trace. `Ok(false)`: the read must flush.
pub(crate) fn scalar_read(a: &TpukArg, out: &mut [u8]) -> Result<bool, String> {
    if !PENDING.load(Ordering::Acquire) {
        return Ok(false);
    }
    let Some(h) = hooks() else { return Ok(false) };
    let mut r = recorder();
    if r.nodes.is_empty() || a.kind != KIND_TENSOR || a.device != ON_TPU {
        return Ok(false);
    }
    let ty = tensor_type(0, a)?;
    if numel(&ty) != 1 || out.len() != ty.dtype.byte_size() {
        return Ok(false);
    }
    // Resolving may add reshape nodes and inputs to the trace: taken back below.
    let mark = (r.nodes.len(), r.values.len(), r.inputs.len(), r.key.len(), r.lifted.len());
    let answer = match r.resolve(0, a, false) {
        Ok(rf) => exact_scalar(&r, &h, &rf, out),
        Err(_) => None,
    };
    r.rollback(mark);
    let Some(calls) = answer else { return Ok(false) };
    r.stats.scalar_reads += 1;
    r.stats.scalar_read_calls += calls;
    Ok(true)
}

/// [`scalar_read`]'s answer into `out`: the number of calls replayed, or None.
fn exact_scalar(r: &Recorder, h: &TpukRecordHooks, rf: &ArgRef, out: &mut [u8]) -> Option<u64> {
    let v = match rf.base {
        Ref::Input(k) => {
            // SAFETY: device memory no recorded call writes, alive while the trace is pending;
            // the argument's element lies `offset` bytes into it.
            let src = unsafe {
                std::slice::from_raw_parts((r.inputs[k].addr + rf.offset) as *const u8, out.len())
            };
            out.copy_from_slice(src);
            return Some(0);
        }
        Ref::Value(v) => root(r, v),
        Ref::Lifted(_) => return None,
    };
    // The calls the value depends on, each exact on PyTorch.
    let mut need = std::collections::BTreeSet::new();
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        if !matches!(r.values[v].home, Home::Block(_)) {
            return None;
        }
        let i = r.values[v].node;
        if !need.insert(i) {
            continue;
        }
        let n = &r.nodes[i];
        if need.len() > SCALAR_READ_CALLS || n.kept.is_none() {
            return None;
        }
        if n.outs.iter().any(|&o| r.values[o].view.is_some() || r.values[o].ty.dtype.is_float()) {
            return None;
        }
        for rf in n.refs.iter().flatten() {
            match rf.base {
                Ref::Value(u) => stack.push(root(r, u)),
                Ref::Input(_) => {}
                Ref::Lifted(_) => return None,
            }
        }
    }
    let mut mem = ReplayMemory::default();
    for &i in &need {
        for &o in &r.nodes[i].outs {
            mem.scratch(o, &r.values[o].ty).ok()?;
        }
    }
    mem.unread_inputs(r).ok()?;
    for &i in &need {
        // A call that fails here fails in the flush too, which reports it.
        replay_call(r, h, i, &mem, true).ok()?;
    }
    let at = mem.values.get(&v)?.as_ptr() as usize + rf.offset;
    // SAFETY: the value's scratch block holds it densely; the element lies `offset` bytes in.
    out.copy_from_slice(unsafe { std::slice::from_raw_parts(at as *const u8, out.len()) });
    Some(need.len() as u64)
}

pub(crate) extern "C" fn api_flush(reason: *const c_char, len: usize) -> i32 {
    let reason = text(reason, len);
    let result = std::panic::catch_unwind(|| {
        flush(if reason.is_empty() { "materialisation" } else { &reason })
    });
    match result {
        Ok(Ok(())) => RECORDED,
        Ok(Err(m)) => {
            device::set_message(format!("tpu fused mode: {m}"));
            ERROR
        }
        Err(_) => {
            device::set_message("internal error: the tpu device's flush panicked".to_owned());
            ERROR
        }
    }
}

/// Runs the pending trace before the bridge reads device memory (`reason` names who reads).
pub(crate) fn materialise(reason: &str) -> Result<(), String> {
    if !PENDING.load(Ordering::Acquire) {
        return Ok(());
    }
    flush(reason).map_err(|m| format!("tpu fused mode: {m}"))
}

/// The recorder's counters.
pub(crate) fn stats() -> (Stats, usize, usize) {
    let r = recorder();
    (r.stats.clone(), r.traces.len(), r.nodes.len())
}
