use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::tpu_kernel;

#[tpu_kernel(
    op = "mylib::add",
    shapes(x = f32[8, N], y = f32[8, N]),
    output = same_as(x),
    import(cpu = "tests/fixtures/add.mlir"),
    tiled(
        grid = [1],
        semantics = [parallel],
        inputs(x = block([8, N], |i| (0, 0)), y = block([8, N], |i| (0, 0))),
        outputs(o = block([8, N], |i| (0, 0))),
    ),
)]
pub fn add(x: Block, y: Block, o: Block);

fn main() {}
