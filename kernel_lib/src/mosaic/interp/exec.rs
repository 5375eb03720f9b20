//! The executor of decoded ops, and its numerics: values in f64, rounded to their element type
//! after every op; the MXU's f32 accumulation is an f64 sum rounded once to the accumulator's
//! type.

use std::collections::BTreeMap;

use crate::types::DType;

use super::super::types::MType;
use super::ops::{Bin, Combiner, Instr, Kind, Pred, Un};

/// A value: a scalar or `index` (one element), a vector, or a memref's contents.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Val {
    pub ty: MType,
    pub data: Vec<f64>,
}

impl Val {
    /// `ty`'s elements, all `x`.
    pub fn splat(ty: MType, x: f64) -> Val {
        let n = ty.shape().iter().product::<u64>() as usize;
        let x = round(x, ty.dtype());
        Val { data: vec![x; n], ty }
    }
}

/// The values in scope, by name (memrefs too: a store changes one in place).
pub(super) type Env = BTreeMap<String, Val>;

pub(super) fn round(x: f64, dtype: Option<DType>) -> f64 {
    match dtype {
        Some(DType::F32) => x as f32 as f64,
        Some(DType::BF16) => half::bf16::from_f64(x).to_f64(),
        Some(DType::F16) => half::f16::from_f64(x).to_f64(),
        Some(DType::I32) => (x as i64 as i32) as f64,
        Some(DType::Bool) => f64::from(u8::from(x != 0.0)),
        None => x.trunc(),
        _ => x,
    }
}

/// The error function, to about 1.2e-7 relative (W. J. Cody's rational Chebyshev form as
/// Numerical Recipes gives it, `erfc` with fractional error below 1.2e-7): finer than f32, the
/// widest type the body computes `math.erf` in.
fn erf(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 { 1.0 - erfc } else { erfc - 1.0 }
}

fn binary(op: Bin) -> fn(f64, f64) -> f64 {
    match op {
        Bin::Add => |a, b| a + b,
        Bin::Sub => |a, b| a - b,
        Bin::Mul => |a, b| a * b,
        Bin::Div => |a, b| a / b,
        Bin::DivSI => |a, b| (a / b).trunc(),
        Bin::Max => f64::max,
        Bin::Min => f64::min,
        // Truncated: the dividend's sign, as `fmod` and `arith.remsi`.
        Bin::Rem => |a, b| a % b,
        Bin::Pow => f64::powf,
        Bin::Atan2 => f64::atan2,
    }
}

fn unary(op: Un) -> fn(f64) -> f64 {
    match op {
        Un::Neg => |a| -a,
        Un::Exp => f64::exp,
        Un::Log => f64::ln,
        Un::Tanh => f64::tanh,
        Un::Rsqrt => |a| 1.0 / a.sqrt(),
        Un::Sqrt => f64::sqrt,
        Un::Erf => erf,
        Un::Abs => f64::abs,
        Un::Log1p => f64::ln_1p,
        Un::Sin => f64::sin,
        Un::Cos => f64::cos,
        Un::Floor => f64::floor,
        Un::Ceil => f64::ceil,
    }
}

/// Every predicate read is ordered: false when either side is NaN.
fn compare(p: Pred) -> fn(f64, f64) -> bool {
    match p {
        Pred::Eq => |a, b| a == b,
        Pred::Ne => |a, b| !a.is_nan() && !b.is_nan() && a != b,
        Pred::Lt => |a, b| a < b,
        Pred::Le => |a, b| a <= b,
        Pred::Gt => |a, b| a > b,
        Pred::Ge => |a, b| a >= b,
    }
}

fn strides(shape: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// The array index of each element of a block of shape `bshape` at element offset `at` of an
/// array of shape `shape` (row-major).
fn block_indices<'a>(
    shape: &[u64],
    bshape: &'a [u64],
    at: &'a [u64],
) -> impl Iterator<Item = usize> + 'a {
    let (sa, sb) = (strides(shape), strides(bshape));
    let n: u64 = bshape.iter().product();
    (0..n).map(move |flat| {
        let mut a = 0u64;
        for d in 0..bshape.len() {
            a += (at[d] + (flat / sb[d]) % bshape[d]) * sa[d];
        }
        a as usize
    })
}

/// The block of shape `bshape` at element offset `at` of `array` (of shape `shape`).
pub(super) fn read_block(array: &[f64], shape: &[u64], bshape: &[u64], at: &[u64]) -> Vec<f64> {
    block_indices(shape, bshape, at).map(|a| array[a]).collect()
}

/// Writes `block` (of shape `bshape`) at element offset `at` of `array` (of shape `shape`).
pub(super) fn write_block(
    array: &mut [f64],
    shape: &[u64],
    block: &[f64],
    bshape: &[u64],
    at: &[u64],
) {
    for (a, v) in block_indices(shape, bshape, at).zip(block) {
        array[a] = *v;
    }
}

