//! The checks `tpuk` runs, from Python: emit a kernel's module for a signature, compile a module
//! for a TPU topology with libtpu's compile-only path, run a module on the PJRT CPU client; and
//! the reader's helpers (signatures, location stripping, fingerprints, the specialisation
//! wrapper) and the cache counters.

use std::fmt::Write as _;
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tpu_kernels::TensorType;
use tpu_kernels::reader;
use tpu_kernels::registration::StaticValue;
use tpu_kernels_registry::dispatch::upload;
use tpu_kernels_registry::pjrt::{Buffer, CompileOptions, Program};

use crate::errors::raise;
use crate::registry_api::{kernel_named, parse_types, platform};
use crate::runtime::{cache, cpu_client, libtpu, specialiser, topology};
use crate::tensor::{DeviceTensor, import_all};

/// The text without locations (`loc(...)` and `#loc` aliases).
#[pyfunction]
pub fn strip_locations(py: Python<'_>, text: &str) -> PyResult<String> {
    reader::strip_locations(text).map_err(|e| raise(py, "ModuleParseError", e.to_string()))
}

/// The content fingerprint: locations, whitespace and comments do not change it.
#[pyfunction]
pub fn content_fingerprint(py: Python<'_>, text: &str) -> PyResult<String> {
    reader::content_fingerprint(text).map_err(|e| raise(py, "ModuleParseError", e.to_string()))
}

/// The entry function's signature, read by the Rust reader: `{"name", "args", "results",
/// "attributes"}` with types in StableHLO spelling (`tensor<?x128xf32>`).
#[pyfunction]
pub fn module_signature<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyDict>> {
    let module =
        reader::parse_module(text).map_err(|e| raise(py, "ModuleParseError", e.to_string()))?;
    let main = module.main().map_err(|e| raise(py, "ModuleParseError", e.to_string()))?;
    let d = PyDict::new(py);
    d.set_item("name", main.name.clone())?;
    d.set_item("args", main.args.iter().map(|a| a.ty.to_string()).collect::<Vec<_>>())?;
    d.set_item("results", main.results.iter().map(|a| a.ty.to_string()).collect::<Vec<_>>())?;
    d.set_item("attributes", module.attributes.clone())?;
    d.set_item("functions", module.functions.iter().map(|f| f.name.clone()).collect::<Vec<_>>())?;
    Ok(d)
}

/// Wraps a module whose entry takes dynamic shapes in a new `@main` with the static input
/// types `arg_types` (`f32[8,128], ...`): the old functions become private (`@tpuk_inner...`),
/// the new entry converts its arguments to the old types and calls the old entry. jaxlib's
/// `refine_polymorphic_shapes` then makes every shape static.
#[pyfunction]
pub fn specialisation_wrapper(py: Python<'_>, text: &str, arg_types: &str) -> PyResult<String> {
    let err = |m: String| raise(py, "ModuleParseError", m);
    let types = parse_types(arg_types).map_err(|e| raise(py, "SignatureMismatchError", e))?;
    let module = reader::parse_module(text).map_err(|e| err(e.to_string()))?;
    let funcs = module.functions_for_inlining("tpuk_inner").map_err(|e| err(e.to_string()))?;
    let Some(entry) = funcs.iter().find(|f| f.is_entry) else {
        return Err(err("the module has no entry function".to_owned()));
    };
    if entry.args.len() != types.len() {
        return Err(raise(
            py,
            "SignatureMismatchError",
            format!("the module takes {} inputs, the call gives {}", entry.args.len(), types.len()),
        ));
    }
    let mut out = String::from("module @tpuk_specialised");
    let attrs: Vec<String> = module
        .attributes
        .iter()
        .filter(|(k, _)| k.trim_matches('"') != "jax.uses_shape_polymorphism")
        .map(|(k, v)| if v.is_empty() { k.clone() } else { format!("{k} = {v}") })
        .collect();
    if !attrs.is_empty() {
        let _ = write!(out, " attributes {{{}}}", attrs.join(", "));
    }
    out.push_str(" {\n  func.func public @main(");
    let args: Vec<String> =
        types.iter().enumerate().map(|(i, t)| format!("%arg{i}: {t}")).collect();
    out.push_str(&args.join(", "));
    let results: Vec<String> = entry.results.iter().map(|r| r.ty.to_string()).collect();
    let _ = writeln!(out, ") -> ({}) {{", results.join(", "));
    let mut operands = Vec::new();
    for (i, (t, a)) in types.iter().zip(&entry.args).enumerate() {
        if *t == a.ty {
            operands.push(format!("%arg{i}"));
        } else {
            let _ = writeln!(out, "    %c{i} = stablehlo.convert %arg{i} : ({t}) -> {}", a.ty);
            operands.push(format!("%c{i}"));
        }
    }
    let arg_types: Vec<String> = entry.args.iter().map(|a| a.ty.to_string()).collect();
    let n = results.len();
    let lhs = if n == 1 { "%r".to_owned() } else { format!("%r:{n}") };
    let _ = writeln!(
        out,
        "    {lhs} = func.call @{}({}) : ({}) -> ({})",
        entry.name,
        operands.join(", "),
        arg_types.join(", "),
        results.join(", ")
    );
    let rets: Vec<String> =
        if n == 1 { vec!["%r".to_owned()] } else { (0..n).map(|i| format!("%r#{i}")).collect() };
    let _ = writeln!(out, "    return {} : {}\n  }}", rets.join(", "), results.join(", "));
    for f in &funcs {
        let _ = writeln!(out, "  {}", f.text);
    }
    out.push_str("}\n");
    Ok(out)
}

