//! Hand-written declarations of the part of the PJRT C API (and the XLA FFI C API) this layer
//! calls, written against PJRT C API header version 0.81.
//!
//! Every argument struct starts with `struct_size` and `extension_start`; `struct_size` is the
//! size of the struct up to and including its last field as of header 0.81 (the C macro
//! `PJRT_STRUCT_SIZE`), computed here from the Rust layout by [`args!`]. A plugin built against
//! a newer header reads only the fields we declare; one built against an older header refuses
//! the call with an explicit size error, and [`MIN_API_MINOR`] keeps us from trying.
//!
//! Enumerations are plain integers (`c_int`) so no value a plugin returns can be invalid in Rust.
//! Nothing in this module is public outside `pjrt`.
#![allow(non_camel_case_types, non_snake_case, missing_debug_implementations)]

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

/// The oldest plugin API minor version accepted (the table and structs we use exist from here on).
pub(crate) const MIN_API_MINOR: i32 = 81;

// Opaque handles.
#[repr(C)]
pub(crate) struct PJRT_Error {
    _p: [u8; 0],
}
#[repr(C)]
pub(crate) struct PJRT_Client {
    _p: [u8; 0],
}
#[repr(C)]
pub(crate) struct PJRT_Device {
    _p: [u8; 0],
}
#[repr(C)]
pub(crate) struct PJRT_DeviceDescription {
    _p: [u8; 0],
}
#[repr(C)]
pub(crate) struct PJRT_Memory {
    _p: [u8; 0],
}
#[repr(C)]
pub(crate) struct PJRT_Executable {
    _p: [u8; 0],
}
#[repr(C)]
pub(crate) struct PJRT_LoadedExecutable {
    _p: [u8; 0],
}
#[repr(C)]
pub(crate) struct PJRT_Buffer {
    _p: [u8; 0],
}
#[repr(C)]
pub(crate) struct PJRT_Event {
    _p: [u8; 0],
}
#[repr(C)]
pub(crate) struct PJRT_TopologyDescription {
    _p: [u8; 0],
}
#[repr(C)]
pub(crate) struct PJRT_SerializedExecutable {
    _p: [u8; 0],
}

/// Header of every entry in the plugin's extension chain.
#[repr(C)]
pub(crate) struct PJRT_Extension_Base {
    pub struct_size: usize,
    pub type_: c_int,
    pub next: *mut PJRT_Extension_Base,
}

/// `PJRT_Extension_Type_FFI`.
pub(crate) const EXTENSION_TYPE_FFI: c_int = 5;

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PJRT_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub major_version: c_int,
    pub minor_version: c_int,
}

/// Declares an argument struct: `struct_size`, `extension_start`, then the listed fields, with
/// `STRUCT_SIZE` (end of the last field) and a zeroed constructor that sets `struct_size`.
macro_rules! args {
    ($(#[$meta:meta])* $name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        pub(crate) struct $name {
            pub struct_size: usize,
            pub extension_start: *mut PJRT_Extension_Base,
            $(pub $field: $ty,)*
        }
        impl $name {
            #[allow(dead_code, unused_mut)]
            pub(crate) const STRUCT_SIZE: usize = {
                let mut end = offset_of!($name, extension_start) + size_of::<*mut c_void>();
                $(
                    let e = offset_of!($name, $field) + size_of::<$ty>();
                    if e > end { end = e; }
                )*
                end
            };
            /// All fields zero (null pointers, zero sizes, `None` callbacks), `struct_size` set.
            #[allow(dead_code)]
            pub(crate) fn new() -> Self {
                // SAFETY: every field type used in these declarations (integers, bools, raw
                // pointers, `Option` of function pointers, plain-data unions) is valid when
                // all-zero.
                let mut s: Self = unsafe { std::mem::zeroed() };
                s.struct_size = Self::STRUCT_SIZE;
                s
            }
        }
    };
}

// ---------------------------------------------------------------- errors

