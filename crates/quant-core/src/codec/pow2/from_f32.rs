//! FP8 codes of f32 values under a power-of-two scale, through the bf16 kernel.
//!
//! The reference computes `encode(x * 2^k)`: a multiply, then the f32 encoder's steps
//! (`encode_fast` in `codec::fp8`), 16 values per AVX-512 vector. The bf16 kernel of
//! this module's parent takes 32 per vector and about half the operations, so the f32
//! values are narrowed to bf16 first, **rounding to odd**: the top 16 bits, with the
//! lowest bit set when any of the 16 bits dropped is (a `vpermt2w` of the high halves,
//! two `vptestmd`, a masked move and an `or`).
//!
//! Why that is exact (Boldo and Melquiond's rounding to odd): bf16 has 8 significant
//! bits, at least two more than E4M3 (4) or E5M2 (3). Every FP8 value and every
//! midpoint between two neighbours (scaled by `2^-k`) is then a bf16 value whose last
//! bit is 0. A value that is already bf16 passes unchanged; any other lies strictly
//! between two neighbouring bf16 values, one of them odd, and rounding to odd picks
//! that one: never a code or a midpoint, and never across one, since those are even. So
//! rounding the bf16 value to nearest even at FP8's precision gives the code of the f32
//! value. The argument needs bf16's own grid to be that fine where FP8's subnormal codes
//! lie, which holds while `k <= 126 - BIAS` ([`Fp8::pow2_exact`]): bf16 subnormals step
//! by `2^-133`, FP8's smallest subnormal times `2^-k` is at least `2^-128`. Saturation
//! is kept: `max` is a bf16 value, so a value at or above it stays at or above it. NaN
//! stays NaN (a NaN whose payload lies in the low bits truncates to infinity and gets
//! its odd bit back), infinity and zero stay themselves, the sign is kept, and a finite
//! value never truncates to infinity.
//!
//! The tests check every bf16-representable value, every code and midpoint of both
//! formats with its neighbours, the smallest normal codes, and random patterns, at each
//! exponent, against [`Fp8::encode_f32`].
//!
//! ```
//! use quant_core::codec::{e4m3, pow2::Fp8};
//! let x = -3.3f32;
//! assert_eq!(Fp8::E4M3.encode_f32(x, 5, false), e4m3::encode(x * 32.0));
//! ```

use super::Fp8;
use crate::simd::Level;

impl Fp8 {
    /// Whether the f32 kernel takes the exponent `k`: the bf16 kernel's range
    /// ([`Fp8::pow2_exact`], which bounds it above) with a normal f32 `2^k`
    /// (`-126 <= k <= 126 - BIAS`).
    ///
    /// ```
    /// use quant_core::codec::pow2::Fp8;
    /// assert!(Fp8::E4M3.pow2_exact_f32(119) && !Fp8::E4M3.pow2_exact_f32(120));
    /// assert!(Fp8::E4M3.pow2_exact_f32(-126) && !Fp8::E4M3.pow2_exact_f32(-127));
    /// ```
    #[inline(always)]
    pub const fn pow2_exact_f32(self, k: i32) -> bool {
        k >= -126 && self.pow2_exact(k)
    }

    /// The code of `x * 2^k`: `encode(x * 2^k)` (round to nearest even, saturating, NaN
    /// to `0x7F`; a zero input gives `+0` when `plus_zero`). The specification of the f32
    /// vector kernel; `k` must satisfy [`Fp8::pow2_exact_f32`] (debug-asserted).
    ///
    /// ```
    /// use quant_core::codec::pow2::Fp8;
    /// assert_eq!(Fp8::E4M3.encode_f32(1.0, 0, false), 0x38);
    /// assert_eq!(Fp8::E4M3.encode_f32(1.0, 9, false), 0x7E); // 512 saturates to 448
    /// assert_eq!(Fp8::E4M3.encode_f32(-0.0, 3, true), 0x00); // -0 -> +0
    /// ```
    #[inline(always)]
    pub fn encode_f32(self, x: f32, k: i32, plus_zero: bool) -> u8 {
        debug_assert!(self.pow2_exact_f32(k), "k = {k} outside the exact range");
        self.encode_times_pow2(x, k, plus_zero)
    }
}

