//! Cross-field checks: the attribute against the function (and against imported modules),
//! producing the [`Model`] that [`crate::expand`] turns into code.

use std::collections::BTreeMap;
use std::path::PathBuf;

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::{Expr, LitStr};

use crate::ast::{Kernel, ParamKind, StaticType};
use crate::attr::{Attrs, DimDecl, ShapeDecl, expr_ident, int_value};
use crate::ctxt::Ctxt;
use crate::reader;
use crate::types::{DType, Dim, TensorType};

pub struct StaticModel {
    pub name: String,
    pub kind: StaticType,
    pub default: Option<String>,
    pub ignore_reason: Option<String>,
}

#[derive(Clone, Copy)]
pub enum BindingModel {
    Tensor(usize),
    Static(usize),
}

pub enum GuardModel {
    StaticEq { name: String, value: String },
    Rank { input: usize, min: usize, max: Option<usize> },
    DivisibleBy { input: usize, dim: i64, by: u64 },
    SameDim { a: (usize, i64), b: (usize, i64) },
    SameDType,
    DimEq { input: usize, dim: i64, size: u64 },
    DTypeIs { input: usize, dtype: DType },
}

pub enum OutDTypeModel {
    Of(usize),
    Fixed(DType),
}

pub enum OutDimModel {
    Of(usize, i64),
    Static(u64),
}

pub enum SpecModel {
    SameAs(usize),
    Reduced(usize, i64),
    Shape(OutDTypeModel, Vec<OutDimModel>),
}

pub enum OutputModel {
    Build,
    Specs(Vec<SpecModel>),
    Fn(syn::Path),
}

pub struct ImportFile {
    pub path: String,
    pub span: Span,
    pub fingerprint: String,
}

pub struct ImportModel {
    pub tpu: Option<ImportFile>,
    pub cpu: Option<ImportFile>,
}

/// Everything code generation needs, checked.
pub struct Model {
    pub name: String,
    pub ops: Vec<String>,
    pub inputs: Vec<String>,
    pub statics: Vec<StaticModel>,
    pub schema: Vec<String>,
    pub bindings: Vec<(String, usize, BindingModel)>,
    pub guards: Vec<GuardModel>,
    pub dtypes: Option<Vec<DType>>,
    pub platforms: Option<Vec<&'static str>>,
    pub priority: Option<i32>,
    pub canonical: Vec<String>,
    pub output: OutputModel,
    pub backward: Option<String>,
    /// Tensor inputs updated in place, in output order.
    pub mutates: Vec<String>,
    pub doc: String,
    pub import: Option<ImportModel>,
    pub krate: TokenStream,
    /// Where each named dimension of `shapes` first appears.
    pub dims: BTreeMap<String, DimPos>,
}

/// Where a named dimension first appears: (input, dim index counted from the end when the
/// shape has a `..` before it).
pub type DimPos = (usize, i64);

pub fn check(cx: &mut Ctxt, attrs: &Attrs, k: &Kernel) -> Model {
    let name = match attrs.name.get() {
        Some(lit) => lit.value(),
        None => k.item.sig.ident.unraw().to_string(),
    };
    let krate = match attrs.krate.get() {
        Some(p) => p.to_token_stream(),
        None => quote!(::tpu_kernels),
    };

    // What it replaces.
    let mut ops: Vec<String> = Vec::new();
    for list in [attrs.aten.get(), attrs.op.get()].into_iter().flatten() {
        ops.extend(list.iter().map(|o| o.full.clone()));
    }
    if !attrs.aten.is_set() && !attrs.op.is_set() && !attrs.unparsable {
        cx.error_at(
            Span::call_site(),
            "say what the kernel replaces: `aten = \"aten::name.overload\"` (an ATen op) or \
             `op = \"mylib::name\"` (a new op)",
        );
    }

    let inputs: Vec<String> = k.tensors().map(|p| p.schema_name.clone()).collect();
    let statics = check_statics(cx, attrs, k);
    let (schema, bindings) = check_schema(cx, attrs, k);
    let (mut guards, dims) = check_shapes(cx, attrs, k);
    check_require(cx, attrs, k, &dims, &mut guards);

    let dtypes = attrs.dtypes.get().map(|d| d.iter().map(|(d, _)| *d).collect::<Vec<_>>());
    let platforms = attrs.platforms.get().map(|p| p.iter().map(|(p, _)| *p).collect::<Vec<_>>());
    let canonical = check_canonical(cx, attrs, k, &statics);

    let mut output = check_output(cx, attrs, k, &dims);
    let import = check_import(cx, attrs, k, &mut output);
    let mutates = check_mutates(cx, attrs, &inputs, &output);

    Model {
        name,
        ops,
        inputs,
        statics,
        schema,
        bindings,
        guards,
        dtypes,
        platforms,
        priority: attrs.priority.get().map(|(p, _)| *p),
        canonical,
        output,
        backward: attrs.backward.get().map(|(b, _)| b.clone()),
        mutates,
        doc: k.doc.clone(),
        import,
        krate,
        dims,
    }
}

