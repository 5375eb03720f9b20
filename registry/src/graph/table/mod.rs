//! The default ATen -> StableHLO table: how every op a kernel does not replace is lowered.
//!
//! # What a GPT-style block produces
//!
//! `python/tools/trace_gpt_block.py` traces a small GPT block (embedding, RMSNorm as
//! `F.rms_norm` and written out, causal SDPA, SwiGLU MLP, linear head with bias, cross-entropy)
//! with `aot_autograd` and the core ATen decompositions minus the three scaled-dot-product
//! entries. With torch 2.15 the forward and backward graphs call exactly these overloads:
//!
//! - forward: `_log_softmax.default`, `_scaled_dot_product_flash_attention_for_cpu.default`,
//!   `_to_copy.default`, `add.Scalar`, `add.Tensor`, `addmm.default`, `alias.default`,
//!   `div.Tensor`, `embedding.default`, `gather.default`, `mean.dim`, `mm.default`,
//!   `mul.Tensor`, `ne.Scalar`, `neg.default`, `permute.default`, `pow.Tensor_Scalar`,
//!   `rsqrt.default`, `scalar_tensor.default`, `sigmoid.default`, `split_with_sizes.default`,
//!   `squeeze.dims`, `sum.dim_IntList`, `unsqueeze.default`, `view.default`, `where.self`;
//! - backward: `_scaled_dot_product_flash_attention_for_cpu_backward.default`, `add.Tensor`,
//!   `alias.default`, `bitwise_and.Tensor`, `bitwise_not.default`, `cat.default`,
//!   `clamp.default`, `div.Scalar`, `div.Tensor`, `exp.default`, `expand.default`,
//!   `full.default`, `full_like.default`, `ge.Scalar`, `index_put.default`, `lt.Scalar`,
//!   `mm.default`, `mul.Scalar`, `mul.Tensor`, `ne.Scalar`, `permute.default`,
//!   `pow.Tensor_Scalar`, `scalar_tensor.default`, `scatter.value`, `sigmoid.default`,
//!   `sub.Tensor`, `sum.dim_IntList`, `unsqueeze.default`, `view.default`, `where.self`.
//!
//! (all `aten::`). The decompositions turn `nll_loss_forward` into `gather`, its backward into
//! `scatter.value`, and `embedding_dense_backward` into `index_put` with `accumulate=True`.
//! The table covers all of them, and the ops of the same family a graph may show instead (the
//! list is [`supported_ops`]).
//!
//! # Lowering choices
//!
//! - Type promotion follows `torch.result_type`: dimensioned tensors over zero-dim tensors over
//!   Python scalars within a category (bool < integer < float); a Python float takes the
//!   default dtype (f32), a Python int `i64`. True division and float-only unary ops turn
//!   integers into f32. Sums of integers or bools give `i64`.
//! - 16-bit floats (bf16, f16) accumulate matmuls and reductions in f32 and round once, as
//!   PyTorch's CPU kernels do.
//! - Indexing: reading whole rows (`embedding`, `index.Tensor`, the embedding bags) is a
//!   `stablehlo.gather` of rows, an index outside the table giving a zero row;
//!   `embedding_dense_backward` adds the gradient's rows into a zero table by a
//!   `stablehlo.scatter` (an index outside the table adds nothing). `gather`, the `scatter`
//!   family and `nll_loss`'s pick of the target logit gather or scatter single elements, batched
//!   over the dims the index does not run along (StableHLO's batching dims, which SPMD
//!   partitioning keeps parallel; a scatter whose index is smaller than `self` in such a dim
//!   spells the coordinates out instead). `index_put` and the embedding bags (forward and
//!   backward) write whole rows by a scatter, adding in f32 for 16-bit floats. Negative
//!   indices wrap as in PyTorch; out-of-range ones select nothing.
//! - `_scaled_dot_product_flash_attention_for_cpu` lowers as math: `q kᵀ · scale`, the causal
//!   (top-left) or given mask, a stable softmax, `· v`, and the logsumexp output; its backward
//!   is the math gradient from that logsumexp. Dropout must be 0.
//! - Convolutions (plain, grouped, dilated, transposed, any number of spatial dims) lower to one
//!   `stablehlo.convolution` each, their gradients to convolutions as well (`conv.rs`); max
//!   pooling reads its window as strided slices and its gradient spreads with interior padding,
//!   so neither needs `reduce_window` or `select_and_scatter`.
//! - `index_put` with `accumulate=False` and repeated indices sums the writes (PyTorch leaves
//!   the result unspecified).

