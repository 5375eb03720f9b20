//! Text helpers shared by the IR printers (StableHLO and Mosaic): symbol quoting and the
//! positional names of values.

use crate::ir::{ValueId, escape};

/// `@name`, quoted when it is not a bare identifier.
pub(crate) fn symbol(name: &str) -> String {
    let bare = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'));
    if bare { format!("@{name}") } else { format!("@\"{}\"", escape(name)) }
}

/// Positional value names: parameters `%argN`, every other value `%N` in the order it is bound
/// (an op with several results `%N:k`, each used as `%N#i`).
#[derive(Debug)]
pub(crate) struct Names {
    names: Vec<String>,
    next: usize,
}

impl Names {
    /// Names for `values` values, the first `params` of them parameters.
    pub(crate) fn new(values: usize, params: usize) -> Names {
        let mut names = vec![String::new(); values];
        for (i, name) in names.iter_mut().enumerate().take(params) {
            *name = format!("%arg{i}");
        }
        Names { names, next: 0 }
    }

    pub(crate) fn name(&self, v: ValueId) -> &str {
        &self.names[v.0 as usize]
    }

    /// `%a, %b`.
    pub(crate) fn list(&self, vs: &[ValueId]) -> String {
        let parts: Vec<&str> = vs.iter().map(|v| self.name(*v)).collect();
        parts.join(", ")
    }

    /// Gives `v` the next positional name.
    pub(crate) fn fresh(&mut self, v: ValueId) {
        self.names[v.0 as usize] = format!("%{}", self.next);
        self.next += 1;
    }

    /// Names an op's results; returns the left-hand side (`%3 = ` or `%3:2 = `).
    pub(crate) fn bind(&mut self, results: &[ValueId]) -> String {
        match results {
            [] => String::new(),
            [one] => {
                self.fresh(*one);
                format!("{} = ", self.name(*one))
            }
            many => {
                let base = format!("%{}", self.next);
                self.next += 1;
                for (i, v) in many.iter().enumerate() {
                    self.names[v.0 as usize] = format!("{base}#{i}");
                }
                format!("{base}:{} = ", many.len())
            }
        }
    }
}
