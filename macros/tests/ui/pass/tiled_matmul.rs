use tpu_kernels::mosaic::dsl::{Block, Tiled};
use tpu_kernels::{DType, tpu_kernel};

#[tpu_kernel(
    op = "mylib::mm",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(x = [M, K], w = [K, N]),
    output = like(x, [M, N]),
    tiled(
        tiles(bm = tile(M, 256, 8), bn = tile(N, 256, 128), bk = tile(K, 512, 128)),
        grid = [M / bm, N / bn, K / bk],
        semantics = [parallel, parallel, arbitrary],
        inputs(x = block([bm, bk], |i, j, k| (i, k)), w = block([bk, bn], |i, j, k| (k, j))),
        outputs(o = block([bm, bn], |i, j, k| (i, j))),
        scratch(acc = vmem(f32, [bm, bn])),
    ),
)]
pub fn mm(k: &Tiled, x: Block, w: Block, o: Block, acc: Block) {
    k.when(k.program_id(2).eq(0), || acc.store(k.zeros(DType::F32, &acc.shape())));
    acc.store(acc.load() + x.load().matmul(w.load()));
    k.when(k.program_id(2).eq(k.num_programs(2) - 1), || o.store(acc.load().cast(o.dtype())));
}

fn main() {
    let sig = mm::REGISTRATION.parse_signature("f32[512,1024], f32[1024,256]").unwrap();
    mm::plan(&sig).unwrap();
    let kernel = mm::kernel(&sig).unwrap();
    let _ = kernel;
    let twin = mm::module(&sig).unwrap();
    assert!(!twin.to_text().is_empty());
    // A signature whose K no tile of `tile(K, 512, 128)` divides is declined, not an error.
    let odd = mm::REGISTRATION.parse_signature("f32[512,1000], f32[1000,256]").unwrap();
    assert!(mm::plan(&odd).is_err());
}
