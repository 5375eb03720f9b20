//! Shape refinement: specialises a StableHLO module exported with symbolic shapes
//! (`jax.export` with `jax.export.symbolic_shape`) to static input types, in pure Rust.
//!
//! XLA does not compile such a module as it is (`dynamic_broadcast_in_dim` and friends cannot be
//! translated to HLO); jaxlib runs StableHLO's `refine-shapes` pass first. [`refine`] is that pass
//! for the modules jax exports: given concrete types for `@main`'s arguments it returns module
//! text in which every tensor type is static.
//!
//! How: locations are stripped, then every function reached from `@main` is walked op by op with
//! an environment of refined values. Integer shape computations (`i1`/`i8`..`i64`/`ui8`/`ui32`
//! tensors of at most 256 elements) are folded to constants; constant call operands are carried
//! into the callee, so the dimension variables jax passes to `_wrapped_jax_export_main`
//! (`jax.global_constant`) are known inside it. A function called with several distinct
//! signatures (types and constant operands) gets one copy per signature: the first keeps its name,
//! the others are renamed `@f_1`, `@f_2`, ... and made private. The text is rewritten in place:
//! types in op signatures, function signatures and block arguments are replaced, and the ops below
//! are replaced by their static forms.
//!
//! Supported:
//! - folding: `constant`, `get_dimension_size`, `iota`, `reshape`, `convert`, `broadcast_in_dim`,
//!   `concatenate`, `slice`, `transpose`, `add`, `subtract`, `multiply`, `divide`, `remainder`,
//!   `maximum`, `minimum`, `and`, `or`, `xor`, `not`, `negate`, `sign`, `abs`, `compare`,
//!   `select`, `clamp`, and results of `func.call`;
//! - dynamic ops rewritten to static ones: `dynamic_broadcast_in_dim`, `dynamic_reshape`,
//!   `dynamic_iota`, `real_dynamic_slice`, `dynamic_pad`, `dynamic_gather`, and the
//!   `stablehlo.dynamic_reduce_window` custom call (its reducer function inlined as the region);
//! - `custom_call @shape_assertion`: dropped when its predicate folds to true, a
//!   [`RefineError::ShapeAssertion`] carrying jax's message (with `{0}`, `{1}`... filled in) when
//!   it folds to false;
//! - result types inferred for: elementwise unary/binary ops (and `convert`, `compare`,
//!   `bitcast_convert` between equal widths, `reverse`, `map`, a few `chlo` unary ops), `select`,
//!   `clamp`, `reduce`, `transpose`, `broadcast_in_dim`, `broadcast`, `reshape` (at most one
//!   unknown dimension), `concatenate`, `slice`, `dynamic_slice`, `dynamic_update_slice`, `pad`,
//!   `dot_general`, `dot`, `convolution` (dimension numbers in the `[b, f, 0]x[o, i, 0]->[b, f,
//!   0]` form), `sort`, `reduce_window`, `gather`, `scatter`, `select_and_scatter`, `cholesky`,
//!   `triangular_solve`, `get_dimension_size`, `optimization_barrier`, `while`, `if`, `case`
//!   (regions refined with the carried types), `func.call` and `composite` (the specialised
//!   callee's or decomposition's results) and the return ops.
//!
//! Refused, with an error naming the op and its `line:column` in the input text: any other op
//! whose printed result type has a `?` (`dynamic_conv`, `iota` with a dynamic result, custom calls,
//! ...), a shape operand that does not fold to a constant, a shape assertion whose predicate does
//! not fold, a loop body that changes the shape of what it carries, types other than ranked
//! tensors in op signatures (tokens, tuples), regions with several blocks, recursive calls, and
//! anything the reader refuses. It never guesses: every inferred type is checked against the
//! printed one (same element type and rank, equal static dimensions).
//!
//! Functions not reached from `@main` are kept when their types are static and dropped otherwise.
//! The module attribute `jax.uses_shape_polymorphism` is dropped; the others are kept. The output
//! is deterministic: the same input gives the same bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::rc::Rc;

use crate::reader::{self, Arg, Kind, Module, ReadError, Tok, Visibility};
use crate::types::{DType, Dim, Shape, TensorType};

/// Integer tensors with more elements than this are not folded (shape computations are tiny).
const MAX_FOLD_ELEMENTS: u64 = 256;

/// Why a module could not be refined. Positions (`line`, `column`, 1-based) are in the text given
/// to [`refine`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RefineError {
    /// The text is not a module the reader understands.
    #[error("cannot read the module: {0}")]
    Read(#[from] ReadError),
    /// The number of input types differs from the entry function's argument count.
    #[error("@{function} takes {expected} arguments, got {got} input types")]
    InputCount { function: String, expected: usize, got: usize },
    /// An input type does not fit the entry function's argument.
    #[error("argument {index} of @{function} has type {expected}, got {got}: {reason}")]
    InputType {
        function: String,
        index: usize,
        expected: TensorType,
        got: TensorType,
        reason: String,
    },
    /// A jax shape assertion fails for these input types. `message` is jax's `error_message`
    /// with its `{0}`, `{1}`... placeholders replaced by the folded operand values.
    #[error("{line}:{column}: shape assertion failed: {message}")]
    ShapeAssertion { message: String, line: usize, column: usize },
    /// An op (or function) that cannot be refined: `op` is its name (`stablehlo.custom_call`,
    /// `func.func @f`), `reason` says what is wrong.
    #[error("{line}:{column}: cannot refine {op}: {reason}")]
    Op { op: String, line: usize, column: usize, reason: String },
    /// Text inside a function body that this refiner cannot parse.
    #[error("{line}:{column}: cannot parse the function body: {message}")]
    Syntax { line: usize, column: usize, message: String },
    /// The result still has a dynamic dimension (a case this refiner does not cover). The
    /// position is in the refined text; `context` is its line.
    #[error(
        "the refined module still has a dynamic type at {line}:{column} of its text: {context}"
    )]
    Incomplete { line: usize, column: usize, context: String },
}

/// Specialises a module whose entry (`main`, public) has symbolic (`?`) dimensions to static input
/// types.
///
/// `inputs` gives one static type per argument of the entry function: same element type and rank,
/// equal static dimensions. The result is module text (without locations) in which every tensor
/// type is static, shape assertions are evaluated and removed, and dynamic shape ops are replaced
/// by static ones, computing what jaxlib's refinement computes. See the [module
/// documentation](self) for what is supported.
pub fn refine(text: &str, inputs: &[TensorType]) -> Result<String, RefineError> {
    // Read the text as given first, so reader errors carry positions in it.
    reader::parse_module(text)?.main()?;
    let (stripped, segments) = reader::strip_locations_mapped(text)?;
    let module = reader::parse_module(&stripped)?;
    let main = module.main()?;
    check_inputs(&main.name, &main.args, inputs)?;
    let main_index = module.functions.iter().position(|f| f.name == main.name).unwrap_or(0);
    let mut refiner = Refiner::new(text, &stripped, &segments, &module);
    let args = inputs.iter().map(|t| Val { ty: t.clone(), konst: None }).collect();
    refiner.specialize(main_index, args)?;
    let out = refiner.emit()?;
    check_static(&out)?;
    Ok(out)
}

fn check_inputs(function: &str, args: &[Arg], inputs: &[TensorType]) -> Result<(), RefineError> {
    if args.len() != inputs.len() {
        return Err(RefineError::InputCount {
            function: function.to_string(),
            expected: args.len(),
            got: inputs.len(),
        });
    }
    for (index, (arg, got)) in args.iter().zip(inputs).enumerate() {
        let reason = if arg.ty.dtype != got.dtype {
            Some(format!("element type {} is not {}", got.dtype, arg.ty.dtype))
        } else if arg.ty.rank() != got.rank() {
            Some(format!("rank {} is not {}", got.rank(), arg.ty.rank()))
        } else if let Some(k) = got.shape.dims().iter().position(|d| d.as_static().is_none()) {
            Some(format!("dimension {k} of the input is symbolic; inputs must be static"))
        } else {
            arg.ty.shape.dims().iter().zip(got.shape.dims()).enumerate().find_map(|(k, (a, g))| {
                match a {
                    Dim::Static(n) if Some(*n) != g.as_static() => {
                        Some(format!("dimension {k} is {g}, expected {n}"))
                    }
                    _ => None,
                }
            })
        };
        if let Some(reason) = reason {
            return Err(RefineError::InputType {
                function: function.to_string(),
                index,
                expected: arg.ty.clone(),
                got: got.clone(),
                reason,
            });
        }
    }
    Ok(())
}

