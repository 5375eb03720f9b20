//! An interpreter of the printed form: it parses a `tpu_custom_call` module back (the StableHLO
//! wrapper, the base64 body, the Mosaic text) and runs the kernel on the CPU with the grid and
//! window semantics of `iteration_bounds`, `window_params` and the transform functions.
//!
//! The CPU twin is lowered from the same kernel description as the text, so it cannot catch a
//! printing bug (a wrong transform function, swapped matmul dimension numbers, a wrong constant):
//! this reads only what was printed. It covers the op subset [`print_kernel`] emits and refuses
//! anything else with the line it cannot read. Values are computed in f64 and rounded to their
//! element type after every op; the MXU's f32 accumulation is an f64 sum rounded once to f32.
//!
//! [`print_kernel`]: super::printer::print_kernel

use std::collections::BTreeMap;

use crate::types::DType;

/// A value while interpreting: a scalar (or `index`) or a vector / memref's elements.
#[derive(Clone, Debug, PartialEq)]
struct Val {
    dtype: Option<DType>,
    shape: Vec<u64>,
    data: Vec<f64>,
}

#[derive(Clone, Debug, PartialEq)]
struct Ty {
    dtype: Option<DType>,
    shape: Vec<u64>,
    memref: bool,
}

fn err<T>(line: &str, what: impl std::fmt::Display) -> Result<T, String> {
    Err(format!("{what}: `{}`", line.trim()))
}

fn parse_dtype(s: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|d| d.mlir_name() == s)
}

fn parse_type(s: &str) -> Result<Ty, String> {
    let s = s.trim().trim_end_matches(',');
    if s == "index" {
        return Ok(Ty { dtype: None, shape: vec![], memref: false });
    }
    if let Some(d) = parse_dtype(s) {
        return Ok(Ty { dtype: Some(d), shape: vec![], memref: false });
    }
    let (memref, inner) = if let Some(r) = s.strip_prefix("vector<") {
        (false, r.strip_suffix('>').unwrap_or(r))
    } else if let Some(r) = s.strip_prefix("memref<") {
        (true, r.split(',').next().unwrap_or(r))
    } else {
        return Err(format!("unknown type `{s}`"));
    };
    let mut parts: Vec<&str> = inner.split('x').collect();
    let elem = parts.pop().unwrap_or_default();
    let dtype = parse_dtype(elem).ok_or_else(|| format!("unknown element type in `{s}`"))?;
    let shape = parts
        .iter()
        .map(|p| p.parse::<u64>().map_err(|_| format!("bad dim in `{s}`")))
        .collect::<Result<_, _>>()?;
    Ok(Ty { dtype: Some(dtype), shape, memref })
}

fn round(x: f64, dtype: Option<DType>) -> f64 {
    match dtype {
        Some(DType::F32) => x as f32 as f64,
        Some(DType::BF16) => half::bf16::from_f64(x).to_f64(),
        Some(DType::F16) => half::f16::from_f64(x).to_f64(),
        Some(DType::I32) | None => (x as i64 as i32) as f64,
        Some(DType::Bool) => {
            if x != 0.0 {
                1.0
            } else {
                0.0
            }
        }
        _ => x,
    }
}

fn decode_base64(s: &str) -> Result<Vec<u8>, String> {
    let value = |c: u8| -> Result<u32, String> {
        Ok(match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return Err(format!("not base64: {:?}", c as char)),
        })
    };
    let bytes = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c)? << (18 - 6 * i);
        }
        let take = chunk.len().saturating_sub(1);
        for i in 0..take {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Ok(out)
}

/// The custom call's operand and result types and its Mosaic body.
struct Wrapper {
    inputs: Vec<Ty>,
    outputs: Vec<Ty>,
    body: String,
}

fn tensor_type(s: &str) -> Result<Ty, String> {
    let inner = s
        .trim()
        .strip_prefix("tensor<")
        .and_then(|r| r.strip_suffix('>'))
        .ok_or_else(|| format!("not a tensor type: `{s}`"))?;
    parse_type(&format!("vector<{inner}>"))
}

