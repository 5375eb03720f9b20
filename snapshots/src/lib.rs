//! Modules that together use every op the builder offers, in every printed form (compact and
//! general reduce, multi-result ops, nested regions, calls and composites). The snapshot tests
//! print them, and the outside parser check verifies each snapshot.

use tpu_kernels::ir::{AttrValue, BinaryOp, Direction, DotDims, Precision, UnaryOp};
use tpu_kernels::literal::LiteralData;
use tpu_kernels::{BuildError, DType, KernelBuilder, Module, TensorType};

fn t(dtype: DType, dims: &[u64]) -> TensorType {
    TensorType::new(dtype, dims)
}

/// Every elementwise unary and binary op on the element types it accepts.
pub fn elementwise() -> Result<Module, BuildError> {
    let b = KernelBuilder::new(
        "ops_elementwise",
        &[t(DType::F32, &[4, 8]), t(DType::I32, &[4, 8]), t(DType::Bool, &[4, 8])],
    );
    let [x, i, p] = [b.arg(0)?, b.arg(1)?, b.arg(2)?];
    let mut outs = Vec::new();
    for op in UnaryOp::ALL {
        let arg = if op.accepts().allows(DType::F32) { x } else { i };
        outs.push(b.unary(*op, arg)?);
    }
    for op in BinaryOp::ALL {
        let arg = if op.accepts().allows(DType::F32) { x } else { i };
        outs.push(b.binary(*op, arg, arg)?);
    }
    outs.push(b.binary(BinaryOp::And, p, p)?);
    outs.push(b.unary(UnaryOp::Not, p)?);
    outs.push(b.unary(UnaryOp::Abs, i)?);
    b.finish(&outs)
}

/// Comparisons of float, signed, unsigned and bool operands; select; clamp.
pub fn compare_select_clamp() -> Result<Module, BuildError> {
    let b = KernelBuilder::new(
        "ops_compare",
        &[t(DType::F32, &[16]), t(DType::I64, &[16]), t(DType::U8, &[16]), t(DType::Bool, &[16])],
    );
    let [x, i, u, p] = [b.arg(0)?, b.arg(1)?, b.arg(2)?, b.arg(3)?];
    let mut outs = Vec::new();
    for dir in
        [Direction::Eq, Direction::Ne, Direction::Ge, Direction::Gt, Direction::Le, Direction::Lt]
    {
        outs.push(b.compare(dir, x, x)?);
    }
    outs.push(b.compare(Direction::Lt, i, i)?);
    outs.push(b.compare(Direction::Gt, u, u)?);
    outs.push(b.compare(Direction::Eq, p, p)?);
    let scalar_pred = b.scalar(DType::Bool, 1.0)?;
    outs.push(b.select(p, x, x)?);
    outs.push(b.select(scalar_pred, i, i)?);
    let (lo, hi) = (b.scalar(DType::F32, -1.0)?, b.scalar(DType::F32, 1.0)?);
    outs.push(b.clamp(lo, x, hi)?);
    outs.push(b.clamp(x, x, x)?);
    b.finish(&outs)
}

/// Conversions and bit casts, same and different widths.
pub fn convert_bitcast() -> Result<Module, BuildError> {
    let b = KernelBuilder::new("ops_convert", &[t(DType::F32, &[4, 2]), t(DType::I8, &[4, 4])]);
    let [x, q] = [b.arg(0)?, b.arg(1)?];
    let outs = vec![
        b.convert(x, DType::BF16)?,
        b.convert(x, DType::I32)?,
        b.convert(x, DType::F8E4M3FN)?,
        b.convert(q, DType::F32)?,
        b.bitcast_convert(x, DType::I32)?,
        b.bitcast_convert(x, DType::BF16)?,
        b.bitcast_convert(q, DType::I32)?,
    ];
    b.finish(&outs)
}

/// Constants of every element type: splats, dense arrays, NaN and infinities.
pub fn constants() -> Result<Module, BuildError> {
    let b = KernelBuilder::new("ops_constants", &[]);
    let mut outs = Vec::new();
    for dtype in DType::ALL {
        let v = if dtype.is_bool() { 1.0 } else { 3.0 };
        outs.push(b.scalar(dtype, v)?);
    }
    outs.push(b.constant(t(DType::I32, &[2, 3]), LiteralData::Int(vec![1, -2, 3, 4, 5, 6]))?);
    outs.push(b.constant(t(DType::U32, &[2]), LiteralData::UInt(vec![0, 4_000_000_000]))?);
    outs.push(b.constant(t(DType::Bool, &[3]), LiteralData::Bool(vec![true, false, true]))?);
    outs.push(b.constant(
        t(DType::F32, &[5]),
        LiteralData::Float(vec![0.1, -2.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY]),
    )?);
    outs.push(b.constant(t(DType::BF16, &[2]), LiteralData::Float(vec![0.1, 65504.0]))?);
    outs.push(b.splat(t(DType::F16, &[2, 2]), -0.0)?);
    outs.push(b.splat(t(DType::F8E5M2, &[2]), f64::INFINITY)?);
    b.finish(&outs)
}

