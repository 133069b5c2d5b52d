//! The AVX-512 body of rowwise encoding: scaled values to packed E2M1 nibbles, four
//! blocks (64 values, 32 bytes) per step.
//!
//! The portable loop ([`crate::engine`]'s `encode_pack_rn`) vectorizes to one vector
//! per block and ends each block with a `vpmovqb` store of its 8 bytes; on Zen 4 that
//! narrowing store was the most-sampled instruction of the NVFP4 quantize profile.
//! Here two blocks' codes share one vector of 16-bit lanes, each pair of codes is
//! folded into the low byte of its u32 lane ([`pair_bytes16`]), and four blocks' bytes
//! are gathered by one `vpermt2b` (VBMI) into one 32-byte store; without VBMI
//! (Skylake-SP, Cascade Lake, Cooper Lake) each two blocks take a `vpmovdb` store.
//!
//! Each lane's code comes from two 32-entry tables on the bucket `|x| >> 21` (see
//! [`codes`]), filled from the scalar [`quant_core::codec::e2m1::encode`] when a run
//! starts; [`codes`] and [`sr_codes`] (one block per vector) remain for the last blocks
//! of a run that make no step of four.
//!
//! Rounding to nearest (the rowwise block loop, with or without VBMI, and the columnwise
//! pairs) takes a shorter route ([`codes16`]): each f32 lane becomes a 12-bit key (sign,
//! bucket, and whether the value lies inside its bucket), two vectors' keys share one
//! vector of 16-bit lanes, and one 64-entry `vpermt2w` gives 32 codes where [`codes`]
//! takes two `vpermt2d` for 16. In the NVFP4 quantize from bf16 and f16 that was x1.09
//! rowwise and columnwise (fifty-seventh session of issue 8); from f32, which is closer
//! to its memory bound, no change.
//!
//! Stochastic rounding keeps its jitter in f32 lanes (one fused multiply-add, [`jittered`],
//! whose rounding the rule specifies) and does the rest in 16-bit lanes
//! ([`sr_codes16`]): the bucket, the sign and NaN are all in the high half of a lane.
//! About 67 vector operations per four blocks where one block per vector took 87: the
//! NVFP4 stochastic-rounding quantize from bf16 and f16 x1.07-1.08 rowwise, x1.04
//! columnwise, from f32 x1.02 (sixtieth session).

use std::arch::x86_64::{
    __m128i, __m256i, __m512, __m512i, _mm_loadu_si128, _mm_storel_epi64, _mm_storeu_si128,
    _mm256_loadu_si256, _mm256_storeu_si256, _mm512_add_epi32, _mm512_and_si512,
    _mm512_castps_si512, _mm512_castsi512_ps, _mm512_castsi512_si256, _mm512_cmple_epu16_mask,
    _mm512_cmple_epu32_mask, _mm512_cvtepi32_epi8, _mm512_cvtepi32_ps, _mm512_cvtepi64_epi8,
    _mm512_cvtepu8_epi32, _mm512_cvtph_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_loadu_si512,
    _mm512_mask_blend_epi32, _mm512_mask_ternarylogic_epi32, _mm512_maskz_srli_epi16,
    _mm512_max_epu16, _mm512_max_epu32, _mm512_min_epu16, _mm512_min_epu32, _mm512_mul_ps,
    _mm512_or_si512, _mm512_packus_epi32, _mm512_permutex2var_epi8, _mm512_permutex2var_epi16,
    _mm512_permutex2var_epi32, _mm512_permutexvar_epi16, _mm512_permutexvar_epi32,
    _mm512_set1_epi16, _mm512_set1_epi32, _mm512_set1_ps, _mm512_slli_epi32, _mm512_srli_epi16,
    _mm512_srli_epi32, _mm512_srli_epi64, _mm512_srlv_epi32, _mm512_sub_epi32,
    _mm512_ternarylogic_epi32, _mm512_test_epi32_mask,
};

use quant_core::simd::Level;

use crate::scale::BLOCK;

/// A run of input values: f32, or bf16 or f16 as bits (widened in the register).
#[derive(Clone, Copy)]
pub(crate) enum Run<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    F16(&'a [u16]),
}

impl Run<'_> {
    /// The number of values.
    pub(crate) fn len(&self) -> usize {
        match self {
            Run::F32(w) => w.len(),
            Run::Bf16(w) | Run::F16(w) => w.len(),
        }
    }

    /// Whether the run encodes as whole blocks into `out` at every level: `enc.len()`
    /// blocks of values, half as many bytes of `out` as values, and (stochastic
    /// rounding) a row of `rnd` per block.
    pub(crate) fn fits(&self, enc: &[f32], rnd: Option<&[[u8; BLOCK]]>, out: &[u8]) -> bool {
        self.len() == BLOCK * enc.len()
            && out.len() * 2 == self.len()
            && rnd.is_none_or(|r| r.len() == enc.len())
    }
}

/// Encodes whole blocks: byte `j` of block `b` holds the codes of `x[16b + 2j] * enc[b]`
/// (low nibble) and `x[16b + 2j + 1] * enc[b]` (high nibble), the bytes of the portable
/// `encode_pack_rn` block by block (bf16 values widened exactly first). Returns `false`
/// (nothing written) unless the CPU has AVX-512 F and BW and the lengths agree
/// (`x.len() == 16 * enc.len() == 2 * out.len()`); the caller then runs the portable
/// loop. (The engine calls [`encode_run`]; this and [`encode_run_sr`] are its two
/// modes, as the tests name them.)
#[cfg(test)]
pub(crate) fn encode_run_rn(x: Run<'_>, enc: &[f32], out: &mut [u8]) -> bool {
    encode_run(x, enc, None, out, &[])
}

/// [`encode_run_rn`] under stochastic rounding: value `e` of block `b` takes the random
/// byte `rnd[b][e]`, the bytes of the portable `encode_pack_sr` (TE's rule,
/// [`crate::sr::stochastic_round_e2m1`]). Also `false` unless `rnd` has a row per block.
#[cfg(test)]
pub(crate) fn encode_run_sr(x: Run<'_>, enc: &[f32], rnd: &[[u8; BLOCK]], out: &mut [u8]) -> bool {
    encode_run(x, enc, Some(rnd), out, &[])
}

/// `encode_run_rn` (`rnd` `None`) or `encode_run_sr` (the two modes, as the tests call
/// them), also prefetching `ahead`
/// (any bytes the caller reads next; may be empty) spread evenly over the block
/// loop's steps, a few cache lines per four blocks, so that a caller whose only loads
/// from memory precede the encode keeps the memory busy through it. `false` (nothing
/// written) as for those, or if `rnd` has not a row per block.
#[inline]
pub(crate) fn encode_run(
    x: Run<'_>,
    enc: &[f32],
    rnd: Option<&[[u8; BLOCK]]>,
    out: &mut [u8],
    ahead: &[u8],
) -> bool {
    if !x.fits(enc, rnd, out) || !supported() {
        return false;
    }
    if quant_core::simd::has(quant_core::simd::Ext::Vbmi) {
        match x {
            // SAFETY: the CPU has AVX-512 F and BW (`supported`) and VBMI (checked).
            Run::F32(w) => unsafe { vbmi::encode_f32(w, enc, rnd, out, ahead) },
            // SAFETY: as above.
            Run::Bf16(w) => unsafe { vbmi::encode_bf16(w, enc, rnd, out, ahead) },
            // SAFETY: as above.
            Run::F16(w) => unsafe { vbmi::encode_f16(w, enc, rnd, out, ahead) },
        }
    } else {
        match x {
            // SAFETY: the CPU has AVX-512 F and BW (`supported`).
            Run::F32(w) => unsafe { bw::encode_f32(w, enc, rnd, out, ahead) },
            // SAFETY: as above.
            Run::Bf16(w) => unsafe { bw::encode_bf16(w, enc, rnd, out, ahead) },
            // SAFETY: as above.
            Run::F16(w) => unsafe { bw::encode_f16(w, enc, rnd, out, ahead) },
        }
    }
    true
}

/// Two stored rows of a columnwise group at once: byte `c` holds the codes of
/// `lo[c] * enc[c]` (low nibble) and `hi[c] * enc[c]` (high nibble), one multiplier per
/// column, the bytes of the portable encode-then-pack of two neighbouring rows. Returns
/// `false` (nothing written) unless the CPU has AVX-512 F and BW, both rows are
/// the same kind and every length equals `enc.len()`, a multiple of 16.
#[inline]
pub(crate) fn encode_pairs_rn(lo: Run<'_>, hi: Run<'_>, enc: &[f32], out: &mut [u8]) -> bool {
    if !pairs_fit(enc.len(), &[lo.len(), hi.len(), out.len()], 0) {
        return false;
    }
    match (lo, hi) {
        // SAFETY: the CPU has AVX-512 F and BW (checked above).
        (Run::F32(a), Run::F32(b)) => unsafe { pairs_f32(a, b, enc, out) },
        // SAFETY: as above.
        (Run::Bf16(a), Run::Bf16(b)) => unsafe { pairs_bf16(a, b, enc, out) },
        // SAFETY: as above.
        (Run::F16(a), Run::F16(b)) => unsafe { pairs_f16(a, b, enc, out) },
        _ => return false,
    }
    true
}

