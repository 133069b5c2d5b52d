//! OCP E4M3 (`e4m3fn`): 4 exponent bits (bias 7), 3 mantissa bits, no infinity.
//!
//! ```
//! use quant_core::codec::e4m3;
//! assert_eq!(e4m3::encode(448.0), 0x7E);
//! assert_eq!(e4m3::encode(1e9), 0x7E);          // saturates
//! assert_eq!(e4m3::encode(f32::NEG_INFINITY), 0xFE);
//! assert_eq!(e4m3::encode(f32::NAN), 0x7F);
//! assert_eq!(e4m3::encode(-0.0), 0x80);         // sign kept
//! assert_eq!(e4m3::decode(0x01), 2f32.powi(-9)); // smallest subnormal
//! ```

/// Largest finite value (hard-coded; never take it from the `float8` crate).
pub const MAX: f32 = 448.0;
/// Code of +[`MAX`].
pub const MAX_CODE: u8 = 0x7E;
/// Canonical NaN code.
pub const NAN_CODE: u8 = 0x7F;
/// `float(1/448)` as the kernels use it (`Quantized_Limits::max_norm_rcp`), bits `0x3B124925`.
pub const MAX_RCP: f32 = f32::from_bits(0x3B12_4925);

/// f32 -> E4M3 with round-to-nearest-even and saturation to ±448; NaN -> `0x7F`.
#[inline(always)]
pub fn encode(x: f32) -> u8 {
    super::fp8::encode_fast::<3, 7>(x, MAX_CODE)
}

/// The plain scalar specification of [`encode`] (branches, one case at a time); the
/// branchless [`encode`] is tested against it.
#[inline]
pub fn encode_reference(x: f32) -> u8 {
    super::fp8::encode::<3, 7>(x, MAX, MAX_CODE)
}

/// E4M3 -> f32 (exact). `0x7F`/`0xFF` decode to NaN.
#[inline(always)]
pub fn decode(code: u8) -> f32 {
    DECODE[code as usize]
}

/// Branchless E4M3 -> f32, bit-identical to [`decode`] (NaN bits included): the 7
/// magnitude bits shifted into an f32 (exponent field 0..15, a tiny or subnormal f32)
/// times `2^120` is exactly the value, subnormal codes included; `0x7F` is NaN and the
/// sign bit is copied. Vectorizes (no table gather).
///
/// ```
/// use quant_core::codec::e4m3;
/// for c in 0..=255u8 {
///     assert_eq!(e4m3::decode_fast(c).to_bits(), e4m3::decode(c).to_bits());
/// }
/// ```
#[inline(always)]
pub fn decode_fast(code: u8) -> f32 {
    let c = u32::from(code);
    let mag = c & 0x7F;
    // 2^(127 - 7): rebias the exponent field from 7 to 127.
    let v = f32::from_bits(mag << 20) * f32::from_bits(247 << 23);
    let v = if mag == 0x7F { f32::NAN } else { v };
    f32::from_bits(v.to_bits() | ((c & 0x80) << 24))
}

/// Decoding table, built at compile time.
pub static DECODE: [f32; 256] = build();

const fn build() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] = super::fp8::decode::<3, 7>(c, c & 0x7F == 0x7F, false);
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
    fn decode_encode_round_trip_every_code() {
        for c in 0..=255u8 {
            let v = decode(c);
            if v.is_nan() {
                assert_eq!(encode(v), NAN_CODE);
            } else {
                assert_eq!(encode(v), c, "code {c:#04x} value {v}");
            }
        }
        assert_eq!(decode(0x7E), 448.0);
        assert_eq!(decode(0x08), crate::codec::pow2(-6));
        assert_eq!(MAX_RCP, (1.0f64 / 448.0) as f32);
    }

    #[test]
    fn ties_and_subnormals() {
        // 2^-10 is half of the smallest subnormal: tie -> even (0).
        assert_eq!(encode(crate::codec::pow2(-10)), 0x00);
        assert_eq!(
            encode(f32::from_bits(crate::codec::pow2(-10).to_bits() + 1)),
            0x01
        );
        // 3 * 2^-10 is halfway between codes 1 and 2: tie -> 2.
        assert_eq!(encode(3.0 * crate::codec::pow2(-10)), 0x02);
        // halfway between the largest subnormal (7*2^-9) and the smallest normal (8*2^-9)
        assert_eq!(encode(7.5 * crate::codec::pow2(-9)), 0x08);
        // 464 is halfway between 448 and the (NaN) next code: saturates.
        assert_eq!(encode(464.0), 0x7E);
        assert_eq!(encode(-460.0), 0xFE);
        // 17 is halfway between 16 (0x58) and 18 (0x59): tie -> even 16.
        assert_eq!(encode(17.0), 0x58);
        assert_eq!(encode(19.0), 0x5A);
    }
}
