//! The bf16 decoder of the parent module ([`super::Fp8::decode_bf16`]) at AVX2: 16 codes
//! per 256-bit vector in 16-bit lanes, no f32 formed.
//!
//! The AVX-512 kernel's steps, with AVX2's substitutes: the subnormal codes' table is a
//! byte shuffle (`vpshufb`, eight 16-bit entries in one 128-bit lane, each lane's index
//! pair `2m, 2m + 1` made by one multiply), and the masks are compare vectors. Under one
//! exponent per block the exponent is folded into the block's constants (the normal
//! rebias and the subnormal table); under one per lane ([`decode_lanes`]) it is added
//! after the two routes meet, and a zero code is masked back to zero; those runs are
//! written by the stream module's step writers, streamed where the caller asks.
//!
//! Where the f32 route takes 8 codes per vector (widen to 32-bit lanes, decode, multiply,
//! round to bf16, pack), this takes 16 with about as many operations per vector.

use std::arch::x86_64::{
    __m128i, __m256i, _mm_cvtsi32_si128, _mm_loadu_si128, _mm256_add_epi16, _mm256_and_si256,
    _mm256_andnot_si256, _mm256_blendv_epi8, _mm256_cmpeq_epi16, _mm256_cmpgt_epi16,
    _mm256_cvtepu8_epi16, _mm256_loadu_si256, _mm256_mullo_epi16, _mm256_or_si256,
    _mm256_set1_epi16, _mm256_setzero_si256, _mm256_shuffle_epi8, _mm256_sll_epi16,
    _mm256_slli_epi16, _mm256_storeu_si256, _mm256_sub_epi16,
};

use super::Fp8;
use crate::stream::StoreMode;
use crate::stream::avx2::write_u16_steps;

/// The call's constant vectors.
struct Consts {
    fp8: Fp8,
    low: __m256i,
    /// `2^MBITS`: a magnitude below it is zero or subnormal.
    first_normal: __m256i,
    /// `nan_from - 1`: a magnitude above it is NaN.
    nan_above: __m256i,
    nan: __m256i,
    inf_code: __m256i,
    inf: __m256i,
    sign: __m256i,
    zero: __m256i,
    /// `(127 - BIAS) << 7`: a normal code's rebias at `j = 0`.
    rebias: __m256i,
    /// The subnormal codes' bf16 bits at `j = 0`, entry 0 zero (both 128-bit lanes).
    sub: __m256i,
    /// `0x0202` and `0x0100`: a magnitude `m` times the first plus the second is the
    /// shuffle index pair of table entry `m`.
    pair: (__m256i, __m256i),
    /// `7 - MBITS`, the normal shift, as a shift count.
    sh: __m128i,
}

impl Consts {
    #[inline]
    #[target_feature(enable = "avx2")]
    fn new(fp8: Fp8) -> Consts {
        let sub: [u16; 16] = std::array::from_fn(|i| {
            let m = i % 8;
            if m > 0 && m < 1 << fp8.mbits {
                fp8.subnormal_bits(m as u8)
            } else {
                0
            }
        });
        Consts {
            fp8,
            low: _mm256_set1_epi16(0x7F),
            first_normal: _mm256_set1_epi16(1 << fp8.mbits),
            nan_above: _mm256_set1_epi16(i16::from(fp8.nan_from) - 1),
            nan: _mm256_set1_epi16(0x7FC0),
            inf_code: _mm256_set1_epi16(fp8.inf_code.map_or(-1, i16::from)),
            inf: _mm256_set1_epi16(0x7F80),
            sign: _mm256_set1_epi16(i16::MIN),
            zero: _mm256_setzero_si256(),
            rebias: _mm256_set1_epi16(((127 - fp8.bias) << 7) as i16),
            // SAFETY: `sub` is 16 u16 = 32 bytes (one unaligned 256-bit load).
            sub: unsafe { _mm256_loadu_si256(sub.as_ptr().cast()) },
            pair: (_mm256_set1_epi16(0x0202), _mm256_set1_epi16(0x0100)),
            sh: _mm_cvtsi32_si128(7 - fp8.mbits as i32),
        }
    }

    /// `(rebias, table)` under the exponent `j`: both moved by `j << 7`, the table's
    /// zero entry kept zero.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn at(&self, j: i32) -> (__m256i, __m256i) {
        // `j << 7` fits an i16: `j` is within the exact range.
        let jsh = _mm256_set1_epi16((j << 7) as i16);
        let moved = _mm256_andnot_si256(_mm256_cmpeq_epi16(self.sub, self.zero), jsh);
        (
            _mm256_add_epi16(self.rebias, jsh),
            _mm256_add_epi16(self.sub, moved),
        )
    }
}

