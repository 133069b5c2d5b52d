//! The Hadamard sums of the RHT with AVX2: 8 columns per step, half of the 16 sums in
//! registers at a time.
//!
//! The arithmetic of [`crate::rht_x86`]'s AVX-512 sums, which argues it: `y[j] = sum_i
//! x[i] * R[i][j]` in index order from `+0.0`, each step one add or one subtract of `q =
//! x * 0.25` (exact), its sign fixed at compile time. AVX2 has 16 vector registers, too
//! few for 16 rows and 16 sums, so a step makes two passes over its rows (read again
//! from L1): sums 0..8, then sums 8..16, each pass 8 sums, one `q` and the constant. The
//! portable loop it replaces kept the sums in memory (about 10 cycles per value), the
//! largest part of the RHT quantize at AVX2.
//!
//! bf16 input is summed straight from its bits ([`rounded_sums_bf16`],
//! [`sums_abs_max_bf16`]): widened in registers, by the AVX-512 kernels' fast transform
//! where their exactness test holds, else in index order, rounded and folded into the
//! column maxima before anything is stored.
//!
//! The inverse ([`inverse_nibbles`]) is [`crate::rht_x86::inverse_nibbles`]'s fast
//! Walsh-Hadamard transform in f64, 4 columns per step: it decodes the codes in
//! registers and takes 64 adds per 16 values, where the portable loop decoded into a
//! scratch and summed in index order, 256 f64 multiply-adds per 16 values (0.03 of the
//! copy roofline into bf16 on Zen 4 with `QUANTFMT_SIMD=avx2`).

use std::arch::x86_64::{
    __m128, __m128i, __m256, __m256d, _CMP_EQ_OQ, _CMP_GT_OQ, _CMP_LE_OQ, _CMP_NEQ_UQ,
    _mm_add_epi16, _mm_add_epi32, _mm_and_si128, _mm_andnot_si128, _mm_castps_si128,
    _mm_castsi128_ps, _mm_cmpeq_epi16, _mm_cmpgt_epi16, _mm_cvtsi32_si128, _mm_loadu_ps,
    _mm_loadu_si128, _mm_max_epi16, _mm_max_epu16, _mm_min_epu16, _mm_movemask_epi8, _mm_or_si128,
    _mm_set1_epi16, _mm_set1_epi32, _mm_setzero_si128, _mm_shuffle_ps, _mm_srli_epi16,
    _mm_storeu_ps, _mm_storeu_si128, _mm_sub_epi16, _mm_unpacklo_epi32, _mm256_add_pd,
    _mm256_add_ps, _mm256_andnot_pd, _mm256_castpd_ps, _mm256_castps256_ps128, _mm256_castsi256_ps,
    _mm256_cmp_pd, _mm256_cmp_ps, _mm256_cvtepu8_epi32, _mm256_cvtepu16_epi32, _mm256_cvtpd_ps,
    _mm256_cvtps_pd, _mm256_extractf128_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_max_ps,
    _mm256_movemask_pd, _mm256_movemask_ps, _mm256_mul_pd, _mm256_mul_ps, _mm256_set_m128,
    _mm256_set1_pd, _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_pd, _mm256_setzero_ps,
    _mm256_slli_epi32, _mm256_srlv_epi32, _mm256_storeu_ps, _mm256_sub_pd, _mm256_sub_ps,
};

use quant_core::bf16_narrow::avx2::round8;
use quant_core::codec::e2m1;
use quant_core::simd::Level;

use crate::rht::{DIM, R};
use crate::rht_int::avx2 as int;
use crate::rht_x86::{Narrow, butterflies, index_order_column};
use crate::x86_avx2::{e2m1_8, magnitude, widen_bf16};

/// Columns per step (f32 lanes of one vector).
const COLS: usize = 8;

/// Whether `R[i][j]` is `-0.25` (otherwise `+0.25`).
const fn neg(i: usize, j: usize) -> bool {
    R[i][j] < 0.0
}

/// The `(i, j)` steps of row `$i` for the sums `$js` of [`step_sums`]: `q = rows[i] *
/// 0.25`, then one add or subtract of `q` per sum, each sign a constant (as a loop over
/// `i` the signs were looked up at run time, 50 % of the quantize).
macro_rules! steps {
    ($y:ident, $rows:ident, $quarter:ident; $i:literal: [$($j:literal)*]) => {{
        let q = _mm256_mul_ps($rows[$i], $quarter);
        $(
            $y[$j] = if neg($i, $j) {
                _mm256_sub_ps($y[$j], q)
            } else {
                _mm256_add_ps($y[$j], q)
            };
        )*
    }};
}

