//! The attribute's behaviour: an annotated kernel registers, the registry finds it, and it
//! emits the module its body describes; the standard kernels' output rules agree with what
//! they build.

use tpu_kernels::registration::{BindingKind, CacheKey, Guard, OutputRule, Platform, StaticKind};
use tpu_kernels::{BuildError, tpu_kernel};
use tpu_kernels::{DType, KernelRegistration, KernelSignature, Tensor, TensorType, registered};

/// `x * scale + bias`, for the tests.
#[tpu_kernel(
    op = "test::scale_bias",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(x = [B, D], bias = [D]),
    require(D % 4 == 0, mode == "affine"),
    platforms = [cpu, tpu],
    priority = 3,
    defaults(scale = 2.0, mode = "affine", seed = 0),
    cache_key = [scale, mode],
    ignore_in_cache_key(seed = "the seed is not used by the emitted module"),
    output = like(x, [B, D]),
    backward = scale_bias_backward,
    canonical = ["f32[2,8], f32[8]", "bf16[3,4], bf16[4]; scale=0.5"],
)]
fn scale_bias(x: Tensor, scale: f64, bias: Tensor, mode: &str, seed: i64) -> Tensor {
    let _ = (mode, seed);
    x * scale + bias
}

fn pair_types(sig: &KernelSignature) -> Result<Vec<TensorType>, String> {
    Ok(vec![sig.inputs[0].clone(), sig.inputs[0].with_dtype(DType::F32)])
}

/// Two outputs, one of them f32; fallible body.
#[tpu_kernel(aten = "aten::test_pair.out", output_fn = pair_types)]
fn pair(x: Tensor) -> Result<(Tensor, Tensor), BuildError> {
    let b = x.builder();
    let one = b.scalar(x.dtype(), 1.0)?;
    Ok((x + one, x.cast(DType::F32)))
}

fn kernel(name: &str) -> &'static KernelRegistration {
    registered().into_iter().find(|k| k.name == name).expect("registered")
}

#[test]
fn the_annotated_kernel_is_registered_with_its_record() {
    let k = kernel("scale_bias");
    assert_eq!(k.ops, ["test::scale_bias.default"]);
    assert_eq!(k.inputs, ["x", "bias"]);
    assert_eq!(k.schema, ["x", "scale", "bias", "mode", "seed"]);
    let positions: Vec<(&str, usize, BindingKind)> =
        k.bindings.iter().map(|b| (b.name, b.position, b.kind)).collect();
    assert_eq!(
        positions,
        [
            ("x", 0, BindingKind::Tensor { index: 0 }),
            ("scale", 1, BindingKind::Static { index: 0 }),
            ("bias", 2, BindingKind::Tensor { index: 1 }),
            ("mode", 3, BindingKind::Static { index: 1 }),
            ("seed", 4, BindingKind::Static { index: 2 }),
        ]
    );
    let statics: Vec<_> = k.statics.iter().map(|s| (s.name, s.kind, s.default)).collect();
    assert_eq!(
        statics,
        [
            ("scale", StaticKind::Float, Some("2e0")),
            ("mode", StaticKind::Str, Some("affine")),
            ("seed", StaticKind::Int, Some("0")),
        ]
    );
    assert_eq!(k.statics[0].cache_key, CacheKey::Include);
    assert!(matches!(k.statics[2].cache_key, CacheKey::Ignore { .. }));
    assert_eq!(k.dtypes, [DType::F32, DType::BF16]);
    assert_eq!(k.platforms, [Platform::Cpu, Platform::Tpu]);
    assert_eq!(k.priority, 3);
    assert_eq!(k.backward, Some("scale_bias_backward"));
    assert_eq!(k.doc, "`x * scale + bias`, for the tests.");
    assert!(k.guards.contains(&Guard::DivisibleBy { input: 0, dim: 1, by: 4 }));
    assert!(k.guards.contains(&Guard::StaticEq { name: "mode", value: "affine" }));
    assert!(k.guards.contains(&Guard::SameDim { a: (0, 1), b: (1, 0) }));
}

#[test]
fn it_emits_the_module_its_body_describes() {
    let k = kernel("scale_bias");
    let sig = k.parse_signature("f32[2,8], f32[8]; scale=0.5").unwrap();
    k.accepts(&sig).unwrap();
    let text = k.emit(&sig).unwrap().to_text();
    assert!(text.starts_with("module @scale_bias"), "{text}");
    assert!(text.contains("5.000000e-01"), "{text}");
    assert!(text.contains("stablehlo.multiply"), "{text}");
    assert!(text.contains("stablehlo.add"), "{text}");
    // The typed entry point is the same function.
    assert_eq!(scale_bias::module(&sig).unwrap().to_text(), text);
    // Missing statics take their defaults.
    let bare = KernelSignature { inputs: sig.inputs.clone(), statics: Vec::new() };
    assert!(scale_bias::module(&bare).unwrap().to_text().contains("2.000000e+00"));
    // Guards reject what the shapes spec excludes.
    let odd = k.parse_signature("f32[2,6], f32[6]").unwrap();
    assert!(k.accepts(&odd).is_err());
    let other_mode = k.parse_signature("f32[2,8], f32[8]; mode=exact").unwrap();
    assert!(k.accepts(&other_mode).is_err());
    // Arity errors are errors, not panics.
    let short = KernelSignature { inputs: vec![sig.inputs[0].clone()], statics: Vec::new() };
    assert!(k.emit(&short).unwrap_err().to_string().contains("takes 2 tensors"));
}

#[test]
fn output_rules_compute_types_without_building() {
    let k = kernel("scale_bias");
    let sig = k.parse_signature("bf16[3,4], bf16[4]").unwrap();
    assert_eq!(k.output_types(&sig).unwrap(), [TensorType::new(DType::BF16, [3, 4])]);
    let p = kernel("pair");
    assert!(matches!(p.output, OutputRule::Fn(_)));
    let sig = KernelSignature { inputs: vec![TensorType::new(DType::BF16, [5])], statics: vec![] };
    let built = p.emit(&sig).unwrap();
    assert_eq!(p.output_types(&sig).unwrap(), built.main().results);
    assert_eq!(p.ops, ["aten::test_pair.out"]);
}

#[test]
fn every_standard_kernel_is_registered_and_its_output_rule_matches_its_module() {
    let names: Vec<&str> = registered().iter().map(|k| k.name).collect();
    for expected in [
        "gelu",
        "gelu_tanh",
        "layer_norm",
        "log_softmax",
        "matmul_bias_act",
        "rms_norm",
        "silu",
        "softmax",
    ] {
        assert!(names.contains(&expected), "standard kernel `{expected}` not registered");
    }
    for k in registered() {
        assert!(!matches!(k.output, OutputRule::Build) || k.name == "pair", "{}", k.name);
        for sig in k.canonical_signatures().unwrap() {
            let built = k.emit(&sig).unwrap();
            assert_eq!(k.output_types(&sig).unwrap(), built.main().results, "{} {sig:?}", k.name);
        }
    }
}

#[test]
fn standard_op_names_are_full_overloads() {
    assert_eq!(kernel("gelu").ops, ["aten::gelu.default"]);
    assert_eq!(kernel("layer_norm").schema, ["input", "normalized_shape", "weight", "bias", "eps"]);
    assert_eq!(kernel("layer_norm").binding("eps").unwrap().position, 4);
    assert_eq!(kernel("softmax").binding("self").unwrap().position, 0);
    assert_eq!(kernel("rms_norm").ops, ["tpuk::rms_norm.default"]);
}
