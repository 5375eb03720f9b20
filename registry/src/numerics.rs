//! Comparing kernel outputs with references: one rule for NaN and infinities, used by every Rust
//! numerics check (the tests, the examples, the demo).
//!
//! The rule is the one of the Python harness (`tpu_kernels.testing`):
//!
//! - the error of an element ([`element_error`]) is `|actual - expected|` when both are finite;
//!   0 when both are NaN or both are the same infinity; and infinite otherwise: a NaN or an
//!   infinity the reference does not have, a finite value where the reference has a NaN or an
//!   infinity, or the opposite infinity. It is never NaN, so a maximum over elements cannot skip
//!   it (`f64::max` returns the other operand when one is NaN, which is how an all-NaN output
//!   used to score 0);
//! - an element is within a [`Tolerance`] when its error is at most
//!   `atol + rtol * |expected|` (`|expected|` counting as 0 where it is not finite). An infinite
//!   error is never within a tolerance, however large;
//! - sequences of different lengths never compare equal: [`check_close`] reports
//!   [`Mismatch::Length`] and [`max_abs_error`] an infinite error; nothing is silently truncated
//!   the way a `zip` would.
//!
//! ```
//! use tpu_kernels_registry::numerics::{Tolerance, check_close, max_abs_error};
//!
//! let output = [1.0f32, 2.0, 3.0];
//! let reference = [1.0f64, 2.0, 3.000001];
//! let summary = check_close(&output, &reference, Tolerance::abs(1e-5)).unwrap();
//! assert!(summary.max_abs_error < 1e-5);
//!
//! let nan = [f32::NAN; 3];
//! assert_eq!(max_abs_error(&nan, &reference), f64::INFINITY);
//! let err = check_close(&nan, &reference, Tolerance::abs(1e-5)).unwrap_err();
//! assert!(err.to_string().starts_with("3 of 3 elements exceed"), "{err}");
//! ```
//!
//! Std-only: nothing here knows about PJRT or buffers; read outputs to `f32`/`f64` first.

use std::fmt;

/// A value the comparisons read as `f64`: `f32` and `f64`, by value or by reference (so both
/// `&[f32]` and `Vec<f64>` can be passed as they are). `f32` converts exactly.
pub trait AsF64: Copy {
    /// The value as an `f64`.
    fn as_f64(self) -> f64;
}

impl AsF64 for f64 {
    fn as_f64(self) -> f64 {
        self
    }
}

impl AsF64 for f32 {
    fn as_f64(self) -> f64 {
        f64::from(self)
    }
}

impl AsF64 for &f64 {
    fn as_f64(self) -> f64 {
        *self
    }
}

impl AsF64 for &f32 {
    fn as_f64(self) -> f64 {
        f64::from(*self)
    }
}

/// The error of one element `actual` against its reference `expected`: `|actual - expected|`
/// for finite values, 0 for two NaNs or the same infinity, `f64::INFINITY` for every other
/// pairing with a NaN or an infinity. Never NaN.
pub fn element_error(actual: f64, expected: f64) -> f64 {
    if actual.is_finite() && expected.is_finite() {
        // May still overflow to infinity (1e308 against -1e308), which is the right answer.
        return (actual - expected).abs();
    }
    let same = (actual.is_nan() && expected.is_nan()) || actual == expected;
    if same { 0.0 } else { f64::INFINITY }
}

/// The largest [`element_error`] over the elements of `actual` against `expected` (0 for two
/// empty sequences). Sequences of different lengths give `f64::INFINITY`; use [`check_close`]
/// for a message saying so.
pub fn max_abs_error<A, E>(actual: A, expected: E) -> f64
where
    A: IntoIterator<Item: AsF64>,
    E: IntoIterator<Item: AsF64>,
{
    let (mut actual, mut expected) = (actual.into_iter(), expected.into_iter());
    let mut max = 0.0f64;
    loop {
        match (actual.next(), expected.next()) {
            (Some(a), Some(e)) => max = max.max(element_error(a.as_f64(), e.as_f64())),
            (None, None) => return max,
            _ => return f64::INFINITY,
        }
    }
}

