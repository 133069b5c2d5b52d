//! Weight-only int4 matmul on the CPU: `y = x Wᵀ (+ bias)` straight from the tiled layout.
//!
//! W is never materialized. Each row's nibbles are decoded slab by slab (one slab is
//! `inner_k_tiles·16` columns), in registers or into an L1-sized buffer:
//!
//! * several activation rows: a row's k-block is dequantized once into f32,
//!   `w = (u − 8)·scale + zero` (the product is exact, so this is the single rounding of
//!   the FMA torch's AVX-512 `_weight_int4pack_mm_for_cpu` uses), and every activation
//!   row is dotted with it;
//! * one activation row (decode, memory-bound): the factored form
//!   `y = Σ_groups ( scale · Σ_k x·(u − 8) + zero · Σ_k x )` keeps the decoded values in
//!   registers and applies scale and zero once per group.
//!
//! Both evaluate `Σ_k x·w` for the exact weights (not the bf16-rounded weights of the
//! CUDA kernel; spec section 6) with f32 accumulation; the output is rounded once to the
//! activation dtype after adding the bias. Results therefore differ from a
//! dequantize-then-matmul by less than bf16 rounding, not bit for bit (no CPU or GPU int4
//! matmul is bit-reproducible across implementations: the summation order is free).
//!
//! Layout trick: one row's words of one slab are contiguous (`2·ikt` words: lanes
//! `t = 4·(n%8) + c`, pairs `p`), so they load as SIMD vectors of 4 words. Shifting such a
//! vector by `4j` and masking gives nibble `j` of 4 words at once (one integer subtract
//! and one conversion make it `u − 8` in f32). The activation is permuted
//! once per call, within each slab, to that order, so every load is contiguous. Lane `l`
//! of a vector always belongs to k-block `p = l mod ikt/2`, so per-lane sums give
//! per-group sums for any group size.
//!
//! Parallelism: rayon over blocks of 32 output rows (4 n-tiles); the activation is
//! blocked along k so that `m × KC` floats stay in cache while a block's rows reuse them.

use half::bf16;
use quant_core::{Element, Error, HostTensor, Result, dispatch_elements};
use rayon::prelude::*;

use crate::layout::{K_TILE, LANES, N_TILE, NIBBLE_K_OFFSET};
use crate::tensor::{Int4TiledTensor, Int4TiledTensorExt};

/// The k offset (within a slab of `ikt·16` columns) of decoded position `pos`, for every
/// position: `pos = (v·8 + j)·4 + l` is nibble `j` of the row's word `w = 4v + l` of the
/// slab, which is lane `t = 4·(n%8) + w/(ikt/2)`, pair `p = w mod (ikt/2)`.
///
/// ```
/// // ikt = 2: the 4 words of a row are lanes c = 0..4; position 4j + c is k = 2c + [0,8,16,24,1,9,17,25][j]
/// assert_eq!(&fmt_int4tiled::slab_order(2)[..8], &[0, 2, 4, 6, 8, 10, 12, 14]);
/// ```
pub fn slab_order(inner_k_tiles: usize) -> Vec<usize> {
    let half = inner_k_tiles / 2;
    (0..inner_k_tiles * K_TILE)
        .map(|pos| {
            let (v, j, l) = (pos / 32, (pos / 4) % 8, pos % 4);
            let w = v * 4 + l;
            32 * (w % half) + 2 * (w / half) + NIBBLE_K_OFFSET[j]
        })
        .collect()
}

/// Rows of W per parallel task (4 n-tiles).
const ROWS_PER_TASK: usize = 32;
/// Target bytes of the activation k-block kept in cache.
const ACT_BLOCK_BYTES: usize = 256 << 10;

fn check_weight(w: &Int4TiledTensor) -> Result<()> {
    if w.num_experts().is_some() {
        return Err(Error::invalid(
            "w",
            w.shape(),
            "int4_linear takes a 2-D [n, k] weight; select an expert first",
        ));
    }
    Ok(())
}

