//! FP8 and MXFP8 at every SIMD level this CPU can run (levels it lacks are skipped with
//! a note): the bytes of every buffer must not depend on the level, and the rowwise-only
//! walks (whole rows, sixteen blocks folded together) must give the same bytes as the
//! slab walks that serve the other usages. NVFP4 and int4tiled have their own level
//! tests against their scalar specifications (`fmt-nvfp4/tests/simd_levels.rs`,
//! `fmt-int4tiled/tests/simd_levels.rs`); the golden tests pin the bytes themselves.
//!
//! Shapes are ragged on purpose: a single element, rows shorter than one block, `k`
//! past one 2048-value span with a partial last block, partial 128-row slabs and
//! 32-row groups. The input carries every special value (NaN, ±inf, ±0, subnormals,
//! values past the FP8 range) and whole special blocks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/special_input.rs"]
mod special_input;

use quant_core::simd::{self, Level};
use quantfmt::{DType, Direction, FormatSpec, HostTensor, Quantizer, Shape, Storage, Usage};
use quantfmt_testkit::{XorShift64, unit_f32};

const SPECS: [&str; 10] = [
    "fp8",
    "fp8:e5m2,pow2",
    "fp8-block:1x128",
    "fp8-block:1x128,e5m2,fp32-scales,eps=1e-3",
    "fp8-block:128x128",
    "mxfp8",
    "mxfp8:ocp,swizzled",
    "mxfp8:e5m2",
    "mxfp8:e5m2,2d",
    "mxfp8:2d,ocp",
];

/// `[m, k]` pairs; MXFP8 needs both dimensions to be multiples of 32 and skips the rest.
const SHAPES: [[usize; 2]; 6] = [
    [1, 1],
    [3, 130],
    [130, 2200],
    [64, 4192],
    [160, 96],
    [257, 384],
];

/// Every buffer of `t`, by name.
fn bytes(t: &dyn Storage) -> Vec<(String, Vec<u8>)> {
    t.buffers()
        .iter()
        .map(|b| (b.name().to_string(), b.bytes().to_vec()))
        .collect()
}

fn assert_same(what: &str, got: &[(String, Vec<u8>)], want: &[(String, Vec<u8>)]) {
    assert_eq!(got.len(), want.len(), "{what}: buffer count");
    for ((gn, g), (wn, w)) in got.iter().zip(want) {
        assert_eq!(gn, wn, "{what}: buffer order");
        assert_eq!(g.len(), w.len(), "{what}: {gn} length");
        if let Some(i) = g.iter().zip(w).position(|(a, b)| a != b) {
            panic!(
                "{what}: {gn} differs at byte {i}: {:#04x}, expected {:#04x}",
                g[i], w[i]
            );
        }
    }
}

/// The buffers of `all` that `got` has too (the rowwise ones of a BOTH tensor, say).
fn same_names(all: &[(String, Vec<u8>)], got: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    got.iter()
        .map(|(n, _)| {
            all.iter()
                .find(|(m, _)| m == n)
                .unwrap_or_else(|| panic!("buffer {n} is missing from the BOTH tensor"))
                .clone()
        })
        .collect()
}