/// `mutates = [a, b]`: tensor inputs, each updated in place by the output at its position
/// (`a` by output 0). A kernel with a backward cannot mutate (autograd would see its inputs
/// change under it); a declared output list must have an output for each.
fn check_mutates(
    cx: &mut Ctxt,
    attrs: &Attrs,
    inputs: &[String],
    output: &OutputModel,
) -> Vec<String> {
    let Some((names, span)) = attrs.mutates.get() else { return Vec::new() };
    let mut out = Vec::new();
    for id in names {
        let name = id.unraw().to_string();
        if !inputs.contains(&name) {
            cx.error_spanned_by(
                id,
                format!(
                    "`{name}` is not a tensor input; `mutates` lists the tensor inputs the \
                     kernel updates in place (inputs: {})",
                    inputs.join(", ")
                ),
            );
        }
        out.push(name);
    }
    if let Some((b, _)) = attrs.backward.get() {
        cx.error_at(
            *span,
            format!(
                "a kernel that updates its inputs in place has no backward (`backward = {b}`): \
                 autograd needs the inputs it saved unchanged"
            ),
        );
    }
    if let OutputModel::Specs(specs) = output
        && specs.len() < out.len()
    {
        cx.error_at(
            *span,
            format!(
                "`mutates` lists {} inputs but `output` has {} outputs: output k is the new \
                 value of the k-th mutated input",
                out.len(),
                specs.len()
            ),
        );
    }
    out
}

fn static_value_text(kind: StaticType, expr: &Expr) -> Option<String> {
    match (kind, expr) {
        (StaticType::Int, e) => int_value(e).map(|v| v.to_string()),
        (StaticType::Float, e) => float_value(e).map(|v| format!("{v:e}")),
        (StaticType::Bool, Expr::Lit(syn::ExprLit { lit: syn::Lit::Bool(b), .. })) => {
            Some(b.value.to_string())
        }
        (StaticType::Str, Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. })) => Some(s.value()),
        _ => None,
    }
}

fn float_value(expr: &Expr) -> Option<f64> {
    match expr {
        Expr::Lit(syn::ExprLit { lit: syn::Lit::Float(f), .. }) => f.base10_parse::<f64>().ok(),
        Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) => i.base10_parse::<f64>().ok(),
        Expr::Unary(syn::ExprUnary { op: syn::UnOp::Neg(_), expr, .. }) => {
            float_value(expr).map(|v| -v)
        }
        _ => None,
    }
}

fn known(names: &[String]) -> String {
    if names.is_empty() { "none".to_owned() } else { names.join(", ") }
}

