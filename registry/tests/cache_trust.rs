//! The disk tier loads only what this user wrote (the trust rule of `tpu_kernels_registry::cache`):
//! a directory or an entry that group or others can write, or that another user owns, is
//! refused with an error naming it, counted, and the executable compiled instead; nothing is
//! written into a refused directory. What the cache creates is private (directories 0700,
//! entries 0600) and hits as before.
//!
//! Skips loudly without the plugin; fails under `TPUK_REQUIRE_RUNTIMES=1`. The tests that give a
//! file to another user need root (as in CI) and skip loudly otherwise.
#![cfg(unix)]
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[path = "support/cache_programs.rs"]
mod cache_programs;
use cache_programs::{check_numerics, program};
use tpu_kernels_registry::cache::{
    CacheConfig, CacheError, CompileCache, Outcome, UntrustedReason, entry,
};
use tpu_kernels_registry::pjrt::testing::{cpu_client_for_tests, skip_loudly};
use tpu_kernels_registry::pjrt::{Client, CompileOptions};

fn cache_in(dir: &Path) -> CompileCache {
    CompileCache::new(CacheConfig::in_dir(dir))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Compiles `program(1.0)` into `dir` with a trusted cache; returns the entry's path.
fn seed(client: &Client, dir: &Path) -> PathBuf {
    let cache = cache_in(dir);
    let r = cache.get_or_compile(client, &program(1.0), &CompileOptions::new()).unwrap();
    assert_eq!(r.outcome, Outcome::Compiled);
    assert!(r.cache_errors.is_empty(), "{:?}", r.cache_errors);
    cache.entry_path(&r.key).unwrap()
}

/// A new cache on `dir` hits the disk tier for `program(1.0)`, with correct numerics.
fn assert_disk_hit(client: &Client, dir: &Path) {
    let cache = cache_in(dir);
    let r = cache.get_or_compile(client, &program(1.0), &CompileOptions::new()).unwrap();
    assert_eq!(r.outcome, Outcome::DiskHit, "{:?}", r.cache_errors);
    assert!(r.cache_errors.is_empty(), "{:?}", r.cache_errors);
    check_numerics(client, &r.executable, 1.0);
    assert_eq!(cache.stats().untrusted, 0);
}

/// Gives `path` to uid 1, or says why it cannot (not root) and returns false.
fn give_to_another_user(path: &Path) -> bool {
    match std::os::unix::fs::chown(path, Some(1), None) {
        Ok(()) => true,
        Err(e) => {
            skip_loudly(&format!("cannot chown {} to uid 1 (needs root): {e}", path.display()));
            false
        }
    }
}

/// This process's uid, as the owner of a file it just created.
fn our_uid(dir: &Path) -> u32 {
    let probe = dir.join("probe");
    std::fs::write(&probe, b"").unwrap();
    let uid = std::fs::metadata(&probe).unwrap().uid();
    std::fs::remove_file(probe).unwrap();
    uid
}

/// Checks a cache on the refused directory `dir`: it compiles `program(1.0)` correctly instead of
/// loading the valid entry at `path`, reports `reason` naming the directory, counts the refusal,
/// writes nothing, and keeps the executable in memory.
fn assert_dir_refused(client: &Client, dir: &Path, path: &Path, reason: &UntrustedReason) {
    let before = std::fs::read(path).unwrap();
    let before_mtime = std::fs::metadata(path).unwrap().modified().unwrap();
    let cache = cache_in(dir);
    let opts = CompileOptions::new();
    let r = cache.get_or_compile(client, &program(1.0), &opts).unwrap();
    assert_eq!(r.outcome, Outcome::Compiled, "a refused directory must not hit");
    check_numerics(client, &r.executable, 1.0);
    assert_eq!(r.cache_errors.len(), 1, "one refusal, no write attempted: {:?}", r.cache_errors);
    match &*r.cache_errors[0] {
        CacheError::UntrustedDir { dir: d, reason: got } => {
            assert_eq!(d, dir);
            assert_eq!(got, reason);
        }
        other => panic!("expected UntrustedDir, got {other:?}"),
    }
    let message = r.cache_errors[0].to_string();
    assert!(message.contains(&dir.display().to_string()), "{message}");
    assert!(message.contains("neither loads from it nor writes to it"), "{message}");
    assert!(r.cache_errors[0].is_untrusted() && !r.cache_errors[0].is_corrupt_entry());
    let s = cache.stats();
    assert_eq!((s.untrusted, s.disk_hits, s.compiles, s.disk_writes), (1, 0, 1, 0));
    assert_eq!(s.fallbacks(), 1);
    assert!(cache.last_error().is_some_and(|e| e.is_untrusted()));

    // Memory still serves it; another program is compiled and not written either.
    assert_eq!(
        cache.get_or_compile(client, &program(1.0), &opts).unwrap().outcome,
        Outcome::MemoryHit
    );
    let other = cache.get_or_compile(client, &program(2.0), &opts).unwrap();
    assert_eq!(other.outcome, Outcome::Compiled);
    check_numerics(client, &other.executable, 2.0);
    assert!(!cache.entry_path(&other.key).unwrap().exists(), "written into a refused directory");
    let s = cache.stats();
    assert_eq!((s.untrusted, s.disk_writes), (2, 0));
    assert_eq!(std::fs::read(path).unwrap(), before, "the entry was touched");
    assert_eq!(std::fs::metadata(path).unwrap().modified().unwrap(), before_mtime);
    let names: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "nothing but the seeded entry: {names:?}");
}

