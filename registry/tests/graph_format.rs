//! The graph JSON format: what parses, what round-trips, and the typed error each malformed
//! description earns (naming the node at fault).

use serde_json::{Value, json};
use tpu_kernels::{DType, TensorType};
use tpu_kernels_registry::graph::{
    Arg, FORMAT_VERSION, Graph, GraphError, TensorRef, dtype_from_torch,
};

fn parse(v: Value) -> Result<Graph, GraphError> {
    Graph::from_json(&v.to_string())
}

fn with_nodes(nodes: Value, outputs: Value) -> Value {
    json!({"version": 1, "inputs": [{"name": "x", "type": "f32[2,3]"}], "nodes": nodes, "outputs": outputs})
}

fn t(name: &str) -> Value {
    json!({"tensor": {"node": name}})
}

#[test]
fn every_argument_kind_parses_and_round_trips() {
    let v = json!({
        "version": 1,
        "name": "kinds",
        "inputs": [{"name": "x", "type": "f32[2,3]"}, {"name": "i", "type": "i64[]"}],
        "nodes": [
            {"name": "n", "op": "aten::demo.default",
             "args": [
                t("x"),
                {"tensor_list": [{"node": "x"}, null, {"node": "i"}]},
                {"int": -3}, {"float": 0.25}, {"float": "-inf"}, {"float": "nan"}, {"bool": true}, "none",
                {"int_list": [1, -1]}, {"float_list": [0.5, "inf"]}, {"bool_list": [true, false]},
                {"string": "tanh"}, {"dtype": "bfloat16"}
             ],
             "kwargs": {"device": {"device": "cpu"}, "layout": {"layout": "strided"},
                        "memory_format": {"memory_format": "preserve_format"}},
             "arg_names": ["a"],
             "outputs": ["f32[2,3]", "bool[]"]}
        ],
        "outputs": [{"node": "n", "output": 1}, null, {"node": "n"}]
    });
    let g = parse(v).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(g.version, FORMAT_VERSION);
    let n = &g.nodes[0];
    assert_eq!(n.args.len(), 13);
    assert_eq!(
        n.args[1],
        Arg::TensorList(vec![Some(TensorRef::new("x")), None, Some(TensorRef::new("i"))])
    );
    assert_eq!(n.args[4], Arg::Float(f64::NEG_INFINITY));
    assert!(matches!(n.args[5], Arg::Float(f) if f.is_nan()));
    assert_eq!(n.args[7], Arg::None);
    assert_eq!(n.args[9], Arg::FloatList(vec![0.5, f64::INFINITY]));
    assert_eq!(n.outputs, [TensorType::new(DType::F32, [2, 3]), TensorType::scalar(DType::Bool)]);
    assert_eq!(g.outputs[0], Some(TensorRef::output("n", 1)));
    assert_eq!(g.type_of(&TensorRef::output("n", 1)), Some(&TensorType::scalar(DType::Bool)));
    // Round trip (NaN compares unequal, so compare the re-serialised text).
    let again = Graph::from_json(&g.to_json()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.to_json(), g.to_json());
    assert!(g.to_json().contains("\"-inf\""));
}

#[test]
fn torch_dtype_names_map_to_element_types() {
    assert_eq!(dtype_from_torch("float32"), Some(DType::F32));
    assert_eq!(dtype_from_torch("torch.bfloat16"), Some(DType::BF16));
    assert_eq!(dtype_from_torch("int64"), Some(DType::I64));
    assert_eq!(dtype_from_torch("bool"), Some(DType::Bool));
    assert_eq!(dtype_from_torch("complex64"), None);
}

#[test]
fn malformed_json_reports_line_and_column() {
    let err = Graph::from_json("{\"version\": 1,\n \"inputs\": [,]}").unwrap_err();
    assert!(matches!(err, GraphError::Json { line: 2, .. }), "{err:?}");
    let err = Graph::from_json(
        "{\"version\": 1, \"inputs\": [], \"nodes\": [], \"outputs\": [], \"extra\": 1}",
    )
    .unwrap_err();
    assert!(err.to_string().contains("unknown field `extra`"), "{err}");
}

#[test]
fn other_format_versions_are_rejected() {
    let err = parse(json!({"version": 2, "inputs": [], "nodes": [], "outputs": []})).unwrap_err();
    assert_eq!(err, GraphError::Version { found: 2, supported: 1 });
}

