//! Options, refusals, buffers, layouts, derivation, validation and file round trips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fmt_nvfp4::{FourOverSix, Nvfp4Quantizer, Nvfp4Tensor, layout, rht, scale, with_scale_layout};
use half::bf16;
use quant_core::codec::{e2m1, e4m3};
use quant_core::{
    Buffer, DType, Direction, Format, HostTensor, QuantizedTensor, Registry, Shape, Usage,
};
use quantfmt_testkit::XorShift64;

fn q(opts: &[&str], usage: Usage) -> Nvfp4Quantizer {
    Nvfp4Quantizer::from_spec(opts, usage).unwrap()
}

fn err(opts: &[&str], usage: Usage) -> String {
    Nvfp4Quantizer::from_spec(opts, usage)
        .unwrap_err()
        .to_string()
}

/// Deterministic pseudo-random values with a wide dynamic range.
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = XorShift64::scrambled(seed);
    (0..n)
        .map(|_| {
            let v = (rng.next_f64() - 0.5) * 8.0;
            (v * v * v) as f32
        })
        .collect()
}

fn codes(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().flat_map(|&b| [b & 0xF, b >> 4]).collect()
}

#[test]
fn spec_options_round_trip() {
    let specs: &[&[&str]] = &[
        &[],
        &["2d"],
        &["2d", "swizzled"],
        &["rht"],
        &["rht", "sr", "seed=42"],
        &["sr"],
        &["2d", "sr", "seed=18446744073709551615"],
        &["row-scaled"],
        &["4over6"],
        &["4over6=mse"],
        &["2d", "4over6=mse", "e4m3max=256"],
        &["row-scaled", "4over6", "swizzled"],
    ];
    for opts in specs {
        let usage = if opts.contains(&"row-scaled") && opts.contains(&"4over6") {
            Usage::ROWWISE
        } else {
            Usage::BOTH
        };
        let a = q(opts, usage);
        assert_eq!(a.spec_options(), opts.to_vec(), "{opts:?}");
        let json = serde_json::to_value(&a).unwrap();
        let b: Nvfp4Quantizer = serde_json::from_value(json).unwrap();
        assert_eq!(a, b);
    }
    // Aliases and defaults.
    assert_eq!(q(&["4over6=mae"], Usage::BOTH), q(&["4over6"], Usage::BOTH));
    assert_eq!(
        q(&["1d", "e4m3max=448"], Usage::BOTH),
        Nvfp4Quantizer::new(Usage::BOTH)
    );
    assert_eq!(
        q(&["4over6"], Usage::BOTH).four_over_six(),
        Some(FourOverSix::Mae)
    );
    assert_eq!(
        q(&["sr", "seed=7"], Usage::BOTH).stochastic_rounding(),
        Some(7)
    );
    assert_eq!(q(&[], Usage::BOTH).stochastic_rounding(), None);
}

#[test]
fn bad_options_are_named() {
    let e = err(&["3d"], Usage::BOTH);
    assert!(
        e.contains("unknown option `3d`") && e.contains("2d, rht, sr"),
        "{e}"
    );
    assert!(err(&["seed=x", "sr"], Usage::BOTH).contains("seed"));
    assert!(err(&["4over6=max"], Usage::BOTH).contains("must be mae or mse"));
    assert!(err(&["4over6", "e4m3max=300"], Usage::BOTH).contains("must be 448 or 256"));
    // A seed implies stochastic rounding (the issue's `nvfp4:seed=N` spec).
    assert_eq!(q(&["seed=3"], Usage::BOTH).stochastic_rounding(), Some(3));
    assert_eq!(q(&["seed=3"], Usage::BOTH).spec(), "nvfp4:sr,seed=3");
}

