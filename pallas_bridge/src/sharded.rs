//! Sharded programs: one ATen graph lowered to one SPMD StableHLO program whose inputs and
//! outputs carry XLA shardings (`mhlo.sharding`), partitioned by XLA's SPMD partitioner and run
//! on several PJRT CPU devices from this one process (single-controller, as JAX and
//! PyTorch/XLA's SPMD mode run), or compiled for a TPU slice by libtpu's compile-only path.
//!
//! The Python side (`tpu_kernels.distributed`) maps a mesh and DTensor placements to the
//! sharding strings, cuts each input into its shards and puts the outputs back together; this
//! module lowers, compiles and runs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tpu_kernels::TensorType;
use tpu_kernels::registration::Platform;
use tpu_kernels_registry::dispatch::upload_on;
use tpu_kernels_registry::pjrt::{
    Client, ClientOptions, CompileOptions, Input, LoadedExecutable, Plugin, Program,
};

use tpu_kernels_registry::graph::ShardSpec;

use crate::torch_bridge::{
    GraphFailure, ManualLowering, export_buffer, import_tensor, lower_graph_sharded, runtime,
};

/// Devices of the process's sharded CPU client when `TPUK_CPU_DEVICES` does not say.
const DEFAULT_DEVICES: usize = 8;

/// HLO opcodes of collectives (and their async halves) that the partitioner inserts.
const COLLECTIVES: [&str; 6] = [
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
];

/// The process's CPU client for sharded programs: `TPUK_CPU_DEVICES` devices (default 8),
/// opened once, beside the single-device client eager calls and graphs use.
fn sharded_client() -> Result<&'static Client, String> {
    static CLIENT: Mutex<Option<Result<&'static Client, String>>> = Mutex::new(None);
    let mut slot = CLIENT.lock().unwrap_or_else(PoisonError::into_inner);
    slot.get_or_insert_with(|| {
        let count = match std::env::var("TPUK_CPU_DEVICES") {
            Ok(v) => match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(format!(
                        "TPUK_CPU_DEVICES={v:?} is not a device count (a whole number, 1 or more)"
                    ));
                }
            },
            Err(_) => DEFAULT_DEVICES,
        };
        tpu_kernels_registry::pjrt::retain_large_blocks();
        tpu_kernels_registry::pjrt::interleave_vector_loops()?;
        let client = Plugin::cpu()
            .and_then(|p| Client::new(&p, ClientOptions::new().cpu_device_count(count as i64)))
            .map_err(|e| format!("PJRT CPU client with {count} devices: {e}"))?;
        Ok(&*Box::leak(Box::new(client)))
    })
    .clone()
}

/// How many CPU devices sharded programs can use in this process.
#[pyfunction]
fn cpu_device_count() -> PyResult<usize> {
    sharded_client().map(|c| c.devices().len()).map_err(PyRuntimeError::new_err)
}

/// `module`'s text with each of `@main`'s inputs and outputs annotated with its sharding.
fn annotate(
    mut module: tpu_kernels::ir::Module,
    inputs: &[String],
    outputs: &[String],
) -> Result<String, String> {
    let Some(main) = module.functions.first_mut() else {
        return Err("the lowered module has no @main".to_owned());
    };
    if inputs.len() != main.params.len() || outputs.len() != main.results.len() {
        return Err(format!(
            "{} input and {} output shardings for a program of {} inputs and {} outputs",
            inputs.len(),
            outputs.len(),
            main.params.len(),
            main.results.len()
        ));
    }
    let attr = |s: &String| ("mhlo.sharding".to_owned(), format!("{s:?}"));
    for (attrs, s) in main.param_attrs.iter_mut().zip(inputs) {
        attrs.push(attr(s));
    }
    for (attrs, s) in main.result_attrs.iter_mut().zip(outputs) {
        attrs.push(attr(s));
    }
    Ok(module.to_text())
}

fn failure(e: GraphFailure) -> PyErr {
    PyValueError::new_err(e.message)
}

/// One graph as an SPMD program over `devices` CPU devices.
#[pyclass(name = "ShardedProgram", frozen, module = "tpu_kernels._native.torch_bridge")]
struct ShardedProgram {
    name: String,
    json: String,
    refused: Vec<String>,
    in_shardings: Vec<String>,
    out_shardings: Vec<String>,
    text: String,
    devices: usize,
    executable: Arc<LoadedExecutable>,
    inputs: Vec<TensorType>,
    outputs: Vec<TensorType>,
    kernels: Vec<String>,
    opcodes: BTreeMap<String, usize>,
    /// Kernels that run per shard in a manually sharded region, keyed by op or kernel name.
    manual: Vec<(String, ShardSpec)>,
    lowered: ManualLowering,
}

#[pymethods]
impl ShardedProgram {
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The annotated StableHLO text the CPU client compiled.
    #[getter]
    fn text(&self) -> &str {
        &self.text
    }