mod conv;
mod elementwise;
mod moe;
mod nn;
mod reduce;
mod shape;

use std::collections::BTreeMap;

use tpu_kernels::builder::broadcast_shapes;
use tpu_kernels::literal::LiteralData;
use tpu_kernels::types::DTypeClass;
use tpu_kernels::{BuildError, DType, KernelBuilder, Shape, Tensor, TensorType};

use super::model::{Arg, Node, TensorRef, dtype_from_torch};

/// Why a node's lowering failed, before the node's name is attached.
#[derive(Debug)]
pub(crate) enum Fail {
    Args(String),
    Build(BuildError),
}

impl From<BuildError> for Fail {
    fn from(e: BuildError) -> Fail {
        Fail::Build(e)
    }
}

pub(crate) type R<T> = Result<T, Fail>;

pub(crate) fn bad<T>(message: impl Into<String>) -> R<T> {
    Err(Fail::Args(message.into()))
}

/// One lowering: the node's context in, its results out.
pub(crate) type LowerFn = for<'a, 'b> fn(&Cx<'a, 'b>) -> R<Vec<Tensor<'b>>>;

/// Every op overload the table lowers, sorted.
pub fn supported_ops() -> Vec<&'static str> {
    let mut ops: Vec<&'static str> = TABLE.iter().map(|(op, _)| *op).collect();
    ops.sort_unstable();
    ops
}

pub(crate) fn lookup(op: &str) -> Option<LowerFn> {
    TABLE.iter().find(|(name, _)| *name == op).map(|(_, f)| *f)
}

use elementwise as ew;

