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
