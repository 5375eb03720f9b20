//! Every builder misuse is an error naming the kernel, the op and the types; never a panic.

use tpu_kernels::ir::{
    BinaryOp, ConvDims, ConvWindow, Direction, DotDims, GatherDims, ScatterDims, UnaryOp,
};
use tpu_kernels::literal::LiteralData;
use tpu_kernels::{BuildError, DType, Dim, ErrorKind, KernelBuilder, Shape, Tensor, TensorType};

fn t(dtype: DType, dims: &[u64]) -> TensorType {
    TensorType::new(dtype, dims)
}

#[track_caller]
fn expect_err<T: std::fmt::Debug>(r: Result<T, BuildError>, kind: ErrorKind, fragments: &[&str]) {
    let e = r.expect_err("expected an error");
    assert_eq!(e.kind, kind, "wrong kind for: {e}");
    let text = e.to_string();
    assert!(text.starts_with("kernel `k`: "), "kernel not named: {text}");
    for f in fragments {
        assert!(text.contains(f), "`{f}` missing from: {text}");
    }
}

fn builder(params: &[TensorType]) -> KernelBuilder {
    KernelBuilder::new("k", params)
}

#[test]
fn unary_rejects_wrong_dtype() {
    let b = builder(&[t(DType::I32, &[4]), t(DType::F32, &[4])]);
    let [i, x] = [b.arg(0).unwrap(), b.arg(1).unwrap()];
    expect_err(
        b.unary(UnaryOp::Exp, i),
        ErrorKind::DType,
        &["stablehlo.exponential", "float", "tensor<4xi32>"],
    );
    expect_err(b.unary(UnaryOp::Erf, i), ErrorKind::DType, &["chlo.erf"]);
    expect_err(b.unary(UnaryOp::Not, x), ErrorKind::DType, &["stablehlo.not", "tensor<4xf32>"]);
    let u = KernelBuilder::new("k", &[t(DType::U8, &[2])]);
    expect_err(
        u.unary(UnaryOp::Sign, u.arg(0).unwrap()),
        ErrorKind::DType,
        &["stablehlo.sign", "ui8"],
    );
}

#[test]
fn binary_rejects_dtype_mismatch_and_unbroadcastable_shapes() {
    let b = builder(&[t(DType::F32, &[4, 8]), t(DType::BF16, &[4, 8]), t(DType::F32, &[3])]);
    let [x, h, y] = [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap()];
    expect_err(
        b.binary(BinaryOp::Add, x, h),
        ErrorKind::DType,
        &["stablehlo.add", "tensor<4x8xf32>", "tensor<4x8xbf16>"],
    );
    expect_err(
        b.binary(BinaryOp::Multiply, x, y),
        ErrorKind::Shape,
        &["stablehlo.multiply", "tensor<4x8xf32>", "tensor<3xf32>"],
    );
    expect_err(b.binary(BinaryOp::Xor, x, x), ErrorKind::DType, &["stablehlo.xor"]);
    // Broadcasting that is legal works and emits a broadcast.
    let row = b.splat(t(DType::F32, &[8]), 1.0).unwrap();
    assert_eq!(b.binary(BinaryOp::Add, x, row).unwrap().ty(), t(DType::F32, &[4, 8]));
}

#[test]
fn compare_select_clamp_errors() {
    let b = builder(&[t(DType::F32, &[4]), t(DType::I32, &[4]), t(DType::Bool, &[3])]);
    let [x, i, p3] = [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap()];
    expect_err(
        b.compare(Direction::Lt, x, i),
        ErrorKind::DType,
        &["stablehlo.compare", "f32", "i32"],
    );
    expect_err(b.select(x, x, x), ErrorKind::DType, &["stablehlo.select", "predicate must be i1"]);
    expect_err(b.select(p3, x, x), ErrorKind::Shape, &["tensor<3xi1>", "tensor<4xf32>"]);
    let p = b.compare(Direction::Lt, x, x).unwrap();
    expect_err(
        b.select(p, x, i),
        ErrorKind::DType,
        &["branches", "tensor<4xf32>", "tensor<4xi32>"],
    );
    let lo = b.scalar(DType::I32, 0.0).unwrap();
    expect_err(b.clamp(lo, x, x), ErrorKind::DType, &["stablehlo.clamp", "tensor<i32>"]);
    let wrong = b.splat(t(DType::F32, &[2]), 0.0).unwrap();
    expect_err(b.clamp(wrong, x, x), ErrorKind::Shape, &["tensor<2xf32>"]);
}

