use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

#[tpu_kernel(
    op = "mylib::k",
    shapes(x = [M, N]),
    output = same_as(x),
    tiled(
        grid = [1],
        semantics = [parallel],
        inputs(x = block([M, N], |i| (0, 0))),
        outputs(o = block([M, N], |i| (0, 0))),
        scratch(flags = smem(bf16, [8])),
    ),
)]
pub fn k(x: Block, o: Block, flags: Block) {
    let _ = flags;
    o.store(x.load());
}

fn main() {}
