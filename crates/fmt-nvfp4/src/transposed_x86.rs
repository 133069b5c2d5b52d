//! The AVX-512 columnwise dequantize, transposed in registers.
//!
//! The columnwise codes are stored transposed and packed (`[K, M / 2]`, two rows of
//! `x` per byte), so output rows `2p` and `2p + 1`'s columns `j0..j0 + 64` are the low
//! and high nibbles of byte `p` of 64 stored rows.
//! [`quant_core::stream::x86::transposed_blocks`] stages those bytes in L1 and
//! transposes them in registers, 64 stored rows at a time; each vector then gives two
//! output rows' next 64 values, decoded by one permute per 16 codes, scaled by their
//! columns' factors and narrowed in registers, and streamed as whole lines straight
//! into the output. RHT operands take the inverse transform of the tile route
//! ([`inverse_nibbles`]) per 16-row group from 8 staged lines, and stream its rows the
//! same way. The tile route of [`crate::dequant::columnwise`] (still taken for what
//! this one does not take) transposes every run into a scratch tile and decodes each
//! output row's run from there. [`decode_lines`] also serves [`Level::Avx2`] (without
//! RHT): the same checks, then the AVX2 twin of the walk in [`crate::transposed_avx2`].

use std::arch::x86_64::{
    __m512, __m512i, _mm512_mul_ps, _mm512_permutexvar_ps, _mm512_srli_epi32, _mm512_store_si512,
    _mm512_stream_si512,
};
use std::ops::Range;

use quant_core::Element;
use quant_core::dtype::FloatsMut;
use quant_core::simd::{self, Level};
use quant_core::stream::StoreMode;
use quant_core::stream::x86::{
    bf16_lines, f16_lines, f32_lines, load_f32x64, transposed_blocks, widen_u8x64,
};

use crate::rht::DIM;
use crate::rht_x86::{Narrow, inverse_nibbles};
use crate::scale::BLOCK;
use crate::x86::decode_table;

/// Output columns per block: [`transposed_blocks`] reads 64 stored rows.
const COLS: usize = 64;
/// The most output rows a task may have here: their factors (one per 16-row group and
/// column) are kept for the block of columns being decoded.
pub(crate) const MAX_ROWS: usize = 1024;

/// Decodes the columns this route takes of a columnwise dequantize task and returns
/// them: `data` is the stored codes (`[k, m / 2]`), `out` the task's output rows
/// `2 * p0 .. 2 * p0 + rows` (`rows = out.len() / k`), and `factors(j0, f)` fills
/// `f[g * 64 + c]` with the factor of the task's 16-row group `g` at column `j0 + c`,
/// for every group. The route takes whole 64-column blocks that start on 64-byte lines,
/// in a task of whole 128-row blocks (at most [`MAX_ROWS`]) at [`Level::Avx512`] (bf16
/// output also needs AVX-512 BF16) or, without `rht`, at [`Level::Avx2`]
/// ([`crate::transposed_avx2`]), in [`StoreMode::Streaming`], where each output row
/// is a whole number of lines; otherwise it returns an empty range and writes nothing.
/// The caller decodes the columns before and after the range by the tile route and
/// fences the streamed stores. The values are those of the tile route:
/// `T(e2m1(code) * factor)`, or with `rht` the inverse transform of each group's 16.
pub(crate) fn decode_lines<T: Element>(
    (level, mode): (Level, StoreMode),
    (data, m, p0): (&[u8], usize, usize),
    (out, k): (&mut [T], usize),
    rht: bool,
    factors: impl FnMut(usize, &mut [f32]),
) -> Range<usize> {
    let rows = out.len().checked_div(k).unwrap_or(0);
    let lead = out.as_ptr().align_offset(64);
    let whole = k.saturating_sub(lead) / COLS * COLS;
    // RHT keeps the tile route at AVX2 (`crate::transposed_avx2`'s module docs say why).
    let fits = (level == Level::Avx512 || level == Level::Avx2 && !rht)
        && mode == StoreMode::Streaming
        && rows > 0
        && rows.is_multiple_of(128)
        && rows <= MAX_ROWS
        && (k * size_of::<T>()).is_multiple_of(64)
        && whole > 0
        && m.is_multiple_of(2)
        && data.len() == k * (m / 2)
        && p0 + rows / 2 <= m / 2;
    if !fits {
        return 0..0;
    }
    let cols = lead..lead + whole;
    // f32 output is the nearest f32 of the inverse's f64 sums; narrower outputs round
    // the round-to-odd f32 once more, which is one rounding of the f64 (as the tile
    // route's `inverse_group` does).
    let inverse = rht.then_some(if T::DTYPE == quant_core::DType::F32 {
        Narrow::Nearest
    } else {
        Narrow::Odd
    });
    let walk = Walk {
        data,
        m,
        p0,
        cols: cols.clone(),
        k,
        inverse,
    };
    if level == Level::Avx2 {
        return if crate::transposed_avx2::into(&walk, factors, out) {
            cols
        } else {
            0..0
        };
    }
    match FloatsMut::of(out) {
        // SAFETY: the CPU has AVX-512 F, BW and DQ (`Level::Avx512` is only active where
        // it does).
        Some(FloatsMut::F32(o)) => unsafe { into_f32(&walk, factors, o) },
        // SAFETY: as above, and the CPU has AVX-512 BF16 (checked).
        Some(FloatsMut::Bf16(o)) if simd::has(simd::Ext::Bf16) => unsafe {
            into_bf16(&walk, factors, o)
        },
        // SAFETY: as for f32.
        Some(FloatsMut::F16(o)) => unsafe { into_f16(&walk, factors, o) },
        _ => return 0..0,
    }
    cols
}

