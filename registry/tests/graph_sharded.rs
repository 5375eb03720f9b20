//! A registered kernel run per shard in a manually sharded region of an SPMD program
//! (`IndexResolver::resolve_manual`): softmax over rows, cut along the rows over 4 PJRT CPU
//! devices, against the whole softmax; and the reasons a spec cannot hold.

use serde_json::json;
use tpu_kernels::registration::Platform;
use tpu_kernels_registry::Registry;
use tpu_kernels_registry::graph::{
    self, Graph, IndexResolver, KernelCall, KernelResolver, OpCall, ShardSpec,
};
use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::pjrt::{CompileOptions, Input, Program};

const ROWS: usize = 8;
const COLS: usize = 128;

fn softmax_graph() -> Graph {
    let text = json!({
        "version": 1, "name": "rows",
        "inputs": [{"name": "x", "type": "f32[8,128]"}],
        "nodes": [{"name": "s", "op": "aten::_softmax.default",
                   "args": [{"tensor": {"node": "x"}}, {"int": -1}, {"bool": false}],
                   "arg_names": ["self", "dim", "half_to_float"], "outputs": ["f32[8,128]"]}],
        "outputs": [{"node": "s"}]
    })
    .to_string();
    Graph::from_json(&text).expect("graph")
}

/// Resolves every call per shard under `spec`, recording why it could not.
struct PerShard {
    inner: IndexResolver,
    spec: ShardSpec,
    why: std::cell::RefCell<Vec<String>>,
}

impl KernelResolver for PerShard {
    fn resolve(&self, call: &OpCall<'_>) -> Option<KernelCall> {
        match self.inner.resolve_manual(call, &self.spec, None) {
            Ok(k) => Some(k),
            Err(e) => {
                self.why.borrow_mut().push(e);
                None
            }
        }
    }
}

fn per_shard(inputs: Vec<Option<usize>>, outputs: Vec<Option<usize>>, devices: usize) -> PerShard {
    let index = Registry::global().expect("registry").index();
    PerShard {
        inner: IndexResolver::new(index, Platform::Cpu),
        spec: ShardSpec { inputs, outputs, devices },
        why: std::cell::RefCell::new(Vec::new()),
    }
}

#[test]
fn softmax_runs_per_shard_of_rows_on_four_devices() {
    let Some(client) = cpu_client_for_tests(4) else { return };
    let resolver = per_shard(vec![Some(0)], vec![Some(0)], 4);
    let mut module = graph::lower(&softmax_graph(), &resolver).expect("lowers");
    assert!(resolver.why.borrow().is_empty(), "{:?}", resolver.why.borrow());
    let rows = "\"{devices=[4,1]0,1,2,3}\"".to_owned();
    let main = module.functions.first_mut().expect("main");
    main.param_attrs[0].push(("mhlo.sharding".to_owned(), rows.clone()));
    main.result_attrs[0].push(("mhlo.sharding".to_owned(), rows));
    let text = module.to_text();
    assert!(text.contains("custom_call @SPMDFullToShardShape"), "{text}");
    assert!(text.contains("custom_call @SPMDShardToFullShape"), "{text}");
    // The kernel takes the shard's 2 rows.
    assert!(text.contains("(tensor<8x128xf32>) -> tensor<2x128xf32>"), "{text}");
    let exe = client.compile(&Program::text(text), &CompileOptions::spmd(4)).expect("compiles");
    assert_eq!(exe.parameters().expect("parameters")[0].dims, vec![2, COLS as i64]);
    let x: Vec<f32> = (0..ROWS * COLS).map(|i| ((i * 37 % 101) as f32) / 17.0 - 3.0).collect();
    let shards: Vec<_> = client
        .devices()
        .iter()
        .enumerate()
        .map(|(d, dev)| {
            let rows = &x[d * 2 * COLS..(d + 1) * 2 * COLS];
            client.buffer_from_host_on(rows, &[2, COLS as i64], dev).expect("upload")
        })
        .collect();
    let outs =
        exe.execute_sharded(shards.iter().map(|b| vec![Input::from(b)]).collect()).expect("runs");
    let mut got = Vec::new();
    for out in &outs {
        got.extend(out[0].to_vec::<f32>().expect("read"));
    }
    for r in 0..ROWS {
        let row = &x[r * COLS..(r + 1) * COLS];
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
        for c in 0..COLS {
            let want = (row[c] as f64 - max).exp() / sum;
            let have = got[r * COLS + c] as f64;
            assert!(
                (have - want).abs() <= 1e-6 + 1e-5 * want.abs(),
                "row {r} col {c}: {have} vs {want}"
            );
        }
    }
}

#[test]
fn a_spec_that_cannot_hold_says_why() {
    // 8 rows do not cut into 3 shards.
    let resolver = per_shard(vec![Some(0)], vec![Some(0)], 3);
    assert!(graph::lower(&softmax_graph(), &resolver).is_ok(), "the default table lowers it");
    let why = resolver.why.borrow().join("; ");
    assert!(
        why.contains("input 0 f32[8,128]: dimension 0 of size 8 does not divide into 3 shards"),
        "{why}"
    );
    // Rows cut on the way in but the output declared whole: the kernel's result at the shard's
    // signature is a quarter, so its work is not what the spec claims.
    let resolver = per_shard(vec![Some(0)], vec![None], 4);
    assert!(graph::lower(&softmax_graph(), &resolver).is_ok());
    let why = resolver.why.borrow().join("; ");
    assert!(
        why.contains("output 0 is f32[2,128] at the shard's signature, not f32[8,128]"),
        "{why}"
    );
    // A dimension the tensor does not have.
    let resolver = per_shard(vec![Some(2)], vec![Some(2)], 4);
    assert!(graph::lower(&softmax_graph(), &resolver).is_ok());
    let why = resolver.why.borrow().join("; ");
    assert!(why.contains("input 0 f32[8,128] has no dimension 2"), "{why}");
}
