//! Scalar prefetch: `i32` tables the custom call takes before its inputs, whole in SMEM, read
//! by index maps (blocks picked by data: a gather of row blocks, a scatter into an aliased
//! output) and by the body. libtpu compiles both printed forms for v5e and v6e; the CPU twin
//! and the interpreter of both forms compute what an f64 reference says; what Rust can tell is
//! wrong is refused before libtpu, naming the table or the window.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

#[path = "support/tiled_kernels.rs"]
mod tiled_kernels;

use tpu_kernels::mosaic::dsl::Tiled;
use tpu_kernels::mosaic::{
    Form, IndexExpr, Kernel, Semantics, cpu_twin, custom_call_module_as, interpret, print_kernel,
    print_kernel_serialized,
};
use tpu_kernels::{DType, ErrorKind, TensorType};
use tpu_kernels_registry::numerics::{Tolerance, assert_close};
use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::pjrt::{CompileOptions, Program};

const BLOCK: u64 = 8;
const COLS: u64 = 256;
/// Row blocks of the source array.
const SOURCE_BLOCKS: u64 = 6;
/// Blocks gathered (the grid), some of them twice.
const IDS: [i32; 4] = [4, 0, 4, 2];

fn ids() -> TensorType {
    TensorType::new(DType::I32, [IDS.len() as u64])
}

/// `o[block i] = x[block ids[i]] * (ids[i] + 1)`: the index map of `x` reads the table, and so
/// does the body.
fn gather(dtype: DType) -> Kernel {
    let x = TensorType::new(dtype, [SOURCE_BLOCKS * BLOCK, COLS]);
    let o = TensorType::new(dtype, [IDS.len() as u64 * BLOCK, COLS]);
    let k = Tiled::new("gather_blocks", &[IDS.len() as u64], &[Semantics::Parallel]).unwrap();
    let table = k.prefetch(ids()).unwrap();
    let picked = [IndexExpr::Prefetch { table: 0, axis: 0 }, IndexExpr::Const(0)];
    let x = k.input(x, &[BLOCK, COLS], &picked).unwrap();
    let o = k.output(o, &[BLOCK, COLS], &[IndexExpr::Grid(0), IndexExpr::Const(0)]).unwrap();
    let factor = (table.get(&[k.program_id(0)]) + 1).cast(DType::F32);
    let y = x.load().cast(DType::F32) * factor.broadcast_to(&[BLOCK, COLS]);
    o.store(y.cast(dtype));
    k.finish().unwrap()
}

fn source() -> Vec<f64> {
    (0..SOURCE_BLOCKS * BLOCK * COLS).map(|i| f64::from((i % 61) as u32) - 30.0).collect()
}

fn gathered(x: &[f64]) -> Vec<f64> {
    let block = (BLOCK * COLS) as usize;
    IDS.iter()
        .flat_map(|id| {
            let from = *id as usize * block;
            x[from..from + block].iter().map(move |v| v * f64::from(id + 1))
        })
        .collect()
}

fn interpreted_matches(kernel: &Kernel, inputs: &[Vec<f64>], want: &[f64]) {
    for form in [Form::Readable, Form::Shipped] {
        let out = interpret(&custom_call_module_as(kernel, form), inputs)
            .unwrap_or_else(|e| panic!("{} {form:?}: {e}", kernel.name));
        let what = format!("{} interpreter ({form:?})", kernel.name);
        assert_close(&what, &out[0], want, Tolerance::new(0.0, 0.0));
    }
}

/// The first output of a twin module run on the CPU plugin with the table [`IDS`], then f32
/// arrays of [`COLS`] columns (`None` without the plugin).
fn twin_output(text: String, arrays: &[&[f64]]) -> Option<Vec<f64>> {
    let client = cpu_client_for_tests(1)?;
    let exe = client.compile(&Program::text(text), &CompileOptions::new()).unwrap();
    let mut buffers = vec![client.buffer_from_host(&IDS, &[IDS.len() as i64]).unwrap()];
    for a in arrays {
        let values: Vec<f32> = a.iter().map(|v| *v as f32).collect();
        let dims = [(a.len() as u64 / COLS) as i64, COLS as i64];
        buffers.push(client.buffer_from_host(&values, &dims).unwrap());
    }
    let refs: Vec<_> = buffers.iter().collect();
    let out = exe.execute(&refs).unwrap()[0].to_vec::<f32>().unwrap();
    Some(out.into_iter().map(f64::from).collect())
}

