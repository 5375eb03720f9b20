//! The CPU twins of tiled kernels (`tpu_kernels::mosaic::cpu_twin`: the same description with
//! Pallas interpret-mode semantics) run on the PJRT CPU plugin and match f64 references computed
//! here: the grid, the windows' index maps, the scratch accumulator across the `arbitrary` K
//! axis and its `when`s all show in the values. The interpreter of the printed module
//! (`tpu_kernels::mosaic::interpret`, which reads only the text libtpu is given) matches both, in
//! both printed forms; and a shipped text corrupted the way a printing bug would corrupt it is
//! refused by the interpreter or gives other values than the twin.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

#[path = "support/tiled_kernels.rs"]
mod tiled_kernels;

#[path = "support/data.rs"]
mod test_data;

use tiled_kernels::{matmul, rms_norm, silu_mul};
use tpu_kernels::DType;
use tpu_kernels::mosaic::wrap::base64;
use tpu_kernels::mosaic::{
    Form, Kernel, TiledBuilder, cpu_twin, custom_call_module_as, interpret, print_kernel_serialized,
};
use tpu_kernels_registry::numerics::{Tolerance, assert_close};
use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::pjrt::{Buffer, Client, CompileOptions, NativeType, Program};

/// Deterministic values in [-2, 2).
fn data(n: usize, seed: u64) -> Vec<f32> {
    test_data::uniform(n, seed, -2.0, 2.0)
}

/// The kernel's input arrays on the client.
fn upload<T: NativeType>(client: &Client, kernel: &Kernel, inputs: &[Vec<T>]) -> Vec<Buffer> {
    kernel
        .inputs()
        .iter()
        .zip(inputs)
        .map(|(w, x)| {
            let dims: Vec<i64> =
                w.array.shape.static_dims().unwrap().iter().map(|d| *d as i64).collect();
            client.buffer_from_host(x, &dims).unwrap()
        })
        .collect()
}

/// The kernel's twin run on f32 inputs: its outputs.
fn twin(client: &Client, kernel: &Kernel, inputs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let module = cpu_twin(kernel).unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
    let text = module.to_text();
    assert!(!text.contains("tpu_custom_call"), "{text}");
    let exe = client
        .compile(&Program::text(text.clone()), &CompileOptions::new())
        .unwrap_or_else(|e| panic!("{}: {e}\n{text}", kernel.name));
    let buffers = upload(client, kernel, inputs);
    let refs: Vec<_> = buffers.iter().collect();
    exe.execute(&refs).unwrap().iter().map(|b| b.to_vec::<f32>().unwrap()).collect()
}

fn as_f64s(inputs: &[Vec<f32>]) -> Vec<Vec<f64>> {
    inputs.iter().map(|x| x.iter().map(|v| f64::from(*v)).collect()).collect()
}

/// Runs the kernel's twin on f32 inputs; its outputs. The printed module, in each form, parsed
/// back and interpreted, agrees with them.
fn run(client: &Client, kernel: &Kernel, inputs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let twin = twin(client, kernel, inputs);
    let f64s = as_f64s(inputs);
    for form in [Form::Readable, Form::Shipped] {
        let interpreted = interpret(&custom_call_module_as(kernel, form), &f64s)
            .unwrap_or_else(|e| panic!("{} {form:?}: interpreter: {e}", kernel.name));
        assert_eq!(interpreted.len(), twin.len());
        for (i, (a, b)) in interpreted.iter().zip(&twin).enumerate() {
            assert_close(
                &format!("{} output {i}: interpreter ({form:?}) vs twin", kernel.name),
                b,
                a,
                Tolerance::new(1e-4, 1e-5),
            );
        }
    }
    twin
}

#[test]
fn silu_mul_twin_matches_the_reference() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let kernel = silu_mul(DType::F32, [128, 128]).and_then(TiledBuilder::finish).unwrap();
    let (a, b) = (data(256 * 512, 1), data(256 * 512, 2));
    let got = run(&client, &kernel, &[a.clone(), b.clone()]);
    let want: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| {
            let x = f64::from(x);
            x / (1.0 + (-x).exp()) * f64::from(y)
        })
        .collect();
    assert_close("silu_mul twin", &got[0], &want, Tolerance::new(1e-6, 1e-6));
}

