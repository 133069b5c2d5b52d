//! One 16-column step of the inverse RHT in 32-bit integer lanes (AVX-512): the sums of
//! [`crate::rht_x86::inverse_nibbles`] at twice the width of its f64 lanes, with the
//! same results.
//!
//! **Why the integer sums are exact.** Column `c`'s values are
//! `y_j = f32(e2m1(code_j) * f)`. Write a normal factor as `f = m * 2^(e - 150)`, with
//! `m` its signed 24-bit integer significand and `e` its exponent field. Then
//! `2 e2m1(code) * m` is an integer below `12 * 2^24`, and its rounding to 24 bits,
//! `Y_j`, is an integer too.
//! Scaling by the power of two `u = 2^(e - 151)` commutes with that rounding while both
//! sides are normal, so `y_j = Y_j * u` exactly. Hence each inverse sum
//! `s_i * 0.25 * (H16 y)_i` equals `s_i * (u / 4) * S_i` with `S_i = (H16 Y)_i` an
//! integer sum.
//!
//! `S_i` is exact in i32 unless it leaves `±2^31`. Only the last butterfly stage can do
//! that: after three stages every value is below `8 * 12 * 2^24 < 2^31`. The last stage
//! checks each add and subtract for wrapping.
//!
//! **The rounding.** The output is `S_i` converted to f32, then multiplied by the power
//! of two `±u / 4`, plus `+0.0`:
//! * for [`Narrow::Nearest`] the conversion rounds to nearest even;
//! * for [`Narrow::Odd`] it truncates, and the last bit is set where that was inexact.
//!
//! The multiply is exact while the result is normal and finite, so either way this is
//! the one rounding of the exact sum that the f64 route makes. `+0.0` turns the `-0` of
//! a zero sum times a negative sign into `+0`, as in index order.
//!
//! **When the step runs.** Every factor of the step must be zero or have a field in
//! `27..=249`, and no sum may leave i32; otherwise the step declines, writing nothing,
//! and the caller runs the f64 steps. Inside that range:
//! * a nonzero output is at least `u / 4 = 2^(e - 153) >= 2^-126`, so it is normal;
//! * an output is at most `24 |f| < 2^128`, so it is finite;
//! * no `y_j` overflows.
//!
//! A zero factor gives zero values and `+0` sums, as the f64 route does.
//!
//! On Zen 4 a 512-bit f64 operation costs what a 32-bit one does, so the same work in
//! i32 lanes takes half the instructions per value.

use std::arch::x86_64::{
    __m512, __m512i, _MM_FROUND_NO_EXC, _MM_FROUND_TO_ZERO, _mm_loadu_si128, _mm512_add_epi32,
    _mm512_and_si512, _mm512_castps_si512, _mm512_castsi512_ps, _mm512_cmpeq_epi32_mask,
    _mm512_cmpge_epu32_mask, _mm512_cmple_epu32_mask, _mm512_cmpneq_epi32_mask,
    _mm512_cvt_roundepi32_ps, _mm512_cvtepi32_ps, _mm512_cvtepu8_epi32, _mm512_cvtps_epi32,
    _mm512_cvttps_epi32, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mask_ternarylogic_epi32,
    _mm512_maskz_or_epi32, _mm512_max_epu32, _mm512_movepi32_mask, _mm512_mul_ps,
    _mm512_permutexvar_ps, _mm512_set1_epi32, _mm512_setzero_ps, _mm512_setzero_si512,
    _mm512_srli_epi32, _mm512_storeu_ps, _mm512_sub_epi32, _mm512_ternarylogic_epi32,
    _mm512_xor_si512,
};

use quant_core::codec::e2m1;

use crate::rht::{DIM, R};
use crate::rht_x86::Narrow;

/// Columns per step of [`inverse_step`] (i32 lanes of one vector).
pub(crate) const COLS: usize = 16;

/// The smallest and largest exponent fields of a factor the step takes (module docs).
const FIELDS: (i32, i32) = (27, 249);

/// `2 * e2m1(code)` for the 16 codes: the integer multiples of the significand.
const TWICE: [f32; 16] = {
    let mut t = [0f32; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = 2.0 * e2m1::DECODE[i];
        i += 1;
    }
    t
};