/// The table. One line per overload.
const TABLE: &[(&str, LowerFn)] = &[
    // arithmetic
    ("aten::add.Tensor", ew::add),
    ("aten::add.Scalar", ew::add),
    ("aten::sub.Tensor", ew::sub),
    ("aten::sub.Scalar", ew::sub),
    ("aten::rsub.Tensor", ew::rsub),
    ("aten::rsub.Scalar", ew::rsub),
    ("aten::mul.Tensor", ew::mul),
    ("aten::mul.Scalar", ew::mul),
    ("aten::div.Tensor", ew::div),
    ("aten::div.Scalar", ew::div),
    ("aten::div.Tensor_mode", ew::div_mode),
    ("aten::div.Scalar_mode", ew::div_mode),
    ("aten::floor_divide.default", ew::floor_divide),
    ("aten::floor_divide.Scalar", ew::floor_divide),
    ("aten::maximum.default", ew::maximum),
    ("aten::minimum.default", ew::minimum),
    ("aten::pow.Tensor_Scalar", ew::pow),
    ("aten::pow.Tensor_Tensor", ew::pow),
    ("aten::pow.Scalar", ew::pow),
    // unary
    ("aten::neg.default", ew::neg),
    ("aten::abs.default", ew::abs),
    ("aten::sign.default", ew::sign),
    ("aten::exp.default", ew::exp),
    ("aten::log.default", ew::log),
    ("aten::log1p.default", ew::log1p),
    ("aten::sqrt.default", ew::sqrt),
    ("aten::rsqrt.default", ew::rsqrt),
    ("aten::reciprocal.default", ew::reciprocal),
    ("aten::tanh.default", ew::tanh),
    ("aten::sigmoid.default", ew::sigmoid),
    ("aten::sin.default", ew::sin),
    ("aten::cos.default", ew::cos),
    ("aten::erf.default", ew::erf),
    ("aten::floor.default", ew::floor),
    ("aten::ceil.default", ew::ceil),
    ("aten::relu.default", ew::relu),
    ("aten::gelu.default", ew::gelu),
    ("aten::silu.default", ew::silu),
    ("aten::silu_backward.default", ew::silu_backward),
    ("aten::log_sigmoid_forward.default", ew::log_sigmoid_forward),
    ("aten::log_sigmoid_backward.default", ew::log_sigmoid_backward),
    ("aten::gelu_backward.default", ew::gelu_backward),
    ("aten::tanh_backward.default", ew::tanh_backward),
    ("aten::threshold_backward.default", ew::threshold_backward),
    // comparisons and logic
    ("aten::eq.Tensor", ew::eq),
    ("aten::eq.Scalar", ew::eq),
    ("aten::ne.Tensor", ew::ne),
    ("aten::ne.Scalar", ew::ne),
    ("aten::lt.Tensor", ew::lt),
    ("aten::lt.Scalar", ew::lt),
    ("aten::le.Tensor", ew::le),
    ("aten::le.Scalar", ew::le),
    ("aten::gt.Tensor", ew::gt),
    ("aten::gt.Scalar", ew::gt),
    ("aten::ge.Tensor", ew::ge),
    ("aten::ge.Scalar", ew::ge),
    ("aten::isposinf.default", ew::isposinf),
    ("aten::isneginf.default", ew::isneginf),
    ("aten::bitwise_and.Tensor", ew::bitwise_and),
    ("aten::bitwise_and.Scalar", ew::bitwise_and),
    ("aten::bitwise_or.Tensor", ew::bitwise_or),
    ("aten::bitwise_or.Scalar", ew::bitwise_or),
    ("aten::bitwise_xor.Tensor", ew::bitwise_xor),
    ("aten::bitwise_xor.Scalar", ew::bitwise_xor),
    ("aten::bitwise_not.default", ew::bitwise_not),
    ("aten::logical_not.default", ew::logical_not),
    ("aten::logical_and.default", ew::logical_and),
    ("aten::logical_or.default", ew::logical_or),
    ("aten::where.self", ew::where_),
    ("aten::where.ScalarSelf", ew::where_),
    ("aten::where.ScalarOther", ew::where_),
    ("aten::where.Scalar", ew::where_),
    ("aten::masked_fill.Scalar", ew::masked_fill),
    ("aten::masked_fill.Tensor", ew::masked_fill),
    ("aten::addcmul.default", ew::addcmul),
    ("aten::addcdiv.default", ew::addcdiv),
    ("aten::lerp.Scalar", ew::lerp),
    ("aten::lerp.Tensor", ew::lerp),
    ("aten::clamp.default", ew::clamp),
    ("aten::clamp.Tensor", ew::clamp),
    ("aten::clamp_min.default", ew::clamp_min),
    ("aten::clamp_max.default", ew::clamp_max),
    // conversions and copies
    ("aten::_to_copy.default", ew::to_copy),
    ("prims::convert_element_type.default", ew::convert_element_type),
    ("aten::clone.default", ew::identity),
    ("aten::alias.default", ew::identity),
    ("aten::detach.default", ew::identity),
    ("aten::lift_fresh_copy.default", ew::identity),
    ("aten::copy.default", ew::copy),
    // creation
    ("aten::full.default", ew::full),
    ("aten::full_like.default", ew::full_like),
    ("aten::zeros.default", ew::zeros),
    ("aten::ones.default", ew::ones),
    ("aten::zeros_like.default", ew::zeros_like),
    ("aten::ones_like.default", ew::ones_like),
    ("aten::fill.Scalar", ew::fill),
    ("aten::fill.Tensor", ew::fill),
    ("aten::zero.default", ew::zeros_like),
    ("aten::new_zeros.default", ew::new_zeros),
    ("aten::new_ones.default", ew::new_ones),
    ("aten::empty_like.default", ew::zeros_like),
    ("aten::empty.memory_format", ew::zeros),
    ("aten::scalar_tensor.default", ew::scalar_tensor),
    ("aten::arange.default", ew::arange),
    ("aten::arange.start", ew::arange),
    ("aten::arange.start_step", ew::arange),
    ("prims::iota.default", ew::iota),
    // reductions
    ("aten::sum.dim_IntList", reduce::sum),
    ("aten::sum.default", reduce::sum),
    ("aten::mean.dim", reduce::mean),
    ("aten::mean.default", reduce::mean),
    ("aten::amax.default", reduce::amax),
    ("aten::amin.default", reduce::amin),
    ("aten::max.dim", reduce::max_dim),
    ("aten::min.dim", reduce::min_dim),
    ("aten::max.default", reduce::max_all),
    ("aten::min.default", reduce::min_all),
    ("aten::argmax.default", reduce::argmax),
    ("aten::argmin.default", reduce::argmin),
    ("aten::var.correction", reduce::var),
    ("aten::var_mean.correction", reduce::var_mean),
    ("aten::isin.Tensor_Tensor", reduce::isin),
    ("aten::isin.Tensor_Scalar", reduce::isin),
    ("aten::isin.Scalar_Tensor", reduce::isin),
    ("aten::any.dim", reduce::any),
    ("aten::any.dims", reduce::any),
    ("aten::any.default", reduce::any),
    ("aten::all.dim", reduce::all),
    ("aten::all.dims", reduce::all),
    ("aten::all.default", reduce::all),
    ("aten::cumsum.default", reduce::cumsum),
    ("aten::sort.default", reduce::sort),
    ("aten::sort.stable", reduce::sort),
    ("aten::topk.default", reduce::topk),
    ("aten::native_group_norm.default", reduce::group_norm),
    ("aten::native_group_norm_backward.default", reduce::group_norm_backward),
    // shapes
    ("aten::view.default", shape::view),
    ("aten::_unsafe_view.default", shape::view),
    ("aten::reshape.default", shape::view),
    ("aten::expand.default", shape::expand),
    ("aten::permute.default", shape::permute),
    ("aten::transpose.int", shape::transpose),
    ("aten::t.default", shape::t),
    ("aten::unsqueeze.default", shape::unsqueeze),
    ("aten::squeeze.dim", shape::squeeze),
    ("aten::squeeze.dims", shape::squeeze),
    ("aten::squeeze.default", shape::squeeze),
    ("aten::slice.Tensor", shape::slice),
    ("aten::select.int", shape::select),
    ("aten::cat.default", shape::cat),
    ("aten::split.Tensor", shape::split),
    ("aten::split_with_sizes.default", shape::split_with_sizes),
    ("aten::constant_pad_nd.default", shape::constant_pad_nd),
    ("aten::slice_scatter.default", shape::slice_scatter),
    ("aten::slice_backward.default", shape::slice_backward),
    ("aten::select_backward.default", shape::select_backward),
    ("aten::stack.default", shape::stack),
    // convolution, batch norm, pooling
    ("aten::convolution.default", conv::convolution),
    ("aten::convolution_backward.default", conv::convolution_backward),
    ("aten::_native_batch_norm_legit_functional.default", conv::batch_norm_functional),
    ("aten::native_batch_norm_backward.default", conv::batch_norm_backward),
    ("aten::upsample_nearest2d.default", conv::upsample_nearest2d),
    ("aten::upsample_nearest2d_backward.default", conv::upsample_nearest2d_backward),
    ("aten::max_pool2d_with_indices.default", conv::max_pool2d_with_indices),
    ("aten::max_pool2d_with_indices_backward.default", conv::max_pool2d_with_indices_backward),
    // mixture of experts: grouped matmul, tokens per expert
    ("transformers::grouped_mm_fallback.default", moe::grouped_mm),
    ("transformers::grouped_mm_fallback_backward.default", moe::grouped_mm_backward),
    ("aten::histc.default", moe::histc),
    ("aten::_grouped_mm.default", moe::aten_grouped_mm),
    ("aten::empty_permuted.default", moe::empty_permuted),
    // linear algebra
    ("aten::mm.default", nn::mm),
    ("aten::bmm.default", nn::bmm),
    ("aten::addmm.default", nn::addmm),
    // indexing
    ("aten::embedding.default", nn::embedding),
    ("aten::embedding_dense_backward.default", nn::embedding_dense_backward),
    ("aten::_embedding_bag.default", nn::embedding_bag),
    ("aten::_embedding_bag_backward.default", nn::embedding_bag_backward),
    ("aten::index.Tensor", nn::index),
    ("aten::index_select.default", nn::index_select),
    ("aten::index_put.default", nn::index_put),
    ("aten::gather.default", nn::gather),
    ("aten::scatter.value", nn::scatter_value),
    ("aten::scatter.src", nn::scatter_src),
    ("aten::scatter_add.default", nn::scatter_add),
    // softmax, losses, attention
    ("aten::_softmax.default", nn::softmax),
    ("aten::_log_softmax.default", nn::log_softmax),
    ("aten::_safe_softmax.default", nn::safe_softmax),
    ("aten::_softmax_backward_data.default", nn::softmax_backward),
    ("aten::_log_softmax_backward_data.default", nn::log_softmax_backward),
    ("aten::nll_loss_forward.default", nn::nll_loss_forward),
    ("aten::mse_loss.default", nn::mse_loss),
    ("aten::binary_cross_entropy_with_logits.default", nn::bce_with_logits),
    ("aten::mse_loss_backward.default", nn::mse_loss_backward),
    ("aten::nll_loss_backward.default", nn::nll_loss_backward),
    ("aten::_scaled_dot_product_flash_attention_for_cpu.default", nn::sdpa_flash_cpu),
    (
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default",
        nn::sdpa_flash_cpu_backward,
    ),
];