fn check_statics(cx: &mut Ctxt, attrs: &Attrs, k: &Kernel) -> Vec<StaticModel> {
    let static_names = k.static_names();
    let mut out: Vec<StaticModel> = k
        .statics()
        .map(|(p, kind)| StaticModel {
            name: p.schema_name.clone(),
            kind,
            default: None,
            ignore_reason: None,
        })
        .collect();
    let find = |name: &str| k.statics().position(|(p, _)| p.ident.unraw() == name);
    for (ident, expr) in attrs.defaults.get().into_iter().flatten() {
        let n = ident.unraw().to_string();
        let Some(i) = find(&n) else {
            cx.error_spanned_by(
                ident,
                format!(
                    "`{n}` is not a static parameter (static parameters: {})",
                    known(&static_names)
                ),
            );
            continue;
        };
        let kind = out[i].kind;
        match static_value_text(kind, expr) {
            Some(v) => out[i].default = Some(v),
            None => cx.error_spanned_by(
                expr,
                format!("default of `{n}` must be a {} literal", kind.rust()),
            ),
        }
    }
    let mut included: Vec<String> = Vec::new();
    for ident in attrs.cache_key.get().into_iter().flatten() {
        let n = ident.unraw().to_string();
        if find(&n).is_none() {
            cx.error_spanned_by(
                ident,
                format!(
                    "`{n}` is not a static parameter (static parameters: {})",
                    known(&static_names)
                ),
            );
        }
        included.push(n);
    }
    for (ident, reason) in attrs.ignore_in_cache_key.get().into_iter().flatten() {
        let n = ident.unraw().to_string();
        match find(&n) {
            None => cx.error_spanned_by(
                ident,
                format!(
                    "`{n}` is not a static parameter (static parameters: {})",
                    known(&static_names)
                ),
            ),
            Some(_) if included.contains(&n) => cx.error_spanned_by(
                ident,
                format!("`{n}` is both in `cache_key` and in `ignore_in_cache_key`"),
            ),
            Some(i) => out[i].ignore_reason = Some(reason.value()),
        }
    }
    for (p, _) in k.statics() {
        let n = p.ident.unraw().to_string();
        let ignored = out.iter().any(|s| s.name == p.schema_name && s.ignore_reason.is_some());
        if !included.contains(&n) && !ignored {
            cx.error_spanned_by(
                &p.ident,
                format!(
                    "static parameter `{n}` needs a cache-key policy: list it in `cache_key = [...]` \
                     if it changes the emitted module, or give the reason it does not in \
                     `ignore_in_cache_key({n} = \"...\")`"
                ),
            );
        }
    }
    out
}

fn check_schema(
    cx: &mut Ctxt,
    attrs: &Attrs,
    k: &Kernel,
) -> (Vec<String>, Vec<(String, usize, BindingModel)>) {
    let schema: Vec<String> = match attrs.schema.get() {
        Some((names, _)) => names.iter().map(|n| n.unraw().to_string()).collect(),
        None => k
            .params
            .iter()
            .filter(|p| matches!(p.kind, ParamKind::Tensor(_) | ParamKind::Static(..)))
            .map(|p| p.schema_name.clone())
            .collect(),
    };
    let mut bindings = Vec::new();
    for p in &k.params {
        let kind = match p.kind {
            ParamKind::Tensor(i) => BindingModel::Tensor(i),
            ParamKind::Static(i, _) => BindingModel::Static(i),
            // Outputs, scratch and the kernel handle are not arguments of the op.
            _ => continue,
        };
        match schema.iter().position(|s| *s == p.schema_name) {
            Some(pos) => bindings.push((p.schema_name.clone(), pos, kind)),
            None => cx.error_spanned_by(
                &p.ident,
                format!(
                    "parameter `{}` is not an argument of `schema({})`; a kernel parameter binds \
                     to the schema argument of the same name (`self_` binds to `self`)",
                    p.schema_name,
                    schema.join(", ")
                ),
            ),
        }
    }
    (schema, bindings)
}

