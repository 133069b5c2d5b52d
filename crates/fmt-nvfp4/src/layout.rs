//! Buffer layouts: scale matrix shapes, compact <-> cuBLAS-swizzled scales, transposes.
//!
//! Scale matrices are `u8` E4M3 codes, `[roundup(rows, 128), roundup(cols / 16, 4)]`
//! where `rows x cols` is the stored operand (`[M, K]` rowwise, `[K, M]` columnwise).
//! Compact: block `(i, j)` at `i * stride + j`. Swizzled: the cuBLAS 128x4 tile layout of
//! [`quant_core::layout`]; because the columnwise data is already transposed, both
//! directions use the same swizzle (TE `common/swizzle/swizzle.cu`). Padding is zero in
//! both layouts (the swizzle is a permutation of the padded matrix).

use quant_core::Element;
use quant_core::layout::{TILE_COLS, TILE_ROWS, swizzle, swizzled_index, unswizzle};
use quant_core::shape::round_up;
use quant_core::{Error, Result};
use rayon::prelude::*;

use crate::scale::BLOCK;

/// Padded scale matrix shape `[roundup(rows, 128), roundup(cols / 16, 4)]` of a stored
/// `[rows, cols]` operand (TE `NVFP4Quantizer::get_scale_shape`).
///
/// ```
/// assert_eq!(fmt_nvfp4::layout::scale_shape(144, 64), [256, 4]);
/// assert_eq!(fmt_nvfp4::layout::scale_shape(64, 144), [128, 12]);
/// ```
pub fn scale_shape(rows: usize, cols: usize) -> [usize; 2] {
    [round_up(rows, TILE_ROWS), round_up(cols / BLOCK, TILE_COLS)]
}

/// Position of block `(i, j)` in a scale buffer of padded width `stride`.
#[inline(always)]
pub fn scale_index(i: usize, j: usize, stride: usize, swizzled: bool) -> usize {
    if swizzled {
        swizzled_index(i, j, stride)
    } else {
        i * stride + j
    }
}

/// Compact -> swizzled copy of a padded scale matrix.
pub fn swizzle_scales(compact: &[u8], shape: [usize; 2]) -> Result<Vec<u8>> {
    let mut out = vec![0u8; compact.len()];
    swizzle(compact, &mut out, shape[0], shape[1])?;
    Ok(out)
}

/// Swizzled -> compact copy of a padded scale matrix (exact inverse of [`swizzle_scales`]).
pub fn unswizzle_scales(swizzled: &[u8], shape: [usize; 2]) -> Result<Vec<u8>> {
    let mut out = vec![0u8; swizzled.len()];
    unswizzle(swizzled, &mut out, shape[0], shape[1])?;
    Ok(out)
}

/// Tile edge of the cache-blocked transposes.
const TILE: usize = 64;

/// `[rows, cols]` -> `[cols, rows]`, mapping each element, parallel over tiles of
/// destination rows.
pub(crate) fn transpose_map<S, D, F>(src: &[S], rows: usize, cols: usize, f: F) -> Vec<D>
where
    S: Copy + Sync,
    D: Copy + Send + Default,
    F: Fn(S) -> D + Sync,
{
    let mut dst = vec![D::default(); rows * cols];
    if rows == 0 || cols == 0 {
        return dst;
    }
    dst.par_chunks_mut(TILE * rows)
        .enumerate()
        .for_each(|(t, out)| {
            let j0 = t * TILE;
            let jn = out.len() / rows;
            for i0 in (0..rows).step_by(TILE) {
                let i1 = (i0 + TILE).min(rows);
                for jj in 0..jn {
                    for i in i0..i1 {
                        out[jj * rows + i] = f(src[i * cols + j0 + jj]);
                    }
                }
            }
        });
    dst
}

/// Transpose of a typed `[rows, cols]` matrix.
pub(crate) fn transpose<T: Element>(src: &[T], rows: usize, cols: usize) -> Vec<T> {
    // `T: Element` has no `Default`; go through a bit-identical wrapper.
    #[derive(Clone, Copy)]
    struct W<T>(T);
    impl<T: Element> Default for W<T> {
        fn default() -> Self {
            W(T::from_f32(0.0))
        }
    }
    transpose_map(src, rows, cols, W)
        .into_iter()
        .map(|w| w.0)
        .collect()
}

/// Transpose of packed E2M1 codes: `src` holds `[rows, cols]` codes packed two per byte
/// along `cols`; the result holds `[cols, rows]` codes packed along `rows` (`rows` and
/// `cols` even). Used to derive one 2-D direction from the other.
pub fn nibble_transpose(src: &[u8], rows: usize, cols: usize) -> Result<Vec<u8>> {
    if !rows.is_multiple_of(2) || !cols.is_multiple_of(2) || src.len() != rows * cols / 2 {
        return Err(Error::invalid(
            "packed codes",
            format!("{} bytes for [{rows}, {cols}]", src.len()),
            "need even dimensions and rows * cols / 2 bytes",
        ));
    }
    let mut dst = vec![0u8; rows * cols / 2];
    if rows == 0 || cols == 0 {
        return Ok(dst);
    }
    let half_rows = rows / 2;
    dst.par_chunks_mut(half_rows)
        .enumerate()
        .for_each(|(j, out)| {
            for (p, o) in out.iter_mut().enumerate() {
                let code = |i: usize| (src[(i * cols + j) / 2] >> (4 * (j % 2))) & 0xF;
                *o = code(2 * p) | (code(2 * p + 1) << 4);
            }
        });
    Ok(dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibble_transpose_round_trips() {
        let (r, c) = (6, 10);
        let codes: Vec<u8> = (0..r * c).map(|i| (i * 7 % 16) as u8).collect();
        let packed: Vec<u8> = codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect();
        let t = nibble_transpose(&packed, r, c).unwrap();
        for i in 0..r {
            for j in 0..c {
                let got = (t[(j * r + i) / 2] >> (4 * (i % 2))) & 0xF;
                assert_eq!(got, codes[i * c + j]);
            }
        }
        assert_eq!(nibble_transpose(&t, c, r).unwrap(), packed);
        assert!(nibble_transpose(&packed, 5, 12).is_err());
    }

    #[test]
    fn transpose_ragged() {
        let (r, c) = (130, 67);
        let x: Vec<f32> = (0..r * c).map(|i| i as f32).collect();
        let t = transpose(&x, r, c);
        for i in 0..r {
            for j in 0..c {
                assert_eq!(t[j * r + i], x[i * c + j]);
            }
        }
    }
}