// ----- the lowering context -----

/// A node's argument with its tensors resolved to builder values.
#[derive(Clone, Debug)]
pub(crate) enum V<'a, 'b> {
    T(Tensor<'b>),
    L(Vec<Option<Tensor<'b>>>),
    A(&'a Arg),
}

/// What one lowering sees: the builder, the node, its arguments.
pub(crate) struct Cx<'a, 'b> {
    pub(crate) b: &'b KernelBuilder,
    pub(crate) node: &'a Node,
    args: Vec<V<'a, 'b>>,
    kwargs: BTreeMap<&'a str, V<'a, 'b>>,
}

/// A Python scalar argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scalar {
    Bool(bool),
    Int(i64),
    Float(f64),
}

impl Scalar {
    /// The dtype a wrapped Python scalar takes in type promotion.
    fn dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::F32,
        }
    }

    pub(crate) fn as_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => f64::from(u8::from(b)),
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }
}

/// A tensor or a Python scalar, as `Scalar`-overload and mixed arguments arrive.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Operand<'b> {
    T(Tensor<'b>),
    S(Scalar),
}

impl<'a, 'b> Cx<'a, 'b> {
    pub(crate) fn new(
        b: &'b KernelBuilder,
        node: &'a Node,
        value: impl Fn(&TensorRef) -> Tensor<'b>,
    ) -> Cx<'a, 'b> {
        let resolve = |a: &'a Arg| match a {
            Arg::Tensor(r) => V::T(value(r)),
            Arg::TensorList(rs) => V::L(rs.iter().map(|r| r.as_ref().map(&value)).collect()),
            other => V::A(other),
        };
        let args = node.args.iter().map(resolve).collect();
        let kwargs = node.kwargs.iter().map(|(k, a)| (k.as_str(), resolve(a))).collect();
        Cx { b, node, args, kwargs }
    }

    /// Argument `i` (positional) or `name` (keyword, or positional where the node's
    /// `arg_names` puts it: a keyword-only argument given in schema order, as the native
    /// recorder gives every argument); `None` when absent or `None`.
    pub(crate) fn get(&self, i: usize, name: &str) -> Option<&V<'a, 'b>> {
        let v = if i < self.args.len() {
            self.args.get(i)
        } else {
            self.kwargs.get(name).or_else(|| {
                let p = self.node.arg_names.iter().position(|n| n == name)?;
                self.args.get(p)
            })
        };
        match v {
            Some(V::A(Arg::None)) | None => None,
            other => other,
        }
    }

    fn kind(v: &V<'_, '_>) -> &'static str {
        match v {
            V::T(_) => "tensor",
            V::L(_) => "tensor list",
            V::A(a) => a.kind(),
        }
    }

    fn wrong<T>(&self, name: &str, want: &str, v: &V<'_, '_>) -> R<T> {
        bad(format!("argument `{name}` must be {want}, got {}", Self::kind(v)))
    }

    fn missing<T>(&self, name: &str) -> R<T> {
        bad(format!("argument `{name}` is missing"))
    }

    pub(crate) fn tensor(&self, i: usize, name: &str) -> R<Tensor<'b>> {
        match self.get(i, name) {
            Some(V::T(t)) => Ok(*t),
            Some(v) => self.wrong(name, "a tensor", v),
            None => self.missing(name),
        }
    }

    pub(crate) fn opt_tensor(&self, i: usize, name: &str) -> R<Option<Tensor<'b>>> {
        match self.get(i, name) {
            Some(V::T(t)) => Ok(Some(*t)),
            Some(v) => self.wrong(name, "a tensor or none", v),
            None => Ok(None),
        }
    }

    pub(crate) fn tensor_list(&self, i: usize, name: &str) -> R<Vec<Option<Tensor<'b>>>> {
        match self.get(i, name) {
            Some(V::L(ts)) => Ok(ts.clone()),
            Some(v) => self.wrong(name, "a tensor list", v),
            None => self.missing(name),
        }
    }

    pub(crate) fn operand(&self, i: usize, name: &str) -> R<Operand<'b>> {
        match self.opt_operand(i, name)? {
            Some(o) => Ok(o),
            None => self.missing(name),
        }
    }

    pub(crate) fn opt_operand(&self, i: usize, name: &str) -> R<Option<Operand<'b>>> {
        Ok(Some(match self.get(i, name) {
            None => return Ok(None),
            Some(V::T(t)) => Operand::T(*t),
            Some(V::A(Arg::Int(v))) => Operand::S(Scalar::Int(*v)),
            Some(V::A(Arg::Float(v))) => Operand::S(Scalar::Float(*v)),
            Some(V::A(Arg::Bool(v))) => Operand::S(Scalar::Bool(*v)),
            Some(v) => return self.wrong(name, "a tensor or a number", v),
        }))
    }

    pub(crate) fn opt_scalar(&self, i: usize, name: &str) -> R<Option<Scalar>> {
        match self.opt_operand(i, name)? {
            None => Ok(None),
            Some(Operand::S(s)) => Ok(Some(s)),
            Some(Operand::T(_)) => bad(format!("argument `{name}` must be a number, got tensor")),
        }
    }

    pub(crate) fn scalar(&self, i: usize, name: &str) -> R<Scalar> {
        match self.opt_scalar(i, name)? {
            Some(s) => Ok(s),
            None => self.missing(name),
        }
    }

    pub(crate) fn opt_int(&self, i: usize, name: &str) -> R<Option<i64>> {
        match self.get(i, name) {
            Some(V::A(Arg::Int(v))) => Ok(Some(*v)),
            Some(v) => self.wrong(name, "an int", v),
            None => Ok(None),
        }
    }

    pub(crate) fn int(&self, i: usize, name: &str) -> R<i64> {
        match self.opt_int(i, name)? {
            Some(v) => Ok(v),
            None => self.missing(name),
        }
    }

    pub(crate) fn int_or(&self, i: usize, name: &str, default: i64) -> R<i64> {
        Ok(self.opt_int(i, name)?.unwrap_or(default))
    }

    pub(crate) fn opt_float(&self, i: usize, name: &str) -> R<Option<f64>> {
        match self.get(i, name) {
            Some(V::A(Arg::Float(v))) => Ok(Some(*v)),
            Some(V::A(Arg::Int(v))) => Ok(Some(*v as f64)),
            Some(v) => self.wrong(name, "a float", v),
            None => Ok(None),
        }
    }

    pub(crate) fn bool_or(&self, i: usize, name: &str, default: bool) -> R<bool> {
        match self.get(i, name) {
            Some(V::A(Arg::Bool(v))) => Ok(*v),
            Some(v) => self.wrong(name, "a bool", v),
            None => Ok(default),
        }
    }

    /// An `int[]` (a lone int counts as a one-element list, as `int[1]` parameters allow).
    pub(crate) fn opt_ints(&self, i: usize, name: &str) -> R<Option<Vec<i64>>> {
        match self.get(i, name) {
            Some(V::A(Arg::IntList(v))) => Ok(Some(v.clone())),
            Some(V::A(Arg::Int(v))) => Ok(Some(vec![*v])),
            Some(v) => self.wrong(name, "an int list", v),
            None => Ok(None),
        }
    }

    pub(crate) fn ints(&self, i: usize, name: &str) -> R<Vec<i64>> {
        match self.opt_ints(i, name)? {
            Some(v) => Ok(v),
            None => self.missing(name),
        }
    }

    /// A `bool[]`.
    pub(crate) fn bools(&self, i: usize, name: &str) -> R<Vec<bool>> {
        match self.get(i, name) {
            Some(V::A(Arg::BoolList(v))) => Ok(v.clone()),
            Some(v) => self.wrong(name, "a bool list", v),
            None => self.missing(name),
        }
    }

    pub(crate) fn opt_dtype(&self, i: usize, name: &str) -> R<Option<DType>> {
        match self.get(i, name) {
            Some(V::A(Arg::Dtype(d))) => match dtype_from_torch(d) {
                Some(dt) => Ok(Some(dt)),
                None => {
                    bad(format!("argument `{name}`: dtype `{d}` has no StableHLO element type"))
                }
            },
            Some(v) => self.wrong(name, "a dtype", v),
            None => Ok(None),
        }
    }

    pub(crate) fn opt_string(&self, i: usize, name: &str) -> R<Option<&'a str>> {
        match self.get(i, name) {
            Some(V::A(Arg::String(s))) => Ok(Some(s.as_str())),
            Some(v) => self.wrong(name, "a string", v),
            None => Ok(None),
        }
    }
}

