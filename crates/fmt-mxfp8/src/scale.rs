//! Element types and the two block-scale rules (amax -> E8M0 code -> multiplier).
//!
//! | | [`ScaleRule::Te`] (default) | [`ScaleRule::Ocp`] |
//! |---|---|---|
//! | source | TE `quantize_mxfp8.cuh` + `ptx_arch_spec.cuh::float_to_e8m0` | OCP MX v1.0 §6.3, as torchao `to_mx(.., FLOOR)` computes it |
//! | block amax | `max(|x|)` from 0, **NaN ignored** (`fmaxf`/`__hmax`) | `max(|x|)`, **NaN and inf propagate** (`torch.amax`) |
//! | code | `ceil(log2(amax * float(1/max)))` + 127, via [`e8m0::from_f32_ceil`] | `floor(log2(amax)) - emax_elem` + 127, clamped to `>= 0` |
//! | amax = 0 or tiny | `0x00` (2^-127) | `0x00` |
//! | amax = inf | `0xFE` (2^127): finite elements become `fp8(x * 2^-127)`, inf saturates | `0xFF` (NaN): the whole block is NaN |
//! | NaN element | ignored by the scale, element encodes to `0x7F` | `0xFF`: the whole block is NaN |
//! | block max after scaling | `<= max` always: never clips | in `[2^emax, 2^(emax+1))`: may exceed `max` and clip |
//!
//! Both rules then compute `q = fp8(x * 2^(127 - code))` (TE `exp2f_rcp`, one IEEE f32
//! multiply) with round-to-nearest-even and saturation to the finite range.
//!
//! Where the codes differ (finite blocks): `max = 1.75 * 2^emax` for both element types,
//! so write `amax = f * 2^e` with `1 <= f < 2`. The OCP code is `127 + e - emax`; the TE
//! code is the same when `f <= 1.75` and **one higher when `f > 1.75`** — exactly the
//! blocks whose max the OCP scale would leave in `(max, 2^(emax+1))`, where it clips. The
//! only other difference is at the bottom, where both clamp to code 0 (2^-127). Example,
//! E4M3 `amax = 460` (`f = 1.797`): TE code 128 (scale 2, 460 -> 230, stored as 224 =
//! `0x76`), OCP code 127 (scale 1, 460 clips to 448 = `0x7E`); `amax = 300` gives code 127
//! under both.
//!
//! ```
//! use fmt_mxfp8::{Mxfp8Dtype, ScaleRule};
//! let e4 = Mxfp8Dtype::E4M3;
//! assert_eq!(ScaleRule::Te.code(460.0, e4), 128);   // scale 2: 460/2 = 230 fits
//! assert_eq!(ScaleRule::Ocp.code(460.0, e4), 127);  // scale 1: 460 clips to 448
//! assert_eq!(ScaleRule::Te.code(448.0, e4), 127);
//! assert_eq!(ScaleRule::Ocp.code(448.0, e4), 127);  // floor(log2 448) - 8 = 0
//! assert_eq!(ScaleRule::Te.code(0.0, e4), 0);
//! assert_eq!(ScaleRule::Te.code(f32::INFINITY, e4), 0xFE);
//! assert_eq!(ScaleRule::Ocp.code(f32::INFINITY, e4), 0xFF);
//! ```

use std::fmt;
use std::str::FromStr;

use quant_core::block_max::NanRule;
use quant_core::codec::pow2::Fp8;
use quant_core::codec::{e4m3, e5m2, e8m0};
use quant_core::{Element, Error, Result};
use serde::{Deserialize, Serialize};

/// Elements per scale block (both directions) and the edge of a 2-D tile.
pub const BLOCK: usize = 32;

