//! The CPU kernels: rayon over 32-row groups (or rows), plain loops the compiler can
//! vectorize. Quantization always writes **compact** scales; the swizzled layout is a
//! permutation applied afterwards (TE's unfused `nvte_swizzle_scaling_factors` path),
//! so one well-tested function owns the swizzle.

use quant_core::block_max::{block_abs_max, block_abs_max_bits, column_abs_max_bits, column_key};
use quant_core::codec::pow2::{self, LaneExps};
use quant_core::codec::{e4m3, e5m2};
use quant_core::cpu::fold_abs_max;
use quant_core::dtype::Bits16;
use quant_core::simd::Level;
use quant_core::stream::StoreMode;
use quant_core::strips::{Strip, column_strips};
use quant_core::{DType, Element, narrowed, simd, widened};
use rayon::prelude::*;

use crate::layout::{
    ScaleLayout, columnwise_scale_index, columnwise_scale_shape, rowwise_scale_at,
    rowwise_scale_index, rowwise_scale_shape,
};
use crate::scale::{BLOCK, Mxfp8Dtype, ScaleRule, multiplier, scale};

/// Element type and scale rule: everything the quantize kernels need besides data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cfg {
    /// The SIMD level the call's kernels dispatch to ([`simd::level`] when it began).
    pub level: Level,
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

    /// A span's codes from its block amax keys, and each block's multiplier exponent
    /// `k = 127 - code` (the multiplier is `2^k`, [`multiplier`]). The rule is matched
    /// once, outside the loop, so that each arm's loop vectorizes (matched per block it
    /// was a tenth of the MXFP8 rowwise quantize from f32).
    #[inline(always)]
    fn codes_and_exps(self, keys: &[u32; STEP], codes: &mut [u8; STEP], ks: &mut [i32; STEP]) {
        #[inline(always)]
        fn each(
            keys: &[u32; STEP],
            codes: &mut [u8; STEP],
            ks: &mut [i32; STEP],
            code: impl Fn(f32) -> u8,
        ) {
            for ((c, k), &key) in codes.iter_mut().zip(ks.iter_mut()).zip(keys) {
                *c = code(f32::from_bits(key));
                *k = multiplier_exp(*c);
            }
        }
        let dtype = self.dtype;
        match self.rule {
            ScaleRule::Te => each(keys, codes, ks, |a| ScaleRule::Te.code(a, dtype)),
            ScaleRule::Ocp => each(keys, codes, ks, |a| ScaleRule::Ocp.code(a, dtype)),
        }
    }

    /// Per-column codes and multipliers from amax keys, the rule matched once outside
    /// the loop as in [`Cfg::codes_and_exps`] (matched per column, the loop stayed
    /// scalar: a tenth of the MXFP8 columnwise quantize from f32 at AVX2).
    #[inline(always)]
    fn codes_and_mults(self, keys: &[u32], codes: &mut [u8], mults: &mut [f32]) {
        #[inline(always)]
        fn each(keys: &[u32], codes: &mut [u8], mults: &mut [f32], code: impl Fn(f32) -> u8) {
            for ((c, m), &key) in codes.iter_mut().zip(mults.iter_mut()).zip(keys) {
                *c = code(f32::from_bits(key));
                *m = multiplier(*c);
            }
        }
        let dtype = self.dtype;
        match self.rule {
            ScaleRule::Te => each(keys, codes, mults, |a| ScaleRule::Te.code(a, dtype)),
            ScaleRule::Ocp => each(keys, codes, mults, |a| ScaleRule::Ocp.code(a, dtype)),
        }
    }
}

/// `out = fp8(x * multiplier(codes[b]))` over whole blocks: block `b` of `xs` under its
/// E8M0 code's multiplier (a ragged tail past the last whole block is left alone). The dtype and the `+0`
/// rule are matched once per call, not per block, and each block is a fixed-size
/// array, so the loop body is two straight 16-lane steps: called once per block over a
/// slice, LLVM re-tested both flags and ran a masked remainder loop for every 32 values
/// (MXFP8 rowwise quantize from f32 spent most of its time there on Zen 4).
#[inline(always)]
fn encode_blocks(cfg: Cfg, xs: &[f32], codes: &[u8], out: &mut [u8]) {
    #[inline(always)]
    fn each(xs: &[f32], codes: &[u8], out: &mut [u8], enc: impl Fn(f32, f32) -> u8) {
        let (blocks, _) = xs.as_chunks::<BLOCK>();
        for ((o, v), &c) in out
            .as_chunks_mut::<BLOCK>()
            .0
            .iter_mut()
            .zip(blocks)
            .zip(codes)
        {
            let m = multiplier(c);
            for (o, &v) in o.iter_mut().zip(v) {
                *o = enc(v, m);
            }
        }
    }
    match (cfg.dtype, cfg.plus_zero) {
        (Mxfp8Dtype::E4M3, false) => each(xs, codes, out, |v, m| e4m3::encode(v * m)),
        (Mxfp8Dtype::E5M2, false) => each(xs, codes, out, |v, m| e5m2::encode(v * m)),
        (Mxfp8Dtype::E4M3, true) => each(xs, codes, out, |v, m| {
            e4m3::encode(if v == 0.0 { 0.0 } else { v * m })
        }),
        (Mxfp8Dtype::E5M2, true) => each(xs, codes, out, |v, m| {
            e5m2::encode(if v == 0.0 { 0.0 } else { v * m })
        }),
    }
}

/// `out[j] = fp8(x[j] * mult[j])`: one row under per-column multipliers. At AVX2
/// through the shared encoder ([`quant_core::codec::scaled_avx2`], the same codes):
/// LLVM's loop was about half of the columnwise quantize from f32 there.
#[inline(always)]
fn encode_cols(cfg: Cfg, xs: &[f32], mult: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use quant_core::codec::{Scale, scaled_avx2::encode_f32};
        let fp8 = cfg.dtype.pow2_codec();
        if cfg.level == Level::Avx2 && encode_f32(fp8, xs, Scale::Each(mult), cfg.plus_zero, out) {
            return;
        }
    }
    match (cfg.dtype, cfg.plus_zero) {
        (Mxfp8Dtype::E4M3, false) => {
            for ((o, &v), &s) in out.iter_mut().zip(xs).zip(mult) {
                *o = e4m3::encode(v * s);
            }
        }
        (Mxfp8Dtype::E5M2, false) => {
            for ((o, &v), &s) in out.iter_mut().zip(xs).zip(mult) {
                *o = e5m2::encode(v * s);
            }
        }
        (Mxfp8Dtype::E4M3, true) => {
            for ((o, &v), &s) in out.iter_mut().zip(xs).zip(mult) {
                *o = e4m3::encode(if v == 0.0 { 0.0 } else { v * s });
            }
        }
        (Mxfp8Dtype::E5M2, true) => {
            for ((o, &v), &s) in out.iter_mut().zip(xs).zip(mult) {
                *o = e5m2::encode(if v == 0.0 { 0.0 } else { v * s });
            }
        }
    }
}

