//! f32 -> bf16 narrowing with the CPU's own instruction, where it is exact.
//!
//! Every dequantize to bf16 ends in a round-to-nearest-even narrowing. Written portably
//! ([`crate::dtype::bf16_bits`]) that is about a dozen vector operations per 16 values
//! plus a pack, the largest part of the bf16 dequantize profiles. AVX-512 BF16's
//! `vcvtne2ps2bf16` narrows 32 values in one instruction with the same rounding and the
//! same NaN rule (the quiet bit set, the sign and top payload bits kept: Intel SDM,
//! `convert_fp32_to_bfloat16`), with one exception: it treats **subnormal** inputs as
//! zero, where bf16 (which shares f32's exponent range) has subnormals of its own. So a
//! step of 32 values first asks `vfpclassps` whether any of them is subnormal and, if
//! one is, narrows that step with the portable formula instead. Subnormal f32 outputs
//! are rare in dequantization (they need a tiny scale), and the test below compares the
//! two paths on every class of input anyway.
//!
//! Used only when the active SIMD level is [`Level::Avx512`] and the CPU has
//! `avx512bf16`. At [`Level::Avx2`] the same formula runs in integer lanes instead
//! ([`avx2::narrow16`]): compiled from the portable loop, LLVM narrowed each value's
//! 32-bit result to 16 bits before the NaN select and blended 16-bit lanes, and that loop
//! was more than half of the NVFP4 dequantize into bf16 at AVX2 (19 ms, against 13 ms
//! into f32). At [`Level::Scalar`] the portable loop runs.
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use crate::simd::Level;

