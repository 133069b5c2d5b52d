//! Weight-only int4 matmul on the CPU: `y = x Wᵀ (+ bias)` straight from the tiled layout.
//!
//! W is never materialized. Per group of `g` columns, the stored nibbles of 4 rows are
//! decoded into a small f32 tile of `u − 8`, and each activation row is reduced against it:
//!
//! ```text
//! y[m][n] = Σ_groups ( scale · Σ_{k∈group} x[m][k]·(u[n][k] − 8)  +  zero · Σ_{k∈group} x[m][k] )
//! ```
//!
//! which is `Σ_k x·w` for the *exact* weights `w = (u − 8)·scale + zero`, the f32 weights
//! torch's AVX-512 `_weight_int4pack_mm_for_cpu` forms with an FMA (not the bf16-rounded
//! weights of the CUDA kernel; spec section 6). Accumulation is f32; the output is
//! rounded once to the activation dtype after adding the bias. Results therefore differ
//! from a dequantize-then-matmul by less than bf16 rounding, not bit for bit (no CPU or
//! GPU int4 matmul is bit-reproducible across implementations: the summation order is
//! free).
//!
//! Layout trick: the 4 words of lanes `t = 4·(n%8) + c`, `c = 0..4`, for one 32-wide k
//! block hold all 32 nibbles of that block for row `n`. Their 16 bytes split into 16 low
//! and 16 high nibbles with a mask and a shift, so the activation is permuted once per
//! call (within each 32-block, [`PERM32`]) to match, and the decode is a plain
//! byte-to-float conversion the compiler vectorizes.
//!
//! Parallelism: rayon over blocks of 32 output rows (4 n-tiles); inside, the activation
//! is blocked along k so that `m × KC` floats stay in cache while the block's rows reuse
//! them.

use half::bf16;
use quant_core::{Element, Error, HostTensor, Result, dispatch_elements};
use rayon::prelude::*;

use crate::layout::{K_TILE, LANES, N_TILE};
use crate::tensor::{Int4TiledTensor, Int4TiledTensorExt};

/// `PERM32[pos]` is the k offset (within a 32-wide block) of decoded position `pos`:
/// positions `0..16` are the low nibbles of the block's 16 bytes (4 lane words, little
/// endian), positions `16..32` their high nibbles.
pub const PERM32: [usize; 32] = {
    let mut p = [0usize; 32];
    let mut pos = 0;
    while pos < 32 {
        let h = pos / 16;
        let l = pos % 16;
        let (c, bb) = (l / 4, l % 4);
        let j = 2 * bb + h;
        p[pos] = 8 * (j % 4) + 2 * c + j / 4;
        pos += 1;
    }
    p
};

/// Rows of W per parallel task (4 n-tiles).
const ROWS_PER_TASK: usize = 32;
/// Rows decoded together (register blocking of the dot products).
const QUAD: usize = 4;
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

/// Decodes the 32 nibbles of row `n`, 32-block `b` into `out` as `u − 8` in [`PERM32`] order.
#[inline(always)]
fn decode_block(packed: &[i32], n: usize, b: usize, slabs: usize, half: usize, out: &mut [f32]) {
    let (nt, nr) = (n / N_TILE, n % N_TILE);
    let (kot, p) = (b / half, b % half);
    let base = ((nt * slabs + kot) * LANES + nr * 4) * half + p;
    let mut bytes = [0u8; 16];
    for (c, dst) in bytes.chunks_exact_mut(4).enumerate() {
        dst.copy_from_slice(&packed[base + c * half].to_le_bytes());
    }
    let (lo, hi) = out.split_at_mut(16);
    for ((l, h), &v) in lo.iter_mut().zip(hi.iter_mut()).zip(&bytes) {
        *l = f32::from(v & 0xF) - 8.0;
        *h = f32::from(v >> 4) - 8.0;
    }
}

