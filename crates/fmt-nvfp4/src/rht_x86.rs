//! The Hadamard sums of the RHT with AVX-512: 16 columns per step, the 16 sums in
//! registers.
//!
//! `y[j] = sum_i x[i] * R[i][j]` in index order from `+0.0` (what [`crate::rht`]
//! specifies), for 16 columns at once. `x * R[i][j]` is `±(x * 0.25)`, exact, and
//! `a + -(q)` is `a - q` in IEEE arithmetic, so each step is one add or one subtract of
//! `q = x * 0.25`, its sign fixed at compile time, with the same result as the product
//! form. Every `(i, j)` step is written out by a macro: as loops, the portable form kept
//! the sums in memory and did not unroll the `j` loop (about 10 cycles per value on
//! Zen 4), and a portable unrolled form spilled them to the stack.

use std::arch::x86_64::{
    __m256, __m256i, __m512, _CMP_EQ_OQ, _CMP_LE_OQ, _CMP_NEQ_UQ, _MM_FROUND_NO_EXC,
    _MM_FROUND_TO_ZERO, _mm_loadl_epi64, _mm_unpacklo_epi64, _mm256_add_epi16, _mm256_add_ps,
    _mm256_and_si256, _mm256_castps_si256, _mm256_castsi256_ps, _mm256_cmp_ps_mask,
    _mm256_cmpeq_epi32_mask, _mm256_cmpge_epu32_mask, _mm256_cmpgt_epu16_mask,
    _mm256_cmple_epu16_mask, _mm256_loadu_ps, _mm256_loadu_si256, _mm256_mask_max_epu16,
    _mm256_mask_ternarylogic_epi32, _mm256_max_epu16, _mm256_min_epu16, _mm256_set1_epi16,
    _mm256_set1_epi32, _mm256_set1_ps, _mm256_setzero_ps, _mm256_setzero_si256, _mm256_slli_epi32,
    _mm256_srli_epi16, _mm256_storeu_ps, _mm256_sub_epi16, _mm512_abs_ps, _mm512_add_epi32,
    _mm512_add_pd, _mm512_add_ps, _mm512_and_si512, _mm512_castpd_si512, _mm512_castps_si512,
    _mm512_castps256_ps512, _mm512_castps512_ps256, _mm512_castsi512_ps, _mm512_castsi512_si256,
    _mm512_cmp_pd_mask, _mm512_cmple_epu16_mask, _mm512_cvt_roundpd_ps, _mm512_cvtepu8_epi32,
    _mm512_cvtepu16_epi32, _mm512_cvtpd_ps, _mm512_cvtps_pd, _mm512_extractf32x8_ps,
    _mm512_extracti64x4_epi64, _mm512_fmadd_pd, _mm512_fmadd_ps, _mm512_fpclass_ps_mask,
    _mm512_insertf32x8, _mm512_loadu_ps, _mm512_loadu_si512, _mm512_mask_max_epu16,
    _mm512_mask_or_epi32, _mm512_max_ps, _mm512_mul_ps, _mm512_permutexvar_epi16,
    _mm512_permutexvar_ps, _mm512_reduce_max_epu32, _mm512_reduce_max_ps, _mm512_set1_epi16,
    _mm512_set1_epi32, _mm512_set1_epi64, _mm512_set1_pd, _mm512_set1_ps, _mm512_setr_epi32,
    _mm512_setzero_pd, _mm512_setzero_ps, _mm512_setzero_si512, _mm512_slli_epi32,
    _mm512_srli_epi32, _mm512_srlv_epi32, _mm512_storeu_ps, _mm512_storeu_si512, _mm512_sub_pd,
    _mm512_sub_ps, _mm512_test_epi64_mask,
};

use quant_core::codec::e2m1;

use quant_core::bf16_narrow::x86::narrow32_exact;
use quant_core::simd::{Ext, Level, has};

use crate::rht::{DIM, R};
use crate::rht_int::avx512 as int;

/// Whether `R[i][j]` is `-0.25` (otherwise `+0.25`).
const NEG: [[bool; DIM]; DIM] = {
    let mut neg = [[false; DIM]; DIM];
    let mut i = 0;
    while i < DIM {
        let mut j = 0;
        while j < DIM {
            neg[i][j] = R[i][j] < 0.0;
            j += 1;
        }
        i += 1;
    }
    neg
};

/// Whether the AVX-512 kernels can take a call: the CPU has AVX-512 and the lengths
/// fit ([`fits_at`]).
fn fits(len: usize, rows: (usize, usize), cols: usize, step: usize, n: usize) -> bool {
    fits_at(Level::Avx512, len, rows, cols, step, n)
}

/// Whether a kernel of `level` can take a call: the CPU has the level, and `cols`
/// columns (a multiple of the kernel's `step`, at most `stride` and the output rows'
/// `n`) of `rows` rows `stride` apart lie inside an input of `len` values. The AVX2 sums
/// ([`crate::rht_avx2`]) check their calls with it too.
pub(crate) fn fits_at(
    level: Level,
    len: usize,
    (rows, stride): (usize, usize),
    cols: usize,
    step: usize,
    n: usize,
) -> bool {
    cols.is_multiple_of(step)
        && cols <= stride
        && cols <= n
        && (rows - 1) * stride + cols <= len
        && level.is_supported()
}

/// Columns per step (f32 lanes of one vector).
pub(crate) const COLS: usize = 16;

/// For each of the `cols` columns (a multiple of [`COLS`]) `c`: `out[j][c] = sum_i
/// x[i * stride + c] * R[i][j]`, `x` holding 16 rows `stride` apart, `out[j]` at least
/// `cols` long. Returns `false`, writing nothing, unless the CPU has AVX-512 and the
/// lengths fit; the caller then sums with its portable loop.
#[inline(always)]
pub(crate) fn hadamard_sums<const N: usize>(
    x: &[f32],
    stride: usize,
    cols: usize,
    out: &mut [[f32; N]; DIM],
) -> bool {
    if !fits(x.len(), (DIM, stride), cols, COLS, N) {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F (checked above); the lengths were checked above.
    unsafe { sums(x, stride, cols, out) };
    true
}

/// [`hadamard_sums`] after its checks.
///
/// # Safety
/// The CPU must have AVX-512 F; `cols % 16 == 0`, `cols <= out[j].len()` and
/// `15 * stride + cols <= x.len()`.
#[target_feature(enable = "avx512f")]
unsafe fn sums<const N: usize>(x: &[f32], stride: usize, cols: usize, out: &mut [[f32; N]; DIM]) {
    for c in (0..cols).step_by(COLS) {
        let mut rows = [_mm512_setzero_ps(); DIM];
        for (i, r) in rows.iter_mut().enumerate() {
            // SAFETY: `i * stride + c + 16 <= 15 * stride + cols <= x.len()`; one
            // unaligned 512-bit load.
            *r = unsafe { _mm512_loadu_ps(x.as_ptr().add(i * stride + c)) };
        }
        let y = forward_step(&rows);
        for (o, y) in out.iter_mut().zip(y) {
            // SAFETY: `c + 16 <= cols <= o.len()`; one unaligned 512-bit store.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(c), y) };
        }
    }
}

/// The forward sums of one 16-column step: `y[j] = sum_i v_i * R[i][j]` in index order
/// from `+0.0`, row `i` of the step in `rows[i]`. Each `(i, j)` step is one add or
/// subtract of `v_i * 0.25`, its sign fixed at compile time.
///
/// The rows come as an array, not as a closure: a closure made in a caller with more
/// target features than this function cannot be inlined into it, and where the
/// caller's codegen unit did not inline this function first (the default release
/// profile, with no LTO) every row was a call and the sums went through memory
/// (the RHT quantize x2.2 slower than under this workspace's thin LTO).
#[target_feature(enable = "avx512f")]
#[inline]
fn forward_step(rows: &[__m512; DIM]) -> [__m512; DIM] {
    let quarter = _mm512_set1_ps(0.25);
    let mut y: [__m512; DIM] = [_mm512_setzero_ps(); DIM];
    macro_rules! steps {
        ($i:literal: $($j:literal)*) => {{
            let q = _mm512_mul_ps(rows[$i], quarter);
            $(
                y[$j] = if NEG[$i][$j] {
                    _mm512_sub_ps(y[$j], q)
                } else {
                    _mm512_add_ps(y[$j], q)
                };
            )*
        }};
    }
    macro_rules! rows {
        ($($i:literal)*) => {$( steps!($i: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15); )*};
    }
    rows!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    y
}

/// Whether every partial sum of every column of `rows` (16 bf16 rows of 16 columns,
/// each value scaled by ±0.25) is exact in f32, so that the sums come out the same in
/// any order: true where, in each column, the nonzero values' exponent fields span at
/// most 12 (subnormals counted as field 1) and the largest is at most 252.
///
/// Why that suffices: `v * ±0.25` with `v`'s field `e` is an integer below 2^8 times
/// `2^(max(e, 1) - 136)`, so every partial sum is a multiple of `2^g` with
/// `g = max(emin, 1) - 136`, and below `16 * 2^(emax - 128) = 2^(emax - 124)` in
/// magnitude: an integer below `2^(emax - max(emin, 1) + 12) <= 2^24` times `2^g`,
/// which f32 holds exactly (`g >= -135`), and below `2^128` (no overflow) when
/// `emax <= 252`. Infinities and NaN (field 255) fail the test.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn sums_exact(rows: &[__m256i; DIM]) -> bool {
    let magnitude = _mm256_set1_epi16(0x7FFF);
    let one = _mm256_set1_epi16(1);
    let mut hi = _mm256_setzero_si256();
    // Smallest nonzero magnitude minus one (a zero wraps to 0xFFFF and loses).
    let mut lo = _mm256_set1_epi16(-1);
    for &r in rows {
        let a = _mm256_and_si256(r, magnitude);
        hi = _mm256_max_epu16(hi, a);
        lo = _mm256_min_epu16(lo, _mm256_sub_epi16(a, one));
    }
    let emax = _mm256_srli_epi16::<7>(hi);
    // An all-zero column wraps back to 0 here: field 0, counted as 1 like subnormals.
    let emin = _mm256_max_epu16(_mm256_srli_epi16::<7>(_mm256_add_epi16(lo, one)), one);
    let bound = _mm256_min_epu16(
        _mm256_add_epi16(emin, _mm256_set1_epi16(12)),
        _mm256_set1_epi16(252),
    );
    _mm256_cmpgt_epu16_mask(emax, bound) == 0
}