fn table() -> Vec<f64> {
    IDS.iter().map(|i| f64::from(*i)).collect()
}

#[test]
fn a_prefetched_table_is_the_first_operand_and_every_transform_reads_it() {
    let k = gather(DType::F32);
    let readable = print_kernel(&k);
    assert!(readable.contains("scalar_prefetch = 1 : i64"), "{readable}");
    // The kernel takes the grid index, the table, then the windows; every transform function
    // takes the grid index and the table, and `x`'s loads its block index from it.
    assert!(readable.contains("(%arg0: i32, %arg1: memref<4xi32, #tpu.memory_space<smem>>, %arg2: memref<8x256xf32, #tpu.memory_space<vmem>>"), "{readable}");
    assert!(readable.contains("func.func @transform_1(%arg0: i32, %arg1: memref<4xi32, #tpu.memory_space<smem>>) -> (i32, i32)"), "{readable}");
    assert!(
        readable.contains("%p0 = memref.load %arg1[%i0] : memref<4xi32, #tpu.memory_space<smem>>"),
        "{readable}"
    );
    let shipped = print_kernel_serialized(&k);
    assert!(shipped.contains("\"stable_mosaic.memref.load\"(%arg1, %i0) : (memref<4xi32, #tpu.memory_space<smem>>, index) -> i32"), "{shipped}");
    assert!(
        shipped.contains(
            "function_type = (i32, memref<4xi32, #tpu.memory_space<smem>>) -> (i32, i32)"
        ),
        "{shipped}"
    );
    let call = custom_call_module_as(&k, Form::Shipped);
    assert!(call.contains("@main(%arg0: tensor<4xi32>, %arg1: tensor<48x256xf32>)"), "{call}");
    assert!(
        call.contains(
            "operand_layouts = [dense<0> : tensor<1xindex>, dense<[1, 0]> : tensor<2xindex>]"
        ),
        "{call}"
    );
}

#[test]
fn blocks_picked_by_a_prefetched_table_compile_for_v5e_and_v6e() {
    for dtype in [DType::F32, DType::BF16] {
        tiled_kernels::compiles_for_v5e_and_v6e(&gather(dtype));
    }
}

#[test]
fn the_twin_and_the_interpreter_gather_the_blocks_the_table_names() {
    let k = gather(DType::F32);
    let x = source();
    let want = gathered(&x);
    interpreted_matches(&k, &[table(), x.clone()], &want);
    let Some(out) = twin_output(cpu_twin(&k).unwrap().to_text(), &[&x]) else { return };
    assert_close("gather_blocks twin", &out, &want, Tolerance::new(0.0, 0.0));
}

#[test]
fn an_index_the_table_takes_out_of_the_array_is_caught_by_the_interpreter() {
    let k = gather(DType::F32);
    let mut bad = table();
    bad[2] = SOURCE_BLOCKS as f64;
    let e = interpret(&custom_call_module_as(&k, Form::Shipped), &[bad, source()]).unwrap_err();
    assert!(e.contains("at grid point [2]") && e.contains("leaves its [48, 256] array"), "{e}");
}

/// `o = base`, then `o[block ids[i]] = x[block i]`: an output whose blocks the table picks,
/// aliased to `base` so the blocks no id names keep its contents.
fn scatter(alias: bool) -> Result<Kernel, tpu_kernels::BuildError> {
    let base = TensorType::new(DType::F32, [SOURCE_BLOCKS * BLOCK, COLS]);
    let x = TensorType::new(DType::F32, [IDS.len() as u64 * BLOCK, COLS]);
    // The grid runs in order: a repeated id is written by its last step, as on a TPU core.
    let k = Tiled::new("scatter_blocks", &[IDS.len() as u64], &[Semantics::Arbitrary])?;
    k.prefetch(ids())?;
    let picked = [IndexExpr::Prefetch { table: 0, axis: 0 }, IndexExpr::Const(0)];
    let _base = k.input(base.clone(), &[BLOCK, COLS], &picked)?;
    let x = k.input(x, &[BLOCK, COLS], &[IndexExpr::Grid(0), IndexExpr::Const(0)])?;
    let o = k.output(base, &[BLOCK, COLS], &picked)?;
    if alias {
        k.alias(0, 0)?;
    }
    o.store(x.load());
    k.finish()
}

