use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", shapes(eps = [D]), cache_key = [eps])]
pub fn k(x: Tensor, eps: f64) -> Tensor {
    x * eps
}

fn main() {}
