//! Pattern fusion before lowering: chains of ATen ops that one registered kernel computes are
//! replaced by a node of that kernel's op, when a kernel takes the new node.
//!
//! - RMSNorm as `torch.compile` decomposes it (`F.rms_norm`, or written out):
//!   `pow(x, 2)` (or `x * x`) -> `mean(-1, keepdim)` -> `+ eps` -> `rsqrt` -> `x * r` -> `* w`
//!   becomes `tpuk::rms_norm(x, w, eps)`.
//! - A matmul with its epilogue: `addmm(b, x, w)` (`beta = alpha = 1`) or `mm(x, w)`, optionally
//!   through a `view`, then `gelu` (exact or tanh), `silu` or `relu`, becomes
//!   `tpuk::matmul_bias_act(x, w, b, activation)` or `tpuk::matmul_act(x, w, activation)`. The
//!   matmul node takes the fused op (under its own name, so a `view` of it stays valid) and the
//!   activation node becomes an `alias` of its input.
//!
//! A chain is fused only when its intermediate values have no other user (a training graph that
//! saves `rsqrt` for the backward keeps the decomposed ops) and the resolver binds the new node
//! to a kernel; otherwise the graph is left as it was. [`fuse`] reports each fusion.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::lower::{KernelResolver, OpCall};
use super::model::{Arg, Graph, Node, TensorRef};

/// One fused chain: the new node's name, its op, and the nodes it replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fusion {
    pub node: String,
    pub op: String,
    pub replaced: Vec<String>,
}

/// `graph` with every fusable chain fused, and what was fused.
pub fn fuse(graph: &Graph, resolver: &dyn KernelResolver) -> (Graph, Vec<Fusion>) {
    let mut g = graph.clone();
    let mut fusions = Vec::new();
    loop {
        let uses = use_counts(&g);
        let index: HashMap<&str, usize> =
            g.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
        let cx = Cx { g: &g, uses: &uses, index: &index };
        let found = g.nodes.iter().enumerate().find_map(|(i, n)| {
            let rewrite = rms_norm(&cx, n).or_else(|| matmul_epilogue(&cx, n))?;
            accepted(&g, resolver, &rewrite).then_some((i, rewrite))
        });
        let Some((_, rewrite)) = found else { break };
        fusions.push(Fusion {
            node: rewrite.fused.name.clone(),
            op: rewrite.fused.op.clone(),
            replaced: rewrite.replaced.clone(),
        });
        g = apply(g, rewrite);
    }
    (g, fusions)
}

/// A rewrite: nodes replaced by name, nodes removed.
#[derive(Clone)]
struct Rewrite {
    fused: Node,
    /// Other nodes replaced in place (the activation that becomes an alias).
    also: Vec<Node>,
    removed: Vec<String>,
    /// The nodes whose work the fused node now does (for the report).
    replaced: Vec<String>,
}

fn accepted(g: &Graph, resolver: &dyn KernelResolver, r: &Rewrite) -> bool {
    // The fused node's tensors are all defined before the node it replaces, so the graph with
    // the rewrite applied is valid; the resolver needs the new node inside a graph.
    let probe = apply(g.clone(), r.clone());
    let Some(node) = probe.nodes.iter().find(|n| n.name == r.fused.name) else { return false };
    probe.validate().is_ok() && resolver.resolve(&OpCall::new(&probe, node)).is_some()
}

fn apply(mut g: Graph, r: Rewrite) -> Graph {
    let removed: HashSet<&str> = r.removed.iter().map(String::as_str).collect();
    let mut replace: BTreeMap<String, Node> = BTreeMap::new();
    replace.insert(r.fused.name.clone(), r.fused);
    for n in r.also {
        replace.insert(n.name.clone(), n);
    }
    g.nodes = g
        .nodes
        .into_iter()
        .filter(|n| !removed.contains(n.name.as_str()))
        .map(|n| replace.remove(&n.name).unwrap_or(n))
        .collect();
    g
}

