//! Views, layout and shape ops. Values have no strides here: every view is a new value.

use tpu_kernels::{DType, Shape, Tensor, TensorType};

use super::{
    Cx, Operand, R, Scalar, axis, bad, convert, dims_of, one, result_type, scalar_const, splat,
};

type Out<'b> = R<Vec<Tensor<'b>>>;

/// `size` with one `-1` inferred from the element count `n`.
fn infer_size(size: &[i64], n: u64, from: &TensorType) -> R<Vec<u64>> {
    let known: i64 = size.iter().filter(|&&d| d != -1).product();
    let holes = size.iter().filter(|&&d| d == -1).count();
    if holes > 1 || size.iter().any(|&d| d < -1) {
        return bad(format!("bad view size {size:?}"));
    }
    let out: Vec<u64> = if holes == 1 {
        if known == 0 || !n.is_multiple_of(known as u64) {
            return bad(format!("view size {size:?} does not fit {from}"));
        }
        size.iter().map(|&d| if d == -1 { n / known as u64 } else { d as u64 }).collect()
    } else {
        size.iter().map(|&d| d as u64).collect()
    };
    if out.iter().product::<u64>() != n {
        return bad(format!("view size {size:?} does not fit {from}"));
    }
    Ok(out)
}

/// `view`, `_unsafe_view`, `reshape`.
pub(super) fn view<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let size = cx.ints(1, "size")?;
    let n = dims_of(x)?.iter().product();
    let dims = infer_size(&size, n, &x.ty())?;
    one(cx.b.reshape(x, Shape::of(&dims))?)
}

/// `expand(self, size)`: `-1` keeps a dimension; new dimensions lead.
pub(super) fn expand<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let size = cx.ints(1, "size")?;
    let have = dims_of(x)?;
    if size.len() < have.len() {
        return bad(format!("cannot expand {} to {size:?}: fewer dimensions", x.ty()));
    }
    let lead = size.len() - have.len();
    let mut out = Vec::with_capacity(size.len());
    for (i, &s) in size.iter().enumerate() {
        let d = if s == -1 {
            if i < lead {
                return bad(format!("-1 in a new leading dimension of {size:?}"));
            }
            have[i - lead]
        } else if s < 0 {
            return bad(format!("bad expand size {size:?}"));
        } else {
            s as u64
        };
        out.push(d);
    }
    let dims: Vec<i64> = (lead..size.len()).map(|d| d as i64).collect();
    one(cx.b.broadcast_in_dim(x, TensorType::new(x.dtype(), Shape::of(&out)), &dims)?)
}

fn perm<'b>(cx: &Cx<'_, 'b>, x: Tensor<'b>, perm: &[usize]) -> R<Tensor<'b>> {
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(x);
    }
    let p: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
    Ok(cx.b.transpose(x, &p)?)
}

pub(super) fn permute<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let dims = cx.ints(1, "dims")?;
    if dims.len() != x.rank() {
        return bad(format!("permutation {dims:?} does not fit {}", x.ty()));
    }
    let p = dims.iter().map(|&d| axis(d, x.rank())).collect::<R<Vec<_>>>()?;
    one(perm(cx, x, &p)?)
}

pub(super) fn transpose<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    if x.rank() < 2 {
        return one(x);
    }
    let (a, c) = (axis(cx.int(1, "dim0")?, x.rank())?, axis(cx.int(2, "dim1")?, x.rank())?);
    let mut p: Vec<usize> = (0..x.rank()).collect();
    p.swap(a, c);
    one(perm(cx, x, &p)?)
}

pub(super) fn t<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    match x.rank() {
        0 | 1 => one(x),
        2 => one(perm(cx, x, &[1, 0])?),
        r => bad(format!("t() expects a tensor of rank <= 2, got rank {r}")),
    }
}

pub(super) fn unsqueeze<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let d = axis(cx.int(1, "dim")?, x.rank() + 1)?;
    let mut dims = dims_of(x)?;
    dims.insert(d, 1);
    one(cx.b.reshape(x, Shape::of(&dims))?)
}

