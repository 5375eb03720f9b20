//! Convolutions (plain, grouped, dilated, transposed) and their gradients, batch norm, and max
//! pooling with its indices and gradient.
//!
//! A convolution lowers to one `stablehlo.convolution` in PyTorch's `[N, C, *]` / `[O, I, *]`
//! layout. Its gradients are convolutions too: the input's gradient convolves the output
//! gradient, dilated by the stride, with the kernel flipped and its features swapped per group;
//! the kernel's gradient convolves the input with the output gradient, the batch as the
//! contracted feature (`batch_group_count` = groups). A transposed convolution is the input
//! gradient of the plain one whose kernel it holds, so the same three pieces serve it with the
//! roles swapped. 16-bit floats convolve in f32 and round once, as PyTorch's CPU kernels do.
//!
//! Max pooling reads the window's `k` positions as `k` strided slices of the padded input (no
//! `reduce_window`): the maximum and its first flat index, NaN winning as in PyTorch. Its
//! gradient puts each output gradient back where the saved index points: per window position, a
//! mask times the gradient, spread by interior padding, summed.

use tpu_kernels::ir::{BinaryOp, ConvDims, ConvWindow, Direction, UnaryOp};
use tpu_kernels::{DType, KernelBuilder, Shape, Tensor, TensorType};

use super::reduce::{lowest, reduce};
use super::{Cx, R, Scalar, acc_type, bad, convert, dims_of, one, scalar_const, splat};

type Out<'b> = R<Vec<Tensor<'b>>>;

/// A convolution's static arguments, one entry per spatial dim.
#[derive(Clone, Debug)]
struct Params {
    stride: Vec<i64>,
    padding: Vec<i64>,
    dilation: Vec<i64>,
    groups: u64,
}

/// `v` with one entry per spatial dim (a single entry repeats, as PyTorch's `int[n]` allows).
fn per_dim(v: Vec<i64>, n: usize, name: &str, least: i64) -> R<Vec<i64>> {
    let v = if v.len() == 1 && n > 1 { vec![v[0]; n] } else { v };
    if v.len() != n {
        return bad(format!("`{name}` needs {n} entries for {n} spatial dims, got {v:?}"));
    }
    if let Some(x) = v.iter().find(|&&x| x < least) {
        return bad(format!("`{name}` entries must be >= {least}, got {x}"));
    }
    Ok(v)
}

fn params(cx: &Cx<'_, '_>, at: usize, n: usize) -> R<Params> {
    let stride = per_dim(cx.ints(at, "stride")?, n, "stride", 1)?;
    let padding = per_dim(cx.ints(at + 1, "padding")?, n, "padding", 0)?;
    let dilation = per_dim(cx.ints(at + 2, "dilation")?, n, "dilation", 1)?;
    let groups = cx.int(at + 5, "groups")?;
    if groups < 1 {
        return bad(format!("`groups` must be >= 1, got {groups}"));
    }
    Ok(Params { stride, padding, dilation, groups: groups as u64 })
}

/// `1 + d * (n - 1)`, the extent of `n` taps `d` apart (0 for none).
fn dilated(n: i64, d: i64) -> i64 {
    if n == 0 { 0 } else { 1 + d * (n - 1) }
}

fn spatial(t: Tensor<'_>) -> R<Vec<i64>> {
    Ok(dims_of(t)?[2..].iter().map(|&d| d as i64).collect())
}

/// The operands in the type they convolve in, checked: same float or integer type, rank
/// `n + 2`, the kernel's input features matching the input's per group.
fn operands<'b>(
    b: &'b KernelBuilder,
    x: Tensor<'b>,
    w: Tensor<'b>,
) -> R<(Tensor<'b>, Tensor<'b>, DType)> {
    if x.dtype() != w.dtype() || x.dtype() == DType::Bool {
        return bad(format!(
            "convolution needs input and weight of one numeric type: {} vs {}",
            x.ty(),
            w.ty()
        ));
    }
    if x.rank() < 3 || w.rank() != x.rank() {
        return bad(format!(
            "convolution needs an input [N, C, *] and a weight of the same rank, got {} and {}",
            x.ty(),
            w.ty()
        ));
    }
    let acc = acc_type(x.dtype());
    Ok((convert(b, x, acc)?, convert(b, w, acc)?, x.dtype()))
}

fn window(strides: Vec<i64>, padding: Vec<(i64, i64)>, lhs: Vec<i64>, rhs: Vec<i64>) -> ConvWindow {
    ConvWindow { strides, padding, lhs_dilation: lhs, rhs_dilation: rhs }
}