#[test]
fn convert_and_bitcast_errors() {
    let b = builder(&[t(DType::F32, &[4, 3]), t(DType::Bool, &[4])]);
    let [x, p] = [b.arg(0).unwrap(), b.arg(1).unwrap()];
    expect_err(
        b.bitcast_convert(p, DType::I8),
        ErrorKind::DType,
        &["stablehlo.bitcast_convert", "i1"],
    );
    let bf = b.splat(t(DType::BF16, &[4, 3]), 1.0).unwrap();
    expect_err(b.bitcast_convert(bf, DType::F32), ErrorKind::Shape, &["last dimension of 2"]);
    assert_eq!(b.bitcast_convert(x, DType::BF16).unwrap().ty(), t(DType::BF16, &[4, 3, 2]));
    assert_eq!(b.convert(x, DType::I8).unwrap().ty(), t(DType::I8, &[4, 3]));
}

#[test]
fn constant_errors() {
    let b = builder(&[]);
    expect_err(
        b.constant(t(DType::I8, &[2]), LiteralData::Int(vec![1, 2, 3])),
        ErrorKind::Literal,
        &["stablehlo.constant", "3 elements", "tensor<2xi8>"],
    );
    expect_err(
        b.constant(t(DType::I8, &[1]), LiteralData::Int(vec![200])),
        ErrorKind::Literal,
        &["does not fit i8"],
    );
    expect_err(
        b.constant(t(DType::F32, &[1]), LiteralData::Bool(vec![true])),
        ErrorKind::Literal,
        &["bool elements"],
    );
    expect_err(b.scalar(DType::F8E4M3FN, 1000.0), ErrorKind::Literal, &["448"]);
    expect_err(b.scalar(DType::I32, 0.5), ErrorKind::Literal, &["not an integer"]);
    let sym = TensorType { dtype: DType::F32, shape: Shape(vec![Dim::sym("b")]) };
    expect_err(b.splat(sym, 0.0), ErrorKind::Shape, &["static shape"]);
}

#[test]
fn iota_broadcast_reshape_transpose_errors() {
    let b = builder(&[t(DType::F32, &[4, 6])]);
    let x = b.arg(0).unwrap();
    expect_err(
        b.iota(t(DType::I32, &[4]), 1),
        ErrorKind::Axis,
        &["stablehlo.iota", "1 out of range for rank 1"],
    );
    expect_err(b.iota(t(DType::Bool, &[4]), 0), ErrorKind::DType, &["tensor<4xi1>"]);
    expect_err(
        b.broadcast_in_dim(x, t(DType::F32, &[4, 6, 2]), &[0]),
        ErrorKind::DimensionNumbers,
        &["stablehlo.broadcast_in_dim"],
    );
    expect_err(
        b.broadcast_in_dim(x, t(DType::F32, &[4, 6]), &[0, 2]),
        ErrorKind::Axis,
        &["2 out of range"],
    );
    expect_err(
        b.broadcast_in_dim(x, t(DType::F32, &[4, 5]), &[0, 1]),
        ErrorKind::Shape,
        &["tensor<4x6xf32>", "tensor<4x5xf32>"],
    );
    expect_err(
        b.broadcast_in_dim(x, t(DType::F32, &[6, 4]), &[1, 1]),
        ErrorKind::Axis,
        &["repeated"],
    );
    expect_err(
        b.broadcast_in_dim(x, t(DType::I32, &[4, 6]), &[0, 1]),
        ErrorKind::DType,
        &["element types differ"],
    );
    expect_err(
        b.reshape(x, [5, 5]),
        ErrorKind::Shape,
        &["stablehlo.reshape", "element counts differ"],
    );
    expect_err(
        b.transpose(x, &[0]),
        ErrorKind::DimensionNumbers,
        &["stablehlo.transpose", "wrong length"],
    );
    expect_err(b.transpose(x, &[0, 0]), ErrorKind::Axis, &["repeated"]);
    expect_err(b.broadcast_to(x, &Shape::of(&[6])), ErrorKind::Shape, &["cannot broadcast"]);
}

