//! Compiles the C++ shim against the PyTorch it will run with (its C++ interfaces have no stable
//! ABI): the headers, the `_GLIBCXX_USE_CXX11_ABI` setting and the libraries come from the
//! `torch` package of the Python that pyo3 builds for (`PYO3_PYTHON`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/shim.cpp");
    println!("cargo:rerun-if-changed=src/tpuk_device.h");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let probe = "import os, torch; print(os.path.dirname(torch.__file__)); \
                 print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__)";
    // Without device autoloading: `import torch` would load this very device (the installed
    // package's `torch.backends` entry point), which may be stale or missing while it builds.
    let out = Command::new(&python)
        .args(["-c", probe])
        .env("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        .env("TPUK_DEVICE", "0")
        .output();
    let text = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => fail(&python, &String::from_utf8_lossy(&o.stderr)),
        Err(e) => fail(&python, &e.to_string()),
    };
    let mut lines = text.lines();
    let (Some(torch), Some(abi), Some(version)) = (lines.next(), lines.next(), lines.next()) else {
        fail(&python, &format!("unexpected answer: {text}"))
    };
    let torch = PathBuf::from(torch);
    let include = torch.join("include");
    let lib = torch.join("lib");
    println!("cargo:rerun-if-changed={}", include.join("torch/version.h").display());
    println!("cargo:rustc-env=TPUK_TORCH_VERSION={version}");
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .file("src/shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", abi)
        // PyTorch's headers are not warning-clean under -Wextra.
        .warnings(false)
        .flag_if_supported("-Wno-deprecated-declarations")
        .compile("tpuk_device_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    // Loadable before `import torch` too: the libraries are found next to torch.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,{}", lib.display());
}

fn fail(python: &str, why: &str) -> ! {
    panic!(
        "tpu-kernels-device compiles its C++ shim against PyTorch's headers, found through \
         `{python} -c 'import torch'`, which failed: {why}\nSet PYO3_PYTHON to a Python with \
         torch installed (`eval \"$(scripts/dev env)\"` after `scripts/dev setup`)."
    )
}