/// Guards from `same_dtype` and `shapes(...)`, and where each named dimension first appears.
fn check_shapes(
    cx: &mut Ctxt,
    attrs: &Attrs,
    k: &Kernel,
) -> (Vec<GuardModel>, BTreeMap<String, DimPos>) {
    let mut guards = Vec::new();
    let mut dims: BTreeMap<String, DimPos> = BTreeMap::new();
    if attrs.same_dtype.is_set() {
        guards.push(GuardModel::SameDType);
    }
    let tensor_names = k.tensor_names();
    for decl in attrs.shapes.get().into_iter().flatten() {
        let pname = decl.param.unraw().to_string();
        let Some(input) = k.tensor_index(&pname) else {
            let what =
                if k.param(&pname).is_some() { "a static parameter" } else { "not a parameter" };
            cx.error_spanned_by(
                &decl.param,
                format!(
                    "`{pname}` is {what}; `shapes` describes tensor parameters ({})",
                    known(&tensor_names)
                ),
            );
            continue;
        };
        if let Some((dtype, _)) = decl.dtype {
            guards.push(GuardModel::DTypeIs { input, dtype });
        }
        let rest = decl.dims.iter().position(|d| matches!(d, DimDecl::Rest(_)));
        let fixed = decl.dims.len() - usize::from(rest.is_some());
        guards.push(GuardModel::Rank {
            input,
            min: fixed,
            max: if rest.is_some() { None } else { Some(fixed) },
        });
        for (j, d) in decl.dims.iter().enumerate() {
            let pos: i64 = match rest {
                Some(r) if j > r => j as i64 - decl.dims.len() as i64,
                _ => j as i64,
            };
            match d {
                DimDecl::Named(id) => {
                    let n = id.unraw().to_string();
                    if k.param(&n).is_some() {
                        cx.error_spanned_by(
                            id,
                            format!("dimension name `{n}` is also a parameter name"),
                        );
                    }
                    match dims.get(&n) {
                        Some(first) => {
                            guards.push(GuardModel::SameDim { a: *first, b: (input, pos) })
                        }
                        None => {
                            dims.insert(n, (input, pos));
                        }
                    }
                }
                DimDecl::Static(size) => {
                    guards.push(GuardModel::DimEq { input, dim: pos, size: *size })
                }
                DimDecl::Any | DimDecl::Rest(_) => {}
            }
        }
    }
    (guards, dims)
}

const REQUIRE_FORMS: &str = "expected `D % 128 == 0`, `D == 64` (D a dimension named in \
                             `shapes`) or `param == value` (a static parameter)";

fn check_require(
    cx: &mut Ctxt,
    attrs: &Attrs,
    k: &Kernel,
    dims: &BTreeMap<String, DimPos>,
    guards: &mut Vec<GuardModel>,
) {
    for expr in attrs.require.get().into_iter().flatten() {
        let Expr::Binary(syn::ExprBinary { left, op: syn::BinOp::Eq(_), right, .. }) = expr else {
            cx.error_spanned_by(expr, format!("bad shape expression: {REQUIRE_FORMS}"));
            continue;
        };
        // D % n == 0
        if let Expr::Binary(syn::ExprBinary { left: l, op: syn::BinOp::Rem(_), right: r, .. }) =
            &**left
        {
            let Some((input, dim)) = expr_ident(l).and_then(|n| dims.get(&n).copied()) else {
                cx.error_spanned_by(
                    l,
                    format!("`{}` is not a dimension named in `shapes`", l.to_token_stream()),
                );
                continue;
            };
            match (int_value(r), int_value(right)) {
                (Some(by), Some(0)) if by > 0 => {
                    guards.push(GuardModel::DivisibleBy { input, dim, by: by as u64 });
                }
                _ => cx.error_spanned_by(expr, format!("bad shape expression: {REQUIRE_FORMS}")),
            }
            continue;
        }
        let Some(n) = expr_ident(left) else {
            cx.error_spanned_by(left, format!("bad shape expression: {REQUIRE_FORMS}"));
            continue;
        };
        if let Some(&(input, dim)) = dims.get(&n) {
            match int_value(right) {
                Some(size) if size >= 0 => {
                    guards.push(GuardModel::DimEq { input, dim, size: size as u64 })
                }
                _ => cx.error_spanned_by(right, "a dimension equals a non-negative integer"),
            }
        } else if let Some((p, kind)) = k.statics().find(|(p, _)| p.ident.unraw() == n) {
            match static_value_text(kind, right) {
                Some(value) => {
                    guards.push(GuardModel::StaticEq { name: p.schema_name.clone(), value })
                }
                None => cx.error_spanned_by(
                    right,
                    format!(
                        "`{n}` is a {}: compare it with a {} literal",
                        kind.rust(),
                        kind.rust()
                    ),
                ),
            }
        } else {
            let mut names: Vec<String> = dims.keys().cloned().collect();
            names.extend(k.static_names());
            cx.error_spanned_by(
                left,
                format!("`{n}` is neither a dimension named in `shapes` nor a static parameter (known: {})", known(&names)),
            );
        }
    }
}

