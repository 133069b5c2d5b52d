//! The AVX2 decode of MXFP8: `out[i] = T(scale(code_i) * decode(q[i]))`
//! in registers, 8 values per step, the bits of the portable decode-then-narrow loops.
//!
//! Each value is one multiply ([`quant_core::codec::folded`]): the FP8 code unbiased in
//! place (sign-extended, shifted, masked) times its block's scale folded with the
//! element type's rebias, `2^(e - 127) * 2^(127 - bias) = 2^(e - bias)`, whose f32 bits
//! are the E8M0 code plus a constant, shifted. That is exact, so the one rounding of
//! the product is the portable one, wherever the folded scale is a normal f32 (every
//! code up to `127 + bias`: E4M3 134, E5M2 142, which excludes the NaN code 255) and no
//! FP8 code of the run is NaN or infinite; other runs decline, to the portable loops.
//! f16 output is narrowed by `vcvtps2ph` (round to nearest even, what
//! [`quant_core::Element::narrow_slice`] uses), bf16 without the NaN select
//! ([`narrow16_no_nan`]: no product is NaN); bf16 takes this decoder only where the
//! 16-bit lanes of [`quant_core::codec::pow2`] decline. Ordinary stores, as every MXFP8
//! decode: each task writes long sequential runs.
//!
//! The portable route decoded a span into an f32 scratch and narrowed it in a second
//! loop: in process (8192x8192, two Zen 4 cores at AVX2) this measured rowwise into f16
//! x1.3-1.5 and f32 x1.0-1.1 against it (see `docs/benchmarks-history.md`, the
//! forty-fourth session).

use std::arch::x86_64::{
    __m256, _MM_FROUND_TO_NEAREST_INT, _mm_loadl_epi64, _mm256_add_epi32, _mm256_castsi256_ps,
    _mm256_cvtepu8_epi32, _mm256_cvtps_ph, _mm256_mul_ps, _mm256_set_m128i, _mm256_set1_epi32,
    _mm256_slli_epi32,
};

use quant_core::Element;
use quant_core::bf16_narrow::avx2::narrow16_no_nan;
use quant_core::codec::folded::{self, avx2::unbiased_8};
use quant_core::codec::pow2::Fp8;
use quant_core::codec::{e4m3, e5m2};
use quant_core::dtype::FloatsMut;
use quant_core::dtype::bf16_bits;
use quant_core::simd::Level;
use quant_core::stream::StoreMode;
use quant_core::stream::avx2::{write_f32_steps, write_u16_steps};

use crate::kernels::Codes;
use crate::scale::{BLOCK, Mxfp8Dtype, scale};

/// Decodes the run `q` under its E8M0 `codes` (one per block or one per value) into
/// `out`. Returns `false`, having written nothing, unless `level` is [`Level::Avx2`]
/// (the CPU has it), `T` is a float type, the lengths fit (`out.len() == q.len()`, whole
/// blocks, one code per block or per value), every scale folds and no FP8 code is
/// special (module docs); the caller then runs the portable loops.
#[inline(always)]
pub(crate) fn decode_run<T: Element>(
    level: Level,
    dtype: Mxfp8Dtype,
    q: &[u8],
    codes: Codes<'_>,
    out: &mut [T],
) -> bool {
    let n = q.len();
    let (c, each) = match codes {
        Codes::PerBlock(c) => (c, false),
        Codes::Each(c) => (c, true),
    };
    let fits = out.len() == n && n.is_multiple_of(BLOCK) && codes.fit(n);
    if level != Level::Avx2 || !level.is_supported() || !fits {
        return false;
    }
    let codec = dtype.pow2_codec();
    // A fold, not `all`: no early exit, so it vectorizes.
    let top = c.iter().fold(0, |m, &e| m.max(e));
    if i32::from(top) > 127 + codec.bias() || folded::has_special(codec, q) {
        return false;
    }
    let e5m2 = dtype == Mxfp8Dtype::E5M2;
    match FloatsMut::of(out) {
        // SAFETY: the CPU has the AVX2 level's features (checked above); the lengths fit.
        Some(FloatsMut::F32(o)) => unsafe { run_f32(e5m2, each, q, c, o) },
        // SAFETY: as above (`Level::Avx2` includes F16C).
        Some(FloatsMut::F16(o)) => unsafe { run_f16(e5m2, each, q, c, o) },
        // SAFETY: as above.
        Some(FloatsMut::Bf16(o)) => unsafe { run_bf16(e5m2, each, q, c, o) },
        None => return false,
    }
    true
}

