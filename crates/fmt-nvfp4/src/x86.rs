//! The AVX-512 body of rowwise dequantization: 16 values (one block) per step.
//!
//! A block's 8 code bytes are duplicated byte by byte (`vpunpcklbw`), zero-extended to
//! 16 u32 lanes and shifted right by `[0, 4, 0, 4, ..]`, which leaves code `i` in the
//! low four bits of lane `i` (low nibble first, as [`e2m1::unpack`] reads a byte).
//! `vpermps` reads exactly those four bits, so one permute of [`e2m1::DECODE`] decodes
//! the block; one multiply by the block's factor is the same IEEE product as the
//! portable `decode_fast(code) * f`. bf16 output is narrowed with the integer
//! round-to-nearest-even of [`quant_core::dtype::bf16_bits`] (NaN quieted), lane for
//! lane.
//!
//! The columnwise decoder's transposed bytes hold one column each, the codes of two
//! neighbouring output rows; [`decode_nibbles`] turns one nibble of a run of them into
//! one output row's run, with the same permute and one factor per column, and writes it
//! through [`write_f32_steps`] / [`write_bf16_steps`] (streamed where the output is
//! large).

use std::arch::x86_64::{
    __m512, _MM_FROUND_NO_EXC, _MM_FROUND_TO_NEAREST_INT, _mm_loadl_epi64, _mm_loadu_si128,
    _mm_unpacklo_epi8, _mm256_storeu_si256, _mm512_cvtepu8_epi32, _mm512_cvtps_ph, _mm512_loadu_ps,
    _mm512_mul_ps, _mm512_permutexvar_ps, _mm512_set1_ps, _mm512_setr_epi32, _mm512_srli_epi32,
    _mm512_srlv_epi32, _mm512_storeu_ps, _mm512_storeu_si512,
};

use quant_core::Element;
use quant_core::bf16_narrow::x86::narrow16_int;
use quant_core::codec::e2m1;
use quant_core::dtype::FloatsMut;
use quant_core::simd::Level;
use quant_core::stream::x86::{write_bf16_steps, write_f16_steps, write_f32_steps};
use quant_core::stream::{Fence, StoreMode};

use crate::scale::BLOCK;

/// Decodes one row: `out[16b + i] = T(e2m1(code) * factor(b))` for the row's
/// `out.len() / 16` blocks, codes two per byte in `codes`. Returns `false` (nothing
/// written) unless the CPU has AVX-512, `T` is a float type and the lengths fit (whole
/// blocks, two outputs per byte); the caller then runs the portable loop.
#[inline(always)]
pub(crate) fn decode_row<T: Element>(
    codes: &[u8],
    factor: impl Fn(usize) -> f32,
    out: &mut [T],
) -> bool {
    if !Level::Avx512.is_supported()
        || !out.len().is_multiple_of(BLOCK)
        || codes.len() * 2 != out.len()
    {
        return false;
    }
    match FloatsMut::of(out) {
        // SAFETY: the CPU has AVX-512 F and BW (`Level::Avx512` includes both).
        Some(FloatsMut::F32(o)) => unsafe { decode_row_f32(codes, factor, o) },
        // SAFETY: the CPU has AVX-512 F, BW, DQ (`Level::Avx512`) and BF16 (checked).
        Some(FloatsMut::Bf16(o)) if quant_core::simd::has(quant_core::simd::Ext::Bf16) => unsafe {
            decode_row_bf16_hw(codes, factor, o)
        },
        // SAFETY: as above, without BF16.
        Some(FloatsMut::Bf16(o)) => unsafe { decode_row_bf16(codes, factor, o) },
        // SAFETY: the CPU has AVX-512 F and BW (`Level::Avx512` includes both).
        Some(FloatsMut::F16(o)) => unsafe { decode_row_f16(codes, factor, o) },
        None => return false,
    }
    true
}

