//! FP8 element types and TransformerEngine's amax -> scale arithmetic.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use quant_core::codec::{e4m3, e5m2};
use quant_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// The 8-bit element format.
///
/// ```
/// use fmt_fp8::Fp8Dtype;
/// assert_eq!(Fp8Dtype::E4M3.max(), 448.0);
/// assert_eq!(Fp8Dtype::E5M2.encode(1e9), 0x7B);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fp8Dtype {
    /// E4M3 (`e4m3fn`), max 448: weights and activations.
    #[default]
    E4M3,
    /// E5M2, max 57344: gradients (TE's HYBRID recipe).
    E5M2,
}

impl Fp8Dtype {
    /// Largest finite value (448 or 57344, hard-coded).
    pub const fn max(self) -> f32 {
        match self {
            Fp8Dtype::E4M3 => e4m3::MAX,
            Fp8Dtype::E5M2 => e5m2::MAX,
        }
    }

    /// f32 -> code, RNE with saturation to finite; NaN -> `0x7F`.
    #[inline(always)]
    pub fn encode(self, x: f32) -> u8 {
        match self {
            Fp8Dtype::E4M3 => e4m3::encode(x),
            Fp8Dtype::E5M2 => e5m2::encode(x),
        }
    }

    /// The element type as the bf16 power-of-two encoder sees it
    /// ([`quant_core::codec::pow2`]).
    ///
    /// ```
    /// use fmt_fp8::Fp8Dtype;
    /// use quant_core::codec::pow2::Fp8;
    /// assert_eq!(Fp8Dtype::E4M3.pow2_codec(), Fp8::E4M3);
    /// ```
    pub const fn pow2_codec(self) -> quant_core::codec::pow2::Fp8 {
        match self {
            Fp8Dtype::E4M3 => quant_core::codec::pow2::Fp8::E4M3,
            Fp8Dtype::E5M2 => quant_core::codec::pow2::Fp8::E5M2,
        }
    }

    /// The 256-entry decoding table.
    #[inline(always)]
    pub fn decode_table(self) -> &'static [f32; 256] {
        match self {
            Fp8Dtype::E4M3 => &e4m3::DECODE,
            Fp8Dtype::E5M2 => &e5m2::DECODE,
        }
    }

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Fp8Dtype::E4M3 => "e4m3",
            Fp8Dtype::E5M2 => "e5m2",
        }
    }
}

impl fmt::Display for Fp8Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fp8Dtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "e4m3" | "e4m3fn" => Ok(Fp8Dtype::E4M3),
            "e5m2" => Ok(Fp8Dtype::E5M2),
            _ => Err(Error::invalid("fp8 dtype", s, "must be e4m3 or e5m2")),
        }
    }
}

/// A non-negative finite f32 floor for amax (TE's `amax_epsilon`), comparable and
/// hashable by its bits so quantizers holding it stay `Eq + Hash`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AmaxEpsilon(f32);

impl AmaxEpsilon {
    /// An epsilon; must be finite and `>= 0`.
    pub fn new(eps: f32) -> Result<AmaxEpsilon> {
        let e = AmaxEpsilon(eps);
        e.validate()?;
        Ok(e)
    }

    /// The value.
    pub fn get(self) -> f32 {
        self.0
    }

    /// Checks the invariant (values deserialized from a file are not trusted).
    pub fn validate(self) -> Result<()> {
        if self.0.is_finite() && self.0 >= 0.0 {
            Ok(())
        } else {
            Err(Error::invalid(
                "amax_epsilon",
                self.0,
                "must be finite and >= 0",
            ))
        }
    }
}