/// The codec of a loop variant.
#[inline(always)]
const fn codec<const E5M2: bool>() -> Fp8 {
    if E5M2 { Fp8::E5M2 } else { Fp8::E4M3 }
}

/// Values `j..j + 8` (inside one block): the unbiased codes times the folded scales.
#[inline]
#[target_feature(enable = "avx2")]
fn step<const E5M2: bool, const EACH: bool>(q: &[u8], c: &[u8], j: usize) -> __m256 {
    let codec = codec::<E5M2>();
    // The folded scale's f32 exponent field: the E8M0 code plus `127 - bias`.
    let offset = 127 - codec.bias();
    let load8 = |s: &[u8]| {
        let s = &s[j..j + 8];
        // SAFETY: `s` is 8 bytes (one unaligned 64-bit load).
        unsafe { _mm_loadl_epi64(s.as_ptr().cast()) }
    };
    let field = if EACH {
        _mm256_add_epi32(_mm256_cvtepu8_epi32(load8(c)), _mm256_set1_epi32(offset))
    } else {
        _mm256_set1_epi32(i32::from(c[j / BLOCK]) + offset)
    };
    let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(field));
    _mm256_mul_ps(unbiased_8(codec, load8(q)), scale)
}

/// Value `j`, as the portable loop computes it.
#[inline(always)]
fn one<const E5M2: bool, const EACH: bool>(q: &[u8], c: &[u8], j: usize) -> f32 {
    let s = scale(if EACH { c[j] } else { c[j / BLOCK] });
    let v = if E5M2 {
        e5m2::decode_fast(q[j])
    } else {
        e4m3::decode_fast(q[j])
    };
    s * v
}

/// One loop per element type and code layout, so that neither is tested per step.
macro_rules! variants {
    ($loop:ident, $e5m2:expr, $each:expr, $q:expr, $c:expr, $o:expr) => {
        match ($e5m2, $each) {
            (false, false) => $loop::<false, false>($q, $c, $o),
            (true, false) => $loop::<true, false>($q, $c, $o),
            (false, true) => $loop::<false, true>($q, $c, $o),
            (true, true) => $loop::<true, true>($q, $c, $o),
        }
    };
}

/// [`decode_run`] into f32 after its checks.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn run_f32(e5m2: bool, each: bool, q: &[u8], c: &[u8], out: &mut [f32]) {
    variants!(f32_loop, e5m2, each, q, c, out)
}

/// [`decode_run`] into f16 bits after its checks.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn run_f16(e5m2: bool, each: bool, q: &[u8], c: &[u8], out: &mut [u16]) {
    variants!(f16_loop, e5m2, each, q, c, out)
}

/// [`decode_run`] into bf16 bits after its checks.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn run_bf16(e5m2: bool, each: bool, q: &[u8], c: &[u8], out: &mut [u16]) {
    variants!(bf16_loop, e5m2, each, q, c, out)
}

/// The bf16 loop of one variant (no product is NaN: no NaN select).
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn bf16_loop<const E5M2: bool, const EACH: bool>(q: &[u8], c: &[u8], out: &mut [u16]) {
    write_u16_steps(
        out,
        StoreMode::Cached,
        |j| narrow16_no_nan(step::<E5M2, EACH>(q, c, j), step::<E5M2, EACH>(q, c, j + 8)),
        |j| bf16_bits(one::<E5M2, EACH>(q, c, j)),
    )
}

/// The f32 loop of one variant.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn f32_loop<const E5M2: bool, const EACH: bool>(q: &[u8], c: &[u8], out: &mut [f32]) {
    write_f32_steps(
        out,
        StoreMode::Cached,
        |j| step::<E5M2, EACH>(q, c, j),
        |j| one::<E5M2, EACH>(q, c, j),
    )
}

