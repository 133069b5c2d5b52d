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
//! [`e4m3::decode_fast`]: quant_core::codec::e4m3::decode_fast
//! [`e5m2::decode_fast`]: quant_core::codec::e5m2::decode_fast
//! [`bf16_bits`]: quant_core::dtype::bf16_bits

use std::arch::x86_64::{
    __m256, __m256i, _MM_FROUND_TO_NEAREST_INT, _mm_loadl_epi64, _mm256_and_si256,
    _mm256_blendv_ps, _mm256_castps_si256, _mm256_castsi256_ps, _mm256_cmpeq_epi32,
    _mm256_cmpgt_epi32, _mm256_cvtepu8_epi32, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_mul_ps,
    _mm256_or_si256, _mm256_set_m128i, _mm256_set1_epi32, _mm256_set1_ps, _mm256_slli_epi32,
};

use quant_core::Element;
use quant_core::bf16_narrow::avx2::narrow16;
use quant_core::dtype::FloatsMut;
use quant_core::dtype::bf16_bits;
use quant_core::simd::Level;
use quant_core::stream::StoreMode;
use quant_core::stream::avx2::{write_f32_steps, write_u16_steps};

use crate::kernels::Scales;
use crate::scale::Fp8Dtype;
use crate::x86::{decode_one, variant};

/// Decodes `codes` times `scale` into `out` (codes, output and a per-code scale all the
/// same length) in `mode` (the streamed stores' fence left to the caller's
/// [`quant_core::stream::Fence`]). Returns `false`, having written nothing, unless
/// `level` is [`Level::Avx2`] (the CPU has it), `T` is a float type and the lengths
/// agree; the caller then runs the portable loop, which gives the same bits.
#[inline(always)]
pub(crate) fn decode_run<T: Element>(
    level: Level,
    dt: Fp8Dtype,
    codes: &[u8],
    scale: Scales<'_>,
    out: &mut [T],
    mode: StoreMode,
) -> bool {
    let fits = codes.len() == out.len() && scale.fit(out.len());
    if level != Level::Avx2 || !level.is_supported() || !fits {
        return false;
    }
    match FloatsMut::of(out) {
        // SAFETY: the CPU has the AVX2 level's features (checked above).
        Some(FloatsMut::F32(o)) => unsafe { decode_run_f32(dt, codes, scale, o, mode) },
        // SAFETY: as above.
        Some(FloatsMut::Bf16(o)) => unsafe { decode_run_bf16(dt, codes, scale, o, mode) },
        // SAFETY: as above (`Level::Avx2` includes F16C).
        Some(FloatsMut::F16(o)) => unsafe { decode_run_f16(dt, codes, scale, o, mode) },
        None => return false,
    }
    true
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

/// Codes `j..j + 8` decoded, times their scales.
#[inline]
#[target_feature(enable = "avx2")]
fn step(dt: Fp8Dtype, codes: &[u8], scale: Scales<'_>, j: usize) -> __m256 {
    let c = &codes[j..j + 8];
    // SAFETY: `c` is 8 bytes (one unaligned 64-bit load).
    let c = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(c.as_ptr().cast()) });
    let v = match dt {
        Fp8Dtype::E4M3 => e4m3_8(c),
        Fp8Dtype::E5M2 => e5m2_8(c),
    };
    let s = match scale {
        Scales::One(s) => _mm256_set1_ps(s),
        Scales::Each(s) => {
            let s = &s[j..j + 8];
            // SAFETY: `s` is 8 f32 (one unaligned 256-bit load).
            unsafe { _mm256_loadu_ps(s.as_ptr()) }
        }
    };
    _mm256_mul_ps(v, s)
}

