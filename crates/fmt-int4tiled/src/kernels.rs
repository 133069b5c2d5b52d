//! Fast quantize, pack and dequantize: no per-nibble loop.
//!
//! **Quantize.** torchao divides every element by the group's scale. The two qparam
//! paths ([`QParamsPath`]) take that division in two forms:
//!
//! * **f32 path (f32 and f16 input): the division itself.** `(x - min_val) / scale` in
//!   f32 is the specification, and a vector division is cheap enough here: on Zen 4 the
//!   quantize ran as fast with `vdivps` as with the multiply by the reciprocal it
//!   replaced, and x1.36 faster from f16, whose short significands land quotients on
//!   nibble boundaries so often that the multiply's exactness check (a quotient within
//!   two ulps of a half-integer) sent most groups down a second, exact pass.
//! * **bf16 path, f32 reciprocal.** `rb(t * r)` with `r = f32(1 / scale)` equals
//!   `rb(t / scale)` wherever `r` is a normal f32 (`2^-126 <= scale < 2^126`). `t` and
//!   the scale are bf16 values (8 significant bits), so the quotient `Q = t / scale` is
//!   never a bf16 rounding midpoint (its odd part would need 9 bits, more than `t` has),
//!   and it is at least `2^-17` (relative) away from every midpoint: scaled into
//!   `[256, 512)`, `Q` is an integer over the scale's 8-bit significand `b`, so its
//!   distance from an odd integer is at least `1/b`. Two f32 roundings (the reciprocal
//!   and the product) move it less than `2^-23`, so the bf16 rounding and the nibble are
//!   the same. (Quotients below `2^-126` give nibble 0 either way.) A test checks every
//!   bf16 numerator against a sweep of scales, and an ignored test checks all 2^31 pairs.
//!   The multiply stays here because AVX-512 BF16 then rounds both products in one
//!   instruction per 32 values ([`crate::x86`]). Other scales (and an infinite
//!   `min_val`) take the division, the specification itself.
//!
//! `tests/simd_levels.rs` compares the kernels with the division on every bf16 value and
//! on random f32 groups; this module's tests cover the boundary cases of each form.
//!
//! **Pack.** Lane `t` of an n-tile holds, per 32-wide k block, one word whose nibble `q`
//! (`q < 4`) is `u[8q + 2(t%4)]` and nibble `q + 4` is `u[8q + 2(t%4) + 1]`. Read the
//! block's 32 nibbles as sixteen u16 pairs `(u[2i], u[2i+1])` zero-extended to u32
//! (`e[i] = u[2i] | u[2i+1] << 16`): then word `c` is `e[c] | e[4+c] << 4 | e[8+c] << 8 |
//! e[12+c] << 12`, four vector shifts and ORs per 32 nibbles. Unpacking inverts it:
//! `e[4q + c] = (word_c >> 4q) & 0x000F000F`.
//!
//! **Dequantize.** `w = (u - 8) * scale + zero` rounded once: `p = (u - 8) * scale` is
//! exact in f32; for f32 output `p + zero` is the correctly rounded sum; for bf16/f16 the
//! rounding error of that sum (TwoSum, exact) turns it into a round-to-odd f32, whose
//! round-to-nearest-even narrowing is the single rounding of the exact value (see
//! [`crate::dequant`] for the f64 specification it equals). That arithmetic runs 16
//! times per group, once per nibble value, into a table; every output is then a lookup.
//! At AVX-512 the table never leaves a register (one group's 16 f32, or two groups'
//! 16 + 16 bf16 or f16) and each 32 outputs are a register permute of it
//! ([`crate::x86`]); lower levels look up tables kept in memory.

use half::bf16;
use quant_core::dtype::Bits16;
#[cfg(target_arch = "x86_64")]
use quant_core::dtype::{bf16_slice_bits, f16_slice_bits};
use quant_core::simd::{self, Level};
use quant_core::stream::{Fence, StoreMode, write_bytes};
use quant_core::strips::Strip;
use quant_core::{DType, Element, widened};

use crate::format::Geometry;
use crate::layout::{K_TILE, LANES, N_TILE};
use crate::qparams::{
    GroupParams, QParamsPath, group_params_batch, min_max, min_max_bf16, min_max_f16, rb, to_nibble,
};

/// Nibbles of one group: `u = to_nibble(op((x - min_val) / scale))`.
///
/// The f32 path divides (module docs), f16 input widened in registers at AVX-512 and
/// AVX2 ([`crate::x86::F16Nibbles`]). On the bf16 path, where the scale's reciprocal
/// is a normal f32 ([`f32_reciprocal`]) and `min_val` is finite, one f32 multiply by it
/// stands in for the division (exact there, module docs); with bf16 input at
/// [`Level::Avx512`] with VBMI, both roundings run 32 values at a time in registers
/// ([`crate::x86::Bf16Nibbles`]: AVX-512 BF16 in hardware where the scale is at least
/// 2^-100, its subnormal flush then unable to change a nibble; integer rounding on CPUs
/// without BF16, x1.13-1.38 over the portable loop with BF16 hidden on Zen 4).
#[inline(always)]
fn group_nibbles<T: Element>(
    caps: Caps,
    path: QParamsPath,
    xs: &[T],
    p: &GroupParams,
    u: &mut [u8],
) {
    // The reciprocal serves the bf16 path only (the f32 path divides).
    let reciprocal = match path {
        QParamsPath::Bf16 if p.min_val.is_finite() => f32_reciprocal(p.scale),
        _ => None,
    };
    match (path, reciprocal) {
        (QParamsPath::Bf16, Some(r)) => {
            #[cfg(target_arch = "x86_64")]
            if let Some(hw) = caps.nibbles_bf16
                && p.scale >= MIN_HARDWARE_SCALE
                && let Some(bits) = bf16_slice_bits(xs)
                && hw.run(bits, p.min_val, r, u)
            {
                return;
            }
            let _ = caps;
            for (o, &x) in u.iter_mut().zip(xs) {
                *o = to_nibble(rb_no_nan(rb_no_nan(x.to_f32() - p.min_val) * r));
            }
        }
        (QParamsPath::Bf16, None) => {
            for (o, &x) in u.iter_mut().zip(xs) {
                *o = to_nibble(rb(rb(x.to_f32() - p.min_val) / p.scale));
            }
        }
        (QParamsPath::F32, _) => {
            #[cfg(target_arch = "x86_64")]
            if let Some(hw) = caps.nibbles_f16
                && let Some(bits) = f16_slice_bits(xs)
                && hw.run(bits, p.min_val, p.scale, u)
            {
                return;
            }
            for (o, &x) in u.iter_mut().zip(xs) {
                *o = to_nibble((x.to_f32() - p.min_val) / p.scale);
            }
        }
    }
}

