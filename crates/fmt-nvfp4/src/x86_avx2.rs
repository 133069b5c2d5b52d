//! The AVX2 bodies of the NVFP4 rowwise dequantization (one 16-value block per step, as
//! two vectors of 8 lanes) and of the E2M1 encoders, rowwise and columnwise, round to
//! nearest and stochastic (two blocks, or 16 columns of two rows, per step).
//!
//! AVX2 has no 16-entry permute, so a block decodes its codes' magnitudes (the low three
//! bits) with `vpermps` from the positive half of [`e2m1::DECODE`] and puts the sign bit
//! (bit 3) in by one `xor`: `DECODE[8 + c] == -DECODE[c]`, `-0.0` included, so the value
//! is the portable `decode_fast(code)` exactly, and one multiply by the block's factor
//! is the same IEEE product. bf16 output is narrowed by
//! [`quant_core::bf16_narrow::avx2::narrow16`] (the integer rounding of
//! [`quant_core::dtype::bf16_bits`]), f16 by `vcvtps2ph` (what
//! [`quant_core::Element::narrow_slice`] uses for f16).
//!
//! Before this, the AVX2 level decoded each block into a scratch array and narrowed it
//! with the slice narrowing, per 16 values: 0.30 of the copy roofline into bf16 on Zen 4
//! with `QUANTFMT_SIMD=avx2`.
//!
//! The encoders ([`encode_run`], and [`encode_pairs_rn`] for two stored rows of a
//! columnwise group) take the same products `x * enc` as [`e2m1::encode`] and give its
//! codes, but not by its steps: [`rn_bytes`] rounds each magnitude to the E2M1 grid by
//! one float add and subtract and maps the grid value to its code by a byte table, 32
//! values per step, with the packing shared by four vectors. Before (a block per step,
//! `e2m1::encode`'s integer steps per 8 lanes, five shuffles to pack 16 codes) the
//! encode took about 55 instructions per block and, being compute-bound at AVX2, most
//! of the NVFP4 quantize; the portable loop's packing before that (a 64-bit lane
//! narrowed to a byte, one instruction at AVX-512) was a quarter of it.

use std::arch::x86_64::{
    __m128i, __m256, __m256i, _MM_FROUND_TO_NEAREST_INT, _mm_cvtsi32_si128, _mm_loadl_epi64,
    _mm_loadu_si128, _mm_srli_si128, _mm_storel_epi64, _mm_storeu_si128, _mm_unpacklo_epi8,
    _mm_unpacklo_epi16, _mm256_add_epi32, _mm256_add_ps, _mm256_and_si256, _mm256_castps_si256,
    _mm256_castsi256_ps, _mm256_castsi256_si128, _mm256_cmpgt_epi32, _mm256_cvtepi32_ps,
    _mm256_cvtepu8_epi32, _mm256_cvtepu16_epi32, _mm256_cvtph_ps, _mm256_cvtps_ph,
    _mm256_extracti128_si256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_loadu_si256,
    _mm256_maddubs_epi16, _mm256_max_ps, _mm256_min_epu8, _mm256_min_ps, _mm256_mul_ps,
    _mm256_or_si256, _mm256_packs_epi16, _mm256_packs_epi32, _mm256_packus_epi16,
    _mm256_packus_epi32, _mm256_permutevar8x32_epi32, _mm256_permutevar8x32_ps, _mm256_set_m128i,
    _mm256_set1_epi8, _mm256_set1_epi16, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi8,
    _mm256_setr_epi32, _mm256_shuffle_epi8, _mm256_slli_epi16, _mm256_slli_epi32, _mm256_srl_epi32,
    _mm256_srli_epi32, _mm256_srli_si256, _mm256_srlv_epi32, _mm256_storeu_ps, _mm256_storeu_si256,
    _mm256_sub_ps, _mm256_subs_epu16, _mm256_xor_ps,
};

use quant_core::Element;
use quant_core::bf16_narrow::avx2::{narrow16, narrow16_no_nan, narrow16_pairs};
use quant_core::codec::e2m1;
use quant_core::dtype::FloatsMut;
use quant_core::simd::Level;
use quant_core::stream::StoreMode;
use quant_core::stream::avx2::{write_f32_steps, write_u16_steps};

use crate::scale::BLOCK;
use crate::x86::{Nibble, nibble_one};
use crate::x86_encode::Run;

/// [`crate::x86::decode_row`] at AVX2: `out[16b + i] = T(e2m1(code) * factor(b))` for
/// the row's `out.len() / 16` blocks. Returns `false` (nothing written) unless the CPU
/// has AVX2, `T` is a float type and the lengths fit (whole blocks, two outputs per
/// byte); the caller then runs the portable loop.
#[inline(always)]
pub(crate) fn decode_row<T: Element>(
    codes: &[u8],
    factor: impl Fn(usize) -> f32,
    out: &mut [T],
) -> bool {
    if !Level::Avx2.is_supported()
        || !out.len().is_multiple_of(BLOCK)
        || codes.len() * 2 != out.len()
    {
        return false;
    }
    match FloatsMut::of(out) {
        // SAFETY: the CPU has AVX2 (checked above).
        Some(FloatsMut::F32(o)) => unsafe { decode_row_f32(codes, factor, o) },
        // SAFETY: as above.
        Some(FloatsMut::Bf16(o)) => unsafe { decode_row_bf16(codes, factor, o) },
        // SAFETY: as above (`Level::Avx2` includes F16C).
        Some(FloatsMut::F16(o)) => unsafe { decode_row_f16(codes, factor, o) },
        None => return false,
    }
    true
}

/// A block's 16 values as f32 (values 0..8, then 8..16): codes from its 8 bytes.
#[inline]
#[target_feature(enable = "avx2")]
fn block_values(bytes: &[u8], table: __m256, f: f32) -> (__m256, __m256) {
    let bytes = &bytes[..BLOCK / 2];
    // SAFETY: `bytes` is 8 bytes (one unaligned 64-bit load).
    let b = unsafe { _mm_loadl_epi64(bytes.as_ptr().cast()) };
    // Each byte twice, so that lane `i` can take nibble `i % 2` of byte `i / 2`.
    let d = _mm_unpacklo_epi8(b, b);
    let shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    let f = _mm256_set1_ps(f);
    let value = |lanes| _mm256_mul_ps(f, e2m1_8(table, _mm256_srlv_epi32(lanes, shift)));
    (
        value(_mm256_cvtepu8_epi32(d)),
        value(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(d))),
    )
}

