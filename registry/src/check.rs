//! The checks `tpuk` (and the Python package) run on a kernel at one signature: emit, parse with
//! the reader, run on a PJRT client with random inputs, compile for a TPU topology.

use std::time::{Duration, Instant};

use serde::Serialize;
use tpu_kernels::reader;
use tpu_kernels::registration::{KernelSignature, Platform};
use tpu_kernels::{DType, TensorType};

use crate::cache::{CompileCache, Outcome};
use crate::dispatch::{dtype_of, upload};
use crate::index::Kernel;
use crate::pjrt::{Buffer, Client, CompileOptions, Program, Topology};

/// Deterministic pseudo-random row-major bytes for `ty`: floats in [-2, 2), integers in
/// [-8, 8) (unsigned [0, 16)), bools half true.
pub fn random_bytes(ty: &TensorType, seed: u64) -> Result<Vec<u8>, String> {
    let n = ty.shape.num_elements().ok_or_else(|| format!("{ty} has no static size"))? as usize;
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        state =
            state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    // Sized by the user's signature: a size no memory holds is an error, never an abort.
    let bytes = n
        .checked_mul(ty.dtype.byte_size())
        .ok_or_else(|| format!("input {ty} is larger than any allocation"))?;
    let mut out = Vec::new();
    out.try_reserve_exact(bytes)
        .map_err(|_| format!("input {ty}: out of memory allocating {bytes} bytes of input data"))?;
    for _ in 0..n {
        let u = next();
        let f = u * 4.0 - 2.0;
        let i = (u * 16.0).floor() as i64 - 8;
        match ty.dtype {
            DType::F32 => out.extend((f as f32).to_le_bytes()),
            DType::F64 => out.extend(f.to_le_bytes()),
            DType::BF16 => out.extend(half::bf16::from_f64(f).to_le_bytes()),
            DType::F16 => out.extend(half::f16::from_f64(f).to_le_bytes()),
            DType::I8 => out.extend((i as i8).to_le_bytes()),
            DType::I16 => out.extend((i as i16).to_le_bytes()),
            DType::I32 => out.extend((i as i32).to_le_bytes()),
            DType::I64 => out.extend(i.to_le_bytes()),
            DType::U8 => out.push((i + 8) as u8),
            DType::U32 => out.extend(((i + 8) as u32).to_le_bytes()),
            DType::Bool => out.push(u8::from(u < 0.5)),
            other => return Err(format!("no random data for {other}")),
        }
    }
    Ok(out)
}

/// Reads a buffer as f64 values (for finiteness checks and error measures).
pub fn buffer_as_f64(buffer: &Buffer) -> Result<Vec<f64>, String> {
    let dtype = dtype_of(buffer.element_type())
        .ok_or_else(|| format!("unsupported output type {}", buffer.element_type()))?;
    buffer
        .read_in_place(|bytes| {
            let size = dtype.byte_size();
            bytes
                .chunks_exact(size)
                .map(|c| match dtype {
                    DType::F32 => f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                    DType::F64 => {
                        f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
                    }
                    DType::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
                    DType::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
                    DType::I8 => f64::from(c[0] as i8),
                    DType::U8 | DType::Bool => f64::from(c[0]),
                    DType::I16 => f64::from(i16::from_le_bytes([c[0], c[1]])),
                    DType::I32 => f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                    DType::U32 => f64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                    _ => {
                        i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64
                    }
                })
                .collect()
        })
        .map_err(|e| e.to_string())
}

/// The result of running a kernel on a client.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Where the executable came from: `compiled`, `memory`, `disk`.
    pub executable: &'static str,
    pub compile_ms: f64,
    pub iterations: usize,
    /// Upload + execute + wait, per iteration.
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub outputs: Vec<String>,
    /// Non-finite values across float outputs (random inputs in [-2, 2) should give none).
    pub non_finite: usize,
}