/// What [`group_nibbles`] and [`pack_row`] may run: the dispatch level's hardware
/// kernels, found once per task (probed per group, the features cost 5 % of the bf16
/// quantize).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caps {
    #[cfg(target_arch = "x86_64")]
    nibbles_bf16: Option<crate::x86::Bf16Nibbles>,
    #[cfg(target_arch = "x86_64")]
    nibbles_f16: Option<crate::x86::F16Nibbles>,
    #[cfg(target_arch = "x86_64")]
    packer: Option<crate::x86::Packer>,
    #[cfg(target_arch = "x86_64")]
    batch_bf16: Option<crate::batch_x86::BatchKernel>,
    #[cfg(target_arch = "x86_64")]
    batch_f16: Option<crate::batch_x86::BatchKernel>,
}

impl Caps {
    /// Whether f16 input has its own nibble kernel here (else it is widened first).
    #[inline(always)]
    fn reads_f16(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return self.nibbles_f16.is_some();
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// The kernels of `level` that this CPU has.
    pub(crate) fn new(level: Level) -> Caps {
        #[cfg(target_arch = "x86_64")]
        return Caps {
            nibbles_bf16: crate::x86::Bf16Nibbles::detect(level),
            nibbles_f16: crate::x86::F16Nibbles::detect(level),
            packer: crate::x86::Packer::detect(level),
            batch_bf16: crate::batch_x86::BatchKernel::detect(level, DType::BF16),
            batch_f16: crate::batch_x86::BatchKernel::detect(level, DType::F16),
        };
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = level;
            Caps {}
        }
    }
}

/// Smallest scale [`group_nibbles`] hands to the hardware bf16 rounding: 2^-100.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const MIN_HARDWARE_SCALE: f32 = f32::from_bits(27 << 23);

/// [`rb`] of a value that is not NaN (infinities are fine): the rounding without the NaN
/// select. On the fast path nothing is NaN: a group holding a NaN or an infinity has a
/// NaN or infinite scale, and a huge eps can make `min_val` infinite; both take the
/// division, so `x - min_val` is finite (or overflows to infinity) and so is every
/// product after it.
#[inline(always)]
pub(crate) fn rb_no_nan(x: f32) -> f32 {
    let b = x.to_bits();
    f32::from_bits(b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000)
}

/// `1 / scale` rounded to f32, where that is a normal number: `2^-126 <= scale < 2^126`
/// (`None` otherwise: a subnormal eps, an eps near `f32::MAX`, an infinite scale).
#[inline(always)]
fn f32_reciprocal(scale: f32) -> Option<f32> {
    const TWO_126: f32 = f32::from_bits(253 << 23);
    (f32::MIN_POSITIVE..TWO_126)
        .contains(&scale)
        .then(|| 1.0 / scale)
}

/// The four words of one 32-nibble k block (`u`, values below 16; module docs).
///
/// In bytes: with `Q_i` the u64 of `u[8i..8i+8]`, `V = Q0 | Q1 << 4` and `W = Q2 | Q3 << 4`
/// hold two nibbles per byte, and the words are the bytes of `V` and `W` interleaved
/// (`V0 W0 V1 W1 ..`): word `c` is `V[2c] | W[2c] << 8 | V[2c+1] << 16 | W[2c+1] << 24`,
/// whose nibbles are `u[2c], u[8+2c], u[16+2c], u[24+2c], u[2c+1], ..` as the layout
/// wants. A dozen u64/u128 operations instead of 32 nibble moves.
#[inline(always)]
fn pack32(u: &[u8; 32]) -> [u32; 4] {
    let q = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&u[8 * i..8 * i + 8]);
        u64::from_le_bytes(b) & 0x0F0F_0F0F_0F0F_0F0F
    };
    let v = q(0) | (q(1) << 4);
    let w = q(2) | (q(3) << 4);
    let b = spread_bytes(v) | (spread_bytes(w) << 8);
    [
        b as u32,
        (b >> 32) as u32,
        (b >> 64) as u32,
        (b >> 96) as u32,
    ]
}

