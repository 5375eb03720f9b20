//! Tiled TPU kernels: a Mosaic IR over a grid of VMEM blocks, as Pallas writes them.
//!
//! A [`Kernel`] has a grid (one [`Semantics`] per axis), a [`Window`] per input and output (the
//! array, the block a grid step sees, and an index map from grid indices to block indices),
//! scratch buffers kept across grid steps, and a body of ops over block references and vectors:
//! loads and stores of whole blocks, elementwise math, casts, broadcasts, reductions, MXU
//! matmuls with an f32 accumulator, and `when` (an `scf.if`).
//!
//! Build one with [`TiledBuilder`]; [`TiledBuilder::finish`] verifies it and checks, before
//! anything reaches libtpu, the tiling rule of its blocks and that its grid stays inside and
//! covers its arrays ([`check`]); [`check::vmem`] checks a target's scoped VMEM.
//! [`print_kernel`] gives the readable Mosaic text (the pretty form),
//! [`print_kernel_serialized`] the shipped one (the versioned `stable_mosaic` serialization that
//! libtpu upgrades across releases), and [`custom_call_module`] the StableHLO module with the
//! `tpu_custom_call` XLA compiles for a TPU; [`cpu_twin`] lowers the same kernel to plain StableHLO with Pallas interpret-mode
//! semantics (a loop over the grid, windows sliced and written back, scratch carried), which
//! the PJRT CPU plugin runs; [`interpret`] parses the printed module back (in either form) and
//! runs it on the CPU, so a printing bug cannot hide behind a twin made from the same
//! description.
//!
//! The IR shares the StableHLO IR's machinery: [`crate::ir::ValueId`] and
//! [`crate::ir::RegionId`] index its arenas, and the printers share symbol quoting, string
//! escaping and float spelling ([`crate::printer`], [`crate::literal`]).

pub mod builder;
pub mod check;
pub mod dsl;
pub mod interp;
pub mod ir;
pub mod printer;
pub mod serialized;
pub mod twin;
pub mod types;
pub mod wrap;

pub use builder::{MValue, TiledBuilder};
pub use check::Target;
pub use dsl::{Block, Slice, Start, Tiled, Vector, all, ds};
pub use interp::interpret;
pub use ir::{BinaryOp, Compare, IndexExpr, Kernel, Reduce, Scalar, Semantics, UnaryOp, Window};
pub use printer::print_kernel;
pub use serialized::print_kernel_serialized;
pub use twin::{cpu_twin, cpu_twin_for};
pub use types::{MType, MemorySpace};
pub use wrap::{Form, custom_call_module, custom_call_module_as, custom_call_module_for};

use crate::types::DType;

/// The element type a kernel's window has for a caller's array of `dtype`: the same, but for
/// 64-bit integers, narrowed to 32 bits (Mosaic has no 64-bit integers). A caller's `i64`
/// class indices reach the kernel as `i32`; the custom call's wrapper
/// ([`custom_call_module_for`]) and the twin ([`cpu_twin_for`]) convert around it (values
/// outside the 32-bit range wrap, as `stablehlo.convert` does), and an `i32` output the caller
/// sees as `i64` is widened back.
pub fn window_dtype(dtype: DType) -> DType {
    match dtype {
        DType::I64 => DType::I32,
        other => other,
    }
}
