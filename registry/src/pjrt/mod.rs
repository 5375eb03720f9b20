//! The project's own thin, safe layer over the PJRT C API.
//!
//! It declares the part of the C API it calls by hand (header version 0.81; see `sys`), so it
//! works with any plugin implementing 0.81 or later (the XLA CPU plugin, libtpu) and needs no
//! bindgen or protoc. Every handle is `Send + Sync` and frees itself on drop; a plugin is loaded
//! once per path and stays loaded.
//!
//! ```no_run
//! use tpu_kernels_registry::pjrt::{Client, ClientOptions, CompileOptions, Plugin, Program};
//!
//! # fn main() -> Result<(), tpu_kernels_registry::pjrt::Error> {
//! let plugin = Plugin::cpu()?; // $TPUK_PJRT_CPU_PLUGIN or ~/.cache/tpu-kernels/plugins/pjrt_cpu.so
//! let client = Client::new(&plugin, ClientOptions::new().cpu_device_count(4))?;
//! let program = Program::text(
//!     "func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
//!        %0 = stablehlo.add %a, %b : tensor<4xf32>
//!        return %0 : tensor<4xf32>
//!      }",
//! );
//! let exe = client.compile(&program, &CompileOptions::new())?;
//! let a = client.buffer_from_host(&[1.0f32, 2.0, 3.0, 4.0], &[4])?;
//! let b = client.buffer_from_host(&[10.0f32; 4], &[4])?;
//! let out = exe.execute(&[&a, &b])?;
//! assert_eq!(out[0].to_vec::<f32>()?, vec![11.0, 12.0, 13.0, 14.0]);
//! # Ok(()) }
//! ```
//!
//! Main types: [`Plugin`] (load, attributes), [`Client`] (devices, compile, upload),
//! [`LoadedExecutable`] (execute, execute_sharded, serialize), [`Buffer`] (to_host,
//! read_in_place), [`AlignedHostBuffer`] (zero-copy uploads), [`Topology`] (compile-only for
//! TPU generations with libtpu), [`register_host_function`] (Rust host custom calls), and the
//! one [`Error`] enum.

mod buffer;
mod client;
mod compile;
mod error;
mod event;
mod executable;
mod host_call;
mod interleave;
mod malloc;
pub(crate) mod plugin;
mod proto;
mod sys;
pub mod testing;
mod topology;
mod view;

pub use buffer::{AlignedHostBuffer, Buffer, ElementType, HostLoan, NativeType, VIEW_ALIGNMENT};
pub use client::{Client, ClientOptions, Device, OptionValue};
pub use compile::{
    AVX512_VECTOR_WIDTH, CompileOptions, DeviceAssignment, OptionOverride, Program, xla_flags_name,
};
pub use error::{Error, ErrorCode, Result, Runtime};
pub use executable::{Execution, Input, LoadedExecutable, ParameterSpec};
pub use host_call::{HostArg, HostCall, HostFunction, HostResult, register_host_function};
pub use interleave::{
    InterleavePolicy, SMALL_LOOP_COST, interleave_policy, interleave_vector_loops,
};
pub use malloc::{
    MMAP_THRESHOLD, MallocPolicy, TRIM_THRESHOLD, malloc_policy, retain_large_blocks,
};
pub use plugin::{
    AttributeValue, Plugin, PluginAttributes, StableHloVersion, cache_dir, locate_cpu_plugin,
    locate_libtpu,
};
pub use topology::{CompiledProgram, Topology};
pub use view::{HostInput, VIEW_CACHE_SIZE, ViewCache};
