//! Compile-only for real TPU generations with libtpu (no TPU needed).
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

mod common;

use common::{export_kernel, python_for_tests};
use tpu_kernels_registry::pjrt::testing::libtpu_for_tests;
use tpu_kernels_registry::pjrt::{CompileOptions, Error, Program, Topology};

const MATMUL_TANH: &str = r#"
func.func public @main(%x: tensor<128x256xf32>, %w: tensor<256x128xf32>) -> tensor<128x128xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<128x256xf32>, tensor<256x128xf32>) -> tensor<128x128xf32>
  %1 = stablehlo.tanh %0 : tensor<128x128xf32>
  return %1 : tensor<128x128xf32>
}"#;

#[test]
fn topologies_describe_tpu_generations() {
    let Some(libtpu) = libtpu_for_tests() else { return };
    assert!(libtpu.attributes().api_version().1 >= 81);
    assert!(libtpu.attributes().stablehlo_current_version().is_some());
    for name in ["v5e:1x1", "v6e:1x1", "v5e:2x2"] {
        let topology = Topology::new(&libtpu, name).unwrap();
        assert_eq!(topology.platform(), "tpu", "{name}");
        assert!(topology.device_count() >= 1, "{name}");
    }
    assert_eq!(Topology::new(&libtpu, "v5e:2x2").unwrap().device_count(), 4);
    assert_eq!(libtpu.platform().unwrap(), "tpu");
}

#[test]
fn unknown_topology_is_a_typed_error() {
    let Some(libtpu) = libtpu_for_tests() else { return };
    let err = Topology::new(&libtpu, "v99z:1x1").unwrap_err();
    assert!(matches!(err, Error::Topology { .. }), "{err}");
    assert!(err.to_string().contains("v99z:1x1"), "{err}");
}

#[test]
fn hand_written_module_compiles_for_v5e_and_v6e() {
    let Some(libtpu) = libtpu_for_tests() else { return };
    for name in ["v5e:1x1", "v6e:1x1"] {
        let topology = Topology::new(&libtpu, name).unwrap();
        let compiled =
            topology.compile(&Program::text(MATMUL_TANH), &CompileOptions::new()).unwrap();
        assert!(compiled.serialized_size() > 1000, "{name}: {compiled:?}");
        assert_eq!(compiled.topology(), name);
    }
}

#[test]
fn invalid_module_reports_the_compiler_message() {
    let Some(libtpu) = libtpu_for_tests() else { return };
    let topology = Topology::new(&libtpu, "v5e:1x1").unwrap();
    let err = topology
        .compile(&Program::text("func.func @main( garbage"), &CompileOptions::new())
        .unwrap_err();
    assert!(err.pjrt_message().is_some_and(|m| !m.is_empty()), "{err}");
}

#[test]
fn pallas_kernel_exported_by_jax_compiles_for_v5e() {
    let Some(libtpu) = libtpu_for_tests() else { return };
    let Some(python) = python_for_tests() else { return };
    let text = String::from_utf8(export_kernel(&python, "pallas_tpu")).unwrap();
    let program = Program::text(text);
    assert!(program.contains_tpu_custom_call());
    let topology = Topology::new(&libtpu, "v5e:1x1").unwrap();
    let compiled = topology.compile(&program, &CompileOptions::new()).unwrap();
    assert!(compiled.serialized_size() > 0);
}

#[test]
fn mistiled_mosaic_kernel_fails_with_e2002() {
    let Some(libtpu) = libtpu_for_tests() else { return };
    let Some(python) = python_for_tests() else { return };
    let text = String::from_utf8(export_kernel(&python, "mistiled_tpu")).unwrap();
    let topology = Topology::new(&libtpu, "v5e:1x1").unwrap();
    let err = topology.compile(&Program::text(text), &CompileOptions::new()).unwrap_err();
    let message = err.pjrt_message().unwrap_or_default();
    assert!(message.contains("E2002"), "{err}");
    assert!(err.to_string().contains("v5e:1x1"), "{err}");
}