/// Inverse of [`pack32`], into u16 lanes: nibble `j` of the block is lane `j`.
///
/// Each word `c` holds, at bits `4q` and `16 + 4q`, the nibble pair `e[4q + c]` of the
/// module docs; shifting a word and masking with `0x000F000F` leaves that pair as two
/// u16 lanes. The portable loop's unpacking; [`crate::x86`] does the same sixteen
/// shifts as one broadcast, one variable shift and one AND, and indexes its table
/// permute with the lanes directly.
#[inline(always)]
fn unpack32(words: [u32; 4]) -> [u16; 32] {
    const SHIFT: [u32; 16] = [0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12];
    let e: [u32; 16] = std::array::from_fn(|i| (words[i % 4] >> SHIFT[i]) & 0x000F_000F);
    // Little-endian u32 lanes are (low u16, high u16) pairs: the cast is the split.
    #[cfg(target_endian = "little")]
    let u = bytemuck::cast(e);
    #[cfg(target_endian = "big")]
    let u = std::array::from_fn(|j| (e[j / 2] >> (16 * (j % 2))) as u16);
    u
}

/// Byte `j` of `x` to byte `2j` of the result (odd bytes zero).
#[inline(always)]
fn spread_bytes(x: u64) -> u128 {
    let x = u128::from(x);
    let x = (x | (x << 32)) & 0x0000_0000_FFFF_FFFF_0000_0000_FFFF_FFFF;
    let x = (x | (x << 16)) & 0x0000_FFFF_0000_FFFF_0000_FFFF_0000_FFFF;
    (x | (x << 8)) & 0x00FF_00FF_00FF_00FF_00FF_00FF_00FF_00FF
}

/// Packs one row's nibbles `u` (`k_padded` of them) into its n-tile's words: with the
/// AVX-512 packer in `caps` ([`crate::x86::Packer`]), elsewhere block by block with
/// [`pack32`].
#[inline(always)]
pub(crate) fn pack_row(caps: Caps, u: &[u8], nr: usize, ikt: usize, words: &mut [i32]) {
    let half = ikt / 2;
    #[cfg(target_arch = "x86_64")]
    if let Some(packer) = caps.packer
        && packer.run(u, nr, half, words)
    {
        return;
    }
    let _ = caps;
    let slab = ikt * K_TILE;
    for (kot, us) in u.chunks_exact(slab).enumerate() {
        for (p, ub) in us.chunks_exact(32).enumerate() {
            let Ok(ub) = <&[u8; 32]>::try_from(ub) else {
                continue;
            };
            for (c, w) in pack32(ub).into_iter().enumerate() {
                words[(kot * LANES + nr * 4 + c) * half + p] = w as i32;
            }
        }
    }
}

/// Where one row's nibbles live: its n-tile's words, its row within the tile, and the
/// tile's `inner_k_tiles / 2`.
#[derive(Clone, Copy)]
pub(crate) struct RowWords<'a> {
    /// The n-tile's `k_padded` words.
    pub tile: &'a [i32],
    /// The row within the n-tile (`< 8`).
    pub nr: usize,
    /// `inner_k_tiles / 2`: 1, 2 or 4.
    pub half: usize,
    /// Words the dequantize brings into cache while it reads this row, a line per slab
    /// (the next tile's share for this row; may be empty).
    pub ahead: &'a [i32],
}

impl RowWords<'_> {
    /// The four words of 32-wide block `block` (`[c]`, lanes `nr·4 + c`).
    #[inline(always)]
    fn block_words(&self, block: usize) -> [u32; 4] {
        let (kot, p) = (block / self.half, block % self.half);
        let lanes = &self.tile[(kot * LANES + self.nr * 4) * self.half + p..];
        std::array::from_fn(|c| lanes[c * self.half] as u32)
    }

    /// The distance in `ahead` between the words a `k`-column walk fetches at the first
    /// block of consecutive slabs: its whole share spread over the row's slabs.
    #[inline(always)]
    pub(crate) fn ahead_step(&self, k: usize) -> usize {
        self.ahead.len().div_ceil(k.div_ceil(32 * self.half).max(1))
    }

    /// Whether the kernels may read the words of the first `k` columns (`k` a multiple
    /// of 32): the row's last slab lies inside the tile.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn covers(&self, k: usize) -> bool {
        let slabs = k.div_ceil(32 * self.half);
        matches!(self.half, 1 | 2 | 4)
            && self.nr < N_TILE
            && slabs * LANES * self.half <= self.tile.len()
    }
}

/// The most groups whose qparams one quantize step computes together.
const BATCH: usize = 16;

/// Input bytes of one quantize step: 4 groups of 128 f32, 8 of bf16. A step's min/max
/// is one burst of loads and its nibbles and qparams a stretch of compute with none; on
/// Zen 4, 8192^2 quantized x1.20 faster (f32) and x1.08 (bf16) in steps of this size
/// than in steps of 16 groups (8 KiB / 4 KiB), and 1 KiB steps of f32 lost some again.
const STEP_BYTES: usize = 2048;

/// How far ahead of the group being packed its input is prefetched: two steps' worth.
/// The hardware prefetcher alone left the first loads of each step waiting on memory
/// (a third of a single-thread profile); one group's lines per group, 4 KiB ahead,
/// spreads the hints through the compute, where a step's lines prefetched in one burst
/// had measured x0.87-1.00.
const PREFETCH_BYTES: usize = 4096;

/// Groups per quantize step: [`STEP_BYTES`] of `T` input, between 1 and [`BATCH`].
#[inline(always)]
fn batch_groups<T>(g: usize) -> usize {
    (STEP_BYTES / (g * std::mem::size_of::<T>()).max(1)).clamp(1, BATCH)
}