/// [`encode_pairs_rn`] under stochastic rounding, for rows `lo` and `hi` (stored rows
/// `2q` and `2q + 1` of a 16-row group): column `c`'s random bytes are bytes
/// `shift / 8` (for `lo`) and `shift / 8 + 1` (for `hi`) of `words[c]`, the word of
/// its block that holds those two elements ([`crate::sr::element_bits`] of the column's
/// block). The bytes of the portable per-element rule then pack. `false` (nothing
/// written) as for [`encode_pairs_rn`], or unless `words.len() == enc.len()` and
/// `shift` is 0 or 16.
#[inline]
pub(crate) fn encode_pairs_sr(
    lo: Run<'_>,
    hi: Run<'_>,
    enc: &[f32],
    words: &[u32],
    shift: u32,
    out: &mut [u8],
) -> bool {
    if !pairs_fit(
        enc.len(),
        &[lo.len(), hi.len(), out.len(), words.len()],
        shift,
    ) {
        return false;
    }
    match (lo, hi) {
        // SAFETY: the CPU has AVX-512 F and BW (checked above).
        (Run::F32(a), Run::F32(b)) => unsafe { pairs_f32_sr(a, b, enc, words, shift, out) },
        // SAFETY: as above.
        (Run::Bf16(a), Run::Bf16(b)) => unsafe { pairs_bf16_sr(a, b, enc, words, shift, out) },
        // SAFETY: as above.
        (Run::F16(a), Run::F16(b)) => unsafe { pairs_f16_sr(a, b, enc, words, shift, out) },
        _ => return false,
    }
    true
}

/// [`encode_pairs_rn`] of two bf16 rows interleaved in `w`: `w[c]` holds the bits of
/// the first row's value of column `c` in its low half and the second row's in its
/// high half (what [`crate::rht_x86::rounded_bf16x2`] writes). One load gives both
/// rows of 16 columns, each widened by one operation. `false` (nothing written) unless
/// the CPU has AVX-512 F and BW and `w` and `out` are `enc.len()` long, a multiple of
/// 16.
#[inline]
pub(crate) fn encode_bf16x2_rn(w: &[u32], enc: &[f32], out: &mut [u8]) -> bool {
    if !pairs_fit(enc.len(), &[w.len(), out.len()], 0) {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F and BW (checked above).
    unsafe { pairs_bf16x2(w, enc, out) };
    true
}

/// [`encode_bf16x2_rn`] under stochastic rounding, `words` and `shift` as for
/// [`encode_pairs_sr`]. `false` (nothing written) as for [`encode_bf16x2_rn`], or
/// unless `words.len() == enc.len()` and `shift` is 0 or 16.
#[inline]
pub(crate) fn encode_bf16x2_sr(
    w: &[u32],
    enc: &[f32],
    words: &[u32],
    shift: u32,
    out: &mut [u8],
) -> bool {
    if !pairs_fit(enc.len(), &[w.len(), out.len(), words.len()], shift) {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F and BW (checked above).
    unsafe { pairs_bf16x2_sr(w, enc, words, shift, out) };
    true
}

/// Whether a pair encoder takes a call of `n` columns: every length in `lens` is `n`, a
/// multiple of 16, `shift` (the random byte's offset under stochastic rounding; 0 for
/// rounding to nearest) is 0 or 16, and the CPU runs these encoders.
fn pairs_fit(n: usize, lens: &[usize], shift: u32) -> bool {
    lens.iter().all(|&l| l == n)
        && n.is_multiple_of(BLOCK)
        && matches!(shift, 0 | 16)
        && supported()
}

/// [`encode_bf16x2_rn`] after its checks.
#[target_feature(enable = "avx512f,avx512bw")]
fn pairs_bf16x2(w: &[u32], enc: &[f32], out: &mut [u8]) {
    pairs_rn_with(|c| bf16x2_low(w, c), |c| bf16x2_high(w, c), enc, out)
}

/// [`encode_bf16x2_sr`] after its checks.
#[target_feature(enable = "avx512f,avx512bw")]
fn pairs_bf16x2_sr(w: &[u32], enc: &[f32], words: &[u32], shift: u32, out: &mut [u8]) {
    let (lo, hi) = (|c| bf16x2_low(w, c), |c| bf16x2_high(w, c));
    pairs_sr_with(lo, hi, enc, words, shift, out)
}

/// The 16 words of `w` from `c` (one unaligned 512-bit load).
#[inline]
#[target_feature(enable = "avx512f")]
fn load_words(w: &[u32], c: usize) -> __m512i {
    let v = &w[c..c + 16];
    // SAFETY: `v` is 16 u32.
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

/// The low-half bf16 values of `w[c..c + 16]` as f32 (exact: a shift into the high half).
#[inline]
#[target_feature(enable = "avx512f")]
fn bf16x2_low(w: &[u32], c: usize) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(load_words(w, c)))
}

/// The high-half bf16 values of `w[c..c + 16]` as f32 (exact: the low half cleared).
#[inline]
#[target_feature(enable = "avx512f")]
fn bf16x2_high(w: &[u32], c: usize) -> __m512 {
    _mm512_castsi512_ps(_mm512_and_si512(
        load_words(w, c),
        _mm512_set1_epi32(!0xFFFF),
    ))
}

/// 16 f32 of `w` from `c` (one unaligned 512-bit load).
#[inline]
#[target_feature(enable = "avx512f")]
fn load16(w: &[f32], c: usize) -> __m512 {
    let v = &w[c..c + 16];
    // SAFETY: `v` is 16 f32.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

/// [`encode_pairs_rn`] of f32 rows after its checks.
#[target_feature(enable = "avx512f,avx512bw")]
fn pairs_f32(a: &[f32], b: &[f32], enc: &[f32], out: &mut [u8]) {
    pairs_rn_with(|c| load16(a, c), |c| load16(b, c), enc, out)
}

/// [`encode_pairs_sr`] of f32 rows after its checks.
#[target_feature(enable = "avx512f,avx512bw")]
fn pairs_f32_sr(a: &[f32], b: &[f32], enc: &[f32], words: &[u32], shift: u32, out: &mut [u8]) {
    pairs_sr_with(|c| load16(a, c), |c| load16(b, c), enc, words, shift, out)
}

/// [`encode_pairs_sr`] of bf16 rows (bits, widened exactly in the register) after its
/// checks.
#[target_feature(enable = "avx512f,avx512bw")]
fn pairs_bf16_sr(a: &[u16], b: &[u16], enc: &[f32], words: &[u32], shift: u32, out: &mut [u8]) {
    let lo = |c: usize| widen_bf16(&a[c..c + 16]);
    let hi = |c: usize| widen_bf16(&b[c..c + 16]);
    pairs_sr_with(lo, hi, enc, words, shift, out)
}

/// [`encode_pairs_sr`] after its checks, `lo(c)` and `hi(c)` as for [`pairs_with`]: the
/// random bytes shifted out of each column's word in the register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn pairs_sr_with(
    lo: impl Fn(usize) -> __m512,
    hi: impl Fn(usize) -> __m512,
    enc: &[f32],
    words: &[u32],
    shift: u32,
    out: &mut [u8],
) {
    let k = Consts::new();
    let byte = _mm512_set1_epi32(0xFF);
    let shifts = [
        _mm512_set1_epi32(shift as i32),
        _mm512_set1_epi32(shift as i32 + 8),
    ];
    let bytes = |c: usize, a, b| {
        // SAFETY: `c + 16 <= words.len()` (checked lengths, `c` steps by 16 below
        // `enc.len()`); one unaligned 512-bit load.
        let w = unsafe { _mm512_loadu_si512(words.as_ptr().add(c).cast()) };
        let r = |row: usize| _mm512_and_si512(_mm512_srlv_epi32(w, shifts[row]), byte);
        let (ta, tb) = (jittered(a, r(0), &k), jittered(b, r(1), &k));
        _mm512_cvtepi32_epi8(pair_bytes16(sr_codes16(
            (a, ta),
            (b, tb),
            k.side_by_side,
            &k,
        )))
    };
    pairs_with(lo, hi, bytes, enc, out)
}

/// [`encode_pairs_rn`] of bf16 rows (bits, widened exactly in the register) after its
/// checks.
#[target_feature(enable = "avx512f,avx512bw")]
fn pairs_bf16(a: &[u16], b: &[u16], enc: &[f32], out: &mut [u8]) {
    pairs_rn_with(
        |c| widen_bf16(&a[c..c + 16]),
        |c| widen_bf16(&b[c..c + 16]),
        enc,
        out,
    )
}

/// [`encode_pairs_rn`] of f16 rows (bits, widened exactly in the register) after its
/// checks.
#[target_feature(enable = "avx512f,avx512bw")]
fn pairs_f16(a: &[u16], b: &[u16], enc: &[f32], out: &mut [u8]) {
    pairs_rn_with(
        |c| widen_f16(&a[c..c + 16]),
        |c| widen_f16(&b[c..c + 16]),
        enc,
        out,
    )
}

/// [`encode_pairs_sr`] of f16 rows (bits, widened exactly in the register) after its
/// checks.
#[target_feature(enable = "avx512f,avx512bw")]
fn pairs_f16_sr(a: &[u16], b: &[u16], enc: &[f32], words: &[u32], shift: u32, out: &mut [u8]) {
    let lo = |c: usize| widen_f16(&a[c..c + 16]);
    let hi = |c: usize| widen_f16(&b[c..c + 16]);
    pairs_sr_with(lo, hi, enc, words, shift, out)
}

/// 16 f16 values (bits) widened exactly into f32 lanes (`vcvtph2ps`): the values
/// `f16::to_f32` gives the portable loops.
#[inline]
#[target_feature(enable = "avx512f")]
fn widen_f16(v: &[u16]) -> __m512 {
    assert_eq!(v.len(), 16, "widen_f16: one vector of 16 values");
    // SAFETY: `v` is 16 u16 (one unaligned 256-bit load).
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(v.as_ptr().cast::<__m256i>()) })
}

