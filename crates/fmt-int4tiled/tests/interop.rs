//! Storage-level behaviour: import/export forms, MoE experts, slicing, shape rules,
//! validation of untrusted buffers, spec strings and the native file round trip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fmt_int4tiled::{Int4TiledQuantizer, Int4TiledTensor, Int4TiledTensorExt, Padding};
use half::bf16;
use quant_core::{
    Buffer, DType, Direction, Format, HostTensor, QuantizedTensor, Registry, Shape, Usage,
};
use quantfmt_testkit::XorShift32;

fn weights(len: usize, seed: u32) -> Vec<bf16> {
    let mut rng = XorShift32::new(seed.wrapping_mul(2_654_435_761) | 1);
    (0..len)
        .map(|_| bf16::from_f32((rng.next_u32() % 20_000) as f32 / 10_000.0 - 1.0))
        .collect()
}

fn q(spec: &[&str]) -> Int4TiledQuantizer {
    Int4TiledQuantizer::from_spec(spec, Usage::ROWWISE).unwrap()
}

fn quant(qz: &Int4TiledQuantizer, w: &[bf16], shape: &[usize]) -> Int4TiledTensor {
    qz.quantize(&HostTensor::bf16(w, shape).unwrap()).unwrap()
}

fn same_bytes(a: &Int4TiledTensor, b: &Int4TiledTensor) -> bool {
    a.shape() == b.shape()
        && a.buffers()
            .iter()
            .zip(b.buffers())
            .all(|(x, y)| x.desc() == y.desc() && x.bytes() == y.bytes())
}

#[test]
fn logical_round_trip_restores_every_byte() {
    for (spec, shape) in [
        (&["g32", "k2"][..], &[13usize, 96][..]),
        (&["pad=torchao"][..], &[20, 256][..]),
        (&["g64", "k4"][..], &[3, 12, 128][..]),
    ] {
        let qz = q(spec);
        let n: usize = shape.iter().product();
        let t = quant(&qz, &weights(n, 7), shape);
        let l = t.to_logical().unwrap();
        assert_eq!(l.shape, shape);
        let back = qz.from_logical(shape, &l.u, &l.scale, &l.zero).unwrap();
        assert!(same_bytes(&t, &back), "{spec:?}");
        let pre = t.to_prepacked().unwrap();
        assert_eq!(pre.len(), n / 2);
        let back = qz.from_prepacked(shape, &pre, &l.scale, &l.zero).unwrap();
        assert!(same_bytes(&t, &back));
        let back = qz
            .from_packed(
                shape,
                t.packed_weight().unwrap(),
                t.scale_and_zero().unwrap(),
            )
            .unwrap();
        assert!(same_bytes(&t, &back));
    }
}

#[test]
fn integer_zero_points() {
    let qz = q(&["g32"]);
    let (n, k) = (16, 64);
    let u: Vec<u8> = (0..n * k).map(|i| ((i * 5 + i / 7) % 16) as u8).collect();
    let scale: Vec<f32> = (0..n * 2).map(|i| 0.01 + i as f32 * 0.003).collect();
    let zp: Vec<f32> = (0..n * 2).map(|i| (i % 16) as f32).collect();
    let t = qz.from_int_zero_points(&[n, k], &u, &scale, &zp).unwrap();
    let l = t.to_logical().unwrap();
    for i in 0..n * 2 {
        let s = bf16::from_f32(scale[i]);
        assert_eq!(l.scale[i], s);
        assert_eq!(l.zero[i], bf16::from_f32((8.0 - zp[i]) * s.to_f32()));
    }
    // export: 8 - z/s rounds back to the integer zero point
    let e = t.to_int_zero_points().unwrap();
    assert_eq!(e.u, u);
    for (got, want) in e.zero_point.iter().zip(&zp) {
        assert_eq!(got.round(), *want);
        assert!((got - want).abs() < 0.02, "{got} vs {want}");
    }
    // dequant ≈ (u - zp) * s within bf16 rounding of the zero
    let d = t.dequantize_f32().unwrap();
    for (i, v) in d.iter().enumerate() {
        let gi = (i / k) * 2 + (i % k) / 32;
        let s = bf16::from_f32(scale[gi]).to_f32();
        let want = (f32::from(u[i]) - zp[gi]) * s;
        assert!(
            (v - want).abs() <= 8.0 * s / 128.0 + 1e-6,
            "{i}: {v} vs {want}"
        );
    }
}

