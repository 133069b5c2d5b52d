//! The AVX2 random bytes of rowwise stochastic rounding: [`crate::philox_x86`]'s
//! Philox4x32-10 of 16 blocks of one stored row, in 256-bit vectors of four 64-bit
//! lanes.
//!
//! At AVX2 the portable `philox_lanes` went through memory: LLVM extracted the words
//! lane by lane around each round, which with the per-block copy into bytes was about
//! a third of the SR quantize (0.10 of the copy roofline from bf16 on Zen 4 with
//! `QUANTFMT_SIMD=avx2`). Here, as in the AVX-512 kernel, each word sits in the low half
//! of a 64-bit lane (one `vpmuludq` per multiply, the high halves never read), and the
//! words go straight from the registers into the bytes the encoder loads: words 0 and 1
//! of a block merged into one lane, words 2 and 3 into another, then one
//! `vpunpck{l,h}qdq` and `vperm2i128` per two blocks. Two groups of four blocks run
//! interleaved (8 state vectors and 4 constants in AVX2's 16 registers), twice.
//!
//! The columnwise words ([`words16`], the engine's `philox_lanes` in place) come from
//! the same rounds, each word's lanes narrowed to 32 bits for one store per 8 lanes:
//! through the portable lanes they were copied out word by word, and their 4 KiB array
//! per 16-row group was copied again on return (a quarter of the SR columnwise quantize
//! at AVX2).
//!
//! The stream is [`crate::sr::block_bits`]'s; unit tests in the engine compare the two.

use std::arch::x86_64::{
    __m256i, _mm_loadu_si128, _mm256_blend_epi32, _mm256_castps_si256, _mm256_castsi256_ps,
    _mm256_cvtepu32_epi64, _mm256_mul_epu32, _mm256_permute2x128_si256, _mm256_permute4x64_epi64,
    _mm256_set1_epi64x, _mm256_shuffle_ps, _mm256_slli_epi64, _mm256_srli_epi64,
    _mm256_storeu_si256, _mm256_unpackhi_epi64, _mm256_unpacklo_epi64, _mm256_xor_si256,
};

use quant_core::simd::Level;

use crate::scale::BLOCK;

/// Philox multiplier for word 0 ([`crate::sr`]'s), as a 64-bit lane.
const M0: i64 = crate::sr::M0 as i64;
/// Philox multiplier for word 2.
const M1: i64 = crate::sr::M1 as i64;
/// Key schedule increments.
const W: [u32; 2] = [crate::sr::W0, crate::sr::W1];

/// [`crate::philox_x86::block_bytes`] of 16 blocks at AVX2: `out[l]` is the
/// little-endian bytes of the four words of
/// [`crate::sr::block_bits`]`(seed, dir, row, blocks[l])`.
/// Returns `false` (nothing written) unless the CPU has AVX2.
#[inline]
pub(crate) fn block_bytes16(
    blocks: &[u32; 16],
    row: u64,
    dir: u32,
    seed: u64,
    out: &mut [[u8; BLOCK]; 16],
) -> bool {
    if !Level::Avx2.is_supported() {
        return false;
    }
    // SAFETY: the CPU has AVX2 (checked above).
    unsafe { philox16(blocks, row, dir, seed, out) };
    true
}

/// The engine's `philox_lanes` at AVX2, written in place: `out[w][at + l]` is word `w`
/// of Philox4x32-10 of the counter `[block[l], row_lo[l], row_hi[l], dir]` under
/// `seed` (the stream of [`crate::sr::block_bits`]), for the 16 lanes `l`. Returns
/// `false` (nothing written) unless the CPU has AVX2 and `at + 16 <= N`.
#[inline]
pub(crate) fn words16<const N: usize>(
    block: &[u32; 16],
    (row_lo, row_hi): (&[u32; 16], &[u32; 16]),
    dir: u32,
    seed: u64,
    out: &mut [[u32; N]; 4],
    at: usize,
) -> bool {
    if !Level::Avx2.is_supported() || at + 16 > N {
        return false;
    }
    // SAFETY: the CPU has AVX2 and `at + 16 <= N` (both checked above).
    unsafe { philox_words(block, (row_lo, row_hi), dir, seed, out, at) };
    true
}

/// 4 u32 from `v` (at least 4 long) zero-extended into the 64-bit lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn load4(v: &[u32]) -> __m256i {
    let v = &v[..4];
    // SAFETY: `v` is 4 u32, 16 readable bytes; the load is unaligned.
    _mm256_cvtepu32_epi64(unsafe { _mm_loadu_si128(v.as_ptr().cast()) })
}

