//! The annotated function, validated into a model of the kernel: its tensor and static
//! parameters, what it returns, whether it has a body.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Attribute, Block, Ident, Signature, Token, Type, Visibility};

use crate::ctxt::Ctxt;

/// A function item with or without a body (`fn f(x: Tensor) -> Tensor;` for imports).
pub struct KernelItem {
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub sig: Signature,
    pub body: Option<Block>,
    pub semi: Option<Token![;]>,
}

impl Parse for KernelItem {
    fn parse(input: ParseStream<'_>) -> syn::Result<KernelItem> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let sig: Signature = input.parse()?;
        let (body, semi) = if input.peek(Token![;]) {
            (None, Some(input.parse()?))
        } else {
            (Some(input.parse()?), None)
        };
        Ok(KernelItem { attrs, vis, sig, body, semi })
    }
}

impl ToTokens for KernelItem {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        for a in &self.attrs {
            a.to_tokens(tokens);
        }
        self.vis.to_tokens(tokens);
        self.sig.to_tokens(tokens);
        match &self.body {
            Some(b) => b.to_tokens(tokens),
            None => self.semi.unwrap_or_default().to_tokens(tokens),
        }
    }
}

/// The Rust type of a static parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaticType {
    Int,
    Float,
    Bool,
    Str,
}

impl StaticType {
    pub fn variant(self) -> &'static str {
        match self {
            StaticType::Int => "Int",
            StaticType::Float => "Float",
            StaticType::Bool => "Bool",
            StaticType::Str => "Str",
        }
    }

    pub fn rust(self) -> &'static str {
        match self {
            StaticType::Int => "i64",
            StaticType::Float => "f64",
            StaticType::Bool => "bool",
            StaticType::Str => "&str",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// Tensor input number `n` (in a tiled kernel: the block of input window `n`).
    Tensor(usize),
    /// Static parameter number `n`.
    Static(usize, StaticType),
    /// A tiled kernel's `Block` parameter, before [`crate::tiled`] says whether it is an
    /// input, an output or a scratch buffer.
    Block,
    /// The block of a tiled kernel's output window `n`.
    Output(usize),
    /// A tiled kernel's scratch buffer `n`.
    Scratch(usize),
    /// A tiled kernel's `&Tiled`: the kernel being built.
    Ctx,
}

pub struct Param {
    pub ident: Ident,
    /// The name the parameter binds to in the op schema: the identifier without `r#`, and
    /// `self_` as `self`.
    pub schema_name: String,
    pub kind: ParamKind,
    pub ty: Type,
}

/// What the kernel returns.
pub struct Returns {
    /// Number of tensors (1 for `Tensor`, n for a tuple).
    pub count: usize,
    /// `Result<_, BuildError>`: the body may fail with `?`.
    pub fallible: bool,
    pub span: Span,
}

pub struct Kernel {
    pub item: KernelItem,
    pub params: Vec<Param>,
    pub returns: Option<Returns>,
    pub doc: String,
    /// A tiled kernel (`tiled(...)`): its parameters are blocks, it returns `()`.
    pub tiled: bool,
}

impl Kernel {
    pub fn tensors(&self) -> impl Iterator<Item = &Param> {
        self.params.iter().filter(|p| matches!(p.kind, ParamKind::Tensor(_)))
    }

    pub fn statics(&self) -> impl Iterator<Item = (&Param, StaticType)> {
        self.params.iter().filter_map(|p| match p.kind {
            ParamKind::Static(_, t) => Some((p, t)),
            _ => None,
        })
    }

    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.ident.unraw() == name)
    }

    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        match self.param(name)?.kind {
            ParamKind::Tensor(i) => Some(i),
            _ => None,
        }
    }

    pub fn tensor_names(&self) -> Vec<String> {
        self.tensors().map(|p| p.ident.unraw().to_string()).collect()
    }

    pub fn static_names(&self) -> Vec<String> {
        self.statics().map(|(p, _)| p.ident.unraw().to_string()).collect()
    }
}

