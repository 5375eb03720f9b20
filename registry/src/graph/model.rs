//! The graph description itself: its types, their JSON form, parsing and validation.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{self, Deserializer};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use tpu_kernels::{DType, TensorType};

/// The format version this crate reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// A whole ATen graph: inputs, nodes in execution order, outputs. See the [module docs](super)
/// for the JSON format.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Graph {
    pub version: u32,
    /// The graph's name; the lowered module is named after it (`graph` when empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub inputs: Vec<Input>,
    pub nodes: Vec<Node>,
    /// What the graph returns; `null` stands for a Python `None` output (e.g. the gradient of an
    /// integer input) and is not returned by the lowered module.
    pub outputs: Vec<Option<TensorRef>>,
}

/// A graph input (an FX placeholder).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    pub name: String,
    #[serde(rename = "type", with = "short_type")]
    pub ty: TensorType,
}

/// One ATen op call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// Unique among inputs and nodes.
    pub name: String,
    /// The op overload exactly as PyTorch names it: `func._schema.name + "." +
    /// func._overloadname` (`aten::mm.default`, `aten::add.Tensor`).
    pub op: String,
    /// Positional arguments.
    #[serde(default)]
    pub args: Vec<Arg>,
    /// Keyword arguments by schema name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kwargs: BTreeMap<String, Arg>,
    /// The schema's argument names in order (`func._schema.arguments`), so positional arguments
    /// can be looked up by name. Optional.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arg_names: Vec<String>,
    /// The type of each output, in order.
    #[serde(with = "short_types")]
    pub outputs: Vec<TensorType>,
}

/// A tensor: an input, or output `output` of a node (0 for single-output nodes; a multi-output
/// node's outputs are what FX reaches through `getitem`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorRef {
    pub node: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub output: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl TensorRef {
    pub fn new(node: impl Into<String>) -> TensorRef {
        TensorRef { node: node.into(), output: 0 }
    }

    pub fn output(node: impl Into<String>, output: usize) -> TensorRef {
        TensorRef { node: node.into(), output }
    }
}

impl fmt::Display for TensorRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.output == 0 {
            write!(f, "`{}`", self.node)
        } else {
            write!(f, "`{}`[{}]", self.node, self.output)
        }
    }
}

/// One argument of a node. JSON: externally tagged in snake case (`{"int": 3}`,
/// `{"tensor": {"node": "mm"}}`, `"none"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arg {
    Tensor(TensorRef),
    /// A list of tensors; `null` entries are `None` (as in `index_put`'s `Tensor?[] indices`).
    TensorList(Vec<Option<TensorRef>>),
    Int(i64),
    /// A float; JSON has no infinities or NaN, so those are the strings `"inf"`, `"-inf"`,
    /// `"nan"`.
    Float(#[serde(with = "json_f64")] f64),
    Bool(bool),
    None,
    IntList(Vec<i64>),
    FloatList(#[serde(with = "json_f64_list")] Vec<f64>),
    BoolList(Vec<bool>),
    String(String),
    /// A torch dtype by its torch name, without `torch.` (`float32`, `int64`, `bool`).
    Dtype(String),
    /// A torch device (`cpu`); lowering ignores it.
    Device(String),
    /// A torch layout (`strided`); lowering ignores it.
    Layout(String),
    /// A torch memory format (`preserve_format`); lowering ignores it.
    MemoryFormat(String),
}

impl Arg {
    /// The kind, as error messages name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Arg::Tensor(_) => "tensor",
            Arg::TensorList(_) => "tensor list",
            Arg::Int(_) => "int",
            Arg::Float(_) => "float",
            Arg::Bool(_) => "bool",
            Arg::None => "none",
            Arg::IntList(_) => "int list",
            Arg::FloatList(_) => "float list",
            Arg::BoolList(_) => "bool list",
            Arg::String(_) => "string",
            Arg::Dtype(_) => "dtype",
            Arg::Device(_) => "device",
            Arg::Layout(_) => "layout",
            Arg::MemoryFormat(_) => "memory format",
        }
    }

    /// Every tensor this argument references.
    pub fn refs(&self) -> Vec<&TensorRef> {
        match self {
            Arg::Tensor(r) => vec![r],
            Arg::TensorList(rs) => rs.iter().flatten().collect(),
            _ => Vec::new(),
        }
    }
}

