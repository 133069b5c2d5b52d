//! The AVX-512 decode of a run of FP8 codes: `out[j] = T(decode(codes[j]) * scale[j])`.
//!
//! The portable loop decodes into an f32 span and narrows it in a second loop. This one
//! decodes 16 codes per step in registers with [`quant_core::codec::x86`] (the same
//! arithmetic as [`e4m3::decode_fast`] / [`e5m2::decode_fast`]), multiplies by the
//! scales (the same IEEE product), and writes the run through
//! [`quant_core::stream::x86::write_f32_steps`] / [`write_bf16_steps`] /
//! [`write_f16_steps`] (bf16 and f16 narrowed in registers), which hand each 64-byte result to a `LineWriter`. So a large output
//! is written with streaming stores: the columnwise dequantize writes 2 KiB runs of 512
//! output rows at a time, a pattern in which ordinary stores (each line read for
//! ownership first) took twice as long as streaming ones on a Zen 4 (13.4 ms against 5.0 ms for 128 MiB, one thread).
//!
//! [`e4m3::decode_fast`]: quant_core::codec::e4m3::decode_fast
//! [`e5m2::decode_fast`]: quant_core::codec::e5m2::decode_fast
//! [`write_bf16_steps`]: quant_core::stream::x86::write_bf16_steps
//! [`write_f16_steps`]: quant_core::stream::x86::write_f16_steps

use std::arch::x86_64::{
    __m128i, __m512, __m512i, _mm_loadu_si128, _mm512_cvtepu8_epi32, _mm512_loadu_ps,
    _mm512_mul_ps, _mm512_set1_ps,
};

use quant_core::Element;
use quant_core::codec::x86 as codec;
use quant_core::dtype::FloatsMut;
use quant_core::simd::Level;
use quant_core::stream::x86::{write_bf16_steps, write_f16_steps, write_f32_steps};
use quant_core::stream::{Fence, StoreMode};

use crate::kernels::Scales;
use crate::scale::Fp8Dtype;

/// Decodes `codes` times `scale` into `out` (codes, output and a per-code scale all the
/// same length) in `mode`, leaving the streamed stores' fence to `fence` (one per task:
/// see [`Fence`]). Returns `false`, having written nothing, unless `level` is
/// [`Level::Avx512`] (bf16 output also needs AVX-512 BF16) and the lengths agree; the
/// caller then runs the portable loop, which gives the same bits.
#[inline(always)]
pub(crate) fn decode_run<T: Element>(
    level: Level,
    dt: Fp8Dtype,
    codes: &[u8],
    scale: Scales<'_>,
    out: &mut [T],
    (mode, fence): (StoreMode, &Fence),
) -> bool {
    if level != Level::Avx512 || codes.len() != out.len() || !scale.fit(out.len()) {
        return false;
    }
    match FloatsMut::of(out) {
        // SAFETY: the CPU has AVX-512 F, BW and DQ (`Level::Avx512` is only active
        // where it does).
        Some(FloatsMut::F32(o)) => unsafe { decode_run_f32(dt, codes, scale, o, mode, fence) },
        // SAFETY: as above, and the CPU has AVX-512 BF16 (checked).
        Some(FloatsMut::Bf16(o)) if quant_core::simd::has(quant_core::simd::Ext::Bf16) => unsafe {
            decode_run_bf16(dt, codes, scale, o, mode, fence)
        },
        // SAFETY: the CPU has AVX-512 F, BW and DQ (`Level::Avx512`).
        Some(FloatsMut::F16(o)) => unsafe { decode_run_f16(dt, codes, scale, o, mode, fence) },
        _ => return false,
    }
    true
}

/// 16 codes (zero-extended to u32 lanes) decoded, times the 16 scales `s`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn decode16(dt: Fp8Dtype, c: __m512i, s: __m512) -> __m512 {
    let v = match dt {
        Fp8Dtype::E4M3 => codec::e4m3_16(c),
        Fp8Dtype::E5M2 => codec::e5m2_16(c),
    };
    _mm512_mul_ps(v, s)
}

/// Codes `j..j + 16` decoded with their scales.
#[inline]
#[target_feature(enable = "avx512f")]
fn step(dt: Fp8Dtype, codes: &[u8], scale: Scales<'_>, j: usize) -> __m512 {
    let c = &codes[j..j + 16];
    // SAFETY: `c` is 16 bytes (one unaligned 128-bit load).
    let c = unsafe { _mm_loadu_si128(c.as_ptr().cast::<__m128i>()) };
    decode16(dt, _mm512_cvtepu8_epi32(c), scale_vector(scale, j))
}