/// The plain convolution `x [N, C, *] ⋆ w [O, C/g, *]`.
fn conv<'b>(b: &'b KernelBuilder, x: Tensor<'b>, w: Tensor<'b>, p: &Params) -> R<Tensor<'b>> {
    let n = x.rank() - 2;
    let pads = p.padding.iter().map(|&q| (q, q)).collect();
    let win = window(p.stride.clone(), pads, vec![1; n], p.dilation.clone());
    Ok(b.convolution(x, w, ConvDims::channels_first(n), win, p.groups, 1)?)
}

/// The gradient of `conv` for its input, from the output gradient `g [N, O, *]` and the kernel
/// `w [O, C/g, *]`; `size` is the input's spatial size (a strided convolution drops trailing
/// positions, so the output alone does not determine it).
fn conv_input_grad<'b>(
    b: &'b KernelBuilder,
    g: Tensor<'b>,
    w: Tensor<'b>,
    p: &Params,
    size: &[i64],
) -> R<Tensor<'b>> {
    let n = g.rank() - 2;
    let wd = dims_of(w)?;
    let (o, c_per, groups) = (wd[0], wd[1], p.groups);
    if o % groups != 0 {
        return bad(format!(
            "weight {} has {o} output channels, not divisible by {groups} groups",
            w.ty()
        ));
    }
    // [O, C/g, *] -> [g, O/g, C/g, *] -> [g, C/g, O/g, *] -> [C, O/g, *], flipped in space.
    let k: Vec<u64> = wd[2..].to_vec();
    let mut split = vec![groups, o / groups, c_per];
    split.extend(&k);
    let mut perm: Vec<i64> = vec![0, 2, 1];
    perm.extend(3..3 + n as i64);
    let mut merged = vec![groups * c_per, o / groups];
    merged.extend(&k);
    let swapped =
        b.reshape(b.transpose(b.reshape(w, Shape::of(&split))?, &perm)?, Shape::of(&merged))?;
    let flipped = b.reverse(swapped, &(2..2 + n as i64).collect::<Vec<_>>())?;
    let out = spatial(g)?;
    let mut pads = Vec::with_capacity(n);
    for i in 0..n {
        let kd = dilated(k[i] as i64, p.dilation[i]);
        let before = kd - p.padding[i] - 1;
        let after = size[i] + kd - 1 - dilated(out[i], p.stride[i]) - before;
        pads.push((before, after));
    }
    let win = window(vec![1; n], pads, p.stride.clone(), p.dilation.clone());
    Ok(b.convolution(g, flipped, ConvDims::channels_first(n), win, groups, 1)?)
}

/// The gradient of `conv` for its kernel, `[O, C/g, *]` with spatial size `k`, from the input
/// `x [N, C, *]` and the output gradient `g [N, O, *]`: the batch is contracted, the input's
/// channels become the result's batch, one group of them per group of output channels.
fn conv_weight_grad<'b>(
    b: &'b KernelBuilder,
    x: Tensor<'b>,
    g: Tensor<'b>,
    p: &Params,
    k: &[i64],
) -> R<Tensor<'b>> {
    let n = x.rank() - 2;
    let (xs, gs) = (spatial(x)?, spatial(g)?);
    let mut pads = Vec::with_capacity(n);
    for i in 0..n {
        let lo = p.padding[i];
        let hi = dilated(gs[i], p.stride[i]) - xs[i] + dilated(k[i], p.dilation[i]) - lo - 1;
        pads.push((lo, hi));
    }
    let spatial_dims: Vec<i64> = (2..2 + n as i64).collect();
    let dims = ConvDims {
        input_batch: 1,
        input_feature: 0,
        input_spatial: spatial_dims.clone(),
        kernel_input_feature: 0,
        kernel_output_feature: 1,
        kernel_spatial: spatial_dims.clone(),
        output_batch: 1,
        output_feature: 0,
        output_spatial: spatial_dims,
    };
    let win = window(p.dilation.clone(), pads, vec![1; n], p.stride.clone());
    Ok(b.convolution(x, g, dims, win, 1, p.groups)?)
}

/// `b` broadcast along dim 1 of `like`.
fn per_channel<'b>(b: &'b KernelBuilder, t: Tensor<'b>, like: &TensorType) -> R<Tensor<'b>> {
    Ok(b.broadcast_in_dim(t, like.clone(), &[1])?)
}

/// The sum of `g` over every dim but 1: a bias's gradient.
fn channel_sum<'b>(b: &'b KernelBuilder, g: Tensor<'b>) -> R<Tensor<'b>> {
    let dims: Vec<usize> = (0..g.rank()).filter(|&d| d != 1).collect();
    reduce(b, g, BinaryOp::Add, Scalar::Int(0), &dims, false)
}

