use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", dtype = [f32])]
pub fn k(x: Tensor) -> Tensor {
    x
}

fn main() {}
