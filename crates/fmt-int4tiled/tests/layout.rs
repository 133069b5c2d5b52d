//! The tiled layout: golden lane words, literal ports of the CUDA kernel loop and the spec
//! pseudocode against the closed form, and lossless pack/unpack for every inner_k_tiles.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fmt_int4tiled::layout::{from_prepacked, locate, position, to_prepacked};
use fmt_int4tiled::{Int4TiledQuantizer, Int4TiledTensorExt};
use half::bf16;
use proptest::prelude::*;
use quantfmt_testkit::XorShift64;

fn quantizer(g: usize, ikt: usize) -> Int4TiledQuantizer {
    Int4TiledQuantizer::new()
        .with_group_size(g)
        .unwrap()
        .with_inner_k_tiles(ikt)
        .unwrap()
}

fn pack(u: &[u8], n: usize, k: usize, g: usize, ikt: usize) -> Vec<i32> {
    let nq = n * (k / g);
    let t = quantizer(g, ikt)
        .from_logical(&[n, k], u, &vec![bf16::ONE; nq], &vec![bf16::ZERO; nq])
        .unwrap();
    t.packed_weight().unwrap().to_vec()
}

/// A literal port of `matrix_to_m16n8k16_Bint4_layout<InnerKTiles>` (NVIDIA branch) from
/// pytorch `aten/src/ATen/native/cuda/int4mm.cu`: grid (kSuperTiles, nTiles), 32 threads,
/// input `u8 [n][k/2]` with even k in the high nibble.
fn kernel_convert(input: &[u8], n: usize, k: usize, inner_k_tiles: usize) -> Vec<i32> {
    const K_TILE_SIZE: usize = 16;
    const N_TILE_SIZE: usize = 8;
    let in_size1 = k / 2;
    let n_tiles = n.div_ceil(N_TILE_SIZE);
    let k_super_tiles = (in_size1 * 2).div_ceil(inner_k_tiles * K_TILE_SIZE);
    let mut out = vec![0i32; n_tiles * k_super_tiles * 32 * (inner_k_tiles / 2)];
    for k_outer_tile in 0..k_super_tiles {
        for n_tile in 0..n_tiles {
            for t in 0..32 {
                let mut inner_k_tile = 0;
                while inner_k_tile < inner_k_tiles {
                    let n0 = n_tile * N_TILE_SIZE + t / 4;
                    let n0_valid = n0 < n;
                    let k_base0 = (k_outer_tile * inner_k_tiles + inner_k_tile) * K_TILE_SIZE / 2;
                    let mut ks = [0usize; 4];
                    ks[0] = k_base0 + t % 4;
                    ks[1] = ks[0] + 4;
                    let k_base1 = k_base0 + K_TILE_SIZE / 2;
                    ks[2] = k_base1 + t % 4;
                    ks[3] = ks[2] + 4;
                    let mut v = [0u8; 4];
                    for i in 0..4 {
                        v[i] = if n0_valid && ks[i] < in_size1 {
                            input[n0 * in_size1 + ks[i]]
                        } else {
                            0
                        };
                    }
                    let v: [u32; 4] = v.map(u32::from);
                    let pack = ((v[3] & 0xF) << 28)
                        | ((v[2] & 0xF) << 24)
                        | ((v[1] & 0xF) << 20)
                        | ((v[0] & 0xF) << 16)
                        | ((v[3] & 0xF0) << 8)
                        | ((v[2] & 0xF0) << 4)
                        | (v[1] & 0xF0)
                        | ((v[0] & 0xF0) >> 4);
                    let idx = ((n_tile * k_super_tiles + k_outer_tile) * 32 + t)
                        * (inner_k_tiles / 2)
                        + inner_k_tile / 2;
                    out[idx] = pack as i32;
                    inner_k_tile += 2;
                }
            }
        }
    }
    out
}

/// The pack pseudocode of the spec (section 3), literally.
fn spec_pseudocode(u: &[u8], n_rows: usize, k: usize, ikt: usize) -> Vec<i32> {
    let n_tiles = n_rows.div_ceil(8);
    let ks = k / (ikt * 16);
    let mut out = vec![0i32; n_tiles * ks * 32 * (ikt / 2)];
    for nt in 0..n_tiles {
        for kot in 0..ks {
            for t in 0..32 {
                for p in 0..ikt / 2 {
                    let mut word = 0u32;
                    for j in 0..8 {
                        let n = nt * 8 + t / 4;
                        let kk = kot * ikt * 16 + p * 32 + 8 * (j % 4) + 2 * (t % 4) + j / 4;
                        let v = if n < n_rows {
                            u32::from(u[n * k + kk])
                        } else {
                            0
                        };
                        word |= v << (4 * j);
                    }
                    out[((nt * ks + kot) * 32 + t) * (ikt / 2) + p] = word as i32;
                }
            }
        }
    }
    out
}

fn random_u(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = XorShift64::new(seed | 1);
    (0..len)
        .map(|_| (rng.next_u64() >> 40) as u8 & 0xF)
        .collect()
}