/// `squeeze()`, `squeeze(dim)`, `squeeze(dims)`: drops the named size-1 dimensions.
pub(super) fn squeeze<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let have = dims_of(x)?;
    let which: Vec<usize> = match cx.opt_ints(1, "dim")? {
        None => (0..x.rank()).collect(),
        Some(ds) => ds.iter().map(|&d| axis(d, x.rank())).collect::<R<_>>()?,
    };
    let dims: Vec<u64> = have
        .iter()
        .enumerate()
        .filter(|(i, d)| !(which.contains(i) && **d == 1))
        .map(|(_, d)| *d)
        .collect();
    if dims == have {
        return one(x);
    }
    one(cx.b.reshape(x, Shape::of(&dims))?)
}

/// Python slice bounds clamped into `0..=size`.
fn clamp_index(i: i64, size: i64) -> i64 {
    let i = if i < 0 { i + size } else { i };
    i.clamp(0, size)
}

/// The `(dim, start, end, step)` arguments at positions `at..at + 4` of a slice of `x`: the dim
/// normalised, the bounds clamped as Python's, the step positive.
fn slice_args(cx: &Cx<'_, '_>, x: Tensor<'_>, at: usize) -> R<(usize, i64, i64, i64)> {
    let d = axis(cx.int_or(at, "dim", 0)?, x.rank())?;
    let size = dims_of(x)?[d] as i64;
    let start = clamp_index(cx.opt_int(at + 1, "start")?.unwrap_or(0), size);
    let end = clamp_index(cx.opt_int(at + 2, "end")?.unwrap_or(size), size).max(start);
    let step = cx.int_or(at + 3, "step", 1)?;
    if step < 1 {
        return bad(format!("slice step {step} must be positive"));
    }
    Ok((d, start, end, step))
}

/// `slice(self, dim=0, start=None, end=None, step=1)`.
pub(super) fn slice<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let (d, start, end, step) = slice_args(cx, x, 1)?;
    let have = dims_of(x)?;
    let size = have[d] as i64;
    if (start, end, step) == (0, size, 1) {
        return one(x);
    }
    let mut lo = vec![0i64; x.rank()];
    let mut hi: Vec<i64> = have.iter().map(|&s| s as i64).collect();
    let mut st = vec![1i64; x.rank()];
    (lo[d], hi[d], st[d]) = (start, end, step);
    one(cx.b.slice(x, &lo, &hi, &st)?)
}

/// `select(self, dim, index)`: one slice, the dimension dropped.
pub(super) fn select<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let d = axis(cx.int(1, "dim")?, x.rank())?;
    let have = dims_of(x)?;
    let size = have[d] as i64;
    let index = cx.int(2, "index")?;
    let i = if index < 0 { index + size } else { index };
    if i < 0 || i >= size {
        return bad(format!("index {index} out of range for dimension {d} of {}", x.ty()));
    }
    let mut lo = vec![0i64; x.rank()];
    let mut hi: Vec<i64> = have.iter().map(|&s| s as i64).collect();
    (lo[d], hi[d]) = (i, i + 1);
    let s = cx.b.slice(x, &lo, &hi, &vec![1; x.rank()])?;
    let mut out = have;
    out.remove(d);
    one(cx.b.reshape(s, Shape::of(&out))?)
}

/// The `tensors` list of `cat`-like op `op`, which takes no `None` entries.
fn tensors_arg<'b>(cx: &Cx<'_, 'b>, op: &str) -> R<Vec<Tensor<'b>>> {
    cx.tensor_list(0, "tensors")?
        .into_iter()
        .map(|t| t.map_or_else(|| bad(format!("{op} takes no `None` entries")), Ok))
        .collect()
}

/// `cat(tensors, dim=0)`, promoting to the common type; legacy empty 1-D tensors are skipped.
pub(super) fn cat<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let ts = tensors_arg(cx, "cat")?;
    let operands: Vec<Operand<'b>> = ts.iter().map(|t| Operand::T(*t)).collect();
    let dt = result_type(&operands);
    let kept: Vec<Tensor<'b>> = ts
        .into_iter()
        .filter(|t| !(t.rank() == 1 && dims_of(*t).is_ok_and(|d| d[0] == 0)))
        .collect();
    let Some(first) = kept.first() else {
        return bad("cat of nothing but empty tensors");
    };
    let d = axis(cx.int_or(1, "dim", 0)?, first.rank())?;
    let kept = kept.iter().map(|t| convert(cx.b, *t, dt)).collect::<R<Vec<_>>>()?;
    if kept.len() == 1 {
        return one(kept[0]);
    }
    one(cx.b.concatenate(&kept, d as i64)?)
}

