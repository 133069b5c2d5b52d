//! Behaviour of the MXFP8 format beyond the golden bytes: shape rule, spec options,
//! fast path vs the scalar reference on every option combination, edge semantics of
//! both scale rules, layouts, usage changes, buffer validation and file round trips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fmt_mxfp8::layout::{
    self, ScaleLayout, columnwise_scale_index, columnwise_scale_shape, rowwise_scale_index,
    rowwise_scale_shape,
};
use fmt_mxfp8::{Mxfp8Dtype, Mxfp8Quantizer, Mxfp8Tensor, Mxfp8TensorExt, ScaleRule, reference};
use quant_core::half::{bf16, f16};
use quant_core::{
    Buffer, DType, Direction, Error, Format, HostTensor, QuantizedTensor, Registry, Shape, Usage,
};

/// xorshift64*: deterministic inputs without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Values with magnitudes spread over 2^-130 .. 2^120, and NaN, ±inf, ±0, subnormals,
/// f32::MAX and FP8 boundary values sprinkled in.
fn input(m: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed | 1);
    let block_exp: Vec<i32> = (0..(m / 32 + 1) * (k / 32 + 1))
        .map(|_| (r.next() % 60) as i32 - 40)
        .collect();
    (0..m * k)
        .map(|i| {
            let (row, col) = (i / k, i % k);
            let e = block_exp[(row / 32) * (k / 32 + 1) + col / 32] + (row % 5) as i32;
            match r.next() % 400 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3 => -0.0,
                4 => 1e-40,
                5 => f32::MAX,
                6 => 448.0,
                7 => 460.0,
                8 => 57344.0,
                9 => f32::from_bits(0x43E0_0001), // just above 448
                10..=40 => 0.0,
                _ => r.unit() * 2f32.powi(e),
            }
        })
        .collect()
}

fn all_quantizers() -> Vec<Mxfp8Quantizer> {
    let mut v = Vec::new();
    for dtype in [Mxfp8Dtype::E4M3, Mxfp8Dtype::E5M2] {
        for rule in [ScaleRule::Te, ScaleRule::Ocp] {
            for two_d in [false, true] {
                for layout in [ScaleLayout::Compact, ScaleLayout::Swizzled] {
                    v.push(
                        Mxfp8Quantizer::new(Usage::BOTH)
                            .with_dtype(dtype)
                            .with_scale_rule(rule)
                            .with_2d(two_d)
                            .with_scale_layout(layout),
                    );
                }
            }
        }
    }
    v
}

fn bytes(t: &Mxfp8Tensor, name: &str) -> Vec<u8> {
    t.buffer(name).unwrap().bytes().to_vec()
}

#[test]
fn fast_path_equals_reference_on_every_option_combination() {
    let shapes = [
        (32, 32),
        (96, 64),
        (160, 288),
        (288, 160),
        (32, 512),
        (416, 32),
    ];
    let mut n = 0;
    for (si, &(m, k)) in shapes.iter().enumerate() {
        let x = input(m, k, 17 + si as u64);
        for q in all_quantizers() {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let xt = HostTensor::f32(&x, &[m, k])
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let xf = xt.to_f32_vec();
                let t = q.quantize(&xt).unwrap();
                let r = reference::quantize(&q, &xf, dtype, m, k).unwrap();
                let ctx = format!("{} {dtype} [{m}, {k}]", q.spec());
                assert_eq!(bytes(&t, "rowwise_data"), r.rowwise_data, "{ctx}");
                assert_eq!(bytes(&t, "rowwise_scale_inv"), r.rowwise_scale_inv, "{ctx}");
                assert_eq!(bytes(&t, "columnwise_data"), r.columnwise_data, "{ctx}");
                assert_eq!(
                    bytes(&t, "columnwise_scale_inv"),
                    r.columnwise_scale_inv,
                    "{ctx}"
                );
                for dir in [Direction::Rowwise, Direction::Columnwise] {
                    let (d, s) = match dir {
                        Direction::Rowwise => (&r.rowwise_data, &r.rowwise_scale_inv),
                        Direction::Columnwise => (&r.columnwise_data, &r.columnwise_scale_inv),
                    };
                    let want = reference::dequantize(&q, dir, d, s, m, k).unwrap();
                    let got = t.dequantize_as::<f32>(dir).unwrap();
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())),
                        "{ctx} {dir}"
                    );
                    // bf16 / f16 outputs are one rounding of the f32 value.
                    let g16: Vec<f16> = t.dequantize_as(dir).unwrap();
                    let gb: Vec<bf16> = t.dequantize_as(dir).unwrap();
                    for ((h, b), w) in g16.iter().zip(&gb).zip(&want) {
                        let (h2, b2) = (f16::from_f32(*w), bf16::from_f32(*w));
                        assert!(h.to_bits() == h2.to_bits() || (h.is_nan() && h2.is_nan()));
                        assert!(b.to_bits() == b2.to_bits() || (b.is_nan() && b2.is_nan()));
                    }
                }
                n += 1;
            }
        }
    }
    assert_eq!(n, 6 * 16 * 3);
}

