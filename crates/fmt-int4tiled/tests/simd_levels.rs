//! The fast pack / dequantize kernels against the scalar specification
//! ([`fmt_int4tiled::reference`]) at every SIMD level this CPU can run, and the
//! division-free quotient against IEEE division.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fmt_int4tiled::{Int4TiledQuantizer, reference};
use half::bf16;
use quant_core::simd::{self, Level};
use quant_core::{DType, Format, HostTensor, Usage};
use quantfmt_testkit::{XorShift64, unit_f64};

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = XorShift64::scrambled(seed);
    (0..n)
        .map(|i| {
            let s = rng.next_u64();
            let u = unit_f64(s);
            match s % 211 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => -0.0,
                3 => f32::from_bits(1 + (s as u32 & 0xFFFF)),
                4 => 1e30,
                _ => ((u - 0.5) * 4.0) as f32 * if i % 1000 < 64 { 1e-30 } else { 1.0 },
            }
        })
        .collect()
}

#[test]
fn kernels_equal_reference_at_every_level() {
    let cases: &[(&[usize], &[&str])] = &[
        (&[8, 256], &[]),
        (&[20, 384], &["g32", "k2"]),
        (&[13, 512], &["g64", "k4"]),
        (&[2, 12, 256], &["g256"]),
        (&[9, 1024], &["g128", "k8", "pad=torchao"]),
        (&[17, 64], &["g64", "eps=1e-6", "pad=torchao"]),
    ];
    let mut checked = 0;
    let levels = simd::for_each_supported_level(|level| {
        for (ci, (shape, opts)) in cases.iter().enumerate() {
            let q = Int4TiledQuantizer::from_spec(opts, Usage::ROWWISE).unwrap();
            let n: usize = shape.iter().product();
            let base = data(n, 5 + ci as u64);
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let x = HostTensor::f32(&base, shape)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let fast = q.quantize(&x).unwrap();
                let spec = reference::quantize(&q, &x).unwrap();
                for (a, b) in fast.buffers().iter().zip(spec.buffers()) {
                    assert_eq!(
                        a.bytes(),
                        b.bytes(),
                        "level {level} {shape:?} {opts:?} {dtype}: {}",
                        a.name()
                    );
                }
                let f = fast
                    .dequantize_as::<f32>(quant_core::Direction::Rowwise)
                    .unwrap();
                let r = reference::dequantize::<f32>(&spec).unwrap();
                assert!(
                    f.iter()
                        .zip(&r)
                        .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
                    "level {level} {shape:?} {opts:?} f32 dequant"
                );
                let f = fast
                    .dequantize_as::<bf16>(quant_core::Direction::Rowwise)
                    .unwrap();
                let r = reference::dequantize::<bf16>(&spec).unwrap();
                assert!(
                    f.iter()
                        .zip(&r)
                        .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
                    "level {level} {shape:?} {opts:?} bf16 dequant"
                );
                let f = fast
                    .dequantize_as::<half::f16>(quant_core::Direction::Rowwise)
                    .unwrap();
                let r = reference::dequantize::<half::f16>(&spec).unwrap();
                assert!(
                    f.iter()
                        .zip(&r)
                        .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
                    "level {level} {shape:?} {opts:?} f16 dequant"
                );
                checked += 1;
            }
        }
    });
    assert!(levels.contains(&Level::Scalar));
    assert!(checked >= 18);
}

/// Dequantization with scales and zeros chosen to stress the single rounding: every
/// nibble against `dequant_value` (via the reference) for random bf16 scale/zero pairs,
/// into bf16, f32 and f16.
#[test]
fn dequant_single_rounding_on_random_qparams() {
    let q = Int4TiledQuantizer::from_spec(&["g32"], Usage::ROWWISE).unwrap();
    let (n, k) = (64, 64);
    let u: Vec<u8> = (0..n * k).map(|i| (i % 16) as u8).collect();
    let mut rng = XorShift64::new(0x1234_5678);
    let scale: Vec<bf16> = (0..n * 2)
        .map(|_| bf16::from_bits((rng.next_u64() as u16) & 0x7FFF))
        .collect();
    let zero: Vec<bf16> = (0..n * 2)
        .map(|_| bf16::from_bits(rng.next_u64() as u16))
        .collect();
    use fmt_int4tiled::Int4TiledQuantizer as Q;
    let t = <Q>::from_logical(&q, &[n, k], &u, &scale, &zero).unwrap();
    simd::for_each_supported_level(|level| {
        for (a, b) in t
            .dequantize_as::<bf16>(quant_core::Direction::Rowwise)
            .unwrap()
            .iter()
            .zip(reference::dequantize::<bf16>(&t).unwrap())
        {
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "level {level}: {a} vs {b}"
            );
        }
        for (a, b) in t
            .dequantize_as::<f32>(quant_core::Direction::Rowwise)
            .unwrap()
            .iter()
            .zip(reference::dequantize::<f32>(&t).unwrap())
        {
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "level {level}: {a} vs {b}"
            );
        }
        for (a, b) in t
            .dequantize_as::<half::f16>(quant_core::Direction::Rowwise)
            .unwrap()
            .iter()
            .zip(reference::dequantize::<half::f16>(&t).unwrap())
        {
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "level {level}: f16 {a} vs {b}"
            );
        }
    });
}

/// Streaming stores (what outputs beyond `STREAM_MIN_BYTES` get) write the same bytes as
/// ordinary ones, at every start offset of the output within a cache line, and nothing
/// outside the output.
#[test]
fn streaming_dequantize_writes_the_same_bytes_at_every_offset() {
    use quant_core::Direction;
    use quant_core::stream::{StoreMode, with_store_mode};
    let q = Int4TiledQuantizer::from_spec(&["g64", "k4"], Usage::ROWWISE).unwrap();
    let shape = [24, 512];
    let n = shape[0] * shape[1];
    let base = data(n, 77);
    let x = HostTensor::f32(&base, &shape).unwrap();
    let stored = q.quantize(&x).unwrap();
    let spec = reference::quantize(&q, &x).unwrap();
    let want16 = reference::dequantize::<bf16>(&spec).unwrap();
    let want32 = reference::dequantize::<f32>(&spec).unwrap();
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    with_store_mode(StoreMode::Streaming, || {
        for off in 0..32 {
            let mut buf = vec![bf16::from_bits(0x1234); n + 40];
            stored
                .dequantize_into(Direction::Rowwise, &mut buf[off..off + n])
                .unwrap();
            assert!(
                buf[off..off + n]
                    .iter()
                    .zip(&want16)
                    .all(|(a, b)| same(a.to_f32(), b.to_f32())),
                "bf16 at offset {off}"
            );
            let outside = buf[..off].iter().chain(&buf[off + n..]);
            assert!(
                outside.into_iter().all(|v| v.to_bits() == 0x1234),
                "bf16 {off}"
            );
        }
        for off in 0..16 {
            let mut buf = vec![-7.0f32; n + 20];
            stored
                .dequantize_into(Direction::Rowwise, &mut buf[off..off + n])
                .unwrap();
            let got = &buf[off..off + n];
            assert!(
                got.iter().zip(&want32).all(|(&a, &b)| same(a, b)),
                "f32 at {off}"
            );
            let outside = buf[..off].iter().chain(&buf[off + n..]);
            assert!(outside.into_iter().all(|&v| v == -7.0), "f32 {off}");
        }
    });
}
