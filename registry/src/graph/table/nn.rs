//! Matmuls, indexing (one-hot), softmax, losses and attention.

use tpu_kernels::ir::{BinaryOp, Direction, DotDims, GatherDims, Precision, ScatterDims, UnaryOp};
use tpu_kernels::{DType, KernelBuilder, Shape, Tensor, TensorType};

use super::reduce::reduce;
use super::{
    Cx, R, Scalar, acc_type, axis, bad, broadcast_all, convert, dims_of, one, scalar_const, splat,
};

type Out<'b> = R<Vec<Tensor<'b>>>;

// ----- matmul -----

/// `dot_general` that accumulates 16-bit floats in f32 and rounds once, as PyTorch's CPU does.
fn dot<'b>(
    b: &'b KernelBuilder,
    x: Tensor<'b>,
    y: Tensor<'b>,
    dims: DotDims,
    precision: Option<[Precision; 2]>,
) -> R<Tensor<'b>> {
    let dt = x.dtype();
    if y.dtype() != dt {
        return bad(format!("matmul operands differ in type: {} vs {}", x.ty(), y.ty()));
    }
    let acc = acc_type(dt);
    let out = (acc != dt).then_some(acc);
    let r = b.dot_general(x, y, dims, precision, out)?;
    convert(b, r, dt)
}

/// Dimension numbers with `n` leading batch dims, contracting `lc` of the lhs with `rc` of the rhs.
fn batched(n: usize, lc: usize, rc: usize) -> DotDims {
    let batch: Vec<i64> = (0..n as i64).collect();
    DotDims {
        lhs_batch: batch.clone(),
        rhs_batch: batch,
        lhs_contracting: vec![lc as i64],
        rhs_contracting: vec![rc as i64],
    }
}

fn rank_is(t: Tensor<'_>, rank: usize, name: &str) -> R<()> {
    if t.rank() != rank {
        return bad(format!("`{name}` must have rank {rank}, got {}", t.ty()));
    }
    Ok(())
}

pub(super) fn mm<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, y) = (cx.tensor(0, "self")?, cx.tensor(1, "mat2")?);
    rank_is(x, 2, "self")?;
    rank_is(y, 2, "mat2")?;
    one(dot(cx.b, x, y, batched(0, 1, 0), None)?)
}

pub(super) fn bmm<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, y) = (cx.tensor(0, "self")?, cx.tensor(1, "mat2")?);
    rank_is(x, 3, "self")?;
    rank_is(y, 3, "mat2")?;
    one(dot(cx.b, x, y, batched(1, 2, 1), None)?)
}

/// `beta * self + alpha * (mat1 @ mat2)`; with `beta == 0`, `self` is ignored.
pub(super) fn addmm<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (bias, x, y) = (cx.tensor(0, "self")?, cx.tensor(1, "mat1")?, cx.tensor(2, "mat2")?);
    rank_is(x, 2, "mat1")?;
    rank_is(y, 2, "mat2")?;
    let beta = cx.opt_scalar(usize::MAX, "beta")?.map_or(1.0, Scalar::as_f64);
    let alpha = cx.opt_scalar(usize::MAX, "alpha")?.map_or(1.0, Scalar::as_f64);
    let dt = x.dtype();
    let mut p = dot(b, x, y, batched(0, 1, 0), None)?;
    if alpha != 1.0 {
        p = b.binary(BinaryOp::Multiply, p, scalar_const(b, dt, Scalar::Float(alpha))?)?;
    }
    if beta == 0.0 {
        return one(p);
    }
    let mut bias = convert(b, bias, dt)?;
    if beta != 1.0 {
        bias = b.binary(BinaryOp::Multiply, bias, scalar_const(b, dt, Scalar::Float(beta))?)?;
    }
    let v = broadcast_all(b, &[bias, p])?;
    one(b.binary(BinaryOp::Add, v[0], v[1])?)
}

// ----- one-hot indexing -----

fn index_tensor(t: Tensor<'_>, name: &str) -> R<()> {
    if !t.dtype().is_integer() {
        return bad(format!("`{name}` must be an integer tensor, got {}", t.ty()));
    }
    Ok(())
}

/// `idx` with each negative index `i` taken as `i + size`, as PyTorch's indexing reads it.
fn wrap_negative<'b>(b: &'b KernelBuilder, idx: Tensor<'b>, size: i64) -> R<Tensor<'b>> {
    let dt = idx.dtype();
    let zero = scalar_const(b, dt, Scalar::Int(0))?;
    let n = scalar_const(b, dt, Scalar::Int(size))?;
    let neg = b.compare(Direction::Lt, idx, zero)?;
    let wrapped = b.binary(BinaryOp::Add, idx, n)?;
    let v = broadcast_all(b, &[neg, wrapped, idx])?;
    Ok(b.select(v[0], v[1], v[2])?)
}

/// `onehot[..., k] = (idx[...] == k)` for `k` in `0..size` (negative indices wrap): `I + [size]`.
fn one_hot<'b>(b: &'b KernelBuilder, idx: Tensor<'b>, size: u64) -> R<Tensor<'b>> {
    let dt = idx.dtype();
    let idx = wrap_negative(b, idx, size as i64)?;
    let mut dims = dims_of(idx)?;
    let r = dims.len();
    dims.push(size);
    let ty = TensorType::new(dt, Shape::of(&dims));
    let map: Vec<i64> = (0..r as i64).collect();
    let wide = b.broadcast_in_dim(idx, ty.clone(), &map)?;
    let iota = b.iota(ty, r as i64)?;
    Ok(b.compare(Direction::Eq, wide, iota)?)
}

/// `table[idx]` along the first dimension: `I + table.shape[1:]`, by a gather of whole rows.
/// Negative indices wrap as in PyTorch; a row whose index is still outside the table is zero
/// (the gather alone would clamp it onto the first or last row).
fn take_rows<'b>(b: &'b KernelBuilder, table: Tensor<'b>, idx: Tensor<'b>) -> R<Tensor<'b>> {
    let dims = dims_of(table)?;
    let (rows, rest) = (dims[0], &dims[1..]);
    let is = dims_of(idx)?;
    let r = is.len();
    let out_ty = TensorType::new(table.dtype(), Shape::of(&[&is[..], rest].concat()));
    let zeros = splat(b, out_ty.clone(), Scalar::Int(0))?;
    if rows == 0 {
        return Ok(zeros);
    }
    let idx = wrap_negative(b, idx, rows as i64)?;
    let gather = GatherDims {
        offset_dims: (r..r + rest.len()).map(|d| d as i64).collect(),
        collapsed_slice_dims: vec![0],
        start_index_map: vec![0],
        index_vector_dim: r as i64,
        ..Default::default()
    };
    let sizes: Vec<i64> = std::iter::once(1).chain(rest.iter().map(|&d| d as i64)).collect();
    let picked = b.gather(table, idx, gather, &sizes)?;
    let inside = in_range(b, idx, rows)?;
    let map: Vec<i64> = (0..r as i64).collect();
    let inside = b.broadcast_in_dim(inside, out_ty.with_dtype(DType::Bool), &map)?;
    Ok(b.select(inside, picked, zeros)?)
}

/// `embedding(weight, indices, ...)`: the weight's rows, gathered.
pub(super) fn embedding<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (w, idx) = (cx.tensor(0, "weight")?, cx.tensor(1, "indices")?);
    rank_is(w, 2, "weight")?;
    index_tensor(idx, "indices")?;
    one(take_rows(cx.b, w, idx)?)
}

