//! Inputs found by the fuzz targets in `fuzz/`, kept as regression tests (each names the
//! target and the finding; see `docs/SECURITY.md`). Nothing names a format: every case
//! runs against every registered one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use quantfmt::{DType, Direction, HostTensor, Quantizer, Usage, registry};

fn quantizers() -> Vec<Box<dyn Quantizer>> {
    registry()
        .entries()
        .iter()
        .map(|e| {
            e.from_spec(&[], Usage::BOTH)
                .or_else(|_| e.from_spec(&[], Usage::ROWWISE))
                .unwrap()
        })
        .collect()
}

fn dequantized(q: &dyn Quantizer, x: &HostTensor<'_>) -> Vec<Vec<f32>> {
    let s = q.quantize(x).unwrap();
    [Direction::Rowwise, Direction::Columnwise]
        .into_iter()
        .filter(|d| s.usage().has(*d))
        .map(|d| s.dequantize(d, DType::F32).unwrap().to_f32_vec())
        .collect()
}

/// `quantize` target, first run: `fp8-block:128x128` quantized a block whose amax was
/// -3.4028202e38 (one f32 ulp below -f32::MAX... times 0.99999) and dequantized it to -inf.
/// The pow2 scale is 2^-120, the element scales to 255.99 and E4M3 rounds that to 256, so
/// the value read back is 256 * 2^120 = 2^128: past f32::MAX. TransformerEngine writes the
/// same bytes and its dequantize overflows the same way, so the bytes stay TE's; the
/// documented contract is "finite in, finite out" for tensors with amax <= f32::MAX / 4,
/// which holds for every format (the second half of this test); above it, no panic and
/// no sign flip.
#[test]
fn quantize_top_of_the_f32_range() {
    let (m, k) = (128usize, 256usize);
    for q in quantizers() {
        let mut v: Vec<f32> = (0..m * k)
            .map(|i| ((i % 97) as f32 - 48.0) * 1e30)
            .collect();
        v[0] = -3.402_820_2e38;
        v[1] = f32::MAX;
        v[2] = -f32::MAX;
        let x = HostTensor::f32(&v, &[m, k]).unwrap();
        for y in dequantized(&*q, &x) {
            for (&xi, &yi) in v.iter().zip(&y) {
                // Above the contract formats differ: FP8 blockwise overflows the top
                // code to inf; int4tiled's group range `max - min` overflows to a NaN
                // scale for the whole group (torchao's arithmetic). A finite or
                // infinite result keeps the sign.
                assert!(
                    yi.is_nan() || yi == 0.0 || yi.signum() == xi.signum(),
                    "{}: {xi:e} -> {yi:e}",
                    q.spec()
                );
            }
        }
        // Amax at f32::MAX / 4: every value reads back finite.
        for w in v.iter_mut().take(3) {
            *w /= 4.0;
        }
        let x = HostTensor::f32(&v, &[m, k]).unwrap();
        for y in dequantized(&*q, &x) {
            assert!(y.iter().all(|y| y.is_finite()), "{}", q.spec());
        }
    }
}