#[test]
fn quantize_bytes_are_level_independent_and_usage_independent() {
    let mut checked = 0usize;
    for spec in SPECS {
        let spec: FormatSpec = spec.parse().unwrap();
        for &[m, k] in &SHAPES {
            let both = spec.boxed(Usage::BOTH).unwrap();
            if both.check_shape(&Shape::new(&[m, k]).unwrap()).is_err() {
                continue;
            }
            let base = special_input::input(&[m, k], (m * 7919 + k) as u64);
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let tensor = |v: &[f32]| {
                    HostTensor::f32(v, &[m, k])
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap()
                };
                let x = tensor(&base);
                // TE maps an input -0.0 to +0 on some MXFP8 paths and not on others
                // (`Mxfp8Quantizer::flushes_negative_zero`): usages are compared on the
                // input without -0.0 (after the narrowing, which makes new ones), levels
                // on the input as it is.
                let unsigned: Vec<f32> = x
                    .to_f32_vec()
                    .iter()
                    .map(|&v| if v == 0.0 { 0.0 } else { v })
                    .collect();
                let x0 = tensor(&unsigned);
                let scalar = |q: &dyn Quantizer, x: &HostTensor<'_>| {
                    simd::with_level(Level::Scalar, || bytes(&*q.quantize(x).unwrap())).unwrap()
                };
                let whole = scalar(&*both, &x0);
                for usage in [Usage::ROWWISE, Usage::COLUMNWISE, Usage::BOTH] {
                    let q = spec.boxed(usage).unwrap();
                    let what = format!("{} [{m}, {k}] {dtype} {usage}", q.spec());
                    let alone = scalar(&*q, &x0);
                    assert_same(
                        &format!("{what} against BOTH"),
                        &alone,
                        &same_names(&whole, &alone),
                    );
                    let want = scalar(&*q, &x);
                    simd::for_each_supported_level(|level| {
                        let got = bytes(&*q.quantize(&x).unwrap());
                        assert_same(&format!("{what} at {level}"), &got, &want);
                        checked += 1;
                    });
                }
            }
        }
    }
    assert!(checked > 300, "{checked}");
}

/// The 128x128 walk folds the next slab's tile maxima while it encodes the current one,
/// and a worker that then takes that next slab uses them. On one thread every slab after
/// the first takes that route; its bytes must equal the rowwise buffers of a BOTH tensor
/// quantized at the scalar level on the default pool, at every level. Each slab is an
/// order of magnitude below the one before it, so maxima carried over from the wrong
/// slab would show, and one tile of the second slab holds a NaN (ignored by the amax).
/// `fmt-fp8`'s engine tests check the same walk against a plain specification.
#[test]
fn tile_maxima_folded_ahead_equal_a_fresh_walk() {
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let spec: FormatSpec = "fp8-block:128x128".parse().unwrap();
    let (rowwise, both) = (
        spec.boxed(Usage::ROWWISE).unwrap(),
        spec.boxed(Usage::BOTH).unwrap(),
    );
    let mut checked = 0usize;
    for [m, k] in [[257, 384], [300, 2200], [512, 130], [129, 4192]] {
        let mut rng = XorShift64::new((m * 31 + k) as u64 | 1);
        let mut base: Vec<f32> = (0..m * k)
            .map(|e| {
                let unit = rng.next_f32() - 0.5;
                unit * 10f32.powi(3 - (e / k / 128) as i32)
            })
            .collect();
        base[129.min(m - 1) * k + 5] = f32::NAN;
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let x = HostTensor::f32(&base, &[m, k])
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let whole =
                simd::with_level(Level::Scalar, || bytes(&*both.quantize(&x).unwrap())).unwrap();
            simd::for_each_supported_level(|level| {
                let got = one.install(|| bytes(&*rowwise.quantize(&x).unwrap()));
                let what = format!(
                    "fp8-block:128x128 [{m}, {k}] {dtype} rowwise on one thread at {level}"
                );
                assert_same(&what, &got, &same_names(&whole, &got));
                checked += 1;
            });
        }
    }
    assert!(checked >= 12, "{checked}");
}

/// Special values (every 32-row group then holds some scale outside the 16-bit
/// decoders' exact range) and ordinary values (every scale inside it, so that the
/// whole-row and per-column 16-bit routes run).
#[test]
fn dequantize_bytes_are_level_independent() {
    for ([m, k], seed) in [([130, 2200], 5), ([256, 512], 9)] {
        dequantize_level_independent(m, k, &special_input::input(&[m, k], seed));
    }
    let mut rng = XorShift64::new(0x5DEE_CE66_D1CE_4E5B);
    let ordinary: Vec<f32> = (0..256 * 512)
        .map(|_| (unit_f32(rng.next_u64()) - 0.5) * 6.0)
        .collect();
    dequantize_level_independent(256, 512, &ordinary);
}

