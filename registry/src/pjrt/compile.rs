//! Programs, compile options (encoded as a `CompileOptionsProto` by hand), and compilation.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use super::client::Client;
use super::error::{Error, Result};
use super::executable::LoadedExecutable;
use super::plugin::pjrt_call;
use super::proto::Writer;
use super::sys;

/// The magic number that starts MLIR bytecode.
const MLIR_BYTECODE_MAGIC: &[u8] = b"ML\xefR";

/// A program for PJRT's `"mlir"` format: StableHLO as MLIR text, MLIR bytecode or a StableHLO
/// portable artifact.
#[derive(Clone, PartialEq, Eq)]
pub struct Program {
    code: Vec<u8>,
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("bytecode", &self.is_bytecode())
            .field("bytes", &self.code.len())
            .finish()
    }
}

impl Program {
    /// StableHLO (or any MLIR PJRT accepts) as text.
    pub fn text(text: impl Into<String>) -> Self {
        Self { code: text.into().into_bytes() }
    }

    /// MLIR bytecode or a StableHLO portable artifact.
    pub fn bytecode(bytes: impl Into<Vec<u8>>) -> Self {
        Self { code: bytes.into() }
    }

    /// The program's bytes, as handed to PJRT.
    pub fn as_bytes(&self) -> &[u8] {
        &self.code
    }

    /// Whether the program is MLIR bytecode (else text).
    pub fn is_bytecode(&self) -> bool {
        self.code.starts_with(MLIR_BYTECODE_MAGIC)
    }

    /// Whether the program calls a Mosaic TPU kernel (`stablehlo.custom_call @tpu_custom_call`),
    /// which only libtpu can compile. Detected textually; for bytecode, by the target name in
    /// its string table.
    pub fn contains_tpu_custom_call(&self) -> bool {
        const NAME: &[u8] = b"tpu_custom_call";
        let mut start = 0;
        while let Some(pos) = find(&self.code[start..], NAME) {
            let at = start + pos;
            let before = at.checked_sub(1).map(|i| self.code[i]);
            let after = self.code.get(at + NAME.len()).copied();
            let ident = |c: Option<u8>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_');
            if self.is_bytecode() || (matches!(before, Some(b'@' | b'"')) && !ident(after)) {
                return true;
            }
            start = at + NAME.len();
        }
        false
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Which device runs each (replica, partition) of a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAssignment {
    replicas: usize,
    partitions: usize,
    /// Row-major `[replica][partition]` device ids.
    ids: Vec<i64>,
}

impl DeviceAssignment {
    /// `ids[r * partitions + p]` is the id of the device running replica `r`, partition `p`.
    pub fn new(replicas: usize, partitions: usize, ids: Vec<i64>) -> Result<Self> {
        if replicas == 0 || partitions == 0 || ids.len() != replicas * partitions {
            return Err(Error::InvalidOptions {
                message: format!(
                    "a device assignment of {replicas} replica(s) x {partitions} partition(s) needs {} device ids, got {}",
                    replicas * partitions,
                    ids.len()
                ),
            });
        }
        Ok(Self { replicas, partitions, ids })
    }

    /// One replica whose partitions run on `ids`, in order.
    pub fn partitions(ids: &[i64]) -> Result<Self> {
        Self::new(1, ids.len(), ids.to_vec())
    }

    /// The device of replica `r`, partition `p`.
    pub fn device(&self, replica: usize, partition: usize) -> Option<i64> {
        (replica < self.replicas && partition < self.partitions)
            .then(|| self.ids[replica * self.partitions + partition])
    }
}

/// The value of one compiler option override ([`CompileOptions::option_override`]): PJRT's
/// `OptionOverrideProto`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionOverride {
    Str(String),
    Bool(bool),
    Int(i64),
}

/// The vector width XLA:CPU prefers on a host with AVX-512 ([`CompileOptions::for_client`]).
/// XLA's own default is 256 bits, which leaves half of every AVX-512 register unused: on such a
/// host, transcendental elementwise kernels (`silu`, `gelu`) ran 10-25% faster at 512 (measured,
/// docs/perf-log.md).
pub const AVX512_VECTOR_WIDTH: i64 = 512;

/// XLA's flag for the preferred vector width.
const VECTOR_WIDTH_FLAG: &str = "xla_cpu_prefer_vector_width";

/// Options for [`Client::compile`], sent to PJRT as a serialized `CompileOptionsProto`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileOptions {
    num_replicas: usize,
    num_partitions: usize,
    use_spmd_partitioning: bool,
    device_assignment: Option<DeviceAssignment>,
    /// XLA debug options by flag name (`env_option_overrides`), in name order.
    overrides: BTreeMap<String, OptionOverride>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        Self {
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
            device_assignment: None,
            overrides: BTreeMap::new(),
        }
    }
}