#[test]
fn import_errors_name_the_problem() {
    let qz = q(&["g32"]);
    let e = qz
        .from_logical(&[8, 32], &[16; 256], &[bf16::ONE; 8], &[bf16::ZERO; 8])
        .unwrap_err()
        .to_string();
    assert!(e.contains("u[0]") && e.contains("0..=15"), "{e}");
    let e = qz
        .from_logical(&[8, 32], &[0; 255], &[bf16::ONE; 8], &[bf16::ZERO; 8])
        .unwrap_err()
        .to_string();
    assert!(e.contains("255 elements") && e.contains("needs 256"), "{e}");
    let e = qz
        .from_logical(&[8, 32], &[0; 256], &[bf16::ONE; 7], &[bf16::ZERO; 8])
        .unwrap_err()
        .to_string();
    assert!(e.contains("scale"), "{e}");
}

#[test]
fn moe_experts_are_packed_one_by_one() {
    let qz = q(&["g64", "k4"]);
    let (e, n, k) = (3, 20, 192);
    let w = weights(e * n * k, 11);
    let t = quant(&qz, &w, &[e, n, k]);
    assert_eq!(t.num_experts(), Some(3));
    assert_eq!(
        t.buffer("packed_weight").unwrap().shape(),
        &[3, 3, 3, 32, 2]
    );
    assert_eq!(t.buffer("scale_and_zero").unwrap().shape(), &[3, 3, 24, 2]);
    let dq = t.dequantize_f32().unwrap();
    for i in 0..e {
        let one = quant(&qz, &w[i * n * k..][..n * k], &[n, k]);
        let sel = t.select_expert(i).unwrap();
        assert!(same_bytes(&sel, &one), "expert {i}");
        // zero-copy
        assert!(
            sel.buffer("packed_weight")
                .unwrap()
                .host()
                .shares_allocation(t.buffer("packed_weight").unwrap().host())
        );
        assert_eq!(
            &dq[i * n * k..][..n * k],
            &one.dequantize_f32().unwrap()[..]
        );
    }
    let err = t.select_expert(3).unwrap_err().to_string();
    assert!(err.contains("must be < 3"), "{err}");
    assert!(t.select_expert(0).unwrap().select_expert(0).is_err());
}

#[test]
fn slicing_equals_quantizing_the_slice() {
    for spec in [&["g32", "k2"][..], &["g64", "k8"][..], &["g256", "k4"][..]] {
        let qz = q(spec);
        let (n, k) = (37, 1024);
        let w = weights(n * k, 3);
        let t = quant(&qz, &w, &[n, k]);
        // n: multiples of 8, or up to n
        for (a, b) in [(0, 8), (8, 24), (16, 37), (32, 37), (0, 37)] {
            let s = t.slice_n(a..b).unwrap();
            let sub: Vec<bf16> = w[a * k..b * k].to_vec();
            assert!(
                same_bytes(&s, &quant(&qz, &sub, &[b - a, k])),
                "{spec:?} n {a}..{b}"
            );
        }
        // k: multiples of lcm(ikt*16, g)
        let unit = (qz.inner_k_tiles() * 16).max(qz.group_size());
        for (a, b) in [(0, unit), (unit, 3 * unit), (k - unit, k), (0, k)] {
            let s = t.slice_k(a..b).unwrap();
            let sub: Vec<bf16> = (0..n)
                .flat_map(|r| w[r * k + a..r * k + b].to_vec())
                .collect();
            assert!(
                same_bytes(&s, &quant(&qz, &sub, &[n, b - a])),
                "{spec:?} k {a}..{b}"
            );
        }
        // misaligned: refused with the rule
        let e = t.slice_n(4..16).unwrap_err().to_string();
        assert!(e.contains("n slice start=4 must be a multiple of 8"), "{e}");
        let e = t.slice_n(8..20).unwrap_err().to_string();
        assert!(e.contains("n slice end=20") && e.contains("or n=37"), "{e}");
        if unit > 32 {
            let e = t.slice_k(32..unit).unwrap_err().to_string();
            assert!(
                e.contains(&format!("k slice start=32 must be a multiple of {unit} (lcm(inner_k_tiles*16, group_size))")),
                "{e}"
            );
        }
        assert!(t.slice_k(0..0).is_err());
        assert!(t.slice_n(0..38).is_err());
    }
}

