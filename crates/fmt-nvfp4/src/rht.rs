//! The random Hadamard transform (RHT) TE applies to the columnwise (wgrad) operand.
//!
//! `R = diag(s) · H16 · 0.25`, with `H16[i][j] = (-1)^popcount(i & j)` (Sylvester) and the
//! fixed sign vector `s` whose bit `i` is set in [`SIGN_MASK`] (`0xD7E8`) when
//! `s_i = -1` (`pytorch/tensor/nvfp4_tensor.py::get_wgrad_sign_vector`). Every entry of
//! `R` is exactly ±0.25 and `R · R^T = I` (`H16 · H16^T = 16 I`), so `R^T` inverts it.
//!
//! The transform is applied to `x^T` (shape `[K, M]`) in chunks of 16 consecutive
//! elements of a row of `x^T`, i.e. 16 consecutive rows `16b .. 16b+15` of one column of
//! `x`: `y_j = Σ_i v_i · R[i][j]`. TE computes this with a bf16 tensor-core MMA
//! accumulating in fp32 and rounds `y` to bf16 (`cvt.rn.bf16x2.f32`); NVFP4 1x16
//! quantization then runs on that bf16 `y` with the RHT chunks equal to the quantization
//! blocks. Here the 16 exact products (bf16 × ±0.25 is exact in fp32) are summed in fp32
//! in index order starting from `+0.0`, then rounded to bf16 (round-to-nearest-even).
//! This equals any other fp32 summation whenever the 16 values of a chunk span less than
//! 2^16 in magnitude (the exact sum then fits in 24 bits); beyond that, tensor-core
//! accumulation order and truncation are not documented by NVIDIA.
//!
//! ```
//! use fmt_nvfp4::rht::{forward_16, inverse_16, matrix, SIGN_MASK};
//! use half::bf16;
//! assert_eq!(SIGN_MASK, 0xD7E8);
//! let r = matrix();
//! assert_eq!(r[0][0], 0.25);
//! assert_eq!(r[3][0], -0.25); // s_3 = -1
//! // A unit vector maps to a row of R, and R^T brings it back.
//! let mut v = [bf16::ZERO; 16];
//! v[5] = bf16::ONE;
//! let y = forward_16(&v);
//! assert_eq!(y[0].to_f32(), r[5][0]);
//! let back = inverse_16(&y.map(|b| b.to_f32()));
//! assert_eq!(back[5], 1.0);
//! assert_eq!(back[4], 0.0);
//! ```

use half::bf16;
use quant_core::Element;
use rayon::prelude::*;

/// TE's `rht_matrix_random_sign_mask_t`: bit `i` set when sign `s_i` is -1.
pub const SIGN_MASK: u16 = 0xD7E8;

/// Hadamard dimension (equal to the NVFP4 block length).
pub const DIM: usize = 16;

/// `R[i][j] = s_i · (-1)^popcount(i & j) · 0.25`, all entries exactly ±0.25.
pub const fn matrix() -> [[f32; DIM]; DIM] {
    let mut r = [[0.0f32; DIM]; DIM];
    let mut i = 0;
    while i < DIM {
        let mut j = 0;
        while j < DIM {
            let neg = ((i & j).count_ones() + ((SIGN_MASK >> i) & 1) as u32) % 2 == 1;
            r[i][j] = if neg { -0.25 } else { 0.25 };
            j += 1;
        }
        i += 1;
    }
    r
}

/// The matrix, built once at compile time.
pub static R: [[f32; DIM]; DIM] = matrix();

/// Forward transform of one chunk: `y = bf16(v · R)` with fp32 accumulation in index
/// order from `+0.0`.
#[inline]
pub fn forward_16(v: &[bf16; DIM]) -> [bf16; DIM] {
    let mut acc = [0.0f32; DIM];
    for (vi, ri) in v.iter().zip(R.iter()) {
        let vi = vi.to_f32();
        for (a, &rij) in acc.iter_mut().zip(ri) {
            *a += vi * rij;
        }
    }
    acc.map(bf16::from_f32)
}

/// Inverse transform of one chunk: `v = y · R^T`, summed in f64 in index order (one
/// rounding happens when the caller narrows the result).
#[inline]
pub fn inverse_16(y: &[f32; DIM]) -> [f64; DIM] {
    let mut out = [0.0f64; DIM];
    for (o, ri) in out.iter_mut().zip(R.iter()) {
        let mut acc = 0.0f64;
        for (&yj, &rij) in y.iter().zip(ri) {
            acc += f64::from(yj) * f64::from(rij);
        }
        *o = acc;
    }
    out
}

