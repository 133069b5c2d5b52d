//! The int4 quantize's AVX2 kernels: the bf16 path's nibbles ([`nibbles_bf16`]), f16
//! input's ([`nibbles_f16`]) and the packing of a row's nibbles into its tile words
//! ([`pack_row`]).
//!
//! **Nibbles.** `u = to_nibble(rb(rb(x - min_val) * r))` for 32 bf16 values per step:
//! the AVX-512 kernel without BF16 ([`crate::x86`]'s `nibbles_bf16_int`) in 256-bit
//! registers. Each 16 inputs are widened by in-lane unpacks (`vpunpcklwd` /
//! `vpunpckhwd` against zero: the bf16 bits into the high half of each f32 lane); both
//! bf16 roundings are integer operations in those f32 lanes ([`round_in_place`]), the
//! clamps `vmaxps` / `vminps` and the rounding to an integer `vcvtps2dq`; one
//! `vpackusdw`, whose in-lane order undoes the unpacks', leaves the 16 nibbles in input
//! order. At AVX2 the portable loop ran 8 values per vector and packed its nibbles
//! through `vpackuswb` and a shuffle per 8.
//!
//! **Packing.** A 32-nibble block's words ([`crate::kernels`]' module docs): with
//! `e[i] = u[2i] | u[2i + 1] << 16`, word `c` is `e[c] | e[4 + c] << 4 | e[8 + c] << 8 |
//! e[12 + c] << 12`. Zero-extending the block's bytes to u16 lanes makes dword `i` of the
//! two halves `e[i]` and `e[8 + i]`; one variable shift each, an OR, and an OR of the
//! 128-bit halves give the four words. A slab's blocks are then interleaved (`[c][p]`)
//! by 32- and 64-bit unpacks. The portable packer (u64 and u128 shifts per block) was
//! about a quarter of the quantize's profile at AVX2.

use std::arch::x86_64::{
    __m128i, __m256, __m256i, _mm_loadu_si128, _mm_or_si128, _mm_packus_epi16, _mm_setzero_si128,
    _mm_storeu_si128, _mm_unpackhi_epi32, _mm_unpackhi_epi64, _mm_unpacklo_epi32,
    _mm_unpacklo_epi64, _mm256_add_epi32, _mm256_and_si256, _mm256_castps_si256,
    _mm256_castsi256_ps, _mm256_castsi256_si128, _mm256_cvtepu8_epi16, _mm256_cvtph_ps,
    _mm256_cvtps_epi32, _mm256_div_ps, _mm256_extracti128_si256, _mm256_loadu_si256, _mm256_max_ps,
    _mm256_min_ps, _mm256_mul_ps, _mm256_or_si256, _mm256_packus_epi16, _mm256_packus_epi32,
    _mm256_permute4x64_epi64, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32,
    _mm256_setzero_ps, _mm256_setzero_si256, _mm256_sllv_epi32, _mm256_srli_epi32,
    _mm256_storeu_si256, _mm256_sub_ps, _mm256_unpackhi_epi16, _mm256_unpacklo_epi16,
};

use quant_core::simd::Level;

use crate::layout::LANES;

/// `u[i] = to_nibble(rb(rb(x[i] - min_val) * r))` for the bf16 bit patterns `xs`, as
/// `kernels::group_nibbles` computes it on the bf16 path (the multiply form), every
/// rounding the portable one: nothing flushed, ties to even. The values must not be NaN
/// (the caller's groups never hold one on this path). Returns `false` (nothing written)
/// unless the CPU has AVX2 and `xs` and `u` have the same length, a multiple of 32.
#[inline(always)]
pub(crate) fn nibbles_bf16(xs: &[u16], min_val: f32, r: f32, u: &mut [u8]) -> bool {
    if !(Level::Avx2.is_supported() && xs.len().is_multiple_of(32) && u.len() == xs.len()) {
        return false;
    }
    // SAFETY: the CPU has AVX2 and the lengths fit (both checked above).
    unsafe { nibbles_bf16_steps(xs, min_val, r, u) };
    true
}

