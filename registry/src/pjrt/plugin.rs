//! Loading PJRT plugins, their attributes, and finding the installed runtimes.

use std::collections::HashMap;
use std::ffi::{c_char, c_int};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use super::error::{Error, ErrorCode, Result, Runtime};
use super::sys;

/// Calls a PJRT entry point through a plugin's function table and turns the returned
/// `PJRT_Error*` into [`Error::Pjrt`]. Must be used inside an `unsafe` block whose SAFETY
/// comment explains why the argument struct's pointers are valid for the call.
macro_rules! pjrt_call {
    ($plugin:expr, $func:ident, $args:expr) => {{
        let plugin: &$crate::pjrt::plugin::PluginInner = &$plugin;
        match plugin.api.$func {
            Some(f) => plugin.check(stringify!($func), f($args)),
            None => Err(plugin.unsupported(stringify!($func))),
        }
    }};
}
pub(crate) use pjrt_call;

/// A loaded PJRT plugin (the XLA CPU plugin, libtpu, ...). Cheap to clone.
///
/// A plugin is loaded once per canonical path and never unloaded: the library stays mapped for
/// the life of the process, and every client, buffer and executable holds the plugin alive.
#[derive(Clone)]
pub struct Plugin {
    pub(crate) inner: Arc<PluginInner>,
}

pub(crate) struct PluginInner {
    pub(crate) path: PathBuf,
    pub(crate) api: &'static sys::PJRT_Api,
    pub(crate) attributes: PluginAttributes,
    pub(crate) ffi: Option<&'static sys::PJRT_FFI_Extension>,
    platform: OnceLock<String>,
}

// SAFETY: the PJRT function table and the FFI extension are immutable, process-lifetime data
// (the library is never unloaded); PJRT entry points are thread-safe by the C API's contract.
unsafe impl Send for PluginInner {}
// SAFETY: as above; nothing in `PluginInner` is mutated after load.
unsafe impl Sync for PluginInner {}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.inner.path)
            .field("api_version", &self.inner.attributes.api_version())
            .finish_non_exhaustive()
    }
}

fn loaded_plugins() -> &'static Mutex<HashMap<PathBuf, Plugin>> {
    static LOADED: OnceLock<Mutex<HashMap<PathBuf, Plugin>>> = OnceLock::new();
    LOADED.get_or_init(|| Mutex::new(HashMap::new()))
}

type GetPjrtApi = unsafe extern "C" fn() -> *const sys::PJRT_Api;

