//! Kernel libraries loaded at run time: the example crate `my_kernels`, built as a cdylib,
//! loads, passes every check and serves calls with the right values; every way a load can fail
//! (a clash, a bad path, a file that is not a library, a missing symbol, an ABI or tpu-kernels
//! version mismatch, a description that is not JSON, a bad record, a panic, a canonical
//! signature that fails its CPU check) is an error naming the library and leaves the registry
//! exactly as it was.
//!
//! The libraries are dev-dependencies of this crate: cargo builds their cdylibs next to this
//! test binary (`target/<profile>/deps/`) before it runs, without linking them into it.

use std::path::PathBuf;
use std::sync::Arc;

use tpu_kernels::registration::{KernelSignature, Platform, StaticKind, StaticValue};
use tpu_kernels::{DType, TensorType};
use tpu_kernels_registry::cache::{CacheConfig, CompileCache};
use tpu_kernels_registry::library::{self, Checks, Loaded};
use tpu_kernels_registry::numerics::{Tolerance, assert_close};
use tpu_kernels_registry::pjrt::testing::{cpu_client_for_tests, libtpu_for_tests};
use tpu_kernels_registry::pjrt::{Client, Topology};
use tpu_kernels_registry::{
    CallMeta, DispatchError, Dispatcher, HostTensor, KernelSource, Registry, RegistryError,
};

/// The cdylib of crate `lib_name`, next to this test binary.
fn cdylib(lib_name: &str) -> PathBuf {
    let file =
        format!("{}{lib_name}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's folder");
    for dir in [Some(deps), deps.parent()].into_iter().flatten() {
        let path = dir.join(&file);
        if path.is_file() {
            return path;
        }
    }
    panic!(
        "{file} is not next to {}: it is a dev-dependency of tpu-kernels-registry, which cargo \
         builds before this test",
        exe.display()
    )
}

fn my_kernels() -> PathBuf {
    cdylib("my_kernels")
}

fn fixture() -> PathBuf {
    cdylib("tpuk_library_fixture")
}

/// A registry of its own per test (the kernels are leaked with it, as a process's are).
fn registry() -> &'static Registry {
    Box::leak(Box::new(Registry::new().expect("registry")))
}

struct Runtime {
    client: Client,
    cache: CompileCache,
    topology: Option<Topology>,
}

impl Runtime {
    fn cpu() -> Option<Runtime> {
        let client = cpu_client_for_tests(1)?;
        Some(Runtime {
            client,
            cache: CompileCache::new(CacheConfig::memory_only(64)),
            topology: None,
        })
    }

    fn with_tpu() -> Option<Runtime> {
        let mut rt = Runtime::cpu()?;
        let libtpu = libtpu_for_tests()?;
        rt.topology = Some(Topology::new(&libtpu, "v5e:1x1").expect("v5e topology"));
        Some(rt)
    }

    fn checks(&self) -> Checks<'_> {
        Checks { client: &self.client, cache: &self.cache, topology: self.topology.as_ref() }
    }
}

/// The registry's state, to show a failed load changed nothing.
fn state(r: &Registry) -> (usize, Vec<String>) {
    (r.generation(), r.index().kernels().map(|k| k.name().to_owned()).collect())
}

/// Loading fails, with a message naming the path and containing each of `needles`, and the
/// registry is as it was.
fn refused(
    r: &Registry,
    result: Result<Loaded, RegistryError>,
    path: &std::path::Path,
    needles: &[&str],
) {
    let before = state(r);
    let message = match result {
        Ok(loaded) => {
            panic!("loading {} should fail, it loaded {:?}", path.display(), loaded.kernels)
        }
        Err(e) => e.to_string(),
    };
    let shown = path.file_name().and_then(|n| n.to_str()).expect("a file name");
    assert!(message.contains(shown), "the error names the library: {message}");
    for needle in needles {
        assert!(message.contains(needle), "`{needle}` missing from: {message}");
    }
    assert_eq!(state(r), before, "a failed load changed the registry");
}

const OWN: [&str; 6] = [
    "ema_update",
    "gated_rms_norm",
    "linear_act",
    "scaled_silu",
    "scaled_silu_backward",
    "softcap",
];

