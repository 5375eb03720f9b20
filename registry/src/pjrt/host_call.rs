//! Host custom calls: Rust functions registered as XLA FFI handlers through the plugin's FFI
//! extension, callable from StableHLO with
//! `stablehlo.custom_call @name(...) {api_version = 4 : i32}`.
//!
//! ```no_run
//! use tpu_kernels_registry::pjrt::{HostCall, HostFunction, Plugin, register_host_function};
//!
//! struct AddOne;
//! impl HostFunction for AddOne {
//!     fn call(call: &mut HostCall<'_>) -> Result<(), String> {
//!         let x = call.arg(0)?.as_slice::<f32>()?;
//!         let y = call.take_result(0)?.into_slice::<f32>()?;
//!         for (y, x) in y.iter_mut().zip(x) {
//!             *y = x + 1.0;
//!         }
//!         Ok(())
//!     }
//! }
//! # fn main() -> Result<(), tpu_kernels_registry::pjrt::Error> {
//! register_host_function::<AddOne>(&Plugin::cpu()?, "tpuk_add_one")?;
//! # Ok(()) }
//! ```

use std::any::TypeId;
use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, OnceLock};

use super::buffer::{ElementType, NativeType};
use super::error::{Error, Result};
use super::plugin::Plugin;
use super::sys;

/// A Rust function XLA can call on the host. Implement it on a unit type and register it with
/// [`register_host_function`]; each implementing type gets its own C entry point.
pub trait HostFunction: 'static {
    /// Runs the call: read arguments, write results. An `Err` fails the execution with the
    /// message; a panic is caught and reported the same way.
    fn call(call: &mut HostCall<'_>) -> std::result::Result<(), String>;
}

/// The arguments and results of one host call.
#[derive(Debug)]
pub struct HostCall<'a> {
    args: Vec<HostArg<'a>>,
    results: Vec<Option<HostResult<'a>>>,
}

/// A read-only argument buffer of a host call.
#[derive(Debug, Clone, Copy)]
pub struct HostArg<'a> {
    ty: ElementType,
    dims: &'a [i64],
    data: *const u8,
}

/// A result buffer of a host call, to be filled.
#[derive(Debug)]
pub struct HostResult<'a> {
    ty: ElementType,
    dims: &'a [i64],
    data: *mut u8,
}

fn count(dims: &[i64]) -> usize {
    dims.iter().map(|&d| usize::try_from(d).unwrap_or(0)).product()
}

fn check<T: NativeType>(ty: ElementType, dims: &[i64], data: *const u8) -> Result<(), String> {
    if T::TYPE != ty {
        return Err(format!("buffer holds {ty}, the handler reads it as {}", T::TYPE));
    }
    if !T::ANY_BIT_PATTERN {
        return Err(format!("{ty} buffers are not viewed as typed slices"));
    }
    if data.is_null() && count(dims) != 0 {
        return Err("buffer has no data".to_owned());
    }
    if !(data as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(format!("buffer is not aligned for {ty}"));
    }
    Ok(())
}

impl<'a> HostArg<'a> {
    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.ty
    }

    /// The shape.
    pub fn dims(&self) -> &'a [i64] {
        self.dims
    }

    /// The data, typed; `T` must match the element type.
    pub fn as_slice<T: NativeType>(&self) -> Result<&'a [T], String> {
        check::<T>(self.ty, self.dims, self.data)?;
        if count(self.dims) == 0 {
            return Ok(&[]);
        }
        // SAFETY: XLA hands the handler a live, aligned (checked) buffer of `dims` elements of
        // `ty` (checked to be `T`) for the duration of the call ('a); arguments are not written
        // during the call (results that alias an argument are refused in `take_result`).
        Ok(unsafe { std::slice::from_raw_parts(self.data.cast::<T>(), count(self.dims)) })
    }
}

impl<'a> HostResult<'a> {
    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.ty
    }

    /// The shape.
    pub fn dims(&self) -> &'a [i64] {
        self.dims
    }

    /// The data to write, typed; `T` must match the element type.
    pub fn into_slice<T: NativeType>(self) -> Result<&'a mut [T], String> {
        check::<T>(self.ty, self.dims, self.data)?;
        if count(self.dims) == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as for arguments; the result is handed out once (`take_result`), does not
        // overlap any argument (checked there), so this is the only reference to it.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.data.cast::<T>(), count(self.dims)) })
    }
}

