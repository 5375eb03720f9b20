use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", cache_key = [eps], canonical = ["f32[8,128], f32[128]", "f33[8]", "f32[8]; epsilon=1"])]
pub fn k(x: Tensor, eps: f64) -> Tensor {
    x * eps
}

fn main() {}
