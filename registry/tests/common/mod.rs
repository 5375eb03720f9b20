//! Shared helpers of the PJRT integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use tpu_kernels_registry::pjrt::testing::{runtimes_required, skip_loudly};
use tpu_kernels_registry::pjrt::{Client, CompileOptions, LoadedExecutable, Program, cache_dir};

/// The project's Python (with jax), or `None` after a loud skip message; panics when runtimes
/// are required (`TPUK_REQUIRE_RUNTIMES=1`).
pub fn python_for_tests() -> Option<PathBuf> {
    let venv = std::env::var_os("TPUK_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("venv"));
    let python = venv.join("bin").join("python");
    if python.exists() {
        return Some(python);
    }
    let msg = format!(
        "the project's Python venv is missing ({}): run `scripts/dev setup`",
        python.display()
    );
    if runtimes_required() {
        panic!("TPUK_REQUIRE_RUNTIMES=1 but {msg}");
    }
    skip_loudly(&msg);
    None
}

/// Runs `tests/data/export_kernels.py MODE` and returns what it wrote.
pub fn export_kernel(python: &Path, mode: &str) -> Vec<u8> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/export_kernels.py");
    let out = std::env::temp_dir().join(format!("tpuk-export-{}-{mode}", std::process::id()));
    let status = Command::new(python)
        .arg(&script)
        .arg(mode)
        .arg(&out)
        // Export only; keep jax from initializing libtpu as a backend.
        .env("JAX_PLATFORMS", "cpu")
        .status()
        .expect("spawn python");
    assert!(status.success(), "export_kernels.py {mode} failed: {status}");
    let bytes = std::fs::read(&out).expect("read exported kernel");
    let _ = std::fs::remove_file(&out);
    bytes
}

/// Compiles MLIR text with default options.
pub fn compile(client: &Client, text: &str) -> LoadedExecutable {
    client.compile(&Program::text(text), &CompileOptions::new()).expect("compile")
}

pub const ADD_F32X4: &str = r#"
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"#;
