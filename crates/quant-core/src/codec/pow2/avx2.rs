//! The bf16 encoder of the parent module at AVX2 (and its f16 fast route,
//! [`encode32_f16`]): 16 values per 256-bit vector, two
//! vectors (32 codes) per store, under one exponent per block or, for a
//! [`super::LaneExps`] set, one per lane.
//!
//! The fast route is the AVX-512 kernel's, operation for operation, with AVX2's
//! substitutes: an unsigned 16-bit `>=` is `max_epu16(a, b) == a`, and the masks are
//! vectors (`vptest` asks whether any lane needs the general route). A chunk that does
//! (a subnormal code, a bf16 subnormal input, infinity or NaN: rare in data under a
//! block scale) is encoded value by value with [`Fp8::encode`], the specification
//! itself, instead of a vector form of the general steps: AVX2 has no 16-bit variable
//! shifts.
//!
//! f32 input is narrowed to bf16 by rounding to odd first ([`super::bf16_round_to_odd`],
//! exact for both FP8 formats: the `from_f32` module's docs), as at AVX-512.

use std::arch::x86_64::{
    __m128i, __m256, __m256i, _mm_cvtsi32_si128, _mm_loadu_si128, _mm256_add_epi16,
    _mm256_and_si256, _mm256_andnot_si256, _mm256_castps_si256, _mm256_cmpeq_epi16,
    _mm256_cmpeq_epi32, _mm256_cmpgt_epi32, _mm256_cvtph_ps, _mm256_loadu_ps, _mm256_loadu_si256,
    _mm256_maskload_epi32, _mm256_max_epi16, _mm256_max_epu16, _mm256_min_epi16, _mm256_or_si256,
    _mm256_packus_epi16, _mm256_packus_epi32, _mm256_permute4x64_epi64, _mm256_set1_epi16,
    _mm256_set1_epi32, _mm256_setr_epi32, _mm256_setzero_si256, _mm256_srl_epi16,
    _mm256_srli_epi16, _mm256_srli_epi32, _mm256_storeu_si256, _mm256_sub_epi16, _mm256_subs_epu16,
    _mm256_testz_si256,
};

use super::Fp8;
use super::x86::{Blocks, TABLE, block_table};

/// The call's constant vectors, for input with `mantissa` bits (7 for bf16, 10 for the
/// f16 fast route).
struct Consts {
    fp8: Fp8,
    abs: __m256i,
    one: __m256i,
    zero: __m256i,
    max_code: __m256i,
    sign: __m256i,
    /// `mantissa - MBITS`, the normal shift, as a shift count.
    sh: __m128i,
    /// `2^(mantissa - MBITS - 1) - 1`, the rounding addend of the normal shift.
    round: __m256i,
}

impl Consts {
    #[inline]
    #[target_feature(enable = "avx2")]
    fn new(fp8: Fp8) -> Consts {
        Consts::for_mantissa(fp8, 7)
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn for_mantissa(fp8: Fp8, mantissa: i32) -> Consts {
        let sh = mantissa - fp8.mbits as i32;
        Consts {
            fp8,
            abs: _mm256_set1_epi16(0x7FFF),
            one: _mm256_set1_epi16(1),
            zero: _mm256_setzero_si256(),
            max_code: _mm256_set1_epi16(i16::from(fp8.max_code)),
            sign: _mm256_set1_epi16(0x80),
            sh: _mm_cvtsi32_si128(sh),
            round: _mm256_set1_epi16((1 << (sh - 1)) - 1),
        }
    }
}

/// One block's constants ([`Fp8::block_consts`]) and its exponent; or 16 lanes' constants
/// from a [`super::LaneExps`] set, each lane with its own exponent.
#[derive(Clone, Copy)]
struct Block<'a> {
    normal_from: __m256i,
    normal_span: __m256i,
    rebias: __m256i,
    k: Exps<'a>,
}