fn split_types(s: &str) -> Vec<&str> {
    let s = s.trim();
    let s = s.strip_prefix('(').and_then(|r| r.strip_suffix(')')).unwrap_or(s);
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if !s[start..].trim().is_empty() {
        out.push(s[start..].trim());
    }
    out
}

fn parse_wrapper(module: &str) -> Result<Wrapper, String> {
    let line = module
        .lines()
        .find(|l| l.contains("stablehlo.custom_call @tpu_custom_call"))
        .ok_or("no stablehlo.custom_call @tpu_custom_call in the module")?;
    let config = line
        .split("backend_config = \"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .ok_or_else(|| format!("no backend_config: `{line}`"))?;
    let config = config.replace("\\22", "\"").replace("\\5C", "\\");
    let body = config
        .split("\"body\": \"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .ok_or("no body in the backend_config")?;
    let body = String::from_utf8(decode_base64(body)?)
        .map_err(|e| format!("the body is not UTF-8 text: {e}"))?;
    let signature = line.rsplit(" : ").next().unwrap_or_default();
    let (ins, outs) =
        signature.split_once(" -> ").ok_or_else(|| format!("no function type: `{line}`"))?;
    let inputs = split_types(ins).into_iter().map(tensor_type).collect::<Result<_, _>>()?;
    let outputs = split_types(outs).into_iter().map(tensor_type).collect::<Result<_, _>>()?;
    Ok(Wrapper { inputs, outputs, body })
}

/// The kernel function's header: argument types, grid, windows.
struct Header {
    args: Vec<Ty>,
    grid: Vec<u64>,
    windows: Vec<(String, Vec<u64>)>,
    scratch: usize,
}

fn between<'a>(s: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = s.find(open)? + open.len();
    let end = s[start..].find(close)? + start;
    Some(&s[start..end])
}

fn ints(s: &str) -> Result<Vec<u64>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| p.trim().parse::<u64>().map_err(|_| format!("bad integer `{p}`")))
        .collect()
}

fn parse_header(line: &str) -> Result<Header, String> {
    let params =
        between(line, "(", ") attributes").ok_or_else(|| format!("no parameters: `{line}`"))?;
    let mut args = Vec::new();
    for p in split_types(params) {
        let (_, ty) = p.split_once(": ").ok_or_else(|| format!("bad parameter `{p}`"))?;
        args.push(parse_type(ty)?);
    }
    let grid =
        ints(between(line, "iteration_bounds = array<i64: ", ">").ok_or("no iteration_bounds")?)?;
    let scratch = between(line, "scratch_operands = ", " : i64")
        .ok_or("no scratch_operands")?
        .trim()
        .parse::<usize>()
        .map_err(|e| e.to_string())?;
    let mut windows = Vec::new();
    for w in line.split("{transform_indices = @").skip(1) {
        let name = w.split(',').next().unwrap_or_default().to_owned();
        let bounds =
            ints(between(w, "window_bounds = array<i64: ", ">").ok_or("no window_bounds")?)?;
        windows.push((name, bounds));
    }
    Ok(Header { args, grid, windows, scratch })
}

/// A transform function: block index per dim, from the grid indices.
fn parse_transform(lines: &[&str]) -> Result<Vec<Result<usize, i64>>, String> {
    let mut consts: BTreeMap<String, i64> = BTreeMap::new();
    for l in lines {
        let l = l.trim();
        if let Some((name, rest)) = l.split_once(" = arith.constant ") {
            let v = rest
                .split(':')
                .next()
                .unwrap_or_default()
                .trim()
                .parse::<i64>()
                .map_err(|e| format!("{e}: `{l}`"))?;
            consts.insert(name.trim().to_owned(), v);
        } else if let Some(rest) = l.strip_prefix("return ") {
            let values = rest.split(" : ").next().unwrap_or_default();
            return values
                .split(',')
                .map(|v| {
                    let v = v.trim();
                    if let Some(n) = v.strip_prefix("%arg") {
                        n.parse::<usize>().map(Ok).map_err(|e| format!("{e}: `{l}`"))
                    } else {
                        consts
                            .get(v)
                            .map(|c| Err(*c))
                            .ok_or_else(|| format!("unknown value `{v}` in `{l}`"))
                    }
                })
                .collect();
        } else if !l.is_empty() {
            return err(l, "a transform function takes constants and a return only");
        }
    }
    Err("a transform function without a return".into())
}