#[test]
fn refused_combinations_give_te_reasons() {
    let cases: &[(&[&str], Usage, &str)] = &[
        (&["rht", "2d"], Usage::BOTH, "rht with 2d is not supported"),
        (&["row-scaled", "rht"], Usage::BOTH, "row-scaled with rht"),
        (&["row-scaled", "sr"], Usage::BOTH, "row-scaled with sr"),
        (&["row-scaled", "2d"], Usage::BOTH, "row-scaled with 2d"),
        (&["row-scaled"], Usage::COLUMNWISE, "requires rowwise usage"),
        (&["row-scaled", "4over6"], Usage::BOTH, "per-column amaxes"),
        (&["4over6", "rht"], Usage::BOTH, "does not support RHT"),
        (
            &["4over6", "sr"],
            Usage::BOTH,
            "does not support stochastic rounding",
        ),
        (
            &["4over6", "2d"],
            Usage::COLUMNWISE,
            "requires rowwise output",
        ),
        (&["e4m3max=256"], Usage::BOTH, "requires E4M3 max 448"),
    ];
    for (opts, usage, want) in cases {
        let e = err(opts, *usage);
        assert!(e.starts_with("nvfp4: "), "{e}");
        assert!(e.contains(want), "{opts:?}: {e}");
    }
    // Usage-dependent refusals also guard allocation after `with_usage`.
    let rs = q(&["row-scaled", "4over6"], Usage::ROWWISE).with_usage(Usage::BOTH);
    assert!(rs.check_shape(&Shape::new(&[16, 16]).unwrap()).is_err());
    // Amax reduction is refused for row-scaled.
    let x = vec![1.0f32; 256];
    let e = q(&["row-scaled"], Usage::ROWWISE)
        .quantize_with_amax(&HostTensor::f32(&x, &[16, 16]).unwrap(), 1.0, 1.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("amax reduction"), "{e}");
}

#[test]
fn shape_rule_messages() {
    let qz = Nvfp4Quantizer::new(Usage::BOTH);
    let e = qz
        .check_shape(&Shape::new(&[16, 100]).unwrap())
        .unwrap_err();
    assert_eq!(e.to_string(), "nvfp4: K=100 must be a multiple of 16");
    let e = qz
        .check_shape(&Shape::new(&[2, 20, 64]).unwrap())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "nvfp4: M=40 must be a multiple of 16 (M is the product of the leading dimensions of [2, 20, 64])"
    );
    assert!(qz.check_shape(&Shape::new(&[64]).unwrap()).is_err()); // M = 1
    let x = vec![0.0f32; 16 * 100];
    assert!(
        qz.quantize(&HostTensor::f32(&x, &[16, 100]).unwrap())
            .is_err()
    );
}

#[test]
fn buffer_shapes_follow_te() {
    let shape = Shape::new(&[2, 24, 48]).unwrap();
    let b = q(&[], Usage::BOTH).buffers(&shape).unwrap();
    let got: Vec<(&str, DType, &[usize])> = b
        .iter()
        .map(|d| (d.name.as_str(), d.dtype, d.shape.as_slice()))
        .collect();
    assert_eq!(
        got,
        [
            ("rowwise_data", DType::U8, &[2, 24, 24][..]),
            ("rowwise_scale_inv", DType::U8, &[128, 4][..]),
            ("amax_rowwise", DType::F32, &[1][..]),
            ("columnwise_data", DType::U8, &[48, 24][..]),
            ("columnwise_scale_inv", DType::U8, &[128, 4][..]),
            ("amax_columnwise", DType::F32, &[1][..]),
        ]
    );
    let b = q(&["row-scaled"], Usage::BOTH).buffers(&shape).unwrap();
    assert_eq!(b[2].shape, [48]);
    assert_eq!(b[5].shape, [48]);
    let b = q(&["row-scaled"], Usage::BOTH)
        .buffers(&Shape::new(&[272, 32]).unwrap())
        .unwrap();
    assert_eq!(b[1].shape, [384, 4]);
    assert_eq!(b[2].shape, [272]);
    assert_eq!(b[4].shape, [128, 20]);
    assert_eq!(b[5].shape, [32]);
    let b = q(&[], Usage::COLUMNWISE).buffers(&shape).unwrap();
    assert_eq!(b.len(), 3);
    assert_eq!(b[0].name, "columnwise_data");
}

