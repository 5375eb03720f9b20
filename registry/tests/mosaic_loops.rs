//! Counted loops, dynamic sub-slices of blocks with multiple-of hints, `iota` and integer to
//! float casts in tiled kernels: libtpu compiles them (both printed forms, v5e and v6e), and
//! the CPU twin and the interpreter of both printed forms compute what an f64 reference says.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

use tpu_kernels::mosaic::dsl::{Tiled, all, ds};
use tpu_kernels::mosaic::{Form, IndexExpr, Kernel, Semantics, cpu_twin, custom_call_module_as};
use tpu_kernels::{DType, TensorType};
use tpu_kernels_registry::numerics::{Tolerance, assert_close};
use tpu_kernels_registry::pjrt::testing::{cpu_client_for_tests, libtpu_for_tests};
use tpu_kernels_registry::pjrt::{CompileOptions, Program, Topology};

/// The kernel's printed module in both forms, read back by the interpreter, against `want`.
fn interpreted_matches(kernel: &Kernel, inputs: &[Vec<f64>], want: &[f64], tol: Tolerance) {
    for form in [Form::Readable, Form::Shipped] {
        let out = tpu_kernels::mosaic::interpret(&custom_call_module_as(kernel, form), inputs)
            .unwrap_or_else(|e| panic!("{} {form:?}: {e}", kernel.name));
        assert_close(&format!("{} interpreter ({form:?})", kernel.name), &out[0], want, tol);
    }
}

const ROWS: u64 = 256;
const COLS: u64 = 256;
const BLOCK: u64 = 64;
const STEP: u64 = 8;

/// `o[r, c] = 2 x[r, c] + c + (r mod 64) / 8`: each block of 64 rows in 8-row slices, by a
/// loop whose index places the slice (a multiple of 8) and feeds the value.
fn strided(dtype: DType) -> Kernel {
    let t = TensorType::new(dtype, [ROWS, COLS]);
    let k = Tiled::new("strided_rows", &[ROWS / BLOCK], &[Semantics::Parallel]).unwrap();
    let map = [IndexExpr::Grid(0), IndexExpr::Const(0)];
    let x = k.input(t.clone(), &[BLOCK, COLS], &map).unwrap();
    let o = k.output(t, &[BLOCK, COLS], &map).unwrap();
    k.fori(0, (BLOCK / STEP) as i64, |i| {
        let start = (i * STEP as i64).multiple_of(STEP);
        let rows = x.load_at(&[ds(start, STEP), all()]).cast(DType::F32);
        let col = k.iota(&[STEP, COLS], 1).cast(DType::F32);
        let slice = i.cast(DType::F32);
        let y = rows * 2.0 + col + slice.broadcast_to(&[STEP, COLS]);
        o.store_at(&[ds(start, STEP), all()], y.cast(dtype));
    });
    k.finish().unwrap()
}

fn reference(x: &[f64]) -> Vec<f64> {
    (0..ROWS as usize)
        .flat_map(|r| (0..COLS as usize).map(move |c| (r, c)))
        .map(|(r, c)| {
            2.0 * x[r * COLS as usize + c]
                + c as f64
                + ((r % BLOCK as usize) / STEP as usize) as f64
        })
        .collect()
}

#[test]
fn loops_slices_and_iota_print_both_forms() {
    let k = strided(DType::F32);
    let text = tpu_kernels::mosaic::print_kernel(&k);
    for needle in [
        "scf.for",
        "tpu.iota {dimensions = array<i32: 1>}",
        "tpu.assume_multiple",
        "arith.sitofp",
        "vector<8x256xf32>",
    ] {
        assert!(text.contains(needle), "{needle} in:\n{text}");
    }
    let shipped = tpu_kernels::mosaic::print_kernel_serialized(&k);
    for needle in [
        "stable_mosaic.scf.for",
        "stable_mosaic.tpu.iota",
        "multiple = 8 : i32",
        "stable_mosaic.arith.sitofp",
    ] {
        assert!(shipped.contains(needle), "{needle} in:\n{shipped}");
    }
}

