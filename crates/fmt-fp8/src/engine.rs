//! The slab engine: every FP8 quantization that needs more than one row at a time.
//!
//! A task owns a slab of up to 128 input rows and writes every output those rows touch:
//! its rows of `rowwise_data`, its column strip of the transposed `columnwise_data`
//! (`[K, M]`), and its scales. Three walks, by what the codes depend on:
//!
//! * **1x128, rowwise only** (`rowwise_1d`): each row is walked whole, sixteen blocks at
//!   a time, their amaxes taken together by [`quant_core::block_max::block_abs_max`].
//! * **128x128 tiles and per-tensor scaling** (`whole_rows`): a code does not depend on
//!   the direction, so the slab's rows are encoded whole (2-D tile maxima first, folded
//!   while the slab before encodes) and the columnwise output is their transpose, taken
//!   128 columns at a time in L1 (SSE2 16x16 blocks) and streamed into the strip.
//! * **1x128 with columnwise output** (`one_d_columnwise`): the 128x1 blocks need every
//!   column's maximum over the slab first, so the slab is walked in chunks of [`CHUNK`]
//!   columns, **row-major**, twice:
//!
//! ```text
//!            chunk c (512 columns)
//!   row 0    ──────────────►     pass 1: column maxima
//!   row 1    ──────────────►     pass 2: scale, encode -> rowwise row / codes buffer
//!   ...                          while chunk c - 1's codes are transposed into the
//!   row 127  ──────────────►     columnwise strip, 16 columns per few rows (`Pending`)
//! ```
//!
//!   The chunk (128 rows x 512 columns, at most 256 KiB of f32) stays in L2 between the
//!   two passes, so memory is read once; the next chunk is fetched into L2 during pass 2.
//!
//! bf16 and f16 input is not widened where the 16-bit routes apply: block and column
//! maxima are folded on the bits ([`block_abs_max_bits`], [`column_abs_max_bits`]), and
//! under power-of-two scales at AVX-512 the codes come from [`pow2`]'s encoders (one
//! exponent per block, tile or tensor, or per column through [`LaneExps`]).

use quant_core::Element;
use quant_core::block_max::{
    NanRule, block_abs_max, block_abs_max_bits, column_abs_max_bits, column_key,
};
use quant_core::codec::pow2::{self, LaneExps};
use quant_core::dtype::Bits16;
use quant_core::simd::{self, Level};
use quant_core::stream::{Fence, StoreMode, transpose_to_strip};
use quant_core::strips::Strip;

use crate::kernels::{
    Scales, WIDE, Wide, amax_cols, amax_encode_block, encode_f32, encode_scaled, pow2_exponent,
};
use crate::scale::Fp8Dtype;

/// Rows per slab: the block edge.
pub(crate) const SLAB: usize = 128;
/// Block edge of the scales (1x128, 128x128).
const BLOCK: usize = 128;
/// Columns per chunk (a multiple of [`BLOCK`]).
pub(crate) const CHUNK: usize = 512;
/// Rows ahead whose run of the chunk is prefetched.
const AHEAD: usize = 2;
/// The most blocks whose amaxes the rowwise-only 1x128 walk takes together (one
/// [`block_abs_max`] fold); [`SPAN_BYTES`] sets how many it takes.
const STEP: usize = 16;
/// Input bytes of one step of that walk: at most [`STEP`] blocks, 16 of bf16 but 8 of
/// f32. The step's maxima are one burst of loads and its encode a stretch of
/// compute with none; at 8 KiB per burst (16 blocks of f32) the input stream ran at
/// 6.4 GB/s on one Zen 4 core, at 4 KiB at 14.2 (in cache: 15.8).
const SPAN_BYTES: usize = 4096;
/// How many spans ahead the rowwise-only 1x128 walk prefetches its input, where
/// [`simd::prefetch_pays`] (two spans: 8 KiB of bf16).
const PREFETCH_SPANS: usize = 2;

/// Blocks per step of the rowwise-only walks: [`SPAN_BYTES`] of `T` input, at most
/// [`STEP`].
#[inline(always)]
fn span_blocks<T>() -> usize {
    (SPAN_BYTES / (BLOCK * std::mem::size_of::<T>())).clamp(1, STEP)
}

/// How a slab is scaled.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mode {
    /// One scale for the whole tensor (per-tensor current scaling).
    Tensor(f32),
    /// 1x128 rowwise blocks and 128x1 columnwise blocks, scales from `scale_of(amax)`.
    OneD,
    /// 128x128 tiles shared by both directions.
    TwoD,
}

