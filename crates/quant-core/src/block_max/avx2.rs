//! The block maxima at AVX2: one 8-lane (f32) or 16-lane (bf16) maximum per block, then
//! **eight blocks folded together** into one vector whose lane `b` is block `b`'s
//! maximum (two rounds of unpack-and-max, one cross-half permute), as the AVX-512
//! kernels fold sixteen. The portable fold, which LLVM compiled into a horizontal
//! reduction per block, was 40 % of the MXFP8 quantize profile at AVX2. f16 blocks fold
//! their 16-bit magnitudes as bf16 blocks do and are widened once per eight blocks.

use std::arch::x86_64::{
    __m256i, _mm_packus_epi32, _mm256_and_si256, _mm256_andnot_si256, _mm256_castps_si256,
    _mm256_castsi256_si128, _mm256_cmpgt_epi16, _mm256_cmpgt_epi32, _mm256_cvtph_ps,
    _mm256_extracti128_si256, _mm256_loadu_si256, _mm256_max_epu16, _mm256_max_epu32,
    _mm256_permute2x128_si256, _mm256_set1_epi16, _mm256_set1_epi32, _mm256_setzero_si256,
    _mm256_slli_epi32, _mm256_srli_epi32, _mm256_storeu_si256, _mm256_unpackhi_epi32,
    _mm256_unpackhi_epi64, _mm256_unpacklo_epi32, _mm256_unpacklo_epi64,
};

use super::{INF_BITS, NanRule};

/// Blocks folded together.
const GROUP: usize = 8;

/// The keys ([`NanRule::key`]) of 8 f32 values.
#[inline]
#[target_feature(enable = "avx2")]
fn keys32(x: __m256i, nan: NanRule) -> __m256i {
    let a = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFF_FFFF));
    match nan {
        // A signed compare is right: `a` is at most `0x7FFF_FFFF`.
        NanRule::Ignore => {
            _mm256_andnot_si256(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(INF_BITS as i32)), a)
        }
        NanRule::Propagate => a,
    }
}

/// The 16-bit keys of 16 bf16 or f16 values: the magnitude bits, NaN (above `inf`, the
/// format's infinity) zero under [`NanRule::Ignore`] (for bf16 [`NanRule::key`]'s high
/// half).
#[inline]
#[target_feature(enable = "avx2")]
fn keys16(x: __m256i, inf: i16, nan: NanRule) -> __m256i {
    let a = _mm256_and_si256(x, _mm256_set1_epi16(0x7FFF));
    match nan {
        // A signed compare is right: `a` is at most `0x7FFF`.
        NanRule::Ignore => _mm256_andnot_si256(_mm256_cmpgt_epi16(a, _mm256_set1_epi16(inf)), a),
        NanRule::Propagate => a,
    }
}

/// Eight 8-lane vectors folded into one whose lane `b` is the maximum of `v[b]`'s lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn fold8(v: &[__m256i; GROUP]) -> __m256i {
    let pair = |a, b| _mm256_max_epu32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    let quad = |a, b| _mm256_max_epu32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
    // Per 128-bit half: lane `i` of `q0` is the half's maximum of `v[i]` (i < 4).
    let q0 = quad(pair(v[0], v[1]), pair(v[2], v[3]));
    let q1 = quad(pair(v[4], v[5]), pair(v[6], v[7]));
    _mm256_max_epu32(
        _mm256_permute2x128_si256::<0x20>(q0, q1),
        _mm256_permute2x128_si256::<0x31>(q0, q1),
    )
}

/// Calls `lanes(b)` (block `b`'s lane maxima, 8 u32 lanes) for every block and stores
/// the blocks' maxima into `out`, eight at a time (the last group padded with zeros),
/// each group's folded vector passed through `finish` (a monotone map of the lanes).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn fold_blocks(
    out: &mut [u32],
    lanes: impl Fn(usize) -> __m256i,
    finish: impl Fn(__m256i) -> __m256i,
) {
    for (g, o) in out.chunks_mut(GROUP).enumerate() {
        let mut v = [_mm256_setzero_si256(); GROUP];
        for (b, vb) in v.iter_mut().enumerate().take(o.len()) {
            *vb = lanes(g * GROUP + b);
        }
        let folded = finish(fold8(&v));
        if o.len() == GROUP {
            // SAFETY: `o` is 8 u32 = 32 bytes (one unaligned 256-bit store).
            unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), folded) };
        } else {
            // A short last group goes through a buffer: `copy_from_slice` of a length
            // known only at run time is a `memcpy` call, which was 4 % of the NVFP4
            // rowwise quantize's profile when every group took it.
            let mut m = [0u32; GROUP];
            // SAFETY: `m` is 8 u32 = 32 bytes (one unaligned 256-bit store).
            unsafe { _mm256_storeu_si256(m.as_mut_ptr().cast(), folded) };
            o.copy_from_slice(&m[..o.len()]);
        }
    }
}