// ----- type promotion -----

fn rank_of_float(d: DType) -> u32 {
    match d {
        DType::F64 => 4,
        DType::F32 => 3,
        DType::BF16 | DType::F16 => 2,
        _ => 1,
    }
}

/// `torch.promote_types`.
pub(crate) fn promote_types(a: DType, b: DType) -> DType {
    use DTypeClass::*;
    if a == b {
        return a;
    }
    match (a.class(), b.class()) {
        (Bool, _) => b,
        (_, Bool) => a,
        (Float, Float) => {
            let (ra, rb) = (rank_of_float(a), rank_of_float(b));
            if ra == rb {
                DType::F32
            } else if ra > rb {
                a
            } else {
                b
            }
        }
        (Float, _) => a,
        (_, Float) => b,
        (SignedInt, SignedInt) | (UnsignedInt, UnsignedInt) => {
            if a.bits() >= b.bits() {
                a
            } else {
                b
            }
        }
        (SignedInt, UnsignedInt) | (UnsignedInt, SignedInt) => {
            let (s, u) = if a.class() == SignedInt { (a, b) } else { (b, a) };
            if s.bits() > u.bits() {
                s
            } else {
                match u.bits() {
                    8 => DType::I16,
                    16 => DType::I32,
                    _ => DType::I64,
                }
            }
        }
    }
}