/// What [`decode_lines`] walks: the stored codes (`[k, m / 2]`), the task's first byte
/// of each stored row `p0`, and the output columns `cols` of rows `k` long.
pub(crate) struct Walk<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) m: usize,
    pub(crate) p0: usize,
    pub(crate) cols: Range<usize>,
    pub(crate) k: usize,
    /// For RHT operands, how the inverse transform rounds its sums.
    inverse: Option<Narrow>,
}

/// The walk of one output type, whose 64 values are `LINES` lines:
/// [`transposed_blocks`] over the task's bytes of the stored rows `w.cols`; each vector
/// (byte `p` of 64 stored rows) is output rows `2p` (low nibbles) and `2p + 1` (high),
/// decoded with their group's factors and narrowed by `lines`, then streamed. The
/// factors of a block of 64 columns are filled when its first vectors come (the walk's
/// blocks come in order of columns, then rows).
///
/// # Safety
/// The CPU must have AVX-512 F and BW; `out` must start `w.cols.start` elements before
/// a line, and rows of `w.k` elements must be whole lines (checked by
/// [`decode_lines`]); `LINES` lines must be 64 values of `O`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn walk<O: Copy, const LINES: usize>(
    w: &Walk<'_>,
    mut factors: impl FnMut(usize, &mut [f32]),
    out: &mut [O],
    lines: impl Fn([__m512; 4]) -> [__m512i; LINES],
) {
    debug_assert_eq!(LINES * 64, COLS * size_of::<O>());
    let Walk { data, m, p0, k, .. } = *w;
    let rows = out.len() / k;
    let table = decode_table();
    let mut f = [0f32; COLS * MAX_ROWS / BLOCK];
    let f = &mut f[..rows / BLOCK * COLS];
    let (mut pairs, mut wide) = (Pairs([0; 8 * COLS]), [[0f32; COLS]; DIM]);
    let bytes = p0..p0 + rows / 2;
    transposed_blocks(data, m / 2, w.cols.clone(), bytes, |j0, at, v| {
        // A block of 64 columns starts with its first rows' vectors: its factors then.
        if at == p0 {
            factors(j0, f);
        }
        // Bytes `at..at + 16` are output rows `r0..r0 + 32`: two 16-row groups.
        let r0 = 2 * (at - p0);
        let mut store = |r: usize, values: [__m512; 4]| {
            let dst = out[r * k + j0..r * k + j0 + COLS].as_mut_ptr().cast::<u8>();
            for (l, line) in lines(values).into_iter().enumerate() {
                // SAFETY: line `l` of the 64 values at `dst` lies inside `out`, and starts
                // on a line (`out` starts `cols.start` values before one, `j0 -
                // cols.start` is a multiple of 64 values, and rows are whole lines:
                // contract).
                unsafe { _mm512_stream_si512(dst.add(64 * l).cast(), line) }
            }
        };
        for (half, v) in v.chunks_exact(8).enumerate() {
            let g = &f[(r0 / BLOCK + half) * COLS..][..COLS];
            let r = r0 + BLOCK * half;
            if let Some(narrow) = w.inverse {
                let scratch = (&mut pairs, &mut wide);
                inverse16(v, (g, narrow), scratch, |i, values| store(r + i, values));
                continue;
            }
            let s = load_f32x64(g);
            for (t, &codes) in v.iter().enumerate() {
                store(r + 2 * t, decode64(codes, false, &s, table));
                store(r + 2 * t + 1, decode64(codes, true, &s, table));
            }
        }
    });
}

/// A 16-row group's 8 transposed byte rows of 64 columns, one per line: the input of
/// [`inverse_nibbles`].
#[repr(align(64))]
struct Pairs([u8; 8 * COLS]);

