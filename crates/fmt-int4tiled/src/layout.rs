//! The NVIDIA tensor-core tiled layout of `aten::_convert_weight_to_int4pack` (CUDA), bit
//! for bit, and the plain forms it converts from and to.
//!
//! A weight `u[n][k]` (nibbles `0..=15`, used as `u − 8` by the kernels) is stored as
//! `i32 [n_padded/8][k_padded/(ikt·16)][32][ikt/2]`: one n-tile of 8 rows, one *slab* of
//! `ikt` k-tiles of 16, one warp lane `t`, one pair `p` of k-tiles. Lane `t` holds row
//! `nt·8 + t/4` and, in each word, 8 nibbles at k offsets `k0 + {0, 8, 16, 24, 1, 9, 17, 25}`
//! with `k0 = kot·ikt·16 + 32p + 2·(t%4)`; nibble `j` sits in bits `[4j, 4j+4)`:
//!
//! ```text
//!  word (bits 31..0) = | j7 | j6 | j5 | j4 | j3 | j2 | j1 | j0 |
//!  k offset from k0  = | 25 | 17 |  9 |  1 | 24 | 16 |  8 |  0 |
//!                        └─ odd k: bits 16..31 ─┘ └─ even k: bits 0..15 ─┘
//!
//!  lanes of one n-tile, one 32-wide k block (p):     k: 0 1 | 2 3 | 4 5 | 6 7 | 8 9 ...
//!    row 0: t = 0, 1, 2, 3      t%4 = 0 owns k ≡ {0,1} mod 8 ──┘      │     │
//!    row 1: t = 4, 5, 6, 7      t%4 = 1 owns k ≡ {2,3} mod 8 ─────────┘     │
//!    ...                        t%4 = 2 owns k ≡ {4,5} mod 8 ───────────────┘
//!    row 7: t = 28 .. 31        t%4 = 3 owns k ≡ {6,7} mod 8
//! ```
//!
//! That is the B fragment of `mma.m16n8k16.row.col` (register 0: `k = 2(t%4), +1`;
//! register 1: `+8, +9`) for k-tile `2p` (nibbles 0, 1, 4, 5) and `2p+1` (nibbles 2, 3, 6,
//! 7), in the order `convert_i4x8_to_bf16x2x4` unpacks pairs (0,4), (1,5), (2,6), (3,7).
//! Rows `≥ n` and columns `≥ k` hold nibble 0, as the CUDA kernel writes them. Words are
//! little-endian on disk (safetensors and `torch.save` write raw memory).
//!
//! With `u[n][k] = k mod 16`, lane 0's word is `0x91918080` and lane 1's `0xB3B3A2A2`.
//!
//! ```
//! use fmt_int4tiled::layout::{locate, position};
//! // (n, k) -> (flat word index, nibble) and back, for k_padded = 256, inner_k_tiles = 8
//! assert_eq!(locate(9, 1, 256, 8), (272, 4)); // n-tile 1, slab 0, lane 4, pair 0, nibble 4
//! assert_eq!(position(272, 4, 256, 8), (9, 1));
//! ```

/// Rows per n-tile (the `n8` of `m16n8k16`).
pub const N_TILE: usize = 8;
/// Columns per k-tile (the `k16` of `m16n8k16`).
pub const K_TILE: usize = 16;
/// Lanes of a warp.
pub const LANES: usize = 32;
/// k offset (from the lane's `k0`) of nibble `j = 0..8` of a word.
pub const NIBBLE_K_OFFSET: [usize; 8] = [0, 8, 16, 24, 1, 9, 17, 25];

/// The `(flat word index, nibble)` holding `u[n][k]` in one 2-D packed tensor whose
/// padded k is `k_padded` (the closed form of the kernel's index arithmetic).
///
/// `k_padded` must be a multiple of `ikt·16` and `k < k_padded`.
#[inline]
pub fn locate(n: usize, k: usize, k_padded: usize, ikt: usize) -> (usize, usize) {
    let slab = ikt * K_TILE;
    let (nt, nr) = (n / N_TILE, n % N_TILE);
    let (kot, r) = (k / slab, k % slab);
    let (p, kk) = (r / 32, r % 32);
    let t = nr * 4 + (kk / 2) % 4;
    let j = kk / 8 + 4 * (kk % 2);
    let slabs = k_padded / slab;
    (((nt * slabs + kot) * LANES + t) * (ikt / 2) + p, j)
}

/// The inverse of [`locate`]: the `(n, k)` that nibble `j` of word `word` holds.
#[inline]
pub fn position(word: usize, j: usize, k_padded: usize, ikt: usize) -> (usize, usize) {
    let half = ikt / 2;
    let slab = ikt * K_TILE;
    let slabs = k_padded / slab;
    let p = word % half;
    let t = (word / half) % LANES;
    let rest = word / half / LANES;
    let (nt, kot) = (rest / slabs, rest % slabs);
    let kk = 8 * (j % 4) + 2 * (t % 4) + j / 4;
    (nt * N_TILE + t / 4, kot * slab + 32 * p + kk)
}

