//! Costs of the PJRT layer on the XLA CPU plugin, printed side by side with their targets:
//! tiny round trip, execute alone, in-place read, a 64 MiB elementwise kernel with donation
//! against memcpy in the same run, the same kernel writing a fresh output and writing into
//! reused host memory lent to it (`execute_lending`: how eager calls update tensors in place),
//! and compile times. The client runs programs on the calling thread, as the Python package's
//! does (`ClientOptions::asynchronous(false)`); one row times a small program through a client
//! with the plugin's default worker thread beside it, in the same run. Two rows time `silu` and
//! exact `gelu` on f32[1024,4096] compiled with XLA:CPU's own 256-bit vectors and with the
//! client's default (`CompileOptions::for_client`: 512 bits on a host with AVX-512), in
//! alternating batches.
//!
//! The memcpy baseline is the faster of a single-threaded `copy_from_slice` and the same copy
//! split in one chunk per CPU over as many threads (`std::thread::scope`), as
//! `python/tools/benchmarks.py` takes the faster of torch's `copy_` and a threaded copy: the
//! kernel itself runs on every CPU, so a single-threaded copy would flatter it. GB/s count the
//! bytes read plus the bytes written (2 x 64 MiB for both the kernel and the copy), as
//! `benchmarks.py` does.
//!
//! `cargo bench -p tpu-kernels-registry --bench pjrt` (needs `scripts/dev setup`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use tpu_kernels::{DType, TensorType};
use tpu_kernels_registry::pjrt::{
    Buffer, Client, ClientOptions, CompileOptions, ElementType, Input, LoadedExecutable,
    OptionOverride, Plugin, Program, ViewCache,
};
use tpu_kernels_registry::{HostTensor, execute_lending};

const ADD: &str = r#"
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}"#;

// A small program with enough work that the plugin's default hands it to its worker thread.
const SILU_64X256: &str = r#"
func.func @main(%x: tensor<64x256xf32>) -> tensor<64x256xf32> {
  %0 = stablehlo.logistic %x : tensor<64x256xf32>
  %1 = stablehlo.multiply %x, %0 : tensor<64x256xf32>
  return %1 : tensor<64x256xf32>
}"#;

const N_64MIB: usize = 16 * 1024 * 1024; // f32 elements in 64 MiB

fn inplace_add_one() -> String {
    format!(
        r#"
func.func @main(%x: tensor<{N_64MIB}xf32> {{tf.aliasing_output = 0 : i32}}) -> tensor<{N_64MIB}xf32> {{
  %one = stablehlo.constant dense<1.0> : tensor<{N_64MIB}xf32>
  %0 = stablehlo.add %x, %one : tensor<{N_64MIB}xf32>
  return %0 : tensor<{N_64MIB}xf32>
}}"#
    )
}

/// `x + 1` into a fresh output (`lent = false`), or into a second parameter whose memory the
/// caller lends (`tf.aliasing_output`: the output is that memory).
fn add_one(lent: bool) -> String {
    let out = if lent {
        format!(", %o: tensor<{N_64MIB}xf32> {{tf.aliasing_output = 0 : i32}}")
    } else {
        String::new()
    };
    format!(
        r#"
func.func @main(%x: tensor<{N_64MIB}xf32>{out}) -> tensor<{N_64MIB}xf32> {{
  %one = stablehlo.constant dense<1.0> : tensor<{N_64MIB}xf32>
  %0 = stablehlo.add %x, %one : tensor<{N_64MIB}xf32>
  return %0 : tensor<{N_64MIB}xf32>
}}"#
    )
}

