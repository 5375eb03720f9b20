//! The one error type of the PJRT layer.

use std::fmt;
use std::path::PathBuf;

use super::buffer::ElementType;

/// A PJRT status code (the abseil status codes PJRT reports with every error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The operation was cancelled.
    Cancelled,
    /// Unknown error.
    Unknown,
    /// The caller passed an invalid argument (bad program, wrong buffer...).
    InvalidArgument,
    /// A deadline expired.
    DeadlineExceeded,
    /// Something requested was not found (e.g. a custom call target).
    NotFound,
    /// Something already exists.
    AlreadyExists,
    /// Permission denied.
    PermissionDenied,
    /// Out of memory or another resource.
    ResourceExhausted,
    /// The system is not in a state required for the operation.
    FailedPrecondition,
    /// The operation was aborted.
    Aborted,
    /// Out of range.
    OutOfRange,
    /// Not implemented by this plugin.
    Unimplemented,
    /// Internal error of the plugin.
    Internal,
    /// The service is unavailable.
    Unavailable,
    /// Unrecoverable data loss.
    DataLoss,
    /// Not authenticated.
    Unauthenticated,
    /// A code this layer does not know.
    Other(i32),
}

impl ErrorCode {
    pub(crate) fn from_raw(code: i32) -> Self {
        match code {
            1 => Self::Cancelled,
            2 => Self::Unknown,
            3 => Self::InvalidArgument,
            4 => Self::DeadlineExceeded,
            5 => Self::NotFound,
            6 => Self::AlreadyExists,
            7 => Self::PermissionDenied,
            8 => Self::ResourceExhausted,
            9 => Self::FailedPrecondition,
            10 => Self::Aborted,
            11 => Self::OutOfRange,
            12 => Self::Unimplemented,
            13 => Self::Internal,
            14 => Self::Unavailable,
            15 => Self::DataLoss,
            16 => Self::Unauthenticated,
            other => Self::Other(other),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::Cancelled => "cancelled",
            Self::Unknown => "unknown",
            Self::InvalidArgument => "invalid argument",
            Self::DeadlineExceeded => "deadline exceeded",
            Self::NotFound => "not found",
            Self::AlreadyExists => "already exists",
            Self::PermissionDenied => "permission denied",
            Self::ResourceExhausted => "resource exhausted",
            Self::FailedPrecondition => "failed precondition",
            Self::Aborted => "aborted",
            Self::OutOfRange => "out of range",
            Self::Unimplemented => "unimplemented",
            Self::Internal => "internal",
            Self::Unavailable => "unavailable",
            Self::DataLoss => "data loss",
            Self::Unauthenticated => "unauthenticated",
            Self::Other(code) => return write!(f, "code {code}"),
        };
        f.write_str(s)
    }
}

/// Which runtime a missing plugin is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Runtime {
    /// The XLA CPU PJRT plugin.
    CpuPlugin,
    /// libtpu.
    Libtpu,
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CpuPlugin => "the PJRT CPU plugin",
            Self::Libtpu => "libtpu",
        })
    }
}

