//! Fast pack and dequantize: no division, no per-nibble loop.
//!
//! **Quantize.** torchao divides every element by the group's scale. Here
//! `q = f32(f64(t) * f64(1 / scale))` instead, and that is exact: `t` has at most 24
//! significant bits (8 on the bf16 path) and the scale 8, so a quotient that is not
//! itself an f32 rounding boundary (a 25-bit midpoint) lies at least `2^-34` (relative)
//! away from every boundary; no such quotient can be a midpoint (its odd part would
//! need more bits than `t` has); and the f64 product is within `2^-52` of the quotient.
//! So it rounds to the same f32 as the IEEE division (below 2^-126, where the f32 grid
//! is coarser, the nibble is 0 either way). `tests/simd_levels.rs` compares with the
//! division on every bf16 value and on random f32 groups.
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
//! times per group, once per nibble value, into a table; every output is then a lookup
//! (at AVX-512 a register permute per 32 outputs, [`crate::x86`]).

use half::bf16;
use quant_core::simd::Level;
use quant_core::strips::Strip;
use quant_core::{DType, Element, widened};

use crate::format::Geometry;
use crate::layout::{K_TILE, LANES, N_TILE};
use crate::qparams::{GroupParams, QParamsPath, group_params, min_max, rb, to_nibble};

/// Nibbles of one group: `u = to_nibble(op((x - min_val) / scale))`, division-free.
#[inline(always)]
fn group_nibbles(path: QParamsPath, xs: &[f32], p: &GroupParams, u: &mut [u8]) {
    let r = 1.0f64 / f64::from(p.scale);
    match path {
        QParamsPath::Bf16 => {
            for (o, &x) in u.iter_mut().zip(xs) {
                let t = rb(x - p.min_val);
                *o = to_nibble(rb((f64::from(t) * r) as f32));
            }
        }
        QParamsPath::F32 => {
            for (o, &x) in u.iter_mut().zip(xs) {
                *o = to_nibble((f64::from(x - p.min_val) * r) as f32);
            }
        }
    }
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

/// Packs one row's nibbles `u` (`k_padded` of them) into its n-tile's words: at
/// AVX-512 with [`crate::x86::pack_row`], elsewhere block by block with [`pack32`].
#[inline(always)]
fn pack_row(level: Level, u: &[u8], nr: usize, ikt: usize, words: &mut [i32]) {
    let half = ikt / 2;
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 && crate::x86::pack_row_if_supported(u, nr, half, words) {
        return;
    }
    let _ = level;
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
}

impl RowWords<'_> {
    /// The four words of 32-wide block `block` (`[c]`, lanes `nr·4 + c`).
    #[inline(always)]
    fn block_words(&self, block: usize) -> [u32; 4] {
        let (kot, p) = (block / self.half, block % self.half);
        let lanes = &self.tile[(kot * LANES + self.nr * 4) * self.half + p..];
        std::array::from_fn(|c| lanes[c * self.half] as u32)
    }

    /// Whether the kernels may read the words of the first `k` columns (`k` a multiple
    /// of 32): the row's last slab lies inside the tile.
    pub(crate) fn covers(&self, k: usize) -> bool {
        let slabs = k.div_ceil(32 * self.half);
        matches!(self.half, 1 | 2 | 4)
            && self.nr < N_TILE
            && slabs * LANES * self.half <= self.tile.len()
    }
}

/// Groups whose qparams one quantize step computes together.
const BATCH: usize = 16;

/// Scratch of one quantize task.
pub(crate) struct Scratch {
    wide: Vec<f32>,
    u: Vec<u8>,
}