struct Machine {
    values: BTreeMap<String, Val>,
    memrefs: BTreeMap<String, Val>,
}

fn operand_names(s: &str) -> Vec<String> {
    s.split(',').map(|p| p.trim().to_owned()).filter(|p| !p.is_empty()).collect()
}

impl Machine {
    fn get(&self, name: &str, line: &str) -> Result<Val, String> {
        self.values
            .get(name)
            .cloned()
            .ok_or_else(|| format!("`{name}` is not defined: `{}`", line.trim()))
    }

    fn elementwise(
        &self,
        line: &str,
        names: &[String],
        ty: &Ty,
        f: impl Fn(&[f64]) -> f64,
    ) -> Result<Val, String> {
        let vals: Vec<Val> = names.iter().map(|n| self.get(n, line)).collect::<Result<_, _>>()?;
        let n = vals.iter().map(|v| v.data.len()).max().unwrap_or(1);
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let args: Vec<f64> = vals
                .iter()
                .map(|v| if v.data.len() == 1 { v.data[0] } else { v.data[i] })
                .collect();
            out.push(round(f(&args), ty.dtype));
        }
        Ok(Val { dtype: ty.dtype, shape: ty.shape.clone(), data: out })
    }

    /// Runs `lines` (a region's ops); `pos` is advanced past the region's closing brace.
    fn run(&mut self, lines: &[&str], pos: &mut usize) -> Result<(), String> {
        while *pos < lines.len() {
            let line = lines[*pos];
            *pos += 1;
            let l = strip_loc(line);
            if l == "}" || l == "return" {
                return Ok(());
            }
            if let Some(rest) = l.strip_prefix("scf.if ") {
                let cond = self.get(rest.trim_end_matches('{').trim(), line)?;
                if cond.data.first().copied().unwrap_or(0.0) != 0.0 {
                    self.run(lines, pos)?;
                } else {
                    let mut depth = 1;
                    while *pos < lines.len() && depth > 0 {
                        let t = strip_loc(lines[*pos]);
                        if t.ends_with('{') {
                            depth += 1;
                        } else if t == "}" {
                            depth -= 1;
                        }
                        *pos += 1;
                    }
                }
                continue;
            }
            if let Some(rest) = l.strip_prefix("tpu.vector_store ") {
                let memref = rest.split('[').next().unwrap_or_default().trim().to_owned();
                let value =
                    between(rest, "], ", " {").ok_or_else(|| format!("bad store: `{l}`"))?;
                let v = self.get(value.trim(), line)?;
                let m = self
                    .memrefs
                    .get_mut(&memref)
                    .ok_or_else(|| format!("`{memref}` is not a memref: `{l}`"))?;
                if m.data.len() != v.data.len() {
                    return err(line, "a store of another size than its memref");
                }
                m.data = v.data.iter().map(|x| round(*x, m.dtype)).collect();
                continue;
            }
            let (result, rhs) = l.split_once(" = ").ok_or_else(|| format!("cannot read `{l}`"))?;
            let (op, rest) = rhs.split_once(' ').unwrap_or((rhs, ""));
            let result_ty = parse_type(rest.rsplit([':', ' ']).next().unwrap_or_default())
                .or_else(|_| parse_type(rest.rsplit(" to ").next().unwrap_or_default()));
            let val = match op {
                "arith.constant" => {
                    let (value, ty) =
                        rest.rsplit_once(" : ").ok_or_else(|| format!("bad constant: `{l}`"))?;
                    let ty = parse_type(ty)?;
                    let text = value
                        .trim()
                        .strip_prefix("dense<")
                        .and_then(|v| v.strip_suffix('>'))
                        .unwrap_or(value.trim());
                    let x = match text {
                        "true" => 1.0,
                        "false" => 0.0,
                        t if t.starts_with("0x") => {
                            let bits = u64::from_str_radix(&t[2..], 16)
                                .map_err(|e| format!("{e}: `{l}`"))?;
                            match ty.dtype {
                                Some(DType::F32) => f64::from(f32::from_bits(bits as u32)),
                                Some(DType::BF16) => half::bf16::from_bits(bits as u16).to_f64(),
                                Some(DType::F16) => half::f16::from_bits(bits as u16).to_f64(),
                                _ => f64::from_bits(bits),
                            }
                        }
                        t => t.parse::<f64>().map_err(|e| format!("{e}: `{l}`"))?,
                    };
                    let n: u64 = ty.shape.iter().product();
                    Val {
                        dtype: ty.dtype,
                        shape: ty.shape.clone(),
                        data: vec![round(x, ty.dtype); n.max(1) as usize],
                    }
                }
                "arith.addf" | "arith.addi" | "arith.subf" | "arith.subi" | "arith.mulf"
                | "arith.muli" | "arith.divf" | "arith.divsi" | "arith.maximumf"
                | "arith.maxsi" | "arith.minimumf" | "arith.minsi" => {
                    let (ops, ty) =
                        rest.rsplit_once(" : ").ok_or_else(|| format!("bad op: `{l}`"))?;
                    let ty = parse_type(ty)?;
                    let f: fn(f64, f64) -> f64 = match op {
                        "arith.addf" | "arith.addi" => |a, b| a + b,
                        "arith.subf" | "arith.subi" => |a, b| a - b,
                        "arith.mulf" | "arith.muli" => |a, b| a * b,
                        "arith.divf" => |a, b| a / b,
                        "arith.divsi" => |a, b| (a / b).trunc(),
                        "arith.maximumf" | "arith.maxsi" => f64::max,
                        _ => f64::min,
                    };
                    self.elementwise(line, &operand_names(ops), &ty, |a| f(a[0], a[1]))?
                }
                "arith.negf" | "math.exp" | "math.log" | "math.tanh" | "math.rsqrt"
                | "math.sqrt" | "math.absf" | "math.erf" => {
                    let (ops, ty) =
                        rest.rsplit_once(" : ").ok_or_else(|| format!("bad op: `{l}`"))?;
                    let ty = parse_type(ty)?;
                    let f: fn(f64) -> f64 = match op {
                        "arith.negf" => |a| -a,
                        "math.exp" => f64::exp,
                        "math.log" => f64::ln,
                        "math.tanh" => f64::tanh,
                        "math.rsqrt" => |a| 1.0 / a.sqrt(),
                        "math.sqrt" => f64::sqrt,
                        "math.erf" => erf,
                        _ => f64::abs,
                    };
                    self.elementwise(line, &operand_names(ops), &ty, |a| f(a[0]))?
                }
                "arith.cmpi" | "arith.cmpf" => {
                    let (ops, ty) =
                        rest.rsplit_once(" : ").ok_or_else(|| format!("bad compare: `{l}`"))?;
                    let mut names = operand_names(ops);
                    let pred = names.remove(0);
                    let mut ty = parse_type(ty)?;
                    ty.dtype = Some(DType::Bool);
                    let f: fn(f64, f64) -> bool = match pred.as_str() {
                        "eq" | "oeq" => |a, b| a == b,
                        "ne" | "one" => |a, b| a != b,
                        "slt" | "olt" => |a, b| a < b,
                        "sle" | "ole" => |a, b| a <= b,
                        "sgt" | "ogt" => |a, b| a > b,
                        "sge" | "oge" => |a, b| a >= b,
                        other => return err(line, format!("unknown predicate `{other}`")),
                    };
                    self.elementwise(line, &names, &ty, |a| f64::from(u8::from(f(a[0], a[1]))))?
                }
                "arith.select" => {
                    let (ops, ty) =
                        rest.split_once(" : ").ok_or_else(|| format!("bad select: `{l}`"))?;
                    let ty = parse_type(split_types(ty).last().copied().unwrap_or_default())?;
                    self.elementwise(line, &operand_names(ops), &ty, |a| {
                        if a[0] != 0.0 { a[1] } else { a[2] }
                    })?
                }
                "arith.extf" | "arith.truncf" | "arith.index_cast" | "vector.shape_cast"
                | "vector.broadcast" => {
                    let (x, tys) =
                        rest.split_once(" : ").ok_or_else(|| format!("bad cast: `{l}`"))?;
                    let (from, to) =
                        tys.split_once(" to ").ok_or_else(|| format!("bad cast: `{l}`"))?;
                    let (from, to) = (parse_type(from)?, parse_type(to)?);
                    let v = self.get(x.trim(), line)?;
                    if op == "vector.broadcast" {
                        broadcast(&v, &from, &to)
                    } else {
                        Val {
                            dtype: to.dtype,
                            shape: to.shape.clone(),
                            data: v.data.iter().map(|x| round(*x, to.dtype)).collect(),
                        }
                    }
                }
                "vector.load" => {
                    let memref = rest.split('[').next().unwrap_or_default().trim();
                    let m = self
                        .memrefs
                        .get(memref)
                        .ok_or_else(|| format!("`{memref}` is not a memref: `{l}`"))?;
                    Val { dtype: m.dtype, shape: m.shape.clone(), data: m.data.clone() }
                }
                "vector.multi_reduction" => {
                    let kind = between(rest, "<", ">").unwrap_or_default().to_owned();
                    let after = rest.split_once(">, ").map(|(_, r)| r).unwrap_or_default();
                    let (ops_dims, tys) =
                        after.split_once(" : ").ok_or_else(|| format!("bad reduction: `{l}`"))?;
                    let (ops, dims) =
                        ops_dims.split_once(" [").ok_or_else(|| format!("bad reduction: `{l}`"))?;
                    let dims: Vec<usize> =
                        ints(dims.trim_end_matches(']'))?.into_iter().map(|d| d as usize).collect();
                    let names = operand_names(ops);
                    let (x, acc) = (self.get(&names[0], line)?, self.get(&names[1], line)?);
                    let to = parse_type(tys.split(" to ").nth(1).unwrap_or_default())?;
                    reduce(&x, &acc, &dims, &kind, &to).map_err(|e| format!("{e}: `{l}`"))?
                }
                "tpu.matmul" => {
                    let ops = rest.split(" {").next().unwrap_or_default();
                    let names = operand_names(ops);
                    let dims = between(rest, "dot_dimension_numbers<", ">")
                        .ok_or_else(|| format!("no dimension numbers: `{l}`"))?;
                    let (l_, r_, acc) = (
                        self.get(&names[0], line)?,
                        self.get(&names[1], line)?,
                        self.get(&names[2], line)?,
                    );
                    matmul(&l_, &r_, &acc, dims).map_err(|e| format!("{e}: `{l}`"))?
                }
                other => return err(line, format!("the interpreter does not know `{other}`")),
            };
            if let Ok(t) = &result_ty
                && !t.memref
                && t.shape != val.shape
                && !(t.shape.is_empty() && val.data.len() == 1)
            {
                return err(
                    line,
                    format!("the result has shape {:?}, the line says {:?}", val.shape, t.shape),
                );
            }
            self.values.insert(result.trim().to_owned(), val);
        }
        Ok(())
    }
}

