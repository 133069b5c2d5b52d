//! The fast NVFP4 quantizer: both directions from one read of the input.
//!
//! A task owns a slab of up to 256 input rows (sixteen 16-row block rows) and writes every
//! output they touch: its rows of `rowwise_data` and their scales, and its 128-byte
//! column strip of the transposed `columnwise_data` (`[K, M/2]`) with the matching scale
//! columns. The slab is walked in chunks of [`CHUNK`] columns: each chunk is widened to
//! f32 once (256 x 256 x 4 = 256 KiB, L2-resident) and then
//!
//! ```text
//!   rowwise:    per row, 16 blocks of 16 -> amaxes -> scales (vector over blocks)
//!               -> codes -> nibble pairs along the row
//!   columnwise: per 16-row group (optionally Hadamard-rotated, y = bf16(v . R)),
//!               column amaxes (vector over columns) -> scales -> codes
//!               -> nibble pairs of row pairs -> [64 x 256] bytes -> transposed (SSE2)
//!               into the strip
//! ```
//!
//! Three recipes leave that walk: rowwise-only 1-D ([`rowwise_only`]) and 2-D
//! ([`rowwise_2d_only`]) output go row by row, and 2-D output with columnwise data
//! under one shared global amax and round to nearest ([`two_d_transposed`]) encodes the
//! rows once and transposes the codes, since a 16x16 tile's codes and scale are then
//! the same in both directions.
//!
//! Every value is computed by the same IEEE operations, in the same order, as the
//! scalar specification in [`crate::kernel`] (and `tests/simd_levels.rs` checks it at
//! every SIMD level): block amaxes with NaN-ignoring max (as 16-lane trees,
//! [`amax_f32`]: the value of the specification's sequential fold, since NaN is ignored
//! and max over the rest is associative), `S_enc`, `sdb`, the encode
//! multiplier, E2M1 rounding (nearest or stochastic with the Philox stream of
//! [`crate::sr`]), the Hadamard sums in index order, 4over6 candidates and tree sums.

use half::bf16;
use quant_core::block_max::{
    NanRule, block_abs_max, block_abs_max_bf16, block_abs_max_f16, column_abs_max_bits, column_key,
};
use quant_core::codec::{e2m1, e4m3};
use quant_core::cpu::{amax_f32, fmax_nan_loses, fold_abs_max};
use quant_core::dtype::{Bits16, bf16_bits, f32_from_bf16_bits};
use quant_core::simd::Level;
use quant_core::stream::{Fence, StoreMode, transpose_to_strip};
use quant_core::strips::{Strip, column_strips};
use quant_core::{DType, Element, Result, simd};
use rayon::prelude::*;

use crate::kernel::{Amax, four_over_six_candidates, tree_sum_16};
use crate::layout::{scale_index, scale_shape};
use crate::quantizer::FourOverSix;
use crate::rht::R;
use crate::scale::{self, BLOCK, RCP_6};
use crate::sr;
#[cfg(target_arch = "x86_64")]
use crate::x86_encode::Run;

/// Input rows per task: sixteen block rows; 128 bytes of every transposed output row.
///
/// The transposed rows are `M / 2` bytes apart, a page multiple at `M = 8192`, and a
/// streamed run costs about the same per row whatever its length up to a few lines: on
/// Zen 4, one thread writing 32 MiB at a 4 KiB pitch took 18 ms in 64-byte runs, 9.3
/// in 128-byte and 4.8 in 256-byte ones (at a 4160-byte pitch, 9.8 / 4.8 / 2.4). Against
/// 128-row slabs (64-byte runs), A/B x1.08-1.13 for the columnwise quantizes (1-D,
/// 2-D, stochastic rounding), rowwise and RHT within noise.
const SLAB: usize = 256;
/// Columns per chunk.
const CHUNK: usize = 256;
/// Blocks per chunk row.
const NB: usize = CHUNK / BLOCK;
/// Rows ahead whose run of the chunk is prefetched while widening.
const AHEAD: usize = 4;
/// Bytes of one 128x4 swizzle tile.
const TILE_BYTES: usize = 512;

/// Everything about the quantization except the data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params<'a> {
    /// The SIMD level every kernel of the call dispatches to ([`simd::level`] when the
    /// call began).
    pub level: Level,
    pub two_d: bool,
    pub e4m3_max: u16,
    pub four_over_six: Option<FourOverSix>,
    pub seed: Option<u64>,
    pub swizzled: bool,
    /// The columnwise operand is `RHT(x^T)` (bf16 input only).
    pub rht: bool,
    /// Global amax of the rowwise operand (per row when row-scaled).
    pub row_amax: Amax<'a>,
    /// Global amax of the columnwise operand (per column of `x` when row-scaled).
    pub col_amax: Amax<'a>,
}

/// Where one slab's columnwise scales go: a strip of the compact `[roundup(K,128),
/// stride]` matrix 16 wide, or of the swizzled tiles 2048 bytes wide.
struct ColOut<'a> {
    data: Strip<'a, u8>,
    scales: Strip<'a, u8>,
    /// How `data` is written: its rows are 128-byte runs a page apart, streamed when the
    /// operand is large ([`quant_core::stream::write_bytes`]), one fence per slab.
    store: (StoreMode, Fence),
}

struct Job<'a, T> {
    x: &'a [T],
    /// Row offset of the slab.
    i0: usize,
    row: Option<(&'a mut [u8], &'a mut [u8])>,
    /// The slab's rows of `amax_rowwise` when each row's amax is computed here
    /// ([`quantize`]'s `own_row_amax`).
    own_amax: Option<&'a mut [f32]>,
    col: Option<ColOut<'a>>,
}

/// Per-worker scratch.
struct Scratch {
    /// The widened chunk, `[SLAB][CHUNK]`.
    wide: Vec<f32>,
    /// Column codes of one 16-row group, `[16][CHUNK]`.
    codes: Vec<u8>,
    /// Nibble pairs of the slab's row pairs, `[SLAB/2][CHUNK]`.
    pairs: Vec<u8>,
    /// Transposed pairs, `[CHUNK][SLAB/2]`.
    tposed: Vec<u8>,
    /// The packed codes of a columnwise-only window of [`two_d_transposed`] (grown on
    /// first use, at most `SLAB * (WINDOW / 2 + CODES_PAD)` bytes).
    window_codes: Vec<u8>,
    /// The 16x16 tile scale codes of a slab in [`two_d_transposed`], `[block][group]`:
    /// a block column's codes are the scales of its 16 stored rows.
    tile_scales: Vec<[u8; SLAB / BLOCK]>,
    /// The per-block arrays of [`rowwise_span`].
    #[cfg(target_arch = "x86_64")]
    span: Box<SpanScratch>,
    /// The Philox words of one 16-row group of a columnwise chunk ([`group_words`]).
    words: Box<[[u32; CHUNK]; 4]>,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            wide: vec![0.0; SLAB * CHUNK],
            codes: vec![0; BLOCK * CHUNK],
            pairs: vec![0; SLAB / 2 * CHUNK],
            tposed: vec![0; SLAB / 2 * CHUNK],
            window_codes: Vec::new(),
            tile_scales: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            span: Box::new(SpanScratch {
                bits: [0; SPAN_NB],
                sdb: [0; SPAN_NB],
                enc: [0.0; SPAN_NB],
                rnd: [[0; BLOCK]; SPAN_NB],
            }),
            words: Box::new([[0; CHUNK]; 4]),
        }
    }
}

/// Quantizes `xs` (`[m, k]`, multiples of 16) into the requested directions.
///
/// `own_row_amax` (`[m]`, row-scaled rowwise-only 1-D output) makes the quantization
/// one pass: each row's amax is taken just before the row is quantized, while the row
/// is in L1/L2, and written there; `p.row_amax` is then not read. Otherwise every
/// global amax comes from `p` (a pass of [`amaxes`] before this one).
pub(crate) fn quantize<T: Element>(
    p: &Params<'_>,
    xs: &[T],
    m: usize,
    k: usize,
    row: Option<(&mut [u8], &mut [u8])>,
    own_row_amax: Option<&mut [f32]>,
    col: Option<(&mut [u8], &mut [u8])>,
) -> Result<()> {
    if m == 0 || k == 0 {
        return Ok(());
    }
    debug_assert!(
        own_row_amax.is_none()
            || (row.is_some() && col.is_none() && !p.two_d && p.four_over_six.is_none()),
        "own row amaxes are only computed on the rowwise-only 1-D path"
    );
    let slabs = m.div_ceil(SLAB);
    let [_, rstride] = scale_shape(m, k);
    let [crows, cstride] = scale_shape(k, m);
    let mut rows: Vec<Option<(&mut [u8], &mut [u8])>> = match row {
        Some((d, s)) => d
            .chunks_mut(SLAB * k / 2)
            .zip(s.chunks_mut(SLAB * rstride))
            .map(Some)
            .collect(),
        None => Vec::new(),
    };
    let mut cols: Vec<Option<ColOut<'_>>> = match col {
        Some((d, s)) => {
            let store = StoreMode::for_output_bytes(d.len());
            let scales: Vec<Strip<'_, u8>> = if p.swizzled {
                column_strips(s, cstride / 4 * TILE_BYTES, SLAB / BLOCK / 4 * TILE_BYTES)?.collect()
            } else {
                column_strips(s, cstride, SLAB / BLOCK)?.collect()
            };
            let _ = crows;
            column_strips(d, m / 2, SLAB / 2)?
                .collect::<Vec<_>>()
                .into_iter()
                .zip(scales)
                .map(|(data, scales)| {
                    let store = (store, Fence::new());
                    Some(ColOut {
                        data,
                        scales,
                        store,
                    })
                })
                .collect()
        }
        None => Vec::new(),
    };
    let mut own: Vec<Option<&mut [f32]>> = match own_row_amax {
        Some(a) => a.chunks_mut(SLAB).map(Some).collect(),
        None => Vec::new(),
    };
    rows.resize_with(slabs, || None);
    cols.resize_with(slabs, || None);
    own.resize_with(slabs, || None);
    let jobs: Vec<Job<'_, T>> = xs
        .chunks(SLAB * k)
        .zip(rows)
        .zip(cols)
        .zip(own)
        .enumerate()
        .map(|(s, (((x, row), col), own_amax))| Job {
            x,
            i0: s * SLAB,
            row,
            own_amax,
            col,
        })
        .collect();
    jobs.into_par_iter()
        .for_each_init(Scratch::new, |scratch, mut job| {
            simd::dispatch(
                p.level,
                #[inline(always)]
                || slab(p, k, rstride, &mut job, scratch),
            )
        });
    Ok(())
}

/// `S_enc` and `S_dec` of a global amax.
#[inline(always)]
fn global(amax: f32, e4m3_max: u16) -> (f32, f32) {
    let s_enc = scale::global_encode_scale(amax, e4m3_max);
    (s_enc, scale::global_decode_scale(s_enc))
}

/// Block scale codes and encode multipliers of a run of block amaxes (one global scale).
#[inline(always)]
fn block_scales(amax: &[f32], s_enc: f32, s_dec: f32, sdb: &mut [u8], enc: &mut [f32]) {
    let mult = s_enc * RCP_6;
    for ((&a, s), e) in amax.iter().zip(sdb.iter_mut()).zip(enc.iter_mut()) {
        *s = e4m3::encode((a * mult).min(f32::MAX));
        *e = (1.0 / (e4m3::decode_fast(*s) * s_dec)).min(f32::MAX);
    }
}

/// [`block_scales`] with one global scale per block (row-scaled columnwise).
#[inline(always)]
fn block_scales_each(amax: &[f32], s_enc: &[f32], s_dec: &[f32], sdb: &mut [u8], enc: &mut [f32]) {
    for ((((&a, &se), &sd), s), e) in amax
        .iter()
        .zip(s_enc)
        .zip(s_dec)
        .zip(sdb.iter_mut())
        .zip(enc.iter_mut())
    {
        *s = e4m3::encode((a * (se * RCP_6)).min(f32::MAX));
        *e = (1.0 / (e4m3::decode_fast(*s) * sd)).min(f32::MAX);
    }
}

/// The E2M1 code of [`sr::stochastic_round_e2m1`]`(v, r)`, computed directly.
///
/// Stochastic rounding lands exactly on the grid, so running the generic threshold
/// encoder on its result repeats work, and the rule's `floorf` is a library call where
/// SSE4.1 is missing. `t = a + u * step` is the same fp32 value as in the rule (`u *
/// step = r * (step / 256)`, exact either way); the rule then truncates `t` to the grid
/// below it (spacing 0.5 under 2, 1 under 4, 2 above), and on that grid the code of
/// `t >= 1` is its binary exponent and first mantissa bit, `(bits(t) >> 22) - 252`
/// (`[1, 2)`: 2..3, `[2, 4)`: 4..5, `[4, 8)`: 6..7), saturated at 7 (`fminf(q, 6)`,
/// also for `t = inf`). Below 1 the grid is `{0, 0.5}`: code `t >= 0.5`, which the `max`
/// supplies (the exponent formula is `<= 1` there). The sign is that of `v`, also on
/// zero (`copysignf`); a NaN `v` (the only source of a NaN `t`) gives `+6`, code 7, as
/// `fminf(NaN, 6)` with the `+` sign does. Every operation is lane-wise arithmetic or a
/// select, so loops over it vectorize.
#[inline(always)]
fn sr_code(v: f32, r: u32) -> u8 {
    let a = v.abs();
    let jitter = if a >= 4.0 {
        2.0 / 256.0
    } else if a >= 2.0 {
        1.0 / 256.0
    } else {
        0.5 / 256.0
    };
    let t = a + (r & 0xFF) as f32 * jitter;
    let code = ((t.to_bits() >> 22) as i32 - 252)
        .max(i32::from(t >= 0.5))
        .min(7) as u8;
    let sign = ((v.to_bits() >> 28) & 0x8) as u8;
    if v.is_nan() { 0x7 } else { code | sign }
}

