use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(aten = "aten::add.Tensor", schema(self, other, alpha))]
pub fn k(self_: Tensor, other: Tensor, beta: Tensor) -> Tensor {
    self_ + other + beta
}

fn main() {}
