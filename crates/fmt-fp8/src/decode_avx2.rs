//! The AVX2 decode of a run of FP8 codes: `out[j] = T(decode(codes[j]) * scale[j])`, the
//! twin of [`crate::x86`]'s AVX-512 decoder, 8 codes per step in registers.
//!
//! Each code is decoded with the arithmetic of [`e4m3::decode_fast`] /
//! [`e5m2::decode_fast`] (the magnitude bits shifted into an f32 and rebiased by one
//! exact multiply, NaN and infinity patched in by compare masks, the sign or-ed in),
//! multiplied by its scale (the same IEEE product), narrowed in the register (bf16 by
//! [`narrow16`], the integer rounding of [`bf16_bits`]; f16 by `vcvtps2ph`, what
//! [`quant_core::Element::narrow_slice`] uses) and written by
//! [`quant_core::stream::avx2`]'s step writers, streamed in
//! [`StoreMode::Streaming`]. One loop per element type and scale source, as at AVX-512.
//!
//! The portable loop it replaces at AVX2 decoded each 128 values into a scratch and
//! narrowed and wrote them from there. Its speed then depended on where that scratch
//! lay: a load whose address shares its low 12 bits with a store in flight waits on it
//! (4K aliasing), and the scratch, the column scales and the output blocks (at one
//! offset modulo 4096 in every output row) met that way or not by the layout of the
//! caller's frame: the per-tensor columnwise dequantize at AVX2 took 19.5-20 ms into
//! bf16 where FP8 1x128's took 13.4-14.
//!
//! **The fast loops.** Where the run's scales fold ([`Folded`]: each scale times the
//! element type's rebias is finite) and a piece of the run holds no code that decodes to
//! NaN or an infinity, each 8 codes take 4 operations instead of 10
//! ([`quant_core::codec::folded`]: the sign-extended code shifted into place, masked to
//! its sign and magnitude bits, and multiplied by the folded scale). No product is then
//! NaN, so bf16 output narrows without the NaN select ([`narrow16_no_nan`]). In process
//! (8192x8192, two Zen 4 cores at AVX2, FP8 per-tensor E4M3, 3 A/B pairs against the
//! general loops and, rowwise, the portable loop): columnwise into bf16 x1.41, f16
//! x1.28, f32 x1.02; rowwise into bf16 x1.57, f16 x1.18, f32 x1.14.
//!
//! [`e4m3::decode_fast`]: quant_core::codec::e4m3::decode_fast
//! [`e5m2::decode_fast`]: quant_core::codec::e5m2::decode_fast
//! [`bf16_bits`]: quant_core::dtype::bf16_bits

use std::arch::x86_64::{
    __m128i, __m256, __m256i, _MM_FROUND_TO_NEAREST_INT, _mm_loadl_epi64, _mm256_and_si256,
    _mm256_blendv_ps, _mm256_castps_si256, _mm256_castsi256_ps, _mm256_cmpeq_epi32,
    _mm256_cmpgt_epi32, _mm256_cvtepu8_epi32, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_mul_ps,
    _mm256_or_si256, _mm256_set_m128i, _mm256_set1_epi32, _mm256_set1_ps, _mm256_slli_epi32,
};

use quant_core::Element;
use quant_core::bf16_narrow::avx2::{narrow16, narrow16_no_nan};
use quant_core::codec::folded;
use quant_core::dtype::FloatsMut;
use quant_core::dtype::bf16_bits;
use quant_core::simd::Level;
use quant_core::stream::avx2::{write_f32_steps, write_u16_steps};
use quant_core::stream::{StoreMode, line_chunks};

use crate::kernels::{Folded, Scales};
use crate::scale::Fp8Dtype;
use crate::x86::{decode_one, variant};

