use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", same_dtype = true)]
pub fn k(x: Tensor) -> Tensor {
    x
}

fn main() {}