#[test]
fn slice_errors() {
    let b = builder(&[t(DType::F32, &[4, 6]), t(DType::I32, &[]), t(DType::F32, &[])]);
    let [x, i, f] = [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap()];
    expect_err(
        b.slice(x, &[0, 0], &[5, 6], &[1, 1]),
        ErrorKind::DimensionNumbers,
        &["stablehlo.slice", "0:5:1", "dim 0"],
    );
    expect_err(
        b.slice(x, &[0, 0], &[4, 6], &[1, 0]),
        ErrorKind::DimensionNumbers,
        &["out of bounds"],
    );
    expect_err(b.slice(x, &[0], &[4], &[1]), ErrorKind::DimensionNumbers, &["needs 2 starts"]);
    expect_err(
        b.dynamic_slice(x, &[i, f], &[2, 2]),
        ErrorKind::DType,
        &["stablehlo.dynamic_slice", "integer scalar", "tensor<f32>"],
    );
    expect_err(
        b.dynamic_slice(x, &[i, i], &[2, 7]),
        ErrorKind::DimensionNumbers,
        &["size 7 exceeds dim 1"],
    );
    expect_err(
        b.dynamic_slice(x, &[i], &[2, 2]),
        ErrorKind::DimensionNumbers,
        &["2 start indices"],
    );
    let big = b.splat(t(DType::F32, &[5, 1]), 0.0).unwrap();
    expect_err(
        b.dynamic_update_slice(x, big, &[i, i]),
        ErrorKind::Shape,
        &["stablehlo.dynamic_update_slice", "larger"],
    );
    let wrong = b.splat(t(DType::I32, &[1, 1]), 0.0).unwrap();
    expect_err(b.dynamic_update_slice(x, wrong, &[i, i]), ErrorKind::DType, &["tensor<1x1xi32>"]);
}

#[test]
fn concatenate_and_pad_errors() {
    let b = builder(&[t(DType::F32, &[4, 6]), t(DType::F32, &[3, 5]), t(DType::F32, &[2])]);
    let [x, y, v] = [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap()];
    expect_err(
        b.concatenate(&[], 0),
        ErrorKind::DimensionNumbers,
        &["stablehlo.concatenate", "at least one"],
    );
    expect_err(
        b.concatenate(&[x, y], 0),
        ErrorKind::Shape,
        &["tensor<4x6xf32>", "tensor<3x5xf32>", "dim 1"],
    );
    expect_err(b.concatenate(&[x, x], 2), ErrorKind::Axis, &["2 out of range"]);
    let zero = b.scalar(DType::F32, 0.0).unwrap();
    expect_err(
        b.pad(x, v, &[0, 0], &[0, 0], &[0, 0]),
        ErrorKind::DType,
        &["stablehlo.pad", "scalar", "tensor<2xf32>"],
    );
    expect_err(
        b.pad(x, zero, &[0, 0], &[0, 0], &[0, -1]),
        ErrorKind::DimensionNumbers,
        &["interior"],
    );
    expect_err(
        b.pad(x, zero, &[-5, 0], &[0, 0], &[0, 0]),
        ErrorKind::DimensionNumbers,
        &["negative"],
    );
    expect_err(b.pad(x, zero, &[0], &[0], &[0]), ErrorKind::DimensionNumbers, &["needs 2"]);
}

fn add<'b>(a: &[Tensor<'b>]) -> Result<Vec<Tensor<'b>>, BuildError> {
    Ok(vec![a[0].builder().binary(BinaryOp::Add, a[0], a[1])?])
}

fn bad_body<'b>(a: &[Tensor<'b>]) -> Result<Vec<Tensor<'b>>, BuildError> {
    Ok(vec![a[0].builder().compare(Direction::Lt, a[0], a[1])?])
}

#[test]
fn reduce_errors() {
    let b = builder(&[t(DType::F32, &[4, 6])]);
    let x = b.arg(0).unwrap();
    let init = b.scalar(DType::F32, 0.0).unwrap();
    let wrong_init = b.splat(t(DType::F32, &[2]), 0.0).unwrap();
    expect_err(
        b.reduce(&[x], &[wrong_init], &[1], add),
        ErrorKind::DType,
        &["stablehlo.reduce", "tensor<2xf32>"],
    );
    expect_err(b.reduce(&[x], &[init], &[2], add), ErrorKind::Axis, &["2 out of range"]);
    expect_err(b.reduce(&[x], &[init], &[1, 1], add), ErrorKind::Axis, &["repeated"]);
    expect_err(b.reduce(&[x], &[], &[1], add), ErrorKind::Region, &["N inits"]);
    expect_err(
        b.reduce(&[x], &[init], &[1], bad_body),
        ErrorKind::Region,
        &["returns (tensor<i1>)", "(tensor<f32>)"],
    );
    // The builder is still usable after failed regions.
    assert!(b.reduce_with(x, BinaryOp::Add, 0.0, &[0]).is_ok());
}

