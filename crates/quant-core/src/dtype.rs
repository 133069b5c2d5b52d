//! Element types of inputs and of quantized buffers.
//!
//! Inputs are f32, bf16 or f16 (the dtypes vendor GEMMs take as high precision).
//! Quantized buffers hold raw bytes (`U8`: FP8, E8M0, packed E2M1), 32-bit words
//! (`I32`: tinygemm tiles), `F32` scales and amaxes, or `BF16` scale/zero pairs.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Element type of a tensor or buffer.
///
/// ```
/// use quant_core::DType;
/// assert_eq!("bf16".parse::<DType>().unwrap(), DType::BF16);
/// assert_eq!(DType::F32.size(), 4);
/// assert_eq!(DType::U8.safetensors_name(), "U8");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// Raw bytes: FP8 codes, E8M0 exponents, packed E2M1 pairs.
    U8,
    /// 32-bit signed words (int4 tensor-core tiles).
    I32,
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
}

impl DType {
    /// Every dtype, for listings.
    pub const ALL: [DType; 5] = [DType::U8, DType::I32, DType::F32, DType::F16, DType::BF16];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
        }
    }

    /// Lower-case name used by the CLI and the metadata (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }

    /// The safetensors header spelling (`U8`, `I32`, `F32`, `F16`, `BF16`).
    pub const fn safetensors_name(self) -> &'static str {
        match self {
            DType::U8 => "U8",
            DType::I32 => "I32",
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
        }
    }

    /// Whether this is a floating input dtype a quantizer accepts.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The safetensors crate's dtype.
    pub const fn to_safetensors(self) -> safetensors::Dtype {
        match self {
            DType::U8 => safetensors::Dtype::U8,
            DType::I32 => safetensors::Dtype::I32,
            DType::F32 => safetensors::Dtype::F32,
            DType::F16 => safetensors::Dtype::F16,
            DType::BF16 => safetensors::Dtype::BF16,
        }
    }

    /// From the safetensors crate's dtype; `None` for dtypes quantfmt buffers never use.
    pub fn from_safetensors(d: safetensors::Dtype) -> Option<DType> {
        Some(match d {
            safetensors::Dtype::U8 => DType::U8,
            safetensors::Dtype::I32 => DType::I32,
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        DType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| Error::invalid("dtype", s, "must be one of u8, i32, f32, f16, bf16"))
    }
}

/// A floating element type a quantizer reads and a dequantizer writes.
///
/// Sealed: exactly f32, bf16 and f16. Conversions to f32 are exact; conversions from
/// f32/f64 round to nearest even once (so `from_f64` gives a single rounding, which
/// the int4 dequantizer needs to match the kernel's fused multiply-add).
pub trait Element:
    Copy + Send + Sync + PartialEq + fmt::Debug + bytemuck::Pod + private::Sealed + 'static
{
    /// The dtype tag.
    const DTYPE: DType;
    /// Exact widening to f32.
    fn to_f32(self) -> f32;
    /// Round-to-nearest-even narrowing from f32.
    fn from_f32(v: f32) -> Self;
    /// Round-to-nearest-even narrowing from f64 (one rounding, not two).
    fn from_f64(v: f64) -> Self;
    /// The largest finite value.
    const MAX_FINITE: f32;
    /// Widens `src` into `dst` (same length) exactly; bulk form of [`Element::to_f32`]
    /// that vectorizes (bf16: a shift; f16: F16C where the CPU has it, else the `half`
    /// crate's slice conversion).
    fn widen_slice(src: &[Self], dst: &mut [f32]);
    /// Narrows `src` into `dst` (same length) with round-to-nearest-even; bulk form of
    /// [`Element::from_f32`].
    fn narrow_slice(src: &[f32], dst: &mut [Self]);
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    const MAX_FINITE: f32 = f32::MAX;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn widen_slice(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline(always)]
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    const MAX_FINITE: f32 = 3.389_531_4e38; // bits 0x7F7F
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        // Not `bf16::from_f64`: half 2.7 drops the low mantissa bits first and can round
        // twice (1 + 2^-8 + 2^-40 -> 1.0 instead of 1.0078125).
        bf16::from_f32(f64_to_f32_round_odd(v))
    }
    #[inline(always)]
    fn widen_slice(src: &[Self], dst: &mut [f32]) {
        // bf16 is the top half of an f32: widening is a shift (NaN payloads kept).
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32_from_bf16_bits(s.to_bits());
        }
    }
    #[inline(always)]
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        // One instruction per 32 values where the CPU has AVX-512 BF16 (same bits).
        if crate::bf16_narrow::narrow(src, bytemuck::cast_slice_mut(dst)) {
            return;
        }
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = bf16::from_bits(bf16_bits(s));
        }
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    const MAX_FINITE: f32 = 65504.0;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        // Not `f16::from_f64`, which converts through an RNE f32 (a double rounding).
        f16::from_f32(f64_to_f32_round_odd(v))
    }
    #[inline(always)]
    fn widen_slice(src: &[Self], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "widen_slice: slices of one length");
        #[cfg(target_arch = "x86_64")]
        if crate::f16c::try_widen(src, dst) {
            return;
        }
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        assert_eq!(src.len(), dst.len(), "narrow_slice: slices of one length");
        #[cfg(target_arch = "x86_64")]
        if crate::f16c::try_narrow(src, dst) {
            return;
        }
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
}