/// The scales of codes `j..j + 16`.
#[inline]
#[target_feature(enable = "avx512f")]
fn scale_vector(scale: Scales<'_>, j: usize) -> __m512 {
    match scale {
        Scales::One(s) => _mm512_set1_ps(s),
        Scales::Each(s) => {
            let s = &s[j..j + 16];
            // SAFETY: `s` is 16 f32 (one unaligned 512-bit load).
            unsafe { _mm512_loadu_ps(s.as_ptr()) }
        }
    }
}

/// The scalar step of both loops' tails.
#[inline(always)]
pub(crate) fn decode_one(dt: Fp8Dtype, code: u8, scale: f32) -> f32 {
    dt.decode_table()[usize::from(code)] * scale
}

/// The two functions of one output type: `$run`, [`decode_run`] into `$out` after its
/// checks, picks one loop per element type and scale source (`$looped`, a function of
/// its own for each variant of [`variant`]), so that neither is tested per step (in a
/// single loop LLVM kept both tests, two compares and branches per 16 codes); the loop
/// writes through `$steps`. Each pair carries its output's target features: a loop
/// compiled with fewer than its writer's could not inline it.
macro_rules! output_loops {
    ($(#[$doc:meta])* $run:ident, $looped:ident, $out:ty, $features:literal, $steps:ident) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        fn $run(
            dt: Fp8Dtype,
            codes: &[u8],
            scale: Scales<'_>,
            out: &mut [$out],
            mode: StoreMode,
            fence: &Fence,
        ) {
            use Fp8Dtype::{E4M3, E5M2};
            let how = (mode, fence);
            match (dt, scale) {
                (E4M3, Scales::One(s)) => $looped::<false, false>(codes, s, &[], out, how),
                (E5M2, Scales::One(s)) => $looped::<true, false>(codes, s, &[], out, how),
                (E4M3, Scales::Each(s)) => $looped::<false, true>(codes, 0.0, s, out, how),
                (E5M2, Scales::Each(s)) => $looped::<true, true>(codes, 0.0, s, out, how),
            }
        }

        /// The loop of one variant ([`variant`]).
        #[target_feature(enable = $features)]
        fn $looped<const E5M2: bool, const EACH: bool>(
            codes: &[u8],
            one: f32,
            each: &[f32],
            out: &mut [$out],
            how: (StoreMode, &Fence),
        ) {
            let (dt, scale) = variant::<E5M2, EACH>(one, each);
            $steps(
                out,
                how,
                |j| step(dt, codes, scale, j),
                |j| decode_one(dt, codes[j], scale.at(j)),
            );
        }
    };
}

output_loops!(
    /// [`decode_run`] into f32 after its checks.
    decode_run_f32,
    f32_loop,
    f32,
    "avx512f,avx512bw,avx512dq",
    write_f32_steps
);
output_loops!(
    /// [`decode_run`] into bf16 bits after its checks.
    decode_run_bf16,
    bf16_loop,
    u16,
    "avx512f,avx512bw,avx512dq,avx512bf16",
    write_bf16_steps
);
output_loops!(
    /// [`decode_run`] into f16 bits after its checks.
    decode_run_f16,
    f16_loop,
    u16,
    "avx512f,avx512bw,avx512dq",
    write_f16_steps
);

/// The element type a loop's constant names (`E5M2`: the kernels' variants are const
/// generic so that none tests it per step).
#[inline(always)]
pub(crate) fn dtype<const E5M2: bool>() -> Fp8Dtype {
    if E5M2 { Fp8Dtype::E5M2 } else { Fp8Dtype::E4M3 }
}

