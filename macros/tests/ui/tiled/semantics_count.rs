use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// Two grid axes, one semantics.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [M, N]),
    output = same_as(x),
    tiled(
        tiles(bm = tile(M, 256, 8), bn = tile(N, 256, 128)),
        grid = [M / bm, N / bn],
        semantics = [parallel],
        inputs(x = block([bm, bn], |i, j| (i, j))),
        outputs(o = block([bm, bn], |i, j| (i, j))),
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
