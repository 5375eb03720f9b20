//! The eager dispatcher from Python: torch tensors in (DLPack, no copy), kernel outputs out
//! (DLPack, no copy), fallbacks as `FallbackError`s carrying the reason.
//!
//! Calls go through the registry's [`Dispatcher`]. Generic imported kernels (symbolic dims,
//! several example signatures, static arguments) are first specialised to the call: their
//! Python specialiser refines the module to the call's static shapes (jaxlib's
//! `refine_polymorphic_shapes`), and the specialised executable is memoised per signature.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tpu_kernels::TensorType;
use tpu_kernels::registration::{KernelSignature, StaticValue};
use tpu_kernels_registry::dispatch::{OpStats, upload};
use tpu_kernels_registry::pjrt::{Buffer, CompileOptions, LoadedExecutable, Program};
use tpu_kernels_registry::{
    CallMeta, DispatchError, Dispatcher, Kernel, KernelSource, fault, normalize_op,
};

use crate::errors::{raise, raise_with};
use crate::registry_api::{global, statics_of};
use crate::runtime::{cache, cpu_client, specialiser};
use crate::tensor::{DeviceTensor, Imported, import_all};

type SpecialKey = (String, String, Vec<TensorType>, Vec<(String, String)>);

/// Eager dispatch of op calls on the PJRT CPU client.
#[pyclass(frozen, name = "Dispatcher", module = "tpu_kernels._native")]
#[derive(Debug)]
pub struct PyDispatcher {
    inner: Dispatcher,
    no_fallback: bool,
    /// Specialised executables of generic kernels, by (kernel, fingerprint, inputs, statics).
    special: Mutex<HashMap<SpecialKey, Arc<LoadedExecutable>>>,
    /// Counters of the specialised path, merged into [`PyDispatcher::stats`].
    special_stats: Mutex<BTreeMap<String, OpStats>>,
    special_kernel_nanos: AtomicU64,
    special_prepare_nanos: AtomicU64,
}

struct Failure {
    kernel: Option<String>,
    category: &'static str,
    message: String,
}

fn fallback_error(py: Python<'_>, op: &str, f: &Failure, no_fallback: bool) -> PyErr {
    let text = format!(
        "{}`{op}` falls back{}: {}",
        if no_fallback { "fallback forbidden: " } else { "" },
        f.kernel.as_ref().map(|k| format!(" from kernel `{k}`")).unwrap_or_default(),
        f.message
    );
    match PyTuple::new(
        py,
        [Some(text), Some(f.category.to_owned()), Some(op.to_owned()), f.kernel.clone()],
    ) {
        Ok(args) => raise_with(py, "FallbackError", args),
        Err(e) => e,
    }
}

impl PyDispatcher {
    fn count(&self, op: &str, f: impl FnOnce(&mut OpStats)) {
        let mut stats = self.special_stats.lock().unwrap_or_else(PoisonError::into_inner);
        f(stats.entry(op.to_owned()).or_default());
    }

    fn fail(&self, py: Python<'_>, op: &str, failure: Failure) -> PyErr {
        self.count(op, |s| {
            s.calls += 1;
            *s.fallbacks.entry(failure.category).or_default() += 1;
            s.last_fallback = Some(failure.message.clone());
        });
        fallback_error(py, op, &failure, self.no_fallback)
    }

