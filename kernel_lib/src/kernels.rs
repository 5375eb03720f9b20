//! The standard kernels, written with the builder and registered through
//! [`KernelRegistration`].
//!
//! Every kernel computes in f32 when given a 16-bit float (bf16, f16) and rounds once at the end,
//! as PyTorch's CPU kernels do; reductions accumulate in f32 too.

use crate::builder::Tensor;
use crate::error::BuildError;
use crate::ir::Module;
use crate::registration::{
    Guard, KernelRegistration, KernelSignature, StaticKind, StaticParam, build_with,
};
use crate::types::DType;

const FLOATS: &[DType] = &[DType::F32, DType::BF16, DType::F16];

/// The type arithmetic happens in for inputs of `dtype`.
fn compute_type(dtype: DType) -> DType {
    match dtype {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    }
}

fn upcast(x: Tensor<'_>) -> Tensor<'_> {
    x.cast(compute_type(x.dtype()))
}

fn static_str<'s>(sig: &'s KernelSignature, name: &str) -> &'s str {
    sig.str(name).unwrap_or_default()
}

// ----- activations -----

/// `x * Φ(x)` with the exact normal CDF: `0.5 x (1 + erf(x / √2))`.
pub fn gelu_exact(x: Tensor<'_>) -> Tensor<'_> {
    let xf = upcast(x);
    let cdf = (xf * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0;
    (xf * cdf * 0.5).cast(x.dtype())
}

/// The tanh approximation: `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
pub fn gelu_tanh(x: Tensor<'_>) -> Tensor<'_> {
    let xf = upcast(x);
    let sqrt_2_over_pi = (2.0 / std::f64::consts::PI).sqrt();
    let inner = (xf + xf * xf * xf * 0.044715) * sqrt_2_over_pi;
    (xf * (inner.tanh() + 1.0) * 0.5).cast(x.dtype())
}

/// `x * sigmoid(x)`.
pub fn silu(x: Tensor<'_>) -> Tensor<'_> {
    let xf = upcast(x);
    (xf * xf.sigmoid()).cast(x.dtype())
}

fn build_gelu(sig: &KernelSignature) -> Result<Module, BuildError> {
    build_with("gelu", sig, |_, a| Ok(vec![gelu_exact(a[0])]))
}

fn build_gelu_tanh(sig: &KernelSignature) -> Result<Module, BuildError> {
    build_with("gelu_tanh", sig, |_, a| Ok(vec![gelu_tanh(a[0])]))
}

fn build_silu(sig: &KernelSignature) -> Result<Module, BuildError> {
    build_with("silu", sig, |_, a| Ok(vec![silu(a[0])]))
}

const APPROXIMATE_NONE: StaticParam =
    StaticParam::new("approximate", StaticKind::Str).default("none");
const APPROXIMATE_TANH: StaticParam =
    StaticParam::new("approximate", StaticKind::Str).default("tanh");
const ELEMENTWISE_SHAPES: &[&str] = &["f32[8,128]", "bf16[4,256]", "f32[3,7,33]", "f16[1,5]"];

inventory::submit! {
    KernelRegistration::new("gelu", build_gelu)
        .ops(&["aten::gelu"])
        .inputs(&["self"])
        .statics(&[APPROXIMATE_NONE])
        .guards(&[Guard::StaticEq { name: "approximate", value: "none" }])
        .dtypes(FLOATS)
        .canonical(ELEMENTWISE_SHAPES)
        .doc("GELU with the exact normal CDF (erf).")
}

inventory::submit! {
    KernelRegistration::new("gelu_tanh", build_gelu_tanh)
        .ops(&["aten::gelu"])
        .inputs(&["self"])
        .statics(&[APPROXIMATE_TANH])
        .guards(&[Guard::StaticEq { name: "approximate", value: "tanh" }])
        .dtypes(FLOATS)
        .canonical(ELEMENTWISE_SHAPES)
        .doc("GELU, tanh approximation.")
}

inventory::submit! {
    KernelRegistration::new("silu", build_silu)
        .ops(&["aten::silu"])
        .inputs(&["self"])
        .dtypes(FLOATS)
        .canonical(ELEMENTWISE_SHAPES)
        .doc("SiLU (swish): x * sigmoid(x).")
}

// ----- normalisation -----

/// `x / sqrt(mean(x², -1) + eps) * weight` over the last dimension.
pub fn rms_norm<'b>(x: Tensor<'b>, weight: Tensor<'b>, eps: f64) -> Tensor<'b> {
    let xf = upcast(x);
    let ms = (xf * xf).mean(&[-1], true);
    let normed = xf * (ms + eps).rsqrt();
    (normed * upcast(weight)).cast(x.dtype())
}

/// Layer norm over the last dimension; returns `(out, mean, rstd)` as `aten::native_layer_norm`
/// does (mean and rstd keep the normalised dimension as size 1).
pub fn layer_norm<'b>(
    x: Tensor<'b>,
    weight: Tensor<'b>,
    bias: Tensor<'b>,
    eps: f64,
) -> (Tensor<'b>, Tensor<'b>, Tensor<'b>) {
    let xf = upcast(x);
    let mean = xf.mean(&[-1], true);
    let centered = xf - mean;
    let var = (centered * centered).mean(&[-1], true);
    let rstd = (var + eps).rsqrt();
    let out = centered * rstd * upcast(weight) + upcast(bias);
    (out.cast(x.dtype()), mean.cast(x.dtype()), rstd.cast(x.dtype()))
}

fn build_rms_norm(sig: &KernelSignature) -> Result<Module, BuildError> {
    let eps = sig.float("eps").unwrap_or(1e-6);
    build_with("rms_norm", sig, |_, a| Ok(vec![rms_norm(a[0], a[1], eps)]))
}

fn build_layer_norm(sig: &KernelSignature) -> Result<Module, BuildError> {
    let eps = sig.float("eps").unwrap_or(1e-5);
    build_with("layer_norm", sig, |_, a| {
        let (out, mean, rstd) = layer_norm(a[0], a[1], a[2], eps);
        Ok(vec![out, mean, rstd])
    })
}

const LAST_DIM_MATCHES_WEIGHT: &[Guard] = &[
    Guard::SameDType,
    Guard::Rank { input: 0, min: 1, max: 8 },
    Guard::Rank { input: 1, min: 1, max: 1 },
    Guard::SameDim { a: (0, -1), b: (1, 0) },
];

inventory::submit! {
    KernelRegistration::new("rms_norm", build_rms_norm)
        .ops(&["tpuk::rms_norm"])
        .inputs(&["x", "weight"])
        .statics(&[StaticParam::new("eps", StaticKind::Float).default("1e-6")])
        .guards(LAST_DIM_MATCHES_WEIGHT)
        .dtypes(FLOATS)
        .canonical(&["f32[8,128], f32[128]", "bf16[4,256], bf16[256]", "f32[3,5,33], f32[33]; eps=1e-5"])
        .doc("RMSNorm over the last dimension, scaled by a weight.")
}

inventory::submit! {
    KernelRegistration::new("layer_norm", build_layer_norm)
        .ops(&["aten::native_layer_norm"])
        .inputs(&["input", "weight", "bias"])
        .statics(&[StaticParam::new("eps", StaticKind::Float).default("1e-5")])
        .guards(&[
            Guard::SameDType,
            Guard::Rank { input: 0, min: 1, max: 8 },
            Guard::Rank { input: 1, min: 1, max: 1 },
            Guard::SameDim { a: (0, -1), b: (1, 0) },
            Guard::SameDim { a: (1, 0), b: (2, 0) },
        ])
        .dtypes(FLOATS)
        .canonical(&[
            "f32[8,128], f32[128], f32[128]",
            "bf16[4,256], bf16[256], bf16[256]",
            "f32[3,5,33], f32[33], f32[33]",
        ])
        .doc("Layer norm over the last dimension: (out, mean, rstd).")
}

// ----- softmax -----

/// `exp(x - max) / sum(exp(x - max))` along `dim`.
pub fn softmax(x: Tensor<'_>, dim: i64) -> Tensor<'_> {
    let xf = upcast(x);
    let shifted = xf - xf.amax(&[dim], true);
    let e = shifted.exp();
    (e / e.sum(&[dim], true)).cast(x.dtype())
}

/// `x - max - log(sum(exp(x - max)))` along `dim`.
pub fn log_softmax(x: Tensor<'_>, dim: i64) -> Tensor<'_> {
    let xf = upcast(x);
    let shifted = xf - xf.amax(&[dim], true);
    (shifted - shifted.exp().sum(&[dim], true).log()).cast(x.dtype())
}

fn build_softmax(sig: &KernelSignature) -> Result<Module, BuildError> {
    let dim = sig.int("dim").unwrap_or(-1);
    build_with("softmax", sig, |_, a| Ok(vec![softmax(a[0], dim)]))
}

fn build_log_softmax(sig: &KernelSignature) -> Result<Module, BuildError> {
    let dim = sig.int("dim").unwrap_or(-1);
    build_with("log_softmax", sig, |_, a| Ok(vec![log_softmax(a[0], dim)]))
}

const SOFTMAX_STATICS: &[StaticParam] = &[
    StaticParam::new("dim", StaticKind::Int).default("-1"),
    StaticParam::new("half_to_float", StaticKind::Bool).default("false"),
];
const SOFTMAX_GUARDS: &[Guard] = &[Guard::StaticEq { name: "half_to_float", value: "false" }];
const SOFTMAX_SHAPES: &[&str] = &["f32[8,128]; dim=-1", "bf16[4,256]; dim=1", "f32[3,7,33]; dim=1"];

inventory::submit! {
    KernelRegistration::new("softmax", build_softmax)
        .ops(&["aten::_softmax"])
        .inputs(&["self"])
        .statics(SOFTMAX_STATICS)
        .guards(SOFTMAX_GUARDS)
        .dtypes(FLOATS)
        .canonical(SOFTMAX_SHAPES)
        .doc("Numerically stable softmax along `dim`.")
}

inventory::submit! {
    KernelRegistration::new("log_softmax", build_log_softmax)
        .ops(&["aten::_log_softmax"])
        .inputs(&["self"])
        .statics(SOFTMAX_STATICS)
        .guards(SOFTMAX_GUARDS)
        .dtypes(FLOATS)
        .canonical(SOFTMAX_SHAPES)
        .doc("Numerically stable log-softmax along `dim`.")
}

// ----- matmul with epilogue -----

/// Activations the matmul epilogue can apply.
pub const ACTIVATIONS: &[&str] = &["none", "relu", "gelu", "gelu_tanh", "silu"];

fn build_matmul_bias_act(sig: &KernelSignature) -> Result<Module, BuildError> {
    let activation = static_str(sig, "activation").to_owned();
    let activation_sig = |dtype: DType, shape| KernelSignature {
        inputs: vec![crate::types::TensorType { dtype, shape }],
        statics: Vec::new(),
    };
    build_with("matmul_bias_act", sig, |b, a| {
        let (x, w, bias) = (a[0], a[1], a[2]);
        let acc = compute_type(x.dtype());
        let y = x.matmul_to(w, Some(acc)) + upcast(bias);
        let y = match activation.as_str() {
            "none" => y,
            "relu" => y.maximum(y.scalar(0.0)),
            // The GELU and SiLU epilogues call the registered kernels' modules as private
            // functions, so the emitted module shows where each one went.
            "gelu" | "gelu_tanh" | "silu" => {
                let sub = activation_sig(y.dtype(), y.shape());
                let module = match activation.as_str() {
                    "gelu" => build_gelu(&sub)?,
                    "gelu_tanh" => build_gelu_tanh(&sub)?,
                    _ => build_silu(&sub)?,
                };
                b.call(&module, &[y])?[0]
            }
            other => {
                return Err(BuildError {
                    kernel: "matmul_bias_act".to_owned(),
                    op: "epilogue",
                    kind: crate::ErrorKind::DType,
                    message: format!(
                        "unknown activation `{other}` (known: {})",
                        ACTIVATIONS.join(", ")
                    ),
                });
            }
        };
        Ok(vec![y.cast(x.dtype())])
    })
}

inventory::submit! {
    KernelRegistration::new("matmul_bias_act", build_matmul_bias_act)
        .ops(&["tpuk::matmul_bias_act"])
        .inputs(&["x", "weight", "bias"])
        .statics(&[StaticParam::new("activation", StaticKind::Str).default("none")])
        .guards(&[
            Guard::SameDType,
            Guard::Rank { input: 0, min: 2, max: 2 },
            Guard::Rank { input: 1, min: 2, max: 2 },
            Guard::Rank { input: 2, min: 1, max: 1 },
            Guard::SameDim { a: (0, 1), b: (1, 0) },
            Guard::SameDim { a: (1, 1), b: (2, 0) },
        ])
        .dtypes(FLOATS)
        .canonical(&[
            "f32[8,64], f32[64,128], f32[128]; activation=gelu",
            "bf16[16,128], bf16[128,256], bf16[256]; activation=silu",
            "f32[7,33], f32[33,5], f32[5]; activation=relu",
            "f32[4,32], f32[32,16], f32[16]",
        ])
        .doc("x @ weight + bias, then an activation epilogue (none, relu, gelu, gelu_tanh, silu).")
}