/// Counters per [`philox_lanes`] call: the blocks of a chunk row (rowwise) or 16
/// columns (columnwise).
const LANES: usize = 16;

/// Philox4x32-10 of [`LANES`] counters at once (structure of arrays), the stream of
/// [`sr::block_bits`]: `ctr = [block[l], row_lo[l], row_hi[l], dir]`.
///
/// The state words live in u64 lanes whose low 32 bits are the word; the high bits are
/// left as whatever the last product or XOR put there, since nothing reads them: every
/// multiply masks its operand to 32 bits (so it is one widening `vpmuludq`, with no
/// narrowing and re-widening between rounds) and the result is truncated at the end.
#[inline(always)]
fn philox_lanes(
    block: &[u32; LANES],
    row_lo: &[u32; LANES],
    row_hi: &[u32; LANES],
    dir: u32,
    seed: u64,
) -> [[u32; LANES]; 4] {
    const M0: u64 = sr::M0 as u64;
    const M1: u64 = sr::M1 as u64;
    const LO: u64 = 0xFFFF_FFFF;
    let (mut k0, mut k1) = (seed as u32, (seed >> 32) as u32);
    // Plain loops, no `array::map` or `from_fn`: as calls (the default release profile
    // did not inline them) the state went through memory (SR columnwise quantize x1.3-1.5
    // slower than under thin LTO).
    let mut c = [[u64::from(dir); LANES]; 4];
    for l in 0..LANES {
        c[0][l] = u64::from(block[l]);
        c[1][l] = u64::from(row_lo[l]);
        c[2][l] = u64::from(row_hi[l]);
    }
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(sr::W0);
            k1 = k1.wrapping_add(sr::W1);
        }
        let (kk0, kk1) = (u64::from(k0), u64::from(k1));
        let mut n = [[0u64; LANES]; 4];
        for l in 0..LANES {
            let p0 = (c[0][l] & LO) * M0;
            let p1 = (c[2][l] & LO) * M1;
            n[0][l] = (p1 >> 32) ^ c[1][l] ^ kk0;
            n[1][l] = p1;
            n[2][l] = (p0 >> 32) ^ c[3][l] ^ kk1;
            n[3][l] = p0;
        }
        c = n;
    }
    let mut words = [[0u32; LANES]; 4];
    for (w, c) in words.iter_mut().zip(&c) {
        for (w, &c) in w.iter_mut().zip(c) {
            *w = c as u32;
        }
    }
    words
}

/// `out[j] = code(2j) | code(2j+1) << 4` for the codes of `v * enc` (one block): the
/// codes first, then packed, so both loops are straight-line lane-wise code.
#[inline(always)]
fn encode_pack_rn(v: &[f32], enc: f32, out: &mut [u8]) {
    let mut codes = [0u32; BLOCK];
    for (c, &x) in codes.iter_mut().zip(v) {
        *c = u32::from(e2m1::encode(x * enc));
    }
    pack_lanes(&codes, out);
}

/// Stochastic-rounding [`encode_pack_rn`] of one block; `r` holds its 16 random bytes
/// (element `e` takes byte `e`).
#[inline(always)]
fn encode_pack_sr(v: &[f32], enc: f32, r: &[u8; BLOCK], out: &mut [u8]) {
    let mut codes = [0u32; BLOCK];
    for ((c, &x), &rb) in codes.iter_mut().zip(v).zip(r) {
        *c = u32::from(sr_code(x * enc, u32::from(rb)));
    }
    pack_lanes(&codes, out);
}

/// [`e2m1::pack_slice`] of codes held in 32-bit lanes: each pair of lanes read as one
/// little-endian u64 `q = lo | hi << 32` packs to the low byte of `q | q >> 28`. Kept in
/// wide lanes, a block packs with a shift, an OR and one narrowing (`vpmovqb`); byte
/// codes took two narrowings, a byte shuffle and a shift (the port-5 bottleneck of the
/// encode loop).
#[inline(always)]
fn pack_lanes(codes: &[u32; BLOCK], out: &mut [u8]) {
    for (o, pair) in out.iter_mut().zip(codes.chunks_exact(2)) {
        let q = u64::from(pair[0]) | (u64::from(pair[1]) << 32);
        *o = (q | (q >> 28)) as u8;
    }
}

/// The random bytes of each block from [`philox_lanes`]'s words (`bits[w][b]`: word `w`
/// of block `b`): element `e` of a block takes byte `e % 4` of word `e / 4`, the layout
/// of [`sr::element_bits`], which is the little-endian bytes of the block's four words
/// in order. Materializing them lets the encoder load 16 bytes per block instead of
/// gathering a word per element. Writes the first `out.len()` (at most 16) blocks in
/// place (building an array and copying it was 6 % of the SR quantize profile).
#[inline(always)]
fn block_bytes(bits: &[[u32; LANES]; 4], out: &mut [[u8; BLOCK]]) {
    for (b, row) in out.iter_mut().take(LANES).enumerate() {
        for (o, w) in row.chunks_exact_mut(4).zip(bits) {
            o.copy_from_slice(&w[b].to_le_bytes());
        }
    }
}

/// The rowwise random bytes ([`block_bytes`]) of blocks `blocks[..out.len()]` (at most
/// 16) of row `row`. Sixteen at [`Level::Avx512`] or [`Level::Avx2`] go through
/// `philox_x86` or `philox_avx2`, which keep the words in registers from the rounds to
/// the stores: through [`philox_lanes`] and [`block_bytes`] LLVM spilled and copied
/// them a word at a time.
#[inline(always)]
fn row_bytes(level: Level, blocks: &[u32; LANES], row: u64, seed: u64, out: &mut [[u8; BLOCK]]) {
    #[cfg(target_arch = "x86_64")]
    if let Ok(all) = <&mut [[u8; BLOCK]; LANES]>::try_from(&mut *out) {
        let dir = sr::DIR_ROWWISE;
        let done = match level {
            Level::Avx512 => crate::philox_x86::block_bytes(blocks, row, dir, seed, all),
            Level::Avx2 => crate::philox_avx2::block_bytes16(blocks, row, dir, seed, all),
            Level::Scalar => false,
        };
        if done {
            return;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    let words = philox_lanes(
        blocks,
        &[row as u32; LANES],
        &[(row >> 32) as u32; LANES],
        sr::DIR_ROWWISE,
        seed,
    );
    block_bytes(&words, out);
}

/// The rowwise random bytes ([`block_bytes`]) of the consecutive blocks `kb0 ..
/// kb0 + out.len()` of row `row`: 32 blocks per call at [`Level::Avx512`]
/// (`philox_x86::block_bytes`, whose four interleaved chains of rounds ran x1.4
/// faster than two), the rest 16 at a time through [`row_bytes`].
#[inline(always)]
fn span_bytes(level: Level, kb0: usize, row: u64, seed: u64, out: &mut [[u8; BLOCK]]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 {
        let (whole, _) = out.as_chunks_mut::<{ 2 * LANES }>();
        for (g, r) in whole.iter_mut().enumerate() {
            let first = kb0 + g * 2 * LANES;
            let blocks: [u32; 2 * LANES] = std::array::from_fn(|b| (first + b) as u32);
            if !crate::philox_x86::block_bytes(&blocks, row, sr::DIR_ROWWISE, seed, r) {
                break;
            }
            done += 2 * LANES;
        }
    }
    for (g, r) in out[done..].chunks_mut(LANES).enumerate() {
        let first = kb0 + done + g * LANES;
        let blocks: [u32; LANES] = std::array::from_fn(|b| (first + b) as u32);
        row_bytes(level, &blocks, row, seed, r);
    }
}

/// One slab.
#[inline(always)]
fn slab<T: Element>(
    p: &Params<'_>,
    k: usize,
    rstride: usize,
    job: &mut Job<'_, T>,
    s: &mut Scratch,
) {
    let x = job.x;
    let rows = x.len() / k;
    let groups = rows / BLOCK;
    if let (None, false, None, Some((rd, rs))) =
        (&job.col, p.two_d, p.four_over_six, job.row.as_mut())
    {
        let own = job.own_amax.as_deref_mut();
        rowwise_only(p, k, rstride, job.i0, x, rd, rs, own, s);
        return;
    }
    if let (None, true, None, Some((rd, rs))) =
        (&job.col, p.two_d, p.four_over_six, job.row.as_mut())
    {
        rowwise_2d_only(p, k, rstride, job.i0, x, rd, rs, s);
        return;
    }
    if let Some(col) = job.col.as_mut().filter(|_| codes_shared(p)) {
        let row = job.row.as_mut().map(|(d, s)| (&mut **d, &mut **s));
        two_d_transposed(p, k, rstride, job.i0, x, row, col, s);
        return;
    }
    // The 1-D columnwise-only recipe on f32, bf16 or (at a vector level) f16: straight
    // from the input, nothing widened.
    let direct = job.row.is_none() && !p.two_d && !p.rht && p.four_over_six.is_none();
    let slab = Slab::of(x, p.level).filter(|_| direct);
    if let (Some(slab), Some(col)) = (slab, job.col.as_mut()) {
        for c0 in (0..k).step_by(CHUNK) {
            let cw = CHUNK.min(k - c0);
            // One call per variant, so that each inlined copy sees its variant as a
            // constant (one call with `slab` ran bf16 2-3 % slower).
            match slab {
                Slab::F32(w) => columnwise_chunk_direct(p, k, job.i0, c0, cw, Slab::F32(w), col, s),
                Slab::Bits(Bits16::Bf16(b)) => {
                    let slab = Slab::Bits(Bits16::Bf16(b));
                    columnwise_chunk_direct(p, k, job.i0, c0, cw, slab, col, s)
                }
                Slab::Bits(Bits16::F16(b)) => {
                    let slab = Slab::Bits(Bits16::F16(b));
                    columnwise_chunk_direct(p, k, job.i0, c0, cw, slab, col, s)
                }
            }
        }
        return;
    }
    let src = Src::of(p, x, k);
    // The widened chunk serves the rowwise direction, 2-D tiles and the columnwise
    // groups unless those are summed straight from the bits.
    let widen = job.row.is_some() || p.two_d || matches!(src, Src::Wide);
    for c0 in (0..k).step_by(CHUNK) {
        let cw = CHUNK.min(k - c0);
        let nb = cw / BLOCK;
        for r in (0..rows).filter(|_| widen) {
            // Each row's run of the chunk is short and starts a new stream, which the
            // hardware prefetchers pick up late: fetch the run a few rows ahead.
            if r + AHEAD < rows {
                let ra = r + AHEAD;
                simd::prefetch(&x[ra * k + c0..ra * k + c0 + cw]);
            }
            T::widen_slice(
                &x[r * k + c0..r * k + c0 + cw],
                &mut s.wide[r * CHUNK..r * CHUNK + cw],
            );
        }
        // 16x16 tile amaxes, shared by both directions in 2-D mode: [group][block].
        let mut tile_amax = [[0f32; NB]; SLAB / BLOCK];
        if p.two_d {
            for (g, ta) in tile_amax.iter_mut().enumerate().take(groups) {
                for r in 0..BLOCK {
                    let w = &s.wide[(g * BLOCK + r) * CHUNK..][..cw];
                    let mut bits = [0u32; NB];
                    block_abs_max(p.level, w, NanRule::Ignore, &mut bits[..nb]);
                    for (a, &b) in ta.iter_mut().zip(&bits) {
                        *a = fmax_nan_loses(*a, f32::from_bits(b));
                    }
                }
            }
        }
        if let Some((rd, rs)) = job.row.as_mut() {
            rowwise_chunk(
                p, k, rstride, job.i0, c0, cw, rows, &s.wide, &tile_amax, rd, rs,
            );
        }
        if let Some(col) = job.col.as_mut() {
            columnwise_chunk(p, job.i0, src, c0, cw, nb, rows, &tile_amax, col, s);
        }
    }
}

/// Rowwise quantization of one chunk of the slab (rows of the widened chunk in `wide`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rowwise_chunk(
    p: &Params<'_>,
    k: usize,
    rstride: usize,
    i0: usize,
    c0: usize,
    cw: usize,
    rows: usize,
    wide: &[f32],
    tile_amax: &[[f32; NB]; SLAB / BLOCK],
    rd: &mut [u8],
    rs: &mut [u8],
) {
    if let Some(mode) = p.four_over_six {
        four_over_six_rows(
            p, mode, k, rstride, i0, c0, cw, rows, wide, tile_amax, rd, rs,
        );
        return;
    }
    let kb0 = c0 / BLOCK;
    for r in 0..rows {
        let w = &wide[r * CHUNK..r * CHUNK + cw];
        let out = &mut rd[r * k / 2 + c0 / 2..r * k / 2 + (c0 + cw) / 2];
        let tile = p.two_d.then(|| &tile_amax[r / BLOCK]);
        let sdb = rowwise_run(p, i0 + r, row_global(p, i0 + r), kb0, w, &mut [], tile, out);
        put_row_scales(p, rs, rstride, r, kb0, &sdb[..cw / BLOCK]);
    }
}

/// Rowwise 1-D quantization of a slab with no other output (the common inference
/// case), row by row: each row's run of a chunk is read in place (f32, and 16-bit input where
/// a vector encoder takes its bits) or widened into an L1-resident `wide` (other
/// 16-bit input), instead of the whole chunk being widened into an L2-resident buffer
/// first and read back (a copy, even for f32, that was a fifth of the profile).
/// Where a vector encoder (AVX-512 or AVX2) takes the input, a row goes in 16 KiB spans
/// ([`rowwise_span`]), each fetching the next span (in the slab) a few lines per
/// encode step; otherwise in 256-value runs ([`rowwise_run`]), each prefetched a few
/// rows ahead. A span's block maxima are its only loads from memory and its encode
/// has none, so without the fetch the memory sat idle through the encode (A/B with it
/// x1.09 bf16, x1.08 f32). Prefetching a whole span in one burst before it was 5-20 %
/// slower, the burst stalling on the miss buffers; two spans ahead, x0.98-1.01.
///
/// With `own_amax` (row-scaled), each row's amax is taken first, from the row just
/// fetched (a row of at most a few tens of KiB stays in L1/L2 for the quantization
/// that follows), and stored there: one pass over memory instead of a separate amax
/// pass.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rowwise_only<T: Element>(
    p: &Params<'_>,
    k: usize,
    rstride: usize,
    i0: usize,
    x: &[T],
    rd: &mut [u8],
    rs: &mut [u8],
    mut own_amax: Option<&mut [f32]>,
    s: &mut Scratch,
) {
    for (r, (xr, or)) in x
        .chunks_exact(k)
        .zip(rd.chunks_exact_mut(k / 2))
        .enumerate()
    {
        let g = match own_amax.as_deref_mut() {
            Some(own) => {
                own[r] = quant_core::cpu::amax(xr);
                global(own[r], p.e4m3_max)
            }
            None => row_global(p, i0 + r),
        };
        let span = SPAN_BYTES / std::mem::size_of::<T>();
        for (c, (xs, os)) in xr.chunks(span).zip(or.chunks_mut(span / 2)).enumerate() {
            let kb0 = c * span / BLOCK;
            #[cfg(target_arch = "x86_64")]
            {
                // The next span in the slab (the next row's first after a row's last).
                let end = r * k + c * span + xs.len();
                let next = x.get(end..(end + span).min(x.len())).unwrap_or(&[]);
                let ahead = bytemuck::cast_slice(next);
                if rowwise_span(p, i0 + r, g, kb0, None, xs, ahead, os, &mut s.span) {
                    put_row_scales(p, rs, rstride, r, kb0, &s.span.sdb[..xs.len() / BLOCK]);
                    continue;
                }
            }
            for (cc, (xc, oc)) in xs.chunks(CHUNK).zip(os.chunks_mut(CHUNK / 2)).enumerate() {
                let ahead = (r + AHEAD) * k + c * span + cc * CHUNK;
                simd::prefetch(x.get(ahead..ahead + xc.len()).unwrap_or(&[]));
                let kb = kb0 + cc * NB;
                let sdb = rowwise_run(p, i0 + r, g, kb, xc, &mut s.wide[..CHUNK], None, oc);
                put_row_scales(p, rs, rstride, r, kb, &sdb[..xc.len() / BLOCK]);
            }
        }
    }
}