#[test]
fn te_scale_math_by_hand() {
    // Tensor amax 2688 -> S_enc = 1. Block amax 6 -> sdb = e4m3(6 * f32(1/6)) = 1.0.
    let mut x = vec![0.0f32; 16 * 32];
    x[16..32].fill(2688.0);
    let row1 = [
        6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0,
        -6.0,
    ];
    x[32..48].copy_from_slice(&row1);
    let t = Nvfp4Quantizer::new(Usage::ROWWISE)
        .quantize(&HostTensor::f32(&x, &[16, 32]).unwrap())
        .unwrap();
    let s = t.buffer("rowwise_scale_inv").unwrap().bytes();
    assert_eq!(s[1], 0x7E); // 2688 * (1 * 1/6) = 448
    assert_eq!(s[4], 0x38); // row 1, block 0: 1.0
    assert_eq!(s[0], 0x00); // all-zero block
    let c = codes(t.buffer("rowwise_data").unwrap().bytes());
    assert_eq!(&c[16..32], &[7; 16]); // 2688 / 448 = 6
    assert_eq!(
        &c[32..48],
        &[7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14, 15]
    );
    assert_eq!(
        t.buffer("amax_rowwise").unwrap().as_slice::<f32>().unwrap(),
        &[2688.0]
    );
    // Element 2i in the low nibble: byte 16 holds elements 32 (code 7) and 33 (code 0).
    assert_eq!(t.buffer("rowwise_data").unwrap().bytes()[16], 0x07);
}

#[test]
fn zero_scale_blocks_saturate_and_dequantize_to_zero() {
    // amax 1e4 -> S_enc 0.2688; a block of 1e-4 has 1e-4 * 0.0448 < 2^-10: sdb = 0.
    let mut x = vec![1e-4f32; 16 * 16];
    x[0] = 1e4;
    for (i, v) in x.iter_mut().enumerate().skip(16) {
        if i % 2 == 1 {
            *v = -*v;
        }
    }
    let t = Nvfp4Quantizer::new(Usage::ROWWISE)
        .quantize(&HostTensor::f32(&x, &[16, 16]).unwrap())
        .unwrap();
    let s = t.buffer("rowwise_scale_inv").unwrap().bytes();
    assert_eq!(s[4], 0); // row 1
    let c = codes(t.buffer("rowwise_data").unwrap().bytes());
    assert_eq!(&c[16..20], &[7, 15, 7, 15]); // enc = FLT_MAX: ±6
    let back = t.dequantize_f32().unwrap();
    assert!(back[16..].iter().all(|v| *v == 0.0));
    assert_eq!(scale::block_encode_scale(0, 1.0), f32::MAX);
}

#[test]
fn nan_inf_and_signed_zero() {
    let mut x = vec![0.5f32; 16 * 16];
    x[1] = f32::NAN;
    x[2] = -0.0;
    x[3] = 6.0;
    let t = Nvfp4Quantizer::new(Usage::ROWWISE)
        .quantize(&HostTensor::f32(&x, &[16, 16]).unwrap())
        .unwrap();
    // NaN is ignored by the amax.
    assert_eq!(
        t.buffer("amax_rowwise").unwrap().as_slice::<f32>().unwrap(),
        &[6.0]
    );
    let c = codes(t.buffer("rowwise_data").unwrap().bytes());
    assert_eq!(c[1], 7); // NaN -> +6
    assert_eq!(c[2], 8); // -0 keeps its sign
    // An infinite element makes amax inf, S_enc = 1; a NaN amax gives S_enc = FLT_MAX.
    x[4] = f32::NEG_INFINITY;
    let t = Nvfp4Quantizer::new(Usage::ROWWISE)
        .quantize(&HostTensor::f32(&x, &[16, 16]).unwrap())
        .unwrap();
    assert_eq!(
        t.buffer("amax_rowwise").unwrap().as_slice::<f32>().unwrap(),
        &[f32::INFINITY]
    );
    assert_eq!(codes(t.buffer("rowwise_data").unwrap().bytes())[4], 15);
    let x = vec![1.0f32; 256];
    let t = Nvfp4Quantizer::new(Usage::BOTH)
        .quantize_with_amax(&HostTensor::f32(&x, &[16, 16]).unwrap(), f32::NAN, 1.0)
        .unwrap();
    // block amax 1 * (FLT_MAX / 6) saturates E4M3.
    assert!(
        t.buffer("rowwise_scale_inv").unwrap().bytes()[..1]
            .iter()
            .all(|&b| b == 0x7E)
    );
}

