//! Loaded executables: metadata, serialization, and execution (single device and SPMD).

use std::fmt;
use std::sync::Arc;

use super::buffer::{Buffer, ElementType};
use super::client::{Client, ClientInner, Device, raw_slice};
use super::error::{Error, Result};
use super::event::Event;
use super::plugin::{PluginInner, pjrt_call};
use super::proto::{Reader, Value, push_int64s};
use super::sys;

/// The type and per-device shape of one executable parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParameterSpec {
    /// Element type.
    pub element_type: ElementType,
    /// Dimensions (per device, after partitioning).
    pub dims: Vec<i64>,
}

/// An argument of an execution: borrowed (the buffer stays valid; PJRT never donates it) or
/// donated (moved in; its memory may become an output, as `tf.aliasing_output` asks).
#[derive(Debug)]
pub enum Input<'a> {
    /// Read, never donated.
    Borrowed(&'a Buffer),
    /// Given to the execution.
    Donated(Buffer),
}

impl<'a> From<&'a Buffer> for Input<'a> {
    fn from(b: &'a Buffer) -> Self {
        Input::Borrowed(b)
    }
}

impl From<Buffer> for Input<'_> {
    fn from(b: Buffer) -> Self {
        Input::Donated(b)
    }
}

impl Input<'_> {
    fn buffer(&self) -> &Buffer {
        match self {
            Input::Borrowed(b) => b,
            Input::Donated(b) => b,
        }
    }
}

/// A compiled program loaded on a client's devices. `Send + Sync`; may be executed from several
/// threads at once.
pub struct LoadedExecutable {
    client: Client,
    raw: *mut sys::PJRT_LoadedExecutable,
    devices: Vec<Device>,
    num_outputs: usize,
    num_replicas: usize,
    num_partitions: usize,
    parameters: Option<Vec<ParameterSpec>>,
}

// SAFETY: PJRT loaded executables are thread-safe (concurrent execution is part of the C API
// contract); the Rust-side metadata is immutable.
unsafe impl Send for LoadedExecutable {}
// SAFETY: as above.
unsafe impl Sync for LoadedExecutable {}

impl fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedExecutable")
            .field("devices", &self.devices.len())
            .field("parameters", &self.parameters)
            .field("num_outputs", &self.num_outputs)
            .finish_non_exhaustive()
    }
}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let mut args = sys::PJRT_LoadedExecutable_Destroy_Args::new();
        args.executable = self.raw;
        // SAFETY: `raw` is the live executable owned by `self`, destroyed exactly once.
        let result = unsafe {
            pjrt_call!(self.client.inner.plugin, PJRT_LoadedExecutable_Destroy, &mut args)
        };
        self.client.inner.plugin.log_drop_error(result);
    }
}

/// An owned `PJRT_Executable` (the unloaded view of a loaded executable, or a compile-only
/// result), destroyed on drop.
pub(crate) struct RawExecutable {
    pub(crate) plugin: Arc<PluginInner>,
    pub(crate) raw: *mut sys::PJRT_Executable,
}

impl Drop for RawExecutable {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Executable_Destroy_Args::new();
        args.executable = self.raw;
        // SAFETY: `raw` is a live executable owned by `self`, destroyed exactly once.
        let result = unsafe { pjrt_call!(self.plugin, PJRT_Executable_Destroy, &mut args) };
        self.plugin.log_drop_error(result);
    }
}

impl RawExecutable {
    /// `PJRT_Executable_Serialize`, copied out.
    pub(crate) fn serialize(&self) -> Result<Vec<u8>> {
        let mut args = sys::PJRT_Executable_Serialize_Args::new();
        args.executable = self.raw;
        // SAFETY: `raw` is live; the returned bytes live until the deleter runs, after the copy.
        unsafe {
            pjrt_call!(self.plugin, PJRT_Executable_Serialize, &mut args)?;
            let bytes =
                raw_slice(args.serialized_bytes.cast::<u8>(), args.serialized_bytes_size).to_vec();
            if let Some(deleter) = args.serialized_executable_deleter {
                deleter(args.serialized_executable);
            }
            Ok(bytes)
        }
    }

