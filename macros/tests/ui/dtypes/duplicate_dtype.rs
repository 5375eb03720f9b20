use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", dtypes = [bf16, bf16])]
pub fn k(x: Tensor) -> Tensor {
    x
}

fn main() {}