#[test]
fn shape_rule_is_checked_up_front() {
    let q = Mxfp8Quantizer::new(Usage::BOTH);
    let e = q.check_shape(&Shape::new(&[64, 100]).unwrap()).unwrap_err();
    assert_eq!(e.to_string(), "mxfp8: K=100 must be a multiple of 32");
    let e = q.check_shape(&Shape::new(&[100, 64]).unwrap()).unwrap_err();
    assert_eq!(e.to_string(), "mxfp8: M=100 must be a multiple of 32");
    let e = q
        .check_shape(&Shape::new(&[5, 20, 64]).unwrap())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "mxfp8: M=100 must be a multiple of 32 (M is the product of the leading dims of [5, 20, 64])"
    );
    assert!(q.check_shape(&Shape::new(&[64]).unwrap()).is_err()); // M = 1
    // No rows passes the shape rule (a grouped member may be empty), but an empty
    // tensor on its own is refused, naming the rule.
    assert!(q.check_shape(&Shape::new(&[0, 64]).unwrap()).is_ok());
    let e = q
        .quantize(&HostTensor::f32(&[], &[0, 64]).unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("no elements"), "{e}");
    assert!(q.check_shape(&Shape::new(&[4, 8, 32]).unwrap()).is_ok());
    let x = vec![1.0f32; 64 * 100];
    let e = q
        .quantize(&HostTensor::f32(&x, &[64, 100]).unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    assert!(Mxfp8Quantizer::SHAPE_RULE.contains("multiples of 32"));
    // Direct trait calls with a bad shape fail instead of panicking.
    let mut bufs = Vec::new();
    assert!(
        q.quantize_into(&HostTensor::f32(&x, &[64, 100]).unwrap(), &mut bufs)
            .is_err()
    );
    let x = vec![1.0f32; 64 * 64];
    assert!(
        q.quantize_into(&HostTensor::f32(&x, &[64, 64]).unwrap(), &mut bufs)
            .is_err()
    );
}

#[test]
fn buffers_follow_te_get_scale_shape() {
    let q = Mxfp8Quantizer::new(Usage::BOTH);
    for (dims, rs, cs) in [
        (vec![32, 32], [128, 4], [4, 128]),
        (vec![160, 96], [256, 4], [8, 128]),
        (vec![288, 288], [384, 12], [12, 384]),
        (vec![2, 48, 64], [128, 4], [4, 128]),
        (vec![4096, 11008], [4096, 344], [128, 11008]),
    ] {
        let b = q.buffers(&Shape::new(&dims).unwrap()).unwrap();
        let names: Vec<&str> = b.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "rowwise_data",
                "rowwise_scale_inv",
                "columnwise_data",
                "columnwise_scale_inv"
            ]
        );
        assert!(b.iter().all(|d| d.dtype == DType::U8));
        assert_eq!(b[0].shape, dims);
        assert_eq!(b[2].shape, dims); // not transposed
        assert_eq!(b[1].shape, rs);
        assert_eq!(b[3].shape, cs);
        let sw = q.clone().with_scale_layout(ScaleLayout::Swizzled);
        assert_eq!(sw.buffers(&Shape::new(&dims).unwrap()).unwrap(), b);
    }
    let row = Mxfp8Quantizer::new(Usage::ROWWISE)
        .buffers(&Shape::new(&[32, 64]).unwrap())
        .unwrap();
    assert_eq!(row.len(), 2);
}

