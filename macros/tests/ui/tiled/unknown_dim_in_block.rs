use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [M, N]),
    output = same_as(x),
    tiled(
        tiles(bm = tile(M, 256, 8)),
        grid = [M / bm],
        semantics = [parallel],
        inputs(x = block([bm, Q], |i| (i, 0))),
        outputs(o = block([bm, N], |i| (i, 0))),
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
