//! How many vectors of elements XLA:CPU's vectorized loops keep in flight.
//!
//! LLVM's loop vectorizer chooses an interleave count for each loop from its cost model, and
//! for the loops XLA:CPU emits for elementwise fusions it chooses 1: an iteration takes one
//! vector of elements through the fusion's whole chain of dependent operations. A loop of
//! transcendental ops (`exp` is a polynomial, a chain of fused multiply-adds) then runs at
//! that chain's latency, not at the core's throughput. With 8 vectors in flight, `exp` over
//! f32[2048,2048] took 0.87 ms against 1.39, and a loop of eight `silu`s 5.6 ms against 16.3
//! (docs/perf-log.md).
//!
//! The count reaches LLVM only through the process's `XLA_FLAGS`
//! (`--xla_backend_extra_options`, a map the compile options' per-compile overrides cannot
//! set), which the plugin reads at its first compile. [`interleave_vector_loops`] appends it
//! there once, before the first CPU client is created, unless `XLA_FLAGS` already names
//! `xla_backend_extra_options` (the user's LLVM options stand) or `TPUK_VECTOR_INTERLEAVE`
//! gives another count (1 to 64) or `off`. The compile cache's keys include `XLA_FLAGS`, so a
//! program compiled under another count is never served for this one.

use std::sync::OnceLock;

use super::xla_flags_name;

/// The interleave count set when nothing says otherwise.
pub const VECTOR_INTERLEAVE: u32 = 8;

/// XLA's flag that carries options to LLVM.
const BACKEND_OPTIONS_FLAG: &str = "xla_backend_extra_options";

/// What [`interleave_vector_loops`] did, once per process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InterleavePolicy {
    /// `XLA_FLAGS` was given `-force-vector-interleave` with this count.
    Set(u32),
    /// `XLA_FLAGS` already named `xla_backend_extra_options`: left as it is.
    User,
    /// `TPUK_VECTOR_INTERLEAVE=off`: LLVM's own choice.
    Off,
}

impl InterleavePolicy {
    /// A short name: `set`, `user` or `off`.
    pub fn name(&self) -> &'static str {
        match self {
            InterleavePolicy::Set(_) => "set",
            InterleavePolicy::User => "user",
            InterleavePolicy::Off => "off",
        }
    }

    /// The policy in words.
    pub fn detail(&self) -> String {
        match self {
            InterleavePolicy::Set(n) => format!(
                "vectorized loops interleave {n} vectors (XLA_FLAGS \
                 --{BACKEND_OPTIONS_FLAG}=-force-vector-interleave={n}; TPUK_VECTOR_INTERLEAVE \
                 sets another count or off)"
            ),
            InterleavePolicy::User => {
                format!("LLVM's options as the user's XLA_FLAGS set them ({BACKEND_OPTIONS_FLAG})")
            }
            InterleavePolicy::Off => {
                "LLVM's own interleave counts (TPUK_VECTOR_INTERLEAVE=off)".to_owned()
            }
        }
    }
}

/// The policy asked for by `setting` (`TPUK_VECTOR_INTERLEAVE`, if set) and whether the
/// user's `XLA_FLAGS` names the backend options flag; an error names a setting that is neither
/// a count from 1 to 64 nor `off`.
fn requested(setting: Option<&str>, user_flags: bool) -> Result<InterleavePolicy, String> {
    let count = match setting.map(str::trim) {
        None => VECTOR_INTERLEAVE,
        Some(v) if v.eq_ignore_ascii_case("off") => return Ok(InterleavePolicy::Off),
        Some(v) => match v.parse::<u32>() {
            Ok(n @ 1..=64) => n,
            _ => {
                return Err(format!(
                    "TPUK_VECTOR_INTERLEAVE={v:?} is not an interleave count (a whole number \
                     from 1 to 64, or off)"
                ));
            }
        },
    };
    Ok(if user_flags { InterleavePolicy::User } else { InterleavePolicy::Set(count) })
}

/// `flags` (the process's `XLA_FLAGS`, maybe empty) with the interleave count appended.
fn with_count(flags: &str, n: u32) -> String {
    let ours = format!("--{BACKEND_OPTIONS_FLAG}=-force-vector-interleave={n}");
    if flags.trim().is_empty() { ours } else { format!("{flags} {ours}") }
}

static POLICY: OnceLock<Result<InterleavePolicy, String>> = OnceLock::new();

/// Sets XLA:CPU's loop interleave count once per process (see the module documentation),
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
            if let InterleavePolicy::Set(n) = policy {
                let flags = with_count(&std::env::var("XLA_FLAGS").unwrap_or_default(), n);
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
    fn the_default_is_set_unless_the_user_named_the_flag_or_turned_it_off() {
        assert_eq!(requested(None, false), Ok(InterleavePolicy::Set(VECTOR_INTERLEAVE)));
        assert_eq!(requested(Some(" 4 "), false), Ok(InterleavePolicy::Set(4)));
        assert_eq!(requested(None, true), Ok(InterleavePolicy::User));
        assert_eq!(requested(Some("OFF"), true), Ok(InterleavePolicy::Off));
        assert_eq!(requested(Some("off"), false), Ok(InterleavePolicy::Off));
    }

    #[test]
    fn a_bad_count_is_named() {
        for bad in ["0", "65", "eight", "-2", ""] {
            let e = requested(Some(bad), false).unwrap_err();
            assert!(e.contains("TPUK_VECTOR_INTERLEAVE") && e.contains("1 to 64"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_count_is_appended_to_the_users_flags() {
        assert_eq!(with_count("", 8), "--xla_backend_extra_options=-force-vector-interleave=8");
        assert_eq!(
            with_count("--xla_dump_to=/tmp/d", 2),
            "--xla_dump_to=/tmp/d --xla_backend_extra_options=-force-vector-interleave=2"
        );
    }
}
