//! A reader for the StableHLO text the project must understand: modules exported by
//! `jax.export` (`exported.mlir_module()`), modules from our own printer, and hand-written ones.
//!
//! This is not an MLIR parser. It reads the module header, the signatures of its `func.func`
//! definitions (and `sdy.mesh` declarations), and treats function bodies as opaque text that only
//! has to tokenize cleanly: terminated strings and balanced `()`, `[]`, `{}`. Whatever it does not
//! understand it rejects with a [`ReadError`] that carries the `line:column` of the problem; it
//! never guesses.
//!
//! What it offers:
//! - [`parse_module`]: the module's name, attributes, functions (name, visibility, argument and
//!   result types with their attribute dictionaries, function attributes, byte spans).
//! - [`strip_locations`]: the same text without `loc(...)` and `#loc` alias definitions.
//! - [`symbol_references`] and [`rename_symbols`]: whole `@symbol` tokens, never inside strings.
//! - [`Module::functions_for_inlining`]: the module's functions as private functions with
//!   prefixed names, ready to be placed inside another module and reached by `func.call`.
//! - [`content_fingerprint`]: a hash that ignores locations, whitespace and comments.
//!
//! Every entry point re-tokenizes the whole text in a single pass (no regex, no backtracking), so
//! the cost is linear in the size of the text (a 25 KB export parses in about 0.1 ms).
//!
//! Not handled, and rejected with an error rather than misread: element types other than
//! f32 f64 bf16 f16 i1 i8 i16 i32 i64 ui8 ui32 f8E4M3FN f8E5M2, unranked tensors, tensor
//! encodings (bounded dynamism), non-tensor argument types (`!stablehlo.token`, `tuple<...>`),
//! attribute or type alias definitions other than `#name = loc(...)`, function declarations
//! without a body, top-level operations other than `func.func` and `sdy.mesh`, and the
//! `{-# ... #-}` resource section. Attribute values are kept as raw text, not interpreted, and
//! function bodies are not verified (an undefined `%value` in a body goes unnoticed).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Range;

use crate::types::{DType, Dim, Shape, TensorType};

// ---------------------------------------------------------------------------------------------
// Errors

/// An error reading StableHLO text: a position (1-based line and column, in characters) and a
/// lowercase message naming what was expected and what was found.
///
/// `Display` prints `line:column: message`, e.g. `3:17: expected tensor type, found "tuple<"`.
/// An error that is not about a position in the text (a bad rename map, a bad inlining prefix)
/// has line and column 0 and displays the message alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadError {
    line: usize,
    column: usize,
    message: String,
}

impl ReadError {
    fn at(text: &str, offset: usize, message: impl Into<String>) -> ReadError {
        let (line, column) = line_col(text, offset);
        ReadError { line, column, message: message.into() }
    }

    fn detached(message: impl Into<String>) -> ReadError {
        ReadError { line: 0, column: 0, message: message.into() }
    }

    /// The 1-based line of the problem, or 0 when the error is not about a position in the text.
    pub fn line(&self) -> usize {
        self.line
    }

    /// The 1-based column (in characters) of the problem, or 0 (see [`ReadError::line`]).
    pub fn column(&self) -> usize {
        self.column
    }

    /// The message without the position.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            f.write_str(&self.message)
        } else {
            write!(f, "{}:{}: {}", self.line, self.column, self.message)
        }
    }
}

impl std::error::Error for ReadError {}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let bytes = text.as_bytes();
    let before = &bytes[..offset.min(bytes.len())];
    let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before[line_start..].iter().filter(|&&b| b & 0xC0 != 0x80).count() + 1;
    (line, column)
}

/// A short, quoted description of the text at `offset` for "found ..." messages.
fn found(text: &str, offset: usize) -> String {
    let Some(rest) = text.get(offset..) else {
        return "end of input".to_string();
    };
    let b = rest.as_bytes();
    let Some(&first) = b.first() else {
        return "end of input".to_string();
    };
    if first.is_ascii_whitespace() {
        return "whitespace".to_string();
    }
    let len = if first == b'"' {
        string_end(rest, 0).unwrap_or(b.len())
    } else if rest.starts_with("->") {
        2
    } else {
        let sigil = usize::from(matches!(first, b'@' | b'%' | b'#' | b'!' | b'^'));
        let word = sigil + b[sigil..].iter().take_while(|&&c| is_word_byte(c)).count();
        if word == 0 {
            rest.chars().next().map_or(1, char::len_utf8)
        } else if matches!(b.get(word), Some(b'<' | b'(')) {
            word + 1
        } else {
            word
        }
    };
    let mut end = len.min(40);
    while !rest.is_char_boundary(end) {
        end -= 1;
    }
    let ellipsis = if end < len { "..." } else { "" };
    format!("{:?}", format!("{}{ellipsis}", &rest[..end]))
}

// ---------------------------------------------------------------------------------------------
// Tokens

/// What a token is. The tokenizer is deliberately coarse: numbers, keywords, op names and
/// dimension lists (`8x128xf32`) are all `Word`s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A run of `[A-Za-z0-9_$.]`.
    Word,
    /// A string literal, quotes included.
    Str,
    /// `@name` or `@"name"`.
    Symbol,
    /// `%name`, `%name#3`.
    Value,
    /// `#name`: an attribute alias or a dialect attribute.
    Hash,
    /// `!name`: a dialect type or type alias.
    Bang,
    /// `^bb0`.
    Caret,
    /// `->`.
    Arrow,
    /// Any other single character: brackets, `<`, `>`, `,`, `:`, `=`, `?`, `*`, `+`, `-`, `|`.
    Punct(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tok {
    pub(crate) kind: Kind,
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// Number of enclosing `(`, `[`, `{`.
    pub(crate) depth: u32,
    /// For brackets, the index of the matching bracket; `usize::MAX` otherwise.
    pub(crate) pair: usize,
}

const NO_PAIR: usize = usize::MAX;

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'.')
}

/// End of a run of symbol/value identifier characters `[A-Za-z0-9_$.-]` starting at `i`; a `-`
/// that starts `->` is not part of it.
fn suffix_end(b: &[u8], mut i: usize) -> usize {
    while let Some(&c) = b.get(i) {
        if is_word_byte(c) || (c == b'-' && b.get(i + 1) != Some(&b'>')) {
            i += 1;
        } else {
            break;
        }
    }
    i
}

fn word_end(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|&c| is_word_byte(c)) {
        i += 1;
    }
    i
}

/// The offset just past the string literal whose opening quote is at `open`.
fn string_end(text: &str, open: usize) -> Result<usize, ReadError> {
    let b = text.as_bytes();
    let mut j = open + 1;
    while let Some(&c) = b.get(j) {
        match c {
            b'"' => return Ok(j + 1),
            b'\\' if b.get(j + 1).is_some_and(|&n| n != b'\n') => j += 2,
            b'\\' | b'\n' => break,
            _ => j += 1,
        }
    }
    Err(ReadError::at(text, open, "unterminated string literal"))
}

fn closer_of(open: u8) -> u8 {
    match open {
        b'(' => b')',
        b'[' => b']',
        _ => b'}',
    }
}

/// Splits the whole text into tokens, checking that strings are terminated, brackets balanced,
/// and no character outside a string is unknown to MLIR. Comments (`// ...`) are skipped.
pub(crate) fn tokenize(text: &str) -> Result<Vec<Tok>, ReadError> {
    let b = text.as_bytes();
    let mut toks: Vec<Tok> = Vec::with_capacity(b.len() / 5);
    let mut open: Vec<usize> = Vec::new();
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        let start = i;
        let kind = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i = b[i..].iter().position(|&x| x == b'\n').map_or(b.len(), |p| i + p);
                continue;
            }
            b'"' => {
                i = string_end(text, i)?;
                Kind::Str
            }
            b'@' => {
                if b.get(i + 1) == Some(&b'"') {
                    i = string_end(text, i + 1)?;
                } else {
                    i = suffix_end(b, i + 1);
                    if i == start + 1 {
                        let msg =
                            format!("expected symbol name after '@', found {}", found(text, i));
                        return Err(ReadError::at(text, i, msg));
                    }
                }
                Kind::Symbol
            }
            b'%' => {
                i = suffix_end(b, i + 1);
                if i == start + 1 {
                    let msg = format!("expected value name after '%', found {}", found(text, i));
                    return Err(ReadError::at(text, i, msg));
                }
                if b.get(i) == Some(&b'#') && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                    while b.get(i).is_some_and(u8::is_ascii_digit) {
                        i += 1;
                    }
                }
                Kind::Value
            }
            b'#' | b'!' | b'^' => {
                i = word_end(b, i + 1);
                if i == start + 1 {
                    let msg = format!(
                        "expected identifier after '{}', found {}",
                        c as char,
                        found(text, i)
                    );
                    return Err(ReadError::at(text, i, msg));
                }
                match c {
                    b'#' => Kind::Hash,
                    b'!' => Kind::Bang,
                    _ => Kind::Caret,
                }
            }
            b'-' if b.get(i + 1) == Some(&b'>') => {
                i += 2;
                Kind::Arrow
            }
            _ if is_word_byte(c) => {
                i = word_end(b, i);
                Kind::Word
            }
            b'(' | b'[' | b'{' | b')' | b']' | b'}' | b'<' | b'>' | b',' | b':' | b'=' | b'?'
            | b'*' | b'+' | b'-' | b'|' => {
                i += 1;
                Kind::Punct(c)
            }
            _ => {
                let msg = format!("unexpected character {}", found(text, i));
                return Err(ReadError::at(text, i, msg));
            }
        };
        let idx = toks.len();
        let mut tok = Tok { kind, start, end: i, depth: open.len() as u32, pair: NO_PAIR };
        match c {
            b'(' | b'[' | b'{' => open.push(idx),
            b')' | b']' | b'}' => {
                let Some(o) = open.pop() else {
                    let msg = format!("unbalanced '{}': nothing to close", c as char);
                    return Err(ReadError::at(text, start, msg));
                };
                let opener = b[toks[o].start];
                if closer_of(opener) != c {
                    let (line, col) = line_col(text, toks[o].start);
                    let msg = format!(
                        "expected '{}' to close '{}' opened at {line}:{col}, found '{}'",
                        closer_of(opener) as char,
                        opener as char,
                        c as char
                    );
                    return Err(ReadError::at(text, start, msg));
                }
                toks[o].pair = idx;
                tok.pair = o;
                tok.depth = open.len() as u32;
            }
            _ => {}
        }
        toks.push(tok);
    }
    if let Some(&o) = open.last() {
        let opener = b[toks[o].start];
        let (line, col) = line_col(text, toks[o].start);
        let msg = format!(
            "expected '{}' to close '{}' opened at {line}:{col}, found end of input",
            closer_of(opener) as char,
            opener as char
        );
        return Err(ReadError::at(text, b.len(), msg));
    }
    Ok(toks)
}

fn tok_is_punct(toks: &[Tok], i: usize, c: u8) -> bool {
    toks.get(i).is_some_and(|t| t.kind == Kind::Punct(c))
}

fn tok_is_word(text: &str, toks: &[Tok], i: usize, w: &str) -> bool {
    toks.get(i).is_some_and(|t| t.kind == Kind::Word && &text[t.start..t.end] == w)
}