#[test]
fn golden_lane_words() {
    // u[n][k] = k mod 16: lane 0 -> 0x91918080 (bytes 80 80 91 91), lane 1 -> 0xB3B3A2A2.
    for ikt in [2usize, 4, 8] {
        let k = ikt * 16;
        let u: Vec<u8> = (0..8 * k).map(|i| ((i % k) % 16) as u8).collect();
        let words = pack(&u, 8, k, 32, ikt);
        let half = ikt / 2;
        assert_eq!(words[0] as u32, 0x9191_8080, "ikt={ikt}");
        assert_eq!(words[half] as u32, 0xB3B3_A2A2, "ikt={ikt}");
        assert_eq!(words[0].to_le_bytes(), [0x80, 0x80, 0x91, 0x91]);
        // every lane's nibbles repeat the pattern of its k0 = 2*(t%4) (+32p)
        for (w, &word) in words.iter().enumerate() {
            let c = (w / half) % 4;
            let lo = (2 * c) as u32;
            let expect = lo | (lo + 8) << 4 | lo << 8 | (lo + 8) << 12;
            let expect = expect | (expect + 0x1111) << 16;
            assert_eq!(word as u32, expect, "ikt={ikt} word {w}");
        }
    }
    // For ikt = 2 these are flat words 0 and 1.
    let u: Vec<u8> = (0..8 * 32).map(|i| ((i % 32) % 16) as u8).collect();
    assert_eq!(
        &pack(&u, 8, 32, 32, 2)[..2],
        &[0x9191_8080u32 as i32, 0xB3B3_A2A2u32 as i32]
    );
}

#[test]
fn kernel_loop_port_equals_closed_form() {
    for ikt in [2, 4, 8] {
        for (n, k, g) in [
            (1usize, 128usize, 32usize),
            (13, 256, 64),
            (24, 512, 128),
            (37, 256, 256),
        ] {
            let k_pad = k.div_ceil(ikt * 16) * ikt * 16;
            let u = random_u(n * k, (n * 131 + k + ikt) as u64);
            let ours = pack(&u, n, k, g, ikt);
            // the kernel reads the padded-to-k_pad u8 input (torchao pads before packing)
            let mut padded = vec![0u8; n * k_pad];
            for r in 0..n {
                padded[r * k_pad..][..k].copy_from_slice(&u[r * k..][..k]);
            }
            let kernel = kernel_convert(&to_prepacked(&padded), n, k_pad, ikt);
            assert_eq!(ours, kernel, "n={n} k={k} ikt={ikt}");
            assert_eq!(ours, spec_pseudocode(&padded, n, k_pad, ikt));
            // closed form: every nibble of every word is where locate() says
            for (w, &word) in ours.iter().enumerate() {
                for j in 0..8 {
                    let (nn, kk) = position(w, j, k_pad, ikt);
                    assert_eq!(locate(nn, kk, k_pad, ikt), (w, j));
                    let want = if nn < n { padded[nn * k_pad + kk] } else { 0 };
                    assert_eq!((word as u32 >> (4 * j)) & 0xF, u32::from(want));
                }
            }
        }
    }
}

#[test]
fn pack_unpack_identity_every_ikt_ragged_n() {
    for ikt in [2, 4, 8] {
        for g in [32, 64, 128, 256] {
            for n in [1, 5, 8, 13, 33] {
                let k = 2 * g.max(ikt * 16);
                let u = random_u(n * k, (ikt * 1000 + g + n) as u64);
                let nq = n * (k / g);
                let t = quantizer(g, ikt)
                    .from_logical(&[n, k], &u, &vec![bf16::ONE; nq], &vec![bf16::ZERO; nq])
                    .unwrap();
                assert_eq!(t.unpack().unwrap(), u, "g={g} ikt={ikt} n={n}");
                assert_eq!(from_prepacked(&t.to_prepacked().unwrap()), u);
            }
        }
    }
}

proptest! {
    #[test]
    fn prop_pack_unpack(seed in any::<u64>(), n in 1usize..40, kb in 1usize..5, ikt_i in 0usize..3, g_i in 0usize..4, e in 1usize..3) {
        let ikt = [2, 4, 8][ikt_i];
        let g = [32, 64, 128, 256][g_i];
        let k = g * kb;
        let u = random_u(e * n * k, seed);
        let nq = e * n * (k / g);
        let q = quantizer(g, ikt);
        let t = q
            .from_logical(&[e, n, k], &u, &vec![bf16::ONE; nq], &vec![bf16::ZERO; nq])
            .unwrap();
        prop_assert_eq!(t.unpack().unwrap(), u.clone());
        let back = q.from_prepacked(&[e, n, k], &t.to_prepacked().unwrap(), &vec![bf16::ONE; nq], &vec![bf16::ZERO; nq]).unwrap();
        prop_assert_eq!(back.packed_weight().unwrap(), t.packed_weight().unwrap());
    }
}
