//! What a mixture-of-experts layer's compiled graph calls besides the router's sort and top-k:
//! transformers' grouped matmul (`transformers::grouped_mm_fallback`, forward and backward, and
//! `aten::_grouped_mm`, which it calls off the CPU),
//! the tokens-per-expert histogram (`histc`) and `empty_permuted`.
//!
//! The grouped matmul multiplies each row of `input [S, K]` by the weight `[K, N]` of the expert
//! its position falls to (rows `offs[e-1]..offs[e]` to expert `e`; rows past the last offset
//! give zeros). The group sizes are data, the shapes are not: every row is multiplied by every
//! expert's weight in one `dot_general` and the product of its own expert is kept with a one-hot
//! mask (one non-zero term per row, so exact). That costs `E` times the matmul's work, which is
//! what static shapes allow without a sort-based gather.

use tpu_kernels::ir::{BinaryOp, Direction, DotDims};
use tpu_kernels::{DType, KernelBuilder, Shape, Tensor, TensorType};

use super::reduce::reduce;
use super::{Cx, R, Scalar, acc_type, bad, convert, dims_of, one, scalar_const, splat};

type Out<'b> = R<Vec<Tensor<'b>>>;

/// The `[S, E]` mask of each row's expert, in `dt`: row `r` belongs to expert `e` when
/// `offs[e-1] <= r < offs[e]` (`offs` cumulative, non-decreasing).
fn expert_mask<'b>(b: &'b KernelBuilder, offs: Tensor<'b>, rows: u64, dt: DType) -> R<Tensor<'b>> {
    let e = dims_of(offs)?[0];
    let offs = convert(b, offs, DType::I64)?;
    let ty = TensorType::new(DType::I64, Shape::of(&[rows, e]));
    let row = b.iota(ty.clone(), 0)?;
    let end = b.broadcast_in_dim(offs, ty.clone(), &[1])?;
    // The start of expert e is the end of expert e - 1 (0 for the first).
    let zero = scalar_const(b, DType::I64, Scalar::Int(0))?;
    let shifted = b.pad(offs, zero, &[1], &[-1], &[0])?;
    let start = b.broadcast_in_dim(shifted, ty, &[1])?;
    let inside = b.binary(
        BinaryOp::And,
        b.compare(Direction::Ge, row, start)?,
        b.compare(Direction::Lt, row, end)?,
    )?;
    convert(b, inside, dt)
}

fn grouped_args<'b>(
    cx: &Cx<'_, 'b>,
) -> R<(Tensor<'b>, Tensor<'b>, Tensor<'b>, u64, u64, u64, u64)> {
    let (x, w, offs) = (cx.tensor(0, "input")?, cx.tensor(1, "weight")?, cx.tensor(2, "offs")?);
    let (xd, wd, od) = (dims_of(x)?, dims_of(w)?, dims_of(offs)?);
    if xd.len() != 2 || wd.len() != 3 || od.len() != 1 || xd[1] != wd[1] || od[0] != wd[0] {
        return bad(format!(
            "grouped_mm needs input [S, K], weight [E, K, N] and offs [E], got {}, {} and {}",
            x.ty(),
            w.ty(),
            offs.ty()
        ));
    }
    if !offs.dtype().is_integer() || x.dtype() != w.dtype() || !x.dtype().is_float() {
        return bad(format!(
            "grouped_mm needs float input and weight of one type and integer offs, got {}, {} and {}",
            x.ty(),
            w.ty(),
            offs.ty()
        ));
    }
    Ok((x, w, offs, xd[0], xd[1], wd[0], wd[2]))
}

/// `a · b` contracting `lc` with `rc` (no batch dims), accumulated in f32 for 16-bit floats.
fn contract<'b>(
    b: &'b KernelBuilder,
    x: Tensor<'b>,
    y: Tensor<'b>,
    lc: i64,
    rc: i64,
) -> R<Tensor<'b>> {
    let acc = acc_type(x.dtype());
    let out = (acc != x.dtype()).then_some(acc);
    let dims = DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contracting: vec![lc],
        rhs_contracting: vec![rc],
    };
    Ok(b.dot_general(x, y, dims, None, out)?)
}

/// `transformers::grouped_mm_fallback(input, weight, offs)`: `[S, N]`.
pub(super) fn grouped_mm<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (x, w, offs, s, _k, e, n) = grouped_args(cx)?;
    // [S, K] x [E, K, N] -> [S, E, N]; keep each row's expert.
    let all = contract(b, x, w, 1, 1)?;
    let mask = expert_mask(b, offs, s, all.dtype())?;
    let wide =
        b.broadcast_in_dim(mask, TensorType::new(all.dtype(), Shape::of(&[s, e, n])), &[0, 1])?;
    let picked = b.binary(BinaryOp::Multiply, all, wide)?;
    let out = reduce(b, picked, BinaryOp::Add, Scalar::Int(0), &[1], false)?;
    one(convert(b, out, x.dtype())?)
}