fn statics_dict<'py>(
    py: Python<'py>,
    statics: &[(&str, StaticValue)],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in statics {
        match v {
            StaticValue::Int(i) => d.set_item(k, i)?,
            StaticValue::Float(f) => d.set_item(k, f)?,
            StaticValue::Bool(b) => d.set_item(k, b)?,
            StaticValue::Str(s) => d.set_item(k, s)?,
        }
    }
    Ok(d)
}

/// The module kernel `name` gives for `signature` (`"f32[8,128], f32[128]; eps=1e-6"`) on
/// `platform`: built (Rust kernels), verbatim (imported), or specialised (generic imports).
#[pyfunction]
#[pyo3(signature = (name, signature, platform = "cpu"))]
pub fn emit(py: Python<'_>, name: &str, signature: &str, platform: &str) -> PyResult<String> {
    let p = self::platform(py, platform)?;
    let kernel = kernel_named(py, name)?;
    let sig = kernel
        .record
        .parse_signature(signature)
        .map_err(|e| raise(py, "SignatureMismatchError", format!("kernel `{name}`: {e}")))?;
    if let Some(spec) = specialiser(py, name) {
        let types: Vec<String> = sig.inputs.iter().map(TensorType::short).collect();
        return spec.call1(py, (p.name(), types, statics_dict(py, &sig.statics)?))?.extract(py);
    }
    kernel
        .module_text(&sig, p)
        .map(|m| m.text.to_string())
        .map_err(|e| raise(py, "ModuleParseError", format!("kernel `{name}`: {e}")))
}

/// Whether libtpu can be loaded (for the compile-only checks).
#[pyfunction]
pub fn libtpu_available() -> bool {
    libtpu().is_ok()
}

/// Compiles `text` for a TPU `topology` (`v5e:1x1`) with libtpu's compile-only path; returns
/// `{"topology", "executable_bytes", "compile_s"}` or raises `TpuCompileError` with libtpu's
/// message (`E2002: ...`).
#[pyfunction]
#[pyo3(signature = (text, topology = "v5e:1x1"))]
pub fn compile_tpu<'py>(
    py: Python<'py>,
    text: String,
    topology: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let topo = self::topology(topology)
        .map_err(|e| raise(py, "RuntimeUnavailableError", format!("libtpu: {e}")))?;
    let start = Instant::now();
    let program = Program::text(text);
    let compiled = py
        .detach(|| topo.compile(&program, &CompileOptions::new()))
        .map_err(|e| raise(py, "TpuCompileError", e.to_string()))?;
    let d = PyDict::new(py);
    d.set_item("topology", topo.name())?;
    d.set_item("executable_bytes", compiled.serialized_size())?;
    d.set_item("compile_s", start.elapsed().as_secs_f64())?;
    Ok(d)
}

