use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// Tables come before the input blocks (they are the custom call's first operands).
#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [R, 128], ids = i32[G]),
    output = like(x, [R, 128]),
    tiled(
        prefetch(ids),
        grid = [G],
        semantics = [parallel],
        inputs(x = block([8, 128], |i| (ids[i], 0))),
        outputs(o = block([8, 128], |i| (i, 0))),
    ),
)]
pub fn k(x: Block, ids: Block, o: Block) {
    let _ = ids;
    o.store(x.load());
}

fn main() {}
