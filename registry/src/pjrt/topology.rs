//! Compile-only targets: a device topology described by a plugin (libtpu without a TPU), and
//! programs compiled against it with `PJRT_Compile`, as `jax.experimental.topologies` does.

use std::fmt;
use std::sync::Arc;

use super::client::{NamedValues, OptionValue};
use super::compile::{CompileOptions, Program, raw_program};
use super::error::{Error, Result};
use super::executable::RawExecutable;
use super::plugin::{Plugin, PluginInner, lossy, pjrt_call};
use super::sys;

/// A device topology such as `v5e:1x1`, `v5e:2x2`, `v6e:1x1` or `v4:2x2x1`
/// (`PJRT_TopologyDescription_Create`). No device needs to be present.
pub struct Topology {
    plugin: Arc<PluginInner>,
    raw: *mut sys::PJRT_TopologyDescription,
    name: String,
    platform: String,
    device_count: usize,
}

// SAFETY: a topology description is immutable after creation; PJRT queries on it are
// thread-safe.
unsafe impl Send for Topology {}
// SAFETY: as above.
unsafe impl Sync for Topology {}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topology")
            .field("name", &self.name)
            .field("platform", &self.platform)
            .field("device_count", &self.device_count)
            .finish()
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let mut args = sys::PJRT_TopologyDescription_Destroy_Args::new();
        args.topology = self.raw;
        // SAFETY: `raw` is the live topology owned by `self`, destroyed exactly once.
        let result =
            unsafe { pjrt_call!(self.plugin, PJRT_TopologyDescription_Destroy, &mut args) };
        self.plugin.log_drop_error(result);
    }
}

impl Topology {
    /// Describes topology `name` (e.g. `"v5e:1x1"`) with the plugin's defaults.
    pub fn new(plugin: &Plugin, name: &str) -> Result<Topology> {
        Self::with_options(plugin, name, &[])
    }

    /// Describes topology `name` with platform-specific named options.
    pub fn with_options(
        plugin: &Plugin,
        name: &str,
        options: &[(String, OptionValue)],
    ) -> Result<Topology> {
        let wrap = |e: Error| Error::Topology { topology: name.to_owned(), source: Box::new(e) };
        let p = &plugin.inner;
        let named = NamedValues::new(options);
        let mut args = sys::PJRT_TopologyDescription_Create_Args::new();
        args.topology_name = name.as_ptr().cast();
        args.topology_name_size = name.len();
        args.create_options = named.values.as_ptr();
        args.num_options = named.values.len();
        // SAFETY: the name and the options (kept alive by `named`) outlive the call.
        unsafe { pjrt_call!(p, PJRT_TopologyDescription_Create, &mut args) }.map_err(wrap)?;
        let mut topology = Topology {
            plugin: p.clone(),
            raw: args.topology,
            name: name.to_owned(),
            platform: String::new(),
            device_count: 0,
        };
        let mut pn = sys::PJRT_TopologyDescription_PlatformName_Args::new();
        pn.topology = topology.raw;
        // SAFETY: the topology is live; the name it returns lives as long as it.
        unsafe {
            pjrt_call!(p, PJRT_TopologyDescription_PlatformName, &mut pn).map_err(wrap)?;
            topology.platform = lossy(pn.platform_name, pn.platform_name_size);
        }
        let mut dd = sys::PJRT_TopologyDescription_GetDeviceDescriptions_Args::new();
        dd.topology = topology.raw;
        // SAFETY: as above.
        unsafe { pjrt_call!(p, PJRT_TopologyDescription_GetDeviceDescriptions, &mut dd) }
            .map_err(wrap)?;
        topology.device_count = dd.num_descriptions;
        Ok(topology)
    }

    /// The topology's name as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The platform (`tpu` for libtpu).
    pub fn platform(&self) -> &str {
        &self.platform
    }

    /// The number of devices (chips or cores) in the topology.
    pub fn device_count(&self) -> usize {
        self.device_count
    }

    /// Compiles `program` for this topology without any device (`PJRT_Compile`). Compiler
    /// errors (e.g. Mosaic's `E2002 ... tiling (8, 128)`) come back intact in
    /// [`Error::pjrt_message`].
    pub fn compile(&self, program: &Program, options: &CompileOptions) -> Result<CompiledProgram> {
        let wrap = |e: Error| Error::Topology { topology: self.name.clone(), source: Box::new(e) };
        options.validate().map_err(wrap)?;
        let proto = options.to_proto();
        let raw_program = raw_program(program);
        let mut args = sys::PJRT_Compile_Args::new();
        args.topology = self.raw;
        args.program = &raw_program;
        args.compile_options = proto.as_ptr().cast();
        args.compile_options_size = proto.len();
        // SAFETY: the topology is live; the program and options outlive the call; no client.
        unsafe { pjrt_call!(self.plugin, PJRT_Compile, &mut args) }.map_err(wrap)?;
        let exe = RawExecutable { plugin: self.plugin.clone(), raw: args.executable };
        let serialized = exe.serialize().map_err(wrap)?;
        Ok(CompiledProgram { topology: self.name.clone(), serialized })
    }
}

/// The result of a compile-only build: the serialized executable.
#[derive(Clone)]
pub struct CompiledProgram {
    topology: String,
    serialized: Vec<u8>,
}

impl fmt::Debug for CompiledProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledProgram")
            .field("topology", &self.topology)
            .field("serialized_size", &self.serialized.len())
            .finish()
    }
}

impl CompiledProgram {
    /// The topology it was compiled for.
    pub fn topology(&self) -> &str {
        &self.topology
    }

    /// Size of the serialized executable in bytes.
    pub fn serialized_size(&self) -> usize {
        self.serialized.len()
    }

    /// The serialized executable (`PJRT_Executable_Serialize`).
    pub fn serialized(&self) -> &[u8] {
        &self.serialized
    }
}
