//! Elementwise ops, conversions and tensor creation.

use tpu_kernels::ir::{BinaryOp, Direction, UnaryOp};
use tpu_kernels::{DType, Shape, Tensor, TensorType};

use super::{
    Cx, Operand, R, Scalar, acc_type, bad, broadcast_all, convert, float_of, materialize, one,
    result_type, scalar_const, splat,
};

type Out<'b> = R<Vec<Tensor<'b>>>;

/// `op(x, y)` after promoting both to their result type.
fn binary<'b>(cx: &Cx<'_, 'b>, op: BinaryOp, x: Operand<'b>, y: Operand<'b>) -> R<Tensor<'b>> {
    let dt = result_type(&[x, y]);
    let (x, y) = (materialize(cx.b, x, dt)?, materialize(cx.b, y, dt)?);
    Ok(cx.b.binary(op, x, y)?)
}

/// `self op alpha * other` (`add`, `sub`).
fn with_alpha<'b>(cx: &Cx<'_, 'b>, op: BinaryOp, reverse: bool) -> Out<'b> {
    let (x, y) = (cx.operand(0, "self")?, cx.operand(1, "other")?);
    let (x, y) = if reverse { (y, x) } else { (x, y) };
    let dt = result_type(&[x, y]);
    let (x, mut y) = (materialize(cx.b, x, dt)?, materialize(cx.b, y, dt)?);
    // `alpha` is a number, or a zero-dim tensor where fused mode lifted a varying one into a
    // program input.
    match cx.opt_operand(2, "alpha")? {
        None => {}
        Some(Operand::S(a)) if a.as_f64() == 1.0 => {}
        Some(a) => y = cx.b.binary(BinaryOp::Multiply, y, scalar_operand(cx, a, dt, "alpha")?)?,
    }
    one(cx.b.binary(op, x, y)?)
}

/// A number argument as a zero-dim value of `dt`: a constant, or a lifted zero-dim tensor.
fn scalar_operand<'b>(cx: &Cx<'_, 'b>, o: Operand<'b>, dt: DType, name: &str) -> R<Tensor<'b>> {
    match o {
        Operand::T(t) if t.rank() > 0 => {
            bad(format!("argument `{name}` must be a number, got {}", t.ty()))
        }
        o => materialize(cx.b, o, dt),
    }
}

/// `addcmul(self, tensor1, tensor2, value=1)` and `addcdiv`: `self + value * tensor1 op
/// tensor2`, in the order PyTorch's CPU kernel computes it.
fn addc<'b>(cx: &Cx<'_, 'b>, op: BinaryOp) -> Out<'b> {
    let (x, t1, t2) =
        (cx.operand(0, "self")?, cx.operand(1, "tensor1")?, cx.operand(2, "tensor2")?);
    let dt = result_type(&[x, t1, t2]);
    if op == BinaryOp::Divide && !dt.is_float() {
        return bad("addcdiv of integer tensors (PyTorch refuses it: use a true division)");
    }
    let b = cx.b;
    let (x, t1, t2) = (materialize(b, x, dt)?, materialize(b, t1, dt)?, materialize(b, t2, dt)?);
    let value = cx.opt_operand(3, "value")?.unwrap_or(Operand::S(Scalar::Int(1)));
    let v = scalar_operand(cx, value, dt, "value")?;
    let scaled = b.binary(BinaryOp::Multiply, t1, v)?;
    let q = b.binary(op, scaled, t2)?;
    one(b.binary(BinaryOp::Add, x, q)?)
}

pub(super) fn addcmul<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    addc(cx, BinaryOp::Multiply)
}

pub(super) fn addcdiv<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    addc(cx, BinaryOp::Divide)
}