#[test]
fn quantize_with_amax_matches_computed_amax() {
    let x = data(48 * 64, 3);
    let ht = HostTensor::f32(&x, &[48, 64]).unwrap();
    let qz = q(&["2d"], Usage::BOTH);
    let a = qz.quantize(&ht).unwrap();
    let amax = a.buffer("amax_rowwise").unwrap().as_slice::<f32>().unwrap()[0];
    let b = qz.quantize_with_amax(&ht, amax, amax).unwrap();
    for (x, y) in a.buffers().iter().zip(b.buffers()) {
        assert_eq!(x.bytes(), y.bytes(), "{}", x.name());
    }
    // A larger (reduced) amax changes the scales.
    let c = qz.quantize_with_amax(&ht, amax * 4.0, amax * 4.0).unwrap();
    assert_ne!(
        a.buffer("rowwise_scale_inv").unwrap().bytes(),
        c.buffer("rowwise_scale_inv").unwrap().bytes()
    );
}

#[test]
fn two_d_columnwise_is_the_repacked_transpose_and_derivable() {
    for opts in [&["2d"][..], &["2d", "swizzled"][..]] {
        let (m, k) = (48, 80);
        let x = data(m * k, 11);
        let ht = HostTensor::f32(&x, &[m, k]).unwrap();
        let both = q(opts, Usage::BOTH).quantize(&ht).unwrap();
        let rd = both.buffer("rowwise_data").unwrap().bytes();
        let cd = both.buffer("columnwise_data").unwrap().bytes();
        assert_eq!(layout::nibble_transpose(rd, m, k).unwrap(), cd);
        let row = both.dequantize(Direction::Rowwise, DType::F32).unwrap();
        let col = both.dequantize(Direction::Columnwise, DType::F32).unwrap();
        assert_eq!(row.to_f32_vec(), col.to_f32_vec());
        for (from, to) in [
            (Usage::ROWWISE, Usage::BOTH),
            (Usage::COLUMNWISE, Usage::BOTH),
        ] {
            let mut t = q(opts, from).quantize(&ht).unwrap();
            t.update_usage(to).unwrap();
            for (a, b) in t.buffers().iter().zip(both.buffers()) {
                assert_eq!(a.name(), b.name());
                assert_eq!(a.bytes(), b.bytes(), "{opts:?} {from} -> {}", a.name());
            }
        }
    }
    let mut t = Nvfp4Quantizer::new(Usage::ROWWISE)
        .quantize(&HostTensor::f32(&data(256, 1), &[16, 16]).unwrap())
        .unwrap();
    let e = t.update_usage(Usage::BOTH).unwrap_err().to_string();
    assert!(e.contains("only 2-D NVFP4"), "{e}");
    t.update_usage(Usage::ROWWISE).unwrap();
}

#[test]
fn swizzled_equals_swizzled_compact_and_converts_back() {
    for opts in [
        &[][..],
        &["2d"][..],
        &["row-scaled"][..],
        &["4over6=mse"][..],
    ] {
        let (m, k) = (144, 80);
        let x = data(m * k, 5);
        let ht = HostTensor::f32(&x, &[m, k]).unwrap();
        let compact = q(opts, Usage::BOTH).quantize(&ht).unwrap();
        let mut sw_opts = opts.to_vec();
        sw_opts.push("swizzled");
        let direct = q(&sw_opts, Usage::BOTH).quantize(&ht).unwrap();
        let converted = with_scale_layout(&compact, true).unwrap();
        assert_eq!(converted.quantizer(), direct.quantizer());
        for (a, b) in converted.buffers().iter().zip(direct.buffers()) {
            assert_eq!(a.bytes(), b.bytes(), "{opts:?} {}", a.name());
        }
        let (ss_r, _) = compact.quantizer().scale_shapes(m, k);
        let s = compact.buffer("rowwise_scale_inv").unwrap().bytes();
        let z = direct.buffer("rowwise_scale_inv").unwrap().bytes();
        for i in 0..m {
            for j in 0..k / 16 {
                assert_eq!(
                    z[quant_core::layout::swizzled_index(i, j, ss_r[1])],
                    s[i * ss_r[1] + j]
                );
            }
        }
        let back = with_scale_layout(&direct, false).unwrap();
        for (a, b) in back.buffers().iter().zip(compact.buffers()) {
            assert_eq!(a.bytes(), b.bytes());
        }
        for dir in [Direction::Rowwise, Direction::Columnwise] {
            assert_eq!(
                direct.dequantize_as::<f32>(dir).unwrap(),
                compact.dequantize_as::<f32>(dir).unwrap()
            );
        }
    }
}

