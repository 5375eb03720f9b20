//! The process-wide runtimes the bridge shares: one PJRT CPU client, one compile cache, libtpu
//! topologies for compile-only checks, and the specialisers of generic imported kernels.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use pyo3::prelude::*;
use tpu_kernels_registry::cache::{CacheConfig, CompileCache};
use tpu_kernels_registry::pjrt::{
    Client, ClientOptions, Plugin, Topology, interleave_vector_loops, retain_large_blocks,
};

use crate::errors::raise;

/// The compile cache of every bridge dispatcher and check (configured by the environment:
/// `TPUK_COMPILE_CACHE`, `TPUK_CACHE`).
pub fn cache() -> Arc<CompileCache> {
    static CACHE: OnceLock<Arc<CompileCache>> = OnceLock::new();
    CACHE.get_or_init(|| Arc::new(CompileCache::new(CacheConfig::from_env()))).clone()
}

/// Whether the shared CPU client hands executions to the plugin's worker thread: only with
/// `TPUK_CPU_ASYNC=1`. By default each program runs on the thread that calls it, which every
/// path waits on anyway (a torch tensor's memory is read as soon as the call returns), and a
/// small call skips a thread wake ([`ClientOptions::asynchronous`]).
pub fn cpu_async() -> bool {
    static ASYNC: OnceLock<bool> = OnceLock::new();
    *ASYNC.get_or_init(|| std::env::var("TPUK_CPU_ASYNC").is_ok_and(|v| v == "1"))
}

/// The shared PJRT CPU client (one device; executions on the calling thread unless
/// [`cpu_async`]). Created after the C allocator is told to keep large blocks
/// ([`retain_large_blocks`]: programs' temporaries are not faulted in again on every run) and
/// XLA:CPU's loops to interleave vectors ([`interleave_vector_loops`]).
pub fn cpu_client(py: Python<'_>) -> PyResult<Client> {
    static CLIENT: OnceLock<Result<Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            retain_large_blocks();
            interleave_vector_loops()?;
            Plugin::cpu()
                .and_then(|p| Client::new(&p, ClientOptions::new().asynchronous(cpu_async())))
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| raise(py, "RuntimeUnavailableError", format!("PJRT CPU client: {e}")))
}

/// libtpu, loaded once (`TPU_SKIP_MDS_QUERY=1` is set before loading).
pub fn libtpu() -> Result<Plugin, String> {
    static LIBTPU: OnceLock<Result<Plugin, String>> = OnceLock::new();
    LIBTPU
        .get_or_init(|| {
            if std::env::var_os("TPU_SKIP_MDS_QUERY").is_none() {
                // SAFETY: set before libtpu is loaded, as it reads the variable at load time;
                // the bridge does not otherwise touch the environment concurrently.
                unsafe { std::env::set_var("TPU_SKIP_MDS_QUERY", "1") };
            }
            Plugin::libtpu().map_err(|e| e.to_string())
        })
        .clone()
}

/// The libtpu topology `name` (`v5e:1x1`), created once per name.
pub fn topology(name: &str) -> Result<Arc<Topology>, String> {
    static TOPOLOGIES: Mutex<Option<HashMap<String, Arc<Topology>>>> = Mutex::new(None);
    let plugin = libtpu()?;
    let mut map = TOPOLOGIES.lock().unwrap_or_else(PoisonError::into_inner);
    let map = map.get_or_insert_with(HashMap::new);
    if let Some(t) = map.get(name) {
        return Ok(t.clone());
    }
    let t = Arc::new(Topology::new(&plugin, name).map_err(|e| e.to_string())?);
    map.insert(name.to_owned(), t.clone());
    Ok(t)
}

/// Python callables that specialise a generic imported kernel (symbolic dims, several example
/// signatures, or static arguments) to one concrete call: `(platform, [input types], statics)
/// -> module text`. Keyed by kernel name; set on registration, dropped on removal.
pub fn specialisers() -> &'static Mutex<HashMap<String, Py<PyAny>>> {
    static SPECIALISERS: OnceLock<Mutex<HashMap<String, Py<PyAny>>>> = OnceLock::new();
    SPECIALISERS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The specialiser of kernel `name`, if it is generic.
pub fn specialiser(py: Python<'_>, name: &str) -> Option<Py<PyAny>> {
    specialisers().lock().unwrap_or_else(PoisonError::into_inner).get(name).map(|f| f.clone_ref(py))
}

/// A Python specialiser seen by the registry: `(platform, [input types], statics) -> text`,
/// called with the GIL taken (the registry calls it from dispatch and graph lowering, with the
/// GIL released by the caller).
pub struct PySpecialiser {
    callable: Py<PyAny>,
}

impl PySpecialiser {
    pub fn new(callable: Py<PyAny>) -> PySpecialiser {
        PySpecialiser { callable }
    }
}

impl tpu_kernels_registry::Specialiser for PySpecialiser {
    fn specialise(
        &self,
        platform: tpu_kernels::registration::Platform,
        sig: &tpu_kernels::KernelSignature,
    ) -> Result<String, String> {
        use tpu_kernels::registration::StaticValue;
        Python::attach(|py| {
            let statics = pyo3::types::PyDict::new(py);
            for (k, v) in &sig.statics {
                let set = match v {
                    StaticValue::Int(i) => statics.set_item(k, i),
                    StaticValue::Float(f) => statics.set_item(k, f),
                    StaticValue::Bool(b) => statics.set_item(k, b),
                    StaticValue::Str(s) => statics.set_item(k, s),
                };
                set.map_err(|e| e.to_string())?;
            }
            let types: Vec<String> = sig.inputs.iter().map(|t| t.short()).collect();
            self.callable
                .call1(py, (platform.name(), types, statics))
                .and_then(|t| t.extract::<String>(py))
                .map_err(|e| e.to_string())
        })
    }
}