/// Input bytes per span of [`rowwise_span`]: half of a 32 KiB L1, so a span's
/// second and third reads hit it. In a sweep of span sizes (`benchmarks-history.md`),
/// 1-4 KiB spans of bf16 were 6-40 % slower, and 32 KiB ones no faster.
const SPAN_BYTES: usize = 16 * 1024;
/// Blocks of the longest span (16-bit input).
#[cfg(target_arch = "x86_64")]
const SPAN_NB: usize = SPAN_BYTES / 2 / BLOCK;

/// The per-block arrays of one [`rowwise_span`], kept in the worker's [`Scratch`]:
/// declared in the function they were zeroed on every call, 12.5 KiB per 16 KiB span
/// (`memset` was 3 % of the stochastic-rounding quantize profile).
#[cfg(target_arch = "x86_64")]
struct SpanScratch {
    /// Block maxima (f32 magnitude patterns).
    bits: [u32; SPAN_NB],
    /// Block scale codes (E4M3), the span's result.
    sdb: [u8; SPAN_NB],
    /// Per-block encode multipliers.
    enc: [f32; SPAN_NB],
    /// Per-block random bytes (stochastic rounding).
    rnd: [[u8; BLOCK]; SPAN_NB],
}

/// One span of row `i` of 1-D NVFP4 (blocks from `kb0`), in three batched steps: every
/// block maximum, every scale, then every code (the vector encoder, which also
/// prefetches `ahead`, the bytes of the next span, spread over its steps; reading the f32
/// values in place or bf16 as bits; under stochastic rounding with the random bytes of
/// every block drawn first, 16 blocks per [`philox_lanes`]). With `tiles` (2-D: one
/// tile amax per block of the span), those replace the block maxima. Returns `true`
/// with the span's scale codes in `sp.sdb`, or `false` (nothing written) where that
/// encoder does not take the span; the caller then runs [`rowwise_run`] chunk by chunk.
///
/// Per 256-value chunk, as `rowwise_run` walks, each step waits on the last: the block
/// maxima are stored and reloaded, the scales (a division per block) then wait on them,
/// and the encode on the scales. Batched over a span, each step is a long run of
/// independent vectors. A/B on 8192x8192 (Zen 4, 2 threads): x1.28 from bf16, x1.20
/// from f32; stochastic rounding x1.09 / x1.07; 2-D x1.22 / x1.05.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rowwise_span<T: Element>(
    p: &Params<'_>,
    i: usize,
    (se, sd): (f32, f32),
    kb0: usize,
    tiles: Option<&[f32]>,
    xs: &[T],
    ahead: &[u8],
    out: &mut [u8],
    sp: &mut SpanScratch,
) -> bool {
    if !span_encoder::<T>(p) {
        return false;
    }
    let nb = xs.len() / BLOCK;
    if nb > SPAN_NB
        || nb * BLOCK != xs.len()
        || out.len() * 2 != xs.len()
        || tiles.is_some_and(|t| t.len() != nb)
    {
        return false;
    }
    let SpanScratch {
        bits,
        sdb,
        enc,
        rnd,
    } = sp;
    let maxima = tiles.is_none();
    let run = if let Some(b) = encoder_bits(p, xs) {
        if maxima {
            b.block_abs_max(p.level, &mut bits[..nb]);
        }
        b.run()
    } else {
        let Some(w) = quant_core::dtype::f32_slice(xs) else {
            return false;
        };
        if maxima {
            block_abs_max(p.level, w, NanRule::Ignore, &mut bits[..nb]);
        }
        Run::F32(w)
    };
    // The maxima are f32 magnitude patterns: read them as f32 in place.
    let amax: &[f32] = match tiles {
        Some(t) => t,
        None => bytemuck::cast_slice(&bits[..nb]),
    };
    block_scales(amax, se, sd, &mut sdb[..nb], &mut enc[..nb]);
    match p.seed {
        None => encode_run_at(p.level, run, &enc[..nb], None, out, ahead),
        Some(seed) => {
            span_bytes(p.level, kb0, i as u64, seed, &mut rnd[..nb]);
            encode_run_at(p.level, run, &enc[..nb], Some(&rnd[..nb]), out, ahead)
        }
    }
}

/// Whether a vector encoder takes runs of `T` as they are: f32, bf16 or f16 input at
/// [`Level::Avx512`] ([`crate::x86_encode`]) or [`Level::Avx2`] ([`crate::x86_avx2`]).
/// [`rowwise_span`] runs only then (it also checks the lengths), and [`encoder_bits`]
/// reads 16-bit input as bits only then.
#[inline(always)]
fn span_encoder<T: Element>(p: &Params<'_>) -> bool {
    #[cfg(target_arch = "x86_64")]
    return matches!(T::DTYPE, DType::F32 | DType::BF16 | DType::F16)
        && match p.level {
            Level::Avx512 => crate::x86_encode::supported(),
            Level::Avx2 => Level::Avx2.is_supported(),
            Level::Scalar => false,
        };
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = p;
        false
    }
}

/// Columns of one span of [`encode_2d_rows`]: 16 rows of it (128-256 KiB) stay in L2
/// between the span's two passes.
const SPAN: usize = 16 * CHUNK;

/// Where [`encode_2d_rows`] puts a slab's packed codes: the byte of row `r`'s columns
/// `c, c + 1` (`c` even, in the window) is `buf[r * pitch + (c - origin) / 2]`.
struct Codes<'a> {
    buf: &'a mut [u8],
    pitch: usize,
    origin: usize,
}

/// 2-D rowwise quantization of a slab with no other output (2-D weights for inference):
/// [`encode_2d_rows`] over all its columns, straight into its rows of `rowwise_data`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rowwise_2d_only<T: Element>(
    p: &Params<'_>,
    k: usize,
    rstride: usize,
    i0: usize,
    x: &[T],
    rd: &mut [u8],
    rs: &mut [u8],
    s: &mut Scratch,
) {
    let out = Codes {
        buf: rd,
        pitch: k / 2,
        origin: 0,
    };
    encode_2d_rows(p, k, i0, x, 0..k, out, s, |r, kb0, sdb| {
        put_row_scales(p, rs, rstride, r, kb0, sdb)
    });
}

/// 2-D quantization of columns `cols` of a slab's rows (`x`, `[rows, k]`, whole 16-row
/// groups) into `out`, one 16-row group at a time, in spans of [`SPAN`] columns, each
/// read twice while it is in L2: first each row's block maxima folded over the group
/// into the span's 16x16 tile amaxes ([`span_tiles`]), then each row's span encoded
/// against its tiles, in one batch by [`rowwise_span`] where a vector encoder takes
/// it, else run by run by [`rowwise_run`]. `put(r, kb0, sdb)` receives row `r`'s scale
/// codes of blocks `kb0..` (every row of a group gets its tiles' codes). (The slab walk
/// instead widens 256-column runs of 256 rows, 512 bytes to 1 KiB a row apart, which
/// the prefetchers follow poorly.)
///
/// A tile's amax is the maximum over the same 256 magnitudes, NaN ignored, as in the
/// slab walk, and the same value whatever the order of the maxima.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn encode_2d_rows<T: Element>(
    p: &Params<'_>,
    k: usize,
    i0: usize,
    x: &[T],
    cols: std::ops::Range<usize>,
    out: Codes<'_>,
    s: &mut Scratch,
    mut put: impl FnMut(usize, usize, &[u8]),
) {
    let span = SPAN.min(cols.len());
    let byte = |r: usize, c: usize| r * out.pitch + (c - out.origin) / 2;
    for (g, xg) in x.chunks_exact(BLOCK * k).enumerate() {
        for c0 in cols.clone().step_by(span) {
            let cw = span.min(cols.end - c0);
            let mut tiles = [0u32; SPAN / BLOCK];
            let tiles = &mut tiles[..cw / BLOCK];
            let rows = |rr: usize| {
                // Where a vector encoder runs, the encode pass below fetched this
                // span; elsewhere, the span of a row a few rows ahead (into the next
                // group at the end of this one) is fetched while this row folds.
                if !span_encoder::<T>(p) {
                    let ahead = (g * BLOCK + rr + AHEAD) * k + c0;
                    simd::prefetch(x.get(ahead..ahead + cw).unwrap_or(&[]));
                }
                &xg[rr * k + c0..rr * k + c0 + cw]
            };
            span_tiles(p.level, rows, &mut s.wide[..CHUNK], tiles);
            for rr in 0..BLOCK {
                let r = g * BLOCK + rr;
                let xr = &xg[rr * k + c0..rr * k + c0 + cw];
                let or = &mut out.buf[byte(r, c0)..byte(r, c0 + cw)];
                let global = row_global(p, i0 + r);
                #[cfg(target_arch = "x86_64")]
                {
                    // The tile amaxes of this row's blocks (the span is in L2 from the
                    // tile pass), and this row of the next span (the next group's
                    // first after a group's last), fetched through the encode.
                    let amax: &[f32] = bytemuck::cast_slice(&*tiles);
                    let (nr, nc0) = match c0 + span < cols.end {
                        true => (g * BLOCK + rr, c0 + span),
                        false => ((g + 1) * BLOCK + rr, cols.start),
                    };
                    let at = nr * k + nc0;
                    let next = x.get(at..(at + span.min(cols.end - nc0)).min(x.len()));
                    let ahead = bytemuck::cast_slice(next.unwrap_or(&[]));
                    if rowwise_span(
                        p,
                        i0 + r,
                        global,
                        c0 / BLOCK,
                        Some(amax),
                        xr,
                        ahead,
                        or,
                        &mut s.span,
                    ) {
                        put(r, c0 / BLOCK, &s.span.sdb[..tiles.len()]);
                        continue;
                    }
                }
                for (c, (xs, os)) in xr.chunks(CHUNK).zip(or.chunks_mut(CHUNK / 2)).enumerate() {
                    let kb0 = (c0 + c * CHUNK) / BLOCK;
                    let nb = xs.len() / BLOCK;
                    let mut tile = [0f32; NB];
                    for (t, &b) in tile.iter_mut().zip(&tiles[c * NB..c * NB + nb]) {
                        *t = f32::from_bits(b);
                    }
                    let sdb = rowwise_run(p, i0 + r, global, kb0, xs, &mut s.wide, Some(&tile), os);
                    put(r, kb0, &sdb[..nb]);
                }
            }
        }
    }
}