#[test]
fn loops_slices_and_iota_compile_for_v5e_and_v6e() {
    let Some(libtpu) = libtpu_for_tests() else { return };
    for dtype in [DType::F32, DType::BF16] {
        let k = strided(dtype);
        for topology in ["v5e:1x1", "v6e:1x1"] {
            let topo = Topology::new(&libtpu, topology).unwrap();
            for form in [Form::Shipped, Form::Readable] {
                let text = custom_call_module_as(&k, form);
                topo.compile(&Program::text(text), &CompileOptions::new())
                    .unwrap_or_else(|e| panic!("{dtype} on {topology} ({form:?}): {e}"));
            }
        }
    }
}

#[test]
fn the_twin_runs_the_loop_over_dynamic_slices() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let x: Vec<f32> =
        (0..(ROWS * COLS) as usize).map(|i| ((i * 37 % 101) as f32 - 50.0) / 16.0).collect();
    let k = strided(DType::F32);
    let exe = client
        .compile(&Program::text(cpu_twin(&k).unwrap().to_text()), &CompileOptions::new())
        .unwrap();
    let buf = client.buffer_from_host(&x, &[ROWS as i64, COLS as i64]).unwrap();
    let out = exe.execute(&[&buf]).unwrap()[0].to_vec::<f32>().unwrap();
    let want = reference(&x.iter().map(|v| f64::from(*v)).collect::<Vec<_>>());
    assert_close("strided_rows twin", &out, &want, Tolerance::new(1e-6, 1e-6));
    let x64: Vec<f64> = x.iter().map(|v| f64::from(*v)).collect();
    interpreted_matches(&k, &[x64], &want, Tolerance::new(1e-6, 1e-6));
}

#[test]
fn a_slice_outside_its_block_or_a_bad_loop_bound_is_an_error_naming_the_line() {
    let t = TensorType::new(DType::F32, [ROWS, COLS]);
    let k = Tiled::new("bad_slice", &[1], &[Semantics::Parallel]).unwrap();
    let map = [IndexExpr::Const(0), IndexExpr::Const(0)];
    let x = k.input(t.clone(), &[ROWS, COLS], &map).unwrap();
    let o = k.output(t, &[ROWS, COLS], &map).unwrap();
    let v = x.load_at(&[ds(0, ROWS + 8), all()]);
    o.store(v);
    let e = k.finish().unwrap_err();
    assert!(e.message.contains("does not fit") && e.message.contains("mosaic_loops.rs"), "{e}");
    assert_eq!(e.kernel, "bad_slice");
}

/// Doubles rows 64..128 of `x` in place: the output is `x`'s buffer, and the grid writes one
/// block of it; the rest keeps `x`'s values.
#[tpu_kernels::tpu_kernel(
    op = "looptest::double_rows_in_place",
    shapes(x = [256, 256]),
    output = same_as(x),
    tiled(
        grid = [1],
        semantics = [parallel],
        inputs(x = block([64, 256], |_i| (1, 0))),
        outputs(o = block([64, 256], |_i| (1, 0))),
        aliases(o = x),
    ),
    canonical = ["f32[256,256]"],
)]
fn double_rows_in_place(x: tpu_kernels::mosaic::Block, o: tpu_kernels::mosaic::Block) {
    o.store(x.load() * 2.0);
}