/// Validates the function (a tiled kernel's when `tiled`). Returns `None` only when the item
/// is not a function at all.
pub fn from_item(cx: &mut Ctxt, item: TokenStream, tiled: bool) -> Option<Kernel> {
    let item: KernelItem = match syn::parse2(item.clone()) {
        Ok(i) => i,
        Err(_) => {
            cx.error_spanned_by(
                item,
                "#[tpu_kernel] applies to a function: `fn name(x: Tensor, ...) -> Tensor { ... }`",
            );
            return None;
        }
    };
    let sig = &item.sig;
    if let Some(t) = &sig.constness {
        cx.error_spanned_by(t, "a kernel cannot be a `const fn`");
    }
    if let Some(t) = &sig.asyncness {
        cx.error_spanned_by(t, "a kernel cannot be `async`: its body is traced, not awaited");
    }
    if let Some(t) = &sig.unsafety {
        cx.error_spanned_by(t, "a kernel cannot be `unsafe`: its body only builds StableHLO");
    }
    if let Some(abi) = &sig.abi {
        cx.error_spanned_by(abi, "a kernel cannot declare an ABI (`extern`)");
    }
    if let Some(v) = &sig.variadic {
        cx.error_spanned_by(v, "a kernel cannot be variadic");
    }
    for g in &sig.generics.params {
        match g {
            syn::GenericParam::Lifetime(_) => {}
            syn::GenericParam::Type(t) => cx.error_spanned_by(
                t,
                "a kernel cannot be generic over types: it is traced once per concrete signature; \
                 list the element types in `dtypes = [...]`",
            ),
            syn::GenericParam::Const(c) => cx.error_spanned_by(
                c,
                "a kernel cannot have const generics: take an `i64` static parameter instead",
            ),
        }
    }
    if let Some(w) = &sig.generics.where_clause {
        cx.error_spanned_by(w, "a kernel cannot have a `where` clause");
    }

    let mut params = Vec::new();
    let (mut n_tensors, mut n_statics) = (0, 0);
    for input in &sig.inputs {
        let pat_ty = match input {
            syn::FnArg::Receiver(r) => {
                cx.error_spanned_by(r, "a kernel is a free function: it cannot take `self`");
                continue;
            }
            syn::FnArg::Typed(t) => t,
        };
        let ident = match &*pat_ty.pat {
            syn::Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => p.ident.clone(),
            other => {
                cx.error_spanned_by(other, "a kernel parameter must be a plain name (`x: Tensor`)");
                continue;
            }
        };
        let raw = ident.unraw().to_string();
        let schema_name = if raw == "self_" { "self".to_owned() } else { raw };
        let kind = match classify_param(&pat_ty.ty) {
            _ if tiled && is_tiled_ctx(&pat_ty.ty) => ParamKind::Ctx,
            _ if is_block(&pat_ty.ty) => {
                if !tiled {
                    cx.error_spanned_by(
                        &pat_ty.ty,
                        "a `Block` parameter belongs to a tiled kernel: declare its grid and \
                         blocks with `tiled(...)`",
                    );
                }
                ParamKind::Block
            }
            Some(None) if tiled => {
                cx.error_spanned_by(
                    &pat_ty.ty,
                    "a tiled kernel works on blocks: its inputs, outputs and scratch buffers are \
                     `Block` parameters, not `Tensor`",
                );
                // Checked on as the block it should be, so its specs are not errors too.
                ParamKind::Block
            }
            Some(None) => {
                n_tensors += 1;
                ParamKind::Tensor(n_tensors - 1)
            }
            Some(Some(t)) => {
                n_statics += 1;
                ParamKind::Static(n_statics - 1, t)
            }
            None => {
                let ty = &pat_ty.ty;
                cx.error_spanned_by(
                    ty,
                    format!(
                        "unsupported parameter type `{}`: a kernel parameter is a `Tensor`, or a \
                         static of type i64, f64, bool or &str",
                        type_text(ty)
                    ),
                );
                continue;
            }
        };
        params.push(Param { ident, schema_name, kind, ty: (*pat_ty.ty).clone() });
    }
    if !tiled && n_tensors == 0 && sig.inputs.iter().all(|i| matches!(i, syn::FnArg::Typed(_))) {
        cx.error_spanned_by(&sig.ident, "a kernel takes at least one `Tensor` parameter");
    }

    let returns = match &sig.output {
        _ if tiled => {
            // A tiled kernel writes its output blocks; `crate::tiled` counts them.
            match &sig.output {
                syn::ReturnType::Default => {
                    Some(Returns { count: 0, fallible: false, span: sig.ident.span() })
                }
                syn::ReturnType::Type(_, ty) if is_unit_result(ty) => {
                    Some(Returns { count: 0, fallible: true, span: ty.span() })
                }
                syn::ReturnType::Type(_, ty) => {
                    cx.error_spanned_by(
                        ty,
                        format!(
                            "a tiled kernel stores its outputs into its output blocks: it returns \
                             nothing (or `Result<(), BuildError>`), not `{}`",
                            type_text(ty)
                        ),
                    );
                    None
                }
            }
        }
        syn::ReturnType::Default => {
            cx.error_spanned_by(
                sig,
                "a kernel returns its outputs: `-> Tensor`, `-> (Tensor, Tensor)` or \
                 `-> Result<Tensor, BuildError>`",
            );
            None
        }
        syn::ReturnType::Type(_, ty) => match classify_return(ty) {
            Some((count, fallible)) => Some(Returns { count, fallible, span: ty.span() }),
            None => {
                cx.error_spanned_by(
                    ty,
                    format!(
                        "unsupported return type `{}`: a kernel returns a `Tensor`, a tuple of \
                         them, or either inside `Result<_, BuildError>`",
                        type_text(ty)
                    ),
                );
                None
            }
        },
    };

    let doc = doc_text(&item.attrs);
    let mut item = item;
    name_tensor_lifetime(&mut item.sig);
    for (p, input) in params.iter_mut().zip(item.sig.inputs.iter().filter_map(|i| match i {
        syn::FnArg::Typed(t) if matches!(&*t.pat, syn::Pat::Ident(_)) => Some(t),
        _ => None,
    })) {
        p.ty = (*input.ty).clone();
    }
    Some(Kernel { item, params, returns, doc, tiled })
}

