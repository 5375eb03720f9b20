//! The CPU twins of tiled kernels (`tpu_kernels::mosaic::cpu_twin`: the same description with
//! Pallas interpret-mode semantics) run on the PJRT CPU plugin and match f64 references computed
//! here: the grid, the windows' index maps, the scratch accumulator across the `arbitrary` K
//! axis and its `when`s all show in the values. The interpreter of the printed module
//! (`tpu_kernels::mosaic::interpret`, which reads only the text libtpu is given) matches both.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

#[path = "support/tiled_kernels.rs"]
mod tiled_kernels;

#[path = "support/data.rs"]
mod test_data;

use tiled_kernels::{matmul, rms_norm, silu_mul};
use tpu_kernels::DType;
use tpu_kernels::mosaic::{Form, Kernel, TiledBuilder, cpu_twin, custom_call_module_as, interpret};
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

/// Runs the kernel's twin on f32 inputs; its outputs.
fn run(client: &Client, kernel: &Kernel, inputs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let module = cpu_twin(kernel).unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
    let text = module.to_text();
    assert!(!text.contains("tpu_custom_call"), "{text}");
    let exe = client
        .compile(&Program::text(text.clone()), &CompileOptions::new())
        .unwrap_or_else(|e| panic!("{}: {e}\n{text}", kernel.name));
    let buffers = upload(client, kernel, inputs);
    let refs: Vec<_> = buffers.iter().collect();
    let twin: Vec<Vec<f32>> =
        exe.execute(&refs).unwrap().iter().map(|b| b.to_vec::<f32>().unwrap()).collect();
    // The printed module, parsed back and interpreted, agrees with the twin.
    let f64s: Vec<Vec<f64>> =
        inputs.iter().map(|x| x.iter().map(|v| f64::from(*v)).collect()).collect();
    let interpreted = interpret(&custom_call_module_as(kernel, Form::Readable), &f64s)
        .unwrap_or_else(|e| panic!("{}: interpreter: {e}", kernel.name));
    assert_eq!(interpreted.len(), twin.len());
    for (i, (a, b)) in interpreted.iter().zip(&twin).enumerate() {
        assert_close(
            &format!("{} output {i}: interpreter vs twin", kernel.name),
            b,
            a,
            Tolerance::new(1e-4, 1e-5),
        );
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
        let interpreted =
            interpret(&custom_call_module_as(&kernel, Form::Readable), &f64s).unwrap();
        let twin: Vec<f64> = twin.iter().map(|v| v.to_f64()).collect();
        // Both round once to bf16 from f32 arithmetic: at most one bf16 ulp apart (2^-7 relative),
        // the matmul's sums of 512 products a little more.
        assert_close(
            &format!("{} bf16: interpreter vs twin", kernel.name),
            &interpreted[0],
            &twin,
            Tolerance::new(2e-2, 2.0f64.powi(-7)),
        );
    }
}