args!(PJRT_Error_Destroy_Args { error: *mut PJRT_Error });
args!(PJRT_Error_Message_Args { error: *const PJRT_Error, message: *const c_char, message_size: usize });
args!(PJRT_Error_GetCode_Args { error: *const PJRT_Error, code: c_int });

// ---------------------------------------------------------------- named values

pub(crate) const NAMED_VALUE_STRING: c_int = 0;
pub(crate) const NAMED_VALUE_INT64: c_int = 1;
pub(crate) const NAMED_VALUE_INT64_LIST: c_int = 2;
pub(crate) const NAMED_VALUE_FLOAT: c_int = 3;
pub(crate) const NAMED_VALUE_BOOL: c_int = 4;

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union NamedValueUnion {
    pub string_value: *const c_char,
    pub int64_value: i64,
    pub int64_array_value: *const i64,
    pub float_value: f32,
    pub bool_value: bool,
}

args!(PJRT_NamedValue {
    name: *const c_char,
    name_size: usize,
    type_: c_int,
    value: NamedValueUnion,
    value_size: usize,
});

// ---------------------------------------------------------------- plugin

args!(PJRT_Plugin_Initialize_Args {});
args!(PJRT_Plugin_Attributes_Args { attributes: *const PJRT_NamedValue, num_attributes: usize });

// ---------------------------------------------------------------- events

args!(PJRT_Event_Destroy_Args { event: *mut PJRT_Event });
args!(PJRT_Event_IsReady_Args { event: *mut PJRT_Event, is_ready: bool });
args!(PJRT_Event_Await_Args { event: *mut PJRT_Event });

// ---------------------------------------------------------------- client

args!(PJRT_Client_Create_Args {
    create_options: *const PJRT_NamedValue,
    num_options: usize,
    kv_get_callback: *mut c_void,
    kv_get_user_arg: *mut c_void,
    kv_put_callback: *mut c_void,
    kv_put_user_arg: *mut c_void,
    client: *mut PJRT_Client,
    kv_try_get_callback: *mut c_void,
    kv_try_get_user_arg: *mut c_void,
});
args!(PJRT_Client_Destroy_Args { client: *mut PJRT_Client });
args!(PJRT_Client_PlatformName_Args {
    client: *mut PJRT_Client,
    platform_name: *const c_char,
    platform_name_size: usize,
});
args!(PJRT_Client_PlatformVersion_Args {
    client: *mut PJRT_Client,
    platform_version: *const c_char,
    platform_version_size: usize,
});
args!(PJRT_Client_AddressableDevices_Args {
    client: *mut PJRT_Client,
    addressable_devices: *const *mut PJRT_Device,
    num_addressable_devices: usize,
});

args!(PJRT_Program {
    code: *mut c_char,
    code_size: usize,
    format: *const c_char,
    format_size: usize,
});
args!(PJRT_Client_Compile_Args {
    client: *mut PJRT_Client,
    program: *const PJRT_Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    executable: *mut PJRT_LoadedExecutable,
});

// Element types (`PJRT_Buffer_Type`).
pub(crate) const BUFFER_TYPE_PRED: c_int = 1;
pub(crate) const BUFFER_TYPE_S8: c_int = 2;
pub(crate) const BUFFER_TYPE_S16: c_int = 3;
pub(crate) const BUFFER_TYPE_S32: c_int = 4;
pub(crate) const BUFFER_TYPE_S64: c_int = 5;
pub(crate) const BUFFER_TYPE_U8: c_int = 6;
pub(crate) const BUFFER_TYPE_U16: c_int = 7;
pub(crate) const BUFFER_TYPE_U32: c_int = 8;
pub(crate) const BUFFER_TYPE_U64: c_int = 9;
pub(crate) const BUFFER_TYPE_F16: c_int = 10;
pub(crate) const BUFFER_TYPE_F32: c_int = 11;
pub(crate) const BUFFER_TYPE_F64: c_int = 12;
pub(crate) const BUFFER_TYPE_BF16: c_int = 13;

