//! NVFP4's two-level scale arithmetic, in TransformerEngine's exact fp32 operation order.
//!
//! Every function here is one line of a TE kernel (`common/cast/nvfp4/core_nvfp4.cuh`,
//! `quantize_transpose_nvfp4.cuh`, `specialized/quantize_transpose_nvfp4_tuned_1D.cuh`,
//! `common/transpose/quantize_transpose_vector_blockwise_fp4.cu`,
//! `quantize_4over6_nvfp4.cuh`, `dequantize_nvfp4.cuh`). All arithmetic is IEEE binary32
//! with round-to-nearest-even (TE builds these kernels without fast math), and the
//! parenthesisation is part of the contract: `block_amax * (S_enc * (1/6))` and
//! `(block_amax / 6) * S_enc` differ in the last bit for some inputs, and that bit can
//! change the E4M3 block scale.
//!
//! ```text
//! S_enc = fminf(E4M3_MAX * 6 / amax, FLT_MAX); if amax == 0 || S_enc == 0 { S_enc = 1 }
//! S_dec = 1 / S_enc
//! sdb   = e4m3(fminf(block_amax * (S_enc * f32(1/6)), FLT_MAX))      // the stored scale
//! enc   = fminf(1 / (f32(sdb) * S_dec), FLT_MAX)                     // per-block multiplier
//! q_i   = e2m1(x_i * enc)
//! x'_i  = e2m1_value(q_i) * ((f32(sdb) * amax) * f32(1 / (6 * E4M3_MAX)))   // dequantize
//! ```
//!
//! ```
//! use fmt_nvfp4::scale;
//! assert_eq!(scale::global_encode_scale(2688.0, 448), 1.0);
//! assert_eq!(scale::global_encode_scale(0.0, 448), 1.0);            // all-zero tensor
//! assert_eq!(scale::global_encode_scale(f32::INFINITY, 448), 1.0);  // 2688/inf = 0 -> 1
//! assert_eq!(scale::global_encode_scale(f32::NAN, 448), f32::MAX);  // fminf(NaN, MAX) = MAX
//! assert_eq!(scale::RCP_6.to_bits(), 0x3E2A_AAAB);
//! assert_eq!(scale::dequant_rcp(448).to_bits(), 0x39C3_0C31);
//! ```

use quant_core::codec::e4m3;

/// `float(1/6)` as the kernels fold it into the global multiplier: bits `0x3E2AAAAB`.
pub const RCP_6: f32 = 1.0 / 6.0;

/// E2M1's largest magnitude.
pub const FP4_MAX: f32 = 6.0;

/// Elements per block (one E4M3 scale per 16 consecutive elements of a row).
pub const BLOCK: usize = 16;

/// The global encode scale `S_enc` for a tensor (or row) amax.
///
/// `e4m3_max` is 448, or 256 for 4over6 tensors that leave head room for the 1.5x
/// map-to-4 scale. `fminf` semantics: a NaN quotient (NaN amax) gives `FLT_MAX`.
#[inline]
pub fn global_encode_scale(amax: f32, e4m3_max: u16) -> f32 {
    let s = (f32::from(e4m3_max) * FP4_MAX) / amax;
    let s = s.min(f32::MAX); // f32::min returns the non-NaN operand, as fminf does
    if amax == 0.0 || s == 0.0 { 1.0 } else { s }
}

/// `S_dec = 1 / S_enc` (IEEE division; TE's `double` variant rounds to the same float
/// because a correctly rounded 53-bit quotient never double-rounds for 24-bit operands).
#[inline]
pub fn global_decode_scale(s_enc: f32) -> f32 {
    1.0 / s_enc
}

/// The stored E4M3 block scale for a block whose NaN-ignoring amax is `block_amax`:
/// `e4m3(fminf(block_amax * (S_enc * (1/6)), FLT_MAX))`. A block whose scale
/// underflows E4M3 (below 2^-10) stores code `0x00`.
#[inline]
pub fn block_scale_code(block_amax: f32, s_enc: f32) -> u8 {
    let multiplier = s_enc * RCP_6;
    e4m3::encode((block_amax * multiplier).min(f32::MAX))
}

/// The per-block encode multiplier `fminf(1 / (float(sdb) * S_dec), FLT_MAX)`. A zero
/// block scale gives `FLT_MAX`: every nonzero element of such a block saturates to ±6
/// (it still dequantizes to zero because the stored scale is zero).
#[inline]
pub fn block_encode_scale(sdb: u8, s_dec: f32) -> f32 {
    (1.0 / (e4m3::decode(sdb) * s_dec)).min(f32::MAX)
}

/// `f32(1 / (6 * e4m3_max))`, the dequantize constant (`0x39C30C31` for 448).
#[inline(always)]
pub fn dequant_rcp(e4m3_max: u16) -> f32 {
    1.0 / (FP4_MAX * f32::from(e4m3_max))
}