/// The gradient's rows added into a zero table at their indices (a scatter); rows at
/// `padding_idx` get no gradient.
pub(super) fn embedding_dense_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (g, idx) = (cx.tensor(0, "grad_output")?, cx.tensor(1, "indices")?);
    index_tensor(idx, "indices")?;
    let num = cx.int(2, "num_weights")?;
    let padding = cx.int_or(3, "padding_idx", -1)?;
    if cx.bool_or(4, "scale_grad_by_freq", false)? {
        return bad("scale_grad_by_freq=True is not lowered");
    }
    if num < 0 {
        return bad(format!("num_weights {num} is negative"));
    }
    // The rows of the gradient added into a zero table by a scatter, in f32 for 16-bit floats
    // as PyTorch's CPU accumulates. Negative indices wrap; the padding row, and any index still
    // outside the table, point past its end, where the scatter skips them.
    let dt = idx.dtype();
    let n = scalar_const(b, dt, Scalar::Int(num))?;
    let mut rows = wrap_negative(b, idx, num)?;
    if padding >= 0 {
        let p = scalar_const(b, dt, Scalar::Int(padding))?;
        let v = broadcast_all(b, &[idx, p, n])?;
        let at_padding = b.compare(Direction::Eq, v[0], v[1])?;
        rows = b.select(at_padding, v[2], rows)?;
    }
    let gd = dims_of(g)?;
    let r = idx.rank();
    let acc = acc_type(g.dtype());
    let width: Vec<u64> = gd[r..].to_vec();
    let table_ty = TensorType::new(acc, Shape::of(&[&[num as u64][..], &width[..]].concat()));
    let table = splat(b, table_ty, Scalar::Int(0))?;
    let dims = ScatterDims {
        update_window_dims: (r..gd.len()).map(|d| d as i64).collect(),
        inserted_window_dims: vec![0],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: r as i64,
        ..Default::default()
    };
    let summed = b.scatter(table, rows, convert(b, g, acc)?, dims, |cur, new| {
        b.binary(BinaryOp::Add, cur, new)
    })?;
    one(convert(b, summed, g.dtype())?)
}

/// The single index tensor of an `indices` list (`Tensor?[]`): only `[idx]` (trailing `None`s
/// allowed) is lowered.
/// PyTorch's advanced indexing (`self[..., i, ..., j, ...]` with integer index tensors on any
/// dims) reduced to one index on the first dimension: the indexed dims moved first and
/// flattened, the index tensors broadcast together and combined into one linear index.
struct Advanced<'b> {
    /// `self` as `[P, rest...]`: P the product of the indexed dims' sizes, `rest` the others.
    flat: Tensor<'b>,
    /// The linear index into P, of the index tensors' broadcast shape `I`.
    idx: Tensor<'b>,
    /// The permutation that moved the indexed dims first.
    perm: Vec<usize>,
    /// `self`'s indexed dims' sizes, then the others', in `perm`'s order.
    permuted: Vec<u64>,
    /// Where `I`'s dims stand in the result among the `rest` dims: after the dims before the
    /// first indexed one when the indexed dims are adjacent (PyTorch's rule), else first.
    at: usize,
}

impl<'b> Advanced<'b> {
    fn new(b: &'b KernelBuilder, x: Tensor<'b>, list: &[Option<Tensor<'b>>]) -> R<Advanced<'b>> {
        let have = dims_of(x)?;
        if list.len() > have.len() {
            return bad(format!("{} index tensors for {}", list.len(), x.ty()));
        }
        let mut dims = Vec::new();
        let mut idxs = Vec::new();
        for (d, t) in list.iter().enumerate() {
            if let Some(t) = t {
                if t.dtype() == DType::Bool {
                    return bad("boolean mask indices give data-dependent shapes; not lowered");
                }
                index_tensor(*t, "indices")?;
                dims.push(d);
                idxs.push(convert(b, *t, DType::I64)?);
            }
        }
        if dims.is_empty() {
            return bad("no index tensor");
        }
        let idxs = broadcast_all(b, &idxs)?;
        let mut linear: Option<Tensor<'b>> = None;
        for (j, (&d, &t)) in dims.iter().zip(&idxs).enumerate() {
            let size = scalar_const(b, DType::I64, Scalar::Int(have[d] as i64))?;
            let zero = scalar_const(b, DType::I64, Scalar::Int(0))?;
            let neg = b.compare(Direction::Lt, t, zero)?;
            let wrapped = b.binary(BinaryOp::Add, t, size)?;
            let v = broadcast_all(b, &[neg, wrapped, t])?;
            let t = b.select(v[0], v[1], v[2])?;
            let stride: u64 = dims[j + 1..].iter().map(|&e| have[e]).product();
            let term = if stride == 1 {
                t
            } else {
                let s = scalar_const(b, DType::I64, Scalar::Int(stride as i64))?;
                b.binary(BinaryOp::Multiply, t, s)?
            };
            linear = Some(match linear {
                None => term,
                Some(acc) => b.binary(BinaryOp::Add, acc, term)?,
            });
        }
        let others: Vec<usize> = (0..have.len()).filter(|d| !dims.contains(d)).collect();
        let perm: Vec<usize> = dims.iter().chain(&others).copied().collect();
        let permuted: Vec<u64> = perm.iter().map(|&d| have[d]).collect();
        let moved = if perm.iter().enumerate().all(|(i, &d)| i == d) {
            x
        } else {
            let p: Vec<i64> = perm.iter().map(|&d| d as i64).collect();
            b.transpose(x, &p)?
        };
        let mut flat_dims = vec![dims.iter().map(|&d| have[d]).product::<u64>()];
        flat_dims.extend(others.iter().map(|&d| have[d]));
        let flat = b.reshape(moved, Shape::of(&flat_dims))?;
        let adjacent = dims.windows(2).all(|w| w[1] == w[0] + 1);
        let at = if adjacent { dims[0] } else { 0 };
        Ok(Advanced { flat, idx: linear.expect("one index at least"), perm, permuted, at })
    }

    /// The order that takes `[I..., rest...]` to the result's `[rest[..at], I..., rest[at..]]`.
    fn placement(&self) -> Vec<i64> {
        let r = self.idx.rank();
        let n_rest = self.flat.rank() - 1;
        (r..r + self.at).chain(0..r).chain(r + self.at..r + n_rest).map(|d| d as i64).collect()
    }
}

/// `self[indices]`: PyTorch's advanced indexing with integer index tensors.
pub(super) fn index<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    if x.rank() == 0 {
        return bad("cannot index a 0-dim tensor");
    }
    let list = cx.tensor_list(1, "indices")?;
    indexed(cx.b, x, &list)
}

/// `x[list]`: the indexed rows, in PyTorch's placement of the indexed dims.
fn indexed<'b>(b: &'b KernelBuilder, x: Tensor<'b>, list: &[Option<Tensor<'b>>]) -> Out<'b> {
    let adv = Advanced::new(b, x, list)?;
    let rows = take_rows(b, adv.flat, adv.idx)?;
    let order = adv.placement();
    if order.iter().enumerate().all(|(i, &d)| i as i64 == d) {
        return one(rows);
    }
    one(b.transpose(rows, &order)?)
}

/// `index_select(self, dim, index)`: `self` indexed along `dim` by a 1-D `index` (a 0-D one is
/// one entry), the other dims whole.
pub(super) fn index_select<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    if x.rank() == 0 {
        return bad("cannot index_select from a 0-dim tensor");
    }
    let d = axis(cx.int(1, "dim")?, x.rank())?;
    let index = cx.tensor(2, "index")?;
    let index = match index.rank() {
        0 => cx.b.reshape(index, Shape::of(&[1]))?,
        1 => index,
        r => return bad(format!("index_select needs a 1-D index, got rank {r}")),
    };
    let mut list = vec![None; d];
    list.push(Some(index));
    indexed(cx.b, x, &list)
}