fn promote_opt(a: Option<DType>, b: DType) -> Option<DType> {
    Some(a.map_or(b, |a| promote_types(a, b)))
}

/// c10's `combine_categories`: the higher tier wins unless the lower one is of a higher category.
fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    let Some(h) = higher else { return lower };
    if h.is_float() {
        return Some(h);
    }
    match lower {
        Some(l) if h.is_bool() || l.is_float() => Some(promote_types(h, l)),
        _ => Some(h),
    }
}

/// `torch.result_type` over tensors and Python scalars.
pub(crate) fn result_type(ops: &[Operand<'_>]) -> DType {
    let (mut dim, mut zero, mut wrapped) = (None, None, None);
    for o in ops {
        match o {
            Operand::T(t) if t.rank() > 0 => dim = promote_opt(dim, t.dtype()),
            Operand::T(t) => zero = promote_opt(zero, t.dtype()),
            Operand::S(s) => wrapped = promote_opt(wrapped, s.dtype()),
        }
    }
    combine(dim, combine(zero, wrapped)).unwrap_or(DType::F32)
}

/// The float type integer inputs of float-only ops become (the default dtype).
pub(crate) fn float_of(d: DType) -> DType {
    if d.is_float() { d } else { DType::F32 }
}

/// The type 16-bit floats compute in.
pub(crate) fn acc_type(d: DType) -> DType {
    match d {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    }
}

// ----- small builders -----

/// A constant of type `ty` whose every element is `s` (exact for integers).
pub(crate) fn splat<'b>(b: &'b KernelBuilder, ty: TensorType, s: Scalar) -> R<Tensor<'b>> {
    let t = match (ty.dtype.class(), s) {
        (DTypeClass::SignedInt, Scalar::Int(v)) => b.constant(ty, LiteralData::Int(vec![v]))?,
        (DTypeClass::UnsignedInt, Scalar::Int(v)) if v >= 0 => {
            b.constant(ty, LiteralData::UInt(vec![v as u64]))?
        }
        (DTypeClass::Bool, s) => b.constant(ty, LiteralData::Bool(vec![s.as_f64() != 0.0]))?,
        (DTypeClass::SignedInt | DTypeClass::UnsignedInt, Scalar::Float(f)) => {
            // PyTorch truncates a float fill of an integer tensor toward zero.
            b.splat(ty, f.trunc())?
        }
        (_, s) => b.splat(ty, s.as_f64())?,
    };
    Ok(t)
}

