//! The AVX-512 body of the dequantizer's lookup: one row's nibbles, unpacked from the
//! tile layout and looked up in the row's group tables, 32 outputs per step.
//!
//! Only bits move here: the tables are computed by the portable code with the exact
//! arithmetic of [`crate::kernels`], so the result cannot depend on the level (the
//! tests compare every level anyway).
//!
//! One row's words of one slab are `4·half` consecutive i32 (`[c][p]`: lane `nr·4 + c`,
//! k-tile pair `p`; see [`crate::layout`]). One masked load takes them all and one
//! `vpermd` puts them in `[p][c]` order; then each 32-wide block `p` is its 128-bit lane
//! broadcast (`vshufi32x4`), shifted by `[0,0,0,0,4,4,4,4,8,..,12]` and masked with
//! `0x000F000F`: 32 u16 lanes, lane `j` holding nibble `j` of the block
//! (`kernels::unpack32`), which `vpermw` (16-bit outputs) or two `vpermd` (32-bit
//! outputs) look up directly.
//!
//! Packing ([`pack_row`]) runs the same steps backwards: a block's 32 nibble bytes
//! zero-extended to u16 lanes, shifted left by the same amounts, the four 128-bit lanes
//! ORed together (two lane swaps), each block's four words placed at `[p][c]`, and one
//! `vpermd` and one masked store per slab.

use std::arch::x86_64::{
    __m512, __m512i, _mm256_loadu_si256, _mm256_storeu_si256, _mm512_add_ps, _mm512_and_si512,
    _mm512_castps_si512, _mm512_castsi512_ps, _mm512_castsi512_si256, _mm512_cvtepu8_epi16,
    _mm512_cvtepu16_epi32, _mm512_cvtne2ps_pbh, _mm512_extracti64x4_epi64, _mm512_loadu_si512,
    _mm512_mask_mov_epi32, _mm512_mask_storeu_epi32, _mm512_maskz_loadu_epi32, _mm512_max_epi16,
    _mm512_min_epi16, _mm512_mul_ps, _mm512_or_si512, _mm512_permutex2var_epi8,
    _mm512_permutexvar_epi16, _mm512_permutexvar_epi32, _mm512_set1_epi16, _mm512_set1_epi32,
    _mm512_set1_ps, _mm512_setr_epi32, _mm512_setzero_si512, _mm512_shuffle_i32x4,
    _mm512_sllv_epi32, _mm512_srlv_epi32, _mm512_sub_ps, _mm512_unpackhi_epi16,
    _mm512_unpacklo_epi16, _mm512_zextsi256_si512,
};

use quant_core::Element;
use quant_core::simd::Level;
use quant_core::stream::StoreMode;
use quant_core::stream::x86::LineWriter;

use crate::kernels::RowWords;
use crate::layout::LANES;

