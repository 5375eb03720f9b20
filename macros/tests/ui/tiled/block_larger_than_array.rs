use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [16, 256]),
    output = same_as(x),
    tiled(
        grid = [1],
        semantics = [parallel],
        inputs(x = block([32, 256], |i| (i, 0))),
        outputs(o = block([16, 256], |i| (i, 0))),
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
