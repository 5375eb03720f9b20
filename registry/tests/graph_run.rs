//! Whole ATen graphs through the dispatcher: the traced GPT block's forward and backward, with
//! registered kernels selected by the registry and inlined, agree with the same graphs lowered by
//! the default table alone (which the Python tests check against PyTorch).

use std::sync::Arc;

use tpu_kernels::{DType, TensorType};
use tpu_kernels_registry::cache::{CacheConfig, CompileCache};
use tpu_kernels_registry::graph::{Graph, NoKernels, lower};
use tpu_kernels_registry::numerics::{Tolerance, assert_close};
use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::pjrt::{Buffer, CompileOptions, Program};
use tpu_kernels_registry::{Dispatcher, GraphRunError, HostTensor, Registry, check};

fn graph(name: &str) -> Graph {
    let path = format!("{}/tests/data/graphs/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("graph file");
    Graph::from_json(&text).expect("graph parses")
}

/// Inputs: small floats, and integer ids in [0, 8) (token ids and targets index a vocab of 64).
fn inputs(g: &Graph) -> Vec<Vec<u8>> {
    g.inputs
        .iter()
        .enumerate()
        .map(|(i, input)| match input.ty.dtype {
            DType::I64 => {
                let n = input.ty.shape.num_elements().expect("static") as i64;
                (0..n).flat_map(|k| ((k * 5 + i as i64) % 8).to_le_bytes()).collect()
            }
            _ => check::random_bytes(&input.ty, i as u64 + 11).expect("random data"),
        })
        .collect()
}

fn as_f64(buffers: &[Buffer]) -> Vec<Vec<f64>> {
    buffers.iter().map(|b| check::buffer_as_f64(b).expect("readable output")).collect()
}

/// The backward graph's inputs as training gives them: the forward's saved outputs (everything
/// after the loss, run through the table alone) and a loss gradient of 1. Random saved tensors
/// would not belong to the inputs they were saved from, and the kernels and the table may read
/// different ones of them (the table rebuilds the attention probabilities from the saved
/// logsumexp, the kernel recomputes them).
fn backward_inputs(client: &tpu_kernels_registry::pjrt::Client, bwd: &Graph) -> Vec<Vec<u8>> {
    let fwd = graph("gpt_block_fwd");
    let outs = run_table(client, &fwd, &inputs(&fwd));
    let mut data: Vec<Vec<u8>> = outs
        .iter()
        .skip(1)
        .map(|b| b.read_in_place(|bytes| bytes.to_vec()).expect("readable output"))
        .collect();
    data.push(1.0f32.to_le_bytes().to_vec());
    assert_eq!(data.len(), bwd.inputs.len(), "forward outputs feed the backward graph");
    data
}

/// `g` lowered by the default table alone, compiled and run on `data`.
fn run_table(
    client: &tpu_kernels_registry::pjrt::Client,
    g: &Graph,
    data: &[Vec<u8>],
) -> Vec<Buffer> {
    let table_only = lower(g, &NoKernels).expect("lowers without kernels").to_text();
    assert!(!table_only.contains("call @"));
    let exe = client.compile(&Program::text(table_only), &CompileOptions::new()).expect("compiles");
    let buffers: Vec<Buffer> = g
        .inputs
        .iter()
        .zip(data)
        .map(|(i, bytes)| {
            let dims: Vec<i64> =
                i.ty.shape.static_dims().expect("static").iter().map(|&d| d as i64).collect();
            let et = tpu_kernels_registry::dispatch::element_type(i.ty.dtype).expect("buffer type");
            client.buffer_from_bytes(bytes, et, &dims).expect("upload")
        })
        .collect();
    let refs: Vec<&Buffer> = buffers.iter().collect();
    exe.execute(&refs).expect("runs")
}

fn run_both(name: &str, kernels_expected: bool) {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let cache = Arc::new(CompileCache::new(CacheConfig::memory_only(8)));
    let d = Dispatcher::new(Registry::global().expect("registry"), client.clone(), cache)
        .expect("dispatcher");
    let g = graph(name);
    let data = if name.ends_with("_bwd") { backward_inputs(&client, &g) } else { inputs(&g) };
    let host: Vec<HostTensor<'_>> = g
        .inputs
        .iter()
        .zip(&data)
        .map(|(i, bytes)| HostTensor { ty: &i.ty, data: bytes, contiguous: true })
        .collect();

    let program = d.graph_program(&g).expect("lowers");
    let text = String::from_utf8_lossy(program.as_bytes());
    assert_eq!(text.contains("call @"), kernels_expected, "{name}: kernels inlined or not");
    let with_kernels = as_f64(&d.run_graph(&g, &host).expect("graph runs"));

    let reference = as_f64(&run_table(&client, &g, &data));

    assert_eq!(with_kernels.len(), reference.len());
    for (k, (a, b)) in with_kernels.iter().zip(&reference).enumerate() {
        // f32 sums in different orders: relative to the output's scale (its largest finite
        // magnitude, at least 1; a NaN or an infinity the table does not have fails anyway).
        let scale = b.iter().filter(|y| y.is_finite()).map(|y| y.abs()).fold(1.0, f64::max);
        assert_close(
            &format!("{name} output {k} (kernels against the table, scale {scale})"),
            a,
            b,
            Tolerance::abs(1e-5 * scale),
        );
    }
}

#[test]
fn gpt_block_forward_with_kernels_matches_the_table() {
    // `aten::_log_softmax` goes to the registered kernel.
    run_both("gpt_block_fwd", true);
}

#[test]
fn gpt_block_backward_with_kernels_matches_the_table() {
    // `aten::_scaled_dot_product_flash_attention_for_cpu_backward` goes to its kernel; the
    // table's own lowering of that op is the reference.
    run_both("gpt_block_bwd", true);
}

#[test]
fn wrong_inputs_are_refused_before_running() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let cache = Arc::new(CompileCache::new(CacheConfig::memory_only(8)));
    let d =
        Dispatcher::new(Registry::global().expect("registry"), client, cache).expect("dispatcher");
    let g = graph("gpt_block_fwd");
    let wrong = TensorType::new(DType::F32, [3]);
    let bytes = vec![0u8; 12];
    let host = vec![HostTensor { ty: &wrong, data: &bytes, contiguous: true }; g.inputs.len()];
    let err = d.run_graph(&g, &host).expect_err("wrong types");
    assert!(matches!(err, GraphRunError::BadInput(_)), "{err}");
    assert!(err.to_string().contains("the graph takes i64[2,8]"), "{err}");
    let err = d.run_graph(&g, &host[..1]).expect_err("wrong count");
    assert!(err.to_string().contains("graph takes 12 inputs, 1 given"), "{err}");
}