fn split_into<'b>(cx: &Cx<'_, 'b>, x: Tensor<'b>, sizes: &[u64], d: usize) -> Out<'b> {
    let have = dims_of(x)?;
    if sizes.iter().sum::<u64>() != have[d] {
        return bad(format!("split sizes {sizes:?} do not add up to dimension {d} of {}", x.ty()));
    }
    let mut out = Vec::with_capacity(sizes.len());
    let mut at = 0i64;
    for &s in sizes {
        let mut lo = vec![0i64; x.rank()];
        let mut hi: Vec<i64> = have.iter().map(|&s| s as i64).collect();
        (lo[d], hi[d]) = (at, at + s as i64);
        out.push(if sizes.len() == 1 { x } else { cx.b.slice(x, &lo, &hi, &vec![1; x.rank()])? });
        at += s as i64;
    }
    Ok(out)
}

/// `split(self, split_size, dim=0)`: chunks of `split_size`, the last one shorter.
pub(super) fn split<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let d = axis(cx.int_or(2, "dim", 0)?, x.rank())?;
    let size = dims_of(x)?[d];
    let chunk = cx.int(1, "split_size")?;
    if chunk <= 0 {
        return bad(format!("split_size {chunk} must be positive"));
    }
    let chunk = chunk as u64;
    let mut sizes = vec![chunk; (size / chunk) as usize];
    if !size.is_multiple_of(chunk) || size == 0 {
        sizes.push(size % chunk);
    }
    split_into(cx, x, &sizes, d)
}

pub(super) fn split_with_sizes<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let d = axis(cx.int_or(2, "dim", 0)?, x.rank())?;
    let sizes = cx.ints(1, "split_sizes")?;
    if sizes.iter().any(|&s| s < 0) {
        return bad(format!("negative split size in {sizes:?}"));
    }
    let sizes: Vec<u64> = sizes.iter().map(|&s| s as u64).collect();
    split_into(cx, x, &sizes, d)
}

/// `constant_pad_nd(self, pad, value=0)`: `pad` holds (before, after) pairs from the last
/// dimension backwards; a negative amount crops.
pub(super) fn constant_pad_nd<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let pad = cx.ints(1, "pad")?;
    let rank = x.rank();
    if pad.len() % 2 != 0 || pad.len() / 2 > rank {
        return bad(format!(
            "pad has {} entries: it takes (before, after) pairs for at most the {rank} dims of {}",
            pad.len(),
            x.ty()
        ));
    }
    let value = cx.opt_scalar(2, "value")?.unwrap_or(Scalar::Int(0));
    let (mut low, mut high) = (vec![0i64; rank], vec![0i64; rank]);
    for (k, pair) in pad.chunks(2).enumerate() {
        (low[rank - 1 - k], high[rank - 1 - k]) = (pair[0], pair[1]);
    }
    let have = dims_of(x)?;
    for d in 0..rank {
        if have[d] as i64 + low[d] + high[d] < 0 {
            return bad(format!("pad crops dimension {d} of {} below 0", x.ty()));
        }
    }
    let v = scalar_const(cx.b, x.dtype(), value)?;
    one(cx.b.pad(x, v, &low, &high, &vec![0; rank])?)
}

/// `slice_scatter(self, src, dim=0, start=None, end=None, step=1)`: `self` with the slice
/// `start:end:step` of `dim` replaced by `src`. `src` is spread to its positions by an interior
/// pad, and a mask padded the same way picks it.
pub(super) fn slice_scatter<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    scatter_slice(cx, cx.tensor(0, "self")?, cx.tensor(1, "src")?)
}

/// `slice_backward(grad_output, input_sizes, dim, start, end, step)`: the gradient of a slice,
/// zeros of the input's size with the slice's positions holding `grad_output`.
pub(super) fn slice_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let g = cx.tensor(0, "grad_output")?;
    let sizes = cx.ints(1, "input_sizes")?;
    if let Some(s) = sizes.iter().find(|s| **s < 0) {
        return bad(format!("slice_backward: negative input size {s} in {sizes:?}"));
    }
    let shape = Shape::of(&sizes.iter().map(|&s| s as u64).collect::<Vec<_>>());
    let zeros = splat(cx.b, TensorType::new(g.dtype(), shape), Scalar::Int(0))?;
    scatter_slice(cx, zeros, g)
}

