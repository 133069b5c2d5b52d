//! The AVX-512 columnwise dequantize, transposed in registers.
//!
//! The columnwise codes are stored transposed (`[K, M]`), so output row `i`'s columns
//! `j0..j0 + 64` are byte `i` of 64 stored rows. [`transposed_blocks`] stages 64 bytes
//! of each of those 64 rows in L1 and transposes them in registers: vector `t` is then
//! output row `i + t`'s next 64 codes, which are decoded, scaled and narrowed in registers and
//! streamed as whole lines straight into the output (two lines of bf16 or f16, four of
//! f32). The route of [`crate::transpose::decode_transposed`] before this one (and
//! still for what this one does not take) transposes every run into a tile in L2 and
//! decodes each output row's run from there: a store and a reload of every code.
//!
//! [`decode_lines`] also serves [`Level::Avx2`]: the same checks, then the AVX2 twin
//! of the walk in [`crate::transposed_avx2`].

use std::arch::x86_64::{__m512, __m512i, _mm512_stream_si512};
use std::ops::Range;

use quant_core::Element;
use quant_core::dtype::FloatsMut;
use quant_core::simd::{self, Level};
use quant_core::stream::StoreMode;
use quant_core::stream::x86::{
    bf16_lines, f16_lines, f32_lines, load_f32x64, transposed_blocks, widen_u8x64,
};

use crate::scale::Fp8Dtype;
use crate::transpose::SLAB;

/// Output rows and columns per block: [`transposed_blocks`] reads 64 stored rows.
const BLOCK: usize = 64;
/// The most output rows a task may have here (the scales of each [`SLAB`] of them are
/// kept for the block of columns being decoded).
pub(crate) const MAX_ROWS: usize = 8 * SLAB;

/// Decodes the columns this route takes of a columnwise dequantize task, from the
/// stored codes `q` (`[k, m]`), and returns them: `out` is output rows `i0..i0 + rows`
/// (`rows = out.len() / k`), and `scale_inv` is
/// [`crate::transpose::decode_transposed`]'s. The route takes whole 64-column blocks
/// that start on 64-byte lines, in a task of whole 64-row blocks (at most
/// [`MAX_ROWS`]) at [`Level::Avx512`] (bf16 output also needs AVX-512 BF16) or
/// [`Level::Avx2`] ([`crate::transposed_avx2`]) in [`StoreMode::Streaming`], where
/// each output row is a whole number of lines; otherwise it
/// returns an empty range and writes nothing. The caller decodes the columns before
/// and after the range by the tile route, and fences the streamed stores (one
/// [`quant_core::stream::Fence`] per task). The bits are those of the tile route.
pub(crate) fn decode_lines<T: Element>(
    (level, mode): (Level, StoreMode),
    dt: Fp8Dtype,
    (q, m, i0): (&[u8], usize, usize),
    out: &mut [T],
    k: usize,
    scale_inv: &impl Fn(usize, usize, &mut [f32]),
) -> Range<usize> {
    let rows = out.len().checked_div(k).unwrap_or(0);
    let lead = out.as_ptr().align_offset(64);
    let whole = k.saturating_sub(lead) / BLOCK * BLOCK;
    let fits = matches!(level, Level::Avx512 | Level::Avx2)
        && mode == StoreMode::Streaming
        && rows > 0
        && rows.is_multiple_of(BLOCK)
        && rows <= MAX_ROWS
        && (k * size_of::<T>()).is_multiple_of(64)
        && whole > 0
        && q.len() == m * k
        && i0 + rows <= m;
    if !fits {
        return 0..0;
    }
    let cols = lead..lead + whole;
    let walk = Walk {
        q,
        m,
        i0,
        cols: cols.clone(),
        k,
    };
    let ran = match (level, dt) {
        (Level::Avx2, Fp8Dtype::E4M3) => {
            crate::transposed_avx2::into::<false, T>(&walk, scale_inv, out)
        }
        (Level::Avx2, Fp8Dtype::E5M2) => {
            crate::transposed_avx2::into::<true, T>(&walk, scale_inv, out)
        }
        (_, Fp8Dtype::E4M3) => into::<false, T>(&walk, scale_inv, out),
        (_, Fp8Dtype::E5M2) => into::<true, T>(&walk, scale_inv, out),
    };
    if !ran {
        return 0..0;
    }
    cols
}

/// [`decode_lines`] after its checks at AVX-512, for one element type: `false` where
/// the output type has no kernel here (bf16 without AVX-512 BF16).
fn into<const E5M2: bool, T: Element>(
    walk: &Walk<'_>,
    scale_inv: &impl Fn(usize, usize, &mut [f32]),
    out: &mut [T],
) -> bool {
    match FloatsMut::of(out) {
        // SAFETY: the CPU has AVX-512 F, BW and DQ (`decode_lines` runs this only at
        // `Level::Avx512`, which is only active where it does).
        Some(FloatsMut::F32(o)) => unsafe { into_f32::<E5M2>(walk, scale_inv, o) },
        // SAFETY: as above, and the CPU has AVX-512 BF16 (checked).
        Some(FloatsMut::Bf16(o)) if simd::has(simd::Ext::Bf16) => unsafe {
            into_bf16::<E5M2>(walk, scale_inv, o)
        },
        // SAFETY: as for f32.
        Some(FloatsMut::F16(o)) => unsafe { into_f16::<E5M2>(walk, scale_inv, o) },
        _ => return false,
    }
    true
}