/// The block's 16 values as f32: codes from 8 bytes, decoded and scaled.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn block_values(bytes: &[u8], table: __m512, f: f32) -> __m512 {
    debug_assert!(bytes.len() >= BLOCK / 2);
    // SAFETY: `bytes` holds at least 8 bytes (the callers pass whole blocks); one
    // unaligned 64-bit load.
    let b = unsafe { _mm_loadl_epi64(bytes.as_ptr().cast()) };
    let lanes = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    let shift = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    let codes = _mm512_srlv_epi32(lanes, shift);
    _mm512_mul_ps(_mm512_set1_ps(f), _mm512_permutexvar_ps(codes, table))
}

/// The decode table in a register.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn decode_table() -> __m512 {
    // SAFETY: `DECODE` is 16 f32 (one unaligned 512-bit load).
    unsafe { _mm512_loadu_ps(e2m1::DECODE.as_ptr()) }
}

/// Calls `store(b, values)` for every block `b` of `codes` (8 bytes each).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn for_each_block(
    codes: &[u8],
    factor: impl Fn(usize) -> f32,
    mut store: impl FnMut(usize, __m512),
) {
    let table = decode_table();
    for (b, c) in codes.chunks_exact(BLOCK / 2).enumerate() {
        store(b, block_values(c, table, factor(b)));
    }
}

/// [`decode_row`] for f32 output (`codes.len() * 2 == out.len()`, whole blocks).
#[target_feature(enable = "avx512f,avx512bw")]
fn decode_row_f32(codes: &[u8], factor: impl Fn(usize) -> f32, out: &mut [f32]) {
    for_each_block(codes, factor, |b, v| {
        let o = &mut out[b * BLOCK..(b + 1) * BLOCK];
        // SAFETY: `o` is 16 f32 (one unaligned 512-bit store).
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
    });
}

/// [`decode_row`] for bf16 output, as bits (`codes.len() * 2 == out.len()`, whole
/// blocks).
#[target_feature(enable = "avx512f,avx512bw")]
fn decode_row_bf16(codes: &[u8], factor: impl Fn(usize) -> f32, out: &mut [u16]) {
    for_each_block(codes, factor, |b, v| {
        let o = &mut out[b * BLOCK..(b + 1) * BLOCK];
        let v = narrow16_int(v);
        // SAFETY: `o` is 16 u16 (one unaligned 256-bit store).
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), v) };
    });
}

/// [`decode_row`] for f16 output, as bits (`codes.len() * 2 == out.len()`, whole
/// blocks), narrowed by `vcvtps2ph` with round-to-nearest-even: the instruction
/// [`Element::narrow_slice`] uses for f16 (and `half` where the CPU has F16C), so the
/// bits equal the portable loop's. Before, f16 took that loop, one 16-value block
/// decoded into a scratch array and narrowed from it (0.63 of the copy roofline).
#[target_feature(enable = "avx512f,avx512bw")]
fn decode_row_f16(codes: &[u8], factor: impl Fn(usize) -> f32, out: &mut [u16]) {
    for_each_block(codes, factor, |b, v| {
        let o = &mut out[b * BLOCK..(b + 1) * BLOCK];
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
        // SAFETY: `o` is 16 u16 (one unaligned 256-bit store).
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), h) };
    });
}

