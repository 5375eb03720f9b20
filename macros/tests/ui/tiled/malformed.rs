use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// A syntax error in `tiled(...)` is the one error: nothing after it is checked.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [M, N]),
    output = same_as(x),
    tiled(
        grid = [1] 2,
        semantics = [parallel],
        inputs(x = block([M, N], |i| (0, 0))),
        outputs(o = block([M, N], |i| (0, 0))),
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