// Host buffer semantics (`PJRT_HostBufferSemantics`).
pub(crate) const HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL: c_int = 0;
pub(crate) const HOST_BUFFER_IMMUTABLE_ZERO_COPY: c_int = 2;
pub(crate) const HOST_BUFFER_MUTABLE_ZERO_COPY: c_int = 3;

args!(PJRT_Client_BufferFromHostBuffer_Args {
    client: *mut PJRT_Client,
    data: *const c_void,
    type_: c_int,
    dims: *const i64,
    num_dims: usize,
    byte_strides: *const i64,
    num_byte_strides: usize,
    host_buffer_semantics: c_int,
    device: *mut PJRT_Device,
    memory: *mut PJRT_Memory,
    device_layout: *mut c_void,
    done_with_host_buffer: *mut PJRT_Event,
    buffer: *mut PJRT_Buffer,
});

args!(PJRT_Client_CreateViewOfDeviceBuffer_Args {
    client: *mut PJRT_Client,
    device_buffer_ptr: *mut c_void,
    dims: *const i64,
    num_dims: usize,
    element_type: c_int,
    layout: *mut c_void,
    device: *mut PJRT_Device,
    on_delete_callback: Option<unsafe extern "C" fn(*mut c_void, *mut c_void)>,
    on_delete_callback_arg: *mut c_void,
    stream: isize,
    buffer: *mut PJRT_Buffer,
    memory: *mut PJRT_Memory,
});

// ---------------------------------------------------------------- devices

args!(PJRT_DeviceDescription_Id_Args { device_description: *mut PJRT_DeviceDescription, id: c_int });
args!(PJRT_DeviceDescription_Kind_Args {
    device_description: *mut PJRT_DeviceDescription,
    device_kind: *const c_char,
    device_kind_size: usize,
});
args!(PJRT_Device_GetDescription_Args {
    device: *mut PJRT_Device,
    device_description: *mut PJRT_DeviceDescription,
});
args!(PJRT_Device_LocalHardwareId_Args { device: *mut PJRT_Device, local_hardware_id: c_int });

// ---------------------------------------------------------------- executables

args!(PJRT_Executable_Destroy_Args { executable: *mut PJRT_Executable });
args!(PJRT_LoadedExecutable_Destroy_Args { executable: *mut PJRT_LoadedExecutable });
args!(PJRT_LoadedExecutable_GetExecutable_Args {
    loaded_executable: *mut PJRT_LoadedExecutable,
    executable: *mut PJRT_Executable,
});
args!(PJRT_Executable_NumReplicas_Args { executable: *mut PJRT_Executable, num_replicas: usize });
args!(PJRT_Executable_NumPartitions_Args {
    executable: *mut PJRT_Executable,
    num_partitions: usize,
});
args!(PJRT_LoadedExecutable_AddressableDevices_Args {
    executable: *mut PJRT_LoadedExecutable,
    addressable_devices: *const *mut PJRT_Device,
    num_addressable_devices: usize,
});
args!(PJRT_Executable_OptimizedProgram_Args {
    executable: *mut PJRT_Executable,
    program: *mut PJRT_Program,
});
args!(PJRT_ExecuteOptions {
    send_callbacks: *mut c_void,
    recv_callbacks: *mut c_void,
    num_send_ops: usize,
    num_recv_ops: usize,
    launch_id: c_int,
    non_donatable_input_indices: *const i64,
    num_non_donatable_input_indices: usize,
    context: *mut c_void,
    call_location: *const c_char,
    num_tasks: usize,
    task_ids: *mut c_int,
    incarnation_ids: *mut i64,
});
args!(PJRT_LoadedExecutable_Execute_Args {
    executable: *mut PJRT_LoadedExecutable,
    options: *mut PJRT_ExecuteOptions,
    argument_lists: *const *const *mut PJRT_Buffer,
    num_devices: usize,
    num_args: usize,
    output_lists: *const *mut *mut PJRT_Buffer,
    device_complete_events: *mut *mut PJRT_Event,
    execute_device: *mut PJRT_Device,
});
args!(PJRT_Executable_NumOutputs_Args { executable: *mut PJRT_Executable, num_outputs: usize });
args!(PJRT_Executable_SizeOfGeneratedCodeInBytes_Args {
    executable: *mut PJRT_Executable,
    size_in_bytes: i64,
});
args!(PJRT_Executable_Serialize_Args {
    executable: *const PJRT_Executable,
    serialized_bytes: *const c_char,
    serialized_bytes_size: usize,
    serialized_executable: *mut PJRT_SerializedExecutable,
    serialized_executable_deleter: Option<unsafe extern "C" fn(*mut PJRT_SerializedExecutable)>,
});
args!(PJRT_Executable_DeserializeAndLoad_Args {
    client: *mut PJRT_Client,
    serialized_executable: *const c_char,
    serialized_executable_size: usize,
    loaded_executable: *mut PJRT_LoadedExecutable,
    overridden_serialized_compile_options: *const c_char,
    overridden_serialized_compile_options_size: usize,
});