/// How many times each node's outputs are read (by nodes and by the graph's outputs).
fn use_counts(g: &Graph) -> HashMap<String, usize> {
    let mut uses: HashMap<String, usize> = HashMap::new();
    let refs =
        g.nodes.iter().flat_map(|n| n.args.iter().chain(n.kwargs.values())).flat_map(Arg::refs);
    for r in refs.chain(g.outputs.iter().flatten()) {
        *uses.entry(r.node.clone()).or_default() += 1;
    }
    uses
}

struct Cx<'g> {
    g: &'g Graph,
    uses: &'g HashMap<String, usize>,
    index: &'g HashMap<&'g str, usize>,
}

impl<'g> Cx<'g> {
    /// The node producing `r` when it is a single-output node of op `op` read only once.
    fn only_use(&self, r: &TensorRef, ops: &[&str]) -> Option<&'g Node> {
        let node = &self.g.nodes[*self.index.get(r.node.as_str())?];
        let single = r.output == 0 && node.outputs.len() == 1;
        (single && ops.contains(&node.op.as_str()) && self.uses.get(&node.name) == Some(&1))
            .then_some(node)
    }

    fn rank(&self, r: &TensorRef) -> Option<usize> {
        self.g.type_of(r).map(|t| t.rank())
    }
}

fn tensor(a: Option<&Arg>) -> Option<&TensorRef> {
    match a? {
        Arg::Tensor(r) => Some(r),
        _ => None,
    }
}

fn number(a: Option<&Arg>) -> Option<f64> {
    match a? {
        Arg::Float(v) => Some(*v),
        Arg::Int(v) => Some(*v as f64),
        _ => None,
    }
}

/// A keyword or positional argument `name` at `position` is absent or equal to `value`.
fn default_or(n: &Node, name: &str, position: usize, value: f64) -> bool {
    match n.kwargs.get(name).or_else(|| n.args.get(position)) {
        None | Some(Arg::None) => true,
        a => number(a) == Some(value),
    }
}

/// The two tensor operands of a `mul.Tensor` node.
fn mul_operands(n: &Node) -> Option<(&TensorRef, &TensorRef)> {
    (n.op == "aten::mul.Tensor" && n.kwargs.is_empty() && n.args.len() == 2)
        .then(|| Some((tensor(n.args.first())?, tensor(n.args.get(1))?)))?
}

/// `mul(mul(x, rsqrt(add(mean(pow(x, 2), [-1], keepdim), eps))), w)`, either operand order at
/// each `mul`.
fn rms_norm(cx: &Cx<'_>, out: &Node) -> Option<Rewrite> {
    let (a, b) = mul_operands(out)?;
    let mul = ["aten::mul.Tensor"];
    let (normed_node, w) = match cx.only_use(a, &mul) {
        Some(n) => (n, b),
        None => (cx.only_use(b, &mul)?, a),
    };
    let (p, q) = mul_operands(normed_node)?;
    let rsqrt_ops = ["aten::rsqrt.default"];
    let (x, r_node) = match cx.only_use(q, &rsqrt_ops) {
        Some(r) => (p, r),
        None => (q, cx.only_use(p, &rsqrt_ops)?),
    };
    let add =
        cx.only_use(tensor(r_node.args.first())?, &["aten::add.Scalar", "aten::add.Tensor"])?;
    let eps = number(add.args.get(1))?;
    if !default_or(add, "alpha", 2, 1.0) {
        return None;
    }
    let mean = cx.only_use(tensor(add.args.first())?, &["aten::mean.dim"])?;
    let rank = cx.rank(x)?;
    let last_dim = match mean.args.get(1)? {
        Arg::IntList(d) if d.len() == 1 => d[0] == -1 || d[0] == rank as i64 - 1,
        _ => false,
    };
    let keepdim = matches!(mean.kwargs.get("keepdim").or(mean.args.get(2)), Some(Arg::Bool(true)));
    let no_dtype = matches!(mean.kwargs.get("dtype").or(mean.args.get(3)), None | Some(Arg::None));
    if !(last_dim && keepdim && no_dtype) {
        return None;
    }
    let square =
        cx.only_use(tensor(mean.args.first())?, &["aten::pow.Tensor_Scalar", "aten::mul.Tensor"])?;
    let squares_x = match square.op.as_str() {
        "aten::pow.Tensor_Scalar" => {
            tensor(square.args.first()) == Some(x) && number(square.args.get(1)) == Some(2.0)
        }
        _ => mul_operands(square) == Some((x, x)),
    };
    if !squares_x || cx.rank(w)? != 1 {
        return None;
    }
    let fused = Node {
        name: out.name.clone(),
        op: "tpuk::rms_norm.default".to_owned(),
        args: vec![Arg::Tensor(x.clone()), Arg::Tensor(w.clone())],
        kwargs: [("eps".to_owned(), Arg::Float(eps))].into_iter().collect(),
        arg_names: vec!["x".to_owned(), "weight".to_owned(), "eps".to_owned()],
        outputs: out.outputs.clone(),
    };
    let removed: Vec<String> =
        [square, mean, add, r_node, normed_node].iter().map(|n| n.name.clone()).collect();
    let mut replaced = removed.clone();
    replaced.push(out.name.clone());
    Some(Rewrite { fused, also: Vec::new(), removed, replaced })
}