/// The four stages of a 16-point fast Walsh-Hadamard transform in place on the array
/// `$v`, Sylvester order: afterwards `v[i] = sum_j H16[i][j] * v_in[j]` (`H16`
/// symmetric), computed with the vector functions `$add` and `$sub`. With a fourth
/// argument `$end`, only the stages of distance below it (`DIM / 2`: the first three,
/// each within an 8-row half). A macro, not a function taking closures, for the reason
/// [`forward_step`] gives; and written as loops with an `if`, which LLVM unrolls, where
/// an iterator `filter` over the rows kept the vectors on the stack (x1.2 against x1.5
/// for the i32 inverse, `crate::rht_int`).
macro_rules! butterflies {
    ($v:ident, $add:path, $sub:path) => {
        butterflies!($v, $add, $sub, DIM)
    };
    ($v:ident, $add:path, $sub:path, $end:expr) => {{
        let mut h = 1;
        while h < $end {
            for a in 0..DIM {
                if a & h == 0 {
                    let (p, q) = ($v[a], $v[a + h]);
                    $v[a] = $add(p, q);
                    $v[a + h] = $sub(p, q);
                }
            }
            h *= 2;
        }
    }};
}
pub(crate) use butterflies;

/// The forward sums of one 16-column step of bf16 rows (bit patterns) whose partial
/// sums are all exact ([`sums_exact`]): `y = H16 (s * 0.25 * v)` by a fast
/// Walsh-Hadamard transform, 64 adds where the index order takes 256, with the same
/// results. Each row is widened as it is scaled. `v * (±0.25) + 0.0` turns a `-0` input
/// into `+0`, so no sum is `-0`: in index order from `+0.0` an exact zero is `+0` too.
#[target_feature(enable = "avx512f")]
#[inline]
fn fast_forward_step(rows: &[__m256i; DIM]) -> [__m512; DIM] {
    let zero = _mm512_setzero_ps();
    let mut w = [zero; DIM];
    // `R[i][0]` is `s_i * 0.25` (column 0 of `H16` is all ones).
    for ((w, &h), ri) in w.iter_mut().zip(rows).zip(&R) {
        *w = _mm512_fmadd_ps(widen_bf16_bits(h), _mm512_set1_ps(ri[0]), zero);
    }
    butterflies!(w, _mm512_add_ps, _mm512_sub_ps);
    w
}

/// 16 bf16 bit patterns widened exactly into f32 lanes (a shift into the high half).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn widen_bf16_bits(h: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
}

/// The 16 columns at `c` of 16 bf16 rows `stride` apart, as bit patterns. A macro, as
/// `bf16_sums!` is. The caller must have AVX-512 F, BW and VL enabled and
/// `15 * stride + c + 16 <= bits.len()`.
macro_rules! bf16_rows {
    ($bits:expr, $stride:expr, $c:expr) => {{
        let (bits, stride, c): (&[u16], usize, usize) = ($bits, $stride, $c);
        let mut rows = [_mm256_setzero_si256(); DIM];
        for (i, r) in rows.iter_mut().enumerate() {
            // SAFETY: `i * stride + c + 16 <= bits.len()` (the caller's promise); one
            // unaligned 256-bit load of 16 bf16 patterns.
            *r = unsafe { _mm256_loadu_si256(bits.as_ptr().add(i * stride + c).cast()) };
        }
        rows
    }};
}

/// The forward sums `y` of 16 columns of 16 bf16 rows ([`bf16_rows`]), widened from the
/// bits: by the fast transform where that is exact ([`sums_exact`]), else in index
/// order; then `$body`, which uses `$y`, written out in both branches. A macro, so that
/// every kernel inlines it (a `#[target_feature]` function cannot be
/// `#[inline(always)]`, and as a call its 1 KiB result went through memory); the body
/// in each branch, because where the two branches' sums met after them they went
/// through the stack too (16 stores and loads per step; the RHT quantize x1.02 on one
/// thread without them). The caller must have AVX-512 F, BW and VL enabled.
macro_rules! bf16_sums {
    ($rows:expr, |$y:ident| $body:expr) => {{
        let rows: [__m256i; DIM] = $rows;
        if sums_exact(&rows) {
            let $y = fast_forward_step(&rows);
            $body
        } else {
            let mut wide = [_mm512_setzero_ps(); DIM];
            for (w, &h) in wide.iter_mut().zip(&rows) {
                *w = widen_bf16_bits(h);
            }
            let $y = forward_step(&wide);
            $body
        }
    }};
}

/// `y` rounded to bf16 (nearest even), as f32: `bf16::from_f32(y).to_f32()` lane by
/// lane, NaN included (the quiet bit set, sign and top payload kept), subnormals
/// rounded like any other value (where `vcvtneps2bf16` would flush them).
#[target_feature(enable = "avx512f,avx512dq")]
#[inline]
fn round_bf16(y: __m512) -> __m512 {
    let b = _mm512_castps_si512(y);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb);
    // Quiet or signalling NaN.
    let nan = _mm512_fpclass_ps_mask::<0x81>(y);
    let r = _mm512_mask_or_epi32(r, nan, b, _mm512_set1_epi32(0x0040_0000));
    _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(!0xFFFF)))
}