#[test]
fn the_example_library_loads_passes_every_check_and_registers_only_its_own_kernels() {
    let Some(rt) = Runtime::with_tpu() else { return };
    let r = registry();
    let standard = r.index().len();
    let loaded = library::load(r, my_kernels(), &rt.checks()).expect("my_kernels loads");
    assert_eq!(loaded.kernels, OWN);
    assert!(!loaded.already_loaded);
    assert_eq!(loaded.library.crate_name(), "my_kernels");
    assert_eq!(r.index().len(), standard + OWN.len(), "the standard kernels are not duplicated");
    for check in &loaded.checks {
        let k = r.index().kernel(&check.kernel).cloned().expect("registered");
        assert!(k.runtime && matches!(k.source, KernelSource::Library(_)), "{k:?}");
        assert_eq!(check.signatures.len(), k.record.canonical.len(), "every canonical signature");
        for s in &check.signatures {
            assert_eq!(s.parsed, ["cpu", "tpu", "cuda"], "{}: {s:?}", check.kernel);
            assert!(s.cpu_run.as_deref().is_some_and(|c| c.contains("finite outputs")), "{s:?}");
            assert!(
                s.tpu_compile.as_deref().is_some_and(|c| c.contains("compiled for v5e:1x1")),
                "{s:?}"
            );
        }
    }
    // The record crossed as data: ops, statics with defaults, guards, backward, doc.
    let silu = r.index().kernel("scaled_silu").cloned().expect("scaled_silu");
    assert_eq!(silu.ops, ["my_kernels::scaled_silu.default"]);
    assert_eq!(silu.record.statics[0].name, "scale");
    let default = silu.record.statics[0].default.expect("a default");
    assert_eq!(StaticValue::parse(StaticKind::Float, default), Ok(StaticValue::Float(1.0)));
    assert_eq!(silu.record.backward, Some("scaled_silu_backward"));
    assert!(silu.record.doc.contains("SiLU with a scale"), "{}", silu.record.doc);
    let norm = r.index().kernel("gated_rms_norm").cloned().expect("gated_rms_norm");
    let sig = norm.record.parse_signature("f32[4,64], f32[4,64], f32[32]").expect("parses");
    let meta = CallMeta { sig: &sig, contiguous: &[true; 3], platform: Platform::Cpu };
    let why = norm.accepts(&meta).expect_err("the weight's size differs");
    assert!(why.contains("!="), "{why}");
    // `linear_act` is a tiled kernel: on a TPU its module is the Mosaic custom call (selected
    // first there), elsewhere its twin.
    let linear = r.index().kernel("linear_act").cloned().expect("linear_act");
    assert!(linear.is_tiled() && !linear.record.is_tiled(), "tiled, through the library");
    let sig = linear.record.parse_signature("f32[7,128], f32[128,128], f32[128]").expect("parses");
    let sig = linear.complete_statics(sig).expect("defaults");
    let tpu = linear.module_text(&sig, Platform::Tpu).expect("tpu text").text;
    assert!(tpu.contains("tpu_custom_call") && tpu.contains("serialization_format"), "{tpu}");
    let cpu = linear.module_text(&sig, Platform::Cpu).expect("cpu text").text;
    assert!(!cpu.contains("tpu_custom_call"), "{cpu}");
    // `softcap` has no output rule: its types come from the library, which builds the module.
    let softcap = r.index().kernel("softcap").cloned().expect("softcap");
    let sig = softcap.record.parse_signature("bf16[3,5]; cap=2.0").expect("parses");
    assert_eq!(softcap.output_types(&sig).expect("types"), [TensorType::new(DType::BF16, [3, 5])]);

    // The same path again: a no-op that lists the kernels.
    let before = state(r);
    let again = library::load(r, my_kernels(), &rt.checks()).expect("a second load");
    assert!(again.already_loaded && again.checks.is_empty());
    assert_eq!(again.kernels, OWN);
    assert_eq!(state(r), before);
    // A loaded library stays loaded: its kernels cannot be removed.
    let e = r.unregister("softcap").expect_err("a library kernel");
    assert!(matches!(e, RegistryError::LoadedFromLibrary { .. }), "{e}");
    assert!(e.to_string().contains("libmy_kernels"), "{e}");
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Values in [-3, 3), deterministic.
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 6.0 - 3.0) as f32
        })
        .collect()
}

