use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::{DType, tpu_kernel};

/// RMSNorm over blocks of rows: `x` (any leading dims) seen as `[R, D]`.
#[tpu_kernel(
    op = "mylib::rms_norm",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(x = [.., D], weight = [D]),
    defaults(eps = 1e-6),
    cache_key = [eps],
    output = same_as(x),
    tiled(
        tiles(R = numel(x) / D, br = tile(R, max(8, cdiv(262144, D)), 8)),
        grid = [R / br],
        semantics = [parallel],
        inputs(
            x = block([br, D], |i| (i, 0)).view([R, D]),
            weight = block([1, D], |i| (0, 0)).view([1, D]),
        ),
        outputs(out = block([br, D], |i| (i, 0)).view([R, D])),
    ),
)]
pub fn rms_norm(x: Block, weight: Block, out: Block, eps: f64) {
    let xf = x.load().cast(DType::F32);
    let d = xf.shape().last().copied().unwrap_or(1) as f64;
    let ms = (xf * xf).sum(-1) * (1.0 / d);
    let y = xf * (ms + eps).rsqrt() * weight.load().cast(DType::F32);
    out.store(y.cast(out.dtype()));
}

fn main() {
    let sig =
        rms_norm::REGISTRATION.parse_signature("bf16[2,128,512], bf16[512]; eps=1e-5").unwrap();
    rms_norm::plan(&sig).unwrap();
    rms_norm::kernel(&sig).unwrap();
    rms_norm::module(&sig).unwrap();
}
