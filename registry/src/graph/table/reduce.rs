//! Reductions.

use tpu_kernels::ir::{BinaryOp, Direction, UnaryOp};
use tpu_kernels::{DType, Dim, KernelBuilder, Shape, Tensor, TensorType};

use super::{
    Cx, R, Scalar, acc_type, axis, bad, convert, dims_of, materialize, one, result_type,
    scalar_const, splat,
};

type Out<'b> = R<Vec<Tensor<'b>>>;

/// The reduced dimensions, sorted; `None` or `[]` means all.
pub(super) fn reduce_dims(dims: Option<Vec<i64>>, rank: usize) -> R<Vec<usize>> {
    let dims = dims.unwrap_or_default();
    if dims.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut out = Vec::with_capacity(dims.len());
    for d in dims {
        let a = axis(d, rank)?;
        if rank > 0 && !out.contains(&a) {
            out.push(a);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// `x` reduced over `dims` with `op` from `init`; with `keepdim` the dims stay as size 1.
pub(super) fn reduce<'b>(
    b: &'b KernelBuilder,
    x: Tensor<'b>,
    op: BinaryOp,
    init: Scalar,
    dims: &[usize],
    keepdim: bool,
) -> R<Tensor<'b>> {
    let init = scalar_const(b, x.dtype(), init)?;
    let d: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let r = b.reduce(&[x], &[init], &d, |a| Ok(vec![b.binary(op, a[0], a[1])?]))?[0];
    if !keepdim {
        return Ok(r);
    }
    Ok(b.reshape(r, kept_shape(&x.shape(), dims))?)
}

/// `shape` with `dims` set to 1.
pub(super) fn kept_shape(shape: &Shape, dims: &[usize]) -> Shape {
    shape
        .0
        .iter()
        .enumerate()
        .map(|(i, d)| if dims.contains(&i) { Dim::Static(1) } else { d.clone() })
        .collect()
}

/// The number of elements over `dims`.
fn count(x: Tensor<'_>, dims: &[usize]) -> R<u64> {
    let sizes = dims_of(x)?;
    Ok(dims.iter().map(|&d| sizes[d]).product())
}

/// The smallest value of `dt` (the identity of `max`).
pub(super) fn lowest(dt: DType) -> Scalar {
    match dt {
        DType::Bool => Scalar::Bool(false),
        DType::I8 => Scalar::Int(i8::MIN.into()),
        DType::I16 => Scalar::Int(i16::MIN.into()),
        DType::I32 => Scalar::Int(i32::MIN.into()),
        DType::I64 => Scalar::Int(i64::MIN),
        DType::U8 | DType::U32 => Scalar::Int(0),
        _ => Scalar::Float(f64::NEG_INFINITY),
    }
}

/// The largest value of `dt` (the identity of `min`).
pub(super) fn highest(dt: DType) -> Scalar {
    match dt {
        DType::Bool => Scalar::Bool(true),
        DType::I8 => Scalar::Int(i8::MAX.into()),
        DType::I16 => Scalar::Int(i16::MAX.into()),
        DType::I32 => Scalar::Int(i32::MAX.into()),
        DType::I64 => Scalar::Int(i64::MAX),
        DType::U8 => Scalar::Int(u8::MAX.into()),
        DType::U32 => Scalar::Int(u32::MAX.into()),
        _ => Scalar::Float(f64::INFINITY),
    }
}

/// `sum(self, dim=None, keepdim=False, *, dtype=None)`: integers and bools sum to `i64`;
/// 16-bit floats accumulate in f32.
pub(super) fn sum<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let dims = reduce_dims(cx.opt_ints(1, "dim")?, x.rank())?;
    let keepdim = cx.bool_or(2, "keepdim", false)?;
    let out = match cx.opt_dtype(usize::MAX, "dtype")? {
        Some(d) => d,
        None if x.dtype().is_float() => x.dtype(),
        None => DType::I64,
    };
    let xa = convert(cx.b, x, acc_type(out))?;
    let r = reduce(cx.b, xa, BinaryOp::Add, Scalar::Int(0), &dims, keepdim)?;
    one(convert(cx.b, r, out)?)
}

