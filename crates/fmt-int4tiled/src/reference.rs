//! The specification in code: torchao's per-element division, the tile layout written
//! word by word ([`crate::layout::pack_tile`]), and dequantization through the exact f64
//! formula of [`crate::dequant`]. Slow; the fast kernels are checked against it bit for
//! bit at every SIMD level.
//!
//! ```
//! use fmt_int4tiled::{reference, Int4TiledQuantizer};
//! use quant_core::HostTensor;
//! let w: Vec<f32> = (0..16 * 256).map(|i| ((i * 29) % 97) as f32 / 31.0 - 1.5).collect();
//! let x = HostTensor::f32(&w, &[16, 256])?;
//! let q = Int4TiledQuantizer::new().with_group_size(64)?;
//! let fast = q.quantize(&x)?;
//! let spec = reference::quantize(&q, &x)?;
//! assert_eq!(fast.buffer("packed_weight")?.bytes(), spec.buffer("packed_weight")?.bytes());
//! assert_eq!(fast.dequantize_f32()?, reference::dequantize::<f32>(&spec)?);
//! # Ok::<(), quant_core::Error>(())
//! ```

use half::bf16;
use quant_core::{Element, Format, HostTensor, QuantizedTensor, Result, dispatch_elements};

use crate::Int4TiledQuantizer;
use crate::dequant::dequant_value;
use crate::layout::unpack_row;

/// Quantizes `x` with the scalar specification.
pub fn quantize(
    q: &Int4TiledQuantizer,
    x: &HostTensor<'_>,
) -> Result<QuantizedTensor<Int4TiledQuantizer>> {
    q.check_shape(x.shape())?;
    let mut t = QuantizedTensor::allocate(q.clone(), x.shape(), x.dtype())?;
    t.write_buffers(|bufs| dispatch_elements!(x, |xs| q.reference_quantize(xs, x.shape(), bufs)))?;
    Ok(t)
}

/// Dequantizes every weight with [`dequant_value`], one at a time.
pub fn dequantize<T: Element>(t: &QuantizedTensor<Int4TiledQuantizer>) -> Result<Vec<T>> {
    let geo = t.quantizer().geometry(t.shape())?;
    let packed = t.buffer("packed_weight")?.as_slice::<i32>()?;
    let sz = t.buffer("scale_and_zero")?.as_slice::<bf16>()?;
    let (n, k, g, kp) = (geo.n, geo.k, geo.group_size, geo.k_padded);
    let mut out = Vec::with_capacity(geo.num_experts() * n * k);
    let mut u = vec![0u8; kp];
    for e in 0..geo.num_experts() {
        let words = &packed[e * geo.expert_words()..][..geo.expert_words()];
        let sz = &sz[e * geo.expert_scale_and_zero()..][..geo.expert_scale_and_zero()];
        for row in 0..n {
            unpack_row(words, row, kp, geo.inner_k_tiles, 0, &mut u);
            for (j, &v) in u[..k].iter().enumerate() {
                let at = ((j / g) * geo.n_padded + row) * 2;
                out.push(dequant_value::<T>(v, sz[at], sz[at + 1]));
            }
        }
    }
    Ok(out)
}