#[test]
fn an_aliased_output_keeps_the_blocks_the_grid_does_not_write() {
    let record = &double_rows_in_place::REGISTRATION;
    let sig = record.parse_signature("f32[256,256]").unwrap();
    let kernel = double_rows_in_place::kernel(&sig).unwrap();
    assert_eq!(kernel.aliases, vec![(0, 0)]);
    let tpu = record.emit_text(&sig, tpu_kernels::registration::Platform::Tpu).unwrap();
    assert!(tpu.contains("output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 0, operand_tuple_indices = []>]"), "{tpu}");
    if let Some(libtpu) = libtpu_for_tests() {
        for topology in ["v5e:1x1", "v6e:1x1"] {
            let topo = Topology::new(&libtpu, topology).unwrap();
            for form in [Form::Shipped, Form::Readable] {
                topo.compile(
                    &Program::text(custom_call_module_as(&kernel, form)),
                    &CompileOptions::new(),
                )
                .unwrap_or_else(|e| panic!("{topology} {form:?}: {e}"));
            }
        }
    }
    let Some(client) = cpu_client_for_tests(1) else { return };
    let x: Vec<f32> = (0..256 * 256).map(|i| (i % 97) as f32 - 48.0).collect();
    let exe = client
        .compile(
            &Program::text(double_rows_in_place::module(&sig).unwrap().to_text()),
            &CompileOptions::new(),
        )
        .unwrap();
    let buf = client.buffer_from_host(&x, &[256, 256]).unwrap();
    let out = exe.execute(&[&buf]).unwrap()[0].to_vec::<f32>().unwrap();
    let want: Vec<f64> = x
        .iter()
        .enumerate()
        .map(
            |(i, v)| {
                if (64..128).contains(&(i / 256)) { 2.0 * f64::from(*v) } else { f64::from(*v) }
            },
        )
        .collect();
    assert_close("double_rows_in_place twin", &out, &want, Tolerance::new(0.0, 0.0));
    let x64: Vec<f64> = x.iter().map(|v| f64::from(*v)).collect();
    interpreted_matches(&kernel, &[x64], &want, Tolerance::new(0.0, 0.0));
}

#[test]
fn without_an_alias_a_partial_grid_is_refused_as_leaving_blocks_unwritten() {
    let t = TensorType::new(DType::F32, [256, 256]);
    let k = Tiled::new("partial", &[1], &[Semantics::Parallel]).unwrap();
    let map = [IndexExpr::Const(1), IndexExpr::Const(0)];
    let x = k.input(t.clone(), &[64, 256], &map).unwrap();
    let o = k.output(t, &[64, 256], &map).unwrap();
    o.store(x.load());
    let e = k.finish().unwrap_err();
    assert_eq!(e.kind, tpu_kernels::ErrorKind::Coverage, "{e}");
    assert!(e.message.contains("unwritten"), "{e}");
}

/// `o[block b] = x[block b] * (b + 1)`, the factor counted in an SMEM scratch buffer carried
/// across the sequential (`arbitrary`) grid steps.
fn smem_counter() -> Kernel {
    let t = TensorType::new(DType::F32, [ROWS, COLS]);
    let k = Tiled::new("smem_counter", &[ROWS / BLOCK], &[Semantics::Arbitrary]).unwrap();
    let map = [IndexExpr::Grid(0), IndexExpr::Const(0)];
    let x = k.input(t.clone(), &[BLOCK, COLS], &map).unwrap();
    let o = k.output(t, &[BLOCK, COLS], &map).unwrap();
    let count = k.scratch(tpu_kernels::mosaic::MType::smem(DType::I32, &[2])).unwrap();
    k.when(k.program_id(0).eq(0), || count.set(&[1], k.index(0)));
    let next = count.get(&[1]) + 1;
    count.set(&[1], next);
    let factor = count.get(&[1]).cast(DType::F32).broadcast_to(&[BLOCK, COLS]);
    o.store(x.load() * factor);
    k.finish().unwrap()
}