#[test]
fn slicing_moe_and_torchao_padding() {
    // 3-D: slices apply to every expert.
    let qz = q(&["g32", "k4"]);
    let (e, n, k) = (2, 16, 128);
    let w = weights(e * n * k, 5);
    let t = quant(&qz, &w, &[e, n, k]);
    let s = t.slice_k(64..128).unwrap();
    assert_eq!(s.shape().dims(), &[2, 16, 64]);
    let sub: Vec<bf16> = (0..e * n)
        .flat_map(|r| w[r * k + 64..r * k + 128].to_vec())
        .collect();
    assert!(same_bytes(&s, &quant(&qz, &sub, &[e, n, 64])));
    let s = t.slice_n(8..16).unwrap();
    let sub: Vec<bf16> = (0..e)
        .flat_map(|i| w[(i * n + 8) * k..(i * n + 16) * k].to_vec())
        .collect();
    assert!(same_bytes(&s, &quant(&qz, &sub, &[e, 8, k])));

    // pad=torchao: a 1024-aligned k slice keeps torchao padding, others fall back to kernel.
    let qt = q(&["pad=torchao"]);
    let (n, k) = (8, 2560); // padded to 3072
    let w = weights(n * k, 9);
    let t = quant(&qt, &w, &[n, k]);
    assert_eq!(t.padded_k(), 3072);
    let s = t.slice_k(0..1024).unwrap();
    assert_eq!((s.padding(), s.padded_k()), (Padding::Torchao, 1024));
    let s = t.slice_k(1024..2560).unwrap(); // ends at k: stored padding is real padding
    assert_eq!((s.padding(), s.padded_k()), (Padding::Torchao, 2048));
    let sub: Vec<bf16> = (0..n)
        .flat_map(|r| w[r * k + 1024..r * k + 2560].to_vec())
        .collect();
    assert!(same_bytes(&s, &quant(&qt, &sub, &[n, 1536])));
    let s = t.slice_k(0..1536).unwrap(); // would store weights beyond 1536: kernel padding
    assert_eq!((s.padding(), s.padded_k()), (Padding::Kernel, 1536));
    assert_eq!(
        s.dequantize_f32().unwrap(),
        (0..n)
            .flat_map(|r| t.dequantize_f32().unwrap()[r * k..r * k + 1536].to_vec())
            .collect::<Vec<_>>()
    );
}

#[test]
fn shape_rules_and_usage() {
    let qz = Int4TiledQuantizer::new();
    let e = qz
        .quantize(&HostTensor::f32(&[0.0; 8 * 100], &[8, 100]).unwrap())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "int4tiled: k=100 must be a multiple of the group size 128 (torchao leaves such layers unquantized)"
    );
    let e = qz
        .quantize(&HostTensor::f32(&[0.0; 128], &[128]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("must be [n, k]"), "{e}");
    let e = Int4TiledQuantizer::from_spec(&[], Usage::BOTH)
        .unwrap_err()
        .to_string();
    assert!(e.contains("columnwise usage is not supported"), "{e}");
    let both = Format::with_usage(&qz, Usage::BOTH);
    assert!(both.check_shape(&Shape::new(&[8, 128]).unwrap()).is_err());
    assert!(both.validate_options().is_err());
    // ragged n is fine (padded to 8); n = 1 works
    let t = qz
        .quantize(&HostTensor::f32(&[0.25; 128], &[1, 128]).unwrap())
        .unwrap();
    assert_eq!(t.padded_n(), 8);
    assert_eq!(t.dequantize_f32().unwrap(), vec![0.25; 128]);
}

