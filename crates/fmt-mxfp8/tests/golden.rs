//! Byte-for-byte comparison with the independent numpy/ml_dtypes reference
//! (`tests/golden/mxfp8.py`, data committed in `tests/golden/data/mxfp8.safetensors`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fmt_mxfp8::{Mxfp8Quantizer, Mxfp8TensorExt, ScaleLayout, reference};
use quant_core::half::bf16;
use quant_core::registry::split_spec;
use quant_core::{Direction, Format, HostTensor, QuantizedTensor, Usage};
use safetensors::SafeTensors;
use serde_json::Value;

const PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/golden/data/mxfp8.safetensors"
);

const BUFFERS: [&str; 4] = [
    "rowwise_data",
    "rowwise_scale_inv",
    "columnwise_data",
    "columnwise_scale_inv",
];

struct Case {
    name: String,
    shape: Vec<usize>,
    dtype: String,
    spec: String,
    dequant: bool,
}

fn cases(bytes: &[u8]) -> Vec<Case> {
    let (_, meta) = SafeTensors::read_metadata(bytes).unwrap();
    let meta = meta.metadata().as_ref().unwrap();
    let v: Value = serde_json::from_str(&meta["cases"]).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            shape: c["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect(),
            dtype: c["dtype"].as_str().unwrap().to_string(),
            spec: c["spec"].as_str().unwrap().to_string(),
            dequant: c["dequant"].as_bool().unwrap(),
        })
        .collect()
}

fn quantizer(spec: &str, usage: Usage) -> Mxfp8Quantizer {
    let (name, opts) = split_spec(spec).unwrap();
    assert_eq!(name, "mxfp8");
    let q = Mxfp8Quantizer::from_spec(&opts, usage).unwrap();
    assert_eq!(q.spec(), spec, "spec round trip");
    q
}

/// The input as f32 (exact) and as a HostTensor of its own dtype.
fn input<'a>(st: &'a SafeTensors<'a>, c: &Case) -> (Vec<f32>, HostTensor<'a>) {
    let t = st.tensor(&format!("{}.input", c.name)).unwrap();
    let x = match c.dtype.as_str() {
        "f32" => HostTensor::from_le_bytes(quant_core::DType::F32, t.data(), &c.shape).unwrap(),
        "bf16" => HostTensor::from_le_bytes(quant_core::DType::BF16, t.data(), &c.shape).unwrap(),
        other => panic!("dtype {other}"),
    };
    (x.to_f32_vec(), x)
}

fn golden<'a>(st: &'a SafeTensors<'a>, case: &str, buf: &str) -> &'a [u8] {
    st.tensor(&format!("{case}.{buf}")).unwrap().data()
}

fn same_f32(got: &[f32], want: &[u8]) -> Option<usize> {
    let want: Vec<f32> = want
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(&want)
        .position(|(g, w)| !(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())))
}

#[test]
fn quantize_matches_numpy_reference_byte_for_byte() {
    let bytes = std::fs::read(PATH).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let cases = cases(&bytes);
    assert_eq!(cases.len(), 17);
    let mut compared = 0usize;
    for c in &cases {
        let (_, x) = input(&st, c);
        let q = quantizer(&c.spec, Usage::BOTH);
        let t = q.quantize(&x).unwrap();
        for b in BUFFERS {
            let got = t.buffer(b).unwrap().bytes();
            let want = golden(&st, &c.name, b);
            assert_eq!(got.len(), want.len(), "{} {b} length", c.name);
            if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
                panic!(
                    "{} ({}, {}) {b}: byte {i} is {:#04x}, reference {:#04x}",
                    c.name, c.spec, c.dtype, got[i], want[i]
                );
            }
            compared += got.len();
        }
        // One direction at a time gives the same bytes, except that an input -0.0 may
        // change sign where TE would switch between its fast and generic kernels.
        let (xf, _) = input(&st, c);
        let k = *c.shape.last().unwrap();
        let m = xf.len() / k;
        for (usage, names) in [
            (Usage::ROWWISE, &BUFFERS[..2]),
            (Usage::COLUMNWISE, &BUFFERS[2..]),
        ] {
            let q1 = quantizer(&c.spec, usage);
            let t1 = q1.quantize(&x).unwrap();
            let flip = q.flushes_negative_zero(x.dtype(), m, k)
                != q1.flushes_negative_zero(x.dtype(), m, k);
            for &b in names {
                let got = t1.buffer(b).unwrap().bytes();
                let want = golden(&st, &c.name, b);
                for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
                    if g != w {
                        assert!(
                            flip && b.ends_with("_data")
                                && xf[i].to_bits() == 0x8000_0000
                                && g ^ w == 0x80
                                && g & 0x7F == 0,
                            "{} {b} with usage {usage}: byte {i} {g:#04x} vs {w:#04x}",
                            c.name
                        );
                    }
                }
            }
        }
    }
    assert!(compared > 400_000, "{compared}");
}

