//! How many vectors of elements XLA:CPU's vectorized loops keep in flight.
//!
//! LLVM's loop vectorizer chooses an interleave count for each loop from its cost model. It
//! interleaves only loops it costs as small (`-small-loop-cost`, 20 by default), so for the
//! loops XLA:CPU emits for elementwise fusions of transcendental ops it chooses 1: an iteration
//! takes one vector of elements through the fusion's whole chain of dependent operations, and
//! the loop runs at that chain's latency (`exp` is a polynomial, a chain of fused
//! multiply-adds), not at the core's throughput.
//!
//! [`interleave_vector_loops`] raises that cost limit to [`SMALL_LOOP_COST`], so LLVM
//! interleaves such loops as far as its register and trip-count limits allow: `exp` over
//! f32[2048,2048] took 1.01 ms against 1.39, a loop of eight `silu`s 8.0 ms against 16.3
//! (docs/perf-log.md). A forced count (`-force-vector-interleave`, `TPUK_VECTOR_INTERLEAVE=N`)
//! went further on large tensors (8: 0.87 and 5.6 ms) but overrides the trip-count limit, and
//! a silu over f32[2,64,16,16] then took 131 us against 43: it is the user's choice, not the
//! default.
//!
//! The options reach LLVM only through the process's `XLA_FLAGS`
//! (`--xla_backend_extra_options`, a map the compile options' per-compile overrides cannot
//! set), which the plugin reads at its first compile. [`interleave_vector_loops`] appends them
//! once, before the first CPU client is created, unless `XLA_FLAGS` already names
//! `xla_backend_extra_options` (the user's LLVM options stand) or `TPUK_VECTOR_INTERLEAVE`
//! says otherwise (`auto`, the default; a count from 1 to 64; or `off`). The compile cache's
//! keys include `XLA_FLAGS`, so a program compiled under other options is never served for
//! these.

use std::sync::OnceLock;

use super::xla_flags_name;

/// The cost below which LLVM interleaves a vectorized loop, under the default policy.
pub const SMALL_LOOP_COST: u32 = 2000;

/// XLA's flag that carries options to LLVM.
const BACKEND_OPTIONS_FLAG: &str = "xla_backend_extra_options";

/// What [`interleave_vector_loops`] did, once per process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InterleavePolicy {
    /// LLVM interleaves loops up to a cost of [`SMALL_LOOP_COST`] (the default).
    Auto,
    /// `TPUK_VECTOR_INTERLEAVE=N`: every vectorized loop interleaves N vectors.
    Forced(u32),
    /// `XLA_FLAGS` already named `xla_backend_extra_options`: left as it is.
    User,
    /// `TPUK_VECTOR_INTERLEAVE=off`: LLVM's own choice.
    Off,
}

impl InterleavePolicy {
    /// A short name: `auto`, `forced`, `user` or `off`.
    pub fn name(&self) -> &'static str {
        match self {
            InterleavePolicy::Auto => "auto",
            InterleavePolicy::Forced(_) => "forced",
            InterleavePolicy::User => "user",
            InterleavePolicy::Off => "off",
        }
    }

    /// The LLVM option this policy adds to `XLA_FLAGS`' backend options, if any.
    pub fn llvm_option(&self) -> Option<String> {
        match self {
            InterleavePolicy::Auto => Some(format!("-small-loop-cost={SMALL_LOOP_COST}")),
            InterleavePolicy::Forced(n) => Some(format!("-force-vector-interleave={n}")),
            InterleavePolicy::User | InterleavePolicy::Off => None,
        }
    }
}