#[test]
fn rms_norm_twin_matches_the_reference() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let kernel = rms_norm(DType::F32).unwrap();
    let (m, d) = (256usize, 1024usize);
    let (x, w) = (data(m * d, 3), data(d, 4));
    let got = run(&client, &kernel, &[x.clone(), w.clone()]);
    let mut want = Vec::with_capacity(m * d);
    for row in x.chunks(d) {
        let ms = row.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / d as f64;
        let r = 1.0 / (ms + 1e-6).sqrt();
        want.extend(row.iter().zip(&w).map(|(v, w)| f64::from(*v) * r * f64::from(*w)));
    }
    assert_close("rms_norm twin", &got[0], &want, Tolerance::new(1e-5, 1e-5));
}

#[test]
fn matmul_twin_accumulates_over_the_k_axis() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let kernel = matmul(DType::F32).unwrap();
    let n = 512usize;
    let (a, b) = (data(n * n, 5), data(n * n, 6));
    let got = run(&client, &kernel, &[a.clone(), b.clone()]);
    let mut want = vec![0.0f64; n * n];
    for i in 0..n {
        for k in 0..n {
            let aik = f64::from(a[i * n + k]);
            for j in 0..n {
                want[i * n + j] += aik * f64::from(b[k * n + j]);
            }
        }
    }
    // Sums of 512 products of values in [-2, 2): f32 accumulation error well under 1e-3.
    assert_close("matmul twin", &got[0], &want, Tolerance::new(1e-3, 1e-5));
}

#[test]
fn bf16_kernels_agree_between_the_interpreter_and_the_twin() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    for kernel in [
        silu_mul(DType::BF16, [128, 128]).and_then(TiledBuilder::finish).unwrap(),
        rms_norm(DType::BF16).unwrap(),
        matmul(DType::BF16).unwrap(),
    ] {
        let inputs: Vec<Vec<half::bf16>> = kernel
            .inputs()
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let n = w.array.shape.num_elements().unwrap() as usize;
                data(n, 10 + i as u64).into_iter().map(half::bf16::from_f32).collect()
            })
            .collect();
        let exe = client
            .compile(&Program::text(cpu_twin(&kernel).unwrap().to_text()), &CompileOptions::new())
            .unwrap();
        let buffers = upload(&client, &kernel, &inputs);
        let refs: Vec<_> = buffers.iter().collect();
        let twin = exe.execute(&refs).unwrap()[0].to_vec::<half::bf16>().unwrap();
        let f64s: Vec<Vec<f64>> =
            inputs.iter().map(|x| x.iter().map(|v| v.to_f64()).collect()).collect();
        let twin: Vec<f64> = twin.iter().map(|v| v.to_f64()).collect();
        for form in [Form::Readable, Form::Shipped] {
            let interpreted = interpret(&custom_call_module_as(&kernel, form), &f64s)
                .unwrap_or_else(|e| panic!("{} {form:?}: interpreter: {e}", kernel.name));
            // Both round once to bf16 from f32 arithmetic: at most one bf16 ulp apart (2^-7
            // relative), the matmul's sums of 512 products a little more.
            assert_close(
                &format!("{} bf16: interpreter ({form:?}) vs twin", kernel.name),
                &interpreted[0],
                &twin,
                Tolerance::new(2e-2, 2.0f64.powi(-7)),
            );
        }
    }
}