/// The f32 value of the bf16 bit pattern `bits`: exact (bf16 is the top half of an
/// f32), NaN payloads and the sign kept. The widening every bf16 kernel does on raw bits
/// (block-maximum keys, bit slices of an input), written once.
///
/// ```
/// use quant_core::dtype::f32_from_bf16_bits;
/// assert_eq!(f32_from_bf16_bits(0x3F80), 1.0);
/// assert_eq!(f32_from_bf16_bits(0xC0A0), -5.0);
/// assert_eq!(f32_from_bf16_bits(0x7FC1).to_bits(), 0x7FC1_0000);
/// ```
#[inline(always)]
pub const fn f32_from_bf16_bits(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// The bits of `x` rounded to bf16: round to nearest even, identical to
/// `bf16::from_f32` including NaN (the quiet bit is set, the sign and top payload bits
/// kept). Branchless, so loops over it vectorize, where `bf16::from_f32` branches.
///
/// ```
/// use half::bf16;
/// for x in [1.0f32 + f32::EPSILON, 3.14159, -65504.5, f32::MAX, f32::NAN, f32::INFINITY] {
///     assert_eq!(quant_core::dtype::bf16_bits(x), bf16::from_f32(x).to_bits());
/// }
/// ```
#[inline(always)]
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x0040;
    (if b & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    }) as u16
}

/// `src` as f32 values: `src` itself when it is f32 (no copy), otherwise widened into
/// `scratch` (same length). Kernels call this once per L1-sized span so that the f32
/// path reads its input in place and the 16-bit paths widen in one vector loop.
///
/// ```
/// use half::bf16;
/// use quant_core::widened;
/// let mut scratch = [0f32; 3];
/// let xs = [1.5f32, -2.0, 0.25];
/// assert_eq!(widened(&xs, &mut scratch), &xs);
/// let bs = xs.map(bf16::from_f32);
/// assert_eq!(widened(&bs, &mut scratch), &xs);
/// ```
#[inline(always)]
pub fn widened<'a, T: Element>(src: &'a [T], scratch: &'a mut [f32]) -> &'a [f32] {
    match f32_slice(src) {
        Some(f) => f,
        None => {
            T::widen_slice(src, scratch);
            scratch
        }
    }
}

/// `xs` itself as f32 values when `T` is f32, else `None`: the twin of
/// [`bf16_slice_bits`] and [`f16_slice_bits`] for kernels that read f32 input in place.
///
/// ```
/// assert_eq!(quant_core::dtype::f32_slice(&[1.5f32]), Some(&[1.5f32][..]));
/// assert_eq!(quant_core::dtype::f32_slice(&[half::bf16::ONE]), None);
/// ```
#[inline(always)]
pub fn f32_slice<T: Element>(xs: &[T]) -> Option<&[f32]> {
    if T::DTYPE == DType::F32 {
        bytemuck::try_cast_slice::<T, f32>(xs).ok()
    } else {
        None
    }
}

/// The bit patterns of a bf16 slice (`None` when `T` is not bf16): kernels that work on
/// bf16 bits directly (16-bit lanes, [`crate::codec::pow2`]) take their input this way.
///
/// ```
/// use half::bf16;
/// let xs = [bf16::from_f32(1.0), bf16::from_f32(-2.0)];
/// assert_eq!(quant_core::dtype::bf16_slice_bits(&xs), Some(&[0x3F80u16, 0xC000][..]));
/// assert_eq!(quant_core::dtype::bf16_slice_bits(&[1.0f32]), None);
/// ```
#[inline(always)]
pub fn bf16_slice_bits<T: Element>(xs: &[T]) -> Option<&[u16]> {
    if T::DTYPE == DType::BF16 {
        bytemuck::try_cast_slice::<T, u16>(xs).ok()
    } else {
        None
    }
}