/// `index_put(self, indices, values, accumulate)`: the written values go to the flattened
/// indexed rows (see [`put_rows`]), then back to `self`'s layout.
pub(super) fn index_put<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let x = cx.tensor(0, "self")?;
    if x.rank() == 0 {
        return bad("cannot index_put into a 0-dim tensor");
    }
    let list = cx.tensor_list(1, "indices")?;
    let values = cx.tensor(2, "values")?;
    let accumulate = cx.bool_or(3, "accumulate", false)?;
    let adv = Advanced::new(b, x, &list)?;
    // The values broadcast to the result of `self[indices]`, then in `[I..., rest...]` order.
    let order = adv.placement();
    let (i_dims, rest) = (dims_of(adv.idx)?, dims_of(adv.flat)?[1..].to_vec());
    let result: Vec<u64> = order
        .iter()
        .map(|&d| {
            let d = d as usize;
            if d < i_dims.len() { i_dims[d] } else { rest[d - i_dims.len()] }
        })
        .collect();
    let values = b.broadcast_to(values, &Shape::of(&result))?;
    let mut inverse = vec![0i64; order.len()];
    for (i, &d) in order.iter().enumerate() {
        inverse[d as usize] = i as i64;
    }
    let values = if inverse.iter().enumerate().all(|(i, &d)| i as i64 == d) {
        values
    } else {
        b.transpose(values, &inverse)?
    };
    let put = put_rows(b, adv.flat, adv.idx, values, accumulate)?;
    let put = b.reshape(put, Shape::of(&adv.permuted))?;
    if adv.perm.iter().enumerate().all(|(i, &d)| i == d) {
        return one(put);
    }
    let mut back = vec![0i64; adv.perm.len()];
    for (i, &d) in adv.perm.iter().enumerate() {
        back[d] = i as i64;
    }
    one(b.transpose(put, &back)?)
}

/// `x` (`[rows, rest...]`) with `values` (`I + rest`) written at rows `idx` (`I`) by a
/// `stablehlo.scatter` of whole rows: added with `accumulate` (in f32 for 16-bit floats, as
/// PyTorch's CPU accumulates), else overwritten (a repeated index: one of its writes wins, as
/// PyTorch leaves unspecified). Negative indices wrap; one still outside `x` writes nothing.
fn put_rows<'b>(
    b: &'b KernelBuilder,
    x: Tensor<'b>,
    idx: Tensor<'b>,
    values: Tensor<'b>,
    accumulate: bool,
) -> R<Tensor<'b>> {
    let have = dims_of(x)?;
    let Some((&rows, rest)) = have.split_first() else {
        return bad("cannot index_put into a 0-dim tensor");
    };
    let mut target = dims_of(idx)?;
    let r = target.len();
    target.extend_from_slice(rest);
    let dt = x.dtype();
    let work = if accumulate { acc_type(dt) } else { dt };
    let values = b.broadcast_to(convert(b, values, work)?, &Shape::of(&target))?;
    if rows == 0 || target.contains(&0) {
        return Ok(x);
    }
    let dims = ScatterDims {
        update_window_dims: (r..target.len()).map(|d| d as i64).collect(),
        inserted_window_dims: vec![0],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: r as i64,
        ..Default::default()
    };
    let idx = wrap_negative(b, idx, rows as i64)?;
    let bool_or = dt == DType::Bool;
    let put = b.scatter(convert(b, x, work)?, idx, values, dims, |cur, new| match accumulate {
        false => Ok(new),
        true if bool_or => b.binary(BinaryOp::Or, cur, new),
        true => b.binary(BinaryOp::Add, cur, new),
    })?;
    convert(b, put, dt)
}

/// `index` checked against `self` for a gather or scatter along `d`: an integer tensor of
/// `self`'s rank, no larger in any other dimension. Returns both shapes.
fn along_dims(x: Tensor<'_>, d: usize, idx: Tensor<'_>) -> R<(Vec<u64>, Vec<u64>)> {
    index_tensor(idx, "index")?;
    let (xs, is) = (dims_of(x)?, dims_of(idx)?);
    if is.len() != xs.len() {
        return bad(format!("index {} and self {} differ in rank", idx.ty(), x.ty()));
    }
    if let Some(e) = (0..xs.len()).find(|&e| e != d && is[e] > xs[e]) {
        return bad(format!("index extent {is:?} exceeds {} in dimension {e}", x.ty()));
    }
    Ok((xs, is))
}

/// `x` sliced to `idx`'s extent in every dimension but `d`.
fn fit<'b>(b: &'b KernelBuilder, x: Tensor<'b>, like: &[u64], d: usize) -> R<Tensor<'b>> {
    let xs = dims_of(x)?;
    let mut hi: Vec<i64> = xs.iter().map(|&s| s as i64).collect();
    for (e, h) in hi.iter_mut().enumerate() {
        if e != d {
            if like[e] > xs[e] {
                return bad(format!("index extent {like:?} exceeds {} in dimension {e}", x.ty()));
            }
            *h = like[e] as i64;
        }
    }
    if hi.iter().zip(&xs).all(|(h, s)| *h == *s as i64) {
        return Ok(x);
    }
    Ok(b.slice(x, &vec![0; xs.len()], &hi, &vec![1; xs.len()])?)
}

/// Whether each element of `idx` (already wrapped) lies in `0..size`.
fn in_range<'b>(b: &'b KernelBuilder, idx: Tensor<'b>, size: u64) -> R<Tensor<'b>> {
    let dt = idx.dtype();
    let zero = scalar_const(b, dt, Scalar::Int(0))?;
    let n = scalar_const(b, dt, Scalar::Int(size as i64))?;
    let v = broadcast_all(b, &[idx, zero, n])?;
    let from_zero = b.compare(Direction::Ge, v[0], v[1])?;
    let below = b.compare(Direction::Lt, v[0], v[2])?;
    Ok(b.binary(BinaryOp::And, from_zero, below)?)
}

/// The index vectors of a gather or scatter of single elements along `d` of an operand of
/// `rank` dims, at the positions of `idx` (wrapped): `(indices, batch dims, map)`. The other
/// dims are batch dims of the op (each index reads or writes at its own position there, which
/// SPMD partitioning keeps parallel) when `batched`; otherwise the index vectors spell those
/// coordinates out (an index smaller than the operand in some other dim).
fn element_indices<'b>(
    b: &'b KernelBuilder,
    idx: Tensor<'b>,
    d: usize,
    rank: usize,
    batched: bool,
) -> R<(Tensor<'b>, Vec<i64>, Vec<i64>)> {
    let is = dims_of(idx)?;
    let column = TensorType::new(idx.dtype(), Shape::of(&[&is[..], &[1]].concat()));
    let along_d = b.reshape(idx, column.shape.clone())?;
    if batched {
        let others = (0..rank as i64).filter(|&e| e != d as i64).collect();
        return Ok((along_d, others, vec![d as i64]));
    }
    let coords = (0..rank)
        .map(|e| if e == d { Ok(along_d) } else { Ok(b.iota(column.clone(), e as i64)?) })
        .collect::<R<Vec<Tensor<'b>>>>()?;
    Ok((b.concatenate(&coords, rank as i64)?, vec![], (0..rank as i64).collect()))
}

/// `gather(self, dim, index)`: `out[..i..] = self[..index[..i..]..]` along `dim`, by a
/// `stablehlo.gather` of single elements; an index outside `self` (after negative ones wrap)
/// reads zero.
pub(super) fn gather<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let x = cx.tensor(0, "self")?;
    let d = axis(cx.int(1, "dim")?, x.rank())?;
    let idx = cx.tensor(2, "index")?;
    if x.rank() == 0 {
        return one(x);
    }
    let (xs, is) = along_dims(x, d, idx)?;
    let zeros = splat(b, TensorType::new(x.dtype(), Shape::of(&is)), Scalar::Int(0))?;
    if xs.contains(&0) || is.contains(&0) {
        return one(zeros);
    }
    let wrapped = wrap_negative(b, idx, xs[d] as i64)?;
    let picked = gather_elements(b, fit(b, x, &is, d)?, d, wrapped)?;
    one(b.select(in_range(b, wrapped, xs[d])?, picked, zeros)?)
}

