//! FP8 codes of f16 values under a power-of-two scale: the f16 twin of the bf16 encoder.
//!
//! f16 has 10 mantissa bits and 5 exponent bits. Multiplying by `2^k` again only moves
//! the exponent, but the product often leaves f16's range: a block whose amax is below 1
//! gets `k > 8` under E4M3, and then an f16 *subnormal* input (below `2^-14`) can land
//! on a normal code, whose significand the bf16 steps would have to normalize. So the
//! kernel splits the work differently:
//!
//! * the **fast route**, for a chunk of 32 values that are all zero or finite with normal
//!   codes, rounds the input bits in place: `q = (t + 2^(s-1) - 1 + lsb) >> s` with
//!   `s = 10 - MBITS`, then `code = min(q - ((15 - BIAS - k) << MBITS), max_code)` (the
//!   rebias may be negative, an addition), a zero lane kept 0. `t` is the magnitude's
//!   bits, except that under a block scale that can lift an f16 subnormal to a normal code
//!   (`k >= 16 - BIAS`) the subnormals are first normalized (`normalized` in the kernel:
//!   a negative exponent, so the shift is arithmetic). About ten operations for 32
//!   values, eight more with the normalization;
//! * the **f32 route** for any other chunk: both halves widened exactly (`vcvtph2ps`),
//!   multiplied by the f32 `2^k` and encoded by the steps of the scalar f32 encoder
//!   (`encode_fast` in `codec::fp8`) in 32-bit lanes. That *is* the reference
//!   computation, so it is exact for every input, NaN and infinity included.
//!
//! Both equal [`Fp8::encode_f16`], `encode(f32(x) * 2^k)`, for every f16 `x` and every
//! `k` with a normal f32 `2^k` ([`Fp8::pow2_exact_f16`]); the tests check all 2^16
//! inputs at a spread of exponents (all of them in an ignored test).
//!
//! ```
//! use quant_core::codec::{e4m3, pow2::Fp8};
//! let x = half::f16::from_f32(-3.3);
//! let k = 5; // scale 2^5
//! assert_eq!(Fp8::E4M3.encode_f16(x.to_bits(), k, false), e4m3::encode(x.to_f32() * 32.0));
//! ```

use super::Fp8;

impl Fp8 {
    /// Whether the f16 kernels take the exponent `k`: `2^k` is a normal f32
    /// (`-126 <= k <= 127`), the multiplier of the f32 route they reproduce.
    ///
    /// ```
    /// use quant_core::codec::pow2::Fp8;
    /// assert!(Fp8::E4M3.pow2_exact_f16(127) && !Fp8::E4M3.pow2_exact_f16(-127));
    /// ```
    #[inline(always)]
    pub const fn pow2_exact_f16(self, k: i32) -> bool {
        k >= -126 && k <= 127
    }

    /// The code of `f16::from_bits(bits) * 2^k`: the f32 route, `encode(f32(x) * 2^k)`
    /// (round to nearest even, saturating, NaN to `0x7F`; a zero input gives `+0` when
    /// `plus_zero`). The specification of the f16 vector kernel; `k` must satisfy
    /// [`Fp8::pow2_exact_f16`] (debug-asserted).
    ///
    /// ```
    /// use quant_core::codec::pow2::Fp8;
    /// let bits = half::f16::from_f32(1.0).to_bits();
    /// assert_eq!(Fp8::E4M3.encode_f16(bits, 0, false), 0x38); // 1.0
    /// assert_eq!(Fp8::E4M3.encode_f16(bits, 9, false), 0x7E); // 512 saturates to 448
    /// assert_eq!(Fp8::E4M3.encode_f16(0x0001, 30, false), 0x68); // 2^-24 * 2^30 = 64
    /// ```
    #[inline(always)]
    pub fn encode_f16(self, bits: u16, k: i32, plus_zero: bool) -> u8 {
        debug_assert!(self.pow2_exact_f16(k), "k = {k} outside the exact range");
        self.encode_times_pow2(half::f16::from_bits(bits).to_f32(), k, plus_zero)
    }