/// Scratch of one quantize task.
pub(crate) struct Scratch {
    wide: Vec<f32>,
    u: Vec<u8>,
    /// The n-tile's (scale, zero) pairs, `[group][8 rows][2]` as its strip holds them,
    /// written to the strip a group at a time once the tile is done. The strip's rows
    /// lie `4·n_padded` bytes apart (32 KiB at n = 8192: all in one L1 set), and stored
    /// pair by pair, as rows were quantized, they missed L1 (about 3 % of the bf16
    /// quantize profile, on one store).
    pairs: Vec<bf16>,
    /// Under [`StoreMode::Streaming`], the n-tile's words, packed here row by row and
    /// then streamed out whole (`None`: packed straight into the output).
    staged: Option<Vec<i32>>,
}

impl Scratch {
    /// Scratch for quantizing n-tiles of `geo` whose words are written in `mode`.
    ///
    /// Each row of an n-tile writes one 64-byte line in every 512 bytes of the tile (at
    /// `inner_k_tiles` = 8), and the tile's words are written nowhere else: under
    /// streaming, rows packed into a tile kept in cache and streamed out whole spare
    /// every output line its read for ownership: for bf16 input (four times the bytes
    /// of its words) a read of a quarter of the input.
    pub(crate) fn new(geo: &Geometry, mode: StoreMode) -> Scratch {
        let staged = match mode {
            StoreMode::Streaming => Some(vec![0; geo.k_padded]),
            StoreMode::Cached => None,
        };
        Scratch {
            wide: vec![0.0; BATCH * geo.group_size],
            u: vec![0; geo.k_padded],
            pairs: vec![bf16::ZERO; geo.groups() * N_TILE * 2],
            staged,
        }
    }
}

/// Quantizes the n-tile `nt` of one expert (`x` is the expert's `[n, k]`) into its
/// `k_padded` words and its scale/zero strip (`[groups][16]` bf16: 8 rows x (scale,
/// zero)). `pad` is what an all-zero group gets.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn quantize_tile<T: Element>(
    level: Level,
    path: QParamsPath,
    eps: f32,
    geo: &Geometry,
    x: &[T],
    nt: usize,
    words: &mut [i32],
    sz: &mut Strip<'_, bf16>,
    pad: (bf16, bf16),
    s: &mut Scratch,
) {
    let g = geo.group_size;
    let caps = Caps::new(level);
    for nr in 0..N_TILE {
        let n = nt * N_TILE + nr;
        let real = if n < geo.n { geo.logical_groups() } else { 0 };
        let row = Row {
            caps,
            path,
            eps,
            geo,
            x,
            n,
            real,
            nr,
        };
        if !row.batched(s) {
            row.grouped(s);
        }
        s.u[real * g..].fill(0);
        for gi in real..geo.groups() {
            set_pair(&mut s.pairs, gi, nr, pad);
        }
        let dst = s.staged.as_deref_mut().unwrap_or(&mut *words);
        pack_row(caps, &s.u, nr, geo.inner_k_tiles, dst);
    }
    for (gi, pairs) in s.pairs.chunks_exact(N_TILE * 2).enumerate() {
        sz.row_mut(gi).copy_from_slice(pairs);
    }
    if let Some(staged) = &s.staged {
        let (src, dst) = (
            bytemuck::cast_slice(staged),
            bytemuck::cast_slice_mut(words),
        );
        write_bytes(level, src, dst, StoreMode::Streaming, &Fence::new());
    }
}

/// Row `nr`'s (scale, zero) of group `gi` in a tile's pairs (`Scratch::pairs`).
#[inline(always)]
fn set_pair(pairs: &mut [bf16], gi: usize, nr: usize, (scale, zero): (bf16, bf16)) {
    let at = (gi * N_TILE + nr) * 2;
    pairs[at] = scale;
    pairs[at + 1] = zero;
}

/// One row of an n-tile to quantize: row `n` of the expert `x`, row `nr` of its tile,
/// with `real` groups (0 for a padding row). Its nibbles go to `Scratch::u`, its pairs
/// to `Scratch::pairs`.
struct Row<'a, T> {
    caps: Caps,
    path: QParamsPath,
    eps: f32,
    geo: &'a Geometry,
    x: &'a [T],
    n: usize,
    real: usize,
    nr: usize,
}