// ---------------------------------------------------------------- buffers

args!(PJRT_Buffer_Destroy_Args { buffer: *mut PJRT_Buffer });
args!(PJRT_Buffer_ElementType_Args { buffer: *mut PJRT_Buffer, type_: c_int });
args!(PJRT_Buffer_Dimensions_Args { buffer: *mut PJRT_Buffer, dims: *const i64, num_dims: usize });
args!(PJRT_Buffer_ToHostBuffer_Args {
    src: *mut PJRT_Buffer,
    host_layout: *mut c_void,
    dst: *mut c_void,
    dst_size: usize,
    event: *mut PJRT_Event,
});
args!(PJRT_Buffer_OnDeviceSizeInBytes_Args {
    buffer: *mut PJRT_Buffer,
    on_device_size_in_bytes: usize,
});
args!(PJRT_Buffer_IsOnCpu_Args { buffer: *mut PJRT_Buffer, is_on_cpu: bool });
args!(PJRT_Buffer_Device_Args { buffer: *mut PJRT_Buffer, device: *mut PJRT_Device });
args!(PJRT_Buffer_ReadyEvent_Args { buffer: *mut PJRT_Buffer, event: *mut PJRT_Event });
args!(PJRT_Buffer_UnsafePointer_Args { buffer: *mut PJRT_Buffer, buffer_pointer: usize });

// ---------------------------------------------------------------- topologies

args!(PJRT_TopologyDescription_Create_Args {
    topology_name: *const c_char,
    topology_name_size: usize,
    create_options: *const PJRT_NamedValue,
    num_options: usize,
    topology: *mut PJRT_TopologyDescription,
});
args!(PJRT_TopologyDescription_Destroy_Args { topology: *mut PJRT_TopologyDescription });
args!(PJRT_TopologyDescription_PlatformName_Args {
    topology: *const PJRT_TopologyDescription,
    platform_name: *const c_char,
    platform_name_size: usize,
});
args!(PJRT_TopologyDescription_GetDeviceDescriptions_Args {
    topology: *const PJRT_TopologyDescription,
    descriptions: *const *mut PJRT_DeviceDescription,
    num_descriptions: usize,
});
args!(PJRT_Compile_Args {
    topology: *const PJRT_TopologyDescription,
    program: *const PJRT_Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    client: *mut PJRT_Client,
    executable: *mut PJRT_Executable,
});

// ---------------------------------------------------------------- the function table

type F<A> = Option<unsafe extern "C" fn(*mut A) -> *mut PJRT_Error>;
/// A table slot this layer never calls (kept for the layout).
type Unused = Option<unsafe extern "C" fn()>;

/// `PJRT_Api`, in header 0.81 order. Slots are appended in later versions, never moved.
#[repr(C)]
pub(crate) struct PJRT_Api {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub pjrt_api_version: PJRT_Api_Version,