/// Emits, compiles (through `cache`) and runs `kernel` on `client` with random inputs.
pub fn run_kernel(
    client: &Client,
    cache: &CompileCache,
    kernel: &Kernel,
    sig: &KernelSignature,
    platform: Platform,
    iterations: usize,
) -> Result<RunReport, String> {
    let text = kernel.module_text(sig, platform).map_err(|e| e.to_string())?;
    let program = Program::text(text.text.to_string());
    let start = Instant::now();
    let cached = cache
        .get_or_compile(client, &program, &CompileOptions::new())
        .map_err(|e| format!("compile: {e}"))?;
    let compile = start.elapsed();
    let inputs: Vec<Vec<u8>> = sig
        .inputs
        .iter()
        .enumerate()
        .map(|(i, t)| random_bytes(t, i as u64 + 1))
        .collect::<Result<_, _>>()?;
    let mut times = Vec::with_capacity(iterations.max(1));
    let mut last = Vec::new();
    for _ in 0..iterations.max(1) {
        let t = Instant::now();
        let buffers = sig
            .inputs
            .iter()
            .zip(&inputs)
            .map(|(ty, data)| upload(client, ty, data))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&Buffer> = buffers.iter().collect();
        last = cached.executable.execute(&refs).map_err(|e| format!("execute: {e}"))?;
        times.push(t.elapsed());
    }
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mut non_finite = 0;
    let mut outputs = Vec::new();
    for b in &last {
        let dims: Vec<String> = b.dims().iter().map(ToString::to_string).collect();
        outputs.push(format!("{}[{}]", b.element_type(), dims.join(",")));
        non_finite += buffer_as_f64(b)?.iter().filter(|v| !v.is_finite()).count();
    }
    Ok(RunReport {
        executable: match cached.outcome {
            Outcome::Compiled => "compiled",
            Outcome::MemoryHit => "memory",
            Outcome::DiskHit => "disk",
        },
        compile_ms: compile.as_secs_f64() * 1e3,
        iterations: times.len(),
        median_us: us(times[times.len() / 2]),
        min_us: us(times[0]),
        max_us: us(times[times.len() - 1]),
        outputs,
        non_finite,
    })
}

/// The result of compiling a kernel for a TPU topology.
#[derive(Clone, Debug, Serialize)]
pub struct TpuCompileReport {
    pub topology: String,
    pub executable_bytes: usize,
    pub compile_ms: f64,
}

/// Compiles `kernel`'s TPU module for `topology` with libtpu's compile-only path.
pub fn tpu_compile(
    topology: &Topology,
    kernel: &Kernel,
    sig: &KernelSignature,
) -> Result<TpuCompileReport, String> {
    let text = kernel.module_text(sig, Platform::Tpu).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let compiled = topology
        .compile(&Program::text(text.text.to_string()), &CompileOptions::new())
        .map_err(|e| e.to_string())?;
    Ok(TpuCompileReport {
        topology: topology.name().to_owned(),
        executable_bytes: compiled.serialized_size(),
        compile_ms: start.elapsed().as_secs_f64() * 1e3,
    })
}