/// The 8-bit element format of an MXFP8 tensor.
///
/// ```
/// use fmt_mxfp8::Mxfp8Dtype;
/// assert_eq!(Mxfp8Dtype::E4M3.max(), 448.0);
/// assert_eq!(Mxfp8Dtype::E4M3.max_rcp().to_bits(), 0x3B12_4925);
/// assert_eq!(Mxfp8Dtype::E5M2.max_rcp().to_bits(), 0x3792_4925);
/// assert_eq!(Mxfp8Dtype::E5M2.emax(), 15);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mxfp8Dtype {
    /// E4M3 (`e4m3fn`), max 448: TE's default for every tensor.
    #[default]
    E4M3,
    /// E5M2, max 57344: gradients under TE's HYBRID recipe.
    E5M2,
}

impl Mxfp8Dtype {
    /// Largest finite value (448 or 57344, hard-coded).
    pub const fn max(self) -> f32 {
        match self {
            Mxfp8Dtype::E4M3 => e4m3::MAX,
            Mxfp8Dtype::E5M2 => e5m2::MAX,
        }
    }

    /// `float(1/max)` as TE's `Quantized_Limits::max_norm_rcp` holds it
    /// (`0x3B124925` / `0x37924925`); the TE rule multiplies by it, never divides.
    pub const fn max_rcp(self) -> f32 {
        match self {
            Mxfp8Dtype::E4M3 => e4m3::MAX_RCP,
            Mxfp8Dtype::E5M2 => e5m2::MAX_RCP,
        }
    }

    /// `emax_elem` of the OCP spec: the exponent of the largest normal power of two
    /// (E4M3 `2^8 = 256`, E5M2 `2^15 = 32768`).
    pub const fn emax(self) -> u32 {
        match self {
            Mxfp8Dtype::E4M3 => 8,
            Mxfp8Dtype::E5M2 => 15,
        }
    }

    /// f32 -> code with round-to-nearest-even and saturation to ±max (infinity too);
    /// NaN -> `0x7F`.
    #[inline(always)]
    pub fn encode(self, x: f32) -> u8 {
        match self {
            Mxfp8Dtype::E4M3 => e4m3::encode(x),
            Mxfp8Dtype::E5M2 => e5m2::encode(x),
        }
    }

    /// The element type as the bf16 power-of-two encoder sees it
    /// ([`quant_core::codec::pow2`]).
    ///
    /// ```
    /// use fmt_mxfp8::Mxfp8Dtype;
    /// use quant_core::codec::pow2::Fp8;
    /// assert_eq!(Mxfp8Dtype::E5M2.pow2_codec(), Fp8::E5M2);
    /// ```
    pub const fn pow2_codec(self) -> Fp8 {
        match self {
            Mxfp8Dtype::E4M3 => Fp8::E4M3,
            Mxfp8Dtype::E5M2 => Fp8::E5M2,
        }
    }

    /// The exact 256-entry decoding table.
    #[inline(always)]
    pub fn decode_table(self) -> &'static [f32; 256] {
        match self {
            Mxfp8Dtype::E4M3 => &e4m3::DECODE,
            Mxfp8Dtype::E5M2 => &e5m2::DECODE,
        }
    }

    /// Lower-case name (`e4m3`, `e5m2`).
    pub const fn name(self) -> &'static str {
        match self {
            Mxfp8Dtype::E4M3 => "e4m3",
            Mxfp8Dtype::E5M2 => "e5m2",
        }
    }
}

impl fmt::Display for Mxfp8Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mxfp8Dtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "e4m3" | "e4m3fn" => Ok(Mxfp8Dtype::E4M3),
            "e5m2" => Ok(Mxfp8Dtype::E5M2),
            _ => Err(Error::invalid("mxfp8 dtype", s, "must be e4m3 or e5m2")),
        }
    }
}

/// How a block's E8M0 scale is derived from its elements. See the [module docs](self)
/// for the side-by-side table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleRule {
    /// TransformerEngine (and cuBLAS "RCEIL"): NaN-ignoring amax, `val = amax * float(1/max)`
    /// rounded **up** to a power of two, so the block max never clips.
    #[default]
    Te,
    /// OCP MX v1.0 reference rule, byte-identical with torchao's
    /// `to_mx(.., ScaleCalculationMode.FLOOR)`: `floor(log2(amax)) - emax_elem`, clamped to
    /// the E8M0 range; a block holding NaN or inf gets the NaN scale `0xFF`.
    Ocp,
}