#[test]
fn an_aliased_output_takes_blocks_where_the_table_says() {
    let k = scatter(true).unwrap();
    let call = custom_call_module_as(&k, Form::Shipped);
    // The alias names the custom call's operand: the table is operand 0, `base` operand 1.
    assert!(call.contains("operand_index = 1, operand_tuple_indices = []"), "{call}");
    tiled_kernels::compiles_for_v5e_and_v6e(&k);
    let base = source();
    let x: Vec<f64> = (0..IDS.len() as u64 * BLOCK * COLS).map(|i| 1000.0 + i as f64).collect();
    let block = (BLOCK * COLS) as usize;
    let mut want = base.clone();
    for (i, id) in IDS.iter().enumerate() {
        let to = *id as usize * block;
        want[to..to + block].copy_from_slice(&x[i * block..(i + 1) * block]);
    }
    interpreted_matches(&k, &[table(), base.clone(), x.clone()], &want);
    let Some(out) = twin_output(cpu_twin(&k).unwrap().to_text(), &[&base, &x]) else { return };
    assert_close("scatter_blocks twin", &out, &want, Tolerance::new(0.0, 0.0));
}

#[test]
fn an_output_whose_blocks_the_table_picks_must_alias_an_input() {
    let e = scatter(false).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Coverage, "{e}");
    assert!(e.message.contains("output 0: its index map reads a scalar-prefetch table"), "{e}");
    assert!(e.message.contains("alias it to an input"), "{e}");
}

#[test]
fn a_wrong_table_or_a_write_to_one_is_refused_naming_it() {
    let grid = [IDS.len() as u64];
    let x = TensorType::new(DType::F32, [SOURCE_BLOCKS * BLOCK, COLS]);
    let new = || Tiled::new("bad_prefetch", &grid, &[Semantics::Parallel]).unwrap();
    // Not i32, or not 1-d.
    for table in [TensorType::new(DType::F32, [4]), TensorType::new(DType::I32, [2, 2])] {
        let e = new().prefetch(table.clone()).unwrap_err();
        assert!(e.message.contains("a scalar-prefetch table is a 1-d, non-empty i32 array"), "{e}");
        assert!(e.message.contains(&table.to_string()), "{e}");
    }
    // After a window.
    let k = new();
    k.input(x.clone(), &[BLOCK, COLS], &[IndexExpr::Grid(0), IndexExpr::Const(0)]).unwrap();
    let e = k.prefetch(ids()).unwrap_err();
    assert!(e.message.contains("declared before the windows"), "{e}");
    // An index map reading a table the kernel does not have.
    let k = new();
    k.prefetch(ids()).unwrap();
    let map = [IndexExpr::Prefetch { table: 1, axis: 0 }, IndexExpr::Const(0)];
    let e = k.input(x.clone(), &[BLOCK, COLS], &map).unwrap_err();
    assert!(e.message.contains("reads scalar-prefetch table 1; the kernel has 1"), "{e}");
    // The body writing a table.
    let k = new();
    let table = k.prefetch(ids()).unwrap();
    let map = [IndexExpr::Grid(0), IndexExpr::Const(0)];
    let x = k.input(x.clone(), &[BLOCK, COLS], &map).unwrap();
    let o = k.output(TensorType::new(DType::F32, [32, COLS]), &[BLOCK, COLS], &map).unwrap();
    table.set(&[0i64], k.index(1));
    o.store(x.load());
    let e = k.finish().unwrap_err();
    assert!(e.message.contains("scalar-prefetch table 0 is read-only"), "{e}");
}