/// Decodes `codes` times `scale` into `out` (codes, output and a per-code scale all the
/// same length) in `mode` (the streamed stores' fence left to the caller's
/// [`quant_core::stream::Fence`]): where `folded` (the same scales, [`Folded`]) is
/// given, each [`PIECE`] of the run that holds no special code through the fast loops,
/// the others through the general ones; without it, the whole run through the general
/// ones. Returns `false`, having written nothing, unless `level` is
/// [`Level::Avx2`] (the CPU has it), `T` is a float type and the lengths agree; the
/// caller then runs the portable loop, which gives the same bits.
#[inline(always)]
pub(crate) fn decode_run<T: Element>(
    level: Level,
    dt: Fp8Dtype,
    codes: &[u8],
    (scale, folded): (Scales<'_>, Option<Folded<'_>>),
    out: &mut [T],
    mode: StoreMode,
) -> bool {
    let n = out.len();
    let fits = codes.len() == n && scale.fit(n) && folded.is_none_or(|f| f.scales().fit(n));
    if level != Level::Avx2 || !level.is_supported() || !fits {
        return false;
    }
    match FloatsMut::of(out) {
        Some(FloatsMut::F32(o)) => pieces(dt, codes, (scale, folded), o, |c, s, o| {
            // SAFETY: the CPU has the AVX2 level's features (checked above).
            unsafe { decode_run_f32(dt, c, s, o, mode) }
        }),
        Some(FloatsMut::Bf16(o)) => pieces(dt, codes, (scale, folded), o, |c, s, o| {
            // SAFETY: as above.
            unsafe { decode_run_bf16(dt, c, s, o, mode) }
        }),
        Some(FloatsMut::F16(o)) => pieces(dt, codes, (scale, folded), o, |c, s, o| {
            // SAFETY: as above (`Level::Avx2` includes F16C).
            unsafe { decode_run_f16(dt, c, s, o, mode) }
        }),
        None => return false,
    }
    true
}

/// Codes per piece of a run with folded scales: each piece is checked for special codes
/// just before it decodes, so the check's reads stay in L1 for the decode. A check of
/// the whole run first (64 KiB runs in the per-tensor rowwise dequantize) read the
/// codes from memory with nothing to overlap, then decoded with nothing to read:
/// in process, x0.85 into f16 and x0.87 into bf16 against no check at all.
const PIECE: usize = 2048;

/// `run(codes, (scales, fast), out)` over the run: whole, through the general loops,
/// without `folded`; else piece by piece ([`PIECE`], cut on the output's lines, so that
/// streamed pieces never split one), each through the fast loops unless it holds a
/// special code.
#[inline(always)]
fn pieces<O>(
    dt: Fp8Dtype,
    codes: &[u8],
    (scale, folded): (Scales<'_>, Option<Folded<'_>>),
    out: &mut [O],
    run: impl Fn(&[u8], (Scales<'_>, bool), &mut [O]),
) {
    let Some(folded) = folded else {
        return run(codes, (scale, false), out);
    };
    for r in line_chunks(out, out.len(), PIECE) {
        let c = &codes[r.clone()];
        let fast = !folded::has_special(dt.pow2_codec(), c);
        let s = if fast { folded.scales() } else { scale };
        run(c, (s.cut(r.clone()), fast), &mut out[r]);
    }
}

/// E4M3 codes `c` (one per u32 lane, below 256) as f32: [`e4m3::decode_fast`].
///
/// [`e4m3::decode_fast`]: quant_core::codec::e4m3::decode_fast
#[inline]
#[target_feature(enable = "avx2")]
fn e4m3_8(c: __m256i) -> __m256 {
    let mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
    // 2^(127 - 7): rebias the exponent field from 7 to 127 (exact).
    let v = _mm256_castsi256_ps(_mm256_slli_epi32::<20>(mag));
    let v = _mm256_mul_ps(v, _mm256_set1_ps(f32::from_bits(247 << 23)));
    let nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F)));
    with_sign(c, _mm256_blendv_ps(v, _mm256_set1_ps(f32::NAN), nan))
}

/// E5M2 codes `c` (one per u32 lane, below 256) as f32: [`e5m2::decode_fast`].
///
/// [`e5m2::decode_fast`]: quant_core::codec::e5m2::decode_fast
#[inline]
#[target_feature(enable = "avx2")]
fn e5m2_8(c: __m256i) -> __m256 {
    let mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
    // 2^(127 - 15).
    let v = _mm256_castsi256_ps(_mm256_slli_epi32::<21>(mag));
    let v = _mm256_mul_ps(v, _mm256_set1_ps(f32::from_bits(239 << 23)));
    let inf = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7C)));
    let nan = _mm256_castsi256_ps(_mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7C)));
    let v = _mm256_blendv_ps(v, _mm256_set1_ps(f32::INFINITY), inf);
    with_sign(c, _mm256_blendv_ps(v, _mm256_set1_ps(f32::NAN), nan))
}

/// `v` with the sign bit of each lane's code (bit 7) copied in.
#[inline]
#[target_feature(enable = "avx2")]
fn with_sign(c: __m256i, v: __m256) -> __m256 {
    let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(c, _mm256_set1_epi32(0x80)));
    _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign))
}

