//! Constant tensors (`stablehlo.constant dense<...>`) and exact number formatting.
//!
//! Float values are rounded to their element type when the literal is made, so what prints is the
//! value the kernel computes with, and the printed decimal parses back to exactly that value.

use std::fmt::Write as _;

use crate::error::{OpError, op_err};
use crate::types::{DType, DTypeClass, TensorType};

/// The elements of a constant. One element is a splat over the whole shape.
#[derive(Clone, Debug, PartialEq)]
pub enum LiteralData {
    Float(Vec<f64>),
    Int(Vec<i64>),
    UInt(Vec<u64>),
    Bool(Vec<bool>),
}

impl LiteralData {
    fn len(&self) -> usize {
        match self {
            LiteralData::Float(v) => v.len(),
            LiteralData::Int(v) => v.len(),
            LiteralData::UInt(v) => v.len(),
            LiteralData::Bool(v) => v.len(),
        }
    }
}

/// A typed constant, validated against its element type and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Literal {
    ty: TensorType,
    data: LiteralData,
}

impl Literal {
    /// A constant of type `ty` whose every element is `value` (converted to the element type).
    pub(crate) fn splat(ty: TensorType, value: f64) -> Result<Literal, OpError> {
        let data = match ty.dtype.class() {
            DTypeClass::Float => LiteralData::Float(vec![round_float(value, ty.dtype)?]),
            DTypeClass::SignedInt => LiteralData::Int(vec![int_from_f64(value, ty.dtype)?]),
            DTypeClass::UnsignedInt => LiteralData::UInt(vec![uint_from_f64(value, ty.dtype)?]),
            DTypeClass::Bool => {
                if value != 0.0 && value != 1.0 {
                    return Err(op_err!(Literal, "{value} is not a bool (use 0 or 1)"));
                }
                LiteralData::Bool(vec![value != 0.0])
            }
        };
        Ok(Literal { ty, data })
    }

    /// A constant with explicit elements (row-major), or one element to splat.
    pub(crate) fn new(ty: TensorType, data: LiteralData) -> Result<Literal, OpError> {
        let Some(count) = ty.shape.num_elements() else {
            return Err(op_err!(Literal, "constant of type {ty} needs a static shape"));
        };
        let n = data.len();
        if n != 1 && n as u64 != count {
            return Err(op_err!(Literal, "{n} elements given for {ty}, which holds {count}"));
        }
        let data = match (ty.dtype.class(), data) {
            (DTypeClass::Float, LiteralData::Float(v)) => LiteralData::Float(
                v.into_iter().map(|x| round_float(x, ty.dtype)).collect::<Result<_, _>>()?,
            ),
            (DTypeClass::SignedInt, LiteralData::Int(v)) => {
                for &x in &v {
                    check_int_range(x as i128, ty.dtype)?;
                }
                LiteralData::Int(v)
            }
            (DTypeClass::UnsignedInt, LiteralData::UInt(v)) => {
                for &x in &v {
                    check_int_range(x as i128, ty.dtype)?;
                }
                LiteralData::UInt(v)
            }
            (DTypeClass::Bool, LiteralData::Bool(v)) => LiteralData::Bool(v),
            (_, data) => {
                let given = match data {
                    LiteralData::Float(_) => "float",
                    LiteralData::Int(_) => "signed integer",
                    LiteralData::UInt(_) => "unsigned integer",
                    LiteralData::Bool(_) => "bool",
                };
                return Err(op_err!(Literal, "{given} elements given for {ty}"));
            }
        };
        Ok(Literal { ty, data })
    }

    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    pub fn data(&self) -> &LiteralData {
        &self.data
    }

    /// Writes `dense<...>` (without the type).
    pub(crate) fn write_dense(&self, out: &mut String) {
        out.push_str("dense<");
        let dtype = self.ty.dtype;
        let elem = |out: &mut String, i: usize| match &self.data {
            LiteralData::Float(v) => out.push_str(&format_float(v[i], dtype)),
            LiteralData::Int(v) => {
                let _ = write!(out, "{}", v[i]);
            }
            LiteralData::UInt(v) => {
                let _ = write!(out, "{}", v[i]);
            }
            LiteralData::Bool(v) => out.push_str(if v[i] { "true" } else { "false" }),
        };
        if self.data.len() == 1 {
            elem(out, 0);
        } else {
            // Nested brackets, one level per dimension, row-major.
            let dims = self.ty.shape.static_dims().unwrap_or_default();
            let mut index = 0usize;
            write_nested(out, &dims, &mut index, &elem);
        }
        out.push('>');
    }
}