/// `mean(self, dim, keepdim=False, *, dtype=None)`: the sum divided by the count.
pub(super) fn mean<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let dims = reduce_dims(cx.opt_ints(1, "dim")?, x.rank())?;
    let keepdim = cx.bool_or(2, "keepdim", false)?;
    let out = cx.opt_dtype(usize::MAX, "dtype")?.unwrap_or(x.dtype());
    if !out.is_float() {
        return bad(format!("mean needs a float type, got {}", x.ty()));
    }
    let xa = convert(cx.b, x, acc_type(out))?;
    let s = reduce(cx.b, xa, BinaryOp::Add, Scalar::Int(0), &dims, keepdim)?;
    let n = scalar_const(cx.b, xa.dtype(), Scalar::Float(count(x, &dims)? as f64))?;
    let m = cx.b.binary(BinaryOp::Divide, s, n)?;
    one(convert(cx.b, m, out)?)
}

fn extreme<'b>(cx: &Cx<'_, 'b>, op: BinaryOp) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let dims = reduce_dims(cx.opt_ints(1, "dim")?, x.rank())?;
    let keepdim = cx.bool_or(2, "keepdim", false)?;
    let init = if op == BinaryOp::Maximum { lowest(x.dtype()) } else { highest(x.dtype()) };
    one(reduce(cx.b, x, op, init, &dims, keepdim)?)
}

pub(super) fn amax<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    extreme(cx, BinaryOp::Maximum)
}

pub(super) fn amin<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    extreme(cx, BinaryOp::Minimum)
}

/// `max()` / `min()` over all elements.
fn extreme_all<'b>(cx: &Cx<'_, 'b>, op: BinaryOp) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let dims: Vec<usize> = (0..x.rank()).collect();
    let init = if op == BinaryOp::Maximum { lowest(x.dtype()) } else { highest(x.dtype()) };
    one(reduce(cx.b, x, op, init, &dims, false)?)
}

pub(super) fn max_all<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    extreme_all(cx, BinaryOp::Maximum)
}

pub(super) fn min_all<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    extreme_all(cx, BinaryOp::Minimum)
}

/// The extreme values along `dim` (kept) and the index of the first element reaching them
/// (NaN counts as reaching, as PyTorch propagates it).
fn extreme_with_index<'b>(
    b: &'b KernelBuilder,
    x: Tensor<'b>,
    d: usize,
    op: BinaryOp,
) -> R<(Tensor<'b>, Tensor<'b>)> {
    let init = if op == BinaryOp::Maximum { lowest(x.dtype()) } else { highest(x.dtype()) };
    let m = reduce(b, x, op, init, &[d], true)?;
    let mb = b.broadcast_to(m, &x.shape())?;
    let mut hit = b.compare(Direction::Eq, x, mb)?;
    if x.dtype().is_float() {
        let nan = b.compare(Direction::Ne, x, x)?;
        hit = b.binary(BinaryOp::Or, hit, nan)?;
    }
    let size = dims_of(x)?[d];
    let iota = b.iota(x.ty().with_dtype(DType::I64), d as i64)?;
    let past = splat(b, x.ty().with_dtype(DType::I64), Scalar::Int(size as i64))?;
    let idx = b.select(hit, iota, past)?;
    let first = reduce(b, idx, BinaryOp::Minimum, highest(DType::I64), &[d], true)?;
    Ok((m, first))
}

fn drop_dim<'b>(b: &'b KernelBuilder, t: Tensor<'b>, d: usize, keepdim: bool) -> R<Tensor<'b>> {
    if keepdim {
        return Ok(t);
    }
    let shape: Shape =
        t.shape().0.iter().enumerate().filter(|(i, _)| *i != d).map(|(_, s)| s.clone()).collect();
    Ok(b.reshape(t, shape)?)
}