/// `loc` followed by `(`: the start of a location.
fn is_loc_start(text: &str, toks: &[Tok], i: usize) -> bool {
    tok_is_word(text, toks, i, "loc") && tok_is_punct(toks, i + 1, b'(')
}

/// A top-level `#name =` or `!name =`: an alias definition.
fn is_alias_def(toks: &[Tok], i: usize) -> bool {
    toks.get(i).is_some_and(|t| t.depth == 0 && matches!(t.kind, Kind::Hash | Kind::Bang))
        && tok_is_punct(toks, i + 1, b'=')
}

/// A `#name` that names an alias rather than a dialect attribute (`#stablehlo<...>`,
/// `#sdy.sharding<...>`): no `.` in the name and no `<` right after it.
fn is_alias_ref(text: &str, toks: &[Tok], i: usize) -> bool {
    let Some(t) = toks.get(i) else { return false };
    let next_is_angle =
        toks.get(i + 1).is_some_and(|n| n.kind == Kind::Punct(b'<') && n.start == t.end);
    t.kind == Kind::Hash && !text[t.start..t.end].contains('.') && !next_is_angle
}

/// Checks the alias definitions and references: only location aliases (`#name = loc(...)`) may be
/// defined, each once; every alias referenced is defined, and only inside `loc(...)`.
fn check_aliases(text: &str, toks: &[Tok]) -> Result<(), ReadError> {
    let mut defs: BTreeMap<&str, usize> = BTreeMap::new();
    let mut i = 0;
    while let Some(t) = toks.get(i) {
        if is_alias_def(toks, i) {
            let name = &text[t.start..t.end];
            if t.kind == Kind::Bang {
                let msg = format!("type alias definitions are not supported, found {name:?}");
                return Err(ReadError::at(text, t.start, msg));
            }
            if !is_loc_start(text, toks, i + 2) {
                let msg = format!(
                    "unsupported alias definition {name:?}: only location aliases \
                     ({name} = loc(...)) are supported, found {}",
                    found(text, toks.get(i + 2).map_or(text.len(), |t| t.start))
                );
                return Err(ReadError::at(text, t.start, msg));
            }
            if defs.insert(name, i).is_some() {
                return Err(ReadError::at(text, t.start, format!("duplicate alias {name:?}")));
            }
            i = toks[i + 3].pair + 1;
        } else {
            i += 1;
        }
    }
    // Index of the `)` that closes the `loc(` we are in, if any.
    let mut loc_close: Option<usize> = None;
    for (i, t) in toks.iter().enumerate() {
        if loc_close.is_some_and(|c| i > c) {
            loc_close = None;
        }
        if loc_close.is_none() && is_loc_start(text, toks, i) {
            loc_close = Some(toks[i + 1].pair);
        }
        if is_alias_ref(text, toks, i) && !is_alias_def(toks, i) {
            let name = &text[t.start..t.end];
            if !defs.contains_key(name) {
                return Err(ReadError::at(text, t.start, format!("undefined alias {name:?}")));
            }
            if loc_close.is_none() {
                let msg = format!("location alias {name:?} used outside loc(...)");
                return Err(ReadError::at(text, t.start, msg));
            }
        }
    }
    Ok(())
}

/// The name of a symbol token, without `@` and with a quoted name unescaped.
pub(crate) fn symbol_name(text: &str, t: &Tok) -> Result<String, ReadError> {
    let raw = &text[t.start + 1..t.end];
    if !raw.starts_with('"') {
        return Ok(raw.to_string());
    }
    let inner = raw.get(1..raw.len().saturating_sub(1)).unwrap_or("");
    let out = unescape_bytes(inner).map_err(|i| {
        ReadError::at(text, t.start + 2 + i, "invalid escape sequence in quoted symbol name")
    })?;
    String::from_utf8(out)
        .map_err(|_| ReadError::at(text, t.start, "quoted symbol name is not valid utf-8"))
}

/// The bytes of an MLIR string literal's body (`\"`, `\\`, `\n`, `\t`, `\XX` unescaped), or
/// the offset of the first invalid escape.
pub(crate) fn unescape_bytes(inner: &str) -> Result<Vec<u8>, usize> {
    let b = inner.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c != b'\\' {
            out.push(c);
            i += 1;
            continue;
        }
        let hex = |k: usize| b.get(k).and_then(|&h| (h as char).to_digit(16));
        match b.get(i + 1) {
            Some(&q @ (b'\\' | b'"')) => out.push(q),
            Some(b'n') => out.push(b'\n'),
            Some(b't') => out.push(b'\t'),
            _ => match (hex(i + 1), hex(i + 2)) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 1;
                }
                _ => return Err(i),
            },
        }
        i += 2;
    }
    Ok(out)
}

/// `[A-Za-z_][A-Za-z0-9_$.]*`: a symbol name MLIR accepts without quotes.
fn is_bare_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_') && bytes.all(is_word_byte)
}

/// `@name`, or `@"name"` when the name needs quoting.
pub(crate) fn format_symbol(name: &str) -> String {
    if is_bare_identifier(name) {
        return format!("@{name}");
    }
    let mut out = String::with_capacity(name.len() + 3);
    out.push_str("@\"");
    for c in name.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `stablehlo.custom_call @target(...)`: the target is a string, not a symbol reference.
fn is_custom_call_target(text: &str, toks: &[Tok], i: usize) -> bool {
    i > 0
        && (tok_is_word(text, toks, i - 1, "stablehlo.custom_call")
            || tok_is_word(text, toks, i - 1, "mhlo.custom_call"))
}

// ---------------------------------------------------------------------------------------------
// Rewriting: location stripping and symbol renaming

/// Copies `text[bytes]`, whose tokens are `toks[tok_range]`, dropping locations when `strip` is
/// set and renaming the symbols in `renames`.
fn rewrite(
    text: &str,
    toks: &[Tok],
    tok_range: Range<usize>,
    bytes: Range<usize>,
    strip: bool,
    renames: &BTreeMap<String, String>,
    segments: &mut Vec<(usize, usize)>,
) -> Result<String, ReadError> {
    let b = text.as_bytes();
    let mut out = String::with_capacity(bytes.len());
    let mut cursor = bytes.start;
    let back_over_blanks = |mut k: usize, floor: usize| {
        while k > floor && matches!(b[k - 1], b' ' | b'\t') {
            k -= 1;
        }
        k
    };
    let mut i = tok_range.start;
    while i < tok_range.end {
        let t = toks[i];
        if strip && is_alias_def(toks, i) && is_loc_start(text, toks, i + 2) {
            // `#name = loc(...)`: remove the whole line when it holds nothing else.
            let close = toks[i + 3].pair;
            let span = removal_span(b, back_over_blanks(t.start, cursor), t.start, toks[close].end);
            let (start, end) = (span.start, span.end);
            segments.push((out.len(), cursor));
            out.push_str(&text[cursor..start]);
            cursor = end;
            i = close + 1;
        } else if strip && is_loc_start(text, toks, i) {
            let close = toks[i + 1].pair;
            segments.push((out.len(), cursor));
            out.push_str(&text[cursor..back_over_blanks(t.start, cursor)]);
            cursor = toks[close].end;
            i = close + 1;
        } else {
            if t.kind == Kind::Symbol
                && !renames.is_empty()
                && !is_custom_call_target(text, toks, i)
                && let Some(new) = renames.get(&symbol_name(text, &t)?)
            {
                segments.push((out.len(), cursor));
                out.push_str(&text[cursor..t.start]);
                out.push_str(&format_symbol(new));
                cursor = t.end;
            }
            i += 1;
        }
    }
    segments.push((out.len(), cursor));
    out.push_str(&text[cursor..bytes.end]);
    Ok(out)
}

/// Removes every location from StableHLO text: `loc(...)` after ops, arguments, block arguments,
/// functions and the module (however nested: `fused[...]`, `callsite(... at ...)`, names, file
/// positions, `#loc` references), and the `#name = loc(...)` alias definitions before or after
/// the module, together with their lines.
///
/// String literals are never touched (a `loc(` inside a `backend_config` stays), and the result
/// still parses as MLIR. Fails on text that does not tokenize (unterminated strings, unbalanced
/// brackets), on non-location alias definitions, and on undefined aliases.
pub fn strip_locations(text: &str) -> Result<String, ReadError> {
    let toks = tokenize(text)?;
    check_aliases(text, &toks)?;
    rewrite(text, &toks, 0..toks.len(), 0..text.len(), true, &BTreeMap::new(), &mut Vec::new())
}

/// [`strip_locations`], and where each run of the result comes from: `(offset in the result,
/// offset in text)` pairs in increasing order, so a position in the stripped text maps back to
/// the text it was stripped from.
pub(crate) fn strip_locations_mapped(
    text: &str,
) -> Result<(String, Vec<(usize, usize)>), ReadError> {
    let toks = tokenize(text)?;
    check_aliases(text, &toks)?;
    let mut segments = Vec::new();
    let stripped =
        rewrite(text, &toks, 0..toks.len(), 0..text.len(), true, &BTreeMap::new(), &mut segments)?;
    Ok((stripped, segments))
}

/// One occurrence of a symbol token (`@name` or `@"name"`) outside string literals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolRef {
    /// The symbol name without `@` (unescaped when it was quoted).
    pub name: String,
    /// Byte span of the whole token, `@` included.
    pub span: Range<usize>,
    /// The target of a `stablehlo.custom_call @target(...)`: a name for the backend, not a
    /// reference to a symbol of the module. [`rename_symbols`] leaves these alone.
    pub custom_call_target: bool,
}

/// Every symbol token in the text, definitions (`func.func @f`, `sdy.mesh @m`) and uses
/// (`call @f`, `decomposition = @f`, `called_computations = [@f]`, `#sdy.sharding<@m, ...>`)
/// alike, in text order.
pub fn symbol_references(text: &str) -> Result<Vec<SymbolRef>, ReadError> {
    let toks = tokenize(text)?;
    let mut out = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        if t.kind == Kind::Symbol {
            out.push(SymbolRef {
                name: symbol_name(text, t)?,
                span: t.start..t.end,
                custom_call_target: is_custom_call_target(text, &toks, i),
            });
        }
    }
    Ok(out)
}

fn rename_map(map: &[(&str, &str)]) -> Result<BTreeMap<String, String>, ReadError> {
    let mut renames = BTreeMap::new();
    for &(old, new) in map {
        if new.is_empty() {
            return Err(ReadError::detached(format!("cannot rename @{old} to an empty name")));
        }
        if renames.insert(old.to_string(), new.to_string()).is_some() {
            return Err(ReadError::detached(format!("symbol @{old} is renamed twice")));
        }
    }
    Ok(renames)
}

/// Renames symbols: every whole symbol token whose name is a key of `map` (given without `@`)
/// becomes `@new` (quoted as `@"new"` when the new name is not a bare identifier). Definitions
/// and references are renamed alike; string literals, `%values`, longer symbols that merely start
/// with the name, and `stablehlo.custom_call` targets are left alone. Everything else, locations
/// included, is kept byte for byte.
pub fn rename_symbols(text: &str, map: &[(&str, &str)]) -> Result<String, ReadError> {
    let renames = rename_map(map)?;
    let toks = tokenize(text)?;
    check_aliases(text, &toks)?;
    rewrite(text, &toks, 0..toks.len(), 0..text.len(), false, &renames, &mut Vec::new())
}