/// Where one slab's rowwise scale_inv go.
pub(crate) enum RowScales<'a> {
    /// 1x128: column `i` of `[ceil(K/128), roundup(M,4)]` for slab row `i`.
    OneD(Strip<'a, f32>),
    /// 128x128: the slab's row of `[ceil(M/128), stride]`.
    TwoD(&'a mut [f32]),
}

/// Where one slab's columnwise scale_inv go.
pub(crate) enum ColScales<'a> {
    /// 1x128: the slab's row of `[ceil(M/128), roundup(K,4)]`.
    OneD(&'a mut [f32]),
    /// 128x128: the slab's column of `[ceil(K/128), stride]`.
    TwoD(Strip<'a, f32>),
}

/// One task: a slab of input rows and its pieces of every output.
pub(crate) struct SlabJob<'a, T> {
    pub x: &'a [T],
    /// The next slab's input (empty after the last), whose tile maxima the 128x128
    /// whole-row walk folds while it encodes this one; the 1x128 chunk walk fetches its
    /// first chunk.
    pub next: &'a [T],
    pub row: Option<&'a mut [u8]>,
    pub row_s: Option<RowScales<'a>>,
    pub col: Option<Strip<'a, u8>>,
    pub col_s: Option<ColScales<'a>>,
    /// How `col` is written: its rows are short runs a page apart, streamed when the
    /// operand is large ([`quant_core::stream::write_bytes`]), with one fence per slab.
    pub store: (StoreMode, Fence),
}

/// Per-worker scratch: a chunk of codes, a transposed block and the widening spans.
pub(crate) struct Scratch {
    codes: Vec<u8>,
    /// The 1x128 columnwise walk's codes of the chunk before, waiting to be transposed
    /// ([`Pending`]); swapped with `codes` chunk by chunk.
    waiting: Vec<u8>,
    tposed: Vec<u8>,
    wide: Box<Wide>,
    /// [`STEP`] blocks of one row, widened (the rowwise-only 1x128 walk).
    span: Vec<f32>,
    /// The slab's rowwise scales: scale_inv row-major (the rowwise-only 1x128 walk), or
    /// the tile (or tensor) scales of the whole-row walk.
    row_scales: Vec<f32>,
    /// A chunk's column exponents (1x128 columnwise blocks under power-of-two scales).
    lanes: LaneExps,
    /// The tile keys of the slab starting at this address, folded ahead by the 128x128
    /// whole-row walk of the slab before it.
    ahead: Option<(usize, Vec<u32>)>,
    /// A window of the slab's codes, rows [`CODES_PAD`] bytes apart past their length
    /// (the whole-row walk with columnwise output only, which transposes them from
    /// here).
    slab_codes: Vec<u8>,
}

impl Scratch {
    pub(crate) fn new() -> Scratch {
        Scratch {
            codes: Vec::new(),
            waiting: Vec::new(),
            tposed: vec![0; SLAB * BLOCK],
            wide: Box::new(WIDE),
            span: vec![0.0; STEP * BLOCK],
            row_scales: Vec::new(),
            lanes: LaneExps::new(),
            ahead: None,
            slab_codes: Vec::new(),
        }
    }
}

/// 1x128 blocks, rowwise output only: each row is walked whole, [`SPAN_BYTES`] of input
/// at a time. The span is widened once, the amaxes of its whole blocks come from one
/// [`block_abs_max`] fold (a ragged last block folds alone), then every block is
/// encoded with its scale. Nothing is shared between rows, so there is no chunk to
/// keep in L2 and no second pass. bf16 and f16 input at AVX-512 is not widened: its
/// maxima come from the bits, and under power-of-two scales its whole blocks are encoded
/// in 16-bit lanes ([`pow2::encode_blocks`]).
///
/// On CPUs where [`simd::prefetch_pays`] (Intel's), each span prefetches the input
/// [`PREFETCH_SPANS`] spans ahead; on Zen 4 those prefetches cost x0.69-0.79.
///
/// Same results as the 1x128 chunk walk's `amax_encode_block`: `block_abs_max` under
/// [`NanRule::Ignore`] is `fmaxf` folded from 0, and the encoder is the same.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rowwise_1d<T: Element>(
    level: Level,
    dt: Fp8Dtype,
    scale_of: impl Fn(f32) -> f32,
    k: usize,
    x: &[T],
    rd: &mut [u8],
    st: &mut Strip<'_, f32>,
    scratch: &mut Scratch,
) {
    let rows = x.len() / k;
    let nblk = k.div_ceil(BLOCK);
    let span = &mut scratch.span;
    // The scales are staged row-major and moved into the strip at the end. The strip's
    // rows lie `roundup(M, 4)` floats apart: storing each scale straight into its
    // column scattered one store per block over as many lines, row after row, and
    // that scatter (even into a small staging buffer in the same order) halved the
    // speed of the input stream at 8192x8192 on Zen 4, where sequential stores of a
    // few bytes per block cost nothing measurable.
    let staged = &mut scratch.row_scales;
    staged.resize(nblk * rows, 0.0);
    let step = span_blocks::<T>();
    let prefetch = simd::prefetch_pays();
    for (r, (xr, out)) in x.chunks_exact(k).zip(rd.chunks_exact_mut(k)).enumerate() {
        for (si, (xs, os)) in xr
            .chunks(step * BLOCK)
            .zip(out.chunks_mut(step * BLOCK))
            .enumerate()
        {
            if prefetch {
                // Into the next rows past this row's end; nothing past the slab's.
                let at = r * k + (si + PREFETCH_SPANS) * step * BLOCK;
                simd::prefetch(x.get(at..at + step * BLOCK).unwrap_or(&[]));
            }
            let whole = xs.len() / BLOCK;
            let mut keys = [0u32; STEP];
            let read = span_maxima(level, xs, span, &mut keys);
            let mut scales = [0f32; STEP];
            for (s, &key) in scales.iter_mut().zip(&keys) {
                *s = scale_of(f32::from_bits(key));
            }
            // Power-of-two scales (the default): the whole blocks in 16-bit lanes, on the
            // bf16 or f16 bits or on f32 narrowed to bf16 (rounding to odd, exact), read
            // as `span_maxima` read them.
            // Otherwise, and for a ragged last block, each value as f32: 16-bit input
            // through `encode_scaled` (below), f32 read in place.
            let fast = Pow2Plan::per_block(level, &scales[..whole])
                .is_some_and(|p| p.encode_read(level, dt, read, &mut os[..whole * BLOCK]));
            let done = if fast { whole * BLOCK } else { 0 };
            let blocks = os[done..].chunks_mut(BLOCK).zip(&scales[done / BLOCK..]);
            match read {
                // bf16 and f16 bits alike: `encode_scaled` reads them as bits (at AVX2
                // widened in the register; elsewhere bf16 by shifts, f16 into the scratch).
                SpanRead::Bits(_) => {
                    for ((o, &s), v) in blocks.zip(xs[done..].chunks(BLOCK)) {
                        encode_scaled(level, dt, v, Scales::One(s), o, &mut scratch.wide);
                    }
                }
                SpanRead::Wide(w) => {
                    for ((o, &s), v) in blocks.zip(w[done..].chunks(BLOCK)) {
                        encode_f32(dt, v, s, o);
                    }
                }
            }
            for (b, &s) in scales[..xs.len().div_ceil(BLOCK)].iter().enumerate() {
                staged[r * nblk + si * step + b] = 1.0 / s;
            }
        }
    }
    for b in 0..nblk {
        for (d, row) in st.row_mut(b)[..rows]
            .iter_mut()
            .zip(staged.chunks_exact(nblk))
        {
            *d = row[b];
        }
    }
}

/// How [`span_maxima`] read a span, which its encoder then reads the same way.
#[derive(Clone, Copy)]
enum SpanRead<'a> {
    /// bf16 or f16 at AVX-512 or AVX2, as bit patterns (nothing widened).
    Bits(Bits16<'a>),
    /// Widened into the caller's span (f32 input in place).
    Wide(&'a [f32]),
}

/// The amax keys (f32 magnitude bits, NaN ignored) of the 128-value blocks of `xs` (at
/// most [`STEP`] blocks, a ragged last one included) into `keys`. bf16 and f16 at
/// AVX-512 and AVX2 are read as bits; f32 is read in place. Returns the input as read.
#[inline(always)]
fn span_maxima<'a, T: Element>(
    level: Level,
    xs: &'a [T],
    span: &'a mut [f32],
    keys: &mut [u32; STEP],
) -> SpanRead<'a> {
    let whole = xs.len() / BLOCK;
    // The 16-bit block maxima and encoder: AVX-512 and AVX2.
    let bits = Bits16::of(xs).filter(|_| level != Level::Scalar);
    if let Some(b) = bits {
        let (head, tail) = (b.slice(..whole * BLOCK), b.slice(whole * BLOCK..));
        block_abs_max_bits(level, head, NanRule::Ignore, &mut keys[..whole]);
        if !tail.is_empty() {
            block_abs_max_bits(level, tail, NanRule::Ignore, &mut keys[whole..=whole]);
        }
        return SpanRead::Bits(b);
    }
    let w = quant_core::widened(xs, &mut span[..xs.len()]);
    block_abs_max(
        level,
        &w[..whole * BLOCK],
        NanRule::Ignore,
        &mut keys[..whole],
    );
    if !w.len().is_multiple_of(BLOCK) {
        keys[whole] = quant_core::cpu::amax_f32(&w[whole * BLOCK..]).to_bits();
    }
    SpanRead::Wide(w)
}

