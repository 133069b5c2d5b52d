//! The Hadamard sums of the RHT with AVX2: 8 columns per step, half of the 16 sums in
//! registers at a time.
//!
//! The arithmetic of [`crate::rht_x86`]'s AVX-512 sums, which argues it: `y[j] = sum_i
//! x[i] * R[i][j]` in index order from `+0.0`, each step one add or one subtract of `q =
//! x * 0.25` (exact), its sign fixed at compile time. AVX2 has 16 vector registers, too
//! few for 16 rows and 16 sums, so a step makes two passes over its rows (read again
//! from L1): sums 0..8, then sums 8..16, each pass 8 sums, one `q` and the constant. The
//! portable loop it replaces kept the sums in memory (about 10 cycles per value), the
//! largest part of the RHT quantize at AVX2.

use std::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_set1_ps, _mm256_setzero_ps,
    _mm256_storeu_ps, _mm256_sub_ps,
};

use quant_core::simd::Level;

use crate::rht::{DIM, R};

/// Columns per step (f32 lanes of one vector).
const COLS: usize = 8;

/// Whether `R[i][j]` is `-0.25` (otherwise `+0.25`).
const fn neg(i: usize, j: usize) -> bool {
    R[i][j] < 0.0
}

/// For each of the `cols` columns (a multiple of 8) `c`: `out[j][c] = sum_i x[i *
/// stride + c] * R[i][j]`, `x` holding 16 rows `stride` apart, `out[j]` at least `cols`
/// long. Returns `false`, writing nothing, unless the CPU has AVX2 and the lengths fit;
/// the caller then sums with its portable loop.
#[inline(always)]
pub(crate) fn hadamard_sums<const N: usize>(
    x: &[f32],
    stride: usize,
    cols: usize,
    out: &mut [[f32; N]; DIM],
) -> bool {
    if !crate::rht_x86::fits_at(Level::Avx2, x.len(), (DIM, stride), cols, COLS, N) {
        return false;
    }
    // SAFETY: the CPU has AVX2 and the lengths fit (both checked above).
    unsafe { sums(x, stride, cols, out) };
    true
}

/// [`hadamard_sums`] after its checks.
///
/// # Safety
/// The CPU must have AVX2; `cols % 8 == 0`, `cols <= out[j].len()` and `15 * stride +
/// cols <= x.len()`.
#[target_feature(enable = "avx2")]
unsafe fn sums<const N: usize>(x: &[f32], stride: usize, cols: usize, out: &mut [[f32; N]; DIM]) {
    let quarter = _mm256_set1_ps(0.25);
    for c in (0..cols).step_by(COLS) {
        // SAFETY: `i * stride + c + 8 <= 15 * stride + cols <= x.len()` for `i < 16`;
        // one unaligned 256-bit load.
        let row = |i: usize| unsafe { _mm256_loadu_ps(x.as_ptr().add(i * stride + c)) };
        let mut y: [__m256; DIM] = [_mm256_setzero_ps(); DIM];
        // Every `(i, j)` step written out, so that each sign is a constant (as a loop
        // over `i` the signs were looked up at run time, 50 % of the quantize).
        macro_rules! steps {
            ($i:literal: [$($j:literal)*]) => {{
                let q = _mm256_mul_ps(row($i), quarter);
                $(
                    y[$j] = if neg($i, $j) {
                        _mm256_sub_ps(y[$j], q)
                    } else {
                        _mm256_add_ps(y[$j], q)
                    };
                )*
            }};
        }
        // One pass over the rows per half of the sums (`$js`).
        macro_rules! rows {
            ($js:tt; $($i:literal)*) => {$( steps!($i: $js); )*};
        }
        rows!([0 1 2 3 4 5 6 7]; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        rows!([8 9 10 11 12 13 14 15]; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        for (o, y) in out.iter_mut().zip(y) {
            // SAFETY: `c + 8 <= cols <= o.len()`; one unaligned 256-bit store.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(c), y) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rht::sums_check;

    #[test]
    fn equals_the_product_form_in_index_order() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let stride = 40;
        let x = sums_check::rows(stride);
        let mut out = [[0f32; 256]; DIM];
        assert!(hadamard_sums(&x, stride, 32, &mut out));
        sums_check::assert_index_order(&x, stride, 32, &out);
        // Lengths that do not fit are refused.
        assert!(!hadamard_sums(&x, stride, 36, &mut out));
        assert!(!hadamard_sums(&x[..15 * stride + 31], stride, 32, &mut out));
    }
}
