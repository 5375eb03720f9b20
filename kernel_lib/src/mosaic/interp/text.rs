//! The lexical pieces both printed forms share: the line an error names, types and function
//! types, attribute dictionaries and their values (integers, dense arrays, lists, enums, symbols,
//! strings, constants), comma lists outside brackets, and trailing locations.

use std::fmt::Display;

use crate::reader::unescape_bytes;
use crate::types::DType;

use super::super::types::{MType, MemorySpace};

/// A line of the Mosaic body (1-based), which every error names.
#[derive(Clone, Debug)]
pub(super) struct At {
    pub no: usize,
    pub text: String,
}

impl At {
    pub fn error(&self, what: impl Display) -> String {
        format!("line {} of the Mosaic body: {what}: `{}`", self.no, self.text.trim())
    }

    pub fn fail<T>(&self, what: impl Display) -> Result<T, String> {
        Err(self.error(what))
    }
}

/// The body's non-blank lines, numbered.
pub(super) fn numbered(body: &str) -> Vec<At> {
    body.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| At { no: i + 1, text: l.to_owned() })
        .collect()
}

/// A line without its indent and its trailing `loc(...)` (the source location both printers
/// attach).
pub(super) fn strip_loc(line: &str) -> &str {
    let t = line.trim();
    match t.rfind(" loc(") {
        Some(i) if t.ends_with(')') => t[..i].trim_end(),
        _ => t,
    }
}

/// The index just past the string literal opening at `open` (a `"`).
fn string_end(s: &str, open: usize) -> Result<usize, String> {
    let b = s.as_bytes();
    let mut i = open + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err(format!("an unterminated string in `{s}`"))
}

/// Walks `s` from `from`, tracking brackets (`()[]{}<>`, the `>` of `->` excepted) and skipping
/// strings; calls `at(i, depth)` before each byte outside strings, and stops when it says so.
fn scan(
    s: &str,
    from: usize,
    mut at: impl FnMut(usize, i32) -> bool,
) -> Result<Option<usize>, String> {
    let b = s.as_bytes();
    let (mut i, mut depth) = (from, 0i32);
    while i < b.len() {
        if at(i, depth) {
            return Ok(Some(i));
        }
        match b[i] {
            b'"' => {
                i = string_end(s, i)?;
                continue;
            }
            b'(' | b'[' | b'{' | b'<' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            b'>' if i == 0 || b[i - 1] != b'-' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return Err(format!("unbalanced brackets in `{s}`"));
        }
        i += 1;
    }
    if depth != 0 {
        return Err(format!("unbalanced brackets in `{s}`"));
    }
    Ok(None)
}

/// The index of the bracket that closes the one at `open`.
pub(super) fn close_of(s: &str, open: usize) -> Result<usize, String> {
    let b = s.as_bytes();
    let mut seen = false;
    let found = scan(s, open, |i, depth| {
        let closes = matches!(b[i], b')' | b']' | b'}') || (b[i] == b'>' && b[i - 1] != b'-');
        if seen && depth == 1 && closes {
            return true;
        }
        seen = true;
        false
    });
    // `scan` reports unbalanced text after the closer too; only the closer matters here.
    match found {
        Ok(Some(i)) => Ok(i),
        _ => Err(format!("no closing bracket for the one at {open} in `{s}`")),
    }
}

/// `s` split at its commas outside brackets and strings, each piece trimmed (`""` gives none).
pub(super) fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let mut cuts = Vec::new();
    scan(s, 0, |i, depth| {
        if depth == 0 && s.as_bytes()[i] == b',' {
            cuts.push(i);
        }
        false
    })?;
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for c in cuts {
        out.push(s[start..c].trim());
        start = c + 1;
    }
    out.push(s[start..].trim());
    Ok(out)
}