/// The E2M1 values of 8 codes (the low four bits of each u32 lane; higher bits are
/// ignored) from `table`, the positive half of [`e2m1::DECODE`] in a register: the
/// magnitude by `vpermps` (which reads the low three bits), the sign bit (bit 3) put in
/// by one `xor`. `DECODE[8 + c] == -DECODE[c]`, `-0.0` included, so each lane is the
/// portable `decode_fast(code)`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn e2m1_8(table: __m256, codes: __m256i) -> __m256 {
    let mag = _mm256_permutevar8x32_ps(table, codes);
    let sign = _mm256_and_si256(_mm256_slli_epi32::<28>(codes), _mm256_set1_epi32(i32::MIN));
    _mm256_xor_ps(mag, _mm256_castsi256_ps(sign))
}

/// 8 bf16 bit patterns widened exactly into f32 lanes (a shift into the high half).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn widen_bf16(h: __m128i) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

/// Calls `store(b, lo, hi)` for every block `b` of `codes` (8 bytes each).
#[inline]
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn for_each_block(
    codes: &[u8],
    factor: impl Fn(usize) -> f32,
    mut store: impl FnMut(usize, __m256, __m256),
) {
    // SAFETY: `DECODE` is 16 f32; its first 8 are one unaligned 256-bit load.
    let table = unsafe { _mm256_loadu_ps(e2m1::DECODE.as_ptr()) };
    for (b, c) in codes.chunks_exact(BLOCK / 2).enumerate() {
        let (lo, hi) = block_values(c, table, factor(b));
        store(b, lo, hi);
    }
}

/// [`decode_row`] into f32. The row functions and [`for_each_block`] carry all of the
/// AVX2 level's features: `factor` is a closure of the dispatched caller, which a
/// function with fewer features could not inline.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn decode_row_f32(codes: &[u8], factor: impl Fn(usize) -> f32, out: &mut [f32]) {
    for_each_block(codes, factor, |b, lo, hi| {
        let o = &mut out[b * BLOCK..(b + 1) * BLOCK];
        // SAFETY: `o` is 16 f32 (two unaligned 256-bit stores).
        unsafe {
            _mm256_storeu_ps(o.as_mut_ptr(), lo);
            _mm256_storeu_ps(o[8..].as_mut_ptr(), hi);
        }
    });
}

/// [`decode_row`] into bf16 bits. Each byte's two values stay in one 32-bit lane pair:
/// the low nibbles (values 0, 2, ..) in one vector, the high nibbles in the other, and
/// [`narrow16_pairs`] writes each lane's pair in order, with no pack or permute and,
/// under a finite factor (no product is NaN: the E2M1 values are finite), no NaN
/// select: 10 operations of rounding per block where [`narrow16`] takes 22 (in process,
/// 8192^2 on two Zen 4 cores: 12.1-13.9 -> 7.2-9.6 ms, plain, 2-D and SR, over the
/// ordered halves and `narrow16`).
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn decode_row_bf16(codes: &[u8], factor: impl Fn(usize) -> f32, out: &mut [u16]) {
    // SAFETY: `DECODE` is 16 f32; its first 8 are one unaligned 256-bit load.
    let table = unsafe { _mm256_loadu_ps(e2m1::DECODE.as_ptr()) };
    for (b, (c, o)) in codes
        .chunks_exact(BLOCK / 2)
        .zip(out.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        let c = &c[..BLOCK / 2];
        // SAFETY: `c` is 8 bytes (one unaligned 64-bit load).
        let w = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(c.as_ptr().cast()) });
        let f = factor(b);
        let fv = _mm256_set1_ps(f);
        // `e2m1_8` reads the low four bits of each lane: the low nibble as it is, the
        // high one shifted down.
        let even = _mm256_mul_ps(fv, e2m1_8(table, w));
        let odd = _mm256_mul_ps(fv, e2m1_8(table, _mm256_srli_epi32::<4>(w)));
        let v = narrow16_pairs(even, odd, f.is_finite());
        // SAFETY: `o` is 16 u16 (one unaligned 256-bit store).
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), v) };
    }
}

/// [`decode_row`] into f16 bits, rounded to nearest even by `vcvtps2ph`.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn decode_row_f16(codes: &[u8], factor: impl Fn(usize) -> f32, out: &mut [u16]) {
    for_each_block(codes, factor, |b, lo, hi| {
        let o = &mut out[b * BLOCK..(b + 1) * BLOCK];
        // SAFETY: `o` is 16 u16 (two unaligned 128-bit stores).
        unsafe {
            _mm_storeu_si128(
                o.as_mut_ptr().cast(),
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(lo),
            );
            _mm_storeu_si128(
                o[8..].as_mut_ptr().cast(),
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(hi),
            );
        }
    });
}

/// [`crate::x86::decode_nibbles`] at AVX2: one output row's run of a columnwise
/// decode, `out[c] = T(e2m1(code) * f[c])` with `code` the `nibble` of `codes[c]`,
/// computed 8 (f32) or 16 (bf16, f16) columns per step in registers and written by
/// [`quant_core::stream::avx2`]'s step writers in `mode` (the fence left to the
/// caller's [`quant_core::stream::Fence`]). The values are the portable
/// `decode_fast(code) * f` narrowed as [`decode_row`] narrows them.
///
/// Before this, the AVX2 level decoded a group's 16 rows into a scratch and streamed
/// each row from there ([`quant_core::stream::write_f32`]): two passes, the products
/// stored and reloaded. Returns `false` (nothing written) unless the CPU has AVX2, `T`
/// is a float type and the three lengths agree; the caller then runs the two passes.
#[inline(always)]
pub(crate) fn decode_nibbles<T: Element>(
    codes: &[u8],
    nibble: Nibble,
    f: &[f32],
    out: &mut [T],
    mode: StoreMode,
) -> bool {
    if !Level::Avx2.is_supported() || codes.len() != out.len() || f.len() != out.len() {
        return false;
    }
    match FloatsMut::of(out) {
        // SAFETY: the CPU has the AVX2 level's features (checked above).
        Some(FloatsMut::F32(o)) => unsafe { nibbles_f32(codes, nibble, f, o, mode) },
        // SAFETY: as above.
        Some(FloatsMut::Bf16(o)) => unsafe { nibbles_bf16(codes, nibble, f, o, mode) },
        // SAFETY: as above (`Level::Avx2` includes F16C).
        Some(FloatsMut::F16(o)) => unsafe { nibbles_f16(codes, nibble, f, o, mode) },
        None => return false,
    }
    true
}

/// 8 values of [`decode_nibbles`] from column `c` on: codes zero-extended to u32 lanes
/// (shifted down for the high nibble; [`e2m1_8`] ignores the bits above the code),
/// decoded and scaled by the columns' factors.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles8(codes: &[u8], nibble: Nibble, f: &[f32], c: usize, table: __m256) -> __m256 {
    let (b, f) = (&codes[c..c + 8], &f[c..c + 8]);
    // SAFETY: `b` is 8 bytes and `f` 8 f32 (one unaligned 64- and 256-bit load).
    let (b, f) = unsafe {
        (
            _mm_loadl_epi64(b.as_ptr().cast()),
            _mm256_loadu_ps(f.as_ptr()),
        )
    };
    let lanes = _mm256_cvtepu8_epi32(b);
    let codes = match nibble {
        Nibble::Low => lanes,
        Nibble::High => _mm256_srli_epi32::<4>(lanes),
    };
    _mm256_mul_ps(f, e2m1_8(table, codes))
}

