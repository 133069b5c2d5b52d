//! The AVX-512 decode of MXFP8 into bf16 and f16: `out[i] = T(scale(code_i) *
//! decode(q[i]))` in registers, 32 values per step.
//!
//! The portable loops decode a span into f32 and narrow it in a second loop
//! ([`quant_core::dtype::narrowed`]); here the decode ([`quant_core::codec::x86`]: the
//! arithmetic of `decode_fast` and [`e8m0::decode`]), the product (the same IEEE
//! product, in the same operand order) and the narrowing
//! ([`quant_core::bf16_narrow::x86::narrow32_exact`]) happen per vector, so the f32 span
//! is neither stored nor reloaded. Ordinary stores: each task writes long sequential
//! runs, which streaming did not speed up (`docs/benchmarks-history.md`, twentieth session).
//!
//! [`e8m0::decode`]: quant_core::codec::e8m0::decode

use std::arch::x86_64::{
    __m128i, __m512, __m512i, _MM_FROUND_NO_EXC, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128,
    _mm512_castsi256_si512, _mm512_cvtepu8_epi32, _mm512_cvtps_ph, _mm512_inserti64x4,
    _mm512_mul_ps, _mm512_set1_epi32, _mm512_storeu_si512,
};

use quant_core::bf16_narrow::x86::narrow32_exact;
use quant_core::codec::x86 as codec;
use quant_core::simd::Level;

use crate::kernels::Codes;
use crate::scale::{BLOCK, Mxfp8Dtype};