#[test]
fn spec_options_parse_combine_and_round_trip() {
    let q = Mxfp8Quantizer::from_spec(&["e5m2", "swizzled"], Usage::BOTH).unwrap();
    assert_eq!(q.dtype(), Mxfp8Dtype::E5M2);
    assert_eq!(q.scale_layout(), ScaleLayout::Swizzled);
    assert_eq!(q.spec(), "mxfp8:e5m2,swizzled");
    let q = Mxfp8Quantizer::from_spec(&["ocp", "2d", "e4m3"], Usage::ROWWISE).unwrap();
    assert_eq!(q.spec(), "mxfp8:2d,ocp");
    assert_eq!(Mxfp8Quantizer::new(Usage::BOTH).spec(), "mxfp8");
    for q in all_quantizers() {
        let spec = q.spec();
        let opts: Vec<&str> = spec
            .strip_prefix("mxfp8:")
            .map(|o| o.split(',').collect())
            .unwrap_or_default();
        assert_eq!(Mxfp8Quantizer::from_spec(&opts, Usage::BOTH).unwrap(), q);
        // Serialized options (file metadata) round trip too.
        let json = serde_json::to_value(&q).unwrap();
        let back: Mxfp8Quantizer = serde_json::from_value(json).unwrap();
        assert_eq!(back, q);
    }
    let e = Mxfp8Quantizer::from_spec(&["e3m4"], Usage::BOTH).unwrap_err();
    assert_eq!(
        e.to_string(),
        "mxfp8: unknown option `e3m4`; valid options: e4m3, e5m2, 2d, ocp, swizzled"
    );
    let json = serde_json::to_value(
        Mxfp8Quantizer::new(Usage::BOTH)
            .with_2d(true)
            .with_scale_layout(ScaleLayout::Swizzled),
    )
    .unwrap();
    assert_eq!(json["with_2d_quantization"], true);
    assert_eq!(json["scale_layout"], "swizzled");
    assert_eq!(json["scale_rule"], "te");
    assert_eq!(json["dtype"], "e4m3");
    let mut bad = json.clone();
    bad["extra"] = 1.into();
    assert!(serde_json::from_value::<Mxfp8Quantizer>(bad).is_err());
}

fn one_block(vals: &[f32], q: &Mxfp8Quantizer) -> (u8, Vec<u8>) {
    let mut x = vec![0.0f32; 32 * 32];
    x[..vals.len()].copy_from_slice(vals);
    let t = q
        .quantize(&HostTensor::f32(&x, &[32, 32]).unwrap())
        .unwrap();
    (
        t.scale_codes(Direction::Rowwise).unwrap()[0],
        bytes(&t, "rowwise_data")[..32].to_vec(),
    )
}