/// The inverse transform of one 16-row group's 64 columns: its 8 transposed byte rows
/// `v` (row `2t` in the low nibbles of `v[t]`, `2t + 1` in the high ones) and their
/// factors `f`, through [`inverse_nibbles`] (the tile route's kernel) from a stage of 8
/// lines, its sums rounded into `wide` (both buffers the caller's: zeroed per group, they
/// were a tenth of the profile); `store(i, values)` gets row `i`'s 64 results.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn inverse16(
    v: &[__m512i],
    (f, narrow): (&[f32], Narrow),
    (pairs, wide): (&mut Pairs, &mut [[f32; COLS]; DIM]),
    mut store: impl FnMut(usize, [__m512; 4]),
) {
    for (line, &c) in pairs.0.chunks_exact_mut(COLS).zip(v) {
        // SAFETY: `line` is 64 bytes on a line (one aligned 512-bit store).
        unsafe { _mm512_store_si512(line.as_mut_ptr().cast(), c) }
    }
    // 64 columns (a multiple of its 8) of 8 rows 64 bytes apart, and 64 factors: always
    // taken at AVX-512, which `decode_lines` checked.
    let done = inverse_nibbles(&pairs.0, COLS, f, narrow, wide);
    assert!(
        done,
        "inverse16: inverse_nibbles declined a 16x64 group at AVX-512"
    );
    for (i, row) in wide.iter().enumerate() {
        store(i, load_f32x64(row));
    }
}

/// The 64 codes in the low (or `high`) nibbles of `c`'s bytes, decoded by one permute
/// of the E2M1 `table` per 16 (`vpermps` reads an index's low four bits) and times the
/// factors `s` of their columns: the portable `s * e2m1(code)`, exactly.
#[inline]
#[target_feature(enable = "avx512f")]
fn decode64(c: __m512i, high: bool, s: &[__m512; 4], table: __m512) -> [__m512; 4] {
    let c = widen_u8x64(c);
    let one = |l: usize| {
        let codes = if high {
            _mm512_srli_epi32::<4>(c[l])
        } else {
            c[l]
        };
        _mm512_mul_ps(s[l], _mm512_permutexvar_ps(codes, table))
    };
    [one(0), one(1), one(2), one(3)]
}

/// [`decode_lines`] into f32.
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
fn into_f32(w: &Walk<'_>, factors: impl FnMut(usize, &mut [f32]), out: &mut [f32]) {
    // SAFETY: the CPU has AVX-512 F and BW (this function's features); `decode_lines`
    // checked the layout; four lines are 64 f32.
    unsafe { walk(w, factors, out, |v| f32_lines(v)) }
}

/// [`decode_lines`] into bf16 bits.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16")]
fn into_bf16(w: &Walk<'_>, factors: impl FnMut(usize, &mut [f32]), out: &mut [u16]) {
    // SAFETY: the CPU has AVX-512 F and BW (this function's features); `decode_lines`
    // checked the layout; two lines are 64 bf16.
    unsafe { walk(w, factors, out, |v| bf16_lines(v)) }
}

