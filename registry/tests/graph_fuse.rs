//! Pattern fusion before lowering: decomposed RMSNorm and matmul + activation chains become the
//! registered kernels' ops when nothing else reads their intermediates, and stay as they are
//! otherwise (or when no kernel takes the fused node).

use serde_json::{Value, json};
use tpu_kernels_registry::graph::{self, Graph, NoKernels, RegisteredKernels, fuse};

fn graph(inputs: Value, nodes: Value, outputs: Value) -> Graph {
    let text =
        json!({"version": 1, "name": "g", "inputs": inputs, "nodes": nodes, "outputs": outputs})
            .to_string();
    Graph::from_json(&text).unwrap_or_else(|e| panic!("{e}"))
}

fn t(name: &str) -> Value {
    json!({"tensor": {"node": name}})
}

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