/// The columnwise operand of a 16-row group of bf16 input, straight from its bits:
/// for each of the `cols` columns (a multiple of [`COLS`]) `c`, `out[j][c] =
/// bf16(sum_i x[i * stride + c] * R[i][j])` (the sums of [`hadamard_sums`], rounded to
/// nearest even, held as f32), and `amax[c] = max_j |out[j][c]|` ignoring NaN, from 0.
///
/// Widening, summing, rounding and the column maxima happen in registers, where the
/// portable path widens the group into a scratch, sums, rounds and folds the maxima in
/// three more passes over it. Returns `false`, writing nothing, unless the CPU has
/// AVX-512 and the lengths fit.
#[inline(always)]
pub(crate) fn rounded_sums_bf16<const N: usize>(
    bits: &[u16],
    stride: usize,
    cols: usize,
    out: &mut [[f32; N]; DIM],
    amax: &mut [f32; N],
) -> bool {
    if !fits(bits.len(), (DIM, stride), cols, COLS, N) {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F, DQ, BW and VL (checked above, in `Level::Avx512`);
    // the lengths were checked above.
    unsafe { sums_bf16(bits, stride, cols, out, amax) };
    true
}

/// [`rounded_sums_bf16`] after its checks.
///
/// # Safety
/// The CPU must have AVX-512 F, DQ, BW and VL; `cols % 16 == 0`, `cols <= N` and
/// `15 * stride + cols <= bits.len()`.
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
unsafe fn sums_bf16<const N: usize>(
    bits: &[u16],
    stride: usize,
    cols: usize,
    out: &mut [[f32; N]; DIM],
    amax: &mut [f32; N],
) {
    for c in (0..cols).step_by(COLS) {
        // `15 * stride + c + 16 <= 15 * stride + cols <= bits.len()`.
        bf16_sums!(bf16_rows!(bits, stride, c), |y| {
            let mut m = _mm512_setzero_ps();
            for (o, y) in out.iter_mut().zip(y) {
                let r = round_bf16(y);
                // `vmaxps` returns its second operand when either is NaN: a NaN loses.
                m = _mm512_max_ps(_mm512_abs_ps(r), m);
                // SAFETY: `c + 16 <= cols <= N`; one unaligned 512-bit store.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(c), r) };
            }
            // SAFETY: as the stores above.
            unsafe { _mm512_storeu_ps(amax.as_mut_ptr().add(c), m) };
        });
    }
}

/// [`rounded_sums_bf16`] with the rounded operand kept as bf16 bits, two rows to a
/// u32: `out[q][c]` holds the bit pattern of row `2q`'s `bf16(sum_i x[i * stride + c]
/// * R[i][2q])` in its low half and row `2q + 1`'s in its high half (the two rows a
/// columnwise pair byte packs); `amax[c]` as there.
///
/// Why: the narrowing is one `vcvtne2ps2bf16` per two rows ([`narrow32_exact`]; the
/// integer formula for a step holding a subnormal sum) and one `vpermw` to interleave
/// them, where [`round_bf16`] takes seven operations per row and keeps each value 32
/// bits wide; the pair encoder then gets both rows of a column from one load, each
/// widened by one operation (a shift, a mask: [`crate::x86_encode::encode_bf16x2_rn`]).
/// Returns `false`, writing nothing, unless the CPU has AVX-512 with BF16 (not hidden)
/// and the lengths fit.
#[inline(always)]
pub(crate) fn rounded_bf16x2<const N: usize>(
    bits: &[u16],
    stride: usize,
    cols: usize,
    out: &mut [[u32; N]; DIM / 2],
    amax: &mut [f32; N],
) -> bool {
    if !fits(bits.len(), (DIM, stride), cols, COLS, N) || !has(Ext::Bf16) {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F, DQ, BW and VL (checked above, in `Level::Avx512`)
    // and BF16 (checked above); the lengths were checked above.
    unsafe { sums_bf16x2(bits, stride, cols, out, amax) };
    true
}

/// `vpermw` indices interleaving lanes `0..16` (low halves) with `16..32` (high).
const INTERLEAVE: [u16; 32] = {
    let mut idx = [0u16; 32];
    let mut c = 0;
    while c < 16 {
        idx[2 * c] = c as u16;
        idx[2 * c + 1] = 16 + c as u16;
        c += 1;
    }
    idx
};

/// [`rounded_bf16x2`] after its checks.
///
/// # Safety
/// The CPU must have AVX-512 F, DQ, BW, VL and BF16; `cols % 16 == 0`, `cols <= N`
/// and `15 * stride + cols <= bits.len()`.
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx512bf16")]
unsafe fn sums_bf16x2<const N: usize>(
    bits: &[u16],
    stride: usize,
    cols: usize,
    out: &mut [[u32; N]; DIM / 2],
    amax: &mut [f32; N],
) {
    let magnitude = _mm512_set1_epi16(0x7FFF);
    let inf = _mm512_set1_epi16(0x7F80);
    // SAFETY: 64 bytes read from a 64-byte array (unaligned load).
    let interleave = unsafe { _mm512_loadu_si512(INTERLEAVE.as_ptr().cast()) };
    for c in (0..cols).step_by(COLS) {
        // `15 * stride + c + 16 <= 15 * stride + cols <= bits.len()`.
        bf16_sums!(bf16_rows!(bits, stride, c), |y| {
            let mut m = _mm512_setzero_si512();
            for (q, o) in out.iter_mut().enumerate() {
                // Lanes 0..16: row 2q's 16 columns, lanes 16..32: row 2q + 1's.
                let v = narrow32_exact(y[2 * q], y[2 * q + 1]);
                // Magnitude patterns order as the values do; a NaN's (above infinity's)
                // leaves the maximum as it is.
                let a = _mm512_and_si512(v, magnitude);
                m = _mm512_mask_max_epu16(m, _mm512_cmple_epu16_mask(a, inf), m, a);
                // SAFETY: `c + 16 <= cols <= N`; one unaligned 512-bit store.
                unsafe {
                    _mm512_storeu_si512(
                        o.as_mut_ptr().add(c).cast(),
                        _mm512_permutexvar_epi16(interleave, v),
                    );
                }
            }
            let m = _mm256_max_epu16(_mm512_castsi512_si256(m), _mm512_extracti64x4_epi64::<1>(m));
            // SAFETY: as the stores above; one unaligned 512-bit store.
            unsafe { _mm512_storeu_ps(amax.as_mut_ptr().add(c), widen_bf16_bits(m)) };
        });
    }
}

/// The largest `|x|` and `|y|` of a 16-row group of bf16 input `x` (NaN ignored, from
/// 0): `x` as given, for the tensor's amax, and the unrounded sums of
/// [`rounded_sums_bf16`] (the columnwise operand `y`), for its rotated amax. Rounding
/// to bf16 is monotone and odd, so the amax of the rounded `y` is this maximum rounded
/// once (`bf16::from_f32(m).to_f32()`), which the caller does after folding every
/// group: no rounding or store per value here. Both come from one load of the group,
/// where a separate pass for `|x|` read the input a second time. `None` unless the CPU
/// has AVX-512 and the lengths fit (as [`rounded_sums_bf16`]).
///
/// `floor` is the caller's running maximum of `|y|`: a step of 16 columns whose sums
/// cannot exceed it ([`sum_limit`]) skips its sums, so the `|y|` returned is exact only
/// as `max(floor, |y|)`, which is all a running maximum needs. Once the running maximum
/// is near the tensor's, almost every step skips: a column's `|y|` stays well below the
/// bound `Σ|x| / 4` that decides it.
#[inline(always)]
pub(crate) fn sums_abs_max_bf16(
    bits: &[u16],
    stride: usize,
    cols: usize,
    floor: f32,
) -> Option<(f32, f32)> {
    if !fits(bits.len(), (DIM, stride), cols, COLS, usize::MAX) {
        return None;
    }
    // SAFETY: the CPU has AVX-512 F, BW and VL (checked above, in `Level::Avx512`); the
    // lengths were checked above.
    Some(unsafe { abs_max_bf16(bits, stride, cols, sum_limit(floor)) })
}

/// The largest f32 sum of a column's 16 magnitudes `|x_i|` (summed in any order) under
/// which none of the column's sums `|y_j|` can exceed `floor`, whether computed in
/// index order or by the fast transform; NaN (no sum qualifies) unless `floor` lies in
/// `[2^-100, 2^100]`.
///
/// Why: `|y_j| <= Σ|x_i| / 4` exactly; an f32 sum of 16 nonnegative terms is within a
/// factor `1 ± γ15` (`γ15 = 15u / (1 - 15u)`, `u = 2^-24`) of the exact one, and the
/// index-order `y_j` within `γ15 Σ|x_i| / 4` of the exact `y_j` (the fast transform's
/// are exact), so `|y_j| <= S / 4 * (1 + 31u)` for the computed sum `S`. With `S <= 4 *
/// round(floor * (1 - 2^-17))` that is at most `floor * (1 - 2^-17)(1 + u)(1 + 31u) <
/// floor`. The range keeps every product normal and finite (no underflow to loosen the
/// bounds, no overflow of `4 * floor`).
pub(crate) fn sum_limit(floor: f32) -> f32 {
    const LOW: f32 = 7.888_609e-31; // 2^-100
    const HIGH: f32 = 1.267_650_6e30; // 2^100
    if (LOW..=HIGH).contains(&floor) {
        floor * (1.0 - 1.0 / 131_072.0) * 4.0
    } else {
        f32::NAN
    }
}

/// [`sums_abs_max_bf16`] after its checks.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL; `cols % 16 == 0` and
/// `15 * stride + cols <= bits.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn abs_max_bf16(bits: &[u16], stride: usize, cols: usize, limit: f32) -> (f32, f32) {
    let magnitude = _mm256_set1_epi16(0x7FFF);
    let inf = _mm256_set1_epi16(0x7F80);
    let high = _mm256_set1_epi32(!0xFFFF);
    let limit = _mm256_set1_ps(limit);
    let mut mx = _mm256_setzero_si256();
    let mut my = _mm512_setzero_ps();
    for c in (0..cols).step_by(COLS) {
        // `15 * stride + c + 16 <= 15 * stride + cols <= bits.len()`.
        let rows = bf16_rows!(bits, stride, c);
        // Each column's sum of magnitudes, widened from the bits two columns per u32
        // lane: the even column's by a shift, the odd one's by a mask. Even and odd rows
        // apart, so that no chain of dependent adds is 16 long.
        let zero = _mm256_setzero_ps();
        let (mut even, mut odd) = ([zero; 2], [zero; 2]);
        for pair in rows.chunks_exact(2) {
            for (h, &r) in pair.iter().enumerate() {
                // Magnitude patterns order as the values do; a NaN's (above infinity's)
                // leaves the maximum as it is.
                let a = _mm256_and_si256(r, magnitude);
                mx = _mm256_mask_max_epu16(mx, _mm256_cmple_epu16_mask(a, inf), mx, a);
                let e = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(a));
                even[h] = _mm256_add_ps(even[h], e);
                odd[h] = _mm256_add_ps(odd[h], _mm256_castsi256_ps(_mm256_and_si256(a, high)));
            }
        }
        // A NaN or infinite sum (or a NaN limit) is never at or below the limit.
        let below = _mm256_cmp_ps_mask::<_CMP_LE_OQ>(_mm256_add_ps(even[0], even[1]), limit)
            & _mm256_cmp_ps_mask::<_CMP_LE_OQ>(_mm256_add_ps(odd[0], odd[1]), limit);
        if below == 0xFF {
            continue;
        }
        bf16_sums!(rows, |y| {
            for y in y {
                // `vmaxps` returns its second operand when either is NaN: a NaN loses.
                my = _mm512_max_ps(_mm512_abs_ps(y), my);
            }
        });
    }
    // Lanes folded the same way (a NaN lane cannot occur: none entered either).
    let x = _mm512_reduce_max_epu32(_mm512_cvtepu16_epi32(mx));
    (f32::from_bits(x << 16), _mm512_reduce_max_ps(my))
}