/// A block's 16-bit lane maxima `m` folded pairwise into the low halves of its 8
/// 32-bit lanes (the high halves zero).
#[inline]
#[target_feature(enable = "avx2")]
fn low_halves(m: __m256i) -> __m256i {
    _mm256_and_si256(
        _mm256_max_epu16(m, _mm256_srli_epi32::<16>(m)),
        _mm256_set1_epi32(0xFFFF),
    )
}

/// A block's 16-bit lane maxima of `n` 16-bit values from `block`, keyed by `keys`.
#[inline]
#[target_feature(enable = "avx2")]
fn max16(block: &[u16], keys: impl Fn(__m256i) -> __m256i) -> __m256i {
    let mut m = _mm256_setzero_si256();
    for c in block.chunks_exact(16) {
        // SAFETY: `c` is 16 u16 (one unaligned 256-bit load).
        let x = unsafe { _mm256_loadu_si256(c.as_ptr().cast()) };
        m = _mm256_max_epu16(m, keys(x));
    }
    m
}

/// [`super::block_abs_max`] at AVX2: `xs` holds `out.len()` blocks of `n` values, `n` a
/// nonzero multiple of 8. (Compiled with F16C too, as every kernel here: the level
/// includes it, and kernels of one feature set inline each other's helpers.)
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn block_abs_max(xs: &[f32], n: usize, nan: NanRule, out: &mut [u32]) {
    debug_assert!(n > 0 && n.is_multiple_of(8) && xs.len() == n * out.len());
    let lanes = |b: usize| {
        let block = &xs[b * n..(b + 1) * n];
        let mut m = _mm256_setzero_si256();
        for c in block.chunks_exact(8) {
            // SAFETY: `c` is 8 f32 (one unaligned 256-bit load).
            let x = unsafe { _mm256_loadu_si256(c.as_ptr().cast()) };
            m = _mm256_max_epu32(m, keys32(x, nan));
        }
        m
    };
    fold_blocks(out, lanes, |v| v)
}

/// [`super::block_abs_max_bf16`] at AVX2: `xs` holds `out.len()` blocks of `n` values,
/// `n` a nonzero multiple of 16. Each block's 16-bit lane maxima are folded pairwise
/// into 8 u32 lanes (the high half of each 32-bit lane maxed into the low), the eight
/// blocks' vectors folded together, and the 16-bit keys moved into place as f32
/// patterns.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn block_abs_max_bf16(xs: &[u16], n: usize, nan: NanRule, out: &mut [u32]) {
    debug_assert!(n > 0 && n.is_multiple_of(16) && xs.len() == n * out.len());
    let inf = (INF_BITS >> 16) as i16;
    // The key as an f32 pattern: `key16 << 16`.
    let lanes = |b: usize| {
        let m = max16(&xs[b * n..(b + 1) * n], |x| keys16(x, inf, nan));
        _mm256_slli_epi32::<16>(low_halves(m))
    };
    fold_blocks(out, lanes, |v| v)
}

/// [`super::block_abs_max_f16`] at AVX2: as [`block_abs_max_bf16`], on the f16
/// magnitudes (NaN above `0x7C00`), whose order is their values' order; the eight
/// blocks' folded maxima are widened once at the end (`vcvtph2ps`, exact), their f32
/// patterns the keys of the widened values.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn block_abs_max_f16(xs: &[u16], n: usize, nan: NanRule, out: &mut [u32]) {
    debug_assert!(n > 0 && n.is_multiple_of(16) && xs.len() == n * out.len());
    let lanes = |b: usize| low_halves(max16(&xs[b * n..(b + 1) * n], |x| keys16(x, 0x7C00, nan)));
    fold_blocks(out, lanes, |v| {
        // Each lane is at most 0x7FFF: `vpackusdw` keeps it; lanes 0..4 and 4..8 sit in
        // the two 128-bit halves.
        let h = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        _mm256_castps_si256(_mm256_cvtph_ps(h))
    });
}