/// How far an element may be from its reference: `|actual - expected| <= atol + rtol *
/// |expected|`, the form of `numpy.isclose`, `torch.allclose` and `tpu_kernels.testing`.
///
/// A negative or NaN bound admits exact matches only.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// The absolute part of the bound.
    pub atol: f64,
    /// The part of the bound relative to `|expected|`.
    pub rtol: f64,
}

impl Tolerance {
    /// Exact equality (up to the NaN and infinity rule of [`element_error`]).
    pub const EXACT: Self = Self { atol: 0.0, rtol: 0.0 };

    /// `atol` and `rtol`.
    pub const fn new(atol: f64, rtol: f64) -> Self {
        Self { atol, rtol }
    }

    /// An absolute bound only.
    pub const fn abs(atol: f64) -> Self {
        Self { atol, rtol: 0.0 }
    }

    /// A relative bound only (so a reference of 0 must be matched exactly).
    pub const fn rel(rtol: f64) -> Self {
        Self { atol: 0.0, rtol }
    }

    /// The largest error allowed for an element whose reference is `expected`.
    pub fn bound(&self, expected: f64) -> f64 {
        let scale = if expected.is_finite() { expected.abs() } else { 0.0 };
        self.atol + self.rtol * scale
    }

    /// Whether `actual` is within the tolerance of `expected`. An infinite error never is.
    pub fn allows(&self, actual: f64, expected: f64) -> bool {
        let error = element_error(actual, expected);
        error == 0.0 || (error.is_finite() && error <= self.bound(expected))
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "atol={:?}, rtol={:?}", self.atol, self.rtol)
    }
}

/// What [`check_close`] measured on a passing comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Summary {
    /// The number of elements compared.
    pub len: usize,
    /// The largest [`element_error`] (0 when empty).
    pub max_abs_error: f64,
    /// Where that error is (the first such element); `None` when empty.
    pub worst: Option<usize>,
}

/// Why [`check_close`] failed. The message names the count of bad elements, the worst one's
/// index and values, and the tolerance.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Mismatch {
    /// The sequences have different lengths.
    Length {
        /// Elements of the output.
        actual: usize,
        /// Elements of the reference.
        expected: usize,
    },
    /// Some elements are outside the tolerance.
    Values {
        /// How many elements are outside it.
        bad: usize,
        /// The number of elements compared.
        len: usize,
        /// The index of the element furthest outside it (largest error relative to its bound;
        /// the first of equals).
        worst: usize,
        /// That element of the output.
        actual: f64,
        /// Its reference.
        expected: f64,
        /// Its [`element_error`].
        error: f64,
        /// The tolerance checked.
        tolerance: Tolerance,
        /// The largest [`element_error`] over all elements.
        max_abs_error: f64,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length { actual, expected } => {
                write!(f, "the output has {actual} elements, the reference {expected}")
            }
            Self::Values { bad, len, worst, actual, expected, error, tolerance, max_abs_error } => {
                write!(
                    f,
                    "{bad} of {len} elements exceed {tolerance}; worst at index {worst}: actual \
                     {actual:?}, expected {expected:?} (error {error:?}, allowed {:?}); max abs \
                     error {max_abs_error:?}",
                    tolerance.bound(*expected)
                )
            }
        }
    }
}

impl std::error::Error for Mismatch {}