/// The exponent(s) of a [`Block`], read only by the general route.
#[derive(Clone, Copy)]
enum Exps<'a> {
    /// One for the whole block.
    One(i32),
    /// One per lane, as [`Fp8::block_consts`] stores them (`k as u16`).
    Each(&'a [u16]),
}

impl Block<'static> {
    #[inline]
    #[target_feature(enable = "avx2")]
    fn new(fp8: Fp8, k: i32) -> Block<'static> {
        let [normal_from, normal_span, rebias, _] = fp8.block_consts(k).map(|v| v as i16);
        Block {
            normal_from: _mm256_set1_epi16(normal_from),
            normal_span: _mm256_set1_epi16(normal_span),
            rebias: _mm256_set1_epi16(rebias),
            k: Exps::One(k),
        }
    }
}

impl<'a> Block<'a> {
    /// Lanes `16 * half .. 16 * half + 16` of a lane set's 32-lane vector `v` (the rows
    /// of [`Fp8::block_consts`]: `normal_from`, `normal_span`, `rebias`, `k`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn lanes(v: &'a [[u16; 32]; 4], half: usize) -> Block<'a> {
        // Panics unless `half` is 0 or 1 (an indexing bug of the caller).
        let row = |r: usize| -> &'a [u16] { &v[r][16 * half..16 * half + 16] };
        // SAFETY: each row is 16 u16 = 32 bytes (one unaligned 256-bit load).
        let at = |r: usize| unsafe { _mm256_loadu_si256(row(r).as_ptr().cast()) };
        Block {
            normal_from: at(0),
            normal_span: at(1),
            rebias: at(2),
            k: Exps::Each(row(3)),
        }
    }
}

/// [`Fp8::encode`] of 16 bf16 values, codes in u16 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn encode16(c: &Consts, blk: &Block<'_>, x: __m256i, plus_zero: bool) -> __m256i {
    let mag = _mm256_and_si256(x, c.abs);
    let zero = _mm256_cmpeq_epi16(mag, c.zero);
    // Outside `normal_from .. 0x7F80` (an unsigned compare after a wrapping subtraction),
    // zero excepted.
    let t = _mm256_sub_epi16(mag, blk.normal_from);
    let outside = _mm256_cmpeq_epi16(_mm256_max_epu16(t, blk.normal_span), t);
    let general = _mm256_andnot_si256(zero, outside);
    if _mm256_testz_si256(general, general) == 0 {
        return encode16_scalar(c.fp8, blk.k, x, plus_zero);
    }
    let lsb = _mm256_and_si256(_mm256_srl_epi16(mag, c.sh), c.one);
    let q = _mm256_srl_epi16(_mm256_add_epi16(_mm256_add_epi16(mag, c.round), lsb), c.sh);
    // Zero saturates to 0.
    let code = _mm256_min_epi16(_mm256_subs_epu16(q, blk.rebias), c.max_code);
    let sign = _mm256_srli_epi16::<8>(x);
    let sign = if plus_zero {
        _mm256_andnot_si256(zero, sign)
    } else {
        sign
    };
    _mm256_or_si256(code, _mm256_and_si256(sign, c.sign))
}

/// [`Fp8::encode`] of each of 16 values: the general route, kept out of line (rare).
#[cold]
#[inline(never)]
#[target_feature(enable = "avx2")]
fn encode16_scalar(fp8: Fp8, k: Exps<'_>, x: __m256i, plus_zero: bool) -> __m256i {
    // SAFETY: both types are 32 bytes of plain data; every bit pattern is valid for either.
    let bits: [u16; 16] = unsafe { std::mem::transmute(x) };
    let mut codes = [0u16; 16];
    for (l, (c, &b)) in codes.iter_mut().zip(&bits).enumerate() {
        let k = match k {
            Exps::One(k) => k,
            // The exponent was stored as `k as u16`; `as i16` gives its sign back.
            Exps::Each(ks) => i32::from(ks[l] as i16),
        };
        *c = u16::from(fp8.encode(b, k, plus_zero));
    }
    // SAFETY: as above.
    unsafe { std::mem::transmute(codes) }
}