impl Scratch {
    pub(crate) fn new(geo: &Geometry) -> Scratch {
        Scratch {
            wide: vec![0.0; BATCH * geo.group_size],
            u: vec![0; geo.k_padded],
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
    let logical = geo.logical_groups();
    for nr in 0..N_TILE {
        let n = nt * N_TILE + nr;
        let real = if n < geo.n { logical } else { 0 };
        // BATCH groups at a time: their min/max first, then their qparams (independent
        // scalar chains the core overlaps, where one group's chain used to stall the
        // next group's vector work), then their nibbles.
        for g0 in (0..real).step_by(BATCH) {
            let nb = BATCH.min(real - g0);
            let src = &x[n * geo.k + g0 * g..n * geo.k + (g0 + nb) * g];
            let w = widened(src, &mut s.wide[..nb * g]);
            let mut ranges = [(0f32, 0f32); BATCH];
            for (r, wg) in ranges.iter_mut().zip(w.chunks_exact(g)) {
                *r = min_max(wg);
            }
            // A plain loop, not `array::map`: its closure stayed out of line, compiled
            // outside the dispatched function.
            let mut params = [GroupParams::default(); BATCH];
            for (p, &(mn, mx)) in params.iter_mut().zip(&ranges) {
                *p = group_params(path, mn, mx, eps);
            }
            for (i, (p, wg)) in params[..nb].iter().zip(w.chunks_exact(g)).enumerate() {
                let gi = g0 + i;
                group_nibbles(path, wg, p, &mut s.u[gi * g..(gi + 1) * g]);
                let row = sz.row_mut(gi);
                row[nr * 2] = p.scale_bf16;
                row[nr * 2 + 1] = p.zero_bf16;
            }
        }
        s.u[real * g..].fill(0);
        for gi in real..geo.groups() {
            let row = sz.row_mut(gi);
            row[nr * 2] = pad.0;
            row[nr * 2 + 1] = pad.1;
        }
        pack_row(level, &s.u, nr, geo.inner_k_tiles, words);
    }
}

/// Dequantizes rows `n0..n0+out.len()/k` of one expert (`words`, `sz` are the expert's)
/// into `out` (`[rows, k]`). `tables` is scratch.
///
/// A group's outputs take at most 16 values (one per nibble), so each row first computes
/// its groups' tables with the exact arithmetic of [`group_table`]; then every output is
/// a lookup of its nibble. At AVX-512 the lookup is [`crate::x86`] (a few register
/// operations per 32 outputs); elsewhere each 32-wide block is unpacked into u16 lanes
/// ([`unpack32`]) and looked up one by one. Only the logical `k` is read: `k` is a
/// multiple of the group size, hence of 32.
#[inline(always)]
pub(crate) fn dequantize_rows<T: Element>(
    level: Level,
    geo: &Geometry,
    words: &[i32],
    sz: &[bf16],
    n0: usize,
    out: &mut [T],
    tables: &mut Vec<[T; 16]>,
) {
    let _ = level; // only the x86-64 build has a kernel to choose
    let (k, g) = (geo.k, geo.group_size);
    let half = geo.inner_k_tiles / 2;
    for (r, row) in out.chunks_exact_mut(k).enumerate() {
        let n = n0 + r;
        let (nt, nr) = (n / N_TILE, n % N_TILE);
        let tile = &words[nt * geo.k_padded..(nt + 1) * geo.k_padded];
        // A plain loop, not `extend(map)`: it must inline into the dispatched function.
        tables.resize(k / g, [T::from_f32(0.0); 16]);
        for (gi, t) in tables.iter_mut().enumerate() {
            let at = (gi * geo.n_padded + n) * 2;
            *t = group_table::<T>(sz[at].to_f32(), sz[at + 1].to_f32());
        }
        let lanes = RowWords { tile, nr, half };
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx512 && crate::x86::lookup_row(tables, g, lanes, row) {
            continue;
        }
        for (block, ob) in row.chunks_exact_mut(32).enumerate() {
            let table = &tables[block * 32 / g];
            for (o, u) in ob.iter_mut().zip(unpack32(lanes.block_words(block))) {
                *o = table[usize::from(u)];
            }
        }
    }
}

/// The 16 outputs of a group with scale `s` and zero `z`: `T((u - 8) * s + z)` rounded
/// once (see the module docs).
#[inline(always)]
fn group_table<T: Element>(s: f32, z: f32) -> [T; 16] {
    let mut w = [0f32; 16];
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
    let mut t = [T::from_f32(0.0); 16];
    T::narrow_slice(&w, &mut t);
    t
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

    #[test]
    fn pack32_matches_the_layout_and_round_trips() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..2000 {
            let u: [u8; 32] = std::array::from_fn(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 60) as u8
            });
            let w = pack32(&u);
            assert_eq!(w, pack32_naive(&u));
            assert_eq!(unpack32(w), u.map(u16::from));
        }
    }
}