/// `select_backward(grad_output, input_sizes, dim, index)`: zeros of the input's size with
/// `grad_output` at `index` of `dim`.
pub(super) fn select_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let g = cx.tensor(0, "grad_output")?;
    let sizes = cx.ints(1, "input_sizes")?;
    if let Some(s) = sizes.iter().find(|s| **s < 0) {
        return bad(format!("select_backward: negative input size {s} in {sizes:?}"));
    }
    let d = axis(cx.int(2, "dim")?, sizes.len())?;
    let size = sizes[d];
    let raw = cx.int(3, "index")?;
    let index = if raw < 0 { raw + size } else { raw };
    if index < 0 || index >= size {
        return bad(format!(
            "select_backward: index {raw} out of range for dimension {d} of size {size}"
        ));
    }
    let mut want: Vec<u64> = sizes.iter().map(|&s| s as u64).collect();
    want[d] = 1;
    let mut have = dims_of(g)?;
    have.insert(d, 1);
    if have != want {
        return bad(format!(
            "select_backward: grad_output {} does not fit input sizes {sizes:?} at dim {d}",
            g.ty()
        ));
    }
    let g = b.reshape(g, Shape::of(&want))?;
    let (mut low, mut high) = (vec![0i64; sizes.len()], vec![0i64; sizes.len()]);
    (low[d], high[d]) = (index, size - index - 1);
    let zero = scalar_const(b, g.dtype(), Scalar::Int(0))?;
    one(b.pad(g, zero, &low, &high, &vec![0; sizes.len()])?)
}

/// `stack(tensors, dim=0)`: each tensor with a new dimension `dim`, concatenated along it.
pub(super) fn stack<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let ts = tensors_arg(cx, "stack")?;
    let Some(first) = ts.first() else {
        return bad("stack of no tensors");
    };
    let shape = dims_of(*first)?;
    let d = axis(cx.int_or(1, "dim", 0)?, first.rank() + 1)?;
    let operands: Vec<Operand<'b>> = ts.iter().map(|t| Operand::T(*t)).collect();
    let dt = result_type(&operands);
    let mut parts = Vec::with_capacity(ts.len());
    for t in &ts {
        if dims_of(*t)? != shape {
            return bad(format!(
                "stack expects tensors of one size: {} and {}",
                first.ty(),
                t.ty()
            ));
        }
        let mut dims = shape.clone();
        dims.insert(d, 1);
        parts.push(cx.b.reshape(convert(cx.b, *t, dt)?, Shape::of(&dims))?);
    }
    if parts.len() == 1 {
        return one(parts[0]);
    }
    one(cx.b.concatenate(&parts, d as i64)?)
}

/// `x` with the slice of `dim` given by the arguments from position 2 on replaced by `src`.
fn scatter_slice<'b>(cx: &Cx<'_, 'b>, x: Tensor<'b>, src: Tensor<'b>) -> Out<'b> {
    let (d, start, end, step) = slice_args(cx, x, 2)?;
    let have = dims_of(x)?;
    let size = have[d] as i64;
    let n = (end - start + step - 1) / step;
    let mut want = have.clone();
    want[d] = n as u64;
    if dims_of(src)? != want {
        return bad(format!(
            "slice_scatter: src is {}, the slice {start}:{end}:{step} of dim {d} of {} is {want:?}",
            src.ty(),
            x.ty()
        ));
    }
    let src = convert(cx.b, src, x.dtype())?;
    if n == 0 {
        return one(x);
    }
    let rank = x.rank();
    let (mut low, mut high, mut interior) = (vec![0i64; rank], vec![0i64; rank], vec![0i64; rank]);
    low[d] = start;
    interior[d] = step - 1;
    high[d] = size - (start + (n - 1) * step + 1);
    let zero = scalar_const(cx.b, x.dtype(), Scalar::Int(0))?;
    let spread = cx.b.pad(src, zero, &low, &high, &interior)?;
    let ones = splat(cx.b, TensorType::new(DType::Bool, src.shape()), Scalar::Bool(true))?;
    let no = scalar_const(cx.b, DType::Bool, Scalar::Bool(false))?;
    let mask = cx.b.pad(ones, no, &low, &high, &interior)?;
    one(cx.b.select(mask, spread, x)?)
}
