//! The on-disk tier: one verified file per key, written atomically.
//!
//! Writers never touch a final entry in place: they write a uniquely named temporary file in the
//! same directory (`create_new`, so two writers never share one) and `rename` it over the entry,
//! which POSIX makes atomic. Readers therefore see a complete old file, a complete new file or
//! none, from any number of threads and processes, with no locks. Files are not `fsync`ed: after
//! a crash an entry may be empty or garbage, which its checksum catches and the cache replaces.
//!
//! Entries are native code the process runs, so the tier loads only what this user wrote (the
//! trust rule in [`super`]): the directory and each entry must be owned by the effective uid and
//! not writable by group or others. The directory (and any parent the cache creates) is made
//! 0700 and entries 0600, so everything the cache writes passes. An entry is checked on the open
//! file (`fstat` of the descriptor that is then read), so it cannot be swapped between the check
//! and the read.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use super::entry;
use super::error::{CacheError, UntrustedReason};
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

    /// Whether the directory exists (`Ok(false)` when it does not, or is not a directory), and
    /// is trusted ([`CacheError::UntrustedDir`] when it is not).
    pub(crate) fn check_dir(&self) -> Result<bool, CacheError> {
        let meta = match fs::metadata(&self.dir) {
            Ok(meta) => meta,
            Err(e) if is_absent(&e) => return Ok(false),
            Err(source) => return Err(CacheError::Read { path: self.dir.clone(), source }),
        };
        if !meta.is_dir() {
            return Ok(false);
        }
        match untrusted(&meta) {
            Some(reason) => Err(CacheError::UntrustedDir { dir: self.dir.clone(), reason }),
            None => Ok(true),
        }
    }

    /// The payload stored for `key`: `Ok(None)` when there is no entry (or no directory yet).
    /// An untrusted directory or entry is an error, and nothing of it is read.
    pub(crate) fn load(&self, key: &CacheKey) -> Result<Option<Vec<u8>>, CacheError> {
        if !self.check_dir()? {
            return Ok(None);
        }
        let path = self.path(key);
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if is_absent(&e) => return Ok(None),
            Err(source) => return Err(CacheError::Read { path, source }),
        };
        let meta = match file.metadata() {
            Ok(meta) => meta,
            Err(source) => return Err(CacheError::Read { path, source }),
        };
        if let Some(reason) = untrusted(&meta) {
            return Err(CacheError::UntrustedEntry { path, reason });
        }
        let mut bytes = Vec::new();
        if let Err(source) = file.read_to_end(&mut bytes) {
            return Err(CacheError::Read { path, source });
        }
        let range = match entry::decode(&bytes, key) {
            Ok(payload) => {
                let start = payload.as_ptr() as usize - bytes.as_ptr() as usize;
                start..start + payload.len()
            }
            Err(reason) => return Err(CacheError::Corrupt { path, reason }),
        };
        if self.max_bytes.is_some() {
            // Recently used entries are evicted last: a hit refreshes the mtime (best effort; the
            // owner may set the times through a read-only descriptor).
            let _ = file.set_modified(SystemTime::now());
        }
        bytes.truncate(range.end);
        bytes.drain(..range.start);
        Ok(Some(bytes))
    }

    /// Stores `payload` as the entry for `key`, atomically replacing any existing file. Creates
    /// the directory (0700) if needed; refuses to write into an untrusted one.
    pub(crate) fn store(&self, key: &CacheKey, payload: &[u8]) -> Result<Stored, CacheError> {
        create_private_dir(&self.dir)
            .map_err(|source| CacheError::CreateDir { dir: self.dir.clone(), source })?;
        // Another user could replace what is written into an untrusted directory.
        self.check_dir()?;
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

/// Writes a new file readable and writable by this user only (0600 on Unix).
fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.flush()
}

/// Creates `dir` and its missing parents, each accessible by this user only (0700 on Unix).
/// Directories that already exist keep their mode.
fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// What makes a directory or an entry untrusted, if anything: another owner than this
/// process's effective uid, or write permission for group or others.
#[cfg(unix)]
fn untrusted(meta: &fs::Metadata) -> Option<UntrustedReason> {
    use std::os::unix::fs::MetadataExt;
    let user = rustix::process::geteuid().as_raw();
    if meta.uid() != user {
        return Some(UntrustedReason::Owner { owner: meta.uid(), user });
    }
    let mode = meta.mode() & 0o7777;
    (mode & 0o022 != 0).then_some(UntrustedReason::Writable { mode })
}

/// Without Unix owners and modes there is nothing to check.
#[cfg(not(unix))]
fn untrusted(_meta: &fs::Metadata) -> Option<UntrustedReason> {
    None
}
