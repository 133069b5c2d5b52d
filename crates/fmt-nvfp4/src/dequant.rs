//! Dequantization: TE's `dequantize_fp4_kernel` for both directions, plus the inverse
//! Hadamard transform for RHT columnwise operands (which TE does not offer).
//!
//! ```text
//! final = (float(sdb) * amax) * f32(1 / (6 * E4M3_MAX))      // amax[row] when row-scaled
//! x     = OType(e2m1_value * final)                            // one rounding to the output type
//! ```
//!
//! Columnwise, the same formula gives `x^T` (its `amax_columnwise`, or `amax_columnwise[k]`
//! for row-scaled), written back in the logical `[M, K]` layout. With RHT the 16
//! dequantized values `y` of a block are rotated back, `v = y · R^T` (`R` is orthogonal),
//! summed in f64 in index order and rounded once to the output type. The result is the
//! best estimate of `x` the stored bytes allow, but not element-local: a block's
//! quantization error (and the bf16 rounding of the forward transform) is spread over
//! its 16 elements, so an exact input value (e.g. a zero) generally comes back nonzero.

use quant_core::codec::{e2m1, e4m3};
use quant_core::stream::{Fence, StoreMode, line_chunks, spans_around, write_f32};
use quant_core::strips::task_rows;
use quant_core::{Element, simd};
use rayon::prelude::*;

use crate::layout::{scale_index, scale_shape};
use crate::rht;
use crate::scale::{self, BLOCK};

/// The stored bytes of one direction.
pub(crate) struct Operand<'a> {
    data: &'a [u8],
    scales: &'a [u8],
    amax: &'a [f32],
    swizzled: bool,
    factors: Factors,
}

/// How a block's dequantize factor is found. Per block, the E4M3 decode, two products and
/// the division in [`scale::dequant_rcp`] cost as much as decoding the block's 16 values,
/// so the constant is computed once and, under a tensor amax, so is every factor.
enum Factors {
    /// One amax for the tensor: the factor of each of the 256 scale bytes, the amax and
    /// the constant it was computed from.
    Table {
        table: Box<[f32; 256]>,
        amax: f32,
        rcp: f32,
    },
    /// An amax per row: computed per block with the hoisted `f32(1 / (6 * E4M3_MAX))`.
    PerRow { rcp: f32 },
}

impl<'a> Operand<'a> {
    /// A view of one stored direction; `amax` holds one value (per-tensor) or one per
    /// stored row.
    pub fn new(
        data: &'a [u8],
        scales: &'a [u8],
        amax: &'a [f32],
        swizzled: bool,
        e4m3_max: u16,
    ) -> Self {
        let rcp = scale::dequant_rcp(e4m3_max);
        let factors = match amax {
            &[amax] => Factors::Table {
                table: Box::new(std::array::from_fn(|sdb| {
                    scale::dequant_factor_with(sdb as u8, amax, rcp)
                })),
                amax,
                rcp,
            },
            _ => Factors::PerRow { rcp },
        };
        Self {
            data,
            scales,
            amax,
            swizzled,
            factors,
        }
    }

    /// Dequantize factor of block `(row, block)` of a stored operand with `stride`-wide
    /// scales: [`scale::dequant_factor`] of its scale byte and amax.
    #[inline(always)]
    fn factor(&self, row: usize, block: usize, stride: usize) -> f32 {
        let sdb = self.scales[scale_index(row, block, stride, self.swizzled)];
        match &self.factors {
            Factors::Table { table, .. } => table[usize::from(sdb)],
            Factors::PerRow { rcp } => scale::dequant_factor_with(sdb, self.amax[row], *rcp),
        }
    }

