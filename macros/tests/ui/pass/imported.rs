use tpu_kernels::{Tensor, tpu_kernel};

#[tpu_kernel(
    op = "mylib::add",
    shapes(x = f32[8, N], y = f32[8, N]),
    import(cpu = "tests/fixtures/add.mlir")
)]
pub fn add(x: Tensor, y: Tensor) -> Tensor;

fn main() {
    assert!(add::REGISTRATION.is_imported());
}