#[test]
fn a_vmem_limit_travels_in_the_backend_config_and_is_checked() {
    let k = gather(DType::F32);
    let with = |bytes: u64| {
        let t = Tiled::new("limited", &[1], &[Semantics::Parallel]).unwrap();
        t.vmem_limit(bytes).map(|_| t)
    };
    let e = with(200 << 20).unwrap_err();
    assert!(e.message.contains("vmem_limit_bytes 209715200"), "{e}");
    assert!(with(1000).is_err() && with(0).is_err());
    let mut limited = k.clone();
    limited.vmem_limit_bytes = Some(48 << 20);
    let call = custom_call_module_as(&limited, Form::Shipped);
    let config = "\\22scoped_memory_configs\\22: [{\\22memory_space\\22: 1, \\22offset\\22: 0, \\22size\\22: 50331648}]";
    assert!(call.contains(config), "{call}");
    tiled_kernels::compiles_for_v5e_and_v6e(&limited);
    // The interpreter reads a config that carries one.
    interpreted_matches(&limited, &[table(), source()], &gathered(&source()));
}

/// A paged cache update (the write half of paged attention): `new`'s row block `i` goes to
/// page `pages[i]` of `cache`, in place (`mutates`: the op writes the cache's own memory); the
/// pages no entry names keep their rows.
#[tpu_kernels::tpu_kernel(
    op = "prefetchtest::write_pages",
    dtypes = [i32],
    shapes(pages = [P], cache = f32[R, D], new = f32[N, D]),
    require(N % 8 == 0, R % 8 == 0),
    output = same_as(cache),
    mutates = [cache],
    tiled(
        prefetch(pages),
        grid = [N / 8],
        semantics = [arbitrary],
        inputs(cache = block([8, D], |i| (pages[i], 0)), new = block([8, D], |i| (i, 0))),
        outputs(out = block([8, D], |i| (pages[i], 0))),
        aliases(out = cache),
        vmem_limit = 24 * 1024 * 1024,
    ),
    canonical = ["i32[4], f32[48,256], f32[32,256]"],
)]
fn write_pages(
    pages: tpu_kernels::mosaic::Block,
    cache: tpu_kernels::mosaic::Block,
    new: tpu_kernels::mosaic::Block,
    out: tpu_kernels::mosaic::Block,
) {
    let _ = (pages, cache);
    out.store(new.load());
}

#[test]
fn the_macro_declares_prefetch_tables_index_maps_that_read_them_and_a_vmem_limit() {
    let record = &write_pages::REGISTRATION;
    let sig = record.parse_signature("i32[4], f32[48,256], f32[32,256]").unwrap();
    let kernel = write_pages::kernel(&sig).unwrap();
    assert_eq!(kernel.prefetch, vec![ids()]);
    assert_eq!(kernel.aliases, vec![(0, 0)]);
    assert_eq!(kernel.vmem_limit_bytes, Some(24 << 20));
    let picked = vec![IndexExpr::Prefetch { table: 0, axis: 0 }, IndexExpr::Const(0)];
    assert_eq!(kernel.windows[0].index_map, picked);
    assert_eq!(kernel.windows[2].index_map, picked);
    tiled_kernels::compiles_for_v5e_and_v6e(&kernel);
    // A table that is not a 1-d i32 array is declined by the plan, not an error.
    let bad = record.parse_signature("i32[2,2], f32[48,256], f32[32,256]").unwrap();
    let why = write_pages::plan(&bad).unwrap_err();
    assert!(why.contains("scalar-prefetch table 0 is tensor<2x2xi32>"), "{why}");
    // The twin (what the registration emits off a TPU) and the interpreter agree on the data.
    let cache = source();
    let new: Vec<f64> = (0..32 * COLS).map(|i| -1.0 - i as f64).collect();
    let block = (BLOCK * COLS) as usize;
    let mut want = cache.clone();
    for (i, id) in IDS.iter().enumerate() {
        let to = *id as usize * block;
        want[to..to + block].copy_from_slice(&new[i * block..(i + 1) * block]);
    }
    interpreted_matches(&kernel, &[table(), cache.clone(), new.clone()], &want);
    let text = write_pages::module(&sig).unwrap().to_text();
    let Some(out) = twin_output(text, &[&cache, &new]) else { return };
    assert_close("write_pages twin", &out, &want, Tolerance::new(0.0, 0.0));
    // `tpuk check`'s interpreter column fills the table with blocks that exist.
    let client = cpu_client_for_tests(1).unwrap();
    let k = tpu_kernels_registry::Kernel::from_static(record);
    let worst = tpu_kernels_registry::check::interpreter_agreement(&client, &k, &sig).unwrap();
    assert_eq!(worst, 0.0);
}