/// What the interpreter must make of a corrupted text.
#[derive(Debug)]
enum Expect {
    /// Refused, the error naming the body line and saying this.
    Refused(&'static str),
    /// Read and run, with outputs that differ from the twin's.
    Differs,
}

/// The printing bugs of the K-accumulated matmul's shipped text: (what, the text printed, the
/// text a bug would print instead (its first occurrence), what the interpreter does with it).
const CORRUPTIONS: [(&str, &str, &str, Expect); 9] = [
    (
        "transform_0's two results swapped (the A window at block (k, i))",
        "\"stable_mosaic.func.return\"(%arg0, %arg2)",
        "\"stable_mosaic.func.return\"(%arg2, %arg0)",
        Expect::Differs,
    ),
    (
        "transpose_rhs set (square blocks: still type-checks; Mosaic computes a·bᵀ)",
        "transpose_rhs = false",
        "transpose_rhs = true",
        Expect::Differs,
    ),
    (
        "the lhs and rhs contracting fields swapped",
        "dot_dimension_numbers<[1], [0],",
        "dot_dimension_numbers<[0], [1],",
        Expect::Refused("the lhs dims are contracting 0 and non-contracting [0]"),
    ),
    (
        "the transposed product's dimension numbers printed for the plain one",
        "<[1], [0], [0], [1], [0, 0, 1, 1], [], []>",
        "<[1], [1], [0], [0], [0, 0, 1, 0], [], []>",
        Expect::Differs,
    ),
    (
        "the last K step's constant off by one (the output written a step early)",
        "{value = 3 : i32}",
        "{value = 2 : i32}",
        Expect::Differs,
    ),
    (
        "the accumulator's zero printed as one",
        "{value = dense<0.000000e+00> : vector<128x128xf32>}",
        "{value = dense<1.000000e+00> : vector<128x128xf32>}",
        Expect::Differs,
    ),
    (
        "window 0's window_bounds changed",
        "window_bounds = array<i64: 128, 128>",
        "window_bounds = array<i64: 128, 64>",
        Expect::Refused("window 0 is a [128, 64] block"),
    ),
    (
        "the kernel's function_type disagreeing with its block arguments",
        "function_type = (i32, i32, i32, memref<128x128xf32",
        "function_type = (i32, i32, i32, memref<128x256xf32",
        Expect::Refused("its function_type takes"),
    ),
    (
        "an op name not mangled",
        "\"stable_mosaic.arith.cmpi\"",
        "\"arith.cmpi\"",
        Expect::Refused("not in the stable_mosaic serialization"),
    ),
];

#[test]
fn a_corrupted_shipped_text_is_refused_or_disagrees_with_the_twin() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let kernel = matmul(DType::F32).unwrap();
    let n = 512usize;
    let inputs = [data(n * n, 21), data(n * n, 22)];
    let want: Vec<f64> = twin(&client, &kernel, &inputs)[0].iter().map(|v| f64::from(*v)).collect();
    let f64s = as_f64s(&inputs);
    let module = custom_call_module_as(&kernel, Form::Shipped);
    let body = print_kernel_serialized(&kernel);
    let encoded = base64(body.as_bytes());
    assert!(module.contains(&encoded), "the module carries the printed body");
    let differs = |got: &[f64]| {
        let near = |a: f64, b: f64| (a - b).abs() <= 1e-3 * (1.0 + b.abs());
        got.iter().zip(&want).any(|(a, b)| a.is_nan() || !near(*a, *b))
    };
    for (what, printed, bug, expect) in &CORRUPTIONS {
        assert!(body.contains(printed), "{what}: `{printed}` is in the printed text");
        let corrupted = body.replacen(printed, bug, 1);
        let text = module.replace(&encoded, &base64(corrupted.as_bytes()));
        match (interpret(&text, &f64s), expect) {
            (Err(e), Expect::Refused(needle)) => {
                assert!(e.contains(needle), "{what}: refused, but not for that: {e}");
                assert!(e.contains("of the Mosaic body"), "{what}: the error names the line: {e}");
            }
            (Ok(out), Expect::Differs) => {
                assert!(differs(&out[0]), "{what}: the interpreter agrees with the twin")
            }
            (got, expect) => {
                panic!("{what}: expected {expect:?}, got {:?}", got.map(|out| out.len()))
            }
        }
    }
    // The wrapper's config and the body must agree on the form, as libtpu requires.
    let readable_config = module.replace(", \\22serialization_format\\22: 1", "");
    assert_ne!(readable_config, module);
    let e = interpret(&readable_config, &f64s).unwrap_err();
    assert!(e.contains("no serialization_format"), "{e}");
}