/// [`decode_row_bf16`] two blocks per step, narrowed by `vcvtne2ps2bf16`
/// ([`quant_core::bf16_narrow::x86::narrow32`]: the same bits as [`narrow16_int`]; a
/// step holding a subnormal value narrows with [`narrow16_int`] instead).
///
/// Enables every feature of the dispatched AVX-512 level besides BF16: the caller's
/// `factor` closure inherits those, and a callee that lacks one of its features cannot
/// inline it (an out-of-line call per block cost more than the narrowing saved).
#[target_feature(
    enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt,avx512f,avx512bw,avx512cd,avx512dq,avx512vl,avx512bf16"
)]
fn decode_row_bf16_hw(codes: &[u8], factor: impl Fn(usize) -> f32, out: &mut [u16]) {
    // Even blocks wait in `pending` for their odd neighbour. (One loop with one call of
    // `factor`, so that it inlines: two call sites per pair kept it out of line.)
    let mut pending = None;
    for_each_block(codes, factor, |b, v| match pending.take() {
        None => pending = Some(v),
        Some(lo) => {
            let o = &mut out[(b - 1) * BLOCK..(b + 1) * BLOCK];
            match quant_core::bf16_narrow::x86::narrow32(lo, v) {
                // SAFETY: `o` is 32 u16 = 64 bytes (one unaligned 512-bit store).
                Some(w) => unsafe { _mm512_storeu_si512(o.as_mut_ptr().cast(), w) },
                // SAFETY: `o` is 32 u16 (two unaligned 256-bit stores).
                None => unsafe {
                    _mm256_storeu_si256(o.as_mut_ptr().cast(), narrow16_int(lo));
                    _mm256_storeu_si256(o[BLOCK..].as_mut_ptr().cast(), narrow16_int(v));
                },
            }
        }
    });
    if let Some(lo) = pending {
        let at = out.len() - BLOCK;
        // SAFETY: `out[at..]` is the last block's 16 u16 (one unaligned 256-bit store).
        unsafe { _mm256_storeu_si256(out[at..].as_mut_ptr().cast(), narrow16_int(lo)) };
    }
}

/// Which code of a byte [`decode_nibbles`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Nibble {
    /// Bits 0..4: the even row of the pair ([`e2m1::unpack`]'s first code).
    Low,
    /// Bits 4..8: the odd row.
    High,
}

/// One output row's run of a columnwise decode: `out[c] = T(e2m1(code) * f[c])`, where
/// `code` is the `nibble` of `codes[c]`, written through a `LineWriter` in `mode`
/// (its fence left to `fence`). The values are the portable `decode_fast(code) * f`
/// narrowed with [`quant_core::dtype::bf16_bits`]; only the stores differ.
///
/// This fuses what the columnwise decoder otherwise does in two passes, the products
/// into a scratch run and then [`quant_core::stream::write_f32`] of it, which kept the
/// products' stores and reloads in the hot loop. Returns `false` (nothing written)
/// unless the CPU has AVX-512 (and BF16 for bf16 output) and the three lengths agree;
/// the caller then runs the two passes.
#[inline(always)]
pub(crate) fn decode_nibbles<T: Element>(
    codes: &[u8],
    nibble: Nibble,
    f: &[f32],
    out: &mut [T],
    (mode, fence): (StoreMode, &Fence),
) -> bool {
    if !Level::Avx512.is_supported() || codes.len() != out.len() || f.len() != out.len() {
        return false;
    }
    match FloatsMut::of(out) {
        // SAFETY: the CPU has AVX-512 F and BW (`Level::Avx512` includes both).
        Some(FloatsMut::F32(o)) => unsafe { nibbles_f32(codes, nibble, f, o, mode, fence) },
        // SAFETY: the CPU has AVX-512 F, BW, DQ (`Level::Avx512`) and BF16 (checked).
        Some(FloatsMut::Bf16(o)) if quant_core::simd::has(quant_core::simd::Ext::Bf16) => unsafe {
            nibbles_bf16(codes, nibble, f, o, mode, fence)
        },
        // SAFETY: the CPU has AVX-512 F and BW (`Level::Avx512` includes both).
        Some(FloatsMut::F16(o)) => unsafe { nibbles_f16(codes, nibble, f, o, mode, fence) },
        _ => return false,
    }
    true
}