/// Checks a cache on a trusted directory refuses the untrusted (but valid) entry at `path` with
/// `reason`, compiles correctly, and replaces the entry by a private one of this user's.
fn assert_entry_refused_and_replaced(
    client: &Client,
    dir: &Path,
    path: &Path,
    reason: &UntrustedReason,
) {
    let cache = cache_in(dir);
    let r = cache.get_or_compile(client, &program(1.0), &CompileOptions::new()).unwrap();
    assert_eq!(r.outcome, Outcome::Compiled, "an untrusted entry must not be loaded");
    check_numerics(client, &r.executable, 1.0);
    assert_eq!(r.cache_errors.len(), 1, "{:?}", r.cache_errors);
    match &*r.cache_errors[0] {
        CacheError::UntrustedEntry { path: p, reason: got } => {
            assert_eq!(p, path);
            assert_eq!(got, reason);
        }
        other => panic!("expected UntrustedEntry, got {other:?}"),
    }
    let message = r.cache_errors[0].to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    let s = cache.stats();
    assert_eq!((s.untrusted, s.disk_hits, s.compiles, s.disk_writes), (1, 0, 1, 1));

    // Replaced: private, ours, valid, and the next instance hits it.
    let meta = std::fs::metadata(path).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(meta.uid(), our_uid(dir));
    assert!(entry::decode(&std::fs::read(path).unwrap(), &r.key).is_ok());
    assert_disk_hit(client, dir);
}

#[test]
fn a_fresh_directory_and_its_parents_are_created_private_and_hit() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().join("tpu-kernels");
    let dir = parent.join("compile");
    let path = seed(&client, &dir);
    assert_eq!(mode(&parent), 0o700, "a parent the cache created");
    assert_eq!(mode(&dir), 0o700, "the cache directory");
    assert_eq!(mode(&path), 0o600, "an entry");
    assert_disk_hit(&client, &dir);
}

#[test]
fn an_existing_0755_directory_is_trusted_and_left_as_it_is() {
    // What older versions created (create_dir_all under the usual umask).
    let Some(client) = cpu_client_for_tests(1) else { return };
    let tmp = tempfile::tempdir().unwrap();
    chmod(tmp.path(), 0o755);
    let old_entry = seed(&client, tmp.path());
    // An entry an older version wrote 0644.
    chmod(&old_entry, 0o644);
    assert_disk_hit(&client, tmp.path());
    assert_eq!(mode(tmp.path()), 0o755, "the cache must not chmod a directory it did not create");
    assert_eq!(mode(&old_entry), 0o644);
}

#[test]
fn a_group_or_other_writable_directory_is_refused_and_compiling_still_works() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    for bits in [0o770, 0o775, 0o703, 0o1777] {
        let tmp = tempfile::tempdir().unwrap();
        let path = seed(&client, tmp.path());
        chmod(tmp.path(), bits);
        let reason = UntrustedReason::Writable { mode: bits };
        assert_dir_refused(&client, tmp.path(), &path, &reason);
        let message = CacheError::UntrustedDir { dir: tmp.path().into(), reason }.to_string();
        assert!(message.contains(&format!("mode {bits:04o}")), "{message}");
        // Its owner fixes it: trusted again.
        chmod(tmp.path(), 0o700);
        assert_disk_hit(&client, tmp.path());
    }
}

#[test]
fn a_group_or_other_writable_entry_is_refused_and_replaced() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    for bits in [0o664, 0o660, 0o646] {
        let tmp = tempfile::tempdir().unwrap();
        let path = seed(&client, tmp.path());
        chmod(&path, bits);
        let reason = UntrustedReason::Writable { mode: bits };
        assert_entry_refused_and_replaced(&client, tmp.path(), &path, &reason);
    }
}

#[test]
fn an_entry_owned_by_another_user_is_refused_and_replaced() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let path = seed(&client, tmp.path());
    if !give_to_another_user(&path) {
        return;
    }
    let reason = UntrustedReason::Owner { owner: 1, user: our_uid(tmp.path()) };
    let message = CacheError::UntrustedEntry { path: path.clone(), reason: reason.clone() };
    let message = message.to_string();
    assert!(message.contains("owned by uid 1, not by this user (uid "), "{message}");
    assert_entry_refused_and_replaced(&client, tmp.path(), &path, &reason);
}

#[test]
fn a_directory_owned_by_another_user_is_refused() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("compile");
    let path = seed(&client, &dir);
    let user = our_uid(tmp.path());
    if !give_to_another_user(&dir) {
        return;
    }
    assert_dir_refused(&client, &dir, &path, &UntrustedReason::Owner { owner: 1, user });
}
