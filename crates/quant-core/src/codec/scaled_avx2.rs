//! The AVX2 FP8 encoder of scaled values: `dst[i] = fp8(x[i] * s)`, 32 values per step,
//! under one scale for the run or one scale per value (per-column scales: the
//! columnwise block recipes' encode of a row).
//!
//! Each lane runs the steps of the portable encoder (`encode_fast` of the FP8 codec
//! module, through [`super::e4m3::encode`] / [`super::e5m2::encode`]): the same integer
//! operations and the same two float operations (`|x| * 2^(BIAS - 1 + MBITS)`, then
//! `+ 2^23`, each rounded once: Rust never fuses them), so the codes are the same bits.
//! The 32 codes of a step are narrowed to bytes by two `vpackusdw`, one `vpackuswb` and
//! a `vpermd` that puts the 128-bit halves' dwords in order.
//!
//! Why not the compiler's: LLVM vectorizes the portable loop 8 values at a time,
//! narrows each 8 codes separately (no `vpmovdb` below AVX-512) and, short of
//! registers, reloads its constants inside the loop. The per-tensor FP8 quantize at
//! AVX2 spent a third of its time in that narrowing; the columnwise MXFP8 and FP8
//! 1x128 quantizes from f32, whose per-column scales the compiler's loop took as well,
//! about half in its encode.

// Kernel code.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256, __m256i, _CMP_EQ_OQ, _mm_cvtsi32_si128, _mm_loadu_si128, _mm256_add_epi32,
    _mm256_add_ps, _mm256_and_si256, _mm256_andnot_si256, _mm256_blendv_epi8, _mm256_castps_si256,
    _mm256_castsi256_ps, _mm256_cmp_ps, _mm256_cmpgt_epi32, _mm256_cvtph_ps, _mm256_loadu_ps,
    _mm256_loadu_si256, _mm256_min_epu32, _mm256_mul_ps, _mm256_or_si256, _mm256_packus_epi16,
    _mm256_packus_epi32, _mm256_permute4x64_epi64, _mm256_permutevar8x32_epi32, _mm256_set1_epi32,
    _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_ps, _mm256_setzero_si256, _mm256_srl_epi32,
    _mm256_srli_epi32, _mm256_storeu_si256, _mm256_sub_epi32, _mm256_unpackhi_epi16,
    _mm256_unpacklo_epi16,
};

use super::pow2::Fp8;
use super::{Scale, e4m3, e5m2};
use crate::simd::Level;

/// `dst[i] = fp8(src[i] * scale_i)` for f32 `src` ([`e4m3::encode`] or
/// [`e5m2::encode`] of the product). With `plus_zero`, a zero input (of either sign)
/// gives `+0`, as TE's `fma(x, s, +0)` does; a nonzero product that rounds to zero keeps
/// its sign either way. Returns `false`, with nothing written, unless the CPU has AVX2
/// and `dst` (and per-value scales) are as long as `src`; the caller then runs its
/// portable loop.
///
/// ```
/// use quant_core::codec::e4m3;
/// use quant_core::codec::pow2::Fp8;
/// use quant_core::codec::Scale;
/// use quant_core::codec::scaled_avx2::encode_f32;
/// let src: Vec<f32> = (0..40).map(|i| i as f32 * 0.37 - 7.0).collect();
/// let scales: Vec<f32> = (0..40).map(|i| 1.0 + i as f32).collect();
/// let mut dst = [0u8; 40];
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
    // SAFETY: `encode` loads only where the CPU has the AVX2 level.
    let load = |j| unsafe { load_f32(src, j) };
    encode(fp8, (src.len(), scale, plus_zero), dst, load, |i| src[i])
}