    pub PJRT_Error_Destroy: Option<unsafe extern "C" fn(*mut PJRT_Error_Destroy_Args)>,
    pub PJRT_Error_Message: Option<unsafe extern "C" fn(*mut PJRT_Error_Message_Args)>,
    pub PJRT_Error_GetCode: F<PJRT_Error_GetCode_Args>,

    pub PJRT_Plugin_Initialize: F<PJRT_Plugin_Initialize_Args>,
    pub PJRT_Plugin_Attributes: F<PJRT_Plugin_Attributes_Args>,

    pub PJRT_Event_Destroy: F<PJRT_Event_Destroy_Args>,
    pub PJRT_Event_IsReady: F<PJRT_Event_IsReady_Args>,
    pub PJRT_Event_Error: Unused,
    pub PJRT_Event_Await: F<PJRT_Event_Await_Args>,
    pub PJRT_Event_OnReady: Unused,

    pub PJRT_Client_Create: F<PJRT_Client_Create_Args>,
    pub PJRT_Client_Destroy: F<PJRT_Client_Destroy_Args>,
    pub PJRT_Client_PlatformName: F<PJRT_Client_PlatformName_Args>,
    pub PJRT_Client_ProcessIndex: Unused,
    pub PJRT_Client_PlatformVersion: F<PJRT_Client_PlatformVersion_Args>,
    pub PJRT_Client_Devices: Unused,
    pub PJRT_Client_AddressableDevices: F<PJRT_Client_AddressableDevices_Args>,
    pub PJRT_Client_LookupDevice: Unused,
    pub PJRT_Client_LookupAddressableDevice: Unused,
    pub PJRT_Client_AddressableMemories: Unused,
    pub PJRT_Client_Compile: F<PJRT_Client_Compile_Args>,
    pub PJRT_Client_DefaultDeviceAssignment: Unused,
    pub PJRT_Client_BufferFromHostBuffer: F<PJRT_Client_BufferFromHostBuffer_Args>,

    pub PJRT_DeviceDescription_Id: F<PJRT_DeviceDescription_Id_Args>,
    pub PJRT_DeviceDescription_ProcessIndex: Unused,
    pub PJRT_DeviceDescription_Attributes: Unused,
    pub PJRT_DeviceDescription_Kind: F<PJRT_DeviceDescription_Kind_Args>,
    pub PJRT_DeviceDescription_DebugString: Unused,
    pub PJRT_DeviceDescription_ToString: Unused,

    pub PJRT_Device_GetDescription: F<PJRT_Device_GetDescription_Args>,
    pub PJRT_Device_IsAddressable: Unused,
    pub PJRT_Device_LocalHardwareId: F<PJRT_Device_LocalHardwareId_Args>,
    pub PJRT_Device_AddressableMemories: Unused,
    pub PJRT_Device_DefaultMemory: Unused,
    pub PJRT_Device_MemoryStats: Unused,

    pub PJRT_Memory_Id: Unused,
    pub PJRT_Memory_Kind: Unused,
    pub PJRT_Memory_DebugString: Unused,
    pub PJRT_Memory_ToString: Unused,
    pub PJRT_Memory_AddressableByDevices: Unused,

    pub PJRT_Executable_Destroy: F<PJRT_Executable_Destroy_Args>,
    pub PJRT_Executable_Name: Unused,
    pub PJRT_Executable_NumReplicas: F<PJRT_Executable_NumReplicas_Args>,
    pub PJRT_Executable_NumPartitions: F<PJRT_Executable_NumPartitions_Args>,
    pub PJRT_Executable_NumOutputs: F<PJRT_Executable_NumOutputs_Args>,
    pub PJRT_Executable_SizeOfGeneratedCodeInBytes:
        F<PJRT_Executable_SizeOfGeneratedCodeInBytes_Args>,
    pub PJRT_Executable_GetCostAnalysis: Unused,
    pub PJRT_Executable_OutputMemoryKinds: Unused,
    pub PJRT_Executable_OptimizedProgram: F<PJRT_Executable_OptimizedProgram_Args>,
    pub PJRT_Executable_Serialize: F<PJRT_Executable_Serialize_Args>,

