//! Where every byte of an MXFP8 tensor lives: data, compact scales, swizzled scales.
//!
//! `M` is the product of the leading dimensions, `K` the last one; both are multiples
//! of 32. Both data buffers have the input's shape (the columnwise one is **not**
//! transposed: it holds the same positions, scaled by different blocks).
//!
//! ```text
//!  rowwise_data [M, K] u8: 1x32 blocks along K     columnwise_data [M, K] u8: 32x1 blocks along M
//!
//!        k: 0 ....... 31 32 ...... 63 ..                 k: 0   1   2  ...
//!  m=0    [ block (0,0)  | block (0,1) | ..          m=0    [ .   .   .       ]  \
//!  m=1    [ block (1,0)  | block (1,1) | ..          ...    [ (0,0)(0,1)(0,2)  ]   } block row mb=0
//!  ...                                               m=31   [ .   .   .       ]  /
//!                                                    m=32   [ (1,0)(1,1) ...   ]  } mb=1
//!  q(m,k) = fp8(x(m,k) * 2^(127 - S_row(m, k/32)))   q(m,k) = fp8(x(m,k) * 2^(127 - S_col(m/32, k)))
//! ```
//!
//! ## Compact scales (TE's "non-swizzled" layout, `MXFP8Quantizer::get_scale_shape`)
//!
//! ```text
//!  rowwise_scale_inv [roundup(M,128), roundup(K/32,4)]   columnwise_scale_inv [roundup(M/32,4), roundup(K,128)]
//!   (m, kb) at m * stride + kb                            (mb, k) at mb * stride + k
//!
//!        kb: 0   1  .. K/32-1 | pad to 4                     k: 0  1  ..  K-1 | pad to 128
//!  m=0     [ S   S  ..  S     | 0 .. ]                 mb=0    [ S  S  ..  S   | 0 ..     ]
//!  ...                                                 ...
//!  m=M-1   [ S   S  ..  S     | 0 .. ]                 mb=M/32-1
//!  pad to 128 rows: all 0                              pad to 4 rows: all 0
//! ```
//!
//! Padding is written as zero here; TE leaves compact padding uninitialised, so it is
//! never read (see [`crate::Mxfp8Quantizer`]'s buffer validation).
//!
//! ## Swizzled scales (cuBLAS "128x4 tile" layout, `with_gemm_swizzled_scales`)
//!
//! The same bytes, permuted for the block-scaled GEMM ([`quant_core::layout`]): the
//! matrix is cut into 512-byte tiles of 128 rows x 4 columns, stored row-major over
//! tiles; inside a tile, row `r` (0..128) and column `c` (0..4) land at byte
//! `(r % 32) * 16 + (r / 32) * 4 + c`:
//!
//! ```text
//!  tile byte:  0  1  2  3 |  4  5  6  7 |  8  9 10 11 | 12 13 14 15 | 16 ...          ... 511
//!  holds     row 0, c0..3 |   row 32    |   row 64    |   row 96    | row 1, 33, 65, 97, 2, ... row 127
//! ```
//!
//! * Rowwise: the tiles cover `S_row` itself: element `(m, kb)` is at
//!   `swizzled_index(m, kb, roundup(K/32,4))`; `ceil(K/128)` tiles per 128 rows.
//! * Columnwise: the tiles cover the **transpose** `S_col^T` (`[roundup(K,128),
//!   roundup(M/32,4)]`): element `(mb, k)` is at `swizzled_index(k, mb, roundup(M/32,4))`;
//!   `ceil(M/128)` tiles per 128 columns of data. (TE: `gemm_swizzled_scale_idx(k, mb,
//!   DIVUP(rows, 128))`; oracle `view(M/128,4,K/128,4,32).permute(2,0,4,3,1)`.)
//!
//! The buffers keep their compact shapes (TE does the same); only the byte order changes.
//! Conversion both ways is exact, padding included ([`swizzle_scales`], [`unswizzle_scales`],
//! [`convert_scales`]).
//!
//! ```
//! use fmt_mxfp8::layout::{columnwise_scale_index, rowwise_scale_index, ScaleLayout};
//! let (m, k) = (160, 96);
//! assert_eq!(rowwise_scale_index(ScaleLayout::Compact, m, k, 1, 2), 4 + 2);
//! assert_eq!(rowwise_scale_index(ScaleLayout::Swizzled, m, k, 1, 2), 16 + 2);
//! assert_eq!(rowwise_scale_index(ScaleLayout::Swizzled, m, k, 32, 0), 4);
//! assert_eq!(columnwise_scale_index(ScaleLayout::Compact, m, k, 1, 5), 128 + 5);
//! // (mb=1, k=5) is element (5, 1) of the transpose: tile 0, row 5, column 1.
//! assert_eq!(columnwise_scale_index(ScaleLayout::Swizzled, m, k, 1, 5), 5 * 16 + 1);
//! ```