#[test]
fn te_rule_special_blocks() {
    let q = Mxfp8Quantizer::new(Usage::ROWWISE);
    // amax 0 -> code 0.
    assert_eq!(one_block(&[], &q).0, 0);
    // NaN is ignored by the amax; the NaN element encodes to 0x7F.
    let (c, d) = one_block(&[f32::NAN, 448.0, -1.0], &q);
    assert_eq!((c, d[0], d[1], d[2]), (127, 0x7F, 0x7E, 0xB8));
    // An all-NaN block: amax 0 -> code 0, every element 0x7F.
    let (c, d) = one_block(&[f32::NAN; 32], &q);
    assert_eq!(c, 0);
    assert!(d.iter().all(|&b| b == 0x7F));
    // inf -> code 0xFE (2^127): finite values flush to ±0, inf saturates.
    let (c, d) = one_block(&[f32::INFINITY, 1e30, -5.0, f32::NEG_INFINITY], &q);
    assert_eq!(c, 0xFE);
    assert_eq!(&d[..4], &[0x7E, 0x00, 0x80, 0xFE]);
    // amax 460: scale 2 (the block max never clips).
    let (c, d) = one_block(&[460.0, 2.0], &q);
    assert_eq!((c, d[0], d[1]), (128, 0x76, 0x38));
    // Subnormal amax: code 0, multiplier 2^127.
    let (c, d) = one_block(&[1e-40], &q);
    assert_eq!(c, 0);
    assert_eq!(d[0], Mxfp8Dtype::E4M3.encode(1e-40 * 2f32.powi(127)));
    // E5M2: 57344 keeps scale 1, the next float doubles it.
    let q5 = q.clone().with_dtype(Mxfp8Dtype::E5M2);
    assert_eq!(one_block(&[57344.0], &q5).0, 127);
    assert_eq!(
        one_block(&[f32::from_bits(57344f32.to_bits() + 1)], &q5).0,
        128
    );
}

#[test]
fn negative_zero_follows_the_te_kernel_path() {
    // Row 0: [-0.0, 3e38, -1e-30, ...]: the product of -1e-30 underflows and keeps its sign
    // on every path; -0.0 becomes +0 only where TE runs its fma-based fast kernels.
    let (m, k) = (64, 128);
    let mut x = vec![1.0f32; m * k];
    x[0] = -0.0;
    x[1] = 3e38;
    x[2] = -1e-30;
    let run = |q: Mxfp8Quantizer, dtype: DType, dir: &str| {
        let xt = HostTensor::f32(&x, &[m, k])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let t = q.quantize(&xt).unwrap();
        let d = bytes(&t, dir);
        (d[0], d[2])
    };
    let both = Mxfp8Quantizer::new(Usage::BOTH);
    assert_eq!(run(both.clone(), DType::BF16, "rowwise_data"), (0x00, 0x80));
    assert_eq!(run(both.clone(), DType::F16, "columnwise_data").0, 0x00);
    assert_eq!(run(both.clone(), DType::F32, "rowwise_data"), (0x80, 0x80));
    assert_eq!(
        run(both.clone().with_2d(true), DType::BF16, "rowwise_data"),
        (0x80, 0x80)
    );
    let ocp = both.clone().with_scale_rule(ScaleRule::Ocp);
    assert_eq!(run(ocp, DType::BF16, "rowwise_data").0, 0x80);
    let col = Mxfp8Quantizer::new(Usage::COLUMNWISE);
    assert_eq!(run(col, DType::BF16, "columnwise_data").0, 0x80);
    let row = Mxfp8Quantizer::new(Usage::ROWWISE);
    assert_eq!(run(row.clone(), DType::BF16, "rowwise_data"), (0x00, 0x80)); // K % 128 == 0
    // Grid limits of TE's fast kernels.
    assert!(row.flushes_negative_zero(DType::BF16, 262_140, 128));
    assert!(!row.flushes_negative_zero(DType::BF16, 262_144, 128));
    assert!(both.flushes_negative_zero(DType::BF16, 2_097_120, 32));
    assert!(!both.flushes_negative_zero(DType::BF16, 2_097_152, 32));
}

#[test]
fn documented_rule_comparison_table_holds() {
    // docs/formats/mxfp8.md: block max -> (TE code, TE byte, OCP code, OCP byte).
    let te = Mxfp8Quantizer::new(Usage::ROWWISE);
    let ocp = te.clone().with_scale_rule(ScaleRule::Ocp);
    for (amax, te_c, te_b, ocp_c, ocp_b) in [
        (300.0, 127, 0x79, 127, 0x79),
        (448.0, 127, 0x7E, 127, 0x7E),
        (460.0, 128, 0x76, 127, 0x7E),
        (470.0, 128, 0x77, 127, 0x7E),
        (511.0, 128, 0x78, 127, 0x7E),
        (512.0, 128, 0x78, 128, 0x78),
    ] {
        let (c, d) = one_block(&[amax], &te);
        assert_eq!((c, d[0]), (te_c, te_b), "TE {amax}");
        let (c, d) = one_block(&[amax], &ocp);
        assert_eq!((c, d[0]), (ocp_c, ocp_b), "OCP {amax}");
    }
    // inf block under TE: 1e36 * 2^-127 survives, 1e30 does not.
    let (c, d) = one_block(&[f32::INFINITY, 1e36, 1e30], &te);
    assert_eq!(
        (c, d[1], d[2]),
        (0xFE, Mxfp8Dtype::E4M3.encode(1e36 * 2f32.powi(-127)), 0)
    );
    assert_ne!(d[1], 0);
}