/// `x[..i.., idx[..i..], ..i..]` along `d` for `idx` of `x`'s shape but along `d` (wrapped),
/// gathered batched over the other dims. An index outside `x` is clamped into range (callers
/// mask it).
fn gather_elements<'b>(
    b: &'b KernelBuilder,
    x: Tensor<'b>,
    d: usize,
    idx: Tensor<'b>,
) -> R<Tensor<'b>> {
    let r = x.rank();
    let (coords, batch, map) = element_indices(b, idx, d, r, true)?;
    let dims = GatherDims {
        offset_dims: vec![],
        collapsed_slice_dims: map.clone(),
        operand_batching_dims: batch.clone(),
        start_indices_batching_dims: batch,
        start_index_map: map,
        index_vector_dim: r as i64,
    };
    Ok(b.gather(x, coords, dims, &vec![1; r])?)
}

/// How the scatter family writes an element.
#[derive(Clone, Copy)]
enum Write {
    /// Overwrites it (repeated indices: one of the writes wins, as PyTorch leaves unspecified).
    Replace,
    /// Adds to it (`or` for bools).
    Add,
}

impl Write {
    /// The element written where `cur` held: `new`, or their sum (`or` for bools).
    fn combine<'b>(
        self,
        b: &'b KernelBuilder,
        cur: Tensor<'b>,
        new: Tensor<'b>,
    ) -> Result<Tensor<'b>, tpu_kernels::BuildError> {
        match self {
            Write::Replace => Ok(new),
            Write::Add if cur.dtype() == DType::Bool => b.binary(BinaryOp::Or, cur, new),
            Write::Add => b.binary(BinaryOp::Add, cur, new),
        }
    }
}

/// The scatter family along `d`: `self` with `src` (cut to the index's extent) written at
/// `index` by a `stablehlo.scatter` of single elements (by compares for a few writes, see
/// [`FEW_WRITES`]). Negative indices wrap; one still outside `self` writes nothing.
fn scatter_along<'b>(
    b: &'b KernelBuilder,
    x: Tensor<'b>,
    d: usize,
    idx: Tensor<'b>,
    src: Tensor<'b>,
    write: Write,
) -> R<Tensor<'b>> {
    let (xs, is) = along_dims(x, d, idx)?;
    let r = xs.len();
    if r == 0 || xs.contains(&0) || is.contains(&0) {
        return Ok(x);
    }
    let src = convert(b, src, x.dtype())?;
    let src_dims = dims_of(src)?;
    if src_dims.len() != r || (0..r).any(|e| is[e] > src_dims[e]) {
        return bad(format!(
            "src {} is smaller than index {} in some dimension",
            src.ty(),
            idx.ty()
        ));
    }
    let src = fit(b, src, &is, usize::MAX)?;
    let wrapped = wrap_negative(b, idx, xs[d] as i64)?;
    let batched = (0..r).all(|e| e == d || is[e] == xs[e]);
    if batched && is[d] <= FEW_WRITES {
        // For each `j < k`, `self` takes `src[.., j, ..]` (or adds it) where
        // `iota(d) == index[.., j, ..]`; a repeated index: the last write wins, or all add up.
        let shape = x.shape();
        let iota = b.iota(x.ty().with_dtype(wrapped.dtype()), d as i64)?;
        let step = vec![1i64; r];
        let mut out = x;
        for j in 0..is[d] as i64 {
            let (mut start, mut limit) =
                (vec![0i64; r], is.iter().map(|&v| v as i64).collect::<Vec<_>>());
            (start[d], limit[d]) = (j, j + 1);
            let at = b.broadcast_to(b.slice(wrapped, &start, &limit, &step)?, &shape)?;
            let value = b.broadcast_to(b.slice(src, &start, &limit, &step)?, &shape)?;
            let hit = b.compare(Direction::Eq, iota, at)?;
            out = b.select(hit, write.combine(b, out, value)?, out)?;
        }
        return Ok(out);
    }
    let (coords, batch, map) = element_indices(b, wrapped, d, r, batched)?;
    let dims = ScatterDims {
        update_window_dims: vec![],
        inserted_window_dims: map.clone(),
        input_batching_dims: batch.clone(),
        scatter_indices_batching_dims: batch,
        scatter_dims_to_operand_dims: map,
        index_vector_dim: r as i64,
    };
    Ok(b.scatter(x, coords, src, dims, |cur, new| write.combine(b, cur, new))?)
}

/// Up to this many writes along the scatter dim per position of the others (the index as large
/// as `self` in every other dim), a scatter is elementwise compares and selects (XLA fuses them into the consumer), not a
/// `stablehlo.scatter` (whose result XLA writes out whole: a fresh `[N, V]` for the one
/// write a row of a loss's gradient).
const FEW_WRITES: u64 = 4;

/// `scatter(self, dim, index, value)`: the elements `index` points at become `value`.
pub(super) fn scatter_value<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let x = cx.tensor(0, "self")?;
    let d = axis(cx.int(1, "dim")?, x.rank())?;
    let idx = cx.tensor(2, "index")?;
    let value = scalar_const(b, x.dtype(), cx.scalar(3, "value")?)?;
    let value = b.broadcast_to(value, &idx.shape())?;
    one(scatter_along(b, x, d, idx, value, Write::Replace)?)
}

/// `scatter(self, dim, index, src)`.
pub(super) fn scatter_src<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let x = cx.tensor(0, "self")?;
    let d = axis(cx.int(1, "dim")?, x.rank())?;
    let (idx, src) = (cx.tensor(2, "index")?, cx.tensor(3, "src")?);
    one(scatter_along(b, x, d, idx, src, Write::Replace)?)
}

/// `scatter_add(self, dim, index, src)`: repeated indices add up.
pub(super) fn scatter_add<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let x = cx.tensor(0, "self")?;
    let d = axis(cx.int(1, "dim")?, x.rank())?;
    let (idx, src) = (cx.tensor(2, "index")?, cx.tensor(3, "src")?);
    one(scatter_along(b, x, d, idx, src, Write::Add)?)
}

// ----- softmax -----

fn softmax_input<'b>(cx: &Cx<'_, 'b>) -> R<(Tensor<'b>, i64)> {
    let x = cx.tensor(0, "self")?;
    let d = axis(cx.int(1, "dim")?, x.rank())? as i64;
    let x = if cx.bool_or(2, "half_to_float", false)? { convert(cx.b, x, DType::F32)? } else { x };
    if !x.dtype().is_float() {
        return bad(format!("softmax needs a float type, got {}", x.ty()));
    }
    if x.rank() == 0 {
        return bad("softmax of a 0-dim tensor is not lowered");
    }
    Ok((x, d))
}

/// Softmax's parts along `d`, in the compute type: the input `xf`, its max `m` (kept dims),
/// `x - max`, and the sum of `exp(x - max)` broadcast back.
struct Shifted<'b> {
    xf: Tensor<'b>,
    m: Tensor<'b>,
    s: Tensor<'b>,
    sum: Tensor<'b>,
}

fn shifted<'b>(b: &'b KernelBuilder, x: Tensor<'b>, d: usize) -> R<Shifted<'b>> {
    let xf = convert(b, x, acc_type(x.dtype()))?;
    let m = reduce(b, xf, BinaryOp::Maximum, Scalar::Float(f64::NEG_INFINITY), &[d], true)?;
    let s = b.binary(BinaryOp::Subtract, xf, b.broadcast_to(m, &xf.shape())?)?;
    let e = b.unary(UnaryOp::Exp, s)?;
    let sum = reduce(b, e, BinaryOp::Add, Scalar::Int(0), &[d], true)?;
    Ok(Shifted { xf, m, s, sum: b.broadcast_to(sum, &xf.shape())? })
}

/// `_softmax`: `exp(x - max) / sum(exp(x - max))`.
pub(super) fn softmax<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, d) = softmax_input(cx)?;
    let b = cx.b;
    let Shifted { s, sum, .. } = shifted(b, x, d as usize)?;
    let r = b.binary(BinaryOp::Divide, b.unary(UnaryOp::Exp, s)?, sum)?;
    one(convert(b, r, x.dtype())?)
}