/// 16 bf16 values (bits) widened exactly into f32 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn widen_bf16(v: &[u16]) -> __m512 {
    assert_eq!(v.len(), 16, "widen_bf16: one vector of 16 values");
    // SAFETY: `v` is 16 u16 (one unaligned 256-bit load).
    let v = unsafe { _mm256_loadu_si256(v.as_ptr().cast::<__m256i>()) };
    crate::rht_x86::widen_bf16_bits(v)
}

/// [`encode_pairs_rn`] and [`encode_pairs_sr`] after their checks: `lo(c)` and `hi(c)`
/// give the 16 values of columns `c..c + 16` of each row, `bytes(c, a, b)` the 16
/// stored bytes of their scaled values `a` (of `lo`) and `b` (of `hi`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn pairs_with(
    lo: impl Fn(usize) -> __m512,
    hi: impl Fn(usize) -> __m512,
    bytes: impl Fn(usize, __m512, __m512) -> __m128i,
    enc: &[f32],
    out: &mut [u8],
) {
    for c in (0..enc.len()).step_by(BLOCK) {
        // SAFETY: `c + 16 <= enc.len()` (a multiple of 16); one unaligned 512-bit load.
        let e = unsafe { _mm512_loadu_ps(enc.as_ptr().add(c)) };
        let bytes = bytes(c, _mm512_mul_ps(lo(c), e), _mm512_mul_ps(hi(c), e));
        let o = &mut out[c..c + BLOCK];
        // SAFETY: `o` is 16 bytes (one unaligned 128-bit store).
        unsafe { _mm_storeu_si128(o.as_mut_ptr().cast::<__m128i>(), bytes) };
    }
}

/// [`encode_pairs_rn`] after its checks, `lo(c)` and `hi(c)` as for [`pairs_with`]:
/// each column's two [`key`]s share a u32 lane (`lo`'s in the low half), so that one
/// [`codes_of_keys`] gives both codes side by side and a shift, an or and a `vpmovdb`
/// make the 16 bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn pairs_rn_with(
    lo: impl Fn(usize) -> __m512,
    hi: impl Fn(usize) -> __m512,
    enc: &[f32],
    out: &mut [u8],
) {
    let k = Consts::new();
    let bytes = |_, a, b| {
        let keys = _mm512_or_si512(key(a, &k), _mm512_slli_epi32::<16>(key(b, &k)));
        _mm512_cvtepi32_epi8(pair_bytes16(codes_of_keys(keys, &k)))
    };
    pairs_with(lo, hi, bytes, enc, out)
}

/// Whether this CPU runs these encoders: the project's AVX-512 level (F, BW and the
/// rest, detected once). The rowwise block loop gathers four blocks' bytes with VBMI
/// where the CPU has it ([`vbmi`]), else narrows each two blocks' bytes into one store
/// ([`bw`]).
#[inline]
pub(crate) fn supported() -> bool {
    Level::Avx512.is_supported()
}

/// The rowwise encoder chain of one block-loop store ([`encode_run`] after its checks):
/// `$sr4` and `$rn4` write four blocks (stochastic rounding, rounding to nearest), and
/// every function carries its target features so that it inlines.
macro_rules! encoder {
    ($(#[$doc:meta])* $module:ident, $features:literal, $sr4:ident, $rn4:ident) => {
        $(#[$doc])*
        pub(super) mod $module {
            use super::*;

        /// [`encode_run`] of f32 values after its checks.
        #[target_feature(enable = $features)]
        pub(super) fn encode_f32(w: &[f32], enc: &[f32], rnd: Option<&[[u8; BLOCK]]>, out: &mut [u8], ahead: &[u8]) {
            encode_with(
                #[inline(always)]
                |b| {
                    let v = &w[b * BLOCK..(b + 1) * BLOCK];
                    // SAFETY: `v` is 16 f32 (one unaligned 512-bit load).
                    unsafe { _mm512_loadu_ps(v.as_ptr()) }
                },
                enc,
                rnd,
                out,
                ahead,
            )
        }

        /// [`encode_run`] of bf16 bits after its checks.
        #[target_feature(enable = $features)]
        pub(super) fn encode_bf16(w: &[u16], enc: &[f32], rnd: Option<&[[u8; BLOCK]]>, out: &mut [u8], ahead: &[u8]) {
            encode_with(
                #[inline(always)]
                |b| widen_bf16(&w[b * BLOCK..(b + 1) * BLOCK]),
                enc,
                rnd,
                out,
                ahead,
            )
        }

        /// [`encode_run`] of f16 bits after its checks, each block widened exactly in the
        /// register (`vcvtph2ps`): the values `f16::to_f32` gives the portable loop.
        #[target_feature(enable = $features)]
        pub(super) fn encode_f16(w: &[u16], enc: &[f32], rnd: Option<&[[u8; BLOCK]]>, out: &mut [u8], ahead: &[u8]) {
            encode_with(
                #[inline(always)]
                |b| widen_f16(&w[b * BLOCK..(b + 1) * BLOCK]),
                enc,
                rnd,
                out,
                ahead,
            )
        }

        /// The block loop under either rounding: `load(b)` gives block `b`'s 16 values.
        #[inline]
        #[target_feature(enable = $features)]
        fn encode_with(
            load: impl Fn(usize) -> __m512,
            enc: &[f32],
            rnd: Option<&[[u8; BLOCK]]>,
            out: &mut [u8],
            ahead: &[u8],
        ) {
            let k = Consts::new();
            let scaled = |b: usize| _mm512_mul_ps(load(b), _mm512_set1_ps(enc[b]));
            let code = |b: usize| codes(scaled(b), &k);
            match rnd {
                None => encode_blocks(code, |b, o| $rn4(&scaled, b, &k, o), out, ahead),
                Some(rnd) => {
                    let code = |b: usize| sr_codes(scaled(b), random_lanes(&rnd[b]), &k);
                    encode_blocks(code, |b, o| $sr4(&scaled, rnd, b, &k, o), out, ahead)
                }
            }
        }

        /// The block loop: `four(b, o)` writes blocks `b..b + 4` into `o` (32 bytes), and
        /// `code(b)` gives block `b`'s 16 codes (one per u32 lane) for the last blocks that
        /// make no step of four; `out` holds 8 bytes per block. Each step of four blocks
        /// prefetches its share of `ahead`.
        #[inline]
        #[target_feature(enable = $features)]
        fn encode_blocks(
            code: impl Fn(usize) -> __m512i,
            four: impl Fn(usize, &mut [u8]),
            out: &mut [u8],
            ahead: &[u8],
        ) {
            let pairs = |b: usize| pair_bytes(code(b));
            let nb = out.len() * 2 / BLOCK;
            let per = ahead.len().checked_div(nb).unwrap_or(0);
            let mut b = 0;
            while b + 4 <= nb {
                quant_core::simd::prefetch(ahead.get(b * per..(b + 4) * per).unwrap_or(&[]));
                four(b, &mut out[b * BLOCK / 2..(b + 4) * BLOCK / 2]);
                b += 4;
            }
            for b in b..nb {
                let o = &mut out[b * BLOCK / 2..(b + 1) * BLOCK / 2];
                // SAFETY: `o` is 8 bytes (one unaligned 64-bit store).
                unsafe { _mm_storel_epi64(o.as_mut_ptr().cast(), _mm512_cvtepi64_epi8(pairs(b))) };
            }
        }
        }
    };
}

encoder!(
    /// With VBMI: both roundings encode two blocks per 16-bit-lane step ([`codes16`],
    /// [`sr_codes16`]) and gather four blocks' bytes with one `vpermt2b` ([`rn4_vbmi`],
    /// [`sr4_vbmi`]).
    vbmi,
    "avx512f,avx512bw,avx512vbmi",
    sr4_vbmi,
    rn4_vbmi
);
encoder!(
    /// Without VBMI (Skylake-SP, Cascade Lake, Cooper Lake): as with VBMI but a `vpmovdb`
    /// per two blocks (after a `vpermd` under rounding to nearest: [`rn4_bw`], [`sr4_bw`]).
    bw,
    "avx512f,avx512bw",
    sr4_bw,
    rn4_bw
);

/// Four blocks rounded to nearest into `o` (32 bytes), `scaled(b)` giving block `b`'s
/// scaled values: [`codes16`] for blocks `b, b + 1` and for `b + 2, b + 3`, their pairs
/// of codes folded into bytes ([`pair_bytes16`]) and gathered by one `vpermt2b`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn rn4_vbmi(scaled: &impl Fn(usize) -> __m512, b: usize, k: &Consts, o: &mut [u8]) {
    let ab = pair_bytes16(codes16(scaled(b), scaled(b + 1), k));
    let cd = pair_bytes16(codes16(scaled(b + 2), scaled(b + 3), k));
    let abcd = _mm512_castsi512_si256(_mm512_permutex2var_epi8(ab, k.gather16, cd));
    let o = &mut o[..32];
    // SAFETY: `o` is 32 bytes (one unaligned 256-bit store).
    unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast::<__m256i>(), abcd) };
}