/// One pass over the rows `$i` for the sums `$js` ([`steps`]).
macro_rules! passes {
    ($y:ident, $rows:ident, $quarter:ident; $js:tt; $($i:literal)*) => {
        $( steps!($y, $rows, $quarter; $i: $js); )*
    };
}

/// The sums of one 8-column step: `y[j] = sum_i rows[i] * R[i][j]` in index order from
/// `+0.0` for an array of 16 row vectors, each `(i, j)` step one add or subtract of
/// `rows[i] * 0.25`, in two passes over the rows, sums 0..8 then 8..16 (8 sums, a row
/// and the constant fit AVX2's 16 registers).
///
/// A macro, so that every kernel inlines it: as a `#[target_feature]` function (which
/// cannot be `#[inline(always)]`) it stayed a call, its 512-byte result through memory
/// (a third of the RHT quantize). The caller must have AVX2 enabled.
macro_rules! step_sums {
    ($rows:expr) => {{
        let rows: &[__m256; DIM] = $rows;
        let quarter = _mm256_set1_ps(0.25);
        let mut y: [__m256; DIM] = [_mm256_setzero_ps(); DIM];
        passes!(y, rows, quarter; [0 1 2 3 4 5 6 7]; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        passes!(y, rows, quarter; [8 9 10 11 12 13 14 15]; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        y
    }};
}

/// For each of the `cols` columns (a multiple of 8) `c`: `out[j][c] = sum_i x[i *
/// stride + c] * R[i][j]`, `x` holding 16 rows `stride` apart, `out[j]` at least `cols`
/// long. Returns `false`, writing nothing, unless the CPU has AVX2 and the lengths fit;
/// the caller then sums with its portable loop.
#[inline(always)]
pub(crate) fn hadamard_sums<const N: usize>(
    x: &[f32],
    stride: usize,
    cols: usize,
    out: &mut [[f32; N]; DIM],
) -> bool {
    if !crate::rht_x86::fits_at(Level::Avx2, x.len(), (DIM, stride), cols, COLS, N) {
        return false;
    }
    // SAFETY: the CPU has AVX2 and the lengths fit (both checked above).
    unsafe { sums(x, stride, cols, out) };
    true
}

/// [`hadamard_sums`] after its checks.
///
/// # Safety
/// The CPU must have AVX2; `cols % 8 == 0`, `cols <= out[j].len()` and `15 * stride +
/// cols <= x.len()`.
#[target_feature(enable = "avx2")]
unsafe fn sums<const N: usize>(x: &[f32], stride: usize, cols: usize, out: &mut [[f32; N]; DIM]) {
    for c in (0..cols).step_by(COLS) {
        let mut rows = [_mm256_setzero_ps(); DIM];
        for (i, r) in rows.iter_mut().enumerate() {
            // SAFETY: `i * stride + c + 8 <= 15 * stride + cols <= x.len()`; one
            // unaligned 256-bit load.
            *r = unsafe { _mm256_loadu_ps(x.as_ptr().add(i * stride + c)) };
        }
        for (o, y) in out.iter_mut().zip(step_sums!(&rows)) {
            // SAFETY: `c + 8 <= cols <= o.len()`; one unaligned 256-bit store.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(c), y) };
        }
    }
}

/// Columns `c..c + 8` of 16 bf16 rows `stride` apart, as bit patterns.
///
/// # Safety
/// `15 * stride + c + 8 <= bits.len()`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn bf16_rows(bits: &[u16], stride: usize, c: usize) -> [__m128i; DIM] {
    let mut rows = [_mm_setzero_si128(); DIM];
    for (i, r) in rows.iter_mut().enumerate() {
        // SAFETY: `i * stride + c + 8 <= bits.len()` (the caller's promise); one
        // unaligned 128-bit load of 8 patterns.
        *r = unsafe { _mm_loadu_si128(bits.as_ptr().add(i * stride + c).cast()) };
    }
    rows
}

/// [`crate::rht_x86`]'s `sums_exact` for 8 columns: whether, in each column of the 16
/// bf16 rows, the nonzero values' exponent fields span at most 12 (subnormals counted
/// as field 1) and the largest is at most 252, so that every partial sum of the
/// column's values times `±0.25` is exact in f32 and the sums come out the same in any
/// order (the argument is there). Infinities and NaN (field 255) fail the test.
#[target_feature(enable = "avx2")]
#[inline]
fn sums_exact(rows: &[__m128i; DIM]) -> bool {
    let magnitude = _mm_set1_epi16(0x7FFF);
    let one = _mm_set1_epi16(1);
    let mut hi = _mm_setzero_si128();
    // Smallest nonzero magnitude minus one (a zero wraps to 0xFFFF and loses).
    let mut lo = _mm_set1_epi16(-1);
    for &r in rows {
        let a = _mm_and_si128(r, magnitude);
        hi = _mm_max_epu16(hi, a);
        lo = _mm_min_epu16(lo, _mm_sub_epi16(a, one));
    }
    let emax = _mm_srli_epi16::<7>(hi);
    // An all-zero column wraps back to 0 here: field 0, counted as 1 like subnormals.
    let emin = _mm_max_epu16(_mm_srli_epi16::<7>(_mm_add_epi16(lo, one)), one);
    let bound = _mm_min_epu16(_mm_add_epi16(emin, _mm_set1_epi16(12)), _mm_set1_epi16(252));
    // `emax <= bound` in every lane: the larger of the two is the bound.
    _mm_movemask_epi8(_mm_cmpeq_epi16(_mm_max_epu16(emax, bound), bound)) == 0xFFFF
}

/// The forward sums of an 8-column step whose partial sums are all exact
/// ([`sums_exact`]): `y = H16 (s * 0.25 * v)` by a fast Walsh-Hadamard transform, 64
/// adds where the index order takes 256, with the same results. `v * (±0.25) + 0.0`
/// turns a `-0` input into `+0`, so no sum is `-0`: in index order from `+0.0` an exact
/// zero is `+0` too. A macro, as [`step_sums`] is; the caller must have AVX2 and FMA
/// enabled.
macro_rules! fast_sums {
    ($wide:expr) => {{
        let mut w: [__m256; DIM] = $wide;
        let zero = _mm256_setzero_ps();
        // `R[i][0]` is `s_i * 0.25` (column 0 of `H16` is all ones); the product is
        // exact, so the fused step rounds as a multiply and an add would.
        for (w, ri) in w.iter_mut().zip(&R) {
            *w = _mm256_fmadd_ps(*w, _mm256_set1_ps(ri[0]), zero);
        }
        butterflies!(w, _mm256_add_ps, _mm256_sub_ps);
        w
    }};
}

/// The forward sums of 8 columns of 16 bf16 rows ([`bf16_rows`]), widened from the
/// bits: by the fast transform where that is exact ([`sums_exact`]), else in index
/// order ([`step_sums`]). A macro, as those are; the caller must have AVX2 and FMA
/// enabled.
macro_rules! bf16_sums {
    ($rows:expr) => {{
        let rows: &[__m128i; DIM] = $rows;
        let mut wide = [_mm256_setzero_ps(); DIM];
        for (w, &h) in wide.iter_mut().zip(rows) {
            *w = widen_bf16(h);
        }
        if sums_exact(rows) {
            fast_sums!(wide)
        } else {
            step_sums!(&wide)
        }
    }};
}

/// [`crate::rht_x86::rounded_sums_bf16`] at AVX2: for each of the `cols` columns (a
/// multiple of 8) `c`, `out[j][c] = bf16(sum_i x[i * stride + c] * R[i][j])` (the sums
/// of [`hadamard_sums`], rounded to nearest even, held as f32), and `amax[c] = max_j
/// |out[j][c]|` ignoring NaN, from 0, all in registers: the portable path widened the
/// group into a scratch, summed, rounded and folded the maxima in passes over it.
/// Returns `false`, writing nothing, unless the CPU has AVX2 and the lengths fit.
#[inline(always)]
pub(crate) fn rounded_sums_bf16<const N: usize>(
    bits: &[u16],
    stride: usize,
    cols: usize,
    out: &mut [[f32; N]; DIM],
    amax: &mut [f32; N],
) -> bool {
    if !crate::rht_x86::fits_at(Level::Avx2, bits.len(), (DIM, stride), cols, COLS, N) {
        return false;
    }
    // SAFETY: the CPU has AVX2 and the lengths fit (both checked above).
    unsafe { sums_bf16(bits, stride, cols, out, amax) };
    true
}

/// [`rounded_sums_bf16`] after its checks.
///
/// # Safety
/// The CPU must have AVX2; `cols % 8 == 0`, `cols <= N` and `15 * stride + cols <=
/// bits.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn sums_bf16<const N: usize>(
    bits: &[u16],
    stride: usize,
    cols: usize,
    out: &mut [[f32; N]; DIM],
    amax: &mut [f32; N],
) {
    for c in (0..cols).step_by(COLS) {
        // SAFETY: `15 * stride + c + 8 <= 15 * stride + cols <= bits.len()`.
        let rows = unsafe { bf16_rows(bits, stride, c) };
        let mut m = _mm256_setzero_ps();
        for (o, y) in out.iter_mut().zip(bf16_sums!(&rows)) {
            let r = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(round8(y)));
            // `vmaxps` returns its second operand when either is NaN: a NaN loses.
            m = _mm256_max_ps(magnitude(r), m);
            // SAFETY: `c + 8 <= cols <= N`; one unaligned 256-bit store.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(c), r) };
        }
        // SAFETY: as the stores above.
        unsafe { _mm256_storeu_ps(amax.as_mut_ptr().add(c), m) };
    }
}