/// Fails when a `?` is left anywhere outside string literals.
fn check_static(out: &str) -> Result<(), RefineError> {
    let toks = reader::tokenize(out)?;
    if let Some(t) = toks.iter().find(|t| t.kind == Kind::Punct(b'?')) {
        let (line, column) = reader::line_col(out, t.start);
        let context = out.lines().nth(line - 1).unwrap_or("").trim().to_string();
        return Err(RefineError::Incomplete { line, column, context });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Values

/// A refined value: its static type, and its elements when it is a folded integer constant.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Val {
    ty: TensorType,
    konst: Option<Vec<i64>>,
}

type Env = BTreeMap<String, Val>;

/// The static sizes of a refined type (values in the environment are always static).
fn sdims(t: &TensorType) -> Vec<u64> {
    t.shape.dims().iter().map(|d| d.as_static().unwrap_or(u64::MAX)).collect()
}

fn static_type(dtype: DType, dims: &[u64]) -> TensorType {
    TensorType { dtype, shape: Shape::of(dims) }
}

/// Whether `actual` (static) fits a printed type: same element type and rank, equal static dims.
fn fits(printed: &TensorType, actual: &TensorType) -> bool {
    printed.dtype == actual.dtype
        && printed.rank() == actual.rank()
        && printed.shape.dims().iter().zip(actual.shape.dims()).all(|(p, a)| match p {
            Dim::Static(n) => a.as_static() == Some(*n),
            Dim::Symbolic(_) => a.as_static().is_some(),
        })
}

fn count(dims: &[u64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

fn join<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

fn array_attr(items: &[i64]) -> String {
    if items.is_empty() { "array<i64>".to_string() } else { format!("array<i64: {}>", join(items)) }
}

fn type_list(types: &[TensorType]) -> String {
    join(types)
}

fn result_list(types: &[TensorType]) -> String {
    match types {
        [one] => one.to_string(),
        _ => format!("({})", join(types)),
    }
}

fn to_usize(v: i64, what: &str) -> Result<usize, String> {
    usize::try_from(v).map_err(|_| format!("{what} {v} is negative"))
}

fn to_u64(v: i64, what: &str) -> Result<u64, String> {
    u64::try_from(v).map_err(|_| format!("{what} {v} is negative"))
}

// ---------------------------------------------------------------------------------------------
// Parsed bodies

/// A tensor type as printed, with its byte span in the (stripped) text.
#[derive(Debug)]
struct TypeRef {
    ty: TensorType,
    span: Range<usize>,
}

/// An op's trailing type signature.
#[derive(Debug)]
enum Sig {
    None,
    /// `(operand types) -> result types`.
    Func {
        operands: Vec<TypeRef>,
        results: Vec<TypeRef>,
    },
    /// `type, type, ...` (pretty forms).
    List(Vec<TypeRef>),
}

#[derive(Debug)]
struct BlockArg {
    /// Token index of the `%name`.
    tok: usize,
    ty: Option<TypeRef>,
}

#[derive(Debug)]
struct Region {
    args: Vec<BlockArg>,
    ops: Vec<Op>,
}

#[derive(Debug)]
struct Op {
    /// Token index of the first token (the first result, or the name).
    first: usize,
    /// Result value names as used (`%0`, or `%1#0`, `%1#1`).
    results: Vec<String>,
    /// The op name without quotes (`stablehlo.add`, `call`, `return`).
    name: String,
    name_tok: usize,
    /// Operand `%value` tokens, in MLIR order (a pretty reduce's init values last).
    operands: Vec<usize>,
    /// The `@symbol` of a call or custom call.
    callee: Option<usize>,
    /// Token ranges holding the op's attributes (regions excluded).
    attrs: Vec<Range<usize>>,
    sig: Sig,
    /// Token index just past the signature (past the attributes when there is none).
    sig_end: usize,
    regions: Vec<Region>,
    /// Token index just past the op.
    end: usize,
}

type PResult<T> = Result<T, (usize, String)>;

/// Prints a rewritten op given its result type.
type OpPrinter<'a> = Box<dyn Fn(&TensorType) -> String + 'a>;

/// The two lists of a pretty `name = [..] x [..]` attribute.
type IntPair = (Vec<i64>, Vec<i64>);

/// Reads function bodies: one op after another, in MLIR's pretty or generic form.
struct Parser<'a> {
    text: &'a str,
    toks: &'a [Tok],
}

impl Parser<'_> {
    fn s(&self, i: usize) -> &str {
        self.toks.get(i).map_or("", |t| &self.text[t.start..t.end])
    }

    fn kind(&self, i: usize) -> Option<Kind> {
        self.toks.get(i).map(|t| t.kind)
    }

    fn is_punct(&self, i: usize, c: u8) -> bool {
        self.kind(i) == Some(Kind::Punct(c))
    }

    fn is_word(&self, i: usize, w: &str) -> bool {
        self.kind(i) == Some(Kind::Word) && self.s(i) == w
    }

    fn pair(&self, i: usize) -> usize {
        self.toks.get(i).map_or(i, |t| t.pair)
    }

    fn starts_line(&self, i: usize) -> bool {
        i == 0 || self.text[self.toks[i - 1].end..self.toks[i].start].contains('\n')
    }

    fn err(&self, i: usize, what: &str) -> (usize, String) {
        let offset = self.toks.get(i).map_or(self.text.len(), |t| t.start);
        let found = match self.toks.get(i) {
            Some(_) => format!("{:?}", self.s(i)),
            None => "end of input".to_string(),
        };
        (offset, format!("expected {what}, found {found}"))
    }

    /// The ops of a block between token indices `lo` and `hi`, with its `^bb0(...)` arguments.
    fn block(&self, lo: usize, hi: usize) -> PResult<(Vec<BlockArg>, Vec<Op>)> {
        let mut j = lo;
        let mut args = Vec::new();
        if self.kind(j) == Some(Kind::Caret) {
            if !self.is_punct(j + 1, b'(') {
                return Err(self.err(j + 1, "'(' opening the block arguments"));
            }
            args = self.block_args(j + 1)?;
            j = self.pair(j + 1) + 1;
            if !self.is_punct(j, b':') {
                return Err(self.err(j, "':' after the block arguments"));
            }
            j += 1;
        }
        let mut ops = Vec::new();
        while j < hi {
            if self.kind(j) == Some(Kind::Caret) {
                let at = self.toks[j].start;
                return Err((at, "regions with several blocks are not supported".to_string()));
            }
            let op = self.op(j, hi)?;
            j = op.end;
            ops.push(op);
        }
        Ok((args, ops))
    }

    /// The items of the comma-separated list in the parentheses opening at `open`: `item` reads
    /// one at a token index and returns it with the index after it; `what` names the items.
    fn comma_list<T>(
        &self,
        open: usize,
        what: &str,
        mut item: impl FnMut(usize) -> PResult<(T, usize)>,
    ) -> PResult<Vec<T>> {
        let close = self.pair(open);
        let mut j = open + 1;
        let mut out = Vec::new();
        while j < close {
            if !out.is_empty() {
                if !self.is_punct(j, b',') {
                    return Err(self.err(j, &format!("',' between {what}")));
                }
                j += 1;
            }
            let (t, next) = item(j)?;
            out.push(t);
            j = next;
        }
        Ok(out)
    }

    /// `(%a: type, %b: type)` with the `(` at `open`.
    fn block_args(&self, open: usize) -> PResult<Vec<BlockArg>> {
        self.comma_list(open, "block arguments", |j| {
            if self.kind(j) != Some(Kind::Value) {
                return Err(self.err(j, "a block argument (%name)"));
            }
            if !self.is_punct(j + 1, b':') {
                return Err(self.err(j + 1, "':' after the block argument"));
            }
            let (ty, mut next) = self.ty(j + 2)?;
            if self.is_punct(next, b'{') {
                next = self.pair(next) + 1;
            }
            Ok((BlockArg { tok: j, ty: Some(ty) }, next))
        })
    }

    /// A ranked tensor type starting at token `j`; returns it and the token index after it.
    fn ty(&self, j: usize) -> PResult<(TypeRef, usize)> {
        let adjacent = matches!((self.toks.get(j), self.toks.get(j + 1)),
            (Some(t), Some(n)) if n.kind == Kind::Punct(b'<') && n.start == t.end);
        if !(self.is_word(j, "tensor") && adjacent) {
            return Err(self.err(j, "a tensor type"));
        }
        let mut next_sym = 0;
        let (ty, gt) = reader::parse_tensor_body(self.text, self.toks[j + 1].end, &mut next_sym)
            .map_err(|e| (self.toks[j].start, e.message().to_string()))?;
        let mut k = j + 2;
        while self.toks.get(k).is_some_and(|t| t.start < gt) {
            k += 1;
        }
        if self.toks.get(k).is_none_or(|t| t.start != gt) {
            return Err(self.err(k, "'>' closing the tensor type"));
        }
        Ok((TypeRef { ty, span: self.toks[j].start..gt + 1 }, k + 1))
    }

    /// A comma-separated list of types inside the parentheses opening at `open`.
    fn types_in(&self, open: usize) -> PResult<Vec<TypeRef>> {
        self.comma_list(open, "types", |j| self.ty(j))
    }

    /// The type signature starting at token `j`; returns it and the token index after it.
    fn signature(&self, j: usize) -> PResult<(Sig, usize)> {
        if self.is_punct(j, b'(') && self.kind(self.pair(j) + 1) == Some(Kind::Arrow) {
            let operands = self.types_in(j)?;
            let k = self.pair(j) + 2;
            if self.is_punct(k, b'(') {
                let results = self.types_in(k)?;
                return Ok((Sig::Func { operands, results }, self.pair(k) + 1));
            }
            let (t, next) = self.ty(k)?;
            return Ok((Sig::Func { operands, results: vec![t] }, next));
        }
        let (t, mut k) = self.ty(j)?;
        let mut list = vec![t];
        while self.is_punct(k, b',') {
            let (t, next) = self.ty(k + 1)?;
            list.push(t);
            k = next;
        }
        Ok((Sig::List(list), k))
    }

    /// A region `{ ... }` opening at `open`; `args` are used when it has no `^bb0(...)` label.
    fn region(&self, open: usize, args: Vec<BlockArg>) -> PResult<Region> {
        if !self.is_punct(open, b'{') {
            return Err(self.err(open, "'{' opening a region"));
        }
        let (bargs, ops) = self.block(open + 1, self.pair(open))?;
        let has_label = self.kind(open + 1) == Some(Kind::Caret);
        Ok(Region { args: if has_label { bargs } else { args }, ops })
    }

    /// With `j` on a `<`, the index just past its matching `>`.
    fn angle_end(&self, j: usize) -> PResult<usize> {
        reader::angle_close(self.toks, j, self.toks.len())
            .ok_or_else(|| self.err(j, "'>' closing '<'"))
    }

    /// One op starting at token `first`, ending before `hi` (the enclosing region's `}`).
    fn op(&self, first: usize, hi: usize) -> PResult<Op> {
        let mut j = first;
        let mut results = Vec::new();
        if self.kind(j) == Some(Kind::Value) {
            loop {
                let name = self.s(j).to_string();
                j += 1;
                let mut n = 1usize;
                if self.is_punct(j, b':') {
                    n = self.s(j + 1).parse().map_err(|_| self.err(j + 1, "a result count"))?;
                    j += 2;
                }
                if n == 1 {
                    results.push(name);
                } else {
                    results.extend((0..n).map(|k| format!("{name}#{k}")));
                }
                if self.is_punct(j, b',') && self.kind(j + 1) == Some(Kind::Value) {
                    j += 1;
                    continue;
                }
                if !self.is_punct(j, b'=') {
                    return Err(self.err(j, "'=' after the op results"));
                }
                j += 1;
                break;
            }
        }
        match self.kind(j) {
            Some(Kind::Word) => self.pretty(first, results, j, hi),
            Some(Kind::Str) => self.generic(first, results, j),
            _ => Err(self.err(j, "an op name")),
        }
    }

    fn pretty(
        &self,
        first: usize,
        results: Vec<String>,
        name_tok: usize,
        hi: usize,
    ) -> PResult<Op> {
        let depth = self.toks[name_tok].depth;
        let mut j = name_tok + 1;
        let mut angle = 0i32;
        let (mut operands, mut inits, mut defs) = (Vec::new(), Vec::new(), Vec::new());
        let mut callee = None;
        let mut colon = None;
        while j < hi {
            let t = self.toks[j];
            if t.depth == depth && angle == 0 && self.starts_line(j) {
                break;
            }
            match t.kind {
                Kind::Punct(b':') if t.depth == depth && angle == 0 => {
                    colon = Some(j);
                    break;
                }
                Kind::Punct(b'{') => {
                    j = t.pair + 1;
                    continue;
                }
                Kind::Punct(b'<') => angle += 1,
                Kind::Punct(b'>') => angle -= 1,
                Kind::Value => {
                    if self.is_punct(j + 1, b'=') {
                        defs.push(j);
                    } else if j >= 2 && self.is_punct(j - 1, b':') && self.is_word(j - 2, "init") {
                        inits.push(j);
                    } else {
                        operands.push(j);
                    }
                }
                Kind::Symbol if callee.is_none() => callee = Some(j),
                _ => {}
            }
            j += 1;
        }
        operands.extend(inits);
        let attrs: Vec<Range<usize>> = std::iter::once(name_tok + 1..colon.unwrap_or(j)).collect();
        let (sig, mut j) = match colon {
            Some(c) => self.signature(c + 1)?,
            None => (Sig::None, j),
        };
        let sig_end = j;
        let mut regions = Vec::new();
        let args = |defs: &[usize]| -> Vec<BlockArg> {
            defs.iter().map(|&tok| BlockArg { tok, ty: None }).collect()
        };
        if self.is_word(j, "cond") {
            regions.push(self.region(j + 1, args(&defs))?);
            j = self.pair(j + 1) + 1;
            if !self.is_word(j, "do") {
                return Err(self.err(j, "\"do\" after the loop condition"));
            }
            regions.push(self.region(j + 1, args(&defs))?);
            j = self.pair(j + 1) + 1;
        } else if self.is_word(j, "reducer") {
            j += 1;
            let mut rargs = Vec::new();
            while self.is_punct(j, b'(') {
                rargs.extend(self.block_args(j)?);
                j = self.pair(j) + 1;
            }
            regions.push(self.region(j, rargs)?);
            j = self.pair(j) + 1;
        }
        Ok(Op {
            first,
            results,
            name: self.s(name_tok).to_string(),
            name_tok,
            operands,
            callee,
            attrs,
            sig,
            sig_end,
            regions,
            end: j,
        })
    }

    fn generic(&self, first: usize, results: Vec<String>, name_tok: usize) -> PResult<Op> {
        let quoted = self.s(name_tok);
        let name = quoted.get(1..quoted.len().saturating_sub(1)).unwrap_or("").to_string();
        let mut j = name_tok + 1;
        if !self.is_punct(j, b'(') {
            return Err(self.err(j, "'(' opening the operands"));
        }
        let close = self.pair(j);
        let operands: Vec<usize> =
            (j + 1..close).filter(|&k| self.kind(k) == Some(Kind::Value)).collect();
        j = close + 1;
        if self.is_punct(j, b'[') {
            let at = self.toks[j].start;
            return Err((at, "ops with successors are not supported".to_string()));
        }
        let mut attrs = Vec::new();
        if self.is_punct(j, b'<') {
            let end = self.angle_end(j)?;
            attrs.push(j..end);
            j = end;
        }
        let mut regions = Vec::new();
        if self.is_punct(j, b'(') {
            let close = self.pair(j);
            let mut k = j + 1;
            while k < close {
                regions.push(self.region(k, Vec::new())?);
                k = self.pair(k) + 1;
                if self.is_punct(k, b',') {
                    k += 1;
                }
            }
            j = close + 1;
        }
        if self.is_punct(j, b'{') {
            attrs.push(j..self.pair(j) + 1);
            j = self.pair(j) + 1;
        }
        if !self.is_punct(j, b':') {
            return Err(self.err(j, "':' before the op's type signature"));
        }
        let (sig, end) = self.signature(j + 1)?;
        let callee =
            attrs.iter().flat_map(|r| r.clone()).find(|&k| self.kind(k) == Some(Kind::Symbol));
        Ok(Op {
            first,
            results,
            name,
            name_tok,
            operands,
            callee,
            attrs,
            sig,
            sig_end: end,
            regions,
            end,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The refiner

struct Edit {
    range: Range<usize>,
    text: String,
}

/// One specialised copy of a function.
struct Spec {
    func: usize,
    text: String,
    name: String,
    results: Vec<Val>,
}

struct Refiner<'m, 't> {
    /// The text given to [`refine`] (for error positions).
    input: &'t str,
    /// The location-free text everything else refers to.
    text: &'t str,
    toks: &'m [Tok],
    segments: &'m [(usize, usize)],
    module: &'m Module<'t>,
    parsed: Vec<Option<Rc<Vec<Op>>>>,
    specs: BTreeMap<(usize, Vec<Val>), usize>,
    made: Vec<Spec>,
    active: Vec<usize>,
    symbols: BTreeSet<String>,
    /// A prefix no `%value` of the module starts with, for inlined regions.
    value_prefix: String,
    inlined: usize,
}

fn is_terminator(name: &str) -> bool {
    matches!(name, "return" | "func.return" | "stablehlo.return")
}

fn short_name(name: &str) -> &str {
    name.strip_prefix("stablehlo.").unwrap_or(name)
}

/// Ops whose result has the shape of their (equal-shaped) operands.
const ELEMENTWISE: &[&str] = &[
    "abs",
    "add",
    "and",
    "atan2",
    "cbrt",
    "ceil",
    "compare",
    "convert",
    "cosine",
    "count_leading_zeros",
    "divide",
    "exponential",
    "exponential_minus_one",
    "floor",
    "is_finite",
    "log",
    "log_plus_one",
    "logistic",
    "map",
    "maximum",
    "minimum",
    "multiply",
    "negate",
    "not",
    "or",
    "popcnt",
    "power",
    "reduce_precision",
    "remainder",
    "reverse",
    "round_nearest_afz",
    "round_nearest_even",
    "rsqrt",
    "shift_left",
    "shift_right_arithmetic",
    "shift_right_logical",
    "sign",
    "sine",
    "sqrt",
    "subtract",
    "tan",
    "tanh",
    "xor",
    "chlo.acos",
    "chlo.acosh",
    "chlo.asin",
    "chlo.asinh",
    "chlo.atan",
    "chlo.atanh",
    "chlo.bessel_i1e",
    "chlo.cosh",
    "chlo.digamma",
    "chlo.erf",
    "chlo.erf_inv",
    "chlo.erfc",
    "chlo.is_inf",
    "chlo.is_neg_inf",
    "chlo.is_pos_inf",
    "chlo.lgamma",
    "chlo.sinh",
    "chlo.square",
    "chlo.tan",
];

impl<'m, 't> Refiner<'m, 't> {
    fn new(
        input: &'t str,
        text: &'t str,
        segments: &'m [(usize, usize)],
        module: &'m Module<'t>,
    ) -> Self {
        let toks: &'m [Tok] = &module.toks;
        let mut value_prefix = String::from("rw");
        let starts = |p: &str| {
            toks.iter().any(|t| t.kind == Kind::Value && text[t.start + 1..t.end].starts_with(p))
        };
        while starts(&value_prefix) {
            value_prefix.push('_');
        }
        Refiner {
            input,
            text,
            toks,
            segments,
            module,
            parsed: vec![None; module.functions.len()],
            specs: BTreeMap::new(),
            made: Vec::new(),
            active: Vec::new(),
            symbols: module
                .functions
                .iter()
                .map(|f| f.name.clone())
                .chain(module.meshes.iter().map(|m| m.name.clone()))
                .collect(),
            value_prefix,
            inlined: 0,
        }
    }

    fn parser(&self) -> Parser<'_> {
        Parser { text: self.text, toks: self.toks }
    }

    fn s(&self, i: usize) -> &'t str {
        let text: &'t str = self.text;
        self.toks.get(i).map_or("", |t| &text[t.start..t.end])
    }

    /// Line and column in the input text of a byte offset in the stripped text.
    fn position(&self, offset: usize) -> (usize, usize) {
        let k = self.segments.partition_point(|s| s.0 <= offset);
        let original = match k.checked_sub(1).and_then(|k| self.segments.get(k)) {
            Some(&(stripped, orig)) => orig + (offset - stripped),
            None => offset,
        };
        reader::line_col(self.input, original)
    }

    fn op_error(&self, op: &Op, reason: impl Into<String>) -> RefineError {
        let (line, column) = self.position(self.toks[op.first].start);
        RefineError::Op { op: op.name.clone(), line, column, reason: reason.into() }
    }

    fn func_error(&self, fi: usize, reason: impl Into<String>) -> RefineError {
        let f = &self.module.functions[fi];
        let (line, column) = self.position(f.span.start);
        RefineError::Op {
            op: format!("func.func @{}", f.name),
            line,
            column,
            reason: reason.into(),
        }
    }

    fn parse_function(&mut self, fi: usize) -> Result<Rc<Vec<Op>>, RefineError> {
        if let Some(ops) = &self.parsed[fi] {
            return Ok(ops.clone());
        }
        let body = self.module.functions[fi].body_toks.clone();
        let (args, ops) = self.parser().block(body.start, body.end).map_err(|(at, message)| {
            let (line, column) = self.position(at);
            RefineError::Syntax { line, column, message }
        })?;
        if !args.is_empty() {
            return Err(self.func_error(fi, "a function body with a block label"));
        }
        let ops = Rc::new(ops);
        self.parsed[fi] = Some(ops.clone());
        Ok(ops)
    }

    /// The specialisation of function `fi` for these arguments (made if new); its index in
    /// `made`.
    fn specialize(&mut self, fi: usize, args: Vec<Val>) -> Result<usize, RefineError> {
        let key = (fi, args);
        if let Some(&s) = self.specs.get(&key) {
            return Ok(s);
        }
        let (fi, args) = key;
        if self.active.contains(&fi) {
            return Err(self.func_error(fi, "recursive calls are not supported"));
        }
        let module = self.module;
        let f = &module.functions[fi];
        let first = !self.made.iter().any(|s| s.func == fi);
        let name = if first { f.name.clone() } else { self.fresh_name(&f.name) };
        self.active.push(fi);
        let body = self.specialize_body(fi, &args);
        self.active.pop();
        let (results, body) = body?;
        let visibility = if first { f.visibility } else { Visibility::Private };
        let arg_types: Vec<TensorType> = args.iter().map(|v| v.ty.clone()).collect();
        let result_types: Vec<TensorType> = results.iter().map(|v| v.ty.clone()).collect();
        let text = function_text(f, &name, visibility, &arg_types, &result_types, &body);
        self.made.push(Spec { func: fi, text, name, results });
        let index = self.made.len() - 1;
        self.specs.insert((fi, args), index);
        Ok(index)
    }

    fn fresh_name(&mut self, base: &str) -> String {
        let mut k = 1;
        loop {
            let name = format!("{base}_{k}");
            if self.symbols.insert(name.clone()) {
                return name;
            }
            k += 1;
        }
    }

    /// Refines the body of function `fi` for `args`: its results and the rewritten body text.
    fn specialize_body(
        &mut self,
        fi: usize,
        args: &[Val],
    ) -> Result<(Vec<Val>, String), RefineError> {
        let module = self.module;
        let f = &module.functions[fi];
        let ops = self.parse_function(fi)?;
        let mut env = Env::new();
        for (a, v) in f.args.iter().zip(args) {
            env.insert(a.name.clone().unwrap_or_default(), v.clone());
        }
        let mut edits = Vec::new();
        let Some(results) = self.refine_ops(&ops, &mut env, &mut edits)? else {
            return Err(self.func_error(fi, "the body does not end with a return"));
        };
        if results.len() != f.results.len() {
            let msg = format!("returns {} values, declares {}", results.len(), f.results.len());
            return Err(self.func_error(fi, msg));
        }
        for (k, (r, v)) in f.results.iter().zip(&results).enumerate() {
            if !fits(&r.ty, &v.ty) {
                let msg = format!("result {k} is refined to {}, declared {}", v.ty, r.ty);
                return Err(self.func_error(fi, msg));
            }
        }
        let body = apply_edits(self.text, f.body_span.clone(), edits)
            .map_err(|at| self.func_error(fi, format!("overlapping rewrites at byte {at}")))?;
        Ok((results, body))
    }

    /// Refines a block's ops in order; the operands of its terminator if it ends with one.
    fn refine_ops(
        &mut self,
        ops: &[Op],
        env: &mut Env,
        edits: &mut Vec<Edit>,
    ) -> Result<Option<Vec<Val>>, RefineError> {
        let mut last = None;
        for op in ops {
            last = self.refine_op(op, env, edits)?;
        }
        Ok(last)
    }

    fn operand_vals(&self, op: &Op, env: &Env) -> Result<Vec<Val>, RefineError> {
        op.operands
            .iter()
            .map(|&t| {
                let name = self.s(t);
                env.get(name)
                    .cloned()
                    .ok_or_else(|| self.op_error(op, format!("use of undefined value {name}")))
            })
            .collect()
    }

    fn refine_op(
        &mut self,
        op: &Op,
        env: &mut Env,
        edits: &mut Vec<Edit>,
    ) -> Result<Option<Vec<Val>>, RefineError> {
        let operands = self.operand_vals(op, env)?;
        let types: Vec<TensorType> = operands.iter().map(|v| v.ty.clone()).collect();
        if is_terminator(&op.name) {
            self.retype(op, &types, &[], edits)?;
            return Ok(Some(operands));
        }
        let short = short_name(&op.name);
        let results = match short {
            "call" | "func.call" => self.refine_call(op, op.callee, &operands, edits)?,
            "composite" => {
                // Computes what its decomposition function computes: refined like a call.
                let callee = self.attr(op, "decomposition").filter(|&i| self.kind_is_symbol(i));
                self.refine_call(op, callee, &operands, edits)?
            }
            "custom_call" => {
                let target = match op.callee {
                    Some(t) => reader::symbol_name(self.text, &self.toks[t])?,
                    None => String::new(),
                };
                match target.as_str() {
                    "shape_assertion" => {
                        self.shape_assertion(op, &operands, edits)?;
                        Vec::new()
                    }
                    "stablehlo.dynamic_reduce_window" => {
                        self.dynamic_reduce_window(op, &operands, edits)?
                    }
                    _ => self.refine_plain(op, short, &operands, env, edits)?,
                }
            }
            "dynamic_broadcast_in_dim"
            | "dynamic_reshape"
            | "dynamic_iota"
            | "real_dynamic_slice"
            | "dynamic_pad"
            | "dynamic_gather" => self.refine_dynamic(op, short, &operands, edits)?,
            "while" => self.refine_while(op, &operands, env, edits)?,
            "case" | "if" => self.refine_branches(op, &operands, env, edits)?,
            _ => self.refine_plain(op, short, &operands, env, edits)?,
        };
        if results.len() != op.results.len() {
            let msg = format!("{} results are named, {} refined", op.results.len(), results.len());
            return Err(self.op_error(op, msg));
        }
        for (name, v) in op.results.iter().zip(results) {
            env.insert(name.clone(), v);
        }
        Ok(None)
    }

    /// The result types as printed in the op's signature.
    fn printed_results(&self, op: &Op) -> Result<Vec<TensorType>, RefineError> {
        let printed: Vec<TensorType> = match &op.sig {
            Sig::None => Vec::new(),
            Sig::Func { results, .. } => results.iter().map(|t| t.ty.clone()).collect(),
            Sig::List(list) => {
                let short = short_name(&op.name);
                match (short, list.as_slice()) {
                    ("while", _) => list.iter().map(|t| t.ty.clone()).collect(),
                    ("select", [_, value]) => vec![value.ty.clone()],
                    (_, [one]) => vec![one.ty.clone()],
                    _ => return Err(self.op_error(op, "unsupported type signature")),
                }
            }
        };
        if printed.len() != op.results.len() {
            let msg = format!(
                "the signature has {} result types for {} results",
                printed.len(),
                op.results.len()
            );
            return Err(self.op_error(op, msg));
        }
        Ok(printed)
    }

    /// Replaces the types of the op's signature by the refined operand and result types.
    fn retype(
        &self,
        op: &Op,
        operands: &[TensorType],
        results: &[TensorType],
        edits: &mut Vec<Edit>,
    ) -> Result<(), RefineError> {
        let mismatch = || self.op_error(op, "the type signature does not match the operands");
        let mut pairs: Vec<(&TypeRef, &TensorType)> = Vec::new();
        match &op.sig {
            Sig::None => {
                if !operands.is_empty() || !results.is_empty() {
                    return Err(self.op_error(op, "expected a type signature"));
                }
            }
            Sig::Func { operands: po, results: pr } => {
                if po.len() != operands.len() || pr.len() != results.len() {
                    return Err(mismatch());
                }
                pairs.extend(po.iter().zip(operands));
                pairs.extend(pr.iter().zip(results));
            }
            Sig::List(list) => {
                let short = short_name(&op.name);
                if is_terminator(&op.name) || short == "while" {
                    if list.len() != operands.len() {
                        return Err(mismatch());
                    }
                    pairs.extend(list.iter().zip(operands));
                } else if let (Some(result), [first, rest @ ..]) =
                    (results.first(), list.as_slice())
                {
                    let (single, others) = match (short, rest) {
                        ("select", [value]) => {
                            pairs.push((first, &operands[0]));
                            (value, &operands[1..])
                        }
                        (_, []) => (first, operands),
                        _ => return Err(mismatch()),
                    };
                    if let Some(t) = others.iter().find(|t| *t != result) {
                        let msg = format!(
                            "an operand is refined to {t} but the signature gives one type \
                             {result} for operands and result"
                        );
                        return Err(self.op_error(op, msg));
                    }
                    pairs.push((single, result));
                } else {
                    return Err(mismatch());
                }
            }
        }
        for (printed, ty) in pairs {
            self.edit_type(op, printed, ty, edits)?;
        }
        Ok(())
    }

    fn edit_type(
        &self,
        op: &Op,
        printed: &TypeRef,
        ty: &TensorType,
        edits: &mut Vec<Edit>,
    ) -> Result<(), RefineError> {
        if printed.ty == *ty {
            return Ok(());
        }
        if !fits(&printed.ty, ty) {
            let msg = format!("refined type {ty} does not fit the printed type {}", printed.ty);
            return Err(self.op_error(op, msg));
        }
        edits.push(Edit { range: printed.span.clone(), text: ty.to_string() });
        Ok(())
    }

    /// Binds a region's block arguments to their printed types (which must be static).
    fn bind_printed_args(
        &self,
        op: &Op,
        region: &Region,
        env: &mut Env,
    ) -> Result<(), RefineError> {
        for arg in &region.args {
            let Some(t) = &arg.ty else {
                return Err(self.op_error(op, "a block argument without a type"));
            };
            if !t.ty.shape.is_static() {
                let msg =
                    format!("block argument {} has the dynamic type {}", self.s(arg.tok), t.ty);
                return Err(self.op_error(op, msg));
            }
            env.insert(self.s(arg.tok).to_string(), Val { ty: t.ty.clone(), konst: None });
        }
        Ok(())
    }

    /// An op without special handling: regions refined as they are, result types inferred.
    fn refine_plain(
        &mut self,
        op: &Op,
        short: &str,
        operands: &[Val],
        env: &mut Env,
        edits: &mut Vec<Edit>,
    ) -> Result<Vec<Val>, RefineError> {
        for region in &op.regions {
            self.bind_printed_args(op, region, env)?;
            self.refine_ops(&region.ops, env, edits)?;
        }
        let printed = self.printed_results(op)?;
        let inferred =
            self.infer(op, short, operands, &printed).map_err(|r| self.op_error(op, r))?;
        let shapes: Vec<Vec<u64>> = match inferred {
            Some(shapes) => shapes,
            None => {
                if let Some(t) = printed.iter().find(|t| !t.shape.is_static()) {
                    let msg = format!("cannot infer its result type {t}");
                    return Err(self.op_error(op, msg));
                }
                printed.iter().map(sdims).collect()
            }
        };
        let results = self.results_from(op, &printed, &shapes)?;
        let types: Vec<TensorType> = operands.iter().map(|v| v.ty.clone()).collect();
        self.retype(op, &types, &results, edits)?;
        let konst = match results.as_slice() {
            [one] => self.fold(op, short, operands, one),
            _ => None,
        };
        Ok(results.into_iter().map(|ty| Val { ty, konst: konst.clone() }).collect())
    }

    /// The result types: printed element types with inferred shapes, checked against the print.
    fn results_from(
        &self,
        op: &Op,
        printed: &[TensorType],
        shapes: &[Vec<u64>],
    ) -> Result<Vec<TensorType>, RefineError> {
        if printed.len() != shapes.len() {
            return Err(self.op_error(op, "the number of results does not match the signature"));
        }
        let mut out = Vec::with_capacity(shapes.len());
        for (p, s) in printed.iter().zip(shapes) {
            let t = static_type(p.dtype, s);
            if !fits(p, &t) {
                let msg = format!("the result is inferred as {t} but printed as {p}");
                return Err(self.op_error(op, msg));
            }
            out.push(t);
        }
        Ok(out)
    }

    /// A call (or composite) of the function named by the symbol token `callee`.
    fn refine_call(
        &mut self,
        op: &Op,
        callee: Option<usize>,
        operands: &[Val],
        edits: &mut Vec<Edit>,
    ) -> Result<Vec<Val>, RefineError> {
        let Some(ct) = callee else {
            return Err(self.op_error(op, "a call without a callee"));
        };
        let name = reader::symbol_name(self.text, &self.toks[ct])?;
        let module = self.module;
        let Some(fi) = module.functions.iter().position(|f| f.name == name) else {
            return Err(self.op_error(op, format!("call to unknown function @{name}")));
        };
        let f = &module.functions[fi];
        if f.args.len() != operands.len() {
            let msg = format!("@{name} takes {} arguments, got {}", f.args.len(), operands.len());
            return Err(self.op_error(op, msg));
        }
        for (k, (a, v)) in f.args.iter().zip(operands).enumerate() {
            if !fits(&a.ty, &v.ty) {
                let msg = format!("operand {k} is {} but @{name} takes {}", v.ty, a.ty);
                return Err(self.op_error(op, msg));
            }
        }
        let s = self.specialize(fi, operands.to_vec())?;
        let spec_name = self.made[s].name.clone();
        let results = self.made[s].results.clone();
        if spec_name != name {
            let t = self.toks[ct];
            edits.push(Edit { range: t.start..t.end, text: reader::format_symbol(&spec_name) });
        }
        let types: Vec<TensorType> = operands.iter().map(|v| v.ty.clone()).collect();
        let rtypes: Vec<TensorType> = results.iter().map(|v| v.ty.clone()).collect();
        self.retype(op, &types, &rtypes, edits)?;
        Ok(results)
    }

    fn refine_while(
        &mut self,
        op: &Op,
        operands: &[Val],
        env: &mut Env,
        edits: &mut Vec<Edit>,
    ) -> Result<Vec<Val>, RefineError> {
        let carried: Vec<TensorType> = operands.iter().map(|v| v.ty.clone()).collect();
        if op.regions.len() != 2 {
            return Err(self.op_error(op, "expected a condition and a body region"));
        }
        for (k, region) in op.regions.iter().enumerate() {
            if region.args.len() != carried.len() {
                return Err(self.op_error(op, "the regions do not take the carried values"));
            }
            for (arg, ty) in region.args.iter().zip(&carried) {
                if let Some(printed) = &arg.ty {
                    self.edit_type(op, printed, ty, edits)?;
                }
                env.insert(self.s(arg.tok).to_string(), Val { ty: ty.clone(), konst: None });
            }
            let returned = self.refine_ops(&region.ops, env, edits)?;
            let Some(returned) = returned else {
                return Err(self.op_error(op, "a region does not end with stablehlo.return"));
            };
            if k == 1 {
                for (j, (v, ty)) in returned.iter().zip(&carried).enumerate() {
                    if v.ty != *ty {
                        let msg = format!(
                            "the loop body changes carried value {j} from {ty} to {}",
                            v.ty
                        );
                        return Err(self.op_error(op, msg));
                    }
                }
                if returned.len() != carried.len() {
                    return Err(self.op_error(op, "the loop body returns the wrong count"));
                }
            }
        }
        let printed = self.printed_results(op)?;
        let shapes: Vec<Vec<u64>> = carried.iter().map(sdims).collect();
        let results = self.results_from(op, &printed, &shapes)?;
        self.retype(op, &carried, &results, edits)?;
        Ok(results.into_iter().map(|ty| Val { ty, konst: None }).collect())
    }

    fn refine_branches(
        &mut self,
        op: &Op,
        operands: &[Val],
        env: &mut Env,
        edits: &mut Vec<Edit>,
    ) -> Result<Vec<Val>, RefineError> {
        let mut result_types: Option<Vec<TensorType>> = None;
        for region in &op.regions {
            if !region.args.is_empty() {
                return Err(self.op_error(op, "a branch with block arguments"));
            }
            let Some(returned) = self.refine_ops(&region.ops, env, edits)? else {
                return Err(self.op_error(op, "a branch does not end with stablehlo.return"));
            };
            let types: Vec<TensorType> = returned.iter().map(|v| v.ty.clone()).collect();
            match &result_types {
                None => result_types = Some(types),
                Some(t) if *t == types => {}
                Some(t) => {
                    let msg = format!(
                        "branches return different types: ({}) and ({})",
                        type_list(t),
                        type_list(&types)
                    );
                    return Err(self.op_error(op, msg));
                }
            }
        }
        let types = result_types.unwrap_or_default();
        let printed = self.printed_results(op)?;
        let shapes: Vec<Vec<u64>> = types.iter().map(sdims).collect();
        let results = self.results_from(op, &printed, &shapes)?;
        let otypes: Vec<TensorType> = operands.iter().map(|v| v.ty.clone()).collect();
        self.retype(op, &otypes, &results, edits)?;
        Ok(results.into_iter().map(|ty| Val { ty, konst: None }).collect())
    }

    /// The raw text of attribute `name` of the op: a string literal, unescaped.
    fn string_attr(&self, op: &Op, name: &str) -> Option<String> {
        let i = self.attr(op, name)?;
        let t = self.toks.get(i).filter(|t| t.kind == Kind::Str)?;
        Some(unescape(&self.text[t.start + 1..t.end - 1]))
    }

    fn shape_assertion(
        &self,
        op: &Op,
        operands: &[Val],
        edits: &mut Vec<Edit>,
    ) -> Result<(), RefineError> {
        let pred = operands.first().and_then(|v| v.konst.as_deref());
        let holds = match pred {
            Some([v]) => *v != 0,
            _ => {
                let msg = "the shape assertion's predicate does not fold to a constant";
                return Err(self.op_error(op, msg));
            }
        };
        if !holds {
            let mut message = self.string_attr(op, "error_message").unwrap_or_default();
            for (k, v) in operands.iter().enumerate().skip(1) {
                if let Some([value]) = v.konst.as_deref() {
                    message = message.replace(&format!("{{{}}}", k - 1), &value.to_string());
                }
            }
            let (line, column) = self.position(self.toks[op.first].start);
            return Err(RefineError::ShapeAssertion { message, line, column });
        }
        // Drop the op with its line.
        let b = self.text.as_bytes();
        let text_start = self.toks[op.first].start;
        let mut start = text_start;
        while start > 0 && matches!(b[start - 1], b' ' | b'\t') {
            start -= 1;
        }
        let range = reader::removal_span(b, start, text_start, self.toks[op.end - 1].end);
        edits.push(Edit { range, text: String::new() });
        Ok(())
    }

    /// The folded elements of operand `k`, required to be a constant.
    fn const_operand(&self, op: &Op, operands: &[Val], k: usize) -> Result<Vec<i64>, RefineError> {
        operands.get(k).and_then(|v| v.konst.clone()).ok_or_else(|| {
            let name = op.operands.get(k).map_or("", |&t| self.s(t));
            self.op_error(op, format!("shape operand {k} ({name}) does not fold to a constant"))
        })
    }

    fn shape_of(&self, op: &Op, operands: &[Val], k: usize) -> Result<Vec<u64>, RefineError> {
        self.const_operand(op, operands, k)?
            .into_iter()
            .map(|v| to_u64(v, "dimension size").map_err(|e| self.op_error(op, e)))
            .collect()
    }

    /// Replaces the op from its name to the end of its signature by `text`.
    fn replace_op(&self, op: &Op, text: String, edits: &mut Vec<Edit>) {
        let start = self.toks[op.name_tok].start;
        let end = self.toks[op.sig_end - 1].end;
        edits.push(Edit { range: start..end, text });
    }

    fn refine_dynamic(
        &mut self,
        op: &Op,
        short: &str,
        operands: &[Val],
        edits: &mut Vec<Edit>,
    ) -> Result<Vec<Val>, RefineError> {
        let printed = self.printed_results(op)?;
        let [printed] = printed.as_slice() else {
            return Err(self.op_error(op, "expected one result"));
        };
        let want = |n: usize| -> Result<(), RefineError> {
            if operands.len() == n {
                Ok(())
            } else {
                let msg = format!("expected {n} operands, found {}", operands.len());
                Err(self.op_error(op, msg))
            }
        };
        let name = |k: usize| self.s(op.operands[k]);
        let e = |r: String| self.op_error(op, r);
        let (dims, text): (Vec<u64>, OpPrinter<'_>) = match short {
            "dynamic_broadcast_in_dim" => {
                want(2)?;
                let out = self.shape_of(op, operands, 1)?;
                let bd = self.ints(op, &["dims", "broadcast_dimensions"]).map_err(e)?;
                let src = sdims(&operands[0].ty);
                check_broadcast(&src, &out, &bd).map_err(e)?;
                let (x, xt) = (name(0), operands[0].ty.clone());
                let bd = join(&bd);
                (
                    out,
                    Box::new(move |r| {
                        format!("stablehlo.broadcast_in_dim {x}, dims = [{bd}] : ({xt}) -> {r}")
                    }),
                )
            }
            "dynamic_reshape" => {
                want(2)?;
                let out = self.shape_of(op, operands, 1)?;
                if count(&out) != count(&sdims(&operands[0].ty)) {
                    let msg = format!("cannot reshape {} to {:?}", operands[0].ty, out);
                    return Err(self.op_error(op, msg));
                }
                let (x, xt) = (name(0), operands[0].ty.clone());
                (out, Box::new(move |r| format!("stablehlo.reshape {x} : ({xt}) -> {r}")))
            }
            "dynamic_iota" => {
                want(1)?;
                let out = self.shape_of(op, operands, 0)?;
                let d = self.int(op, &["dim", "iota_dimension"]).map_err(e)?;
                if to_usize(d, "iota dimension").map_err(e)? >= out.len() {
                    return Err(self.op_error(op, format!("iota dimension {d} out of range")));
                }
                (out, Box::new(move |r| format!("stablehlo.iota dim = {d} : {r}")))
            }
            "real_dynamic_slice" => {
                want(4)?;
                let src = sdims(&operands[0].ty);
                let start = self.const_operand(op, operands, 1)?;
                let limit = self.const_operand(op, operands, 2)?;
                let strides = self.const_operand(op, operands, 3)?;
                let out = slice_shape(&src, &start, &limit, &strides).map_err(e)?;
                let (x, xt) = (name(0), operands[0].ty.clone());
                let attrs = format!(
                    "limit_indices = {}, start_indices = {}, strides = {}",
                    array_attr(&limit),
                    array_attr(&start),
                    array_attr(&strides)
                );
                (
                    out,
                    Box::new(move |r| {
                        format!("\"stablehlo.slice\"({x}) <{{{attrs}}}> : ({xt}) -> {r}")
                    }),
                )
            }
            "dynamic_pad" => {
                want(5)?;
                let src = sdims(&operands[0].ty);
                let low = self.const_operand(op, operands, 2)?;
                let high = self.const_operand(op, operands, 3)?;
                let interior = self.const_operand(op, operands, 4)?;
                let out = pad_shape(&src, &low, &high, &interior).map_err(e)?;
                let (x, v) = (name(0), name(1));
                let (xt, vt) = (operands[0].ty.clone(), operands[1].ty.clone());
                let (low, high, interior) = (join(&low), join(&high), join(&interior));
                (
                    out,
                    Box::new(move |r| {
                        format!(
                            "stablehlo.pad {x}, {v}, low = [{low}], high = [{high}], interior = \
                             [{interior}] : ({xt}, {vt}) -> {r}"
                        )
                    }),
                )
            }
            "dynamic_gather" => {
                want(3)?;
                let sizes = self.const_operand(op, operands, 2)?;
                let out = self.gather_shape(op, operands, &sizes).map_err(e)?;
                if self.toks[op.name_tok].kind != Kind::Str {
                    return Err(self.op_error(op, "only the generic form is supported"));
                }
                let mut attrs: Vec<&str> = Vec::new();
                for r in &op.attrs {
                    let open = if self.kind_is(r.start, b'<') { r.start + 1 } else { r.start };
                    if !self.kind_is(open, b'{') {
                        return Err(self.op_error(op, "unexpected attribute syntax"));
                    }
                    let close = self.toks[open].pair;
                    let inner = self.text[self.toks[open].end..self.toks[close].start].trim();
                    if !inner.is_empty() {
                        attrs.push(inner);
                    }
                }
                let attrs = format!("{}, slice_sizes = {}", attrs.join(", "), array_attr(&sizes));
                let (x, i) = (name(0), name(1));
                let (xt, it) = (operands[0].ty.clone(), operands[1].ty.clone());
                (
                    out,
                    Box::new(move |r| {
                        format!(
                            "\"stablehlo.gather\"({x}, {i}) <{{{attrs}}}> : ({xt}, {it}) -> {r}"
                        )
                    }),
                )
            }
            _ => return Err(self.op_error(op, "not a dynamic op")),
        };
        let result = self.results_from(op, std::slice::from_ref(printed), &[dims])?;
        let result = result.into_iter().next().unwrap_or_else(|| printed.clone());
        self.replace_op(op, text(&result), edits);
        let konst = self.fold(op, short, operands, &result);
        Ok(vec![Val { ty: result, konst }])
    }

    fn kind_is(&self, i: usize, c: u8) -> bool {
        self.toks.get(i).is_some_and(|t| t.kind == Kind::Punct(c))
    }

    fn kind_is_symbol(&self, i: usize) -> bool {
        self.toks.get(i).is_some_and(|t| t.kind == Kind::Symbol)
    }

    /// `stablehlo.custom_call @stablehlo.dynamic_reduce_window(inputs..., inits..., window
    /// dimensions, strides, base dilations, window dilations, padding)` becomes a
    /// `stablehlo.reduce_window` whose region is the reducer function, inlined.
    fn dynamic_reduce_window(
        &mut self,
        op: &Op,
        operands: &[Val],
        edits: &mut Vec<Edit>,
    ) -> Result<Vec<Val>, RefineError> {
        let m = operands.len();
        if m < 7 || !(m - 5).is_multiple_of(2) {
            return Err(self.op_error(op, format!("unexpected operand count {m}")));
        }
        let n = (m - 5) / 2;
        let window = self.const_operand(op, operands, 2 * n)?;
        let strides = self.const_operand(op, operands, 2 * n + 1)?;
        let base = self.const_operand(op, operands, 2 * n + 2)?;
        let dilations = self.const_operand(op, operands, 2 * n + 3)?;
        let padding = self.const_operand(op, operands, 2 * n + 4)?;
        let src = sdims(&operands[0].ty);
        let out = reduce_window_shape(&src, &window, &strides, &base, &dilations, &padding)
            .map_err(|r| self.op_error(op, r))?;
        let printed = self.printed_results(op)?;
        let results = self.results_from(op, &printed, &vec![out; n])?;
        let reducer = self
            .attr(op, "called_computations")
            .filter(|&i| self.kind_is(i, b'['))
            .map(|i| i + 1)
            .filter(|&i| self.toks[i].kind == Kind::Symbol)
            .ok_or_else(|| self.op_error(op, "no reducer in called_computations"))?;
        let reducer = reader::symbol_name(self.text, &self.toks[reducer])?;
        let region = self.inline_region(op, &reducer)?;
        let names: Vec<&str> = op.operands[..2 * n].iter().map(|&t| self.s(t)).collect();
        let in_types: Vec<TensorType> = operands[..2 * n].iter().map(|v| v.ty.clone()).collect();
        let rank = src.len();
        let pad_rows: Vec<String> = padding.chunks(2).map(|p| format!("[{}]", join(p))).collect();
        let text = format!(
            "\"stablehlo.reduce_window\"({}) <{{base_dilations = {}, padding = dense<[{}]> : \
             tensor<{rank}x2xi64>, window_dilations = {}, window_dimensions = {}, \
             window_strides = {}}}> ({region}) : ({}) -> {}",
            names.join(", "),
            array_attr(&base),
            pad_rows.join(", "),
            array_attr(&dilations),
            array_attr(&window),
            array_attr(&strides),
            type_list(&in_types),
            result_list(&results)
        );
        self.replace_op(op, text, edits);
        Ok(results.into_iter().map(|ty| Val { ty, konst: None }).collect())
    }

    /// The body of function `name` as a region: `{ ^bb0(args): ops stablehlo.return ... }`, its
    /// values renamed with a prefix no value of the module has.
    fn inline_region(&mut self, op: &Op, name: &str) -> Result<String, RefineError> {
        let module = self.module;
        let Some(fi) = module.functions.iter().position(|f| f.name == name) else {
            return Err(self.op_error(op, format!("unknown reducer function @{name}")));
        };
        let f = &module.functions[fi];
        if f.args.iter().chain(&f.results).any(|a| !a.ty.shape.is_static()) {
            return Err(self.op_error(op, format!("reducer @{name} has dynamic types")));
        }
        let ops = self.parse_function(fi)?;
        let Some(ret) = ops.last().filter(|o| matches!(o.name.as_str(), "return" | "func.return"))
        else {
            return Err(self.op_error(op, format!("reducer @{name} does not end with a return")));
        };
        let prefix = format!("{}{}_", self.value_prefix, self.inlined);
        self.inlined += 1;
        let rename = |v: &str| format!("%{prefix}{}", &v[1..]);
        let mut out = String::from("{\n    ^bb0(");
        for (k, a) in f.args.iter().enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            out.push_str(&rename(a.name.as_deref().unwrap_or("%")));
            out.push_str(": ");
            out.push_str(&a.ty.to_string());
        }
        out.push_str("):");
        let mut cursor = f.body_span.start;
        for i in f.body_toks.clone() {
            let t = self.toks[i];
            let new = if t.kind == Kind::Value {
                rename(&self.text[t.start..t.end])
            } else if i == ret.name_tok {
                "stablehlo.return".to_string()
            } else {
                continue;
            };
            out.push_str(&self.text[cursor..t.start]);
            out.push_str(&new);
            cursor = t.end;
        }
        out.push_str(&self.text[cursor..f.body_span.end]);
        out.push('}');
        Ok(out)
    }

    // -----------------------------------------------------------------------------------------
    // Attributes

    /// Token index of the value of attribute `name` (after `name =`).
    fn attr(&self, op: &Op, name: &str) -> Option<usize> {
        op.attrs.iter().flat_map(|r| r.clone()).find_map(|i| {
            let t = self.toks[i];
            (t.kind == Kind::Word && self.s(i) == name && self.kind_is(i + 1, b'='))
                .then_some(i + 2)
        })
    }

    /// The integers of the value at token `i`: `[1, 2]`, `array<i64: 1, 2>`, `dense<...>`, `3`,
    /// `-1`; and the token index after it.
    fn ints_at(&self, i: usize) -> Option<(Vec<i64>, usize)> {
        let t = self.toks.get(i)?;
        let (lo, hi, next) = match t.kind {
            Kind::Punct(b'[') => (i + 1, t.pair, t.pair + 1),
            Kind::Word if matches!(self.s(i), "array" | "dense") && self.kind_is(i + 1, b'<') => {
                let end = self.parser().angle_end(i + 1).ok()?;
                let mut lo = i + 2;
                if self.s(i) == "array" {
                    lo += 1; // the element type
                    if self.kind_is(lo, b':') {
                        lo += 1;
                    }
                }
                (lo, end - 1, end)
            }
            _ => {
                let (v, next) = self.int_at(i)?;
                return Some((vec![v], next));
            }
        };
        let mut out = Vec::new();
        let mut k = lo;
        while k < hi {
            match self.toks[k].kind {
                Kind::Punct(b'[' | b']' | b',') => k += 1,
                _ => {
                    let (v, next) = self.int_at(k)?;
                    out.push(v);
                    k = next;
                }
            }
        }
        Some((out, next))
    }

    fn int_at(&self, i: usize) -> Option<(i64, usize)> {
        if self.kind_is(i, b'-') {
            let v: i64 = self.s(i + 1).parse().ok()?;
            return Some((-v, i + 2));
        }
        match self.s(i) {
            "true" => Some((1, i + 1)),
            "false" => Some((0, i + 1)),
            s => Some((s.parse().ok()?, i + 1)),
        }
    }

    /// The integer list of the first attribute among `names` that is present.
    fn ints_opt(&self, op: &Op, names: &[&str]) -> Result<Option<Vec<i64>>, String> {
        for name in names {
            if let Some(i) = self.attr(op, name) {
                return match self.ints_at(i) {
                    Some((v, _)) => Ok(Some(v)),
                    None => Err(format!("cannot read attribute {name}")),
                };
            }
        }
        Ok(None)
    }

    fn ints(&self, op: &Op, names: &[&str]) -> Result<Vec<i64>, String> {
        self.ints_opt(op, names)?.ok_or_else(|| format!("missing attribute {}", names.join(" or ")))
    }

    fn int(&self, op: &Op, names: &[&str]) -> Result<i64, String> {
        match self.ints(op, names)?.as_slice() {
            [v] => Ok(*v),
            _ => Err(format!("attribute {} is not one integer", names.join(" or "))),
        }
    }

    fn dims_attr(&self, op: &Op, names: &[&str], rank: usize) -> Result<Vec<usize>, String> {
        let v = self.ints(op, names)?;
        let out: Vec<usize> =
            v.iter().map(|&d| to_usize(d, "dimension")).collect::<Result<_, _>>()?;
        if let Some(d) = out.iter().find(|&&d| d >= rank) {
            return Err(format!("dimension {d} is out of range for rank {rank}"));
        }
        Ok(out)
    }

    /// Pretty `dims = [1] x [0]`: the two lists.
    fn int_pair(&self, op: &Op, name: &str) -> Result<Option<IntPair>, String> {
        let Some(i) = self.attr(op, name) else { return Ok(None) };
        let bad = || format!("cannot read attribute {name}");
        let (lhs, next) = self.ints_at(i).ok_or_else(bad)?;
        if self.s(next) != "x" {
            return Err(bad());
        }
        let (rhs, _) = self.ints_at(next + 1).ok_or_else(bad)?;
        Ok(Some((lhs, rhs)))
    }

    /// Pretty slice bounds `[a:b, c:d:s]`.
    fn pretty_slice(&self, op: &Op) -> Option<(Vec<i64>, Vec<i64>, Vec<i64>)> {
        let depth = self.toks[op.name_tok].depth;
        let open = op.attrs.first()?.clone().find(|&i| {
            self.toks[i].depth == depth && self.kind_is(i, b'[') && !self.kind_is(i - 1, b'=')
        })?;
        let close = self.toks[open].pair;
        let (mut start, mut limit, mut strides) = (Vec::new(), Vec::new(), Vec::new());
        let mut k = open + 1;
        while k < close {
            let (a, n) = self.int_at(k)?;
            if !self.kind_is(n, b':') {
                return None;
            }
            let (b, mut n) = self.int_at(n + 1)?;
            let mut s = 1;
            if self.kind_is(n, b':') {
                (s, n) = self.int_at(n + 1)?;
            }
            start.push(a);
            limit.push(b);
            strides.push(s);
            k = if self.kind_is(n, b',') { n + 1 } else { n };
        }
        Some((start, limit, strides))
    }

    fn gather_shape(&self, op: &Op, operands: &[Val], sizes: &[i64]) -> Result<Vec<u64>, String> {
        let indices = operands.get(1).map(|v| sdims(&v.ty)).ok_or("expected start indices")?;
        let offset_dims = self.ints_opt(op, &["offset_dims"])?.unwrap_or_default();
        let collapsed = self.ints_opt(op, &["collapsed_slice_dims"])?.unwrap_or_default();
        let batching = self.ints_opt(op, &["operand_batching_dims"])?.unwrap_or_default();
        let ivd = match self.ints_opt(op, &["index_vector_dim"])?.as_deref() {
            Some([v]) => to_usize(*v, "index_vector_dim")?,
            Some(_) => return Err("cannot read index_vector_dim".to_string()),
            None => 0,
        };
        let mut batch = indices;
        if ivd < batch.len() {
            batch.remove(ivd);
        }
        let mut offsets = Vec::new();
        for (i, &s) in sizes.iter().enumerate() {
            let i = i as i64;
            if !collapsed.contains(&i) && !batching.contains(&i) {
                offsets.push(to_u64(s, "slice size")?);
            }
        }
        if offsets.len() != offset_dims.len() {
            return Err("offset_dims does not match the slice sizes".to_string());
        }
        let rank = batch.len() + offsets.len();
        let (mut bi, mut oi) = (batch.into_iter(), offsets.into_iter());
        (0..rank)
            .map(|d| {
                if offset_dims.contains(&(d as i64)) { oi.next() } else { bi.next() }
                    .ok_or_else(|| "inconsistent gather dimension numbers".to_string())
            })
            .collect()
    }

    /// The three layouts of `[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]` (pretty `dim_numbers` or
    /// `#stablehlo.conv<...>` in `dimension_numbers`).
    fn conv_layouts(&self, op: &Op) -> Result<[Vec<String>; 3], String> {
        let bad = || "cannot read the convolution dimension numbers".to_string();
        let start = self
            .attr(op, "dim_numbers")
            .or_else(|| self.attr(op, "dimension_numbers"))
            .ok_or_else(bad)?;
        let mut i = (start..start + 4).find(|&i| self.kind_is(i, b'[')).ok_or_else(bad)?;
        let mut out: [Vec<String>; 3] = Default::default();
        for (k, layout) in out.iter_mut().enumerate() {
            if k > 0 {
                let sep_ok = if k == 1 {
                    self.s(i) == "x"
                } else {
                    self.toks.get(i).is_some_and(|t| t.kind == Kind::Arrow)
                };
                if !sep_ok {
                    return Err(bad());
                }
                i += 1;
            }
            if !self.kind_is(i, b'[') {
                return Err(bad());
            }
            let close = self.toks[i].pair;
            *layout = (i + 1..close)
                .filter(|&j| self.toks[j].kind == Kind::Word)
                .map(|j| self.s(j).to_string())
                .collect();
            i = close + 1;
        }
        Ok(out)
    }

    fn convolution_shape(&self, op: &Op, shapes: &[Vec<u64>]) -> Result<Vec<u64>, String> {
        let [l, r] = shapes else {
            return Err("expected two operands".to_string());
        };
        let [li, ri, oi] = self.conv_layouts(op)?;
        if li.len() != l.len() || ri.len() != r.len() || oi.len() != l.len() {
            return Err("the dimension numbers do not match the operand ranks".to_string());
        }
        let pos = |layout: &[String], label: &str| {
            layout
                .iter()
                .position(|x| x == label)
                .ok_or_else(|| format!("dimension {label} missing from the dimension numbers"))
        };
        let n = l.len().saturating_sub(2);
        let ones = vec![1; n];
        let strides = self.ints_opt(op, &["stride", "window_strides"])?.unwrap_or(ones.clone());
        let pad = self.ints_opt(op, &["pad", "padding"])?.unwrap_or_else(|| vec![0; 2 * n]);
        let lhs_dil = self.ints_opt(op, &["lhs_dilate", "lhs_dilation"])?.unwrap_or(ones.clone());
        let rhs_dil = self.ints_opt(op, &["rhs_dilate", "rhs_dilation"])?.unwrap_or(ones);
        let groups = self.ints_opt(op, &["batch_group_count"])?.unwrap_or_else(|| vec![1]);
        let groups = match groups.as_slice() {
            [g] if *g >= 1 => *g as u64,
            _ => return Err("cannot read batch_group_count".to_string()),
        };
        if strides.len() != n || pad.len() != 2 * n || lhs_dil.len() != n || rhs_dil.len() != n {
            return Err("window attributes do not match the spatial rank".to_string());
        }
        let mut out = vec![0u64; l.len()];
        out[pos(&oi, "b")?] = l[pos(&li, "b")?] / groups;
        out[pos(&oi, "f")?] = r[pos(&ri, "o")?];
        for k in 0..n {
            let label = k.to_string();
            let (s, w) = (l[pos(&li, &label)?] as i64, r[pos(&ri, &label)?] as i64);
            if strides[k] < 1 || lhs_dil[k] < 1 || rhs_dil[k] < 1 {
                return Err("strides and dilations must be positive".to_string());
            }
            let dilated = if s == 0 { 0 } else { (s - 1) * lhs_dil[k] + 1 };
            let padded = dilated + pad[2 * k] + pad[2 * k + 1];
            let window = if w == 0 { 0 } else { (w - 1) * rhs_dil[k] + 1 };
            out[pos(&oi, &label)?] =
                if padded < window { 0 } else { ((padded - window) / strides[k] + 1) as u64 };
        }
        Ok(out)
    }

    // -----------------------------------------------------------------------------------------
    // Type rules

    /// The result shapes of an op from its operands and attributes, or `None` when there is no
    /// rule for it.
    fn infer(
        &self,
        op: &Op,
        short: &str,
        operands: &[Val],
        printed: &[TensorType],
    ) -> Result<Option<Vec<Vec<u64>>>, String> {
        let shapes: Vec<Vec<u64>> = operands.iter().map(|v| sdims(&v.ty)).collect();
        let first = || shapes.first().cloned().ok_or_else(|| "expected an operand".to_string());
        let same = |s: &[u64], others: &[Vec<u64>]| -> Result<(), String> {
            match others.iter().find(|o| o.as_slice() != s) {
                Some(o) => Err(format!("operand shapes differ: {s:?} and {o:?}")),
                None => Ok(()),
            }
        };
        let one = |s: Vec<u64>| Ok(Some(vec![s]));
        match short {
            _ if ELEMENTWISE.contains(&short) => {
                let s = first()?;
                same(&s, &shapes)?;
                Ok(Some(vec![s; printed.len()]))
            }
            "optimization_barrier" => Ok(Some(shapes)),
            "bitcast_convert" => {
                let (Some(v), Some(p)) = (operands.first(), printed.first()) else {
                    return Err("expected one operand and one result".to_string());
                };
                if v.ty.dtype.bits() == p.dtype.bits() { one(first()?) } else { Ok(None) }
            }
            "select" | "clamp" => {
                let [a, b, c] = shapes.as_slice() else {
                    return Err("expected three operands".to_string());
                };
                // select: a scalar or same-shaped predicate; clamp: scalar or same-shaped bounds.
                let loose: &[&Vec<u64>] = if short == "select" {
                    same(b, std::slice::from_ref(c))?;
                    &[a]
                } else {
                    &[a, c]
                };
                for x in loose {
                    if !x.is_empty() && *x != b {
                        return Err(format!("operand shapes differ: {b:?} and {x:?}"));
                    }
                }
                one(b.clone())
            }
            "reduce" => {
                let n = printed.len();
                if operands.len() != 2 * n || n == 0 {
                    return Err("expected as many init values as inputs".to_string());
                }
                let s = first()?;
                same(&s, &shapes[..n])?;
                let dims = self.dims_attr(op, &["dimensions"], s.len())?;
                let r: Vec<u64> = s
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !dims.contains(i))
                    .map(|(_, &d)| d)
                    .collect();
                Ok(Some(vec![r; n]))
            }
            "transpose" => {
                let s = first()?;
                let perm = self.dims_attr(op, &["dims", "permutation"], s.len())?;
                if perm.len() != s.len() {
                    return Err("the permutation does not match the rank".to_string());
                }
                one(perm.iter().map(|&p| s[p]).collect())
            }
            "broadcast_in_dim" => {
                let s = first()?;
                let p = printed.first().ok_or("expected a result")?;
                let bd = self.ints(op, &["dims", "broadcast_dimensions"])?;
                if bd.len() != s.len() {
                    return Err("broadcast dimensions do not match the operand rank".to_string());
                }
                let mut out: Vec<Option<u64>> = p.shape.dims().iter().map(Dim::as_static).collect();
                for (k, &d) in bd.iter().enumerate() {
                    let d = to_usize(d, "dimension")?;
                    let Some(slot) = out.get_mut(d) else {
                        return Err(format!("dimension {d} is out of range"));
                    };
                    match *slot {
                        Some(r) if s[k] != 1 && s[k] != r => {
                            return Err(format!("cannot broadcast size {} to {r}", s[k]));
                        }
                        Some(_) => {}
                        None if s[k] == 1 => {
                            return Err(format!(
                                "result dimension {d} is dynamic and the operand's is 1"
                            ));
                        }
                        None => *slot = Some(s[k]),
                    }
                }
                out.into_iter()
                    .collect::<Option<Vec<u64>>>()
                    .map(|v| Some(vec![v]))
                    .ok_or_else(|| "a dynamic result dimension that is not broadcast".to_string())
            }
            "broadcast" => {
                let s = first()?;
                let sizes = self.ints(op, &["sizes", "broadcast_sizes"])?;
                let mut out: Vec<u64> =
                    sizes.iter().map(|&v| to_u64(v, "size")).collect::<Result<_, _>>()?;
                out.extend(s);
                one(out)
            }
            "reshape" => {
                let s = first()?;
                let p = printed.first().ok_or("expected a result")?;
                let known: Vec<Option<u64>> = p.shape.dims().iter().map(Dim::as_static).collect();
                let unknown = known.iter().filter(|d| d.is_none()).count();
                let total = count(&s).ok_or("element count overflows")?;
                let rest = count(&known.iter().flatten().copied().collect::<Vec<_>>())
                    .ok_or("element count overflows")?;
                match unknown {
                    0 if rest == total => one(known.into_iter().flatten().collect()),
                    1 if rest != 0 && total % rest == 0 => {
                        one(known.iter().map(|d| d.unwrap_or(total / rest)).collect())
                    }
                    0 | 1 => Err(format!("cannot reshape {s:?} to {p}")),
                    _ => Err("a reshape to several dynamic dimensions".to_string()),
                }
            }
            "concatenate" => {
                let s = first()?;
                let d = to_usize(self.int(op, &["dim", "dimension"])?, "dimension")?;
                if d >= s.len() {
                    return Err(format!("dimension {d} is out of range"));
                }
                let mut out = s.clone();
                out[d] = 0;
                for o in &shapes {
                    let mut a = o.clone();
                    let mut b = s.clone();
                    if a.len() != b.len() {
                        return Err("operands of different ranks".to_string());
                    }
                    a[d] = 0;
                    b[d] = 0;
                    if a != b {
                        return Err(format!("operand shapes differ: {s:?} and {o:?}"));
                    }
                    out[d] += o[d];
                }
                one(out)
            }
            "slice" => {
                let s = first()?;
                let (start, limit, strides) =
                    if let Some(start) = self.ints_opt(op, &["start_indices"])? {
                        let limit = self.ints(op, &["limit_indices"])?;
                        let strides =
                            self.ints_opt(op, &["strides"])?.unwrap_or_else(|| vec![1; s.len()]);
                        (start, limit, strides)
                    } else {
                        self.pretty_slice(op).ok_or("cannot read the slice bounds")?
                    };
                one(slice_shape(&s, &start, &limit, &strides)?)
            }
            "dynamic_slice" => {
                let sizes = self.ints(op, &["sizes", "slice_sizes"])?;
                one(sizes.iter().map(|&v| to_u64(v, "slice size")).collect::<Result<_, _>>()?)
            }
            "dynamic_update_slice" | "cholesky" => one(first()?),
            "triangular_solve" => one(shapes.get(1).cloned().ok_or("expected two operands")?),
            "select_and_scatter" => one(first()?),
            "scatter" => {
                // inputs..., indices, updates...: the results have the inputs' shapes.
                let n = printed.len();
                if operands.len() != 2 * n + 1 || n == 0 {
                    return Err("expected as many updates as inputs".to_string());
                }
                Ok(Some(shapes[..n].to_vec()))
            }
            "dot" => {
                let [l, r] = shapes.as_slice() else {
                    return Err("expected two operands".to_string());
                };
                let (lc, rc) = match (l.len(), r.len()) {
                    (1 | 2, 1 | 2) => (vec![l.len() as i64 - 1], vec![0]),
                    _ => return Err("dot takes vectors and matrices".to_string()),
                };
                one(dot_shape(l, r, &[], &[], &lc, &rc)?)
            }
            "pad" => {
                let s = first()?;
                let low = self.ints(op, &["low", "edge_padding_low"])?;
                let high = self.ints(op, &["high", "edge_padding_high"])?;
                let interior = self.ints(op, &["interior", "interior_padding"])?;
                one(pad_shape(&s, &low, &high, &interior)?)
            }
            "dot_general" => {
                let [l, r] = shapes.as_slice() else {
                    return Err("expected two operands".to_string());
                };
                let (lb, rb) = match self.int_pair(op, "batching_dims")? {
                    Some(p) => p,
                    None => (
                        self.ints_opt(op, &["lhs_batching_dimensions"])?.unwrap_or_default(),
                        self.ints_opt(op, &["rhs_batching_dimensions"])?.unwrap_or_default(),
                    ),
                };
                let (lc, rc) = match self.int_pair(op, "contracting_dims")? {
                    Some(p) => p,
                    None => (
                        self.ints_opt(op, &["lhs_contracting_dimensions"])?.unwrap_or_default(),
                        self.ints_opt(op, &["rhs_contracting_dimensions"])?.unwrap_or_default(),
                    ),
                };
                one(dot_shape(l, r, &lb, &rb, &lc, &rc)?)
            }
            "sort" => {
                let s = first()?;
                same(&s, &shapes)?;
                Ok(Some(shapes))
            }
            "reduce_window" => {
                let n = printed.len();
                if operands.len() != 2 * n || n == 0 {
                    return Err("expected as many init values as inputs".to_string());
                }
                let s = first()?;
                same(&s, &shapes[..n])?;
                let ones = vec![1; s.len()];
                let window = self.ints(op, &["window_dimensions"])?;
                let strides = self.ints_opt(op, &["window_strides"])?.unwrap_or(ones.clone());
                let base = self.ints_opt(op, &["base_dilations"])?.unwrap_or(ones.clone());
                let dil = self.ints_opt(op, &["window_dilations"])?.unwrap_or(ones);
                let pad = self.ints_opt(op, &["padding"])?.unwrap_or_else(|| vec![0; 2 * s.len()]);
                let out = reduce_window_shape(&s, &window, &strides, &base, &dil, &pad)?;
                Ok(Some(vec![out; n]))
            }
            "gather" => {
                let sizes = self.ints(op, &["slice_sizes"])?;
                one(self.gather_shape(op, operands, &sizes)?)
            }
            "convolution" => one(self.convolution_shape(op, &shapes)?),
            "get_dimension_size" => {
                let s = first()?;
                let d = to_usize(self.int(op, &["dim", "dimension"])?, "dimension")?;
                if d >= s.len() {
                    return Err(format!("dimension {d} is out of range"));
                }
                one(Vec::new())
            }
            _ => Ok(None),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Folding

    /// The elements of the op's single result when it is a small integer tensor computed from
    /// constants.
    fn fold(
        &self,
        op: &Op,
        short: &str,
        operands: &[Val],
        result: &TensorType,
    ) -> Option<Vec<i64>> {
        let dt = result.dtype;
        if !(dt.is_integer() || dt.is_bool()) {
            return None;
        }
        let dims = sdims(result);
        let n = count(&dims).filter(|&n| n <= MAX_FOLD_ELEMENTS)? as usize;
        let c = |k: usize| operands.get(k).and_then(|v| v.konst.as_deref());
        let shape = |k: usize| operands.get(k).map(|v| sdims(&v.ty));
        let data: Vec<i64> = match short {
            "constant" => {
                let i = self.attr(op, "value").unwrap_or(op.name_tok + 1);
                if self.s(i) != "dense" {
                    return None;
                }
                let (v, _) = self.ints_at(i)?;
                match v.len() {
                    1 => vec![v[0]; n],
                    len if len == n => v,
                    _ => return None,
                }
            }
            "get_dimension_size" => {
                let d = usize::try_from(self.int(op, &["dim", "dimension"]).ok()?).ok()?;
                vec![i64::try_from(*shape(0)?.get(d)?).ok()?]
            }
            "iota" | "dynamic_iota" => {
                let d = usize::try_from(self.int(op, &["dim", "iota_dimension"]).ok()?).ok()?;
                (0..n).map(|l| unravel(l, &dims).get(d).map_or(0, |&v| v as i64)).collect()
            }
            "reshape" | "dynamic_reshape" => c(0)?.to_vec(),
            "convert" => c(0)?.to_vec(),
            "broadcast_in_dim" | "dynamic_broadcast_in_dim" => {
                let src = c(0)?;
                let sdim = shape(0)?;
                let bd = self.ints(op, &["dims", "broadcast_dimensions"]).ok()?;
                let mut out = Vec::with_capacity(n);
                for l in 0..n {
                    let idx = unravel(l, &dims);
                    let mut sidx = Vec::with_capacity(sdim.len());
                    for (k, &d) in bd.iter().enumerate() {
                        let v = *idx.get(usize::try_from(d).ok()?)?;
                        sidx.push(if *sdim.get(k)? == 1 { 0 } else { v });
                    }
                    out.push(*src.get(ravel(&sidx, &sdim))?);
                }
                out
            }
            "concatenate" => {
                let d = usize::try_from(self.int(op, &["dim", "dimension"]).ok()?).ok()?;
                let mut out = Vec::with_capacity(n);
                for l in 0..n {
                    let mut idx = unravel(l, &dims);
                    let mut k = 0;
                    loop {
                        let s = shape(k)?;
                        let size = *s.get(d)? as usize;
                        let at = idx.get_mut(d)?;
                        if *at < size {
                            out.push(*c(k)?.get(ravel(&idx, &s))?);
                            break;
                        }
                        *at -= size;
                        k += 1;
                    }
                }
                out
            }
            "slice" => {
                let s = shape(0)?;
                let (start, _, strides) = match self.ints_opt(op, &["start_indices"]).ok()? {
                    Some(start) => {
                        let strides = self
                            .ints_opt(op, &["strides"])
                            .ok()?
                            .unwrap_or_else(|| vec![1; s.len()]);
                        (start, Vec::new(), strides)
                    }
                    None => self.pretty_slice(op)?,
                };
                let src = c(0)?;
                let mut out = Vec::with_capacity(n);
                for l in 0..n {
                    let idx = unravel(l, &dims);
                    let sidx: Vec<usize> = idx
                        .iter()
                        .zip(start.iter().zip(&strides))
                        .map(|(&i, (&a, &st))| (a + i as i64 * st) as usize)
                        .collect();
                    out.push(*src.get(ravel(&sidx, &s))?);
                }
                out
            }
            "transpose" => {
                let s = shape(0)?;
                let perm = self.ints(op, &["dims", "permutation"]).ok()?;
                let src = c(0)?;
                let mut out = Vec::with_capacity(n);
                for l in 0..n {
                    let idx = unravel(l, &dims);
                    let mut sidx = vec![0; s.len()];
                    for (k, &p) in perm.iter().enumerate() {
                        *sidx.get_mut(usize::try_from(p).ok()?)? = *idx.get(k)?;
                    }
                    out.push(*src.get(ravel(&sidx, &s))?);
                }
                out
            }
            "add" | "subtract" | "multiply" | "divide" | "remainder" | "maximum" | "minimum"
            | "and" | "or" | "xor" => {
                let (a, b) = (c(0)?, c(1)?);
                let mut out = Vec::with_capacity(n);
                for (&x, &y) in a.iter().zip(b) {
                    out.push(match short {
                        "add" => x.wrapping_add(y),
                        "subtract" => x.wrapping_sub(y),
                        "multiply" => x.wrapping_mul(y),
                        "divide" if y != 0 => x.wrapping_div(y),
                        "remainder" if y != 0 => x.wrapping_rem(y),
                        "maximum" => x.max(y),
                        "minimum" => x.min(y),
                        "and" => x & y,
                        "or" => x | y,
                        "xor" => x ^ y,
                        _ => return None,
                    });
                }
                out
            }
            "negate" => c(0)?.iter().map(|x| x.wrapping_neg()).collect(),
            "abs" => c(0)?.iter().map(|x| x.wrapping_abs()).collect(),
            "sign" => c(0)?.iter().map(|x| x.signum()).collect(),
            "not" => c(0)?.iter().map(|x| if dt.is_bool() { 1 - (x & 1) } else { !x }).collect(),
            "compare" => {
                let (a, b) = (c(0)?, c(1)?);
                let odt = operands.first()?.ty.dtype;
                let words: Vec<&str> =
                    op.attrs.iter().flat_map(|r| r.clone()).map(|i| self.s(i)).collect();
                let dir = *words
                    .iter()
                    .find(|w| matches!(**w, "EQ" | "NE" | "GE" | "GT" | "LE" | "LT"))?;
                let unsigned = if words.contains(&"UNSIGNED") {
                    true
                } else if words.contains(&"SIGNED") {
                    false
                } else {
                    !matches!(odt, DType::I8 | DType::I16 | DType::I32 | DType::I64)
                };
                let key = |v: i64| -> i128 {
                    if unsigned {
                        let bits = odt.bits();
                        let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
                        i128::from((v as u64) & mask)
                    } else {
                        i128::from(v)
                    }
                };
                a.iter()
                    .zip(b)
                    .map(|(&x, &y)| {
                        let (x, y) = (key(x), key(y));
                        i64::from(match dir {
                            "EQ" => x == y,
                            "NE" => x != y,
                            "GE" => x >= y,
                            "GT" => x > y,
                            "LE" => x <= y,
                            _ => x < y,
                        })
                    })
                    .collect()
            }
            "select" => {
                let (p, a, b) = (c(0)?, c(1)?, c(2)?);
                (0..n)
                    .map(|i| {
                        let pi = if p.len() == 1 { p[0] } else { *p.get(i)? };
                        Some(if pi != 0 { *a.get(i)? } else { *b.get(i)? })
                    })
                    .collect::<Option<Vec<i64>>>()?
            }
            "clamp" => {
                let (lo, x, hi) = (c(0)?, c(1)?, c(2)?);
                let at = |v: &[i64], i: usize| {
                    if v.len() == 1 { v.first().copied() } else { v.get(i).copied() }
                };
                (0..n)
                    .map(|i| Some(at(x, i)?.max(at(lo, i)?).min(at(hi, i)?)))
                    .collect::<Option<Vec<i64>>>()?
            }
            _ => return None,
        };
        if data.len() != n {
            return None;
        }
        Some(data.into_iter().map(|v| wrap(dt, v)).collect())
    }

    // -----------------------------------------------------------------------------------------
    // Output

    /// The refined module text.
    fn emit(&self) -> Result<String, RefineError> {
        let module = self.module;
        let mut edits = Vec::new();
        if let Some(edit) = self.module_attributes_edit() {
            edits.push(edit);
        }
        let mut by_func: BTreeMap<usize, Vec<&Spec>> = BTreeMap::new();
        for s in &self.made {
            by_func.entry(s.func).or_default().push(s);
        }
        for (fi, f) in module.functions.iter().enumerate() {
            match by_func.get(&fi) {
                Some(specs) => {
                    let texts: Vec<&str> = specs.iter().map(|s| s.text.as_str()).collect();
                    edits.push(Edit { range: f.span.clone(), text: texts.join("\n  ") });
                }
                None => {
                    let lo = self.toks.partition_point(|t| t.start < f.span.start);
                    let hi = self.toks.partition_point(|t| t.start < f.span.end);
                    if self.toks[lo..hi].iter().any(|t| t.kind == Kind::Punct(b'?')) {
                        edits.push(Edit {
                            range: line_span(self.text, f.span.clone()),
                            text: String::new(),
                        });
                    }
                }
            }
        }
        apply_edits(self.text, 0..self.text.len(), edits).map_err(|at| {
            let (line, column) = self.position(at);
            RefineError::Syntax { line, column, message: "overlapping rewrites".to_string() }
        })
    }

    /// Drops `jax.uses_shape_polymorphism` from the module attributes.
    fn module_attributes_edit(&self) -> Option<Edit> {
        let module = self.module;
        if !module.attributes.iter().any(|(n, _)| n == "jax.uses_shape_polymorphism") {
            return None;
        }
        let start = self.toks.partition_point(|t| t.start < module.span.start);
        let mut j = start + 1;
        if self.toks.get(j)?.kind == Kind::Symbol {
            j += 1;
        }
        if self.s(j) != "attributes" || !self.kind_is(j + 1, b'{') {
            return None;
        }
        let close = self.toks[j + 1].pair;
        let keep: Vec<(String, String)> = module
            .attributes
            .iter()
            .filter(|(n, _)| n != "jax.uses_shape_polymorphism")
            .cloned()
            .collect();
        if keep.is_empty() {
            let from = self.toks[j - 1].end;
            return Some(Edit { range: from..self.toks[close].end, text: String::new() });
        }
        let mut text = String::new();
        reader::push_dict(&mut text, &keep);
        Some(Edit { range: self.toks[j + 1].start..self.toks[close].end, text })
    }
}

/// The span grown to whole lines when only blanks surround it.
fn line_span(text: &str, span: Range<usize>) -> Range<usize> {
    let b = text.as_bytes();
    let mut start = span.start;
    while start > 0 && matches!(b[start - 1], b' ' | b'\t') {
        start -= 1;
    }
    let mut end = span.end;
    while matches!(b.get(end), Some(b' ' | b'\t' | b'\r')) {
        end += 1;
    }
    if (start == 0 || b[start - 1] == b'\n') && b.get(end) == Some(&b'\n') {
        start..end + 1
    } else {
        span
    }
}

/// `text[range]` with the edits applied; the offset of an overlap if two edits overlap.
fn apply_edits(text: &str, range: Range<usize>, mut edits: Vec<Edit>) -> Result<String, usize> {
    edits.sort_by_key(|e| (e.range.start, e.range.end));
    let mut out = String::with_capacity(range.len());
    let mut cursor = range.start;
    for e in edits {
        if e.range.start < cursor || e.range.end > range.end {
            return Err(e.range.start);
        }
        out.push_str(&text[cursor..e.range.start]);
        out.push_str(&e.text);
        cursor = e.range.end;
    }
    out.push_str(&text[cursor..range.end]);
    Ok(out)
}

fn function_text(
    f: &reader::Function<'_>,
    name: &str,
    visibility: Visibility,
    args: &[TensorType],
    results: &[TensorType],
    body: &str,
) -> String {
    let mut t = String::from("func.func ");
    t.push_str(match visibility {
        Visibility::Public => "public ",
        Visibility::Private => "private ",
    });
    t.push_str(&reader::format_symbol(name));
    let with_type = |a: &Arg, ty: &TensorType| Arg {
        name: a.name.clone(),
        ty: ty.clone(),
        attributes: a.attributes.clone(),
    };
    let args: Vec<Arg> = f.args.iter().zip(args).map(|(a, ty)| with_type(a, ty)).collect();
    let results: Vec<Arg> = f.results.iter().zip(results).map(|(r, ty)| with_type(r, ty)).collect();
    reader::push_signature(&mut t, &args, &results, &f.attributes);
    t.push_str(" {");
    t.push_str(body);
    t.push('}');
    t
}

/// Undoes MLIR string escapes (`\"`, `\\`, `\n`, `\t`, `\XX`); text with an invalid escape is
/// kept as it is.
fn unescape(raw: &str) -> String {
    match reader::unescape_bytes(raw) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => raw.to_owned(),
    }
}

fn wrap(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::Bool => i64::from(v != 0),
        DType::I8 => i64::from(v as i8),
        DType::I16 => i64::from(v as i16),
        DType::I32 => i64::from(v as i32),
        DType::U8 => i64::from(v as u8),
        DType::U32 => i64::from(v as u32),
        _ => v,
    }
}

fn unravel(mut linear: usize, dims: &[u64]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        let d = dims[k].max(1) as usize;
        idx[k] = linear % d;
        linear /= d;
    }
    idx
}

