//! PJRT clients and their devices.

use std::ffi::CString;
use std::fmt;
use std::sync::Arc;

use super::error::Result;
use super::plugin::{Plugin, PluginInner, lossy, pjrt_call};
use super::sys;

/// A value for a named option (client create options, topology options).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum OptionValue {
    /// A string.
    String(String),
    /// A 64-bit integer.
    Int64(i64),
    /// A list of 64-bit integers.
    Int64List(Vec<i64>),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
}

/// Options for [`Client::new`]: platform-specific named values passed to `PJRT_Client_Create`.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    pub(crate) options: Vec<(String, OptionValue)>,
}

impl ClientOptions {
    /// No options: the plugin's defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The CPU plugin's device count (`cpu_device_count`, an int64). Four devices are enough to
    /// run sharded programs on one machine.
    pub fn cpu_device_count(self, count: i64) -> Self {
        self.option("cpu_device_count", OptionValue::Int64(count))
    }

    /// Whether the CPU plugin runs an execution on a worker thread (`asynchronous`, a bool;
    /// the plugin's default is `true`). With `false`, `PJRT_LoadedExecutable_Execute` runs the
    /// program on the calling thread and returns once it is done (its events are ready), which
    /// saves waking a worker for each call: on a 2-core VM, a program of 256 or more elements
    /// took 50-160 us a call through the worker and 6-20 us on the caller (docs/perf-log.md,
    /// 2026-12-04). A program whose devices wait on each other (collectives over several CPU
    /// devices) needs `true`: one calling thread runs the devices one after another.
    pub fn asynchronous(self, on: bool) -> Self {
        self.option("asynchronous", OptionValue::Bool(on))
    }

    /// Any other named option.
    pub fn option(mut self, name: impl Into<String>, value: OptionValue) -> Self {
        let name = name.into();
        self.options.retain(|(n, _)| *n != name);
        self.options.push((name, value));
        self
    }
}

/// Named values laid out for a PJRT call; keeps the strings and lists they point to alive.
pub(crate) struct NamedValues {
    _names: Vec<CString>,
    _strings: Vec<CString>,
    _lists: Vec<Vec<i64>>,
    pub(crate) values: Vec<sys::PJRT_NamedValue>,
}

impl NamedValues {
    pub(crate) fn new(options: &[(String, OptionValue)]) -> Self {
        let mut names = Vec::new();
        let mut strings = Vec::new();
        let mut lists = Vec::new();
        let mut values = Vec::new();
        for (name, value) in options {
            let cname = super::plugin::c_string(name);
            let mut nv = sys::PJRT_NamedValue::new();
            nv.name = cname.as_ptr();
            nv.name_size = cname.as_bytes().len();
            match value {
                OptionValue::String(s) => {
                    let cs = super::plugin::c_string(s);
                    nv.type_ = sys::NAMED_VALUE_STRING;
                    nv.value.string_value = cs.as_ptr();
                    nv.value_size = cs.as_bytes().len();
                    strings.push(cs);
                }
                OptionValue::Int64(v) => {
                    nv.type_ = sys::NAMED_VALUE_INT64;
                    nv.value.int64_value = *v;
                    nv.value_size = 1;
                }
                OptionValue::Int64List(v) => {
                    let list = v.clone();
                    nv.type_ = sys::NAMED_VALUE_INT64_LIST;
                    nv.value.int64_array_value = list.as_ptr();
                    nv.value_size = list.len();
                    lists.push(list);
                }
                OptionValue::Float(v) => {
                    nv.type_ = sys::NAMED_VALUE_FLOAT;
                    nv.value.float_value = *v;
                    nv.value_size = 1;
                }
                OptionValue::Bool(v) => {
                    nv.type_ = sys::NAMED_VALUE_BOOL;
                    nv.value.bool_value = *v;
                    nv.value_size = 1;
                }
            }
            names.push(cname);
            values.push(nv);
        }
        // Moving a CString or Vec does not move its heap data, so the pointers stay valid.
        Self { _names: names, _strings: strings, _lists: lists, values }
    }
}

/// A PJRT client: the devices of one plugin, able to compile, upload and execute.
/// Cheap to clone; `Send + Sync`. Buffers and executables keep their client alive.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub(crate) plugin: Arc<PluginInner>,
    pub(crate) raw: *mut sys::PJRT_Client,
    pub(crate) platform: String,
    pub(crate) platform_version: String,
    pub(crate) devices: Vec<Device>,
}

// SAFETY: a PJRT client is thread-safe by the C API contract; the Rust-side fields are immutable
// after creation.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Client_Destroy_Args::new();
        args.client = self.raw;
        // SAFETY: `raw` is the live client created in `Client::new`; every buffer and executable
        // holds an `Arc<ClientInner>`, so none outlives this call.
        let result = unsafe { pjrt_call!(self.plugin, PJRT_Client_Destroy, &mut args) };
        self.plugin.log_drop_error(result);
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("platform", &self.inner.platform)
            .field("devices", &self.inner.devices.len())
            .finish_non_exhaustive()
    }
}

