//! Quantize arbitrary shapes and values with every registered format: no panic; where
//! the input is finite (and at most f32::MAX / 4), every stored direction dequantizes to
//! finite f32 values; what
//! quantize writes is accepted back by unflatten; quantizing twice gives the same bytes.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use quantfmt::{DType, Direction, HostTensor};
use quantfmt_fuzz::{Recipe, dtype_from, exercise, shape_from};

#[derive(Arbitrary, Debug)]
struct Input {
    recipe: Recipe,
    dims: Vec<u16>,
    dtype: u8,
    /// 0: raw f32 bit patterns (NaN, inf, subnormals, extremes); else integers scaled by
    /// a power of two picked from `scale`.
    mode: u8,
    scale: i8,
    values: Vec<u32>,
}

fuzz_target!(|input: Input| {
    let Some(q) = input.recipe.quantizer() else {
        return;
    };
    let Some(shape) = shape_from(&input.dims, 1 << 15) else {
        return;
    };
    let n = shape.numel();
    let pow = 2f32.powi(i32::from(input.scale) / 4);
    let xs: Vec<f32> = (0..n)
        .map(|i| {
            let v = input
                .values
                .get(i % input.values.len().max(1))
                .copied()
                .unwrap_or(0);
            if input.mode % 4 == 0 {
                f32::from_bits(v)
            } else {
                (v as i32 as f32 / 65536.0) * pow
            }
        })
        .collect();
    let x = HostTensor::f32(&xs, shape.dims()).unwrap();
    let x = match dtype_from(input.dtype) {
        DType::F32 => x,
        d => x.to_dtype(d).unwrap(),
    };
    let Ok(s) = q.quantize(&x) else {
        return;
    };
    assert_eq!(s.shape(), x.shape());
    // Finite in, finite out, for tensors whose amax is at most f32::MAX / 4. Within a
    // factor of 4 of f32::MAX the largest code times its scale may round past f32::MAX:
    // an E4M3 step rounds 0.99 * 2^128 up to 2^128 (TE's dequantize overflows the same
    // way, and the stored bytes are TE's); see docs/SECURITY.md.
    let xf = x.to_f32_vec();
    let finite = xf
        .iter()
        .all(|v| v.is_finite() && v.abs() <= f32::MAX / 4.0);
    for dir in [Direction::Rowwise, Direction::Columnwise] {
        if s.usage().has(dir) {
            let y = s.dequantize(dir, DType::F32).unwrap().to_f32_vec();
            if finite {
                if let Some(i) = y.iter().position(|v| !v.is_finite()) {
                    panic!(
                        "{} {dir}: finite input, dequantized element {i} is {} (input {})",
                        q.spec(),
                        y[i],
                        xf[i]
                    );
                }
            }
        }
    }
    let again = q.quantize(&x).unwrap();
    for (a, b) in s.buffers().iter().zip(again.buffers()) {
        assert!(a.bytes() == b.bytes(), "{}: not deterministic", q.spec());
    }
    exercise(&*s);
});
