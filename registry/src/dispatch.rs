//! The eager dispatcher: one op call at a time through a selected kernel on a PJRT client.
//!
//! A call is memoised by (op, input types, static values, contiguity): the first call selects,
//! specialises, compiles (through the [`CompileCache`]) and remembers the executable; later calls
//! with the same metadata go straight to upload, execute, done. Any kernel-side failure (no
//! kernel, a build, compile or execute error, bad host data) becomes a [`Fallback`] with a
//! reason, counted per op; the caller then runs the original op. With [`Dispatcher::no_fallback`]
//! set, fallbacks are errors instead.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tpu_kernels::registration::{KernelSignature, Platform, StaticValue};
use tpu_kernels::{BuildError, DType, TensorType};

use crate::cache::CompileCache;
use crate::host_pool::PooledBlock;
use crate::index::{CallMeta, Kernel, NoKernel, Registry, normalize_op, platform_from_name};
use crate::pjrt::{
    self, Buffer, Client, CompileOptions, ElementType, HostInput, Input, LoadedExecutable, Program,
};

/// The PJRT element type of a dtype (`None` for the fp8 types, which PJRT buffers here do not
/// carry).
pub fn element_type(dtype: DType) -> Option<ElementType> {
    Some(match dtype {
        DType::F32 => ElementType::F32,
        DType::F64 => ElementType::F64,
        DType::BF16 => ElementType::BF16,
        DType::F16 => ElementType::F16,
        DType::I8 => ElementType::S8,
        DType::I16 => ElementType::S16,
        DType::I32 => ElementType::S32,
        DType::I64 => ElementType::S64,
        DType::U8 => ElementType::U8,
        DType::U32 => ElementType::U32,
        DType::Bool => ElementType::Pred,
        _ => return None,
    })
}

/// The dtype of a PJRT element type.
pub fn dtype_of(ty: ElementType) -> Option<DType> {
    DType::ALL.into_iter().find(|d| element_type(*d) == Some(ty))
}

fn pjrt_shape(ty: &TensorType) -> Result<(ElementType, Vec<i64>), String> {
    let element = element_type(ty.dtype).ok_or_else(|| format!("{ty} has no PJRT buffer type"))?;
    let dims = ty
        .shape
        .static_dims()
        .ok_or_else(|| format!("{ty} has symbolic dimensions"))?
        .into_iter()
        .map(|d| d as i64)
        .collect();
    Ok((element, dims))
}

/// Copies row-major `data` of type `ty` to `client`'s first device. The error names what is
/// wrong (a dtype PJRT buffers do not carry, a symbolic shape, a length that does not match).
pub fn upload(client: &Client, ty: &TensorType, data: &[u8]) -> Result<Buffer, String> {
    let (element, dims) = pjrt_shape(ty)?;
    client.buffer_from_bytes(data, element, &dims).map_err(|e| e.to_string())
}

/// [`upload`] onto `device` (one shard of a sharded program's input).
pub fn upload_on(
    client: &Client,
    ty: &TensorType,
    data: &[u8],
    device: &crate::pjrt::Device,
) -> Result<Buffer, String> {
    let (element, dims) = pjrt_shape(ty)?;
    client.buffer_from_bytes_on(data, element, &dims, device).map_err(|e| e.to_string())
}

/// Row-major `data` of type `ty` as an execution input: read in place where the client can
/// alias host memory, else a copy (see [`Client::host_input`]).
pub fn upload_input<'a>(
    client: &Client,
    ty: &TensorType,
    data: &'a [u8],
) -> Result<HostInput<'a>, String> {
    let (element, dims) = pjrt_shape(ty)?;
    client.host_input(data, element, &dims).map_err(|e| e.to_string())
}

/// [`upload_input`] through `views`: an input at the address, type and shape of a recent one
/// (a parameter, each step) takes its cached view.
pub fn upload_input_cached<'a>(
    views: &pjrt::ViewCache,
    client: &Client,
    ty: &TensorType,
    data: &'a [u8],
) -> Result<HostInput<'a>, String> {
    let (element, dims) = pjrt_shape(ty)?;
    views.input(client, data, element, &dims).map_err(|e| e.to_string())
}

/// Every input as an execution input (see [`upload_input`]); the error names the input.
pub fn upload_all<'a>(
    client: &Client,
    inputs: &[HostTensor<'a>],
) -> Result<Vec<HostInput<'a>>, String> {
    inputs
        .iter()
        .enumerate()
        .map(|(i, t)| upload_input(client, t.ty, t.data).map_err(|e| format!("input {i}: {e}")))
        .collect()
}

/// The outputs of an execution that wrote some of them into its inputs' memory
/// ([`execute_lending`]).
#[derive(Debug)]
pub struct LentRun {
    /// Per output: `None` where its value is now in the memory of the input lent for it.
    pub outputs: Vec<Option<Buffer>>,
    /// Outputs the program wrote into the lent memory itself (donated).
    pub in_place: u64,
    /// Outputs copied into the lent memory after the run (the runtime could not alias it, or
    /// another input shares it).
    pub by_copy: u64,
    /// Outputs written into memory from the caching allocator lent for them (extra
    /// parameters of the program): each such output owns its block, which goes back to the
    /// pool when the output is dropped.
    pub pooled: u64,
    /// Outputs given pool memory that the runtime wrote into a fresh buffer instead.
    pub pool_missed: u64,
}