/// What [`decode_lines`] walks: the stored codes `q` (`[k, m]`), the task's first output
/// row `i0`, and the output columns `cols` of rows `k` long.
pub(crate) struct Walk<'a> {
    pub(crate) q: &'a [u8],
    pub(crate) m: usize,
    pub(crate) i0: usize,
    pub(crate) cols: Range<usize>,
    pub(crate) k: usize,
}

/// The walk of one output type, whose 64 values are `LINES` lines:
/// [`transposed_blocks`] over the task's bytes of the stored rows `w.cols`, each vector
/// (an output row's next 64 codes) decoded with its slab's scales by
/// `lines(codes, scales)` and streamed into its output row. The scales of a block of 64
/// columns are filled (for every slab of the task) when its first vectors come (the
/// walk's blocks come in order of columns, then rows).
///
/// # Safety
/// The CPU must have AVX-512 F and BW; `out` must start `w.cols.start` elements before
/// a line, and rows of `w.k` elements must be whole lines (checked by
/// [`decode_lines`]); `LINES` lines must be 64 values of `O`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn walk<O: Copy, const LINES: usize>(
    w: &Walk<'_>,
    scale_inv: &impl Fn(usize, usize, &mut [f32]),
    out: &mut [O],
    lines: impl Fn(__m512i, &[__m512; 4]) -> [__m512i; LINES],
) {
    debug_assert_eq!(LINES * 64, BLOCK * size_of::<O>());
    let Walk { q, m, i0, k, .. } = *w;
    let rows = out.len() / k;
    let mut si = [0f32; BLOCK * MAX_ROWS / SLAB];
    transposed_blocks(q, m, w.cols.clone(), i0..i0 + rows, |j0, i, codes| {
        // A block of 64 columns starts with its first row's vectors: its scales then.
        if i == i0 {
            for (s, run) in si
                .chunks_exact_mut(BLOCK)
                .take(rows.div_ceil(SLAB))
                .enumerate()
            {
                scale_inv(i0 + s * SLAB, j0, run);
            }
        }
        let r0 = i - i0;
        let s = load_f32x64(&si[r0 / SLAB * BLOCK..]);
        for (t, codes) in codes.into_iter().enumerate() {
            let r = r0 + t;
            let dst = out[r * k + j0..r * k + j0 + BLOCK]
                .as_mut_ptr()
                .cast::<u8>();
            for (l, line) in lines(codes, &s).into_iter().enumerate() {
                // SAFETY: line `l` of the 64 values at `dst` lies inside `out`, and starts
                // on a line (`out` starts `cols.start` values before one, `j0 -
                // cols.start` is a multiple of 64 values, and rows are whole lines:
                // contract).
                unsafe { _mm512_stream_si512(dst.add(64 * l).cast(), line) }
            }
        }
    });
}

/// The 64 codes of `c` decoded and times the scales `s` of their columns, 16 per vector.
#[inline]
#[target_feature(enable = "avx512f")]
fn decode64<const E5M2: bool>(c: __m512i, s: &[__m512; 4]) -> [__m512; 4] {
    let dt = crate::x86::dtype::<E5M2>();
    let c = widen_u8x64(c);
    let one = |l: usize| crate::x86::decode16(dt, c[l], s[l]);
    [one(0), one(1), one(2), one(3)]
}

/// [`decode_lines`] into f32.
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
fn into_f32<const E5M2: bool>(
    w: &Walk<'_>,
    scale_inv: &impl Fn(usize, usize, &mut [f32]),
    out: &mut [f32],
) {
    let lines = |c, s: &[__m512; 4]| f32_lines(decode64::<E5M2>(c, s));
    // SAFETY: the CPU has AVX-512 F and BW (this function's features); `decode_lines`
    // checked the layout; four lines are 64 f32.
    unsafe { walk(w, scale_inv, out, lines) }
}

/// [`decode_lines`] into bf16 bits.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16")]
fn into_bf16<const E5M2: bool>(
    w: &Walk<'_>,
    scale_inv: &impl Fn(usize, usize, &mut [f32]),
    out: &mut [u16],
) {
    let lines = |c, s: &[__m512; 4]| bf16_lines(decode64::<E5M2>(c, s));
    // SAFETY: the CPU has AVX-512 F and BW (this function's features); `decode_lines`
    // checked the layout; two lines are 64 bf16.
    unsafe { walk(w, scale_inv, out, lines) }
}