/// The f32 lanes of the 8 bf16 values of `v` that [`_mm256_unpacklo_epi16`] takes (4
/// per 128-bit lane), and of those [`_mm256_unpackhi_epi16`] takes.
#[inline]
#[target_feature(enable = "avx2")]
fn widen(v: __m256i) -> (__m256, __m256) {
    let zero = _mm256_setzero_si256();
    (
        _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)),
        _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v)),
    )
}

/// `v` rounded to bf16 in its f32 lane: its bits plus `0x7FFF` and the lsb of its high
/// half (`rb` of a value that is not NaN), the low half cleared. Rounding in place keeps
/// the values in the f32 lanes of [`widen`] from the input to the nibble: packing each
/// rounding's high halves to 16-bit lanes and widening them again cost three shuffles
/// per 16 values and rounding, a tenth of the kernel.
#[inline]
#[target_feature(enable = "avx2")]
fn round_in_place(v: __m256) -> __m256 {
    let b = _mm256_castps_si256(v);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
    let b = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    _mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32(-0x1_0000)))
}

/// The nibbles of 16 bf16 values `v` as 16-bit lanes, in input order.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles16(v: __m256i, mn: __m256, rr: __m256) -> __m256i {
    let nibble = |x: __m256| {
        let q = round_in_place(_mm256_mul_ps(round_in_place(_mm256_sub_ps(x, mn)), rr));
        // `qparams::to_nibble`'s clamps: `vmaxps` returns its second operand when either
        // is NaN or both are zeros, so NaN and `-0` become `+0`, as its selects give.
        // Then round half to even (`vcvtps2dq` under the default rounding mode), the
        // value a bf16 in [0, 15].
        let c = _mm256_min_ps(_mm256_max_ps(q, _mm256_setzero_ps()), _mm256_set1_ps(15.0));
        _mm256_cvtps_epi32(c)
    };
    let (lo, hi) = widen(v);
    // `vpackusdw`'s in-lane order undoes the unpacks': the values back in input order.
    _mm256_packus_epi32(nibble(lo), nibble(hi))
}

/// [`nibbles_bf16`] after its checks.
///
/// # Safety
/// The CPU must have AVX2; `xs.len() == u.len()`, a multiple of 32.
#[target_feature(enable = "avx2")]
unsafe fn nibbles_bf16_steps(xs: &[u16], min_val: f32, r: f32, u: &mut [u8]) {
    let mn = _mm256_set1_ps(min_val);
    let rr = _mm256_set1_ps(r);
    for (x, o) in xs.chunks_exact(32).zip(u.chunks_exact_mut(32)) {
        // SAFETY: `x` is 32 u16 (two unaligned 256-bit loads).
        let (a, b) = unsafe {
            (
                _mm256_loadu_si256(x.as_ptr().cast()),
                _mm256_loadu_si256(x.as_ptr().add(16).cast()),
            )
        };
        // Bytes per 128-bit lane: `a`'s half, then `b`'s; the permute puts `a`'s two
        // halves first.
        let bytes = _mm256_packus_epi16(nibbles16(a, mn, rr), nibbles16(b, mn, rr));
        let bytes = _mm256_permute4x64_epi64::<0b11_01_10_00>(bytes);
        // SAFETY: `o` is 32 bytes (one unaligned 256-bit store).
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), bytes) };
    }
}

/// `u[i] = to_nibble((x[i] - min_val) / scale)` for the f16 bit patterns `xs` (the f32
/// path of `kernels::group_nibbles`), as [`crate::x86`]'s AVX-512 `nibbles_f16`
/// computes it, 16 values per step: widened by `vcvtph2ps` (exact), the subtraction and
/// the IEEE division in f32 lanes, the two clamps of `qparams::to_nibble` (`vmaxps`
/// against 0 sends NaN and `-0` to `+0`, as its selects do) and its round half to even
/// (`vcvtps2dq`, which rounds so under the default rounding mode, as the 2^23 addition
/// does). Returns `false` (nothing written) unless the CPU has AVX2 and F16C and `xs`
/// and `u` have the same length, a multiple of 16.
///
/// Without it, f16 groups at AVX2 were widened into a scratch, their extremes found in
/// f32 lanes and their nibbles computed by the portable loop; with it the extremes come
/// from the bits too (`qparams::min_max_f16`).
#[inline(always)]
pub(crate) fn nibbles_f16(xs: &[u16], min_val: f32, scale: f32, u: &mut [u8]) -> bool {
    if !(Level::Avx2.is_supported() && xs.len().is_multiple_of(16) && u.len() == xs.len()) {
        return false;
    }
    // SAFETY: the CPU has AVX2 and F16C (`Level::Avx2` includes both) and the lengths
    // fit (both checked above).
    unsafe { nibbles_f16_steps(xs, min_val, scale, u) };
    true
}