/// The text of an MLIR string literal (`"..."`, escapes undone).
pub(super) fn string_literal(s: &str) -> Result<String, String> {
    let s = s.trim();
    let inner = s
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .ok_or_else(|| format!("not a string: `{s}`"))?;
    let bytes = unescape_bytes(inner).map_err(|_| format!("a bad escape in `{s}`"))?;
    String::from_utf8(bytes).map_err(|_| format!("not UTF-8: `{s}`"))
}

/// The string literal `s` starts with (escapes undone), and the text after it.
pub(super) fn leading_string(s: &str) -> Result<(String, &str), String> {
    if !s.starts_with('"') {
        return Err(format!("not a string: `{s}`"));
    }
    let end = string_end(s, 0)?;
    Ok((string_literal(&s[..end])?, &s[end..]))
}

/// `@name` or `@"quoted name"`: the name, and the text after it.
pub(super) fn symbol(s: &str) -> Result<(String, &str), String> {
    let s = s.trim_start();
    let rest = s.strip_prefix('@').ok_or_else(|| format!("not a symbol: `{s}`"))?;
    if rest.starts_with('"') {
        return leading_string(rest);
    }
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.')))
        .unwrap_or(rest.len());
    if end == 0 {
        return Err(format!("an empty symbol: `{s}`"));
    }
    Ok((rest[..end].to_owned(), &rest[end..]))
}

/// A value name: `%` and an identifier.
pub(super) fn value_name(s: &str) -> Result<String, String> {
    let s = s.trim();
    let ok = s.len() > 1
        && s.starts_with('%')
        && s[1..].chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'));
    if ok { Ok(s.to_owned()) } else { Err(format!("not a value name: `{s}`")) }
}

/// A comma list of value names (`""` gives none).
pub(super) fn value_names(s: &str) -> Result<Vec<String>, String> {
    split_top(s)?.into_iter().map(value_name).collect()
}

fn dtype(s: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|d| d.mlir_name() == s)
}

/// `8x128xf32` (or a bare element type): dims and element type.
fn shaped(inner: &str, whole: &str) -> Result<(Vec<u64>, DType), String> {
    let mut parts: Vec<&str> = inner.trim().split('x').collect();
    let elem = parts.pop().unwrap_or_default();
    let dtype = dtype(elem).ok_or_else(|| format!("unknown element type in `{whole}`"))?;
    let shape = parts
        .iter()
        .map(|p| {
            p.parse::<u64>()
                .ok()
                .filter(|_| p.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| format!("bad dim `{p}` in `{whole}`"))
        })
        .collect::<Result<_, _>>()?;
    Ok((shape, dtype))
}

/// A Mosaic value type: `index`, a scalar, `vector<...>` or `memref<..., #tpu.memory_space<..>>`.
pub(super) fn parse_type(s: &str) -> Result<MType, String> {
    let s = s.trim();
    if s == "index" {
        return Ok(MType::Index);
    }
    if let Some(d) = dtype(s) {
        return Ok(MType::Scalar(d));
    }
    if let Some(inner) = s.strip_prefix("vector<").and_then(|r| r.strip_suffix('>')) {
        let (shape, dtype) = shaped(inner, s)?;
        return Ok(MType::Vector { shape, dtype });
    }
    if let Some(inner) = s.strip_prefix("memref<").and_then(|r| r.strip_suffix('>')) {
        let parts = split_top(inner)?;
        let [shape, space] = parts.as_slice() else {
            return Err(format!("a memref without its memory space (or with a layout): `{s}`"));
        };
        let space = match *space {
            "#tpu.memory_space<vmem>" => MemorySpace::Vmem,
            "#tpu.memory_space<smem>" => MemorySpace::Smem,
            other => return Err(format!("unknown memory space `{other}` in `{s}`")),
        };
        let (shape, dtype) = shaped(shape, s)?;
        return Ok(MType::MemRef { shape, dtype, space });
    }
    Err(format!("unknown type `{s}`"))
}

/// A comma list of types (`""` gives none).
pub(super) fn parse_types(s: &str) -> Result<Vec<MType>, String> {
    split_top(s)?.into_iter().map(parse_type).collect()
}

