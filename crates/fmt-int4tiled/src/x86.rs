//! The AVX-512 body of the dequantizer's lookup: one row's nibbles, unpacked from the
//! tile layout and looked up in the row's group tables, 32 outputs per step.
//!
//! A row ([`dequant_row`]) builds each group's table in a register with the same
//! operations as the portable [`crate::kernels`] arithmetic (the two are compared bit
//! for bit on every bf16 scale in this module's tests). 16-bit tables of two groups
//! share one register, narrowed as the portable `narrow_slice` narrows: bf16 by
//! `vcvtne2ps2bf16` where that is exact (or by integer rounding on a CPU without AVX-512
//! BF16), f16 by `vcvtps2ph`. Every level gives the same bits (the tests compare them).
//!
//! One row's words of one slab are `4·half` consecutive i32 (`[c][p]`: lane `nr·4 + c`,
//! k-tile pair `p`; see [`crate::layout`]). One masked load takes them all and one
//! `vpermd` puts them in `[p][c]` order; then each 32-wide block `p` is its 128-bit lane
//! broadcast (`vshufi32x4`), shifted by `[0,0,0,0,4,4,4,4,8,..,12]` and masked with
//! `0x000F000F`: 32 u16 lanes, lane `j` holding nibble `j` of the block
//! (`kernels::unpack32`), which `vpermw` (16-bit outputs) or two `vpermd` (32-bit
//! outputs) look up directly. Each slab also hints one line of the next tile into L2
//! (`RowWords::ahead`).
//!
//! Packing ([`pack_row`]) runs the same steps backwards: a block's 32 nibble bytes
//! zero-extended to u16 lanes, shifted left by the same amounts, the four 128-bit lanes
//! ORed together (two lane swaps), each block's four words placed at `[p][c]`, and one
//! `vpermd` and one masked store per slab. Where the CPU has VBMI, [`pack_row_vbmi`]
//! instead gathers a slab's nibble bytes twice with `vpermt2b` (each packed byte's low
//! and high nibble) straight into the stored order.

use std::arch::x86_64::{
    __m128i, __m256i, __m512, __m512bh, __m512i, _CMP_GT_OQ, _CMP_NEQ_UQ, _MM_FROUND_NO_EXC,
    _MM_FROUND_TO_NEAREST_INT, _MM_HINT_T1, _mm_prefetch, _mm_storeu_si128, _mm256_loadu_si256,
    _mm256_storeu_si256, _mm512_add_epi32, _mm512_add_ps, _mm512_and_si512, _mm512_castps_si512,
    _mm512_castsi256_si512, _mm512_castsi512_ps, _mm512_castsi512_si256, _mm512_cmp_ps_mask,
    _mm512_cmplt_epi32_mask, _mm512_cvtepi32_epi8, _mm512_cvtepu8_epi16, _mm512_cvtepu16_epi32,
    _mm512_cvtne2ps_pbh, _mm512_cvtph_ps, _mm512_cvtps_ph, _mm512_div_ps, _mm512_dpbf16_ps,
    _mm512_extracti64x4_epi64, _mm512_inserti64x4, _mm512_loadu_si512, _mm512_mask_add_epi32,
    _mm512_mask_blend_epi32, _mm512_mask_mov_epi32, _mm512_mask_storeu_epi32,
    _mm512_maskz_loadu_epi8, _mm512_maskz_loadu_epi32, _mm512_max_epi16, _mm512_max_ps,
    _mm512_min_epi16, _mm512_min_ps, _mm512_mul_ps, _mm512_or_si512, _mm512_permutex2var_epi8,
    _mm512_permutex2var_epi16, _mm512_permutexvar_epi16, _mm512_permutexvar_epi32,
    _mm512_set1_epi16, _mm512_set1_epi32, _mm512_set1_ps, _mm512_setr_epi32, _mm512_setr_ps,
    _mm512_setzero_ps, _mm512_setzero_si512, _mm512_shuffle_i32x4, _mm512_slli_epi16,
    _mm512_sllv_epi32, _mm512_srli_epi32, _mm512_srlv_epi32, _mm512_sub_ps,
    _mm512_testn_epi32_mask, _mm512_unpackhi_epi16, _mm512_unpacklo_epi16,
};

use quant_core::Element;
use quant_core::bf16_narrow::x86::{narrow16_int, narrow32_exact};
use quant_core::dtype::FloatsMut;
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
    let slabs = k.div_ceil(32 * half);
    let ahead_step = row.ahead_step(k);
    for kot in 0..slabs {
        if let Some(w) = row.ahead.get(kot * ahead_step) {
            // A hint: it never faults and changes no result.
            _mm_prefetch::<_MM_HINT_T1>((w as *const i32).cast());
        }
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

/// Whether the packers may write row `nr`'s words of `tile` from the nibbles `u`: whole
/// slabs of `32·half`, inside the tile.
#[inline]
pub(crate) fn pack_fits(u: &[u8], nr: usize, half: usize, tile: &[i32]) -> bool {
    let row = RowWords {
        tile,
        nr,
        half,
        ahead: &[],
    };
    row.covers(u.len()) && u.len().is_multiple_of(32 * half)
}

/// Packs one row's nibbles `u` (`k_padded` bytes, values below 16) into its words of
/// `tile` (the n-tile's `k_padded` words). Returns `false` (nothing written) when the
/// arguments do not fit together.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn pack_row(u: &[u8], nr: usize, half: usize, tile: &mut [i32]) -> bool {
    if !pack_fits(u, nr, half, tile) {
        return false;
    }
    let slab = 32 * half;
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

/// The 16 values of a group with scale `s` and zero `z`, lane `u` holding
/// `(u − 8)·s + z` as `kernels::group_values` gives it: for `round_odd` the exact sum
/// rounded to f32 with round-to-odd (TwoSum's error term as the sticky bit; whose
/// nearest-even narrowing to bf16 is the single rounding), otherwise the nearest f32.
/// `(u − 8)·s` is exact in f32 (4 + 8 significant bits), so either way the sum is the
/// only rounding.
#[inline]
#[target_feature(enable = "avx512f")]
fn group_values(s: f32, z: f32, round_odd: bool) -> __m512 {
    let steps = _mm512_setr_ps(
        -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
    );
    let p = _mm512_mul_ps(steps, _mm512_set1_ps(s));
    let z = _mm512_set1_ps(z);
    let sum = _mm512_add_ps(p, z);
    if !round_odd {
        return sum;
    }
    let bb = _mm512_sub_ps(sum, p);
    let err = _mm512_add_ps(
        _mm512_sub_ps(p, _mm512_sub_ps(sum, bb)),
        _mm512_sub_ps(z, bb),
    );
    let zero = _mm512_setzero_ps();
    let bits = _mm512_castps_si512(sum);
    // Step the magnitude toward the exact value (the error's direction) where the sum is
    // inexact, even and finite; NaN compares false, as in the portable code.
    let up = !(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(err, zero)
        ^ _mm512_cmp_ps_mask::<_CMP_GT_OQ>(sum, zero));
    let step = _mm512_mask_blend_epi32(up, _mm512_set1_epi32(-1), _mm512_set1_epi32(1));
    let inexact = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(err, zero);
    let even = _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(1));
    let finite = _mm512_cmplt_epi32_mask(
        _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFF_FFFF)),
        _mm512_set1_epi32(0x7F80_0000),
    );
    _mm512_castsi512_ps(_mm512_mask_add_epi32(
        bits,
        inexact & even & finite,
        bits,
        step,
    ))
}