/// [`encode_f32`] of bf16 values given as bits, each widened exactly in the register.
///
/// ```
/// use quant_core::codec::e5m2;
/// use quant_core::codec::pow2::Fp8;
/// use quant_core::codec::Scale;
/// use quant_core::codec::scaled_avx2::encode_bf16;
/// let bf16 = |v: f32| half::bf16::from_f32(v).to_bits();
/// let src: Vec<u16> = (0..40u16).map(|i| bf16(f32::from(i) - 20.0)).collect();
/// let mut dst = [0u8; 40];
/// if encode_bf16(Fp8::E5M2, &src, Scale::One(0.3), false, &mut dst) {
///     assert_eq!(dst[3], e5m2::encode(-17.0 * 0.3));
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
    // SAFETY: `encode` loads only where the CPU has the AVX2 level.
    let load = |j| unsafe { load_bf16(src, j) };
    let wide = |i: usize| crate::dtype::f32_from_bf16_bits(src[i]);
    encode(fp8, (src.len(), scale, plus_zero), dst, load, wide)
}

/// [`encode_f32`] of f16 values given as bits, each widened exactly in the register
/// (`vcvtph2ps`). Before it, f16 input was widened into a scratch span first (a sixth of
/// the per-tensor FP8 quantize from f16 at AVX2).
///
/// ```
/// use quant_core::codec::e4m3;
/// use quant_core::codec::pow2::Fp8;
/// use quant_core::codec::Scale;
/// use quant_core::codec::scaled_avx2::encode_f16;
/// let f16 = |v: f32| half::f16::from_f32(v).to_bits();
/// let src: Vec<u16> = (0..40u16).map(|i| f16(f32::from(i) * 0.1 - 2.0)).collect();
/// let mut dst = [0u8; 40];
/// if encode_f16(Fp8::E4M3, &src, Scale::One(3.0), false, &mut dst) {
///     let x = half::f16::from_bits(src[7]).to_f32();
///     assert_eq!(dst[7], e4m3::encode(x * 3.0));
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
    // SAFETY: `encode` loads only where the CPU has the AVX2 level (with F16C).
    let load = |j| unsafe { load_f16(src, j) };
    let wide = |i: usize| half::f16::from_bits(src[i]).to_f32();
    encode(fp8, (src.len(), scale, plus_zero), dst, load, wide)
}

/// Values per step.
const STEP: usize = 32;

/// The three encoders' body: where the CPU has the AVX2 level and the lengths fit,
/// `len / 32` steps whose values `load(j)` gives in registers (it may use the level's
/// features: it runs only here), then the tail one `value(i)` at a time.
#[inline(always)]
fn encode(
    fp8: Fp8,
    (len, scale, plus_zero): (usize, Scale<'_>, bool),
    dst: &mut [u8],
    load: impl Fn(usize) -> [__m256; 4],
    value: impl Fn(usize) -> f32,
) -> bool {
    if !fits(len, scale, dst.len()) {
        return false;
    }
    // SAFETY: the CPU has AVX2 and F16C (`Level::Avx2` includes both) and the lengths
    // agree (`fits`).
    unsafe { steps(fp8, len, scale, plus_zero, dst, load) };
    encode_tail(fp8, len / STEP * STEP, len, scale, plus_zero, dst, value);
    true
}

/// Whether the CPU has AVX2 and a run of `len` values fits `scale` and `dst_len`.
#[inline(always)]
fn fits(len: usize, scale: Scale<'_>, dst_len: usize) -> bool {
    Level::Avx2.is_supported() && dst_len == len && scale.fit(len)
}

/// The values `from..to` one at a time, as the portable loop encodes them.
#[inline(always)]
pub(super) fn encode_tail(
    fp8: Fp8,
    from: usize,
    to: usize,
    scale: Scale<'_>,
    plus_zero: bool,
    dst: &mut [u8],
    value: impl Fn(usize) -> f32,
) {
    let enc = |v: f32| {
        if fp8 == Fp8::E4M3 {
            e4m3::encode(v)
        } else {
            e5m2::encode(v)
        }
    };
    for (i, d) in dst.iter_mut().enumerate().take(to).skip(from) {
        let x = value(i);
        let v = if plus_zero && x == 0.0 {
            0.0
        } else {
            x * scale.at(i)
        };
        *d = enc(v);
    }
}

/// [`run`] with `fp8`'s mantissa bits, bias and largest code, and the `+0` rule as a
/// constant (a branch per vector in the loop cost the per-tensor FP8 quantize about 6 %).
///
/// Not a `target_feature` function itself, so that it inlines into the caller, where
/// `fp8` and `plus_zero` are usually constants: only the [`scaled`] instance the call
/// needs is left, small enough to inline in turn. (A `target_feature` match over all
/// eight stayed out of line, and the per-tensor FP8 quantize lost 6 % to the call.)
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
    load: impl Fn(usize) -> [__m256; 4],
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
#[target_feature(enable = "avx2,f16c")]
unsafe fn scaled<const MBITS: u32, const BIAS: i32, const PLUS_ZERO: bool>(
    len: usize,
    scale: Scale<'_>,
    dst: &mut [u8],
    load: impl Fn(usize) -> [__m256; 4],
    max_code: u8,
) {
    // SAFETY: the caller's promises are `run`'s; per-value scales are as many as the
    // values (`fits`).
    unsafe {
        match scale {
            Scale::One(s) => {
                let s = _mm256_set1_ps(s);
                run::<MBITS, BIAS, PLUS_ZERO>(len, |_| [s; 4], dst, load, max_code)
            }
            Scale::Each(s) => {
                run::<MBITS, BIAS, PLUS_ZERO>(len, |j| load_f32(s, j), dst, load, max_code)
            }
        }
    }
}

/// `src[j .. j + 32]` as four vectors of 8 f32.
#[inline]
#[target_feature(enable = "avx2")]
fn load_f32(src: &[f32], j: usize) -> [__m256; 4] {
    let s = &src[j..j + STEP];
    // SAFETY: `s` is 32 f32 (four unaligned 256-bit loads).
    unsafe { [0, 8, 16, 24].map(|o| _mm256_loadu_ps(s[o..].as_ptr())) }
}

/// `src[j .. j + 32]` (f16 bits) widened exactly into four vectors of 8 f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn load_f16(src: &[u16], j: usize) -> [__m256; 4] {
    let s = &src[j..j + STEP];
    // SAFETY: `s` is 32 u16 (four unaligned 128-bit loads).
    unsafe { [0, 8, 16, 24].map(|o| _mm256_cvtph_ps(_mm_loadu_si128(s[o..].as_ptr().cast()))) }
}

