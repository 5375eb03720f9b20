//! The compile cache on the real XLA CPU plugin: hit and miss sequences, counters, warm starts
//! from disk with correct numerics, keys, the memory and disk bounds.
//!
//! Skips loudly without the plugin; fails under `TPUK_REQUIRE_RUNTIMES=1`.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

use std::path::Path;
use std::sync::Arc;

#[path = "support/cache_programs.rs"]
mod cache_programs;
use cache_programs::{check_numerics, program};
use tpu_kernels_registry::cache::{CacheConfig, CacheKey, CompileCache, Outcome, entry};
use tpu_kernels_registry::pjrt::testing::cpu_client_for_tests;
use tpu_kernels_registry::pjrt::{CompileOptions, Program};

fn config(dir: &Path) -> CacheConfig {
    CacheConfig { memory_entries: 16, disk_dir: Some(dir.to_path_buf()), max_disk_bytes: None }
}

#[test]
fn miss_then_memory_hit_then_disk_hit_in_a_new_instance() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let opts = CompileOptions::new();

    let cache = CompileCache::new(config(dir.path()));
    let first = cache.get_or_compile(&client, &program(1.0), &opts).unwrap();
    assert_eq!(first.outcome, Outcome::Compiled);
    assert!(first.cache_errors.is_empty(), "{:?}", first.cache_errors);
    check_numerics(&client, &first.executable, 1.0);
    let second = cache.get_or_compile(&client, &program(1.0), &opts).unwrap();
    assert_eq!(second.outcome, Outcome::MemoryHit);
    assert!(Arc::ptr_eq(&first.executable, &second.executable));
    assert_eq!(second.key, first.key);

    let s = cache.stats();
    assert_eq!((s.memory_hits, s.disk_hits, s.misses, s.compiles), (1, 0, 1, 1));
    assert_eq!((s.disk_writes, s.fallbacks()), (1, 0));
    assert!(s.compile_time.as_nanos() > 0);
    assert!(cache.last_error().is_none());

    // The entry on disk is a valid entry of this key.
    let path = cache.entry_path(&first.key).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert!(entry::decode(&bytes, &first.key).is_ok());
    assert_eq!(cache.disk_entries().unwrap(), vec![(path, bytes.len() as u64)]);

    // A new instance (a new process, in effect) on a new client starts warm from disk.
    let fresh_client = cpu_client_for_tests(1).unwrap();
    let warm = CompileCache::new(config(dir.path()));
    let hit = warm.get_or_compile(&fresh_client, &program(1.0), &opts).unwrap();
    assert_eq!(hit.outcome, Outcome::DiskHit);
    assert_eq!(hit.key, first.key);
    check_numerics(&fresh_client, &hit.executable, 1.0);
    let again = warm.get_or_compile(&fresh_client, &program(1.0), &opts).unwrap();
    assert_eq!(again.outcome, Outcome::MemoryHit);
    let s = warm.stats();
    assert_eq!((s.memory_hits, s.disk_hits, s.misses, s.compiles), (1, 1, 0, 0));
    assert!(s.disk_load_time.as_nanos() > 0);

    // Another program misses.
    let other = warm.get_or_compile(&fresh_client, &program(2.0), &opts).unwrap();
    assert_eq!(other.outcome, Outcome::Compiled);
    assert_ne!(other.key, first.key);
    check_numerics(&fresh_client, &other.executable, 2.0);
}

#[test]
fn executables_are_per_client() {
    let Some(a) = cpu_client_for_tests(1) else { return };
    let b = cpu_client_for_tests(1).unwrap();
    let cache = CompileCache::new(CacheConfig::memory_only(8));
    let opts = CompileOptions::new();
    let on_a = cache.get_or_compile(&a, &program(3.0), &opts).unwrap();
    let on_b = cache.get_or_compile(&b, &program(3.0), &opts).unwrap();
    // Same key (same devices and plugin), but each client gets its own executable.
    assert_eq!(on_a.key, on_b.key);
    assert_eq!(on_b.outcome, Outcome::Compiled);
    assert!(!Arc::ptr_eq(&on_a.executable, &on_b.executable));
    check_numerics(&b, &on_b.executable, 3.0);
    assert_eq!(cache.get_or_compile(&a, &program(3.0), &opts).unwrap().outcome, Outcome::MemoryHit);
    assert_eq!(cache.memory_len(), 2);
    assert_eq!(cache.forget_client(&a), 1);
    assert_eq!(cache.memory_len(), 1);
    assert_eq!(cache.get_or_compile(&a, &program(3.0), &opts).unwrap().outcome, Outcome::Compiled);
}

#[test]
fn keys_ignore_locations_and_see_options_and_devices() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let cache = CompileCache::new(CacheConfig::memory_only(8));
    let opts = CompileOptions::new();
    let plain = program(1.0);
    let text = std::str::from_utf8(plain.as_bytes()).unwrap();
    let located = Program::text(
        text.replace(
            "return %1 : tensor<4xf32>",
            "return %1 : tensor<4xf32> loc(\"model.py\":12:3)",
        )
        .replace("\n}", "\n} loc(#loc1)")
            + "\n#loc1 = loc(\"model.py\":1:1)\n",
    );
    assert_ne!(plain.as_bytes(), located.as_bytes());
    let k = cache.key(&client, &plain, &opts);
    assert_eq!(k, cache.key(&client, &located, &opts));
    assert_eq!(k, CacheKey::compute(&client, &plain, &opts));
    cache.get_or_compile(&client, &plain, &opts).unwrap();
    let hit = cache.get_or_compile(&client, &located, &opts).unwrap();
    assert_eq!(hit.outcome, Outcome::MemoryHit);

    assert_ne!(k, cache.key(&client, &program(1.5), &opts));
    assert_ne!(k, cache.key(&client, &plain, &CompileOptions::new().num_replicas(2)));
    let four = cpu_client_for_tests(4).unwrap();
    assert_ne!(k, cache.key(&four, &plain, &opts), "the device set is part of the key");
    let again = cpu_client_for_tests(1).unwrap();
    assert_eq!(k, cache.key(&again, &plain, &opts), "keys are stable across clients");
}