    pub PJRT_LoadedExecutable_Destroy: F<PJRT_LoadedExecutable_Destroy_Args>,
    pub PJRT_LoadedExecutable_GetExecutable: F<PJRT_LoadedExecutable_GetExecutable_Args>,
    pub PJRT_LoadedExecutable_AddressableDevices: F<PJRT_LoadedExecutable_AddressableDevices_Args>,
    pub PJRT_LoadedExecutable_Delete: Unused,
    pub PJRT_LoadedExecutable_IsDeleted: Unused,
    pub PJRT_LoadedExecutable_Execute: F<PJRT_LoadedExecutable_Execute_Args>,
    pub PJRT_Executable_DeserializeAndLoad: F<PJRT_Executable_DeserializeAndLoad_Args>,
    pub PJRT_LoadedExecutable_Fingerprint: Unused,

    pub PJRT_Buffer_Destroy: F<PJRT_Buffer_Destroy_Args>,
    pub PJRT_Buffer_ElementType: F<PJRT_Buffer_ElementType_Args>,
    pub PJRT_Buffer_Dimensions: F<PJRT_Buffer_Dimensions_Args>,
    pub PJRT_Buffer_UnpaddedDimensions: Unused,
    pub PJRT_Buffer_DynamicDimensionIndices: Unused,
    pub PJRT_Buffer_GetMemoryLayout: Unused,
    pub PJRT_Buffer_OnDeviceSizeInBytes: F<PJRT_Buffer_OnDeviceSizeInBytes_Args>,
    pub PJRT_Buffer_Device: F<PJRT_Buffer_Device_Args>,
    pub PJRT_Buffer_Memory: Unused,
    pub PJRT_Buffer_Delete: Unused,
    pub PJRT_Buffer_IsDeleted: Unused,
    pub PJRT_Buffer_CopyToDevice: Unused,
    pub PJRT_Buffer_ToHostBuffer: F<PJRT_Buffer_ToHostBuffer_Args>,
    pub PJRT_Buffer_IsOnCpu: F<PJRT_Buffer_IsOnCpu_Args>,
    pub PJRT_Buffer_ReadyEvent: F<PJRT_Buffer_ReadyEvent_Args>,
    pub PJRT_Buffer_UnsafePointer: F<PJRT_Buffer_UnsafePointer_Args>,
    pub PJRT_Buffer_IncreaseExternalReferenceCount: Unused,
    pub PJRT_Buffer_DecreaseExternalReferenceCount: Unused,
    pub PJRT_Buffer_OpaqueDeviceMemoryDataPointer: Unused,

    pub PJRT_CopyToDeviceStream_Destroy: Unused,
    pub PJRT_CopyToDeviceStream_AddChunk: Unused,
    pub PJRT_CopyToDeviceStream_TotalBytes: Unused,
    pub PJRT_CopyToDeviceStream_GranuleSize: Unused,
    pub PJRT_CopyToDeviceStream_CurrentBytes: Unused,

    pub PJRT_TopologyDescription_Create: F<PJRT_TopologyDescription_Create_Args>,
    pub PJRT_TopologyDescription_Destroy: F<PJRT_TopologyDescription_Destroy_Args>,
    pub PJRT_TopologyDescription_PlatformName: F<PJRT_TopologyDescription_PlatformName_Args>,
    pub PJRT_TopologyDescription_PlatformVersion: Unused,
    pub PJRT_TopologyDescription_GetDeviceDescriptions:
        F<PJRT_TopologyDescription_GetDeviceDescriptions_Args>,
    pub PJRT_TopologyDescription_Serialize: Unused,
    pub PJRT_TopologyDescription_Attributes: Unused,

