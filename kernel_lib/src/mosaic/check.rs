//! Checks of a Mosaic kernel before anything reaches libtpu: the verifier (scoping and the type
//! rules, re-run), the tiling rule of block shapes, the coverage of arrays by the grid, and the
//! scoped VMEM the blocks and scratch need on a target.
//!
//! libtpu checks the tiling rule itself (`E2002`) and the VMEM limit (`E1001`), but neither
//! whether an index map leaves its array nor whether the grid writes every block of an output;
//! these are checked here only. A block index read from a scalar-prefetch table is data: its
//! range is not known here (the interpreter checks it on the values it is given), and an
//! output whose blocks it picks must alias an input.

use std::collections::BTreeSet;

use crate::error::{BuildError, ErrorKind};
use crate::ir::{RegionId, ValueId};

use super::ir::{IndexExpr, InferCx, Kernel, Op, infer, op_name};
use super::types::{MType, MemorySpace};

/// The sublane and lane tiling of the last two dims of a block.
pub const TILING: (u64, u64) = (8, 128);

fn error(kernel: &Kernel, op: &'static str, kind: ErrorKind, message: String) -> BuildError {
    BuildError { kernel: kernel.name.clone(), op, kind, message }
}

struct Scope<'a> {
    kernel: &'a Kernel,
    defined: Vec<bool>,
    used_regions: BTreeSet<u32>,
}

impl InferCx for Scope<'_> {
    fn ty(&self, v: ValueId) -> &MType {
        self.kernel.ty(v)
    }
}

fn operands(op: &Op) -> Vec<ValueId> {
    match op {
        Op::Constant { .. } | Op::Iota { .. } => vec![],
        Op::AssumeMultiple { x, .. } => vec![*x],
        Op::For { lo, hi, step, .. } => vec![*lo, *hi, *step],
        Op::Binary(_, a, b) | Op::Compare(_, a, b) => vec![*a, *b],
        Op::Unary(_, x) | Op::IndexCast(x) => vec![*x],
        Op::Select(c, a, b) => vec![*c, *a, *b],
        Op::Convert { x, .. } | Op::Broadcast { x, .. } | Op::ShapeCast { x, .. } => vec![*x],
        Op::Load { memref, indices, .. } => {
            std::iter::once(*memref).chain(indices.iter().copied()).collect()
        }
        Op::Store { memref, indices, value } => {
            std::iter::once(*memref).chain(indices.iter().copied()).chain([*value]).collect()
        }
        Op::MultiReduce { x, acc, .. } => vec![*x, *acc],
        Op::ScalarLoad { memref, indices } => {
            std::iter::once(*memref).chain(indices.iter().copied()).collect()
        }
        Op::ScalarStore { memref, indices, value } => {
            std::iter::once(*memref).chain(indices.iter().copied()).chain([*value]).collect()
        }
        Op::Matmul { lhs, rhs, acc, .. } => vec![*lhs, *rhs, *acc],
        Op::If { cond, .. } => vec![*cond],
    }
}

impl Scope<'_> {
    fn region(&mut self, r: RegionId) -> Result<(), BuildError> {
        let kernel = self.kernel;
        if !self.used_regions.insert(r.0) || r.0 as usize >= kernel.regions.len() {
            return Err(error(
                kernel,
                "region",
                ErrorKind::Verify,
                format!("region {} is used twice or missing", r.0),
            ));
        }
        let mut defined_here = Vec::new();
        for instr in &kernel.region(r).instrs {
            let name = op_name(&instr.op, self);
            for v in operands(&instr.op) {
                if !self.defined.get(v.0 as usize).copied().unwrap_or(false) {
                    let m = format!(
                        "operand %{} is not defined before the op in an enclosing region",
                        v.0
                    );
                    return Err(error(kernel, name, ErrorKind::ForeignValue, m));
                }
            }
            let types = infer(&instr.op, self).map_err(|e| e.in_kernel(&kernel.name, name))?;
            let recorded: Vec<&MType> = instr.results.iter().map(|v| kernel.ty(*v)).collect();
            if types.iter().collect::<Vec<_>>() != recorded {
                let m = format!("results recorded as {recorded:?}, the rules give {types:?}");
                return Err(error(kernel, name, ErrorKind::Verify, m));
            }
            if let Op::If { then, .. } = &instr.op {
                self.region(*then)?;
            }
            if let Op::For { iv, body, .. } = &instr.op {
                // The induction variable is defined inside the body only.
                self.defined[iv.0 as usize] = true;
                self.region(*body)?;
                self.defined[iv.0 as usize] = false;
            }
            for v in &instr.results {
                self.defined[v.0 as usize] = true;
                defined_here.push(*v);
            }
        }
        // Values of a nested region are not visible after it.
        if r.0 != 0 {
            for v in defined_here {
                self.defined[v.0 as usize] = false;
            }
        }
        Ok(())
    }
}

