use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", cache_key = [approximate], require(approximate == true))]
pub fn k(x: Tensor, approximate: &str) -> Tensor {
    let _ = approximate;
    x
}

fn main() {}