#[test]
fn compile_errors_are_returned_and_counted_not_cached() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(config(dir.path()));
    let bad = Program::text("func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> { return %y }");
    let err = cache.get_or_compile(&client, &bad, &CompileOptions::new()).unwrap_err();
    assert!(!err.to_string().is_empty());
    let err = cache.get_or_compile(&client, &bad, &CompileOptions::new()).unwrap_err();
    assert!(!err.to_string().is_empty());
    let s = cache.stats();
    assert_eq!((s.compile_errors, s.compiles, s.misses, s.disk_writes), (2, 0, 2, 0));
    assert!(cache.disk_entries().unwrap().is_empty());
    assert_eq!(cache.memory_len(), 0);
}

#[test]
fn memory_tier_is_a_bounded_lru() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let cache = CompileCache::new(CacheConfig::memory_only(2));
    let opts = CompileOptions::new();
    for c in [1.0, 2.0] {
        cache.get_or_compile(&client, &program(c), &opts).unwrap();
    }
    // Touch 1.0 so that 2.0 is the least recently used, then add 3.0.
    assert_eq!(
        cache.get_or_compile(&client, &program(1.0), &opts).unwrap().outcome,
        Outcome::MemoryHit
    );
    cache.get_or_compile(&client, &program(3.0), &opts).unwrap();
    assert_eq!(cache.memory_len(), 2);
    assert_eq!(cache.stats().memory_evictions, 1);
    assert_eq!(
        cache.get_or_compile(&client, &program(1.0), &opts).unwrap().outcome,
        Outcome::MemoryHit
    );
    assert_eq!(
        cache.get_or_compile(&client, &program(3.0), &opts).unwrap().outcome,
        Outcome::MemoryHit
    );
    assert_eq!(
        cache.get_or_compile(&client, &program(2.0), &opts).unwrap().outcome,
        Outcome::Compiled
    );

    // memory_entries = 0 turns the memory tier off.
    let none = CompileCache::new(CacheConfig::memory_only(0));
    for _ in 0..2 {
        let r = none.get_or_compile(&client, &program(1.0), &opts).unwrap();
        assert_eq!(r.outcome, Outcome::Compiled);
        check_numerics(&client, &r.executable, 1.0);
    }
    assert_eq!(none.memory_len(), 0);
}

#[test]
fn disk_tier_size_bound_evicts_least_recently_used() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let opts = CompileOptions::new();
    // Measure one entry, then allow about two and a half.
    let probe = CompileCache::new(CacheConfig::in_dir(dir.path()));
    probe.get_or_compile(&client, &program(0.0), &opts).unwrap();
    let one = probe.disk_entries().unwrap()[0].1;
    std::fs::remove_dir_all(dir.path()).unwrap();

    let bound = one * 5 / 2;
    let cache = CompileCache::new(CacheConfig {
        memory_entries: 0,
        disk_dir: Some(dir.path().to_path_buf()),
        max_disk_bytes: Some(bound),
    });
    let mut keys = Vec::new();
    for c in [1.0, 2.0, 3.0, 4.0] {
        keys.push(cache.get_or_compile(&client, &program(c), &opts).unwrap().key);
        // mtimes must differ for a deterministic order on coarse-timestamp file systems.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let entries = cache.disk_entries().unwrap();
    let total: u64 = entries.iter().map(|(_, n)| n).sum();
    assert!(total <= bound, "{total} > {bound}");
    assert_eq!(entries.len(), 2);
    assert_eq!(cache.stats().disk_evictions, 2);
    assert!(cache.last_error().is_none());
    let present = |k: &CacheKey| cache.entry_path(k).unwrap().exists();
    assert!(!present(&keys[0]) && !present(&keys[1]));
    assert!(present(&keys[2]) && present(&keys[3]));
    let r = cache.get_or_compile(&client, &program(4.0), &opts).unwrap();
    assert_eq!(r.outcome, Outcome::DiskHit);
    check_numerics(&client, &r.executable, 4.0);

    // remove() drops both tiers' entries.
    assert!(cache.remove(&client, &keys[3]).unwrap());
    assert!(!present(&keys[3]));
    assert!(!cache.remove(&client, &keys[3]).unwrap());
}

#[test]
fn four_device_clients_start_warm_too() {
    let Some(client) = cpu_client_for_tests(4) else { return };
    let dir = tempfile::tempdir().unwrap();
    let opts = CompileOptions::new();
    let cache = CompileCache::new(config(dir.path()));
    cache.get_or_compile(&client, &program(5.0), &opts).unwrap();
    let warm = CompileCache::new(config(dir.path()));
    let fresh = cpu_client_for_tests(4).unwrap();
    let r = warm.get_or_compile(&fresh, &program(5.0), &opts).unwrap();
    assert_eq!(r.outcome, Outcome::DiskHit);
    check_numerics(&fresh, &r.executable, 5.0);
}