/// The inverse sums of columns `c .. c + 16` of a 16-row group, rounded as `narrow`
/// says, into `out[i][c..c + 16]`. `f` holds the columns' factors and `pairs` the
/// group's 8 transposed byte rows, `stride` apart. Returns `false`, writing nothing,
/// where a factor is outside the step's range or a sum leaves i32 (module docs).
///
/// # Safety
/// The CPU must have AVX-512 F, BW and DQ; `c + 16 <= f.len() <= N`, `c + 16 <= stride`
/// and `7 * stride + c + 16 <= pairs.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
#[inline]
pub(crate) unsafe fn inverse_step<const N: usize>(
    (pairs, stride): (&[u8], usize),
    f: &[f32],
    c: usize,
    narrow: Narrow,
    out: &mut [[f32; N]; DIM],
) -> bool {
    debug_assert!(c + COLS <= f.len() && f.len() <= N && c + COLS <= stride);
    debug_assert!(7 * stride + c + COLS <= pairs.len());
    // SAFETY: `c + 16 <= f.len()` (the caller's contract); one unaligned 512-bit load.
    let fv = _mm512_castps_si512(unsafe { _mm512_loadu_ps(f.as_ptr().add(c)) });
    let mag = _mm512_and_si512(fv, _mm512_set1_epi32(0x7FFF_FFFF));
    let zero = _mm512_cmpeq_epi32_mask(mag, _mm512_setzero_si512());
    let low = _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32(FIELDS.0 << 23));
    let high = _mm512_cmple_epu32_mask(mag, _mm512_set1_epi32((FIELDS.1 << 23) | 0x7F_FFFF));
    let nonzero = low & high;
    if nonzero | zero != 0xFFFF {
        return false;
    }
    // `±m` as f32 (the field set to 150: the value `1.mantissa * 2^23`), 0 for a zero
    // factor.
    let m = _mm512_castsi512_ps(_mm512_maskz_or_epi32(
        nonzero,
        _mm512_and_si512(fv, _mm512_set1_epi32(0x807F_FFFF_u32 as i32)),
        _mm512_set1_epi32(150 << 23),
    ));
    // `u / 4 = 2^(e - 153)`: field `e - 26` (zero factors take field 1; their sums are 0).
    let field = _mm512_and_si512(mag, _mm512_set1_epi32(0x7F80_0000));
    let field = _mm512_max_epu32(field, _mm512_set1_epi32(FIELDS.0 << 23));
    let quarter_u = _mm512_sub_epi32(field, _mm512_set1_epi32(26 << 23));
    // SAFETY: `TWICE` is 16 f32 (one unaligned 512-bit load).
    let table = unsafe { _mm512_loadu_ps(TWICE.as_ptr()) };
    let mut v = [_mm512_setzero_si512(); DIM];
    for p in 0..DIM / 2 {
        // SAFETY: `p * stride + c + 16 <= 7 * stride + c + 16 <= pairs.len()`; one
        // unaligned 128-bit load.
        let b = unsafe { _mm_loadu_si128(pairs.as_ptr().add(p * stride + c).cast()) };
        let lo = _mm512_cvtepu8_epi32(b);
        let hi = _mm512_srli_epi32::<4>(lo);
        // `vpermps` reads the low four bits of each lane: the low nibble from `lo`.
        // The products are integers below `2^28`: converted exactly.
        let y = |codes: __m512i| {
            _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_permutexvar_ps(codes, table), m))
        };
        v[2 * p] = y(lo);
        v[2 * p + 1] = y(hi);
    }
    // The first three stages of the fast Walsh-Hadamard transform (below `2^31`).
    // Written as `butterflies!` is, so that LLVM unrolls it and `v` stays in registers.
    let mut h = 1;
    while h < DIM / 2 {
        for a in 0..DIM {
            if a & h == 0 {
                let (p, q) = (v[a], v[a + h]);
                v[a] = _mm512_add_epi32(p, q);
                v[a + h] = _mm512_sub_epi32(p, q);
            }
        }
        h *= 2;
    }
    // The last, each result checked: its sign bit in `wrapped` where it wrapped.
    let mut wrapped = _mm512_setzero_si512();
    for a in 0..DIM / 2 {
        let (p, q) = (v[a], v[a + DIM / 2]);
        let (s, d) = (_mm512_add_epi32(p, q), _mm512_sub_epi32(p, q));
        // `p + q` wrapped where `p` and `q` share a sign that `s` lacks (truth table
        // 0x42 over `(p, q, s)`); `p - q` where their signs differ and `d`'s is not
        // `p`'s (0x18).
        let ws = _mm512_ternarylogic_epi32::<0x42>(p, q, s);
        let wd = _mm512_ternarylogic_epi32::<0x18>(p, q, d);
        wrapped = _mm512_ternarylogic_epi32::<0xFE>(wrapped, ws, wd);
        v[a] = s;
        v[a + DIM / 2] = d;
    }
    if _mm512_movepi32_mask(wrapped) != 0 {
        return false;
    }
    let sign = _mm512_set1_epi32(i32::MIN);
    let scale = |i: usize| {
        // `R[i][0]` is `s_i * 0.25` (column 0 of `H16` is all ones).
        let neg = if R[i][0] < 0.0 {
            sign
        } else {
            _mm512_setzero_si512()
        };
        _mm512_castsi512_ps(_mm512_xor_si512(quarter_u, neg))
    };
    let one = _mm512_set1_epi32(1);
    for (i, (o, &s)) in out.iter_mut().zip(&v).enumerate() {
        let t: __m512 = match narrow {
            Narrow::Nearest => _mm512_cvtepi32_ps(s),
            Narrow::Odd => {
                let t = _mm512_cvt_roundepi32_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(s);
                // Inexact where the truncation does not convert back to the sum (it
                // is below `2^31` in magnitude, so the conversion back is exact).
                let inexact = _mm512_cmpneq_epi32_mask(_mm512_cvttps_epi32(t), s);
                let t = _mm512_castps_si512(t);
                // `t | 1` under the mask (0xFE: the OR of the three operands).
                _mm512_castsi512_ps(_mm512_mask_ternarylogic_epi32::<0xFE>(t, inexact, t, one))
            }
        };
        // Exact: a power-of-two scaling inside the normal range (module docs).
        let r = _mm512_fmadd_ps(t, scale(i), _mm512_setzero_ps());
        // SAFETY: `c + 16 <= f.len() <= N`; one unaligned 512-bit store.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(c), r) };
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rht_x86::inverse_check::{INT_CASES, INT_STEPS, case};
    use quant_core::simd::Level;

    /// Every step of the test case's i32 columns: taken or declined as
    /// [`INT_CASES`] says (the others taken), and where taken equal to the index-order
    /// f64 sums of [`crate::rht::inverse_16`], rounded as each [`Narrow`] says.
    #[test]
    fn steps_equal_the_index_order_sums_or_decline() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let (pairs, stride, f) = case();
        let value = |c: usize, j: usize| {
            let (lo, hi) = e2m1::unpack(pairs[j / 2 * stride + c]);
            e2m1::decode_fast(if j.is_multiple_of(2) { lo } else { hi }) * f[c]
        };
        for narrow in [Narrow::Nearest, Narrow::Odd] {
            let mut out = Box::new([[f32::NAN; 1024]; DIM]);
            for c in INT_STEPS.step_by(COLS) {
                // SAFETY: the CPU has AVX-512 (checked); `c + 16 <= 1024 = f.len() <=
                // stride` and the case holds 8 byte rows of `stride`.
                let taken = unsafe { inverse_step((&pairs, stride), &f, c, narrow, &mut out) };
                let want = INT_CASES.iter().find(|w| w.0 == c).is_none_or(|w| w.1);
                assert_eq!(taken, want, "{narrow:?} step {c}");
                for l in c..c + COLS {
                    let col: [f32; DIM] = std::array::from_fn(|j| value(l, j));
                    let sums = crate::rht::inverse_16(&col);
                    for (i, row) in out.iter().enumerate() {
                        // Declined steps write nothing.
                        let want = if taken {
                            narrow.round(sums[i])
                        } else {
                            f32::NAN
                        };
                        assert_eq!(row[l].to_bits(), want.to_bits(), "{narrow:?} c {l} i {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn twice_the_table_is_exact() {
        for (t, d) in TWICE.iter().zip(e2m1::DECODE) {
            assert_eq!(*t, 2.0 * d);
            assert_eq!(t.fract(), 0.0);
        }
    }
}
