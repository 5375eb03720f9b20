use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// A tiled kernel cannot read its output types off a built module: it says them.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [M, N]),
    tiled(
        grid = [1],
        semantics = [parallel],
        inputs(x = block([M, N], |i| (0, 0))),
        outputs(o = block([M, N], |i| (0, 0))),
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