use quant_core::layout::swizzled_index;
use quant_core::shape::round_up;
use quant_core::{Direction, Error, Result};
use serde::{Deserialize, Serialize};

use crate::scale::BLOCK;

/// Byte order of the scale buffers. Recorded in the quantizer options, so it travels
/// with the file metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleLayout {
    /// Row-major over the padded scale matrix (TE's default, `optimize_for_gemm=False`).
    #[default]
    Compact,
    /// cuBLAS 128x4-tile order (TE `with_gemm_swizzled_scales=True`); columnwise scales
    /// are swizzled as their transpose.
    Swizzled,
}

/// The padded shape of `rowwise_scale_inv`: `[roundup(M,128), roundup(K/32,4)]`.
pub const fn rowwise_scale_shape(m: usize, k: usize) -> [usize; 2] {
    [round_up(m, 128), round_up(k / BLOCK, 4)]
}

/// The padded shape of `columnwise_scale_inv`: `[roundup(M/32,4), roundup(K,128)]`.
pub const fn columnwise_scale_shape(m: usize, k: usize) -> [usize; 2] {
    [round_up(m / BLOCK, 4), round_up(k, 128)]
}

/// The padded scale shape of direction `dir`.
pub const fn scale_shape(dir: Direction, m: usize, k: usize) -> [usize; 2] {
    match dir {
        Direction::Rowwise => rowwise_scale_shape(m, k),
        Direction::Columnwise => columnwise_scale_shape(m, k),
    }
}

/// Byte position of the rowwise scale of row `row`, block `kb` (elements
/// `32*kb .. 32*kb+32` of that row) for an `[m, k]` tensor.
#[inline]
pub const fn rowwise_scale_index(
    layout: ScaleLayout,
    m: usize,
    k: usize,
    row: usize,
    kb: usize,
) -> usize {
    let [_, stride] = rowwise_scale_shape(m, k);
    rowwise_scale_at(layout, row, kb, stride)
}

/// [`rowwise_scale_index`] from the scale buffer's row stride (`roundup(K/32, 4)`). The
/// quantize kernels use it with rows local to their 128-row slab, whose scales are a
/// whole number of 128-row swizzle tiles, so local and global positions agree.
#[inline]
pub(crate) const fn rowwise_scale_at(
    layout: ScaleLayout,
    row: usize,
    kb: usize,
    stride: usize,
) -> usize {
    match layout {
        ScaleLayout::Compact => row * stride + kb,
        ScaleLayout::Swizzled => swizzled_index(row, kb, stride),
    }
}

/// Byte position of the columnwise scale of block row `mb` (rows `32*mb .. 32*mb+32`),
/// column `col` for an `[m, k]` tensor.
#[inline]
pub const fn columnwise_scale_index(
    layout: ScaleLayout,
    m: usize,
    k: usize,
    mb: usize,
    col: usize,
) -> usize {
    let [rows, stride] = columnwise_scale_shape(m, k);
    match layout {
        ScaleLayout::Compact => mb * stride + col,
        // Swizzle of the transpose: row `col`, column `mb` of a [stride, rows] matrix.
        ScaleLayout::Swizzled => swizzled_index(col, mb, rows),
    }
}

