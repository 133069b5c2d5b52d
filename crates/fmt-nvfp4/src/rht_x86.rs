//! The Hadamard sums of the RHT with AVX-512: 16 columns per step, the 16 sums in
//! registers.
//!
//! `y[j] = sum_i x[i] * R[i][j]` in index order from `+0.0` (what [`crate::rht`]
//! specifies), for 16 columns at once. `x * R[i][j]` is `±(x * 0.25)`, exact, and
//! `a + -(q)` is `a - q` in IEEE arithmetic, so each step is one add or one subtract of
//! `q = x * 0.25`, its sign fixed at compile time, with the same result as the product
//! form. Every `(i, j)` step is written out by a macro: as loops, the portable form kept
//! the sums in memory and did not unroll the `j` loop (about 10 cycles per value on
//! Zen 4), and a portable unrolled form spilled them to the stack.

use std::arch::x86_64::{
    __m512, __m512d, _mm256_loadu_ps, _mm512_add_pd, _mm512_add_ps, _mm512_cvtps_pd,
    _mm512_loadu_ps, _mm512_mul_pd, _mm512_mul_ps, _mm512_set1_pd, _mm512_set1_ps,
    _mm512_setzero_pd, _mm512_setzero_ps, _mm512_storeu_pd, _mm512_storeu_ps, _mm512_sub_pd,
    _mm512_sub_ps,
};

use quant_core::simd::Level;

use crate::rht::{DIM, R, SIGN_MASK};

/// Whether `R[i][j]` is `-0.25` (otherwise `+0.25`).
const NEG: [[bool; DIM]; DIM] = {
    let mut neg = [[false; DIM]; DIM];
    let mut i = 0;
    while i < DIM {
        let mut j = 0;
        while j < DIM {
            neg[i][j] = R[i][j] < 0.0;
            j += 1;
        }
        i += 1;
    }
    neg
};

/// Whether the AVX-512 kernels can take a call: the CPU has AVX-512, and `cols` columns
/// (a multiple of the kernel's `step`, at most `stride` and the output rows' `n`) of 16
/// rows `stride` apart lie inside an input of `len` values.
fn fits(len: usize, stride: usize, cols: usize, step: usize, n: usize) -> bool {
    cols.is_multiple_of(step)
        && cols <= stride
        && cols <= n
        && (DIM - 1) * stride + cols <= len
        && Level::Avx512.is_supported()
}

/// Columns per step (f32 lanes of one vector).
pub(crate) const COLS: usize = 16;