/// Whether every columnwise code and scale equals the rowwise one of the same element
/// and tile, so that the columnwise data is the nibble transpose of the rowwise codes:
/// 16x16 tiles (the same tile amax both ways), one global amax shared by both
/// directions (not row-scaled, no RHT, no differing override), round to nearest (the
/// stochastic stream depends on the direction) and no 4over6 (its choice is per block
/// of the direction).
#[inline(always)]
fn codes_shared(p: &Params<'_>) -> bool {
    let same_global = match (p.row_amax, p.col_amax) {
        (Amax::Tensor(r), Amax::Tensor(c)) => r.to_bits() == c.to_bits(),
        _ => false,
    };
    p.two_d && !p.rht && p.seed.is_none() && p.four_over_six.is_none() && same_global
}

/// Columns per window of [`two_d_transposed`]: a columnwise-only window's codes, 256
/// rows of `WINDOW / 2` bytes, stay within 1 MiB (L2) however wide the tensor.
/// (Smaller under `cfg(test)`, so that the unit tests cross windows.)
const WINDOW: usize = if cfg!(test) { 1024 } else { 8192 };

/// Padding after each row of a window's codes: with a page-multiple row pitch, the 16
/// rows a 16x16 transpose block reads share one L1 set (the FP8 whole-row walk measured
/// x1.19 from the padding alone).
const CODES_PAD: usize = 64;

/// 2-D quantization with columnwise output where the codes do not depend on the
/// direction ([`codes_shared`]): the slab's rows are encoded whole by
/// [`encode_2d_rows`] (into `row`'s rowwise data, or into a padded per-worker buffer
/// when the output is columnwise only), window by window; then each [`CHUNK`] of
/// columns is regrouped into row-pair bytes ([`regroup_pairs`]) and transposed into
/// the slab's strip, its scales taken from the tiles'. The slab walk instead encoded
/// the columnwise operand a second time, from a widened copy of every chunk.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn two_d_transposed<T: Element>(
    p: &Params<'_>,
    k: usize,
    rstride: usize,
    i0: usize,
    x: &[T],
    row: Option<(&mut [u8], &mut [u8])>,
    col: &mut ColOut<'_>,
    s: &mut Scratch,
) {
    let rows = x.len() / k;
    let kb = k / BLOCK;
    let (mut rd, mut rs) = match row {
        Some((d, s)) => (Some(d), Some(s)),
        None => (None, None),
    };
    // Taken out of the scratch while `encode_2d_rows` borrows the rest of it.
    let mut tile_scales = std::mem::take(&mut s.tile_scales);
    let mut own = std::mem::take(&mut s.window_codes);
    tile_scales.resize(kb, [0; SLAB / BLOCK]);
    for w0 in (0..k).step_by(WINDOW) {
        let w1 = (w0 + WINDOW).min(k);
        let out = match rd.as_deref_mut() {
            Some(buf) => Codes {
                buf,
                pitch: k / 2,
                origin: 0,
            },
            None => {
                let pitch = (w1 - w0) / 2 + CODES_PAD;
                own.resize(own.len().max(rows * pitch), 0);
                Codes {
                    buf: &mut own,
                    pitch,
                    origin: w0,
                }
            }
        };
        let (pitch, origin) = (out.pitch, out.origin);
        encode_2d_rows(p, k, i0, x, w0..w1, out, s, |r, kb0, sdb| {
            if let Some(rs) = rs.as_deref_mut() {
                put_row_scales(p, rs, rstride, r, kb0, sdb);
            }
            // Every row of a group carries its tiles' codes: keep the first row's.
            if r % BLOCK == 0 {
                for (t, &code) in tile_scales[kb0..][..sdb.len()].iter_mut().zip(sdb) {
                    t[r / BLOCK] = code;
                }
            }
        });
        let codes: &[u8] = rd.as_deref().unwrap_or(&own);
        for c0 in (w0..w1).step_by(CHUNK) {
            let cw = CHUNK.min(w1 - c0);
            let at = |r: usize| &codes[r * pitch + (c0 - origin) / 2..][..cw / 2];
            for (q, dst) in s.pairs.chunks_exact_mut(CHUNK).take(rows / 2).enumerate() {
                regroup_pairs(at(2 * q), at(2 * q + 1), &mut dst[..cw]);
            }
            let mut scales = [[0u8; SLAB / BLOCK]; CHUNK];
            for (c, sc) in scales[..cw].iter_mut().enumerate() {
                *sc = tile_scales[(c0 + c) / BLOCK];
            }
            store_columnwise(p, c0, cw, rows, &scales, col, s);
        }
    }
    s.tile_scales = tile_scales;
    s.window_codes = own;
}

/// Two rows' packed codes (`a`, `b`: byte `j` holds columns `2j`, `2j + 1`) regrouped
/// into one byte per column, the columnwise byte of that column's row pair:
/// `out[2j] = lo(a[j]) | lo(b[j]) << 4`, `out[2j + 1] = hi(a[j]) | hi(b[j]) << 4`.
/// Computed as one 16-bit lane per input byte pair: masks and shifts, no byte shuffle.
#[inline(always)]
fn regroup_pairs(a: &[u8], b: &[u8], out: &mut [u8]) {
    for ((o, &a), &b) in out.chunks_exact_mut(2).zip(a).zip(b) {
        let (a, b) = (u16::from(a), u16::from(b));
        let w = (a & 0x0F) | ((b & 0x0F) << 4) | ((a & 0xF0) << 4) | ((b & 0xF0) << 8);
        o.copy_from_slice(&w.to_le_bytes());
    }
}

/// The 16x16 tile amaxes of one group span (`rows(rr)`: row `rr`'s `cw` values) into
/// `tiles` (f32 patterns of NaN-ignoring magnitude maxima): each row's block maxima, as
/// [`rowwise_run`] takes them (16-bit input from its bits), folded over the 16 rows.
#[inline(always)]
fn span_tiles<'a, T: Element>(
    level: Level,
    rows: impl Fn(usize) -> &'a [T],
    wide: &mut [f32],
    tiles: &mut [u32],
) {
    tiles.fill(0);
    let mut row = [0u32; SPAN / BLOCK];
    for rr in 0..BLOCK {
        let xs = rows(rr);
        let row = &mut row[..tiles.len()];
        if let Some(bits) = quant_core::dtype::bf16_slice_bits(xs) {
            block_abs_max_bf16(level, bits, NanRule::Ignore, row);
        } else if let Some(bits) = quant_core::dtype::f16_slice_bits(xs) {
            block_abs_max_f16(level, bits, NanRule::Ignore, row);
        } else if let Some(w) = quant_core::dtype::f32_slice(xs) {
            block_abs_max(level, w, NanRule::Ignore, row);
        } else {
            for (xc, rc) in xs.chunks(CHUNK).zip(row.chunks_mut(NB)) {
                let w = quant_core::widened(xc, &mut wide[..xc.len()]);
                block_abs_max(level, w, NanRule::Ignore, rc);
            }
        }
        for (t, &b) in tiles.iter_mut().zip(row.iter()) {
            *t = (*t).max(b);
        }
    }
}

/// Stores row `r`'s (slab-local) scale codes of blocks `kb0..` into the slab's chunk
/// `rs` of the rowwise scale buffer.
#[inline(always)]
fn put_row_scales(p: &Params<'_>, rs: &mut [u8], rstride: usize, r: usize, kb0: usize, sdb: &[u8]) {
    if !p.swizzled {
        // Compact scales of a row's run are contiguous: one copy.
        simd::copy_short(&mut rs[r * rstride + kb0..][..sdb.len()], sdb);
        return;
    }
    for (b, &code) in sdb.iter().enumerate() {
        rs[scale_index(r, kb0 + b, rstride, p.swizzled)] = code;
    }
}

/// `S_enc` and `S_dec` of rowwise row `i` (the tensor's, or the row's when row-scaled).
#[inline(always)]
fn row_global(p: &Params<'_>, i: usize) -> (f32, f32) {
    global(p.row_amax.of_row(i), p.e4m3_max)
}

/// Row `i`'s run `xs` (at most [`CHUNK`] values from block `kb0`) under nearest or
/// stochastic rounding, with the row's global scales `(se, sd)`: block amaxes (or the
/// 2-D `tile` amaxes), scales, packed codes into `out`. Returns the run's scale codes.
///
/// A 16-bit run is widened into `wide` first, unless [`encoder_bits`] encodes it from
/// its bits; an f32 run is read in place (`wide` may then be empty).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rowwise_run<T: Element>(
    p: &Params<'_>,
    i: usize,
    (se, sd): (f32, f32),
    kb0: usize,
    xs: &[T],
    wide: &mut [f32],
    tile: Option<&[f32; NB]>,
    out: &mut [u8],
) -> [u8; NB] {
    let nb = xs.len() / BLOCK;
    let bits16 = encoder_bits(p, xs);
    let w: &[f32] = match bits16 {
        Some(_) => &[],
        None => {
            debug_assert!(T::DTYPE == DType::F32 || wide.len() >= xs.len());
            quant_core::widened(xs, wide.get_mut(..xs.len()).unwrap_or_default())
        }
    };
    let amax = match tile {
        Some(t) => *t,
        None => {
            let mut bits = [0u32; NB];
            match bits16 {
                Some(b) => b.block_abs_max(p.level, &mut bits[..nb]),
                None => block_abs_max(p.level, w, NanRule::Ignore, &mut bits[..nb]),
            }
            bits.map(f32::from_bits)
        }
    };
    let mut sdb = [0u8; NB];
    let mut enc = [0f32; NB];
    block_scales(&amax[..nb], se, sd, &mut sdb[..nb], &mut enc[..nb]);
    // Made (and zeroed) only under a seed.
    let mut bytes;
    let rnd = match p.seed {
        Some(seed) => {
            let blocks: [u32; NB] = std::array::from_fn(|b| (kb0 + b) as u32);
            bytes = [[0u8; BLOCK]; LANES];
            row_bytes(p.level, &blocks, i as u64, seed, &mut bytes[..nb]);
            Some(&bytes[..nb])
        }
        None => None,
    };
    #[cfg(target_arch = "x86_64")]
    {
        let run = match bits16 {
            Some(b) => b.run(),
            None => Run::F32(&w[..nb * BLOCK]),
        };
        if encode_run_at(p.level, run, &enc[..nb], rnd, out, &[]) {
            return sdb;
        }
    }
    // Portably; with bits (not reached while `encoder_bits` checks what the encoders
    // need) each block widened exactly first.
    for (b, (o, &e)) in out.chunks_exact_mut(BLOCK / 2).zip(&enc[..nb]).enumerate() {
        let widened;
        let v = match bits16 {
            Some(h) => {
                widened = h.widen_block(b);
                &widened[..]
            }
            None => &w[b * BLOCK..(b + 1) * BLOCK],
        };
        match rnd {
            None => encode_pack_rn(v, e, o),
            Some(r) => encode_pack_sr(v, e, &r[b], o),
        }
    }
    sdb
}

/// A rowwise run encoded by the vector encoder of `level`, round to nearest or, with
/// `rnd` (a row of random bytes per block), stochastic: [`crate::x86_encode::encode_run`]
/// at AVX-512, [`crate::x86_avx2::encode_run`] at AVX2. `false` (nothing written) where
/// there is none or it declines.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn encode_run_at(
    level: Level,
    run: Run<'_>,
    enc: &[f32],
    rnd: Option<&[[u8; BLOCK]]>,
    out: &mut [u8],
    ahead: &[u8],
) -> bool {
    match level {
        Level::Avx512 => crate::x86_encode::encode_run(run, enc, rnd, out, ahead),
        Level::Avx2 => crate::x86_avx2::encode_run(run, enc, rnd, out, ahead),
        Level::Scalar => false,
    }
}

/// A run of 16-bit input read as its bits by a vector encoder ([`encoder_bits`]):
/// its block maxima come from the bits and its values are widened in registers, so the
/// run skips the widening copy.
#[derive(Clone, Copy)]
enum Bits<'a> {
    Bf16(&'a [u16]),
    F16(&'a [u16]),
}

impl<'a> Bits<'a> {
    /// The block maxima (f32 magnitude patterns, NaN ignored) of the run's blocks.
    #[inline(always)]
    fn block_abs_max(self, level: Level, out: &mut [u32]) {
        match self {
            Bits::Bf16(b) => block_abs_max_bf16(level, b, NanRule::Ignore, out),
            Bits::F16(b) => block_abs_max_f16(level, b, NanRule::Ignore, out),
        }
    }

    /// Block `b` widened exactly: the fallback of a run the vector encoders refuse.
    #[inline(always)]
    fn widen_block(self, b: usize) -> [f32; BLOCK] {
        let mut w = [0f32; BLOCK];
        match self {
            Bits::Bf16(h) => {
                for (w, &v) in w.iter_mut().zip(&h[b * BLOCK..(b + 1) * BLOCK]) {
                    *w = f32_from_bf16_bits(v);
                }
            }
            Bits::F16(h) => {
                for (w, &v) in w.iter_mut().zip(&h[b * BLOCK..(b + 1) * BLOCK]) {
                    *w = half::f16::from_bits(v).to_f32();
                }
            }
        }
        w
    }

    /// The run as the vector encoders take it.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn run(self) -> Run<'a> {
        match self {
            Bits::Bf16(b) => Run::Bf16(b),
            Bits::F16(b) => Run::F16(b),
        }
    }
}

