//! The AVX2 columnwise dequantize, transposed in registers: the twin of
//! [`crate::transposed_x86`] for CPUs without AVX-512.
//!
//! [`transposed_blocks`] (AVX2) stages 64 bytes of 64 stored rows in L1 and transposes
//! them 32 rows at a time: vectors `t` of the two halves are then byte `p + t` of 64
//! stored rows, output rows `2(p + t)` (low nibbles) and `2(p + t) + 1` (high) at 64
//! columns. Each row's codes are decoded 8 at a time by one `vpermps` and a sign `xor`
//! ([`e2m1_8`], the AVX2 row decoder's step), scaled by their columns' factors,
//! narrowed in registers and streamed as whole lines (two lines of bf16 or f16, four
//! of f32, back to back). Where a block's factors are all finite no product is NaN,
//! and bf16 narrows without the NaN select.
//! [`crate::transposed_x86::decode_lines`] checks what this route takes (the shapes of
//! the AVX-512 route, without RHT) and calls [`into`] at [`Level::Avx2`]. RHT operands
//! keep the tile route at AVX2: this walk with the AVX2 tile route's inverse transform
//! (`rht_avx2::inverse_nibbles`, per 16-row group from 8 staged lines, as at AVX-512)
//! measured x0.97 against it, the inverse's sums being the time and the tile's 128-bit
//! transposes cheap beside them.
//!
//! Into bf16 and f16, a 16-row group whose factors keep every output normal skips the
//! f32 products altogether ([`decode16`]): each column's outputs are `T(f)` or
//! `T(1.5 f)` times a power of two, so 16 codes at a time become a base chosen by
//! `vpshufb` lookups on the nibble plus an exponent step, about 0.6 operations per
//! value against 1.5 (x1.34-1.38 into bf16, x1.14-1.27 into f16 in the CLI). The f32
//! route is compute-bound at 8 lanes; this one runs 16 values per vector.
//!
//! [`Level::Avx2`]: quant_core::simd::Level::Avx2

use std::arch::x86_64::{
    __m256, __m256i, _mm_loadu_si128, _mm256_add_epi16, _mm256_and_si256, _mm256_andnot_si256,
    _mm256_blendv_epi8, _mm256_broadcastsi128_si256, _mm256_castps_si256, _mm256_cmpeq_epi16,
    _mm256_max_epu16, _mm256_min_epu16, _mm256_movemask_epi8, _mm256_mul_ps,
    _mm256_permute4x64_epi64, _mm256_set1_epi8, _mm256_set1_epi16, _mm256_set1_ps,
    _mm256_shuffle_epi8, _mm256_srli_epi16, _mm256_srli_epi32, _mm256_sub_epi16,
    _mm256_unpackhi_epi8, _mm256_unpacklo_epi8,
};

use quant_core::Element;
use quant_core::dtype::FloatsMut;
use quant_core::stream::avx2::{
    bf16_line, f16_line, load_f32x32, stream_lines, transposed_blocks, widen_u8x32,
};

use crate::scale::BLOCK;
use crate::transposed_x86::{MAX_ROWS, Walk};
use crate::x86_avx2::{decode_table, e2m1_8};

/// Output columns per visit: a 64-row block of [`transposed_blocks`] (the factor
/// closure's width at both levels).
const COLS: usize = 64;
/// Output columns per vector: 32 stored rows.
const HALF: usize = 32;

/// [`crate::transposed_x86::decode_lines`] at AVX2, after its checks (and without RHT):
/// `false` (nothing written) where `T` is not a float type.
pub(crate) fn into<T: Element>(
    walk: &Walk<'_>,
    factors: impl FnMut(usize, &mut [f32]),
    out: &mut [T],
) -> bool {
    match FloatsMut::of(out) {
        // SAFETY: the CPU has the AVX2 level's features (`decode_lines` runs this only
        // at `Level::Avx2`, which is only active where it does).
        Some(FloatsMut::F32(o)) => unsafe { into_f32(walk, factors, o) },
        // SAFETY: as above.
        Some(FloatsMut::Bf16(o)) => unsafe { into_bf16(walk, factors, o) },
        // SAFETY: as above (`Level::Avx2` includes F16C).
        Some(FloatsMut::F16(o)) => unsafe { into_f16(walk, factors, o) },
        None => return false,
    }
    true
}

