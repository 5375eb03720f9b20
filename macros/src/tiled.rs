//! The tiled form: `tiled(tiles(...), grid = [...], semantics = [...], prefetch(...),
//! inputs(...), outputs(...), scratch(...), aliases(...), vmem_limit = ...)`, checked against
//! the function and turned into the kernel's plan (tile sizes, grid, blocks per signature) and
//! its builder.
//!
//! Sizes are expressions over the dimensions named in `shapes`, earlier tiles and integers:
//! `+ - * / %` (`/` must divide exactly), `min`, `max`, `cdiv`, `round_up`, `numel(x)` and
//! `tile(D, max, align)` (the largest multiple of `align` up to `max` dividing `D`, or `D`
//! itself when `D <= max`). Everything the macro can know without a signature (the tiling rule
//! for literal blocks, index maps against the grid, scratch sizes, matmul operand blocks) is
//! checked here, with spans; the rest is checked per signature when the kernel is built.

use std::collections::BTreeMap;

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Expr, Ident, Token};

use crate::ast::{Kernel, ParamKind};
use crate::attr::{Attrs, DimDecl, expr_ident, int_value};
use crate::check::{DimPos, Model, OutDimModel, OutputModel, SpecModel};
use crate::ctxt::Ctxt;
use crate::types::DType;

/// Keys of `tiled(...)`.
pub const KEYS: &[&str] = &[
    "tiles",
    "grid",
    "semantics",
    "prefetch",
    "inputs",
    "outputs",
    "scratch",
    "aliases",
    "vmem_limit",
];

/// The VMEM of one TensorCore (v5e, v6e): the most `vmem_limit` may ask for
/// (`tpu_kernels::mosaic::check::VMEM_CAPACITY`).
const VMEM_CAPACITY: u64 = 128 << 20;

/// The sublane and lane tiling of a block's last two dims (`tpu_kernels::mosaic::check`).
const TILING: (u64, u64) = (8, 128);

/// The largest scoped VMEM of a target the project compiles for (v6e, 32 MiB).
const MAX_SCOPED_VMEM: u64 = 32 << 20;

/// A size expression.
#[derive(Clone)]
pub enum SizeExpr {
    Lit(u64),
    /// A dimension named in `shapes`.
    Dim(String),
    /// An earlier tile.
    Tile(String),
    /// The element count of input `n`.
    Numel(usize),
    Binary(char, Box<SizeExpr>, Box<SizeExpr>),
    Call(&'static str, Vec<SizeExpr>),
}

/// One entry of an index map.
#[derive(Clone)]
pub enum IndexEntry {
    Grid(usize),
    Const(i64),
    /// `g / group`: a grid index divided (floor) by a size; `g / d % m` (or `g % m`) also takes
    /// the quotient modulo a size.
    GridDiv(usize, SizeExpr, Option<SizeExpr>),
    /// `table[axis]`: a scalar-prefetch table read at a grid index.
    Prefetch {
        table: usize,
        axis: usize,
    },
}

pub struct WindowModel {
    pub name: String,
    pub span: Span,
    pub block: Vec<(SizeExpr, String, Span)>,
    pub index_map: Vec<IndexEntry>,
    /// The index map's entries, for errors.
    pub index_spans: Vec<Span>,
    pub view: Option<Vec<SizeExpr>>,
}

pub struct ScratchModel {
    pub name: String,
    pub span: Span,
    /// In SMEM (scalar memory, one element at a time) rather than VMEM.
    pub smem: bool,
    pub dtype: DType,
    pub dims: Vec<(SizeExpr, String)>,
}

/// What the generated `kernel(sig)` passes for each function parameter.
#[derive(Clone, Copy)]
pub enum CallArg {
    Ctx,
    Prefetch(usize),
    Input(usize),
    Output(usize),
    Scratch(usize),
    Static(usize),
}

pub struct TiledModel {
    pub tiles: Vec<(Ident, SizeExpr)>,
    pub grid: Vec<SizeExpr>,
    pub parallel: Vec<bool>,
    /// The scalar-prefetch tables: the first tensor parameters, by name.
    pub prefetch: Vec<String>,
    pub inputs: Vec<WindowModel>,
    pub outputs: Vec<WindowModel>,
    pub scratch: Vec<ScratchModel>,
    pub args: Vec<CallArg>,
    pub fallible: bool,
    /// `(input, output)` windows that are one buffer.
    pub aliases: Vec<(usize, usize)>,
    /// The kernel's scoped VMEM limit in bytes, when it sets one.
    pub vmem_limit: Option<u64>,
}

/// The raw pieces of `tiled(...)`, before they are checked against the function.
#[derive(Default)]
struct Raw {
    tiles: Option<(Span, Vec<(Ident, Expr)>)>,
    grid: Option<(Span, Vec<Expr>)>,
    semantics: Option<(Span, Vec<Expr>)>,
    prefetch: Option<(Span, Vec<Ident>)>,
    inputs: Option<(Span, Vec<(Ident, Expr)>)>,
    outputs: Option<(Span, Vec<(Ident, Expr)>)>,
    scratch: Option<(Span, Vec<(Ident, Expr)>)>,
    aliases: Option<(Span, Vec<(Ident, Expr)>)>,
    vmem_limit: Option<(Span, Expr)>,
    /// `tiled(...)` did not parse: what follows its syntax error would be noise.
    malformed: bool,
}

fn parse_named(stream: TokenStream) -> syn::Result<Vec<(Ident, Expr)>> {
    let parser = |input: ParseStream<'_>| {
        let mut out = Vec::new();
        while !input.is_empty() {
            let name: Ident = input.call(Ident::parse_any)?;
            input.parse::<Token![=]>()?;
            let value: Expr = input.parse()?;
            out.push((name, value));
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(out)
    };
    parser.parse2(stream)
}

fn array_items(expr: Expr) -> Vec<Expr> {
    match expr {
        Expr::Array(a) => a.elems.into_iter().collect(),
        other => vec![other],
    }
}

fn parse_raw(cx: &mut Ctxt, group: &proc_macro2::Group) -> Raw {
    let mut raw = Raw::default();
    let parser = syn::meta::parser(|meta| {
        let key = meta.path.get_ident().map(|i| i.unraw().to_string()).unwrap_or_default();
        let span = meta.path.span();
        let dup = |cx: &mut Ctxt, set: bool| {
            if set {
                cx.error_at(span, format!("duplicate `{key}` in `tiled`: give it once"));
            }
        };
        match key.as_str() {
            "grid" | "semantics" => {
                let value: Expr = meta.value()?.parse()?;
                let slot = if key == "grid" { &mut raw.grid } else { &mut raw.semantics };
                dup(cx, slot.is_some());
                *slot = Some((span, array_items(value)));
            }
            "vmem_limit" => {
                let value: Expr = meta.value()?.parse()?;
                dup(cx, raw.vmem_limit.is_some());
                raw.vmem_limit = Some((span, value));
            }
            "prefetch" => {
                let content;
                syn::parenthesized!(content in meta.input);
                let names = content.parse_terminated(Ident::parse_any, Token![,])?;
                dup(cx, raw.prefetch.is_some());
                raw.prefetch = Some((span, names.into_iter().collect()));
            }
            "tiles" | "inputs" | "outputs" | "scratch" | "aliases" => {
                let content;
                syn::parenthesized!(content in meta.input);
                let items = parse_named(content.parse()?)?;
                let slot = match key.as_str() {
                    "tiles" => &mut raw.tiles,
                    "inputs" => &mut raw.inputs,
                    "outputs" => &mut raw.outputs,
                    "aliases" => &mut raw.aliases,
                    _ => &mut raw.scratch,
                };
                dup(cx, slot.is_some());
                *slot = Some((span, items));
            }
            _ => {
                cx.error_at(
                    span,
                    format!("unknown key `{key}` in `tiled`; known: {}", KEYS.join(", ")),
                );
                while !meta.input.is_empty() && !meta.input.peek(Token![,]) {
                    meta.input.parse::<proc_macro2::TokenTree>()?;
                }
            }
        }
        Ok(())
    });
    if let Err(e) = parser.parse2(group.stream()) {
        cx.error_at(e.span(), format!("bad `tiled(...)`: {e}"));
        raw.malformed = true;
    }
    raw
}

/// The names a size expression may use.
struct Names<'a> {
    dims: &'a BTreeMap<String, DimPos>,
    tiles: Vec<(String, SizeExpr)>,
    /// Tiles whose definition is in error: a use of one is not a second error.
    broken: Vec<String>,
    k: &'a Kernel,
}

