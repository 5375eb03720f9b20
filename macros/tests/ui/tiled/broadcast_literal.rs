use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// A mask dim that broadcasts to another only when it is 1 or that dim, given a literal that is neither.
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [R, 128]),
    output = like(x, [R, 128]),
    tiled(
        grid = [R / broadcast(2, 8)],
        semantics = [parallel],
        inputs(x = block([8, 128], |i| (i, 0))),
        outputs(o = block([8, 128], |i| (i, 0))),
    ),
)]
pub fn k(x: Block, o: Block) {
    o.store(x.load());
}

fn main() {}
