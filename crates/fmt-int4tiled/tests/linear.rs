//! `int4_linear` against the dequantize-then-f64-matmul reference.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fmt_int4tiled::{
    Int4TiledQuantizer, Int4TiledTensor, Int4TiledTensorExt, int4_linear, int4_linear_reference,
    int4_linear_slice,
};
use half::{bf16, f16};
use quant_core::{DType, Element, Format, HostTensor, Usage};
use quantfmt_testkit::XorShift64;

fn rand_vec(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = XorShift64::scrambled(seed);
    (0..len)
        .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32 * scale)
        .collect()
}

/// |y - ref| <= 2^-8 * sum_k |x_k| (|u-8| s + |z|) + half an ulp of the output dtype at |ref|:
/// the reference uses the bf16-rounded weights (error <= 2^-9 |w| each), the kernel the
/// exact ones with f32 accumulation, and the output is rounded once.
fn check<T: Element>(x: &[T], m: usize, w: &Int4TiledTensor, bias: Option<&[T]>, y: &[T]) {
    let geo = w.geometry();
    let (n, k, g) = (geo.n, geo.k, geo.group_size);
    let r = int4_linear_reference(x, m, w, bias).unwrap();
    let l = w.to_logical().unwrap();
    let rel = match T::DTYPE {
        DType::F32 => 2f64.powi(-24),
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-11),
    };
    for i in 0..m {
        for j in 0..n {
            let mut bound = 0f64;
            for kk in 0..k {
                let gi = j * (k / g) + kk / g;
                let s = f64::from(l.scale[gi].to_f32());
                let z = f64::from(l.zero[gi].to_f32());
                let u = f64::from(l.u[j * k + kk]) - 8.0;
                bound += f64::from(x[i * k + kk].to_f32()).abs() * (u.abs() * s + z.abs());
            }
            let want = r[i * n + j];
            let got = f64::from(y[i * n + j].to_f32());
            let tol = bound * 2f64.powi(-8) + want.abs() * rel + 1e-30;
            assert!(
                (got - want).abs() <= tol,
                "y[{i}][{j}] = {got}, reference {want}, tolerance {tol}"
            );
        }
    }
}

fn quantize(spec: &[&str], n: usize, k: usize, seed: u64) -> Int4TiledTensor {
    let q = Int4TiledQuantizer::from_spec(spec, Usage::ROWWISE).unwrap();
    let w: Vec<bf16> = rand_vec(n * k, seed, 0.1)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    q.quantize(&HostTensor::bf16(&w, &[n, k]).unwrap()).unwrap()
}

#[test]
fn matches_reference_within_bf16_rounding() {
    for (spec, n, k) in [
        (&["g32", "k2"][..], 37usize, 96usize),
        (&["g128"][..], 64, 512),
        (&["g64", "k4", "pad=torchao"][..], 20, 320),
        (&["g256", "k8"][..], 8, 1024),
        (&["g32", "k8"][..], 13, 96), // k = 96 inside one 128-wide slab: a partial slab
    ] {
        let w = quantize(spec, n, k, (n * k) as u64);
        for m in [1usize, 3, 17] {
            let xf = rand_vec(m * k, (m + n) as u64, 2.0);
            let bias: Vec<f32> = rand_vec(n, 5, 1.0);
            // f32
            let y = int4_linear_slice(&xf, m, &w, Some(&bias)).unwrap();
            check(&xf, m, &w, Some(&bias), &y);
            // bf16
            let xb: Vec<bf16> = xf.iter().map(|&v| bf16::from_f32(v)).collect();
            let bb: Vec<bf16> = bias.iter().map(|&v| bf16::from_f32(v)).collect();
            let y = int4_linear_slice(&xb, m, &w, Some(&bb)).unwrap();
            check(&xb, m, &w, Some(&bb), &y);
            let y2 = int4_linear(
                &HostTensor::bf16(&xb, &[m, k]).unwrap(),
                &w,
                Some(&HostTensor::bf16(&bb, &[n]).unwrap()),
            )
            .unwrap();
            assert_eq!(y2.as_bytes(), bytemuck_bytes(&y));
            // f16, no bias
            let xh: Vec<f16> = xf.iter().map(|&v| f16::from_f32(v)).collect();
            let y = int4_linear_slice(&xh, m, &w, None).unwrap();
            check(&xh, m, &w, None, &y);
        }
    }
}

fn bytemuck_bytes(v: &[bf16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

#[test]
fn large_m_uses_k_blocking() {
    // m large enough that the activation is split into several k blocks.
    let (n, k, m) = (16, 4096, 96);
    let w = quantize(&["g128"], n, k, 1);
    let x = rand_vec(m * k, 2, 1.0);
    let y = int4_linear_slice(&x, m, &w, None).unwrap();
    check(&x, m, &w, None, &y);
}

#[test]
fn one_hot_rows_give_the_exact_weights() {
    // The CPU analogue of torchao's eye trick: with f32 one-hot activations every output is
    // one weight (u - 8)*s + z, rounded once to f32, i.e. dequantize::<f32>.
    let (n, k) = (24, 128);
    let w = quantize(&["g32", "k4"], n, k, 3);
    let mut x = vec![0f32; k * k];
    for i in 0..k {
        x[i * k + i] = 1.0;
    }
    let y = int4_linear_slice(&x, k, &w, None).unwrap(); // [k][n] = W^T
    let d = w.dequantize_f32().unwrap();
    for i in 0..k {
        for j in 0..n {
            assert_eq!(y[i * n + j].to_bits(), d[j * k + i].to_bits(), "({j}, {i})");
        }
    }
}

#[test]
fn shapes_and_errors() {
    let w = quantize(&["g32"], 12, 64, 9);
    // leading batch dims are folded
    let x = vec![0.5f32; 2 * 3 * 64];
    let y = int4_linear(&HostTensor::f32(&x, &[2, 3, 64]).unwrap(), &w, None).unwrap();
    assert_eq!(
        (y.dtype(), y.shape().dims()),
        (DType::F32, &[2usize, 3, 12][..])
    );
    // m = 0
    let y = int4_linear(&HostTensor::f32(&[], &[0, 64]).unwrap(), &w, None).unwrap();
    assert_eq!(y.shape().dims(), &[0, 12]);
    let e = int4_linear(&HostTensor::f32(&x[..2 * 32], &[2, 32]).unwrap(), &w, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("last dimension must be k = 64"), "{e}");
    let e = int4_linear_slice(&x[..64], 1, &w, Some(&[0.0f32; 5]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("must have n = 12 elements"), "{e}");
    let q = Int4TiledQuantizer::from_spec(&["g32"], Usage::ROWWISE).unwrap();
    let moe = q
        .quantize(&HostTensor::f32(&vec![0.1; 2 * 8 * 64], &[2, 8, 64]).unwrap())
        .unwrap();
    let e = int4_linear_slice(&x[..64], 1, &moe, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("select an expert first"), "{e}");
    let y = int4_linear_slice(&x[..64], 1, &moe.select_expert(1).unwrap(), None).unwrap();
    assert_eq!(y.len(), 8);
    let _ = Format::spec(&q);
}
