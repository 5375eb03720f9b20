use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", platforms = [cpu, gpu])]
pub fn k(x: Tensor) -> Tensor {
    x
}

fn main() {}