/// Codes `j..j + 8` decoded, times their scales: with `FAST`, [`unbiased_8`] times the
/// folded scales ([`Folded`]; no code special), else the full decode times the scales.
///
/// [`unbiased_8`]: folded::avx2::unbiased_8
#[inline]
#[target_feature(enable = "avx2")]
fn step<const FAST: bool>(dt: Fp8Dtype, codes: &[u8], scale: Scales<'_>, j: usize) -> __m256 {
    let c = &codes[j..j + 8];
    // SAFETY: `c` is 8 bytes (one unaligned 64-bit load).
    let c = unsafe { _mm_loadl_epi64(c.as_ptr().cast()) };
    let s = match scale {
        Scales::One(s) => _mm256_set1_ps(s),
        Scales::Each(s) => {
            let s = &s[j..j + 8];
            // SAFETY: `s` is 8 f32 (one unaligned 256-bit load).
            unsafe { _mm256_loadu_ps(s.as_ptr()) }
        }
    };
    decode8::<FAST>(dt, c, s)
}

/// The 8 codes in the low bytes of `c` decoded, times the scales `s`: with `FAST`,
/// [`unbiased_8`] times folded scales ([`Folded`]; no code may be special), else the
/// full decode times the scales. The step of every AVX2 decoder of a run, and of the
/// register route of [`crate::transposed_avx2`].
///
/// [`unbiased_8`]: folded::avx2::unbiased_8
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn decode8<const FAST: bool>(dt: Fp8Dtype, c: __m128i, s: __m256) -> __m256 {
    let v = if FAST {
        folded::avx2::unbiased_8(dt.pow2_codec(), c)
    } else {
        let c = _mm256_cvtepu8_epi32(c);
        match dt {
            Fp8Dtype::E4M3 => e4m3_8(c),
            Fp8Dtype::E5M2 => e5m2_8(c),
        }
    };
    _mm256_mul_ps(v, s)
}

/// The two functions of one output type, as [`crate::x86`]'s `output_loops!`: `$run`
/// picks one loop per element type, scale source and route (`$looped`, a function of
/// its own for each variant), so that none is tested per step; `$write(out, mode, dt,
/// codes, scale)` is the loop's body. The body names the route as the loop's constant
/// `FAST`, not as a value passed in: LLVM weighs a closure for inlining before such a
/// value is known, and left the f16 step, with both routes in it, out of line.
macro_rules! output_loops {
    ($(#[$doc:meta])* $run:ident, $looped:ident, $out:ty, $write:expr) => {
        $(#[$doc])*
        #[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
        fn $run(
            dt: Fp8Dtype,
            codes: &[u8],
            (scale, fast): (Scales<'_>, bool),
            out: &mut [$out],
            mode: StoreMode,
        ) {
            use Fp8Dtype::{E4M3, E5M2};
            let (one, each) = match scale {
                Scales::One(s) => (s, &[][..]),
                Scales::Each(s) => (0.0, s),
            };
            let by_each = matches!(scale, Scales::Each(_));
            match (dt, by_each, fast) {
                (E4M3, false, false) => $looped::<false, false, false>(codes, one, each, out, mode),
                (E5M2, false, false) => $looped::<true, false, false>(codes, one, each, out, mode),
                (E4M3, true, false) => $looped::<false, true, false>(codes, one, each, out, mode),
                (E5M2, true, false) => $looped::<true, true, false>(codes, one, each, out, mode),
                (E4M3, false, true) => $looped::<false, false, true>(codes, one, each, out, mode),
                (E5M2, false, true) => $looped::<true, false, true>(codes, one, each, out, mode),
                (E4M3, true, true) => $looped::<false, true, true>(codes, one, each, out, mode),
                (E5M2, true, true) => $looped::<true, true, true>(codes, one, each, out, mode),
            }
        }

        /// The loop of one variant ([`variant`]; `FAST`: the folded route).
        #[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
        fn $looped<const E5M2: bool, const EACH: bool, const FAST: bool>(
            codes: &[u8],
            one: f32,
            each: &[f32],
            out: &mut [$out],
            mode: StoreMode,
        ) {
            let (dt, scale) = variant::<E5M2, EACH>(one, each);
            $write(out, mode, dt, codes, scale)
        }
    };
}

output_loops!(
    /// [`decode_run`] into f32 after its checks.
    decode_run_f32,
    f32_loop,
    f32,
    |out, mode, dt, codes, scale: Scales<'_>| write_f32_steps(
        out,
        mode,
        |j| step::<FAST>(dt, codes, scale, j),
        |j| decode_one(dt, codes[j], unfolded::<FAST>(dt, scale, j)),
    )
);
output_loops!(
    /// [`decode_run`] into bf16 bits after its checks (the fast route without the NaN
    /// select: no product is NaN there).
    decode_run_bf16,
    bf16_loop,
    u16,
    |out, mode, dt, codes, scale: Scales<'_>| write_u16_steps(
        out,
        mode,
        |j| {
            let lo = step::<FAST>(dt, codes, scale, j);
            let hi = step::<FAST>(dt, codes, scale, j + 8);
            if FAST {
                narrow16_no_nan(lo, hi)
            } else {
                narrow16(lo, hi)
            }
        },
        |j| bf16_bits(decode_one(dt, codes[j], unfolded::<FAST>(dt, scale, j))),
    )
);
output_loops!(
    /// [`decode_run`] into f16 bits after its checks (`vcvtps2ph`, round to nearest
    /// even; the ends by `half`'s conversion, the same rounding).
    decode_run_f16,
    f16_loop,
    u16,
    |out, mode, dt, codes, scale: Scales<'_>| {
        // One closure level: a nested one was left out of line.
        write_u16_steps(
            out,
            mode,
            |j| {
                let lo = step::<FAST>(dt, codes, scale, j);
                let hi = step::<FAST>(dt, codes, scale, j + 8);
                let half = |v| _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm256_set_m128i(half(hi), half(lo))
            },
            |j| {
                let v = decode_one(dt, codes[j], unfolded::<FAST>(dt, scale, j));
                half::f16::from_f32(v).to_bits()
            },
        )
    }
);