/// A line without its trailing `loc(...)` (the source location the printers attach).
/// The error function, to about 1.2e-7 relative (W. J. Cody's rational Chebyshev form as
/// Numerical Recipes gives it, `erfc` with fractional error below 1.2e-7): finer than f32, the
/// widest type the body computes `math.erf` in.
fn erf(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87
                                    + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 { 1.0 - erfc } else { erfc - 1.0 }
}

fn strip_loc(line: &str) -> &str {
    let t = line.trim();
    match t.rfind(" loc(\"") {
        Some(i) if t.ends_with(')') => t[..i].trim_end(),
        _ => t,
    }
}

fn broadcast(v: &Val, from: &Ty, to: &Ty) -> Val {
    let n: u64 = to.shape.iter().product();
    let lead = to.shape.len() - from.shape.len();
    let mut data = Vec::with_capacity(n as usize);
    for flat in 0..n {
        // The source element: each target index, clamped to 0 along size-1 source dims.
        let (mut rem, mut src, mut stride) = (flat, 0u64, 1u64);
        let mut index = vec![0u64; to.shape.len()];
        for d in (0..to.shape.len()).rev() {
            index[d] = rem % to.shape[d];
            rem /= to.shape[d];
        }
        for d in (0..from.shape.len()).rev() {
            let i = if from.shape[d] == 1 { 0 } else { index[d + lead] };
            src += i * stride;
            stride *= from.shape[d];
        }
        data.push(if v.data.len() == 1 { v.data[0] } else { v.data[src as usize] });
    }
    Val { dtype: to.dtype, shape: to.shape.clone(), data }
}