#[test]
fn dot_general_errors() {
    let b = builder(&[
        t(DType::F32, &[2, 8, 16]),
        t(DType::F32, &[2, 15, 4]),
        t(DType::BF16, &[16, 4]),
    ]);
    let [x, y, h] = [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap()];
    let dims = |lb: &[i64], rb: &[i64], lc: &[i64], rc: &[i64]| DotDims {
        lhs_batch: lb.to_vec(),
        rhs_batch: rb.to_vec(),
        lhs_contracting: lc.to_vec(),
        rhs_contracting: rc.to_vec(),
    };
    expect_err(
        b.dot_general(x, y, dims(&[0], &[0], &[2], &[1]), None, None),
        ErrorKind::Shape,
        &["stablehlo.dot_general", "lhs dim 2 (16)", "rhs dim 1 (15)"],
    );
    expect_err(
        b.dot_general(x, y, dims(&[0], &[], &[2], &[1]), None, None),
        ErrorKind::DimensionNumbers,
        &["pair up"],
    );
    expect_err(
        b.dot_general(x, y, dims(&[0], &[0], &[3], &[1]), None, None),
        ErrorKind::Axis,
        &["lhs dimension 3 out of range"],
    );
    expect_err(
        b.dot_general(x, y, dims(&[0], &[0], &[0], &[1]), None, None),
        ErrorKind::Axis,
        &["repeated"],
    );
    expect_err(
        b.dot_general(x, h, dims(&[], &[], &[2], &[0]), None, None),
        ErrorKind::DType,
        &["tensor<2x8x16xf32>", "tensor<16x4xbf16>"],
    );
}

#[test]
fn convolution_and_reverse_errors() {
    let b = builder(&[
        t(DType::F32, &[2, 4, 9, 9]),
        t(DType::F32, &[6, 2, 3, 3]),
        t(DType::BF16, &[6, 2, 3, 3]),
        t(DType::F32, &[6, 2, 3]),
    ]);
    let [x, w, h, w1] =
        [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap(), b.arg(3).unwrap()];
    let win = |stride: i64, pad: i64| ConvWindow {
        strides: vec![stride; 2],
        padding: vec![(pad, pad); 2],
        lhs_dilation: vec![1; 2],
        rhs_dilation: vec![1; 2],
    };
    let nchw = ConvDims::channels_first(2);
    // Two groups of two input channels each: [2, 6, 5, 5] with stride 2 and padding 1.
    let y = b.convolution(x, w, nchw.clone(), win(2, 1), 2, 1).unwrap();
    assert_eq!(y.ty(), t(DType::F32, &[2, 6, 5, 5]));
    expect_err(
        b.convolution(x, w, nchw.clone(), win(1, 0), 1, 1),
        ErrorKind::Shape,
        &[
            "stablehlo.convolution",
            "input features 4 / feature_group_count 1",
            "kernel input features 2",
        ],
    );
    expect_err(
        b.convolution(x, h, nchw.clone(), win(1, 0), 2, 1),
        ErrorKind::DType,
        &["tensor<2x4x9x9xf32>", "tensor<6x2x3x3xbf16>"],
    );
    expect_err(
        b.convolution(x, w1, nchw.clone(), win(1, 0), 2, 1),
        ErrorKind::DimensionNumbers,
        &["rank 4 operands", "tensor<6x2x3xf32>"],
    );
    expect_err(
        b.convolution(x, w, nchw.clone(), win(0, 0), 2, 1),
        ErrorKind::DimensionNumbers,
        &["window stride 0 < 1"],
    );
    expect_err(
        b.convolution(x, w, nchw, win(1, 0), 2, 2),
        ErrorKind::DimensionNumbers,
        &["not both > 1"],
    );
    expect_err(
        b.reverse(x, &[1, 4]),
        ErrorKind::Axis,
        &["stablehlo.reverse", "reverse dimension 4"],
    );
}

