//! Author TPU kernels in Rust.
//!
//! Two IRs, each in its own folder, sharing one set of machinery (typed value and region ids,
//! the `Instr` record, the text helpers, the element and tensor types, the error type):
//!
//! - [`stablehlo`]: traced kernels. [`builder`]: the typed, fallible [`KernelBuilder`] and its
//!   [`Tensor`] values; [`ir`]: the arena IR and the one table of type rules; [`printer`]
//!   turns a verified [`Module`] into StableHLO text, byte-for-byte deterministic; [`reader`]
//!   reads the StableHLO text the project must understand (signatures, symbols, locations),
//!   for imported kernels; [`refine`] specialises a module exported with symbolic shapes
//!   (`jax.export`) to static input types, as jaxlib's shape refinement does. (Each is
//!   re-exported here under its own name.)
//! - [`mosaic`]: tiled TPU kernels: a Mosaic IR over a grid of VMEM blocks, its checks, its
//!   two printed forms, the `tpu_custom_call` module that carries it, its CPU twin and the
//!   interpreter of its printed text.
//!
//! And around them:
//!
//! - [`types`]: element types, static and symbolic dimensions, tensor types.
//! - [`registration`]: the record every kernel registers through, collected with `inventory`.
//! - [`kernels`]: the standard kernels.
//! - [`library`]: the C ABI of a kernel library, a crate of kernels built as a `cdylib` and
//!   loaded at run time ([`export_library!`]).

mod error;
pub mod kernels;
pub mod library;
pub mod mosaic;
pub mod registration;
pub mod stablehlo;
mod text;
pub mod types;

pub use stablehlo::{builder, ir, literal, printer, reader, refine};

pub use builder::{KernelBuilder, Tensor};
pub use error::{BuildError, ErrorKind, OpError};
pub use ir::Module;
pub use registration::{KernelRegistration, KernelSignature, registered};
pub use tpu_kernels_macros::tpu_kernel;

// `#[tpu_kernel]` names `::tpu_kernels::__private`; this lets the standard kernels use the
// default path too.
extern crate self as tpu_kernels;
pub use types::{DType, Dim, Shape, TensorType};

/// Items the generated code of `#[tpu_kernel]` names. Not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::mosaic::{IndexExpr, Kernel as MosaicKernel, MType, Semantics, Tiled};
    pub use crate::registration::macro_support::{
        static_arg, static_default, tiled_check_plan, tiled_declined, tiled_dim, tiled_fn,
        tiled_named, tiled_numel, tiled_op, tiled_outputs, tiled_view, trace,
    };
    pub use crate::registration::{
        Binding, BindingKind, CacheKey, Guard, ImportedModule, KernelRegistration, KernelSignature,
        OutputDType, OutputDim, OutputRule, OutputSpec, Platform, StaticKind, StaticParam,
    };
    pub use crate::{BuildError, DType, Module, Tensor};
    pub use inventory;
    pub use std::{option::Option, result::Result, string::String, vec::Vec};
}

/// The README's Rust examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