/// [`crate::rht_x86::sums_abs_max_bf16`] at AVX2: the largest `|x|` of a 16-row group of
/// bf16 input and the largest `|y|` of its unrounded sums (NaN ignored, from 0), from
/// one load of the group. `None` unless the CPU has AVX2 and the lengths fit (as
/// [`rounded_sums_bf16`]). `floor` is the caller's running maximum of `|y|`: a step
/// whose sums cannot exceed it skips them, as the AVX-512 kernel's do
/// ([`crate::rht_x86::sum_limit`]), so the `|y|` returned is exact as `max(floor, |y|)`.
#[inline(always)]
pub(crate) fn sums_abs_max_bf16(
    bits: &[u16],
    stride: usize,
    cols: usize,
    floor: f32,
) -> Option<(f32, f32)> {
    let rows = (DIM, stride);
    if !crate::rht_x86::fits_at(Level::Avx2, bits.len(), rows, cols, COLS, usize::MAX) {
        return None;
    }
    // SAFETY: the CPU has AVX2 and the lengths fit (both checked above).
    Some(unsafe { abs_max_bf16(bits, stride, cols, crate::rht_x86::sum_limit(floor)) })
}

/// [`sums_abs_max_bf16`] after its checks.
///
/// # Safety
/// The CPU must have AVX2; `cols % 8 == 0` and `15 * stride + cols <= bits.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn abs_max_bf16(bits: &[u16], stride: usize, cols: usize, limit: f32) -> (f32, f32) {
    let (mut mx, mut my) = (_mm_setzero_si128(), _mm256_setzero_ps());
    let limit = _mm256_set1_ps(limit);
    for c in (0..cols).step_by(COLS) {
        // SAFETY: `15 * stride + c + 8 <= 15 * stride + cols <= bits.len()`.
        let rows = unsafe { bf16_rows(bits, stride, c) };
        // Each column's sum of magnitudes (even and odd rows apart, so that no chain of
        // dependent adds is 16 long), for the skip test.
        let mut sums = [_mm256_setzero_ps(); 2];
        for pair in rows.chunks_exact(2) {
            for (sum, &r) in sums.iter_mut().zip(pair) {
                // Magnitude patterns order as the values do; a NaN's (above infinity's)
                // leaves the maximum as it is.
                let a = _mm_and_si128(r, _mm_set1_epi16(0x7FFF));
                let nan = _mm_cmpgt_epi16(a, _mm_set1_epi16(0x7F80));
                mx = _mm_max_epi16(mx, _mm_andnot_si128(nan, a));
                let wide = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(a));
                *sum = _mm256_add_ps(*sum, _mm256_castsi256_ps(wide));
            }
        }
        // A NaN or infinite sum (or a NaN limit) is never at or below the limit.
        let below = _mm256_cmp_ps::<_CMP_LE_OQ>(_mm256_add_ps(sums[0], sums[1]), limit);
        if _mm256_movemask_ps(below) == 0xFF {
            continue;
        }
        // `vmaxps` returns its second operand when either is NaN: a NaN loses.
        for y in bf16_sums!(&rows) {
            my = _mm256_max_ps(magnitude(y), my);
        }
    }
    // No lane is NaN (none entered), so the lanes fold in any order.
    let mut lanes = [0f32; COLS];
    // SAFETY: `lanes` is 8 f32; one unaligned 256-bit store.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), my) };
    let y = lanes.into_iter().fold(0f32, f32::max);
    let mut fields = [0u16; COLS];
    // SAFETY: `fields` is 8 u16; one unaligned 128-bit store.
    unsafe { _mm_storeu_si128(fields.as_mut_ptr().cast(), mx) };
    let x = fields.into_iter().max().unwrap_or(0);
    (quant_core::dtype::f32_from_bf16_bits(x), y)
}

