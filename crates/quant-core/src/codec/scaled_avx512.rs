//! The AVX-512 FP8 encoder of scaled values: `dst[i] = fp8(x[i] * s)`, 64 values per
//! step, under one scale for the run or one scale per value: the AVX-512 twin of
//! [`super::scaled_avx2`], with the same functions, the same arguments and the same
//! codes.
//!
//! Each lane runs the steps of the portable encoder through [`super::x86::fp8_16`] (the
//! same integer operations and the same two float operations, each rounded once), so
//! the codes are the same bits. The 64 codes of a step are narrowed to bytes by two
//! `vpackusdw` and one `vpackuswb`, and one `vpermd` puts their dwords in order: one
//! store.
//!
//! Why not the compiler's: at AVX-512 LLVM vectorizes the portable loop well on f32 and
//! bf16 bits, but f16 input has no widening it can vectorize (`half` converts one value
//! at a time), so the FP8 recipes widened f16 into a scratch span first and encoded
//! that: a store and a reload per value, and the widening loop itself, about a tenth of
//! the per-tensor FP8 quantize from f16. Here `vcvtph2ps` widens in the register.

// Kernel code.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512, __m512i, _CMP_NEQ_UQ, _mm256_loadu_si256, _mm512_castsi512_ps, _mm512_cmp_ps_mask,
    _mm512_cvtepu16_epi32, _mm512_cvtph_ps, _mm512_loadu_ps, _mm512_maskz_mov_epi32, _mm512_mul_ps,
    _mm512_packus_epi16, _mm512_packus_epi32, _mm512_permutexvar_epi32, _mm512_set1_ps,
    _mm512_setr_epi32, _mm512_setzero_ps, _mm512_slli_epi32, _mm512_storeu_si512,
};

use super::pow2::Fp8;
use super::scaled_avx2::encode_tail;
use super::x86::fp8_16;
use super::{Scale, e4m3, e5m2};
use crate::simd::Level;

/// `dst[i] = fp8(src[i] * scale_i)` for f32 `src` ([`e4m3::encode`] or
/// [`e5m2::encode`] of the product), as [`super::scaled_avx2::encode_f32`]: with
/// `plus_zero`, a zero input (of either sign) gives `+0`; a nonzero product that rounds
/// to zero keeps its sign either way. Returns `false`, with nothing written, unless the
/// CPU has AVX-512 (F and BW) and `dst` (and per-value scales) are as long as `src`;
/// the caller then runs its portable loop.
///
/// ```
/// use quant_core::codec::e4m3;
/// use quant_core::codec::pow2::Fp8;
/// use quant_core::codec::Scale;
/// use quant_core::codec::scaled_avx512::encode_f32;
/// let src: Vec<f32> = (0..100).map(|i| i as f32 * 0.37 - 17.0).collect();
/// let scales: Vec<f32> = (0..100).map(|i| 1.0 + i as f32).collect();
/// let mut dst = [0u8; 100];
/// if encode_f32(Fp8::E4M3, &src, Scale::Each(&scales), false, &mut dst) {
///     for ((&d, &x), &s) in dst.iter().zip(&src).zip(&scales) {
///         assert_eq!(d, e4m3::encode(x * s));
///     }
/// }
/// ```
#[inline(always)]
pub fn encode_f32(
    fp8: Fp8,
    src: &[f32],
    scale: Scale<'_>,
    plus_zero: bool,
    dst: &mut [u8],
) -> bool {
    // SAFETY: `encode` loads only where the CPU has the AVX-512 level.
    let load = |j| unsafe { load_f32(src, j) };
    encode(fp8, (src.len(), scale, plus_zero), dst, load, |i| src[i])
}

/// [`encode_f32`] of bf16 values given as bits, each widened exactly in the register (a
/// zero extension and a shift).
///
/// ```
/// use quant_core::codec::e5m2;
/// use quant_core::codec::pow2::Fp8;
/// use quant_core::codec::Scale;
/// use quant_core::codec::scaled_avx512::encode_bf16;
/// let bf16 = |v: f32| half::bf16::from_f32(v).to_bits();
/// let src: Vec<u16> = (0..100u16).map(|i| bf16(f32::from(i) - 50.0)).collect();
/// let mut dst = [0u8; 100];
/// if encode_bf16(Fp8::E5M2, &src, Scale::One(0.3), false, &mut dst) {
///     assert_eq!(dst[3], e5m2::encode(-47.0 * 0.3));
/// }
/// ```
#[inline(always)]
pub fn encode_bf16(
    fp8: Fp8,
    src: &[u16],
    scale: Scale<'_>,
    plus_zero: bool,
    dst: &mut [u8],
) -> bool {
    // SAFETY: `encode` loads only where the CPU has the AVX-512 level.
    let load = |j| unsafe { load_bf16(src, j) };
    let wide = |i: usize| crate::dtype::f32_from_bf16_bits(src[i]);
    encode(fp8, (src.len(), scale, plus_zero), dst, load, wide)
}

