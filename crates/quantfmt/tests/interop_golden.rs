//! Checkpoints written by `tests/golden/interop.py` the way ModelOpt, compressed-tensors
//! and DeepSeek write them: read into native storages (buffers byte for byte, values bit
//! for bit), and written back into the same layout byte for byte.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use quant_core::io::RawTensor;
use quant_core::io::reader::{FileSource, read_header, read_tensor};
use quantfmt::interop::{self, Layout, LoadedItem};
use quantfmt::{AnyStorage, Storage};

const DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/golden/data/interop/"
);

fn read_all(file: &str) -> BTreeMap<String, RawTensor> {
    let path = format!("{DIR}{file}");
    let mut src = FileSource::open(path.as_ref()).unwrap();
    let h = read_header(&mut src).unwrap();
    h.tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                RawTensor {
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    data: read_tensor(&mut src, &h, t).unwrap(),
                },
            )
        })
        .collect()
}

fn f32s(t: &RawTensor) -> Vec<f32> {
    t.data
        .as_slice()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

struct Case {
    file: &'static str,
    layout: Layout,
    /// Layout name of the data tensor of weight `w`.
    data: fn(&str) -> String,
}

fn same(w: &str) -> String {
    w.to_string()
}
fn packed(w: &str) -> String {
    format!("{w}_packed")
}

const CASES: &[Case] = &[
    Case {
        file: "modelopt_nvfp4",
        layout: Layout::ModelOpt,
        data: same,
    },
    Case {
        file: "modelopt_fp8",
        layout: Layout::ModelOpt,
        data: same,
    },
    Case {
        file: "modelopt_mxfp8",
        layout: Layout::ModelOpt,
        data: same,
    },
    Case {
        file: "ct_nvfp4",
        layout: Layout::CompressedTensors,
        data: packed,
    },
    Case {
        file: "ct_nvfp4_f4",
        layout: Layout::CompressedTensors,
        data: packed,
    },
    Case {
        file: "ct_fp8",
        layout: Layout::CompressedTensors,
        data: same,
    },
    Case {
        file: "ct_fp8_block",
        layout: Layout::CompressedTensors,
        data: same,
    },
    Case {
        file: "ct_mxfp8",
        layout: Layout::CompressedTensors,
        data: same,
    },
    Case {
        file: "deepseek",
        layout: Layout::DeepSeek,
        data: same,
    },
];

#[test]
fn every_layout_reads_into_the_expected_native_buffers_and_values() {
    let expected = read_all("expected.safetensors");
    let mut weights = 0;
    let mut differing = 0usize;
    let mut total = 0usize;
    let mut max_ulps = 0i64;
    for c in CASES {
        let raw = read_all(&format!("{}.safetensors", c.file));
        let f = interop::load_file(format!("{DIR}{}.safetensors", c.file)).unwrap();
        assert_eq!(f.layout, Some(c.layout), "{}", c.file);
        for (name, item) in &f.tensors {
            match item {
                LoadedItem::Plain(t) => {
                    assert_eq!(
                        t.data.as_slice(),
                        raw[name].data.as_slice(),
                        "{} {name}",
                        c.file
                    );
                }
                LoadedItem::Skipped(why) => {
                    assert!(name.ends_with("_extra_state") && why.contains("_extra_state"));
                }
                LoadedItem::Quantized(imp) => {
                    weights += 1;
                    let s: &AnyStorage = &imp.storage;
                    let key = |b: &str| format!("{}:{name}:{b}", c.file);
                    // Data: the layout's bytes, unchanged.
                    assert_eq!(
                        s.buffer("rowwise_data").unwrap().bytes(),
                        raw[&(c.data)(name)].data.as_slice(),
                        "{} {name} data",
                        c.file
                    );
                    for b in s.buffers() {
                        if b.name() == "rowwise_data" {
                            continue;
                        }
                        let want = &expected[&key(b.name())];
                        assert_eq!(b.shape(), &want.shape[..], "{} {name} {}", c.file, b.name());
                        assert_eq!(
                            b.bytes(),
                            want.data.as_slice(),
                            "{} {name} {}",
                            c.file,
                            b.name()
                        );
                    }
                    // Values: TE's dequantization of the rebuilt tensor, bit for bit.
                    let got = s.dequantize_f32().unwrap();
                    let layout_vals = f32s(&expected[&key("dequant_layout")]);
                    let native_vals = expected
                        .get(&key("dequant_native"))
                        .map(f32s)
                        .unwrap_or_else(|| layout_vals.clone());
                    for (i, (g, w)) in got.iter().zip(&native_vals).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "{} {name} [{i}]: {g} vs {w}",
                            c.file
                        );
                    }
                    // Against the producer's own dequantization: NVFP4 differs by the
                    // roundings of the per-block factor, a few ulps (docs/interop.md).
                    for (g, w) in got.iter().zip(&layout_vals) {
                        total += 1;
                        if g.to_bits() != w.to_bits() {
                            differing += 1;
                            let ulps = (g.to_bits() as i64 - w.to_bits() as i64).abs();
                            max_ulps = max_ulps.max(ulps);
                            assert!(ulps <= 4, "{} {name}: {g} vs {w} ({ulps} ulps)", c.file);
                        }
                    }
                    // Static input scales come back as the multiplier (ModelOpt convention).
                    if let Some(x) = imp.extras.input_scale {
                        let want = 3.5f32 / 2688.0;
                        let ok = match c.file {
                            "modelopt_nvfp4" => x == want,
                            "ct_nvfp4" => x == 1.0 / (2688.0f32 / 3.5),
                            _ => x == 0.5,
                        };
                        assert!(ok, "{} {name}: input scale {x}", c.file);
                    }
                }
            }
        }
    }
    assert_eq!(weights, 21);
    eprintln!(
        "values differing from the producer's own dequantization: {differing} of {total}, at most {max_ulps} ulps"
    );
}

