use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k")]
pub unsafe fn k(x: Tensor) -> Tensor {
    x
}

fn main() {}