/// The bits of `xs` when the vector encoders take them directly: bf16 or f16 input
/// wherever [`span_encoder`] holds (AVX-512 or AVX2; both levels have block-maximum
/// kernels for both, [`quant_core::block_max`]), nearest or stochastic rounding. The run
/// then skips the widening copy, its block maxima and codes reading the bits.
#[inline(always)]
fn encoder_bits<'a, T: Element>(p: &Params<'_>, xs: &'a [T]) -> Option<Bits<'a>> {
    if !span_encoder::<T>(p) {
        return None;
    }
    quant_core::dtype::bf16_slice_bits(xs)
        .map(Bits::Bf16)
        .or_else(|| quant_core::dtype::f16_slice_bits(xs).map(Bits::F16))
}

/// 4over6 rowwise: the scalar candidate functions of [`crate::kernel`], block by block.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline(always)]
fn four_over_six_rows(
    p: &Params<'_>,
    mode: FourOverSix,
    k: usize,
    rstride: usize,
    i0: usize,
    c0: usize,
    cw: usize,
    rows: usize,
    wide: &[f32],
    tile_amax: &[[f32; NB]; SLAB / BLOCK],
    rd: &mut [u8],
    rs: &mut [u8],
) {
    let nb = cw / BLOCK;
    let kb0 = c0 / BLOCK;
    let block = |r: usize, b: usize| -> [f32; BLOCK] {
        std::array::from_fn(|e| wide[r * CHUNK + b * BLOCK + e])
    };
    let amax_of_row = |r: usize| p.row_amax.of_row(i0 + r);
    let mut write = |r: usize, b: usize, sdb: u8, codes: &[u8; BLOCK]| {
        e2m1::pack_slice(
            codes,
            &mut rd[r * k / 2 + (c0 + b * BLOCK) / 2..][..BLOCK / 2],
        );
        put_row_scales(p, rs, rstride, r, kb0 + b, &[sdb]);
    };
    for b in 0..nb {
        if p.two_d {
            for g in 0..rows / BLOCK {
                let cands: [_; BLOCK] = std::array::from_fn(|rr| {
                    let r = g * BLOCK + rr;
                    four_over_six_candidates(
                        &block(r, b),
                        tile_amax[g][b],
                        amax_of_row(r),
                        p.e4m3_max,
                        mode,
                    )
                });
                let pick4 =
                    tree_sum_16(cands.map(|c| c.0.err)) < tree_sum_16(cands.map(|c| c.1.err));
                for (rr, (m4, m6)) in cands.iter().enumerate() {
                    let c = if pick4 { m4 } else { m6 };
                    write(g * BLOCK + rr, b, c.sdb, &c.codes);
                }
            }
        } else {
            for r in 0..rows {
                let v = block(r, b);
                let amax = amax_f32(&v);
                let (m4, m6) = four_over_six_candidates(&v, amax, amax_of_row(r), p.e4m3_max, mode);
                let c = if m4.err < m6.err { m4 } else { m6 };
                write(r, b, c.sdb, &c.codes);
            }
        }
    }
}

/// Where the columnwise groups of a chunk come from.
#[derive(Clone, Copy)]
enum Src<'a> {
    /// The widened chunk in the scratch.
    Wide,
    /// The slab's bf16 bits (row stride `k`), summed straight into the rotated groups
    /// ([`rounded_sums_bf16`]): RHT on bf16 with AVX-512 or AVX2.
    Bits(&'a [u16], usize),
}

impl<'a> Src<'a> {
    /// [`Src::Bits`] where it applies to the slab `x` (`[rows, k]`): RHT, bf16 input,
    /// AVX-512 or AVX2, and chunks of whole 16-column steps; else [`Src::Wide`].
    fn of<T: Element>(p: &Params<'_>, x: &'a [T], k: usize) -> Src<'a> {
        let fits = p.rht
            && cfg!(target_arch = "x86_64")
            && p.level >= Level::Avx2
            && k.is_multiple_of(crate::rht::DIM);
        match quant_core::dtype::bf16_slice_bits(x) {
            Some(bits) if fits => Src::Bits(bits, k),
            _ => Src::Wide,
        }
    }
}

/// The columnwise operand of one 16-row group, 16 rows of [`CHUNK`]: `v[i][c]` for rows
/// `i` of the group (a view of `wide`, no copy), or `bf16(sum_i v[i][c] * R[i][j])` (in
/// index order from `+0.0`) with RHT, computed into `buf`. Returns `true` when it also
/// wrote each column's `max_i |v[i][c]|` (NaN ignored) into `amax`, as the fused RHT
/// kernel does; otherwise the caller folds them.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn group_values<'a>(
    p: &Params<'_>,
    src: Src<'_>,
    wide: &'a [f32],
    g: usize,
    c0: usize,
    cw: usize,
    buf: &'a mut [[f32; CHUNK]; BLOCK],
    amax: &mut [f32; CHUNK],
) -> (&'a [[f32; CHUNK]], bool) {
    if !p.rht {
        let vals = wide[g * BLOCK * CHUNK..(g + 1) * BLOCK * CHUNK].as_chunks::<CHUNK>();
        return (vals.0, false);
    }
    let mut local;
    let rows = match src {
        Src::Wide => &wide[g * BLOCK * CHUNK..],
        Src::Bits(bits, k) => {
            let group = &bits[g * BLOCK * k + c0..];
            #[cfg(target_arch = "x86_64")]
            if rounded_sums_bf16(p.level, group, k, cw, buf, amax) {
                return (buf, true);
            }
            // Not reached where `Src::of` chose the bits (AVX-512 or AVX2, widths of
            // whole blocks); widened here so that any call still gets the exact sums.
            let _ = &amax; // filled by the vector sums only
            local = [0f32; BLOCK * CHUNK];
            for (i, row) in local.chunks_exact_mut(CHUNK).enumerate() {
                for (d, &b) in row[..cw].iter_mut().zip(&group[i * k..]) {
                    *d = f32_from_bf16_bits(b);
                }
            }
            &local[..]
        }
    };
    // The sums into `buf`, with AVX-512, AVX2 or portably, then rounded to bf16 in place.
    #[cfg(target_arch = "x86_64")]
    let summed = match p.level {
        Level::Avx512 => crate::rht_x86::hadamard_sums(rows, CHUNK, cw, buf),
        Level::Avx2 => crate::rht_avx2::hadamard_sums(rows, CHUNK, cw, buf),
        Level::Scalar => false,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let summed = false;
    if !summed {
        for o in buf.iter_mut() {
            o[..cw].fill(0.0);
        }
        for (i, ri) in R.iter().enumerate() {
            let v = &rows[i * CHUNK..][..cw];
            for (a, &rij) in buf.iter_mut().zip(ri) {
                for (a, &x) in a[..cw].iter_mut().zip(v) {
                    *a += x * rij;
                }
            }
        }
    }
    // `bf16_bits` is `bf16::from_f32` without its branches, so the loop vectorizes.
    for o in buf.iter_mut() {
        for o in &mut o[..cw] {
            *o = f32_from_bf16_bits(bf16_bits(*o));
        }
    }
    (buf, false)
}

/// The rotated operand of a 16-row group of bf16 bits, rounded, with its column maxima,
/// by the kernel of `level` ([`crate::rht_x86::rounded_sums_bf16`],
/// [`crate::rht_avx2::rounded_sums_bf16`]); `false` where there is none or it declines.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rounded_sums_bf16(
    level: Level,
    group: &[u16],
    k: usize,
    cw: usize,
    buf: &mut [[f32; CHUNK]; BLOCK],
    amax: &mut [f32; CHUNK],
) -> bool {
    match level {
        Level::Avx512 => crate::rht_x86::rounded_sums_bf16(group, k, cw, buf, amax),
        Level::Avx2 => crate::rht_avx2::rounded_sums_bf16(group, k, cw, buf, amax),
        Level::Scalar => false,
    }
}

/// The rotated operand of a 16-row group as bf16 bits, row pairs interleaved in u32
/// words, with its column maxima, where the AVX-512 BF16 kernel takes it
/// ([`crate::rht_x86::rounded_bf16x2`]): RHT on bf16 input summed from the bits. The
/// pair encoder then reads both rows of a pair from one load
/// ([`crate::x86_encode::encode_bf16x2_rn`]). `None` elsewhere (no such kernel, or
/// 4over6, which chooses among the f32 values of [`group_values`], which the caller
/// then takes).
#[inline(always)]
fn group_bits<'a>(
    p: &Params<'_>,
    src: Src<'_>,
    (g, c0, cw): (usize, usize, usize),
    buf: &'a mut [[u32; CHUNK]; BLOCK / 2],
    amax: &mut [f32; CHUNK],
) -> Option<&'a [[u32; CHUNK]]> {
    #[cfg(target_arch = "x86_64")]
    if let Src::Bits(bits, k) = src
        && p.level == Level::Avx512
        && p.four_over_six.is_none()
        && crate::rht_x86::rounded_bf16x2(&bits[g * BLOCK * k + c0..], k, cw, buf, amax)
    {
        return Some(buf);
    }
    let _ = (p, src, g, c0, cw, buf, amax);
    None
}

/// The largest `|x|` and unrounded `|y|` of a 16-row group of bf16 bits by the kernel
/// of `level` ([`crate::rht_x86::sums_abs_max_bf16`],
/// [`crate::rht_avx2::sums_abs_max_bf16`]); `None` where there is none or it declines.
/// `floor` is the running maximum of `|y|` the result folds into: the `|y|` returned is
/// exact as `max(floor, |y|)`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn sums_abs_max_bf16(
    level: Level,
    group: &[u16],
    k: usize,
    cw: usize,
    floor: f32,
) -> Option<(f32, f32)> {
    match level {
        Level::Avx512 => crate::rht_x86::sums_abs_max_bf16(group, k, cw, floor),
        Level::Avx2 => crate::rht_avx2::sums_abs_max_bf16(group, k, cw, floor),
        Level::Scalar => None,
    }
}

/// `S_enc` and `S_dec` of columns `c0..c0 + cw` of the columnwise operand (one global
/// amax, or one per stored row when row-scaled).
#[inline(always)]
fn col_globals(p: &Params<'_>, c0: usize, cw: usize) -> ([f32; CHUNK], [f32; CHUNK]) {
    let mut se = [0f32; CHUNK];
    let mut sd = [0f32; CHUNK];
    match p.col_amax {
        Amax::Tensor(a) => {
            let (e, d) = global(a, p.e4m3_max);
            se.fill(e);
            sd.fill(d);
        }
        Amax::PerRow(v) => {
            for c in 0..cw {
                (se[c], sd[c]) = global(v.get(c0 + c).copied().unwrap_or(0.0), p.e4m3_max);
            }
        }
    }
    (se, sd)
}

/// Two neighbouring rows of a columnwise group, f32 or bf16 or f16 bits, or bf16 bits
/// interleaved (the low half of each u32 the first row's, the high half the second's).
#[derive(Clone, Copy)]
enum Pair<'a> {
    F32(&'a [f32], &'a [f32]),
    Bf16(&'a [u16], &'a [u16]),
    F16(&'a [u16], &'a [u16]),
    Bf16x2(&'a [u32]),
}

impl<'a> Pair<'a> {
    /// The two rows as the vector encoders' runs (`None` for [`Pair::Bf16x2`], which
    /// has encoders of its own).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn runs(self) -> Option<(Run<'a>, Run<'a>)> {
        match self {
            Pair::F32(a, b) => Some((Run::F32(a), Run::F32(b))),
            Pair::Bf16(a, b) => Some((Run::Bf16(a), Run::Bf16(b))),
            Pair::F16(a, b) => Some((Run::F16(a), Run::F16(b))),
            Pair::Bf16x2(_) => None,
        }
    }
}

/// The two bf16 values of a [`Pair::Bf16x2`] word, widened (exact): the layout
/// `rht_x86::rounded_bf16x2` writes (its tests unpack with this too).
#[inline(always)]
pub(crate) fn bf16x2_values(w: u32) -> (f32, f32) {
    (f32::from_bits(w << 16), f32::from_bits(w & 0xFFFF_0000))
}

/// An f16 value's bits widened (exact), for the portable pair loops.
#[inline(always)]
fn f32_from_f16_bits(b: u16) -> f32 {
    half::f16::from_bits(b).to_f32()
}