/// The scale of code `j` as the one-by-one decode of a run's ends takes it: the fast
/// route's folded scale undone (exact: a power-of-two scaling of a finite product).
#[inline(always)]
fn unfolded<const FAST: bool>(dt: Fp8Dtype, scale: Scales<'_>, j: usize) -> f32 {
    let s = scale.at(j);
    if FAST {
        s / crate::kernels::rebias(dt)
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// Decodes `codes` under `scale` (and `folded`, where given) at AVX2 into each output
    /// type in both store modes, runs of every tail length starting off a line, and
    /// checks every value against the portable decode (`decode_fast(code) * scale`) and
    /// narrowing.
    fn check_runs(dt: Fp8Dtype, codes: &[u8], scale: Scales<'_>, folded: Option<Folded<'_>>) {
        let level = Level::Avx2;
        let want: Vec<f32> = (0..codes.len())
            .map(|j| decode_one(dt, codes[j], scale.at(j)))
            .collect();
        for mode in [StoreMode::Cached, StoreMode::Streaming] {
            for at in [0, 3, 8] {
                for len in [codes.len() - at, 512, 64, 33, 17, 15, 8, 1, 0] {
                    let (c, w) = (&codes[at..at + len], &want[at..at + len]);
                    let folded = folded.map(|f| f.cut(at, len));
                    let scale = match scale {
                        Scales::Each(s) => Scales::Each(&s[at..at + len]),
                        one => one,
                    };
                    let scale = (scale, folded);
                    let case = format!("{dt:?} {mode:?} {at}+{len}");
                    // Outputs start `at` elements past a line, with room around.
                    let mut buf = quant_core::HostBytes::zeroed(4 * (len + 64));
                    let f: &mut [f32] = bytemuck::cast_slice_mut(buf.as_mut_slice());
                    let f = &mut f[at..at + len];
                    assert!(decode_run(level, dt, c, scale, f, mode));
                    for (i, (g, x)) in f.iter().zip(w).enumerate() {
                        assert_eq!(g.to_bits(), x.to_bits(), "f32 {case}: {i}");
                    }
                    let b: &mut [bf16] = bytemuck::cast_slice_mut(buf.as_mut_slice());
                    let b = &mut b[at..at + len];
                    assert!(decode_run(level, dt, c, scale, b, mode));
                    for (i, (g, x)) in b.iter().zip(w).enumerate() {
                        assert_eq!(g.to_bits(), bf16_bits(*x), "bf16 {case}: {i}");
                    }
                    let h: &mut [f16] = bytemuck::cast_slice_mut(buf.as_mut_slice());
                    let h = &mut h[at..at + len];
                    assert!(decode_run(level, dt, c, scale, h, mode));
                    for (i, (g, x)) in h.iter().zip(w).enumerate() {
                        let want = f16::from_f32(*x).to_bits();
                        assert_eq!(g.to_bits(), want, "f16 {case}: {i}");
                    }
                }
            }
        }
    }

    /// Every code in every position, under one scale and under per-code scales that
    /// include zero, a subnormal product, overflow to infinity and NaN, through the
    /// general loops.
    #[test]
    fn every_code_decodes_as_the_portable_loop() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let codes: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).chain(0..77).collect();
        let factors = [
            1.0f32,
            0.0,
            -0.0,
            1.0e-45,
            3.5e-39,
            f32::MAX,
            1.0e5,
            f32::NAN,
            0.3,
        ];
        let each: Vec<f32> = (0..codes.len())
            .map(|j| factors[j % factors.len()])
            .collect();
        for dt in [Fp8Dtype::E4M3, Fp8Dtype::E5M2] {
            check_runs(dt, &codes, Scales::One(0.75), None);
            check_runs(dt, &codes, Scales::Each(&each), None);
        }
        // Lengths that do not fit, and other levels, are declined.
        let mut out = [0f32; 8];
        let (c7, c8, s7) = (&codes[..7], &codes[..8], &[1.0f32; 7]);
        let (mode, e4) = (StoreMode::Cached, Fp8Dtype::E4M3);
        let one = (Scales::One(1.0), None);
        assert!(!decode_run(Level::Avx2, e4, c7, one, &mut out, mode));
        let each7 = (Scales::Each(s7), None);
        assert!(!decode_run(Level::Avx2, e4, c8, each7, &mut out, mode));
        let mut buf = [0f32; 7];
        let folded7 = (Scales::One(1.0), Folded::each(e4, s7, &mut buf));
        assert!(folded7.1.is_some());
        assert!(!decode_run(Level::Avx2, e4, c8, folded7, &mut out, mode));
        assert!(!decode_run(Level::Scalar, e4, c8, one, &mut out, mode));
    }

    /// The fast loops ([`Folded`] scales): every code that is not special in every
    /// position, under one scale and per-code scales (zeros of both signs, subnormal
    /// products, the largest scales that fold, negative ones), the same bits as the
    /// portable decode; runs holding a special code take the general loops, with the
    /// same result; scales that do not fold are refused by [`Folded`].
    #[test]
    fn folded_scales_decode_as_the_portable_loop() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        for dt in [Fp8Dtype::E4M3, Fp8Dtype::E5M2] {
            let special = |c: u8| folded::has_special(dt.pow2_codec(), &[c]);
            let all = (0..=255u8).chain((0..=255u8).rev()).chain(0..77);
            let plain: Vec<u8> = all.filter(|&c| !special(c)).collect();
            assert!(!folded::has_special(dt.pow2_codec(), &plain));
            // The largest scale that folds: `2^8` (E4M3) or `2^16` (E5M2), one ulp down.
            let top = f32::from_bits((crate::kernels::rebias(dt).recip() * f32::MAX).to_bits());
            assert!(Folded::one(dt, top).is_some(), "{dt:?} {top}");
            let over = f32::from_bits(top.to_bits() + 1);
            for bad in [over, f32::INFINITY, f32::NAN, -over] {
                assert!(Folded::one(dt, bad).is_none(), "{dt:?} {bad}");
            }
            let factors = [
                1.0f32, 0.0, -0.0, 1.0e-45, 3.5e-39, top, -top, 0.3, -7.5, 2.0e-20,
            ];
            for &s in &factors {
                let f = Folded::one(dt, s).expect("folds");
                check_runs(dt, &plain, Scales::One(s), Some(f));
            }
            let each: Vec<f32> = (0..plain.len())
                .map(|j| factors[j % factors.len()])
                .collect();
            let mut buf = vec![0f32; each.len()];
            let f = Folded::each(dt, &each, &mut buf).expect("folds");
            check_runs(dt, &plain, Scales::Each(&each), Some(f));
            // One scale that does not fold refuses the run's.
            let mut bad = each.clone();
            bad[77] = over;
            assert!(Folded::each(dt, &bad, &mut buf).is_none());
            // A special code anywhere in the run: the general loops, the same bits.
            let mut mixed = plain.clone();
            for (at, c) in [(5, 0xFF), (300, 0x7F), (100, 0x7C), (101, 0xFD)] {
                mixed[at] = c;
            }
            assert!(folded::has_special(dt.pow2_codec(), &mixed));
            let f = Folded::one(dt, 0.75).expect("folds");
            check_runs(dt, &mixed, Scales::One(0.75), Some(f));
            // Runs of several pieces, one piece holding a special code: that piece takes
            // the general loops, the others the fast ones.
            let mut long: Vec<u8> = plain.iter().copied().cycle().take(3 * PIECE + 77).collect();
            long[PIECE + 9] = 0xFF;
            let each: Vec<f32> = (0..long.len())
                .map(|j| factors[j % factors.len()])
                .collect();
            let mut buf = vec![0f32; long.len()];
            let f = Folded::each(dt, &each, &mut buf).expect("folds");
            check_runs(dt, &long, Scales::Each(&each), Some(f));
        }
    }
}