/// Stores the codes of `chunks` 32-value chunks into `dst`, `codes(j)` giving chunk
/// `j`'s two halves as u16 lanes, in order: `vpackuswb` (the codes are below 256)
/// interleaves their 128-bit halves, one `vpermq` restores the order.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn store_codes(chunks: usize, dst: &mut [u8], mut codes: impl FnMut(usize) -> (__m256i, __m256i)) {
    for (j, d) in dst[..32 * chunks].chunks_exact_mut(32).enumerate() {
        let (lo, hi) = codes(j);
        let bytes = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(lo, hi));
        // SAFETY: `d` is 32 bytes (one unaligned 256-bit store).
        unsafe { _mm256_storeu_si256(d.as_mut_ptr().cast(), bytes) };
    }
}

/// Encodes `chunks` 32-value chunks into `dst`, `load(j)` giving chunk `j`'s bf16 bits
/// as two vectors of 16, chunk `j` under `ks[32 j / block]`: the loop both input types
/// share.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn encode_chunks(
    fp8: Fp8,
    (block, ks): (usize, &[i32]),
    plus_zero: bool,
    (chunks, dst): (usize, &mut [u8]),
    load: impl Fn(usize) -> [__m256i; 2],
) {
    let c = Consts::new(fp8);
    let chunk = |blk: &Block<'_>, j: usize| {
        let [lo, hi] = load(j);
        (
            encode16(&c, blk, lo, plus_zero),
            encode16(&c, blk, hi, plus_zero),
        )
    };
    if block == 32 {
        // One-chunk blocks (MXFP8): constants from a table (`super::x86::store_blocks`).
        let consts = |k| {
            let [from, span, rebias, _] = fp8.block_consts16(k);
            [from, span, rebias].map(|v| v as i16)
        };
        for (t, (ks, dst)) in ks.chunks(TABLE).zip(dst.chunks_mut(32 * TABLE)).enumerate() {
            let rows = block_table(&exponents(ks), &consts);
            store_codes(
                ks.len(),
                dst,
                #[inline(always)]
                |j| {
                    let [normal_from, normal_span, rebias] = broadcast(&rows, j);
                    let k = Exps::One(ks[j]);
                    let blk = Block {
                        normal_from,
                        normal_span,
                        rebias,
                        k,
                    };
                    chunk(&blk, TABLE * t + j)
                },
            );
        }
        return;
    }
    let mut blocks = Blocks::new(ks, block / 32, |k| Block::new(fp8, k));
    store_codes(
        chunks,
        dst,
        #[inline(always)]
        |j| chunk(blocks.next(), j),
    );
}

/// Up to [`TABLE`] exponents `ks` as a full row of [`block_table`], zeros past
/// `ks.len()`: two masked loads and two 256-bit stores (which the table's 256-bit loads
/// read back).
#[inline]
#[target_feature(enable = "avx2")]
fn exponents(ks: &[i32]) -> [i32; TABLE] {
    let ks = &ks[..ks.len().min(TABLE)];
    let n = _mm256_set1_epi32(ks.len() as i32);
    let lanes = |a: i32| _mm256_setr_epi32(a, a + 1, a + 2, a + 3, a + 4, a + 5, a + 6, a + 7);
    // All ones in the lanes below `ks.len()`.
    let (lo, hi) = (
        _mm256_cmpgt_epi32(n, lanes(0)),
        _mm256_cmpgt_epi32(n, lanes(8)),
    );
    let mut k32 = [0i32; TABLE];
    // SAFETY: a masked load reads only the lanes its mask sets, here lanes below
    // `ks.len()`, which lie in `ks` (a masked-off lane is 0 and reads nothing, so the
    // second load's address may lie past `ks`); the stores write the 64 bytes of `k32`
    // (two unaligned 256-bit stores).
    unsafe {
        let a = _mm256_maskload_epi32(ks.as_ptr(), lo);
        let b = _mm256_maskload_epi32(ks.as_ptr().wrapping_add(8), hi);
        _mm256_storeu_si256(k32.as_mut_ptr().cast(), a);
        _mm256_storeu_si256(k32.as_mut_ptr().add(8).cast(), b);
    }
    k32
}

