use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// The second-minor block dim (5) is neither a multiple of 8 nor the array's 16.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [16, 256]),
    output = same_as(x),
    tiled(
        grid = [1],
        semantics = [parallel],
        inputs(x = block([5, 256], |i| (i, 0))),
        outputs(o = block([16, 256], |i| (i, 0))),
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