    pub PJRT_Compile: F<PJRT_Compile_Args>,

    // Appended after the 0.81-era layout's `PJRT_Compile`, in header order.
    pub PJRT_Executable_OutputElementTypes: Unused,
    pub PJRT_Executable_OutputDimensions: Unused,
    pub PJRT_Buffer_CopyToMemory: Unused,
    pub PJRT_Client_CreateViewOfDeviceBuffer: F<PJRT_Client_CreateViewOfDeviceBuffer_Args>,
}

// ---------------------------------------------------------------- the PJRT FFI extension

/// `PJRT_FFI_Register_Handler_Args` as plugins of PJRT C API 0.115 and later read it (no
/// `extension_start`, no `api_version`: only typed handlers). Older plugins declare the same
/// extension version with an extra `int api_version` after `target_name_size`, so the layout
/// cannot be told apart at run time; [`MIN_FFI_API_MINOR`] keeps older plugins from being called.
#[repr(C)]
pub(crate) struct PJRT_FFI_Register_Handler_Args {
    pub struct_size: usize,
    pub target_name: *const c_char,
    pub target_name_size: usize,
    pub handler: *mut c_void,
    pub platform_name: *const c_char,
    pub platform_name_size: usize,
    pub traits: u32,
}
impl PJRT_FFI_Register_Handler_Args {
    pub(crate) const STRUCT_SIZE: usize =
        offset_of!(PJRT_FFI_Register_Handler_Args, traits) + size_of::<u32>();
}

/// The oldest plugin API minor version whose FFI handler registration layout is verified.
pub(crate) const MIN_FFI_API_MINOR: i32 = 115;

/// `PJRT_FFI_Extension`: the extension base, then three entry points.
#[repr(C)]
pub(crate) struct PJRT_FFI_Extension {
    pub base: PJRT_Extension_Base,
    pub type_id_register: Unused,
    pub user_data_add: Unused,
    pub register_handler:
        Option<unsafe extern "C" fn(*mut PJRT_FFI_Register_Handler_Args) -> *mut PJRT_Error>,
}

// ---------------------------------------------------------------- the XLA FFI (handler side)

#[repr(C)]
pub(crate) struct XLA_FFI_Error {
    _p: [u8; 0],
}

/// `XLA_FFI_InternalExtension` base (type 1 is the metadata query).
#[repr(C)]
pub(crate) struct XLA_FFI_InternalExtension {
    pub struct_size: usize,
    pub type_: c_int,
    pub next: *mut XLA_FFI_InternalExtension,
}
pub(crate) const XLA_FFI_EXTENSION_METADATA: c_int = 1;

#[repr(C)]
pub(crate) struct XLA_FFI_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub major_version: c_int,
    pub minor_version: c_int,
}
impl XLA_FFI_Api_Version {
    pub(crate) const STRUCT_SIZE: usize =
        offset_of!(XLA_FFI_Api_Version, minor_version) + size_of::<c_int>();
}

#[repr(C)]
pub(crate) struct XLA_FFI_Metadata {
    pub struct_size: usize,
    pub api_version: XLA_FFI_Api_Version,
    pub traits: u32,
}

#[repr(C)]
pub(crate) struct XLA_FFI_Metadata_Extension {
    pub extension_base: XLA_FFI_InternalExtension,
    pub metadata: *mut XLA_FFI_Metadata,
}

#[repr(C)]
pub(crate) struct XLA_FFI_Error_Create_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub message: *const c_char,
    pub errc: c_int,
}
impl XLA_FFI_Error_Create_Args {
    pub(crate) const STRUCT_SIZE: usize =
        offset_of!(XLA_FFI_Error_Create_Args, errc) + size_of::<c_int>();
}

/// The head of `XLA_FFI_Api`: only the error constructor is called from handlers.
#[repr(C)]
pub(crate) struct XLA_FFI_Api {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub api_version: XLA_FFI_Api_Version,
    pub internal_api: *const c_void,
    pub XLA_FFI_Error_Create:
        Option<unsafe extern "C" fn(*mut XLA_FFI_Error_Create_Args) -> *mut XLA_FFI_Error>,
}

