//! AVX-512 forms of the scalar decoders: 16 codes, zero-extended into u32 lanes, per
//! call, bit for bit what [`super::e4m3::decode_fast`], [`super::e5m2::decode_fast`] and
//! [`super::e8m0::decode`] give (NaN bits included), with the same arithmetic: the
//! magnitude bits shifted into an f32 and rebiased by one exact multiply, NaN and
//! infinity patched in by compare masks, then the sign.
//!
//! The FP8 formats' run decoders share them, so every format decodes an element the
//! same way; the tests below check all 256 codes of each.
//!
//! Callable without `unsafe` from code compiled with AVX-512 F (a kernel under
//! [`crate::simd::dispatch`] at [`crate::simd::Level::Avx512`], or a function with that
//! target feature); elsewhere a call is `unsafe` and needs the CPU checked first.

// Kernel code: the tests call the decoders from code without the target feature.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512, __m512i, _mm512_and_si512, _mm512_castps_si512, _mm512_castsi512_ps,
    _mm512_cmpeq_epi32_mask, _mm512_cmpgt_epi32_mask, _mm512_mask_blend_ps, _mm512_mul_ps,
    _mm512_or_si512, _mm512_set1_epi32, _mm512_set1_ps, _mm512_slli_epi32,
};

/// E4M3 codes `c` (one per u32 lane, below 256) as f32: [`super::e4m3::decode_fast`].
///
/// # Safety
/// The CPU must have AVX-512 F (see the module's note on calling it safely).
#[inline]
#[target_feature(enable = "avx512f")]
pub fn e4m3_16(c: __m512i) -> __m512 {
    let mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
    // 2^(127 - 7): rebias the exponent field from 7 to 127 (exact).
    let v = _mm512_castsi512_ps(_mm512_slli_epi32::<20>(mag));
    let v = _mm512_mul_ps(v, _mm512_set1_ps(f32::from_bits(247 << 23)));
    let nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F));
    with_sign(c, _mm512_mask_blend_ps(nan, v, _mm512_set1_ps(f32::NAN)))
}

/// E5M2 codes `c` (one per u32 lane, below 256) as f32: [`super::e5m2::decode_fast`].
///
/// # Safety
/// The CPU must have AVX-512 F (see the module's note on calling it safely).
#[inline]
#[target_feature(enable = "avx512f")]
pub fn e5m2_16(c: __m512i) -> __m512 {
    let mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
    // 2^(127 - 15).
    let v = _mm512_castsi512_ps(_mm512_slli_epi32::<21>(mag));
    let v = _mm512_mul_ps(v, _mm512_set1_ps(f32::from_bits(239 << 23)));
    let inf = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7C));
    let nan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7C));
    let v = _mm512_mask_blend_ps(inf, v, _mm512_set1_ps(f32::INFINITY));
    with_sign(c, _mm512_mask_blend_ps(nan, v, _mm512_set1_ps(f32::NAN)))
}

/// E8M0 codes `c` (one per u32 lane, below 256) as f32: [`super::e8m0::decode`]
/// (`2^(c - 127)`; code 0 is the subnormal `2^-127`, code 255 NaN).
///
/// # Safety
/// The CPU must have AVX-512 F (see the module's note on calling it safely).
#[inline]
#[target_feature(enable = "avx512f")]
pub fn e8m0_16(c: __m512i) -> __m512 {
    let v = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(c));
    let zero = _mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(0));
    let nan = _mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(0xFF));
    let v = _mm512_mask_blend_ps(zero, v, _mm512_set1_ps(f32::from_bits(0x0040_0000)));
    _mm512_mask_blend_ps(nan, v, _mm512_set1_ps(f32::NAN))
}

/// `v` with the sign bit of each lane's code (bit 7) copied in.
#[inline]
#[target_feature(enable = "avx512f")]
fn with_sign(c: __m512i, v: __m512) -> __m512 {
    let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(c, _mm512_set1_epi32(0x80)));
    _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{e4m3, e5m2, e8m0};
    use crate::simd::Level;
    use std::arch::x86_64::_mm512_loadu_si512;

    /// Every code of each decoder against its scalar form, bits compared.
    #[test]
    fn every_code_decodes_as_the_scalar_form() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        type Pair = (unsafe fn(__m512i) -> __m512, fn(u8) -> f32, &'static str);
        let pairs: [Pair; 3] = [
            (e4m3_16, e4m3::decode_fast, "e4m3"),
            (e5m2_16, e5m2::decode_fast, "e5m2"),
            (e8m0_16, e8m0::decode, "e8m0"),
        ];
        for (vector, scalar, name) in pairs {
            for base in (0..256).step_by(16) {
                let codes: [u32; 16] = std::array::from_fn(|i| base + i as u32);
                // SAFETY: the CPU has AVX-512 F (checked above); `codes` is 16 u32 (one
                // unaligned 512-bit load); both sides of the transmute are 64 bytes of
                // plain data.
                let got = unsafe {
                    let c = _mm512_loadu_si512(codes.as_ptr().cast());
                    std::mem::transmute::<__m512, [f32; 16]>(vector(c))
                };
                for (i, g) in got.iter().enumerate() {
                    let code = codes[i] as u8;
                    let want = scalar(code);
                    assert_eq!(g.to_bits(), want.to_bits(), "{name} code {code:#04x}");
                }
            }
        }
    }
}
