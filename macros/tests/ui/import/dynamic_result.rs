use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", shapes(x = f32[N, 128]), import(cpu = "tests/fixtures/dynamic.mlir"))]
pub fn k(x: Tensor) -> Tensor;

fn main() {}