#[test]
fn smem_scratch_is_read_and_written_one_element_at_a_time() {
    let k = smem_counter();
    let text = tpu_kernels::mosaic::print_kernel(&k);
    assert!(text.contains("memref.load") && text.contains("memref.store"), "{text}");
    assert!(text.contains("#tpu.memory_space<smem>"), "{text}");
    if let Some(libtpu) = libtpu_for_tests() {
        for topology in ["v5e:1x1", "v6e:1x1"] {
            let topo = Topology::new(&libtpu, topology).unwrap();
            for form in [Form::Shipped, Form::Readable] {
                topo.compile(
                    &Program::text(custom_call_module_as(&k, form)),
                    &CompileOptions::new(),
                )
                .unwrap_or_else(|e| panic!("{topology} {form:?}: {e}"));
            }
        }
    }
    let Some(client) = cpu_client_for_tests(1) else { return };
    let x: Vec<f32> = (0..(ROWS * COLS) as usize).map(|i| (i % 13) as f32 - 6.0).collect();
    let exe = client
        .compile(&Program::text(cpu_twin(&k).unwrap().to_text()), &CompileOptions::new())
        .unwrap();
    let buf = client.buffer_from_host(&x, &[ROWS as i64, COLS as i64]).unwrap();
    let out = exe.execute(&[&buf]).unwrap()[0].to_vec::<f32>().unwrap();
    let want: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, v)| f64::from(*v) * ((i / (BLOCK * COLS) as usize) + 1) as f64)
        .collect();
    assert_close("smem_counter twin", &out, &want, Tolerance::new(0.0, 0.0));
    let x64: Vec<f64> = x.iter().map(|v| f64::from(*v)).collect();
    interpreted_matches(&k, &[x64], &want, Tolerance::new(0.0, 0.0));
    // A vector load from SMEM is refused, naming the op.
    let t = TensorType::new(DType::F32, [8, 128]);
    let bad = Tiled::new("vector_from_smem", &[1], &[Semantics::Parallel]).unwrap();
    let map = [IndexExpr::Const(0), IndexExpr::Const(0)];
    let _x = bad.input(t.clone(), &[8, 128], &map).unwrap();
    let o = bad.output(t, &[8, 128], &map).unwrap();
    let s = bad.scratch(tpu_kernels::mosaic::MType::smem(DType::F32, &[8, 128])).unwrap();
    o.store(s.load());
    let e = bad.finish().unwrap_err();
    assert!(e.message.contains("needs a VMEM memref"), "{e}");
}

/// The SMEM counter of [`smem_counter`], declared with the macro: `smem(i32, [1])` scratch.
#[tpu_kernels::tpu_kernel(
    op = "looptest::scale_by_block_count",
    shapes(x = [M, N]),
    require(M % 64 == 0),
    output = same_as(x),
    tiled(
        grid = [M / 64],
        semantics = [arbitrary],
        inputs(x = block([64, N], |i| (i, 0))),
        outputs(o = block([64, N], |i| (i, 0))),
        scratch(count = smem(i32, [1])),
    ),
    canonical = ["f32[256,128]"],
)]
fn scale_by_block_count(
    k: &Tiled,
    x: tpu_kernels::mosaic::Block,
    o: tpu_kernels::mosaic::Block,
    count: tpu_kernels::mosaic::Block,
) {
    k.when(k.program_id(0).eq(0), || count.set(&[0], k.index(0)));
    count.set(&[0], count.get(&[0]) + 1);
    let shape = o.shape();
    o.store(x.load() * count.get(&[0]).cast(DType::F32).broadcast_to(&shape));
}

#[test]
fn the_macro_declares_smem_scratch() {
    let sig = scale_by_block_count::REGISTRATION.parse_signature("f32[256,128]").unwrap();
    let kernel = scale_by_block_count::kernel(&sig).unwrap();
    assert_eq!(kernel.scratch, vec![tpu_kernels::mosaic::MType::smem(DType::I32, &[1])]);
    let Some(client) = cpu_client_for_tests(1) else { return };
    let x: Vec<f32> = (0..256 * 128).map(|i| (i % 7) as f32).collect();
    let exe = client
        .compile(
            &Program::text(scale_by_block_count::module(&sig).unwrap().to_text()),
            &CompileOptions::new(),
        )
        .unwrap();
    let buf = client.buffer_from_host(&x, &[256, 128]).unwrap();
    let out = exe.execute(&[&buf]).unwrap()[0].to_vec::<f32>().unwrap();
    let want: Vec<f64> =
        x.iter().enumerate().map(|(i, v)| f64::from(*v) * ((i / (64 * 128)) + 1) as f64).collect();
    assert_close("scale_by_block_count twin", &out, &want, Tolerance::new(0.0, 0.0));
}