/// Checks that `[m, k]` is an MXFP8 matrix (both multiples of 32).
pub fn check_dims(m: usize, k: usize) -> Result<()> {
    if !k.is_multiple_of(BLOCK) {
        return Err(Error::shape("mxfp8", "K", k, "must be a multiple of 32"));
    }
    if !m.is_multiple_of(BLOCK) {
        return Err(Error::shape("mxfp8", "M", m, "must be a multiple of 32"));
    }
    Ok(())
}

fn check_lens(dir: Direction, src: usize, dst: usize, m: usize, k: usize) -> Result<[usize; 2]> {
    check_dims(m, k)?;
    let shape = scale_shape(dir, m, k);
    let n = shape[0] * shape[1];
    if src != n || dst != n {
        return Err(Error::invalid(
            "scale buffers",
            format!("{src} and {dst} bytes"),
            format!(
                "must both hold the {dir} scales of a [{m}, {k}] tensor: {} x {} = {n} bytes",
                shape[0], shape[1]
            ),
        ));
    }
    Ok(shape)
}

/// Compact -> swizzled scales of direction `dir` for an `[m, k]` tensor (whole padded
/// buffers, padding included; exact inverse of [`unswizzle_scales`]).
///
/// ```
/// use fmt_mxfp8::layout::{swizzle_scales, unswizzle_scales, columnwise_scale_shape};
/// use quant_core::Direction;
/// let (m, k) = (64, 256);
/// let [r, c] = columnwise_scale_shape(m, k);            // [4, 256]
/// let compact: Vec<u8> = (0..r * c).map(|i| (i % 251) as u8).collect();
/// let mut sw = vec![0; r * c];
/// swizzle_scales(Direction::Columnwise, &compact, &mut sw, m, k)?;
/// assert_eq!(sw[1], compact[256]);     // (mb=1, k=0) sits next to (mb=0, k=0)
/// let mut back = vec![0; r * c];
/// unswizzle_scales(Direction::Columnwise, &sw, &mut back, m, k)?;
/// assert_eq!(back, compact);
/// # Ok::<(), quant_core::Error>(())
/// ```
pub fn swizzle_scales(
    dir: Direction,
    compact: &[u8],
    swizzled: &mut [u8],
    m: usize,
    k: usize,
) -> Result<()> {
    let [rows, cols] = check_lens(dir, compact.len(), swizzled.len(), m, k)?;
    for (i, row) in compact.chunks_exact(cols).enumerate() {
        for (j, &b) in row.iter().enumerate() {
            swizzled[index_of(dir, rows, cols, i, j)] = b;
        }
    }
    Ok(())
}

/// Swizzled -> compact scales of direction `dir` for an `[m, k]` tensor (exact inverse
/// of [`swizzle_scales`]).
pub fn unswizzle_scales(
    dir: Direction,
    swizzled: &[u8],
    compact: &mut [u8],
    m: usize,
    k: usize,
) -> Result<()> {
    let [rows, cols] = check_lens(dir, swizzled.len(), compact.len(), m, k)?;
    for (i, row) in compact.chunks_exact_mut(cols).enumerate() {
        for (j, b) in row.iter_mut().enumerate() {
            *b = swizzled[index_of(dir, rows, cols, i, j)];
        }
    }
    Ok(())
}