fn ravel(idx: &[usize], dims: &[u64]) -> usize {
    idx.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d as usize + i)
}

fn check_broadcast(src: &[u64], out: &[u64], bd: &[i64]) -> Result<(), String> {
    if bd.len() != src.len() {
        return Err("broadcast dimensions do not match the operand rank".to_string());
    }
    for (k, &d) in bd.iter().enumerate() {
        let r = usize::try_from(d).ok().and_then(|d| out.get(d)).ok_or_else(|| {
            format!("broadcast dimension {d} is out of range for {} result dimensions", out.len())
        })?;
        if src[k] != 1 && src[k] != *r {
            return Err(format!("cannot broadcast size {} to {r}", src[k]));
        }
    }
    Ok(())
}

fn slice_shape(
    src: &[u64],
    start: &[i64],
    limit: &[i64],
    strides: &[i64],
) -> Result<Vec<u64>, String> {
    if start.len() != src.len() || limit.len() != src.len() || strides.len() != src.len() {
        return Err("slice bounds do not match the operand rank".to_string());
    }
    let mut out = Vec::with_capacity(src.len());
    for k in 0..src.len() {
        let (a, b, s) = (start[k], limit[k], strides[k]);
        if a < 0 || b < a || b as u64 > src[k] || s < 1 {
            return Err(format!("slice {a}:{b}:{s} is out of bounds for size {}", src[k]));
        }
        out.push(((b - a + s - 1) / s) as u64);
    }
    Ok(out)
}