/// A parenthesised type list `(A, B)`, or one type.
fn type_tuple(s: &str) -> Result<Vec<MType>, String> {
    let s = s.trim();
    if s.starts_with('(') {
        if close_of(s, 0)? != s.len() - 1 {
            return Err(format!("text after the type list `{s}`"));
        }
        parse_types(&s[1..s.len() - 1])
    } else {
        Ok(vec![parse_type(s)?])
    }
}

/// A function type `(A, B) -> (C, D)`, `(A) -> C` or `() -> ()`: argument and result types.
pub(super) fn parse_fn_type(s: &str) -> Result<(Vec<MType>, Vec<MType>), String> {
    let s = s.trim();
    if !s.starts_with('(') {
        return Err(format!("not a function type: `{s}`"));
    }
    let close = close_of(s, 0)?;
    let results = s[close + 1..]
        .trim_start()
        .strip_prefix("->")
        .ok_or_else(|| format!("no `->` in the function type `{s}`"))?;
    Ok((parse_types(&s[1..close])?, type_tuple(results)?))
}

/// An attribute dictionary, in print order, values as their text.
#[derive(Clone, Debug, Default)]
pub(super) struct Attrs(Vec<(String, String)>);

impl Attrs {
    /// `{key = value, ...}`, braces included; a key without `= value` is a unit attribute.
    pub fn parse(s: &str) -> Result<Attrs, String> {
        let s = s.trim();
        let inner = s
            .strip_prefix('{')
            .and_then(|r| r.strip_suffix('}'))
            .ok_or_else(|| format!("not an attribute dictionary: `{s}`"))?;
        let mut out = Attrs::default();
        for item in split_top(inner)? {
            let (key, value) = item.split_once(" = ").unwrap_or((item, "unit"));
            let key = key.trim();
            let bare = !key.is_empty()
                && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'));
            if !bare {
                return Err(format!("a bad attribute name `{key}`"));
            }
            out.insert(key, value.trim())?;
        }
        Ok(out)
    }

    pub fn insert(&mut self, key: &str, value: &str) -> Result<(), String> {
        if self.0.iter().any(|(k, _)| k == key) {
            return Err(format!("attribute `{key}` given twice"));
        }
        self.0.push((key.to_owned(), value.to_owned()));
        Ok(())
    }

    pub fn has(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k == key)
    }

    /// Removes and returns attribute `key`.
    pub fn take(&mut self, key: &str) -> Option<String> {
        let i = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(i).1)
    }

    /// [`Attrs::take`], for an attribute `owner` cannot go without.
    pub fn require(&mut self, key: &str, owner: &str) -> Result<String, String> {
        self.take(key).ok_or_else(|| format!("`{owner}` without its `{key}` attribute"))
    }

    /// Refuses the attributes nothing took: the interpreter does not know what they mean.
    pub fn finish(self, owner: &str) -> Result<(), String> {
        match self.0.first() {
            None => Ok(()),
            Some((k, v)) => Err(format!(
                "`{owner}` has attribute `{k} = {v}`, which the interpreter does not read"
            )),
        }
    }
}

/// `15 : i64` (an integer of type `ty`).
pub(super) fn int_attr(v: &str, ty: &str) -> Result<i64, String> {
    let (n, t) = v.rsplit_once(" : ").ok_or_else(|| format!("not a typed integer: `{v}`"))?;
    if t.trim() != ty {
        return Err(format!("`{v}` is not an {ty}"));
    }
    n.trim().parse().map_err(|_| format!("not an integer: `{v}`"))
}

/// `true` or `false`.
pub(super) fn bool_attr(v: &str) -> Result<bool, String> {
    match v.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("not a bool: `{other}`")),
    }
}

