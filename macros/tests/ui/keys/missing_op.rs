use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(dtypes = [f32])]
pub fn k(x: Tensor) -> Tensor {
    x
}

fn main() {}