/// `src[j .. j + 32]` (bf16 bits) widened into four vectors of 8 f32, in order.
#[inline]
#[target_feature(enable = "avx2")]
fn load_bf16(src: &[u16], j: usize) -> [__m256; 4] {
    let s = &src[j..j + STEP];
    // SAFETY: `s` is 32 u16 (two unaligned 256-bit loads).
    let (a, b) = unsafe {
        (
            _mm256_loadu_si256(s.as_ptr().cast()),
            _mm256_loadu_si256(s[16..].as_ptr().cast()),
        )
    };
    // `vpunpck*wd` with zero below each value interleaves within 128-bit halves:
    // `lo` holds values 0..4 and 8..12, `hi` 4..8 and 12..16; `vpermq` first puts the
    // quarters where the unpacks want them.
    let widen = |v: __m256i| {
        let v = _mm256_permute4x64_epi64::<0b11_01_10_00>(v);
        let z = _mm256_setzero_si256();
        (
            _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v)),
        )
    };
    let ((a0, a1), (b0, b1)) = (widen(a), widen(b));
    [a0, a1, b0, b1]
}

/// Encodes `len / 32` steps of 32 values (`load(j)` gives values `j .. j + 32`, and
/// `scales(j)` their scales) into `dst`.
///
/// # Safety
/// The CPU must have AVX2 and F16C (the AVX2 level's, which every caller's loader may
/// use: `vcvtph2ps`); `dst.len() >= len`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn run<const MBITS: u32, const BIAS: i32, const PLUS_ZERO: bool>(
    len: usize,
    scales: impl Fn(usize) -> [__m256; 4],
    dst: &mut [u8],
    load: impl Fn(usize) -> [__m256; 4],
    max_code: u8,
) {
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (j, d) in (0..len / STEP * STEP)
        .step_by(STEP)
        .zip(dst.chunks_exact_mut(STEP))
    {
        let (x, s) = (load(j), scales(j));
        let c: [__m256i; 4] = std::array::from_fn(|i| {
            let code = encode8::<MBITS, BIAS>(_mm256_mul_ps(x[i], s[i]), max_code);
            if PLUS_ZERO {
                // A zero input (either sign) gives +0: clear the code there. Clearing
                // only its sign bit left `0x7F` under an infinite or NaN scale, whose
                // product with zero is NaN (the portable loop gives +0).
                let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(x[i], _mm256_setzero_ps());
                _mm256_andnot_si256(_mm256_castps_si256(zero), code)
            } else {
                code
            }
        });
        let w = _mm256_packus_epi16(
            _mm256_packus_epi32(c[0], c[1]),
            _mm256_packus_epi32(c[2], c[3]),
        );
        // SAFETY: `d` is 32 bytes (one unaligned 256-bit store).
        unsafe {
            _mm256_storeu_si256(d.as_mut_ptr().cast(), _mm256_permutevar8x32_epi32(w, order))
        };
    }
}