fn call(
    d: &Dispatcher,
    op: &str,
    inputs: &[(TensorType, Vec<f32>)],
    statics: &[(&'static str, StaticValue)],
) -> Result<Vec<Vec<f32>>, Box<DispatchError>> {
    let raw: Vec<Vec<u8>> = inputs.iter().map(|(_, v)| bytes(v)).collect();
    let host: Vec<HostTensor<'_>> = inputs
        .iter()
        .zip(&raw)
        .map(|((ty, _), data)| HostTensor { ty, data, contiguous: true })
        .collect();
    let out = d.call(op, &host, statics).map_err(Box::new)?;
    Ok(out.iter().map(|b| b.to_vec::<f32>().expect("f32 output")).collect())
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

#[test]
fn library_kernels_serve_calls_with_the_values_of_their_formulas() {
    let Some(rt) = Runtime::cpu() else { return };
    let r = registry();
    library::load(r, my_kernels(), &rt.checks()).expect("my_kernels loads");
    let cache = Arc::new(CompileCache::new(CacheConfig::memory_only(64)));
    let d = Dispatcher::new(r, rt.client.clone(), cache).expect("dispatcher");
    let (rows, cols) = (5usize, 33usize);
    let ty = TensorType::new(DType::F32, [rows as u64, cols as u64]);
    let x = data(rows * cols, 1);
    let got = call(
        &d,
        "my_kernels::scaled_silu",
        &[(ty.clone(), x.clone())],
        &[("scale", StaticValue::Float(0.5))],
    )
    .expect("scaled_silu runs");
    let want: Vec<f64> = x.iter().map(|&v| 0.5 * f64::from(v) * sigmoid(f64::from(v))).collect();
    assert_close("scaled_silu", &got[0], &want, Tolerance::abs(1e-5));

    let g = data(rows * cols, 2);
    let got = call(
        &d,
        "my_kernels::scaled_silu_backward",
        &[(ty.clone(), g.clone()), (ty.clone(), x.clone())],
        &[],
    )
    .expect("scaled_silu_backward runs");
    let want: Vec<f64> = g
        .iter()
        .zip(&x)
        .map(|(&g, &v)| {
            let (g, v) = (f64::from(g), f64::from(v));
            let s = sigmoid(v);
            g * s * (1.0 + v * (1.0 - s))
        })
        .collect();
    assert_close("scaled_silu_backward", &got[0], &want, Tolerance::abs(1e-5));

    let gate = data(rows * cols, 3);
    let w = data(cols, 4);
    let wty = TensorType::new(DType::F32, [cols as u64]);
    let got = call(
        &d,
        "my_kernels::gated_rms_norm",
        &[(ty.clone(), x.clone()), (ty.clone(), gate.clone()), (wty, w.clone())],
        &[("eps", StaticValue::Float(1e-5))],
    )
    .expect("gated_rms_norm runs");
    let mut want = Vec::with_capacity(rows * cols);
    for row in 0..rows {
        let xs = &x[row * cols..(row + 1) * cols];
        let ms = xs.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (ms + 1e-5).sqrt();
        for c in 0..cols {
            let gv = f64::from(gate[row * cols + c]);
            want.push(f64::from(xs[c]) * rstd * f64::from(w[c]) * gv * sigmoid(gv));
        }
    }
    assert_close("gated_rms_norm", &got[0], &want, Tolerance::abs(1e-5));

    let got = call(
        &d,
        "my_kernels::softcap",
        &[(ty.clone(), x.clone())],
        &[("cap", StaticValue::Float(2.0))],
    )
    .expect("softcap runs");
    let want: Vec<f64> = x.iter().map(|&v| 2.0 * (f64::from(v) / 2.0).tanh()).collect();
    assert_close("softcap", &got[0], &want, Tolerance::abs(1e-5));

    // The kernel body's refusal crosses the boundary as a refusal: declined, not an error.
    let e = call(&d, "my_kernels::softcap", &[(ty, x)], &[("cap", StaticValue::Float(0.0))])
        .expect_err("cap = 0 is declined");
    let reason = &e.fallback().reason;
    assert_eq!(reason.category(), "unsupported", "{e}");
    assert!(!reason.is_error(), "{e}");
    assert!(e.to_string().contains("cap = 0 is not positive"), "{e}");
}

#[test]
fn a_second_library_whose_names_clash_registers_nothing() {
    let Some(rt) = Runtime::cpu() else { return };
    let r = registry();
    library::load(r, my_kernels(), &rt.checks()).expect("my_kernels loads");
    // The same library under another path is another library, whose names are taken.
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("libmy_kernels_copy.so");
    std::fs::copy(my_kernels(), &copy).expect("copy the library");
    let result = library::load(r, &copy, &rt.checks());
    refused(
        r,
        result,
        &copy,
        &["kernel `ema_update` clashes", "loaded from kernel library", "nothing was registered"],
    );
    // Into a registry where only a standard kernel's name is taken, nothing clashes.
    let other = registry();
    let loaded = library::load(other, &copy, &rt.checks()).expect("the copy loads elsewhere");
    assert_eq!(loaded.kernels, OWN);
}

#[test]
fn files_that_are_not_kernel_libraries_are_refused() {
    let Some(rt) = Runtime::cpu() else { return };
    let r = registry();
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("libnothing_here.so");
    refused(r, library::load(r, &missing, &rt.checks()), &missing, &["cannot open it"]);
    let text = dir.path().join("libnot_a_library.so");
    std::fs::write(&text, "this is not an ELF file\n").expect("write");
    refused(r, library::load(r, &text, &rt.checks()), &text, &["not a loadable shared library"]);
    refused(r, library::load(r, dir.path(), &rt.checks()), dir.path(), &["not a file"]);
    // A real shared library without the entry symbol (the fixture exports its tables under
    // other names).
    let fixture = fixture();
    refused(
        r,
        library::load(r, &fixture, &rt.checks()),
        &fixture,
        &["no `tpuk_library` symbol", "tpu_kernels::export_library!()"],
    );
    refused(
        r,
        library::load_entry(r, &fixture, "tpuk_fixture_null", &rt.checks()),
        &fixture,
        &["null table"],
    );
}

#[test]
fn an_abi_or_tpu_kernels_version_mismatch_is_refused_naming_both_versions() {
    let Some(rt) = Runtime::cpu() else { return };
    let r = registry();
    let fixture = fixture();
    let abi = tpu_kernels::library::ABI_VERSION;
    let version = tpu_kernels::library::VERSION;
    refused(
        r,
        library::load_entry(r, &fixture, "tpuk_fixture_future_abi", &rt.checks()),
        &fixture,
        &[
            &format!("ABI version {}", abi + 1),
            &format!("speaks version {abi}"),
            &format!("rebuild the library against tpu-kernels {version}"),
        ],
    );
    refused(
        r,
        library::load_entry(r, &fixture, "tpuk_fixture_old_version", &rt.checks()),
        &fixture,
        &["built with tpu-kernels 0.0.1-old", &format!("this host is tpu-kernels {version}")],
    );
}

#[test]
fn bad_descriptions_and_failing_kernels_register_nothing() {
    let Some(rt) = Runtime::cpu() else { return };
    let r = registry();
    let fixture = fixture();
    let load = |entry: &str| library::load_entry(r, &fixture, entry, &rt.checks());
    refused(r, load("tpuk_fixture_bad_json"), &fixture, &["description is not the JSON"]);
    refused(
        r,
        load("tpuk_fixture_unknown_dtype"),
        &fixture,
        &["kernel `nan_log`: bad record", "unknown dtype `f99`"],
    );
    refused(
        r,
        load("tpuk_fixture_missing_backward"),
        &fixture,
        &["kernel `nan_log`", "backward kernel `nan_log_backward` is not registered"],
    );
    refused(
        r,
        load("tpuk_fixture_describe_panics"),
        &fixture,
        &["describe failed", "the library panicked: describe exploded"],
    );
    refused(
        r,
        load("tpuk_fixture_emit_panics"),
        &fixture,
        &[
            "kernel `nan_log`, canonical signature `f32[8,128]`",
            "the library panicked: emit exploded",
        ],
    );
    refused(
        r,
        load("tpuk_fixture_nan"),
        &fixture,
        &["kernel `nan_log`, canonical signature `f32[8,128]`", "non-finite output values"],
    );
    // The library's own calls still answer with text, never a crash.
    let lib = library::Library::open_entry(&fixture, "tpuk_fixture_nan").expect("opens");
    let sig = KernelSignature { inputs: vec![TensorType::new(DType::F32, [2])], statics: vec![] };
    let e = lib.emit("no_such_kernel", &sig, Platform::Cpu).expect_err("unknown kernel");
    assert!(e.to_string().contains("has no kernel `no_such_kernel` (it has: nan_log)"), "{e}");
    let text = lib.emit("nan_log", &sig, Platform::Cpu).expect("emits");
    assert!(text.contains("stablehlo.log"), "{text}");
}