/// `acc[j] = max(acc[j], key(xs[j]))`: running per-column key max.
///
/// TE's keys (NaN ignored) fold as the f32 maxima they are the bits of
/// ([`fold_abs_max`]): the integer max of `select(NaN, 0, bits)` over a slice became a
/// conditional store, `vpmaskmovd` at AVX2, 45 % of the columnwise quantize from f32 on
/// Zen 4.
#[inline(always)]
fn key_max_cols(rule: ScaleRule, xs: &[f32], acc: &mut [u32]) {
    match rule {
        ScaleRule::Te => {
            // Non-NaN magnitudes order as their bits, and keys start at +0.
            fold_abs_max(bytemuck::cast_slice_mut(acc), xs);
        }
        ScaleRule::Ocp => {
            for (a, &v) in acc.iter_mut().zip(xs) {
                *a = (*a).max(ScaleRule::Ocp.key(v));
            }
        }
    }
}

/// Input rows per task: four 32-row block rows, one 128-row tile row of swizzled scales.
const SLAB: usize = 128;
/// The widest chunk of a 32-row group, in columns: narrower rows are taken whole.
///
/// Whole rows make the group's first pass (the column maxima) read 32 long contiguous
/// runs, which the hardware prefetcher streams; the second pass (the encode) then reads
/// the group again, mostly from L2 and L3. On Zen 4 at 8192x8192, whole rows against
/// 2048-column chunks (a group's chunk in L2, the previous design): columnwise quantize
/// x1.27 (bf16) and x1.21 (f32); 512 to 4096 columns all measured alike, and at 16384
/// columns whole rows beat 8192-column chunks x1.06 (bf16) / x1.10 (f32).
const MAX_CHUNK: usize = 16384;

/// The chunk width of the 1-D columnwise-only walk from f32 ([`chunk_width`]'s
/// `narrow`): a group's chunk is 32 KiB, so the encode reads it from L1, and the next
/// chunk is fetched into L2 while it encodes ([`slab`]). x1.08 against whole rows on
/// two Zen 4 cores at 8192x8192 (1.04-1.09 over 4-5 A/B pairs; 512 columns x1.04, 128
/// x0.78, 1024-2048 without the fetch x0.84-0.85). 16-bit input keeps whole rows: its
/// lane route ([`group_bits`]) ran x0.81 at 256 columns and x0.91 at 512, and so does
/// 2-D from f32 (x0.70).
const NARROW_CHUNK: usize = 256;

/// The chunk width for rows of `k` columns: whole rows up to [`MAX_CHUNK`], or
/// [`NARROW_CHUNK`] columns for the `narrow` walk. Unit tests narrow it
/// ([`tests::with_chunk`]) to take the multi-chunk walk on small tensors.
fn chunk_width(k: usize, narrow: bool) -> usize {
    #[cfg(test)]
    if let Some(c) = tests::TEST_CHUNK.get() {
        return k.min(c);
    }
    k.min(if narrow { NARROW_CHUNK } else { MAX_CHUNK })
}

/// Where one slab's columnwise scales go.
enum ColScales<'a> {
    /// Compact: the slab's (up to) 4 rows of `[roundup(M/32,4), roundup(K,128)]`.
    Compact(&'a mut [u8]),
    /// Swizzled: the slab's 512-byte column of tiles (one 128-column tile per row).
    Swizzled(Strip<'a, u8>),
}

/// One task's input rows and output pieces.
struct SlabJob<'a, T> {
    x: &'a [T],
    row: Option<(&'a mut [u8], &'a mut [u8])>,
    col: Option<(&'a mut [u8], ColScales<'a>)>,
}

/// Per-worker scratch of the slab walk, sized for one chunk of `chunk` columns.
struct Scratch {
    /// A 32-row group's chunk, widened to f32 (allocated on first use: the bf16 lane
    /// route never widens).
    wide: Vec<f32>,
    /// The chunk's per-column and per-block values.
    cols: ChunkCols,
    /// One row's span, widened ([`row_run`]).
    span: Box<[f32; STEP * BLOCK]>,
    /// A chunk's column exponents ([`group_bits`]).
    lanes: LaneExps,
    /// Whether the f32 walk fetches the next chunk into L2 while it encodes one (the
    /// narrow walk of [`NARROW_CHUNK`]).
    fetch_next: bool,
}

impl Scratch {
    fn new(chunk: usize, fetch_next: bool) -> Scratch {
        Scratch {
            wide: Vec::new(),
            cols: ChunkCols::new(chunk),
            span: Box::new([0f32; STEP * BLOCK]),
            lanes: LaneExps::new(),
            fetch_next,
        }
    }
}

/// A chunk's per-column values (`chunk` entries) and per-block values (`chunk / 32`).
struct ChunkCols {
    /// Column (or, 2-D, tile) amax keys.
    key: Vec<u32>,
    /// Column multipliers.
    mult: Vec<f32>,
    /// Column E8M0 codes.
    code: Vec<u8>,
    /// Column amax keys on 16-bit magnitudes ([`group_bits`]).
    key16: Vec<u16>,
    /// Column multiplier exponents ([`group_bits`]).
    exp: Vec<i32>,
    /// Tile codes and their multipliers' exponents (2-D).
    tile_code: Vec<u8>,
    tile_exp: Vec<i32>,
    /// One row's block keys, codes and multiplier exponents.
    row_key: Vec<u32>,
    row_code: Vec<u8>,
    row_exp: Vec<i32>,
}

impl ChunkCols {
    fn new(chunk: usize) -> ChunkCols {
        let blocks = chunk / BLOCK;
        ChunkCols {
            key: vec![0; chunk],
            mult: vec![0.0; chunk],
            code: vec![0; chunk],
            key16: vec![0; chunk],
            exp: vec![0; chunk],
            tile_code: vec![0; blocks],
            tile_exp: vec![0; blocks],
            row_key: vec![0; blocks],
            row_code: vec![0; blocks],
            row_exp: vec![0; blocks],
        }
    }
}

