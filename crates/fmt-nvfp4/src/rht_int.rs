//! The inverse RHT in 32-bit integer lanes: one step of 16 columns at AVX-512
//! ([`avx512::inverse_step`]) or 8 at AVX2 ([`avx2::inverse_step`]), with the same
//! results as the f64 steps of [`crate::rht_x86::inverse_nibbles`] and
//! [`crate::rht_avx2::inverse_nibbles`] at twice their width.
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
//! An f64 vector operation costs what an i32 one of the same width does, so the same
//! work in i32 lanes takes half the instructions per value.

use quant_core::codec::e2m1;

use crate::rht::DIM;
use crate::rht_x86::Narrow;

/// The smallest and largest exponent fields of a factor a step takes (module docs).
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

/// The step at AVX-512.
pub(crate) mod avx512 {
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

    use super::{DIM, FIELDS, Narrow, TWICE};
    use crate::rht::R;
    use crate::rht_x86::butterflies;

    /// Columns per step of [`inverse_step`] (i32 lanes of one vector).
    pub(crate) const COLS: usize = 16;

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
        butterflies!(v, _mm512_add_epi32, _mm512_sub_epi32, DIM / 2);
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
                    let t =
                        _mm512_cvt_roundepi32_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(s);
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
}

/// The step at AVX2: the AVX-512 step's arithmetic in 8 lanes. AVX2 has no unsigned
/// compares (the magnitudes are non-negative, so signed ones serve), no mask registers
/// and no truncating conversion: round to odd steps the nearest conversion back by one
/// unit where it rounded away, then sets the last bit where it was inexact.
pub(crate) mod avx2 {
    use std::arch::x86_64::{
        __m256, __m256i, _mm_loadl_epi64, _mm256_add_epi32, _mm256_add_ps, _mm256_and_si256,
        _mm256_andnot_si256, _mm256_castps_si256, _mm256_castsi256_ps, _mm256_cmpeq_epi32,
        _mm256_cmpgt_epi32, _mm256_cvtepi32_ps, _mm256_cvtepu8_epi32, _mm256_cvtps_epi32,
        _mm256_loadu_ps, _mm256_max_epi32, _mm256_movemask_ps, _mm256_mul_ps, _mm256_or_si256,
        _mm256_set1_epi32, _mm256_setzero_ps, _mm256_setzero_si256, _mm256_srai_epi32,
        _mm256_srli_epi32, _mm256_storeu_ps, _mm256_sub_epi32, _mm256_xor_si256,
    };

    use super::{DIM, FIELDS, Narrow, TWICE};
    use crate::rht::R;
    use crate::rht_x86::butterflies;
    use crate::x86_avx2::e2m1_8;

    /// Columns per step of [`inverse_step`] (i32 lanes of one vector).
    pub(crate) const COLS: usize = 8;