    /// The compact scale bytes of blocks `b0 .. b0 + n` of stored rows `r0 .. r0 + cw`,
    /// transposed into `out` (`out[g * CHUNK + c]` is block `b0 + g` of row `r0 + c`), so
    /// that [`Operand::factors_of`] reads each 16-row group's bytes in a row. Returns
    /// `false` (nothing written) unless the scales are compact under a tensor amax and
    /// the block lies inside them.
    ///
    /// The columnwise decoder otherwise walks the bytes `stride` apart, one load per
    /// stored row and group through the table, about three cycles per factor: an
    /// eighth of the columnwise dequantize.
    #[inline(always)]
    fn transposed_scales(
        &self,
        (r0, cw): (usize, usize),
        (b0, n): (usize, usize),
        stride: usize,
        out: &mut [u8],
    ) -> bool {
        let fits = cw > 0
            && b0 + n <= stride
            && out.len() >= n * CHUNK
            && cw <= CHUNK
            && (r0 + cw) * stride <= self.scales.len();
        if !matches!(self.factors, Factors::Table { .. }) || self.swizzled || !fits {
            return false;
        }
        simd::transpose_bytes(&self.scales[r0 * stride + b0..], stride, out, CHUNK, cw, n);
        true
    }

    /// `out[c]` is the factor of scale byte `bytes[c]` under the tensor amax, the bytes
    /// [`Operand::transposed_scales`] gave: `(e4m3(sdb) * amax) * rcp` computed in a
    /// loop that vectorizes, which is [`scale::dequant_factor_with`] wherever every
    /// factor is finite; otherwise the whole run comes from the table.
    ///
    /// # Panics
    ///
    /// Unless the operand has a tensor amax (only then does `transposed_scales` succeed).
    #[inline(always)]
    fn factors_of(&self, bytes: &[u8], out: &mut [f32]) {
        let Factors::Table { table, amax, rcp } = &self.factors else {
            unreachable!("factors_of: only after transposed_scales, under a tensor amax");
        };
        let mut exp = 0;
        for (f, &sdb) in out.iter_mut().zip(bytes) {
            *f = (e4m3::decode_fast(sdb) * amax) * rcp;
            exp = exp.max(f.to_bits() & 0x7F80_0000);
        }
        if exp == 0x7F80_0000 {
            for (f, &sdb) in out.iter_mut().zip(bytes) {
                *f = table[usize::from(sdb)];
            }
        }
    }

    /// The factors of 16-row group `g0 + g` at stored rows `c0 .. c0 + f.len()`, into
    /// `f`: from the scale bytes [`Operand::transposed_scales`] left in `sb` where it
    /// succeeded (`compact`), else one by one ([`Operand::factors_into`]). The one
    /// choice both columnwise routes make per group.
    #[inline(always)]
    fn group_factors(
        &self,
        (compact, sb): (bool, &[u8]),
        (c0, g0, g): (usize, usize, usize),
        stride: usize,
        f: &mut [f32],
    ) {
        if compact {
            self.factors_of(&sb[g * CHUNK..][..f.len()], f);
        } else {
            self.factors_into(c0, g0 + g, stride, f);
        }
    }

    /// `out[c] = self.factor(r0 + c, block, stride)` for every `c`: one block column of
    /// consecutive stored rows, as the columnwise decoder needs per 16-row group where
    /// [`Operand::transposed_scales`] declines (swizzled scales, an amax per row).
    #[inline(always)]
    fn factors_into(&self, r0: usize, block: usize, stride: usize, out: &mut [f32]) {
        for (c, f) in out.iter_mut().enumerate() {
            *f = self.factor(r0 + c, block, stride);
        }
    }
}