const RMS_NORM: &str = r#"
func.func @main(%x: tensor<1024x4096xf32>, %w: tensor<4096xf32>) -> tensor<1024x4096xf32> {
  %sq = stablehlo.multiply %x, %x : tensor<1024x4096xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<1024x4096xf32>, tensor<f32>) -> tensor<1024xf32>
  %n = stablehlo.constant dense<4096.0> : tensor<1024xf32>
  %mean = stablehlo.divide %sum, %n : tensor<1024xf32>
  %eps = stablehlo.constant dense<1.0e-6> : tensor<1024xf32>
  %var = stablehlo.add %mean, %eps : tensor<1024xf32>
  %r = stablehlo.rsqrt %var : tensor<1024xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0] : (tensor<1024xf32>) -> tensor<1024x4096xf32>
  %wb = stablehlo.broadcast_in_dim %w, dims = [1] : (tensor<4096xf32>) -> tensor<1024x4096xf32>
  %y = stablehlo.multiply %x, %rb : tensor<1024x4096xf32>
  %out = stablehlo.multiply %y, %wb : tensor<1024x4096xf32>
  return %out : tensor<1024x4096xf32>
}"#;

/// `x * sigmoid(x)` (`silu`) or `x * Φ(x)` (exact `gelu`) on f32[1024,4096], written into a
/// second parameter whose memory the caller lends, as eager kernel calls write pooled outputs.
fn activation_1024x4096(gelu: bool) -> String {
    const T: &str = "tensor<1024x4096xf32>";
    let body = if gelu {
        format!(
            "%s = stablehlo.constant dense<0.70710677> : {T}
  %h = stablehlo.constant dense<0.5> : {T}
  %one = stablehlo.constant dense<1.0> : {T}
  %xs = stablehlo.multiply %x, %s : {T}
  %e = chlo.erf %xs : {T} -> {T}
  %p = stablehlo.add %e, %one : {T}
  %xp = stablehlo.multiply %x, %p : {T}
  %y = stablehlo.multiply %xp, %h : {T}"
        )
    } else {
        format!(
            "%l = stablehlo.logistic %x : {T}
  %y = stablehlo.multiply %x, %l : {T}"
        )
    };
    format!(
        "func.func @main(%x: {T}, %o: {T} {{tf.aliasing_output = 0 : i32}}) -> {T} {{
  {body}
  return %y : {T}
}}"
    )
}

/// The CPUs a copy may use, as the plugin's own thread pool does.
fn copy_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// `dst.copy_from_slice(src)` split in `threads` chunks, each copied on its own thread.
fn threaded_copy(dst: &mut [u8], src: &[u8], threads: usize) {
    let chunk = src.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|scope| {
        for (d, s) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
            scope.spawn(move || d.copy_from_slice(s));
        }
    });
}

/// Median time of one call of `f`, over `batches` batches of `per_batch` calls.
fn median(batches: usize, per_batch: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..batches)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per_batch {
                f();
            }
            start.elapsed() / per_batch as u32
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

struct Setup {
    client: Client,
    add: LoadedExecutable,
    inplace: LoadedExecutable,
    fresh: LoadedExecutable,
    into_lent: LoadedExecutable,
    silu: LoadedExecutable,
    // The same plugin's client with its default: executions on a worker thread.
    worker: Client,
    worker_silu: LoadedExecutable,
    // `silu` and `gelu` on f32[1024,4096] at XLA's 256-bit vectors, then at the client's
    // default width.
    narrow: [LoadedExecutable; 2],
    default_width: [LoadedExecutable; 2],
}

fn setup() -> Option<Setup> {
    let plugin = match Plugin::cpu() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("*** SKIPPED pjrt bench: {e}");
            return None;
        }
    };
    let options = ClientOptions::new().cpu_device_count(1);
    let client = Client::new(&plugin, options.clone().asynchronous(false)).ok()?;
    let worker = Client::new(&plugin, options).ok()?;
    let silu = client.compile(&Program::text(SILU_64X256), &CompileOptions::new()).ok()?;
    let worker_silu = worker.compile(&Program::text(SILU_64X256), &CompileOptions::new()).ok()?;
    let add = client.compile(&Program::text(ADD), &CompileOptions::new()).ok()?;
    let inplace = client.compile(&Program::text(inplace_add_one()), &CompileOptions::new()).ok()?;
    let fresh = client.compile(&Program::text(add_one(false)), &CompileOptions::new()).ok()?;
    let into_lent = client.compile(&Program::text(add_one(true)), &CompileOptions::new()).ok()?;
    let narrow_options = CompileOptions::new()
        .option_override("xla_cpu_prefer_vector_width", OptionOverride::Int(256));
    let compile_both = |options: &CompileOptions| -> Option<[LoadedExecutable; 2]> {
        let silu = client.compile(&Program::text(activation_1024x4096(false)), options).ok()?;
        let gelu = client.compile(&Program::text(activation_1024x4096(true)), options).ok()?;
        Some([silu, gelu])
    };
    let narrow = compile_both(&narrow_options)?;
    let default_width = compile_both(&CompileOptions::new())?;
    Some(Setup {
        client,
        add,
        inplace,
        fresh,
        into_lent,
        silu,
        worker,
        worker_silu,
        narrow,
        default_width,
    })
}