/// The vector whose lane `l` holds `lane(l)`, for the permute indices below.
#[inline]
#[target_feature(enable = "avx512f")]
fn lanes(lane: impl Fn(i32) -> i32) -> __m512i {
    let v: [i32; 16] = std::array::from_fn(|l| lane(l as i32));
    // SAFETY: `v` is 16 i32 = 64 bytes (one unaligned 512-bit load).
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

/// Lane `p·4 + c` of the transposed slab reads word `c·half + p` (lanes past `4·half`
/// read word 0: never used).
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose_index(half: usize) -> __m512i {
    let h = half as i32;
    lanes(|l| if l < 4 * h { (l % 4) * h + l / 4 } else { 0 })
}

/// The inverse of [`transpose_index`]: lane `c·half + p` of the stored slab reads lane
/// `p·4 + c` of the packed blocks.
#[inline]
#[target_feature(enable = "avx512f")]
fn untranspose_index(half: usize) -> __m512i {
    let h = half as i32;
    lanes(|l| if l < 4 * h { (l % h) * 4 + l / h } else { 0 })
}

/// Calls `emit(j0, group, e)` for every 32-wide block of the row's first `k` columns
/// (outputs `j0 .. j0 + 32`, of group `group`), `e` holding the block's 32 nibbles as
/// u16 lanes. Returns `false` (no call) unless `k` outputs in groups of `g`, with
/// `tables` group tables, fit the row: `k` a multiple of 32 (so `j0 + 32 <= k` in every
/// call), `g` a power of two of at least 32, a table for every group, and the row's
/// words inside the tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn for_each_block(
    row: RowWords<'_>,
    k: usize,
    g: usize,
    tables: usize,
    mut emit: impl FnMut(usize, usize, __m512i),
) -> bool {
    let fits = k.is_multiple_of(32)
        && g.is_power_of_two()
        && g >= 32
        && row.covers(k)
        && tables >= k.div_ceil(g);
    if !fits {
        return false;
    }
    let g_shift = g.trailing_zeros();
    let half = row.half;
    let mask = ((1u32 << (4 * half)) - 1) as u16;
    let index = transpose_index(half);
    let shift = pair_shifts();
    let nibbles = _mm512_set1_epi32(0x000F_000F);
    for kot in 0..k.div_ceil(32 * half) {
        let at = (kot * LANES + row.nr * 4) * half;
        // SAFETY: the mask reads words `at .. at + 4·half`, inside the tile because
        // `row.covers(k)` (checked above; lane `nr·4 + 3` of the last slab ends at `(kot + 1)·32·half`);
        // masked-off words are not accessed.
        let z = unsafe { _mm512_maskz_loadu_epi32(mask, row.tile.as_ptr().add(at)) };
        let t = _mm512_permutexvar_epi32(index, z);
        for p in 0..half {
            let j0 = (kot * half + p) * 32;
            if j0 >= k {
                return true;
            }
            let b = match p {
                0 => _mm512_shuffle_i32x4::<0x00>(t, t),
                1 => _mm512_shuffle_i32x4::<0x55>(t, t),
                2 => _mm512_shuffle_i32x4::<0xAA>(t, t),
                _ => _mm512_shuffle_i32x4::<0xFF>(t, t),
            };
            emit(
                j0,
                j0 >> g_shift,
                _mm512_and_si512(_mm512_srlv_epi32(b, shift), nibbles),
            );
        }
    }
    true
}

/// The per-lane shifts of a block's u16 pairs: pair `4q + c` sits at bits `4q` of word
/// `c` (module docs of [`crate::kernels`]).
#[inline]
#[target_feature(enable = "avx512f")]
fn pair_shifts() -> __m512i {
    _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12)
}

/// Packs one row's nibbles `u` (`k_padded` bytes, values below 16) into its words of
/// `tile` (the n-tile's `k_padded` words). Returns `false` (nothing written) when the
/// arguments do not fit together.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn pack_row(u: &[u8], nr: usize, half: usize, tile: &mut [i32]) -> bool {
    let slab = 32 * half;
    let k = u.len();
    let fits = RowWords { tile, nr, half }.covers(k);
    if !(fits && k.is_multiple_of(slab)) {
        return false;
    }
    let mask = ((1u32 << (4 * half)) - 1) as u16;
    let index = untranspose_index(half);
    let shift = pair_shifts();
    for (kot, us) in u.chunks_exact(slab).enumerate() {
        let mut acc = _mm512_setzero_si512();
        for (p, ub) in us.chunks_exact(32).enumerate() {
            // SAFETY: `ub` is 32 bytes (one unaligned 256-bit load).
            let e = _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(ub.as_ptr().cast()) });
            let t = _mm512_sllv_epi32(e, shift);
            let t = _mm512_or_si512(t, _mm512_shuffle_i32x4::<0b01_00_11_10>(t, t));
            let t = _mm512_or_si512(t, _mm512_shuffle_i32x4::<0b10_11_00_01>(t, t));
            acc = _mm512_mask_mov_epi32(acc, 0xF << (4 * p), t);
        }
        let at = (kot * LANES + nr * 4) * half;
        // SAFETY: the mask writes words `at .. at + 4·half`, inside the tile because it
        // covers the row's `k` columns (checked above); masked-off words are untouched.
        unsafe {
            _mm512_mask_storeu_epi32(
                tile.as_mut_ptr().add(at),
                mask,
                _mm512_permutexvar_epi32(index, acc),
            )
        };
    }
    true
}

/// `out[j] = tables[j / g][nibble j]` for 16-bit outputs, `out.len()` a multiple of 32,
/// stored in `mode`. Returns `false` (and writes nothing) when the arguments do not fit
/// together.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn lookup_row_u16(
    tables: &[[u16; 16]],
    g: usize,
    row: RowWords<'_>,
    out: &mut [u16],
    mode: StoreMode,
) -> bool {
    let k = out.len();
    let mut w = LineWriter::new(mode, bytemuck::cast_slice_mut(out));
    for_each_block(row, k, g, tables.len(), |_, gi, e| {
        // SAFETY: a table is 16 u16 = 32 bytes (unaligned load, upper half zero and
        // never indexed: nibbles are below 16).
        let t = unsafe { _mm512_zextsi256_si512(_mm256_loadu_si256(tables[gi].as_ptr().cast())) };
        // Blocks come in order, each the next 64 bytes of the row.
        w.push(_mm512_permutexvar_epi16(e, t));
    })
}