    fn count(&self, which: &'static str) -> Result<usize> {
        let p = &self.plugin;
        // SAFETY: `raw` is a live executable; each call only fills its out field.
        unsafe {
            Ok(match which {
                "outputs" => {
                    let mut a = sys::PJRT_Executable_NumOutputs_Args::new();
                    a.executable = self.raw;
                    pjrt_call!(p, PJRT_Executable_NumOutputs, &mut a)?;
                    a.num_outputs
                }
                "replicas" => {
                    let mut a = sys::PJRT_Executable_NumReplicas_Args::new();
                    a.executable = self.raw;
                    pjrt_call!(p, PJRT_Executable_NumReplicas, &mut a)?;
                    a.num_replicas
                }
                _ => {
                    let mut a = sys::PJRT_Executable_NumPartitions_Args::new();
                    a.executable = self.raw;
                    pjrt_call!(p, PJRT_Executable_NumPartitions, &mut a)?;
                    a.num_partitions
                }
            })
        }
    }

    /// The entry parameters of the optimized program (`PJRT_Executable_OptimizedProgram`, an
    /// `HloModuleProto`), or `None` when the plugin does not provide them.
    fn parameters(&self) -> Option<Vec<ParameterSpec>> {
        entry_parameters(&self.optimized_module()?)
    }

    /// The optimized program as a serialized `HloModuleProto` (`PJRT_Executable_OptimizedProgram`),
    /// or `None` when the plugin does not provide it.
    fn optimized_module(&self) -> Option<Vec<u8>> {
        let mut program = sys::PJRT_Program::new();
        let mut args = sys::PJRT_Executable_OptimizedProgram_Args::new();
        args.executable = self.raw;
        args.program = &mut program;
        // SAFETY: first call with a null `code` only asks for the size.
        unsafe { pjrt_call!(self.plugin, PJRT_Executable_OptimizedProgram, &mut args) }.ok()?;
        let mut code = vec![0u8; program.code_size];
        program.code = code.as_mut_ptr().cast();
        program.code_size = code.len();
        args.program = &mut program;
        // SAFETY: second call writes at most `code_size` bytes into `code`, which we own.
        unsafe { pjrt_call!(self.plugin, PJRT_Executable_OptimizedProgram, &mut args) }.ok()?;
        code.truncate(program.code_size);
        // SAFETY: the plugin set `format` to a string it owns, valid while the executable lives.
        let format = unsafe { super::plugin::lossy(program.format, program.format_size) };
        if format == "hlo_with_config" {
            // HloModuleProtoWithConfig: the module is field 1.
            let module = Reader::new(&code).find_map(|(f, v)| match (f, v) {
                (1, Value::Bytes(m)) => Some(m.to_vec()),
                _ => None,
            })?;
            Some(module)
        } else {
            Some(code)
        }
    }
}

/// How many instructions of each opcode a serialized `HloModuleProto` holds, over all its
/// computations (`HloComputationProto.instructions` = 2, `HloInstructionProto.opcode` = 2).
fn opcode_counts(module: &[u8]) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for (field, value) in Reader::new(module) {
        let (3, Value::Bytes(computation)) = (field, value) else { continue };
        for (f, v) in Reader::new(computation) {
            let (2, Value::Bytes(instruction)) = (f, v) else { continue };
            for (g, w) in Reader::new(instruction) {
                if let (2, Value::Bytes(op)) = (g, w) {
                    *counts.entry(String::from_utf8_lossy(op).into_owned()).or_insert(0) += 1;
                }
            }
        }
    }
    counts
}

