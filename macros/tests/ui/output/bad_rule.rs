use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", shapes(x = [B, D]), output = [transpose(x)])]
pub fn k(x: Tensor) -> Tensor {
    x
}

fn main() {}
