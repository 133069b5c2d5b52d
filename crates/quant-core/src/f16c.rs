//! f16 slices widened and narrowed with F16C (`vcvtph2ps`, `vcvtps2ph`), 8 values per
//! instruction, for [`crate::Element`]'s bulk conversions.
//!
//! `half`'s slice conversions use the same instructions, but through a function that
//! converts one 8-value array per call: where a downstream crate builds without LTO
//! (the default release profile), that call is not inlined into our kernels, and the
//! arrays go through memory. The NVFP4 rowwise dequantize into f16 ran x1.8 slower that way
//! than under this workspace's thin LTO. These loops are `#[inline]` with their target
//! features, so a kernel compiled with F16C (every AVX2 or AVX-512 dispatch) inlines
//! them. The bits are the instruction's either way: `half` chose the same one.

#![allow(unsafe_code)]

use half::f16;
use std::arch::x86_64::{
    __m128i, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm_storeu_si128, _mm256_cvtph_ps,
    _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_storeu_ps,
};

/// Whether this CPU has F16C (cached by `std`).
#[inline]
pub(crate) fn supported() -> bool {
    std::is_x86_feature_detected!("f16c")
}

/// [`widen`] where the CPU has F16C; `false` (nothing written) elsewhere.
#[inline]
pub(crate) fn try_widen(src: &[f16], dst: &mut [f32]) -> bool {
    if !supported() {
        return false;
    }
    // SAFETY: the CPU has F16C (checked above), and with it AVX.
    unsafe { widen(src, dst) };
    true
}

/// [`narrow`] where the CPU has F16C; `false` (nothing written) elsewhere.
#[inline]
pub(crate) fn try_narrow(src: &[f32], dst: &mut [f16]) -> bool {
    if !supported() {
        return false;
    }
    // SAFETY: the CPU has F16C (checked above), and with it AVX.
    unsafe { narrow(src, dst) };
    true
}

/// `dst[i] = src[i] as f32`, exactly, for the common length of the two slices.
///
/// # Safety
/// The CPU must have AVX and F16C.
#[inline]
#[target_feature(enable = "avx,f16c")]
pub(crate) fn widen(src: &[f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let main = n / 8 * 8;
    for i in (0..main).step_by(8) {
        // SAFETY: `i + 8 <= n` values of either slice: one unaligned 128-bit load of 8
        // f16 and one unaligned 256-bit store of 8 f32.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    for (d, s) in dst[main..n].iter_mut().zip(&src[main..n]) {
        *d = s.to_f32();
    }
}

/// `dst[i] = f16(src[i])`, rounded to nearest even, for the common length of the two
/// slices.
///
/// # Safety
/// The CPU must have AVX and F16C.
#[inline]
#[target_feature(enable = "avx,f16c")]
pub(crate) fn narrow(src: &[f32], dst: &mut [f16]) {
    let n = src.len().min(dst.len());
    let main = n / 8 * 8;
    for i in (0..main).step_by(8) {
        // SAFETY: `i + 8 <= n` values of either slice: one unaligned 256-bit load of 8
        // f32 and one unaligned 128-bit store of 8 f16.
        unsafe {
            let v = _mm256_loadu_ps(src.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(dst.as_mut_ptr().add(i).cast::<__m128i>(), h);
        }
    }
    for (d, &s) in dst[main..n].iter_mut().zip(&src[main..n]) {
        *d = f16::from_f32(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_every_f16_equals_to_f32() {
        if !supported() {
            eprintln!("skipped: this CPU has no F16C");
            return;
        }
        // Every pattern, and a ragged length for the one-by-one tail.
        let src: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut dst = vec![0f32; src.len() - 3];
        // SAFETY: the CPU has F16C (checked above), and with it AVX.
        unsafe { widen(&src, &mut dst) };
        for (s, d) in src.iter().zip(&dst) {
            let want = s.to_f32();
            if want.is_nan() {
                assert!(d.is_nan() && d.is_sign_negative() == want.is_sign_negative());
            } else {
                assert_eq!(d.to_bits(), want.to_bits(), "{:#06x}", s.to_bits());
            }
        }
    }

    #[test]
    fn narrowing_equals_from_f32() {
        if !supported() {
            eprintln!("skipped: this CPU has no F16C");
            return;
        }
        // A stride through every f32 pattern (both signs, every exponent: overflow,
        // subnormal results, ties), the specials, and a ragged length.
        let mut src: Vec<f32> = (0..=u32::MAX / 4099)
            .map(|i| f32::from_bits(i * 4099))
            .collect();
        src.extend([
            0.0,
            -0.0,
            65504.0,
            65520.0,
            65519.99,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        src.extend([
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7F80_0001),
            5.960_464_5e-8,
        ]);
        src.extend([
            2.980_232_2e-8,
            2.980_232_4e-8,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
        ]);
        let mut dst = vec![f16::ZERO; src.len() - 5];
        // SAFETY: the CPU has F16C (checked above), and with it AVX.
        unsafe { narrow(&src, &mut dst) };
        for (s, d) in src.iter().zip(&dst) {
            let want = f16::from_f32(*s);
            assert_eq!(d.to_bits(), want.to_bits(), "{:#010x}", s.to_bits());
        }
    }
}
