use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k")]
pub fn k(x: Tensor, n: u32, v: Vec<f32>) -> Tensor {
    let _ = (n, v);
    x
}

fn main() {}