/// `lerp(self, end, weight)` (a number or a tensor): PyTorch's two-sided formula, `self +
/// weight * (end - self)` below a weight of 0.5 and `end - (end - self) * (1 - weight)` from it.
pub(super) fn lerp<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, end, w) = (cx.operand(0, "self")?, cx.operand(1, "end")?, cx.operand(2, "weight")?);
    let dt = result_type(&[x, end]);
    if !dt.is_float() {
        return bad(format!("lerp of {dt} tensors: PyTorch takes floating-point ones"));
    }
    let b = cx.b;
    let (x, end, w) = (materialize(b, x, dt)?, materialize(b, end, dt)?, materialize(b, w, dt)?);
    let v = broadcast_all(b, &[x, end, w])?;
    let (x, end, w) = (v[0], v[1], v[2]);
    let diff = b.binary(BinaryOp::Subtract, end, x)?;
    let low = b.binary(BinaryOp::Add, x, b.binary(BinaryOp::Multiply, w, diff)?)?;
    let one_ = splat(b, w.ty(), Scalar::Int(1))?;
    let rest = b.binary(BinaryOp::Subtract, one_, w)?;
    let high = b.binary(BinaryOp::Subtract, end, b.binary(BinaryOp::Multiply, diff, rest)?)?;
    let half = splat(b, w.ty(), Scalar::Float(0.5))?;
    let below = b.compare(Direction::Lt, w, half)?;
    one(b.select(below, low, high)?)
}

pub(super) fn add<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    with_alpha(cx, BinaryOp::Add, false)
}

pub(super) fn sub<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    with_alpha(cx, BinaryOp::Subtract, false)
}

/// `other - alpha * self`.
pub(super) fn rsub<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    with_alpha(cx, BinaryOp::Subtract, true)
}

pub(super) fn mul<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, y) = (cx.operand(0, "self")?, cx.operand(1, "other")?);
    one(binary(cx, BinaryOp::Multiply, x, y)?)
}

/// True division: integers divide as floats.
fn true_div<'b>(cx: &Cx<'_, 'b>, x: Operand<'b>, y: Operand<'b>) -> R<Tensor<'b>> {
    let dt = float_of(result_type(&[x, y]));
    let (x, y) = (materialize(cx.b, x, dt)?, materialize(cx.b, y, dt)?);
    Ok(cx.b.binary(BinaryOp::Divide, x, y)?)
}

pub(super) fn div<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, y) = (cx.operand(0, "self")?, cx.operand(1, "other")?);
    one(true_div(cx, x, y)?)
}

/// `div` with `rounding_mode` `trunc`, `floor` or none.
pub(super) fn div_mode<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, y) = (cx.operand(0, "self")?, cx.operand(1, "other")?);
    div_rounded(cx, x, y, cx.opt_string(2, "rounding_mode")?)
}

/// `floor_divide(self, other)`: `div` rounding toward negative infinity.
pub(super) fn floor_divide<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, y) = (cx.operand(0, "self")?, cx.operand(1, "other")?);
    div_rounded(cx, x, y, Some("floor"))
}

fn div_rounded<'b>(cx: &Cx<'_, 'b>, x: Operand<'b>, y: Operand<'b>, mode: Option<&str>) -> Out<'b> {
    let dt = result_type(&[x, y]);
    let b = cx.b;
    match mode {
        None => one(true_div(cx, x, y)?),
        Some(m @ ("trunc" | "floor")) if dt.is_float() => {
            let q = true_div(cx, x, y)?;
            let fl = b.unary(UnaryOp::Floor, q)?;
            if m == "floor" {
                return one(fl);
            }
            let ce = b.unary(UnaryOp::Ceil, q)?;
            let zero = splat(b, q.ty(), Scalar::Int(0))?;
            let neg = b.compare(Direction::Lt, q, zero)?;
            one(b.select(neg, ce, fl)?)
        }
        Some(m @ ("trunc" | "floor")) => {
            let (xt, yt) = (materialize(b, x, dt)?, materialize(b, y, dt)?);
            // Integer division truncates toward zero.
            let q = b.binary(BinaryOp::Divide, xt, yt)?;
            if m == "trunc" {
                return one(q);
            }
            let r = b.binary(BinaryOp::Remainder, xt, yt)?;
            let zero = scalar_const(b, dt, Scalar::Int(0))?;
            let inexact = b.compare(Direction::Ne, r, zero)?;
            let signs_differ = b.compare(
                Direction::Ne,
                b.compare(Direction::Lt, r, zero)?,
                b.compare(Direction::Lt, yt, zero)?,
            )?;
            let fix = b.binary(BinaryOp::And, inexact, signs_differ)?;
            let q1 = b.binary(BinaryOp::Subtract, q, scalar_const(b, dt, Scalar::Int(1))?)?;
            let v = broadcast_all(b, &[fix, q1, q])?;
            one(b.select(v[0], v[1], v[2])?)
        }
        Some(other) => bad(format!("rounding_mode `{other}` is not `trunc`, `floor` or none")),
    }
}

