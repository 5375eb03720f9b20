//! The on-disk tier: one verified file per key, written atomically.
//!
//! Writers never touch a final entry in place: they write a uniquely named temporary file in the
//! same directory (`create_new`, so two writers never share one) and `rename` it over the entry,
//! which POSIX makes atomic. Readers therefore see a complete old file, a complete new file or
//! none, from any number of threads and processes, with no locks. Files are not `fsync`ed: after
//! a crash an entry may be empty or garbage, which its checksum catches and the cache replaces.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use super::entry;
use super::error::CacheError;
use super::key::CacheKey;

/// Temporary files start with this; ones older than [`STALE_TEMP`] belong to a crashed writer.
const TEMP_PREFIX: &str = ".tmp-";
const STALE_TEMP: Duration = Duration::from_secs(3600);

#[derive(Debug)]
pub(crate) struct DiskTier {
    dir: PathBuf,
    max_bytes: Option<u64>,
}

/// What a successful store did.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    /// Entries removed to honour the size bound.
    pub(crate) evicted: u64,
    /// A failure of the eviction pass (the entry itself was stored).
    pub(crate) evict_error: Option<CacheError>,
}

impl DiskTier {
    pub(crate) fn new(dir: PathBuf, max_bytes: Option<u64>) -> Self {
        Self { dir, max_bytes }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(entry::file_name(key))
    }

    /// The payload stored for `key`: `Ok(None)` when there is no entry (or no directory yet).
    pub(crate) fn load(&self, key: &CacheKey) -> Result<Option<Vec<u8>>, CacheError> {
        let path = self.path(key);
        let mut bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if is_absent(&e) => return Ok(None),
            Err(source) => return Err(CacheError::Read { path, source }),
        };
        let range = match entry::decode(&bytes, key) {
            Ok(payload) => {
                let start = payload.as_ptr() as usize - bytes.as_ptr() as usize;
                start..start + payload.len()
            }
            Err(reason) => return Err(CacheError::Corrupt { path, reason }),
        };
        if self.max_bytes.is_some() {
            // Recently used entries are evicted last: a hit refreshes the mtime (best effort).
            let _ = File::options()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_modified(SystemTime::now()));
        }
        bytes.truncate(range.end);
        bytes.drain(..range.start);
        Ok(Some(bytes))
    }

    /// Stores `payload` as the entry for `key`, atomically replacing any existing file.
    pub(crate) fn store(&self, key: &CacheKey, payload: &[u8]) -> Result<Stored, CacheError> {
        fs::create_dir_all(&self.dir)
            .map_err(|source| CacheError::CreateDir { dir: self.dir.clone(), source })?;
        let path = self.path(key);
        let temp = self.dir.join(temp_name(key));
        let written =
            write_new(&temp, &entry::encode(key, payload)).and_then(|()| fs::rename(&temp, &path));
        if let Err(source) = written {
            // Leave nothing behind: a half-written temporary file is garbage.
            let _ = fs::remove_file(&temp);
            return Err(CacheError::Write { path, source });
        }
        let mut stored = Stored::default();
        if let Some(max) = self.max_bytes {
            match self.evict(max, &path) {
                Ok(n) => stored.evicted = n,
                Err(source) => {
                    stored.evict_error = Some(CacheError::Evict { dir: self.dir.clone(), source })
                }
            }
        }
        Ok(stored)
    }

    /// Removes the entry for `key`, if present.
    pub(crate) fn remove(&self, key: &CacheKey) -> io::Result<bool> {
        match fs::remove_file(self.path(key)) {
            Ok(()) => Ok(true),
            Err(e) if is_absent(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The entries present: (path, length, mtime). Temporary files of crashed writers are
    /// removed on the way.
    pub(crate) fn entries(&self) -> io::Result<Vec<(PathBuf, u64, SystemTime)>> {
        let read = match fs::read_dir(&self.dir) {
            Ok(read) => read,
            Err(e) if is_absent(&e) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let now = SystemTime::now();
        let mut out = Vec::new();
        for item in read {
            let item = item?;
            let name = item.file_name();
            let name = name.to_string_lossy();
            // Another process may remove a file between listing and stat: skip it.
            let Ok(meta) = item.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let mtime = meta.modified().unwrap_or(now);
            if name.starts_with(TEMP_PREFIX) {
                if now.duration_since(mtime).is_ok_and(|age| age > STALE_TEMP) {
                    let _ = fs::remove_file(item.path());
                }
                continue;
            }
            if Path::new(&*name).extension().is_some_and(|e| e == entry::EXTENSION) {
                out.push((item.path(), meta.len(), mtime));
            }
        }
        Ok(out)
    }

    /// Removes the least recently used entries (oldest mtime first, never `keep`) until the
    /// directory holds at most `max` bytes of entries; returns how many were removed.
    fn evict(&self, max: u64, keep: &Path) -> io::Result<u64> {
        let mut entries = self.entries()?;
        let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
        if total <= max {
            return Ok(0);
        }
        entries.sort_by(|a, b| a.2.cmp(&b.2).then_with(|| a.0.cmp(&b.0)));
        let mut removed = 0;
        for (path, len, _) in entries {
            if total <= max {
                break;
            }
            if path == keep {
                continue;
            }
            match fs::remove_file(&path) {
                Ok(()) => removed += 1,
                // Another process evicted or replaced it first.
                Err(e) if is_absent(&e) => {}
                Err(e) => return Err(e),
            }
            total = total.saturating_sub(len);
        }
        Ok(removed)
    }
}

fn is_absent(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory)
}

/// A temporary file name no other writer (thread or process) uses at the same time.
fn temp_name(key: &CacheKey) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos =
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let hex = key.to_hex();
    format!("{TEMP_PREFIX}{}-{}-{n}-{nanos:08x}", &hex[..16], std::process::id())
}

fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).open(path)?;
    file.write_all(bytes)?;
    file.flush()
}