/// `out[c] = code(lo[c] * enc[c]) | code(hi[c] * enc[c]) << 4` (round to nearest): the
/// packed bytes of two stored rows' worth of a columnwise group, with the AVX-512 or
/// AVX2 encoder where it runs ([`crate::x86_encode::encode_pairs_rn`],
/// [`crate::x86_encode::encode_bf16x2_rn`], [`crate::x86_avx2::encode_pairs_rn`]),
/// else portably.
#[inline(always)]
fn pairs_rn(level: Level, pair: Pair<'_>, enc: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        let done = match (level, pair.runs(), pair) {
            (Level::Avx512, Some((lo, hi)), _) => {
                crate::x86_encode::encode_pairs_rn(lo, hi, enc, out)
            }
            (Level::Avx512, None, Pair::Bf16x2(w)) => {
                crate::x86_encode::encode_bf16x2_rn(w, enc, out)
            }
            (Level::Avx2, Some((lo, hi)), _) => crate::x86_avx2::encode_pairs_rn(lo, hi, enc, out),
            _ => false,
        };
        if done {
            return;
        }
    }
    let _ = level;
    let code = |x: f32, e: f32| e2m1::encode(x * e);
    match pair {
        Pair::F32(a, b) => {
            for (((d, &x), &y), &e) in out.iter_mut().zip(a).zip(b).zip(enc) {
                *d = code(x, e) | code(y, e) << 4;
            }
        }
        Pair::Bf16(a, b) => {
            let w = f32_from_bf16_bits;
            for (((d, &x), &y), &e) in out.iter_mut().zip(a).zip(b).zip(enc) {
                *d = code(w(x), e) | code(w(y), e) << 4;
            }
        }
        Pair::F16(a, b) => {
            let w = f32_from_f16_bits;
            for (((d, &x), &y), &e) in out.iter_mut().zip(a).zip(b).zip(enc) {
                *d = code(w(x), e) | code(w(y), e) << 4;
            }
        }
        Pair::Bf16x2(w) => {
            for ((d, &w), &e) in out.iter_mut().zip(w).zip(enc) {
                let (x, y) = bf16x2_values(w);
                *d = code(x, e) | code(y, e) << 4;
            }
        }
    }
}

/// [`pairs_rn`] under stochastic rounding: column `c`'s random bytes are bytes
/// `shift / 8` (for `lo`) and `shift / 8 + 1` (for `hi`) of `words[c]`, the Philox word
/// of the column's block that holds the pair's two elements (`shift` 0 or 16:
/// [`sr::element_bits`] of rows `2q`, `2q + 1` is word `q / 2`, bytes `2(q % 2)` and
/// `2(q % 2) + 1`). With the AVX-512 or AVX2 encoder where it runs
/// ([`crate::x86_encode::encode_pairs_sr`], [`crate::x86_encode::encode_bf16x2_sr`],
/// [`crate::x86_avx2::encode_pairs_sr`]), else [`sr_code`] per value.
#[inline(always)]
fn pairs_sr(level: Level, pair: Pair<'_>, enc: &[f32], words: &[u32], shift: u32, out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        let done = match (level, pair.runs(), pair) {
            (Level::Avx512, Some((lo, hi)), _) => {
                crate::x86_encode::encode_pairs_sr(lo, hi, enc, words, shift, out)
            }
            (Level::Avx512, None, Pair::Bf16x2(w)) => {
                crate::x86_encode::encode_bf16x2_sr(w, enc, words, shift, out)
            }
            (Level::Avx2, Some((lo, hi)), _) => {
                crate::x86_avx2::encode_pairs_sr(lo, hi, enc, words, shift, out)
            }
            _ => false,
        };
        if done {
            return;
        }
    }
    let _ = level;
    let pair_byte = |x: f32, y: f32, e: f32, w: u32| {
        sr_code(x * e, (w >> shift) & 0xFF) | sr_code(y * e, (w >> (shift + 8)) & 0xFF) << 4
    };
    let cols = out.iter_mut().zip(enc).zip(words);
    match pair {
        Pair::F32(a, b) => {
            for (((d, &e), &w), (&x, &y)) in cols.zip(a.iter().zip(b)) {
                *d = pair_byte(x, y, e, w);
            }
        }
        Pair::Bf16(a, b) => {
            let f = f32_from_bf16_bits;
            for (((d, &e), &w), (&x, &y)) in cols.zip(a.iter().zip(b)) {
                *d = pair_byte(f(x), f(y), e, w);
            }
        }
        Pair::F16(a, b) => {
            let f = f32_from_f16_bits;
            for (((d, &e), &w), (&x, &y)) in cols.zip(a.iter().zip(b)) {
                *d = pair_byte(f(x), f(y), e, w);
            }
        }
        Pair::Bf16x2(v) => {
            for (((d, &e), &w), &v) in cols.zip(v) {
                let (x, y) = bf16x2_values(v);
                *d = pair_byte(x, y, e, w);
            }
        }
    }
}

/// The columnwise Philox words of 16-row group `group` (its block index in every
/// column) for columns `c0..c0 + cw`: `words[w][c]` is word `w` of
/// [`sr::block_bits`]`(seed, DIR_COLUMNWISE, c0 + c, group)`, written in place (as a
/// return value the 4 KiB array was copied once more per group). At [`Level::Avx512`]
/// the rounds run in `philox_x86`, 32 columns per call: the portable lanes vectorize
/// well, but as two chains of eight counters, which wait on each round's multiply (the
/// module's docs). At [`Level::Avx2`] they run in `philox_avx2`, where LLVM's build of
/// [`philox_lanes`] copied the words out lane by lane.
#[inline(always)]
fn group_words(
    level: Level,
    group: u32,
    (c0, cw): (usize, usize),
    seed: u64,
    words: &mut [[u32; CHUNK]; 4],
) {
    let dir = sr::DIR_COLUMNWISE;
    let mut done = 0;
    // 32 columns per call where they are there (`philox_x86`'s four chains), else 16.
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 {
        while done < cw {
            let n = if done + 2 * LANES <= cw {
                2 * LANES
            } else {
                LANES
            };
            let cols = (group, (c0 + done) as u64, n);
            if !crate::philox_x86::words(cols, dir, seed, words, done) {
                break;
            }
            done += n;
        }
    }
    for c in (done..cw).step_by(LANES) {
        let (mut lo, mut hi) = ([0u32; LANES], [0u32; LANES]);
        for l in 0..LANES {
            let col = (c0 + c + l) as u64;
            (lo[l], hi[l]) = (col as u32, (col >> 32) as u32);
        }
        let block = [group; LANES];
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx2
            && crate::philox_avx2::words16(&block, (&lo, &hi), dir, seed, words, c)
        {
            continue;
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = level;
        let b = philox_lanes(&block, &lo, &hi, dir, seed);
        for (dst, src) in words.iter_mut().zip(&b) {
            dst[c..c + LANES].copy_from_slice(src);
        }
    }
}

/// Where [`group_pairs`] reads a 16-row group's rows: the widened chunk (`[row][c]`,
/// columns from 0), or the slab in place (rows `r0..r0 + 16` of a `k`-column slab,
/// columns from the chunk's `c0`).
#[derive(Clone, Copy)]
enum GroupRows<'a> {
    Wide(&'a [[f32; CHUNK]]),
    /// The rotated operand as bf16 bits, row pairs interleaved ([`group_bits`]).
    Bf16x2(&'a [[u32; CHUNK]]),
    Slab {
        slab: Slab<'a>,
        k: usize,
        r0: usize,
    },
}

impl<'a> GroupRows<'a> {
    /// Rows `2q` and `2q + 1` of the group, columns `c0..c0 + cw` of the chunk.
    #[inline(always)]
    fn pair(self, q: usize, c0: usize, cw: usize) -> Pair<'a> {
        match self {
            GroupRows::Wide(vals) => Pair::F32(&vals[2 * q][..cw], &vals[2 * q + 1][..cw]),
            GroupRows::Bf16x2(vals) => Pair::Bf16x2(&vals[q][..cw]),
            GroupRows::Slab { slab, k, r0 } => {
                let lo = (r0 + 2 * q) * k + c0;
                slab.pair(lo..lo + cw, lo + k..lo + k + cw)
            }
        }
    }
}

/// The packed row pairs of a chunk's 16-row group (columns `c0..c0 + cw`) into the
/// group's eight rows of `pairs` (`[8][CHUNK]`), from its block encode scales `enc`:
/// round to nearest ([`pairs_rn`]) or, under a seed, stochastic ([`pairs_sr`], with the
/// Philox words of `group`, the group's block index down the columns, made in `words`).
#[inline(always)]
fn group_pairs(
    p: &Params<'_>,
    rows: GroupRows<'_>,
    group: u32,
    (c0, cw): (usize, usize),
    enc: &[f32; CHUNK],
    (pairs, words): (&mut [u8], &mut [[u32; CHUNK]; 4]),
) {
    // Not `Option::map`: its closure was compiled out of line, without the dispatched
    // level's instructions (the Philox rounds in SSE2, a third of the profile).
    let words = match p.seed {
        Some(seed) => {
            group_words(p.level, group, (c0, cw), seed, words);
            Some(&*words)
        }
        None => None,
    };
    for q in 0..BLOCK / 2 {
        let dst = &mut pairs[q * CHUNK..][..cw];
        let pair = rows.pair(q, c0, cw);
        match words {
            None => pairs_rn(p.level, pair, &enc[..cw], dst),
            Some(w) => {
                let (w, shift) = (&w[q / 2][..cw], 16 * (q % 2) as u32);
                pairs_sr(p.level, pair, &enc[..cw], w, shift, dst);
            }
        }
    }
}

/// Columnwise quantization of one chunk of the slab (rows of `x^T` = columns of `x`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn columnwise_chunk(
    p: &Params<'_>,
    i0: usize,
    src: Src<'_>,
    c0: usize,
    cw: usize,
    nb: usize,
    rows: usize,
    tile_amax: &[[f32; NB]; SLAB / BLOCK],
    col: &mut ColOut<'_>,
    s: &mut Scratch,
) {
    let groups = rows / BLOCK;
    let (se, sd) = col_globals(p, c0, cw);
    let mut buf = [[0f32; CHUNK]; BLOCK];
    let mut bits_buf = [[0u32; CHUNK]; BLOCK / 2];
    let mut scales = [[0u8; SLAB / BLOCK]; CHUNK];
    for g in 0..groups {
        // RHT summed from the bits reads each group's runs straight from the input,
        // with nothing fetched ahead: fetch the next group's (the next chunk's first
        // group after the last) into L2 before summing this one, as
        // [`columnwise_chunk_direct`] does for f32 (x1.08 on two Zen 4 cores at
        // 8192x8192; into L1 x0.97).
        if let Src::Bits(bits, k) = src {
            next_group_to_l2(bits, k, (g, rows), (c0, cw));
        }
        let mut amax = [0f32; CHUNK];
        // The group as the pair encoder reads it. On the bf16-bits route `vals` stays
        // empty: only 4over6 (which that route excludes) and the maxima fold (its maxima
        // came with it) read `vals`.
        let (vals, group_rows, have_amax) =
            match group_bits(p, src, (g, c0, cw), &mut bits_buf, &mut amax) {
                Some(b) => (&[][..], GroupRows::Bf16x2(b), true),
                None => {
                    let (v, have) = group_values(p, src, &s.wide, g, c0, cw, &mut buf, &mut amax);
                    (v, GroupRows::Wide(v), have)
                }
            };
        let mb = (i0 / BLOCK + g) as u32;
        let mut sdb = [0u8; CHUNK];
        let codes = &mut s.codes[..BLOCK * CHUNK];
        // Whether the group's row pairs are written directly (all but 4over6, which
        // chooses its codes per block and packs them below).
        let packed = p.four_over_six.is_none();
        if let Some(mode) = p.four_over_six {
            four_over_six_cols(p, mode, vals, cw, nb, g, tile_amax, c0, &mut sdb, codes);
        } else {
            if p.two_d {
                for (c, a) in amax[..cw].iter_mut().enumerate() {
                    *a = tile_amax[g][c / BLOCK];
                }
            } else if !have_amax {
                for v in vals.iter() {
                    fold_abs_max(&mut amax[..cw], &v[..cw]);
                }
            }
            let mut enc = [0f32; CHUNK];
            block_scales_each(
                &amax[..cw],
                &se[..cw],
                &sd[..cw],
                &mut sdb[..cw],
                &mut enc[..cw],
            );
            // Straight to row pairs, no codes in between.
            let pairs = &mut s.pairs[g * BLOCK / 2 * CHUNK..][..BLOCK / 2 * CHUNK];
            group_pairs(p, group_rows, mb, (c0, cw), &enc, (pairs, &mut s.words));
        }
        // Pack row pairs: pairs[8g + q][c] = code(2q) | code(2q+1) << 4.
        for q in (0..BLOCK / 2).filter(|_| !packed) {
            let (lo, hi) = codes.split_at(CHUNK * (2 * q + 1));
            let lo = &lo[CHUNK * 2 * q..][..cw];
            let hi = &hi[..cw];
            let dst = &mut s.pairs[(g * BLOCK / 2 + q) * CHUNK..][..cw];
            for ((d, &a), &b) in dst.iter_mut().zip(lo).zip(hi) {
                *d = a | (b << 4);
            }
        }
        for (sc, &code) in scales[..cw].iter_mut().zip(&sdb[..cw]) {
            sc[g] = code;
        }
    }
    store_columnwise(p, c0, cw, rows, &scales, col, s);
}