/// `array<i64: 1, 2>` or `array<i32>` of element type `elem`.
pub(super) fn dense_array(v: &str, elem: &str) -> Result<Vec<i64>, String> {
    let v = v.trim();
    let inner = v
        .strip_prefix("array<")
        .and_then(|r| r.strip_suffix('>'))
        .ok_or_else(|| format!("not a dense array: `{v}`"))?;
    let (t, items) = inner.split_once(':').unwrap_or((inner, ""));
    if t.trim() != elem {
        return Err(format!("`{v}` is not an array of {elem}"));
    }
    split_top(items)?
        .into_iter()
        .map(|i| i.parse::<i64>().map_err(|_| format!("bad integer `{i}` in `{v}`")))
        .collect()
}

/// `[a, b]`: the items' text.
pub(super) fn list_attr(v: &str) -> Result<Vec<&str>, String> {
    let v = v.trim();
    let inner = v
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .ok_or_else(|| format!("not a list: `{v}`"))?;
    split_top(inner)
}

/// `[1, 0]`: a list of integers.
pub(super) fn int_list(v: &str) -> Result<Vec<i64>, String> {
    list_attr(v)?
        .into_iter()
        .map(|i| i.parse::<i64>().map_err(|_| format!("bad integer `{i}` in `{v}`")))
        .collect()
}

/// `#tpu.core_type<tc>` with `prefix` `#tpu.core_type`: `tc`.
pub(super) fn enum_attr<'a>(v: &'a str, prefix: &str) -> Result<&'a str, String> {
    v.trim()
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('<'))
        .and_then(|r| r.strip_suffix('>'))
        .ok_or_else(|| format!("`{v}` is not a `{prefix}<...>`"))
}

/// `@name` and nothing after it.
pub(super) fn symbol_ref(v: &str) -> Result<String, String> {
    let (name, rest) = symbol(v)?;
    if !rest.trim().is_empty() {
        return Err(format!("text after the symbol: `{v}`"));
    }
    Ok(name)
}

/// A typed constant `0 : i32`, `dense<1.000000e+00> : vector<8x128xf32>`, `true : i1`,
/// `0xFF800000 : f32`: its value (one element: constants are splats) and type.
pub(super) fn constant(v: &str) -> Result<(f64, MType), String> {
    let (text, ty) = v.rsplit_once(" : ").ok_or_else(|| format!("not a typed constant: `{v}`"))?;
    let ty = parse_type(ty)?;
    let text = text.trim();
    let dense = text.strip_prefix("dense<").and_then(|r| r.strip_suffix('>'));
    let text = match (&ty, dense) {
        (MType::Vector { .. }, Some(t)) => t.trim(),
        (MType::Scalar(_) | MType::Index, None) => text,
        _ => return Err(format!("a vector constant is `dense<...>`, a scalar one is not: `{v}`")),
    };
    let dtype = ty.dtype();
    let bad = || format!("`{text}` is not a value of type {ty}");
    let x = match dtype {
        Some(DType::Bool) => match text {
            "true" => 1.0,
            "false" => 0.0,
            _ => return Err(bad()),
        },
        Some(d) if d.is_float() => {
            if let Some(hex) = text.strip_prefix("0x") {
                let bits = u64::from_str_radix(hex, 16).map_err(|_| bad())?;
                match d {
                    DType::F32 => {
                        f64::from(f32::from_bits(u32::try_from(bits).map_err(|_| bad())?))
                    }
                    DType::BF16 => {
                        half::bf16::from_bits(u16::try_from(bits).map_err(|_| bad())?).to_f64()
                    }
                    DType::F16 => {
                        half::f16::from_bits(u16::try_from(bits).map_err(|_| bad())?).to_f64()
                    }
                    DType::F64 => f64::from_bits(bits),
                    _ => return Err(bad()),
                }
            } else if text.contains('.') {
                // MLIR refuses a float written as an integer (`1 : f32`).
                text.parse::<f64>().map_err(|_| bad())?
            } else {
                return Err(bad());
            }
        }
        _ => text.parse::<i64>().map_err(|_| bad())? as f64,
    };
    Ok((x, ty))
}