/// `_safe_softmax(self, dim, dtype=None)`: softmax, except that a row whose every entry is -inf
/// (an attention row that masks everything) gives zeros, not NaN.
pub(super) fn safe_softmax<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let x = cx.tensor(0, "self")?;
    let d = axis(cx.int(1, "dim")?, x.rank())?;
    let x = match cx.opt_dtype(2, "dtype")? {
        Some(dt) => convert(b, x, dt)?,
        None => x,
    };
    if !x.dtype().is_float() || x.rank() == 0 {
        return bad(format!(
            "_safe_softmax needs a float tensor of rank 1 or more, got {}",
            x.ty()
        ));
    }
    let xf = convert(b, x, acc_type(x.dtype()))?;
    let m = reduce(b, xf, BinaryOp::Maximum, Scalar::Float(f64::NEG_INFINITY), &[d], true)?;
    let m = b.broadcast_to(m, &xf.shape())?;
    let e = b.unary(UnaryOp::Exp, b.binary(BinaryOp::Subtract, xf, m)?)?;
    let sum =
        b.broadcast_to(reduce(b, e, BinaryOp::Add, Scalar::Int(0), &[d], true)?, &xf.shape())?;
    let r = b.binary(BinaryOp::Divide, e, sum)?;
    let masked =
        b.compare(Direction::Eq, m, splat(b, m.ty(), Scalar::Float(f64::NEG_INFINITY))?)?;
    let r = b.select(masked, splat(b, r.ty(), Scalar::Int(0))?, r)?;
    one(convert(b, r, x.dtype())?)
}

/// `_log_softmax`: `x - max - log(sum(exp(x - max)))`.
pub(super) fn log_softmax<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, d) = softmax_input(cx)?;
    let b = cx.b;
    let Shifted { xf, m, sum, .. } = shifted(b, x, d as usize)?;
    // The output subtracts its own copy of the max (behind an optimization barrier): were it
    // the sum's `x - max`, that [.., D] value would have two users and XLA:CPU would write it
    // out whole between the sum's reduction fusion and the output, a fourth pass over memory.
    let m = b.optimization_barrier(&[m])?[0];
    let shifted_again = b.binary(BinaryOp::Subtract, xf, b.broadcast_to(m, &xf.shape())?)?;
    let r = b.binary(BinaryOp::Subtract, shifted_again, b.unary(UnaryOp::Log, sum)?)?;
    one(convert(b, r, x.dtype())?)
}

/// `(grad_output, output, dim, input_dtype)`, upcast for the arithmetic.
fn softmax_grad_args<'b>(cx: &Cx<'_, 'b>) -> R<(Tensor<'b>, Tensor<'b>, usize, DType)> {
    let (g, y) = (cx.tensor(0, "grad_output")?, cx.tensor(1, "output")?);
    let d = axis(cx.int(2, "dim")?, y.rank())?;
    let Some(dt) = cx.opt_dtype(3, "input_dtype")? else {
        return bad("argument `input_dtype` is missing");
    };
    let acc = acc_type(y.dtype());
    Ok((convert(cx.b, g, acc)?, convert(cx.b, y, acc)?, d, dt))
}

/// `y * (g - sum(g * y))`.
pub(super) fn softmax_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (g, y, d, dt) = softmax_grad_args(cx)?;
    let gy = b.binary(BinaryOp::Multiply, g, y)?;
    let s = reduce(b, gy, BinaryOp::Add, Scalar::Int(0), &[d], true)?;
    let s = b.broadcast_to(s, &y.shape())?;
    let inner = b.binary(BinaryOp::Subtract, g, s)?;
    one(convert(b, b.binary(BinaryOp::Multiply, y, inner)?, dt)?)
}

/// `g - exp(y) * sum(g)`.
pub(super) fn log_softmax_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (g, y, d, dt) = softmax_grad_args(cx)?;
    let s = reduce(b, g, BinaryOp::Add, Scalar::Int(0), &[d], true)?;
    let s = b.broadcast_to(s, &y.shape())?;
    let e = b.unary(UnaryOp::Exp, y)?;
    let r = b.binary(BinaryOp::Subtract, g, b.binary(BinaryOp::Multiply, e, s)?)?;
    one(convert(b, r, dt)?)
}

// ----- nll loss -----

/// The parts both nll_loss ops share: the target as `[N]` (negative ones wrapped), whether it
/// lies in `0..C`, and each sample's weight, zero where the target is `ignore_index` or outside
/// the classes (`[N]`).
struct Nll<'b> {
    target: Tensor<'b>,
    weight: Tensor<'b>,
    classes: u64,
    batched: bool,
}

fn nll_parts<'b>(
    cx: &Cx<'_, 'b>,
    x: Tensor<'b>,
    target: Tensor<'b>,
    weight: Option<Tensor<'b>>,
    ignore_index: i64,
) -> R<Nll<'b>> {
    let b = cx.b;
    index_tensor(target, "target")?;
    let batched = match (x.rank(), target.rank()) {
        (2, 1) => true,
        (1, 0) => false,
        _ => {
            return bad(format!(
                "nll_loss takes self [N, C] with target [N] (or [C] with []), got {} and {}",
                x.ty(),
                target.ty()
            ));
        }
    };
    let classes = *dims_of(x)?.last().unwrap_or(&0);
    let raw = if batched { target } else { b.reshape(target, Shape::of(&[1]))? };
    let n = dims_of(raw)?[0];
    let target = wrap_negative(b, raw, classes as i64)?;
    let inside = in_range(b, target, classes)?;
    let dt = x.dtype();
    let ones = splat(b, TensorType::new(dt, Shape::of(&[n])), Scalar::Int(1))?;
    let w = match weight {
        Some(w) if classes > 0 => gather_elements(b, convert(b, w, dt)?, 0, target)?,
        _ => ones,
    };
    let ig = scalar_const(b, raw.dtype(), Scalar::Int(ignore_index))?;
    let v = broadcast_all(b, &[raw, ig])?;
    let keep = b.binary(BinaryOp::And, b.compare(Direction::Ne, v[0], v[1])?, inside)?;
    let zero = splat(b, w.ty(), Scalar::Int(0))?;
    let weight = b.select(keep, w, zero)?;
    Ok(Nll { target, weight, classes, batched })
}

fn reduction(cx: &Cx<'_, '_>, i: usize) -> R<i64> {
    match cx.int_or(i, "reduction", 1)? {
        r @ 0..=2 => Ok(r),
        r => bad(format!("reduction {r} is not 0 (none), 1 (mean) or 2 (sum)")),
    }
}

/// `nll_loss_forward(self, target, weight, reduction, ignore_index) -> (output, total_weight)`.
pub(super) fn nll_loss_forward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (x, target) = (cx.tensor(0, "self")?, cx.tensor(1, "target")?);
    let weight = cx.opt_tensor(2, "weight")?;
    let red = reduction(cx, 3)?;
    let ignore = cx.int_or(4, "ignore_index", -100)?;
    let parts = nll_parts(cx, x, target, weight, ignore)?;
    let rows = if parts.batched { x } else { b.reshape(x, Shape::of(&[1, dims_of(x)?[0]]))? };
    let zeros = splat(b, parts.weight.ty(), Scalar::Int(0))?;
    let picked = if parts.classes == 0 {
        zeros
    } else {
        // A sample that counts for nothing adds nothing, whatever its logit (an infinite one
        // would make `0 * inf` NaN).
        let counts = b.compare(Direction::Ne, parts.weight, zeros)?;
        let column = b.reshape(parts.target, Shape::of(&[dims_of(parts.target)?[0], 1]))?;
        let picked = gather_elements(b, rows, 1, column)?;
        b.select(counts, b.reshape(picked, zeros.shape())?, zeros)?
    };
    let loss = b.unary(UnaryOp::Negate, b.binary(BinaryOp::Multiply, picked, parts.weight)?)?;
    let total = if red == 0 {
        // PyTorch leaves total_weight at 0 without a reduction.
        scalar_const(b, x.dtype(), Scalar::Int(0))?
    } else {
        reduce(b, parts.weight, BinaryOp::Add, Scalar::Int(0), &[0], false)?
    };
    let out = match red {
        0 if parts.batched => loss,
        0 => b.reshape(loss, Shape::scalar())?,
        1 => {
            let s = reduce(b, loss, BinaryOp::Add, Scalar::Int(0), &[0], false)?;
            b.binary(BinaryOp::Divide, s, total)?
        }
        _ => reduce(b, loss, BinaryOp::Add, Scalar::Int(0), &[0], false)?,
    };
    Ok(vec![out, total])
}

