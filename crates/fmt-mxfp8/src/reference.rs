//! The specification in code: one element at a time, no parallelism, no bit tricks.
//!
//! The fast kernels must agree with these functions bit for bit (the crate's tests
//! check it on ragged shapes and special values). Slow; meant for tests and for
//! readers who want the rule without the optimisations.
//!
//! ```
//! use fmt_mxfp8::{reference, Mxfp8Quantizer};
//! use quant_core::{DType, HostTensor, Usage};
//! let x: Vec<f32> = (0..32 * 64).map(|i| (i as f32 - 900.0) * 0.37).collect();
//! let q = Mxfp8Quantizer::new(Usage::BOTH);
//! let r = reference::quantize(&q, &x, DType::F32, 32, 64)?;
//! let t = q.quantize(&HostTensor::f32(&x, &[32, 64])?)?;
//! assert_eq!(t.buffer("rowwise_data")?.bytes(), &r.rowwise_data[..]);
//! assert_eq!(t.buffer("columnwise_scale_inv")?.bytes(), &r.columnwise_scale_inv[..]);
//! # Ok::<(), quant_core::Error>(())
//! ```

use quant_core::codec::e8m0;
use quant_core::{DType, Direction, Error, Result};

use crate::layout::{ScaleLayout, check_dims, convert_scales, scale_shape};
use crate::quantizer::Mxfp8Quantizer;
use crate::scale::{BLOCK, ScaleRule};

/// Both directions of one tensor, scale buffers padded (zeros) in the quantizer's layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReferenceOutput {
    /// `[M, K]` FP8 codes, 1x32 (or 32x32) blocks.
    pub rowwise_data: Vec<u8>,
    /// `[roundup(M,128), roundup(K/32,4)]` E8M0 codes.
    pub rowwise_scale_inv: Vec<u8>,
    /// `[M, K]` FP8 codes, 32x1 (or 32x32) blocks.
    pub columnwise_data: Vec<u8>,
    /// `[roundup(M/32,4), roundup(K,128)]` E8M0 codes.
    pub columnwise_scale_inv: Vec<u8>,
}

/// `max |x|` over a block. TE: starts at 0 and skips NaN (`fmaxf`); OCP: NaN wins
/// (`torch.amax`).
pub fn block_amax(rule: ScaleRule, values: impl IntoIterator<Item = f32>) -> f32 {
    let mut amax = 0.0f32;
    for v in values {
        let a = v.abs();
        match rule {
            ScaleRule::Te => {
                if a > amax {
                    amax = a;
                }
            }
            ScaleRule::Ocp => {
                if a.is_nan() || amax.is_nan() {
                    amax = f32::NAN;
                } else if a > amax {
                    amax = a;
                }
            }
        }
    }
    amax
}

/// The E8M0 code of a block amax, written from the rule's definition.
pub fn block_code(q: &Mxfp8Quantizer, amax: f32) -> u8 {
    let dtype = q.dtype();
    match q.scale_rule() {
        // TE: val = amax * float(1/max), rounded up to a power of two (float_to_e8m0).
        ScaleRule::Te => e8m0::from_f32_ceil(amax * dtype.max_rcp()),
        // OCP: shared_exp = floor(log2(amax)) - emax_elem, clamped to [-127, 127];
        // NaN or inf in the block -> the NaN scale (torchao FLOOR).
        ScaleRule::Ocp => {
            if !amax.is_finite() {
                0xFF
            } else if amax == 0.0 {
                0
            } else {
                let shared = f64::from(amax).log2().floor() as i32 - dtype.emax() as i32;
                (shared.clamp(-127, 127) + 127) as u8
            }
        }
    }
}

/// The element ranges `(rows, cols)` of the block that scales element `(i, j)` in
/// direction `dir`: 1x32 rowwise, 32x1 columnwise, 32x32 in 2-D mode.
fn block_of(
    q: &Mxfp8Quantizer,
    dir: Direction,
    i: usize,
    j: usize,
) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let (bi, bj) = (i / BLOCK * BLOCK, j / BLOCK * BLOCK);
    if q.is_2d() {
        (bi..bi + BLOCK, bj..bj + BLOCK)
    } else {
        match dir {
            Direction::Rowwise => (i..i + 1, bj..bj + BLOCK),
            Direction::Columnwise => (bi..bi + BLOCK, j..j + 1),
        }
    }
}

