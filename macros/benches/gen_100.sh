#!/usr/bin/env bash
# Measures the build time 100 `#[tpu_kernel]` functions add over 100 plain functions.
#
#   macros/benches/gen_100.sh [N]      (N kernels, default 100; run from anywhere)
#
# Generates two crates in a temporary directory that depend on tpu-kernels by path, builds
# their dependencies once (shared target directory), then times `cargo build` of each crate
# alone (after touching its lib.rs), three times, and prints the medians and the difference.
set -euo pipefail
n="${1:-100}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export CARGO_TARGET_DIR="$work/target"

gen() { # name annotated?
    local dir="$work/$1"
    mkdir -p "$dir/src"
    cat > "$dir/Cargo.toml" <<TOML
[package]
name = "$1"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
tpu-kernels = { path = "$root/kernel_lib" }

[workspace]
TOML
    cp "$root/rust-toolchain.toml" "$dir/"
    {
        echo "#![allow(dead_code)]"
        if [ "$2" = yes ]; then echo "use tpu_kernels::{Tensor, tpu_kernel};"; else echo "use tpu_kernels::Tensor;"; fi
        for i in $(seq 1 "$n"); do
            if [ "$2" = yes ]; then
                cat <<RS
/// Kernel $i.
#[tpu_kernel(op = "bench::k$i", dtypes = [f32, bf16], same_dtype, shapes(x = [.., D], w = [D]),
    defaults(eps = 1e-6), cache_key = [eps], output = same_as(x),
    canonical = ["f32[8,128], f32[128]"])]
pub fn k$i(x: Tensor, w: Tensor, eps: f64) -> Tensor {
    let ms = (x * x).mean(&[-1], true);
    x * (ms + eps).rsqrt() * w * $i.0
}
RS
            else
                cat <<RS
/// Kernel $i.
pub fn k$i<'b>(x: Tensor<'b>, w: Tensor<'b>, eps: f64) -> Tensor<'b> {
    let ms = (x * x).mean(&[-1], true);
    x * (ms + eps).rsqrt() * w * $i.0
}
RS
            fi
        done
    } > "$dir/src/lib.rs"
}

gen plain_kernels no
gen annotated_kernels yes
(cd "$work/plain_kernels" && cargo build -q)
(cd "$work/annotated_kernels" && cargo build -q)

time_build() { # dir -> seconds
    touch "$work/$1/src/lib.rs"
    local t0 t1
    t0=$(date +%s.%N)
    (cd "$work/$1" && cargo build -q)
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}
median() { sort -n | sed -n 2p; }

plain=$(for _ in 1 2 3; do time_build plain_kernels; done | median)
annotated=$(for _ in 1 2 3; do time_build annotated_kernels; done | median)
echo "$n plain functions:      ${plain}s (median of 3 debug builds of the crate alone)"
echo "$n annotated kernels:    ${annotated}s"
echo "added by #[tpu_kernel]:  $(echo "$annotated - $plain" | bc)s"
