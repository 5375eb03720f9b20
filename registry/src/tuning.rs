//! A program tried under more than one set of compiler settings, keeping the faster.
//!
//! XLA:CPU hands row reductions to YNNPACK fusions, which run a softmax or a layer norm well
//! on their own. But a YNNPACK fusion takes no loop fusion into itself, so XLA writes out the
//! values such a fusion reads or shares: in a large graph program that can add whole passes
//! over its largest tensors (cross entropy's forward and backward at a 32k vocabulary took
//! 1.5x Inductor's time with them and 1.13x without, while the eager softmax kernel took 1.4x
//! longer without them; docs/perf-log.md). Which settings win depends on the program, so a
//! large one is compiled under each of [`cpu_variants`] and its first runs, real calls, take
//! turns; from then on it runs under the variant whose fastest run was the fastest.

use std::sync::Mutex;

use crate::pjrt::{CompileOptions, OptionOverride};

/// The least bytes a program reads and writes in a run (its parameters and results) for it
/// to be tuned: below it, a pass over its tensors costs less than a second compile is worth.
/// `TPUK_TUNE_MIN_BYTES` overrides it (`off`: never).
pub const TUNE_MIN_BYTES: usize = 64 << 20;

/// Timed runs of each variant before the choice.
pub const TRIES: usize = 2;

/// XLA:CPU's flag for the YNNPACK fusion types.
const YNN_FUSION_FLAG: &str = "xla_cpu_experimental_ynn_fusion_type";

/// The least bytes for tuning, from `TPUK_TUNE_MIN_BYTES` or [`TUNE_MIN_BYTES`]; `None` when
/// tuning is off (`off`), or when the process's `XLA_FLAGS` chooses the YNNPACK fusion types
/// itself (the variants would override it).
pub fn tune_min_bytes() -> Option<usize> {
    if crate::pjrt::xla_flags_name(YNN_FUSION_FLAG) {
        return None;
    }
    match std::env::var("TPUK_TUNE_MIN_BYTES") {
        Ok(v) if v.trim().eq_ignore_ascii_case("off") => None,
        Ok(v) => Some(v.trim().parse().unwrap_or(TUNE_MIN_BYTES)),
        Err(_) => Some(TUNE_MIN_BYTES),
    }
}

/// The YNNPACK fusion types of the plugin's default less its reductions: dots and
/// convolutions, one op a fusion (the plugin's own default is these and `REDUCE`, read from
/// its optimized HLO; an override takes the full list, not `XLA_FLAGS`' `-reduce`). A plugin
/// without these names fails the variant's compile, and the program then runs untuned.
const YNN_WITHOUT_REDUCE: &str =
    "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION";

/// The settings a CPU program is tried under, each with its label: `base` itself first
/// (`"default"`), then `base` without YNNPACK's reduction fusions (`"ynn_reduce_off"`).
pub fn cpu_variants(base: &CompileOptions) -> Vec<(&'static str, CompileOptions)> {
    vec![
        ("default", base.clone()),
        (
            "ynn_reduce_off",
            base.clone()
                .option_override(YNN_FUSION_FLAG, OptionOverride::Str(YNN_WITHOUT_REDUCE.into())),
        ),
    ]
}

/// Which variant a tuned program runs: the variants take turns until each has [`TRIES`]
/// timed runs, then the one whose fastest run was the fastest runs from then on. Shared by
/// the threads that run the program.
#[derive(Debug)]
pub struct Tuner {
    labels: Vec<&'static str>,
    state: Mutex<State>,
}

#[derive(Debug, Clone)]
struct State {
    /// Seconds of each variant's timed runs.
    times: Vec<Vec<f64>>,
    /// Variants that failed to run: never chosen.
    rejected: Vec<bool>,
    chosen: Option<usize>,
}

/// What a [`Tuner`] has seen: per variant its label, its fastest timed run (None before any)
/// and whether it failed; and the variant chosen, once chosen.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    pub variants: Vec<(&'static str, Option<f64>, bool)>,
    pub chosen: Option<&'static str>,
}

