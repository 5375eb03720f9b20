use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k")]
pub fn k(x: Tensor, eps: f64, label: &str) -> Tensor {
    let _ = label;
    x * eps
}

fn main() {}
