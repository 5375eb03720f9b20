//! How the process's C allocator serves the CPU plugin's large temporaries.
//!
//! XLA:CPU allocates a program's temporary buffers with `malloc` on every run and frees them
//! when the run ends. glibc maps any block above its mmap threshold (at most 32 MiB, however it
//! adapts) fresh from the kernel and unmaps it on free, so each run of a program whose
//! temporaries are that large faults in and zeroes every page again: attention at
//! f32[4,8,512,64], whose scores are 32 MiB, took 8,212 minor faults and 19.3 ms a call, against
//! 0 faults and 10.7 ms once such blocks came from the heap and stayed there
//! (docs/perf-log.md). PyTorch's own CPU tensors come from the same `malloc`, so eager code in
//! the same process gains alike.
//!
//! [`retain_large_blocks`] raises glibc's mmap threshold to [`MMAP_THRESHOLD`] and its trim
//! threshold to [`TRIM_THRESHOLD`]: blocks up to 256 MiB come from the heap, and up to 512 MiB
//! of free memory at the heap's top stays mapped for the next run. The cost is resident memory:
//! a process keeps up to that much free memory mapped after a peak instead of handing it back.
//! It is applied once per process, before the first CPU client is created, unless the user
//! chose the allocator's thresholds (glibc's `MALLOC_MMAP_THRESHOLD_` or
//! `MALLOC_TRIM_THRESHOLD_`, or `GLIBC_TUNABLES` naming them) or set `TPUK_MALLOC=keep`.

use std::sync::OnceLock;

/// Blocks up to this many bytes come from the heap rather than fresh mappings (256 MiB).
pub const MMAP_THRESHOLD: usize = 256 << 20;
/// Free memory at the heap's top kept mapped, up to this many bytes (512 MiB).
pub const TRIM_THRESHOLD: usize = 512 << 20;

/// What [`retain_large_blocks`] did, once per process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MallocPolicy {
    /// The thresholds were raised to [`MMAP_THRESHOLD`] and [`TRIM_THRESHOLD`].
    Retained,
    /// The user chose the allocator's thresholds (the setting named): left as they are.
    User(String),
    /// `TPUK_MALLOC=keep`: the allocator's defaults were kept.
    Kept,
    /// Not glibc, or glibc refused a threshold (the reason): nothing changed.
    Unsupported(String),
}

impl MallocPolicy {
    /// A short name: `retained`, `user`, `kept` or `unsupported`.
    pub fn name(&self) -> &'static str {
        match self {
            MallocPolicy::Retained => "retained",
            MallocPolicy::User(_) => "user",
            MallocPolicy::Kept => "kept",
            MallocPolicy::Unsupported(_) => "unsupported",
        }
    }

    /// The policy in words.
    pub fn detail(&self) -> String {
        match self {
            MallocPolicy::Retained => format!(
                "blocks up to {} MiB come from the heap and up to {} MiB of free memory stays \
                 mapped, so programs' temporaries are not faulted in again on every run \
                 (TPUK_MALLOC=keep keeps the allocator's defaults)",
                MMAP_THRESHOLD >> 20,
                TRIM_THRESHOLD >> 20
            ),
            MallocPolicy::User(setting) => {
                format!("the allocator's thresholds as the user set them ({setting})")
            }
            MallocPolicy::Kept => "the allocator's defaults (TPUK_MALLOC=keep)".to_owned(),
            MallocPolicy::Unsupported(why) => format!("the allocator's defaults: {why}"),
        }
    }
}

/// The user's own choice of glibc's thresholds in `vars` (name, value), if any.
fn user_setting<'a>(vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<String> {
    for (name, value) in vars {
        match name {
            "MALLOC_MMAP_THRESHOLD_" | "MALLOC_TRIM_THRESHOLD_" => {
                return Some(format!("{name}={value}"));
            }
            "GLIBC_TUNABLES"
                if value.contains("glibc.malloc.mmap_threshold")
                    || value.contains("glibc.malloc.trim_threshold") =>
            {
                return Some(format!("{name}={value}"));
            }
            _ => {}
        }
    }
    None
}

/// The policy `vars` (the process's environment) ask for, before anything is applied: `None`
/// when the thresholds are to be raised.
fn requested<'a>(
    vars: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
) -> Option<MallocPolicy> {
    if let Some(setting) = user_setting(vars.clone()) {
        return Some(MallocPolicy::User(setting));
    }
    vars.into_iter()
        .any(|(name, value)| name == "TPUK_MALLOC" && value == "keep")
        .then_some(MallocPolicy::Kept)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> MallocPolicy {
    use std::os::raw::c_int;
    unsafe extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    // glibc's malloc.h: M_TRIM_THRESHOLD -1, M_MMAP_THRESHOLD -3.
    const M_TRIM_THRESHOLD: c_int = -1;
    const M_MMAP_THRESHOLD: c_int = -3;
    // SAFETY: mallopt only sets allocator parameters under the allocator's own lock; the
    // values fit a c_int.
    unsafe {
        if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD as c_int) != 1 {
            return MallocPolicy::Unsupported(format!(
                "glibc refused an mmap threshold of {MMAP_THRESHOLD} bytes"
            ));
        }
        if mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD as c_int) != 1 {
            return MallocPolicy::Unsupported(format!(
                "glibc refused a trim threshold of {TRIM_THRESHOLD} bytes"
            ));
        }
    }
    MallocPolicy::Retained
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> MallocPolicy {
    MallocPolicy::Unsupported("the process does not use glibc's allocator".to_owned())
}

static POLICY: OnceLock<MallocPolicy> = OnceLock::new();

/// Raises glibc's mmap and trim thresholds once per process (see the module documentation),
/// unless the environment says otherwise; returns what was done. Later calls return the first
/// call's answer and change nothing. The Python bridge calls it before it creates a CPU client;
/// a Rust program that wants the same calls it itself.
pub fn retain_large_blocks() -> MallocPolicy {
    POLICY
        .get_or_init(|| {
            let env: Vec<(String, String)> = std::env::vars().collect();
            let vars = env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            requested(vars).unwrap_or_else(apply)
        })
        .clone()
}

/// What [`retain_large_blocks`] did, or `None` before it was called.
pub fn malloc_policy() -> Option<MallocPolicy> {
    POLICY.get().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_thresholds_win_over_ours_and_over_keep() {
        let vars = [("TPUK_MALLOC", "keep"), ("MALLOC_MMAP_THRESHOLD_", "1048576")];
        assert_eq!(
            requested(vars.iter().copied()),
            Some(MallocPolicy::User("MALLOC_MMAP_THRESHOLD_=1048576".into()))
        );
        let tunables = [("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")];
        assert_eq!(requested(tunables.iter().copied()).map(|p| p.name()), Some("user"));
        // A tunable about something else is not a choice of thresholds.
        let other = [("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")];
        assert_eq!(requested(other.iter().copied()), None);
    }

    #[test]
    fn keep_keeps_the_defaults_and_nothing_asks_for_the_raise() {
        assert_eq!(requested([("TPUK_MALLOC", "keep")].iter().copied()), Some(MallocPolicy::Kept));
        assert_eq!(requested([("TPUK_MALLOC", "other")].iter().copied()), None);
        assert_eq!(requested(std::iter::empty()), None);
    }
}
