//! The magnitude maximum of every block of a run, many blocks at a time.
//!
//! Every block format starts a block with its amax: MXFP8 per 32 values, NVFP4 per 16,
//! FP8 per 128. One vector per block is cheap; folding that vector's 16 lanes down to
//! one number is not: four shuffle-and-max steps in a dependency chain, per block, were
//! the largest single cost of the MXFP8 and NVFP4 quantize profiles. [`block_abs_max`]
//! instead folds **sixteen blocks together**: their sixteen vectors are halved pairwise
//! (two permutes and one max per pair), so four levels, 15 maxima in all, leave one
//! vector whose lane `b` is block `b`'s maximum. bf16 input ([`block_abs_max_bf16`]) folds
//! its 16-bit magnitudes as they are, 32 lanes per vector: 32 blocks (16 for a short run
//! of long blocks) at a time, for half the loads and permutes of widening every block.
//!
//! The result is a magnitude's **bit pattern**: for non-NaN floats the order of `|x|`
//! bits is the order of the values, so an integer max is the float max, and the NaN
//! rule is a choice of key ([`NanRule`]).
//!
//! ```
//! use quant_core::block_max::{NanRule, block_abs_max};
//! use quant_core::simd;
//!
//! let xs: Vec<f32> = (0..64).map(|i| i as f32 - 40.0).collect(); // 4 blocks of 16
//! let mut out = [0u32; 4];
//! block_abs_max(simd::level(), &xs, NanRule::Ignore, &mut out);
//! assert_eq!(out.map(f32::from_bits), [40.0, 24.0, 8.0, 23.0]);
//! ```
#![allow(unsafe_code)]

use crate::dtype::Bits16;
use crate::simd::Level;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// How NaN inputs count in a block maximum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NanRule {
    /// NaN loses: the maximum of the non-NaN magnitudes, `+0` if there are none (CUDA
    /// `fmaxf` folded from 0, what TE's amax reductions compute).
    Ignore,
    /// NaN wins: the maximum of the magnitude bit patterns, where every NaN pattern
    /// lies above infinity's (`0x7F80_0000`); a block holding a NaN yields a NaN
    /// pattern (the OCP MX rule).
    Propagate,
}

/// Bits of f32 infinity; magnitude patterns above it are NaN.
const INF_BITS: u32 = 0x7F80_0000;

impl NanRule {
    /// The ordering key of one value: its magnitude bits (NaN -> 0 under
    /// [`NanRule::Ignore`]).
    ///
    /// ```
    /// use quant_core::block_max::NanRule;
    /// assert_eq!(NanRule::Ignore.key(-2.0), 2f32.to_bits());
    /// assert_eq!(NanRule::Ignore.key(f32::NAN), 0);
    /// assert!(NanRule::Propagate.key(f32::NAN) > f32::INFINITY.to_bits());
    /// ```
    #[inline(always)]
    pub fn key(self, x: f32) -> u32 {
        let a = x.to_bits() & 0x7FFF_FFFF;
        // A select, not a branch, so that block loops vectorize.
        if self == NanRule::Ignore && a > INF_BITS {
            0
        } else {
            a
        }
    }
}