impl ScaleRule {
    /// The ordering key of one element for the block max: `|x|` as its f32 bit pattern
    /// (non-negative floats order like their bits). The TE rule maps NaN to 0, so NaN
    /// never wins (`fmaxf` semantics); the OCP rule keeps NaN above infinity, so it
    /// propagates (`torch.amax` semantics).
    #[inline(always)]
    pub fn key(self, x: f32) -> u32 {
        self.nan_rule().key(x)
    }

    /// How the rule's block max treats NaN: ignored (TE) or winning (OCP).
    ///
    /// ```
    /// use fmt_mxfp8::ScaleRule;
    /// use quant_core::block_max::NanRule;
    /// assert_eq!(ScaleRule::Te.nan_rule(), NanRule::Ignore);
    /// assert_eq!(ScaleRule::Ocp.nan_rule(), NanRule::Propagate);
    /// ```
    #[inline(always)]
    pub const fn nan_rule(self) -> NanRule {
        match self {
            ScaleRule::Te => NanRule::Ignore,
            ScaleRule::Ocp => NanRule::Propagate,
        }
    }

    /// The block amax under this rule (TE: starts at 0, NaN ignored; OCP: NaN wins).
    ///
    /// ```
    /// use fmt_mxfp8::ScaleRule;
    /// assert_eq!(ScaleRule::Te.amax(&[1.0f32, f32::NAN, -3.0]), 3.0);
    /// assert!(ScaleRule::Ocp.amax(&[1.0f32, f32::NAN, -3.0]).is_nan());
    /// assert_eq!(ScaleRule::Te.amax(&[f32::NAN]), 0.0);
    /// ```
    #[inline]
    pub fn amax<T: Element>(self, xs: &[T]) -> f32 {
        f32::from_bits(xs.iter().fold(0u32, |m, v| m.max(self.key(v.to_f32()))))
    }

    /// The E8M0 code of a block whose amax (under this rule) is `amax`.
    #[inline(always)]
    pub fn code(self, amax: f32, dtype: Mxfp8Dtype) -> u8 {
        match self {
            // TE: one IEEE multiply by float(1/max), then round up to a power of two.
            ScaleRule::Te => e8m0::from_f32_ceil(amax * dtype.max_rcp()),
            ScaleRule::Ocp => {
                if !amax.is_finite() {
                    return 0xFF;
                }
                // floor(log2(amax)) + 127 is amax's biased exponent field (0 for zero and
                // subnormals, where the spec's -inf / < -126 clamps to -127 anyway);
                // subtracting emax and clamping at code 0 (2^-127) is the spec's clamp.
                // The upper clamp cannot trigger: 254 - emax < 254.
                let biased = u32::from(e8m0::from_f32_floor(amax));
                biased.saturating_sub(dtype.emax()) as u8
            }
        }
    }

    /// Lower-case name (`te`, `ocp`).
    pub const fn name(self) -> &'static str {
        match self {
            ScaleRule::Te => "te",
            ScaleRule::Ocp => "ocp",
        }
    }
}

