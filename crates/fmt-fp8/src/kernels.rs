//! The inner loops shared by both FP8 recipes, written to vectorize: each block of input
//! is widened to f32 once, scaled with one multiply, and encoded branchlessly.

use quant_core::Element;
use quant_core::codec::{e4m3, e5m2};
use quant_core::cpu::BLOCK;

use crate::scale::Fp8Dtype;

/// `dst[i] = fp8(src[i] * scale)` over f32 values.
#[inline]
pub(crate) fn encode_f32(dt: Fp8Dtype, src: &[f32], scale: f32, dst: &mut [u8]) {
    // The dtype is matched once per call, not per element, so each loop is one codec.
    match dt {
        Fp8Dtype::E4M3 => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = e4m3::encode(s * scale);
            }
        }
        Fp8Dtype::E5M2 => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = e5m2::encode(s * scale);
            }
        }
    }
}

/// `dst[i] = fp8(float(src[i]) * scale)` for any input element type.
#[inline]
pub(crate) fn encode_scaled<T: Element>(dt: Fp8Dtype, src: &[T], scale: f32, dst: &mut [u8]) {
    let mut buf = [0f32; BLOCK];
    for (s, d) in src.chunks(BLOCK).zip(dst.chunks_mut(BLOCK)) {
        let w = &mut buf[..s.len()];
        T::widen_slice(s, w);
        encode_f32(dt, w, scale, d);
    }
}

/// `dst[i] = T(decode(src[i]) * scale_inv)`: the dequantize loop.
#[inline]
pub(crate) fn decode_scaled<T: Element>(dt: Fp8Dtype, src: &[u8], scale_inv: f32, dst: &mut [T]) {
    let table = dt.decode_table();
    let mut buf = [0f32; BLOCK];
    for (s, d) in src.chunks(BLOCK).zip(dst.chunks_mut(BLOCK)) {
        let w = &mut buf[..s.len()];
        for (o, &b) in w.iter_mut().zip(s) {
            *o = table[b as usize] * scale_inv;
        }
        T::narrow_slice(w, d);
    }
}

/// Widens one block, takes its NaN-ignoring amax, derives the scale with `scale_of`,
/// encodes the block with it and returns the scale: the whole 1x128 step in one pass
/// over the (cached) input.
#[inline]
pub(crate) fn amax_encode_block<T: Element>(
    dt: Fp8Dtype,
    src: &[T],
    dst: &mut [u8],
    scale_of: impl Fn(f32) -> f32,
) -> f32 {
    let mut buf = [0f32; BLOCK];
    let w = &mut buf[..src.len()];
    T::widen_slice(src, w);
    let scale = scale_of(quant_core::cpu::amax_f32(w));
    encode_f32(dt, w, scale, dst);
    scale
}