// ---------------------------------------------------------------------------------------------
// Fingerprints

/// 128-bit FNV-1a.
struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u128::from(b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }
}

/// A stable fingerprint of StableHLO text's content: 32 lowercase hex digits of a 128-bit FNV-1a
/// hash of the location-stripped text with whitespace and comments normalised away (its tokens,
/// each followed by one space).
///
/// Two exports that differ only in locations, indentation, line breaks or comments get the same
/// fingerprint. It is a cache key, not a cryptographic hash: do not rely on it against someone
/// crafting collisions.
pub fn content_fingerprint(text: &str) -> Result<String, ReadError> {
    let stripped = strip_locations(text)?;
    let toks = tokenize(&stripped)?;
    let mut hash = Fnv128(Fnv128::OFFSET);
    for t in &toks {
        hash.write(&stripped.as_bytes()[t.start..t.end]);
        hash.write(b" ");
    }
    Ok(format!("{:032x}", hash.0))
}

// ---------------------------------------------------------------------------------------------
// The module model

/// The symbol visibility of a function (`func.func public`, or with none written, is public).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visibility {
    Public,
    Private,
}

/// One argument or result of a function signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arg {
    /// The SSA name of an argument as written (`%arg0`); `None` for results.
    pub name: Option<String>,
    /// The type. Each `?` dimension is a [`Dim::Symbolic`] named `d0`, `d1`, ... in order of
    /// appearance in the function's signature (arguments, then results). MLIR's `?` does not
    /// say which dynamic dimensions are equal, so neither do these names: `d0` and `d1` may or may
    /// not be the same size.
    pub ty: TensorType,
    /// The attribute dictionary, as ordered (name, raw value text) pairs. Names are kept as
    /// written (quoted if they were quoted); a unit attribute has an empty value.
    pub attributes: Vec<(String, String)>,
}

/// A `func.func` definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function<'t> {
    /// The symbol name without `@`.
    pub name: String,
    pub visibility: Visibility,
    pub args: Vec<Arg>,
    pub results: Vec<Arg>,
    /// The `attributes {...}` dictionary after the signature, as ordered raw pairs.
    pub attributes: Vec<(String, String)>,
    /// Byte span of the whole definition, from `func.func` to its closing brace or trailing
    /// `loc(...)`.
    pub span: Range<usize>,
    /// Byte span of the body text between the braces (braces excluded).
    pub body_span: Range<usize>,
    /// The body text between the braces, verbatim (locations included).
    pub body: &'t str,
    /// Token indices of the body.
    pub(crate) body_toks: Range<usize>,
}

/// An `sdy.mesh @name = <...>` declaration (Shardy sharding meshes in sharded exports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshDecl {
    /// The symbol name without `@`.
    pub name: String,
    /// Byte span of the whole declaration.
    pub span: Range<usize>,
}

/// A parsed StableHLO module. It borrows the text it was parsed from.
#[derive(Clone, PartialEq, Eq)]
pub struct Module<'t> {
    /// The symbol name (`module @jit_f` gives `jit_f`).
    pub name: Option<String>,
    /// The module attribute dictionary, as ordered (name, raw value text) pairs, e.g.
    /// `("mhlo.num_partitions", "1 : i32")`.
    pub attributes: Vec<(String, String)>,
    /// The functions, in text order.
    pub functions: Vec<Function<'t>>,
    /// The `sdy.mesh` declarations, in text order.
    pub meshes: Vec<MeshDecl>,
    /// Byte span from `module` to its closing brace or trailing `loc(...)`.
    pub span: Range<usize>,
    text: &'t str,
    pub(crate) toks: Vec<Tok>,
}

impl fmt::Debug for Module<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("name", &self.name)
            .field("attributes", &self.attributes)
            .field("functions", &self.functions)
            .field("meshes", &self.meshes)
            .field("span", &self.span)
            .finish_non_exhaustive()
    }
}

/// A function of an imported module, renamed and made private, ready to be placed in another
/// module (see [`Module::functions_for_inlining`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InlinedFunc {
    /// The new symbol name, without `@`.
    pub name: String,
    /// The name it had in the imported module.
    pub original_name: String,
    /// Whether this is the module's entry function ([`Module::main`]).
    pub is_entry: bool,
    /// The signature, with top-level-only attributes removed.
    pub args: Vec<Arg>,
    pub results: Vec<Arg>,
    /// The whole definition: `func.func private @name(...) -> ... { ... }`.
    pub text: String,
}

/// Argument and result attributes that only mean something on the top-level entry function of
/// an executable; they are dropped when a function is inlined.
const TOP_LEVEL_ONLY_ATTRIBUTES: [&str; 4] =
    ["jax.result_info", "tf.aliasing_output", "mhlo.layout_mode", "jax.buffer_donor"];

impl<'t> Module<'t> {
    /// The text this module was parsed from.
    pub fn text(&self) -> &'t str {
        self.text
    }

    /// The function named `name` (without `@`).
    pub fn function(&self, name: &str) -> Option<&Function<'t>> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// The entry function: `@main` if there is one, otherwise the only public function.
    pub fn main(&self) -> Result<&Function<'t>, ReadError> {
        if let Some(main) = self.function("main") {
            return Ok(main);
        }
        let mut public = self.functions.iter().filter(|f| f.visibility == Visibility::Public);
        match (public.next(), public.next()) {
            (Some(f), None) => Ok(f),
            (None, _) => {
                let msg = "expected an entry function (@main or a single public function), \
                           found no public function";
                Err(ReadError::at(self.text, self.span.start, msg))
            }
            (Some(a), Some(b)) => {
                let msg = format!(
                    "expected an entry function (@main or a single public function), found \
                     several public functions (@{}, @{}, ...)",
                    a.name, b.name
                );
                Err(ReadError::at(self.text, self.span.start, msg))
            }
        }
    }

    /// This module's functions as private functions to place inside another module.
    ///
    /// Naming: the entry function ([`Module::main`], usually `@main`) becomes `@{prefix}`; every
    /// other function `@f` becomes `@{prefix}_f`. All references inside the bodies (`call`,
    /// `func.call`, `decomposition = @f`, `called_computations = [@f]`) are renamed to match.
    /// The prefix must be a bare identifier (`[A-Za-z_][A-Za-z0-9_$.]*`); avoiding clashes with
    /// the target module's own symbols is the caller's business.
    ///
    /// Each function becomes `private`; its bodies are kept verbatim apart from location
    /// stripping and renaming; the argument/result attributes `jax.result_info`,
    /// `tf.aliasing_output`, `mhlo.layout_mode` and `jax.buffer_donor` are dropped (others, like
    /// `mhlo.sharding` or `jax.global_constant`, are kept). Module attributes are not carried:
    /// checking that `mhlo.num_partitions` or `jax.uses_shape_polymorphism` suit the target is
    /// the caller's job. Modules that declare `sdy.mesh` are refused. Functions come in text
    /// order.
    pub fn functions_for_inlining(&self, prefix: &str) -> Result<Vec<InlinedFunc>, ReadError> {
        if !is_bare_identifier(prefix) {
            return Err(ReadError::detached(format!(
                "expected an inlining prefix of the form [A-Za-z_][A-Za-z0-9_$.]*, found {prefix:?}"
            )));
        }
        if let Some(mesh) = self.meshes.first() {
            let msg = format!(
                "cannot inline a module that declares sdy.mesh @{}: only unsharded modules can \
                 be inlined",
                mesh.name
            );
            return Err(ReadError::at(self.text, mesh.span.start, msg));
        }
        let entry = self.main()?.name.clone();
        let new_name =
            |f: &str| if f == entry { prefix.to_string() } else { format!("{prefix}_{f}") };
        let renames: BTreeMap<String, String> =
            self.functions.iter().map(|f| (f.name.clone(), new_name(&f.name))).collect();
        let pairs: Vec<(&str, &str)> =
            renames.iter().map(|(old, new)| (old.as_str(), new.as_str())).collect();
        let keep = |attrs: &[(String, String)]| -> Result<Vec<(String, String)>, ReadError> {
            let mut out = Vec::with_capacity(attrs.len());
            for (name, value) in attrs {
                if !TOP_LEVEL_ONLY_ATTRIBUTES.contains(&name.trim_matches('"')) {
                    out.push((name.clone(), rename_symbols(value, &pairs)?));
                }
            }
            Ok(out)
        };
        let mut out = Vec::with_capacity(self.functions.len());
        for f in &self.functions {
            let name = new_name(&f.name);
            let strip = |a: &Arg| -> Result<Arg, ReadError> {
                Ok(Arg { name: a.name.clone(), ty: a.ty.clone(), attributes: keep(&a.attributes)? })
            };
            let args = f.args.iter().map(strip).collect::<Result<Vec<_>, _>>()?;
            let results = f.results.iter().map(strip).collect::<Result<Vec<_>, _>>()?;
            let attributes = keep(&f.attributes)?;
            let body = rewrite(
                self.text,
                &self.toks,
                f.body_toks.clone(),
                f.body_span.clone(),
                true,
                &renames,
                &mut Vec::new(),
            )?;
            let mut text = format!("func.func private {}", format_symbol(&name));
            push_signature(&mut text, &args, &results, &attributes);
            text.push_str(" {");
            text.push_str(&body);
            text.push('}');
            out.push(InlinedFunc {
                name,
                original_name: f.name.clone(),
                is_entry: f.name == entry,
                args,
                results,
                text,
            });
        }
        Ok(out)
    }

    /// This module with an entry that also takes one parameter per output in `outputs`, in
    /// that order, after its own: each has its output's type and `tf.aliasing_output` naming
    /// it, and is never read. A caller donates memory for those outputs (memory it allocated
    /// and reuses), and the runtime writes the outputs there instead of into fresh buffers.
    ///
    /// The new `@main` calls the module's functions, placed as by
    /// [`Module::functions_for_inlining`] (so a module declaring `sdy.mesh` is refused), and
    /// keeps the old entry's argument and result attributes. Module attributes are kept. An
    /// output listed twice, out of range, or already written into an argument (its own
    /// `tf.aliasing_output`) is an error naming it.
    pub fn with_output_params(&self, outputs: &[usize]) -> Result<String, ReadError> {
        let entry = self.main()?;
        for (k, &out) in outputs.iter().enumerate() {
            if out >= entry.results.len() {
                return Err(ReadError::detached(format!(
                    "output {out} does not exist: @{} has {} results",
                    entry.name,
                    entry.results.len()
                )));
            }
            if outputs[..k].contains(&out) {
                return Err(ReadError::detached(format!("output {out} is listed twice")));
            }
            let aliased = entry.args.iter().position(|a| {
                a.attributes.iter().any(|(name, value)| {
                    name.trim_matches('"') == "tf.aliasing_output"
                        && value.split(':').next().map(str::trim) == Some(&*out.to_string())
                })
            });
            if let Some(arg) = aliased {
                return Err(ReadError::detached(format!(
                    "output {out} is already written into argument {arg}"
                )));
            }
        }
        // Every function is renamed (`@tpuk_body`, `@tpuk_body_f`), so no new name meets an old
        // one, and none is `@main`.
        let prefix = "tpuk_body";
        let inlined = self.functions_for_inlining(prefix)?;
        let mut text = String::from("module");
        if let Some(name) = &self.name {
            text.push(' ');
            text.push_str(&format_symbol(name));
        }
        if !self.attributes.is_empty() {
            text.push_str(" attributes ");
            push_dict(&mut text, &self.attributes);
        }
        text.push_str(" {\n");
        for f in &inlined {
            text.push_str("  ");
            text.push_str(&f.text);
            text.push('\n');
        }
        let mut args: Vec<Arg> = entry
            .args
            .iter()
            .enumerate()
            .map(|(i, a)| Arg {
                name: Some(format!("%arg{i}")),
                ty: a.ty.clone(),
                attributes: a.attributes.clone(),
            })
            .collect();
        for &out in outputs {
            args.push(Arg {
                name: Some(format!("%arg{}", args.len())),
                ty: entry.results[out].ty.clone(),
                attributes: vec![("tf.aliasing_output".to_owned(), format!("{out} : i32"))],
            });
        }
        text.push_str("  func.func public @main");
        push_signature(&mut text, &args, &entry.results, &[]);
        text.push_str(" {\n");
        let takes: Vec<String> = entry.args.iter().map(|a| a.ty.to_string()).collect();
        let operands: Vec<String> = (0..entry.args.len()).map(|i| format!("%arg{i}")).collect();
        let gives: Vec<String> = entry.results.iter().map(|r| r.ty.to_string()).collect();
        let (lhs, values) = match gives.len() {
            0 => (String::new(), Vec::new()),
            1 => ("%0 = ".to_owned(), vec!["%0".to_owned()]),
            n => (format!("%0:{n} = "), (0..n).map(|k| format!("%0#{k}")).collect()),
        };
        let gives_text =
            if gives.len() == 1 { gives[0].clone() } else { format!("({})", gives.join(", ")) };
        text.push_str(&format!(
            "    {lhs}func.call {}({}) : ({}) -> {gives_text}\n",
            format_symbol(prefix),
            operands.join(", "),
            takes.join(", "),
        ));
        if values.is_empty() {
            text.push_str("    return\n");
        } else {
            text.push_str(&format!("    return {} : {}\n", values.join(", "), gives.join(", ")));
        }
        text.push_str("  }\n}\n");
        Ok(text)
    }
}