#[test]
fn rht_needs_bf16_and_its_columnwise_dequantize_inverts_the_transform() {
    let x = data(32 * 32, 9);
    let e = q(&["rht"], Usage::BOTH)
        .quantize(&HostTensor::f32(&x, &[32, 32]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rht with f32 input") && e.contains("bf16"),
        "{e}"
    );
    // A spike per 16-row chunk: RHT spreads it to 16 values of equal magnitude c/4,
    // which quantize exactly (block amax = c/4 maps to 6), so the inverse is exact.
    let mut x = vec![bf16::ZERO; 32 * 32];
    for c in 0..32 {
        x[(c % 16) * 32 + c] = bf16::from_f32(if c.is_multiple_of(2) { 24.0 } else { -24.0 });
        x[(16 + (c * 5) % 16) * 32 + c] = bf16::from_f32(24.0);
    }
    let t = q(&["rht"], Usage::BOTH)
        .quantize(&HostTensor::bf16(&x, &[32, 32]).unwrap())
        .unwrap();
    assert_eq!(
        t.buffer("amax_columnwise")
            .unwrap()
            .as_slice::<f32>()
            .unwrap(),
        &[6.0]
    );
    let back = t.dequantize_as::<bf16>(Direction::Columnwise).unwrap();
    assert_eq!(back, x);
    // Generic data: the columnwise estimate is close to the rowwise one.
    let xs: Vec<bf16> = data(64 * 48, 4).into_iter().map(bf16::from_f32).collect();
    let t = q(&["rht"], Usage::BOTH)
        .quantize(&HostTensor::bf16(&xs, &[64, 48]).unwrap())
        .unwrap();
    let row = t.dequantize_as::<f32>(Direction::Rowwise).unwrap();
    let col = t.dequantize_as::<f32>(Direction::Columnwise).unwrap();
    let rms = |a: &[f32]| {
        (a.iter()
            .zip(&xs)
            .map(|(a, b)| f64::from(a - b.to_f32()).powi(2))
            .sum::<f64>()
            / a.len() as f64)
            .sqrt()
    };
    let amax = xs.iter().map(|v| v.to_f32().abs()).fold(0.0, f32::max);
    assert!(rms(&row) < 0.05 * f64::from(amax), "{}", rms(&row));
    assert!(rms(&col) < 0.05 * f64::from(amax), "{}", rms(&col));
    // The columnwise amax is the amax of bf16(RHT(x^T)).
    let mut ymax = 0.0f32;
    for c in 0..48 {
        for b in 0..4 {
            let v: [bf16; 16] = std::array::from_fn(|i| xs[(b * 16 + i) * 48 + c]);
            for y in rht::forward_16(&v) {
                ymax = ymax.max(y.to_f32().abs());
            }
        }
    }
    assert_eq!(
        t.buffer("amax_columnwise")
            .unwrap()
            .as_slice::<f32>()
            .unwrap(),
        &[ymax]
    );
}

#[test]
fn row_scaled_uses_one_amax_per_row() {
    let (m, k) = (32, 32);
    let mut x = data(m * k, 2);
    for (r, row) in x.chunks_mut(k).enumerate() {
        let f = 10f32.powi(r as i32 % 7 - 3);
        row.iter_mut().for_each(|v| *v *= f);
    }
    let t = q(&["row-scaled"], Usage::BOTH)
        .quantize(&HostTensor::f32(&x, &[m, k]).unwrap())
        .unwrap();
    let ar = t.buffer("amax_rowwise").unwrap().as_slice::<f32>().unwrap();
    let ac = t
        .buffer("amax_columnwise")
        .unwrap()
        .as_slice::<f32>()
        .unwrap();
    for r in 0..m {
        assert_eq!(
            ar[r],
            x[r * k..(r + 1) * k]
                .iter()
                .fold(0.0f32, |a, v| a.max(v.abs()))
        );
    }
    for c in 0..k {
        assert_eq!(ac[c], (0..m).fold(0.0f32, |a, r| a.max(x[r * k + c].abs())));
    }
    // Every row keeps its own precision: relative error bounded per row.
    let back = t.dequantize_f32().unwrap();
    for r in 0..m {
        for c in 0..k {
            let (a, b) = (x[r * k + c], back[r * k + c]);
            assert!((a - b).abs() <= ar[r] / 6.0 * 1.01, "{r} {c} {a} {b}");
        }
    }
}

#[test]
fn four_over_six_e4m3max_256_dequantizes_with_its_factor() {
    let x = data(16 * 64, 8);
    let ht = HostTensor::f32(&x, &[16, 64]).unwrap();
    let t = q(&["4over6", "e4m3max=256"], Usage::ROWWISE)
        .quantize(&ht)
        .unwrap();
    let s = t.buffer("rowwise_scale_inv").unwrap().bytes();
    let amax = t.buffer("amax_rowwise").unwrap().as_slice::<f32>().unwrap()[0];
    let c = codes(t.buffer("rowwise_data").unwrap().bytes());
    let back = t.dequantize_f32().unwrap();
    for i in 0..16 * 64 {
        let sdb = s[(i / 64) * 4 + (i % 64) / 16];
        let f = (e4m3::decode(sdb) * amax) * (1.0f32 / 1536.0);
        assert_eq!(back[i].to_bits(), (e2m1::decode(c[i]) * f).to_bits());
    }
    // Block scales stay within 448 even though S_enc uses 256.
    assert!(s.iter().all(|&b| b <= 0x7E));
}

#[test]
fn validate_buffers_rejects_nan_scales_and_bad_amax() {
    let x = data(16 * 32, 6);
    let t = Nvfp4Quantizer::new(Usage::BOTH)
        .quantize(&HostTensor::f32(&x, &[16, 32]).unwrap())
        .unwrap();
    let (qz, shape, dtype, bufs) = t.clone().into_parts();
    let ok = QuantizedTensor::from_buffers(qz.clone(), &shape, dtype, bufs.clone()).unwrap();
    assert_eq!(ok.dequantize_f32().unwrap(), t.dequantize_f32().unwrap());
    let mut bad = bufs.clone();
    let s = bad
        .iter_mut()
        .find(|b| b.name() == "columnwise_scale_inv")
        .unwrap();
    s.bytes_mut()[4] = 0x7F; // block (1, 0)
    let e = QuantizedTensor::from_buffers(qz.clone(), &shape, dtype, bad)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("columnwise_scale_inv") && e.contains("0x7f"),
        "{e}"
    );
    let mut bad = bufs;
    let a = bad
        .iter_mut()
        .position(|b| b.name() == "amax_rowwise")
        .unwrap();
    bad[a] = Buffer::from_slice::<f32>("amax_rowwise", &[1], &[f32::NAN]).unwrap();
    let e = QuantizedTensor::from_buffers(qz, &shape, dtype, bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("amax_rowwise") && e.contains("NaN"), "{e}");
}

