use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", shapes(x = f32[8, 128]), import(gpu = "tests/fixtures/add.mlir"))]
pub fn k(x: Tensor) -> Tensor;

fn main() {}
