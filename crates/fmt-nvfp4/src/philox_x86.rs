//! The AVX-512 random bytes of rowwise stochastic rounding: Philox4x32-10 of 16 blocks
//! of one stored row, written straight into the bytes the encoder loads.
//!
//! The portable `philox_lanes` vectorizes its rounds well (each word in the low half of
//! a 64-bit lane, one widening `vpmuludq` per multiply), but the words then go through
//! `[[u32; 16]; 4]` and a per-block copy into `[[u8; 16]; 16]`, which LLVM compiled to
//! a store per word or to a tangle of permutes and stack reloads: with the rounds a
//! quarter of the SR quantize profile. Here the 64-bit lanes never leave the registers:
//! words 0 and 1 of a block are merged into one lane, words 2 and 3 into another, and
//! one two-source permute puts four blocks' 16 bytes in order for one store.
//!
//! The stream is [`crate::sr::block_bits`]'s; unit tests in the engine compare the two.

use std::arch::x86_64::{
    __m512i, _mm512_castsi512_si256, _mm512_cvtepu32_epi64, _mm512_extracti64x4_epi64,
    _mm512_loadu_si512, _mm512_mask_blend_epi32, _mm512_mul_epu32, _mm512_permutex2var_epi64,
    _mm512_set1_epi64, _mm512_setr_epi64, _mm512_slli_epi64, _mm512_srli_epi64,
    _mm512_storeu_si512, _mm512_ternarylogic_epi64,
};

use quant_core::simd::Level;

use crate::scale::BLOCK;

/// Philox multiplier for word 0 ([`crate::sr`]'s), as a 64-bit lane.
const M0: i64 = crate::sr::M0 as i64;
/// Philox multiplier for word 2.
const M1: i64 = crate::sr::M1 as i64;
/// Key schedule increments.
const W: [u32; 2] = [crate::sr::W0, crate::sr::W1];

/// The random bytes of blocks `blocks[l]` (`l` in 0..16) of stored row `row` in
/// direction `dir`: `out[l]` is the little-endian bytes of the four words of
/// [`crate::sr::block_bits`]`(seed, dir, row, blocks[l])`, so element `e` of block `l`
/// takes `out[l][e]` (the layout of [`crate::sr::element_bits`]). Returns `false`
/// (nothing written) unless the CPU has AVX-512 F.
#[inline]
pub(crate) fn block_bytes16(
    blocks: &[u32; 16],
    row: u64,
    dir: u32,
    seed: u64,
    out: &mut [[u8; BLOCK]; 16],
) -> bool {
    if !Level::Avx512.is_supported() {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F (checked above).
    unsafe { philox16(blocks, row, dir, seed, out) };
    true
}

/// [`block_bytes16`] after its check. Lanes 0..8 and 8..16 run as two independent
/// halves of eight 64-bit lanes, interleaved round by round.
#[target_feature(enable = "avx512f")]
fn philox16(blocks: &[u32; 16], row: u64, dir: u32, seed: u64, out: &mut [[u8; BLOCK]; 16]) {
    // SAFETY: `blocks` is 64 readable bytes; the load is unaligned.
    let b = unsafe { _mm512_loadu_si512(blocks.as_ptr().cast()) };
    let lo_row = _mm512_set1_epi64(i64::from(row as u32));
    let hi_row = _mm512_set1_epi64(i64::from((row >> 32) as u32));
    let dir = _mm512_set1_epi64(i64::from(dir));
    let halves = [
        _mm512_cvtepu32_epi64(_mm512_castsi512_si256(b)),
        _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64::<1>(b)),
    ];
    // Only the low 32 bits of each lane are the word; `vpmuludq` reads only those, and
    // the high bits left by a product or an XOR are dropped when the bytes are merged.
    let mut c: [[__m512i; 4]; 2] = halves.map(|h| [h, lo_row, hi_row, dir]);
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
            *h = [
                _mm512_ternarylogic_epi64::<0x96>(_mm512_srli_epi64::<32>(p1), h[1], k0),
                p1,
                _mm512_ternarylogic_epi64::<0x96>(_mm512_srli_epi64::<32>(p0), h[3], k1),
                p0,
            ];
        }
    }
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