/// What to delete to remove the text `text_start..end` of `b`, given `blank_start`, the start
/// moved back over the blanks before it: the whole line (with its newline) when the text is
/// alone on its line, else just the text.
pub(crate) fn removal_span(
    b: &[u8],
    blank_start: usize,
    text_start: usize,
    end: usize,
) -> Range<usize> {
    if blank_start != 0 && b[blank_start - 1] != b'\n' {
        return text_start..end;
    }
    let mut end = end;
    while matches!(b.get(end), Some(b' ' | b'\t' | b'\r')) {
        end += 1;
    }
    if b.get(end) == Some(&b'\n') {
        end += 1;
    }
    blank_start..end
}

/// With token `open` a `<`, the index just past its matching `>`, searching before `limit`
/// (bracketed groups inside are skipped whole).
pub(crate) fn angle_close(toks: &[Tok], open: usize, limit: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = open;
    while i < limit {
        let t = toks.get(i)?;
        match t.kind {
            Kind::Punct(b'<') => depth += 1,
            Kind::Punct(b'>') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            Kind::Punct(b'(' | b'[' | b'{') => i = t.pair,
            _ => {}
        }
        i += 1;
    }
    None
}

/// `(%a: type {attrs}, ...) -> results attributes {...}`: a function signature after its name.
pub(crate) fn push_signature(
    out: &mut String,
    args: &[Arg],
    results: &[Arg],
    attributes: &[(String, String)],
) {
    out.push('(');
    for (k, a) in args.iter().enumerate() {
        if k > 0 {
            out.push_str(", ");
        }
        out.push_str(a.name.as_deref().unwrap_or("%arg"));
        out.push_str(": ");
        push_type_and_attrs(out, a);
    }
    out.push(')');
    match results {
        [] => {}
        [r] if r.attributes.is_empty() => {
            out.push_str(" -> ");
            out.push_str(&r.ty.to_string());
        }
        _ => {
            out.push_str(" -> (");
            for (k, r) in results.iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                push_type_and_attrs(out, r);
            }
            out.push(')');
        }
    }
    if !attributes.is_empty() {
        out.push_str(" attributes ");
        push_dict(out, attributes);
    }
}

pub(crate) fn push_type_and_attrs(out: &mut String, a: &Arg) {
    out.push_str(&a.ty.to_string());
    if !a.attributes.is_empty() {
        out.push(' ');
        push_dict(out, &a.attributes);
    }
}

pub(crate) fn push_dict(out: &mut String, attrs: &[(String, String)]) {
    out.push('{');
    for (k, (name, value)) in attrs.iter().enumerate() {
        if k > 0 {
            out.push_str(", ");
        }
        out.push_str(name);
        if !value.is_empty() {
            out.push_str(" = ");
            out.push_str(value);
        }
    }
    out.push('}');
}

// ---------------------------------------------------------------------------------------------
// Parsing

/// Parses a StableHLO module: `#loc` alias definitions, then
/// `module [@name] [attributes {...}] { ... } [loc(...)]`, then more alias definitions. The
/// module body may hold `func.func` definitions and `sdy.mesh` declarations; anything else is an
/// error. Function bodies are not parsed, only checked to tokenize cleanly.
pub fn parse_module(text: &str) -> Result<Module<'_>, ReadError> {
    let toks = tokenize(text)?;
    check_aliases(text, &toks)?;
    let mut p = Parser { text, toks: &toks, pos: 0 };
    p.skip_alias_defs();
    if !p.is_word(p.pos, "module") {
        return Err(p.expected(p.pos, "\"module\""));
    }
    let start = p.offset(p.pos);
    p.pos += 1;
    let name = match p.toks.get(p.pos) {
        Some(t) if t.kind == Kind::Symbol => {
            p.pos += 1;
            Some(symbol_name(text, t)?)
        }
        _ => None,
    };
    let mut attributes = Vec::new();
    if p.is_word(p.pos, "attributes") {
        p.pos += 1;
        attributes = p.parse_dict()?;
    }
    if !p.is_punct(p.pos, b'{') {
        return Err(p.expected(p.pos, "'{' opening the module body"));
    }
    let close = toks[p.pos].pair;
    p.pos += 1;
    let mut functions: Vec<Function<'_>> = Vec::new();
    let mut meshes: Vec<MeshDecl> = Vec::new();
    let mut symbols: BTreeSet<String> = BTreeSet::new();
    while p.pos < close {
        let at = p.pos;
        let symbol = if p.is_word(at, "func.func") {
            let f = p.parse_func(close)?;
            let name = f.name.clone();
            functions.push(f);
            name
        } else if p.is_word(at, "sdy.mesh") {
            let mesh = p.parse_mesh(close)?;
            let name = mesh.name.clone();
            meshes.push(mesh);
            name
        } else {
            return Err(p.expected(at, "\"func.func\" or the end of the module"));
        };
        if !symbols.insert(symbol.clone()) {
            let msg = format!("duplicate symbol @{symbol} in the module");
            return Err(ReadError::at(text, toks[at].start, msg));
        }
    }
    p.pos = close + 1;
    p.skip_loc();
    let end = toks[p.pos - 1].end;
    p.skip_alias_defs();
    if p.pos < toks.len() {
        return Err(p.expected(p.pos, "end of input after the module"));
    }
    Ok(Module { name, attributes, functions, meshes, span: start..end, text, toks })
}

struct Parser<'t, 'k> {
    text: &'t str,
    toks: &'k [Tok],
    pos: usize,
}