/// 128x128 tiles and per-tensor scaling: the codes do not depend on the direction (a
/// tile's scale serves both, as does the tensor's), so the slab is encoded row by row
/// and the columnwise output is the transpose of those codes.
///
/// 2-D tiles take two passes over the slab's whole rows. The first folds every tile's
/// amax (the rows' block maxima, [`span_maxima`], maxed down the tile; rows read front
/// to back); the second encodes each row under its tiles' scales, [`SPAN_BYTES`] of
/// input at a time (bf16 and f16 under power-of-two scales in 16-bit lanes), reading the
/// slab back from L2/L3 in row order. A walk in column chunks (128 rows x 512 columns,
/// 1 KiB pieces a row apart, or windows of 2-8 KiB per row) streamed at half the rate
/// or worse on Zen 4: at 8192 columns its rows are a page multiple apart and share a
/// few cache sets.
///
/// The first pass is the slab's only read from memory, and alone it stalls on it (a
/// third of a single-thread profile). So the second pass also folds the *next* slab's
/// tile maxima, a span after each span it encodes, and leaves them in `scratch` tagged
/// with that slab's address; when this worker takes that slab next (rayon hands a
/// worker consecutive slabs unless one is stolen), its first pass is already done and
/// its loads overlapped this slab's encoding (x1.12 bf16, x1.08 f32 at 8192^2 on two
/// Zen 4 cores). Same results either way: the same amaxes (a NaN-ignoring max in any
/// order), scales and encoders. A tensor scale needs neither pass: its encode is the
/// first read.
///
/// Columnwise output: the codes go to the rowwise output if there is one, else to a slab
/// buffer whose rows are [`CODES_PAD`] bytes longer than `k` (page-multiple rows would
/// put a 16x16 transpose block's 16 lines in one L1 set: x1.19 from the padding), and
/// 128-column tiles of them are transposed ([`transpose_to_strip`]) into the strip. Against
/// the chunked slab walk this replaced, on two Zen 4 cores at 8192^2: 128x128 columnwise
/// quantize x1.33 bf16, x1.25 f32, x1.17 f16; per-tensor x1.09 bf16, x1.26 f32.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn whole_rows<T: Element>(
    level: Level,
    dt: Fp8Dtype,
    mode: Mode,
    scale_of: impl Fn(f32) -> f32,
    k: usize,
    (x, next): (&[T], &[T]),
    row: Option<(&mut [u8], Option<&mut [f32]>)>,
    mut col: Option<ColOut<'_, '_>>,
    scratch: &mut Scratch,
) {
    let nblk = k.div_ceil(BLOCK);
    let rows = x.len() / k;
    let step = span_blocks::<T>();
    // Tile amax keys: each row's block maxima (as the 1x128 walk takes them), folded
    // over the rows. A max of keys is the max of the magnitudes. The previous slab of
    // this worker may have folded them already, while it encoded.
    let tile = match scratch.ahead.take() {
        _ if matches!(mode, Mode::Tensor(_)) => vec![0; nblk],
        Some((at, keys)) if at == x.as_ptr() as usize => keys,
        _ => {
            let mut tile = vec![0u32; nblk];
            for xr in x.chunks_exact(k) {
                fold_tile_keys(level, xr, step, &mut tile, &mut scratch.span);
            }
            tile
        }
    };
    let scales = &mut scratch.row_scales;
    scales.clear();
    match mode {
        Mode::Tensor(s) => scales.resize(nblk, s),
        _ => scales.extend(tile.iter().map(|&key| scale_of(f32::from_bits(key)))),
    }
    let (mut rd, rs) = match row {
        Some((rd, rs)) => (Some(rd), rs),
        None => (None, None),
    };
    for (d, s) in rs.into_iter().flatten().zip(scales.iter()) {
        *d = 1.0 / s;
    }
    // 2-D: the same tile scales down the slab's column of the columnwise scales.
    if let Some(((_, Some(cs)), _)) = col.as_mut() {
        for (b, s) in scales.iter().enumerate() {
            cs.row_mut(b)[0] = 1.0 / s;
        }
    }
    let wide = &mut *scratch.wide;
    // The next slab's keys, folded a span at a time between this slab's encodes: its
    // loads from memory then overlap the encoding instead of stalling a pass of their
    // own. Its rows are at most as many as this slab's (only the last slab is short).
    let mut ahead = tile;
    ahead.fill(0);
    // Windows of whole rows up to WINDOW columns: a columnwise-only slab's codes wait
    // for their transpose in a scratch buffer of one window.
    for w0 in (0..k).step_by(WINDOW) {
        let ww = WINDOW.min(k - w0);
        // The window's codes: in the rowwise output, or (columnwise only) in the scratch.
        let (codes, pitch, base) = match rd.as_deref_mut() {
            Some(rd) => (rd, k, w0),
            None => {
                let pitch = ww + CODES_PAD;
                scratch.slab_codes.resize(rows * pitch, 0);
                (&mut scratch.slab_codes[..rows * pitch], pitch, 0)
            }
        };
        for r in 0..rows {
            let xr = &x[r * k + w0..r * k + w0 + ww];
            let out = &mut codes[r * pitch + base..r * pitch + base + ww];
            let nr = next
                .get(r * k + w0..r * k + w0 + ww)
                .filter(|_| matches!(mode, Mode::TwoD));
            for (si, ((xs, os), ss)) in xr
                .chunks(step * BLOCK)
                .zip(out.chunks_mut(step * BLOCK))
                .zip(scales[w0 / BLOCK..].chunks(step))
                .enumerate()
            {
                let whole = xs.len() / BLOCK;
                let fast = Pow2Plan::per_block(level, &ss[..whole]).is_some_and(|p| {
                    p.encode(level, dt, &xs[..whole * BLOCK], &mut os[..whole * BLOCK])
                });
                let done = if fast { whole * BLOCK } else { 0 };
                for ((o, b), &s) in os[done..]
                    .chunks_mut(BLOCK)
                    .zip(xs[done..].chunks(BLOCK))
                    .zip(&ss[done / BLOCK..])
                {
                    encode_scaled(level, dt, b, Scales::One(s), o, wide);
                }
                if let Some(nr) = nr {
                    let c0 = si * step * BLOCK;
                    let kb = w0 / BLOCK + si * step;
                    let keys = &mut ahead[kb..(kb + step).min(nblk)];
                    fold_tile_keys(level, &nr[c0..c0 + xs.len()], step, keys, &mut scratch.span);
                }
            }
        }
        // Columnwise: the window's codes transposed, a 128-column tile at a time.
        if let Some(((strip, _), (store, fence))) = col.as_mut() {
            for j in (0..ww).step_by(BLOCK) {
                let (how, out) = ((level, *store, *fence), (&mut **strip, w0 + j));
                let block = (&codes[base + j..], pitch, rows, BLOCK.min(ww - j));
                transpose_to_strip(how, block, out, &mut scratch.tposed);
            }
        }
    }
    if !next.is_empty() && matches!(mode, Mode::TwoD) {
        scratch.ahead = Some((next.as_ptr() as usize, ahead));
    }
}