fn extreme_dim<'b>(cx: &Cx<'_, 'b>, op: BinaryOp) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let d = axis(cx.int(1, "dim")?, x.rank())?;
    let keepdim = cx.bool_or(2, "keepdim", false)?;
    if x.rank() == 0 {
        let zero = scalar_const(cx.b, DType::I64, Scalar::Int(0))?;
        return Ok(vec![x, zero]);
    }
    let (m, i) = extreme_with_index(cx.b, x, d, op)?;
    Ok(vec![drop_dim(cx.b, m, d, keepdim)?, drop_dim(cx.b, i, d, keepdim)?])
}

pub(super) fn max_dim<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    extreme_dim(cx, BinaryOp::Maximum)
}

pub(super) fn min_dim<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    extreme_dim(cx, BinaryOp::Minimum)
}

/// `argmax(self, dim=None, keepdim=False)`; without `dim`, over the flattened tensor.
fn arg_extreme<'b>(cx: &Cx<'_, 'b>, op: BinaryOp) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let keepdim = cx.bool_or(2, "keepdim", false)?;
    let b = cx.b;
    match cx.opt_int(1, "dim")? {
        Some(_) if x.rank() == 0 => one(scalar_const(b, DType::I64, Scalar::Int(0))?),
        Some(dim) => {
            let d = axis(dim, x.rank())?;
            let (_, i) = extreme_with_index(b, x, d, op)?;
            one(drop_dim(b, i, d, keepdim)?)
        }
        None => {
            let n: u64 = dims_of(x)?.iter().product();
            let flat = b.reshape(x, Shape::of(&[n]))?;
            let (_, i) = extreme_with_index(b, flat, 0, op)?;
            let shape = if keepdim { Shape::of(&vec![1; x.rank()]) } else { Shape::scalar() };
            one(b.reshape(i, shape)?)
        }
    }
}

pub(super) fn argmax<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    arg_extreme(cx, BinaryOp::Maximum)
}

pub(super) fn argmin<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    arg_extreme(cx, BinaryOp::Minimum)
}

/// `var(self, dim=None, *, correction=None, keepdim=False)`: `sum((x - mean)^2) / (N - c)`.
pub(super) fn var<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (v, _) = var_and_mean(cx)?;
    one(v)
}

/// `var_mean.correction(self, dim=None, *, correction=None, keepdim=False)`: `(var, mean)`, as
/// `var` computes them.
pub(super) fn var_mean<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (v, m) = var_and_mean(cx)?;
    Ok(vec![v, m])
}

/// The variance (with `correction`) and the mean of `self` over `dim`, in `self`'s dtype.
fn var_and_mean<'b>(cx: &Cx<'_, 'b>) -> R<(Tensor<'b>, Tensor<'b>)> {
    let x = cx.tensor(0, "self")?;
    let dims = reduce_dims(cx.opt_ints(1, "dim")?, x.rank())?;
    let correction = cx.opt_scalar(usize::MAX, "correction")?.map_or(1.0, Scalar::as_f64);
    let keepdim = cx.bool_or(usize::MAX, "keepdim", false)?;
    if !x.dtype().is_float() {
        return bad(format!("var needs a float type, got {}", x.ty()));
    }
    let b = cx.b;
    let xa = convert(b, x, acc_type(x.dtype()))?;
    let n = count(x, &dims)? as f64;
    let s = reduce(b, xa, BinaryOp::Add, Scalar::Int(0), &dims, true)?;
    let mean = b.binary(BinaryOp::Divide, s, scalar_const(b, xa.dtype(), Scalar::Float(n))?)?;
    let centered = b.binary(BinaryOp::Subtract, xa, b.broadcast_to(mean, &xa.shape())?)?;
    let sq = b.binary(BinaryOp::Multiply, centered, centered)?;
    let ss = reduce(b, sq, BinaryOp::Add, Scalar::Int(0), &dims, keepdim)?;
    let denom = scalar_const(b, xa.dtype(), Scalar::Float((n - correction).max(0.0)))?;
    let v = b.binary(BinaryOp::Divide, ss, denom)?;
    let mean = if keepdim {
        mean
    } else {
        let kept: Vec<u64> = dims_of(mean)?
            .iter()
            .enumerate()
            .filter(|(i, _)| !dims.contains(i))
            .map(|(_, &d)| d)
            .collect();
        b.reshape(mean, Shape::of(&kept))?
    };
    Ok((convert(b, v, x.dtype())?, convert(b, mean, x.dtype())?))
}

