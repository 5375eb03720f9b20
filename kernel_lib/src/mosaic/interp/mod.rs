//! An interpreter of the printed kernel: it parses a `tpu_custom_call` module back (the
//! StableHLO wrapper, the base64 body, the Mosaic text) and runs the kernel on the CPU with the
//! grid and window semantics of `iteration_bounds`, `window_params` and the transform functions.
//!
//! It reads both printed forms: the shipped one ([`print_kernel_serialized`]: the
//! `stable_mosaic` serialization in generic syntax, `serialization_format: 1` in the
//! backend_config), which is what libtpu is given, and the readable one ([`print_kernel`]: the
//! pretty form, no `serialization_format`). The form is read from the backend_config and must
//! agree with the body's first line (libtpu refuses either form under the other's config).
//!
//! The CPU twin is lowered from the same kernel description as the text, so it cannot catch a
//! printing bug (a wrong transform function, swapped matmul dimension numbers, a wrong constant,
//! a wrong window): this reads only what was printed. The two forms differ in spelling, not in
//! meaning, so each has its own reader (`readable`, `shipped`) into one generic op record,
//! and everything after that is shared (`ops`: what each op means and the checks MLIR's
//! verifiers would make; `exec`: running it). The op subset is what the printers emit; anything
//! else is refused with the line that cannot be read. Values are computed in f64 and rounded to
//! their element type after every op; the MXU's f32 accumulation is an f64 sum rounded once to
//! f32.
//!
//! [`print_kernel`]: super::printer::print_kernel
//! [`print_kernel_serialized`]: super::serialized::print_kernel_serialized

mod exec;
mod ops;
mod readable;
mod shipped;
mod text;

use std::collections::BTreeMap;

use crate::types::DType;

use super::types::MType;
use super::wrap::Form;
use exec::{Env, Val, read_block, write_block};
use ops::{Func, ModuleText, normalise};
use text::{
    Attrs, dense_array, enum_attr, int_attr, leading_string, list_attr, parse_type, split_top,
    strip_loc, symbol_ref,
};

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

/// The custom call: its operand and result arrays (shape, element type), the
/// `(operand, result)` pairs that are one buffer, the backend_config's
/// `serialization_format` and the Mosaic body.
struct Call {
    inputs: Vec<(Vec<u64>, DType)>,
    outputs: Vec<(Vec<u64>, DType)>,
    aliases: Vec<(usize, usize)>,
    format: Option<i64>,
    body: String,
}

fn tensor_type(s: &str) -> Result<(Vec<u64>, DType), String> {
    let inner = s
        .trim()
        .strip_prefix("tensor<")
        .and_then(|r| r.strip_suffix('>'))
        .ok_or_else(|| format!("not a tensor type: `{s}`"))?;
    match parse_type(&format!("vector<{inner}>"))? {
        MType::Vector { shape, dtype } => Ok((shape, dtype)),
        _ => Err(format!("not a tensor type: `{s}`")),
    }
}

fn tensor_types(s: &str) -> Result<Vec<(Vec<u64>, DType)>, String> {
    let s = s.trim();
    let s = s.strip_prefix('(').and_then(|r| r.strip_suffix(')')).unwrap_or(s);
    split_top(s)?.into_iter().map(tensor_type).collect()
}

/// `output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [k],
/// operand_index = i, operand_tuple_indices = []>, ...]`: the `(i, k)` pairs (`k` is 0 for a
/// single result, whose tuple indices are `[]`).
fn aliases(line: &str) -> Result<Vec<(usize, usize)>, String> {
    let Some((_, rest)) = line.split_once("output_operand_aliases = ") else {
        return Ok(Vec::new());
    };
    let list = &rest[..=text::close_of(rest, 0)?];
    let mut out = Vec::new();
    for item in list_attr(list)? {
        let inner = enum_attr(item, "#stablehlo.output_operand_alias")?;
        let mut a = Attrs::parse(&format!("{{{inner}}}"))?;
        let index = |v: Option<String>, what: &str| -> Result<Vec<i64>, String> {
            text::int_list(&v.ok_or_else(|| format!("an alias without {what}: `{item}`"))?)
        };
        let output = index(a.take("output_tuple_indices"), "output_tuple_indices")?;
        let operand =
            a.take("operand_index").ok_or_else(|| format!("no operand_index: `{item}`"))?;
        let operand =
            operand.parse::<usize>().map_err(|_| format!("bad operand_index: `{item}`"))?;
        if !index(a.take("operand_tuple_indices"), "operand_tuple_indices")?.is_empty() {
            return Err(format!("a tuple operand: `{item}`"));
        }
        a.finish("an output_operand_alias")?;
        let output = match output[..] {
            [] => 0,
            [k] => usize::try_from(k).map_err(|_| format!("bad output index: `{item}`"))?,
            _ => return Err(format!("a nested output tuple: `{item}`")),
        };
        out.push((operand, output));
    }
    Ok(out)
}