    /// [`super::avx512::inverse_step`] for columns `c .. c + 8`.
    ///
    /// # Safety
    /// The CPU must have AVX2; `c + 8 <= f.len() <= N`, `c + 8 <= stride` and
    /// `7 * stride + c + 8 <= pairs.len()`.
    #[target_feature(enable = "avx2")]
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
        // SAFETY: `c + 8 <= f.len()` (the caller's contract); one unaligned 256-bit load.
        let fv = _mm256_castps_si256(unsafe { _mm256_loadu_ps(f.as_ptr().add(c)) });
        let mag = _mm256_and_si256(fv, _mm256_set1_epi32(0x7FFF_FFFF));
        let zero = _mm256_cmpeq_epi32(mag, _mm256_setzero_si256());
        let low = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32((FIELDS.0 << 23) - 1));
        let high = _mm256_cmpgt_epi32(_mm256_set1_epi32((FIELDS.1 + 1) << 23), mag);
        let nonzero = _mm256_and_si256(low, high);
        if _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_or_si256(nonzero, zero))) != 0xFF {
            return false;
        }
        // `±m` as f32 (the field set to 150), 0 for a zero factor.
        let sig = _mm256_and_si256(fv, _mm256_set1_epi32(0x807F_FFFF_u32 as i32));
        let m = _mm256_and_si256(nonzero, _mm256_or_si256(sig, _mm256_set1_epi32(150 << 23)));
        let m = _mm256_castsi256_ps(m);
        // `u / 4 = 2^(e - 153)`: field `e - 26` (zero factors take field 1).
        let field = _mm256_and_si256(mag, _mm256_set1_epi32(0x7F80_0000));
        let field = _mm256_max_epi32(field, _mm256_set1_epi32(FIELDS.0 << 23));
        let quarter_u = _mm256_sub_epi32(field, _mm256_set1_epi32(26 << 23));
        // The positive half of the table (`e2m1_8` puts in the sign).
        // SAFETY: `TWICE` is 16 f32; its first 8 are one unaligned 256-bit load.
        let table = unsafe { _mm256_loadu_ps(TWICE.as_ptr()) };
        let mut v = [_mm256_setzero_si256(); DIM];
        for p in 0..DIM / 2 {
            // SAFETY: `p * stride + c + 8 <= 7 * stride + c + 8 <= pairs.len()`; one
            // unaligned 64-bit load.
            let b = unsafe { _mm_loadl_epi64(pairs.as_ptr().add(p * stride + c).cast()) };
            let lo = _mm256_cvtepu8_epi32(b);
            let hi = _mm256_srli_epi32::<4>(lo);
            // Integers below `2^28`: converted exactly.
            let y = |codes: __m256i| _mm256_cvtps_epi32(_mm256_mul_ps(e2m1_8(table, codes), m));
            v[2 * p] = y(lo);
            v[2 * p + 1] = y(hi);
        }
        // The first three stages (below `2^31`).
        butterflies!(v, _mm256_add_epi32, _mm256_sub_epi32, DIM / 2);
        // The last, each result checked: its sign bit in `wrapped` where it wrapped.
        let mut wrapped = _mm256_setzero_si256();
        for a in 0..DIM / 2 {
            let (p, q) = (v[a], v[a + DIM / 2]);
            let (s, d) = (_mm256_add_epi32(p, q), _mm256_sub_epi32(p, q));
            // `p + q` wrapped where `p` and `q` share a sign that `s` lacks; `p - q`
            // where their signs differ and `d`'s is not `p`'s.
            let differ = _mm256_xor_si256(p, q);
            let ws = _mm256_andnot_si256(differ, _mm256_xor_si256(s, p));
            let wd = _mm256_and_si256(differ, _mm256_xor_si256(d, p));
            wrapped = _mm256_or_si256(wrapped, _mm256_or_si256(ws, wd));
            v[a] = s;
            v[a + DIM / 2] = d;
        }
        if _mm256_movemask_ps(_mm256_castsi256_ps(wrapped)) != 0 {
            return false;
        }
        let sign = _mm256_set1_epi32(i32::MIN);
        let one = _mm256_set1_epi32(1);
        for (i, (o, &s)) in out.iter_mut().zip(&v).enumerate() {
            let r = _mm256_cvtepi32_ps(s);
            let t: __m256 = match narrow {
                Narrow::Nearest => r,
                Narrow::Odd => {
                    // `back - s` is the rounding's error (it cannot wrap: `r` is within
                    // 128 of `s`, and `r = 2^31` converts back to `-2^31`, which leaves
                    // the error's sign that of `s`). It rounded away from zero where
                    // the error has the sign of `s`.
                    let err = _mm256_sub_epi32(_mm256_cvtps_epi32(r), s);
                    let exact = _mm256_cmpeq_epi32(err, _mm256_setzero_si256());
                    let away = _mm256_andnot_si256(
                        _mm256_or_si256(exact, _mm256_srai_epi32::<31>(_mm256_xor_si256(err, s))),
                        _mm256_set1_epi32(-1),
                    );
                    // `away` is -1 where set: one unit down in magnitude.
                    let bits = _mm256_add_epi32(_mm256_castps_si256(r), away);
                    _mm256_castsi256_ps(_mm256_or_si256(bits, _mm256_andnot_si256(exact, one)))
                }
            };
            // `R[i][0]` is `s_i * 0.25`: the power of two `±u / 4`.
            let neg = if R[i][0] < 0.0 {
                sign
            } else {
                _mm256_setzero_si256()
            };
            let scale = _mm256_castsi256_ps(_mm256_xor_si256(quarter_u, neg));
            // Exact, and `+ 0.0` makes a zero `+0` (module docs).
            let r = _mm256_add_ps(_mm256_mul_ps(t, scale), _mm256_setzero_ps());
            // SAFETY: `c + 8 <= f.len() <= N`; one unaligned 256-bit store.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(c), r) };
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rht_x86::inverse_check::{INT_DECLINED, INT_STEPS, case};
    use quant_core::simd::Level;

    /// A step function of either level: `(pairs, stride), f, c, narrow, out`.
    type Step = unsafe fn((&[u8], usize), &[f32], usize, Narrow, &mut [[f32; 1024]; DIM]) -> bool;

    /// Every `cols`-wide step of the test case's i32 columns through `step`: declined
    /// where it holds a column of [`INT_DECLINED`] and taken elsewhere, and where taken
    /// equal to the index-order f64 sums of [`crate::rht::inverse_16`], rounded as each
    /// [`Narrow`] says. A declined step must write nothing.
    ///
    /// # Safety
    /// The CPU must have the features of `step`'s level.
    unsafe fn check_steps(cols: usize, step: Step) {
        let (pairs, stride, f) = case();
        let value = |c: usize, j: usize| {
            let (lo, hi) = e2m1::unpack(pairs[j / 2 * stride + c]);
            e2m1::decode_fast(if j.is_multiple_of(2) { lo } else { hi }) * f[c]
        };
        for narrow in [Narrow::Nearest, Narrow::Odd] {
            let mut out = Box::new([[f32::NAN; 1024]; DIM]);
            for c in INT_STEPS.step_by(cols) {
                // SAFETY: the caller's CPU has the level; `c + cols <= 1024 = f.len() <=
                // stride` and the case holds 8 byte rows of `stride`.
                let taken = unsafe { step((&pairs, stride), &f, c, narrow, &mut out) };
                let want = !INT_DECLINED.iter().any(|d| (c..c + cols).contains(d));
                assert_eq!(taken, want, "{narrow:?} step {c}");
                for l in c..c + cols {
                    let col: [f32; DIM] = std::array::from_fn(|j| value(l, j));
                    let sums = crate::rht::inverse_16(&col);
                    for (i, row) in out.iter().enumerate() {
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
    fn avx512_steps_equal_the_index_order_sums_or_decline() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        // SAFETY: the CPU has AVX-512 (checked above).
        unsafe { check_steps(avx512::COLS, avx512::inverse_step::<1024>) };
    }

    #[test]
    fn avx2_steps_equal_the_index_order_sums_or_decline() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        // SAFETY: the CPU has AVX2 (checked above).
        unsafe { check_steps(avx2::COLS, avx2::inverse_step::<1024>) };
    }

    #[test]
    fn twice_the_table_is_exact() {
        for (t, d) in TWICE.iter().zip(e2m1::DECODE) {
            assert_eq!(*t, 2.0 * d);
            assert_eq!(t.fract(), 0.0);
        }
    }
}