fn check_canonical(
    cx: &mut Ctxt,
    attrs: &Attrs,
    k: &Kernel,
    statics: &[StaticModel],
) -> Vec<String> {
    let mut out = Vec::new();
    let n_tensors = k.tensors().count();
    for lit in attrs.canonical.get().into_iter().flatten() {
        let text = lit.value();
        if let Err(e) = parse_canonical(&text, n_tensors, statics) {
            cx.error_spanned_by(lit, format!("bad canonical signature `{text}`: {e}"));
        }
        out.push(text);
    }
    out
}

fn parse_canonical(text: &str, n_tensors: usize, statics: &[StaticModel]) -> Result<(), String> {
    let (tensors, given) = text.split_once(';').unwrap_or((text, ""));
    let mut count = 0;
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in tensors.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                TensorType::parse_short(&tensors[start..i])?;
                count += 1;
                start = i + 1;
            }
            _ => {}
        }
    }
    if !tensors[start..].trim().is_empty() {
        TensorType::parse_short(&tensors[start..])?;
        count += 1;
    }
    if count != n_tensors {
        return Err(format!("the kernel takes {n_tensors} tensors, the signature gives {count}"));
    }
    for item in given.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) =
            item.split_once('=').ok_or_else(|| format!("`{item}` is not `name=value`"))?;
        let (name, value) = (name.trim(), value.trim());
        let Some(p) = statics.iter().find(|s| s.name == name) else {
            let names: Vec<String> = statics.iter().map(|s| s.name.clone()).collect();
            return Err(format!(
                "no static parameter `{name}` (static parameters: {})",
                known(&names)
            ));
        };
        let ok = match p.kind {
            StaticType::Int => value.parse::<i64>().is_ok(),
            StaticType::Float => value.parse::<f64>().is_ok(),
            StaticType::Bool => value == "true" || value == "false",
            StaticType::Str => true,
        };
        if !ok {
            return Err(format!("`{value}` is not a {} for `{name}`", p.kind.rust()));
        }
    }
    Ok(())
}

const OUTPUT_FORMS: &str = "expected `x`, `same_as(x)`, `reduced(x, -1)`, `like(x, [M, N])` or \
                            `tensor(f32, [M, N])`";