/// `any(self, dim, keepdim=False)` (and `any.dims`, `any()`): whether an element is nonzero.
pub(super) fn any<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    truth_reduce(cx, BinaryOp::Or, false)
}

pub(super) fn all<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    truth_reduce(cx, BinaryOp::And, true)
}

/// `any` / `all` (`.default`, `.dim`, `.dims`): whether some / every element along the dims
/// (all of them by default) is non-zero, as a bool tensor.
fn truth_reduce<'b>(cx: &Cx<'_, 'b>, op: BinaryOp, init: bool) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let dims = match cx.get(1, "dim") {
        None => (0..x.rank()).collect(),
        Some(_) => match cx.opt_int(1, "dim") {
            Ok(d) => reduce_dims(d.map(|d| vec![d]), x.rank())?,
            Err(_) => reduce_dims(cx.opt_ints(1, "dim")?, x.rank())?,
        },
    };
    let keepdim = cx.bool_or(2, "keepdim", false)?;
    let nonzero = if x.dtype() == DType::Bool {
        x
    } else {
        let zero = splat(cx.b, x.ty(), Scalar::Int(0))?;
        cx.b.compare(Direction::Ne, x, zero)?
    };
    one(reduce(cx.b, nonzero, op, Scalar::Bool(init), &dims, keepdim)?)
}

/// `isin(elements, test_elements, *, assume_unique=False, invert=False)` (`.Tensor_Tensor`,
/// `.Tensor_Scalar`, `.Scalar_Tensor`): whether each element of `elements` equals one of
/// `test_elements`, both in their promoted type (NaN equals nothing); `invert` negates it.
/// Every pair is compared (`[N, M]` booleans reduced along `M`): meant for small test sets, such
/// as a generation's stop tokens.
pub(super) fn isin<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, t) = (cx.operand(0, "elements")?, cx.operand(1, "test_elements")?);
    let dt = result_type(&[x, t]);
    let (x, t) = (materialize(cx.b, x, dt)?, materialize(cx.b, t, dt)?);
    let invert = cx.bool_or(usize::MAX, "invert", false)?;
    let (n, m) = (
        count(x, &(0..x.rank()).collect::<Vec<_>>())?,
        count(t, &(0..t.rank()).collect::<Vec<_>>())?,
    );
    let pairs = Shape::of(&[n, m]);
    let xs = cx.b.broadcast_to(cx.b.reshape(x, Shape::of(&[n, 1]))?, &pairs)?;
    let ts = cx.b.broadcast_to(cx.b.reshape(t, Shape::of(&[1, m]))?, &pairs)?;
    let found = reduce(
        cx.b,
        cx.b.compare(Direction::Eq, xs, ts)?,
        BinaryOp::Or,
        Scalar::Bool(false),
        &[1],
        false,
    )?;
    let found = if invert { cx.b.unary(UnaryOp::Not, found)? } else { found };
    one(cx.b.reshape(found, x.shape())?)
}

/// `cumsum(self, dim, *, dtype=None)`: integers and bools sum to `i64`. A parallel prefix sum:
/// log2(n) steps, each adding the running sums shifted by 1, 2, 4, ... along `dim`.
pub(super) fn cumsum<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let d = axis(cx.int(1, "dim")?, x.rank())?;
    let out = match cx.opt_dtype(usize::MAX, "dtype")? {
        Some(t) => t,
        None if x.dtype().is_float() => x.dtype(),
        None => DType::I64,
    };
    let mut y = convert(cx.b, x, acc_type(out))?;
    if x.rank() == 0 {
        return one(convert(cx.b, y, out)?);
    }
    let n = dims_of(x)?[d] as i64;
    let rank = x.rank();
    let zero = scalar_const(cx.b, y.dtype(), Scalar::Int(0))?;
    let mut shift = 1i64;
    while shift < n {
        // y[i] += y[i - shift] (0 before the start): the first n - shift entries moved up.
        let (mut low, mut high) = (vec![0i64; rank], vec![0i64; rank]);
        (low[d], high[d]) = (shift, -shift);
        let moved = cx.b.pad(y, zero, &low, &high, &vec![0; rank])?;
        y = cx.b.binary(BinaryOp::Add, y, moved)?;
        shift *= 2;
    }
    one(convert(cx.b, y, out)?)
}

