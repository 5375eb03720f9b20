//! The error type of kernel construction.

use std::fmt;

/// What kind of misuse a [`BuildError`] reports, for callers that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An operand's element type is not one the op accepts, or two operands' element types differ.
    DType,
    /// Shapes that must agree do not, or cannot be broadcast together.
    Shape,
    /// An axis or dimension index outside the operand's rank, or repeated.
    Axis,
    /// Dimension numbers (dot_general, broadcast, transpose, slice, pad) that are inconsistent.
    DimensionNumbers,
    /// A value that belongs to another kernel's builder, or to a region that is closed.
    ForeignValue,
    /// A constant that the element type cannot represent, or with the wrong number of elements.
    Literal,
    /// A region body (reduce, while, case) with the wrong arguments or results.
    Region,
    /// A called function that is missing, or two different functions with one name.
    Symbol,
    /// The finished function failed verification.
    Verify,
    /// A kernel body refuses a call it does not take (a case its guards cannot express, such
    /// as a `half_to_float` softmax backward): not a bug, so a dispatcher counts the call as
    /// declined rather than as a kernel's failure.
    Unsupported,
    /// A tiled kernel's block shape breaks the TPU's tiling rule for its last two dims.
    Tiling,
    /// A tiled kernel's index map leaves its array, or its grid leaves part of an output
    /// unwritten.
    Coverage,
    /// A tiled kernel's blocks (double-buffered) and scratch exceed the target's scoped VMEM.
    VmemLimit,
}

/// A rejected builder call: names the kernel, the op and the types involved.
///
/// Displayed as `kernel `rms_norm`: stablehlo.add: element types differ: tensor<8xf32> vs tensor<8xbf16>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildError {
    pub kernel: String,
    pub op: &'static str,
    pub kind: ErrorKind,
    pub message: String,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel `{}`: {}: {}", self.kernel, self.op, self.message)
    }
}

impl std::error::Error for BuildError {}

/// An op-level error from the type rules ([`crate::ir::infer`]), before a kernel name is attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError {
    pub kind: ErrorKind,
    pub message: String,
}

impl OpError {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> OpError {
        OpError { kind, message: message.into() }
    }

    pub fn in_kernel(self, kernel: &str, op: &'static str) -> BuildError {
        BuildError { kernel: kernel.to_owned(), op, kind: self.kind, message: self.message }
    }
}

macro_rules! op_err {
    ($kind:ident, $($fmt:tt)*) => {
        $crate::error::OpError::new($crate::error::ErrorKind::$kind, format!($($fmt)*))
    };
}
pub(crate) use op_err;
