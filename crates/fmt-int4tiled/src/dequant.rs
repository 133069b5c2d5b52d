//! The kernel's dequantization, `w = (u − 8)·scale + zero` rounded **once**.
//!
//! CUDA forms `u − 8` exactly in bf16 and applies `__hfma2(u − 8, scale, zero)`
//! (`fma.rn.bf16x2`): the exact value of `(u − 8)·s + z`, rounded once to bf16 with
//! round-to-nearest-even. Here:
//!
//! 1. `p = (u − 8)·s` in f64 is exact (at most 4 + 8 significant bits).
//! 2. `p + z` in f64 is usually exact too, but not when the exponents of `p` and `z` are
//!    far apart. TwoSum gives the rounded sum `s` and its exact error `e` (`p + z = s + e`).
//! 3. f32 output: `s` rounded to f32 is right unless `s` is exactly an f32 midpoint, where
//!    the sign of `e` breaks the tie.
//! 4. bf16 / f16 output: `s + e` is rounded to f32 with *round-to-odd* (the error term acts
//!    as a sticky bit), then to the target with round-to-nearest-even. Round-to-odd to a
//!    format with at least two more bits makes the second rounding exact.
//!
//! Rounding `p + z` in f32 and then to bf16 would round twice: wrong when `p` is a bf16
//! midpoint and `|z|` is below half an f32 ulp of `p` (see the tests).
//!
//! ```
//! use fmt_int4tiled::dequant::dequant_value;
//! use half::bf16;
//! let (s, z) = (bf16::from_f32(0.25), bf16::from_f32(-1.0));
//! assert_eq!(dequant_value::<f32>(15, s, z), 0.75);  // (15 - 8) * 0.25 - 1
//! assert_eq!(dequant_value::<bf16>(0, s, z).to_f32(), -3.0);
//! ```

use half::bf16;
use quant_core::{DType, Element};

/// TwoSum (Knuth): `a + b = s + e` exactly, with `s = fl(a + b)`.
#[inline(always)]
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    let e = (a - (s - bb)) + (b - bb);
    (s, e)
}

/// Round-to-nearest-even of the exact `s + e` to f32 (`|e| ≤ ½ ulp(s)`).
#[inline]
fn nearest_f32(s: f64, e: f64) -> f32 {
    let r = s as f32;
    if e == 0.0 || !r.is_finite() {
        return r;
    }
    let d = s - f64::from(r); // exact
    if d == 0.0 {
        return r; // s is an f32 value; s + e is within half an f64 ulp of it
    }
    let nb = if d > 0.0 { r.next_up() } else { r.next_down() };
    let mid = (f64::from(r) + f64::from(nb)) * 0.5; // exact in f64
    if s == mid && (e > 0.0) == (d > 0.0) {
        nb // a tie on s, but the exact value lies beyond it
    } else {
        r
    }
}

/// Round-to-odd of the exact `s + e` to f32 (`|e| ≤ ½ ulp(s)`): truncate, and set the
/// last bit when inexact.
#[inline]
fn odd_f32(s: f64, e: f64) -> f32 {
    let r = s as f32;
    if !r.is_finite() {
        return r;
    }
    let diff = (f64::from(r) - s) - e; // sign of r - (s + e); 0 only when exact
    if diff == 0.0 || r.to_bits() & 1 == 1 {
        r
    } else if diff > 0.0 {
        r.next_down()
    } else {
        r.next_up()
    }
}

/// The exact `p + z` rounded once to `T` (round-to-nearest-even).
#[inline]
pub fn round_sum<T: Element>(p: f64, z: f64) -> T {
    let (s, e) = two_sum(p, z);
    if !s.is_finite() {
        return T::from_f32(s as f32);
    }
    match T::DTYPE {
        DType::F32 => T::from_f32(nearest_f32(s, e)),
        _ => T::from_f32(odd_f32(s, e)),
    }
}

