use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", defaults(eps = "small", dim = 1.5), cache_key = [eps, dim])]
pub fn k(x: Tensor, eps: f64, dim: i64) -> Tensor {
    (x * eps).sum(&[dim], false)
}

fn main() {}