    /// The specialised path of a generic kernel.
    fn call_special(
        &self,
        py: Python<'_>,
        op: &str,
        kernel: &Kernel,
        spec: Py<PyAny>,
        imported: &[Imported],
        sig: KernelSignature,
    ) -> PyResult<Vec<Buffer>> {
        let name = kernel.name().to_owned();
        let failure = |category, message| Failure { kernel: Some(name.clone()), category, message };
        let sig = match kernel.complete_statics(sig) {
            Ok(s) => s,
            Err(m) => {
                return Err(self.fail(py, op, failure("bad_input", format!("bad input: {m}"))));
            }
        };
        // Under another set of injected faults (tests only), another executable.
        let fingerprint = match &kernel.source {
            KernelSource::Imported { fingerprint, .. } => {
                format!("{fingerprint}#{}", fault::generation())
            }
            KernelSource::Built | KernelSource::Library(_) => {
                format!("#{}", fault::generation())
            }
        };
        let key: SpecialKey = (
            name.clone(),
            fingerprint,
            sig.inputs.clone(),
            sig.statics.iter().map(|(k, v)| ((*k).to_owned(), v.to_string())).collect(),
        );
        let memo = self.special.lock().unwrap_or_else(PoisonError::into_inner).get(&key).cloned();
        let executable = match memo {
            Some(e) => e,
            None => {
                let start = Instant::now();
                let statics = PyDict::new(py);
                for (k, v) in &sig.statics {
                    match v {
                        StaticValue::Int(i) => statics.set_item(k, i)?,
                        StaticValue::Float(f) => statics.set_item(k, f)?,
                        StaticValue::Bool(b) => statics.set_item(k, b)?,
                        StaticValue::Str(s) => statics.set_item(k, s)?,
                    }
                }
                let types: Vec<String> = sig.inputs.iter().map(TensorType::short).collect();
                let text: String = match spec
                    .call1(py, (self.inner.platform().name(), types, statics))
                    .and_then(|t| t.extract(py))
                {
                    Ok(t) => t,
                    Err(e) => {
                        let m = format!("specialisation failed: {e}");
                        return Err(self.fail(py, op, failure("build", m)));
                    }
                };
                let text = match fault::corrupt_text(&name, &sig.inputs, &text) {
                    Ok(t) => t,
                    Err(m) => return Err(self.fail(py, op, failure("build", m))),
                };
                let program = Program::text(text);
                let compiled = py.detach(|| {
                    self.inner.cache().get_or_compile(
                        self.inner.client(),
                        &program,
                        &CompileOptions::new(),
                    )
                });
                self.special_prepare_nanos
                    .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                let exe = match compiled {
                    Ok(c) => c.executable,
                    Err(e) => {
                        return Err(self.fail(
                            py,
                            op,
                            failure("compile", format!("compile failed: {e}")),
                        ));
                    }
                };
                self.special
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key, exe.clone());
                exe
            }
        };
        let start = Instant::now();
        let client = self.inner.client();
        let result = py.detach(|| -> Result<Vec<Buffer>, String> {
            let buffers = imported
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    upload(client, &t.ty, t.bytes()).map_err(|e| format!("input {i}: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let refs: Vec<&Buffer> = buffers.iter().collect();
            if let Some(m) = fault::kernel_run(&name) {
                return Err(format!("execute failed: {m}"));
            }
            executable.execute(&refs).map_err(|e| format!("execute failed: {e}"))
        });
        self.special_kernel_nanos.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match result {
            Ok(out) => {
                self.count(op, |s| {
                    s.calls += 1;
                    s.substituted += 1;
                    *s.kernels.entry(name.clone()).or_default() += 1;
                });
                Ok(out)
            }
            Err(m) => Err(self.fail(py, op, failure("execute", m))),
        }
    }
}

fn op_stats<'py>(py: Python<'py>, s: &OpStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("calls", s.calls)?;
    d.set_item("substituted", s.substituted)?;
    d.set_item("fallbacks", s.fallbacks.clone())?;
    d.set_item("last_fallback", s.last_fallback.clone())?;
    d.set_item("kernels", s.kernels.clone())?;
    d.set_item("outputs_pooled", s.outputs_pooled)?;
    d.set_item("outputs_pool_missed", s.outputs_pool_missed)?;
    Ok(d)
}

#[pymethods]
impl PyDispatcher {
    /// A dispatcher on the shared PJRT CPU client and compile cache. With `no_fallback`, a call
    /// that runs no kernel raises `FallbackError` saying the fallback is forbidden, and
    /// `tpu_kernels.dispatch` raises it too instead of running the original op.
    #[new]
    #[pyo3(signature = (*, no_fallback = false))]
    fn new(py: Python<'_>, no_fallback: bool) -> PyResult<PyDispatcher> {
        let client = cpu_client(py)?;
        let inner = Dispatcher::new(global(py)?, client, cache())
            .map_err(|e| raise(py, "RuntimeUnavailableError", e.to_string()))?
            .no_fallback(no_fallback);
        Ok(PyDispatcher {
            inner,
            no_fallback,
            special: Mutex::new(HashMap::new()),
            special_stats: Mutex::new(BTreeMap::new()),
            special_kernel_nanos: AtomicU64::new(0),
            special_prepare_nanos: AtomicU64::new(0),
        })
    }