/// The f16 loop of one variant (16 values per step, inside one block: the steps start
/// at the run's start, a block boundary).
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn f16_loop<const E5M2: bool, const EACH: bool>(q: &[u8], c: &[u8], out: &mut [u16]) {
    write_u16_steps(
        out,
        StoreMode::Cached,
        |j| {
            let lo = step::<E5M2, EACH>(q, c, j);
            let hi = step::<E5M2, EACH>(q, c, j + 8);
            let half = |v| _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm256_set_m128i(half(hi), half(lo))
        },
        |j| quant_core::half::f16::from_f32(one::<E5M2, EACH>(q, c, j)).to_bits(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// Every FP8 code that is not special in every position, under E8M0 codes from 0 to
    /// the largest that folds (subnormal, huge and overflowing f16 products), one per
    /// block and one per value, into f32, f16 and bf16: the portable bits. Runs with a special
    /// FP8 code, a code past the fold (the NaN code 255 included), a partial block or
    /// mismatched lengths are declined, writing nothing.
    #[test]
    fn decodes_as_the_portable_loop() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let level = Level::Avx2;
        for dtype in [Mxfp8Dtype::E4M3, Mxfp8Dtype::E5M2] {
            let codec = dtype.pow2_codec();
            let limit = (127 + codec.bias()) as u8;
            let plain: Vec<u8> = (0..=255u8)
                .cycle()
                .take(2048)
                .filter(|&c| !folded::has_special(codec, &[c]))
                .take(32 * 60)
                .collect();
            let n = plain.len();
            let exps: Vec<u8> = (0..n)
                .map(|j| [0, 1, 90, 127, 140, limit][j % 6].min(limit))
                .collect();
            let blocks: Vec<u8> = (0..n / BLOCK)
                .map(|b| (b * 37 % (limit as usize + 1)) as u8)
                .collect();
            for codes in [Codes::PerBlock(&blocks), Codes::Each(&exps)] {
                let code = |j: usize| match codes {
                    Codes::PerBlock(c) => c[j / BLOCK],
                    Codes::Each(c) => c[j],
                };
                let want: Vec<f32> = (0..n)
                    .map(|j| {
                        let v = match dtype {
                            Mxfp8Dtype::E4M3 => e4m3::decode_fast(plain[j]),
                            Mxfp8Dtype::E5M2 => e5m2::decode_fast(plain[j]),
                        };
                        quant_core::codec::e8m0::decode(code(j)) * v
                    })
                    .collect();
                let mut f = vec![0f32; n];
                assert!(decode_run(level, dtype, &plain, codes, &mut f));
                for (j, (g, w)) in f.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{dtype:?} f32 {j}");
                }
                let mut b = vec![bf16::ZERO; n];
                assert!(decode_run(level, dtype, &plain, codes, &mut b));
                for (j, (g, w)) in b.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), bf16_bits(*w), "{dtype:?} bf16 {j}");
                }
                let mut h = vec![f16::ZERO; n];
                assert!(decode_run(level, dtype, &plain, codes, &mut h));
                for (j, (g, w)) in h.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        f16::from_f32(*w).to_bits(),
                        "{dtype:?} f16 {j}"
                    );
                }
            }
            // Declined: a special FP8 code, a code past the fold, lengths.
            let mut f = vec![0f32; n];
            let mut special = plain.clone();
            special[77] = 0xFF;
            assert!(!decode_run(
                level,
                dtype,
                &special,
                Codes::PerBlock(&blocks),
                &mut f
            ));
            for bad in [limit + 1, 255] {
                let mut b = blocks.clone();
                b[3] = bad;
                assert!(!decode_run(
                    level,
                    dtype,
                    &plain,
                    Codes::PerBlock(&b),
                    &mut f
                ));
            }
            let short = &plain[..n - 1];
            assert!(!decode_run(
                level,
                dtype,
                short,
                Codes::PerBlock(&blocks),
                &mut f[..n - 1]
            ));
            assert!(!decode_run(
                level,
                dtype,
                &plain,
                Codes::Each(&blocks),
                &mut f
            ));
            assert!(f.iter().all(|&v| v == 0.0), "a declined run wrote");
            assert!(!decode_run(
                Level::Scalar,
                dtype,
                &plain,
                Codes::PerBlock(&blocks),
                &mut f
            ));
        }
    }
}
