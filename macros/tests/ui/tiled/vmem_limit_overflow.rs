use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// 2 x 2 x 4 MiB of blocks, double-buffered, over a 8 MiB limit.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [R, 1024]),
    output = like(x, [R, 1024]),
    tiled(
        grid = [1],
        semantics = [parallel],
        inputs(x = block([1024, 1024], |i| (0, 0))),
        outputs(o = block([1024, 1024], |i| (0, 0))),
        vmem_limit = 8 * 1024 * 1024,
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
