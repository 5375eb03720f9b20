use tpu_kernels::{Tensor, tpu_kernel};

struct S;

impl S {
    #[tpu_kernel(op = "mylib::k")]
    pub fn k(&self, x: Tensor) -> Tensor {
        x
    }
}

fn main() {}