#[test]
fn while_and_case_errors() {
    let b = builder(&[t(DType::F32, &[4]), t(DType::I32, &[]), t(DType::I64, &[])]);
    let [x, i, l] = [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap()];
    let r = b.while_loop(&[x], |c| Ok(c[0]), |c| Ok(vec![c[0]]));
    expect_err(r, ErrorKind::Region, &["stablehlo.while", "must return tensor<i1>"]);
    let r = b.while_loop(
        &[x],
        |c| {
            b.compare(Direction::Lt, c[0], c[0])
                .and_then(|p| b.reduce_with(p, BinaryOp::And, 1.0, &[0]))
        },
        |_| Ok(vec![i]),
    );
    expect_err(r, ErrorKind::Region, &["body returns (tensor<i32>)", "carries (tensor<4xf32>)"]);
    let r = b.case(l, vec![Box::new(|| Ok(vec![x]))]);
    expect_err(r, ErrorKind::DType, &["stablehlo.case", "tensor<i32>", "tensor<i64>"]);
    let r = b.case(i, vec![Box::new(|| Ok(vec![x])), Box::new(|| Ok(vec![i]))]);
    expect_err(r, ErrorKind::Region, &["branch 1 returns (tensor<i32>)"]);
    expect_err(b.case(i, vec![]), ErrorKind::Region, &["at least one branch"]);
}

#[test]
fn call_and_composite_errors() {
    let sq = KernelBuilder::new("square", &[t(DType::F32, &[4])]);
    let v = sq.arg(0).unwrap();
    let square = sq.finish(&[sq.binary(BinaryOp::Multiply, v, v).unwrap()]).unwrap();
    let other = KernelBuilder::new("square", &[t(DType::F32, &[4])]);
    let w = other.arg(0).unwrap();
    let other_square = other.finish(&[other.unary(UnaryOp::Abs, w).unwrap()]).unwrap();

    let b = builder(&[t(DType::F32, &[4]), t(DType::F32, &[5])]);
    let [x, y] = [b.arg(0).unwrap(), b.arg(1).unwrap()];
    expect_err(
        b.call(&square, &[y]),
        ErrorKind::DType,
        &["func.call", "`@square` takes (tensor<4xf32>)", "(tensor<5xf32>)"],
    );
    expect_err(
        b.call(&square, &[x, x]),
        ErrorKind::DType,
        &["given (tensor<4xf32>, tensor<4xf32>)"],
    );
    assert!(b.call(&square, &[x]).is_ok());
    expect_err(
        b.call(&other_square, &[x]),
        ErrorKind::Symbol,
        &["two different functions named `@square`"],
    );
    expect_err(
        b.composite("tpuk.sq", &[], 1, &square, &[y]),
        ErrorKind::DType,
        &["stablehlo.composite"],
    );
    expect_err(b.call_text("missing", &[x]), ErrorKind::Symbol, &["no function `@missing`"]);
}

#[test]
fn values_from_other_builders_and_closed_regions_are_rejected() {
    let a = builder(&[t(DType::F32, &[4])]);
    let other = KernelBuilder::new("other", &[t(DType::F32, &[4])]);
    let (x, y) = (a.arg(0).unwrap(), other.arg(0).unwrap());
    expect_err(
        a.binary(BinaryOp::Add, x, y),
        ErrorKind::ForeignValue,
        &["stablehlo.add", "belongs to kernel `other`"],
    );
    expect_err(a.unary(UnaryOp::Exp, y), ErrorKind::ForeignValue, &["stablehlo.exponential"]);
    // A value made inside a reduce body cannot be used after the body closes.
    let leaked = std::cell::Cell::new(None);
    let init = a.scalar(DType::F32, 0.0).unwrap();
    a.reduce(&[x], &[init], &[0], |args| {
        let s = a.binary(BinaryOp::Add, args[0], args[1])?;
        leaked.set(Some(s));
        Ok(vec![s])
    })
    .unwrap();
    let leaked = leaked.get().unwrap();
    expect_err(a.unary(UnaryOp::Exp, leaked), ErrorKind::ForeignValue, &["region that is closed"]);
    expect_err(a.arg(3), ErrorKind::Axis, &["parameter 3 of 1"]);
    expect_err(a.finish(&[leaked]), ErrorKind::ForeignValue, &["func.return"]);
    expect_err(a.arg(0), ErrorKind::ForeignValue, &["finished"]);
}

#[test]
fn array_style_errors_are_deferred_to_finish() {
    let b = builder(&[t(DType::F32, &[4]), t(DType::I32, &[4])]);
    let [x, i] = [b.arg(0).unwrap(), b.arg(1).unwrap()];
    let bad = x + i; // dtype mismatch, recorded
    assert!(bad.is_poisoned());
    let later = (bad * 2.0).exp(); // passes the poison through without new errors
    assert!(later.is_poisoned());
    expect_err(
        b.finish(&[later]),
        ErrorKind::DType,
        &["stablehlo.add", "tensor<4xf32> vs tensor<4xi32>"],
    );
    // After finish the builder refuses everything.
    expect_err(b.unary(UnaryOp::Exp, x), ErrorKind::ForeignValue, &["finished"]);
}