/// The 32 codes in the low (or `high`) nibbles of `c`'s bytes, decoded by [`e2m1_8`]
/// from `table` (the positive half of [`quant_core::codec::e2m1::DECODE`],
/// [`decode_table`]) and times the factors `s` of their columns: the portable
/// `s * e2m1(code)`, exactly.
#[inline]
#[target_feature(enable = "avx2")]
fn decode32(c: __m256i, high: bool, s: &[__m256; 4], table: __m256) -> [__m256; 4] {
    let c = widen_u8x32(c);
    let one = |l: usize| {
        let codes = if high {
            _mm256_srli_epi32::<4>(c[l])
        } else {
            c[l]
        };
        _mm256_mul_ps(s[l], e2m1_8(table, codes))
    };
    [one(0), one(1), one(2), one(3)]
}

/// A 16-bit output type of the walk, for its decode in 16-bit lanes ([`decode16`]).
///
/// Every E2M1 magnitude is `2^k` or `1.5 * 2^k` (`k` in `-1..=2`), so in a column of
/// factor `f` the portable `T(e2m1(code) * f)` takes only two values up to a power of
/// two: `A = T(f)` and `B = T(f32(1.5 * f))`, times `2^k`. Where the products and both
/// roundings stay normal, scaling by `2^k` commutes with them, and `T(e2m1(code) * f)`
/// is `A` or `B` with `k` added to its exponent field: one integer add on the bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Half16 {
    Bf16,
    F16,
}

impl Half16 {
    /// The exponent field's lowest bit (`2^k` adds `k` of these to the bits).
    const fn unit(self) -> u16 {
        match self {
            Half16::Bf16 => 1 << 7,
            Half16::F16 => 1 << 10,
        }
    }

    /// The bits a base `A` or `B` may have: a positive normal value whose exponent
    /// field is at least 3 (so `A / 2` is normal however `f` rounded to `A`; for bf16,
    /// `f / 2` is a normal f32 too) and at most 251 for bf16, 28 for f16 (so `4 A` is
    /// finite). Outside, the group takes the f32 decode.
    const fn bounds(self) -> (u16, u16) {
        match self {
            Half16::Bf16 => (3 << 7, (252 << 7) - 1),
            Half16::F16 => (3 << 10, (29 << 10) - 1),
        }
    }

    /// Byte tables by code `n` (`vpshufb` indices 0..16): the low and high bytes of
    /// what the code adds to its base, `k + 1` units and the sign (`(mag >> 1) * unit |
    /// sign << 15`, for magnitude index `mag = n & 7`), the base being the column's `A`
    /// or `B` already halved ([`bases`]); whether the code takes `B` (magnitudes 1.5, 3
    /// and 6); whether it is a zero (no base, the sign alone).
    const fn tables(self) -> [[u8; 16]; 4] {
        let mut t = [[0u8; 16]; 4];
        let mut n = 0;
        while n < 16 {
            let mag = n & 7;
            let add = ((mag as u16 >> 1) * self.unit()) | ((n as u16 >> 3) << 15);
            t[0][n] = add as u8;
            t[1][n] = (add >> 8) as u8;
            t[2][n] = if mag >= 3 && mag % 2 == 1 { 0xFF } else { 0 };
            t[3][n] = if mag == 0 { 0xFF } else { 0 };
            n += 1;
        }
        t
    }
}

/// [`Half16::tables`] in registers, each broadcast to both 128-bit halves, and the
/// byte mask that takes a word's high byte from the second table.
struct Tables16 {
    lo: __m256i,
    hi: __m256i,
    b: __m256i,
    zero: __m256i,
    odd: __m256i,
}

impl Tables16 {
    #[inline]
    #[target_feature(enable = "avx2")]
    fn new(kind: Half16) -> Tables16 {
        let t = kind.tables();
        // SAFETY: each table is 16 bytes (one unaligned 128-bit load).
        let load = |t: &[u8; 16]| unsafe {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr().cast()))
        };
        Tables16 {
            lo: load(&t[0]),
            hi: load(&t[1]),
            b: load(&t[2]),
            zero: load(&t[3]),
            odd: _mm256_set1_epi16(0xFF00_u16 as i16),
        }
    }
}