impl<T: Element> Row<'_, T> {
    /// The row through the AVX-512 batch kernel ([`crate::batch_x86`]), 16 groups per
    /// call, where this CPU has it and the input is bf16 or f16; groups whose qparams the
    /// kernel's nibbles do not cover take [`group_nibbles`]. Returns `false` (nothing
    /// written, or what [`Self::grouped`] then overwrites) where the kernel does not
    /// apply.
    #[inline(always)]
    fn batched(&self, s: &mut Scratch) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::batch_x86::{Batch, GROUPS};
            // bf16 takes the bf16 qparams path, f16 the f32 one.
            let (kernel, bits) = match (Bits16::of(self.x), self.path) {
                (Some(Bits16::Bf16(b)), QParamsPath::Bf16) => (self.caps.batch_bf16, b),
                (Some(Bits16::F16(b)), QParamsPath::F32) => (self.caps.batch_f16, b),
                _ => return false,
            };
            let Some(kernel) = kernel else {
                return false;
            };
            let g = self.geo.group_size;
            let ahead = PREFETCH_BYTES / 2;
            let mut b = Batch::default();
            for g0 in (0..self.real).step_by(GROUPS) {
                let nb = GROUPS.min(self.real - g0);
                let at = self.n * self.geo.k + g0 * g;
                // Rows are consecutive in `x`, so the lines ahead run on into the next row.
                let next = bits.get(at + ahead..).unwrap_or(&[]);
                let next = &next[..next.len().min(nb * g)];
                let u = &mut s.u[g0 * g..(g0 + nb) * g];
                if !kernel.run(&bits[at..at + nb * g], g, self.eps, u, next, &mut b) {
                    return false;
                }
                for (i, ui) in u.chunks_exact_mut(g).enumerate() {
                    let p = b.params(i);
                    if b.done & (1 << i) == 0 {
                        let xi = &self.x[at + i * g..at + (i + 1) * g];
                        group_nibbles(self.caps, self.path, xi, &p, ui);
                    }
                    set_pair(&mut s.pairs, g0 + i, self.nr, (p.scale_bf16, p.zero_bf16));
                }
            }
            true
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = s;
            false
        }
    }

    /// The row a batch of groups at a time: their min/max first, then their qparams
    /// (independent scalar chains the core overlaps, where one group's chain used to
    /// stall the next group's vector work), then their nibbles.
    #[inline(always)]
    fn grouped(&self, s: &mut Scratch) {
        let (g, x, caps, path) = (self.geo.group_size, self.x, self.caps, self.path);
        let batch = batch_groups::<T>(g);
        let ahead = PREFETCH_BYTES / std::mem::size_of::<T>();
        for g0 in (0..self.real).step_by(batch) {
            let nb = batch.min(self.real - g0);
            let at = self.n * self.geo.k + g0 * g;
            let src = &x[at..at + nb * g];
            let (mut lo, mut hi) = ([0f32; BATCH], [0f32; BATCH]);
            // bf16 is read as it is: its extremes from the bits, its nibbles widened in
            // registers; so is f16 where its nibble kernel runs. Otherwise 16-bit input is
            // widened once into the scratch.
            let bits = match Bits16::of(src) {
                Some(Bits16::F16(_)) if !caps.reads_f16() => None,
                b => b,
            };
            let w: &[f32] = match bits {
                Some(b) => {
                    let min_max_of = match b {
                        Bits16::Bf16(_) => min_max_bf16,
                        Bits16::F16(_) => min_max_f16,
                    };
                    for (i, bg) in b.bits().chunks_exact(g).enumerate() {
                        (lo[i], hi[i]) = min_max_of(bg);
                    }
                    &[]
                }
                None => {
                    let w = widened(src, &mut s.wide[..nb * g]);
                    for (i, wg) in w.chunks_exact(g).enumerate() {
                        (lo[i], hi[i]) = min_max(wg);
                    }
                    w
                }
            };
            let params = group_params_batch(path, &lo, &hi, self.eps);
            for (i, p) in params[..nb].iter().enumerate() {
                let gi = g0 + i;
                let u = &mut s.u[gi * g..(gi + 1) * g];
                match bits {
                    Some(_) => group_nibbles(caps, path, &src[i * g..(i + 1) * g], p, u),
                    None => group_nibbles(caps, path, &w[i * g..(i + 1) * g], p, u),
                }
                // Rows are consecutive in `x`, so the lines ahead run on into the next row.
                if let Some(lines) = x.get(at + i * g + ahead..at + (i + 1) * g + ahead) {
                    simd::prefetch(lines);
                }
                set_pair(&mut s.pairs, gi, self.nr, (p.scale_bf16, p.zero_bf16));
            }
        }
    }
}

/// Per-task state of [`dequantize_rows`]: how it stores its output, the task's
/// (scale, zero) pairs as `[row][group]`, and, for the levels below AVX-512 (which
/// build each table in a register instead), one row's group tables, first as the f32
/// values of [`group_values`], then narrowed to `T` in one call (a call per group of 16
/// cost as much as the lookups themselves).
pub(crate) struct RowTables<T> {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    mode: StoreMode,
    pairs: Vec<[f32; 2]>,
    wide: Vec<f32>,
    tables: Vec<[T; 16]>,
}

impl<T> RowTables<T> {
    /// Empty tables for a task that stores in `mode` (streaming applies at AVX-512).
    pub(crate) fn new(mode: StoreMode) -> Self {
        Self {
            mode,
            pairs: Vec::new(),
            wide: Vec::new(),
            tables: Vec::new(),
        }
    }
}

