//! Device buffers, element types, and page-aligned host memory for zero-copy uploads.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use super::client::{Client, ClientInner, Device, raw_slice};
use super::error::{Error, Result};
use super::event::Event;
use super::plugin::pjrt_call;
use super::sys;

/// The element type of a buffer or executable parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ElementType {
    /// Boolean (`i1`), one byte per element.
    Pred,
    /// `i8`.
    S8,
    /// `i16`.
    S16,
    /// `i32`.
    S32,
    /// `i64`.
    S64,
    /// `ui8`.
    U8,
    /// `ui16`.
    U16,
    /// `ui32`.
    U32,
    /// `ui64`.
    U64,
    /// IEEE half precision.
    F16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// bfloat16.
    BF16,
    /// A type this layer does not handle (complex, fp8, int4, ...): the PJRT buffer type number.
    Other(i32),
}

impl ElementType {
    pub(crate) fn from_pjrt(t: i32) -> Self {
        match t {
            sys::BUFFER_TYPE_PRED => Self::Pred,
            sys::BUFFER_TYPE_S8 => Self::S8,
            sys::BUFFER_TYPE_S16 => Self::S16,
            sys::BUFFER_TYPE_S32 => Self::S32,
            sys::BUFFER_TYPE_S64 => Self::S64,
            sys::BUFFER_TYPE_U8 => Self::U8,
            sys::BUFFER_TYPE_U16 => Self::U16,
            sys::BUFFER_TYPE_U32 => Self::U32,
            sys::BUFFER_TYPE_U64 => Self::U64,
            sys::BUFFER_TYPE_F16 => Self::F16,
            sys::BUFFER_TYPE_F32 => Self::F32,
            sys::BUFFER_TYPE_F64 => Self::F64,
            sys::BUFFER_TYPE_BF16 => Self::BF16,
            other => Self::Other(other),
        }
    }

    pub(crate) fn to_pjrt(self) -> i32 {
        match self {
            Self::Pred => sys::BUFFER_TYPE_PRED,
            Self::S8 => sys::BUFFER_TYPE_S8,
            Self::S16 => sys::BUFFER_TYPE_S16,
            Self::S32 => sys::BUFFER_TYPE_S32,
            Self::S64 => sys::BUFFER_TYPE_S64,
            Self::U8 => sys::BUFFER_TYPE_U8,
            Self::U16 => sys::BUFFER_TYPE_U16,
            Self::U32 => sys::BUFFER_TYPE_U32,
            Self::U64 => sys::BUFFER_TYPE_U64,
            Self::F16 => sys::BUFFER_TYPE_F16,
            Self::F32 => sys::BUFFER_TYPE_F32,
            Self::F64 => sys::BUFFER_TYPE_F64,
            Self::BF16 => sys::BUFFER_TYPE_BF16,
            Self::Other(t) => t,
        }
    }

    /// From XLA's `PrimitiveType` numbering (HLO protos, FFI buffers).
    pub(crate) fn from_xla(t: i64) -> Self {
        match t {
            1 => Self::Pred,
            2 => Self::S8,
            3 => Self::S16,
            4 => Self::S32,
            5 => Self::S64,
            6 => Self::U8,
            7 => Self::U16,
            8 => Self::U32,
            9 => Self::U64,
            10 => Self::F16,
            11 => Self::F32,
            12 => Self::F64,
            16 => Self::BF16,
            other => Self::Other(1000 + other as i32),
        }
    }

    /// Bytes per element (`None` for types this layer does not handle).
    pub fn size_in_bytes(self) -> Option<usize> {
        Some(match self {
            Self::Pred | Self::S8 | Self::U8 => 1,
            Self::S16 | Self::U16 | Self::F16 | Self::BF16 => 2,
            Self::S32 | Self::U32 | Self::F32 => 4,
            Self::S64 | Self::U64 | Self::F64 => 8,
            Self::Other(_) => return None,
        })
    }
}

