//! The value types of a Mosaic kernel: scalars, `index`, vectors (values in vector registers)
//! and memrefs (blocks and scratch buffers in VMEM or SMEM).

use std::fmt;

use crate::types::DType;

/// Where a memref lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemorySpace {
    /// The TensorCore's vector memory: blocks of the grid's windows and vector scratch.
    Vmem,
    /// Scalar memory: scalar scratch and scalar-prefetch operands.
    Smem,
}

impl MemorySpace {
    fn mlir(self) -> &'static str {
        match self {
            MemorySpace::Vmem => "vmem",
            MemorySpace::Smem => "smem",
        }
    }
}

/// The type of a Mosaic value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MType {
    /// A scalar of an element type (`f32`, `i32`, `i1`).
    Scalar(DType),
    /// MLIR's `index`, the type of load and store indices.
    Index,
    /// `vector<8x128xf32>`.
    Vector { shape: Vec<u64>, dtype: DType },
    /// `memref<8x128xf32, #tpu.memory_space<vmem>>`.
    MemRef { shape: Vec<u64>, dtype: DType, space: MemorySpace },
}

impl MType {
    pub fn vector(dtype: DType, shape: &[u64]) -> MType {
        MType::Vector { shape: shape.to_vec(), dtype }
    }

    pub fn vmem(dtype: DType, shape: &[u64]) -> MType {
        MType::MemRef { shape: shape.to_vec(), dtype, space: MemorySpace::Vmem }
    }

    /// `memref<...xi32, #tpu.memory_space<smem>>`: scalar memory, read and written one element
    /// at a time.
    pub fn smem(dtype: DType, shape: &[u64]) -> MType {
        MType::MemRef { shape: shape.to_vec(), dtype, space: MemorySpace::Smem }
    }

    /// The memory space of a memref (`None` for other types).
    pub fn space(&self) -> Option<MemorySpace> {
        match self {
            MType::MemRef { space, .. } => Some(*space),
            _ => None,
        }
    }

    /// The element type (`None` for `index`).
    pub fn dtype(&self) -> Option<DType> {
        match self {
            MType::Scalar(d) | MType::Vector { dtype: d, .. } | MType::MemRef { dtype: d, .. } => {
                Some(*d)
            }
            MType::Index => None,
        }
    }

    /// The shape of a vector or memref (empty for scalars and `index`).
    pub fn shape(&self) -> &[u64] {
        match self {
            MType::Vector { shape, .. } | MType::MemRef { shape, .. } => shape,
            _ => &[],
        }
    }

    pub fn is_vector(&self) -> bool {
        matches!(self, MType::Vector { .. })
    }

    pub fn is_memref(&self) -> bool {
        matches!(self, MType::MemRef { .. })
    }

    /// The same type with element type `dtype` (a scalar or vector).
    pub fn with_dtype(&self, dtype: DType) -> MType {
        match self {
            MType::Vector { shape, .. } => MType::Vector { shape: shape.clone(), dtype },
            MType::MemRef { shape, space, .. } => {
                MType::MemRef { shape: shape.clone(), dtype, space: *space }
            }
            _ => MType::Scalar(dtype),
        }
    }

    /// Bytes of a memref (0 for other types).
    pub fn byte_size(&self) -> u64 {
        match self {
            MType::MemRef { shape, dtype, .. } => {
                shape.iter().product::<u64>() * dtype.byte_size() as u64
            }
            _ => 0,
        }
    }
}

fn dims(shape: &[u64]) -> String {
    shape.iter().map(|d| format!("{d}x")).collect()
}

impl fmt::Display for MType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MType::Scalar(d) => f.write_str(d.mlir_name()),
            MType::Index => f.write_str("index"),
            MType::Vector { shape, dtype } => {
                write!(f, "vector<{}{}>", dims(shape), dtype.mlir_name())
            }
            MType::MemRef { shape, dtype, space } => write!(
                f,
                "memref<{}{}, #tpu.memory_space<{}>>",
                dims(shape),
                dtype.mlir_name(),
                space.mlir()
            ),
        }
    }
}