    /// The platform kernels are selected for (`cpu`).
    #[getter]
    fn platform(&self) -> &'static str {
        self.inner.platform().name()
    }

    /// Whether fallbacks are errors.
    #[getter]
    fn no_fallback(&self) -> bool {
        self.no_fallback
    }

    /// Runs `op` on `inputs` (objects with `__dlpack__`) with `statics` through the selected
    /// kernel; returns the outputs, or raises `FallbackError` (the caller runs the original op).
    #[pyo3(signature = (op, inputs, statics = None))]
    fn call(
        &self,
        py: Python<'_>,
        op: &str,
        inputs: Vec<Bound<'_, PyAny>>,
        statics: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<DeviceTensor>> {
        let imported = import_all(&inputs)?;
        let statics = statics_of(py, statics)?;
        let op = normalize_op(op);
        let sig = KernelSignature {
            inputs: imported.iter().map(|t| t.ty.clone()).collect(),
            statics: statics.clone(),
        };
        let contiguous: Vec<bool> = imported.iter().map(|t| t.contiguous).collect();
        let meta = CallMeta { sig: &sig, contiguous: &contiguous, platform: self.inner.platform() };
        let selected = self.inner.registry().select(&op, &meta).ok();
        let generic =
            selected.as_ref().and_then(|k| specialiser(py, k.name()).map(|s| (k.clone(), s)));
        let buffers = match generic {
            Some((kernel, spec)) => self.call_special(py, &op, &kernel, spec, &imported, sig)?,
            None => {
                let hosts: Vec<_> = imported.iter().map(Imported::host).collect();
                let result = py.detach(|| self.inner.call(&op, &hosts, &statics).map_err(Box::new));
                match result {
                    Ok(b) => b,
                    Err(e) => {
                        let (DispatchError::Fallback(f) | DispatchError::Forbidden(f)) = e.as_ref()
                        else {
                            return Err(raise(py, "FallbackError", e.to_string()));
                        };
                        let failure = Failure {
                            kernel: f.kernel.clone(),
                            category: f.reason.category(),
                            message: f.reason.to_string(),
                        };
                        return Err(fallback_error(py, &op, &failure, self.no_fallback));
                    }
                }
            }
        };
        buffers.into_iter().map(DeviceTensor::new).collect()
    }

    /// The counters: per op (calls, substituted, fallbacks by reason, the last fallback, kernels
    /// that ran), and the time spent executing and preparing.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let base = self.inner.stats();
        let mut ops = base.ops.clone();
        for (op, s) in self.special_stats.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            let t = ops.entry(op.clone()).or_default();
            t.calls += s.calls;
            t.substituted += s.substituted;
            for (k, n) in &s.fallbacks {
                *t.fallbacks.entry(k).or_default() += n;
            }
            for (k, n) in &s.kernels {
                *t.kernels.entry(k.clone()).or_default() += n;
            }
            if s.last_fallback.is_some() {
                t.last_fallback.clone_from(&s.last_fallback);
            }
        }
        let d = PyDict::new(py);
        let per_op = PyDict::new(py);
        let (mut substituted, mut fallbacks) = (0u64, 0u64);
        for (op, s) in &ops {
            substituted += s.substituted;
            fallbacks += s.fallbacks.values().sum::<u64>();
            per_op.set_item(op, op_stats(py, s)?)?;
        }
        let secs = |base: Duration, extra: &AtomicU64| {
            (base + Duration::from_nanos(extra.load(Ordering::Relaxed))).as_secs_f64()
        };
        d.set_item("ops", per_op)?;
        d.set_item("substituted", substituted)?;
        d.set_item("fallbacks", fallbacks)?;
        d.set_item("kernel_time_s", secs(base.kernel_time, &self.special_kernel_nanos))?;
        d.set_item("prepare_time_s", secs(base.prepare_time, &self.special_prepare_nanos))?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "Dispatcher(platform={:?}, no_fallback={})",
            self.inner.platform().name(),
            self.no_fallback
        )
    }
}
