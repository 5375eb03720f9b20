//! The attribute's arguments: `#[tpu_kernel(key = value, key(...), flag, ...)]`.
//!
//! Parsing is syntactic only; meaning that depends on the function (which names are tensors,
//! which are statics) is checked in [`crate::check`]. Every key goes through one set-once
//! helper, [`Once`], so a duplicate key is always reported the same way. A value that does not
//! parse is reported and skipped; parsing goes on with the next key, so all errors come out
//! together.

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr, Token};

use crate::ctxt::Ctxt;
use crate::types::DType;

/// Every key the attribute knows, in the order the documentation lists them.
pub const KEYS: &[&str] = &[
    "aten",
    "op",
    "name",
    "dtypes",
    "shapes",
    "same_dtype",
    "require",
    "platforms",
    "priority",
    "defaults",
    "cache_key",
    "ignore_in_cache_key",
    "schema",
    "output",
    "output_fn",
    "backward",
    "mutates",
    "canonical",
    "import",
    "tiled",
    "crate",
];

/// Keys of `import(...)`.
pub const IMPORT_KEYS: &[&str] = &["tpu", "cpu"];

/// Platform names of `platforms = [...]`.
pub const PLATFORMS: &[&str] = &["cpu", "tpu", "cuda"];

/// A key that may be given once.
pub struct Once<T> {
    key: &'static str,
    value: Option<T>,
}

impl<T> Once<T> {
    pub const fn new(key: &'static str) -> Once<T> {
        Once { key, value: None }
    }

    /// Sets the value, or reports a duplicate at `path`.
    pub fn set<S: quote::ToTokens>(&mut self, cx: &mut Ctxt, at: S, value: T) {
        if self.value.is_some() {
            cx.error_spanned_by(at, format!("duplicate `{}` key: give it once", self.key));
        } else {
            self.value = Some(value);
        }
    }

    pub fn get(&self) -> Option<&T> {
        self.value.as_ref()
    }

    pub fn is_set(&self) -> bool {
        self.value.is_some()
    }
}

/// An op name, normalised to `ns::name.overload`.
pub struct OpName {
    pub full: String,
}

/// One dimension in `shapes(x = [B, 128, _, ..])`.
#[derive(Clone)]
pub enum DimDecl {
    /// A named dimension; every occurrence of a name must agree.
    Named(Ident),
    Static(u64),
    /// `_`: any size.
    Any,
    /// `..`: any number of dimensions (at most one per list).
    Rest(Span),
}

/// `x = f32[B, D]` or `x = [B, D]`.
pub struct ShapeDecl {
    pub param: Ident,
    pub dtype: Option<(DType, Span)>,
    pub dims: Vec<DimDecl>,
    pub span: Span,
}

/// `import(tpu = "...", cpu = "...")`.
pub struct Import {
    pub span: Span,
    pub tpu: Once<LitStr>,
    pub cpu: Once<LitStr>,
}

