//! E8M0: an unsigned power-of-two scale, `2^(code - 127)`; `0xFF` is NaN.
//!
//! Two rules turn a real scale into an exponent, and they differ on purpose:
//!
//! * [`from_f32_ceil`]: TransformerEngine's `float_to_e8m0` (and Blackwell's
//!   `cvt.rp.satfinite.ue8m0x2.f32`): round **up** to a power of two, so the block max
//!   never clips. `0 -> 0x00`, `inf -> 0xFE`, `NaN -> 0xFF`.
//! * [`from_f32_floor`]: the OCP MX v1.0 reference rule, `floor(log2(x))`, which can
//!   leave the block max above the element format's max (it is then clipped).
//!
//! ```
//! use quant_core::codec::e8m0;
//! assert_eq!(e8m0::from_f32_ceil(1.0), 127);
//! assert_eq!(e8m0::from_f32_ceil(1.5), 128);     // rounds up to 2
//! assert_eq!(e8m0::from_f32_floor(1.5), 127);    // rounds down to 1
//! assert_eq!(e8m0::decode(128), 2.0);
//! assert_eq!(e8m0::decode(0), f32::from_bits(0x0040_0000)); // 2^-127
//! ```

/// `2^(code - 127)` as TransformerEngine's `exp2f(e)` computes it: `bits(code << 23)`,
/// except `0 -> 2^-127` (subnormal `0x00400000`) and `0xFF -> NaN`.
#[inline(always)]
pub fn decode(code: u8) -> f32 {
    match code {
        0 => f32::from_bits(0x0040_0000),
        0xFF => f32::NAN,
        c => f32::from_bits(u32::from(c) << 23),
    }
}

/// `2^(127 - code)`, the quantization multiplier (TE `exp2f_rcp`): bits `(254 - code) << 23`,
/// with `254 -> 2^-127` (`0x00400000`) and `0xFF -> NaN`.
#[inline(always)]
pub fn exp2_rcp(code: u8) -> f32 {
    match code {
        0xFF => f32::NAN,
        0xFE => f32::from_bits(0x0040_0000),
        c => f32::from_bits(u32::from(254 - c) << 23),
    }
}

/// TransformerEngine's rule: the smallest power of two `>= |val|`, saturating at `2^127`.
/// The sign is ignored (TE only passes non-negative values: an amax times `1/max`).
///
/// Written without branches (selects on the bits), so that a kernel's loop over a span's
/// block maxima vectorizes: per-block scalar branches were a tenth of the MXFP8
/// quantize profile. A test compares it with the branching form on every f32.
///
/// ```
/// use quant_core::codec::e8m0::from_f32_ceil;
/// assert_eq!(from_f32_ceil(3.0), 129); // 4 = 2^(129 - 127)
/// assert_eq!(from_f32_ceil(0.0), 0);
/// assert_eq!(from_f32_ceil(f32::INFINITY), 0xFE);
/// assert_eq!(from_f32_ceil(f32::NAN), 0xFF);
/// ```
#[inline(always)]
pub fn from_f32_ceil(val: f32) -> u8 {
    let abs = val.to_bits() & 0x7FFF_FFFF;
    let (exp, man) = (abs >> 23, abs & 0x7F_FFFF);
    // Up one power unless exact, already at 2^127, or a subnormal of at most 2^-127.
    let up = (man != 0) & (exp != 0xFE) & !((exp == 0) & (man <= 0x40_0000));
    let finite = exp + u32::from(up);
    let special = if man == 0 { 0xFE } else { 0xFF };
    (if exp == 0xFF { special } else { finite }) as u8
}

/// The OCP rule: `floor(log2(val))` as a biased exponent, clamped to `[0, 0xFE]`.
/// `0 -> 0x00`, `inf -> 0xFE`, `NaN -> 0xFF`. The sign of `val` is ignored.
#[inline(always)]
pub fn from_f32_floor(val: f32) -> u8 {
    if val.is_nan() {
        return 0xFF;
    }
    let bits = val.to_bits() & 0x7FFF_FFFF;
    let exp = bits >> 23;
    // Subnormals (exp 0) have floor(log2) < -126; their biased exponent clamps to 0.
    exp.min(0xFE) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_rule_edges() {
        assert_eq!(from_f32_ceil(f32::NAN), 0xFF);
        assert_eq!(from_f32_ceil(f32::INFINITY), 0xFE);
        assert_eq!(from_f32_ceil(f32::MAX), 0xFE);
        assert_eq!(from_f32_ceil(crate::codec::pow2(127)), 0xFE);
        assert_eq!(from_f32_ceil(f32::from_bits(0x0040_0000)), 0);
        assert_eq!(from_f32_ceil(f32::from_bits(0x0040_0001)), 1);
        assert_eq!(from_f32_ceil(f32::from_bits(1)), 0);
        // amax = 460 with E4M3: 460/448 > 1 -> scale 2 (TE), OCP would give scale 1 and clip.
        assert_eq!(from_f32_ceil(460.0 * super::super::e4m3::MAX_RCP), 128);
    }

    /// The branching statement of the ceil rule, as TE writes it.
    fn ceil_branching(val: f32) -> u8 {
        if val.is_nan() {
            return 0xFF;
        }
        if val.is_infinite() {
            return 0xFE;
        }
        if val == 0.0 {
            return 0x00;
        }
        let bits = val.to_bits();
        let mut exp = (bits >> 23) & 0xFF;
        let man = bits & 0x7F_FFFF;
        if man > 0 && exp != 0xFE && !(exp == 0 && man <= 0x40_0000) {
            exp += 1;
        }
        exp as u8
    }

    /// Every exponent with mantissas at and around each edge, both signs, and a strided
    /// sweep of all patterns; the ignored test below covers all 2^32.
    #[test]
    fn branchless_ceil_equals_the_branching_rule() {
        for hi in 0u32..512 {
            for man in [
                0u32, 1, 0x3F_FFFF, 0x40_0000, 0x40_0001, 0x7F_FFFE, 0x7F_FFFF,
            ] {
                let v = f32::from_bits(hi << 23 | man);
                assert_eq!(from_f32_ceil(v), ceil_branching(v), "{:#010x}", v.to_bits());
            }
        }
        for b in (0..=u32::MAX).step_by(4093) {
            let v = f32::from_bits(b);
            assert_eq!(from_f32_ceil(v), ceil_branching(v), "{b:#010x}");
        }
    }

    /// All 2^32 patterns (a few seconds in release):
    /// `cargo test --release -p quant-core e8m0 -- --ignored`.
    #[test]
    #[ignore = "exhaustive; run on demand in release"]
    fn branchless_ceil_equals_the_branching_rule_everywhere() {
        for b in 0..=u32::MAX {
            let v = f32::from_bits(b);
            assert_eq!(from_f32_ceil(v), ceil_branching(v), "{b:#010x}");
        }
    }

    #[test]
    fn every_code_decodes_to_its_power() {
        for c in 1..=254u8 {
            assert_eq!(decode(c), crate::codec::pow2(i32::from(c) - 127));
            assert_eq!(from_f32_ceil(decode(c)), c);
            assert_eq!(from_f32_floor(decode(c)), c);
            assert_eq!(exp2_rcp(c) as f64 * decode(c) as f64, 1.0);
        }
        assert!(decode(255).is_nan());
        assert_eq!(exp2_rcp(0), crate::codec::pow2(127));
    }
}
