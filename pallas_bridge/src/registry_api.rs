//! The registry from Python: list, select, register and remove imported kernels.
//!
//! One registry per process ([`Registry::global`]): kernels linked into Rust binaries and
//! kernels registered from Python live in the same index and compete under the same rules.

use std::sync::{Arc, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{PyAny, PyBool, PyDict, PyFloat, PyInt, PyString, PyTuple};
use tpu_kernels::reader;
use tpu_kernels::registration::{
    CacheKey, Guard, KernelSignature, Platform, StaticKind, StaticParam, StaticValue,
};
use tpu_kernels::{BuildError, DType, Dim, ErrorKind, KernelRegistration, Module, TensorType};
use tpu_kernels_registry::index::platform_from_name;
use tpu_kernels_registry::{CallMeta, Kernel, KernelSource, Registry};

use crate::errors::raise;
use crate::intern;
use crate::runtime::specialisers;

/// The process registry, or the Python error of building it.
pub fn global(py: Python<'_>) -> PyResult<&'static Registry> {
    Registry::global().map_err(|e| raise(py, "RegistrationError", e.to_string()))
}

/// The kernel registered under `name`; `NoKernelError` naming it otherwise.
pub fn kernel_named(py: Python<'_>, name: &str) -> PyResult<Arc<Kernel>> {
    global(py)?
        .index()
        .kernel(name)
        .cloned()
        .ok_or_else(|| raise(py, "NoKernelError", format!("no kernel named `{name}`")))
}

/// The `build` function of every imported record: imported kernels have no Rust builder.
fn imported_has_no_builder(sig: &KernelSignature) -> Result<Module, BuildError> {
    Err(BuildError {
        kernel: "<imported>".to_owned(),
        op: "emit",
        kind: ErrorKind::Symbol,
        message: format!(
            "this kernel is imported (pre-lowered StableHLO registered at runtime) and has no \
             Rust builder; the registry serves its module text (asked for {})",
            sig.label()
        ),
    })
}

/// Parses `f32[8,128], bf16[B,128]` into tensor types.
pub fn parse_types(text: &str) -> Result<Vec<TensorType>, String> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(TensorType::parse_short(&text[start..i])?);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !text[start..].trim().is_empty() {
        out.push(TensorType::parse_short(&text[start..])?);
    }
    Ok(out)
}

pub fn platform(py: Python<'_>, name: &str) -> PyResult<Platform> {
    platform_from_name(name).ok_or_else(|| {
        raise(py, "RegistrationError", format!("unknown platform `{name}` (cpu, tpu, cuda)"))
    })
}

/// A Python value as a static argument.
pub fn static_value(py: Python<'_>, name: &str, v: &Bound<'_, PyAny>) -> PyResult<StaticValue> {
    if v.is_instance_of::<PyBool>() {
        Ok(StaticValue::Bool(v.extract()?))
    } else if v.is_instance_of::<PyInt>() {
        Ok(StaticValue::Int(v.extract()?))
    } else if v.is_instance_of::<PyFloat>() {
        Ok(StaticValue::Float(v.extract()?))
    } else if v.is_instance_of::<PyString>() {
        Ok(StaticValue::Str(v.extract()?))
    } else {
        Err(raise(
            py,
            "SignatureMismatchError",
            format!(
                "static argument `{name}` must be a bool, int, float or str, got {}",
                v.get_type()
            ),
        ))
    }
}

/// Static arguments from a Python dict, names interned.
pub fn statics_of(
    py: Python<'_>,
    statics: Option<&Bound<'_, PyDict>>,
) -> PyResult<Vec<(&'static str, StaticValue)>> {
    let mut out = Vec::new();
    if let Some(d) = statics {
        for (k, v) in d.iter() {
            let name: String = k.extract()?;
            let value = static_value(py, &name, &v)?;
            out.push((intern::intern(&name), value));
        }
    }
    Ok(out)
}

fn static_kind(py: Python<'_>, kind: &str) -> PyResult<StaticKind> {
    match kind {
        "int" => Ok(StaticKind::Int),
        "float" => Ok(StaticKind::Float),
        "bool" => Ok(StaticKind::Bool),
        "str" => Ok(StaticKind::Str),
        other => Err(raise(py, "SignatureMismatchError", format!("unknown static kind `{other}`"))),
    }
}

fn dtype(py: Python<'_>, name: &str) -> PyResult<DType> {
    DType::from_name(name)
        .ok_or_else(|| raise(py, "SignatureMismatchError", format!("unknown dtype `{name}`")))
}

/// A guard from its Python tuple spelling (see `tpu_kernels.guards`).
fn guard(py: Python<'_>, t: &Bound<'_, PyTuple>) -> PyResult<Guard> {
    let kind: String = t.get_item(0)?.extract()?;
    let int = |i: usize| -> PyResult<i64> { t.get_item(i)?.extract() };
    let idx = |i: usize| -> PyResult<usize> { t.get_item(i)?.extract() };
    Ok(match kind.as_str() {
        "rank" => Guard::Rank { input: idx(1)?, min: idx(2)?, max: idx(3)? },
        "divisible_by" => {
            Guard::DivisibleBy { input: idx(1)?, dim: int(2)?, by: t.get_item(3)?.extract()? }
        }
        "dim_eq" => Guard::DimEq { input: idx(1)?, dim: int(2)?, size: t.get_item(3)?.extract()? },
        "same_dim" => Guard::SameDim { a: (idx(1)?, int(2)?), b: (idx(3)?, int(4)?) },
        "same_dtype" => Guard::SameDType,
        "dtype_is" => {
            let name: String = t.get_item(2)?.extract()?;
            Guard::DTypeIs { input: idx(1)?, dtype: dtype(py, &name)? }
        }
        "static_eq" => {
            let name: String = t.get_item(1)?.extract()?;
            let value: String = t.get_item(2)?.extract()?;
            Guard::StaticEq { name: intern::intern(&name), value: intern::intern(&value) }
        }
        other => {
            return Err(raise(
                py,
                "SignatureMismatchError",
                format!(
                    "unknown guard `{other}` (rank, divisible_by, dim_eq, same_dim, same_dtype, \
                     dtype_is, static_eq)"
                ),
            ));
        }
    })
}

fn show(types: &[TensorType]) -> String {
    types.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// Whether a module type matches a declared one: same dtype and rank, equal static dims, and a
/// `?` exactly where the declaration has a symbol.
fn type_matches(module: &TensorType, declared: &TensorType) -> bool {
    module.dtype == declared.dtype
        && module.rank() == declared.rank()
        && module.shape.0.iter().zip(&declared.shape.0).all(|(m, d)| match (m, d) {
            (Dim::Static(a), Dim::Static(b)) => a == b,
            (Dim::Symbolic(_), Dim::Symbolic(_)) => true,
            _ => false,
        })
}

/// The reader checks of one variant: it parses, has an entry function, and that function takes
/// the declared inputs. Returns the result types.
pub fn check_variant(
    kernel: &str,
    platform: &str,
    text: &str,
    declared: &[TensorType],
    mutated: &[usize],
) -> Result<Vec<TensorType>, (&'static str, String)> {
    let module = reader::parse_module(text).map_err(|e| {
        (
            "ModuleParseError",
            format!("kernel `{kernel}`: reader parse check failed for the {platform} variant: {e}"),
        )
    })?;
    let main = module.main().map_err(|e| {
        (
            "ModuleParseError",
            format!("kernel `{kernel}`: reader parse check failed for the {platform} variant: {e}"),
        )
    })?;
    let args: Vec<TensorType> = main.args.iter().map(|a| a.ty.clone()).collect();
    let fits =
        args.len() == declared.len() && args.iter().zip(declared).all(|(m, d)| type_matches(m, d));
    if !fits {
        return Err((
            "SignatureMismatchError",
            format!(
                "kernel `{kernel}`: signature check failed for the {platform} variant: @{} takes \
                 ({}) but the kernel declares ({})",
                main.name,
                show(&args),
                show(declared)
            ),
        ));
    }
    // An input updated in place must be donated to its output (`tf.aliasing_output = k`, as
    // `jax.jit(..., donate_argnums=...)` exports it), or the update would be a copy.
    for (k, &i) in mutated.iter().enumerate() {
        let want = format!("{k} : i32");
        let donated = main.args.get(i).is_some_and(|a| {
            a.attributes.iter().any(|(key, v)| key == "tf.aliasing_output" && *v == want)
        });
        if !donated {
            return Err((
                "SignatureMismatchError",
                format!(
                    "kernel `{kernel}`: the {platform} variant does not donate input {i} to \
                     output {k} (`tf.aliasing_output = {k} : i32` on @{}'s parameter {i}), \
                     which it updates in place: export it with donation",
                    main.name
                ),
            ));
        }
    }
    Ok(main.results.iter().map(|r| r.ty.clone()).collect())
}

/// Everything `register_imported` takes, gathered.
struct Spec<'a> {
    name: &'a str,
    ops: Vec<String>,
    inputs: Vec<String>,
    statics: Vec<(String, String, String)>,
    dtypes: Vec<String>,
    guards: Vec<Bound<'a, PyTuple>>,
    priority: i32,
    canonical: Vec<String>,
    doc: String,
    signature: String,
    tpu: Option<String>,
    cpu: Option<String>,
    mutates: Vec<String>,
}

fn build_kernel(py: Python<'_>, spec: &Spec<'_>) -> PyResult<Kernel> {
    let name = spec.name;
    let declared = parse_types(&spec.signature).map_err(|e| {
        raise(
            py,
            "SignatureMismatchError",
            format!("kernel `{name}`: signature `{}`: {e}", spec.signature),
        )
    })?;
    if declared.len() != spec.inputs.len() {
        return Err(raise(
            py,
            "SignatureMismatchError",
            format!(
                "kernel `{name}`: signature check failed: it declares {} tensor inputs ({}) but \
                 the signature `{}` has {}",
                spec.inputs.len(),
                spec.inputs.join(", "),
                spec.signature,
                declared.len()
            ),
        ));
    }
    let input_names: Vec<&str> = spec.inputs.iter().map(String::as_str).collect();
    let mutated = tpu_kernels::registration::mutated_positions(
        name,
        &input_names,
        spec.mutates.iter().map(String::as_str),
    )
    .map_err(|m| raise(py, "RegistrationError", m))?;
    let mut variants: Vec<(Platform, Arc<str>)> = Vec::new();
    let mut results: Option<(&str, Vec<TensorType>)> = None;
    for (platform, text) in [(Platform::Cpu, &spec.cpu), (Platform::Tpu, &spec.tpu)] {
        let Some(text) = text else { continue };
        let pname = platform.name();
        let out = check_variant(name, pname, text, &declared, &mutated)
            .map_err(|(c, m)| raise(py, c, m))?;
        if platform == Platform::Cpu && text.contains("@tpu_custom_call") {
            return Err(raise(
                py,
                "SignatureMismatchError",
                format!(
                    "kernel `{name}`: cpu variant check failed: it calls `tpu_custom_call`, a \
                     TPU-only payload (export Pallas kernels for cpu in interpret mode)"
                ),
            ));
        }
        if let Some((other, theirs)) = &results
            && !(theirs.len() == out.len()
                && theirs.iter().zip(&out).all(|(a, b)| type_matches(a, b)))
        {
            return Err(raise(
                py,
                "SignatureMismatchError",
                format!(
                    "kernel `{name}`: signature check failed: the {other} variant returns ({}) \
                     but the {pname} variant returns ({})",
                    show(theirs),
                    show(&out)
                ),
            ));
        }
        results = Some((pname, out));
        variants.push((platform, Arc::from(text.as_str())));
    }
    if variants.is_empty() {
        return Err(raise(
            py,
            "RegistrationError",
            format!("kernel `{name}`: no module given (tpu or cpu)"),
        ));
    }
    let primary = spec.tpu.as_deref().or(spec.cpu.as_deref()).unwrap_or_default();
    let fingerprint = reader::content_fingerprint(primary)
        .map_err(|e| raise(py, "ModuleParseError", format!("kernel `{name}`: fingerprint: {e}")))?;
    let dtypes = spec.dtypes.iter().map(|d| dtype(py, d)).collect::<PyResult<Vec<_>>>()?;
    let guards = spec.guards.iter().map(|g| guard(py, g)).collect::<PyResult<Vec<_>>>()?;
    let mut statics = Vec::new();
    for (sname, kind, default) in &spec.statics {
        let kind = static_kind(py, kind)?;
        StaticValue::parse(kind, default).map_err(|e| {
            raise(py, "SignatureMismatchError", format!("kernel `{name}`, static `{sname}`: {e}"))
        })?;
        statics
            .push(StaticParam::new(intern::intern(sname), kind).default(intern::intern(default)));
    }
    let platforms: Vec<Platform> = variants.iter().map(|(p, _)| *p).collect();
    let ops: Vec<&str> = spec.ops.iter().map(String::as_str).collect();
    let inputs: Vec<&str> = spec.inputs.iter().map(String::as_str).collect();
    let canonical: Vec<&str> = spec.canonical.iter().map(String::as_str).collect();
    let record = KernelRegistration::new(intern::intern(name), imported_has_no_builder)
        .ops(intern::strs(&ops))
        .inputs(intern::strs(&inputs))
        .statics(intern::statics(&statics))
        .guards(intern::guards(&guards))
        .dtypes(intern::dtypes(&dtypes))
        .platforms(intern::platforms(&platforms))
        .priority(spec.priority)
        .canonical(intern::strs(&canonical))
        .mutates(intern::strs(&spec.mutates.iter().map(String::as_str).collect::<Vec<_>>()))
        .doc(intern::intern(&spec.doc));
    Ok(Kernel {
        record,
        source: KernelSource::Imported { variants, fingerprint, specialiser: None },
        ops: spec.ops.clone(),
        runtime: true,
    })
}

/// Checks and registers an imported kernel: both variants are parsed by the reader and checked
/// against the declared signature (and each other), then the kernel goes into the registry in
/// one atomic step. On any error the registry is unchanged.
#[pyfunction]
#[pyo3(signature = (
    name, *, ops, inputs, signature, dtypes, tpu = None, cpu = None, statics = Vec::new(),
    guards = Vec::new(), priority = 0, canonical = Vec::new(), doc = String::new(),
    specialiser = None, mutates = Vec::new()
))]
#[allow(clippy::too_many_arguments, reason = "a keyword-only Python API")]
pub fn register_imported<'py>(
    py: Python<'py>,
    name: &str,
    ops: Vec<String>,
    inputs: Vec<String>,
    signature: String,
    dtypes: Vec<String>,
    tpu: Option<String>,
    cpu: Option<String>,
    statics: Vec<(String, String, String)>,
    guards: Vec<Bound<'py, PyTuple>>,
    priority: i32,
    canonical: Vec<String>,
    doc: String,
    specialiser: Option<Py<PyAny>>,
    mutates: Vec<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let spec = Spec {
        name,
        ops,
        inputs,
        statics,
        dtypes,
        guards,
        priority,
        canonical,
        doc,
        signature,
        tpu,
        cpu,
        mutates,
    };
    let mut kernel = build_kernel(py, &spec)?;
    if let (Some(f), KernelSource::Imported { specialiser: slot, .. }) =
        (&specialiser, &mut kernel.source)
    {
        // The registry's own dispatcher and graph lowering specialise through it too.
        *slot = Some(Arc::new(crate::runtime::PySpecialiser::new(f.clone_ref(py))));
    }
    let registry = global(py)?;
    let registered =
        registry.register(kernel).map_err(|e| raise(py, "RegistrationError", e.to_string()))?;
    let mut specs = specialisers().lock().unwrap_or_else(PoisonError::into_inner);
    match specialiser {
        Some(f) => specs.insert(name.to_owned(), f),
        None => specs.remove(name),
    };
    drop(specs);
    kernel_info(py, &registered)
}

