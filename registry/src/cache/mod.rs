//! The compile cache: compiled executables by content fingerprint, in memory and on disk.
//!
//! A [`CompileCache`] answers [`get_or_compile`](CompileCache::get_or_compile) from three places,
//! in order:
//!
//! 1. **memory**: a bounded LRU of loaded executables ([`CacheConfig::memory_entries`]). An
//!    executable belongs to the client that loaded it, so this tier is keyed by
//!    ([`CacheKey`], client), and it keeps those clients alive until their entries are evicted
//!    or [`forget_client`](CompileCache::forget_client) is called;
//! 2. **disk**: one file per key under [`CacheConfig::disk_dir`] (default
//!    `$TPUK_CACHE/compile`, i.e. `~/.cache/tpu-kernels/compile`), holding the serialized
//!    executable behind a verified header (format in [`entry`]), loaded only from a directory
//!    and a file this user owns and only this user can write ([Trust](#trust)). Entries are
//!    written to a temporary file and renamed into place, so any number of threads and
//!    processes of the user can share one directory without locks and never see a torn file;
//! 3. **compile**, whose result is stored in both tiers.
//!
//! The key ([`CacheKey::compute`]) fingerprints the location-stripped program, the compile
//! options, the plugin's identity and the client's devices.
//!
//! The disk tier never fails a compile. A corrupt, truncated, stale or foreign entry, or one the
//! plugin refuses to load, is counted, recompiled and replaced; an unwritable or full directory
//! is counted and the compiled executable is returned anyway. Each such event is a typed
//! [`CacheError`], reported in [`Cached::cache_errors`] and [`CompileCache::last_error`], and
//! counted in [`CacheStats`]. Only the compile itself can fail a call, with its
//! [`pjrt::Error`].
//!
//! # Trust
//!
//! An entry is native code the process will run, so, as ssh does with its keys, the disk tier
//! loads only what this user could have written, on Unix:
//!
//! - the cache directory and each entry file must be **owned by the process's effective uid**
//!   and **not writable by group or others** (`mode & 0o022 == 0`). Symbolic links are followed:
//!   what is checked is the directory and the file that would be read (an entry on the open
//!   descriptor it is read from). The directories above the cache directory are not checked;
//! - an untrusted directory is refused whole ([`CacheError::UntrustedDir`]): nothing is loaded
//!   from it **and nothing is written into it**, where another user could replace it. The
//!   executable is compiled and kept in memory only;
//! - an untrusted entry in a trusted directory ([`CacheError::UntrustedEntry`]) is not loaded;
//!   it is recompiled and replaced (renamed over) by an entry of this user's;
//! - the cache creates its directory, and any missing parent, with mode 0700, and its entries
//!   with mode 0600. It never changes the mode of a directory that already exists: one an
//!   older version created 0755 is owned by its user and not group- or other-writable, so it is
//!   trusted as it is; a group-writable one stays refused until its owner runs `chmod go-w`.
//!
//! Refusals are counted in [`CacheStats::untrusted`] (and in [`CacheStats::fallbacks`]),
//! reported like every cache error, and the first one of a cache is also printed to stderr as
//! a `tpu-kernels: warning:`, since it silently costs every warm start a compile.
//!
//! ```no_run
//! use tpu_kernels_registry::cache::{CacheConfig, CompileCache, Outcome};
//! use tpu_kernels_registry::pjrt::{Client, ClientOptions, CompileOptions, Plugin, Program};
//!
//! # fn main() -> Result<(), tpu_kernels_registry::pjrt::Error> {
//! let client = Client::new(&Plugin::cpu()?, ClientOptions::new())?;
//! let cache = CompileCache::new(CacheConfig::default()); // memory + $TPUK_CACHE/compile
//! let program = Program::text(
//!     "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
//!        %0 = stablehlo.add %a, %a : tensor<4xf32>
//!        return %0 : tensor<4xf32>
//!      }",
//! );
//! let first = cache.get_or_compile(&client, &program, &CompileOptions::new())?;
//! let again = cache.get_or_compile(&client, &program, &CompileOptions::new())?;
//! assert_eq!(again.outcome, Outcome::MemoryHit);
//! println!("{:?} then {:?}; {:?}", first.outcome, again.outcome, cache.stats());
//! # Ok(()) }
//! ```

mod disk;
pub mod entry;
mod error;
mod key;
mod memory;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use error::{CacheError, CorruptReason, UntrustedReason};
pub use key::{CacheKey, KEY_VERSION};