/// One 16-bit row `out[j] = T((nibble j − 8)·s + z)` (rounded once), `(s, z) =
/// pairs[j / g]`, with no table in memory: each pair of groups' 16 + 16 round-to-odd
/// values is narrowed into one register by `narrow` (the lower group in lanes 0..16),
/// and the odd group's nibbles index its upper half. Returns `false` (nothing written)
/// when the arguments do not fit together (see [`for_each_block`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn dequant_row_u16(
    pairs: &[[f32; 2]],
    g: usize,
    row: RowWords<'_>,
    out: &mut [u16],
    mode: StoreMode,
    narrow: impl Fn(__m512, __m512) -> __m512i,
) -> bool {
    let k = out.len();
    let mut w = LineWriter::new(mode, bytemuck::cast_slice_mut(out));
    let upper = _mm512_set1_epi16(16);
    let (mut table, mut have) = (_mm512_setzero_si512(), usize::MAX);
    for_each_block(row, k, g, pairs.len(), |_, gi, e| {
        if gi / 2 != have {
            have = gi / 2;
            let [s0, z0] = pairs[gi & !1];
            let [s1, z1] = pairs.get(gi | 1).copied().unwrap_or([s0, z0]);
            table = narrow(group_values(s0, z0, true), group_values(s1, z1, true));
        }
        let e = if gi & 1 == 1 {
            _mm512_or_si512(e, upper)
        } else {
            e
        };
        w.push(_mm512_permutexvar_epi16(e, table));
    })
}

/// [`dequant_row_u16`] into bf16 with `vcvtne2ps2bf16` ([`narrow32_exact`]: the portable
/// narrowing's bits, a subnormal step narrowed the portable way).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16")]
fn dequant_row_bf16(
    pairs: &[[f32; 2]],
    g: usize,
    row: RowWords<'_>,
    out: &mut [u16],
    mode: StoreMode,
) -> bool {
    dequant_row_u16(pairs, g, row, out, mode, |lo, hi| narrow32_exact(lo, hi))
}

/// [`dequant_row_u16`] into bf16 on a CPU without AVX-512 BF16: the portable rounding
/// ([`quant_core::dtype::bf16_bits`]) in integer lanes.
#[target_feature(enable = "avx512f,avx512bw")]
fn dequant_row_bf16_int(
    pairs: &[[f32; 2]],
    g: usize,
    row: RowWords<'_>,
    out: &mut [u16],
    mode: StoreMode,
) -> bool {
    dequant_row_u16(pairs, g, row, out, mode, |lo, hi| {
        join16(narrow16_int(lo), narrow16_int(hi))
    })
}

/// [`dequant_row_u16`] into f16: `vcvtps2ph`, round to nearest even (the single
/// rounding: f32 keeps 13 more bits than f16 at every magnitude, subnormals included).
#[target_feature(enable = "avx512f,avx512bw")]
fn dequant_row_f16(
    pairs: &[[f32; 2]],
    g: usize,
    row: RowWords<'_>,
    out: &mut [u16],
    mode: StoreMode,
) -> bool {
    dequant_row_u16(pairs, g, row, out, mode, |lo, hi| {
        join16(f16_lanes(lo), f16_lanes(hi))
    })
}

/// `v` rounded to f16 bit patterns (nearest even), in order.
#[inline]
#[target_feature(enable = "avx512f")]
fn f16_lanes(v: __m512) -> __m256i {
    _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
}

/// `lo` in lanes 0..16 and `hi` in lanes 16..32 of one register.
#[inline]
#[target_feature(enable = "avx512f")]
fn join16(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// One f32 row `out[j] = (nibble j − 8)·s + z`, `(s, z) = pairs[j / g]`, each group's
/// 16 values in one register. Returns `false` (nothing written) when the arguments do
/// not fit together (see [`for_each_block`]).
#[target_feature(enable = "avx512f,avx512bw")]
fn dequant_row_f32(
    pairs: &[[f32; 2]],
    g: usize,
    row: RowWords<'_>,
    out: &mut [f32],
    mode: StoreMode,
) -> bool {
    let k = out.len();
    let mut w = LineWriter::new(mode, bytemuck::cast_slice_mut(out));
    let (mut table, mut have) = (_mm512_setzero_ps(), usize::MAX);
    for_each_block(row, k, g, pairs.len(), |_, gi, e| {
        if gi != have {
            have = gi;
            let [s, z] = pairs[gi];
            table = group_values(s, z, false);
        }
        let table = _mm512_castps_si512(table);
        let lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(e));
        let hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(e));
        // Blocks come in order, each the next 128 bytes of the row.
        w.push(_mm512_permutexvar_epi32(lo, table));
        w.push(_mm512_permutexvar_epi32(hi, table));
    })
}