fn reduce(x: &Val, acc: &Val, dims: &[usize], kind: &str, to: &Ty) -> Result<Val, String> {
    let kept: Vec<usize> = (0..x.shape.len()).filter(|d| !dims.contains(d)).collect();
    let mut out = acc.data.clone();
    for (flat, v) in x.data.iter().enumerate() {
        let mut rem = flat as u64;
        let mut index = vec![0u64; x.shape.len()];
        for d in (0..x.shape.len()).rev() {
            index[d] = rem % x.shape[d];
            rem /= x.shape[d];
        }
        let mut o = 0u64;
        for d in &kept {
            o = o * x.shape[*d] + index[*d];
        }
        let slot = &mut out[o as usize];
        *slot = match kind {
            "add" => *slot + v,
            "maximumf" | "maxsi" => slot.max(*v),
            other => return Err(format!("unknown combiner `{other}`")),
        };
    }
    Ok(Val {
        dtype: to.dtype,
        shape: to.shape.clone(),
        data: out.into_iter().map(|v| round(v, to.dtype)).collect(),
    })
}

fn matmul(l: &Val, r: &Val, acc: &Val, dims: &str) -> Result<Val, String> {
    let transposed = match dims.replace(' ', "").as_str() {
        "[1],[0],[0],[1],[0,0,1,1],[],[]" => false,
        "[1],[1],[0],[0],[0,0,1,0],[],[]" => true,
        other => return Err(format!("dimension numbers <{other}> are not a 2-d product")),
    };
    let (m, k) = (l.shape[0] as usize, l.shape[1] as usize);
    let n = if transposed { r.shape[0] as usize } else { r.shape[1] as usize };
    let kr = if transposed { r.shape[1] } else { r.shape[0] } as usize;
    if kr != k {
        return Err(format!("contracting dims differ: {k} and {kr}"));
    }
    let mut out = acc.data.clone();
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                let rv = if transposed { r.data[j * k + p] } else { r.data[p * n + j] };
                s += l.data[i * k + p] * rv;
            }
            out[i * n + j] = round(out[i * n + j] + s, Some(DType::F32));
        }
    }
    Ok(Val { dtype: Some(DType::F32), shape: vec![m as u64, n as u64], data: out })
}

