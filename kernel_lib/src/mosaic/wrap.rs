//! A Mosaic kernel as the StableHLO module XLA compiles for a TPU: `@main` calls
//! `stablehlo.custom_call @tpu_custom_call` on the whole arrays, with the kernel's text, base64
//! encoded, in its `backend_config`.
//!
//! The body is one of the two printed forms ([`Form`]): the shipped `stable_mosaic`
//! serialization (`serialization_format: 1`, which libtpu upgrades from its version), or the
//! readable pretty form (no `serialization_format`: libtpu parses it with its own dialect). The
//! config is the strict proto JSON libtpu reads (`custom_call_config.{body,
//! serialization_format, needs_layout_passes}`; an unknown key is refused). Operand and result
//! layouts are row-major.

use std::fmt::Write as _;

use crate::ir::escape;
use crate::text::symbol;
use crate::types::TensorType;

use super::ir::Kernel;
use super::printer::print_kernel;
use super::serialized::print_kernel_serialized;

/// Which printed form a custom call carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// The versioned `stable_mosaic` serialization (what ships).
    Shipped,
    /// The pretty Mosaic text (snapshots, error messages, the interpreter).
    Readable,
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with `=` padding.
pub fn base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(B64[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn layout(ty: &TensorType) -> String {
    match ty.rank() {
        0 => "dense<> : tensor<0xindex>".to_owned(),
        1 => "dense<0> : tensor<1xindex>".to_owned(),
        r => {
            let dims: Vec<String> = (0..r).rev().map(|d| d.to_string()).collect();
            format!("dense<[{}]> : tensor<{r}xindex>", dims.join(", "))
        }
    }
}

/// The `backend_config` JSON of the kernel's custom call carrying `form`.
pub fn backend_config(kernel: &Kernel, form: Form) -> String {
    match form {
        Form::Shipped => {
            let body = base64(print_kernel_serialized(kernel).as_bytes());
            format!(
                "{{\"custom_call_config\": {{\"body\": \"{body}\", \"serialization_format\": 1, \"needs_layout_passes\": true}}}}"
            )
        }
        Form::Readable => {
            let body = base64(print_kernel(kernel).as_bytes());
            format!(
                "{{\"custom_call_config\": {{\"body\": \"{body}\", \"needs_layout_passes\": true}}}}"
            )
        }
    }
}

/// The StableHLO module whose `@main` takes the kernel's input arrays and returns its outputs,
/// computed by the Mosaic kernel in its shipped form.
pub fn custom_call_module(kernel: &Kernel) -> String {
    custom_call_module_as(kernel, Form::Shipped)
}

/// [`custom_call_module`] carrying `form`.
pub fn custom_call_module_as(kernel: &Kernel, form: Form) -> String {
    let inputs: Vec<&TensorType> = kernel.inputs().iter().map(|w| &w.array).collect();
    let outputs: Vec<&TensorType> = kernel.outputs().iter().map(|w| &w.array).collect();
    let join = |ts: &[&TensorType]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
    let results =
        if outputs.len() == 1 { outputs[0].to_string() } else { format!("({})", join(&outputs)) };
    let params: Vec<String> =
        inputs.iter().enumerate().map(|(i, t)| format!("%arg{i}: {t}")).collect();
    let args: Vec<String> = (0..inputs.len()).map(|i| format!("%arg{i}")).collect();
    let layouts = |ts: &[&TensorType]| ts.iter().map(|t| layout(t)).collect::<Vec<_>>().join(", ");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "module {} attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{",
        symbol(&kernel.name)
    );
    let _ = writeln!(out, "  func.func public @main({}) -> {results} {{", params.join(", "));
    let lhs = if outputs.len() == 1 { "%0".to_owned() } else { format!("%0:{}", outputs.len()) };
    let _ = writeln!(
        out,
        "    {lhs} = stablehlo.custom_call @tpu_custom_call({}) {{backend_config = \"{}\", kernel_name = \"{}\", operand_layouts = [{}], result_layouts = [{}]}} : ({}) -> {results}",
        args.join(", "),
        escape(&backend_config(kernel, form)),
        escape(&kernel.name),
        layouts(&inputs),
        layouts(&outputs),
        join(&inputs)
    );
    let rets: Vec<String> = if outputs.len() == 1 {
        vec!["%0".to_owned()]
    } else {
        (0..outputs.len()).map(|i| format!("%0#{i}")).collect()
    };
    let _ = writeln!(out, "    return {} : {}", rets.join(", "), join(&outputs));
    let _ = writeln!(out, "  }}");
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xFF, 0xEE, 0x00, 0x3F]), "/+4APw==");
    }
}