/// Converts the scale bytes of direction `dir` from layout `from` to layout `to`
/// (a copy when they are equal).
///
/// ```
/// use fmt_mxfp8::layout::{convert_scales, rowwise_scale_shape, ScaleLayout};
/// use quant_core::Direction;
/// let [r, c] = rowwise_scale_shape(32, 32); // [128, 4]: one tile
/// let compact: Vec<u8> = (0..r * c).map(|i| i as u8).collect();
/// let mut sw = vec![0; r * c];
/// convert_scales(Direction::Rowwise, ScaleLayout::Compact, ScaleLayout::Swizzled, &compact, &mut sw, 32, 32)?;
/// assert_eq!(&sw[..8], &[0, 1, 2, 3, 128, 129, 130, 131]); // row 0, then row 32
/// # Ok::<(), quant_core::Error>(())
/// ```
pub fn convert_scales(
    dir: Direction,
    from: ScaleLayout,
    to: ScaleLayout,
    src: &[u8],
    dst: &mut [u8],
    m: usize,
    k: usize,
) -> Result<()> {
    match (from, to) {
        (ScaleLayout::Compact, ScaleLayout::Swizzled) => swizzle_scales(dir, src, dst, m, k),
        (ScaleLayout::Swizzled, ScaleLayout::Compact) => unswizzle_scales(dir, src, dst, m, k),
        _ => {
            check_lens(dir, src.len(), dst.len(), m, k)?;
            dst.copy_from_slice(src);
            Ok(())
        }
    }
}

/// Swizzled position of compact element `(i, j)` of a padded `[rows, cols]` scale matrix.
#[inline]
fn index_of(dir: Direction, rows: usize, cols: usize, i: usize, j: usize) -> usize {
    match dir {
        Direction::Rowwise => swizzled_index(i, j, cols),
        Direction::Columnwise => swizzled_index(j, i, rows),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TE's oracle (`mxfp8_utils.py`): rowwise `view(M/128,4,32,C/4,4).permute(0,3,2,1,4)`,
    /// columnwise `view(R/4,4,K/128,4,32).permute(2,0,4,3,1)` over the padded matrices.
    #[test]
    fn matches_te_torch_views() {
        for (m, k) in [(32, 32), (160, 96), (288, 288), (128, 640)] {
            let [r, c] = rowwise_scale_shape(m, k);
            let mut pos = 0;
            for a in 0..r / 128 {
                for d in 0..c / 4 {
                    for cc in 0..32 {
                        for b in 0..4 {
                            for e in 0..4 {
                                let (i, j) = (a * 128 + b * 32 + cc, d * 4 + e);
                                assert_eq!(swizzled_index(i, j, c), pos);
                                pos += 1;
                            }
                        }
                    }
                }
            }
            let [r, c] = columnwise_scale_shape(m, k);
            // S.view(r/4, 4, c/128, 4, 32).permute(2, 0, 4, 3, 1): output order (d2, d0, d4, d3, d1)
            let mut pos = 0;
            for d2 in 0..c / 128 {
                for d0 in 0..r / 4 {
                    for d4 in 0..32 {
                        for d3 in 0..4 {
                            for d1 in 0..4 {
                                let mb = d0 * 4 + d1;
                                let col = d2 * 128 + d3 * 32 + d4;
                                assert_eq!(
                                    columnwise_scale_index(ScaleLayout::Swizzled, m, k, mb, col),
                                    pos
                                );
                                pos += 1;
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn round_trips_and_checks_lengths() {
        for (m, k) in [(32, 32), (96, 160), (288, 64)] {
            for dir in [Direction::Rowwise, Direction::Columnwise] {
                let [r, c] = scale_shape(dir, m, k);
                let src: Vec<u8> = (0..r * c).map(|i| (i * 7 % 253) as u8).collect();
                let mut sw = vec![0; r * c];
                let mut back = vec![0; r * c];
                swizzle_scales(dir, &src, &mut sw, m, k).unwrap();
                unswizzle_scales(dir, &sw, &mut back, m, k).unwrap();
                assert_eq!(back, src);
                let mut sorted = sw.clone();
                sorted.sort_unstable();
                let mut want = src.clone();
                want.sort_unstable();
                assert_eq!(sorted, want);
            }
        }
        let e = swizzle_scales(Direction::Rowwise, &[0; 10], &mut [0; 10], 32, 32).unwrap_err();
        assert!(e.to_string().contains("128 x 4 = 512 bytes"), "{e}");
        let e = swizzle_scales(Direction::Rowwise, &[], &mut [], 32, 100).unwrap_err();
        assert_eq!(e.to_string(), "mxfp8: K=100 must be a multiple of 32");
    }
}
