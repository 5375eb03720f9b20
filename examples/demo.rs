//! End-to-end demo on the embedded default runtime, the PJRT CPU plugin.
//!
//! 1. Lists the registered kernels and how they bind to ATen ops.
//! 2. Runs a small MLP block eagerly through the dispatcher: RMSNorm, matmul + bias + GELU
//!    epilogue, softmax, each a registered kernel selected by op and signature, compiled once
//!    and cached; checks the result against an f64 reference computed here.
//! 3. Shows a fallback: an op no kernel takes, with the recorded reason.
//! 4. Compiles the same kernels for a TPU v5e with libtpu's compile-only path (no TPU needed).
//! 5. Prints the dispatch and compile-cache counters.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use tpu_kernels::registration::StaticValue;
use tpu_kernels::{DType, TensorType};
use tpu_kernels_registry::cache::{CacheConfig, CompileCache};
use tpu_kernels_registry::check;
use tpu_kernels_registry::numerics::{self, Tolerance};
use tpu_kernels_registry::pjrt::{Client, ClientOptions, Plugin, Topology};
use tpu_kernels_registry::{Dispatcher, HostTensor, Registry};

const ROWS: usize = 16;
const DIM: usize = 64;
const HIDDEN: usize = 128;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32_ty(dims: &[u64]) -> TensorType {
    TensorType::new(DType::F32, dims)
}

/// The block in f64: softmax(gelu(rms_norm(x) @ w + b)).
fn reference(x: &[f32], g: &[f32], w: &[f32], b: &[f32]) -> Vec<f64> {
    let mut out = Vec::with_capacity(ROWS * HIDDEN);
    for r in 0..ROWS {
        let row: Vec<f64> = x[r * DIM..(r + 1) * DIM].iter().map(|v| f64::from(*v)).collect();
        let ms = row.iter().map(|v| v * v).sum::<f64>() / DIM as f64;
        let normed: Vec<f64> =
            row.iter().zip(g).map(|(v, g)| v / (ms + 1e-6).sqrt() * f64::from(*g)).collect();
        let h: Vec<f64> = (0..HIDDEN)
            .map(|j| {
                let y = (0..DIM).map(|k| normed[k] * f64::from(w[k * HIDDEN + j])).sum::<f64>()
                    + f64::from(b[j]);
                0.5 * y * (1.0 + erf(y / std::f64::consts::SQRT_2))
            })
            .collect();
        let m = h.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = h.iter().map(|v| (v - m).exp()).sum();
        out.extend(h.iter().map(|v| (v - m).exp() / s));
    }
    out
}