fn check_output(
    cx: &mut Ctxt,
    attrs: &Attrs,
    k: &Kernel,
    dims: &BTreeMap<String, DimPos>,
) -> OutputModel {
    if let Some(path) = attrs.output_fn.get() {
        if let Some((_, span)) = attrs.output.get() {
            cx.error_at(*span, "give either `output` or `output_fn`, not both");
        }
        return OutputModel::Fn(path.clone());
    }
    let Some((items, span)) = attrs.output.get() else { return OutputModel::Build };
    if let Some(r) = &k.returns
        && r.count != items.len()
    {
        let has = if k.tiled { "the kernel has output blocks:" } else { "the function returns" };
        cx.error_at(
            *span,
            format!("`output` describes {} outputs, {has} {}", items.len(), r.count),
        );
    }
    let tensor = |cx: &mut Ctxt, e: &Expr| -> Option<usize> {
        let idx = expr_ident(e).and_then(|n| k.tensor_index(&n));
        if idx.is_none() {
            cx.error_spanned_by(
                e,
                format!(
                    "`{}` is not a tensor parameter ({})",
                    e.to_token_stream(),
                    known(&k.tensor_names())
                ),
            );
        }
        idx
    };
    let mut specs = Vec::new();
    for item in items {
        let spec = match item {
            Expr::Path(_) => tensor(cx, item).map(SpecModel::SameAs),
            Expr::Call(call) => {
                let f = expr_ident(&call.func).unwrap_or_default();
                let args: Vec<&Expr> = call.args.iter().collect();
                match (f.as_str(), args.as_slice()) {
                    ("same_as", [x]) => tensor(cx, x).map(SpecModel::SameAs),
                    ("reduced", [x, d]) => match (tensor(cx, x), int_value(d)) {
                        (Some(i), Some(d)) => Some(SpecModel::Reduced(i, d)),
                        (_, None) => {
                            cx.error_spanned_by(d, "expected a dimension index");
                            None
                        }
                        _ => None,
                    },
                    ("like", [x, shape]) => {
                        let i = tensor(cx, x);
                        let dims = out_dims(cx, shape, dims);
                        i.zip(dims).map(|(i, d)| SpecModel::Shape(OutDTypeModel::Of(i), d))
                    }
                    ("tensor", [t, shape]) => {
                        let dt = expr_ident(t).and_then(|n| DType::from_name(&n));
                        if dt.is_none() {
                            cx.error_spanned_by(t, "unsupported dtype");
                        }
                        let dims = out_dims(cx, shape, dims);
                        dt.zip(dims)
                            .map(|(d, dims)| SpecModel::Shape(OutDTypeModel::Fixed(d), dims))
                    }
                    _ => {
                        cx.error_spanned_by(item, format!("bad output rule: {OUTPUT_FORMS}"));
                        None
                    }
                }
            }
            _ => {
                cx.error_spanned_by(item, format!("bad output rule: {OUTPUT_FORMS}"));
                None
            }
        };
        specs.extend(spec);
    }
    OutputModel::Specs(specs)
}

fn out_dims(
    cx: &mut Ctxt,
    shape: &Expr,
    dims: &BTreeMap<String, DimPos>,
) -> Option<Vec<OutDimModel>> {
    let Expr::Array(a) = shape else {
        cx.error_spanned_by(shape, "expected a list of dimensions: `[M, N, 1]`");
        return None;
    };
    let mut out = Vec::new();
    let mut ok = true;
    for e in &a.elems {
        if let Some(n) = int_value(e).filter(|n| *n >= 0) {
            out.push(OutDimModel::Static(n as u64));
        } else if let Some(&(i, d)) = expr_ident(e).and_then(|n| dims.get(&n)) {
            out.push(OutDimModel::Of(i, d));
        } else {
            cx.error_spanned_by(e, "expected a dimension named in `shapes` or a size");
            ok = false;
        }
    }
    ok.then_some(out)
}

