//! The AVX2 columnwise dequantize, transposed in registers: the twin of
//! [`crate::transposed_x86`] for CPUs without AVX-512.
//!
//! [`transposed_blocks`] (AVX2) stages 64 bytes of 64 stored rows in L1 and transposes
//! them 32 rows at a time: vectors `t` of the two halves are then byte `p + t` of 64
//! stored rows, output rows `2(p + t)` (low nibbles) and `2(p + t) + 1` (high) at 64
//! columns. Each row's codes are decoded 8 at a time by one `vpermps` and a sign `xor`
//! ([`e2m1_8`], the AVX2 row decoder's step), scaled by their columns' factors,
//! narrowed in registers and streamed as whole lines (two lines of bf16 or f16, four
//! of f32, back to back). Where a block's factors are all finite no product is NaN,
//! and bf16 narrows without the NaN select.
//! [`crate::transposed_x86::decode_lines`] checks what this route takes (the shapes of
//! the AVX-512 route, without RHT) and calls [`into`] at [`Level::Avx2`]. RHT operands
//! keep the tile route at AVX2: this walk with the AVX2 tile route's inverse transform
//! (`rht_avx2::inverse_nibbles`, per 16-row group from 8 staged lines, as at AVX-512)
//! measured x0.97 against it, the inverse's sums being the time and the tile's 128-bit
//! transposes cheap beside them.
//!
//! [`Level::Avx2`]: quant_core::simd::Level::Avx2

use std::arch::x86_64::{__m256, __m256i, _mm256_castps_si256, _mm256_mul_ps, _mm256_srli_epi32};

use quant_core::Element;
use quant_core::dtype::FloatsMut;
use quant_core::stream::avx2::{
    bf16_line, f16_line, load_f32x32, stream_lines, transposed_blocks, widen_u8x32,
};

use crate::scale::BLOCK;
use crate::transposed_x86::{MAX_ROWS, Walk};
use crate::x86_avx2::{decode_table, e2m1_8};

/// Output columns per visit: a 64-row block of [`transposed_blocks`] (the factor
/// closure's width at both levels).
const COLS: usize = 64;
/// Output columns per vector: 32 stored rows.
const HALF: usize = 32;

/// [`crate::transposed_x86::decode_lines`] at AVX2, after its checks (and without RHT):
/// `false` (nothing written) where `T` is not a float type.
pub(crate) fn into<T: Element>(
    walk: &Walk<'_>,
    factors: impl FnMut(usize, &mut [f32]),
    out: &mut [T],
) -> bool {
    match FloatsMut::of(out) {
        // SAFETY: the CPU has the AVX2 level's features (`decode_lines` runs this only
        // at `Level::Avx2`, which is only active where it does).
        Some(FloatsMut::F32(o)) => unsafe { into_f32(walk, factors, o) },
        // SAFETY: as above.
        Some(FloatsMut::Bf16(o)) => unsafe { into_bf16(walk, factors, o) },
        // SAFETY: as above (`Level::Avx2` includes F16C).
        Some(FloatsMut::F16(o)) => unsafe { into_f16(walk, factors, o) },
        None => return false,
    }
    true
}

/// The 32 codes in the low (or `high`) nibbles of `c`'s bytes, decoded by [`e2m1_8`]
/// from `table` (the positive half of [`quant_core::codec::e2m1::DECODE`],
/// [`decode_table`]) and times the factors `s` of their columns: the portable
/// `s * e2m1(code)`, exactly.
#[inline]
#[target_feature(enable = "avx2")]
fn decode32(c: __m256i, high: bool, s: &[__m256; 4], table: __m256) -> [__m256; 4] {
    let c = widen_u8x32(c);
    let one = |l: usize| {
        let codes = if high {
            _mm256_srli_epi32::<4>(c[l])
        } else {
            c[l]
        };
        _mm256_mul_ps(s[l], e2m1_8(table, codes))
    };
    [one(0), one(1), one(2), one(3)]
}