    /// The fast route's per-block constants for exponent `k`, as 16-bit lane values:
    /// `[normal_from, normal_span, rebias]`. `normal_from` is the smallest magnitude that
    /// is a normal f16 with a normal code (`max(16 - BIAS - k, 1) << 10`, at most
    /// infinity's `0x7C00`, where no lane is fast); `rebias` is
    /// `(15 - BIAS - k) << MBITS`, negative for large `k` (within `i16` for every exact
    /// `k`).
    // Used by the x86-64 block kernels (and the tests); `Lanes` uses the 16-bit form.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    #[inline(always)]
    pub(super) fn block_consts_f16(self, k: i32) -> [i16; 3] {
        self.block_consts_f16_16(k as i16)
    }

    /// [`Fp8::block_consts_f16`] in 16-bit arithmetic, for [`Lanes::new`]'s lane loops
    /// (as [`Fp8::block_consts16`] is for the bf16 lanes). The same values: `k` and the
    /// offset fit 16 bits, and the span's wrapping subtract keeps the low 16 bits of the
    /// 32-bit one.
    #[inline(always)]
    fn block_consts_f16_16(self, k: i16) -> [i16; 3] {
        let off = (15 - self.bias) as i16 - k;
        // Exponents of the normalized form run from -9 (the smallest subnormal) to 30.
        let from = (off + 1).clamp(-9, 31) << 10;
        [from, 0x7C00i16.wrapping_sub(from), off << self.mbits]
    }
}

/// The f16 kernel's constants for 32 lanes, one exponent each
/// ([`super::LaneExps::set_f16`]): [`Fp8::block_consts_f16`] per lane, the f32 route's
/// multipliers, and whether any lane normalizes subnormals.
#[derive(Clone, Debug)]
// Read by the x86-64 kernels only.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct Lanes {
    /// Per lane: `normal_from`, `normal_span`, `rebias` ([`Fp8::block_consts_f16`]).
    pub(super) consts: [[i16; 32]; 3],
    mult: [f32; 32],
    lift: bool,
}

impl Lanes {
    /// The constants of the 32 exponents `ks` (each satisfying [`Fp8::pow2_exact_f16`]).
    ///
    /// One pass over fixed-size arrays of the branchless [`Fp8::block_consts_f16`],
    /// which vectorizes: the set comes once per 32 rows of an MXFP8 columnwise quantize,
    /// and lane by lane it took a tenth of that quantize.
    pub(super) fn new(fp8: Fp8, ks: &[i32; 32]) -> Lanes {
        // Row by row over the lanes in 16-bit arithmetic (the compiler keeps each row's
        // value): each row one vectorized loop, without narrowing 32-bit lanes.
        let k16 = ks.map(|k| k as i16);
        Lanes {
            consts: std::array::from_fn(|row| k16.map(|k| fp8.block_consts_f16_16(k)[row])),
            mult: ks.map(|k| f32::from_bits(((k + 127) as u32) << 23)),
            lift: ks.iter().fold(false, |any, &k| any | fp8.lifts(k)),
        }
    }
}