/// erf by its Maclaurin series (|x| small here) and the asymptotic complement otherwise.
fn erf(x: f64) -> f64 {
    if x.abs() > 4.0 {
        return x.signum();
    }
    let (mut term, mut sum, mut n) = (x, x, 0.0);
    while term.abs() > 1e-17 {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// A kernel's doc comment in one line: its first sentence, shortened to fit a terminal.
fn summary(doc: &str) -> String {
    let paragraph: Vec<&str> = doc.lines().map(str::trim).take_while(|l| !l.is_empty()).collect();
    let text = paragraph.join(" ");
    let sentence = match text.find(". ") {
        Some(i) => &text[..=i],
        None => text.as_str(),
    };
    const WIDTH: usize = 60;
    if sentence.chars().count() <= WIDTH {
        return sentence.to_owned();
    }
    let cut: String = sentence.chars().take(WIDTH - 3).collect();
    format!("{}...", cut.trim_end())
}

fn main() -> Result<()> {
    let plugin = Plugin::cpu().context("loading the PJRT CPU plugin (run `scripts/dev setup`)")?;
    let (major, minor) = plugin.attributes().api_version();
    println!("PJRT CPU plugin {} (C API {major}.{minor})", plugin.path().display());
    let client = Client::new(&plugin, ClientOptions::new())?;
    let registry = Registry::global()?;

    println!("\n== registered kernels ==");
    let index = registry.index();
    let name_width = index.kernels().map(|k| k.name().len()).max().unwrap_or(0);
    let ops_width = index.kernels().map(|k| k.ops.join(", ").len()).max().unwrap_or(0);
    for k in index.kernels() {
        let ops = k.ops.join(", ");
        println!("  {:<name_width$}  {ops:<ops_width$}  {}", k.name(), summary(k.record.doc));
    }

    let cache = Arc::new(CompileCache::new(CacheConfig::from_env()));
    let dispatcher = Dispatcher::new(registry, client, cache.clone())?;
    let (x, g) = (values(ROWS * DIM, 1), values(DIM, 2));
    let (w, b) =
        (values(DIM * HIDDEN, 3).iter().map(|v| v * 0.2).collect::<Vec<_>>(), values(HIDDEN, 4));
    let (tx, tg, tw, tb) = (f32_ty(&[16, 64]), f32_ty(&[64]), f32_ty(&[64, 128]), f32_ty(&[128]));
    let (bx, bg, bw, bb) = (bytes(&x), bytes(&g), bytes(&w), bytes(&b));

    println!("\n== eager MLP block on the CPU plugin ==");
    let mut result = Vec::new();
    for step in 0..3 {
        let start = Instant::now();
        let h = dispatcher.call(
            "tpuk::rms_norm",
            &[
                HostTensor { ty: &tx, data: &bx, contiguous: true },
                HostTensor { ty: &tg, data: &bg, contiguous: true },
            ],
            &[("eps", StaticValue::Float(1e-6))],
        )?;
        let h = h[0].read_in_place(<[u8]>::to_vec)?;
        let y = dispatcher.call(
            "tpuk::matmul_bias_act",
            &[
                HostTensor { ty: &tx, data: &h, contiguous: true },
                HostTensor { ty: &tw, data: &bw, contiguous: true },
                HostTensor { ty: &tb, data: &bb, contiguous: true },
            ],
            &[("activation", StaticValue::Str("gelu".into()))],
        )?;
        let y = y[0].read_in_place(<[u8]>::to_vec)?;
        let ty = f32_ty(&[16, 128]);
        let p = dispatcher.call(
            "aten::_softmax",
            &[HostTensor { ty: &ty, data: &y, contiguous: true }],
            &[("dim", StaticValue::Int(-1)), ("half_to_float", StaticValue::Bool(false))],
        )?;
        result = p[0].to_vec::<f32>()?;
        println!(
            "  run {step}: {:>9.1} us  ({})",
            start.elapsed().as_secs_f64() * 1e6,
            if step == 0 {
                "select + build + compile or load from the disk cache"
            } else {
                "memoised"
            }
        );
    }
    let want = reference(&x, &g, &w, &b);
    // NaN-aware: a NaN or an infinity in the result is an infinite error, never a pass.
    let max_err = numerics::max_abs_error(&result, &want);
    println!("  output f32[16,128], max |error| vs f64 reference: {max_err:.2e}");
    numerics::check_close(&result, &want, Tolerance::abs(1e-5))
        .context("the block's result is off the f64 reference")?;

    println!("\n== a fallback ==");
    let ints = TensorType::new(DType::I32, [4]);
    let data = bytes(&[1.0, 2.0, 3.0, 4.0]);
    match dispatcher.call(
        "aten::silu",
        &[HostTensor { ty: &ints, data: &data, contiguous: true }],
        &[],
    ) {
        Ok(_) => anyhow::bail!("silu must not take i32"),
        Err(e) => println!("  {e}"),
    }

    println!("\n== compile for TPU v5e (libtpu compile-only) ==");
    match Plugin::libtpu().and_then(|libtpu| Topology::new(&libtpu, "v5e:1x1")) {
        Ok(topology) => {
            for name in ["rms_norm", "matmul_bias_act", "softmax"] {
                let index = registry.index();
                let k = index.kernel(name).context("kernel registered")?;
                let sig = &k.record.canonical_signatures().map_err(anyhow::Error::msg)?[0];
                let report = check::tpu_compile(&topology, k, sig).map_err(anyhow::Error::msg)?;
                println!(
                    "  {name:<16} {:<44} {:>7} bytes in {:>6.1} ms",
                    sig.label(),
                    report.executable_bytes,
                    report.compile_ms
                );
            }
        }
        Err(e) => println!("  skipped: {e}"),
    }

    println!("\n== counters ==");
    let stats = dispatcher.stats();
    for (op, s) in &stats.ops {
        println!(
            "  {op:<28} calls {:>2}  substituted {:>2}  fallbacks {:?}  kernels {:?}",
            s.calls, s.substituted, s.fallbacks, s.kernels
        );
    }
    let c = cache.stats();
    println!(
        "  compile cache: {} compiled ({:.0} ms), {} from disk, {} from memory",
        c.compiles,
        c.compile_time.as_secs_f64() * 1e3,
        c.disk_hits,
        c.memory_hits
    );
    Ok(())
}
