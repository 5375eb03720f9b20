use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// A 4096 x 4096 f32 scratch buffer is 64 MiB, over every target's scoped VMEM.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [M, N]),
    output = same_as(x),
    tiled(
        tiles(bm = tile(M, 256, 8)),
        grid = [M / bm],
        semantics = [parallel],
        inputs(x = block([bm, N], |i| (i, 0))),
        outputs(o = block([bm, N], |i| (i, 0))),
        scratch(acc = vmem(f32, [4096, 4096])),
    ),
)]
pub fn k(x: Block, o: Block, acc: Block) {
    let _ = acc;
    o.store(x.load());
}

fn main() {}
