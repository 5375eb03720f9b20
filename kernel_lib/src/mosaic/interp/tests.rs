//! Both printed forms of one kernel are read alike (the same bits out), agree with f64
//! references, and a text either form's printer could not have written is refused with the line.

use super::{decode_base64, interpret};
use crate::mosaic::dsl::{Tiled, all, ds};
use crate::mosaic::wrap::base64;
use crate::mosaic::{
    Form, IndexExpr, Kernel, MType, Semantics, TiledBuilder, custom_call_module_as, print_kernel,
    print_kernel_serialized,
};
use crate::types::{DType, TensorType};

use IndexExpr::{Const, Grid};

#[test]
fn base64_round_trips() {
    for s in ["", "f", "fo", "foo", "foob", "fooba", "foobar", "module {\n}\n"] {
        assert_eq!(decode_base64(&base64(s.as_bytes())).unwrap(), s.as_bytes());
    }
}

fn t(dtype: DType, dims: &[u64]) -> TensorType {
    TensorType::new(dtype, dims)
}

/// Deterministic values in [-2, 2), exact in bf16.
fn data(n: usize, seed: usize) -> Vec<f64> {
    (0..n).map(|i| ((i * 7919 + seed * 104_729) % 512) as f64 / 128.0 - 2.0).collect()
}

/// Every op family the printers emit but loops and matmuls (see the tests below for those):
/// float and integer arithmetic, every unary op, both compares, select, every cast, iota,
/// broadcasts of scalars and rows, both reductions, `when`.
fn every_op() -> Kernel {
    let k = Tiled::new("every_op", &[2], &[Semantics::Parallel]).unwrap();
    let x = k.input(t(DType::F32, &[16, 128]), &[8, 128], &[Grid(0), Const(0)]).unwrap();
    let w = k.input(t(DType::BF16, &[1, 128]), &[1, 128], &[Const(0), Const(0)]).unwrap();
    let o = k.output(t(DType::F32, &[16, 128]), &[8, 128], &[Grid(0), Const(0)]).unwrap();
    let o2 = k.output(t(DType::F32, &[16, 128]), &[8, 128], &[Grid(0), Const(0)]).unwrap();
    let xv = x.load();
    let wv = w.load().cast(DType::F32).broadcast_to(&[8, 128]);
    let a = xv.abs().add_scalar(1.0).log() + xv.tanh() * wv - xv.erf();
    let b = (a.exp() / (a * a + 1.0).sqrt()).maximum(xv).minimum(2.0);
    let r = (xv * xv).sum(1).add_scalar(1.0).rsqrt().broadcast_to(&[8, 128]);
    let m = xv.amax(1).broadcast_to(&[8, 128]);
    let s = xv.gt(0.0).select(b, -b);
    let col = k.iota(&[8, 128], 1).cast(DType::F32);
    let pid = k.program_id(0);
    let p = ((pid * 3 + 1) / 2).maximum(0).minimum(5) - 1;
    let y = s + r * m + col * 0.001 + p.cast(DType::F32).broadcast_to(&[8, 128]);
    o.store(y.cast(DType::BF16).cast(DType::F32).sigmoid().recip());
    k.when(pid.eq(1), || o2.store(y.reshape(&[16, 64]).reshape(&[8, 128])));
    k.finish().unwrap()
}

/// `[8, 128] · [128, 256]` and `[8, 128] · [256, 128]ᵀ` in one step.
fn products() -> Kernel {
    let k = Tiled::new("products", &[1], &[Semantics::Parallel]).unwrap();
    let map = [Const(0), Const(0)];
    let l = k.input(t(DType::F32, &[8, 128]), &[8, 128], &map).unwrap();
    let r = k.input(t(DType::F32, &[128, 256]), &[128, 256], &map).unwrap();
    let rt = k.input(t(DType::F32, &[256, 128]), &[256, 128], &map).unwrap();
    let o = k.output(t(DType::F32, &[8, 256]), &[8, 256], &map).unwrap();
    let ot = k.output(t(DType::F32, &[8, 256]), &[8, 256], &map).unwrap();
    o.store(l.load().matmul(r.load()));
    ot.store(l.load().matmul_t(rt.load()));
    k.finish().unwrap()
}

