//! The registered tiled kernels (`#[tpu_kernel(tiled(...))]`) at every canonical signature:
//! libtpu compiles both printed Mosaic forms for v5e and v6e; on the CPU the twin, the
//! interpreter of the printed text (either form) and the StableHLO kernel of the same op agree;
//! selection takes the tiled variant on a TPU and when forced, the StableHLO one on the CPU
//! otherwise; a signature a tiled plan refuses is declined; and a tiled kernel that breaks the
//! tiling rule or the VMEM budget is refused at registration, leaving the registry unchanged.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

use tpu_kernels::mosaic::{Form, IndexExpr, Semantics, TiledBuilder, custom_call_module_for};
use tpu_kernels::registration::{
    KernelRegistration, KernelSignature, OutputRule, OutputSpec, Platform,
};
use tpu_kernels::{BuildError, DType, TensorType};
use tpu_kernels_registry::check::buffer_as_f64;
use tpu_kernels_registry::dispatch::upload;
use tpu_kernels_registry::numerics::{Tolerance, assert_close};
use tpu_kernels_registry::pjrt::testing::{cpu_client_for_tests, libtpu_for_tests};
use tpu_kernels_registry::pjrt::{Buffer, Client, CompileOptions, Program, Topology};
use tpu_kernels_registry::{CallMeta, Index, Kernel, Registry, RegistryError};

fn tiled() -> Vec<&'static KernelRegistration> {
    let all: Vec<_> = tpu_kernels::registered().into_iter().filter(|k| k.is_tiled()).collect();
    let names: Vec<&str> = all.iter().map(|k| k.name).collect();
    for want in [
        "tiled_matmul_act",
        "tiled_matmul_bias_act",
        "tiled_rms_norm",
        "tiled_rms_norm_backward",
        "tiled_layer_norm",
        "tiled_layer_norm_backward",
        "tiled_softmax",
        "tiled_log_softmax",
        "tiled_softmax_backward",
        "tiled_log_softmax_backward",
        "tiled_cross_entropy",
        "tiled_cross_entropy_backward",
        "tiled_sdpa_flash",
        "tiled_sdpa_flash_masked",
        "tiled_sdpa_flash_masked_4d",
        "tiled_attention_4d",
        "tiled_sdpa_flash_backward",
    ] {
        assert!(names.contains(&want), "{want} is registered: {names:?}");
    }
    all
}

fn as_f64(ty: &TensorType, bytes: &[u8]) -> Vec<f64> {
    let size = ty.dtype.byte_size();
    bytes
        .chunks_exact(size)
        .map(|c| match ty.dtype {
            DType::F32 => f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::I32 => f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::I64 => i64::from_le_bytes(c.try_into().unwrap()) as f64,
            other => panic!("no test data for {other}"),
        })
        .collect()
}

fn run(client: &Client, text: &str, sig: &KernelSignature, data: &[Vec<u8>]) -> Vec<Vec<f64>> {
    let exe = client
        .compile(&Program::text(text.to_owned()), &CompileOptions::new())
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let buffers: Vec<Buffer> =
        sig.inputs.iter().zip(data).map(|(t, d)| upload(client, t, d).unwrap()).collect();
    let refs: Vec<&Buffer> = buffers.iter().collect();
    exe.execute(&refs).unwrap().iter().map(|b| buffer_as_f64(b).unwrap()).collect()
}

fn tolerance(sig: &KernelSignature) -> Tolerance {
    match sig.inputs[0].dtype {
        // One bf16 rounding apart (2^-7), plus f32 sums taken in another order.
        DType::BF16 => Tolerance::new(2e-2, 2.0f64.powi(-7)),
        _ => Tolerance::new(2e-4, 2e-5),
    }
}

#[test]
fn every_tiled_kernel_compiles_for_v5e_and_v6e_in_both_forms() {
    let Some(libtpu) = libtpu_for_tests() else { return };
    let index = Index::from_inventory().unwrap();
    let mut compiled = 0;
    for record in tiled() {
        let kernel = index.kernel(record.name).unwrap();
        for sig in record.canonical_signatures().unwrap() {
            let outputs = record.output_types(&sig).unwrap();
            let built = record.tiled_kernel(&sig).unwrap().unwrap();
            // The shipped form, as the registry gives it to a TPU client.
            let shipped = kernel.module_text(&sig, Platform::Tpu).unwrap().text.to_string();
            assert!(shipped.contains("tpu_custom_call"), "{}: {shipped}", record.name);
            assert!(shipped.contains("serialization_format"), "{}: shipped form", record.name);
            let readable = custom_call_module_for(&built, Form::Readable, &sig.inputs, &outputs);
            for topology in ["v5e:1x1", "v6e:1x1"] {
                let topo = Topology::new(&libtpu, topology).unwrap();
                for (form, text) in [("shipped", &shipped), ("readable", &readable)] {
                    let c = topo
                        .compile(&Program::text(text.clone()), &CompileOptions::new())
                        .unwrap_or_else(|e| {
                            panic!("{} {} on {topology} ({form}): {e}", record.name, sig.label())
                        });
                    assert!(c.serialized_size() > 1000);
                    compiled += 1;
                }
            }
        }
    }
    assert!(compiled >= 40, "{compiled} compiles");
}