#[test]
fn spec_options_round_trip_and_errors() {
    for opts in [
        &[][..],
        &["g32"][..],
        &["g256", "k2"][..],
        &["k4", "pad=torchao"][..],
        &["g64", "k8", "pad=kernel", "eps=1e-6"][..],
    ] {
        let a = q(opts);
        let spec = a.spec();
        let parsed: Vec<&str> = spec
            .split_once(':')
            .map(|(_, o)| o.split(',').collect())
            .unwrap_or_default();
        assert_eq!(q(&parsed), a, "{spec}");
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(
            serde_json::from_value::<Int4TiledQuantizer>(json).unwrap(),
            a
        );
    }
    assert_eq!(
        q(&["g64", "k4", "pad=torchao"]).spec(),
        "int4tiled:g64,k4,pad=torchao"
    );
    assert_eq!(q(&["eps=1e-6"]).eps(), 1e-6);
    for (bad, needle) in [
        ("g48", "must be 32, 64, 128 or 256"),
        ("k16", "must be 2, 4 or 8"),
        ("pad=none", "must be kernel or torchao"),
        ("eps=-1", "must be finite and > 0"),
        ("eps=x", "must be a number"),
        ("fast", "unknown option `fast`"),
    ] {
        let e = Int4TiledQuantizer::from_spec(&[bad], Usage::ROWWISE)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{bad}: {e}");
    }
    let bad: serde_json::Value = serde_json::json!({
        "group_size": 48, "inner_k_tiles": 8, "padding": "kernel", "eps": 1e-6,
        "usage": {"rowwise": true, "columnwise": false}
    });
    let q48: Int4TiledQuantizer = serde_json::from_value(bad).unwrap();
    assert!(q48.validate_options().is_err());
}

#[test]
fn untrusted_buffers_are_checked() {
    let qz = q(&["g32", "k4"]);
    let (n, k) = (13, 96); // n padded to 16, k to 128
    let t = quant(&qz, &weights(n * k, 1), &[n, k]);
    let shape = Shape::new(&[n, k]).unwrap();
    let rebuild = |pw: &[i32], sz: &[bf16]| {
        QuantizedTensor::from_buffers(
            qz.clone(),
            &shape,
            DType::BF16,
            vec![
                Buffer::from_slice("packed_weight", &[2, 2, 32, 2], pw).unwrap(),
                Buffer::from_slice("scale_and_zero", &[4, 16, 2], sz).unwrap(),
            ],
        )
    };
    let pw = t.packed_weight().unwrap().to_vec();
    let sz = t.scale_and_zero().unwrap().to_vec();
    assert!(rebuild(&pw, &sz).is_ok());
    // a nonzero nibble in a padded row
    let mut bad = pw.clone();
    let (w, j) = fmt_int4tiled::layout::locate(14, 5, 128, 4);
    bad[w] |= 3 << (4 * j);
    let e = rebuild(&bad, &sz).unwrap_err().to_string();
    assert!(
        e.contains("holds nibble 3 at padded position (expert 0, n=14, k=5)"),
        "{e}"
    );
    // a nonzero nibble in a padded column of a real row
    let mut bad = pw.clone();
    let (w, j) = fmt_int4tiled::layout::locate(2, 100, 128, 4);
    bad[w] |= 1 << (4 * j);
    assert!(rebuild(&bad, &sz).is_err());
    // an infinite scale in a padded k group
    let mut bad = sz.clone();
    bad[(3 * 16 + 2) * 2] = bf16::INFINITY;
    let e = rebuild(&pw, &bad).unwrap_err().to_string();
    assert!(e.contains("padded group 3"), "{e}");
    // an infinite scale in a real group is a faithful encoding and accepted
    let mut ok = sz.clone();
    ok[0] = bf16::INFINITY;
    assert!(rebuild(&pw, &ok).is_ok());
}

#[test]
fn native_file_round_trip() {
    let mut reg = Registry::new();
    reg.register::<Int4TiledQuantizer>();
    let qz = q(&["g64", "k2", "pad=torchao"]);
    let t = quant(&qz, &weights(2 * 9 * 128, 4), &[2, 9, 128]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    quant_core::io::save(&path, &[("w", &t)]).unwrap();
    let loaded = quant_core::io::load(&path, &reg).unwrap();
    let Some(quant_core::io::Loaded::Quantized(s)) = loaded.get("w") else {
        panic!("not loaded as quantized")
    };
    assert_eq!(s.format_name(), "int4tiled");
    assert_eq!(s.quantizer().spec(), "int4tiled:g64,k2,pad=torchao");
    for (a, b) in s.buffers().iter().zip(t.buffers()) {
        assert_eq!(a.bytes(), b.bytes());
    }
    assert_eq!(
        s.dequantize(Direction::Rowwise, DType::BF16)
            .unwrap()
            .as_bytes(),
        t.dequantize(Direction::Rowwise, DType::BF16)
            .unwrap()
            .as_bytes()
    );
}
