//! `tpu_kernels._native`: the registry, the dispatcher, the checks and the counters of
//! tpu-kernels, for the `tpu_kernels` Python package (see `python/tpu_kernels/`).
//!
//! - [`registry_api`]: list, select, register and remove kernels in the process registry
//!   ([`tpu_kernels_registry::Registry::global`]), shared with Rust registrations.
//! - [`dispatch`]: eager calls on torch tensors, DLPack in and out without copies.
//! - [`checks`]: emit, compile for a TPU topology (libtpu compile-only), run on the CPU client,
//!   and the reader's helpers.
//!
//! `unsafe` appears only at the DLPack boundary ([`tensor`]) and where libtpu's environment is
//! set before loading it ([`runtime`]).

mod checks;
mod device;
mod dispatch;
mod errors;
mod fused_mode;
mod intern;
mod library_api;
mod mode_handler;
mod recorder;
mod registry_api;
mod runtime;
mod sharded;
mod strict_mode;
mod tensor;
mod torch_bridge;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<dispatch::PyDispatcher>()?;
    m.add_class::<tensor::DeviceTensor>()?;
    m.add_function(wrap_pyfunction!(registry_api::list_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(registry_api::kernel, m)?)?;
    m.add_function(wrap_pyfunction!(registry_api::variant_text, m)?)?;
    m.add_function(wrap_pyfunction!(registry_api::select, m)?)?;
    m.add_function(wrap_pyfunction!(registry_api::explain, m)?)?;
    m.add_function(wrap_pyfunction!(registry_api::register_imported, m)?)?;
    m.add_function(wrap_pyfunction!(registry_api::unregister, m)?)?;
    m.add_function(wrap_pyfunction!(library_api::load_library, m)?)?;
    m.add_function(wrap_pyfunction!(registry_api::set_force_tiled, m)?)?;
    m.add_function(wrap_pyfunction!(registry_api::tiled_interpret, m)?)?;
    m.add_function(wrap_pyfunction!(checks::strip_locations, m)?)?;
    m.add_function(wrap_pyfunction!(checks::content_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(checks::module_signature, m)?)?;
    m.add_function(wrap_pyfunction!(checks::specialisation_wrapper, m)?)?;
    m.add_function(wrap_pyfunction!(checks::emit, m)?)?;
    m.add_function(wrap_pyfunction!(checks::libtpu_available, m)?)?;
    m.add_function(wrap_pyfunction!(checks::compile_tpu, m)?)?;
    m.add_function(wrap_pyfunction!(checks::run_module_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(checks::cache_stats, m)?)?;
    m.add_function(wrap_pyfunction!(checks::dlpack_dtypes, m)?)?;
    torch_bridge::register(m)?;
    device::register(m)?;
    Ok(())
}
