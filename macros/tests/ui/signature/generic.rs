use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k")]
pub fn k<T: Copy>(x: Tensor) -> Tensor {
    x
}

fn main() {}
