//! AVX-512 forms of the scalar FP8 codecs, 16 values per call.
//!
//! The decoders take codes zero-extended into u32 lanes and give bit for bit what
//! [`super::e4m3::decode_fast`], [`super::e5m2::decode_fast`] and [`super::e8m0::decode`]
//! give (NaN bits included), with the same arithmetic: the magnitude bits shifted into
//! an f32 and rebiased by one exact multiply, NaN and infinity patched in by compare
//! masks, then the sign. The encoder ([`fp8_16`]) runs the integer steps of the scalar
//! encoders ([`super::e4m3::encode`], [`super::e5m2::encode`]) lane by lane.
//!
//! The FP8 formats' run kernels share them, so every format codes an element the same
//! way; the tests below check all 256 codes of each decoder and a sweep of f32 patterns
//! through the encoder.
//!
//! Callable without `unsafe` from code compiled with AVX-512 F (a kernel under
//! [`crate::simd::dispatch`] at [`crate::simd::Level::Avx512`], or a function with that
//! target feature); elsewhere a call is `unsafe` and needs the CPU checked first.

// Kernel code: the tests call the decoders from code without the target feature.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512, __m512i, _mm_cvtsi32_si128, _mm512_add_epi32, _mm512_add_ps, _mm512_and_si512,
    _mm512_castps_si512, _mm512_castsi512_ps, _mm512_cmpeq_epi32_mask, _mm512_cmpgt_epi32_mask,
    _mm512_cmpgt_epu32_mask, _mm512_cmplt_epu32_mask, _mm512_mask_blend_epi32,
    _mm512_mask_blend_ps, _mm512_mask_mov_epi32, _mm512_min_epu32, _mm512_mul_ps, _mm512_or_si512,
    _mm512_set1_epi32, _mm512_set1_ps, _mm512_slli_epi32, _mm512_srl_epi32, _mm512_srli_epi32,
    _mm512_sub_epi32, _mm512_ternarylogic_epi32,
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

/// The FP8 codes of 16 f32 lanes, in u32 lanes: [`super::e4m3::encode`] with
/// `MBITS = 3, BIAS = 7` and `max_code` [`super::e4m3::MAX_CODE`],
/// [`super::e5m2::encode`] with `2, 15` and [`super::e5m2::MAX_CODE`]. Round to nearest
/// even, saturating to `max_code`, NaN to `0x7F`, the sign copied (a product that rounds
/// to zero keeps it), by the scalar encoders' steps: a normal target rounded on the
/// rebased integer bits, a subnormal one by the exact `|x| * 2^(BIAS - 1 + MBITS)` plus
/// `2^23` (each rounded once, never fused).
///
/// # Safety
/// The CPU must have AVX-512 F (see the module's note on calling it safely).
#[inline]
#[target_feature(enable = "avx512f")]
pub fn fp8_16<const MBITS: u32, const BIAS: i32>(x: __m512, max_code: u8) -> __m512i {
    let shift = 23 - MBITS;
    let bits = _mm512_castps_si512(x);
    let abits = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFF_FFFF));
    // Normal targets: rebase the exponent, round to nearest even on the integer.
    let n = _mm512_sub_epi32(abits, _mm512_set1_epi32((127 - BIAS) << 23));
    let lsb = _mm512_and_si512(srl(n, shift), _mm512_set1_epi32(1));
    let half = _mm512_set1_epi32((1 << (shift - 1)) - 1);
    let norm = srl(_mm512_add_epi32(_mm512_add_epi32(n, half), lsb), shift);
    // Subnormal targets: the exact product plus 2^23 rounds in the float unit.
    let up = f32::from_bits(((127 + BIAS - 1 + MBITS as i32) as u32) << 23);
    let sub = _mm512_add_ps(
        _mm512_mul_ps(_mm512_castsi512_ps(abits), _mm512_set1_ps(up)),
        _mm512_set1_ps(8_388_608.0),
    );
    let sub = _mm512_sub_epi32(_mm512_castps_si512(sub), _mm512_set1_epi32(0x4B00_0000));
    let small = _mm512_cmplt_epu32_mask(abits, _mm512_set1_epi32((128 - BIAS) << 23));
    let code = _mm512_min_epu32(
        _mm512_mask_blend_epi32(small, norm, sub),
        _mm512_set1_epi32(i32::from(max_code)),
    );
    // code | ((bits >> 24) & 0x80), then NaN -> 0x7F.
    let code = _mm512_ternarylogic_epi32::<0xF8>(
        code,
        _mm512_srli_epi32::<24>(bits),
        _mm512_set1_epi32(0x80),
    );
    _mm512_mask_mov_epi32(
        code,
        _mm512_cmpgt_epu32_mask(abits, _mm512_set1_epi32(0x7F80_0000)),
        _mm512_set1_epi32(0x7F),
    )
}

/// `v >> shift` in each u32 lane, `shift` a constant of the caller's.
#[inline]
#[target_feature(enable = "avx512f")]
fn srl(v: __m512i, shift: u32) -> __m512i {
    _mm512_srl_epi32(v, _mm_cvtsi32_si128(shift as i32))
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

    /// A strided sweep of the f32 patterns (every exponent, both signs, the low
    /// mantissa bits that decide ties; infinities and NaN) through the encoder,
    /// against the scalar encoders.
    #[test]
    fn f32_patterns_encode_as_the_scalar_form() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let mut xs: Vec<f32> = (0..(1u64 << 32))
            .step_by(65_537)
            .map(|b| f32::from_bits(b as u32))
            .collect();
        xs.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.0,
            -0.0,
            464.0,
            480.0,
        ]);
        xs.resize(xs.len().next_multiple_of(16), 1.0);
        for v in xs.chunks_exact(16) {
            // SAFETY: the CPU has AVX-512 F (checked above); `v` is 16 f32 (one
            // unaligned 512-bit load); both sides of the transmute are 64 bytes of
            // plain data.
            let (e4, e5) = unsafe {
                let x = std::arch::x86_64::_mm512_loadu_ps(v.as_ptr());
                (
                    std::mem::transmute::<__m512i, [u32; 16]>(fp8_16::<3, 7>(x, e4m3::MAX_CODE)),
                    std::mem::transmute::<__m512i, [u32; 16]>(fp8_16::<2, 15>(x, e5m2::MAX_CODE)),
                )
            };
            for (i, &x) in v.iter().enumerate() {
                assert_eq!(
                    e4[i],
                    u32::from(e4m3::encode(x)),
                    "e4m3 {:#010x}",
                    x.to_bits()
                );
                assert_eq!(
                    e5[i],
                    u32::from(e5m2::encode(x)),
                    "e5m2 {:#010x}",
                    x.to_bits()
                );
            }
        }
    }

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