/// The positive half of [`e2m1::DECODE`] in a register, for [`e2m1_8`].
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn decode_table() -> __m256 {
    // SAFETY: `DECODE` is 16 f32; its first 8 are one unaligned 256-bit load.
    unsafe { _mm256_loadu_ps(e2m1::DECODE.as_ptr()) }
}

/// [`decode_nibbles`] into f32.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn nibbles_f32(codes: &[u8], nibble: Nibble, f: &[f32], out: &mut [f32], mode: StoreMode) {
    let table = decode_table();
    write_f32_steps(
        out,
        mode,
        |c| nibbles8(codes, nibble, f, c, table),
        |c| nibble_one(codes, nibble, f, c),
    );
}

/// [`decode_nibbles`] into bf16 bits ([`narrow16`]; the ends by
/// [`quant_core::dtype::bf16_bits`], the same rounding).
///
/// Where every factor of the run is finite no product is NaN (the E2M1 values are
/// finite), so the steps narrow without the NaN select ([`narrow16_no_nan`]): 12
/// operations of rounding per 16 values where [`narrow16`] takes 22 (in process,
/// 8192^2 into bf16 on two Zen 4 cores, 3 A/B pairs: x1.07-1.12).
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn nibbles_bf16(codes: &[u8], nibble: Nibble, f: &[f32], out: &mut [u16], mode: StoreMode) {
    let table = decode_table();
    let eight = |c| nibbles8(codes, nibble, f, c, table);
    let one = |c| quant_core::dtype::bf16_bits(nibble_one(codes, nibble, f, c));
    if all_finite(f) {
        write_u16_steps(out, mode, |c| narrow16_no_nan(eight(c), eight(c + 8)), one);
    } else {
        write_u16_steps(out, mode, |c| narrow16(eight(c), eight(c + 8)), one);
    }
}

/// Whether every value of `f` is finite: a fold without an early exit, so that it
/// vectorizes (`Iterator::all` stopped at each value and, per 256-value run, made the
/// columnwise decode into bf16 x0.53 slower than without the check).
#[inline]
fn all_finite(f: &[f32]) -> bool {
    f.iter()
        .fold(0u32, |any, x| any | u32::from(!x.is_finite()))
        == 0
}

/// [`decode_nibbles`] into f16 bits, rounded to nearest even by `vcvtps2ph` (the ends by
/// `half`'s conversion, the same rounding).
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn nibbles_f16(codes: &[u8], nibble: Nibble, f: &[f32], out: &mut [u16], mode: StoreMode) {
    let table = decode_table();
    let half =
        |c| _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(nibbles8(codes, nibble, f, c, table));
    write_u16_steps(
        out,
        mode,
        |c| _mm256_set_m128i(half(c + 8), half(c)),
        |c| half::f16::from_f32(nibble_one(codes, nibble, f, c)).to_bits(),
    );
}

/// Encodes whole blocks at AVX2, as [`crate::x86_encode::encode_run`] does at AVX-512:
/// `out[8b + j]` packs the E2M1 codes of `x[16b + 2j] * enc[b]` (low nibble) and
/// `x[16b + 2j + 1] * enc[b]`, the values of a bf16 or f16 run widened exactly in the
/// register; round to nearest ([`e2m1::encode`]), or with `rnd` stochastic, value `e`
/// of block `b` taking the random byte `rnd[b][e]` (the portable `sr_code`, TE's rule
/// [`crate::sr::stochastic_round_e2m1`]). Returns `false` (nothing written) unless the
/// CPU has AVX2, `x` holds `enc.len()` blocks, `out` half as many bytes and `rnd` (if
/// any) a row per block; the caller then runs the portable loop.
///
/// `ahead` (any bytes, usually the caller's next run; may be empty) is prefetched a
/// share per four blocks: the encode reads only `x`, which its caller's block maxima
/// just brought into L1, so without it the memory would sit idle through the encode.
#[inline(always)]
pub(crate) fn encode_run(
    x: Run<'_>,
    enc: &[f32],
    rnd: Option<&[[u8; BLOCK]]>,
    out: &mut [u8],
    ahead: &[u8],
) -> bool {
    if !Level::Avx2.is_supported() || !x.fits(enc, rnd, out) {
        return false;
    }
    match x {
        // SAFETY: the CPU has AVX2 (checked above, with F16C and FMA in the level).
        Run::F32(w) => unsafe { encode_f32(w, enc, rnd, out, ahead) },
        // SAFETY: as above.
        Run::Bf16(w) => unsafe { encode_bf16(w, enc, rnd, out, ahead) },
        // SAFETY: as above.
        Run::F16(w) => unsafe { encode_f16(w, enc, rnd, out, ahead) },
    }
    true
}

/// [`encode_run`] rounding to nearest (as the tests name the modes).
#[cfg(test)]
fn encode_run_rn(x: Run<'_>, enc: &[f32], out: &mut [u8]) -> bool {
    encode_run(x, enc, None, out, &[])
}

/// [`encode_run`] under stochastic rounding.
#[cfg(test)]
fn encode_run_sr(x: Run<'_>, enc: &[f32], rnd: &[[u8; BLOCK]], out: &mut [u8]) -> bool {
    encode_run(x, enc, Some(rnd), out, &[])
}

/// [`encode_run`] of f32 values.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn encode_f32(w: &[f32], enc: &[f32], rnd: Option<&[[u8; BLOCK]]>, out: &mut [u8], ahead: &[u8]) {
    let load = |b: usize| {
        let v = &w[b * BLOCK..(b + 1) * BLOCK];
        // SAFETY: `v` is 16 f32 (two unaligned 256-bit loads).
        unsafe {
            (
                _mm256_loadu_ps(v.as_ptr()),
                _mm256_loadu_ps(v[8..].as_ptr()),
            )
        }
    };
    encode_blocks(load, enc, rnd, out, ahead);
}

/// [`encode_run`] of bf16 bits, widened exactly (a shift into the high half).
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn encode_bf16(w: &[u16], enc: &[f32], rnd: Option<&[[u8; BLOCK]]>, out: &mut [u8], ahead: &[u8]) {
    let widen = |h| widen_bf16(h);
    let load = |b: usize| {
        let v = &w[b * BLOCK..(b + 1) * BLOCK];
        (load8_bits(v, 0, widen), load8_bits(v, 8, widen))
    };
    encode_blocks(load, enc, rnd, out, ahead);
}

