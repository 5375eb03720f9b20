//! Tensors across the Python boundary, both ways through DLPack, without copies.
//!
//! In: any object with `__dlpack__` (a torch tensor, a numpy array) is imported with dlpark
//! (torch 2.15 answers through its C exchange API); the bridge borrows the producer's memory for
//! the duration of a call. Out: an output PJRT buffer is wrapped in a [`DeviceTensor`] that
//! implements `__dlpack__`, so `torch.from_dlpack` / `numpy.from_dlpack` alias the PJRT buffer's
//! host memory; the buffer lives as long as any consumer.

use std::sync::Arc;

use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLManagedTensor, DLManagedTensorVersioned,
};
use dlpark::metadata::Dynamic;
use dlpark::python::{DlpackExporter, ExportRequest, ImportedDlpack, export_dlpack, from_dlpack};
use dlpark::{DlpackFlags, Managed};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use tpu_kernels::{DType, Shape, TensorType};
use tpu_kernels_registry::HostTensor;
use tpu_kernels_registry::dispatch::dtype_of;
use tpu_kernels_registry::pjrt::Buffer;

/// The dtype of a DLPack element type (`None` for those the kernels do not take).
pub fn dtype_of_dlpack(dt: DLDataType) -> Option<DType> {
    if dt.lanes != 1 {
        return None;
    }
    Some(match (dt.code, dt.bits) {
        (DLDataTypeCode::FLOAT, 32) => DType::F32,
        (DLDataTypeCode::FLOAT, 64) => DType::F64,
        (DLDataTypeCode::FLOAT, 16) => DType::F16,
        (DLDataTypeCode::BFLOAT, 16) => DType::BF16,
        (DLDataTypeCode::INT, 8) => DType::I8,
        (DLDataTypeCode::INT, 16) => DType::I16,
        (DLDataTypeCode::INT, 32) => DType::I32,
        (DLDataTypeCode::INT, 64) => DType::I64,
        (DLDataTypeCode::UINT, 8) => DType::U8,
        (DLDataTypeCode::UINT, 32) => DType::U32,
        (DLDataTypeCode::BOOL, 8) => DType::Bool,
        _ => return None,
    })
}

/// The DLPack element type of a dtype.
pub fn dlpack_of_dtype(dtype: DType) -> Option<DLDataType> {
    let (code, bits) = match dtype {
        DType::F32 => (DLDataTypeCode::FLOAT, 32),
        DType::F64 => (DLDataTypeCode::FLOAT, 64),
        DType::F16 => (DLDataTypeCode::FLOAT, 16),
        DType::BF16 => (DLDataTypeCode::BFLOAT, 16),
        DType::I8 => (DLDataTypeCode::INT, 8),
        DType::I16 => (DLDataTypeCode::INT, 16),
        DType::I32 => (DLDataTypeCode::INT, 32),
        DType::I64 => (DLDataTypeCode::INT, 64),
        DType::U8 => (DLDataTypeCode::UINT, 8),
        DType::U32 => (DLDataTypeCode::UINT, 32),
        DType::Bool => (DLDataTypeCode::BOOL, 8),
        _ => return None,
    };
    Some(DLDataType::scalar(code, bits))
}

/// A Python tensor imported through DLPack: its type, and its bytes borrowed in place.
pub struct Imported {
    pub ty: TensorType,
    pub contiguous: bool,
    /// Keeps the producer's memory alive (its deleter runs on drop).
    dlpack: ImportedDlpack,
}