fn parse_call(module: &str) -> Result<Call, String> {
    let line = module
        .lines()
        .find(|l| l.contains("stablehlo.custom_call @tpu_custom_call"))
        .ok_or("no stablehlo.custom_call @tpu_custom_call in the module")?;
    let line = strip_loc(line);
    let bad = |what: &str| format!("{what}: `{line}`");
    let config = line.split_once("backend_config = ").ok_or_else(|| bad("no backend_config"))?.1;
    let (config, _) = leading_string(config).map_err(|e| bad(&e))?;
    let body = config
        .split_once("\"body\": \"")
        .and_then(|(_, r)| r.split('"').next())
        .ok_or("no body in the backend_config")?;
    let body = String::from_utf8(decode_base64(body)?)
        .map_err(|e| format!("the body is not UTF-8 text: {e}"))?;
    let format = match config.split_once("\"serialization_format\":") {
        None => None,
        Some((_, r)) => {
            let digits: String =
                r.trim_start().chars().take_while(|c| c.is_ascii_digit() || *c == '-').collect();
            Some(digits.parse::<i64>().map_err(|_| bad("a bad serialization_format"))?)
        }
    };
    let signature = line.rsplit_once(" : ").ok_or_else(|| bad("no function type"))?.1;
    let (ins, outs) = signature.split_once(" -> ").ok_or_else(|| bad("no function type"))?;
    let (inputs, outputs) = (tensor_types(ins)?, tensor_types(outs)?);
    let aliases = aliases(line).map_err(|e| bad(&e))?;
    for (i, o) in &aliases {
        if inputs.get(*i).is_none() || inputs.get(*i) != outputs.get(*o) {
            return Err(bad(&format!("operand {i} and result {o} alias, but differ in type")));
        }
    }
    Ok(Call { inputs, outputs, aliases, format, body })
}

/// The form the backend_config says the body is in, checked against the body.
fn form(call: &Call) -> Result<Form, String> {
    let said = match call.format {
        None => Form::Readable,
        Some(1) => Form::Shipped,
        Some(n) => {
            return Err(format!(
                "serialization_format {n}: libtpu reads 1 (the stable_mosaic serialization) or \
                 none (the readable form)"
            ));
        }
    };
    let first = call.body.lines().map(strip_loc).find(|l| !l.is_empty()).unwrap_or_default();
    let is = if first.starts_with("\"builtin.module\"") {
        Form::Shipped
    } else if first.starts_with("module") {
        Form::Readable
    } else {
        return Err(format!("the body is in neither printed form: `{first}`"));
    };
    match (said, is) {
        (Form::Shipped, Form::Readable) => {
            Err("the backend_config says serialization_format 1 but the body is the readable form \
             (libtpu: Operation not in a serialized form)"
                .into())
        }
        (Form::Readable, Form::Shipped) => {
            Err("the body is in generic syntax but the backend_config has no serialization_format \
             (libtpu would parse it as a plain Mosaic module and find no kernel)"
                .into())
        }
        _ => Ok(is),
    }
}

/// One window of the kernel: its transform function, block and array.
struct Window {
    transform: String,
    bounds: Vec<u64>,
    array: Vec<u64>,
}

/// The kernel function and what its attributes say.
struct Kernel {
    func: Func,
    grid: Vec<u64>,
    /// How many of the call's operands are scalar-prefetch tables (the first ones).
    prefetch: usize,
    windows: Vec<Window>,
    scratch: Vec<MType>,
}