/// [`rn4_vbmi`] without VBMI: each two blocks' [`pair_bytes16`] put in block order by a
/// `vpermd` ([`ORDER16`]) and narrowed by a `vpmovdb` into one 16-byte store.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn rn4_bw(scaled: &impl Fn(usize) -> __m512, b: usize, k: &Consts, o: &mut [u8]) {
    for (i, o) in o[..32].chunks_exact_mut(16).enumerate() {
        let (x, y) = (scaled(b + 2 * i), scaled(b + 2 * i + 1));
        let pairs = _mm512_permutexvar_epi32(k.order16, pair_bytes16(codes16(x, y, k)));
        // SAFETY: `o` is 16 bytes (one unaligned 128-bit store).
        unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(pairs)) };
    }
}

/// Four blocks under stochastic rounding into `o` (32 bytes), `scaled(b)` giving block
/// `b`'s scaled values and `rnd[b]` its random bytes: [`sr_pair_bytes`] for blocks `b,
/// b + 1` and for `b + 2, b + 3`, gathered by one `vpermt2b`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn sr4_vbmi(
    scaled: &impl Fn(usize) -> __m512,
    rnd: &[[u8; BLOCK]],
    b: usize,
    k: &Consts,
    o: &mut [u8],
) {
    let ab = sr_pair_bytes(scaled, rnd, b, k);
    let cd = sr_pair_bytes(scaled, rnd, b + 2, k);
    let abcd = _mm512_castsi512_si256(_mm512_permutex2var_epi8(ab, k.gather_sr, cd));
    let o = &mut o[..32];
    // SAFETY: `o` is 32 bytes (one unaligned 256-bit store).
    unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast::<__m256i>(), abcd) };
}

/// [`sr4_vbmi`] without VBMI: each two blocks' [`sr_pair_bytes`] narrowed by a
/// `vpmovdb` into one 16-byte store.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn sr4_bw(
    scaled: &impl Fn(usize) -> __m512,
    rnd: &[[u8; BLOCK]],
    b: usize,
    k: &Consts,
    o: &mut [u8],
) {
    for (i, o) in o[..32].chunks_exact_mut(16).enumerate() {
        let pairs = _mm512_cvtepi32_epi8(sr_pair_bytes(scaled, rnd, b + 2 * i, k));
        // SAFETY: `o` is 16 bytes (one unaligned 128-bit store).
        unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), pairs) };
    }
}

/// Blocks `b` and `b + 1` under stochastic rounding as bytes: u32 lane `j` holds in its
/// low byte the pair byte `j % 8` of block `b + j / 8` ([`sr_codes16`] in block order,
/// then [`pair_bytes16`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn sr_pair_bytes(
    scaled: &impl Fn(usize) -> __m512,
    rnd: &[[u8; BLOCK]],
    b: usize,
    k: &Consts,
) -> __m512i {
    let (v0, v1) = (scaled(b), scaled(b + 1));
    let t0 = jittered(v0, random_lanes(&rnd[b]), k);
    let t1 = jittered(v1, random_lanes(&rnd[b + 1]), k);
    pair_bytes16(sr_codes16((v0, t0), (v1, t1), k.in_order, k))
}

/// First and last bucket of [`codes`]: `|x| >> 21` (exponent and two mantissa bits) of
/// 0.1875 (every bucket below rounds to code 0) and of 8 (every bucket from it on,
/// infinity and NaN included, saturates to code 7).
const FIRST_BUCKET: u32 = 0x3E40_0000 >> 21;
const LAST_BUCKET: u32 = 0x4100_0000 >> 21;

/// Code of the first value of bucket `b` (`|x| >> 21`), at index `b & 31`, for `b` in
/// `FIRST_BUCKET..=LAST_BUCKET` (a test rebuilds both tables from [`quant_core::codec::e2m1::encode`]).
const AT_START: [u32; 32] = [
    4, 4, 5, 6, 6, 6, 7, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 4,
];
/// Code of the rest of bucket `b`, at index `b & 31`.
const INSIDE: [u32; 32] = [
    4, 5, 5, 6, 6, 7, 7, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4,
];

/// Stochastic rounding's code of `t` (jittered, not NaN) by `(bits(t) >> 22) & 15` for
/// `bits(t) >> 22` clamped to `251..=266`: the grid points 0.5, 1, 1.5, 2, 3, 4 and 6
/// each start such a bucket (252, 254, .. 259), the rule truncates to the grid below,
/// `t < 0.5` (bucket 251 and under) is code 0 and everything from 6 on saturates to 7.
/// A test rebuilds it from the scalar rule.
const SR_CODES: [u32; 16] = [4, 5, 6, 7, 7, 7, 7, 7, 7, 7, 7, 0, 1, 1, 2, 3];
/// The clamp of [`SR_CODES`]' index: the buckets of 0.375 (it and all below are under
/// 0.5) and of 64 (far past 6: it and all above saturate).
const SR_FIRST: u32 = 251;
const SR_LAST: u32 = 266;

/// [`SR_CODES`] for [`sr_codes16`]'s `vpermw`, at index `bucket & 31`: the 16 buckets
/// `SR_FIRST..=SR_LAST` are distinct modulo 32.
const SR_TABLE16: [u16; 32] = {
    let mut t = [0u16; 32];
    let mut b = SR_FIRST;
    while b <= SR_LAST {
        t[(b & 31) as usize] = SR_CODES[(b & 15) as usize] as u16;
        b += 1;
    }
    t
};

/// A `vpermt2w` word order of [`sr_codes16`]: word `w` is the high half of lane `w % 16`
/// of the first vector for `w < 16`, of the second for `w >= 16` (two blocks in order).
const IN_ORDER: [u16; 32] = {
    let mut o = [0u16; 32];
    let mut w = 0;
    while w < 32 {
        o[w] = 2 * w as u16 + 1;
        w += 1;
    }
    o
};

/// The other word order of [`sr_codes16`]: u32 lane `l` holds the high halves of lane
/// `l` of the first vector (low word) and of the second (high word), the columnwise
/// pairs' order (two stored rows side by side).
const SIDE_BY_SIDE: [u16; 32] = {
    let mut o = [0u16; 32];
    let mut w = 0;
    while w < 32 {
        o[w] = (w - w % 2 + 1 + 32 * (w % 2)) as u16;
        w += 1;
    }
    o
};

/// [`sr4_vbmi`]'s byte gather from two [`sr_pair_bytes`] vectors: output byte `i` is the
/// low byte of u32 lane `i % 16`, of the first vector for `i < 16` and of the second
/// (bytes 64..) for `16 <= i < 32`.
const GATHER_SR: [u8; 64] = {
    let mut g = [0u8; 64];
    let mut i = 0;
    while i < 32 {
        g[i] = (4 * (i % 16) + 64 * (i / 16)) as u8;
        i += 1;
    }
    g
};

/// The constants of [`codes`], [`sr_codes`] and of the byte gather, built once per run.
struct Consts {
    abs: __m512i,
    first: __m512i,
    last: __m512i,
    rest: __m512i,
    inf_bits: __m512i,
    sign: __m512i,
    /// Code of a bucket's first value, and of the rest of the bucket, by `bucket & 31`
    /// (entries 0..16, 16..32).
    at_start: [__m512i; 2],
    inside: [__m512i; 2],
    /// [`key`] and [`codes_of_keys`]: bits 0..20 (the carry's mask and addend), the
    /// key's magnitude (11 bits), the clamp of its magnitude, the key of infinity, the sign's
    /// code bit in 16-bit lanes and the 64-entry table ([`TABLE16`]).
    below: __m512i,
    magnitude: __m512i,
    first_key: __m512i,
    last_key: __m512i,
    inf_key: __m512i,
    sign16: __m512i,
    table16: [__m512i; 2],
    /// `vpermt2b` indices of [`rn4_vbmi`]: the pair bytes of four blocks in order.
    gather16: __m512i,
    /// `vpermd` indices of [`rn4_bw`] ([`ORDER16`]).
    order16: __m512i,
    /// [`sr_codes`]: the bits of 1.0 and 4.0, the exponent mask, 9 in the exponent
    /// field, the bucket clamp and the code table.
    one: __m512i,
    four: __m512i,
    exponent: __m512i,
    nine: __m512i,
    sr_first: __m512i,
    sr_last: __m512i,
    sr_codes: __m512i,
    /// [`sr_codes16`]: its bucket clamp and 32-entry table ([`SR_TABLE16`]) in 16-bit
    /// lanes, the high half of infinity, and its two `vpermt2w` word orders
    /// ([`IN_ORDER`], [`SIDE_BY_SIDE`]).
    sr_first16: __m512i,
    sr_last16: __m512i,
    sr_table16: __m512i,
    inf_high: __m512i,
    in_order: __m512i,
    side_by_side: __m512i,
    /// `vpermt2b` indices of [`sr4_vbmi`] ([`GATHER_SR`]).
    gather_sr: __m512i,
}

