//! The verification pass every module goes through before it prints.
//!
//! It re-derives every result type with [`crate::ir::infer`] (the same rules the builder used) and
//! checks what the builder's bookkeeping guarantees only by construction: each operand is defined
//! before its use and visible from where it is used, region results too, each function returns
//! its declared types, and every called symbol exists once.

use std::collections::{BTreeSet, HashSet};

use crate::error::{OpError, op_err};
use crate::ir::{Function, InferCx, Module, RegionId, Signature, ValueId, infer, list};
use crate::types::TensorType;

struct Cx<'m> {
    module: &'m Module,
    func: &'m Function,
}

impl InferCx for Cx<'_> {
    fn ty(&self, v: ValueId) -> &TensorType {
        self.func.ty(v)
    }

    fn region_result_types(&self, r: RegionId) -> Vec<TensorType> {
        self.func.region(r).results.iter().map(|v| self.func.ty(*v).clone()).collect()
    }

    fn callee(&self, name: &str) -> Option<Signature> {
        self.module.signature_of(name)
    }
}

/// Verifies a whole module.
pub(crate) fn verify_module(module: &Module) -> Result<(), OpError> {
    let mut names = BTreeSet::new();
    let all_names = module
        .functions
        .iter()
        .map(|f| &f.name)
        .chain(module.text_functions.iter().map(|f| &f.name));
    for name in all_names {
        if !names.insert(name.as_str()) {
            return Err(op_err!(Symbol, "function `@{name}` defined twice"));
        }
    }
    if module.functions.first().map(|f| f.name.as_str()) != Some("main") {
        return Err(op_err!(Symbol, "the first function must be `@main`"));
    }
    for f in &module.functions {
        verify_function(module, f)
            .map_err(|e| OpError { message: format!("in `@{}`: {}", f.name, e.message), ..e })?;
    }
    Ok(())
}

fn verify_function(module: &Module, f: &Function) -> Result<(), OpError> {
    if f.regions.is_empty() {
        return Err(op_err!(Verify, "function has no body"));
    }
    if f.param_attrs.len() != f.params.len() {
        return Err(op_err!(Verify, "parameter attributes do not match the parameters"));
    }
    if f.result_attrs.len() != f.results.len() {
        return Err(op_err!(Verify, "result attributes do not match the results"));
    }
    for (i, p) in f.params.iter().enumerate() {
        if f.values.get(i) != Some(p) {
            return Err(op_err!(Verify, "parameter {i} type {p} disagrees with its value"));
        }
    }
    let cx = Cx { module, func: f };
    let mut visible: HashSet<ValueId> = (0..f.params.len() as u32).map(ValueId).collect();
    let mut seen_regions = HashSet::new();
    verify_region(&cx, RegionId(0), &mut visible, &mut seen_regions)?;
    let got: Vec<TensorType> = f.body().results.iter().map(|v| f.ty(*v).clone()).collect();
    if got != f.results {
        return Err(op_err!(Verify, "returns {} but declares {}", list(&got), list(&f.results)));
    }
    Ok(())
}

fn verify_region(
    cx: &Cx<'_>,
    region: RegionId,
    visible: &mut HashSet<ValueId>,
    seen_regions: &mut HashSet<RegionId>,
) -> Result<(), OpError> {
    let f = cx.func;
    if region.0 as usize >= f.regions.len() || !seen_regions.insert(region) {
        return Err(op_err!(Verify, "region {} missing or used twice", region.0));
    }
    let mut defined_here = Vec::new();
    for instr in &f.region(region).instrs {
        let name = instr.op.name();
        for v in instr.op.operands() {
            if !visible.contains(&v) {
                return Err(op_err!(
                    Verify,
                    "{name} uses %{} before it is defined or out of scope",
                    v.0
                ));
            }
        }
        let args = instr.op.region_args();
        for a in args {
            if a.0 as usize >= f.values.len() || !visible.insert(*a) {
                return Err(op_err!(Verify, "{name} block argument %{} defined twice", a.0));
            }
        }
        for r in instr.op.regions() {
            verify_region(cx, r, visible, seen_regions)?;
        }
        for a in args {
            visible.remove(a);
        }
        let types = infer(&instr.op, cx)
            .map_err(|e| OpError { message: format!("{name}: {}", e.message), ..e })?;
        let recorded: Vec<TensorType> = instr.results.iter().map(|v| f.ty(*v).clone()).collect();
        if types != recorded {
            return Err(op_err!(
                Verify,
                "{name} results recorded as {} but the op gives {}",
                list(&recorded),
                list(&types)
            ));
        }
        for r in &instr.results {
            if !visible.insert(*r) {
                return Err(op_err!(Verify, "{name} redefines %{}", r.0));
            }
            defined_here.push(*r);
        }
    }
    for v in &f.region(region).results {
        if !visible.contains(v) {
            return Err(op_err!(Verify, "region returns %{} which is not in scope", v.0));
        }
    }
    // Values of a nested region are not visible after it.
    if region.0 != 0 {
        for v in defined_here {
            visible.remove(&v);
        }
    }
    Ok(())
}
