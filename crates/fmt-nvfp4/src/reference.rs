//! The specification in code: NVFP4 quantization one block at a time.
//!
//! [`quantize`] runs the scalar functions of [`crate::scale`] and [`crate::sr`] block by
//! block, with the columnwise operand materialized as a transposed (or
//! Hadamard-rotated) copy, exactly as TransformerEngine's unfused path feeds `x^T` to
//! its rowwise kernel. It is slow and allocates; it exists so that the fast engine (one
//! read of the input, SIMD, no copies) can be checked against it bit for bit, at every
//! SIMD level, on ragged shapes and special values.
//!
//! ```
//! use fmt_nvfp4::{reference, Nvfp4Quantizer};
//! use quant_core::{HostTensor, Usage};
//! let x: Vec<f32> = (0..32 * 48).map(|i| ((i * 37) % 101) as f32 / 7.0 - 7.0).collect();
//! let q = Nvfp4Quantizer::new(Usage::BOTH).with_stochastic_rounding(Some(3));
//! let x = HostTensor::f32(&x, &[32, 48])?;
//! let fast = q.quantize(&x)?;
//! let spec = reference::quantize(&q, &x)?;
//! for (a, b) in fast.buffers().iter().zip(spec.buffers()) {
//!     assert_eq!(a.bytes(), b.bytes(), "{}", a.name());
//! }
//! # Ok::<(), quant_core::Error>(())
//! ```

use quant_core::{HostTensor, QuantizedTensor, Result, dispatch_elements};

use crate::Nvfp4Quantizer;

/// Quantizes `x` with the scalar specification (global amaxes computed from `x`).
pub fn quantize(q: &Nvfp4Quantizer, x: &HostTensor<'_>) -> Result<QuantizedTensor<Nvfp4Quantizer>> {
    quantize_with(q, x, None)
}

/// [`quantize`] with given global amaxes `(rowwise, columnwise)`, as
/// [`Nvfp4Quantizer::quantize_with_amax`] takes them.
pub fn quantize_with(
    q: &Nvfp4Quantizer,
    x: &HostTensor<'_>,
    amax: Option<(f32, f32)>,
) -> Result<QuantizedTensor<Nvfp4Quantizer>> {
    q.validate()?;
    let mut t = QuantizedTensor::allocate(q.clone(), x.shape(), x.dtype())?;
    t.write_buffers(|bufs| {
        dispatch_elements!(x, |xs| q.reference_cast(xs, x.shape(), amax, bufs))
    })?;
    Ok(t)
}

/// Dequantizes direction `dir` of `t` to f32 one element at a time:
/// `e2m1(q) * ((f32(sdb) * amax) * f32(1/(6*E4M3_MAX)))`, written back in the logical
/// `[M, K]` layout; a Hadamard-rotated columnwise block is rotated back with
/// [`crate::rht::inverse_16`] (f64 sums, one rounding).
pub fn dequantize(
    t: &QuantizedTensor<Nvfp4Quantizer>,
    dir: quant_core::Direction,
) -> Result<Vec<f32>> {
    use quant_core::Direction;
    use quant_core::codec::e2m1;

    use crate::layout::{scale_index, scale_shape};
    use crate::scale::{BLOCK, dequant_factor};

    let q = t.quantizer();
    let (m, k) = t.shape().as_2d();
    let (data, scales, amax) = match dir {
        Direction::Rowwise => ("rowwise_data", "rowwise_scale_inv", "amax_rowwise"),
        Direction::Columnwise => ("columnwise_data", "columnwise_scale_inv", "amax_columnwise"),
    };
    let data = t.buffer(data)?.bytes();
    let scales = t.buffer(scales)?.bytes();
    let amax = t.buffer(amax)?.as_slice::<f32>()?;
    // The stored operand: [rows, cols] = [M, K] rowwise, [K, M] columnwise.
    let (rows, cols) = match dir {
        Direction::Rowwise => (m, k),
        Direction::Columnwise => (k, m),
    };
    let stride = scale_shape(rows, cols)[1];
    let value = |r: usize, c: usize| {
        let byte = data[(r * cols + c) / 2];
        let code = if c.is_multiple_of(2) {
            byte & 0xF
        } else {
            byte >> 4
        };
        let sdb = scales[scale_index(r, c / BLOCK, stride, q.swizzled())];
        let a = if amax.len() == 1 { amax[0] } else { amax[r] };
        e2m1::decode(code) * dequant_factor(sdb, a, q.e4m3_max())
    };
    let mut out = vec![0f32; m * k];
    for r in 0..rows {
        for c0 in (0..cols).step_by(BLOCK) {
            let y: [f32; BLOCK] = std::array::from_fn(|e| value(r, c0 + e));
            let v: [f32; BLOCK] = if dir == Direction::Columnwise && q.rht() {
                crate::rht::inverse_16(&y).map(|v| v as f32)
            } else {
                y
            };
            for (e, v) in v.into_iter().enumerate() {
                match dir {
                    Direction::Rowwise => out[r * k + c0 + e] = v,
                    Direction::Columnwise => out[(c0 + e) * k + r] = v,
                }
            }
        }
    }
    Ok(out)
}
