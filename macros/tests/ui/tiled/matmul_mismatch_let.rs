use tpu_kernels::mosaic::dsl::{Block, Tiled};
use tpu_kernels::{DType, tpu_kernel};

// The same mismatch through `let` bindings and a cast.
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
    let a = x.load().cast(DType::F32);
    let b = w.load().cast(DType::F32);
    o.store(a.matmul(b).cast(o.dtype()));
}

fn main() {}
