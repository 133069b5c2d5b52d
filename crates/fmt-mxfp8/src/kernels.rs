//! The CPU kernels: rayon over 32-row groups (or rows), plain loops the compiler can
//! vectorize. Quantization always writes **compact** scales; the swizzled layout is a
//! permutation applied afterwards (TE's unfused `nvte_swizzle_scaling_factors` path),
//! so one well-tested function owns the swizzle.

use quant_core::Element;
use rayon::prelude::*;

use crate::layout::{ScaleLayout, columnwise_scale_index, rowwise_scale_index};
use crate::scale::{BLOCK, Mxfp8Dtype, ScaleRule, multiplier, scale};

/// Element type and scale rule: everything the quantize kernels need besides data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cfg {
    pub dtype: Mxfp8Dtype,
    pub rule: ScaleRule,
    /// Scale as TE's fast cast kernels do, `fma(x, s, +0)`: the same as `x * s` except
    /// that an input `-0.0` gives `+0` (a nonzero product that underflows keeps its
    /// sign, since the fma rounds the exact nonzero sum once). Otherwise a plain `x * s`.
    /// See [`crate::Mxfp8Quantizer::flushes_negative_zero`].
    pub plus_zero: bool,
}

impl Cfg {
    /// Block amax key -> code.
    #[inline(always)]
    fn code(self, key: u32) -> u8 {
        self.rule.code(f32::from_bits(key), self.dtype)
    }

    /// `fp8(x * mult)`: one IEEE f32 multiply (or TE's `fma(x, mult, +0)`), then RNE +
    /// satfinite.
    #[inline(always)]
    fn encode(self, x: f32, mult: f32) -> u8 {
        let p = if self.plus_zero && x == 0.0 {
            0.0
        } else {
            x * mult
        };
        self.dtype.encode(p)
    }
}

/// `out[i] = fp8(x[i] * mult)` for one block.
#[inline(always)]
fn encode_scaled<T: Element>(cfg: Cfg, xs: &[T], mult: f32, out: &mut [u8]) {
    for (o, v) in out.iter_mut().zip(xs) {
        *o = cfg.encode(v.to_f32(), mult);
    }
}

/// Rowwise 1x32 blocks. `scales` is the compact `[>= M, stride]` matrix; rows of data
/// and of scales are walked together.
pub(crate) fn rowwise<T: Element>(
    cfg: Cfg,
    xs: &[T],
    k: usize,
    data: &mut [u8],
    scales: &mut [u8],
    stride: usize,
) {
    data.par_chunks_mut(k)
        .zip(xs.par_chunks(k))
        .zip(scales.par_chunks_mut(stride))
        .with_min_len(8)
        .for_each(|((out, x), s)| {
            for ((ob, xb), s) in out
                .chunks_exact_mut(BLOCK)
                .zip(x.chunks_exact(BLOCK))
                .zip(s.iter_mut())
            {
                // Widen once; the block is read twice (amax, then encode).
                let mut xf = [0f32; BLOCK];
                for (d, v) in xf.iter_mut().zip(xb) {
                    *d = v.to_f32();
                }
                let key = xf.iter().fold(0u32, |m, &v| m.max(cfg.rule.key(v)));
                let code = cfg.code(key);
                *s = code;
                encode_scaled(cfg, &xf, multiplier(code), ob);
            }
        });
}

/// Columnwise 32x1 blocks (not transposed). One task per 32-row group: a running
/// per-column max over the 32 rows, then one code per column, then the rows again.
/// `scales` is the compact `[>= M/32, stride]` matrix.
pub(crate) fn columnwise<T: Element>(
    cfg: Cfg,
    xs: &[T],
    k: usize,
    data: &mut [u8],
    scales: &mut [u8],
    stride: usize,
) {
    data.par_chunks_mut(BLOCK * k)
        .zip(xs.par_chunks(BLOCK * k))
        .zip(scales.par_chunks_mut(stride))
        .for_each(|((out, x), s)| {
            let mut key = vec![0u32; k];
            for row in x.chunks_exact(k) {
                for (a, v) in key.iter_mut().zip(row) {
                    *a = (*a).max(cfg.rule.key(v.to_f32()));
                }
            }
            let mut mult = vec![0f32; k];
            for ((s, m), &a) in s.iter_mut().zip(mult.iter_mut()).zip(&key) {
                let code = cfg.code(a);
                *s = code;
                *m = multiplier(code);
            }
            for (orow, xrow) in out.chunks_exact_mut(k).zip(x.chunks_exact(k)) {
                for ((o, v), &m) in orow.iter_mut().zip(xrow).zip(&mult) {
                    *o = cfg.encode(v.to_f32(), m);
                }
            }
        });
}