impl fmt::Display for ElementType {
    /// The MLIR spelling (`f32`, `bf16`, `i1`, `ui8`, ...).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::Pred => "i1",
            Self::S8 => "i8",
            Self::S16 => "i16",
            Self::S32 => "i32",
            Self::S64 => "i64",
            Self::U8 => "ui8",
            Self::U16 => "ui16",
            Self::U32 => "ui32",
            Self::U64 => "ui64",
            Self::F16 => "f16",
            Self::F32 => "f32",
            Self::F64 => "f64",
            Self::BF16 => "bf16",
            Self::Other(t) => return write!(f, "unsupported type #{t}"),
        };
        f.write_str(s)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is the host representation of an [`ElementType`]: `f32`, `f64`,
/// [`half::bf16`], [`half::f16`], `i8`..`i64`, `u8`..`u64`, `bool`. Sealed.
pub trait NativeType: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The matching element type.
    const TYPE: ElementType;
    /// Whether every bit pattern is a valid value (false only for `bool`).
    #[doc(hidden)]
    const ANY_BIT_PATTERN: bool = true;
    #[doc(hidden)]
    fn from_byte(b: u8) -> Self;
}

macro_rules! native {
    ($($t:ty => $e:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl NativeType for $t {
            const TYPE: ElementType = ElementType::$e;
            fn from_byte(_: u8) -> Self { unreachable!("only bool is converted byte by byte") }
        }
    )*};
}
native!(f32 => F32, f64 => F64, half::bf16 => BF16, half::f16 => F16, i8 => S8, i16 => S16,
    i32 => S32, i64 => S64, u8 => U8, u16 => U16, u32 => U32, u64 => U64);

impl sealed::Sealed for bool {}
impl NativeType for bool {
    const TYPE: ElementType = ElementType::Pred;
    const ANY_BIT_PATTERN: bool = false;
    fn from_byte(b: u8) -> Self {
        b != 0
    }
}

