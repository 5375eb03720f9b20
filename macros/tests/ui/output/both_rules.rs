use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", output = x, output_fn = types)]
pub fn k(x: Tensor) -> Tensor {
    x
}

fn main() {}
