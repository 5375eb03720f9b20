//! The on-disk entry format: one file per key, a fixed header, then the serialized executable.
//!
//! ```text
//! offset  size  field
//!      0     8  magic            b"TPUKXEXE"
//!      8     4  format version   u32 little-endian (FORMAT_VERSION)
//!     12     4  header length    u32 little-endian (HEADER_LEN = 88; room to grow)
//!     16    32  key              the CacheKey the entry answers
//!     48     8  payload length   u64 little-endian
//!     56    32  checksum         BLAKE3 of the payload
//!     88     *  payload          PJRT's serialized executable (LoadedExecutable::serialize)
//! ```
//!
//! A file is accepted only if every field checks out: magic, version, header length, key equal
//! to the key asked for (so a file renamed over another key's name is rejected), the file exactly
//! `HEADER_LEN + payload length` bytes long (truncated or appended files are rejected), and the
//! payload's checksum. Files are named `<64 hex digits of the key>.tpukexe`.

use super::error::CorruptReason;
use super::key::CacheKey;

/// The first eight bytes of every entry.
pub const MAGIC: [u8; 8] = *b"TPUKXEXE";
/// The format version this build writes and reads. Entries of other versions are stale.
pub const FORMAT_VERSION: u32 = 1;
/// The header's length in bytes.
pub const HEADER_LEN: usize = 88;
/// The file name extension of entries.
pub const EXTENSION: &str = "tpukexe";

/// The file name of the entry for `key`.
pub fn file_name(key: &CacheKey) -> String {
    format!("{}.{EXTENSION}", key.to_hex())
}

/// The complete file contents of the entry for `key` holding `payload`.
pub fn encode(key: &CacheKey, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(payload).as_bytes());
    debug_assert_eq!(out.len(), HEADER_LEN);
    out.extend_from_slice(payload);
    out
}

/// Checks a file's contents against `key` and returns its payload.
pub fn decode<'a>(bytes: &'a [u8], key: &CacheKey) -> Result<&'a [u8], CorruptReason> {
    let len = bytes.len() as u64;
    if bytes.len() < 16 {
        return Err(CorruptReason::TooShort { len });
    }
    if bytes[..8] != MAGIC {
        return Err(CorruptReason::BadMagic);
    }
    let version = u32::from_le_bytes(array(&bytes[8..12]));
    if version != FORMAT_VERSION {
        return Err(CorruptReason::Version { found: version });
    }
    if bytes.len() < HEADER_LEN {
        return Err(CorruptReason::TooShort { len });
    }
    if u32::from_le_bytes(array(&bytes[12..16])) as usize != HEADER_LEN {
        // Same version, other header length: the header itself is damaged.
        return Err(CorruptReason::Checksum);
    }
    if bytes[16..48] != key.as_bytes()[..] {
        return Err(CorruptReason::KeyMismatch);
    }
    let expected = u64::from_le_bytes(array(&bytes[48..56]));
    let payload = &bytes[HEADER_LEN..];
    if payload.len() as u64 != expected {
        return Err(CorruptReason::Length { expected, found: payload.len() as u64 });
    }
    if blake3::hash(payload).as_bytes()[..] != bytes[56..88] {
        return Err(CorruptReason::Checksum);
    }
    Ok(payload)
}

fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(bytes);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> CacheKey {
        CacheKey::from_bytes([b; 32])
    }

    #[test]
    fn round_trip() {
        let bytes = encode(&key(1), b"payload");
        assert_eq!(bytes.len(), HEADER_LEN + 7);
        assert_eq!(decode(&bytes, &key(1)), Ok(&b"payload"[..]));
        assert_eq!(decode(&encode(&key(1), b""), &key(1)), Ok(&b""[..]));
    }

    #[test]
    fn rejects_every_kind_of_damage() {
        let good = encode(&key(1), b"some executable bytes");
        assert_eq!(decode(&good, &key(2)), Err(CorruptReason::KeyMismatch));
        assert_eq!(decode(&good[..10], &key(1)), Err(CorruptReason::TooShort { len: 10 }));
        assert_eq!(decode(&good[..40], &key(1)), Err(CorruptReason::TooShort { len: 40 }));
        assert_eq!(
            decode(&good[..good.len() - 3], &key(1)),
            Err(CorruptReason::Length { expected: 21, found: 18 })
        );
        let mut appended = good.clone();
        appended.push(0);
        assert_eq!(
            decode(&appended, &key(1)),
            Err(CorruptReason::Length { expected: 21, found: 22 })
        );
        let mut magic = good.clone();
        magic[0] ^= 1;
        assert_eq!(decode(&magic, &key(1)), Err(CorruptReason::BadMagic));
        let mut version = good.clone();
        version[8] = 7;
        assert_eq!(decode(&version, &key(1)), Err(CorruptReason::Version { found: 7 }));
        let mut header_len = good.clone();
        header_len[12] = 99;
        assert_eq!(decode(&header_len, &key(1)), Err(CorruptReason::Checksum));
        for at in [HEADER_LEN, good.len() - 1, 60] {
            let mut flipped = good.clone();
            flipped[at] ^= 0x40;
            assert_eq!(decode(&flipped, &key(1)), Err(CorruptReason::Checksum), "byte {at}");
        }
        assert!(decode(&[], &key(1)).is_err());
    }

    #[test]
    fn names() {
        assert_eq!(file_name(&key(0xab)), format!("{}.tpukexe", "ab".repeat(32)));
    }
}