impl fmt::Display for ScaleRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The quantization multiplier of a code: `2^(127 - code)` (TE `exp2f_rcp`; `0xFE` ->
/// `2^-127`, `0xFF` -> NaN).
#[inline(always)]
pub fn multiplier(code: u8) -> f32 {
    e8m0::exp2_rcp(code)
}

/// The dequantization scale of a code: `2^(code - 127)` (TE `exp2f`; `0x00` -> `2^-127`,
/// `0xFF` -> NaN).
#[inline(always)]
pub fn scale(code: u8) -> f32 {
    e8m0::decode(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `2^k` (normal range) from its bits: exact, unlike `powi`, whose precision Rust
    /// leaves open (Miri, `scripts/miri.sh`, models that with random ULP errors).
    fn pow2(k: i32) -> f32 {
        f32::from_bits(((k + 127) as u32) << 23)
    }

    #[test]
    fn te_rule_edges() {
        let e4 = Mxfp8Dtype::E4M3;
        let te = ScaleRule::Te;
        assert_eq!(te.code(f32::NAN, e4), 0xFF);
        assert_eq!(te.code(f32::MAX, e4), 247); // ceil(log2(2^128 / 448)) = 120
        // Exactly 448 * 2^k is a power of two after the multiply: no round-up.
        for k in -100..100 {
            let amax = 448.0 * pow2(k);
            assert_eq!(i32::from(te.code(amax, e4)), 127 + k, "k={k}");
            let up = f32::from_bits(amax.to_bits() + 1);
            assert_eq!(i32::from(te.code(up, e4)), 128 + k, "k={k}");
        }
        // E5M2 boundary.
        assert_eq!(te.code(57344.0, Mxfp8Dtype::E5M2), 127);
        assert_eq!(te.code(57345.0, Mxfp8Dtype::E5M2), 128);
        // A subnormal amax: val <= 2^-127 -> 0.
        assert_eq!(te.code(1e-40, e4), 0);
    }

    #[test]
    fn ocp_rule_edges() {
        let e4 = Mxfp8Dtype::E4M3;
        let ocp = ScaleRule::Ocp;
        assert_eq!(ocp.code(0.0, e4), 0);
        assert_eq!(ocp.code(1e-40, e4), 0);
        assert_eq!(ocp.code(f32::from_bits(8 << 23), e4), 0); // floor = -119, -127 after emax
        assert_eq!(ocp.code(f32::from_bits(9 << 23), e4), 1);
        assert_eq!(ocp.code(256.0, e4), 127);
        assert_eq!(ocp.code(511.9, e4), 127);
        assert_eq!(ocp.code(512.0, e4), 128);
        assert_eq!(ocp.code(f32::MAX, e4), 254 - 8);
        assert_eq!(ocp.code(f32::NAN, e4), 0xFF);
        assert_eq!(ocp.code(32768.0, Mxfp8Dtype::E5M2), 127);
        assert_eq!(ocp.code(65535.0, Mxfp8Dtype::E5M2), 127);
    }

    #[test]
    fn rules_differ_exactly_above_significand_1_75() {
        for dt in [Mxfp8Dtype::E4M3, Mxfp8Dtype::E5M2] {
            let top = pow2(dt.emax() as i32);
            for bits in (0x0900_0000u32..0x7F00_0000).step_by(40_009) {
                let a = f32::from_bits(bits);
                let te = ScaleRule::Te.code(a, dt);
                let ocp = ScaleRule::Ocp.code(a, dt);
                // TE never leaves the scaled max above max; OCP leaves it in [2^emax, 2^(emax+1)).
                assert!(a * multiplier(te) <= dt.max());
                let scaled = a * multiplier(ocp);
                assert!((top..2.0 * top).contains(&scaled), "{a} {scaled}");
                let f = f32::from_bits((bits & 0x007F_FFFF) | 0x3F80_0000);
                let want = if f > 1.75 { ocp + 1 } else { ocp };
                assert_eq!(te, want, "{dt} amax {a}");
            }
        }
    }

    #[test]
    fn amax_keys() {
        assert_eq!(ScaleRule::Te.amax(&[f32::NEG_INFINITY, 1.0]), f32::INFINITY);
        assert_eq!(
            ScaleRule::Ocp.amax(&[f32::NEG_INFINITY, 1.0]),
            f32::INFINITY
        );
        assert_eq!(ScaleRule::Te.amax(&[-0.0f32]).to_bits(), 0);
        assert_eq!(ScaleRule::Te.amax::<f32>(&[]), 0.0);
    }
}
