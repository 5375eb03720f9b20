use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", shapes(x = f32[8, 128], y = f32[8, 128]), import(cpu = "tests/fixtures/add.mlir"))]
pub fn k(x: Tensor, y: Tensor) -> Tensor {
    x + y
}

fn main() {}
