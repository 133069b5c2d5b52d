//! Transposed FP8 data: cache-sized tiles, SIMD byte transposes.
//!
//! The columnwise operand is stored transposed (`[K, M]`). Quantizing writes it from row
//! slabs of the input: a task owns input rows `i0..i0+SLAB`, which are columns
//! `i0..i0+SLAB` of every output row (a [`quant_core::strips::Strip`]); each tile of
//! codes is transposed into it by [`quant_core::stream::transpose_to_strip`] (in
//! registers and streamed at AVX-512 and AVX2, else SSE2 16x16 blocks into L1 and its
//! rows copied out). Dequantizing walks the other way ([`decode_transposed`]): a task
//! owns up to [`MAX_SLABS`] slabs of output rows and reads the matching column range
//! of the stored rows, a [`DECODE_COLS`]-row chunk of them at a time.

use std::ops::Range;

use quant_core::Element;
use quant_core::simd;
use quant_core::stream::{Fence, StoreMode, line_chunks, spans_around};
use quant_core::strips::task_rows;
use rayon::prelude::*;

use crate::kernels::{Folded, Scales, WIDE, decode_run};
use crate::scale::Fp8Dtype;

/// Input rows per task (and output columns per strip).
pub(crate) const SLAB: usize = 128;
/// Input columns per tile.
pub(crate) const TILE: usize = 128;
/// Most [`SLAB`]s one dequantize task takes: runs of up to 512 bytes of every stored
/// row (128-byte runs left the transposing loads waiting on memory; 512 measured
/// x1.17 on a 2-vCPU Zen 4, 8192x8192 bf16, against 128).
const MAX_SLABS: usize = 4;
/// Stored rows (output columns) per dequantize chunk: output runs of 1-2 KiB, and a
/// transposed tile of at most `512 x 576` bytes, which with the next chunk's prefetched
/// rows (256 KiB) leaves half of a 1 MiB L2 free. 1024 columns (a 544 KiB tile beside
/// 512 KiB of prefetched rows: all of L2) measured x0.90-0.94 against 512 on a 2-vCPU
/// Zen 4 (8192x8192, FP8 per-tensor, 9 and 7 A/B pairs into bf16 and f32), once the
/// transposes were compiled into the AVX-512 kernel (2048 columns: x0.67).
const DECODE_COLS: usize = 512;
/// Bytes added to each row of the dequantize tile: a pitch of 1024 bytes (16 lines) puts
/// the 16 rows one 16x16 transpose writes into 4 of L1's 64 sets, beside the 16 source
/// lines (a page apart: all in one set); 1088 bytes (17 lines) spreads them over 16 sets.
/// x1.07 on the FP8 per-tensor columnwise dequantize (22 A/B pairs, Zen 4, 8192x8192 bf16).
const PITCH_PAD: usize = 64;

/// Byte transpose of `[rows, cols]` into `[cols, rows]`, parallel over tiles of
/// destination rows.
pub fn transpose_bytes(src: &[u8], dst: &mut [u8], rows: usize, cols: usize) {
    debug_assert_eq!(src.len(), rows * cols);
    debug_assert_eq!(dst.len(), rows * cols);
    if rows == 0 || cols == 0 {
        return;
    }
    dst.par_chunks_mut(TILE * rows)
        .enumerate()
        .for_each(|(t, out)| {
            let j0 = t * TILE;
            let jn = out.len() / rows;
            for i0 in (0..rows).step_by(SLAB) {
                let rn = SLAB.min(rows - i0);
                simd::transpose_bytes(&src[i0 * cols + j0..], cols, &mut out[i0..], rows, rn, jn);
            }
        });
}