/// Packs one n-tile: `rows` is `u[8][k_padded]` row-major (values `0..=15`; higher bits
/// are masked off), `out` the tile's `k_padded` words (`[slabs][32][ikt/2]`).
///
/// ```
/// use fmt_int4tiled::layout::{pack_tile, unpack_tile};
/// let rows: Vec<u8> = (0..8 * 32).map(|i| ((i % 32) % 16) as u8).collect(); // u[n][k] = k mod 16
/// let mut words = [0i32; 32];
/// pack_tile(&rows, 32, 2, &mut words);
/// assert_eq!((words[0] as u32, words[1] as u32), (0x9191_8080, 0xB3B3_A2A2));
/// let mut back = vec![0u8; 8 * 32];
/// unpack_tile(&words, 32, 2, &mut back);
/// assert_eq!(back, rows);
/// ```
pub fn pack_tile(rows: &[u8], k_padded: usize, ikt: usize, out: &mut [i32]) {
    let half = ikt / 2;
    let slab = ikt * K_TILE;
    for (w, dst) in out.iter_mut().enumerate() {
        let p = w % half;
        let t = (w / half) % LANES;
        let kot = w / (half * LANES);
        let k0 = kot * slab + 32 * p + 2 * (t % 4);
        let row = &rows[(t / 4) * k_padded..][..k_padded];
        let mut word = 0u32;
        for (j, off) in NIBBLE_K_OFFSET.iter().enumerate() {
            word |= u32::from(row[k0 + off] & 0xF) << (4 * j);
        }
        *dst = word as i32;
    }
}

/// Unpacks one n-tile (the inverse of [`pack_tile`]): `words` → `rows` = `u[8][k_padded]`.
pub fn unpack_tile(words: &[i32], k_padded: usize, ikt: usize, rows: &mut [u8]) {
    let half = ikt / 2;
    let slab = ikt * K_TILE;
    for (w, &src) in words.iter().enumerate() {
        let p = w % half;
        let t = (w / half) % LANES;
        let kot = w / (half * LANES);
        let k0 = kot * slab + 32 * p + 2 * (t % 4);
        let row = &mut rows[(t / 4) * k_padded..][..k_padded];
        let word = src as u32;
        for (j, off) in NIBBLE_K_OFFSET.iter().enumerate() {
            row[k0 + off] = ((word >> (4 * j)) & 0xF) as u8;
        }
    }
}

/// Unpacks the nibbles of row `n` from one 2-D packed tensor (`expert` holds
/// `n_padded·k_padded/8` words) into `out[..k_padded]`, starting at slab `from_slab`
/// (`out` below `from_slab·ikt·16` is left untouched).
pub fn unpack_row(
    expert: &[i32],
    n: usize,
    k_padded: usize,
    ikt: usize,
    from_slab: usize,
    out: &mut [u8],
) {
    let half = ikt / 2;
    let slab = ikt * K_TILE;
    let slabs = k_padded / slab;
    let (nt, nr) = (n / N_TILE, n % N_TILE);
    for kot in from_slab..slabs {
        for c in 0..4 {
            let t = nr * 4 + c;
            let base = ((nt * slabs + kot) * LANES + t) * half;
            for p in 0..half {
                let word = expert[base + p] as u32;
                let k0 = kot * slab + 32 * p + 2 * c;
                for (j, off) in NIBBLE_K_OFFSET.iter().enumerate() {
                    out[k0 + off] = ((word >> (4 * j)) & 0xF) as u8;
                }
            }
        }
    }
}

/// The PyTorch ≥ 2.5 input of `_convert_weight_to_int4pack`: `u[n][k]` → `u8 [n][k/2]`
/// with byte `j` of a row `= (u[2j] << 4) | u[2j+1]`, so **even k is in the high nibble**
/// (torchao: `(q[:, ::2] << 4 | q[:, 1::2]).to(uint8)`). `k` must be even.
///
/// ```
/// use fmt_int4tiled::layout::{to_prepacked, from_prepacked};
/// let u = [1u8, 2, 3, 4];
/// assert_eq!(to_prepacked(&u), vec![0x12, 0x34]);
/// assert_eq!(from_prepacked(&[0x12, 0x34]), u.to_vec());
/// ```
pub fn to_prepacked(u: &[u8]) -> Vec<u8> {
    u.chunks_exact(2)
        .map(|p| ((p[0] & 0xF) << 4) | (p[1] & 0xF))
        .collect()
}

/// The inverse of [`to_prepacked`]: `u8 [n][k/2]` (even k high) → `u[n][k]`.
pub fn from_prepacked(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().flat_map(|&b| [b >> 4, b & 0xF]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_position_inverse() {
        for ikt in [2, 4, 8] {
            let kp = ikt * 16 * 3;
            let mut seen = vec![false; 16 * kp];
            for n in 0..16 {
                for k in 0..kp {
                    let (w, j) = locate(n, k, kp, ikt);
                    assert_eq!(position(w, j, kp, ikt), (n, k));
                    assert!(!seen[w * 8 + j]);
                    seen[w * 8 + j] = true;
                }
            }
            assert!(seen.iter().all(|&s| s));
        }
    }

    #[test]
    fn tile_round_trip_and_row_unpack() {
        for ikt in [2, 4, 8] {
            let kp = ikt * 32;
            let rows: Vec<u8> = (0..8 * kp).map(|i| ((i * 7 + i / 13) % 16) as u8).collect();
            let mut words = vec![0i32; kp];
            pack_tile(&rows, kp, ikt, &mut words);
            let mut back = vec![0u8; 8 * kp];
            unpack_tile(&words, kp, ikt, &mut back);
            assert_eq!(back, rows);
            let mut row = vec![0u8; kp];
            for n in 0..8 {
                unpack_row(&words, n, kp, ikt, 0, &mut row);
                assert_eq!(row, rows[n * kp..][..kp]);
            }
        }
    }
}
