//! Bad input never crashes the process: each case is a typed error.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{ADD_F32X4, compile};
use tpu_kernels_registry::pjrt::testing::{
    cpu_client_for_tests, cpu_plugin_for_tests, runtimes_required, skip_loudly,
};
use tpu_kernels_registry::pjrt::{
    AlignedHostBuffer, Client, ClientOptions, CompileOptions, DeviceAssignment, ElementType, Error,
    ErrorCode, Plugin, Program, locate_cpu_plugin,
};

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tpuk-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn nonexistent_plugin() {
    let err = Plugin::load("/nonexistent/dir/pjrt_nothing.so").unwrap_err();
    assert!(matches!(err, Error::PluginNotFound { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/dir/pjrt_nothing.so"), "{err}");
}

#[test]
fn missing_runtime_says_how_to_install_it() {
    // Run in a child process so the environment change cannot race with other tests.
    if std::env::var_os("TPUK_LOCATE_CHILD").is_some() {
        let err = locate_cpu_plugin().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("scripts/dev setup") && msg.contains("TPUK_PJRT_CPU_PLUGIN"), "{msg}");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let output = Command::new(exe)
        .args(["--exact", "missing_runtime_says_how_to_install_it", "--nocapture"])
        .env("TPUK_LOCATE_CHILD", "1")
        .env("TPUK_PJRT_CPU_PLUGIN", "/nonexistent/pjrt_cpu.so")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn text_file_named_so() {
    let path = temp_path("not_a_plugin.so");
    std::fs::write(&path, "this is not a shared library\n").unwrap();
    let err = Plugin::load(&path).unwrap_err();
    assert!(matches!(err, Error::PluginLoad { .. }), "{err}");
}

#[test]
fn truncated_plugin() {
    let Ok(real) = locate_cpu_plugin() else {
        let _ = cpu_plugin_for_tests(); // skips loudly, or fails when runtimes are required
        return;
    };
    let bytes = std::fs::read(real).unwrap();
    let path = temp_path("truncated_pjrt_cpu.so");
    std::fs::write(&path, &bytes[..bytes.len().min(1 << 20)]).unwrap();
    let err = Plugin::load(&path).unwrap_err();
    assert!(matches!(err, Error::PluginLoad { .. }), "{err}");
}

/// Builds a shared library with the C compiler. Without one (`cc` cannot be started) the test
/// skips loudly, or fails under `TPUK_REQUIRE_RUNTIMES=1` like a missing runtime
/// ([`tpu_kernels_registry::pjrt::testing`]); a fixture `cc` cannot compile always fails.
fn build_c_library(name: &str, source: &str) -> Option<PathBuf> {
    let src = temp_path(&format!("{name}.c"));
    let lib = temp_path(&format!("{name}.so"));
    std::fs::write(&src, source).unwrap();
    let output = match Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
    {
        Ok(output) => output,
        Err(e) => {
            let what = format!("a C compiler (cc, to build the {name} fixture)");
            if runtimes_required() {
                panic!("TPUK_REQUIRE_RUNTIMES=1 but {what} is unavailable: {e}");
            }
            skip_loudly(&format!(
                "{what} is unavailable: {e}\n*** (set TPUK_REQUIRE_RUNTIMES=1 to make this a failure)"
            ));
            return None;
        }
    };
    assert!(
        output.status.success(),
        "cc cannot build the {name} fixture ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Some(lib)
}

#[test]
fn shared_library_without_get_pjrt_api() {
    let Some(lib) = build_c_library("no_pjrt", "int tpuk_something(void) { return 1; }\n") else {
        return;
    };
    let err = Plugin::load(&lib).unwrap_err();
    assert!(matches!(err, Error::NotAPlugin { .. }), "{err}");
}

#[test]
fn plugin_with_too_old_api() {
    // A fake plugin whose table says PJRT C API 0.54 (what the published `pjrt` crate speaks).
    let source = r#"
#include <stddef.h>
struct version { size_t struct_size; void* ext; int major; int minor; };
struct api { size_t struct_size; void* ext; struct version v; void* fns[120]; };
static struct api table = { sizeof(struct api), 0, { 24, 0, 0, 54 } };
const struct api* GetPjrtApi(void) { return &table; }
"#;
    let Some(lib) = build_c_library("old_pjrt", source) else { return };
    let err = Plugin::load(&lib).unwrap_err();
    assert!(matches!(err, Error::ApiTooOld { found_major: 0, found_minor: 54, .. }), "{err}");
    assert!(err.to_string().contains("0.54"), "{err}");
}

#[test]
fn a_huge_aligned_host_buffer_is_refused_without_a_panic() {
    // (element count, what is wrong): the byte count overflows, its rounding to a page
    // overflows, or it fits usize but not a Layout (past isize::MAX).
    let cases = [
        (usize::MAX, "the size overflows usize"),
        (usize::MAX / 4, "the size overflows usize"),
        (isize::MAX as usize / 4 + 1, "is more than isize::MAX"),
    ];
    for (len, why) in cases {
        let err = AlignedHostBuffer::<f32>::zeroed(len).unwrap_err();
        assert!(matches!(err, Error::HostData { .. }), "{len}: {err:?}");
        let message = err.to_string();
        assert!(message.contains(&format!("{len} f32 elements (4 bytes each)")), "{message}");
        assert!(message.contains(why), "{message}");
    }
    let err = AlignedHostBuffer::<bool>::zeroed(usize::MAX).unwrap_err();
    assert!(err.to_string().contains("i1 elements (1 byte each)"), "{err}");
    let err = AlignedHostBuffer::<u64>::zeroed(usize::MAX / 8 + 1).unwrap_err();
    assert!(err.to_string().contains("the size overflows usize"), "{err}");
    // Sizes that fit still allocate: empty, and a copy.
    assert!(AlignedHostBuffer::<f32>::zeroed(0).unwrap().is_empty());
    let copy = AlignedHostBuffer::from_slice(&[1.0f32, -2.0, 3.5]).unwrap();
    assert_eq!((&copy[..], copy.as_ptr() as usize % 4096), (&[1.0f32, -2.0, 3.5][..], 0));
}

#[test]
fn invalid_mlir_is_a_compile_error_with_pjrt_code() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let err = client
        .compile(
            &Program::text("func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { garbage }"),
            &CompileOptions::new(),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Pjrt { call: "PJRT_Client_Compile", .. }), "{err}");
    assert!(err.code().is_some_and(|c| c != ErrorCode::Other(0)));
    assert!(!err.pjrt_message().unwrap_or_default().is_empty());
    // Garbage bytes dressed as bytecode.
    let err = client
        .compile(&Program::bytecode(b"ML\xefR\x00\x01garbage".to_vec()), &CompileOptions::new());
    assert!(err.is_err());
}

#[test]
fn tpu_custom_call_is_refused_before_the_cpu_plugin() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let module = r#"
func.func @main(%x: tensor<8x128xf32>) -> tensor<8x128xf32> {
  %0 = stablehlo.custom_call @tpu_custom_call(%x) {backend_config = "{}"} : (tensor<8x128xf32>) -> tensor<8x128xf32>
  return %0 : tensor<8x128xf32>
}"#;
    let err = client.compile(&Program::text(module), &CompileOptions::new()).unwrap_err();
    assert!(
        matches!(err, Error::TpuCustomCallOnNonTpu { ref platform } if platform == "cpu"),
        "{err}"
    );
}

#[test]
fn wrong_argument_count_dtype_and_shape() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let exe = compile(&client, ADD_F32X4);
    let good = client.buffer_from_host(&[1.0f32; 4], &[4]).unwrap();
    let ints = client.buffer_from_host(&[1i32; 4], &[4]).unwrap(); // same byte size as f32[4]
    let long = client.buffer_from_host(&[1.0f32; 8], &[8]).unwrap();
    let square = client.buffer_from_host(&[1.0f32; 4], &[2, 2]).unwrap();

    let err = exe.execute(&[&good]).unwrap_err();
    assert!(matches!(err, Error::ArgumentCount { expected: 2, got: 1 }), "{err}");
    let err = exe.execute(&[&good, &good, &good]).unwrap_err();
    assert!(matches!(err, Error::ArgumentCount { expected: 2, got: 3 }), "{err}");
    let err = exe.execute(&[&good, &ints]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ArgumentType { index: 1, expected: ElementType::F32, got: ElementType::S32 }
        ),
        "{err}"
    );
    let err = exe.execute(&[&long, &good]).unwrap_err();
    assert!(matches!(err, Error::ArgumentShape { index: 0, .. }), "{err}");
    let err = exe.execute(&[&good, &square]).unwrap_err();
    assert!(matches!(err, Error::ArgumentShape { index: 1, .. }), "{err}");
    // Still usable after all that.
    assert_eq!(exe.execute(&[&good, &good]).unwrap()[0].to_vec::<f32>().unwrap(), vec![2.0; 4]);
}