/// `o[r, c] = 2 x[r, c] + c + (r mod 64) / 8`, a block of 64 rows in 8-row slices by a loop.
fn strided() -> Kernel {
    let tt = t(DType::F32, &[256, 256]);
    let k = Tiled::new("strided_rows", &[4], &[Semantics::Parallel]).unwrap();
    let map = [Grid(0), Const(0)];
    let x = k.input(tt.clone(), &[64, 256], &map).unwrap();
    let o = k.output(tt, &[64, 256], &map).unwrap();
    k.fori(0, 8, |i| {
        let start = (i * 8).multiple_of(8);
        let rows = x.load_at(&[ds(start, 8), all()]);
        let col = k.iota(&[8, 256], 1).cast(DType::F32);
        let y = rows * 2.0 + col + i.cast(DType::F32).broadcast_to(&[8, 256]);
        o.store_at(&[ds(start, 8), all()], y);
    });
    k.finish().unwrap()
}

/// `o[block b] = x[block b] * (b + 1)`, the factor counted in an SMEM scratch buffer carried
/// across the sequential grid steps.
fn smem_counter() -> Kernel {
    let tt = t(DType::F32, &[256, 128]);
    let k = Tiled::new("smem_counter", &[4], &[Semantics::Arbitrary]).unwrap();
    let map = [Grid(0), Const(0)];
    let x = k.input(tt.clone(), &[64, 128], &map).unwrap();
    let o = k.output(tt, &[64, 128], &map).unwrap();
    let count = k.scratch(MType::smem(DType::I32, &[2])).unwrap();
    k.when(k.program_id(0).eq(0), || count.set(&[1], k.index(0)));
    let next = count.get(&[1]) + 1;
    count.set(&[1], next);
    let factor = count.get(&[1]).cast(DType::F32).broadcast_to(&[64, 128]);
    o.store(x.load() * factor);
    k.finish().unwrap()
}

/// The kernel's inputs.
fn inputs(k: &Kernel) -> Vec<Vec<f64>> {
    k.inputs()
        .iter()
        .enumerate()
        .map(|(i, w)| data(w.array.shape.num_elements().unwrap() as usize, i + 1))
        .collect()
}

/// Both forms' outputs, which must be the same bits.
fn both(k: &Kernel, inputs: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let readable = interpret(&custom_call_module_as(k, Form::Readable), inputs).unwrap();
    let shipped = interpret(&custom_call_module_as(k, Form::Shipped), inputs).unwrap();
    assert_eq!(readable.len(), shipped.len());
    for (i, (a, b)) in readable.iter().zip(&shipped).enumerate() {
        let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{} output {i}: the two forms differ", k.name);
    }
    readable
}

fn assert_near(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: {g} vs {w}");
    }
}

#[test]
fn both_forms_read_every_op_alike() {
    let k = every_op();
    let out = both(&k, &inputs(&k));
    assert!(out[0].iter().all(|v| v.is_finite()), "every element written");
    // The `when` wrote the second block only: the first stays as interpret mode starts it.
    assert!(out[1][..8 * 128].iter().all(|v| v.is_nan()));
    assert!(out[1][8 * 128..].iter().all(|v| v.is_finite()));
}

#[test]
fn both_forms_compute_both_products() {
    let k = products();
    let x = inputs(&k);
    let out = both(&k, &x);
    let (l, r, rt) = (&x[0], &x[1], &x[2]);
    let mut want = vec![0.0; 8 * 256];
    let mut want_t = vec![0.0; 8 * 256];
    for i in 0..8 {
        for j in 0..256 {
            for p in 0..128 {
                want[i * 256 + j] += l[i * 128 + p] * r[p * 256 + j];
                want_t[i * 256 + j] += l[i * 128 + p] * rt[j * 128 + p];
            }
        }
    }
    assert_near("l · r", &out[0], &want, 1e-6);
    assert_near("l · rtᵀ", &out[1], &want_t, 1e-6);
}