/// 16 values of [`decode_nibbles`] from column `c` on: codes zero-extended to u32 lanes
/// (shifted down for the high nibble; `vpermps` reads the low four bits), decoded by
/// one permute and scaled by the columns' factors.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn nibbles16(codes: &[u8], nibble: Nibble, f: &[f32], c: usize, table: __m512) -> __m512 {
    let (b, f) = (&codes[c..c + 16], &f[c..c + 16]);
    // SAFETY: `b` is 16 bytes and `f` 16 f32 (one unaligned 128- and 512-bit load).
    let (b, f) = unsafe {
        (
            _mm_loadu_si128(b.as_ptr().cast()),
            _mm512_loadu_ps(f.as_ptr()),
        )
    };
    let lanes = _mm512_cvtepu8_epi32(b);
    let codes = match nibble {
        Nibble::Low => lanes,
        Nibble::High => _mm512_srli_epi32::<4>(lanes),
    };
    _mm512_mul_ps(f, _mm512_permutexvar_ps(codes, table))
}

/// The portable value of [`decode_nibbles`] at column `c` (the run's tail; at AVX2
/// its ends, [`crate::x86_avx2::decode_nibbles`]).
#[inline(always)]
pub(crate) fn nibble_one(codes: &[u8], nibble: Nibble, f: &[f32], c: usize) -> f32 {
    let (lo, hi) = e2m1::unpack(codes[c]);
    let code = if nibble == Nibble::Low { lo } else { hi };
    e2m1::decode_fast(code) * f[c]
}

/// One function of [`decode_nibbles`] per output type, after its checks: `$name` writes
/// `$out` through `$steps` and carries that writer's target features (a function with
/// fewer could not inline it, nor the step closures made in it).
macro_rules! nibble_writer {
    ($(#[$doc:meta])* $name:ident, $out:ty, $features:literal, $steps:ident) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        fn $name(
            codes: &[u8],
            nibble: Nibble,
            f: &[f32],
            out: &mut [$out],
            mode: StoreMode,
            fence: &Fence,
        ) {
            let table = decode_table();
            $steps(
                out,
                (mode, fence),
                |c| nibbles16(codes, nibble, f, c, table),
                |c| nibble_one(codes, nibble, f, c),
            );
        }
    };
}