/// The dequantize factor of one block: `(float(sdb) * amax) * f32(1/(6*E4M3_MAX))`.
/// TE uses the stored amax here, not `S_dec`.
///
/// TE's f32 product `float(sdb) * amax` overflows when the amax is within a factor of 448
/// of `f32::MAX` (a finite input near the top of the f32 range), and the infinite factor
/// then turns every zero code into NaN (`0 * inf`): found by the regression test of a
/// fuzz finding (`crates/quantfmt/tests/fuzz_regressions.rs`).
/// quantfmt keeps TE's f32 arithmetic wherever it gives a finite factor (so results stay
/// bit-exact) and only then recomputes the same expression in f64, which is finite for
/// every finite amax (the factor is at most `amax / 6`). An infinite amax keeps TE's
/// result.
#[inline(always)]
pub fn dequant_factor(sdb: u8, amax: f32, e4m3_max: u16) -> f32 {
    dequant_factor_with(sdb, amax, dequant_rcp(e4m3_max))
}

/// [`dequant_factor`] with its constant `rcp = dequant_rcp(e4m3_max)` computed by the
/// caller (once per tensor rather than once per block).
///
/// ```
/// use fmt_nvfp4::scale::{dequant_factor, dequant_factor_with, dequant_rcp};
/// let rcp = dequant_rcp(448);
/// assert_eq!(dequant_factor_with(0x38, 2688.0, rcp), dequant_factor(0x38, 2688.0, 448));
/// ```
#[inline(always)]
pub fn dequant_factor_with(sdb: u8, amax: f32, rcp: f32) -> f32 {
    let f = (e4m3::decode(sdb) * amax) * rcp;
    if f.is_finite() || !amax.is_finite() {
        f
    } else {
        ((f64::from(e4m3::decode(sdb)) * f64::from(amax)) * f64::from(rcp)) as f32
    }
}

/// `fmaxf(m, a)` for an accumulator `m >= 0`: a NaN `a` loses, as with CUDA's `fmaxf`,
/// `__hmax` and `max.xorsign.abs` (which every NVFP4 amax reduction uses). The shared
/// [`quant_core::cpu::fmax_nan_loses`] under the name the NVFP4 specification uses.
pub use quant_core::cpu::fmax_nan_loses as fmax_ignore_nan;

/// NaN-ignoring `max |x|`, starting from 0.
#[inline]
pub fn amax_of(xs: impl IntoIterator<Item = f32>) -> f32 {
    xs.into_iter()
        .fold(0.0f32, |m, v| fmax_ignore_nan(m, v.abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_have_the_kernel_bits() {
        assert_eq!(RCP_6.to_bits(), 0x3E2A_AAAB);
        assert_eq!(dequant_rcp(448).to_bits(), 0x39C3_0C31);
        assert_eq!(dequant_rcp(256), (1.0f64 / 1536.0) as f32);
    }

    #[test]
    fn global_scale_edges() {
        assert_eq!(global_encode_scale(1e-45, 448), f32::MAX);
        assert_eq!(global_encode_scale(1536.0, 256), 1.0);
        assert_eq!(global_encode_scale(-0.0, 448), 1.0);
    }

    #[test]
    fn zero_block_scale_saturates_the_multiplier() {
        assert_eq!(block_scale_code(0.0, 1.0), 0);
        assert_eq!(block_encode_scale(0, 1.0), f32::MAX);
        // 2^-11 * 1 * (1/6) underflows E4M3 (smallest subnormal 2^-9, half of it 2^-10).
        assert_eq!(block_scale_code(f32::from_bits(116 << 23) * 6.0, 1.0), 0);
        assert_eq!(block_scale_code(f32::INFINITY, 1.0), 0x7E);
    }

    #[test]
    fn dequant_factor_stays_finite_for_a_finite_amax() {
        assert_eq!(
            dequant_factor(0x7E, 3.0, 448).to_bits(),
            ((448.0f32 * 3.0) * dequant_rcp(448)).to_bits()
        );
        let f = dequant_factor(0x7E, f32::MAX, 448);
        assert!(f.is_finite() && f > 0.0, "{f}");
        assert!((f64::from(f) - f64::from(f32::MAX) / 6.0).abs() < 1e-6 * f64::from(f));
        assert!(dequant_factor(0x7E, f32::INFINITY, 448).is_infinite());
    }

    #[test]
    fn amax_ignores_nan() {
        assert_eq!(amax_of([1.0, f32::NAN, -3.0]), 3.0);
        assert_eq!(amax_of([f32::NAN]), 0.0);
        assert_eq!(amax_of([f32::NEG_INFINITY]), f32::INFINITY);
    }
}