/// `Block` or `Block<'k>`.
fn is_block(ty: &Type) -> bool {
    matches!(last_segment(ty), Some(s) if s.ident == "Block" && is_tensor_args(&s.arguments))
}

/// `&Tiled`.
fn is_tiled_ctx(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) => {
            r.mutability.is_none()
                && matches!(last_segment(&r.elem), Some(s) if s.ident == "Tiled" && s.arguments.is_empty())
        }
        _ => false,
    }
}

/// `Result<(), _>`.
fn is_unit_result(ty: &Type) -> bool {
    let Some(seg) = last_segment(ty) else { return false };
    if seg.ident != "Result" {
        return false;
    }
    let syn::PathArguments::AngleBracketed(a) = &seg.arguments else { return false };
    matches!(a.args.first(), Some(syn::GenericArgument::Type(Type::Tuple(t))) if t.elems.is_empty())
}

/// The lifetime the rewrite gives every elided `Tensor`.
const TENSOR_LIFETIME: &str = "'tensor";

/// `fn f(x: Tensor, mode: &str) -> Tensor` does not compile as written (two elided input
/// lifetimes); when the function declares no lifetimes, every `Tensor` and `Tensor<'_>` in the
/// signature becomes `Tensor<'tensor>` with `'tensor` a new lifetime parameter. Signatures that
/// name lifetimes are left as written.
fn name_tensor_lifetime(sig: &mut Signature) {
    if sig.generics.lifetimes().next().is_some() {
        return;
    }
    let lifetime = syn::Lifetime::new(TENSOR_LIFETIME, Span::call_site());
    let mut changed = false;
    for input in &mut sig.inputs {
        if let syn::FnArg::Typed(t) = input {
            changed |= set_tensor_lifetime(&mut t.ty, &lifetime);
        }
    }
    if let syn::ReturnType::Type(_, ty) = &mut sig.output {
        changed |= set_tensor_lifetime(ty, &lifetime);
    }
    if changed {
        sig.generics
            .params
            .insert(0, syn::GenericParam::Lifetime(syn::LifetimeParam::new(lifetime)));
    }
}