#[test]
fn twin_interpreter_and_stablehlo_kernel_agree_on_the_cpu() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let index = Index::from_inventory().unwrap();
    for record in tiled() {
        let kernel = index.kernel(record.name).unwrap();
        for sig in record.canonical_signatures().unwrap() {
            let what = format!("{} {}", record.name, sig.label());
            // A backward that reads its forward's outputs gets the forward's own (`check_inputs`).
            let data = tpu_kernels_registry::check::check_inputs(&client, kernel, &sig).unwrap();
            let twin_text = kernel.module_text(&sig, Platform::Cpu).unwrap().text.to_string();
            assert!(!twin_text.contains("tpu_custom_call"), "{what}: the CPU variant is the twin");
            let twin = run(&client, &twin_text, &sig, &data);

            // The printed text, parsed back and run by the interpreter.
            let built = record.tiled_kernel(&sig).unwrap().unwrap();
            let outputs = record.output_types(&sig).unwrap();
            let f64s: Vec<Vec<f64>> =
                sig.inputs.iter().zip(&data).map(|(t, d)| as_f64(t, d)).collect();
            for form in [Form::Readable, Form::Shipped] {
                let text = custom_call_module_for(&built, form, &sig.inputs, &outputs);
                let interpreted = tpu_kernels::mosaic::interpret(&text, &f64s)
                    .unwrap_or_else(|e| panic!("{what} ({form:?}): interpreter: {e}"));
                assert_eq!(interpreted.len(), twin.len(), "{what} ({form:?})");
                for (a, b) in interpreted.iter().zip(&twin) {
                    let label = format!("{what}: interpreter ({form:?}) vs twin");
                    assert_close(&label, a, b, tolerance(&sig));
                }
            }

            // The StableHLO kernel of the same op, an independent implementation.
            let op = tpu_kernels_registry::normalize_op(record.ops[0]);
            let other = index
                .candidates(&op)
                .iter()
                .find(|k| !k.record.is_tiled() && k.record.accepts(&sig).is_ok())
                .unwrap_or_else(|| panic!("{what}: no StableHLO kernel of {op} takes it"));
            let text = other.module_text(&sig, Platform::Cpu).unwrap().text.to_string();
            let reference = run(&client, &text, &sig, &data);
            for (a, b) in twin.iter().zip(&reference) {
                assert_close(&format!("{what}: twin vs {}", other.name()), a, b, tolerance(&sig));
            }
        }
    }
}

fn select<'i>(index: &'i Index, op: &str, sig: &KernelSignature, platform: Platform) -> &'i str {
    let contiguous = vec![true; sig.inputs.len()];
    let call = CallMeta { sig, contiguous: &contiguous, platform };
    index.select(op, &call).unwrap().name()
}

#[test]
fn the_tiled_variant_is_selected_on_a_tpu_and_when_forced() {
    let index = Index::from_inventory().unwrap();
    let k = index.kernel("tiled_matmul_bias_act").unwrap();
    let sig = k
        .complete_statics(
            k.record.parse_signature("f32[256,1536], f32[1536,512], f32[512]").unwrap(),
        )
        .unwrap();
    let op = "tpuk::matmul_bias_act.default";
    assert_eq!(select(&index, op, &sig, Platform::Tpu), "tiled_matmul_bias_act");
    assert_eq!(select(&index, op, &sig, Platform::Cpu), "matmul_bias_act");
    let forced = Index::from_inventory().unwrap().with_force_tiled(true);
    assert_eq!(select(&forced, op, &sig, Platform::Cpu), "tiled_matmul_bias_act");
    let rms = index.kernel("tiled_rms_norm").unwrap();
    let sig = rms
        .complete_statics(rms.record.parse_signature("bf16[2,128,512], bf16[512]").unwrap())
        .unwrap();
    assert_eq!(select(&index, "tpuk::rms_norm.default", &sig, Platform::Tpu), "tiled_rms_norm");
    assert_eq!(select(&forced, "tpuk::rms_norm.default", &sig, Platform::Cpu), "tiled_rms_norm");
    assert_eq!(select(&index, "tpuk::rms_norm.default", &sig, Platform::Cpu), "rms_norm");
}