/// One run of `exe` (an `activation_1024x4096` program) reading `x`, writing into `out`.
fn activation_step(s: &Setup, views: &ViewCache, exe: &LoadedExecutable, x: &[u8], out: &[u8]) {
    let ty = TensorType::new(DType::F32, [1024, 4096]);
    let inputs = [
        HostTensor { ty: &ty, data: x, contiguous: true },
        HostTensor { ty: &ty, data: out, contiguous: true },
    ];
    // SAFETY: `out` is the bench's own buffer, which nothing else reads or writes meanwhile.
    let run = unsafe { execute_lending(&s.client, views, exe, &inputs, &[(1, 0)], &[]) }
        .expect("execute");
    assert_eq!(run.in_place, 1, "the output is the lent memory");
}

fn round_trip(s: &Setup, a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let x = s.client.buffer_from_host(a, &[4]).expect("upload");
    let y = s.client.buffer_from_host(b, &[4]).expect("upload");
    let out = s.add.execute(&[&x, &y]).expect("execute");
    out[0].read_in_place_as::<f32, _>(|v| v[3]).expect("read")
}

fn round_trip_to_host(s: &Setup, a: &[f32; 4], b: &[f32; 4], dst: &mut [f32; 4]) {
    let x = s.client.buffer_from_host(a, &[4]).expect("upload");
    let y = s.client.buffer_from_host(b, &[4]).expect("upload");
    let out = s.add.execute(&[&x, &y]).expect("execute");
    out[0].to_host(dst).expect("read");
}

/// 64 MiB of f32 at a 64-byte aligned address (the runtime aliases only aligned host memory):
/// the vector and the offset.
fn aligned_64mib() -> (Vec<u8>, usize) {
    let v = vec![1u8; N_64MIB * 4 + 64];
    let offset = (v.as_ptr() as usize).next_multiple_of(64) - v.as_ptr() as usize;
    (v, offset)
}

/// `x + 1` with `x` read in place and the result in a fresh buffer, dropped.
fn fresh_step(s: &Setup, views: &ViewCache, x: &[u8]) {
    let v = views.input(&s.client, x, ElementType::F32, &[N_64MIB as i64]).expect("view");
    black_box(s.fresh.execute(&[&v]).expect("execute"));
}

/// `x + 1` written into `out`, memory the caller lends (reused every step).
fn lent_step(s: &Setup, views: &ViewCache, x: &[u8], out: &[u8]) {
    let ty = TensorType::new(DType::F32, [N_64MIB as u64]);
    let inputs = [
        HostTensor { ty: &ty, data: x, contiguous: true },
        HostTensor { ty: &ty, data: out, contiguous: true },
    ];
    // SAFETY: `out` is the bench's own buffer, which nothing else reads or writes meanwhile.
    let run = unsafe { execute_lending(&s.client, views, &s.into_lent, &inputs, &[(1, 0)], &[]) }
        .expect("execute");
    assert_eq!(run.in_place, 1, "the output is the lent memory");
}

fn donate_step(s: &Setup, buf: Buffer) -> Buffer {
    let mut out = s.inplace.execute_with(vec![Input::Donated(buf)]).expect("execute");
    out.pop().expect("one output")
}