use crate::pjrt::{self, Client, CompileOptions, LoadedExecutable, Program};
use disk::DiskTier;
use memory::{Lru, MemKey, client_id};

/// The default number of executables kept in memory.
pub const DEFAULT_MEMORY_ENTRIES: usize = 512;

/// How a [`CompileCache`] is set up. Build one with struct-update syntax:
/// `CacheConfig { memory_entries: 64, ..CacheConfig::default() }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// How many loaded executables the memory tier keeps (least recently used are dropped
    /// first); 0 disables the memory tier.
    pub memory_entries: usize,
    /// The disk tier's directory (created on first write, mode 0700); `None` disables the disk
    /// tier.
    pub disk_dir: Option<PathBuf>,
    /// An optional bound on the bytes of entries in `disk_dir`: after each write the least
    /// recently used entries (by mtime, which hits refresh) are removed until the rest fit.
    pub max_disk_bytes: Option<u64>,
}

impl Default for CacheConfig {
    /// [`DEFAULT_MEMORY_ENTRIES`] in memory, [`default_disk_dir`] on disk, no size bound.
    fn default() -> Self {
        Self {
            memory_entries: DEFAULT_MEMORY_ENTRIES,
            disk_dir: Some(default_disk_dir()),
            max_disk_bytes: None,
        }
    }
}

impl CacheConfig {
    /// Memory only, holding `entries` executables.
    pub fn memory_only(entries: usize) -> Self {
        Self { memory_entries: entries, disk_dir: None, max_disk_bytes: None }
    }

    /// The default memory tier over the disk directory `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self { disk_dir: Some(dir.into()), ..Self::memory_only(DEFAULT_MEMORY_ENTRIES) }
    }

    /// The defaults, adjusted by the environment: `TPUK_COMPILE_CACHE=0` (or `off`, `false`)
    /// disables the disk tier, and `TPUK_COMPILE_CACHE_MAX_BYTES=N` bounds it. The directory
    /// follows `TPUK_CACHE` ([`default_disk_dir`]).
    pub fn from_env() -> Self {
        let mut config = Self::default();
        if std::env::var("TPUK_COMPILE_CACHE").is_ok_and(|v| {
            matches!(v.trim().to_ascii_lowercase().as_str(), "0" | "off" | "false" | "no")
        }) {
            config.disk_dir = None;
        }
        if let Some(n) =
            std::env::var("TPUK_COMPILE_CACHE_MAX_BYTES").ok().and_then(|v| v.trim().parse().ok())
        {
            config.max_disk_bytes = Some(n);
        }
        config
    }
}

/// The disk tier's default directory: `$TPUK_CACHE/compile` (`~/.cache/tpu-kernels/compile`).
pub fn default_disk_dir() -> PathBuf {
    pjrt::cache_dir().join("compile")
}

/// Where an executable came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The memory tier had it, loaded on this client.
    MemoryHit,
    /// The disk tier had a valid entry, loaded onto this client.
    DiskHit,
    /// It was compiled (no entry, or the entry was unusable: see [`Cached::cache_errors`]).
    Compiled,
}

/// The answer of [`CompileCache::get_or_compile`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Cached {
    /// The executable, loaded on the client asked for.
    pub executable: Arc<LoadedExecutable>,
    /// Where it came from.
    pub outcome: Outcome,
    /// The key it is cached under.
    pub key: CacheKey,
    /// What went wrong in the cache during this call and was worked around (a corrupt entry
    /// replaced, a failed write); empty on the normal paths.
    pub cache_errors: Vec<Arc<CacheError>>,
}

/// A snapshot of a cache's counters ([`CompileCache::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CacheStats {
    /// Calls answered from memory.
    pub memory_hits: u64,
    /// Calls answered from disk.
    pub disk_hits: u64,
    /// Calls neither tier could answer (each is followed by a compile).
    pub misses: u64,
    /// Successful compiles.
    pub compiles: u64,
    /// Failed compiles (the error was returned to the caller).
    pub compile_errors: u64,
    /// Time spent compiling (successful and failed compiles).
    pub compile_time: Duration,
    /// Time spent reading, verifying and loading disk entries that hit.
    pub disk_load_time: Duration,
    /// Entries written to disk.
    pub disk_writes: u64,
    /// Entries that could not be written (directory not creatable, unwritable or full, or the
    /// executable not serializable), and eviction passes that failed.
    pub disk_write_failures: u64,
    /// Entries that exist but could not be read.
    pub disk_read_failures: u64,
    /// Corrupt, truncated, stale or foreign entries found (each is recompiled and replaced).
    pub corrupt_entries: u64,
    /// Loads (and writes) refused because the directory or the entry is not trusted (module
    /// docs, "Trust"); each refused load is followed by a compile.
    pub untrusted: u64,
    /// Executables dropped from memory by the LRU bound.
    pub memory_evictions: u64,
    /// Entries removed from disk by the size bound.
    pub disk_evictions: u64,
}

