//! The NVFP4 quantization engine: one routine that quantizes the rows of a matrix.
//!
//! Both directions go through [`quantize_rows`]: rowwise quantizes `x` (`[M, K]`),
//! columnwise quantizes `x^T` (`[K, M]`, optionally Hadamard-rotated), exactly as TE's
//! unfused RHT path feeds the transposed operand to the rowwise kernel. The engine works
//! on slabs of 16 rows (one row of 16x16 tiles), in parallel over slabs; inside a slab
//! every block is computed by the scalar functions of [`crate::scale`] and [`crate::sr`],
//! which are the specification.

use quant_core::Element;
use quant_core::codec::{e2m1, e4m3};
use rayon::prelude::*;

use crate::quantizer::FourOverSix;
use crate::scale::{self, BLOCK, fmax_ignore_nan};
use crate::sr;

/// The global amax a direction is scaled with.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Amax<'a> {
    /// One amax for the whole operand.
    Tensor(f32),
    /// One amax per row of the operand (row-scaled NVFP4).
    PerRow(&'a [f32]),
}

impl Amax<'_> {
    #[inline]
    pub(crate) fn of_row(&self, row: usize) -> f32 {
        match *self {
            Amax::Tensor(a) => a,
            Amax::PerRow(v) => v.get(row).copied().unwrap_or(0.0),
        }
    }
}

/// How one operand (a `[rows, cols]` matrix) is quantized.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowQuant<'a> {
    pub rows: usize,
    pub cols: usize,
    pub amax: Amax<'a>,
    /// 16x16 tiles share one block amax.
    pub two_d: bool,
    /// E4M3 max of the global scale: 448, or 256 (4over6 only).
    pub e4m3_max: u16,
    pub four_over_six: Option<FourOverSix>,
    /// Stochastic rounding: `(seed, direction tag)`.
    pub sr: Option<(u64, u32)>,
}

/// Quantizes `x` (`[rows, cols]`, row-major) into packed codes `data` (`[rows, cols/2]`)
/// and compact E4M3 scales `scales` (row stride `scale_stride >= cols/16`, at least
/// `rows` rows; rows beyond are left untouched, i.e. zero).
pub(crate) fn quantize_rows<T: Element>(
    x: &[T],
    q: &RowQuant<'_>,
    data: &mut [u8],
    scales: &mut [u8],
    scale_stride: usize,
) {
    let (rows, cols) = (q.rows, q.cols);
    debug_assert!(rows.is_multiple_of(BLOCK) && cols.is_multiple_of(BLOCK));
    debug_assert_eq!(x.len(), rows * cols);
    debug_assert_eq!(data.len(), rows * cols / 2);
    debug_assert!(scales.len() >= rows * scale_stride);
    if rows == 0 || cols == 0 {
        return;
    }
    data.par_chunks_mut(BLOCK * cols / 2)
        .zip(x.par_chunks(BLOCK * cols))
        .zip(scales.par_chunks_mut(BLOCK * scale_stride))
        .enumerate()
        .for_each(|(slab, ((d, xs), s))| {
            quantize_slab(xs, q, slab * BLOCK, d, s, scale_stride);
        });
}