/// Narrows `src` into `dst` (bf16 bit patterns, the same length) with the hardware
/// instruction; `false` (nothing written) where it is not available. Same bits as
/// [`crate::dtype::bf16_bits`] on every input.
#[inline]
pub(crate) fn narrow(src: &[f32], dst: &mut [u16]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() == Level::Avx512 && crate::simd::has(crate::simd::Ext::Bf16) {
        // SAFETY: the CPU has AVX-512 F, BW, DQ (`Level::Avx512`) and BF16 (checked).
        unsafe { x86::narrow(src, dst) };
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() == Level::Avx2 {
        // SAFETY: the CPU has AVX2 (`Level::Avx2` is only active where it does).
        unsafe { avx2::narrow(src, dst) };
        return true;
    }
    let _ = (src, dst);
    false
}

/// The AVX2 narrowing: [`crate::dtype::bf16_bits`] in 32-bit integer lanes, for kernels
/// at [`Level::Avx2`] that narrow in registers and for this module's slice narrowing.
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use std::arch::x86_64::{
        __m256, __m256i, _mm256_add_epi32, _mm256_and_si256, _mm256_blend_epi16,
        _mm256_blendv_epi8, _mm256_castps_si256, _mm256_cmpgt_epi32, _mm256_loadu_ps,
        _mm256_or_si256, _mm256_packus_epi32, _mm256_permute4x64_epi64, _mm256_set1_epi32,
        _mm256_slli_epi32, _mm256_srli_epi32, _mm256_storeu_si256,
    };

    use crate::dtype::bf16_bits;

    /// The bits of 8 values plus the round-to-nearest-even addend (`0x7FFF`, and one
    /// more where bit 16 is set): the rounded bf16 bits are the high half of each lane,
    /// for every lane that is not NaN (a NaN's payload can carry into its sign or
    /// exponent). 5 operations, where [`round8`]'s NaN select takes 5 more.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn biased(v: __m256) -> __m256i {
        let b = _mm256_castps_si256(v);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
        _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)))
    }

    /// 8 values rounded to bf16, the bits in the low half of each 32-bit lane (the high
    /// half zero): [`bf16_bits`] on every lane, round to nearest even, NaN quieted with
    /// its sign and top payload bits kept. Shifted up by 16, the lanes are the rounded
    /// values as f32.
    ///
    /// Call it from a function that enables AVX2 (it then inlines).
    ///
    /// # Safety
    /// The CPU must have AVX2 (a caller without it enabled needs `unsafe` and a run-time
    /// check).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn round8(v: __m256) -> __m256i {
        let b = _mm256_castps_si256(v);
        let high = _mm256_srli_epi32::<16>(b);
        let rounded = _mm256_srli_epi32::<16>(biased(v));
        // A signed compare is right here: the magnitude is at most `0x7FFF_FFFF`.
        let is_nan = _mm256_cmpgt_epi32(
            _mm256_and_si256(b, _mm256_set1_epi32(0x7FFF_FFFF)),
            _mm256_set1_epi32(0x7F80_0000),
        );
        let nan = _mm256_or_si256(high, _mm256_set1_epi32(0x0040));
        _mm256_blendv_epi8(rounded, nan, is_nan)
    }

    /// 16 values (`lo` then `hi`) narrowed to bf16 bit patterns, lane `i` holding value
    /// `i`: [`bf16_bits`] on every lane, subnormals included. `vpackusdw` packs within
    /// 128-bit halves (every rounded lane is at most `0xFFFF`, so it never saturates);
    /// one `vpermq` puts the halves in order.
    ///
    /// Call it from a function that enables AVX2 (it then inlines).
    ///
    /// # Safety
    /// The CPU must have AVX2 (a caller without it enabled needs `unsafe` and a run-time
    /// check).
    ///
    /// Checked against `bf16_bits` on every rounding case by this module's tests.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn narrow16(lo: __m256, hi: __m256) -> __m256i {
        _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(round8(lo), round8(hi)))
    }

    /// [`narrow16`] for values known not to be NaN (finite scales times finite codes,
    /// say): the NaN select left out, 12 operations per 16 values where [`narrow16`]
    /// takes 22. A NaN lane comes out as some bit pattern other than the quiet NaN
    /// [`bf16_bits`] gives (no undefined behaviour); infinities and values that round
    /// past `bf16::MAX` come out as infinities, as there.
    ///
    /// Call it from a function that enables AVX2 (it then inlines).
    ///
    /// # Safety
    /// The CPU must have AVX2 (a caller without it enabled needs `unsafe` and a run-time
    /// check).
    ///
    /// Checked against `bf16_bits` on every non-NaN rounding case by this module's tests.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn narrow16_no_nan(lo: __m256, hi: __m256) -> __m256i {
        let (lo, hi) = (
            _mm256_srli_epi32::<16>(biased(lo)),
            _mm256_srli_epi32::<16>(biased(hi)),
        );
        _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(lo, hi))
    }

    /// 16 values given as pairs, `even` holding values 0, 2, .., 14 and `odd` values 1,
    /// 3, .., 15, narrowed to bf16 bit patterns in order (lane `i` holding value `i`):
    /// [`bf16_bits`] on every lane. Each 32-bit lane of the result is one pair, the even
    /// value's bits in its low half, so no pack or permute is needed: a decoder whose
    /// 16 values come as two interleaved halves (the two nibbles of each byte, say)
    /// writes them with this instead of [`narrow16`].
    ///
    /// `no_nan` says that no lane is NaN (a finite scale times finite values, say): the
    /// NaN select is then left out, 10 operations per 16 values where the full rounding
    /// takes 22. A NaN lane under `no_nan` comes out as some bit pattern other than the
    /// quiet NaN [`bf16_bits`] gives (no undefined behaviour).
    ///
    /// Call it from a function that enables AVX2 (it then inlines).
    ///
    /// # Safety
    /// The CPU must have AVX2 (a caller without it enabled needs `unsafe` and a run-time
    /// check).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn narrow16_pairs(even: __m256, odd: __m256, no_nan: bool) -> __m256i {
        if no_nan {
            // The rounding addend in place, without the final shift: the odd value's
            // rounded bits are then already in the high half of its lane.
            _mm256_blend_epi16::<0b1010_1010>(_mm256_srli_epi32::<16>(biased(even)), biased(odd))
        } else {
            _mm256_or_si256(round8(even), _mm256_slli_epi32::<16>(round8(odd)))
        }
    }

    /// [`super::narrow`] over `min(src.len(), dst.len())` values.
    #[target_feature(enable = "avx2")]
    pub(super) fn narrow(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let (src, dst) = (&src[..n], &mut dst[..n]);
        let mut s = src.chunks_exact(16);
        let mut d = dst.chunks_exact_mut(16);
        for (s, d) in (&mut s).zip(&mut d) {
            // SAFETY: `s` is 16 f32 (two unaligned 256-bit loads).
            let (lo, hi) = unsafe {
                (
                    _mm256_loadu_ps(s.as_ptr()),
                    _mm256_loadu_ps(s[8..].as_ptr()),
                )
            };
            // SAFETY: `d` is 16 u16 = 32 bytes (one unaligned 256-bit store).
            unsafe { _mm256_storeu_si256(d.as_mut_ptr().cast(), narrow16(lo, hi)) };
        }
        for (o, &x) in d.into_remainder().iter_mut().zip(s.remainder()) {
            *o = bf16_bits(x);
        }
    }
}