/// The element type a torch dtype name stands for (`float32` -> `f32`).
pub fn dtype_from_torch(name: &str) -> Option<DType> {
    let name = name.strip_prefix("torch.").unwrap_or(name);
    Some(match name {
        "float32" | "float" => DType::F32,
        "float64" | "double" => DType::F64,
        "bfloat16" => DType::BF16,
        "float16" | "half" => DType::F16,
        "int8" => DType::I8,
        "int16" | "short" => DType::I16,
        "int32" | "int" => DType::I32,
        "int64" | "long" => DType::I64,
        "uint8" => DType::U8,
        "uint32" => DType::U32,
        "bool" => DType::Bool,
        "float8_e4m3fn" => DType::F8E4M3FN,
        "float8_e5m2" => DType::F8E5M2,
        _ => return None,
    })
}

/// Why a graph description was rejected. Every error about a node names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// The text is not JSON, or its top level is not a graph.
    #[error("graph JSON, line {line} column {column}: {message}")]
    Json { line: usize, column: usize, message: String },
    #[error("graph format version {found} is not supported (this build reads version {supported})")]
    Version { found: u32, supported: u32 },
    /// A node (or input) that does not have the shape the format asks for.
    #[error("graph node `{node}` (#{index}): {message}")]
    BadNode { node: String, index: usize, message: String },
    /// An input `type` that does not parse.
    #[error("graph input `{input}`: {message}")]
    BadInput { input: String, message: String },
    #[error("graph name `{name}` is defined twice")]
    DuplicateName { name: String },
    /// A reference to a name that no earlier input or node defines.
    #[error("graph node `{node}`: {reference} is not an input or an earlier node")]
    DanglingRef { node: String, reference: String },
    /// A reference to an output index the node does not have.
    #[error(
        "graph node `{node}`: {reference} refers to output {index}, but `{target}` has {count}"
    )]
    NoSuchOutput { node: String, reference: String, target: String, index: usize, count: usize },
}

