//! The inner loops shared by both FP8 recipes, written to vectorize: each value is read
//! as f32, scaled with one multiply, and encoded branchlessly; decoding is a bit trick
//! ([`e4m3::decode_fast`]), not a table gather. f32 input is read in place. The encoders
//! read bf16 input from its bits, widened in the register (a shift), except
//! [`amax_encode_block`], which widens a block once for its amax and its codes; f16 input
//! is widened once into a span ([`quant_core::widened`]), except at AVX2 and AVX-512,
//! whose encoders widen it in the register (`vcvtph2ps`). (Under power-of-two scales at
//! AVX-512 and AVX2 the slab engine encodes both in 16-bit lanes instead,
//! [`quant_core::codec::pow2`].)
//!
//! Widened spans and 16-bit output pass through a caller-lent [`Wide`] scratch made once per
//! task: a fresh stack array per call is zeroed per call, which for 128-element blocks
//! cost 2 KiB of `memset` per block (6-19% of the quantize and dequantize profiles).
//!
//! Every function here is `#[inline(always)]`: the recipes call them inside
//! [`quant_core::simd::dispatch`], once per row slab or tile, so they are compiled at the
//! dispatched vector width (SSE2, AVX2 or AVX-512). The results are the same bits at every
//! width (no fused multiply-add, no reassociation); `crates/quantfmt/tests/simd_levels.rs`
//! checks it.

use quant_core::codec::{e4m3, e5m2, pow2};
use quant_core::cpu::{BLOCK, amax_f32, fold_abs_max};
use quant_core::dtype::Bits16;
use quant_core::simd::Level;
use quant_core::stream::{Fence, StoreMode, write_filled};
use quant_core::{Element, narrowed, widened};

use crate::scale::Fp8Dtype;

/// f32 scratch for one span of 16-bit input or output, lent to every call of a task.
pub(crate) type Wide = [f32; BLOCK];
/// A zeroed [`Wide`] (`let mut w = WIDE;` makes one).
pub(crate) const WIDE: Wide = [0.0; BLOCK];

/// `dst[i] = fp8(src[i] * scale)` over f32 values.
#[inline(always)]
pub(crate) fn encode_f32(dt: Fp8Dtype, src: &[f32], scale: f32, dst: &mut [u8]) {
    encode_values(dt, src.iter().map(|&v| v * scale), dst);
}

/// `dst[i] = fp8(float(src[i]) * scale_i)` for any input element type, under one scale
/// (a tensor's or a block's) or one per value (a row of a tile under per-column scales).
/// At [`Level::Avx2`] through the AVX2 encoder ([`quant_core::codec::scaled_avx2`], the
/// same codes), which LLVM's vectorization of the portable loop does not match there
/// (that loop of per-column products was about half of the columnwise 1x128 quantize
/// from f32). bf16 input is read as bits at every level, f16 at AVX2 and AVX-512
/// ([`quant_core::codec::scaled_avx512`]; elsewhere it is widened into `buf` first, as
/// at both before, where that was a sixth of the per-tensor FP8 quantize from f16 at
/// AVX2 and a tenth at AVX-512: x1.15 and x1.11 in process without it).
#[inline(always)]
pub(crate) fn encode_scaled<T: Element>(
    level: Level,
    dt: Fp8Dtype,
    src: &[T],
    scales: Scales<'_>,
    dst: &mut [u8],
    buf: &mut Wide,
) {
    match Bits16::of(src) {
        Some(bits) if vector_bits(level, dt, bits, scales, dst) => return,
        Some(Bits16::Bf16(bits)) => return encode_bf16_bits(dt, bits, scales, dst),
        _ => {}
    }
    for (i, (s, d)) in src.chunks(BLOCK).zip(dst.chunks_mut(BLOCK)).enumerate() {
        let w = widened(s, &mut buf[..s.len()]);
        let sc = scales.cut(i * BLOCK..i * BLOCK + s.len());
        if !avx2_f32(level, dt, w, sc, d) {
            match sc {
                Scales::One(c) => encode_f32(dt, w, c, d),
                Scales::Each(c) => encode_values(dt, w.iter().zip(c).map(|(&v, &c)| v * c), d),
            }
        }
    }
}