fn broadcast(v: &Val, to: &MType) -> Val {
    let (from, shape) = (v.ty.shape(), to.shape());
    let n: u64 = shape.iter().product();
    let lead = shape.len() - from.len();
    let mut data = Vec::with_capacity(n as usize);
    let mut index = vec![0u64; shape.len()];
    for flat in 0..n {
        // The source element: each target index, clamped to 0 along size-1 source dims.
        let (mut rem, mut src, mut stride) = (flat, 0u64, 1u64);
        for d in (0..shape.len()).rev() {
            index[d] = rem % shape[d];
            rem /= shape[d];
        }
        for d in (0..from.len()).rev() {
            let i = if from[d] == 1 { 0 } else { index[d + lead] };
            src += i * stride;
            stride *= from[d];
        }
        data.push(if v.data.len() == 1 { v.data[0] } else { v.data[src as usize] });
    }
    Val { ty: to.clone(), data }
}

fn reduce(x: &Val, acc: &Val, dims: &[usize], combiner: Combiner, to: &MType) -> Val {
    let shape = x.ty.shape();
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    let mut out = acc.data.clone();
    let mut index = vec![0u64; shape.len()];
    for (flat, v) in x.data.iter().enumerate() {
        let mut rem = flat as u64;
        for d in (0..shape.len()).rev() {
            index[d] = rem % shape[d];
            rem /= shape[d];
        }
        let mut o = 0u64;
        for d in &kept {
            o = o * shape[*d] + index[*d];
        }
        let slot = &mut out[o as usize];
        *slot = match combiner {
            Combiner::Add => *slot + v,
            Combiner::Max => slot.max(*v),
        };
    }
    Val { ty: to.clone(), data: out.into_iter().map(|v| round(v, to.dtype())).collect() }
}

/// `acc + lhs · rhs`, lhs contracted along dim `lc`, rhs along dim `rc` (2-d operands).
fn matmul(l: &Val, r: &Val, acc: &Val, lc: usize, rc: usize) -> Val {
    let (ls, rs) = (l.ty.shape(), r.ty.shape());
    let (m, k) = (ls[1 - lc] as usize, ls[lc] as usize);
    let n = rs[1 - rc] as usize;
    let lhs = |i: usize, p: usize| if lc == 1 { l.data[i * k + p] } else { l.data[p * m + i] };
    let mut out = acc.data.clone();
    let mut sums = vec![0.0f64; n];
    for i in 0..m {
        sums.fill(0.0);
        for p in 0..k {
            let a = lhs(i, p);
            if rc == 0 {
                for (s, b) in sums.iter_mut().zip(&r.data[p * n..(p + 1) * n]) {
                    *s += a * b;
                }
            } else {
                for (j, s) in sums.iter_mut().enumerate() {
                    *s += a * r.data[j * k + p];
                }
            }
        }
        for (o, s) in out[i * n..(i + 1) * n].iter_mut().zip(&sums) {
            *o = round(*o + s, acc.ty.dtype());
        }
    }
    Val { ty: acc.ty.clone(), data: out }
}

fn get<'e>(env: &'e Env, ins: &Instr, i: usize) -> Result<&'e Val, String> {
    let name = &ins.operands[i];
    env.get(name).ok_or_else(|| ins.at.error(format!("`{name}` has no value")))
}

/// The element offsets an op's index operands (from `first` on) give, checked to keep a block
/// of `block` inside `memref`.
fn offsets(
    env: &Env,
    ins: &Instr,
    first: usize,
    memref: &Val,
    block: &[u64],
) -> Result<Vec<u64>, String> {
    let mut at = Vec::with_capacity(block.len());
    for i in first..ins.operands.len() {
        at.push(get(env, ins, i)?.data[0]);
    }
    let shape = memref.ty.shape();
    let inside =
        at.iter().zip(block).zip(shape).all(|((o, b), d)| *o >= 0.0 && *o + *b as f64 <= *d as f64);
    if !inside {
        return ins.at.fail(format!("a {block:?} block at {at:?} leaves its {shape:?} memref"));
    }
    Ok(at.into_iter().map(|o| o as u64).collect())
}

/// The flat index of the element a scalar load's or store's indices (the operands after the
/// memref) pick in `memref`.
fn element(env: &Env, ins: &Instr, memref: &Val) -> Result<usize, String> {
    let first = ins.operands.len() - memref.ty.shape().len();
    let at = offsets(env, ins, first, memref, &vec![1; memref.ty.shape().len()])?;
    Ok(at.iter().zip(strides(memref.ty.shape())).map(|(i, s)| i * s).sum::<u64>() as usize)
}