/// Scoping and types: every operand is defined before its op in the same or an enclosing
/// region, and every result has the type the rules give.
pub fn verify(kernel: &Kernel) -> Result<(), BuildError> {
    let mut defined = vec![false; kernel.values.len()];
    for d in defined.iter_mut().take(kernel.num_args()) {
        *d = true;
    }
    let mut scope = Scope { kernel, defined, used_regions: BTreeSet::new() };
    scope.region(RegionId(0))
}

fn window_name(kernel: &Kernel, i: usize) -> String {
    if i < kernel.num_inputs {
        format!("input {i}")
    } else {
        format!("output {}", i - kernel.num_inputs)
    }
}

/// The tiling rule: each of a block's last two dims is a multiple of [`TILING`] (sublanes,
/// lanes) or the whole array dim; a 1-d block is a multiple of 128 lanes or the whole array.
pub fn tiling(kernel: &Kernel) -> Result<(), BuildError> {
    for (i, w) in kernel.windows.iter().enumerate() {
        let dims = w.array.shape.static_dims().unwrap_or_default();
        let name = window_name(kernel, i);
        for (d, (b, a)) in w.block.iter().zip(&dims).enumerate() {
            if *b == 0 || b > a {
                let m = format!(
                    "{name}: block {:?} dim {d} is {b}, outside 1..={a} of {}",
                    w.block, w.array
                );
                return Err(error(kernel, "window_params", ErrorKind::Tiling, m));
            }
        }
        let r = dims.len();
        let rule = |d: usize, tile: u64| w.block[d] % tile == 0 || w.block[d] == dims[d];
        let ok = match r {
            0 => true,
            1 => rule(0, TILING.1),
            _ => rule(r - 1, TILING.1) && rule(r - 2, TILING.0),
        };
        if !ok {
            let m = format!(
                "{name}: block {:?} of {} breaks the tiling rule: its last two dims must be multiples of ({}, {}) or equal the array's",
                w.block, w.array, TILING.0, TILING.1
            );
            return Err(error(kernel, "window_params", ErrorKind::Tiling, m));
        }
    }
    Ok(())
}