/// `encode_fast::<MBITS, BIAS>` of 8 values, codes in u32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn encode8<const MBITS: u32, const BIAS: i32>(x: __m256, max_code: u8) -> __m256i {
    let shift = 23 - MBITS;
    let bits = _mm256_castps_si256(x);
    let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(bits), _mm256_set1_epi32(0x80));
    let abits = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFF_FFFF));
    let n = _mm256_sub_epi32(abits, _mm256_set1_epi32((127 - BIAS) << 23));
    let sh = _mm_cvtsi32_si128(shift as i32);
    let lsb = _mm256_and_si256(_mm256_srl_epi32(n, sh), _mm256_set1_epi32(1));
    let norm = _mm256_srl_epi32(
        _mm256_add_epi32(
            n,
            _mm256_add_epi32(_mm256_set1_epi32((1 << (shift - 1)) - 1), lsb),
        ),
        sh,
    );
    let up = f32::from_bits(((127 + BIAS - 1 + MBITS as i32) as u32) << 23);
    let scaled = _mm256_mul_ps(_mm256_castsi256_ps(abits), _mm256_set1_ps(up));
    let sub = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(scaled, _mm256_set1_ps(8_388_608.0))),
        _mm256_set1_epi32(0x4B00_0000),
    );
    // Signed compares are right: `abits` is at most `0x7FFF_FFFF`.
    let small = _mm256_cmpgt_epi32(_mm256_set1_epi32((128 - BIAS) << 23), abits);
    let code = _mm256_blendv_epi8(norm, sub, small);
    let out = _mm256_or_si256(
        sign,
        _mm256_min_epu32(code, _mm256_set1_epi32(i32::from(max_code))),
    );
    let nan = _mm256_cmpgt_epi32(abits, _mm256_set1_epi32(0x7F80_0000));
    _mm256_blendv_epi8(out, _mm256_set1_epi32(0x7F), nan)
}

#[cfg(test)]
pub(super) mod tests {
    //! The checks of both scaled encoders ([`super`] and its AVX-512 twin), each run
    //! on a [`Kernels`] set.
    use super::*;