impl<'a> HostCall<'a> {
    /// The number of arguments.
    pub fn num_args(&self) -> usize {
        self.args.len()
    }

    /// The number of results.
    pub fn num_results(&self) -> usize {
        self.results.len()
    }

    /// Argument `index`.
    pub fn arg(&self, index: usize) -> Result<HostArg<'a>, String> {
        self.args.get(index).copied().ok_or_else(|| {
            format!("host call has {} argument(s), asked for argument {index}", self.args.len())
        })
    }

    /// Result `index`; each result can be taken once.
    pub fn take_result(&mut self, index: usize) -> Result<HostResult<'a>, String> {
        let n = self.results.len();
        let slot = self
            .results
            .get_mut(index)
            .ok_or_else(|| format!("host call has {n} result(s), asked for result {index}"))?;
        let result = slot.take().ok_or_else(|| format!("result {index} was already taken"))?;
        let size = count(result.dims) * result.ty.size_in_bytes().unwrap_or(1);
        let (start, end) = (result.data as usize, result.data as usize + size);
        for (i, a) in self.args.iter().enumerate() {
            let a_size = count(a.dims) * a.ty.size_in_bytes().unwrap_or(1);
            let (a_start, a_end) = (a.data as usize, a.data as usize + a_size);
            if size > 0 && a_size > 0 && start < a_end && a_start < end {
                return Err(format!("result {index} aliases argument {i}"));
            }
        }
        Ok(result)
    }
}

fn ffi_type(t: i32) -> ElementType {
    ElementType::from_xla(i64::from(t))
}

/// Reads the buffers out of a call frame.
///
/// # Safety
/// `frame` must be a call frame XLA passed to a handler, valid for `'a`.
unsafe fn call_from_frame<'a>(frame: &'a sys::XLA_FFI_CallFrame) -> Result<HostCall<'a>, String> {
    let mut args = Vec::new();
    let mut results = Vec::new();
    // SAFETY: XLA's call frame holds `size` typed entries per list, each a `XLA_FFI_Buffer`
    // when its type is BUFFER; they and their dims live for the call.
    unsafe {
        for i in 0..usize::try_from(frame.args.size).unwrap_or(0) {
            if *frame.args.types.add(i) != sys::XLA_FFI_ARG_TYPE_BUFFER {
                return Err(format!("argument {i} is not a buffer"));
            }
            let b = &*(*frame.args.args.add(i)).cast::<sys::XLA_FFI_Buffer>();
            let dims = super::client::raw_slice(b.dims, usize::try_from(b.rank).unwrap_or(0));
            args.push(HostArg { ty: ffi_type(b.dtype), dims, data: b.data.cast() });
        }
        for i in 0..usize::try_from(frame.rets.size).unwrap_or(0) {
            if *frame.rets.types.add(i) != sys::XLA_FFI_ARG_TYPE_BUFFER {
                return Err(format!("result {i} is not a buffer"));
            }
            let b = &*(*frame.rets.rets.add(i)).cast::<sys::XLA_FFI_Buffer>();
            let dims = super::client::raw_slice(b.dims, usize::try_from(b.rank).unwrap_or(0));
            results.push(Some(HostResult { ty: ffi_type(b.dtype), dims, data: b.data.cast() }));
        }
    }
    Ok(HostCall { args, results })
}

/// Makes an `XLA_FFI_Error` carrying `message`.
///
/// # Safety
/// `frame.api` must be XLA's FFI API table for this call.
unsafe fn ffi_error(frame: &sys::XLA_FFI_CallFrame, message: &str) -> *mut sys::XLA_FFI_Error {
    const INTERNAL: i32 = 13;
    let text = super::plugin::c_string(message);
    let mut args = sys::XLA_FFI_Error_Create_Args {
        struct_size: sys::XLA_FFI_Error_Create_Args::STRUCT_SIZE,
        extension_start: std::ptr::null_mut(),
        message: text.as_ptr(),
        errc: INTERNAL,
    };
    // SAFETY: guaranteed by the caller; XLA copies the message during the call.
    unsafe {
        match frame.api.as_ref().and_then(|api| api.XLA_FFI_Error_Create) {
            Some(create) => create(&mut args),
            // No way to report: a null error would mean success, so this cannot happen with a
            // conforming runtime; abort rather than pretend the call worked.
            None => std::process::abort(),
        }
    }
}