/// The element type (E5M2 or E4M3) and the scales (`each`, or `one` for the run) as
/// [`decode_run`] takes them.
#[inline(always)]
pub(crate) fn variant<'a, const E5M2: bool, const EACH: bool>(
    one: f32,
    each: &'a [f32],
) -> (Fp8Dtype, Scales<'a>) {
    (
        dtype::<E5M2>(),
        if EACH {
            Scales::Each(each)
        } else {
            Scales::One(one)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;
    use quant_core::dtype::bf16_bits;
    use quant_core::stream::with_store_mode;

    /// Every code of both element types against `table[code] * scale`, exactly (NaN bits
    /// included), into f32, bf16 and f16, in both store modes, for run lengths with every
    /// tail and output starts at every 4-byte offset of a line, with one scale per code
    /// and one for the run. The scales include tiny ones, whose products are subnormal:
    /// the hardware bf16 narrowing would flush those, so their steps must take the
    /// portable narrowing; and ones whose products are subnormal or overflow in f16.
    #[test]
    fn decode_run_equals_the_table() {
        // Under the level lock: a level test running at the same time may hide AVX-512
        // BF16 (every combination is tested), and the kernel would then decline.
        let ran = quant_core::simd::with_level(Level::Avx512, || {
            if !quant_core::simd::has(quant_core::simd::Ext::Bf16) {
                eprintln!("skipped: this CPU has no AVX-512 BF16");
                return;
            }
            let n = 700;
            let codes: Vec<u8> = (0..n).map(|i| (i * 37 % 256) as u8).collect();
            let each: Vec<f32> = (0..n)
                .map(|i| match i % 9 {
                    0 => 1e-40,
                    1 => 3.0e-39,
                    2 => 0.75,
                    3 => 2f32.powi(-126),
                    // Products subnormal and overflowing in f16.
                    4 => 1.0e-6,
                    5 => 300.0,
                    _ => 1.0 + i as f32 / 64.0,
                })
                .collect();
            for dt in [Fp8Dtype::E4M3, Fp8Dtype::E5M2] {
                for mode in [StoreMode::Cached, StoreMode::Streaming] {
                    for at in 0..16 {
                        for len in [0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 129, n - at] {
                            let c = &codes[at..at + len];
                            let sources = [1e-40, 0.75, 3.5, 1.0e-6, 300.0].map(Scales::One);
                            for scale in [Scales::Each(&each[at..at + len])]
                                .into_iter()
                                .chain(sources)
                            {
                                let want: Vec<f32> = (0..len)
                                    .map(|j| dt.decode_table()[usize::from(c[j])] * scale.at(j))
                                    .collect();
                                let case = format!("{dt} {mode:?} {at}+{len}");
                                let got = run(dt, c, scale, mode, at, f32::NAN, f32::to_bits);
                                let want_f32: Vec<u32> = want.iter().map(|w| w.to_bits()).collect();
                                assert_eq!(got, want_f32, "f32 {case}");
                                let got =
                                    run(dt, c, scale, mode, at, bf16::ONE, |v| v.to_bits().into());
                                let want_bf16: Vec<u32> =
                                    want.iter().map(|&w| u32::from(bf16_bits(w))).collect();
                                assert_eq!(got, want_bf16, "bf16 {case}");
                                let got = run(dt, c, scale, mode, at, half::f16::ONE, |v| {
                                    v.to_bits().into()
                                });
                                let want_f16: Vec<u32> = want
                                    .iter()
                                    .map(|&w| u32::from(half::f16::from_f32(w).to_bits()))
                                    .collect();
                                assert_eq!(got, want_f16, "f16 {case}");
                            }
                        }
                    }
                }
            }
        });
        if ran.is_none() {
            eprintln!("skipped: this CPU has no AVX-512");
        }
    }

    /// [`decode_run`] (in `mode`, also forced for the writer) into a buffer with room
    /// around the run, which starts `at` elements past a 64-byte line; returns the run's
    /// bit patterns (`bits`) after checking that the rest still holds `fill`.
    fn run<T: Element>(
        dt: Fp8Dtype,
        c: &[u8],
        scale: Scales<'_>,
        mode: StoreMode,
        at: usize,
        fill: T,
        bits: impl Fn(T) -> u32,
    ) -> Vec<u32> {
        let mut buf = vec![fill; c.len() + 64 + 32];
        let lead = buf.as_ptr().align_offset(64);
        let o = &mut buf[lead + at..lead + at + c.len()];
        assert!(with_store_mode(mode, || decode_run(
            Level::Avx512,
            dt,
            c,
            scale,
            o,
            (mode, &Fence::new())
        )));
        let got = o.iter().map(|&v| bits(v)).collect::<Vec<_>>();
        let untouched = |v: &T| bits(*v) == bits(fill);
        assert!(
            buf[..lead + at].iter().all(untouched),
            "wrote before the run"
        );
        assert!(
            buf[lead + at + c.len()..].iter().all(untouched),
            "wrote past the run"
        );
        got
    }

    /// Other levels and mismatched lengths are declined, untouched.
    #[test]
    fn declines_what_it_does_not_run() {
        fn runs<T: Element>(level: Level, codes: &[u8], scales: &[f32], out: &mut [T]) -> bool {
            let (each, how) = (Scales::Each(scales), (StoreMode::Cached, &Fence::new()));
            decode_run(level, Fp8Dtype::E4M3, codes, each, out, how)
        }
        let mut out = [0f32; 4];
        assert!(!runs(Level::Scalar, &[0; 4], &[1.0; 4], &mut out));
        assert!(!runs(Level::Avx512, &[0; 3], &[1.0; 4], &mut out));
        assert!(!runs(Level::Avx512, &[0; 4], &[1.0; 3], &mut out));
        assert_eq!(out, [0.0; 4]);
        let mut h = [half::f16::ONE; 4];
        assert!(!runs(Level::Avx2, &[0; 4], &[1.0; 4], &mut h));
        assert!(!runs(Level::Avx512, &[0; 5], &[1.0; 4], &mut h));
        assert_eq!(h, [half::f16::ONE; 4]);
    }
}
