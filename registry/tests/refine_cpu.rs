//! Shape refinement on the real XLA CPU plugin: functions exported by jax with symbolic shapes
//! (`tests/data/export_symbolic.py`) are refined in Rust for concrete shapes, compiled, run, and
//! compared with what jax computes on the same inputs.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use common::python_for_tests;
use half::bf16;
use serde_json::Value;
use tpu_kernels::refine::{RefineError, refine};
use tpu_kernels::{DType, TensorType};
use tpu_kernels_registry::numerics::{Tolerance, check_close};
use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::pjrt::{Buffer, Client, CompileOptions, Program};

/// Every case the script must export; a case cannot disappear unnoticed.
const EXPECTED_CASES: [&str; 27] = [
    "rms_norm",
    "softmax",
    "layer_norm",
    "matmul",
    "reshape_wide",
    "reshape_split",
    "concat",
    "arange_mask",
    "pad",
    "cumsum",
    "argmax",
    "fori_loop",
    "while_loop",
    "sort",
    "halves",
    "square",
    "attention",
    "gelu",
    "top_k",
    "take",
    "scatter",
    "strided",
    "cond",
    "conv",
    "pad_by_dim",
    "slice_to_dim",
    "first_half",
];

/// One tensor of a run: its type and flat data (floats, or integers as floats).
struct Tensor {
    ty: TensorType,
    data: Vec<f64>,
}

struct Run {
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
}

struct Failure {
    inputs: Vec<TensorType>,
    message: String,
}

struct Case {
    name: String,
    mlir: String,
    runs: Vec<Run>,
    failures: Vec<Failure>,
}

fn tensor_type(v: &Value) -> TensorType {
    TensorType::parse_short(v.as_str().unwrap()).unwrap()
}

fn tensor(v: &Value) -> Tensor {
    let data = v["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    Tensor { ty: tensor_type(&v["type"]), data }
}

/// Runs the export script once per test process (a couple of seconds of jax).
fn cases(python: &Path) -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/export_symbolic.py");
        let out = Command::new(python)
            .arg(&script)
            .env("JAX_PLATFORMS", "cpu")
            .output()
            .expect("spawn python");
        assert!(
            out.status.success(),
            "export_symbolic.py failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let json: Value = serde_json::from_slice(&out.stdout).expect("export_symbolic.py output");
        json["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| Case {
                name: c["name"].as_str().unwrap().to_string(),
                mlir: c["mlir"].as_str().unwrap().to_string(),
                runs: c["runs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| Run {
                        inputs: r["inputs"].as_array().unwrap().iter().map(tensor).collect(),
                        outputs: r["outputs"].as_array().unwrap().iter().map(tensor).collect(),
                    })
                    .collect(),
                failures: c["failures"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|f| Failure {
                        inputs: f["inputs"].as_array().unwrap().iter().map(tensor_type).collect(),
                        message: f["message"].as_str().unwrap().to_string(),
                    })
                    .collect(),
            })
            .collect()
    })
}

fn dims(ty: &TensorType) -> Vec<i64> {
    ty.shape.static_dims().unwrap().into_iter().map(|d| d as i64).collect()
}

fn upload(client: &Client, t: &Tensor) -> Buffer {
    let dims = dims(&t.ty);
    match t.ty.dtype {
        DType::F32 => {
            let v: Vec<f32> = t.data.iter().map(|&x| x as f32).collect();
            client.buffer_from_host(&v, &dims).unwrap()
        }
        DType::BF16 => {
            let v: Vec<bf16> = t.data.iter().map(|&x| bf16::from_f64(x)).collect();
            client.buffer_from_host(&v, &dims).unwrap()
        }
        DType::I32 => {
            let v: Vec<i32> = t.data.iter().map(|&x| x as i32).collect();
            client.buffer_from_host(&v, &dims).unwrap()
        }
        other => panic!("no upload for {other}"),
    }
}