#[test]
fn buffers_of_another_client_are_refused() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let other = Client::new(&client.plugin(), ClientOptions::new()).unwrap();
    let exe = compile(&client, ADD_F32X4);
    let foreign = other.buffer_from_host(&[1.0f32; 4], &[4]).unwrap();
    let err = exe.execute(&[&foreign, &foreign]).unwrap_err();
    assert!(matches!(err, Error::ArgumentPlacement { index: 0, .. }), "{err}");
}

#[test]
fn host_data_mismatches() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let err = client.buffer_from_host(&[1.0f32; 3], &[4]).unwrap_err();
    assert!(matches!(err, Error::HostData { .. }), "{err}");
    let err = client.buffer_from_host(&[1.0f32; 3], &[-3]).unwrap_err();
    assert!(matches!(err, Error::HostData { .. }), "{err}");
    let buf = client.buffer_from_host(&[1.0f32; 4], &[4]).unwrap();
    let mut ints = [0i32; 4];
    assert!(matches!(buf.to_host(&mut ints), Err(Error::HostData { .. })));
    let mut short = [0f32; 3];
    assert!(matches!(buf.to_host(&mut short), Err(Error::HostData { .. })));
    assert!(matches!(buf.read_in_place_as::<f64, _>(|_| ()), Err(Error::HostData { .. })));
}

#[test]
fn inconsistent_compile_options() {
    let Some(client) = cpu_client_for_tests(4) else { return };
    let options =
        CompileOptions::spmd(4).device_assignment(DeviceAssignment::partitions(&[0, 1]).unwrap());
    let err = client.compile(&Program::text(ADD_F32X4), &options).unwrap_err();
    assert!(matches!(err, Error::InvalidOptions { .. }), "{err}");
    // More partitions than devices: PJRT's own error, not a crash.
    let err = client.compile(&Program::text(ADD_F32X4), &CompileOptions::spmd(8)).unwrap_err();
    assert!(matches!(err, Error::Pjrt { .. }), "{err}");
}

#[test]
fn corrupt_serialized_executable() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let err = client.deserialize(b"definitely not an executable").unwrap_err();
    assert!(matches!(err, Error::Pjrt { .. }), "{err}");
}