/// Compares `actual` with `expected` element by element under `tolerance`; on success, the
/// largest error and where it is.
pub fn check_close<A, E>(actual: A, expected: E, tolerance: Tolerance) -> Result<Summary, Mismatch>
where
    A: IntoIterator<Item: AsF64>,
    E: IntoIterator<Item: AsF64>,
{
    let actual: Vec<f64> = actual.into_iter().map(AsF64::as_f64).collect();
    let expected: Vec<f64> = expected.into_iter().map(AsF64::as_f64).collect();
    if actual.len() != expected.len() {
        return Err(Mismatch::Length { actual: actual.len(), expected: expected.len() });
    }
    let mut summary = Summary { len: actual.len(), max_abs_error: 0.0, worst: None };
    // (index, error / bound) of the element furthest outside the tolerance.
    let mut furthest: Option<(usize, f64)> = None;
    let mut bad = 0;
    for (i, (&a, &e)) in actual.iter().zip(&expected).enumerate() {
        let error = element_error(a, e);
        if summary.worst.is_none() || error > summary.max_abs_error {
            summary = Summary { max_abs_error: error, worst: Some(i), ..summary };
        }
        if tolerance.allows(a, e) {
            continue;
        }
        bad += 1;
        let bound = tolerance.bound(e);
        let excess = if bound > 0.0 { error / bound } else { f64::INFINITY };
        if furthest.is_none_or(|(_, worst)| excess > worst) {
            furthest = Some((i, excess));
        }
    }
    match furthest {
        None => Ok(summary),
        Some((worst, _)) => Err(Mismatch::Values {
            bad,
            len: summary.len,
            worst,
            actual: actual[worst],
            expected: expected[worst],
            error: element_error(actual[worst], expected[worst]),
            tolerance,
            max_abs_error: summary.max_abs_error,
        }),
    }
}