impl<'t> Parser<'t, '_> {
    fn offset(&self, i: usize) -> usize {
        self.toks.get(i).map_or(self.text.len(), |t| t.start)
    }

    fn expected(&self, i: usize, what: &str) -> ReadError {
        let offset = self.offset(i);
        ReadError::at(
            self.text,
            offset,
            format!("expected {what}, found {}", found(self.text, offset)),
        )
    }

    fn is_word(&self, i: usize, w: &str) -> bool {
        tok_is_word(self.text, self.toks, i, w)
    }

    fn is_punct(&self, i: usize, c: u8) -> bool {
        tok_is_punct(self.toks, i, c)
    }

    fn skip_loc(&mut self) {
        if is_loc_start(self.text, self.toks, self.pos) {
            self.pos = self.toks[self.pos + 1].pair + 1;
        }
    }

    /// Skips `#name = loc(...)` definitions (already validated by `check_aliases`).
    fn skip_alias_defs(&mut self) {
        while is_alias_def(self.toks, self.pos) && is_loc_start(self.text, self.toks, self.pos + 2)
        {
            self.pos = self.toks[self.pos + 3].pair + 1;
        }
    }

    fn symbol(&mut self, what: &str) -> Result<String, ReadError> {
        match self.toks.get(self.pos) {
            Some(t) if t.kind == Kind::Symbol => {
                self.pos += 1;
                symbol_name(self.text, t)
            }
            _ => Err(self.expected(self.pos, what)),
        }
    }

    /// `func.func [public|private] @name(args) [-> results] [attributes {...}] {body} [loc]`.
    fn parse_func(&mut self, limit: usize) -> Result<Function<'t>, ReadError> {
        let first = self.pos;
        self.pos += 1;
        let visibility = if self.is_word(self.pos, "public") {
            self.pos += 1;
            Visibility::Public
        } else if self.is_word(self.pos, "private") {
            self.pos += 1;
            Visibility::Private
        } else if self.toks.get(self.pos).is_some_and(|t| t.kind == Kind::Word) {
            return Err(self.expected(self.pos, "visibility \"public\" or \"private\""));
        } else {
            Visibility::Public
        };
        let name = self.symbol("function name (@name)")?;
        if !self.is_punct(self.pos, b'(') {
            return Err(self.expected(self.pos, "'(' opening the argument list"));
        }
        let close = self.toks[self.pos].pair;
        self.pos += 1;
        let mut next_sym = 0;
        let mut args: Vec<Arg> = Vec::new();
        while self.pos < close {
            if !args.is_empty() {
                if !self.is_punct(self.pos, b',') {
                    return Err(self.expected(self.pos, "',' or ')' in the argument list"));
                }
                self.pos += 1;
            }
            let Some(t) = self.toks.get(self.pos).filter(|t| t.kind == Kind::Value) else {
                return Err(self.expected(self.pos, "argument name (%name)"));
            };
            let arg_name = self.text[t.start..t.end].to_string();
            if args.iter().any(|a| a.name.as_deref() == Some(arg_name.as_str())) {
                let msg = format!("duplicate argument name {arg_name}");
                return Err(ReadError::at(self.text, t.start, msg));
            }
            self.pos += 1;
            if !self.is_punct(self.pos, b':') {
                return Err(self.expected(self.pos, "':' after the argument name"));
            }
            self.pos += 1;
            let ty = self.parse_type(close, &mut next_sym)?;
            let attributes =
                if self.is_punct(self.pos, b'{') { self.parse_dict()? } else { Vec::new() };
            self.skip_loc();
            args.push(Arg { name: Some(arg_name), ty, attributes });
        }
        self.pos = close + 1;
        let mut results = Vec::new();
        if self.toks.get(self.pos).is_some_and(|t| t.kind == Kind::Arrow) {
            self.pos += 1;
            if self.is_punct(self.pos, b'(') {
                let close = self.toks[self.pos].pair;
                self.pos += 1;
                while self.pos < close {
                    if !results.is_empty() {
                        if !self.is_punct(self.pos, b',') {
                            return Err(self.expected(self.pos, "',' or ')' in the result list"));
                        }
                        self.pos += 1;
                    }
                    let ty = self.parse_type(close, &mut next_sym)?;
                    let attributes =
                        if self.is_punct(self.pos, b'{') { self.parse_dict()? } else { Vec::new() };
                    results.push(Arg { name: None, ty, attributes });
                }
                self.pos = close + 1;
            } else {
                let ty = self.parse_type(limit, &mut next_sym)?;
                results.push(Arg { name: None, ty, attributes: Vec::new() });
            }
        }
        let mut attributes = Vec::new();
        if self.is_word(self.pos, "attributes") {
            self.pos += 1;
            attributes = self.parse_dict()?;
        }
        if !self.is_punct(self.pos, b'{') {
            return Err(self.expected(self.pos, "'{' opening the function body"));
        }
        let open = self.pos;
        let close = self.toks[open].pair;
        self.pos = close + 1;
        self.skip_loc();
        let body_span = self.toks[open].end..self.toks[close].start;
        Ok(Function {
            name,
            visibility,
            args,
            results,
            attributes,
            span: self.toks[first].start..self.toks[self.pos - 1].end,
            body: &self.text[body_span.clone()],
            body_span,
            body_toks: open + 1..close,
        })
    }

    /// `sdy.mesh @name = <...> [{...}] [loc(...)]`.
    fn parse_mesh(&mut self, limit: usize) -> Result<MeshDecl, ReadError> {
        let first = self.pos;
        self.pos += 1;
        let name = self.symbol("mesh name (@name)")?;
        if !self.is_punct(self.pos, b'=') {
            return Err(self.expected(self.pos, "'=' after the mesh name"));
        }
        self.pos += 1;
        if !self.is_punct(self.pos, b'<') {
            return Err(self.expected(self.pos, "'<' opening the mesh"));
        }
        self.pos = self.angle_end(limit)?;
        if self.is_punct(self.pos, b'{') {
            self.parse_dict()?;
        }
        self.skip_loc();
        Ok(MeshDecl { name, span: self.toks[first].start..self.toks[self.pos - 1].end })
    }

    /// With `self.pos` on a `<`, the index just past its matching `>` (before `limit`).
    fn angle_end(&self, limit: usize) -> Result<usize, ReadError> {
        angle_close(self.toks, self.pos, limit)
            .ok_or_else(|| self.expected(limit, "'>' closing '<'"))
    }

    /// `{name = value, unit_name, "quoted name" = value}` as ordered raw pairs.
    fn parse_dict(&mut self) -> Result<Vec<(String, String)>, ReadError> {
        if !self.is_punct(self.pos, b'{') {
            return Err(self.expected(self.pos, "attribute dictionary"));
        }
        let close = self.toks[self.pos].pair;
        let mut out: Vec<(String, String)> = Vec::new();
        let mut i = self.pos + 1;
        while i < close {
            if !out.is_empty() {
                if !self.is_punct(i, b',') {
                    return Err(self.expected(i, "',' or '}' in the attribute dictionary"));
                }
                i += 1;
            }
            let t = self.toks[i];
            if !matches!(t.kind, Kind::Word | Kind::Str) {
                return Err(self.expected(i, "attribute name"));
            }
            let name = self.text[t.start..t.end].to_string();
            if out.iter().any(|(n, _)| *n == name) {
                let msg = format!("duplicate attribute {name}");
                return Err(ReadError::at(self.text, t.start, msg));
            }
            i += 1;
            let mut value = String::new();
            if self.is_punct(i, b'=') {
                i += 1;
                let first = i;
                let mut angle = 0usize;
                // Whether the tokens since the last operator (`:`, `->`, `-`, ...) form a
                // complete value: two values side by side mean a missing `,`.
                let mut after_value = false;
                while i < close {
                    let t = self.toks[i];
                    let starts_value = matches!(
                        t.kind,
                        Kind::Word
                            | Kind::Str
                            | Kind::Symbol
                            | Kind::Value
                            | Kind::Hash
                            | Kind::Bang
                            | Kind::Caret
                            | Kind::Punct(b'(' | b'[' | b'{')
                    );
                    if angle == 0 {
                        let adjacent = i > first && self.toks[i - 1].end == t.start;
                        if (starts_value && after_value && !adjacent) || t.kind == Kind::Punct(b'=')
                        {
                            return Err(self.expected(i, "',' or '}' in the attribute dictionary"));
                        }
                        after_value = starts_value || t.kind == Kind::Punct(b'>');
                    }
                    match t.kind {
                        Kind::Punct(b',') if angle == 0 => break,
                        Kind::Punct(b'<') => angle += 1,
                        Kind::Punct(b'>') if angle == 0 => {
                            return Err(self.expected(i, "attribute value"));
                        }
                        Kind::Punct(b'>') => angle -= 1,
                        Kind::Punct(b'(' | b'[' | b'{') => i = t.pair,
                        _ => {}
                    }
                    i += 1;
                }
                if angle != 0 {
                    return Err(self.expected(i, "'>' in the attribute value"));
                }
                if i == first {
                    return Err(self.expected(i, "attribute value"));
                }
                value = self.text[self.toks[first].start..self.toks[i - 1].end].to_string();
            }
            out.push((name, value));
        }
        self.pos = close + 1;
        Ok(out)
    }

    /// A ranked tensor type `tensor<8x?x128xf32>` whose tokens end before `limit`.
    fn parse_type(&mut self, limit: usize, next_sym: &mut usize) -> Result<TensorType, ReadError> {
        let i = self.pos;
        let adjacent_angle = match (self.toks.get(i), self.toks.get(i + 1)) {
            (Some(t), Some(n)) => n.kind == Kind::Punct(b'<') && n.start == t.end,
            _ => false,
        };
        if !(self.is_word(i, "tensor") && adjacent_angle) {
            return Err(self.expected(i, "tensor type"));
        }
        let (ty, gt) = parse_tensor_body(self.text, self.toks[i + 1].end, next_sym)?;
        let Some(k) = (i + 2..limit).find(|&k| self.toks.get(k).is_some_and(|t| t.start == gt))
        else {
            return Err(ReadError::at(self.text, gt, "unexpected '>' outside the type"));
        };
        self.pos = k + 1;
        Ok(ty)
    }
}

fn skip_blanks(b: &[u8], mut k: usize) -> usize {
    while b.get(k).is_some_and(u8::is_ascii_whitespace) {
        k += 1;
    }
    k
}