/// One row dequantized straight from its groups' `(scale, zero)` pairs, the tables
/// built in registers ([`dequant_row_f32`], [`dequant_row_u16`]), when the CPU has
/// AVX-512 and `T` is f32, bf16 or f16; `false` (nothing written) otherwise, leaving the
/// row to the tables in memory.
#[inline(always)]
pub(crate) fn dequant_row<T: Element>(
    pairs: &[[f32; 2]],
    g: usize,
    row: RowWords<'_>,
    out: &mut [T],
    mode: StoreMode,
) -> bool {
    if !Level::Avx512.is_supported() {
        return false;
    }
    match FloatsMut::of(out) {
        // SAFETY: the CPU has AVX-512 F and BW (`Level::Avx512`).
        Some(FloatsMut::F32(o)) => unsafe { dequant_row_f32(pairs, g, row, o, mode) },
        // SAFETY: the CPU has AVX-512 F, BW, DQ (`Level::Avx512`) and BF16 (checked).
        Some(FloatsMut::Bf16(o)) if quant_core::simd::has(quant_core::simd::Ext::Bf16) => unsafe {
            dequant_row_bf16(pairs, g, row, o, mode)
        },
        // SAFETY: the CPU has AVX-512 F and BW (`Level::Avx512`).
        Some(FloatsMut::Bf16(o)) => unsafe { dequant_row_bf16_int(pairs, g, row, o, mode) },
        // SAFETY: as above.
        Some(FloatsMut::F16(o)) => unsafe { dequant_row_f16(pairs, g, row, o, mode) },
        None => false,
    }
}

/// The bf16 path's nibbles of one group through AVX-512 BF16 (see
/// [`Bf16Nibbles::run`]).
///
/// The bf16 -> f32 widenings are in-lane unpacks (one operation per 16 values, where
/// the order-keeping zero-extension and shift take two), so each widen-and-narrow round
/// permutes the lanes by [`unpack_order`]; with AVX-512 BF16 the first and last rounds
/// widen by `vdpbf16ps` instead, fused with their subtraction or addition
/// (`$differences`, `$integers`: lanes in [`dp_order`]). Every step between is
/// lane-wise, and the final `vpermt2b` that gathers each lane's nibble byte (`$gather`)
/// undoes the three rounds.
macro_rules! bf16_nibble_loop {
    (
        $(#[$doc:meta])* $name:ident,
        $(#[$step_doc:meta])* $step:ident,
        $features:literal, $differences:ident, $round:ident, $integers:ident, $gather:ident
    ) => {
        $(#[$step_doc])*
        #[inline]
        #[target_feature(enable = $features)]
        pub(crate) fn $step(v: __m512i, min_val: f32, rr: __m512) -> __m256i {
            let zero = _mm512_setzero_si512();
            let fifteen = _mm512_set1_epi16(0x4170); // bf16 15.0
            // SAFETY: 64 bytes (one unaligned 512-bit load).
            let gather = unsafe { _mm512_loadu_si512($gather.as_ptr().cast()) };
            let (t_lo, t_hi) = $differences(v, min_val);
            let t = $round(t_lo, t_hi);
            let (t_lo, t_hi) = widen_unpacked(t);
            let q = $round(_mm512_mul_ps(t_lo, rr), _mm512_mul_ps(t_hi, rr));
            // Clamped to [0, 15] as integers (bf16 order is integer order for positive
            // values; negative ones, -0 included, are negative i16), then rounded half to
            // even, the integer in the low byte of each u32 lane of two vectors.
            let (lo, hi) = $integers(_mm512_min_epi16(_mm512_max_epi16(q, zero), fifteen));
            _mm512_castsi512_si256(_mm512_permutex2var_epi8(lo, gather, hi))
        }

        $(#[$doc])*
        #[target_feature(enable = $features)]
        fn $name(xs: &[u16], min_val: f32, r: f32, u: &mut [u8]) {
            let rr = _mm512_set1_ps(r);
            for (x, o) in xs.chunks_exact(32).zip(u.chunks_exact_mut(32)) {
                // SAFETY: `x` is 32 u16 (one unaligned 512-bit load).
                let v = unsafe { _mm512_loadu_si512(x.as_ptr().cast()) };
                let bytes = $step(v, min_val, rr);
                // SAFETY: `o` is 32 bytes (one unaligned 256-bit store).
                unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), bytes) };
            }
        }
    };
}

bf16_nibble_loop!(
    /// The loop with `vcvtne2ps2bf16` rounding, [`differences_dp`] and [`integers_dp`].
    nibbles_bf16,
    /// One step of [`nibbles_bf16`]: the nibble bytes of 32 bf16 values `v`, given
    /// `min_val` and the reciprocal `rr` in every lane (also the step of
    /// [`crate::batch_x86`]'s kernel).
    nibbles32_bf16,
    "avx512f,avx512bw,avx512bf16,avx512vbmi",
    differences_dp,
    to_bf16,
    integers_dp,
    NIBBLE_GATHER_DP
);
bf16_nibble_loop!(
    /// The loop for CPUs without AVX-512 BF16: [`to_bf16_int`] rounding, the portable
    /// formula's bits (subnormals kept, which the caller's range makes the same nibbles),
    /// [`differences_unpacked`] and [`integers_unpacked`].
    nibbles_bf16_int,
    /// One step of [`nibbles_bf16_int`] ([`nibbles32_bf16`] without AVX-512 BF16).
    nibbles32_bf16_int,
    "avx512f,avx512bw,avx512vbmi",
    differences_unpacked,
    to_bf16_int,
    integers_unpacked,
    NIBBLE_GATHER
);

/// 32 bf16 values `v` widened to f32 (exactly), in two vectors of 16 by in-lane unpacks:
/// lanes in [`unpack_order`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn widen_unpacked(v: __m512i) -> (__m512, __m512) {
    let zero = _mm512_setzero_si512();
    let lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v));
    let hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v));
    (lo, hi)
}