#[test]
fn malformed_nodes_are_named() {
    let cases = [
        (
            json!({"name": "mm", "args": [t("x")], "outputs": ["f32[2,3]"]}),
            "mm",
            "missing field `op`",
        ),
        (
            json!({"name": "mm", "op": "aten::mm.default", "args": [{"integer": 3}], "outputs": ["f32[2,3]"]}),
            "mm",
            "unknown variant `integer`",
        ),
        (
            json!({"name": "mm", "op": "aten::mm.default", "args": [{"int": "3"}], "outputs": ["f32[2,3]"]}),
            "mm",
            "invalid type: string",
        ),
        (
            json!({"name": "mm", "op": "aten::mm.default", "args": [{"float": "lots"}], "outputs": ["f32[2,3]"]}),
            "mm",
            "`lots` is not a number",
        ),
        (
            json!({"name": "mm", "op": "aten::mm.default", "args": [], "outputs": ["f33[2]"]}),
            "mm",
            "unknown dtype `f33`",
        ),
        (
            json!({"name": "mm", "op": "mm", "args": [], "outputs": ["f32[2]"]}),
            "mm",
            "is not `namespace::name.overload`",
        ),
        (
            json!({"name": "mm", "op": "aten::mm.default", "args": [], "outputs": []}),
            "mm",
            "at least one output",
        ),
        (
            json!({"op": "aten::mm.default", "outputs": ["f32[2]"]}),
            "<node #0>",
            "missing field `name`",
        ),
    ];
    for (node, name, message) in cases {
        let err = parse(with_nodes(json!([node]), json!([]))).unwrap_err();
        match &err {
            GraphError::BadNode { node, index: 0, message: m } => {
                assert_eq!(node, name, "{err}");
                assert!(m.contains(message), "`{m}` lacks `{message}`");
            }
            other => panic!("expected BadNode for {name}, got {other:?}"),
        }
        assert!(err.to_string().starts_with(&format!("graph node `{name}` (#0): ")), "{err}");
    }
    let err = parse(json!({"version": 1, "inputs": [{"name": "x", "type": "f32[2"}], "nodes": [], "outputs": []}))
        .unwrap_err();
    assert!(matches!(&err, GraphError::BadInput { input, .. } if input == "x"), "{err:?}");
}

#[test]
fn references_must_name_an_earlier_input_or_node_and_an_output_it_has() {
    let dangling = with_nodes(
        json!([{"name": "y", "op": "aten::neg.default", "args": [t("nowhere")], "outputs": ["f32[2,3]"]}]),
        json!([{"node": "y"}]),
    );
    let err = parse(dangling).unwrap_err();
    assert_eq!(err, GraphError::DanglingRef { node: "y".into(), reference: "`nowhere`".into() });
    assert_eq!(err.to_string(), "graph node `y`: `nowhere` is not an input or an earlier node");

    let later = with_nodes(
        json!([
            {"name": "a", "op": "aten::neg.default", "args": [t("b")], "outputs": ["f32[2,3]"]},
            {"name": "b", "op": "aten::neg.default", "args": [t("x")], "outputs": ["f32[2,3]"]}
        ]),
        json!([{"node": "a"}]),
    );
    assert!(
        matches!(parse(later).unwrap_err(), GraphError::DanglingRef { node, .. } if node == "a")
    );

    let in_list = with_nodes(
        json!([{"name": "c", "op": "aten::cat.default", "args": [{"tensor_list": [{"node": "x"}, {"node": "q"}]}], "outputs": ["f32[4,3]"]}]),
        json!([{"node": "c"}]),
    );
    assert!(
        matches!(parse(in_list).unwrap_err(), GraphError::DanglingRef { node, .. } if node == "c")
    );

    let output = with_nodes(
        json!([{"name": "s", "op": "aten::split.Tensor", "args": [t("x"), {"int": 1}], "outputs": ["f32[1,3]", "f32[1,3]"]},
               {"name": "n", "op": "aten::neg.default", "args": [{"tensor": {"node": "s", "output": 2}}], "outputs": ["f32[1,3]"]}]),
        json!([{"node": "n"}]),
    );
    let err = parse(output).unwrap_err();
    assert_eq!(err.to_string(), "graph node `n`: `s`[2] refers to output 2, but `s` has 2");

    let graph_output = with_nodes(json!([]), json!([{"node": "ghost"}]));
    assert!(
        matches!(parse(graph_output).unwrap_err(), GraphError::DanglingRef { node, .. } if node == "<outputs>")
    );

    let twice = with_nodes(
        json!([{"name": "x", "op": "aten::neg.default", "args": [t("x")], "outputs": ["f32[2,3]"]}]),
        json!([]),
    );
    assert_eq!(parse(twice).unwrap_err(), GraphError::DuplicateName { name: "x".into() });
}