/// A scalar constant of `dtype`.
pub(crate) fn scalar_const<'b>(b: &'b KernelBuilder, dtype: DType, s: Scalar) -> R<Tensor<'b>> {
    splat(b, TensorType::scalar(dtype), s)
}

/// `o` as a tensor of element type `dtype`.
pub(crate) fn materialize<'b>(b: &'b KernelBuilder, o: Operand<'b>, dtype: DType) -> R<Tensor<'b>> {
    match o {
        Operand::T(t) => convert(b, t, dtype),
        Operand::S(s) => scalar_const(b, dtype, s),
    }
}

/// Element type conversion with PyTorch's meaning for bool targets (`x != 0`).
pub(crate) fn convert<'b>(b: &'b KernelBuilder, t: Tensor<'b>, dtype: DType) -> R<Tensor<'b>> {
    if t.dtype() == dtype {
        return Ok(t);
    }
    if dtype == DType::Bool {
        let zero = splat(b, TensorType::scalar(t.dtype()), Scalar::Int(0))?;
        return Ok(b.compare(tpu_kernels::ir::Direction::Ne, t, zero)?);
    }
    Ok(b.convert(t, dtype)?)
}

/// Broadcasts every tensor to their common shape.
pub(crate) fn broadcast_all<'b>(b: &'b KernelBuilder, ts: &[Tensor<'b>]) -> R<Vec<Tensor<'b>>> {
    let mut shape = Shape::scalar();
    for t in ts {
        shape = match broadcast_shapes(&shape, &t.shape()) {
            Some(s) => s,
            None => {
                let types: Vec<String> = ts.iter().map(|t| t.ty().to_string()).collect();
                return bad(format!("cannot broadcast {} together", types.join(", ")));
            }
        };
    }
    ts.iter().map(|t| Ok(b.broadcast_to(*t, &shape)?)).collect()
}

/// Normalises a dimension index (PyTorch lets rank-0 tensors take dims `-1` and `0`).
pub(crate) fn axis(dim: i64, rank: usize) -> R<usize> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return bad(format!("dimension {dim} out of range for rank {rank}"));
    }
    Ok(d as usize)
}

