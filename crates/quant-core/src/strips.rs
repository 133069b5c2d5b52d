//! Writing disjoint column ranges of one row-major matrix from several threads.
//!
//! Kernels that work on row slabs often also write a *column* range of another matrix:
//! a transposed output (`[K, M]`, where rows `m0..m1` of the input become columns
//! `m0..m1` of every output row) or a transposed scale layout (FP8 1x128 scales are
//! `[K/128, M]`). Slices cannot express such strided, disjoint pieces, and collecting
//! them first would cost an allocation the size of the output. [`column_strips`] splits
//! the matrix into strips `[c0, c1)` of every row, each handed to one rayon task; a
//! [`Strip`] gives out one row piece at a time, so no two live `&mut` ever overlap.
//!
//! ```text
//!        c0      c1
//!   row 0 |  s1   |      strip s1 owns columns c0..c1 of every row
//!   row 1 |  s1   |
//!   ...
//! ```
//!
//! ```
//! use quant_core::strips::column_strips;
//! use rayon::prelude::*;
//! let mut m = vec![0u32; 3 * 10]; // [3, 10]
//! column_strips(&mut m, 10, 4)?.for_each(|mut s| {
//!     let c0 = s.col_range().start;
//!     for r in 0..s.rows() {
//!         for (j, v) in s.row_mut(r).iter_mut().enumerate() {
//!             *v = (r * 10 + c0 + j) as u32;
//!         }
//!     }
//! });
//! assert_eq!(m, (0..30).collect::<Vec<u32>>());
//! # Ok::<(), quant_core::Error>(())
//! ```
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::Range;

use rayon::prelude::*;

use crate::error::{Error, Result};

/// A base pointer that may cross threads: every [`Strip`] made from it writes a column
/// range no other strip touches.
struct Base<T>(*mut T);
impl<T> Clone for Base<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Base<T> {}
// SAFETY: the pointer is only dereferenced through `Strip`s, which own disjoint column
// ranges of a matrix borrowed mutably for their whole lifetime; sending a pointer to
// `T: Send` data to another thread is then as safe as sending the `&mut [T]` pieces.
unsafe impl<T: Send> Send for Base<T> {}
// SAFETY: sharing `Base` only shares the address; see `Send` above for why the strips
// built from it never alias.
unsafe impl<T: Send> Sync for Base<T> {}

/// Columns `c0..c1` of every row of a `[rows, cols]` matrix, writable by one task.
pub struct Strip<'a, T> {
    base: Base<T>,
    rows: usize,
    cols: usize,
    range: Range<usize>,
    _borrow: PhantomData<&'a mut [T]>,
}

impl<'a, T> Strip<'a, T> {
    /// Rows of the matrix.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The columns this strip owns.
    pub fn col_range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Columns `c0..c1` of row `r`. Panics if `r >= rows` (an internal indexing bug).
    #[inline]
    pub fn row_mut(&mut self, r: usize) -> &mut [T] {
        assert!(r < self.rows, "strip row {r} out of {}", self.rows);
        let start = r * self.cols + self.range.start;
        // SAFETY: `start + len <= rows * cols`, the length of the slice the strips were
        // split from (`r < rows`, `range.end <= cols`); that slice stays mutably borrowed
        // for `'a`, no other strip owns these columns, and the returned borrow of `self`
        // prevents a second live piece of this strip.
        unsafe { std::slice::from_raw_parts_mut(self.base.0.add(start), self.range.len()) }
    }
}

/// Splits the row-major matrix `buf` (`cols` wide; `buf.len()` a multiple of `cols`)
/// into strips of `width` columns (the last one narrower), as a parallel iterator.
pub fn column_strips<T: Send>(
    buf: &mut [T],
    cols: usize,
    width: usize,
) -> Result<impl IndexedParallelIterator<Item = Strip<'_, T>>> {
    if cols == 0 || width == 0 || !buf.len().is_multiple_of(cols) {
        return Err(Error::invalid(
            "column_strips",
            format!("{} elements, {cols} columns, strips of {width}", buf.len()),
            "the length must be a nonzero multiple of a nonzero column count",
        ));
    }
    let rows = buf.len() / cols;
    let base = Base(buf.as_mut_ptr());
    let n = cols.div_ceil(width);
    Ok((0..n).into_par_iter().map(move |s| Strip {
        base,
        rows,
        cols,
        range: s * width..((s + 1) * width).min(cols),
        _borrow: PhantomData,
    }))
}

/// Rows of `m` one task of a transposing kernel takes: a multiple of `slab`, at most
/// `max_slabs` of them, as many as leave about four tasks per rayon worker (so small
/// tensors still split across every thread).
///
/// A kernel that reads (or writes) the transposed `[K, M]` operand while walking row
/// slabs of the `[M, K]` one touches every stored row once per task, in a run as long
/// as the task is tall. Those rows are `M` elements apart (pages apart for a large `M`),
/// which no hardware prefetcher follows across, so each run pays a page walk and a
/// short DRAM burst: taller tasks make the runs longer and fewer. The cap keeps a
/// task's transposition tile within L2.
///
/// ```
/// use quant_core::strips::task_rows;
/// let rows = task_rows(8192, 128, 4);
/// assert!(rows % 128 == 0 && (128..=512).contains(&rows));
/// assert_eq!(task_rows(100, 128, 4), 128);
/// ```
pub fn task_rows(m: usize, slab: usize, max_slabs: usize) -> usize {
    let per_worker = m / (4 * slab * rayon::current_num_threads().max(1));
    slab * per_worker.clamp(1, max_slabs.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_cover_every_element_once() {
        for (rows, cols, w) in [(1, 1, 1), (3, 10, 4), (7, 64, 64), (5, 33, 8)] {
            let mut m = vec![0u8; rows * cols];
            column_strips(&mut m, cols, w).unwrap().for_each(|mut s| {
                for r in 0..s.rows() {
                    for v in s.row_mut(r) {
                        *v += 1;
                    }
                }
            });
            assert!(m.iter().all(|&v| v == 1));
        }
        assert!(column_strips(&mut [0u8; 7], 2, 1).is_err());
        assert!(column_strips(&mut [0u8; 4], 2, 0).is_err());
    }
}