/// [`encode_f32`] of f16 values given as bits, each widened exactly in the register
/// (`vcvtph2ps`).
///
/// ```
/// use quant_core::codec::e4m3;
/// use quant_core::codec::pow2::Fp8;
/// use quant_core::codec::Scale;
/// use quant_core::codec::scaled_avx512::encode_f16;
/// let f16 = |v: f32| half::f16::from_f32(v).to_bits();
/// let src: Vec<u16> = (0..100u16).map(|i| f16(f32::from(i) * 0.1 - 5.0)).collect();
/// let mut dst = [0u8; 100];
/// if encode_f16(Fp8::E4M3, &src, Scale::One(3.0), false, &mut dst) {
///     let x = half::f16::from_bits(src[70]).to_f32();
///     assert_eq!(dst[70], e4m3::encode(x * 3.0));
/// }
/// ```
#[inline(always)]
pub fn encode_f16(
    fp8: Fp8,
    src: &[u16],
    scale: Scale<'_>,
    plus_zero: bool,
    dst: &mut [u8],
) -> bool {
    // SAFETY: `encode` loads only where the CPU has the AVX-512 level.
    let load = |j| unsafe { load_f16(src, j) };
    let wide = |i: usize| half::f16::from_bits(src[i]).to_f32();
    encode(fp8, (src.len(), scale, plus_zero), dst, load, wide)
}

/// Values per step.
const STEP: usize = 64;

/// The three encoders' body: where the CPU has the AVX-512 level and the lengths fit,
/// `len / 64` steps whose values `load(j)` gives in registers (it may use the level's
/// features: it runs only here), then the tail one `value(i)` at a time.
#[inline(always)]
fn encode(
    fp8: Fp8,
    (len, scale, plus_zero): (usize, Scale<'_>, bool),
    dst: &mut [u8],
    load: impl Fn(usize) -> [__m512; 4],
    value: impl Fn(usize) -> f32,
) -> bool {
    if !(Level::Avx512.is_supported() && dst.len() == len && scale.fit(len)) {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F and BW (`Level::Avx512` includes both) and the
    // lengths agree (checked above).
    unsafe { steps(fp8, len, scale, plus_zero, dst, load) };
    encode_tail(fp8, len / STEP * STEP, len, scale, plus_zero, dst, value);
    true
}

/// [`run`] with `fp8`'s mantissa bits, bias and largest code, and the `+0` rule as
/// constants. Not a `target_feature` function itself, so that it inlines into the
/// caller, where `fp8` and `plus_zero` are usually constants (the reason of
/// [`super::scaled_avx2`]'s twin).
///
/// # Safety
/// As for [`run`].
#[inline(always)]
unsafe fn steps(
    fp8: Fp8,
    len: usize,
    scale: Scale<'_>,
    plus_zero: bool,
    dst: &mut [u8],
    load: impl Fn(usize) -> [__m512; 4],
) {
    let (e4, e5) = (e4m3::MAX_CODE, e5m2::MAX_CODE);
    // SAFETY: the caller's promises are `run`'s.
    unsafe {
        match (fp8 == Fp8::E4M3, plus_zero) {
            (true, false) => scaled::<3, 7, false>(len, scale, dst, load, e4),
            (true, true) => scaled::<3, 7, true>(len, scale, dst, load, e4),
            (false, false) => scaled::<2, 15, false>(len, scale, dst, load, e5),
            (false, true) => scaled::<2, 15, true>(len, scale, dst, load, e5),
        }
    }
}

/// [`run`] with the scales as `scale` gives them: one broadcast, or loaded per step.
///
/// # Safety
/// As for [`run`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn scaled<const MBITS: u32, const BIAS: i32, const PLUS_ZERO: bool>(
    len: usize,
    scale: Scale<'_>,
    dst: &mut [u8],
    load: impl Fn(usize) -> [__m512; 4],
    max_code: u8,
) {
    // SAFETY: the caller's promises are `run`'s; per-value scales are as many as the
    // values (checked by `encode`).
    unsafe {
        match scale {
            Scale::One(s) => {
                let s = _mm512_set1_ps(s);
                run::<MBITS, BIAS, PLUS_ZERO>(len, |_| [s; 4], dst, load, max_code)
            }
            Scale::Each(s) => {
                run::<MBITS, BIAS, PLUS_ZERO>(len, |j| load_f32(s, j), dst, load, max_code)
            }
        }
    }
}

/// `src[j .. j + 64]` as four vectors of 16 f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn load_f32(src: &[f32], j: usize) -> [__m512; 4] {
    let s = &src[j..j + STEP];
    // SAFETY: `s` is 64 f32 (four unaligned 512-bit loads).
    unsafe { [0, 16, 32, 48].map(|o| _mm512_loadu_ps(s[o..].as_ptr())) }
}