/// [`encode_run`] of f16 bits, widened exactly by `vcvtph2ps`.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn encode_f16(w: &[u16], enc: &[f32], rnd: Option<&[[u8; BLOCK]]>, out: &mut [u8], ahead: &[u8]) {
    let widen = |h| _mm256_cvtph_ps(h);
    let load = |b: usize| {
        let v = &w[b * BLOCK..(b + 1) * BLOCK];
        (load8_bits(v, 0, widen), load8_bits(v, 8, widen))
    };
    encode_blocks(load, enc, rnd, out, ahead);
}

/// The block loop of the encoders, two blocks per step: block `b`'s 16 values
/// (`load(b)`: values 0..8, then 8..16) times `enc[b]`, encoded by [`rn_bytes`] or,
/// with `rnd`, by [`sr_bytes`] with the block's random bytes, then packed two codes per
/// byte by [`nibbles`], 16 bytes per store (8 for an odd last block). Every other step
/// also prefetches its share of `ahead`.
///
/// A block per step, with the codes in 32-bit lanes packed per block (`pack16`, five
/// shuffles per 16 codes) and the sign and NaN rule applied per 8 lanes, took about 55
/// instructions per block, and the encode is compute-bound at AVX2: the packing and the
/// per-lane steps were half of them.
#[inline]
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn encode_blocks(
    load: impl Fn(usize) -> (__m256, __m256),
    enc: &[f32],
    rnd: Option<&[[u8; BLOCK]]>,
    out: &mut [u8],
    ahead: &[u8],
) {
    let nb = enc.len();
    let per = ahead.len().checked_div(nb).unwrap_or(0);
    let scaled = |b: usize| {
        let e = _mm256_set1_ps(enc[b]);
        let (lo, hi) = load(b);
        (_mm256_mul_ps(lo, e), _mm256_mul_ps(hi, e))
    };
    // A block's random bytes as two vectors of u32 lanes (values 0..8, then 8..16).
    let random = |row: &[u8; BLOCK]| {
        // SAFETY: `row` is 16 bytes (one unaligned 128-bit load).
        let r = unsafe { _mm_loadu_si128(row.as_ptr().cast()) };
        (
            _mm256_cvtepu8_epi32(r),
            _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(r)),
        )
    };
    for b in (0..nb).step_by(2) {
        if b % 4 == 0 {
            quant_core::simd::prefetch(ahead.get(b * per..(b + 4) * per).unwrap_or(&[]));
        }
        // An odd last block is encoded twice; only its own 8 bytes are stored.
        let b1 = (b + 1).min(nb - 1);
        let ((p0, p1), (p2, p3)) = (scaled(b), scaled(b1));
        let bytes = match rnd {
            None => rn_bytes([p0, p1, p2, p3]),
            Some(rnd) => {
                let ((r0, r1), (r2, r3)) = (random(&rnd[b]), random(&rnd[b1]));
                sr_bytes([p0, p1, p2, p3], [r0, r1, r2, r3])
            }
        };
        let packed = nibbles(bytes);
        let o = &mut out[b * BLOCK / 2..(b1 + 1) * BLOCK / 2];
        if b1 > b {
            // SAFETY: `o` is 16 bytes (two blocks; one unaligned 128-bit store).
            unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), packed) };
        } else {
            // SAFETY: `o` is 8 bytes (one block; one unaligned 64-bit store).
            unsafe { _mm_storel_epi64(o.as_mut_ptr().cast(), packed) };
        }
    }
}

/// The E2M1 codes ([`e2m1::encode`]) of 32 values (`p[0]` values 0..8, ..., `p[3]`
/// values 24..32), as bytes in [`grid_bytes`]' order.
///
/// A magnitude `a` (at most 6: larger values and NaN, by `vminps`'s NaN rule, become 6,
/// code 7, and a NaN keeps no sign) is rounded to the E2M1 grid by one float add and
/// subtract of `2^(e + 22)`, `e` its exponent but at least 0 (the subnormal step 0.5
/// below 1): the sum's ulp is the grid step of `a`'s binade, so the add rounds `a` to
/// the grid, ties to even as the codec. [`grid_bytes`] maps the grid value to its code.
/// Checked against [`e2m1::encode_reference`] on 8.4M patterns in the tests (and, as
/// scalar code, on all 2^32 while it was written).
#[inline]
#[target_feature(enable = "avx2")]
fn rn_bytes(p: [__m256; 4]) -> __m256i {
    let grid8 = |v: __m256| {
        let a = magnitude(v);
        let a = _mm256_min_ps(a, _mm256_set1_ps(6.0));
        let e = _mm256_castps_si256(_mm256_max_ps(a, _mm256_set1_ps(1.0)));
        let e = _mm256_and_si256(e, _mm256_set1_epi32(0x7F80_0000));
        let magic = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(22 << 23)));
        _mm256_sub_ps(_mm256_add_ps(a, magic), magic)
    };
    grid_bytes(p.map(grid8), p)
}

/// The engine's `sr_code` of 32 values `p` (as in [`rn_bytes`]) and their random bytes
/// `r` (u32 lanes below 256, in the same order), as bytes in [`grid_bytes`]' order.
///
/// `t = |v| + r * jitter`, the jitter `step / 256` of `|v|`'s interval (`0.5 / 256`
/// below 2, `1 / 256` below 4, `2 / 256` above): `2^e * (0.5 / 256)` for `|v|`'s
/// exponent `e` clamped to 0..=2 (`vmaxps` with 1 gives 1 for a NaN), and `r * jitter`
/// is exact, so one FMA rounds as the engine's add does. [`grid_bytes`] then takes `t`
/// down to the grid, as `sr_code`'s `(bits(t) >> 22) - 252` with its floor at
/// `t >= 0.5` and its saturation at 7 do; a NaN `v` gives a NaN `t`, code 7 with no
/// sign. Checked against `sr_code` on 300M (value, byte) pairs and on all 2^32 values
/// with the bytes 0, 129 and 255 while it was written, and in the tests on 4.2M patterns
/// and the SR bucket edges.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn sr_bytes(p: [__m256; 4], r: [__m256i; 4]) -> __m256i {
    let t8 = |(v, r): (__m256, __m256i)| {
        let a = magnitude(v);
        let e = _mm256_min_ps(_mm256_max_ps(a, _mm256_set1_ps(1.0)), _mm256_set1_ps(4.0));
        let e = _mm256_and_si256(_mm256_castps_si256(e), _mm256_set1_epi32(0x7F80_0000));
        let jitter = _mm256_mul_ps(_mm256_castsi256_ps(e), _mm256_set1_ps(0.5 / 256.0));
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(r), jitter, a)
    };
    let t = [(p[0], r[0]), (p[1], r[1]), (p[2], r[2]), (p[3], r[3])].map(t8);
    grid_bytes(t, p)
}