/// Dequantizes the transposed codes `q` (`[k, m]`) into `out` (`[m, k]`).
///
/// `scale_inv(i0, j0, s)` fills `s` with the scale_inv of logical elements
/// `(i, j0..j0 + s.len())` for every row `i` of the slab `i0..i0 + SLAB`, for any `j0`
/// (a chunk may start inside a block: see [`line_chunks`]): the scale may
/// depend on the row only through `i / SLAB` (true of a tensor scale and of 128-row
/// blocks), so one call serves 128 output rows (filling a scale row per output row
/// was a fifth of the profile).
///
/// A task takes [`task_rows`] output rows. At AVX-512, streaming, the whole 64-column
/// blocks of its rows go the register route of [`crate::transposed_x86`] (x1.4-1.8 on a
/// 2-vCPU Zen 4 at 8192x8192, per-tensor into bf16, f16 and f32; at AVX2 its twin in
/// [`crate::transposed_avx2`], x1.07-1.56 there), and the tile route
/// below takes the columns before and after them (and every task elsewhere). The tile
/// route walks the task's columns in chunks of [`DECODE_COLS`]
/// stored rows (the first cut short so that the rest start on output lines): their runs
/// are transposed into `tile` (16x16 SSE2 blocks), then each output row's run is decoded
/// from it by [`decode_run`], which at AVX-512 streams a large output (2 KiB runs of
/// hundreds of rows: ordinary stores, each line read for ownership first, made the
/// FP8 columnwise dequantize x1.3-1.4 slower). While a chunk decodes, each output row
/// prefetches a share of the next chunk's stored-row runs, which are pages apart and
/// which no hardware prefetcher follows (x1.13 on the Zen 4 above).
pub(crate) fn decode_transposed<T: Element>(
    dt: Fp8Dtype,
    q: &[u8],
    m: usize,
    k: usize,
    scale_inv: impl Fn(usize, usize, &mut [f32]) + Sync,
    out: &mut [T],
) {
    if m == 0 || k == 0 {
        return;
    }
    debug_assert_eq!(q.len(), m * k);
    debug_assert_eq!(out.len(), m * k);
    let level = simd::level();
    let mode = StoreMode::for_output_bytes(std::mem::size_of_val(out));
    let task = task_rows(m, SLAB, MAX_SLABS);
    let cols = DECODE_COLS.min(k);
    let pitch = cols + PITCH_PAD;
    #[cfg(target_arch = "x86_64")]
    const _: () = assert!(MAX_SLABS * SLAB <= crate::transposed_x86::MAX_ROWS);
    out.par_chunks_mut(task * k).enumerate().for_each_init(
        || vec![0u8; task * pitch],
        |tile, (t, o)| {
            let fence = Fence::new();
            #[cfg(target_arch = "x86_64")]
            let fused = crate::transposed_x86::decode_lines(
                (level, mode),
                dt,
                (q, m, t * task),
                o,
                k,
                &scale_inv,
            );
            #[cfg(not(target_arch = "x86_64"))]
            let fused = 0..0;
            for span in spans_around(fused, k) {
                simd::dispatch(
                    level,
                    #[inline(always)]
                    || {
                        decode_task(
                            (level, mode, dt, &fence),
                            (q, m, t * task),
                            (k, span.clone()),
                            &scale_inv,
                            o,
                            tile,
                            (cols, pitch),
                        )
                    },
                )
            }
        },
    );
}