/// `y = x Wᵀ (+ bias)` for a tensor `x` of shape `[..., k]` (f32, bf16 or f16): the output
/// `[..., n]` has `x`'s dtype. `bias` (any float dtype) must have `n` elements.
///
/// ```
/// use fmt_int4tiled::{int4_linear, Int4TiledQuantizer};
/// use quant_core::{DType, HostTensor};
/// let w: Vec<f32> = (0..16 * 256).map(|i| ((i * 13) % 31) as f32 / 31.0 - 0.5).collect();
/// let t = Int4TiledQuantizer::new().quantize(&HostTensor::f32(&w, &[16, 256])?)?;
/// let x = vec![half::bf16::from_f32(1.0); 2 * 256];
/// let y = int4_linear(&HostTensor::bf16(&x, &[2, 256])?, &t, None)?;
/// assert_eq!((y.dtype(), y.shape().dims()), (DType::BF16, &[2usize, 16][..]));
/// # Ok::<(), quant_core::Error>(())
/// ```
pub fn int4_linear(
    x: &HostTensor<'_>,
    w: &Int4TiledTensor,
    bias: Option<&HostTensor<'_>>,
) -> Result<HostTensor<'static>> {
    check_weight(w)?;
    let geo = w.geometry();
    if x.shape().cols() != geo.k {
        return Err(Error::invalid(
            "x",
            x.shape(),
            format!(
                "last dimension must be k = {} (the weight's in_features)",
                geo.k
            ),
        ));
    }
    let m = x.shape().rows();
    let bias = bias.map(|b| b.to_f32_vec());
    let mut dims = x.shape().dims().to_vec();
    let last = dims.len() - 1;
    dims[last] = geo.n;
    dispatch_elements!(x, |xs| {
        let y = linear_core(xs, m, w, bias.as_deref())?;
        HostTensor::from_vec(y, &dims)
    })
}

/// `y = x Wᵀ (+ bias)` on slices: `x` is `[m, k]` row-major, the result `[m, n]`.
///
/// ```
/// use fmt_int4tiled::{int4_linear_reference, int4_linear_slice, Int4TiledQuantizer};
/// use quant_core::HostTensor;
/// // every group spans -4..3.5: scale 0.5, zero 0, so the weights are exact
/// let w: Vec<f32> = (0..8 * 64).map(|i| (i % 16) as f32 * 0.5 - 4.0).collect();
/// let t = Int4TiledQuantizer::new().with_group_size(32)?.quantize(&HostTensor::f32(&w, &[8, 64])?)?;
/// let x = vec![0.25f32; 64];
/// let y = int4_linear_slice(&x, 1, &t, Some(&[1.0f32; 8]))?;
/// let r = int4_linear_reference(&x, 1, &t, Some(&[1.0f32; 8]))?; // dequantize + f64 matmul
/// assert!(y.iter().zip(&r).all(|(a, b)| (f64::from(*a) - b).abs() < 1e-6));
/// # Ok::<(), quant_core::Error>(())
/// ```
pub fn int4_linear_slice<T: Element>(
    x: &[T],
    m: usize,
    w: &Int4TiledTensor,
    bias: Option<&[T]>,
) -> Result<Vec<T>> {
    check_weight(w)?;
    let bias: Option<Vec<f32>> = bias.map(|b| b.iter().map(|v| v.to_f32()).collect());
    linear_core(x, m, w, bias.as_deref())
}