/// Makes selection try tiled kernels first on every platform (`True`), or on a TPU only
/// (`False`); returns the previous setting. Every memo of an earlier selection is dropped.
#[pyfunction]
pub fn set_force_tiled(py: Python<'_>, force: bool) -> PyResult<bool> {
    let registry = global(py)?;
    let previous = registry.force_tiled();
    registry.set_force_tiled(force).map_err(|e| raise(py, "RegistrationError", e.to_string()))?;
    Ok(previous)
}

/// Runs tiled kernel `name` at signature `sig` (`"f32[8,128], f32[128]; eps=1e-6"`) through the
/// interpreter of its printed Mosaic module (`form`: `"readable"` or `"shipped"`), on row-major
/// f64 inputs; its outputs, row-major. The interpreter reads only the text libtpu is given, so
/// this checks the printing, not just the kernel description the twin is made from.
#[pyfunction]
#[pyo3(signature = (name, sig, inputs, form = "readable"))]
pub fn tiled_interpret(
    py: Python<'_>,
    name: &str,
    sig: &str,
    inputs: Vec<Vec<f64>>,
    form: &str,
) -> PyResult<Vec<Vec<f64>>> {
    let kernel = kernel_named(py, name)?;
    let bad = |m: String| raise(py, "SignatureMismatchError", m);
    let parsed = kernel.record.parse_signature(sig).map_err(bad)?;
    let parsed = kernel.complete_statics(parsed).map_err(bad)?;
    let form = match form {
        "readable" => tpu_kernels::mosaic::Form::Readable,
        "shipped" => tpu_kernels::mosaic::Form::Shipped,
        other => return Err(bad(format!("form `{other}`: `readable` or `shipped`"))),
    };
    let text = match kernel.record.tiled_kernel(&parsed) {
        Some(built) => {
            let built = built.map_err(|e| raise(py, "InternalError", e.to_string()))?;
            let outputs = kernel.record.output_types(&parsed).map_err(bad)?;
            tpu_kernels::mosaic::custom_call_module_for(&built, form, &parsed.inputs, &outputs)
        }
        // A tiled kernel of a loaded library: the TPU module its library emits (the shipped
        // form, which is all a library gives).
        None if kernel.is_tiled() => {
            if form != tpu_kernels::mosaic::Form::Shipped {
                return Err(bad(format!(
                    "kernel `{name}` comes from a library, which gives its shipped form only"
                )));
            }
            kernel
                .module_text(&parsed, Platform::Tpu)
                .map_err(|e| raise(py, "InternalError", e.to_string()))?
                .text
                .to_string()
        }
        None => return Err(bad(format!("kernel `{name}` is not a tiled kernel"))),
    };
    py.detach(|| tpu_kernels::mosaic::interpret(&text, &inputs))
        .map_err(|e| raise(py, "InternalError", format!("kernel `{name}`: interpreter: {e}")))
}