/// `native_group_norm(input, weight, bias, N, C, HxW, group, eps)`: `(out, mean, rstd)`, the
/// statistics `[N, group]` over each group's channels and positions (biased variance, in f32 for
/// 16-bit inputs), the affine per channel.
pub(super) fn group_norm<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let x = cx.tensor(0, "input")?;
    let weight = cx.opt_tensor(1, "weight")?;
    let bias = cx.opt_tensor(2, "bias")?;
    let (n, c, hw, g) = (cx.int(3, "N")?, cx.int(4, "C")?, cx.int(5, "HxW")?, cx.int(6, "group")?);
    let eps = cx.opt_float(7, "eps")?.unwrap_or(1e-5);
    if !x.dtype().is_float() {
        return bad(format!("group_norm needs a float type, got {}", x.ty()));
    }
    let have = dims_of(x)?;
    let numel: u64 = have.iter().product();
    if g <= 0
        || n < 0
        || c % g != 0
        || (n * c * hw) as u64 != numel
        || have.get(1) != Some(&(c as u64))
    {
        return bad(format!("group_norm: N={n}, C={c}, HxW={hw}, group={g} do not fit {}", x.ty()));
    }
    let (n, c, hw, g) = (n as u64, c as u64, hw as u64, g as u64);
    let acc = acc_type(x.dtype());
    let xa = convert(b, x, acc)?;
    let grouped = b.reshape(xa, Shape::of(&[n, g, (c / g) * hw]))?;
    let count = scalar_const(b, acc, Scalar::Float(((c / g) * hw).max(1) as f64))?;
    let s = reduce(b, grouped, BinaryOp::Add, Scalar::Int(0), &[2], true)?;
    let mean = b.binary(BinaryOp::Divide, s, count)?;
    // The variance and the output center the input with their own copies of the mean (one
    // optimization barrier, as `Tensor::copies` in kernel_lib): were `x - mean` one value both
    // passes share, XLA:CPU would write it out whole.
    let copies = b.optimization_barrier(&[mean, mean])?;
    let (mean_var, mean_out) = (copies[0], copies[1]);
    let centered =
        b.binary(BinaryOp::Subtract, grouped, b.broadcast_to(mean_var, &grouped.shape())?)?;
    let sq = b.binary(BinaryOp::Multiply, centered, centered)?;
    let var = b.binary(
        BinaryOp::Divide,
        reduce(b, sq, BinaryOp::Add, Scalar::Int(0), &[2], true)?,
        count,
    )?;
    let eps = scalar_const(b, acc, Scalar::Float(eps))?;
    let rstd = b.unary(UnaryOp::Rsqrt, b.binary(BinaryOp::Add, var, eps)?)?;
    let centered_out =
        b.binary(BinaryOp::Subtract, grouped, b.broadcast_to(mean_out, &grouped.shape())?)?;
    let normed =
        b.binary(BinaryOp::Multiply, centered_out, b.broadcast_to(rstd, &grouped.shape())?)?;
    let mut out = b.reshape(normed, x.shape())?;
    let full = out.ty();
    let per_channel = |t: Tensor<'b>| -> R<Tensor<'b>> {
        let t = convert(b, t, acc)?;
        Ok(b.broadcast_in_dim(t, full.clone(), &[1])?)
    };
    if let Some(w) = weight {
        out = b.binary(BinaryOp::Multiply, out, per_channel(w)?)?;
    }
    if let Some(bb) = bias {
        out = b.binary(BinaryOp::Add, out, per_channel(bb)?)?;
    }
    let stats = Shape::of(&[n, g]);
    Ok(vec![
        convert(b, out, x.dtype())?,
        convert(b, b.reshape(mean, stats.clone())?, x.dtype())?,
        convert(b, b.reshape(rstd, stats)?, x.dtype())?,
    ])
}

