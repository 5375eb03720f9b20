//! A kernel library: a crate of `#[tpu_kernel]`s that PyTorch loads at run time, with no
//! rebuild of tpu-kernels.
//!
//! Build it as a `cdylib` (`cargo build --release -p my_kernels`) and load the file:
//!
//! ```text
//! import tpu_kernels, torch
//! tpu_kernels.load_library("target/release/libmy_kernels.so")
//! y = torch.ops.my_kernels.scaled_silu(x, scale=0.5)
//! ```
//!
//! Every kernel binds an op of the crate's own namespace (`my_kernels::...`), which loading
//! defines as a `torch.library` op. The one line that makes the crate a library is
//! [`tpu_kernels::export_library!`] at the bottom of this file; the library describes only this
//! crate's kernels (`ema_update`, `gated_rms_norm`, `linear_act`, `scaled_silu`,
//! `scaled_silu_backward`, `softcap`), not the standard ones it links in
//! (`registry/tests/library.rs` loads the built file and checks it). `linear_act` is a tiled TPU
//! kernel: a grid of VMEM blocks, an f32 accumulator over the K axis and a bias + activation
//! epilogue, whose TPU variant is a Mosaic `tpu_custom_call` and whose CPU variant is its twin.
//! `ema_update` updates its first argument in place (`mutates`).

use tpu_kernels::kernels::tiled::{accumulate, activate};
use tpu_kernels::mosaic::dsl::{Block, Tiled};
use tpu_kernels::{BuildError, DType, ErrorKind, Tensor, tpu_kernel};

/// The type arithmetic happens in: f32 for 16-bit inputs.
fn upcast(x: Tensor<'_>) -> Tensor<'_> {
    match x.dtype() {
        DType::BF16 | DType::F16 => x.cast(DType::F32),
        _ => x,
    }
}

/// A call the kernel body does not take: declined (the caller falls back), not a failure.
fn declined(kernel: &'static str, message: String) -> BuildError {
    BuildError { kernel: kernel.to_owned(), op: kernel, kind: ErrorKind::Unsupported, message }
}

/// `scale * x * sigmoid(x)`: SiLU with a scale, computed in f32 for 16-bit inputs.
#[tpu_kernel(
    op = "my_kernels::scaled_silu",
    dtypes = [f32, bf16, f16],
    defaults(scale = 1.0),
    cache_key = [scale],
    output = same_as(x),
    backward = scaled_silu_backward,
    canonical = ["f32[8,128]", "bf16[4,256]; scale=0.5", "f32[3,7,33]; scale=2.0"],
)]
pub fn scaled_silu(x: Tensor, scale: f64) -> Tensor {
    let xf = upcast(x);
    (xf * xf.sigmoid() * scale).cast(x.dtype())
}

/// The gradient of [`scaled_silu()`] for `grad`, the gradient of its output:
/// `grad * scale * s * (1 + x * (1 - s))` with `s = sigmoid(x)`.
#[tpu_kernel(
    op = "my_kernels::scaled_silu_backward",
    dtypes = [f32, bf16, f16],
    same_dtype,
    defaults(scale = 1.0),
    cache_key = [scale],
    output = same_as(x),
    canonical = [
        "f32[8,128], f32[8,128]",
        "bf16[4,256], bf16[4,256]; scale=0.5",
        "f32[3,7,33], f32[3,7,33]; scale=2.0",
    ],
)]
pub fn scaled_silu_backward(grad: Tensor, x: Tensor, scale: f64) -> Result<Tensor, BuildError> {
    if grad.shape() != x.shape() {
        let message = format!("grad {} and x {} differ in shape", grad.ty(), x.ty());
        return Err(declined("scaled_silu_backward", message));
    }
    let (g, xf) = (upcast(grad), upcast(x));
    let s = xf.sigmoid();
    Ok((g * s * ((1.0 - s) * xf + 1.0) * scale).cast(x.dtype()))
}

/// `rms_norm(x) * weight * silu(gate)` over the last dimension: the gated RMSNorm of Mamba-2's
/// output, one fused op with a static `eps`.
#[tpu_kernel(
    op = "my_kernels::gated_rms_norm",
    dtypes = [f32, bf16, f16],
    same_dtype,
    shapes(x = [.., D], gate = [.., D], weight = [D]),
    defaults(eps = 1e-6),
    cache_key = [eps],
    output = same_as(x),
    canonical = [
        "f32[8,128], f32[8,128], f32[128]",
        "bf16[4,256], bf16[4,256], bf16[256]; eps=1e-5",
        "f32[3,5,33], f32[3,5,33], f32[33]",
    ],
)]
pub fn gated_rms_norm(
    x: Tensor,
    gate: Tensor,
    weight: Tensor,
    eps: f64,
) -> Result<Tensor, BuildError> {
    if x.shape() != gate.shape() {
        let message = format!("x {} and gate {} differ in shape", x.ty(), gate.ty());
        return Err(declined("gated_rms_norm", message));
    }
    let (xf, gf) = (upcast(x), upcast(gate));
    let normed = xf * ((xf * xf).mean(&[-1], true) + eps).rsqrt();
    Ok((normed * upcast(weight) * gf * gf.sigmoid()).cast(x.dtype()))
}

