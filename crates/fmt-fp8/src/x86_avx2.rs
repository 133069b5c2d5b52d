//! The AVX2 FP8 encoder under one scale: `dst[i] = fp8(src[i] * scale)`, 32 values per
//! step, for the paths whose scale is not a power of two (per-tensor current scaling
//! by default; the block recipes with `pow2` scales off).
//!
//! Each lane runs the steps of the portable encoder (`encode_fast` of
//! `quant_core::codec`'s FP8 module, through [`e4m3::encode`] / [`e5m2::encode`]): the
//! same integer operations and the same two float operations (`|x| * 2^(BIAS - 1 +
//! MBITS)`, then `+ 2^23`, each rounded once: Rust never fuses them), so the codes are
//! the same bits. The 32 codes of a step are narrowed to bytes by two `vpackusdw`, one
//! `vpackuswb` and a `vpermd` that puts the 128-bit halves' dwords in order. Compiled
//! from the portable loop, LLVM narrowed each 8 codes separately (no `vpmovdb` below
//! AVX-512): the per-tensor FP8 quantize at AVX2 spent a third of its time there.

use std::arch::x86_64::{
    __m256, __m256i, _mm_cvtsi32_si128, _mm256_add_epi32, _mm256_add_ps, _mm256_and_si256,
    _mm256_blendv_epi8, _mm256_castps_si256, _mm256_castsi256_ps, _mm256_cmpgt_epi32,
    _mm256_loadu_ps, _mm256_loadu_si256, _mm256_min_epu32, _mm256_mul_ps, _mm256_or_si256,
    _mm256_packus_epi16, _mm256_packus_epi32, _mm256_permute4x64_epi64,
    _mm256_permutevar8x32_epi32, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32,
    _mm256_setzero_si256, _mm256_srl_epi32, _mm256_srli_epi32, _mm256_storeu_si256,
    _mm256_sub_epi32, _mm256_unpackhi_epi16, _mm256_unpacklo_epi16,
};

use quant_core::codec::{e4m3, e5m2};
use quant_core::simd::Level;

use crate::kernels::encode_values;
use crate::scale::Fp8Dtype;

/// `dst[i] = fp8(src[i] * scale)` for f32 `src` ([`e4m3::encode`] or [`e5m2::encode`]
/// of the product). `false` (nothing written) unless the CPU has AVX2 and the lengths
/// agree; the caller then runs the portable loop.
#[inline(always)]
pub(crate) fn encode_f32(dt: Fp8Dtype, src: &[f32], scale: f32, dst: &mut [u8]) -> bool {
    if !Level::Avx2.is_supported() || src.len() != dst.len() {
        return false;
    }
    // SAFETY: the CPU has AVX2 (checked above); `dst` holds `src.len()` codes.
    unsafe { steps(dt, src.len(), scale, dst, |j| load_f32(src, j)) };
    let tail = src.len() / 32 * 32;
    encode_values(dt, src[tail..].iter().map(|&v| v * scale), &mut dst[tail..]);
    true
}

/// [`encode_f32`] of bf16 values given as bits, each widened exactly in the register.
#[inline(always)]
pub(crate) fn encode_bf16(dt: Fp8Dtype, src: &[u16], scale: f32, dst: &mut [u8]) -> bool {
    if !Level::Avx2.is_supported() || src.len() != dst.len() {
        return false;
    }
    // SAFETY: the CPU has AVX2 (checked above); `dst` holds `src.len()` codes.
    unsafe { steps(dt, src.len(), scale, dst, |j| load_bf16(src, j)) };
    let tail = src.len() / 32 * 32;
    let wide = |b: u16| quant_core::dtype::f32_from_bf16_bits(b) * scale;
    encode_values(dt, src[tail..].iter().map(|&b| wide(b)), &mut dst[tail..]);
    true
}

/// [`run`] with `dt`'s mantissa bits, bias and largest code.
///
/// # Safety
/// As for [`run`].
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn steps(
    dt: Fp8Dtype,
    len: usize,
    scale: f32,
    dst: &mut [u8],
    load: impl Fn(usize) -> [__m256; 4],
) {
    // SAFETY: the caller's promises are `run`'s.
    unsafe {
        match dt {
            Fp8Dtype::E4M3 => run::<3, 7>(len, scale, dst, load, e4m3::MAX_CODE),
            Fp8Dtype::E5M2 => run::<2, 15>(len, scale, dst, load, e5m2::MAX_CODE),
        }
    }
}