/// `convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
/// groups)`.
pub(super) fn convolution<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (x0, w0) = (cx.tensor(0, "input")?, cx.tensor(1, "weight")?);
    let bias = cx.opt_tensor(2, "bias")?;
    let (x, w, dt) = operands(b, x0, w0)?;
    let n = x.rank() - 2;
    let p = params(cx, 3, n)?;
    let transposed = cx.bool_or(6, "transposed", false)?;
    let out_pad = per_dim(cx.ints(7, "output_padding")?, n, "output_padding", 0)?;
    let y = if transposed {
        // The input gradient of the plain convolution with kernel `w` [C_in, C_out/g, *].
        let (xs, k) = (spatial(x)?, spatial(w)?);
        let size: Vec<i64> = (0..n)
            .map(|i| {
                (xs[i] - 1) * p.stride[i] - 2 * p.padding[i]
                    + dilated(k[i], p.dilation[i])
                    + out_pad[i]
            })
            .collect();
        if let Some(i) = (0..n).find(|&i| out_pad[i] >= p.stride[i].max(p.dilation[i])) {
            return bad(format!(
                "output_padding {} must be smaller than stride or dilation in spatial dim {i}",
                out_pad[i]
            ));
        }
        conv_input_grad(b, x, w, &p, &size)?
    } else {
        conv(b, x, w, &p)?
    };
    let mut y = y;
    if let Some(bias) = bias {
        let bias = convert(b, bias, y.dtype())?;
        y = b.binary(BinaryOp::Add, y, per_channel(b, bias, &y.ty())?)?;
    }
    one(convert(b, y, dt)?)
}

/// `convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
/// transposed, output_padding, groups, output_mask)`: `(grad_input, grad_weight, grad_bias)`;
/// an output the mask leaves out is zeros of the type the node declares (the graph never reads
/// it).
pub(super) fn convolution_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let g0 = cx.tensor(0, "grad_output")?;
    let (x, w, dt) = operands(b, cx.tensor(1, "input")?, cx.tensor(2, "weight")?)?;
    let g = convert(b, g0, x.dtype())?;
    let n = x.rank() - 2;
    let p = params(cx, 4, n)?;
    let transposed = cx.bool_or(7, "transposed", false)?;
    let mask = cx.bools(10, "output_mask")?;
    if mask.len() != 3 {
        return bad(format!("`output_mask` needs 3 entries, got {mask:?}"));
    }
    let declared = &cx.node.outputs;
    if declared.len() != 3 {
        return bad(format!("convolution_backward declares {} outputs, not 3", declared.len()));
    }
    let mut outs = Vec::with_capacity(3);
    for (i, want) in declared.iter().enumerate() {
        if !mask[i] {
            outs.push(splat(b, want.clone(), Scalar::Int(0))?);
            continue;
        }
        let r = match (i, transposed) {
            (0, false) => conv_input_grad(b, g, w, &p, &spatial(x)?)?,
            // A transposed convolution's input gradient is the plain convolution of its output
            // gradient; its kernel gradient swaps the plain one's input and output.
            (0, true) => conv(b, g, w, &p)?,
            (1, false) => conv_weight_grad(b, x, g, &p, &spatial(w)?)?,
            (1, true) => conv_weight_grad(b, g, x, &p, &spatial(w)?)?,
            _ => channel_sum(b, g)?,
        };
        outs.push(convert(b, r, dt)?);
    }
    Ok(outs)
}

// ----- batch norm -----

/// The per-channel mean and biased variance of `x` [N, C, *] in f32 for 16-bit inputs.
fn channel_stats<'b>(b: &'b KernelBuilder, x: Tensor<'b>) -> R<(Tensor<'b>, Tensor<'b>, u64)> {
    let d = dims_of(x)?;
    let count: u64 = d.iter().enumerate().filter(|(i, _)| *i != 1).map(|(_, n)| n).product();
    let acc = acc_type(x.dtype());
    let xa = convert(b, x, acc)?;
    let c = scalar_const(b, acc, Scalar::Float(count.max(1) as f64))?;
    let mean = b.binary(BinaryOp::Divide, channel_sum(b, xa)?, c)?;
    let centered = b.binary(BinaryOp::Subtract, xa, per_channel(b, mean, &xa.ty())?)?;
    let sq = b.binary(BinaryOp::Multiply, centered, centered)?;
    let var = b.binary(BinaryOp::Divide, channel_sum(b, sq)?, c)?;
    Ok((mean, var, count))
}

