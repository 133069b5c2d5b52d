//! The fast engine against the scalar specification ([`fmt_nvfp4::reference`]), at every
//! SIMD level this CPU can run (levels it lacks are skipped with a note), on ragged
//! shapes (partial 256-row quantize slabs, partial 256-column chunks), every option combination
//! TE allows, every usage and input dtype, and special values; dequantization too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fmt_nvfp4::{Nvfp4Quantizer, reference};
use quant_core::simd::{self, Level};
use quant_core::stream::{StoreMode, with_store_mode};
use quant_core::{DType, Direction, Format, HostTensor, Usage};
use quantfmt_testkit::{XorShift64, unit_f64};

/// Weight-like values with special values sprinkled in: NaN, ±inf, ±0, subnormals,
/// huge values, exact E2M1 grid points and rounding ties of the block scale.
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = XorShift64::scrambled(seed);
    (0..n)
        .map(|i| {
            let s = rng.next_u64();
            let u = unit_f64(s);
            match s % 97 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3 => -0.0,
                4 => 0.0,
                5 => f32::from_bits(1 + (s as u32 & 0xFF)),
                6 => 3.0e38,
                7 => [0.5, 1.5, 2.5, 5.0, 6.0, -0.25, -3.5][i % 7],
                _ => {
                    let v = (u - 0.5) * 8.0;
                    (v * v * v) as f32 * if s.is_multiple_of(13) { 1e-3 } else { 1.0 }
                }
            }
        })
        .collect()
}

fn option_sets() -> Vec<(Vec<&'static str>, Usage)> {
    let mut v = Vec::new();
    for usage in [Usage::ROWWISE, Usage::COLUMNWISE, Usage::BOTH] {
        for opts in [
            vec![],
            vec!["2d"],
            vec!["swizzled"],
            vec!["2d", "swizzled"],
            vec!["sr", "seed=7"],
            vec!["2d", "sr", "seed=99"],
            vec!["4over6"],
            vec!["4over6=mse", "e4m3max=256"],
            vec!["rht"],
            vec!["rht", "sr", "seed=5", "swizzled"],
        ] {
            v.push((opts, usage));
        }
        if usage.rowwise {
            v.push((vec!["row-scaled"], usage));
            v.push((vec!["row-scaled", "swizzled"], usage));
        }
        if usage == Usage::ROWWISE {
            v.push((vec!["row-scaled", "4over6"], usage));
        }
        if usage.rowwise {
            v.push((vec!["2d", "4over6"], usage));
        }
    }
    v
}

#[test]
fn engine_equals_reference_at_every_level() {
    // [32, 4368]: two spans of the 2-D rowwise walk, the second ending in a partial chunk;
    // also two spans (4096 + 272 values) of the batched 1-D walk from f32.
    // [16, 8464]: that walk's spans of 16 KiB from 16-bit input, 8192 + 272 values (f32:
    // three, the last partial).
    let shapes = [
        [16, 16],
        [48, 272],
        [144, 528],
        [272, 48],
        [16, 784],
        [32, 4368],
        [16, 8464],
    ];
    let mut checked = 0usize;
    let levels = simd::for_each_supported_level(|level| {
        for (si, &[m, k]) in shapes.iter().enumerate() {
            let base = data(m * k, 11 + si as u64);
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let x = HostTensor::f32(&base, &[m, k])
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                for (opts, usage) in option_sets() {
                    let Ok(q) = Nvfp4Quantizer::from_spec(&opts, usage) else {
                        continue;
                    };
                    if q.rht() && dtype != DType::BF16 {
                        continue;
                    }
                    let fast = q.quantize(&x).unwrap();
                    let spec = reference::quantize(&q, &x).unwrap();
                    for (a, b) in fast.buffers().iter().zip(spec.buffers()) {
                        assert_eq!(a.name(), b.name());
                        if let Some(i) = a.bytes().iter().zip(b.bytes()).position(|(p, q)| p != q) {
                            panic!(
                                "level {level} [{m}, {k}] {dtype} {} {usage}: {} differs at byte {i}: fast {:#04x}, reference {:#04x}",
                                q.spec(),
                                a.name(),
                                a.bytes()[i],
                                b.bytes()[i]
                            );
                        }
                    }
                    checked += 1;
                }
            }
        }
    });
    assert!(levels.contains(&Level::Scalar));
    assert!(checked > 100, "{checked}");
}

/// Dequantization at every level equals the level-independent scalar formula.
#[test]
fn dequantize_is_level_independent() {
    // The second shape is tall enough for columnwise tasks of several 128-row slabs
    // (their count follows `m` and the worker count), with a partial last one; the
    // first and third have 128-row tasks whose whole 64-column blocks the AVX-512
    // register route decodes when streamed (the tile route the rest).
    for (m, k) in [(144, 528), (4112, 48), (1040, 320)] {
        dequantize_is_level_independent_at(m, k, |v| v);
    }
    // The data above holds infinities, so its tensor amaxes are infinite. Without them:
    // a finite amax of 3e38, under which `e4m3(sdb) * amax` overflows for the large
    // scale bytes and those factors take the f64 recomputation (the columnwise
    // decoder's vectorized factors fall back to the table for such a group); and an
    // ordinary amax, where every factor is the vectorized product.
    dequantize_is_level_independent_at(144, 528, |v| if v.is_finite() { v } else { 0.0 });
    dequantize_is_level_independent_at(4112, 48, |v| if v.abs() < 1e30 { v } else { 0.0 });
}

fn dequantize_is_level_independent_at(m: usize, k: usize, keep: fn(f32) -> f32) {
    let base: Vec<f32> = data(m * k, 3).into_iter().map(keep).collect();
    let x = HostTensor::f32(&base, &[m, k])
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    for opts in [
        vec![],
        vec!["2d", "swizzled"],
        vec!["rht"],
        vec!["row-scaled"],
    ] {
        let usage = if opts.contains(&"row-scaled") {
            Usage::ROWWISE
        } else {
            Usage::BOTH
        };
        let q = Nvfp4Quantizer::from_spec(&opts, usage).unwrap();
        let t = q.quantize(&x).unwrap();
        for dir in [Direction::Rowwise, Direction::Columnwise] {
            if !usage.has(dir) {
                continue;
            }
            let spec = reference::dequantize(&t, dir).unwrap();
            simd::for_each_supported_level(|level| {
                let got = t.dequantize(dir, DType::F32).unwrap().to_f32_vec();
                for (i, (a, b)) in got.iter().zip(&spec).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "level {level} {} {dir}: element {i}: {a} vs reference {b}",
                        q.spec()
                    );
                }
            });
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let bytes = || t.dequantize(dir, dtype).unwrap().as_bytes().to_vec();
                assert_eq!(
                    simd::level_differing_from_scalar(bytes),
                    None,
                    "{} {dir} {dtype}: bytes differ from the scalar level's",
                    q.spec()
                );
                // Large outputs are streamed: the same bytes as ordinary stores.
                assert_eq!(
                    with_store_mode(StoreMode::Streaming, bytes),
                    with_store_mode(StoreMode::Cached, bytes),
                    "{} {dir} {dtype}: streamed bytes differ",
                    q.spec()
                );
            }
        }
    }
}