/// Memory from the caching allocator lent for one output: the block goes back to the pool
/// only once the runtime is done with it (the loan waited for), however the run ends.
struct PoolLoan {
    output: usize,
    loan: Option<crate::pjrt::HostLoan>,
    block: Option<PooledBlock>,
}

impl Drop for PoolLoan {
    fn drop(&mut self) {
        if let Some(loan) = self.loan.take() {
            // Nothing to report to: the run already failed, or its output was not aliased.
            let _ = loan.wait();
        }
        self.block.take();
    }
}

/// Why [`execute_lending`] did not run ([`LendError::Input`]: nothing was written) or failed.
#[derive(Clone, Debug)]
pub enum LendError {
    Input(String),
    Run(String),
}

/// Runs `executable` on `inputs`, with each `(input, output)` of `loans` lent: the program's
/// output is written into that input's memory, through donation (`kMutableZeroCopy`: the
/// program's `tf.aliasing_output` makes the output that memory) or, where the runtime does
/// not alias it, by a copy after the run. An input that shares memory with another input is
/// not donated (the program still reads that input), and is updated by the copy; two lent
/// inputs sharing memory are refused before anything runs. Other inputs are read in place
/// through `views` where possible.
///
/// A program that also takes, after `inputs`, one parameter per entry of `pooled` (an output
/// and its type), aliased to that output and never read (see
/// `reader::Module::with_output_params`), gets a block from the caching allocator for each,
/// lent to the run; the output written there owns the block ([`LentRun::pooled`]). Such
/// outputs come back without faulting in new pages: the blocks are reused memory.
///
/// # Safety
/// For each loan, `inputs[input].data` is memory the caller may write: valid for the call, and
/// read or written by no one else during it (other inputs excepted).
pub unsafe fn execute_lending(
    client: &Client,
    views: &pjrt::ViewCache,
    executable: &LoadedExecutable,
    inputs: &[HostTensor<'_>],
    loans: &[(usize, usize)],
    pooled: &[(usize, &TensorType)],
) -> Result<LentRun, LendError> {
    let span = |t: &HostTensor<'_>| {
        let start = t.data.as_ptr() as usize;
        (start, start + t.data.len())
    };
    let overlaps = |a: (usize, usize), b: (usize, usize)| a.0 < b.1 && b.0 < a.1;
    let lent_inputs: Vec<usize> = loans.iter().map(|&(i, _)| i).collect();
    let mut donate = vec![false; inputs.len()];
    for &(i, out) in loans {
        let t = inputs.get(i).ok_or_else(|| {
            LendError::Input(format!("input {i}, lent for output {out}, is not an input"))
        })?;
        donate[i] = true;
        for (j, other) in inputs.iter().enumerate() {
            if j == i || t.data.is_empty() || other.data.is_empty() {
                continue;
            }
            if overlaps(span(t), span(other)) {
                if lent_inputs.contains(&j) {
                    return Err(LendError::Input(format!(
                        "inputs {i} and {j}, both updated in place, share memory"
                    )));
                }
                donate[i] = false;
            }
        }
    }
    let mut loaned = Vec::new();
    let mut lent_buffers: Vec<Option<Buffer>> = Vec::with_capacity(inputs.len());
    for (i, t) in inputs.iter().enumerate() {
        let mut buffer = None;
        if donate[i] {
            let (element, dims) =
                pjrt_shape(t.ty).map_err(|e| LendError::Input(format!("input {i}: {e}")))?;
            // SAFETY: the caller lends input `i`'s memory (it has a loan), and no other input
            // shares it (checked above).
            let loan = unsafe {
                client.lend_host_memory(t.data.as_ptr().cast_mut(), t.data.len(), element, &dims)
            }
            .map_err(|e| LendError::Input(format!("input {i}: {e}")))?;
            if let Some((b, loan)) = loan {
                buffer = Some(b);
                loaned.push(loan);
            }
        }
        lent_buffers.push(buffer);
    }
    let mut held = Vec::with_capacity(inputs.len());
    for (i, t) in inputs.iter().enumerate() {
        if lent_buffers[i].is_some() {
            continue;
        }
        let input = pjrt_shape(t.ty)
            .and_then(|(element, dims)| {
                views.input(client, t.data, element, &dims).map_err(|e| e.to_string())
            })
            .map_err(|e| LendError::Input(format!("input {i}: {e}")))?;
        held.push(input);
    }
    let mut pool_loans = Vec::with_capacity(pooled.len());
    let mut pool_args = Vec::with_capacity(pooled.len());
    for &(k, ty) in pooled {
        let fail = |e: String| LendError::Input(format!("output {k}: {e}"));
        let (element, dims) = pjrt_shape(ty).map_err(fail)?;
        let len =
            ty.shape.num_elements().unwrap_or(0) as usize * element.size_in_bytes().unwrap_or(0);
        if len == 0 {
            pool_args.push(
                client.buffer_from_bytes(&[], element, &dims).map_err(|e| fail(e.to_string()))?,
            );
            continue;
        }
        let block = PooledBlock::allocate(len).map_err(|e| fail(e.to_string()))?;
        // SAFETY: the block is fresh from the pool, `len` bytes or more, and owned here: nothing
        // else reads or writes it until the loan ends.
        let lent = unsafe { client.lend_host_memory(block.as_ptr(), len, element, &dims) }
            .map_err(|e| fail(e.to_string()))?;
        let Some((buffer, loan)) = lent else {
            return Err(fail(format!(
                "the {} client cannot write into host memory",
                client.platform()
            )));
        };
        pool_args.push(buffer);
        pool_loans.push(PoolLoan { output: k, loan: Some(loan), block: Some(block) });
    }
    let mut held_iter = held.iter();
    let mut args = Vec::with_capacity(inputs.len() + pool_args.len());
    for b in &mut lent_buffers {
        match b.take() {
            Some(b) => args.push(Input::Donated(b)),
            None => match held_iter.next() {
                Some(h) => args.push(Input::Borrowed(h)),
                None => return Err(LendError::Input("an input has no buffer".to_owned())),
            },
        }
    }
    args.extend(pool_args.into_iter().map(Input::Donated));
    let outputs = executable.execute_with(args).map_err(|e| LendError::Run(e.to_string()))?;
    drop(held);
    let mut outputs: Vec<Option<Buffer>> = outputs.into_iter().map(Some).collect();
    let (mut in_place, mut by_copy) = (0, 0);
    for &(i, k) in loans {
        let Some(out) = outputs.get(k).and_then(Option::as_ref) else {
            return Err(LendError::Run(format!(
                "output {k}, to be written into input {i}, is not an output of the program"
            )));
        };
        let target = inputs[i].data;
        let landed = out
            .read_in_place(|bytes| {
                if bytes.as_ptr() == target.as_ptr() {
                    return Ok(true);
                }
                if bytes.len() != target.len() {
                    return Err(format!(
                        "output {k} has {} bytes, input {i} {}",
                        bytes.len(),
                        target.len()
                    ));
                }
                // SAFETY: the caller lends `target` for writing; the output is a distinct
                // allocation of the same length.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        target.as_ptr().cast_mut(),
                        bytes.len(),
                    );
                }
                Ok(false)
            })
            .map_err(|e| LendError::Run(e.to_string()))?
            .map_err(LendError::Run)?;
        if landed {
            in_place += 1;
        } else {
            by_copy += 1;
        }
        // The output aliasing lent memory goes before the runtime releases the memory.
        outputs[k] = None;
    }
    for loan in loaned {
        loan.wait().map_err(|e| LendError::Run(e.to_string()))?;
    }
    let (mut pooled, mut pool_missed) = (0, 0);
    // Loans still open: blocks whose output is not in them. They are waited for (and the
    // blocks given back) only after every output that may alias a block is dropped.
    let mut open = Vec::new();
    let mut failure = None;
    for mut p in pool_loans {
        let k = p.output;
        let at = p.block.as_ref().map_or(std::ptr::null_mut(), PooledBlock::as_ptr);
        let landed = match outputs.get_mut(k).and_then(Option::as_mut) {
            None => Err(format!("output {k}, given pool memory, is not an output of the program")),
            Some(out) => out
                .read_in_place(|bytes| bytes.as_ptr() == at.cast_const())
                .map_err(|e| e.to_string())
                .and_then(|landed| {
                    let (Some(loan), Some(block)) = (p.loan.take(), p.block.take()) else {
                        return Ok(false);
                    };
                    if !landed {
                        p.loan = Some(loan);
                        p.block = Some(block);
                        return Ok(false);
                    }
                    out.keep_lent_memory(loan, Box::new(block)).map_err(|e| e.to_string())?;
                    Ok(true)
                }),
        };
        match landed {
            Ok(true) => pooled += 1,
            Ok(false) => {
                pool_missed += 1;
                open.push(p);
            }
            Err(m) => {
                failure.get_or_insert(m);
                open.push(p);
            }
        }
    }
    if let Some(m) = failure {
        drop(outputs);
        drop(open);
        return Err(LendError::Run(m));
    }
    drop(open);
    Ok(LentRun { outputs, in_place, by_copy, pooled, pool_missed })
}

