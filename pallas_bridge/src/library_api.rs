//! `load_library(path)`: a kernel library (a crate of Rust kernels built as a `cdylib`) loaded
//! into the process registry, checked first (see `tpu_kernels_registry::library`).

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tpu_kernels_registry::RegistryError;
use tpu_kernels_registry::library::{self, Checks};

use crate::errors::raise;
use crate::registry_api::global;
use crate::runtime::{cache, cpu_client, topology};

/// Loads the kernel library at `path`: every kernel is checked at every canonical signature
/// (emitted per platform and parsed back, run on the PJRT CPU client with random inputs,
/// compiled for the libtpu `topology` unless it is None), then all are registered, or none
/// (`LibraryError` naming the library, the kernel and what failed). Loading a path again is a
/// no-op. Returns `{"path", "crate", "tpu_kernels_version", "kernels", "already_loaded",
/// "checks": {kernel: [{"signature", "parsed", "outputs", "cpu_run", "tpu_compile",
/// "tpu_compile_note"}]}}`.
#[pyfunction]
#[pyo3(signature = (path, *, topology = Some("v5e:1x1".to_owned()), entry = None))]
pub fn load_library(
    py: Python<'_>,
    path: PathBuf,
    topology: Option<String>,
    entry: Option<String>,
) -> PyResult<Bound<'_, PyDict>> {
    let registry = global(py)?;
    let client = cpu_client(py)?;
    let cache = cache();
    let topology = match &topology {
        Some(name) => Some(self::topology(name).map_err(|e| {
            raise(py, "RuntimeUnavailableError", format!("libtpu topology `{name}`: {e}"))
        })?),
        None => None,
    };
    let entry = entry.as_deref().unwrap_or(tpu_kernels::library::ENTRY_SYMBOL);
    let loaded = py
        .detach(|| {
            let checks = Checks { client: &client, cache: &cache, topology: topology.as_deref() };
            library::load_entry(registry, &path, entry, &checks)
        })
        .map_err(|e| match e {
            RegistryError::Library { .. } => raise(py, "LibraryError", e.to_string()),
            other => raise(py, "RegistrationError", other.to_string()),
        })?;
    let d = PyDict::new(py);
    d.set_item("path", loaded.library.path())?;
    d.set_item("crate", loaded.library.crate_name())?;
    d.set_item("tpu_kernels_version", tpu_kernels::library::VERSION)?;
    d.set_item("kernels", loaded.kernels.clone())?;
    d.set_item("already_loaded", loaded.already_loaded)?;
    let checks = PyDict::new(py);
    for k in &loaded.checks {
        let list = PyList::empty(py);
        for s in &k.signatures {
            let c = PyDict::new(py);
            c.set_item("signature", &s.signature)?;
            c.set_item("parsed", s.parsed.clone())?;
            c.set_item("outputs", s.outputs.clone())?;
            c.set_item("cpu_run", s.cpu_run.clone())?;
            c.set_item("tpu_compile", s.tpu_compile.clone())?;
            c.set_item("tpu_compile_note", s.tpu_compile_note.clone())?;
            list.append(c)?;
        }
        checks.set_item(&k.kernel, list)?;
    }
    d.set_item("checks", checks)?;
    Ok(d)
}
