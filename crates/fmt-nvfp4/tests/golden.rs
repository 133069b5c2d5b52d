//! Byte-for-byte comparison with the independent numpy/ml_dtypes reference
//! `tests/golden/nvfp4.py` (data in `tests/golden/data/nvfp4.safetensors`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fmt_nvfp4::Nvfp4Quantizer;
use quant_core::{DType, Direction, Format, HostTensor, Usage};
use safetensors::SafeTensors;

const PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/golden/data/nvfp4.safetensors"
);

struct Case {
    index: usize,
    name: String,
    spec: String,
    usage: Usage,
    dtype: DType,
    shape: Vec<usize>,
}

fn cases(bytes: &[u8]) -> Vec<Case> {
    let (_, meta) = SafeTensors::read_metadata(bytes).unwrap();
    let meta = meta.metadata().as_ref().unwrap();
    let list: serde_json::Value = serde_json::from_str(&meta["cases"]).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            index: c["case"].as_u64().unwrap() as usize,
            name: c["name"].as_str().unwrap().to_string(),
            spec: c["spec"].as_str().unwrap().to_string(),
            usage: c["usage"].as_str().unwrap().parse().unwrap(),
            dtype: c["dtype"].as_str().unwrap().parse().unwrap(),
            shape: c["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect(),
        })
        .collect()
}

fn quantizer(spec: &str, usage: Usage) -> Nvfp4Quantizer {
    let opts: Vec<&str> = match spec.split_once(':') {
        Some((_, o)) => o.split(',').collect(),
        None => Vec::new(),
    };
    Nvfp4Quantizer::from_spec(&opts, usage).unwrap()
}

fn same_f32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

#[test]
fn golden_cases_are_byte_identical() {
    let bytes = std::fs::read(PATH).expect("golden file; regenerate with tests/golden/nvfp4.py");
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let all = cases(&bytes);
    assert!(all.len() >= 25, "{} cases", all.len());
    let mut buffers_checked = 0;
    let mut dequant_checked = 0;
    for c in &all {
        let q = quantizer(&c.spec, c.usage);
        let input = st.tensor(&format!("case{}.input", c.index)).unwrap();
        let x = HostTensor::from_le_bytes(c.dtype, input.data(), &c.shape).unwrap();
        let t = q
            .quantize(&x)
            .unwrap_or_else(|e| panic!("case {} ({}): {e}", c.index, c.name));
        for b in t.buffers() {
            let want = st
                .tensor(&format!("case{}.{}", c.index, b.name()))
                .unwrap_or_else(|_| panic!("case {}: golden lacks {}", c.index, b.name()));
            assert_eq!(
                b.shape(),
                want.shape(),
                "case {} {} shape",
                c.index,
                b.name()
            );
            if b.bytes() != want.data() {
                let first = b
                    .bytes()
                    .iter()
                    .zip(want.data())
                    .position(|(x, y)| x != y)
                    .unwrap_or(0);
                panic!(
                    "case {} ({}, {}): buffer {} differs first at byte {first}: got {:#04x}, want {:#04x}",
                    c.index,
                    c.name,
                    c.spec,
                    b.name(),
                    b.bytes()[first],
                    want.data()[first]
                );
            }
            buffers_checked += 1;
        }
        for (dir, name) in [
            (Direction::Rowwise, "dequant_rowwise"),
            (Direction::Columnwise, "dequant_columnwise"),
        ] {
            let Ok(want) = st.tensor(&format!("case{}.{name}", c.index)) else {
                continue;
            };
            let got = t.dequantize_as::<f32>(dir).unwrap();
            let want: Vec<f32> = want
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    same_f32(*g, *w),
                    "case {} ({}): {name}[{i}] = {g}, want {w}",
                    c.index,
                    c.name
                );
            }
            dequant_checked += 1;
        }
    }
    assert!(buffers_checked > 100, "{buffers_checked}");
    assert!(dequant_checked > 40, "{dequant_checked}");
}

/// The reference's spec strings are this crate's canonical ones (or parse back to them).
#[test]
fn golden_specs_round_trip() {
    let bytes = std::fs::read(PATH).unwrap();
    for c in cases(&bytes) {
        let q = quantizer(&c.spec, c.usage);
        let again = quantizer(&q.spec(), c.usage);
        assert_eq!(q, again, "{}", c.spec);
    }
}
