use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", cache_key = [eps], ignore_in_cache_key(eps = "unused"))]
pub fn k(x: Tensor, eps: f64) -> Tensor {
    x * eps
}

fn main() {}