impl CompileOptions {
    /// One replica, one partition, the plugin's default device.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of replicas (default 1).
    pub fn num_replicas(mut self, n: usize) -> Self {
        self.num_replicas = n;
        self
    }

    /// The number of partitions (default 1).
    pub fn num_partitions(mut self, n: usize) -> Self {
        self.num_partitions = n;
        self
    }

    /// Whether XLA partitions the program with its SPMD partitioner (default false).
    pub fn use_spmd_partitioning(mut self, on: bool) -> Self {
        self.use_spmd_partitioning = on;
        self
    }

    /// An explicit device assignment (default: the plugin's).
    pub fn device_assignment(mut self, assignment: DeviceAssignment) -> Self {
        self.device_assignment = Some(assignment);
        self
    }

    /// Sets XLA debug option `name` (a flag name without dashes, as in `XLA_FLAGS`) for this
    /// compile: PJRT's `env_option_overrides`, applied over the process's flags. An unknown name
    /// makes the compile fail with the plugin's error.
    pub fn option_override(mut self, name: &str, value: OptionOverride) -> Self {
        self.overrides.insert(name.to_owned(), value);
        self
    }

    /// The option overrides set, in name order.
    pub fn overrides(&self) -> impl Iterator<Item = (&str, &OptionOverride)> {
        self.overrides.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// These options as `client` compiles them: on the CPU plugin, a host with AVX-512 gets
    /// [`AVX512_VECTOR_WIDTH`]-bit vectors, unless these options or the process's `XLA_FLAGS`
    /// already say which width. Other platforms and hosts take the options as they are.
    /// [`Client::compile`] and the compile cache's keys both go through this.
    pub fn for_client(&self, client: &Client) -> Cow<'_, CompileOptions> {
        if client.platform() != "cpu"
            || self.overrides.contains_key(VECTOR_WIDTH_FLAG)
            || !host_has_avx512()
            || xla_flags_name(VECTOR_WIDTH_FLAG)
        {
            return Cow::Borrowed(self);
        }
        Cow::Owned(
            self.clone()
                .option_override(VECTOR_WIDTH_FLAG, OptionOverride::Int(AVX512_VECTOR_WIDTH)),
        )
    }

    /// `num_partitions` partitions with SPMD partitioning on devices `0..n` (the usual sharded
    /// setup).
    pub fn spmd(partitions: usize) -> Self {
        Self::new().num_partitions(partitions).use_spmd_partitioning(true)
    }

    /// Checks that the options are consistent.
    pub fn validate(&self) -> Result<()> {
        if self.num_replicas == 0 || self.num_partitions == 0 {
            return Err(Error::InvalidOptions {
                message: "num_replicas and num_partitions must be at least 1".to_owned(),
            });
        }
        if let Some(da) = &self.device_assignment
            && (da.replicas != self.num_replicas || da.partitions != self.num_partitions)
        {
            return Err(Error::InvalidOptions {
                message: format!(
                    "device assignment is {} x {}, options say {} replica(s) x {} partition(s)",
                    da.replicas, da.partitions, self.num_replicas, self.num_partitions
                ),
            });
        }
        Ok(())
    }

