//! Property tests of the exact codecs: monotonicity, sign symmetry, saturation, nearest
//! rounding and the direction of the E8M0 rules, on arbitrary f32 inputs (every bit
//! pattern is reachable: proptest's `f32::ANY` includes subnormals, infinities and NaN).
//!
//! The golden tests (`codecs_golden.rs`) pin every rounding boundary against an
//! independent reference; these properties say why the boundaries are where they are.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use proptest::num::f32 as pf32;
use proptest::prelude::*;
use quant_core::codec::{e2m1, e4m3, e5m2, e8m0};

/// A float codec under test: encode, decode, max finite, and its sign bit in the code.
struct Codec {
    name: &'static str,
    encode: fn(f32) -> u8,
    decode: fn(u8) -> f32,
    max: f32,
    sign: u8,
    codes: u8,
}

const CODECS: [Codec; 3] = [
    Codec {
        name: "e4m3",
        encode: e4m3::encode,
        decode: e4m3::decode,
        max: e4m3::MAX,
        sign: 0x80,
        codes: 0xFF,
    },
    Codec {
        name: "e5m2",
        encode: e5m2::encode,
        decode: e5m2::decode,
        max: e5m2::MAX,
        sign: 0x80,
        codes: 0xFF,
    },
    Codec {
        name: "e2m1",
        encode: e2m1::encode,
        decode: e2m1::decode,
        max: e2m1::MAX,
        sign: 0x8,
        codes: 0xF,
    },
];

/// Finite values of every magnitude the codecs care about (normal, subnormal, zero).
fn finite() -> impl Strategy<Value = f32> {
    prop_oneof![
        pf32::NORMAL | pf32::SUBNORMAL | pf32::ZERO,
        // Dense around the codecs' own ranges, where the rounding decisions are.
        (-70000.0f32..70000.0),
        (-8.0f32..8.0),
        (-1e-3f32..1e-3),
    ]
}

