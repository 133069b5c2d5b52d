//! The AVX2 columnwise dequantize, transposed in registers: the twin of
//! [`crate::transposed_x86`] for CPUs without AVX-512.
//!
//! [`transposed_blocks`] (AVX2) stages 64 bytes of 64 stored rows in L1 and transposes
//! them 32 rows at a time: vectors `t` of the two halves are then output row `i + t`'s
//! next 64 codes, which are decoded 8 at a time ([`decode8`], the step of the AVX2 run
//! decoder), scaled, narrowed in registers and streamed as whole lines into the output
//! (two lines of bf16 or f16, four of f32). Where a slab's scales fold ([`Folded`])
//! and the 1024 codes of a visit hold no NaN or infinity, they take the folded decode
//! (4 operations per 8 codes instead of 10) and bf16 narrows without the NaN select, as
//! the run decoder's fast loops do. [`crate::transposed_x86::decode_lines`] checks what
//! this route takes (the same shapes as at AVX-512) and calls [`into`] at
//! [`Level::Avx2`].
//!
//! Before this route, the AVX2 level transposed every run into a tile (SSE2 16x16
//! blocks) and decoded each output row's run from there, as
//! [`crate::transpose::decode_transposed`] still does for what this route does not take.
//!
//! [`Level::Avx2`]: quant_core::simd::Level::Avx2

use std::arch::x86_64::{
    __m256, __m256i, _mm256_and_si256, _mm256_castps_si256, _mm256_cmpgt_epi8, _mm256_max_epu8,
    _mm256_movemask_epi8, _mm256_set1_epi8, _mm256_setzero_si256,
};

use quant_core::Element;
use quant_core::dtype::FloatsMut;
use quant_core::stream::avx2::{
    bf16_line, eighths_u8x32, f16_line, load_f32x32, stream_lines, transposed_blocks,
};

use crate::decode_avx2::decode8;
use crate::kernels::Folded;
use crate::scale::Fp8Dtype;
use crate::transpose::SLAB;
use crate::transposed_x86::{MAX_ROWS, Walk};
use crate::x86::dtype;

/// Output columns per visit: a 64-row block of [`transposed_blocks`].
const BLOCK: usize = 64;
/// Output columns per vector: 32 stored rows.
const HALF: usize = 32;

/// [`crate::transposed_x86::decode_lines`] at AVX2, after its checks: `false` (nothing
/// written) where `T` is not a float type.
pub(crate) fn into<const E5M2: bool, T: Element>(
    walk: &Walk<'_>,
    scale_inv: &impl Fn(usize, usize, &mut [f32]),
    out: &mut [T],
) -> bool {
    match FloatsMut::of(out) {
        // SAFETY: the CPU has the AVX2 level's features (`decode_lines` runs this only
        // at `Level::Avx2`, which is only active where it does).
        Some(FloatsMut::F32(o)) => unsafe { into_f32::<E5M2>(walk, scale_inv, o) },
        // SAFETY: as above.
        Some(FloatsMut::Bf16(o)) => unsafe { into_bf16::<E5M2>(walk, scale_inv, o) },
        // SAFETY: as above (`Level::Avx2` includes F16C).
        Some(FloatsMut::F16(o)) => unsafe { into_f16::<E5M2>(walk, scale_inv, o) },
        None => return false,
    }
    true
}

/// Whether one of the 1024 codes of `v` decodes to NaN or an infinity (its magnitude
/// above `dt`'s largest finite code, as [`quant_core::codec::folded::has_special`]).
#[inline]
#[target_feature(enable = "avx2")]
fn any_special(dt: Fp8Dtype, v: &[[__m256i; 2]; 16]) -> bool {
    let mag = _mm256_set1_epi8(0x7F);
    let top = v.iter().flatten().fold(_mm256_setzero_si256(), |m, &c| {
        _mm256_max_epu8(m, _mm256_and_si256(c, mag))
    });
    // Magnitudes are at most 0x7F: the signed compare is the unsigned one.
    let limit = _mm256_set1_epi8(dt.pow2_codec().max_code() as i8);
    _mm256_movemask_epi8(_mm256_cmpgt_epi8(top, limit)) != 0
}

/// The 32 codes of `c` decoded and times the scales `s` of their columns (folded ones
/// with `FAST`), 8 per vector.
#[inline]
#[target_feature(enable = "avx2")]
fn decode32<const FAST: bool>(dt: Fp8Dtype, c: __m256i, s: &[__m256; 4]) -> [__m256; 4] {
    let c = eighths_u8x32(c);
    [
        decode8::<FAST>(dt, c[0], s[0]),
        decode8::<FAST>(dt, c[1], s[1]),
        decode8::<FAST>(dt, c[2], s[2]),
        decode8::<FAST>(dt, c[3], s[3]),
    ]
}