fn write_nested(
    out: &mut String,
    dims: &[u64],
    index: &mut usize,
    elem: &dyn Fn(&mut String, usize),
) {
    let Some((&first, rest)) = dims.split_first() else {
        elem(out, *index);
        *index += 1;
        return;
    };
    out.push('[');
    for i in 0..first {
        if i > 0 {
            out.push_str(", ");
        }
        write_nested(out, rest, index, elem);
    }
    out.push(']');
}

fn check_int_range(x: i128, dtype: DType) -> Result<(), OpError> {
    let (lo, hi): (i128, i128) = match dtype {
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::I64 => (i64::MIN.into(), i64::MAX.into()),
        DType::U8 => (0, u8::MAX.into()),
        DType::U32 => (0, u32::MAX.into()),
        _ => return Err(op_err!(Literal, "{dtype} is not an integer type")),
    };
    if x < lo || x > hi {
        return Err(op_err!(Literal, "constant {x} does not fit {dtype} (range {lo}..={hi})"));
    }
    Ok(())
}

fn int_from_f64(value: f64, dtype: DType) -> Result<i64, OpError> {
    if value.fract() != 0.0 || !value.is_finite() {
        return Err(op_err!(Literal, "constant {value} is not an integer, as {dtype} needs"));
    }
    check_int_range(value as i128, dtype)?;
    Ok(value as i64)
}

fn uint_from_f64(value: f64, dtype: DType) -> Result<u64, OpError> {
    if value.fract() != 0.0 || !value.is_finite() {
        return Err(op_err!(Literal, "constant {value} is not an integer, as {dtype} needs"));
    }
    check_int_range(value as i128, dtype)?;
    Ok(value as u64)
}

/// Rounds to the nearest value of `dtype` (ties to even). Infinities and NaN pass through where the
/// type has them; a finite value beyond the type's range is an error, not a silent infinity.
pub(crate) fn round_float(value: f64, dtype: DType) -> Result<f64, OpError> {
    let rounded = match dtype {
        DType::F64 => value,
        DType::F32 => f64::from(value as f32),
        DType::BF16 => half::bf16::from_f64(value).to_f64(),
        DType::F16 => half::f16::from_f64(value).to_f64(),
        // (mantissa bits, minimum normal exponent, largest finite value, has infinity)
        DType::F8E4M3FN => round_small_float(value, 3, -6, 448.0, false)?,
        DType::F8E5M2 => round_small_float(value, 2, -14, 57344.0, true)?,
        other => return Err(op_err!(Literal, "{other} is not a float type")),
    };
    if value.is_finite() && !rounded.is_finite() {
        return Err(op_err!(Literal, "constant {value} overflows {dtype}"));
    }
    Ok(rounded)
}

fn round_small_float(
    value: f64,
    mantissa_bits: i32,
    min_exp: i32,
    max_finite: f64,
    has_inf: bool,
) -> Result<f64, OpError> {
    if value.is_nan() {
        return Ok(value);
    }
    if value.is_infinite() {
        return if has_inf {
            Ok(value)
        } else {
            Err(op_err!(Literal, "constant {value} has no representation without infinities"))
        };
    }
    if value == 0.0 {
        return Ok(value);
    }
    let exp = (value.abs().log2().floor() as i32).max(min_exp);
    let quantum = 2f64.powi(exp - mantissa_bits);
    let rounded = (value / quantum).round_ties_even() * quantum;
    if rounded.abs() > max_finite {
        return Err(op_err!(Literal, "constant {value} exceeds the largest finite {max_finite}"));
    }
    Ok(rounded)
}

