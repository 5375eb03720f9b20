//! A resolver over the kernels linked into the binary, straight from their registrations.
//!
//! It binds a node to a kernel the simple way: the node's tensor arguments in order are the
//! kernel's inputs, and each of the kernel's static parameters takes the node's argument of the
//! same name (a keyword, or a positional one through `Node::arg_names`), else the next
//! non-tensor positional argument, else its default. The registry's dispatcher does the real
//! selection (guards, priorities, platforms); this one serves tests and tools.

use tpu_kernels::registration::{KernelRegistration, KernelSignature, StaticKind, StaticValue};
use tpu_kernels::{Module, registered};

use super::lower::{KernelResolver, OpCall};
use super::model::Arg;

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

    /// The signature `kernel` would be called with for `call`, or why it cannot be.
    pub fn signature(
        kernel: &KernelRegistration,
        call: &OpCall<'_>,
    ) -> Result<KernelSignature, String> {
        let mut positional = call.static_args().into_iter();
        let mut statics = Vec::with_capacity(kernel.statics.len());
        for p in kernel.statics {
            let arg = match call.arg(p.name) {
                Some(a) => Some(a),
                None if call.node.arg_names.is_empty() => positional.next(),
                None => None,
            };
            let value = match arg {
                Some(Arg::None) | None => match p.default {
                    Some(text) => StaticValue::parse(p.kind, text)?,
                    None => return Err(format!("no value for static `{}`", p.name)),
                },
                Some(a) => static_value(p.kind, a)
                    .ok_or_else(|| format!("static `{}` cannot take a {}", p.name, a.kind()))?,
            };
            statics.push((p.name, value));
        }
        Ok(KernelSignature { inputs: call.inputs.clone(), statics })
    }
}

fn static_value(kind: StaticKind, arg: &Arg) -> Option<StaticValue> {
    Some(match (kind, arg) {
        (StaticKind::Int, Arg::Int(v)) => StaticValue::Int(*v),
        (StaticKind::Float, Arg::Float(v)) => StaticValue::Float(*v),
        (StaticKind::Float, Arg::Int(v)) => StaticValue::Float(*v as f64),
        (StaticKind::Bool, Arg::Bool(v)) => StaticValue::Bool(*v),
        (StaticKind::Str, Arg::String(v)) => StaticValue::Str(v.clone()),
        _ => return None,
    })
}

/// Whether `registered` (`aten::gelu` or `aten::gelu.default`) names the overload `op`.
fn names_op(registered: &str, op: &str) -> bool {
    registered == op || op.strip_suffix(".default") == Some(registered)
}

impl KernelResolver for RegisteredKernels {
    fn resolve(&self, call: &OpCall<'_>) -> Option<Module> {
        let mut best: Option<(&KernelRegistration, KernelSignature)> = None;
        for k in &self.kernels {
            if !k.ops.iter().any(|o| names_op(o, call.op())) {
                continue;
            }
            let Ok(sig) = Self::signature(k, call) else { continue };
            if k.accepts(&sig).is_err() {
                continue;
            }
            if best.as_ref().is_none_or(|(b, _)| k.priority > b.priority) {
                best = Some((k, sig));
            }
        }
        let (kernel, sig) = best?;
        kernel.emit(&sig).ok()
    }
}
