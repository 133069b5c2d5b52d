//! The AVX2 lookup of the int4 dequantize: a row's 32-wide blocks turned into outputs
//! from their group's 16-entry table, 16 nibbles per vector.
//!
//! The nibbles come out of a block's four words as [`crate::kernels`]' portable
//! `unpack32` takes them (word `c` shifted right by `4q` and masked with `0x000F000F`
//! holds nibbles `2i` and `2i + 1`, `i = 4q + c`, as two u16 lanes), here by two
//! variable shifts of the words broadcast to both halves. A 16-bit output (bf16, f16) looks its nibble up in
//! the table's low and high bytes with two `vpshufb`; an f32 output in the table's two
//! halves with two `vpermd`, the nibble's bit 3 choosing between them. The portable
//! loop, an indexed load per output, was 40 % of the int4tiled dequantize at AVX2.
//!
//! A row is walked group by group, the group's table loaded once: finding each block's
//! group by a division (`32 b / g`, `g` known only at run time) was most of the f32
//! lookup's time (x1.8-1.9 in process without it, 24.7 -> 13.3 ms at 8192^2 on two Zen 4
//! cores). f32 rows are streamed where the caller's mode says so and the row is 16-byte
//! aligned (two 128-bit streaming stores per vector; x1.05-1.15 in process).

use std::arch::x86_64::{
    __m128i, __m256i, _mm_and_si128, _mm_loadu_si128, _mm_packus_epi16, _mm_set1_epi16,
    _mm_srli_epi16, _mm_stream_si128, _mm256_and_si256, _mm256_blendv_epi8,
    _mm256_broadcastsi128_si256, _mm256_castsi256_si128, _mm256_cmpgt_epi32, _mm256_cvtepu16_epi32,
    _mm256_extracti128_si256, _mm256_loadu_si256, _mm256_or_si256, _mm256_permutevar8x32_epi32,
    _mm256_set1_epi16, _mm256_set1_epi32, _mm256_setr_epi32, _mm256_shuffle_epi8,
    _mm256_slli_epi16, _mm256_srlv_epi32, _mm256_storeu_si256,
};

use quant_core::simd::Level;
use quant_core::stream::StoreMode;
use quant_core::{DType, Element};

/// [`lookup_u16`] or [`lookup_f32`], as `T` is: `out[32b + j] = tables[32b / g][u_j]`.
/// `false` (nothing written) where neither applies; the caller then looks up value by
/// value.
#[inline(always)]
pub(crate) fn lookup<T: Element>(
    tables: &[[T; 16]],
    g: usize,
    words: impl Fn(usize) -> [u32; 4],
    out: &mut [T],
    mode: StoreMode,
) -> bool {
    match T::DTYPE {
        DType::F32 => match (
            bytemuck::try_cast_slice::<[T; 16], [f32; 16]>(tables),
            bytemuck::try_cast_slice_mut::<T, f32>(out),
        ) {
            (Ok(t), Ok(o)) => lookup_f32(t, g, words, o, mode),
            _ => false,
        },
        DType::BF16 | DType::F16 => match (
            bytemuck::try_cast_slice::<[T; 16], [u16; 16]>(tables),
            bytemuck::try_cast_slice_mut::<T, u16>(out),
        ) {
            (Ok(t), Ok(o)) => lookup_u16(t, g, words, o),
            _ => false,
        },
        _ => false,
    }
}

/// A block's 32 nibbles as u16 lanes (nibble `j` in lane `j`: lanes 0..16 in the first
/// vector, 16..32 in the second), from its four words: `unpack32`'s shifts and mask.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles(words: [u32; 4]) -> [__m256i; 2] {
    // SAFETY: `words` is 16 bytes (one unaligned 128-bit load).
    let w = unsafe { _mm_loadu_si128(words.as_ptr().cast()) };
    let w = _mm256_broadcastsi128_si256(w);
    let mask = _mm256_set1_epi32(0x000F_000F);
    let lo = _mm256_srlv_epi32(w, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    let hi = _mm256_srlv_epi32(w, _mm256_setr_epi32(8, 8, 8, 8, 12, 12, 12, 12));
    [_mm256_and_si256(lo, mask), _mm256_and_si256(hi, mask)]
}

/// Whether the lookups can take a row: the CPU has AVX2, the row is whole 32-wide
/// blocks, groups are whole blocks and there is a table per group.
#[inline(always)]
fn fits(tables: usize, g: usize, out: usize) -> bool {
    out.is_multiple_of(32)
        && g > 0
        && g.is_multiple_of(32)
        && tables * g >= out
        && Level::Avx2.is_supported()
}

/// Looks up every 32-wide block of a 16-bit row: `out[32b + j] = tables[32b / g][u_j]`
/// for nibble `u_j` of `words(b)`. `false` (nothing written) unless the CPU has AVX2
/// and the lengths fit (`out` whole blocks, `g` a multiple of 32, a table per group).
#[inline(always)]
pub(crate) fn lookup_u16(
    tables: &[[u16; 16]],
    g: usize,
    words: impl Fn(usize) -> [u32; 4],
    out: &mut [u16],
) -> bool {
    if !fits(tables.len(), g, out.len()) {
        return false;
    }
    // SAFETY: the CPU has AVX2 and the lengths fit (both checked by `fits`).
    unsafe { lookup_u16_avx2(tables, g, words, out) };
    true
}