/// Parses `8x?x128xf32>` starting at byte `k`; returns the type and the offset of the `>`.
pub(crate) fn parse_tensor_body(
    text: &str,
    mut k: usize,
    next_sym: &mut usize,
) -> Result<(TensorType, usize), ReadError> {
    let b = text.as_bytes();
    let mut dims = Vec::new();
    loop {
        k = skip_blanks(b, k);
        match b.get(k) {
            Some(b'?') => {
                dims.push(Dim::sym(&format!("d{next_sym}")));
                *next_sym += 1;
                k += 1;
            }
            Some(c) if c.is_ascii_digit() => {
                let s = k;
                while b.get(k).is_some_and(u8::is_ascii_digit) {
                    k += 1;
                }
                let n = text[s..k].parse::<u64>().map_err(|_| {
                    let msg = format!("dimension size {} does not fit in 64 bits", &text[s..k]);
                    ReadError::at(text, s, msg)
                })?;
                dims.push(Dim::Static(n));
            }
            Some(b'*') => {
                return Err(ReadError::at(text, k, "unranked tensor types are not supported"));
            }
            _ => break,
        }
        k = skip_blanks(b, k);
        if b.get(k) != Some(&b'x') {
            let msg = format!("expected 'x' after a dimension, found {}", found(text, k));
            return Err(ReadError::at(text, k, msg));
        }
        k += 1;
    }
    let s = k;
    while b.get(k).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') {
        k += 1;
    }
    let name = &text[s..k];
    if name.is_empty() {
        let msg = format!("expected element type, found {}", found(text, s));
        return Err(ReadError::at(text, s, msg));
    }
    let Some(dtype) = DType::ALL.into_iter().find(|d| d.mlir_name() == name) else {
        let supported: Vec<&str> = DType::ALL.iter().map(|d| d.mlir_name()).collect();
        let msg = format!(
            "unsupported element type {} (supported: {})",
            found(text, s),
            supported.join(", ")
        );
        return Err(ReadError::at(text, s, msg));
    };
    k = skip_blanks(b, k);
    match b.get(k) {
        Some(b'>') => Ok((TensorType { dtype, shape: Shape(dims) }, k)),
        Some(b',') => Err(ReadError::at(text, k, "tensor encodings are not supported")),
        _ => {
            let msg = format!("expected '>' closing the tensor type, found {}", found(text, k));
            Err(ReadError::at(text, k, msg))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Generated with jax 0.12.0.1 (`jax.export.export(...).mlir_module()`, locations included).
    /// `f(x, y) = inner(x) + sum(inner(y))` with a nested `jax.jit`: a private function and calls.
    const NESTED_JIT: &str = include_str!("../../tests/data/reader/nested_jit.mlir");
    /// RMS norm over `bf16[b, 512]` with `jax.export.symbolic_shape("b")`.
    const SYMBOLIC: &str = include_str!("../../tests/data/reader/symbolic.mlir");
    /// A Pallas add kernel exported with `platforms=['tpu']`: a `tpu_custom_call`.
    const PALLAS_TPU: &str = include_str!("../../tests/data/reader/pallas_tpu.mlir");
    /// The same kernel with `interpret=True` for cpu: a `stablehlo.while` over the grid.
    const PALLAS_CPU: &str = include_str!("../../tests/data/reader/pallas_interpret_cpu.mlir");
    /// `jax.lax.composite` and `donate_argnums=(0,)`: `decomposition = @my.fma`,
    /// `tf.aliasing_output`.
    const COMPOSITE: &str = include_str!("../../tests/data/reader/composite_donate.mlir");
    /// Sharded over a 2x2 mesh with Shardy: `sdy.mesh` and `#sdy.sharding<@mesh, ...>`.
    const SHARDED: &str = include_str!("../../tests/data/reader/sharded.mlir");

    const FIXTURES: [(&str, &str); 6] = [
        ("nested_jit", NESTED_JIT),
        ("symbolic", SYMBOLIC),
        ("pallas_tpu", PALLAS_TPU),
        ("pallas_interpret_cpu", PALLAS_CPU),
        ("composite_donate", COMPOSITE),
        ("sharded", SHARDED),
    ];

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    fn types(args: &[Arg]) -> Vec<String> {
        args.iter().map(|a| a.ty.to_string()).collect()
    }

    /// No `loc(` and no `#loc` alias left outside string literals.
    fn assert_no_locations(text: &str) {
        let toks = tokenize(text).unwrap();
        for (i, t) in toks.iter().enumerate() {
            assert!(!is_loc_start(text, &toks, i), "loc( left at {}", t.start);
            assert!(!is_alias_ref(text, &toks, i), "alias left at {}", t.start);
        }
    }

    #[test]
    fn reads_nested_jit_export() {
        let m = parse_module(NESTED_JIT).unwrap();
        assert_eq!(m.name.as_deref(), Some("jit_nested"));
        assert_eq!(
            m.attributes,
            pairs(&[
                ("jax.uses_shape_polymorphism", "false"),
                ("mhlo.num_partitions", "1 : i32"),
                ("mhlo.num_replicas", "1 : i32"),
            ])
        );
        let names: Vec<&str> = m.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["main", "inner"]);
        let main = m.main().unwrap();
        assert_eq!(main.visibility, Visibility::Public);
        assert_eq!(types(&main.args), ["tensor<8x128xf32>", "tensor<8x128xf32>"]);
        assert_eq!(main.args[0].name.as_deref(), Some("%arg0"));
        assert!(main.args[0].attributes.is_empty());
        assert_eq!(types(&main.results), ["tensor<8x128xf32>"]);
        assert_eq!(main.results[0].attributes, pairs(&[("jax.result_info", "\"result\"")]));
        let inner = m.function("inner").unwrap();
        assert_eq!(inner.visibility, Visibility::Private);
        assert_eq!(inner.results[0].ty, TensorType::new(DType::F32, [8, 128]));
        assert!(inner.results[0].attributes.is_empty());
        // Spans: the whole definition, trailing loc included, and the body between the braces.
        assert!(NESTED_JIT[inner.span.clone()].starts_with("func.func private @inner("));
        assert!(NESTED_JIT[inner.span.clone()].ends_with("} loc(#loc29)"));
        assert_eq!(&NESTED_JIT[inner.body_span.clone()], inner.body);
        assert!(inner.body.trim().starts_with("%cst = stablehlo.constant"));
        assert!(inner.body.trim().ends_with("return %2 : tensor<8x128xf32> loc(#loc)"));
        assert!(NESTED_JIT[m.span.clone()].starts_with("module @jit_nested"));
        assert!(NESTED_JIT[m.span.clone()].ends_with("} loc(#loc)"));
        assert!(m.meshes.is_empty());
        assert!(m.function("nope").is_none());
    }

    #[test]
    fn reads_every_fixture() {
        for (name, text) in FIXTURES {
            let m = parse_module(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(m.main().unwrap().name, "main", "{name}");
            assert_eq!(m.text(), text);
            let debug = format!("{m:?}");
            assert!(debug.starts_with("Module {") && !debug.contains("Tok {"), "{name}");
        }
        let m = parse_module(PALLAS_CPU).unwrap();
        let names: Vec<&str> = m.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["main", "_where", "_where_0"]);
        assert_eq!(types(&m.functions[1].args), ["tensor<i1>", "tensor<i32>", "tensor<i32>"]);
        let m = parse_module(COMPOSITE).unwrap();
        let main = m.main().unwrap();
        assert_eq!(main.args[0].attributes, pairs(&[("tf.aliasing_output", "0 : i32")]));
        assert_eq!(types(&main.results), ["tensor<4x8xf32>", "tensor<f32>"]);
        assert_eq!(main.results[1].attributes, pairs(&[("jax.result_info", "\"result[1]\"")]));
        assert_eq!(m.functions[1].name, "my.fma");
    }

    #[test]
    fn reads_shardy_meshes_and_shardings() {
        let m = parse_module(SHARDED).unwrap();
        assert_eq!(m.meshes.len(), 1);
        assert_eq!(m.meshes[0].name, "mesh");
        assert!(SHARDED[m.meshes[0].span.clone()].starts_with("sdy.mesh @mesh = <[\"a\"=2"));
        assert!(SHARDED[m.meshes[0].span.clone()].ends_with("loc(#loc)"));
        assert_eq!(m.attributes[1], ("mhlo.num_partitions".into(), "4 : i32".into()));
        let main = m.main().unwrap();
        let sharding = "#sdy.sharding<@mesh, [{\"a\"}, {}]>";
        assert_eq!(main.args[0].attributes, pairs(&[("sdy.sharding", sharding)]));
        assert_eq!(
            main.results[0].attributes,
            pairs(&[("jax.result_info", "\"result\""), ("sdy.sharding", sharding)])
        );
        let err = m.functions_for_inlining("k").unwrap_err();
        assert_eq!(
            err.to_string(),
            "3:3: cannot inline a module that declares sdy.mesh @mesh: only unsharded modules \
             can be inlined"
        );
    }

    #[test]
    fn symbolic_dims_are_numbered_in_signature_order() {
        let m = parse_module(SYMBOLIC).unwrap();
        assert_eq!(m.attributes[0], ("jax.uses_shape_polymorphism".into(), "true".into()));
        let main = m.main().unwrap();
        let d = |n: &str| Dim::sym(n);
        assert_eq!(main.args[0].ty.shape, Shape(vec![d("d0"), Dim::Static(512)]));
        assert_eq!(main.args[0].ty.dtype, DType::BF16);
        assert_eq!(main.results[0].ty.shape, Shape(vec![d("d1"), Dim::Static(512)]));
        let wrapped = m.function("_wrapped_jax_export_main").unwrap();
        assert_eq!(wrapped.args[0].attributes, pairs(&[("jax.global_constant", "\"b\"")]));
        assert_eq!(wrapped.args[1].ty.shape.dims()[0], d("d0"));
        assert_eq!(wrapped.results[0].ty.shape.dims()[0], d("d1"));
        let text = "module {\n  func.func @f(%a: tensor<?x?xf32>, %b: tensor<2x?xi8>) -> \
                    (tensor<?xf32>, tensor<0x?xui32>) {\n  }\n}";
        let m = parse_module(text).unwrap();
        let f = &m.functions[0];
        assert_eq!(f.args[0].ty.shape, Shape(vec![d("d0"), d("d1")]));
        assert_eq!(f.args[1].ty.shape, Shape(vec![Dim::Static(2), d("d2")]));
        assert_eq!(f.results[0].ty.shape, Shape(vec![d("d3")]));
        assert_eq!(
            f.results[1].ty,
            TensorType { dtype: DType::U32, shape: Shape(vec![0.into(), d("d4")]) }
        );
        assert_eq!(types(&f.results), ["tensor<?xf32>", "tensor<0x?xui32>"]);
    }

    #[test]
    fn reads_every_supported_element_type() {
        for dtype in DType::ALL {
            let text = format!(
                "module {{ func.func @f(%a: tensor<2x{0}>) -> tensor<{0}> {{ }} }}",
                dtype.mlir_name()
            );
            let m = parse_module(&text).unwrap();
            assert_eq!(m.functions[0].args[0].ty, TensorType::new(dtype, [2]));
            assert_eq!(m.functions[0].results[0].ty, TensorType::scalar(dtype));
        }
    }

    #[test]
    fn reads_hand_written_modules() {
        let text = r#"// a comment
module attributes {foo.unit, "quoted name" = "v", nested = {a = [1, 2], b = #x<c, d>}} {
  // no visibility: public
  func.func @first(%x: tensor< 4 x 8 x f32 > {a.b = dense<[1, 0]> : tensor<2xindex>}) attributes {fn.flag, fn.num = 3 : i64} {
    "some.op"(%x) {text = "} { ) ( loc( @first"} : (tensor<4x8xf32>) -> ()
    func.return
  }
  func.func private @"quoted-name"() -> () {
    return
  }
}
"#;
        let m = parse_module(text).unwrap();
        assert_eq!(m.name, None);
        assert_eq!(
            m.attributes,
            pairs(&[
                ("foo.unit", ""),
                ("\"quoted name\"", "\"v\""),
                ("nested", "{a = [1, 2], b = #x<c, d>}"),
            ])
        );
        let first = &m.functions[0];
        assert_eq!(first.visibility, Visibility::Public);
        assert_eq!(first.args[0].ty, TensorType::new(DType::F32, [4, 8]));
        assert_eq!(first.args[0].attributes, pairs(&[("a.b", "dense<[1, 0]> : tensor<2xindex>")]));
        assert!(first.results.is_empty());
        assert_eq!(first.attributes, pairs(&[("fn.flag", ""), ("fn.num", "3 : i64")]));
        assert_eq!(m.functions[1].name, "quoted-name");
        assert!(m.functions[1].args.is_empty() && m.functions[1].results.is_empty());
        assert_eq!(m.main().unwrap().name, "first");
        // The string's `loc(` and `@first` are text, not a location or a symbol.
        assert_eq!(strip_locations(text).unwrap(), text);
        let renamed = rename_symbols(text, &[("first", "second")]).unwrap();
        assert_eq!(renamed, text.replace("func.func @first", "func.func @second"));
    }

    #[test]
    fn main_is_main_or_the_single_public_function() {
        let two = "module { func.func @a() { } func.func @b() { } }";
        let err = parse_module(two).unwrap().main().unwrap_err();
        assert_eq!(
            err.to_string(),
            "1:1: expected an entry function (@main or a single public function), found \
             several public functions (@a, @b, ...)"
        );
        let none = "module @m { func.func private @a() { } }";
        let err = parse_module(none).unwrap().main().unwrap_err();
        assert!(err.to_string().ends_with("found no public function"), "{err}");
        let one = "module { func.func private @a() { } func.func public @b() { } }";
        assert_eq!(parse_module(one).unwrap().main().unwrap().name, "b");
        let main = "module { func.func @a() { } func.func private @main() { } }";
        assert_eq!(parse_module(main).unwrap().main().unwrap().name, "main");
    }

    #[test]
    fn strips_every_kind_of_location() {
        let text = r##"#loc1 = loc("z")
module @m {
  func.func @main(%arg0: tensor<f32> loc("a(b)"), %arg1: tensor<f32> {x.y = 1 : i32} loc(#loc1)) -> tensor<f32> {
    %0 = stablehlo.custom_call @foo(%arg0) {backend_config = "loc(#loc1) \22keep\22"} : (tensor<f32>) -> tensor<f32> loc(fused["a", callsite("f"("x.py":1:2 to :5) at "g"("y.py":3:4))])
    %1 = "stablehlo.case"(%arg0) ({
      ^bb0(%b: tensor<f32> loc(unknown)):
        stablehlo.return %b : tensor<f32> loc(#loc2)
    }) : (tensor<f32>) -> tensor<f32> loc(#loc1)
    return %0 : tensor<f32> loc(#loc1)
  } loc(#loc1)
} loc(#loc)
#loc = loc(unknown)
#loc2 = loc(callsite(#loc1 at #loc))
"##;
        let expected = r##"module @m {
  func.func @main(%arg0: tensor<f32>, %arg1: tensor<f32> {x.y = 1 : i32}) -> tensor<f32> {
    %0 = stablehlo.custom_call @foo(%arg0) {backend_config = "loc(#loc1) \22keep\22"} : (tensor<f32>) -> tensor<f32>
    %1 = "stablehlo.case"(%arg0) ({
      ^bb0(%b: tensor<f32>):
        stablehlo.return %b : tensor<f32>
    }) : (tensor<f32>) -> tensor<f32>
    return %0 : tensor<f32>
  }
}
"##;
        assert_eq!(strip_locations(text).unwrap(), expected);
        assert_eq!(strip_locations(expected).unwrap(), expected);
    }

    #[test]
    fn stripped_fixtures_have_no_locations_and_read_the_same() {
        for (name, text) in FIXTURES {
            let stripped = strip_locations(text).unwrap();
            assert_no_locations(&stripped);
            assert!(stripped.starts_with("module @"), "{name}");
            assert!(stripped.ends_with("}\n"), "{name}");
            assert_eq!(strip_locations(&stripped).unwrap(), stripped, "{name}: idempotent");
            let (a, b) = (parse_module(text).unwrap(), parse_module(&stripped).unwrap());
            assert_eq!(a.name, b.name);
            assert_eq!(a.attributes, b.attributes);
            for (fa, fb) in a.functions.iter().zip(&b.functions) {
                assert_eq!((&fa.name, &fa.args, &fa.results), (&fb.name, &fb.args, &fb.results));
            }
        }
        // The Mosaic payload of the TPU kernel is a string: kept byte for byte.
        let config = |t: &str| {
            let start = t.find("backend_config = \"").unwrap();
            let len = t[start..].find("\", kernel_name").unwrap();
            t[start..start + len].to_string()
        };
        let stripped = strip_locations(PALLAS_TPU).unwrap();
        assert!(config(PALLAS_TPU).len() > 1000);
        assert_eq!(config(&stripped), config(PALLAS_TPU));
    }

    #[test]
    fn fingerprints_ignore_locations_whitespace_and_comments() {
        let fp = content_fingerprint(NESTED_JIT).unwrap();
        assert_eq!(fp.len(), 32);
        assert!(fp.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let stripped = strip_locations(NESTED_JIT).unwrap();
        assert_eq!(content_fingerprint(&stripped).unwrap(), fp);
        let reflowed =
            format!("// header\n{}", stripped.replace("  ", "\t \t").replace(", ", ",\n"));
        assert_eq!(content_fingerprint(&reflowed).unwrap(), fp);
        // A real change changes it; so does renaming; every fixture differs.
        let changed = NESTED_JIT.replace("dense<2.000000e+00>", "dense<3.000000e+00>");
        assert_ne!(content_fingerprint(&changed).unwrap(), fp);
        let renamed = rename_symbols(NESTED_JIT, &[("inner", "inner2")]).unwrap();
        assert_ne!(content_fingerprint(&renamed).unwrap(), fp);
        let mut all: Vec<String> =
            FIXTURES.iter().map(|(_, t)| content_fingerprint(t).unwrap()).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), FIXTURES.len());
        // Whitespace inside a string literal is content.
        let a = r#"module attributes {a = "x y"} {}"#;
        let b = r#"module attributes {a = "x  y"} {}"#;
        assert_ne!(content_fingerprint(a).unwrap(), content_fingerprint(b).unwrap());
        // Pinned: the hash must not change between versions (it keys on-disk caches).
        assert_eq!(content_fingerprint("").unwrap(), "6c62272e07bb014262b821756295c58d");
        // FNV-1a 128 of "module { } ", computed independently.
        let empty_module = "93f49fb39073a7be91786764bf5a0181";
        assert_eq!(content_fingerprint("module {}").unwrap(), empty_module);
        assert_eq!(content_fingerprint("module {\n}\n// done\n").unwrap(), empty_module);
    }

    #[test]
    fn renames_whole_symbols_only() {
        let text = r#"module {
  func.func @main(%arg0: tensor<f32>) -> tensor<f32> {
    %0 = func.call @f(%arg0) : (tensor<f32>) -> tensor<f32>
    %1 = call @f.g(%0) : (tensor<f32>) -> tensor<f32>
    %2 = stablehlo.composite "f" %1 {decomposition = @f} : (tensor<f32>) -> tensor<f32>
    %3 = "mhlo.async_start"(%2) {called_computations = [@f, @"f"]} : (tensor<f32>) -> tensor<f32>
    %4 = stablehlo.custom_call @f(%3) {note = "@f @main"} : (tensor<f32>) -> tensor<f32>
    return %4 : tensor<f32>
  }
  func.func private @f(%arg0: tensor<f32>) -> tensor<f32> { return %arg0 : tensor<f32> }
  func.func private @f.g(%arg0: tensor<f32>) -> tensor<f32> { return %arg0 : tensor<f32> }
}"#;
        let renamed = rename_symbols(text, &[("f", "k_f"), ("main", "needs quoting")]).unwrap();
        let expected = text
            .replace("@main(", "@\"needs quoting\"(")
            .replace("func.call @f(", "func.call @k_f(")
            .replace("= @f}", "= @k_f}")
            .replace("[@f, @\"f\"]", "[@k_f, @k_f]")
            .replace("private @f(", "private @k_f(");
        assert_eq!(renamed, expected);
        assert!(renamed.contains("stablehlo.custom_call @f(%3) {note = \"@f @main\"}"));
        assert!(renamed.contains("@f.g("));
        // Renaming nothing, or a name that is absent, changes nothing.
        assert_eq!(rename_symbols(NESTED_JIT, &[]).unwrap(), NESTED_JIT);
        assert_eq!(rename_symbols(NESTED_JIT, &[("absent", "x")]).unwrap(), NESTED_JIT);
        let err = rename_symbols(text, &[("f", "a"), ("f", "b")]).unwrap_err();
        assert_eq!(err.to_string(), "symbol @f is renamed twice");
        assert_eq!((err.line(), err.column()), (0, 0));
        assert!(rename_symbols(text, &[("f", "")]).is_err());
        // Quoted names round-trip through renaming.
        let quoted = rename_symbols("module { func.func @a() { } }", &[("a", "x\"y\\z")]).unwrap();
        assert_eq!(quoted, r#"module { func.func @"x\"y\\z"() { } }"#);
        let m = parse_module(&quoted).unwrap();
        assert_eq!(m.functions[0].name, "x\"y\\z");
        let back = rename_symbols(&quoted, &[("x\"y\\z", "a")]).unwrap();
        assert_eq!(back, "module { func.func @a() { } }");
    }

    #[test]
    fn lists_symbol_references() {
        let refs = symbol_references(NESTED_JIT).unwrap();
        let names: Vec<&str> = refs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["jit_nested", "main", "inner", "inner", "inner"]);
        assert_eq!(&NESTED_JIT[refs[1].span.clone()], "@main");
        let refs = symbol_references(PALLAS_TPU).unwrap();
        let targets: Vec<&str> =
            refs.iter().filter(|r| r.custom_call_target).map(|r| r.name.as_str()).collect();
        assert_eq!(targets, ["tpu_custom_call"]);
        let refs = symbol_references(SHARDED).unwrap();
        assert_eq!(refs.iter().filter(|r| r.name == "mesh").count(), 3);
    }

    #[test]
    fn inlines_nested_jit_as_private_prefixed_functions() {
        let m = parse_module(NESTED_JIT).unwrap();
        let funcs = m.functions_for_inlining("kern").unwrap();
        let names: Vec<(&str, &str, bool)> =
            funcs.iter().map(|f| (f.name.as_str(), f.original_name.as_str(), f.is_entry)).collect();
        assert_eq!(names, [("kern", "main", true), ("kern_inner", "inner", false)]);
        let entry = &funcs[0];
        assert!(
            entry.text.starts_with(
                "func.func private @kern(%arg0: tensor<8x128xf32>, %arg1: tensor<8x128xf32>) \
                 -> tensor<8x128xf32> {\n    %cst = stablehlo.constant"
            ),
            "{}",
            entry.text
        );
        assert!(entry.text.contains("%0 = call @kern_inner(%arg0)"));
        assert!(entry.text.ends_with("return %4 : tensor<8x128xf32>\n  }"));
        assert!(entry.results[0].attributes.is_empty(), "jax.result_info is dropped");
        assert_eq!(types(&entry.args), ["tensor<8x128xf32>", "tensor<8x128xf32>"]);
        // The functions drop into another module and read back.
        let outer = assemble(&funcs);
        assert_no_locations(&outer);
        let back = parse_module(&outer).unwrap();
        assert!(back.functions.iter().all(|f| f.visibility == Visibility::Private));
        assert_eq!(back.function("kern").unwrap().args, entry.args);
        let err = m.functions_for_inlining("1bad").unwrap_err();
        assert!(err.to_string().contains("found \"1bad\""), "{err}");
    }

    /// A module holding the inlined functions and a public `@main` calling the entry.
    fn assemble(funcs: &[InlinedFunc]) -> String {
        let mut out = String::from("module @outer {\n");
        for f in funcs {
            out.push_str("  ");
            out.push_str(&f.text);
            out.push('\n');
        }
        out.push_str("}\n");
        out
    }

    #[test]
    fn inlining_drops_top_level_attributes_and_renames_every_reference() {
        let m = parse_module(COMPOSITE).unwrap();
        let funcs = m.functions_for_inlining("k").unwrap();
        let entry = &funcs[0];
        assert!(entry.args[0].attributes.is_empty(), "tf.aliasing_output is dropped");
        assert!(entry.text.starts_with(
            "func.func private @k(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>) -> \
             (tensor<4x8xf32>, tensor<f32>) {"
        ));
        assert!(
            entry.text.contains(
                "stablehlo.composite \"my.fma\" %arg0, %arg1 {decomposition = @k_my.fma}"
            )
        );
        assert_eq!(funcs[1].name, "k_my.fma");
        assert!(funcs[1].text.starts_with("func.func private @k_my.fma("));

        let m = parse_module(SYMBOLIC).unwrap();
        let funcs = m.functions_for_inlining("rms").unwrap();
        assert_eq!(funcs[1].name, "rms__wrapped_jax_export_main");
        assert!(funcs[0].text.contains("call @rms__wrapped_jax_export_main(%0, %arg0)"));
        assert!(funcs[0].text.contains("stablehlo.custom_call @shape_assertion("));
        assert!(funcs[1].text.starts_with(
            "func.func private @rms__wrapped_jax_export_main(%arg0: tensor<i32> \
             {jax.global_constant = \"b\"}, %arg1: tensor<?x512xbf16>) -> tensor<?x512xbf16> {"
        ));

        let m = parse_module(PALLAS_TPU).unwrap();
        let funcs = m.functions_for_inlining("add").unwrap();
        assert_eq!(funcs.len(), 1);
        assert!(funcs[0].text.contains("stablehlo.custom_call @tpu_custom_call(%arg0, %arg1)"));
        let body = &m.functions[0].body;
        let config_start = body.find("{backend_config").unwrap();
        let config = &body[config_start..body.find(" : (tensor").unwrap()];
        assert!(funcs[0].text.contains(config));

        // Keeps what is meaningful inside a program: sharding, function attributes.
        let text = r#"module {
  func.func public @main(%a: tensor<4xf32> {mhlo.sharding = "{replicated}", mhlo.layout_mode = "default", jax.buffer_donor = true}) -> (tensor<4xf32> {jax.result_info = "", mhlo.sharding = "{replicated}"}) attributes {my.attr = @main} {
    return %a : tensor<4xf32>
  }
}"#;
        let funcs = parse_module(text).unwrap().functions_for_inlining("p").unwrap();
        assert_eq!(
            funcs[0].text,
            "func.func private @p(%a: tensor<4xf32> {mhlo.sharding = \"{replicated}\"}) -> \
             (tensor<4xf32> {mhlo.sharding = \"{replicated}\"}) attributes {my.attr = @p} {\n    \
             return %a : tensor<4xf32>\n  }"
        );
    }

    #[test]
    fn inlined_fixtures_read_back() {
        for (name, text) in FIXTURES {
            let m = parse_module(text).unwrap();
            let Ok(funcs) = m.functions_for_inlining("kern") else {
                assert_eq!(name, "sharded");
                continue;
            };
            let outer = assemble(&funcs);
            assert_no_locations(&outer);
            let back = parse_module(&outer).unwrap_or_else(|e| panic!("{name}: {e}\n{outer}"));
            assert_eq!(back.functions.len(), m.functions.len(), "{name}");
            for (f, g) in m.functions.iter().zip(&back.functions) {
                assert_eq!(types(&f.args), types(&g.args), "{name}");
                assert_eq!(types(&f.results), types(&g.results), "{name}");
            }
            // Every reference to a function of the module now names a renamed function.
            let defined: Vec<&str> = funcs.iter().map(|f| f.name.as_str()).collect();
            for r in symbol_references(&outer).unwrap() {
                if !r.custom_call_target && r.name != "outer" {
                    assert!(defined.contains(&r.name.as_str()), "{name}: @{}", r.name);
                }
            }
        }
    }

    #[test]
    fn rejects_what_it_does_not_understand() {
        let cases: &[(&str, &str)] = &[
            ("", "1:1: expected \"module\", found end of input"),
            ("func.func @f() {}", "1:1: expected \"module\", found \"func.func\""),
            ("module {", "1:9: expected '}' to close '{' opened at 1:8, found end of input"),
            ("module {}\n)", "2:1: unbalanced ')': nothing to close"),
            ("module { (] }", "1:11: expected ')' to close '(' opened at 1:10, found ']'"),
            ("module {} foo", "1:11: expected end of input after the module, found \"foo\""),
            (
                "module {\n  func.func @f(%a: tuple<tensor<f32>>) {}\n}",
                "2:20: expected tensor type, found \"tuple<\"",
            ),
            (
                "module { func.func @f(%a: !stablehlo.token) {} }",
                "1:27: expected tensor type, found \"!stablehlo.token\"",
            ),
            (
                "module { func.func @f(%a: tensor<4xcomplex<f32>>) {} }",
                "1:36: unsupported element type \"complex<\" (supported: f32, f64, bf16, f16, \
                 i8, i16, i32, i64, ui8, ui32, i1, f8E4M3FN, f8E5M2)",
            ),
            (
                "module { func.func @f(%a: tensor<4xindex>) {} }",
                "1:36: unsupported element type \"index\" (supported: f32, f64, bf16, f16, i8, \
                 i16, i32, i64, ui8, ui32, i1, f8E4M3FN, f8E5M2)",
            ),
            (
                "module { func.func @f(%a: tensor<*xf32>) {} }",
                "1:34: unranked tensor types are not supported",
            ),
            (
                "module { func.func @f(%a: tensor<4xf32, #stablehlo.bounds<8>>) {} }",
                "1:39: tensor encodings are not supported",
            ),
            (
                "module { func.func @f(%a: tensor<4x>) {} }",
                "1:36: expected element type, found \">\"",
            ),
            (
                "module { func.func @f(%a: tensor<4f32>) {} }",
                "1:35: expected 'x' after a dimension, found \"f32\"",
            ),
            (
                "module { func.func @f(%a: tensor<99999999999999999999xf32>) {} }",
                "1:34: dimension size 99999999999999999999 does not fit in 64 bits",
            ),
            (
                "module { func.func @f() -> tensor<f32> }",
                "1:40: expected '{' opening the function body, found \"}\"",
            ),
            (
                "module { func.func private @f(tensor<f32>) }",
                "1:31: expected argument name (%name), found \"tensor<\"",
            ),
            (
                "module { func.func @f(%a: tensor<f32>, %a: tensor<f32>) {} }",
                "1:40: duplicate argument name %a",
            ),
            (
                "module { func.func @f(%a: tensor<f32> %b: tensor<f32>) {} }",
                "1:39: expected ',' or ')' in the argument list, found \"%b\"",
            ),
            (
                "module { func.func nested @f() {} }",
                "1:20: expected visibility \"public\" or \"private\", found \"nested\"",
            ),
            ("module { func.func () {} }", "1:20: expected function name (@name), found \"(\""),
            (
                "module {\n  func.func @f() {}\n  func.func private @f() {}\n}",
                "3:3: duplicate symbol @f in the module",
            ),
            (
                "module { %0 = stablehlo.constant dense<1> : tensor<i32> }",
                "1:10: expected \"func.func\" or the end of the module, found \"%0\"",
            ),
            ("module attributes {a = \"x} {}", "1:24: unterminated string literal"),
            ("module attributes {a = \"x\ny\"} {}", "1:24: unterminated string literal"),
            ("module attributes {a = 1,} {}", "1:26: expected attribute name, found \"}\""),
            (
                "module attributes {a = 1 b = 2} {}",
                "1:26: expected ',' or '}' in the attribute dictionary, found \"b\"",
            ),
            ("module attributes {a = } {}", "1:24: expected attribute value, found \"}\""),
            (
                "module attributes {a = x<1} {}",
                "1:27: expected '>' in the attribute value, found \"}\"",
            ),
            ("module attributes {a = 1, a = 2} {}", "1:27: duplicate attribute a"),
            (
                "module attributes {a = 1 b} {}",
                "1:26: expected ',' or '}' in the attribute dictionary, found \"b\"",
            ),
            (
                "module attributes {a = 1 : i32 \"b\" = 2} {}",
                "1:32: expected ',' or '}' in the attribute dictionary, found \"\\\"b\\\"\"",
            ),
            (
                "module attributes {a = [1] {b}} {}",
                "1:28: expected ',' or '}' in the attribute dictionary, found \"{\"",
            ),
            ("module {} é", "1:11: unexpected character \"é\""),
            ("module @ {}", "1:9: expected symbol name after '@', found whitespace"),
            (
                "#map = affine_map<(d0) -> (d0)>\nmodule {}",
                "1:1: unsupported alias definition \"#map\": only location aliases (#map = \
                 loc(...)) are supported, found \"affine_map<\"",
            ),
            (
                "!t = tensor<f32>\nmodule {}",
                "1:1: type alias definitions are not supported, found \"!t\"",
            ),
            ("module {} loc(#loc9)", "1:15: undefined alias \"#loc9\""),
            (
                "module attributes {a = #loc1} {}\n#loc1 = loc(\"x\")",
                "1:24: location alias \"#loc1\" used outside loc(...)",
            ),
            ("#loc1 = loc(\"x\")\n#loc1 = loc(\"y\")\nmodule {}", "2:1: duplicate alias \"#loc1\""),
            (
                "module { sdy.mesh @m = <[\"a\"=2] {} }",
                "1:36: expected '>' closing '<', found \"}\"",
            ),
        ];
        for (text, expected) in cases {
            let err = parse_module(text).unwrap_err();
            assert_eq!(err.to_string(), *expected, "for {text:?}");
            assert_eq!(format!("{}:{}: {}", err.line(), err.column(), err.message()), *expected);
        }
        // Text-level problems fail every entry point, not only the parser.
        for text in ["module {", "module attributes {a = \"x} {}", "module {} loc(#loc9)"] {
            assert!(strip_locations(text).is_err());
            assert!(rename_symbols(text, &[("a", "b")]).is_err());
            assert!(content_fingerprint(text).is_err());
        }
        let err: Box<dyn std::error::Error> = Box::new(parse_module("").unwrap_err());
        assert!(err.to_string().starts_with("1:1: "));
    }

    /// Cut every fixture at every byte: nothing panics, and only the complete text (up to
    /// trailing whitespace) parses.
    #[test]
    fn truncated_text_is_an_error_never_a_panic() {
        for (name, text) in FIXTURES {
            let full = text.trim_end();
            for cut in 0..=text.len() {
                let Some(prefix) = text.get(..cut) else { continue };
                match parse_module(prefix) {
                    Ok(m) => {
                        assert_eq!(prefix.trim_end(), full, "{name}: cut at {cut} parsed");
                        m.functions_for_inlining("k").ok();
                    }
                    Err(e) => assert!(e.line() >= 1 && e.column() >= 1, "{name}: {e}"),
                }
                // The other entry points share the tokenizer: every few bytes is enough.
                if cut % 4 != 0 && cut + 64 < text.len() {
                    continue;
                }
                let stripped = strip_locations(prefix);
                if stripped.is_ok() && prefix.contains("func.func") {
                    assert_eq!(prefix.trim_end(), full, "{name}: cut at {cut} stripped");
                }
                let renamed = rename_symbols(prefix, &[("main", "x"), ("inner", "y")]);
                assert_eq!(renamed.is_ok(), stripped.is_ok(), "{name}: cut at {cut}");
                assert_eq!(content_fingerprint(prefix).is_ok(), stripped.is_ok());
                symbol_references(prefix).ok();
            }
        }
        // Cutting inside a string, a type or a location of a location-free module.
        let text = strip_locations(PALLAS_TPU).unwrap();
        for cut in 0..text.trim_end().len() {
            assert!(parse_module(&text[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn output_params_extend_the_entry_and_keep_its_attributes() {
        let module = parse_module(COMPOSITE).unwrap();
        let text = module.with_output_params(&[1]).unwrap();
        let wrapped = parse_module(&text).unwrap();
        assert_eq!(wrapped.name.as_deref(), Some("jit_f"));
        assert_eq!(wrapped.attributes, module.attributes);
        let names: Vec<&str> = wrapped.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["tpuk_body", "tpuk_body_my.fma", "main"], "{text}");
        let main = wrapped.main().unwrap();
        let types: Vec<String> = main.args.iter().map(|a| a.ty.to_string()).collect();
        assert_eq!(types, ["tensor<4x8xf32>", "tensor<4x8xf32>", "tensor<f32>"]);
        assert_eq!(main.args[0].attributes, [("tf.aliasing_output".into(), "0 : i32".into())]);
        assert_eq!(main.args[2].attributes, [("tf.aliasing_output".into(), "1 : i32".into())]);
        assert_eq!(main.results, module.main().unwrap().results);
        assert!(main.body.contains("func.call @tpuk_body(%arg0, %arg1)"), "{text}");
        assert!(!main.body.contains("%arg2"), "the output's parameter is never read: {text}");
        // The composite's decomposition follows its function's new name.
        assert!(text.contains("decomposition = @tpuk_body_my.fma"), "{text}");

        let nested = parse_module(NESTED_JIT).unwrap();
        let all: Vec<usize> = (0..nested.main().unwrap().results.len()).collect();
        let text = nested.with_output_params(&all).unwrap();
        let main_args = parse_module(&text).unwrap().main().unwrap().args.len();
        assert_eq!(main_args, nested.main().unwrap().args.len() + all.len(), "{text}");
    }

    #[test]
    fn output_params_refuse_outputs_they_cannot_lend() {
        let module = parse_module(COMPOSITE).unwrap();
        let e = module.with_output_params(&[0]).unwrap_err().to_string();
        assert!(e.contains("output 0 is already written into argument 0"), "{e}");
        let e = module.with_output_params(&[2]).unwrap_err().to_string();
        assert!(e.contains("output 2 does not exist: @main has 2 results"), "{e}");
        let e = module.with_output_params(&[1, 1]).unwrap_err().to_string();
        assert!(e.contains("output 1 is listed twice"), "{e}");
        let e = parse_module(SHARDED).unwrap().with_output_params(&[0]).unwrap_err().to_string();
        assert!(e.contains("sdy.mesh"), "{e}");
    }
}