/// `|v|` lane by lane (the sign bit cleared; a NaN stays NaN).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn magnitude(v: __m256) -> __m256 {
    let bits = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFF_FFFF));
    _mm256_castsi256_ps(bits)
}

/// The codes of 32 nonnegative values `t` (or NaN), each taken down to the E2M1 grid
/// (exact for grid values, as [`rn_bytes`] gives them), with the sign of its value in
/// `v`, as bytes: `vpackusdw` and `vpackuswb` work within 128-bit halves, so half 0
/// holds values 0..4, 8..12, 16..20, 24..28 (`t[0]`: values 0..8, ..., `t[3]`: 24..32)
/// and half 1 the other four of each eight.
///
/// `bits(t) >> 22` is `t`'s exponent and first mantissa bit: less 244 and clamped to
/// 0..=15, it is 8 + 0..8 for `t` in `[0.5, 8)` (0.5 and 0.75 give 8 and 9, then one
/// index per grid interval from 1), below 8 for smaller `t` and 15 from 6 up (infinity
/// and NaN included); one byte shuffle maps it to the code. The sign is a signed
/// compare: bits below `-inf`'s are negative numbers, `-0` included, and not NaN.
#[inline]
#[target_feature(enable = "avx2")]
fn grid_bytes(t: [__m256; 4], v: [__m256; 4]) -> __m256i {
    let index = |t: __m256| _mm256_srli_epi32::<22>(_mm256_castps_si256(t));
    let less = |w: __m256i| _mm256_subs_epu16(w, _mm256_set1_epi16(244));
    let index = _mm256_packus_epi16(
        less(_mm256_packus_epi32(index(t[0]), index(t[1]))),
        less(_mm256_packus_epi32(index(t[2]), index(t[3]))),
    );
    let index = _mm256_min_epu8(index, _mm256_set1_epi8(15));
    let table = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, //
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7,
    );
    let codes = _mm256_shuffle_epi8(table, index);
    let negative =
        |v: __m256| _mm256_cmpgt_epi32(_mm256_set1_epi32(-0x7F_FFFF), _mm256_castps_si256(v));
    let negative = _mm256_packs_epi16(
        _mm256_packs_epi32(negative(v[0]), negative(v[1])),
        _mm256_packs_epi32(negative(v[2]), negative(v[3])),
    );
    _mm256_or_si256(codes, _mm256_and_si256(negative, _mm256_set1_epi8(0x8)))
}

/// The 32 code bytes of [`grid_bytes`]' order packed two per byte, in value order:
/// value `2j` in the low nibble of byte `j`. `vpmaddubsw` joins each even/odd pair (odd
/// times 16, plus even) into a 16-bit lane, `vpackuswb` narrows them, and the two halves'
/// 2-byte groups (values 4q..4q + 4 in half 0, the next four in half 1) interleave.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles(bytes: __m256i) -> __m128i {
    let pairs = _mm256_maddubs_epi16(bytes, _mm256_set1_epi16(0x1001));
    let p = _mm256_packus_epi16(pairs, pairs);
    _mm_unpacklo_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p))
}

/// [`crate::x86_encode::encode_pairs_rn`] at AVX2: two stored rows of a columnwise
/// group at once, byte `c` holding the codes of `lo[c] * enc[c]` (low nibble) and
/// `hi[c] * enc[c]` (high nibble), the bytes of the portable encode-then-pack of two
/// neighbouring rows. Returns `false` (nothing written) unless the CPU has AVX2, both
/// rows are the same kind and every length equals `enc.len()`, a multiple of 16.
#[inline(always)]
pub(crate) fn encode_pairs_rn(lo: Run<'_>, hi: Run<'_>, enc: &[f32], out: &mut [u8]) -> bool {
    encode_pairs(lo, hi, enc, None, out)
}

/// [`encode_pairs_rn`] under stochastic rounding ([`crate::x86_encode::encode_pairs_sr`]
/// at AVX2): column `c`'s random bytes are bytes `shift / 8` (for `lo`) and `shift / 8 +
/// 1` (for `hi`) of `words[c]`. Also `false` unless `words.len() == enc.len()` and
/// `shift` is 0 or 16.
#[inline(always)]
pub(crate) fn encode_pairs_sr(
    lo: Run<'_>,
    hi: Run<'_>,
    enc: &[f32],
    words: &[u32],
    shift: u32,
    out: &mut [u8],
) -> bool {
    if words.len() != enc.len() || !matches!(shift, 0 | 16) {
        return false;
    }
    encode_pairs(lo, hi, enc, Some((words, shift)), out)
}

/// [`encode_pairs_rn`] (`sr` `None`) or [`encode_pairs_sr`] after their own checks.
#[inline(always)]
fn encode_pairs(
    lo: Run<'_>,
    hi: Run<'_>,
    enc: &[f32],
    sr: Option<(&[u32], u32)>,
    out: &mut [u8],
) -> bool {
    let n = enc.len();
    if !Level::Avx2.is_supported()
        || lo.len() != n
        || hi.len() != n
        || out.len() != n
        || !n.is_multiple_of(BLOCK)
    {
        return false;
    }
    match (lo, hi) {
        // SAFETY: the CPU has AVX2 (checked above, with F16C and FMA in the level).
        (Run::F32(a), Run::F32(b)) => unsafe { pairs_f32(a, b, enc, sr, out) },
        // SAFETY: as above.
        (Run::Bf16(a), Run::Bf16(b)) => unsafe { pairs_bf16(a, b, enc, sr, out) },
        // SAFETY: as above.
        (Run::F16(a), Run::F16(b)) => unsafe { pairs_f16(a, b, enc, sr, out) },
        _ => return false,
    }
    true
}

/// The 8 values of `row` from `c`, widened by `widen` from 16-bit patterns.
#[inline]
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn load8_bits(row: &[u16], c: usize, widen: impl Fn(__m128i) -> __m256) -> __m256 {
    let v = &row[c..c + 8];
    // SAFETY: `v` is 8 u16 (one unaligned 128-bit load).
    widen(unsafe { _mm_loadu_si128(v.as_ptr().cast()) })
}

/// [`encode_pairs`] of f32 rows after its checks.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn pairs_f32(a: &[f32], b: &[f32], enc: &[f32], sr: Option<(&[u32], u32)>, out: &mut [u8]) {
    let load = |row: &[f32], c: usize| {
        let v = &row[c..c + 8];
        // SAFETY: `v` is 8 f32 (one unaligned 256-bit load).
        unsafe { _mm256_loadu_ps(v.as_ptr()) }
    };
    pairs(|c| (load(a, c), load(b, c)), enc, sr, out);
}