/// One input of an eager call: row-major host bytes (borrowed) and their type.
#[derive(Clone, Copy, Debug)]
pub struct HostTensor<'a> {
    pub ty: &'a TensorType,
    pub data: &'a [u8],
    /// False for strided views: kernels take contiguous inputs only, so the call falls back.
    pub contiguous: bool,
}

/// Why a call did not run a kernel.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum FallbackReason {
    NoKernel(NoKernel),
    Build(BuildError),
    Compile(String),
    Execute(String),
    BadInput(String),
}

impl FallbackReason {
    /// Whether this is an error in a kernel or in this project's code (a build, compile or
    /// execute failure), as opposed to no kernel taking the call (`no_kernel`, `bad_input`).
    /// A kernel body's own refusal ([`tpu_kernels::ErrorKind::Unsupported`]) is no error.
    pub fn is_error(&self) -> bool {
        match self {
            FallbackReason::Build(b) => b.kind != tpu_kernels::ErrorKind::Unsupported,
            FallbackReason::Compile(_) | FallbackReason::Execute(_) => true,
            _ => false,
        }
    }

    /// A short category for counters: `no_kernel`, `unsupported` (the kernel body refused the
    /// call), `bad_input` (no kernel takes it), `build`, `compile`, `execute` (errors).
    pub fn category(&self) -> &'static str {
        match self {
            FallbackReason::NoKernel(_) => "no_kernel",
            FallbackReason::Build(b) if b.kind == tpu_kernels::ErrorKind::Unsupported => {
                "unsupported"
            }
            FallbackReason::Build(_) => "build",
            FallbackReason::Compile(_) => "compile",
            FallbackReason::Execute(_) => "execute",
            FallbackReason::BadInput(_) => "bad_input",
        }
    }
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FallbackReason::NoKernel(e) => write!(f, "{e}"),
            FallbackReason::Build(e) => write!(f, "{e}"),
            FallbackReason::Compile(m) => write!(f, "compile failed: {m}"),
            FallbackReason::Execute(m) => write!(f, "execute failed: {m}"),
            FallbackReason::BadInput(m) => write!(f, "bad input: {m}"),
        }
    }
}