/// Rowwise: `[m, k]` codes and scales to `out` (`[m, k]`). At AVX-512 each row is
/// [`crate::x86::decode_row`] (f32, bf16 and f16 output), at AVX2
/// [`crate::x86_avx2::decode_row`]; elsewhere the portable loop below, which the tests
/// compare with both at every level.
pub(crate) fn rowwise<T: Element>(op: &Operand<'_>, m: usize, k: usize, out: &mut [T]) {
    let stride = scale_shape(m, k)[1];
    if k == 0 {
        return;
    }
    let level = simd::level();
    let rows_per_task = (1 << 16) / k + 1;
    out.par_chunks_mut(rows_per_task * k)
        .zip(op.data.par_chunks(rows_per_task * k / 2))
        .enumerate()
        .for_each(|(t, (o, d))| {
            simd::dispatch(
                level,
                #[inline(always)]
                || {
                    let mut w = [0f32; BLOCK];
                    for (r, (o, d)) in o.chunks_exact_mut(k).zip(d.chunks_exact(k / 2)).enumerate()
                    {
                        let row = t * rows_per_task + r;
                        #[cfg(target_arch = "x86_64")]
                        if level == simd::Level::Avx512
                            && crate::x86::decode_row(
                                d,
                                #[inline(always)]
                                |b| op.factor(row, b, stride),
                                o,
                            )
                        {
                            continue;
                        }
                        #[cfg(target_arch = "x86_64")]
                        if level == simd::Level::Avx2
                            && crate::x86_avx2::decode_row(
                                d,
                                #[inline(always)]
                                |b| op.factor(row, b, stride),
                                o,
                            )
                        {
                            continue;
                        }
                        for (b, (ob, db)) in o
                            .chunks_exact_mut(BLOCK)
                            .zip(d.chunks_exact(BLOCK / 2))
                            .enumerate()
                        {
                            let f = op.factor(row, b, stride);
                            for (pair, &byte) in w.chunks_exact_mut(2).zip(db) {
                                let (lo, hi) = e2m1::unpack(byte);
                                pair[0] = e2m1::decode_fast(lo) * f;
                                pair[1] = e2m1::decode_fast(hi) * f;
                            }
                            T::narrow_slice(&w, ob);
                        }
                    }
                },
            )
        });
}

/// Output rows per columnwise task, at least: 64 bytes of every stored row.
const SLAB: usize = 128;
/// Most [`SLAB`]s one task takes ([`task_rows`]).
const MAX_SLABS: usize = 8;
/// Stored rows (output columns) per chunk.
const CHUNK: usize = 256;