/// `nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)`.
pub(super) fn nll_loss_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let g = cx.tensor(0, "grad_output")?;
    let (x, target) = (cx.tensor(1, "self")?, cx.tensor(2, "target")?);
    let weight = cx.opt_tensor(3, "weight")?;
    let red = reduction(cx, 4)?;
    let ignore = cx.int_or(5, "ignore_index", -100)?;
    let total = cx.tensor(6, "total_weight")?;
    let parts = nll_parts(cx, x, target, weight, ignore)?;
    let dt = x.dtype();
    let g = convert(b, g, dt)?;
    let n = dims_of(parts.weight)?[0];
    let per = match red {
        0 => b.reshape(g, Shape::of(&[n]))?,
        1 => {
            let s = b.binary(BinaryOp::Divide, g, convert(b, total, dt)?)?;
            b.broadcast_to(b.reshape(s, Shape::scalar())?, &Shape::of(&[n]))?
        }
        _ => b.broadcast_to(b.reshape(g, Shape::scalar())?, &Shape::of(&[n]))?,
    };
    let scale = b.unary(UnaryOp::Negate, b.binary(BinaryOp::Multiply, per, parts.weight)?)?;
    let hit = one_hot(b, parts.target, parts.classes)?;
    let wide = b.broadcast_in_dim(scale, hit.ty().with_dtype(dt), &[0])?;
    let zero = splat(b, wide.ty(), Scalar::Int(0))?;
    let grad = b.select(hit, wide, zero)?;
    one(if parts.batched { grad } else { b.reshape(grad, x.shape())? })
}

// ----- attention -----

/// The arguments of the CPU flash attention ops, upcast for the arithmetic.
struct Attention<'b> {
    q: Tensor<'b>,
    k: Tensor<'b>,
    v: Tensor<'b>,
    /// Leading (batch, head) dimensions.
    n: usize,
    scale: f64,
    dtype: DType,
}

fn attention_args<'b>(
    cx: &Cx<'_, 'b>,
    q: Tensor<'b>,
    k: Tensor<'b>,
    v: Tensor<'b>,
    dropout_at: usize,
) -> R<Attention<'b>> {
    let dropout = cx.opt_float(dropout_at, "dropout_p")?.unwrap_or(0.0);
    if dropout != 0.0 {
        return bad(format!("dropout_p = {dropout} is not lowered (only 0)"));
    }
    let (qs, ks, vs) = (dims_of(q)?, dims_of(k)?, dims_of(v)?);
    let r = qs.len();
    if r < 2 || ks.len() != r || vs.len() != r {
        return bad(format!(
            "query, key, value must share a rank >= 2: {}, {}, {}",
            q.ty(),
            k.ty(),
            v.ty()
        ));
    }
    let n = r - 2;
    if qs[..n] != ks[..n] || ks[..n] != vs[..n] || qs[r - 1] != ks[r - 1] || ks[r - 2] != vs[r - 2]
    {
        return bad(format!(
            "query {}, key {}, value {} do not fit together (no broadcasting or grouped heads)",
            q.ty(),
            k.ty(),
            v.ty()
        ));
    }
    let dtype = q.dtype();
    if !dtype.is_float() || k.dtype() != dtype || v.dtype() != dtype {
        return bad("query, key and value must share one float type");
    }
    let scale = cx.opt_float(usize::MAX, "scale")?.unwrap_or(1.0 / (qs[r - 1] as f64).sqrt());
    let acc = acc_type(dtype);
    let b = cx.b;
    Ok(Attention {
        q: convert(b, q, acc)?,
        k: convert(b, k, acc)?,
        v: convert(b, v, acc)?,
        n,
        scale,
        dtype,
    })
}

/// The scaled, masked scores `q kᵀ · scale` (`[.., L, S]`).
fn scores<'b>(cx: &Cx<'_, 'b>, a: &Attention<'b>, is_causal: bool) -> R<Tensor<'b>> {
    let b = cx.b;
    let n = a.n;
    let s = dot(b, a.q, a.k, batched(n, n + 1, n + 1), None)?;
    let s = b.binary(BinaryOp::Multiply, s, scalar_const(b, s.dtype(), Scalar::Float(a.scale))?)?;
    let neg_inf = splat(b, s.ty(), Scalar::Float(f64::NEG_INFINITY))?;
    let mut s = s;
    if is_causal {
        let it = s.ty().with_dtype(DType::I32);
        let (row, col) = (b.iota(it.clone(), n as i64)?, b.iota(it, n as i64 + 1)?);
        let allowed = b.compare(Direction::Ge, row, col)?;
        s = b.select(allowed, s, neg_inf)?;
    }
    if let Some(mask) = cx.opt_tensor(usize::MAX, "attn_mask")? {
        if mask.dtype() == DType::Bool {
            let v = broadcast_all(b, &[mask, s])?;
            if v[1].shape() != s.shape() {
                return bad(format!(
                    "attn_mask {} does not broadcast to the scores {}",
                    mask.ty(),
                    s.ty()
                ));
            }
            s = b.select(v[0], s, neg_inf)?;
        } else {
            let m = convert(b, mask, s.dtype())?;
            let v = broadcast_all(b, &[s, m])?;
            if v[0].shape() != s.shape() {
                return bad(format!(
                    "attn_mask {} does not broadcast to the scores {}",
                    mask.ty(),
                    s.ty()
                ));
            }
            s = b.binary(BinaryOp::Add, v[0], v[1])?;
        }
    }
    Ok(s)
}

/// `_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p=0, is_causal=False, *,
/// attn_mask=None, scale=None) -> (out, logsumexp)`, as math.
pub(super) fn sdpa_flash_cpu<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (q, k, v) = (cx.tensor(0, "query")?, cx.tensor(1, "key")?, cx.tensor(2, "value")?);
    let a = attention_args(cx, q, k, v, 3)?;
    let is_causal = cx.bool_or(4, "is_causal", false)?;
    let s = scores(cx, &a, is_causal)?;
    let last = s.rank() - 1;
    let m = reduce(b, s, BinaryOp::Maximum, Scalar::Float(f64::NEG_INFINITY), &[last], true)?;
    // A fully masked row has max -inf: shift it by 0 instead (its weights are all 0).
    let ninf = splat(b, m.ty(), Scalar::Float(f64::NEG_INFINITY))?;
    let zero = splat(b, m.ty(), Scalar::Int(0))?;
    let m = b.select(b.compare(Direction::Eq, m, ninf)?, zero, m)?;
    let p =
        b.unary(UnaryOp::Exp, b.binary(BinaryOp::Subtract, s, b.broadcast_to(m, &s.shape())?)?)?;
    let l = reduce(b, p, BinaryOp::Add, Scalar::Int(0), &[last], true)?;
    let n = a.n;
    let pv = dot(b, p, a.v, batched(n, n + 1, n), None)?;
    let out = b.binary(BinaryOp::Divide, pv, b.broadcast_to(l, &pv.shape())?)?;
    let lse = b.binary(BinaryOp::Add, m, b.unary(UnaryOp::Log, l)?)?;
    let mut lse_dims = dims_of(lse)?;
    lse_dims.pop();
    let lse = b.reshape(lse, Shape::of(&lse_dims))?;
    Ok(vec![convert(b, out, a.dtype)?, lse])
}