/// The walk of one output type, whose 32 values are `N` 32-byte pieces:
/// [`transposed_blocks`] over the task's bytes of the stored rows `w.cols`, each pair
/// of vectors (an output row's next 64 codes) decoded with its slab's scales and
/// narrowed by `lines(values, fast)` (`fast`: the folded route, no value NaN), then
/// streamed into its output row, two lines of bf16 or f16 back to back (four of f32).
/// The scales of a block of 64 columns are filled and folded (for every slab of the
/// task) when its first vectors come.
///
/// # Safety
/// The CPU must have the AVX2 level's features; `out` must start `w.cols.start`
/// elements before a line, and rows of `w.k` elements must be whole lines (checked by
/// `decode_lines`); `N` pieces must be 32 values of `O`.
#[inline]
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
unsafe fn walk<O: Copy, const N: usize>(
    w: &Walk<'_>,
    dt: Fp8Dtype,
    scale_inv: &impl Fn(usize, usize, &mut [f32]),
    out: &mut [O],
    lines: impl Fn([__m256; 4], bool) -> [__m256i; N],
) {
    debug_assert_eq!(N * 32, HALF * size_of::<O>());
    let Walk { q, m, i0, k, .. } = *w;
    let rows = out.len() / k;
    let slabs = rows.div_ceil(SLAB);
    let mut si = [0f32; BLOCK * MAX_ROWS / SLAB];
    let mut sf = [0f32; BLOCK * MAX_ROWS / SLAB];
    let mut folds = [false; MAX_ROWS / SLAB];
    transposed_blocks(q, m, w.cols.clone(), i0..i0 + rows, |j0, i, codes| {
        // A block of 64 columns starts with its first row's vectors: its scales then.
        if i == i0 {
            let runs = si.chunks_exact_mut(BLOCK).zip(sf.chunks_exact_mut(BLOCK));
            for (s, ((run, folded), fold)) in runs.zip(&mut folds).take(slabs).enumerate() {
                scale_inv(i0 + s * SLAB, j0, run);
                *fold = Folded::each(dt, run, folded).is_some();
            }
        }
        let r0 = i - i0;
        let fast = folds[r0 / SLAB] && !any_special(dt, &codes);
        let at = r0 / SLAB * BLOCK;
        let src = if fast { &sf[at..] } else { &si[at..] };
        let s = [load_f32x32(src), load_f32x32(&src[HALF..])];
        for (t, pair) in codes.into_iter().enumerate() {
            let r = r0 + t;
            let dst = out[r * k + j0..r * k + j0 + BLOCK].as_mut_ptr();
            for (h, c) in pair.into_iter().enumerate() {
                let values = if fast {
                    decode32::<true>(dt, c, &s[h])
                } else {
                    decode32::<false>(dt, c, &s[h])
                };
                // SAFETY: the 32 values at `dst + 32h` lie inside `out` and start on a
                // line (`out` starts `cols.start` values before one, `j0 - cols.start`
                // is a multiple of 64 values, and rows are whole lines: contract).
                unsafe { stream_lines(dst.add(HALF * h).cast(), lines(values, fast)) }
            }
        }
    });
}

/// [`into`] into f32.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn into_f32<const E5M2: bool>(
    w: &Walk<'_>,
    scale_inv: &impl Fn(usize, usize, &mut [f32]),
    out: &mut [f32],
) {
    let lines = |v: [__m256; 4], _| v.map(|v| _mm256_castps_si256(v));
    // SAFETY: the CPU has the AVX2 level's features (this function's); `decode_lines`
    // checked the layout; four pieces are 32 f32.
    unsafe { walk(w, dtype::<E5M2>(), scale_inv, out, lines) }
}

/// [`into`] into bf16 bits (without the NaN select on the folded route, where no
/// product is NaN).
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn into_bf16<const E5M2: bool>(
    w: &Walk<'_>,
    scale_inv: &impl Fn(usize, usize, &mut [f32]),
    out: &mut [u16],
) {
    let lines = |v, fast| bf16_line(v, fast);
    // SAFETY: as for f32; two pieces are 32 bf16.
    unsafe { walk(w, dtype::<E5M2>(), scale_inv, out, lines) }
}

/// [`into`] into f16 bits.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn into_f16<const E5M2: bool>(
    w: &Walk<'_>,
    scale_inv: &impl Fn(usize, usize, &mut [f32]),
    out: &mut [u16],
) {
    let lines = |v, _| f16_line(v);
    // SAFETY: as for f32; two pieces are 32 f16.
    unsafe { walk(w, dtype::<E5M2>(), scale_inv, out, lines) }
}