/// Compares an output with jax's: exact for integers; for floats within a few units in the last
/// place of the output's type, `rel * (1 + |jax|)` (jax and the plugin may fuse and order
/// reductions differently). A NaN or an infinity jax does not have is a mismatch.
fn compare(what: &str, got: &Buffer, want: &Tensor) -> Result<(), String> {
    if got.dims() != dims(&want.ty).as_slice() {
        return Err(format!("{what}: shape {:?}, jax says {}", got.dims(), want.ty));
    }
    let (values, rel): (Vec<f64>, f64) = match want.ty.dtype {
        DType::F32 => (got.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect(), 1e-5),
        DType::BF16 => {
            (got.to_vec::<bf16>().unwrap().into_iter().map(|x| x.to_f64()).collect(), 1.6e-2)
        }
        DType::I32 => (got.to_vec::<i32>().unwrap().into_iter().map(f64::from).collect(), 0.0),
        other => return Err(format!("{what}: no comparison for {other}")),
    };
    check_close(&values, &want.data, Tolerance::new(rel, rel))
        .map(drop)
        .map_err(|e| format!("{what} against jax: {e}"))
}

#[test]
fn the_script_exports_every_case_with_symbolic_shapes() {
    let Some(python) = python_for_tests() else { return };
    let names: Vec<&str> = cases(&python).iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, EXPECTED_CASES);
    for case in cases(&python) {
        assert!(case.mlir.contains("tensor<?"), "{}: not symbolic", case.name);
        assert!(!case.runs.is_empty(), "{}: no runs", case.name);
    }
}

#[test]
fn refined_exports_compile_and_match_jax_on_cpu() {
    let Some(python) = python_for_tests() else { return };
    let Some(client) = cpu_client_for_tests(1) else { return };
    let mut problems = Vec::new();
    let mut checked = 0;
    for case in cases(&python) {
        for run in &case.runs {
            let types: Vec<TensorType> = run.inputs.iter().map(|t| t.ty.clone()).collect();
            let shapes: Vec<String> = types.iter().map(TensorType::short).collect();
            let what = format!("{} ({})", case.name, shapes.join(", "));
            let text = match refine(&case.mlir, &types) {
                Ok(text) => text,
                Err(e) => {
                    problems.push(format!("{what}: refine failed: {e}"));
                    continue;
                }
            };
            assert_eq!(refine(&case.mlir, &types).unwrap(), text, "{what}: not deterministic");
            assert!(!text.contains('?'), "{what}: a dynamic type is left:\n{text}");
            assert!(!text.contains("shape_assertion"), "{what}: an assertion is left:\n{text}");
            assert!(!text.contains("jax.uses_shape_polymorphism"), "{what}");
            for dynamic in [
                "dynamic_broadcast_in_dim",
                "dynamic_reshape",
                "dynamic_iota",
                "real_dynamic_slice",
                "dynamic_pad",
                "dynamic_gather",
                "dynamic_reduce_window",
            ] {
                assert!(!text.contains(dynamic), "{what}: {dynamic} is left:\n{text}");
            }
            let exe = match client.compile(&Program::text(text.as_str()), &CompileOptions::new()) {
                Ok(exe) => exe,
                Err(e) => {
                    problems.push(format!("{what}: compile failed: {e}\n{text}"));
                    continue;
                }
            };
            let buffers: Vec<Buffer> = run.inputs.iter().map(|t| upload(&client, t)).collect();
            let args: Vec<&Buffer> = buffers.iter().collect();
            let outputs = exe.execute(&args).unwrap();
            assert_eq!(outputs.len(), run.outputs.len(), "{what}: output count");
            for (k, (got, want)) in outputs.iter().zip(&run.outputs).enumerate() {
                if let Err(e) = compare(&format!("{what} output {k}"), got, want) {
                    problems.push(e);
                }
            }
            checked += 1;
        }
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
    assert!(checked >= 2 * EXPECTED_CASES.len() - 1, "only {checked} runs checked");
}

#[test]
fn violated_shape_specifications_report_jax_message() {
    let Some(python) = python_for_tests() else { return };
    let mut seen = 0;
    for case in cases(&python) {
        for failure in &case.failures {
            let what = format!("{} with {:?}", case.name, failure.inputs);
            match refine(&case.mlir, &failure.inputs) {
                Err(RefineError::ShapeAssertion { message, line, column }) => {
                    assert_eq!(message, failure.message, "{what}");
                    assert!(line > 0 && column > 0, "{what}");
                }
                other => panic!("{what}: expected a shape assertion failure, got {other:?}"),
            }
            seen += 1;
        }
    }
    // b >= 1 with b = 0, a divisibility constraint, 2*b against 7, and b against 4.
    assert_eq!(seen, 4);
}