impl Graph {
    /// Parses and validates a graph. Errors name the node at fault.
    pub fn from_json(text: &str) -> Result<Graph, GraphError> {
        let raw: RawGraph = serde_json::from_str(text).map_err(|e| GraphError::Json {
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
        if raw.version != FORMAT_VERSION {
            return Err(GraphError::Version { found: raw.version, supported: FORMAT_VERSION });
        }
        let mut inputs = Vec::with_capacity(raw.inputs.len());
        for (index, value) in raw.inputs.into_iter().enumerate() {
            let name = value_name(&value, index, "input");
            let input: Input = serde_json::from_value(value)
                .map_err(|e| GraphError::BadInput { input: name, message: e.to_string() })?;
            inputs.push(input);
        }
        let mut nodes = Vec::with_capacity(raw.nodes.len());
        for (index, value) in raw.nodes.into_iter().enumerate() {
            let name = value_name(&value, index, "node");
            let node: Node = serde_json::from_value(value).map_err(|e| GraphError::BadNode {
                node: name,
                index,
                message: e.to_string(),
            })?;
            nodes.push(node);
        }
        let graph =
            Graph { version: raw.version, name: raw.name, inputs, nodes, outputs: raw.outputs };
        graph.validate()?;
        Ok(graph)
    }

    /// The graph as pretty JSON (the format [`Graph::from_json`] reads).
    pub fn to_json(&self) -> String {
        // Serialising these types cannot fail: every map key is a string.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks names are unique, every reference names an earlier input or node and an output it
    /// has, and every node has an op and at least one output.
    pub fn validate(&self) -> Result<(), GraphError> {
        if self.version != FORMAT_VERSION {
            return Err(GraphError::Version { found: self.version, supported: FORMAT_VERSION });
        }
        let mut outputs: BTreeMap<&str, usize> = BTreeMap::new();
        for input in &self.inputs {
            if outputs.insert(&input.name, 1).is_some() {
                return Err(GraphError::DuplicateName { name: input.name.clone() });
            }
        }
        let check = |node: &str, r: &TensorRef, outputs: &BTreeMap<&str, usize>| match outputs
            .get(r.node.as_str())
        {
            None => {
                Err(GraphError::DanglingRef { node: node.to_owned(), reference: r.to_string() })
            }
            Some(&count) if r.output >= count => Err(GraphError::NoSuchOutput {
                node: node.to_owned(),
                reference: r.to_string(),
                target: r.node.clone(),
                index: r.output,
                count,
            }),
            Some(_) => Ok(()),
        };
        for (index, node) in self.nodes.iter().enumerate() {
            let bad =
                |message: String| GraphError::BadNode { node: node.name.clone(), index, message };
            if node.name.is_empty() {
                return Err(bad("empty node name".to_owned()));
            }
            if !node.op.contains("::") {
                return Err(bad(format!("op `{}` is not `namespace::name.overload`", node.op)));
            }
            if node.outputs.is_empty() {
                return Err(bad("a node needs at least one output type".to_owned()));
            }
            for arg in node.args.iter().chain(node.kwargs.values()) {
                for r in arg.refs() {
                    check(&node.name, r, &outputs)?;
                }
            }
            if outputs.insert(&node.name, node.outputs.len()).is_some() {
                return Err(GraphError::DuplicateName { name: node.name.clone() });
            }
        }
        for r in self.outputs.iter().flatten() {
            check("<outputs>", r, &outputs)?;
        }
        Ok(())
    }

    /// The type of a reference, once the graph is valid.
    pub fn type_of(&self, r: &TensorRef) -> Option<&TensorType> {
        if let Some(input) = self.inputs.iter().find(|i| i.name == r.node) {
            return (r.output == 0).then_some(&input.ty);
        }
        self.nodes.iter().find(|n| n.name == r.node)?.outputs.get(r.output)
    }

    /// The sorted, deduplicated op overloads the graph calls.
    pub fn ops(&self) -> Vec<&str> {
        let set: BTreeSet<&str> = self.nodes.iter().map(|n| n.op.as_str()).collect();
        set.into_iter().collect()
    }
}

/// The top level, with inputs and nodes kept as raw JSON so that each one's error can name it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGraph {
    version: u32,
    #[serde(default)]
    name: String,
    inputs: Vec<serde_json::Value>,
    nodes: Vec<serde_json::Value>,
    outputs: Vec<Option<TensorRef>>,
}

fn value_name(value: &serde_json::Value, index: usize, what: &str) -> String {
    match value.get("name").and_then(serde_json::Value::as_str) {
        Some(name) => name.to_owned(),
        None => format!("<{what} #{index}>"),
    }
}

/// `TensorType` as its short spelling, `f32[8,128]`.
mod short_type {
    use super::*;

    pub(super) fn serialize<S: Serializer>(ty: &TensorType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&ty.short())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<TensorType, D::Error> {
        let text = String::deserialize(d)?;
        TensorType::parse_short(&text).map_err(de::Error::custom)
    }
}

mod short_types {
    use super::*;

    pub(super) fn serialize<S: Serializer>(tys: &[TensorType], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(tys.iter().map(TensorType::short))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<TensorType>, D::Error> {
        let texts = Vec::<String>::deserialize(d)?;
        texts.iter().map(|t| TensorType::parse_short(t).map_err(de::Error::custom)).collect()
    }
}

/// A JSON number, or `"inf"`, `"-inf"`, `"nan"`.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum F64Repr {
    Number(f64),
    Text(String),
}

impl F64Repr {
    fn from_f64(x: f64) -> F64Repr {
        if x.is_nan() {
            F64Repr::Text("nan".to_owned())
        } else if x.is_infinite() {
            F64Repr::Text(if x > 0.0 { "inf" } else { "-inf" }.to_owned())
        } else {
            F64Repr::Number(x)
        }
    }

    fn to_f64(&self) -> Result<f64, String> {
        match self {
            F64Repr::Number(x) => Ok(*x),
            F64Repr::Text(t) => match t.as_str() {
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                "nan" => Ok(f64::NAN),
                other => Err(format!("`{other}` is not a number (or \"inf\", \"-inf\", \"nan\")")),
            },
        }
    }
}

mod json_f64 {
    use super::*;

    pub(super) fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        F64Repr::from_f64(*x).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        F64Repr::deserialize(d)?.to_f64().map_err(de::Error::custom)
    }
}

mod json_f64_list {
    use super::*;

    pub(super) fn serialize<S: Serializer>(xs: &[f64], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(xs.iter().map(|x| F64Repr::from_f64(*x)))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        let reprs = Vec::<F64Repr>::deserialize(d)?;
        reprs.iter().map(|r| r.to_f64().map_err(de::Error::custom)).collect()
    }
}