/// `_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, logsumexp,
/// dropout_p, is_causal, *, attn_mask=None, scale=None) -> (grad_q, grad_k, grad_v)`: the math
/// gradient with the probabilities rebuilt from the logsumexp.
pub(super) fn sdpa_flash_cpu_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let g = cx.tensor(0, "grad_out")?;
    let (q, k, v) = (cx.tensor(1, "query")?, cx.tensor(2, "key")?, cx.tensor(3, "value")?);
    let (out, lse) = (cx.tensor(4, "out")?, cx.tensor(5, "logsumexp")?);
    let a = attention_args(cx, q, k, v, 6)?;
    let is_causal = cx.bool_or(7, "is_causal", false)?;
    let acc = acc_type(a.dtype);
    let (g, out, lse) = (convert(b, g, acc)?, convert(b, out, acc)?, convert(b, lse, acc)?);
    let s = scores(cx, &a, is_causal)?;
    let n = a.n;
    let mut lse_dims = dims_of(lse)?;
    lse_dims.push(1);
    let lse = b.reshape(lse, Shape::of(&lse_dims))?;
    let p =
        b.unary(UnaryOp::Exp, b.binary(BinaryOp::Subtract, s, b.broadcast_to(lse, &s.shape())?)?)?;
    let dv = dot(b, p, g, batched(n, n, n), None)?;
    let dp = dot(b, g, a.v, batched(n, n + 1, n + 1), None)?;
    let go = b.binary(BinaryOp::Multiply, g, out)?;
    let last = go.rank() - 1;
    let dsum = reduce(b, go, BinaryOp::Add, Scalar::Int(0), &[last], true)?;
    let ds = b.binary(
        BinaryOp::Multiply,
        p,
        b.binary(BinaryOp::Subtract, dp, b.broadcast_to(dsum, &dp.shape())?)?,
    )?;
    let scale = scalar_const(b, acc, Scalar::Float(a.scale))?;
    let dq = b.binary(BinaryOp::Multiply, dot(b, ds, a.k, batched(n, n + 1, n), None)?, scale)?;
    let dk = b.binary(BinaryOp::Multiply, dot(b, ds, a.q, batched(n, n, n), None)?, scale)?;
    Ok(vec![convert(b, dq, a.dtype)?, convert(b, dk, a.dtype)?, convert(b, dv, a.dtype)?])
}

// ----- embedding bags -----

/// The bag of each index, `[N]`: how many bag starts (the first `bags` offsets, increasing as
/// PyTorch requires) are at or before its position, less one. Found by a binary search over the
/// starts, unrolled: `log2(bags)` rounds of one gather each, `O(N log B)`.
fn bag_of<'b>(b: &'b KernelBuilder, offsets: Tensor<'b>, n: u64, bags: u64) -> R<Tensor<'b>> {
    let offsets = convert(b, offsets, DType::I64)?;
    let starts = if dims_of(offsets)?[0] == bags {
        offsets
    } else {
        b.slice(offsets, &[0], &[bags as i64], &[1])?
    };
    let positions = TensorType::new(DType::I64, Shape::of(&[n]));
    let pos = b.iota(positions.clone(), 0)?;
    let int = |v: i64| splat(b, positions.clone(), Scalar::Int(v));
    let one_i = int(1)?;
    // The answer lies in `lo..=hi`: the starts below `lo` are at or before the position, those
    // from `hi` on after it.
    let (mut lo, mut hi) = (int(0)?, int(bags as i64)?);
    if bags > 0 {
        let dims = GatherDims {
            collapsed_slice_dims: vec![0],
            start_index_map: vec![0],
            index_vector_dim: 1,
            ..Default::default()
        };
        let column = Shape::of(&[n, 1]);
        for _ in 0..u64::BITS - bags.leading_zeros() {
            let mid =
                b.binary(BinaryOp::ShiftRightLogical, b.binary(BinaryOp::Add, lo, hi)?, one_i)?;
            let open = b.compare(Direction::Lt, lo, hi)?;
            let start = b.gather(starts, b.reshape(mid, column.clone())?, dims.clone(), &[1])?;
            let before = b.compare(Direction::Le, start, pos)?;
            let raise = b.binary(BinaryOp::And, open, before)?;
            let lower = b.binary(BinaryOp::And, open, b.unary(UnaryOp::Not, before)?)?;
            lo = b.select(raise, b.binary(BinaryOp::Add, mid, one_i)?, lo)?;
            hi = b.select(lower, mid, hi)?;
        }
    }
    Ok(b.binary(BinaryOp::Subtract, lo, one_i)?)
}

/// The arguments both embedding-bag ops share, checked: `(indices, offsets, bags, keep)` with
/// `keep` (`[N]` bool) false at `padding_idx`.
fn bag_inputs<'b>(
    cx: &Cx<'_, 'b>,
    indices: Tensor<'b>,
    offsets: Tensor<'b>,
    include_last: bool,
    padding_idx: i64,
) -> R<(u64, Tensor<'b>)> {
    index_tensor(indices, "indices")?;
    index_tensor(offsets, "offsets")?;
    rank_is(indices, 1, "indices")?;
    rank_is(offsets, 1, "offsets")?;
    let n_off = dims_of(offsets)?[0];
    let bags = if include_last { n_off.saturating_sub(1) } else { n_off };
    let pad = scalar_const(cx.b, indices.dtype(), Scalar::Int(padding_idx))?;
    let keep = cx.b.compare(Direction::Ne, indices, pad)?;
    Ok((bags, keep))
}

/// `_embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
/// include_last_offset, padding_idx)` in sum mode: `(output, offset2bag, bag_size, max_indices)`,
/// the sums `[B, D]` of each bag's rows added by a scatter, and the bookkeeping outputs as
/// PyTorch's CPU kernel gives them in sum mode (an empty `offset2bag`, zeros). With a
/// `padding_idx` or `include_last_offset` that kernel fills them in instead: not lowered.
pub(super) fn embedding_bag<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (w, indices, offsets) =
        (cx.tensor(0, "weight")?, cx.tensor(1, "indices")?, cx.tensor(2, "offsets")?);
    rank_is(w, 2, "weight")?;
    if cx.int_or(4, "mode", 0)? != 0 {
        return bad("only sum mode (mode=0) embedding bags are lowered");
    }
    if cx.opt_tensor(6, "per_sample_weights")?.is_some() {
        return bad("per_sample_weights are not lowered");
    }
    let include_last = cx.bool_or(7, "include_last_offset", false)?;
    let padding_idx = cx.int_or(8, "padding_idx", -1)?;
    if include_last || padding_idx >= 0 {
        // PyTorch's CPU kernel then fills offset2bag and bag_size, which this lowering does not.
        return bad("embedding bags with include_last_offset or a padding_idx are not lowered");
    }
    let (bags, keep) = bag_inputs(cx, indices, offsets, include_last, padding_idx)?;
    let n = dims_of(indices)?[0];
    let rows = take_rows(b, w, indices)?;
    let zero_rows = splat(b, rows.ty(), Scalar::Int(0))?;
    let keep_rows = b.broadcast_in_dim(keep, rows.ty().with_dtype(DType::Bool), &[0])?;
    let rows = b.select(keep_rows, rows, zero_rows)?;
    let bag = bag_of(b, offsets, n, bags)?;
    // Each row added into its bag's sum (a scatter; in f32 for 16-bit floats).
    let d = dims_of(w)?[1];
    let acc = acc_type(w.dtype());
    let sums = splat(b, TensorType::new(acc, Shape::of(&[bags, d])), Scalar::Int(0))?;
    let out = put_rows(b, sums, bag, convert(b, rows, acc)?, true)?;
    let zeros = |len: u64| splat(b, TensorType::new(DType::I64, Shape::of(&[len])), Scalar::Int(0));
    // PyTorch's CPU kernel returns an empty offset2bag and zeros [B] on its fast path, each
    // index's bag and an empty max_indices otherwise (autograd may take either): the node's
    // declared types say which. Sum mode's backward reads none of them.
    let declared = |k: usize, default: u64| {
        cx.node
            .outputs
            .get(k)
            .and_then(|t| t.shape.dims().first().and_then(|d| d.as_static()))
            .unwrap_or(default)
    };
    let offset2bag = if declared(1, 0) == n && n > 0 { bag } else { zeros(declared(1, 0))? };
    Ok(vec![
        convert(b, out, w.dtype())?,
        offset2bag,
        zeros(declared(2, bags))?,
        zeros(declared(3, bags))?,
    ])
}