/// The ten Philox rounds of two groups of four lanes, `c[g]` the four state words
/// (each in the low half of its 64-bit lanes; the high halves are whatever the last
/// product or XOR left, never read: `vpmuludq` reads the low halves only, and the
/// callers keep only those).
#[target_feature(enable = "avx2")]
#[inline]
fn rounds(mut c: [[__m256i; 4]; 2], seed: u64) -> [[__m256i; 4]; 2] {
    let (m0, m1) = (_mm256_set1_epi64x(M0), _mm256_set1_epi64x(M1));
    let mut key = [seed as u32, (seed >> 32) as u32];
    for round in 0..10 {
        if round > 0 {
            key = [key[0].wrapping_add(W[0]), key[1].wrapping_add(W[1])];
        }
        let k0 = _mm256_set1_epi64x(i64::from(key[0]));
        let k1 = _mm256_set1_epi64x(i64::from(key[1]));
        for h in &mut c {
            let p0 = _mm256_mul_epu32(h[0], m0);
            let p1 = _mm256_mul_epu32(h[2], m1);
            *h = [
                _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64::<32>(p1), h[1]), k0),
                p1,
                _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64::<32>(p0), h[3]), k1),
                p0,
            ];
        }
    }
    c
}

/// [`block_bytes16`] after its check: blocks 0..8, then 8..16, each as two groups of
/// four lanes interleaved round by round.
#[target_feature(enable = "avx2")]
fn philox16(blocks: &[u32; 16], row: u64, dir: u32, seed: u64, out: &mut [[u8; BLOCK]; 16]) {
    let lo_row = _mm256_set1_epi64x(i64::from(row as u32));
    let hi_row = _mm256_set1_epi64x(i64::from((row >> 32) as u32));
    let dir = _mm256_set1_epi64x(i64::from(dir));
    for (blocks, out) in blocks.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
        let group = |g: usize| [load4(&blocks[4 * g..]), lo_row, hi_row, dir];
        let c = rounds([group(0), group(1)], seed);
        for (h, o) in c.iter().zip(out.chunks_exact_mut(4)) {
            // Lane l of `w01` holds words 0 and 1 of block l (little-endian), `w23`
            // words 2 and 3: block l's bytes are qword l of `w01`, then of `w23`.
            let w01 = _mm256_blend_epi32::<0b1010_1010>(h[0], _mm256_slli_epi64::<32>(h[1]));
            let w23 = _mm256_blend_epi32::<0b1010_1010>(h[2], _mm256_slli_epi64::<32>(h[3]));
            // Blocks 0 and 2 (one per 128-bit half), then blocks 1 and 3.
            let even = _mm256_unpacklo_epi64(w01, w23);
            let odd = _mm256_unpackhi_epi64(w01, w23);
            let (a, b) = o.split_at_mut(2);
            // SAFETY: `a` and `b` are two 16-byte rows each, 32 contiguous writable
            // bytes; the stores are unaligned.
            unsafe {
                _mm256_storeu_si256(
                    a.as_mut_ptr().cast(),
                    _mm256_permute2x128_si256::<0x20>(even, odd),
                );
                _mm256_storeu_si256(
                    b.as_mut_ptr().cast(),
                    _mm256_permute2x128_si256::<0x31>(even, odd),
                );
            }
        }
    }
}

/// [`words16`] after its checks: lanes 0..8, then 8..16, each as two groups of four
/// lanes interleaved round by round; each word's two groups narrowed to 8 u32 (the low
/// halves, by `vshufps` and `vpermq`) for one store.
///
/// # Safety
/// The CPU must have AVX2; `at + 16 <= N`.
#[target_feature(enable = "avx2")]
unsafe fn philox_words<const N: usize>(
    block: &[u32; 16],
    (row_lo, row_hi): (&[u32; 16], &[u32; 16]),
    dir: u32,
    seed: u64,
    out: &mut [[u32; N]; 4],
    at: usize,
) {
    let dir = _mm256_set1_epi64x(i64::from(dir));
    for half in 0..2 {
        let group = |g: usize| {
            let l = 8 * half + 4 * g;
            [
                load4(&block[l..]),
                load4(&row_lo[l..]),
                load4(&row_hi[l..]),
                dir,
            ]
        };
        let c = rounds([group(0), group(1)], seed);
        for (w, o) in out.iter_mut().enumerate() {
            let (a, b) = (_mm256_castsi256_ps(c[0][w]), _mm256_castsi256_ps(c[1][w]));
            // Per 128-bit half: the low dwords of `a`'s two lanes, then `b`'s.
            let s = _mm256_castps_si256(_mm256_shuffle_ps::<0b10_00_10_00>(a, b));
            let v = _mm256_permute4x64_epi64::<0b11_01_10_00>(s);
            // SAFETY: `at + 8 * half + 8 <= at + 16 <= N` (the caller's promise); one
            // unaligned 256-bit store.
            unsafe { _mm256_storeu_si256(o.as_mut_ptr().add(at + 8 * half).cast(), v) };
        }
    }
}