/// Everything that can go wrong in the PJRT layer. Messages name the thing involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A runtime was looked for at its usual places and is not installed.
    #[error(
        "{runtime} not found (looked at {looked_at}; set {env_var} to override): run `scripts/dev setup`"
    )]
    RuntimeNotInstalled {
        /// The runtime looked for.
        runtime: Runtime,
        /// The environment variable that overrides the location.
        env_var: &'static str,
        /// Where it was looked for.
        looked_at: PathBuf,
    },
    /// The path given to [`Plugin::load`](super::Plugin::load) does not exist.
    #[error("pjrt plugin {path} does not exist")]
    PluginNotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The dynamic loader refused the file (not a shared library, truncated, wrong architecture).
    #[error("cannot load pjrt plugin {path}: {message}")]
    PluginLoad {
        /// The file.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// The file is a shared library but exports no `GetPjrtApi`.
    #[error("{path} is not a pjrt plugin: it exports no GetPjrtApi symbol")]
    NotAPlugin {
        /// The file.
        path: PathBuf,
    },
    /// The plugin implements a PJRT C API older than this layer supports.
    #[error(
        "pjrt plugin {path} implements PJRT C API {found_major}.{found_minor}, older than the 0.{required_minor} this layer needs"
    )]
    ApiTooOld {
        /// The plugin file.
        path: PathBuf,
        /// Its major version.
        found_major: i32,
        /// Its minor version.
        found_minor: i32,
        /// The oldest minor version accepted.
        required_minor: i32,
    },
    /// A PJRT call failed; `message` is PJRT's own text, intact.
    #[error("pjrt {call} failed ({code}): {message}")]
    Pjrt {
        /// The PJRT entry point (e.g. `PJRT_Client_Compile`).
        call: &'static str,
        /// PJRT's status code.
        code: ErrorCode,
        /// PJRT's message.
        message: String,
    },
    /// A plugin lacks an entry point or extension this layer needs.
    #[error("pjrt plugin {plugin} does not provide {what}")]
    Unsupported {
        /// The plugin file.
        plugin: PathBuf,
        /// What is missing.
        what: &'static str,
    },
    /// A client reports a platform kernels are not selected for (not cpu, tpu or cuda).
    #[error(
        "pjrt client platform `{platform}` is not one kernels are selected for (cpu, tpu, cuda)"
    )]
    UnknownPlatform {
        /// The platform name the plugin reports.
        platform: String,
    },
    /// A Mosaic TPU kernel (`tpu_custom_call`) was sent to a client that cannot run it.
    #[error(
        "program contains a tpu_custom_call (a Mosaic TPU kernel), which the {platform} client cannot run: use the kernel's {platform} variant"
    )]
    TpuCustomCallOnNonTpu {
        /// The client's platform.
        platform: String,
    },
    /// An executable was called with the wrong number of arguments.
    #[error("executable expects {expected} argument(s) per device, got {got}")]
    ArgumentCount {
        /// Parameters of the executable.
        expected: usize,
        /// Arguments passed.
        got: usize,
    },
    /// An argument has the wrong element type.
    #[error("argument {index}: executable expects element type {expected}, got a {got} buffer")]
    ArgumentType {
        /// Argument position.
        index: usize,
        /// Parameter element type.
        expected: ElementType,
        /// Buffer element type.
        got: ElementType,
    },
    /// An argument has the wrong shape.
    #[error(
        "argument {index}: executable expects shape {expected:?}, got a buffer of shape {got:?}"
    )]
    ArgumentShape {
        /// Argument position.
        index: usize,
        /// Parameter dimensions.
        expected: Vec<i64>,
        /// Buffer dimensions.
        got: Vec<i64>,
    },
    /// An argument buffer lives on another client or device than the executable runs on.
    #[error("argument {index}: {message}")]
    ArgumentPlacement {
        /// Argument position.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// The number of per-device argument lists does not match the executable's devices.
    #[error("executable runs on {expected} device(s), got argument lists for {got}")]
    DeviceCount {
        /// Devices of the executable.
        expected: usize,
        /// Argument lists passed.
        got: usize,
    },
    /// Host data does not match the buffer or shape it is used with.
    #[error("host data mismatch: {message}")]
    HostData {
        /// What is wrong (element types, element counts, alignment).
        message: String,
    },
    /// A buffer's contents cannot be read in place (not on the host, not dense).
    #[error("buffer cannot be read in place: {reason}")]
    NotReadableInPlace {
        /// Why.
        reason: String,
    },
    /// A compile option is inconsistent.
    #[error("invalid compile options: {message}")]
    InvalidOptions {
        /// What is wrong.
        message: String,
    },
    /// An FFI handler could not be registered.
    #[error("cannot register host custom call {name}: {message}")]
    FfiRegistration {
        /// The custom call target name.
        name: String,
        /// Why.
        message: String,
    },
    /// A topology could not be created or a program compiled for it.
    #[error("topology {topology}: {source}")]
    Topology {
        /// The topology name (e.g. `v5e:1x1`).
        topology: String,
        /// The underlying failure.
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// PJRT's status code, when the error came from a PJRT call.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Pjrt { code, .. } => Some(*code),
            Self::Topology { source, .. } => source.code(),
            _ => None,
        }
    }

    /// PJRT's own message (for example the compiler's diagnostics), when the error came from PJRT.
    pub fn pjrt_message(&self) -> Option<&str> {
        match self {
            Self::Pjrt { message, .. } => Some(message),
            Self::Topology { source, .. } => source.pjrt_message(),
            _ => None,
        }
    }
}

/// The PJRT layer's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
