//! Transposed FP8 data: cache-sized tiles, SIMD byte transposes.
//!
//! The columnwise operand is stored transposed (`[K, M]`). Quantizing writes it from row
//! slabs of the input: a task owns input rows `i0..i0+SLAB`, which are columns
//! `i0..i0+SLAB` of every output row (a [`Strip`]); each `SLAB x TILE` tile of codes is
//! transposed in L1 ([`quant_core::simd::transpose_bytes`], SSE2 16x16 blocks) and its
//! rows copied out. Dequantizing walks the other way: a task owns output rows
//! `i0..i0+SLAB` and reads the matching column range of the stored rows.

use quant_core::simd;
use quant_core::strips::Strip;
use rayon::prelude::*;

/// Input rows per task (and output columns per strip).
pub(crate) const SLAB: usize = 128;
/// Input columns per tile.
pub(crate) const TILE: usize = 128;

/// Writes the `rows x cols` codes tile `codes` (row stride `stride`), transposed, into
/// rows `j0..j0+cols` of `strip` (whose width is `rows`). `scratch` holds `rows * cols`.
#[inline]
pub(crate) fn store_transposed(
    codes: &[u8],
    stride: usize,
    rows: usize,
    cols: usize,
    strip: &mut Strip<'_, u8>,
    j0: usize,
    scratch: &mut [u8],
) {
    simd::transpose_bytes(codes, stride, scratch, rows, rows, cols);
    for (jj, src) in scratch.chunks_exact(rows).take(cols).enumerate() {
        strip.row_mut(j0 + jj).copy_from_slice(src);
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

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
