//! The compile cache under concurrency: one cache shared by many threads (single flight), many
//! cache instances over one directory, and several processes hammering one directory while
//! entries are removed and rewritten. No call may fail, no entry may ever be seen torn, and
//! every file left is a valid entry.
//!
//! The process test re-runs this test binary with `TPUK_CACHE_TEST_CHILD_DIR` set, which turns
//! `child_process_worker` from a no-op into a worker.
//!
//! Skips loudly without the plugin; fails under `TPUK_REQUIRE_RUNTIMES=1`.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};

#[path = "support/cache_programs.rs"]
mod cache_programs;
use cache_programs::{check_numerics, program};
use tpu_kernels_registry::cache::{CacheConfig, CacheKey, CompileCache, Outcome, entry};
use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::pjrt::{Client, CompileOptions};

const CHILD_ENV: &str = "TPUK_CACHE_TEST_CHILD_DIR";
const PROGRAMS: usize = 3;

/// A disk-only cache over `dir`: every call goes to the disk tier.
fn disk_only(dir: &Path) -> CompileCache {
    CompileCache::new(CacheConfig {
        memory_entries: 0,
        disk_dir: Some(dir.to_path_buf()),
        max_disk_bytes: None,
    })
}

/// `rounds` rounds over every program with a fresh disk-only cache instance each round; on
/// some rounds the worker first removes an entry, so writes and reads of one key race across
/// workers. Panics on any error or any corrupt entry seen.
fn hammer(client: &Client, dir: &Path, worker: usize, rounds: usize) {
    for round in 0..rounds {
        let cache = disk_only(dir);
        for p in 0..PROGRAMS {
            let c = p as f32;
            if (round + worker + p).is_multiple_of(3) {
                let key = cache.key(client, &program(c), &CompileOptions::new());
                cache.remove(client, &key).unwrap();
            }
            let r = cache.get_or_compile(client, &program(c), &CompileOptions::new()).unwrap();
            assert!(r.cache_errors.is_empty(), "worker {worker}: {:?}", r.cache_errors);
            check_numerics(client, &r.executable, c);
        }
        let s = cache.stats();
        assert_eq!(s.fallbacks(), 0, "worker {worker}: {s:?}");
    }
}

/// Every file in `dir` is a valid entry of the key its name says; no temporary file is left.
fn check_directory(dir: &Path) {
    for item in std::fs::read_dir(dir).unwrap() {
        let path = item.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let stem = name.strip_suffix(".tpukexe").unwrap_or_else(|| panic!("stray file {name}"));
        let key = CacheKey::from_hex(stem).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(entry::decode(&bytes, &key).is_ok(), "invalid entry {name}");
    }
}

#[test]
fn one_cache_many_threads_compiles_once() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(CompileCache::new(CacheConfig::in_dir(dir.path())));
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (cache, client, barrier) = (cache.clone(), client.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let r = cache.get_or_compile(&client, &program(7.0), &CompileOptions::new());
                let r = r.unwrap();
                check_numerics(&client, &r.executable, 7.0);
                r.outcome
            })
        })
        .collect();
    let outcomes: Vec<Outcome> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Compiled).count(), 1, "{outcomes:?}");
    let s = cache.stats();
    assert_eq!((s.compiles, s.misses, s.memory_hits), (1, 1, threads as u64 - 1));
    assert_eq!(s.fallbacks(), 0);
    check_directory(dir.path());
}

#[test]
fn many_instances_many_threads_one_directory() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let threads = 4;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|worker| {
            let (client, barrier, dir) = (client.clone(), barrier.clone(), dir.path().to_owned());
            std::thread::spawn(move || {
                barrier.wait();
                hammer(&client, &dir, worker, 6);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    check_directory(dir.path());
}

/// A worker when run by `processes_share_one_directory`; a no-op otherwise.
#[test]
fn child_process_worker() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else { return };
    let worker: usize = std::env::var("TPUK_CACHE_TEST_CHILD_ID").unwrap().parse().unwrap();
    let client = cpu_client_for_tests(1).expect("the parent found the plugin");
    hammer(&client, Path::new(&dir), worker, 8);
}

#[test]
fn processes_share_one_directory() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (1..=3)
        .map(|id| {
            Command::new(&exe)
                .args(["--exact", "child_process_worker", "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, dir.path())
                .env("TPUK_CACHE_TEST_CHILD_ID", id.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    hammer(&client, dir.path(), 0, 8);
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "a child worker failed: {}\n{stdout}", out.status);
        assert!(stdout.contains("1 passed"), "the child ran no worker:\n{stdout}");
    }
    check_directory(dir.path());
    // And a last process-fresh instance starts warm on every program.
    let cache = CompileCache::new(CacheConfig::in_dir(dir.path()));
    for p in 0..PROGRAMS {
        let r = cache.get_or_compile(&client, &program(p as f32), &CompileOptions::new()).unwrap();
        assert_eq!(r.outcome, Outcome::DiskHit);
    }
}