/// Columns per step of [`inverse_nibbles`] (f64 lanes of one vector).
pub(crate) const INVERSE_COLS: usize = 8;

/// How [`inverse_nibbles`] rounds its f64 sums to the f32 it stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Narrow {
    /// Round to nearest even: the f32 output itself (`v as f32`).
    Nearest,
    /// Round to odd ([`quant_core::dtype::f64_to_f32_round_odd`]): a value whose
    /// nearest-even narrowing to bf16 or f16 is the single rounding of the f64 sum.
    Odd,
}

impl Narrow {
    /// `v` rounded to f32 this way (the scalar form of the in-register rounding).
    pub(crate) fn round(self, v: f64) -> f32 {
        match self {
            Narrow::Nearest => v as f32,
            Narrow::Odd => quant_core::dtype::f64_to_f32_round_odd(v),
        }
    }
}

/// The inverse transform of one 16-row group straight from its codes: for each of the
/// `f.len()` columns (a multiple of [`INVERSE_COLS`]) `c`, `out[i][c]` is `sum_j y_j *
/// R[i][j]` in f64, rounded to f32 as `narrow` says, where `y_j = e2m1(code_j) * f[c]`
/// (the f32 product of the portable decode) and `code_j` is nibble `j % 2` (low first)
/// of `pairs[(j / 2) * stride + c]`.
///
/// Each step decodes 8 columns of two rows per `vpermps` and takes the sums
/// `s_i * 0.25 * (H16 y)_i` from a fast Walsh-Hadamard transform (64 adds per 16 values
/// where the sums take 256), rounded in registers. The order of the sums differs from
/// [`crate::rht::inverse_16`]'s, and the results are still the same wherever they are
/// finite: the 16 values of a column share one block factor, so they are E2M1
/// multiples of it rounded to f32, within a factor 12 of each other (or subnormal),
/// and every partial sum of them is exact in f64, in any order. A column whose values
/// are not all finite (its sum `(H16 y)_0 = sum_j y_j` is then not finite; with finite
/// values every sum is below `4 * f32::MAX`) is summed again in index order.
///
/// Returns `false`, writing nothing, unless the CPU has AVX-512 and the lengths fit
/// (8 byte rows `stride` apart holding `f.len() <= N` columns).
#[inline(always)]
pub(crate) fn inverse_nibbles<const N: usize>(
    pairs: &[u8],
    stride: usize,
    f: &[f32],
    narrow: Narrow,
    out: &mut [[f32; N]; DIM],
) -> bool {
    // Two codes per byte: 8 byte rows.
    if !fits(pairs.len(), (DIM / 2, stride), f.len(), INVERSE_COLS, N) {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F, BW, DQ and VL (checked above, in `Level::Avx512`);
    // the lengths were checked above.
    unsafe { fwht_nibbles(pairs, stride, f, narrow, out) };
    true
}

/// Whether truncating a step's sums to f32 drops exactly the 29 low mantissa bits of
/// the f64 (so that they alone say whether it was inexact): true when every factor is
/// zero or has an exponent field of at least 4.
///
/// Why: the column's values `y = f32(c * f)` (`|c|` in `0.5..=6`) are then multiples
/// of `2^(e - 1 - 150)`, so every sum `s_i * 0.25 * (H16 y)_i` is a multiple of
/// `2^(e - 153) >= 2^-149`. In the normal f32 range truncation drops the 29 low bits;
/// below it the sum is a multiple of the subnormal spacing, exact, and its low bits are
/// zero; above it (at most `4 * 2^128`) truncation gives `f32::MAX`, whose last bit is
/// already set. A zero factor gives zero sums. Smaller factors leave bits below
/// `2^-149`, and the step compares the truncation with the sum instead.
#[target_feature(enable = "avx512f,avx512vl")]
#[inline]
fn sticky_in_low_bits(f: __m256) -> bool {
    let bits = _mm256_and_si256(_mm256_castps_si256(f), _mm256_set1_epi32(0x7FFF_FFFF));
    let large = _mm256_cmpge_epu32_mask(bits, _mm256_set1_epi32(4 << 23));
    let zero = _mm256_cmpeq_epi32_mask(bits, _mm256_setzero_si256());
    large | zero == 0xFF
}

/// [`inverse_nibbles`] after its checks.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, DQ and VL; `f.len() % 8 == 0`, `f.len() <= N`,
/// `f.len() <= stride` and `7 * stride + f.len() <= pairs.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
unsafe fn fwht_nibbles<const N: usize>(
    pairs: &[u8],
    stride: usize,
    f: &[f32],
    narrow: Narrow,
    out: &mut [[f32; N]; DIM],
) {
    // `s_i * 0.25` (`R[i][0]`: column 0 of `H16` is all ones): exact scalings.
    let mut post = [_mm512_setzero_pd(); DIM];
    for (p, ri) in post.iter_mut().zip(&R) {
        *p = _mm512_set1_pd(f64::from(ri[0]));
    }
    // SAFETY: `DECODE` is 16 f32 (one unaligned 512-bit load).
    let table = unsafe { _mm512_loadu_ps(e2m1::DECODE.as_ptr()) };
    // Lanes 0..8 take the low nibble (even row), lanes 8..16 the high one (odd row).
    let shift = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
    let one = _mm256_set1_epi32(1);
    let low29 = _mm512_set1_epi64(0x1FFF_FFFF);
    let mut next = 0;
    while next < f.len() {
        let c = next;
        // 16 columns in i32 lanes where their sums allow it, else 8 in f64.
        let whole = c + int::COLS <= f.len();
        // SAFETY: the CPU has AVX-512 F, BW and DQ; `c + 16 <= f.len() <= N`, and
        // `f.len() <= stride` and `7 * stride + f.len() <= pairs.len()` (this
        // function's contract).
        if whole && unsafe { int::inverse_step((pairs, stride), f, c, narrow, out) } {
            next += int::COLS;
            continue;
        }
        next += INVERSE_COLS;
        // SAFETY: `c + 8 <= f.len()`; one unaligned 256-bit load.
        let f8 = unsafe { _mm256_loadu_ps(f.as_ptr().add(c)) };
        let ff = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(f8), f8);
        let mut v = [_mm512_setzero_pd(); DIM];
        for p in 0..DIM / 2 {
            // SAFETY: `p * stride + c + 8 <= 7 * stride + f.len() <= pairs.len()`; one
            // unaligned 64-bit load.
            let b = unsafe { _mm_loadl_epi64(pairs.as_ptr().add(p * stride + c).cast()) };
            let codes = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi64(b, b)), shift);
            // `vpermps` reads the low four bits: the portable `decode_fast(code) * f`.
            let y = _mm512_mul_ps(ff, _mm512_permutexvar_ps(codes, table));
            v[2 * p] = _mm512_cvtps_pd(_mm512_castps512_ps256(y));
            v[2 * p + 1] = _mm512_cvtps_pd(_mm512_extractf32x8_ps::<1>(y));
        }
        // Afterwards `v[i] = sum_j H[i][j] * y[j]`.
        butterflies!(v, _mm512_add_pd, _mm512_sub_pd);
        // `v[0] - v[0]` is 0 where the column's values are finite, NaN elsewhere.
        let finite =
            _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(_mm512_sub_pd(v[0], v[0]), _mm512_setzero_pd());
        // Only round-to-odd has a sticky bit; f32 output rounds once, to nearest.
        let low_sticky = narrow == Narrow::Odd && sticky_in_low_bits(f8);
        for (i, o) in out.iter_mut().enumerate() {
            // `+ 0.0`: an exact zero is `+0` in index order (the sums start from `+0.0`),
            // but `-0.25 * +0` here. The product is exact, so one fused step rounds the
            // same as a multiply and an add.
            let vi = _mm512_fmadd_pd(v[i], post[i], _mm512_setzero_pd());
            let r = match narrow {
                Narrow::Nearest => _mm512_cvtpd_ps(vi),
                Narrow::Odd => {
                    // Truncated (RZ never overflows to infinity), then the last bit set
                    // where that was inexact.
                    let t = _mm512_cvt_roundpd_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(vi);
                    let inexact = if low_sticky {
                        _mm512_test_epi64_mask(_mm512_castpd_si512(vi), low29)
                    } else {
                        _mm512_cmp_pd_mask::<_CMP_NEQ_UQ>(_mm512_cvtps_pd(t), vi)
                    };
                    let t = _mm256_castps_si256(t);
                    // `t | 1` under the mask (0xFE: the OR of the three operands). As a
                    // masked `vpord` LLVM rewrote it to widen the mask to a vector, shift
                    // and OR, three instructions where this stays one.
                    _mm256_castsi256_ps(_mm256_mask_ternarylogic_epi32::<0xFE>(t, inexact, t, one))
                }
            };
            // SAFETY: `c + 8 <= f.len() <= N`; one unaligned 256-bit store.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(c), r) };
        }
        for l in (0..INVERSE_COLS).filter(|l| finite & (1 << l) == 0) {
            index_order_column(pairs, stride, f, c + l, narrow, out);
        }
    }
}