nibble_writer!(
    /// [`decode_nibbles`] into f32 after its checks.
    nibbles_f32,
    f32,
    "avx512f,avx512bw",
    write_f32_steps
);
nibble_writer!(
    /// [`decode_nibbles`] into bf16 bits after its checks (narrowed in registers).
    nibbles_bf16,
    u16,
    "avx512f,avx512bw,avx512dq,avx512bf16",
    write_bf16_steps
);
nibble_writer!(
    /// [`decode_nibbles`] into f16 bits after its checks (narrowed in registers).
    nibbles_f16,
    u16,
    "avx512f,avx512bw",
    write_f16_steps
);

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// Every byte value (both nibbles of every code pair) under factors that exercise the
    /// product's corners: zero, subnormal, overflow to infinity, infinity and NaN, and
    /// for f16 output its own: subnormal and overflowing products and exact ties.
    #[test]
    fn decode_row_equals_the_portable_product() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let codes: Vec<u8> = (0..=255).collect();
        let factors = [
            1.0,
            0.0,
            -0.0,
            3.5e-39,
            1.0e-45,
            1.0e38,
            f32::MAX,
            f32::INFINITY,
            f32::NAN,
            0.123_456_79,
            1.0e-5,
            7.0e4,
            1.0 + 1.0 / 2048.0,
            -3.0e-8,
        ];
        for (fi, &f0) in factors.iter().enumerate() {
            // A different factor per block, so a block never borrows its neighbour's.
            let factor = |b: usize| {
                if b.is_multiple_of(2) {
                    f0
                } else {
                    factors[(fi + b) % factors.len()]
                }
            };
            let want: Vec<f32> = codes
                .iter()
                .enumerate()
                .flat_map(|(i, &byte)| {
                    let (lo, hi) = e2m1::unpack(byte);
                    let f = factor(i / (BLOCK / 2));
                    [e2m1::decode_fast(lo) * f, e2m1::decode_fast(hi) * f]
                })
                .collect();
            let mut got = vec![0f32; 512];
            assert!(decode_row(&codes, factor, &mut got));
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "f32 element {i}, factor {f0}");
            }
            // An even and an odd number of blocks (the hardware narrowing pairs them),
            // through `decode_row` (the BF16 instruction where the CPU has it) and the
            // integer narrowing directly.
            for n in [256, 248] {
                let mut got = vec![bf16::ZERO; 2 * n];
                assert!(decode_row(&codes[..n], factor, &mut got));
                let mut bits = vec![0u16; 2 * n];
                // SAFETY: the CPU has AVX-512 F and BW (checked at the top).
                unsafe { decode_row_bf16(&codes[..n], factor, &mut bits) };
                for (i, ((a, &c), &b)) in got.iter().zip(&bits).zip(&want).enumerate() {
                    let b = quant_core::dtype::bf16_bits(b);
                    assert_eq!(a.to_bits(), b, "bf16 element {i} of {n} bytes, factor {f0}");
                    assert_eq!(c, b, "integer bf16 element {i} of {n} bytes, factor {f0}");
                }
            }
            let mut got = vec![half::f16::ZERO; 512];
            assert!(decode_row(&codes, factor, &mut got));
            for (i, (a, &b)) in got.iter().zip(&want).enumerate() {
                let b = half::f16::from_f32(b);
                assert_eq!(a.to_bits(), b.to_bits(), "f16 element {i}, factor {f0}");
            }
        }
    }

    #[test]
    fn decode_nibbles_equals_the_portable_product() {
        // Under the level lock: a level test running at the same time may hide AVX-512
        // BF16 (every combination is tested), and the kernel would then decline.
        let ran = quant_core::simd::with_level(Level::Avx512, || {
            if !quant_core::simd::has(quant_core::simd::Ext::Bf16) {
                eprintln!("skipped: this CPU has no AVX-512 BF16");
                return;
            }
            struct Avx512;
            impl nibbles_check::Decoder for Avx512 {
                fn decode<T: Element>(
                    &self,
                    codes: &[u8],
                    nibble: Nibble,
                    f: &[f32],
                    out: &mut [T],
                    mode: StoreMode,
                ) -> bool {
                    decode_nibbles(codes, nibble, f, out, (mode, &Fence::new()))
                }
            }
            nibbles_check::assert_portable(&Avx512);
        });
        if ran.is_none() {
            eprintln!("skipped: this CPU has no AVX-512");
        }
    }

    #[test]
    fn decode_row_refuses_what_does_not_fit() {
        let codes = [0u8; 8];
        assert!(!decode_row(&codes, |_| 1.0, &mut [0f32; 8]));
        assert!(!decode_row(&codes[..4], |_| 1.0, &mut [0f32; 8]));
        assert!(!decode_row(&codes[..4], |_| 1.0, &mut [half::f16::ZERO; 8]));
        assert!(!decode_row(&codes, |_| 1.0, &mut [half::f16::ZERO; 32]));
    }
}

/// What the tests of the columnwise nibble decoders (AVX-512 and AVX2) share: the
/// cases and the check against the portable product.
#[cfg(test)]
pub(crate) mod nibbles_check {
    use super::Nibble;
    use quant_core::Element;
    use quant_core::codec::e2m1;
    use quant_core::stream::StoreMode;

    /// A level's `decode_nibbles`, for any output type.
    pub(crate) trait Decoder {
        fn decode<T: Element>(
            &self,
            codes: &[u8],
            nibble: Nibble,
            f: &[f32],
            out: &mut [T],
            mode: StoreMode,
        ) -> bool;
    }