/// One slab of 16 rows starting at row `r0`.
fn quantize_slab<T: Element>(
    xs: &[T],
    q: &RowQuant<'_>,
    r0: usize,
    data: &mut [u8],
    scales: &mut [u8],
    scale_stride: usize,
) {
    let cols = q.cols;
    let nb = cols / BLOCK;
    let mut tile = [[0.0f32; BLOCK]; BLOCK]; // [row in slab][element in block]
    for b in 0..nb {
        for (r, t) in tile.iter_mut().enumerate() {
            let src = &xs[r * cols + b * BLOCK..r * cols + (b + 1) * BLOCK];
            for (v, s) in t.iter_mut().zip(src) {
                *v = s.to_f32();
            }
        }
        let tile_amax = if q.two_d {
            Some(tile.iter().fold(0.0f32, |m, row| {
                fmax_ignore_nan(m, scale::amax_of(row.iter().copied()))
            }))
        } else {
            None
        };
        let mut codes = [[0u8; BLOCK]; BLOCK];
        let mut sdb = [0u8; BLOCK];
        match q.four_over_six {
            Some(mode) => four_over_six_tile(q, mode, r0, &tile, tile_amax, &mut codes, &mut sdb),
            None => {
                for r in 0..BLOCK {
                    let block_amax =
                        tile_amax.unwrap_or_else(|| scale::amax_of(tile[r].iter().copied()));
                    let s_enc = scale::global_encode_scale(q.amax.of_row(r0 + r), q.e4m3_max);
                    let s_dec = scale::global_decode_scale(s_enc);
                    sdb[r] = scale::block_scale_code(block_amax, s_enc);
                    let enc = scale::block_encode_scale(sdb[r], s_dec);
                    match q.sr {
                        None => encode_block_rn(&tile[r], enc, &mut codes[r]),
                        Some((seed, dir)) => {
                            let bits = sr::block_bits(seed, dir, (r0 + r) as u64, b as u32);
                            encode_block_sr(&tile[r], enc, &bits, &mut codes[r]);
                        }
                    }
                }
            }
        }
        for r in 0..BLOCK {
            scales[r * scale_stride + b] = sdb[r];
            let out = &mut data[r * cols / 2 + b * BLOCK / 2..r * cols / 2 + (b + 1) * BLOCK / 2];
            for (o, pair) in out.iter_mut().zip(codes[r].chunks_exact(2)) {
                *o = e2m1::pack(pair[0], pair[1]);
            }
        }
    }
}

/// Round-to-nearest-even: `e2m1(x * enc)` (PTX `cvt.rn.satfinite.e2m1x2.f32`).
#[inline]
pub(crate) fn encode_block_rn(x: &[f32; BLOCK], enc: f32, codes: &mut [u8; BLOCK]) {
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = e2m1::encode(v * enc);
    }
}

/// Stochastic rounding of `x * enc` with the block's 128 random bits.
#[inline]
pub(crate) fn encode_block_sr(
    x: &[f32; BLOCK],
    enc: f32,
    bits: &[u32; 4],
    codes: &mut [u8; BLOCK],
) {
    for (e, (c, &v)) in codes.iter_mut().zip(x).enumerate() {
        *c = e2m1::encode(sr::stochastic_round_e2m1(
            v * enc,
            sr::element_bits(bits, e),
        ));
    }
}

/// One 4over6 candidate of one block row: scale code, element codes, summed error.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    pub sdb: u8,
    pub codes: [u8; BLOCK],
    pub err: f32,
}

/// Both 4over6 candidates of one 16-element block, in the kernel's arithmetic
/// (`quantize_4over6_nvfp4.cuh::compute_scale_pair` / `cvt_fp32_to_fp4_8x_with_error`):
///
/// ```text
/// S_enc = global_encode_scale(amax, E4M3_MAX);  S_dec = 1 / S_enc
/// base  = (block_amax / 6) * S_enc
/// map6  = e4m3(fminf(base, 448));  map4 = e4m3(fminf(base * 1.5, 448))
/// inv_c = fminf(1 / (float(sdb_c) * S_dec), FLT_MAX);  q_i = e2m1(x_i * inv_c)
/// err_c = Σ_i (in element order, from 0) |d_i| or d_i*d_i,
///         d_i = ((e2m1(q_i) * float(sdb_c)) * amax) / (6 * E4M3_MAX) - x_i
/// ```
pub(crate) fn four_over_six_candidates(
    x: &[f32; BLOCK],
    block_amax: f32,
    amax: f32,
    e4m3_max: u16,
    mode: FourOverSix,
) -> (Candidate, Candidate) {
    let s_enc = scale::global_encode_scale(amax, e4m3_max);
    let s_dec = 1.0 / s_enc;
    let base = (block_amax / scale::FP4_MAX) * s_enc;
    let denom = scale::FP4_MAX * f32::from(e4m3_max);
    let make = |sf: f32| {
        let sdb = e4m3::encode(sf.min(e4m3::MAX));
        let inv = scale::block_encode_scale(sdb, s_dec);
        let sdb_f = e4m3::decode(sdb);
        let mut codes = [0u8; BLOCK];
        encode_block_rn(x, inv, &mut codes);
        let mut err = 0.0f32;
        for (&c, &xi) in codes.iter().zip(x) {
            let val = ((e2m1::decode(c) * sdb_f) * amax) / denom;
            let d = val - xi;
            err += match mode {
                FourOverSix::Mae => d.abs(),
                FourOverSix::Mse => d * d,
            };
        }
        Candidate { sdb, codes, err }
    };
    (make(base * 1.5), make(base))
}