/// A slab's input as it is, for [`columnwise_chunk_direct`]: f32 values, or bf16 or
/// f16 bits.
#[derive(Clone, Copy)]
enum Slab<'a> {
    F32(&'a [f32]),
    Bits(Bits16<'a>),
}

impl<'a> Slab<'a> {
    /// `x` as f32, or bf16 or f16 bits. f16 only at [`Level::Avx512`] or
    /// [`Level::Avx2`], whose pair encoders widen it in the register (the portable pair
    /// loops widen value by value: without a vector level f16 is widened into the
    /// scratch first, in bulk). At AVX2 the bulk widening stayed after the AVX2 pair
    /// encoders arrived; reading the bits measured x1.18 (f16, 1-D) and x1.13 (SR) in
    /// process (8192^2, two Zen 4 cores, 3 A/B pairs).
    fn of<T: Element>(x: &'a [T], level: Level) -> Option<Slab<'a>> {
        match Bits16::of(x) {
            Some(b @ Bits16::Bf16(_)) => Some(Slab::Bits(b)),
            Some(b @ Bits16::F16(_)) => (level != Level::Scalar).then_some(Slab::Bits(b)),
            None => quant_core::dtype::f32_slice(x).map(Slab::F32),
        }
    }

    fn len(self) -> usize {
        match self {
            Slab::F32(w) => w.len(),
            Slab::Bits(b) => b.len(),
        }
    }

    /// Fetches the values at `at` (a closure doing this was compiled out of line, 2 %
    /// of the bf16 profile).
    #[inline(always)]
    fn prefetch(self, at: std::ops::Range<usize>) {
        match self {
            Slab::F32(w) => simd::prefetch(&w[at]),
            Slab::Bits(b) => simd::prefetch(&b.bits()[at]),
        }
    }

    /// The rows at `lo` and `hi` as a [`Pair`].
    #[inline(always)]
    fn pair(self, lo: std::ops::Range<usize>, hi: std::ops::Range<usize>) -> Pair<'a> {
        match self {
            Slab::F32(w) => Pair::F32(&w[lo], &w[hi]),
            Slab::Bits(Bits16::Bf16(b)) => Pair::Bf16(&b[lo], &b[hi]),
            Slab::Bits(Bits16::F16(b)) => Pair::F16(&b[lo], &b[hi]),
        }
    }
}

/// [`columnwise_chunk`] of f32, bf16 or f16 input read in place, for the 1-D recipe
/// without RHT or 4over6 (round to nearest or stochastic): each 16-row group's column
/// maxima folded on the input rows (16-bit input on the bits, [`column_abs_max_bits`])
/// and its row pairs encoded from them ([`pairs_rn`], [`pairs_sr`]), so the chunk is
/// never copied into the widened scratch (for f32 that copy, a `memmove`, was a third
/// of the profile). The same bytes: the column amax is the same NaN-ignoring maximum, and the
/// encoder sees the same (exactly widened) values.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn columnwise_chunk_direct(
    p: &Params<'_>,
    k: usize,
    i0: usize,
    c0: usize,
    cw: usize,
    slab: Slab<'_>,
    col: &mut ColOut<'_>,
    s: &mut Scratch,
) {
    let rows = slab.len() / k;
    let (se, sd) = col_globals(p, c0, cw);
    let mut scales = [[0u8; SLAB / BLOCK]; CHUNK];
    let at = |r: usize| r * k + c0..r * k + c0 + cw;
    // Each group's maxima and block scales, rewritten per group: made once per chunk,
    // since zeroing them per group took a `memset` call each (1 % of the profile).
    let (mut amax, mut sdb, mut enc) = ([0f32; CHUNK], [0u8; CHUNK], [0f32; CHUNK]);
    for g in 0..rows / BLOCK {
        // As the widening walk does: fetch each row's run a few rows ahead.
        let ahead = |r: usize| {
            if r + AHEAD < rows {
                slab.prefetch(at(r + AHEAD));
            }
        };
        match slab {
            Slab::Bits(bits) => {
                let mut keys = [0u16; CHUNK];
                for r in g * BLOCK..(g + 1) * BLOCK {
                    ahead(r);
                    column_abs_max_bits(bits.slice(at(r)), NanRule::Ignore, &mut keys[..cw]);
                }
                for (a, &key) in amax.iter_mut().zip(&keys) {
                    *a = f32::from_bits(column_key(bits, key));
                }
            }
            Slab::F32(w) => {
                amax[..cw].fill(0.0);
                for r in g * BLOCK..(g + 1) * BLOCK {
                    ahead(r);
                    fold_abs_max(&mut amax[..cw], &w[at(r)]);
                }
            }
        }
        block_scales_each(
            &amax[..cw],
            &se[..cw],
            &sd[..cw],
            &mut sdb[..cw],
            &mut enc[..cw],
        );
        // f32: the next group's runs fetched into L2 before this group encodes, so that
        // its maxima pass reads them from there; a few rows ahead (`ahead`) was too
        // short for 1 KiB runs a row apart (x1.11 on two Zen 4 cores at 8192x8192, SR
        // x1.06). 16-bit runs, half as long, ran x0.97-0.98 with it and go without.
        if let Slab::F32(w) = slab {
            next_group_to_l2(w, k, (g, rows), (c0, cw));
        }
        let rows = GroupRows::Slab {
            slab,
            k,
            r0: g * BLOCK,
        };
        let pairs = &mut s.pairs[g * BLOCK / 2 * CHUNK..][..BLOCK / 2 * CHUNK];
        let group = (i0 / BLOCK + g) as u32;
        group_pairs(p, rows, group, (c0, cw), &enc, (pairs, &mut s.words));
        for (sc, &code) in scales[..cw].iter_mut().zip(&sdb[..cw]) {
            sc[g] = code;
        }
    }
    store_columnwise(p, c0, cw, rows, &scales, col, s);
}

/// Fetches into L2 the runs that the columnwise walk over the slab `x` (`rows` rows of
/// `k`, chunks of [`CHUNK`] columns, 16-row groups within each) reads after group `g`
/// of the chunk at `c0` (`cw` wide): the next group's, or after the last group the next
/// chunk's first group's; nothing after the slab's last chunk (nor past `x`'s end: a
/// hint, never a bounds panic).
#[inline(always)]
fn next_group_to_l2<E>(x: &[E], k: usize, (g, rows): (usize, usize), (c0, cw): (usize, usize)) {
    let (ng, nc) = if (g + 1) * BLOCK < rows {
        (g + 1, c0)
    } else {
        (0, c0 + cw)
    };
    let nw = CHUNK.min(k.saturating_sub(nc));
    for r in (ng * BLOCK..(ng + 1) * BLOCK).filter(|_| nw > 0) {
        simd::prefetch_l2(x.get(r * k + nc..r * k + nc + nw).unwrap_or(&[]));
    }
}

/// The end of a columnwise chunk: the block scales (`scales[c][g]`: column `c`, 16-row
/// group `g`) into the slab's scale strip, and the packed row pairs in `s.pairs`,
/// transposed, into its data strip (streamed from registers by [`transpose_to_strip`]
/// where it runs).
#[inline(always)]
fn store_columnwise(
    p: &Params<'_>,
    c0: usize,
    cw: usize,
    rows: usize,
    scales: &[[u8; SLAB / BLOCK]; CHUNK],
    col: &mut ColOut<'_>,
    s: &mut Scratch,
) {
    let groups = rows / BLOCK;
    // Scales: the slab's block column `g` of column (stored row) `kk = c0 + c`, written
    // per stored row after all groups (one scattered byte per group was a tenth of
    // the profile).
    for (c, sc) in scales[..cw].iter().enumerate() {
        let kk = c0 + c;
        if p.swizzled {
            // Groups 4t..4t+4 are four consecutive bytes of 128x4 tile `t`.
            let row = col.scales.row_mut(kk / 128);
            let at = (kk % 32) * 16 + ((kk % 128) / 32) * 4;
            for (t, four) in sc[..groups].chunks(4).enumerate() {
                simd::copy_short(&mut row[t * TILE_BYTES + at..][..four.len()], four);
            }
        } else {
            // Not `copy_from_slice`: of a length known only at run time it is a
            // `memcpy` call, per stored row (4 % of the bf16 columnwise quantize).
            simd::copy_short(&mut col.scales.row_mut(kk)[..groups], &sc[..groups]);
        }
    }
    // [rows/2][cw] pairs -> [cw][rows/2] bytes, one strip row per column of x.
    let half = rows / 2;
    let (mode, fence) = (col.store.0, &col.store.1);
    let (block, out) = ((&s.pairs[..], CHUNK, half, cw), (&mut col.data, c0));
    transpose_to_strip((p.level, mode, fence), block, out, &mut s.tposed);
}

/// 4over6 columnwise: per column block (16 values down a column), the scalar candidates.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline(always)]
fn four_over_six_cols(
    p: &Params<'_>,
    mode: FourOverSix,
    vals: &[[f32; CHUNK]],
    cw: usize,
    nb: usize,
    g: usize,
    tile_amax: &[[f32; NB]; SLAB / BLOCK],
    c0: usize,
    sdb: &mut [u8; CHUNK],
    codes: &mut [u8],
) {
    let column = |c: usize| -> [f32; BLOCK] { std::array::from_fn(|i| vals[i][c]) };
    let amax_of = |c: usize| p.col_amax.of_row(c0 + c);
    let mut put = |c: usize, s: u8, cs: &[u8; BLOCK]| {
        sdb[c] = s;
        for (i, &code) in cs.iter().enumerate() {
            codes[i * CHUNK + c] = code;
        }
    };
    if p.two_d {
        for b in 0..nb {
            let cands: [_; BLOCK] = std::array::from_fn(|cc| {
                let c = b * BLOCK + cc;
                four_over_six_candidates(&column(c), tile_amax[g][b], amax_of(c), p.e4m3_max, mode)
            });
            let pick4 = tree_sum_16(cands.map(|c| c.0.err)) < tree_sum_16(cands.map(|c| c.1.err));
            for (cc, (m4, m6)) in cands.iter().enumerate() {
                let c = if pick4 { m4 } else { m6 };
                put(b * BLOCK + cc, c.sdb, &c.codes);
            }
        }
    } else {
        for c in 0..cw {
            let v = column(c);
            let amax = amax_f32(&v);
            let (m4, m6) = four_over_six_candidates(&v, amax, amax_of(c), p.e4m3_max, mode);
            let pick = if m4.err < m6.err { m4 } else { m6 };
            put(c, pick.sdb, &pick.codes);
        }
    }
}

/// The tensor amaxes of a slab of bf16 bits (`rows x k`) and of its Hadamard-rotated
/// transpose, both from [`sums_abs_max_bf16`] at `level`: 16-row group by group,
/// along the rows in [`CHUNK`]-column steps, so that the slab is read once, as 16
/// sequential streams. (Reading it whole for `|x|` first, then in column chunks across
/// all its rows for `|y|`, read it twice, the second time as 128 streams, out of L2.)
/// `None` where a row count is not whole groups or the kernel declines a step (no
/// AVX-512 or AVX2); the caller then takes its general walk, whose maxima fold over
/// these.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn group_amaxes(level: Level, bits: &[u16], rows: usize, k: usize) -> Option<(f32, f32)> {
    if !rows.is_multiple_of(BLOCK) {
        return None;
    }
    let (mut ax, mut ay) = (0f32, 0f32);
    for g in 0..rows / BLOCK {
        for c0 in (0..k).step_by(CHUNK) {
            let cw = CHUNK.min(k - c0);
            let (bx, by) = sums_abs_max_bf16(level, &bits[g * BLOCK * k + c0..], k, cw, ay)?;
            ax = fmax_nan_loses(ax, bx);
            ay = fmax_nan_loses(ay, by);
        }
    }
    Some((ax, ay))
}

/// Global amaxes in one pass: the tensor amax of `x` (`want_x`), of its Hadamard-rotated
/// transpose (`want_y`, bf16 input), and per-row / per-column amaxes (row-scaled).
pub(crate) struct Amaxes {
    pub x: f32,
    pub y: f32,
    pub rows: Vec<f32>,
    pub cols: Vec<f32>,
}

