//! Whole ATen graphs: a serialisable description, and its lowering into one StableHLO module.
//!
//! A [`Graph`] is what `torch.compile`'s `aot_autograd` hands a backend (a functionalized FX
//! graph of ATen op overloads with static shapes), written down as data. [`lower`] turns it into
//! one module: `@main` takes the graph's inputs and returns its outputs; a node that a
//! [`KernelResolver`] binds to a registered kernel becomes a `func.call` of that kernel's module
//! inlined as a private function, and every other node goes through the default ATen ->
//! StableHLO table ([`supported_ops`]). Each lowered node's result types are checked against the
//! graph's metadata.
//!
//! # The JSON format (version 1)
//!
//! ```json
//! {
//!   "version": 1,
//!   "name": "gpt_block_fwd",
//!   "inputs": [{"name": "x", "type": "f32[16,32]"}, {"name": "w", "type": "f32[64,32]"}],
//!   "nodes": [
//!     {"name": "permute", "op": "aten::permute.default",
//!      "args": [{"tensor": {"node": "w"}}, {"int_list": [1, 0]}],
//!      "arg_names": ["self", "dims"],
//!      "outputs": ["f32[32,64]"]},
//!     {"name": "split", "op": "aten::split_with_sizes.default",
//!      "args": [{"tensor": {"node": "permute"}}, {"int_list": [32, 32]}, {"int": 1}],
//!      "outputs": ["f32[32,32]", "f32[32,32]"]},
//!     {"name": "full", "op": "aten::full.default",
//!      "args": [{"int_list": [2]}, {"float": "-inf"}],
//!      "kwargs": {"dtype": {"dtype": "float32"}, "device": {"device": "cpu"}},
//!      "outputs": ["f32[2]"]}
//!   ],
//!   "outputs": [{"node": "split", "output": 1}, null]
//! }
//! ```
//!
//! - `version`: [`FORMAT_VERSION`]; other versions are rejected.
//! - `name` (optional): names the lowered module.
//! - `inputs`: the graph's parameters, in order, each with a unique `name` and a `type` in the
//!   short spelling `dtype[dims]` (`f32[8,128]`, `i64[]`, `bool[2,8]`).
//! - `nodes`: in execution order. `op` is the overload key exactly as PyTorch names it,
//!   `func._schema.name + "." + func._overloadname` (`aten::mm.default`). `args` are positional,
//!   `kwargs` (optional) keyword arguments by schema name; each is an [`Arg`], externally tagged:
//!   `{"tensor": REF}`, `{"tensor_list": [REF or null, ...]}`, `{"int": 3}`,
//!   `{"float": 0.5}` (`"inf"`, `"-inf"`, `"nan"` as strings), `{"bool": true}`, `"none"`,
//!   `{"int_list": [..]}`, `{"float_list": [..]}`, `{"bool_list": [..]}`, `{"string": ".."}`,
//!   `{"dtype": "float32"}` (torch's name), `{"device": "cpu"}`, `{"layout": "strided"}`,
//!   `{"memory_format": "preserve_format"}`. `arg_names` (optional) lists the schema's argument
//!   names so resolvers can find positional arguments by name. `outputs` gives every output's
//!   type (a multi-output node lists several).
//! - A tensor reference `REF` is `{"node": NAME}` for an input or a node's first output, or
//!   `{"node": NAME, "output": i}` for output `i` of a multi-output node (what FX reaches with
//!   `getitem`). It must name an input or an earlier node.
//! - `outputs`: references to what the graph returns, in order; `null` stands for a Python
//!   `None` (a gradient the graph does not produce) and is not returned by the module.
//!
//! Before lowering, [`fuse`] replaces op chains that one registered kernel computes (RMSNorm as
//! compiled graphs decompose it, a matmul with its activation epilogue) by that kernel's op.
//!
//! Parsing ([`Graph::from_json`]) and validation ([`Graph::validate`]) errors are
//! [`GraphError`]s naming the node at fault. `python/tools/trace_gpt_block.py` writes this format
//! from FX graphs.

mod fuse;
mod lower;
mod model;
mod resolve;
mod table;

pub use fuse::{Fusion, fuse};
pub use lower::{KernelCall, KernelResolver, LowerError, NoKernels, OpCall, lower};
pub use model::{Arg, FORMAT_VERSION, Graph, GraphError, Input, Node, TensorRef, dtype_from_torch};
pub use resolve::{IndexResolver, RegisteredKernels, ShardSpec, wrap_module_text};
pub use table::supported_ops;
