//! Lowering a [`Graph`] into one StableHLO module.

use std::collections::{BTreeMap, HashMap};

use tpu_kernels::ir::{Function, Op, Visibility};
use tpu_kernels::{BuildError, KernelBuilder, Module, Tensor, TensorType};

use super::model::{Arg, Graph, GraphError, Node, TensorRef};
use super::table::{self, Cx, Fail};

/// Chooses a registered kernel for a node, or declines so the default table lowers it.
pub trait KernelResolver {
    fn resolve(&self, call: &OpCall<'_>) -> Option<KernelCall>;
}

/// A node bound to a kernel: the kernel's module and the node's tensors it takes.
///
/// The module is inlined as a private function reached by `func.call`: its `@main` becomes a
/// function named after the module (renamed `name_1`, `name_2`, ... when two different modules
/// share a name). A module made only of text functions (an imported kernel) works when one of
/// them carries the module's name. Its results must have the node's output types.
#[derive(Clone, Debug)]
pub struct KernelCall {
    pub module: Module,
    /// The kernel's tensor arguments, in its parameter order; each one of the node's tensor
    /// arguments ([`OpCall::tensor_args`]).
    pub args: Vec<TensorRef>,
}

impl KernelCall {
    /// A call that passes the node's tensor arguments in [`OpCall::tensor_args`] order.
    pub fn in_order(module: Module, call: &OpCall<'_>) -> KernelCall {
        KernelCall { module, args: call.tensor_args().into_iter().cloned().collect() }
    }
}

/// The resolver that never picks a kernel: every node goes through the default table.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoKernels;

impl KernelResolver for NoKernels {
    fn resolve(&self, _call: &OpCall<'_>) -> Option<KernelCall> {
        None
    }
}

/// What a resolver sees of one node: its op, arguments and the types of its tensors.
#[derive(Clone, Debug)]
pub struct OpCall<'g> {
    pub node: &'g Node,
    /// The types of [`OpCall::tensor_args`], in that order.
    pub inputs: Vec<TensorType>,
}

impl<'g> OpCall<'g> {
    /// The call of `node` in `graph` (which must be valid).
    pub fn new(graph: &'g Graph, node: &'g Node) -> OpCall<'g> {
        let inputs = tensor_args(node).iter().filter_map(|r| graph.type_of(r).cloned()).collect();
        OpCall { node, inputs }
    }

    /// The op overload, `aten::gelu.default`.
    pub fn op(&self) -> &'g str {
        &self.node.op
    }

    /// The node's tensors in binding order: positional tensors and tensor-list entries in
    /// order, then keyword tensors by name.
    pub fn tensor_args(&self) -> Vec<&'g TensorRef> {
        tensor_args(self.node)
    }

    /// The argument named `name`: a keyword argument, or the positional argument the schema
    /// (`Node::arg_names`) puts under that name. `None` when it was not given.
    pub fn arg(&self, name: &str) -> Option<&'g Arg> {
        if let Some(a) = self.node.kwargs.get(name) {
            return Some(a);
        }
        let i = self.node.arg_names.iter().position(|n| n == name)?;
        self.node.args.get(i)
    }

    /// The non-tensor positional arguments, in order (for binding by position when the node
    /// carries no schema names).
    pub fn static_args(&self) -> Vec<&'g Arg> {
        self.node
            .args
            .iter()
            .filter(|a| !matches!(a, Arg::Tensor(_) | Arg::TensorList(_)))
            .collect()
    }

    /// The node's output types (the graph's metadata).
    pub fn outputs(&self) -> &'g [TensorType] {
        &self.node.outputs
    }
}

fn tensor_args(node: &Node) -> Vec<&TensorRef> {
    let positional = node.args.iter().flat_map(Arg::refs);
    positional.chain(node.kwargs.values().flat_map(Arg::refs)).collect()
}