/// The specification in code: dequantize W exactly as the CUDA kernel does (bf16, one
/// rounding) and multiply in f64. Slow; for tests and checks.
pub fn int4_linear_reference<T: Element>(
    x: &[T],
    m: usize,
    w: &Int4TiledTensor,
    bias: Option<&[T]>,
) -> Result<Vec<f64>> {
    check_weight(w)?;
    let geo = w.geometry();
    let (n, k) = (geo.n, geo.k);
    check_dims(x.len(), m, k, bias.map(<[T]>::len), n)?;
    let wd = w.dequantize_as::<bf16>(quant_core::Direction::Rowwise)?;
    let mut y = vec![0f64; m * n];
    for (i, yrow) in y.chunks_mut(n).enumerate() {
        let xrow = &x[i * k..][..k];
        for (j, out) in yrow.iter_mut().enumerate() {
            let wrow = &wd[j * k..][..k];
            let dot: f64 = xrow
                .iter()
                .zip(wrow)
                .map(|(a, b)| f64::from(a.to_f32()) * f64::from(b.to_f32()))
                .sum();
            *out = dot + bias.map_or(0.0, |b| f64::from(b[j].to_f32()));
        }
    }
    Ok(y)
}

fn check_dims(xlen: usize, m: usize, k: usize, blen: Option<usize>, n: usize) -> Result<()> {
    if Some(xlen) != m.checked_mul(k) {
        return Err(Error::invalid(
            "x",
            format!("{xlen} elements"),
            format!("[m={m}, k={k}] needs {}", m.saturating_mul(k)),
        ));
    }
    if let Some(b) = blen.filter(|&b| b != n) {
        return Err(Error::invalid(
            "bias",
            format!("{b} elements"),
            format!("must have n = {n} elements"),
        ));
    }
    Ok(())
}

/// Nibble `j` of `w`, minus 8, as f32 (exact). Written as an integer subtraction and a
/// signed conversion so that it maps onto `psrld`/`pand`/`psubd`/`cvtdq2ps`.
#[inline(always)]
fn nib(w: u32, j: usize) -> f32 {
    (((w >> (4 * j)) & 0xF) as i32 - 8) as f32
}

/// bf16 → f32 by shifting the bits (exact; a NaN stays a NaN, unlike `to_f32` it is not
/// re-quieted, which does not matter here and avoids a branch).
#[inline(always)]
fn bf(x: bf16) -> f32 {
    quant_core::dtype::f32_from_bf16_bits(x.to_bits())
}

#[inline(always)]
fn word4(w: &[i32]) -> [u32; 4] {
    [w[0] as u32, w[1] as u32, w[2] as u32, w[3] as u32]
}

/// Dequantizes one row-slab (`words`: its `2·ikt` words) into `out` (`ikt·16` values of
/// `(u − 8)·scale + zero` in f32, in [`slab_order`]; lane `l` uses `scale[l]`, `zero[l]`).
/// The product is exact, so each value is the single f32 rounding an FMA would give.
#[inline(always)]
fn dequant_slab(words: &[i32], scale: &[f32; 4], zero: &[f32; 4], out: &mut [f32]) {
    for (wv, ov) in words.chunks_exact(4).zip(out.chunks_exact_mut(32)) {
        if let Ok(ov) = <&mut [f32; 32]>::try_from(ov) {
            dequant_word4(word4(wv), scale, zero, ov);
        }
    }
}

/// One 4-word vector → 32 values. Fixed sizes and out of line, so that LLVM vectorizes
/// across the 4 lanes (otherwise it vectorized across word vectors or nibble positions,
/// with gathers and broadcasts).
#[inline(never)]
fn dequant_word4(w: [u32; 4], scale: &[f32; 4], zero: &[f32; 4], out: &mut [f32; 32]) {
    for j in 0..8 {
        for l in 0..4 {
            out[4 * j + l] = nib(w[l], j) * scale[l] + zero[l];
        }
    }
}

/// Per-lane `Σ a·(u − 8)` of one row-slab, decoding in registers (one activation row).
/// Even and odd nibble positions feed separate accumulators to hide the add latency.
///
/// The slab kernels are not inlined: inside the caller, LLVM's SLP vectorizer paired lanes
/// for the final reduction and left half of every vector idle (with junk in the idle
/// lanes, which as subnormal floats cost microcode assists: a 10x slowdown).
#[inline(never)]
fn fused_slab(words: &[i32], a: &[f32]) -> [f32; 4] {
    let mut even = [0f32; 4];
    let mut odd = [0f32; 4];
    for (wv, av) in words.chunks_exact(4).zip(a.chunks_exact(32)) {
        let w = word4(wv);
        for (jj, a8) in av.chunks_exact(8).enumerate() {
            let (a0, a1) = (&a8[..4], &a8[4..]);
            for l in 0..4 {
                even[l] += a0[l] * nib(w[l], 2 * jj);
            }
            for l in 0..4 {
                odd[l] += a1[l] * nib(w[l], 2 * jj + 1);
            }
        }
    }
    std::array::from_fn(|l| even[l] + odd[l])
}