/// 32x32 tiles: writes the data (identical for both directions) and returns the tile
/// codes, row-major `[M/32, K/32]`.
pub(crate) fn two_d<T: Element>(cfg: Cfg, xs: &[T], k: usize, data: &mut [u8]) -> Vec<u8> {
    let nkb = k / BLOCK;
    let nmb = xs.len() / (BLOCK * k).max(1);
    let mut tiles = vec![0u8; nmb * nkb];
    tiles
        .par_chunks_mut(nkb.max(1))
        .zip(data.par_chunks_mut(BLOCK * k))
        .zip(xs.par_chunks(BLOCK * k))
        .for_each(|((t, out), x)| {
            let mut key = vec![0u32; nkb];
            for row in x.chunks_exact(k) {
                for (a, blk) in key.iter_mut().zip(row.chunks_exact(BLOCK)) {
                    *a = blk.iter().fold(*a, |m, v| m.max(cfg.rule.key(v.to_f32())));
                }
            }
            let mut mult = vec![0f32; nkb];
            for ((t, m), &a) in t.iter_mut().zip(mult.iter_mut()).zip(&key) {
                *t = cfg.code(a);
                *m = multiplier(*t);
            }
            for (orow, xrow) in out.chunks_exact_mut(k).zip(x.chunks_exact(k)) {
                for ((ob, xb), &m) in orow
                    .chunks_exact_mut(BLOCK)
                    .zip(xrow.chunks_exact(BLOCK))
                    .zip(&mult)
                {
                    encode_scaled(cfg, xb, m, ob);
                }
            }
        });
    tiles
}

/// Spreads 2-D tile codes over the compact rowwise scales: rows `32*mb .. 32*mb+32`
/// all get tile row `mb`.
pub(crate) fn tiles_to_rowwise(tiles: &[u8], m: usize, k: usize, scales: &mut [u8], stride: usize) {
    let nkb = k / BLOCK;
    for (row, s) in scales.chunks_exact_mut(stride).take(m).enumerate() {
        let mb = row / BLOCK;
        if let (Some(dst), Some(src)) = (s.get_mut(..nkb), tiles.get(mb * nkb..(mb + 1) * nkb)) {
            dst.copy_from_slice(src);
        }
    }
}

/// Spreads 2-D tile codes over the compact columnwise scales: columns `32*kb .. 32*kb+32`
/// of block row `mb` all get tile `(mb, kb)`.
pub(crate) fn tiles_to_columnwise(
    tiles: &[u8],
    m: usize,
    k: usize,
    scales: &mut [u8],
    stride: usize,
) {
    let nkb = k / BLOCK;
    for (mb, s) in scales.chunks_exact_mut(stride).take(m / BLOCK).enumerate() {
        let Some(row) = s.get_mut(..k) else { continue };
        for (kb, blk) in row.chunks_exact_mut(BLOCK).enumerate() {
            blk.fill(tiles.get(mb * nkb + kb).copied().unwrap_or(0));
        }
    }
}

/// Rowwise dequantization: `x = T(2^(e-127) * float(q))` (TE `dequantize_mxfp8.cuh`).
/// `scales` is the whole scale buffer in `layout`; its length was checked.
pub(crate) fn dequantize_rowwise<T: Element>(
    dtype: Mxfp8Dtype,
    layout: ScaleLayout,
    m: usize,
    k: usize,
    q: &[u8],
    scales: &[u8],
    out: &mut [T],
) {
    let table = dtype.decode_table();
    out.par_chunks_mut(k)
        .zip(q.par_chunks(k))
        .enumerate()
        .with_min_len(8)
        .for_each(|(i, (o, q))| {
            for (kb, (ob, qb)) in o
                .chunks_exact_mut(BLOCK)
                .zip(q.chunks_exact(BLOCK))
                .enumerate()
            {
                let code = scales
                    .get(rowwise_scale_index(layout, m, k, i, kb))
                    .copied()
                    .unwrap_or(0xFF);
                let s = scale(code);
                for (o, &b) in ob.iter_mut().zip(qb) {
                    *o = T::from_f32(s * table[usize::from(b)]);
                }
            }
        });
}

/// Columnwise dequantization: each 32-row group reads its `K` scales once.
pub(crate) fn dequantize_columnwise<T: Element>(
    dtype: Mxfp8Dtype,
    layout: ScaleLayout,
    m: usize,
    k: usize,
    q: &[u8],
    scales: &[u8],
    out: &mut [T],
) {
    let table = dtype.decode_table();
    out.par_chunks_mut(BLOCK * k)
        .zip(q.par_chunks(BLOCK * k))
        .enumerate()
        .for_each(|(mb, (o, q))| {
            let s: Vec<f32> = (0..k)
                .map(|j| {
                    let code = scales
                        .get(columnwise_scale_index(layout, m, k, mb, j))
                        .copied()
                        .unwrap_or(0xFF);
                    scale(code)
                })
                .collect();
            for (orow, qrow) in o.chunks_exact_mut(k).zip(q.chunks_exact(k)) {
                for ((o, &b), &s) in orow.iter_mut().zip(qrow).zip(&s) {
                    *o = T::from_f32(s * table[usize::from(b)]);
                }
            }
        });
}