/// Block `j`'s three constants of a [`block_table`], each broadcast from memory.
#[inline]
#[target_feature(enable = "avx2")]
fn broadcast(rows: &[[u32; TABLE]; 3], j: usize) -> [__m256i; 3] {
    rows.map(|row| _mm256_set1_epi32(row[j] as i32))
}

/// [`super::encode_blocks`] for bf16 bits at AVX2, after its checks.
///
/// # Safety
/// The CPU must have AVX2 and F16C (the level's features, which every function here
/// that takes a closure carries, so that the closures inline); `src.len() == dst.len()
/// == ks.len() * block`, `block` a multiple of 32; every `k` satisfies
/// [`Fp8::pow2_exact`].
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn encode_blocks(
    fp8: Fp8,
    src: &[u16],
    block: usize,
    ks: &[i32],
    plus_zero: bool,
    dst: &mut [u8],
) {
    encode_chunks(fp8, (block, ks), plus_zero, (src.len() / 32, dst), |j| {
        load_bits(&src[32 * j..])
    });
}

/// 32 16-bit patterns (`s`, at least 32: bf16, or f16 for the f16 route) in two
/// vectors of 16.
#[inline]
#[target_feature(enable = "avx2")]
fn load_bits(s: &[u16]) -> [__m256i; 2] {
    let s = &s[..32];
    // SAFETY: `s` is 32 u16 (two unaligned 256-bit loads).
    unsafe {
        [
            _mm256_loadu_si256(s.as_ptr().cast()),
            _mm256_loadu_si256(s[16..].as_ptr().cast()),
        ]
    }
}

/// Encodes one row of a lane set's constants (`consts`, 32 lanes each) into `dst`,
/// `load(j)` giving lanes `32 j ..` as two vectors of bf16 bits: the loop both row
/// formats share.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn encode_lane_chunks(
    fp8: Fp8,
    consts: &[[[u16; 32]; 4]],
    plus_zero: bool,
    dst: &mut [u8],
    load: impl Fn(usize) -> [__m256i; 2],
) {
    let c = Consts::new(fp8);
    store_codes(consts.len(), dst, |j| {
        let [lo, hi] = load(j);
        (
            encode16(&c, &Block::lanes(&consts[j], 0), lo, plus_zero),
            encode16(&c, &Block::lanes(&consts[j], 1), hi, plus_zero),
        )
    });
}

/// [`super::LaneExps::encode`] for bf16 rows at AVX2, after its checks: each 32-lane
/// vector of constants taken as two halves of 16.
///
/// # Safety
/// The CPU must have AVX2 and F16C; `src.len() == dst.len() == 32 * consts.len()`;
/// `consts` was made by [`super::LaneExps::set`] for `fp8`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn encode_lanes(
    fp8: Fp8,
    consts: &[[[u16; 32]; 4]],
    src: &[u16],
    plus_zero: bool,
    dst: &mut [u8],
) {
    encode_lane_chunks(fp8, consts, plus_zero, dst, |j| load_bits(&src[32 * j..]));
}