/// A call that ran no kernel: the caller runs the original op.
#[derive(Clone, Debug, thiserror::Error)]
#[error("`{op}` falls back{}: {reason}", kernel.as_ref().map(|k| format!(" from kernel `{k}`")).unwrap_or_default())]
pub struct Fallback {
    pub op: String,
    pub kernel: Option<String>,
    pub reason: FallbackReason,
}

/// Why a whole graph did not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphRunError {
    #[error("lowering: {0}")]
    Lower(Box<crate::graph::LowerError>),
    #[error("compile: {0}")]
    Compile(String),
    #[error("execute: {0}")]
    Execute(String),
    #[error("bad input: {0}")]
    BadInput(String),
}

/// What [`Dispatcher::call`] returns instead of outputs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// No kernel ran; run the original op.
    #[error(transparent)]
    Fallback(Fallback),
    /// [`Dispatcher::no_fallback`] is set: the fallback is an error.
    #[error("fallback forbidden: {0}")]
    Forbidden(Fallback),
}

impl DispatchError {
    pub fn fallback(&self) -> &Fallback {
        match self {
            DispatchError::Fallback(f) | DispatchError::Forbidden(f) => f,
        }
    }
}

/// What a call is memoised by: the normalised op, the input types and contiguity, the statics.
#[derive(Clone, Debug)]
struct CallKey {
    op: String,
    inputs: Vec<TensorType>,
    statics: Vec<(&'static str, StaticValue)>,
    contiguous: Vec<bool>,
}

/// `op` without its `.default` suffix when it has no overload: the normalised name is this
/// followed by `.default` when the flag is set (see [`normalize_op`]), built without allocating.
fn op_parts(op: &str) -> (&str, bool) {
    let name = op.rsplit("::").next().unwrap_or(op);
    (op, !name.contains('.'))
}

/// Statics are equal when their values are, floats compared bit for bit (so a NaN static
/// finds its memo entry again).
fn same_static(a: &StaticValue, b: &StaticValue) -> bool {
    match (a, b) {
        (StaticValue::Float(x), StaticValue::Float(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

impl CallKey {
    fn new(op: &str, inputs: &[HostTensor<'_>], statics: &[(&'static str, StaticValue)]) -> Self {
        CallKey {
            op: normalize_op(op),
            inputs: inputs.iter().map(|t| t.ty.clone()).collect(),
            statics: statics.to_vec(),
            contiguous: inputs.iter().map(|t| t.contiguous).collect(),
        }
    }

    /// The memo's hash of a call, computed from the borrowed call without allocating.
    fn hash_of(
        op: &str,
        inputs: &[HostTensor<'_>],
        statics: &[(&'static str, StaticValue)],
    ) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        let (name, default) = op_parts(op);
        name.hash(&mut h);
        default.hash(&mut h);
        for t in inputs {
            t.ty.hash(&mut h);
            t.contiguous.hash(&mut h);
        }
        for (k, v) in statics {
            k.hash(&mut h);
            match v {
                StaticValue::Int(i) => (0u8, *i).hash(&mut h),
                StaticValue::Float(f) => (1u8, f.to_bits()).hash(&mut h),
                StaticValue::Bool(b) => (2u8, *b).hash(&mut h),
                StaticValue::Str(s) => (3u8, s.as_str()).hash(&mut h),
            }
        }
        h.finish()
    }

    /// Whether this key is the borrowed call's.
    fn matches(
        &self,
        op: &str,
        inputs: &[HostTensor<'_>],
        statics: &[(&'static str, StaticValue)],
    ) -> bool {
        let (name, default) = op_parts(op);
        let same_op = if default {
            self.op.len() == name.len() + ".default".len()
                && self.op.starts_with(name)
                && self.op.ends_with(".default")
        } else {
            self.op == name
        };
        same_op
            && self.inputs.len() == inputs.len()
            && self.inputs.iter().zip(inputs).all(|(a, b)| a == b.ty)
            && self.contiguous.iter().zip(inputs).all(|(a, b)| *a == b.contiguous)
            && self.statics.len() == statics.len()
            && self
                .statics
                .iter()
                .zip(statics)
                .all(|((ka, va), (kb, vb))| ka == kb && same_static(va, vb))
    }
}

/// The memoised calls whose keys share one hash.
type MemoBucket = Vec<(CallKey, Arc<Prepared>)>;

/// A memoised call: the kernel, its executable and the output types.
#[derive(Debug)]
struct Prepared {
    /// The normalised op.
    op: String,
    kernel: Arc<Kernel>,
    executable: Arc<LoadedExecutable>,
    /// Outputs the executable takes pool memory for, as parameters after the inputs, in this
    /// order (empty: it writes fresh buffers).
    pooled: Vec<(usize, TensorType)>,
}

/// The least output size, summed over a call's outputs, for which an eager call on the CPU
/// writes its outputs into memory from the caching allocator rather than into fresh buffers
/// (`TPUK_POOL_OUTPUTS_MIN_BYTES` overrides it). Fresh buffers of this size come from the
/// system's allocator as new pages, each one faulted in as the kernel writes it, and cost
/// more than the kernel itself (docs/perf-log.md); below it, lending the memory costs more
/// than it saves.
pub const POOL_OUTPUTS_MIN_BYTES: usize = 256 << 10;

/// The outputs of `module`'s entry not written into an argument, with their types, and their
/// bytes summed; `None` when the entry cannot be found or a type has no size.
/// `text` rewritten so that its outputs not aliased to an input take their memory as extra
/// parameters after the inputs (`reader::Module::with_output_params`), with those outputs, when
/// they total at least `min_bytes`; None when they do not, or the text cannot be read or
/// rewritten (the program then keeps fresh outputs). Run such a program with
/// [`execute_lending`]'s `pooled`.
pub fn with_pooled_outputs(
    text: &str,
    min_bytes: usize,
) -> Option<(String, Vec<(usize, TensorType)>)> {
    let module = tpu_kernels::reader::parse_module(text).ok()?;
    let (outputs, bytes) = unaliased_outputs(&module)?;
    if outputs.is_empty() || bytes < min_bytes {
        return None;
    }
    let ks: Vec<usize> = outputs.iter().map(|(k, _)| *k).collect();
    Some((module.with_output_params(&ks).ok()?, outputs))
}

fn unaliased_outputs(
    module: &tpu_kernels::reader::Module<'_>,
) -> Option<(Vec<(usize, TensorType)>, usize)> {
    let main = module.main().ok()?;
    let aliased = |k: usize| {
        main.args.iter().any(|a| {
            a.attributes.iter().any(|(name, value)| {
                name.trim_matches('"') == "tf.aliasing_output"
                    && value.split(':').next().map(str::trim) == Some(&*k.to_string())
            })
        })
    };
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for (k, r) in main.results.iter().enumerate() {
        if aliased(k) {
            continue;
        }
        let size = element_type(r.ty.dtype)?.size_in_bytes()?;
        bytes = bytes.saturating_add(r.ty.shape.num_elements()? as usize * size);
        out.push((k, r.ty.clone()));
    }
    Some((out, bytes))
}

/// The platform kernels are selected for on a client that reports `name`; an error naming it
/// when kernels are selected for no such platform (never a silent CPU).
fn client_platform(name: &str) -> Result<Platform, pjrt::Error> {
    platform_from_name(name)
        .ok_or_else(|| pjrt::Error::UnknownPlatform { platform: name.to_owned() })
}

/// The next tick of a process-wide clock that orders fallback records: every dispatcher's and
/// any other recorder's (the Python dispatch modes record theirs on it too), so the latest
/// fallback of an op can be told whoever recorded it.
pub fn next_fallback_seq() -> u64 {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

/// Per-op counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpStats {
    pub calls: u64,
    pub substituted: u64,
    /// Fallbacks by reason category.
    pub fallbacks: BTreeMap<&'static str, u64>,
    /// The last fallback's message.
    pub last_fallback: Option<String>,
    /// When it was recorded, on the process-wide [`next_fallback_seq`] clock (0: never).
    pub last_fallback_seq: u64,
    /// Kernels that ran, with counts.
    pub kernels: BTreeMap<String, u64>,
    /// Inputs an in-place call updated in their own memory (donated to the program).
    pub updated_in_place: u64,
    /// Inputs an in-place call updated through a copy of the new value (memory the runtime
    /// could not alias, or an input sharing memory with another).
    pub updated_by_copy: u64,
    /// Outputs written into reused memory from the caching allocator (calls whose outputs
    /// reach [`POOL_OUTPUTS_MIN_BYTES`]).
    pub outputs_pooled: u64,
    /// Outputs given pool memory that the runtime wrote into a fresh buffer instead.
    pub outputs_pool_missed: u64,
}

/// A snapshot of the dispatcher's counters.
#[derive(Clone, Debug, Default)]
pub struct DispatchStats {
    pub ops: BTreeMap<String, OpStats>,
    /// Time spent executing kernels (upload, execute, wait).
    pub kernel_time: Duration,
    /// Time spent preparing calls the first time (select, build, compile or cache load).
    pub prepare_time: Duration,
}

impl DispatchStats {
    pub fn total_fallbacks(&self) -> u64 {
        self.ops.values().flat_map(|s| s.fallbacks.values()).sum()
    }

    pub fn total_substituted(&self) -> u64 {
        self.ops.values().map(|s| s.substituted).sum()
    }
}

/// Eager dispatch of op calls to registered kernels on one PJRT client.
#[derive(Debug)]
pub struct Dispatcher {
    registry: &'static Registry,
    client: Client,
    platform: Platform,
    cache: Arc<CompileCache>,
    options: CompileOptions,
    /// Prepared calls by [`CallKey::hash_of`]; each bucket is searched with [`CallKey::matches`].
    memo: RwLock<HashMap<u64, MemoBucket>>,
    /// Index and fault generations the memo was filled under; a change of either clears it.
    memo_index: AtomicUsize,
    memo_faults: AtomicUsize,
    views: pjrt::ViewCache,
    stats: Mutex<BTreeMap<String, OpStats>>,
    kernel_nanos: AtomicU64,
    prepare_nanos: AtomicU64,
    no_fallback: bool,
    /// See [`Dispatcher::pool_outputs_from`].
    pool_outputs_from: Option<usize>,
}

impl Dispatcher {
    /// A dispatcher over `client` using the process registry and `cache`. A client whose
    /// platform kernels are not selected for is an error naming it.
    pub fn new(
        registry: &'static Registry,
        client: Client,
        cache: Arc<CompileCache>,
    ) -> Result<Dispatcher, pjrt::Error> {
        let platform = client_platform(client.platform())?;
        Ok(Dispatcher {
            registry,
            client,
            platform,
            cache,
            options: CompileOptions::new(),
            memo: RwLock::new(HashMap::new()),
            memo_index: AtomicUsize::new(0),
            memo_faults: AtomicUsize::new(crate::fault::generation()),
            views: pjrt::ViewCache::default(),
            stats: Mutex::new(BTreeMap::new()),
            kernel_nanos: AtomicU64::new(0),
            prepare_nanos: AtomicU64::new(0),
            no_fallback: false,
            pool_outputs_from: std::env::var("TPUK_POOL_OUTPUTS_MIN_BYTES")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .or(Some(POOL_OUTPUTS_MIN_BYTES)),
        })
    }

    /// Calls whose outputs total at least `bytes` write them into memory from the caching
    /// allocator ([`crate::host_pool`]), lent to the program as extra donated parameters;
    /// `None`: never. Only a client that writes host memory in place (the CPU plugin) does
    /// this. The default is [`POOL_OUTPUTS_MIN_BYTES`] or `TPUK_POOL_OUTPUTS_MIN_BYTES`. It
    /// applies to calls prepared afterwards.
    pub fn pool_outputs_from(mut self, bytes: Option<usize>) -> Dispatcher {
        self.pool_outputs_from = bytes;
        self
    }

    /// The size from which outputs go to the caching allocator on this client: None off the
    /// CPU (a device's outputs are its own memory) or when pooling is off.
    pub fn pool_outputs_min_bytes(&self) -> Option<usize> {
        self.pool_outputs_from.filter(|_| self.client.platform() == "cpu")
    }

    /// With `no_fallback`, a call that runs no kernel is a [`DispatchError::Forbidden`] rather
    /// than a [`DispatchError::Fallback`] (it is counted the same way).
    pub fn no_fallback(mut self, no_fallback: bool) -> Dispatcher {
        self.no_fallback = no_fallback;
        self
    }

    /// Whether fallbacks are errors (see [`Dispatcher::no_fallback`]).
    pub fn forbids_fallback(&self) -> bool {
        self.no_fallback
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn platform(&self) -> Platform {
        self.platform
    }

    pub fn cache(&self) -> &CompileCache {
        &self.cache
    }

    pub fn registry(&self) -> &'static Registry {
        self.registry
    }

    /// Runs `op` on `inputs` with `statics` through the selected kernel; outputs stay on the
    /// device (read them with [`Buffer::read_in_place`] or [`Buffer::to_vec`]).
    pub fn call(
        &self,
        op: &str,
        inputs: &[HostTensor<'_>],
        statics: &[(&'static str, StaticValue)],
    ) -> Result<Vec<Buffer>, DispatchError> {
        let prepared = match self.prepared(op, inputs, statics) {
            Ok(p) => p,
            Err((op, kernel, reason)) => return Err(self.fall_back(&op, kernel, reason)),
        };
        let start = Instant::now();
        let result = self.execute(&prepared, inputs);
        self.kernel_nanos.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match result {
            Ok(out) => {
                let kernel = prepared.kernel.name();
                self.count(&prepared.op, |s| {
                    s.calls += 1;
                    s.substituted += 1;
                    match s.kernels.get_mut(kernel) {
                        Some(n) => *n += 1,
                        None => {
                            s.kernels.insert(kernel.to_owned(), 1);
                        }
                    }
                });
                Ok(out)
            }
            Err(reason) => {
                Err(self.fall_back(&prepared.op, Some(prepared.kernel.name().to_owned()), reason))
            }
        }
    }

    /// Runs `op` on `inputs` like [`Self::call`], updating in place the inputs the selected
    /// kernel mutates (its `mutates`): their memory is donated to the program, which writes
    /// the new values there (`tf.aliasing_output`), or, where the runtime cannot alias it, the
    /// new values are copied in. Returns the kernel's other outputs.
    ///
    /// `lent` lists the inputs the caller lends for writing, in the kernel's output order; a
    /// kernel that mutates other inputs falls back (nothing is written). Mutated inputs that
    /// share memory with each other fall back too; one that shares memory with a read-only
    /// input is updated through a copy, after the program has read every input.
    ///
    /// # Safety
    /// For each position in `lent`, `inputs[i].data` is memory the caller may write: valid for
    /// the call, and not read or written by anyone else during it (other inputs excepted).
    pub unsafe fn call_in_place(
        &self,
        op: &str,
        inputs: &[HostTensor<'_>],
        statics: &[(&'static str, StaticValue)],
        lent: &[usize],
    ) -> Result<Vec<Buffer>, DispatchError> {
        let prepared = match self.prepared(op, inputs, statics) {
            Ok(p) => p,
            Err((op, kernel, reason)) => return Err(self.fall_back(&op, kernel, reason)),
        };
        let start = Instant::now();
        // SAFETY: the caller lends the memory of `lent`, as `execute_in_place` requires.
        let result = unsafe { self.execute_in_place(&prepared, inputs, lent) };
        self.kernel_nanos.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match result {
            Ok((out, in_place, by_copy)) => {
                let kernel = prepared.kernel.name();
                self.count(&prepared.op, |s| {
                    s.calls += 1;
                    s.substituted += 1;
                    s.updated_in_place += in_place;
                    s.updated_by_copy += by_copy;
                    *s.kernels.entry(kernel.to_owned()).or_default() += 1;
                });
                Ok(out)
            }
            Err(reason) => {
                Err(self.fall_back(&prepared.op, Some(prepared.kernel.name().to_owned()), reason))
            }
        }
    }

    /// # Safety
    /// As [`Self::call_in_place`].
    unsafe fn execute_in_place(
        &self,
        prepared: &Prepared,
        inputs: &[HostTensor<'_>],
        lent: &[usize],
    ) -> Result<(Vec<Buffer>, u64, u64), FallbackReason> {
        let kernel = prepared.kernel.name();
        let mutated = prepared.kernel.record.mutated_inputs().map_err(FallbackReason::BadInput)?;
        if mutated != lent {
            return Err(FallbackReason::BadInput(format!(
                "kernel `{kernel}` updates inputs {mutated:?} in place, the call lends {lent:?}"
            )));
        }
        if let Some(message) = crate::fault::kernel_run(kernel) {
            return Err(FallbackReason::Execute(message));
        }
        let loans: Vec<(usize, usize)> = mutated.iter().enumerate().map(|(k, &i)| (i, k)).collect();
        // SAFETY: the caller lends the memory of the mutated inputs.
        let run = unsafe { self.run_lending(prepared, inputs, &loans) }?;
        let rest = run.outputs.into_iter().skip(mutated.len()).flatten().collect();
        Ok((rest, run.in_place, run.by_copy))
    }

    /// Runs `prepared` with `loans` (see [`execute_lending`]) and pool memory for the outputs
    /// it takes it for, counting where those outputs landed.
    ///
    /// # Safety
    /// As [`execute_lending`].
    unsafe fn run_lending(
        &self,
        prepared: &Prepared,
        inputs: &[HostTensor<'_>],
        loans: &[(usize, usize)],
    ) -> Result<LentRun, FallbackReason> {
        let pooled: Vec<(usize, &TensorType)> =
            prepared.pooled.iter().map(|(k, ty)| (*k, ty)).collect();
        // SAFETY: the caller's contract.
        let run = unsafe {
            execute_lending(&self.client, &self.views, &prepared.executable, inputs, loans, &pooled)
        }
        .map_err(|e| match e {
            LendError::Input(m) => FallbackReason::BadInput(m),
            LendError::Run(m) => FallbackReason::Execute(m),
        })?;
        if !pooled.is_empty() {
            self.count(&prepared.op, |s| {
                s.outputs_pooled += run.pooled;
                s.outputs_pool_missed += run.pool_missed;
            });
        }
        Ok(run)
    }

    fn execute(
        &self,
        prepared: &Prepared,
        inputs: &[HostTensor<'_>],
    ) -> Result<Vec<Buffer>, FallbackReason> {
        if !prepared.pooled.is_empty() {
            if let Some(message) = crate::fault::kernel_run(prepared.kernel.name()) {
                return Err(FallbackReason::Execute(message));
            }
            // SAFETY: no input is lent: the call writes only the pool's fresh blocks.
            let run = unsafe { self.run_lending(prepared, inputs, &[]) }?;
            return Ok(run.outputs.into_iter().flatten().collect());
        }
        let mut held = Vec::with_capacity(inputs.len());
        for (i, t) in inputs.iter().enumerate() {
            let input = pjrt_shape(t.ty)
                .and_then(|(element, dims)| {
                    self.views
                        .input(&self.client, t.data, element, &dims)
                        .map_err(|e| e.to_string())
                })
                .map_err(|e| FallbackReason::BadInput(format!("input {i}: {e}")))?;
            held.push(input);
        }
        let refs: Vec<&Buffer> = held.iter().map(|b| &**b).collect();
        if let Some(message) = crate::fault::kernel_run(prepared.kernel.name()) {
            return Err(FallbackReason::Execute(message));
        }
        prepared.executable.execute(&refs).map_err(|e| FallbackReason::Execute(e.to_string()))
    }

    /// The memoised preparation of the call, or a fresh one; a failure names the normalised
    /// op, the kernel (if one was selected) and why.
    fn prepared(
        &self,
        op: &str,
        inputs: &[HostTensor<'_>],
        statics: &[(&'static str, StaticValue)],
    ) -> Result<Arc<Prepared>, (String, Option<String>, FallbackReason)> {
        self.invalidate_if_registry_changed();
        let hash = CallKey::hash_of(op, inputs, statics);
        let hit = self.memo.read().ok().and_then(|m| {
            let bucket = m.get(&hash)?;
            bucket.iter().find(|(k, _)| k.matches(op, inputs, statics)).map(|(_, p)| p.clone())
        });
        if let Some(p) = hit {
            return Ok(p);
        }
        let key = CallKey::new(op, inputs, statics);
        let start = Instant::now();
        let prepared = self.prepare(&key, statics);
        self.prepare_nanos.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let prepared =
            Arc::new(prepared.map_err(|(kernel, reason)| (key.op.clone(), kernel, reason))?);
        if let Ok(mut memo) = self.memo.write() {
            memo.entry(hash).or_default().push((key, prepared.clone()));
        }
        Ok(prepared)
    }

    fn prepare(
        &self,
        key: &CallKey,
        statics: &[(&'static str, StaticValue)],
    ) -> Result<Prepared, (Option<String>, FallbackReason)> {
        let sig = KernelSignature { inputs: key.inputs.clone(), statics: statics.to_vec() };
        let meta = CallMeta { sig: &sig, contiguous: &key.contiguous, platform: self.platform };
        let kernel = self
            .registry
            .select(&key.op, &meta)
            .map_err(|e| (None, FallbackReason::NoKernel(e)))?;
        let name = Some(kernel.name().to_owned());
        let sig = kernel
            .complete_statics(sig)
            .map_err(|m| (name.clone(), FallbackReason::BadInput(m)))?;
        let text = kernel.module_text(&sig, self.platform).map_err(|e| {
            let reason = match e {
                crate::RegistryError::Build(b) => FallbackReason::Build(b),
                other => FallbackReason::Compile(other.to_string()),
            };
            (name.clone(), reason)
        })?;
        // Outputs large enough to pool: the program takes their memory as extra parameters
        // (a text that cannot be read or rewritten keeps fresh outputs).
        let pooled_text =
            self.pool_outputs_min_bytes().and_then(|min| with_pooled_outputs(&text.text, min));
        let (program, pooled) = match pooled_text {
            Some((wrapped, outputs)) => (Program::text(wrapped), outputs),
            None => (Program::text(text.text.to_string()), Vec::new()),
        };
        let cached = self
            .cache
            .get_or_compile(&self.client, &program, &self.options)
            .map_err(|e| (name.clone(), FallbackReason::Compile(e.to_string())))?;
        Ok(Prepared { op: key.op.clone(), kernel, executable: cached.executable, pooled })
    }

    fn invalidate_if_registry_changed(&self) {
        let generation = self.registry.generation();
        let faults = crate::fault::generation();
        let index_changed = self.memo_index.swap(generation, Ordering::AcqRel) != generation;
        let faults_changed = self.memo_faults.swap(faults, Ordering::AcqRel) != faults;
        if (index_changed || faults_changed)
            && let Ok(mut memo) = self.memo.write()
        {
            memo.clear();
        }
    }

    fn fall_back(&self, op: &str, kernel: Option<String>, reason: FallbackReason) -> DispatchError {
        let fallback = Fallback { op: op.to_owned(), kernel, reason };
        let message = fallback.to_string();
        self.count(op, |s| {
            s.calls += 1;
            *s.fallbacks.entry(fallback.reason.category()).or_default() += 1;
            s.last_fallback = Some(message);
            s.last_fallback_seq = next_fallback_seq();
        });
        if self.no_fallback {
            DispatchError::Forbidden(fallback)
        } else {
            DispatchError::Fallback(fallback)
        }
    }

    fn count(&self, op: &str, f: impl FnOnce(&mut OpStats)) {
        if let Ok(mut stats) = self.stats.lock() {
            match stats.get_mut(op) {
                Some(s) => f(s),
                None => f(stats.entry(op.to_owned()).or_default()),
            }
        }
    }

    /// Lowers a whole ATen graph into one StableHLO module (registered kernels selected by the
    /// registry for this platform and inlined as private functions, every other node through
    /// the default table), compiles it through the cache and runs it on `inputs`.
    pub fn run_graph(
        &self,
        graph: &crate::graph::Graph,
        inputs: &[HostTensor<'_>],
    ) -> Result<Vec<Buffer>, GraphRunError> {
        let program = self.graph_program(graph)?;
        let cached = self
            .cache
            .get_or_compile(&self.client, &program, &self.options)
            .map_err(|e| GraphRunError::Compile(e.to_string()))?;
        if inputs.len() != graph.inputs.len() {
            return Err(GraphRunError::BadInput(format!(
                "graph takes {} inputs, {} given",
                graph.inputs.len(),
                inputs.len()
            )));
        }
        let start = Instant::now();
        for (i, (t, want)) in inputs.iter().zip(&graph.inputs).enumerate() {
            if *t.ty != want.ty {
                return Err(GraphRunError::BadInput(format!(
                    "input {i} `{}` is {}, the graph takes {}",
                    want.name,
                    t.ty.short(),
                    want.ty.short()
                )));
            }
        }
        let buffers = upload_all(&self.client, inputs).map_err(GraphRunError::BadInput)?;
        let refs: Vec<&Buffer> = buffers.iter().map(|b| &**b).collect();
        let out = match crate::fault::program_run(&graph.name, &[]) {
            Some(message) => Err(GraphRunError::Execute(message)),
            None => {
                cached.executable.execute(&refs).map_err(|e| GraphRunError::Execute(e.to_string()))
            }
        };
        self.kernel_nanos.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }

    /// The graph's lowered program.
    pub fn graph_program(&self, graph: &crate::graph::Graph) -> Result<Program, GraphRunError> {
        let resolver = crate::graph::IndexResolver::new(self.registry.index(), self.platform);
        let module =
            crate::graph::lower(graph, &resolver).map_err(|e| GraphRunError::Lower(Box::new(e)))?;
        Ok(Program::text(module.to_text()))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DispatchStats {
        DispatchStats {
            ops: self.stats.lock().map(|s| s.clone()).unwrap_or_default(),
            kernel_time: Duration::from_nanos(self.kernel_nanos.load(Ordering::Relaxed)),
            prepare_time: Duration::from_nanos(self.prepare_nanos.load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_client_platform_is_an_error_naming_it() {
        assert_eq!(client_platform("cpu").unwrap(), Platform::Cpu);
        assert_eq!(client_platform("Host").unwrap(), Platform::Cpu);
        assert_eq!(client_platform("tpu").unwrap(), Platform::Tpu);
        let e = client_platform("rocm").unwrap_err().to_string();
        assert!(e.contains("`rocm`") && e.contains("not one kernels are selected for"), "{e}");
    }
}