/// Dequantizes rows `n0..n0+out.len()/k` of one expert (`words`, `sz` are the expert's)
/// into `out` (`[rows, k]`). `scratch` is reused across calls.
///
/// A group's outputs take at most 16 values (one per nibble), computed with the exact
/// arithmetic of [`group_values`]; then every output is a lookup of its nibble. At
/// AVX-512 each table is built in a register as the row goes
/// ([`crate::x86::dequant_row`]); below, the row's tables are computed into memory first
/// and looked up block by block: at AVX2 by [`crate::x86_avx2::lookup`], otherwise from
/// [`unpack32`]. Only the logical `k` is read: `k` is
/// a multiple of the group size, hence of 32.
#[inline(always)]
pub(crate) fn dequantize_rows<T: Element>(
    level: Level,
    geo: &Geometry,
    words: &[i32],
    sz: &[bf16],
    n0: usize,
    out: &mut [T],
    scratch: &mut RowTables<T>,
) {
    let _ = level; // only the x86-64 build has kernels to choose
    // Orders the AVX2 lookup's streamed stores (f32 rows) when the task ends.
    let _fence = quant_core::stream::Fence::new();
    let (k, g) = (geo.k, geo.group_size);
    let half = geo.inner_k_tiles / 2;
    let groups = k / g;
    scratch.wide.resize(groups * 16, 0.0);
    scratch.tables.resize(groups, [T::from_f32(0.0); 16]);
    // `sz` is `[groups][n_padded][2]`: one row's pairs lie `n_padded` pairs apart, at a
    // stride that maps all of them to the same cache sets. Read the task's rows group by
    // group instead (its rows' pairs are adjacent), into `[row][group]`.
    let rows = out.len() / k.max(1);
    scratch.pairs.resize(rows * groups, [0.0; 2]);
    for gi in 0..groups {
        let at = (gi * geo.n_padded + n0) * 2;
        for (r, sz) in sz[at..at + 2 * rows].chunks_exact(2).enumerate() {
            scratch.pairs[r * groups + gi] = [sz[0].to_f32(), sz[1].to_f32()];
        }
        // The next task's rows (most often this worker's next task) follow: fetch their
        // pairs now, a line per group that no hardware prefetcher predicts.
        if let Some(ahead) = sz.get(at + 2 * rows..at + 4 * rows) {
            quant_core::simd::prefetch(ahead);
        }
    }
    for (r, row) in out.chunks_exact_mut(k).enumerate() {
        let n = n0 + r;
        let (nt, nr) = (n / N_TILE, n % N_TILE);
        let tile = &words[nt * geo.k_padded..(nt + 1) * geo.k_padded];
        // A row reads its lanes' words of every slab, the tile's lines in a stride the
        // hardware prefetchers leave exposed: each row brings an eighth of the next tile
        // into L2 as it goes, which covers it by the time its first row starts. (The
        // same hints as a burst into L1 before each row stalled on the miss buffers.)
        let next = (nt + 1) * geo.k_padded;
        let part = geo.k_padded / N_TILE;
        let ahead = words
            .get(next + nr * part..next + (nr + 1) * part)
            .unwrap_or(&[]);
        let pairs = &scratch.pairs[r * groups..(r + 1) * groups];
        let lanes = RowWords {
            tile,
            nr,
            half,
            ahead,
        };
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx512 && crate::x86::dequant_row(pairs, g, lanes, row, scratch.mode) {
            continue;
        }
        // Plain loops, not `extend(map)`: they must inline into the dispatched function.
        // f32 tables are the values themselves: made in place (through `wide`, the
        // narrowing was a `memcpy` call per row, 3 % of the f32 dequantize).
        let in_place = match T::DTYPE {
            DType::F32 => bytemuck::try_cast_slice_mut::<[T; 16], f32>(&mut scratch.tables).ok(),
            _ => None,
        };
        if let Some(tables) = in_place {
            for (w, &[s, z]) in tables.chunks_exact_mut(16).zip(pairs) {
                group_values::<T>(s, z, w);
            }
        } else {
            for (w, &[s, z]) in scratch.wide.chunks_exact_mut(16).zip(pairs) {
                group_values::<T>(s, z, w);
            }
            T::narrow_slice(&scratch.wide, bytemuck::cast_slice_mut(&mut scratch.tables));
        }
        let tables = &scratch.tables;
        // The AVX-512 walk's hints: at each slab's first block, a line of this row's
        // share of the next tile (its words' loads otherwise waited on memory). At AVX2
        // the f32 dequantize gained x1.40 in the CLI A/B (27 -> 12.6 ms in process). The
        // 16-bit outputs lost with them (x0.62-0.84) while the lookups divided per block
        // (`32 b / g`); since they walk group by group, bf16 and f16 gain too (CLI A/B,
        // 3 pairs: x2.9 and x1.19).
        let step = lanes.ahead_step(k);
        let words = |b: usize| {
            if b.is_multiple_of(half)
                && let Some(w) = lanes.ahead.get(b / half * step..b / half * step + 1)
            {
                quant_core::simd::prefetch(w);
            }
            lanes.block_words(b)
        };
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx2 && crate::x86_avx2::lookup(tables, g, words, row, scratch.mode) {
            continue;
        }
        for (block, ob) in row.chunks_exact_mut(32).enumerate() {
            let table = &tables[block * 32 / g];
            for (o, u) in ob.iter_mut().zip(unpack32(words(block))) {
                *o = table[usize::from(u)];
            }
        }
    }
}

/// The 16 outputs of a group with scale `s` and zero `z`, as f32 values whose rounding
/// to `T` (round-to-nearest-even) is `T((u - 8) * s + z)` rounded once (see the module
/// docs): the exact sum for f32, its round-to-odd for narrower `T`.
#[inline(always)]
pub(crate) fn group_values<T: Element>(s: f32, z: f32, w: &mut [f32]) {
    match T::DTYPE {
        DType::F32 => {
            for (u, w) in w.iter_mut().enumerate() {
                *w = (u as f32 - 8.0) * s + z;
            }
        }
        _ => {
            for (u, w) in w.iter_mut().enumerate() {
                *w = round_odd_sum((u as f32 - 8.0) * s, z);
            }
        }
    }
}