/// [`encode_pairs`] of bf16 rows (bits, widened exactly in the register).
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn pairs_bf16(a: &[u16], b: &[u16], enc: &[f32], sr: Option<(&[u32], u32)>, out: &mut [u8]) {
    let widen = |h| widen_bf16(h);
    pairs(
        |c| (load8_bits(a, c, widen), load8_bits(b, c, widen)),
        enc,
        sr,
        out,
    );
}

/// [`encode_pairs`] of f16 rows (bits, widened exactly by `vcvtph2ps`).
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn pairs_f16(a: &[u16], b: &[u16], enc: &[f32], sr: Option<(&[u32], u32)>, out: &mut [u8]) {
    let widen = |h| _mm256_cvtph_ps(h);
    pairs(
        |c| (load8_bits(a, c, widen), load8_bits(b, c, widen)),
        enc,
        sr,
        out,
    );
}

/// The column loop of the pair encoders, 16 columns per step: `load(c)` gives columns
/// `c..c + 8` of both rows; each value times its column's `enc`, encoded by
/// [`rn_bytes`] (round to nearest) or by [`sr_bytes`] with the random byte of its row
/// from the column's word, the two codes of a column joined into one byte.
#[inline]
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn pairs(
    load: impl Fn(usize) -> (__m256, __m256),
    enc: &[f32],
    sr: Option<(&[u32], u32)>,
    out: &mut [u8],
) {
    let scaled = |c: usize| {
        let (x, y) = load(c);
        let e = &enc[c..c + 8];
        // SAFETY: `e` is 8 f32 (one unaligned 256-bit load).
        let e = unsafe { _mm256_loadu_ps(e.as_ptr()) };
        (_mm256_mul_ps(x, e), _mm256_mul_ps(y, e))
    };
    // Columns `c..c + 8`'s random bytes of the two rows: bytes `shift / 8` and
    // `shift / 8 + 1` of each column's word.
    let random = |c: usize, (words, shift): (&[u32], u32)| {
        let w = &words[c..c + 8];
        // SAFETY: `w` is 8 u32 (one unaligned 256-bit load).
        let w = unsafe { _mm256_loadu_si256(w.as_ptr().cast()) };
        let byte = |s: u32| {
            let count = _mm_cvtsi32_si128(s as i32);
            _mm256_and_si256(_mm256_srl_epi32(w, count), _mm256_set1_epi32(0xFF))
        };
        (byte(shift), byte(shift + 8))
    };
    for (c, o) in (0..enc.len()).step_by(16).zip(out.chunks_exact_mut(16)) {
        // In `grid_bytes`' order each half holds 4 columns of the first 8, 4 of the
        // next 8, then the same 8 columns of the second row.
        let ((x0, y0), (x1, y1)) = (scaled(c), scaled(c + 8));
        let p = [x0, x1, y0, y1];
        let bytes = match sr {
            None => rn_bytes(p),
            Some(sr) => {
                let ((rx0, ry0), (rx1, ry1)) = (random(c, sr), random(c + 8, sr));
                sr_bytes(p, [rx0, rx1, ry0, ry1])
            }
        };
        // The second row's code of each column into the high nibble of the first's
        // byte (`vpsllw` by 4 keeps each code, below 16, in its byte), then the
        // 4-column groups in order: half 0 has columns 0..4 and 8..12, half 1 4..8 and
        // 12..16.
        let high = _mm256_slli_epi16::<4>(_mm256_srli_si256::<8>(bytes));
        let b = _mm256_or_si256(bytes, high);
        let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
        // SAFETY: `o` is 16 bytes (a `chunks_exact_mut(16)` chunk; one unaligned 128-bit
        // store).
        unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), _mm256_castsi256_si128(b)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_nibbles_equals_the_portable_product() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        struct Avx2;
        impl crate::x86::nibbles_check::Decoder for Avx2 {
            fn decode<T: Element>(
                &self,
                codes: &[u8],
                nibble: Nibble,
                f: &[f32],
                out: &mut [T],
                mode: StoreMode,
            ) -> bool {
                decode_nibbles(codes, nibble, f, out, mode)
            }
        }
        crate::x86::nibbles_check::assert_portable(&Avx2);
    }

    /// Every byte in every position of a block, under factors that include zero, a
    /// subnormal product, overflow to infinity, infinity and NaN (NaNs whose low payload
    /// bits would round up, were they narrowed as numbers): the bits of the portable
    /// decode and narrowing, into each output type.
    #[test]
    fn every_code_decodes_as_the_portable_loop() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let codes: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        let factors = [
            1.0,
            0.0,
            -0.0,
            1.0e-45,
            3.5e-39,
            f32::MAX,
            1.0e5,
            f32::NAN,
            0.3,
            f32::INFINITY,
            f32::from_bits(0x7FC0_8001),
            f32::from_bits(0xFFC1_FFFF),
        ];
        let blocks = codes.len() / (BLOCK / 2);
        let factor = |b: usize| factors[b % factors.len()];
        let want: Vec<f32> = codes
            .iter()
            .enumerate()
            .flat_map(|(i, &byte)| {
                let (lo, hi) = e2m1::unpack(byte);
                let f = factor(i / (BLOCK / 2));
                [e2m1::decode_fast(lo) * f, e2m1::decode_fast(hi) * f]
            })
            .collect();
        let mut f = vec![0f32; blocks * BLOCK];
        assert!(decode_row(&codes, factor, &mut f));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&f), bits(&want));
        let mut b = vec![half::bf16::ZERO; blocks * BLOCK];
        assert!(decode_row(&codes, factor, &mut b));
        for (g, w) in b.iter().zip(&want) {
            assert_eq!(g.to_bits(), quant_core::dtype::bf16_bits(*w), "{w}");
        }
        let mut h = vec![half::f16::ZERO; blocks * BLOCK];
        assert!(decode_row(&codes, factor, &mut h));
        for (g, w) in h.iter().zip(&want) {
            assert_eq!(g.to_bits(), half::f16::from_f32(*w).to_bits(), "{w}");
        }
        // Lengths that do not fit are declined.
        assert!(!decode_row(&codes[..4], factor, &mut [0f32; 16]));
        assert!(!decode_row(&codes[..8], factor, &mut [0f32; 8]));
    }

    /// Every E2M1 rounding decision (each grid value, the midpoints and their
    /// neighbours, both signs), zeros, subnormals, infinities, NaN and random values, in
    /// whole blocks, and a block factor per block (zero among them).
    fn encoder_input() -> (Vec<f32>, Vec<f32>) {
        let mut xs: Vec<f32> = Vec::new();
        for g in [
            0.0f32, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0,
        ] {
            for d in [-1i32, 0, 1] {
                let v = f32::from_bits((g.to_bits() as i32 + d).max(0) as u32);
                xs.extend([v, -v]);
            }
        }
        xs.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            1.0e-45,
            -0.0,
        ]);
        xs.extend([f32::MAX, 1.0e30, 0.2, 0.3, 0.7, 0.8]);
        let mut rng = quantfmt_testkit::XorShift32::new(17);
        while !xs.len().is_multiple_of(BLOCK) || xs.len() < 40 * BLOCK {
            xs.push(f32::from_bits(rng.next_u32()));
        }
        let factors = [1.0f32, 0.5, 3.0, 1.0e-3, 0.0];
        let enc: Vec<f32> = (0..xs.len() / BLOCK)
            .map(|b| factors[b % factors.len()])
            .collect();
        (xs, enc)
    }

    /// `xs` as each run kind the encoders take, with the values the run widens to:
    /// f32 as given, and bf16 and f16 bits of `xs` rounded (so that every special
    /// value and rounding edge also occurs in 16-bit input).
    fn each_kind(xs: &[f32], mut check: impl FnMut(&str, Run<'_>, &[f32])) {
        check("f32", Run::F32(xs), xs);
        let bf16: Vec<u16> = xs
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect();
        let wide: Vec<f32> = bf16
            .iter()
            .map(|&h| quant_core::dtype::f32_from_bf16_bits(h))
            .collect();
        check("bf16", Run::Bf16(&bf16), &wide);
        let f16: Vec<u16> = xs
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        let wide: Vec<f32> = f16
            .iter()
            .map(|&h| half::f16::from_bits(h).to_f32())
            .collect();
        check("f16", Run::F16(&f16), &wide);
    }

    /// The first `n` values of `run`.
    fn head(run: Run<'_>, n: usize) -> Run<'_> {
        match run {
            Run::F32(w) => Run::F32(&w[..n]),
            Run::Bf16(w) => Run::Bf16(&w[..n]),
            Run::F16(w) => Run::F16(&w[..n]),
        }
    }

    /// [`rn_bytes`] then [`nibbles`] on every f32 of each sign, exponent and top 12
    /// mantissa bits, with low bits 0, 1, `0x400` and `0x7FF` (the E2M1 grid and its
    /// rounding edges all lie in the top 3 mantissa bits): the bytes of
    /// [`e2m1::encode_reference`] packed as [`e2m1::pack_slice`] packs them. (The same
    /// float steps, written as scalar code, were also checked against the reference on
    /// all 2^32 patterns while the kernel was written.)
    #[test]
    fn rn_bytes_equal_the_reference_codec() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let xs: Vec<f32> = (0..2u32 << 20)
            .flat_map(|top| [0u32, 1, 0x400, 0x7FF].map(|low| f32::from_bits(top << 11 | low)))
            .collect();
        let (mut want, mut got) = ([0u8; 16], [0u8; 16]);
        for v in xs.chunks_exact(32) {
            let codes: Vec<u8> = v.iter().map(|&x| e2m1::encode_reference(x)).collect();
            e2m1::pack_slice(&codes, &mut want);
            // SAFETY: the CPU has AVX2 (checked above); `v` is 32 f32 (four unaligned
            // 256-bit loads) and `got` 16 bytes (one unaligned 128-bit store).
            unsafe {
                let p = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(v[i..].as_ptr()));
                _mm_storeu_si128(got.as_mut_ptr().cast(), nibbles(rn_bytes(p)));
            }
            assert_eq!(
                got,
                want,
                "{:08x?}",
                v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    /// [`sr_bytes`] then [`nibbles`] on every f32 of each sign, exponent and top 12
    /// mantissa bits, with low bits 0 and `0x7FF`, each with a random byte (and the
    /// bytes 0 and 255 on every 5th and 7th value): TE's rule
    /// ([`crate::sr::stochastic_round_e2m1`]), then the exact code of its grid value.
    #[test]
    fn sr_bytes_equal_the_rule() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let mut rng = quantfmt_testkit::XorShift32::new(7);
        let xs: Vec<(f32, u32)> = (0..2u32 << 20)
            .flat_map(|top| [0u32, 0x7FF].map(|low| f32::from_bits(top << 11 | low)))
            .enumerate()
            .map(|(i, x)| match (i % 5, i % 7) {
                (0, _) => (x, 0),
                (_, 0) => (x, 255),
                _ => (x, rng.next_u32() & 0xFF),
            })
            .collect();
        let (mut want, mut got) = ([0u8; 16], [0u8; 16]);
        for v in xs.chunks_exact(32) {
            let codes: Vec<u8> = v
                .iter()
                .map(|&(x, r)| e2m1::encode(crate::sr::stochastic_round_e2m1(x, r)))
                .collect();
            e2m1::pack_slice(&codes, &mut want);
            let (x, r): (Vec<f32>, Vec<i32>) = v.iter().map(|&(x, r)| (x, r as i32)).unzip();
            // SAFETY: the CPU has AVX2 and FMA (checked above: `Level::Avx2` includes
            // FMA); `x` and `r` are 32 lanes each (four unaligned 256-bit loads each) and
            // `got` 16 bytes (one unaligned 128-bit store).
            unsafe {
                let p = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(x[i..].as_ptr()));
                let r = [0, 8, 16, 24].map(|i| _mm256_loadu_si256(r[i..].as_ptr().cast()));
                _mm_storeu_si128(got.as_mut_ptr().cast(), nibbles(sr_bytes(p, r)));
            }
            assert_eq!(got, want, "{v:?}");
        }
    }

    /// [`encoder_input`] under round to nearest, as each run kind: the codes of the
    /// portable encoder of the run's values, packed as [`e2m1::pack_slice`] packs them.
    #[test]
    fn encode_equals_the_portable_encoder() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let (xs, enc) = encoder_input();
        each_kind(&xs, |what, run, xs| {
            let codes: Vec<u8> = xs
                .iter()
                .enumerate()
                .map(|(i, &x)| e2m1::encode(x * enc[i / BLOCK]))
                .collect();
            let mut want = vec![0u8; xs.len() / 2];
            e2m1::pack_slice(&codes, &mut want);
            let mut got = vec![0u8; xs.len() / 2];
            assert!(encode_run_rn(run, &enc, &mut got));
            assert_eq!(got, want, "{what}");
            // An odd number of blocks (the last one stored alone).
            let odd = enc.len() - 1;
            let mut got = vec![0u8; odd * BLOCK / 2];
            assert!(encode_run_rn(head(run, odd * BLOCK), &enc[..odd], &mut got));
            assert_eq!(got, want[..odd * BLOCK / 2], "{what}, {odd} blocks");
        });
        // Lengths that do not fit are declined.
        let mut got = [0u8; 8];
        assert!(!encode_run_rn(Run::F32(&xs[..BLOCK]), &enc[..2], &mut got));
        assert!(!encode_run_rn(
            Run::F32(&xs[..BLOCK]),
            &enc[..1],
            &mut got[..7]
        ));
    }

    /// [`encoder_input`] and the values of every SR bucket edge under stochastic
    /// rounding, as each run kind, with random bytes and with the extreme bytes 0 and
    /// 255: TE's rule ([`crate::sr::stochastic_round_e2m1`]), then the exact code of
    /// its grid value.
    #[test]
    fn sr_encode_equals_the_rule() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let (mut xs, mut enc) = encoder_input();
        // The jitter's interval edges and the grid around them, one factor.
        for v in [0.0f32, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0] {
            for d in [-2i32, -1, 0, 1] {
                let v = f32::from_bits((v.to_bits() as i32 + d).max(0) as u32);
                xs.extend([v, -v]);
            }
        }
        while !xs.len().is_multiple_of(BLOCK) {
            xs.push(5.9);
        }
        enc.resize(xs.len() / BLOCK, 1.0);
        let mut rng = quantfmt_testkit::XorShift32::new(99);
        for fill in [None, Some(0u8), Some(255)] {
            let rnd: Vec<[u8; BLOCK]> = (0..enc.len())
                .map(|_| std::array::from_fn(|_| fill.unwrap_or_else(|| rng.next_u32() as u8)))
                .collect();
            each_kind(&xs, |what, run, xs| {
                let codes: Vec<u8> = xs
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        let r = u32::from(rnd[i / BLOCK][i % BLOCK]);
                        e2m1::encode(crate::sr::stochastic_round_e2m1(x * enc[i / BLOCK], r))
                    })
                    .collect();
                let mut want = vec![0u8; xs.len() / 2];
                e2m1::pack_slice(&codes, &mut want);
                let mut got = vec![0u8; xs.len() / 2];
                assert!(encode_run_sr(run, &enc, &rnd, &mut got));
                assert_eq!(got, want, "{what}, bytes {fill:?}");
                let odd = enc.len() - 1;
                let mut got = vec![0u8; odd * BLOCK / 2];
                let (enc, rnd) = (&enc[..odd], &rnd[..odd]);
                assert!(encode_run_sr(head(run, odd * BLOCK), enc, rnd, &mut got));
                assert_eq!(got, want[..odd * BLOCK / 2], "{what}, {odd} blocks");
            });
        }
        // Lengths that do not fit are declined.
        let mut out = [0u8; 8];
        let block = Run::F32(&xs[..BLOCK]);
        assert!(!encode_run_sr(block, &enc[..1], &[], &mut out));
        assert!(!encode_run_sr(block, &enc[..1], &[[0; BLOCK]; 2], &mut out));
    }

    /// Two rows of [`encoder_input`]'s values (the second reversed) under per-column
    /// factors, as f32, bf16 and f16 rows (the 16-bit ones rounded first, so their
    /// values are exact): the pair bytes of the portable encoders, under round to
    /// nearest and under stochastic rounding with either half of each column's word.
    #[test]
    fn pair_encoders_equal_the_portable_rules() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let (xs, factors) = encoder_input();
        let n = xs.len() / 2;
        let enc: Vec<f32> = (0..n).map(|c| factors[c % factors.len()]).collect();
        let mut rng = quantfmt_testkit::XorShift32::new(7);
        let words: Vec<u32> = (0..n).map(|_| rng.next_u32()).collect();
        let sr = |x: f32, r: u32| e2m1::encode(crate::sr::stochastic_round_e2m1(x, r & 0xFF));
        let rows = |to: fn(f32) -> u16, from: fn(u16) -> f32| {
            let a: Vec<u16> = xs[..n].iter().map(|&x| to(x)).collect();
            let b: Vec<u16> = xs[n..].iter().rev().map(|&x| to(x)).collect();
            let widen = |v: &[u16]| v.iter().map(|&h| from(h)).collect::<Vec<f32>>();
            let (fa, fb) = (widen(&a), widen(&b));
            (a, b, fa, fb)
        };
        let bf16 = rows(
            |x| half::bf16::from_f32(x).to_bits(),
            quant_core::dtype::f32_from_bf16_bits,
        );
        let f16 = rows(
            |x| half::f16::from_f32(x).to_bits(),
            |h| half::f16::from_bits(h).to_f32(),
        );
        let f32_rows: (Vec<f32>, Vec<f32>) =
            (xs[..n].to_vec(), xs[n..].iter().rev().copied().collect());
        // Each row kind with the values its rows widen to.
        type Case<'a> = (&'a str, Run<'a>, Run<'a>, &'a [f32], &'a [f32]);
        let cases: [Case<'_>; 3] = [
            (
                "f32",
                Run::F32(&f32_rows.0),
                Run::F32(&f32_rows.1),
                &f32_rows.0,
                &f32_rows.1,
            ),
            (
                "bf16",
                Run::Bf16(&bf16.0),
                Run::Bf16(&bf16.1),
                &bf16.2,
                &bf16.3,
            ),
            ("f16", Run::F16(&f16.0), Run::F16(&f16.1), &f16.2, &f16.3),
        ];
        for (what, lo, hi, a, b) in cases {
            let want: Vec<u8> = (0..n)
                .map(|c| e2m1::encode(a[c] * enc[c]) | e2m1::encode(b[c] * enc[c]) << 4)
                .collect();
            let mut got = vec![0u8; n];
            assert!(encode_pairs_rn(lo, hi, &enc, &mut got));
            assert_eq!(got, want, "{what} RN");
            for shift in [0u32, 16] {
                let want: Vec<u8> = (0..n)
                    .map(|c| {
                        let w = words[c];
                        sr(a[c] * enc[c], w >> shift) | sr(b[c] * enc[c], w >> (shift + 8)) << 4
                    })
                    .collect();
                got.fill(0);
                assert!(encode_pairs_sr(lo, hi, &enc, &words, shift, &mut got));
                assert_eq!(got, want, "{what} SR, shift {shift}");
            }
        }
        // What does not fit is declined.
        let (lo, hi) = (Run::F32(&f32_rows.0), Run::F32(&f32_rows.1));
        let mut out = vec![0u8; n];
        assert!(!encode_pairs_rn(lo, Run::Bf16(&bf16.1), &enc, &mut out));
        assert!(!encode_pairs_rn(lo, hi, &enc, &mut out[..n - 1]));
        let short = Run::F32(&f32_rows.0[..n - 16]);
        assert!(!encode_pairs_rn(
            short,
            short,
            &enc[..n - 16],
            &mut out[..n - 8]
        ));
        assert!(!encode_pairs_sr(lo, hi, &enc, &words, 8, &mut out));
        assert!(!encode_pairs_sr(lo, hi, &enc, &words[1..], 0, &mut out));
        let odd = Run::F32(&f32_rows.0[..8]);
        assert!(!encode_pairs_rn(odd, odd, &enc[..8], &mut out[..8]));
    }
}