impl PartialEq for AmaxEpsilon {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for AmaxEpsilon {}
impl Hash for AmaxEpsilon {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

/// TransformerEngine's `compute_scale_from_amax` (`common/recipe/recipe_common.cuh`), exactly:
///
/// ```text
/// if amax < eps: amax = eps            # NaN compares false: not clamped
/// if amax is inf, 0 or NaN: return 1
/// scale = max_fp8 / amax               # IEEE division
/// if scale is inf: scale = value_for_inf
/// if pow2: scale = bits(scale) & 0xFF800000   # round down to a power of two
/// ```
///
/// ```
/// use fmt_fp8::compute_scale_from_amax;
/// assert_eq!(compute_scale_from_amax(0.0, 448.0, false, 0.0, f32::MAX), 1.0);
/// assert_eq!(compute_scale_from_amax(3.0, 448.0, true, 0.0, f32::MAX), 128.0);
/// assert_eq!(compute_scale_from_amax(1e-40, 448.0, false, 0.0, f32::MAX), f32::MAX);
/// ```
#[inline(always)]
pub fn compute_scale_from_amax(
    amax: f32,
    max_fp8: f32,
    force_pow2: bool,
    epsilon: f32,
    value_for_inf: f32,
) -> f32 {
    let amax = if amax < epsilon { epsilon } else { amax };
    if amax.is_infinite() || amax == 0.0 || amax.is_nan() {
        return 1.0;
    }
    let mut scale = max_fp8 / amax;
    if scale.is_infinite() {
        scale = value_for_inf;
    }
    if force_pow2 {
        scale = f32::from_bits(scale.to_bits() & 0xFF80_0000);
    }
    scale
}

/// Whether a stored `scale_inv` (per tensor or per block) may be loaded: finite and
/// `>= +0`. TransformerEngine never stores `+0` (an amax of 0 gets scale 1), but
/// checkpoint producers that compute `amax / 448` with no guard do, for an all-zero
/// block or tensor (DeepSeek-style `weight_scale_inv`, ModelOpt FP8). Its values are
/// `code * 0`, what both the producer's dequantization and TE's give, so such a file
/// is read rather than refused. A negative scale (`-0` included) flips signs and a NaN
/// or infinite one poisons every value it scales: those are refused.
///
/// ```
/// use fmt_fp8::valid_scale_inv;
/// assert!(valid_scale_inv(0.5) && valid_scale_inv(0.0));
/// assert!(!valid_scale_inv(-0.0) && !valid_scale_inv(f32::NAN) && !valid_scale_inv(f32::INFINITY));
/// ```
pub fn valid_scale_inv(s: f32) -> bool {
    s.is_finite() && s.is_sign_positive()
}

/// `max(|x|)` ignoring NaN, starting from 0 (CUDA `fmaxf` / `__hmax` semantics).
#[inline]
pub fn amax_of<T: quant_core::Element>(xs: &[T]) -> f32 {
    xs.iter()
        .fold(0.0f32, |m, v| fmax_ignore_nan(m, v.to_f32().abs()))
}

/// `fmaxf(m, a)` for `m >= 0`, `a` possibly NaN: NaN loses (the shared
/// `quant_core::cpu::fmax_nan_loses`, re-exported under the name this crate's callers
/// know; written without a link, which rustdoc 1.95 crashes on for a renamed re-export).
pub use quant_core::cpu::fmax_nan_loses as fmax_ignore_nan;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_edges_follow_the_kernel() {
        let s = |amax, pow2, eps, vinf| compute_scale_from_amax(amax, 448.0, pow2, eps, vinf);
        assert_eq!(s(f32::INFINITY, false, 0.0, f32::MAX), 1.0);
        assert_eq!(s(f32::NAN, false, 0.0, f32::MAX), 1.0);
        assert_eq!(s(f32::NAN, false, 1.0, f32::MAX), 1.0); // NaN is not clamped by eps
        assert_eq!(s(0.0, false, 0.5, f32::MAX), 896.0); // eps floors amax
        assert_eq!(s(1e-45, true, 0.0, f32::MAX).to_bits(), 0x7F00_0000); // 2^127
        assert_eq!(s(1e-45, true, 0.0, 65504.0), 32768.0); // fp16 input: 2^15
        assert_eq!(s(448.0, false, 0.0, f32::MAX), 1.0);
        assert_eq!(s(1000.0, true, 0.0, f32::MAX), 0.25);
    }

    #[test]
    fn amax_ignores_nan() {
        assert_eq!(amax_of(&[1.0f32, f32::NAN, -3.0]), 3.0);
        assert_eq!(amax_of(&[f32::NAN]), 0.0);
        assert_eq!(amax_of(&[f32::NEG_INFINITY]), f32::INFINITY);
    }

    #[test]
    fn epsilon_validated() {
        assert!(AmaxEpsilon::new(-1.0).is_err());
        assert!(AmaxEpsilon::new(f32::NAN).is_err());
        assert_eq!(AmaxEpsilon::new(0.5).unwrap().get(), 0.5);
    }
}