/// The 2-D 4over6 error of a tile: the 16 row errors summed in the order of the CUDA
/// warp reduction (`__shfl_down_sync` by 8, 4, 2, 1 within 16 lanes):
/// `[((e0+e8)+(e4+e12)) + ((e2+e10)+(e6+e14))] + [((e1+e9)+(e5+e13)) + ((e3+e11)+(e7+e15))]`.
pub(crate) fn tree_sum_16(e: [f32; BLOCK]) -> f32 {
    let mut v = e;
    let mut half = BLOCK / 2;
    while half > 0 {
        for i in 0..half {
            v[i] += v[i + half];
        }
        half /= 2;
    }
    v[0]
}

fn four_over_six_tile(
    q: &RowQuant<'_>,
    mode: FourOverSix,
    r0: usize,
    tile: &[[f32; BLOCK]; BLOCK],
    tile_amax: Option<f32>,
    codes: &mut [[u8; BLOCK]; BLOCK],
    sdb: &mut [u8; BLOCK],
) {
    let cands: [(Candidate, Candidate); BLOCK] = std::array::from_fn(|r| {
        let block_amax = tile_amax.unwrap_or_else(|| scale::amax_of(tile[r].iter().copied()));
        four_over_six_candidates(
            &tile[r],
            block_amax,
            q.amax.of_row(r0 + r),
            q.e4m3_max,
            mode,
        )
    });
    // Ties choose map-to-6 (`err_map4 < err_map6` picks map-to-4); NaN errors too.
    let tile_pick_map4 = if q.two_d {
        Some(tree_sum_16(cands.map(|c| c.0.err)) < tree_sum_16(cands.map(|c| c.1.err)))
    } else {
        None
    };
    for (r, (map4, map6)) in cands.iter().enumerate() {
        let pick_map4 = tile_pick_map4.unwrap_or(map4.err < map6.err);
        let c = if pick_map4 { map4 } else { map6 };
        codes[r] = c.codes;
        sdb[r] = c.sdb;
    }
}

/// NaN-ignoring amax of a whole operand, in parallel.
pub(crate) fn tensor_amax<T: Element>(x: &[T]) -> f32 {
    x.par_chunks(1 << 16)
        .map(|c| scale::amax_of(c.iter().map(|v| v.to_f32())))
        .reduce(|| 0.0, fmax_ignore_nan)
}

/// NaN-ignoring amax of every row of a `[rows, cols]` matrix.
pub(crate) fn row_amax<T: Element>(x: &[T], cols: usize) -> Vec<f32> {
    if cols == 0 {
        return Vec::new();
    }
    x.par_chunks(cols)
        .map(|row| scale::amax_of(row.iter().map(|v| v.to_f32())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_sum_order() {
        // Values chosen so that the order matters in fp32: the tree adds e1 and e9 first
        // (exactly 0), a sequential sum absorbs e0 into 1e8 first.
        let mut e = [0.0f32; BLOCK];
        e[0] = 1.0;
        e[1] = 1e8;
        e[9] = -1e8;
        assert_eq!(tree_sum_16(e), 1.0);
        let seq: f32 = e.iter().fold(0.0, |a, &v| a + v);
        assert_eq!(seq, 0.0);
        let e: [f32; BLOCK] = std::array::from_fn(|i| 1.0 / (i as f32 + 1.0));
        let expect = (((e[0] + e[8]) + (e[4] + e[12])) + ((e[2] + e[10]) + (e[6] + e[14])))
            + (((e[1] + e[9]) + (e[5] + e[13])) + ((e[3] + e[11]) + (e[7] + e[15])));
        assert_eq!(tree_sum_16(e).to_bits(), expect.to_bits());
    }
}