/// The C entry point XLA calls for `F`.
extern "C" fn trampoline<F: HostFunction>(
    frame: *mut sys::XLA_FFI_CallFrame,
) -> *mut sys::XLA_FFI_Error {
    // SAFETY: XLA passes a valid call frame for the duration of the call.
    let Some(frame) = (unsafe { frame.as_ref() }) else { return std::ptr::null_mut() };
    // The metadata query at registration: say which FFI version the handler speaks.
    let mut ext = frame.extension_start;
    while !ext.is_null() {
        // SAFETY: the extension chain entries start with `XLA_FFI_InternalExtension`; one of
        // type METADATA is an `XLA_FFI_Metadata_Extension` whose `metadata` XLA owns.
        unsafe {
            if (*ext).type_ == sys::XLA_FFI_EXTENSION_METADATA {
                let meta = (*ext.cast::<sys::XLA_FFI_Metadata_Extension>()).metadata;
                if let Some(meta) = meta.as_mut() {
                    meta.api_version = sys::XLA_FFI_Api_Version {
                        struct_size: sys::XLA_FFI_Api_Version::STRUCT_SIZE,
                        extension_start: std::ptr::null_mut(),
                        major_version: 0,
                        minor_version: 1,
                    };
                    meta.traits = 0;
                }
                return std::ptr::null_mut();
            }
            ext = (*ext).next;
        }
    }
    if frame.stage != sys::XLA_FFI_STAGE_EXECUTE {
        return std::ptr::null_mut();
    }
    // SAFETY: `frame` is the live call frame of this call.
    let outcome = match unsafe { call_from_frame(frame) } {
        Ok(mut call) => catch_unwind(AssertUnwindSafe(|| F::call(&mut call)))
            .unwrap_or_else(|_| Err("host function panicked".to_owned())),
        Err(e) => Err(e),
    };
    match outcome {
        Ok(()) => std::ptr::null_mut(),
        // SAFETY: `frame.api` is the FFI table of this call.
        Err(message) => unsafe { ffi_error(frame, &message) },
    }
}

fn registered() -> &'static Mutex<HashMap<(std::path::PathBuf, String), TypeId>> {
    static REGISTERED: OnceLock<Mutex<HashMap<(std::path::PathBuf, String), TypeId>>> =
        OnceLock::new();
    REGISTERED.get_or_init(Mutex::default)
}

/// Registers `F` as the host (`"Host"` platform) handler of custom call target `name` in
/// `plugin`, through the PJRT FFI extension. Registering the same function under the same name
/// again is a no-op; another function under a taken name is an error.
pub fn register_host_function<F: HostFunction>(plugin: &Plugin, name: &str) -> Result<()> {
    let fail = |message: String| Error::FfiRegistration { name: name.to_owned(), message };
    let key = (plugin.path().to_path_buf(), name.to_owned());
    let mut map = registered().lock().unwrap_or_else(|e| e.into_inner());
    match map.get(&key) {
        Some(t) if *t == TypeId::of::<F>() => return Ok(()),
        Some(_) => return Err(fail("another function is registered under this name".to_owned())),
        None => {}
    }
    let (_, minor) = plugin.attributes().api_version();
    if minor < sys::MIN_FFI_API_MINOR {
        return Err(fail(format!(
            "host custom calls need a plugin of PJRT C API 0.{} or later, this one is 0.{minor}",
            sys::MIN_FFI_API_MINOR
        )));
    }
    let ext = plugin.inner.ffi.ok_or_else(|| fail("the plugin has no FFI extension".to_owned()))?;
    let register = ext.register_handler.ok_or_else(|| fail("no register_handler".to_owned()))?;
    const PLATFORM: &str = "Host";
    let mut args = sys::PJRT_FFI_Register_Handler_Args {
        struct_size: sys::PJRT_FFI_Register_Handler_Args::STRUCT_SIZE,
        target_name: name.as_ptr().cast(),
        target_name_size: name.len(),
        handler: trampoline::<F> as *mut c_void,
        platform_name: PLATFORM.as_ptr().cast(),
        platform_name_size: PLATFORM.len(),
        traits: 0,
    };
    // SAFETY: the strings outlive the call (XLA copies them); the handler is a `'static`
    // function with the XLA FFI handler signature.
    let err = unsafe { register(&mut args) };
    plugin.inner.check("PJRT_FFI_Register_Handler", err).map_err(|e| fail(e.to_string()))?;
    map.insert(key, TypeId::of::<F>());
    Ok(())
}
