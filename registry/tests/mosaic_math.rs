//! The rest of the float math a tiled body has (the StableHLO builder's float set):
//! `log1p`, `sin`, `cos`, `floor`, `ceil`, `sign`, `pow`, `atan2` and `%` (float and integer),
//! and the MXU product with its lhs transposed (`xᵀ · dy`, a weight gradient accumulated over
//! row blocks). libtpu compiles each in both printed forms for v5e and v6e (f32, and bf16 where
//! libtpu has the op); the CPU twin and the interpreter of both forms match an f64 reference;
//! the bf16 forms libtpu lacks are refused in Rust, naming the op.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

#[path = "support/tiled_kernels.rs"]
mod tiled_kernels;

use tpu_kernels::mosaic::dsl::{Tiled, Vector};
use tpu_kernels::mosaic::{Form, IndexExpr, Kernel, Semantics, cpu_twin, custom_call_module_as};
use tpu_kernels::{DType, TensorType};
use tpu_kernels_registry::numerics::{Tolerance, assert_close};
use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::pjrt::{CompileOptions, Program};

const ROWS: u64 = 16;
const COLS: u64 = 128;

/// `o = sin(x) + cos(y) + log1p(|x|) + floor(x) * ceil(y) + sign(x) * |y|^y' + parity`, with
/// `atan2(x, y) + x % y` added in f32, over two 8-row blocks; `parity` is `program_id % 2`.
fn math(dtype: DType) -> Kernel {
    let t = TensorType::new(dtype, [ROWS, COLS]);
    let k = Tiled::new("more_math", &[ROWS / 8], &[Semantics::Parallel]).unwrap();
    let map = [IndexExpr::Grid(0), IndexExpr::Const(0)];
    let x = k.input(t.clone(), &[8, COLS], &map).unwrap();
    let y = k.input(t.clone(), &[8, COLS], &map).unwrap();
    let o = k.output(t, &[8, COLS], &map).unwrap();
    let (a, b) = (x.load(), y.load());
    let mut r = a.sin() + b.cos() + a.abs().log1p() + a.floor() * b.ceil();
    r = r + a.sign() * b.abs().pow(b * 0.5);
    if dtype == DType::F32 {
        r = r + a.atan2(b) + a % b;
    }
    let parity = (k.program_id(0) % 2).cast(dtype).broadcast_to(&[8, COLS]);
    o.store(r + parity);
    k.finish().unwrap()
}

fn inputs() -> (Vec<f64>, Vec<f64>) {
    let n = (ROWS * COLS) as usize;
    // `x` crosses zero (exact zeros included); `y` is positive, away from 0 (for `%`).
    let x = (0..n).map(|i| ((i % 41) as f64 - 20.0) * 0.25).collect();
    let y = (0..n).map(|i| 0.5 + (i % 23) as f64 * 0.125).collect();
    (x, y)
}

fn reference(x: &[f64], y: &[f64], f32_only: bool) -> Vec<f64> {
    x.iter()
        .zip(y)
        .enumerate()
        .map(|(i, (a, b))| {
            let sign = if *a > 0.0 {
                1.0
            } else if *a < 0.0 {
                -1.0
            } else {
                *a
            };
            let mut r = a.sin()
                + b.cos()
                + a.abs().ln_1p()
                + a.floor() * b.ceil()
                + sign * b.abs().powf(b * 0.5);
            if f32_only {
                r += a.atan2(*b) + a % b;
            }
            r + ((i as u64 / (8 * COLS)) % 2) as f64
        })
        .collect()
}

fn round(v: &[f64], dtype: DType) -> Vec<f64> {
    match dtype {
        DType::BF16 => v.iter().map(|x| half::bf16::from_f64(*x).to_f64()).collect(),
        _ => v.iter().map(|x| f64::from(*x as f32)).collect(),
    }
}

#[test]
fn the_rest_of_the_float_set_compiles_for_v5e_and_v6e() {
    for dtype in [DType::F32, DType::BF16] {
        tiled_kernels::compiles_for_v5e_and_v6e(&math(dtype));
    }
}

