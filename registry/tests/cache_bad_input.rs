//! The compile cache against bad disk state: corrupt, truncated, stale and foreign entries, an
//! entry the plugin refuses, an uncreatable directory, an unreadable and unreplaceable entry.
//! Every case still returns a correct executable, counts the problem, reports a typed error,
//! and repairs what can be repaired.
//!
//! Skips loudly without the plugin; fails under `TPUK_REQUIRE_RUNTIMES=1`.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

use std::path::{Path, PathBuf};

#[path = "support/cache_programs.rs"]
mod cache_programs;
use cache_programs::{check_numerics, program};
use tpu_kernels_registry::cache::{
    CacheConfig, CacheError, CacheKey, CompileCache, CorruptReason, Outcome, entry,
};
use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::pjrt::{Client, CompileOptions};

fn fresh_cache(dir: &Path) -> CompileCache {
    CompileCache::new(CacheConfig::in_dir(dir))
}

/// Temporary files left in `dir` (there must never be any after a call returns).
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.map(|e| e.unwrap().path())
                .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".tmp"))
                .collect()
        })
        .unwrap_or_default()
}

/// Compiles `program(1.0)` into `dir` and returns its key and entry path.
fn seed(client: &Client, dir: &Path) -> (CacheKey, PathBuf) {
    let cache = fresh_cache(dir);
    let r = cache.get_or_compile(client, &program(1.0), &CompileOptions::new()).unwrap();
    assert_eq!(r.outcome, Outcome::Compiled);
    (r.key, cache.entry_path(&r.key).unwrap())
}

/// Damages the entry with `damage`, then checks a new cache instance detects it (with `want`),
/// recompiles correctly, counts it, and replaces the entry with a valid one.
fn corrupt_case(
    client: &Client,
    name: &str,
    damage: impl FnOnce(&Path, &Path),
    want: impl Fn(&CorruptReason) -> bool,
) {
    let dir = tempfile::tempdir().unwrap();
    let (key, path) = seed(client, dir.path());
    damage(dir.path(), &path);

    let cache = fresh_cache(dir.path());
    let r = cache.get_or_compile(client, &program(1.0), &CompileOptions::new()).unwrap();
    assert_eq!(r.outcome, Outcome::Compiled, "{name}");
    check_numerics(client, &r.executable, 1.0);
    assert_eq!(r.cache_errors.len(), 1, "{name}: {:?}", r.cache_errors);
    match &*r.cache_errors[0] {
        CacheError::Corrupt { path: p, reason } => {
            assert_eq!(p, &path, "{name}");
            assert!(want(reason), "{name}: unexpected reason {reason:?}");
        }
        other => panic!("{name}: expected a corrupt entry, got {other:?}"),
    }
    assert!(r.cache_errors[0].is_corrupt_entry());
    let message = r.cache_errors[0].to_string();
    assert!(message.contains("corrupt compile cache entry"), "{name}: {message}");
    let s = cache.stats();
    assert_eq!((s.corrupt_entries, s.misses, s.compiles, s.disk_writes), (1, 1, 1, 1), "{name}");
    assert!(cache.last_error().is_some_and(|e| e.is_corrupt_entry()));

    // Replaced: the file is valid again and the next instance hits it.
    let bytes = std::fs::read(&path).unwrap();
    assert!(entry::decode(&bytes, &key).is_ok(), "{name}: entry not replaced");
    let next = fresh_cache(dir.path());
    let r = next.get_or_compile(client, &program(1.0), &CompileOptions::new()).unwrap();
    assert_eq!(r.outcome, Outcome::DiskHit, "{name}");
    check_numerics(client, &r.executable, 1.0);
    assert!(temp_files(dir.path()).is_empty());
}

fn edit(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(path).unwrap();
    f(&mut bytes);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn flipped_payload_byte_is_a_checksum_error() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    corrupt_case(
        &client,
        "flipped byte",
        |_, p| {
            edit(p, |b| {
                let mid = entry::HEADER_LEN + (b.len() - entry::HEADER_LEN) / 2;
                b[mid] ^= 0x5a;
            })
        },
        |r| *r == CorruptReason::Checksum,
    );
}

#[test]
fn truncated_entries_are_detected() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    corrupt_case(
        &client,
        "truncated payload",
        |_, p| edit(p, |b| b.truncate(b.len() - 100)),
        |r| matches!(r, CorruptReason::Length { expected, found } if found + 100 == *expected),
    );
    corrupt_case(
        &client,
        "truncated header",
        |_, p| edit(p, |b| b.truncate(40)),
        |r| *r == CorruptReason::TooShort { len: 40 },
    );
    corrupt_case(
        &client,
        "empty file",
        |_, p| edit(p, Vec::clear),
        |r| *r == CorruptReason::TooShort { len: 0 },
    );
    corrupt_case(
        &client,
        "appended bytes",
        |_, p| edit(p, |b| b.extend_from_slice(b"junk")),
        |r| matches!(r, CorruptReason::Length { .. }),
    );
}