/// Reads the kernel's attributes and checks its parameters and transform functions against
/// them and the custom call's arrays.
fn kernel(
    mut func: Func,
    transforms: &BTreeMap<String, Func>,
    call: &Call,
) -> Result<Kernel, String> {
    let at = func.at.clone();
    let e = |what: String| at.error(format!("@{}: {what}", func.name));
    let mut a = std::mem::take(&mut func.attrs);
    let mut req = |key: &str| a.require(key, "the kernel function").map_err(e);
    let core = req("tpu.core_type")?;
    if enum_attr(&core, "#tpu.core_type").map_err(e)? != "tc" {
        return Err(e(format!("core type `{core}`: only the TensorCore (`tc`) is read")));
    }
    let grid = dense_array(&req("iteration_bounds")?, "i64").map_err(e)?;
    let grid: Vec<u64> = grid
        .iter()
        .map(|d| u64::try_from(*d).map_err(|_| e(format!("iteration bounds {grid:?}"))))
        .collect::<Result<_, _>>()?;
    let semantics = req("dimension_semantics")?;
    let semantics = list_attr(&semantics).map_err(e)?;
    for s in &semantics {
        let s = enum_attr(s, "#tpu.dimension_semantics").map_err(e)?;
        if s != "parallel" && s != "arbitrary" {
            return Err(e(format!("dimension semantics `{s}`")));
        }
    }
    if semantics.len() != grid.len() {
        return Err(e(format!(
            "{} dimension_semantics for {} grid axes",
            semantics.len(),
            grid.len()
        )));
    }
    let prefetch = int_attr(&req("scalar_prefetch")?, "i64").map_err(e)?;
    let prefetch =
        usize::try_from(prefetch).ok().filter(|p| *p <= call.inputs.len()).ok_or_else(|| {
            e(format!("{prefetch} scalar-prefetch operands of {}", call.inputs.len()))
        })?;
    let scratch = int_attr(&req("scratch_operands")?, "i64").map_err(e)?;
    let params = req("window_params")?;
    let mut windows = Vec::new();
    // Prefetch operands have no window: the windows are the other operands, then the results.
    let arrays: Vec<&(Vec<u64>, DType)> =
        call.inputs[prefetch..].iter().chain(&call.outputs).collect();
    for (wi, item) in list_attr(&params).map_err(e)?.into_iter().enumerate() {
        let mut w = Attrs::parse(item).map_err(e)?;
        let transform =
            symbol_ref(&w.require("transform_indices", "a window").map_err(e)?).map_err(e)?;
        let bounds = dense_array(&w.require("window_bounds", "a window").map_err(e)?, "i64")
            .map_err(e)?
            .into_iter()
            .map(|b| u64::try_from(b).map_err(|_| e(format!("window {wi}'s bounds"))))
            .collect::<Result<Vec<u64>, _>>()?;
        w.finish("a window_params entry").map_err(e)?;
        let Some((array, _)) = arrays.get(wi) else {
            return Err(e(format!("window {wi} but {} operands and results", arrays.len())));
        };
        windows.push(Window { transform, bounds, array: array.clone() });
    }
    a.finish("the kernel function").map_err(e)?;
    if windows.len() != arrays.len() {
        return Err(e(format!(
            "{} windows for {} operands and results",
            windows.len(),
            arrays.len()
        )));
    }
    let (g, p, nw) = (grid.len(), prefetch, windows.len());
    let scratch = usize::try_from(scratch).map_err(|_| e(format!("{scratch} scratch operands")))?;
    if func.args.len() != g + p + nw + scratch || !func.results.is_empty() {
        return Err(e(format!(
            "{} parameters and {} results, not {g} grid indices, {p} prefetch tables, {nw} \
             windows and {scratch} scratch buffers",
            func.args.len(),
            func.results.len()
        )));
    }
    for (name, ty) in &func.args[..g] {
        if *ty != MType::Scalar(DType::I32) {
            return Err(e(format!("grid index {name} has type {ty}, not i32")));
        }
    }
    for (t, (name, ty)) in func.args[g..g + p].iter().enumerate() {
        let (shape, dtype) = &call.inputs[t];
        if *ty != MType::smem(*dtype, shape) {
            return Err(e(format!(
                "scalar-prefetch table {t} is a {shape:?} {dtype} operand, but {name} is {ty}, \
                 not its SMEM memref"
            )));
        }
    }
    let transform_params: Vec<&MType> = func.args[..g + p].iter().map(|(_, t)| t).collect();
    for (wi, (w, (name, ty))) in windows.iter().zip(&func.args[g + p..g + p + nw]).enumerate() {
        let dtype = arrays[wi].1;
        let ok = ty.is_memref() && ty.shape() == w.bounds && ty.dtype() == Some(dtype);
        if !ok || w.bounds.len() != w.array.len() {
            return Err(e(format!(
                "window {wi} is a {:?} block of a {:?} {dtype} array, but its memref {name} \
                 is {ty}",
                w.bounds, w.array
            )));
        }
        let t = transforms
            .get(&w.transform)
            .ok_or_else(|| e(format!("window {wi}'s transform @{} is not defined", w.transform)))?;
        let takes_grid = t.args.iter().map(|(_, t)| t).eq(transform_params.iter().copied());
        let gives_block = t.results.len() == w.bounds.len()
            && t.results.iter().all(|t| *t == MType::Scalar(DType::I32));
        if !takes_grid || !gives_block {
            return t.at.fail(format!(
                "@{} takes the {g} grid indices (i32) and the {p} prefetch tables, and returns \
                 {} block indices (i32)",
                t.name,
                w.bounds.len()
            ));
        }
    }
    let scratch = func.args[g + p + nw..].iter().map(|(_, t)| t.clone()).collect::<Vec<_>>();
    if let Some(t) = scratch.iter().find(|t| !t.is_memref()) {
        return Err(e(format!("a scratch operand of type {t}")));
    }
    Ok(Kernel { func, grid, prefetch, windows, scratch })
}

