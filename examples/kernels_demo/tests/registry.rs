//! The registry finds this crate's kernels, Rust-built and imported alike.

use kernels_demo as _;
use tpu_kernels::registration::{CacheKey, Platform};
use tpu_kernels::{DType, KernelRegistration, TensorType, registered};

fn kernel(name: &str) -> &'static KernelRegistration {
    registered()
        .into_iter()
        .find(|k| k.name == name)
        .unwrap_or_else(|| panic!("kernel `{name}` is not registered"))
}

#[test]
fn every_demo_kernel_is_registered_next_to_the_standard_ones() {
    let names: Vec<&str> = registered().iter().map(|k| k.name).collect();
    // Kernel names are unique across every crate linked in (the registry refuses duplicates).
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "duplicate kernel names in {names:?}");
    for expected in
        ["gated_silu", "gated_silu_backward", "fused_add_rms_norm", "mha", "rms_norm", "gelu"]
    {
        assert!(names.contains(&expected), "`{expected}` missing from {names:?}");
    }
}

#[test]
fn rust_kernels_emit_at_every_canonical_signature_and_outputs_match_the_rule() {
    for name in ["gated_silu", "gated_silu_backward", "fused_add_rms_norm"] {
        let k = kernel(name);
        for sig in k.canonical_signatures().unwrap() {
            k.accepts(&sig).unwrap_or_else(|e| panic!("{name} rejects {sig:?}: {e}"));
            let module = k.emit(&sig).unwrap_or_else(|e| panic!("{e}"));
            let text = module.to_text();
            assert!(text.contains(&format!("module @{name}")), "{text}");
            assert_eq!(k.output_types(&sig).unwrap(), module.main().results, "{name} {sig:?}");
        }
    }
}

#[test]
fn records_carry_ops_bindings_guards_and_cache_policy() {
    let k = kernel("fused_add_rms_norm");
    assert_eq!(k.ops, ["mylib::fused_add_rms_norm.default"]);
    assert_eq!(k.inputs, ["x", "residual", "weight"]);
    assert_eq!(k.schema, ["x", "residual", "weight", "eps", "label"]);
    assert_eq!(k.binding("label").unwrap().position, 4);
    assert_eq!(k.priority, 5);
    let label = k.static_param("label").unwrap();
    assert!(matches!(label.cache_key, CacheKey::Ignore { reason } if reason.contains("traces")));
    assert_eq!(k.static_param("eps").unwrap().cache_key, CacheKey::Include);
    // D % 128 == 0
    let bad = k.parse_signature("f32[8,96], f32[8,96], f32[96]").unwrap();
    assert!(k.accepts(&bad).unwrap_err().contains("multiple of 128"));
    assert_eq!(kernel("gated_silu").backward, Some("gated_silu_backward"));
}

#[test]
fn the_imported_kernel_embeds_both_modules_with_fingerprints() {
    let k = kernel("mha");
    assert!(k.is_imported());
    assert_eq!(k.ops, ["mylib::mha.default"]);
    assert_eq!(k.platforms, [Platform::Cpu, Platform::Tpu]);
    assert_eq!(k.dtypes, [DType::F32]);
    let tpu = k.imported_module(Platform::Tpu).unwrap();
    let cpu = k.imported_module(Platform::Cpu).unwrap();
    assert!(tpu.text.contains("tpu_custom_call"));
    assert!(!cpu.text.contains("tpu_custom_call"));
    for m in [tpu, cpu] {
        assert_eq!(m.fingerprint, tpu_kernels::reader::content_fingerprint(m.text).unwrap());
    }
    assert_ne!(tpu.fingerprint, cpu.fingerprint);
    let sig = k.parse_signature("f32[2,8,16,64], f32[2,8,16,64], f32[2,8,16,64]").unwrap();
    k.accepts(&sig).unwrap();
    assert_eq!(k.output_types(&sig).unwrap(), [TensorType::new(DType::F32, [2, 8, 16, 64])]);
    assert!(k.emit(&sig).unwrap_err().to_string().contains("imported"));
}