/// Four dot products of `a` against the rows of `w` (each `a.len()` long), 8 lanes each.
#[inline(always)]
fn dot4(a: &[f32], w: [&[f32]; QUAD]) -> [f32; QUAD] {
    let mut acc = [[0f32; 8]; QUAD];
    let chunks = a.chunks_exact(8);
    for (i, av) in chunks.enumerate() {
        for (r, accr) in acc.iter_mut().enumerate() {
            let wv = &w[r][i * 8..][..8];
            for l in 0..8 {
                accr[l] += av[l] * wv[l];
            }
        }
    }
    acc.map(|v| ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])))
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
    let groups = geo.logical_groups();
    let (np, half) = (geo.n_padded, geo.inner_k_tiles / 2);
    let slabs = geo.k_padded / (geo.inner_k_tiles * K_TILE);

    // Activation permuted within each 32-block to the decode order, and group sums.
    let mut a = vec![0f32; m * k];
    let mut asum = vec![0f32; m * groups];
    a.par_chunks_mut(k)
        .zip(asum.par_chunks_mut(groups))
        .enumerate()
        .for_each(|(i, (arow, srow))| {
            let xrow = &x[i * k..][..k];
            for (dst, src) in arow.chunks_exact_mut(32).zip(xrow.chunks_exact(32)) {
                for (d, &p) in dst.iter_mut().zip(PERM32.iter()) {
                    *d = src[p].to_f32();
                }
            }
            for (s, grp) in srow.iter_mut().zip(xrow.chunks_exact(g)) {
                *s = grp.iter().map(|v| f64::from(v.to_f32())).sum::<f64>() as f32;
            }
        });

    // k-block so that m x kc activations stay in cache.
    let kc = ((ACT_BLOCK_BYTES / 4 / m) / g).max(1) * g;
    let gpb = kc / g; // groups per k-block

    let mut yt = vec![0f32; np * m]; // [n_padded][m]
    yt.par_chunks_mut(ROWS_PER_TASK * m)
        .enumerate()
        .for_each(|(task, yblk)| {
            let r0 = task * ROWS_PER_TASK;
            let rows = yblk.len() / m;
            let mut wbuf = vec![0f32; QUAD * g];
            for gb in (0..groups).step_by(gpb) {
                for q in (0..rows).step_by(QUAD) {
                    for gi in gb..(gb + gpb).min(groups) {
                        let mut sc = [0f32; QUAD];
                        let mut ze = [0f32; QUAD];
                        for (r, wrow) in wbuf.chunks_exact_mut(g).enumerate() {
                            let nn = r0 + q + r;
                            for (bi, out) in wrow.chunks_exact_mut(32).enumerate() {
                                decode_block(packed, nn, gi * g / 32 + bi, slabs, half, out);
                            }
                            let at = (gi * np + nn) * 2;
                            sc[r] = sz[at].to_f32();
                            ze[r] = sz[at + 1].to_f32();
                        }
                        let wr: [&[f32]; QUAD] = std::array::from_fn(|r| &wbuf[r * g..][..g]);
                        for mi in 0..m {
                            let av = &a[mi * k + gi * g..][..g];
                            let d = dot4(av, wr);
                            let s = asum[mi * groups + gi];
                            for r in 0..QUAD {
                                yblk[(q + r) * m + mi] += sc[r] * d[r] + ze[r] * s;
                            }
                        }
                    }
                }
            }
        });

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
    use crate::layout::NIBBLE_K_OFFSET;

    #[test]
    fn perm32_matches_the_nibble_map() {
        // position pos = h*16 + 4c + bb is nibble j = 2bb + h of lane word c.
        for pos in 0..32 {
            let (h, c, bb) = (pos / 16, (pos % 16) / 4, pos % 4);
            let j = 2 * bb + h;
            assert_eq!(PERM32[pos], 2 * c + NIBBLE_K_OFFSET[j]);
        }
        let mut sorted = PERM32;
        sorted.sort_unstable();
        assert_eq!(sorted, std::array::from_fn(|i| i));
    }
}