/// Removes a kernel registered at runtime (linked-in kernels cannot be removed).
#[pyfunction]
pub fn unregister(py: Python<'_>, name: &str) -> PyResult<()> {
    global(py)?.unregister(name).map_err(|e| raise(py, "RegistrationError", e.to_string()))?;
    specialisers().lock().unwrap_or_else(PoisonError::into_inner).remove(name);
    Ok(())
}

fn guard_text(g: &Guard) -> String {
    match g {
        Guard::StaticEq { name, value } => format!("static_eq({name}, {value})"),
        Guard::Rank { input, min, max } => format!("rank({input}, {min}, {max})"),
        Guard::DivisibleBy { input, dim, by } => format!("divisible_by({input}, {dim}, {by})"),
        Guard::SameDim { a, b } => format!("same_dim({}, {}, {}, {})", a.0, a.1, b.0, b.1),
        Guard::SameDType => "same_dtype()".to_owned(),
        Guard::DimEq { input, dim, size } => format!("dim_eq({input}, {dim}, {size})"),
        Guard::DTypeIs { input, dtype } => format!("dtype_is({input}, {})", dtype.short_name()),
    }
}

/// A kernel as a Python dict.
pub fn kernel_info<'py>(py: Python<'py>, k: &Kernel) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let r = &k.record;
    d.set_item("name", k.name())?;
    d.set_item("ops", k.ops.clone())?;
    d.set_item("inputs", r.inputs.to_vec())?;
    let statics: Vec<(&str, String, Option<&str>, bool)> = r
        .statics
        .iter()
        .map(|p| {
            (
                p.name,
                format!("{:?}", p.kind).to_lowercase(),
                p.default,
                p.cache_key == CacheKey::Include,
            )
        })
        .collect();
    d.set_item("statics", statics)?;
    d.set_item("dtypes", r.dtypes.iter().map(|t| t.short_name()).collect::<Vec<_>>())?;
    d.set_item("platforms", r.platforms.iter().map(|p| p.name()).collect::<Vec<_>>())?;
    d.set_item("guards", r.guards.iter().map(guard_text).collect::<Vec<_>>())?;
    d.set_item("priority", r.priority)?;
    d.set_item("canonical", r.canonical.to_vec())?;
    d.set_item("mutates", r.mutates.to_vec())?;
    d.set_item("doc", r.doc)?;
    d.set_item("runtime", k.runtime)?;
    match &k.source {
        KernelSource::Library(_) => {
            d.set_item("imported", false)?;
            d.set_item("fingerprint", py.None())?;
            d.set_item("variant_fingerprints", PyDict::new(py))?;
        }
        KernelSource::Imported { variants, fingerprint, .. } => {
            d.set_item("imported", true)?;
            d.set_item("fingerprint", fingerprint.as_str())?;
            let fps = PyDict::new(py);
            for (p, text) in variants {
                fps.set_item(p.name(), reader::content_fingerprint(text).unwrap_or_default())?;
            }
            d.set_item("variant_fingerprints", fps)?;
        }
        KernelSource::Built => {
            d.set_item("imported", r.is_imported())?;
            d.set_item("tiled", r.is_tiled())?;
            d.set_item("fingerprint", py.None())?;
            d.set_item("variant_fingerprints", PyDict::new(py))?;
        }
    }
    d.set_item("generic", crate::runtime::specialiser(py, k.name()).is_some())?;
    match &k.source {
        KernelSource::Library(library) => {
            d.set_item("library", library.path().display().to_string())?;
        }
        _ => d.set_item("library", py.None())?,
    }
    Ok(d)
}