/// `(x - mean) * rstd * weight + bias` per channel, in `x`'s type.
fn normalize<'b>(
    b: &'b KernelBuilder,
    x: Tensor<'b>,
    mean: Tensor<'b>,
    rstd: Tensor<'b>,
    weight: Option<Tensor<'b>>,
    bias: Option<Tensor<'b>>,
) -> R<Tensor<'b>> {
    let acc = mean.dtype();
    let xa = convert(b, x, acc)?;
    let full = xa.ty();
    let mut y = b.binary(BinaryOp::Subtract, xa, per_channel(b, mean, &full)?)?;
    y = b.binary(BinaryOp::Multiply, y, per_channel(b, rstd, &full)?)?;
    if let Some(w) = weight {
        y = b.binary(BinaryOp::Multiply, y, per_channel(b, convert(b, w, acc)?, &full)?)?;
    }
    if let Some(bb) = bias {
        y = b.binary(BinaryOp::Add, y, per_channel(b, convert(b, bb, acc)?, &full)?)?;
    }
    convert(b, y, x.dtype())
}

fn check_bn_input(x: Tensor<'_>) -> R<()> {
    if !x.dtype().is_float() || x.rank() < 2 {
        return bad(format!("batch norm needs a float input [N, C, *], got {}", x.ty()));
    }
    Ok(())
}

/// `_native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var,
/// training, momentum, eps)`: `(out, save_mean, save_rstd, new_running_mean, new_running_var)`.
/// Training normalises with the batch's statistics and moves the running ones by `momentum`
/// (the variance unbiased, as PyTorch keeps it); evaluation uses the running ones.
pub(super) fn batch_norm_functional<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let x = cx.tensor(0, "input")?;
    check_bn_input(x)?;
    let (weight, bias) = (cx.opt_tensor(1, "weight")?, cx.opt_tensor(2, "bias")?);
    let (rm, rv) = (cx.tensor(3, "running_mean")?, cx.tensor(4, "running_var")?);
    let training = cx.bool_or(5, "training", true)?;
    let momentum = cx.opt_float(6, "momentum")?.unwrap_or(0.1);
    let eps = cx.opt_float(7, "eps")?.unwrap_or(1e-5);
    let acc = acc_type(x.dtype());
    let eps_t = scalar_const(b, acc, Scalar::Float(eps))?;
    if !training {
        let (m, v) = (convert(b, rm, acc)?, convert(b, rv, acc)?);
        let rstd = b.unary(UnaryOp::Rsqrt, b.binary(BinaryOp::Add, v, eps_t)?)?;
        let y = normalize(b, x, m, rstd, weight, bias)?;
        let declared = |i: usize| declared_output(cx, i);
        let (sm, sr) =
            (splat(b, declared(1)?, Scalar::Int(0))?, splat(b, declared(2)?, Scalar::Int(0))?);
        return Ok(vec![y, sm, sr, rm, rv]);
    }
    let (mean, var, count) = channel_stats(b, x)?;
    let rstd = b.unary(UnaryOp::Rsqrt, b.binary(BinaryOp::Add, var, eps_t)?)?;
    let y = normalize(b, x, mean, rstd, weight, bias)?;
    let unbias = count as f64 / (count.max(2) - 1) as f64;
    let moved = |running: Tensor<'b>, batch: Tensor<'b>, scale: f64| -> R<Tensor<'b>> {
        let r = convert(b, running, acc)?;
        let keep =
            b.binary(BinaryOp::Multiply, r, scalar_const(b, acc, Scalar::Float(1.0 - momentum))?)?;
        let add = b.binary(
            BinaryOp::Multiply,
            batch,
            scalar_const(b, acc, Scalar::Float(momentum * scale))?,
        )?;
        convert(b, b.binary(BinaryOp::Add, keep, add)?, running.dtype())
    };
    Ok(vec![
        y,
        convert(b, mean, declared_output(cx, 1)?.dtype)?,
        convert(b, rstd, declared_output(cx, 2)?.dtype)?,
        moved(rm, mean, 1.0)?,
        moved(rv, var, unbias)?,
    ])
}