/// Columns per step of [`inverse_nibbles`] (f64 lanes of one vector).
pub(crate) const INVERSE_COLS: usize = 4;

/// [`crate::rht_x86::inverse_nibbles`] at AVX2: for each of the `f.len()` columns (a
/// multiple of [`INVERSE_COLS`]) `c`, `out[i][c]` is `sum_j y_j * R[i][j]` in f64,
/// rounded to f32 as `narrow` says, where `y_j = e2m1(code_j) * f[c]` (the f32 product
/// of the portable decode) and `code_j` is nibble `j % 2` (low first) of `pairs[(j / 2) *
/// stride + c]`.
///
/// The same argument makes the fast transform's order give the index order's sums
/// wherever they are finite (every partial sum of a column's values is exact in f64),
/// and the same check sends a column with a non-finite value back to the index order.
/// Returns `false`, writing nothing, unless the CPU has AVX2 and the lengths fit (8 byte
/// rows `stride` apart holding `f.len() <= N` columns).
#[inline(always)]
pub(crate) fn inverse_nibbles<const N: usize>(
    pairs: &[u8],
    stride: usize,
    f: &[f32],
    narrow: Narrow,
    out: &mut [[f32; N]; DIM],
) -> bool {
    // Two codes per byte: 8 byte rows.
    let rows = (DIM / 2, stride);
    if !crate::rht_x86::fits_at(Level::Avx2, pairs.len(), rows, f.len(), INVERSE_COLS, N) {
        return false;
    }
    // SAFETY: the CPU has AVX2 and the lengths fit (both checked above).
    unsafe { fwht_nibbles(pairs, stride, f, narrow, out) };
    true
}