/// The bit patterns of `xs` when it is an f16 slice (`T` is `half::f16`), else `None`:
/// [`bf16_slice_bits`]' twin, for kernels that widen f16 in registers.
///
/// ```
/// use half::f16;
/// let xs = [f16::from_f32(1.0), f16::from_f32(-2.0)];
/// assert_eq!(quant_core::dtype::f16_slice_bits(&xs), Some(&[0x3C00u16, 0xC000][..]));
/// assert_eq!(quant_core::dtype::f16_slice_bits(&[half::bf16::ONE]), None);
/// ```
#[inline(always)]
pub fn f16_slice_bits<T: Element>(xs: &[T]) -> Option<&[u16]> {
    if T::DTYPE == DType::F16 {
        bytemuck::try_cast_slice::<T, u16>(xs).ok()
    } else {
        None
    }
}

/// A 16-bit float slice as its bit patterns, tagged with its format: what the kernels
/// that read bf16 or f16 input without widening it take ([`crate::codec::pow2`],
/// [`crate::block_max::block_abs_max_bits`]). One value carries both the bits and how to
/// read them, so a caller matches the element type once.
///
/// ```
/// use half::{bf16, f16};
/// use quant_core::dtype::Bits16;
/// let xs = [f16::from_f32(1.0), f16::from_f32(-2.0)];
/// assert_eq!(Bits16::of(&xs), Some(Bits16::F16(&[0x3C00, 0xC000])));
/// assert_eq!(Bits16::of(&[bf16::ONE]).map(Bits16::bits), Some(&[0x3F80u16][..]));
/// assert_eq!(Bits16::of(&[1.0f32]), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bits16<'a> {
    /// `bf16::to_bits` of each value.
    Bf16(&'a [u16]),
    /// `f16::to_bits` of each value.
    F16(&'a [u16]),
}

impl<'a> Bits16<'a> {
    /// The bits of `xs` when `T` is bf16 or f16, else `None`.
    #[inline(always)]
    pub fn of<T: Element>(xs: &'a [T]) -> Option<Bits16<'a>> {
        bf16_slice_bits(xs)
            .map(Bits16::Bf16)
            .or_else(|| f16_slice_bits(xs).map(Bits16::F16))
    }

    /// The bit patterns, whichever the format.
    #[inline(always)]
    pub fn bits(self) -> &'a [u16] {
        match self {
            Bits16::Bf16(b) | Bits16::F16(b) => b,
        }
    }

    /// Values held.
    #[inline(always)]
    pub fn len(self) -> usize {
        self.bits().len()
    }

    /// Whether no value is held.
    #[inline(always)]
    pub fn is_empty(self) -> bool {
        self.bits().is_empty()
    }

    /// The values in `range`, in the same format (panics out of bounds, as slicing).
    ///
    /// ```
    /// use quant_core::dtype::Bits16;
    /// assert_eq!(Bits16::F16(&[1, 2, 3]).slice(1..), Bits16::F16(&[2, 3]));
    /// ```
    #[inline(always)]
    pub fn slice(self, range: impl std::slice::SliceIndex<[u16], Output = [u16]>) -> Bits16<'a> {
        match self {
            Bits16::Bf16(b) => Bits16::Bf16(&b[range]),
            Bits16::F16(b) => Bits16::F16(&b[range]),
        }
    }
}

/// [`bf16_slice_bits`] for output: the bit patterns of a mutable bf16 slice.
///
/// ```
/// use half::bf16;
/// let mut out = [bf16::ZERO; 2];
/// if let Some(bits) = quant_core::dtype::bf16_slice_bits_mut(&mut out) {
///     bits[1] = 0x3F80;
/// }
/// assert_eq!(out[1], bf16::ONE);
/// ```
#[inline(always)]
pub fn bf16_slice_bits_mut<T: Element>(xs: &mut [T]) -> Option<&mut [u16]> {
    if T::DTYPE == DType::BF16 {
        bytemuck::try_cast_slice_mut::<T, u16>(xs).ok()
    } else {
        None
    }
}