/// `native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
/// save_invstd, train, eps, output_mask)`: `(grad_input, grad_weight, grad_bias)`. Training
/// differentiates through the batch's statistics (`save_*`); evaluation through the running ones.
/// Outputs the mask leaves out are zeros of their declared type.
pub(super) fn batch_norm_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (g, x) = (cx.tensor(0, "grad_out")?, cx.tensor(1, "input")?);
    check_bn_input(x)?;
    let weight = cx.opt_tensor(2, "weight")?;
    let training = cx.bool_or(7, "train", true)?;
    let eps = cx.opt_float(8, "eps")?.unwrap_or(1e-5);
    let mask = cx.bools(9, "output_mask")?;
    if mask.len() != 3 {
        return bad(format!("`output_mask` needs 3 entries, got {mask:?}"));
    }
    let acc = acc_type(x.dtype());
    let (xa, ga) = (convert(b, x, acc)?, convert(b, g, acc)?);
    let full = xa.ty();
    let (mean, invstd) = if training {
        let (m, r) = (cx.tensor(5, "save_mean")?, cx.tensor(6, "save_invstd")?);
        (convert(b, m, acc)?, convert(b, r, acc)?)
    } else {
        let (m, v) = (cx.tensor(3, "running_mean")?, cx.tensor(4, "running_var")?);
        let eps_t = scalar_const(b, acc, Scalar::Float(eps))?;
        let v = convert(b, v, acc)?;
        (convert(b, m, acc)?, b.unary(UnaryOp::Rsqrt, b.binary(BinaryOp::Add, v, eps_t)?)?)
    };
    let xhat = b.binary(
        BinaryOp::Multiply,
        b.binary(BinaryOp::Subtract, xa, per_channel(b, mean, &full)?)?,
        per_channel(b, invstd, &full)?,
    )?;
    let dbeta = channel_sum(b, ga)?;
    let dgamma = channel_sum(b, b.binary(BinaryOp::Multiply, ga, xhat)?)?;
    let gamma = match weight {
        Some(w) => convert(b, w, acc)?,
        None => splat(b, invstd.ty(), Scalar::Int(1))?,
    };
    let scale = per_channel(b, b.binary(BinaryOp::Multiply, gamma, invstd)?, &full)?;
    let dx = if training {
        let d = dims_of(x)?;
        let count: u64 = d.iter().enumerate().filter(|(i, _)| *i != 1).map(|(_, n)| n).product();
        let inv_m = scalar_const(b, acc, Scalar::Float(1.0 / count.max(1) as f64))?;
        let mb = per_channel(b, b.binary(BinaryOp::Multiply, dbeta, inv_m)?, &full)?;
        let mg = per_channel(b, b.binary(BinaryOp::Multiply, dgamma, inv_m)?, &full)?;
        let inner = b.binary(BinaryOp::Subtract, ga, mb)?;
        let inner = b.binary(BinaryOp::Subtract, inner, b.binary(BinaryOp::Multiply, xhat, mg)?)?;
        b.binary(BinaryOp::Multiply, inner, scale)?
    } else {
        b.binary(BinaryOp::Multiply, ga, scale)?
    };
    let results = [dx, dgamma, dbeta];
    let mut outs = Vec::with_capacity(3);
    for (i, r) in results.into_iter().enumerate() {
        let want = declared_output(cx, i)?;
        outs.push(if mask[i] {
            convert(b, r, want.dtype)?
        } else {
            splat(b, want, Scalar::Int(0))?
        });
    }
    Ok(outs)
}

/// `upsample_nearest2d(input, output_size, scales_h=None, scales_w=None)` at whole factors
/// (each output size a multiple of the input's): every pixel repeated.
pub(super) fn upsample_nearest2d<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let x = cx.tensor(0, "input")?;
    let out = cx.ints(1, "output_size")?;
    let (nc, hw) = nearest_factors(cx, x, &out, 2)?;
    let d = dims_of(x)?;
    let (h, w, fh, fw) = (d[2], d[3], hw[0], hw[1]);
    // [N, C, H, W] -> [N, C, H, fh, W, fw] -> [N, C, H fh, W fw]
    let wide = TensorType::new(x.dtype(), Shape::of(&[nc.0, nc.1, h, fh, w, fw]));
    let spread = b.broadcast_in_dim(x, wide, &[0, 1, 2, 4])?;
    one(b.reshape(spread, Shape::of(&[nc.0, nc.1, h * fh, w * fw]))?)
}