/// The exact `p + z` rounded to f32 with round-to-odd (non-finite sums as IEEE gives
/// them): TwoSum's error term is the sticky bit.
#[inline(always)]
fn round_odd_sum(p: f32, z: f32) -> f32 {
    let s = p + z;
    let bb = s - p;
    let e = (p - (s - bb)) + (z - bb);
    let bits = s.to_bits();
    // Step the magnitude toward the exact value (e has the direction) when s is even.
    let up = (e > 0.0) == (s > 0.0);
    let stepped = if up {
        bits.wrapping_add(1)
    } else {
        bits.wrapping_sub(1)
    };
    let odd = if e == 0.0 || bits & 1 == 1 {
        bits
    } else {
        stepped
    };
    if s.is_finite() {
        f32::from_bits(odd)
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qparams::group_params;
    use quant_core::simd::{Ext, with_extensions_hidden};
    use quantfmt_testkit::XorShift64;

    /// Word `c`'s nibble `q < 4` is `u[8q + 2c]` and nibble `q + 4` is `u[8q + 2c + 1]`
    /// (the tinygemm lane layout, spelled out one nibble at a time).
    fn pack32_naive(u: &[u8; 32]) -> [u32; 4] {
        std::array::from_fn(|c| {
            (0..4).fold(0u32, |w, q| {
                w | u32::from(u[8 * q + 2 * c]) << (4 * q)
                    | u32::from(u[8 * q + 2 * c + 1]) << (4 * q + 16)
            })
        })
    }

    /// Every bf16 scale whose reciprocal [`group_nibbles`] multiplies by, every `step`-th.
    fn fast_scales(step: usize) -> impl Iterator<Item = f32> {
        (0..0x7F80u16)
            .step_by(step)
            .chain([0x0080, 0x3F80, 0x4040, 0x7E7F, 0x7E80])
            .map(|b| bf16::from_bits(b).to_f32())
            .filter(|&s| f32_reciprocal(s).is_some())
    }

    /// The bf16 path's `rb(t * (1/s))` against `rb(t / s)` for every bf16 `t` (both
    /// signs, zeros, infinities, NaN) and the scales of `fast_scales(step)`.
    fn check_bf16_quotients(step: usize) {
        for s in fast_scales(step) {
            let r = f32_reciprocal(s).unwrap();
            for b in 0..=u16::MAX {
                let t = bf16::from_bits(b).to_f32();
                assert_eq!(
                    to_nibble(rb(t * r)),
                    to_nibble(rb(t / s)),
                    "t = {t:e}, scale = {s:e}"
                );
            }
        }
    }

    #[test]
    fn bf16_reciprocal_gives_the_division_nibble() {
        check_bf16_quotients(97);
    }

    /// All 2^15 scales x 2^16 numerators; run with `cargo test --release -- --ignored`.
    #[test]
    #[ignore]
    fn bf16_reciprocal_gives_the_division_nibble_exhaustively() {
        check_bf16_quotients(1);
    }

    #[test]
    fn reciprocal_range() {
        assert_eq!(f32_reciprocal(1.0), Some(1.0));
        assert_eq!(f32_reciprocal(f32::MIN_POSITIVE), Some(2f32.powi(126)));
        for s in [
            1e-40,
            0.0,
            2f32.powi(126),
            f32::MAX,
            f32::INFINITY,
            f32::NAN,
        ] {
            assert_eq!(f32_reciprocal(s), None, "{s:e}");
        }
    }

    /// f32 numerators within a few ulps of `h * scale` for every nibble boundary `h`
    /// (where a multiply by the reciprocal would round some to the wrong nibble): the
    /// f32 path's nibbles equal the division's, at every level.
    #[test]
    fn f32_quotients_near_a_boundary_round_as_the_division() {
        let mut wrong_by_reciprocal = 0;
        for s in fast_scales(211).filter(|s| (1e-30..1e30).contains(s)) {
            let r = f32_reciprocal(s).unwrap();
            let mut xs = Vec::new();
            for h in (0..15).map(|n| n as f32 + 0.5) {
                let t0 = h * s; // exact: 5 + 8 significant bits
                for k in -4i32..=4 {
                    let t = f32::from_bits(t0.to_bits().wrapping_add_signed(k));
                    wrong_by_reciprocal += usize::from(to_nibble(t * r) != to_nibble(t / s));
                    xs.push(t);
                }
            }
            let p = GroupParams {
                scale: s,
                min_val: 0.0,
                ..GroupParams::default()
            };
            let want: Vec<u8> = xs.iter().map(|&x| to_nibble(x / s)).collect();
            simd::for_each_supported_level(|level| {
                let mut u = vec![0xFFu8; xs.len()];
                group_nibbles(Caps::new(level), QParamsPath::F32, &xs, &p, &mut u);
                assert_eq!(u, want, "scale = {s:e} at {level}");
            });
        }
        assert!(
            wrong_by_reciprocal > 0,
            "the sweep has no quotient that needs the division"
        );
    }

    /// Every branch of [`group_nibbles`] (reciprocal, hardware, division) against the scalar
    /// specification, [`crate::qparams::quantize_group`]: eps from subnormal to huge
    /// (a reciprocal out of range; `scale * 8` overflowing into an infinite `min_val`),
    /// groups with NaN, infinities, zeros and spreads from tiny to near `f32::MAX`.
    #[test]
    fn group_nibbles_equal_the_specification_for_any_eps() {
        use crate::qparams::quantize_group;
        let mut st = XorShift64::new(0x2545_F491_4F6C_DD1D);
        let eps = [
            1e-45,
            1e-40,
            f32::MIN_POSITIVE,
            1e-6,
            1.0,
            5e37,
            1e38,
            f32::MAX,
        ];
        for round in 0..400 {
            let spread = [1e-30f32, 1e-3, 1.0, 1e3, 1e30, 1e38][round % 6];
            let mut xs: Vec<f32> = (0..64)
                .map(|_| {
                    let v = ((st.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * spread;
                    bf16::from_f32(v).to_f32()
                })
                .collect();
            match round % 10 {
                7 => xs[5] = f32::NAN,
                8 => xs[9] = f32::INFINITY,
                9 => xs.fill(0.0),
                _ => {}
            }
            for path in [QParamsPath::Bf16, QParamsPath::F32] {
                for &e in &eps {
                    let mut want = vec![0u8; xs.len()];
                    quantize_group(path, &xs, e, &mut want);
                    let (mn, mx) = min_max(&xs);
                    let p = group_params(path, mn, mx, e);
                    let mut got = vec![0u8; xs.len()];
                    group_nibbles(Caps::new(Level::Scalar), path, &xs, &p, &mut got);
                    assert_eq!(got, want, "{path:?}, eps {e:e}, round {round}");
                    // bf16 input at this CPU's level: AVX-512 BF16 rounds in hardware;
                    // without it, integer rounding in registers; without VBMI too, the
                    // portable loop.
                    let xb: Vec<bf16> = xs.iter().map(|&x| bf16::from_f32(x)).collect();
                    for hide in [&[][..], &[Ext::Bf16], &Ext::ALL] {
                        got.fill(0xFF);
                        let caps =
                            with_extensions_hidden(hide, || Caps::new(quant_core::simd::level()));
                        group_nibbles(caps, path, &xb, &p, &mut got);
                        assert_eq!(
                            got, want,
                            "bf16 input, {hide:?} hidden, {path:?}, eps {e:e}, round {round}"
                        );
                    }
                }
            }
        }
    }

    /// The AVX-512 BF16 loop's first step (`x86::differences_dp`) counts a subnormal
    /// value as 0: every subnormal bf16 value of either sign, in groups whose minimum
    /// runs from subnormal to 2^-90 (either sign) and whose scale reaches the hardware
    /// bound, gives the specification's nibbles.
    #[test]
    fn subnormal_values_under_every_small_minimum() {
        use crate::qparams::{EPS_V2, quantize_group};
        let subnormals: Vec<u16> = (1..0x80u16).flat_map(|b| [b, b | 0x8000]).collect();
        let mut taken = 0;
        for e in -136i32..=-90 {
            let lows = [2f32.powi(e), 1.5 * 2f32.powi(e), 0.0];
            for low in lows.into_iter().flat_map(|l| [l, -l]) {
                for top in [2f32.powi(-96), 2f32.powi(-90), 1e-20, 3.0] {
                    for chunk in subnormals.chunks(30) {
                        let mut xs = vec![bf16::from_f32(low), bf16::from_f32(top)];
                        xs.extend(chunk.iter().map(|&b| bf16::from_bits(b)));
                        xs.resize(32, bf16::from_f32(low));
                        let wide: Vec<f32> = xs.iter().map(|x| x.to_f32()).collect();
                        let mut want = vec![0u8; xs.len()];
                        quantize_group(QParamsPath::Bf16, &wide, EPS_V2, &mut want);
                        let (mn, mx) = min_max(&wide);
                        let p = group_params(QParamsPath::Bf16, mn, mx, EPS_V2);
                        taken += usize::from(
                            p.scale >= MIN_HARDWARE_SCALE
                                && p.min_val.is_finite()
                                && f32_reciprocal(p.scale).is_some(),
                        );
                        let mut got = vec![0xFFu8; xs.len()];
                        let caps = Caps::new(quant_core::simd::level());
                        group_nibbles(caps, QParamsPath::Bf16, &xs, &p, &mut got);
                        assert_eq!(got, want, "low {low:e}, top {top:e}, scale {:e}", p.scale);
                    }
                }
            }
        }
        assert!(
            taken > 1000,
            "too few groups took the multiply form: {taken}"
        );
    }

    /// The hardware bf16 rounding flushes subnormals: groups of subnormal and tiny values
    /// whose scales run from the smallest (where a flush would change nibbles) across
    /// [`MIN_HARDWARE_SCALE`] give the specification's nibbles.
    #[test]
    fn subnormal_groups_near_the_hardware_scale_bound() {
        use crate::qparams::{EPS_V2, quantize_group};
        let mut st = XorShift64::new(0x0123_4567_89AB_CDEF);
        let mut taken = 0;
        for e in -26i32..=6 {
            // Group maxima about 15 * 2^(e - 100): scales from 2^-126 to past the bound.
            let top = 15.0 * 2f32.powi(e - 100);
            for round in 0..40 {
                let xs: Vec<bf16> = (0..64)
                    .map(|i| {
                        let r = st.next_u64();
                        let v = match (i + round) % 4 {
                            // Subnormal bf16 values of either sign.
                            0 => f32::from_bits((r >> 45) as u32 & 0x007F_0000),
                            1 => -f32::from_bits((r >> 45) as u32 & 0x007F_0000),
                            2 => 0.0,
                            _ => (r >> 40) as f32 / (1u64 << 24) as f32 * top,
                        };
                        bf16::from_f32(v)
                    })
                    .collect();
                let wide: Vec<f32> = xs.iter().map(|x| x.to_f32()).collect();
                let mut want = vec![0u8; xs.len()];
                quantize_group(QParamsPath::Bf16, &wide, EPS_V2, &mut want);
                let (mn, mx) = min_max(&wide);
                let p = group_params(QParamsPath::Bf16, mn, mx, EPS_V2);
                taken += usize::from(p.scale >= MIN_HARDWARE_SCALE);
                let mut got = vec![0xFFu8; xs.len()];
                group_nibbles(
                    Caps::new(quant_core::simd::level()),
                    QParamsPath::Bf16,
                    &xs,
                    &p,
                    &mut got,
                );
                assert_eq!(got, want, "scale {:e}, round {round}", p.scale);
            }
        }
        assert!(
            taken > 200,
            "too few groups reached the hardware bound: {taken}"
        );
    }

    #[test]
    fn pack32_matches_the_layout_and_round_trips() {
        let mut s = XorShift64::new(0x9E37_79B9_7F4A_7C15);
        for _ in 0..2000 {
            let u: [u8; 32] = std::array::from_fn(|_| (s.next_u64() >> 60) as u8);
            let w = pack32(&u);
            assert_eq!(w, pack32_naive(&u));
            assert_eq!(unpack32(w), u.map(u16::from));
        }
    }
}
