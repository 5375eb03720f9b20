//! Whole-graph lowering: the traced GPT block's forward and backward through the default table,
//! registered kernels as private functions, pattern fusion, and the errors a graph can earn while
//! lowering.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Value, json};
use tpu_kernels::registered;
use tpu_kernels_registry::graph::{
    self, Graph, KernelCall, KernelResolver, LowerError, NoKernels, OpCall, RegisteredKernels,
    TensorRef, fuse, supported_ops,
};

fn data(name: &str) -> Graph {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/graphs").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Graph::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A graph from inputs, nodes and outputs written as JSON.
fn graph(inputs: Value, nodes: Value, outputs: Value) -> Graph {
    let text =
        json!({"version": 1, "name": "g", "inputs": inputs, "nodes": nodes, "outputs": outputs})
            .to_string();
    Graph::from_json(&text).unwrap_or_else(|e| panic!("{e}"))
}

fn t(name: &str) -> Value {
    json!({"tensor": {"node": name}})
}

/// The op overloads the traced GPT block calls (torch 2.15, core ATen decompositions without
/// the scaled-dot-product entries); the table module's docs list the same.
const GPT_BLOCK_OPS: &[&str] = &[
    "aten::_log_softmax.default",
    "aten::_scaled_dot_product_flash_attention_for_cpu.default",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default",
    "aten::_to_copy.default",
    "aten::add.Scalar",
    "aten::add.Tensor",
    "aten::addmm.default",
    "aten::alias.default",
    "aten::bitwise_and.Tensor",
    "aten::bitwise_not.default",
    "aten::cat.default",
    "aten::clamp.default",
    "aten::div.Scalar",
    "aten::div.Tensor",
    "aten::embedding.default",
    "aten::exp.default",
    "aten::expand.default",
    "aten::full.default",
    "aten::full_like.default",
    "aten::gather.default",
    "aten::ge.Scalar",
    "aten::index_put.default",
    "aten::lt.Scalar",
    "aten::mean.dim",
    "aten::mm.default",
    "aten::mul.Scalar",
    "aten::mul.Tensor",
    "aten::ne.Scalar",
    "aten::neg.default",
    "aten::permute.default",
    "aten::pow.Tensor_Scalar",
    "aten::rsqrt.default",
    "aten::scalar_tensor.default",
    "aten::scatter.value",
    "aten::sigmoid.default",
    "aten::split_with_sizes.default",
    "aten::squeeze.dims",
    "aten::sub.Tensor",
    "aten::sum.dim_IntList",
    "aten::unsqueeze.default",
    "aten::view.default",
    "aten::where.self",
];

#[test]
fn the_traced_gpt_block_calls_the_documented_ops_and_the_table_covers_them() {
    let (fwd, bwd) = (data("gpt_block_fwd.json"), data("gpt_block_bwd.json"));
    let ops: BTreeSet<&str> = fwd.ops().into_iter().chain(bwd.ops()).collect();
    assert_eq!(ops.into_iter().collect::<Vec<_>>(), GPT_BLOCK_OPS);
    let table = supported_ops();
    let missing: Vec<&&str> = GPT_BLOCK_OPS.iter().filter(|op| !table.contains(op)).collect();
    assert!(missing.is_empty(), "the table misses {missing:?}");
}

#[test]
fn gpt_block_forward_and_backward_lower_with_the_default_table() {
    for name in ["gpt_block_fwd.json", "gpt_block_bwd.json"] {
        let g = data(name);
        let module = graph::lower(&g, &NoKernels).unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = module.to_text();
        assert!(text.starts_with(&format!("module @{} ", g.name)), "{name}");
        assert!(!text.contains("call @"), "{name}: no kernel was asked for");
        assert_eq!(module.functions.len(), 1, "{name}: only @main");
        let want: Vec<_> = g.outputs.iter().flatten().map(|r| g.type_of(r).cloned()).collect();
        let got: Vec<_> = module.main().results.iter().cloned().map(Some).collect();
        assert_eq!(got, want, "{name}: @main returns the graph's non-null outputs");
        let params: Vec<_> = g.inputs.iter().map(|i| i.ty.clone()).collect();
        assert_eq!(module.main().params, params, "{name}");
        // Deterministic: the same graph gives the same bytes.
        assert_eq!(graph::lower(&g, &NoKernels).map(|m| m.to_text()).ok(), Some(text), "{name}");
    }
}

#[test]
fn registered_kernels_become_private_functions_reached_by_call() {
    let g = data("gpt_block_fwd.json");
    let kernel = registered()
        .into_iter()
        .find(|k| k.ops.iter().any(|o| o.starts_with("aten::_log_softmax")))
        .expect("a kernel is registered for aten::_log_softmax");
    let text =
        graph::lower(&g, &RegisteredKernels::all()).unwrap_or_else(|e| panic!("{e}")).to_text();
    let name = kernel.name;
    assert_eq!(text.matches(&format!("call @{name}(")).count(), 1, "{text}");
    assert_eq!(text.matches(&format!("func.func private @{name}(")).count(), 1, "{text}");
    // The block's attention goes to the CPU flash-attention kernel the same way.
    assert_eq!(text.matches("call @sdpa_flash_cpu(").count(), 1, "{text}");
    // The default table no longer lowers those nodes: no `_log_softmax` math in @main beyond the
    // call (its only reduce over classes is the kernel's).
    let only = RegisteredKernels::only(&[name, "sdpa_flash_cpu"]);
    assert_eq!(only.kernels().len(), 2);
    let text_only = graph::lower(&g, &only).unwrap_or_else(|e| panic!("{e}")).to_text();
    assert_eq!(text_only, text);
}

/// `_softmax` at two shapes and `gelu(approximate="tanh")`.
fn kernel_graph() -> Graph {
    graph(
        json!([{"name": "x", "type": "f32[8,128]"}, {"name": "y", "type": "f32[4,16]"}]),
        json!([
            {"name": "s1", "op": "aten::_softmax.default", "args": [t("x"), {"int": -1}, {"bool": false}],
             "arg_names": ["self", "dim", "half_to_float"], "outputs": ["f32[8,128]"]},
            {"name": "s2", "op": "aten::_softmax.default", "args": [t("y"), {"int": 1}, {"bool": false}],
             "arg_names": ["self", "dim", "half_to_float"], "outputs": ["f32[4,16]"]},
            {"name": "g", "op": "aten::gelu.default", "args": [t("s1")],
             "kwargs": {"approximate": {"string": "tanh"}},
             "arg_names": ["self", "approximate"], "outputs": ["f32[8,128]"]},
            {"name": "s3", "op": "aten::_softmax.default", "args": [t("s2"), {"int": 1}, {"bool": false}],
             "outputs": ["f32[4,16]"]}
        ]),
        json!([{"node": "g"}, {"node": "s3"}]),
    )
}

#[test]
fn one_kernel_at_two_signatures_gets_two_symbols_and_repeats_reuse_them() {
    let g = kernel_graph();
    let module = graph::lower(&g, &RegisteredKernels::all()).unwrap_or_else(|e| panic!("{e}"));
    let text = module.to_text();
    let calls: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            l.split_once("call @").map(|(_, rest)| rest.split('(').next().unwrap_or(""))
        })
        .collect();
    assert_eq!(calls.len(), 4, "{text}");
    // s1 and s2 call different functions; s3 (same signature as s2) reuses s2's.
    assert_ne!(calls[0], calls[1], "{text}");
    assert_eq!(calls[1], calls[3], "{text}");
    assert!(
        calls[1].starts_with(calls[0]),
        "the second softmax is a renamed `{}`: {text}",
        calls[0]
    );
    let gelu = registered()
        .into_iter()
        .find(|k| k.ops.iter().any(|o| o.starts_with("aten::gelu")) && k.name.contains("tanh"))
        .expect("a tanh GELU kernel");
    assert_eq!(calls[2], gelu.name, "approximate=tanh binds the tanh kernel: {text}");
    for c in &calls[..3] {
        assert_eq!(text.matches(&format!("func.func private @{c}(")).count(), 1, "{text}");
    }
    // Without kernels the same graph lowers through the table alone.
    let plain = graph::lower(&g, &NoKernels).unwrap_or_else(|e| panic!("{e}")).to_text();
    assert!(!plain.contains("call @"));
}