/// `out[j] = tables[j / g][nibble j]` for 32-bit outputs, `out.len()` a multiple of 32,
/// stored in `mode`. Returns `false` (and writes nothing) when the arguments do not fit
/// together.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn lookup_row_u32(
    tables: &[[u32; 16]],
    g: usize,
    row: RowWords<'_>,
    out: &mut [u32],
    mode: StoreMode,
) -> bool {
    let k = out.len();
    let mut w = LineWriter::new(mode, bytemuck::cast_slice_mut(out));
    for_each_block(row, k, g, tables.len(), |_, gi, e| {
        // SAFETY: a table is 16 u32 = 64 bytes (unaligned load).
        let t = unsafe { _mm512_loadu_si512(tables[gi].as_ptr().cast()) };
        let lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(e));
        let hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(e));
        // Blocks come in order, each the next 128 bytes of the row.
        w.push(_mm512_permutexvar_epi32(lo, t));
        w.push(_mm512_permutexvar_epi32(hi, t));
    })
}

/// The bf16 path's nibbles of one group through AVX-512 BF16 (see
/// [`nibbles_bf16_if_supported`]).
///
/// The bf16 -> f32 widenings are in-lane unpacks (one operation per 16 values, where
/// the order-keeping zero-extension and shift take two), so each widen-and-narrow round
/// permutes the lanes by [`unpack_order`]; every step between is lane-wise, and the
/// final `vpermt2b` that gathers each lane's nibble byte undoes the three rounds.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx512vbmi")]
fn nibbles_bf16(xs: &[u16], min_val: f32, r: f32, u: &mut [u8]) {
    let mn = _mm512_set1_ps(min_val);
    let rr = _mm512_set1_ps(r);
    let zero = _mm512_setzero_si512();
    let fifteen = _mm512_set1_epi16(0x4170); // bf16 15.0
    let magic = _mm512_set1_ps(8_388_608.0); // 2^23
    // SAFETY: 64 bytes (one unaligned 512-bit load).
    let gather = unsafe { _mm512_loadu_si512(NIBBLE_GATHER.as_ptr().cast()) };
    let low = |v| _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v));
    let high = |v| _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v));
    for (x, o) in xs.chunks_exact(32).zip(u.chunks_exact_mut(32)) {
        // SAFETY: `x` is 32 u16 (one unaligned 512-bit load).
        let v = unsafe { _mm512_loadu_si512(x.as_ptr().cast()) };
        let t = to_bf16(_mm512_sub_ps(low(v), mn), _mm512_sub_ps(high(v), mn));
        let q = to_bf16(_mm512_mul_ps(low(t), rr), _mm512_mul_ps(high(t), rr));
        // Clamped to [0, 15] as integers (bf16 order is integer order for positive
        // values; negative ones, -0 included, are negative i16), then rounded half to
        // even by the 2^23 addition, the integer in the low byte of each lane.
        let q = _mm512_min_epi16(_mm512_max_epi16(q, zero), fifteen);
        let lo = _mm512_castps_si512(_mm512_add_ps(low(q), magic));
        let hi = _mm512_castps_si512(_mm512_add_ps(high(q), magic));
        let bytes = _mm512_permutex2var_epi8(lo, gather, hi);
        // SAFETY: `o` is 32 bytes (one unaligned 256-bit store).
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), _mm512_castsi512_si256(bytes)) };
    }
}

/// Where an unpack-widen-narrow round takes lane `n` of its 32 from: `unpacklo_epi16`
/// puts 16-bit lanes `8L..8L+4` of each 128-bit lane `L` into dwords `4L..4L+4`,
/// `unpackhi_epi16` lanes `8L+4..8L+8`, and `vcvtne2ps2bf16` writes the low result
/// first.
const fn unpack_order(n: usize) -> usize {
    let m = n % 16;
    8 * (m / 4) + m % 4 + if n < 16 { 0 } else { 4 }
}

