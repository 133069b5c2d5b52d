//! The AVX-512 random bytes of stochastic rounding: Philox4x32-10 of 16 or 32 counters
//! at once, written straight into the bytes the rowwise encoder loads
//! ([`block_bytes`]) or into the columnwise pair encoder's word arrays ([`words`]).
//!
//! The portable `philox_lanes` vectorizes its rounds well (each word in the low half of
//! a 64-bit lane, one widening `vpmuludq` per multiply), but the words then go through
//! `[[u32; 16]; 4]` and a per-block copy into `[[u8; 16]; 16]`, which LLVM compiled to
//! a store per word or to a tangle of permutes and stack reloads: with the rounds a
//! quarter of the SR quantize profile. Here the 64-bit lanes never leave the registers:
//! words 0 and 1 of a block are merged into one lane, words 2 and 3 into another, and
//! one two-source permute puts four blocks' 16 bytes in order for one store.
//!
//! **Why 32 counters.** A round is a chain: the multiply, its high word brought down,
//! the XOR, then the next round's multiply on that result. On Zen 4 that chain, not the
//! multiplier, set the pace: with two vectors of eight counters interleaved (16
//! counters) the rounds took about 40 ns per 16 counters in a loop of nothing else,
//! where the 40 multiplies need about 11; with three vectors 32.5 ns, with four (32
//! counters) 29 ns. Eight vectors (64 counters, 32 state registers) spill. So the walks
//! draw 32 counters per call where they have them.
//!
//! The stream is [`crate::sr::block_bits`]'s; unit tests in the engine compare the two.

use std::arch::x86_64::{
    __m512i, _mm256_loadu_si256, _mm512_add_epi64, _mm512_cvtepu32_epi64, _mm512_mask_blend_epi32,
    _mm512_mul_epu32, _mm512_permutex2var_epi32, _mm512_permutex2var_epi64, _mm512_set1_epi64,
    _mm512_setr_epi32, _mm512_setr_epi64, _mm512_shuffle_epi32, _mm512_slli_epi64,
    _mm512_srli_epi64, _mm512_storeu_si512, _mm512_ternarylogic_epi64,
};

use quant_core::simd::Level;

use crate::scale::BLOCK;

/// Philox multiplier for word 0 ([`crate::sr`]'s), as a 64-bit lane.
const M0: i64 = crate::sr::M0 as i64;
/// Philox multiplier for word 2.
const M1: i64 = crate::sr::M1 as i64;
/// Key schedule increments.
const W: [u32; 2] = [crate::sr::W0, crate::sr::W1];