/// The walk of one output type, whose 32 values are `N` 32-byte pieces:
/// [`transposed_blocks`] over the task's bytes of the stored rows `w.cols`; each pair
/// of vectors (byte `p` of 64 stored rows) is output rows `2p` and `2p + 1`, decoded
/// with their group's factors and narrowed by `lines(values, finite)` (`finite`: every
/// factor of the block is, so no value is NaN), then streamed. The factors of a block
/// of 64 columns are filled when its first vectors come.
///
/// # Safety
/// The CPU must have the AVX2 level's features; `out` must start `w.cols.start`
/// elements before a line, and rows of `w.k` elements must be whole lines (checked by
/// `decode_lines`); `N` pieces must be 32 values of `O`.
#[inline]
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
unsafe fn walk<O: Copy, const N: usize>(
    w: &Walk<'_>,
    mut factors: impl FnMut(usize, &mut [f32]),
    out: &mut [O],
    lines: impl Fn([__m256; 4], bool) -> [__m256i; N],
) {
    debug_assert_eq!(N * 32, HALF * size_of::<O>());
    let Walk { data, m, p0, k, .. } = *w;
    let rows = out.len() / k;
    let table = decode_table();
    let mut f = [0f32; COLS * MAX_ROWS / BLOCK];
    let f = &mut f[..rows / BLOCK * COLS];
    let mut finite = false;
    let bytes = p0..p0 + rows / 2;
    transposed_blocks(data, m / 2, w.cols.clone(), bytes, |j0, at, v| {
        // A block of 64 columns starts with its first rows' vectors: its factors then.
        if at == p0 {
            factors(j0, f);
            // A fold without an early exit, so that it vectorizes.
            finite = f.iter().fold(true, |ok, x| ok & x.is_finite());
        }
        // Bytes `at..at + 16` are output rows `r0..r0 + 32`: two 16-row groups.
        let r0 = 2 * (at - p0);
        for (group, v) in v.chunks_exact(8).enumerate() {
            let g = &f[(r0 / BLOCK + group) * COLS..][..COLS];
            let s = [load_f32x32(g), load_f32x32(&g[HALF..])];
            let r = r0 + BLOCK * group;
            for (t, pair) in v.iter().enumerate() {
                for (row, high) in [(r + 2 * t, false), (r + 2 * t + 1, true)] {
                    let dst = out[row * k + j0..row * k + j0 + COLS].as_mut_ptr();
                    for (h, &codes) in pair.iter().enumerate() {
                        let values = decode32(codes, high, &s[h], table);
                        // SAFETY: the 32 values at `dst + 32h` lie inside `out` and start
                        // on a line (`out` starts `cols.start` values before one, `j0 -
                        // cols.start` is a multiple of 64 values, and rows are whole
                        // lines: contract).
                        unsafe { stream_lines(dst.add(HALF * h).cast(), lines(values, finite)) }
                    }
                }
            }
        }
    });
}

/// [`into`] into f32.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn into_f32(w: &Walk<'_>, factors: impl FnMut(usize, &mut [f32]), out: &mut [f32]) {
    let lines = |v: [__m256; 4], _| v.map(|v| _mm256_castps_si256(v));
    // SAFETY: the CPU has the AVX2 level's features (this function's); `decode_lines`
    // checked the layout; four pieces are 32 f32.
    unsafe { walk(w, factors, out, lines) }
}

/// [`into`] into bf16 bits (without the NaN select where the block's factors are
/// finite).
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn into_bf16(w: &Walk<'_>, factors: impl FnMut(usize, &mut [f32]), out: &mut [u16]) {
    let lines = |v, finite| bf16_line(v, finite);
    // SAFETY: as for f32; two pieces are 32 bf16.
    unsafe { walk(w, factors, out, lines) }
}

/// [`into`] into f16 bits.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn into_f16(w: &Walk<'_>, factors: impl FnMut(usize, &mut [f32]), out: &mut [u16]) {
    let lines = |v, _| f16_line(v);
    // SAFETY: as for f32; two pieces are 32 f16.
    unsafe { walk(w, factors, out, lines) }
}