/// Computes the requested global amaxes of `xs` (`[m, k]`) with one read.
pub(crate) fn amaxes<T: Element>(
    xs: &[T],
    m: usize,
    k: usize,
    want_x: bool,
    want_y: bool,
    want_rows: bool,
    want_cols: bool,
) -> Amaxes {
    let mut out = Amaxes {
        x: 0.0,
        y: 0.0,
        rows: if want_rows { vec![0.0; m] } else { Vec::new() },
        cols: Vec::new(),
    };
    if m == 0 || k == 0 {
        out.cols = vec![0.0; if want_cols { k } else { 0 }];
        return out;
    }
    if !(want_x || want_y || want_rows || want_cols) {
        return out;
    }
    if want_x && !want_y && !want_rows && !want_cols {
        out.x = quant_core::cpu::par_amax(xs);
        return out;
    }
    let level = simd::level();
    let rows_per_task = if want_y {
        SLAB
    } else {
        (SLAB * 1024 / k).max(1)
    };
    let mut row_chunks: Vec<Option<&mut [f32]>> = if want_rows {
        out.rows.chunks_mut(rows_per_task).map(Some).collect()
    } else {
        Vec::new()
    };
    row_chunks.resize_with(m.div_ceil(rows_per_task), || None);
    let p = Params {
        level,
        two_d: false,
        e4m3_max: 448,
        four_over_six: None,
        seed: None,
        swizzled: false,
        rht: true,
        row_amax: Amax::Tensor(0.0),
        col_amax: Amax::Tensor(0.0),
    };
    let (ax, ay, cols) = xs
        .par_chunks(rows_per_task * k)
        .zip(row_chunks)
        .fold(
            || {
                (
                    0f32,
                    0f32,
                    vec![0f32; if want_cols { k } else { 0 }],
                    vec![0f32; if want_y { SLAB * CHUNK } else { 0 }],
                )
            },
            |(mut ax, mut ay, mut cols, mut wide), (x, mut rows)| {
                simd::dispatch(
                    level,
                    #[inline(always)]
                    || {
                        let nrows = x.len() / k;
                        #[cfg(target_arch = "x86_64")]
                        if let (true, None, false, Src::Bits(bits, _)) =
                            (want_y, rows.as_deref(), want_cols, Src::of(&p, x, k))
                            && let Some((bx, by)) = group_amaxes(level, bits, nrows, k)
                        {
                            ax = fmax_nan_loses(ax, bx);
                            ay = fmax_nan_loses(ay, by);
                            return;
                        }
                        let mut buf = [0f32; quant_core::cpu::BLOCK];
                        for (r, xr) in x.chunks_exact(k).enumerate() {
                            let mut ar = 0f32;
                            for (c, seg) in xr.chunks(quant_core::cpu::BLOCK).enumerate() {
                                let w = quant_core::widened(seg, &mut buf[..seg.len()]);
                                ar = fmax_nan_loses(ar, amax_f32(w));
                                if want_cols {
                                    let cc = &mut cols[c * quant_core::cpu::BLOCK..][..w.len()];
                                    fold_abs_max(cc, w);
                                }
                            }
                            ax = fmax_nan_loses(ax, ar);
                            if let Some(rows) = rows.as_deref_mut() {
                                rows[r] = ar;
                            }
                        }
                        if want_y {
                            let src = Src::of(&p, x, k);
                            let mut buf = [[0f32; CHUNK]; BLOCK];
                            for c0 in (0..k).step_by(CHUNK) {
                                let cw = CHUNK.min(k - c0);
                                for r in (0..nrows).filter(|_| matches!(src, Src::Wide)) {
                                    T::widen_slice(
                                        &x[r * k + c0..r * k + c0 + cw],
                                        &mut wide[r * CHUNK..r * CHUNK + cw],
                                    );
                                }
                                for g in 0..nrows / BLOCK {
                                    // Only the maximum is wanted: unrounded, rounded
                                    // once below.
                                    #[cfg(target_arch = "x86_64")]
                                    if let Src::Bits(bits, k) = src {
                                        let group = &bits[g * BLOCK * k + c0..];
                                        let m = sums_abs_max_bf16(level, group, k, cw, ay);
                                        if let Some((_, m)) = m {
                                            ay = fmax_nan_loses(ay, m);
                                            continue;
                                        }
                                    }
                                    // The values themselves (rounded), whether or not
                                    // their column maxima came with them.
                                    let mut cm = [0f32; CHUNK];
                                    let (vals, _) =
                                        group_values(&p, src, &wide, g, c0, cw, &mut buf, &mut cm);
                                    for v in vals.iter() {
                                        ay = fmax_nan_loses(ay, amax_f32(&v[..cw]));
                                    }
                                }
                            }
                        }
                    },
                );
                (ax, ay, cols, wide)
            },
        )
        .map(|(ax, ay, cols, _)| (ax, ay, cols))
        .reduce(
            || (0.0, 0.0, vec![0f32; if want_cols { k } else { 0 }]),
            |(ax, ay, mut ca), (bx, by, cb)| {
                for (a, b) in ca.iter_mut().zip(cb) {
                    *a = fmax_nan_loses(*a, b);
                }
                (fmax_nan_loses(ax, bx), fmax_nan_loses(ay, by), ca)
            },
        );
    out.x = ax;
    // Some groups folded the maxima of the unrounded sums: rounding is monotone and odd,
    // so this is the largest rounded value (and a no-op on rounded ones).
    out.y = bf16::from_f32(ay).to_f32();
    out.cols = cols;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values around everything that matters to the rule: a dense grid over `[-8, 8]`,
    /// both neighbours of every multiple of 1/64 there (grid points, region boundaries,
    /// midpoints), specials, and a stride through all bit patterns.
    fn probe_values() -> Vec<f32> {
        let mut v: Vec<f32> = (-16384..=16384).map(|k| k as f32 / 2048.0).collect();
        for k in -512..=512 {
            let x = k as f32 / 64.0;
            v.extend([x.next_up(), x.next_down()]);
        }
        v.extend([
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7FC0_1234),
            f32::from_bits(0xFF80_0001),
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x8000_0001),
            f32::MAX,
            f32::MIN,
            3.0e38,
            -3.0e38,
        ]);
        v.extend((0..=u32::MAX / 4099).map(|i| f32::from_bits(i * 4099)));
        v
    }

    #[test]
    fn sr_code_equals_rule_then_encode() {
        let values = probe_values();
        for r in 0..256u32 {
            for &v in &values {
                let want = e2m1::encode(sr::stochastic_round_e2m1(v, r));
                assert_eq!(
                    sr_code(v, r),
                    want,
                    "v = {v:e} ({:#010x}), r = {r}",
                    v.to_bits()
                );
            }
        }
    }

    #[test]
    fn philox_lanes_equal_block_bits() {
        for (seed, dir, row) in [
            (0u64, sr::DIR_ROWWISE, 0u64),
            (7, sr::DIR_COLUMNWISE, 12_345),
            (u64::MAX, sr::DIR_ROWWISE, u64::MAX - 3),
            (0x0123_4567_89AB_CDEF, sr::DIR_COLUMNWISE, 1 << 40),
        ] {
            let block: [u32; LANES] = std::array::from_fn(|l| (l as u32).wrapping_mul(0x9E37_79B9));
            let lo: [u32; LANES] = std::array::from_fn(|l| row as u32 ^ l as u32);
            let hi: [u32; LANES] =
                std::array::from_fn(|l| ((row >> 32) as u32).wrapping_add(l as u32));
            let got = philox_lanes(&block, &lo, &hi, dir, seed);
            for l in 0..LANES {
                let r = u64::from(lo[l]) | (u64::from(hi[l]) << 32);
                let want = sr::block_bits(seed, dir, r, block[l]);
                let lane = [got[0][l], got[1][l], got[2][l], got[3][l]];
                assert_eq!(lane, want, "seed {seed} dir {dir} row {r} lane {l}");
            }
        }
    }

    #[test]
    fn group_words_follow_block_bits_at_every_level() {
        for (seed, group, c0) in [
            (0u64, 0u32, 0usize),
            (u64::MAX, u32::MAX, (1 << 32) - 40),
            (0x0123_4567_89AB_CDEF, 77, 1 << 40),
        ] {
            quant_core::simd::for_each_supported_level(|level| {
                // Whole chunks and a ragged one (the last step's spare lanes are made
                // too; only `cw` columns are read).
                for cw in [CHUNK, 48, 16] {
                    let mut words = [[0xEEEE_EEEEu32; CHUNK]; 4];
                    group_words(level, group, (c0, cw), seed, &mut words);
                    for (c, &w0) in words[0][..cw].iter().enumerate() {
                        let want = sr::block_bits(seed, sr::DIR_COLUMNWISE, (c0 + c) as u64, group);
                        let got = [w0, words[1][c], words[2][c], words[3][c]];
                        assert_eq!(got, want, "{level} seed {seed} group {group} c0 {c0} c {c}");
                    }
                    for w in &words {
                        assert!(
                            w[cw.next_multiple_of(LANES)..]
                                .iter()
                                .all(|&v| v == 0xEEEE_EEEE)
                        );
                    }
                }
            });
        }
    }

    #[test]
    fn row_bytes_follow_block_bits_at_every_level() {
        for (seed, row) in [
            (0u64, 0u64),
            (u64::MAX, u64::MAX - 3),
            (0x0123_4567_89AB_CDEF, 1 << 40),
        ] {
            let blocks: [u32; LANES] =
                std::array::from_fn(|l| (l as u32).wrapping_mul(0x9E37_79B9) ^ row as u32);
            quant_core::simd::for_each_supported_level(|level| {
                // Whole (16 blocks, the AVX-512 kernel there) and partial runs.
                for n in [LANES, 5, 1] {
                    let mut out = [[0xEEu8; BLOCK]; LANES];
                    row_bytes(level, &blocks, row, seed, &mut out[..n]);
                    for (l, got) in out.iter().enumerate() {
                        let words = sr::block_bits(seed, sr::DIR_ROWWISE, row, blocks[l]);
                        let want: [u8; BLOCK] = std::array::from_fn(|e| {
                            if l < n {
                                sr::element_bits(&words, e) as u8
                            } else {
                                0xEE
                            }
                        });
                        assert_eq!(*got, want, "{level} seed {seed} row {row} n {n} block {l}");
                    }
                }
            });
        }
    }

    #[test]
    fn span_bytes_follow_block_bits_at_every_level() {
        for (seed, row, kb0) in [
            (0u64, 0u64, 0usize),
            (u64::MAX, u64::MAX - 3, 7),
            (0x0123_4567_89AB_CDEF, 1 << 40, (1 << 32) - 40),
        ] {
            quant_core::simd::for_each_supported_level(|level| {
                // Runs of 32 (the AVX-512 calls), of 16 and partial runs after them.
                for n in [0, 1, 16, 31, 32, 33, 48, 64, 100] {
                    let mut out = vec![[0xEEu8; BLOCK]; n];
                    span_bytes(level, kb0, row, seed, &mut out);
                    for (l, got) in out.iter().enumerate() {
                        let block = (kb0 + l) as u32;
                        let words = sr::block_bits(seed, sr::DIR_ROWWISE, row, block);
                        let want: [u8; BLOCK] =
                            std::array::from_fn(|e| sr::element_bits(&words, e) as u8);
                        assert_eq!(*got, want, "{level} seed {seed} row {row} n {n} block {l}");
                    }
                }
            });
        }
    }

    #[test]
    fn sr_code_keeps_signed_zero_and_nan_rule() {
        assert_eq!(sr_code(-0.0, 255), 0x8);
        assert_eq!(sr_code(-0.1, 0), 0x8);
        assert_eq!(sr_code(f32::NAN, 0), 0x7);
        assert_eq!(sr_code(-f32::NAN, 255), 0x7);
        assert_eq!(sr_code(f32::NEG_INFINITY, 0), 0xF);
        assert_eq!(sr_code(-100.0, 3), 0xF);
    }

    /// The 2-D walk that transposes the rowwise codes ([`two_d_transposed`]) equals the
    /// scalar specification: on shapes that cross its windows (1024 columns under
    /// `cfg(test)`) and end in partial windows, chunks and slabs; with columnwise-only
    /// and both usages, compact and swizzled scales, f32, bf16 and f16 input, at every
    /// SIMD level; and with given amaxes, equal (this walk) and unequal (the slab walk,
    /// whose codes do depend on the direction). Tiles lie orders of magnitude apart, so
    /// a tile scale or code taken from the wrong tile or window changes bytes; NaN,
    /// infinities, zeros and subnormals are sprinkled in.
    #[test]
    fn two_d_transposed_equals_the_specification() {
        use crate::{Nvfp4Quantizer, reference};
        use quant_core::{DType, Format, HostTensor, Usage};
        let shapes = [[16, 1040], [272, 1552], [32, 2048]];
        let input = |m: usize, k: usize| -> Vec<f32> {
            let mut rng = quantfmt_testkit::XorShift64::scrambled((m * k) as u64);
            (0..m * k)
                .map(|i| {
                    let (r, c) = (i / k, i % k);
                    let s = rng.next_u64();
                    let scale = 2f32.powi(((r / 16 * 7 + c / 16 * 3) % 41) as i32 - 20);
                    match s % 211 {
                        0 => f32::NAN,
                        1 => f32::INFINITY,
                        2 => f32::NEG_INFINITY,
                        3 => -0.0,
                        4 => f32::from_bits(1 + (s >> 40) as u32 % 1000),
                        _ => (quantfmt_testkit::unit_f64(s) as f32 - 0.5) * 12.0 * scale,
                    }
                })
                .collect()
        };
        let mut checked = 0;
        quant_core::simd::for_each_supported_level(|level| {
            for [m, k] in shapes {
                let base = input(m, k);
                for dtype in [DType::F32, DType::BF16, DType::F16] {
                    let x = HostTensor::f32(&base, &[m, k])
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap();
                    for usage in [Usage::COLUMNWISE, Usage::BOTH] {
                        for opts in [vec!["2d"], vec!["2d", "swizzled"]] {
                            let q = Nvfp4Quantizer::from_spec(&opts, usage).unwrap();
                            let amaxes = [None, Some((3.5e3, 3.5e3)), Some((2.0, 7.0))];
                            for amax in amaxes {
                                let fast = match amax {
                                    None => q.quantize(&x).unwrap(),
                                    Some((r, c)) => q.quantize_with_amax(&x, r, c).unwrap(),
                                };
                                let spec = reference::quantize_with(&q, &x, amax).unwrap();
                                for (a, b) in fast.buffers().iter().zip(spec.buffers()) {
                                    let at =
                                        a.bytes().iter().zip(b.bytes()).position(|(p, q)| p != q);
                                    assert_eq!(
                                        at,
                                        None,
                                        "{level} [{m}, {k}] {dtype} {usage} {opts:?} {amax:?}: {}",
                                        a.name()
                                    );
                                }
                                checked += 1;
                            }
                        }
                    }
                }
            }
        });
        assert!(checked >= 108, "{checked}");
    }
}