/// One weight as the CUDA kernel dequantizes it: `(u − 8)·scale + zero`, rounded once to
/// `T` (bf16 output is bit-identical to `_weight_int4pack_mm(eye, …)`; f32 and f16 outputs
/// are the same exact value rounded once to those formats).
#[inline]
pub fn dequant_value<T: Element>(u: u8, scale: bf16, zero: bf16) -> T {
    let p = f64::from(i32::from(u & 0xF) - 8) * f64::from(scale.to_f32());
    round_sum::<T>(p, f64::from(zero.to_f32()))
}

/// The 16 values a group's nibbles dequantize to.
#[inline]
pub fn group_table<T: Element>(scale: bf16, zero: bf16) -> [T; 16] {
    std::array::from_fn(|u| dequant_value::<T>(u as u8, scale, zero))
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn b(x: f32) -> bf16 {
        bf16::from_f32(x)
    }

    #[test]
    fn single_rounding_where_double_rounding_fails() {
        // p = (9 - 8) * s with s = 1 + 2^-7 (bf16); z = 2^-30.
        // Exact: 1 + 2^-7 + 2^-30. Not a tie for bf16: rounds to 1 + 2^-7 (it is a bf16).
        let s = b(1.0 + 2f32.powi(-7));
        assert_eq!(dequant_value::<bf16>(9, s, b(2f32.powi(-30))), s);
        // s = 1 + 3*2^-7 and u - 8 = 3: p = 3.0703125 = 0b11.0001001 has 9 bits, a bf16
        // midpoint between 3.0625 (even) and 3.078125. With z = +2^-30 the exact sum is
        // above the tie and must round UP; in f32 first, 2^-30 is below half an ulp, the
        // tie reappears and RNE goes down: the double rounding is wrong.
        let s = b(1.0 + 3.0 * 2f32.powi(-7));
        let tiny = 2f32.powi(-30);
        let p = 3.0 * s.to_f32();
        assert_eq!(dequant_value::<bf16>(11, s, b(tiny)).to_f32(), 3.078125);
        assert_eq!(bf16::from_f32(p + tiny).to_f32(), 3.0625); // double rounding
        assert_eq!(dequant_value::<bf16>(11, s, b(-tiny)).to_f32(), 3.0625);
        assert_eq!(dequant_value::<bf16>(11, s, b(0.0)).to_f32(), 3.0625); // tie: even
    }

    #[test]
    fn f32_output_tie_broken_by_error_term() {
        // p = 7 * s where s is a bf16 value and p + z lands on an f32 midpoint in f64
        // only after rounding: z tiny relative to p (exponent gap > 53).
        let s = b(1.0);
        let z = b(2f32.powi(-60));
        // exact 7 + 2^-60 -> f32 7.0
        assert_eq!(dequant_value::<f32>(15, s, z), 7.0);
        // p = 1 + 2^-7 ... build an f32 midpoint: 2^24 + 1 is a midpoint of f32 (ulp 2 there)
        let s = b(2f32.powi(24)); // p = 1 * 2^24 ... need 2^24 + 1
        let z = b(1.0);
        // (9-8) * 2^24 + 1 = 16777217: exact tie between 16777216 (even) and 16777218
        assert_eq!(dequant_value::<f32>(9, s, z), 16777216.0);
        // plus a tiny positive part would round up: not expressible with one bf16 zero,
        // so exercise nearest_f32 directly
        assert_eq!(nearest_f32(16777217.0, 1e-300), 16777218.0);
        assert_eq!(nearest_f32(16777217.0, -1e-300), 16777216.0);
        assert_eq!(nearest_f32(16777217.0, 0.0), 16777216.0);
    }

    #[test]
    fn special_values() {
        assert!(dequant_value::<bf16>(3, b(f32::NAN), b(0.0)).is_nan());
        assert!(dequant_value::<f32>(8, b(f32::INFINITY), b(1.0)).is_nan()); // 0 * inf
        assert_eq!(
            dequant_value::<bf16>(15, b(f32::INFINITY), b(1.0)).to_f32(),
            f32::INFINITY
        );
        // overflow: 7 * max + max rounds to inf
        let m = bf16::MAX;
        assert_eq!(dequant_value::<bf16>(15, m, m).to_f32(), f32::INFINITY);
        assert_eq!(dequant_value::<f32>(15, m, m), 8.0 * m.to_f32());
        // subnormal results keep their bits
        let tiny = bf16::from_bits(0x0001); // smallest bf16 subnormal
        assert_eq!(dequant_value::<bf16>(9, tiny, b(0.0)), tiny);
        assert_eq!(
            dequant_value::<f16>(15, b(1e4), b(0.0)).to_f32(),
            f32::INFINITY
        );
    }

    #[test]
    fn odd_rounding_is_exact_for_bf16_targets() {
        // Randomized: compare with an exact rational rounding done in i128.
        let mut state = quantfmt_testkit::XorShift64::new(0x1234_5678_9abc_def0);
        let mut next = || state.next_u64();
        for _ in 0..200_000 {
            let s = bf16::from_bits((next() as u16) & 0x7F7F | 0x0080);
            let z = bf16::from_bits((next() as u16) & 0xFF7F);
            if !s.to_f32().is_finite() || !z.to_f32().is_finite() {
                continue;
            }
            let u = (next() % 16) as u8;
            let got = dequant_value::<bf16>(u, s, z);
            let want = exact_bf16(u, s, z);
            assert_eq!(got.to_bits(), want.to_bits(), "u={u} s={s} z={z}");
        }
    }

    /// Reference: exact integer arithmetic on (mantissa, exponent) pairs.
    fn exact_bf16(u: u8, s: bf16, z: bf16) -> bf16 {
        fn parts(x: bf16) -> (i128, i32) {
            let b = x.to_bits();
            let sign = if b & 0x8000 != 0 { -1 } else { 1 };
            let e = ((b >> 7) & 0xFF) as i32;
            let m = (b & 0x7F) as i128;
            if e == 0 {
                (sign * m, -133)
            } else {
                (sign * (m | 0x80), e - 134)
            }
        }
        let (ms, es) = parts(s);
        let (mz, ez) = parts(z);
        let (mp, ep) = (ms * (i128::from(u) - 8), es);
        // Align exponents; beyond a gap of 100 bits the smaller term only acts as a sticky bit.
        let (v, e0) = if mp == 0 || mz == 0 {
            (mp + mz, if mp == 0 { ez } else { ep })
        } else if ep >= ez {
            let gap = ep - ez;
            if gap <= 100 {
                ((mp << gap) + mz, ez)
            } else {
                ((mp << 100) + mz.signum(), ep - 100)
            }
        } else {
            let gap = ez - ep;
            if gap <= 100 {
                (mp + (mz << gap), ep)
            } else {
                ((mz << 100) + mp.signum(), ez - 100)
            }
        };
        if v == 0 {
            return bf16::from_f32(0.0);
        }
        // v * 2^e0 rounded to bf16: find the bit length, keep 8 significant bits (or the
        // subnormal grid 2^-133), round half to even.
        let neg = v < 0;
        let a = v.unsigned_abs();
        let bits = 128 - a.leading_zeros() as i32;
        let top = bits - 1 + e0; // exponent of the leading bit
        let lsb = (top - 7).max(-133); // exponent of the last kept bit
        let shift = lsb - e0;
        let mut q = if shift > 0 {
            let q = a >> shift;
            let rem = a - (q << shift);
            let half = 1u128 << (shift - 1);
            if rem > half || (rem == half && q & 1 == 1) {
                q + 1
            } else {
                q
            }
        } else {
            a << (-shift)
        };
        let mut lsb = lsb;
        if q == 0x100 {
            q = 0x80;
            lsb += 1;
        }
        let val = (q as f64) * 2f64.powi(lsb);
        let out = bf16::from_f32(val as f32); // exact: q has <= 8 bits
        if neg { -out } else { out }
    }
}