impl Names<'_> {
    fn known(&self) -> String {
        let mut v: Vec<String> = self.dims.keys().cloned().collect();
        v.extend(self.tiles.iter().map(|(n, _)| n.clone()));
        if v.is_empty() { "none".to_owned() } else { v.join(", ") }
    }

    fn size(&self, cx: &mut Ctxt, e: &Expr) -> Option<SizeExpr> {
        match e {
            Expr::Lit(_) | Expr::Unary(_) => match int_value(e) {
                Some(v) if v >= 0 => Some(SizeExpr::Lit(v as u64)),
                _ => {
                    cx.error_spanned_by(e, "a size is a non-negative integer");
                    None
                }
            },
            Expr::Paren(p) => self.size(cx, &p.expr),
            Expr::Group(g) => self.size(cx, &g.expr),
            Expr::Path(_) => {
                let n = expr_ident(e).unwrap_or_default();
                if self.tiles.iter().any(|(t, _)| *t == n) {
                    Some(SizeExpr::Tile(n))
                } else if self.dims.contains_key(&n) {
                    Some(SizeExpr::Dim(n))
                } else if self.broken.contains(&n) {
                    None
                } else {
                    cx.error_spanned_by(
                        e,
                        format!(
                            "unknown dimension `{}`: sizes use dimensions named in `shapes` and \
                             earlier `tiles` (known: {})",
                            e.to_token_stream(),
                            self.known()
                        ),
                    );
                    None
                }
            }
            Expr::Binary(b) => {
                let op = match b.op {
                    syn::BinOp::Add(_) => '+',
                    syn::BinOp::Sub(_) => '-',
                    syn::BinOp::Mul(_) => '*',
                    syn::BinOp::Div(_) => '/',
                    syn::BinOp::Rem(_) => '%',
                    _ => {
                        cx.error_spanned_by(
                            b.op,
                            "a size combines with `+ - * / %` (`/` divides exactly)",
                        );
                        return None;
                    }
                };
                let (l, r) = (self.size(cx, &b.left), self.size(cx, &b.right));
                let e = SizeExpr::Binary(op, Box::new(l?), Box::new(r?));
                // Known operands without a value: a size that no signature can have.
                if let SizeExpr::Binary(_, l, r) = &e
                    && let (Some(a), Some(c)) = (l.value(&self.tiles), r.value(&self.tiles))
                    && e.value(&self.tiles).is_none()
                {
                    let why = match op {
                        '/' | '%' if c == 0 => "it divides by 0".to_owned(),
                        '/' => format!("{c} does not divide {a} (`/` divides exactly)"),
                        '-' => "it is negative".to_owned(),
                        _ => "it overflows".to_owned(),
                    };
                    cx.error_spanned_by(b, format!("size `{a} {op} {c}`: {why}"));
                    return None;
                }
                Some(e)
            }
            Expr::Call(c) => {
                let f = expr_ident(&c.func).unwrap_or_default();
                let args: Vec<&Expr> = c.args.iter().collect();
                if f == "numel" {
                    let [x] = args.as_slice() else {
                        cx.error_spanned_by(c, "`numel(x)` takes one input");
                        return None;
                    };
                    let name = expr_ident(x).unwrap_or_default();
                    return match self.k.tensor_index(&name) {
                        Some(i) => Some(SizeExpr::Numel(i)),
                        None => {
                            cx.error_spanned_by(
                                x,
                                format!(
                                    "`numel` takes an input block ({})",
                                    self.k.tensor_names().join(", ")
                                ),
                            );
                            None
                        }
                    };
                }
                let (name, arity): (&'static str, usize) = match f.as_str() {
                    "min" => ("min", 2),
                    "max" => ("max", 2),
                    "cdiv" => ("cdiv", 2),
                    "round_up" => ("round_up", 2),
                    "broadcast" => ("broadcast", 2),
                    "tile" => ("tile", 3),
                    _ => {
                        cx.error_spanned_by(
                            &c.func,
                            format!(
                                "unknown size function `{f}`; known: min, max, cdiv, round_up, \
                                 broadcast(M, D), tile(D, max, align), numel(x)"
                            ),
                        );
                        return None;
                    }
                };
                if args.len() != arity {
                    cx.error_spanned_by(
                        c,
                        format!("`{name}` takes {arity} arguments, {} given", args.len()),
                    );
                    return None;
                }
                let parsed: Vec<Option<SizeExpr>> = args.iter().map(|a| self.size(cx, a)).collect();
                let parsed: Option<Vec<SizeExpr>> = parsed.into_iter().collect();
                let parsed = parsed?;
                if name == "tile"
                    && let (Some(max), Some(align)) =
                        (parsed[1].value(&self.tiles), parsed[2].value(&self.tiles))
                    && (align == 0 || max < align || max % align != 0)
                {
                    cx.error_spanned_by(
                        c,
                        format!(
                            "`tile(_, {max}, {align})`: the largest tile must be a positive \
                             multiple of the alignment"
                        ),
                    );
                    return None;
                }
                if name == "broadcast"
                    && let (Some(m), Some(d)) =
                        (parsed[0].value(&self.tiles), parsed[1].value(&self.tiles))
                    && m != 1
                    && m != d
                {
                    cx.error_spanned_by(
                        c,
                        format!(
                            "`broadcast({m}, {d})`: {m} broadcasts to {d} only if it is 1 or {d}"
                        ),
                    );
                    return None;
                }
                Some(SizeExpr::Call(name, parsed))
            }
            other => {
                cx.error_spanned_by(
                    other,
                    "a size is an integer, a dimension, a tile, `a + b`, `a / b`, `min(a, b)`, \
                     `tile(D, max, align)` or `numel(x)`",
                );
                None
            }
        }
    }
}

impl SizeExpr {
    /// The value, when it does not depend on a signature.
    fn value(&self, tiles: &[(String, SizeExpr)]) -> Option<u64> {
        match self {
            SizeExpr::Lit(v) => Some(*v),
            SizeExpr::Tile(t) => tiles.iter().find(|(n, _)| n == t)?.1.value(tiles),
            SizeExpr::Dim(_) | SizeExpr::Numel(_) => None,
            SizeExpr::Binary(op, a, b) => {
                let (a, b) = (a.value(tiles)?, b.value(tiles)?);
                match op {
                    '+' => a.checked_add(b),
                    '-' => a.checked_sub(b),
                    '*' => a.checked_mul(b),
                    '/' => (b != 0 && a % b == 0).then(|| a / b),
                    _ => (b != 0).then(|| a % b),
                }
            }
            SizeExpr::Call(f, args) => {
                let v: Option<Vec<u64>> = args.iter().map(|a| a.value(tiles)).collect();
                let v = v?;
                match *f {
                    "min" => Some(v[0].min(v[1])),
                    "max" => Some(v[0].max(v[1])),
                    "cdiv" => (v[1] != 0).then(|| v[0].div_ceil(v[1])),
                    "round_up" => {
                        (v[1] != 0).then(|| v[0].div_ceil(v[1]).checked_mul(v[1])).flatten()
                    }
                    "broadcast" => (v[0] == 1 || v[0] == v[1]).then_some(v[0]),
                    _ => None,
                }
            }
        }
    }

    /// The expression with tiles replaced by their definitions, as text: two sizes with one
    /// resolved text are equal at every signature.
    fn resolved(&self, tiles: &[(String, SizeExpr)]) -> String {
        match self {
            SizeExpr::Lit(v) => v.to_string(),
            SizeExpr::Dim(d) => d.clone(),
            SizeExpr::Tile(t) => match tiles.iter().find(|(n, _)| n == t) {
                Some((_, e)) => e.resolved(tiles),
                None => t.clone(),
            },
            SizeExpr::Numel(i) => format!("numel({i})"),
            SizeExpr::Binary(op, a, b) => {
                format!("({} {op} {})", a.resolved(tiles), b.resolved(tiles))
            }
            SizeExpr::Call(f, args) => {
                let a: Vec<String> = args.iter().map(|a| a.resolved(tiles)).collect();
                format!("{f}({})", a.join(", "))
            }
        }
    }