/// `out[b]` = the largest [`NanRule::key`] of block `b`, the `b`-th of the
/// `out.len()` equal blocks of `xs` (a pattern: `f32::from_bits` gives the amax).
///
/// At [`Level::Avx512`], with blocks a multiple of 16 values long, sixteen blocks are
/// folded together (see the module docs), at [`Level::Avx2`] (blocks a multiple of 8)
/// eight; otherwise, and for the last `< 16` blocks at AVX-512, each block is folded
/// alone with the same integer maxima, so every level gives the same bits. Call it from inside a [`crate::simd::dispatch`]ed kernel: it is
/// `#[inline(always)]` and compiles at the caller's width.
///
/// Panics if `xs.len()` is not a multiple of `out.len()` (an internal indexing bug of
/// the caller; the format crates size both from one block length).
#[inline(always)]
pub fn block_abs_max(level: Level, xs: &[f32], nan: NanRule, out: &mut [u32]) {
    let Some(n) = block_len("block_abs_max", xs.len(), out) else {
        return;
    };
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 && Level::Avx512.is_supported() && n.is_multiple_of(x86::LANES) {
        // SAFETY: the CPU has AVX-512 F (checked just above); `xs` holds `out.len()`
        // blocks of `n` values, `n` a nonzero multiple of 16 (checked above).
        unsafe { x86::block_abs_max(xs, n, nan, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && Level::Avx2.is_supported() && n.is_multiple_of(8) {
        // SAFETY: the CPU has AVX2 and F16C (`Level::Avx2` includes both; checked just
        // above); `xs` holds `out.len()` blocks of `n` values, `n` a nonzero multiple
        // of 8 (checked above).
        unsafe { avx2::block_abs_max(xs, n, nan, out) };
        return;
    }
    let _ = level;
    for (o, b) in out.iter_mut().zip(xs.chunks_exact(n)) {
        *o = portable(b, nan);
    }
}

/// One block's maximum key, folded in 16 lanes ([`crate::cpu::lane_fold`]).
#[inline(always)]
fn portable(xs: &[f32], nan: NanRule) -> u32 {
    crate::cpu::lane_fold(
        xs,
        0u32,
        #[inline(always)]
        |m, v| m.max(nan.key(v)),
        u32::max,
    )
}

/// [`block_abs_max`] of bf16 values given as their bits (`xs[i]` is
/// `bf16::to_bits`): the same keys, as f32 patterns, as [`block_abs_max`] of the
/// widened values, without widening them. At [`Level::Avx512`] with blocks a multiple of
/// 32 values, each block is one 32-lane maximum per vector (16-bit lanes), then sixteen
/// blocks fold together as in [`block_abs_max`]; a block of 16 (NVFP4's) is one vector
/// widened in the register. At [`Level::Avx2`] (blocks a multiple of 16) eight blocks
/// fold together on their 16-bit keys.
///
/// ```
/// use half::bf16;
/// use quant_core::block_max::{NanRule, block_abs_max_bf16};
/// use quant_core::simd;
///
/// let xs: Vec<u16> = (0..64).map(|i| bf16::from_f32(i as f32 - 40.0).to_bits()).collect();
/// let mut out = [0u32; 2];
/// block_abs_max_bf16(simd::level(), &xs, NanRule::Ignore, &mut out);
/// assert_eq!(out.map(f32::from_bits), [40.0, 23.0]);
/// ```
///
/// Panics if `xs.len()` is not a multiple of `out.len()` (as [`block_abs_max`]).
#[inline(always)]
pub fn block_abs_max_bf16(level: Level, xs: &[u16], nan: NanRule, out: &mut [u32]) {
    let Some(n) = block_len("block_abs_max_bf16", xs.len(), out) else {
        return;
    };
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512
        && Level::Avx512.is_supported()
        && (n == x86::LANES || n.is_multiple_of(2 * x86::LANES))
    {
        // SAFETY: the CPU has AVX-512 F and BW (`Level::Avx512`, checked just above);
        // `xs` holds `out.len()` blocks of `n` values, `n` 16 or a nonzero multiple of 32.
        unsafe { x86::block_abs_max_bf16(xs, n, nan, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && Level::Avx2.is_supported() && n.is_multiple_of(16) {
        // SAFETY: the CPU has AVX2 and F16C (`Level::Avx2` includes both; checked just
        // above); `xs` holds `out.len()` blocks of `n` values, `n` a nonzero multiple
        // of 16 (checked above).
        unsafe { avx2::block_abs_max_bf16(xs, n, nan, out) };
        return;
    }
    let _ = level;
    for (o, b) in out.iter_mut().zip(xs.chunks_exact(n)) {
        *o = b.iter().fold(0, |m, &v| {
            m.max(nan.key(crate::dtype::f32_from_bf16_bits(v)))
        });
    }
}

/// [`block_abs_max`] of f16 values given as their bits (`xs[i]` is `f16::to_bits`):
/// the keys [`block_abs_max`] gives the widened values. At [`Level::Avx512`], blocks of
/// 16 (NVFP4's) and of a multiple of 32 (MXFP8's, FP8's) fold on their 16-bit
/// magnitudes as [`block_abs_max_bf16`]'s do, the maxima widened at the end
/// (`vcvtph2ps`, exact); other blocks of a multiple of 16 values, and the last `< 32`
/// blocks of 16, widen each vector of 16 in the register and fold sixteen blocks
/// together as [`block_abs_max`] does. At [`Level::Avx2`], blocks of a multiple of 16
/// fold their magnitudes the same way and widen the maxima. Other levels and blocks
/// widen value by value with `half`.
///
/// Under [`NanRule::Propagate`] a block holding a NaN yields a NaN pattern, as it does
/// for f32 input; which NaN's pattern may differ between the two routes where the CPU's
/// widening and `half`'s quiet a signalling NaN differently.
///
/// ```
/// use half::f16;
/// use quant_core::block_max::{NanRule, block_abs_max_f16};
/// use quant_core::simd;
///
/// let xs: Vec<u16> = (0..64).map(|i| f16::from_f32(i as f32 - 40.0).to_bits()).collect();
/// let mut out = [0u32; 2];
/// block_abs_max_f16(simd::level(), &xs, NanRule::Ignore, &mut out);
/// assert_eq!(out.map(f32::from_bits), [40.0, 23.0]);
/// ```
///
/// Panics if `xs.len()` is not a multiple of `out.len()` (as [`block_abs_max`]).
#[inline(always)]
pub fn block_abs_max_f16(level: Level, xs: &[u16], nan: NanRule, out: &mut [u32]) {
    let Some(n) = block_len("block_abs_max_f16", xs.len(), out) else {
        return;
    };
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 && Level::Avx512.is_supported() && n.is_multiple_of(x86::LANES) {
        // SAFETY: the CPU has AVX-512 F and BW (`Level::Avx512`, checked just above);
        // `xs` holds `out.len()` blocks of `n` values, `n` a nonzero multiple of 16
        // (checked above).
        unsafe { x86::block_abs_max_f16(xs, n, nan, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && Level::Avx2.is_supported() && n.is_multiple_of(16) {
        // SAFETY: the CPU has AVX2 and F16C (`Level::Avx2` includes both; checked just
        // above); `xs` holds `out.len()` blocks of `n` values, `n` a nonzero multiple
        // of 16 (checked above).
        unsafe { avx2::block_abs_max_f16(xs, n, nan, out) };
        return;
    }
    let _ = level;
    for (o, b) in out.iter_mut().zip(xs.chunks_exact(n)) {
        *o = b
            .iter()
            .fold(0, |m, &v| m.max(nan.key(half::f16::from_bits(v).to_f32())));
    }
}

/// [`block_abs_max_bf16`] or [`block_abs_max_f16`], as `xs` holds.
///
/// ```
/// use half::f16;
/// use quant_core::block_max::{NanRule, block_abs_max_bits};
/// use quant_core::dtype::Bits16;
/// use quant_core::simd;
///
/// let xs: Vec<f16> = (0..64).map(|i| f16::from_f32(i as f32 - 40.0)).collect();
/// let mut out = [0u32; 2];
/// block_abs_max_bits(simd::level(), Bits16::of(&xs).unwrap(), NanRule::Ignore, &mut out);
/// assert_eq!(out.map(f32::from_bits), [40.0, 23.0]);
/// ```
#[inline(always)]
pub fn block_abs_max_bits(level: Level, xs: Bits16<'_>, nan: NanRule, out: &mut [u32]) {
    match xs {
        Bits16::Bf16(b) => block_abs_max_bf16(level, b, nan, out),
        Bits16::F16(b) => block_abs_max_f16(level, b, nan, out),
    }
}

/// Folds one row of bf16 bits into running per-column keys: `acc[j] = max(acc[j],
/// key16(xs[j]))`, where `key16` is [`NanRule::key`]'s 16-bit half (the magnitude bits,
/// NaN -> 0 under [`NanRule::Ignore`]). Column blocks (MXFP8's and FP8 1x128's
/// columnwise scales) fold their rows this way without widening them;
/// `u32::from(acc[j]) << 16` is then the key [`NanRule::key`] gives the widened column
/// maximum. A plain loop on `u16` lanes: LLVM vectorizes it at every dispatch level.
///
/// ```
/// use half::bf16;
/// use quant_core::block_max::{NanRule, column_abs_max_bf16};
///
/// let rows = [[1.0f32, -5.0, f32::NAN], [-3.0, 2.0, 0.5]];
/// let mut acc = [0u16; 3];
/// for row in rows {
///     let bits = row.map(|v| bf16::from_f32(v).to_bits());
///     column_abs_max_bf16(&bits, NanRule::Ignore, &mut acc);
/// }
/// assert_eq!(acc.map(|a| f32::from_bits(u32::from(a) << 16)), [3.0, 5.0, 0.5]);
/// ```
///
/// Panics if the lengths differ (an indexing bug of the caller).
#[inline(always)]
pub fn column_abs_max_bf16(xs: &[u16], nan: NanRule, acc: &mut [u16]) {
    column_keys::<{ (INF_BITS >> 16) as u16 }>(xs, nan, acc);
}

/// [`column_abs_max_bf16`] for bf16 or f16 bits: the f16 magnitudes fold the same way
/// (their order is their value order; NaN lies above `0x7C00`).
/// [`column_key`] turns a folded maximum into the f32 key.
///
/// ```
/// use half::f16;
/// use quant_core::block_max::{NanRule, column_abs_max_bits, column_key};
/// use quant_core::dtype::Bits16;
///
/// let rows = [[1.0f32, -5.0, f32::NAN], [-3.0, 2.0, 0.5]];
/// let mut acc = [0u16; 3];
/// for row in rows {
///     let bits = row.map(|v| f16::from_f32(v).to_bits());
///     column_abs_max_bits(Bits16::F16(&bits), NanRule::Ignore, &mut acc);
/// }
/// let keys = acc.map(|a| f32::from_bits(column_key(Bits16::F16(&[]), a)));
/// assert_eq!(keys, [3.0, 5.0, 0.5]);
/// ```
///
/// Panics if the lengths differ (an indexing bug of the caller).
#[inline(always)]
pub fn column_abs_max_bits(xs: Bits16<'_>, nan: NanRule, acc: &mut [u16]) {
    match xs {
        Bits16::Bf16(b) => column_abs_max_bf16(b, nan, acc),
        Bits16::F16(b) => column_keys::<0x7C00>(b, nan, acc),
    }
}

/// The f32 key ([`NanRule::key`] of the widened value) of a maximum folded by
/// [`column_abs_max_bits`] on input of `like`'s format (only the format is read).
#[inline(always)]
pub fn column_key(like: Bits16<'_>, key: u16) -> u32 {
    match like {
        Bits16::Bf16(_) => u32::from(key) << 16,
        Bits16::F16(_) => f16_key_to_f32(key),
    }
}

/// The f32 pattern of the f16 magnitude `key` (`f16::to_f32`, NaN kept a NaN with its
/// payload), written as selects so that a loop over a row of column maxima vectorizes:
/// `half`'s conversion, a call per value, was a sixth of an MXFP8 columnwise quantize
/// from f16.
#[inline(always)]
fn f16_key_to_f32(key: u16) -> u32 {
    let k = u32::from(key);
    if k >= 0x7C00 {
        // Infinity and NaN: the f32 exponent all ones, the payload shifted up.
        0x7F80_0000 | (k << 13)
    } else if k >= 0x400 {
        // Normal: rebias the exponent from 15 to 127.
        (k << 13) + (112 << 23)
    } else {
        // Subnormal (and zero): `k * 2^-24`, exact.
        (k as f32 * f32::from_bits(103 << 23)).to_bits()
    }
}

/// The column fold of 16-bit magnitudes, NaN being above `INF16`.
#[inline(always)]
fn column_keys<const INF16: u16>(xs: &[u16], nan: NanRule, acc: &mut [u16]) {
    assert_eq!(xs.len(), acc.len(), "column_abs_max: lengths differ");
    for (a, &x) in acc.iter_mut().zip(xs) {
        let m = x & 0x7FFF;
        // A select, not a branch, so that the loop vectorizes.
        let key = if nan == NanRule::Ignore && m > INF16 {
            0
        } else {
            m
        };
        *a = (*a).max(key);
    }
}

/// The length of each of `out.len()` equal blocks of `values` values, for the block
/// maxima; `None` (with nothing left to do) when there are no blocks, or when the blocks
/// are empty, whose maximum is the fold's start, `+0` (written to `out`).
///
/// Panics if `values` is not a multiple of `out.len()` (an internal indexing bug of the
/// caller; the format crates size both from one block length).
#[inline(always)]
fn block_len(what: &str, values: usize, out: &mut [u32]) -> Option<usize> {
    if out.is_empty() {
        return None;
    }
    assert!(
        values.is_multiple_of(out.len()),
        "{what}: {values} values do not split into {} equal blocks",
        out.len()
    );
    let n = values / out.len();
    if n == 0 {
        out.fill(0);
        return None;
    }
    Some(n)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m512, __m512i, _mm256_loadu_si256, _mm512_and_si512, _mm512_castps_si512,
        _mm512_castsi512_ps, _mm512_castsi512_si256, _mm512_cmple_epu16_mask,
        _mm512_cvtepi32_epi16, _mm512_cvtepu16_epi32, _mm512_cvtph_ps, _mm512_extracti64x4_epi64,
        _mm512_loadu_ps, _mm512_loadu_si512, _mm512_mask_max_epu16, _mm512_maskz_mov_epi16,
        _mm512_max_epu16, _mm512_max_epu32, _mm512_max_ps, _mm512_permutex2var_epi16,
        _mm512_permutex2var_epi32, _mm512_reduce_max_epu32, _mm512_set1_epi16, _mm512_set1_epi32,
        _mm512_setzero_ps, _mm512_setzero_si512, _mm512_slli_epi32, _mm512_srli_epi32,
        _mm512_storeu_si512,
    };

    use super::NanRule;

    /// f32 lanes per vector, and blocks folded together.
    pub(super) const LANES: usize = 16;

    /// The source of lane `i` at a fold level of `p` partials per block out: lane `i %
    /// p` of the `i / p`-th `2p`-lane group of the two vectors side by side (its low
    /// half; the high half is `p` further on). Every fold level's permute indices, of
    /// any lane width.
    const fn pair_source(i: usize, p: usize) -> usize {
        (i / p) * 2 * p + i % p
    }

    /// Permute indices of one fold level: the two blocks' lanes `[0, p)` of every
    /// `2p`-lane group go low, lanes `[p, 2p)` high (a `vpermt2d` index, 32 sources).
    const fn halves(p: usize) -> ([i32; LANES], [i32; LANES]) {
        let mut lo = [0i32; LANES];
        let mut hi = [0i32; LANES];
        let mut i = 0;
        while i < LANES {
            lo[i] = pair_source(i, p) as i32;
            hi[i] = (pair_source(i, p) + p) as i32;
            i += 1;
        }
        (lo, hi)
    }

    /// The indices of the four levels (partials per block 8, 4, 2, 1 after the level).
    const LEVELS: [([i32; LANES], [i32; LANES]); 4] = [halves(8), halves(4), halves(2), halves(1)];

    /// 16-bit lanes per vector: two 16-value bf16 blocks, and 32 blocks folded together
    /// by [`fold32_bf16`].
    const LANES16: usize = 32;

    /// [`halves`] for 32 lanes of 16 bits (a `vpermt2w` index, 64 sources).
    const fn halves16(p: usize) -> ([i16; LANES16], [i16; LANES16]) {
        let mut lo = [0i16; LANES16];
        let mut hi = [0i16; LANES16];
        let mut i = 0;
        while i < LANES16 {
            lo[i] = pair_source(i, p) as i16;
            hi[i] = (pair_source(i, p) + p) as i16;
            i += 1;
        }
        (lo, hi)
    }

    /// The indices of [`fold32_bf16`]'s four levels (partials per block 8, 4, 2, 1).
    const LEVELS16: [([i16; LANES16], [i16; LANES16]); 4] =
        [halves16(8), halves16(4), halves16(2), halves16(1)];

    /// `vpermt2w` indices folding two one-block vectors (32 lanes each) into one of two
    /// blocks of 16 partials: the level before [`LEVELS16`] for blocks of 32 or more.
    const PAIR16: ([i16; LANES16], [i16; LANES16]) = halves16(16);

    /// One fold level on 16-bit lanes: lanes `lo` and lanes `hi` of each pair of vectors
    /// (`vpermt2w` indices), their larger one.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn pair_max16(a: __m512i, b: __m512i, lo: __m512i, hi: __m512i) -> __m512i {
        _mm512_max_epu16(
            _mm512_permutex2var_epi16(a, lo, b),
            _mm512_permutex2var_epi16(a, hi, b),
        )
    }

    /// Folds the `live` vectors of `v` pairwise into its first `live / 2` with the
    /// indices `level` ([`halves16`]).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn fold_level16(v: &mut [__m512i], live: usize, level: ([i16; LANES16], [i16; LANES16])) {
        // SAFETY: each index array is 32 i16 (one unaligned 512-bit load).
        let (lo, hi) = unsafe {
            (
                _mm512_loadu_si512(level.0.as_ptr().cast()),
                _mm512_loadu_si512(level.1.as_ptr().cast()),
            )
        };
        for i in 0..live / 2 {
            v[i] = pair_max16(v[2 * i], v[2 * i + 1], lo, hi);
        }
    }

    /// The 16-bit keys of the 32 bf16 values at `p` (f16 values where `F16`):
    /// magnitudes, NaN (above the format's infinity) 0 under [`NanRule::Ignore`].
    ///
    /// # Safety
    /// `p .. p + 32` must be readable; the CPU has AVX-512 BW.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn keys16<const F16: bool>(p: *const u16, nan: NanRule) -> __m512i {
        // SAFETY: `p .. p + 32` is readable (the contract).
        let x = unsafe { _mm512_loadu_si512(p.cast()) };
        let mag = _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF));
        let inf = if F16 { 0x7C00 } else { 0x7F80 };
        match nan {
            NanRule::Ignore => {
                _mm512_maskz_mov_epi16(_mm512_cmple_epu16_mask(mag, _mm512_set1_epi16(inf)), mag)
            }
            NanRule::Propagate => mag,
        }
    }

    /// Block `b`'s [`keys16`] folded to one vector (`n` values a block, a multiple of
    /// 32, from `p`; f16 where `F16`).
    ///
    /// # Safety
    /// `p + bn .. p + bn + n` must be readable; the CPU has AVX-512 BW.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn block16<const F16: bool>(p: *const u16, b: usize, n: usize, nan: NanRule) -> __m512i {
        // SAFETY: every read lies in block `b` (the contract).
        unsafe {
            let mut acc = keys16::<F16>(p.add(b * n), nan);
            for j in 1..n / LANES16 {
                acc = _mm512_max_epu16(acc, keys16::<F16>(p.add(b * n + LANES16 * j), nan));
            }
            acc
        }
    }

    /// The keys of 16 consecutive bf16 blocks of `n` values (`p .. p + 16n`, `n` a
    /// multiple of 32) as f32 key patterns, lane `b` block `b`: [`fold32_bf16`]'s fold
    /// for the 16-block spans of MXFP8's rowwise walk, one level short, whose last two
    /// partials per block meet in the widening. [`fold16`] on widened lane maxima took
    /// the same permutes plus three operations per block to widen. f16 values where
    /// `F16`, whose maxima widen by `vcvtph2ps`.
    ///
    /// # Safety
    /// `p .. p + 16n` must be readable; `n` a multiple of 32; the CPU has AVX-512 BW.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fold16_bf16<const N: usize, const F16: bool>(
        p: *const u16,
        n: usize,
        nan: NanRule,
    ) -> __m512i {
        let n = if N > 0 { N } else { n };
        let mut v = [_mm512_setzero_si512(); LANES];
        for (b, v) in v.iter_mut().enumerate() {
            // SAFETY: block `b < 16` lies in `p .. p + 16n` (the contract).
            *v = unsafe { block16::<F16>(p, b, n, nan) };
        }
        for (live, level) in [PAIR16, LEVELS16[0], LEVELS16[1], LEVELS16[2]]
            .into_iter()
            .enumerate()
        {
            fold_level16(&mut v, LANES >> live, level);
        }
        if F16 {
            // Each u32 lane: the larger of its block's two partials, in the low half,
            // then the 16 maxima widened.
            let m = _mm512_max_epu32(
                _mm512_srli_epi32::<16>(v[0]),
                _mm512_and_si512(v[0], _mm512_set1_epi32(0xFFFF)),
            );
            return _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(m)));
        }
        // Each u32 lane: the larger of its block's two partials, in the high half.
        _mm512_max_epu32(
            _mm512_slli_epi32::<16>(v[0]),
            _mm512_and_si512(v[0], _mm512_set1_epi32(0xFFFF_0000u32 as i32)),
        )
    }

    /// The keys of 32 consecutive bf16 blocks of `n` values (`p .. p + 32n`), as f32 key
    /// patterns: blocks 0..16 in the first vector, 16..32 in the second.
    ///
    /// The fold runs on 16-bit magnitudes, 32 lanes per vector: a 16-value block fills
    /// half a vector, a longer block is first folded to one vector's lanes and pairs of
    /// them to half a vector each ([`PAIR16`]). Widening each block to f32 lanes and
    /// folding sixteen at a time ([`fold16`]) took twice the loads, masks and permutes.
    /// A magnitude is the high half of its widened f32 pattern, so the 16-bit order is
    /// the f32 key order; NaN is dropped (key 0) under [`NanRule::Ignore`] and kept
    /// (above infinity) otherwise, as [`lanes_max_bf16_16`] and [`lanes_max_bf16`] do.
    /// With `F16` the values are f16: the order of their magnitudes is their value order
    /// too, and the maxima widen exactly by `vcvtph2ps`.
    ///
    /// # Safety
    /// `p .. p + 32n` must be readable; `n` is 16 or a multiple of 32; the CPU has
    /// AVX-512 BW.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fold32_bf16<const N: usize, const F16: bool>(
        p: *const u16,
        n: usize,
        nan: NanRule,
    ) -> [__m512i; 2] {
        let n = if N > 0 { N } else { n };
        // SAFETY: each index array is 32 i16 (one unaligned 512-bit load).
        let (lo, hi) = unsafe {
            (
                _mm512_loadu_si512(PAIR16.0.as_ptr().cast()),
                _mm512_loadu_si512(PAIR16.1.as_ptr().cast()),
            )
        };
        let mut v = [_mm512_setzero_si512(); LANES16 / 2];
        for (i, v) in v.iter_mut().enumerate() {
            // SAFETY: `p .. p + 32n` is readable (the contract), and so are the values
            // each call reads: `32i .. 32i + 32`, or blocks `2i` and `2i + 1`.
            *v = unsafe {
                if n == LANES {
                    keys16::<F16>(p.add(LANES16 * i), nan)
                } else {
                    let (a, b) = (
                        block16::<F16>(p, 2 * i, n, nan),
                        block16::<F16>(p, 2 * i + 1, n, nan),
                    );
                    pair_max16(a, b, lo, hi)
                }
            };
        }
        for (live, level) in LEVELS16.into_iter().enumerate() {
            fold_level16(&mut v, (LANES16 / 2) >> live, level);
        }
        // The maxima as f32 key patterns: a bf16 magnitude is the high half of its
        // widened pattern; an f16 one widens exactly by `vcvtph2ps` (a NaN stays a NaN).
        let widen = |h| match F16 {
            false => _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)),
            true => _mm512_castps_si512(_mm512_cvtph_ps(h)),
        };
        [
            widen(_mm512_castsi512_si256(v[0])),
            widen(_mm512_extracti64x4_epi64::<1>(v[0])),
        ]
    }

    /// Block `b`'s 16 lane maxima (`n` values from `p`).
    ///
    /// # Safety
    /// `p .. p + n` must be readable; `n` a multiple of 16.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn lanes_max(p: *const f32, n: usize, nan: NanRule) -> __m512i {
        // SAFETY: `16 * j + 16 <= n` (`lanes_keyed` asks for `j < n / 16`) and
        // `p .. p + n` is readable (the contract).
        lanes_keyed(n, nan, |j| unsafe { _mm512_loadu_ps(p.add(LANES * j)) })
    }

    /// The 16 lane maxima of the keys of `n / 16` vectors, vector `j` from `load(j)`
    /// (f32 values): [`lanes_max`] and [`lanes_max_f16`], which differ in their loads.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn lanes_keyed(n: usize, nan: NanRule, load: impl Fn(usize) -> __m512) -> __m512i {
        let abs = _mm512_set1_epi32(0x7FFF_FFFF);
        let mag = |j| _mm512_and_si512(_mm512_castps_si512(load(j)), abs);
        match nan {
            NanRule::Ignore => {
                // `vmaxps` returns its second operand when either is NaN, so a NaN
                // value never replaces the (never NaN) accumulator.
                let mut acc = _mm512_setzero_ps();
                for j in 0..n / LANES {
                    acc = _mm512_max_ps(_mm512_castsi512_ps(mag(j)), acc);
                }
                _mm512_castps_si512(acc)
            }
            NanRule::Propagate => {
                let mut acc = _mm512_setzero_si512();
                for j in 0..n / LANES {
                    acc = _mm512_max_epu32(mag(j), acc);
                }
                acc
            }
        }
    }

    /// The maxima of 16 blocks' lane vectors: lane `b` of the result is `max(v[b])`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn fold16(mut v: [__m512i; LANES]) -> __m512i {
        let mut live = LANES;
        for (lo, hi) in LEVELS {
            // SAFETY: each index array is 16 i32 (one unaligned 512-bit load).
            let (lo, hi) = unsafe {
                (
                    _mm512_loadu_si512(lo.as_ptr().cast()),
                    _mm512_loadu_si512(hi.as_ptr().cast()),
                )
            };
            live /= 2;
            for i in 0..live {
                let (a, b) = (v[2 * i], v[2 * i + 1]);
                v[i] = _mm512_max_epu32(
                    _mm512_permutex2var_epi32(a, lo, b),
                    _mm512_permutex2var_epi32(a, hi, b),
                );
            }
        }
        v[0]
    }

    /// [`super::block_abs_max`] with AVX-512.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F; `xs.len() == out.len() * n`, `n` a nonzero
    /// multiple of 16.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn block_abs_max(xs: &[f32], n: usize, nan: NanRule, out: &mut [u32]) {
        // The block lengths of the formats (NVFP4, MXFP8, FP8 1x128) get loops of a
        // constant trip count; a one-vector block then has no loop at all.
        let lanes = |p, n| {
            // SAFETY: `by_blocks` passes blocks `p .. p + n` inside `xs`.
            unsafe { lanes_max(p, n, nan) }
        };
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match n {
                16 => by_blocks::<16, _>(xs, out, lanes),
                32 => by_blocks::<32, _>(xs, out, lanes),
                128 => by_blocks::<128, _>(xs, out, lanes),
                _ => by_blocks::<0, _>(xs, out, lanes),
            }
        }
    }

    /// [`block_abs_max`] (f32 `xs`, `lanes` [`lanes_max`]) or [`block_abs_max_f16`]
    /// (f16 bits, [`lanes_max_f16`]) for blocks of `N` values (`0`: of `xs.len() /
    /// out.len()`): each block's 16 lane maxima from `lanes(start, n)`, folded.
    ///
    /// # Safety
    /// As [`block_abs_max`]'s; `lanes(p, n)` may read `p .. p + n`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn by_blocks<const N: usize, E>(
        xs: &[E],
        out: &mut [u32],
        lanes: impl Fn(*const E, usize) -> __m512i,
    ) {
        let n = if N > 0 { N } else { xs.len() / out.len() };
        debug_assert_eq!(xs.len(), out.len() * n);
        fold_blocks(
            out,
            #[inline(always)]
            // SAFETY: block `b < out.len()` is `b*n .. b*n + n`, inside `xs`
            // (`xs.len() == out.len() * n`).
            |b| lanes(unsafe { xs.as_ptr().add(b * n) }, n),
        );
    }

    /// `out[b]` = the largest lane of `lanes(b)`, block `b`'s 16 lane maxima: sixteen
    /// blocks at a time through [`fold16`], the rest one by one.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn fold_blocks(out: &mut [u32], lanes: impl Fn(usize) -> __m512i) {
        let done = out.len() / LANES * LANES;
        let mut groups = out.chunks_exact_mut(LANES);
        for (g, o) in (&mut groups).enumerate() {
            let v: [__m512i; LANES] = std::array::from_fn(|b| lanes(g * LANES + b));
            // SAFETY: `o` is 16 u32 (one unaligned 512-bit store).
            unsafe { _mm512_storeu_si512(o.as_mut_ptr().cast(), fold16(v)) };
        }
        for (b, o) in groups.into_remainder().iter_mut().enumerate() {
            *o = _mm512_reduce_max_epu32(lanes(done + b));
        }
    }

    /// [`super::block_abs_max_f16`] with AVX-512.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW; `xs.len() == out.len() * n`, `n` a nonzero
    /// multiple of 16.
    ///
    /// Compiled with AVX-512 F alone, as [`by_blocks`] is, so that the `lanes` closure
    /// made here inlines into it (a closure carries its function's features, and a
    /// function with fewer cannot inline it); the BW fold of 32-block groups is one call.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn block_abs_max_f16(xs: &[u16], n: usize, nan: NanRule, out: &mut [u32]) {
        let lanes = |p, n| {
            // SAFETY: `by_blocks` passes blocks `p .. p + n` inside `xs`.
            unsafe { lanes_max_f16(p, n, nan) }
        };
        if n == LANES {
            // NVFP4's 16-value blocks: 32 at a time on their 16-bit magnitudes, as
            // [`block_abs_max_bf16`] folds them (half the operations of widening each
            // block first), the rest widened.
            // SAFETY: the caller's contract (AVX-512 F and BW, `xs` holds `out.len()`
            // blocks of 16).
            let rest = unsafe { fold32_groups::<16, true>(xs, n, nan, out) };
            let tail = &xs[xs.len() - rest.len() * n..];
            // SAFETY: `tail` holds the `rest.len()` remaining blocks of 16.
            return unsafe { by_blocks::<16, _>(tail, rest, lanes) };
        }
        if n.is_multiple_of(2 * LANES) {
            // MXFP8's and FP8's blocks: the 16-bit fold of bf16 (widening each vector
            // first, the fold took 48% of an FP8 1x128 quantize from f16, against the
            // whole of that quantize from bf16 in 57% of the time).
            // SAFETY: the caller's contract (AVX-512 F and BW; `n` a multiple of 32).
            return unsafe { fold16_bits::<true>(xs, n, nan, out) };
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { by_blocks::<0, _>(xs, out, lanes) }
    }

    /// [`lanes_max`] of `n` f16 values from `p`, each vector of 16 widened exactly
    /// (`vcvtph2ps`) before it is keyed.
    ///
    /// # Safety
    /// `p .. p + n` must be readable; `n` a multiple of 16.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn lanes_max_f16(p: *const u16, n: usize, nan: NanRule) -> __m512i {
        lanes_keyed(n, nan, |j| {
            // SAFETY: `16 * j + 16 <= n` and `p .. p + n` is readable (one unaligned
            // 256-bit load of 16 f16).
            _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.add(LANES * j).cast()) })
        })
    }

    /// Block `b`'s maxima of bf16 keys, folded to 16 u32 lanes holding f32 key patterns
    /// (`n` values from `p`).
    ///
    /// # Safety
    /// `p .. p + n` must be readable; `n` a multiple of 32; the CPU has AVX-512 BW.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn lanes_max_bf16(p: *const u16, n: usize, nan: NanRule) -> __m512i {
        let abs = _mm512_set1_epi16(0x7FFF);
        let inf = _mm512_set1_epi16(0x7F80);
        let mut acc = _mm512_setzero_si512();
        for j in 0..n / (2 * LANES) {
            // SAFETY: `32 * j + 32 <= n` and `p .. p + n` is readable.
            let x = unsafe { _mm512_loadu_si512(p.add(2 * LANES * j).cast()) };
            let mag = _mm512_and_si512(x, abs);
            acc = match nan {
                // A NaN lane (magnitude above infinity's) leaves the accumulator as is.
                NanRule::Ignore => {
                    _mm512_mask_max_epu16(acc, _mm512_cmple_epu16_mask(mag, inf), acc, mag)
                }
                NanRule::Propagate => _mm512_max_epu16(acc, mag),
            };
        }
        // Each u32 lane: the larger of its two u16 halves, in the high half (the f32
        // pattern of the widened magnitude).
        _mm512_max_epu32(
            _mm512_slli_epi32::<16>(acc),
            _mm512_and_si512(acc, _mm512_set1_epi32(0xFFFF_0000u32 as i32)),
        )
    }

    /// The lane maxima of one 16-value bf16 block: its values widened to f32 patterns
    /// (`vpmovzxwd`, shift) and keyed as [`lanes_max`] keys f32 values.
    ///
    /// # Safety
    /// `p .. p + 16` must be readable; the CPU has AVX-512 BW.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn lanes_max_bf16_16(p: *const u16, nan: NanRule) -> __m512i {
        // SAFETY: `p .. p + 16` (32 bytes) is readable (one unaligned 256-bit load).
        let x = unsafe { _mm256_loadu_si256(p.cast()) };
        let mag = _mm512_and_si512(
            _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(x)),
            _mm512_set1_epi32(0x7FFF_FFFF),
        );
        match nan {
            // As in `lanes_max`: `vmaxps` keeps the zero accumulator against a NaN.
            NanRule::Ignore => {
                _mm512_castps_si512(_mm512_max_ps(_mm512_castsi512_ps(mag), _mm512_setzero_ps()))
            }
            NanRule::Propagate => mag,
        }
    }

    /// Writes the keys of every whole group of 32 blocks of `n` values of `xs` (bf16, or
    /// f16 where `F16`) into `out`, [`fold32_bf16`]`::<N, F16>` per group, and returns
    /// the blocks left over (fewer than 32).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW; `xs.len() == out.len() * n`, `n` 16 or a
    /// nonzero multiple of 32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fold32_groups<'o, const N: usize, const F16: bool>(
        xs: &[u16],
        n: usize,
        nan: NanRule,
        out: &'o mut [u32],
    ) -> &'o mut [u32] {
        let mut groups = out.chunks_exact_mut(LANES16);
        for (g, o) in (&mut groups).enumerate() {
            // SAFETY: blocks `32g .. 32g + 32` are values `32gn .. 32gn + 32n`, inside
            // `xs`; `n` fits `fold32_bf16` and the CPU has AVX-512 BW (the contract).
            let keys = unsafe { fold32_bf16::<N, F16>(xs[g * LANES16 * n..].as_ptr(), n, nan) };
            for (h, k) in o.chunks_exact_mut(LANES).zip(keys) {
                // SAFETY: `h` is 16 u32 (one unaligned 512-bit store).
                unsafe { _mm512_storeu_si512(h.as_mut_ptr().cast(), k) };
            }
        }
        groups.into_remainder()
    }

    /// [`super::block_abs_max_bf16`] with AVX-512.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW; `xs.len() == out.len() * n`, `n` 16 or a
    /// nonzero multiple of 32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn block_abs_max_bf16(xs: &[u16], n: usize, nan: NanRule, out: &mut [u32]) {
        // SAFETY: the caller's contract, passed on.
        unsafe { fold16_bits::<false>(xs, n, nan, out) }
    }

    /// The 16-bit fold of [`super::block_abs_max_bf16`] (and of [`block_abs_max_f16`]'s
    /// blocks of a multiple of 32, where `F16`): groups of 32 blocks through
    /// [`fold32_bf16`], then one group of 16 through [`fold16_bf16`], the rest one by
    /// one.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BW; `xs.len() == out.len() * n`, `n` 16 or a
    /// nonzero multiple of 32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fold16_bits<const F16: bool>(xs: &[u16], n: usize, nan: NanRule, out: &mut [u32]) {
        debug_assert_eq!(xs.len(), out.len() * n);
        debug_assert!(n == LANES || n.is_multiple_of(2 * LANES));
        // SAFETY: the caller's contract, passed on. The block lengths of the formats
        // (NVFP4, MXFP8, FP8 1x128) get a constant one: with `n` read at run time,
        // NVFP4's fold of 16-value blocks measured x0.76.
        let mut rest = unsafe {
            match n {
                16 => fold32_groups::<16, F16>(xs, n, nan, out),
                32 => fold32_groups::<32, F16>(xs, n, nan, out),
                128 => fold32_groups::<128, F16>(xs, n, nan, out),
                _ => fold32_groups::<0, F16>(xs, n, nan, out),
            }
        };
        if n != LANES && rest.len() >= LANES {
            let at = xs[xs.len() - rest.len() * n..].as_ptr();
            // SAFETY: the first 16 blocks of the rest lie in `xs` from `at`; `n` is a
            // multiple of 32 and the CPU has AVX-512 BW (the caller's contract).
            let keys = unsafe {
                match n {
                    32 => fold16_bf16::<32, F16>(at, n, nan),
                    128 => fold16_bf16::<128, F16>(at, n, nan),
                    _ => fold16_bf16::<0, F16>(at, n, nan),
                }
            };
            let (head, more) = rest.split_at_mut(LANES);
            // SAFETY: `head` is 16 u32 (one unaligned 512-bit store).
            unsafe { _mm512_storeu_si512(head.as_mut_ptr().cast(), keys) };
            rest = more;
        }
        let tail = &xs[xs.len() - rest.len() * n..];
        fold_blocks(
            rest,
            #[inline(always)]
            // SAFETY: block `b < rest.len()` is `bn .. bn + n` of `tail`, which holds
            // `rest.len()` blocks; the CPU has AVX-512 BW (the caller's contract).
            |b| unsafe {
                let at = tail.as_ptr().add(b * n);
                match (F16, n == LANES) {
                    (true, _) => lanes_max_f16(at, n, nan),
                    (false, true) => lanes_max_bf16_16(at, nan),
                    (false, false) => lanes_max_bf16(at, n, nan),
                }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd;
    use quantfmt_testkit::XorShift32;

    #[test]
    fn f16_keys_widen_as_half_does_on_every_magnitude() {
        for key in 0..=0x7FFFu16 {
            let want = half::f16::from_bits(key).to_f32();
            let got = f32::from_bits(column_key(Bits16::F16(&[]), key));
            if want.is_nan() {
                assert!(got.is_nan(), "{key:#06x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{key:#06x}");
            }
        }
    }

    #[test]
    fn column_keys_equal_the_widened_keys_on_every_16_bit_pattern() {
        // 256 rows of 256 columns: every 16-bit pattern once, each column a different mix.
        let rows: Vec<Vec<u16>> = (0..256u32)
            .map(|r| (0..256u32).map(|j| ((r << 8) | (j ^ r)) as u16).collect())
            .collect();
        type Tag = fn(&[u16]) -> Bits16<'_>;
        type Widen = fn(u16) -> f32;
        let formats: [(Tag, Widen); 2] = [
            (|r| Bits16::Bf16(r), |b| f32::from_bits(u32::from(b) << 16)),
            (|r| Bits16::F16(r), |b| half::f16::from_bits(b).to_f32()),
        ];
        for (bits, widen) in formats {
            for nan in [NanRule::Ignore, NanRule::Propagate] {
                let mut acc = vec![0u16; 256];
                let mut want = vec![0u32; 256];
                for row in &rows {
                    column_abs_max_bits(bits(row), nan, &mut acc);
                    for (w, &b) in want.iter_mut().zip(row) {
                        *w = (*w).max(nan.key(widen(b)));
                    }
                }
                let like = bits(&[]);
                for (j, (&a, &w)) in acc.iter().zip(&want).enumerate() {
                    let got = column_key(like, a);
                    if w > INF_BITS {
                        // A NaN maximum: any NaN pattern (f16 NaNs widen with their
                        // payload, which the fold of magnitudes need not keep).
                        assert!(got > INF_BITS, "{like:?} {nan:?} column {j}: {got:#x}");
                    } else {
                        assert_eq!(got, w, "{like:?} {nan:?} column {j}");
                    }
                }
            }
        }
    }

    /// A run mixing every special: NaN (both signs, payloads), infinities, signed
    /// zeros, subnormals, the largest finite values and ordinary numbers.
    fn values(len: usize, seed: u32) -> Vec<f32> {
        let special = [
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7FC0_1234),
            f32::from_bits(0xFF80_0001),
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::from_bits(1),
            -f32::from_bits(0x007F_FFFF),
            f32::MAX,
            -f32::MAX,
        ];
        let mut rng = XorShift32::new(seed | 1);
        (0..len)
            .map(|_| {
                let s = rng.next_u32();
                if s.is_multiple_of(29) {
                    special[(s as usize >> 8) % special.len()]
                } else {
                    f32::from_bits(s >> 2) * if s & 2 == 0 { 1.0 } else { -1.0 }
                }
            })
            .collect()
    }

    /// The specification: a sequential fold of the keys of each block.
    fn sequential(xs: &[f32], n: usize, nan: NanRule) -> Vec<u32> {
        xs.chunks_exact(n)
            .map(|b| b.iter().fold(0, |m, &v| m.max(nan.key(v))))
            .collect()
    }

    #[test]
    fn every_level_gives_the_sequential_fold() {
        for n in [1, 7, 16, 32, 48, 128] {
            for blocks in [1, 2, 15, 16, 17, 33, 48] {
                for (seed, nan) in [(3, NanRule::Ignore), (5, NanRule::Propagate)] {
                    let xs = values(n * blocks, seed + (n * blocks) as u32);
                    let want = sequential(&xs, n, nan);
                    simd::for_each_supported_level(|level| {
                        let mut out = vec![0u32; blocks];
                        simd::dispatch(level, || block_abs_max(level, &xs, nan, &mut out));
                        assert_eq!(out, want, "{level}, {blocks} blocks of {n}, {nan:?}");
                    });
                }
            }
        }
    }

    #[test]
    fn bf16_bits_give_the_keys_of_the_widened_values() {
        for n in [0, 1, 16, 32, 48, 64, 96, 128] {
            // Blocks fold 32 at a time, then (32 values or more) 16, then one by one:
            // whole groups, groups and tails, tails alone.
            for blocks in [1, 2, 15, 16, 17, 32, 33, 64, 95] {
                for (seed, nan) in [(7, NanRule::Ignore), (9, NanRule::Propagate)] {
                    // Every special survives the truncation to bf16 (NaN payloads in
                    // the high bits, infinities, zeros, subnormals).
                    let bits: Vec<u16> = values(n * blocks, seed + (n * blocks) as u32)
                        .iter()
                        .map(|v| (v.to_bits() >> 16) as u16)
                        .collect();
                    let wide: Vec<f32> = bits
                        .iter()
                        .map(|&b| f32::from_bits(u32::from(b) << 16))
                        .collect();
                    let want = if n == 0 {
                        vec![0; blocks]
                    } else {
                        sequential(&wide, n, nan)
                    };
                    simd::for_each_supported_level(|level| {
                        let mut out = vec![7u32; blocks];
                        simd::dispatch(level, || block_abs_max_bf16(level, &bits, nan, &mut out));
                        assert_eq!(out, want, "{level}, {blocks} blocks of {n}, {nan:?}");
                    });
                }
            }
        }
    }

    #[test]
    fn f16_bits_give_the_keys_of_the_widened_values() {
        // Every f16 pattern (NaNs of both signs and all payloads, infinities, zeros,
        // subnormals), shuffled so that each block mixes them.
        let mut rng = XorShift32::new(11);
        let mut all: Vec<u16> = (0..=u16::MAX).collect();
        for i in (1..all.len()).rev() {
            all.swap(i, rng.next_u32() as usize % (i + 1));
        }
        for n in [0, 1, 16, 32, 48, 64, 96, 128] {
            // As for bf16: 32 blocks at a time, then (32 values or more) 16, then one by
            // one.
            for blocks in [1, 2, 15, 16, 17, 32, 33, 64, 95] {
                for nan in [NanRule::Ignore, NanRule::Propagate] {
                    let at = (n * blocks * 7) % (all.len() - n * blocks);
                    let bits = &all[at..at + n * blocks];
                    let wide: Vec<f32> = bits
                        .iter()
                        .map(|&b| half::f16::from_bits(b).to_f32())
                        .collect();
                    let want = if n == 0 {
                        vec![0; blocks]
                    } else {
                        sequential(&wide, n, nan)
                    };
                    simd::for_each_supported_level(|level| {
                        let mut out = vec![7u32; blocks];
                        simd::dispatch(level, || block_abs_max_f16(level, bits, nan, &mut out));
                        for (b, (&got, &want)) in out.iter().zip(&want).enumerate() {
                            let case = format!("{level}, block {b} of {blocks} x {n}, {nan:?}");
                            if want > INF_BITS {
                                assert!(got > INF_BITS, "{case}: {got:#x} is not NaN");
                            } else {
                                assert_eq!(got, want, "{case}");
                            }
                        }
                    });
                }
            }
        }
    }

    #[test]
    fn nan_rules() {
        let mut xs = vec![1.0f32; 32];
        xs[5] = f32::NAN;
        xs[20] = -3.0;
        let mut out = [0u32; 2];
        block_abs_max(simd::level(), &xs, NanRule::Ignore, &mut out);
        assert_eq!(out.map(f32::from_bits), [1.0, 3.0]);
        block_abs_max(simd::level(), &xs, NanRule::Propagate, &mut out);
        assert!(f32::from_bits(out[0]).is_nan());
        assert_eq!(f32::from_bits(out[1]), 3.0);
        // All-NaN blocks: +0 when NaN is ignored.
        let mut one = [7u32];
        block_abs_max(simd::level(), &[f32::NAN; 16], NanRule::Ignore, &mut one);
        assert_eq!(one, [0]);
        block_abs_max(simd::level(), &[], NanRule::Ignore, &mut []);
        let mut empty = [9u32; 3];
        block_abs_max(simd::level(), &[], NanRule::Propagate, &mut empty);
        assert_eq!(empty, [0; 3]);
    }
}