impl Plugin {
    /// Loads the PJRT plugin at `path` (once per process and canonical path), initializes it
    /// and reads its attributes.
    ///
    /// Errors: [`Error::PluginNotFound`] for a missing file, [`Error::PluginLoad`] for a file the
    /// dynamic loader refuses (not a shared library, truncated), [`Error::NotAPlugin`] when it
    /// exports no `GetPjrtApi`, [`Error::ApiTooOld`] for a plugin older than PJRT C API 0.81.
    pub fn load(path: impl AsRef<Path>) -> Result<Plugin> {
        let path = path.as_ref();
        let canonical =
            path.canonicalize().map_err(|_| Error::PluginNotFound { path: path.to_path_buf() })?;
        if !canonical.is_file() {
            return Err(Error::PluginLoad {
                path: path.to_path_buf(),
                message: "not a regular file".to_owned(),
            });
        }
        let mut loaded = loaded_plugins().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(plugin) = loaded.get(&canonical) {
            return Ok(plugin.clone());
        }
        // The dynamic loader maps a truncated library and faults (SIGBUS) on first touch, so
        // check the file is whole before handing it over.
        check_elf(&canonical)
            .map_err(|message| Error::PluginLoad { path: path.to_path_buf(), message })?;
        if is_libtpu(&canonical) && std::env::var_os("TPU_SKIP_MDS_QUERY").is_none() {
            // SAFETY: `set_var` races with concurrent reads of the environment by other threads.
            // It runs at most once per process (while the plugin lock is held, before libtpu is
            // mapped), and the project's test and run scripts export the variable beforehand so
            // this path is only a fallback. Without it libtpu blocks for ten minutes on start.
            unsafe { std::env::set_var("TPU_SKIP_MDS_QUERY", "1") };
        }
        if is_libtpu(&canonical) {
            // Without the metadata server (skipped above) libtpu knows no hosts and prints its
            // start-up warnings and a source trace on every load; this process is one host of
            // its own. Multi-host users set both variables, which are then left alone.
            for (name, value) in
                [("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_HOST_BOUNDS", "1,1,1")]
            {
                if std::env::var_os(name).is_none() {
                    // SAFETY: as above (once per process, under the plugin lock, before libtpu
                    // is mapped).
                    unsafe { std::env::set_var(name, value) };
                }
            }
        }
        if is_libtpu(&canonical) && std::env::var_os("ALLOW_MULTIPLE_LIBTPU_LOAD").is_none() {
            // SAFETY: as above. This project only uses libtpu's compile-only path, which touches
            // no device, so several processes (a test and the `tpuk` it runs, two CI jobs) may
            // load it at once; without this libtpu refuses every process but the first.
            unsafe { std::env::set_var("ALLOW_MULTIPLE_LIBTPU_LOAD", "1") };
        }
        // SAFETY: loading a shared library runs its initializers; the caller asked for this file
        // to be loaded as a PJRT plugin, which is exactly what a plugin file is meant for.
        let lib = unsafe { libloading::Library::new(&canonical) }
            .map_err(|e| Error::PluginLoad { path: path.to_path_buf(), message: e.to_string() })?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin (C API contract).
        let get_api = unsafe { lib.get::<GetPjrtApi>(b"GetPjrtApi\0") }
            .map(|sym| *sym)
            .map_err(|_| Error::NotAPlugin { path: path.to_path_buf() })?;
        // Keep the library mapped for the life of the process: the plugin's threads, the
        // function table and every handle point into it.
        std::mem::forget(lib);
        // SAFETY: calling the plugin's exported entry point, which takes no arguments.
        let raw = unsafe { get_api() };
        if raw.is_null() {
            return Err(Error::NotAPlugin { path: path.to_path_buf() });
        }
        // SAFETY: `GetPjrtApi` returns a pointer to a static table that lives as long as the
        // library, which is never unloaded.
        let api: &'static sys::PJRT_Api = unsafe { &*raw };
        let version = api.pjrt_api_version;
        if version.major_version != 0
            || version.minor_version < sys::MIN_API_MINOR
            || api.struct_size < std::mem::size_of::<sys::PJRT_Api>()
        {
            return Err(Error::ApiTooOld {
                path: path.to_path_buf(),
                found_major: version.major_version,
                found_minor: version.minor_version,
                required_minor: sys::MIN_API_MINOR,
            });
        }
        let mut inner = PluginInner {
            path: canonical.clone(),
            api,
            attributes: PluginAttributes {
                api_major: version.major_version,
                api_minor: version.minor_version,
                values: Vec::new(),
            },
            ffi: None,
            platform: OnceLock::new(),
        };
        let mut init = sys::PJRT_Plugin_Initialize_Args::new();
        // SAFETY: `init` is a valid, fully initialized argument struct with no pointers.
        unsafe { pjrt_call!(inner, PJRT_Plugin_Initialize, &mut init) }?;
        inner.attributes.values = read_attributes(&inner)?;
        inner.ffi = find_ffi_extension(api);
        let plugin = Plugin { inner: Arc::new(inner) };
        loaded.insert(canonical, plugin.clone());
        Ok(plugin)
    }

    /// The canonical path the plugin was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The plugin's attributes: PJRT C API version, StableHLO versions, XLA version, ...
    pub fn attributes(&self) -> &PluginAttributes {
        &self.inner.attributes
    }

    /// The plugin's platform name (`cpu`, `tpu`, ...), as its client reports it; for a plugin
    /// that cannot make a client here (libtpu without a TPU), as its default topology reports it.
    /// Determined once, on first use.
    pub fn platform(&self) -> Result<String> {
        if let Some(p) = self.inner.platform.get() {
            return Ok(p.clone());
        }
        let name = match super::Client::new(self, super::ClientOptions::new()) {
            Ok(client) => client.platform().to_owned(),
            Err(client_error) => match super::Topology::new(self, "") {
                Ok(topology) => topology.platform().to_owned(),
                Err(_) => return Err(client_error),
            },
        };
        Ok(self.inner.platform.get_or_init(|| name).clone())
    }

