//! FP8 codes of bf16 values under a power-of-two scale, computed on the bf16 bits.
//!
//! MXFP8 (E8M0 scales) and FP8 blockwise scaling with power-of-two scales (TE's
//! default) encode `fp8(x * 2^k)`. When `x` is a bf16 value, multiplying by `2^k` only
//! moves its exponent, so the FP8 code follows from the 16 input bits and `k` by
//! integer arithmetic in 16-bit lanes: 32 values per AVX-512 vector, where the f32
//! route (widen, multiply, encode) takes 16 per vector and about twice the operations.
//!
//! Per value, with `e` the bf16 exponent field and `m` its 7 mantissa bits:
//!
//! * `e1 = max(e - 1, 0)` and `v = |bits| - (e1 << 7)`: the 8-bit significand, `0x80 | m`
//!   for a normal input and `m` for a subnormal one (which has the exponent of `e = 1`);
//! * the code's significand is `v` shifted right by `s = max(7 - MBITS, D - e1)` with
//!   `D = 134 - BIAS - MBITS - k` (the normal shift, or a longer one below the target's
//!   smallest normal), rounded to nearest even as `(v + 2^(s-1) - 1 + lsb) >> s`. Shifts
//!   are capped at 9, which leaves 0 for every `v < 2^8`, as any longer shift would;
//! * the code's exponent part is `max(e1 - (127 - BIAS - k), 0) << MBITS`; adding the
//!   rounded significand (which still holds the implicit bit) gives the code, a rounding
//!   carry rolling into the exponent as it must, and `min(code, max_code)` saturates;
//! * infinity saturates, NaN gives `0x7F`, and the sign is copied (a zero input gives `+0`
//!   when `plus_zero`, as TE's `fma(x, s, +0)` does).
//!
//! The AVX-512 kernel takes a shortcut for a chunk of 32 values that are all zero or have
//! normal codes (the common case under a block scale): there `e1 >= 127 - BIAS - k`, the
//! shift is always `7 - MBITS`, and the rounding can run on the input bits in place,
//! `(|bits| + 2^(s-1) - 1 + lsb) >> s - ((127 - BIAS - k) << MBITS)`, about half the
//! operations. Any other chunk takes the general steps above.
//!
//! This equals the f32 encoders' `encode(f32(x) * 2^k)` for every bf16 `x` and every `k`
//! in `-127 ..= 126 - BIAS` ([`Fp8::pow2_exact`]); the tests check all 2^16 inputs at
//! every such `k`. Above that range a subnormal input can reach the target's normal
//! range with an unnormalized significand: callers take the f32 route there (a block
//! whose amax is tiny).
//!
//! f16 input has its own kernel ([`Fp8::encode_f16`]): the same in-place rounding where
//! a chunk allows it, the f32 route itself in registers where not.
//!
//! f32 input ([`encode_blocks_f32`], [`Fp8::encode_f32`]) is narrowed to bf16 in the
//! register by rounding to odd, which keeps every code exact (bf16 has two more bits
//! than either FP8 format: the `from_f32` module's docs give the argument), and then
//! takes this kernel: 32 values per vector where the f32 route takes 16.
//!
//! ```
//! use quant_core::codec::{e4m3, pow2::Fp8};
//! let x = half::bf16::from_f32(-3.3);
//! let k = 5; // scale 2^5
//! assert_eq!(Fp8::E4M3.encode(x.to_bits(), k, false), e4m3::encode(x.to_f32() * 32.0));
//! ```
#![allow(unsafe_code)]

use crate::codec::{e4m3, e5m2};
use crate::dtype::Bits16;
use crate::simd::Level;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod decode_avx2;
mod f16;
mod from_f32;

pub use from_f32::{bf16_round_to_odd, encode_blocks_f32};

/// An FP8 element type as the bf16 encoder sees it: mantissa bits, exponent bias and the
/// largest finite code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8 {
    mbits: u32,
    bias: i32,
    max_code: u8,
    /// Exponent of the largest finite value (E4M3 8, E5M2 15).
    emax: i32,
    /// The lowest NaN magnitude code (`0x7F`, `0x7D`).
    nan_from: u8,
    /// The infinity magnitude code (E5M2 `0x7C`); `None` for E4M3, which has none.
    inf_code: Option<u8>,
}

impl Fp8 {
    /// E4M3 (`e4m3fn`): 3 mantissa bits, bias 7, max 448 (`0x7E`).
    pub const E4M3: Fp8 = Fp8 {
        mbits: 3,
        bias: 7,
        max_code: e4m3::MAX_CODE,
        emax: 8,
        nan_from: 0x7F,
        inf_code: None,
    };
    /// E5M2: 2 mantissa bits, bias 15, max 57344 (`0x7B`).
    pub const E5M2: Fp8 = Fp8 {
        mbits: 2,
        bias: 15,
        max_code: e5m2::MAX_CODE,
        emax: 15,
        nan_from: 0x7D,
        inf_code: Some(0x7C),
    };

    /// Mantissa bits (E4M3 3, E5M2 2).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) const fn mbits(self) -> u32 {
        self.mbits
    }

    /// Exponent bias (E4M3 7, E5M2 15).
    ///
    /// ```
    /// use quant_core::codec::pow2::Fp8;
    /// assert_eq!((Fp8::E4M3.bias(), Fp8::E5M2.bias()), (7, 15));
    /// ```
    pub const fn bias(self) -> i32 {
        self.bias
    }

    /// The largest finite magnitude code (E4M3 `0x7E`, E5M2 `0x7B`): every magnitude
    /// above it is NaN or an infinity (what a decoder that leaves those out checks).
    ///
    /// ```
    /// use quant_core::codec::pow2::Fp8;
    /// assert_eq!((Fp8::E4M3.max_code(), Fp8::E5M2.max_code()), (0x7E, 0x7B));
    /// ```
    pub const fn max_code(self) -> u8 {
        self.max_code
    }

    /// Whether [`Fp8::encode`] equals `encode(f32(x) * 2^k)` for every bf16 `x`:
    /// `-127 <= k <= 126 - BIAS` (module docs).
    ///
    /// ```
    /// use quant_core::codec::pow2::Fp8;
    /// assert!(Fp8::E4M3.pow2_exact(119) && !Fp8::E4M3.pow2_exact(120));
    /// assert!(Fp8::E5M2.pow2_exact(-127) && !Fp8::E5M2.pow2_exact(-128));
    /// ```
    #[inline(always)]
    pub const fn pow2_exact(self, k: i32) -> bool {
        k >= -127 && k <= 126 - self.bias
    }

    /// `D` of the module docs: the shift is `max(7 - MBITS, D - e1)`.
    #[inline(always)]
    const fn shift_base(self, k: i32) -> i32 {
        134 - self.bias - self.mbits as i32 - k
    }

    /// `127 - BIAS - k`: `e1` minus this is the code's exponent field (when positive).
    #[inline(always)]
    const fn exp_offset(self, k: i32) -> i32 {
        127 - self.bias - k
    }

    /// The vector kernel's per-block constants for exponent `k`, as 16-bit lane values:
    /// `[normal_from, normal_span, rebias, k]` (module docs). One place for the block
    /// encoder (one `k` broadcast) and [`LaneExps`] (a `k` per lane). `k` is within
    /// `-127..=126-BIAS` ([`Fp8::pow2_exact`]), so the offset is within `1..=254-BIAS`
    /// and every value fits 16 bits.
    // Used by the x86-64 block kernels (and the tests); `LaneExps` uses the 16-bit form.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    #[inline(always)]
    const fn block_consts(self, k: i32) -> [u16; 4] {
        self.block_consts16(k as i16)
    }

    /// [`Fp8::block_consts`] in 16-bit arithmetic (the same values: each fits 16 bits,
    /// and `k as i16` keeps `k`'s low 16 bits, which are all `k as u16` stores). In
    /// [`LaneExps`]' lane loops, built for the baseline x86-64 target, 32-bit lanes made
    /// SSE2 narrow every result with shuffles; 16-bit lanes need none.
    #[inline(always)]
    const fn block_consts16(self, k: i16) -> [u16; 4] {
        let off = (127 - self.bias) as i16 - k;
        [
            ((off + 1) << 7) as u16,
            (0x7F80 - ((off + 1) << 7)) as u16,
            (off << self.mbits) as u16,
            k as u16,
        ]
    }

    /// The code of `bf16::from_bits(bits) * 2^k` (round to nearest even, saturating,
    /// NaN to `0x7F`; a zero input gives `+0` when `plus_zero`), by the integer steps of
    /// the module docs. The scalar specification of the vector kernel;
    /// `k` must satisfy [`Fp8::pow2_exact`] (debug-asserted).
    ///
    /// ```
    /// use quant_core::codec::pow2::Fp8;
    /// let bits = half::bf16::from_f32(1.0).to_bits();
    /// assert_eq!(Fp8::E4M3.encode(bits, 0, false), 0x38); // 1.0
    /// assert_eq!(Fp8::E4M3.encode(bits, 9, false), 0x7E); // 512 saturates to 448
    /// assert_eq!(Fp8::E4M3.encode(0x8000, 0, true), 0x00); // -0 -> +0
    /// ```
    #[inline(always)]
    pub fn encode(self, bits: u16, k: i32, plus_zero: bool) -> u8 {
        debug_assert!(self.pow2_exact(k), "k = {k} outside the exact range");
        let mag = i32::from(bits & 0x7FFF);
        let e1 = ((mag >> 7) - 1).max(0);
        let v = mag - (e1 << 7);
        let s = (self.shift_base(k) - e1).clamp(7 - self.mbits as i32, 9);
        let half_m1 = (1 << (s - 1)) - 1;
        let q = (v + half_m1 + ((v >> s) & 1)) >> s;
        let base = (e1 - self.exp_offset(k)).max(0) << self.mbits;
        let code = if mag >= 0x7F80 {
            i32::from(self.max_code)
        } else {
            (base + q).min(i32::from(self.max_code))
        };
        let sign = if plus_zero && mag == 0 {
            0
        } else {
            i32::from(bits >> 8) & 0x80
        };
        if mag > 0x7F80 {
            0x7F
        } else {
            (code | sign) as u8
        }
    }

    /// `encode(x * 2^k)` through the f32 encoder (a zero input gives `+0` when
    /// `plus_zero`): the reference route that the f16 and f32 kernels' specifications
    /// ([`Fp8::encode_f16`], [`Fp8::encode_f32`]) name. `2^k` must be a normal f32.
    #[inline(always)]
    fn encode_times_pow2(self, x: f32, k: i32, plus_zero: bool) -> u8 {
        let y = if plus_zero && x == 0.0 {
            0.0
        } else {
            x * f32::from_bits(((k + 127) as u32) << 23)
        };
        if self == Fp8::E4M3 {
            e4m3::encode(y)
        } else {
            e5m2::encode(y)
        }
    }

    /// Whether [`Fp8::decode_bf16`] is exact for the scale `2^j`: every nonzero code
    /// times `2^j` stays a normal bf16 (`-127 + BIAS + MBITS <= j <= 127 - EMAX`).
    ///
    /// ```
    /// use quant_core::codec::pow2::Fp8;
    /// assert!(Fp8::E4M3.decode_exact(-117) && !Fp8::E4M3.decode_exact(-118));
    /// assert!(Fp8::E4M3.decode_exact(119) && !Fp8::E4M3.decode_exact(120));
    /// ```
    #[inline(always)]
    pub const fn decode_exact(self, j: i32) -> bool {
        j >= -127 + self.bias + self.mbits as i32 && j <= 127 - self.emax
    }

    /// The bf16 bits of `decode(code) * 2^j` (exact for [`Fp8::decode_exact`] `j`,
    /// debug-asserted), computed on the code's bits: a normal code's magnitude shifted
    /// into place plus the rebiased exponent, a subnormal code's value from a table,
    /// zero kept, infinity (E5M2) and NaN as the f32 route gives them (`0x7F80`,
    /// `0x7FC0`), the sign copied. The scalar specification of the vector kernel.
    ///
    /// ```
    /// use quant_core::codec::pow2::Fp8;
    /// assert_eq!(Fp8::E4M3.decode_bf16(0x38, 3), half::bf16::from_f32(8.0).to_bits()); // 1.0 * 2^3
    /// assert_eq!(Fp8::E4M3.decode_bf16(0x81, 0), half::bf16::from_f32(-0.001953125).to_bits());
    /// ```
    #[inline(always)]
    pub fn decode_bf16(self, code: u8, j: i32) -> u16 {
        debug_assert!(self.decode_exact(j), "j = {j} outside the exact range");
        let mag = code & 0x7F;
        let body = if mag >= self.nan_from {
            0x7FC0
        } else if self.inf_code == Some(mag) {
            0x7F80
        } else if mag == 0 {
            0
        } else if u32::from(mag) < 1 << self.mbits {
            self.subnormal_bits(mag).wrapping_add((j as u16) << 7)
        } else {
            (u16::from(mag) << (7 - self.mbits)).wrapping_add(((127 - self.bias + j) as u16) << 7)
        };
        body | (u16::from(code & 0x80) << 8)
    }

    /// The bf16 bits of subnormal code `m` (`0 < m < 2^MBITS`): `m * 2^(1 - BIAS - MBITS)`,
    /// a normal bf16 value.
    #[inline(always)]
    const fn subnormal_bits(self, m: u8) -> u16 {
        // `m` has at most 3 significant bits: normalize by its leading one.
        let lead = 7 - m.leading_zeros() as i32; // exponent of the leading bit
        let frac = (m as u16) << (7 - lead) & 0x7F;
        let e = 127 + 1 - self.bias - self.mbits as i32 + lead;
        ((e as u16) << 7) | frac
    }
}

