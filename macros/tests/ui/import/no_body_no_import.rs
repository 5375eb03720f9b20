use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k")]
pub fn k(x: Tensor) -> Tensor;

fn main() {}