#[test]
fn array_style_axis_errors_name_the_axis() {
    let b = builder(&[t(DType::F32, &[4, 3])]);
    let x = b.arg(0).unwrap();
    let s = x.sum(&[2], false);
    expect_err(
        b.finish(&[s]),
        ErrorKind::Axis,
        &["stablehlo.reduce", "axis 2 out of range for rank 2"],
    );
}

fn gather_dims(offset: &[i64], collapsed: &[i64], map: &[i64], ivd: i64) -> GatherDims {
    GatherDims {
        offset_dims: offset.to_vec(),
        collapsed_slice_dims: collapsed.to_vec(),
        start_index_map: map.to_vec(),
        index_vector_dim: ivd,
        ..Default::default()
    }
}

#[test]
fn gather_infers_the_result_type_and_refuses_bad_dimension_numbers() {
    let b = builder(&[t(DType::F32, &[6, 8]), t(DType::I64, &[4, 2]), t(DType::I32, &[5])]);
    let [x, pairs, rows] = [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap()];
    // One element per index pair (a per-row pick): [4].
    let picked = b.gather(x, pairs, gather_dims(&[], &[0, 1], &[0, 1], 1), &[1, 1]).unwrap();
    assert_eq!(picked.ty(), t(DType::F32, &[4]));
    // Whole rows, one scalar index each (an embedding lookup): [5, 8].
    let looked_up = b.gather(x, rows, gather_dims(&[1], &[0], &[0], 1), &[1, 8]).unwrap();
    assert_eq!(looked_up.ty(), t(DType::F32, &[5, 8]));
    // Slices kept with their size-2 dim, offset dims first: [2, 3, 4].
    let blocks = b.gather(x, pairs, gather_dims(&[0, 1], &[], &[0, 1], 1), &[2, 3]).unwrap();
    assert_eq!(blocks.ty(), t(DType::F32, &[2, 3, 4]));

    let f = b.splat(t(DType::F32, &[4, 2]), 0.0).unwrap();
    expect_err(
        b.gather(x, f, gather_dims(&[], &[0, 1], &[0, 1], 1), &[1, 1]),
        ErrorKind::DType,
        &["stablehlo.gather", "not integers"],
    );
    expect_err(
        b.gather(x, pairs, gather_dims(&[], &[0, 1], &[0], 1), &[1, 1]),
        ErrorKind::DimensionNumbers,
        &["2 components"],
    );
    expect_err(
        b.gather(x, pairs, gather_dims(&[], &[0, 1], &[0, 1], 1), &[1, 9]),
        ErrorKind::DimensionNumbers,
        &["slice size 9 exceeds dim 1"],
    );
    expect_err(
        b.gather(x, pairs, gather_dims(&[], &[0, 1], &[0, 1], 1), &[1, 2]),
        ErrorKind::DimensionNumbers,
        &["collapses dim 1 of slice size 2"],
    );
    expect_err(
        b.gather(x, pairs, gather_dims(&[], &[0], &[0, 1], 1), &[1, 2]),
        ErrorKind::DimensionNumbers,
        &["offset_dims [] must list 1 result dims"],
    );
    expect_err(
        b.gather(x, pairs, gather_dims(&[], &[0, 1], &[0, 1], 3), &[1, 1]),
        ErrorKind::DimensionNumbers,
        &["index_vector_dim 3 out of range"],
    );
    expect_err(
        b.gather(x, pairs, gather_dims(&[], &[0, 1], &[1, 1], 1), &[1, 1]),
        ErrorKind::Axis,
        &["start_index_map dim 1 repeated"],
    );
}

#[test]
fn gather_prints_as_stablehlo_generic_form() {
    let b = builder(&[t(DType::F32, &[6, 8]), t(DType::I32, &[5])]);
    let [x, rows] = [b.arg(0).unwrap(), b.arg(1).unwrap()];
    let out = b.gather(x, rows, gather_dims(&[1], &[0], &[0], 1), &[1, 8]).unwrap();
    let text = b.finish(&[out]).unwrap().to_text();
    assert!(
        text.contains(
            "\"stablehlo.gather\"(%arg0, %arg1) {dimension_numbers = #stablehlo.gather<\
             offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], \
             index_vector_dim = 1>, slice_sizes = array<i64: 1, 8>, indices_are_sorted = false} \
             : (tensor<6x8xf32>, tensor<5xi32>) -> tensor<5x8xf32>"
        ),
        "{text}"
    );
}