/// `aten::_grouped_mm(self, mat2, offs, bias, out_dtype)` (what transformers calls off the CPU,
/// and what its backward calls), in the three forms a mixture-of-experts layer uses:
/// - `[S, K] x [E, K, N]` with `offs`: each row by its expert's matrix, `[S, N]` (as
///   `grouped_mm_fallback`);
/// - `[K, S] x [S, N]` with `offs` over `S`: one product per expert over its rows, `[E, K, N]`
///   (the weight's gradient);
/// - `[E, M, K] x [E, K, N]` without `offs`: a batched matmul, `[E, M, N]`.
pub(super) fn aten_grouped_mm<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (x, w) = (cx.tensor(0, "self")?, cx.tensor(1, "mat2")?);
    let offs = cx.opt_tensor(2, "offs")?;
    if cx.opt_tensor(3, "bias")?.is_some() {
        return bad("_grouped_mm with a bias has no lowering".to_owned());
    }
    if let Some(dt) = cx.opt_dtype(4, "out_dtype")?
        && dt != x.dtype()
    {
        return bad(format!("_grouped_mm to out_dtype {dt} from {} has no lowering", x.ty()));
    }
    if x.dtype() != w.dtype() || !x.dtype().is_float() {
        return bad(format!(
            "_grouped_mm needs float operands of one type, got {} and {}",
            x.ty(),
            w.ty()
        ));
    }
    let (xd, wd) = (dims_of(x)?, dims_of(w)?);
    let acc = acc_type(x.dtype());
    match (xd.len(), wd.len(), offs) {
        (2, 3, Some(offs)) if xd[1] == wd[1] && dims_of(offs)? == [wd[0]] => {
            let (s, e, n) = (xd[0], wd[0], wd[2]);
            let all = contract(b, x, w, 1, 1)?;
            let mask = expert_mask(b, offs, s, all.dtype())?;
            let wide = b.broadcast_in_dim(
                mask,
                TensorType::new(all.dtype(), Shape::of(&[s, e, n])),
                &[0, 1],
            )?;
            let picked = b.binary(BinaryOp::Multiply, all, wide)?;
            let out = reduce(b, picked, BinaryOp::Add, Scalar::Int(0), &[1], false)?;
            one(convert(b, out, x.dtype())?)
        }
        (2, 2, Some(offs)) if xd[1] == wd[0] && dims_of(offs)?.len() == 1 => {
            let (k, s, n) = (xd[0], xd[1], wd[1]);
            let e = dims_of(offs)?[0];
            // out[e] = x[:, rows of e] . w[rows of e, :]: the rows masked per expert.
            let mask = expert_mask(b, offs, s, acc)?;
            let xs = b.broadcast_in_dim(
                convert(b, x, acc)?,
                TensorType::new(acc, Shape::of(&[k, s, e])),
                &[0, 1],
            )?;
            let wide =
                b.broadcast_in_dim(mask, TensorType::new(acc, Shape::of(&[k, s, e])), &[1, 2])?;
            let masked = b.binary(BinaryOp::Multiply, xs, wide)?;
            // [K, S, E] x [S, N] contracting S -> [K, E, N] -> [E, K, N].
            let out = contract(b, masked, convert(b, w, acc)?, 1, 0)?;
            let out = b.transpose(out, &[1, 0, 2])?;
            debug_assert_eq!(dims_of(out)?, [e, k, n]);
            one(convert(b, out, x.dtype())?)
        }
        (3, 3, None) if xd[0] == wd[0] && xd[2] == wd[1] => {
            let dims = DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contracting: vec![2],
                rhs_contracting: vec![1],
            };
            let out = b.dot_general(x, w, dims, None, (acc != x.dtype()).then_some(acc))?;
            one(convert(b, out, x.dtype())?)
        }
        _ => bad(format!(
            "_grouped_mm of {} and {}{} has no lowering (forms: [S,K]x[E,K,N] and [K,S]x[S,N] with \
             offs, [E,M,K]x[E,K,N] without)",
            x.ty(),
            w.ty(),
            if offs.is_some() { " with offs" } else { " without offs" }
        )),
    }
}

/// `transformers::grouped_mm_fallback_backward(input, weight, offs, grad_output)`:
/// `(grad_input [S, K], grad_weight [E, K, N])`.
pub(super) fn grouped_mm_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (x, w, offs, s, k, e, n) = grouped_args(cx)?;
    let g = cx.tensor(3, "grad_output")?;
    if dims_of(g)? != [s, n] {
        return bad(format!("grouped_mm backward: grad_output {} must be [{s}, {n}]", g.ty()));
    }
    let g = convert(b, g, x.dtype())?;
    // grad_input: [S, N] x [E, K, N] -> [S, E, K], each row's expert kept.
    let all = contract(b, g, w, 1, 2)?;
    let acc = all.dtype();
    let mask = expert_mask(b, offs, s, acc)?;
    let wide = b.broadcast_in_dim(mask, TensorType::new(acc, Shape::of(&[s, e, k])), &[0, 1])?;
    let grad_input = reduce(
        b,
        b.binary(BinaryOp::Multiply, all, wide)?,
        BinaryOp::Add,
        Scalar::Int(0),
        &[1],
        false,
    )?;
    // grad_weight[e] = sum over e's rows of input[r]ᵀ grad[r]: the rows masked per expert.
    let xa = convert(b, x, acc)?;
    let xs = b.broadcast_in_dim(xa, TensorType::new(acc, Shape::of(&[s, e, k])), &[0, 2])?;
    let masked = b.binary(BinaryOp::Multiply, xs, wide)?;
    let grad_weight = contract(b, masked, convert(b, g, acc)?, 0, 0)?;
    Ok(vec![convert(b, grad_input, x.dtype())?, convert(b, grad_weight, w.dtype())?])
}