/// `x - min_val` in f32 for 32 bf16 values `v`, in two vectors of 16: each value
/// widened ([`widen_unpacked`]), then subtracted.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn differences_unpacked(v: __m512i, min_val: f32) -> (__m512, __m512) {
    let mn = _mm512_set1_ps(min_val);
    let (lo, hi) = widen_unpacked(v);
    (_mm512_sub_ps(lo, mn), _mm512_sub_ps(hi, mn))
}

/// [`differences_unpacked`] in two operations instead of four: `vdpbf16ps` adds to
/// `-min_val` in each u32 lane the product of its even bf16 value (then its odd one)
/// with 1.0 and of the other with 0.0 (lanes in [`dp_order`]). The products are exact
/// and the zero one adds a zero, so a lane is `x - min_val` rounded once to nearest
/// even, as `vsubps` gives it, where `x` and `min_val` are normal and the difference
/// is. (The values are finite here, so no product is NaN; a zero's sign may differ,
/// and the next steps send `±0` to nibble 0 alike.)
///
/// The instruction flushes subnormal inputs and results to zero. A subnormal result
/// is flushed by the next rounding (`vcvtne2ps2bf16`) anyway. A subnormal `x` (below
/// 2^-126) counts as 0, which changes no nibble: where `|min_val| >= 2^-117`, `x -
/// min_val` lies within `2^-126 - 2^-133` of the bf16 value `-min_val`, less than half
/// the bf16 spacing on either side of it (at least 2^-126 above and below, the spacing
/// halving below a power of two), so both round to `-min_val`; below that, both
/// differences are under 2^-115 in magnitude, and the scale of at least 2^-100 that
/// the caller guarantees makes both quotients round to nibble 0. A subnormal `min_val`
/// is flushed the same way, inside that last case.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn differences_dp(v: __m512i, min_val: f32) -> (__m512, __m512) {
    let neg = _mm512_set1_ps(-min_val);
    let v = as_bh(v);
    let lo = _mm512_dpbf16_ps(neg, v, as_bh(_mm512_set1_epi32(EVEN_ONE)));
    let hi = _mm512_dpbf16_ps(neg, v, as_bh(_mm512_set1_epi32(ODD_ONE)));
    (lo, hi)
}

/// A u32 lane of bf16 pairs `(1.0, 0.0)` (low half first): `vdpbf16ps` by it takes the
/// even value of each pair.
const EVEN_ONE: i32 = 0x0000_3F80;
/// `(0.0, 1.0)`: the odd value.
const ODD_ONE: i32 = 0x3F80_0000;

/// The integers nearest (ties to even) 32 bf16 values in `[0, 15]`, in the low bytes of
/// the u32 lanes of two vectors: each value widened ([`widen_unpacked`]) and added to
/// 2^23.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn integers_unpacked(q: __m512i) -> (__m512i, __m512i) {
    let magic = _mm512_set1_ps(8_388_608.0); // 2^23
    let (lo, hi) = widen_unpacked(q);
    let (lo, hi) = (_mm512_add_ps(lo, magic), _mm512_add_ps(hi, magic));
    (_mm512_castps_si512(lo), _mm512_castps_si512(hi))
}

/// [`integers_unpacked`] in two operations instead of four: `vdpbf16ps` adds to 2^23 in
/// each u32 lane the product of its even bf16 value (then its odd one) with 1.0 and of
/// the other with 0.0. The products are exact, the zero one adds `+0` (the values are
/// finite and not negative), so each lane is `2^23 + q` rounded once to nearest even,
/// as the f32 addition gives it. The instruction flushes subnormal values to zero,
/// whose integer is 0 either way. Lanes in [`dp_order`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn integers_dp(q: __m512i) -> (__m512i, __m512i) {
    let magic = _mm512_set1_ps(8_388_608.0); // 2^23
    let q = as_bh(q);
    let lo = _mm512_dpbf16_ps(magic, q, as_bh(_mm512_set1_epi32(EVEN_ONE)));
    let hi = _mm512_dpbf16_ps(magic, q, as_bh(_mm512_set1_epi32(ODD_ONE)));
    (_mm512_castps_si512(lo), _mm512_castps_si512(hi))
}

/// The bf16 pairs of a vector of 16-bit lanes, as the `vdpbf16ps` intrinsic types them.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
fn as_bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 512-bit plain vector types; every bit pattern is valid for either.
    unsafe { std::mem::transmute(v) }
}

/// Where [`integers_dp`] takes u32 lane `n` of its two vectors (`0..16` the first,
/// `16..32` the second) from: the even 16-bit lane `2n`, then the odd ones.
const fn dp_order(n: usize) -> usize {
    if n < 16 { 2 * n } else { 2 * (n - 16) + 1 }
}

/// Where an unpack-widen-narrow round takes lane `n` of its 32 from: `unpacklo_epi16`
/// puts 16-bit lanes `8L..8L+4` of each 128-bit lane `L` into dwords `4L..4L+4`,
/// `unpackhi_epi16` lanes `8L+4..8L+8`, and `vcvtne2ps2bf16` writes the low result
/// first.
const fn unpack_order(n: usize) -> usize {
    let m = n % 16;
    8 * (m / 4) + m % 4 + if n < 16 { 0 } else { 4 }
}

/// `vpermt2b` indices of [`nibbles_bf16_int`]: byte `e` (element `e` of the group's 32)
/// reads the low byte of the dword that holds it after three rounds of
/// [`unpack_order`] (dwords `0..16` of the first source, `16..32` of the second).
const NIBBLE_GATHER: [u8; 64] = nibble_gather(false);

/// [`NIBBLE_GATHER`] for [`nibbles_bf16`], whose first and last rounds take their
/// lanes in [`dp_order`] ([`differences_dp`], [`integers_dp`]).
const NIBBLE_GATHER_DP: [u8; 64] = nibble_gather(true);