#[test]
fn dtypes_agree_where_values_agree() {
    // bf16 and f16 inputs holding the same values as f32 give the same bytes.
    let x: Vec<f32> = data(48 * 32, 12)
        .into_iter()
        .map(|v| bf16::from_f32(v).to_f32())
        .collect();
    let qz = q(&["2d", "4over6"], Usage::BOTH);
    let a = qz
        .quantize(&HostTensor::f32(&x, &[48, 32]).unwrap())
        .unwrap();
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let b = qz
        .quantize(&HostTensor::bf16(&xb, &[48, 32]).unwrap())
        .unwrap();
    for (x, y) in a.buffers().iter().zip(b.buffers()) {
        assert_eq!(x.bytes(), y.bytes(), "{}", x.name());
    }
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let x = data(144 * 96, 21);
    let ht = HostTensor::f32(&x, &[144, 96]).unwrap();
    for opts in [
        &[][..],
        &["2d", "4over6"][..],
        &["row-scaled", "swizzled"][..],
    ] {
        let qz = q(opts, Usage::BOTH);
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let four = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let a = one.install(|| qz.quantize(&ht).unwrap());
        let b = four.install(|| qz.quantize(&ht).unwrap());
        for (x, y) in a.buffers().iter().zip(b.buffers()) {
            assert_eq!(x.bytes(), y.bytes());
        }
    }
}