/// One task of [`decode_transposed`] through the tile: output columns `span` of rows
/// `i0..i0 + o.len() / k`, `cols` stored rows at a time, through a `tile` of `rows` rows
/// of `pitch` bytes.
#[inline(always)]
fn decode_task<T: Element>(
    (level, mode, dt, fence): (simd::Level, StoreMode, Fp8Dtype, &Fence),
    (q, m, i0): (&[u8], usize, usize),
    (k, span): (usize, Range<usize>),
    scale_inv: &impl Fn(usize, usize, &mut [f32]),
    o: &mut [T],
    tile: &mut [u8],
    (cols, pitch): (usize, usize),
) {
    let rows = o.len() / k;
    let run = |j: usize| &q[j * m + i0..j * m + i0 + rows];
    let mut si = [0f32; DECODE_COLS];
    // The slab's scales folded for the AVX2 register decoder's fast loops, checked once
    // for the slab's rows. (bf16 output under power-of-two scales took the 16-bit lanes
    // of `pow2::ExactExps` here until the fast loops matched them: in process, 8192^2
    // on two Zen 4 cores, 8 A/B pairs each, 1x128 x0.96-1.10, 128x128 x1.03-1.07.)
    let fold = level == simd::Level::Avx2;
    let mut sf = [0f32; DECODE_COLS];
    let mut folded = None;
    let mut wide = WIDE;
    for chunk in line_chunks(&o[span.start..], span.len(), cols) {
        let (c0, cw) = (span.start + chunk.start, chunk.len());
        for j in (0..cw).step_by(TILE) {
            let bw = TILE.min(cw - j);
            simd::transpose_bytes(&q[(c0 + j) * m + i0..], m, &mut tile[j..], pitch, bw, rows);
        }
        let next = c0 + cw;
        let ahead = cols.min(span.end - next);
        let share = ahead.div_ceil(rows);
        for r in 0..rows {
            if r % SLAB == 0 {
                scale_inv(i0 + r, c0, &mut si[..cw]);
                folded = if fold {
                    Folded::each(dt, &si[..cw], &mut sf)
                } else {
                    None
                };
            }
            for j in next + r * share..(next + (r + 1) * share).min(next + ahead) {
                simd::prefetch_l2(run(j));
            }
            let (codes, out) = (
                &tile[r * pitch..r * pitch + cw],
                &mut o[r * k + c0..r * k + c0 + cw],
            );
            let scale = (Scales::Each(&si[..cw]), folded);
            decode_run((level, mode, fence), dt, codes, scale, out, &mut wide);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;
    use quant_core::codec::{e4m3, e5m2};
    use quant_core::stream::with_store_mode;

    /// `decode(q[j][i]) * scale(i / 128, j)`, element by element, against the tiled
    /// walk: shapes whose tasks span several slabs with a short last one (4112 rows:
    /// 512-row tasks, then 16), chunks with a ragged last one (1040 columns), every
    /// code, scales that differ per slab and column, at every SIMD level and in both
    /// store modes (the AVX-512 decode streams large outputs). Power-of-two scales too
    /// (AVX2's 16-bit lanes into bf16), the last slab's first column excepted (that
    /// slab takes the f32 route), and from 2^-20 to 2^20.
    #[test]
    fn decode_transposed_equals_elementwise() {
        fn check<T: Element>(dt: Fp8Dtype, (m, k, at): (usize, usize, usize), pow2: bool) {
            let q: Vec<u8> = (0..m * k)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
                .collect();
            let last = (m - 1) / SLAB;
            let scale = |b: usize, j: usize| {
                let x = (b * 31 + j * 7) % 97;
                if pow2 && (b, j) != (last, 0) {
                    f32::from_bits(((107 + x % 41) as u32) << 23)
                } else {
                    f32::from_bits(0x3F00_0000 + ((x << 17) as u32))
                }
            };
            let decode = match dt {
                Fp8Dtype::E4M3 => e4m3::decode,
                Fp8Dtype::E5M2 => e5m2::decode,
            };
            let want: Vec<u32> = (0..m * k)
                .map(|e| {
                    let (i, j) = (e / k, e % k);
                    T::from_f32(decode(q[j * m + i]) * scale(i / SLAB, j))
                        .to_f32()
                        .to_bits()
                })
                .collect();
            let modes = [StoreMode::Cached, StoreMode::Streaming];
            simd::for_each_supported_level(|level| {
                for mode in modes {
                    with_store_mode(mode, || {
                        let mut buf = vec![T::from_f32(0.0); m * k + 64];
                        let lead = buf.as_ptr().align_offset(64) + at;
                        let out = &mut buf[lead..lead + m * k];
                        decode_transposed(
                            dt,
                            &q,
                            m,
                            k,
                            |i0, j0, s: &mut [f32]| {
                                for (j, v) in s.iter_mut().enumerate() {
                                    *v = scale(i0 / SLAB, j0 + j);
                                }
                            },
                            out,
                        );
                        for (e, (o, &w)) in out.iter().zip(&want).enumerate() {
                            let g = o.to_f32().to_bits();
                            let same = g == w
                                || (f32::from_bits(g).is_nan() && f32::from_bits(w).is_nan());
                            assert!(
                                same,
                                "{dt:?} [{m}, {k}] +{at} pow2 {pow2} at {level}, {mode:?}: element {e}: {g:#x} != {w:#x}"
                            );
                        }
                    })
                }
            });
        }
        // The register route of `transposed_x86` (streamed, at AVX-512) takes the whole
        // 64-column blocks from a line onwards of tasks of whole 64-row blocks: 1088 rows
        // are 128-row tasks (or 512) and a last one of 64; outputs on a line (`at` 0)
        // and 5 or 3 elements past one (the tile route then decodes the columns before
        // and after the blocks).
        for shape in [(4112, 1040, 0), (1, 3, 0), (129, 1025, 0), (300, 17, 0)]
            .into_iter()
            .chain([(1088, 1088, 0), (1088, 1088, 5), (320, 1152, 3)])
        {
            check::<f32>(Fp8Dtype::E4M3, shape, false);
            check::<f32>(Fp8Dtype::E5M2, shape, false);
            check::<bf16>(Fp8Dtype::E5M2, shape, false);
            check::<bf16>(Fp8Dtype::E4M3, shape, true);
            check::<bf16>(Fp8Dtype::E5M2, shape, true);
        }
        check::<half::f16>(Fp8Dtype::E4M3, (700, 130, 0), false);
        check::<half::f16>(Fp8Dtype::E4M3, (1088, 1088, 0), false);
        check::<half::f16>(Fp8Dtype::E5M2, (1088, 1088, 3), false);
    }

    #[test]
    fn transposes_ragged() {
        for (m, k) in [(1, 1), (3, 130), (129, 7), (65, 64), (300, 257)] {
            let src: Vec<u8> = (0..m * k).map(|i| (i * 7 % 251) as u8).collect();
            let mut dst = vec![0; m * k];
            transpose_bytes(&src, &mut dst, m, k);
            for i in 0..m {
                for j in 0..k {
                    assert_eq!(dst[j * m + i], src[i * k + j]);
                }
            }
            let mut back = vec![0; m * k];
            transpose_bytes(&dst, &mut back, k, m);
            assert_eq!(back, src);
        }
    }
}