/// Why a graph could not be lowered. Every error about a node names it and its op.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LowerError {
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// Ops neither a kernel nor the default table lowers: every such op of the graph, sorted and
    /// deduplicated, each with the first node that calls it.
    #[error("no lowering for {}", describe_unsupported(.ops, .nodes))]
    UnsupportedOp { ops: Vec<String>, nodes: Vec<String> },
    /// Arguments the op's lowering cannot take (wrong kind, missing, or a case it does not
    /// cover).
    #[error("node `{node}` ({op}): {message}")]
    BadArgs { node: String, op: String, message: String },
    /// A lowered result whose type differs from the node's output metadata.
    #[error(
        "node `{node}` ({op}): output {output} lowers to {found}, but the graph says {expected}"
    )]
    TypeMismatch {
        node: String,
        op: String,
        output: usize,
        expected: TensorType,
        found: TensorType,
    },
    #[error("node `{node}` ({op}): lowers to {found} outputs, but the graph lists {expected}")]
    OutputCount { node: String, op: String, expected: usize, found: usize },
    /// The builder rejected an op while lowering a node.
    #[error("node `{node}` ({op}): {source}")]
    NodeBuild { node: String, op: String, source: BuildError },
    /// The builder rejected the finished module.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// A fault injected for a test (see [`crate::fault`]).
    #[error("{0}")]
    Injected(String),
}

fn describe_unsupported(ops: &[String], nodes: &[String]) -> String {
    let parts: Vec<String> =
        ops.iter().zip(nodes).map(|(op, node)| format!("{op} (node `{node}`)")).collect();
    let noun = if ops.len() == 1 { "op" } else { "ops" };
    format!("{} ATen {noun}: {}", ops.len(), parts.join(", "))
}

enum Plan {
    Kernel(KernelCall),
    Table(table::LowerFn),
}

/// Lowers `graph` into one module whose public `@main` takes the graph inputs and returns its
/// (non-`null`) outputs. Chains one kernel computes are fused first ([`super::fuse`]). Each node
/// goes to `resolver` first; what it declines goes through the default table
/// ([`super::supported_ops`]). Every node's results are checked against its output metadata.
pub fn lower(graph: &Graph, resolver: &dyn KernelResolver) -> Result<Module, LowerError> {
    if let Some(message) = crate::fault::lowering() {
        return Err(LowerError::Injected(message));
    }
    graph.validate()?;
    let (fused, _) = super::fuse::fuse(graph, resolver);
    let graph = &fused;
    let mut plans = Vec::with_capacity(graph.nodes.len());
    let mut unsupported: BTreeMap<&str, &str> = BTreeMap::new();
    for node in &graph.nodes {
        let call = OpCall::new(graph, node);
        if let Some(kernel) = resolver.resolve(&call) {
            let takes = tensor_args(node);
            if let Some(r) = kernel.args.iter().find(|r| !takes.contains(r)) {
                return Err(LowerError::BadArgs {
                    node: node.name.clone(),
                    op: node.op.clone(),
                    message: format!("the resolver binds {r}, which the node does not take"),
                });
            }
            plans.push(Some(Plan::Kernel(kernel)));
        } else if let Some(f) = table::lookup(&node.op) {
            plans.push(Some(Plan::Table(f)));
        } else {
            unsupported.entry(&node.op).or_insert(&node.name);
            plans.push(None);
        }
    }
    if !unsupported.is_empty() {
        return Err(LowerError::UnsupportedOp {
            ops: unsupported.keys().map(|s| (*s).to_owned()).collect(),
            nodes: unsupported.values().map(|s| (*s).to_owned()).collect(),
        });
    }

    let name = if graph.name.is_empty() { "graph" } else { graph.name.as_str() };
    let params: Vec<TensorType> = graph.inputs.iter().map(|i| i.ty.clone()).collect();
    let b = KernelBuilder::new(name, &params);
    let mut env: HashMap<&str, Vec<Tensor<'_>>> = HashMap::new();
    for (input, t) in graph.inputs.iter().zip(b.args()) {
        env.insert(&input.name, vec![t]);
    }
    let mut callees = Callees::default();
    for (node, plan) in graph.nodes.iter().zip(plans) {
        let node_err = |source: BuildError| LowerError::NodeBuild {
            node: node.name.clone(),
            op: node.op.clone(),
            source,
        };
        let results = match plan {
            Some(Plan::Kernel(kernel)) => {
                let args: Vec<Tensor<'_>> = kernel.args.iter().map(|r| lookup(&env, r)).collect();
                let module = callees.place(kernel.module);
                b.call(&module, &args).map_err(node_err)?
            }
            Some(Plan::Table(f)) => {
                let cx = Cx::new(&b, node, |r| lookup(&env, r));
                match f(&cx) {
                    Ok(results) => results,
                    Err(Fail::Args(message)) => {
                        return Err(LowerError::BadArgs {
                            node: node.name.clone(),
                            op: node.op.clone(),
                            message,
                        });
                    }
                    Err(Fail::Build(e)) => return Err(node_err(e)),
                }
            }
            None => unreachable!("unsupported ops were reported above"),
        };
        if let Some(e) = b.deferred_error() {
            return Err(node_err(e));
        }
        check_outputs(node, &results)?;
        env.insert(&node.name, results);
    }
    let outputs: Vec<Tensor<'_>> =
        graph.outputs.iter().flatten().map(|r| lookup(&env, r)).collect();
    Ok(b.finish(&outputs)?)
}

