//! Cache-blocked transposes, fused with an element map (encode or decode on the fly).

use rayon::prelude::*;

/// Tile edge: a 64x64 tile stays in L1 while it is read row-wise and written column-wise.
const TILE: usize = 64;

/// Makes `dst` the `[cols, rows]` transpose of `src` (`[rows, cols]`), mapping each
/// element with its source position: `dst[j*rows + i] = f(i, j, src[i*cols + j])`.
/// Parallel over tiles of `dst` rows.
pub fn transpose_map<S, D, F>(src: &[S], dst: &mut [D], rows: usize, cols: usize, f: F)
where
    S: Copy + Sync,
    D: Send,
    F: Fn(usize, usize, S) -> D + Sync,
{
    debug_assert_eq!(src.len(), rows * cols);
    debug_assert_eq!(dst.len(), rows * cols);
    if rows == 0 || cols == 0 {
        return;
    }
    dst.par_chunks_mut(TILE * rows)
        .enumerate()
        .for_each(|(tile, dst_rows)| {
            let j0 = tile * TILE;
            let jn = dst_rows.len() / rows;
            for i0 in (0..rows).step_by(TILE) {
                let i1 = (i0 + TILE).min(rows);
                for jj in 0..jn {
                    let out = &mut dst_rows[jj * rows + i0..jj * rows + i1];
                    for (o, i) in out.iter_mut().zip(i0..i1) {
                        *o = f(i, j0 + jj, src[i * cols + j0 + jj]);
                    }
                }
            }
        });
}

/// Byte transpose of `[rows, cols]` into `[cols, rows]`.
pub fn transpose_bytes(src: &[u8], dst: &mut [u8], rows: usize, cols: usize) {
    transpose_map(src, dst, rows, cols, |_, _, b| b);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposes_ragged() {
        for (m, k) in [(1, 1), (3, 130), (129, 7), (65, 64)] {
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