/// Every kernel in the registry (linked-in and runtime), sorted by name.
#[pyfunction]
pub fn list_kernels(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    let index = global(py)?.index();
    index.kernels().map(|k| kernel_info(py, k)).collect()
}

/// One kernel by name.
#[pyfunction]
pub fn kernel<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
    let k = kernel_named(py, name)?;
    kernel_info(py, &k)
}

/// The module text of an imported kernel's variant, verbatim.
#[pyfunction]
pub fn variant_text(py: Python<'_>, name: &str, platform: &str) -> PyResult<String> {
    let p = self::platform(py, platform)?;
    let k = kernel_named(py, name)?;
    match &k.source {
        KernelSource::Imported { variants, .. } => {
            variants.iter().find(|(q, _)| *q == p).map(|(_, t)| t.to_string()).ok_or_else(|| {
                raise(py, "NoKernelError", format!("kernel `{name}` has no {platform} variant"))
            })
        }
        KernelSource::Built => Err(raise(
            py,
            "NoKernelError",
            format!("kernel `{name}` is built from Rust, not imported"),
        )),
        KernelSource::Library(library) => Err(raise(
            py,
            "NoKernelError",
            format!(
                "kernel `{name}` comes from kernel library `{}`, not imported: its module is \
                 emitted per signature (tpu_kernels.emit)",
                library.path().display()
            ),
        )),
    }
}