fn benches(c: &mut Criterion, s: &Setup) {
    let (a, b) = ([1.0f32, 2.0, 3.0, 4.0], [10.0f32; 4]);
    let xa = s.client.buffer_from_host(&a, &[4]).expect("upload");
    let xb = s.client.buffer_from_host(&b, &[4]).expect("upload");
    let out = s.add.execute(&[&xa, &xb]).expect("execute");

    let mut g = c.benchmark_group("tiny");
    g.bench_function("round_trip_2_uploads_execute_read_in_place", |bench| {
        bench.iter(|| black_box(round_trip(s, &a, &b)))
    });
    let mut dst = [0.0f32; 4];
    g.bench_function("round_trip_2_uploads_execute_to_host", |bench| {
        bench.iter(|| round_trip_to_host(s, &a, &b, &mut dst))
    });
    g.bench_function("execute", |bench| bench.iter(|| black_box(s.add.execute(&[&xa, &xb]))));
    g.bench_function("read_in_place", |bench| {
        bench.iter(|| black_box(out[0].read_in_place_as::<f32, _>(|v| v[0])))
    });
    g.bench_function("upload_f32x4", |bench| {
        bench.iter(|| black_box(s.client.buffer_from_host(&a, &[4])))
    });
    g.finish();

    let mut g = c.benchmark_group("64MiB");
    g.sample_size(20).throughput(Throughput::Bytes((2 * N_64MIB * 4) as u64)); // read + written
    let mut buf =
        Some(s.client.buffer_from_host(&vec![0.0f32; N_64MIB], &[N_64MIB as i64]).expect("upload"));
    g.bench_function("add_one_donated", |bench| {
        bench.iter(|| {
            let next = donate_step(s, buf.take().expect("buffer"));
            buf = Some(next);
        })
    });
    let views = ViewCache::default();
    let ((xv, xo), (ov, oo)) = (aligned_64mib(), aligned_64mib());
    let (x, o) = (&xv[xo..xo + N_64MIB * 4], &ov[oo..oo + N_64MIB * 4]);
    g.bench_function("add_one_fresh_output", |bench| bench.iter(|| fresh_step(s, &views, x)));
    g.bench_function("add_one_into_lent_memory", |bench| bench.iter(|| lent_step(s, &views, x, o)));
    let src = vec![1u8; N_64MIB * 4];
    let mut dst = vec![0u8; N_64MIB * 4];
    g.bench_function("memcpy", |bench| {
        bench.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    });
    let threads = copy_threads();
    g.bench_function(format!("memcpy_{threads}_threads"), |bench| {
        bench.iter(|| {
            threaded_copy(&mut dst, black_box(&src), threads);
            black_box(&dst);
        })
    });
    g.finish();

    let mut g = c.benchmark_group("compile");
    g.sample_size(10);
    for (name, text) in [("tiny_add", ADD), ("rms_norm_1024x4096", RMS_NORM)] {
        let program = Program::text(text);
        g.bench_with_input(BenchmarkId::from_parameter(name), &program, |bench, p| {
            bench.iter(|| black_box(s.client.compile(p, &CompileOptions::new()).expect("compile")))
        });
    }
    g.finish();
}