/// [`decode_lines`] into f16 bits.
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
fn into_f16(w: &Walk<'_>, factors: impl FnMut(usize, &mut [f32]), out: &mut [u16]) {
    // SAFETY: the CPU has AVX-512 F and BW (this function's features); `decode_lines`
    // checked the layout; two lines are 64 f16.
    unsafe { walk(w, factors, out, |v| f16_lines(v)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};
    use quant_core::codec::e2m1;

    /// The factor of 16-row group `g` (of the whole tensor) at column `j`: the product's
    /// corners (zero, subnormal, overflow, infinity, NaN) among ordinary ones, but every
    /// factor finite in the second 64-column block of four (where the AVX2 route's bf16
    /// narrows without the NaN select), and inside the AVX2 route's 16-bit decode
    /// bounds in the third.
    fn factor(g: usize, j: usize) -> f32 {
        if j / 64 % 4 == 2 {
            // Every factor of the block inside the AVX2 route's 16-bit decode bounds,
            // with their edges: bf16's in even groups, f16's (and bf16's) in odd ones.
            let p = |e: i32| 2f32.powi(e);
            let (lo, top, half_ulp, last) = if g.is_multiple_of(2) {
                (-124, 124, p(-9), 1.32)
            } else {
                (-12, 13, p(-12), 1.333)
            };
            return match (g * 7 + j) % 6 {
                0 => p(lo) * (1.0 - half_ulp),
                1 => p(lo),
                2 => p(top) * last,
                _ => p(lo + 1 + (j as i32 * 5) % (top - lo - 1)) * (1.0 + j as f32 / 211.0),
            };
        }
        if j / 64 % 4 == 1 {
            return match (g * 7 + j) % 5 {
                0 => 0.0,
                1 => 3.5e-39,
                2 => 1.0e38,
                _ => 0.1 + j as f32 / 97.0,
            };
        }
        match (g * 7 + j) % 11 {
            0 => 0.0,
            1 => 3.5e-39,
            2 => 1.0e38,
            3 => f32::INFINITY,
            4 => f32::NAN,
            5 => 1.0e-5,
            6 => 7.0e4,
            _ => 0.1 + j as f32 / 97.0,
        }
    }

    /// The route's columns against `T(e2m1(code) * factor)` and nothing written outside
    /// them: the second task (rows 256..512, 16 groups) of 512 rows of 320 columns,
    /// every byte value in both nibbles, the output on a line and 7 elements past one.
    #[test]
    fn decodes_its_columns_exactly() {
        fn check<T: Element>(level: Level, at: usize) {
            let (m, k, r0, rows) = (512, 320, 256, 256);
            let data: Vec<u8> = (0..k * m / 2).map(|e| (e * 131 % 256) as u8).collect();
            let fill = T::from_f32(-7.0);
            let mut buf = vec![fill; rows * k + 64];
            let lead = buf.as_ptr().align_offset(64) + at;
            let out = &mut buf[lead..lead + rows * k];
            let factors = |j0: usize, f: &mut [f32]| {
                for (g, f) in f.chunks_exact_mut(64).enumerate() {
                    for (c, v) in f.iter_mut().enumerate() {
                        *v = factor(r0 / BLOCK + g, j0 + c);
                    }
                }
            };
            let how = (level, StoreMode::Streaming);
            let cols = decode_lines(how, (&data, m, r0 / 2), (out, k), false, factors);
            let line = 64 / size_of::<T>();
            let first = (line - at) % line;
            assert_eq!(cols, first..first + (k - first) / 64 * 64, "{level} +{at}");
            for i in 0..rows {
                for j in 0..k {
                    let got = out[i * k + j].to_f32().to_bits();
                    let want = if cols.contains(&j) {
                        let (lo, hi) = e2m1::unpack(data[j * m / 2 + (r0 + i) / 2]);
                        let code = if i % 2 == 0 { lo } else { hi };
                        let v = e2m1::decode_fast(code) * factor((r0 + i) / BLOCK, j);
                        T::from_f32(v).to_f32().to_bits()
                    } else {
                        fill.to_f32().to_bits()
                    };
                    let same = got == want
                        || (f32::from_bits(got).is_nan() && f32::from_bits(want).is_nan());
                    assert!(same, "{level} +{at}: ({i}, {j}): {got:#x} != {want:#x}");
                }
            }
        }
        for level in [Level::Avx512, Level::Avx2] {
            let ran = simd::with_level(level, || {
                for at in [0, 7] {
                    check::<f32>(level, at);
                    check::<f16>(level, at);
                    if level == Level::Avx2 || simd::has(simd::Ext::Bf16) {
                        check::<bf16>(level, at);
                    }
                }
            });
            if ran.is_none() {
                eprintln!("skipped at {level}: this CPU does not have it");
            }
        }
    }

    /// What the route does not take it leaves to the tile route, untouched: other levels,
    /// cached stores, tasks that are not whole 128-row blocks (or more than
    /// [`MAX_ROWS`]), rows that are not whole lines, no 64 columns past the first line,
    /// RHT at AVX2.
    #[test]
    fn declines_what_it_does_not_take() {
        fn declines(level: Level, mode: StoreMode, (m, rows, k): (usize, usize, usize)) {
            declines_rht(level, mode, (m, rows, k), false)
        }
        fn declines_rht(
            level: Level,
            mode: StoreMode,
            (m, rows, k): (usize, usize, usize),
            rht: bool,
        ) {
            let data = vec![0x21u8; k * m / 2];
            let mut buf = vec![f16::ONE; rows * k + 32];
            let lead = buf.as_ptr().align_offset(64);
            let out = &mut buf[lead..lead + rows * k];
            let got = decode_lines((level, mode), (&data, m, 0), (out, k), rht, |_, f| {
                f.fill(1.0)
            });
            assert_eq!(got, 0..0, "{level} {mode:?} {m} {rows} {k}");
            assert!(out.iter().all(|&v| v == f16::ONE));
        }
        let stream = StoreMode::Streaming;
        declines(Level::Scalar, stream, (128, 128, 64));
        for level in [Level::Avx512, Level::Avx2] {
            declines(level, StoreMode::Cached, (128, 128, 64));
            declines(level, stream, (192, 64, 64));
            declines(level, stream, (2 * MAX_ROWS, 2 * MAX_ROWS, 64));
            declines(level, stream, (128, 128, 40));
            declines(level, stream, (128, 128, 32));
        }
        // RHT keeps the tile route at AVX2 (measured faster there).
        declines_rht(Level::Avx2, stream, (128, 128, 64), true);
    }
}
