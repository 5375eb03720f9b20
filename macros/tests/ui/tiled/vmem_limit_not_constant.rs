use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// The limit is one number of bytes, not a size per signature.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [R, 128]),
    output = like(x, [R, 128]),
    tiled(
        grid = [1],
        semantics = [parallel],
        inputs(x = block([R, 128], |i| (0, 0))),
        outputs(o = block([R, 128], |i| (0, 0))),
        vmem_limit = R * 1024,
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