#[test]
fn the_twin_and_the_interpreter_compute_what_f64_says() {
    let (x, y) = inputs();
    for dtype in [DType::F32, DType::BF16] {
        let k = math(dtype);
        let (x, y) = (round(&x, dtype), round(&y, dtype));
        let want = reference(&x, &y, dtype == DType::F32);
        // bf16 rounds after every op: a few bf16 ulps of the largest terms.
        let tol = match dtype {
            DType::BF16 => Tolerance::new(0.15, 2e-2),
            _ => Tolerance::new(2e-5, 2e-5),
        };
        for form in [Form::Readable, Form::Shipped] {
            let out = tpu_kernels::mosaic::interpret(
                &custom_call_module_as(&k, form),
                &[x.clone(), y.clone()],
            )
            .unwrap_or_else(|e| panic!("{dtype} {form:?}: {e}"));
            assert_close(&format!("{dtype} interpreter ({form:?})"), &out[0], &want, tol);
        }
        let Some(client) = cpu_client_for_tests(1) else { return };
        let exe = client
            .compile(&Program::text(cpu_twin(&k).unwrap().to_text()), &CompileOptions::new())
            .unwrap();
        let dims = [ROWS as i64, COLS as i64];
        let out = match dtype {
            DType::BF16 => {
                let b = |v: &[f64]| v.iter().map(|x| half::bf16::from_f64(*x)).collect::<Vec<_>>();
                let (xb, yb) = (b(&x), b(&y));
                let xb = client.buffer_from_host(&xb, &dims).unwrap();
                let yb = client.buffer_from_host(&yb, &dims).unwrap();
                exe.execute(&[&xb, &yb]).unwrap()[0]
                    .to_vec::<half::bf16>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_f64())
                    .collect::<Vec<f64>>()
            }
            _ => {
                let f = |v: &[f64]| v.iter().map(|x| *x as f32).collect::<Vec<f32>>();
                let xb = client.buffer_from_host(&f(&x), &dims).unwrap();
                let yb = client.buffer_from_host(&f(&y), &dims).unwrap();
                exe.execute(&[&xb, &yb]).unwrap()[0]
                    .to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| f64::from(*v))
                    .collect()
            }
        };
        assert_close(&format!("{dtype} twin"), &out, &want, tol);
    }
}

#[test]
fn bf16_atan2_and_remainder_are_refused_in_rust() {
    let t = TensorType::new(DType::BF16, [8, COLS]);
    type Op = for<'k> fn(Vector<'k>, Vector<'k>) -> Vector<'k>;
    let ops: [(&str, Op); 2] = [("math.atan2", |a, b| a.atan2(b)), ("arith.remf", |a, b| a % b)];
    for (op, f) in ops {
        let k = Tiled::new("bf16_math", &[1], &[Semantics::Parallel]).unwrap();
        let map = [IndexExpr::Const(0), IndexExpr::Const(0)];
        let x = k.input(t.clone(), &[8, COLS], &map).unwrap();
        let o = k.output(t.clone(), &[8, COLS], &map).unwrap();
        o.store(f(x.load(), x.load()));
        let e = k.finish().unwrap_err();
        assert_eq!(e.op, op, "{e}");
        assert!(e.message.contains("no bf16 form on a TPU: compute it in f32"), "{e}");
    }
}

const R: u64 = 512;
const D: u64 = 256;
const N: u64 = 384;