#[repr(C)]
pub(crate) struct XLA_FFI_Buffer {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub dtype: c_int,
    pub data: *mut c_void,
    pub rank: i64,
    pub dims: *mut i64,
}

pub(crate) const XLA_FFI_ARG_TYPE_BUFFER: c_int = 1;

#[repr(C)]
pub(crate) struct XLA_FFI_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub size: i64,
    pub types: *mut c_int,
    pub args: *mut *mut c_void,
}

#[repr(C)]
pub(crate) struct XLA_FFI_Rets {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub size: i64,
    pub types: *mut c_int,
    pub rets: *mut *mut c_void,
}

#[repr(C)]
pub(crate) struct XLA_FFI_Attrs {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub size: i64,
    pub types: *mut c_int,
    pub names: *mut c_void,
    pub attrs: *mut *mut c_void,
}

/// `XLA_FFI_CallFrame`: what XLA hands a handler.
#[repr(C)]
pub(crate) struct XLA_FFI_CallFrame {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut XLA_FFI_InternalExtension,
    pub(crate) api: *const XLA_FFI_Api,
    pub(crate) ctx: *mut c_void,
    pub(crate) stage: c_int,
    pub(crate) args: XLA_FFI_Args,
    pub(crate) rets: XLA_FFI_Rets,
    pub(crate) attrs: XLA_FFI_Attrs,
    pub(crate) future: *mut c_void,
}
pub(crate) const XLA_FFI_STAGE_EXECUTE: c_int = 3;

#[cfg(test)]
mod tests {
    use super::*;

    // Sizes printed by a C program including header 0.81 (LP64: x86_64, aarch64).
    #[test]
    fn struct_sizes_match_header_081() {
        assert_eq!(PJRT_NamedValue::STRUCT_SIZE, 56);
        assert_eq!(PJRT_Plugin_Initialize_Args::STRUCT_SIZE, 16);
        assert_eq!(PJRT_Client_Create_Args::STRUCT_SIZE, 88);
        assert_eq!(PJRT_Event_IsReady_Args::STRUCT_SIZE, 25);
        assert_eq!(PJRT_Error_GetCode_Args::STRUCT_SIZE, 28);
        assert_eq!(PJRT_Program::STRUCT_SIZE, 48);
        assert_eq!(PJRT_ExecuteOptions::STRUCT_SIZE, 112);
        assert_eq!(PJRT_LoadedExecutable_Execute_Args::STRUCT_SIZE, 80);
        assert_eq!(PJRT_Client_BufferFromHostBuffer_Args::STRUCT_SIZE, 120);
        assert_eq!(PJRT_Executable_Serialize_Args::STRUCT_SIZE, 56);
        assert_eq!(PJRT_Executable_DeserializeAndLoad_Args::STRUCT_SIZE, 64);
        assert_eq!(PJRT_Buffer_ToHostBuffer_Args::STRUCT_SIZE, 56);
        assert_eq!(PJRT_TopologyDescription_Create_Args::STRUCT_SIZE, 56);
        assert_eq!(PJRT_Compile_Args::STRUCT_SIZE, 64);
        assert_eq!(PJRT_Buffer_IsOnCpu_Args::STRUCT_SIZE, 25);
        assert_eq!(PJRT_FFI_Register_Handler_Args::STRUCT_SIZE, 52);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Error_Destroy), 40);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Compile), 752);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Client_CreateViewOfDeviceBuffer), 784);
        assert_eq!(PJRT_Client_CreateViewOfDeviceBuffer_Args::STRUCT_SIZE, 112);
        assert_eq!(offset_of!(XLA_FFI_CallFrame, args), 40);
        assert_eq!(size_of::<XLA_FFI_CallFrame>(), 176);
    }
}