/// The AVX2 encoder ([`quant_core::codec::scaled_avx2::encode_f32`]) at
/// [`Level::Avx2`]; `false`, with nothing written, at other levels or where it declines.
#[inline(always)]
fn avx2_f32(level: Level, dt: Fp8Dtype, src: &[f32], scales: Scales<'_>, dst: &mut [u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use quant_core::codec::scaled_avx2::encode_f32;
        level == Level::Avx2 && encode_f32(dt.pow2_codec(), src, scales, false, dst)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, dt, src, scales, dst);
        false
    }
}

/// The encoders of bf16 or f16 bits that widen each value in the register: at
/// [`Level::Avx2`] [`quant_core::codec::scaled_avx2::encode_bf16`] and
/// [`quant_core::codec::scaled_avx2::encode_f16`] (`vcvtph2ps`), at [`Level::Avx512`]
/// [`quant_core::codec::scaled_avx512::encode_f16`] for f16 (x1.11 on the per-tensor
/// quantize from f16, which widened into `buf` first). bf16 and f32 there take the
/// portable loop, which LLVM vectorizes as well as that kernel (its bf16 and f32 forms
/// measured x0.96-1.00). `false`, with nothing written, at other levels or where they
/// decline.
#[inline(always)]
fn vector_bits(
    level: Level,
    dt: Fp8Dtype,
    src: Bits16<'_>,
    scales: Scales<'_>,
    dst: &mut [u8],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use quant_core::codec::{scaled_avx2, scaled_avx512};
        let fp8 = dt.pow2_codec();
        match (level, src) {
            (Level::Avx2, Bits16::Bf16(b)) => scaled_avx2::encode_bf16(fp8, b, scales, false, dst),
            (Level::Avx2, Bits16::F16(b)) => scaled_avx2::encode_f16(fp8, b, scales, false, dst),
            (Level::Avx512, Bits16::F16(b)) => {
                scaled_avx512::encode_f16(fp8, b, scales, false, dst)
            }
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, dt, src, scales, dst);
        false
    }
}

/// `dst[i] = fp8(float(src[i]) * scale)` (or `* scale[i]`) of bf16 values given as
/// bits, each widened in the loop (exactly: a shift). Through a widened scratch span,
/// every value cost a store and a reload; here the vectorized loop widens in registers.
#[inline(always)]
fn encode_bf16_bits(dt: Fp8Dtype, src: &[u16], scale: Scales<'_>, dst: &mut [u8]) {
    use quant_core::dtype::f32_from_bf16_bits as wide;
    match scale {
        Scales::One(s) => encode_values(dt, src.iter().map(|&b| wide(b) * s), dst),
        Scales::Each(c) => encode_values(dt, src.iter().zip(c).map(|(&b, &c)| wide(b) * c), dst),
    }
}

/// `dst[i] = fp8(scaled[i])`, the dtype matched once per call.
#[inline(always)]
pub(crate) fn encode_values(dt: Fp8Dtype, scaled: impl Iterator<Item = f32>, dst: &mut [u8]) {
    match dt {
        Fp8Dtype::E4M3 => {
            for (d, v) in dst.iter_mut().zip(scaled) {
                *d = e4m3::encode(v);
            }
        }
        Fp8Dtype::E5M2 => {
            for (d, v) in dst.iter_mut().zip(scaled) {
                *d = e5m2::encode(v);
            }
        }
    }
}

/// `acc[j] = fmaxf(acc[j], |src[j]|)`: the running per-column amax of a tile, one row
/// at a time (NaN ignored).
#[inline(always)]
pub(crate) fn amax_cols<T: Element>(src: &[T], acc: &mut [f32], buf: &mut Wide) {
    for (s, a) in src.chunks(BLOCK).zip(acc.chunks_mut(BLOCK)) {
        fold_abs_max(a, widened(s, &mut buf[..s.len()]));
    }
}

/// The scale of each code of a run (a tensor scale or a row of one block: one; the
/// columnwise decode's per-column scales: each), as quant-core's encoders take it.
pub(crate) use quant_core::codec::Scale as Scales;

/// A run's scales times its element type's rebias `2^(127 - bias)` (`2^120` for E4M3,
/// `2^112` for E5M2), every product finite: what [`crate::decode_avx2`]'s fast loops
/// multiply by.
///
/// Why the products are the portable decode's bits: [`quant_core::codec::folded`]. One
/// multiply per value, where the rebias step takes two and an infinity and NaN patch
/// besides; codes that decode to NaN or an infinity are left to the general loops (the
/// decoder checks each run for them).
///
/// Made once per run of one scale, or once per slab of per-column scales (its checks
/// then run once for the slab's rows, not once per row).
#[derive(Clone, Copy)]
pub(crate) struct Folded<'a>(Scales<'a>);

