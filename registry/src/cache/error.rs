//! What can go wrong in the cache itself. None of it fails a compile: the cache records it (in
//! [`CacheStats`](super::CacheStats), [`CompileCache::last_error`](super::CompileCache::last_error)
//! and [`Cached::cache_errors`](super::Cached::cache_errors)) and falls back to compiling.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::pjrt;

/// A failure of the cache's disk tier (or of serializing an executable for it). The compile that
/// met it still succeeds; a strict caller inspects these to decide whether to care.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// The cache directory could not be created (a path component is a file, no permission, a
    /// read-only file system).
    #[error("cannot create compile cache directory {dir}: {source}")]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// An entry could not be written (disk full, no permission, quota); nothing was left behind.
    #[error("cannot write compile cache entry {path}: {source}")]
    Write {
        /// The entry's final path.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// An entry exists but could not be read (an error other than "not found").
    #[error("cannot read compile cache entry {path}: {source}")]
    Read {
        /// The entry.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// An entry is corrupt, truncated, stale or belongs to another key; it is recompiled and
    /// replaced.
    #[error("corrupt compile cache entry {path}: {reason}")]
    Corrupt {
        /// The entry.
        path: PathBuf,
        /// What is wrong with it.
        reason: CorruptReason,
    },
    /// The plugin could not serialize a freshly compiled executable, so it was not stored.
    #[error("cannot serialize the executable for the compile cache: {source}")]
    Serialize {
        /// The PJRT error.
        #[source]
        source: pjrt::Error,
    },
    /// The cache directory is not trusted (see the trust rule in [`super`]): it is owned by
    /// another user, or group or others may write to it. Nothing is loaded from it or written
    /// to it; the executable is compiled and kept in memory only.
    #[error(
        "refusing compile cache directory {dir}: {reason}; the cache neither loads from it nor writes to it"
    )]
    UntrustedDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: UntrustedReason,
    },
    /// An entry is not trusted (owned by another user, or writable by group or others); it is
    /// not loaded, but recompiled and replaced by an entry of this user's.
    #[error("refusing compile cache entry {path}: {reason}; not loading it")]
    UntrustedEntry {
        /// The entry.
        path: PathBuf,
        /// What is wrong with it.
        reason: UntrustedReason,
    },
    /// Old entries could not be removed to keep the disk tier under its size bound.
    #[error("cannot evict compile cache entries in {dir}: {source}")]
    Evict {
        /// The cache directory.
        dir: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

/// Why an on-disk entry was rejected (see [`super::entry`] for the format).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CorruptReason {
    /// The file is shorter than the header.
    TooShort {
        /// The file's length in bytes.
        len: u64,
    },
    /// The file does not start with the entry magic.
    BadMagic,
    /// The entry was written by another format version (a stale entry).
    Version {
        /// The version in the file.
        found: u32,
    },
    /// The header names another key (a file renamed or copied over another).
    KeyMismatch,
    /// The payload is shorter or longer than the header says (a truncated or appended file).
    Length {
        /// The payload length the header records.
        expected: u64,
        /// The payload length present.
        found: u64,
    },
    /// The payload's checksum does not match the header's (flipped bytes).
    Checksum,
    /// The payload passed every check but the plugin refused to load it.
    Deserialize {
        /// The plugin's message.
        message: String,
    },
}

impl fmt::Display for CorruptReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooShort { len } => write!(f, "file too short for a header ({len} bytes)"),
            Self::BadMagic => f.write_str("bad magic (not a compile cache entry)"),
            Self::Version { found } => write!(
                f,
                "stale entry of format version {found} (this build reads version {})",
                super::entry::FORMAT_VERSION
            ),
            Self::KeyMismatch => f.write_str("the header names another key"),
            Self::Length { expected, found } => {
                write!(f, "payload is {found} bytes, header says {expected}")
            }
            Self::Checksum => f.write_str("payload checksum mismatch"),
            Self::Deserialize { message } => write!(f, "the plugin cannot load it: {message}"),
        }
    }
}

/// Why a directory or an entry of the disk tier is not trusted: someone other than this user
/// could have written what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UntrustedReason {
    /// It is owned by another user.
    Owner {
        /// Its owner's uid.
        owner: u32,
        /// This process's effective uid.
        user: u32,
    },
    /// Group or others may write to it (`mode & 0o022 != 0`).
    Writable {
        /// Its permission bits (`st_mode & 0o7777`).
        mode: u32,
    },
}

impl fmt::Display for UntrustedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Owner { owner, user } => {
                write!(f, "it is owned by uid {owner}, not by this user (uid {user})")
            }
            Self::Writable { mode } => {
                write!(f, "its mode {mode:04o} lets group or others write to it (chmod go-w)")
            }
        }
    }
}

impl CacheError {
    /// Whether the error is about a corrupt (or stale) entry, which the cache replaced.
    pub fn is_corrupt_entry(&self) -> bool {
        matches!(self, Self::Corrupt { .. })
    }

    /// Whether the cache refused an untrusted directory or entry.
    pub fn is_untrusted(&self) -> bool {
        matches!(self, Self::UntrustedDir { .. } | Self::UntrustedEntry { .. })
    }
}