/// The random bytes of blocks `blocks[l]` (`l` in 0..N, `N` 16 or 32) of stored row
/// `row` in direction `dir`: `out[l]` is the little-endian bytes of the four words of
/// [`crate::sr::block_bits`]`(seed, dir, row, blocks[l])`, so element `e` of block `l`
/// takes `out[l][e]` (the layout of [`crate::sr::element_bits`]). 32 blocks run as four
/// chains of eight (module docs). Returns `false` (nothing written) unless the CPU has
/// AVX-512 F and `N` is 16 or 32.
#[inline]
pub(crate) fn block_bytes<const N: usize>(
    blocks: &[u32; N],
    row: u64,
    dir: u32,
    seed: u64,
    out: &mut [[u8; BLOCK]; N],
) -> bool {
    if !Level::Avx512.is_supported() {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F (checked above); `blocks` and `out` hold `N = 8 *
    // NH` entries.
    unsafe {
        match N {
            16 => bytes_of_blocks::<2>(blocks, row, dir, seed, out),
            32 => bytes_of_blocks::<4>(blocks, row, dir, seed, out),
            _ => return false,
        }
    }
    true
}

/// The columnwise words of 16-row group `group` for the `n` (16 or 32) stored rows
/// (columns of the input) `col..col + n`: `out[w][at + l]` is word `w` of
/// [`crate::sr::block_bits`]`(seed, dir, col + l, group)`. Returns `false` (nothing
/// written) unless the CPU has AVX-512 F, `n` is 16 or 32 and `at + n <= N`.
#[inline]
pub(crate) fn words<const N: usize>(
    (group, col, n): (u32, u64, usize),
    dir: u32,
    seed: u64,
    out: &mut [[u32; N]; 4],
    at: usize,
) -> bool {
    if !Level::Avx512.is_supported() || at + n > N {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F and `at + n <= N` (both checked above).
    unsafe {
        match n {
            16 => column_words::<2, N>((group, col), dir, seed, out, at),
            32 => column_words::<4, N>((group, col), dir, seed, out, at),
            _ => return false,
        }
    }
    true
}

/// The ten Philox rounds of `NH` vectors of eight counters, interleaved round by round:
/// `c[h]` holds the four state words, each in the low half of its 64-bit lanes. The
/// high halves are whatever the last product, swap or XOR left, never read: `vpmuludq`
/// reads the low halves only, and the callers keep only those. So a product's high
/// word may come down by swapping the halves of each lane (`vpshufd`, a shuffle) as
/// well as by a 32-bit shift; the swap measured 1-4 % faster on the SR quantizes
/// (single thread, Zen 4).
#[target_feature(enable = "avx512f")]
#[inline]
fn rounds<const NH: usize>(mut c: [[__m512i; 4]; NH], seed: u64) -> [[__m512i; 4]; NH] {
    let (m0, m1) = (_mm512_set1_epi64(M0), _mm512_set1_epi64(M1));
    let mut key = [seed as u32, (seed >> 32) as u32];
    for round in 0..10 {
        if round > 0 {
            key = [key[0].wrapping_add(W[0]), key[1].wrapping_add(W[1])];
        }
        let k0 = _mm512_set1_epi64(i64::from(key[0]));
        let k1 = _mm512_set1_epi64(i64::from(key[1]));
        for h in &mut c {
            let p0 = _mm512_mul_epu32(h[0], m0);
            let p1 = _mm512_mul_epu32(h[2], m1);
            // Each lane's halves swapped: the high word at the bottom.
            let high = |p| _mm512_shuffle_epi32::<0b10_11_00_01>(p);
            *h = [
                _mm512_ternarylogic_epi64::<0x96>(high(p1), h[1], k0),
                p1,
                _mm512_ternarylogic_epi64::<0x96>(high(p0), h[3], k1),
                p0,
            ];
        }
    }
    c
}

/// [`block_bytes`] of `8 * NH` blocks after its checks.
///
/// # Safety
/// The CPU must have AVX-512 F; `blocks` and `out` hold `8 * NH` entries.
#[target_feature(enable = "avx512f")]
unsafe fn bytes_of_blocks<const NH: usize>(
    blocks: &[u32],
    row: u64,
    dir: u32,
    seed: u64,
    out: &mut [[u8; BLOCK]],
) {
    debug_assert!(blocks.len() == 8 * NH && out.len() == 8 * NH);
    let lo_row = _mm512_set1_epi64(i64::from(row as u32));
    let hi_row = _mm512_set1_epi64(i64::from((row >> 32) as u32));
    let dir = _mm512_set1_epi64(i64::from(dir));
    let c = rounds::<NH>(
        std::array::from_fn(|h| {
            // SAFETY: `8 * h + 8 <= 8 * NH = blocks.len()` (the caller's promise); one
            // unaligned 256-bit load.
            let b = unsafe { _mm256_loadu_si256(blocks.as_ptr().add(8 * h).cast()) };
            [_mm512_cvtepu32_epi64(b), lo_row, hi_row, dir]
        }),
        seed,
    );
    // Lane l of `w01` holds words 0 and 1 of block l (little-endian), `w23` words 2, 3;
    // block l's bytes are then qword l of `w01` followed by qword l of `w23`.
    let first = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
    let second = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    for (h, o) in c.iter().zip(out.chunks_exact_mut(8)) {
        let w01 = _mm512_mask_blend_epi32(0xAAAA, h[0], _mm512_slli_epi64::<32>(h[1]));
        let w23 = _mm512_mask_blend_epi32(0xAAAA, h[2], _mm512_slli_epi64::<32>(h[3]));
        let (a, b) = o.split_at_mut(4);
        // SAFETY: `a` and `b` are four 16-byte rows each, 64 contiguous writable bytes;
        // the stores are unaligned.
        unsafe {
            _mm512_storeu_si512(
                a.as_mut_ptr().cast(),
                _mm512_permutex2var_epi64(w01, first, w23),
            );
            _mm512_storeu_si512(
                b.as_mut_ptr().cast(),
                _mm512_permutex2var_epi64(w01, second, w23),
            );
        }
    }
}

/// [`words`] of `8 * NH` columns after its checks: the counters `[group, lo, hi, dir]`
/// of columns `col + l` (their 64-bit indices added in the lanes, so `hi` is right
/// across a 2^32 boundary too); each two vectors' words narrowed to their low halves by
/// one `vpermt2d` for one store of 16.
///
/// # Safety
/// The CPU must have AVX-512 F; `NH` is even and `at + 8 * NH <= N`.
#[target_feature(enable = "avx512f")]
unsafe fn column_words<const NH: usize, const N: usize>(
    (group, col): (u32, u64),
    dir: u32,
    seed: u64,
    out: &mut [[u32; N]; 4],
    at: usize,
) {
    debug_assert!(NH.is_multiple_of(2) && at + 8 * NH <= N);
    let group = _mm512_set1_epi64(i64::from(group));
    let dir = _mm512_set1_epi64(i64::from(dir));
    let iota = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    let c = rounds::<NH>(
        std::array::from_fn(|h| {
            let first = col.wrapping_add(8 * h as u64) as i64;
            let cols = _mm512_add_epi64(_mm512_set1_epi64(first), iota);
            [group, cols, _mm512_srli_epi64::<32>(cols), dir]
        }),
        seed,
    );
    let low_halves = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for (h, pair) in c.chunks_exact(2).enumerate() {
        for (w, o) in out.iter_mut().enumerate() {
            let v = _mm512_permutex2var_epi32(pair[0][w], low_halves, pair[1][w]);
            // SAFETY: `at + 16 * h + 16 <= at + 8 * NH <= N` (the caller's promise); one
            // unaligned 512-bit store.
            unsafe { _mm512_storeu_si512(o.as_mut_ptr().add(at + 16 * h).cast(), v) };
        }
    }
}