    /// A level's three encoders, as the checks call them.
    pub(in crate::codec) struct Kernels {
        /// The level they need; a check on a CPU without it is skipped.
        pub(in crate::codec) level: Level,
        pub(in crate::codec) f32: fn(Fp8, &[f32], Scale<'_>, bool, &mut [u8]) -> bool,
        pub(in crate::codec) bf16: fn(Fp8, &[u16], Scale<'_>, bool, &mut [u8]) -> bool,
        pub(in crate::codec) f16: fn(Fp8, &[u16], Scale<'_>, bool, &mut [u8]) -> bool,
    }

    /// This module's encoders.
    const AVX2: Kernels = Kernels {
        level: Level::Avx2,
        f32: encode_f32,
        bf16: encode_bf16,
        f16: encode_f16,
    };

    /// Whether the CPU has `k`'s level (saying so where it does not).
    fn runs(k: &Kernels) -> bool {
        let has = k.level.is_supported();
        if !has {
            eprintln!("skipped: this CPU has no {}", k.level);
        }
        has
    }

    /// Run lengths with every kind of tail of both encoders' steps (32 and 64 values).
    fn lengths(n: usize) -> [usize; 9] {
        [n, n - 31, n - 63, 97, 65, 63, 33, 31, 0]
    }

    /// The portable loop: the specification of both encoders.
    fn portable(fp8: Fp8, xs: &[f32], scale: Scale<'_>, plus_zero: bool) -> Vec<u8> {
        let mut out = vec![0u8; xs.len()];
        encode_tail(fp8, 0, xs.len(), scale, plus_zero, &mut out, |i| xs[i]);
        out
    }

    /// Scales for `n` values: a mix of powers of two, odd values, tiny and huge ones,
    /// zero and negative zero, infinity and NaN (every product class: ties, subnormal
    /// codes, saturation, infinity, NaN, underflow to either zero).
    fn each_scales(n: usize) -> Vec<f32> {
        let pool = [
            1.0f32,
            3.0,
            0.7,
            1.0e-3,
            448.0 / 3.3,
            2.0f32.powi(-20),
            0.0,
            -0.0,
            2.0f32.powi(100),
            -1.5,
            0.37,
            f32::INFINITY,
            f32::NAN,
        ];
        (0..n).map(|i| pool[(i * 7 + i / 3) % pool.len()]).collect()
    }

    /// The scales the every-pattern tests run: single scales (ordinary ones, `extreme`,
    /// both zeros, a negative one and infinity, under which `plus_zero` must still give
    /// `+0` for a zero input) and the per-value scales `each`.
    fn scales(extreme: f32, each: &[f32]) -> Vec<Scale<'_>> {
        let one = [
            1.0f32,
            3.0,
            0.7,
            1.0e-3,
            448.0 / 3.3,
            extreme,
            0.0,
            -0.0,
            -2.5,
            f32::INFINITY,
        ];
        let mut all: Vec<Scale<'_>> = one.map(Scale::One).to_vec();
        all.push(Scale::Each(each));
        all
    }

    /// Every bf16 pattern under one scale (several) and under per-value scales, with
    /// and without `plus_zero`, against the f32 route on the widened values and the
    /// portable loop; lengths with every tail.
    #[test]
    fn every_bf16_pattern_encodes_as_the_portable_encoder() {
        bf16_patterns(&AVX2);
    }

    /// [`every_bf16_pattern_encodes_as_the_portable_encoder`] on `k`.
    pub(in crate::codec) fn bf16_patterns(k: &Kernels) {
        if !runs(k) {
            return;
        }
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let wide: Vec<f32> = bits
            .iter()
            .map(|&b| crate::dtype::f32_from_bf16_bits(b))
            .collect();
        let each = each_scales(bits.len());
        let scales = scales(2.0f32.powi(-20), &each);
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            for &scale in &scales {
                for plus_zero in [false, true] {
                    let want = portable(fp8, &wide, scale, plus_zero);
                    for len in lengths(bits.len()) {
                        let cut = scale.cut(0..len);
                        let what = format!("{fp8:?} {scale:?} plus_zero {plus_zero} len {len}");
                        let what = &what[..what.len().min(120)];
                        let mut got = vec![0u8; len];
                        assert!((k.bf16)(fp8, &bits[..len], cut, plus_zero, &mut got));
                        assert_eq!(got[..], want[..len], "bf16 {what}");
                        let mut got = vec![0u8; len];
                        assert!((k.f32)(fp8, &wide[..len], cut, plus_zero, &mut got));
                        assert_eq!(got[..], want[..len], "f32 {what}");
                    }
                }
            }
        }
    }

    /// Every f16 pattern (subnormals, infinities, NaN, zeros of both signs) under the
    /// same scales, both `+0` rules and tails of every kind: the portable encoder of the
    /// exactly widened value.
    #[test]
    fn every_f16_pattern_encodes_as_the_portable_encoder() {
        f16_patterns(&AVX2);
    }