/// Column `c` of an inverse kernel's output summed in index order
/// ([`crate::rht::inverse_16`]): what the kernels do for a column with a non-finite
/// value, where the fast transform's order would differ.
pub(crate) fn index_order_column<const N: usize>(
    pairs: &[u8],
    stride: usize,
    f: &[f32],
    c: usize,
    narrow: Narrow,
    out: &mut [[f32; N]; DIM],
) {
    let col: [f32; DIM] = std::array::from_fn(|j| {
        let (lo, hi) = e2m1::unpack(pairs[j / 2 * stride + c]);
        e2m1::decode_fast(if j.is_multiple_of(2) { lo } else { hi }) * f[c]
    });
    for (o, s) in out.iter_mut().zip(crate::rht::inverse_16(&col)) {
        o[c] = narrow.round(s);
    }
}

/// What the tests of the bf16 forward kernels (AVX-512 and AVX2) share: inputs, and the
/// checks against [`crate::rht::forward_16`] and the input's maxima.
#[cfg(test)]
pub(crate) mod bf16_check {
    use super::DIM;
    use quantfmt_testkit::XorShift32;

    /// `n` random bf16 patterns of either sign whose exponent fields lie in `base..=base +
    /// span` (at most 254: no infinity or NaN), mantissas random.
    fn window(rng: &mut XorShift32, n: usize, base: u32, span: u32) -> Vec<u16> {
        (0..n)
            .map(|_| {
                let r = rng.next_u32();
                let e = (base + (r >> 8) % (span + 1)).min(254) as u16;
                (e << 7) | (r >> 20) as u16 & 0x7F | (r as u16 & 0x8000)
            })
            .collect()
    }

    /// That `out` and `amax` (from a kernel's rounded sums of the bf16 rows `x`, `stride`
    /// apart) hold `forward_16` of every column, and each column's maximum of it.
    pub(crate) fn assert_forward_16<const N: usize>(
        x: &[u16],
        stride: usize,
        out: &[[f32; N]; DIM],
        amax: &[f32; N],
        what: &str,
    ) {
        use half::bf16;
        for c in 0..N {
            let v: [bf16; DIM] = std::array::from_fn(|i| bf16::from_bits(x[i * stride + c]));
            let want = crate::rht::forward_16(&v);
            let mut m = 0f32;
            for j in 0..DIM {
                let w = want[j].to_f32();
                assert_eq!(out[j][c].to_bits(), w.to_bits(), "{what} c {c} j {j}");
                m = quant_core::cpu::fmax_nan_loses(m, w.abs());
            }
            assert_eq!(amax[c].to_bits(), m.to_bits(), "amax {what} c {c}");
        }
    }

    /// 16 rows of 64 bf16 patterns (`stride` apart, returned) over the whole range:
    /// subnormal sums, sums that round up to infinity, wide magnitudes (so the order
    /// shows), and the specials.
    pub(crate) fn wide() -> (Vec<u16>, usize) {
        let stride = 72;
        let mut rng = XorShift32::new(0x0BAD_F00D);
        let mut x: Vec<u16> = (0..DIM * stride)
            .map(|_| {
                let s = rng.next_u32();
                match s % 11 {
                    0 => (s >> 16) as u16 & 0x807F,    // zero or subnormal
                    1 => 0x7F7F | (s as u16 & 0x8000), // bf16::MAX
                    _ => ((s >> 16) as u16 % 0x7F80) | (s as u16 & 0x8000),
                }
            })
            .collect();
        x[7] = 0x7FC0; // NaN
        x[stride + 9] = 0xFF81; // signalling NaN, negative
        x[2 * stride + 20] = 0x7F80; // +inf
        x[3 * stride + 21] = 0xFF80; // -inf, with +inf in the same column below
        x[4 * stride + 21] = 0x7F80;
        for i in 0..DIM {
            x[i * stride + 40] = 0x0001 + i as u16; // all subnormal
            x[i * stride + 41] = if i % 2 == 0 { 0x4040 } else { 0xC040 }; // cancels to +0
            x[i * stride + 42] = 0x8000; // -0 everywhere
        }
        (x, stride)
    }

    /// The rounded sums of narrow exponent windows (the steps the AVX-512 fast transform
    /// takes), value by value against `forward_16`, from `kernel(x, stride, out, amax)`
    /// over 64 columns: windows of normal sums, windows whose smallest field is 10 (sums
    /// down to `2^-126`) or 9 (subnormal sums, which `vcvtneps2bf16` would flush), sums
    /// that cancel to zero, all-zero columns, and steps mixed with one small field.
    pub(crate) fn narrow_windows(
        kernel: impl Fn(&[u16], usize, &mut [[f32; 64]; DIM], &mut [f32; 64]) -> bool,
    ) {
        let stride = 80;
        let mut rng = XorShift32::new(0x5EED_CAFE);
        for case in 0..400 {
            let (base, span) = [(120u32, 4u32), (10, 6), (9, 3), (127, 12), (60, 0)][case % 5];
            let mut x = window(&mut rng, DIM * stride, base, span);
            for i in 0..DIM {
                x[i * stride + 3] = 0; // an all-zero column
                // A column that cancels in every sum but the first.
                x[i * stride + 17] = 10 << 7;
            }
            if case % 7 == 0 {
                x[(case / 7) % (DIM * stride)] = 0x8000 | (3 << 7); // a small field
            }
            // Two nonzero values one unit apart: half the sums are `(v - w) / 4`, at
            // field 9 the subnormal 2^-127, at field 10 the smallest normal 2^-126.
            for (col, field) in [(30, 9u16), (40, 10)] {
                for i in 0..DIM {
                    x[i * stride + col] = 0;
                }
                x[col] = (field << 7) | 1;
                x[stride + col] = field << 7;
            }
            let mut out = [[0f32; 64]; DIM];
            let mut amax = [0f32; 64];
            assert!(kernel(&x, stride, &mut out, &mut amax));
            assert_forward_16(&x, stride, &out, &amax, &format!("case {case}"));
        }
    }

    /// That `maxima(x, stride, floor)` over 48 columns skips only sums at or below
    /// `floor`: `max(floor, |y|)` as with no floor, for floors at, just below, below and
    /// above the largest `|y|`, over narrow and wide exponent windows, with a column
    /// whose first sum is its whole bound (`x_i = s_i v`, so `y_0 = sum |x_i| / 4`) and
    /// sometimes a NaN.
    pub(crate) fn floors(maxima: impl Fn(&[u16], usize, f32) -> Option<(f32, f32)>) {
        use super::R;
        use quant_core::cpu::fmax_nan_loses as fmax;
        let stride = 48;
        let mut rng = XorShift32::new(0xF100_12ED);
        for case in 0..800 {
            let (base, span) = [(120u32, 4u32), (127, 1), (60, 30), (127, 0)][case % 4];
            let mut x = window(&mut rng, DIM * stride, base, span);
            let v = (127u16 << 7) | (rng.next_u32() as u16 & 0x7F);
            let col = (rng.next_u32() % 48) as usize;
            for (i, ri) in R.iter().enumerate() {
                x[i * stride + col] = v | if ri[0] < 0.0 { 0x8000 } else { 0 };
            }
            if case % 5 == 0 {
                let at = (rng.next_u32() as usize) % x.len();
                x[at] = 0x7FC0; // a NaN, ignored
            }
            let (mx, y) = maxima(&x, stride, 0.0).expect("fits");
            let below = f32::from_bits(y.to_bits() - 1);
            let floors = [
                y,
                below,
                y * 0.999,
                y * 0.75,
                y * 0.5,
                y * 2.0,
                0.3,
                2f32.powi(-101),
            ];
            for floor in floors {
                let (gx, gy) = maxima(&x, stride, floor).expect("fits");
                assert_eq!(gx.to_bits(), mx.to_bits(), "case {case} floor {floor}");
                assert_eq!(
                    fmax(floor, gy).to_bits(),
                    fmax(floor, y).to_bits(),
                    "case {case} floor {floor} y {y}"
                );
            }
        }
    }

