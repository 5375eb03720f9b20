//! Errors of the registry: building the index, registering and removing kernels.

use tpu_kernels::BuildError;

/// A rejected index build, registration or removal. Nothing changes when one is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    #[error("two kernels named `{name}`")]
    DuplicateName { name: String },
    #[error("kernel `{name}`: {message}")]
    InvalidKernel { name: String, message: String },
    #[error(
        "kernels `{first}` and `{second}` can both match `{op}` with priority {priority}: give one a higher priority or disjoint guards"
    )]
    Ambiguous { op: String, first: String, second: String, priority: i32 },
    #[error("kernel `{name}` is {}", if *linked { "linked into the binary and cannot be removed" } else { "not registered" })]
    NotRemovable { name: String, linked: bool },
    #[error(
        "kernel `{name}` was loaded from kernel library `{path}` and cannot be removed (a loaded library stays loaded)"
    )]
    LoadedFromLibrary { name: String, path: String },
    #[error("kernel library `{path}`: {message}")]
    Library { path: String, message: String },
    #[error("kernel `{kernel}` has no {platform} variant")]
    NoVariant { kernel: String, platform: &'static str },
    #[error("kernel `{kernel}` cannot be specialised to the call: {message}")]
    Specialise { kernel: String, message: String },
    #[error(transparent)]
    Build(BuildError),
    #[error("the registry lock was poisoned by a panic in another thread")]
    Poisoned,
}