/// The `vpermt2b` indices that gather the nibble bytes after three widen-and-narrow
/// rounds: the middle one in [`unpack_order`], the first and last in [`dp_order`]
/// (`dp`) or [`unpack_order`].
const fn nibble_gather(dp: bool) -> [u8; 64] {
    const fn outer(dp: bool, n: usize) -> usize {
        if dp { dp_order(n) } else { unpack_order(n) }
    }
    let mut g = [0u8; 64];
    let mut slot = 0;
    while slot < 32 {
        let e = outer(dp, unpack_order(outer(dp, slot)));
        g[e] = if slot < 16 {
            4 * slot
        } else {
            64 + 4 * (slot - 16)
        } as u8;
        slot += 1;
    }
    g
}

/// `lo` and `hi` rounded to bf16 (nearest even; subnormals flushed to zero), lanes 0..16
/// from `lo`.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
fn to_bf16(lo: __m512, hi: __m512) -> __m512i {
    // SAFETY: both are 512-bit plain vector types; every bit pattern is valid for either.
    unsafe { std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo)) }
}

/// [`to_bf16`] by integer rounding, for CPUs without AVX-512 BF16: each lane's bits plus
/// `0x7FFF` and the lsb of its high half (nearest even, `bf16_bits` on finite values and
/// infinities; the kernel never sees NaN), then the high halves of `lo`'s lanes and of
/// `hi`'s gathered in order by one `vpermt2w`. Subnormals are rounded, not flushed.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn to_bf16_int(lo: __m512, hi: __m512) -> __m512i {
    const HIGH_HALVES: [u16; 32] = {
        let mut t = [0u16; 32];
        let mut i = 0;
        while i < 32 {
            t[i] = (2 * i + 1) as u16;
            i += 1;
        }
        t
    };
    let round = |v: __m512| {
        let b = _mm512_castps_si512(v);
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
        _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)))
    };
    // SAFETY: `HIGH_HALVES` is 32 u16 = 64 bytes (one unaligned 512-bit load).
    let idx = unsafe { _mm512_loadu_si512(HIGH_HALVES.as_ptr().cast()) };
    _mm512_permutex2var_epi16(round(lo), idx, round(hi))
}

/// Proof that this CPU runs one of the bf16 nibble loops: [`nibbles_bf16`] or
/// [`nibbles_bf16_int`] (AVX-512 with VBMI, and BF16 for the first), or at AVX2
/// [`crate::quantize_avx2::nibbles_bf16`]. Found once by [`Bf16Nibbles::detect`] and held
/// by the quantize task: probing the features for every group (four checks per 128
/// values) was 5 % of the bf16 quantize profile.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bf16Nibbles {
    route: NibbleRoute,
}

/// Which loop [`Bf16Nibbles::run`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NibbleRoute {
    /// [`nibbles_bf16`]: AVX-512 BF16 rounds.
    Bf16,
    /// [`nibbles_bf16_int`]: AVX-512 without BF16.
    Int,
    /// [`crate::quantize_avx2::nibbles_bf16`].
    Avx2,
}

impl Bf16Nibbles {
    /// The proof for `level`, where this CPU has one of its loops: at AVX-512 (F, BW)
    /// with VBMI, or at AVX2.
    pub(crate) fn detect(level: Level) -> Option<Bf16Nibbles> {
        let has = |ext| quant_core::simd::has(ext);
        let route = match level {
            Level::Avx512 if level.is_supported() && has(quant_core::simd::Ext::Vbmi) => {
                if has(quant_core::simd::Ext::Bf16) {
                    NibbleRoute::Bf16
                } else {
                    NibbleRoute::Int
                }
            }
            Level::Avx2 if level.is_supported() => NibbleRoute::Avx2,
            _ => return None,
        };
        Some(Bf16Nibbles { route })
    }

    /// `u[i] = to_nibble(rb(rb(x[i] - min_val) * r))` for a group of bf16 bit patterns
    /// `xs` (the multiply form of `kernels::group_nibbles` on the bf16 path), each `rb`
    /// one `vcvtne2ps2bf16` per 32 values where the portable rounding takes five integer
    /// operations per 16. Returns `false` (nothing written) unless `xs` and `u` have the
    /// same length, a multiple of 32.
    ///
    /// The instruction flushes subnormal inputs and results to zero. The caller passes
    /// only scales of at least 2^-100 (`r <= 2^100`): a subnormal `t = x - min_val` then
    /// gives `|t * r| < 2^-26`, and a subnormal product is below 2^-126, both nibble 0
    /// whether flushed or not. Values are finite or infinite, never NaN (a group holding
    /// NaN or infinity has a NaN or infinite scale and takes the division).
    #[inline(always)]
    pub(crate) fn run(self, xs: &[u16], min_val: f32, r: f32, u: &mut [u8]) -> bool {
        if !(xs.len().is_multiple_of(32) && u.len() == xs.len()) {
            return false;
        }
        match self.route {
            // SAFETY: the CPU has AVX-512 F, BW, BF16 and VBMI (`self` exists only where
            // `detect` found them, this route only with BF16).
            NibbleRoute::Bf16 => unsafe { nibbles_bf16(xs, min_val, r, u) },
            // SAFETY: the CPU has AVX-512 F, BW and VBMI (`self` exists only where
            // `detect` found them).
            NibbleRoute::Int => unsafe { nibbles_bf16_int(xs, min_val, r, u) },
            NibbleRoute::Avx2 => return crate::quantize_avx2::nibbles_bf16(xs, min_val, r, u),
        }
        true
    }
}

/// `u[i] = to_nibble((x[i] - min_val) / scale)` for a group of f16 bit patterns (the f32
/// path of `kernels::group_nibbles`), 16 values per step ([`nibbles16_f16`]).
#[target_feature(enable = "avx512f")]
fn nibbles_f16(xs: &[u16], min_val: f32, scale: f32, u: &mut [u8]) {
    let (mn, sc) = (_mm512_set1_ps(min_val), _mm512_set1_ps(scale));
    for (x, o) in xs.chunks_exact(16).zip(u.chunks_exact_mut(16)) {
        // SAFETY: `x` is 16 u16 (one unaligned 256-bit load).
        let v = unsafe { _mm256_loadu_si256(x.as_ptr().cast()) };
        // SAFETY: `o` is 16 bytes (one unaligned 128-bit store).
        unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), nibbles16_f16(v, mn, sc)) };
    }
}