#[test]
fn a_signature_the_plan_refuses_is_declined_and_another_kernel_takes_it() {
    let forced = Index::from_inventory().unwrap().with_force_tiled(true);
    let k = forced.kernel("tiled_matmul_act").unwrap();
    // K = 1000: no multiple of 128 up to 512 divides it.
    let sig = k
        .complete_statics(k.record.parse_signature("f32[8,1000], f32[1000,128]").unwrap())
        .unwrap();
    let why = k.record.accepts(&sig).unwrap_err();
    assert!(why.contains("divides 1000"), "{why}");
    let e = k.record.tiled_kernel(&sig).unwrap().unwrap_err();
    assert_eq!(e.kind, tpu_kernels::ErrorKind::Unsupported, "{e}");
    assert_eq!(select(&forced, "tpuk::matmul_act.default", &sig, Platform::Cpu), "matmul_act");
    // Blocks over v5e's scoped VMEM: rows of 2^20 f32 are 4 MiB each, 8 rows in and out,
    // double-buffered, are 256 MiB.
    let rms = forced.kernel("tiled_rms_norm").unwrap();
    let sig = rms
        .complete_statics(rms.record.parse_signature("f32[8,1048576], f32[1048576]").unwrap())
        .unwrap();
    let why = rms.record.accepts(&sig).unwrap_err();
    assert!(why.contains("VMEM"), "{why}");
    assert_eq!(select(&forced, "tpuk::rms_norm.default", &sig, Platform::Cpu), "rms_norm");
}

/// `o = x` over `[16, 256]` in blocks of `block`.
fn copy_kernel(
    name: &str,
    block: [u64; 2],
    sig: &KernelSignature,
) -> Result<tpu_kernels::mosaic::Kernel, BuildError> {
    let t = sig.inputs[0].clone();
    let dims = t.shape.static_dims().unwrap();
    let grid = [dims[0] / block[0], dims[1].div_ceil(block[1])];
    let mut k = TiledBuilder::new(name, &grid, &[Semantics::Parallel; 2])?;
    let map = [IndexExpr::Grid(0), IndexExpr::Grid(1)];
    let x = k.input(t.clone(), &block, &map)?;
    let o = k.output(t, &block, &map)?;
    let v = k.load(x)?;
    k.store(o, v)?;
    k.finish()
}

fn mis_tiled(sig: &KernelSignature) -> Result<tpu_kernels::mosaic::Kernel, BuildError> {
    copy_kernel("mis_tiled_copy", [8, 100], sig)
}

fn too_big(sig: &KernelSignature) -> Result<tpu_kernels::mosaic::Kernel, BuildError> {
    copy_kernel("vmem_hog_copy", [2048, 2048], sig)
}

fn any_plan(_: &KernelSignature) -> Result<(), String> {
    Ok(())
}

#[test]
fn a_mis_tiled_or_vmem_overflowing_kernel_is_refused_and_the_registry_is_unchanged() {
    let registry = Registry::new().unwrap();
    let before: Vec<&str> = registry.index().kernels().map(|k| k.name()).collect();
    let generation = registry.generation();
    for (name, build, canonical, needle) in [
        ("mis_tiled_copy", mis_tiled as fn(&KernelSignature) -> _, "f32[16,200]", "tiling rule"),
        ("vmem_hog_copy", too_big, "f32[2048,2048]", "VMEM"),
    ] {
        let record = KernelRegistration::tiled(name, build, any_plan)
            .ops(&["mylib::copy"])
            .inputs(&["x"])
            .output(OutputRule::Specs(&[OutputSpec::SameAs(0)]))
            .canonical(Box::leak(Box::new([canonical])));
        let kernel = Kernel::from_static(Box::leak(Box::new(record)));
        let err = registry.register(kernel).unwrap_err();
        let RegistryError::InvalidKernel { name: n, message } = &err else { panic!("{err:?}") };
        assert_eq!(n, name);
        assert!(message.contains(needle), "{name}: {message}");
        let after: Vec<&str> = registry.index().kernels().map(|k| k.name()).collect();
        assert_eq!(before, after, "{name}: the registry is unchanged");
        assert_eq!(registry.generation(), generation);
    }
}
