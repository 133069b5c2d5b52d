//! FP8 decoding with the scale folded into the rebias: one multiply per value.
//!
//! A code's magnitude bits shifted into place in an f32 (`(code & 0x7F) << 20` for
//! E4M3, `<< 21` for E5M2: the top of the mantissa and the bottom of the exponent
//! field) are a float whose value is the code's divided by [`rebias`], `2^(127 -
//! bias)`, exactly: a normal f32 for a normal code, a subnormal one for a subnormal
//! code. So `decode(code) * s`, one IEEE product, is the product of that float and `s *
//! rebias` wherever `s * rebias` is itself exact (finite: it scales by a power of two
//! and cannot underflow), since both products round the same real number once. Zeros'
//! signs agree too. The decoders of both FP8 recipes use it at AVX2: the portable
//! decode's rebias step and its NaN and infinity patches cost 10 operations per 8
//! codes, this 4 (sign-extend, shift, mask, multiply).
//!
//! It covers every code but the special ones ([`has_special`]), which a decoder sends to
//! its general loop. With the special codes and non-finite folded scales both excluded,
//! no product is NaN, so a bf16 narrowing after it may leave out its NaN select
//! ([`crate::bf16_narrow::avx2::narrow16_no_nan`]).
//!
//! ```
//! use quant_core::codec::{e4m3, folded, pow2::Fp8};
//! let (code, s) = (0xB5u8, 0.37f32); // -0.3125 * 0.37
//! let unbiased = f32::from_bits(((code as u32 & 0x80) << 24) | ((code as u32 & 0x7F) << 20));
//! let want = e4m3::decode_fast(code) * s;
//! assert_eq!((unbiased * (s * folded::rebias(Fp8::E4M3))).to_bits(), want.to_bits());
//! assert!(!folded::has_special(Fp8::E4M3, &[code]) && folded::has_special(Fp8::E4M3, &[0xFF]));
//! ```

use super::pow2::Fp8;

/// `2^(127 - bias)`: `2^120` for E4M3, `2^112` for E5M2 (module docs).
#[inline(always)]
pub fn rebias(codec: Fp8) -> f32 {
    f32::from_bits(((254 - codec.bias()) as u32) << 23)
}

/// Whether a code of `codes` decodes to NaN or an infinity (a magnitude above the
/// largest finite code: E4M3 `0x7F`, E5M2 `0x7C` and up), which the folded decode does
/// not patch. A fold, not `any`: no early exit, so it vectorizes (`vpmaxub`).
#[inline(always)]
pub fn has_special(codec: Fp8, codes: &[u8]) -> bool {
    codes.iter().fold(0, |m, &c| m.max(c & 0x7F)) > codec.max_code()
}

/// The AVX2 form.
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    // Kernel code: the tests call it from code without the target feature.
    #![allow(unsafe_code)]

    use std::arch::x86_64::{
        __m128i, __m256, _mm256_and_si256, _mm256_castsi256_ps, _mm256_cvtepi8_epi32,
        _mm256_set1_epi32, _mm256_slli_epi32,
    };

    use super::Fp8;

    /// The 8 codes in the low bytes of `c` as f32 divided by [`super::rebias`]: each
    /// sign-extended to 32 bits and shifted so that its magnitude bits sit at the top of
    /// the mantissa and the bottom of the exponent field, then masked to those bits and
    /// the sign (the extension's other copies of the sign cleared). Exact for every code
    /// that is not special ([`super::has_special`]).
    ///
    /// Call it from a function that enables AVX2 (it then inlines, and with a constant
    /// `codec` the shift is an immediate).
    ///
    /// # Safety
    /// The CPU must have AVX2 (a caller without it enabled needs `unsafe` and a run-time
    /// check).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn unbiased_8(codec: Fp8, c: __m128i) -> __m256 {
        let wide = _mm256_cvtepi8_epi32(c);
        // Immediate shifts (E4M3 20, E5M2 21), so that a constant `codec` leaves one.
        let (placed, shift) = match codec.mbits() {
            3 => (_mm256_slli_epi32::<20>(wide), 20),
            _ => (_mm256_slli_epi32::<21>(wide), 21),
        };
        debug_assert_eq!(shift, 23 - codec.mbits());
        let mask: u32 = 0x8000_0000 | (0x7F << shift);
        _mm256_castsi256_ps(_mm256_and_si256(placed, _mm256_set1_epi32(mask as i32)))
    }
}

#[cfg(test)]
#[allow(unsafe_code)] // the AVX2 check transmutes plain vectors
mod tests {
    use super::*;
    use crate::codec::{e4m3, e5m2};

    /// Every code of both types: special exactly where the portable decode is not
    /// finite, and otherwise, at AVX2, the unbiased value times the rebias is the
    /// portable decode, bit for bit (signed zeros and subnormals included).
    #[test]
    fn every_code_unbiases_to_its_value() {
        let codecs = [Fp8::E4M3, Fp8::E5M2];
        let decoders = [e4m3::decode_fast, e5m2::decode_fast];
        for (codec, decode) in codecs.into_iter().zip(decoders) {
            for c in 0..=255u8 {
                assert_eq!(
                    has_special(codec, &[c]),
                    !decode(c).is_finite(),
                    "{codec:?} {c:#04x}"
                );
            }
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::x86_64::__m128i;
                if !crate::simd::Level::Avx2.is_supported() {
                    eprintln!("note: no AVX2 on this CPU: skipped");
                    return;
                }
                for first in (0..=255u8).step_by(8) {
                    let codes: [u8; 16] = std::array::from_fn(|i| first.wrapping_add(i as u8));
                    // SAFETY: 16 bytes are one 128-bit vector, 8 f32 one 256-bit vector,
                    // both plain data; the CPU has AVX2 (checked above).
                    let got: [f32; 8] = unsafe {
                        let c = std::mem::transmute::<[u8; 16], __m128i>(codes);
                        std::mem::transmute(avx2::unbiased_8(codec, c))
                    };
                    for (i, g) in got.iter().enumerate() {
                        let c = codes[i];
                        if has_special(codec, &[c]) {
                            continue;
                        }
                        let v = g * rebias(codec);
                        assert_eq!(v.to_bits(), decode(c).to_bits(), "{codec:?} {c:#04x}");
                    }
                }
            }
        }
    }
}