/// [`super::LaneExps::encode`] for f16 rows at AVX2, after its checks: each 32-lane
/// chunk on the f16 fast route ([`encode32_f16`]) where every lane is zero or a normal
/// f16 with a normal code under its own exponent; any other chunk widened exactly
/// (`vcvtph2ps`), narrowed to bf16 by rounding to odd (exact for the codes: the
/// `from_f32` module's docs), then through [`encode_lanes`]'s steps.
///
/// Every chunk took the widening route before: in process (8192^2 on two Zen 4 cores),
/// MXFP8 columnwise from f16 x1.16 (6 A/B pairs, range 1.03-1.22).
///
/// # Safety
/// The CPU must have AVX2 and F16C; `src.len() == dst.len() == 32 * consts.len() == 32 *
/// halves.len()`; both were made by [`super::LaneExps::set_for`] at AVX2 for f16 rows
/// and `fp8` (every `k` satisfies [`Fp8::pow2_exact_f32`]).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn encode_lanes_f16(
    fp8: Fp8,
    (consts, halves): (&[[[u16; 32]; 4]], &[super::f16::Lanes]),
    src: &[u16],
    plus_zero: bool,
    dst: &mut [u8],
) {
    let c = Consts::new(fp8);
    let h = Consts::for_mantissa(fp8, 10);
    store_codes(consts.len(), dst, |j| {
        let s = &src[32 * j..];
        let [a, b] = load_bits(s);
        let blocks = [0, 1].map(|half| HalfBlock::lanes(&halves[j].consts, half));
        if let Some(codes) = encode32_f16(&h, blocks, [a, b], plus_zero) {
            return codes;
        }
        let [lo, hi] = widened_to_odd(s);
        (
            encode16(&c, &Block::lanes(&consts[j], 0), lo, plus_zero),
            encode16(&c, &Block::lanes(&consts[j], 1), hi, plus_zero),
        )
    });
}

/// [`super::encode_blocks`] for f16 bits at AVX2, after its checks: each 32-value chunk
/// whose lanes are all zero or normal f16 values with normal codes on the f16 fast
/// route ([`encode32_f16`], the bits rounded in place); any other chunk widened exactly
/// (`vcvtph2ps`), narrowed to bf16 by rounding to odd, as [`encode_blocks_f32`] narrows
/// f32 (exact for the codes: the `from_f32` module's docs), and encoded by the bf16
/// steps. Either way `fp8.encode_f16(x, k)`, the f32 route's code of the same value.
///
/// Every chunk took the widening route before the fast one existed: in process (8192^2
/// on two Zen 4 cores, 3-5 A/B pairs), FP8 1x128 rowwise from f16 x1.29, 128x128 x1.32.
///
/// # Safety
/// The CPU must have AVX2 and F16C; `src.len() == dst.len() == ks.len() * block`,
/// `block` a multiple of 32; every `k` satisfies [`Fp8::pow2_exact_f16`] and
/// [`Fp8::pow2_exact_f32`].
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn encode_blocks_f16(
    fp8: Fp8,
    src: &[u16],
    block: usize,
    ks: &[i32],
    plus_zero: bool,
    dst: &mut [u8],
) {
    let c = Consts::new(fp8);
    let h = Consts::for_mantissa(fp8, 10);
    // The widening route's constants are made only for the chunks that take it: with
    // 32-value blocks (MXFP8) a block's set-up is a chunk's.
    let chunk = |k: i32, half: &HalfBlock, j: usize| {
        let s = &src[32 * j..];
        let [a, b] = load_bits(s);
        if let Some(codes) = encode32_f16(&h, [*half; 2], [a, b], plus_zero) {
            return codes;
        }
        let blk = Block::new(fp8, k);
        let [lo, hi] = widened_to_odd(s);
        (
            encode16(&c, &blk, lo, plus_zero),
            encode16(&c, &blk, hi, plus_zero),
        )
    };
    if block == 32 {
        // One-chunk blocks (MXFP8): constants from a table, as in `encode_chunks`.
        let consts = |k: i16| HalfBlock::consts(fp8, i32::from(k));
        for (t, (ks, dst)) in ks.chunks(TABLE).zip(dst.chunks_mut(32 * TABLE)).enumerate() {
            let rows = block_table(&exponents(ks), &consts);
            store_codes(
                ks.len(),
                dst,
                #[inline(always)]
                |j| {
                    let [normal_from, normal_span, rebias] = broadcast(&rows, j);
                    let half = HalfBlock {
                        normal_from,
                        normal_span,
                        rebias,
                    };
                    chunk(ks[j], &half, TABLE * t + j)
                },
            );
        }
        return;
    }
    let mut blocks = Blocks::new(ks, block / 32, |k| (k, HalfBlock::new(fp8, k)));
    store_codes(
        src.len() / 32,
        dst,
        #[inline(always)]
        |j| {
            let &(k, ref half) = blocks.next();
            chunk(k, half, j)
        },
    );
}

