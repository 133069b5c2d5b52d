//! Byte-for-byte comparison with the independent numpy + ml_dtypes model in
//! `tests/golden/int4tiled.py` (torchao qparams, a literal port of the CUDA pack kernel,
//! exact rational dequantization).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use fmt_int4tiled::{Int4TiledQuantizer, Int4TiledTensorExt};
use half::{bf16, f16};
use quant_core::{Direction, Format, HostTensor, Usage};
use safetensors::SafeTensors;
use serde_json::Value;

const PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/golden/data/int4tiled.safetensors"
);

struct Golden {
    bytes: Vec<u8>,
}

impl Golden {
    fn load() -> Golden {
        Golden {
            bytes: std::fs::read(PATH).expect("golden file (run tests/golden/int4tiled.py)"),
        }
    }
    fn st(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).unwrap()
    }
    fn cases(&self) -> BTreeMap<String, Value> {
        let (_, meta) = SafeTensors::read_metadata(&self.bytes).unwrap();
        let m = meta.metadata().as_ref().unwrap();
        serde_json::from_str(&m["cases"]).unwrap()
    }
}

fn quantizer(spec: &str) -> Int4TiledQuantizer {
    let opts: Vec<&str> = spec
        .split_once(':')
        .map(|(_, o)| o.split(',').collect())
        .unwrap_or_default();
    Int4TiledQuantizer::from_spec(&opts, Usage::ROWWISE).unwrap()
}

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// bf16 bit patterns equal, or both NaN (NaN payloads/signs are not part of the contract).
fn assert_bf16_eq(what: &str, got: &[bf16], want: &[u16]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, &w)) in got.iter().zip(want).enumerate() {
        let w = bf16::from_bits(w);
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}[{i}]: got {g} ({:#06x}), want {w} ({:#06x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

#[test]
fn quantize_pack_dequant_match_the_reference() {
    let golden = Golden::load();
    let st = golden.st();
    let cases = golden.cases();
    assert_eq!(cases.len(), 11);
    for (name, meta) in &cases {
        let spec = meta["spec"].as_str().unwrap();
        let shape: Vec<usize> = serde_json::from_value(meta["shape"].clone()).unwrap();
        let dtype = meta["dtype"].as_str().unwrap();
        let q = quantizer(spec);
        let input = st.tensor(&format!("{name}.input")).unwrap();
        let (bfv, hv, fv);
        let x = match dtype {
            "bf16" => {
                bfv = u16s(input.data())
                    .into_iter()
                    .map(bf16::from_bits)
                    .collect::<Vec<_>>();
                HostTensor::bf16(&bfv, &shape).unwrap()
            }
            "f16" => {
                hv = u16s(input.data())
                    .into_iter()
                    .map(f16::from_bits)
                    .collect::<Vec<_>>();
                HostTensor::f16(&hv, &shape).unwrap()
            }
            _ => {
                fv = input
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect::<Vec<_>>();
                HostTensor::f32(&fv, &shape).unwrap()
            }
        };
        let t = q.quantize(&x).unwrap();
        let ctx = format!("{name} ({spec}, {dtype} {shape:?}: {})", meta["note"]);

        let want_pw = st.tensor(&format!("{name}.packed_weight")).unwrap();
        let got_pw = t.buffer("packed_weight").unwrap();
        assert_eq!(got_pw.shape(), want_pw.shape(), "{ctx}: packed shape");
        assert!(
            got_pw.bytes() == want_pw.data(),
            "{ctx}: packed_weight bytes differ"
        );

        let want_sz = st.tensor(&format!("{name}.scale_and_zero")).unwrap();
        assert_eq!(t.buffer("scale_and_zero").unwrap().shape(), want_sz.shape());
        assert_bf16_eq(
            &format!("{ctx}: scale_and_zero"),
            t.scale_and_zero().unwrap(),
            &u16s(want_sz.data()),
        );

        let want_u = st.tensor(&format!("{name}.u")).unwrap();
        assert_eq!(t.unpack().unwrap(), want_u.data(), "{ctx}: nibbles");

        let want_b = u16s(st.tensor(&format!("{name}.dequant_bf16")).unwrap().data());
        let got_b = t.dequantize_as::<bf16>(Direction::Rowwise).unwrap();
        assert_bf16_eq(&format!("{ctx}: dequant bf16"), &got_b, &want_b);

        let want_f = st.tensor(&format!("{name}.dequant_f32")).unwrap();
        let got_f = t.dequantize_as::<f32>(Direction::Rowwise).unwrap();
        for (i, (g, w)) in got_f.iter().zip(want_f.data().chunks_exact(4)).enumerate() {
            let w = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{ctx}: dequant f32[{i}]: got {g}, want {w}"
            );
        }

        // The reference buffers, wrapped as they are, unpack and dequantize identically.
        let pw: Vec<i32> = want_pw
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let sz: Vec<bf16> = u16s(want_sz.data())
            .into_iter()
            .map(bf16::from_bits)
            .collect();
        let w = q.from_packed(&shape, &pw, &sz).unwrap();
        assert_eq!(w.unpack().unwrap(), want_u.data(), "{ctx}: from_packed");
        assert_bf16_eq(
            &format!("{ctx}: from_packed dequant"),
            &w.dequantize_as::<bf16>(Direction::Rowwise).unwrap(),
            &want_b,
        );
    }
}

#[test]
fn golden_covers_what_it_claims() {
    let golden = Golden::load();
    let st = golden.st();
    let cases = golden.cases();
    let dtypes: Vec<&str> = cases
        .values()
        .map(|m| m["dtype"].as_str().unwrap())
        .collect();
    for d in ["bf16", "f32", "f16"] {
        assert!(dtypes.contains(&d), "no {d} case");
    }
    // NaN, infinite and padded-group qparams occur in the reference data.
    let mut nan = false;
    let mut inf = false;
    for name in cases.keys() {
        let sz = u16s(st.tensor(&format!("{name}.scale_and_zero")).unwrap().data());
        nan |= sz.iter().any(|&b| bf16::from_bits(b).is_nan());
        inf |= sz.iter().any(|&b| bf16::from_bits(b).is_infinite());
    }
    assert!(nan && inf);
    let specs: Vec<&str> = cases
        .values()
        .map(|m| m["spec"].as_str().unwrap())
        .collect();
    assert!(specs.iter().any(|s| s.contains("pad=torchao")));
    assert!(specs.iter().any(|s| s.contains("eps=")));
}

#[test]
fn dequant_single_rounding_ties_match_exact_arithmetic() {
    let golden = Golden::load();
    let st = golden.st();
    let (_, meta) = SafeTensors::read_metadata(&golden.bytes).unwrap();
    let m: Value =
        serde_json::from_str(&meta.metadata().as_ref().unwrap()["dequant_case"]).unwrap();
    let shape: Vec<usize> = serde_json::from_value(m["shape"].clone()).unwrap();
    let q = quantizer(m["spec"].as_str().unwrap());
    let get16 = |n: &str| -> Vec<bf16> {
        u16s(st.tensor(n).unwrap().data())
            .into_iter()
            .map(bf16::from_bits)
            .collect()
    };
    let u = st.tensor("dq.u").unwrap().data().to_vec();
    let t = q
        .from_logical(&shape, &u, &get16("dq.scale"), &get16("dq.zero"))
        .unwrap();
    let want_b = u16s(st.tensor("dq.dequant_bf16").unwrap().data());
    let got_b = t.dequantize_as::<bf16>(Direction::Rowwise).unwrap();
    assert_bf16_eq("dq bf16", &got_b, &want_b);
    let want_f = st.tensor("dq.dequant_f32").unwrap();
    let got_f = t.dequantize_as::<f32>(Direction::Rowwise).unwrap();
    let got_f: Vec<u8> = got_f.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(got_f, want_f.data());
    // And these are cases where rounding twice (f32, then bf16) is wrong.
    let logical = t.to_logical().unwrap();
    let g = q.group_size();
    let double_wrong = (0..u.len())
        .filter(|&i| {
            let (r, kk) = (i / shape[1], i % shape[1]);
            let gi = r * (shape[1] / g) + kk / g;
            let p = (f32::from(u[i]) - 8.0) * logical.scale[gi].to_f32();
            bf16::from_f32(p + logical.zero[gi].to_f32()).to_bits() != want_b[i]
        })
        .count();
    assert!(double_wrong > 100, "{double_wrong}");
}