#[test]
fn writing_back_gives_the_producers_bytes() {
    for c in CASES {
        let raw = read_all(&format!("{}.safetensors", c.file));
        let f = interop::load_file(format!("{DIR}{}.safetensors", c.file)).unwrap();
        for (name, item) in &f.tensors {
            let LoadedItem::Quantized(imp) = item else {
                continue;
            };
            let ex = interop::export(c.layout, name, &imp.storage, &imp.extras).unwrap();
            for (n, t) in &ex.tensors {
                let want = &raw[n];
                assert_eq!(t.data.as_slice(), want.data.as_slice(), "{} {n}", c.file);
                if c.file == "ct_nvfp4_f4" && n.ends_with("_packed") {
                    // Written back as U8 [.., K/2], the form upstream writes.
                    assert_eq!(t.dtype, safetensors::Dtype::U8);
                } else {
                    assert_eq!(
                        (t.dtype, &t.shape),
                        (want.dtype, &want.shape),
                        "{} {n}",
                        c.file
                    );
                }
            }
            let names: Vec<&String> = ex.tensors.iter().map(|(n, _)| n).collect();
            let companions = raw
                .keys()
                .filter(|k| {
                    k.starts_with(name.trim_end_matches("weight")) && !k.ends_with("_extra_state")
                })
                .count();
            assert_eq!(names.len(), companions, "{} {name}: {names:?}", c.file);
        }
    }
}

#[test]
fn detection_notes_and_skips() {
    let f = interop::load_file(format!("{DIR}modelopt_fp8.safetensors")).unwrap();
    assert!(matches!(
        f.get("model.layers.0.self_attn.o_proj._extra_state"),
        Some(LoadedItem::Skipped(_))
    ));
    assert!(matches!(
        f.get("model.norm.weight"),
        Some(LoadedItem::Plain(_))
    ));
}

#[test]
fn reading_from_memory_equals_reading_the_file_and_truncation_is_refused() {
    for file in ["modelopt_nvfp4", "ct_fp8_block", "deepseek", "ct_nvfp4_f4"] {
        let path = format!("{DIR}{file}.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let a = interop::load_file(&path).unwrap();
        let b = interop::load_bytes(&bytes, file).unwrap();
        assert_eq!(a.layout, b.layout, "{file}");
        assert_eq!(a.tensors.len(), b.tensors.len(), "{file}");
        for ((na, ia), (nb, ib)) in a.tensors.iter().zip(&b.tensors) {
            assert_eq!(na, nb);
            if let (LoadedItem::Quantized(x), LoadedItem::Quantized(y)) = (ia, ib) {
                for (bx, by) in x.storage.buffers().iter().zip(y.storage.buffers()) {
                    assert_eq!(bx.bytes(), by.bytes(), "{file}: {na}");
                }
            }
        }
        // Every truncation of the file is refused with an error naming the input.
        for cut in [0, 7, 8, 100, bytes.len() / 2, bytes.len() - 1] {
            let e = interop::load_bytes(&bytes[..cut], file).unwrap_err();
            assert!(e.to_string().contains(file), "{file} cut at {cut}: {e}");
        }
    }
}