/// The bf16 bits of `x` rounded to odd: the top 16 bits, the lowest set when any dropped
/// bit is (module docs). The scalar form of the kernel's narrowing.
///
/// ```
/// use quant_core::codec::pow2::bf16_round_to_odd;
/// assert_eq!(bf16_round_to_odd(1.0), 0x3F80); // exact: unchanged
/// assert_eq!(bf16_round_to_odd(f32::from_bits(0x3F80_0001)), 0x3F81);
/// assert_eq!(bf16_round_to_odd(f32::from_bits(0x3F81_FFFF)), 0x3F81); // already odd
/// ```
#[inline(always)]
pub fn bf16_round_to_odd(x: f32) -> u16 {
    let b = x.to_bits();
    (b >> 16) as u16 | u16::from(b & 0xFFFF != 0)
}

/// `dst[i] = fp8.encode_f32(src[i], ks[i / block], plus_zero)` with AVX-512, 32 values
/// per step, or AVX2, 16. Returns `false` and writes nothing unless `level` is
/// [`Level::Avx512`] or [`Level::Avx2`] and the CPU has it, `block` is a nonzero
/// multiple of 32, `src` and `dst` hold `ks.len()` blocks, and every `k` satisfies
/// [`Fp8::pow2_exact_f32`]; the caller then takes its
/// f32 route (the same codes, through a multiply). `#[inline(always)]`: call it from a
/// [`crate::simd::dispatch`]ed kernel.
///
/// ```
/// use quant_core::codec::pow2::{Fp8, encode_blocks_f32};
/// use quant_core::simd;
/// let src: Vec<f32> = (0..64).map(|i| i as f32 * 0.37 - 11.0).collect();
/// let ks = [-2, 3];
/// let mut dst = [0u8; 64];
/// if encode_blocks_f32(simd::level(), Fp8::E4M3, &src, 32, &ks, false, &mut dst) {
///     for (i, (&d, &s)) in dst.iter().zip(&src).enumerate() {
///         assert_eq!(d, Fp8::E4M3.encode_f32(s, ks[i / 32], false));
///     }
/// }
/// ```
#[inline(always)]
pub fn encode_blocks_f32(
    level: Level,
    fp8: Fp8,
    src: &[f32],
    block: usize,
    ks: &[i32],
    plus_zero: bool,
    dst: &mut [u8],
) -> bool {
    let kernel = super::runs_fit(level, true, (src.len(), dst.len()), block, ks, |k| {
        fp8.pow2_exact_f32(k)
    });
    #[cfg(target_arch = "x86_64")]
    {
        match kernel {
            // SAFETY: the CPU has AVX-512 F and BW (`runs_fit` checked that it has the
            // level, which includes both); the lengths and exponents were checked there.
            Some(Level::Avx512) => unsafe {
                x86::encode_blocks(fp8, src, block, ks, plus_zero, dst)
            },
            // SAFETY: the CPU has AVX2 and F16C (`runs_fit` checked the level, which
            // includes both); as above.
            Some(Level::Avx2) => unsafe {
                super::avx2::encode_blocks_f32(fp8, src, block, ks, plus_zero, dst)
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m512, __m512i, _mm512_castps_si512, _mm512_loadu_ps, _mm512_loadu_si512,
        _mm512_maskz_mov_epi16, _mm512_or_si512, _mm512_permutex2var_epi16, _mm512_set1_epi16,
        _mm512_set1_epi32, _mm512_test_epi32_mask,
    };

    use super::super::x86::{Block, Consts, encode32, store_blocks};
    use super::Fp8;

    /// [`super::encode_blocks_f32`] after its checks.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW; `src.len() == dst.len() == ks.len() * block`,
    /// `block` a multiple of 32; every `k` satisfies [`Fp8::pow2_exact_f32`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn encode_blocks(
        fp8: Fp8,
        src: &[f32],
        block: usize,
        ks: &[i32],
        plus_zero: bool,
        dst: &mut [u8],
    ) {
        let c = Consts::new(fp8);
        // SAFETY: `HIGH_HALVES` is 32 u16 = 64 bytes (one unaligned 512-bit load).
        let high = unsafe { _mm512_loadu_si512(HIGH_HALVES.as_ptr().cast()) };
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
                // `ks.len() * block / 32`, which is `src.len() / 32`); two unaligned
                // 512-bit loads.
                let (lo, hi) = unsafe {
                    let p = src.as_ptr().add(32 * j);
                    (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
                };
                encode32(&c, blk, round_to_odd(high, lo, hi), plus_zero)
            },
        );
    }

    /// `vpermt2w` indices: lane `i` takes the high half of f32 lane `i` of the pair.
    const HIGH_HALVES: [u16; 32] = {
        let mut t = [0u16; 32];
        let mut i = 0;
        while i < 32 {
            t[i] = 2 * i as u16 + 1;
            i += 1;
        }
        t
    };

    /// [`super::bf16_round_to_odd`] of 32 f32 lanes (`lo` then `hi`), as bf16 bits in
    /// order.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn round_to_odd(high: __m512i, lo: __m512, hi: __m512) -> __m512i {
        let (lo, hi) = (_mm512_castps_si512(lo), _mm512_castps_si512(hi));
        let top = _mm512_permutex2var_epi16(lo, high, hi);
        let low = _mm512_set1_epi32(0xFFFF);
        let sticky = u32::from(_mm512_test_epi32_mask(lo, low))
            | u32::from(_mm512_test_epi32_mask(hi, low)) << 16;
        _mm512_or_si512(top, _mm512_maskz_mov_epi16(sticky, _mm512_set1_epi16(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::{Fp8, encode_blocks_f32};
    use crate::codec::{e4m3, e5m2};
    use crate::simd::Level;
    use quantfmt_testkit::XorShift32;

    /// Exponents the tests visit: both ends of the exact range and a stride through the
    /// rest.
    fn some_ks(fp8: Fp8) -> Vec<i32> {
        (-126..=127)
            .filter(|k| k % 13 == 0 || *k < -122 || *k > 105 || (-3..=3).contains(k))
            .filter(|&k| fp8.pow2_exact_f32(k))
            .collect()
    }

    /// Inputs that meet every decision of both routes at exponent `k`: each code's value
    /// and the midpoints between neighbouring codes (ties) divided by `2^k`, one ulp
    /// either side of each, and the fast route's threshold `2^(1 - BIAS - k)` with its
    /// neighbours; both signs.
    fn edges(fp8: Fp8, k: i32) -> Vec<f32> {
        let decode = |c: u8| {
            if fp8 == Fp8::E4M3 {
                e4m3::decode(c)
            } else {
                e5m2::decode(c)
            }
        };
        let down = f32::from_bits(((127 - k) as u32) << 23); // 2^-k, normal for |k| <= 126
        let mut at = Vec::new();
        for c in 0..=fp8.max_code {
            let v = decode(c);
            let mid = (v + decode(c + 1).min(f32::MAX)) * 0.5;
            for y in [v, mid] {
                let x = y * down;
                at.extend([
                    x,
                    f32::from_bits(x.to_bits() + 1),
                    f32::from_bits(x.to_bits().saturating_sub(1)),
                ]);
            }
        }
        // The smallest normal code's threshold, `2^(1 - BIAS - k)`, and its neighbours.
        let from = ((128 - fp8.bias - k).max(1) as u32) << 23;
        at.extend((from.saturating_sub(3)..from + 3).map(f32::from_bits));
        at.extend([
            0.0,
            f32::MAX,
            f32::INFINITY,
            f32::NAN,
            f32::from_bits(1),
            f32::MIN_POSITIVE,
        ]);
        let neg: Vec<f32> = at.iter().map(|x| -x).collect();
        at.extend(neg);
        at.resize(at.len().next_multiple_of(32), 1.0);
        at
    }

    /// Runs the kernel of every vector level the CPU has on `src` under one exponent `k`
    /// for the run and then one per 32-value block, against [`Fp8::encode_f32`]. `false`
    /// where the CPU has neither AVX-512 nor AVX2.
    fn check(fp8: Fp8, src: &[f32], ks: &[i32]) -> bool {
        let mut ran = false;
        for level in [Level::Avx512, Level::Avx2] {
            if level.is_supported() {
                check_at(level, fp8, src, ks);
                ran = true;
            }
        }
        ran
    }

    /// [`check`] at one level the CPU has.
    fn check_at(level: Level, fp8: Fp8, src: &[f32], ks: &[i32]) {
        let mut dst = vec![0u8; src.len()];
        for &k in ks {
            for plus_zero in [false, true] {
                assert!(encode_blocks_f32(
                    level,
                    fp8,
                    src,
                    src.len(),
                    &[k],
                    plus_zero,
                    &mut dst
                ));
                for (&s, &d) in src.iter().zip(&dst) {
                    let want = fp8.encode_f32(s, k, plus_zero);
                    assert_eq!(
                        d,
                        want,
                        "{fp8:?} {:#010x} k {k} plus_zero {plus_zero}",
                        s.to_bits()
                    );
                }
            }
        }
        let blocks: Vec<i32> = (0..src.len() / 32).map(|b| ks[b % ks.len()]).collect();
        assert!(encode_blocks_f32(
            level, fp8, src, 32, &blocks, false, &mut dst
        ));
        for (i, (&s, &d)) in src.iter().zip(&dst).enumerate() {
            assert_eq!(
                d,
                fp8.encode_f32(s, blocks[i / 32], false),
                "{:#010x}",
                s.to_bits()
            );
        }
    }

    #[test]
    fn vector_equals_the_f32_route() {
        // Every bf16-representable value (in order: chunks of neighbours, most of them on
        // the fast route; and shuffled: chunks mixing both routes), random patterns, and
        // each exponent's edges.
        let sorted: Vec<f32> = (0..=u16::MAX)
            .map(|b| f32::from_bits(u32::from(b) << 16))
            .collect();
        let mut shuffled = sorted.clone();
        let mut rng = XorShift32::new(0x0F32_F32F);
        for i in (1..shuffled.len()).rev() {
            shuffled.swap(i, rng.next_u32() as usize % (i + 1));
        }
        let random: Vec<f32> = (0..1 << 16)
            .map(|_| f32::from_bits(rng.next_u32()))
            .collect();
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            for src in [&sorted, &shuffled, &random] {
                if !check(fp8, src, &some_ks(fp8)) {
                    eprintln!(
                        "skipped: this CPU has no AVX-512 (the vector kernel is not built to run)"
                    );
                    return;
                }
            }
            for k in (-126..=127).filter(|&k| fp8.pow2_exact_f32(k)) {
                assert!(check(fp8, &edges(fp8, k), &[k]));
            }
        }
    }

    #[test]
    fn round_to_odd_then_nearest_even_is_nearest_even() {
        // The module's argument, checked on the scalar forms: the bf16 route's code of
        // the odd-rounded value equals the f32 route's code, on random patterns at every
        // exponent of the range.
        let mut rng = XorShift32::new(0x0DD0_0DD0);
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            for k in (-126..=127).filter(|&k| fp8.pow2_exact_f32(k)) {
                for _ in 0..2000 {
                    let x = f32::from_bits(rng.next_u32());
                    let odd = super::bf16_round_to_odd(x);
                    assert_eq!(
                        fp8.encode(odd, k, false),
                        fp8.encode_f32(x, k, false),
                        "{x:e} k {k}"
                    );
                }
            }
        }
    }

    #[test]
    fn refuses_what_it_cannot_do() {
        let src = [1.0f32; 64];
        let mut dst = [1u8; 64];
        let e4 = Fp8::E4M3;
        // An exponent without a normal f32 multiplier, a block not a multiple of 32,
        // mismatched lengths, the scalar level.
        assert!(!encode_blocks_f32(
            Level::Avx512,
            e4,
            &src,
            32,
            &[0, -127],
            false,
            &mut dst
        ));
        assert!(!encode_blocks_f32(
            Level::Avx512,
            e4,
            &src,
            16,
            &[0; 4],
            false,
            &mut dst
        ));
        assert!(!encode_blocks_f32(
            Level::Avx512,
            e4,
            &src[..32],
            32,
            &[0, 0],
            false,
            &mut dst
        ));
        assert!(!encode_blocks_f32(
            Level::Scalar,
            e4,
            &src,
            32,
            &[0, 0],
            false,
            &mut dst
        ));
        assert!(dst.iter().all(|&d| d == 1));
    }
}
