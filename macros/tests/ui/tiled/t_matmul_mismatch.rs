use tpu_kernels::mosaic::dsl::{Block, Tiled};
use tpu_kernels::tpu_kernel;

// `t_matmul` contracts the rows: `x`'s block is [br, bd] and `dy`'s [bn, br].
#[tpu_kernel(
    op = "mylib::wgrad",
    same_dtype,
    shapes(x = [R, D], dy = [N, R]),
    output = like(x, [D, N]),
    tiled(
        tiles(br = tile(R, 256, 8), bd = tile(D, 256, 128), bn = tile(N, 256, 128)),
        grid = [D / bd, N / bn],
        semantics = [parallel, parallel],
        inputs(x = block([br, bd], |i, j| (0, i)), dy = block([bn, br], |i, j| (j, 0))),
        outputs(o = block([bd, bn], |i, j| (i, j))),
    ),
)]
pub fn wgrad(k: &Tiled, x: Block, dy: Block, o: Block) {
    let _ = k;
    o.store(x.load().t_matmul(dy.load()));
}

fn main() {}