/// The cache is updated in place: the shipped TPU module donates it at `@main` (besides the
/// kernel's own `input_output_aliases`) and compiles for v5e and v6e, and an eager in-place call
/// writes the new pages into the caller's memory, the other pages untouched.
#[test]
fn the_paged_cache_write_updates_the_cache_where_it_lies() {
    use tpu_kernels::registration::Platform;
    use tpu_kernels_registry::pjrt::Topology;
    use tpu_kernels_registry::{Dispatcher, HostTensor, Registry};

    let record = &write_pages::REGISTRATION;
    let sig = record.parse_signature("i32[4], f32[48,256], f32[32,256]").unwrap();
    assert_eq!(record.mutated_inputs().unwrap(), vec![1]);
    let tpu = record.emit_text(&sig, Platform::Tpu).unwrap();
    assert!(tpu.contains("%arg1: tensor<48x256xf32> {tf.aliasing_output = 0 : i32}"), "{tpu}");
    assert!(tpu.contains("output_operand_aliases"), "{tpu}");
    if let Some(libtpu) = tpu_kernels_registry::pjrt::testing::libtpu_for_tests() {
        for topology in ["v5e:1x1", "v6e:1x1"] {
            let topo = Topology::new(&libtpu, topology).unwrap();
            topo.compile(&Program::text(tpu.clone()), &CompileOptions::new())
                .unwrap_or_else(|e| panic!("{topology}: {e}"));
        }
    }
    let twin = record.emit(&sig).unwrap().to_text();
    assert!(twin.contains("tf.aliasing_output = 0 : i32"), "{twin}");

    let Some(client) = cpu_client_for_tests(1) else { return };
    let cache_rt = std::sync::Arc::new(tpu_kernels_registry::cache::CompileCache::new(
        tpu_kernels_registry::cache::CacheConfig::memory_only(8),
    ));
    let d = Dispatcher::new(Registry::global().unwrap(), client, cache_rt).unwrap();
    let bytes =
        |v: &[f64]| -> Vec<u8> { v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect() };
    let cache = source();
    let new: Vec<f64> = (0..32 * COLS).map(|i| -1.0 - i as f64).collect();
    // The cache's bytes at a 64-byte aligned address, which the runtime can alias.
    let mut storage = vec![0u8; cache.len() * 4 + 64];
    let offset = (storage.as_ptr() as usize).next_multiple_of(64) - storage.as_ptr() as usize;
    storage[offset..offset + cache.len() * 4].copy_from_slice(&bytes(&cache));
    let (pages, new_bytes) =
        (IDS.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>(), bytes(&new));
    let types =
        [ids(), TensorType::new(DType::F32, [48, COLS]), TensorType::new(DType::F32, [32, COLS])];
    let lent = &storage[offset..offset + cache.len() * 4];
    let address = lent.as_ptr() as usize;
    let inputs = [
        HostTensor { ty: &types[0], data: &pages, contiguous: true },
        HostTensor { ty: &types[1], data: lent, contiguous: true },
        HostTensor { ty: &types[2], data: &new_bytes, contiguous: true },
    ];
    // SAFETY: the cache's bytes are this test's own, unused meanwhile.
    let rest = unsafe { d.call_in_place("prefetchtest::write_pages", &inputs, &[], &[1]) }
        .expect("in-place call");
    assert!(rest.is_empty());
    let stats = &d.stats().ops["prefetchtest::write_pages.default"];
    assert_eq!((stats.updated_in_place, stats.updated_by_copy), (1, 0));
    assert_eq!(stats.kernels["write_pages"], 1);
    let got: Vec<f64> = storage[offset..offset + cache.len() * 4]
        .chunks_exact(4)
        .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    assert_eq!(storage[offset..].as_ptr() as usize, address);
    let block = (BLOCK * COLS) as usize;
    let mut want = cache.clone();
    for (i, id) in IDS.iter().enumerate() {
        let to = *id as usize * block;
        want[to..to + block].copy_from_slice(&new[i * block..(i + 1) * block]);
    }
    assert_close("write_pages in place", &got, &want, Tolerance::new(0.0, 0.0));
}
