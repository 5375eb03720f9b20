use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k")]
pub async fn k(x: Tensor<'static>) -> Tensor<'static> {
    x
}

fn main() {}
