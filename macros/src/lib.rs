//! The `#[tpu_kernel]` attribute of [tpu-kernels](https://docs.rs/tpu-kernels).
//!
//! Use it through `tpu_kernels::tpu_kernel`, whose documentation describes the options; this
//! crate holds only the entry point. The work is split as in serde_derive:
//! [`attr`] parses the attribute's arguments, [`ast`] validates the function into a model of the
//! kernel, [`check`] does the cross-field checks (and reads imported modules), and [`expand`]
//! generates the code. Every error is collected and spanned; on error the output is the
//! `compile_error!`s plus the original function.

mod ast;
mod attr;
mod check;
mod ctxt;
mod expand;
mod tiled;
// The StableHLO reader and the tensor types are std-only; the macro reads imported modules
// with the very code the library uses.
#[allow(dead_code, reason = "only part of the library's reader API is used at compile time")]
#[path = "../../kernel_lib/src/stablehlo/reader.rs"]
mod reader;
#[allow(dead_code, reason = "only part of the library's tensor types is used at compile time")]
#[path = "../../kernel_lib/src/types.rs"]
mod types;

#[cfg(test)]
mod tests;

#[doc = include_str!("tpu_kernel.md")]
///
/// [`Tensor`]: https://docs.rs/tpu-kernels/latest/tpu_kernels/builder/struct.Tensor.html
/// [`KernelRegistration`]: https://docs.rs/tpu-kernels/latest/tpu_kernels/registration/struct.KernelRegistration.html
#[proc_macro_attribute]
pub fn tpu_kernel(
    attr: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    expand::expand(attr.into(), item.into()).into()
}