/// The value of a reference in a valid graph whose nodes before the user have been lowered.
fn lookup<'b>(env: &HashMap<&str, Vec<Tensor<'b>>>, r: &TensorRef) -> Tensor<'b> {
    // `Graph::validate` guarantees the name and output index exist and come earlier.
    env[r.node.as_str()][r.output]
}

fn check_outputs(node: &Node, results: &[Tensor<'_>]) -> Result<(), LowerError> {
    if results.len() != node.outputs.len() {
        return Err(LowerError::OutputCount {
            node: node.name.clone(),
            op: node.op.clone(),
            expected: node.outputs.len(),
            found: results.len(),
        });
    }
    for (i, (t, want)) in results.iter().zip(&node.outputs).enumerate() {
        let got = t.ty();
        if got != *want {
            return Err(LowerError::TypeMismatch {
                node: node.name.clone(),
                op: node.op.clone(),
                output: i,
                expected: want.clone(),
                found: got,
            });
        }
    }
    Ok(())
}

/// The kernel functions already inlined, so that two different modules under one name (one
/// kernel at two signatures) get distinct symbols and a repeated one reuses its symbol.
#[derive(Default)]
struct Callees {
    /// (name in its own module, name in the lowered module, the function as inlined with its
    /// own names: private, `@main` renamed after the module).
    placed: Vec<(String, String, Function)>,
}

impl Callees {
    fn place(&mut self, mut module: Module) -> Module {
        // Normalise as the builder does, so identical functions compare equal.
        for (i, f) in module.functions.iter_mut().enumerate() {
            if i == 0 {
                f.name.clone_from(&module.name);
            }
            f.visibility = Visibility::Private;
            f.param_attrs = vec![Vec::new(); f.params.len()];
        }
        let mut renames: BTreeMap<String, String> = BTreeMap::new();
        for f in &module.functions {
            let same = self.placed.iter().find(|(own, _, g)| *own == f.name && g == f);
            let assigned = match same {
                Some((_, assigned, _)) => assigned.clone(),
                None => {
                    let taken = |n: &str| self.placed.iter().any(|(_, a, _)| a == n);
                    let fresh = if taken(&f.name) {
                        (1..)
                            .map(|k| format!("{}_{k}", f.name))
                            .find(|n| !taken(n))
                            .unwrap_or_default()
                    } else {
                        f.name.clone()
                    };
                    self.placed.push((f.name.clone(), fresh.clone(), f.clone()));
                    fresh
                }
            };
            if assigned != f.name {
                renames.insert(f.name.clone(), assigned);
            }
        }
        if renames.is_empty() {
            return module;
        }
        for f in &mut module.functions {
            if let Some(new) = renames.get(&f.name) {
                f.name.clone_from(new);
            }
            for region in &mut f.regions {
                for instr in &mut region.instrs {
                    if let Op::Call { callee, .. } | Op::Composite { decomposition: callee, .. } =
                        &mut instr.op
                        && let Some(new) = renames.get(callee)
                    {
                        callee.clone_from(new);
                    }
                }
            }
        }
        if let Some(new) = renames.get(&module.name) {
            module.name.clone_from(new);
        }
        module
    }
}