/// MLIR float spelling of a value already rounded to `dtype`: `1.000000e+00`, `-4.471500e-02`;
/// NaN and infinities as the element type's bit pattern (`0x7FC00000`).
pub(crate) fn format_float(value: f64, dtype: DType) -> String {
    if !value.is_finite() {
        return format_special(value, dtype);
    }
    // Shortest digits that identify the value in its own type (f64 for f64, f32 otherwise: every
    // narrower float is exactly an f32, and the parser rounds the decimal into the element type).
    let sci =
        if dtype == DType::F64 { format!("{value:e}") } else { format!("{:e}", value as f32) };
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let (int_part, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let exp: i32 = exp.parse().unwrap_or(0);
    let exp_sign = if exp < 0 { '-' } else { '+' };
    format!("{sign}{int_part}.{frac:0<6}e{exp_sign}{:02}", exp.abs())
}

fn format_special(value: f64, dtype: DType) -> String {
    let neg = value.is_sign_negative();
    let bits: (u64, u32) = match dtype {
        DType::F64 => (f64::from_bits(value.to_bits()).to_bits(), 16),
        DType::F32 => (u64::from((value as f32).to_bits()), 8),
        DType::BF16 => (u64::from(half::bf16::from_f64(value).to_bits()), 4),
        DType::F16 => (u64::from(half::f16::from_f64(value).to_bits()), 4),
        DType::F8E4M3FN => (if neg { 0xFF } else { 0x7F }, 2),
        DType::F8E5M2 => {
            let b = if value.is_nan() { 0x7E } else { 0x7C };
            (if neg { b | 0x80 } else { b }, 2)
        }
        _ => (0, 2),
    };
    format!("0x{:0width$X}", bits.0, width = bits.1 as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_mlir_and_round_trip() {
        assert_eq!(format_float(1.0, DType::F32), "1.000000e+00");
        assert_eq!(format_float(-0.5, DType::F32), "-5.000000e-01");
        let c = round_float(0.044715, DType::F32).unwrap();
        assert_eq!(format_float(c, DType::F32), "4.471500e-02");
        assert_eq!(format_float(0.0, DType::BF16), "0.000000e+00");
        assert_eq!(format_float(1e-300, DType::F64), "1.000000e-300");
        let p = round_float(std::f64::consts::PI, DType::F32).unwrap();
        let text = format_float(p, DType::F32);
        assert_eq!(text.parse::<f32>().unwrap() as f64, p);
    }

    #[test]
    fn specials_print_as_bit_patterns() {
        assert_eq!(format_float(f64::NAN, DType::F32), "0x7FC00000");
        assert_eq!(format_float(f64::NEG_INFINITY, DType::F32), "0xFF800000");
        assert_eq!(format_float(f64::INFINITY, DType::BF16), "0x7F80");
        assert_eq!(format_float(f64::INFINITY, DType::F8E5M2), "0x7C");
    }

    #[test]
    fn rounding_respects_each_format() {
        assert_eq!(round_float(1.0 + 1e-3, DType::BF16).unwrap(), 1.0);
        assert_eq!(round_float(448.0, DType::F8E4M3FN).unwrap(), 448.0);
        assert_eq!(round_float(0.3, DType::F8E4M3FN).unwrap(), 0.3125);
        assert!(round_float(500.0, DType::F8E4M3FN).is_err());
        assert!(round_float(f64::INFINITY, DType::F8E4M3FN).is_err());
        assert!(round_float(1e39, DType::F32).unwrap_err().message.contains("overflows f32"));
    }

    #[test]
    fn literals_validate_counts_and_ranges() {
        let ty = TensorType::new(DType::I8, [2]);
        assert!(Literal::new(ty.clone(), LiteralData::Int(vec![1, 2, 3])).is_err());
        let e = Literal::new(ty.clone(), LiteralData::Int(vec![1, 300])).unwrap_err();
        assert!(e.message.contains("does not fit i8"), "{}", e.message);
        assert!(Literal::new(ty, LiteralData::Float(vec![1.0])).is_err());
        assert!(Literal::splat(TensorType::scalar(DType::I32), 1.5).is_err());
        assert!(Literal::splat(TensorType::scalar(DType::Bool), 2.0).is_err());
        let lit =
            Literal::new(TensorType::new(DType::I32, [2, 2]), LiteralData::Int(vec![1, 2, 3, 4]))
                .unwrap();
        let mut s = String::new();
        lit.write_dense(&mut s);
        assert_eq!(s, "dense<[[1, 2], [3, 4]]>");
    }
}