    #[getter]
    fn devices(&self) -> usize {
        self.devices
    }

    /// Registered kernels inlined into the program, in graph order.
    #[getter]
    fn kernels(&self) -> Vec<String> {
        self.kernels.clone()
    }

    /// The whole (unsharded) types of the program's inputs and outputs.
    #[getter]
    fn input_types(&self) -> Vec<String> {
        self.inputs.iter().map(TensorType::short).collect()
    }

    #[getter]
    fn output_types(&self) -> Vec<String> {
        self.outputs.iter().map(TensorType::short).collect()
    }

    /// Kernels that run per shard in a manually sharded region (graph order).
    #[getter]
    fn per_shard(&self) -> Vec<String> {
        self.lowered.per_shard.clone()
    }

    /// Why a kernel the step asked to run per shard runs whole instead, per node.
    #[getter]
    fn notes(&self) -> Vec<String> {
        self.lowered.notes.clone()
    }

    /// The collectives XLA's partitioner put into the per-device program, by HLO opcode.
    #[getter]
    fn collectives(&self) -> BTreeMap<String, usize> {
        self.opcodes
            .iter()
            .filter(|(op, _)| COLLECTIVES.iter().any(|c| op.starts_with(c)))
            .map(|(op, n)| (op.clone(), *n))
            .collect()
    }

    /// The per-device shapes of the inputs, as XLA partitioned them.
    #[getter]
    fn shard_shapes(&self) -> Option<Vec<Vec<i64>>> {
        self.executable.parameters().map(|ps| ps.iter().map(|p| p.dims.clone()).collect())
    }

    /// Runs the program: `shards[d]` holds device `d`'s shard of every input (contiguous CPU
    /// tensors); returns each device's outputs, `[device][output]`.
    fn run<'py>(
        &self,
        py: Python<'py>,
        shards: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyList>> {
        let client = sharded_client().map_err(PyRuntimeError::new_err)?;
        if shards.len() != self.devices {
            return Err(PyValueError::new_err(format!(
                "sharded program `{}` runs on {} devices, got inputs for {}",
                self.name,
                self.devices,
                shards.len()
            )));
        }
        let start = Instant::now();
        let mut buffers = Vec::with_capacity(self.devices);
        for (d, per_device) in shards.iter().enumerate() {
            let per_device = per_device.cast::<PyList>()?;
            if per_device.len() != self.inputs.len() {
                return Err(PyValueError::new_err(format!(
                    "sharded program `{}` takes {} inputs, device {d} got {}",
                    self.name,
                    self.inputs.len(),
                    per_device.len()
                )));
            }
            let device = &client.devices()[d];
            let mut row = Vec::with_capacity(per_device.len());
            for (i, t) in per_device.iter().enumerate() {
                let imported = import_tensor(&t, i)
                    .map_err(|e| PyValueError::new_err(format!("device {d}: {e}")))?;
                if !imported.contiguous {
                    return Err(PyValueError::new_err(format!(
                        "device {d}, input {i}: a shard must be contiguous"
                    )));
                }
                let b = upload_on(client, &imported.ty, imported.bytes(), device)
                    .map_err(|e| PyValueError::new_err(format!("device {d}, input {i}: {e}")))?;
                row.push(b);
            }
            buffers.push(row);
        }
        let args: Vec<Vec<Input<'_>>> =
            buffers.iter().map(|row| row.iter().map(Input::from).collect()).collect();
        let outs = py.detach(|| self.executable.execute_sharded(args)).map_err(|e| {
            PyRuntimeError::new_err(format!("sharded program `{}`: execute failed: {e}", self.name))
        })?;
        drop(buffers);
        let result = PyList::empty(py);
        for row in outs {
            let exported = PyList::empty(py);
            for b in row {
                exported.append(export_buffer(py, b, None, false)?)?;
            }
            result.append(exported)?;
        }
        crate::sharded::count_run(start);
        Ok(result)
    }

