//! The compile cache: a warm start of the whole kernel library from the disk cache against a cold
//! compile, printed side by side in one run (target: warm >= 20x faster), plus criterion
//! measurements of a memory hit and of computing a key.
//!
//! Cold: every registered kernel, at its first canonical signature, compiled through a cache over
//! an empty directory (so it also pays for serializing and writing the entries). Warm: a fresh
//! cache instance and a fresh client (as in a new process) over the same directory.
//!
//! `cargo bench -p tpu-kernels-registry --bench cache` (needs `scripts/dev setup`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use tpu_kernels::registered;
use tpu_kernels::registration::Platform;
use tpu_kernels_registry::cache::{CacheConfig, CompileCache, Outcome};
use tpu_kernels_registry::pjrt::{Client, ClientOptions, CompileOptions, Plugin, Program};

/// Warm starts measured (the median is reported); each uses a fresh client and cache instance.
const WARM_RUNS: usize = 7;
/// Cold runs measured (the median is reported); each uses a fresh client and an empty directory.
const COLD_RUNS: usize = 3;

/// Every registered kernel's program at its first canonical signature, by name.
fn library() -> Vec<(String, Program)> {
    let mut out = Vec::new();
    for k in registered() {
        let text = if k.is_imported() {
            match k.imported_module(Platform::Cpu) {
                Some(m) => m.text.to_owned(),
                None => {
                    eprintln!("skipping {}: no CPU variant", k.name);
                    continue;
                }
            }
        } else {
            let sig = match k.canonical_signatures() {
                Ok(sigs) if !sigs.is_empty() => sigs[0].clone(),
                Ok(_) => {
                    eprintln!("skipping {}: no canonical signature", k.name);
                    continue;
                }
                Err(e) => panic!("kernel {}: bad canonical signature: {e}", k.name),
            };
            k.emit(&sig).unwrap_or_else(|e| panic!("kernel {}: {e}", k.name)).to_text()
        };
        out.push((k.name.to_owned(), Program::text(text)));
    }
    out
}

fn fresh_client(plugin: &Plugin) -> Client {
    Client::new(plugin, ClientOptions::new()).expect("client")
}

/// Loads every program through a fresh cache over `dir` on a fresh client; checks each outcome.
fn load_all(
    plugin: &Plugin,
    dir: &std::path::Path,
    programs: &[(String, Program)],
    want: Outcome,
) -> Duration {
    let client = fresh_client(plugin);
    let cache = CompileCache::new(CacheConfig::in_dir(dir));
    let start = Instant::now();
    for (name, p) in programs {
        let r = cache
            .get_or_compile(&client, p, &CompileOptions::new())
            .unwrap_or_else(|e| panic!("kernel {name}: {e}"));
        assert_eq!(r.outcome, want, "kernel {name}");
        assert!(r.cache_errors.is_empty(), "kernel {name}: {:?}", r.cache_errors);
        black_box(&r.executable);
    }
    start.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let plugin = match Plugin::cpu() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("\n*** SKIPPED: the PJRT CPU plugin is unavailable: {e}\n");
            return;
        }
    };
    let programs = library();
    assert!(!programs.is_empty(), "no kernels registered");

    // Criterion: the per-call cost of the hot paths.
    let mut c = Criterion::default().configure_from_args();
    {
        let client = fresh_client(&plugin);
        let cache = CompileCache::new(CacheConfig::memory_only(64));
        let (_, p) = &programs[0];
        let opts = CompileOptions::new();
        cache.get_or_compile(&client, p, &opts).expect("compile");
        let key = cache.key(&client, p, &opts);
        let mut g = c.benchmark_group("cache");
        g.bench_function("memory_hit", |b| {
            b.iter(|| black_box(cache.get_or_compile(&client, p, &opts).expect("hit")))
        });
        g.bench_function("memory_hit_precomputed_key", |b| {
            b.iter(|| black_box(cache.get_or_compile_keyed(&client, key, p, &opts).expect("hit")))
        });
        g.bench_function("key", |b| b.iter(|| black_box(cache.key(&client, p, &opts))));
        g.finish();
    }
    c.final_summary();

    // Cold against warm, side by side.
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let mut bytes = 0;
    for _ in 0..COLD_RUNS {
        let dir = tempfile::tempdir().expect("temp dir");
        cold.push(load_all(&plugin, dir.path(), &programs, Outcome::Compiled));
        if warm.is_empty() {
            for _ in 0..WARM_RUNS {
                warm.push(load_all(&plugin, dir.path(), &programs, Outcome::DiskHit));
            }
            let cache = CompileCache::new(CacheConfig::in_dir(dir.path()));
            bytes = cache.disk_entries().expect("entries").iter().map(|(_, n)| n).sum::<u64>();
        }
    }
    let (cold, warm) = (median(cold), median(warm));
    let ratio = cold.as_secs_f64() / warm.as_secs_f64();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "\n== compile cache: whole library ({} kernels, {} KiB on disk) ==",
        programs.len(),
        bytes / 1024
    );
    println!(
        "{:<58} {:>10.1} ms",
        "cold: compile all (through the cache, empty directory)",
        ms(cold)
    );
    println!("{:<58} {:>10.1} ms", "warm: load all from disk (fresh cache and client)", ms(warm));
    println!(
        "{:<58} {:>10.1} x   (target >= 20x: {})",
        "speedup",
        ratio,
        if ratio >= 20.0 { "ok" } else { "MISSED" }
    );
}
