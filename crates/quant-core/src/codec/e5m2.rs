//! E5M2: 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like infinity and NaN.
//!
//! ```
//! use quant_core::codec::e5m2;
//! assert_eq!(e5m2::encode(57344.0), 0x7B);
//! assert_eq!(e5m2::encode(f32::INFINITY), 0x7B); // satfinite: inf -> max
//! assert_eq!(e5m2::encode(f32::NAN), 0x7F);
//! assert!(e5m2::decode(0x7C).is_infinite());
//! ```

/// Largest finite value (hard-coded; never take it from the `float8` crate).
pub const MAX: f32 = 57344.0;
/// Code of +[`MAX`].
pub const MAX_CODE: u8 = 0x7B;
/// Canonical NaN code produced by the encoder.
pub const NAN_CODE: u8 = 0x7F;
/// `float(1/57344)` as the kernels use it, bits `0x37924925`.
pub const MAX_RCP: f32 = f32::from_bits(0x3792_4925);

/// f32 -> E5M2 with round-to-nearest-even and saturation to ±57344 (infinity too);
/// NaN -> `0x7F`.
#[inline(always)]
pub fn encode(x: f32) -> u8 {
    super::fp8::encode_fast::<2, 15>(x, MAX_CODE)
}

/// The plain scalar specification of [`encode`] (branches, one case at a time); the
/// branchless [`encode`] is tested against it.
#[inline]
pub fn encode_reference(x: f32) -> u8 {
    super::fp8::encode::<2, 15>(x, MAX, MAX_CODE)
}

/// E5M2 -> f32 (exact).
#[inline(always)]
pub fn decode(code: u8) -> f32 {
    DECODE[code as usize]
}

/// Branchless E5M2 -> f32, bit-identical to [`decode`] (NaN bits included): the 7
/// magnitude bits shifted into an f32 times `2^112` (rebias 15 -> 127); `0x7C` is
/// infinity, `0x7D..=0x7F` NaN; the sign bit is copied.
///
/// ```
/// use quant_core::codec::e5m2;
/// for c in 0..=255u8 {
///     assert_eq!(e5m2::decode_fast(c).to_bits(), e5m2::decode(c).to_bits());
/// }
/// ```
#[inline(always)]
pub fn decode_fast(code: u8) -> f32 {
    let c = u32::from(code);
    let mag = c & 0x7F;
    let v = f32::from_bits(mag << 21) * f32::from_bits(239 << 23);
    let v = if mag == 0x7C { f32::INFINITY } else { v };
    let v = if mag > 0x7C { f32::NAN } else { v };
    f32::from_bits(v.to_bits() | ((c & 0x80) << 24))
}

/// Decoding table, built at compile time.
pub static DECODE: [f32; 256] = build();

const fn build() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        let m = c & 0x7F;
        t[i] = super::fp8::decode::<2, 15>(c, m > 0x7C, m == 0x7C);
        i += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_equals_reference_on_a_sweep() {
        // Every 4099th f32 pattern plus every bf16 pattern; the golden tests add 10^8 more.
        let mut i = 0u64;
        while i < (1u64 << 32) {
            let x = f32::from_bits(i as u32);
            assert_eq!(encode(x), encode_reference(x), "{:#010x}", i);
            // Miri (scripts/miri.sh) interprets every step: a sparser sweep there.
            i += if cfg!(miri) { 4_194_301 } else { 4099 };
        }
        for b in (0..=u16::MAX).step_by(if cfg!(miri) { 257 } else { 1 }) {
            let x = f32::from_bits(u32::from(b) << 16);
            assert_eq!(encode(x), encode_reference(x), "{x:e}");
        }
    }

    /// All 2^32 inputs; run with `cargo test --release -- --ignored`.
    #[test]
    #[ignore]
    fn fast_equals_reference_exhaustively() {
        for i in 0..=u32::MAX {
            let x = f32::from_bits(i);
            assert_eq!(encode(x), encode_reference(x), "{i:#010x}");
        }
    }

    #[test]
    fn decode_encode_round_trip_every_finite_code() {
        for c in 0..=255u8 {
            let v = decode(c);
            if v.is_nan() {
                assert_eq!(encode(v), NAN_CODE);
            } else if v.is_infinite() {
                assert_eq!(encode(v), (c & 0x80) | MAX_CODE);
            } else {
                assert_eq!(encode(v), c, "code {c:#04x} value {v}");
            }
        }
        assert_eq!(decode(0x01), crate::codec::pow2(-16));
        assert_eq!(decode(0x04), crate::codec::pow2(-14));
        assert_eq!(MAX_RCP, (1.0f64 / 57344.0) as f32);
    }

    #[test]
    fn ties() {
        assert_eq!(encode(crate::codec::pow2(-17)), 0x00);
        assert_eq!(encode(61440.0), 0x7B); // would round to inf; saturates
        assert_eq!(encode(-1.125), 0xBC); // tie between 1.0 and 1.25 -> even 1.0
    }
}