#[test]
fn both_forms_run_loops_over_dynamic_slices() {
    let k = strided();
    let x = inputs(&k);
    let out = both(&k, &x);
    let want: Vec<f64> = (0..256 * 256)
        .map(|f| {
            let (r, c) = (f / 256, f % 256);
            2.0 * x[0][f] + c as f64 + ((r % 64) / 8) as f64
        })
        .collect();
    assert_near("strided", &out[0], &want, 0.0);
}

#[test]
fn both_forms_carry_an_smem_counter_across_grid_steps() {
    let k = smem_counter();
    let x = inputs(&k);
    let out = both(&k, &x);
    let want: Vec<f64> =
        x[0].iter().enumerate().map(|(i, v)| v * ((i / (64 * 128)) + 1) as f64).collect();
    assert_near("smem_counter", &out[0], &want, 0.0);
}

/// `k`'s module in `form` with the first `from` of its body replaced by `to`.
fn corrupted(k: &Kernel, form: Form, from: &str, to: &str) -> String {
    let body = match form {
        Form::Readable => print_kernel(k),
        Form::Shipped => print_kernel_serialized(k),
    };
    assert!(body.contains(from), "`{from}` in:\n{body}");
    let module = custom_call_module_as(k, form);
    module.replace(&base64(body.as_bytes()), &base64(body.replacen(from, to, 1).as_bytes()))
}

#[test]
fn a_text_no_printer_writes_is_refused_with_its_line() {
    let (ops, prod, loops, smem) = (every_op(), products(), strided(), smem_counter());
    let shipped_tanh = print_kernel_serialized(&ops)
        .lines()
        .find(|l| l.contains("\"stable_mosaic.math.tanh\""))
        .unwrap()
        .to_owned();
    let cases: Vec<(&Kernel, Form, &str, String, &str)> = vec![
        (&ops, Form::Readable, "math.tanh", "math.tanhh".into(), "does not know `math.tanhh`"),
        (
            &ops,
            Form::Shipped,
            "stable_mosaic.math.tanh",
            "stable_mosaic.math.tanhh".into(),
            "does not know `math.tanhh`",
        ),
        (
            &ops,
            Form::Shipped,
            &shipped_tanh,
            shipped_tanh.replace(": (vector<8x128xf32>)", ": (vector<8x128xbf16>)"),
            "the line says vector<8x128xbf16>",
        ),
        (
            &ops,
            Form::Shipped,
            "\"stable_mosaic.math.tanh\"(%",
            "\"stable_mosaic.math.tanh\"(%99".into(),
            "is not defined here",
        ),
        (
            &ops,
            Form::Shipped,
            "\"stable_mosaic.scf.yield\"() : () -> ()",
            String::new(),
            "without its scf.yield",
        ),
        (
            &ops,
            Form::Readable,
            "arith.cmpf ogt",
            "arith.cmpf ugt".into(),
            "unknown predicate `ugt`",
        ),
        (
            &prod,
            Form::Shipped,
            "transpose_lhs = false",
            "transpose_lhs = true".into(),
            "transpose_lhs = true",
        ),
        (
            &prod,
            Form::Readable,
            ", transpose_lhs_hint = false",
            String::new(),
            "without its `transpose_lhs_hint`",
        ),
        (&prod, Form::Readable, ">, loc(", "> loc(".into(), "without the `,` of its mask type"),
        (
            &prod,
            Form::Readable,
            "dense<0.000000e+00>",
            "0.000000e+00".into(),
            "a vector constant is `dense<...>`",
        ),
        (
            &prod,
            Form::Shipped,
            "stable_mosaic.version = 15",
            "stable_mosaic.version = 21".into(),
            "line 1 of the Mosaic body: stable_mosaic.version 21",
        ),
        (
            &prod,
            Form::Shipped,
            "{stable_mosaic.version = 15 : i64} ",
            String::new(),
            "Missing or invalid version",
        ),
        (&loops, Form::Readable, ", 8 : i32", ", 16 : i32".into(), "is not the multiple of 16"),
        (
            &smem,
            Form::Shipped,
            "\"stable_mosaic.memref.load\"(%arg3, %",
            "\"stable_mosaic.memref.load\"(%arg2, %".into(),
            "`%arg2` has type memref<64x128xf32",
        ),
        (
            &loops,
            Form::Shipped,
            "%c1 = \"stable_mosaic.arith.constant\"() {value = 0 : i32}",
            "%c1 = \"stable_mosaic.arith.constant\"() {value = 1 : i32}".into(),
            "which leaves its [256, 256] array",
        ),
    ];
    for (k, form, from, to, needle) in cases {
        let e = interpret(&corrupted(k, form, from, &to), &inputs(k))
            .expect_err(&format!("{} {form:?}: `{from}` → `{to}` is refused", k.name));
        assert!(e.contains(needle), "{} {form:?}: `{from}` → `{to}`: {e}", k.name);
    }
}