#[test]
fn ocp_rule_special_blocks() {
    let q = Mxfp8Quantizer::new(Usage::ROWWISE).with_scale_rule(ScaleRule::Ocp);
    assert_eq!(one_block(&[], &q).0, 0);
    // NaN or inf anywhere in the block: NaN scale, all elements NaN.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let (c, d) = one_block(&[1.0, bad], &q);
        assert_eq!(c, 0xFF);
        assert!(d.iter().all(|&b| b == 0x7F));
    }
    // amax 460: scale 1, 460 clips to 448.
    let (c, d) = one_block(&[460.0, 2.0], &q);
    assert_eq!((c, d[0], d[1]), (127, 0x7E, 0x40));
    // amax 300: both rules give scale 1.
    assert_eq!(one_block(&[300.0], &q).0, 127);
    assert_eq!(
        one_block(&[300.0], &Mxfp8Quantizer::new(Usage::ROWWISE)).0,
        127
    );
    // A NaN-scaled block dequantizes to NaN.
    let mut x = vec![1.0f32; 32 * 32];
    x[0] = f32::NAN;
    let t = q
        .quantize(&HostTensor::f32(&x, &[32, 32]).unwrap())
        .unwrap();
    let back = t.dequantize_f32().unwrap();
    assert!(back[..32].iter().all(|v| v.is_nan()));
    assert!(back[32..].iter().all(|&v| v == 1.0));
}

#[test]
fn columnwise_blocks_run_down_the_rows() {
    // One large value per column block changes only that column's scale.
    let (m, k) = (64, 32);
    let mut x = vec![1.0f32; m * k];
    x[3 * k + 5] = 1000.0; // column 5, rows 0..32
    let t = Mxfp8Quantizer::new(Usage::BOTH)
        .quantize(&HostTensor::f32(&x, &[m, k]).unwrap())
        .unwrap();
    let col = t.scale_codes(Direction::Columnwise).unwrap(); // [2, 32]
    assert_eq!(col.len(), 2 * 32);
    for (i, &c) in col.iter().enumerate() {
        let want = if i == 5 { 129 } else { 119 }; // 1000/448 -> 4; 1/448 -> 2^-8
        assert_eq!(c, want, "entry {i}");
    }
    let row = t.scale_codes(Direction::Rowwise).unwrap(); // [64, 1]
    assert_eq!(row[3], 129);
    assert!(row.iter().enumerate().all(|(i, &c)| i == 3 || c == 119));
}

#[test]
fn two_d_directions_are_identical_and_derivable() {
    let (m, k) = (160, 96);
    let x = input(m, k, 5);
    for layout in [ScaleLayout::Compact, ScaleLayout::Swizzled] {
        for rule in [ScaleRule::Te, ScaleRule::Ocp] {
            let q = Mxfp8Quantizer::new(Usage::BOTH)
                .with_2d(true)
                .with_scale_rule(rule)
                .with_scale_layout(layout);
            let xt = HostTensor::f32(&x, &[m, k]).unwrap();
            let both = q.quantize(&xt).unwrap();
            assert_eq!(
                bytes(&both, "rowwise_data"),
                bytes(&both, "columnwise_data")
            );
            let row = both.scale_codes(Direction::Rowwise).unwrap();
            let col = both.scale_codes(Direction::Columnwise).unwrap();
            for i in 0..m {
                for kb in 0..k / 32 {
                    for j in kb * 32..kb * 32 + 32 {
                        assert_eq!(row[i * (k / 32) + kb], col[(i / 32) * k + j]);
                    }
                }
            }
            for (from, to) in [
                (Usage::ROWWISE, Usage::BOTH),
                (Usage::COLUMNWISE, Usage::BOTH),
                (Usage::ROWWISE, Usage::COLUMNWISE),
            ] {
                let mut t = q.with_usage(from).quantize(&xt).unwrap();
                t.update_usage(to).unwrap();
                let want = q.with_usage(to).quantize(&xt).unwrap();
                for b in want.buffers() {
                    assert_eq!(
                        t.buffer(b.name()).unwrap().bytes(),
                        b.bytes(),
                        "{} {from} -> {to} {}",
                        q.spec(),
                        b.name()
                    );
                }
            }
        }
    }
}