    /// The serialized `CompileOptionsProto` (deterministic: usable in cache keys).
    pub fn to_proto(&self) -> Vec<u8> {
        // ExecutableBuildOptionsProto.
        let mut build = Writer::new();
        build.int64(1, -1); // device_ordinal: unset
        build.int64(4, self.num_replicas as i64);
        build.int64(5, self.num_partitions as i64);
        if self.use_spmd_partitioning {
            build.bool(6, true);
        }
        if let Some(da) = &self.device_assignment {
            // DeviceAssignmentProto: replica_count, computation_count, then one
            // ComputationDevice (replica_device_ids) per partition.
            let mut d = Writer::new();
            d.int64(1, da.replicas as i64);
            d.int64(2, da.partitions as i64);
            for p in 0..da.partitions {
                let ids: Vec<i64> =
                    (0..da.replicas).map(|r| da.ids[r * da.partitions + p]).collect();
                let mut cd = Writer::new();
                cd.packed_int64(1, &ids);
                d.message(3, &cd);
            }
            build.message(9, &d);
        }
        // CompileOptionsProto.executable_build_options = 3.
        let mut options = Writer::new();
        options.message(3, &build);
        // CompileOptionsProto.env_option_overrides = 7: map entries (key = 1, value = 2), the
        // value an OptionOverrideProto (string = 1, bool = 2, int64 = 3).
        for (name, value) in &self.overrides {
            let mut v = Writer::new();
            match value {
                OptionOverride::Str(s) => v.bytes(1, s.as_bytes()),
                OptionOverride::Bool(b) => v.bool(2, *b),
                OptionOverride::Int(i) => v.int64(3, *i),
            }
            let mut entry = Writer::new();
            entry.bytes(1, name.as_bytes());
            entry.message(2, &v);
            options.message(7, &entry);
        }
        options.finish()
    }
}

/// Whether this host's CPU has AVX-512 (foundation), as XLA:CPU would use it.
fn host_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the process's `XLA_FLAGS` names flag `name` (the plugin reads them at load).
pub fn xla_flags_name(name: &str) -> bool {
    std::env::var("XLA_FLAGS").is_ok_and(|flags| flags_name(&flags, name))
}

/// Whether the flags in `flags` (`--name=value` or `--name`, whitespace-separated) set `name`.
fn flags_name(flags: &str, name: &str) -> bool {
    flags.split_whitespace().any(|f| {
        let f = f.trim_start_matches('-');
        f == name || f.strip_prefix(name).is_some_and(|rest| rest.starts_with('='))
    })
}

/// The `"mlir"` program format, and a `PJRT_Program` pointing at `program`.
pub(crate) fn raw_program(program: &Program) -> sys::PJRT_Program {
    const FORMAT: &str = "mlir";
    let mut raw = sys::PJRT_Program::new();
    // PJRT only reads `code` during compilation (the pointer is `char*` for historical reasons).
    raw.code = program.code.as_ptr().cast_mut().cast();
    raw.code_size = program.code.len();
    raw.format = FORMAT.as_ptr().cast();
    raw.format_size = FORMAT.len();
    raw
}

impl Client {
    /// Compiles `program` for this client's devices (`PJRT_Client_Compile`).
    ///
    /// A program containing a `tpu_custom_call` is refused with
    /// [`Error::TpuCustomCallOnNonTpu`] before it reaches a non-TPU plugin.
    pub fn compile(&self, program: &Program, options: &CompileOptions) -> Result<LoadedExecutable> {
        options.validate()?;
        if self.platform() != "tpu" && program.contains_tpu_custom_call() {
            return Err(Error::TpuCustomCallOnNonTpu { platform: self.platform().to_owned() });
        }
        let proto = options.for_client(self).to_proto();
        let raw_program = raw_program(program);
        let mut args = sys::PJRT_Client_Compile_Args::new();
        args.client = self.inner.raw;
        args.program = &raw_program;
        args.compile_options = proto.as_ptr().cast();
        args.compile_options_size = proto.len();
        // SAFETY: the client is live; the program, its format string and the options bytes
        // outlive the call.
        unsafe { pjrt_call!(self.inner.plugin, PJRT_Client_Compile, &mut args) }?;
        LoadedExecutable::new(self, args.executable)
    }