/// `vpermt2b` indices of [`nibbles_bf16`]: byte `e` (element `e` of the group's 32)
/// reads the low byte of the dword that holds it after three rounds of
/// [`unpack_order`] (dwords `0..16` of the first source, `16..32` of the second).
const NIBBLE_GATHER: [u8; 64] = {
    let mut g = [0u8; 64];
    let mut slot = 0;
    while slot < 32 {
        let e = unpack_order(unpack_order(unpack_order(slot)));
        g[e] = if slot < 16 {
            4 * slot
        } else {
            64 + 4 * (slot - 16)
        } as u8;
        slot += 1;
    }
    g
};

/// `lo` and `hi` rounded to bf16 (nearest even; subnormals flushed to zero), lanes 0..16
/// from `lo`.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
fn to_bf16(lo: __m512, hi: __m512) -> __m512i {
    // SAFETY: both are 512-bit plain vector types; every bit pattern is valid for either.
    unsafe { std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo)) }
}

/// `u[i] = to_nibble(rb(rb(x[i] - min_val) * r))` for a group of bf16 bit patterns `xs`
/// (the multiply form of `kernels::group_nibbles` on the bf16 path), each `rb` one
/// `vcvtne2ps2bf16` per 32 values where the portable rounding takes five integer
/// operations per 16. Returns `false` (nothing written) unless the CPU has AVX-512 and
/// AVX-512 BF16 and VBMI and `xs` and `u` have the same length, a multiple of 32.
///
/// The instruction flushes subnormal inputs and results to zero. The caller passes only
/// scales of at least 2^-100 (`r <= 2^100`): a subnormal `t = x - min_val` then gives
/// `|t * r| < 2^-26`, and a subnormal product is below 2^-126, both nibble 0 whether
/// flushed or not. Values are finite or infinite, never NaN (a group holding NaN or
/// infinity has a NaN or infinite scale and takes the exact path).
#[inline(always)]
pub(crate) fn nibbles_bf16_if_supported(xs: &[u16], min_val: f32, r: f32, u: &mut [u8]) -> bool {
    if !(xs.len().is_multiple_of(32)
        && u.len() == xs.len()
        && Level::Avx512.is_supported()
        && std::is_x86_feature_detected!("avx512bf16")
        && std::is_x86_feature_detected!("avx512vbmi"))
    {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F, BW (`Level::Avx512`), BF16 and VBMI (checked above).
    unsafe { nibbles_bf16(xs, min_val, r, u) };
    true
}

/// [`pack_row`] when the CPU has AVX-512; `false` (nothing written) otherwise.
#[inline(always)]
pub(crate) fn pack_row_if_supported(u: &[u8], nr: usize, half: usize, tile: &mut [i32]) -> bool {
    // SAFETY: the CPU has AVX-512 F and BW (`Level::Avx512` includes both).
    Level::Avx512.is_supported() && unsafe { pack_row(u, nr, half, tile) }
}

/// `out[j] = tables[j / g][nibble j]` through [`lookup_row_u16`] or [`lookup_row_u32`]
/// when the CPU has AVX-512 and `T` is 16 or 32 bits wide; `false` (nothing written)
/// otherwise, leaving the row to the portable loop.
#[inline(always)]
pub(crate) fn lookup_row<T: Element>(
    tables: &[[T; 16]],
    g: usize,
    row: RowWords<'_>,
    out: &mut [T],
    mode: StoreMode,
) -> bool {
    if !Level::Avx512.is_supported() {
        return false;
    }
    let flat = bytemuck::cast_slice::<[T; 16], T>(tables);
    match std::mem::size_of::<T>() {
        2 => match (
            bytemuck::try_cast_slice::<T, [u16; 16]>(flat),
            bytemuck::try_cast_slice_mut::<T, u16>(out),
        ) {
            // SAFETY: the CPU has AVX-512 F and BW (`Level::Avx512` includes both).
            (Ok(t), Ok(o)) => unsafe { lookup_row_u16(t, g, row, o, mode) },
            _ => false,
        },
        4 => match (
            bytemuck::try_cast_slice::<T, [u32; 16]>(flat),
            bytemuck::try_cast_slice_mut::<T, u32>(out),
        ) {
            // SAFETY: the CPU has AVX-512 F and BW (`Level::Avx512` includes both).
            (Ok(t), Ok(o)) => unsafe { lookup_row_u32(t, g, row, o, mode) },
            _ => false,
        },
        _ => false,
    }
}