/// Everything the attribute said.
pub struct Attrs {
    pub aten: Once<Vec<OpName>>,
    pub op: Once<Vec<OpName>>,
    pub name: Once<LitStr>,
    pub dtypes: Once<Vec<(DType, Span)>>,
    pub shapes: Once<Vec<ShapeDecl>>,
    pub same_dtype: Once<Span>,
    pub require: Once<Vec<Expr>>,
    pub platforms: Once<Vec<(&'static str, Span)>>,
    pub priority: Once<(i32, Span)>,
    pub defaults: Once<Vec<(Ident, Expr)>>,
    pub cache_key: Once<Vec<Ident>>,
    pub ignore_in_cache_key: Once<Vec<(Ident, LitStr)>>,
    pub schema: Once<(Vec<Ident>, Span)>,
    pub output: Once<(Vec<Expr>, Span)>,
    pub output_fn: Once<syn::Path>,
    pub backward: Once<(String, Span)>,
    pub mutates: Once<(Vec<Ident>, Span)>,
    pub canonical: Once<Vec<LitStr>>,
    pub import: Once<Import>,
    /// The `tiled` key's span (where errors about the whole form point) and the contents of
    /// `tiled(...)`, read by [`crate::tiled`].
    pub tiled: Once<(Span, Group)>,
    pub krate: Once<syn::Path>,
    /// The arguments did not parse as a list of keys at all: checks that a key is missing
    /// would only add noise.
    pub unparsable: bool,
}

impl Attrs {
    fn new() -> Attrs {
        Attrs {
            aten: Once::new("aten"),
            op: Once::new("op"),
            name: Once::new("name"),
            dtypes: Once::new("dtypes"),
            shapes: Once::new("shapes"),
            same_dtype: Once::new("same_dtype"),
            require: Once::new("require"),
            platforms: Once::new("platforms"),
            priority: Once::new("priority"),
            defaults: Once::new("defaults"),
            cache_key: Once::new("cache_key"),
            ignore_in_cache_key: Once::new("ignore_in_cache_key"),
            schema: Once::new("schema"),
            output: Once::new("output"),
            output_fn: Once::new("output_fn"),
            backward: Once::new("backward"),
            mutates: Once::new("mutates"),
            canonical: Once::new("canonical"),
            import: Once::new("import"),
            tiled: Once::new("tiled"),
            krate: Once::new("crate"),
            unparsable: false,
        }
    }
}

/// Parses the attribute's arguments, reporting every problem to `cx`.
pub fn parse(cx: &mut Ctxt, tokens: TokenStream) -> Attrs {
    let mut attrs = Attrs::new();
    let parser = syn::meta::parser(|meta| {
        let key = path_key(&meta.path);
        let path = meta.path.clone();
        if let Err(e) = parse_key(cx, &mut attrs, &key, &path, meta.input) {
            cx.syn_error(e);
            skip_to_comma(meta.input)?;
        }
        Ok(())
    });
    if let Err(e) = parser.parse2(tokens) {
        cx.error_at(e.span(), format!("expected `key = value` arguments: {e}"));
        attrs.unparsable = true;
    }
    attrs
}

fn path_key(path: &syn::Path) -> String {
    let segs: Vec<String> = path.segments.iter().map(|s| s.ident.unraw().to_string()).collect();
    segs.join("::")
}

fn list(items: &[&str]) -> String {
    items.join(", ")
}

/// Consumes tokens up to the next top-level comma.
fn skip_to_comma(input: ParseStream<'_>) -> syn::Result<()> {
    while !input.is_empty() && !input.peek(Token![,]) {
        input.parse::<TokenTree>()?;
    }
    Ok(())
}

/// The value after `=`, as its own token stream (so a value that fails to parse cannot leave
/// half-read groups behind).
fn value_tokens(input: ParseStream<'_>, key: &str, path: &syn::Path) -> syn::Result<TokenStream> {
    if !input.peek(Token![=]) {
        return Err(syn::Error::new_spanned(path, format!("expected `{key} = ...`")));
    }
    input.parse::<Token![=]>()?;
    let mut out = TokenStream::new();
    while !input.is_empty() && !input.peek(Token![,]) {
        out.extend([input.parse::<TokenTree>()?]);
    }
    if out.is_empty() {
        return Err(syn::Error::new_spanned(path, format!("expected a value after `{key} =`")));
    }
    Ok(out)
}

/// The contents of `key(...)`.
fn paren_group(input: ParseStream<'_>, key: &str, path: &syn::Path) -> syn::Result<Group> {
    match input.parse::<TokenTree>() {
        Ok(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis => Ok(g),
        _ => Err(syn::Error::new_spanned(path, format!("expected `{key}(...)`"))),
    }
}

fn value_expr(input: ParseStream<'_>, key: &str, path: &syn::Path) -> syn::Result<Expr> {
    let tokens = value_tokens(input, key, path)?;
    syn::parse2::<Expr>(tokens)
}

fn value_str(input: ParseStream<'_>, key: &str, path: &syn::Path) -> syn::Result<LitStr> {
    let tokens = value_tokens(input, key, path)?;
    syn::parse2::<LitStr>(tokens.clone()).map_err(|_| {
        syn::Error::new_spanned(tokens, format!("expected a string literal: `{key} = \"...\"`"))
    })
}

/// `[a, b]` or a single `a`.
fn expr_items(expr: Expr) -> Vec<Expr> {
    match expr {
        Expr::Array(a) => a.elems.into_iter().collect(),
        other => vec![other],
    }
}

fn parse_key(
    cx: &mut Ctxt,
    attrs: &mut Attrs,
    key: &str,
    path: &syn::Path,
    input: ParseStream<'_>,
) -> syn::Result<()> {
    match key {
        "aten" | "op" => {
            let items = expr_items(value_expr(input, key, path)?);
            let mut names: Vec<OpName> = Vec::new();
            for item in items {
                let Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(lit), .. }) = item else {
                    cx.error_spanned_by(item, format!("expected an op name string: `{key} = \"ns::name\"` or `{key} = [\"...\", ...]`"));
                    continue;
                };
                if let Some(full) = op_name(cx, key, &lit) {
                    if names.iter().any(|n| n.full == full) {
                        cx.error_spanned_by(&lit, format!("`{full}` is listed twice"));
                    } else {
                        names.push(OpName { full });
                    }
                }
            }
            if key == "aten" {
                attrs.aten.set(cx, path, names);
            } else {
                attrs.op.set(cx, path, names);
            }
        }
        "name" => {
            let lit = value_str(input, key, path)?;
            let v = lit.value();
            if !is_identifier(&v) {
                cx.error_spanned_by(&lit, format!("kernel name `{v}` is not an identifier"));
            }
            attrs.name.set(cx, path, lit);
        }
        "dtypes" => {
            let items = expr_items(value_expr(input, key, path)?);
            if items.is_empty() {
                cx.error_spanned_by(path, "`dtypes` lists no dtype");
            }
            let mut out: Vec<(DType, Span)> = Vec::new();
            for item in items {
                match expr_ident(&item).and_then(|i| DType::from_name(&i).map(|d| (d, i))) {
                    Some((d, _)) if out.iter().any(|(o, _)| *o == d) => {
                        cx.error_spanned_by(
                            &item,
                            format!("dtype `{}` is listed twice", d.short_name()),
                        );
                    }
                    Some((d, _)) => out.push((d, item.span())),
                    None => {
                        let known: Vec<&str> = DType::ALL.iter().map(|d| d.short_name()).collect();
                        cx.error_spanned_by(
                            &item,
                            format!(
                                "unsupported dtype `{}`; supported: {}",
                                quote::quote!(#item),
                                list(&known)
                            ),
                        );
                    }
                }
            }
            attrs.dtypes.set(cx, path, out);
        }
        "shapes" => {
            let group = paren_group(input, key, path)?;
            let mut decls: Vec<ShapeDecl> = Vec::new();
            let parser = |stream: ParseStream<'_>| -> syn::Result<()> {
                while !stream.is_empty() {
                    match parse_shape_decl(stream) {
                        Ok(d) => {
                            if decls.iter().any(|o| o.param == d.param) {
                                cx.error_spanned_by(
                                    &d.param,
                                    format!("duplicate `{}` in `shapes`", d.param),
                                );
                            } else {
                                decls.push(d);
                            }
                        }
                        Err(e) => {
                            cx.syn_error(e);
                            skip_to_comma(stream)?;
                        }
                    }
                    if !stream.is_empty() {
                        stream.parse::<Token![,]>()?;
                    }
                }
                Ok(())
            };
            if let Err(e) = parser.parse2(group.stream()) {
                cx.syn_error(e);
            }
            attrs.shapes.set(cx, path, decls);
        }
        "tiled" => {
            let group = paren_group(input, key, path)?;
            attrs.tiled.set(cx, path, (path.span(), group));
        }
        "same_dtype" => {
            if !(input.is_empty() || input.peek(Token![,])) {
                return Err(syn::Error::new_spanned(
                    path,
                    "`same_dtype` is a flag: it takes no value",
                ));
            }
            attrs.same_dtype.set(cx, path, path.span());
        }
        "require" => {
            let group = paren_group(input, key, path)?;
            let exprs = syn::punctuated::Punctuated::<Expr, Token![,]>::parse_terminated
                .parse2(group.stream())?;
            attrs.require.set(cx, path, exprs.into_iter().collect());
        }
        "platforms" => {
            let items = expr_items(value_expr(input, key, path)?);
            let mut out: Vec<(&'static str, Span)> = Vec::new();
            for item in items {
                match expr_ident(&item).and_then(|i| PLATFORMS.iter().find(|p| **p == i)) {
                    Some(p) if out.iter().any(|(o, _)| o == p) => {
                        cx.error_spanned_by(&item, format!("platform `{p}` is listed twice"));
                    }
                    Some(p) => out.push((p, item.span())),
                    None => cx.error_spanned_by(
                        &item,
                        format!(
                            "unknown platform `{}`; known: {}",
                            quote::quote!(#item),
                            list(PLATFORMS)
                        ),
                    ),
                }
            }
            attrs.platforms.set(cx, path, out);
        }
        "priority" => {
            let expr = value_expr(input, key, path)?;
            match int_value(&expr).and_then(|v| i32::try_from(v).ok()) {
                Some(v) => attrs.priority.set(cx, path, (v, expr.span())),
                None => {
                    cx.error_spanned_by(&expr, "expected an integer priority (an i32; higher wins)")
                }
            }
        }
        "defaults" => {
            let group = paren_group(input, key, path)?;
            let mut out: Vec<(Ident, Expr)> = Vec::new();
            let parser = syn::meta::parser(|meta| {
                let Some(name) = meta.path.get_ident().cloned() else {
                    cx.error_spanned_by(&meta.path, "expected a static parameter name");
                    return skip_to_comma(meta.input);
                };
                match value_expr(meta.input, &name.to_string(), &meta.path) {
                    Ok(e) if out.iter().any(|(n, _)| *n == name) => {
                        cx.error_spanned_by(&name, format!("duplicate `{name}` in `defaults`"));
                        drop(e);
                    }
                    Ok(e) => out.push((name, e)),
                    Err(e) => {
                        cx.syn_error(e);
                        skip_to_comma(meta.input)?;
                    }
                }
                Ok(())
            });
            if let Err(e) = parser.parse2(group.stream()) {
                cx.syn_error(e);
            }
            attrs.defaults.set(cx, path, out);
        }
        "cache_key" => {
            let items = expr_items(value_expr(input, key, path)?);
            let mut out: Vec<Ident> = Vec::new();
            for item in items {
                match &item {
                    Expr::Path(p) if p.path.get_ident().is_some() => {
                        let id = p
                            .path
                            .get_ident()
                            .cloned()
                            .unwrap_or_else(|| Ident::new("_", item.span()));
                        if out.contains(&id) {
                            cx.error_spanned_by(&id, format!("`{id}` is listed twice"));
                        } else {
                            out.push(id);
                        }
                    }
                    _ => cx.error_spanned_by(&item, "expected a static parameter name"),
                }
            }
            attrs.cache_key.set(cx, path, out);
        }
        "ignore_in_cache_key" => {
            let group = paren_group(input, key, path)?;
            let mut out: Vec<(Ident, LitStr)> = Vec::new();
            let parser = syn::meta::parser(|meta| {
                let Some(name) = meta.path.get_ident().cloned() else {
                    cx.error_spanned_by(&meta.path, "expected a static parameter name");
                    return skip_to_comma(meta.input);
                };
                match value_str(meta.input, &name.to_string(), &meta.path) {
                    Ok(reason) => {
                        if reason.value().trim().is_empty() {
                            cx.error_spanned_by(
                                &reason,
                                "give the reason the value does not change the emitted module",
                            );
                        }
                        if out.iter().any(|(n, _)| *n == name) {
                            cx.error_spanned_by(
                                &name,
                                format!("duplicate `{name}` in `ignore_in_cache_key`"),
                            );
                        } else {
                            out.push((name, reason));
                        }
                    }
                    Err(e) => {
                        cx.syn_error(e);
                        skip_to_comma(meta.input)?;
                    }
                }
                Ok(())
            });
            if let Err(e) = parser.parse2(group.stream()) {
                cx.syn_error(e);
            }
            attrs.ignore_in_cache_key.set(cx, path, out);
        }
        "schema" => {
            let group = paren_group(input, key, path)?;
            let names = (|s: ParseStream<'_>| {
                syn::punctuated::Punctuated::<Ident, Token![,]>::parse_terminated_with(
                    s,
                    Ident::parse_any,
                )
            })
            .parse2(group.stream());
            let names = names.map_err(|e| {
                syn::Error::new(
                    e.span(),
                    "expected the schema's argument names: `schema(self, dim, ...)`",
                )
            })?;
            let mut out: Vec<Ident> = Vec::new();
            for n in names {
                if out.iter().any(|o| o.unraw() == n.unraw()) {
                    cx.error_spanned_by(&n, format!("`{n}` is listed twice in `schema`"));
                } else {
                    out.push(n);
                }
            }
            attrs.schema.set(cx, path, (out, group.span()));
        }
        "output" => {
            let tokens = value_tokens(input, key, path)?;
            let span = tokens.span();
            let expr = syn::parse2::<Expr>(tokens)?;
            let items = match expr {
                Expr::Array(a) => a.elems.into_iter().collect(),
                Expr::Tuple(t) => t.elems.into_iter().collect(),
                other => vec![other],
            };
            attrs.output.set(cx, path, (items, span));
        }
        "output_fn" => {
            let tokens = value_tokens(input, key, path)?;
            let p = syn::parse2::<syn::Path>(tokens.clone()).map_err(|_| {
                syn::Error::new_spanned(tokens, "expected the path of a function `fn(&KernelSignature) -> Result<Vec<TensorType>, String>`")
            })?;
            attrs.output_fn.set(cx, path, p);
        }
        "backward" => {
            let expr = value_expr(input, key, path)?;
            let name = match &expr {
                Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
                Expr::Path(p) => p.path.segments.last().map(|s| s.ident.unraw().to_string()),
                _ => None,
            };
            match name {
                Some(n) if is_identifier(&n) => attrs.backward.set(cx, path, (n, expr.span())),
                _ => cx.error_spanned_by(
                    &expr,
                    "expected the name of the backward kernel: `backward = my_kernel_backward`",
                ),
            }
        }
        "mutates" => {
            let expr = value_expr(input, key, path)?;
            let span = expr.span();
            let mut out: Vec<Ident> = Vec::new();
            for item in expr_items(expr) {
                match &item {
                    Expr::Path(p) if p.path.get_ident().is_some() => {
                        let id = p
                            .path
                            .get_ident()
                            .cloned()
                            .unwrap_or_else(|| Ident::new("_", item.span()));
                        if out.contains(&id) {
                            cx.error_spanned_by(&id, format!("`{id}` is listed twice"));
                        } else {
                            out.push(id);
                        }
                    }
                    _ => cx.error_spanned_by(
                        &item,
                        "expected the name of a tensor input the kernel updates in place",
                    ),
                }
            }
            attrs.mutates.set(cx, path, (out, span));
        }
        "canonical" => {
            let items = expr_items(value_expr(input, key, path)?);
            let mut out = Vec::new();
            for item in items {
                match item {
                    Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => out.push(s),
                    other => cx.error_spanned_by(
                        other,
                        "expected a signature string: `\"f32[8,128], f32[128]; eps=1e-6\"`",
                    ),
                }
            }
            attrs.canonical.set(cx, path, out);
        }
        "import" => {
            let group = paren_group(input, key, path)?;
            let mut import =
                Import { span: path.span(), tpu: Once::new("tpu"), cpu: Once::new("cpu") };
            let parser = syn::meta::parser(|meta| {
                let k = path_key(&meta.path);
                let r = match k.as_str() {
                    "tpu" => value_str(meta.input, &k, &meta.path)
                        .map(|v| import.tpu.set(cx, &meta.path, v)),
                    "cpu" => value_str(meta.input, &k, &meta.path)
                        .map(|v| import.cpu.set(cx, &meta.path, v)),
                    _ => Err(syn::Error::new_spanned(
                        &meta.path,
                        format!("unknown `import` key `{k}`; valid keys: {}", list(IMPORT_KEYS)),
                    )),
                };
                if let Err(e) = r {
                    cx.syn_error(e);
                    skip_to_comma(meta.input)?;
                }
                Ok(())
            });
            if let Err(e) = parser.parse2(group.stream()) {
                cx.syn_error(e);
            }
            if !import.tpu.is_set() && !import.cpu.is_set() {
                cx.error_spanned_by(
                    path,
                    "`import` needs a module file: `import(tpu = \"...\", cpu = \"...\")`",
                );
            }
            attrs.import.set(cx, path, import);
        }
        "crate" => {
            let lit = value_str(input, key, path)?;
            let p = lit.parse_with(syn::Path::parse_mod_style).map_err(|_| {
                syn::Error::new_spanned(
                    &lit,
                    "expected a path to the tpu_kernels crate, such as `crate = \"crate\"`",
                )
            })?;
            attrs.krate.set(cx, path, p);
        }
        _ => {
            cx.error_spanned_by(path, format!("unknown key `{key}`; valid keys: {}", list(KEYS)));
            if input.peek(Token![=]) {
                input.parse::<Token![=]>()?;
            }
            skip_to_comma(input)?;
        }
    }
    Ok(())
}

fn parse_shape_decl(input: ParseStream<'_>) -> syn::Result<ShapeDecl> {
    let param: Ident = input
        .call(Ident::parse_any)
        .map_err(|e| syn::Error::new(e.span(), "expected `param = [dims]`, e.g. `x = [B, D]`"))?;
    input.parse::<Token![=]>().map_err(|e| {
        syn::Error::new(e.span(), format!("expected `{param} = [dims]` or `{param} = f32[dims]`"))
    })?;
    let mut dtype = None;
    if input.peek(Ident) {
        let name: Ident = input.parse()?;
        match DType::from_name(&name.to_string()) {
            Some(d) => dtype = Some((d, name.span())),
            None => {
                let known: Vec<&str> = DType::ALL.iter().map(|d| d.short_name()).collect();
                return Err(syn::Error::new(
                    name.span(),
                    format!("unsupported dtype `{name}`; supported: {}", list(&known)),
                ));
            }
        }
    }
    let group = match input.parse::<TokenTree>() {
        Ok(TokenTree::Group(g)) if g.delimiter() == Delimiter::Bracket => g,
        Ok(other) => {
            return Err(syn::Error::new(
                other.span(),
                format!("expected `[dims]` after `{param} =`"),
            ));
        }
        Err(e) => {
            return Err(syn::Error::new(e.span(), format!("expected `[dims]` after `{param} =`")));
        }
    };
    let dims = parse_dims.parse2(group.stream())?;
    if dims.iter().filter(|d| matches!(d, DimDecl::Rest(_))).count() > 1 {
        return Err(syn::Error::new(group.span(), "at most one `..` per shape"));
    }
    Ok(ShapeDecl { param, dtype, dims, span: group.span() })
}

fn parse_dims(input: ParseStream<'_>) -> syn::Result<Vec<DimDecl>> {
    let mut dims = Vec::new();
    while !input.is_empty() {
        let dim = if input.peek(Token![..]) {
            let t: Token![..] = input.parse()?;
            DimDecl::Rest(t.span())
        } else if input.peek(Token![_]) {
            input.parse::<Token![_]>()?;
            DimDecl::Any
        } else if input.peek(syn::LitInt) {
            let lit: syn::LitInt = input.parse()?;
            let n = lit.base10_parse::<u64>().map_err(|_| {
                syn::Error::new(lit.span(), "a static dimension is a non-negative integer")
            })?;
            DimDecl::Static(n)
        } else if input.peek(Ident) {
            DimDecl::Named(input.parse()?)
        } else {
            let tt: TokenTree = input.parse()?;
            return Err(syn::Error::new(
                tt.span(),
                format!("bad dimension `{tt}`: expected a name (`D`), a size (`128`), `_` or `..`"),
            ));
        };
        dims.push(dim);
        if !input.is_empty() {
            input.parse::<Token![,]>()?;
        }
    }
    Ok(dims)
}

/// Validates and normalises an op name: `ns::name` becomes `ns::name.default`.
fn op_name(cx: &mut Ctxt, key: &str, lit: &LitStr) -> Option<String> {
    let text = lit.value();
    let shape = if key == "aten" { "aten::name[.overload]" } else { "ns::name[.overload]" };
    let Some((ns, rest)) = text.split_once("::") else {
        cx.error_spanned_by(lit, format!("malformed op name `{text}`: expected `{shape}`"));
        return None;
    };
    let (name, overload) = rest.split_once('.').unwrap_or((rest, "default"));
    if !is_identifier(ns) || !is_identifier(name) || !is_identifier(overload) {
        cx.error_spanned_by(
            lit,
            format!("malformed op name `{text}`: expected `{shape}`, each part an identifier"),
        );
        return None;
    }
    if key == "aten" && ns != "aten" {
        cx.error_spanned_by(
            lit,
            format!(
                "`{text}` is not an ATen op: use `op = \"{text}\"` for a new op in your namespace"
            ),
        );
        return None;
    }
    if key == "op" && ns == "aten" {
        cx.error_spanned_by(
            lit,
            format!("`{text}` is an ATen op: use `aten = \"{text}\"` to replace it"),
        );
        return None;
    }
    Some(format!("{ns}::{name}.{overload}"))
}

pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The identifier of a one-segment path expression.
pub fn expr_ident(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident().map(|i| i.unraw().to_string()),
        _ => None,
    }
}

/// An integer literal, possibly negated.
pub fn int_value(expr: &Expr) -> Option<i64> {
    match expr {
        Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => i.base10_parse::<i64>().ok(),
        Expr::Unary(syn::ExprUnary { op: syn::UnOp::Neg(_), expr, .. }) => {
            int_value(expr).and_then(i64::checked_neg)
        }
        Expr::Group(g) => int_value(&g.expr),
        Expr::Paren(p) => int_value(&p.expr),
        _ => None,
    }
}