/// `_embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, max_indices,
/// num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx)` in sum mode
/// without a `padding_idx`: each index's bag gradient added to its weight row, dense.
pub(super) fn embedding_bag_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (g, indices, offsets) =
        (cx.tensor(0, "grad")?, cx.tensor(1, "indices")?, cx.tensor(2, "offsets")?);
    rank_is(g, 2, "grad")?;
    let num = cx.int(6, "num_weights")?;
    if cx.bool_or(7, "scale_grad_by_freq", false)? {
        return bad("scale_grad_by_freq=True is not lowered");
    }
    if cx.int_or(8, "mode", 0)? != 0 {
        return bad("only sum mode (mode=0) embedding bags are lowered");
    }
    if cx.bool_or(9, "sparse", false)? {
        return bad("sparse gradients are not lowered");
    }
    if cx.opt_tensor(10, "per_sample_weights")?.is_some() {
        return bad("per_sample_weights are not lowered");
    }
    if num < 0 {
        return bad(format!("num_weights {num} is negative"));
    }
    let padding_idx = cx.int_or(11, "padding_idx", -1)?;
    if padding_idx >= 0 {
        return bad("embedding bags with a padding_idx are not lowered");
    }
    let bags = dims_of(g)?[0];
    let n_off = dims_of(offsets)?[0];
    let include_last = n_off == bags + 1;
    let (bags, keep) = bag_inputs(cx, indices, offsets, include_last, padding_idx)?;
    let n = dims_of(indices)?[0];
    let bag = bag_of(b, offsets, n, bags)?;
    let per_index = take_rows(b, g, bag)?;
    let zero_rows = splat(b, per_index.ty(), Scalar::Int(0))?;
    let keep_rows = b.broadcast_in_dim(keep, per_index.ty().with_dtype(DType::Bool), &[0])?;
    let per_index = b.select(keep_rows, per_index, zero_rows)?;
    let d = dims_of(g)?[1];
    let zeros = splat(b, TensorType::new(g.dtype(), Shape::of(&[num as u64, d])), Scalar::Int(0))?;
    one(put_rows(b, zeros, indices, per_index, true)?)
}

/// `mse_loss(self, target, reduction=1)`: `(self - target)²`, summed or averaged over every
/// element (16-bit floats accumulate in f32).
pub(super) fn mse_loss<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (x, t) = (cx.tensor(0, "self")?, cx.tensor(1, "target")?);
    let red = reduction(cx, 2)?;
    let dt = x.dtype();
    if !dt.is_float() {
        return bad(format!("mse_loss of {}: PyTorch takes floating-point inputs", x.ty()));
    }
    let v = broadcast_all(b, &[x, convert(b, t, dt)?])?;
    let d = b.binary(BinaryOp::Subtract, v[0], v[1])?;
    let sq = b.binary(BinaryOp::Multiply, d, d)?;
    if red == 0 {
        return one(sq);
    }
    let acc = convert(b, sq, acc_type(dt))?;
    let all: Vec<usize> = (0..acc.rank()).collect();
    let mut s = reduce(b, acc, BinaryOp::Add, Scalar::Int(0), &all, false)?;
    if red == 1 {
        let n = dims_of(acc)?.iter().product::<u64>();
        s = b.binary(BinaryOp::Divide, s, scalar_const(b, acc.dtype(), Scalar::Int(n as i64))?)?;
    }
    one(convert(b, s, dt)?)
}

/// `mse_loss_backward(grad_output, self, target, reduction)`: `norm · (self - target) ·
/// grad_output`, `norm` 2 over the element count for a mean, else 2.
pub(super) fn mse_loss_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let g = cx.tensor(0, "grad_output")?;
    let (x, t) = (cx.tensor(1, "self")?, cx.tensor(2, "target")?);
    let red = reduction(cx, 3)?;
    let dt = x.dtype();
    let v = broadcast_all(b, &[x, convert(b, t, dt)?, convert(b, g, dt)?])?;
    if v[0].shape() != x.shape() {
        return bad(format!(
            "mse_loss_backward: target and grad_output do not broadcast to {}",
            x.ty()
        ));
    }
    let n = dims_of(x)?.iter().product::<u64>().max(1);
    let norm = if red == 1 { 2.0 / n as f64 } else { 2.0 };
    let d = b.binary(BinaryOp::Subtract, v[0], v[1])?;
    let scaled = b.binary(BinaryOp::Multiply, d, scalar_const(b, dt, Scalar::Float(norm))?)?;
    one(b.binary(BinaryOp::Multiply, scaled, v[2])?)
}

/// `binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=1)`:
/// `(1 - t) x + lw (log1p(exp(-|x|)) + max(-x, 0))`, `lw = (pos_weight - 1) t + 1` (1 without a
/// pos_weight), times `weight`, reduced (16-bit floats compute in f32).
pub(super) fn bce_with_logits<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let b = cx.b;
    let (x0, t0) = (cx.tensor(0, "self")?, cx.tensor(1, "target")?);
    let weight = cx.opt_tensor(2, "weight")?;
    let pos_weight = cx.opt_tensor(3, "pos_weight")?;
    let red = reduction(cx, 4)?;
    let dt = x0.dtype();
    if !dt.is_float() {
        return bad(format!(
            "binary_cross_entropy_with_logits of {}: PyTorch takes floating-point inputs",
            x0.ty()
        ));
    }
    let acc = acc_type(dt);
    let (x, t) = (convert(b, x0, acc)?, convert(b, t0, acc)?);
    let v = broadcast_all(b, &[x, t])?;
    if v[0].shape() != x.shape() {
        return bad(format!("target {} does not match input {}", t0.ty(), x0.ty()));
    }
    let (x, t) = (v[0], v[1]);
    let one_ = splat(b, x.ty(), Scalar::Int(1))?;
    let zero = splat(b, x.ty(), Scalar::Int(0))?;
    let neg = b.unary(UnaryOp::Negate, x)?;
    let soft = b.binary(
        BinaryOp::Add,
        b.unary(
            UnaryOp::LogPlusOne,
            b.unary(UnaryOp::Exp, b.unary(UnaryOp::Negate, b.unary(UnaryOp::Abs, x)?)?)?,
        )?,
        b.binary(BinaryOp::Maximum, neg, zero)?,
    )?;
    let soft = match pos_weight {
        Some(p) => {
            let p = b.broadcast_to(convert(b, p, acc)?, &x.shape())?;
            let lw = b.binary(
                BinaryOp::Add,
                b.binary(BinaryOp::Multiply, b.binary(BinaryOp::Subtract, p, one_)?, t)?,
                one_,
            )?;
            b.binary(BinaryOp::Multiply, lw, soft)?
        }
        None => soft,
    };
    let mut loss = b.binary(
        BinaryOp::Add,
        b.binary(BinaryOp::Multiply, b.binary(BinaryOp::Subtract, one_, t)?, x)?,
        soft,
    )?;
    if let Some(w) = weight {
        loss =
            b.binary(BinaryOp::Multiply, loss, b.broadcast_to(convert(b, w, acc)?, &x.shape())?)?;
    }
    if red == 0 {
        return one(convert(b, loss, dt)?);
    }
    let all: Vec<usize> = (0..loss.rank()).collect();
    let mut s = reduce(b, loss, BinaryOp::Add, Scalar::Int(0), &all, false)?;
    if red == 1 {
        let n: u64 = dims_of(loss)?.iter().product();
        s = b.binary(BinaryOp::Divide, s, scalar_const(b, acc, Scalar::Int(n as i64))?)?;
    }
    one(convert(b, s, dt)?)
}
