use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", defaults(epsilon = 1e-6), cache_key = [eps, x])]
pub fn k(x: Tensor, eps: f64) -> Tensor {
    x * eps
}

fn main() {}