#[test]
fn wrong_magic_and_stale_version_are_detected() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    corrupt_case(
        &client,
        "wrong magic",
        |_, p| edit(p, |b| b[..8].copy_from_slice(b"GARBAGE!")),
        |r| *r == CorruptReason::BadMagic,
    );
    corrupt_case(
        &client,
        "stale version",
        |_, p| edit(p, |b| b[8..12].copy_from_slice(&(entry::FORMAT_VERSION + 1).to_le_bytes())),
        |r| *r == CorruptReason::Version { found: entry::FORMAT_VERSION + 1 },
    );
}

#[test]
fn another_keys_file_renamed_over_is_detected() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    corrupt_case(
        &client,
        "other key's file",
        |dir, p| {
            let other = fresh_cache(dir);
            let r = other.get_or_compile(&client, &program(9.0), &CompileOptions::new()).unwrap();
            std::fs::rename(other.entry_path(&r.key).unwrap(), p).unwrap();
        },
        |r| *r == CorruptReason::KeyMismatch,
    );
}

#[test]
fn a_checksummed_payload_the_plugin_refuses_is_corrupt() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    corrupt_case(
        &client,
        "garbage payload with a valid header",
        |_, p| {
            let key = CacheKey::from_hex(p.file_stem().unwrap().to_str().unwrap()).unwrap();
            std::fs::write(p, entry::encode(&key, b"this is not an executable")).unwrap();
        },
        |r| matches!(r, CorruptReason::Deserialize { message } if !message.is_empty()),
    );
}

#[test]
fn uncreatable_directory_still_compiles_and_counts() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    // A path below a regular file cannot be created, even by root (chmod would not stop root).
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let dir = file.join("compile");
    let cache = CompileCache::new(CacheConfig {
        memory_entries: 0,
        disk_dir: Some(dir.clone()),
        max_disk_bytes: None,
    });
    for round in 1..=2 {
        let r = cache.get_or_compile(&client, &program(1.0), &CompileOptions::new()).unwrap();
        assert_eq!(r.outcome, Outcome::Compiled);
        check_numerics(&client, &r.executable, 1.0);
        assert_eq!(r.cache_errors.len(), 1);
        match &*r.cache_errors[0] {
            CacheError::CreateDir { dir: d, source } => {
                assert_eq!(d, &dir);
                assert!(!source.to_string().is_empty());
            }
            other => panic!("expected CreateDir, got {other:?}"),
        }
        let s = cache.stats();
        assert_eq!((s.disk_write_failures, s.compiles, s.disk_writes), (round, round, 0));
        assert_eq!(s.disk_read_failures, 0, "a missing directory is a plain miss");
    }
    let last = cache.last_error().unwrap();
    assert!(last.to_string().contains("cannot create compile cache directory"), "{last}");
    assert!(cache.disk_entries().unwrap().is_empty());
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory", "nothing clobbered");
}

#[test]
fn unreadable_unreplaceable_entry_falls_back_and_leaves_nothing_behind() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = fresh_cache(dir.path());
    let key = cache.key(&client, &program(1.0), &CompileOptions::new());
    // A directory where the entry should be: reading fails (EISDIR), so does renaming over it.
    let path = cache.entry_path(&key).unwrap();
    std::fs::create_dir_all(path.join("inside")).unwrap();

    let r = cache.get_or_compile(&client, &program(1.0), &CompileOptions::new()).unwrap();
    assert_eq!(r.outcome, Outcome::Compiled);
    check_numerics(&client, &r.executable, 1.0);
    let kinds: Vec<&str> = r
        .cache_errors
        .iter()
        .map(|e| match &**e {
            CacheError::Read { .. } => "read",
            CacheError::Write { .. } => "write",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["read", "write"], "{:?}", r.cache_errors);
    let s = cache.stats();
    assert_eq!((s.disk_read_failures, s.disk_write_failures, s.compiles), (1, 1, 1));
    assert!(temp_files(dir.path()).is_empty(), "a failed write leaves no temporary file");
    assert!(path.join("inside").is_dir(), "nothing of someone else's was removed");
    // Memory still serves it.
    let again = cache.get_or_compile(&client, &program(1.0), &CompileOptions::new()).unwrap();
    assert_eq!(again.outcome, Outcome::MemoryHit);
}

#[test]
fn stray_files_in_the_directory_are_ignored() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README"), b"hello").unwrap();
    std::fs::write(dir.path().join("zz.tpukexe"), b"garbage with the right extension").unwrap();
    let (key, path) = seed(&client, dir.path());
    let cache = fresh_cache(dir.path());
    let r = cache.get_or_compile(&client, &program(1.0), &CompileOptions::new()).unwrap();
    assert_eq!(r.outcome, Outcome::DiskHit);
    assert_eq!(r.key, key);
    assert!(cache.disk_entries().unwrap().iter().any(|(p, _)| *p == path));
}