/// The two functions of one output type, as [`crate::x86`]'s `output_loops!`: `$run`
/// picks one loop per element type and scale source (`$looped`, a function of its own
/// for each variant), so that neither is tested per step; `$write(out, mode, dt, codes,
/// scale)` is the loop's body.
macro_rules! output_loops {
    ($(#[$doc:meta])* $run:ident, $looped:ident, $out:ty, $write:expr) => {
        $(#[$doc])*
        #[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
        fn $run(dt: Fp8Dtype, codes: &[u8], scale: Scales<'_>, out: &mut [$out], mode: StoreMode) {
            use Fp8Dtype::{E4M3, E5M2};
            match (dt, scale) {
                (E4M3, Scales::One(s)) => $looped::<false, false>(codes, s, &[], out, mode),
                (E5M2, Scales::One(s)) => $looped::<true, false>(codes, s, &[], out, mode),
                (E4M3, Scales::Each(s)) => $looped::<false, true>(codes, 0.0, s, out, mode),
                (E5M2, Scales::Each(s)) => $looped::<true, true>(codes, 0.0, s, out, mode),
            }
        }

        /// The loop of one variant ([`variant`]).
        #[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
        fn $looped<const E5M2: bool, const EACH: bool>(
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
        |j| step(dt, codes, scale, j),
        |j| decode_one(dt, codes[j], scale.at(j)),
    )
);
output_loops!(
    /// [`decode_run`] into bf16 bits after its checks.
    decode_run_bf16,
    bf16_loop,
    u16,
    |out, mode, dt, codes, scale: Scales<'_>| write_u16_steps(
        out,
        mode,
        |j| narrow16(step(dt, codes, scale, j), step(dt, codes, scale, j + 8)),
        |j| bf16_bits(decode_one(dt, codes[j], scale.at(j))),
    )
);
output_loops!(
    /// [`decode_run`] into f16 bits after its checks (`vcvtps2ph`, round to nearest
    /// even; the ends by `half`'s conversion, the same rounding).
    decode_run_f16,
    f16_loop,
    u16,
    |out, mode, dt, codes, scale: Scales<'_>| {
        let half = |j| _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(step(dt, codes, scale, j));
        write_u16_steps(
            out,
            mode,
            |j| _mm256_set_m128i(half(j + 8), half(j)),
            |j| half::f16::from_f32(decode_one(dt, codes[j], scale.at(j))).to_bits(),
        )
    }
);

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// Every code in every position, under one scale and under per-code scales that
    /// include zero, a subnormal product, overflow to infinity and NaN, into each output
    /// type in both store modes, runs of every tail length and starts off a line: the
    /// bits of the portable decode (`decode_fast(code) * scale`) and narrowing.
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
        let level = Level::Avx2;
        for dt in [Fp8Dtype::E4M3, Fp8Dtype::E5M2] {
            for (what, scale) in [("one", Scales::One(0.75)), ("each", Scales::Each(&each))] {
                let want: Vec<f32> = (0..codes.len())
                    .map(|j| decode_one(dt, codes[j], scale.at(j)))
                    .collect();
                for mode in [StoreMode::Cached, StoreMode::Streaming] {
                    for at in [0, 3, 8] {
                        for len in [codes.len() - at, 512, 64, 33, 17, 15, 8, 1, 0] {
                            let (c, w) = (&codes[at..at + len], &want[at..at + len]);
                            let scale = match scale {
                                Scales::Each(s) => Scales::Each(&s[at..at + len]),
                                one => one,
                            };
                            let case = format!("{dt:?} {what} {mode:?} {at}+{len}");
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
        }
        // Lengths that do not fit, and other levels, are declined.
        let mut out = [0f32; 8];
        let (c7, c8, s7) = (&codes[..7], &codes[..8], &[1.0f32; 7]);
        let mode = StoreMode::Cached;
        assert!(!decode_run(
            level,
            Fp8Dtype::E4M3,
            c7,
            Scales::One(1.0),
            &mut out,
            mode
        ));
        assert!(!decode_run(
            level,
            Fp8Dtype::E4M3,
            c8,
            Scales::Each(s7),
            &mut out,
            mode
        ));
        let scalar = Level::Scalar;
        assert!(!decode_run(
            scalar,
            Fp8Dtype::E4M3,
            c8,
            Scales::One(1.0),
            &mut out,
            mode
        ));
    }
}