/// The representable finite values of a codec, sorted, with their codes.
fn grid(c: &Codec) -> Vec<(f32, u8)> {
    let mut g: Vec<(f32, u8)> = (0..=c.codes)
        .map(|code| ((c.decode)(code), code))
        .filter(|(v, _)| v.is_finite())
        .collect();
    g.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    g
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn encode_is_monotone(a in finite(), b in finite()) {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        for c in &CODECS {
            let (ql, qh) = ((c.decode)((c.encode)(lo)), (c.decode)((c.encode)(hi)));
            prop_assert!(ql <= qh, "{}: {lo:e} -> {ql:e} but {hi:e} -> {qh:e}", c.name);
        }
    }

    #[test]
    fn encode_is_sign_symmetric(x in finite()) {
        for c in &CODECS {
            let (p, n) = ((c.encode)(x), (c.encode)(-x));
            prop_assert_eq!(p ^ n, c.sign, "{}: {:e}", c.name, x);
            let q = (c.decode)(p);
            // The result has x's sign (or is a zero of x's sign).
            prop_assert_eq!(q.is_sign_negative(), x.is_sign_negative(), "{}: {:e} -> {:e}", c.name, x, q);
        }
    }

    #[test]
    fn encode_saturates_to_the_max_and_never_grows_a_value(x in finite()) {
        for c in &CODECS {
            let q = (c.decode)((c.encode)(x));
            prop_assert!(q.is_finite(), "{}: {:e} -> {:e}", c.name, x, q);
            prop_assert!(q.abs() <= c.max);
            if x.abs() >= c.max {
                prop_assert_eq!(q.abs(), c.max, "{}: {:e} must saturate", c.name, x);
            }
        }
    }

    #[test]
    fn encode_rounds_to_a_nearest_value_ties_to_even(x in finite()) {
        for c in &CODECS {
            let code = (c.encode)(x);
            let q = (c.decode)(code);
            let xc = x.clamp(-c.max, c.max);
            let best = grid(c)
                .iter()
                .map(|(v, _)| (f64::from(*v) - f64::from(xc)).abs())
                .fold(f64::INFINITY, f64::min);
            let err = (f64::from(q) - f64::from(xc)).abs();
            prop_assert_eq!(err, best, "{}: {:e} -> {:e}, a nearer value exists", c.name, x, q);
            // On a tie the chosen code has an even mantissa (its lowest bit clear).
            let ties = grid(c)
                .iter()
                .filter(|(v, _)| (f64::from(*v) - f64::from(xc)).abs() == best && *v != 0.0)
                .count();
            if ties > 1 {
                prop_assert_eq!(code & 1, 0, "{}: tie at {:e} went to odd code {:#x}", c.name, x, code);
            }
        }
    }

    #[test]
    fn nan_and_inf_are_handled(neg in any::<bool>()) {
        let s = if neg { -1.0f32 } else { 1.0 };
        for c in &CODECS[..2] {
            prop_assert!((c.decode)((c.encode)(f32::NAN)).is_nan(), "{}", c.name);
            prop_assert_eq!((c.decode)((c.encode)(s * f32::INFINITY)), s * c.max, "{}: satfinite", c.name);
        }
    }

    #[test]
    fn e8m0_ceil_never_rounds_down_and_floor_never_up(x in pf32::POSITIVE | pf32::NORMAL) {
        let x = x.abs();
        prop_assume!(x.is_finite() && x > 0.0);
        let (c, f) = (e8m0::from_f32_ceil(x), e8m0::from_f32_floor(x));
        let (up, down) = (e8m0::decode(c), e8m0::decode(f));
        // In the representable range [2^-127, 2^127] the ceil rule gives a power of two
        // >= x (so the block max never clips) and the floor rule one <= x.
        if x >= 2f32.powi(-127) && x <= 2f32.powi(127) {
            prop_assert!(up >= x, "ceil({x:e}) = {up:e}");
            prop_assert!(down <= x, "floor({x:e}) = {down:e}");
            prop_assert!(up <= 2.0 * x, "ceil({x:e}) = {up:e} is not the smallest");
            prop_assert!(down * 2.0 > x, "floor({x:e}) = {down:e} is not the largest");
        }
        prop_assert!(c >= f);
        prop_assert!(c - f <= 1);
    }

    #[test]
    fn e8m0_rules_are_monotone(a in pf32::POSITIVE, b in pf32::POSITIVE) {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        prop_assert!(e8m0::from_f32_ceil(lo) <= e8m0::from_f32_ceil(hi));
        prop_assert!(e8m0::from_f32_floor(lo) <= e8m0::from_f32_floor(hi));
    }

    #[test]
    fn e8m0_rcp_is_the_reciprocal(code in 0u8..=0xFE) {
        let (d, r) = (e8m0::decode(code), e8m0::exp2_rcp(code));
        prop_assert!(d > 0.0 && r > 0.0);
        // Both are powers of two, so the product is exact unless it under/overflows.
        if (1..=0xFD).contains(&code) {
            prop_assert_eq!(d * r, 1.0, "code {:#x}", code);
        }
    }
}

#[test]
fn every_code_round_trips() {
    for c in &CODECS {
        for code in 0..=c.codes {
            let v = (c.decode)(code);
            // NaN and E5M2's infinities are never produced (satfinite), so they do not
            // round-trip by design.
            if !v.is_finite() {
                continue;
            }
            let back = (c.encode)(v);
            assert_eq!(
                (c.decode)(back).to_bits(),
                v.to_bits(),
                "{}: code {code:#x}",
                c.name
            );
        }
    }
    for code in 0..=0xFEu8 {
        assert_eq!(
            e8m0::from_f32_ceil(e8m0::decode(code)),
            code,
            "e8m0 ceil {code:#x}"
        );
        assert_eq!(
            e8m0::from_f32_floor(e8m0::decode(code)),
            code,
            "e8m0 floor {code:#x}"
        );
    }
}

#[test]
fn e2m1_packing_round_trips() {
    for lo in 0..16u8 {
        for hi in 0..16u8 {
            assert_eq!(e2m1::unpack(e2m1::pack(lo, hi)), (lo, hi));
        }
    }
}
