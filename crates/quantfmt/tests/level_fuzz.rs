//! Random differential check of the fast paths: random recipes, shapes, usages, input
//! dtypes and value distributions, each quantized at the scalar level and at the best
//! level this CPU has (and on a pool of 1 to 4 workers), then dequantized both ways
//! into each output dtype. Every buffer and every output must be the same bytes, and a
//! refusal must be a refusal at both levels. The `_into` paths must give those bytes
//! too when the memory they write already holds other data: `quantize_into` over the
//! storage of another input, `dequantize_into` over a `0xA5` fill.
//!
//! `simd_levels.rs` pins hand-picked shapes and special values; this test walks the
//! space around them: ragged and aligned shapes, leading batch dimensions, all-zero and
//! all-negative-zero tensors, values from f32 subnormals to `3e37`, random bit patterns,
//! lone NaNs and infinities. CI runs 300 cases from a fixed seed;
//! `QUANTFMT_FUZZ_CASES=N` and `QUANTFMT_FUZZ_SEED=S` run more or others (a failure
//! names its case and seed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/outputs.rs"]
mod outputs;

use outputs::{buffer_bytes, dequantizations};
use quant_core::simd::{self, Level};
use quantfmt::half::{bf16, f16};
use quantfmt::{
    DType, Direction, Element, FormatSpec, HostDataMut, HostTensor, Quantizer, Shape, Storage,
    Usage,
};
use quantfmt_testkit::XorShift64;

const SPECS: [&str; 34] = [
    "fp8",
    "fp8:e5m2",
    "fp8:pow2",
    "fp8:eps=1e-3",
    "fp8-block:1x128",
    "fp8-block:128x128",
    "fp8-block:1x128,fp32-scales",
    "fp8-block:128x128,e5m2",
    "fp8-block:1x128,e5m2,fp32-scales",
    "mxfp8",
    "mxfp8:e5m2",
    "mxfp8:2d",
    "mxfp8:ocp",
    "mxfp8:swizzled",
    "mxfp8:ocp,e5m2,swizzled",
    "nvfp4",
    "nvfp4:2d",
    "nvfp4:rht",
    "nvfp4:sr",
    "nvfp4:seed=7",
    "nvfp4:row-scaled",
    "nvfp4:4over6",
    "nvfp4:4over6=mse",
    "nvfp4:4over6,e4m3max=256",
    "nvfp4:swizzled",
    "nvfp4:2d,sr",
    "nvfp4:rht,sr",
    "nvfp4:row-scaled,4over6",
    "int4tiled",
    "int4tiled:g32",
    "int4tiled:g64,k2",
    "int4tiled:g256,k4",
    "int4tiled:pad=torchao",
    "int4tiled:eps=1e-6",
];

/// A number below `n`.
fn below(r: &mut XorShift64, n: usize) -> usize {
    (r.next_u64() % n as u64) as usize
}