#[test]
fn batching_dims_pair_operand_and_index_dims_of_equal_size() {
    let b = builder(&[t(DType::F32, &[6, 8]), t(DType::I64, &[6, 1]), t(DType::I64, &[5, 1])]);
    let [x, cols, short] = [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap()];
    let per_row = |operand: &[i64], indices: &[i64], collapsed: &[i64]| GatherDims {
        collapsed_slice_dims: collapsed.to_vec(),
        operand_batching_dims: operand.to_vec(),
        start_indices_batching_dims: indices.to_vec(),
        start_index_map: vec![1],
        index_vector_dim: 1,
        ..Default::default()
    };
    // One element of each row: [6].
    let picked = b.gather(x, cols, per_row(&[0], &[0], &[1]), &[1, 1]).unwrap();
    assert_eq!(picked.ty(), t(DType::F32, &[6]));
    expect_err(
        b.gather(x, short, per_row(&[0], &[0], &[1]), &[1, 1]),
        ErrorKind::Shape,
        &["stablehlo.gather", "batching dim 0 of tensor<6x8xf32> and dim 0 of indices"],
    );
    expect_err(
        b.gather(x, cols, per_row(&[0], &[], &[1]), &[1, 1]),
        ErrorKind::DimensionNumbers,
        &["pairs operand batching dims [0] with indices batching dims []"],
    );
    expect_err(
        b.gather(x, cols, per_row(&[0], &[1], &[1]), &[1, 1]),
        ErrorKind::DimensionNumbers,
        &["include index_vector_dim 1"],
    );
    expect_err(
        b.gather(x, cols, per_row(&[0], &[0], &[0, 1]), &[1, 1]),
        ErrorKind::DimensionNumbers,
        &["operand batching dim 0 is also among its collapsed_slice_dims"],
    );
    expect_err(
        b.gather(x, cols, per_row(&[0], &[0], &[1]), &[2, 1]),
        ErrorKind::DimensionNumbers,
        &["collapses dim 0 of slice size 2"],
    );
    let text = b.finish(&[picked]).unwrap().to_text();
    assert!(
        text.contains(
            "#stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], \
             start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 1>"
        ),
        "{text}"
    );

    let b = builder(&[t(DType::F32, &[6, 8]), t(DType::I64, &[6, 1]), t(DType::F32, &[6])]);
    let [x, cols, upd] = [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap()];
    let per_row = |operand: &[i64], inserted: &[i64]| ScatterDims {
        inserted_window_dims: inserted.to_vec(),
        input_batching_dims: operand.to_vec(),
        scatter_indices_batching_dims: vec![0],
        scatter_dims_to_operand_dims: vec![1],
        index_vector_dim: 1,
        ..Default::default()
    };
    let added = b.scatter(x, cols, upd, per_row(&[0], &[1]), |c, n| Ok(c + n)).unwrap();
    assert_eq!(added.ty(), t(DType::F32, &[6, 8]));
    expect_err(
        b.scatter(x, cols, upd, per_row(&[0], &[]), |c, n| Ok(c + n)),
        ErrorKind::DimensionNumbers,
        &["stablehlo.scatter", "input_batching_dims [0] must cover the 2 dims"],
    );
    expect_err(
        b.scatter(x, cols, upd, per_row(&[1], &[0]), |c, n| Ok(c + n)),
        ErrorKind::Shape,
        &["batching dim 1 of tensor<6x8xf32> and dim 0 of indices"],
    );
    let text = b.finish(&[added]).unwrap().to_text();
    assert!(
        text.contains(
            "#stablehlo.scatter<inserted_window_dims = [1], input_batching_dims = [0], \
             scatter_indices_batching_dims = [0], scatter_dims_to_operand_dims = [1], \
             index_vector_dim = 1>"
        ),
        "{text}"
    );
}

fn scatter_dims(window: &[i64], inserted: &[i64], map: &[i64], ivd: i64) -> ScatterDims {
    ScatterDims {
        update_window_dims: window.to_vec(),
        inserted_window_dims: inserted.to_vec(),
        scatter_dims_to_operand_dims: map.to_vec(),
        index_vector_dim: ivd,
        ..Default::default()
    }
}

