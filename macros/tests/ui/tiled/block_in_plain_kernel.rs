use tpu_kernels::mosaic::dsl::Block;
use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(op = "mylib::k")]
pub fn k(x: Tensor, b: Block) -> Tensor {
    let _ = b;
    x
}

fn main() {}