/// A standard normal value (Box-Muller).
fn normal(r: &mut XorShift64) -> f32 {
    let u = r.next_f32().max(1e-7);
    let v = r.next_f32();
    (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
}

/// `n` values from one of several distributions.
fn values(r: &mut XorShift64, n: usize) -> Vec<f32> {
    let scale = [1e-30, 1e-6, 1e4, 3e37, 1e-40, 1.0, 1.0, 1.0][below(r, 8)];
    let mut v: Vec<f32> = (0..n).map(|_| normal(r) * scale).collect();
    match below(r, 9) {
        0 => {
            for _ in 0..n / 50 + 1 {
                let i = below(r, n);
                v[i] *= 1000.0;
            }
        }
        1 => v.iter_mut().for_each(|x| {
            if r.next_u64().is_multiple_of(3) {
                *x = 0.0;
            }
        }),
        2 => v[below(r, n)] = f32::NAN,
        3 => v[below(r, n)] = [f32::INFINITY, f32::NEG_INFINITY][below(r, 2)],
        4 => v.iter_mut().for_each(|x| *x = (*x * 4.0).round() / 4.0),
        5 => v.iter_mut().for_each(|x| {
            let b = f32::from_bits(r.next_u64() as u32);
            *x = if b.is_finite() { b } else { 1.0 };
        }),
        6 => {
            v.iter_mut().for_each(|x| *x = -0.0);
            v[n / 2] = 2.5;
        }
        7 => {
            let s = r.next_f32() * 400.0;
            v.iter_mut().for_each(|x| *x = x.signum() * s);
        }
        _ => {}
    }
    v
}

/// A quantization's buffers and its dequantizations ([`buffer_bytes`],
/// [`dequantizations`]).
type Run = (Vec<Vec<u8>>, Vec<Option<Vec<u8>>>);

/// The `_into` paths into memory that already holds other bytes: `x` quantized with
/// `quantize_into` into the storage of `other` (same shape, other values), then each
/// dequantization written with `dequantize_into` over a `0xA5` fill. A kernel that
/// relied on zeroed memory (padding, tails, unused scale slots) or skipped an output
/// element would leave the old bytes; `None` where `other` is refused.
fn reused(q: &dyn Quantizer, x: &HostTensor<'_>, other: &HostTensor<'_>) -> Option<Run> {
    let mut s = q.quantize(other).ok()?;
    q.quantize_into(x, &mut *s).unwrap();
    let n = x.shape().numel();
    let mut out = Vec::new();
    for dir in [Direction::Rowwise, Direction::Columnwise] {
        out.push(dequantize_over(&*s, dir, f32::from_bits(0xA5A5_A5A5), n));
        out.push(dequantize_over(&*s, dir, bf16::from_bits(0xA5A5), n));
        out.push(dequantize_over(&*s, dir, f16::from_bits(0xA5A5), n));
    }
    Some((buffer_bytes(&*s), out))
}

/// `s.dequantize_into` in `dir` over `n` copies of `fill`, as bytes; `None` where it
/// refuses.
fn dequantize_over<T: Element>(
    s: &dyn Storage,
    dir: Direction,
    fill: T,
    n: usize,
) -> Option<Vec<u8>> {
    let mut out = vec![fill; n];
    s.dequantize_into(dir, HostDataMut::from(&mut out[..]))
        .ok()?;
    Some(
        HostTensor::from_slice(&out, &[n])
            .unwrap()
            .as_bytes()
            .to_vec(),
    )
}

/// Random case `id` (its index and seed, for the messages); `Some(description)` if it
/// ran.
fn case(r: &mut XorShift64, id: &str) -> Option<String> {
    let spec_s = SPECS[below(r, SPECS.len())];
    let spec: FormatSpec = spec_s.parse().unwrap();
    let mult = [1, 16, 32, 128][below(r, 4)];
    let (m_max, k_max) = if below(r, 4) == 0 {
        (300, 2200)
    } else {
        (130, 400)
    };
    let mut m = 1 + below(r, m_max);
    let mut k = 1 + below(r, k_max);
    if below(r, 2) == 0 {
        m = m.div_ceil(mult) * mult;
        k = k.div_ceil(mult) * mult;
    }
    let dims = if below(r, 6) == 0 && m.is_multiple_of(2) {
        vec![2, m / 2, k]
    } else {
        vec![m, k]
    };
    let usage = [Usage::ROWWISE, Usage::COLUMNWISE, Usage::BOTH][below(r, 3)];
    let dtype = [DType::F32, DType::BF16, DType::F16][below(r, 3)];
    let workers = 1 + below(r, 4);
    let v = values(r, m * k);
    let q = spec.boxed(usage).ok()?;
    q.check_shape(&Shape::new(&dims).unwrap()).ok()?;
    let what = format!("{id}: {spec_s} {dims:?} {usage} from {dtype}");
    let x = HostTensor::f32(&v, &dims).unwrap().to_dtype(dtype).unwrap();
    let scalar = simd::with_level(Level::Scalar, || {
        q.quantize(&x)
            .map(|s| (buffer_bytes(&*s), dequantizations(&*s)))
    })
    .unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(workers)
        .build()
        .unwrap();
    let best = pool.install(|| {
        q.quantize(&x)
            .map(|s| (buffer_bytes(&*s), dequantizations(&*s)))
    });
    match (scalar, best) {
        (Ok((qa, da)), Ok((qb, db))) => {
            assert_eq!(qa.len(), qb.len(), "{what}: buffer count");
            for (i, (a, b)) in qa.iter().zip(&qb).enumerate() {
                assert!(
                    a == b,
                    "{what}: buffer {i} differs at {} on {workers} workers",
                    simd::level()
                );
            }
            for (i, (a, b)) in da.iter().zip(&db).enumerate() {
                assert!(a == b, "{what}: dequantization {i} differs");
            }
            let other: Vec<f32> = v.iter().rev().map(|&t| 0.5 - 3.0 * t).collect();
            let other = HostTensor::f32(&other, &dims)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            if let Some((qr, dr)) = pool.install(|| reused(&*q, &x, &other)) {
                for (i, (a, b)) in qr.iter().zip(&qb).enumerate() {
                    assert!(a == b, "{what}: buffer {i} differs after quantize_into");
                }
                for (i, (a, b)) in dr.iter().zip(&db).enumerate() {
                    assert!(a == b, "{what}: dequantize_into {i} differs");
                }
            }
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!(
            "{what}: scalar {:?}, {}: {:?}",
            a.err(),
            simd::level(),
            b.err()
        ),
    }
    Some(what)
}

#[test]
fn random_cases_give_the_same_bytes_at_every_level() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let cases = env("QUANTFMT_FUZZ_CASES").unwrap_or(300);
    let seed = env("QUANTFMT_FUZZ_SEED").unwrap_or(0x5EED_0049);
    if simd::level() == Level::Scalar {
        eprintln!("skipped: this CPU runs only the scalar level");
        return;
    }
    let mut drawn = 0;
    for i in 0..cases {
        let mut r = XorShift64::new(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        // Draws until the recipe takes the shape (MXFP8 wants multiples of 32, ...).
        loop {
            drawn += 1;
            if case(&mut r, &format!("case {i} of seed {seed:#x}")).is_some() {
                break;
            }
        }
    }
    eprintln!("{cases} cases ({drawn} drawn; the others had shapes their recipe refuses)");
}