pub(super) fn maximum<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, y) = (cx.operand(0, "self")?, cx.operand(1, "other")?);
    one(binary(cx, BinaryOp::Maximum, x, y)?)
}

pub(super) fn minimum<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, y) = (cx.operand(0, "self")?, cx.operand(1, "other")?);
    one(binary(cx, BinaryOp::Minimum, x, y)?)
}

/// `pow`, with PyTorch's exact special cases for small integer and half exponents.
pub(super) fn pow<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, e) = (cx.operand(0, "self")?, cx.operand(1, "exponent")?);
    let dt = result_type(&[x, e]);
    let b = cx.b;
    if let (Operand::T(t), Operand::S(s)) = (x, e) {
        let t = convert(b, t, dt)?;
        let v = s.as_f64();
        let special = match v {
            1.0 => Some(t),
            2.0 => Some(b.binary(BinaryOp::Multiply, t, t)?),
            3.0 => {
                let sq = b.binary(BinaryOp::Multiply, t, t)?;
                Some(b.binary(BinaryOp::Multiply, sq, t)?)
            }
            0.5 if dt.is_float() => Some(b.unary(UnaryOp::Sqrt, t)?),
            -0.5 if dt.is_float() => Some(b.unary(UnaryOp::Rsqrt, t)?),
            -1.0 if dt.is_float() => {
                Some(b.binary(BinaryOp::Divide, scalar_const(b, dt, Scalar::Int(1))?, t)?)
            }
            _ => None,
        };
        if let Some(r) = special {
            return one(r);
        }
    }
    one(binary(cx, BinaryOp::Power, x, e)?)
}

// ----- unary -----

/// A unary op on the input's type (`neg`, `abs`).
fn same_type<'b>(cx: &Cx<'_, 'b>, op: UnaryOp) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    one(cx.b.unary(op, x)?)
}

/// A float-only unary op: integer inputs become f32 first.
fn floating<'b>(cx: &Cx<'_, 'b>, op: UnaryOp) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let x = convert(cx.b, x, float_of(x.dtype()))?;
    one(cx.b.unary(op, x)?)
}

macro_rules! unary_lowerings {
    ($($name:ident => $kind:ident($op:ident);)*) => {$(
        pub(super) fn $name<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
            $kind(cx, UnaryOp::$op)
        }
    )*};
}

unary_lowerings! {
    neg => same_type(Negate);
    abs => same_type(Abs);
    sign => same_type(Sign);
    exp => floating(Exp);
    log => floating(Log);
    log1p => floating(LogPlusOne);
    sqrt => floating(Sqrt);
    rsqrt => floating(Rsqrt);
    tanh => floating(Tanh);
    sigmoid => floating(Logistic);
    sin => floating(Sine);
    cos => floating(Cosine);
    erf => floating(Erf);
}

/// `floor` and `ceil` leave integers as they are.
fn rounding<'b>(cx: &Cx<'_, 'b>, op: UnaryOp) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    if !x.dtype().is_float() {
        return one(x);
    }
    one(cx.b.unary(op, x)?)
}

pub(super) fn floor<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    rounding(cx, UnaryOp::Floor)
}

pub(super) fn ceil<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    rounding(cx, UnaryOp::Ceil)
}

pub(super) fn reciprocal<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    one(true_div(cx, Operand::S(Scalar::Int(1)), Operand::T(x))?)
}

pub(super) fn relu<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let zero = scalar_const(cx.b, x.dtype(), Scalar::Int(0))?;
    one(cx.b.binary(BinaryOp::Maximum, x, zero)?)
}

/// `threshold_backward(grad_output, self, threshold)`: the gradient where `self` is above the
/// threshold, 0 elsewhere (ReLU's backward).
pub(super) fn threshold_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (g, x) = (cx.tensor(0, "grad_output")?, cx.tensor(1, "self")?);
    let t = scalar_const(cx.b, x.dtype(), cx.scalar(2, "threshold")?)?;
    let v = broadcast_all(cx.b, &[g, x])?;
    let keep = cx.b.compare(Direction::Gt, v[1], t)?;
    let zero = splat(cx.b, v[0].ty(), Scalar::Int(0))?;
    one(cx.b.select(keep, v[0], zero)?)
}