/// Quantizes `xs` (`[m, k]`, multiples of 32) into the requested directions. Scales go
/// straight into their final layout (compact or swizzled); padding is left untouched.
#[allow(clippy::too_many_arguments)]
pub(crate) fn quantize<T: Element>(
    cfg: Cfg,
    two_d: bool,
    layout: ScaleLayout,
    xs: &[T],
    m: usize,
    k: usize,
    row: Option<(&mut [u8], &mut [u8])>,
    col: Option<(&mut [u8], &mut [u8])>,
) -> quant_core::Result<()> {
    if m == 0 || k == 0 {
        return Ok(());
    }
    let slabs = m.div_ceil(SLAB);
    // 1-D columnwise only, from f32: the narrow chunk walk that fetches ahead.
    let narrow =
        quant_core::dtype::f32_slice(xs).is_some() && !two_d && row.is_none() && col.is_some();
    let [_, rstride] = rowwise_scale_shape(m, k);
    let [crows, cstride] = columnwise_scale_shape(m, k);
    let mut rows: Vec<Option<(&mut [u8], &mut [u8])>> = match row {
        Some((d, s)) => d
            .chunks_mut(SLAB * k)
            .zip(s.chunks_mut(SLAB * rstride))
            .map(Some)
            .collect(),
        None => Vec::new(),
    };
    let mut cols: Vec<Option<(&mut [u8], ColScales<'_>)>> = match col {
        Some((d, s)) => {
            let scales: Vec<ColScales<'_>> = match layout {
                ScaleLayout::Compact => s
                    .chunks_mut(SLAB / BLOCK * cstride)
                    .map(ColScales::Compact)
                    .collect(),
                ScaleLayout::Swizzled => {
                    let width = crows / 4 * TILE_BYTES;
                    column_strips(s, width, TILE_BYTES)?
                        .map(ColScales::Swizzled)
                        .collect()
                }
            };
            d.chunks_mut(SLAB * k).zip(scales).map(Some).collect()
        }
        None => Vec::new(),
    };
    rows.resize_with(slabs, || None);
    cols.resize_with(slabs, || None);
    let jobs: Vec<SlabJob<'_, T>> = xs
        .chunks(SLAB * k)
        .zip(rows)
        .zip(cols)
        .map(|((x, row), col)| SlabJob { x, row, col })
        .collect();
    let chunk = chunk_width(k, narrow);
    jobs.into_par_iter().for_each_init(
        || Scratch::new(chunk, narrow),
        |scratch, mut job| {
            simd::dispatch(
                cfg.level,
                #[inline(always)]
                || slab(cfg, two_d, layout, k, [rstride, cstride], &mut job, scratch),
            )
        },
    );
    Ok(())
}

/// The most blocks per step of the rowwise walk ([`row_run`]); [`SPAN_BYTES`] sets how
/// many it takes.
const STEP: usize = 16;
/// Input bytes of one step of the rowwise walk: 16 blocks of bf16, 8 of f32. A step's
/// maxima are one burst of loads and its encode a stretch of compute without any; on
/// one Zen 4 core, f32 input streamed at 8.3 GB/s in 2 KiB steps, 10.8 in 1 KiB steps
/// and 6.4 in 4 KiB steps (bf16 in 512-byte steps lost x0.88 to the per-step work).
const SPAN_BYTES: usize = 1024;
/// How many steps ahead the rowwise walk prefetches its input.
const PREFETCH_STEPS: usize = 4;

/// Blocks per step of the rowwise walk: [`SPAN_BYTES`] of `T` input, at most [`STEP`].
#[inline(always)]
fn span_blocks<T>() -> usize {
    (SPAN_BYTES / (BLOCK * std::mem::size_of::<T>())).clamp(1, STEP)
}

/// Rowwise 1x32 only (the common case): row by row, [`span_blocks`] blocks at a time
/// ([`row_run`]).
#[inline(always)]
fn rowwise_only<T: Element>(
    cfg: Cfg,
    layout: ScaleLayout,
    k: usize,
    rstride: usize,
    x: &[T],
    rd: &mut [u8],
    rs: &mut [u8],
) {
    let mut span = [0f32; STEP * BLOCK];
    for (i, out) in rd.chunks_exact_mut(k).enumerate() {
        row_run(
            cfg,
            layout,
            rstride,
            x,
            [k, i, 0],
            out,
            Some(rs),
            &mut span,
            None,
        );
    }
}

/// Row `i` of the slab `x` (`k` columns), columns `c0..c0 + out.len()` (a multiple of
/// [`BLOCK`]), quantized rowwise into `out` and the slab's scales `rs`:
/// [`span_blocks`] blocks at a time, in three passes over an L1-resident span: every block's
/// key max (folded together, [`block_abs_max`]), then every block's code
/// and multiplier, then the encode. Separating the passes keeps the per-block scalar
/// work (the E8M0 code) out of the vector loops, and f32 input is read in place (16-bit
/// input is widened once per span, into `span`, instead of once per block into a stack
/// array the encoder then re-reads with wider loads). bf16 and f16 input at AVX-512 is
/// not widened at all ([`span_bits_pow2`]), and its maxima run a span ahead of its
/// encode ([`Ahead`]). f32 input at AVX-512 is encoded in 16-bit lanes too, narrowed to
/// bf16 by rounding to odd ([`pow2::encode_blocks_f32`], exact), where the multiply and
/// the 32-bit encoder took twice the operations.
///
/// With `tiles` (2-D: the key of every block of the run, its 32x32 tile's), those
/// replace the blocks' own maxima; `rs` is `None` where no rowwise scale is kept (the
/// run then only fills `out`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn row_run<T: Element>(
    cfg: Cfg,
    layout: ScaleLayout,
    rstride: usize,
    x: &[T],
    [k, i, c0]: [usize; 3],
    out: &mut [u8],
    mut rs: Option<&mut [u8]>,
    span: &mut [f32; STEP * BLOCK],
    tiles: Option<&[u32]>,
) {
    let xr = &x[i * k + c0..i * k + c0 + out.len()];
    let run = span_blocks::<T>() * BLOCK;
    let mut ahead = Ahead::new(cfg, xr, run, tiles.is_none());
    for (si, (xs, os)) in xr.chunks(run).zip(out.chunks_mut(run)).enumerate() {
        let next = i * k + c0 + (si + PREFETCH_STEPS) * run;
        simd::prefetch(x.get(next..next + run).unwrap_or(&[]));
        let mut codes = [0u8; STEP];
        let nb = xs.len() / BLOCK;
        // The run's tile keys, where it has them.
        let given = tiles.map(|t| {
            let mut keys = [0u32; STEP];
            keys[..nb].copy_from_slice(&t[si * run / BLOCK..][..nb]);
            keys
        });
        let fast = match ahead.as_mut() {
            Some(a) => {
                let keys = match given {
                    Some(keys) => keys,
                    None => a.advance(si + 1),
                };
                span_bits_pow2(
                    cfg,
                    a.bits.slice(si * run..si * run + xs.len()),
                    &keys,
                    &mut codes,
                    os,
                )
            }
            None => false,
        };
        if !fast {
            let w = widened(xs, &mut span[..xs.len()]);
            let keys = given.unwrap_or_else(|| {
                let mut keys = [0u32; STEP];
                block_abs_max(cfg.level, w, cfg.rule.nan_rule(), &mut keys[..nb]);
                keys
            });
            let mut ks = [0i32; STEP];
            cfg.codes_and_exps(&keys, &mut codes, &mut ks);
            let whole = nb * BLOCK;
            encode_row_f32(cfg, &w[..whole], &codes[..nb], &ks[..nb], &mut os[..whole]);
        }
        let kb0 = (c0 + si * run) / BLOCK;
        let Some(rs) = rs.as_deref_mut() else {
            continue;
        };
        match layout {
            // The row's scales are contiguous; in a swizzled tile, runs of four.
            ScaleLayout::Compact => {
                let at = rowwise_scale_at(layout, i, kb0, rstride);
                simd::copy_short(&mut rs[at..at + nb], &codes[..nb]);
            }
            ScaleLayout::Swizzled if kb0.is_multiple_of(4) => {
                for (q, four) in codes[..nb].chunks(4).enumerate() {
                    let at = rowwise_scale_at(layout, i, kb0 + 4 * q, rstride);
                    simd::copy_short(&mut rs[at..at + four.len()], four);
                }
            }
            // A run that starts inside a tile's four-block group (only the narrow
            // spans of unit tests): block by block.
            ScaleLayout::Swizzled => {
                for (b, &code) in codes[..nb].iter().enumerate() {
                    rs[rowwise_scale_at(layout, i, kb0 + b, rstride)] = code;
                }
            }
        }
    }
}