/// `histc(input, bins, min, max)`: counts of the elements in `bins` equal-width bins over
/// `[min, max]` (the data's own range when both are 0), in the input's type; elements outside
/// are not counted, the maximum falls in the last bin.
pub(super) fn histc<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let x = cx.tensor(0, "self")?;
    if x.dtype().is_bool() {
        return bad(format!("histc needs a number input, got {}", x.ty()));
    }
    let bins = cx.int_or(1, "bins", 100)?;
    if bins < 1 {
        return bad(format!("histc needs bins >= 1, got {bins}"));
    }
    let lo = cx.opt_scalar(2, "min")?.map_or(0.0, Scalar::as_f64);
    let hi = cx.opt_scalar(3, "max")?.map_or(0.0, Scalar::as_f64);
    if lo > hi {
        return bad(format!("histc: max {hi} must be at least min {lo}"));
    }
    // Integers (which CUDA's histc takes, and transformers passes off the CPU) are binned in f64.
    let acc = if x.dtype().is_float() { acc_type(x.dtype()) } else { DType::F64 };
    let numel: u64 = dims_of(x)?.iter().product();
    let flat = b.reshape(convert(b, x, acc)?, Shape::of(&[numel]))?;
    let all: Vec<usize> = vec![0];
    let (lo_t, hi_t) = if lo == 0.0 && hi == 0.0 {
        let mn = reduce(b, flat, BinaryOp::Minimum, Scalar::Float(f64::INFINITY), &all, false)?;
        let mx = reduce(b, flat, BinaryOp::Maximum, Scalar::Float(f64::NEG_INFINITY), &all, false)?;
        (mn, mx)
    } else {
        (scalar_const(b, acc, Scalar::Float(lo))?, scalar_const(b, acc, Scalar::Float(hi))?)
    };
    // A zero-width range widens by one on each side, as PyTorch's does.
    let same = b.compare(Direction::Eq, lo_t, hi_t)?;
    let one_t = scalar_const(b, acc, Scalar::Float(1.0))?;
    let lo_t = b.select(same, b.binary(BinaryOp::Subtract, lo_t, one_t)?, lo_t)?;
    let hi_t = b.select(same, b.binary(BinaryOp::Add, hi_t, one_t)?, hi_t)?;
    let nb = scalar_const(b, acc, Scalar::Float(bins as f64))?;
    let width = b.binary(BinaryOp::Subtract, hi_t, lo_t)?;
    // In PyTorch's order: (x - min) / (max - min) * bins, truncated.
    let pos = b.binary(
        BinaryOp::Multiply,
        b.binary(BinaryOp::Divide, b.binary(BinaryOp::Subtract, flat, lo_t)?, width)?,
        nb,
    )?;
    let idx = b.convert(b.unary(tpu_kernels::ir::UnaryOp::Floor, pos)?, DType::I64)?;
    let last = scalar_const(b, DType::I64, Scalar::Int(bins - 1))?;
    let idx =
        b.select(b.compare(Direction::Eq, flat, hi_t)?, b.broadcast_to(last, &idx.shape())?, idx)?;
    let inside = b.binary(
        BinaryOp::And,
        b.compare(Direction::Ge, flat, lo_t)?,
        b.compare(Direction::Le, flat, hi_t)?,
    )?;
    let ty = TensorType::new(DType::I64, Shape::of(&[numel, bins as u64]));
    let wide = b.broadcast_in_dim(idx, ty.clone(), &[0])?;
    let hit = b.binary(
        BinaryOp::And,
        b.compare(Direction::Eq, wide, b.iota(ty, 1)?)?,
        b.broadcast_in_dim(
            inside,
            TensorType::new(DType::Bool, Shape::of(&[numel, bins as u64])),
            &[0],
        )?,
    )?;
    let counts = reduce(b, convert(b, hit, acc)?, BinaryOp::Add, Scalar::Int(0), &all, false)?;
    one(convert(b, counts, x.dtype())?)
}

/// `empty_permuted(size, physical_layout, dtype, ...)`: a tensor of `size` whose values are
/// unspecified; zeros here.
pub(super) fn empty_permuted<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let size = cx.ints(0, "size")?;
    if let Some(d) = size.iter().find(|&&d| d < 0) {
        return bad(format!("empty_permuted: negative size {d} in {size:?}"));
    }
    let dims: Vec<u64> = size.iter().map(|&d| d as u64).collect();
    let dt = cx.opt_dtype(usize::MAX, "dtype")?.unwrap_or(DType::F32);
    one(splat(cx.b, TensorType::new(dt, Shape::of(&dims)), Scalar::Int(0))?)
}