/// The functions of `text`, checked: the kernel (the one with `tpu.core_type`) and the others by
/// name.
fn functions(text: ModuleText) -> Result<(Func, BTreeMap<String, Func>), String> {
    let mut kernel = None;
    let mut others = BTreeMap::new();
    for f in text.funcs {
        let f = normalise(f)?;
        if f.attrs.has("tpu.core_type") {
            if kernel.is_some() {
                return f.at.fail("a second kernel function");
            }
            kernel = Some(f);
        } else {
            let mut f = f;
            let at = f.at.clone();
            std::mem::take(&mut f.attrs)
                .finish(&format!("@{}", f.name))
                .map_err(|e| at.error(e))?;
            if let Some(old) = others.insert(f.name.clone(), f) {
                return old.at.fail(format!("@{} is defined twice", old.name));
            }
        }
    }
    Ok((kernel.ok_or("no kernel function (one with `tpu.core_type`) in the body")?, others))
}

fn i32_val(x: u64) -> Val {
    Val { ty: MType::Scalar(DType::I32), data: vec![x as f64] }
}

/// Runs the `tpu_custom_call` of `module` (as [`custom_call_module_for`] prints it, in either
/// form) on `inputs` (row-major, one per operand, as f64); returns the outputs. Outputs and
/// scratch start as NaN, as in interpret mode, but for an output that aliases an input
/// (`output_operand_aliases`), which starts as that input.
///
/// [`custom_call_module_for`]: super::wrap::custom_call_module_for
pub fn interpret(module: &str, inputs: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, String> {
    let call = parse_call(module)?;
    if inputs.len() != call.inputs.len() {
        return Err(format!("the call takes {} inputs, {} given", call.inputs.len(), inputs.len()));
    }
    for (i, (x, (shape, dtype))) in inputs.iter().zip(&call.inputs).enumerate() {
        let n = shape.iter().product::<u64>() as usize;
        if x.len() != n {
            return Err(format!(
                "input {i} has {} values; its type {shape:?} {dtype} has {n}",
                x.len()
            ));
        }
    }
    let text = match form(&call)? {
        Form::Readable => readable::parse(&call.body)?,
        Form::Shipped => shipped::parse(&call.body)?,
    };
    let (func, transforms) = functions(text)?;
    let k = kernel(func, &transforms, &call)?;
    let (g, p, nw) = (k.grid.len(), k.prefetch, k.windows.len());
    // `data` holds every operand, then every result; window `wi` is `data[p + wi]`, and the
    // input windows end at `ni`.
    let ni = call.inputs.len() - p;
    // Outputs start as NaN (interpret mode's "uninitialised"), or as the input they alias.
    let mut data: Vec<Vec<f64>> = inputs.to_vec();
    for (o, (shape, _)) in call.outputs.iter().enumerate() {
        match call.aliases.iter().find(|(_, out)| *out == o) {
            Some((i, _)) => data.push(inputs[*i].clone()),
            None => data.push(vec![f64::NAN; shape.iter().product::<u64>() as usize]),
        }
    }
    let mut scratch: Vec<Val> = k
        .scratch
        .iter()
        .map(|t| Val {
            ty: t.clone(),
            data: vec![f64::NAN; t.shape().iter().product::<u64>() as usize],
        })
        .collect();
    let args = &k.func.args;
    let tables: Vec<Val> = args[g..g + p]
        .iter()
        .zip(inputs)
        .map(|((_, ty), data)| Val { ty: ty.clone(), data: data.clone() })
        .collect();
    let steps: u64 = k.grid.iter().product();
    let mut point = vec![0u64; g];
    for _ in 0..steps {
        let mut env = Env::new();
        for ((name, _), x) in args.iter().zip(&point) {
            env.insert(name.clone(), i32_val(*x));
        }
        for ((name, _), table) in args[g..].iter().zip(&tables) {
            env.insert(name.clone(), table.clone());
        }
        let mut offsets = Vec::with_capacity(nw);
        for (wi, w) in k.windows.iter().enumerate() {
            let t = &transforms[&w.transform];
            let mut tenv: Env =
                t.args.iter().zip(&point).map(|((n, _), x)| (n.clone(), i32_val(*x))).collect();
            for ((name, _), table) in t.args[g..].iter().zip(&tables) {
                tenv.insert(name.clone(), table.clone());
            }
            let index = exec::run(&mut tenv, &t.body)?.unwrap_or_default();
            let index: Vec<i64> = index.iter().map(|v| v.data[0] as i64).collect();
            let at: Vec<u64> =
                index.iter().zip(&w.bounds).map(|(i, b)| (*i).max(0) as u64 * b).collect();
            let leaves = index.iter().any(|i| *i < 0)
                || at.iter().zip(&w.bounds).zip(&w.array).any(|((o, b), d)| o + b > *d);
            if leaves {
                return t.at.fail(format!(
                    "window {wi} (@{}) at grid point {point:?} is block {index:?} of {:?}, \
                     which leaves its {:?} array",
                    w.transform, w.bounds, w.array
                ));
            }
            let (name, ty) = &args[g + p + wi];
            let block = read_block(&data[p + wi], &w.array, &w.bounds, &at);
            env.insert(name.clone(), Val { ty: ty.clone(), data: block });
            offsets.push(at);
        }
        for ((name, _), v) in args[g + p + nw..].iter().zip(&mut scratch) {
            env.insert(
                name.clone(),
                std::mem::replace(v, Val { ty: MType::Index, data: Vec::new() }),
            );
        }
        exec::run(&mut env, &k.func.body)?;
        for wi in ni..nw {
            let (name, _) = &args[g + p + wi];
            let block = env.remove(name).map(|v| v.data).unwrap_or_default();
            write_block(
                &mut data[p + wi],
                &k.windows[wi].array,
                &block,
                &k.windows[wi].bounds,
                &offsets[wi],
            );
        }
        for ((name, _), v) in args[g + p + nw..].iter().zip(&mut scratch) {
            if let Some(s) = env.remove(name) {
                *v = s;
            }
        }
        for axis in (0..g).rev() {
            point[axis] += 1;
            if point[axis] < k.grid[axis] {
                break;
            }
            point[axis] = 0;
        }
    }
    Ok(data.split_off(p + ni))
}

#[cfg(test)]
mod tests;