fn check_import(
    cx: &mut Ctxt,
    attrs: &Attrs,
    k: &Kernel,
    output: &mut OutputModel,
) -> Option<ImportModel> {
    let import = attrs.import.get();
    match (&k.item.body, import) {
        (Some(body), Some(_)) => {
            cx.error_at(
                body.brace_token.span.join(),
                "an imported kernel has no body: end the declaration with `;`",
            );
        }
        (None, None) => {
            let semi = k.item.semi.map(|s| s.span).unwrap_or_else(Span::call_site);
            cx.error_at(
                semi,
                "a kernel without a body must import its module: `import(tpu = \"...\", cpu = \"...\")`",
            );
        }
        _ => {}
    }
    let import = import?;
    if k.returns.as_ref().is_some_and(|r| r.fallible)
        && let syn::ReturnType::Type(_, ty) = &k.item.sig.output
    {
        cx.error_spanned_by(ty, "an imported kernel returns tensors, not a `Result`");
    }
    // Every tensor needs a declared type to check the module against.
    let decls: Vec<Option<&ShapeDecl>> = k
        .tensors()
        .map(|p| {
            attrs.shapes.get().and_then(|s| s.iter().find(|d| d.param.unraw() == p.ident.unraw()))
        })
        .collect();
    for (p, d) in k.tensors().zip(&decls) {
        match d {
            None => cx.error_spanned_by(
                &p.ident,
                format!(
                    "imported kernel parameter `{}` needs a declared type to check against the \
                     module: add `shapes({} = f32[...])`",
                    p.ident, p.ident
                ),
            ),
            Some(d) if d.dtype.is_none() => cx.error_at(
                d.span,
                format!(
                    "imported kernel parameter `{}` needs a dtype: `{} = f32[...]`",
                    p.ident, p.ident
                ),
            ),
            Some(d) => {
                if let Some(DimDecl::Rest(s)) =
                    d.dims.iter().find(|x| matches!(x, DimDecl::Rest(_)))
                {
                    cx.error_at(*s, "`..` cannot describe an imported module's fixed rank");
                }
            }
        }
    }
    if let Some(platforms) = attrs.platforms.get() {
        for (p, span) in platforms {
            let have = match *p {
                "tpu" => import.tpu.is_set(),
                _ => import.cpu.is_set(),
            };
            if !have {
                let file = if *p == "tpu" { "tpu" } else { "cpu" };
                cx.error_at(
                    *span,
                    format!("platform `{p}` needs an imported module: `import({file} = \"...\")`"),
                );
            }
        }
    }
    let mut first_results: Option<Vec<TensorType>> = None;
    let mut read = |cx: &mut Ctxt, lit: Option<&LitStr>| -> Option<ImportFile> {
        let lit = lit?;
        let (file, results) = read_import(cx, k, &decls, lit)?;
        if first_results.is_none() {
            first_results = Some(results);
        }
        Some(file)
    };
    let tpu = read(cx, import.tpu.get());
    let cpu = read(cx, import.cpu.get());
    if let (Some(dtypes), Some(Some(first))) = (attrs.dtypes.get(), decls.first())
        && let Some((declared, _)) = first.dtype
    {
        for (d, span) in dtypes {
            if *d != declared {
                cx.error_at(
                    *span,
                    format!(
                        "the imported module takes {} for `{}`; it cannot accept {}",
                        declared.short_name(),
                        first.param,
                        d.short_name()
                    ),
                );
            }
        }
    }
    if matches!(output, OutputModel::Build)
        && let Some(results) = first_results
    {
        let mut specs = Vec::new();
        for r in results {
            let dims: Option<Vec<OutDimModel>> =
                r.shape.0.iter().map(|d| d.as_static().map(OutDimModel::Static)).collect();
            match dims {
                Some(dims) => specs.push(SpecModel::Shape(OutDTypeModel::Fixed(r.dtype), dims)),
                None => {
                    cx.error_at(
                            import.span,
                            format!("the imported module's result {r} has dynamic dimensions: give `output = ...`"),
                        );
                    return None;
                }
            }
        }
        *output = OutputModel::Specs(specs);
    }
    Some(ImportModel { tpu, cpu })
}

fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from).unwrap_or_default()
}