/// The block maxima of a bf16 or f16 row's spans, one span ahead of the encode: the maxima of
/// span `s + 1` are taken before span `s` is encoded, so that their loads and their
/// fold (a long dependency chain) overlap that encode instead of waiting for it to
/// retire and then holding up the next span's codes (on Zen 4, a third of the
/// driver's samples sat on those waits).
struct Ahead<'a> {
    cfg: Cfg,
    /// The row's bit patterns.
    bits: Bits16<'a>,
    /// Values per span.
    run: usize,
    /// The maxima of the span [`Ahead::advance`] returns next.
    keys: [u32; STEP],
}

impl<'a> Ahead<'a> {
    /// `Some` where [`span_bits_pow2`] may encode the row (bf16 or f16 input at AVX-512
    /// or AVX2), with the first span's maxima taken when `maxima` (not when the caller
    /// has the keys).
    #[inline(always)]
    fn new<T: Element>(cfg: Cfg, xr: &'a [T], run: usize, maxima: bool) -> Option<Ahead<'a>> {
        if cfg.level == Level::Scalar {
            return None;
        }
        let bits = Bits16::of(xr)?;
        let mut a = Ahead {
            cfg,
            bits,
            run,
            keys: [0; STEP],
        };
        if maxima {
            a.take(0);
        }
        Some(a)
    }

    /// Span `s`'s maxima into `keys` (nothing past the row's end).
    #[inline(always)]
    fn take(&mut self, s: usize) {
        let from = s * self.run;
        if from >= self.bits.len() {
            return;
        }
        let span = self.bits.slice(from..self.bits.len().min(from + self.run));
        let rule = self.cfg.rule.nan_rule();
        block_abs_max_bits(
            self.cfg.level,
            span,
            rule,
            &mut self.keys[..span.len() / BLOCK],
        );
    }

    /// The maxima taken last (span `next - 1`'s), after taking span `next`'s.
    #[inline(always)]
    fn advance(&mut self, next: usize) -> [u32; STEP] {
        let keys = self.keys;
        self.take(next);
        keys
    }
}

/// One span of [`rowwise_only`] straight from bf16 or f16 bits, at AVX-512 or AVX2
/// (f16 there widened and rounded to odd into bf16 in the register), given its block
/// maxima (`keys`, from [`block_abs_max_bits`] on the 16-bit keys): the encode in
/// 16-bit lanes ([`pow2::encode_blocks`]: an E8M0 scale only moves the exponent, so no
/// f32 value is formed from bf16). The same codes as the f32 route,
/// bit for bit (both are tested against it). Returns `false`, leaving `codes` and `out`
/// to the f32 route, for a span with a block scale the encoder does not take: below
/// 2^-119 (E4M3; 2^-111 for E5M2) for bf16, `2^127` (code `0xFE`) or NaN for f16.
#[inline(always)]
fn span_bits_pow2(
    cfg: Cfg,
    bits: Bits16<'_>,
    keys: &[u32; STEP],
    codes: &mut [u8; STEP],
    out: &mut [u8],
) -> bool {
    let nb = bits.len() / BLOCK;
    let mut ks = [0i32; STEP];
    cfg.codes_and_exps(keys, codes, &mut ks);
    pow2::encode_blocks(
        cfg.level,
        cfg.dtype.pow2_codec(),
        bits,
        BLOCK,
        &ks[..nb],
        cfg.plus_zero,
        out,
    )
}

/// f32 values of whole blocks whose E8M0 codes are `codes` (and their multipliers'
/// exponents `exps`, [`multiplier_exp`]), encoded into `out`. The multipliers are powers
/// of two, so at AVX-512 the values are encoded in 16-bit lanes
/// ([`pow2::encode_blocks_f32`], narrowed to bf16 by rounding to odd, exact); the
/// multiply-and-encode route takes any run the kernel refuses.
#[inline(always)]
fn encode_row_f32(cfg: Cfg, w: &[f32], codes: &[u8], exps: &[i32], out: &mut [u8]) {
    let fp8 = cfg.dtype.pow2_codec();
    if !pow2::encode_blocks_f32(cfg.level, fp8, w, BLOCK, exps, cfg.plus_zero, out) {
        encode_blocks(cfg, w, codes, out);
    }
}

/// `k` of a code's multiplier `2^k` ([`multiplier`]: `2^(127 - code)`), the exponent the
/// power-of-two encoders take.
#[inline(always)]
fn multiplier_exp(code: u8) -> i32 {
    127 - i32::from(code)
}

/// Bytes of one 128x4 swizzle tile.
const TILE_BYTES: usize = 512;

/// One slab, 32-row group by group, chunk by chunk: widen the group's chunk once (16-bit
/// input, into f32 in L2; f32 input is read in place), take the amaxes the blocks need,
/// then encode every requested direction (2-D with both: each row once, copied to the
/// columnwise output, whose tile codes are the same bytes; in-process A/B from f32
/// x1.19-1.27 against encoding it twice).
#[inline(always)]
fn slab<T: Element>(
    cfg: Cfg,
    two_d: bool,
    layout: ScaleLayout,
    k: usize,
    [rstride, cstride]: [usize; 2],
    job: &mut SlabJob<'_, T>,
    scratch: &mut Scratch,
) {
    let x = job.x;
    let groups = x.len() / (BLOCK * k);
    if let (None, false, Some((rd, rs))) = (job.col.as_ref(), two_d, job.row.as_mut()) {
        rowwise_only(cfg, layout, k, rstride, x, rd, rs);
        return;
    }
    if two_d && std::mem::size_of::<T>() == 2 {
        two_d_rows(cfg, layout, k, [rstride, cstride], job, scratch);
        return;
    }
    let chunk = scratch.cols.code.len();
    let fetch_next = scratch.fetch_next;
    for g in 0..groups {
        for c0 in (0..k).step_by(chunk) {
            let cw = chunk.min(k - c0);
            let nb = cw / BLOCK;
            let fast = !two_d && group_bits(cfg, layout, [k, rstride], [g, c0, cw], job, scratch);
            let ChunkCols {
                key: col_key,
                mult: col_mult,
                code: col_code,
                tile_code,
                tile_exp,
                row_key,
                row_code,
                row_exp,
                ..
            } = &mut scratch.cols;
            if !fast {
                // The group's chunk as f32 rows: f32 input in place (copying it was a
                // quarter of the columnwise quantize from f32), 16-bit input widened
                // once into the scratch (row-major, contiguous runs of `cw`).
                let (src, stride) = match quant_core::dtype::f32_slice(x) {
                    Some(xf) => (&xf[g * BLOCK * k + c0..], k),
                    None => {
                        let wide = &mut scratch.wide;
                        if wide.len() < BLOCK * cw {
                            wide.resize(BLOCK * cw, 0.0);
                        }
                        for r in 0..BLOCK {
                            let i = g * BLOCK + r;
                            T::widen_slice(
                                &x[i * k + c0..i * k + c0 + cw],
                                &mut wide[r * cw..(r + 1) * cw],
                            );
                        }
                        (&wide[..BLOCK * cw], cw)
                    }
                };
                let rows = || (0..BLOCK).map(|r| &src[r * stride..][..cw]);
                // Column / tile amaxes over the group's 32 rows.
                if two_d {
                    let keys = &mut col_key[..nb];
                    keys.fill(0);
                    for row in rows() {
                        block_abs_max(cfg.level, row, cfg.rule.nan_rule(), &mut row_key[..nb]);
                        for (a, &b) in keys.iter_mut().zip(row_key.iter()) {
                            *a = (*a).max(b);
                        }
                    }
                    for ((c, e), &a) in tile_code
                        .iter_mut()
                        .zip(tile_exp.iter_mut())
                        .zip(keys.iter())
                    {
                        *c = cfg.code(a);
                        *e = multiplier_exp(*c);
                    }
                } else if job.col.is_some() {
                    let keys = &mut col_key[..cw];
                    keys.fill(0);
                    for row in rows() {
                        key_max_cols(cfg.rule, row, keys);
                    }
                    cfg.codes_and_mults(keys, &mut col_code[..cw], &mut col_mult[..cw]);
                }
                // Encode, each row's step fetching the same row's run of the next chunk
                // (this group's, or the next group's first) into L2 where it pays: the
                // next maxima pass then reads from there, not from memory.
                for (r, w) in rows().enumerate() {
                    let i = g * BLOCK + r;
                    if fetch_next {
                        let (ng, nc) = if c0 + cw < k {
                            (g, c0 + cw)
                        } else {
                            (g + 1, 0)
                        };
                        let at = (ng * BLOCK + r) * k + nc;
                        simd::prefetch_l2(x.get(at..at + chunk.min(k - nc)).unwrap_or(&[]));
                    }
                    let dst = i * k + c0..i * k + c0 + cw;
                    if let Some((rd, rs)) = job.row.as_mut() {
                        if !two_d {
                            block_abs_max(cfg.level, w, cfg.rule.nan_rule(), &mut row_key[..nb]);
                        }
                        let (codes, exps) = if two_d {
                            (&tile_code[..nb], &tile_exp[..nb])
                        } else {
                            for ((c, e), &key) in row_code
                                .iter_mut()
                                .zip(row_exp.iter_mut())
                                .zip(&row_key[..nb])
                            {
                                *c = cfg.code(key);
                                *e = multiplier_exp(*c);
                            }
                            (&row_code[..nb], &row_exp[..nb])
                        };
                        encode_row_f32(cfg, w, codes, exps, &mut rd[dst.clone()]);
                        for (b, &code) in codes.iter().enumerate() {
                            rs[rowwise_scale_at(layout, i, c0 / BLOCK + b, rstride)] = code;
                        }
                    }
                    if let Some((cd, _)) = job.col.as_mut() {
                        let out = &mut cd[dst.clone()];
                        if !two_d {
                            encode_cols(cfg, w, &col_mult[..cw], out);
                        } else if let Some((rd, _)) = job.row.as_ref() {
                            // A 32x32 tile's codes are the same both ways: the row just
                            // encoded, copied while in L1.
                            out.copy_from_slice(&rd[dst]);
                        } else {
                            encode_row_f32(cfg, w, &tile_code[..nb], &tile_exp[..nb], out);
                        }
                    }
                }
            }
            // Columnwise scales of the group: one code per column (2-D: per tile).
            if let Some((_, cs)) = job.col.as_mut() {
                if two_d {
                    for (c, &t) in col_code[..cw].chunks_exact_mut(BLOCK).zip(tile_code.iter()) {
                        c.fill(t);
                    }
                }
                write_col_codes(cs, [g, cstride, c0], &col_code[..cw]);
            }
        }
    }
}

/// Input bytes of one row's run of a [`two_d_rows`] span: 32 rows of it (1 MiB) are
/// read twice, the second time mostly from L2. On Zen 4 at 8192x8192 (bf16, rowwise),
/// 32 KiB runs (whole rows) took 10.6 ms, 16 KiB 11.9, 4-8 KiB 12.6-14.6.
const TILE_SPAN_BYTES: usize = 32 * 1024;

/// 2-D (32x32 tile) quantization of a slab of 16-bit input, in 32-row groups over spans
/// of [`TILE_SPAN_BYTES`] per row, each span read twice: first every row's block
/// maxima (on the bits at AVX-512) folded over the group into the span's tile keys, then
/// every row encoded against them by [`row_run`] (in 16-bit lanes from bf16 or f16
/// bits at AVX-512). The rowwise and columnwise data of a tile are the same bytes (one
/// scale for the tile, the same rounding), so each row is encoded once, into the
/// rowwise output when there is one, and copied to the columnwise output while still in
/// L1.
///
/// The slab walk widens each group's chunk into f32 first and encodes both directions.
/// Against it (A/B, 8192x8192): x1.13 / x1.21 rowwise (bf16 / f16), x1.23 / x1.20
/// columnwise. f32 input stays on the slab walk: through this walk it ran x0.67-0.75,
/// its maxima pass stalling on every load where the slab walk's widening copy streams.
#[inline(always)]
fn two_d_rows<T: Element>(
    cfg: Cfg,
    layout: ScaleLayout,
    k: usize,
    [rstride, cstride]: [usize; 2],
    job: &mut SlabJob<'_, T>,
    scratch: &mut Scratch,
) {
    let x = job.x;
    // At most the scratch's chunk, which unit tests narrow to take several spans.
    let chunk = scratch.cols.code.len();
    let width = (TILE_SPAN_BYTES / std::mem::size_of::<T>() / BLOCK * BLOCK).min(chunk);
    let ChunkCols {
        key: tile_key,
        code: col_code,
        tile_code,
        row_key,
        ..
    } = &mut scratch.cols;
    for g in 0..x.len() / (BLOCK * k) {
        for s0 in (0..k).step_by(width) {
            let sw = width.min(k - s0);
            let nb = sw / BLOCK;
            let keys = &mut tile_key[..nb];
            keys.fill(0);
            for r in 0..BLOCK {
                let i = g * BLOCK + r;
                // The next rows' runs of the span, which are `k` apart.
                let ahead = (i + 2) * k + s0;
                simd::prefetch(x.get(ahead..ahead + sw).unwrap_or(&[]));
                row_block_keys(
                    cfg,
                    &x[i * k + s0..][..sw],
                    &mut scratch.span,
                    &mut row_key[..nb],
                );
                for (a, &b) in keys.iter_mut().zip(row_key.iter()) {
                    *a = (*a).max(b);
                }
            }
            for (c, &key) in tile_code.iter_mut().zip(keys.iter()) {
                *c = cfg.code(key);
            }
            for r in 0..BLOCK {
                let i = g * BLOCK + r;
                let at = i * k + s0..i * k + s0 + sw;
                // One encode, into the rowwise output (with its scales) where there is
                // one, else into the columnwise output.
                let (out, rs) = match (job.row.as_mut(), job.col.as_mut()) {
                    (Some((rd, rs)), _) => (&mut rd[at.clone()], Some(&mut **rs)),
                    (None, Some((cd, _))) => (&mut cd[at.clone()], None),
                    (None, None) => continue,
                };
                let (span, keys) = (&mut scratch.span, Some(&*keys));
                row_run(cfg, layout, rstride, x, [k, i, s0], out, rs, span, keys);
                if let (Some((rd, _)), Some((cd, _))) = (job.row.as_ref(), job.col.as_mut()) {
                    cd[at.clone()].copy_from_slice(&rd[at]);
                }
            }
            if let Some((_, cs)) = job.col.as_mut() {
                for (c, &t) in col_code[..sw].chunks_exact_mut(BLOCK).zip(tile_code.iter()) {
                    c.fill(t);
                }
                write_col_codes(cs, [g, cstride, s0], &col_code[..sw]);
            }
        }
    }
}

/// The block maxima keys of one row's run `xs` (whole blocks) into `keys`: from the
/// 16-bit keys of bf16 or f16 bits at AVX-512 ([`block_abs_max_bits`], as [`Ahead`]
/// takes them), else from the values (f32 in place, 16-bit input widened a step at a
/// time into `span`), as [`row_run`] takes them. Both give the same keys.
#[inline(always)]
fn row_block_keys<T: Element>(
    cfg: Cfg,
    xs: &[T],
    span: &mut [f32; STEP * BLOCK],
    keys: &mut [u32],
) {
    let rule = cfg.rule.nan_rule();
    if cfg.level == Level::Avx512
        && let Some(bits) = Bits16::of(xs)
    {
        block_abs_max_bits(cfg.level, bits, rule, keys);
        return;
    }
    for (xc, kc) in xs.chunks(STEP * BLOCK).zip(keys.chunks_mut(STEP)) {
        let w = widened(xc, &mut span[..xc.len()]);
        block_abs_max(cfg.level, w, rule, kc);
    }
}

/// Writes group `g`'s column codes (`codes[j]` is column `c0 + j`'s; `c0` and the
/// length are multiples of 32) into the slab's columnwise scales: one copy into the
/// compact rows, a 32-column block at a time into the swizzled tiles. (Matching the
/// layout per byte, with its divisions, was a tenth of the columnwise quantize.)
fn write_col_codes(cs: &mut ColScales<'_>, [g, cstride, c0]: [usize; 3], codes: &[u8]) {
    match cs {
        ColScales::Compact(s) => simd::copy_short(&mut s[g * cstride + c0..][..codes.len()], codes),
        ColScales::Swizzled(st) => {
            for (b, block) in codes.chunks_exact(BLOCK).enumerate() {
                let col = c0 + b * BLOCK;
                // Tile `col / 128`; within it, column `t` of the block is at
                // `t * 16 + ((col % 128) / 32) * 4 + g`.
                let tile = &mut st.row_mut(col / 128)[(col % 128) / BLOCK * 4 + g..];
                for (t, &code) in block.iter().enumerate() {
                    tile[t * 16] = code;
                }
            }
        }
    }
}

/// One 32-row group's chunk (`cw` columns from `c0`) of bf16 or f16 input at AVX-512
/// or AVX2 ([`LaneExps::supports`]), 1x32 blocks, without widening it: the column
/// maxima folded on the bits ([`column_abs_max_bits`]), the columnwise codes from the
/// per-column exponents in 16-bit lanes ([`LaneExps`]), and the rowwise blocks (when
/// asked for) by
/// [`row_run`], which takes its own 16-bit route. The column codes go to `col_code`;
/// the caller writes them out. Returns `false`, with nothing written, for other input
/// or levels and where a column's scale is outside the encoder's exact range (a
/// column block whose amax is tiny): the caller then takes the f32 route.
#[inline(always)]
fn group_bits<T: Element>(
    cfg: Cfg,
    layout: ScaleLayout,
    [k, rstride]: [usize; 2],
    [g, c0, cw]: [usize; 3],
    job: &mut SlabJob<'_, T>,
    scratch: &mut Scratch,
) -> bool {
    let (Some(bits), Some((cd, _))) = (Bits16::of(job.x), &mut job.col) else {
        return false;
    };
    if !LaneExps::supports(cfg.level) {
        return false;
    }
    let rows = g * BLOCK..(g + 1) * BLOCK;
    let run = |i: usize| bits.slice(i * k + c0..i * k + c0 + cw);
    let ChunkCols {
        code: col_code,
        key16: keys,
        exp: ks,
        ..
    } = &mut scratch.cols;
    let keys = &mut keys[..cw];
    keys.fill(0);
    for i in rows.clone() {
        column_abs_max_bits(run(i), cfg.rule.nan_rule(), keys);
    }
    for ((c, e), &key) in col_code.iter_mut().zip(ks.iter_mut()).zip(keys.iter()) {
        *c = cfg.code(column_key(bits, key));
        // The multiplier is 2^(127 - code) ([`multiplier`]).
        *e = multiplier_exp(*c);
    }
    let lanes = &mut scratch.lanes;
    if !lanes.set_for(cfg.level, bits, cfg.dtype.pow2_codec(), &ks[..cw]) {
        return false;
    }
    for i in rows {
        let out = &mut cd[i * k + c0..][..cw];
        // The level, the CPU and the lengths were checked above: the encoder takes every
        // row (a refusal would be a bug here, not a property of the input).
        let encoded = lanes.encode(cfg.level, run(i), cfg.plus_zero, out);
        assert!(
            encoded,
            "group_bits: the lane encoder refused a checked row"
        );
        if let Some((rd, rs)) = job.row.as_mut() {
            let out = &mut rd[i * k + c0..][..cw];
            row_run(
                cfg,
                layout,
                rstride,
                job.x,
                [k, i, c0],
                out,
                Some(rs),
                &mut scratch.span,
                None,
            );
        }
    }
    true
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

/// Where the E8M0 scale code of each value of a decoded run comes from (read by the
/// x86 decoder only).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum Codes<'a> {
    /// One code per 32-value block (rowwise).
    PerBlock(&'a [u8]),
    /// One code per value (columnwise: the code of each column's block).
    Each(&'a [u8]),
}

impl Codes<'_> {
    /// Whether these codes serve a run of `n` values: one per whole block, or one per
    /// value (what the x86 decoders check).
    #[inline(always)]
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn fit(self, n: usize) -> bool {
        match self {
            Codes::PerBlock(c) => c.len() * BLOCK == n,
            Codes::Each(c) => c.len() == n,
        }
    }
}

/// bf16 output of a run decoded in registers, where the CPU allows: at AVX-512 the f32
/// product narrowed by AVX-512 BF16 ([`crate::x86::decode_bf16`]), at AVX2 (one code per
/// block) the 16-bit lanes of [`pow2::decode_blocks`], which form no f32 and take every
/// run whose scales keep the products normal bf16 values. `false` (nothing written)
/// otherwise, and for other output types, leaving the run to the portable
/// decode-then-narrow loops. `js` is scratch for the blocks' exponents.
#[inline(always)]
fn decoded_bf16<T: Element>(
    level: Level,
    dtype: Mxfp8Dtype,
    q: &[u8],
    codes: Codes<'_>,
    out: &mut [T],
    js: &mut Vec<i32>,
) -> bool {
    let Some(o) = quant_core::dtype::bf16_slice_bits_mut(out) else {
        return false;
    };
    #[cfg(target_arch = "x86_64")]
    if crate::x86::decode_bf16(level, dtype, q, codes, o) {
        return true;
    }
    match codes {
        Codes::PerBlock(c) => {
            js.clear();
            // An E8M0 code is its scale's biased exponent (NaN, 255, is refused there).
            js.extend(c.iter().map(|&e| i32::from(e) - 127));
            pow2::decode_blocks(level, dtype.pow2_codec(), q, BLOCK, js, o)
        }
        // Columnwise rows at AVX2 take `ExactExps`, whole (`dequantize_columnwise`).
        Codes::Each(_) => false,
    }
}

/// Output of a run decoded in registers: at AVX2 ([`crate::decode_avx2::decode_run`]),
/// f32 and f16, and bf16 where the 16-bit lanes ([`decoded_bf16`], tried first: in
/// process they ran x1.00 rowwise and x1.09 columnwise against this decoder) decline;
/// at AVX-512, f16 ([`crate::x86::decode_f16`]; bf16 is [`decoded_bf16`]'s, and f32 is
/// decoded in place by loops the compiler vectorizes); `false` (nothing written)
/// elsewhere.
#[inline(always)]
fn decoded_in_registers<T: Element>(
    level: Level,
    dtype: Mxfp8Dtype,
    q: &[u8],
    codes: Codes<'_>,
    out: &mut [T],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::decode_avx2::decode_run(level, dtype, q, codes, out) {
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(quant_core::dtype::FloatsMut::F16(o)) = quant_core::dtype::FloatsMut::of(out) {
        return crate::x86::decode_f16(level, dtype, q, codes, o);
    }
    let _ = (level, dtype, q, codes, out);
    false
}

/// Values per step of rowwise dequantization (sixteen blocks).
const SPAN: usize = 16 * BLOCK;

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
    let level = simd::level();
    let rows_per_task = (SLAB * 2048 / k.max(1)).max(1);
    out.par_chunks_mut(rows_per_task * k)
        .zip(q.par_chunks(rows_per_task * k))
        .enumerate()
        .for_each(|(t, (o, q))| {
            simd::dispatch(
                level,
                #[inline(always)]
                || {
                    // Spans of sixteen blocks: the narrowing to 16-bit output runs once
                    // per span (one call, not one per block), f32 output is decoded in
                    // place.
                    let (mut w, mut js) = ([0f32; SPAN], Vec::new());
                    for (r, (o, q)) in o.chunks_exact_mut(k).zip(q.chunks_exact(k)).enumerate() {
                        let i = t * rows_per_task + r;
                        for (si, (os, qs)) in o.chunks_mut(SPAN).zip(q.chunks(SPAN)).enumerate() {
                            let mut codes = [0u8; SPAN / BLOCK];
                            let codes = &mut codes[..qs.len() / BLOCK];
                            for (b, c) in codes.iter_mut().enumerate() {
                                let kb = si * (SPAN / BLOCK) + b;
                                *c = scales
                                    .get(rowwise_scale_index(layout, m, k, i, kb))
                                    .copied()
                                    .unwrap_or(0xFF);
                            }
                            let per_block = Codes::PerBlock(codes);
                            if decoded_bf16(level, dtype, qs, per_block, os, &mut js)
                                || decoded_in_registers(level, dtype, qs, per_block, os)
                            {
                                continue;
                            }
                            narrowed(os, &mut w[..qs.len()], |w| {
                                for ((wb, qb), &code) in w
                                    .chunks_exact_mut(BLOCK)
                                    .zip(qs.chunks_exact(BLOCK))
                                    .zip(codes.iter())
                                {
                                    decode_run(dtype, scale(code), qb, wb);
                                }
                            });
                        }
                    }
                },
            )
        });
}

/// `w[i] = s * decode(q[i])` (the dtype matched once, outside the loop).
#[inline(always)]
fn decode_run(dtype: Mxfp8Dtype, s: f32, q: &[u8], w: &mut [f32]) {
    match dtype {
        Mxfp8Dtype::E4M3 => {
            for (o, &b) in w.iter_mut().zip(q) {
                *o = s * e4m3::decode_fast(b);
            }
        }
        Mxfp8Dtype::E5M2 => {
            for (o, &b) in w.iter_mut().zip(q) {
                *o = s * e5m2::decode_fast(b);
            }
        }
    }
}

/// `w[j] = scale(s[j]) * decode(q[j])`, the E8M0 codes widened in the loop: a row of
/// `K` f32 multipliers (32 KiB at `K = 8192`) does not stay in L1 beside the streams,
/// their codes do.
#[inline(always)]
fn decode_cols(dtype: Mxfp8Dtype, s: &[u8], q: &[u8], w: &mut [f32]) {
    match dtype {
        Mxfp8Dtype::E4M3 => {
            for ((o, &b), &s) in w.iter_mut().zip(q).zip(s) {
                *o = scale(s) * e4m3::decode_fast(b);
            }
        }
        Mxfp8Dtype::E5M2 => {
            for ((o, &b), &s) in w.iter_mut().zip(q).zip(s) {
                *o = scale(s) * e5m2::decode_fast(b);
            }
        }
    }
}

/// Columnwise dequantization: each 32-row group (one task) gathers its `K` scale codes
/// once, into a per-worker row, then walks its rows whole, so input and
/// output are one contiguous stream per group. (Walking the group in 2048-column chunks
/// row by row, as before, restarted the hardware prefetchers on every 2-4 KiB run and
/// took twice the rowwise time; f32 output is now decoded in place, as rowwise is.)
pub(crate) fn dequantize_columnwise<T: Element>(
    dtype: Mxfp8Dtype,
    layout: ScaleLayout,
    m: usize,
    k: usize,
    q: &[u8],
    scales: &[u8],
    out: &mut [T],
) {
    let level = simd::level();
    out.par_chunks_mut(BLOCK * k)
        .zip(q.par_chunks(BLOCK * k))
        .enumerate()
        .for_each_init(
            || vec![0u8; k],
            |s, (mb, (o, q))| {
                simd::dispatch(
                    level,
                    #[inline(always)]
                    || {
                        for (j, s) in s.iter_mut().enumerate() {
                            *s = scales
                                .get(columnwise_scale_index(layout, m, k, mb, j))
                                .copied()
                                .unwrap_or(0xFF);
                        }
                        let (mut w, mut js) = ([0f32; SPAN], Vec::new());
                        // At AVX2, bf16 rows in 16-bit lanes, whole, the codes (E8M0: the
                        // scales' exponents) checked once for the group's 32 rows.
                        let lanes = (level == Level::Avx2 && T::DTYPE == DType::BF16)
                            .then(|| pow2::ExactExps::new(dtype.pow2_codec(), s))
                            .flatten();
                        for (o, q) in o.chunks_exact_mut(k).zip(q.chunks_exact(k)) {
                            // Ordinary stores: each task writes whole rows in sequence.
                            if lanes.is_some_and(|l| l.decode(level, q, o, StoreMode::Cached)) {
                                continue;
                            }
                            for ((os, qs), ss) in
                                o.chunks_mut(SPAN).zip(q.chunks(SPAN)).zip(s.chunks(SPAN))
                            {
                                let codes = Codes::Each(ss);
                                if !decoded_bf16(level, dtype, qs, codes, os, &mut js)
                                    && !decoded_in_registers(level, dtype, qs, codes, os)
                                {
                                    narrowed(os, &mut w[..qs.len()], |w| {
                                        decode_cols(dtype, ss, qs, w)
                                    });
                                }
                            }
                        }
                    },
                )
            },
        );
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use half::bf16;

    use super::*;

    thread_local! {
        /// A chunk width that overrides [`chunk_width`]'s on this thread.
        pub(super) static TEST_CHUNK: Cell<Option<usize>> = const { Cell::new(None) };
    }

    /// `f()` with chunks of at most `chunk` columns.
    pub(super) fn with_chunk<R>(chunk: usize, f: impl FnOnce() -> R) -> R {
        TEST_CHUNK.set(Some(chunk));
        let r = f();
        TEST_CHUNK.set(None);
        r
    }

    /// Input whose columns span 2^-140 .. 2^20 (tiny column blocks send bf16 chunks down
    /// the f32 route), with zeros, a negative zero, NaN and inf.
    fn input(m: usize, k: usize) -> Vec<f32> {
        let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (m * 131 + k) as u64;
        let mut v: Vec<f32> = (0..m * k)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let unit = (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                let e = ((i % k) * 37 % 160) as i32 - 140;
                unit * 2f32.powi(e)
            })
            .collect();
        for (i, s) in [
            (3, 0.0),
            (k + 5, -0.0),
            (2 * k + 70, f32::NAN),
            (40, f32::INFINITY),
        ] {
            if let Some(x) = v.get_mut(i) {
                *x = s;
            }
        }
        v
    }

    /// Rowwise and columnwise bytes of one quantize.
    fn run<T: Element>(
        cfg: Cfg,
        two_d: bool,
        layout: ScaleLayout,
        xs: &[T],
        [m, k]: [usize; 2],
    ) -> [Vec<u8>; 4] {
        let [rr, rc] = rowwise_scale_shape(m, k);
        let [cr, cc] = columnwise_scale_shape(m, k);
        let (mut rd, mut rs) = (vec![0u8; m * k], vec![0u8; rr * rc]);
        let (mut cd, mut cs) = (vec![0u8; m * k], vec![0u8; cr * cc]);
        quantize(
            cfg,
            two_d,
            layout,
            xs,
            m,
            k,
            Some((&mut rd, &mut rs)),
            Some((&mut cd, &mut cs)),
        )
        .unwrap();
        [rd, rs, cd, cs]
    }

    /// Narrow chunks (and a ragged last one) write the same bytes as whole rows, for
    /// both input dtypes, both scale rules and layouts, 1-D and 2-D, at every level.
    /// (2-D bf16 takes [`two_d_rows`], whose spans the narrow chunk cuts to 1024
    /// columns: several spans per row, against one.)
    #[test]
    fn chunked_walk_writes_the_same_bytes_as_whole_rows() {
        for [m, k] in [[64, 4192], [96, 352]] {
            let f = input(m, k);
            let b: Vec<bf16> = f.iter().map(|&x| bf16::from_f32(x)).collect();
            for level in Level::ALL.into_iter().filter(|l| l.is_supported()) {
                for dtype in [Mxfp8Dtype::E4M3, Mxfp8Dtype::E5M2] {
                    for rule in [ScaleRule::Te, ScaleRule::Ocp] {
                        for layout in [ScaleLayout::Compact, ScaleLayout::Swizzled] {
                            for two_d in [false, true] {
                                let cfg = Cfg {
                                    level,
                                    dtype,
                                    rule,
                                    plus_zero: rule == ScaleRule::Te,
                                };
                                let what = format!(
                                    "[{m}, {k}] {level} {dtype:?} {rule:?} {layout:?} 2d={two_d}"
                                );
                                let whole = run(cfg, two_d, layout, &f, [m, k]);
                                let narrow = with_chunk(96, || run(cfg, two_d, layout, &f, [m, k]));
                                assert!(whole == narrow, "f32 {what}");
                                // Columnwise only from f32 (1-D: the narrow walk that
                                // fetches ahead) against whole rows.
                                let col = |xs: &[f32]| {
                                    let [cr, cc] = columnwise_scale_shape(m, k);
                                    let (mut cd, mut cs) = (vec![0u8; m * k], vec![0u8; cr * cc]);
                                    let out = Some((&mut cd[..], &mut cs[..]));
                                    quantize(cfg, two_d, layout, xs, m, k, None, out).unwrap();
                                    [cd, cs]
                                };
                                let ours = col(&f);
                                let whole = with_chunk(usize::MAX, || col(&f));
                                assert!(ours == whole, "f32 columnwise only {what}");
                                assert!(ours[0] == narrow[2] && ours[1] == narrow[3], "{what}");
                                let whole = run(cfg, two_d, layout, &b, [m, k]);
                                let narrow =
                                    with_chunk(1024, || run(cfg, two_d, layout, &b, [m, k]));
                                assert!(whole == narrow, "bf16 {what}");
                            }
                        }
                    }
                }
            }
        }
    }
}