/// For each of the `cols` columns (a multiple of [`COLS`]) `c`: `out[j][c] = sum_i
/// x[i * stride + c] * R[i][j]`, `x` holding 16 rows `stride` apart, `out[j]` at least
/// `cols` long. Returns `false`, writing nothing, unless the CPU has AVX-512 and the
/// lengths fit; the caller then sums with its portable loop.
#[inline(always)]
pub(crate) fn hadamard_sums<const N: usize>(
    x: &[f32],
    stride: usize,
    cols: usize,
    out: &mut [[f32; N]; DIM],
) -> bool {
    if !fits(x.len(), stride, cols, COLS, N) {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F (checked above); the lengths were checked above.
    unsafe { sums(x, stride, cols, out) };
    true
}

/// [`hadamard_sums`] after its checks.
///
/// # Safety
/// The CPU must have AVX-512 F; `cols % 16 == 0`, `cols <= out[j].len()` and
/// `15 * stride + cols <= x.len()`.
#[target_feature(enable = "avx512f")]
unsafe fn sums<const N: usize>(x: &[f32], stride: usize, cols: usize, out: &mut [[f32; N]; DIM]) {
    let quarter = _mm512_set1_ps(0.25);
    for c in (0..cols).step_by(COLS) {
        let mut y: [__m512; DIM] = [_mm512_setzero_ps(); DIM];
        macro_rules! steps {
            ($i:literal: $($j:literal)*) => {{
                // SAFETY: `i * stride + c + 16 <= 15 * stride + cols <= x.len()`; one
                // unaligned 512-bit load.
                let v = unsafe { _mm512_loadu_ps(x.as_ptr().add($i * stride + c)) };
                let q = _mm512_mul_ps(v, quarter);
                $(
                    y[$j] = if NEG[$i][$j] {
                        _mm512_sub_ps(y[$j], q)
                    } else {
                        _mm512_add_ps(y[$j], q)
                    };
                )*
            }};
        }
        macro_rules! rows {
            ($($i:literal)*) => {$( steps!($i: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15); )*};
        }
        rows!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        for (o, y) in out.iter_mut().zip(y) {
            // SAFETY: `c + 16 <= cols <= o.len()`; one unaligned 512-bit store.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(c), y) };
        }
    }
}

/// Columns per step of [`inverse_sums`] (f64 lanes of one vector).
pub(crate) const INVERSE_COLS: usize = 8;

/// For each of the `cols` columns (a multiple of [`INVERSE_COLS`]) `c`: `out[i][c] =
/// sum_j y[j * stride + c] * R[i][j]` in f64, computed as `s_i * 0.25 * (H16 y)_i` by a
/// fast Walsh-Hadamard transform (64 adds per 16 values where the sums take 256).
///
/// The order of the sums differs from [`crate::rht::inverse_16`]'s, and the results are
/// still the same wherever they are finite: the 16 values of a column share one block
/// factor, so they are E2M1 multiples of it rounded to f32, within a factor 12 of each
/// other (or subnormal), and every partial sum of them is exact in f64, in any order.
/// Where a result is not finite (an infinite or NaN input), the caller recomputes its
/// column in index order. Returns `false`, writing nothing, unless the CPU has AVX-512
/// and the lengths fit.
#[inline(always)]
pub(crate) fn inverse_sums<const N: usize>(
    y: &[f32],
    stride: usize,
    cols: usize,
    out: &mut [[f64; N]; DIM],
) -> bool {
    if !fits(y.len(), stride, cols, INVERSE_COLS, N) {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F (checked above); the lengths were checked above.
    unsafe { fwht(y, stride, cols, out) };
    true
}

/// [`inverse_sums`] after its checks.
///
/// # Safety
/// The CPU must have AVX-512 F; `cols % 8 == 0`, `cols <= N` and
/// `15 * stride + cols <= y.len()`.
#[target_feature(enable = "avx512f")]
unsafe fn fwht<const N: usize>(y: &[f32], stride: usize, cols: usize, out: &mut [[f64; N]; DIM]) {
    // `s_i * 0.25`: exact scalings.
    let post: [__m512d; DIM] = std::array::from_fn(|i| {
        _mm512_set1_pd(if (SIGN_MASK >> i) & 1 == 1 {
            -0.25
        } else {
            0.25
        })
    });
    for c in (0..cols).step_by(INVERSE_COLS) {
        let mut v: [__m512d; DIM] = std::array::from_fn(|j| {
            // SAFETY: `j * stride + c + 8 <= 15 * stride + cols <= y.len()`; one unaligned
            // 256-bit load.
            _mm512_cvtps_pd(unsafe { _mm256_loadu_ps(y.as_ptr().add(j * stride + c)) })
        });
        // Sylvester order: after the four stages `v[i] = sum_j H[i][j] * y[j]`.
        let mut h = 1;
        while h < DIM {
            for a in 0..DIM {
                if a & h == 0 {
                    let (p, q) = (v[a], v[a + h]);
                    v[a] = _mm512_add_pd(p, q);
                    v[a + h] = _mm512_sub_pd(p, q);
                }
            }
            h *= 2;
        }
        for (i, o) in out.iter_mut().enumerate() {
            // `+ 0.0`: an exact zero is `+0` in index order (the sums start from `+0.0`),
            // but `-0.25 * +0` here.
            let vi = _mm512_add_pd(_mm512_mul_pd(v[i], post[i]), _mm512_setzero_pd());
            // SAFETY: `c + 8 <= cols <= N`; one unaligned 512-bit store.
            unsafe { _mm512_storeu_pd(o.as_mut_ptr().add(c), vi) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_the_product_form_in_index_order() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let stride = 40;
        let mut s = 0x9E37_79B9u32;
        let mut x: Vec<f32> = (0..DIM * stride)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                // Wide magnitudes, so the order of the sums shows.
                f32::from_bits(0x3000_0000 + (s >> 4) % 0x1C00_0000)
                    * if s & 1 == 1 { -1.0 } else { 1.0 }
            })
            .collect();
        x[3] = -0.0;
        x[stride + 5] = f32::INFINITY;
        x[2 * stride + 6] = f32::from_bits(1); // subnormal
        let mut out = [[0f32; 256]; DIM];
        assert!(hadamard_sums(&x, stride, 32, &mut out));
        for c in 0..32 {
            for j in 0..DIM {
                let mut want = 0f32;
                for i in 0..DIM {
                    want += x[i * stride + c] * R[i][j];
                }
                assert_eq!(out[j][c].to_bits(), want.to_bits(), "c {c} j {j}");
            }
        }
        // Lengths that do not fit are refused.
        assert!(!hadamard_sums(&x, stride, 48, &mut out));
        assert!(!hadamard_sums(&x[..15 * stride + 31], stride, 32, &mut out));
    }

    #[test]
    fn the_fast_inverse_equals_the_index_order_sums() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        // Columns of E2M1 multiples of one factor per column, rounded to f32, as a
        // dequantized block holds them; factors from subnormal to huge.
        let stride = 24;
        let e2m1 = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let mut s = 0x1234_5678u32;
        let mut y = vec![0f32; DIM * stride];
        for c in 0..stride {
            let f = f32::from_bits(
                0x0000_0100 + (c as u32) * 0x0340_0000 % 0x7E00_0000 + (c as u32 * 7919),
            );
            for j in 0..DIM {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let e = e2m1[(s % 8) as usize] * if s & 8 == 8 { -1.0 } else { 1.0 };
                y[j * stride + c] = e * f;
            }
        }
        let mut out = [[0f64; 32]; DIM];
        assert!(inverse_sums(&y, stride, 16, &mut out));
        for c in 0..16 {
            let col: [f32; DIM] = std::array::from_fn(|j| y[j * stride + c]);
            let want = crate::rht::inverse_16(&col);
            for i in 0..DIM {
                if want[i].is_finite() {
                    assert_eq!(out[i][c].to_bits(), want[i].to_bits(), "c {c} i {i}");
                }
            }
        }
        assert!(!inverse_sums(&y, stride, 12, &mut out));
    }
}
