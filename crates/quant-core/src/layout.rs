//! Scale-layout math shared by block-scaled formats (MXFP8, NVFP4).
//!
//! ## The cuBLAS "128x4 tile" swizzle
//!
//! Block-scaled GEMMs (cuBLASLt `VEC32_UE8M0`, `VEC16_UE4M3`) read scale factors in
//! 512-byte tiles of 128 rows x 4 columns of the (padded) scale matrix. Tiles are laid
//! out row-major over `(i/128, j/4)`; inside a tile, row `r = i % 128` is stored at
//! position `(r % 32) * 4 + r / 32` (rows 0, 32, 64, 96, 1, 33, ...), four bytes each
//! (TE `gemm_swizzled_scale_idx`; torch `S.view(R/128,4,32,C/4,4).permute(0,3,2,1,4)`).
//!
//! ```
//! use quant_core::layout::{swizzle, swizzled_index, unswizzle};
//! assert_eq!(swizzled_index(0, 0, 4), 0);
//! assert_eq!(swizzled_index(32, 0, 4), 4);   // row 32 follows row 0
//! assert_eq!(swizzled_index(1, 0, 4), 16);
//! assert_eq!(swizzled_index(0, 4, 8), 512);  // next tile along the columns
//! let s: Vec<u8> = (0..=255).chain(0..=255).collect(); // 128 x 4
//! let mut z = vec![0; 512];
//! let mut back = vec![0; 512];
//! swizzle(&s, &mut z, 128, 4).unwrap();
//! unswizzle(&z, &mut back, 128, 4).unwrap();
//! assert_eq!(back, s);
//! ```

use crate::error::{Error, Result};

/// Rows per swizzle tile.
pub const TILE_ROWS: usize = 128;
/// Columns per swizzle tile.
pub const TILE_COLS: usize = 4;

/// Position of compact element `(i, j)` in the swizzled buffer of a scale matrix whose
/// padded column count is `cols` (a multiple of 4).
#[inline(always)]
pub const fn swizzled_index(i: usize, j: usize, cols: usize) -> usize {
    let tiles_x = cols / TILE_COLS;
    ((i / TILE_ROWS) * tiles_x + j / TILE_COLS) * (TILE_ROWS * TILE_COLS)
        + (i % 32) * 16
        + ((i % TILE_ROWS) / 32) * 4
        + (j % TILE_COLS)
}

fn check(len_src: usize, len_dst: usize, rows: usize, cols: usize) -> Result<()> {
    if !rows.is_multiple_of(TILE_ROWS) || !cols.is_multiple_of(TILE_COLS) {
        return Err(Error::invalid(
            "scale matrix",
            format!("[{rows}, {cols}]"),
            "must be padded to multiples of [128, 4] before swizzling",
        ));
    }
    let n = rows * cols;
    if len_src != n || len_dst != n {
        return Err(Error::invalid(
            "scale buffers",
            format!("{len_src} and {len_dst} bytes"),
            format!("must both hold {rows} x {cols} = {n} bytes"),
        ));
    }
    Ok(())
}

/// Compact row-major `[rows, cols]` -> swizzled (both padded: rows % 128 == 0, cols % 4 == 0).
pub fn swizzle(compact: &[u8], swizzled: &mut [u8], rows: usize, cols: usize) -> Result<()> {
    check(compact.len(), swizzled.len(), rows, cols)?;
    for i in 0..rows {
        for j in 0..cols {
            swizzled[swizzled_index(i, j, cols)] = compact[i * cols + j];
        }
    }
    Ok(())
}

/// Swizzled -> compact row-major `[rows, cols]` (the exact inverse of [`swizzle`]).
pub fn unswizzle(swizzled: &[u8], compact: &mut [u8], rows: usize, cols: usize) -> Result<()> {
    check(compact.len(), swizzled.len(), rows, cols)?;
    for i in 0..rows {
        for j in 0..cols {
            compact[i * cols + j] = swizzled[swizzled_index(i, j, cols)];
        }
    }
    Ok(())
}