impl Tuner {
    /// A tuner over variants with these labels (the first is the default).
    pub fn new(labels: Vec<&'static str>) -> Tuner {
        let n = labels.len();
        Tuner {
            labels,
            state: Mutex::new(State {
                times: vec![Vec::new(); n],
                rejected: vec![false; n],
                chosen: (n == 1).then_some(0),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The variant the next run uses, and whether that run is to be timed (recorded with
    /// [`Tuner::record`]).
    pub fn pick(&self) -> (usize, bool) {
        let s = self.lock();
        if let Some(c) = s.chosen {
            return (c, false);
        }
        let v = (0..self.labels.len())
            .filter(|&v| !s.rejected[v])
            .min_by_key(|&v| s.times[v].len())
            .unwrap_or(0);
        (v, true)
    }

    /// Records a timed run of `variant`; once every variant not rejected has [`TRIES`], chooses.
    pub fn record(&self, variant: usize, seconds: f64) {
        let mut s = self.lock();
        if s.chosen.is_some() || variant >= self.labels.len() {
            return;
        }
        s.times[variant].push(seconds);
        Self::decide(&mut s);
    }

    /// `variant` failed to run: it is never chosen. The default is never rejected (without it
    /// there is nothing to fall back on: its failures are the program's own).
    pub fn reject(&self, variant: usize) {
        let mut s = self.lock();
        if variant == 0 || variant >= self.labels.len() {
            return;
        }
        s.rejected[variant] = true;
        if s.chosen == Some(variant) {
            s.chosen = None;
        }
        Self::decide(&mut s);
    }

    fn decide(s: &mut State) {
        let open: Vec<usize> = (0..s.times.len()).filter(|&v| !s.rejected[v]).collect();
        if open.iter().any(|&v| s.times[v].len() < TRIES) {
            return;
        }
        let best = |v: usize| s.times[v].iter().copied().fold(f64::INFINITY, f64::min);
        s.chosen = open.into_iter().min_by(|&a, &b| best(a).total_cmp(&best(b)));
    }

    /// The chosen variant, once chosen.
    pub fn chosen(&self) -> Option<usize> {
        self.lock().chosen
    }

    /// What the tuner has seen so far.
    pub fn tuning(&self) -> Tuning {
        let s = self.lock();
        Tuning {
            variants: self
                .labels
                .iter()
                .enumerate()
                .map(|(v, l)| {
                    let best = s.times[v].iter().copied().reduce(f64::min);
                    (*l, best, s.rejected[v])
                })
                .collect(),
            chosen: s.chosen.map(|c| self.labels[c]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuner() -> Tuner {
        Tuner::new(vec!["default", "other"])
    }

    #[test]
    fn variants_take_turns_then_the_fastest_runs() {
        let t = tuner();
        let mut order = Vec::new();
        for secs in [5.0, 3.0, 4.0, 3.5] {
            let (v, timed) = t.pick();
            assert!(timed);
            order.push(v);
            t.record(v, secs);
        }
        assert_eq!(order, [0, 1, 0, 1]);
        // The fastest runs: 4.0 for the default, 3.0 for the other.
        assert_eq!(t.chosen(), Some(1));
        assert_eq!(t.pick(), (1, false));
        t.record(0, 0.1); // after the choice, nothing changes it
        assert_eq!(t.chosen(), Some(1));
        let seen = t.tuning();
        assert_eq!(seen.chosen, Some("other"));
        assert_eq!(seen.variants, vec![("default", Some(4.0), false), ("other", Some(3.0), false)]);
    }

    #[test]
    fn a_tie_keeps_the_default() {
        let t = tuner();
        for _ in 0..2 * TRIES {
            let (v, _) = t.pick();
            t.record(v, 1.0);
        }
        assert_eq!(t.chosen(), Some(0));
    }

    #[test]
    fn a_variant_that_fails_is_never_chosen_and_the_default_is_never_rejected() {
        let t = tuner();
        let (v, _) = t.pick();
        t.record(v, 9.0);
        let (v, _) = t.pick();
        assert_eq!(v, 1);
        t.reject(v);
        assert_eq!(t.chosen(), None, "the default still has runs to take");
        let (v, timed) = t.pick();
        assert_eq!((v, timed), (0, true));
        t.record(v, 8.0);
        assert_eq!(t.chosen(), Some(0));
        assert_eq!(t.tuning().variants[1], ("other", None, true));
        let t = tuner();
        t.reject(0);
        assert!(!t.tuning().variants[0].2, "the default is never rejected");
    }

    #[test]
    fn one_variant_is_chosen_from_the_start() {
        let t = Tuner::new(vec!["default"]);
        assert_eq!(t.pick(), (0, false));
    }

    #[test]
    fn the_variants_differ_only_in_the_ynnpack_flag() {
        let base = CompileOptions::new();
        let v = cpu_variants(&base);
        assert_eq!(v[0], ("default", base.clone()));
        let flags: Vec<_> = v[1].1.overrides().collect();
        assert_eq!(flags, vec![(YNN_FUSION_FLAG, &OptionOverride::Str(YNN_WITHOUT_REDUCE.into()))]);
    }
}