/// [`decode_lines`] into f16 bits.
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
fn into_f16<const E5M2: bool>(
    w: &Walk<'_>,
    scale_inv: &impl Fn(usize, usize, &mut [f32]),
    out: &mut [u16],
) {
    let lines = |c, s: &[__m512; 4]| f16_lines(decode64::<E5M2>(c, s));
    // SAFETY: the CPU has AVX-512 F and BW (this function's features); `decode_lines`
    // checked the layout; two lines are 64 f16.
    unsafe { walk(w, scale_inv, out, lines) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// The route's columns against `table[code] * scale`, narrowed as `Element` narrows
    /// (NaN bits kept as they come), and nothing written outside them, at AVX-512 and
    /// AVX2: 192 rows (one whole 128-row slab and half of one, three 64-row blocks) of
    /// 320 columns, the output on a line and 7 elements past one, every code of both
    /// element types, scales per slab and column whose products overflow and underflow
    /// f16 and bf16. For the AVX2 route's folded decode, one 32-column run in three
    /// holds no NaN or infinity codes, and the second slab has scales that do not fold
    /// (`3e38` times the rebias is infinite).
    #[test]
    fn decodes_its_columns_exactly() {
        fn check<T: Element>(level: Level, dt: Fp8Dtype, at: usize) {
            let (m, k) = (192, 320);
            let q: Vec<u8> = (0..m * k)
                .map(|e| {
                    let c = (e * 131 % 256) as u8;
                    // Stored row `e / m` is output column `j`: `& 0xFB` leaves magnitudes
                    // of at most 0x7B, finite in both types.
                    if (e / m / 32) % 3 == 1 { c & 0xFB } else { c }
                })
                .collect();
            let scale = |slab: usize, j: usize| match (slab * 5 + j) % 7 {
                _ if slab == 1 && j.is_multiple_of(5) => 3.0e38,
                0 => 1e-40,
                1 => 3.0e-39,
                2 => 1e-6,
                3 => 300.0,
                _ => 0.5 + j as f32 / 256.0,
            };
            let fill = T::from_f32(-7.0);
            let mut buf = vec![fill; m * k + 64];
            let lead = buf.as_ptr().align_offset(64) + at;
            let out = &mut buf[lead..lead + m * k];
            let cols = decode_lines(
                (level, StoreMode::Streaming),
                dt,
                (&q, m, 0),
                out,
                k,
                &|i0, j0, s: &mut [f32]| {
                    for (j, v) in s.iter_mut().enumerate() {
                        *v = scale(i0 / SLAB, j0 + j);
                    }
                },
            );
            let first = (64 / size_of::<T>() - at) % (64 / size_of::<T>());
            assert_eq!(
                cols,
                first..first + (k - first) / 64 * 64,
                "{level} {dt} +{at}"
            );
            for i in 0..m {
                for j in 0..k {
                    let got = out[i * k + j].to_f32().to_bits();
                    let want = if cols.contains(&j) {
                        let v = dt.decode_table()[usize::from(q[j * m + i])] * scale(i / SLAB, j);
                        T::from_f32(v).to_f32().to_bits()
                    } else {
                        fill.to_f32().to_bits()
                    };
                    assert_eq!(got, want, "{level} {dt} +{at}: ({i}, {j})");
                }
            }
        }
        for level in [Level::Avx512, Level::Avx2] {
            let ran = quant_core::simd::with_level(level, || {
                for dt in [Fp8Dtype::E4M3, Fp8Dtype::E5M2] {
                    for at in [0, 7] {
                        check::<f32>(level, dt, at);
                        check::<f16>(level, dt, at);
                        if level == Level::Avx2 || simd::has(simd::Ext::Bf16) {
                            check::<bf16>(level, dt, at);
                        }
                    }
                }
            });
            if ran.is_none() {
                eprintln!("skipped at {level}: this CPU does not have it");
            }
        }
    }

    /// What the route does not take it leaves to the tile route, untouched: other levels,
    /// cached stores, tasks that are not whole 64-row blocks (or more than
    /// [`MAX_ROWS`]), rows that are not whole lines, fewer than 64 columns past the first
    /// line.
    #[test]
    fn declines_what_it_does_not_take() {
        fn declines(level: Level, mode: StoreMode, (m, rows, k): (usize, usize, usize)) {
            let q = vec![0x38u8; m * k];
            let mut buf = vec![f16::ONE; rows * k + 32];
            let lead = buf.as_ptr().align_offset(64);
            let out = &mut buf[lead..lead + rows * k];
            let got = decode_lines(
                (level, mode),
                Fp8Dtype::E4M3,
                (&q, m, 0),
                out,
                k,
                &|_, _, s: &mut [f32]| s.fill(1.0),
            );
            assert_eq!(got, 0..0, "{level} {mode:?} {m} {rows} {k}");
            assert!(out.iter().all(|&v| v == f16::ONE));
        }
        let stream = StoreMode::Streaming;
        declines(Level::Scalar, stream, (64, 64, 64));
        for level in [Level::Avx512, Level::Avx2] {
            declines(level, StoreMode::Cached, (64, 64, 64));
            declines(level, stream, (100, 100, 64));
            declines(level, stream, (2 * MAX_ROWS, 2 * MAX_ROWS, 64));
            declines(level, stream, (64, 64, 32));
            declines(level, stream, (64, 64, 40));
        }
    }
}