/// Columns of `x` handled by one task of [`transposed_rht`].
const COLS_PER_TASK: usize = 32;

/// `bf16(RHT(x^T))` as a `[k, m]` matrix: row `c` holds column `c` of `x` (`[m, k]`,
/// `m % 16 == 0`) transformed in chunks of 16 consecutive rows. This is the operand TE's
/// unfused path writes to a temporary buffer before quantizing it rowwise. `x` must
/// already be bf16 (other inputs are narrowed here, which TE never does).
pub(crate) fn transposed_rht<T: Element>(x: &[T], m: usize, k: usize) -> Vec<bf16> {
    let mut out = vec![bf16::ZERO; m * k];
    if m == 0 || k == 0 {
        return out;
    }
    out.par_chunks_mut(COLS_PER_TASK * m)
        .enumerate()
        .for_each(|(t, dst)| {
            let c0 = t * COLS_PER_TASK;
            for b in 0..m / DIM {
                for (cc, row) in dst.chunks_exact_mut(m).enumerate() {
                    let v: [bf16; DIM] = std::array::from_fn(|i| {
                        bf16::from_f32(x[(b * DIM + i) * k + c0 + cc].to_f32())
                    });
                    row[b * DIM..(b + 1) * DIM].copy_from_slice(&forward_16(&v));
                }
            }
        });
    out
}

/// What the tests of the vector Hadamard sums share: an input and the index-order
/// specification to check the sums against.
#[cfg(test)]
pub(crate) mod sums_check {
    use super::{DIM, R};
    use quantfmt_testkit::XorShift32;

    /// 16 rows of `stride` values of wide magnitudes (so the order of the sums shows),
    /// with a `-0.0`, an infinity, a subnormal and a NaN among them.
    pub(crate) fn rows(stride: usize) -> Vec<f32> {
        let mut rng = XorShift32::new(0x9E37_79B9);
        let mut x: Vec<f32> = (0..DIM * stride)
            .map(|_| {
                let s = rng.next_u32();
                f32::from_bits(0x3000_0000 + (s >> 4) % 0x1C00_0000)
                    * if s & 1 == 1 { -1.0 } else { 1.0 }
            })
            .collect();
        x[3] = -0.0;
        x[stride + 5] = f32::INFINITY;
        x[2 * stride + 6] = f32::from_bits(1);
        x[4 * stride + 9] = f32::NAN;
        x
    }

    /// `out[j][c]` is `sum_i x[i * stride + c] * R[i][j]` summed in index order from
    /// `+0.0`, for every `c < cols`: bit for bit, except that a NaN sum is only required
    /// to be NaN (Rust leaves a NaN result's sign unspecified; E2M1 encodes every NaN
    /// alike and the amaxes ignore NaN).
    pub(crate) fn assert_index_order<const N: usize>(
        x: &[f32],
        stride: usize,
        cols: usize,
        out: &[[f32; N]; DIM],
    ) {
        for c in 0..cols {
            for j in 0..DIM {
                let mut want = 0f32;
                for i in 0..DIM {
                    want += x[i * stride + c] * R[i][j];
                }
                if want.is_nan() {
                    assert!(out[j][c].is_nan(), "c {c} j {j}");
                } else {
                    assert_eq!(out[j][c].to_bits(), want.to_bits(), "c {c} j {j}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_te_sign_vector_and_is_orthogonal() {
        let s = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1];
        let mask = s
            .iter()
            .enumerate()
            .fold(0u16, |m, (i, &v)| m | (u16::from(v == -1) << i));
        assert_eq!(mask, SIGN_MASK);
        for (i, ri) in R.iter().enumerate() {
            for (j, (rij, rj)) in ri.iter().zip(R.iter()).enumerate() {
                let h = if (i & j).count_ones() % 2 == 1 {
                    -1.0
                } else {
                    1.0
                };
                assert_eq!(*rij, s[i] as f32 * h * 0.25);
                let dot: f32 = ri.iter().zip(rj).map(|(a, b)| a * b).sum();
                assert_eq!(dot, if i == j { 1.0 } else { 0.0 });
            }
        }
    }

    #[test]
    fn round_trip_is_exact_for_small_integers() {
        let v: [bf16; DIM] = std::array::from_fn(|i| bf16::from_f32(i as f32 - 7.0));
        let y = forward_16(&v);
        let back = inverse_16(&y.map(|b| b.to_f32()));
        for i in 0..DIM {
            assert_eq!(back[i], f64::from(v[i].to_f32()), "{i}");
        }
    }
}