/// Reads the entry computation's parameter shapes from a serialized `HloModuleProto`.
fn entry_parameters(module: &[u8]) -> Option<Vec<ParameterSpec>> {
    let mut host_shape = None;
    let mut entry_id = None;
    let mut computations = Vec::new();
    for (field, value) in Reader::new(module) {
        match (field, value) {
            (4, Value::Bytes(b)) => host_shape = Some(b),
            (6, Value::Varint(id)) => entry_id = Some(id),
            (3, Value::Bytes(b)) => computations.push(b),
            _ => {}
        }
    }
    // The entry computation's own program shape (HloComputationProto.program_shape = 4).
    let entry_shape = entry_id.and_then(|id| {
        computations.iter().find_map(|c| {
            let mut shape = None;
            let mut cid = None;
            for (field, value) in Reader::new(c) {
                match (field, value) {
                    (4, Value::Bytes(b)) => shape = Some(b),
                    (5, Value::Varint(v)) => cid = Some(v),
                    _ => {}
                }
            }
            (cid == Some(id)).then_some(shape).flatten()
        })
    });
    let program_shape = entry_shape.or(host_shape)?;
    let mut params = Vec::new();
    for (field, value) in Reader::new(program_shape) {
        if let (1, Value::Bytes(shape)) = (field, value) {
            let mut ty = 0i64;
            let mut dims = Vec::new();
            for (f, v) in Reader::new(shape) {
                match (f, v) {
                    (2, Value::Varint(t)) => ty = t as i64,
                    (3, v) => push_int64s(v, &mut dims),
                    (4, _) => return None, // a tuple parameter: not checked
                    _ => {}
                }
            }
            params.push(ParameterSpec { element_type: ElementType::from_xla(ty), dims });
        }
    }
    Some(params)
}

/// An execution in flight: its outputs (usable right away as inputs of further executions; PJRT
/// orders the work) and its completion events.
#[must_use = "an execution's errors are only seen by waiting for it"]
pub struct Execution {
    outputs: Vec<Vec<Buffer>>,
    events: Vec<Event>,
}

impl fmt::Debug for Execution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Execution").field("devices", &self.outputs.len()).finish_non_exhaustive()
    }
}