/// Columnwise: `[k, m]` codes and scales (of `x^T`) to `out` in the logical `[m, k]`
/// layout, undoing the Hadamard transform when `rht`.
///
/// A task takes [`task_rows`] output rows. At AVX-512 and streaming, the whole
/// 64-column blocks of its rows go the register route of [`crate::transposed_x86`]
/// (x1.6-1.9 on a 2-vCPU Zen 4 at 8192x8192 into bf16 and f32; RHT x1.29 into bf16,
/// where the inverse transform's sums are most of the time), at AVX2 (without RHT) its
/// twin in [`crate::transposed_avx2`], with the factors of a block's groups from the
/// same transposed scale bytes as below, computed inside the walk (so at its vector
/// width) while the next block's scale bytes are fetched into L2; the tile route takes
/// the columns before and after them and every task elsewhere: each chunk of [`CHUNK`]
/// stored rows transposed into `pairs`, then each 16-row group decoded (or inverted)
/// from there.
pub(crate) fn columnwise<T: Element>(
    op: &Operand<'_>,
    m: usize,
    k: usize,
    rht_on: bool,
    out: &mut [T],
) {
    let stride = scale_shape(k, m)[1];
    if k == 0 || m == 0 {
        return;
    }
    let level = simd::level();
    let mode = StoreMode::for_output_bytes(std::mem::size_of_val(out));
    // Each task reads `slab / 2` bytes of every stored row, `m / 2` bytes apart.
    let slab = task_rows(m, SLAB, MAX_SLABS);
    // Stored rows of the next chunk prefetched per 16-row group (a full task's groups
    // cover the chunk): their runs are far apart, which the hardware prefetchers miss.
    let ahead = CHUNK.div_ceil(slab / BLOCK);
    #[cfg(target_arch = "x86_64")]
    const _: () = assert!(MAX_SLABS * SLAB <= crate::transposed_x86::MAX_ROWS);
    out.par_chunks_mut(slab * k).enumerate().for_each_init(
        || {
            (
                vec![0u8; slab / 2 * CHUNK],
                vec![0u8; slab / BLOCK * CHUNK],
                vec![0f32; BLOCK * CHUNK],
                // The inverse transform's scratch, only where there is one to undo.
                rht_on.then(|| Box::new([[0f32; CHUNK]; BLOCK])),
            )
        },
        |(pairs, sb, vals, inv), (s, o)| {
            let fence = Fence::new();
            let rows = o.len() / k;
            let (g0, groups) = (s * slab / BLOCK, rows / BLOCK);
            #[cfg(target_arch = "x86_64")]
            let fused = crate::transposed_x86::decode_lines(
                (level, mode),
                (op.data, m, s * slab / 2),
                (o, k),
                rht_on,
                // The factors of every group of the task for columns `j0..j0 + 64`,
                // inlined into the walk so that `factors_of` vectorizes at its level (out
                // of line it was an SSE2 loop, a quarter of the AVX-512 profile).
                #[inline(always)]
                |j0: usize, f: &mut [f32]| {
                    let compact = op.transposed_scales((j0, 64), (g0, groups), stride, sb);
                    for (g, f) in f.chunks_exact_mut(64).enumerate() {
                        op.group_factors((compact, sb), (j0, g0, g), stride, f);
                    }
                    // The next block's scale bytes: 64 runs `stride` apart.
                    for r in j0 + 64..(j0 + 128).min(k) {
                        let run = r * stride + g0..r * stride + g0 + groups;
                        simd::prefetch_l2(op.scales.get(run).unwrap_or(&[]));
                    }
                },
            );
            #[cfg(not(target_arch = "x86_64"))]
            let fused = 0..0;
            for span in spans_around(fused, k) {
                simd::dispatch(
                    level,
                    #[inline(always)]
                    || {
                        let half = rows / 2;
                        let p0 = s * slab / 2;
                        // Chunks after the first start on output lines (whole streamed lines).
                        for chunk in line_chunks(&o[span.start..], span.len(), CHUNK) {
                            let (c0, cw) = (span.start + chunk.start, chunk.len());
                            // Stored rows c0.. (columns of x), this slab's bytes, transposed.
                            simd::transpose_bytes(
                                &op.data[c0 * (m / 2) + p0..],
                                m / 2,
                                pairs,
                                CHUNK,
                                cw,
                                half,
                            );
                            let compact = op.transposed_scales((c0, cw), (g0, groups), stride, sb);
                            for g in 0..groups {
                                let next = c0 + cw;
                                for r in next + g * ahead..(next + (g + 1) * ahead).min(span.end) {
                                    simd::prefetch_l2(&op.data[r * (m / 2) + p0..][..half]);
                                }
                                let mut f = [0f32; CHUNK];
                                op.group_factors((compact, sb), (c0, g0, g), stride, &mut f[..cw]);
                                if inv.is_none()
                                    && decode_group(
                                        (level, mode, &fence),
                                        &pairs[g * BLOCK / 2 * CHUNK..],
                                        &f[..cw],
                                        &mut o[g * BLOCK * k..][..BLOCK * k],
                                        k,
                                        c0,
                                    )
                                {
                                    continue;
                                }
                                let pairs = &pairs[g * BLOCK / 2 * CHUNK..];
                                if let Some(inv) = inv.as_deref_mut() {
                                    inverse_group(
                                        (level, mode, &fence),
                                        (pairs, &f[..cw]),
                                        vals,
                                        inv,
                                        &mut o[g * BLOCK * k..][..BLOCK * k],
                                        k,
                                        c0,
                                    );
                                } else {
                                    decode_pairs(pairs, &f[..cw], vals);
                                    for i in 0..BLOCK {
                                        let r = g * BLOCK + i;
                                        write_f32(
                                            level,
                                            &vals[i * CHUNK..i * CHUNK + cw],
                                            &mut o[r * k + c0..r * k + c0 + cw],
                                            mode,
                                            &fence,
                                        );
                                    }
                                }
                            }
                        }
                    },
                )
            }
        },
    );
}

/// One 16-row group of a columnwise decode straight into `out` (the group's rows,
/// `k` apart), output row `i` from the `i % 2` nibble of transposed byte row `i / 2`
/// (`CHUNK` apart in `pairs`), columns `c0 .. c0 + f.len()`: with AVX-512,
/// [`crate::x86::decode_nibbles`] per row, with AVX2 [`crate::x86_avx2::decode_nibbles`].
/// Returns `false` where that declines; the caller then decodes into its scratch and
/// narrows from there, which rewrites every row of the group.
#[inline(always)]
fn decode_group<T: Element>(
    (level, mode, fence): (simd::Level, StoreMode, &Fence),
    pairs: &[u8],
    f: &[f32],
    out: &mut [T],
    k: usize,
    c0: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if level != simd::Level::Scalar {
        use crate::x86::Nibble;
        let cw = f.len();
        return (0..BLOCK).all(|i| {
            let nibble = if i % 2 == 0 {
                Nibble::Low
            } else {
                Nibble::High
            };
            let codes = &pairs[i / 2 * CHUNK..][..cw];
            let o = &mut out[i * k + c0..][..cw];
            match level {
                simd::Level::Avx512 => {
                    crate::x86::decode_nibbles(codes, nibble, f, o, (mode, fence))
                }
                _ => crate::x86_avx2::decode_nibbles(codes, nibble, f, o, mode),
            }
        });
    }
    let _ = (level, mode, fence, pairs, f, out, k, c0);
    false
}