    /// Compiles the same program for TPU topology `topology` (`"v5e:2x2"`) with libtpu's
    /// compile-only path (no TPU needed): lowered for the TPU (Mosaic kernels as custom calls),
    /// annotated with the same shardings, partitioned over the topology's devices. Returns
    /// `{"topology", "devices", "executable_bytes", "compile_ms"}`.
    fn compile_for<'py>(&self, py: Python<'py>, topology: &str) -> PyResult<Bound<'py, PyDict>> {
        let rt = runtime(py)?;
        let topo = crate::runtime::topology(topology).map_err(PyRuntimeError::new_err)?;
        if topo.device_count() != self.devices {
            return Err(PyValueError::new_err(format!(
                "topology {topology} has {} devices, the program's mesh {}",
                topo.device_count(),
                self.devices
            )));
        }
        let (_, module, _, lowered) =
            lower_graph_sharded(rt, &self.json, &self.refused, Platform::Tpu, self.manual.clone())
                .map_err(failure)?;
        let text = annotate(module, &self.in_shardings, &self.out_shardings)
            .map_err(PyValueError::new_err)?;
        let mosaic_calls = text.matches("custom_call @tpu_custom_call").count();
        let text_for_report = text.clone();
        let start = Instant::now();
        let compiled = py
            .detach(|| topo.compile(&Program::text(text), &CompileOptions::spmd(self.devices)))
            .map_err(|e| {
                PyRuntimeError::new_err(format!(
                    "sharded program `{}` for {topology}: {e}",
                    self.name
                ))
            })?;
        let d = PyDict::new(py);
        d.set_item("topology", topology)?;
        d.set_item("devices", topo.device_count())?;
        d.set_item("executable_bytes", compiled.serialized_size())?;
        d.set_item("compile_ms", start.elapsed().as_secs_f64() * 1e3)?;
        d.set_item("mosaic_calls", mosaic_calls)?;
        d.set_item("per_shard", lowered.per_shard)?;
        d.set_item("notes", lowered.notes)?;
        d.set_item("text", text_for_report)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "ShardedProgram({}, {} devices, {} inputs, {} outputs, collectives={:?})",
            self.name,
            self.devices,
            self.inputs.len(),
            self.outputs.len(),
            self.collectives()
        )
    }
}

/// A kernel to run per shard, as Python gives it: op or kernel name, then the dimension cut
/// of each tensor input and each output (None: whole).
type ManualSpec = (String, Vec<Option<usize>>, Vec<Option<usize>>);

/// Runs and their time, for `report()`.
static RUNS: Mutex<(u64, u64)> = Mutex::new((0, 0));

fn count_run(start: Instant) {
    let mut r = RUNS.lock().unwrap_or_else(PoisonError::into_inner);
    r.0 += 1;
    r.1 += start.elapsed().as_nanos() as u64;
}

/// `(runs, nanoseconds)` of sharded programs so far.
#[pyfunction]
fn sharded_stats() -> (u64, u64) {
    *RUNS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Lowers graph `json` (the registry's format) to one SPMD program over `devices` CPU devices:
/// input `i` and output `j` carry XLA shardings `in_shardings[i]` and `out_shardings[j]`
/// (`"{replicated}"`, `"{devices=[4,1]0,1,2,3}"`, ...); XLA partitions it and inserts the
/// collectives. `refused` names kernels never to inline.
///
/// `manual` lists kernels (by op or kernel name) that run per shard in a manually sharded
/// region, as `shard_map` runs them: `(name, input dims, output dims)`, each the dimension of
/// the kernel's tensor input or output cut into `devices` shards (None: whole on every device).
/// A kernel that cannot take its per-shard call runs whole, with the reason in `notes`.
#[pyfunction]
#[pyo3(signature = (json, in_shardings, out_shardings, devices, refused = Vec::new(), manual = Vec::new()))]
fn compile_sharded(
    py: Python<'_>,
    json: &str,
    in_shardings: Vec<String>,
    out_shardings: Vec<String>,
    devices: usize,
    refused: Vec<String>,
    manual: Vec<ManualSpec>,
) -> PyResult<ShardedProgram> {
    let rt = runtime(py)?;
    let client = sharded_client().map_err(PyRuntimeError::new_err)?;
    if devices == 0 || devices > client.devices().len() {
        return Err(PyValueError::new_err(format!(
            "a mesh of {devices} devices: this process has {} CPU devices (TPUK_CPU_DEVICES)",
            client.devices().len()
        )));
    }
    let manual: Vec<(String, ShardSpec)> = manual
        .into_iter()
        .map(|(name, inputs, outputs)| (name, ShardSpec { inputs, outputs, devices }))
        .collect();
    let (graph, module, kernels, lowered) =
        lower_graph_sharded(rt, json, &refused, rt.platform, manual.clone()).map_err(failure)?;
    let main = module.main();
    let (inputs, outputs) = (main.params.clone(), main.results.clone());
    let text = annotate(module, &in_shardings, &out_shardings).map_err(PyValueError::new_err)?;
    let options = CompileOptions::spmd(devices);
    let program = Program::text(text.clone());
    let executable = py
        .detach(|| client.compile(&program, &options))
        .map_err(|e| PyValueError::new_err(format!("sharded graph `{}`: {e}", graph.name)))?;
    let opcodes = executable
        .optimized_opcodes()
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
        .unwrap_or_default();
    Ok(ShardedProgram {
        name: graph.name.clone(),
        json: json.to_owned(),
        refused,
        in_shardings,
        out_shardings,
        text,
        devices,
        executable: Arc::new(executable),
        inputs,
        outputs,
        kernels,
        opcodes,
        manual,
        lowered,
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(compile_sharded, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(sharded_stats, m)?)?;
    m.add_class::<ShardedProgram>()?;
    Ok(())
}