/// Quantizes `x` (`[m, k]` row-major, widened exactly to f32 from its original dtype
/// `input`) in both directions, whatever the quantizer's usage. `input` and the usage
/// matter only for the sign of zero (see [`Mxfp8Quantizer::flushes_negative_zero`]).
pub fn quantize(
    q: &Mxfp8Quantizer,
    x: &[f32],
    input: DType,
    m: usize,
    k: usize,
) -> Result<ReferenceOutput> {
    check_dims(m, k)?;
    if x.len() != m * k {
        return Err(Error::invalid(
            "x",
            format!("{} elements", x.len()),
            format!("must hold {m} x {k}"),
        ));
    }
    let mut out = ReferenceOutput {
        rowwise_data: vec![0; m * k],
        rowwise_scale_inv: Vec::new(),
        columnwise_data: vec![0; m * k],
        columnwise_scale_inv: Vec::new(),
    };
    for dir in [Direction::Rowwise, Direction::Columnwise] {
        let [rows, cols] = scale_shape(dir, m, k);
        let mut compact = vec![0u8; rows * cols];
        // The scale entry (compact position) of element (i, j).
        let entry = |i: usize, j: usize| match dir {
            Direction::Rowwise => i * cols + j / BLOCK,
            Direction::Columnwise => (i / BLOCK) * cols + j,
        };
        // 1. One code per scale entry, from its block's amax.
        let mut done = vec![false; rows * cols];
        for i in 0..m {
            for j in 0..k {
                let e = entry(i, j);
                if !done[e] {
                    let (rr, cc) = block_of(q, dir, i, j);
                    let amax = block_amax(
                        q.scale_rule(),
                        rr.flat_map(|r| cc.clone().map(move |c| x[r * k + c])),
                    );
                    compact[e] = block_code(q, amax);
                    done[e] = true;
                }
            }
        }
        // 2. Every element: fp8(x * 2^(127 - code)); where TE's fast kernels compute
        //    fma(x, s, +0), an exact zero product is +0 (-0 + +0 = +0 under RN).
        let plus_zero = q.flushes_negative_zero(input, m, k);
        let data = match dir {
            Direction::Rowwise => &mut out.rowwise_data,
            Direction::Columnwise => &mut out.columnwise_data,
        };
        for i in 0..m {
            for j in 0..k {
                let code = compact[entry(i, j)];
                let xv = x[i * k + j];
                let v = if plus_zero && xv == 0.0 {
                    0.0
                } else {
                    xv * e8m0::exp2_rcp(code)
                };
                data[i * k + j] = q.dtype().encode(v);
            }
        }
        let mut scales = vec![0u8; rows * cols];
        convert_scales(
            dir,
            ScaleLayout::Compact,
            q.scale_layout(),
            &compact,
            &mut scales,
            m,
            k,
        )?;
        match dir {
            Direction::Rowwise => out.rowwise_scale_inv = scales,
            Direction::Columnwise => out.columnwise_scale_inv = scales,
        }
    }
    Ok(out)
}

/// Dequantizes one direction to f32: `x = float(q) * 2^(e-127)` (`e = 0` -> 2^-127,
/// `e = 255` -> NaN). `scales` is in the quantizer's layout.
pub fn dequantize(
    q: &Mxfp8Quantizer,
    dir: Direction,
    data: &[u8],
    scales: &[u8],
    m: usize,
    k: usize,
) -> Result<Vec<f32>> {
    check_dims(m, k)?;
    let [rows, cols] = scale_shape(dir, m, k);
    let mut compact = vec![0u8; rows * cols];
    convert_scales(
        dir,
        q.scale_layout(),
        ScaleLayout::Compact,
        scales,
        &mut compact,
        m,
        k,
    )?;
    if data.len() != m * k {
        return Err(Error::buffer("data", format!("must hold {m} x {k} bytes")));
    }
    let table = q.dtype().decode_table();
    let mut out = vec![0f32; m * k];
    for i in 0..m {
        for j in 0..k {
            let code = match dir {
                Direction::Rowwise => compact[i * cols + j / BLOCK],
                Direction::Columnwise => compact[(i / BLOCK) * cols + j],
            };
            out[i * k + j] = e8m0::decode(code) * table[usize::from(data[i * k + j])];
        }
    }
    Ok(out)
}