/// [`check_close`] that panics with the [`Mismatch`]'s message after `what: `, for tests.
#[track_caller]
pub fn assert_close<A, E>(what: &str, actual: A, expected: E, tolerance: Tolerance) -> Summary
where
    A: IntoIterator<Item: AsF64>,
    E: IntoIterator<Item: AsF64>,
{
    match check_close(actual, expected, tolerance) {
        Ok(summary) => summary,
        Err(mismatch) => panic!("{what}: {mismatch}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Tolerance = Tolerance::abs(1e-5);

    #[test]
    fn nan_output_fails_the_check() {
        // The meta-test: an all-NaN output used to score a max error of 0 and pass.
        let reference = [0.5f64, -1.0, 2.0, 0.0];
        let output = [f32::NAN; 4];
        assert_eq!(max_abs_error(&output, &reference), f64::INFINITY);
        let Err(Mismatch::Values { bad, len, worst, error, .. }) =
            check_close(&output, &reference, TOL)
        else {
            panic!("an all-NaN output passed");
        };
        assert_eq!((bad, len, worst, error), (4, 4, 0, f64::INFINITY));
        // Even a tolerance that admits any finite error.
        assert!(check_close(&output, &reference, Tolerance::new(f64::MAX, f64::MAX)).is_err());
        assert!(check_close(&output, &reference, Tolerance::abs(f64::INFINITY)).is_err());
        // One NaN among good values fails too, and is the worst element.
        let one = [0.5f64, f64::NAN, 2.0, 0.0];
        let err = check_close(&one, &reference, TOL).unwrap_err();
        assert!(matches!(err, Mismatch::Values { bad: 1, worst: 1, .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.starts_with(
                "1 of 4 elements exceed atol=1e-5, rtol=0.0; worst at index 1: \
                 actual NaN, expected -1.0 (error inf, allowed 1e-5)"
            ),
            "{message}"
        );
    }

    #[test]
    fn an_infinity_fails_the_check() {
        let reference = [1.0f64, 2.0, 3.0];
        for inf in [f64::INFINITY, f64::NEG_INFINITY] {
            let output = [1.0, inf, 3.0];
            assert_eq!(max_abs_error(output, reference), f64::INFINITY);
            let err = check_close(output, reference, TOL).unwrap_err();
            assert!(matches!(err, Mismatch::Values { bad: 1, worst: 1, .. }), "{err:?}");
        }
        // A finite output where the reference is infinite, and opposite infinities.
        assert!(check_close([1.0], [f64::INFINITY], TOL).is_err());
        assert!(check_close([f64::NEG_INFINITY], [f64::INFINITY], TOL).is_err());
        assert!(check_close([f64::NAN], [f64::INFINITY], TOL).is_err());
        assert!(check_close([1.0], [f64::NAN], TOL).is_err());
        // Finite values whose difference overflows.
        assert_eq!(element_error(f64::MAX, -f64::MAX), f64::INFINITY);
    }

    #[test]
    fn nan_and_infinity_where_the_reference_has_them_pass() {
        let reference = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.0];
        let output = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0];
        let summary = check_close(&output, &reference, Tolerance::EXACT).unwrap();
        assert_eq!((summary.len, summary.max_abs_error, summary.worst), (4, 0.0, Some(0)));
        assert_eq!(max_abs_error(&output, &reference), 0.0);
        assert_eq!(element_error(f64::NAN, f64::NAN), 0.0);
    }

    #[test]
    fn a_length_mismatch_fails_the_check() {
        let err = check_close([1.0f64, 2.0], [1.0f64, 2.0, 3.0], TOL).unwrap_err();
        assert_eq!(err, Mismatch::Length { actual: 2, expected: 3 });
        assert_eq!(err.to_string(), "the output has 2 elements, the reference 3");
        assert_eq!(max_abs_error([1.0f64, 2.0], [1.0f64, 2.0, 3.0]), f64::INFINITY);
        assert_eq!(max_abs_error([1.0f64, 2.0, 3.0], [1.0f64]), f64::INFINITY);
        assert!(check_close(Vec::<f32>::new(), [0.0f64], TOL).is_err());
    }

    #[test]
    fn within_tolerance_passes_with_the_max_error() {
        let reference = [1.0f64, -2.0, 3.0, 0.0];
        let output = [1.0f32, -2.000_002, 3.000_004, 0.0];
        let summary = check_close(&output, &reference, TOL).unwrap();
        assert_eq!(summary.len, 4);
        assert_eq!(summary.worst, Some(2));
        let want = f64::from(3.000_004f32) - 3.0;
        assert_eq!(summary.max_abs_error, want);
        assert_eq!(max_abs_error(&output, &reference), want);
        // Just outside, then the relative part of the bound.
        let err = check_close(&output, &reference, Tolerance::abs(3e-6)).unwrap_err();
        assert!(matches!(err, Mismatch::Values { bad: 1, worst: 2, .. }), "{err:?}");
        assert!(check_close(&output, &reference, Tolerance::rel(2e-6)).is_ok());
        assert!(check_close(&output, &reference, Tolerance::rel(1e-6)).is_err());
        // Empty sequences.
        let empty = check_close(Vec::<f64>::new(), Vec::<f64>::new(), TOL).unwrap();
        assert_eq!((empty.len, empty.max_abs_error, empty.worst), (0, 0.0, None));
    }

    #[test]
    fn the_worst_element_is_the_one_furthest_outside_its_bound() {
        // Element 0 has the larger absolute error but a large relative allowance.
        let reference = [1000.0f64, 1.0];
        let output = [1000.5f64, 1.1];
        let err = check_close(output, reference, Tolerance::new(1e-3, 1e-3)).unwrap_err();
        let Mismatch::Values { bad, worst, max_abs_error, .. } = err else { panic!("{err:?}") };
        assert_eq!((bad, worst, max_abs_error), (1, 1, 0.5));
        // A NaN tolerance admits nothing inexact.
        assert!(check_close([1.0], [1.0 + 1e-9], Tolerance::abs(f64::NAN)).is_err());
    }

    #[test]
    #[should_panic(expected = "silu: 1 of 1 elements exceed")]
    fn assert_close_names_what_failed() {
        assert_close("silu", [f64::NAN], [0.0], TOL);
    }
}