#[test]
fn one_d_refuses_to_derive_but_drops() {
    let x = input(64, 64, 9);
    let xt = HostTensor::f32(&x, &[64, 64]).unwrap();
    let mut t = Mxfp8Quantizer::new(Usage::ROWWISE).quantize(&xt).unwrap();
    let e = t.update_usage(Usage::BOTH).unwrap_err();
    assert!(e.to_string().contains("different scales"), "{e}");
    assert!(
        e.to_string().contains("TransformerEngine refuses too"),
        "{e}"
    );
    let mut t = Mxfp8Quantizer::new(Usage::BOTH).quantize(&xt).unwrap();
    let row = bytes(&t, "rowwise_data");
    t.update_usage(Usage::ROWWISE).unwrap();
    assert_eq!(t.buffers().len(), 2);
    assert_eq!(bytes(&t, "rowwise_data"), row);
}

#[test]
fn layouts_convert_exactly_both_ways() {
    let (m, k) = (288, 160);
    let x = input(m, k, 11);
    let xt = HostTensor::f32(&x, &[m, k]).unwrap();
    let c = Mxfp8Quantizer::new(Usage::BOTH).quantize(&xt).unwrap();
    let s = Mxfp8Quantizer::new(Usage::BOTH)
        .with_scale_layout(ScaleLayout::Swizzled)
        .quantize(&xt)
        .unwrap();
    let c2s = c.to_scale_layout(ScaleLayout::Swizzled).unwrap();
    let s2c = s.to_scale_layout(ScaleLayout::Compact).unwrap();
    assert_eq!(c2s.quantizer(), s.quantizer());
    assert_eq!(s2c.quantizer(), c.quantizer());
    for b in ["rowwise_scale_inv", "columnwise_scale_inv", "rowwise_data"] {
        assert_eq!(bytes(&c2s, b), bytes(&s, b), "{b}");
        assert_eq!(bytes(&s2c, b), bytes(&c, b), "{b}");
    }
    for dir in [Direction::Rowwise, Direction::Columnwise] {
        assert_eq!(c.scale_codes(dir).unwrap(), s.scale_codes(dir).unwrap());
        let a = c.dequantize_as::<f32>(dir).unwrap();
        let b = s.dequantize_as::<f32>(dir).unwrap();
        assert!(
            a.iter()
                .zip(&b)
                .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()))
        );
    }
    // Raw functions, and the index helpers against the compact matrix.
    let [rr, rc] = rowwise_scale_shape(m, k);
    let mut out = vec![0; rr * rc];
    layout::unswizzle_scales(
        Direction::Rowwise,
        &bytes(&s, "rowwise_scale_inv"),
        &mut out,
        m,
        k,
    )
    .unwrap();
    assert_eq!(out, bytes(&c, "rowwise_scale_inv"));
    let cs = bytes(&c, "columnwise_scale_inv");
    let ss = bytes(&s, "columnwise_scale_inv");
    let [_, cc] = columnwise_scale_shape(m, k);
    for mb in 0..m / 32 {
        for j in 0..k {
            assert_eq!(
                cs[mb * cc + j],
                ss[columnwise_scale_index(ScaleLayout::Swizzled, m, k, mb, j)]
            );
            assert_eq!(
                cs[columnwise_scale_index(ScaleLayout::Compact, m, k, mb, j)],
                cs[mb * cc + j]
            );
        }
    }
    let rs = bytes(&s, "rowwise_scale_inv");
    let rcpt = bytes(&c, "rowwise_scale_inv");
    for i in 0..m {
        for kb in 0..k / 32 {
            assert_eq!(
                rcpt[i * rc + kb],
                rs[rowwise_scale_index(ScaleLayout::Swizzled, m, k, i, kb)]
            );
        }
    }
    // Padding stays zero in both layouts.
    let nz = |v: &[u8]| v.iter().filter(|&&b| b != 0).count();
    let logical = |t: &Mxfp8Tensor, d| nz(&t.scale_codes(d).unwrap());
    assert_eq!(nz(&rs), logical(&s, Direction::Rowwise));
    assert_eq!(nz(&ss), logical(&s, Direction::Columnwise));
}