/// Which kernel can take a call, if any: `level` where the CPU has it ([`Level::Avx512`],
/// or [`Level::Avx2`] where `avx2` allows it), `block` a nonzero multiple of 32, the
/// source and destination holding `exps.len()` blocks, and `exact` accepting every
/// exponent.
#[inline(always)]
fn runs_fit(
    level: Level,
    avx2: bool,
    (src, dst): (usize, usize),
    block: usize,
    exps: &[i32],
    exact: impl Fn(i32) -> bool,
) -> Option<Level> {
    let fits = block > 0
        && block.is_multiple_of(32)
        && src == exps.len() * block
        && dst == src
        // A fold, not `all`: no early exit, so it vectorizes.
        && exps.iter().fold(true, |ok, &e| ok & exact(e));
    let kernel = match level {
        Level::Avx512 => true,
        Level::Avx2 => avx2,
        Level::Scalar => false,
    };
    (fits && kernel && level.is_supported()).then_some(level)
}

/// `dst[i] = fp8.encode(src[i], ks[i / block], plus_zero)` with AVX-512, 32 values per
/// step ([`Fp8::encode`] for bf16 `src`, [`Fp8::encode_f16`] for f16), or with AVX2, 16
/// per step (f16 widened and rounded to odd into bf16 first, exact for the codes).
/// Returns `false` and writes nothing unless `level` is [`Level::Avx512`] or
/// [`Level::Avx2`] and the CPU has it, `block` is a nonzero multiple of 32, `src` and
/// `dst` hold `ks.len()` blocks, and every `k` satisfies [`Fp8::pow2_exact`] (bf16) or
/// [`Fp8::pow2_exact_f16`] (f16; at AVX2 also [`Fp8::pow2_exact_f32`]); the caller then
/// takes its f32 route. `#[inline(always)]`: call it from a [`crate::simd::dispatch`]ed
/// kernel.
///
/// ```
/// use quant_core::codec::pow2::{Fp8, encode_blocks};
/// use quant_core::dtype::Bits16;
/// use quant_core::simd;
/// let src: Vec<u16> = (0..64u16).map(|i| half::bf16::from_f32(i as f32 - 30.0).to_bits()).collect();
/// let ks = [-2, 3];
/// let mut dst = [0u8; 64];
/// if encode_blocks(simd::level(), Fp8::E4M3, Bits16::Bf16(&src), 32, &ks, false, &mut dst) {
///     for (i, (&d, &s)) in dst.iter().zip(&src).enumerate() {
///         assert_eq!(d, Fp8::E4M3.encode(s, ks[i / 32], false));
///     }
/// }
/// ```
#[inline(always)]
pub fn encode_blocks(
    level: Level,
    fp8: Fp8,
    src: Bits16<'_>,
    block: usize,
    ks: &[i32],
    plus_zero: bool,
    dst: &mut [u8],
) -> bool {
    let kernel = match src {
        Bits16::Bf16(b) => runs_fit(level, true, (b.len(), dst.len()), block, ks, |k| {
            fp8.pow2_exact(k)
        }),
        // AVX2 takes f16 on its fast route or through the bf16 kernel (widened, rounded
        // to odd), within the f32 route's range.
        Bits16::F16(b) => runs_fit(level, true, (b.len(), dst.len()), block, ks, |k| {
            fp8.pow2_exact_f16(k) && (level != Level::Avx2 || fp8.pow2_exact_f32(k))
        }),
    };
    #[cfg(target_arch = "x86_64")]
    {
        match (kernel, src) {
            // SAFETY: the CPU has AVX-512 F and BW (`runs_fit` checked that it has the
            // level, which includes both); the lengths and exponents were checked there,
            // against the range of `src`'s kernel.
            (Some(Level::Avx512), Bits16::Bf16(b)) => unsafe {
                x86::encode_blocks(fp8, b, block, ks, plus_zero, dst)
            },
            // SAFETY: as above.
            (Some(Level::Avx512), Bits16::F16(b)) => unsafe {
                f16::x86::encode_blocks(fp8, b, block, ks, plus_zero, dst)
            },
            // SAFETY: the CPU has AVX2 and F16C (`runs_fit` checked the level, which
            // includes both); the lengths and exponents were checked there.
            (Some(Level::Avx2), Bits16::Bf16(b)) => unsafe {
                avx2::encode_blocks(fp8, b, block, ks, plus_zero, dst)
            },
            // SAFETY: as above; the f16 exponents were checked against both ranges.
            (Some(Level::Avx2), Bits16::F16(b)) => unsafe {
                avx2::encode_blocks_f16(fp8, b, block, ks, plus_zero, dst)
            },
            _ => return false,
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, plus_zero);
        false
    }
}