/// The dot product of `a` and `w` (equal lengths, a multiple of 8), 8 accumulators.
#[inline(never)]
fn dot(a: &[f32], w: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (wv, av) in w.chunks_exact(8).zip(a.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += av[l] * wv[l];
        }
    }
    // A plain sequential sum: a pairwise tree here makes the SLP vectorizer shuffle the
    // accumulators inside the loop.
    acc.iter().sum()
}

#[inline(always)]
fn lane_sum(lanes: [f32; 4], scale: &[f32; 4]) -> f32 {
    (lanes[0] * scale[0] + lanes[1] * scale[1]) + (lanes[2] * scale[2] + lanes[3] * scale[3])
}

fn linear_core<T: Element>(
    x: &[T],
    m: usize,
    w: &Int4TiledTensor,
    bias: Option<&[f32]>,
) -> Result<Vec<T>> {
    let geo = w.geometry();
    let (n, k, g) = (geo.n, geo.k, geo.group_size);
    check_dims(x.len(), m, k, bias.map(<[f32]>::len), n)?;
    if m == 0 {
        return Ok(Vec::new());
    }
    let packed = w.packed_weight()?;
    let sz = w.scale_and_zero()?;
    let (np, kp, ikt) = (geo.n_padded, geo.k_padded, geo.inner_k_tiles);
    let half = ikt / 2;
    let slab = ikt * K_TILE;
    let slabs = kp / slab;
    let live_slabs = k.div_ceil(slab); // slabs beyond hold only padding: skipped
    let groups = geo.groups();
    let slab_words = LANES * half; // words of one n-tile and slab

    // Activation in slab order (zero beyond k) and per-group sums.
    let order = slab_order(ikt);
    let mut a = vec![0f32; m * kp];
    let mut asum = vec![0f32; m * groups];
    a.par_chunks_mut(kp)
        .zip(asum.par_chunks_mut(groups))
        .enumerate()
        .for_each(|(i, (arow, srow))| {
            let xrow = &x[i * k..][..k];
            for (si, dst) in arow.chunks_exact_mut(slab).enumerate() {
                let base = si * slab;
                for (d, &o) in dst.iter_mut().zip(&order) {
                    *d = xrow.get(base + o).map_or(0.0, |v| v.to_f32());
                }
            }
            if m == 1 {
                for (s, grp) in srow.iter_mut().zip(xrow.chunks_exact(g)) {
                    *s = grp.iter().map(|v| f64::from(v.to_f32())).sum::<f64>() as f32;
                }
            }
        });

    // Per slab, the group of each of the 4 lanes (lane l is k-block p = l mod ikt/2).
    let lane_group = |si: usize, l: usize| (si * slab + 32 * (l % half)) / g;

    // k-block so that m x kc activations stay in cache.
    let kc_slabs = (ACT_BLOCK_BYTES / 4 / m / slab).max(1);

    let mut yt = vec![0f32; np * m]; // [n_padded][m]
    // The dequantized k-block of one row (unused with one activation row).
    let wlen = if m == 1 {
        0
    } else {
        kc_slabs.min(live_slabs) * slab
    };
    yt.par_chunks_mut(ROWS_PER_TASK * m)
        .enumerate()
        .for_each_init(
            || vec![0f32; wlen],
            |wbuf, (task, yblk)| {
                let r0 = task * ROWS_PER_TASK;
                let rows = (yblk.len() / m).min(n.saturating_sub(r0));
                for s0 in (0..live_slabs).step_by(kc_slabs) {
                    let s1 = (s0 + kc_slabs).min(live_slabs);
                    for r in 0..rows {
                        let nn = r0 + r;
                        let (nt, nr) = (nn / N_TILE, nn % N_TILE);
                        let yr = &mut yblk[r * m..][..m];
                        let words = |si: usize| {
                            &packed[(nt * slabs + si) * slab_words + nr * 4 * half..][..4 * half]
                        };
                        let lane_sz = |si: usize, slot: usize| -> [f32; 4] {
                            std::array::from_fn(
                                |l| bf(sz[(lane_group(si, l) * np + nn) * 2 + slot]),
                            )
                        };
                        if m == 1 {
                            // Σ scale·Σ a(u−8) per slab; the zero term is added below.
                            for si in s0..s1 {
                                let lanes = fused_slab(words(si), &a[si * slab..][..slab]);
                                yr[0] += lane_sum(lanes, &lane_sz(si, 0));
                            }
                            continue;
                        }
                        // Dequantize the row's k-block once, then one dot per activation row.
                        let len = (s1 - s0) * slab;
                        for (si, out) in (s0..s1).zip(wbuf.chunks_exact_mut(slab)) {
                            dequant_slab(words(si), &lane_sz(si, 0), &lane_sz(si, 1), out);
                        }
                        // One plain dot per activation row: blocking several rows per pass
                        // made LLVM shuffle the accumulators (measured slower).
                        for (mi, y) in yr.iter_mut().enumerate() {
                            *y += dot(&a[mi * kp + s0 * slab..][..len], &wbuf[..len]);
                        }
                    }
                }
                if m == 1 {
                    // The zero-point term of the factored form: Σ_groups zero · Σ_group x.
                    for (r, y) in yblk.iter_mut().take(rows).enumerate() {
                        let nn = r0 + r;
                        *y += (0..geo.logical_groups())
                            .map(|gi| bf(sz[(gi * np + nn) * 2 + 1]) * asum[gi])
                            .sum::<f32>();
                    }
                }
            },
        );

    let mut y = vec![T::from_f32(0.0); m * n];
    y.par_chunks_mut(n).enumerate().for_each(|(mi, yrow)| {
        for (j, o) in yrow.iter_mut().enumerate() {
            let v = yt[j * m + mi] + bias.map_or(0.0, |b| b[j]);
            *o = T::from_f32(v);
        }
    });
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_order_is_a_permutation_matching_decode() {
        for ikt in [2usize, 4, 8] {
            let order = slab_order(ikt);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..ikt * 16).collect::<Vec<_>>());
            // one n-tile whose nibble at k is k % 16 (+ row): position pos of row n's
            // decoded slab holds u[n][order[pos]] - 8
            let kp = ikt * 16;
            let rows: Vec<u8> = (0..8 * kp)
                .map(|i| ((i % kp + i / kp) % 16) as u8)
                .collect();
            let mut words = vec![0i32; kp];
            crate::layout::pack_tile(&rows, kp, ikt, &mut words);
            let mut out = vec![0f32; kp];
            for n in 0..8 {
                dequant_slab(
                    &words[n * 4 * (ikt / 2)..][..2 * ikt],
                    &[1.0; 4],
                    &[0.0; 4],
                    &mut out,
                );
                for pos in 0..kp {
                    let u = (order[pos] + n) % 16;
                    assert_eq!(out[pos], u as f32 - 8.0, "ikt={ikt} n={n} pos={pos}");
                }
                let a: Vec<f32> = (0..kp).map(|i| (i % 7) as f32).collect();
                let lanes = fused_slab(&words[n * 4 * (ikt / 2)..][..2 * ikt], &a);
                let want: Vec<f32> = (0..4)
                    .map(|l| (l..kp).step_by(4).map(|p| a[p] * out[p]).sum())
                    .collect();
                assert_eq!(lanes.to_vec(), want);
            }
        }
    }
}