/// The AVX-512 step that both this module's slice narrowing and format kernels that narrow in registers use.
#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use std::arch::x86_64::{
        __m256i, __m512, __m512i, _mm512_add_epi32, _mm512_and_si512, _mm512_castps_si512,
        _mm512_castsi256_si512, _mm512_cmpgt_epu32_mask, _mm512_cvtepi32_epi16,
        _mm512_cvtne2ps_pbh, _mm512_fpclass_ps_mask, _mm512_inserti64x4, _mm512_loadu_ps,
        _mm512_mask_blend_epi32, _mm512_or_si512, _mm512_set1_epi32, _mm512_srli_epi32,
        _mm512_storeu_si512,
    };

    use crate::dtype::bf16_bits;

    /// `vfpclassps` category bit of subnormal (denormal) values.
    const SUBNORMAL: i32 = 0x20;

    /// 32 values (`lo` then `hi`) narrowed to bf16 bit patterns, lane `i` of the result
    /// holding value `i`; `None` when one of them is subnormal, which the instruction
    /// would flush to zero (narrow that step with [`crate::dtype::bf16_bits`] instead).
    /// Otherwise the same bits as `bf16_bits` (round to nearest even, NaN quieted).
    ///
    /// Call it from a function that enables these features (it then inlines).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW, DQ and BF16 (a caller without those features
    /// enabled needs `unsafe` and a run-time check).
    ///
    /// Checked against `bf16_bits` through the slice narrowing by this module's tests
    /// (rustdoc does not collect examples on this `#[target_feature]` item).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16")]
    pub fn narrow32(lo: __m512, hi: __m512) -> Option<__m512i> {
        let subnormal =
            _mm512_fpclass_ps_mask::<SUBNORMAL>(lo) | _mm512_fpclass_ps_mask::<SUBNORMAL>(hi);
        // Lanes 0..16 from the second operand (`lo`), 16..32 from the first.
        // SAFETY: both are 512-bit plain vector types; every bit pattern is valid for
        // either.
        (subnormal == 0).then(|| unsafe { std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo)) })
    }

    /// [`narrow32`] on every input: the instruction where it is exact, otherwise (a step
    /// holding a subnormal) the 32 values narrowed one by one with
    /// [`crate::dtype::bf16_bits`]. Always the same bits as `bf16_bits`, as one vector
    /// (lane `i` holds value `i`), for kernels that store whole vectors (a streamed
    /// [`crate::stream::x86::LineWriter`], say).
    ///
    /// # Safety
    /// As for [`narrow32`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16")]
    pub fn narrow32_exact(lo: __m512, hi: __m512) -> __m512i {
        // Not `unwrap_or_else` with a closure: the closure borrows both vectors, so LLVM
        // stored them to the stack on every step, before the (rare) subnormal test; a
        // decode loop spent a tenth of its samples on those two stores.
        match narrow32(lo, hi) {
            Some(v) => v,
            None => narrow32_int(lo, hi),
        }
    }

    /// 32 values (`lo` then `hi`) narrowed by [`narrow16_int`], lane `i` holding value
    /// `i`: the bits of [`bf16_bits`] on every input, without AVX-512 BF16. The subnormal
    /// path of [`narrow32_exact`], and the streamed bf16 writer's narrowing on CPUs
    /// without BF16. Inlined, in registers: as a call (it once narrowed each value
    /// through memory, `#[cold]`) it clobbered every vector register, and the loops
    /// around it kept their constants on the stack, reloading them every step.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW (a caller without those features enabled
    /// needs `unsafe` and a run-time check).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub fn narrow32_int(lo: __m512, hi: __m512) -> __m512i {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(narrow16_int(lo)), narrow16_int(hi))
    }

    /// 16 values narrowed to bf16 bit patterns by integer operations, lane `i` holding
    /// value `i`: [`crate::dtype::bf16_bits`] on every lane (round to nearest even, NaN
    /// quieted with its sign and top payload bits kept), subnormals included. For
    /// kernels on CPUs without AVX-512 BF16, and for 16-value steps.
    ///
    /// Call it from a function that enables these features (it then inlines).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW (a caller without those features enabled
    /// needs `unsafe` and a run-time check).
    ///
    /// Checked against `bf16_bits` on every rounding case by this module's tests.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub fn narrow16_int(v: __m512) -> __m256i {
        let b = _mm512_castps_si512(v);
        let high = _mm512_srli_epi32::<16>(b);
        let lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(
            b,
            _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)),
        ));
        let is_nan = _mm512_cmpgt_epu32_mask(
            _mm512_and_si512(b, _mm512_set1_epi32(0x7FFF_FFFF)),
            _mm512_set1_epi32(0x7F80_0000),
        );
        let nan = _mm512_or_si512(high, _mm512_set1_epi32(0x0040));
        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, nan))
    }

    /// [`super::narrow`] over `min(src.len(), dst.len())` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16")]
    pub(super) fn narrow(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let (src, dst) = (&src[..n], &mut dst[..n]);
        let mut s = src.chunks_exact(32);
        let mut d = dst.chunks_exact_mut(32);
        for (s, d) in (&mut s).zip(&mut d) {
            // SAFETY: `s` is 32 f32 (two unaligned 512-bit loads).
            let (lo, hi) = unsafe {
                (
                    _mm512_loadu_ps(s.as_ptr()),
                    _mm512_loadu_ps(s[16..].as_ptr()),
                )
            };
            // SAFETY: `d` is 32 u16 = 64 bytes (one unaligned 512-bit store).
            unsafe { _mm512_storeu_si512(d.as_mut_ptr().cast(), narrow32_exact(lo, hi)) };
        }
        for (o, &x) in d.into_remainder().iter_mut().zip(s.remainder()) {
            *o = bf16_bits(x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::bf16_bits;
    use quantfmt_testkit::XorShift32;

    /// Every rounding case (each low half-word pattern class, ties both ways), every
    /// exponent, both signs, NaN payloads (quiet and signalling), infinities, zeros,
    /// subnormals placed at every offset of a 32-value step, and a strided sweep of all
    /// f32 patterns.
    #[test]
    fn hardware_narrowing_equals_the_portable_formula() {
        let mut xs = rounding_cases();
        // One subnormal in an otherwise normal step, at every offset.
        for at in 0..32 {
            let mut step = [1.5f32; 32];
            step[at] = f32::from_bits(0x0001_8000);
            xs.extend_from_slice(&step);
        }
        for len in [xs.len(), xs.len() - 7, 31, 1, 0] {
            let src = &xs[..len];
            let want: Vec<u16> = src.iter().map(|&x| bf16_bits(x)).collect();
            let mut got = vec![0u16; len];
            if !narrow(src, &mut got) {
                eprintln!("note: no AVX-512 BF16 on this CPU (or level forced lower): skipped");
                return;
            }
            if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
                panic!(
                    "{:#010x}: hardware {:#06x}, portable {:#06x}",
                    src[i].to_bits(),
                    got[i],
                    want[i]
                );
            }
        }
    }

    /// Every high half-word with each class of low half-word (ties both ways, NaN
    /// payloads, infinities, zeros, subnormals), then random patterns.
    fn rounding_cases() -> Vec<f32> {
        let mut xs: Vec<f32> = Vec::new();
        for hi in 0u32..=0xFFFF {
            for lo in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                xs.push(f32::from_bits(hi << 16 | lo));
            }
        }
        let mut rng = XorShift32::new(0x9E37_79B9);
        for _ in 0..300_000 {
            xs.push(f32::from_bits(rng.next_u32()));
        }
        xs
    }

    /// [`x86::narrow16_int`] against the portable formula on the same cases.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn integer_narrowing_equals_the_portable_formula() {
        if !Level::Avx512.is_supported() {
            eprintln!("note: no AVX-512 on this CPU: skipped");
            return;
        }
        for step in rounding_cases().chunks_exact(16) {
            // SAFETY: 16 f32 are one 512-bit vector of plain data; the CPU has AVX-512 F
            // and BW (checked above); 256 bits are 16 u16.
            let got: [u16; 16] = unsafe {
                let v = std::mem::transmute::<[f32; 16], std::arch::x86_64::__m512>(
                    step.try_into().expect("16 values"),
                );
                std::mem::transmute(x86::narrow16_int(v))
            };
            let want: Vec<u16> = step.iter().map(|&x| bf16_bits(x)).collect();
            assert_eq!(got[..], want[..], "{step:?}");
        }
    }

    /// The AVX2 slice narrowing against the portable formula: every rounding case, and
    /// every length from 0 to 40 (each tail of the 16-value steps).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_narrowing_equals_the_portable_formula() {
        if !Level::Avx2.is_supported() {
            eprintln!("note: no AVX2 on this CPU: skipped");
            return;
        }
        let xs = rounding_cases();
        let lens = (0..=40).chain([xs.len()]);
        for len in lens {
            let src = &xs[xs.len() - len..];
            let mut got = vec![0u16; len];
            // SAFETY: the CPU has AVX2 (checked above).
            unsafe { avx2::narrow(src, &mut got) };
            for (x, g) in src.iter().zip(&got) {
                assert_eq!(*g, bf16_bits(*x), "{:#010x}", x.to_bits());
            }
        }
    }

    /// [`avx2::narrow16_no_nan`] against the portable formula on every non-NaN rounding
    /// case (a mutation of its addend or its shift fails here).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_no_nan_narrowing_equals_the_portable_formula() {
        if !Level::Avx2.is_supported() {
            eprintln!("note: no AVX2 on this CPU: skipped");
            return;
        }
        let finite: Vec<f32> = rounding_cases()
            .into_iter()
            .filter(|x| !x.is_nan())
            .collect();
        for step in finite.chunks_exact(16) {
            // SAFETY: 8 f32 are one 256-bit vector of plain data, as are 16 u16; the CPU
            // has AVX2 (checked above).
            let got: [u16; 16] = unsafe {
                let v = |a: &[f32]| {
                    let a: [f32; 8] = a.try_into().expect("8 values");
                    std::mem::transmute::<[f32; 8], std::arch::x86_64::__m256>(a)
                };
                std::mem::transmute(avx2::narrow16_no_nan(v(&step[..8]), v(&step[8..])))
            };
            let want: Vec<u16> = step.iter().map(|&x| bf16_bits(x)).collect();
            assert_eq!(got[..], want[..], "{step:?}");
        }
    }

    /// [`avx2::narrow16_pairs`] against the portable formula on every rounding case, in
    /// both modes (`no_nan` on the non-NaN cases only), each step's values split into
    /// even and odd lanes.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_pair_narrowing_equals_the_portable_formula() {
        if !Level::Avx2.is_supported() {
            eprintln!("note: no AVX2 on this CPU: skipped");
            return;
        }
        let all = rounding_cases();
        let finite: Vec<f32> = all.iter().copied().filter(|x| !x.is_nan()).collect();
        for (xs, no_nan) in [(&all, false), (&finite, true)] {
            for step in xs.chunks_exact(16) {
                let even: [f32; 8] = std::array::from_fn(|i| step[2 * i]);
                let odd: [f32; 8] = std::array::from_fn(|i| step[2 * i + 1]);
                // SAFETY: 8 f32 are one 256-bit vector of plain data, as are 16 u16; the
                // CPU has AVX2 (checked above).
                let got: [u16; 16] = unsafe {
                    let v =
                        |a: [f32; 8]| std::mem::transmute::<[f32; 8], std::arch::x86_64::__m256>(a);
                    std::mem::transmute(avx2::narrow16_pairs(v(even), v(odd), no_nan))
                };
                let want: Vec<u16> = step.iter().map(|&x| bf16_bits(x)).collect();
                assert_eq!(got[..], want[..], "no_nan {no_nan}: {step:?}");
            }
        }
    }

    /// All 2^32 f32 patterns (about 20 s in release):
    /// `cargo test --release -p quant-core bf16_narrow -- --ignored`.
    #[test]
    #[ignore = "exhaustive; run on demand in release"]
    fn hardware_narrowing_equals_the_portable_formula_everywhere() {
        const STEP: usize = 1 << 20;
        let mut src = vec![0f32; STEP];
        let mut got = vec![0u16; STEP];
        for base in (0..1u64 << 32).step_by(STEP) {
            for (i, x) in src.iter_mut().enumerate() {
                *x = f32::from_bits((base + i as u64) as u32);
            }
            if !narrow(&src, &mut got) {
                eprintln!("note: no AVX-512 BF16 on this CPU (or level forced lower): skipped");
                return;
            }
            for (x, g) in src.iter().zip(&got) {
                assert_eq!(*g, bf16_bits(*x), "{:#010x}", x.to_bits());
            }
        }
    }
}