/// [`lookup_u16`] after its checks. It carries all of the AVX2 level's features:
/// `words` is a closure of the dispatched caller, which a function with fewer features
/// could not inline.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn lookup_u16_avx2(
    tables: &[[u16; 16]],
    g: usize,
    words: impl Fn(usize) -> [u32; 4],
    out: &mut [u16],
) {
    // Group by group, its table loaded once (a division per block, `32 b / g`, cost
    // more than the block's lookups).
    for (gi, og) in out.chunks_mut(g).enumerate() {
        let [low, high] = byte_tables(&tables[gi]);
        for (bb, ob) in og.chunks_exact_mut(32).enumerate() {
            let b = gi * (g / 32) + bb;
            for (u, o) in nibbles(words(b)).into_iter().zip(ob.chunks_exact_mut(16)) {
                // Both bytes of each lane index the nibble's entry.
                let idx = _mm256_or_si256(u, _mm256_slli_epi16::<8>(u));
                let lo = _mm256_and_si256(_mm256_shuffle_epi8(low, idx), _mm256_set1_epi16(0x00FF));
                let hi = _mm256_and_si256(
                    _mm256_shuffle_epi8(high, idx),
                    _mm256_set1_epi16(0xFF00_u16 as i16),
                );
                // SAFETY: `o` is 16 u16 (one unaligned 256-bit store).
                unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), _mm256_or_si256(lo, hi)) };
            }
        }
    }
}

/// A 16-entry u16 table's low bytes and high bytes, each broadcast to both halves (the
/// 16-byte tables `vpshufb` reads).
#[inline]
#[target_feature(enable = "avx2")]
fn byte_tables(t: &[u16; 16]) -> [__m256i; 2] {
    // SAFETY: `t` is 32 bytes (two unaligned 128-bit loads).
    let (a, b) = unsafe {
        (
            _mm_loadu_si128(t.as_ptr().cast()),
            _mm_loadu_si128(t[8..].as_ptr().cast()),
        )
    };
    let m = _mm_set1_epi16(0x00FF);
    let pack = |a: __m128i, b: __m128i| _mm256_broadcastsi128_si256(_mm_packus_epi16(a, b));
    [
        pack(_mm_and_si128(a, m), _mm_and_si128(b, m)),
        pack(_mm_srli_epi16::<8>(a), _mm_srli_epi16::<8>(b)),
    ]
}

/// [`lookup_u16`] for f32 rows: the nibble's entry from the table's first or second
/// eight (`vpermd` on its low three bits, bit 3 choosing).
#[inline(always)]
pub(crate) fn lookup_f32(
    tables: &[[f32; 16]],
    g: usize,
    words: impl Fn(usize) -> [u32; 4],
    out: &mut [f32],
    mode: StoreMode,
) -> bool {
    if !fits(tables.len(), g, out.len()) {
        return false;
    }
    let stream = mode == StoreMode::Streaming && out.as_ptr().cast::<u8>().align_offset(16) == 0;
    // SAFETY: the CPU has AVX2 and the lengths fit (both checked by `fits`); a streamed
    // row is 16-byte aligned (checked here).
    unsafe { lookup_f32_avx2(tables, g, words, out, stream) };
    true
}

/// [`lookup_f32`] after its checks, with all of the AVX2 level's features as
/// [`lookup_u16_avx2`].
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn lookup_f32_avx2(
    tables: &[[f32; 16]],
    g: usize,
    words: impl Fn(usize) -> [u32; 4],
    out: &mut [f32],
    stream: bool,
) {
    let seven = _mm256_set1_epi32(7);
    // Group by group, as `lookup_u16_avx2`.
    for (gi, og) in out.chunks_mut(g).enumerate() {
        let t = &tables[gi];
        // SAFETY: `t` is 16 f32 (two unaligned 256-bit loads).
        let (t0, t1) = unsafe {
            (
                _mm256_loadu_si256(t.as_ptr().cast()),
                _mm256_loadu_si256(t[8..].as_ptr().cast()),
            )
        };
        for (bb, ob) in og.chunks_exact_mut(32).enumerate() {
            let b = gi * (g / 32) + bb;
            let [n0, n1] = nibbles(words(b));
            let halves = [
                _mm256_castsi256_si128(n0),
                _mm256_extracti128_si256::<1>(n0),
                _mm256_castsi256_si128(n1),
                _mm256_extracti128_si256::<1>(n1),
            ];
            for (h, o) in halves.into_iter().zip(ob.chunks_exact_mut(8)) {
                let u = _mm256_cvtepu16_epi32(h);
                let v = _mm256_blendv_epi8(
                    _mm256_permutevar8x32_epi32(t0, u),
                    _mm256_permutevar8x32_epi32(t1, u),
                    _mm256_cmpgt_epi32(u, seven),
                );
                if stream {
                    // SAFETY: `o` is 8 f32 = 32 bytes, 16-byte aligned (checked by the
                    // caller: every block of a 16-byte aligned row is); two 128-bit
                    // streaming stores.
                    unsafe {
                        let p = o.as_mut_ptr().cast::<__m128i>();
                        _mm_stream_si128(p, _mm256_castsi256_si128(v));
                        _mm_stream_si128(p.add(1), _mm256_extracti128_si256::<1>(v));
                    }
                } else {
                    // SAFETY: `o` is 8 f32 (one unaligned 256-bit store).
                    unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), v) };
                }
            }
        }
    }
}