/// `src[j .. j + 64]` (f16 bits) widened exactly into four vectors of 16 f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn load_f16(src: &[u16], j: usize) -> [__m512; 4] {
    let s = &src[j..j + STEP];
    // SAFETY: `s` is 64 u16 (four unaligned 256-bit loads).
    unsafe { [0, 16, 32, 48].map(|o| _mm512_cvtph_ps(_mm256_loadu_si256(s[o..].as_ptr().cast()))) }
}

/// `src[j .. j + 64]` (bf16 bits) widened into four vectors of 16 f32: each value
/// zero-extended into a 32-bit lane and shifted into the high half.
#[inline]
#[target_feature(enable = "avx512f")]
fn load_bf16(src: &[u16], j: usize) -> [__m512; 4] {
    let s = &src[j..j + STEP];
    // SAFETY: `s` is 64 u16 (four unaligned 256-bit loads).
    unsafe {
        [0, 16, 32, 48].map(|o| {
            let v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(s[o..].as_ptr().cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v))
        })
    }
}

/// Encodes `len / 64` steps of 64 values (`load(j)` gives values `j .. j + 64`, and
/// `scales(j)` their scales) into `dst`.
///
/// # Safety
/// The CPU must have AVX-512 F and BW (the AVX-512 level's, which every caller's loader
/// may use); `dst.len() >= len`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn run<const MBITS: u32, const BIAS: i32, const PLUS_ZERO: bool>(
    len: usize,
    scales: impl Fn(usize) -> [__m512; 4],
    dst: &mut [u8],
    load: impl Fn(usize) -> [__m512; 4],
    max_code: u8,
) {
    // After the packs, 128-bit lane `k` holds dwords `k` of the four code vectors in
    // turn: dword `4k + m` is vector `m`'s values `4k .. 4k + 4`.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (j, d) in (0..len / STEP * STEP)
        .step_by(STEP)
        .zip(dst.chunks_exact_mut(STEP))
    {
        let (x, s) = (load(j), scales(j));
        let c: [__m512i; 4] = std::array::from_fn(|i| {
            let code = fp8_16::<MBITS, BIAS>(_mm512_mul_ps(x[i], s[i]), max_code);
            if PLUS_ZERO {
                // A zero input (either sign) gives +0, whatever the scale (an infinite
                // or NaN one makes its product NaN): keep the code where it is not zero.
                let keep = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(x[i], _mm512_setzero_ps());
                _mm512_maskz_mov_epi32(keep, code)
            } else {
                code
            }
        });
        let w = _mm512_packus_epi16(
            _mm512_packus_epi32(c[0], c[1]),
            _mm512_packus_epi32(c[2], c[3]),
        );
        // SAFETY: `d` is 64 bytes (one unaligned 512-bit store).
        unsafe { _mm512_storeu_si512(d.as_mut_ptr().cast(), _mm512_permutexvar_epi32(order, w)) };
    }
}

#[cfg(test)]
mod tests {
    //! [`super::super::scaled_avx2`]'s checks, on this module's encoders.
    use super::*;
    use crate::codec::scaled_avx2::tests::{self as checks, Kernels};

    const AVX512: Kernels = Kernels {
        level: Level::Avx512,
        f32: encode_f32,
        bf16: encode_bf16,
        f16: encode_f16,
    };

    #[test]
    fn every_bf16_pattern_encodes_as_the_portable_encoder() {
        checks::bf16_patterns(&AVX512);
    }

    #[test]
    fn every_f16_pattern_encodes_as_the_portable_encoder() {
        checks::f16_patterns(&AVX512);
    }

    #[test]
    fn f32_patterns_encode_as_the_portable_encoder() {
        checks::f32_patterns(&AVX512);
    }

    #[test]
    fn plus_zero_flushes_zero_inputs_only() {
        checks::plus_zero_flushes(&AVX512);
    }

    #[test]
    fn mismatched_lengths_are_declined() {
        checks::lengths_that_disagree(&AVX512);
    }
}