/// [`nibbles_f16`] after its checks.
///
/// # Safety
/// The CPU must have AVX2 and F16C; `xs.len() == u.len()`, a multiple of 16.
#[target_feature(enable = "avx2,f16c")]
unsafe fn nibbles_f16_steps(xs: &[u16], min_val: f32, scale: f32, u: &mut [u8]) {
    let mn = _mm256_set1_ps(min_val);
    let sc = _mm256_set1_ps(scale);
    let fifteen = _mm256_set1_ps(15.0);
    // The nibbles of 8 values, in i32 lanes.
    let eight = |h: &[u16]| {
        // SAFETY: `h` is 8 u16 (one unaligned 128-bit load).
        let v = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(h.as_ptr().cast()) });
        let q = _mm256_div_ps(_mm256_sub_ps(v, mn), sc);
        // `vmaxps` returns its second operand when either is NaN or both are zeros.
        let c = _mm256_min_ps(_mm256_max_ps(q, _mm256_setzero_ps()), fifteen);
        _mm256_cvtps_epi32(c)
    };
    for (x, o) in xs.chunks_exact(16).zip(u.chunks_exact_mut(16)) {
        // u16 lanes: values 0..4 and 8..12, then 4..8 and 12..16; the permute orders them.
        let w = _mm256_packus_epi32(eight(&x[..8]), eight(&x[8..]));
        let w = _mm256_permute4x64_epi64::<0b11_01_10_00>(w);
        let bytes = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
        // SAFETY: `o` is 16 bytes (one unaligned 128-bit store).
        unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), bytes) };
    }
}

/// Packs one row's nibbles `u` (`k_padded` bytes, values below 16) into its words of
/// `tile` (the n-tile's `k_padded` words), as `kernels::pack_row` does; `half` is
/// `inner_k_tiles / 2`. Returns `false` (nothing written) unless the CPU has AVX2, `half`
/// is 1, 2 or 4 and the arguments fit together.
#[inline(always)]
pub(crate) fn pack_row(u: &[u8], nr: usize, half: usize, tile: &mut [i32]) -> bool {
    let fits = crate::x86::pack_fits(u, nr, half, tile);
    if !(Level::Avx2.is_supported() && matches!(half, 1 | 2 | 4) && fits) {
        return false;
    }
    // SAFETY: the CPU has AVX2 and the arguments fit (both checked above).
    unsafe { pack_slabs(u, nr, half, tile) };
    true
}

/// The four words of one 32-nibble block `ub` (module docs).
#[inline]
#[target_feature(enable = "avx2")]
fn block_words(ub: &[u8]) -> __m128i {
    debug_assert_eq!(ub.len(), 32);
    // SAFETY: `ub` is 32 bytes (two unaligned 128-bit loads).
    let (a, b) = unsafe {
        (
            _mm_loadu_si128(ub.as_ptr().cast()),
            _mm_loadu_si128(ub.as_ptr().add(16).cast()),
        )
    };
    let a = _mm256_sllv_epi32(
        _mm256_cvtepu8_epi16(a),
        _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4),
    );
    let b = _mm256_sllv_epi32(
        _mm256_cvtepu8_epi16(b),
        _mm256_setr_epi32(8, 8, 8, 8, 12, 12, 12, 12),
    );
    let t = _mm256_or_si256(a, b);
    _mm_or_si128(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t))
}