#[test]
fn unsupported_ops_are_all_listed_at_once_sorted_and_deduplicated() {
    let g = graph(
        json!([{"name": "x", "type": "f32[4,4]"}]),
        json!([
            {"name": "a", "op": "aten::frobnicate.default", "args": [t("x")], "outputs": ["f32[4,4]"]},
            {"name": "b", "op": "aten::mm.default", "args": [t("a"), t("x")], "outputs": ["f32[4,4]"]},
            {"name": "c", "op": "aten::bar.Tensor", "args": [t("b")], "outputs": ["f32[4,4]"]},
            {"name": "d", "op": "aten::frobnicate.default", "args": [t("c")], "outputs": ["f32[4,4]"]},
            {"name": "e", "op": "aten::bar.Tensor", "args": [t("d")], "outputs": ["f32[4,4]"]}
        ]),
        json!([{"node": "e"}]),
    );
    let err = graph::lower(&g, &RegisteredKernels::all()).unwrap_err();
    match &err {
        LowerError::UnsupportedOp { ops, nodes } => {
            assert_eq!(ops, &["aten::bar.Tensor", "aten::frobnicate.default"]);
            assert_eq!(nodes, &["c", "a"]);
        }
        other => panic!("expected UnsupportedOp, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "no lowering for 2 ATen ops: aten::bar.Tensor (node `c`), aten::frobnicate.default (node `a`)"
    );
}

#[test]
fn a_result_that_contradicts_the_metadata_names_the_node_the_op_and_both_types() {
    let g = graph(
        json!([{"name": "x", "type": "f32[4,8]"}, {"name": "w", "type": "f32[8,3]"}]),
        json!([{"name": "proj", "op": "aten::mm.default", "args": [t("x"), t("w")], "outputs": ["f32[3,4]"]}]),
        json!([{"node": "proj"}]),
    );
    let err = graph::lower(&g, &NoKernels).unwrap_err();
    assert!(
        matches!(err, LowerError::TypeMismatch { ref node, output: 0, .. } if node == "proj"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "node `proj` (aten::mm.default): output 0 lowers to tensor<4x3xf32>, but the graph says tensor<3x4xf32>"
    );
    let g = graph(
        json!([{"name": "x", "type": "f32[4,8]"}]),
        json!([{"name": "parts", "op": "aten::split_with_sizes.default",
                "args": [t("x"), {"int_list": [4, 4]}, {"int": 1}], "outputs": ["f32[4,4]"]}]),
        json!([{"node": "parts"}]),
    );
    let err = graph::lower(&g, &NoKernels).unwrap_err();
    assert!(
        matches!(err, LowerError::OutputCount { ref node, expected: 1, found: 2, .. } if node == "parts"),
        "{err:?}"
    );
}

#[test]
fn wrong_argument_kinds_are_bad_args_naming_the_node() {
    let g = graph(
        json!([{"name": "x", "type": "f32[4,8]"}]),
        json!([{"name": "p", "op": "aten::permute.default", "args": [t("x"), {"string": "1,0"}], "outputs": ["f32[8,4]"]}]),
        json!([{"node": "p"}]),
    );
    let err = graph::lower(&g, &NoKernels).unwrap_err();
    assert_eq!(
        err.to_string(),
        "node `p` (aten::permute.default): argument `dims` must be an int list, got string"
    );
    let g = graph(
        json!([{"name": "x", "type": "f32[4,8]"}]),
        json!([{"name": "v", "op": "aten::view.default", "args": [t("x")], "outputs": ["f32[32]"]}]),
        json!([{"node": "v"}]),
    );
    let err = graph::lower(&g, &NoKernels).unwrap_err();
    assert!(matches!(&err, LowerError::BadArgs { node, .. } if node == "v"), "{err:?}");
    assert!(err.to_string().contains("argument `size` is missing"), "{err}");
    let g = graph(
        json!([{"name": "q", "type": "f32[1,2,4,8]"}]),
        json!([{"name": "attn", "op": "aten::_scaled_dot_product_flash_attention_for_cpu.default",
                "args": [t("q"), t("q"), t("q"), {"float": 0.1}, {"bool": true}],
                "outputs": ["f32[1,2,4,8]", "f32[1,2,4]"]}]),
        json!([{"node": "attn"}]),
    );
    let err = graph::lower(&g, &NoKernels).unwrap_err();
    assert!(
        err.to_string().contains("node `attn`") && err.to_string().contains("dropout_p"),
        "{err}"
    );
}

#[test]
fn python_scalars_promote_as_torch_does() {
    // Each output type is what PyTorch gives; lowering checks every one against it.
    let g = graph(
        json!([{"name": "i", "type": "i64[4]"}, {"name": "m", "type": "bool[4]"},
               {"name": "f", "type": "f32[]"}, {"name": "h", "type": "bf16[4]"}]),
        json!([
            {"name": "a", "op": "aten::add.Tensor", "args": [t("i"), {"float": 1.5}], "outputs": ["f32[4]"]},
            {"name": "b", "op": "aten::add.Tensor", "args": [t("i"), {"int": 2}], "kwargs": {"alpha": {"int": 3}}, "outputs": ["i64[4]"]},
            {"name": "c", "op": "aten::sum.dim_IntList", "args": [t("m"), {"int_list": []}], "outputs": ["i64[]"]},
            {"name": "d", "op": "aten::div.Tensor", "args": [t("i"), t("i")], "outputs": ["f32[4]"]},
            {"name": "e", "op": "aten::mul.Tensor", "args": [t("i"), t("f")], "outputs": ["f32[4]"]},
            {"name": "k", "op": "aten::mul.Tensor", "args": [t("h"), t("f")], "outputs": ["bf16[4]"]},
            {"name": "l", "op": "aten::mul.Tensor", "args": [t("h"), {"float": 2.0}], "outputs": ["bf16[4]"]},
            {"name": "n", "op": "aten::ne.Scalar", "args": [t("i"), {"int": -100}], "outputs": ["bool[4]"]},
            {"name": "o", "op": "aten::lt.Scalar", "args": [t("i"), {"float": 0.5}], "outputs": ["bool[4]"]},
            {"name": "w", "op": "aten::where.self", "args": [t("m"), t("i"), t("f")], "outputs": ["f32[4]"]},
            {"name": "x", "op": "aten::sub.Tensor", "args": [{"int": 1}, t("m")], "outputs": ["i64[4]"]},
            {"name": "y", "op": "aten::exp.default", "args": [t("i")], "outputs": ["f32[4]"]},
            {"name": "z", "op": "aten::full.default", "args": [{"int_list": [2]}, {"float": "-inf"}], "outputs": ["f32[2]"]},
            {"name": "z2", "op": "aten::full.default", "args": [{"int_list": [2]}, {"int": 7}], "outputs": ["i64[2]"]},
            {"name": "z3", "op": "aten::scalar_tensor.default", "args": [{"int": 0}], "outputs": ["f32[]"]},
            {"name": "s", "op": "aten::sum.dim_IntList", "args": [t("h"), {"int_list": [0]}], "outputs": ["bf16[]"]}
        ]),
        json!([{"node": "a"}, {"node": "b"}, {"node": "c"}, {"node": "d"}, {"node": "e"}, {"node": "k"},
               {"node": "l"}, {"node": "n"}, {"node": "o"}, {"node": "w"}, {"node": "x"}, {"node": "y"},
               {"node": "z"}, {"node": "z2"}, {"node": "z3"}, {"node": "s"}]),
    );
    let text = graph::lower(&g, &NoKernels).unwrap_or_else(|e| panic!("{e}")).to_text();
    assert!(text.contains("dense<0xFF800000>"), "-inf survives JSON: {text}");
}

/// A resolver that binds a tensor the node does not take.
struct Liar;

impl KernelResolver for Liar {
    fn resolve(&self, call: &OpCall<'_>) -> Option<KernelCall> {
        let kernel = registered().into_iter().find(|k| k.name.contains("softmax"))?;
        let sig = kernel.canonical_signatures().ok()?.into_iter().next()?;
        let module = kernel.emit(&sig).ok()?;
        let _ = call;
        Some(KernelCall { module, args: vec![TensorRef::new("elsewhere")] })
    }
}

#[test]
fn a_resolver_binding_a_tensor_the_node_does_not_take_is_rejected() {
    let err = graph::lower(&kernel_graph(), &Liar).unwrap_err();
    assert_eq!(
        err.to_string(),
        "node `s1` (aten::_softmax.default): the resolver binds `elsewhere`, which the node does not take"
    );
}

/// SDPA on CPU with and without `attn_mask`: each call goes to the kernel that takes exactly its
/// tensors; a kernel without a mask never takes (and drops) a mask.
#[test]
fn attention_mask_picks_the_masked_kernel_and_is_never_dropped() {
    let flash = |kwargs: Value| {
        graph(
            json!([
                {"name": "q", "type": "f32[2,4,5,8]"}, {"name": "k", "type": "f32[2,4,7,8]"},
                {"name": "v", "type": "f32[2,4,7,8]"}, {"name": "m", "type": "f32[5,7]"}
            ]),
            json!([{
                "name": "a", "op": "aten::_scaled_dot_product_flash_attention_for_cpu.default",
                "args": [t("q"), t("k"), t("v")], "kwargs": kwargs,
                "arg_names": ["query", "key", "value", "dropout_p", "is_causal", "attn_mask", "scale"],
                "outputs": ["f32[2,4,5,8]", "f32[2,4,5]"]
            }]),
            json!([{"node": "a"}]),
        )
    };
    let lowered = |g: &Graph, r: &RegisteredKernels| {
        graph::lower(g, r).unwrap_or_else(|e| panic!("{e}")).to_text()
    };
    let masked = flash(json!({"attn_mask": t("m")}));
    let plain = flash(json!({"attn_mask": "none"}));
    let all = RegisteredKernels::all();
    assert!(lowered(&masked, &all).contains("call @sdpa_flash_cpu_masked("));
    let text = lowered(&plain, &all);
    assert!(text.contains("call @sdpa_flash_cpu(") && !text.contains("masked"), "{text}");
    // Only the kernel without a mask: the masked call is the table's, not that kernel's.
    let unmasked_only = RegisteredKernels::only(&["sdpa_flash_cpu"]);
    let call = OpCall::new(&masked, &masked.nodes[0]);
    let err = RegisteredKernels::bind(unmasked_only.kernels()[0], &call).expect_err("mask");
    assert!(err.contains("`attn_mask` is a tensor the kernel does not take"), "{err}");
    assert!(!lowered(&masked, &unmasked_only).contains("call @"));
}

/// `native_layer_norm_backward`: the kernel computes all three gradients, so it takes a node only
/// when its `output_mask` asks for all three; a `ScalarType` argument binds to a str static.
#[test]
fn output_masks_and_dtype_arguments_bind_as_the_kernels_expect() {
    let ln = |mask: Value, outputs: Value| {
        graph(
            json!([
                {"name": "g", "type": "f32[4,8]"}, {"name": "x", "type": "f32[4,8]"},
                {"name": "m", "type": "f32[4,1]"}, {"name": "r", "type": "f32[4,1]"},
                {"name": "w", "type": "f32[8]"}, {"name": "b", "type": "f32[8]"}
            ]),
            json!([{
                "name": "d", "op": "aten::native_layer_norm_backward.default",
                "args": [t("g"), t("x"), {"int_list": [8]}, t("m"), t("r"), t("w"), t("b"), mask],
                "arg_names": ["grad_out", "input", "normalized_shape", "mean", "rstd", "weight",
                              "bias", "output_mask"],
                "outputs": outputs
            }]),
            json!([{"node": "d", "output": 0}]),
        )
    };
    let three = json!(["f32[4,8]", "f32[8]", "f32[8]"]);
    let kernels = RegisteredKernels::only(&["layer_norm_backward"]);
    let k = kernels.kernels()[0];
    let all = ln(json!({"bool_list": [true, true, true]}), three.clone());
    RegisteredKernels::bind(k, &OpCall::new(&all, &all.nodes[0])).expect("all three asked for");
    // Leaving an output out is fine while the node declares every output's type.
    let some = ln(json!({"bool_list": [false, true, true]}), three);
    RegisteredKernels::bind(k, &OpCall::new(&some, &some.nodes[0])).expect("all declared");
    let short = ln(json!({"bool_list": [true, false, false]}), json!(["f32[4,8]"]));
    let err =
        RegisteredKernels::bind(k, &OpCall::new(&short, &short.nodes[0])).expect_err("1 of 3");
    assert!(err.contains("`output_mask` is [true, false, false] and the node declares 1"), "{err}");

    let softmax_bwd = graph(
        json!([{"name": "g", "type": "bf16[4,8]"}, {"name": "y", "type": "bf16[4,8]"}]),
        json!([{
            "name": "d", "op": "aten::_softmax_backward_data.default",
            "args": [t("g"), t("y"), {"int": -1}, {"dtype": "bfloat16"}],
            "arg_names": ["grad_output", "output", "dim", "input_dtype"],
            "outputs": ["bf16[4,8]"]
        }]),
        json!([{"node": "d"}]),
    );
    let text = graph::lower(&softmax_bwd, &RegisteredKernels::all())
        .unwrap_or_else(|e| panic!("{e}"))
        .to_text();
    assert!(text.contains("call @softmax_backward("), "{text}");
}

// ----- pattern fusion: decomposed RMSNorm and matmul + activation chains become the kernels' ops
// when nothing else reads their intermediates, and stay as they are otherwise -----

/// `F.rms_norm(x, [32], w, eps)` as aot_autograd's inference graph has it; `extra_outputs` also
/// returns intermediates (as a training graph saves `rsqrt` for the backward).
fn rms_graph(square_by_mul: bool, extra_outputs: &[&str]) -> Graph {
    let square = if square_by_mul {
        json!({"name": "sq", "op": "aten::mul.Tensor", "args": [t("x"), t("x")], "outputs": ["f32[2,8,32]"]})
    } else {
        json!({"name": "sq", "op": "aten::pow.Tensor_Scalar", "args": [t("x"), {"int": 2}], "outputs": ["f32[2,8,32]"]})
    };
    let mut outputs = vec![json!({"node": "out"})];
    outputs.extend(extra_outputs.iter().map(|n| json!({"node": n})));
    graph(
        json!([{"name": "x", "type": "f32[2,8,32]"}, {"name": "w", "type": "f32[32]"}]),
        json!([
            square,
            {"name": "mean", "op": "aten::mean.dim", "args": [t("sq"), {"int_list": [-1]}, {"bool": true}],
             "outputs": ["f32[2,8,1]"]},
            {"name": "add", "op": "aten::add.Scalar", "args": [t("mean"), {"float": 1e-6}], "outputs": ["f32[2,8,1]"]},
            {"name": "r", "op": "aten::rsqrt.default", "args": [t("add")], "outputs": ["f32[2,8,1]"]},
            {"name": "n", "op": "aten::mul.Tensor", "args": [t("x"), t("r")], "outputs": ["f32[2,8,32]"]},
            {"name": "out", "op": "aten::mul.Tensor", "args": [t("w"), t("n")], "outputs": ["f32[2,8,32]"]}
        ]),
        Value::Array(outputs),
    )
}

#[test]
fn decomposed_rms_norm_becomes_the_kernel() {
    for by_mul in [false, true] {
        let g = rms_graph(by_mul, &[]);
        let (fused, fusions) = fuse(&g, &RegisteredKernels::all());
        assert_eq!(fusions.len(), 1, "{fusions:?}");
        assert_eq!(fusions[0].op, "tpuk::rms_norm.default");
        assert_eq!(fusions[0].replaced, ["sq", "mean", "add", "r", "n", "out"]);
        assert_eq!(fused.nodes.len(), 1);
        let text =
            graph::lower(&g, &RegisteredKernels::all()).unwrap_or_else(|e| panic!("{e}")).to_text();
        assert!(text.contains("call @rms_norm("), "{text}");
        assert!(text.contains("dense<9.9999999") || text.contains("dense<1.0"), "{text}");
    }
}

#[test]
fn a_chain_whose_intermediates_are_read_elsewhere_is_left_alone() {
    let g = rms_graph(false, &["r"]);
    let (fused, fusions) = fuse(&g, &RegisteredKernels::all());
    assert!(fusions.is_empty(), "{fusions:?}");
    assert_eq!(fused, g);
    // And without a kernel for the fused op, nothing changes either.
    let (_, none) = fuse(&rms_graph(false, &[]), &NoKernels);
    assert!(none.is_empty());
}

/// `act(view(addmm(b, x, permute(w))))` and `gelu_tanh(mm(x, permute(w)))`.
fn linear_graph(op: &str, act: &str, approximate: Option<&str>, beta: Option<f64>) -> Graph {
    let mut mm = if op == "addmm" {
        json!({"name": "mm", "op": "aten::addmm.default", "args": [t("b"), t("x"), t("wt")], "outputs": ["f32[16,64]"]})
    } else {
        json!({"name": "mm", "op": "aten::mm.default", "args": [t("x"), t("wt")], "outputs": ["f32[16,64]"]})
    };
    if let Some(beta) = beta {
        mm["kwargs"] = json!({"beta": {"float": beta}});
    }
    let mut act = json!({"name": "act", "op": act, "args": [t("v")], "outputs": ["f32[2,8,64]"]});
    if let Some(a) = approximate {
        act["kwargs"] = json!({"approximate": {"string": a}});
    }
    graph(
        json!([
            {"name": "x", "type": "f32[16,32]"}, {"name": "w", "type": "f32[64,32]"},
            {"name": "b", "type": "f32[64]"}
        ]),
        json!([
            {"name": "wt", "op": "aten::permute.default", "args": [t("w"), {"int_list": [1, 0]}],
             "outputs": ["f32[32,64]"]},
            mm,
            {"name": "v", "op": "aten::view.default", "args": [t("mm"), {"int_list": [2, 8, 64]}],
             "outputs": ["f32[2,8,64]"]},
            act
        ]),
        json!([{"node": "act"}]),
    )
}

#[test]
fn matmul_with_an_activation_becomes_the_epilogue_kernel() {
    let cases = [
        ("addmm", "aten::gelu.default", None, "tpuk::matmul_bias_act.default", "gelu"),
        ("addmm", "aten::silu.default", None, "tpuk::matmul_bias_act.default", "silu"),
        ("addmm", "aten::relu.default", None, "tpuk::matmul_bias_act.default", "relu"),
        ("mm", "aten::gelu.default", Some("tanh"), "tpuk::matmul_act.default", "gelu_tanh"),
    ];
    for (mm, act, approximate, op, activation) in cases {
        let g = linear_graph(mm, act, approximate, None);
        let (fused, fusions) = fuse(&g, &RegisteredKernels::all());
        assert_eq!(fusions.len(), 1, "{mm} {act}: {fusions:?}");
        assert_eq!(fusions[0].op, op);
        let node = fused.nodes.iter().find(|n| n.name == "mm").expect("fused node");
        assert_eq!(node.kwargs["activation"], graph::Arg::String(activation.to_owned()));
        let alias = fused.nodes.iter().find(|n| n.name == "act").expect("activation node");
        assert_eq!(alias.op, "aten::alias.default");
        let text =
            graph::lower(&g, &RegisteredKernels::all()).unwrap_or_else(|e| panic!("{e}")).to_text();
        let kernel = op.trim_start_matches("tpuk::").trim_end_matches(".default");
        assert!(text.contains(&format!("call @{kernel}(")), "{text}");
    }
    // beta != 1 is not the kernel's computation; gelu with an unknown approximation neither.
    for g in [
        linear_graph("addmm", "aten::gelu.default", None, Some(2.0)),
        linear_graph("addmm", "aten::gelu.default", Some("erf"), None),
    ] {
        assert!(fuse(&g, &RegisteredKernels::all()).1.is_empty());
    }
}