fn rebuild(t: &Mxfp8Tensor, edit: impl Fn(&str, &mut Vec<u8>)) -> quant_core::Result<Mxfp8Tensor> {
    let bufs = t
        .buffers()
        .iter()
        .map(|b| {
            let mut v = b.bytes().to_vec();
            edit(b.name(), &mut v);
            Buffer::from_bytes(b.desc().clone(), &v).unwrap()
        })
        .collect();
    QuantizedTensor::from_buffers(t.quantizer().clone(), t.shape(), t.dtype(), bufs)
}

#[test]
fn validation_accepts_nan_scales_and_padding_rejects_broken_2d() {
    let (m, k) = (64, 64);
    let x = input(m, k, 3);
    let xt = HostTensor::f32(&x, &[m, k]).unwrap();
    let t = Mxfp8Quantizer::new(Usage::BOTH).quantize(&xt).unwrap();
    // 0xFF (E8M0 NaN) is a legitimate code: accepted, its block dequantizes to NaN.
    let nan = rebuild(&t, |n, v| {
        if n == "rowwise_scale_inv" {
            v[0] = 0xFF;
        }
    })
    .unwrap();
    let back = nan.dequantize_f32().unwrap();
    assert!(back[..32].iter().all(|v| v.is_nan()));
    // Garbage in the compact padding (as TE leaves it) is accepted and never read.
    let padded = rebuild(&t, |n, v| {
        let [r, c] = if n == "rowwise_scale_inv" {
            rowwise_scale_shape(m, k)
        } else {
            columnwise_scale_shape(m, k)
        };
        if n.ends_with("scale_inv") {
            for i in 0..r {
                for j in 0..c {
                    let logical = if n == "rowwise_scale_inv" {
                        i < m && j < k / 32
                    } else {
                        i < m / 32 && j < k
                    };
                    if !logical {
                        v[i * c + j] = 0xA5;
                    }
                }
            }
        }
    })
    .unwrap();
    for dir in [Direction::Rowwise, Direction::Columnwise] {
        let a = padded.dequantize_as::<f32>(dir).unwrap();
        let b = t.dequantize_as::<f32>(dir).unwrap();
        assert!(
            a.iter()
                .zip(&b)
                .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()))
        );
    }
    // A 2d tensor whose scales vary inside a tile, or whose directions disagree, is refused.
    for layout in [ScaleLayout::Compact, ScaleLayout::Swizzled] {
        let q = Mxfp8Quantizer::new(Usage::BOTH)
            .with_2d(true)
            .with_scale_layout(layout);
        let t = q.quantize(&xt).unwrap();
        assert!(rebuild(&t, |_, _| {}).is_ok());
        let idx = rowwise_scale_index(layout, m, k, 33, 1);
        let e = rebuild(&t, |n, v| {
            if n == "rowwise_scale_inv" {
                v[idx] ^= 1;
            }
        })
        .unwrap_err();
        assert!(e.to_string().contains("one scale per tile"), "{e}");
        let idx = columnwise_scale_index(layout, m, k, 1, 0);
        let e = rebuild(&t, |n, v| {
            if n == "columnwise_scale_inv" {
                v[idx] ^= 1;
            }
        })
        .unwrap_err();
        assert!(e.to_string().contains("one scale per tile"), "{e}");
        // Same change on every entry of a tile in one direction only: directions disagree.
        let e = rebuild(&t, |n, v| {
            if n == "columnwise_scale_inv" {
                for j in 0..32 {
                    v[columnwise_scale_index(layout, m, k, 0, j)] ^= 1;
                }
            }
        })
        .unwrap_err();
        assert!(e.to_string().contains("share one scale per tile"), "{e}");
        let e = rebuild(&t, |n, v| {
            if n == "columnwise_data" {
                v[100] ^= 1;
            }
        })
        .unwrap_err();
        assert!(e.to_string().contains("identical data"), "{e}");
    }
}