impl CacheStats {
    /// All hits, memory and disk.
    pub fn hits(&self) -> u64 {
        self.memory_hits + self.disk_hits
    }

    /// All cache errors worked around.
    pub fn fallbacks(&self) -> u64 {
        self.disk_write_failures + self.disk_read_failures + self.corrupt_entries + self.untrusted
    }
}

#[derive(Debug, Default)]
struct Counters {
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    misses: AtomicU64,
    compiles: AtomicU64,
    compile_errors: AtomicU64,
    compile_nanos: AtomicU64,
    disk_load_nanos: AtomicU64,
    disk_writes: AtomicU64,
    disk_write_failures: AtomicU64,
    disk_read_failures: AtomicU64,
    corrupt_entries: AtomicU64,
    untrusted: AtomicU64,
    memory_evictions: AtomicU64,
    disk_evictions: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Held by the one caller looking up or compiling a (key, client) while others wait on it.
type FlightLock = Arc<Mutex<()>>;

/// Compiled executables by content fingerprint, in memory and on disk. `Send + Sync`: share one
/// (for example [`CompileCache::shared`]) between all threads; concurrent calls for the same key
/// and client compile once, the others wait for that result.
#[derive(Debug)]
pub struct CompileCache {
    config: CacheConfig,
    memory: Mutex<Lru>,
    disk: Option<DiskTier>,
    /// One lock per (key, client) being looked up or compiled right now (single flight).
    in_flight: Mutex<HashMap<MemKey, FlightLock>>,
    counters: Counters,
    last_error: Mutex<Option<Arc<CacheError>>>,
    /// Whether the first refusal of an untrusted directory or entry has been printed.
    warned_untrusted: AtomicBool,
}

impl CompileCache {
    /// A cache set up by `config`. Nothing touches the disk until the first lookup.
    pub fn new(config: CacheConfig) -> Self {
        Self {
            memory: Mutex::new(Lru::new(config.memory_entries)),
            disk: config.disk_dir.clone().map(|dir| DiskTier::new(dir, config.max_disk_bytes)),
            config,
            in_flight: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            last_error: Mutex::new(None),
            warned_untrusted: AtomicBool::new(false),
        }
    }

    /// The process-wide cache, configured by [`CacheConfig::from_env`] on first use.
    pub fn shared() -> &'static CompileCache {
        static SHARED: OnceLock<CompileCache> = OnceLock::new();
        SHARED.get_or_init(|| CompileCache::new(CacheConfig::from_env()))
    }

    /// The configuration the cache was made with.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// The key `program` compiled with `options` on `client` is cached under.
    pub fn key(&self, client: &Client, program: &Program, options: &CompileOptions) -> CacheKey {
        CacheKey::compute(client, program, options)
    }

    /// The executable of `program` compiled with `options` on `client`: from memory, else from
    /// disk, else compiled (and then stored in both tiers).
    ///
    /// Fails only when the compile fails, with the compiler's [`pjrt::Error`]; failures of the
    /// cache itself are worked around and reported in [`Cached::cache_errors`].
    pub fn get_or_compile(
        &self,
        client: &Client,
        program: &Program,
        options: &CompileOptions,
    ) -> pjrt::Result<Cached> {
        let key = self.key(client, program, options);
        self.get_or_compile_keyed(client, key, program, options)
    }

    /// [`get_or_compile`](Self::get_or_compile) with a key the caller computed (and may have
    /// memoised) with [`key`](Self::key) for the same client, program and options.
    pub fn get_or_compile_keyed(
        &self,
        client: &Client,
        key: CacheKey,
        program: &Program,
        options: &CompileOptions,
    ) -> pjrt::Result<Cached> {
        if let Some(exe) = self.memory_get(&key, client) {
            return Ok(self.hit(exe, key, Outcome::MemoryHit, Vec::new()));
        }
        // Single flight: one caller per (key, client) goes to disk or compiles; the others wait
        // here and then find the result in memory.
        let mk = (key, client_id(client));
        let flight = self.lock(&self.in_flight).entry(mk).or_default().clone();
        let result = {
            let _turn = flight.lock().unwrap_or_else(|e| e.into_inner());
            self.lookup_or_compile(client, key, program, options)
        };
        let mut in_flight = self.lock(&self.in_flight);
        // Two references left (the map's and ours): no one else is waiting on this lock.
        if Arc::strong_count(&flight) <= 2 {
            in_flight.remove(&mk);
        }
        result
    }