/// Static sizes of `t`, or an error (the table lowers static shapes only).
pub(crate) fn dims_of(t: Tensor<'_>) -> R<Vec<u64>> {
    match t.shape().static_dims() {
        Some(d) => Ok(d),
        None => bad(format!("{} has symbolic dimensions; the table lowers static shapes", t.ty())),
    }
}

pub(crate) fn one(t: Tensor<'_>) -> R<Vec<Tensor<'_>>> {
    Ok(vec![t])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_no_duplicates() {
        let ops = supported_ops();
        let mut dedup = ops.clone();
        dedup.dedup();
        assert_eq!(ops, dedup);
    }

    #[test]
    fn promotion_matches_torch() {
        use DType::*;
        assert_eq!(promote_types(U8, I8), I16);
        assert_eq!(promote_types(BF16, F16), F32);
        assert_eq!(promote_types(Bool, I64), I64);
        assert_eq!(promote_types(I64, F16), F16);
        assert_eq!(promote_types(U32, I32), I64);
        assert_eq!(combine(Some(I32), combine(None, Some(F32))), Some(F32));
        assert_eq!(combine(Some(F16), combine(None, Some(F32))), Some(F16));
        assert_eq!(combine(Some(I32), combine(None, Some(I64))), Some(I32));
        assert_eq!(combine(Some(Bool), combine(None, Some(I64))), Some(I64));
        assert_eq!(combine(Some(BF16), combine(Some(F64), None)), Some(BF16));
        assert_eq!(combine(Some(I64), combine(Some(F64), None)), Some(F64));
    }
}
