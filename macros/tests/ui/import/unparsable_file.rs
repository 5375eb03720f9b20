use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", shapes(x = f32[8]), import(cpu = "tests/fixtures/broken.mlir"))]
pub fn k(x: Tensor) -> Tensor;

fn main() {}