fn summary(s: &Setup) {
    let (a, b) = ([1.0f32, 2.0, 3.0, 4.0], [10.0f32; 4]);
    let xa = s.client.buffer_from_host(&a, &[4]).expect("upload");
    let xb = s.client.buffer_from_host(&b, &[4]).expect("upload");
    let out = s.add.execute(&[&xa, &xb]).expect("execute");
    let rt = median(41, 500, || {
        black_box(round_trip(s, &a, &b));
    });
    let mut dst = [0.0f32; 4];
    let rt_host = median(41, 500, || round_trip_to_host(s, &a, &b, &mut dst));
    let exec = median(41, 500, || {
        black_box(s.add.execute(&[&xa, &xb]).expect("execute"));
    });
    let read = median(41, 2000, || {
        black_box(out[0].read_in_place_as::<f32, _>(|v| v[0]).expect("read"));
    });
    let xs = vec![0.5f32; 64 * 256];
    let on_caller = s.client.buffer_from_host(&xs, &[64, 256]).expect("upload");
    let on_worker = s.worker.buffer_from_host(&xs, &[64, 256]).expect("upload");
    // Alternating batches, so that both clients see the same machine.
    let (mut caller_runs, mut worker_runs) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        caller_runs.push(median(9, 200, || {
            black_box(s.silu.execute(&[&on_caller]).expect("execute"));
        }));
        worker_runs.push(median(9, 200, || {
            black_box(s.worker_silu.execute(&[&on_worker]).expect("execute"));
        }));
    }
    caller_runs.sort();
    worker_runs.sort();
    let (silu_caller, silu_worker) = (caller_runs[2], worker_runs[2]);
    // 256-bit against the client's default width, alternating batches, inputs in [-4, 4).
    let views = ViewCache::default();
    let n = 1024 * 4096;
    let (mut xv, xo) = aligned_64mib();
    for (i, v) in xv[xo..xo + n * 4].chunks_exact_mut(4).enumerate() {
        v.copy_from_slice(&((i % 8192) as f32 / 1024.0 - 4.0).to_ne_bytes());
    }
    let (ov, oo) = aligned_64mib();
    let (x, o) = (&xv[xo..xo + n * 4], &ov[oo..oo + n * 4]);
    let mut widths = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    for _ in 0..5 {
        for (k, [narrow, default]) in widths.iter_mut().enumerate() {
            narrow.push(median(7, 3, || activation_step(s, &views, &s.narrow[k], x, o)));
            default.push(median(7, 3, || activation_step(s, &views, &s.default_width[k], x, o)));
        }
    }
    let widths = widths.map(|pair| {
        pair.map(|mut runs| {
            runs.sort();
            runs[2]
        })
    });
    let default_width = CompileOptions::new()
        .for_client(&s.client)
        .overrides()
        .find_map(|(k, v)| match (k, v) {
            ("xla_cpu_prefer_vector_width", OptionOverride::Int(bits)) => {
                Some(format!("{bits}-bit (default)"))
            }
            _ => None,
        })
        .unwrap_or_else(|| "XLA's default".to_owned());
    let mut small = [0.0f32; 4];
    let transfer = median(21, 100, || {
        out[0].to_host_via_transfer(&mut small).expect("transfer");
    });

    let mut buf =
        Some(s.client.buffer_from_host(&vec![0.0f32; N_64MIB], &[N_64MIB as i64]).expect("upload"));
    let kernel = median(15, 1, || {
        let next = donate_step(s, buf.take().expect("buffer"));
        buf = Some(next);
    });
    let views = ViewCache::default();
    let ((xv, xo), (ov, oo)) = (aligned_64mib(), aligned_64mib());
    let (x, o) = (&xv[xo..xo + N_64MIB * 4], &ov[oo..oo + N_64MIB * 4]);
    let fresh = median(15, 1, || fresh_step(s, &views, x));
    let into_lent = median(15, 1, || lent_step(s, &views, x, o));
    let src = vec![1u8; N_64MIB * 4];
    let mut dst = vec![0u8; N_64MIB * 4];
    let memcpy_1 = median(15, 1, || {
        dst.copy_from_slice(black_box(&src));
        black_box(&dst);
    });
    let threads = copy_threads();
    let memcpy_n = median(15, 1, || {
        threaded_copy(&mut dst, black_box(&src), threads);
        black_box(&dst);
    });
    // The baseline is the faster copy.
    let (memcpy, faster) = if memcpy_n < memcpy_1 {
        (memcpy_n, format!("{threads} threads"))
    } else {
        (memcpy_1, "1 thread".to_owned())
    };
    let compile_tiny = median(5, 1, || {
        black_box(s.client.compile(&Program::text(ADD), &CompileOptions::new()).expect("compile"));
    });
    let compile_rms = median(5, 1, || {
        black_box(
            s.client.compile(&Program::text(RMS_NORM), &CompileOptions::new()).expect("compile"),
        );
    });

    let gbps = |d: Duration| (2 * N_64MIB * 4) as f64 / d.as_secs_f64() / 1e9; // read + written
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let ratio = memcpy.as_secs_f64() / kernel.as_secs_f64();
    let verdict = |ok: bool| if ok { "ok" } else { "MISSED" };
    println!("\n== pjrt summary (medians, this run) ==");
    println!("{:<52} {:>12} {:>14} {:>7}", "measurement", "median", "target", "");
    println!(
        "{:<52} {:>9.2} us {:>14} {:>7}",
        "tiny round trip (2 uploads, execute, read in place)",
        us(rt),
        "<= 10 us",
        verdict(us(rt) <= 10.0)
    );
    println!(
        "{:<52} {:>9.2} us {:>14} {:>7}",
        "tiny round trip (2 uploads, execute, to_host)",
        us(rt_host),
        "",
        ""
    );
    println!(
        "{:<52} {:>9.2} us {:>14} {:>7}",
        "execute alone (+ wait)",
        us(exec),
        "<= 4 us",
        verdict(us(exec) <= 4.0)
    );
    println!(
        "{:<52} {:>9.2} us {:>14} {:>7}",
        "f32[64,256] x*sigmoid(x), execute (+ wait) on the caller",
        us(silu_caller),
        "",
        ""
    );
    println!(
        "{:<52} {:>9.2} us {:>14} {:>7}",
        "  the same on the plugin's worker thread (its default)",
        us(silu_worker),
        "",
        ""
    );
    let act_gbps = |d: Duration| (2 * 1024 * 4096 * 4) as f64 / d.as_secs_f64() / 1e9;
    for (k, name) in ["silu", "gelu (erf)"].iter().enumerate() {
        for (w, width) in ["256-bit", default_width.as_str()].iter().enumerate() {
            let d = widths[k][w];
            println!(
                "{:<52} {:>9.2} ms {:>14} {:>7}",
                format!("{name} 1024x4096, {width} ({:.1} GB/s)", act_gbps(d)),
                ms(d),
                "",
                ""
            );
        }
    }
    println!("{:<52} {:>9.3} us {:>14} {:>7}", "read in place", us(read), "~0.2 us", "");
    println!(
        "{:<52} {:>9.2} us {:>14} {:>7}",
        "read f32x4 via PJRT_Buffer_ToHostBuffer + await",
        us(transfer),
        "",
        ""
    );
    println!(
        "{:<52} {:>9.2} ms {:>14} {:>7}",
        format!("64 MiB x+1, donated ({:.1} GB/s r+w)", gbps(kernel)),
        ms(kernel),
        "",
        ""
    );
    println!(
        "{:<52} {:>9.2} ms {:>14} {:>7}",
        format!("64 MiB x+1, fresh output ({:.1} GB/s r+w)", gbps(fresh)),
        ms(fresh),
        "",
        ""
    );
    println!(
        "{:<52} {:>9.2} ms {:>14} {:>7}",
        format!("64 MiB x+1 into lent memory ({:.1} GB/s r+w)", gbps(into_lent)),
        ms(into_lent),
        "",
        ""
    );
    println!(
        "{:<52} {:>9.2} ms {:>14} {:>7}",
        format!("64 MiB memcpy, 1 thread ({:.1} GB/s r+w)", gbps(memcpy_1)),
        ms(memcpy_1),
        "",
        ""
    );
    println!(
        "{:<52} {:>9.2} ms {:>14} {:>7}",
        format!("64 MiB memcpy, {threads} threads ({:.1} GB/s r+w)", gbps(memcpy_n)),
        ms(memcpy_n),
        "",
        ""
    );
    println!(
        "{:<52} {:>11.0}% {:>14} {:>7}",
        format!("kernel speed relative to memcpy ({faster}, faster)"),
        ratio * 100.0,
        ">= 70%",
        verdict(ratio >= 0.7)
    );
    println!("{:<52} {:>9.2} ms {:>14} {:>7}", "compile tiny module", ms(compile_tiny), "", "");
    println!(
        "{:<52} {:>9.2} ms {:>14} {:>7}",
        "compile RMSNorm 1024x4096",
        ms(compile_rms),
        "",
        ""
    );
}

fn main() {
    let Some(s) = setup() else { return };
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c, &s);
    c.final_summary();
    summary(&s);
}