fn as_bytes<T: NativeType>(data: &[T]) -> &[u8] {
    // SAFETY: every `NativeType` is plain data without padding; any initialized value may be
    // viewed as bytes (bool included).
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

const PAGE: usize = 4096;

/// Host memory lent to the runtime by [`Client::lend_host_memory`]: [`HostLoan::wait`] returns
/// once the runtime no longer uses it (every buffer aliasing it is gone).
#[derive(Debug)]
pub struct HostLoan {
    done: Event,
}

impl HostLoan {
    /// Blocks until the runtime is done with the memory.
    pub fn wait(self) -> Result<()> {
        self.done.wait("PJRT_Event_Await (done with lent host memory)")
    }
}

/// Page-aligned, zero-initialized host memory for `len` values of `T`.
///
/// Moved into [`Client::buffer_from_aligned`], it becomes the buffer's storage on the CPU
/// plugin without a copy (`kImmutableZeroCopy`), and is freed only after PJRT is done with it.
pub struct AlignedHostBuffer<T: NativeType> {
    ptr: NonNull<T>,
    len: usize,
    layout: Layout,
}

// SAFETY: the allocation is owned uniquely, like a `Vec<T>` with `T: Send + Sync`.
unsafe impl<T: NativeType> Send for AlignedHostBuffer<T> {}
// SAFETY: as above.
unsafe impl<T: NativeType> Sync for AlignedHostBuffer<T> {}

impl<T: NativeType> AlignedHostBuffer<T> {
    /// Allocates `len` zeroed elements, aligned to a 4 KiB page (the size is rounded up to
    /// whole pages).
    ///
    /// A size that does not fit the address space (`len` times the element size, rounded up to
    /// a page, past `isize::MAX` bytes), and an allocation the allocator refuses, are
    /// [`Error::HostData`] naming the element count and size; nothing panics or aborts.
    pub fn zeroed(len: usize) -> Result<Self> {
        let elem = std::mem::size_of::<T>();
        let unit = if elem == 1 { "byte" } else { "bytes" };
        let too_large = |why: &str| Error::HostData {
            message: format!(
                "cannot allocate an aligned host buffer of {len} {} elements ({elem} {unit} each): {why}",
                T::TYPE
            ),
        };
        let bytes = len
            .max(1)
            .checked_mul(elem)
            .and_then(|b| b.checked_next_multiple_of(PAGE))
            .ok_or_else(|| too_large("the size overflows usize"))?;
        let layout = Layout::from_size_align(bytes, PAGE)
            .map_err(|_| too_large(&format!("{bytes} bytes is more than isize::MAX")))?;
        // SAFETY: `layout` has a non-zero size (at least one page).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw.cast::<T>())
            .ok_or_else(|| too_large(&format!("the allocator refused {bytes} bytes")))?;
        Ok(Self { ptr, len, layout })
    }

    /// Copies `data` into a new aligned allocation.
    pub fn from_slice(data: &[T]) -> Result<Self> {
        let mut buf = Self::zeroed(data.len())?;
        buf.copy_from_slice(data);
        Ok(buf)
    }
}

impl<T: NativeType> std::ops::Deref for AlignedHostBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` zero-initialized or written values of `T` (all-zero is a
        // valid value of every `NativeType`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: NativeType> std::ops::DerefMut for AlignedHostBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: NativeType> Drop for AlignedHostBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast::<u8>(), self.layout) };
    }
}

impl<T: NativeType> fmt::Debug for AlignedHostBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedHostBuffer").field("type", &T::TYPE).field("len", &self.len).finish()
    }
}

/// The on-delete callback of a host-memory view: its memory belongs to the caller.
unsafe extern "C" fn view_released(_data: *mut std::ffi::c_void, _arg: *mut std::ffi::c_void) {}

/// The alignment `Client::view_of_host_bytes` asks of host data: the CPU plugin refuses views
/// of data less aligned (`is not aligned to 64 bytes`). PyTorch's and NumPy's allocators give
/// 64 bytes; a view into the middle of a tensor may be less aligned (and is copied).
pub const VIEW_ALIGNMENT: usize = 64;

/// Host memory a zero-copy buffer aliases, and the event saying PJRT is done with it.
struct HostBacking {
    done: Event,
    _memory: Box<dyn Send + Sync>,
}

/// An array on a device. `Send + Sync`; dropping it calls `PJRT_Buffer_Destroy`.
pub struct Buffer {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut sys::PJRT_Buffer,
    ty: ElementType,
    dims: Box<[i64]>,
    /// Set when the buffer's contents are known to be computed (an awaited execution).
    ready: bool,
    host: Option<HostBacking>,
}

// SAFETY: PJRT buffers are thread-safe by the C API contract; the Rust-side metadata is
// immutable, and the host backing (if any) is `Send + Sync`.
unsafe impl Send for Buffer {}
// SAFETY: as above; `&Buffer` methods only read.
unsafe impl Sync for Buffer {}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("type", &self.ty)
            .field("dims", &self.dims)
            .field("zero_copy", &self.host.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Buffer_Destroy_Args::new();
        args.buffer = self.raw;
        // SAFETY: `raw` is the live buffer owned by `self`, destroyed exactly once.
        let result = unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_Destroy, &mut args) };
        self.client.plugin.log_drop_error(result);
        if let Some(host) = self.host.take() {
            // The runtime signals when it no longer reads the host memory (after the buffer and
            // every pending use of it are gone); only then may the memory be freed.
            let result = host.done.wait("PJRT_Event_Await (done with host buffer)");
            self.client.plugin.log_drop_error(result);
            drop(host);
        }
    }
}

fn element_count(dims: &[i64]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
}

impl Client {
    /// Copies `data` (row-major, shape `dims`) to the first device.
    pub fn buffer_from_host<T: NativeType>(&self, data: &[T], dims: &[i64]) -> Result<Buffer> {
        let device = self.first_device()?;
        self.buffer_from_host_on(data, dims, device)
    }

    /// Copies `data` (row-major, shape `dims`) to `device`. The host memory is only read during
    /// the call.
    pub fn buffer_from_host_on<T: NativeType>(
        &self,
        data: &[T],
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        check_len(data.len(), dims)?;
        // SAFETY: `data` is valid for the call, and PJRT only reads it during the call
        // (`kImmutableOnlyDuringCall`).
        let (buffer, _done) = unsafe {
            self.upload(
                as_bytes(data).as_ptr(),
                T::TYPE,
                dims,
                device,
                sys::HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL,
            )
        }?;
        Ok(buffer)
    }

    /// Makes a buffer on the first device whose storage is `host` itself when the plugin can
    /// alias host memory (the CPU plugin does for page-aligned memory): no copy. The memory is
    /// owned by the buffer and freed after PJRT is done with it.
    pub fn buffer_from_aligned<T: NativeType>(
        &self,
        host: AlignedHostBuffer<T>,
        dims: &[i64],
    ) -> Result<Buffer> {
        check_len(host.len(), dims)?;
        let device = self.first_device()?;
        // SAFETY: the memory is moved into the returned buffer below and freed only after the
        // done-with-host-buffer event fires (see `Buffer::drop`), so it outlives every use PJRT
        // makes of it; nothing else can reach it to mutate it.
        let (mut buffer, done) = unsafe {
            self.upload(
                as_bytes(&host).as_ptr(),
                T::TYPE,
                dims,
                device,
                sys::HOST_BUFFER_IMMUTABLE_ZERO_COPY,
            )
        }?;
        buffer.host = Some(HostBacking { done, _memory: Box::new(host) });
        Ok(buffer)
    }

    /// Copies row-major `bytes` of element type `ty` and shape `dims` to the first device: the
    /// untyped form of [`buffer_from_host`](Self::buffer_from_host), for callers that learn the
    /// dtype at runtime (the dispatcher, DLPack tensors). The length must match exactly.
    pub fn buffer_from_bytes(&self, bytes: &[u8], ty: ElementType, dims: &[i64]) -> Result<Buffer> {
        self.buffer_from_bytes_on(bytes, ty, dims, self.first_device()?)
    }

    /// [`buffer_from_bytes`](Self::buffer_from_bytes) onto `device` (one shard of a sharded
    /// program's input).
    pub fn buffer_from_bytes_on(
        &self,
        bytes: &[u8],
        ty: ElementType,
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        let Some(size) = ty.size_in_bytes() else {
            return Err(Error::HostData {
                message: format!("cannot upload elements of type {ty}"),
            });
        };
        let Some(count) = element_count(dims) else {
            return Err(Error::HostData { message: format!("invalid shape {dims:?}") });
        };
        if count.checked_mul(size) != Some(bytes.len()) {
            return Err(Error::HostData {
                message: format!(
                    "shape {dims:?} of {ty} needs {} bytes, the host data has {}",
                    count.saturating_mul(size),
                    bytes.len()
                ),
            });
        }
        // SAFETY: `bytes` holds exactly the buffer's bytes (checked above) and stays valid for
        // the call; PJRT only reads it during the call (`kImmutableOnlyDuringCall`).
        let (buffer, _done) = unsafe {
            self.upload(
                bytes.as_ptr(),
                ty,
                dims,
                device,
                sys::HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL,
            )
        }?;
        Ok(buffer)
    }

    /// Host memory the caller lends for writing, as a buffer to donate to an execution
    /// ([`Input::Donated`](super::Input::Donated)): an output the program aliases to it
    /// (`tf.aliasing_output`) is written into this memory, in place (the CPU plugin's
    /// `kMutableZeroCopy`). `Ok(None)` when the plugin cannot alias it (another platform,
    /// unaligned or empty memory): run on a copy and write the result back instead. Wait for
    /// the returned [`HostLoan`] after dropping every buffer of the execution that aliases the
    /// memory; only then is the runtime done with it.
    ///
    /// An output that is not at `data` after the run was not aliased (the plugin may copy a
    /// donation it cannot honour): write it back.
    ///
    /// # Safety
    /// `data` points to `len` bytes that stay valid until the loan is waited for, and that
    /// nothing else reads or writes meanwhile except through the execution.
    pub unsafe fn lend_host_memory(
        &self,
        data: *mut u8,
        len: usize,
        ty: ElementType,
        dims: &[i64],
    ) -> Result<Option<(Buffer, HostLoan)>> {
        let size = ty.size_in_bytes().ok_or_else(|| Error::HostData {
            message: format!("cannot lend elements of type {ty}"),
        })?;
        let Some(needed) = element_count(dims).and_then(|n| n.checked_mul(size)) else {
            return Err(Error::HostData { message: format!("invalid shape {dims:?}") });
        };
        if needed != len {
            return Err(Error::HostData {
                message: format!(
                    "shape {dims:?} of {ty} needs {needed} bytes, the memory has {len}"
                ),
            });
        }
        if self.platform() != "cpu" || len == 0 || !(data as usize).is_multiple_of(VIEW_ALIGNMENT) {
            return Ok(None);
        }
        let device = self.first_device()?;
        // SAFETY: the caller keeps `len` bytes at `data` valid and otherwise untouched until the
        // loan is waited for, as `kMutableZeroCopy` requires.
        let (buffer, done) =
            unsafe { self.upload(data, ty, dims, device, sys::HOST_BUFFER_MUTABLE_ZERO_COPY) }?;
        Ok(Some((buffer, HostLoan { done })))
    }

    /// A buffer that reads `bytes` where they are, without a copy, when the plugin can alias
    /// them: a client whose devices address host memory (the CPU plugin), and data aligned to
    /// [`VIEW_ALIGNMENT`] bytes. `Ok(None)` when it cannot (another platform, unaligned or empty
    /// data): upload a copy instead.
    ///
    /// # Safety
    /// `bytes` must stay valid, and unmodified, until the returned buffer is dropped, and the
    /// buffer must not be donated to an execution (which would write into them).
    pub(crate) unsafe fn view_of_host_bytes(
        &self,
        bytes: &[u8],
        ty: ElementType,
        dims: &[i64],
    ) -> Result<Option<Buffer>> {
        let size = ty.size_in_bytes().ok_or_else(|| Error::HostData {
            message: format!("cannot view elements of type {ty}"),
        })?;
        let Some(needed) = element_count(dims).and_then(|n| n.checked_mul(size)) else {
            return Err(Error::HostData { message: format!("invalid shape {dims:?}") });
        };
        if needed != bytes.len() {
            return Err(Error::HostData {
                message: format!(
                    "shape {dims:?} of {ty} needs {needed} bytes, the host data has {}",
                    bytes.len()
                ),
            });
        }
        let plugin = &self.inner.plugin;
        if self.platform() != "cpu"
            || bytes.is_empty()
            || !(bytes.as_ptr() as usize).is_multiple_of(VIEW_ALIGNMENT)
            || plugin.api.PJRT_Client_CreateViewOfDeviceBuffer.is_none()
        {
            return Ok(None);
        }
        let device = self.first_device()?;
        let mut args = sys::PJRT_Client_CreateViewOfDeviceBuffer_Args::new();
        args.client = self.inner.raw;
        args.device_buffer_ptr = bytes.as_ptr().cast_mut().cast();
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.element_type = ty.to_pjrt();
        args.device = device.raw;
        // The plugin calls the callback unconditionally when the view goes (a null one aborts
        // the process); the caller owns the memory, so there is nothing to do then.
        args.on_delete_callback = Some(view_released);
        // SAFETY: the client and device are live, `dims` is valid for the call, and the caller
        // keeps `bytes` valid and unwritten for the life of the returned buffer.
        unsafe { pjrt_call!(plugin, PJRT_Client_CreateViewOfDeviceBuffer, &mut args) }?;
        Ok(Some(Buffer {
            client: self.inner.clone(),
            raw: args.buffer,
            ty,
            dims: dims.into(),
            ready: true,
            host: None,
        }))
    }

    fn first_device(&self) -> Result<&Device> {
        self.devices().first().ok_or_else(|| Error::HostData {
            message: format!("the {} client has no addressable device", self.platform()),
        })
    }

    /// # Safety
    /// `data` must point to the buffer's bytes and stay valid as `semantics` requires.
    unsafe fn upload(
        &self,
        data: *const u8,
        ty: ElementType,
        dims: &[i64],
        device: &Device,
        semantics: i32,
    ) -> Result<(Buffer, Event)> {
        if self.device_by_raw(device.raw).is_none() {
            return Err(Error::HostData {
                message: format!("device {} does not belong to this client", device.id()),
            });
        }
        let mut args = sys::PJRT_Client_BufferFromHostBuffer_Args::new();
        args.client = self.inner.raw;
        args.data = data.cast();
        args.type_ = ty.to_pjrt();
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics = semantics;
        args.device = device.raw;
        // SAFETY: the client and device are live; `dims` is valid for the call; the caller
        // guarantees `data`.
        unsafe { pjrt_call!(self.inner.plugin, PJRT_Client_BufferFromHostBuffer, &mut args) }?;
        let done = Event::from_raw(self.inner.plugin.clone(), args.done_with_host_buffer);
        let buffer = Buffer {
            client: self.inner.clone(),
            raw: args.buffer,
            ty,
            dims: dims.into(),
            ready: false,
            host: None,
        };
        Ok((buffer, done))
    }
}

fn check_len(len: usize, dims: &[i64]) -> Result<()> {
    match element_count(dims) {
        Some(n) if n == len => Ok(()),
        Some(n) => Err(Error::HostData {
            message: format!("shape {dims:?} holds {n} elements, the host data has {len}"),
        }),
        None => Err(Error::HostData { message: format!("invalid shape {dims:?}") }),
    }
}

impl Buffer {
    /// Wraps a buffer returned by PJRT (an execution output), reading its type and shape.
    pub(crate) fn from_output(
        client: &Arc<ClientInner>,
        raw: *mut sys::PJRT_Buffer,
        ready: bool,
    ) -> Result<Buffer> {
        // Owned from here on, so an error below still destroys it.
        let mut buffer = Buffer {
            client: client.clone(),
            raw,
            ty: ElementType::Other(0),
            dims: Box::new([]),
            ready,
            host: None,
        };
        let mut ty = sys::PJRT_Buffer_ElementType_Args::new();
        ty.buffer = raw;
        // SAFETY: `raw` is a live buffer just returned by PJRT.
        unsafe { pjrt_call!(client.plugin, PJRT_Buffer_ElementType, &mut ty) }?;
        buffer.ty = ElementType::from_pjrt(ty.type_);
        let mut dims = sys::PJRT_Buffer_Dimensions_Args::new();
        dims.buffer = raw;
        // SAFETY: as above; the dims array lives as long as the buffer and is copied.
        buffer.dims = unsafe {
            pjrt_call!(client.plugin, PJRT_Buffer_Dimensions, &mut dims)?;
            raw_slice(dims.dims, dims.num_dims).into()
        };
        Ok(buffer)
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.ty
    }

    /// The shape.
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }

    /// The number of elements.
    pub fn element_count(&self) -> usize {
        element_count(&self.dims).unwrap_or(0)
    }

    /// The size of the dense row-major host representation in bytes.
    pub fn byte_size(&self) -> usize {
        self.element_count() * self.ty.size_in_bytes().unwrap_or(0)
    }

    /// Makes this buffer, an execution's output written into memory lent to it
    /// ([`Client::lend_host_memory`]), the owner of that memory: `owner` is dropped once the
    /// buffer is and the runtime is done with the memory (`loan`'s event). An error when the
    /// buffer already owns host memory.
    pub fn keep_lent_memory(&mut self, loan: HostLoan, owner: Box<dyn Send + Sync>) -> Result<()> {
        if self.host.is_some() {
            return Err(Error::HostData {
                message: "the buffer already owns host memory".to_owned(),
            });
        }
        self.host = Some(HostBacking { done: loan.done, _memory: owner });
        Ok(())
    }

    /// Whether the buffer's memory is host memory it owns (uploaded without a copy, or lent
    /// to the execution that wrote it and kept: [`Buffer::keep_lent_memory`]).
    pub fn is_zero_copy(&self) -> bool {
        self.host.is_some()
    }

    /// Blocks until the buffer's contents are computed (or failed).
    pub fn wait_ready(&self) -> Result<()> {
        if self.ready {
            return Ok(());
        }
        let mut args = sys::PJRT_Buffer_ReadyEvent_Args::new();
        args.buffer = self.raw;
        // SAFETY: `raw` is the live buffer owned by `self`.
        unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_ReadyEvent, &mut args) }?;
        Event::from_raw(self.client.plugin.clone(), args.event).wait("PJRT_Buffer_ReadyEvent")
    }

    fn check_type<T: NativeType>(&self, len: usize) -> Result<()> {
        if T::TYPE != self.ty {
            return Err(Error::HostData {
                message: format!("buffer holds {}, the host side is {}", self.ty, T::TYPE),
            });
        }
        if len != self.element_count() {
            return Err(Error::HostData {
                message: format!(
                    "buffer of shape {:?} holds {} elements, the host side has room for {len}",
                    self.dims,
                    self.element_count()
                ),
            });
        }
        Ok(())
    }

    /// Copies the buffer into `dst` (row-major). `T` must match the element type and `dst` the
    /// element count. On a plugin whose buffers live in host memory (the CPU plugin) this is a
    /// plain copy of the bytes in place; elsewhere a PJRT transfer
    /// (`PJRT_Buffer_ToHostBuffer` + event await).
    pub fn to_host<T: NativeType>(&self, dst: &mut [T]) -> Result<()> {
        self.check_type::<T>(dst.len())?;
        match self.host_bytes() {
            Ok((ptr, len)) => {
                // SAFETY: as in `read_in_place`: `len` readable bytes for the borrow of `self`.
                let src = unsafe { std::slice::from_raw_parts(ptr, len) };
                write_host(src, dst);
                Ok(())
            }
            Err(Error::NotReadableInPlace { .. }) => self.to_host_via_transfer(dst),
            Err(e) => Err(e),
        }
    }

    /// Like [`to_host`](Self::to_host), but always through a PJRT transfer
    /// (`PJRT_Buffer_ToHostBuffer` + event await), even when the bytes could be read in place.
    pub fn to_host_via_transfer<T: NativeType>(&self, dst: &mut [T]) -> Result<()> {
        self.check_type::<T>(dst.len())?;
        let mut bytes;
        let (ptr, size) = if T::ANY_BIT_PATTERN {
            (dst.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(dst))
        } else {
            bytes = vec![0u8; std::mem::size_of_val(dst)];
            (bytes.as_mut_ptr(), bytes.len())
        };
        // SAFETY: `ptr` is exclusively borrowed (`dst`) or owned (`bytes`) memory of exactly the
        // buffer's byte size, alive until `copy_raw` returns; for `T` with any bit pattern
        // valid, the bytes PJRT writes are valid values.
        unsafe { self.copy_raw(ptr, size) }?;
        if !T::ANY_BIT_PATTERN {
            // SAFETY: `ptr` points into `bytes`, filled above.
            let src = unsafe { std::slice::from_raw_parts(ptr, size) };
            write_host(src, dst);
        }
        Ok(())
    }

    /// Copies the buffer into a new `Vec`.
    pub fn to_vec<T: NativeType>(&self) -> Result<Vec<T>> {
        self.check_type::<T>(self.element_count())?;
        let mut out = vec![T::from_zero(); self.element_count()];
        self.to_host(&mut out)?;
        Ok(out)
    }

    /// # Safety
    /// `dst` must be valid for writes of `size` bytes until this returns.
    unsafe fn copy_raw(&self, dst: *mut u8, size: usize) -> Result<()> {
        let mut args = sys::PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = self.raw;
        args.dst = dst.cast();
        args.dst_size = size;
        // SAFETY: `raw` is live; the caller guarantees `dst`; the event is awaited below before
        // `dst` may be released.
        unsafe { pjrt_call!(self.client.plugin, PJRT_Buffer_ToHostBuffer, &mut args) }?;
        Event::from_raw(self.client.plugin.clone(), args.event).wait("PJRT_Buffer_ToHostBuffer")
    }

    /// Calls `f` with the buffer's bytes read where they are (no copy), on a plugin whose device
    /// memory is host memory (the CPU plugin), through `PJRT_Buffer_UnsafePointer`. Waits for
    /// the contents first when they may still be in flight.
    pub fn read_in_place<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let (ptr, len) = self.host_bytes()?;
        // SAFETY: `host_bytes` checked that the buffer is in host memory, dense, ready, and
        // `len` bytes long. The bytes stay alive and unmodified while `&self` is borrowed: the
        // buffer can only be donated (the one way an execution writes it) by value.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        Ok(f(bytes))
    }

    /// Like [`read_in_place`](Self::read_in_place), typed. `T` must match the element type
    /// (`bool` buffers are read with [`read_in_place`](Self::read_in_place)).
    pub fn read_in_place_as<T: NativeType, R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        self.check_type::<T>(self.element_count())?;
        if !T::ANY_BIT_PATTERN {
            return Err(Error::NotReadableInPlace {
                reason: format!("{} values are read as bytes (read_in_place)", T::TYPE),
            });
        }
        let (ptr, len) = self.host_bytes()?;
        if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(Error::NotReadableInPlace {
                reason: format!("device memory is not aligned for {}", T::TYPE),
            });
        }
        // SAFETY: as in `read_in_place`; additionally the pointer is aligned for `T`, the length
        // is a whole number of `T` (type and count checked), and any bit pattern is a valid `T`.
        let values =
            unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), len / std::mem::size_of::<T>()) };
        Ok(f(values))
    }

    fn host_bytes(&self) -> Result<(*const u8, usize)> {
        let plugin = &self.client.plugin;
        let mut cpu = sys::PJRT_Buffer_IsOnCpu_Args::new();
        cpu.buffer = self.raw;
        // SAFETY: `raw` is the live buffer owned by `self`.
        unsafe { pjrt_call!(plugin, PJRT_Buffer_IsOnCpu, &mut cpu) }?;
        if !cpu.is_on_cpu {
            return Err(Error::NotReadableInPlace {
                reason: format!(
                    "it lives on a {} device, not in host memory",
                    self.client.platform
                ),
            });
        }
        self.wait_ready()?;
        let expected = self.byte_size();
        let mut size = sys::PJRT_Buffer_OnDeviceSizeInBytes_Args::new();
        size.buffer = self.raw;
        // SAFETY: as above.
        unsafe { pjrt_call!(plugin, PJRT_Buffer_OnDeviceSizeInBytes, &mut size) }?;
        if size.on_device_size_in_bytes != expected || self.ty.size_in_bytes().is_none() {
            return Err(Error::NotReadableInPlace {
                reason: format!(
                    "its device layout is not dense row-major ({} bytes on device, {expected} expected)",
                    size.on_device_size_in_bytes
                ),
            });
        }
        let mut ptr = sys::PJRT_Buffer_UnsafePointer_Args::new();
        ptr.buffer = self.raw;
        // SAFETY: as above.
        unsafe { pjrt_call!(plugin, PJRT_Buffer_UnsafePointer, &mut ptr) }?;
        if ptr.buffer_pointer == 0 && expected != 0 {
            return Err(Error::NotReadableInPlace { reason: "it has no storage".to_owned() });
        }
        Ok((ptr.buffer_pointer as *const u8, expected))
    }

    pub(crate) fn mark_ready(&mut self) {
        self.ready = true;
    }

    /// Whether `self` belongs to the client `client`.
    pub(crate) fn same_client(&self, client: &Arc<ClientInner>) -> bool {
        Arc::ptr_eq(&self.client, client)
    }
}

/// Copies dense host bytes into typed values (bytes per value match: checked by the caller).
fn write_host<T: NativeType>(src: &[u8], dst: &mut [T]) {
    if T::ANY_BIT_PATTERN {
        // SAFETY: `dst` is exclusively borrowed and exactly `src.len()` bytes long, and any bit
        // pattern is a valid `T`.
        let out = unsafe {
            std::slice::from_raw_parts_mut(
                dst.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(dst),
            )
        };
        out.copy_from_slice(src);
    } else {
        for (d, &b) in dst.iter_mut().zip(src) {
            *d = T::from_byte(b);
        }
    }
}

trait Zero {
    fn from_zero() -> Self;
}
impl<T: NativeType> Zero for T {
    fn from_zero() -> Self {
        // SAFETY: all-zero bytes are a valid value of every `NativeType` (0, 0.0, false).
        unsafe { std::mem::zeroed() }
    }
}
