//! A resolver over the kernels linked into the binary, straight from their registrations.
//!
//! Binding a node to a kernel: when the registration carries schema bindings (`#[tpu_kernel]`
//! records do), each kernel parameter takes the node's argument of that schema name (a keyword)
//! or position. Without bindings, the node's tensor arguments in order are the kernel's inputs
//! and each static parameter takes the argument of its name (a keyword, or a positional one
//! through `Node::arg_names`), else the next non-tensor positional argument. A static left
//! without a value takes its default. Among the kernels that accept the call, the highest
//! priority wins, then the first by name. The registry's dispatcher does the real selection
//! (platforms, ambiguity, fallbacks); this one serves tests and tools.

use tpu_kernels::registration::{
    BindingKind, KernelRegistration, KernelSignature, StaticKind, StaticValue,
};
use tpu_kernels::{TensorType, registered};

use super::lower::{KernelCall, KernelResolver, OpCall};
use super::model::{Arg, TensorRef};

/// Resolves nodes to registered kernels (all of them, or the named ones).
#[derive(Clone, Debug)]
pub struct RegisteredKernels {
    kernels: Vec<&'static KernelRegistration>,
}

impl RegisteredKernels {
    /// Every kernel linked in.
    pub fn all() -> RegisteredKernels {
        RegisteredKernels { kernels: registered() }
    }

    /// Only the kernels named in `names`.
    pub fn only(names: &[&str]) -> RegisteredKernels {
        let kernels = registered().into_iter().filter(|k| names.contains(&k.name)).collect();
        RegisteredKernels { kernels }
    }

    /// The kernels this resolver chooses from, sorted by name.
    pub fn kernels(&self) -> &[&'static KernelRegistration] {
        &self.kernels
    }

