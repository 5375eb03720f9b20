use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", bogus, dtypes = [f31], platforms = [gpu], priority = "high")]
pub fn k(x: Tensor) -> Tensor {
    x
}

fn main() {}