#[test]
fn the_config_and_the_body_agree_on_the_form() {
    let k = products();
    let x = inputs(&k);
    let (readable, shipped) = (print_kernel(&k), print_kernel_serialized(&k));
    let swap = |form: Form, from: &str, to: &str| {
        custom_call_module_as(&k, form).replace(&base64(from.as_bytes()), &base64(to.as_bytes()))
    };
    let e = interpret(&swap(Form::Shipped, &shipped, &readable), &x).unwrap_err();
    assert!(e.contains("Operation not in a serialized form"), "{e}");
    let e = interpret(&swap(Form::Readable, &readable, &shipped), &x).unwrap_err();
    assert!(e.contains("no serialization_format"), "{e}");
    let two = custom_call_module_as(&k, Form::Shipped)
        .replace("\\22serialization_format\\22: 1", "\\22serialization_format\\22: 2");
    let e = interpret(&two, &x).unwrap_err();
    assert!(e.contains("serialization_format 2"), "{e}");
}

#[test]
fn an_aliased_output_starts_as_its_input() {
    // One step writes the first of the output's two blocks; the alias keeps the input's rows
    // in the other (without it they stay NaN).
    let ty = t(DType::F32, &[16, 128]);
    let mut b = TiledBuilder::new("half_copy", &[1], &[Semantics::Parallel]).unwrap();
    let x = b.input(ty.clone(), &[8, 128], &[Const(0), Const(0)]).unwrap();
    let o = b.output(ty, &[8, 128], &[Const(0), Const(0)]).unwrap();
    let v = b.load(x).unwrap();
    let two = b.splat(DType::F32, &[8, 128], 2.0).unwrap();
    let v = b.mul(v, two).unwrap();
    b.store(o, v).unwrap();
    let k = b.finish_without_layout_checks().unwrap();
    let x = inputs(&k);
    for form in [Form::Readable, Form::Shipped] {
        let module = custom_call_module_as(&k, form);
        let plain = interpret(&module, &x).unwrap();
        assert!(plain[0][8 * 128..].iter().all(|v| v.is_nan()), "{form:?}");
        let alias = ", output_operand_aliases = [#stablehlo.output_operand_alias<\
                     output_tuple_indices = [], operand_index = 0, operand_tuple_indices = []>]";
        let aliased = module.replacen(", result_layouts", &format!("{alias}, result_layouts"), 1);
        let out = interpret(&aliased, &x).unwrap();
        let want: Vec<f64> =
            x[0].iter().enumerate().map(|(i, v)| if i < 8 * 128 { 2.0 * v } else { *v }).collect();
        assert_near(&format!("{form:?} aliased"), &out[0], &want, 0.0);
    }
}
