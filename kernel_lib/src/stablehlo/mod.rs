//! The StableHLO IR of traced kernels: the arena IR and its type rules ([`ir`]), the fallible
//! builder whose `Tensor` values kernels are written with ([`builder`]), the verifier, the
//! deterministic printer ([`printer`]) and float spelling ([`literal`]), the reader of the
//! StableHLO text the project must understand ([`reader`], which the macro crate includes by
//! path too) and shape refinement of symbolic modules ([`refine`]).
//!
//! The Mosaic IR ([`crate::mosaic`]) is built on the same machinery: [`ir::ValueId`],
//! [`ir::RegionId`] and [`ir::Instr`] index and record its ops, and both printers share the
//! crate's text helpers.

pub mod builder;
pub mod ir;
pub mod literal;
pub mod printer;
pub mod reader;
pub mod refine;
mod verify;