/// `native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
/// output_mask)`: `(grad_input, grad_weight, grad_bias)`; with `x̂` the normalised input and `w` the
/// gradient times the channel's weight, `grad_input = rstd · (w - mean(w) - x̂ · mean(w x̂))` over
/// each group. Outputs the mask leaves out are zeros of their declared type.
pub(super) fn group_norm_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (g, x) = (cx.tensor(0, "grad_out")?, cx.tensor(1, "input")?);
    let (mean, rstd) = (cx.tensor(2, "mean")?, cx.tensor(3, "rstd")?);
    let weight = cx.opt_tensor(4, "weight")?;
    let (n, c, hw, groups) =
        (cx.int(5, "N")?, cx.int(6, "C")?, cx.int(7, "HxW")?, cx.int(8, "group")?);
    let mask = cx.bools(9, "output_mask")?;
    if mask.len() != 3 {
        return bad(format!("`output_mask` needs 3 entries, got {mask:?}"));
    }
    let have = dims_of(x)?;
    let numel: u64 = have.iter().product();
    if !x.dtype().is_float()
        || groups <= 0
        || n < 0
        || c % groups != 0
        || (n * c * hw) as u64 != numel
        || have.get(1) != Some(&(c as u64))
        || dims_of(g)? != have
    {
        return bad(format!(
            "group_norm_backward: N={n}, C={c}, HxW={hw}, group={groups} do not fit {} (grad {})",
            x.ty(),
            g.ty()
        ));
    }
    let (n, c, hw, groups) = (n as u64, c as u64, hw as u64, groups as u64);
    let acc = acc_type(x.dtype());
    let by_channel = Shape::of(&[n, c, hw]);
    let grouped = Shape::of(&[n, groups, (c / groups) * hw]);
    let (xa, ga) = (b.reshape(convert(b, x, acc)?, grouped.clone())?, convert(b, g, acc)?);
    let stat = |t: Tensor<'b>| -> R<Tensor<'b>> {
        let t = b.reshape(convert(b, t, acc)?, Shape::of(&[n, groups, 1]))?;
        Ok(b.broadcast_to(t, &grouped)?)
    };
    let xhat =
        b.binary(BinaryOp::Multiply, b.binary(BinaryOp::Subtract, xa, stat(mean)?)?, stat(rstd)?)?;
    // Per-channel sums over the batch and positions.
    let xhat_c = b.reshape(xhat, by_channel.clone())?;
    let g_c = b.reshape(ga, by_channel.clone())?;
    let dbeta = reduce(b, g_c, BinaryOp::Add, Scalar::Int(0), &[0, 2], false)?;
    let dgamma = reduce(
        b,
        b.binary(BinaryOp::Multiply, g_c, xhat_c)?,
        BinaryOp::Add,
        Scalar::Int(0),
        &[0, 2],
        false,
    )?;
    let wg = match weight {
        Some(w) => {
            let w = b.broadcast_in_dim(
                convert(b, w, acc)?,
                TensorType::new(acc, by_channel.clone()),
                &[1],
            )?;
            b.binary(BinaryOp::Multiply, g_c, w)?
        }
        None => g_c,
    };
    let wg = b.reshape(wg, grouped.clone())?;
    let count = scalar_const(b, acc, Scalar::Float(((c / groups) * hw).max(1) as f64))?;
    let group_mean = |t: Tensor<'b>| -> R<Tensor<'b>> {
        let s = reduce(b, t, BinaryOp::Add, Scalar::Int(0), &[2], true)?;
        Ok(b.broadcast_to(b.binary(BinaryOp::Divide, s, count)?, &grouped)?)
    };
    let inner = b.binary(BinaryOp::Subtract, wg, group_mean(wg)?)?;
    let proj =
        b.binary(BinaryOp::Multiply, xhat, group_mean(b.binary(BinaryOp::Multiply, wg, xhat)?)?)?;
    let dx =
        b.binary(BinaryOp::Multiply, b.binary(BinaryOp::Subtract, inner, proj)?, stat(rstd)?)?;
    let dx = b.reshape(dx, x.shape())?;
    let declared = &cx.node.outputs;
    if declared.len() != 3 {
        return bad(format!(
            "native_group_norm_backward declares {} outputs, not 3",
            declared.len()
        ));
    }
    let mut outs = Vec::with_capacity(3);
    for (i, r) in [dx, dgamma, dbeta].into_iter().enumerate() {
        let want = declared[i].clone();
        outs.push(if mask[i] {
            convert(b, r, want.dtype)?
        } else {
            splat(b, want, Scalar::Int(0))?
        });
    }
    Ok(outs)
}

