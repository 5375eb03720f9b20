//! Cache keys: a 256-bit BLAKE3 fingerprint of everything that decides what a compile produces.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::pjrt::{AttributeValue, Client, CompileOptions, Plugin, Program};

/// The version of the key recipe. Bump it whenever what goes into a key, or how, changes: every
/// old entry then simply stops being found.
pub const KEY_VERSION: u32 = 3;

/// How many bytes of the plugin file, at its start and at its end, go into its identity.
const PLUGIN_SAMPLE: u64 = 1 << 20;

/// The fingerprint a compiled executable is cached under: 32 bytes of BLAKE3 over
///
/// 1. [`KEY_VERSION`];
/// 2. the program: StableHLO text with every location stripped
///    ([`tpu_kernels::reader::strip_locations`]) and each line trimmed, blank lines dropped, so
///    the same specialised module emitted from another file or line, or indented differently,
///    hits the same entry (bytecode, and text that does not tokenize, are hashed verbatim);
/// 3. the compile options, as the exact `CompileOptionsProto` bytes PJRT receives
///    ([`CompileOptions::for_client`]'s [`CompileOptions::to_proto`], deterministic: the host's
///    vector width is in it);
/// 4. the plugin's identity (see [`CacheKey::compute`]);
/// 5. the client's platform name and version and its devices (id, kind), since an executable is
///    built for a device set;
/// 6. the compilers' flag variables as this process read them ([`COMPILER_FLAG_VARS`]: XLA's
///    `XLA_FLAGS`, libtpu's `LIBTPU_INIT_ARGS`), since a flag can change the code XLA emits (its
///    fusion passes, fast math, the runtime): a program compiled under other flags is compiled
///    again, not loaded.
///
/// Every field is tagged and length-prefixed, so no two different inputs share an encoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey([u8; 32]);

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({})", self.to_hex())
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl CacheKey {
    /// The key of compiling `program` with `options` on `client`.
    ///
    /// The plugin's identity is its PJRT C API version, all of its attributes (XLA version,
    /// StableHLO versions, ...), the plugin file's size, and BLAKE3 of its first and last MiB.
    /// The sampled bytes hold the ELF header, the build-id note and the section header table, so
    /// a rebuilt or upgraded plugin gets new keys, while reinstalling the identical file (which
    /// changes its mtime) keeps the cache valid; hashing all of a 470 MB libtpu would cost far
    /// more than a warm start saves. It is computed once per plugin file and process.
    pub fn compute(client: &Client, program: &Program, options: &CompileOptions) -> CacheKey {
        let mut h = blake3::Hasher::new_derive_key("tpu-kernels compile cache key");
        h.update(&KEY_VERSION.to_le_bytes());
        let module = module_bytes(program);
        field(&mut h, b"module", &module);
        field(&mut h, b"options", &options.for_client(client).to_proto());
        field(&mut h, b"plugin", &plugin_fingerprint(&client.plugin()));
        field(&mut h, b"platform", client.platform().as_bytes());
        field(&mut h, b"platform_version", client.platform_version().as_bytes());
        field(&mut h, b"devices", &(client.devices().len() as u64).to_le_bytes());
        for d in client.devices() {
            field(&mut h, b"device_id", &d.id().to_le_bytes());
            field(&mut h, b"device_kind", d.kind().as_bytes());
        }
        field(&mut h, b"compiler_flags", compiler_flags());
        CacheKey(*h.finalize().as_bytes())
    }

    /// A key from its 32 bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> CacheKey {
        CacheKey(bytes)
    }

    /// The key's 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        use fmt::Write as _;
        self.0.iter().fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }

    /// Parses 64 hex digits (as in an entry's file name).
    pub fn from_hex(hex: &str) -> Option<CacheKey> {
        if hex.len() != 64 || !hex.is_ascii() {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(CacheKey(out))
    }
}

/// The environment variables whose values change what the plugins compile. XLA and libtpu read
/// them once, when a plugin first parses its flags.
pub const COMPILER_FLAG_VARS: [&str; 2] = ["XLA_FLAGS", "LIBTPU_INIT_ARGS"];