impl Execution {
    /// Whether every device has finished (successfully or not).
    pub fn is_ready(&self) -> Result<bool> {
        for e in &self.events {
            if !e.is_ready()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Waits for every device and returns the outputs, `[device][output]`; the first device
    /// error is returned with PJRT's message and code.
    pub fn wait(self) -> Result<Vec<Vec<Buffer>>> {
        let mut first_error = None;
        for e in &self.events {
            if let Err(err) = e.wait("PJRT_LoadedExecutable_Execute") {
                first_error.get_or_insert(err);
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => {
                let mut outputs = self.outputs;
                for device in &mut outputs {
                    for b in device {
                        b.mark_ready();
                    }
                }
                Ok(outputs)
            }
        }
    }
}

impl LoadedExecutable {
    pub(crate) fn new(client: &Client, raw: *mut sys::PJRT_LoadedExecutable) -> Result<Self> {
        let p = &client.inner.plugin;
        let mut exe = LoadedExecutable {
            client: client.clone(),
            raw,
            devices: Vec::new(),
            num_outputs: 0,
            num_replicas: 1,
            num_partitions: 1,
            parameters: None,
        };
        let mut devs = sys::PJRT_LoadedExecutable_AddressableDevices_Args::new();
        devs.executable = raw;
        // SAFETY: `raw` is the live executable just returned; the device array belongs to it.
        let raw_devices = unsafe {
            pjrt_call!(p, PJRT_LoadedExecutable_AddressableDevices, &mut devs)?;
            raw_slice(devs.addressable_devices, devs.num_addressable_devices).to_vec()
        };
        for d in raw_devices {
            let device = client.device_by_raw(d).cloned().ok_or_else(|| Error::InvalidOptions {
                message: "executable runs on a device its client does not list".to_owned(),
            })?;
            exe.devices.push(device);
        }
        let unloaded = exe.unloaded()?;
        exe.num_outputs = unloaded.count("outputs")?;
        exe.num_replicas = unloaded.count("replicas")?;
        exe.num_partitions = unloaded.count("partitions")?;
        exe.parameters = unloaded.parameters();
        Ok(exe)
    }

    fn unloaded(&self) -> Result<RawExecutable> {
        let p = &self.client.inner.plugin;
        let mut args = sys::PJRT_LoadedExecutable_GetExecutable_Args::new();
        args.loaded_executable = self.raw;
        // SAFETY: `raw` is live; the returned executable is owned (and destroyed) by the caller.
        unsafe { pjrt_call!(p, PJRT_LoadedExecutable_GetExecutable, &mut args) }?;
        Ok(RawExecutable { plugin: p.clone(), raw: args.executable })
    }

    /// The client the executable is loaded on.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The devices it runs on, one per (replica, partition).
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Outputs per device.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Number of replicas it was compiled for.
    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// Number of partitions it was compiled for.
    pub fn num_partitions(&self) -> usize {
        self.num_partitions
    }

    /// The per-device parameter types and shapes that arguments are checked against (`None`
    /// when the plugin does not report its optimized program; then only PJRT checks).
    pub fn parameters(&self) -> Option<&[ParameterSpec]> {
        self.parameters.as_deref()
    }

    /// How many instructions of each HLO opcode the optimized program holds (XLA's own
    /// program after its passes: for an SPMD program, the per-device program with the
    /// collectives the partitioner inserted), or `None` when the plugin does not report it.
    pub fn optimized_opcodes(&self) -> Result<Option<std::collections::BTreeMap<String, usize>>> {
        Ok(self.unloaded()?.optimized_module().map(|m| opcode_counts(&m)))
    }

    /// A platform-specific serialization (`PJRT_Executable_Serialize`), for
    /// [`Client::deserialize`] with the same plugin version.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        self.unloaded()?.serialize()
    }

    /// Runs on its single device and waits; borrowed arguments are never donated.
    ///
    /// The eager path's call: the same checks and C API call as [`Self::execute_with`]
    /// (Self::execute_with), with flat argument arrays for one device.
    pub fn execute(&self, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        if self.devices.len() != 1 {
            return Err(Error::DeviceCount { expected: self.devices.len(), got: 1 });
        }
        self.check_device_args(args.len(), args.iter().copied())?;
        let non_donatable: Vec<i64> = (0..args.len() as i64).collect();
        let arg_ptrs: Vec<*mut sys::PJRT_Buffer> = args.iter().map(|b| b.raw).collect();
        let arg_lists = [arg_ptrs.as_ptr()];
        let mut out_ptrs: Vec<*mut sys::PJRT_Buffer> = vec![std::ptr::null_mut(); self.num_outputs];
        let out_lists = [out_ptrs.as_mut_ptr()];
        let mut event: *mut sys::PJRT_Event = std::ptr::null_mut();
        let plugin = &self.client.inner.plugin;
        // SAFETY: every argument buffer is live (borrowed for the call); one device's argument
        // list holds `args.len()` of them, its output list `num_outputs` slots, and there is one
        // event slot.
        unsafe {
            self.raw_execute(&arg_lists, args.len(), &non_donatable, &out_lists, &mut event)
        }?;
        // Take ownership of everything PJRT handed back before anything can fail.
        let event = Event::from_raw(plugin.clone(), event);
        let mut outputs = wrap_device_outputs(&self.client.inner, out_ptrs);
        event.wait("PJRT_LoadedExecutable_Execute")?;
        let mut outputs = outputs.take_all()?;
        for b in &mut outputs {
            b.mark_ready();
        }
        Ok(outputs)
    }

    /// Runs on its single device with borrowed and donated arguments, and waits.
    pub fn execute_with(&self, args: Vec<Input<'_>>) -> Result<Vec<Buffer>> {
        let mut outputs = self.execute_async(args)?.wait()?;
        Ok(outputs.pop().unwrap_or_default())
    }

    /// Starts a run on its single device; [`Execution::wait`] completes it.
    pub fn execute_async(&self, args: Vec<Input<'_>>) -> Result<Execution> {
        if self.devices.len() != 1 {
            return Err(Error::DeviceCount { expected: self.devices.len(), got: 1 });
        }
        self.launch(vec![args])
    }

    /// Runs on all its devices (SPMD or replicated), `args[device][argument]`, and waits;
    /// returns `[device][output]`.
    pub fn execute_sharded(&self, args: Vec<Vec<Input<'_>>>) -> Result<Vec<Vec<Buffer>>> {
        self.launch(args)?.wait()
    }

    /// Starts a run on all its devices; [`Execution::wait`] completes it.
    pub fn execute_sharded_async(&self, args: Vec<Vec<Input<'_>>>) -> Result<Execution> {
        self.launch(args)
    }

    fn check_args(&self, args: &[Vec<Input<'_>>]) -> Result<()> {
        if args.len() != self.devices.len() {
            return Err(Error::DeviceCount { expected: self.devices.len(), got: args.len() });
        }
        let num_args = args.first().map_or(0, Vec::len);
        for device_args in args {
            if self.parameters.is_none() && device_args.len() != num_args {
                return Err(Error::ArgumentCount { expected: num_args, got: device_args.len() });
            }
            self.check_device_args(device_args.len(), device_args.iter().map(Input::buffer))?;
        }
        Ok(())
    }

    /// Checks one device's arguments against the parameters (count, client, type, shape).
    fn check_device_args<'b>(
        &self,
        count: usize,
        buffers: impl Iterator<Item = &'b Buffer>,
    ) -> Result<()> {
        if let Some(params) = &self.parameters
            && count != params.len()
        {
            return Err(Error::ArgumentCount { expected: params.len(), got: count });
        }
        for (index, b) in buffers.enumerate() {
            if !b.same_client(&self.client.inner) {
                return Err(Error::ArgumentPlacement {
                    index,
                    message: "buffer belongs to another client".to_owned(),
                });
            }
            if let Some(params) = &self.parameters {
                let p = &params[index];
                // Types this layer does not model (fp8, complex, ...) are left to PJRT.
                let modelled = |t: ElementType| !matches!(t, ElementType::Other(_));
                if modelled(p.element_type)
                    && modelled(b.element_type())
                    && p.element_type != b.element_type()
                {
                    return Err(Error::ArgumentType {
                        index,
                        expected: p.element_type,
                        got: b.element_type(),
                    });
                }
                if p.dims != b.dims() {
                    return Err(Error::ArgumentShape {
                        index,
                        expected: p.dims.clone(),
                        got: b.dims().to_vec(),
                    });
                }
            }
        }
        Ok(())
    }

    /// `PJRT_LoadedExecutable_Execute` on `arg_lists.len()` devices, without waiting.
    ///
    /// # Safety
    /// Each entry of `arg_lists` points to `num_args` live buffers of this executable's client,
    /// each entry of `out_lists` to `num_outputs` writable slots (one list per device, as many as
    /// `arg_lists`), and `events` to one writable slot per device.
    unsafe fn raw_execute(
        &self,
        arg_lists: &[*const *mut sys::PJRT_Buffer],
        num_args: usize,
        non_donatable: &[i64],
        out_lists: &[*mut *mut sys::PJRT_Buffer],
        events: *mut *mut sys::PJRT_Event,
    ) -> Result<()> {
        let mut options = sys::PJRT_ExecuteOptions::new();
        options.non_donatable_input_indices = non_donatable.as_ptr();
        options.num_non_donatable_input_indices = non_donatable.len();
        let mut exec = sys::PJRT_LoadedExecutable_Execute_Args::new();
        exec.executable = self.raw;
        exec.options = &mut options;
        exec.argument_lists = arg_lists.as_ptr();
        exec.num_devices = arg_lists.len();
        exec.num_args = num_args;
        exec.output_lists = out_lists.as_ptr();
        exec.device_complete_events = events;
        // SAFETY: the caller's contract covers the arrays; `options` and `non_donatable` outlive
        // the call.
        unsafe { pjrt_call!(self.client.inner.plugin, PJRT_LoadedExecutable_Execute, &mut exec) }
    }

    fn launch(&self, args: Vec<Vec<Input<'_>>>) -> Result<Execution> {
        self.check_args(&args)?;
        let num_devices = args.len();
        let num_args = args.first().map_or(0, Vec::len);
        // An argument position is donatable only if every device donates it.
        let non_donatable: Vec<i64> = (0..num_args)
            .filter(|&i| args.iter().any(|d| matches!(d[i], Input::Borrowed(_))))
            .map(|i| i as i64)
            .collect();
        let arg_ptrs: Vec<Vec<*mut sys::PJRT_Buffer>> =
            args.iter().map(|d| d.iter().map(|i| i.buffer().raw).collect()).collect();
        let arg_lists: Vec<*const *mut sys::PJRT_Buffer> =
            arg_ptrs.iter().map(|d| d.as_ptr()).collect();
        let mut out_ptrs: Vec<Vec<*mut sys::PJRT_Buffer>> =
            (0..num_devices).map(|_| vec![std::ptr::null_mut(); self.num_outputs]).collect();
        let out_lists: Vec<*mut *mut sys::PJRT_Buffer> =
            out_ptrs.iter_mut().map(|d| d.as_mut_ptr()).collect();
        let mut events: Vec<*mut sys::PJRT_Event> = vec![std::ptr::null_mut(); num_devices];
        let plugin = &self.client.inner.plugin;
        // SAFETY: the executable and every argument buffer are live (borrowed or owned by
        // `args`, which outlives the call); each device's argument list holds `num_args`
        // buffers, its output list `num_outputs` slots, and there is an event slot per device.
        unsafe {
            self.raw_execute(&arg_lists, num_args, &non_donatable, &out_lists, events.as_mut_ptr())
        }?;
        // Take ownership of everything PJRT handed back before anything can fail.
        let events: Vec<Event> =
            events.into_iter().map(|e| Event::from_raw(plugin.clone(), e)).collect();
        // Donated handles are now empty shells: destroy them.
        drop(args);
        let outputs = wrap_outputs(&self.client.inner, out_ptrs)?;
        Ok(Execution { outputs, events })
    }
}

/// One device's outputs, owned (so destroyed on every path); the first error wrapping them.
struct DeviceOutputs {
    buffers: Vec<Buffer>,
    error: Option<Error>,
}

impl DeviceOutputs {
    fn take_all(&mut self) -> Result<Vec<Buffer>> {
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(std::mem::take(&mut self.buffers)),
        }
    }
}

fn wrap_device_outputs(
    client: &Arc<ClientInner>,
    raw: Vec<*mut sys::PJRT_Buffer>,
) -> DeviceOutputs {
    let mut out = DeviceOutputs { buffers: Vec::with_capacity(raw.len()), error: None };
    for b in raw {
        if b.is_null() {
            continue;
        }
        // Even on error, `from_output` owns (and so destroys) the buffer.
        match Buffer::from_output(client, b, false) {
            Ok(buf) => out.buffers.push(buf),
            Err(e) => {
                out.error.get_or_insert(e);
            }
        }
    }
    out
}

fn wrap_outputs(
    client: &Arc<ClientInner>,
    raw: Vec<Vec<*mut sys::PJRT_Buffer>>,
) -> Result<Vec<Vec<Buffer>>> {
    // Every device's buffers are owned before the first error returns (and drops them all).
    let mut wrapped: Vec<DeviceOutputs> =
        raw.into_iter().map(|device| wrap_device_outputs(client, device)).collect();
    wrapped.iter_mut().map(DeviceOutputs::take_all).collect()
}
