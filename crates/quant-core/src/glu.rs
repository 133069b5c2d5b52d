//! GLU weight interleaving: `[W_all; V_all]` <-> `[W0:k, V0:k, W1:k, V1:k, ...]`.
//!
//! A fused gate/up (fc1) weight of a gated MLP stacks the gate rows `W` and the up rows
//! `V` along dim 0. Some kernels want them block-interleaved with block size `k` so one
//! tile of the output holds matching gate and up columns. These functions convert
//! between the two orders for plain tensors and, without dequantizing, for quantized
//! storages (rows move with their scales; `k` must then be a multiple of the format's row
//! granularity). The two directions are exact inverses.
//!
//! ```
//! use quant_core::glu::{interleave_glu, deinterleave_glu};
//! use quant_core::HostTensor;
//! // dim 0 = 4: W = rows 0,1; V = rows 2,3; k = 1 -> W0, V0, W1, V1
//! let x = HostTensor::f32(&[0., 1., 2., 3.], &[4, 1])?;
//! let y = interleave_glu(&x, 1)?;
//! assert_eq!(y.to_f32_vec(), vec![0., 2., 1., 3.]);
//! assert_eq!(deinterleave_glu(&y, 1)?.to_f32_vec(), x.to_f32_vec());
//! assert!(interleave_glu(&x, 3).is_err()); // 4 is not divisible by 2*3
//! # Ok::<(), quant_core::Error>(())
//! ```

use std::ops::Range;

use crate::error::{Error, Result};
use crate::tensor::HostTensor;
use crate::traits::Storage;

fn check(dim0: usize, k: usize) -> Result<usize> {
    if k == 0 {
        return Err(Error::invalid("interleave_size", 0, "must be > 0"));
    }
    if !dim0.is_multiple_of(2 * k) {
        return Err(Error::invalid(
            "dim 0",
            dim0,
            format!(
                "must be divisible by 2 * interleave_size = {} (interleave_size = {k})",
                2 * k
            ),
        ));
    }
    Ok(dim0 / (2 * k))
}

/// Dim-0 ranges that turn `[W; V]` into the interleaved order.
pub fn interleave_ranges(dim0: usize, k: usize) -> Result<Vec<Range<usize>>> {
    let blocks = check(dim0, k)?;
    let half = dim0 / 2;
    Ok((0..blocks)
        .flat_map(|j| [j * k..(j + 1) * k, half + j * k..half + (j + 1) * k])
        .collect())
}

/// Dim-0 ranges that turn the interleaved order back into `[W; V]`.
pub fn deinterleave_ranges(dim0: usize, k: usize) -> Result<Vec<Range<usize>>> {
    let blocks = check(dim0, k)?;
    Ok((0..blocks)
        .map(|j| 2 * j * k..(2 * j + 1) * k)
        .chain((0..blocks).map(|j| (2 * j + 1) * k..(2 * j + 2) * k))
        .collect())
}

/// Rows `ranges` of dim 0 of a plain tensor, concatenated.
pub fn gather_dim0_host(
    x: &HostTensor<'_>,
    ranges: &[Range<usize>],
) -> Result<HostTensor<'static>> {
    let dims = x.shape().dims();
    let d0 = dims[0];
    let row = x.shape().numel().checked_div(d0).unwrap_or(0) * x.dtype().size();
    let bytes = x.as_bytes();
    let mut out = Vec::new();
    let mut total = 0;
    for r in ranges {
        if r.start > r.end || r.end > d0 {
            return Err(Error::invalid(
                "range",
                format!("{}..{}", r.start, r.end),
                format!("must lie within dim 0 of size {d0}"),
            ));
        }
        out.extend_from_slice(&bytes[r.start * row..r.end * row]);
        total += r.end - r.start;
    }
    let mut out_dims = dims.to_vec();
    out_dims[0] = total;
    Ok(HostTensor::from_le_bytes(x.dtype(), &out, &out_dims)?.into_owned())
}

/// `[W; V]` -> `[W0:k, V0:k, W1:k, V1:k, ...]` along dim 0 of a plain tensor.
pub fn interleave_glu(x: &HostTensor<'_>, k: usize) -> Result<HostTensor<'static>> {
    gather_dim0_host(x, &interleave_ranges(x.shape().dims()[0], k)?)
}

/// The inverse of [`interleave_glu`].
pub fn deinterleave_glu(x: &HostTensor<'_>, k: usize) -> Result<HostTensor<'static>> {
    gather_dim0_host(x, &deinterleave_ranges(x.shape().dims()[0], k)?)
}

/// [`interleave_glu`] on a quantized storage, without dequantizing.
pub fn interleave_glu_storage<S: Storage + ?Sized>(s: &S, k: usize) -> Result<Box<dyn Storage>> {
    s.gather_dim0(&interleave_ranges(s.shape().dims()[0], k)?)
}

/// [`deinterleave_glu`] on a quantized storage, without dequantizing.
pub fn deinterleave_glu_storage<S: Storage + ?Sized>(s: &S, k: usize) -> Result<Box<dyn Storage>> {
    s.gather_dim0(&deinterleave_ranges(s.shape().dims()[0], k)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_inverse_permutations() {
        for (d0, k) in [(8, 1), (8, 2), (8, 4), (12, 3)] {
            let fwd: Vec<usize> = interleave_ranges(d0, k)
                .unwrap()
                .into_iter()
                .flatten()
                .collect();
            let back: Vec<usize> = deinterleave_ranges(d0, k)
                .unwrap()
                .into_iter()
                .flatten()
                .collect();
            let composed: Vec<usize> = back.iter().map(|&i| fwd[i]).collect();
            assert_eq!(composed, (0..d0).collect::<Vec<_>>());
        }
        let e = interleave_ranges(10, 3).unwrap_err().to_string();
        assert!(e.contains("10") && e.contains("6"), "{e}");
        assert!(interleave_ranges(8, 0).is_err());
    }
}