/// Concatenates row ranges of a row-major matrix of `row_bytes`-byte rows into `dst`
/// (which must hold exactly the selected rows). Used to move rows with their data.
pub fn gather_row_ranges(
    src: &[u8],
    row_bytes: usize,
    ranges: &[std::ops::Range<usize>],
    dst: &mut [u8],
) -> Result<()> {
    let mut at = 0;
    for r in ranges {
        let part = src
            .get(r.start * row_bytes..r.end * row_bytes)
            .ok_or_else(|| {
                Error::invalid(
                    "row range",
                    format!("{}..{}", r.start, r.end),
                    "lies outside the source",
                )
            })?;
        let out = dst.get_mut(at..at + part.len()).ok_or_else(|| {
            Error::invalid(
                "destination",
                at + part.len(),
                "is too small for the selected rows",
            )
        })?;
        out.copy_from_slice(part);
        at += part.len();
    }
    Ok(())
}

/// For each of `rows` rows of a row-major matrix with `src_cols` columns of `elem`-byte
/// elements, concatenates the column ranges into the row of a matrix with `dst_cols`
/// columns (columns past the selection stay as they are: zero padding). Used to move
/// rows of a tensor whose buffer stores them transposed (columnwise data, transposed
/// scale matrices).
pub fn gather_col_ranges(
    src: &[u8],
    rows: usize,
    src_cols: usize,
    dst: &mut [u8],
    dst_cols: usize,
    ranges: &[std::ops::Range<usize>],
    elem: usize,
) -> Result<()> {
    let selected: usize = ranges.iter().map(|r| r.end - r.start).sum();
    if selected > dst_cols
        || src.len() < rows * src_cols * elem
        || dst.len() < rows * dst_cols * elem
        || ranges.iter().any(|r| r.start > r.end || r.end > src_cols)
    {
        return Err(Error::invalid(
            "column gather",
            format!("{selected} of {src_cols} columns into {dst_cols}"),
            "ranges must lie inside the source and fit the destination",
        ));
    }
    for row in 0..rows {
        let s = &src[row * src_cols * elem..(row + 1) * src_cols * elem];
        let d = &mut dst[row * dst_cols * elem..(row + 1) * dst_cols * elem];
        let mut at = 0;
        for r in ranges {
            let n = (r.end - r.start) * elem;
            d[at..at + n].copy_from_slice(&s[r.start * elem..r.end * elem]);
            at += n;
        }
    }
    Ok(())
}

/// Maps row ranges to the ranges of the `block`-row blocks that cover them (boundaries
/// are multiples of `block`, or the end of the tensor).
pub fn block_ranges(
    ranges: &[std::ops::Range<usize>],
    block: usize,
) -> Vec<std::ops::Range<usize>> {
    ranges
        .iter()
        .map(|r| r.start / block..r.end.div_ceil(block))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swizzle_is_a_permutation_matching_the_torch_view() {
        let (rows, cols) = (256, 8);
        // torch: S.view(R/128, 4, 32, C/4, 4).permute(0, 3, 2, 1, 4).flatten()
        let mut expect = Vec::with_capacity(rows * cols);
        for a in 0..rows / 128 {
            for d in 0..cols / 4 {
                for c in 0..32 {
                    for b in 0..4 {
                        for e in 0..4 {
                            let i = a * 128 + b * 32 + c;
                            let j = d * 4 + e;
                            expect.push((i * cols + j) as u32);
                        }
                    }
                }
            }
        }
        for (pos, &flat) in expect.iter().enumerate() {
            let (i, j) = (flat as usize / cols, flat as usize % cols);
            assert_eq!(swizzled_index(i, j, cols), pos);
        }
        assert!(swizzle(&[0; 10], &mut [0; 10], 5, 2).is_err());
    }

    #[test]
    fn gathers() {
        let src: Vec<u8> = (0..12).collect(); // 3 rows x 4 cols
        let mut d = vec![0; 8];
        gather_row_ranges(&src, 4, &[2..3, 0..1], &mut d).unwrap();
        assert_eq!(d, [8, 9, 10, 11, 0, 1, 2, 3]);
        let mut d = vec![0; 9];
        gather_col_ranges(&src, 3, 4, &mut d, 3, &[3..4, 0..1], 1).unwrap();
        assert_eq!(d, [3, 0, 0, 7, 4, 0, 11, 8, 0]);
        let all = vec![0..2, 2..4];
        assert!(gather_col_ranges(&src, 3, 4, &mut d, 3, &all, 1).is_err()); // 4 columns into 3
        assert_eq!(block_ranges(&[0..256, 384..400], 128), vec![0..2, 3..4]);
    }
}