/// `dst[i] = fp8.decode_bf16(src[i], js[i / block])` with AVX-512 (32 values per step)
/// or AVX2 (16 per step): dequantization to bf16 under power-of-two scales without
/// forming f32 values. Returns `false` and writes nothing unless `level` is
/// [`Level::Avx512`] or [`Level::Avx2`] and the CPU has it, `block` is a nonzero
/// multiple of 32, `src` and `dst` hold `js.len()` blocks, and every `j` satisfies
/// [`Fp8::decode_exact`]; the caller then takes its f32 route.
///
/// ```
/// use quant_core::codec::pow2::{Fp8, decode_blocks};
/// use quant_core::simd;
/// let src: Vec<u8> = (0..64).collect();
/// let mut dst = [0u16; 64];
/// if decode_blocks(simd::level(), Fp8::E4M3, &src, 32, &[-3, 5], &mut dst) {
///     assert_eq!(dst[40], Fp8::E4M3.decode_bf16(40, 5));
/// }
/// ```
#[inline(always)]
pub fn decode_blocks(
    level: Level,
    fp8: Fp8,
    src: &[u8],
    block: usize,
    js: &[i32],
    dst: &mut [u16],
) -> bool {
    let kernel = runs_fit(level, true, (src.len(), dst.len()), block, js, |j| {
        fp8.decode_exact(j)
    });
    #[cfg(target_arch = "x86_64")]
    {
        match kernel {
            // SAFETY: the CPU has AVX-512 F and BW (`runs_fit` checked that it has the
            // level, which includes both); the lengths and exponents were checked there.
            Some(Level::Avx512) => unsafe { x86::decode_blocks(fp8, src, block, js, dst) },
            // SAFETY: the CPU has AVX2 (checked there too), as are the lengths and
            // exponents.
            Some(Level::Avx2) => unsafe { decode_avx2::decode_blocks(fp8, src, block, js, dst) },
            _ => return false,
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = kernel;
        false
    }
}

/// One power-of-two scale per value, given as its biased exponent (an E8M0 code, or the
/// exponent field of an f32 power of two), checked once against [`Fp8::decode_exact`]
/// for the many rows a columnwise dequantization decodes under them (one scale per
/// column, repeated row after row): [`ExactExps::decode`] then writes
/// `dst[i] = fp8.decode_bf16(src[i], exps[i] - 127)` with AVX2, 16 values per step. At
/// AVX-512 the callers' f32 kernels, which narrow with AVX-512 BF16, take these runs.
///
/// ```
/// use quant_core::codec::pow2::{ExactExps, Fp8};
/// use quant_core::simd::Level;
/// use quant_core::stream::StoreMode;
/// let exps: Vec<u8> = (0..40).map(|i| 120 + i % 16).collect();
/// let lanes = ExactExps::new(Fp8::E4M3, &exps).unwrap();
/// let src: Vec<u8> = (0..40).map(|i| i * 6).collect();
/// let mut dst = [half::bf16::ZERO; 40];
/// if lanes.decode(Level::Avx2, &src, &mut dst, StoreMode::Cached) {
///     for i in 0..40 {
///         let want = Fp8::E4M3.decode_bf16(src[i], i32::from(exps[i]) - 127);
///         assert_eq!(dst[i].to_bits(), want);
///     }
/// }
/// // An E8M0 NaN code (255) is no exponent at all.
/// assert!(ExactExps::new(Fp8::E4M3, &[127, 255]).is_none());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ExactExps<'a> {
    fp8: Fp8,
    exps: &'a [u8],
}

impl<'a> ExactExps<'a> {
    /// `exps` where every `exps[i] - 127` satisfies [`Fp8::decode_exact`], else `None`.
    #[inline(always)]
    pub fn new(fp8: Fp8, exps: &'a [u8]) -> Option<ExactExps<'a>> {
        // A fold, not `all`: no early exit, so it vectorizes.
        let exact = exps
            .iter()
            .fold(true, |ok, &e| ok & fp8.decode_exact(i32::from(e) - 127));
        exact.then_some(ExactExps { fp8, exps })
    }

    /// `dst[i] = fp8.decode_bf16(src[i], exps[i] - 127)`, written in `mode`: streamed,
    /// the run's whole lines by streaming stores, and the caller fences them
    /// ([`crate::stream::Fence`]), as [`crate::stream::avx2::write_u16_steps`] does.
    /// Returns `false` and writes nothing unless `T` is bf16, `level` is [`Level::Avx2`]
    /// and the CPU has it, and `src`, `dst` and the exponents have one length; the caller
    /// (generic over its output type) then takes its f32 route.
    #[inline(always)]
    pub fn decode<T: crate::Element>(
        self,
        level: Level,
        src: &[u8],
        dst: &mut [T],
        mode: crate::stream::StoreMode,
    ) -> bool {
        let n = self.exps.len();
        if level != Level::Avx2 || !level.is_supported() || src.len() != n || dst.len() != n {
            return false;
        }
        let Some(dst) = crate::dtype::bf16_slice_bits_mut(dst) else {
            return false;
        };
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the CPU has the AVX2 level's features (checked above), as are the
            // lengths; the exponents were checked by `new`.
            unsafe { decode_avx2::decode_lanes(self.fp8, src, self.exps, dst, mode) };
            true
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (mode, dst, self.fp8);
            false
        }
    }
}

/// One power-of-two scale per lane of a run that repeats row after row: per-column
/// block scales (FP8 1x128 columnwise blocks, MXFP8 columnwise blocks), whose rows are
/// encoded one after another under the same column exponents.
///
/// [`LaneExps::set`] (bf16 rows) or [`LaneExps::set_f16`] (f16 rows) turns the exponents
/// into the vector kernel's per-lane constants once; [`LaneExps::encode`] then encodes
/// any number of rows with them: `dst[j] = fp8.encode(src[j], ks[j], plus_zero)`
/// ([`Fp8::encode`], or [`Fp8::encode_f16`]).
///
/// ```
/// use quant_core::codec::pow2::{Fp8, LaneExps};
/// use quant_core::dtype::Bits16;
/// use quant_core::simd;
/// let ks: Vec<i32> = (0..64).map(|j| j % 9 - 4).collect();
/// let mut lanes = LaneExps::new();
/// assert!(lanes.set(Fp8::E4M3, &ks));
/// let row: Vec<u16> = (0..64u16).map(|i| half::bf16::from_f32(i as f32 - 30.0).to_bits()).collect();
/// let mut codes = [0u8; 64];
/// if lanes.encode(simd::level(), Bits16::Bf16(&row), false, &mut codes) {
///     for j in 0..64 {
///         assert_eq!(codes[j], Fp8::E4M3.encode(row[j], ks[j], false));
///     }
/// }
/// ```
#[derive(Clone, Debug)]
pub struct LaneExps {
    fp8: Fp8,
    /// bf16 rows: per 32-lane vector, four rows of 32 lanes: `normal_from`,
    /// `normal_span`, `rebias` and `k` (the kernel's block constants, module docs), next
    /// to each other so one vector's constants share a few cache lines.
    consts: Vec<[[u16; 32]; 4]>,
    /// f16 rows: the f16 kernels' constants per 32-lane vector (AVX-512's kernel, and
    /// AVX2's fast route).
    f16: Vec<f16::Lanes>,
    /// Whether the lanes were set for f16 rows ([`LaneExps::set_f16`]): `f16` holds
    /// their constants, and `consts` too where AVX2 encodes them (the chunks its fast
    /// route refuses are widened, then run through the bf16 kernel). For bf16 rows `f16`
    /// is empty.
    for_f16: bool,
}

impl Default for LaneExps {
    fn default() -> Self {
        Self::new()
    }
}

impl LaneExps {
    /// No lanes yet ([`LaneExps::encode`] refuses every row until [`LaneExps::set`]).
    pub const fn new() -> Self {
        LaneExps {
            fp8: Fp8::E4M3,
            consts: Vec::new(),
            f16: Vec::new(),
            for_f16: false,
        }
    }

    /// Sets one exponent per lane for bf16 rows (reusing the allocation). `false`,
    /// leaving no lanes, unless `ks.len()` is a nonzero multiple of 32 and every `k`
    /// satisfies [`Fp8::pow2_exact`]; the caller then takes its f32 route.
    pub fn set(&mut self, fp8: Fp8, ks: &[i32]) -> bool {
        self.clear();
        if !lanes_fit(ks, |k| fp8.pow2_exact(k)) {
            return false;
        }
        self.fp8 = fp8;
        self.push_bf16_consts(ks);
        true
    }

    /// No lanes, for either format (the allocations kept).
    fn clear(&mut self) {
        self.consts.clear();
        self.f16.clear();
        self.for_f16 = false;
    }

    /// Appends the f16 kernels' constants of `ks` (whole vectors of 32 lanes; checked
    /// by the caller).
    fn push_f16_lanes(&mut self, ks: &[i32]) {
        let fp8 = self.fp8;
        self.f16.extend(
            ks.chunks_exact(32)
                .filter_map(|v| v.try_into().ok())
                .map(|v| f16::Lanes::new(fp8, v)),
        );
    }

    /// The bf16 kernel's per-lane constants of `ks` (checked by the caller).
    fn push_bf16_consts(&mut self, ks: &[i32]) {
        let fp8 = self.fp8;
        self.consts.extend(ks.chunks_exact(32).map(|v| {
            // Row by row over the lanes (the compiler keeps each row's value of
            // `block_consts16`), so that each row is one vectorized loop.
            let k: [i16; 32] = std::array::from_fn(|l| v[l] as i16);
            std::array::from_fn(|row| k.map(|k| fp8.block_consts16(k)[row]))
        }));
    }