/// Compiles `text` on the shared PJRT CPU client (through the compile cache) and runs it on
/// `inputs` (objects with `__dlpack__`; with `types`, `"bf16[8,128], ..."`, each input's bytes
/// are read as that type, for element types the producer cannot export, like numpy's
/// bfloat16 viewed as uint16); returns the outputs and the timings
/// `{"compile_s", "run_s", "cache": "compiled" | "memoryhit" | "diskhit"}`.
#[pyfunction]
#[pyo3(signature = (text, inputs, types = None))]
pub fn run_module_cpu<'py>(
    py: Python<'py>,
    text: String,
    inputs: Vec<Bound<'py, PyAny>>,
    types: Option<&str>,
) -> PyResult<(Vec<DeviceTensor>, Bound<'py, PyDict>)> {
    let client = cpu_client(py)?;
    let mut imported = import_all(&inputs)?;
    if let Some(types) = types {
        let types = parse_types(types).map_err(|e| raise(py, "SignatureMismatchError", e))?;
        if types.len() != imported.len() {
            let m = format!("{} types for {} inputs", types.len(), imported.len());
            return Err(raise(py, "SignatureMismatchError", m));
        }
        for (i, (t, ty)) in imported.iter_mut().zip(types).enumerate() {
            t.reinterpret(ty)
                .map_err(|m| raise(py, "SignatureMismatchError", format!("input {i}: {m}")))?;
        }
    }
    let start = Instant::now();
    let program = Program::text(text);
    let cached =
        py.detach(|| cache().get_or_compile(&client, &program, &CompileOptions::new())).map_err(
            |e| raise(py, "CpuRunError", format!("compile on the PJRT CPU client failed: {e}")),
        )?;
    let compile_s = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let outputs = py
        .detach(|| -> Result<Vec<Buffer>, String> {
            let mut buffers = Vec::with_capacity(imported.len());
            for (i, t) in imported.iter().enumerate() {
                if !t.contiguous {
                    return Err(format!("input {i} is not contiguous"));
                }
                buffers.push(
                    upload(&client, &t.ty, t.bytes()).map_err(|e| format!("input {i}: {e}"))?,
                );
            }
            let refs: Vec<&Buffer> = buffers.iter().collect();
            cached.executable.execute(&refs).map_err(|e| format!("execute failed: {e}"))
        })
        .map_err(|e| raise(py, "CpuRunError", e))?;
    let run_s = start.elapsed().as_secs_f64();
    let tensors = outputs.into_iter().map(DeviceTensor::new).collect::<PyResult<Vec<_>>>()?;
    let d = PyDict::new(py);
    d.set_item("compile_s", compile_s)?;
    d.set_item("run_s", run_s)?;
    d.set_item("cache", format!("{:?}", cached.outcome).to_lowercase())?;
    Ok((tensors, d))
}

/// The compile cache's counters.
#[pyfunction]
pub fn cache_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = cache().stats();
    let d = PyDict::new(py);
    let items: [(&str, u64); 13] = [
        ("memory_hits", s.memory_hits),
        ("disk_hits", s.disk_hits),
        ("misses", s.misses),
        ("compiles", s.compiles),
        ("compile_errors", s.compile_errors),
        ("disk_writes", s.disk_writes),
        ("disk_write_failures", s.disk_write_failures),
        ("disk_read_failures", s.disk_read_failures),
        ("corrupt_entries", s.corrupt_entries),
        ("untrusted", s.untrusted),
        ("memory_evictions", s.memory_evictions),
        ("disk_evictions", s.disk_evictions),
        ("memory_entries", cache().memory_len() as u64),
    ];
    for (k, v) in items {
        d.set_item(k, v)?;
    }
    d.set_item("compile_time_s", s.compile_time.as_secs_f64())?;
    d.set_item("disk_load_time_s", s.disk_load_time.as_secs_f64())?;
    Ok(d)
}

/// The dtypes' short names the bridge moves through DLPack.
#[pyfunction]
pub fn dlpack_dtypes(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let names: Vec<&str> = tpu_kernels::DType::ALL
        .into_iter()
        .filter(|d| crate::tensor::dlpack_of_dtype(*d).is_some())
        .map(|d| d.short_name())
        .collect();
    PyTuple::new(py, names)
}