/// The policy asked for by `setting` (`TPUK_VECTOR_INTERLEAVE`, if set) and whether the
/// user's `XLA_FLAGS` names the backend options flag; an error names a setting that is none of
/// `auto`, `off` or a count from 1 to 64.
fn requested(setting: Option<&str>, user_flags: bool) -> Result<InterleavePolicy, String> {
    let policy = match setting.map(str::trim) {
        None => InterleavePolicy::Auto,
        Some(v) if v.eq_ignore_ascii_case("off") => return Ok(InterleavePolicy::Off),
        Some(v) if v.eq_ignore_ascii_case("auto") => InterleavePolicy::Auto,
        Some(v) => match v.parse::<u32>() {
            Ok(n @ 1..=64) => InterleavePolicy::Forced(n),
            _ => {
                return Err(format!(
                    "TPUK_VECTOR_INTERLEAVE={v:?} is not an interleave setting (auto, off, or a \
                     whole number from 1 to 64)"
                ));
            }
        },
    };
    Ok(if user_flags { InterleavePolicy::User } else { policy })
}

/// `flags` (the process's `XLA_FLAGS`, maybe empty) with LLVM option `option` appended.
fn with_option(flags: &str, option: &str) -> String {
    let ours = format!("--{BACKEND_OPTIONS_FLAG}={option}");
    if flags.trim().is_empty() { ours } else { format!("{flags} {ours}") }
}

static POLICY: OnceLock<Result<InterleavePolicy, String>> = OnceLock::new();

/// Sets how XLA:CPU's loops interleave once per process (see the module documentation),
/// unless the environment says otherwise; returns what was done, or the error naming a bad
/// `TPUK_VECTOR_INTERLEAVE` (nothing is changed then). Later calls return the first call's
/// answer and change nothing. Call it before the first CPU client is created and while no other
/// thread reads or writes the environment: the Python bridge does, beside
/// [`super::retain_large_blocks`].
pub fn interleave_vector_loops() -> Result<InterleavePolicy, String> {
    POLICY
        .get_or_init(|| {
            let setting = std::env::var("TPUK_VECTOR_INTERLEAVE").ok();
            let policy = requested(setting.as_deref(), xla_flags_name(BACKEND_OPTIONS_FLAG))?;
            if let Some(option) = policy.llvm_option() {
                let flags = with_option(&std::env::var("XLA_FLAGS").unwrap_or_default(), &option);
                // SAFETY: the caller's contract: no other thread touches the environment now.
                unsafe { std::env::set_var("XLA_FLAGS", flags) };
            }
            Ok(policy)
        })
        .clone()
}

/// What [`interleave_vector_loops`] did, or `None` before it was called.
pub fn interleave_policy() -> Option<Result<InterleavePolicy, String>> {
    POLICY.get().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_the_default_unless_the_user_named_the_flag_or_chose_another() {
        assert_eq!(requested(None, false), Ok(InterleavePolicy::Auto));
        assert_eq!(requested(Some("AUTO"), false), Ok(InterleavePolicy::Auto));
        assert_eq!(requested(Some(" 4 "), false), Ok(InterleavePolicy::Forced(4)));
        assert_eq!(requested(None, true), Ok(InterleavePolicy::User));
        assert_eq!(requested(Some("8"), true), Ok(InterleavePolicy::User));
        assert_eq!(requested(Some("OFF"), true), Ok(InterleavePolicy::Off));
        assert_eq!(requested(Some("off"), false), Ok(InterleavePolicy::Off));
        assert_eq!(InterleavePolicy::Auto.llvm_option().as_deref(), Some("-small-loop-cost=2000"));
        assert_eq!(
            InterleavePolicy::Forced(8).llvm_option().as_deref(),
            Some("-force-vector-interleave=8")
        );
        assert_eq!(InterleavePolicy::Off.llvm_option(), None);
    }

    #[test]
    fn a_bad_setting_is_named() {
        for bad in ["0", "65", "eight", "-2", ""] {
            let e = requested(Some(bad), false).unwrap_err();
            assert!(e.contains("TPUK_VECTOR_INTERLEAVE") && e.contains("1 to 64"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_option_is_appended_to_the_users_flags() {
        assert_eq!(
            with_option("", "-small-loop-cost=2000"),
            "--xla_backend_extra_options=-small-loop-cost=2000"
        );
        assert_eq!(
            with_option("--xla_dump_to=/tmp/d", "-force-vector-interleave=2"),
            "--xla_dump_to=/tmp/d --xla_backend_extra_options=-force-vector-interleave=2"
        );
    }
}