fn pad_shape(src: &[u64], low: &[i64], high: &[i64], interior: &[i64]) -> Result<Vec<u64>, String> {
    if low.len() != src.len() || high.len() != src.len() || interior.len() != src.len() {
        return Err("padding does not match the operand rank".to_string());
    }
    let mut out = Vec::with_capacity(src.len());
    for k in 0..src.len() {
        if interior[k] < 0 {
            return Err(format!("interior padding {} is negative", interior[k]));
        }
        let d = src[k] as i64;
        let size = low[k] + high[k] + d + (d - 1).max(0) * interior[k];
        out.push(to_u64(size, "padded size")?);
    }
    Ok(out)
}

fn dot_shape(
    l: &[u64],
    r: &[u64],
    lb: &[i64],
    rb: &[i64],
    lc: &[i64],
    rc: &[i64],
) -> Result<Vec<u64>, String> {
    let idx = |v: &[i64], rank: usize| -> Result<Vec<usize>, String> {
        v.iter()
            .map(|&d| {
                let d = to_usize(d, "dimension")?;
                if d < rank { Ok(d) } else { Err(format!("dimension {d} is out of range")) }
            })
            .collect()
    };
    let (lb, rb, lc, rc) =
        (idx(lb, l.len())?, idx(rb, r.len())?, idx(lc, l.len())?, idx(rc, r.len())?);
    if lb.len() != rb.len() || lc.len() != rc.len() {
        return Err("dot dimension numbers of different lengths".to_string());
    }
    for (a, b) in lb.iter().zip(&rb).chain(lc.iter().zip(&rc)) {
        if l[*a] != r[*b] {
            return Err(format!("dot dimensions differ: {} and {}", l[*a], r[*b]));
        }
    }
    let mut out: Vec<u64> = lb.iter().map(|&d| l[d]).collect();
    out.extend(
        l.iter().enumerate().filter(|(i, _)| !lb.contains(i) && !lc.contains(i)).map(|(_, &d)| d),
    );
    out.extend(
        r.iter().enumerate().filter(|(i, _)| !rb.contains(i) && !rc.contains(i)).map(|(_, &d)| d),
    );
    Ok(out)
}