// ----- sorting -----

/// `x` sorted along `d` with its indices (i64), stably; NaN orders above every number, as in
/// PyTorch (last ascending, first descending).
fn sorted<'b>(
    b: &'b KernelBuilder,
    x: Tensor<'b>,
    d: usize,
    descending: bool,
) -> R<(Tensor<'b>, Tensor<'b>)> {
    if x.dtype() == DType::Bool {
        return bad(format!("sort needs a numeric input, got {}", x.ty()));
    }
    let idx = b.iota(x.ty().with_dtype(DType::I64), d as i64)?;
    let float = x.dtype().is_float();
    let r = b.sort(&[x, idx], d as i64, true, |a| {
        let (l, r) = (a[0], a[1]);
        let (first, second, dir) =
            if descending { (r, l, Direction::Lt) } else { (l, r, Direction::Lt) };
        // `first` before `second` when it is smaller (the order reversed for descending).
        let lt = b.compare(dir, first, second)?;
        if !float {
            return Ok(lt);
        }
        let first_num = b.compare(Direction::Eq, first, first)?;
        let second_nan = b.compare(Direction::Ne, second, second)?;
        b.binary(BinaryOp::Or, lt, b.binary(BinaryOp::And, first_num, second_nan)?)
    })?;
    Ok((r[0], r[1]))
}

/// `sort(self, dim=-1, descending=False)` and `sort.stable(self, *, stable, dim, descending)`:
/// `(values, indices)`; always stable (ties keep their order).
pub(super) fn sort<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let stable_overload = cx.node.op.ends_with(".stable");
    let (dim, descending) = if stable_overload {
        (cx.int_or(usize::MAX, "dim", -1)?, cx.bool_or(usize::MAX, "descending", false)?)
    } else {
        (cx.int_or(1, "dim", -1)?, cx.bool_or(2, "descending", false)?)
    };
    if x.rank() == 0 {
        return Ok(vec![x, scalar_const(cx.b, DType::I64, Scalar::Int(0))?]);
    }
    let d = axis(dim, x.rank())?;
    let (v, i) = sorted(cx.b, x, d, descending)?;
    Ok(vec![v, i])
}

/// `topk(self, k, dim=-1, largest=True, sorted=True)`: the `k` largest (smallest) along `dim`,
/// in order, with their indices; among equal values the lower index first.
pub(super) fn topk<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let x = cx.tensor(0, "self")?;
    let k = cx.int(1, "k")?;
    let largest = cx.bool_or(3, "largest", true)?;
    let d = axis(cx.int_or(2, "dim", -1)?, x.rank())?;
    let size = if x.rank() == 0 { 1 } else { dims_of(x)?[d] as i64 };
    if k < 0 || k > size {
        return bad(format!("topk: k = {k} out of range for dim {d} of {}", x.ty()));
    }
    if x.rank() == 0 {
        return Ok(vec![x, scalar_const(b, DType::I64, Scalar::Int(0))?]);
    }
    let (v, i) = sorted(b, x, d, largest)?;
    let dims = dims_of(x)?;
    let start = vec![0i64; dims.len()];
    let mut limit: Vec<i64> = dims.iter().map(|&n| n as i64).collect();
    limit[d] = k;
    let strides = vec![1i64; dims.len()];
    Ok(vec![b.slice(v, &start, &limit, &strides)?, b.slice(i, &start, &limit, &strides)?])
}
