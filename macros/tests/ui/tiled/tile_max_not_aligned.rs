use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// No multiple of 128 is at most 100.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [M, N]),
    output = same_as(x),
    tiled(
        tiles(bn = tile(N, 100, 128)),
        grid = [N / bn],
        semantics = [parallel],
        inputs(x = block([M, bn], |j| (0, j))),
        outputs(o = block([M, bn], |j| (0, j))),
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
