//! Rust host functions as XLA FFI custom calls on the CPU plugin.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::pjrt::{
    CompileOptions, HostCall, HostFunction, Program, register_host_function,
};

struct AddOne;

impl HostFunction for AddOne {
    fn call(call: &mut HostCall<'_>) -> Result<(), String> {
        let x = call.arg(0)?.as_slice::<f32>()?;
        let y = call.take_result(0)?.into_slice::<f32>()?;
        for (y, x) in y.iter_mut().zip(x) {
            *y = x + 1.0;
        }
        Ok(())
    }
}

struct Fails;

impl HostFunction for Fails {
    fn call(call: &mut HostCall<'_>) -> Result<(), String> {
        // Reading an f32 buffer as i32 is refused by the typed view.
        call.arg(0)?.as_slice::<i32>()?;
        Ok(())
    }
}

struct Panics;

impl HostFunction for Panics {
    fn call(_: &mut HostCall<'_>) -> Result<(), String> {
        panic!("boom")
    }
}

fn module(target: &str) -> String {
    format!(
        r#"
func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {{
  %0 = stablehlo.custom_call @{target}(%x) {{api_version = 4 : i32}} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %1 = stablehlo.multiply %0, %0 : tensor<2x3xf32>
  return %1 : tensor<2x3xf32>
}}"#
    )
}

#[test]
fn rust_function_runs_as_a_custom_call() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let plugin = client.plugin();
    register_host_function::<AddOne>(&plugin, "tpuk_test_add_one").unwrap();
    // Registering the same function again is fine; another one under the name is not.
    register_host_function::<AddOne>(&plugin, "tpuk_test_add_one").unwrap();
    assert!(register_host_function::<Fails>(&plugin, "tpuk_test_add_one").is_err());

    let exe = client
        .compile(&Program::text(module("tpuk_test_add_one")), &CompileOptions::new())
        .unwrap();
    let x = client.buffer_from_host(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]).unwrap();
    let out = exe.execute(&[&x]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![1.0, 4.0, 9.0, 16.0, 25.0, 36.0]);
}

#[test]
fn handler_errors_and_panics_fail_the_execution_with_their_message() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let plugin = client.plugin();
    register_host_function::<Fails>(&plugin, "tpuk_test_fails").unwrap();
    register_host_function::<Panics>(&plugin, "tpuk_test_panics").unwrap();
    let x = client.buffer_from_host(&[0.0f32; 6], &[2, 3]).unwrap();
    for (target, expected) in
        [("tpuk_test_fails", "buffer holds f32"), ("tpuk_test_panics", "panicked")]
    {
        let exe = client.compile(&Program::text(module(target)), &CompileOptions::new()).unwrap();
        let err = exe.execute(&[&x]).unwrap_err();
        assert!(err.to_string().contains(expected), "{target}: {err}");
    }
}

#[test]
fn unregistered_target_is_a_compile_error() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let err = client
        .compile(&Program::text(module("tpuk_never_registered")), &CompileOptions::new())
        .unwrap_err();
    assert!(err.pjrt_message().unwrap_or_default().contains("tpuk_never_registered"), "{err}");
}

static RAN_ON: std::sync::Mutex<Option<std::thread::ThreadId>> = std::sync::Mutex::new(None);

struct RecordsThread;

impl HostFunction for RecordsThread {
    fn call(call: &mut HostCall<'_>) -> Result<(), String> {
        *RAN_ON.lock().unwrap() = Some(std::thread::current().id());
        let x = call.arg(0)?.as_slice::<f32>()?;
        call.take_result(0)?.into_slice::<f32>()?.copy_from_slice(x);
        Ok(())
    }
}

/// `asynchronous(false)` runs a program on the thread that executes it: the execution is done
/// when `execute_async` returns. The program is large enough (16k logistic elements) that the
/// plugin's default would hand it to its worker thread.
#[test]
fn a_synchronous_client_runs_programs_on_the_calling_thread() {
    use tpu_kernels_registry::pjrt::{ClientOptions, Input};
    let Some(client) = cpu_client_for_tests(1) else { return };
    let plugin = client.plugin();
    let sync = tpu_kernels_registry::pjrt::Client::new(
        &plugin,
        ClientOptions::new().cpu_device_count(1).asynchronous(false),
    )
    .unwrap();
    register_host_function::<RecordsThread>(&plugin, "tpuk_test_records_thread").unwrap();
    let text = r#"
func.func @main(%x: tensor<2x3xf32>, %y: tensor<64x256xf32>) -> (tensor<2x3xf32>, tensor<64x256xf32>) {
  %0 = stablehlo.custom_call @tpuk_test_records_thread(%x) {api_version = 4 : i32} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  %1 = stablehlo.logistic %y : tensor<64x256xf32>
  %2 = stablehlo.multiply %y, %1 : tensor<64x256xf32>
  return %0, %2 : tensor<2x3xf32>, tensor<64x256xf32>
}"#;
    let exe = sync.compile(&Program::text(text), &CompileOptions::new()).unwrap();
    let x = sync.buffer_from_host(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let y = sync.buffer_from_host(&vec![0.0f32; 64 * 256], &[64, 256]).unwrap();
    for _ in 0..3 {
        *RAN_ON.lock().unwrap() = None;
        let run = exe.execute_async(vec![Input::Borrowed(&x), Input::Borrowed(&y)]).unwrap();
        assert!(run.is_ready().unwrap(), "the run was not done when execute returned");
        assert_eq!(*RAN_ON.lock().unwrap(), Some(std::thread::current().id()));
        let out = run.wait().unwrap().pop().unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert!(out[1].to_vec::<f32>().unwrap().iter().all(|v| *v == 0.0));
    }
}