    /// [`every_f16_pattern_encodes_as_the_portable_encoder`] on `k`.
    pub(in crate::codec) fn f16_patterns(k: &Kernels) {
        if !runs(k) {
            return;
        }
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let wide: Vec<f32> = bits
            .iter()
            .map(|&b| half::f16::from_bits(b).to_f32())
            .collect();
        let each = each_scales(bits.len());
        let scales = scales(2.0f32.powi(20), &each);
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            for &scale in &scales {
                for plus_zero in [false, true] {
                    let want = portable(fp8, &wide, scale, plus_zero);
                    for len in lengths(bits.len()) {
                        let cut = scale.cut(0..len);
                        let mut got = vec![0u8; len];
                        assert!((k.f16)(fp8, &bits[..len], cut, plus_zero, &mut got));
                        assert_eq!(
                            got[..],
                            want[..len],
                            "{fp8:?} {} plus_zero {plus_zero} len {len}",
                            match scale {
                                Scale::One(s) => format!("scale {s}"),
                                Scale::Each(_) => "per-value scales".to_string(),
                            }
                        );
                    }
                }
            }
        }
        let mut dst = [9u8; 8];
        assert!(!(k.f16)(
            Fp8::E4M3,
            &[0u16; 8],
            Scale::One(1.0),
            false,
            &mut dst[..7]
        ));
        assert_eq!(dst, [9u8; 8]);
    }

    /// A strided sweep of all f32 patterns (every exponent, the low mantissa bits that
    /// decide ties), under a scale of one, a non-power-of-two scale and per-value
    /// scales.
    #[test]
    fn f32_patterns_encode_as_the_portable_encoder() {
        f32_patterns(&AVX2);
    }

    /// [`f32_patterns_encode_as_the_portable_encoder`] on `k`.
    pub(in crate::codec) fn f32_patterns(k: &Kernels) {
        if !runs(k) {
            return;
        }
        let xs: Vec<f32> = (0..(1u64 << 32))
            .step_by(4099)
            .map(|b| f32::from_bits(b as u32))
            .collect();
        let each = each_scales(xs.len());
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            for scale in [Scale::One(1.0), Scale::One(0.37), Scale::Each(&each)] {
                for plus_zero in [false, true] {
                    let want = portable(fp8, &xs, scale, plus_zero);
                    let mut got = vec![0u8; xs.len()];
                    assert!((k.f32)(fp8, &xs, scale, plus_zero, &mut got));
                    assert_eq!(got, want, "{fp8:?} plus_zero {plus_zero}");
                }
            }
        }
    }

    /// `plus_zero` flushes only zero inputs: a nonzero product that rounds to zero
    /// keeps its sign.
    #[test]
    fn plus_zero_flushes_zero_inputs_only() {
        plus_zero_flushes(&AVX2);
    }

    /// [`plus_zero_flushes_zero_inputs_only`] on `k`.
    pub(in crate::codec) fn plus_zero_flushes(k: &Kernels) {
        if !runs(k) {
            return;
        }
        let mut xs = vec![-0.0f32; 64];
        xs[5] = -1.0e-30;
        let mut got = [0u8; 64];
        assert!((k.f32)(Fp8::E4M3, &xs, Scale::One(1.0), true, &mut got));
        assert_eq!(got[0], 0x00);
        assert_eq!(got[5], 0x80);
        assert!((k.f32)(Fp8::E4M3, &xs, Scale::One(1.0), false, &mut got));
        assert_eq!(got[0], 0x80);
    }

    /// Lengths that disagree are declined, with nothing written.
    #[test]
    fn mismatched_lengths_are_declined() {
        lengths_that_disagree(&AVX2);
    }

    /// [`mismatched_lengths_are_declined`] on `k`.
    pub(in crate::codec) fn lengths_that_disagree(k: &Kernels) {
        let mut dst = [9u8; 8];
        let xs = [1.0f32; 8];
        assert!(!(k.f32)(
            Fp8::E4M3,
            &xs,
            Scale::One(1.0),
            false,
            &mut dst[..7]
        ));
        assert!(!(k.f32)(
            Fp8::E4M3,
            &xs,
            Scale::Each(&[1.0; 7]),
            false,
            &mut dst
        ));
        assert!(!(k.bf16)(
            Fp8::E5M2,
            &[0u16; 8],
            Scale::One(1.0),
            false,
            &mut dst[..7]
        ));
        assert_eq!(dst, [9u8; 8]);
    }
}