/// The halved bases of 32 columns (factors `s`, in order) for [`decode16`]: `A / 2`
/// for columns 0..16 and 16..32, then `B / 2` for both, as 16-bit bits; `None` where
/// one of them is outside [`Half16::bounds`] (zero, subnormal, near the top of the
/// range, infinite). The factors must be finite (no lane of `1.5 * s` is then NaN).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn bases(kind: Half16, s: &[__m256; 4]) -> Option<[__m256i; 4]> {
    let b = s.map(|v| _mm256_mul_ps(v, _mm256_set1_ps(1.5)));
    let ([a0, a1], [b0, b1]) = match kind {
        Half16::Bf16 => (bf16_line(*s, true), bf16_line(b, true)),
        Half16::F16 => (f16_line(*s), f16_line(b)),
    };
    let (lo, hi) = kind.bounds();
    let (lo, hi) = (_mm256_set1_epi16(lo as i16), _mm256_set1_epi16(hi as i16));
    let inside = |v| {
        let clamped = _mm256_min_epu16(_mm256_max_epu16(v, lo), hi);
        _mm256_movemask_epi8(_mm256_cmpeq_epi16(clamped, v)) == -1
    };
    if !(inside(a0) && inside(a1) && inside(b0) && inside(b1)) {
        return None;
    }
    let unit = _mm256_set1_epi16(kind.unit() as i16);
    Some([a0, a1, b0, b1].map(|v| _mm256_sub_epi16(v, unit)))
}

/// The 32 codes in the low (or `high`) nibbles of `c`'s bytes as 16-bit outputs, two
/// vectors of 16 in order, from their columns' halved bases ([`bases`]): per code, the
/// base it takes (`A / 2`, `B / 2`, or none for a zero) plus what its magnitude and
/// sign add ([`Half16::tables`]), four `vpshufb` lookups on the nibble. About 0.6
/// operations per value, where the f32 decode and its narrowing take about 1.5: the
/// same bits, as [`Half16`] says why.
#[inline]
#[target_feature(enable = "avx2")]
fn decode16(c: __m256i, high: bool, bases: &[__m256i; 4], t: &Tables16) -> [__m256i; 2] {
    let low = _mm256_set1_epi8(0x0F);
    let n = if high {
        _mm256_and_si256(_mm256_srli_epi16::<4>(c), low)
    } else {
        _mm256_and_si256(c, low)
    };
    // Quarters 0, 2, 1, 3: the in-lane unpacks below then give columns 0..16 and
    // 16..32, each nibble in both bytes of its word.
    let n = _mm256_permute4x64_epi64::<0xD8>(n);
    let one = |idx, a, b| {
        let add = _mm256_blendv_epi8(
            _mm256_shuffle_epi8(t.lo, idx),
            _mm256_shuffle_epi8(t.hi, idx),
            t.odd,
        );
        let base = _mm256_blendv_epi8(a, b, _mm256_shuffle_epi8(t.b, idx));
        _mm256_add_epi16(
            _mm256_andnot_si256(_mm256_shuffle_epi8(t.zero, idx), base),
            add,
        )
    };
    [
        one(_mm256_unpacklo_epi8(n, n), bases[0], bases[2]),
        one(_mm256_unpackhi_epi8(n, n), bases[1], bases[3]),
    ]
}