    /// [`LaneExps::set`] for f16 rows encoded at [`Level::Avx512`]: every `k` must
    /// satisfy [`Fp8::pow2_exact_f16`]. [`LaneExps::set_for`] at [`Level::Avx2`] makes
    /// the AVX2 route's lanes instead.
    ///
    /// ```
    /// use quant_core::codec::pow2::{Fp8, LaneExps};
    /// use quant_core::dtype::Bits16;
    /// use quant_core::simd;
    /// let ks: Vec<i32> = (0..32).map(|j| j - 4).collect();
    /// let mut lanes = LaneExps::new();
    /// assert!(lanes.set_f16(Fp8::E5M2, &ks));
    /// let row: Vec<u16> = (0..32).map(|i| half::f16::from_f32(i as f32 * 1e-6).to_bits()).collect();
    /// let mut codes = [0u8; 32];
    /// if lanes.encode(simd::level(), Bits16::F16(&row), false, &mut codes) {
    ///     for j in 0..32 {
    ///         assert_eq!(codes[j], Fp8::E5M2.encode_f16(row[j], ks[j], false));
    ///     }
    /// }
    /// // Rows of the other format are refused.
    /// assert!(!lanes.encode(simd::level(), Bits16::Bf16(&row), false, &mut codes));
    /// ```
    pub fn set_f16(&mut self, fp8: Fp8, ks: &[i32]) -> bool {
        self.clear();
        if !lanes_fit(ks, |k| fp8.pow2_exact_f16(k)) {
            return false;
        }
        self.fp8 = fp8;
        self.for_f16 = true;
        self.push_f16_lanes(ks);
        true
    }

    /// The lanes for rows like `rows` (only the format is read) encoded at `level`:
    /// [`LaneExps::set`] for bf16, [`LaneExps::set_f16`] for f16 (at [`Level::Avx2`] the
    /// lanes of its f16 route, below): for callers that hold bf16 or f16 rows alike.
    ///
    /// ```
    /// use quant_core::codec::pow2::{Fp8, LaneExps};
    /// use quant_core::dtype::Bits16;
    /// use quant_core::simd::Level;
    /// let mut lanes = LaneExps::new();
    /// assert!(lanes.set_for(Level::Avx2, Bits16::F16(&[]), Fp8::E4M3, &[0; 32]));
    /// assert_eq!(lanes.len(), 32);
    /// // Lanes made for AVX-512 lack the constants of AVX2's f16 route, so AVX2 refuses
    /// // them. (Lanes made for AVX2 hold AVX-512's f16 constants too: AVX-512 takes them.)
    /// assert!(lanes.set_for(Level::Avx512, Bits16::F16(&[]), Fp8::E4M3, &[0; 32]));
    /// let row = [0u16; 32];
    /// assert!(!lanes.encode(Level::Avx2, Bits16::F16(&row), false, &mut [0u8; 32]));
    /// ```
    pub fn set_for(&mut self, level: Level, rows: Bits16<'_>, fp8: Fp8, ks: &[i32]) -> bool {
        match (rows, level) {
            (Bits16::Bf16(_), _) => self.set(fp8, ks),
            (Bits16::F16(_), Level::Avx2) => self.set_f16_avx2(fp8, ks),
            (Bits16::F16(_), _) => self.set_f16(fp8, ks),
        }
    }

    /// The lanes of f16 rows at [`Level::Avx2`]: the f16 fast route's constants, and
    /// the bf16 kernel's for the chunks that route refuses, which AVX2 widens (exactly),
    /// narrows to bf16 by rounding to odd ([`bf16_round_to_odd`], exact for the codes
    /// while `k` satisfies [`Fp8::pow2_exact_f32`]) and encodes with those. f16 column
    /// maxima give exponents far inside that range.
    fn set_f16_avx2(&mut self, fp8: Fp8, ks: &[i32]) -> bool {
        self.clear();
        if !lanes_fit(ks, |k| fp8.pow2_exact_f16(k) && fp8.pow2_exact_f32(k)) {
            return false;
        }
        self.fp8 = fp8;
        self.for_f16 = true;
        self.push_bf16_consts(ks);
        // The f16 fast route's constants too (`avx2::encode_lanes_f16`).
        self.push_f16_lanes(ks);
        true
    }

    /// Lanes set (0 before the first successful [`LaneExps::set`]).
    pub fn len(&self) -> usize {
        32 * self.consts.len().max(self.f16.len())
    }

    /// Whether no lanes are set.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether [`LaneExps::encode`] has a kernel at `level` on this CPU: bf16 and f16
    /// rows alike at [`Level::Avx512`] and [`Level::Avx2`] (f16 rows there on the f16
    /// fast route or through the bf16 kernel, [`LaneExps::set_for`]). A caller asks
    /// before it spends the
    /// [`LaneExps::set`].
    ///
    /// ```
    /// use quant_core::codec::pow2::LaneExps;
    /// use quant_core::simd::Level;
    /// assert!(!LaneExps::supports(Level::Scalar));
    /// ```
    #[inline(always)]
    pub fn supports(level: Level) -> bool {
        level != Level::Scalar && level.is_supported()
    }

    /// `dst[j] = fp8.encode(src[j], ks[j], plus_zero)` for one row (for f16 rows
    /// [`Fp8::encode_f16`]), with AVX-512 or AVX2. Returns `false` and writes nothing
    /// unless [`LaneExps::supports`] `level`, the lanes were set for `src`'s
    /// format (f16 rows at AVX2: while [`crate::simd::level`] was AVX2), and `src` and
    /// `dst` both hold [`LaneExps::len`] values (at least one). `#[inline(always)]`:
    /// call it from a [`crate::simd::dispatch`]ed kernel.
    #[inline(always)]
    pub fn encode(&self, level: Level, src: Bits16<'_>, plus_zero: bool, dst: &mut [u8]) -> bool {
        let set_for_src = match (src, level) {
            (Bits16::Bf16(_), _) => !self.for_f16 && !self.consts.is_empty(),
            (Bits16::F16(_), Level::Avx2) => self.for_f16 && !self.consts.is_empty(),
            (Bits16::F16(_), _) => self.for_f16 && !self.f16.is_empty(),
        };
        if !set_for_src
            || src.len() != self.len()
            || dst.len() != self.len()
            || !Self::supports(level)
        {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the CPU has the level (`supports` checked it): AVX-512 F and BW
            // (`Level::Avx512` includes both), or AVX2 with F16C (`Level::Avx2`). Both
            // lengths equal the lanes set for `src`'s format and level, whose exponents
            // `set` or `set_f16` checked (for f16 rows at AVX2 against both ranges).
            unsafe {
                match (level, src) {
                    (Level::Avx2, Bits16::Bf16(b)) => {
                        avx2::encode_lanes(self.fp8, &self.consts, b, plus_zero, dst)
                    }
                    (Level::Avx2, Bits16::F16(b)) => {
                        let lanes = (&self.consts[..], &self.f16[..]);
                        avx2::encode_lanes_f16(self.fp8, lanes, b, plus_zero, dst)
                    }
                    (_, Bits16::Bf16(b)) => {
                        x86::encode_lanes(self.fp8, &self.consts, b, plus_zero, dst)
                    }
                    (_, Bits16::F16(b)) => {
                        f16::x86::encode_lanes(self.fp8, &self.f16, b, plus_zero, dst)
                    }
                }
            };
            true
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = plus_zero;
            false
        }
    }
}