/// Every candidate kernel of `op` for a call's metadata, in the order selection tries them on
/// `platform`: `(name, None)` for a kernel that takes the call, `(name, reason)` for one that
/// refuses it. Unlike [`select`], it names a kernel's reason even when another kernel takes the
/// call (a tiled kernel and the StableHLO kernel of the same op).
#[pyfunction]
#[pyo3(signature = (op, inputs, statics = None, platform = "cpu", contiguous = None))]
pub fn explain(
    py: Python<'_>,
    op: &str,
    inputs: &str,
    statics: Option<&Bound<'_, PyDict>>,
    platform: &str,
    contiguous: Option<Vec<bool>>,
) -> PyResult<Vec<(String, Option<String>)>> {
    let types = parse_types(inputs).map_err(|e| raise(py, "SignatureMismatchError", e))?;
    let sig = KernelSignature { inputs: types, statics: statics_of(py, statics)? };
    let contiguous = contiguous.unwrap_or_else(|| vec![true; sig.inputs.len()]);
    let platform = self::platform(py, platform)?;
    let meta = CallMeta { sig: &sig, contiguous: &contiguous, platform };
    let index = global(py)?.index();
    let op = tpu_kernels_registry::normalize_op(op);
    if index.candidates(&op).is_empty() {
        return Err(raise(py, "NoKernelError", format!("no kernel is registered for `{op}`")));
    }
    Ok(index
        .candidates_for(&op, platform)
        .into_iter()
        .map(|k| (k.name().to_owned(), k.accepts(&meta).err()))
        .collect())
}

/// Selects the kernel for `op` and a call's metadata; returns its name or raises
/// `NoKernelError` with every candidate's reason.
#[pyfunction]
#[pyo3(signature = (op, inputs, statics = None, platform = "cpu", contiguous = None))]
pub fn select(
    py: Python<'_>,
    op: &str,
    inputs: &str,
    statics: Option<&Bound<'_, PyDict>>,
    platform: &str,
    contiguous: Option<Vec<bool>>,
) -> PyResult<String> {
    let types = parse_types(inputs).map_err(|e| raise(py, "SignatureMismatchError", e))?;
    let sig = KernelSignature { inputs: types, statics: statics_of(py, statics)? };
    let contiguous = contiguous.unwrap_or_else(|| vec![true; sig.inputs.len()]);
    let meta =
        CallMeta { sig: &sig, contiguous: &contiguous, platform: self::platform(py, platform)? };
    global(py)?
        .select(op, &meta)
        .map(|k| k.name().to_owned())
        .map_err(|e| raise(py, "NoKernelError", e.to_string()))
}
