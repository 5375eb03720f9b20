use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", priority = 1, priority = 2)]
pub fn k(x: Tensor) -> Tensor {
    x
}

fn main() {}
