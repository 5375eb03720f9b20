use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel("mylib::k")]
pub fn k(x: Tensor) -> Tensor {
    x
}

fn main() {}