    fn lookup_or_compile(
        &self,
        client: &Client,
        key: CacheKey,
        program: &Program,
        options: &CompileOptions,
    ) -> pjrt::Result<Cached> {
        if let Some(exe) = self.memory_get(&key, client) {
            return Ok(self.hit(exe, key, Outcome::MemoryHit, Vec::new()));
        }
        let mut errors = Vec::new();
        // An untrusted directory is neither read nor written.
        let mut dir_refused = false;
        if let Some(disk) = &self.disk {
            let start = Instant::now();
            match disk.load(&key) {
                Ok(Some(payload)) => match client.deserialize(&payload) {
                    Ok(exe) => {
                        bump(&self.counters.disk_load_nanos, nanos(start.elapsed()));
                        let exe = Arc::new(exe);
                        self.memory_insert(key, client, exe.clone());
                        return Ok(self.hit(exe, key, Outcome::DiskHit, errors));
                    }
                    Err(e) => {
                        let reason = CorruptReason::Deserialize { message: e.to_string() };
                        errors.push(
                            self.record(CacheError::Corrupt { path: disk.path(&key), reason }),
                        );
                    }
                },
                Ok(None) => {}
                Err(e) => {
                    dir_refused = matches!(e, CacheError::UntrustedDir { .. });
                    errors.push(self.record(e));
                }
            }
        }
        bump(&self.counters.misses, 1);
        let start = Instant::now();
        let compiled = client.compile(program, options);
        bump(&self.counters.compile_nanos, nanos(start.elapsed()));
        let exe = match compiled {
            Ok(exe) => Arc::new(exe),
            Err(e) => {
                bump(&self.counters.compile_errors, 1);
                return Err(e);
            }
        };
        bump(&self.counters.compiles, 1);
        if let Some(disk) = self.disk.as_ref().filter(|_| !dir_refused) {
            match exe.serialize() {
                Ok(payload) => match disk.store(&key, &payload) {
                    Ok(stored) => {
                        bump(&self.counters.disk_writes, 1);
                        bump(&self.counters.disk_evictions, stored.evicted);
                        if let Some(e) = stored.evict_error {
                            errors.push(self.record(e));
                        }
                    }
                    Err(e) => errors.push(self.record(e)),
                },
                Err(source) => errors.push(self.record(CacheError::Serialize { source })),
            }
        }
        self.memory_insert(key, client, exe.clone());
        Ok(Cached { executable: exe, outcome: Outcome::Compiled, key, cache_errors: errors })
    }

    fn hit(
        &self,
        executable: Arc<LoadedExecutable>,
        key: CacheKey,
        outcome: Outcome,
        cache_errors: Vec<Arc<CacheError>>,
    ) -> Cached {
        let counter = match outcome {
            Outcome::MemoryHit => &self.counters.memory_hits,
            Outcome::DiskHit => &self.counters.disk_hits,
            Outcome::Compiled => &self.counters.compiles,
        };
        bump(counter, 1);
        Cached { executable, outcome, key, cache_errors }
    }

    fn memory_get(&self, key: &CacheKey, client: &Client) -> Option<Arc<LoadedExecutable>> {
        if self.config.memory_entries == 0 {
            return None;
        }
        self.lock(&self.memory).get(key, client)
    }

    fn memory_insert(&self, key: CacheKey, client: &Client, exe: Arc<LoadedExecutable>) {
        let evicted = self.lock(&self.memory).insert(key, client, exe);
        bump(&self.counters.memory_evictions, evicted);
    }