/// `out[i] = bf16_bits(scale(code_i) * decode(q[i]))` for the whole run, the bits of the
/// portable decode-then-narrow. Returns `false` (nothing written) unless `level` is
/// [`Level::Avx512`], the CPU has AVX-512 BF16 and the lengths fit: `out.len() ==
/// q.len()`, a multiple of 32, with one code per block or per value; the caller then
/// runs the portable loops.
#[inline(always)]
pub(crate) fn decode_bf16(
    level: Level,
    dtype: Mxfp8Dtype,
    q: &[u8],
    codes: Codes<'_>,
    out: &mut [u16],
) -> bool {
    if !fits(level, q, codes, out) || !quant_core::simd::has(quant_core::simd::Ext::Bf16) {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F, BW, DQ (`Level::Avx512` is only active where it
    // does) and BF16 (checked); the lengths were checked above.
    unsafe { decode_steps_bf16(dtype, q, codes, out) };
    true
}

/// [`decode_bf16`] into f16 bits: each pair of vectors narrowed by `vcvtps2ph` (round
/// to nearest even, subnormals kept, NaN quieted), the bits of the portable loops'
/// `Element::narrow_slice` for f16, which narrows with the same instruction. No
/// extension beyond [`Level::Avx512`]. (Into f16 the columnwise dequantize took the
/// portable loops at AVX-512 until the fifty-second session: x1.2 slower than bf16.)
#[inline(always)]
pub(crate) fn decode_f16(
    level: Level,
    dtype: Mxfp8Dtype,
    q: &[u8],
    codes: Codes<'_>,
    out: &mut [u16],
) -> bool {
    if !fits(level, q, codes, out) {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F, BW and DQ (`Level::Avx512` is only active where it
    // does); the lengths were checked above.
    unsafe { decode_steps_f16(dtype, q, codes, out) };
    true
}

/// Whether the kernels take the run: [`Level::Avx512`], `out.len() == q.len()`, a
/// multiple of 32, with one code per block or per value.
fn fits(level: Level, q: &[u8], codes: Codes<'_>, out: &[u16]) -> bool {
    let n = q.len();
    level == Level::Avx512 && out.len() == n && n.is_multiple_of(2 * 16) && codes.fit(n)
}

/// One function per output type after the checks, each with its narrowing's target
/// features: one loop per element type and code layout ([`steps`], a function of its
/// own for each), so that neither is tested per step.
macro_rules! decode_steps {
    ($(#[$doc:meta])* $name:ident, $features:literal, $narrow:expr) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        fn $name(dtype: Mxfp8Dtype, q: &[u8], codes: Codes<'_>, out: &mut [u16]) {
            use Mxfp8Dtype::{E4M3, E5M2};
            let narrow = $narrow;
            match (dtype, codes) {
                (E4M3, Codes::PerBlock(c)) => steps::<false, false>(q, c, out, narrow),
                (E5M2, Codes::PerBlock(c)) => steps::<true, false>(q, c, out, narrow),
                (E4M3, Codes::Each(c)) => steps::<false, true>(q, c, out, narrow),
                (E5M2, Codes::Each(c)) => steps::<true, true>(q, c, out, narrow),
            }
        }
    };
}

decode_steps!(
    /// [`decode_bf16`] after its checks.
    decode_steps_bf16,
    "avx512f,avx512bw,avx512dq,avx512bf16",
    |lo, hi| narrow32_exact(lo, hi)
);

decode_steps!(
    /// [`decode_f16`] after its checks.
    decode_steps_f16,
    "avx512f,avx512bw,avx512dq",
    |lo, hi| {
        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let lo = _mm512_cvtps_ph::<NEAREST>(lo);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), _mm512_cvtps_ph::<NEAREST>(hi))
    }
);

/// The loop of one output type for E5M2 (else E4M3) values under scale codes `c`, one
/// per value where `EACH` (else one per block): 32 values per step, narrowed by
/// `narrow(first 16, last 16)` into one 64-byte store.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
fn steps<const E5M2: bool, const EACH: bool>(
    q: &[u8],
    c: &[u8],
    out: &mut [u16],
    narrow: impl Fn(__m512, __m512) -> __m512i,
) {
    let widen = |b: &[u8]| {
        // SAFETY: `b` is 16 bytes (one unaligned 128-bit load).
        _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(b[..16].as_ptr().cast::<__m128i>()) })
    };
    let scales = |j: usize| -> (__m512, __m512) {
        if EACH {
            (
                codec::e8m0_16(widen(&c[j..])),
                codec::e8m0_16(widen(&c[j + 16..])),
            )
        } else {
            let s = codec::e8m0_16(_mm512_set1_epi32(i32::from(c[j / BLOCK])));
            (s, s)
        }
    };
    let decode = |b: &[u8]| {
        if E5M2 {
            codec::e5m2_16(widen(b))
        } else {
            codec::e4m3_16(widen(b))
        }
    };
    for (j, o) in (0..q.len()).step_by(32).zip(out.chunks_exact_mut(32)) {
        let (s0, s1) = scales(j);
        // `scale * value`, the portable loops' order (NaN operands propagate the same).
        let lo = _mm512_mul_ps(s0, decode(&q[j..]));
        let hi = _mm512_mul_ps(s1, decode(&q[j + 16..]));
        // SAFETY: `o` is 32 u16 = 64 bytes (one unaligned 512-bit store).
        unsafe { _mm512_storeu_si512(o.as_mut_ptr().cast(), narrow(lo, hi)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::scale;
    use quant_core::dtype::bf16_bits;

    /// Every value code under every scale code (NaN, zero's subnormal `2^-127` and the
    /// products that overflow or turn subnormal among them, in f16 too), both element
    /// types, both code layouts, into bf16 and f16: the portable decode, product and
    /// narrowing.
    #[test]
    fn decode_equals_the_portable_loop() {
        // Under the level lock: a level test running at the same time may hide AVX-512
        // BF16 (every combination is tested), and the kernel would then decline.
        let ran = quant_core::simd::with_level(Level::Avx512, || {
            let bf16 = quant_core::simd::has(quant_core::simd::Ext::Bf16);
            if !bf16 {
                eprintln!("skipped bf16: this CPU has no AVX-512 BF16");
            }
            let n = 256 * 32;
            // Value codes cycle through all 256; each 32-value block takes one scale code
            // (all 256 of them), and per-value codes take every scale with every value.
            let q: Vec<u8> = (0..n).map(|i| (i * 7 % 256) as u8).collect();
            let per_block: Vec<u8> = (0..n / BLOCK).map(|b| b as u8).collect();
            let each: Vec<u8> = (0..n).map(|i| (i / 256 + i * 13) as u8).collect();
            for dtype in [Mxfp8Dtype::E4M3, Mxfp8Dtype::E5M2] {
                let table = match dtype {
                    Mxfp8Dtype::E4M3 => quant_core::codec::e4m3::decode_fast,
                    Mxfp8Dtype::E5M2 => quant_core::codec::e5m2::decode_fast,
                };
                let by_block = |i: usize| per_block[i / BLOCK];
                let by_value = |i: usize| each[i];
                let cases: [(Codes<'_>, &dyn Fn(usize) -> u8); 2] = [
                    (Codes::PerBlock(&per_block), &by_block),
                    (Codes::Each(&each), &by_value),
                ];
                for (codes, code_of) in cases {
                    let mut got = vec![0u16; n];
                    let mut f16s = vec![0u16; n];
                    assert!(!bf16 || decode_bf16(Level::Avx512, dtype, &q, codes, &mut got));
                    assert!(decode_f16(Level::Avx512, dtype, &q, codes, &mut f16s));
                    for i in 0..n {
                        let v = scale(code_of(i)) * table(q[i]);
                        let case =
                            format!("{dtype:?} value {:#04x} scale {:#04x}", q[i], code_of(i));
                        assert!(!bf16 || got[i] == bf16_bits(v), "bf16 {case}");
                        assert_eq!(f16s[i], half::f16::from_f32(v).to_bits(), "f16 {case}");
                    }
                }
            }
        });
        if ran.is_none() {
            eprintln!("skipped: this CPU has no AVX-512");
        }
    }

    #[test]
    fn decode_declines_what_does_not_fit() {
        let mut out = [0u16; 64];
        let (q, c) = ([0u8; 64], [127u8; 64]);
        let (e4, each) = (Mxfp8Dtype::E4M3, Codes::Each(&c));
        assert!(!decode_f16(Level::Avx2, e4, &q, each, &mut out));
        assert!(!decode_f16(Level::Avx512, e4, &q, each, &mut out[..32]));
        assert!(!decode_f16(
            Level::Avx512,
            e4,
            &q[..48],
            Codes::Each(&c[..48]),
            &mut out[..48]
        ));
        assert_eq!(out, [0; 64]);
        decode_bf16_declines_what_does_not_fit();
    }

    fn decode_bf16_declines_what_does_not_fit() {
        let (q, c) = ([0u8; 64], [127u8; 64]);
        let e4 = Mxfp8Dtype::E4M3;
        let mut out = [0u16; 64];
        let avx = Level::Avx512;
        assert!(!decode_bf16(
            Level::Scalar,
            e4,
            &q,
            Codes::Each(&c),
            &mut out
        ));
        assert!(!decode_bf16(
            avx,
            e4,
            &q[..48],
            Codes::Each(&c[..48]),
            &mut out[..48]
        ));
        assert!(!decode_bf16(avx, e4, &q, Codes::Each(&c[..63]), &mut out));
        assert!(!decode_bf16(
            avx,
            e4,
            &q,
            Codes::PerBlock(&c[..1]),
            &mut out
        ));
        assert!(!decode_bf16(avx, e4, &q, Codes::Each(&c), &mut out[..32]));
    }
}