/// [`COMPILER_FLAG_VARS`]' values, read once per process as the plugins read them (the first key
/// is computed before the first compile, so later changes to the environment, which the plugins
/// do not see either, do not change keys).
fn compiler_flags() -> &'static [u8] {
    static FLAGS: OnceLock<Vec<u8>> = OnceLock::new();
    FLAGS.get_or_init(|| flags_bytes(COMPILER_FLAG_VARS.map(std::env::var_os)))
}

/// Each variable's state tagged (absent, or its bytes length-prefixed): an unset variable and
/// an empty one are told apart.
fn flags_bytes(values: [Option<std::ffi::OsString>; 2]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        match v {
            None => out.push(0),
            Some(v) => {
                let b = v.as_encoded_bytes();
                out.push(1);
                out.extend_from_slice(&(b.len() as u64).to_le_bytes());
                out.extend_from_slice(b);
            }
        }
    }
    out
}

/// Writes one tagged, length-prefixed field.
fn field(h: &mut blake3::Hasher, tag: &[u8], value: &[u8]) {
    h.update(&(tag.len() as u64).to_le_bytes());
    h.update(tag);
    h.update(&(value.len() as u64).to_le_bytes());
    h.update(value);
}

/// The program bytes that go into the key: location-stripped text when possible.
fn module_bytes(program: &Program) -> Cow<'_, [u8]> {
    let raw = program.as_bytes();
    if program.is_bytecode() {
        return Cow::Owned([b"raw:".as_slice(), raw].concat());
    }
    match std::str::from_utf8(raw).ok().and_then(|t| tpu_kernels::reader::strip_locations(t).ok()) {
        Some(stripped) => {
            // MLIR string literals cannot span lines, so indentation, trailing blanks and blank
            // lines are never significant: drop them too.
            let mut out = b"text:".to_vec();
            for line in stripped.lines().map(str::trim).filter(|l| !l.is_empty()) {
                out.extend_from_slice(line.as_bytes());
                out.push(b'\n');
            }
            Cow::Owned(out)
        }
        None => Cow::Owned([b"raw:".as_slice(), raw].concat()),
    }
}

/// The plugin's identity, memoised per canonical path (a plugin is loaded once per path and
/// never unloaded, so the file read the first time is the code that runs).
pub(crate) fn plugin_fingerprint(plugin: &Plugin) -> [u8; 32] {
    static MEMO: OnceLock<Mutex<HashMap<PathBuf, [u8; 32]>>> = OnceLock::new();
    let memo = MEMO.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(fp) = memo.lock().unwrap_or_else(|e| e.into_inner()).get(plugin.path()) {
        return *fp;
    }
    let mut h = blake3::Hasher::new_derive_key("tpu-kernels plugin identity");
    let (major, minor) = plugin.attributes().api_version();
    field(&mut h, b"api_version", &[major.to_le_bytes(), minor.to_le_bytes()].concat());
    for (name, value) in plugin.attributes().iter() {
        field(&mut h, b"attribute", name.as_bytes());
        field(&mut h, b"value", &attribute_bytes(value));
    }
    match sample_file(plugin.path()) {
        Ok((len, sample)) => {
            field(&mut h, b"file_len", &len.to_le_bytes());
            field(&mut h, b"file_sample", sample.as_bytes());
        }
        // Unreadable now (the attributes still identify the build): key by the path as well.
        Err(_) => field(&mut h, b"file_path", plugin.path().as_os_str().as_encoded_bytes()),
    }
    let fp = *h.finalize().as_bytes();
    memo.lock().unwrap_or_else(|e| e.into_inner()).insert(plugin.path().to_path_buf(), fp);
    fp
}