/// One step of [`nibbles_f16`] (also [`crate::batch_x86`]'s): the nibble bytes of 16 f16
/// values `v`, given `min_val` and the scale in every lane. Widened by `vcvtph2ps`
/// (exact), the subtraction and the IEEE division in f32 lanes, then
/// `qparams::to_nibble` as two clamps (`vmaxps` against 0 sends NaN and `-0` to `+0`, as
/// its selects do) and the 2^23 addition, whose low bytes `vpmovdb` gathers.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn nibbles16_f16(v: __m256i, mn: __m512, sc: __m512) -> __m128i {
    let q = _mm512_div_ps(_mm512_sub_ps(_mm512_cvtph_ps(v), mn), sc);
    // `vmaxps` returns its second operand when either is NaN or both are zeros.
    let c = _mm512_min_ps(_mm512_max_ps(q, _mm512_setzero_ps()), _mm512_set1_ps(15.0));
    _mm512_cvtepi32_epi8(_mm512_castps_si512(_mm512_add_ps(
        c,
        _mm512_set1_ps(8_388_608.0), // 2^23
    )))
}

/// Which f16 nibble kernel this CPU runs, found once per quantize task like
/// [`Bf16Nibbles`]: [`nibbles_f16`] (AVX-512 F) or
/// [`crate::quantize_avx2::nibbles_f16`] (AVX2 and F16C).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum F16Nibbles {
    /// [`nibbles_f16`].
    Avx512,
    /// [`crate::quantize_avx2::nibbles_f16`].
    Avx2,
}

impl F16Nibbles {
    /// The kernel of `level`, where the CPU has that level; `None` below AVX2.
    pub(crate) fn detect(level: Level) -> Option<F16Nibbles> {
        match level {
            Level::Avx512 if level.is_supported() => Some(F16Nibbles::Avx512),
            Level::Avx2 if level.is_supported() => Some(F16Nibbles::Avx2),
            _ => None,
        }
    }

    /// `u[i] = to_nibble((x[i] - min_val) / scale)` for f16 bit patterns `xs`, the f32
    /// path's nibbles for any `min_val` and `scale` (the division is the specification).
    /// Returns `false` (nothing written) unless `xs` and `u` have the same length, a
    /// multiple of 16.
    #[inline(always)]
    pub(crate) fn run(self, xs: &[u16], min_val: f32, scale: f32, u: &mut [u8]) -> bool {
        if !(xs.len().is_multiple_of(16) && u.len() == xs.len()) {
            return false;
        }
        match self {
            // SAFETY: the CPU has AVX-512 F (`self` is this variant only where `detect`
            // found it).
            F16Nibbles::Avx512 => unsafe { nibbles_f16(xs, min_val, scale, u) },
            F16Nibbles::Avx2 => return crate::quantize_avx2::nibbles_f16(xs, min_val, scale, u),
        }
        true
    }
}

/// Which packer this CPU runs (AVX-512 or AVX2), found once by [`Packer::detect`] and held by the
/// quantize task (like [`Bf16Nibbles`]) rather than probed for every row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Packer {
    /// [`pack_row`]: AVX-512 F and BW.
    Avx512,
    /// [`pack_row_vbmi`]: AVX-512 F, BW and VBMI.
    Vbmi,
    /// [`crate::quantize_avx2::pack_row`].
    Avx2,
}

impl Packer {
    /// The best packer of `level` this CPU has; `None` below AVX2.
    pub(crate) fn detect(level: Level) -> Option<Packer> {
        match level {
            Level::Avx512 if level.is_supported() => {
                Some(if quant_core::simd::has(quant_core::simd::Ext::Vbmi) {
                    Packer::Vbmi
                } else {
                    Packer::Avx512
                })
            }
            Level::Avx2 if level.is_supported() => Some(Packer::Avx2),
            _ => None,
        }
    }

    /// Packs one row's nibbles `u` into its words of `tile` ([`pack_row`]); `false`
    /// (nothing written) when the arguments do not fit together.
    #[inline(always)]
    pub(crate) fn run(self, u: &[u8], nr: usize, half: usize, tile: &mut [i32]) -> bool {
        match self {
            // SAFETY: `Vbmi` exists only where `detect` found AVX-512 F, BW and VBMI.
            Packer::Vbmi => unsafe { pack_row_vbmi(u, nr, half, tile) },
            // SAFETY: `Avx512` exists only where `detect` found AVX-512 F and BW.
            Packer::Avx512 => unsafe { pack_row(u, nr, half, tile) },
            Packer::Avx2 => crate::quantize_avx2::pack_row(u, nr, half, tile),
        }
    }
}

/// The byte of a slab's nibbles (`32·half` of them, block `p` at `32p`) that goes into
/// the low nibble of byte `o` of the slab's packed words (`[c][p]`: word `c·half + p`);
/// the high nibble's source is 8 further on. `None` past the slab's `16·half` bytes.
///
/// Byte `b` of block `p`'s word `c` is `u[s] | u[s + 8] << 4` with `s = 2c, 16 + 2c,
/// 2c + 1, 17 + 2c` for `b = 0, 1, 2, 3` (the bytes `V[2c], W[2c], V[2c+1], W[2c+1]` of
/// [`crate::kernels`]' `pack32`).
const fn packed_source(half: usize, o: usize) -> Option<usize> {
    if o >= 16 * half {
        return None;
    }
    let (w, b) = (o / 4, o % 4);
    let (c, p) = (w / half, w % half);
    let s = match b {
        0 => 2 * c,
        1 => 16 + 2 * c,
        2 => 2 * c + 1,
        _ => 17 + 2 * c,
    };
    Some(32 * p + s)
}

