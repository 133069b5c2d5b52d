//! Shared round-to-nearest-even, saturate-to-finite f32 -> 8-bit float encoder.
//!
//! Both FP8 formats are handled by one routine parametrised by mantissa width and
//! exponent bias. The trick that keeps it branch-light: below the smallest normal the
//! code is simply `rne(|x| * 2^(bias - 1 + mbits))`, and that integer continues
//! seamlessly into the normal codes (code `1 << mbits` is the smallest normal), so a
//! subnormal that rounds up to the smallest normal needs no special case.

/// Branchless form of [`encode`], written so loops over it vectorize (integer adds,
/// selects and one float multiply-add; no data-dependent branches). Identical results on
/// every input (tested over all bf16/f16 patterns, every rounding boundary and a strided
/// sweep of all f32 patterns).
///
/// * normal targets: rebase the exponent, then round to nearest even with the integer
///   trick `(n + half - 1 + lsb) >> shift` (a carry rolls into the exponent as it must);
/// * subnormal targets: `|x| * 2^(bias-1+mbits)` is exact and below `2^mbits`, so adding
///   `2^23` rounds it to an integer (RNE) in the float unit; the low bits are the code;
/// * saturation: one integer `min` with `max_code`. Rounding is monotonic and `max`
///   itself encodes to `max_code`, so every finite `|x| >= max` and infinity get a code
///   at or above it (the NaN or infinity codes, or the exponent overflowing past them)
///   and only those do: no float compare against `max` is needed.
#[inline(always)]
pub(crate) fn encode_fast<const MBITS: u32, const BIAS: i32>(x: f32, max_code: u8) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let abits = bits & 0x7FFF_FFFF;
    let a = f32::from_bits(abits);
    let shift = 23 - MBITS;
    let n = abits.wrapping_sub(((127 - BIAS) as u32) << 23);
    let lsb = (n >> shift) & 1;
    let norm = n.wrapping_add((1 << (shift - 1)) - 1 + lsb) >> shift;
    let scale = f32::from_bits(((127 + BIAS - 1 + MBITS as i32) as u32) << 23);
    let sub = (a * scale + 8_388_608.0)
        .to_bits()
        .wrapping_sub(0x4B00_0000);
    let min_normal = ((128 - BIAS) as u32) << 23;
    let code = if abits < min_normal { sub } else { norm };
    let out = sign | code.min(u32::from(max_code));
    (if abits > 0x7F80_0000 { 0x7F } else { out }) as u8
}

/// Encodes `x` to an FP8 code with `MBITS` mantissa bits and exponent bias `BIAS`.
///
/// * NaN -> `0x7F` (the canonical NaN CUDA's host conversion produces).
/// * `|x| >= max` (including infinity) -> `sign | max_code` (satfinite).
/// * otherwise round to nearest, ties to even, at the target precision, keeping the sign
///   of values that round to zero.
#[inline(always)]
pub(crate) fn encode<const MBITS: u32, const BIAS: i32>(x: f32, max: f32, max_code: u8) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abits = bits & 0x7FFF_FFFF;
    if abits > 0x7F80_0000 {
        return 0x7F;
    }
    let a = f32::from_bits(abits);
    if a >= max {
        return sign | max_code;
    }
    let f32_exp = (abits >> 23) as i32;
    // f32 biased exponent of the target's smallest normal 2^(1 - BIAS).
    let min_normal_exp = 128 - BIAS;
    let code = if f32_exp < min_normal_exp {
        // Exact power-of-two scaling, then exact integer rounding.
        let scale = f32::from_bits(((127 + BIAS - 1 + MBITS as i32) as u32) << 23);
        (a * scale).round_ties_even() as u32
    } else {
        let shift = 23 - MBITS;
        let mant = abits & 0x007F_FFFF;
        let base = (((f32_exp - 127 + BIAS) as u32) << MBITS) | (mant >> shift);
        let rem = mant & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        base + u32::from(rem > half || (rem == half && base & 1 == 1))
    };
    sign | (code.min(u32::from(max_code)) as u8)
}

/// Decodes an FP8 code (sign, `8-1-MBITS` exponent bits, `MBITS` mantissa bits).
/// `nan(code)` decides which codes are NaN; `inf(code)` which are infinite.
pub(crate) const fn decode<const MBITS: u32, const BIAS: i32>(
    code: u8,
    nan: bool,
    inf: bool,
) -> f32 {
    let neg = code & 0x80 != 0;
    let mag = if nan {
        f32::NAN
    } else if inf {
        f32::INFINITY
    } else {
        let e = ((code & 0x7F) >> MBITS) as i32;
        let m = (code as u32) & ((1 << MBITS) - 1);
        if e == 0 {
            // m * 2^(1 - BIAS - MBITS), built from bits (exact).
            let unit = f32::from_bits(((127 + 1 - BIAS - MBITS as i32) as u32) << 23);
            m as f32 * unit
        } else {
            f32::from_bits((((e - BIAS + 127) as u32) << 23) | (m << (23 - MBITS)))
        }
    };
    if neg { -mag } else { mag }
}