/// `tanh_backward(grad_output, output)`: `grad · (1 - output²)`, in f32 for 16-bit floats.
pub(super) fn tanh_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (g, y) = (cx.tensor(0, "grad_output")?, cx.tensor(1, "output")?);
    let (gf, yf) = (upcast(cx, g)?, upcast(cx, y)?);
    let d = gf * (1.0 - yf * yf);
    one(convert(cx.b, d, float_of(g.dtype()))?)
}

/// `x` in the type it computes in (f32 for 16-bit floats, f32 for integers).
fn upcast<'b>(cx: &Cx<'_, 'b>, x: Tensor<'b>) -> R<Tensor<'b>> {
    convert(cx.b, x, acc_type(float_of(x.dtype())))
}

/// GELU, `approximate` = `none` (`0.5 x (1 + erf(x / sqrt 2))`) or `tanh`
/// (`0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`), computed in f32 for 16-bit floats.
pub(super) fn gelu<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let xf = upcast(cx, x)?;
    let inner = match cx.opt_string(1, "approximate")?.unwrap_or("none") {
        "none" => (xf * std::f64::consts::FRAC_1_SQRT_2).erf(),
        "tanh" => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            ((xf + xf * xf * xf * 0.044715) * k).tanh()
        }
        other => return bad(format!("approximate `{other}` is not `none` or `tanh`")),
    };
    let y = xf * (inner + 1.0) * 0.5;
    one(convert(cx.b, y, float_of(x.dtype()))?)
}

/// `x * sigmoid(x)`, computed in f32 for 16-bit floats.
pub(super) fn silu<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let xf = upcast(cx, x)?;
    one(convert(cx.b, xf * xf.sigmoid(), float_of(x.dtype()))?)
}

/// `silu_backward(grad_output, self)`: `grad * s * (1 + x (1 - s))` with `s = sigmoid(x)`,
/// computed in f32 for 16-bit floats.
pub(super) fn silu_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (g, x) = (cx.tensor(0, "grad_output")?, cx.tensor(1, "self")?);
    let (gf, xf) = (upcast(cx, g)?, upcast(cx, x)?);
    let s = xf.sigmoid();
    let d = gf * s * ((1.0 - s) * xf + 1.0);
    one(convert(cx.b, d, float_of(g.dtype()))?)
}

/// `log_sigmoid_forward(self) -> (output, buffer)`: `min(x, 0) - log1p(exp(-|x|))`, and the
/// buffer PyTorch's CPU kernel keeps for the backward, `exp(-|x|)`; in f32 for 16-bit floats.
pub(super) fn log_sigmoid_forward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let xf = upcast(cx, x)?;
    let z = (-xf.abs()).exp();
    let out = xf.minimum(xf.full_like(0.0)) - z.log1p();
    let dt = float_of(x.dtype());
    Ok(vec![convert(cx.b, out, dt)?, convert(cx.b, z, dt)?])
}

/// `log_sigmoid_backward(grad_output, self, buffer)`: `grad * sigmoid(-x)`, the derivative of
/// [`log_sigmoid_forward`] (computed from `self`, so any buffer gives the same gradient).
pub(super) fn log_sigmoid_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (g, x) = (cx.tensor(0, "grad_output")?, cx.tensor(1, "self")?);
    let (gf, xf) = (upcast(cx, g)?, upcast(cx, x)?);
    one(convert(cx.b, gf * (-xf).sigmoid(), float_of(g.dtype()))?)
}

/// `gelu_backward(grad_output, self, approximate)`: the derivative of [`gelu`] times the
/// gradient, computed in f32 for 16-bit floats.
pub(super) fn gelu_backward<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (g, x) = (cx.tensor(0, "grad_output")?, cx.tensor(1, "self")?);
    let (gf, xf) = (upcast(cx, g)?, upcast(cx, x)?);
    let d = match cx.opt_string(2, "approximate")?.unwrap_or("none") {
        "none" => {
            // Φ(x) + x φ(x), φ(x) = exp(-x²/2) / √(2π)
            let cdf = ((xf * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0) * 0.5;
            let pdf = (xf * xf * -0.5).exp()
                * (0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2);
            cdf + xf * pdf
        }
        "tanh" => {
            // u = k (x + c x³), t = tanh(u): 0.5 (1 + t) + 0.5 x (1 - t²) k (1 + 3 c x²)
            let (k, c) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
            let t = ((xf + xf * xf * xf * c) * k).tanh();
            (t + 1.0) * 0.5 + xf * (1.0 - t * t) * (xf * xf * (3.0 * c) + 1.0) * (0.5 * k)
        }
        other => return bad(format!("approximate `{other}` is not `none` or `tanh`")),
    };
    one(convert(cx.b, gf * d, float_of(g.dtype()))?)
}