/// The walk of one output type, whose 32 values are `N` 32-byte pieces:
/// [`transposed_blocks`] over the task's bytes of the stored rows `w.cols`; each pair
/// of vectors (byte `p` of 64 stored rows) is output rows `2p` and `2p + 1`, decoded
/// with their group's factors and narrowed by `lines(values, finite)` (`finite`: every
/// factor of the block is, so no value is NaN), then streamed. The factors of a block
/// of 64 columns are filled when its first vectors come.
///
/// # Safety
/// The CPU must have the AVX2 level's features; `out` must start `w.cols.start`
/// elements before a line, and rows of `w.k` elements must be whole lines (checked by
/// `decode_lines`); `N` pieces must be 32 values of `O`.
#[inline]
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
unsafe fn walk<O: Copy, const N: usize>(
    w: &Walk<'_>,
    mut factors: impl FnMut(usize, &mut [f32]),
    out: &mut [O],
    (lines, half): (impl Fn([__m256; 4], bool) -> [__m256i; N], Option<Half16>),
) {
    debug_assert_eq!(N * 32, HALF * size_of::<O>());
    let Walk { data, m, p0, k, .. } = *w;
    let rows = out.len() / k;
    let table = decode_table();
    // The 16-bit decode's tables, for 16-bit output only.
    let t16 = half.map(|kind| (kind, Tables16::new(kind)));
    let mut f = [0f32; COLS * MAX_ROWS / BLOCK];
    let f = &mut f[..rows / BLOCK * COLS];
    let mut finite = false;
    let bytes = p0..p0 + rows / 2;
    transposed_blocks(data, m / 2, w.cols.clone(), bytes, |j0, at, v| {
        // A block of 64 columns starts with its first rows' vectors: its factors then.
        if at == p0 {
            factors(j0, f);
            // A fold without an early exit, so that it vectorizes.
            finite = f.iter().fold(true, |ok, x| ok & x.is_finite());
        }
        // Bytes `at..at + 16` are output rows `r0..r0 + 32`: two 16-row groups.
        let r0 = 2 * (at - p0);
        for (group, v) in v.chunks_exact(8).enumerate() {
            let g = &f[(r0 / BLOCK + group) * COLS..][..COLS];
            let s = [load_f32x32(g), load_f32x32(&g[HALF..])];
            // 16-bit output in 16-bit lanes where the group's bases allow it.
            let fast = match &t16 {
                Some((kind, t)) if finite => {
                    bases(*kind, &s[0]).zip(bases(*kind, &s[1])).map(|b| (b, t))
                }
                _ => None,
            };
            let r = r0 + BLOCK * group;
            for (t, pair) in v.iter().enumerate() {
                for (row, high) in [(r + 2 * t, false), (r + 2 * t + 1, true)] {
                    let dst = out[row * k + j0..row * k + j0 + COLS].as_mut_ptr();
                    for (h, &codes) in pair.iter().enumerate() {
                        // The 32 values at `dst + 32h` lie inside `out` and start on a
                        // line (`out` starts `cols.start` values before one, `j0 -
                        // cols.start` is a multiple of 64 values, and rows are whole
                        // lines: contract).
                        if let Some(((b0, b1), t)) = fast {
                            let b = if h == 0 { &b0 } else { &b1 };
                            let v = decode16(codes, high, b, t);
                            // SAFETY: as said above; with `half`, `O` is 16 bits, so two
                            // pieces are its 32 values.
                            unsafe { stream_lines(dst.add(HALF * h).cast(), v) }
                        } else {
                            let values = decode32(codes, high, &s[h], table);
                            // SAFETY: as said above.
                            unsafe { stream_lines(dst.add(HALF * h).cast(), lines(values, finite)) }
                        }
                    }
                }
            }
        }
    });
}

/// [`into`] into f32.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn into_f32(w: &Walk<'_>, factors: impl FnMut(usize, &mut [f32]), out: &mut [f32]) {
    let lines = |v: [__m256; 4], _| v.map(|v| _mm256_castps_si256(v));
    // SAFETY: the CPU has the AVX2 level's features (this function's); `decode_lines`
    // checked the layout; four pieces are 32 f32.
    unsafe { walk(w, factors, out, (lines, None)) }
}

/// [`into`] into bf16 bits (without the NaN select where the block's factors are
/// finite).
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn into_bf16(w: &Walk<'_>, factors: impl FnMut(usize, &mut [f32]), out: &mut [u16]) {
    let lines = |v, finite| bf16_line(v, finite);
    // SAFETY: as for f32; two pieces are 32 bf16.
    unsafe { walk(w, factors, out, (lines, Some(Half16::Bf16))) }
}

