//! Kernel selection: priorities, specificity, guards with reasons, ambiguity, runtime
//! registration and removal, and the linked-in standard kernels.

use std::sync::Arc;

use tpu_kernels::registration::{
    Guard, KernelRegistration, KernelSignature, Platform, StaticKind, StaticParam, StaticValue,
};
use tpu_kernels::{BuildError, DType, Module, TensorType};
use tpu_kernels_registry::{
    CallMeta, Index, Kernel, KernelSource, NoKernel, Registry, RegistryError, normalize_op,
};

fn never_built(_: &KernelSignature) -> Result<Module, BuildError> {
    unreachable!("selection tests never build modules")
}

fn kernel(record: KernelRegistration) -> Kernel {
    Kernel {
        ops: record.ops.iter().map(|o| normalize_op(o)).collect(),
        record,
        source: KernelSource::Built,
        runtime: false,
    }
}

fn sig(inputs: &[&str], statics: &[(&'static str, StaticValue)]) -> KernelSignature {
    KernelSignature {
        inputs: inputs.iter().map(|s| TensorType::parse_short(s).expect("valid type")).collect(),
        statics: statics.to_vec(),
    }
}

fn call<'a>(sig: &'a KernelSignature, contiguous: &'a [bool]) -> CallMeta<'a> {
    CallMeta { sig, contiguous, platform: Platform::Cpu }
}

const BASE: KernelRegistration = KernelRegistration::new("base", never_built)
    .ops(&["test::op"])
    .inputs(&["x"])
    .dtypes(&[DType::F32, DType::BF16]);

#[test]
fn every_standard_kernel_is_linked_and_indexed() {
    let index = Index::from_inventory().expect("standard kernels index without ambiguity");
    for name in [
        "gelu",
        "gelu_tanh",
        "silu",
        "rms_norm",
        "layer_norm",
        "softmax",
        "log_softmax",
        "matmul_bias_act",
        "rms_norm_backward",
        "swiglu",
        "swiglu_backward",
        "cross_entropy",
        "cross_entropy_backward",
        "rotary",
        "adamw_step",
        "dropout",
        "sdpa_flash_cpu",
        "sdpa_flash_cpu_masked",
        "sdpa_flash_cpu_backward",
        "sdpa_flash_cpu_masked_backward",
        "attention",
        "attention_backward",
        "softmax_backward",
        "log_softmax_backward",
        "layer_norm_backward",
    ] {
        assert!(index.kernel(name).is_some(), "standard kernel `{name}` not registered");
    }
    assert!(index.ops().contains(&"aten::gelu.default".to_owned()));
}

#[test]
fn static_values_pick_between_gelu_variants() {
    let index = Index::from_inventory().unwrap();
    let ones = [true];
    let tanh = sig(&["f32[4,8]"], &[("approximate", StaticValue::Str("tanh".into()))]);
    let none = sig(&["f32[4,8]"], &[("approximate", StaticValue::Str("none".into()))]);
    assert_eq!(
        index.select("aten::gelu.default", &call(&tanh, &ones)).unwrap().name(),
        "gelu_tanh"
    );
    assert_eq!(index.select("aten::gelu.default", &call(&none, &ones)).unwrap().name(), "gelu");
}

#[test]
fn priority_then_specificity_then_name() {
    let low = kernel(BASE);
    let high = kernel(KernelRegistration { name: "high", priority: 5, ..BASE });
    let specific = kernel(KernelRegistration {
        name: "specific",
        guards: &[Guard::DivisibleBy { input: 0, dim: -1, by: 128 }],
        ..BASE
    });
    let index = Index::build(vec![Arc::new(low), Arc::new(specific), Arc::new(high)]).unwrap();
    let names: Vec<&str> = index.candidates("test::op.default").iter().map(|k| k.name()).collect();
    assert_eq!(names, ["high", "specific", "base"]);
    let s = sig(&["f32[2,256]"], &[]);
    assert_eq!(index.select("test::op.default", &call(&s, &[true])).unwrap().name(), "high");
}

#[test]
fn no_match_gives_each_candidate_and_its_failed_guard() {
    let a = kernel(KernelRegistration {
        name: "ranked",
        guards: &[Guard::Rank { input: 0, min: 2, max: 2 }],
        priority: 1,
        ..BASE
    });
    let b = kernel(KernelRegistration { name: "floaty", dtypes: &[DType::F16], ..BASE });
    let index = Index::build(vec![Arc::new(a), Arc::new(b)]).unwrap();
    let s = sig(&["f32[3]"], &[]);
    let err = index.select("test::op.default", &call(&s, &[true])).unwrap_err();
    let NoKernel::NoMatch { reasons, .. } = &err else { panic!("{err:?}") };
    assert_eq!(reasons.len(), 2);
    assert!(reasons[0].1.contains("rank 1, kernel needs 2"), "{reasons:?}");
    assert!(reasons[1].1.contains("dtype f32 not in [f16]"), "{reasons:?}");
    let s2 = sig(&["f32[3,4]"], &[]);
    let err = index.select("test::op.default", &call(&s2, &[false])).unwrap_err();
    assert!(err.to_string().contains("input 0 is not contiguous"), "{err}");
    let err = index.select("test::nope.default", &call(&s2, &[true])).unwrap_err();
    assert!(matches!(err, NoKernel::UnknownOp { ref known, .. } if known == &["test::op.default"]));
}

#[test]
fn equal_priority_overlap_is_ambiguous_naming_both() {
    let a = kernel(KernelRegistration { name: "alpha", ..BASE });
    let b = kernel(KernelRegistration { name: "beta", dtypes: &[DType::F32], ..BASE });
    let err = Index::build(vec![Arc::new(b), Arc::new(a)]).unwrap_err();
    assert_eq!(
        err,
        RegistryError::Ambiguous {
            op: "test::op.default".into(),
            first: "alpha".into(),
            second: "beta".into(),
            priority: 0
        }
    );
    assert!(err.to_string().contains("`alpha` and `beta`"));
}

#[test]
fn disjoint_guards_are_not_ambiguous() {
    const STATICS: &[StaticParam] = &[StaticParam::new("mode", StaticKind::Str)];
    let statics = STATICS;
    let a = kernel(KernelRegistration {
        name: "mode_a",
        statics,
        guards: &[
            Guard::StaticEq { name: "mode", value: "a" },
            Guard::Rank { input: 0, min: 1, max: 2 },
        ],
        ..BASE
    });
    let b = kernel(KernelRegistration {
        name: "mode_b",
        statics,
        guards: &[
            Guard::StaticEq { name: "mode", value: "b" },
            Guard::Rank { input: 0, min: 1, max: 2 },
        ],
        ..BASE
    });
    let c = kernel(KernelRegistration { name: "f16_only", dtypes: &[DType::F16], ..BASE });
    let d = kernel(KernelRegistration {
        name: "rank3",
        guards: &[Guard::Rank { input: 0, min: 3, max: 3 }],
        platforms: &[Platform::Tpu],
        ..BASE
    });
    Index::build([a, b, c, d].into_iter().map(Arc::new).collect()).unwrap();
}

#[test]
fn invalid_kernels_are_refused_with_their_name() {
    let bad_op = kernel(KernelRegistration { name: "bad", ops: &["not an op"], ..BASE });
    let err = Index::build(vec![Arc::new(bad_op)]).unwrap_err();
    assert!(err.to_string().contains("kernel `bad`: op `not an op`"), "{err}");
    let bad_sig = kernel(KernelRegistration { name: "badsig", canonical: &["f99[2]"], ..BASE });
    let err = Index::build(vec![Arc::new(bad_sig)]).unwrap_err();
    assert!(err.to_string().contains("unknown dtype `f99`"), "{err}");
    let orphan = kernel(KernelRegistration { name: "fwd", backward: Some("missing_bwd"), ..BASE });
    let err = Index::build(vec![Arc::new(orphan)]).unwrap_err();
    assert!(err.to_string().contains("backward kernel `missing_bwd` is not registered"), "{err}");
    let twice = || Arc::new(kernel(BASE));
    assert_eq!(
        Index::build(vec![twice(), twice()]).unwrap_err(),
        RegistryError::DuplicateName { name: "base".into() }
    );
}

#[test]
fn runtime_registration_is_atomic_and_removable() {
    let registry = Registry::new().unwrap();
    let before = registry.index().len();
    let ok =
        kernel(KernelRegistration { name: "rt_gelu", ops: &["aten::gelu"], priority: 10, ..BASE });
    registry.register(ok).unwrap();
    assert_eq!(registry.index().len(), before + 1);
    let s = sig(&["f32[4]"], &[("approximate", StaticValue::Str("none".into()))]);
    assert_eq!(registry.select("aten::gelu", &call(&s, &[true])).unwrap().name(), "rt_gelu");

    // Same priority as rt_gelu on the same op and dtypes: refused, registry unchanged.
    let clash =
        kernel(KernelRegistration { name: "rt_clash", ops: &["aten::gelu"], priority: 10, ..BASE });
    let err = registry.register(clash).unwrap_err();
    assert!(matches!(err, RegistryError::Ambiguous { .. }), "{err}");
    assert_eq!(registry.index().len(), before + 1);
    assert!(registry.index().kernel("rt_clash").is_none());

    // A name that is taken, by a linked-in kernel too.
    let dup = kernel(KernelRegistration { name: "gelu", ops: &["test::other"], ..BASE });
    assert!(matches!(registry.register(dup), Err(RegistryError::DuplicateName { .. })));

    registry.unregister("rt_gelu").unwrap();
    assert_eq!(registry.index().len(), before);
    assert_eq!(registry.select("aten::gelu", &call(&s, &[true])).unwrap().name(), "gelu");
    assert!(matches!(
        registry.unregister("gelu"),
        Err(RegistryError::NotRemovable { linked: true, .. })
    ));
    assert!(matches!(
        registry.unregister("rt_gelu"),
        Err(RegistryError::NotRemovable { linked: false, .. })
    ));
}

#[test]
fn op_names_normalise_to_their_default_overload() {
    assert_eq!(normalize_op("aten::gelu"), "aten::gelu.default");
    assert_eq!(normalize_op("aten::add.Tensor"), "aten::add.Tensor");
    assert_eq!(normalize_op("mylib::fused_norm"), "mylib::fused_norm.default");
}