#[test]
fn native_file_round_trip() {
    let mut reg = Registry::new();
    reg.register::<Nvfp4Quantizer>();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.q.safetensors");
    let xs: Vec<bf16> = data(48 * 64, 31).into_iter().map(bf16::from_f32).collect();
    let t: Nvfp4Tensor = q(&["rht", "sr", "seed=9", "swizzled"], Usage::BOTH)
        .quantize(&HostTensor::bf16(&xs, &[3, 16, 64]).unwrap())
        .unwrap();
    quant_core::io::save(&path, &[("w", &t)]).unwrap();
    let loaded = quant_core::io::load(&path, &reg).unwrap();
    let Some(quant_core::io::Loaded::Quantized(s)) = loaded.get("w") else {
        panic!("not loaded as quantized");
    };
    assert_eq!(s.quantizer().spec(), "nvfp4:rht,sr,seed=9,swizzled");
    for (a, b) in s.buffers().iter().zip(t.buffers()) {
        assert_eq!(a.bytes(), b.bytes());
    }
}

/// The benchmarks' roofline reads the input `input_passes` times: twice under a global
/// amax, three times when the rotated operand needs its own, once only where every
/// scale comes from the row being quantized.
#[test]
fn input_passes_count_the_amax_passes() {
    for (opts, usage, passes) in [
        (&[][..], Usage::ROWWISE, 2),
        (&["2d"][..], Usage::BOTH, 2),
        (&["rht"][..], Usage::ROWWISE, 2),
        (&["rht"][..], Usage::BOTH, 3),
        (&["row-scaled"][..], Usage::ROWWISE, 1),
        (&["row-scaled"][..], Usage::BOTH, 2),
        (&["row-scaled", "4over6"][..], Usage::ROWWISE, 2),
    ] {
        assert_eq!(q(opts, usage).input_passes(), passes, "{opts:?} {usage}");
    }
}

/// Re-quantizing into a tensor that holds other data rewrites every byte: the packed
/// data is not zeroed first (`Format::overwrites`), so each mode must write all of it.
#[test]
fn requantizing_over_old_data_equals_a_fresh_quantization() {
    let modes: [&[&str]; 8] = [
        &[],
        &["2d"],
        &["sr", "seed=3"],
        &["4over6=mse"],
        &["row-scaled"],
        &["row-scaled", "4over6", "swizzled"],
        &["2d", "swizzled"],
        &["rht"],
    ];
    let mut runs = 0;
    for opts in modes {
        for usage in [Usage::ROWWISE, Usage::COLUMNWISE, Usage::BOTH] {
            // Some combinations are refused (row-scaled needs rowwise, ...).
            let Ok(quant) = Nvfp4Quantizer::from_spec(opts, usage) else {
                continue;
            };
            for [m, k] in [[16, 16], [48, 80], [144, 272]] {
                let old: Vec<bf16> = data(m * k, 1).into_iter().map(bf16::from_f32).collect();
                let new: Vec<bf16> = data(m * k, 2).into_iter().map(bf16::from_f32).collect();
                let x_old = HostTensor::bf16(&old, &[m, k]).unwrap();
                let x_new = HostTensor::bf16(&new, &[m, k]).unwrap();
                let mut t = quant_core::format::quantize(&quant, &x_old).unwrap();
                t.quantize_from(&x_new).unwrap();
                runs += 1;
                let fresh = quant_core::format::quantize(&quant, &x_new).unwrap();
                for (a, b) in t.buffers().iter().zip(fresh.buffers()) {
                    assert!(
                        a.bytes() == b.bytes(),
                        "{opts:?} {usage:?} [{m}, {k}]: {} differs",
                        a.desc().name
                    );
                }
            }
        }
    }
    assert!(runs >= 18 * 3, "only {runs} combinations ran");
}