fn strides(shape: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Copies the block at element offset `at` of `array` (row-major, `shape`) out, or back in.
fn block_copy(
    array: &mut [f64],
    shape: &[u64],
    block: &mut [f64],
    bshape: &[u64],
    at: &[u64],
    write: bool,
) {
    let (sa, sb) = (strides(shape), strides(bshape));
    let n: u64 = bshape.iter().product();
    for flat in 0..n {
        let mut a = 0u64;
        for d in 0..bshape.len() {
            a += (at[d] + (flat / sb[d]) % bshape[d]) * sa[d];
        }
        if write {
            array[a as usize] = block[flat as usize];
        } else {
            block[flat as usize] = array[a as usize];
        }
    }
}

/// Runs the `tpu_custom_call` of `module` (as [`custom_call_module`] prints it) on `inputs`
/// (row-major, one per operand, as f64); returns the outputs. Outputs and scratch start as NaN,
/// as in interpret mode.
///
/// [`custom_call_module`]: super::wrap::custom_call_module
pub fn interpret(module: &str, inputs: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, String> {
    let w = parse_wrapper(module)?;
    if inputs.len() != w.inputs.len() {
        return Err(format!("the call takes {} inputs, {} given", w.inputs.len(), inputs.len()));
    }
    let lines: Vec<&str> = w.body.lines().collect();
    let kernel_line = lines
        .iter()
        .position(|l| l.contains("tpu.core_type"))
        .ok_or("no kernel function in the body")?;
    let header = parse_header(lines[kernel_line])?;
    let mut transforms = BTreeMap::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(name) =
            lines[i].trim().strip_prefix("func.func @").and_then(|r| r.split('(').next())
            && name.starts_with("transform")
        {
            let end = (i..lines.len()).find(|j| lines[*j].trim() == "}").unwrap_or(lines.len());
            transforms.insert(name.to_owned(), parse_transform(&lines[i + 1..end])?);
            i = end;
        }
        i += 1;
    }
    let arrays: Vec<&Ty> = w.inputs.iter().chain(&w.outputs).collect();
    if header.windows.len() != arrays.len() {
        return Err(format!(
            "{} windows for {} operands and results",
            header.windows.len(),
            arrays.len()
        ));
    }
    let mut data: Vec<Vec<f64>> = inputs.to_vec();
    for o in &w.outputs {
        let n: u64 = o.shape.iter().product();
        data.push(vec![f64::NAN; n as usize]);
    }
    let g = header.grid.len();
    let mut scratch: Vec<Val> = header.args[g + arrays.len()..]
        .iter()
        .map(|t| Val {
            dtype: t.dtype,
            shape: t.shape.clone(),
            data: vec![f64::NAN; t.shape.iter().product::<u64>() as usize],
        })
        .collect();
    if scratch.len() != header.scratch {
        return Err(format!(
            "scratch_operands = {} but {} scratch arguments",
            header.scratch,
            scratch.len()
        ));
    }
    let steps: u64 = header.grid.iter().product();
    let mut point = vec![0u64; g];
    for _ in 0..steps {
        let mut m = Machine { values: BTreeMap::new(), memrefs: BTreeMap::new() };
        for (a, p) in point.iter().enumerate() {
            m.values.insert(
                format!("%arg{a}"),
                Val { dtype: Some(DType::I32), shape: vec![], data: vec![*p as f64] },
            );
        }
        let mut offsets = Vec::new();
        for (wi, ((name, bounds), array)) in header.windows.iter().zip(&arrays).enumerate() {
            let map =
                transforms.get(name).ok_or_else(|| format!("no transform function @{name}"))?;
            let at: Vec<u64> = map
                .iter()
                .zip(bounds)
                .map(|(e, b)| match e {
                    Ok(axis) => point.get(*axis).copied().unwrap_or(0) * b,
                    Err(c) => (*c as u64) * b,
                })
                .collect();
            if at.iter().zip(bounds).zip(&array.shape).any(|((o, b), d)| o + b > *d) {
                return Err(format!(
                    "window {wi} at grid point {point:?} leaves its array ({:?} + {bounds:?} > {:?})",
                    at, array.shape
                ));
            }
            let mut block = vec![0.0; bounds.iter().product::<u64>() as usize];
            block_copy(&mut data[wi], &array.shape, &mut block, bounds, &at, false);
            m.memrefs.insert(
                format!("%arg{}", g + wi),
                Val { dtype: array.dtype, shape: bounds.clone(), data: block },
            );
            offsets.push(at);
        }
        for (s, v) in scratch.iter().enumerate() {
            m.memrefs.insert(format!("%arg{}", g + arrays.len() + s), v.clone());
        }
        let mut pos = kernel_line + 1;
        m.run(&lines, &mut pos)?;
        for (wi, ((_, bounds), array)) in
            header.windows.iter().zip(&arrays).enumerate().skip(w.inputs.len())
        {
            let mut block = m.memrefs[&format!("%arg{}", g + wi)].data.clone();
            block_copy(&mut data[wi], &array.shape, &mut block, bounds, &offsets[wi], true);
        }
        for (s, v) in scratch.iter_mut().enumerate() {
            *v = m.memrefs[&format!("%arg{}", g + arrays.len() + s)].clone();
        }
        for axis in (0..g).rev() {
            point[axis] += 1;
            if point[axis] < header.grid[axis] {
                break;
            }
            point[axis] = 0;
        }
    }
    Ok(data.split_off(w.inputs.len()))
}

#[cfg(test)]
mod tests {
    use super::decode_base64;
    use crate::mosaic::wrap::base64;

    #[test]
    fn base64_round_trips() {
        for s in ["", "f", "fo", "foo", "foob", "fooba", "foobar", "module {\n}\n"] {
            assert_eq!(decode_base64(&base64(s.as_bytes())).unwrap(), s.as_bytes());
        }
    }
}