    /// That `maxima(x, stride)` over 48 columns gives the largest `|x|` and the largest
    /// unrounded sum, whose rounding is the largest of `rounded(x, stride, ..)`'s column
    /// maxima: narrow exponent windows (the fast transform) and wide ones (index order),
    /// sometimes a NaN or an infinity, sometimes all zero.
    pub(crate) fn maxima(
        rounded: impl Fn(&[u16], usize, &mut [[f32; 48]; DIM], &mut [f32; 48]) -> bool,
        maxima: impl Fn(&[u16], usize) -> Option<(f32, f32)>,
    ) {
        use half::bf16;
        let stride = 48;
        let mut rng = XorShift32::new(0xA11C_E5ED);
        let round = |v: f32| bf16::from_f32(v).to_f32();
        for case in 0..3000 {
            let (base, span) = [(120u32, 4u32), (127, 12), (60, 200), (1, 3), (250, 4)][case % 5];
            let mut x = window(&mut rng, DIM * stride, base, span);
            match case % 7 {
                0 => x[(case / 7) % (DIM * stride)] = 0x7FC0 | (case as u16 & 0x8000),
                1 => x[(case / 7) % (DIM * stride)] = 0xFF80,
                2 => x.fill(0x8000),
                _ => {}
            }
            let mut out = [[0f32; 48]; DIM];
            let mut amax = [0f32; 48];
            assert!(rounded(&x, stride, &mut out, &mut amax));
            let want = amax
                .iter()
                .fold(0f32, |m, &a| quant_core::cpu::fmax_nan_loses(m, a));
            let (gx, gy) = maxima(&x, stride).expect("fits");
            assert_eq!(round(gy).to_bits(), want.to_bits(), "case {case}");
            // The input's own maximum: the 48 columns the call covers, NaN ignored.
            let wx = (0..DIM * stride)
                .filter(|n| n % stride < 48)
                .map(|n| quant_core::dtype::f32_from_bf16_bits(x[n]).abs())
                .fold(0f32, quant_core::cpu::fmax_nan_loses);
            assert_eq!(gx.to_bits(), wx.to_bits(), "x, case {case}");
        }
    }
}

/// What the tests of the exactness test and the fast forward transform (AVX-512 and
/// AVX2) share: the index-order specification, column generators and the two checks.
#[cfg(test)]
pub(crate) mod exact_check {
    use super::{DIM, R};
    use crate::rht::SIGN_MASK;
    use quantfmt_testkit::XorShift32;

    /// A kernel's exactness test and fast transform of the 16 columns at `c` of 16 bf16
    /// rows `stride` apart: `(exact, y)`, `y[j][c]` the fast sums (whether or not exact).
    pub(crate) type Fast = fn(&[u16], usize, usize) -> (bool, [[f32; 16]; DIM]);

    /// The index-order f32 sums of column `c` of 16 bf16 rows, `stride` apart.
    fn index_order(x: &[u16], stride: usize, c: usize) -> [f32; DIM] {
        let mut y = [0f32; DIM];
        for (i, ri) in R.iter().enumerate() {
            let v = quant_core::dtype::f32_from_bf16_bits(x[i * stride + c]);
            for (a, &r) in y.iter_mut().zip(ri) {
                *a += v * r;
            }
        }
        y
    }

    /// One column of 16 bf16 values from `rng`: field spread `spread` below `emax`
    /// (clamped at 0), random signs, sometimes a zero or `-0`, or, with `aligned`, 15
    /// values that all add up in `y[0]` (largest magnitude, the sign of `s_i`) and one
    /// of the smallest granularity, the case that needs every bit of the bound.
    fn column(rng: &mut XorShift32, emax: u16, spread: u16, aligned: bool) -> [u16; DIM] {
        let emin = emax.saturating_sub(spread);
        std::array::from_fn(|i| {
            let r = rng.next_u32();
            let s_neg = (SIGN_MASK >> i) & 1;
            if aligned {
                return if i == 7 {
                    (emin << 7) | 0x01 | ((r as u16) & 0x8000)
                } else {
                    (s_neg << 15) | (emax << 7) | 0x7F
                };
            }
            let e = match r % 8 {
                0 => emax,
                1 => emin,
                _ => emin + (r >> 8) as u16 % (emax - emin + 1),
            };
            let v = (e << 7) | ((r >> 20) as u16 & 0x7F) | ((r as u16) & 0x8000);
            match r % 29 {
                0 => 0,
                1 => 0x8000,
                _ => v,
            }
        })
    }

    /// Columns of narrow and wide exponent spreads, aligned so that every bit of the
    /// bound counts or not: `fast(x, 16, 0)` (16 columns of 16 rows, 16 apart: whether
    /// the exactness test takes them, and the fast transform's sums) takes exactly the
    /// columns the rule says, and there its sums are the index order's.
    pub(crate) fn exact_sums_take_the_fast_transform(fast: Fast) {
        let mut rng = XorShift32::new(0x51DE_CAFE);
        let (mut taken, mut refused) = (0, 0);
        for case in 0..4000 {
            let emax = [1u16, 12, 13, 127, 200, 252, 253][case % 7]
                .max((rng.next_u32() % 254) as u16 * (case % 3 == 0) as u16);
            let spread = [0u16, 5, 11, 12, 13, 20][case % 6];
            let aligned = case % 5 < 2;
            let cols: [[u16; DIM]; 16] =
                std::array::from_fn(|_| column(&mut rng, emax.min(254), spread, aligned));
            let x: Vec<u16> = (0..DIM * 16).map(|n| cols[n % 16][n / 16]).collect();
            let (exact, y) = fast(&x, 16, 0);
            // The test's rule, column by column: fields of the nonzero values, a
            // subnormal counted as 1.
            let want_exact = cols.iter().all(|col| {
                let fields = col
                    .iter()
                    .filter(|&&b| b & 0x7FFF != 0)
                    .map(|&b| (b >> 7) & 0xFF);
                let hi = fields.clone().max().unwrap_or(0);
                let lo = fields.min().unwrap_or(0).max(1);
                hi <= 252 && hi <= lo + 12
            });
            assert_eq!(
                exact, want_exact,
                "case {case}: emax {emax} spread {spread}"
            );
            if !exact {
                refused += 1;
                continue;
            }
            taken += 1;
            for c in 0..16 {
                let want = index_order(&x, 16, c);
                for (j, (yj, w)) in y.iter().zip(want).enumerate() {
                    assert_eq!(yj[c].to_bits(), w.to_bits(), "case {case} c {c} j {j}");
                }
            }
        }
        assert!(
            taken > 1000 && refused > 1000,
            "taken {taken}, refused {refused}"
        );
    }

    /// The exactness test's lines, one column varied at a time (the other columns
    /// zero): the spread of 12 and 13, zeros, subnormals, field 252 and 253, infinities
    /// and NaN; columns of signed zeros; and that a spread of 14 does sum differently in
    /// the fast transform (so the test must refuse it).
    pub(crate) fn lines_where_stated(fast: Fast) {
        // One column varied (column 5), the others zero.
        let check = |vals: &[u16]| {
            let mut x = [0u16; DIM * 16];
            for (i, &v) in vals.iter().enumerate() {
                x[i * 16 + 5] = v;
            }
            fast(&x, 16, 0).0
        };
        let f = |e: u16| e << 7 | 0x55;
        assert!(check(&[]), "all zero");
        assert!(check(&[0x8000, 0x8000]), "-0");
        assert!(check(&[f(100), f(88)]), "spread 12");
        assert!(!check(&[f(100), f(87)]), "spread 13");
        assert!(check(&[f(100), 0, f(88) | 0x8000]), "zeros do not count");
        assert!(check(&[f(13), 0x0001]), "subnormal counts as field 1");
        assert!(!check(&[f(14), 0x0001]), "subnormal and field 14");
        assert!(check(&[f(252), f(252) | 0x8000]), "field 252");
        assert!(!check(&[f(253)]), "field 253 may overflow");
        assert!(!check(&[0x7F80]), "infinity");
        assert!(!check(&[0x7FC1, f(100)]), "NaN");
        // Columns of signed zeros: every sum `+0`, as in index order from `+0.0`.
        let mut x = [0u16; DIM * 16];
        for (n, v) in x.iter_mut().enumerate() {
            *v = if (n * 7 + n / 16) % 3 == 0 { 0x8000 } else { 0 };
        }
        x[..16].fill(0x8000);
        let (exact, y) = fast(&x, 16, 0);
        assert!(exact);
        for c in 0..16 {
            let want = index_order(&x, 16, c);
            for (j, (yj, w)) in y.iter().zip(want).enumerate() {
                assert_eq!(yj[c].to_bits(), w.to_bits(), "zeros: c {c} j {j}");
            }
        }
        // The bound is near the edge: columns of spread 14 (15 large values that add up
        // in `y[0]` and one small one) sum differently from the index order. (Spread 13
        // needs several small values to round twice; the bound keeps to what it proves.)
        let mut differ = 0;
        for pos in 0..DIM {
            for small in (0..0x100u16).map(|m| (86 << 7) | (m & 0x7F) | (m & 0x80) << 8) {
                let mut x = [0u16; DIM * 16];
                for i in 0..DIM {
                    x[i * 16] = ((SIGN_MASK >> i) & 1) << 15 | (100 << 7) | 0x7F;
                }
                x[pos * 16] = small;
                let (exact, y) = fast(&x, 16, 0);
                assert!(!exact);
                let want = index_order(&x, 16, 0);
                differ += (0..DIM).any(|j| y[j][0].to_bits() != want[j].to_bits()) as usize;
            }
        }
        assert!(differ > 0);
    }
}

