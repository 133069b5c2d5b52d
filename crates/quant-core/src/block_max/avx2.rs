//! The block maxima at AVX2: one 8-lane (f32) or 16-lane (bf16, f16) maximum per block,
//! then several blocks folded together into one vector whose lane `b` is block `b`'s
//! maximum, as the AVX-512 kernels fold sixteen:
//! * f32: **eight blocks** in 32-bit lanes (two rounds of unpack-and-max, one
//!   cross-half permute);
//! * bf16 and f16: **sixteen blocks** in 16-bit lanes (three rounds and the permute),
//!   the folded 16-bit keys widened to f32 patterns once per eight blocks.
//!
//! The portable fold, which LLVM compiled into a horizontal reduction per block, was
//! 40 % of the MXFP8 quantize profile at AVX2.

use std::arch::x86_64::{
    __m128i, __m256i, _mm256_and_si256, _mm256_andnot_si256, _mm256_castps_si256,
    _mm256_castsi256_si128, _mm256_cmpgt_epi16, _mm256_cmpgt_epi32, _mm256_cvtepu16_epi32,
    _mm256_cvtph_ps, _mm256_extracti128_si256, _mm256_loadu_si256, _mm256_max_epu16,
    _mm256_max_epu32, _mm256_permute2x128_si256, _mm256_set1_epi16, _mm256_set1_epi32,
    _mm256_setzero_si256, _mm256_slli_epi32, _mm256_storeu_si256, _mm256_unpackhi_epi16,
    _mm256_unpackhi_epi32, _mm256_unpackhi_epi64, _mm256_unpacklo_epi16, _mm256_unpacklo_epi32,
    _mm256_unpacklo_epi64,
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

/// Stores `v` (8 u32 lanes each, in order) into `o`, which holds at most `8 * N`
/// values: straight where it holds them all, else through a buffer. (Every group
/// through the buffer was a `memcpy` call each, `copy_from_slice` of a length known only
/// at run time: 4 % of the NVFP4 rowwise quantize's profile.)
#[inline]
#[target_feature(enable = "avx2")]
fn store_lanes<const N: usize>(o: &mut [u32], v: [__m256i; N]) {
    if o.len() == GROUP * N {
        for (vi, o8) in v.into_iter().zip(o.chunks_exact_mut(GROUP)) {
            // SAFETY: `o8` is 8 u32 = 32 bytes (one unaligned 256-bit store).
            unsafe { _mm256_storeu_si256(o8.as_mut_ptr().cast(), vi) };
        }
    } else {
        let mut m = [[0u32; GROUP]; N];
        for (vi, m8) in v.into_iter().zip(m.iter_mut()) {
            // SAFETY: `m8` is 8 u32 = 32 bytes (one unaligned 256-bit store).
            unsafe { _mm256_storeu_si256(m8.as_mut_ptr().cast(), vi) };
        }
        let len = o.len();
        o.copy_from_slice(&m.as_flattened()[..len]);
    }
}

/// Calls `lanes(b)` (block `b`'s lane maxima, 8 u32 lanes) for every block and stores
/// the blocks' maxima into `out`, eight at a time (the last group padded with zeros).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn fold_blocks(out: &mut [u32], lanes: impl Fn(usize) -> __m256i) {
    for (g, o) in out.chunks_mut(GROUP).enumerate() {
        let mut v = [_mm256_setzero_si256(); GROUP];
        for (b, vb) in v.iter_mut().enumerate().take(o.len()) {
            *vb = lanes(g * GROUP + b);
        }
        store_lanes(o, [fold8(&v)]);
    }
}

/// Blocks folded together in 16-bit lanes.
const GROUP16: usize = 16;

/// Sixteen 16-lane (u16) vectors `v(0)..v(16)` folded into one whose lane `b` is the
/// maximum of `v(b)`'s lanes: four rounds of unpack-and-max (16-, 32- and 64-bit
/// unpacks within each 128-bit half, then one across the halves). After round `r` each
/// 128-bit half holds `2^r` partial maxima of each of `2^r` vectors, in vector order;
/// the last round leaves vectors 0..8 in the low half and 8..16 in the high one. The
/// tree is folded as the vectors come (depth first), so that few are live at once:
/// sixteen loaded first spilled (AVX2 has sixteen registers).
#[inline]
#[target_feature(enable = "avx2")]
fn fold16(v: impl Fn(usize) -> __m256i) -> __m256i {
    macro_rules! round {
        ($lo:ident, $hi:ident) => {
            |a: __m256i, b: __m256i| _mm256_max_epu16($lo(a, b), $hi(a, b))
        };
    }
    let r16 = round!(_mm256_unpacklo_epi16, _mm256_unpackhi_epi16);
    let r32 = round!(_mm256_unpacklo_epi32, _mm256_unpackhi_epi32);
    let r64 = round!(_mm256_unpacklo_epi64, _mm256_unpackhi_epi64);
    let a = |i: usize| r16(v(2 * i), v(2 * i + 1));
    let b = |i: usize| r32(a(2 * i), a(2 * i + 1));
    let c = |i: usize| r64(b(2 * i), b(2 * i + 1));
    let (c0, c1) = (c(0), c(1));
    _mm256_max_epu16(
        _mm256_permute2x128_si256::<0x20>(c0, c1),
        _mm256_permute2x128_si256::<0x31>(c0, c1),
    )
}

/// [`fold_blocks`] for 16-bit keys: `lanes(b)` is block `b`'s 16 lane maxima (u16), and
/// sixteen blocks are folded at a time in 16-bit lanes ([`fold16`]), each half of the
/// folded vector (8 keys) turned into 8 u32 outputs by `finish`. Folding in 16-bit lanes
/// takes about two thirds of the operations per block of widening each block's maxima
/// to 32-bit lanes first and folding eight blocks (about 7 against 11 per NVFP4 block,
/// the keys included): the block maxima were a sixth of the NVFP4 rowwise quantize at
/// AVX2.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn fold_blocks16(
    out: &mut [u32],
    lanes: impl Fn(usize) -> __m256i,
    finish: impl Fn(__m128i) -> __m256i,
) {
    for (g, o) in out.chunks_mut(GROUP16).enumerate() {
        let len = o.len();
        let f = if len == GROUP16 {
            fold16(|b| lanes(g * GROUP16 + b))
        } else {
            // The last group's missing blocks are zeros (every key is at least 0).
            fold16(|b| {
                if b < len {
                    lanes(g * GROUP16 + b)
                } else {
                    _mm256_setzero_si256()
                }
            })
        };
        let halves = [
            finish(_mm256_castsi256_si128(f)),
            finish(_mm256_extracti128_si256::<1>(f)),
        ];
        store_lanes(o, halves);
    }
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
    fold_blocks(out, lanes)
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
    let lanes = |b: usize| max16(&xs[b * n..(b + 1) * n], |x| keys16(x, inf, nan));
    // The key as an f32 pattern: `key16 << 16`.
    fold_blocks16(out, lanes, |h| {
        _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h))
    })
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
    let lanes = |b: usize| max16(&xs[b * n..(b + 1) * n], |x| keys16(x, 0x7C00, nan));
    fold_blocks16(out, lanes, |h| _mm256_castps_si256(_mm256_cvtph_ps(h)))
}