impl Imported {
    /// Imports `obj` (anything with `__dlpack__` on the CPU). Input `index` names it in errors.
    pub fn new(obj: &Bound<'_, PyAny>, index: usize) -> PyResult<Imported> {
        let dlpack = from_dlpack(obj.as_borrowed(), None, None)?;
        let tensor = dlpack.validate().map_err(|e| {
            PyTypeError::new_err(format!("input {index}: invalid DLPack tensor: {e}"))
        })?;
        if tensor.device() != DLDevice::CPU {
            return Err(PyTypeError::new_err(format!(
                "input {index} lives on device type {:?}; the bridge takes CPU tensors",
                tensor.device().device_type
            )));
        }
        let dtype = dtype_of_dlpack(tensor.dtype()).ok_or_else(|| {
            PyTypeError::new_err(format!(
                "input {index} has DLPack type {:?}, which no kernel takes",
                tensor.dtype()
            ))
        })?;
        let dims: Vec<u64> = tensor.shape().iter().map(|&d| d.max(0) as u64).collect();
        let contiguous = row_major(tensor.shape(), tensor.strides());
        let ty = TensorType::new(dtype, Shape::of(&dims));
        Ok(Imported { ty, contiguous, dlpack })
    }

    /// The row-major bytes, borrowed (empty for a strided view: such calls fall back before
    /// any upload).
    pub fn bytes(&self) -> &[u8] {
        if !self.contiguous {
            return &[];
        }
        let Ok(tensor) = self.dlpack.validate() else { return &[] };
        let len = tensor.num_bytes();
        if len == 0 {
            return &[];
        }
        let ptr = tensor.data_ptr().cast::<u8>().wrapping_add(tensor.byte_offset() as usize);
        // SAFETY: the descriptor is validated, on the CPU and row-major (checked in `new`), so
        // its `num_bytes` bytes from the offset pointer are its elements; the producer keeps its
        // memory alive until `self.dlpack` is dropped, which the borrow of `self` outlives the
        // returned slice against.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }

    /// Reads the same bytes as `ty` (same byte size), for element types the producer cannot
    /// export through DLPack.
    pub fn reinterpret(&mut self, ty: TensorType) -> Result<(), String> {
        let size =
            |t: &TensorType| t.shape.num_elements().map(|n| n as usize * t.dtype.byte_size());
        if !ty.shape.is_static() || size(&ty) != size(&self.ty) {
            return Err(format!("{} cannot be read as {ty}", self.ty));
        }
        self.ty = ty;
        Ok(())
    }

    pub fn host(&self) -> HostTensor<'_> {
        HostTensor { ty: &self.ty, data: self.bytes(), contiguous: self.contiguous }
    }
}

/// Whether a DLPack tensor's elements lie in row-major order without gaps, as PyTorch's
/// `is_contiguous` says: the stride of a dim of size 1 does not matter (a `[1, n]` slice of a
/// wider row keeps its parent's stride there), and an empty tensor is contiguous.
pub(crate) fn row_major(shape: &[i64], strides: Option<&[i64]>) -> bool {
    let Some(strides) = strides else { return true };
    if shape.len() != strides.len() {
        return false;
    }
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1i64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(d);
    }
    true
}