/// Shape ops: iota, broadcasts, reshape, transpose, slices, concatenate, pad.
pub fn shapes() -> Result<Module, BuildError> {
    let b = KernelBuilder::new("ops_shapes", &[t(DType::F32, &[4, 6]), t(DType::I32, &[])]);
    let [x, idx] = [b.arg(0)?, b.arg(1)?];
    let row = b.iota(t(DType::F32, &[6]), 0)?;
    let zero = b.scalar(DType::I32, 0.0)?;
    let pad_value = b.scalar(DType::F32, 0.0)?;
    let update = b.splat(t(DType::F32, &[2, 3]), 1.0)?;
    let outs = vec![
        b.iota(t(DType::I32, &[4, 6]), 1)?,
        b.broadcast_in_dim(row, t(DType::F32, &[4, 6]), &[1])?,
        b.broadcast_to(row, &x.shape())?,
        b.reshape(x, [2, 12])?,
        b.reshape(x, [24])?,
        b.transpose(x, &[1, 0])?,
        b.slice(x, &[0, 1], &[4, 6], &[2, 2])?,
        b.slice(x, &[1, 0], &[3, 6], &[1, 1])?,
        b.dynamic_slice(x, &[idx, zero], &[2, 3])?,
        b.dynamic_update_slice(x, update, &[idx, zero])?,
        b.concatenate(&[x, x, x], 0)?,
        b.pad(x, pad_value, &[1, 0], &[0, -1], &[0, 1])?,
    ];
    b.finish(&outs)
}

/// Reductions: the compact `applies` form and a two-operand argmax with a general body.
pub fn reductions() -> Result<Module, BuildError> {
    let b = KernelBuilder::new("ops_reduce", &[t(DType::F32, &[8, 16])]);
    let x = b.arg(0)?;
    let sum = b.reduce_with(x, BinaryOp::Add, 0.0, &[1])?;
    let max = b.reduce_with(x, BinaryOp::Maximum, f64::NEG_INFINITY, &[0, 1])?;
    let min = b.reduce_with(x, BinaryOp::Minimum, f64::INFINITY, &[0])?;
    let index = b.iota(t(DType::I32, &[8, 16]), 1)?;
    let init_v = b.scalar(DType::F32, f64::NEG_INFINITY)?;
    let init_i = b.scalar(DType::I32, 0.0)?;
    let argmax = b.reduce(&[x, index], &[init_v, init_i], &[1], |a| {
        let (acc_v, acc_i, v, i) = (a[0], a[1], a[2], a[3]);
        let take = b.compare(Direction::Gt, v, acc_v)?;
        Ok(vec![b.select(take, v, acc_v)?, b.select(take, i, acc_i)?])
    })?;
    b.finish(&[sum, max, min, argmax[0], argmax[1]])
}

/// dot_general: plain matmul, batched with precision, and a wider result type.
pub fn dots() -> Result<Module, BuildError> {
    let b = KernelBuilder::new(
        "ops_dot",
        &[t(DType::F32, &[2, 8, 16]), t(DType::F32, &[2, 16, 4]), t(DType::BF16, &[8, 16])],
    );
    let [x, y, h] = [b.arg(0)?, b.arg(1)?, b.arg(2)?];
    let batched = DotDims {
        lhs_batch: vec![0],
        rhs_batch: vec![0],
        lhs_contracting: vec![2],
        rhs_contracting: vec![1],
    };
    let hh = b.transpose(h, &[1, 0])?;
    let outs = vec![
        b.dot_general(x, y, batched, Some([Precision::Highest, Precision::Default]), None)?,
        b.dot_general(h, hh, DotDims::matmul(2), None, Some(DType::F32))?,
        b.dot_general(h, h, DotDims::default(), Some([Precision::High, Precision::High]), None)?,
    ];
    b.finish(&outs)
}

/// A while loop that carries a counter and an accumulator, and a three-way case.
pub fn control_flow() -> Result<Module, BuildError> {
    let b = KernelBuilder::new("ops_control", &[t(DType::F32, &[4]), t(DType::I32, &[])]);
    let [x, which] = [b.arg(0)?, b.arg(1)?];
    let zero = b.scalar(DType::I32, 0.0)?;
    let looped = b.while_loop(
        &[zero, x],
        |c| {
            let limit = b.scalar(DType::I32, 10.0)?;
            b.compare(Direction::Lt, c[0], limit)
        },
        |c| {
            let one = b.scalar(DType::I32, 1.0)?;
            Ok(vec![b.binary(BinaryOp::Add, c[0], one)?, b.binary(BinaryOp::Multiply, c[1], x)?])
        },
    )?;
    let cased = b.case(
        which,
        vec![
            Box::new(|| Ok(vec![b.unary(UnaryOp::Exp, x)?, zero])),
            Box::new(|| Ok(vec![b.unary(UnaryOp::Tanh, x)?, looped[0]])),
            Box::new(|| Ok(vec![looped[1], which])),
        ],
    )?;
    b.finish(&[looped[1], cased[0], cased[1]])
}

/// `func.call` of another kernel's module and a `stablehlo.composite` over it.
pub fn calls() -> Result<Module, BuildError> {
    let sq = KernelBuilder::new("square", &[t(DType::F32, &[4])]);
    let v = sq.arg(0)?;
    let squared = sq.binary(BinaryOp::Multiply, v, v)?;
    let square = sq.finish(&[squared])?;

    let b = KernelBuilder::new("ops_calls", &[t(DType::F32, &[4])]);
    let x = b.arg(0)?;
    let called = b.call(&square, &[x])?;
    let again = b.call(&square, &called)?;
    let composite = b.composite(
        "tpuk.square",
        &[("exponent", AttrValue::I64(2)), ("note", AttrValue::Str("x*x \"squared\"".into()))],
        1,
        &square,
        &[x],
    )?;
    b.finish(&[again[0], composite[0]])
}

/// Every op-coverage module, by snapshot name.
pub fn op_coverage() -> Vec<(&'static str, Result<Module, BuildError>)> {
    vec![
        ("elementwise", elementwise()),
        ("compare_select_clamp", compare_select_clamp()),
        ("convert_bitcast", convert_bitcast()),
        ("constants", constants()),
        ("shapes", shapes()),
        ("reductions", reductions()),
        ("dots", dots()),
        ("control_flow", control_flow()),
        ("calls", calls()),
    ]
}