/// [`into`] into f16 bits.
#[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
fn into_f16(w: &Walk<'_>, factors: impl FnMut(usize, &mut [f32]), out: &mut [u16]) {
    let lines = |v, _| f16_line(v);
    // SAFETY: as for f32; two pieces are 32 f16.
    unsafe { walk(w, factors, out, (lines, Some(Half16::F16))) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};
    use quant_core::codec::e2m1;
    use quant_core::simd::Level;

    /// Factors inside the 16-bit decode's bounds for bf16 and f16, their edges first
    /// (a factor that rounds up to the lowest field allowed, the lowest field itself,
    /// the highest `f` whose `1.5 f` still fits), then spread mantissas and magnitudes.
    fn inside(kind: Half16) -> Vec<f32> {
        let (lo, top) = match kind {
            Half16::Bf16 => (-124, 124),
            Half16::F16 => (-12, 13),
        };
        let p = |e: i32| 2f32.powi(e);
        // Half an ulp below the lowest field (a tie, to even: up into it); the largest
        // `f` whose `1.5 f` does not round up into the field above the top.
        let (half_ulp, last) = match kind {
            Half16::Bf16 => (p(-9), 1.32),
            Half16::F16 => (p(-12), 1.333),
        };
        let mut f = vec![
            p(lo) * (1.0 - half_ulp),
            p(lo),
            p(lo) * 1.37,
            p(top) * last,
            p(top) * 1.25,
            p(top),
        ];
        for i in 0..250u32 {
            let e = lo + 1 + (i as i32 * 7) % (top - lo - 1);
            let m = 1.0 + (i.wrapping_mul(2_654_435_761) >> 9) as f32 / (1u32 << 23) as f32;
            f.push(p(e) * m);
        }
        f
    }

    /// `T(e2m1(code) * f)` as 16-bit bits, the portable decode.
    fn want(kind: Half16, code: u8, f: f32) -> u16 {
        let v = e2m1::decode_fast(code) * f;
        match kind {
            Half16::Bf16 => bf16::from_f32(v).to_bits(),
            Half16::F16 => f16::from_f32(v).to_bits(),
        }
    }

    /// Every code of every column, for 32 columns at a time of the factors above: the
    /// bits of the portable decode. And factors outside the bounds (zero, subnormal,
    /// the top of the range, one whose `1.5 f` leaves it) are refused.
    #[test]
    fn decode16_equals_the_portable_decode() {
        let ran = quant_core::simd::with_level(Level::Avx2, || {
            for kind in [Half16::Bf16, Half16::F16] {
                // SAFETY: the CPU has AVX2 and F16C (`with_level` ran this).
                unsafe { check(kind) }
            }
        });
        if ran.is_none() {
            eprintln!("skipped: this CPU has no AVX2");
        }
    }

    #[target_feature(enable = "avx2,fma,bmi1,bmi2,f16c,lzcnt,popcnt")]
    fn check(kind: Half16) {
        let t = Tables16::new(kind);
        let f = inside(kind);
        for cols in f.chunks(32) {
            let mut s32 = [1.0f32; 32];
            s32[..cols.len()].copy_from_slice(cols);
            let s = load_f32x32(&s32);
            let b = bases(kind, &s).unwrap_or_else(|| panic!("{kind:?}: {cols:?} refused"));
            for code in 0..=255u8 {
                for high in [false, true] {
                    let v = decode16(_mm256_set1_epi8(code as i8), high, &b, &t);
                    // SAFETY: two vectors of 16 u16 are 32 u16.
                    let got: [u16; 32] = unsafe { std::mem::transmute(v) };
                    let c = if high { code >> 4 } else { code & 15 };
                    for (j, &g) in got.iter().enumerate() {
                        let w = want(kind, c, s32[j]);
                        assert_eq!(
                            g,
                            w,
                            "{kind:?} code {c:#x} factor {:e} ({:#x})",
                            s32[j],
                            s32[j].to_bits()
                        );
                    }
                }
            }
        }
        // Per column: each code's column decodes with its own factor (a vector of 32
        // different codes).
        let codes: [u8; 32] = std::array::from_fn(|j| (j * 37 % 256) as u8);
        // SAFETY: 32 bytes (one unaligned 256-bit load).
        let c = unsafe { std::arch::x86_64::_mm256_loadu_si256(codes.as_ptr().cast()) };
        let s32: [f32; 32] = std::array::from_fn(|j| f[j * 7 % f.len()]);
        let b = bases(kind, &load_f32x32(&s32)).expect("inside");
        for high in [false, true] {
            // SAFETY: two vectors of 16 u16 are 32 u16.
            let got: [u16; 32] = unsafe { std::mem::transmute(decode16(c, high, &b, &t)) };
            for j in 0..32 {
                let code = if high { codes[j] >> 4 } else { codes[j] & 15 };
                assert_eq!(got[j], want(kind, code, s32[j]), "{kind:?} column {j}");
            }
        }
        let (lo, top) = match kind {
            Half16::Bf16 => (2f32.powi(-124), 2f32.powi(124)),
            Half16::F16 => (2f32.powi(-12), 2f32.powi(13)),
        };
        for bad in [
            0.0,
            lo * 0.99,
            lo / 2.0,
            1e-40,
            top * 1.34,
            top * 2.0,
            top * 1.9999,
        ] {
            let mut s32 = [1.0f32; 32];
            s32[17] = bad;
            assert!(
                bases(kind, &load_f32x32(&s32)).is_none(),
                "{kind:?}: {bad:e} taken"
            );
        }
    }
}