#[test]
fn file_round_trip_keeps_options_and_bytes() {
    let mut reg = Registry::new();
    reg.register::<Mxfp8Quantizer>();
    let dir = std::env::temp_dir().join(format!("fmt-mxfp8-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.safetensors");
    let x = input(96, 64, 21);
    let xt = HostTensor::f32(&x, &[96, 64])
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    for q in all_quantizers() {
        let t = q.quantize(&xt).unwrap();
        quant_core::io::save(&path, &[("w", &t)]).unwrap();
        let loaded = quant_core::io::load(&path, &reg).unwrap();
        let Some(quant_core::io::Loaded::Quantized(s)) = loaded.get("w") else {
            panic!("not quantized")
        };
        let back = s.as_any().downcast_ref::<Mxfp8Tensor>().unwrap();
        assert_eq!(back.quantizer(), &q);
        assert_eq!(back.dtype(), DType::BF16);
        for b in t.buffers() {
            assert_eq!(back.buffer(b.name()).unwrap().bytes(), b.bytes());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn requantize_in_place_and_multi_dim_inputs() {
    let q = Mxfp8Quantizer::new(Usage::BOTH).with_scale_layout(ScaleLayout::Swizzled);
    let a = input(96, 64, 1);
    let b = input(96, 64, 2);
    let mut t = q
        .quantize(&HostTensor::f32(&a, &[2, 48, 64]).unwrap())
        .unwrap();
    t.quantize_from(&HostTensor::f32(&b, &[2, 48, 64]).unwrap())
        .unwrap();
    let fresh = q
        .quantize(&HostTensor::f32(&b, &[2, 48, 64]).unwrap())
        .unwrap();
    for buf in fresh.buffers() {
        assert_eq!(t.buffer(buf.name()).unwrap().bytes(), buf.bytes());
    }
    // A 3-D tensor is its [M, K] view.
    let flat = q
        .quantize(&HostTensor::f32(&b, &[96, 64]).unwrap())
        .unwrap();
    for buf in flat.buffers() {
        assert_eq!(fresh.buffer(buf.name()).unwrap().bytes(), buf.bytes());
    }
    assert_eq!(fresh.dequantize_f32().unwrap().len(), 96 * 64);
}

#[test]
fn rules_amax_and_codes_match_the_reference_functions() {
    let mut r = Rng(99);
    let q_te = Mxfp8Quantizer::new(Usage::ROWWISE);
    for dtype in [Mxfp8Dtype::E4M3, Mxfp8Dtype::E5M2] {
        for rule in [ScaleRule::Te, ScaleRule::Ocp] {
            let q = q_te.clone().with_dtype(dtype).with_scale_rule(rule);
            for _ in 0..200_000 {
                let bits = r.next() as u32;
                let a = f32::from_bits(bits & 0x7FFF_FFFF);
                assert_eq!(
                    rule.code(a, dtype),
                    reference::block_code(&q, a),
                    "{rule} {dtype} {a:e}"
                );
            }
            let v: Vec<f32> = (0..32).map(|_| f32::from_bits(r.next() as u32)).collect();
            let a = rule.amax(&v);
            let b = reference::block_amax(rule, v.iter().copied());
            assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
        }
    }
}
