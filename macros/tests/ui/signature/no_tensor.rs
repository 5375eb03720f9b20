use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k", cache_key = [n])]
pub fn k(n: i64) -> Tensor<'static> {
    let _ = n;
    unimplemented!()
}

fn main() {}
