//! Index, select, dispatch and execute registered kernels.
//!
//! [`pjrt`] is the project's own thin, safe layer over the PJRT C API: it loads the XLA CPU
//! plugin (the embedded default) or libtpu, compiles StableHLO, moves buffers and executes.
//! [`library`] loads kernel libraries (a crate of kernels built as a `cdylib`) at run time.

pub mod cache;
pub mod check;
pub mod dispatch;
mod error;
pub mod fault;
pub mod index;
pub mod library;
pub mod numerics;
pub mod pjrt;
pub mod tuning;

pub use dispatch::{
    DispatchError, Dispatcher, Fallback, FallbackReason, GraphRunError, HostTensor, LendError,
    LentRun, execute_lending, with_pooled_outputs,
};
pub use error::RegistryError;
pub use index::{
    CallMeta, Index, Kernel, KernelSource, NoKernel, Registry, Specialiser, normalize_op,
};
pub mod graph;
pub mod host_pool;