/// `src[j .. j + 32]` as four vectors of 8 f32.
#[inline]
#[target_feature(enable = "avx2")]
fn load_f32(src: &[f32], j: usize) -> [__m256; 4] {
    let s = &src[j..j + 32];
    // SAFETY: `s` is 32 f32 (four unaligned 256-bit loads).
    unsafe { [0, 8, 16, 24].map(|o| _mm256_loadu_ps(s[o..].as_ptr())) }
}

/// `src[j .. j + 32]` (bf16 bits) widened into four vectors of 8 f32, in order.
#[inline]
#[target_feature(enable = "avx2")]
fn load_bf16(src: &[u16], j: usize) -> [__m256; 4] {
    let s = &src[j..j + 32];
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

/// Encodes `len / 32` steps of 32 values (`load(j)` gives values `j .. j + 32`) times
/// `scale` into `dst`.
///
/// # Safety
/// The CPU must have AVX2; `dst.len() >= len`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn run<const MBITS: u32, const BIAS: i32>(
    len: usize,
    scale: f32,
    dst: &mut [u8],
    load: impl Fn(usize) -> [__m256; 4],
    max_code: u8,
) {
    let s = _mm256_set1_ps(scale);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (j, d) in (0..len / 32 * 32).step_by(32).zip(dst.chunks_exact_mut(32)) {
        let c = load(j).map(|v| encode8::<MBITS, BIAS>(_mm256_mul_ps(v, s), max_code));
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
mod tests {
    use super::*;

    /// Every bf16 pattern under several scales (ties, subnormal codes, saturation,
    /// infinities and NaN among them), and the bf16 route against the f32 one on the
    /// widened values; lengths with every tail.
    #[test]
    fn every_bf16_pattern_encodes_as_the_portable_encoder() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let wide: Vec<f32> = bits
            .iter()
            .map(|&b| quant_core::dtype::f32_from_bf16_bits(b))
            .collect();
        for dt in [Fp8Dtype::E4M3, Fp8Dtype::E5M2] {
            for scale in [1.0f32, 3.0, 0.7, 1.0e-3, 448.0 / 3.3, 2.0f32.powi(-20), 0.0] {
                let mut want = vec![0u8; bits.len()];
                encode_values(dt, wide.iter().map(|&v| v * scale), &mut want);
                for len in [bits.len(), bits.len() - 31, 33, 31, 0] {
                    let mut got = vec![0u8; len];
                    assert!(encode_bf16(dt, &bits[..len], scale, &mut got));
                    assert_eq!(got[..], want[..len], "{dt:?} bf16 scale {scale} len {len}");
                    let mut got = vec![0u8; len];
                    assert!(encode_f32(dt, &wide[..len], scale, &mut got));
                    assert_eq!(got[..], want[..len], "{dt:?} f32 scale {scale} len {len}");
                }
            }
        }
        // Lengths that disagree are declined.
        assert!(!encode_f32(Fp8Dtype::E4M3, &wide[..8], 1.0, &mut [0u8; 7]));
    }

    /// A strided sweep of all f32 patterns (every exponent, the low mantissa bits that
    /// decide ties), under a scale of one and a non-power-of-two scale.
    #[test]
    fn f32_patterns_encode_as_the_portable_encoder() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let xs: Vec<f32> = (0..(1u64 << 32))
            .step_by(4099)
            .map(|b| f32::from_bits(b as u32))
            .collect();
        for dt in [Fp8Dtype::E4M3, Fp8Dtype::E5M2] {
            for scale in [1.0f32, 0.37] {
                let mut want = vec![0u8; xs.len()];
                encode_values(dt, xs.iter().map(|&v| v * scale), &mut want);
                let mut got = vec![0u8; xs.len()];
                assert!(encode_f32(dt, &xs, scale, &mut got));
                assert_eq!(got, want, "{dt:?} scale {scale}");
            }
        }
    }
}