impl Fp8 {
    /// Whether under `2^k` an f16 subnormal can have a normal code (`k >= 16 - BIAS`):
    /// the fast route then normalizes subnormal inputs.
    #[inline(always)]
    const fn lifts(self, k: i32) -> bool {
        k >= 16 - self.bias
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::{
        __m128i, __m512, __m512i, _mm_cvtsi32_si128, _mm512_add_epi16, _mm512_and_si512,
        _mm512_castsi256_si512, _mm512_castsi512_si256, _mm512_cmplt_epu16_mask,
        _mm512_cvtepi32_epi16, _mm512_cvtph_ps, _mm512_extracti64x4_epi64, _mm512_inserti64x4,
        _mm512_loadu_ps, _mm512_loadu_si512, _mm512_mask_cmpge_epu16_mask,
        _mm512_mask_permutexvar_epi16, _mm512_maskz_mov_epi16, _mm512_maskz_permutexvar_epi16,
        _mm512_maskz_sub_epi16, _mm512_min_epi16, _mm512_mul_ps, _mm512_set1_epi16, _mm512_set1_ps,
        _mm512_slli_epi16, _mm512_sllv_epi16, _mm512_sra_epi16, _mm512_srl_epi16,
        _mm512_srli_epi16, _mm512_sub_epi16, _mm512_ternarylogic_epi32, _mm512_test_epi16_mask,
        _mm512_testn_epi16_mask,
    };

    use super::super::x86::{store_blocks, store_codes};
    use super::{Fp8, Lanes};
    use crate::codec::x86::fp8_16;
    use crate::codec::{e4m3, e5m2};

    /// [`super::super::encode_blocks`] for f16 bits, after its checks.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW; `src.len() == dst.len() == ks.len() * block`,
    /// `block` a multiple of 32; every `k` satisfies [`Fp8::pow2_exact_f16`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(in crate::codec::pow2) unsafe fn encode_blocks(
        fp8: Fp8,
        src: &[u16],
        block: usize,
        ks: &[i32],
        plus_zero: bool,
        dst: &mut [u8],
    ) {
        let c = Consts::new(fp8);
        let consts = |k| fp8.block_consts_f16_16(k);
        let make = |v, k| Block::of(fp8, v, k);
        store_blocks(
            ks,
            block,
            dst,
            consts,
            make,
            // Inlined or not, by size: the call per chunk cost half the speed.
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

    /// [`super::super::LaneExps::encode`] of f16 rows, after its checks.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW; `src.len() == dst.len() == 32 * lanes.len()`;
    /// `lanes` was made for `fp8`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(in crate::codec::pow2) unsafe fn encode_lanes(
        fp8: Fp8,
        lanes: &[Lanes],
        src: &[u16],
        plus_zero: bool,
        dst: &mut [u8],
    ) {
        let c = Consts::new(fp8);
        store_codes(
            src.len() / 32,
            dst,
            #[inline(always)]
            |j| {
                let l = &lanes[j];
                // SAFETY: each row of `l.consts` is 32 i16 and `l.mult` 32 f32 (unaligned
                // 512-bit loads); `32 * j + 32 <= src.len()` as in `encode_blocks`.
                let (blk, x) = unsafe {
                    let at = |r: usize| _mm512_loadu_si512(l.consts[r].as_ptr().cast());
                    let blk = Block {
                        normal_from: at(0),
                        normal_span: at(1),
                        rebias: at(2),
                        mult: [
                            _mm512_loadu_ps(l.mult.as_ptr()),
                            _mm512_loadu_ps(l.mult.as_ptr().add(16)),
                        ],
                        lift: l.lift,
                    };
                    (blk, _mm512_loadu_si512(src.as_ptr().add(32 * j).cast()))
                };
                encode32(&c, &blk, x, plus_zero)
            },
        );
    }

    /// The call's constant vectors: the fast route's (16-bit lanes) and the f32 route's
    /// (32-bit lanes, the steps of `codec::fp8::encode_fast`).
    struct Consts {
        abs: __m512i,
        one: __m512i,
        /// `10 - MBITS`, the fast route's shift, as a shift count.
        sh: __m128i,
        /// `2^(10 - MBITS - 1) - 1`, its rounding addend.
        round: __m512i,
        max_code: __m512i,
        sign: __m512i,
        /// [`SHIFT_HI`] and [`SHIFT_LO`], for [`normalized`].
        shift_hi: __m512i,
        shift_lo: __m512i,
        /// The f32 route's format: E4M3, or else E5M2 ([`encode16`]).
        e4m3: bool,
    }

    impl Consts {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        fn new(fp8: Fp8) -> Consts {
            let sh = 10 - fp8.mbits as i32;
            Consts {
                abs: _mm512_set1_epi16(0x7FFF),
                one: _mm512_set1_epi16(1),
                sh: _mm_cvtsi32_si128(sh),
                round: _mm512_set1_epi16((1 << (sh - 1)) - 1),
                max_code: _mm512_set1_epi16(i16::from(fp8.max_code)),
                sign: _mm512_set1_epi16(0x80),
                // SAFETY: each table is 32 i16 = 64 bytes (one unaligned 512-bit load).
                shift_hi: unsafe { _mm512_loadu_si512(SHIFT_HI.as_ptr().cast()) },
                // SAFETY: as above.
                shift_lo: unsafe { _mm512_loadu_si512(SHIFT_LO.as_ptr().cast()) },
                e4m3: fp8 == Fp8::E4M3,
            }
        }
    }

    /// One block's constants, from its exponent `k`.
    #[derive(Clone, Copy)]
    struct Block {
        /// The smallest magnitude the fast route takes ([`Fp8::block_consts_f16`]).
        normal_from: __m512i,
        /// How many magnitudes from `normal_from` up it takes.
        normal_span: __m512i,
        /// `(15 - BIAS - k) << MBITS`, subtracted from the rounded bits.
        rebias: __m512i,
        /// `2^k`, the f32 route's multipliers of lanes 0..16 and 16..32.
        mult: [__m512; 2],
        /// Whether an f16 subnormal can have a normal code (`k >= 16 - BIAS`).
        lift: bool,
    }

    impl Block {
        /// The block of exponent `k` whose [`Fp8::block_consts_f16`] are broadcast in `v`
        /// (`store_blocks`).
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        fn of(fp8: Fp8, v: [__m512i; 3], k: i32) -> Block {
            let [normal_from, normal_span, rebias] = v;
            Block {
                normal_from,
                normal_span,
                rebias,
                // `k` is within -126..=127: a normal f32.
                mult: [_mm512_set1_ps(f32::from_bits(((k + 127) as u32) << 23)); 2],
                lift: fp8.lifts(k),
            }
        }
    }

    /// [`Fp8::encode_f16`] on 32 lanes, codes in u16 lanes: the fast route where every
    /// lane is zero or a normal f16 with a normal code, else the f32 route (module docs).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn encode32(c: &Consts, blk: &Block, x: __m512i, plus_zero: bool) -> __m512i {
        let mag = _mm512_and_si512(x, c.abs);
        let nonzero = _mm512_test_epi16_mask(mag, mag);
        // Only under a block scale that lifts subnormal inputs to normal codes are they
        // worth normalizing (a branch on the block, not on the data).
        let t = if blk.lift { normalized(c, mag) } else { mag };
        // Outside `normal_from .. 0x7C00` (one unsigned compare after a wrapping
        // subtraction), zero excepted.
        let general = _mm512_mask_cmpge_epu16_mask(
            nonzero,
            _mm512_sub_epi16(t, blk.normal_from),
            blk.normal_span,
        );
        let code = if general != 0 {
            encode32_f32(c, blk.mult, x)
        } else {
            // Rounded in place; the shift is arithmetic, a subnormal's `t` being negative.
            let lsb = _mm512_and_si512(_mm512_srl_epi16(t, c.sh), c.one);
            let q = _mm512_sra_epi16(_mm512_add_epi16(_mm512_add_epi16(t, c.round), lsb), c.sh);
            // A zero lane stays 0 (the rebias may be negative); a normal one is at least
            // the smallest normal code, so the subtraction never wraps.
            let code = _mm512_min_epi16(_mm512_maskz_sub_epi16(nonzero, q, blk.rebias), c.max_code);
            // code | ((x >> 8) & 0x80): the sign.
            _mm512_ternarylogic_epi32::<0xF8>(code, _mm512_srli_epi16::<8>(x), c.sign)
        };
        if plus_zero {
            // A zero input, of either sign, gives +0 (its code is 0x00 or 0x80).
            _mm512_maskz_mov_epi16(nonzero, code)
        } else {
            code
        }
    }