/// Reads one imported module, checks its `@main` against the declaration, and fingerprints it.
fn read_import(
    cx: &mut Ctxt,
    k: &Kernel,
    decls: &[Option<&ShapeDecl>],
    lit: &LitStr,
) -> Option<(ImportFile, Vec<TensorType>)> {
    let rel = lit.value();
    let text = match std::fs::read_to_string(manifest_dir().join(&rel)) {
        Ok(t) => t,
        Err(e) => {
            cx.error_spanned_by(
                lit,
                format!(
                    "cannot read `{rel}` (relative to the crate's Cargo.toml): {}",
                    io_message(&e)
                ),
            );
            return None;
        }
    };
    let module = match reader::parse_module(&text) {
        Ok(m) => m,
        Err(e) => {
            cx.error_spanned_by(lit, format!("`{rel}` is not a StableHLO module: {e}"));
            return None;
        }
    };
    let main = match module.main() {
        Ok(m) => m,
        Err(e) => {
            cx.error_spanned_by(lit, format!("`{rel}`: {e}"));
            return None;
        }
    };
    let tensors: Vec<_> = k.tensors().collect();
    if main.args.len() != tensors.len() {
        cx.error_spanned_by(
            &k.item.sig.ident,
            format!(
                "`{rel}`: @{} takes {} arguments, the kernel declares {} tensor parameters",
                main.name,
                main.args.len(),
                tensors.len()
            ),
        );
        return None;
    }
    if let Some(r) = &k.returns
        && r.count != main.results.len()
    {
        cx.error_at(
            r.span,
            format!(
                "`{rel}`: @{} returns {} results, the kernel returns {}",
                main.name,
                main.results.len(),
                r.count
            ),
        );
    }
    let mut bound: BTreeMap<String, u64> = BTreeMap::new();
    for ((p, decl), arg) in tensors.iter().zip(decls).zip(&main.args) {
        let Some(decl) = decl else { continue };
        let Some((dtype, _)) = decl.dtype else { continue };
        let ty = &arg.ty;
        let declared = describe(dtype, &decl.dims);
        let mismatch = |cx: &mut Ctxt, why: String| {
            cx.error_spanned_by(
                &p.ident,
                format!("`{}` is declared {declared} but `{rel}` takes {ty}: {why}", p.ident),
            );
        };
        if ty.dtype != dtype {
            mismatch(
                cx,
                format!("element type {} != {}", dtype.short_name(), ty.dtype.short_name()),
            );
            continue;
        }
        if decl.dims.iter().any(|d| matches!(d, DimDecl::Rest(_))) {
            continue;
        }
        if ty.rank() != decl.dims.len() {
            mismatch(cx, format!("rank {} != {}", decl.dims.len(), ty.rank()));
            continue;
        }
        for (j, (d, actual)) in decl.dims.iter().zip(&ty.shape.0).enumerate() {
            match (d, actual) {
                (DimDecl::Static(n), Dim::Static(m)) if n != m => {
                    mismatch(cx, format!("dimension {j} is {m}, not {n}"));
                }
                (DimDecl::Named(id), Dim::Static(m)) => {
                    let n = id.unraw().to_string();
                    match bound.get(&n) {
                        Some(prev) if prev != m => mismatch(
                            cx,
                            format!("dimension {j} (`{n}`) is {m}, but `{n}` is {prev} elsewhere"),
                        ),
                        _ => {
                            bound.insert(n, *m);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let fingerprint = match reader::content_fingerprint(&text) {
        Ok(f) => f,
        Err(e) => {
            cx.error_spanned_by(lit, format!("`{rel}`: {e}"));
            return None;
        }
    };
    let results = main.results.iter().map(|r| r.ty.clone()).collect();
    Some((ImportFile { path: rel, span: lit.span(), fingerprint }, results))
}

fn describe(dtype: DType, dims: &[DimDecl]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| match d {
            DimDecl::Named(i) => i.to_string(),
            DimDecl::Static(n) => n.to_string(),
            DimDecl::Any => "_".to_owned(),
            DimDecl::Rest(_) => "..".to_owned(),
        })
        .collect();
    format!("{}[{}]", dtype.short_name(), parts.join(", "))
}

/// An I/O error's message without the OS error number, so messages read the same everywhere.
fn io_message(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        std::io::ErrorKind::IsADirectory => "it is a directory".to_owned(),
        std::io::ErrorKind::InvalidData => "it is not UTF-8 text".to_owned(),
        _ => e.to_string(),
    }
}

impl StaticModel {
    pub fn kind_variant(&self) -> &'static str {
        self.kind.variant()
    }
}

impl ImportFile {
    pub fn lit(&self) -> LitStr {
        LitStr::new(&self.path, self.span)
    }
}