    /// Code computing the size (`u64`) inside the generated plan, which returns
    /// `Result<_, String>`.
    fn tokens(&self, p: &TokenStream) -> TokenStream {
        match self {
            SizeExpr::Lit(v) => quote!(#v),
            SizeExpr::Dim(n) | SizeExpr::Tile(n) => {
                let id = format_ident!("{}", n);
                quote!(#id)
            }
            SizeExpr::Numel(i) => quote!(#p::tiled_numel(__sig, #i)?),
            SizeExpr::Binary(op, a, b) => {
                let (a, b) = (a.tokens(p), b.tokens(p));
                quote!(#p::tiled_op(#op, #a, #b)?)
            }
            SizeExpr::Call(f, args) => {
                let args = args.iter().map(|a| a.tokens(p));
                quote!(#p::tiled_fn(#f, &[#(#args),*])?)
            }
        }
    }
}

/// The array dims of input `input` as `shapes` declares them (`None` per unknown dim), when
/// the declaration has no `..`.
fn declared_dims(attrs: &Attrs, k: &Kernel, input: usize) -> Option<Vec<Option<u64>>> {
    let decl = attrs
        .shapes
        .get()?
        .iter()
        .find(|d| k.tensor_index(&d.param.unraw().to_string()) == Some(input))?;
    if decl.dims.iter().any(|d| matches!(d, DimDecl::Rest(_))) {
        return None;
    }
    Some(
        decl.dims
            .iter()
            .map(|d| match d {
                DimDecl::Static(n) => Some(*n),
                _ => None,
            })
            .collect(),
    )
}

/// The declared dims of output `n` from `output = ...` (`None` per unknown dim).
fn output_dims(attrs: &Attrs, k: &Kernel, m: &Model, n: usize) -> Option<Vec<Option<u64>>> {
    let OutputModel::Specs(specs) = &m.output else { return None };
    match specs.get(n)? {
        SpecModel::SameAs(i) | SpecModel::Reduced(i, _) => declared_dims(attrs, k, *i),
        SpecModel::Shape(_, dims) => Some(
            dims.iter()
                .map(|d| match d {
                    OutDimModel::Static(v) => Some(*v),
                    OutDimModel::Of(i, d) => {
                        let decl = declared_dims(attrs, k, *i)?;
                        let idx = if *d < 0 { decl.len() as i64 + d } else { *d };
                        decl.get(usize::try_from(idx).ok()?).copied().flatten()
                    }
                })
                .collect(),
        ),
    }
}

/// Assigns each `Block` parameter its role (input, output, scratch) from `tiled(...)`, so the
/// checks of the plain form (schema, shapes, statics) see the input blocks as the tensors.
/// Returns the parsed pieces for [`check`].
pub fn assign(cx: &mut Ctxt, attrs: &Attrs, k: &mut Kernel) -> Option<Assigned> {
    let (key, group) = attrs.tiled.get()?;
    let raw = parse_raw(cx, group);
    if raw.malformed {
        return Some(Assigned { raw, span: *key });
    }
    let names = |slot: &Option<(Span, Vec<(Ident, Expr)>)>| -> Vec<String> {
        slot.as_ref()
            .map(|(_, v)| v.iter().map(|(n, _)| n.unraw().to_string()).collect())
            .unwrap_or_default()
    };
    let (ins, outs, scratch) = (names(&raw.inputs), names(&raw.outputs), names(&raw.scratch));
    let tables: Vec<String> =
        raw.prefetch.iter().flat_map(|(_, v)| v.iter().map(|n| n.unraw().to_string())).collect();
    let mut stage = 0u8;
    let (mut ni, mut no, mut ns) = (0, 0, 0);
    let mut saw_ctx = false;
    for (pos, p) in k.params.iter_mut().enumerate() {
        let name = p.ident.unraw().to_string();
        match p.kind {
            ParamKind::Ctx => {
                if pos != 0 || saw_ctx {
                    cx.error_spanned_by(&p.ident, "the `&Tiled` parameter comes first, once");
                }
                saw_ctx = true;
            }
            ParamKind::Block => {
                let (role, kind) = if tables.contains(&name) {
                    ni += 1;
                    (0, ParamKind::Tensor(ni - 1))
                } else if ins.contains(&name) {
                    ni += 1;
                    (1, ParamKind::Tensor(ni - 1))
                } else if outs.contains(&name) {
                    no += 1;
                    (2, ParamKind::Output(no - 1))
                } else if scratch.contains(&name) {
                    ns += 1;
                    (3, ParamKind::Scratch(ns - 1))
                } else {
                    cx.error_spanned_by(
                        &p.ident,
                        format!(
                            "block `{name}` has no spec: give it one in `prefetch(...)`, \
                             `inputs(...)`, `outputs(...)` or `scratch(...)` of `tiled`"
                        ),
                    );
                    continue;
                };
                if role < stage {
                    cx.error_spanned_by(
                        &p.ident,
                        format!(
                            "block `{name}` is out of order: a tiled kernel takes its \
                             scalar-prefetch tables, then its input blocks, then its output \
                             blocks, then its scratch buffers (as Pallas passes refs)"
                        ),
                    );
                }
                stage = stage.max(role);
                p.kind = kind;
            }
            _ => {}
        }
    }
    let mut seen: Vec<String> = Vec::new();
    for n in raw.prefetch.iter().flat_map(|(_, v)| v) {
        spec_name(cx, k, &mut seen, n, "prefetch table");
    }
    for (list, what) in
        [(&raw.inputs, "input"), (&raw.outputs, "output"), (&raw.scratch, "scratch")]
    {
        let mut seen: Vec<String> = Vec::new();
        for (n, _) in list.iter().flat_map(|(_, v)| v) {
            let s = n.unraw().to_string();
            spec_name(cx, k, &mut seen, n, what);
            // Reported at the later declaration: the parameter took the first kind.
            if tables.contains(&s) {
                cx.error_spanned_by(
                    n,
                    format!(
                        "`{s}` is a scalar-prefetch table (in `prefetch(...)`): a table is whole \
                         in SMEM, with no {what} spec; an index map reads it as `{s}[i]`"
                    ),
                );
                continue;
            }
            let earlier = match what {
                "output" if ins.contains(&s) => Some("an input"),
                "scratch" if ins.contains(&s) => Some("an input"),
                "scratch" if outs.contains(&s) => Some("an output"),
                _ => None,
            };
            if let Some(earlier) = earlier {
                cx.error_spanned_by(
                    n,
                    format!(
                        "`{s}` is already {earlier} block: a block is an input, an output or a \
                         scratch buffer, not two of them"
                    ),
                );
            }
        }
    }
    if raw.outputs.as_ref().is_none_or(|(_, v)| v.is_empty()) {
        cx.error_at(*key, "a tiled kernel has at least one output: `outputs(o = block(...))`");
    }
    if raw.inputs.as_ref().is_none_or(|(_, v)| v.is_empty()) {
        cx.error_at(*key, "a tiled kernel has at least one input: `inputs(x = block(...))`");
    }
    if let Some(r) = &mut k.returns {
        // The declared outputs (the assigned ones, unless a spec is in error).
        r.count = outs.len();
    }
    Some(Assigned { raw, span: *key })
}

/// Checks one name of a `prefetch`, `inputs`, `outputs` or `scratch` list (`what`): declared
/// once in it (`seen`, the names before it), and a `Block` parameter of the kernel.
fn spec_name(cx: &mut Ctxt, k: &Kernel, seen: &mut Vec<String>, n: &Ident, what: &str) {
    let s = n.unraw().to_string();
    if seen.contains(&s) {
        cx.error_spanned_by(n, format!("`{s}` is declared twice"));
    }
    seen.push(s.clone());
    match k.param(&s).map(|p| p.kind) {
        Some(ParamKind::Static(..)) | Some(ParamKind::Ctx) => cx.error_spanned_by(
            n,
            format!("`{s}` is not a `Block` parameter: a {what} spec names a block"),
        ),
        None => cx.error_spanned_by(
            n,
            format!("{what} `{s}` is not a parameter of the kernel: add `{s}: Block`"),
        ),
        _ => {}
    }
}

pub struct Assigned {
    raw: Raw,
    span: Span,
}

impl Assigned {
    /// Whether `tiled(...)` has a syntax error, past which no check is worth reporting.
    pub fn is_malformed(&self) -> bool {
        self.raw.malformed
    }
}

/// The closure `|i, j, k| (i, k)`: grid axis, constant or prefetch table read at a grid axis
/// (`ids[i]`, `tables` naming the tables) per array dim, with each entry's span.
fn index_map(
    cx: &mut Ctxt,
    names: &Names<'_>,
    e: &Expr,
    grid_rank: usize,
    tables: &[String],
    what: &str,
) -> Option<Vec<(IndexEntry, Span)>> {
    let Expr::Closure(c) = e else {
        cx.error_spanned_by(e, format!("the index map of {what} is a closure from grid indices to block indices: `|i, j| (i, 0)`"));
        return None;
    };
    if c.inputs.len() != grid_rank {
        cx.error_spanned_by(
            &c.inputs,
            format!(
                "the index map of {what} takes {} grid indices, the grid has {grid_rank} axes",
                c.inputs.len()
            ),
        );
        return None;
    }
    let mut params: Vec<Option<String>> = Vec::new();
    for p in &c.inputs {
        match p {
            syn::Pat::Ident(i) => params.push(Some(i.ident.unraw().to_string())),
            syn::Pat::Wild(_) => params.push(None),
            other => {
                cx.error_spanned_by(other, "an index map parameter is a name or `_`");
                return None;
            }
        }
    }
    let items: Vec<&Expr> = match &*c.body {
        Expr::Tuple(t) => t.elems.iter().collect(),
        Expr::Paren(p) => vec![&*p.expr],
        other => vec![other],
    };
    let mut out = Vec::new();
    for item in items {
        if let Some(v) = int_value(item) {
            if v < 0 {
                cx.error_spanned_by(item, format!("block index {v} of {what} leaves the array"));
                return None;
            }
            out.push((IndexEntry::Const(v), item.span()));
        } else if let Some(n) = expr_ident(item)
            && let Some(axis) = params.iter().position(|p| p.as_deref() == Some(n.as_str()))
        {
            out.push((IndexEntry::Grid(axis), item.span()));
        } else if let Some((n, by, modulo)) = div_mod(item)
            && let Some(axis) = params.iter().position(|p| p.as_deref() == Some(n.as_str()))
        {
            let (by, by_expr) = match by {
                Some(e) => (names.size(cx, e)?, e),
                None => (SizeExpr::Lit(1), item),
            };
            let modulo = match modulo {
                Some(e) => Some((names.size(cx, e)?, e)),
                None => None,
            };
            if by.value(&names.tiles) == Some(0) {
                cx.error_spanned_by(by_expr, format!("{what}: a grid index divided by 0"));
                return None;
            }
            if let Some((m, e)) = &modulo
                && m.value(&names.tiles) == Some(0)
            {
                cx.error_spanned_by(e, format!("{what}: a grid index taken modulo 0"));
                return None;
            }
            out.push((IndexEntry::GridDiv(axis, by, modulo.map(|(m, _)| m)), item.span()));
        } else if let Expr::Index(ix) = item {
            let name = expr_ident(&ix.expr).unwrap_or_default();
            let Some(table) = tables.iter().position(|t| *t == name) else {
                cx.error_spanned_by(
                    &ix.expr,
                    format!(
                        "`{}` is not a scalar-prefetch table: an index map reads a table named \
                         in `prefetch(...)`{}",
                        ix.expr.to_token_stream(),
                        if tables.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", tables.join(", "))
                        }
                    ),
                );
                return None;
            };
            let at = expr_ident(&ix.index);
            let Some(axis) =
                at.and_then(|a| params.iter().position(|p| p.as_deref() == Some(a.as_str())))
            else {
                cx.error_spanned_by(
                    &ix.index,
                    format!(
                        "table `{name}` is read at a grid index ({}): `{name}[i]`",
                        params.iter().flatten().cloned().collect::<Vec<_>>().join(", ")
                    ),
                );
                return None;
            };
            out.push((IndexEntry::Prefetch { table, axis }, item.span()));
        } else {
            cx.error_spanned_by(
                item,
                format!(
                    "a block index of {what} is a grid index ({}), an integer, a grid index \
                     divided by a size (`h / group`) and or taken modulo one (`g / d % m`, \
                     `g % m`), or a scalar-prefetch table at a grid index (`ids[i]`)",
                    params.iter().flatten().cloned().collect::<Vec<_>>().join(", ")
                ),
            );
            return None;
        }
    }
    Some(out)
}

/// `g / d % m`, `g / d` or `g % m`: the grid index's name, the divisor and the modulus.
fn div_mod(e: &Expr) -> Option<(String, Option<&Expr>, Option<&Expr>)> {
    let Expr::Binary(b) = e else { return None };
    match b.op {
        syn::BinOp::Div(_) => Some((expr_ident(&b.left)?, Some(&*b.right), None)),
        syn::BinOp::Rem(_) => match &*b.left {
            Expr::Binary(inner) if matches!(inner.op, syn::BinOp::Div(_)) => {
                Some((expr_ident(&inner.left)?, Some(&*inner.right), Some(&*b.right)))
            }
            left => Some((expr_ident(left)?, None, Some(&*b.right))),
        },
        _ => None,
    }
}

/// `block([bm, bk], |i, j, k| (i, k))`, optionally `.view([R, D])`.
fn window(
    cx: &mut Ctxt,
    names: &Names<'_>,
    name: &Ident,
    e: &Expr,
    grid_rank: usize,
    tables: &[String],
    what: &str,
) -> Option<WindowModel> {
    let (call, view) = match e {
        Expr::MethodCall(m) if m.method == "view" => {
            let [shape] = m.args.iter().collect::<Vec<_>>()[..] else {
                cx.error_spanned_by(m, "`.view([...])` takes the shape the kernel sees");
                return None;
            };
            let Expr::Array(a) = shape else {
                cx.error_spanned_by(shape, "`.view([...])` takes a list of sizes");
                return None;
            };
            let dims: Vec<Option<SizeExpr>> = a.elems.iter().map(|d| names.size(cx, d)).collect();
            (&*m.receiver, Some(dims.into_iter().collect::<Option<Vec<_>>>()?))
        }
        other => (other, None),
    };
    let Expr::Call(c) = call else {
        cx.error_spanned_by(
            e,
            format!("{what} is `block([sizes], |grid indices| (block indices))`"),
        );
        return None;
    };
    if expr_ident(&c.func).as_deref() != Some("block") || c.args.len() != 2 {
        cx.error_spanned_by(
            e,
            format!("{what} is `block([sizes], |grid indices| (block indices))`"),
        );
        return None;
    }
    let Expr::Array(shape) = &c.args[0] else {
        cx.error_spanned_by(&c.args[0], "a block shape is a list of sizes: `[bm, 128]`");
        return None;
    };
    let mut block = Vec::new();
    for d in &shape.elems {
        let s = names.size(cx, d)?;
        block.push((s, d.to_token_stream().to_string(), d.span()));
    }
    let map = index_map(cx, names, &c.args[1], grid_rank, tables, what)?;
    if map.len() != block.len() {
        cx.error_spanned_by(
            &c.args[1],
            format!(
                "the index map of {what} gives {} block indices for a block of rank {}",
                map.len(),
                block.len()
            ),
        );
        return None;
    }
    if let Some(v) = &view
        && v.len() != block.len()
    {
        cx.error_spanned_by(
            e,
            format!("{what}: a view of rank {} for a block of rank {}", v.len(), block.len()),
        );
        return None;
    }
    Some(WindowModel {
        name: name.unraw().to_string(),
        span: name.span(),
        block,
        index_map: map.iter().map(|(e, _)| e.clone()).collect(),
        index_spans: map.iter().map(|(_, s)| *s).collect(),
        view,
    })
}

/// Checks the tiled form against the function and the plain checks' model.
pub fn check(
    cx: &mut Ctxt,
    attrs: &Attrs,
    k: &Kernel,
    m: &Model,
    a: Assigned,
) -> Option<TiledModel> {
    let raw = a.raw;
    if m.import.is_some() || k.item.body.is_none() {
        cx.error_at(a.span, "a tiled kernel has a body: `tiled` and `import` do not go together");
        return None;
    }
    if matches!(m.output, OutputModel::Build) {
        cx.error_at(
            a.span,
            "a tiled kernel declares its output types: `output = like(x, [M, N])` (its outputs \
             are windows, not results read off a built module)",
        );
    }
    let mut names = Names { dims: &m.dims, tiles: Vec::new(), broken: Vec::new(), k };
    let mut tiles = Vec::new();
    for (id, e) in raw.tiles.iter().flat_map(|(_, v)| v) {
        let n = id.unraw().to_string();
        if m.dims.contains_key(&n) {
            cx.error_spanned_by(id, format!("tile `{n}` shadows the dimension `{n}` of `shapes`"));
            continue;
        }
        if names.tiles.iter().any(|(t, _)| *t == n) {
            cx.error_spanned_by(id, format!("tile `{n}` is defined twice"));
            continue;
        }
        match names.size(cx, e) {
            Some(s) => {
                names.tiles.push((n, s.clone()));
                tiles.push((id.clone(), s));
            }
            None => names.broken.push(n),
        }
    }
    let Some((grid_span, grid_exprs)) = &raw.grid else {
        cx.error_at(a.span, "a tiled kernel declares its grid: `grid = [M / bm, N / bn]`");
        return None;
    };
    if grid_exprs.is_empty() {
        cx.error_at(*grid_span, "a grid has at least one axis (one step: `grid = [1]`)");
        return None;
    }
    let grid: Vec<SizeExpr> = grid_exprs.iter().filter_map(|e| names.size(cx, e)).collect();
    for (e, g) in grid_exprs.iter().zip(&grid) {
        if g.value(&names.tiles) == Some(0) {
            cx.error_spanned_by(e, "a grid axis has at least one step");
        }
    }
    let mut parallel = Vec::new();
    match &raw.semantics {
        None => cx.error_at(
            a.span,
            "say how each grid axis runs: `semantics = [parallel, arbitrary]` (`arbitrary` for \
             an axis whose steps accumulate into scratch)",
        ),
        Some((span, items)) => {
            if items.len() != grid_exprs.len() {
                cx.error_at(
                    *span,
                    format!(
                        "{} dimension semantics for a grid of {} axes",
                        items.len(),
                        grid_exprs.len()
                    ),
                );
            }
            for item in items {
                match expr_ident(item).as_deref() {
                    Some("parallel") => parallel.push(true),
                    Some("arbitrary") => parallel.push(false),
                    _ => cx.error_spanned_by(
                        item,
                        format!(
                            "unknown dimension semantics `{}`: `parallel` or `arbitrary`",
                            item.to_token_stream()
                        ),
                    ),
                }
            }
        }
    }
    let rank = grid_exprs.len();
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    let prefetch: Vec<String> = k
        .params
        .iter()
        .filter(|p| matches!(p.kind, ParamKind::Tensor(_)))
        .map(|p| p.ident.unraw().to_string())
        .filter(|n| raw.prefetch.iter().flat_map(|(_, v)| v).any(|t| t.unraw() == n))
        .collect();
    let tensors = k.params.iter().filter(|p| matches!(p.kind, ParamKind::Tensor(_)));
    if tensors.take(prefetch.len()).any(|p| !prefetch.contains(&p.ident.unraw().to_string())) {
        // The tables are not the first tensors: reported by `assign`; what follows is noise.
        return None;
    }
    // Windows in parameter order (the order of the custom call's operands).
    for p in &k.params {
        let n = p.ident.unraw().to_string();
        if prefetch.contains(&n) {
            continue;
        }
        let (list, what) = match p.kind {
            ParamKind::Tensor(_) => (&raw.inputs, "input"),
            ParamKind::Output(_) => (&raw.outputs, "output"),
            _ => continue,
        };
        let Some((id, e)) = list.iter().flat_map(|(_, v)| v).find(|(id, _)| id.unraw() == n) else {
            continue;
        };
        let Some(w) = window(cx, &names, id, e, rank, &prefetch, &format!("{what} `{n}`")) else {
            continue;
        };
        if what == "input" { inputs.push(w) } else { outputs.push(w) }
    }
    let mut scratch = Vec::new();
    for p in &k.params {
        if !matches!(p.kind, ParamKind::Scratch(_)) {
            continue;
        }
        let n = p.ident.unraw().to_string();
        let Some((id, e)) = raw.scratch.iter().flat_map(|(_, v)| v).find(|(id, _)| id.unraw() == n)
        else {
            continue;
        };
        if let Some(s) = scratch_spec(cx, &names, id, e) {
            scratch.push(s);
        }
    }
    // What can be known without a signature.
    let np = prefetch.len();
    for (i, w) in inputs.iter().enumerate() {
        let array = match &w.view {
            Some(v) => Some(v.iter().map(|d| d.value(&names.tiles)).collect()),
            None => declared_dims(attrs, k, np + i),
        };
        static_window_checks(cx, &names, w, array, &format!("input `{}`", w.name));
    }
    for (i, w) in outputs.iter().enumerate() {
        let array = match &w.view {
            Some(v) => Some(v.iter().map(|d| d.value(&names.tiles)).collect()),
            None => output_dims(attrs, k, m, i),
        };
        static_window_checks(cx, &names, w, array, &format!("output `{}`", w.name));
    }
    let vmem_limit = raw.vmem_limit.as_ref().and_then(|(span, e)| {
        let bytes = names.size(cx, e)?.value(&names.tiles);
        match bytes {
            None => cx.error_spanned_by(
                e,
                "`vmem_limit` is a number of bytes the macro can compute: `48 * 1024 * 1024`",
            ),
            Some(b) if b == 0 || b > VMEM_CAPACITY || b % 1024 != 0 => cx.error_at(
                *span,
                format!(
                    "`vmem_limit = {b}`: a limit is a positive multiple of 1024 bytes, at most \
                     the {VMEM_CAPACITY} bytes of VMEM a TensorCore has"
                ),
            ),
            Some(b) => return Some(b),
        }
        None
    });
    static_vmem(cx, &names, attrs, &inputs, &outputs, &scratch, vmem_limit);
    if let Some(body) = &k.item.body {
        check_matmuls(cx, &names, &inputs, &outputs, &scratch, body);
    }

    let mut args = Vec::new();
    for p in &k.params {
        args.push(match p.kind {
            ParamKind::Ctx => CallArg::Ctx,
            ParamKind::Tensor(i) if i < np => CallArg::Prefetch(i),
            ParamKind::Tensor(i) => CallArg::Input(i - np),
            ParamKind::Output(i) => CallArg::Output(i),
            ParamKind::Scratch(i) => CallArg::Scratch(i),
            ParamKind::Static(i, _) => CallArg::Static(i),
            ParamKind::Block => return None,
        });
    }
    let fallible = k.returns.as_ref().is_some_and(|r| r.fallible);
    let mut aliases: Vec<(usize, usize)> = Vec::new();
    for (out, e) in raw.aliases.iter().flat_map(|(_, v)| v) {
        let o = outputs.iter().position(|w| out.unraw() == w.name);
        let input = expr_ident(e);
        let i = input.as_ref().and_then(|n| inputs.iter().position(|w| w.name == *n));
        match (o, i) {
            (None, _) => cx.error_spanned_by(
                out,
                format!("`aliases({out} = ...)`: `{out}` is not an output block"),
            ),
            (_, None) => cx.error_spanned_by(
                e,
                format!("`aliases(... = {})`: not an input block", e.to_token_stream()),
            ),
            (Some(o), Some(i)) if aliases.iter().any(|(a, b)| *a == i || *b == o) => {
                cx.error_spanned_by(out, "an input or output is aliased twice")
            }
            (Some(o), Some(i)) => aliases.push((i, o)),
        }
    }
    // Which blocks of an output a table picks is data: Rust cannot see them all written.
    for (o, w) in outputs.iter().enumerate() {
        let picked = w.index_map.iter().position(|e| matches!(e, IndexEntry::Prefetch { .. }));
        if let Some(d) = picked
            && !aliases.iter().any(|(_, b)| *b == o)
        {
            cx.error_at(
                w.index_spans[d],
                format!(
                    "output `{}`: its index map reads a scalar-prefetch table, so which blocks \
                     the grid writes depends on the data; alias it to an input \
                     (`aliases({} = x)`) so unwritten blocks keep that input's contents",
                    w.name, w.name
                ),
            );
        }
    }
    Some(TiledModel {
        tiles,
        grid,
        parallel,
        prefetch,
        inputs,
        outputs,
        scratch,
        args,
        fallible,
        aliases,
        vmem_limit,
    })
}

fn scratch_spec(cx: &mut Ctxt, names: &Names<'_>, id: &Ident, e: &Expr) -> Option<ScratchModel> {
    let n = &id.unraw().to_string();
    let form = "a scratch buffer is `vmem(f32, [bm, bn])` or `smem(i32, [n])`";
    let Expr::Call(c) = e else {
        cx.error_spanned_by(e, form);
        return None;
    };
    let smem = match expr_ident(&c.func).as_deref() {
        Some("vmem") => false,
        Some("smem") => true,
        _ => {
            cx.error_spanned_by(
                &c.func,
                format!(
                    "scratch `{n}`: unknown memory space `{}`; {form}",
                    c.func.to_token_stream()
                ),
            );
            return None;
        }
    };
    let args: Vec<&Expr> = c.args.iter().collect();
    let [dt, shape] = args.as_slice() else {
        cx.error_spanned_by(c, format!("scratch `{n}`: {form}"));
        return None;
    };
    let Some(dtype) = expr_ident(dt).and_then(|d| DType::from_name(&d)) else {
        cx.error_spanned_by(
            dt,
            format!("scratch `{n}`: unsupported dtype `{}`", dt.to_token_stream()),
        );
        return None;
    };
    if smem && !matches!(dtype, DType::I32 | DType::F32) {
        cx.error_spanned_by(
            dt,
            format!(
                "scratch `{n}` in SMEM holds 32-bit scalars (i32 or f32), not {}",
                dtype.short_name()
            ),
        );
        return None;
    }
    let Expr::Array(a) = shape else {
        cx.error_spanned_by(shape, format!("scratch `{n}`: its shape is a list of sizes"));
        return None;
    };
    if a.elems.is_empty() {
        cx.error_spanned_by(shape, format!("scratch `{n}` has no dims: a buffer is at least 1-d"));
        return None;
    }
    let mut dims = Vec::new();
    for d in &a.elems {
        dims.push((names.size(cx, d)?, d.to_token_stream().to_string()));
    }
    Some(ScratchModel { name: n.to_owned(), span: id.span(), smem, dtype, dims })
}

fn static_window_checks(
    cx: &mut Ctxt,
    names: &Names<'_>,
    w: &WindowModel,
    array: Option<Vec<Option<u64>>>,
    what: &str,
) {
    let r = w.block.len();
    if let Some(array) = &array
        && array.len() != r
    {
        cx.error_at(
            w.span,
            format!("{what}: a block of rank {r} for an array of rank {}", array.len()),
        );
        return;
    }
    let array = array.unwrap_or_else(|| vec![None; r]);
    for (d, (size, text, span)) in w.block.iter().enumerate() {
        let Some(b) = size.value(&names.tiles) else { continue };
        if b == 0 {
            cx.error_at(*span, format!("{what}: block dim {d} is 0"));
            continue;
        }
        let full = array[d];
        if let Some(a) = full
            && b > a
        {
            cx.error_at(
                *span,
                format!("{what}: block dim {d} ({b}) is larger than the array's ({a})"),
            );
            continue;
        }
        let tile = if d + 1 == r {
            Some(TILING.1)
        } else if d + 2 == r {
            Some(TILING.0)
        } else {
            None
        };
        if let Some(t) = tile
            && b % t != 0
            && let Some(a) = full
            && b != a
        {
            cx.error_at(
                *span,
                format!(
                    "{what}: block dim {d} is {}, which breaks the TPU tiling rule: the last two \
                     block dims are multiples of ({}, {}) or equal the array's ({a})",
                    if *text == b.to_string() { text.clone() } else { format!("{text} = {b}") },
                    TILING.0,
                    TILING.1
                ),
            );
        }
        if let IndexEntry::Const(c) = w.index_map[d]
            && let Some(a) = full
        {
            // `c` is non-negative (`index_map` refuses the rest).
            let start = (c as u64).checked_mul(b);
            if start.is_none_or(|s| s >= a) {
                let at = start.map_or_else(|| "past the end".to_owned(), |s| format!("at {s}"));
                cx.error_at(
                    w.index_spans[d],
                    format!("{what}: block index {c} along dim {d} starts {at} of an array of {a}"),
                );
            }
        }
    }
}

fn static_vmem(
    cx: &mut Ctxt,
    names: &Names<'_>,
    attrs: &Attrs,
    inputs: &[WindowModel],
    outputs: &[WindowModel],
    scratch: &[ScratchModel],
    vmem_limit: Option<u64>,
) {
    // The smallest element size the kernel may take: an overflow at it is one at every dtype.
    let elem = attrs
        .dtypes
        .get()
        .and_then(|d| d.iter().map(|(d, _)| d.byte_size() as u64).min())
        .unwrap_or(4);
    let mut total = 0u64;
    let mut parts = Vec::new();
    // The error points at the largest buffer.
    let mut largest: Option<(u64, Span)> = None;
    for w in inputs.iter().chain(outputs) {
        let v: Option<Vec<u64>> = w.block.iter().map(|(s, _, _)| s.value(&names.tiles)).collect();
        if let Some(v) = v {
            // Saturating: past `u64::MAX` bytes is over the limit all the same.
            let bytes = v.iter().fold(2 * elem, |a, &b| a.saturating_mul(b));
            total = total.saturating_add(bytes);
            parts.push(format!("block `{}` {bytes}", w.name));
            if largest.is_none_or(|(b, _)| bytes > b) {
                largest = Some((bytes, w.span));
            }
        }
    }
    // SMEM scratch is not VMEM.
    for s in scratch.iter().filter(|s| !s.smem) {
        let v: Option<Vec<u64>> = s.dims.iter().map(|(d, _)| d.value(&names.tiles)).collect();
        if let Some(v) = v {
            let bytes = v.iter().fold(s.dtype.byte_size() as u64, |a, &b| a.saturating_mul(b));
            total = total.saturating_add(bytes);
            parts.push(format!("scratch `{}` {bytes}", s.name));
            if largest.is_none_or(|(b, _)| bytes > b) {
                largest = Some((bytes, s.span));
            }
        }
    }
    let (limit, whose) = match vmem_limit {
        Some(l) => (l, format!("its `vmem_limit` ({l} bytes)")),
        None => (
            MAX_SCOPED_VMEM,
            format!("the largest target's scoped limit ({MAX_SCOPED_VMEM} bytes on v6e)"),
        ),
    };
    if let Some((_, span)) = largest
        && total > limit
    {
        cx.error_at(
            span,
            format!(
                "the kernel needs at least {total} bytes of VMEM ({}; blocks double-buffered), \
                 over {whose}: use smaller blocks",
                parts.join(", ")
            ),
        );
    }
}

/// What a body expression is, for the matmul check: the block it loads (through casts).
fn loaded_block(e: &Expr, lets: &BTreeMap<String, String>) -> Option<String> {
    match e {
        Expr::MethodCall(m) if m.method == "load" && m.args.is_empty() => expr_ident(&m.receiver),
        Expr::MethodCall(m) if m.method == "cast" => loaded_block(&m.receiver, lets),
        Expr::Paren(p) => loaded_block(&p.expr, lets),
        Expr::Path(_) => lets.get(&expr_ident(e)?).cloned(),
        _ => None,
    }
}

fn check_matmuls(
    cx: &mut Ctxt,
    names: &Names<'_>,
    inputs: &[WindowModel],
    outputs: &[WindowModel],
    scratch: &[ScratchModel],
    body: &syn::Block,
) {
    let shape = |n: &str| -> Option<Vec<(SizeExpr, String)>> {
        if let Some(w) = inputs.iter().chain(outputs).find(|w| w.name == n) {
            return Some(w.block.iter().map(|(s, t, _)| (s.clone(), t.clone())).collect());
        }
        scratch.iter().find(|s| s.name == n).map(|s| s.dims.clone())
    };
    let mut lets = BTreeMap::new();
    let visit = |e: &Expr, lets: &BTreeMap<String, String>, cx: &mut Ctxt| {
        let Expr::MethodCall(m) = e else { return };
        // (lhs transposed, rhs transposed)
        let (lhs_t, transposed) = match m.method.to_string().as_str() {
            "matmul" => (false, false),
            "matmul_t" => (false, true),
            "t_matmul" => (true, false),
            _ => return,
        };
        let [rhs] = m.args.iter().collect::<Vec<_>>()[..] else { return };
        let (Some(l), Some(r)) = (loaded_block(&m.receiver, lets), loaded_block(rhs, lets)) else {
            return;
        };
        let (Some(ls), Some(rs)) = (shape(&l), shape(&r)) else { return };
        if ls.len() != 2 || rs.len() != 2 {
            cx.error_spanned_by(
                e,
                format!(
                    "matmul takes 2-d blocks; `{l}` has rank {}, `{r}` rank {}",
                    ls.len(),
                    rs.len()
                ),
            );
            return;
        }
        let same = |a: &SizeExpr, b: &SizeExpr| {
            let t = &names.tiles;
            match (a.value(t), b.value(t)) {
                (Some(a), Some(b)) => a == b,
                _ => a.resolved(t) == b.resolved(t),
            }
        };
        let (which, other) = if transposed { (1, 0) } else { (0, 1) };
        let ld = if lhs_t { 0 } else { 1 };
        let (lk, rk) = (&ls[ld], &rs[which]);
        if !same(&lk.0, &rk.0) {
            // The other form, when it would contract matching dims.
            let hint = if lhs_t {
                if same(&ls[1].0, &rk.0) { " (did you mean `matmul`?)" } else { "" }
            } else if same(&lk.0, &rs[other].0) {
                if transposed {
                    " (did you mean `matmul`?)"
                } else {
                    " (did you mean `matmul_t`, the rhs transposed?)"
                }
            } else if !transposed && same(&ls[0].0, &rk.0) {
                " (did you mean `t_matmul`, the lhs transposed?)"
            } else {
                ""
            };
            cx.error_spanned_by(
                e,
                format!(
                    "matmul shape mismatch: it contracts dim {ld} of `{l}`'s block ({}) with dim \
                     {which} of `{r}`'s block ({}); they must be the same size{hint}",
                    lk.1, rk.1
                ),
            );
        }
    };
    walk_block(body, &mut lets, &mut |e, lets, cx2| visit(e, lets, cx2), cx);
}

type Visitor<'a> = dyn FnMut(&Expr, &BTreeMap<String, String>, &mut Ctxt) + 'a;

fn walk_block(
    b: &syn::Block,
    lets: &mut BTreeMap<String, String>,
    f: &mut Visitor<'_>,
    cx: &mut Ctxt,
) {
    for s in &b.stmts {
        match s {
            syn::Stmt::Local(l) => {
                if let Some(init) = &l.init {
                    walk_expr(&init.expr, lets, f, cx);
                    let pat = match &l.pat {
                        syn::Pat::Type(t) => &*t.pat,
                        p => p,
                    };
                    if let syn::Pat::Ident(p) = pat {
                        // A rebinding to anything but a loaded block forgets the old one.
                        match loaded_block(&init.expr, lets) {
                            Some(block) => lets.insert(p.ident.to_string(), block),
                            None => lets.remove(&p.ident.to_string()),
                        };
                    }
                }
            }
            syn::Stmt::Expr(e, _) => walk_expr(e, lets, f, cx),
            _ => {}
        }
    }
}

fn walk_expr(e: &Expr, lets: &mut BTreeMap<String, String>, f: &mut Visitor<'_>, cx: &mut Ctxt) {
    f(e, lets, cx);
    match e {
        Expr::MethodCall(m) => {
            walk_expr(&m.receiver, lets, f, cx);
            for a in &m.args {
                walk_expr(a, lets, f, cx);
            }
        }
        Expr::Call(c) => {
            for a in &c.args {
                walk_expr(a, lets, f, cx);
            }
        }
        Expr::Binary(b) => {
            walk_expr(&b.left, lets, f, cx);
            walk_expr(&b.right, lets, f, cx);
        }
        Expr::Unary(u) => walk_expr(&u.expr, lets, f, cx),
        Expr::Paren(p) => walk_expr(&p.expr, lets, f, cx),
        Expr::Closure(c) => walk_expr(&c.body, lets, f, cx),
        Expr::Block(b) => walk_block(&b.block, &mut lets.clone(), f, cx),
        Expr::If(i) => {
            walk_expr(&i.cond, lets, f, cx);
            walk_block(&i.then_branch, &mut lets.clone(), f, cx);
            if let Some((_, e)) = &i.else_branch {
                walk_expr(e, lets, f, cx);
            }
        }
        Expr::ForLoop(l) => walk_block(&l.body, &mut lets.clone(), f, cx),
        Expr::Match(m) => {
            for arm in &m.arms {
                walk_expr(&arm.body, lets, f, cx);
            }
        }
        _ => {}
    }
}

/// The record and entry points of a tiled kernel.
pub fn generate(
    k: &Kernel,
    m: &Model,
    t: &TiledModel,
    p: &TokenStream,
) -> (TokenStream, TokenStream) {
    let name = &m.name;
    let fn_ident = &k.item.sig.ident;
    let record = quote!(#p::KernelRegistration::tiled(#name, kernel, plan));
    let dims = m.dims.iter().map(|(n, (input, pos))| {
        let id = format_ident!("{}", n);
        quote!(let #id: u64 = #p::tiled_dim(__sig, #input, #pos)?;)
    });
    let tiles = t.tiles.iter().map(|(id, e)| {
        let v = e.tokens(p);
        let n = id.to_string();
        quote_spanned!(id.span()=> let #id: u64 = #p::tiled_named(#n, #v)?;)
    });
    let grid = t.grid.iter().map(|g| g.tokens(p));
    let blocks = |ws: &[WindowModel]| -> Vec<TokenStream> {
        ws.iter()
            .map(|w| {
                let b = w.block.iter().map(|(s, _, _)| s.tokens(p));
                quote!(#p::Vec::from([#(#b),*]))
            })
            .collect()
    };
    let views = |ws: &[WindowModel]| -> Vec<TokenStream> {
        ws.iter()
            .map(|w| match &w.view {
                None => quote!(#p::Option::None),
                Some(v) => {
                    let v = v.iter().map(|s| s.tokens(p));
                    quote!(#p::Option::Some(#p::Vec::from([#(#v),*])))
                }
            })
            .collect()
    };
    let (in_blocks, out_blocks) = (blocks(&t.inputs), blocks(&t.outputs));
    let (in_views, out_views) = (views(&t.inputs), views(&t.outputs));
    let scratch_dims = t.scratch.iter().map(|s| {
        let d = s.dims.iter().map(|(e, _)| e.tokens(p));
        quote!(#p::Vec::from([#(#d),*]))
    });
    let scratch_dtypes: Vec<TokenStream> = t.scratch.iter().map(|s| dtype(p, s.dtype)).collect();
    let semantics = t.parallel.iter().map(|par| {
        if *par { quote!(#p::Semantics::Parallel) } else { quote!(#p::Semantics::Arbitrary) }
    });
    // The divisors and moduli of `g / group % m` entries, computed with the plan (in window
    // order).
    let div_entries: Vec<(&SizeExpr, &Option<SizeExpr>)> = t
        .inputs
        .iter()
        .chain(&t.outputs)
        .flat_map(|w| &w.index_map)
        .filter_map(|e| match e {
            IndexEntry::GridDiv(_, by, modulo) => Some((by, modulo)),
            _ => None,
        })
        .collect();
    let divisors = div_entries.iter().map(|(by, _)| by.tokens(p));
    let moduli = div_entries.iter().map(|(_, m)| match m {
        Some(m) => {
            let m = m.tokens(p);
            quote!(#p::Option::Some(#m))
        }
        None => quote!(#p::Option::None),
    });
    let divisor = std::cell::Cell::new(0usize);
    let index_map = |w: &WindowModel| {
        let e = w.index_map.iter().map(|e| match e {
            IndexEntry::GridDiv(a, _, _) => {
                let n = divisor.replace(divisor.get() + 1);
                quote!(#p::IndexExpr::GridDiv {
                    axis: #a,
                    by: __plan.divisors[#n],
                    modulo: __plan.moduli[#n],
                })
            }
            IndexEntry::Grid(a) => quote!(#p::IndexExpr::Grid(#a)),
            IndexEntry::Const(c) => quote!(#p::IndexExpr::Const(#c)),
            IndexEntry::Prefetch { table, axis } => {
                quote!(#p::IndexExpr::Prefetch { table: #table, axis: #axis })
            }
        });
        quote!(&[#(#e),*])
    };
    let mut lets = Vec::new();
    let np = t.prefetch.len();
    if let Some(bytes) = t.vmem_limit {
        lets.push(quote!(__t.vmem_limit(#bytes)?;));
    }
    for i in 0..np {
        let v = format_ident!("__pf_{}", i);
        lets.push(quote!(let #v = __t.prefetch(__sig.inputs[#i].clone())?;));
    }
    for (i, w) in t.inputs.iter().enumerate() {
        let v = format_ident!("__in_{}", i);
        let map = index_map(w);
        let operand = np + i;
        lets.push(quote! {
            let #v = __t.input(
                #p::tiled_view(&__sig.inputs[#operand], &__plan.views[#i])
                    .map_err(|m| #p::tiled_declined(#name, m))?,
                &__plan.blocks[#i],
                #map,
            )?;
        });
    }
    let n_in = t.inputs.len();
    for (i, w) in t.outputs.iter().enumerate() {
        let v = format_ident!("__out_{}", i);
        let map = index_map(w);
        let j = n_in + i;
        lets.push(quote! {
            let #v = __t.output(
                #p::tiled_view(&__outputs[#i], &__plan.views[#j])
                    .map_err(|m| #p::tiled_declined(#name, m))?,
                &__plan.blocks[#j],
                #map,
            )?;
        });
    }
    for (i, o) in &t.aliases {
        lets.push(quote!(__t.alias(#i, #o)?;));
    }
    for (i, s) in t.scratch.iter().enumerate() {
        let v = format_ident!("__scratch_{}", i);
        let d = &scratch_dtypes[i];
        let space = if s.smem { quote!(smem) } else { quote!(vmem) };
        lets.push(quote! {
            let #v = __t.scratch(#p::MType::#space(#d, &__plan.scratch[#i]))?;
        });
    }
    let mut call_args = Vec::new();
    for (param, arg) in k.params.iter().zip(&t.args) {
        call_args.push(match arg {
            CallArg::Ctx => quote!(&__t),
            CallArg::Prefetch(i) => {
                let v = format_ident!("__pf_{}", i);
                quote!(#v)
            }
            CallArg::Input(i) => {
                let v = format_ident!("__in_{}", i);
                quote!(#v)
            }
            CallArg::Output(i) => {
                let v = format_ident!("__out_{}", i);
                quote!(#v)
            }
            CallArg::Scratch(i) => {
                let v = format_ident!("__scratch_{}", i);
                quote!(#v)
            }
            CallArg::Static(i) => {
                let value = format_ident!("__static_{}", i);
                let default = format_ident!("__default_{}", i);
                let sname = &param.schema_name;
                let ty = &param.ty;
                lets.push(quote_spanned! {ty.span()=>
                    let #default = #p::static_default(&REGISTRATION, #sname);
                    let #value: #ty = #p::static_arg(&REGISTRATION, __sig, #sname, &#default)?;
                });
                quote!(#value)
            }
        });
    }
    let question = if t.fallible { quote!(?) } else { TokenStream::new() };
    let all_blocks = in_blocks.iter().chain(&out_blocks);
    let all_views = in_views.iter().chain(&out_views);
    // Bytes per element of each scratch buffer in VMEM (SMEM buffers count 0).
    let elem_sizes = t.scratch.iter().map(|s| if s.smem { 0 } else { s.dtype.byte_size() as u64 });
    let vmem_limit = match t.vmem_limit {
        Some(b) => quote!(#p::Option::Some(#b)),
        None => quote!(#p::Option::None),
    };
    let entry = quote! {
        /// The tile sizes, grid, blocks and views of one signature.
        struct __Plan {
            grid: #p::Vec<u64>,
            blocks: #p::Vec<#p::Vec<u64>>,
            views: #p::Vec<#p::Option<#p::Vec<u64>>>,
            scratch: #p::Vec<#p::Vec<u64>>,
            divisors: #p::Vec<u64>,
            moduli: #p::Vec<#p::Option<u64>>,
        }

        #[allow(non_snake_case, unused_variables, clippy::let_and_return)]
        fn __plan(__sig: &#p::KernelSignature) -> #p::Result<__Plan, #p::String> {
            #(#dims)*
            #(#tiles)*
            let __plan = __Plan {
                grid: #p::Vec::from([#(#grid),*]),
                blocks: #p::Vec::from([#(#all_blocks),*]),
                views: #p::Vec::from([#(#all_views),*]),
                scratch: #p::Vec::from([#(#scratch_dims),*]),
                divisors: #p::Vec::from([#(#divisors),*]),
                moduli: #p::Vec::from([#(#moduli),*]),
            };
            if __plan.divisors.contains(&0) {
                return #p::Result::Err(#p::String::from("an index map divides a grid index by 0"));
            }
            if __plan.moduli.contains(&#p::Option::Some(0)) {
                return #p::Result::Err(#p::String::from("an index map takes a grid index modulo 0"));
            }
            #p::tiled_check_plan(
                &REGISTRATION,
                __sig,
                #np,
                #vmem_limit,
                &__plan.blocks,
                &__plan.views,
                &__plan.scratch,
                &[#(#elem_sizes),*],
            )?;
            #p::Result::Ok(__plan)
        }

        /// Whether the kernel takes `sig`: its tiles divide the call's dims and its blocks fit
        /// the scoped VMEM; the reason when not.
        pub fn plan(__sig: &#p::KernelSignature) -> #p::Result<(), #p::String> {
            __plan(__sig).map(|_| ())
        }

        /// Builds the tiled kernel for one signature (missing statics take their defaults).
        pub fn kernel(
            __sig: &#p::KernelSignature,
        ) -> #p::Result<#p::MosaicKernel, #p::BuildError> {
            let __plan = __plan(__sig).map_err(|m| #p::tiled_declined(#name, m))?;
            let __outputs = #p::tiled_outputs(&REGISTRATION, __sig)?;
            let __t = #p::Tiled::new(#name, &__plan.grid, &[#(#semantics),*])?;
            #(#lets)*
            super::#fn_ident(#(#call_args),*) #question;
            __t.finish()
        }

        /// The kernel's CPU twin for one signature (the StableHLO every platform but a TPU
        /// runs).
        pub fn module(
            __sig: &#p::KernelSignature,
        ) -> #p::Result<#p::Module, #p::BuildError> {
            REGISTRATION.emit(__sig)
        }
    };
    (record, entry)
}

fn dtype(p: &TokenStream, d: DType) -> TokenStream {
    let v = format_ident!("{}", format!("{d:?}"));
    quote!(#p::DType::#v)
}