/// What the tests of the inverse kernels (AVX-512 and AVX2) share: one set of codes
/// and factors, and the check of a kernel's output against the index-order sums.
#[cfg(test)]
pub(crate) mod inverse_check {
    use super::{DIM, NEG, Narrow};
    use quant_core::codec::e2m1;
    use quantfmt_testkit::XorShift32;

    /// Codes (8 byte rows `stride` apart), `stride` and 1024 per-column factors.
    ///
    /// One column per factor: every exponent field (0..=255) twice, with random
    /// mantissas and signs, so both sides of the AVX-512 sticky-bit range (fields
    /// 27..=249) and subnormal, huge and non-finite factors all occur; then special
    /// factors. The sticky-bit bound (field 4) and its edges: fields 1..=3 give sums
    /// with bits below `2^-149`. Columns `INT_STEPS` are the i32 route's cases
    /// ([`int_steps`]).
    pub(crate) fn case() -> (Vec<u8>, usize, Vec<f32>) {
        let (cols, stride) = (1024, 1032);
        let mut rng = XorShift32::new(0x1234_5678);
        let mut f: Vec<f32> = (0..cols)
            .map(|c| {
                let field = (c % 256) as u32;
                let s = rng.next_u32();
                f32::from_bits((s & 0x8000_0000) | field << 23 | (s >> 9))
            })
            .collect();
        let special = [
            0.0,
            -0.0,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(4 << 23),
            f32::from_bits((3 << 23) | 0x7F_FFFF),
            f32::from_bits((4 << 23) | 0x40_0001),
            f32::from_bits((251 << 23) | 0x7F_FFFF),
            f32::INFINITY,
            f32::NAN,
            1.0,
        ];
        f[512..512 + special.len()].copy_from_slice(&special);
        // Many columns just below the bound, where a small sum can fall below the normal
        // range with bits under the subnormal spacing.
        for (c, fc) in f.iter_mut().enumerate().take(768).skip(640) {
            let s = rng.next_u32();
            *fc = f32::from_bits((1 + c as u32 % 3) << 23 | (s >> 9));
        }
        let mut pairs: Vec<u8> = (0..DIM / 2 * stride)
            .map(|_| rng.next_u32() as u8)
            .collect();
        // Columns whose sums cancel or add up: one code everywhere (6.0, -6.0, 1.5),
        // and the signs of a row of R with the largest code (every sum but one zero).
        for (c, byte) in [
            (600, 0x77u8),
            (601, 0xFF),
            (602, 0x33),
            (603, 0x00),
            (604, 0x88),
        ] {
            for p in 0..DIM / 2 {
                pairs[p * stride + c] = byte;
            }
        }
        for c in [605, 606] {
            f[c] = if c == 605 { f32::MAX } else { 3.0e38 };
            for p in 0..DIM / 2 {
                let code = |j: usize| 0x7 | if NEG[0][j] { 0x8 } else { 0 };
                pairs[p * stride + c] = code(2 * p) | code(2 * p + 1) << 4;
            }
        }
        // One value 0.5 * f, the rest zero: every sum is `±f / 8`, below the normal
        // range with its last bit `2^(e - 153)`, under the subnormal spacing for fields
        // 1..=3 (odd mantissas) and on it for field 4.
        // Each in a step of its own: one such factor takes its whole AVX-512 step off
        // the sticky-bit test.
        for (c, field) in [(616, 1), (624, 2), (632, 3), (611, 4)] {
            f[c] = f32::from_bits(field << 23 | 1);
            for p in 0..DIM / 2 {
                pairs[p * stride + c] = u8::from(p == 0);
            }
        }
        int_steps(&mut pairs, stride, &mut f, &mut rng);
        (pairs, stride, f)
    }

    /// The columns of [`int_steps`]: 16 steps of 16, from column 768.
    pub(crate) const INT_STEPS: std::ops::Range<usize> = 768..1024;

    /// The columns of [`INT_STEPS`] that make the i32 routes ([`crate::rht_int`])
    /// decline the step holding them; they take every other step of those columns.
    /// The steps of 16 from 768, 816, 864 and 880 hold the taken cases: fields 27 and
    /// 249 (the range's ends), a sum and a difference of exactly `-2^31`, a sum that
    /// rounds up to `2^31`, zero factors
    /// of both signs with zero codes and sums that cancel, and the signs of a row of R
    /// with the largest code. The rest have random codes and factors with fields in
    /// `27..=249` (many inexact sums).
    pub(crate) const INT_DECLINED: [usize; 5] = [
        784 + 5,  // a factor of field 26
        800 + 9,  // a factor of field 250
        832 + 3,  // a sum of +2^31: the last stage's add wraps
        848 + 15, // sums of 3 * 2^30: the last stage's add wraps
        896 + 7,  // a difference of +2^31: the last stage's subtract wraps
    ];

    /// Writes the `INT_STEPS` columns (see [`INT_DECLINED`]).
    fn int_steps(pairs: &mut [u8], stride: usize, f: &mut [f32], rng: &mut XorShift32) {
        let mut factor = |field: u32| {
            let s = rng.next_u32();
            f32::from_bits((s & 0x8000_0000) | field << 23 | (s >> 9))
        };
        for c in INT_STEPS {
            f[c] = factor(27 + c as u32 % 223);
        }
        f[768] = factor(27);
        f[769] = factor(249);
        f[770] = f32::from_bits(249 << 23 | 0x7F_FFFF);
        f[771] = f32::from_bits(27 << 23);
        f[784 + 5] = factor(26);
        f[800 + 9] = factor(250);
        // `round24(12 * 11184811) = 2^27`: sixteen codes of -6 sum to `-2^31` (fits)
        // and of +6 to `+2^31` (wraps).
        let m = f32::from_bits(120 << 23 | (11_184_811 - (1 << 23)));
        let same = |pairs: &mut [u8], c: usize, byte: u8| {
            for p in 0..DIM / 2 {
                pairs[p * stride + c] = byte;
            }
        };
        (f[816 + 3], f[816 + 4], f[832 + 3], f[896 + 7]) = (m, m, m, m);
        same(pairs, 816 + 3, 0xFF);
        same(pairs, 832 + 3, 0x77);
        // `(H16 Y)_8` adds rows 0..8 and subtracts rows 8..16 (the last stage's
        // difference): -6 then +6 gives `-2^31`, +6 then -6 `+2^31`.
        for p in 0..DIM / 2 {
            let (first, second) = if p < DIM / 4 {
                (0xFF, 0x77)
            } else {
                (0x77, 0xFF)
            };
            pairs[p * stride + 816 + 4] = first;
            pairs[p * stride + 896 + 7] = second;
        }
        // A sum of `2^31 - 20`, which rounds to nearest up to `2^31` (AVX2's round to
        // odd converts that back to `-2^31` and steps it down to `2^31 - 128`).
        f[816 + 5] = f32::from_bits(120 << 23 | (16_025_997 - (1 << 23)));
        let codes: [u8; DIM] = [4, 4, 4, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7];
        for p in 0..DIM / 2 {
            pairs[p * stride + 816 + 5] = codes[2 * p] | codes[2 * p + 1] << 4;
        }
        // The largest significand: `16 * round24(12 * (2^24 - 1)) = 3 * 2^30`.
        f[848 + 15] = f32::from_bits(200 << 23 | 0x7F_FFFF);
        same(pairs, 848 + 15, 0x77);
        for (l, fl) in [0.0, -0.0, 0.0, -0.0].into_iter().enumerate() {
            f[864 + l] = fl;
        }
        for (l, byte) in [0x33u8, 0x00, 0x88, 0xBB, 0x11].into_iter().enumerate() {
            same(pairs, 864 + 4 + l, byte);
        }
        for (l, neg) in NEG.iter().enumerate().take(4) {
            let c = 880 + l;
            // Significands below `1.25 * 2^23`: `16 * 12 * m` stays below `2^31`.
            f[c] = f32::from_bits((200 + l as u32) << 23 | rng.next_u32() >> 11);
            for p in 0..DIM / 2 {
                let code = |j: usize| 0x7 | if neg[j] { 0x8 } else { 0 };
                pairs[p * stride + c] = code(2 * p) | code(2 * p + 1) << 4;
            }
        }
    }

