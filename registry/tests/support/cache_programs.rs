//! Programs and checks shared by the compile-cache tests.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

use tpu_kernels_registry::pjrt::{Client, LoadedExecutable, Program};

/// `x * y + c`, a different program (and key) for every `c`.
pub fn program(c: f32) -> Program {
    Program::text(format!(
        r#"func.func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {{
  %c = stablehlo.constant dense<{c:?}> : tensor<4xf32>
  %0 = stablehlo.multiply %x, %y : tensor<4xf32>
  %1 = stablehlo.add %0, %c : tensor<4xf32>
  return %1 : tensor<4xf32>
}}"#
    ))
}

/// Runs `exe` and checks it computes `x * y + c`.
pub fn check_numerics(client: &Client, exe: &LoadedExecutable, c: f32) {
    let x = [1.0f32, 2.0, 3.0, 4.0];
    let y = [0.5f32, -1.0, 2.0, 10.0];
    let bx = client.buffer_from_host(&x, &[4]).unwrap();
    let by = client.buffer_from_host(&y, &[4]).unwrap();
    let out = exe.execute(&[&bx, &by]).unwrap()[0].to_vec::<f32>().unwrap();
    let expected: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a * b + c).collect();
    assert_eq!(out, expected);
}
