use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", ignore_in_cache_key(seed = " "))]
pub fn k(x: Tensor, seed: i64) -> Tensor {
    let _ = seed;
    x
}

fn main() {}