    /// That `kernel(pairs, stride, f, narrow, out)` takes [`case`] and writes
    /// [`crate::rht::inverse_16`] of every column, rounded as `narrow` says, bit for
    /// bit, with both roundings.
    pub(crate) fn assert_index_order(
        kernel: impl Fn(&[u8], usize, &[f32], Narrow, &mut [[f32; 1024]; DIM]) -> bool,
    ) {
        let (pairs, stride, f) = case();
        let value = |c: usize, j: usize| {
            let (lo, hi) = e2m1::unpack(pairs[j / 2 * stride + c]);
            e2m1::decode_fast(if j.is_multiple_of(2) { lo } else { hi }) * f[c]
        };
        for narrow in [Narrow::Nearest, Narrow::Odd] {
            let mut out = Box::new([[0f32; 1024]; DIM]);
            assert!(kernel(&pairs, stride, &f, narrow, &mut out));
            for c in 0..f.len() {
                let col: [f32; DIM] = std::array::from_fn(|j| value(c, j));
                let want = crate::rht::inverse_16(&col);
                for i in 0..DIM {
                    let want = narrow.round(want[i]);
                    assert_eq!(
                        out[i][c].to_bits(),
                        want.to_bits(),
                        "{narrow:?} c {c} f {:e} i {i}",
                        f[c]
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_the_product_form_in_index_order() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let stride = 40;
        let x = crate::rht::sums_check::rows(stride);
        let mut out = [[0f32; 256]; DIM];
        assert!(hadamard_sums(&x, stride, 32, &mut out));
        crate::rht::sums_check::assert_index_order(&x, stride, 32, &out);
        // Lengths that do not fit are refused.
        assert!(!hadamard_sums(&x, stride, 48, &mut out));
        assert!(!hadamard_sums(&x[..15 * stride + 31], stride, 32, &mut out));
    }

    use super::bf16_check;

    #[test]
    fn rounded_bf16_sums_of_fast_steps_equal_forward_16() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        bf16_check::narrow_windows(|x, stride, out, amax| {
            rounded_sums_bf16(x, stride, 64, out, amax)
        });
    }

    #[test]
    fn rounded_bf16_sums_equal_forward_16() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let (x, stride) = bf16_check::wide();
        let mut out = [[0f32; 64]; DIM];
        let mut amax = [0f32; 64];
        assert!(rounded_sums_bf16(&x, stride, 64, &mut out, &mut amax));
        bf16_check::assert_forward_16(&x, stride, &out, &amax, "wide");
        // Lengths that do not fit are refused.
        assert!(!rounded_sums_bf16(&x, stride, 40, &mut out, &mut amax));
        let short = &x[..15 * stride + 63];
        assert!(!rounded_sums_bf16(short, stride, 64, &mut out, &mut amax));
    }

    /// [`rounded_bf16x2`] of `cols` columns, its words unpacked into the f32 rows that
    /// [`bf16_check`] compares (row `2q` from the low halves of `w[q]`, row `2q + 1`
    /// from the high halves).
    fn bf16x2_rows<const N: usize>(
        x: &[u16],
        stride: usize,
        cols: usize,
        out: &mut [[f32; N]; DIM],
        amax: &mut [f32; N],
    ) -> bool {
        let mut w = [[0u32; N]; DIM / 2];
        if !rounded_bf16x2(x, stride, cols, &mut w, amax) {
            return false;
        }
        for (q, words) in w.iter().enumerate() {
            for (c, &v) in words.iter().enumerate() {
                (out[2 * q][c], out[2 * q + 1][c]) = crate::engine::bf16x2_values(v);
            }
        }
        true
    }

    /// Whether the interleaved-bits kernel runs here; says why not where it does not.
    fn bf16x2_runs() -> bool {
        let runs = Level::Avx512.is_supported() && has(Ext::Bf16);
        if !runs {
            eprintln!("skipped: this CPU has no AVX-512 with BF16 (or it is hidden)");
        }
        runs
    }

    #[test]
    fn interleaved_bf16_sums_equal_forward_16() {
        use quant_core::simd::with_extensions_hidden;
        // The kernel asks `has(Ext::Bf16)` on every call, and other tests of this
        // binary hide extensions process-wide while they run (`for_each_supported_level`):
        // holding the same lock with nothing hidden keeps them out for the checks.
        let (x, stride) = bf16_check::wide();
        let ran = with_extensions_hidden(&[], || {
            if !bf16x2_runs() {
                return false;
            }
            // Narrow windows (the fast transform, subnormal sums at the 2^-126 edge,
            // which `vcvtne2ps2bf16` would flush and the integer narrowing takes), then
            // the wide case (index order, NaN, infinities, -0).
            bf16_check::narrow_windows(|x, stride, out, amax| {
                bf16x2_rows(x, stride, 64, out, amax)
            });
            let mut out = [[0f32; 64]; DIM];
            let mut amax = [0f32; 64];
            assert!(bf16x2_rows(&x, stride, 64, &mut out, &mut amax));
            bf16_check::assert_forward_16(&x, stride, &out, &amax, "wide");
            bf16_check::maxima(
                |x, stride, out, amax| bf16x2_rows(x, stride, 48, out, amax),
                |x, stride| sums_abs_max_bf16(x, stride, 48, 0.0),
            );
            // Lengths that do not fit are refused.
            let mut w = [[0u32; 64]; DIM / 2];
            assert!(!rounded_bf16x2(&x, stride, 40, &mut w, &mut amax));
            let short = &x[..15 * stride + 63];
            assert!(!rounded_bf16x2(short, stride, 64, &mut w, &mut amax));
            true
        });
        if ran {
            // And so is a CPU without BF16.
            let (mut w, mut amax) = ([[0u32; 64]; DIM / 2], [0f32; 64]);
            let hidden = with_extensions_hidden(&[Ext::Bf16], || {
                rounded_bf16x2(&x, stride, 64, &mut w, &mut amax)
            });
            assert!(!hidden);
        }
    }

    #[test]
    fn unrounded_maximum_rounds_to_the_rounded_maximum() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        bf16_check::maxima(
            |x, stride, out, amax| rounded_sums_bf16(x, stride, 48, out, amax),
            |x, stride| sums_abs_max_bf16(x, stride, 48, 0.0),
        );
        assert_eq!(sums_abs_max_bf16(&[0u16; DIM * 16], 16, 32, 0.0), None);
        assert_eq!(sums_abs_max_bf16(&[0u16; DIM * 16], 16, 8, 0.0), None);
    }

    #[test]
    fn the_running_floor_skips_only_sums_below_it() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        assert!(sum_limit(0.0).is_nan() && sum_limit(f32::INFINITY).is_nan());
        assert!(sum_limit(2f32.powi(-101)).is_nan() && sum_limit(2f32.powi(101)).is_nan());
        assert_eq!(sum_limit(1.0), 4.0 * (1.0 - 2f32.powi(-17)));
        bf16_check::floors(|x, stride, floor| sums_abs_max_bf16(x, stride, 48, floor));
    }

    /// Whether [`sums_exact`] takes the 16 columns at `c` of 16 rows `stride` apart, and
    /// what [`fast_forward_step`] makes of them.
    fn fast(x: &[u16], stride: usize, c: usize) -> (bool, [[f32; 16]; DIM]) {
        let rows: [__m256i; DIM] = std::array::from_fn(|i| {
            // SAFETY: 16 patterns from `i * stride + c`, inside `x` (indexed first).
            unsafe { _mm256_loadu_si256(x[i * stride + c..][..16].as_ptr().cast()) }
        });
        // SAFETY: the callers checked `Level::Avx512` (F, BW, VL).
        let exact = unsafe { sums_exact(&rows) };
        // SAFETY: as above.
        let y = unsafe { fast_forward_step(&rows) };
        let out = y.map(|v| {
            let mut o = [0f32; 16];
            // SAFETY: 16 lanes into 16 floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
            o
        });
        (exact, out)
    }

    #[test]
    fn exact_sums_take_the_fast_transform_with_index_order_results() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        super::exact_check::exact_sums_take_the_fast_transform(fast);
    }

    #[test]
    fn the_exactness_test_draws_its_lines_where_stated() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        super::exact_check::lines_where_stated(fast);
    }

    #[test]
    fn the_fused_inverse_equals_the_index_order_sums() {
        if !Level::Avx512.is_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        super::inverse_check::assert_index_order(|pairs, stride, f, narrow, out| {
            inverse_nibbles(pairs, stride, f, narrow, out)
        });
        let (pairs, stride, f) = super::inverse_check::case();
        // Lengths that do not fit are refused.
        let mut out = Box::new([[0f32; 1024]; DIM]);
        assert!(!inverse_nibbles(
            &pairs,
            stride,
            &f[..12],
            Narrow::Odd,
            &mut out
        ));
        assert!(!inverse_nibbles(
            &pairs[..7 * stride + 15],
            stride,
            &f[..16],
            Narrow::Odd,
            &mut out
        ));
        assert!(!inverse_nibbles(&pairs, 8, &f[..16], Narrow::Odd, &mut out));
        let mut small = [[0f32; 8]; DIM];
        assert!(!inverse_nibbles(
            &pairs,
            stride,
            &f[..16],
            Narrow::Odd,
            &mut small
        ));
    }
}