// ----- comparisons and logic -----

fn compare<'b>(cx: &Cx<'_, 'b>, direction: Direction) -> Out<'b> {
    let (x, y) = (cx.operand(0, "self")?, cx.operand(1, "other")?);
    let dt = result_type(&[x, y]);
    let (x, y) = (materialize(cx.b, x, dt)?, materialize(cx.b, y, dt)?);
    one(cx.b.compare(direction, x, y)?)
}

macro_rules! comparisons {
    ($($name:ident => $dir:ident;)*) => {$(
        pub(super) fn $name<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
            compare(cx, Direction::$dir)
        }
    )*};
}

comparisons! {
    eq => Eq;
    ne => Ne;
    lt => Lt;
    le => Le;
    gt => Gt;
    ge => Ge;
}

/// Whether each element of `self` is the infinity of `sign`; never for integers and bools.
fn is_signed_inf<'b>(cx: &Cx<'_, 'b>, sign: f64) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    if !x.dtype().is_float() {
        let zero = splat(cx.b, x.ty(), Scalar::Int(0))?;
        return one(cx.b.compare(Direction::Ne, zero, zero)?);
    }
    let inf = splat(cx.b, x.ty(), Scalar::Float(sign * f64::INFINITY))?;
    one(cx.b.compare(Direction::Eq, x, inf)?)
}

/// `isposinf(self)`.
pub(super) fn isposinf<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    is_signed_inf(cx, 1.0)
}

/// `isneginf(self)`.
pub(super) fn isneginf<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    is_signed_inf(cx, -1.0)
}

fn bitwise<'b>(cx: &Cx<'_, 'b>, op: BinaryOp) -> Out<'b> {
    let (x, y) = (cx.operand(0, "self")?, cx.operand(1, "other")?);
    if result_type(&[x, y]).is_float() {
        return bad("bitwise ops take integer or bool tensors");
    }
    one(binary(cx, op, x, y)?)
}

pub(super) fn bitwise_and<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    bitwise(cx, BinaryOp::And)
}

pub(super) fn bitwise_or<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    bitwise(cx, BinaryOp::Or)
}

pub(super) fn bitwise_xor<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    bitwise(cx, BinaryOp::Xor)
}

pub(super) fn bitwise_not<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    if x.dtype().is_float() {
        return bad(format!("bitwise_not takes integer or bool tensors, got {}", x.ty()));
    }
    one(cx.b.unary(UnaryOp::Not, x)?)
}

pub(super) fn logical_not<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = convert(cx.b, cx.tensor(0, "self")?, DType::Bool)?;
    one(cx.b.unary(UnaryOp::Not, x)?)
}

fn logical<'b>(cx: &Cx<'_, 'b>, op: BinaryOp) -> Out<'b> {
    let x = convert(cx.b, cx.tensor(0, "self")?, DType::Bool)?;
    let y = convert(cx.b, cx.tensor(1, "other")?, DType::Bool)?;
    one(cx.b.binary(op, x, y)?)
}

pub(super) fn logical_and<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    logical(cx, BinaryOp::And)
}

pub(super) fn logical_or<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    logical(cx, BinaryOp::Or)
}

/// `condition ? self : other`, all three broadcast together.
pub(super) fn where_<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let cond = convert(cx.b, cx.tensor(0, "condition")?, DType::Bool)?;
    let (x, y) = (cx.operand(1, "self")?, cx.operand(2, "other")?);
    let dt = result_type(&[x, y]);
    let (x, y) = (materialize(cx.b, x, dt)?, materialize(cx.b, y, dt)?);
    let v = broadcast_all(cx.b, &[cond, x, y])?;
    one(cx.b.select(v[0], v[1], v[2])?)
}