/// `vpermt2b` indices of [`pack_row_vbmi`] for `half` (1, 2 or 4): the low nibbles'
/// sources, then the high nibbles' (bytes past the slab read byte 0, never stored).
const fn pack_gather(half: usize) -> [[u8; 64]; 2] {
    let mut g = [[0u8; 64]; 2];
    let mut o = 0;
    while o < 64 {
        if let Some(s) = packed_source(half, o) {
            g[0][o] = s as u8;
            g[1][o] = (s + 8) as u8;
        }
        o += 1;
    }
    g
}

/// [`pack_gather`] of `half` = 1, 2, 4.
const PACK_GATHER: [[[u8; 64]; 2]; 3] = [pack_gather(1), pack_gather(2), pack_gather(4)];

/// [`pack_row`] with byte permutes: a slab's `32·half` nibble bytes (up to two
/// registers) are gathered twice by `vpermt2b`, straight into the `[c][p]` order of the
/// stored words, once for each byte's low nibble and once for its high one, which is
/// shifted up and ORed in: six operations and one masked store per slab, where
/// [`pack_row`] spends seven per 32-nibble block.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(crate) fn pack_row_vbmi(u: &[u8], nr: usize, half: usize, tile: &mut [i32]) -> bool {
    if !pack_fits(u, nr, half, tile) {
        return false;
    }
    let slab = 32 * half;
    let [lo_index, hi_index] = &PACK_GATHER[half.trailing_zeros() as usize];
    // SAFETY: 64 bytes each (unaligned 512-bit loads).
    let (lo_index, hi_index) = unsafe {
        (
            _mm512_loadu_si512(lo_index.as_ptr().cast()),
            _mm512_loadu_si512(hi_index.as_ptr().cast()),
        )
    };
    let mask = ((1u32 << (4 * half)) - 1) as u16;
    let first = u64::MAX >> (64 - slab.min(64));
    for (kot, us) in u.chunks_exact(slab).enumerate() {
        // SAFETY: the first mask reads `min(slab, 64)` bytes of `us`; the second load
        // runs only when `us` has 128 bytes (`half` = 4).
        let (a, b) = unsafe {
            let a = _mm512_maskz_loadu_epi8(first, us.as_ptr().cast());
            let b = match half {
                4 => _mm512_loadu_si512(us.as_ptr().add(64).cast()),
                _ => a,
            };
            (a, b)
        };
        let lo = _mm512_permutex2var_epi8(a, lo_index, b);
        let hi = _mm512_permutex2var_epi8(a, hi_index, b);
        let words = _mm512_or_si512(lo, _mm512_slli_epi16::<4>(hi));
        let at = (kot * LANES + nr * 4) * half;
        // SAFETY: the mask writes words `at .. at + 4·half`, inside the tile because it
        // covers the row's `k` columns (checked above); masked-off words are untouched.
        unsafe { _mm512_mask_storeu_epi32(tile.as_mut_ptr().add(at), mask, words) };
    }
    true
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use half::bf16;
    use quantfmt_testkit::XorShift64;

    /// [`F16Nibbles::run`] against `to_nibble((x - min_val) / scale)` on every f16
    /// pattern (NaN, infinities, zeros, subnormals), under qparams from an ordinary
    /// group's through boundary-exact quotients to subnormal, infinite and NaN scales
    /// and infinite offsets.
    #[test]
    fn f16_nibbles_equal_the_division_on_every_input() {
        use crate::qparams::to_nibble;
        let kernels: Vec<F16Nibbles> = [Level::Avx512, Level::Avx2]
            .into_iter()
            .filter_map(F16Nibbles::detect)
            .collect();
        if kernels.len() < 2 {
            eprintln!("note: this CPU lacks AVX-512 or AVX2: those f16 kernels skipped");
        }
        let xs: Vec<u16> = (0..=u16::MAX).collect();
        let wide: Vec<f32> = xs
            .iter()
            .map(|&b| half::f16::from_bits(b).to_f32())
            .collect();
        let mut u = vec![0xFFu8; xs.len()];
        let cases = [
            (-2.0f32, 4.0 / 15.0),
            (-7.5 * 0.25, 0.25),
            (0.0, 1.0),
            (-8.0 * 2.0f32.powi(-20), 2.0f32.powi(-20)),
            (-1e-3, 1e-45),
            (0.0, f32::MIN_POSITIVE),
            (-65504.0, 65504.0 * 2.0 / 15.0),
            (f32::NEG_INFINITY, 1.0),
            (f32::INFINITY, 1.0),
            (0.5, f32::INFINITY),
            (0.5, f32::NAN),
            (f32::NAN, 1.0),
            (-0.0, 3.0),
        ];
        for hw in kernels {
            for (min_val, scale) in cases {
                u.fill(0xFF);
                assert!(hw.run(&xs, min_val, scale, &mut u));
                for ((&b, &x), &got) in xs.iter().zip(&wide).zip(&u) {
                    let want = to_nibble((x - min_val) / scale);
                    assert_eq!(
                        got, want,
                        "{hw:?}: {b:#06x}, min {min_val:e}, scale {scale:e}"
                    );
                }
            }
            // Lengths that are not whole steps are refused, with nothing written.
            u.fill(0xFF);
            assert!(!hw.run(&xs[..24], 0.0, 1.0, &mut u[..24]));
            assert!(!hw.run(&xs[..32], 0.0, 1.0, &mut u[..16]));
            assert!(u.iter().all(|&b| b == 0xFF));
        }
    }

    /// `pack(u, nr, half, tile)` against the portable packer, word for word, for every
    /// `inner_k_tiles` (`half` 1, 2, 4), each row of the n-tile and rows of one to five
    /// slabs of random nibbles; words of other rows must keep their sentinel. The check
    /// of the AVX-512 and AVX2 packers.
    pub(crate) fn assert_packs_as_portable(
        what: &str,
        pack: impl Fn(&[u8], usize, usize, &mut [i32]) -> bool,
    ) {
        let mut rng = XorShift64::new(0x0BAC_CA1A);
        for half in [1, 2, 4] {
            for slabs in 1..=5 {
                let k = 32 * half * slabs;
                for nr in 0..8 {
                    let u: Vec<u8> = (0..k).map(|_| (rng.next_u64() % 16) as u8).collect();
                    let sentinel = vec![0x5A5A_5A5Ai32; k];
                    let mut want = sentinel.clone();
                    let portable = crate::kernels::Caps::new(Level::Scalar);
                    crate::kernels::pack_row(portable, &u, nr, 2 * half, &mut want);
                    assert_ne!(want, sentinel, "half {half} slabs {slabs} nr {nr}");
                    let mut got = sentinel.clone();
                    assert!(pack(&u, nr, half, &mut got), "{what} half {half}");
                    assert_eq!(got, want, "{what} half {half} slabs {slabs} nr {nr}");
                }
            }
        }
    }

    /// Both AVX-512 packers against the portable one, word for word, for every
    /// `inner_k_tiles` (`half` 1, 2, 4), each row of the n-tile and rows of one to five
    /// slabs of random nibbles; words of other rows keep their sentinel.
    #[test]
    fn packers_equal_the_portable_one() {
        if !Level::Avx512.is_supported() {
            eprintln!("note: no AVX-512 on this CPU (or level forced lower): skipped");
            return;
        }
        // SAFETY: the CPU has AVX-512 F and BW (checked above).
        assert_packs_as_portable("pack_row", |u, nr, half, tile| unsafe {
            pack_row(u, nr, half, tile)
        });
        if quant_core::simd::has(quant_core::simd::Ext::Vbmi) {
            // SAFETY: the CPU has AVX-512 F, BW and VBMI (checked above).
            assert_packs_as_portable("vbmi", |u, nr, half, tile| unsafe {
                pack_row_vbmi(u, nr, half, tile)
            });
        } else {
            eprintln!("note: no AVX-512 VBMI on this CPU: pack_row_vbmi not checked");
        }
    }

    /// The register tables against the portable ones, bit for bit: every bf16 scale
    /// (NaN, infinities, subnormals and zeros included) with random bf16 zeros, plus
    /// zeros chosen to make the sum's error term decide (`z` far below `p`, and sums
    /// that cancel).
    #[test]
    fn register_group_values_equal_the_portable_ones() {
        if !Level::Avx512.is_supported() {
            eprintln!("note: no AVX-512 on this CPU (or level forced lower): skipped");
            return;
        }
        let mut rng = XorShift64::new(0x00DD_BA11_5EED);
        let check = |s: f32, z: f32| {
            for odd in [false, true] {
                let mut want = [0f32; 16];
                match odd {
                    true => crate::kernels::group_values::<bf16>(s, z, &mut want),
                    false => crate::kernels::group_values::<f32>(s, z, &mut want),
                }
                // SAFETY: the CPU has AVX-512 F (checked above).
                let v = unsafe { group_values(s, z, odd) };
                // SAFETY: a 512-bit vector is 16 f32 of plain data.
                let got: [f32; 16] = unsafe { std::mem::transmute(v) };
                // NaN's sign and payload are unspecified (the compiler may negate
                // the portable product), as in the level tests.
                let key = |x: f32| if x.is_nan() { u32::MAX } else { x.to_bits() };
                assert_eq!(got.map(key), want.map(key), "s={s:e} z={z:e} odd={odd}");
                if odd {
                    narrowings_equal_the_portable_ones(v);
                }
            }
        };
        for sb in 0..=u16::MAX {
            let s = bf16::from_bits(sb).to_f32();
            for _ in 0..8 {
                check(s, bf16::from_bits(rng.next_u64() as u16).to_f32());
            }
            // A zero 2^-8..2^-40 of the scale, either sign, and one that cancels lane 15.
            let e = (rng.next_u64() % 33 + 8) as i32;
            let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
            check(s, bf16::from_f32(sign * s * 2f32.powi(-e)).to_f32());
            check(s, -7.0 * s);
        }
        // Each narrowing on its own over every class of f32: a strided sweep of all bit
        // patterns plus every rounding case of the low half-word.
        for b in (0u32..=u32::MAX).step_by(4099) {
            let lanes: [f32; 16] = std::array::from_fn(|i| {
                let low = [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x0FFF, 0x1000];
                f32::from_bits(if i < 8 { b } else { b & !0xFFFF | low[i - 8] })
            });
            // SAFETY: 16 f32 are one 512-bit vector of plain data.
            narrowings_equal_the_portable_ones(unsafe {
                std::mem::transmute::<[f32; 16], __m512>(lanes)
            });
        }
    }

    /// The three 16-bit narrowings of the register path against the portable ones
    /// (`bf16_bits`, which `narrow_slice` matches, and `half`'s f16 rounding): bf16 bit
    /// for bit, f16 with NaN's payload left free.
    fn narrowings_equal_the_portable_ones(v: __m512) {
        // SAFETY: a 512-bit vector is 16 f32 of plain data.
        let xs: [f32; 16] = unsafe { std::mem::transmute(v) };
        let bf16_want = xs.map(quant_core::dtype::bf16_bits);
        // SAFETY: the caller checked AVX-512 F and BW; 256 bits are 16 u16.
        let got: [u16; 16] = unsafe { std::mem::transmute(narrow16_int(v)) };
        assert_eq!(got, bf16_want, "bf16 lanes of {xs:?}");
        if quant_core::simd::has(quant_core::simd::Ext::Bf16) {
            // SAFETY: the CPU has AVX-512 F, BW, DQ and BF16 (checked); 512 bits are
            // 32 u16.
            let got: [u16; 32] = unsafe { std::mem::transmute(narrow32_exact(v, v)) };
            assert_eq!(got[..16], bf16_want, "vcvtne2ps2bf16 of {xs:?}");
        }
        let key = |h: half::f16| if h.is_nan() { u16::MAX } else { h.to_bits() };
        // SAFETY: the caller checked AVX-512 F; 256 bits are 16 u16.
        let got: [u16; 16] = unsafe { std::mem::transmute(f16_lanes(v)) };
        assert_eq!(
            got.map(|b| key(half::f16::from_bits(b))),
            xs.map(|x| key(half::f16::from_f32(x))),
            "f16 lanes of {xs:?}"
        );
    }
}
