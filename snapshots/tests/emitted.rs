//! Snapshots of emitted StableHLO: every registered kernel at each of its canonical signatures,
//! and the op-coverage modules; for tiled kernels also both printed Mosaic forms (the readable
//! one and the shipped `stable_mosaic` serialization) under `mosaic/`. Cases come from
//! iterating the registry, so a new kernel cannot escape its snapshot; an orphaned snapshot file
//! fails `no_orphaned_snapshots`.

use std::collections::BTreeSet;
use std::path::Path;

use tpu_kernels::registered;

const SNAPSHOT_DIR: &str = "hlo";
const MOSAIC_DIR: &str = "mosaic";

fn settings() -> insta::Settings {
    settings_in(SNAPSHOT_DIR)
}

fn settings_in(dir: &str) -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    // Relative to this file: snapshots/hlo/ or snapshots/mosaic/.
    s.set_snapshot_path(format!("../{dir}"));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    s
}

/// Every Mosaic snapshot name: each tiled kernel at each canonical signature, in both forms.
fn expected_mosaic_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for k in registered().into_iter().filter(|k| k.is_tiled()) {
        for sig in k.canonical_signatures().expect("canonical signatures parse") {
            for form in ["readable", "shipped"] {
                names.insert(format!("{}@{}.{form}", k.name, sig.label()));
            }
        }
    }
    names
}

#[test]
fn every_tiled_kernel_in_both_mosaic_forms() {
    let tiled: Vec<_> = registered().into_iter().filter(|k| k.is_tiled()).collect();
    assert!(tiled.len() >= 3, "the standard tiled kernels are registered: {tiled:?}");
    settings_in(MOSAIC_DIR).bind(|| {
        for k in tiled {
            for sig in k.canonical_signatures().unwrap() {
                let kernel = k.tiled_kernel(&sig).unwrap().unwrap_or_else(|e| panic!("{e}"));
                let label = format!("{}@{}", k.name, sig.label());
                insta::assert_snapshot!(
                    format!("{label}.readable"),
                    tpu_kernels::mosaic::print_kernel(&kernel)
                );
                insta::assert_snapshot!(
                    format!("{label}.shipped"),
                    tpu_kernels::mosaic::print_kernel_serialized(&kernel)
                );
            }
        }
    });
}

/// Every snapshot name the tests below write, derived from the registry and the op list.
fn expected_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for k in registered() {
        for sig in k.canonical_signatures().expect("canonical signatures parse") {
            assert!(names.insert(format!("{}@{}", k.name, sig.label())), "duplicate case");
        }
    }
    for (name, _) in tpu_kernels_snapshots::op_coverage() {
        names.insert(format!("ops@{name}"));
    }
    names
}

#[test]
fn every_registered_kernel_at_every_canonical_signature() {
    let kernels = registered();
    assert!(!kernels.is_empty(), "no kernels registered");
    settings().bind(|| {
        for k in kernels {
            let sigs = k.canonical_signatures().unwrap_or_else(|e| panic!("{}: {e}", k.name));
            for sig in sigs {
                k.accepts(&sig)
                    .unwrap_or_else(|e| panic!("{} rejects its own {sig:?}: {e}", k.name));
                let text = k.emit(&sig).unwrap_or_else(|e| panic!("{e}")).to_text();
                insta::assert_snapshot!(format!("{}@{}", k.name, sig.label()), text);
            }
        }
    });
}

#[test]
fn every_op_coverage_module() {
    settings().bind(|| {
        for (name, module) in tpu_kernels_snapshots::op_coverage() {
            let text = module.unwrap_or_else(|e| panic!("{name}: {e}")).to_text();
            insta::assert_snapshot!(format!("ops@{name}"), text);
        }
    });
}

#[test]
fn canonical_signatures_cover_f32_bf16_and_odd_sizes() {
    for k in registered() {
        let sigs = k.canonical_signatures().unwrap();
        let first: Vec<_> = sigs.iter().map(|s| &s.inputs[0]).collect();
        assert!(first.iter().any(|t| t.dtype == tpu_kernels::DType::F32), "{}: no f32", k.name);
        // bf16 wherever the kernel takes it (a kernel may be f32-only, declining the rest).
        let takes_bf16 = k.dtypes.contains(&tpu_kernels::DType::BF16);
        let has_bf16 = first.iter().any(|t| t.dtype == tpu_kernels::DType::BF16);
        assert!(has_bf16 || !takes_bf16, "{}: no bf16", k.name);
        // Any input of any canonical signature (a kernel's first input may be a scalar).
        let odd = sigs
            .iter()
            .flat_map(|s| &s.inputs)
            .any(|t| t.shape.static_dims().unwrap_or_default().iter().any(|d| d % 2 == 1));
        assert!(odd, "{}: no odd-sized shape", k.name);
    }
}

#[test]
fn emission_is_byte_for_byte_deterministic() {
    for k in registered() {
        for sig in k.canonical_signatures().unwrap() {
            let a = k.emit(&sig).unwrap().to_text();
            let b = k.emit(&sig).unwrap().to_text();
            assert_eq!(a, b, "{} emits differently twice", k.name);
        }
    }
}

#[test]
fn no_orphaned_snapshots() {
    check_orphans(SNAPSHOT_DIR, expected_names());
    check_orphans(MOSAIC_DIR, expected_mosaic_names());
}

fn check_orphans(dir: &str, expected: BTreeSet<String>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("snapshot directory exists") {
        let name =
            entry.expect("a readable directory entry").file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".snap") {
            found.insert(stem.to_owned());
        } else if !name.ends_with(".snap.new") {
            panic!("unexpected file {name} in {}", dir.display());
        }
    }
    let orphans: Vec<_> = found.difference(&expected).collect();
    assert!(orphans.is_empty(), "snapshots with no case (delete them): {orphans:?}");
    let missing: Vec<_> = expected.difference(&found).collect();
    assert!(
        missing.is_empty(),
        "cases with no snapshot (run INSTA_UPDATE=always cargo test -p tpu-kernels-snapshots, review, commit): {missing:?}"
    );
}