/// `upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h, scales_w)`:
/// each input pixel's gradient is the sum over the pixels it was repeated into.
pub(super) fn upsample_nearest2d_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let g = cx.tensor(0, "grad_output")?;
    let out = cx.ints(1, "output_size")?;
    let input = cx.ints(2, "input_size")?;
    if input.len() != 4 || out.len() != 2 || dims_of(g)?[2..] != [out[0] as u64, out[1] as u64] {
        return bad(format!(
            "upsample_nearest2d_backward: grad {} against output size {out:?}, input size {input:?}",
            g.ty()
        ));
    }
    let (h, w) = (input[2], input[3]);
    if h <= 0 || w <= 0 || out[0] % h != 0 || out[1] % w != 0 {
        return bad(format!(
            "upsample_nearest2d_backward: output {out:?} is no whole multiple of input {input:?}"
        ));
    }
    let (fh, fw) = ((out[0] / h) as u64, (out[1] / w) as u64);
    let d = dims_of(g)?;
    let acc = acc_type(g.dtype());
    let ga = convert(b, g, acc)?;
    let blocks = b.reshape(ga, Shape::of(&[d[0], d[1], h as u64, fh, w as u64, fw]))?;
    let summed = reduce(b, blocks, BinaryOp::Add, Scalar::Int(0), &[3, 5], false)?;
    one(convert(b, summed, g.dtype())?)
}

/// `(N, C)` and the whole factors of the last `n` dims between `x` and `out`.
fn nearest_factors(
    cx: &Cx<'_, '_>,
    x: Tensor<'_>,
    out: &[i64],
    n: usize,
) -> R<((u64, u64), Vec<u64>)> {
    let d = dims_of(x)?;
    if d.len() != n + 2 || out.len() != n {
        return bad(format!(
            "upsample_nearest{n}d needs an input [N, C, {n} dims] and {n} output sizes, got {} and {out:?}",
            x.ty()
        ));
    }
    for k in 0..2 {
        let name = if k == 0 { "scales_h" } else { "scales_w" };
        if let Some(s) = cx.opt_float(2 + k, name)? {
            // PyTorch's index from a given scale, floor(i / s), agrees with the sizes' ratio
            // only when the scale is that ratio.
            if (s - out[k] as f64 / d[2 + k] as f64).abs() > 1e-12 {
                return bad(format!("upsample_nearest2d: scale {s} is not output / input size"));
            }
        }
    }
    let mut f = Vec::with_capacity(n);
    for k in 0..n {
        let (i, o) = (d[2 + k], out[k]);
        if i == 0 || o <= 0 || !(o as u64).is_multiple_of(i) {
            return bad(format!(
                "upsample_nearest2d: output size {out:?} is no whole multiple of {}",
                x.ty()
            ));
        }
        f.push(o as u64 / i);
    }
    Ok(((d[0], d[1]), f))
}

/// The type the node declares for its output `i`.
fn declared_output(cx: &Cx<'_, '_>, i: usize) -> R<TensorType> {
    match cx.node.outputs.get(i) {
        Some(t) => Ok(t.clone()),
        None => bad(format!(
            "the node declares {} outputs, output {i} is missing",
            cx.node.outputs.len()
        )),
    }
}

// ----- max pooling -----

/// The window's taps: for each window position, the strided slice of the padded input it reads
/// and the unpadded input coordinates (per spatial dim) of the slice's first element.
struct Pool {
    kernel: Vec<i64>,
    stride: Vec<i64>,
    padding: Vec<i64>,
    dilation: Vec<i64>,
    /// Input spatial size.
    size: Vec<i64>,
    /// Output spatial size.
    out: Vec<i64>,
}