    /// Whether the plugin offers the FFI extension (host custom calls), as the CPU plugin does.
    pub fn has_ffi_extension(&self) -> bool {
        self.inner.ffi.is_some()
    }
}

/// Checks that `path` is a complete 64-bit little-endian ELF shared object: every loadable
/// segment and the header tables lie inside the file.
#[cfg(target_os = "linux")]
fn check_elf(path: &Path) -> std::result::Result<(), String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let mut header = [0u8; 64];
    if file.read_exact(&mut header).is_err() || &header[..4] != b"\x7fELF" {
        return Err("not an ELF shared library".to_owned());
    }
    if header[4] != 2 || header[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".to_owned());
    }
    let u16_at = |b: &[u8], o: usize| u64::from(u16::from_le_bytes([b[o], b[o + 1]]));
    let u64_at = |b: &[u8], o: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(v)
    };
    if u16_at(&header, 16) != 3 {
        return Err("not a shared object (ELF type is not ET_DYN)".to_owned());
    }
    let (phoff, shoff) = (u64_at(&header, 32), u64_at(&header, 40));
    let (phentsize, phnum) = (u16_at(&header, 54), u16_at(&header, 56));
    let (shentsize, shnum) = (u16_at(&header, 58), u16_at(&header, 60));
    let truncated = || format!("the file is truncated or corrupt ({len} bytes)");
    let inside = |off: u64, size: u64| off.checked_add(size).is_some_and(|end| end <= len);
    if !inside(phoff, phentsize * phnum) || (shnum > 0 && !inside(shoff, shentsize * shnum)) {
        return Err(truncated());
    }
    if phentsize < 40 {
        return Err(truncated());
    }
    let mut table = vec![0u8; (phentsize * phnum) as usize];
    file.seek(SeekFrom::Start(phoff)).map_err(|e| e.to_string())?;
    file.read_exact(&mut table).map_err(|_| truncated())?;
    for entry in table.chunks_exact(phentsize as usize) {
        const PT_LOAD: u32 = 1;
        let p_type = u32::from_le_bytes([entry[0], entry[1], entry[2], entry[3]]);
        if p_type == PT_LOAD && !inside(u64_at(entry, 8), u64_at(entry, 32)) {
            return Err(truncated());
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn check_elf(_: &Path) -> std::result::Result<(), String> {
    Ok(())
}

fn is_libtpu(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.contains("libtpu"))
}

fn read_attributes(inner: &PluginInner) -> Result<Vec<(String, AttributeValue)>> {
    let mut args = sys::PJRT_Plugin_Attributes_Args::new();
    // SAFETY: `args` is a valid argument struct; the plugin fills the out fields.
    unsafe { pjrt_call!(inner, PJRT_Plugin_Attributes, &mut args) }?;
    // SAFETY: the plugin returned `num_attributes` named values that live for the process.
    Ok(unsafe { named_values(args.attributes, args.num_attributes) })
}

/// Copies a PJRT array of named values into owned Rust values.
///
/// # Safety
/// `values` must point to `count` valid `PJRT_NamedValue`s (or be null with `count == 0`).
pub(crate) unsafe fn named_values(
    values: *const sys::PJRT_NamedValue,
    count: usize,
) -> Vec<(String, AttributeValue)> {
    if values.is_null() || count == 0 {
        return Vec::new();
    }
    // SAFETY: guaranteed by the caller.
    let values = unsafe { std::slice::from_raw_parts(values, count) };
    values
        .iter()
        .map(|v| {
            // SAFETY: PJRT named values carry `name`/`name_size` and a union tagged by `type_`
            // whose pointer members (string, list) hold `value_size` elements.
            unsafe {
                let name = lossy(v.name, v.name_size);
                let value = match v.type_ {
                    sys::NAMED_VALUE_STRING => {
                        AttributeValue::String(lossy(v.value.string_value, v.value_size))
                    }
                    sys::NAMED_VALUE_INT64 => AttributeValue::Int64(v.value.int64_value),
                    sys::NAMED_VALUE_INT64_LIST => {
                        let p = v.value.int64_array_value;
                        AttributeValue::Int64List(if p.is_null() {
                            Vec::new()
                        } else {
                            std::slice::from_raw_parts(p, v.value_size).to_vec()
                        })
                    }
                    sys::NAMED_VALUE_FLOAT => AttributeValue::Float(v.value.float_value),
                    sys::NAMED_VALUE_BOOL => AttributeValue::Bool(v.value.bool_value),
                    other => AttributeValue::Unknown(other),
                };
                (name, value)
            }
        })
        .collect()
}

/// Copies a (pointer, length) string from PJRT.
///
/// # Safety
/// `ptr` must be null or point to `len` readable bytes.
pub(crate) unsafe fn lossy(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

fn find_ffi_extension(api: &'static sys::PJRT_Api) -> Option<&'static sys::PJRT_FFI_Extension> {
    let mut next = api.extension_start;
    let mut hops = 0;
    while !next.is_null() && hops < 64 {
        // SAFETY: the extension chain is static data of the plugin; each entry begins with a
        // `PJRT_Extension_Base`.
        let base = unsafe { &*next };
        if base.type_ == sys::EXTENSION_TYPE_FFI
            && base.struct_size >= std::mem::size_of::<sys::PJRT_FFI_Extension>()
        {
            // SAFETY: an entry of type FFI is a `PJRT_FFI_Extension`, and its size covers every
            // field we declare (checked above).
            return Some(unsafe { &*next.cast::<sys::PJRT_FFI_Extension>() });
        }
        next = base.next;
        hops += 1;
    }
    None
}

impl PluginInner {
    /// Converts a `PJRT_Error*` returned by `call` into a result, destroying the error.
    pub(crate) fn check(&self, call: &'static str, err: *mut sys::PJRT_Error) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let mut msg = sys::PJRT_Error_Message_Args::new();
        msg.error = err;
        let mut code = sys::PJRT_Error_GetCode_Args::new();
        code.error = err;
        // SAFETY: `err` is a live error returned by the plugin; the message has the error's
        // lifetime and is copied before the error is destroyed, exactly once.
        unsafe {
            let message = match self.api.PJRT_Error_Message {
                Some(f) => {
                    f(&mut msg);
                    lossy(msg.message, msg.message_size)
                }
                None => String::from("(no message)"),
            };
            let code = match self.api.PJRT_Error_GetCode {
                Some(f) if f(&mut code).is_null() => ErrorCode::from_raw(code.code),
                _ => ErrorCode::Unknown,
            };
            self.destroy_error(err);
            Err(Error::Pjrt { call, code, message })
        }
    }

    /// # Safety
    /// `err` must be a live error of this plugin, not used afterwards.
    pub(crate) unsafe fn destroy_error(&self, err: *mut sys::PJRT_Error) {
        if let Some(f) = self.api.PJRT_Error_Destroy {
            let mut args = sys::PJRT_Error_Destroy_Args::new();
            args.error = err;
            // SAFETY: guaranteed by the caller.
            unsafe { f(&mut args) };
        }
    }

    pub(crate) fn unsupported(&self, what: &'static str) -> Error {
        Error::Unsupported { plugin: self.path.clone(), what }
    }

    /// Runs a destroy-style call whose failure can only be reported, not handled (in `Drop`).
    pub(crate) fn log_drop_error(&self, result: Result<()>) {
        if let Err(e) = result {
            eprintln!("tpu-kernels: pjrt cleanup failed: {e}");
        }
    }
}

/// A value of a plugin, device or topology attribute.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AttributeValue {
    /// A string.
    String(String),
    /// A 64-bit integer.
    Int64(i64),
    /// A list of 64-bit integers (versions are reported like this).
    Int64List(Vec<i64>),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
    /// A value type this layer does not know (the raw tag).
    Unknown(c_int),
}

/// A StableHLO version (`major.minor.patch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StableHloVersion {
    /// Major version.
    pub major: i64,
    /// Minor version.
    pub minor: i64,
    /// Patch version.
    pub patch: i64,
}

impl fmt::Display for StableHloVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What a plugin says about itself.
#[derive(Debug, Clone)]
pub struct PluginAttributes {
    api_major: i32,
    api_minor: i32,
    values: Vec<(String, AttributeValue)>,
}

impl PluginAttributes {
    /// The PJRT C API version the plugin implements, `(major, minor)`.
    pub fn api_version(&self) -> (i32, i32) {
        (self.api_major, self.api_minor)
    }

    /// All attributes, in the plugin's order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &AttributeValue)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// One attribute by name.
    pub fn get(&self, name: &str) -> Option<&AttributeValue> {
        self.values.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    fn version(&self, name: &str) -> Option<StableHloVersion> {
        match self.get(name)? {
            AttributeValue::Int64List(v) if v.len() == 3 => {
                Some(StableHloVersion { major: v[0], minor: v[1], patch: v[2] })
            }
            AttributeValue::String(s) => {
                let mut it = s.split('.').map(|p| p.trim().parse::<i64>());
                match (it.next(), it.next(), it.next()) {
                    (Some(Ok(major)), Some(Ok(minor)), Some(Ok(patch))) => {
                        Some(StableHloVersion { major, minor, patch })
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// The newest StableHLO version the plugin accepts (`stablehlo_current_version`). Never hand
    /// the plugin a portable artifact newer than this.
    pub fn stablehlo_current_version(&self) -> Option<StableHloVersion> {
        self.version("stablehlo_current_version")
    }

    /// The oldest StableHLO version the plugin accepts (`stablehlo_minimum_version`).
    pub fn stablehlo_minimum_version(&self) -> Option<StableHloVersion> {
        self.version("stablehlo_minimum_version")
    }

    /// The XLA version number the plugin was built from (`xla_version`), when reported.
    pub fn xla_version(&self) -> Option<i64> {
        match self.get("xla_version")? {
            AttributeValue::Int64(v) => Some(*v),
            _ => None,
        }
    }
}

/// The root of the project's cache (`$TPUK_CACHE`, default `~/.cache/tpu-kernels`).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TPUK_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("tpu-kernels")
}

fn locate(runtime: Runtime, env_var: &'static str, file: &str) -> Result<PathBuf> {
    let path = match std::env::var_os(env_var) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => cache_dir().join("plugins").join(file),
    };
    if path.exists() {
        Ok(path)
    } else {
        Err(Error::RuntimeNotInstalled { runtime, env_var, looked_at: path })
    }
}

/// Where the XLA CPU PJRT plugin is: `$TPUK_PJRT_CPU_PLUGIN`, else
/// `$TPUK_CACHE/plugins/pjrt_cpu.so` (installed by `scripts/dev setup`).
pub fn locate_cpu_plugin() -> Result<PathBuf> {
    locate(Runtime::CpuPlugin, "TPUK_PJRT_CPU_PLUGIN", "pjrt_cpu.so")
}

/// Where libtpu is: `$TPUK_LIBTPU`, else `$TPUK_CACHE/plugins/libtpu.so`.
pub fn locate_libtpu() -> Result<PathBuf> {
    locate(Runtime::Libtpu, "TPUK_LIBTPU", "libtpu.so")
}

impl Plugin {
    /// Finds and loads the XLA CPU plugin ([`locate_cpu_plugin`]).
    pub fn cpu() -> Result<Plugin> {
        Plugin::load(locate_cpu_plugin()?)
    }

    /// Finds and loads libtpu ([`locate_libtpu`]), with `TPU_SKIP_MDS_QUERY=1`.
    pub fn libtpu() -> Result<Plugin> {
        Plugin::load(locate_libtpu()?)
    }
}

/// A NUL-terminated copy of `s` for C APIs that need one (and (ptr,len) ones that accept it).
pub(crate) fn c_string(s: &str) -> std::ffi::CString {
    std::ffi::CString::new(s.replace('\0', "")).unwrap_or_default()
}