/// [`pack_row`] after its checks.
///
/// # Safety
/// The CPU must have AVX2; `half` is 1, 2 or 4 and `pack_fits(u, nr, half, tile)`.
#[target_feature(enable = "avx2")]
unsafe fn pack_slabs(u: &[u8], nr: usize, half: usize, tile: &mut [i32]) {
    let slab = 32 * half;
    for (kot, us) in u.chunks_exact(slab).enumerate() {
        let w: [__m128i; 4] = std::array::from_fn(|p| {
            if p < half {
                block_words(&us[32 * p..32 * p + 32])
            } else {
                _mm_setzero_si128()
            }
        });
        // The slab's words in `[c][p]` order: word `c * half + p` is word `c` of block `p`.
        let at = (kot * LANES + nr * 4) * half;
        let dst = &mut tile[at..at + 4 * half];
        let store = |dst: &mut [i32], i: usize, v: __m128i| {
            // SAFETY: `4 * i + 4 <= 4 * half = dst.len()` (`i < half`); one unaligned
            // 128-bit store.
            unsafe { _mm_storeu_si128(dst.as_mut_ptr().add(4 * i).cast(), v) }
        };
        match half {
            1 => store(dst, 0, w[0]),
            2 => {
                store(dst, 0, _mm_unpacklo_epi32(w[0], w[1]));
                store(dst, 1, _mm_unpackhi_epi32(w[0], w[1]));
            }
            _ => {
                let (t0, t1) = (
                    _mm_unpacklo_epi32(w[0], w[1]),
                    _mm_unpacklo_epi32(w[2], w[3]),
                );
                let (t2, t3) = (
                    _mm_unpackhi_epi32(w[0], w[1]),
                    _mm_unpackhi_epi32(w[2], w[3]),
                );
                store(dst, 0, _mm_unpacklo_epi64(t0, t1));
                store(dst, 1, _mm_unpackhi_epi64(t0, t1));
                store(dst, 2, _mm_unpacklo_epi64(t2, t3));
                store(dst, 3, _mm_unpackhi_epi64(t2, t3));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::rb_no_nan;
    use crate::qparams::to_nibble;

    /// Against the portable multiply form on every non-NaN bf16 pattern (infinities,
    /// zeros, subnormals), for offsets and reciprocals from an ordinary group's to
    /// subnormal and huge ones, infinite offsets included.
    #[test]
    fn nibbles_equal_the_portable_loop_on_every_input() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let xs: Vec<u16> = (0..=u16::MAX)
            .filter(|&b| b & 0x7FFF <= 0x7F80)
            .chain(std::iter::repeat_n(0, 32))
            .collect();
        let xs = &xs[..xs.len() / 32 * 32];
        let mut u = vec![0xFFu8; xs.len()];
        let cases = [
            (-2.0f32, 15.0 / 4.0),
            (-7.5 * 0.25, 4.0),
            (0.0, 1.0),
            (-8.0 * 2.0f32.powi(-20), 2.0f32.powi(20)),
            (-1e-3, 1e30),
            (0.0, 2.0f32.powi(100)),
            (-3.0e38, 2.5e-38),
            (1.5, 0.1),
            (-0.0, 1.0 / 3.0),
            (-1.0e-40, 2.0f32.powi(-126)),
        ];
        for (min_val, r) in cases {
            assert!(nibbles_bf16(xs, min_val, r, &mut u));
            for (&b, &got) in xs.iter().zip(&u) {
                let x = f32::from_bits(u32::from(b) << 16);
                let want = to_nibble(rb_no_nan(rb_no_nan(x - min_val) * r));
                assert_eq!(got, want, "{b:#06x}, min {min_val:e}, r {r:e}");
            }
        }
        // Lengths that are not whole steps are refused, with nothing written.
        u.fill(0xFF);
        assert!(!nibbles_bf16(&xs[..24], 0.0, 1.0, &mut u[..24]));
        assert!(!nibbles_bf16(&xs[..32], 0.0, 1.0, &mut u[..16]));
        assert!(u.iter().all(|&b| b == 0xFF));
    }

    /// Against the portable packer ([`crate::x86::tests::assert_packs_as_portable`]), and
    /// arguments that do not fit refused.
    #[test]
    fn packer_equals_the_portable_one() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        crate::x86::tests::assert_packs_as_portable("avx2", pack_row);
        // Arguments that do not fit are refused, with nothing written.
        let mut tile = vec![7i32; 64];
        assert!(!pack_row(&[0; 64], 0, 3, &mut tile));
        assert!(!pack_row(&[0; 48], 0, 1, &mut tile));
        assert!(!pack_row(&[0; 64], 0, 1, &mut tile[..32]));
        assert!(tile.iter().all(|&w| w == 7));
    }
}