/// One block's f16 fast-route constants ([`Fp8::block_consts_f16`]), with every f16
/// subnormal sent to the other route: AVX2 has no 16-bit variable shifts to normalize
/// them, as the AVX-512 kernel does.
#[derive(Clone, Copy)]
struct HalfBlock {
    /// The smallest magnitude the route takes: a normal f16 with a normal code.
    normal_from: __m256i,
    /// How many magnitudes from `normal_from` up it takes (up to infinity's, excluded).
    normal_span: __m256i,
    /// `(15 - BIAS - k) << MBITS`, subtracted from the rounded bits (may be negative).
    rebias: __m256i,
}

impl HalfBlock {
    #[inline]
    #[target_feature(enable = "avx2")]
    fn new(fp8: Fp8, k: i32) -> HalfBlock {
        let [normal_from, normal_span, rebias] =
            HalfBlock::consts(fp8, k).map(|v| _mm256_set1_epi16(v));
        HalfBlock {
            normal_from,
            normal_span,
            rebias,
        }
    }

    /// The 16-bit lane values of [`HalfBlock::new`]'s vectors: `normal_from`,
    /// `normal_span`, `rebias`.
    #[inline(always)]
    fn consts(fp8: Fp8, k: i32) -> [i16; 3] {
        let [from, _, rebias] = fp8.block_consts_f16(k);
        // At least the smallest normal f16 (`from` is negative where a subnormal input
        // could reach a normal code), at most infinity's bits (no lane taken).
        let from = from.max(0x400);
        [from, 0x7C00 - from, rebias]
    }

    /// Lanes `16 * half .. 16 * half + 16` of an f16 lane set's constants (rows
    /// `normal_from`, `normal_span`, `rebias` of [`Fp8::block_consts_f16`]), each
    /// `normal_from` raised to the smallest normal f16 as in [`HalfBlock::new`].
    #[inline]
    #[target_feature(enable = "avx2")]
    fn lanes(v: &[[i16; 32]; 3], half: usize) -> HalfBlock {
        // Panics unless `half` is 0 or 1 (an indexing bug of the caller).
        let row = |r: usize| &v[r][16 * half..16 * half + 16];
        // SAFETY: each row is 16 i16 = 32 bytes (one unaligned 256-bit load).
        let at = |r: usize| unsafe { _mm256_loadu_si256(row(r).as_ptr().cast()) };
        // A signed maximum: `normal_from` may be negative.
        let from = _mm256_max_epi16(at(0), _mm256_set1_epi16(0x400));
        HalfBlock {
            normal_from: from,
            normal_span: _mm256_sub_epi16(_mm256_set1_epi16(0x7C00), from),
            rebias: at(2),
        }
    }
}