fn dequantize_level_independent(m: usize, k: usize, base: &[f32]) {
    let x = HostTensor::f32(base, &[m, k]).unwrap();
    for spec in SPECS {
        let q = spec
            .parse::<FormatSpec>()
            .unwrap()
            .quantizer(Usage::BOTH)
            .unwrap();
        if q.check_shape(&Shape::new(&[m, k]).unwrap()).is_err() {
            continue;
        }
        let t = q.quantize(&x).unwrap();
        for dir in [Direction::Rowwise, Direction::Columnwise] {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let bytes = || t.dequantize(dir, dtype).unwrap().as_bytes().to_vec();
                assert_eq!(
                    simd::level_differing_from_scalar(bytes),
                    None,
                    "{spec} [{m}, {k}] {dir} {dtype}: bytes differ from the scalar level's"
                );
            }
        }
    }
}

/// Large outputs are written with streaming stores (`quant_core::stream`): every
/// format, in both directions, at each vector level the CPU has, must write the same
/// bytes as with ordinary stores, in
/// quantize (the transposed columnwise operands) and in dequantize (every direction,
/// output types with and without a streamed route). Shapes whose rows are not whole
/// lines (`k = 2200`, `m = 130`) and are (`[256, 512]`, and `[384, 2200]`: transposed
/// rows on lines, three 128-row FP8 slabs and a 256- and a 128-row NVFP4 slab, with a
/// partial last 16-column block).
#[test]
fn streamed_stores_write_the_same_bytes() {
    use quant_core::stream::{StoreMode, with_store_mode};
    let specs = SPECS.iter().copied().chain([
        "nvfp4",
        "nvfp4:2d,swizzled",
        "nvfp4:rht",
        "nvfp4:sr",
        "int4tiled",
    ]);
    for spec in specs {
        for [m, k] in [[130, 2200], [256, 512], [384, 2200]] {
            let x = HostTensor::f32(&special_input::input(&[m, k], 9), &[m, k])
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap();
            let parsed = spec.parse::<FormatSpec>().unwrap();
            let q = match parsed.quantizer(Usage::BOTH) {
                Ok(q) => q,
                Err(_) => parsed.quantizer(Usage::ROWWISE).unwrap(),
            };
            if q.check_shape(&Shape::new(&[m, k]).unwrap()).is_err() {
                continue;
            }
            let run = |mode| {
                with_store_mode(mode, || {
                    let t = q.quantize(&x).unwrap();
                    let mut out = bytes(&t);
                    for dir in [Direction::Rowwise, Direction::Columnwise] {
                        for dtype in [DType::F32, DType::BF16, DType::F16] {
                            if let Ok(d) = t.dequantize(dir, dtype) {
                                out.push((format!("{dir} {dtype}"), d.as_bytes().to_vec()));
                            }
                        }
                    }
                    out
                })
            };
            let want = run(StoreMode::Cached);
            // Each vector level has its own streamed routes (the transposed dequantize
            // walks, say): every one the CPU has, against the cached bytes.
            for level in [Level::Avx512, Level::Avx2] {
                if let Some(got) = simd::with_level(level, || run(StoreMode::Streaming)) {
                    assert_same(
                        &format!("{spec} [{m}, {k}] streamed at {level}"),
                        &got,
                        &want,
                    );
                }
            }
        }
    }
}

/// bf16 blocks at the edges of the 16-bit power-of-two encoder
/// (`quant_core::codec::pow2`, used by MXFP8 and by FP8 with power-of-two scales): block
/// maxima from bf16 subnormals (the scales whose exponent is outside the encoder's exact
/// range, where the span takes the f32 route) up to values near `f32::MAX`, each block a
/// spread of magnitudes below its max with both signs, zeros of both signs and the odd
/// NaN and infinity. Every level must give the scalar level's bytes, for both element
/// types, both MXFP8 scale rules and both `-0.0` treatments (K a multiple of 128 flushes
/// it, K = 96 does not), and for FP8 1x128 (whole and ragged blocks), 128x128 and
/// per-tensor.
#[test]
fn bf16_power_of_two_encoder_edges_are_level_independent() {
    let tiny = f32::from_bits(1 << 16); // the smallest bf16 subnormal, 2^-133
    let maxima: Vec<f32> = (0..64)
        .map(|i| match i {
            0..=11 => tiny * (1 << i) as f32,
            12..=23 => 2f32.powi(-126 + (i - 12) * 2),
            24..=55 => 2f32.powi(-100 + (i - 24) * 7) * 1.37,
            _ => 3.0e38 / (1 << (i - 56)) as f32,
        })
        .collect();
    power_of_two_encoder_edges(DType::BF16, &maxima);
}

