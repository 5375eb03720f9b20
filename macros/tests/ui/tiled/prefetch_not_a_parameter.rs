use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// `prefetch(...)` names a parameter of the kernel.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [R, 128]),
    output = like(x, [R, 128]),
    tiled(
        prefetch(ids),
        grid = [1],
        semantics = [parallel],
        inputs(x = block([R, 128], |i| (0, 0))),
        outputs(o = block([R, 128], |i| (0, 0))),
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
