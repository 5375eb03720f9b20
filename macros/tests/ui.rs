//! Compile-fail tests, one folder per error family; each case's `.stderr` is the expected
//! output (regenerate with `TRYBUILD=overwrite cargo test -p tpu-kernels-macros --test ui`,
//! then review). They depend on the pinned toolchain (rust-toolchain.toml).

use std::path::PathBuf;

/// trybuild compiles the cases in its own project under `<target>/tests/trybuild/`, whose
/// manifest directory is where `import(...)` paths resolve: the fixtures go there too.
fn copy_fixtures() {
    let exe = std::env::current_exe().expect("test executable path");
    // <target>/<profile>/deps/ui-<hash>
    let target = exe.ancestors().nth(3).expect("target directory").to_path_buf();
    let project = target.join("tests/trybuild/tpu-kernels-macros/tests/fixtures");
    std::fs::create_dir_all(&project).expect("create the trybuild fixture directory");
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for entry in std::fs::read_dir(fixtures).expect("fixtures") {
        let path = entry.expect("fixture").path();
        std::fs::copy(&path, project.join(path.file_name().expect("file name")))
            .expect("copy a fixture");
    }
}

#[test]
fn ui() {
    copy_fixtures();
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    for family in [
        "keys",
        "op_names",
        "dtypes",
        "shapes",
        "statics",
        "signature",
        "import",
        "output",
        "tiled",
    ] {
        t.compile_fail(format!("tests/ui/{family}/*.rs"));
    }
}