impl Pool {
    fn new(cx: &Cx<'_, '_>, x: Tensor<'_>, at: usize) -> R<Pool> {
        let n = 2;
        if x.rank() != 3 && x.rank() != 4 {
            return bad(format!(
                "max_pool2d needs an input [N, C, H, W] or [C, H, W], got {}",
                x.ty()
            ));
        }
        let kernel = per_dim(cx.ints(at, "kernel_size")?, n, "kernel_size", 1)?;
        let stride = match cx.opt_ints(at + 1, "stride")? {
            Some(s) if !s.is_empty() => per_dim(s, n, "stride", 1)?,
            _ => kernel.clone(),
        };
        let padding = per_dim(cx.opt_ints(at + 2, "padding")?.unwrap_or(vec![0]), n, "padding", 0)?;
        let dilation =
            per_dim(cx.opt_ints(at + 3, "dilation")?.unwrap_or(vec![1]), n, "dilation", 1)?;
        let ceil = cx.bool_or(at + 4, "ceil_mode", false)?;
        let d = dims_of(x)?;
        let size: Vec<i64> = d[d.len() - 2..].iter().map(|&v| v as i64).collect();
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if padding[i] > dilated(kernel[i], dilation[i]) / 2 {
                return bad(format!(
                    "max_pool2d: padding {} must be at most half the dilated kernel size {}",
                    padding[i],
                    dilated(kernel[i], dilation[i])
                ));
            }
            let span = size[i] + 2 * padding[i] - dilated(kernel[i], dilation[i]);
            let mut o =
                if ceil { (span + stride[i] - 1) / stride[i] + 1 } else { span / stride[i] + 1 };
            // A last window that starts in the right padding is dropped (PyTorch's rule).
            if ceil && (o - 1) * stride[i] >= size[i] + padding[i] {
                o -= 1;
            }
            if o < 1 {
                return bad(format!("max_pool2d: the window does not fit input {}", x.ty()));
            }
            out.push(o);
        }
        Ok(Pool { kernel, stride, padding, dilation, size, out })
    }

    /// High padding so every tap's strided slice stays inside.
    fn high_pad(&self, i: usize) -> i64 {
        let need = (self.out[i] - 1) * self.stride[i] + dilated(self.kernel[i], self.dilation[i]);
        (need - self.size[i] - self.padding[i]).max(0)
    }

    /// The unpadded input coordinates (row, column, flat index over the plane) that the tap at
    /// window offset `(dh, dw)` reads for each output position, from the output's row and
    /// column iotas: `o * stride - padding + offset`.
    fn tap_coordinates<'b>(
        &self,
        b: &'b KernelBuilder,
        rows: Tensor<'b>,
        cols: Tensor<'b>,
        dh: i64,
        dw: i64,
    ) -> R<(Tensor<'b>, Tensor<'b>, Tensor<'b>)> {
        let c = |v: i64| scalar_const(b, DType::I64, Scalar::Int(v));
        let at = |o: Tensor<'b>, i: usize, off: i64| -> R<Tensor<'b>> {
            let scaled = b.binary(BinaryOp::Multiply, o, c(self.stride[i])?)?;
            Ok(b.binary(BinaryOp::Add, scaled, c(off - self.padding[i])?)?)
        };
        let (h, w) = (at(rows, 0, dh)?, at(cols, 1, dw)?);
        let flat =
            b.binary(BinaryOp::Add, b.binary(BinaryOp::Multiply, h, c(self.size[1])?)?, w)?;
        Ok((h, w, flat))
    }

    fn taps(&self) -> Vec<(i64, i64)> {
        let mut t = Vec::new();
        for a in 0..self.kernel[0] {
            for c in 0..self.kernel[1] {
                t.push((a * self.dilation[0], c * self.dilation[1]));
            }
        }
        t
    }
}

/// `x` as rank 4 (a batch of one for `[C, H, W]`).
fn batched<'b>(b: &'b KernelBuilder, x: Tensor<'b>) -> R<Tensor<'b>> {
    if x.rank() == 4 {
        return Ok(x);
    }
    let mut d = vec![1];
    d.extend(dims_of(x)?);
    Ok(b.reshape(x, Shape::of(&d))?)
}

/// `max_pool2d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode)`:
/// `(out, indices)`, the indices flat over each plane's `H * W` (i64).
pub(super) fn max_pool2d_with_indices<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let x0 = cx.tensor(0, "input")?;
    if x0.dtype() == DType::Bool {
        return bad(format!("max_pool2d needs a numeric input, got {}", x0.ty()));
    }
    let pool = Pool::new(cx, x0, 1)?;
    let x = batched(b, x0)?;
    let d = dims_of(x)?;
    let (nb, c) = (d[0] as i64, d[1] as i64);
    let fill = scalar_const(b, x.dtype(), lowest(x.dtype()))?;
    let (hp, wp) = (pool.high_pad(0), pool.high_pad(1));
    let padded =
        b.pad(x, fill, &[0, 0, pool.padding[0], pool.padding[1]], &[0, 0, hp, wp], &[0; 4])?;
    let out_ty = TensorType::new(
        DType::I64,
        Shape::of(&[nb as u64, c as u64, pool.out[0] as u64, pool.out[1] as u64]),
    );
    let rows = b.iota(out_ty.clone(), 2)?;
    let cols = b.iota(out_ty.clone(), 3)?;
    let i64c = |v: i64| scalar_const(b, DType::I64, Scalar::Int(v));
    let mut best: Option<(Tensor<'b>, Tensor<'b>, Tensor<'b>)> = None;
    for (dh, dw) in pool.taps() {
        let tap = b.slice(
            padded,
            &[0, 0, dh, dw],
            &[
                nb,
                c,
                dh + (pool.out[0] - 1) * pool.stride[0] + 1,
                dw + (pool.out[1] - 1) * pool.stride[1] + 1,
            ],
            &[1, 1, pool.stride[0], pool.stride[1]],
        )?;
        let (h, w, idx) = pool.tap_coordinates(b, rows, cols, dh, dw)?;
        let inside = |v: Tensor<'b>, n: i64| -> R<Tensor<'b>> {
            let lo = b.compare(Direction::Ge, v, i64c(0)?)?;
            Ok(b.binary(BinaryOp::And, lo, b.compare(Direction::Lt, v, i64c(n)?)?)?)
        };
        let valid = b.binary(BinaryOp::And, inside(h, pool.size[0])?, inside(w, pool.size[1])?)?;
        best = Some(match best {
            None => (tap, idx, valid),
            Some((m, mi, mvalid)) => {
                // As PyTorch's loop over the window's valid positions: strictly greater, or
                // NaN, takes the place (the first maximum wins, the last NaN); padding never.
                let mut better = b.compare(Direction::Gt, tap, m)?;
                if tap.dtype().is_float() {
                    better = b.binary(BinaryOp::Or, better, b.compare(Direction::Ne, tap, tap)?)?;
                }
                let first = b.unary(UnaryOp::Not, mvalid)?;
                let take =
                    b.binary(BinaryOp::And, valid, b.binary(BinaryOp::Or, better, first)?)?;
                (
                    b.select(take, tap, m)?,
                    b.select(take, idx, mi)?,
                    b.binary(BinaryOp::Or, mvalid, valid)?,
                )
            }
        });
    }
    let Some((m, mi, _)) = best else { return bad("max_pool2d: an empty window") };
    let (m, mi) = if x0.rank() == 3 {
        let s = Shape::of(&[c as u64, pool.out[0] as u64, pool.out[1] as u64]);
        (b.reshape(m, s.clone())?, b.reshape(mi, s)?)
    } else {
        (m, mi)
    };
    Ok(vec![m, mi])
}