    /// The magnitudes `mag` in a normalized form, as i16 lanes: `(e << 10) + mantissa`
    /// with the implicit bit taken out. A normal f16 is its own bits; a subnormal
    /// `m * 2^-24`, whose leading one is bit `p` of `m`, is `1.f * 2^(p - 24)`: exponent
    /// `p - 9` (negative, down to -9), mantissa `m << (10 - p)` less its bit 10. Rounding
    /// this form in place is rounding the value, so subnormal inputs reaching normal
    /// codes (a block scale above `2^8` under E4M3) stay on the fast route; they are
    /// about 7% of the 32-value chunks of weights with a standard deviation of 0.02.
    ///
    /// The shift `10 - p` comes from two 32-entry tables of `vpermw`: by `m >> 5`, or by
    /// `m` itself where that is 0. Normal lanes (and zero) get shift 0.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn normalized(c: &Consts, mag: __m512i) -> __m512i {
        let subnormal = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(0x400));
        let hi = _mm512_srli_epi16::<5>(mag);
        let sh = _mm512_maskz_permutexvar_epi16(subnormal, hi, c.shift_hi);
        let sh =
            _mm512_mask_permutexvar_epi16(sh, _mm512_testn_epi16_mask(hi, hi), mag, c.shift_lo);
        // m << (10 - p) - ((10 - p) << 10) = ((p - 9) << 10) + mantissa.
        _mm512_sub_epi16(_mm512_sllv_epi16(mag, sh), _mm512_slli_epi16::<10>(sh))
    }

    /// `10 - p` for `m` below 32 with its leading one at bit `p` (index `m`, 0 for `m = 0`),
    /// and for `m` from 32 up by `m >> 5` (`5 - log2(m >> 5)`).
    const SHIFT_LO: [i16; 32] = shift_table(10);
    const SHIFT_HI: [i16; 32] = shift_table(5);

    /// `top - floor(log2 i)` at index `i > 0`, 0 at index 0.
    const fn shift_table(top: i16) -> [i16; 32] {
        let mut t = [0i16; 32];
        let mut i = 1;
        while i < 32 {
            t[i] = top - (31 - (i as u32).leading_zeros()) as i16;
            i += 1;
        }
        t
    }

    /// The f32 route on 32 lanes: both halves widened exactly, multiplied by `mult` and
    /// encoded ([`encode16`]); codes in u16 lanes, in order. Inlined for the reason the
    /// bf16 kernel's general route is (its call spilled the loop's constants).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn encode32_f32(c: &Consts, mult: [__m512; 2], x: __m512i) -> __m512i {
        let lo = _mm512_cvtph_ps(_mm512_castsi512_si256(x));
        let hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(x));
        let lo = _mm512_cvtepi32_epi16(encode16(c, _mm512_mul_ps(lo, mult[0])));
        let hi = _mm512_cvtepi32_epi16(encode16(c, _mm512_mul_ps(hi, mult[1])));
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }

    /// `codec::fp8::encode_fast` on 16 f32 lanes, codes in u32 lanes: the codec's
    /// AVX-512 encoder ([`crate::codec::x86::fp8_16`]) of `c`'s format.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn encode16(c: &Consts, y: __m512) -> __m512i {
        if c.e4m3 {
            fp8_16::<3, 7>(y, e4m3::MAX_CODE)
        } else {
            fp8_16::<2, 15>(y, e5m2::MAX_CODE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Fp8;
    use crate::codec::pow2::{LaneExps, encode_blocks};
    use crate::dtype::Bits16;
    use crate::simd::Level;
    use quantfmt_testkit::XorShift32;

    /// Exponents the fast tests visit: both ends of the exact range, every exponent
    /// where f16 inputs meet both code ranges (`-20..=40`), and a stride through the rest
    /// (every exponent in the ignored exhaustive test).
    fn some_ks() -> Vec<i32> {
        (-126..=127)
            .filter(|k| k % 11 == 0 || *k < -120 || *k > 120 || (-20..=40).contains(k))
            .collect()
    }

    /// Every f16 pattern through [`encode_blocks`] at each exponent of `ks`, against
    /// [`Fp8::encode_f16`], at each vector level the CPU has (AVX2: the exponents its
    /// route takes, the others refused): in order (chunks of neighbouring patterns, most
    /// of them on the fast route), and shuffled (chunks mixing the routes' lanes), one
    /// exponent for the run and then one per 32-value block. Then zeros of both signs
    /// among normal values of both signs from 0.5 to 2 (chunks on the fast route under
    /// most exponents, whose rebias may be negative: a zero lane must stay a zero code).
    fn check(ks: &[i32]) {
        for level in [Level::Avx512, Level::Avx2] {
            if level.is_supported() {
                check_at(level, ks);
            } else {
                eprintln!("skipped at {level}: this CPU does not have it");
            }
        }
    }

    /// [`check`] at one level the CPU has.
    fn check_at(level: Level, all: &[i32]) {
        let sorted: Vec<u16> = (0..=u16::MAX).collect();
        let mut shuffled = sorted.clone();
        let mut rng = XorShift32::new(0x05EE_DF16);
        for i in (1..shuffled.len()).rev() {
            shuffled.swap(i, rng.next_u32() as usize % (i + 1));
        }
        let zeros_among_normals: Vec<u16> = (0..4096u16)
            .map(|i| match i % 7 {
                0 => 0x0000,
                3 => 0x8000,
                _ => (0x3800 + i * 13 % 0x0800) | (i % 2) << 15,
            })
            .collect();
        let mut dst = vec![0u8; sorted.len()];
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            let takes = |k: i32| level != Level::Avx2 || fp8.pow2_exact_f32(k);
            for &k in all.iter().filter(|&&k| !takes(k)) {
                let run = Bits16::F16(&sorted);
                let n = sorted.len();
                assert!(!encode_blocks(level, fp8, run, n, &[k], false, &mut dst));
            }
            let ks: Vec<i32> = all.iter().copied().filter(|&k| takes(k)).collect();
            for src in [&sorted, &shuffled, &zeros_among_normals] {
                let dst = &mut dst[..src.len()];
                for &k in &ks {
                    for plus_zero in [false, true] {
                        let run = Bits16::F16(src);
                        assert!(encode_blocks(
                            level,
                            fp8,
                            run,
                            src.len(),
                            &[k],
                            plus_zero,
                            dst
                        ));
                        for (&s, &d) in src.iter().zip(dst.iter()) {
                            let want = fp8.encode_f16(s, k, plus_zero);
                            assert_eq!(d, want, "{fp8:?} {s:#06x} k {k} plus_zero {plus_zero}");
                        }
                    }
                }
                // One exponent per 32-value block, an odd number of blocks (the last one
                // stored alone).
                let src = &src[32..];
                let blocks: Vec<i32> = (0..src.len() / 32).map(|b| ks[b % ks.len()]).collect();
                let (run, dst) = (Bits16::F16(src), &mut dst[32..]);
                assert!(encode_blocks(level, fp8, run, 32, &blocks, false, dst));
                for (i, (&s, &d)) in src.iter().zip(dst.iter()).enumerate() {
                    assert_eq!(d, fp8.encode_f16(s, blocks[i / 32], false), "{s:#06x}");
                }
            }
        }
    }

    #[test]
    fn vector_equals_the_f32_route_on_every_input() {
        check(&some_ks());
    }

    #[test]
    #[ignore = "every exponent: a few minutes in debug; run with --release --ignored"]
    fn vector_equals_the_f32_route_exhaustively() {
        check(&(-126..=127).collect::<Vec<_>>());
    }

    #[test]
    fn lanes_equal_the_f32_route_on_every_input() {
        use crate::codec::pow2::tests::{LaneFormat, check_lane_passes, check_lanes};
        let f16 = LaneFormat {
            set: |lanes, level, fp8, ks| lanes.set_for(level, Bits16::F16(&[]), fp8, ks),
            // AVX2 takes the chunks its f16 route refuses through the bf16 kernel, within
            // the f32 route's range.
            exact: |level, fp8, k| {
                fp8.pow2_exact_f16(k) && (level != Level::Avx2 || fp8.pow2_exact_f32(k))
            },
            tag: |r| Bits16::F16(r),
            want: Fp8::encode_f16,
        };
        for fp8 in [Fp8::E4M3, Fp8::E5M2] {
            // Every exponent of the f16 lanes (AVX-512), then those of AVX2's route.
            let all: Vec<i32> = (-126..=127).collect();
            let avx2: Vec<i32> = (-126..=126 - fp8.bias).collect();
            for plus_zero in [false, true] {
                // Vectors mix lanes that lift subnormals with lanes that do not; then every
                // lane under one exponent that lifts them, whole rows of neighbouring
                // patterns on the fast route.
                let checked = check_lane_passes(&f16, fp8, plus_zero, &all)
                    | check_lane_passes(&f16, fp8, plus_zero, &avx2);
                // Neighbouring exponents that differ lane by lane (and between a vector's
                // halves): most chunks of neighbouring patterns then stay on the fast
                // routes, each lane under its own constants.
                let near: Vec<i32> = (0..64).map(|j| j % 7 - 3).collect();
                if !checked
                    || !check_lanes(&f16, fp8, plus_zero, &[20; 64])
                    || !check_lanes(&f16, fp8, plus_zero, &near)
                {
                    eprintln!("skipped: this CPU has neither AVX-512 nor AVX2");
                    return;
                }
            }
        }
        let mut lanes = LaneExps::new();
        assert!(!lanes.set_f16(Fp8::E4M3, &[-127; 32]));
        assert!(lanes.is_empty());
        // The AVX2 route's narrower range: 120 is exact for f16 lanes, not for E4M3's
        // bf16 kernel.
        assert!(lanes.set_f16(Fp8::E4M3, &[120; 32]));
        assert!(!lanes.set_for(Level::Avx2, Bits16::F16(&[]), Fp8::E4M3, &[120; 32]));
        assert!(lanes.is_empty());
    }

    #[test]
    fn the_f32_route_is_the_reference() {
        // Spot values of `encode_f16`, worked by hand: an f16 subnormal reaching a
        // normal code, a tie, saturation and the specials.
        let e4 = Fp8::E4M3;
        assert_eq!(e4.encode_f16(0x0001, 30, false), 0x68); // 2^-24 * 2^30 = 64 = 2^6
        assert_eq!(e4.encode_f16(0x0003, 20, false), 0x24); // 3 * 2^-4 = 1.5 * 2^-3
        assert_eq!(e4.encode_f16(0x3C40, 0, false), 0x38); // 1.0625 ties down to 1.0
        assert_eq!(e4.encode_f16(0x3CC0, 0, false), 0x3A); // 1.1875 ties up to 1.25
        assert_eq!(e4.encode_f16(0x3C48, 0, false), 0x39); // 1.0703125 rounds to 1.125
        assert_eq!(e4.encode_f16(0x7C00, -10, false), 0x7E); // +inf saturates
        assert_eq!(e4.encode_f16(0xFE00, 0, false), 0x7F); // NaN
        assert_eq!(e4.encode_f16(0x8000, 3, false), 0x80);
        assert_eq!(e4.encode_f16(0x8000, 3, true), 0x00);
        assert_eq!(Fp8::E5M2.encode_f16(0x7BFF, 0, false), 0x7B); // 65504 -> 57344
    }

    #[test]
    fn refuses_exponents_without_a_normal_f32_multiplier() {
        let src = [0u16; 64];
        let mut dst = [1u8; 64];
        for k in [-127, 128] {
            let run = Bits16::F16(&src);
            assert!(!encode_blocks(
                Level::Avx512,
                Fp8::E4M3,
                run,
                32,
                &[0, k],
                false,
                &mut dst
            ));
        }
        assert!(dst.iter().all(|&d| d == 1));
    }
}