/// `mask ? value : self`, in `self`'s type.
pub(super) fn masked_fill<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let mask = convert(cx.b, cx.tensor(1, "mask")?, DType::Bool)?;
    let value = materialize(cx.b, cx.operand(2, "value")?, x.dtype())?;
    let v = broadcast_all(cx.b, &[mask, value, x])?;
    if v[2].shape() != x.shape() {
        return bad(format!("mask {} does not broadcast to {}", mask.ty(), x.ty()));
    }
    one(cx.b.select(v[0], v[1], v[2])?)
}

fn clamp_with<'b>(
    cx: &Cx<'_, 'b>,
    x: Tensor<'b>,
    lo: Option<Operand<'b>>,
    hi: Option<Operand<'b>>,
) -> Out<'b> {
    let mut all = vec![Operand::T(x)];
    all.extend(lo.iter().chain(hi.iter()).copied());
    let dt = result_type(&all);
    let mut y = convert(cx.b, x, dt)?;
    if let Some(lo) = lo {
        let v = broadcast_all(cx.b, &[y, materialize(cx.b, lo, dt)?])?;
        y = cx.b.binary(BinaryOp::Maximum, v[0], v[1])?;
    }
    if let Some(hi) = hi {
        let v = broadcast_all(cx.b, &[y, materialize(cx.b, hi, dt)?])?;
        y = cx.b.binary(BinaryOp::Minimum, v[0], v[1])?;
    }
    one(y)
}

pub(super) fn clamp<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let (lo, hi) = (cx.opt_operand(1, "min")?, cx.opt_operand(2, "max")?);
    if lo.is_none() && hi.is_none() {
        return bad("clamp needs `min` or `max`");
    }
    clamp_with(cx, x, lo, hi)
}

pub(super) fn clamp_min<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    clamp_with(cx, x, Some(cx.operand(1, "min")?), None)
}

pub(super) fn clamp_max<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    clamp_with(cx, x, None, Some(cx.operand(1, "max")?))
}

// ----- conversions and copies -----

/// `_to_copy(self, *, dtype=None, ...)`: a conversion; device, layout and memory format are
/// ignored.
pub(super) fn to_copy<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let dt = cx.opt_dtype(usize::MAX, "dtype")?.unwrap_or(x.dtype());
    one(convert(cx.b, x, dt)?)
}

pub(super) fn convert_element_type<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "a")?;
    let Some(dt) = cx.opt_dtype(1, "dtype")? else {
        return bad("argument `dtype` is missing");
    };
    one(convert(cx.b, x, dt)?)
}

/// `clone`, `alias`, `detach`, `lift_fresh_copy`: values have no identity here.
pub(super) fn identity<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    one(cx.tensor(0, "self")?)
}

/// `copy(self, src)`: `src` broadcast to `self`'s shape in `self`'s type.
pub(super) fn copy<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (x, src) = (cx.tensor(0, "self")?, cx.tensor(1, "src")?);
    let src = convert(cx.b, src, x.dtype())?;
    one(cx.b.broadcast_to(src, &x.shape())?)
}

// ----- creation -----

fn shape_of(size: &[i64]) -> R<Shape> {
    if let Some(d) = size.iter().find(|d| **d < 0) {
        return bad(format!("negative size {d} in {size:?}"));
    }
    Ok(Shape::of(&size.iter().map(|&d| d as u64).collect::<Vec<_>>()))
}

/// The dtype `full`-like ops take when none is given: from the fill value's kind.
fn fill_dtype(s: Scalar) -> DType {
    match s {
        Scalar::Bool(_) => DType::Bool,
        Scalar::Int(_) => DType::I64,
        Scalar::Float(_) => DType::F32,
    }
}

pub(super) fn full<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let shape = shape_of(&cx.ints(0, "size")?)?;
    let value = cx.scalar(1, "fill_value")?;
    let dt = cx.opt_dtype(usize::MAX, "dtype")?.unwrap_or(fill_dtype(value));
    one(splat(cx.b, TensorType { dtype: dt, shape }, value)?)
}

/// `new_zeros(self, size, dtype=None, ...)` and `new_ones`: `self`'s dtype unless one is given.
fn new_filled<'b>(cx: &Cx<'_, 'b>, value: i64) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let shape = shape_of(&cx.ints(1, "size")?)?;
    let dt = cx.opt_dtype(usize::MAX, "dtype")?.unwrap_or(x.dtype());
    one(splat(cx.b, TensorType { dtype: dt, shape }, Scalar::Int(value))?)
}