/// Columns per window of [`whole_rows`] (a multiple of every span): whole rows up to
/// here, so a columnwise-only slab's code buffer stays at most 2 MiB however wide the
/// tensor. Unit tests take narrow windows, to cross several on small tensors.
const WINDOW: usize = if cfg!(test) { 2048 } else { 16384 };

/// Padding of each row of the slab codes scratch.
const CODES_PAD: usize = 64;

/// The columnwise outputs of one slab of [`whole_rows`]: its strip of the transposed
/// codes, its column of the tile scales (none under a tensor scale), and how the codes
/// are stored.
type ColOut<'s, 'a> = (
    (&'s mut Strip<'a, u8>, Option<&'s mut Strip<'a, f32>>),
    (StoreMode, &'s Fence),
);

/// Folds one row's (or one span's) block maxima into the tile keys `acc`, a span of
/// [`span_blocks`] blocks at a time.
#[inline(always)]
fn fold_tile_keys<T: Element>(
    level: Level,
    xr: &[T],
    step: usize,
    acc: &mut [u32],
    span: &mut [f32],
) {
    for (xs, acc) in xr.chunks(step * BLOCK).zip(acc.chunks_mut(step)) {
        let mut keys = [0u32; STEP];
        span_maxima(level, xs, span, &mut keys);
        for (a, &key) in acc.iter_mut().zip(&keys) {
            *a = (*a).max(key);
        }
    }
}

/// The 16-bit route of an encode ([`pow2::encode_blocks`], and for f32 input
/// [`pow2::encode_blocks_f32`]): the exponents of its power-of-two scales, one per
/// 128-value block (1x128 rows, 2-D tiles, or a tensor scale repeated). `None` where a
/// scale is not a power of two.
struct Pow2Plan {
    ks: [i32; STEP],
    blocks: usize,
}

impl Pow2Plan {
    /// One exponent per 128-value block (at most [`STEP`] blocks); `None` unless at
    /// AVX-512 or AVX2 (where the encoders have kernels) every scale is a power of two.
    #[inline(always)]
    fn per_block(level: Level, scales: &[f32]) -> Option<Self> {
        if level == Level::Scalar {
            return None;
        }
        let mut ks = [0i32; STEP];
        // A fold, not `all`: no early exit, so it vectorizes.
        let pow2 = scales.iter().zip(&mut ks).fold(true, |ok, (&s, k)| {
            *k = pow2_exponent(s);
            ok & (*k != i32::MIN)
        });
        pow2.then_some(Self {
            ks,
            blocks: scales.len(),
        })
    }

    /// Encodes the whole blocks of one row's span; `false` (nothing written) unless the
    /// encoder of `xr`'s dtype takes every exponent: bf16 and f16 on their bits, f32
    /// through [`pow2::encode_blocks_f32`] (narrowed to bf16 by rounding to odd, exact).
    #[inline(always)]
    fn encode<T: Element>(&self, level: Level, dt: Fp8Dtype, xr: &[T], out: &mut [u8]) -> bool {
        let (fp8, ks) = (dt.pow2_codec(), &self.ks[..self.blocks]);
        match Bits16::of(xr) {
            Some(bits) => pow2::encode_blocks(level, fp8, bits, BLOCK, ks, false, out),
            None => quant_core::dtype::f32_slice(xr)
                .is_some_and(|xs| pow2::encode_blocks_f32(level, fp8, xs, BLOCK, ks, false, out)),
        }
    }
}

impl Pow2Plan {
    /// [`Pow2Plan::encode`] of the whole blocks (`out.len()` values) of a span as
    /// [`span_maxima`] read it: the bits, or the widened values (f32 in place; any
    /// widened 16-bit input widened exactly, so the f32 encoder gives its codes).
    #[inline(always)]
    fn encode_read(&self, level: Level, dt: Fp8Dtype, read: SpanRead<'_>, out: &mut [u8]) -> bool {
        let (fp8, ks, n) = (dt.pow2_codec(), &self.ks[..self.blocks], out.len());
        match read {
            SpanRead::Bits(b) => {
                pow2::encode_blocks(level, fp8, b.slice(..n), BLOCK, ks, false, out)
            }
            SpanRead::Wide(w) => {
                pow2::encode_blocks_f32(level, fp8, &w[..n], BLOCK, ks, false, out)
            }
        }
    }
}

/// One row's run of 1x128 blocks (whole blocks only) of bf16 or f16 input at AVX-512 in
/// 16-bit lanes: the block maxima on the bits ([`block_abs_max_bits`]), the scales
/// into `scales`, and the codes from [`pow2::encode_blocks`] when every scale is a power
/// of two the encoder takes. The same scales and codes as `amax_encode_block` (a
/// NaN-ignoring max from 0, the same encoder). `false`, with `out` untouched, where it
/// does not apply; the caller then takes the f32 route, which rewrites every scale.
#[inline(always)]
fn one_d_bits<T: Element>(
    level: Level,
    dt: Fp8Dtype,
    scale_of: impl Fn(f32) -> f32,
    xr: &[T],
    out: &mut [u8],
    scales: &mut [f32; CHUNK / BLOCK],
) -> bool {
    let Some(bits) = Bits16::of(xr) else {
        return false;
    };
    if level != Level::Avx512 || !bits.len().is_multiple_of(BLOCK) {
        return false;
    }
    let nb = bits.len() / BLOCK;
    let mut keys = [0u32; CHUNK / BLOCK];
    block_abs_max_bits(level, bits, NanRule::Ignore, &mut keys[..nb]);
    for (s, &key) in scales.iter_mut().zip(&keys[..nb]) {
        *s = scale_of(f32::from_bits(key));
    }
    Pow2Plan::per_block(level, &scales[..nb]).is_some_and(|p| p.encode(level, dt, xr, out))
}

/// Quantizes one slab (`k` columns). `scale_of(amax)` is the block scale rule.
#[inline(always)]
pub(crate) fn run_slab<T: Element>(
    level: Level,
    dt: Fp8Dtype,
    mode: Mode,
    scale_of: impl Fn(f32) -> f32,
    k: usize,
    job: &mut SlabJob<'_, T>,
    scratch: &mut Scratch,
) {
    if let (Mode::OneD, None, Some(rd), Some(RowScales::OneD(st))) =
        (mode, &job.col, job.row.as_deref_mut(), job.row_s.as_mut())
    {
        rowwise_1d(level, dt, scale_of, k, job.x, rd, st, scratch);
        return;
    }
    if let Mode::TwoD | Mode::Tensor(_) = mode {
        let row = match (job.row.as_deref_mut(), job.row_s.as_mut(), mode) {
            (Some(rd), Some(RowScales::TwoD(rs)), _) => Some((rd, Some(&mut **rs))),
            (Some(rd), None, Mode::Tensor(_)) => Some((rd, None)),
            _ => None,
        };
        // 2-D tiles write their scales down the columnwise strip; a tensor scale has none.
        let col = match (job.col.as_mut(), job.col_s.as_mut(), mode) {
            (Some(cd), Some(ColScales::TwoD(cs)), _) => Some((cd, Some(cs))),
            (Some(cd), None, Mode::Tensor(_)) => Some((cd, None)),
            _ => None,
        };
        let store = (job.store.0, &job.store.1);
        whole_rows(
            level,
            dt,
            mode,
            scale_of,
            k,
            (job.x, job.next),
            row,
            col.map(|c| (c, store)),
            scratch,
        );
        return;
    }
    one_d_columnwise(level, dt, scale_of, k, job, scratch);
}

/// 1x128 blocks with columnwise output (and rowwise output too under both usages): the
/// slab in chunks of [`CHUNK`] columns, each read twice. Pass 1 folds the chunk's column
/// maxima (its 128x1 blocks) over the slab's rows; pass 2 encodes each row's run of the
/// chunk (rowwise under its own 1x128 scales, columnwise under the column scales) into
/// the codes buffer. The columnwise codes are transposed into the strip 16 columns at a
/// time while the *next* chunk encodes ([`Pending`]), so that the streamed stores run
/// beside the encode's compute and loads; the last chunk's are stored after it.
#[inline(always)]
fn one_d_columnwise<T: Element>(
    level: Level,
    dt: Fp8Dtype,
    scale_of: impl Fn(f32) -> f32,
    k: usize,
    job: &mut SlabJob<'_, T>,
    scratch: &mut Scratch,
) {
    let x = job.x;
    let rows = x.len() / k;
    let wide = &mut *scratch.wide;
    let mut col_scale = [0f32; CHUNK];
    let mut col_key = [0u16; CHUNK];
    let mut row_scale = [[0f32; CHUNK / BLOCK]; SLAB];
    let how = (level, job.store.0, &job.store.1);
    let mut pending = Pending::default();
    // Sized here, not in `Scratch::new`: only this walk uses them, and the workers of
    // the other walks would zero them for nothing. One line more, to start on one.
    for buffer in [&mut scratch.codes, &mut scratch.waiting] {
        buffer.resize(SLAB * (CHUNK + CODES_PAD) + 64, 0);
    }
    for c0 in (0..k).step_by(CHUNK) {
        let cw = CHUNK.min(k - c0);
        let seg = |r: usize| &x[r * k + c0..r * k + c0 + cw];
        // Each row's run of the chunk is short (a few KiB) and starts a new stream, which
        // the hardware prefetchers pick up late: fetch the run two rows ahead ourselves.
        let prefetch = |r: usize| {
            if r + AHEAD < rows {
                quant_core::simd::prefetch(seg(r + AHEAD));
            }
        };
        let nb = cw.div_ceil(BLOCK);
        // Pass 1: the column maxima, read from memory.
        let scales = &mut col_scale[..cw];
        if let Some(bits) = Bits16::of(x) {
            // bf16 and f16: the column maxima on the bits, nothing widened.
            let keys = &mut col_key[..cw];
            keys.fill(0);
            for r in 0..rows {
                prefetch(r);
                let run = bits.slice(r * k + c0..r * k + c0 + cw);
                column_abs_max_bits(run, NanRule::Ignore, keys);
            }
            for (s, &key) in scales.iter_mut().zip(keys.iter()) {
                *s = scale_of(f32::from_bits(column_key(bits, key)));
            }
        } else {
            scales.fill(0.0);
            for r in 0..rows {
                prefetch(r);
                amax_cols(seg(r), scales, wide);
            }
            for a in scales.iter_mut() {
                *a = scale_of(*a);
            }
        }
        // Power-of-two column scales (the default): bf16 and f16 rows at AVX-512 and
        // AVX2 are encoded in 16-bit lanes, one exponent per column.
        let col_lanes = Bits16::of(x).is_some_and(|rows| {
            LaneExps::supports(level) && {
                let mut ks = [0i32; CHUNK];
                for (e, &s) in ks.iter_mut().zip(scales.iter()) {
                    *e = pow2_exponent(s);
                }
                scratch
                    .lanes
                    .set_for(level, rows, dt.pow2_codec(), &ks[..cw])
            }
        });
        // Pass 2: encode (the chunk is now in L2), each row's codes `pitch` apart.
        let pitch = cw + CODES_PAD;
        let codes = &mut on_line(&mut scratch.codes)[..rows * pitch];
        // While this chunk is encoded, the next one (of this slab, or the first of the
        // next slab, which rayon mostly hands to this same worker) is fetched, a row run
        // per encoded row. Pass 1 reads the chunk from memory and nothing after it does,
        // so without this the memory sat idle for the rest of the chunk (x1.12-1.13 on
        // the 1x128 and 128x128 columnwise quantizes, bf16 and f32). Into L2 only: the
        // chunk (128 runs a row apart, up to 256 KiB) cannot stay in L1, and fetched
        // there it evicted the lines being encoded and transposed (`prefetcht1` against
        // `prefetcht0`: 1x128 columnwise x1.20 from f32, x1.06 bf16, x1.04 f16, 3-4 A/B
        // pairs on a 2-vCPU Zen 4).
        let c1 = c0 + cw;
        let next = |r: usize| {
            if c1 < k {
                &x[r * k + c1..r * k + c1 + CHUNK.min(k - c1)]
            } else {
                job.next.get(r * k..r * k + CHUNK.min(k)).unwrap_or(&[])
            }
        };
        for r in 0..rows {
            quant_core::simd::prefetch_l2(next(r));
            if let Some(strip) = job.col.as_mut() {
                let waiting = (&*on_line(&mut scratch.waiting), &mut scratch.tposed[..]);
                pending.store_share(how, (r, rows), strip, waiting);
            }
            let xr = seg(r);
            if let Some(rd) = job.row.as_deref_mut() {
                let out = &mut rd[r * k + c0..r * k + c0 + cw];
                if !one_d_bits(level, dt, &scale_of, xr, out, &mut row_scale[r]) {
                    for ((o, b), s) in out
                        .chunks_mut(BLOCK)
                        .zip(xr.chunks(BLOCK))
                        .zip(row_scale[r].iter_mut())
                    {
                        *s = amax_encode_block(dt, b, o, &scale_of, wide);
                    }
                }
            }
            let cr = &mut codes[r * pitch..r * pitch + cw];
            let lanes = col_lanes
                && Bits16::of(xr).is_some_and(|b| scratch.lanes.encode(level, b, false, cr));
            if !lanes {
                encode_scaled(level, dt, xr, Scales::Each(&col_scale[..cw]), cr, wide);
            }
        }
        // Scales of this chunk.
        if let Some(RowScales::OneD(st)) = job.row_s.as_mut() {
            for b in 0..nb {
                for (d, s) in st
                    .row_mut(c0 / BLOCK + b)
                    .iter_mut()
                    .zip(&row_scale[..rows])
                {
                    *d = 1.0 / s[b];
                }
            }
        }
        if let Some(ColScales::OneD(cs)) = job.col_s.as_mut() {
            for (d, s) in cs[c0..c0 + cw].iter_mut().zip(&col_scale[..cw]) {
                *d = 1.0 / s;
            }
        }
        // This chunk's codes now wait for the next chunk's encode.
        if job.col.is_some() {
            std::mem::swap(&mut scratch.codes, &mut scratch.waiting);
            pending.wait((c0, cw, rows, pitch));
        }
    }
    if let Some(strip) = job.col.as_mut() {
        let waiting = (&*on_line(&mut scratch.waiting), &mut scratch.tposed[..]);
        pending.store_share(how, (0, 1), strip, waiting);
    }
}

/// `buffer` from its first 64-byte line on (so that every row of a chunk's codes,
/// `CHUNK + CODES_PAD` bytes apart, starts on a line).
fn on_line(buffer: &mut [u8]) -> &mut [u8] {
    let lead = buffer.as_ptr().align_offset(64).min(buffer.len());
    &mut buffer[lead..]
}

/// Which 1x128 chunk's columnwise codes wait in [`Scratch::waiting`] to be transposed
/// into the strip, and how many of its 16-column pieces are stored.
///
/// Stored in one burst after their own chunk's encode (as until the fifty-eighth
/// session), the streamed stores ran with nothing beside them: the 8192x8192 bf16
/// columnwise quantize took 10.9 ms, 9.5 ms with the transposes but not their stores,
/// 7.7 ms with neither. Spread over the next chunk's rows, they drain while it encodes
/// (x1.10-1.11 in the CLI, with the padded code rows).
#[derive(Default)]
struct Pending {
    /// The chunk's first column, width and rows (`rows x cw` codes, row-major, rows
    /// `pitch` bytes apart, as the walk wrote them); `cw == 0` when nothing waits.
    c0: usize,
    cw: usize,
    rows: usize,
    pitch: usize,
    /// Pieces of 16 columns already stored.
    done: usize,
}

impl Pending {
    /// The chunk just swapped into the waiting buffer (`c0, cw, rows, pitch`) now waits;
    /// the one before is stored by then.
    fn wait(&mut self, (c0, cw, rows, pitch): (usize, usize, usize, usize)) {
        debug_assert!(self.done * 16 >= self.cw, "a waiting chunk was not stored");
        *self = Pending {
            c0,
            cw,
            rows,
            pitch,
            done: 0,
        };
    }

    /// Stores the pieces due by step `step` of `steps` (all of them at the last step):
    /// pieces up to `(step + 1) * pieces / steps`, piece `p` transposed from columns
    /// `16p..` of `codes` into rows `c0 + 16p ..` of `strip` (through `tposed` where the
    /// registers do not take it).
    #[inline(always)]
    fn store_share(
        &mut self,
        how: (Level, StoreMode, &Fence),
        (step, steps): (usize, usize),
        strip: &mut Strip<'_, u8>,
        (codes, tposed): (&[u8], &mut [u8]),
    ) {
        let pieces = self.cw.div_ceil(16);
        let due = (step + 1) * pieces / steps;
        while self.done < due {
            let j = 16 * self.done;
            let w = 16.min(self.cw - j);
            let block = (&codes[j..], self.pitch, self.rows, w);
            transpose_to_strip(how, block, (strip, self.c0 + j), tposed);
            self.done += 1;
        }
    }
}

/// Quantizes `xs` (`[m, k]`, both nonzero) into the given outputs, in parallel over
/// slabs. Scale buffers come with their padded row width (`stride`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<T: Element>(
    dt: Fp8Dtype,
    mode: Mode,
    scale_of: impl Fn(f32) -> f32 + Sync,
    xs: &[T],
    m: usize,
    k: usize,
    row: Option<&mut [u8]>,
    row_s: Option<(&mut [f32], usize)>,
    col: Option<&mut [u8]>,
    col_s: Option<(&mut [f32], usize)>,
) -> quant_core::Result<()> {
    use quant_core::simd;
    use quant_core::strips::column_strips;
    use rayon::prelude::*;

    let slabs = m.div_ceil(SLAB);
    fn nones<X>(n: usize) -> Vec<Option<X>> {
        (0..n).map(|_| None).collect()
    }
    let row: Vec<Option<&mut [u8]>> = match row {
        Some(r) => r.chunks_mut(SLAB * k).map(Some).collect(),
        None => nones(slabs),
    };
    let row_s: Vec<Option<RowScales<'_>>> = match (row_s, mode) {
        (Some((s, stride)), Mode::OneD) => column_strips(s, stride, SLAB)?
            .map(|st| Some(RowScales::OneD(st)))
            .collect(),
        (Some((s, stride)), Mode::TwoD) => s
            .chunks_mut(stride)
            .map(|c| Some(RowScales::TwoD(c)))
            .collect(),
        _ => nones(slabs),
    };
    let store = StoreMode::for_output_bytes(col.as_deref().map_or(0, <[u8]>::len));
    let col: Vec<Option<Strip<'_, u8>>> = match col {
        Some(c) => column_strips(c, m, SLAB)?.map(Some).collect(),
        None => nones(slabs),
    };
    let col_s: Vec<Option<ColScales<'_>>> = match (col_s, mode) {
        (Some((s, stride)), Mode::OneD) => s
            .chunks_mut(stride)
            .map(|c| Some(ColScales::OneD(c)))
            .collect(),
        (Some((s, stride)), Mode::TwoD) => column_strips(s, stride, 1)?
            .map(|st| Some(ColScales::TwoD(st)))
            .collect(),
        _ => nones(slabs),
    };
    let nexts = xs.chunks(SLAB * k).skip(1).chain(std::iter::once(&xs[..0]));
    let jobs: Vec<SlabJob<'_, T>> = xs
        .chunks(SLAB * k)
        .zip(nexts)
        .zip(row)
        .zip(row_s)
        .zip(col)
        .zip(col_s)
        .map(|(((((x, next), row), row_s), col), col_s)| SlabJob {
            x,
            next,
            row,
            row_s,
            col,
            col_s,
            store: (store, Fence::new()),
        })
        .collect();
    let level = simd::level();
    jobs.into_par_iter()
        .for_each_init(Scratch::new, |scratch, mut job| {
            simd::dispatch(
                level,
                #[inline(always)]
                || run_slab(level, dt, mode, &scale_of, k, &mut job, scratch),
            )
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The whole-row walk (128x128 tiles and per-tensor scaling, every usage) against a
    //! plain specification written here from the public scale rule and encoders, at
    //! every SIMD level: tile amax, `compute_scale_from_amax`, `encode(x * scale)`, the
    //! columnwise codes the transpose, `scale_inv = 1 / scale` (zero-padded layouts).
    //! Shapes cross [`WINDOW`] (2048 columns under test), end in ragged tiles and
    //! slabs, and the input carries NaN, infinities, zeros, subnormals and values past
    //! the FP8 range, with whole tiles of zeros and of NaN.
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use quant_core::simd;
    use quant_core::{DType, Element, HostTensor, Usage};
    use quantfmt_testkit::XorShift64;

    use crate::scale::{Fp8Dtype, amax_of, compute_scale_from_amax};
    use crate::{BlockScaling, Fp8BlockQuantizer, Fp8Quantizer};

    fn input(m: usize, k: usize, seed: u64) -> Vec<f32> {
        let mut rng = XorShift64::new(seed | 1);
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            f32::from_bits(1),
            1e30,
            -3e38,
            65504.0,
            1e-30,
        ];
        let mut v: Vec<f32> = (0..m * k)
            .map(|i| {
                let r = rng.next_u64();
                if i % 61 == 5 {
                    specials[(r % specials.len() as u64) as usize]
                } else {
                    // Magnitudes 1e-6 .. 1e4, and tiles orders of magnitude apart (maxima
                    // carried into the wrong tile show).
                    let tile = (i / k / 128 + 3 * (i % k / 128)) % 7;
                    let mag = 10f32.powi(((r >> 8) % 5) as i32 - 6 + tile as i32);
                    let sign = if r & 1 == 1 { -1.0 } else { 1.0 };
                    sign * mag * (1.0 + ((r >> 20) % 1024) as f32 / 1024.0)
                }
            })
            .collect();
        // A tile of zeros and one of NaN where the shape has room.
        for (tile, fill) in [(0usize, 0.0f32), (1, f32::NAN)] {
            for r in 0..m.min(128) {
                for c in (tile * 128..k.min((tile + 1) * 128)).filter(|_| m > 128 || k > 256) {
                    v[r * k + c] = fill;
                }
            }
        }
        v
    }

    struct Expected {
        row: Vec<u8>,
        col: Vec<u8>,
    }

    /// Codes under `scale(i, j)`, rowwise and transposed.
    fn codes(
        x: &[f32],
        m: usize,
        k: usize,
        dt: Fp8Dtype,
        scale: impl Fn(usize, usize) -> f32,
    ) -> Expected {
        let row: Vec<u8> = (0..m * k)
            .map(|e| dt.encode(x[e] * scale(e / k, e % k)))
            .collect();
        let col = (0..k * m).map(|e| row[(e % m) * k + e / m]).collect();
        Expected { row, col }
    }

    fn bytes_of(t: &dyn quant_core::Storage, name: &str) -> Vec<u8> {
        t.buffers()
            .iter()
            .find(|b| b.name() == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .bytes()
            .to_vec()
    }

    /// Buffer `name` of `t` equals `want`, or the first differing byte is named (not
    /// megabytes printed).
    fn same(what: &str, t: &dyn quant_core::Storage, name: &str, want: &[u8]) {
        let got = bytes_of(t, name);
        assert_eq!(got.len(), want.len(), "{what}: {name} length");
        if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
            panic!(
                "{what}: {name} byte {i} is {:#04x}, expected {:#04x}",
                got[i], want[i]
            );
        }
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|f| f.to_le_bytes()).collect()
    }

    /// The largest finite value of the input dtype: `value_for_inf` of the block scales.
    fn max_finite_of(dtype: DType) -> f32 {
        match dtype {
            DType::F32 => f32::MAX_FINITE,
            DType::BF16 => half::bf16::MAX_FINITE,
            _ => half::f16::MAX_FINITE,
        }
    }

    const SHAPES: [[usize; 2]; 5] = [[1, 1], [3, 300], [130, 4200], [257, 2304], [129, 6150]];

    /// `f(m, k, dtype, x, values of x)` for every shape of [`SHAPES`] and input dtype, the
    /// input drawn by [`input`] under `seed(m, k)`.
    fn each_input(
        seed: impl Fn(usize, usize) -> u64,
        mut f: impl FnMut(usize, usize, DType, &HostTensor<'_>, &[f32]),
    ) {
        for [m, k] in SHAPES {
            let base = input(m, k, seed(m, k));
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let x = HostTensor::f32(&base, &[m, k])
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                f(m, k, dtype, &x, &x.to_f32_vec());
            }
        }
    }

    #[test]
    fn two_d_tiles_equal_the_specification() {
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let mut checked = 0;
        each_input(
            |m, k| (m * 131 + k) as u64,
            |m, k, dtype, x, xf| {
                let max_finite = max_finite_of(dtype);
                for (dt, pow2) in [(Fp8Dtype::E4M3, true), (Fp8Dtype::E5M2, false)] {
                    let (mt, kt) = (m.div_ceil(128), k.div_ceil(128));
                    let tile_scale: Vec<f32> = (0..mt * kt)
                        .map(|t| {
                            let (ti, tj) = (t / kt, t % kt);
                            let tile: Vec<f32> = (ti * 128..m.min(ti * 128 + 128))
                                .flat_map(|i| &xf[i * k + tj * 128..i * k + k.min(tj * 128 + 128)])
                                .copied()
                                .collect();
                            let a = amax_of(&tile);
                            compute_scale_from_amax(a, dt.max(), pow2, 0.0, max_finite)
                        })
                        .collect();
                    let want = codes(xf, m, k, dt, |i, j| tile_scale[(i / 128) * kt + j / 128]);
                    let (rs_w, cs_w) = (kt.next_multiple_of(4), mt.next_multiple_of(4));
                    let mut rs = vec![0f32; mt * rs_w];
                    let mut cs = vec![0f32; kt * cs_w];
                    for ti in 0..mt {
                        for tj in 0..kt {
                            rs[ti * rs_w + tj] = 1.0 / tile_scale[ti * kt + tj];
                            cs[tj * cs_w + ti] = 1.0 / tile_scale[ti * kt + tj];
                        }
                    }
                    simd::for_each_supported_level(|level| {
                        // On one thread every slab folds the next one's maxima ahead.
                        for (usage, one_thread) in [
                            (Usage::ROWWISE, false),
                            (Usage::COLUMNWISE, false),
                            (Usage::BOTH, false),
                            (Usage::ROWWISE, true),
                            (Usage::COLUMNWISE, true),
                        ] {
                            let q = Fp8BlockQuantizer::new(BlockScaling::TwoD, usage)
                                .with_dtype(dt)
                                .with_pow2_scales(pow2);
                            let t = if one_thread {
                                one.install(|| q.quantize(x).unwrap())
                            } else {
                                q.quantize(x).unwrap()
                            };
                            let what = format!(
                                "[{m}, {k}] {dtype} {dt:?} {usage} at {level}, one thread: {one_thread}"
                            );
                            if usage.rowwise {
                                same(&what, &t, "rowwise_data", &want.row);
                                same(&what, &t, "rowwise_scale_inv", &f32_bytes(&rs));
                            }
                            if usage.columnwise {
                                same(&what, &t, "columnwise_data", &want.col);
                                same(&what, &t, "columnwise_scale_inv", &f32_bytes(&cs));
                            }
                            checked += 1;
                        }
                    });
                }
            },
        );
        assert!(checked >= SHAPES.len() * 3 * 2 * 5, "{checked}");
    }

    /// The rowwise-only 1x128 walk, prefetching and not ([`simd::prefetch_pays`] is the
    /// CPU's choice): `scale_inv` column `i` of `[ceil(K/128), roundup(M, 4)]` per row.
    #[test]
    fn one_d_rowwise_equals_the_specification_with_and_without_prefetch() {
        let mut checked = 0;
        each_input(
            |m, k| (m * 17 + k) as u64,
            |m, k, dtype, x, xf| {
                let max_finite = max_finite_of(dtype);
                for (dt, pow2) in [(Fp8Dtype::E4M3, true), (Fp8Dtype::E5M2, false)] {
                    let kt = k.div_ceil(128);
                    let scale: Vec<f32> = (0..m * kt)
                        .map(|b| {
                            let (i, j) = (b / kt, b % kt);
                            let a = amax_of(&xf[i * k + j * 128..i * k + k.min(j * 128 + 128)]);
                            compute_scale_from_amax(a, dt.max(), pow2, 0.0, max_finite)
                        })
                        .collect();
                    let want = codes(xf, m, k, dt, |i, j| scale[i * kt + j / 128]);
                    let sw = m.next_multiple_of(4);
                    let mut rs = vec![0f32; kt * sw];
                    for (b, s) in scale.iter().enumerate() {
                        rs[(b % kt) * sw + b / kt] = 1.0 / s;
                    }
                    simd::for_each_supported_level(|level| {
                        for pays in [false, true] {
                            let q = Fp8BlockQuantizer::new(BlockScaling::OneD, Usage::ROWWISE)
                                .with_dtype(dt)
                                .with_pow2_scales(pow2);
                            let t = simd::with_prefetch(pays, || q.quantize(x).unwrap());
                            let what =
                                format!("[{m}, {k}] {dtype} {dt:?} at {level}, prefetch: {pays}");
                            same(&what, &t, "rowwise_data", &want.row);
                            same(&what, &t, "rowwise_scale_inv", &f32_bytes(&rs));
                            checked += 1;
                        }
                    });
                }
            },
        );
        assert!(checked >= SHAPES.len() * 3 * 2 * 2, "{checked}");
    }

    #[test]
    fn tensor_scale_equals_the_specification() {
        let mut checked = 0;
        each_input(
            |m, k| (m * 7 + k) as u64,
            |m, k, dtype, x, xf| {
                for (dt, pow2) in [(Fp8Dtype::E4M3, false), (Fp8Dtype::E5M2, true)] {
                    let q = Fp8Quantizer::new(Usage::BOTH)
                        .with_dtype(dt)
                        .with_pow2_scales(pow2);
                    let scale = q.scale_from_amax(amax_of(xf));
                    let want = codes(xf, m, k, dt, |_, _| scale);
                    simd::for_each_supported_level(|level| {
                        for usage in [Usage::COLUMNWISE, Usage::BOTH] {
                            let q = Fp8Quantizer::new(usage)
                                .with_dtype(dt)
                                .with_pow2_scales(pow2);
                            let t = q.quantize(x).unwrap();
                            let what = format!("[{m}, {k}] {dtype} {dt:?} {usage} at {level}");
                            if usage.rowwise {
                                same(&what, &t, "rowwise_data", &want.row);
                            }
                            same(&what, &t, "columnwise_data", &want.col);
                            same(&what, &t, "scale_inv", &f32_bytes(&[1.0 / scale]));
                            checked += 1;
                        }
                    });
                }
            },
        );
        assert!(checked >= SHAPES.len() * 3 * 2 * 2, "{checked}");
    }
}