    /// How `kernel` would be called for `call`: its signature and the node's tensors it takes,
    /// or why it cannot be.
    pub fn bind(
        kernel: &KernelRegistration,
        call: &OpCall<'_>,
    ) -> Result<(KernelSignature, Vec<TensorRef>), String> {
        let by_schema = |name: &str, position: usize| -> Option<&Arg> {
            call.node.kwargs.get(name).or_else(|| call.node.args.get(position))
        };
        let mut statics = Vec::with_capacity(kernel.statics.len());
        let (inputs, refs): (Vec<TensorType>, Vec<TensorRef>) = if kernel.bindings.is_empty() {
            let mut positional = call.static_args().into_iter();
            for p in kernel.statics {
                let arg = match call.arg(p.name) {
                    Some(a) => Some(a),
                    None if call.node.arg_names.is_empty() => positional.next(),
                    None => None,
                };
                statics.push((p.name, static_of(p.name, p.kind, p.default, arg)?));
            }
            let refs: Vec<TensorRef> = call.tensor_args().into_iter().cloned().collect();
            (call.inputs.clone(), refs)
        } else {
            // A tensor the kernel does not take would be silently dropped (SDPA's `attn_mask` for
            // the kernel without a mask): such a call is not this kernel's.
            let takes = |name: &str, position: usize| {
                kernel.bindings.iter().any(|b| b.name == name || b.position == position)
            };
            // An unbound `bool[]` is an output mask (`native_layer_norm_backward`): the kernel
            // computes every output, so a node leaving some out must still declare them all.
            let declared = call.node.outputs.len();
            let unbound = |name: &str, a: &Arg| match a {
                Arg::Tensor(_) | Arg::TensorList(_) => {
                    Err(format!("{name} is a tensor the kernel does not take"))
                }
                Arg::BoolList(mask) if mask.contains(&false) && declared < mask.len() => {
                    Err(format!(
                        "{name} is {mask:?} and the node declares {declared} outputs; the kernel computes every output"
                    ))
                }
                _ => Ok(()),
            };
            for (i, a) in call.node.args.iter().enumerate() {
                let name = call.node.arg_names.get(i).map_or("", String::as_str);
                if !takes(name, i) {
                    let shown =
                        if name.is_empty() { format!("argument {i}") } else { format!("`{name}`") };
                    unbound(&shown, a)?;
                }
            }
            for (name, a) in &call.node.kwargs {
                if !kernel.bindings.iter().any(|b| b.name == name) {
                    unbound(&format!("`{name}`"), a)?;
                }
            }
            let mut tensors: Vec<Option<TensorRef>> = vec![None; kernel.inputs.len()];
            let mut values: Vec<Option<StaticValue>> = vec![None; kernel.statics.len()];
            for b in kernel.bindings {
                let arg = by_schema(b.name, b.position);
                match b.kind {
                    BindingKind::Tensor { index } => match (arg, tensors.get_mut(index)) {
                        (Some(Arg::Tensor(r)), Some(slot)) => *slot = Some(r.clone()),
                        (other, _) => {
                            let got = other.map_or("nothing", Arg::kind);
                            return Err(format!("`{}` must be a tensor, got {got}", b.name));
                        }
                    },
                    BindingKind::Static { index } => {
                        let Some(p) = kernel.statics.get(index) else {
                            return Err(format!("binding `{}` names no static parameter", b.name));
                        };
                        values[index] = Some(static_of(p.name, p.kind, p.default, arg)?);
                    }
                }
            }
            for (p, v) in kernel.statics.iter().zip(values) {
                let v = match v {
                    Some(v) => v,
                    None => static_of(p.name, p.kind, p.default, None)?,
                };
                statics.push((p.name, v));
            }
            let refs = tensors
                .into_iter()
                .zip(kernel.inputs)
                .map(|(r, name)| r.ok_or_else(|| format!("no tensor for input `{name}`")))
                .collect::<Result<Vec<_>, _>>()?;
            let types = refs
                .iter()
                .map(|r| {
                    let i = call.tensor_args().iter().position(|t| *t == r);
                    i.and_then(|i| call.inputs.get(i).cloned())
                        .ok_or_else(|| format!("no type for {r}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            (types, refs)
        };
        Ok((KernelSignature { inputs, statics }, refs))
    }
}

/// The value of static `name` from `arg`, or its default.
fn static_of(
    name: &str,
    kind: StaticKind,
    default: Option<&str>,
    arg: Option<&Arg>,
) -> Result<StaticValue, String> {
    let value = match (kind, arg) {
        (_, None | Some(Arg::None)) => {
            return match default {
                Some(text) => StaticValue::parse(kind, text),
                None => Err(format!("no value for static `{name}`")),
            };
        }
        (StaticKind::Int, Some(Arg::Int(v))) => StaticValue::Int(*v),
        (StaticKind::Float, Some(Arg::Float(v))) => StaticValue::Float(*v),
        (StaticKind::Float, Some(Arg::Int(v))) => StaticValue::Float(*v as f64),
        (StaticKind::Bool, Some(Arg::Bool(v))) => StaticValue::Bool(*v),
        (StaticKind::Str, Some(Arg::String(v) | Arg::Dtype(v))) => StaticValue::Str(v.clone()),
        (_, Some(a)) => return Err(format!("static `{name}` cannot take a {}", a.kind())),
    };
    Ok(value)
}

/// Whether `registered` (`aten::gelu` or `aten::gelu.default`) names the overload `op`.
fn names_op(registered: &str, op: &str) -> bool {
    registered == op || op.strip_suffix(".default") == Some(registered)
}

impl KernelResolver for RegisteredKernels {
    fn resolve(&self, call: &OpCall<'_>) -> Option<KernelCall> {
        let mut best: Option<(&KernelRegistration, KernelSignature, Vec<TensorRef>)> = None;
        for k in &self.kernels {
            if !k.ops.iter().any(|o| names_op(o, call.op())) {
                continue;
            }
            let Ok((sig, refs)) = Self::bind(k, call) else { continue };
            if k.accepts(&sig).is_err() {
                continue;
            }
            if best.as_ref().is_none_or(|(b, ..)| k.priority > b.priority) {
                best = Some((k, sig, refs));
            }
        }
        let (kernel, sig, args) = best?;
        let module = kernel.emit(&sig).ok()?;
        Some(KernelCall { module, args })
    }
}

/// Resolves nodes with the registry's own selection: candidates in priority order, each bound to
/// the node by its schema bindings and checked with every guard for `platform`. Rust-built
/// kernels inline their module; imported ones, and those of loaded kernel libraries, inline
/// their StableHLO text for `platform` (a TPU payload never reaches a CPU lowering). A
/// candidate that fails to bind, to pass its guards or to build leaves the node to the next
/// candidate, then to the default table.
#[derive(Clone, Debug)]
pub struct IndexResolver {
    index: std::sync::Arc<crate::Index>,
    platform: tpu_kernels::registration::Platform,
}

impl IndexResolver {
    pub fn new(
        index: std::sync::Arc<crate::Index>,
        platform: tpu_kernels::registration::Platform,
    ) -> IndexResolver {
        IndexResolver { index, platform }
    }

    fn module_for(
        &self,
        kernel: &crate::Kernel,
        sig: &KernelSignature,
    ) -> Option<tpu_kernels::Module> {
        match &kernel.source {
            // An injected fault rewrites the module text (see `crate::fault`).
            crate::KernelSource::Built if crate::fault::corrupts(kernel.name()) => {
                imported_wrapper(kernel, sig, self.platform).ok()
            }
            // A tiled kernel's TPU variant is its custom call, reached through its text.
            crate::KernelSource::Built
                if kernel.record.is_tiled()
                    && self.platform == tpu_kernels::registration::Platform::Tpu =>
            {
                imported_wrapper(kernel, sig, self.platform).ok()
            }
            crate::KernelSource::Built => kernel.record.emit(sig).ok(),
            crate::KernelSource::Imported { .. } | crate::KernelSource::Library(_) => {
                imported_wrapper(kernel, sig, self.platform).ok()
            }
        }
    }
}

impl KernelResolver for IndexResolver {
    fn resolve(&self, call: &OpCall<'_>) -> Option<KernelCall> {
        let op = crate::normalize_op(call.op());
        for kernel in self.index.candidates_for(&op, self.platform) {
            let Ok((sig, args)) = RegisteredKernels::bind(&kernel.record, call) else { continue };
            let contiguous = vec![true; sig.inputs.len()];
            let meta =
                crate::CallMeta { sig: &sig, contiguous: &contiguous, platform: self.platform };
            if kernel.accepts(&meta).is_err() {
                continue;
            }
            if let Some(module) = self.module_for(kernel, &sig) {
                return Some(KernelCall { module, args });
            }
        }
        None
    }
}

/// A module whose `@main` calls an imported kernel's text, inlined as private functions.
fn imported_wrapper(
    kernel: &crate::Kernel,
    sig: &KernelSignature,
    platform: tpu_kernels::registration::Platform,
) -> Result<tpu_kernels::Module, String> {
    let text = kernel.module_text(sig, platform).map_err(|e| e.to_string())?.text;
    wrap_module_text(kernel.name(), &sig.inputs, &text, |outs| outs)
}

/// Adds `text`'s functions to `b` as private text functions prefixed `prefix`; returns the name
/// of its entry.
fn inline_text(
    b: &tpu_kernels::KernelBuilder,
    name: &str,
    text: &str,
    prefix: &str,
) -> Result<String, String> {
    let parsed = tpu_kernels::reader::parse_module(text).map_err(|e| e.to_string())?;
    let functions = parsed.functions_for_inlining(prefix).map_err(|e| e.to_string())?;
    let mut entry = None;
    for f in functions {
        if f.is_entry {
            entry = Some(f.name.clone());
        }
        let signature = tpu_kernels::ir::Signature {
            params: f.args.iter().map(|a| a.ty.clone()).collect(),
            results: f.results.iter().map(|a| a.ty.clone()).collect(),
        };
        b.add_text_function(tpu_kernels::ir::TextFunction {
            name: f.name,
            signature,
            text: f.text,
        })
        .map_err(|e| e.to_string())?;
    }
    entry.ok_or_else(|| format!("kernel `{name}`: module has no entry"))
}

/// A module named `name` over `inputs` whose `@main` calls `text`'s entry (its functions
/// inlined as private functions prefixed `{name}_impl`) and returns `post` of its results.
pub fn wrap_module_text(
    name: &str,
    inputs: &[TensorType],
    text: &str,
    post: impl for<'b> FnOnce(Vec<tpu_kernels::Tensor<'b>>) -> Vec<tpu_kernels::Tensor<'b>>,
) -> Result<tpu_kernels::Module, String> {
    let b = tpu_kernels::KernelBuilder::new(name, inputs);
    let entry = inline_text(&b, name, text, &format!("{name}_impl"))?;
    let outs = b.call_text(&entry, &b.args()).map_err(|e| e.to_string())?;
    b.finish(&post(outs)).map_err(|e| e.to_string())
}

/// How a kernel runs inside an SPMD program when XLA cannot partition it (a Mosaic call): per
/// shard, in a manually sharded region. `inputs[i]` / `outputs[j]` name the dimension of the
/// kernel's tensor input `i` / output `j` that is cut into `devices` equal shards (`None`:
/// whole on every device); the kernel's work must be independent along those dimensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardSpec {
    pub inputs: Vec<Option<usize>>,
    pub outputs: Vec<Option<usize>>,
    pub devices: usize,
}

impl ShardSpec {
    /// XLA's sharding of a tensor of rank `rank` cut along `dim` over every device (`None`:
    /// replicated).
    fn sharding(&self, rank: usize, dim: Option<usize>) -> String {
        match dim {
            None => "{replicated}".to_owned(),
            Some(d) => {
                let tiles: Vec<String> = (0..rank)
                    .map(|k| if k == d { self.devices } else { 1 })
                    .map(|n| n.to_string())
                    .collect();
                let ids: Vec<String> = (0..self.devices).map(|i| i.to_string()).collect();
                format!("{{devices=[{}]{}}}", tiles.join(","), ids.join(","))
            }
        }
    }

    /// `ty` cut along `dim`: the shard's type, or why it cannot be cut.
    fn shard(&self, ty: &TensorType, dim: Option<usize>, what: &str) -> Result<TensorType, String> {
        let Some(d) = dim else { return Ok(ty.clone()) };
        let short = ty.short();
        let dims =
            ty.shape.static_dims().ok_or_else(|| format!("{what} {short} has a symbolic shape"))?;
        let n = self.devices as u64;
        match dims.get(d) {
            None => Err(format!("{what} {short} has no dimension {d}")),
            Some(&size) if size % n != 0 => Err(format!(
                "{what} {short}: dimension {d} of size {size} does not divide into {n} shards"
            )),
            Some(_) => {
                let mut cut = dims.to_vec();
                cut[d] /= n;
                Ok(TensorType::new(ty.dtype, tpu_kernels::Shape::of(&cut)))
            }
        }
    }
}

impl IndexResolver {
    /// The kernel for `call` specialised to its per-shard signature under `spec` and wrapped in
    /// a manually sharded region (`SPMDFullToShardShape`, the kernel at the shard's shapes,
    /// `SPMDShardToFullShape`), as `shard_map` runs a kernel. `Err` says why no kernel takes the
    /// per-shard call (the caller then inlines the kernel whole, which is never wrong).
    ///
    /// The kernel is the one the TPU would run (tiled kernels first), built for this resolver's
    /// platform: on the CPU, a tiled kernel's twin runs in the region its Mosaic call runs in
    /// on the TPU. `only` restricts the choice to the kernel of that name.
    pub fn resolve_manual(
        &self,
        call: &OpCall<'_>,
        spec: &ShardSpec,
        only: Option<&str>,
    ) -> Result<KernelCall, String> {
        let op = crate::normalize_op(call.op());
        let mut reasons = Vec::new();
        let candidates = self.index.candidates_for(&op, tpu_kernels::registration::Platform::Tpu);
        for kernel in candidates.into_iter().filter(|k| only.is_none_or(|n| k.name() == n)) {
            match self.manual_kernel(kernel, call, spec) {
                Ok(k) => return Ok(k),
                Err(e) => reasons.push(format!("{}: {e}", kernel.name())),
            }
        }
        if reasons.is_empty() {
            reasons.push("no kernel binds the op".to_owned());
        }
        Err(reasons.join("; "))
    }

    fn manual_kernel(
        &self,
        kernel: &crate::Kernel,
        call: &OpCall<'_>,
        spec: &ShardSpec,
    ) -> Result<KernelCall, String> {
        let (sig, args) = RegisteredKernels::bind(&kernel.record, call)?;
        let contiguous = vec![true; sig.inputs.len()];
        kernel.accepts(&crate::CallMeta {
            sig: &sig,
            contiguous: &contiguous,
            platform: self.platform,
        })?;
        if spec.inputs.len() != sig.inputs.len() {
            return Err(format!(
                "the spec names {} inputs, the kernel takes {}",
                spec.inputs.len(),
                sig.inputs.len()
            ));
        }
        let full_out = kernel.output_types(&sig)?;
        if spec.outputs.len() != full_out.len() {
            return Err(format!(
                "the spec names {} outputs, the kernel has {}",
                spec.outputs.len(),
                full_out.len()
            ));
        }
        let shard_in = sig
            .inputs
            .iter()
            .zip(&spec.inputs)
            .enumerate()
            .map(|(i, (t, d))| spec.shard(t, *d, &format!("input {i}")))
            .collect::<Result<Vec<_>, _>>()?;
        let shard_sig = KernelSignature { inputs: shard_in.clone(), statics: sig.statics.clone() };
        let meta =
            crate::CallMeta { sig: &shard_sig, contiguous: &contiguous, platform: self.platform };
        kernel.accepts(&meta).map_err(|e| format!("at the shard's signature: {e}"))?;
        let shard_out = kernel.output_types(&shard_sig)?;
        for (j, ((full, got), d)) in full_out.iter().zip(&shard_out).zip(&spec.outputs).enumerate()
        {
            let want = spec.shard(full, *d, &format!("output {j}"))?;
            if &want != got {
                return Err(format!(
                    "output {j} is {} at the shard's signature, not {}: the kernel's work is \
                     not independent along the spec's dimensions",
                    got.short(),
                    want.short()
                ));
            }
        }
        let module = self
            .module_for(kernel, &shard_sig)
            .ok_or_else(|| format!("no {:?} module at the shard's signature", self.platform))?;
        let text = module.to_text();
        let name = kernel.name();
        let b = tpu_kernels::KernelBuilder::new(name, &sig.inputs);
        let entry = inline_text(&b, name, &text, &format!("{name}_shard"))?;
        let region = format!("{name}_manual");
        let text = manual_region_text(
            &region,
            &entry,
            spec,
            &sig.inputs,
            &shard_in,
            &full_out,
            &shard_out,
        );
        b.add_text_function(tpu_kernels::ir::TextFunction {
            name: region.clone(),
            signature: tpu_kernels::ir::Signature { params: sig.inputs.clone(), results: full_out },
            text,
        })
        .map_err(|e| e.to_string())?;
        let outs = b.call_text(&region, &b.args()).map_err(|e| e.to_string())?;
        let module = b.finish(&outs).map_err(|e| e.to_string())?;
        Ok(KernelCall { module, args })
    }
}

/// `func.func private @{region}`: full-shape arguments made manual (cut as `spec` says), the
/// kernel's `entry` called at the shard's shapes, its results made full again.
fn manual_region_text(
    region: &str,
    entry: &str,
    spec: &ShardSpec,
    full_in: &[TensorType],
    shard_in: &[TensorType],
    full_out: &[TensorType],
    shard_out: &[TensorType],
) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let params: Vec<String> =
        full_in.iter().enumerate().map(|(i, t)| format!("%arg{i}: {t}")).collect();
    let results: Vec<String> = full_out.iter().map(ToString::to_string).collect();
    let _ = writeln!(
        s,
        "func.func private @{region}({}) -> ({}) {{",
        params.join(", "),
        results.join(", ")
    );
    let mut manual = Vec::with_capacity(full_in.len());
    for (i, ((full, shard), d)) in full_in.iter().zip(shard_in).zip(&spec.inputs).enumerate() {
        let sharding = spec.sharding(full.shape.rank(), *d);
        let _ = writeln!(
            s,
            "  %in{i} = stablehlo.custom_call @Sharding(%arg{i}) {{mhlo.sharding = \"{sharding}\"}} : ({full}) -> {full}"
        );
        let _ = writeln!(
            s,
            "  %shard{i} = stablehlo.custom_call @SPMDFullToShardShape(%in{i}) {{mhlo.sharding = \"{{manual}}\"}} : ({full}) -> {shard}"
        );
        manual.push(format!("%shard{i}"));
    }
    let shard_in_types: Vec<String> = shard_in.iter().map(ToString::to_string).collect();
    let shard_out_types: Vec<String> = shard_out.iter().map(ToString::to_string).collect();
    let n = shard_out.len();
    let lhs = if n == 1 { "%r".to_owned() } else { format!("%r:{n}") };
    let _ = writeln!(
        s,
        "  {lhs} = func.call @{entry}({}) : ({}) -> ({})",
        manual.join(", "),
        shard_in_types.join(", "),
        shard_out_types.join(", ")
    );
    let mut outs = Vec::with_capacity(n);
    for (j, ((full, shard), d)) in full_out.iter().zip(shard_out).zip(&spec.outputs).enumerate() {
        let r = if n == 1 { "%r".to_owned() } else { format!("%r#{j}") };
        let sharding = spec.sharding(full.shape.rank(), *d);
        let _ = writeln!(
            s,
            "  %m{j} = stablehlo.custom_call @Sharding({r}) {{mhlo.sharding = \"{{manual}}\"}} : ({shard}) -> {shard}"
        );
        let _ = writeln!(
            s,
            "  %out{j} = stablehlo.custom_call @SPMDShardToFullShape(%m{j}) {{mhlo.sharding = \"{sharding}\"}} : ({shard}) -> {full}"
        );
        outs.push(format!("%out{j}"));
    }
    let _ = writeln!(s, "  return {} : {}", outs.join(", "), results.join(", "));
    s.push('}');
    s
}