fn reduce_window_shape(
    src: &[u64],
    window: &[i64],
    strides: &[i64],
    base: &[i64],
    dilations: &[i64],
    padding: &[i64],
) -> Result<Vec<u64>, String> {
    let r = src.len();
    if window.len() != r
        || strides.len() != r
        || base.len() != r
        || dilations.len() != r
        || padding.len() != 2 * r
    {
        return Err("window attributes do not match the operand rank".to_string());
    }
    let mut out = Vec::with_capacity(r);
    for k in 0..r {
        if window[k] < 1 || strides[k] < 1 || base[k] < 1 || dilations[k] < 1 {
            return Err("window sizes, strides and dilations must be positive".to_string());
        }
        let d = src[k] as i64;
        let dilated = if d == 0 { 0 } else { (d - 1) * base[k] + 1 };
        let padded = dilated + padding[2 * k] + padding[2 * k + 1];
        let w = (window[k] - 1) * dilations[k] + 1;
        out.push(if padded < w { 0 } else { ((padded - w) / strides[k] + 1) as u64 });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RMS norm over `bf16[b, 512]` exported by jax with `jax.export.symbolic_shape("b")`.
    const SYMBOLIC: &str = include_str!("../../tests/data/reader/symbolic.mlir");

    fn t(dtype: DType, dims: &[u64]) -> TensorType {
        TensorType::new(dtype, dims)
    }

    fn bf16(dims: &[u64]) -> TensorType {
        t(DType::BF16, dims)
    }

    fn f32(dims: &[u64]) -> TensorType {
        t(DType::F32, dims)
    }

    /// `f32[4*b]` reshaped to `f32[b, 4]`, with jax's divisibility assertion.
    const DIVISIBLE: &str = r#"module @m attributes {jax.uses_shape_polymorphism = true} {
  func.func public @main(%arg0: tensor<?xf32>) -> tensor<?x4xf32> {
    %c4 = stablehlo.constant dense<4> : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.get_dimension_size %arg0, dim = 0 : (tensor<?xf32>) -> tensor<i32>
    %1 = stablehlo.remainder %0, %c4 : tensor<i32>
    %2 = stablehlo.compare EQ, %1, %c0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.custom_call @shape_assertion(%2, %1) {api_version = 2 : i32, error_message = "Division had remainder {0} when computing \22b\22.", has_side_effect = true} : (tensor<i1>, tensor<i32>) -> ()
    %3 = stablehlo.divide %0, %c4 : tensor<i32>
    %4 = call @f(%3, %arg0) : (tensor<i32>, tensor<?xf32>) -> tensor<?x4xf32>
    return %4 : tensor<?x4xf32>
  }
  func.func private @f(%arg0: tensor<i32> {jax.global_constant = "b"}, %arg1: tensor<?xf32>) -> tensor<?x4xf32> {
    %c = stablehlo.constant dense<4> : tensor<1xi32>
    %0 = stablehlo.reshape %arg0 : (tensor<i32>) -> tensor<1xi32>
    %1 = stablehlo.concatenate %0, %c, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %2 = stablehlo.dynamic_reshape %arg1, %1 : (tensor<?xf32>, tensor<2xi32>) -> tensor<?x4xf32>
    return %2 : tensor<?x4xf32>
  }
}
"#;

    #[test]
    fn refines_the_jax_rms_norm_export() {
        let out = refine(SYMBOLIC, &[bf16(&[4, 512])]).unwrap();
        assert!(!out.contains('?') && !out.contains("loc("), "{out}");
        assert!(!out.contains("shape_assertion") && !out.contains("jax.uses_shape_polymorphism"));
        assert!(out.starts_with(
            "module @jit_rms attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : \
             i32} {\n  func.func public @main(%arg0: tensor<4x512xbf16>) -> (tensor<4x512xbf16> \
             {jax.result_info = \"result\"}) {\n"
        ));
        for line in [
            "%2 = call @_wrapped_jax_export_main(%0, %arg0) : (tensor<i32>, tensor<4x512xbf16>) -> \
             tensor<4x512xbf16>",
            "func.func private @_wrapped_jax_export_main(%arg0: tensor<i32> {jax.global_constant = \
             \"b\"}, %arg1: tensor<4x512xbf16>) -> (tensor<4x512xbf16> {jax.result_info = \
             \"result\"}) {",
            "%2 = stablehlo.reduce(%1 init: %cst_1) applies stablehlo.add across dimensions = [1] : \
             (tensor<4x512xf32>, tensor<f32>) -> tensor<4xf32>",
            "%5 = stablehlo.broadcast_in_dim %2, dims = [0] : (tensor<4xf32>) -> tensor<4x1xf32>",
            "%8 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x1xf32>",
            "%14 = stablehlo.broadcast_in_dim %11, dims = [0, 1] : (tensor<4x1xbf16>) -> \
             tensor<4x512xbf16>",
            "%15 = stablehlo.multiply %arg1, %14 : tensor<4x512xbf16>",
            "return %15 : tensor<4x512xbf16>",
        ] {
            assert!(out.contains(line), "missing {line:?} in\n{out}");
        }
        // It reads back, every type static.
        let m = reader::parse_module(&out).unwrap();
        for f in &m.functions {
            assert!(f.args.iter().chain(&f.results).all(|a| a.ty.shape.is_static()));
        }
        // Another size, another module; the same size, the same bytes.
        let seven = refine(SYMBOLIC, &[bf16(&[7, 512])]).unwrap();
        assert!(seven.contains("tensor<7x512xbf16>") && !seven.contains("tensor<4x"));
        assert_eq!(refine(SYMBOLIC, &[bf16(&[4, 512])]).unwrap(), out);
    }

    /// Modules without symbolic shapes come out as their location-free text (the module
    /// attribute `jax.uses_shape_polymorphism` aside): every op of the reader's fixtures parses,
    /// and type inference agrees with every printed static type.
    #[test]
    fn static_modules_pass_through() {
        let fixtures = [
            include_str!("../../tests/data/reader/nested_jit.mlir"),
            include_str!("../../tests/data/reader/pallas_interpret_cpu.mlir"),
            include_str!("../../tests/data/reader/composite_donate.mlir"),
            include_str!("../../tests/data/reader/sharded.mlir"),
            include_str!("../../tests/data/reader/pallas_tpu.mlir"),
        ];
        for text in fixtures {
            let m = reader::parse_module(text).unwrap();
            let inputs: Vec<TensorType> =
                m.main().unwrap().args.iter().map(|a| a.ty.clone()).collect();
            let out = refine(text, &inputs).unwrap();
            let stripped = reader::strip_locations(text).unwrap();
            let expected = stripped
                .replace("jax.uses_shape_polymorphism = false, ", "")
                .replace("func.func @", "func.func public @");
            assert_eq!(out, expected);
        }
    }

    #[test]
    fn checks_inputs_against_mains_arguments() {
        let cases: [(Vec<TensorType>, &str); 6] = [
            (vec![], "@main takes 1 arguments, got 0 input types"),
            (vec![bf16(&[4, 512]), bf16(&[4, 512])], "@main takes 1 arguments, got 2 input types"),
            (
                vec![f32(&[4, 512])],
                "argument 0 of @main has type tensor<?x512xbf16>, got tensor<4x512xf32>: element \
                 type f32 is not bf16",
            ),
            (
                vec![bf16(&[2048])],
                "argument 0 of @main has type tensor<?x512xbf16>, got tensor<2048xbf16>: rank 1 \
                 is not 2",
            ),
            (
                vec![bf16(&[4, 256])],
                "argument 0 of @main has type tensor<?x512xbf16>, got tensor<4x256xbf16>: \
                 dimension 1 is 256, expected 512",
            ),
            (
                vec![TensorType::parse_short("bf16[b,512]").unwrap()],
                "argument 0 of @main has type tensor<?x512xbf16>, got tensor<?x512xbf16>: \
                 dimension 0 of the input is symbolic; inputs must be static",
            ),
        ];
        for (inputs, expected) in cases {
            let err = refine(SYMBOLIC, &inputs).unwrap_err();
            assert_eq!(err.to_string(), expected);
        }
        let err = refine(SYMBOLIC, &[f32(&[4, 512])]).unwrap_err();
        assert!(matches!(err, RefineError::InputType { index: 0, .. }), "{err:?}");
    }

    #[test]
    fn a_failing_shape_assertion_reports_jaxs_message_at_its_position() {
        let err = refine(SYMBOLIC, &[bf16(&[0, 512])]).unwrap_err();
        let RefineError::ShapeAssertion { message, line, column } = &err else {
            panic!("{err:?}");
        };
        assert!(message.starts_with(
            "Input shapes do not match the polymorphic shapes specification. Expected value >= 1 \
             for dimension variable 'b'."
        ));
        assert!(
            message.contains(
                "Obtained dimension variables: 'b' = 0 from specification 'b' for dimension \
                 args[0].shape[0] (= 0), ."
            ),
            "{message}"
        );
        // The position is in the text as given, `#loc` lines included.
        assert_eq!((*line, *column), (8, 5));
        assert!(err.to_string().starts_with("8:5: shape assertion failed: Input shapes"));
    }

    #[test]
    fn a_divisibility_constraint_is_checked_and_the_dimension_variable_carried() {
        let err = refine(DIVISIBLE, &[f32(&[6])]).unwrap_err();
        assert_eq!(
            err,
            RefineError::ShapeAssertion {
                message: "Division had remainder 2 when computing \"b\".".to_string(),
                line: 8,
                column: 5
            }
        );
        let out = refine(DIVISIBLE, &[f32(&[8])]).unwrap();
        assert!(out.contains("%2 = stablehlo.reshape %arg1 : (tensor<8xf32>) -> tensor<2x4xf32>"));
        assert!(out.starts_with(
            "module @m {\n  func.func public @main(%arg0: tensor<8xf32>) -> \
                                 tensor<2x4xf32> {\n"
        ));
        assert!(!out.contains("shape_assertion"));
    }

    #[test]
    fn an_op_whose_type_cannot_be_inferred_is_named_with_its_position() {
        let text = "#loc1 = loc(\"a.py\":1:2)\nmodule {\n  func.func @main(%arg0: tensor<?xf32>) -> \
                    tensor<?xf32> {\n    %0 = stablehlo.custom_call @foo(%arg0) : \
                    (tensor<?xf32>) -> tensor<?xf32> loc(#loc1)\n    return %0 : tensor<?xf32>\n  \
                    }\n}\n";
        let err = refine(text, &[f32(&[3])]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "4:5: cannot refine stablehlo.custom_call: cannot infer its result type tensor<?xf32>"
        );
        assert!(matches!(err, RefineError::Op { line: 4, column: 5, .. }));
        // A shape that is data, not a shape computation, is refused too.
        let text = "module {\n  func.func @main(%x: tensor<f32>, %s: tensor<1xi32>) -> \
                    tensor<?xf32> {\n    %0 = stablehlo.dynamic_broadcast_in_dim %x, %s, dims = \
                    [] : (tensor<f32>, tensor<1xi32>) -> tensor<?xf32>\n    return %0 : \
                    tensor<?xf32>\n  }\n}\n";
        let err = refine(text, &[f32(&[]), t(DType::I32, &[1])]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "3:5: cannot refine stablehlo.dynamic_broadcast_in_dim: shape operand 1 (%s) does \
             not fold to a constant"
        );
        // An assertion on data cannot be evaluated.
        let text = "module {\n  func.func @main(%p: tensor<i1>) {\n    stablehlo.custom_call \
                    @shape_assertion(%p) {error_message = \"no\"} : (tensor<i1>) -> ()\n    \
                    return\n  }\n}\n";
        let err = refine(text, &[t(DType::Bool, &[])]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "3:5: cannot refine stablehlo.custom_call: the shape assertion's predicate does not \
             fold to a constant"
        );
    }

    /// A private function called with two signatures gets two copies; one signature, one copy.
    #[test]
    fn functions_are_specialised_per_signature() {
        let text = r#"module {
  func.func public @main(%a: tensor<?xf32>, %b: tensor<?xf32>) -> (tensor<?xf32>, tensor<?xf32>) {
    %0 = call @g(%a) : (tensor<?xf32>) -> tensor<?xf32>
    %1 = func.call @g(%b) : (tensor<?xf32>) -> tensor<?xf32>
    return %0, %1 : tensor<?xf32>, tensor<?xf32>
  }
  func.func private @g(%x: tensor<?xf32>) -> tensor<?xf32> {
    %0 = stablehlo.negate %x : tensor<?xf32>
    return %0 : tensor<?xf32>
  }
  func.func private @dead(%x: tensor<?xf32>) -> tensor<?xf32> {
    return %x : tensor<?xf32>
  }
  func.func private @dead_static(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
}
"#;
        let out = refine(text, &[f32(&[3]), f32(&[5])]).unwrap();
        let expected = r#"module {
  func.func public @main(%a: tensor<3xf32>, %b: tensor<5xf32>) -> (tensor<3xf32>, tensor<5xf32>) {
    %0 = call @g(%a) : (tensor<3xf32>) -> tensor<3xf32>
    %1 = func.call @g_1(%b) : (tensor<5xf32>) -> tensor<5xf32>
    return %0, %1 : tensor<3xf32>, tensor<5xf32>
  }
  func.func private @g(%x: tensor<3xf32>) -> tensor<3xf32> {
    %0 = stablehlo.negate %x : tensor<3xf32>
    return %0 : tensor<3xf32>
  }
  func.func private @g_1(%x: tensor<5xf32>) -> tensor<5xf32> {
    %0 = stablehlo.negate %x : tensor<5xf32>
    return %0 : tensor<5xf32>
  }
  func.func private @dead_static(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
}
"#;
        assert_eq!(out, expected);
        let out = refine(text, &[f32(&[3]), f32(&[3])]).unwrap();
        assert!(!out.contains("@g_1") && out.contains("%1 = func.call @g(%b)"), "{out}");
    }

    #[test]
    fn loops_carry_refined_types_and_keep_them() {
        // Generic form: the block arguments' types are rewritten too.
        let text = r#"module {
  func.func @main(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0:2 = "stablehlo.while"(%c, %x) ({
    ^bb0(%i: tensor<i32>, %v: tensor<?x8xf32>):
      %k = stablehlo.constant dense<3> : tensor<i32>
      %1 = stablehlo.compare LT, %i, %k, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %1 : tensor<i1>
    }, {
    ^bb0(%i: tensor<i32>, %v: tensor<?x8xf32>):
      %one = stablehlo.constant dense<1> : tensor<i32>
      %1 = stablehlo.add %i, %one : tensor<i32>
      %2 = stablehlo.add %v, %v : tensor<?x8xf32>
      stablehlo.return %1, %2 : tensor<i32>, tensor<?x8xf32>
    }) : (tensor<i32>, tensor<?x8xf32>) -> (tensor<i32>, tensor<?x8xf32>)
    return %0#1 : tensor<?x8xf32>
  }
}
"#;
        let out = refine(text, &[f32(&[2, 8])]).unwrap();
        assert_eq!(out.matches("^bb0(%i: tensor<i32>, %v: tensor<2x8xf32>):").count(), 2);
        assert!(out.contains(
            "}) : (tensor<i32>, tensor<2x8xf32>) -> (tensor<i32>, tensor<2x8xf32>)\n    return \
             %0#1 : tensor<2x8xf32>"
        ));
        // A body that changes the carried shape is refused.
        let growing = text.replace(
            "%2 = stablehlo.add %v, %v : tensor<?x8xf32>",
            "%2 = stablehlo.concatenate %v, %v, dim = 0 : (tensor<?x8xf32>, tensor<?x8xf32>) -> \
             tensor<?x8xf32>",
        );
        let err = refine(&growing, &[f32(&[2, 8])]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "4:5: cannot refine stablehlo.while: the loop body changes carried value 1 from \
             tensor<2x8xf32> to tensor<4x8xf32>"
        );
    }

    #[test]
    fn branches_are_refined_and_must_agree() {
        let text = r#"module {
  func.func @main(%i: tensor<i32>, %x: tensor<?xf32>) -> tensor<?xf32> {
    %0 = "stablehlo.case"(%i) ({
      %1 = stablehlo.negate %x : tensor<?xf32>
      stablehlo.return %1 : tensor<?xf32>
    }, {
      stablehlo.return %x : tensor<?xf32>
    }) : (tensor<i32>) -> tensor<?xf32>
    return %0 : tensor<?xf32>
  }
}
"#;
        let inputs = [t(DType::I32, &[]), f32(&[6])];
        let out = refine(text, &inputs).unwrap();
        assert!(out.contains("%1 = stablehlo.negate %x : tensor<6xf32>"), "{out}");
        assert!(out.contains("stablehlo.return %x : tensor<6xf32>"), "{out}");
        assert!(out.contains("}) : (tensor<i32>) -> tensor<6xf32>\n    return %0 : tensor<6xf32>"));
        let sliced = text.replace(
            "      stablehlo.return %x : tensor<?xf32>",
            "      %2 = stablehlo.slice %x [0:2] : (tensor<?xf32>) -> tensor<2xf32>\n      \
             stablehlo.return %2 : tensor<?xf32>",
        );
        let err = refine(&sliced, &inputs).unwrap_err();
        assert_eq!(
            err.to_string(),
            "3:5: cannot refine stablehlo.case: branches return different types: \
             (tensor<6xf32>) and (tensor<2xf32>)"
        );
    }

    /// Shape arithmetic folds through the integer ops jax emits; the folded value fills `{0}`.
    #[test]
    fn integer_shape_computations_fold() {
        let text = r#"module {
  func.func @main(%x: tensor<?x?xf32>) {
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %c7 = stablehlo.constant dense<-7> : tensor<i32>
    %cv = stablehlo.constant dense<[5, -1, 9]> : tensor<3xi32>
    %t = stablehlo.constant dense<true> : tensor<i1>
    %0 = stablehlo.get_dimension_size %x, dim = 0 : (tensor<?x?xf32>) -> tensor<i32>
    %1 = stablehlo.get_dimension_size %x, dim = 1 : (tensor<?x?xf32>) -> tensor<i32>
    %2 = stablehlo.multiply %0, %c2 : tensor<i32>
    %3 = stablehlo.divide %c7, %c2 : tensor<i32>
    %4 = stablehlo.remainder %c7, %c2 : tensor<i32>
    %5 = stablehlo.sign %3 : tensor<i32>
    %6 = stablehlo.abs %4 : tensor<i32>
    %7 = stablehlo.negate %6 : tensor<i32>
    %8 = stablehlo.maximum %2, %1 : tensor<i32>
    %9 = stablehlo.minimum %8, %c2 : tensor<i32>
    %10 = stablehlo.reshape %8 : (tensor<i32>) -> tensor<1xi32>
    %11 = stablehlo.broadcast_in_dim %9, dims = [] : (tensor<i32>) -> tensor<2xi32>
    %12 = stablehlo.concatenate %10, %11, dim = 0 : (tensor<1xi32>, tensor<2xi32>) -> tensor<3xi32>
    %13 = stablehlo.slice %12 [1:3] : (tensor<3xi32>) -> tensor<2xi32>
    %14 = stablehlo.clamp %c2, %cv, %8 : (tensor<i32>, tensor<3xi32>, tensor<i32>) -> tensor<3xi32>
    %15 = stablehlo.compare GT, %14, %12, SIGNED : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi1>
    %16 = stablehlo.compare LT, %7, %c2, UNSIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %17 = stablehlo.not %16 : tensor<i1>
    %18 = stablehlo.and %17, %t : tensor<i1>
    %19 = stablehlo.select %18, %3, %5 : tensor<i1>, tensor<i32>
    %20 = stablehlo.convert %15 : (tensor<3xi1>) -> tensor<3xi32>
    %21 = stablehlo.reduce(%20 init: %c2) applies stablehlo.add across dimensions = [0] : (tensor<3xi32>, tensor<i32>) -> tensor<i32>
    %22 = stablehlo.compare EQ, %c2, %c7, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %23 = stablehlo.slice %14 [0:3:2] : (tensor<3xi32>) -> tensor<2xi32>
    %24 = "stablehlo.slice"(%23) <{limit_indices = array<i64: 2>, start_indices = array<i64: 1>, strides = array<i64: 1>}> : (tensor<2xi32>) -> tensor<1xi32>
    %25 = stablehlo.reshape %24 : (tensor<1xi32>) -> tensor<i32>
    %26 = stablehlo.slice %20 [2:3] : (tensor<3xi32>) -> tensor<1xi32>
    %27 = stablehlo.reshape %26 : (tensor<1xi32>) -> tensor<i32>
    %28 = stablehlo.slice %13 [0:1] : (tensor<2xi32>) -> tensor<1xi32>
    %29 = stablehlo.reshape %28 : (tensor<1xi32>) -> tensor<i32>
    %30 = stablehlo.iota dim = 1 : tensor<2x3xi32>
    %31 = stablehlo.transpose %30, dims = [1, 0] : (tensor<2x3xi32>) -> tensor<3x2xi32>
    %32 = stablehlo.reshape %31 : (tensor<3x2xi32>) -> tensor<6xi32>
    %33 = stablehlo.slice %32 [4:5] : (tensor<6xi32>) -> tensor<1xi32>
    %34 = stablehlo.reshape %33 : (tensor<1xi32>) -> tensor<i32>
    stablehlo.custom_call @shape_assertion(%22, %2, %3, %4, %5, %6, %7, %8, %9, %12, %25, %27, %29, %16, %19, %34) {error_message = "{0} {1} {2} {3} {4} {5} {6} {7} {8} {9} {10} {11} {12} {13} {14}"} : (tensor<i1>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<3xi32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i1>, tensor<i32>, tensor<i32>) -> ()
    return
  }
}
"#;
        let err = refine(text, &[f32(&[3, 5])]).unwrap_err();
        let RefineError::ShapeAssertion { message, .. } = err else { panic!("{err:?}") };
        // b*2 = 6, -7/2 = -3, -7%2 = -1, sign -1, abs 1, -1, max(6,5) = 6, min(6,2) = 2; a list
        // keeps its placeholder; [6,2,2]; clamp(2, [5,-1,9], 6) = [5,2,6], [::2][1] = 6;
        // [5>6, 2>2, 6>2] as i32, [2] = 1; [2,2][0] = 2; -1 <u 2 is false so not() is true: -3;
        // iota(2x3, dim 1) transposed to 3x2 and flattened is [0,0,1,1,2,2]: [4] = 2.
        assert_eq!(message, "6 -3 -1 -1 1 -1 6 2 {8} 6 1 2 0 -3 2");
    }

    #[test]
    fn folding_covers_lists_and_unsigned_compares() {
        let dims = [2u64, 3];
        assert_eq!(unravel(4, &dims), vec![1, 1]);
        assert_eq!(ravel(&[1, 1], &dims), 4);
        assert_eq!(wrap(DType::I32, i64::from(i32::MAX) + 1), i64::from(i32::MIN));
        assert_eq!(wrap(DType::U8, -1), 255);
        assert_eq!(wrap(DType::Bool, 7), 1);
        assert_eq!(slice_shape(&[10], &[1], &[8], &[3]).unwrap(), vec![3]);
        assert!(slice_shape(&[10], &[1], &[11], &[1]).is_err());
        assert_eq!(pad_shape(&[4], &[1], &[-1], &[2]).unwrap(), vec![10]);
        assert_eq!(
            dot_shape(&[2, 3, 4], &[2, 4, 5], &[0], &[0], &[2], &[1]).unwrap(),
            vec![2, 3, 5]
        );
        assert!(dot_shape(&[3, 4], &[5, 6], &[], &[], &[1], &[0]).is_err());
        let cumsum =
            reduce_window_shape(&[5, 8], &[5, 1], &[1, 1], &[1, 1], &[1, 1], &[4, 0, 0, 0]);
        assert_eq!(cumsum.unwrap(), vec![5, 8]);
        assert_eq!(unescape(r#"a\"b\\c\0Ad"#), "a\"b\\c\nd");
    }
}

/// Malformed input gets an error, never a panic: real exports, mutated at random (deterministic
/// seed), then refined.
#[cfg(test)]
mod malformed_input {
    use super::*;

    #[test]
    fn mutated_exports_are_refused_without_panicking() {
        let source = include_str!("../../tests/data/reader/symbolic.mlir");
        let inputs = [TensorType::new(DType::BF16, [4, 512])];
        let mut state = 0x9e3779b97f4a7c15u64;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let mut panics = 0;
        for _ in 0..4000 {
            let mut s: Vec<u8> = source.as_bytes().to_vec();
            for _ in 0..1 + next(4) {
                let i = next(s.len());
                match next(4) {
                    0 => {
                        let len = 1 + next(12);
                        s.drain(i..(i + len).min(s.len()));
                    }
                    1 => {
                        let j = next(s.len());
                        let c = s[j];
                        s.insert(i, c);
                    }
                    2 => s[i] = b"0123456789?x<>(){}[],:%@\"=-"[next(27)],
                    _ => {
                        let j = next(s.len());
                        s.swap(i, j);
                    }
                }
            }
            let Ok(text) = String::from_utf8(s) else { continue };
            let r = std::panic::catch_unwind(|| refine(&text, &inputs));
            if r.is_err() {
                panics += 1;
                if panics < 3 {
                    eprintln!("refine panicked on:\n{text}\n----");
                }
            }
        }
        assert_eq!(panics, 0);
    }
}
