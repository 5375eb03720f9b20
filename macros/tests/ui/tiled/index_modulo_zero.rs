use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// A grid index taken modulo a size that is 0.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [R, 128]),
    output = like(x, [R, 128]),
    tiled(
        grid = [R / 8],
        semantics = [parallel],
        inputs(x = block([8, 128], |i| (i / 2 % (4 - 4), 0))),
        outputs(o = block([8, 128], |i| (i, 0))),
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