#[test]
fn scatter_checks_its_dimension_numbers_and_its_combiner() {
    let b = builder(&[t(DType::F32, &[6, 8]), t(DType::I32, &[5]), t(DType::F32, &[5, 8])]);
    let [x, rows, upd] = [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap()];
    // Rows added at scalar indices (an embedding's gradient): the operand's type.
    let summed = b.scatter(x, rows, upd, scatter_dims(&[1], &[0], &[0], 1), |c, n| Ok(c + n));
    assert_eq!(summed.unwrap().ty(), t(DType::F32, &[6, 8]));

    let wide = b.splat(t(DType::F32, &[5, 9]), 0.0).unwrap();
    expect_err(
        b.scatter(x, rows, wide, scatter_dims(&[1], &[0], &[0], 1), |c, n| Ok(c + n)),
        ErrorKind::Shape,
        &["stablehlo.scatter", "window dim 1", "exceeds dim 1"],
    );
    let short = b.splat(t(DType::F32, &[4, 8]), 0.0).unwrap();
    expect_err(
        b.scatter(x, rows, short, scatter_dims(&[1], &[0], &[0], 1), |c, n| Ok(c + n)),
        ErrorKind::Shape,
        &["do not match the indices"],
    );
    expect_err(
        b.scatter(x, rows, upd, scatter_dims(&[1], &[], &[0], 1), |c, n| Ok(c + n)),
        ErrorKind::DimensionNumbers,
        &["must cover the 2 dims"],
    );
    let ints = b.splat(t(DType::I32, &[5, 8]), 0.0).unwrap();
    expect_err(
        b.scatter(x, rows, ints, scatter_dims(&[1], &[0], &[0], 1), |c, n| Ok(c + n)),
        ErrorKind::DType,
        &["do not match operand"],
    );
    expect_err(
        b.scatter(x, upd, upd, scatter_dims(&[1], &[0], &[0], 1), |c, n| Ok(c + n)),
        ErrorKind::DType,
        &["not integers"],
    );
    expect_err(
        b.scatter(x, rows, upd, scatter_dims(&[1], &[0], &[0], 1), |c, n| Ok(c.lt(n))),
        ErrorKind::Region,
        &["combiner returns", "tensor<i1>"],
    );
}

#[test]
fn scatter_prints_as_stablehlo_generic_form() {
    let b = builder(&[t(DType::F32, &[6, 8]), t(DType::I32, &[5]), t(DType::F32, &[5, 8])]);
    let [x, rows, upd] = [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap()];
    let out = b.scatter(x, rows, upd, scatter_dims(&[1], &[0], &[0], 1), |c, n| Ok(c + n)).unwrap();
    let text = b.finish(&[out]).unwrap().to_text();
    for piece in [
        "\"stablehlo.scatter\"(%arg0, %arg1, %arg2) ({",
        "^bb0(%1: tensor<f32>, %2: tensor<f32>):",
        "stablehlo.add %1, %2 : tensor<f32>",
        "}) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<\
         update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = \
         [0], index_vector_dim = 1>, unique_indices = false} : (tensor<6x8xf32>, \
         tensor<5xi32>, tensor<5x8xf32>) -> tensor<6x8xf32>",
    ] {
        assert!(text.contains(piece), "`{piece}` missing from:\n{text}");
    }
}

#[test]
fn optimization_barrier_copies_and_errors() {
    let b = builder(&[t(DType::F32, &[4, 8]), t(DType::F32, &[8])]);
    let [x, w] = [b.arg(0).unwrap(), b.arg(1).unwrap()];
    // Two copies of `w` behind one barrier: two results of its type, one op in the text.
    let [w1, w2] = w.copies();
    assert_eq!((w1.ty(), w2.ty()), (t(DType::F32, &[8]), t(DType::F32, &[8])));
    let pair = b.optimization_barrier(&[x, w]).unwrap();
    assert_eq!(pair.iter().map(|p| p.ty()).collect::<Vec<_>>(), [x.ty(), w.ty()]);
    let module = b.finish(&[x * w1 + x * w2]).unwrap();
    let text = tpu_kernels::printer::print_module(&module);
    assert!(
        text.contains(
            "%0:2 = stablehlo.optimization_barrier %arg1, %arg1 : tensor<8xf32>, tensor<8xf32>"
        ),
        "{text}"
    );
    expect_err(
        b.optimization_barrier(&[]),
        ErrorKind::Shape,
        &["stablehlo.optimization_barrier", "at least one operand"],
    );
    let other = builder(&[t(DType::F32, &[8])]);
    expect_err(
        other.optimization_barrier(&[other.arg(0).unwrap(), w]),
        ErrorKind::ForeignValue,
        &["stablehlo.optimization_barrier"],
    );
}