/// The f32 rounding of 4 f64 sums: `r`, their nearest-even narrowing, as it is for
/// [`Narrow::Nearest`]; for [`Narrow::Odd`], [`quant_core::dtype::f64_to_f32_round_odd`]
/// lane by lane for every non-NaN `v` (AVX2 has no truncating narrowing): `r` stepped
/// one unit toward zero where it rounded away (an infinity included, which becomes
/// `f32::MAX`), then its last bit set where it was inexact.
#[target_feature(enable = "avx2")]
#[inline]
fn round(v: __m256d, r: __m128, narrow: Narrow) -> __m128 {
    if narrow == Narrow::Nearest {
        return r;
    }
    let back = _mm256_cvtps_pd(r);
    let sign = _mm256_set1_pd(-0.0);
    let away = _mm256_cmp_pd::<_CMP_GT_OQ>(_mm256_andnot_pd(sign, back), _mm256_andnot_pd(sign, v));
    let inexact = _mm256_cmp_pd::<_CMP_NEQ_UQ>(back, v);
    // A 64-bit lane mask as 32-bit lanes: its even halves (`shufps`).
    let lanes = |m: __m256d| {
        let m = _mm256_castpd_ps(m);
        let (lo, hi) = (_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        _mm_castps_si128(_mm_shuffle_ps::<0b10_00_10_00>(lo, hi))
    };
    // `away` is -1 where set: one unit down in magnitude.
    let bits = _mm_add_epi32(_mm_castps_si128(r), lanes(away));
    let odd = _mm_and_si128(lanes(inexact), _mm_set1_epi32(1));
    _mm_castsi128_ps(_mm_or_si128(bits, odd))
}

/// [`inverse_nibbles`] after its checks.
///
/// # Safety
/// The CPU must have AVX2; `f.len() % 4 == 0`, `f.len() <= N`, `f.len() <= stride` and
/// `7 * stride + f.len() <= pairs.len()`.
#[target_feature(enable = "avx2")]
unsafe fn fwht_nibbles<const N: usize>(
    pairs: &[u8],
    stride: usize,
    f: &[f32],
    narrow: Narrow,
    out: &mut [[f32; N]; DIM],
) {
    // `s_i * 0.25` (`R[i][0]`: column 0 of `H16` is all ones): exact scalings.
    let post: [__m256d; DIM] = std::array::from_fn(|i| _mm256_set1_pd(f64::from(R[i][0])));
    // The positive half of the table, for `e2m1_8`.
    // SAFETY: `DECODE` is 16 f32; its first 8 are one unaligned 256-bit load.
    let table = unsafe { _mm256_loadu_ps(e2m1::DECODE.as_ptr()) };
    // Lanes 0..4 take the low nibble (even row), lanes 4..8 the high one (odd row).
    let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    let zero = _mm256_setzero_pd();
    let mut next = 0;
    while next < f.len() {
        let c = next;
        // 8 columns in i32 lanes where their sums allow it, else 4 in f64.
        let whole = c + int::COLS <= f.len();
        // SAFETY: the CPU has AVX2; `c + 8 <= f.len() <= N`, and `f.len() <= stride` and
        // `7 * stride + f.len() <= pairs.len()` (this function's contract).
        if whole && unsafe { int::inverse_step((pairs, stride), f, c, narrow, out) } {
            next += int::COLS;
            continue;
        }
        next += INVERSE_COLS;
        // SAFETY: `c + 4 <= f.len()`; one unaligned 128-bit load.
        let f4 = unsafe { _mm_loadu_ps(f.as_ptr().add(c)) };
        let ff = _mm256_set_m128(f4, f4);
        let mut v = [zero; DIM];
        for p in 0..DIM / 2 {
            // The 4 bytes of this step, twice (lanes 0..4 and 4..8).
            let at = &pairs[p * stride + c..][..INVERSE_COLS];
            let b = _mm_cvtsi32_si128(i32::from_le_bytes([at[0], at[1], at[2], at[3]]));
            let codes = _mm256_srlv_epi32(_mm256_cvtepu8_epi32(_mm_unpacklo_epi32(b, b)), shift);
            let y = _mm256_mul_ps(ff, e2m1_8(table, codes));
            v[2 * p] = _mm256_cvtps_pd(_mm256_castps256_ps128(y));
            v[2 * p + 1] = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(y));
        }
        // Afterwards `v[i] = sum_j H[i][j] * y[j]`.
        butterflies!(v, _mm256_add_pd, _mm256_sub_pd);
        // `v[0] - v[0]` is 0 where the column's values are finite, NaN elsewhere.
        let finite =
            _mm256_movemask_pd(_mm256_cmp_pd::<_CMP_EQ_OQ>(_mm256_sub_pd(v[0], v[0]), zero));
        for (i, o) in out.iter_mut().enumerate() {
            // `+ 0.0`: an exact zero is `+0` in index order (the sums start from `+0.0`),
            // but `-0.25 * +0` here. The product is exact.
            let vi = _mm256_add_pd(_mm256_mul_pd(v[i], post[i]), zero);
            let r = round(vi, _mm256_cvtpd_ps(vi), narrow);
            // SAFETY: `c + 4 <= f.len() <= N`; one unaligned 128-bit store.
            unsafe { _mm_storeu_ps(o.as_mut_ptr().add(c), r) };
        }
        for l in (0..INVERSE_COLS).filter(|l| finite & (1 << l) == 0) {
            index_order_column(pairs, stride, f, c + l, narrow, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rht::sums_check;

    #[test]
    fn equals_the_product_form_in_index_order() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let stride = 40;
        let x = sums_check::rows(stride);
        let mut out = [[0f32; 256]; DIM];
        assert!(hadamard_sums(&x, stride, 32, &mut out));
        sums_check::assert_index_order(&x, stride, 32, &out);
        // Lengths that do not fit are refused.
        assert!(!hadamard_sums(&x, stride, 36, &mut out));
        assert!(!hadamard_sums(&x[..15 * stride + 31], stride, 32, &mut out));
    }

    #[test]
    fn rounded_bf16_sums_equal_forward_16() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        use crate::rht_x86::bf16_check;
        bf16_check::narrow_windows(|x, stride, out, amax| {
            rounded_sums_bf16(x, stride, 64, out, amax)
        });
        let (x, stride) = bf16_check::wide();
        let mut out = [[0f32; 64]; DIM];
        let mut amax = [0f32; 64];
        assert!(rounded_sums_bf16(&x, stride, 64, &mut out, &mut amax));
        bf16_check::assert_forward_16(&x, stride, &out, &amax, "wide");
        bf16_check::maxima(
            |x, stride, out, amax| rounded_sums_bf16(x, stride, 48, out, amax),
            |x, stride| sums_abs_max_bf16(x, stride, 48, 0.0),
        );
        // Lengths that do not fit are refused.
        assert!(!rounded_sums_bf16(&x, stride, 36, &mut out, &mut amax));
        let short = &x[..15 * stride + 63];
        assert!(!rounded_sums_bf16(short, stride, 64, &mut out, &mut amax));
        crate::rht_x86::bf16_check::floors(|x, stride, floor| {
            sums_abs_max_bf16(x, stride, 48, floor)
        });
        assert_eq!(sums_abs_max_bf16(&[0u16; DIM * 16], 16, 32, 0.0), None);
        assert_eq!(sums_abs_max_bf16(&[0u16; DIM * 16], 16, 4, 0.0), None);
    }

    /// The exactness test and the fast transform of the 16 columns at `c` (two 8-column
    /// steps): exact where both steps are.
    fn fast(x: &[u16], stride: usize, c: usize) -> (bool, [[f32; 16]; DIM]) {
        let _ = &x[15 * stride + c..][..16]; // the rows' ends inside `x`
        let mut y = [[0f32; 16]; DIM];
        let mut exact = true;
        for half in 0..2 {
            // SAFETY: the callers checked `Level::Avx2` (AVX2 and FMA); the rows' ends
            // were checked above.
            let (e, h) = unsafe { fast8(x, stride, c + 8 * half) };
            exact &= e;
            for (y, h) in y.iter_mut().zip(h) {
                y[8 * half..][..8].copy_from_slice(&h);
            }
        }
        (exact, y)
    }

    /// One step of [`fast`].
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `15 * stride + c + 8 <= x.len()`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fast8(x: &[u16], stride: usize, c: usize) -> (bool, [[f32; 8]; DIM]) {
        // SAFETY: the caller's promise.
        let rows = unsafe { bf16_rows(x, stride, c) };
        let y = fast_sums!(rows.map(|h| widen_bf16(h)));
        let mut out = [[0f32; 8]; DIM];
        for (o, y) in out.iter_mut().zip(y) {
            // SAFETY: 8 lanes into 8 floats.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), y) };
        }
        (sums_exact(&rows), out)
    }

    #[test]
    fn exact_sums_take_the_fast_transform_with_index_order_results() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        crate::rht_x86::exact_check::exact_sums_take_the_fast_transform(fast);
    }

    #[test]
    fn the_exactness_test_draws_its_lines_where_stated() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        crate::rht_x86::exact_check::lines_where_stated(fast);
    }

    #[test]
    fn the_inverse_equals_the_index_order_sums() {
        if !Level::Avx2.is_supported() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        crate::rht_x86::inverse_check::assert_index_order(|pairs, stride, f, narrow, out| {
            inverse_nibbles(pairs, stride, f, narrow, out)
        });
        // Lengths that do not fit are refused.
        let (pairs, stride, f) = crate::rht_x86::inverse_check::case();
        let mut out = Box::new([[0f32; 1024]; DIM]);
        assert!(!inverse_nibbles(
            &pairs,
            stride,
            &f[..6],
            Narrow::Odd,
            &mut out
        ));
        let short = &pairs[..7 * stride + 7];
        assert!(!inverse_nibbles(
            short,
            stride,
            &f[..8],
            Narrow::Odd,
            &mut out
        ));
        assert!(!inverse_nibbles(&pairs, 4, &f[..8], Narrow::Odd, &mut out));
        let mut small = [[0f32; 4]; DIM];
        assert!(!inverse_nibbles(
            &pairs,
            stride,
            &f[..8],
            Narrow::Odd,
            &mut small
        ));
    }
}