#[test]
fn reference_module_matches_numpy_reference() {
    let bytes = std::fs::read(PATH).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    for c in cases(&bytes) {
        let (xf, _) = input(&st, &c);
        let q = quantizer(&c.spec, Usage::BOTH);
        let k = *c.shape.last().unwrap();
        let m = xf.len() / k;
        let dt = if c.dtype == "bf16" {
            quant_core::DType::BF16
        } else {
            quant_core::DType::F32
        };
        let r = reference::quantize(&q, &xf, dt, m, k).unwrap();
        assert_eq!(
            r.rowwise_data,
            golden(&st, &c.name, "rowwise_data"),
            "{}",
            c.name
        );
        assert_eq!(
            r.rowwise_scale_inv,
            golden(&st, &c.name, "rowwise_scale_inv"),
            "{}",
            c.name
        );
        assert_eq!(
            r.columnwise_data,
            golden(&st, &c.name, "columnwise_data"),
            "{}",
            c.name
        );
        assert_eq!(
            r.columnwise_scale_inv,
            golden(&st, &c.name, "columnwise_scale_inv"),
            "{}",
            c.name
        );
    }
}

#[test]
fn dequantize_matches_numpy_reference_from_either_layout() {
    let bytes = std::fs::read(PATH).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut n = 0;
    for c in cases(&bytes).into_iter().filter(|c| c.dequant) {
        let (_, x) = input(&st, &c);
        let t = quantizer(&c.spec, Usage::BOTH).quantize(&x).unwrap();
        let other = match t.quantizer().scale_layout() {
            ScaleLayout::Compact => ScaleLayout::Swizzled,
            ScaleLayout::Swizzled => ScaleLayout::Compact,
        };
        let t2 = t.to_scale_layout(other).unwrap();
        for t in [&t, &t2] {
            for dir in [Direction::Rowwise, Direction::Columnwise] {
                let want = golden(&st, &c.name, &format!("dequant_{dir}_f32"));
                let got = t.dequantize_as::<f32>(dir).unwrap();
                if let Some(i) = same_f32(&got, want) {
                    panic!("{} {dir} dequant element {i}: {}", c.name, got[i]);
                }
                n += got.len();
            }
            let want = golden(&st, &c.name, "dequant_rowwise_bf16");
            let got: Vec<u8> = t
                .dequantize_as::<bf16>(Direction::Rowwise)
                .unwrap()
                .iter()
                .flat_map(|v| v.to_bits().to_le_bytes())
                .collect();
            // bf16 NaN payloads may differ; compare NaN-ness there.
            for (i, (g, w)) in got.chunks_exact(2).zip(want.chunks_exact(2)).enumerate() {
                let (g, w) = (
                    u16::from_le_bytes([g[0], g[1]]),
                    u16::from_le_bytes([w[0], w[1]]),
                );
                let nan = |b: u16| b & 0x7F80 == 0x7F80 && b & 0x7F != 0;
                assert!(
                    g == w || (nan(g) && nan(w)),
                    "{} bf16 element {i}: {g:#06x} vs {w:#06x}",
                    c.name
                );
            }
        }
    }
    assert!(n > 50_000, "{n}");
}

#[test]
fn golden_tensors_reload_through_validation() {
    // Buffers from the reference rebuild into a storage (validate_buffers passes, 2d
    // consistency included) and dequantize like the freshly quantized tensor.
    let bytes = std::fs::read(PATH).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    for c in cases(&bytes) {
        let (_, x) = input(&st, &c);
        let q = quantizer(&c.spec, Usage::BOTH);
        let fresh = q.quantize(&x).unwrap();
        let bufs = fresh
            .buffers()
            .iter()
            .map(|b| {
                quant_core::Buffer::from_bytes(b.desc().clone(), golden(&st, &c.name, b.name()))
                    .unwrap()
            })
            .collect();
        let t = QuantizedTensor::from_buffers(q, fresh.shape(), x.dtype(), bufs).unwrap();
        for dir in [Direction::Rowwise, Direction::Columnwise] {
            let a = t.dequantize_as::<f32>(dir).unwrap();
            let b = fresh.dequantize_as::<f32>(dir).unwrap();
            assert!(
                a.iter()
                    .zip(&b)
                    .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()))
            );
        }
    }
}