/// Runs `body` in `env`; the values of the `func.return` it ends with, if it reaches one.
pub(super) fn run(env: &mut Env, body: &[Instr]) -> Result<Option<Vec<Val>>, String> {
    for ins in body {
        let val = match &ins.kind {
            Kind::Return => {
                let vals = (0..ins.operands.len())
                    .map(|i| get(env, ins, i).cloned())
                    .collect::<Result<_, _>>()?;
                return Ok(Some(vals));
            }
            Kind::Yield => return Ok(None),
            Kind::If { then, other } => {
                let taken = get(env, ins, 0)?.data[0] != 0.0;
                if let Some(r) = run(env, if taken { then } else { other })? {
                    return Ok(Some(r));
                }
                continue;
            }
            Kind::For { iv, body } => {
                let [lo, hi, step] = [0, 1, 2].map(|i| get(env, ins, i).map(|v| v.data[0]));
                let (mut i, hi, step) = (lo?, hi?, step?);
                if step <= 0.0 {
                    return ins.at.fail(format!("a loop with step {step}"));
                }
                while i < hi {
                    env.insert(iv.clone(), Val { ty: MType::Scalar(DType::I32), data: vec![i] });
                    if let Some(r) = run(env, body)? {
                        return Ok(Some(r));
                    }
                    i += step;
                }
                continue;
            }
            Kind::ScalarStore => {
                let v = get(env, ins, 0)?.data[0];
                let m = get(env, ins, 1)?;
                let i = element(env, ins, m)?;
                let dtype = m.ty.dtype();
                let m = env.get_mut(&ins.operands[1]).ok_or_else(|| ins.at.error("no memref"))?;
                m.data[i] = round(v, dtype);
                continue;
            }
            Kind::Store => {
                let v = get(env, ins, 0)?.clone();
                let m = get(env, ins, 1)?;
                let at = offsets(env, ins, 2, m, v.ty.shape())?;
                let shape = m.ty.shape().to_vec();
                let dtype = m.ty.dtype();
                let block: Vec<f64> = v.data.iter().map(|x| round(*x, dtype)).collect();
                let m = env.get_mut(&ins.operands[1]).ok_or_else(|| ins.at.error("no memref"))?;
                write_block(&mut m.data, &shape, &block, v.ty.shape(), &at);
                continue;
            }
            kind => eval(env, ins, kind)?,
        };
        if let Some((name, _)) = &ins.result {
            env.insert(name.clone(), val);
        }
    }
    Ok(None)
}

fn eval(env: &Env, ins: &Instr, kind: &Kind) -> Result<Val, String> {
    let ty = match &ins.result {
        Some((_, ty)) => ty,
        None => return ins.at.fail("an op without its result"),
    };
    let dtype = ty.dtype();
    let x = |i: usize| get(env, ins, i);
    Ok(match kind {
        Kind::Constant(c) => Val::splat(ty.clone(), *c),
        Kind::Binary(op) => {
            let (a, b, f) = (x(0)?, x(1)?, binary(*op));
            let data = a.data.iter().zip(&b.data).map(|(a, b)| round(f(*a, *b), dtype)).collect();
            Val { ty: ty.clone(), data }
        }
        Kind::Unary(op) => {
            let f = unary(*op);
            Val { ty: ty.clone(), data: x(0)?.data.iter().map(|a| round(f(*a), dtype)).collect() }
        }
        Kind::Compare(p) => {
            let (a, b, f) = (x(0)?, x(1)?, compare(*p));
            let data = a.data.iter().zip(&b.data).map(|(a, b)| f64::from(u8::from(f(*a, *b))));
            Val { ty: ty.clone(), data: data.collect() }
        }
        Kind::Select => {
            let (c, a, b) = (x(0)?, x(1)?, x(2)?);
            let data = (0..a.data.len())
                .map(|i| {
                    let cond = if c.data.len() == 1 { c.data[0] } else { c.data[i] };
                    if cond != 0.0 { a.data[i] } else { b.data[i] }
                })
                .collect();
            Val { ty: ty.clone(), data }
        }
        Kind::Cast => {
            Val { ty: ty.clone(), data: x(0)?.data.iter().map(|a| round(*a, dtype)).collect() }
        }
        Kind::Broadcast => broadcast(x(0)?, ty),
        Kind::Load => {
            let m = x(0)?;
            let at = offsets(env, ins, 1, m, ty.shape())?;
            Val { ty: ty.clone(), data: read_block(&m.data, m.ty.shape(), ty.shape(), &at) }
        }
        Kind::ScalarLoad => {
            let m = x(0)?;
            Val { ty: ty.clone(), data: vec![m.data[element(env, ins, m)?]] }
        }
        Kind::Reduce { combiner, dims } => reduce(x(0)?, x(1)?, dims, *combiner, ty),
        Kind::Matmul { lhs, rhs } => matmul(x(0)?, x(1)?, x(2)?, *lhs, *rhs),
        Kind::Iota { dim } => {
            let shape = ty.shape();
            let inner: u64 = shape[dim + 1..].iter().product();
            let n: u64 = shape.iter().product();
            Val {
                ty: ty.clone(),
                data: (0..n).map(|f| ((f / inner) % shape[*dim]) as f64).collect(),
            }
        }
        Kind::AssumeMultiple(by) => {
            let v = x(0)?;
            if v.data[0] as i64 % by != 0 {
                return ins
                    .at
                    .fail(format!("{} is not the multiple of {by} it is said to be", v.data[0]));
            }
            v.clone()
        }
        Kind::Store
        | Kind::ScalarStore
        | Kind::If { .. }
        | Kind::For { .. }
        | Kind::Yield
        | Kind::Return => {
            return ins.at.fail("not a value");
        }
    })
}