impl Consts {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new() -> Consts {
        Consts {
            abs: _mm512_set1_epi32(0x7FFF_FFFF),
            first: _mm512_set1_epi32(FIRST_BUCKET as i32),
            last: _mm512_set1_epi32(LAST_BUCKET as i32),
            rest: _mm512_set1_epi32((1 << 21) - 1),
            inf_bits: _mm512_set1_epi32(0x7F80_0000),
            sign: _mm512_set1_epi32(8),
            at_start: halves(&AT_START),
            inside: halves(&INSIDE),
            below: _mm512_set1_epi32((1 << 20) - 1),
            magnitude: _mm512_set1_epi16(0x07FF),
            first_key: _mm512_set1_epi16((2 * FIRST_BUCKET) as i16),
            last_key: _mm512_set1_epi16((2 * LAST_BUCKET) as i16),
            inf_key: _mm512_set1_epi16((0x7F80_0000u32 >> 20) as i16),
            sign16: _mm512_set1_epi16(8),
            // SAFETY: each half is 32 u16 (one unaligned 512-bit load).
            table16: unsafe { [0, 32].map(|o| _mm512_loadu_si512(TABLE16[o..].as_ptr().cast())) },
            // SAFETY: both types are 64 bytes of plain integers.
            gather16: unsafe { std::mem::transmute::<[u8; 64], __m512i>(GATHER16) },
            // SAFETY: 16 u32 (one unaligned 512-bit load).
            order16: unsafe { _mm512_loadu_si512(ORDER16.as_ptr().cast()) },
            one: _mm512_set1_epi32(0x3F80_0000),
            four: _mm512_set1_epi32(0x4080_0000),
            exponent: _mm512_set1_epi32(0x7F80_0000),
            nine: _mm512_set1_epi32(9 << 23),
            sr_first: _mm512_set1_epi32(SR_FIRST as i32),
            sr_last: _mm512_set1_epi32(SR_LAST as i32),
            // SAFETY: 16 u32 (one unaligned 512-bit load).
            sr_codes: unsafe { _mm512_loadu_si512(SR_CODES.as_ptr().cast()) },
            sr_first16: _mm512_set1_epi16(SR_FIRST as i16),
            sr_last16: _mm512_set1_epi16(SR_LAST as i16),
            // SAFETY: 32 u16 (one unaligned 512-bit load).
            sr_table16: unsafe { _mm512_loadu_si512(SR_TABLE16.as_ptr().cast()) },
            inf_high: _mm512_set1_epi16(0x7F80),
            // SAFETY: 32 u16 (one unaligned 512-bit load).
            in_order: unsafe { _mm512_loadu_si512(IN_ORDER.as_ptr().cast()) },
            // SAFETY: 32 u16 (one unaligned 512-bit load).
            side_by_side: unsafe { _mm512_loadu_si512(SIDE_BY_SIDE.as_ptr().cast()) },
            // SAFETY: both types are 64 bytes of plain integers.
            gather_sr: unsafe { std::mem::transmute::<[u8; 64], __m512i>(GATHER_SR) },
        }
    }
}

/// A 32-entry table as the two registers of a `vpermt2d`.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves(t: &[u32; 32]) -> [__m512i; 2] {
    // SAFETY: each half is 16 u32 (one unaligned 512-bit load).
    unsafe { [0, 16].map(|o| _mm512_loadu_si512(t[o..].as_ptr().cast())) }
}

/// The E2M1 code of each lane of `v` (in the low 4 bits of its u32 lane).
///
/// Every rounding threshold of E2M1 (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) is the first
/// value of a bucket of `|x| >> 21` (the exponent and two mantissa bits), so a bucket
/// has one code for its first value (where a tie may round down) and one for the rest:
/// two table lookups on the clamped bucket and a select on the 21 bits below it. The
/// sign goes on as bit 3 except for NaN (code `0x7` whatever its sign), which clamps to
/// the last bucket with infinity.
#[inline]
#[target_feature(enable = "avx512f")]
fn codes(v: __m512, k: &Consts) -> __m512i {
    let bits = _mm512_castps_si512(v);
    let abits = _mm512_and_si512(bits, k.abs);
    let bucket = _mm512_min_epu32(
        _mm512_max_epu32(_mm512_srli_epi32::<21>(abits), k.first),
        k.last,
    );
    let start = _mm512_permutex2var_epi32(k.at_start[0], bucket, k.at_start[1]);
    let rest = _mm512_permutex2var_epi32(k.inside[0], bucket, k.inside[1]);
    let code = _mm512_mask_blend_epi32(_mm512_test_epi32_mask(abits, k.rest), start, rest);
    let not_nan = _mm512_cmple_epu32_mask(abits, k.inf_bits);
    // code | (bits >> 28) & 8, where not NaN.
    _mm512_mask_ternarylogic_epi32::<0xF8>(code, not_nan, _mm512_srli_epi32::<28>(bits), k.sign)
}

/// The entries of [`codes16`]'s lookup: at index `(2 b + r) & 63`, for each bucket `b` in
/// `FIRST_BUCKET..=LAST_BUCKET`, the code of its first value (`r = 0`, [`AT_START`]) and
/// of the rest of it (`r = 1`, [`INSIDE`]). The 46 indices are distinct modulo 64.
const TABLE16: [u16; 64] = {
    let mut t = [0u16; 64];
    let mut b = FIRST_BUCKET;
    while b <= LAST_BUCKET {
        t[(2 * b) as usize & 63] = AT_START[(b & 31) as usize] as u16;
        t[(2 * b + 1) as usize & 63] = INSIDE[(b & 31) as usize] as u16;
        b += 1;
    }
    t
};

/// The u32 lane of a [`pair_bytes16`] vector that holds pair `j` (values `2j`, `2j + 1`)
/// of its first (`block` 0) or second (`block` 1) block: [`codes16`]'s `vpackusdw`
/// order puts each block's four values of a 128-bit lane side by side, the first
/// block's before the second's.
const fn pair_lane(block: usize, j: usize) -> usize {
    4 * (j / 2) + j % 2 + 2 * block
}

/// [`rn4_bw`]'s `vpermd` indices: the first block's eight pair lanes, then the second's.
const ORDER16: [u32; 16] = {
    let mut o = [0u32; 16];
    let mut i = 0;
    while i < 16 {
        o[i] = pair_lane(i / 8, i % 8) as u32;
        i += 1;
    }
    o
};

/// [`rn4_vbmi`]'s byte gather from two [`pair_bytes16`] vectors: output byte `8i + j`
/// (block `i`, pair `j`) is the low byte of [`pair_lane`]`(i % 2, j)`, in the first
/// vector for blocks 0 and 1 and the second (bytes 64..) for blocks 2 and 3.
const GATHER16: [u8; 64] = {
    let mut g = [0u8; 64];
    let mut i = 0;
    while i < 32 {
        let (block, j) = (i / 8, i % 8);
        g[i] = (4 * pair_lane(block % 2, j) + 64 * (block / 2)) as u8;
        i += 1;
    }
    g
};

/// The E2M1 codes of two blocks' 16 lanes each, as 32 u16 lanes in `vpackusdw` order:
/// 128-bit lane `l` holds `a[4l..4l + 4]`, then `b[4l..4l + 4]`.
///
/// [`codes`] in fewer operations per value: a lane's code depends on its sign, its
/// bucket `|x| >> 21` and whether any of the 21 bits below the bucket is set, which
/// [`key`] puts into 12 bits. Two blocks' keys pack into 16-bit lanes, and the
/// rest runs on 32 lanes at once ([`codes_of_keys`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn codes16(a: __m512, b: __m512, k: &Consts) -> __m512i {
    codes_of_keys(_mm512_packus_epi32(key(a, k), key(b, k)), k)
}

/// The 12-bit E2M1 key of each f32 lane: `x >> 20` (sign, exponent and the bucket's two
/// mantissa bits, then the bucket's top rest bit) with bit 0 or-ed with "any of bits
/// 0..20 set", a rounding to odd. So a key is twice the bucket (with the sign at bit
/// 11), plus one where `|x|` lies inside its bucket rather than at its first value.
///
/// The "any set" is a carry: `(x & 0xFFFFF) + 0xFFFFF` reaches bit 20 exactly when a
/// bit below it is set, and stays below bit 21. (A masked or of a test mask is what
/// LLVM turns into a test, an unmasked or and a masked move: no fewer operations.)
#[inline]
#[target_feature(enable = "avx512f")]
fn key(v: __m512, k: &Consts) -> __m512i {
    let bits = _mm512_castps_si512(v);
    let carry = _mm512_add_epi32(_mm512_and_si512(bits, k.below), k.below);
    _mm512_srli_epi32::<20>(_mm512_or_si512(bits, carry))
}

