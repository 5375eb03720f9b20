use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// Block row 2 of 8-row blocks starts at row 16 of a 16-row array.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [16, 256]),
    output = same_as(x),
    tiled(
        grid = [2],
        semantics = [parallel],
        inputs(x = block([8, 256], |i| (2, 0))),
        outputs(o = block([8, 256], |i| (i, 0))),
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