fn attribute_bytes(value: &AttributeValue) -> Vec<u8> {
    match value {
        AttributeValue::String(s) => [b"s".as_slice(), s.as_bytes()].concat(),
        AttributeValue::Int64(v) => [b"i".as_slice(), &v.to_le_bytes()].concat(),
        AttributeValue::Int64List(v) => {
            let mut out = b"l".to_vec();
            v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
            out
        }
        AttributeValue::Float(v) => [b"f".as_slice(), &v.to_bits().to_le_bytes()].concat(),
        AttributeValue::Bool(v) => vec![b'b', u8::from(*v)],
        AttributeValue::Unknown(tag) => [b"u".as_slice(), &tag.to_le_bytes()].concat(),
    }
}

/// The file's length and BLAKE3 of its first and last [`PLUGIN_SAMPLE`] bytes.
fn sample_file(path: &Path) -> std::io::Result<(u64, blake3::Hash)> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; PLUGIN_SAMPLE.min(len) as usize];
    file.read_exact(&mut buf)?;
    h.update(&buf);
    if len > PLUGIN_SAMPLE {
        let tail = PLUGIN_SAMPLE.min(len - PLUGIN_SAMPLE);
        file.seek(SeekFrom::Start(len - tail))?;
        buf.truncate(tail as usize);
        file.read_exact(&mut buf)?;
        h.update(&buf);
    }
    Ok((len, h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiler_flags_are_told_apart() {
        let unset = flags_bytes([None, None]);
        let empty = flags_bytes([Some("".into()), None]);
        let dump = flags_bytes([Some("--xla_dump_to=/tmp/d".into()), None]);
        let other = flags_bytes([None, Some("--xla_dump_to=/tmp/d".into())]);
        assert_ne!(unset, empty);
        assert_ne!(empty, dump);
        assert_ne!(dump, other);
        assert_eq!(dump, flags_bytes([Some("--xla_dump_to=/tmp/d".into()), None]));
    }

    #[test]
    fn hex_round_trip() {
        let k = CacheKey::from_bytes(std::array::from_fn(|i| i as u8 * 7));
        assert_eq!(CacheKey::from_hex(&k.to_hex()), Some(k));
        assert_eq!(k.to_string().len(), 64);
        assert_eq!(CacheKey::from_hex("00"), None);
        assert_eq!(CacheKey::from_hex(&"zz".repeat(32)), None);
    }

    #[test]
    fn locations_do_not_change_the_module_bytes() {
        let a = Program::text(
            "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32> loc(\"x.py\":1:2)\n} loc(#l)\n#l = loc(\"y\")\n",
        );
        let b = Program::text(
            "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32>\n}\n",
        );
        assert_eq!(module_bytes(&a), module_bytes(&b));
        let c = Program::text(
            "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32> loc(\"x.py\":1:2)\n}\n",
        );
        assert_eq!(module_bytes(&a), module_bytes(&c));
        let d = Program::text(
            "\n  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {  \n\n    return %a : tensor<4xf32>\n}",
        );
        assert_eq!(module_bytes(&a), module_bytes(&d));
        assert_ne!(module_bytes(&a), module_bytes(&Program::text("func.func @other")));
        // Text that does not tokenize is hashed verbatim.
        assert!(module_bytes(&Program::text("\"unterminated")).starts_with(b"raw:"));
    }

    #[test]
    fn sampling_covers_small_and_large_files() {
        let dir = std::env::temp_dir().join(format!("tpuk-key-sample-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let small = dir.join("small");
        std::fs::write(&small, b"abc").unwrap();
        assert_eq!(sample_file(&small).unwrap(), (3, blake3::hash(b"abc")));
        let big = dir.join("big");
        let mut data = vec![1u8; (3 * PLUGIN_SAMPLE) as usize];
        std::fs::write(&big, &data).unwrap();
        let before = sample_file(&big).unwrap();
        // A change in the middle is not seen (by design); one at the end is.
        data[(PLUGIN_SAMPLE + 5) as usize] = 2;
        std::fs::write(&big, &data).unwrap();
        assert_eq!(sample_file(&big).unwrap(), before);
        let last = data.len() - 1;
        data[last] = 2;
        std::fs::write(&big, &data).unwrap();
        assert_ne!(sample_file(&big).unwrap(), before);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