    /// Every byte value, both nibbles, one factor per column drawn from the product's
    /// corners (zero, subnormal, overflow, infinity, NaN; for f16 also its subnormal and
    /// overflowing products), into f32, bf16 and f16, in both store modes, for runs with
    /// every tail and starting at every 4-byte offset of a line: the portable product,
    /// narrowed by `bf16_bits` or `f16::from_f32`. Then again with every factor finite
    /// (runs without a NaN product). Lengths that disagree are declined.
    pub(crate) fn assert_portable(d: &impl Decoder) {
        let n = 300;
        let codes: Vec<u8> = (0..n).map(|i| (i * 73 % 256) as u8).collect();
        let corners = [
            1.0,
            0.0,
            -0.0,
            3.5e-39,
            1.0e-45,
            1.0e38,
            f32::MAX,
            f32::INFINITY,
            1.0e-6,
            2.0e4,
        ];
        let with_nan: Vec<f32> = (0..n)
            .map(|i| match i % 13 {
                // NaN, and NaNs whose low payload bits would round up were they
                // narrowed as numbers.
                10 => [
                    f32::NAN,
                    f32::from_bits(0x7FC0_8001),
                    f32::from_bits(0xFFC1_FFFF),
                ][i / 13 % 3],
                11 | 12 => 0.123_456_79 * (i as f32 + 1.0),
                j => corners[j],
            })
            .collect();
        // Every factor finite (so no product is NaN, though `f32::MAX` times 6 still
        // overflows): the route that may leave out the NaN handling.
        let finite: Vec<f32> = with_nan
            .iter()
            .map(|&x| if x.is_finite() { x } else { -2.5e-3 })
            .collect();
        for (f, nibble) in [&with_nan, &finite]
            .into_iter()
            .flat_map(|f| [(f, Nibble::Low), (f, Nibble::High)])
        {
            let want: Vec<f32> = (0..n)
                .map(|c| {
                    let (lo, hi) = e2m1::unpack(codes[c]);
                    let code = if nibble == Nibble::Low { lo } else { hi };
                    e2m1::decode_fast(code) * f[c]
                })
                .collect();
            for mode in [StoreMode::Cached, StoreMode::Streaming] {
                for at in 0..16 {
                    for len in [
                        0,
                        1,
                        7,
                        8,
                        9,
                        15,
                        16,
                        17,
                        31,
                        32,
                        33,
                        63,
                        64,
                        65,
                        129,
                        n - at,
                    ] {
                        let (c, fc, w) =
                            (&codes[at..at + len], &f[at..at + len], &want[at..at + len]);
                        let case = format!("{nibble:?} {mode:?} {at}+{len}");
                        // Outputs start `at` elements past a line.
                        let mut buf = quant_core::HostBytes::zeroed(4 * (len + 64));
                        let out: &mut [f32] = bytemuck::cast_slice_mut(buf.as_mut_slice());
                        let out = &mut out[at..at + len];
                        assert!(d.decode(c, nibble, fc, out, mode));
                        for (i, (a, b)) in out.iter().zip(w).enumerate() {
                            assert_eq!(a.to_bits(), b.to_bits(), "f32 {case}: column {i}");
                        }
                        let out: &mut [half::bf16] = bytemuck::cast_slice_mut(buf.as_mut_slice());
                        let out = &mut out[at..at + len];
                        assert!(d.decode(c, nibble, fc, out, mode));
                        for (i, (a, &b)) in out.iter().zip(w).enumerate() {
                            let b = quant_core::dtype::bf16_bits(b);
                            assert_eq!(a.to_bits(), b, "bf16 {case}: column {i}");
                        }
                        let out: &mut [half::f16] = bytemuck::cast_slice_mut(buf.as_mut_slice());
                        let out = &mut out[at..at + len];
                        assert!(d.decode(c, nibble, fc, out, mode));
                        for (i, (a, &b)) in out.iter().zip(w).enumerate() {
                            let b = half::f16::from_f32(b).to_bits();
                            assert_eq!(a.to_bits(), b, "f16 {case}: column {i}");
                        }
                    }
                }
            }
        }
        let (mode, f) = (StoreMode::Cached, &finite);
        assert!(!d.decode(&codes[..8], Nibble::Low, &f[..7], &mut [0f32; 8], mode));
        let out = &mut [half::f16::ZERO; 8];
        assert!(!d.decode(&codes[..7], Nibble::Low, &f[..8], out, mode));
    }
}