/// A mutable float slice as the lanes its kernels write, tagged with its format: f32
/// values, or the bit patterns of bf16 or f16. The output-side twin of [`Bits16`]: a
/// SIMD kernel entry point matches this once instead of casting per element type.
///
/// ```
/// use half::{bf16, f16};
/// use quant_core::dtype::FloatsMut;
/// let mut out = [bf16::ZERO; 2];
/// if let Some(FloatsMut::Bf16(bits)) = FloatsMut::of(&mut out) {
///     bits[1] = 0x3F80;
/// }
/// assert_eq!(out[1], bf16::ONE);
/// assert!(matches!(FloatsMut::of(&mut [0f32; 3]), Some(FloatsMut::F32(o)) if o.len() == 3));
/// assert!(matches!(FloatsMut::of(&mut [f16::ZERO]), Some(FloatsMut::F16(_))));
/// ```
#[derive(Debug, PartialEq)]
pub enum FloatsMut<'a> {
    /// The values of an f32 slice.
    F32(&'a mut [f32]),
    /// `bf16::to_bits` of each value.
    Bf16(&'a mut [u16]),
    /// `f16::to_bits` of each value.
    F16(&'a mut [u16]),
}

impl<'a> FloatsMut<'a> {
    /// `xs` as its lanes. `None` only for an element type that is none of the three
    /// (there is none today); kernels then decline and the portable path runs.
    #[inline(always)]
    pub fn of<T: Element>(xs: &'a mut [T]) -> Option<FloatsMut<'a>> {
        match T::DTYPE {
            DType::F32 => bytemuck::try_cast_slice_mut(xs).ok().map(FloatsMut::F32),
            DType::BF16 => bytemuck::try_cast_slice_mut(xs).ok().map(FloatsMut::Bf16),
            DType::F16 => bytemuck::try_cast_slice_mut(xs).ok().map(FloatsMut::F16),
            DType::U8 | DType::I32 => None,
        }
    }
}

/// Writes f32 values into `dst` through `fill`: `fill` writes `dst` itself when it is
/// f32 (no copy), otherwise `scratch` (same length), which is then narrowed into `dst`
/// (round to nearest even). The output-side twin of [`widened`]: decode loops produce
/// f32 and call this once per L1-sized span.
///
/// ```
/// use half::bf16;
/// use quant_core::narrowed;
/// let mut scratch = [0f32; 2];
/// let mut out = [0f32; 2];
/// narrowed(&mut out, &mut scratch, |o| o.copy_from_slice(&[1.5, -3.0]));
/// assert_eq!(out, [1.5, -3.0]);
/// let mut out = [bf16::ZERO; 2];
/// narrowed(&mut out, &mut scratch, |o| o.copy_from_slice(&[1.5, -3.0]));
/// assert_eq!(out, [bf16::from_f32(1.5), bf16::from_f32(-3.0)]);
/// ```
#[inline(always)]
pub fn narrowed<T: Element>(dst: &mut [T], scratch: &mut [f32], fill: impl FnOnce(&mut [f32])) {
    if T::DTYPE == DType::F32
        && let Ok(f) = bytemuck::try_cast_slice_mut::<T, f32>(dst)
    {
        return fill(f);
    }
    fill(scratch);
    T::narrow_slice(scratch, dst);
}

/// f64 -> f32 *rounded to odd*: exact when representable, otherwise the value truncated
/// toward zero with its last bit set. Rounding that result to nearest-even in any format
/// with at least two fewer significand bits (bf16, f16) is then one correct rounding of
/// the f64 (the odd bit stands in for everything below f32 precision).
#[inline]
pub fn f64_to_f32_round_odd(v: f64) -> f32 {
    let f = v as f32;
    if f.is_nan() || f64::from(f) == v {
        return f;
    }
    let mut bits = f.to_bits();
    if f64::from(f).abs() > v.abs() {
        // Rounded away from zero (infinity included): step the magnitude back by one.
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use quantfmt_testkit::XorShift64;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            assert_eq!(DType::from_safetensors(d.to_safetensors()), Some(d));
        }
        assert!("f64".parse::<DType>().is_err());
    }

    #[test]
    fn bulk_conversions_equal_scalar_ones() {
        // Miri (scripts/miri.sh) interprets every step: sparser sweeps there.
        let stride = if cfg!(miri) { 251 } else { 1 };
        let bits: Vec<u16> = (0..=u16::MAX).step_by(stride).collect();
        let b: Vec<bf16> = bits.iter().map(|&x| bf16::from_bits(x)).collect();
        let h: Vec<f16> = bits.iter().map(|&x| f16::from_bits(x)).collect();
        let mut w = vec![0f32; bits.len()];
        bf16::widen_slice(&b, &mut w);
        for (x, y) in b.iter().zip(&w) {
            assert!(x.to_f32().to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
        }
        f16::widen_slice(&h, &mut w);
        for (x, y) in h.iter().zip(&w) {
            assert!(x.to_f32().to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
        }
        let f: Vec<f32> = (0..100_000u32)
            .step_by(stride)
            .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761)))
            .collect();
        let mut nb = vec![bf16::ZERO; f.len()];
        bf16::narrow_slice(&f, &mut nb);
        for (x, y) in f.iter().zip(&nb) {
            assert_eq!(bf16::from_f32(*x).to_bits(), y.to_bits(), "{x:e}");
        }
        // Every rounding boundary region: all f32 whose low 16 bits are near 0x8000.
        let edge: Vec<f32> = (0..=u16::MAX)
            .step_by(stride)
            .flat_map(|hi| {
                [0x7FFFu32, 0x8000, 0x8001]
                    .map(move |lo| f32::from_bits((u32::from(hi) << 16) | lo))
            })
            .collect();
        let mut ne = vec![bf16::ZERO; edge.len()];
        bf16::narrow_slice(&edge, &mut ne);
        for (x, y) in edge.iter().zip(&ne) {
            assert_eq!(
                bf16::from_f32(*x).to_bits(),
                y.to_bits(),
                "{:#010x}",
                x.to_bits()
            );
        }
        let mut nh = vec![f16::ZERO; f.len()];
        f16::narrow_slice(&f, &mut nh);
        for (x, y) in f.iter().zip(&nh) {
            assert!(
                f16::from_f32(*x).to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "{x:e}"
            );
        }
    }

    /// Exact round-to-nearest-even of a normal-range f64 to bf16, from the f64 bits.
    fn bf16_rne_reference(v: f64) -> u16 {
        let b = v.to_bits();
        let sign = ((b >> 63) as u16) << 15;
        let exp = ((b >> 52) & 0x7FF) as i64 - 1023 + 127;
        let mant = b & ((1u64 << 52) - 1);
        let (keep, rest) = (mant >> 45, mant & ((1u64 << 45) - 1));
        let half = 1u64 << 44;
        let up = rest > half || (rest == half && keep & 1 == 1);
        sign | (((exp as u64) << 7 | keep) + u64::from(up)) as u16
    }

    #[test]
    fn from_f64_rounds_once() {
        let v = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(<bf16 as Element>::from_f64(v).to_f32(), 1.007_812_5);
        let w = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(<f16 as Element>::from_f64(w).to_f32(), 1.0 + 2f32.powi(-10));
        let mut rng = XorShift64::new(0x1234_5678_9ABC_DEF1);
        for i in 0..200_000 {
            let s = rng.next_u64();
            // Values near bf16 ties: a bf16 midpoint nudged by a tiny f64-only amount.
            let base = f64::from(bf16::from_bits((s >> 48) as u16 & 0x7E7F | 0x0080).to_f32());
            let ulp = base.abs() * 2f64.powi(-8);
            let nudge = ((s & 0xFFFF) as f64 - 32768.0) * ulp * 2f64.powi(-40);
            let v = match i % 3 {
                0 => base + ulp / 2.0 + nudge,
                1 => base - ulp / 2.0 + nudge,
                _ => f64::from_bits(s & 0x47EF_FFFF_FFFF_FFFF | 0x3800_0000_0000_0000),
            };
            if v.abs() < 2f64.powi(-126) || v.abs() >= 2f64.powi(127) {
                continue;
            }
            assert_eq!(
                <bf16 as Element>::from_f64(v).to_bits(),
                bf16_rne_reference(v),
                "{v:e}"
            );
        }
        assert!(<bf16 as Element>::from_f64(f64::NAN).is_nan());
        assert_eq!(<bf16 as Element>::from_f64(1e300).to_f32(), f32::INFINITY);
        assert_eq!(<f16 as Element>::from_f64(-1e-300).to_bits(), 0x8000);
    }

    #[test]
    fn max_finite_matches_bits() {
        assert_eq!(bf16::MAX.to_f32(), <bf16 as Element>::MAX_FINITE);
        assert_eq!(f16::MAX.to_f32(), <f16 as Element>::MAX_FINITE);
    }
}
