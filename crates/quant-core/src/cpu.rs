//! CPU building blocks that vectorize: block widening and NaN-ignoring amax.
//!
//! Kernels process their input in blocks of [`BLOCK`] elements: widen the block to f32
//! on the stack once ([`Element::widen_slice`]), then run branchless loops over it. The
//! amax here keeps 16 independent lanes so the compiler can use vector max instructions
//! (whose "NaN loses" behaviour is exactly CUDA `fmaxf`'s).

use rayon::prelude::*;

use crate::dtype::Element;

/// Elements widened per step (fits L1 comfortably: 2 KiB of f32).
pub const BLOCK: usize = 512;

/// Elements per parallel work item of a streaming pass.
pub const PAR_CHUNK: usize = 1 << 16;

/// `fmaxf(m, a)` for `m >= 0`: a NaN `a` loses.
#[inline(always)]
pub fn fmax_nan_loses(m: f32, a: f32) -> f32 {
    if a > m { a } else { m }
}

/// `max |x|` over f32 values, ignoring NaN, starting from 0 (CUDA `fmaxf` semantics).
///
/// ```
/// assert_eq!(quant_core::cpu::amax_f32(&[1.0, f32::NAN, -3.0, 2.0]), 3.0);
/// assert_eq!(quant_core::cpu::amax_f32(&[]), 0.0);
/// ```
#[inline]
pub fn amax_f32(xs: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = fmax_nan_loses(*a, v.abs());
        }
    }
    let mut m = chunks
        .remainder()
        .iter()
        .fold(0f32, |m, v| fmax_nan_loses(m, v.abs()));
    for a in acc {
        m = fmax_nan_loses(m, a);
    }
    m
}

/// `max |x|` of any input element type, ignoring NaN (widens block by block).
#[inline]
pub fn amax<T: Element>(xs: &[T]) -> f32 {
    let mut buf = [0f32; BLOCK];
    xs.chunks(BLOCK).fold(0f32, |m, c| {
        let w = &mut buf[..c.len()];
        T::widen_slice(c, w);
        fmax_nan_loses(m, amax_f32(w))
    })
}

/// [`amax`] in parallel over chunks of the input.
pub fn par_amax<T: Element>(xs: &[T]) -> f32 {
    xs.par_chunks(PAR_CHUNK)
        .map(amax::<T>)
        .reduce(|| 0.0, fmax_nan_loses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn amax_matches_a_sequential_fold() {
        let xs: Vec<f32> = (0..10_007)
            .map(|i| match i % 97 {
                0 => f32::NAN,
                1 => -0.0,
                _ => ((i * 7919) % 1000) as f32 - 500.0,
            })
            .collect();
        let seq = xs.iter().fold(0f32, |m, v| fmax_nan_loses(m, v.abs()));
        assert_eq!(amax_f32(&xs), seq);
        assert_eq!(par_amax(&xs), seq);
        let b: Vec<bf16> = xs.iter().map(|&v| bf16::from_f32(v)).collect();
        assert_eq!(amax(&b), seq);
        assert_eq!(amax_f32(&[f32::NAN; 40]), 0.0);
        assert_eq!(amax_f32(&[f32::NEG_INFINITY]), f32::INFINITY);
    }
}
