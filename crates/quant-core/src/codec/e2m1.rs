//! E2M1 (FP4): sign bit 3, codes 0..7 = {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
//!
//! Encoding is PTX `cvt.rn.satfinite.e2m1x2.f32`: round to nearest on the grid with
//! ties to the even code, saturate to ±6. Following NVIDIA's host emulation of that
//! instruction (`cuda_fp4.hpp`), `-0.0` (and any negative value rounding to zero) keeps
//! its sign (code `0x8`) and every NaN becomes `+6` (code `0x7`).
//!
//! Two values share a byte: **element `2i` in the low nibble, `2i+1` in the high
//! nibble** (TransformerEngine, ModelOpt, compressed-tensors, torchao MX all agree).
//!
//! ```
//! use quant_core::codec::e2m1;
//! assert_eq!(e2m1::encode(2.5), 0x4);   // tie between 2 (code 4) and 3 (code 5) -> even
//! assert_eq!(e2m1::encode(-7.0), 0xF);  // saturates to -6
//! assert_eq!(e2m1::encode(f32::NAN), 0x7);
//! assert_eq!(e2m1::pack(0x1, 0xF), 0xF1);
//! assert_eq!(e2m1::decode(0xB), -1.5);
//! ```

/// Largest magnitude.
pub const MAX: f32 = 6.0;

/// The eight magnitudes, indexed by code.
pub const GRID: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Decoding table for all 16 codes.
pub const DECODE: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// f32 -> 4-bit code, round to nearest even on the grid, saturating; NaN -> 7.
///
/// Branchless integer arithmetic, so loops vectorize. From 1 up the grid is the
/// floating-point format itself (exponent bias 1, one mantissa bit): rebias the f32
/// exponent and round the 22 dropped mantissa bits to nearest even in one add, which
/// carries into the exponent where it should; codes past 7 (6.0 and up, infinity)
/// saturate with one `min`. Below 1 the grid is `{0, 0.5, 1}`: `2|x|` is exact and the
/// `2^23` add rounds it to an integer, ties to even. About two thirds of the vector
/// operations of a seven-threshold count.
#[inline(always)]
pub fn encode(x: f32) -> u8 {
    let bits = x.to_bits();
    let abits = bits & 0x7FFF_FFFF;
    let n = abits.wrapping_sub(126 << 23);
    let norm = n.wrapping_add((1 << 21) - 1 + ((n >> 22) & 1)) >> 22;
    let sub = (f32::from_bits(abits) * 2.0 + 8_388_608.0)
        .to_bits()
        .wrapping_sub(0x4B00_0000);
    let code = if abits < 0x3F80_0000 { sub } else { norm }.min(7);
    let sign = (bits >> 28) & 0x8;
    (if abits > 0x7F80_0000 {
        0x7
    } else {
        sign | code
    }) as u8
}

/// The plain scalar specification of [`encode`] (a threshold ladder).
#[inline]
pub fn encode_reference(x: f32) -> u8 {
    let bits = x.to_bits();
    let a = f32::from_bits(bits & 0x7FFF_FFFF);
    if a.is_nan() {
        return 0x7;
    }
    let sign = ((bits >> 28) & 0x8) as u8;
    // Thresholds: `<=` where the tie goes down to an even code, `<` where it goes up.
    let code = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    sign | code
}

/// 4-bit code -> f32 (exact). Only the low nibble of `code` is read.
#[inline(always)]
pub fn decode(code: u8) -> f32 {
    DECODE[(code & 0xF) as usize]
}

/// Branchless form of [`decode`] (no table gather, so loops vectorize): exponent
/// `e = (code >> 1) & 3`, mantissa bit `m`; `e > 0` is `2^(e-1) * (1 + m/2)`, built from
/// its f32 bits, `e = 0` is `m * 0.5`; the sign bit (bit 3) becomes the f32 sign.
///
/// ```
/// use quant_core::codec::e2m1;
/// for c in 0..16u8 {
///     assert_eq!(e2m1::decode_fast(c).to_bits(), e2m1::decode(c).to_bits());
/// }
/// ```
#[inline(always)]
pub fn decode_fast(code: u8) -> f32 {
    let c = u32::from(code);
    let e = (c >> 1) & 3;
    let m = c & 1;
    let normal = ((e + 126) << 23) | (m << 22);
    let sub = m * 0x3F00_0000;
    let bits = if e == 0 { sub } else { normal };
    f32::from_bits(bits | ((c & 8) << 28))
}

/// Packs two codes into a byte: `lo` (element 2i) in bits 0..4, `hi` (element 2i+1) in bits 4..8.
#[inline(always)]
pub fn pack(lo: u8, hi: u8) -> u8 {
    (lo & 0xF) | (hi << 4)
}

/// [`pack`] over a run of codes: `out[j] = pack(codes[2j], codes[2j + 1])`.
///
/// Each pair is read as one little-endian u16 and folded in 16-bit lanes, so the loop
/// vectorizes as plain loads and a narrowing store; a loop over `pair[0]`, `pair[1]`
/// was compiled to stride-2 gathers (a quarter of an NVFP4 quantize profile).
///
/// ```
/// use quant_core::codec::e2m1;
/// let mut out = [0u8; 2];
/// e2m1::pack_slice(&[0x1, 0xF, 0x7, 0x8], &mut out);
/// assert_eq!(out, [0xF1, 0x87]);
/// ```
#[inline(always)]
pub fn pack_slice(codes: &[u8], out: &mut [u8]) {
    for (o, pair) in out.iter_mut().zip(codes.chunks_exact(2)) {
        let w = u16::from_le_bytes([pair[0], pair[1]]);
        *o = ((w & 0x0F) | ((w >> 4) & 0xF0)) as u8;
    }
}

/// Unpacks a byte into `(element 2i, element 2i+1)` codes.
#[inline(always)]
pub fn unpack(byte: u8) -> (u8, u8) {
    (byte & 0xF, byte >> 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_slice_is_pack_on_every_pair() {
        let codes: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        let mut out = vec![0u8; codes.len() / 2];
        pack_slice(&codes, &mut out);
        for (o, p) in out.iter().zip(codes.chunks_exact(2)) {
            assert_eq!(*o, pack(p[0], p[1]));
        }
    }

    #[test]
    fn fast_equals_reference_on_a_sweep() {
        let mut i = 0u64;
        while i < (1u64 << 32) {
            let x = f32::from_bits(i as u32);
            assert_eq!(encode(x), encode_reference(x), "{i:#010x}");
            // Miri (scripts/miri.sh) interprets every step: a sparser sweep there.
            i += if cfg!(miri) { 4_194_301 } else { 4099 };
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
    fn grid_round_trips_and_ties() {
        for c in 0..16u8 {
            assert_eq!(encode(decode(c)), c);
        }
        let ties = [
            (0.25, 0),
            (0.75, 2),
            (1.25, 2),
            (1.75, 4),
            (2.5, 4),
            (3.5, 6),
            (5.0, 6),
        ];
        for (v, c) in ties {
            assert_eq!(encode(v), c, "{v}");
            assert_eq!(encode(-v), c | 8, "-{v}");
        }
        assert_eq!(encode(f32::INFINITY), 7);
        assert_eq!(encode(f32::NEG_INFINITY), 15);
        assert_eq!(encode(-f32::NAN), 7);
        assert_eq!(encode(-1e-30), 8);
    }
}