/// One addressable device of a client.
#[derive(Clone)]
pub struct Device {
    pub(crate) raw: *mut sys::PJRT_Device,
    id: i32,
    local_hardware_id: i32,
    kind: String,
}

// SAFETY: a device handle is an immutable pointer owned by its client; PJRT device queries are
// thread-safe. `Device` values are only reachable through a `Client`, which keeps it alive.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device").field("id", &self.id).field("kind", &self.kind).finish()
    }
}

impl Device {
    /// The device's global id.
    pub fn id(&self) -> i32 {
        self.id
    }

    /// The device's id on its host.
    pub fn local_hardware_id(&self) -> i32 {
        self.local_hardware_id
    }

    /// The device kind reported by the plugin (e.g. `cpu`).
    pub fn kind(&self) -> &str {
        &self.kind
    }
}

impl Client {
    /// Creates a client of `plugin` with `options` (`PJRT_Client_Create`) and lists its
    /// addressable devices.
    pub fn new(plugin: &Plugin, options: ClientOptions) -> Result<Client> {
        let p = &plugin.inner;
        let named = NamedValues::new(&options.options);
        let mut args = sys::PJRT_Client_Create_Args::new();
        args.create_options = named.values.as_ptr();
        args.num_options = named.values.len();
        // SAFETY: `named` keeps the option array and the strings it points to alive for the call.
        unsafe { pjrt_call!(p, PJRT_Client_Create, &mut args) }?;
        let raw = args.client;
        // From here on `ClientInner::drop` destroys the client, also on the error paths below.
        let mut inner = ClientInner {
            plugin: p.clone(),
            raw,
            platform: String::new(),
            platform_version: String::new(),
            devices: Vec::new(),
        };
        let mut name = sys::PJRT_Client_PlatformName_Args::new();
        name.client = raw;
        // SAFETY: `raw` is the live client; the name it returns lives as long as the client.
        unsafe {
            pjrt_call!(p, PJRT_Client_PlatformName, &mut name)?;
            inner.platform = lossy(name.platform_name, name.platform_name_size);
        }
        let mut version = sys::PJRT_Client_PlatformVersion_Args::new();
        version.client = raw;
        // SAFETY: as above.
        unsafe {
            pjrt_call!(p, PJRT_Client_PlatformVersion, &mut version)?;
            inner.platform_version = lossy(version.platform_version, version.platform_version_size);
        }
        let mut devs = sys::PJRT_Client_AddressableDevices_Args::new();
        devs.client = raw;
        // SAFETY: as above; the device array is owned by the client.
        let raw_devices = unsafe {
            pjrt_call!(p, PJRT_Client_AddressableDevices, &mut devs)?;
            raw_slice(devs.addressable_devices, devs.num_addressable_devices).to_vec()
        };
        for d in raw_devices {
            inner.devices.push(describe_device(p, d)?);
        }
        Ok(Client { inner: Arc::new(inner) })
    }

    /// The client's platform name (`cpu`, `tpu`, ...).
    pub fn platform(&self) -> &str {
        &self.inner.platform
    }

    /// The platform's version string.
    pub fn platform_version(&self) -> &str {
        &self.inner.platform_version
    }

    /// The addressable devices, in the plugin's order.
    pub fn devices(&self) -> &[Device] {
        &self.inner.devices
    }

    /// The plugin this client belongs to.
    pub fn plugin(&self) -> Plugin {
        Plugin { inner: self.inner.plugin.clone() }
    }

    pub(crate) fn device_by_raw(&self, raw: *mut sys::PJRT_Device) -> Option<&Device> {
        self.inner.devices.iter().find(|d| d.raw == raw)
    }
}

fn describe_device(p: &PluginInner, raw: *mut sys::PJRT_Device) -> Result<Device> {
    let mut desc = sys::PJRT_Device_GetDescription_Args::new();
    desc.device = raw;
    // SAFETY: `raw` is a device of a live client.
    unsafe { pjrt_call!(p, PJRT_Device_GetDescription, &mut desc) }?;
    let mut id = sys::PJRT_DeviceDescription_Id_Args::new();
    id.device_description = desc.device_description;
    // SAFETY: the description belongs to the device.
    unsafe { pjrt_call!(p, PJRT_DeviceDescription_Id, &mut id) }?;
    let mut kind = sys::PJRT_DeviceDescription_Kind_Args::new();
    kind.device_description = desc.device_description;
    // SAFETY: as above; the kind string lives as long as the device.
    let kind = unsafe {
        pjrt_call!(p, PJRT_DeviceDescription_Kind, &mut kind)?;
        lossy(kind.device_kind, kind.device_kind_size)
    };
    let mut hw = sys::PJRT_Device_LocalHardwareId_Args::new();
    hw.device = raw;
    // SAFETY: `raw` is a device of a live client.
    unsafe { pjrt_call!(p, PJRT_Device_LocalHardwareId, &mut hw) }?;
    Ok(Device { raw, id: id.id, local_hardware_id: hw.local_hardware_id, kind })
}

/// A slice view of a PJRT-owned array.
///
/// # Safety
/// `ptr` must be null (then `len` is ignored) or point to `len` initialized elements that stay
/// valid for `'a`.
pub(crate) unsafe fn raw_slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}
