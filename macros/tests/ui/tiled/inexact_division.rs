use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// `/` divides exactly: a grid of `16 / 3` steps fits no signature.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [16, 256]),
    output = same_as(x),
    tiled(
        grid = [16 / 3],
        semantics = [parallel],
        inputs(x = block([8, 256], |i| (i, 0))),
        outputs(o = block([8, 256], |i| (i, 0))),
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