impl<'a> Folded<'a> {
    /// `s` folded, or `None` where `s * rebias` is not finite (`s` NaN, infinite, or
    /// at least `2^8` for E4M3, `2^16` for E5M2).
    #[inline(always)]
    pub(crate) fn one(dt: Fp8Dtype, s: f32) -> Option<Folded<'static>> {
        let f = s * rebias(dt);
        f.is_finite().then_some(Folded(Scales::One(f)))
    }

    /// Each of `s` folded into `buf` (at least as long), or `None` where one of them
    /// is not finite (`buf` then unspecified).
    #[inline(always)]
    pub(crate) fn each(dt: Fp8Dtype, s: &[f32], buf: &'a mut [f32]) -> Option<Folded<'a>> {
        let (r, buf) = (rebias(dt), &mut buf[..s.len()]);
        // A fold, not `all`: no early exit, so it vectorizes.
        let finite = s.iter().zip(buf.iter_mut()).fold(true, |ok, (&s, f)| {
            *f = s * r;
            ok & f.is_finite()
        });
        finite.then_some(Folded(Scales::Each(buf)))
    }

    /// The folded scales of codes `at..at + len` of the run (tests cut runs).
    #[cfg(test)]
    pub(crate) fn cut(self, at: usize, len: usize) -> Folded<'a> {
        Folded(self.0.cut(at..at + len))
    }

    /// The folded scales.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn scales(self) -> Scales<'a> {
        self.0
    }
}

/// `2^(127 - bias)` of `dt` ([`quant_core::codec::folded::rebias`]).
#[inline(always)]
pub(crate) fn rebias(dt: Fp8Dtype) -> f32 {
    quant_core::codec::folded::rebias(dt.pow2_codec())
}

/// `dst[i] = T(decode(src[i]) * scale)`: the AVX-512 kernel ([`crate::x86`], which
/// streams large outputs in `mode`, leaving the fence to `fence`) where `level` runs it,
/// else the portable loop ([`decode_f32`]); the same bits either way.
///
/// At AVX2 the columnwise runs (per-code scales) take [`crate::decode_avx2`]'s register
/// decoder, streamed in `mode`: against the scratch route below (CLI A/B, 3 pairs) into
/// f32 x1.54-1.84 and per-tensor into bf16 x1.34, the blockwise recipes into bf16
/// 0.92-0.94. Elsewhere the portable loop writes them through
/// [`write_filled`], which streams in `mode` too (at AVX2, before the register decoder:
/// the blockwise columnwise dequantizes into bf16 and f16 x1.30-1.59, CLI A/B, 5
/// pairs, since their 2 KiB runs of hundreds of output rows, with ordinary stores,
/// read every line first). A run under one scale (the per-tensor rowwise dequantize)
/// takes the register decoder where its scale folds (`folded`, [`Folded`]): its fast
/// loops, streamed in `mode`, ran x1.57 into bf16, x1.18 into f16 and x1.14 into f32
/// against the portable loop with ordinary stores (in process, 3 pairs). Unfolded, it
/// keeps that loop: streamed through the scratch it ran x0.68 at AVX2 (CLI A/B, 5
/// pairs; in process x1.03: the scratch's 4K aliasing, [`crate::decode_avx2`]), and
/// through the register decoder's general loops 0.90.
///
/// `folded` is `scale` folded ([`Folded`]), where the caller could fold it: the AVX2
/// register decoder then takes its fast loops for each part of the run that holds no
/// special code.
#[inline(always)]
pub(crate) fn decode_run<T: Element>(
    how: (Level, StoreMode, &Fence),
    dt: Fp8Dtype,
    src: &[u8],
    (scale, folded): (Scales<'_>, Option<Folded<'_>>),
    dst: &mut [T],
    buf: &mut Wide,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::x86::decode_run(how.0, dt, src, scale, dst, (how.1, how.2))
        || ((matches!(scale, Scales::Each(_)) || folded.is_some())
            && crate::decode_avx2::decode_run(how.0, dt, src, (scale, folded), dst, how.1))
    {
        return;
    }
    let _ = folded;
    match scale {
        Scales::One(c) => decode_scaled(dt, src, c, dst, buf),
        Scales::Each(c) => {
            let runs = src.chunks(BLOCK).zip(dst.chunks_mut(BLOCK));
            for ((s, d), c) in runs.zip(c.chunks(BLOCK)) {
                write_filled(how, d, buf, |w| decode_f32(dt, s, Scales::Each(c), w));
            }
        }
    }
}