/// The 16 rows of a group decoded into `vals` (`CHUNK` apart): row `2q` from the low
/// nibbles of transposed byte row `q` of `pairs` (`CHUNK` apart), row `2q + 1` from the
/// high ones, each value `e2m1(code) * f[c]`.
#[inline(always)]
fn decode_pairs(pairs: &[u8], f: &[f32], vals: &mut [f32]) {
    let cw = f.len();
    for q in 0..BLOCK / 2 {
        let src = &pairs[q * CHUNK..][..cw];
        let (lo, hi) = vals[2 * q * CHUNK..].split_at_mut(CHUNK);
        for (((a, b), &byte), &f) in lo[..cw].iter_mut().zip(hi[..cw].iter_mut()).zip(src).zip(f) {
            *a = e2m1::decode_fast(byte & 0xF) * f;
            *b = e2m1::decode_fast(byte >> 4) * f;
        }
    }
}

/// The inverse Hadamard transform of one 16-row group (its transposed code bytes and
/// per-column factors), vectorized across columns: `v_i = sum_j y_j * R[i][j]` in
/// f64, index order, rounded once to `T`. With AVX-512 or AVX2 the codes are decoded
/// and summed in registers by a fast Walsh-Hadamard transform, equal wherever the sums
/// are finite, rounded to the f32 whose narrowing to `T` is that one rounding
/// ([`crate::rht_x86::inverse_nibbles`], [`crate::rht_avx2::inverse_nibbles`]), into
/// `wide`; the rows are then narrowed.
/// Elsewhere the group is decoded into `vals` and summed in index order.
#[inline(always)]
fn inverse_group<T: Element>(
    (level, mode, fence): (simd::Level, StoreMode, &Fence),
    (pairs, f): (&[u8], &[f32]),
    vals: &mut [f32],
    wide: &mut [[f32; CHUNK]; BLOCK],
    out: &mut [T],
    k: usize,
    c0: usize,
) {
    let cw = f.len();
    #[cfg(target_arch = "x86_64")]
    {
        use crate::rht_x86::Narrow;
        // f32 output is the nearest f32; narrower ones round the round-to-odd f32 once
        // more, which is one rounding of the f64 (`Element::from_f64`).
        let narrow = if T::DTYPE == quant_core::DType::F32 {
            Narrow::Nearest
        } else {
            Narrow::Odd
        };
        let fused = match level {
            simd::Level::Avx512 => crate::rht_x86::inverse_nibbles(pairs, CHUNK, f, narrow, wide),
            simd::Level::Avx2 => crate::rht_avx2::inverse_nibbles(pairs, CHUNK, f, narrow, wide),
            _ => false,
        };
        if fused {
            for (i, w) in wide.iter().enumerate() {
                let o = &mut out[i * k + c0..i * k + c0 + cw];
                write_f32(level, &w[..cw], o, mode, fence);
            }
            return;
        }
    }
    let _ = (level, wide, mode, fence);
    decode_pairs(pairs, f, vals);
    let y = vals;
    for (i, ri) in rht::R.iter().enumerate() {
        let mut acc = [0f64; CHUNK];
        for (j, &rij) in ri.iter().enumerate() {
            let yj = &y[j * CHUNK..j * CHUNK + cw];
            let r = f64::from(rij);
            for (a, &v) in acc[..cw].iter_mut().zip(yj) {
                *a += f64::from(v) * r;
            }
        }
        for (o, &a) in out[i * k + c0..i * k + c0 + cw].iter_mut().zip(&acc[..cw]) {
            *o = T::from_f64(a);
        }
    }
}