/// `max_pool2d_with_indices_backward(grad_output, input, kernel_size, stride, padding,
/// dilation, ceil_mode, indices)`: each output gradient added where its index points.
pub(super) fn max_pool2d_with_indices_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let g0 = cx.tensor(0, "grad_output")?;
    let x0 = cx.tensor(1, "input")?;
    let idx0 = cx.tensor(7, "indices")?;
    let pool = Pool::new(cx, x0, 2)?;
    let (g, x, idx) = (batched(b, g0)?, batched(b, x0)?, batched(b, idx0)?);
    if g.shape() != idx.shape() || dims_of(g)?[2..] != [pool.out[0] as u64, pool.out[1] as u64] {
        return bad(format!(
            "max_pool2d backward: grad {} and indices {} must have the pooled shape",
            g.ty(),
            idx.ty()
        ));
    }
    let d = dims_of(x)?;
    let acc = acc_type(g.dtype());
    let ga = convert(b, g, acc)?;
    let idx = convert(b, idx, DType::I64)?;
    let zero = scalar_const(b, acc, Scalar::Int(0))?;
    let zeros = splat(b, ga.ty(), Scalar::Int(0))?;
    let out_ty = idx.ty();
    let rows = b.iota(out_ty.clone(), 2)?;
    let cols = b.iota(out_ty, 3)?;
    let (hp, wp) = (pool.high_pad(0), pool.high_pad(1));
    let (ph, pw) = (pool.size[0] + pool.padding[0] + hp, pool.size[1] + pool.padding[1] + wp);
    let mut total: Option<Tensor<'b>> = None;
    for (dh, dw) in pool.taps() {
        let (_, _, at) = pool.tap_coordinates(b, rows, cols, dh, dw)?;
        let hit = b.compare(Direction::Eq, idx, at)?;
        let part = b.select(hit, ga, zeros)?;
        // Output position o of this tap sits at o * stride + offset of the padded input.
        let span = |i: usize, off: i64| off + (pool.out[i] - 1) * pool.stride[i] + 1;
        let spread = b.pad(
            part,
            zero,
            &[0, 0, dh, dw],
            &[0, 0, ph - span(0, dh), pw - span(1, dw)],
            &[0, 0, pool.stride[0] - 1, pool.stride[1] - 1],
        )?;
        total = Some(match total {
            None => spread,
            Some(t) => b.binary(BinaryOp::Add, t, spread)?,
        });
    }
    let Some(total) = total else { return bad("max_pool2d backward: an empty window") };
    let (nb, c) = (d[0] as i64, d[1] as i64);
    let cropped = b.slice(
        total,
        &[0, 0, pool.padding[0], pool.padding[1]],
        &[nb, c, pool.padding[0] + pool.size[0], pool.padding[1] + pool.size[1]],
        &[1; 4],
    )?;
    let r = convert(b, cropped, g0.dtype())?;
    one(if x0.rank() == 3 { b.reshape(r, x0.shape())? } else { r })
}