/// `dst[i] = T(decode(src[i]) * scale_inv)`: the dequantize loop, with ordinary stores.
#[inline(always)]
pub(crate) fn decode_scaled<T: Element>(
    dt: Fp8Dtype,
    src: &[u8],
    scale_inv: f32,
    dst: &mut [T],
    buf: &mut Wide,
) {
    for (s, d) in src.chunks(BLOCK).zip(dst.chunks_mut(BLOCK)) {
        narrowed(d, &mut buf[..s.len()], |w| {
            decode_f32(dt, s, Scales::One(scale_inv), w)
        });
    }
}

/// `w[i] = decode(src[i]) * scale` (or `* scale[i]`), the element type and the scale
/// source matched once, outside the loops.
#[inline(always)]
fn decode_f32(dt: Fp8Dtype, src: &[u8], scale: Scales<'_>, w: &mut [f32]) {
    #[inline(always)]
    fn each(w: &mut [f32], src: &[u8], scale: Scales<'_>, decode: impl Fn(u8) -> f32) {
        match scale {
            Scales::One(c) => {
                for (o, &b) in w.iter_mut().zip(src) {
                    *o = decode(b) * c;
                }
            }
            Scales::Each(c) => {
                for ((o, &b), &c) in w.iter_mut().zip(src).zip(c) {
                    *o = decode(b) * c;
                }
            }
        }
    }
    match dt {
        Fp8Dtype::E4M3 => each(w, src, scale, e4m3::decode_fast),
        Fp8Dtype::E5M2 => each(w, src, scale, e5m2::decode_fast),
    }
}

/// `k` where `s == 2^k` is a normal f32 power of two, else `i32::MIN`.
#[inline(always)]
pub(crate) fn pow2_exponent(s: f32) -> i32 {
    let b = s.to_bits();
    let e = (b >> 23) as i32; // sign bit included: a negative scale is never a match
    if b & 0x007F_FFFF == 0 && (1..255).contains(&e) {
        e - 127
    } else {
        i32::MIN
    }
}

/// [`decode_scaled`] in 16-bit lanes where it applies, for a run of whole blocks under
/// one scale each (`scale_inv(b)` for block `b`): bf16 output, power-of-two scales (the
/// default block scales) and AVX-512 or AVX2 ([`pow2::decode_blocks`]: the same bits,
/// no f32 formed). One call per run, not per block: at AVX2 the per-block calls' setup
/// (the checks, the constants, the exponent) cost a fifth of the rowwise dequantize.
/// `false`, with nothing written, elsewhere; `js` is scratch for the exponents.
#[inline(always)]
pub(crate) fn decode_pow2<T: Element>(
    level: Level,
    dt: Fp8Dtype,
    src: &[u8],
    scale_inv: impl Fn(usize) -> f32,
    js: &mut Vec<i32>,
    dst: &mut [T],
) -> bool {
    let Some(d) = quant_core::dtype::bf16_slice_bits_mut(dst) else {
        return false;
    };
    // The FP8 scaling block, not this module's `BLOCK` (the span of its f32 scratch).
    use crate::block::BLOCK as SCALED;
    js.clear();
    js.extend((0..src.len() / SCALED).map(|b| pow2_exponent(scale_inv(b))));
    // `i32::MIN` (not a power of two) is outside every exact range: the kernel refuses.
    pow2::decode_blocks(level, dt.pow2_codec(), src, SCALED, js, d)
}

/// Widens one block, takes its NaN-ignoring amax, derives the scale with `scale_of`,
/// encodes the block with it and returns the scale: the whole 1x128 step in one pass
/// over the (cached) input.
#[inline(always)]
pub(crate) fn amax_encode_block<T: Element>(
    dt: Fp8Dtype,
    src: &[T],
    dst: &mut [u8],
    scale_of: impl Fn(f32) -> f32,
    buf: &mut Wide,
) -> f32 {
    let w = widened(src, &mut buf[..src.len()]);
    let scale = scale_of(amax_f32(w));
    encode_f32(dt, w, scale, dst);
    scale
}