/// `cap * tanh(x / cap)`: Gemma-style logit soft-capping. `cap` must be positive (the body
/// declines any other value). No output rule: the host asks the library, which builds the
/// module and reads its result types.
#[tpu_kernel(
    op = "my_kernels::softcap",
    dtypes = [f32, bf16, f16],
    defaults(cap = 30.0),
    cache_key = [cap],
    canonical = ["f32[8,128]", "bf16[4,256]; cap=50.0", "f32[3,7,33]; cap=1.5"],
)]
pub fn softcap(x: Tensor, cap: f64) -> Result<Tensor, BuildError> {
    if cap.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return Err(declined("softcap", format!("cap = {cap} is not positive")));
    }
    let xf = upcast(x);
    Ok(((xf * (1.0 / cap)).tanh() * cap).cast(x.dtype()))
}

/// `avg = decay * avg + (1 - decay) * x`, in place: an exponential moving average (of weights, of
/// statistics), computed in f32 for 16-bit inputs. `mutates = [avg]`: the op takes `avg` as
/// `Tensor(a!)`, returns nothing, and writes the new average into `avg`'s own memory.
#[tpu_kernel(
    op = "my_kernels::ema_update",
    dtypes = [f32, bf16, f16],
    same_dtype,
    shapes(avg = [..], x = [..]),
    defaults(decay = 0.99),
    cache_key = [decay],
    output = same_as(avg),
    mutates = [avg],
    canonical = ["f32[8,128], f32[8,128]", "bf16[4,256], bf16[4,256]; decay=0.9"],
)]
pub fn ema_update(avg: Tensor, x: Tensor, decay: f64) -> Result<Tensor, BuildError> {
    if avg.shape() != x.shape() {
        let message = format!("avg {} and x {} differ in shape", avg.ty(), x.ty());
        return Err(declined("ema_update", message));
    }
    Ok((upcast(avg) * decay + upcast(x) * (1.0 - decay)).cast(avg.dtype()))
}

/// `act(x @ w + b)` as a tiled TPU kernel: blocks of at most 256 x 256 outputs, K in steps of
/// at most 512 accumulated in an f32 VMEM scratch on the MXU, the bias and the activation
/// (`none`, `relu`, `silu`, `gelu_tanh`) applied at the last K step.
#[tpu_kernel(
    op = "my_kernels::linear_act",
    dtypes = [f32, bf16],
    same_dtype,
    shapes(x = [M, K], w = [K, N], b = [N]),
    defaults(activation = "none"),
    cache_key = [activation],
    output = like(x, [M, N]),
    tiled(
        tiles(bm = tile(M, 256, 8), bn = tile(N, 256, 128), bk = tile(K, 512, 128)),
        grid = [M / bm, N / bn, K / bk],
        semantics = [parallel, parallel, arbitrary],
        inputs(
            x = block([bm, bk], |i, j, k| (i, k)),
            w = block([bk, bn], |i, j, k| (k, j)),
            b = block([1, bn], |i, j, k| (0, j)).view([1, N]),
        ),
        outputs(o = block([bm, bn], |i, j, k| (i, j))),
        scratch(acc = vmem(f32, [bm, bn])),
    ),
    canonical = [
        "f32[256,1024], f32[1024,256], f32[256]; activation=gelu_tanh",
        "bf16[128,512], bf16[512,384], bf16[384]; activation=silu",
        "f32[7,128], f32[128,128], f32[128]; activation=relu",
    ],
)]
pub fn linear_act(k: &Tiled, x: Block, w: Block, b: Block, o: Block, acc: Block, activation: &str) {
    // The K loop and the epilogue are the standard tiled matmul's, reused from tpu-kernels.
    accumulate(k, x, w, acc);
    k.when(k.program_id(2).eq(k.num_programs(2) - 1), || {
        let y = acc.load() + b.load().cast(DType::F32);
        o.store(activate(k, y, activation).cast(o.dtype()));
    });
}

tpu_kernels::export_library!();