fn set_tensor_lifetime(ty: &mut Type, lifetime: &syn::Lifetime) -> bool {
    match ty {
        Type::Tuple(t) => {
            let mut changed = false;
            for e in &mut t.elems {
                changed |= set_tensor_lifetime(e, lifetime);
            }
            changed
        }
        Type::Paren(p) => set_tensor_lifetime(&mut p.elem, lifetime),
        Type::Group(g) => set_tensor_lifetime(&mut g.elem, lifetime),
        Type::Path(p) if p.qself.is_none() => {
            let Some(seg) = p.path.segments.last_mut() else { return false };
            if seg.ident == "Result" {
                if let syn::PathArguments::AngleBracketed(a) = &mut seg.arguments
                    && let Some(syn::GenericArgument::Type(ok)) = a.args.first_mut()
                {
                    return set_tensor_lifetime(ok, lifetime);
                }
                return false;
            }
            if seg.ident != "Tensor" {
                return false;
            }
            let elided = match &seg.arguments {
                syn::PathArguments::None => true,
                syn::PathArguments::AngleBracketed(a) => {
                    matches!(a.args.first(), Some(syn::GenericArgument::Lifetime(l)) if l.ident == "_")
                        && a.args.len() == 1
                }
                syn::PathArguments::Parenthesized(_) => false,
            };
            if elided {
                seg.arguments = syn::PathArguments::AngleBracketed(syn::parse_quote!(<#lifetime>));
            }
            elided
        }
        _ => false,
    }
}

/// A type as users write it (`Vec<f32>`, not `Vec < f32 >`).
fn type_text(ty: &Type) -> String {
    ty.to_token_stream()
        .to_string()
        .replace(" < ", "<")
        .replace(" <", "<")
        .replace(" >", ">")
        .replace("& ", "&")
        .replace(" ,", ",")
}

fn last_segment(ty: &Type) -> Option<&syn::PathSegment> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last(),
        Type::Group(g) => last_segment(&g.elem),
        Type::Paren(p) => last_segment(&p.elem),
        _ => None,
    }
}

/// `Some(None)` for a tensor, `Some(Some(kind))` for a static, `None` for anything else.
fn classify_param(ty: &Type) -> Option<Option<StaticType>> {
    if let Type::Reference(r) = ty {
        let is_str = r.mutability.is_none()
            && matches!(last_segment(&r.elem), Some(s) if s.ident == "str" && s.arguments.is_empty());
        return is_str.then_some(Some(StaticType::Str));
    }
    let seg = last_segment(ty)?;
    match seg.ident.to_string().as_str() {
        "Tensor" if is_tensor_args(&seg.arguments) => Some(None),
        "i64" if seg.arguments.is_empty() => Some(Some(StaticType::Int)),
        "f64" if seg.arguments.is_empty() => Some(Some(StaticType::Float)),
        "bool" if seg.arguments.is_empty() => Some(Some(StaticType::Bool)),
        _ => None,
    }
}

/// `Tensor` or `Tensor<'b>`.
fn is_tensor_args(args: &syn::PathArguments) -> bool {
    match args {
        syn::PathArguments::None => true,
        syn::PathArguments::AngleBracketed(a) => {
            a.args.len() == 1 && matches!(a.args.first(), Some(syn::GenericArgument::Lifetime(_)))
        }
        syn::PathArguments::Parenthesized(_) => false,
    }
}

fn is_tensor(ty: &Type) -> bool {
    matches!(last_segment(ty), Some(s) if s.ident == "Tensor" && is_tensor_args(&s.arguments))
}

/// (number of tensors, fallible)
fn classify_return(ty: &Type) -> Option<(usize, bool)> {
    if let Some(seg) = last_segment(ty)
        && seg.ident == "Result"
    {
        let syn::PathArguments::AngleBracketed(a) = &seg.arguments else { return None };
        let Some(syn::GenericArgument::Type(ok)) = a.args.first() else { return None };
        return classify_plain_return(ok).map(|n| (n, true));
    }
    classify_plain_return(ty).map(|n| (n, false))
}

fn classify_plain_return(ty: &Type) -> Option<usize> {
    match ty {
        Type::Tuple(t) if !t.elems.is_empty() && t.elems.iter().all(is_tensor) => {
            Some(t.elems.len())
        }
        Type::Paren(p) => classify_plain_return(&p.elem),
        other if is_tensor(other) => Some(1),
        _ => None,
    }
}

/// The `///` documentation, lines joined with `\n`, one leading space removed from each.
fn doc_text(attrs: &[Attribute]) -> String {
    let mut lines = Vec::new();
    for a in attrs {
        if !a.path().is_ident("doc") {
            continue;
        }
        if let syn::Meta::NameValue(nv) = &a.meta
            && let syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) = &nv.value
        {
            let v = s.value();
            lines.push(v.strip_prefix(' ').unwrap_or(&v).trim_end().to_owned());
        }
    }
    lines.join("\n").trim().to_owned()
}