pub(super) fn new_zeros<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    new_filled(cx, 0)
}

pub(super) fn new_ones<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    new_filled(cx, 1)
}

fn filled<'b>(cx: &Cx<'_, 'b>, value: i64) -> Out<'b> {
    let shape = shape_of(&cx.ints(0, "size")?)?;
    let dt = cx.opt_dtype(usize::MAX, "dtype")?.unwrap_or(DType::F32);
    one(splat(cx.b, TensorType { dtype: dt, shape }, Scalar::Int(value))?)
}

pub(super) fn zeros<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    filled(cx, 0)
}

pub(super) fn ones<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    filled(cx, 1)
}

fn like<'b>(cx: &Cx<'_, 'b>, value: Scalar) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let dt = cx.opt_dtype(usize::MAX, "dtype")?.unwrap_or(x.dtype());
    one(splat(cx.b, x.ty().with_dtype(dt), value)?)
}

pub(super) fn full_like<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    like(cx, cx.scalar(1, "fill_value")?)
}

pub(super) fn zeros_like<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    like(cx, Scalar::Int(0))
}

pub(super) fn ones_like<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    like(cx, Scalar::Int(1))
}

/// `fill.Scalar(self, value)` and `fill.Tensor` (a zero-dim tensor value): `self`'s type with
/// every element `value`, converted to `self`'s dtype (the functional form of `fill_`).
pub(super) fn fill<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let x = cx.tensor(0, "self")?;
    let value = materialize(cx.b, cx.operand(1, "value")?, x.dtype())?;
    if value.shape().rank() != 0 {
        return bad(format!("fill takes a zero-dim value, got {}", value.ty()));
    }
    one(broadcast_all(cx.b, &[value, x])?[0])
}

pub(super) fn scalar_tensor<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let value = cx.scalar(0, "s")?;
    let dt = cx.opt_dtype(usize::MAX, "dtype")?.unwrap_or(DType::F32);
    one(scalar_const(cx.b, dt, value)?)
}

/// `start + i * step` for `i` in `0..len`, computed in `dt`.
fn ramp<'b>(cx: &Cx<'_, 'b>, len: u64, start: Scalar, step: Scalar, dt: DType) -> R<Tensor<'b>> {
    let b = cx.b;
    let i = b.iota(TensorType::new(dt, [len]), 0)?;
    let step = scalar_const(b, dt, step)?;
    let start = scalar_const(b, dt, start)?;
    let scaled = b.binary(BinaryOp::Multiply, i, step)?;
    Ok(b.binary(BinaryOp::Add, scaled, start)?)
}

/// `arange(end)`, `arange(start, end)`, `arange(start, end, step)`.
pub(super) fn arange<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let (start, end, step) = if cx.node.op.ends_with(".default") {
        (Scalar::Int(0), cx.scalar(0, "end")?, Scalar::Int(1))
    } else {
        let step = cx.opt_scalar(2, "step")?.unwrap_or(Scalar::Int(1));
        let step = if cx.node.op.ends_with(".start") { Scalar::Int(1) } else { step };
        (cx.scalar(0, "start")?, cx.scalar(1, "end")?, step)
    };
    let any_float = [start, end, step].iter().any(|s| matches!(s, Scalar::Float(_)));
    let dt = cx.opt_dtype(usize::MAX, "dtype")?.unwrap_or(if any_float {
        DType::F32
    } else {
        DType::I64
    });
    let (s, e, st) = (start.as_f64(), end.as_f64(), step.as_f64());
    if st == 0.0 {
        return bad("arange step is zero");
    }
    let len = ((e - s) / st).ceil().max(0.0) as u64;
    one(ramp(cx, len, start, step, dt)?)
}

/// `prims::iota(length, *, start, step, dtype, ...)`.
pub(super) fn iota<'b>(cx: &Cx<'_, 'b>) -> Out<'b> {
    let len = cx.int(0, "length")?;
    if len < 0 {
        return bad(format!("iota length {len} is negative"));
    }
    let start = Scalar::Int(cx.int_or(usize::MAX, "start", 0)?);
    let step = Scalar::Int(cx.int_or(usize::MAX, "step", 1)?);
    let dt = cx.opt_dtype(usize::MAX, "dtype")?.unwrap_or(DType::I64);
    one(ramp(cx, len as u64, start, step, dt)?)
}