/// Imports a list of Python tensors.
pub fn import_all(inputs: &[Bound<'_, PyAny>]) -> PyResult<Vec<Imported>> {
    inputs.iter().enumerate().map(|(i, t)| Imported::new(t, i)).collect()
}

/// A PJRT output buffer in host memory, exported to Python through DLPack without a copy.
#[pyclass(frozen, module = "tpu_kernels._native")]
#[derive(Debug)]
pub struct DeviceTensor {
    buffer: Arc<Buffer>,
    /// The buffer's host address (stable while `buffer` lives: PJRT only rewrites a buffer that
    /// is donated, which takes it by value).
    address: usize,
    dims: Vec<i64>,
    dtype: DType,
}

impl DeviceTensor {
    /// Wraps an output buffer whose memory is host memory (the CPU plugin).
    pub fn new(buffer: Buffer) -> PyResult<DeviceTensor> {
        let dtype = dtype_of(buffer.element_type()).ok_or_else(|| {
            PyTypeError::new_err(format!("output of type {} has no dtype", buffer.element_type()))
        })?;
        let address = buffer
            .read_in_place(|bytes| bytes.as_ptr() as usize)
            .map_err(|e| PyBufferError::new_err(format!("output not readable in place: {e}")))?;
        let dims = buffer.dims().to_vec();
        Ok(DeviceTensor { buffer: Arc::new(buffer), address, dims, dtype })
    }

    fn export<M: dlpark::ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let dl = dlpack_of_dtype(self.dtype)
            .ok_or_else(|| PyTypeError::new_err(format!("no DLPack type for {}", self.dtype)))?;
        let mut init = Dynamic::compact(self.dims.clone())
            .initialize_as::<M>(self.buffer.clone())
            .map_err(|e| PyBufferError::new_err(e.to_string()))?;
        init.set_data(self.address as *mut std::ffi::c_void)
            .set_dtype(dl)
            .set_device(DLDevice::CPU);
        // SAFETY: `address` points to the buffer's dense row-major bytes (`read_in_place`
        // checked layout and size for exactly these dims and dtype); the managed tensor owns an
        // `Arc` of the buffer, so the memory outlives every consumer; no flag is asserted.
        Ok(unsafe { init.finish() })
    }
}

impl DlpackExporter for DeviceTensor {
    fn device(&self) -> DLDevice {
        DLDevice::CPU
    }

    fn flags(&self) -> DlpackFlags {
        DlpackFlags::empty()
    }

    fn prepare_export(&self, _py: Python<'_>, _request: &ExportRequest<'_>) -> PyResult<()> {
        // The buffer is ready: `read_in_place` waited for it.
        Ok(())
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.export()
    }

    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.export()
    }
}

#[pymethods]
impl DeviceTensor {
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let request = ExportRequest::parse(stream.as_ref(), max_version, dl_device, copy)?;
        export_dlpack(self, py, request)
    }

    fn __dlpack_device__(&self) -> (u32, i32) {
        (DLDevice::CPU.device_type.0, DLDevice::CPU.device_id)
    }

    /// The shape.
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.dims.clone()
    }

    /// The dtype's short name (`f32`, `bf16`).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.short_name()
    }

    /// The host address of the data (to check zero-copy exports).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.address
    }

    /// A copy of the row-major bytes.
    fn to_bytes(&self) -> PyResult<Vec<u8>> {
        self.buffer.read_in_place(<[u8]>::to_vec).map_err(|e| PyBufferError::new_err(e.to_string()))
    }

    fn __repr__(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(ToString::to_string).collect();
        format!("DeviceTensor({}[{}])", self.dtype.short_name(), dims.join(","))
    }
}

/// The elements of a strided tensor in row-major order: `dims` and element `strides` from
/// `base` (its first element), `esize` bytes each; copied a run at a time (the innermost dim is
/// one copy when its stride is 1).
///
/// # Safety
/// Every element the dims and strides reach lies in memory readable for the call.
pub(crate) unsafe fn gather(
    base: *const u8,
    dims: &[i64],
    strides: &[i64],
    esize: usize,
) -> Vec<u8> {
    let numel = dims.iter().product::<i64>().max(0) as usize;
    if numel == 0 || base.is_null() {
        return Vec::new();
    }
    let r = dims.len();
    let (run_len, outer) = match (dims.last(), strides.last()) {
        (Some(&n), Some(&1)) => (n as usize, r - 1),
        _ => (1, r),
    };
    let mut out = Vec::with_capacity(numel * esize);
    let mut idx = vec![0i64; outer];
    loop {
        let off: i64 = idx.iter().zip(strides).map(|(i, s)| i * s).sum();
        // SAFETY: every index is within `dims`, so the run lies inside the tensor's memory
        // (the caller's contract).
        let run = unsafe {
            std::slice::from_raw_parts(base.offset(off as isize * esize as isize), run_len * esize)
        };
        out.extend_from_slice(run);
        let mut k = outer;
        loop {
            if k == 0 {
                return out;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < dims[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}
