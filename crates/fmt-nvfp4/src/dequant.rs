//! Dequantization: TE's `dequantize_fp4_kernel` for both directions, plus the inverse
//! Hadamard transform for RHT columnwise operands (which TE does not offer).
//!
//! ```text
//! final = (float(sdb) * amax) * f32(1 / (6 * E4M3_MAX))      // amax[row] when row-scaled
//! x     = OType(e2m1_value * final)                            // one rounding to the output type
//! ```
//!
//! Columnwise, the same formula gives `x^T` (its `amax_columnwise`, or `amax_columnwise[k]`
//! for row-scaled), written back in the logical `[M, K]` layout. With RHT the 16
//! dequantized values `y` of a block are rotated back, `v = y · R^T` (`R` is orthogonal),
//! summed in f64 in index order and rounded once to the output type. The result is the
//! best estimate of `x` the stored bytes allow, but not element-local: a block's
//! quantization error (and the bf16 rounding of the forward transform) is spread over
//! its 16 elements, so an exact input value (e.g. a zero) generally comes back nonzero.

use quant_core::Element;
use quant_core::codec::e2m1;
use rayon::prelude::*;

use crate::layout::{scale_index, scale_shape};
use crate::rht;
use crate::scale::{self, BLOCK};

/// The stored bytes of one direction.
pub(crate) struct Operand<'a> {
    pub data: &'a [u8],
    pub scales: &'a [u8],
    pub amax: &'a [f32],
    pub swizzled: bool,
    pub e4m3_max: u16,
}

impl Operand<'_> {
    /// Dequantize factor of block `(row, block)` of a stored operand with `stride`-wide
    /// scales.
    #[inline]
    fn factor(&self, row: usize, block: usize, stride: usize) -> f32 {
        let sdb = self.scales[scale_index(row, block, stride, self.swizzled)];
        let amax = if self.amax.len() == 1 {
            self.amax[0]
        } else {
            self.amax[row]
        };
        scale::dequant_factor(sdb, amax, self.e4m3_max)
    }
}

/// Rowwise: `[m, k]` codes and scales to `out` (`[m, k]`).
pub(crate) fn rowwise<T: Element>(op: &Operand<'_>, m: usize, k: usize, out: &mut [T]) {
    let stride = scale_shape(m, k)[1];
    if k == 0 {
        return;
    }
    out.par_chunks_mut(k)
        .zip(op.data.par_chunks(k / 2))
        .enumerate()
        .for_each(|(row, (o, d))| {
            for (b, (ob, db)) in o
                .chunks_exact_mut(BLOCK)
                .zip(d.chunks_exact(BLOCK / 2))
                .enumerate()
            {
                let f = op.factor(row, b, stride);
                for (pair, &byte) in ob.chunks_exact_mut(2).zip(db) {
                    let (lo, hi) = e2m1::unpack(byte);
                    pair[0] = T::from_f32(e2m1::decode(lo) * f);
                    pair[1] = T::from_f32(e2m1::decode(hi) * f);
                }
            }
        });
}

/// Columnwise: `[k, m]` codes and scales (of `x^T`) to `out` in the logical `[m, k]`
/// layout, undoing the Hadamard transform when `rht`.
pub(crate) fn columnwise<T: Element>(
    op: &Operand<'_>,
    m: usize,
    k: usize,
    rht_on: bool,
    out: &mut [T],
) {
    let stride = scale_shape(k, m)[1];
    if k == 0 || m == 0 {
        return;
    }
    // One task per 16 rows of the output (= one block column of the stored x^T).
    out.par_chunks_mut(BLOCK * k)
        .enumerate()
        .for_each(|(b, o)| {
            for c in 0..k {
                let f = op.factor(c, b, stride);
                let bytes = &op.data[c * m / 2 + b * BLOCK / 2..c * m / 2 + (b + 1) * BLOCK / 2];
                let mut y = [0.0f32; BLOCK];
                for (pair, &byte) in y.chunks_exact_mut(2).zip(bytes) {
                    let (lo, hi) = e2m1::unpack(byte);
                    pair[0] = e2m1::decode(lo) * f;
                    pair[1] = e2m1::decode(hi) * f;
                }
                if rht_on {
                    for (i, v) in rht::inverse_16(&y).into_iter().enumerate() {
                        o[i * k + c] = T::from_f64(v);
                    }
                } else {
                    for (i, v) in y.into_iter().enumerate() {
                        o[i * k + c] = T::from_f32(v);
                    }
                }
            }
        });
}
