//! Stochastic rounding: TE's software rounding rule fed by a counter-based random stream.
//!
//! ## The rounding rule (TE `common/util/ptx.cuh::stochastic_round_fp4_e2m1`)
//!
//! TE emulates `cvt.rs.satfinite.e2m1x4.f32` on GPUs without it. Each element takes 8
//! random bits `r` and, for `v = x * enc` (the same fp32 product as round-to-nearest):
//!
//! ```text
//! u      = r / 256                              // exact
//! a      = |v|
//! step   = a >= 4 ? 2 : (a >= 2 ? 1 : 0.5)     // grid spacing at a
//! t      = fmaf(u, step, a)                     // u*step is exact, so this is a + u*step rounded once
//! step_t = t >= 4 ? 2 : (t >= 2 ? 1 : 0.5)     // the jitter may cross a region boundary
//! q      = fminf(floorf(t / step_t) * step_t, 6)
//! result = copysignf(q, isnan(v) ? +1 : v)      // NaN -> +6, |v| > 6 -> ±6, sign kept on 0
//! ```
//!
//! `q` lies on the E2M1 grid, so it is encoded exactly (`-0` keeps its sign, code `0x8`).
//! `P(round up) = floor(256 * frac) / 256` where `frac` is the position of `a` between
//! its two neighbours: unbiased whenever `frac` is a multiple of 1/256, otherwise
//! biased toward zero by less than `step/256` (on average `step/512` for a continuous
//! `frac`); the hardware instruction, which also consumes 8 bits, behaves the same way.
//!
//! ## The random stream (this crate's definition; a CUDA kernel must reproduce it)
//!
//! TE draws its bits from curanddx Philox4x32-10 indexed by CUDA thread id, so its bits
//! depend on the kernel's thread mapping; only the distribution can be matched. quantfmt
//! instead makes every element's bits a pure function of `(seed, direction, position)`:
//!
//! ```text
//! key  = [seed as u32, (seed >> 32) as u32]
//! ctr  = [block as u32, row as u32, (row >> 32) as u32, dir]     // dir: 0 rowwise, 1 columnwise
//! out  = philox4x32_10(ctr, key)                                 // four u32 words
//! bits(element e of the block, e = 0..16) = (out[e / 4] >> (8 * (e % 4))) & 0xFF
//! ```
//!
//! `row` is the row of the *stored* operand (rowwise: row `m` of the `[M, K]` view;
//! columnwise: row `k` of `x^T`, i.e. column `k` of `x`) and `block` the index of the
//! 16-element block within that row (rowwise `k / 16`, columnwise `m / 16`). One Philox
//! call serves one block, the byte order inside a word follows TE's (element `k` of a
//! group of four uses byte `k`). The result does not depend on thread count or tiling.
//!
//! ```
//! use fmt_nvfp4::sr::{philox4x32_10, stochastic_round_e2m1};
//! // Random123 known-answer vector.
//! assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
//! assert_eq!(stochastic_round_e2m1(2.25, 0), 2.0);    // u = 0: always down
//! assert_eq!(stochastic_round_e2m1(2.25, 192), 3.0);  // u = 0.75: 2.25 + 0.75 = 3
//! assert_eq!(stochastic_round_e2m1(f32::NAN, 7), 6.0);
//! ```

/// Philox multiplier for word 0.
pub(crate) const M0: u32 = 0xD251_1F53;
/// Philox multiplier for word 2.
pub(crate) const M1: u32 = 0xCD9E_8D57;
/// Key schedule increment (golden ratio).
pub(crate) const W0: u32 = 0x9E37_79B9;
/// Key schedule increment (sqrt(3) - 1).
pub(crate) const W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds (Salmon et al., SC'11; curand's and curanddx's default).
#[inline]
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// Stream direction tag of the rowwise operand.
pub const DIR_ROWWISE: u32 = 0;
/// Stream direction tag of the columnwise (transposed) operand.
pub const DIR_COLUMNWISE: u32 = 1;

/// The 128 random bits of one 16-element block (see the module docs for the layout).
#[inline]
pub fn block_bits(seed: u64, dir: u32, row: u64, block: u32) -> [u32; 4] {
    philox4x32_10(
        [block, row as u32, (row >> 32) as u32, dir],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// The 8 random bits of element `e` (0..16) of a block.
#[inline(always)]
pub fn element_bits(bits: &[u32; 4], e: usize) -> u32 {
    (bits[(e / 4) % 4] >> (8 * (e % 4))) & 0xFF
}

/// TE's software stochastic rounding of an already scaled value onto the E2M1 grid.
/// Only the low 8 bits of `rbits8` are read.
#[inline]
pub fn stochastic_round_e2m1(v: f32, rbits8: u32) -> f32 {
    let u = (rbits8 & 0xFF) as f32 * (1.0 / 256.0);
    let a = v.abs();
    let step = if a >= 4.0 {
        2.0
    } else if a >= 2.0 {
        1.0
    } else {
        0.5
    };
    // u * step is exact (8-bit u, power-of-two step), so a + u*step equals fmaf(u, step, a).
    let t = a + u * step;
    let (step_t, inv_step_t) = if t >= 4.0 {
        (2.0, 0.5)
    } else if t >= 2.0 {
        (1.0, 1.0)
    } else {
        (0.5, 2.0)
    };
    // `min` returns the non-NaN operand, like fminf: a NaN t becomes 6.
    let q = ((t * inv_step_t).floor() * step_t).min(6.0f32);
    q.copysign(if v.is_nan() { 1.0 } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random123_known_answers() {
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn rounding_rule_edges() {
        // Exactly on the grid: never moves, whatever the bits.
        for r in [0, 1, 128, 255] {
            for g in [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0] {
                assert_eq!(stochastic_round_e2m1(g, r), g, "{g} {r}");
                assert_eq!(stochastic_round_e2m1(-g, r), -g, "-{g} {r}");
            }
        }
        // 1.75 + 0.5*255/256 crosses into [2, 4): step_t = 1, floor(2.248..) = 2.
        assert_eq!(stochastic_round_e2m1(1.75, 255), 2.0);
        assert_eq!(stochastic_round_e2m1(5.0, 128), 6.0);
        assert_eq!(stochastic_round_e2m1(5.0, 127), 4.0);
        assert_eq!(stochastic_round_e2m1(100.0, 0), 6.0);
        assert_eq!(stochastic_round_e2m1(f32::NEG_INFINITY, 0), -6.0);
        assert!(stochastic_round_e2m1(-0.1, 0).is_sign_negative());
        // P(up) for 2.25 is 64/256 exactly.
        let ups = (0..256)
            .filter(|&r| stochastic_round_e2m1(2.25, r) == 3.0)
            .count();
        assert_eq!(ups, 64);
    }

    #[test]
    fn element_bits_follow_bytes() {
        let b = [0x0403_0201, 0x0807_0605, 0x0C0B_0A09, 0x100F_0E0D];
        let got: Vec<u32> = (0..16).map(|e| element_bits(&b, e)).collect();
        assert_eq!(got, (1..=16).collect::<Vec<u32>>());
    }
}