/// Every index map stays inside its array at every grid step, and the grid writes every block
/// of every output not aliased to an input. Blocks must divide their arrays (partial edge
/// blocks are refused).
pub fn coverage(kernel: &Kernel) -> Result<(), BuildError> {
    let steps: u64 = kernel.grid.iter().product();
    for (i, w) in kernel.windows.iter().enumerate() {
        let dims = w.array.shape.static_dims().unwrap_or_default();
        let name = window_name(kernel, i);
        let counts: Vec<u64> = dims.iter().zip(&w.block).map(|(a, b)| a / b).collect();
        if let Some(d) = dims.iter().zip(&w.block).position(|(a, b)| a % b != 0) {
            let m =
                format!("{name}: block {:?} does not divide {} along dim {d}", w.block, w.array);
            return Err(error(kernel, "window_params", ErrorKind::Coverage, m));
        }
        let output = i >= kernel.num_inputs;
        let aliased = output && kernel.aliases.iter().any(|(_, o)| *o + kernel.num_inputs == i);
        // A block index read from a prefetch table is known only when the kernel runs: its
        // range is not checked here, and an output whose blocks it picks must alias an input,
        // so that blocks the data does not pick keep defined contents.
        if output && !aliased && kernel.data_dependent(i) {
            let m = format!(
                "{name}: its index map reads a scalar-prefetch table, so which blocks the grid writes depends on the data; alias it to an input (`aliases(o = x)`) so unwritten blocks keep that input's contents"
            );
            return Err(error(kernel, "window_params", ErrorKind::Coverage, m));
        }
        let mut seen: BTreeSet<Vec<Option<i64>>> = BTreeSet::new();
        let mut point = vec![0u64; kernel.grid.len()];
        for _ in 0..steps {
            let block: Vec<Option<i64>> = w
                .index_map
                .iter()
                .map(|e| match e {
                    IndexExpr::Grid(axis) => Some(point[*axis] as i64),
                    IndexExpr::GridDiv { axis, by, modulo } => {
                        let q = point[*axis] / (*by).max(1);
                        Some(modulo.map_or(q, |m| q % m.max(1)) as i64)
                    }
                    IndexExpr::Const(c) => Some(*c),
                    IndexExpr::Prefetch { .. } => None,
                })
                .collect();
            let outside = |(b, n): (&Option<i64>, &u64)| b.is_some_and(|b| b < 0 || b as u64 >= *n);
            if let Some(d) = block.iter().zip(&counts).position(outside) {
                let block: Vec<String> = block
                    .iter()
                    .map(|b| b.map_or_else(|| "(prefetched)".to_owned(), |b| b.to_string()))
                    .collect();
                let m = format!(
                    "{name}: at grid point {point:?} the index map gives block [{}], outside the {counts:?} blocks of {} (dim {d})",
                    block.join(", "),
                    w.array
                );
                return Err(error(kernel, "window_params", ErrorKind::Coverage, m));
            }
            if output {
                seen.insert(block);
            }
            // The next grid point, last axis fastest.
            for axis in (0..point.len()).rev() {
                point[axis] += 1;
                if point[axis] < kernel.grid[axis] {
                    break;
                }
                point[axis] = 0;
            }
        }
        let total: u64 = counts.iter().product();
        // An output aliased to an input keeps the input's contents where the grid does not
        // write (an in-place update of some blocks).
        if output && !aliased && (seen.len() as u64) < total {
            let m = format!(
                "{name}: the grid {:?} writes {} of the {total} blocks of {} (blocks {:?}): the rest would be left unwritten",
                kernel.grid,
                seen.len(),
                w.array,
                w.block
            );
            return Err(error(kernel, "window_params", ErrorKind::Coverage, m));
        }
    }
    Ok(())
}

/// The VMEM of one TensorCore of the generations the project compiles for (v5e and v6e both
/// have 128 MiB): the most a kernel's `vmem_limit_bytes` may ask for.
pub const VMEM_CAPACITY: u64 = 128 << 20;

/// A TPU generation's scoped VMEM budget (libtpu's default; `vmem_limit_bytes` raises it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub name: &'static str,
    pub scoped_vmem_bytes: u64,
}

impl Target {
    pub const V5E: Target = Target { name: "v5e", scoped_vmem_bytes: 16 << 20 };
    pub const V6E: Target = Target { name: "v6e", scoped_vmem_bytes: 32 << 20 };

    /// The scoped VMEM `kernel` may use on this target: its own `vmem_limit_bytes`, or the
    /// target's default.
    pub fn limit_for(self, kernel: &Kernel) -> u64 {
        kernel.vmem_limit_bytes.unwrap_or(self.scoped_vmem_bytes)
    }
}

/// The scoped VMEM a kernel needs: every window's block twice (the pipeline double-buffers
/// them), plus the scratch buffers.
pub fn vmem_bytes(kernel: &Kernel) -> u64 {
    let windows: u64 = kernel
        .windows
        .iter()
        .map(|w| 2 * w.block.iter().product::<u64>() * w.array.dtype.byte_size() as u64)
        .sum();
    let vmem_scratch = kernel.scratch.iter().filter(|s| s.space() == Some(MemorySpace::Vmem));
    windows + vmem_scratch.map(MType::byte_size).sum::<u64>()
}

/// The kernel fits `target`'s scoped VMEM.
pub fn vmem(kernel: &Kernel, target: Target) -> Result<(), BuildError> {
    let need = vmem_bytes(kernel);
    let limit = target.limit_for(kernel);
    if need > limit {
        let whose = match kernel.vmem_limit_bytes {
            Some(_) => {
                format!("the kernel's vmem_limit_bytes of {limit} bytes (on {})", target.name)
            }
            None => format!("{}'s scoped limit of {limit} bytes", target.name),
        };
        let m =
            format!("blocks (double-buffered) and scratch need {need} bytes of VMEM, over {whose}");
        return Err(error(kernel, "vmem", ErrorKind::VmemLimit, m));
    }
    Ok(())
}