/// Whether `ks` can be a lane set: a nonzero multiple of 32 exponents, each `exact`.
fn lanes_fit(ks: &[i32], exact: impl Fn(i32) -> bool) -> bool {
    !ks.is_empty()
        && ks.len().is_multiple_of(32)
        // A fold, not `all`: no early exit, so it vectorizes.
        && ks.iter().fold(true, |ok, &k| ok & exact(k))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, __m512i, _mm_cvtsi32_si128, _mm256_loadu_si256, _mm256_storeu_si256,
        _mm512_add_epi16, _mm512_and_si512, _mm512_cmpeq_epu16_mask, _mm512_cmpge_epu16_mask,
        _mm512_cmpgt_epu16_mask, _mm512_cmplt_epu16_mask, _mm512_cvtepi16_epi8,
        _mm512_cvtepu8_epi16, _mm512_loadu_si512, _mm512_mask_add_epi16, _mm512_mask_blend_epi16,
        _mm512_mask_cmpge_epu16_mask, _mm512_mask_mov_epi16, _mm512_maskz_loadu_epi32,
        _mm512_maskz_mov_epi16, _mm512_max_epi16, _mm512_min_epi16, _mm512_packus_epi16,
        _mm512_permutexvar_epi16, _mm512_permutexvar_epi64, _mm512_set1_epi16, _mm512_set1_epi32,
        _mm512_setr_epi64, _mm512_slli_epi16, _mm512_sllv_epi16, _mm512_srl_epi16,
        _mm512_srli_epi16, _mm512_srlv_epi16, _mm512_storeu_si512, _mm512_sub_epi16,
        _mm512_subs_epu16, _mm512_ternarylogic_epi32, _mm512_test_epi16_mask,
    };

    use super::Fp8;

    /// `2^(s-1) - 1` at index `s` (the rounding addend of a shift by `s`, `s <= 9`).
    const HALF_M1: [i16; 32] = {
        let mut t = [0i16; 32];
        let mut s = 1;
        while s < 32 {
            t[s] = if s <= 9 { (1 << (s - 1)) - 1 } else { 0 };
            s += 1;
        }
        t
    };

    /// [`super::encode_blocks`] after its checks.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW; `src.len() == dst.len() == ks.len() * block`,
    /// `block` a multiple of 32; every `k` satisfies [`Fp8::pow2_exact`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn encode_blocks(
        fp8: Fp8,
        src: &[u16],
        block: usize,
        ks: &[i32],
        plus_zero: bool,
        dst: &mut [u8],
    ) {
        let c = Consts::new(fp8);
        let consts = |k| fp8.block_consts16(k).map(|v| v as i16);
        store_blocks(
            ks,
            block,
            dst,
            consts,
            Block::of,
            #[inline(always)]
            |blk, j| {
                // SAFETY: `32 * j + 32 <= src.len()` (`store_blocks` asks for chunks below
                // `ks.len() * block / 32`, which is `src.len() / 32`); one unaligned
                // 512-bit load.
                let x = unsafe { _mm512_loadu_si512(src.as_ptr().add(32 * j).cast()) };
                encode32(&c, blk, x, plus_zero)
            },
        );
    }

    /// [`super::LaneExps::encode`] after its checks.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW; `src.len() == dst.len() == 32 * consts.len()`;
    /// `consts` was made by [`super::LaneExps::set`] for `fp8`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn encode_lanes(
        fp8: Fp8,
        consts: &[[[u16; 32]; 4]],
        src: &[u16],
        plus_zero: bool,
        dst: &mut [u8],
    ) {
        let c = Consts::new(fp8);
        store_codes(src.len() / 32, dst, |j| {
            let v = &consts[j];
            // SAFETY: each row of `v` is 32 u16 = 64 bytes (one unaligned 512-bit load);
            // `32 * j + 32 <= src.len()` as above.
            let (blk, x) = unsafe {
                let at = |r: usize| _mm512_loadu_si512(v[r].as_ptr().cast());
                let blk = Block {
                    normal_from: at(0),
                    normal_span: at(1),
                    rebias: at(2),
                    k: at(3),
                };
                (blk, _mm512_loadu_si512(src.as_ptr().add(32 * j).cast()))
            };
            encode32(&c, &blk, x, plus_zero)
        });
    }

    /// Stores the codes of `chunks` 32-value chunks into `dst` (`32 * chunks` bytes),
    /// `codes(j)` giving chunk `j`'s as u16 lanes; chunks are asked for in order. Two
    /// chunks per store: `vpackuswb` (the codes are below 256) interleaves their 128-bit
    /// lanes, one `vpermq` restores the order.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) fn store_codes(
        chunks: usize,
        dst: &mut [u8],
        mut codes: impl FnMut(usize) -> __m512i,
    ) {
        assert!(dst.len() >= 32 * chunks, "store_codes: short destination");
        let order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
        for p in 0..chunks / 2 {
            let first = codes(2 * p);
            let bytes =
                _mm512_permutexvar_epi64(order, _mm512_packus_epi16(first, codes(2 * p + 1)));
            // SAFETY: `64 * p + 64 <= 32 * chunks <= dst.len()` (asserted above); one
            // unaligned 512-bit store.
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(64 * p).cast(), bytes) };
        }
        if chunks % 2 == 1 {
            let j = chunks - 1;
            // SAFETY: `32 * j + 32 == 32 * chunks <= dst.len()`; one unaligned 256-bit
            // store.
            unsafe {
                _mm256_storeu_si256(
                    dst.as_mut_ptr().add(32 * j).cast(),
                    _mm512_cvtepi16_epi8(codes(j)),
                )
            };
        }
    }

    /// [`super::decode_blocks`] after its checks.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW; `src.len() == dst.len() == js.len() * block`,
    /// `block` a multiple of 32; every `j` satisfies [`Fp8::decode_exact`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn decode_blocks(
        fp8: Fp8,
        src: &[u8],
        block: usize,
        js: &[i32],
        dst: &mut [u16],
    ) {
        let sub: [u16; 32] = std::array::from_fn(|m| {
            if m > 0 && m < 1 << fp8.mbits {
                fp8.subnormal_bits(m as u8)
            } else {
                0
            }
        });
        // SAFETY: `sub` is 32 u16 = 64 bytes (one unaligned 512-bit load).
        let sub = unsafe { _mm512_loadu_si512(sub.as_ptr().cast()) };
        let low = _mm512_set1_epi16(0x7F);
        let first_normal = _mm512_set1_epi16(1 << fp8.mbits);
        let nan_from = _mm512_set1_epi16(i16::from(fp8.nan_from));
        let (nan, inf) = (_mm512_set1_epi16(0x7FC0), _mm512_set1_epi16(0x7F80));
        let sign = _mm512_set1_epi16(i16::MIN);
        let shift = _mm512_set1_epi16(7 - fp8.mbits as i16);
        for (b, &j) in js.iter().enumerate() {
            // Both fit an i16: `j` is within the exact range.
            let jsh = _mm512_set1_epi16((j << 7) as i16);
            let rebias = _mm512_set1_epi16(((127 - fp8.bias + j) << 7) as i16);
            for at in (b * block..(b + 1) * block).step_by(32) {
                // SAFETY: `at + 32 <= src.len()` (whole blocks of a multiple of 32); one
                // unaligned 256-bit load.
                let x = _mm512_cvtepu8_epi16(unsafe {
                    _mm256_loadu_si256(src.as_ptr().add(at).cast())
                });
                let mag = _mm512_and_si512(x, low);
                let norm = _mm512_add_epi16(_mm512_sllv_epi16(mag, shift), rebias);
                let s = _mm512_permutexvar_epi16(mag, sub);
                let s = _mm512_mask_add_epi16(s, _mm512_test_epi16_mask(mag, mag), s, jsh);
                let v =
                    _mm512_mask_blend_epi16(_mm512_cmplt_epu16_mask(mag, first_normal), norm, s);
                let v = match fp8.inf_code {
                    Some(c) => {
                        let is_inf = _mm512_cmpeq_epu16_mask(mag, _mm512_set1_epi16(i16::from(c)));
                        _mm512_mask_mov_epi16(v, is_inf, inf)
                    }
                    None => v,
                };
                let v = _mm512_mask_mov_epi16(v, _mm512_cmpge_epu16_mask(mag, nan_from), nan);
                // v | ((x << 8) & 0x8000): the sign bit.
                let v = _mm512_ternarylogic_epi32::<0xF8>(v, _mm512_slli_epi16::<8>(x), sign);
                // SAFETY: `at + 32 <= dst.len() == src.len()`; one unaligned 512-bit store.
                unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(at).cast(), v) };
            }
        }
    }

    /// The call's constant vectors.
    pub(super) struct Consts {
        half_m1: __m512i,
        abs: __m512i,
        one: __m512i,
        inf: __m512i,
        s_min: __m512i,
        s_max: __m512i,
        max_code: __m512i,
        nan_code: __m512i,
        sign: __m512i,
        /// `7 - MBITS`, the normal shift, as a shift count.
        sh: __m128i,
        /// `2^(7 - MBITS - 1) - 1`, the rounding addend of the normal shift.
        round: __m512i,
        /// `D` and `127 - BIAS - k` at `k = 0`: the general route subtracts `k`.
        d0: __m512i,
        off0: __m512i,
        /// `MBITS`, as per-lane shift counts.
        mbits: __m512i,
    }

    impl Consts {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        pub(super) fn new(fp8: Fp8) -> Consts {
            // SAFETY: `HALF_M1` is 32 i16 = 64 bytes (one unaligned 512-bit load).
            let half_m1 = unsafe { _mm512_loadu_si512(HALF_M1.as_ptr().cast()) };
            let sh = 7 - fp8.mbits as i32;
            Consts {
                half_m1,
                abs: _mm512_set1_epi16(0x7FFF),
                one: _mm512_set1_epi16(1),
                inf: _mm512_set1_epi16(0x7F80),
                s_min: _mm512_set1_epi16(sh as i16),
                s_max: _mm512_set1_epi16(9),
                max_code: _mm512_set1_epi16(i16::from(fp8.max_code)),
                nan_code: _mm512_set1_epi16(0x7F),
                sign: _mm512_set1_epi16(0x80),
                sh: _mm_cvtsi32_si128(sh),
                round: _mm512_set1_epi16((1 << (sh - 1)) - 1),
                d0: _mm512_set1_epi16(fp8.shift_base(0) as i16),
                off0: _mm512_set1_epi16(fp8.exp_offset(0) as i16),
                mbits: _mm512_set1_epi16(fp8.mbits as i16),
            }
        }
    }

    /// One block's constants for the normal route, from its exponent `k`.
    #[derive(Clone, Copy)]
    pub(super) struct Block {
        /// `(EXP_OFFSET + 1) << 7`: the smallest magnitude whose code is normal.
        normal_from: __m512i,
        /// `0x7F80 - normal_from`: how many magnitudes from `normal_from` up are finite.
        normal_span: __m512i,
        /// `EXP_OFFSET << MBITS`, subtracted from a normal input's rounded bits.
        rebias: __m512i,
        /// `k` itself, for the general route.
        k: __m512i,
    }

    impl Block {
        /// The block whose [`Fp8::block_consts`] are broadcast in `v` ([`store_blocks`]).
        #[inline(always)]
        pub(super) fn of(v: [__m512i; 4], _k: i32) -> Block {
            let [normal_from, normal_span, rebias, k] = v;
            Block {
                normal_from,
                normal_span,
                rebias,
                k,
            }
        }
    }

    /// Blocks per table of [`store_blocks`] (and of the AVX2 kernels' tables).
    pub(super) const TABLE: usize = 16;

    /// The 16-bit constants `consts(k)` of [`TABLE`] blocks' exponents `k32`, row `r` of
    /// the result holding constant `r` of each block doubled into a u32 (both halves),
    /// so that a block's vector of it is one broadcast from memory (`vpbroadcastd`, a
    /// load). One loop over fixed-size arrays, which vectorizes.
    ///
    /// The callers read the exponents into `k32` with masked loads and store them whole,
    /// each in its level's vector width: stored one by one (or in halves) and read back
    /// as a wider vector by this loop, they stalled its loads on store forwarding (an
    /// eighth of the f32 encode's samples at AVX-512, x0.90; two 256-bit halves there,
    /// x0.94-0.97).
    #[inline(always)]
    pub(super) fn block_table<const R: usize>(
        k32: &[i32; TABLE],
        consts: &impl Fn(i16) -> [i16; R],
    ) -> [[u32; TABLE]; R] {
        std::array::from_fn(|r| k32.map(|k| u32::from(consts(k as i16)[r] as u16) * 0x1_0001))
    }

    /// Up to [`TABLE`] exponents `ks` as a full table row, zeros past `ks.len()`: one
    /// masked 512-bit load and one store ([`block_table`]).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exponents(ks: &[i32]) -> [i32; TABLE] {
        let ks = &ks[..ks.len().min(TABLE)];
        let mask = ((1u32 << ks.len()) - 1) as u16;
        let mut k32 = [0i32; TABLE];
        // SAFETY: the masked load reads lanes `..ks.len()` of `ks` only (at most `TABLE`
        // = 16, one 512-bit vector); the store writes the 64 bytes of `k32`; both
        // unaligned.
        unsafe {
            let v = _mm512_maskz_loadu_epi32(mask, ks.as_ptr());
            _mm512_storeu_si512(k32.as_mut_ptr().cast(), v);
        }
        k32
    }

    /// [`store_codes`] over the chunks of `ks.len()` blocks of `block` values (a multiple
    /// of 32), `code(blk, j)` giving chunk `j`'s codes under its block's constants: `blk`
    /// is `make(v, k)`, `v` the block's 16-bit constants `consts(k)` broadcast, `k` its
    /// exponent.
    ///
    /// Blocks of one chunk (MXFP8's 32 values) read their constants from a table, made
    /// [`TABLE`] blocks at a time in one vectorized loop with each value doubled into a
    /// 32-bit lane, so that a block's vector is one `vpbroadcastd` from memory (a load).
    /// Made from the exponent chunk by chunk, they took a dozen scalar operations and a
    /// broadcast from a general register each: a third of the encode's instructions in
    /// the rowwise MXFP8 quantize from f16. Longer blocks are found by a countdown
    /// ([`Blocks`]), their constants made once per block.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) fn store_blocks<B, const R: usize>(
        ks: &[i32],
        block: usize,
        dst: &mut [u8],
        consts: impl Fn(i16) -> [i16; R],
        make: impl Fn([__m512i; R], i32) -> B,
        mut code: impl FnMut(&B, usize) -> __m512i,
    ) {
        // Every closure here inlined: left to the compiler, the CLI's build called the
        // chunk closure out of line (x0.61 on the FP8 1x128 rowwise quantize from f16).
        if block != 32 {
            let mut blocks = Blocks::new(
                ks,
                block / 32,
                #[inline(always)]
                |k| make(consts(k as i16).map(|v| _mm512_set1_epi16(v)), k),
            );
            let chunks = ks.len() * (block / 32);
            store_codes(
                chunks,
                dst,
                #[inline(always)]
                |j| code(blocks.next(), j),
            );
            return;
        }
        for (t, (ks, dst)) in ks.chunks(TABLE).zip(dst.chunks_mut(32 * TABLE)).enumerate() {
            let rows = block_table(&exponents(ks), &consts);
            store_codes(
                ks.len(),
                dst,
                #[inline(always)]
                |j| {
                    let v = std::array::from_fn(|r| _mm512_set1_epi32(rows[r][j] as i32));
                    code(&make(v, ks[j]), TABLE * t + j)
                },
            );
        }
    }

    /// The blocks of a call, chunk by chunk: a countdown finds where the next block
    /// starts (a division per chunk, `j * 32 / block`, costs more than the chunk's
    /// encode when blocks are 32 values). `make(k)` builds a block's constants (bf16's
    /// [`Block`], or the f16 kernel's).
    pub(super) struct Blocks<'a, B, F> {
        ks: std::slice::Iter<'a, i32>,
        per_block: usize,
        left: usize,
        blk: B,
        make: F,
    }

    impl<'a, B, F: FnMut(i32) -> B> Blocks<'a, B, F> {
        #[inline(always)]
        pub(super) fn new(ks: &'a [i32], per_block: usize, mut make: F) -> Blocks<'a, B, F> {
            Blocks {
                ks: ks.iter(),
                per_block,
                left: 0,
                blk: make(0),
                make,
            }
        }

        /// The constants of the next chunk's block.
        #[inline(always)]
        pub(super) fn next(&mut self) -> &B {
            if self.left == 0 {
                // The caller takes `ks.len() * per_block` chunks at most.
                let k = self.ks.next().copied().unwrap_or(0);
                self.blk = (self.make)(k);
                self.left = self.per_block;
            }
            self.left -= 1;
            &self.blk
        }
    }

    /// [`Fp8::encode`] on 32 lanes, codes in u16 lanes.
    ///
    /// Where every lane is zero or has a normal code (its magnitude at least the block's
    /// `normal_from`, and finite), the code is the input's bits rounded to `MBITS`
    /// mantissa bits in place, `(mag + 2^(s-1) - 1 + lsb) >> s` with `s = 7 - MBITS` (a
    /// carry rolling into the exponent), rebiased and saturated: about half the
    /// operations of the general route, which takes the rest (a subnormal code, a bf16
    /// subnormal input, infinity or NaN in the chunk: rare in data under a block scale).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) fn encode32(c: &Consts, blk: &Block, x: __m512i, plus_zero: bool) -> __m512i {
        let mag = _mm512_and_si512(x, c.abs);
        let nonzero = _mm512_test_epi16_mask(mag, mag);
        // Outside `normal_from .. 0x7F80` (one unsigned compare after a wrapping
        // subtraction), zero excepted.
        let general = _mm512_mask_cmpge_epu16_mask(
            nonzero,
            _mm512_sub_epi16(mag, blk.normal_from),
            blk.normal_span,
        );
        if general != 0 {
            return encode32_general(c, blk.k, x, plus_zero);
        }
        let lsb = _mm512_and_si512(_mm512_srl_epi16(mag, c.sh), c.one);
        let q = _mm512_srl_epi16(_mm512_add_epi16(_mm512_add_epi16(mag, c.round), lsb), c.sh);
        // Zero saturates to 0.
        let code = _mm512_min_epi16(_mm512_subs_epu16(q, blk.rebias), c.max_code);
        let sign = _mm512_srli_epi16::<8>(x);
        let sign = if plus_zero {
            _mm512_maskz_mov_epi16(nonzero, sign)
        } else {
            sign
        };
        // code | (sign & 0x80)
        _mm512_ternarylogic_epi32::<0xF8>(code, sign, c.sign)
    }

    /// [`Fp8::encode`] on 32 lanes, any input, codes in u16 lanes; `k` holds each lane's
    /// exponent.
    ///
    /// Inlined, though rarely taken: as a call it clobbered every vector register, so the
    /// loop around it kept its constants on the stack and reloaded them each chunk.
    /// Inlined, the row encodes ran x1.06-1.13 faster (FP8 1x128 and 128x128, MXFP8, bf16
    /// rowwise and columnwise, on Zen 4).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn encode32_general(c: &Consts, k: __m512i, x: __m512i, plus_zero: bool) -> __m512i {
        // `k` is within -127..=126-BIAS, so both fit an i16 with room to spare.
        let d = _mm512_sub_epi16(c.d0, k);
        let off = _mm512_sub_epi16(c.off0, k);
        let mag = _mm512_and_si512(x, c.abs);
        let e1 = _mm512_subs_epu16(_mm512_srli_epi16::<7>(mag), c.one);
        let v = _mm512_sub_epi16(mag, _mm512_slli_epi16::<7>(e1));
        let s = _mm512_min_epi16(_mm512_max_epi16(_mm512_sub_epi16(d, e1), c.s_min), c.s_max);
        let lsb = _mm512_and_si512(_mm512_srlv_epi16(v, s), c.one);
        let rounded = _mm512_add_epi16(
            _mm512_add_epi16(v, _mm512_permutexvar_epi16(s, c.half_m1)),
            lsb,
        );
        let q = _mm512_srlv_epi16(rounded, s);
        let base = _mm512_subs_epu16(e1, off);
        let base = _mm512_sllv_epi16(base, c.mbits);
        let code = _mm512_min_epi16(_mm512_add_epi16(base, q), c.max_code);
        // Infinity saturates; NaN is handled after the sign.
        let code = _mm512_mask_mov_epi16(code, _mm512_cmpge_epu16_mask(mag, c.inf), c.max_code);
        let sign = _mm512_srli_epi16::<8>(x);
        let sign = if plus_zero {
            _mm512_maskz_mov_epi16(_mm512_test_epi16_mask(mag, mag), sign)
        } else {
            sign
        };
        // code | (sign & 0x80)
        let code = _mm512_ternarylogic_epi32::<0xF8>(code, sign, c.sign);
        _mm512_mask_mov_epi16(code, _mm512_cmpgt_epu16_mask(mag, c.inf), c.nan_code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::pow2 as p2;

    /// `2^k` as an f32 (`k >= -149`).
    fn pow2(k: i32) -> f32 {
        crate::codec::pow2(k)
    }

    /// The lane constants, made in 16-bit arithmetic, equal the module docs' 32-bit
    /// formulas (narrowed to 16 bits) for every exponent each route takes.
    #[test]
    fn sixteen_bit_consts_equal_the_32_bit_formulas() {
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            let (bias, mbits) = (fp8.bias(), fp8.mbits());
            for k in -300..300 {
                if fp8.pow2_exact(k) {
                    let off = 127 - bias - k;
                    let want = [
                        ((off + 1) << 7) as u16,
                        (0x7F80 - ((off + 1) << 7)) as u16,
                        (off << mbits) as u16,
                        k as u16,
                    ];
                    assert_eq!(fp8.block_consts(k), want, "{fp8:?} bf16 k {k}");
                }
                if fp8.pow2_exact_f16(k) {
                    let off = 15 - bias - k;
                    let from = (off + 1).clamp(-9, 31) << 10;
                    let want = [from as i16, (0x7C00 - from) as i16, (off << mbits) as i16];
                    assert_eq!(fp8.block_consts_f16(k), want, "{fp8:?} f16 k {k}");
                }
            }
        }
    }

    fn reference(fp8: Fp8, bits: u16, k: i32, plus_zero: bool) -> u8 {
        let x = half::bf16::from_bits(bits).to_f32();
        let y = if plus_zero && x == 0.0 {
            0.0
        } else {
            x * pow2(k)
        };
        if fp8 == Fp8::E4M3 {
            e4m3::encode(y)
        } else {
            e5m2::encode(y)
        }
    }

    /// Exponents the fast tests visit: both ends of the exact range, the middle, and a
    /// stride through the rest (every exponent in the ignored exhaustive test).
    fn some_ks(fp8: Fp8) -> Vec<i32> {
        (-127..=126 - fp8.bias)
            .filter(|k| k % 13 == 0 || *k < -118 || *k > 110 - fp8.bias || (-12..=12).contains(k))
            .collect()
    }

    fn check(fp8: Fp8, ks: &[i32]) {
        for &k in ks {
            for plus_zero in [false, true] {
                for bits in 0..=u16::MAX {
                    let want = reference(fp8, bits, k, plus_zero);
                    let got = fp8.encode(bits, k, plus_zero);
                    assert_eq!(
                        got, want,
                        "{fp8:?} bits {bits:#06x} k {k} plus_zero {plus_zero}"
                    );
                }
            }
        }
    }

    #[test]
    fn scalar_equals_the_f32_route_on_every_input() {
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            check(fp8, &some_ks(fp8));
        }
    }

    #[test]
    #[ignore = "every exponent: about a minute in debug; run with --release --ignored"]
    fn scalar_equals_the_f32_route_exhaustively() {
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            check(fp8, &(-127..=126 - fp8.bias).collect::<Vec<_>>());
        }
    }

    #[test]
    fn vector_equals_scalar_on_every_input() {
        for level in [Level::Avx512, Level::Avx2] {
            if level.is_supported() {
                vector_equals_scalar_at(level);
            } else {
                eprintln!("skipped at {level}: this CPU does not have it");
            }
        }
    }

    /// [`vector_equals_scalar_on_every_input`] at one level the CPU has.
    fn vector_equals_scalar_at(level: Level) {
        let src: Vec<u16> = (0..=u16::MAX).collect();
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            for &k in &some_ks(fp8) {
                for plus_zero in [false, true] {
                    // One exponent for all 2^16 inputs, then one per 32-value block.
                    let ks = vec![k; 1];
                    let mut dst = vec![0u8; src.len()];
                    assert!(p2::encode_blocks(
                        level,
                        fp8,
                        Bits16::Bf16(&src),
                        src.len(),
                        &ks,
                        plus_zero,
                        &mut dst
                    ));
                    for (&s, &d) in src.iter().zip(&dst) {
                        assert_eq!(d, fp8.encode(s, k, plus_zero), "{fp8:?} {s:#06x} k {k}");
                    }
                }
            }
            // An odd number of 32-value blocks (the last one stored alone), each with
            // its own exponent.
            let src = &src[32..];
            let ks: Vec<i32> = (0..src.len() / 32)
                .map(|b| -127 + (b as i32 * 7) % (254 - fp8.bias))
                .collect();
            let mut dst = vec![0u8; src.len()];
            assert!(p2::encode_blocks(
                level,
                fp8,
                Bits16::Bf16(src),
                32,
                &ks,
                false,
                &mut dst
            ));
            for (i, (&s, &d)) in src.iter().zip(&dst).enumerate() {
                assert_eq!(d, fp8.encode(s, ks[i / 32], false));
            }
        }
    }

    /// What a [`LaneExps`] test varies with the input format: how the lanes are set, how
    /// a row of bits is tagged, and the scalar specification of a code.
    pub(super) struct LaneFormat {
        pub set: fn(&mut LaneExps, Level, Fp8, &[i32]) -> bool,
        /// Whether the lanes set at a level must take the exponent.
        pub exact: fn(Level, Fp8, i32) -> bool,
        pub tag: for<'a> fn(&'a [u16]) -> Bits16<'a>,
        pub want: fn(Fp8, u16, i32, bool) -> u8,
    }

    /// Every 16-bit pattern, in rows of `ks.len()` lanes, through lanes set to `ks`,
    /// against `f.want`, at every vector level this CPU has: each level that
    /// [`LaneExps::supports`] must take every row, the others refuse them. A level
    /// whose lanes cannot take every `k` (`f.exact`) must refuse the set, and is not
    /// checked further. `false` where no level of this CPU was checked.
    pub(super) fn check_lanes(f: &LaneFormat, fp8: Fp8, plus_zero: bool, ks: &[i32]) -> bool {
        let src: Vec<u16> = (0..=u16::MAX).collect();
        let mut dst = vec![0u8; ks.len()];
        let mut checked = false;
        for level in [Level::Avx512, Level::Avx2, Level::Scalar] {
            let mut lanes = LaneExps::new();
            let fits = ks.iter().all(|&k| (f.exact)(level, fp8, k));
            assert_eq!((f.set)(&mut lanes, level, fp8, ks), fits, "{level}: set");
            if !fits {
                continue;
            }
            assert_eq!(lanes.len(), ks.len());
            let kernel = LaneExps::supports(level);
            for row in src.chunks_exact(ks.len()) {
                let took = lanes.encode(level, (f.tag)(row), plus_zero, &mut dst);
                assert_eq!(took, kernel, "{level}: encode took a row: {took}");
                if !took {
                    break;
                }
                for ((&s, &d), &k) in row.iter().zip(&dst).zip(ks) {
                    let want = (f.want)(fp8, s, k, plus_zero);
                    assert_eq!(d, want, "{level} {fp8:?} {s:#06x} k {k}");
                }
            }
            checked |= kernel;
        }
        checked
    }

    /// [`check_lanes`] at 96 lanes (an odd number of vectors: the last one stored alone),
    /// nine passes each shifting which exponent of `exact` a lane has, so every input
    /// meets many.
    pub(super) fn check_lane_passes(
        f: &LaneFormat,
        fp8: Fp8,
        plus_zero: bool,
        exact: &[i32],
    ) -> bool {
        (0..9).all(|pass| {
            let ks: Vec<i32> = (0..96)
                .map(|j| exact[(j * 37 + pass * 11) % exact.len()])
                .collect();
            check_lanes(f, fp8, plus_zero, &ks)
        })
    }

    #[test]
    fn lanes_equal_scalar_on_every_input() {
        let bf16 = LaneFormat {
            set: |lanes, level, fp8, ks| lanes.set_for(level, Bits16::Bf16(&[]), fp8, ks),
            exact: |_, fp8, k| fp8.pow2_exact(k),
            tag: |r| Bits16::Bf16(r),
            want: Fp8::encode,
        };
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            let exact: Vec<i32> = (-127..=126 - fp8.bias).collect();
            for plus_zero in [false, true] {
                if !check_lane_passes(&bf16, fp8, plus_zero, &exact) {
                    eprintln!("skipped: this CPU has neither AVX-512 nor AVX2");
                    return;
                }
            }
        }
    }

    #[test]
    fn lanes_refuse_what_they_cannot_do() {
        let mut lanes = LaneExps::new();
        let mut dst = [0u8; 64];
        assert!(!lanes.encode(Level::Avx512, Bits16::Bf16(&[0; 64]), false, &mut dst));
        // Not a multiple of 32 lanes, or an exponent outside the exact range.
        assert!(!lanes.set(Fp8::E4M3, &[0; 48]));
        assert!(!lanes.set(Fp8::E4M3, &[]));
        let mut ks = [0; 64];
        ks[63] = 120;
        assert!(!lanes.set(Fp8::E4M3, &ks));
        assert!(lanes.is_empty());
        assert!(lanes.set(Fp8::E4M3, &[0; 64]));
        // Rows of another length, or a level without the kernel.
        assert!(!lanes.encode(Level::Avx512, Bits16::Bf16(&[0; 32]), false, &mut dst[..32]));
        assert!(!lanes.encode(Level::Avx512, Bits16::Bf16(&[0; 64]), false, &mut dst[..32]));
        assert!(!lanes.encode(Level::Scalar, Bits16::Bf16(&[0; 64]), false, &mut dst));
        // Rows of the format the lanes were not set for, at either vector level.
        assert!(!lanes.encode(Level::Avx512, Bits16::F16(&[0; 64]), false, &mut dst));
        assert!(!lanes.encode(Level::Avx2, Bits16::F16(&[0; 64]), false, &mut dst));
        assert!(dst.iter().all(|&d| d == 0));
    }

    /// The f32 route of a bf16 dequantization: `decode(code) * 2^j`, narrowed.
    fn decode_reference(fp8: Fp8, code: u8, j: i32) -> u16 {
        let v = if fp8 == Fp8::E4M3 {
            e4m3::decode_fast(code)
        } else {
            e5m2::decode_fast(code)
        };
        crate::dtype::bf16_bits(v * pow2(j))
    }

    #[test]
    fn decode_equals_the_f32_route_on_every_code_and_exponent() {
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            let js: Vec<i32> = (-140..=140).filter(|&j| fp8.decode_exact(j)).collect();
            assert_eq!(
                js.len() as i32,
                254 - fp8.bias - fp8.mbits as i32 - fp8.emax + 1
            );
            for &j in &js {
                for code in 0..=255u8 {
                    assert_eq!(
                        fp8.decode_bf16(code, j),
                        decode_reference(fp8, code, j),
                        "{fp8:?} code {code:#04x} j {j}"
                    );
                }
            }
            let src: Vec<u8> = (0..=255u8).cycle().take(256 * js.len()).collect();
            let mut dst = vec![0u16; src.len()];
            for level in [Level::Avx512, Level::Avx2] {
                if !level.is_supported() {
                    eprintln!("skipped the {level:?} kernel: this CPU lacks it");
                    continue;
                }
                // One exponent per 256 codes (8 vectors), and per 32-code block.
                dst.fill(0);
                assert!(p2::decode_blocks(level, fp8, &src, 256, &js, &mut dst));
                for (i, (&c, &d)) in src.iter().zip(&dst).enumerate() {
                    let j = js[i / 256];
                    assert_eq!(d, fp8.decode_bf16(c, j), "{level:?} {fp8:?} {c:#04x} j {j}");
                }
                let js32: Vec<i32> = (0..src.len() / 32)
                    .map(|b| js[(b * 5) % js.len()])
                    .collect();
                assert!(p2::decode_blocks(level, fp8, &src, 32, &js32, &mut dst));
                for (i, (&c, &d)) in src.iter().zip(&dst).enumerate() {
                    assert_eq!(d, fp8.decode_bf16(c, js32[i / 32]), "{level:?} {fp8:?}");
                }
                // Outside the exact range, on either side, the kernel refuses.
                for out in [js[0] - 1, js[js.len() - 1] + 1] {
                    assert!(!p2::decode_blocks(
                        level,
                        fp8,
                        &src[..64],
                        32,
                        &[js[0], out],
                        &mut dst[..64]
                    ));
                }
            }
        }
    }

    /// Every code under every exact exponent, one exponent per lane (each code meets
    /// every exponent in some lane), in both store modes from every start offset modulo
    /// a line with ragged lengths (the streamed route's ends go value by value); and the
    /// refusals: exponents outside the exact range, other levels, lengths that do not
    /// agree, output other than bf16.
    #[test]
    fn exact_exps_decode_as_the_specification() {
        use crate::stream::{Fence, StoreMode};
        use half::bf16;
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            let exact: Vec<u8> = (0..=255u8)
                .filter(|&e| fp8.decode_exact(i32::from(e) - 127))
                .collect();
            let n = 256 * exact.len();
            // Code i % 256 under exponent (i / 256 + i) % len: every pair once.
            let src: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let exps: Vec<u8> = (0..n).map(|i| exact[(i / 256 + i) % exact.len()]).collect();
            let mut dst = vec![bf16::ZERO; n + 64];
            if !Level::Avx2.is_supported() {
                eprintln!("skipped the AVX2 kernel: this CPU lacks it");
            }
            for mode in [StoreMode::Cached, StoreMode::Streaming] {
                for (start, cut) in [(0, 0), (1, 3), (7, 17), (16, 31), (31, 1)] {
                    if !Level::Avx2.is_supported() {
                        break;
                    }
                    let (s, e) = (&src[cut..], &exps[cut..]);
                    let d = &mut dst[start..start + n - cut];
                    d.fill(bf16::from_bits(0xDEAD));
                    let lanes = p2::ExactExps::new(fp8, e).unwrap();
                    assert!(lanes.decode(Level::Avx2, s, d, mode));
                    drop(Fence::new());
                    for i in 0..s.len() {
                        let j = i32::from(e[i]) - 127;
                        let want = fp8.decode_bf16(s[i], j);
                        let got = d[i].to_bits();
                        assert_eq!(got, want, "{fp8:?} {mode:?} code {:#04x} j {j}", s[i]);
                    }
                }
            }
            let mut out = exps[..32].to_vec();
            for bad in [exact[0] - 1, exact[exact.len() - 1] + 1, 0xFF] {
                out[17] = bad;
                assert!(p2::ExactExps::new(fp8, &out).is_none());
            }
            let (s, some) = (&src[..32], p2::ExactExps::new(fp8, &exps[..32]).unwrap());
            let (avx2, cached) = (Level::Avx2, StoreMode::Cached);
            assert!(!some.decode(avx2, &s[..16], &mut dst[..32], cached));
            assert!(!some.decode(avx2, s, &mut dst[..16], cached));
            assert!(!some.decode(Level::Avx512, s, &mut dst[..32], cached));
            assert!(!some.decode(Level::Scalar, s, &mut dst[..32], cached));
            assert!(!some.decode(avx2, s, &mut [0f32; 32], cached));
            assert!(!some.decode(avx2, s, &mut [half::f16::ZERO; 32], cached));
        }
    }

    /// Runs of every length around the block kernels' tables of 16 one-chunk blocks
    /// (`x86::store_blocks`), and of longer blocks (found by a countdown): bf16, f16
    /// and f32 input, each block under its own exponent, against the scalar codes, at
    /// each vector level the CPU has.
    #[test]
    fn runs_of_any_number_of_blocks_take_their_own_exponents() {
        use crate::codec::pow2::encode_blocks_f32;
        use quantfmt_testkit::XorShift32;
        let mut rng = XorShift32::new(0x7AB1_E516);
        let n = 33 * 64;
        let f32s: Vec<f32> = (0..n)
            .map(|_| (rng.next_u32() as f32 / u32::MAX as f32 - 0.5) * 6.0)
            .collect();
        let bf16: Vec<u16> = f32s
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect();
        let f16: Vec<u16> = f32s
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        for level in [Level::Avx512, Level::Avx2] {
            if !level.is_supported() {
                eprintln!("skipped at {level}: this CPU does not have it");
                continue;
            }
            for fp8 in [Fp8::E4M3, Fp8::E5M2] {
                for block in [32, 64] {
                    for blocks in [1, 2, 3, 15, 16, 17, 31, 32, 33] {
                        let len = blocks * block;
                        // Exponents around the data's (amax 3) and past it: the fast
                        // route, saturation and subnormal codes in neighbouring blocks.
                        let ks: Vec<i32> = (0..blocks as i32).map(|b| (b * 5) % 23 - 6).collect();
                        let mut dst = vec![0u8; len];
                        let run = Bits16::Bf16(&bf16[..len]);
                        assert!(p2::encode_blocks(
                            level, fp8, run, block, &ks, true, &mut dst
                        ));
                        for (i, (&s, &d)) in bf16.iter().zip(&dst).enumerate() {
                            let want = fp8.encode(s, ks[i / block], true);
                            assert_eq!(d, want, "bf16 {blocks} blocks of {block}, value {i}");
                        }
                        let run = Bits16::F16(&f16[..len]);
                        assert!(p2::encode_blocks(
                            level, fp8, run, block, &ks, true, &mut dst
                        ));
                        for (i, (&s, &d)) in f16.iter().zip(&dst).enumerate() {
                            let want = fp8.encode_f16(s, ks[i / block], true);
                            assert_eq!(d, want, "f16 {blocks} blocks of {block}, value {i}");
                        }
                        let run = &f32s[..len];
                        assert!(encode_blocks_f32(
                            level, fp8, run, block, &ks, true, &mut dst
                        ));
                        for (i, (&s, &d)) in f32s.iter().zip(&dst).enumerate() {
                            let want = fp8.encode_f32(s, ks[i / block], true);
                            assert_eq!(d, want, "f32 {blocks} blocks of {block}, value {i}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn encode_blocks_refuses_what_it_cannot_do() {
        let src = [0u16; 64];
        let mut dst = [0u8; 64];
        let lvl = Level::Avx512;
        // Wrong block size, lengths, or an exponent outside the exact range.
        assert!(!encode_blocks(
            lvl,
            Fp8::E4M3,
            Bits16::Bf16(&src),
            16,
            &[0; 4],
            false,
            &mut dst
        ));
        assert!(!encode_blocks(
            lvl,
            Fp8::E4M3,
            Bits16::Bf16(&src),
            32,
            &[0; 3],
            false,
            &mut dst
        ));
        assert!(!encode_blocks(
            lvl,
            Fp8::E4M3,
            Bits16::Bf16(&src),
            32,
            &[0, 120],
            false,
            &mut dst
        ));
        // f16 at AVX2 within the f32 route's range only: 120 is exact for the AVX-512
        // f16 kernel, not for E4M3's bf16 kernel.
        assert!(!encode_blocks(
            Level::Avx2,
            Fp8::E4M3,
            Bits16::F16(&src),
            32,
            &[0, 120],
            false,
            &mut dst
        ));
        assert!(!encode_blocks(
            Level::Scalar,
            Fp8::E4M3,
            Bits16::Bf16(&src),
            32,
            &[0, 0],
            false,
            &mut dst
        ));
        assert!(dst.iter().all(|&d| d == 0));
    }
}