/// Sixteen codes `x` (zero-extended to 16-bit lanes) as bf16 bits, before the exponent
/// where `rebias` and `table` do not hold it ([`Consts::at`] folds it in), and before
/// the specials: returns the magnitudes and the values.
#[inline]
#[target_feature(enable = "avx2")]
fn magnitudes(c: &Consts, x: __m256i, rebias: __m256i, table: __m256i) -> (__m256i, __m256i) {
    let mag = _mm256_and_si256(x, c.low);
    let norm = _mm256_add_epi16(_mm256_sll_epi16(mag, c.sh), rebias);
    let idx = _mm256_add_epi16(_mm256_mullo_epi16(mag, c.pair.0), c.pair.1);
    // Indices past the table (normal magnitudes) give garbage, which the blend drops.
    let sub = _mm256_shuffle_epi8(table, idx);
    let is_sub = _mm256_cmpgt_epi16(c.first_normal, mag);
    (mag, _mm256_blendv_epi8(norm, sub, is_sub))
}

/// NaN and infinity patched in and the code's sign (bit 7 of `x`) copied.
#[inline]
#[target_feature(enable = "avx2")]
fn specials(c: &Consts, x: __m256i, mag: __m256i, v: __m256i) -> __m256i {
    let v = if c.fp8.inf_code.is_some() {
        _mm256_blendv_epi8(v, c.inf, _mm256_cmpeq_epi16(mag, c.inf_code))
    } else {
        v
    };
    let v = _mm256_blendv_epi8(v, c.nan, _mm256_cmpgt_epi16(mag, c.nan_above));
    _mm256_or_si256(v, _mm256_and_si256(_mm256_slli_epi16::<8>(x), c.sign))
}

/// 16 codes from `src` (at least 16), zero-extended to 16-bit lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn load16(src: &[u8]) -> __m256i {
    let s = &src[..16];
    // SAFETY: `s` is 16 bytes (one unaligned 128-bit load).
    _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(s.as_ptr().cast()) })
}

/// Stores 16 lanes at `dst` (at least 16).
#[inline]
#[target_feature(enable = "avx2")]
fn store16(dst: &mut [u16], v: __m256i) {
    let d = &mut dst[..16];
    // SAFETY: `d` is 16 u16 = 32 bytes (one unaligned 256-bit store).
    unsafe { _mm256_storeu_si256(d.as_mut_ptr().cast(), v) };
}

/// [`super::decode_blocks`] after its checks.
///
/// # Safety
/// The CPU must have AVX2; `src.len() == dst.len() == js.len() * block`, `block` a
/// multiple of 32; every `j` satisfies [`Fp8::decode_exact`].
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn decode_blocks(
    fp8: Fp8,
    src: &[u8],
    block: usize,
    js: &[i32],
    dst: &mut [u16],
) {
    let c = Consts::new(fp8);
    for ((s, d), &j) in src
        .chunks_exact(block)
        .zip(dst.chunks_exact_mut(block))
        .zip(js)
    {
        let (rebias, table) = c.at(j);
        for (s, d) in s.chunks_exact(16).zip(d.chunks_exact_mut(16)) {
            let x = load16(s);
            let (mag, v) = magnitudes(&c, x, rebias, table);
            store16(d, specials(&c, x, mag, v));
        }
    }
}

/// [`super::ExactExps::decode`] after its checks, written by
/// [`crate::stream::avx2::write_u16_steps`] in `mode` (the streamed stores' fence left
/// to the caller).
///
/// # Safety
/// The CPU must have the [`crate::simd::Level::Avx2`] features; `src.len() ==
/// exps.len() == dst.len()`; every `exps[i] - 127` satisfies [`Fp8::decode_exact`].
#[inline]
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
pub(super) unsafe fn decode_lanes(
    fp8: Fp8,
    src: &[u8],
    exps: &[u8],
    dst: &mut [u16],
    mode: StoreMode,
) {
    let c = Consts::new(fp8);
    let bias = _mm256_set1_epi16(127);
    let step = |j: usize| {
        let x = load16(&src[j..]);
        let (mag, v) = magnitudes(&c, x, c.rebias, c.sub);
        // `(e - 127) << 7`: the lane's `j` in the exponent field (wrapping as i16 adds
        // do, which the exact range keeps from mattering).
        let jsh = _mm256_slli_epi16::<7>(_mm256_sub_epi16(load16(&exps[j..]), bias));
        let v = _mm256_add_epi16(v, jsh);
        let v = _mm256_andnot_si256(_mm256_cmpeq_epi16(mag, c.zero), v);
        specials(&c, x, mag, v)
    };
    let one = |j: usize| fp8.decode_bf16(src[j], i32::from(exps[j]) - 127);
    write_u16_steps(dst, mode, step, one);
}