/// `act(addmm(b, x, w))` or `act(mm(x, w))`, optionally `act(view(...))`.
fn matmul_epilogue(cx: &Cx<'_>, act: &Node) -> Option<Rewrite> {
    let activation = match act.op.as_str() {
        "aten::relu.default" => "relu",
        "aten::silu.default" => "silu",
        "aten::gelu.default" => match act.kwargs.get("approximate").or(act.args.get(1)) {
            None => "gelu",
            Some(Arg::String(s)) if s == "none" => "gelu",
            Some(Arg::String(s)) if s == "tanh" => "gelu_tanh",
            _ => return None,
        },
        _ => return None,
    };
    let input = tensor(act.args.first())?;
    let matmuls = ["aten::addmm.default", "aten::mm.default"];
    let (mm, view) = match cx.only_use(input, &matmuls) {
        Some(m) => (m, None),
        None => {
            let view = cx.only_use(input, &["aten::view.default", "aten::_unsafe_view.default"])?;
            (cx.only_use(tensor(view.args.first())?, &matmuls)?, Some(view))
        }
    };
    let name = |s: &str| s.to_owned();
    let (op, args, arg_names) = if mm.op == "aten::addmm.default" {
        if !(default_or(mm, "beta", 3, 1.0) && default_or(mm, "alpha", 4, 1.0)) {
            return None;
        }
        let (b, x, w) =
            (tensor(mm.args.first())?, tensor(mm.args.get(1))?, tensor(mm.args.get(2))?);
        let args = vec![Arg::Tensor(x.clone()), Arg::Tensor(w.clone()), Arg::Tensor(b.clone())];
        (
            "tpuk::matmul_bias_act.default",
            args,
            vec![name("x"), name("weight"), name("bias"), name("activation")],
        )
    } else {
        let (x, w) = (tensor(mm.args.first())?, tensor(mm.args.get(1))?);
        let args = vec![Arg::Tensor(x.clone()), Arg::Tensor(w.clone())];
        ("tpuk::matmul_act.default", args, vec![name("x"), name("weight"), name("activation")])
    };
    let fused = Node {
        name: mm.name.clone(),
        op: op.to_owned(),
        args,
        kwargs: [("activation".to_owned(), Arg::String(activation.to_owned()))]
            .into_iter()
            .collect(),
        arg_names,
        outputs: mm.outputs.clone(),
    };
    let source =
        view.map_or_else(|| TensorRef::new(mm.name.clone()), |v| TensorRef::new(v.name.clone()));
    let alias = Node {
        name: act.name.clone(),
        op: "aten::alias.default".to_owned(),
        args: vec![Arg::Tensor(source)],
        kwargs: BTreeMap::new(),
        arg_names: vec![name("self")],
        outputs: act.outputs.clone(),
    };
    let replaced = vec![mm.name.clone(), act.name.clone()];
    Some(Rewrite { fused, also: vec![alias], removed: Vec::new(), replaced })
}
