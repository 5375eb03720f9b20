use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

// `ids` is an input block, not a table named in `prefetch(...)`.
#[tpu_kernel(
    op = "mylib::k",
    dtypes = [i32],
    shapes(ids = [G], x = f32[R, 128]),
    output = like(x, [R, 128]),
    tiled(
        grid = [G],
        semantics = [parallel],
        inputs(ids = block([G], |i| (0)), x = block([8, 128], |i| (ids[i], 0))),
        outputs(o = block([8, 128], |i| (i, 0))),
    ),
)]
pub fn k(ids: Block, x: Block, o: Block) {
    let _ = ids;
    o.store(x.load());
}

fn main() {}