    /// Counts `error`, remembers it as the last error, and returns it shared.
    fn record(&self, error: CacheError) -> Arc<CacheError> {
        let counter = match &error {
            CacheError::Corrupt { .. } => &self.counters.corrupt_entries,
            CacheError::UntrustedDir { .. } | CacheError::UntrustedEntry { .. } => {
                &self.counters.untrusted
            }
            CacheError::Read { .. } => &self.counters.disk_read_failures,
            CacheError::CreateDir { .. }
            | CacheError::Write { .. }
            | CacheError::Serialize { .. }
            | CacheError::Evict { .. } => &self.counters.disk_write_failures,
        };
        bump(counter, 1);
        if error.is_untrusted() && !self.warned_untrusted.swap(true, Ordering::Relaxed) {
            eprintln!("tpu-kernels: warning: {error}");
        }
        let error = Arc::new(error);
        *self.lock(&self.last_error) = Some(error.clone());
        error
    }

    fn lock<'a, T>(&self, m: &'a Mutex<T>) -> std::sync::MutexGuard<'a, T> {
        // Nothing inside these locks can leave the data inconsistent mid-update: recover from a
        // poisoned lock rather than propagating a panic of another thread.
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A snapshot of the counters (a handful of relaxed atomic loads).
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheStats {
            memory_hits: get(&c.memory_hits),
            disk_hits: get(&c.disk_hits),
            misses: get(&c.misses),
            compiles: get(&c.compiles),
            compile_errors: get(&c.compile_errors),
            compile_time: Duration::from_nanos(get(&c.compile_nanos)),
            disk_load_time: Duration::from_nanos(get(&c.disk_load_nanos)),
            disk_writes: get(&c.disk_writes),
            disk_write_failures: get(&c.disk_write_failures),
            disk_read_failures: get(&c.disk_read_failures),
            corrupt_entries: get(&c.corrupt_entries),
            untrusted: get(&c.untrusted),
            memory_evictions: get(&c.memory_evictions),
            disk_evictions: get(&c.disk_evictions),
        }
    }

    /// The most recent cache error worked around, if any.
    pub fn last_error(&self) -> Option<Arc<CacheError>> {
        self.lock(&self.last_error).clone()
    }

    /// The disk tier's directory, if the disk tier is on.
    pub fn disk_dir(&self) -> Option<&Path> {
        self.disk.as_ref().map(DiskTier::dir)
    }

    /// The path of `key`'s disk entry (whether or not it exists), if the disk tier is on.
    pub fn entry_path(&self, key: &CacheKey) -> Option<PathBuf> {
        self.disk.as_ref().map(|d| d.path(key))
    }

    /// The disk entries present: (path, size in bytes). Empty without a disk tier or directory.
    pub fn disk_entries(&self) -> Result<Vec<(PathBuf, u64)>, CacheError> {
        let Some(disk) = &self.disk else { return Ok(Vec::new()) };
        let mut entries = disk
            .entries()
            .map_err(|source| CacheError::Read { path: disk.dir().to_path_buf(), source })?;
        entries.sort();
        Ok(entries.into_iter().map(|(path, len, _)| (path, len)).collect())
    }

    /// How many executables the memory tier holds.
    pub fn memory_len(&self) -> usize {
        self.lock(&self.memory).len()
    }

    /// Drops `key`'s executables on `client` from memory and its disk entry; returns whether
    /// anything was removed.
    pub fn remove(&self, client: &Client, key: &CacheKey) -> Result<bool, CacheError> {
        let in_memory = self.lock(&self.memory).remove(key, client);
        let on_disk = match &self.disk {
            Some(disk) => disk
                .remove(key)
                .map_err(|source| CacheError::Write { path: disk.path(key), source })?,
            None => false,
        };
        Ok(in_memory || on_disk)
    }

    /// Drops every in-memory executable of `client`, so the cache no longer keeps it alive;
    /// returns how many. Disk entries stay.
    pub fn forget_client(&self, client: &Client) -> usize {
        self.lock(&self.memory).remove_client(client)
    }

    /// Empties the memory tier (disk entries stay).
    pub fn clear_memory(&self) {
        self.lock(&self.memory).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn cache_is_send_and_sync() {
        assert_send_sync::<CompileCache>();
        assert_send_sync::<Cached>();
        assert_send_sync::<CacheError>();
    }

    #[test]
    fn config_defaults() {
        let c = CacheConfig::default();
        assert_eq!(c.memory_entries, DEFAULT_MEMORY_ENTRIES);
        assert!(c.disk_dir.as_deref().is_some_and(|d| d.ends_with("compile")));
        assert_eq!(CacheConfig::memory_only(3).disk_dir, None);
        assert_eq!(CacheConfig::in_dir("/x").disk_dir.as_deref(), Some(Path::new("/x")));
    }
}