/// The E2M1 codes of 32 keys ([`key`]) in u16 lanes (bits 12..16 of a lane are ignored,
/// so a lane may hold a key at bits 0..12 of either half of a u32).
///
/// One `vpermt2w` on the clamped magnitude looks up 64 entries ([`TABLE16`]). Keys
/// below `2 FIRST_BUCKET` and above `2 LAST_BUCKET` clamp to those buckets' first
/// values (code 0 and code 7), as [`codes`] clamps; infinity's key is `0x7F8` and every
/// NaN's is above it, which keeps its code `0x7` unsigned.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn codes_of_keys(keys: __m512i, k: &Consts) -> __m512i {
    let magnitude = _mm512_and_si512(keys, k.magnitude);
    let index = _mm512_min_epu16(_mm512_max_epu16(magnitude, k.first_key), k.last_key);
    let code = _mm512_permutex2var_epi16(k.table16[0], index, k.table16[1]);
    // The sign (key bit 11) onto bit 3, where not NaN.
    let not_nan = _mm512_cmple_epu16_mask(magnitude, k.inf_key);
    let sign = _mm512_maskz_srli_epi16::<8>(not_nan, keys);
    _mm512_ternarylogic_epi32::<0xF8>(code, sign, k.sign16)
}

/// [`codes16`]'s pairs of codes (two neighbouring u16 lanes) folded into the low byte of
/// their u32 lane: `lo | hi << 4`.
#[inline]
#[target_feature(enable = "avx512f")]
fn pair_bytes16(codes: __m512i) -> __m512i {
    _mm512_or_si512(codes, _mm512_srli_epi32::<12>(codes))
}

/// The stochastic-rounding code of each lane of `v`, lane `e` taking the random byte
/// in lane `e` of `r` (0..=255, [`random_lanes`]; the engine's `sr_code`, TE's rule).
///
/// The jitter `r * step / 256` is `r` times a power of two: 2^-9 below 2, 2^-8 below 4,
/// 2^-7 from 4 on (NaN included), the exponent of `|v|` clamped to `[1, 4]` less 9.
/// The product is exact, so one fused multiply-add gives the rule's `t = |v| + r *
/// step / 256`. The rule truncates `t` to the E2M1 grid below it; every grid point
/// starts a bucket of `t >> 22`, so the code is a lookup on the clamped bucket
/// ([`SR_CODES`]). The sign goes on as in [`codes`]; NaN is code `0x7`.
#[inline]
#[target_feature(enable = "avx512f")]
fn sr_codes(v: __m512, r: __m512i, k: &Consts) -> __m512i {
    let bits = _mm512_castps_si512(v);
    let abits = _mm512_and_si512(bits, k.abs);
    let t = jittered(v, r, k);
    let bucket = _mm512_min_epu32(
        _mm512_max_epu32(_mm512_srli_epi32::<22>(_mm512_castps_si512(t)), k.sr_first),
        k.sr_last,
    );
    let code = _mm512_permutexvar_epi32(bucket, k.sr_codes);
    let not_nan = _mm512_cmple_epu32_mask(abits, k.inf_bits);
    _mm512_mask_ternarylogic_epi32::<0xF8>(code, not_nan, _mm512_srli_epi32::<28>(bits), k.sign)
}

/// A block's 16 random bytes, one per 32-bit lane (0..=255), for [`sr_codes`] and
/// [`jittered`].
#[inline]
#[target_feature(enable = "avx512f")]
fn random_lanes(r: &[u8; BLOCK]) -> __m512i {
    // SAFETY: a row is 16 bytes (one unaligned 128-bit load).
    _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(r.as_ptr().cast()) })
}

/// The rule's jittered magnitude `t = |v| + r * step / 256` of each lane ([`sr_codes`]
/// has the argument), `r` the random bytes one per 32-bit lane (0..=255). A NaN `v`
/// gives a NaN `t` (with the sign bit clear), infinity gives infinity.
#[inline]
#[target_feature(enable = "avx512f")]
fn jittered(v: __m512, r: __m512i, k: &Consts) -> __m512 {
    let abits = _mm512_and_si512(_mm512_castps_si512(v), k.abs);
    let clamped = _mm512_min_epu32(_mm512_max_epu32(abits, k.one), k.four);
    let jitter = _mm512_sub_epi32(_mm512_and_si512(clamped, k.exponent), k.nine);
    _mm512_fmadd_ps(
        _mm512_cvtepi32_ps(r),
        _mm512_castsi512_ps(jitter),
        _mm512_castsi512_ps(abits),
    )
}

/// [`sr_codes`] of two vectors' lanes after the jitter, in 16-bit lanes: each pair is
/// `(v, t)` with `t` [`jittered`]`(v)`, and `words` (a `vpermt2w` order, [`IN_ORDER`] or
/// [`SIDE_BY_SIDE`]) says which lane of which vector each u16 lane takes.
///
/// Every step after the fused multiply-add reads only the high half of a lane: the
/// bucket `t >> 22` is the high half shifted by 6, the sign is bit 15 of `v`'s, and a
/// NaN `t` (a multiply's result, so quiet) has a high half above infinity's `0x7F80`.
/// One `vpermt2w` per operand gathers those halves of 32 lanes, and the clamp, the
/// lookup and the sign then take one operation per 32 values where [`sr_codes`] takes
/// one per 16. In u16 lanes as [`codes16`]'s, so [`pair_bytes16`] folds pairs.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn sr_codes16(
    (v0, t0): (__m512, __m512),
    (v1, t1): (__m512, __m512),
    words: __m512i,
    k: &Consts,
) -> __m512i {
    let high =
        |a, b| _mm512_permutex2var_epi16(_mm512_castps_si512(a), words, _mm512_castps_si512(b));
    let (t, v) = (high(t0, t1), high(v0, v1));
    let bucket = _mm512_min_epu16(
        _mm512_max_epu16(_mm512_srli_epi16::<6>(t), k.sr_first16),
        k.sr_last16,
    );
    let code = _mm512_permutexvar_epi16(bucket, k.sr_table16);
    // The sign (bit 15) onto bit 3, where not NaN.
    let not_nan = _mm512_cmple_epu16_mask(t, k.inf_high);
    let sign = _mm512_maskz_srli_epi16::<12>(not_nan, v);
    _mm512_ternarylogic_epi32::<0xF8>(code, sign, k.sign16)
}