/// Inputs to check `kernel` on at `sig`, row-major bytes: pseudo-random ([`random_bytes`]),
/// except where random data is not what the kernel can be given:
/// - a scalar-prefetch table holds block indices: random ones would leave the arrays (the
///   interpreter refuses that, the twin clamps it), so each entry is a block that exists;
/// - a backward that takes its forward's inputs and outputs after the incoming gradient (the
///   flash-attention backward: `grad, q, k, v, out, logsumexp`, where the registered forward
///   names it as its `backward`) gets the outputs the forward computes from those inputs: an
///   unrelated `logsumexp` makes `exp(s - logsumexp)` arbitrarily large, and the gradient a sum
///   of cancelling huge terms that no two summation orders agree on.
pub fn check_inputs(
    client: &Client,
    kernel: &Kernel,
    sig: &KernelSignature,
) -> Result<Vec<Vec<u8>>, String> {
    let bounds = match kernel.record.tiled_kernel(sig) {
        Some(Ok(k)) => k.prefetch_bounds(),
        _ => Vec::new(),
    };
    let mut inputs: Vec<Vec<u8>> = sig
        .inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            Ok(match bounds.get(i).copied().flatten() {
                Some(n) => random_bytes(t, i as u64 + 1)?
                    .chunks(4)
                    .flat_map(|c| {
                        let v = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        (v.rem_euclid(n.max(1) as i32)).to_le_bytes()
                    })
                    .collect(),
                None => random_bytes(t, i as u64 + 1)?,
            })
        })
        .collect::<Result<_, String>>()?;
    let name = kernel.name();
    let forward = tpu_kernels::registered().into_iter().find(|f| f.backward == Some(name));
    if let Some(f) = forward {
        let n_in = f.inputs.len();
        let fsig = KernelSignature {
            inputs: sig.inputs.iter().skip(1).take(n_in).cloned().collect(),
            statics: sig
                .statics
                .iter()
                .filter(|(n, _)| f.statics.iter().any(|p| p.name == *n))
                .cloned()
                .collect(),
        };
        let outputs = f.output_types(&fsig).ok().unwrap_or_default();
        let lines_up = sig.inputs.len() == 1 + n_in + outputs.len()
            && sig.inputs[1 + n_in..] == outputs[..]
            && f.accepts(&fsig).is_ok();
        if lines_up {
            let module = f.emit(&fsig).map_err(|e| format!("forward {}: {e}", f.name))?;
            let exe = client
                .compile(&Program::text(module.to_text()), &CompileOptions::new())
                .map_err(|e| format!("forward {}: compile: {e}", f.name))?;
            let args: Vec<Buffer> = fsig
                .inputs
                .iter()
                .zip(&inputs[1..=n_in])
                .map(|(t, b)| upload(client, t, b))
                .collect::<Result<_, _>>()?;
            let refs: Vec<&Buffer> = args.iter().collect();
            let saved = exe.execute(&refs).map_err(|e| format!("forward {}: {e}", f.name))?;
            for (slot, out) in inputs[1 + n_in..].iter_mut().zip(&saved) {
                *slot = out.read_in_place(<[u8]>::to_vec).map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(inputs)
}

/// For a tiled kernel: the interpreter of its TPU module (the shipped Mosaic text libtpu is
/// given, read back) and its CPU module (the twin) on the same inputs ([`check_inputs`]); the largest
/// difference of any output element, or why they disagree (beyond one rounding of the output
/// type, and f32 sums taken in another order).
pub fn interpreter_agreement(
    client: &Client,
    kernel: &Kernel,
    sig: &KernelSignature,
) -> Result<f64, String> {
    let tpu = kernel.module_text(sig, Platform::Tpu).map_err(|e| e.to_string())?.text;
    let cpu = kernel.module_text(sig, Platform::Cpu).map_err(|e| e.to_string())?.text;
    let buffers: Vec<Buffer> = check_inputs(client, kernel, sig)?
        .iter()
        .zip(&sig.inputs)
        .map(|(bytes, t)| upload(client, t, bytes))
        .collect::<Result<_, _>>()?;
    let values: Vec<Vec<f64>> = buffers.iter().map(buffer_as_f64).collect::<Result<_, _>>()?;
    let interpreted =
        tpu_kernels::mosaic::interpret(&tpu, &values).map_err(|e| format!("interpreter: {e}"))?;
    let exe = client
        .compile(&Program::text(cpu.to_string()), &CompileOptions::new())
        .map_err(|e| format!("compile: {e}"))?;
    let refs: Vec<&Buffer> = buffers.iter().collect();
    let twin = exe.execute(&refs).map_err(|e| format!("execute: {e}"))?;
    if twin.len() != interpreted.len() {
        return Err(format!("{} outputs interpreted, {} run", interpreted.len(), twin.len()));
    }
    let mut worst = 0.0f64;
    for (i, (a, b)) in interpreted.iter().zip(&twin).enumerate() {
        let tolerance = match dtype_of(b.element_type()) {
            Some(DType::BF16) => crate::numerics::Tolerance::new(2e-2, 2.0f64.powi(-7)),
            Some(DType::F16) => crate::numerics::Tolerance::new(2e-3, 2.0f64.powi(-10)),
            _ => crate::numerics::Tolerance::new(2e-4, 2e-5),
        };
        let summary = crate::numerics::check_close(a, &buffer_as_f64(b)?, tolerance)
            .map_err(|e| format!("output {i}: interpreter vs twin: {e}"))?;
        worst = worst.max(summary.max_abs_error);
    }
    Ok(worst)
}

/// Parses the emitted text back with the reader and checks its `@main` signature against the
/// call's input types.
pub fn parse_back(text: &str, sig: &KernelSignature) -> Result<usize, String> {
    let module = reader::parse_module(text).map_err(|e| e.to_string())?;
    let main = module.main().map_err(|e| e.to_string())?;
    let args: Vec<&TensorType> = main.args.iter().map(|a| &a.ty).collect();
    let want: Vec<&TensorType> = sig.inputs.iter().collect();
    if args != want {
        let show =
            |v: &[&TensorType]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
        return Err(format!(
            "@main takes ({}) but the signature is ({})",
            show(&args),
            show(&want)
        ));
    }
    Ok(main.results.len())
}