/// `dw = xᵀ · dy` for `x: [R, D]`, `dy: [R, N]`: [128, 128] output blocks, the rows reduced
/// over the `arbitrary` third axis into an f32 scratch accumulator, 256 rows a step.
fn weight_grad(dtype: DType) -> Kernel {
    let (br, bd, bn) = (256, 128, 128);
    let k = Tiled::new(
        "weight_grad",
        &[D / bd, N / bn, R / br],
        &[Semantics::Parallel, Semantics::Parallel, Semantics::Arbitrary],
    )
    .unwrap();
    let x = k
        .input(TensorType::new(dtype, [R, D]), &[br, bd], &[IndexExpr::Grid(2), IndexExpr::Grid(0)])
        .unwrap();
    let dy = k
        .input(TensorType::new(dtype, [R, N]), &[br, bn], &[IndexExpr::Grid(2), IndexExpr::Grid(1)])
        .unwrap();
    let dw = k
        .output(
            TensorType::new(dtype, [D, N]),
            &[bd, bn],
            &[IndexExpr::Grid(0), IndexExpr::Grid(1)],
        )
        .unwrap();
    let acc = k.scratch(tpu_kernels::mosaic::MType::vmem(DType::F32, &[bd, bn])).unwrap();
    k.when(k.program_id(2).eq(0), || acc.store(k.zeros(DType::F32, &[bd, bn])));
    acc.store(acc.load() + x.load().t_matmul(dy.load()));
    k.when(k.program_id(2).eq(k.num_programs(2) - 1), || dw.store(acc.load().cast(dtype)));
    k.finish().unwrap()
}

#[test]
fn a_transposed_lhs_contracts_its_rows_on_v5e_v6e_the_twin_and_the_interpreter() {
    let text = tpu_kernels::mosaic::print_kernel(&weight_grad(DType::F32));
    assert!(
        text.contains("#tpu.dot_dimension_numbers<[0], [0], [1], [1], [0, 1, 1, 1], [], []>"),
        "{text}"
    );
    for dtype in [DType::F32, DType::BF16] {
        tiled_kernels::compiles_for_v5e_and_v6e(&weight_grad(dtype));
    }
    let x: Vec<f64> = (0..R * D).map(|i| ((i * 7 % 19) as f64 - 9.0) / 16.0).collect();
    let dy: Vec<f64> = (0..R * N).map(|i| ((i * 5 % 23) as f64 - 11.0) / 16.0).collect();
    let (d, n, r) = (D as usize, N as usize, R as usize);
    let want: Vec<f64> = (0..d * n)
        .map(|o| (0..r).map(|row| x[row * d + o / n] * dy[row * n + o % n]).sum())
        .collect();
    let k = weight_grad(DType::F32);
    for form in [Form::Readable, Form::Shipped] {
        let out = tpu_kernels::mosaic::interpret(
            &custom_call_module_as(&k, form),
            &[x.clone(), dy.clone()],
        )
        .unwrap_or_else(|e| panic!("{form:?}: {e}"));
        assert_close(
            &format!("weight_grad interpreter ({form:?})"),
            &out[0],
            &want,
            Tolerance::new(1e-4, 1e-5),
        );
    }
    let Some(client) = cpu_client_for_tests(1) else { return };
    let exe = client
        .compile(&Program::text(cpu_twin(&k).unwrap().to_text()), &CompileOptions::new())
        .unwrap();
    let f = |v: &[f64]| v.iter().map(|x| *x as f32).collect::<Vec<f32>>();
    let xb = client.buffer_from_host(&f(&x), &[R as i64, D as i64]).unwrap();
    let yb = client.buffer_from_host(&f(&dy), &[R as i64, N as i64]).unwrap();
    let out = exe.execute(&[&xb, &yb]).unwrap()[0].to_vec::<f32>().unwrap();
    assert_close("weight_grad twin", &out, &want, Tolerance::new(1e-4, 1e-5));
    // Contracting mismatched dims is refused, naming both operands.
    let t = TensorType::new(DType::F32, [8, 128]);
    let bad = Tiled::new("bad_t_matmul", &[1], &[Semantics::Parallel]).unwrap();
    let map = [IndexExpr::Const(0), IndexExpr::Const(0)];
    let a = bad.input(t.clone(), &[8, 128], &map).unwrap();
    let b = bad.input(TensorType::new(DType::F32, [16, 128]), &[16, 128], &map).unwrap();
    let o = bad.output(TensorType::new(DType::F32, [128, 128]), &[128, 128], &map).unwrap();
    o.store(a.load().t_matmul(b.load()));
    let e = bad.finish().unwrap_err();
    assert!(
        e.message.contains("contracting dims differ: vector<8x128xf32> (transposed) has 8"),
        "{e}"
    );
}