/// Pairs of codes in each 64-bit lane folded into its low byte: `lo | hi << 4`.
#[inline]
#[target_feature(enable = "avx512f")]
fn pair_bytes(codes: __m512i) -> __m512i {
    _mm512_or_si512(codes, _mm512_srli_epi64::<28>(codes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quant_core::codec::e2m1;
    use quant_core::simd::{Ext, with_extensions_hidden};
    use quantfmt_testkit::XorShift32;

    /// bf16 bit patterns widened exactly to f32 (the values the bits-reading kernels see).
    fn widened(bits: &[u16]) -> Vec<f32> {
        bits.iter()
            .map(|&b| f32::from_bits(u32::from(b) << 16))
            .collect()
    }

    /// The portable bytes: codes of `w[i] * enc[i / 16]`, packed low nibble first.
    fn portable(w: &[f32], enc: &[f32]) -> Vec<u8> {
        let codes: Vec<u8> = w
            .iter()
            .enumerate()
            .map(|(i, &x)| e2m1::encode(x * enc[i / BLOCK]))
            .collect();
        codes.chunks_exact(2).map(|p| p[0] | p[1] << 4).collect()
    }

    #[test]
    fn buckets_cover_the_thresholds() {
        // Below the first bucket every value is code 0, from the last one on code 7; in
        // between each threshold starts a bucket (the lookup's premise).
        assert_eq!(e2m1::encode(f32::from_bits((FIRST_BUCKET << 21) - 1)), 0);
        assert_eq!(e2m1::encode(f32::from_bits(LAST_BUCKET << 21)), 7);
        for t in [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] {
            assert_eq!(t.to_bits() & ((1 << 21) - 1), 0, "{t}");
        }
        let (mut at_start, mut inside) = ([0u32; 32], [0u32; 32]);
        for bucket in FIRST_BUCKET..=LAST_BUCKET {
            let t = (bucket & 31) as usize;
            at_start[t] = u32::from(e2m1::encode(f32::from_bits(bucket << 21)));
            inside[t] = u32::from(e2m1::encode(f32::from_bits(bucket << 21 | 1)));
        }
        assert_eq!(at_start, AT_START);
        assert_eq!(inside, INSIDE);
    }

    #[test]
    fn encode_run_equals_the_portable_codes() {
        if !supported() {
            eprintln!("no AVX-512: skipped");
            return;
        }
        // The block loop with the CPU's VBMI gather (where it has one), then without.
        encode_run_equals_the_portable_codes_here();
        with_extensions_hidden(&[Ext::Vbmi], encode_run_equals_the_portable_codes_here);
    }

    fn encode_run_equals_the_portable_codes_here() {
        // Every special value and every threshold neighbourhood, in every lane
        // position and sign, over runs of 0..=9 blocks (the 4-block step and its tail).
        let mut specials = vec![
            0.0f32,
            -0.0,
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-45,
            f32::from_bits(0x7FC0_0001),
            f32::from_bits(0xFF80_0001),
        ];
        for t in [
            0.25f32, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0,
        ] {
            for d in -2i32..=2 {
                let v = f32::from_bits((t.to_bits() as i32 + d) as u32);
                specials.extend([v, -v]);
            }
        }
        let mut rng = XorShift32::new(0x9E37_79B9);
        for nb in 0..=9 {
            for round in 0..40 {
                let w: Vec<f32> = (0..nb * BLOCK)
                    .map(|i| {
                        let r = rng.next_u32();
                        if (i + round) % 3 == 0 {
                            specials[r as usize % specials.len()]
                        } else {
                            (r >> 8) as f32 / (1 << 24) as f32 * 14.0 - 7.0
                        }
                    })
                    .collect();
                let enc: Vec<f32> = (0..nb)
                    .map(|b| [1.0, 0.5, 3.0, 1e30, 1e-30][(b + round) % 5])
                    .collect();
                let mut out = vec![0xAAu8; nb * BLOCK / 2];
                assert!(encode_run_rn(Run::F32(&w), &enc, &mut out));
                assert_eq!(out, portable(&w, &enc), "{nb} blocks, round {round}");
                // The same values through bf16 (each value's bf16 bits, widened).
                let hi: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
                let wide = widened(&hi);
                assert!(encode_run_rn(Run::Bf16(&hi), &enc, &mut out));
                assert_eq!(
                    out,
                    portable(&wide, &enc),
                    "bf16, {nb} blocks, round {round}"
                );
            }
        }
    }

    #[test]
    fn pairs_equal_the_portable_codes_on_every_bf16() {
        if !supported() {
            eprintln!("no AVX-512: skipped");
            return;
        }
        // Every bf16 pattern in both rows of a pair (the second row reversed), under
        // per-column multipliers that vary by lane, as bits and as widened f32.
        let lo: Vec<u16> = (0..=u16::MAX).collect();
        let hi: Vec<u16> = lo.iter().rev().copied().collect();
        let enc: Vec<f32> = (0..lo.len())
            .map(|c| [1.0f32, 0.5, 3.0, 1.0e-3, 7.5e2, 6.0 / 448.0][c % 6])
            .collect();
        let (lo32, hi32) = (widened(&lo), widened(&hi));
        let want: Vec<u8> = (0..lo.len())
            .map(|c| e2m1::encode(lo32[c] * enc[c]) | e2m1::encode(hi32[c] * enc[c]) << 4)
            .collect();
        let mut out = vec![0u8; lo.len()];
        assert!(encode_pairs_rn(
            Run::Bf16(&lo),
            Run::Bf16(&hi),
            &enc,
            &mut out
        ));
        assert_eq!(out, want);
        out.fill(0);
        assert!(encode_pairs_rn(
            Run::F32(&lo32),
            Run::F32(&hi32),
            &enc,
            &mut out
        ));
        assert_eq!(out, want);
        // The same rows interleaved in u32 words (the low half `lo`'s).
        let both: Vec<u32> = lo
            .iter()
            .zip(&hi)
            .map(|(&a, &b)| u32::from(a) | u32::from(b) << 16)
            .collect();
        out.fill(0);
        assert!(encode_bf16x2_rn(&both, &enc, &mut out));
        assert_eq!(out, want, "interleaved");
        // Lengths that differ or are not a multiple of 16 are refused.
        assert!(!encode_bf16x2_rn(&both[..16], &enc, &mut out));
        assert!(!encode_bf16x2_rn(&both[..24], &enc[..24], &mut out[..24]));
        let words_short = vec![0u32; 16];
        // Stochastic rounding: random words, then every byte 0 and every byte 255 (each
        // value's lowest and highest jitter).
        let mut rng = XorShift32::new(0x0B16_5EED);
        for fill in [None, Some(0u32), Some(u32::MAX)] {
            let words: Vec<u32> = (0..lo.len())
                .map(|_| fill.unwrap_or_else(|| rng.next_u32()))
                .collect();
            for shift in [0u32, 16] {
                let want = portable_pairs_sr(&lo32, &hi32, &enc, &words, shift);
                out.fill(0);
                let (a, b) = (Run::Bf16(&lo), Run::Bf16(&hi));
                assert!(encode_pairs_sr(a, b, &enc, &words, shift, &mut out));
                assert_eq!(out, want, "SR, words {fill:?}, shift {shift}");
                out.fill(0);
                assert!(encode_bf16x2_sr(&both, &enc, &words, shift, &mut out));
                assert_eq!(out, want, "SR interleaved, words {fill:?}, shift {shift}");
            }
        }
        assert!(!encode_bf16x2_sr(&both, &enc, &words_short, 0, &mut out));
        assert!(!encode_bf16x2_sr(
            &both,
            &enc,
            &vec![0; lo.len()],
            8,
            &mut out
        ));
        // Mixed kinds or lengths that are not a multiple of 16 are refused.
        assert!(!encode_pairs_rn(
            Run::F32(&lo32),
            Run::Bf16(&hi),
            &enc,
            &mut out
        ));
        assert!(!encode_pairs_rn(
            Run::Bf16(&lo[..24]),
            Run::Bf16(&hi[..24]),
            &enc[..24],
            &mut out[..24]
        ));
    }

    #[test]
    fn encode_run_sweeps_every_f32_bit_pattern_class() {
        if !supported() {
            eprintln!("no AVX-512: skipped");
            return;
        }
        // The block loop with the CPU's VBMI gather (where it has one), then without.
        encode_run_sweeps_every_f32_bit_pattern_class_here();
        with_extensions_hidden(
            &[Ext::Vbmi],
            encode_run_sweeps_every_f32_bit_pattern_class_here,
        );
    }

    fn encode_run_sweeps_every_f32_bit_pattern_class_here() {
        // Every 2^12-th bit pattern (both signs, all exponents, NaN and infinity).
        let w: Vec<f32> = (0..1u32 << 20)
            .map(|i| f32::from_bits(i << 12 | i >> 8))
            .collect();
        let enc = vec![1.0f32; w.len() / BLOCK];
        let mut out = vec![0u8; w.len() / 2];
        assert!(encode_run_rn(Run::F32(&w), &enc, &mut out));
        assert_eq!(out, portable(&w, &enc));
    }

    #[test]
    fn every_key_and_rest_encodes_as_the_portable_codes() {
        if !supported() {
            eprintln!("no AVX-512: skipped");
            return;
        }
        // Every 12-bit key prefix (`x >> 20`: sign, exponent, the bucket's mantissa bits
        // and bit 20) under rest patterns that set bit 20's carry or not: nothing below,
        // the lowest bit, bit 19, all 20 bits and a middle one. Through the rowwise block
        // loop (both gathers) and the columnwise pairs, whose rows hold them in opposite
        // orders.
        let rests = [0u32, 1, 1 << 19, (1 << 20) - 1, 0x0_4321];
        let w: Vec<f32> = (0..1u32 << 12)
            .flat_map(|top| rests.map(|r| f32::from_bits(top << 20 | r)))
            .collect();
        assert_eq!(w.len() % (4 * BLOCK), 0, "whole steps of the block loop");
        let enc = vec![1.0f32; w.len() / BLOCK];
        let want = portable(&w, &enc);
        let run = |out: &mut Vec<u8>| assert!(encode_run_rn(Run::F32(&w), &enc, out));
        let mut out = vec![0u8; w.len() / 2];
        run(&mut out);
        assert_eq!(out, want);
        out.fill(0);
        with_extensions_hidden(&[Ext::Vbmi], || run(&mut out));
        assert_eq!(out, want);
        let rev: Vec<f32> = w.iter().rev().copied().collect();
        let ones = vec![1.0f32; w.len()];
        let mut pairs = vec![0u8; w.len()];
        assert!(encode_pairs_rn(
            Run::F32(&w),
            Run::F32(&rev),
            &ones,
            &mut pairs
        ));
        let code = |x: f32| e2m1::encode(x);
        let want: Vec<u8> = w
            .iter()
            .zip(&rev)
            .map(|(&a, &b)| code(a) | code(b) << 4)
            .collect();
        assert_eq!(pairs, want);
    }

    #[test]
    fn encode_run_sweeps_every_bf16_value() {
        if !supported() {
            eprintln!("no AVX-512: skipped");
            return;
        }
        // The block loop with the CPU's VBMI gather (where it has one), then without.
        encode_run_sweeps_every_bf16_value_here();
        with_extensions_hidden(&[Ext::Vbmi], encode_run_sweeps_every_bf16_value_here);
    }

    fn encode_run_sweeps_every_bf16_value_here() {
        // All 65536 bf16 patterns, under three encode multipliers.
        let hi: Vec<u16> = (0..=u16::MAX).collect();
        let wide = widened(&hi);
        for e in [1.0f32, 0.75, 3.0e5] {
            let enc = vec![e; hi.len() / BLOCK];
            let mut out = vec![0u8; hi.len() / 2];
            assert!(encode_run_rn(Run::Bf16(&hi), &enc, &mut out));
            assert_eq!(out, portable(&wide, &enc), "multiplier {e}");
        }
    }

    #[test]
    fn encode_run_sweeps_every_f16_value() {
        if !supported() {
            eprintln!("no AVX-512: skipped");
            return;
        }
        // The block loop with the CPU's VBMI gather (where it has one), then without.
        encode_run_sweeps_every_f16_value_here();
        with_extensions_hidden(&[Ext::Vbmi], encode_run_sweeps_every_f16_value_here);
    }

    fn encode_run_sweeps_every_f16_value_here() {
        // All 65536 f16 patterns, under three encode multipliers, both roundings.
        let h: Vec<u16> = (0..=u16::MAX).collect();
        let wide: Vec<f32> = h
            .iter()
            .map(|&b| half::f16::from_bits(b).to_f32())
            .collect();
        let mut rng = XorShift32::new(5);
        let rnd: Vec<[u8; BLOCK]> = (0..h.len() / BLOCK)
            .map(|_| std::array::from_fn(|_| rng.next_u32() as u8))
            .collect();
        for e in [1.0f32, 0.75, 3.0e-3] {
            let enc = vec![e; h.len() / BLOCK];
            let mut out = vec![0u8; h.len() / 2];
            assert!(encode_run_rn(Run::F16(&h), &enc, &mut out));
            assert_eq!(out, portable(&wide, &enc), "multiplier {e}");
            assert!(encode_run_sr(Run::F16(&h), &enc, &rnd, &mut out));
            assert_eq!(out, portable_sr(&wide, &enc, &rnd), "SR, multiplier {e}");
        }
    }

    #[test]
    fn pairs_equal_the_portable_codes_on_every_f16() {
        if !supported() {
            eprintln!("no AVX-512: skipped");
            return;
        }
        // Every f16 pattern in both rows of a pair (the second row reversed), under
        // per-column multipliers that vary by lane, both roundings; the random byte of
        // each value is byte `shift / 8` (low row) or the next (high row) of its word.
        let lo: Vec<u16> = (0..=u16::MAX).collect();
        let hi: Vec<u16> = lo.iter().rev().copied().collect();
        let widen = |r: &[u16]| -> Vec<f32> {
            r.iter()
                .map(|&b| half::f16::from_bits(b).to_f32())
                .collect()
        };
        let (lo32, hi32) = (widen(&lo), widen(&hi));
        let enc: Vec<f32> = (0..lo.len())
            .map(|c| [1.0f32, 0.5, 3.0, 1.0e-3, 7.5e2, 6.0 / 448.0][c % 6])
            .collect();
        let want: Vec<u8> = (0..lo.len())
            .map(|c| e2m1::encode(lo32[c] * enc[c]) | e2m1::encode(hi32[c] * enc[c]) << 4)
            .collect();
        let mut out = vec![0u8; lo.len()];
        assert!(encode_pairs_rn(
            Run::F16(&lo),
            Run::F16(&hi),
            &enc,
            &mut out
        ));
        assert_eq!(out, want);
        let mut rng = XorShift32::new(0x51ED_270B);
        let words: Vec<u32> = (0..lo.len()).map(|_| rng.next_u32()).collect();
        for shift in [0u32, 16] {
            let want = portable_pairs_sr(&lo32, &hi32, &enc, &words, shift);
            out.fill(0);
            let (a, b) = (Run::F16(&lo), Run::F16(&hi));
            assert!(encode_pairs_sr(a, b, &enc, &words, shift, &mut out));
            assert_eq!(out, want, "SR, shift {shift}");
            // The same values as f32 rows give the same bytes.
            out.fill(0);
            let (a, b) = (Run::F32(&lo32), Run::F32(&hi32));
            assert!(encode_pairs_sr(a, b, &enc, &words, shift, &mut out));
            assert_eq!(out, want, "SR f32, shift {shift}");
        }
        // Rows of different kinds are refused.
        assert!(!encode_pairs_rn(
            Run::F16(&lo),
            Run::Bf16(&hi),
            &enc,
            &mut out
        ));
    }

    /// The portable bytes of [`encode_pairs_sr`]: byte `c` holds the codes of TE's rule
    /// on `lo[c] * enc[c]` (low nibble, random byte `shift / 8` of `words[c]`) and on
    /// `hi[c] * enc[c]` (high nibble, the next byte).
    fn portable_pairs_sr(
        lo: &[f32],
        hi: &[f32],
        enc: &[f32],
        words: &[u32],
        shift: u32,
    ) -> Vec<u8> {
        let sr = |x: f32, r: u32| e2m1::encode(crate::sr::stochastic_round_e2m1(x, r & 0xFF));
        (0..lo.len())
            .map(|c| {
                let w = words[c];
                sr(lo[c] * enc[c], w >> shift) | sr(hi[c] * enc[c], w >> (shift + 8)) << 4
            })
            .collect()
    }

    /// The portable stochastic-rounding bytes: TE's rule, then the exact encoding of its
    /// grid value (value `i` takes random byte `rnd[i / 16][i % 16]`).
    fn portable_sr(w: &[f32], enc: &[f32], rnd: &[[u8; BLOCK]]) -> Vec<u8> {
        let codes: Vec<u8> = w
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let r = u32::from(rnd[i / BLOCK][i % BLOCK]);
                e2m1::encode(crate::sr::stochastic_round_e2m1(x * enc[i / BLOCK], r))
            })
            .collect();
        codes.chunks_exact(2).map(|p| p[0] | p[1] << 4).collect()
    }

    #[test]
    fn sr_buckets_follow_the_rule() {
        // The first value of each bucket and the last one, with no jitter (byte 0), give
        // the table's code; below the first bucket everything is 0, above the last 7.
        for bucket in SR_FIRST..=SR_LAST {
            let want = SR_CODES[(bucket & 15) as usize];
            for t in [
                f32::from_bits(bucket << 22),
                f32::from_bits((bucket << 22) | 0x3F_FFFF),
            ] {
                if bucket == SR_FIRST && t < 0.5 || bucket > SR_FIRST {
                    let got = e2m1::encode(crate::sr::stochastic_round_e2m1(t, 0));
                    assert_eq!(u32::from(got), want, "bucket {bucket} t {t}");
                }
            }
        }
        assert_eq!(f32::from_bits((SR_FIRST + 1) << 22), 0.5);
        assert_eq!(f32::from_bits(SR_LAST << 22), 64.0);
        // The 16-bit lanes' table holds every bucket at its own index.
        let mut seen = [false; 32];
        for bucket in SR_FIRST..=SR_LAST {
            let i = (bucket & 31) as usize;
            assert!(!seen[i], "bucket {bucket} shares index {i}");
            seen[i] = true;
            assert_eq!(u32::from(SR_TABLE16[i]), SR_CODES[(bucket & 15) as usize]);
        }
    }

    #[test]
    fn encode_run_sr_equals_the_rule() {
        if !supported() {
            eprintln!("no AVX-512: skipped");
            return;
        }
        // The block loop with the CPU's VBMI gather (where it has one), then without.
        encode_run_sr_equals_the_rule_here();
        with_extensions_hidden(&[Ext::Vbmi], encode_run_sr_equals_the_rule_here);
    }

    fn encode_run_sr_equals_the_rule_here() {
        let mut rng = XorShift32::new(0x2545_F491);
        // Every bf16 value under three multipliers, each with random bytes and with
        // the extreme bytes 0 and 255 (every grid crossing of the jitter).
        let hi: Vec<u16> = (0..=u16::MAX).collect();
        let wide = widened(&hi);
        let nb = hi.len() / BLOCK;
        for e in [1.0f32, 0.75, 3.0e5] {
            let enc = vec![e; nb];
            for fill in [None, Some(0u8), Some(255), Some(128)] {
                let rnd: Vec<[u8; BLOCK]> = (0..nb)
                    .map(|_| std::array::from_fn(|_| fill.unwrap_or_else(|| rng.next_u32() as u8)))
                    .collect();
                let want = portable_sr(&wide, &enc, &rnd);
                let mut out = vec![0u8; hi.len() / 2];
                assert!(encode_run_sr(Run::Bf16(&hi), &enc, &rnd, &mut out));
                assert_eq!(out, want, "bf16, multiplier {e}, bytes {fill:?}");
                out.fill(0);
                assert!(encode_run_sr(Run::F32(&wide), &enc, &rnd, &mut out));
                assert_eq!(out, want, "f32, multiplier {e}, bytes {fill:?}");
            }
        }
        // f32 values off the bf16 grid: every 4096th bit pattern, runs of 0..=9 blocks
        // for the 4-block step and its tail.
        let w: Vec<f32> = (0..1u32 << 20)
            .map(|i| f32::from_bits(i << 12 | i >> 8))
            .collect();
        let enc = vec![1.0f32; w.len() / BLOCK];
        let rnd: Vec<[u8; BLOCK]> = (0..enc.len())
            .map(|_| std::array::from_fn(|_| rng.next_u32() as u8))
            .collect();
        let mut out = vec![0u8; w.len() / 2];
        assert!(encode_run_sr(Run::F32(&w), &enc, &rnd, &mut out));
        assert_eq!(out, portable_sr(&w, &enc, &rnd));
        for nb in 0..=9 {
            let n = nb * BLOCK;
            let mut out = vec![0xAAu8; n / 2];
            assert!(encode_run_sr(
                Run::F32(&w[..n]),
                &enc[..nb],
                &rnd[..nb],
                &mut out
            ));
            assert_eq!(
                out,
                portable_sr(&w[..n], &enc[..nb], &rnd[..nb]),
                "{nb} blocks"
            );
        }
        // Random bytes must cover every block.
        let mut out = [0u8; 16];
        assert!(!encode_run_sr(
            Run::F32(&w[..32]),
            &[1.0; 2],
            &rnd[..1],
            &mut out
        ));
    }

    #[test]
    fn encode_run_refuses_what_does_not_fit() {
        let mut out = [0u8; 8];
        assert!(!encode_run_rn(Run::F32(&[0.0; 15]), &[1.0], &mut out));
        assert!(!encode_run_rn(Run::F32(&[0.0; 16]), &[1.0, 1.0], &mut out));
        assert!(!encode_run_rn(Run::Bf16(&[0; 16]), &[1.0], &mut out[..7]));
    }
}