/// [`Fp8::encode_f16`] of 32 f16 values (two vectors of 16) on the fast route, codes in
/// u16 lanes: `None` unless every lane is zero or a normal f16 with a normal code. The
/// magnitude's bits are rounded in place to `MBITS` mantissa bits, `(t + 2^(s-1) - 1 +
/// lsb) >> s` with `s = 10 - MBITS` (a carry rolling into the exponent), rebiased and
/// saturated, as the AVX-512 kernel's fast route does: about 18 operations per 16 values
/// where widening, rounding to odd and the bf16 steps take 32.
#[inline]
#[target_feature(enable = "avx2")]
fn encode32_f16(
    c: &Consts,
    blk: [HalfBlock; 2],
    x: [__m256i; 2],
    plus_zero: bool,
) -> Option<(__m256i, __m256i)> {
    let mag = x.map(|v| _mm256_and_si256(v, c.abs));
    let zero = mag.map(|m| _mm256_cmpeq_epi16(m, c.zero));
    // Outside `normal_from .. 0x7C00` (an unsigned compare after a wrapping
    // subtraction), zero excepted.
    let general = |i: usize| {
        let t = _mm256_sub_epi16(mag[i], blk[i].normal_from);
        let outside = _mm256_cmpeq_epi16(_mm256_max_epu16(t, blk[i].normal_span), t);
        _mm256_andnot_si256(zero[i], outside)
    };
    let any = _mm256_or_si256(general(0), general(1));
    if _mm256_testz_si256(any, any) == 0 {
        return None;
    }
    let codes = |i: usize| {
        let (m, z) = (mag[i], zero[i]);
        let lsb = _mm256_and_si256(_mm256_srl_epi16(m, c.sh), c.one);
        let q = _mm256_srl_epi16(_mm256_add_epi16(_mm256_add_epi16(m, c.round), lsb), c.sh);
        // A zero lane stays 0 (the rebias may be negative); a normal one is at least the
        // smallest normal code, so the signed minimum saturates it.
        let code = _mm256_min_epi16(
            _mm256_andnot_si256(z, _mm256_sub_epi16(q, blk[i].rebias)),
            c.max_code,
        );
        let sign = _mm256_and_si256(_mm256_srli_epi16::<8>(x[i]), c.sign);
        let code = _mm256_or_si256(code, sign);
        if plus_zero {
            // A zero input, of either sign, gives +0.
            _mm256_andnot_si256(z, code)
        } else {
            code
        }
    };
    Some((codes(0), codes(1)))
}

/// 32 f16 values (`s`, at least 32) as bf16 bits rounded to odd, in two vectors of 16:
/// each widened exactly by `vcvtph2ps`, then [`round_to_odd`].
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn widened_to_odd(s: &[u16]) -> [__m256i; 2] {
    let s = &s[..32];
    // SAFETY: `s` is 32 u16 (four unaligned 128-bit loads).
    let [a, b, d, e] =
        [0, 8, 16, 24].map(|o| _mm256_cvtph_ps(unsafe { _mm_loadu_si128(s[o..].as_ptr().cast()) }));
    [round_to_odd(a, b), round_to_odd(d, e)]
}

/// [`super::encode_blocks_f32`] at AVX2, after its checks.
///
/// # Safety
/// The CPU must have AVX2 and F16C; `src.len() == dst.len() == ks.len() * block`,
/// `block` a multiple of 32; every `k` satisfies [`Fp8::pow2_exact_f32`].
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn encode_blocks_f32(
    fp8: Fp8,
    src: &[f32],
    block: usize,
    ks: &[i32],
    plus_zero: bool,
    dst: &mut [u8],
) {
    encode_chunks(fp8, (block, ks), plus_zero, (src.len() / 32, dst), |j| {
        let s = &src[32 * j..32 * j + 32];
        // SAFETY: `s` is 32 f32 (four unaligned 256-bit loads).
        unsafe {
            [
                round_to_odd(
                    _mm256_loadu_ps(s.as_ptr()),
                    _mm256_loadu_ps(s[8..].as_ptr()),
                ),
                round_to_odd(
                    _mm256_loadu_ps(s[16..].as_ptr()),
                    _mm256_loadu_ps(s[24..].as_ptr()),
                ),
            ]
        }
    });
}

/// [`super::bf16_round_to_odd`] of 16 f32 lanes (`lo` then `hi`), as bf16 bits in order:
/// the high halves, or'ed with 1 where the low half is nonzero, packed by `vpackusdw`
/// (each at most `0xFFFF`) and put in order by `vpermq`.
#[inline]
#[target_feature(enable = "avx2")]
fn round_to_odd(lo: __m256, hi: __m256) -> __m256i {
    let odd = |v: __m256| {
        let b = _mm256_castps_si256(v);
        let low = _mm256_and_si256(b, _mm256_set1_epi32(0xFFFF));
        // 1 where the low half is nonzero (not all ones from the compare, masked to 1).
        let exact = _mm256_cmpeq_epi32(low, _mm256_setzero_si256());
        let sticky = _mm256_andnot_si256(exact, _mm256_set1_epi32(1));
        _mm256_or_si256(_mm256_srli_epi32::<16>(b), sticky)
    };
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(odd(lo), odd(hi)))
}
