//! Test-only fault injection: makes a named kernel compute wrong values, graph lowering fail,
//! or a program fail at run time, so the project's tests can show that they fail when their
//! subject breaks.
//!
//! Nothing in the project sets a fault on its own: only [`set`] does, and the only callers are
//! the Python package's `tpu_kernels.testing.inject_fault` and tests. With no fault set, every
//! hook is one relaxed atomic load.
//!
//! The hooks sit where every path goes through, so a fault reaches eager calls, fused programs
//! and compiled graphs alike:
//! - [`Fault::Nan`] and [`Fault::Offset`] rewrite the kernel's module text
//!   ([`crate::Kernel::module_text`], and the specialised text of generic imported kernels):
//!   its `@main` calls the original as a private function and changes every floating-point
//!   output (NaN everywhere, or the value plus one). The wrong values are computed by PJRT.
//! - [`Fault::LowerError`] makes [`crate::graph::lower`] fail.
//! - [`Fault::RunError`] makes the execution of the kernel (eager) or of any graph program
//!   (that inlines it, or every program) fail before PJRT runs it.
//!
//! Changing the faults bumps [`generation`]; memoised executables built under other faults are
//! dropped (the dispatcher compares generations as it does the registry's).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};

use tpu_kernels::TensorType;

/// One injected fault.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Every floating-point output of kernel `kernel` is NaN.
    Nan { kernel: String },
    /// Every floating-point output of kernel `kernel` is off by one.
    Offset { kernel: String },
    /// Graph lowering fails.
    LowerError,
    /// Running fails: kernel `kernel`'s eager calls and every graph program that inlines it, or
    /// every kernel call and every graph program when `kernel` is `None`.
    RunError { kernel: Option<String> },
}

impl Fault {
    /// Parses `nan:KERNEL`, `offset:KERNEL`, `lower`, `run` or `run:KERNEL`.
    pub fn parse(text: &str) -> Result<Fault, String> {
        let (kind, arg) = match text.split_once(':') {
            Some((k, a)) => (k.trim(), Some(a.trim())),
            None => (text.trim(), None),
        };
        let kernel = |kind: &str| match arg {
            Some(a) if !a.is_empty() => Ok(a.to_owned()),
            _ => Err(format!("fault `{kind}` needs a kernel name: `{kind}:KERNEL`")),
        };
        match kind {
            "nan" => Ok(Fault::Nan { kernel: kernel(kind)? }),
            "offset" => Ok(Fault::Offset { kernel: kernel(kind)? }),
            "lower" if arg.is_none() => Ok(Fault::LowerError),
            "run" => {
                Ok(Fault::RunError { kernel: arg.filter(|a| !a.is_empty()).map(str::to_owned) })
            }
            _ => Err(format!(
                "unknown fault `{text}`: expected `nan:KERNEL`, `offset:KERNEL`, `lower`, `run` or `run:KERNEL`"
            )),
        }
    }
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static GENERATION: AtomicUsize = AtomicUsize::new(0);
static FAULTS: RwLock<Vec<Fault>> = RwLock::new(Vec::new());

/// Replaces the injected faults (an empty list clears them).
pub fn set(faults: Vec<Fault>) {
    let mut current = FAULTS.write().unwrap_or_else(PoisonError::into_inner);
    ACTIVE.store(!faults.is_empty(), Ordering::Release);
    *current = faults;
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The injected faults.
pub fn current() -> Vec<Fault> {
    if !ACTIVE.load(Ordering::Acquire) {
        return Vec::new();
    }
    FAULTS.read().unwrap_or_else(PoisonError::into_inner).clone()
}

/// Bumped by every [`set`].
pub fn generation() -> usize {
    GENERATION.load(Ordering::Acquire)
}

fn any(f: impl Fn(&Fault) -> bool) -> bool {
    ACTIVE.load(Ordering::Acquire)
        && FAULTS.read().unwrap_or_else(PoisonError::into_inner).iter().any(f)
}

/// How kernel `kernel`'s outputs are corrupted, if they are.
fn corruption(kernel: &str) -> Option<Fault> {
    if !ACTIVE.load(Ordering::Acquire) {
        return None;
    }
    FAULTS
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(
            |f| matches!(f, Fault::Nan { kernel: k } | Fault::Offset { kernel: k } if k == kernel),
        )
        .cloned()
}

/// Whether kernel `kernel`'s module is rewritten by a fault.
pub fn corrupts(kernel: &str) -> bool {
    corruption(kernel).is_some()
}

/// `text` (kernel `kernel`'s module for `inputs`) as the fault makes it: unchanged without one.
#[allow(clippy::eq_op, reason = "`(o - o) / (o - o)` is the NaN the fault computes")]
pub fn corrupt_text(kernel: &str, inputs: &[TensorType], text: &str) -> Result<String, String> {
    let Some(fault) = corruption(kernel) else { return Ok(text.to_owned()) };
    let module = crate::graph::wrap_module_text(kernel, inputs, text, |outs| {
        outs.into_iter()
            .map(|o| {
                if !o.dtype().is_float() {
                    return o;
                }
                match fault {
                    // 0/0: NaN whatever the value, with no NaN literal to print.
                    Fault::Nan { .. } => (o - o) / (o - o),
                    _ => o + 1.0,
                }
            })
            .collect()
    })?;
    Ok(module.to_text())
}

/// The injected lowering failure, if any.
pub fn lowering() -> Option<String> {
    any(|f| matches!(f, Fault::LowerError))
        .then(|| "injected fault: graph lowering fails".to_owned())
}

/// The injected failure of running kernel `kernel` eagerly, if any.
pub fn kernel_run(kernel: &str) -> Option<String> {
    any(|f| matches!(f, Fault::RunError { kernel: None }))
        .then_some(())
        .or_else(|| {
            any(|f| matches!(f, Fault::RunError { kernel: Some(k) } if k == kernel)).then_some(())
        })
        .map(|()| format!("injected fault: kernel `{kernel}` fails at run time"))
}

/// The injected failure of running a graph program that inlines `kernels`, if any.
pub fn program_run(program: &str, kernels: &[String]) -> Option<String> {
    any(|f| match f {
        Fault::RunError { kernel: None } => true,
        Fault::RunError { kernel: Some(k) } => kernels.iter().any(|n| n == k),
        _ => false,
    })
    .then(|| format!("injected fault: graph program `{program}` fails at run time"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_kind_and_refuses_the_rest() {
        assert_eq!(Fault::parse("nan:silu"), Ok(Fault::Nan { kernel: "silu".into() }));
        assert_eq!(Fault::parse("offset: gelu"), Ok(Fault::Offset { kernel: "gelu".into() }));
        assert_eq!(Fault::parse("lower"), Ok(Fault::LowerError));
        assert_eq!(Fault::parse("run"), Ok(Fault::RunError { kernel: None }));
        assert_eq!(Fault::parse("run:k"), Ok(Fault::RunError { kernel: Some("k".into()) }));
        for bad in ["nan", "nan:", "lower:x", "explode", ""] {
            let e = Fault::parse(bad).unwrap_err();
            assert!(e.contains("fault"), "{bad}: {e}");
        }
    }
}