    /// Loads an executable produced by [`LoadedExecutable::serialize`] with the same plugin
    /// version (`PJRT_Executable_DeserializeAndLoad`).
    pub fn deserialize(&self, serialized: &[u8]) -> Result<LoadedExecutable> {
        let mut args = sys::PJRT_Executable_DeserializeAndLoad_Args::new();
        args.client = self.inner.raw;
        args.serialized_executable = serialized.as_ptr().cast();
        args.serialized_executable_size = serialized.len();
        // SAFETY: the client is live and `serialized` outlives the call.
        unsafe { pjrt_call!(self.inner.plugin, PJRT_Executable_DeserializeAndLoad, &mut args) }?;
        LoadedExecutable::new(self, args.loaded_executable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_tpu_custom_call_textually() {
        let p = Program::text(
            "%0 = stablehlo.custom_call @tpu_custom_call(%arg0) {backend_config = \"\"}",
        );
        assert!(p.contains_tpu_custom_call());
        let generic =
            Program::text("\"stablehlo.custom_call\"(%a) {call_target_name = \"tpu_custom_call\"}");
        assert!(generic.contains_tpu_custom_call());
        let other =
            Program::text("stablehlo.custom_call @tpu_custom_call_helper(%a) @my_tpu_custom_call");
        assert!(!other.contains_tpu_custom_call());
    }

    #[test]
    fn compile_options_proto() {
        let opts = CompileOptions::spmd(2)
            .device_assignment(DeviceAssignment::partitions(&[1, 0]).unwrap());
        opts.validate().unwrap();
        let bytes = opts.to_proto();
        let (3, crate::pjrt::proto::Value::Bytes(build)) =
            crate::pjrt::proto::Reader::new(&bytes).next().unwrap()
        else {
            panic!("expected executable_build_options")
        };
        let fields: Vec<u32> = crate::pjrt::proto::Reader::new(build).map(|(f, _)| f).collect();
        assert_eq!(fields, vec![1, 4, 5, 6, 9]);
        assert!(
            CompileOptions::spmd(2)
                .device_assignment(DeviceAssignment::partitions(&[0]).unwrap())
                .validate()
                .is_err()
        );
        assert!(DeviceAssignment::new(2, 2, vec![0, 1, 2]).is_err());
    }

    #[test]
    fn option_overrides_are_map_entries_in_name_order() {
        use crate::pjrt::proto::{Reader, Value};
        let bytes = CompileOptions::new()
            .option_override("xla_b", OptionOverride::Int(512))
            .option_override("xla_a", OptionOverride::Bool(true))
            .option_override("xla_c", OptionOverride::Str("x".to_owned()))
            .to_proto();
        // (name, the OptionOverrideProto's fields as (number, raw bytes)).
        type Entry = (String, Vec<(u32, Vec<u8>)>);
        let entries: Vec<Entry> = Reader::new(&bytes)
            .filter(|(f, _)| *f == 7)
            .map(|(_, v)| {
                let Value::Bytes(entry) = v else { panic!("an entry is a message") };
                let mut fields = Reader::new(entry);
                let (1, Value::Bytes(key)) = fields.next().unwrap() else { panic!("key first") };
                let (2, Value::Bytes(value)) = fields.next().unwrap() else { panic!("then value") };
                let value = Reader::new(value)
                    .map(|(f, v)| match v {
                        Value::Bytes(b) => (f, b.to_vec()),
                        Value::Varint(n) => (f, n.to_le_bytes().to_vec()),
                        other => panic!("unexpected {other:?}"),
                    })
                    .collect();
                (String::from_utf8(key.to_vec()).unwrap(), value)
            })
            .collect();
        let names: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["xla_a", "xla_b", "xla_c"]);
        // OptionOverrideProto: bool_field = 2, int_field = 3, string_field = 1.
        assert_eq!(entries[0].1, vec![(2, 1u64.to_le_bytes().to_vec())]);
        assert_eq!(entries[1].1, vec![(3, 512u64.to_le_bytes().to_vec())]);
        assert_eq!(entries[2].1, vec![(1, b"x".to_vec())]);
        // No overrides: no field 7, the bytes as before.
        assert!(Reader::new(&CompileOptions::new().to_proto()).all(|(f, _)| f != 7));
    }

    #[test]
    fn xla_flags_are_read_by_flag_name() {
        let width = "xla_cpu_prefer_vector_width";
        assert!(flags_name("--xla_cpu_prefer_vector_width=256", width));
        assert!(flags_name("--xla_dump_to=/tmp/d  --xla_cpu_prefer_vector_width=128", width));
        assert!(!flags_name("--xla_cpu_prefer_vector_width_other=1", width));
        assert!(!flags_name("--xla_dump_to=/tmp/xla_cpu_prefer_vector_width", width));
        assert!(!flags_name("", width));
    }
}