/// [`bf16_power_of_two_encoder_edges_are_level_independent`] for f16 input, whose
/// encoder (`Fp8::encode_f16`) rounds in place only chunks of normal f16 inputs with
/// normal codes: block maxima from the smallest f16 subnormal (scales up to `2^33`,
/// under which f16 subnormals below the max reach normal codes) through every binade to
/// 65504, and past it (infinity after the narrowing).
#[test]
fn f16_power_of_two_encoder_edges_are_level_independent() {
    let maxima: Vec<f32> = (0..64)
        .map(|i| match i {
            0..=9 => 2f32.powi(-24 + i),
            10..=40 => 2f32.powi(-15 + (i - 10)) * 1.37,
            41..=55 => 2f32.powi(-14 + (i - 41) * 2) * 1.9,
            56..=61 => 65504.0 / (1 << (i - 56)) as f32,
            _ => 1.0e6,
        })
        .collect();
    power_of_two_encoder_edges(DType::F16, &maxima);
}

/// The body of the power-of-two encoder edge tests: blocks of 32 values under each of
/// `maxima` in turn, narrowed to `dtype`.
fn power_of_two_encoder_edges(dtype: DType, maxima: &[f32]) {
    for &k in &[96usize, 256] {
        let m = (maxima.len() * 32 / k + 1).next_multiple_of(32);
        let mut rng = XorShift64::new(0x9E37_79B9_7F4A_7C15);
        let v: Vec<f32> = (0..m * k)
            .map(|i| {
                let s = rng.next_u64();
                let max = maxima[(i / 32) % maxima.len()];
                match (i % 32, s % 97) {
                    (0, _) => max,
                    (_, 0) => -0.0,
                    (_, 1) => 0.0,
                    (_, 2) if i % 3 == 0 => f32::NAN,
                    (_, 3) if i % 5 == 0 => f32::NEG_INFINITY,
                    _ => {
                        let f = unit_f32(s); // [0, 1)
                        let sign = if s & 1 == 1 { -1.0 } else { 1.0 };
                        sign * max * f.powi(((s >> 8) % 9) as i32)
                    }
                }
            })
            .collect();
        let x = HostTensor::f32(&v, &[m, k])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        // The same runs down the columns (`[k, m]`, column `c` is run `c` of `v`), for
        // the columnwise blocks (MXFP8 32x1, FP8 1x128's 128x1; 96 rows: a ragged one).
        let vt: Vec<f32> = (0..k * m).map(|i| v[(i % m) * k + i / m]).collect();
        let xt = HostTensor::f32(&vt, &[k, m])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        for (usage, x, [m, k]) in [
            (Usage::ROWWISE, &x, [m, k]),
            (Usage::COLUMNWISE, &xt, [k, m]),
            (Usage::BOTH, &xt, [k, m]),
        ] {
            for spec in [
                "mxfp8",
                "mxfp8:e5m2",
                "mxfp8:ocp",
                "mxfp8:e5m2,ocp,swizzled",
                "fp8-block:1x128",
                "fp8-block:1x128,e5m2",
                "fp8-block:1x128,fp32-scales",
                "fp8-block:128x128",
                "fp8:pow2",
            ] {
                let q = spec.parse::<FormatSpec>().unwrap().boxed(usage).unwrap();
                let want =
                    simd::with_level(Level::Scalar, || bytes(&*q.quantize(x).unwrap())).unwrap();
                simd::for_each_supported_level(|level| {
                    let got = bytes(&*q.quantize(x).unwrap());
                    assert_same(
                        &format!("{spec} [{m}, {k}] {dtype} {usage} at {level}"),
                        &got,
                        &want,
                    );
                });
            }
        }
    }
}
