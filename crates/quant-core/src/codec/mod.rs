//! Bit-exact scalar codecs for the element and scale types of every recipe.
//!
//! These are the specification in code: each function reproduces, bit for bit, the
//! conversion the vendor kernels perform (CUDA's `__nv_cvt_float_to_fp8` with
//! `__NV_SATFINITE`, PTX `cvt.rn.satfinite.e2m1x2.f32`, TransformerEngine's
//! `float_to_e8m0`). Fast paths elsewhere must agree with them on every input.
//!
//! | codec | bits | max finite | smallest subnormal | specials |
//! |---|---|---|---|---|
//! | [`e4m3`] | s1 e4 m3, bias 7 | 448 (`0x7E`) | 2^-9 | NaN `0x7F`/`0xFF`, no inf |
//! | [`e5m2`] | s1 e5 m2, bias 15 | 57344 (`0x7B`) | 2^-16 | inf `0x7C`, NaN `0x7D..0x7F` |
//! | [`e8m0`] | exponent only, bias 127 | 2^127 (`0xFE`) | 2^-127 (`0x00`) | NaN `0xFF` |
//! | [`e2m1`] | s1 e2 m1 | 6 (code 7) | 0.5 | none |
//!
//! Never use the `float8` crate's `MAX`/`INFINITY` constants for scale math: they are
//! 416 and 448 for E4M3 (the real max is 448).

pub mod e2m1;
pub mod e4m3;
pub mod e5m2;
pub mod e8m0;
pub mod folded;
mod fp8;
pub mod pow2;
#[cfg(target_arch = "x86_64")]
pub mod scaled_avx2;
#[cfg(target_arch = "x86_64")]
pub mod scaled_avx512;
#[cfg(target_arch = "x86_64")]
pub mod x86;

/// The scale of each value of a run: one for the whole run (a tensor scale, a block's
/// scale over its values) or one per value (per-column scales along a row). The FP8
/// encoders ([`scaled_avx2`], [`scaled_avx512`]) and the FP8 recipe's decoders take it.
///
/// ```
/// use quant_core::codec::Scale;
/// let each = [1.0f32, 2.0, 3.0];
/// assert_eq!(Scale::Each(&each).cut(1..3).at(0), 2.0);
/// assert_eq!(Scale::One(0.5).at(7), 0.5);
/// assert!(Scale::One(0.5).fit(9) && !Scale::Each(&each).fit(2));
/// ```
#[derive(Clone, Copy, Debug)]
pub enum Scale<'a> {
    /// One for the whole run.
    One(f32),
    /// One per value (as many as the values).
    Each(&'a [f32]),
}

impl<'a> Scale<'a> {
    /// The scale of value `i`. Panics if per-value scales have no `i`-th.
    #[inline(always)]
    pub fn at(self, i: usize) -> f32 {
        match self {
            Scale::One(s) => s,
            Scale::Each(s) => s[i],
        }
    }

    /// The scales of values `r` of the run (one scale serves every part of it). Panics
    /// if per-value scales do not cover `r`.
    #[inline(always)]
    pub fn cut(self, r: std::ops::Range<usize>) -> Scale<'a> {
        match self {
            Scale::Each(s) => Scale::Each(&s[r]),
            one => one,
        }
    }

    /// Whether these scales serve a run of `len` values: one scale serves any run,
    /// per-value scales must be as many as the values.
    #[inline(always)]
    pub fn fit(self, len: usize) -> bool {
        match self {
            Scale::One(_) => true,
            Scale::Each(s) => s.len() == len,
        }
    }
}

/// Correctly rounded `1/x` in f32 (IEEE division, as `__frcp_rn` and `1.0f/x` compute it).
#[inline]
pub fn rcp(x: f32) -> f32 {
    1.0 / x
}

/// `2^n` for `n` in `-149..=127`, built from its bits. Tests use this rather than
/// `powi`, whose precision Rust does not guarantee (Miri models that freedom with random
/// ULP errors, so exact comparisons against `powi` fail under `scripts/miri.sh`).
#[cfg(test)]
pub(crate) fn pow2(n: i32) -> f32 {
    if n >= -126 {
        f32::from_bits(((n + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (n + 149))
    }
}
