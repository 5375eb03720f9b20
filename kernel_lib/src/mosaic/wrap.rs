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

/// The `backend_config` JSON of the kernel's custom call carrying `form`; a kernel's
/// `vmem_limit_bytes` becomes its scoped VMEM config (memory space 1 is VMEM).
pub fn backend_config(kernel: &Kernel, form: Form) -> String {
    let (body, format) = match form {
        Form::Shipped => (print_kernel_serialized(kernel), "\"serialization_format\": 1, "),
        Form::Readable => (print_kernel(kernel), ""),
    };
    let body = base64(body.as_bytes());
    let scoped = match kernel.vmem_limit_bytes {
        Some(size) => format!(
            ", \"scoped_memory_configs\": [{{\"memory_space\": 1, \"offset\": 0, \"size\": {size}}}]"
        ),
        None => String::new(),
    };
    format!(
        "{{\"custom_call_config\": {{\"body\": \"{body}\", {format}\"needs_layout_passes\": true}}{scoped}}}"
    )
}

/// The StableHLO module whose `@main` takes the kernel's input arrays and returns its outputs,
/// computed by the Mosaic kernel in its shipped form.
pub fn custom_call_module(kernel: &Kernel) -> String {
    custom_call_module_as(kernel, Form::Shipped)
}

/// [`custom_call_module`] carrying `form`.
pub fn custom_call_module_as(kernel: &Kernel, form: Form) -> String {
    let inputs = kernel.operands();
    let outputs: Vec<TensorType> = kernel.outputs().iter().map(|w| w.array.clone()).collect();
    custom_call_module_for(kernel, form, &inputs, &outputs)
}

/// [`custom_call_module_as`] for a caller whose arrays have other shapes of the same size than
/// the kernel's windows see (an `[..., D]` input the kernel views as `[rows, D]`): `@main`
/// takes `inputs` (the prefetch tables, then the inputs) and returns `outputs`, reshaping
/// around the custom call (row-major, free).
pub fn custom_call_module_for(
    kernel: &Kernel,
    form: Form,
    inputs: &[TensorType],
    outputs: &[TensorType],
) -> String {
    let operands = kernel.operands();
    let views: Vec<&TensorType> = operands.iter().collect();
    let out_views: Vec<&TensorType> = kernel.outputs().iter().map(|w| &w.array).collect();
    let join = |ts: &[&TensorType]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
    let tuple = |ts: &[&TensorType]| {
        if ts.len() == 1 { ts[0].to_string() } else { format!("({})", join(ts)) }
    };
    let callers: Vec<&TensorType> = inputs.iter().collect();
    let out_callers: Vec<&TensorType> = outputs.iter().collect();
    let params: Vec<String> =
        callers.iter().enumerate().map(|(i, t)| format!("%arg{i}: {t}")).collect();
    let layouts = |ts: &[&TensorType]| ts.iter().map(|t| layout(t)).collect::<Vec<_>>().join(", ");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "module {} attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{",
        symbol(&kernel.name)
    );
    let _ = writeln!(
        out,
        "  func.func public @main({}) -> {} {{",
        params.join(", "),
        tuple(&out_callers)
    );
    let mut args = Vec::with_capacity(views.len());
    for (i, (caller, view)) in callers.iter().zip(&views).enumerate() {
        args.push(adapt(&mut out, &format!("%arg{i}"), caller, view, &format!("%in{i}")));
    }
    let n = out_views.len();
    let lhs = if n == 1 { "%0".to_owned() } else { format!("%0:{n}") };
    let aliases = if kernel.aliases.is_empty() {
        String::new()
    } else {
        let tuple_index = |o: usize| if n == 1 { String::new() } else { o.to_string() };
        let entries: Vec<String> = kernel
            .aliases
            .iter()
            .map(|(i, o)| {
                format!(
                    "#stablehlo.output_operand_alias<output_tuple_indices = [{}], operand_index = {}, operand_tuple_indices = []>",
                    tuple_index(*o),
                    kernel.prefetch.len() + i
                )
            })
            .collect();
        format!(", output_operand_aliases = [{}]", entries.join(", "))
    };
    let _ = writeln!(
        out,
        "    {lhs} = stablehlo.custom_call @tpu_custom_call({}) {{backend_config = \"{}\", kernel_name = \"{}\", operand_layouts = [{}]{aliases}, result_layouts = [{}]}} : ({}) -> {}",
        args.join(", "),
        escape(&backend_config(kernel, form)),
        escape(&kernel.name),
        layouts(&views),
        layouts(&out_views),
        join(&views),
        tuple(&out_views)
    );
    let mut rets = Vec::with_capacity(n);
    for (i, (caller, view)) in out_callers.iter().zip(&out_views).enumerate() {
        let result = if n == 1 { "%0".to_owned() } else { format!("%0#{i}") };
        rets.push(adapt(&mut out, &result, view, caller, &format!("%out{i}")));
    }
    let _ = writeln!(out, "    return {} : {}", rets.join(", "), join(&out_callers));
    let _ = writeln!(out, "  }}");
    out.push_str("}\n");
    out
}

/// `value` of type `from` as type `to` (the same element count): a reshape (row-major, free)
/// where the shapes differ, a `stablehlo.convert` where the element types do (the 64-bit
/// integers Mosaic lacks, [`super::window_dtype`]); the name of the result, `name` or `value`
/// itself.
fn adapt(out: &mut String, value: &str, from: &TensorType, to: &TensorType, name: &str) -> String {
    if from == to {
        return value.to_owned();
    }
    let mut current = value.to_owned();
    let mut ty = from.clone();
    if from.dtype != to.dtype {
        let converted = TensorType { dtype: to.dtype, shape: from.shape.clone() };
        let step = if from.shape == to.shape { name.to_owned() } else { format!("{name}_c") };
        let _ = writeln!(out, "    {step} = stablehlo.convert {current} : ({ty}) -> {converted}");
        (current, ty) = (step, converted);
    }
    if ty.shape != to.shape {
        let _ = writeln!(out, "    {name} = stablehlo.reshape {current} : ({ty}) -> {to}");
        current = name.to_owned();
    }
    current
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
