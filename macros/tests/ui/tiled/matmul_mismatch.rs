use tpu_kernels::mosaic::dsl::{Block, Tiled};
use tpu_kernels::tpu_kernel;

// `x`'s block is [bm, bk] and `w`'s [bn, bk]: `matmul` contracts bk with bn.
#[tpu_kernel(
    op = "mylib::mm",
    same_dtype,
    shapes(x = [M, K], w = [N, K]),
    output = like(x, [M, N]),
    tiled(
        tiles(bm = tile(M, 256, 8), bn = tile(N, 256, 128), bk = tile(K, 512, 128)),
        grid = [M / bm, N / bn],
        semantics = [parallel, parallel],
        inputs(x = block([bm, bk], |i, j| (i, 0)), w = block([bn, bk], |i, j| (j, 0))),
        outputs(o = block([bm, bn], |i, j| (i, j))),
    ),
)]
pub fn mm(k: &Tiled, x: Block, w: Block, o: Block) {
    let _ = k;
    o.store(x.load().matmul(w.load()));
}

fn main() {}
