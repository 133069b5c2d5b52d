//! Hostile native files: every length, shape, offset and count a file declares is checked
//! before anything is allocated for it, and every refusal is an error naming the problem,
//! never a panic, an abort or an allocation proportional to what the file *claims*.
//!
//! The files are built in code (raw safetensors bytes, or a valid file with its header or
//! `quantfmt` metadata rewritten). A counting global allocator measures the peak heap of
//! each load; every file here is under 1 MiB (except the one testing the metadata size
//! limit) and every load must stay under [`PEAK_LIMIT`]. Nothing names a format: valid
//! files come from walking the registry.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/heap.rs"]
mod heap;

use std::sync::Mutex;

use heap::measure;
use quantfmt::io::{Loaded, SaveItem, load_bytes, save, save_items};
use quantfmt::{HostTensor, Quantizer, Shape, Storage, Usage, registry};
use quantfmt_testkit::XorShift32;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------
// Peak-heap measurement ([`heap`]'s counting allocator).

/// The most heap a load of a file under 1 MiB may use at its peak.
const PEAK_LIMIT: usize = 32 << 20;

/// Serialises the tests of this binary so one test's allocations never count in another's.
static SERIAL: Mutex<()> = Mutex::new(());

/// Loads `bytes`, which must be refused with a message containing every one of `needles`,
/// within the heap limit. Returns the peak heap.
fn refused(what: &str, bytes: &[u8], needles: &[&str]) -> usize {
    assert!(
        bytes.len() < 1 << 20,
        "{what}: the test file should be < 1 MiB"
    );
    let (r, peak) = measure(|| load_bytes(bytes).map(|_| ()));
    let e = match r {
        Ok(()) => panic!("{what}: a hostile file was accepted"),
        Err(e) => e.to_string(),
    };
    for n in needles {
        assert!(e.contains(n), "{what}: error `{e}` does not mention `{n}`");
    }
    assert!(
        peak < PEAK_LIMIT,
        "{what}: peak heap {peak} bytes for a {}-byte file",
        bytes.len()
    );
    eprintln!(
        "{what}: refused, peak heap {} KiB ({} byte file): {e}",
        peak >> 10,
        bytes.len()
    );
    peak
}

// ---------------------------------------------------------------------------------------
// Building files.

/// `8-byte LE header length | header | data`.
fn raw(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

fn with_header(header: &Value, data: &[u8]) -> Vec<u8> {
    raw(serde_json::to_string(header).unwrap().as_bytes(), data)
}

/// Splits a file into its header JSON and data section.
fn split(bytes: &[u8]) -> (Value, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, bytes[8 + n..].to_vec())
}

/// Rewrites the `quantfmt` metadata of a file (data section unchanged).
fn with_meta(bytes: &[u8], f: impl FnOnce(&mut Value)) -> Vec<u8> {
    let (mut header, data) = split(bytes);
    let s = header["__metadata__"]["quantfmt"].as_str().unwrap();
    let mut meta: Value = serde_json::from_str(s).unwrap();
    f(&mut meta);
    header["__metadata__"]["quantfmt"] = Value::String(meta.to_string());
    with_header(&header, &data)
}

/// Deterministic weight-like data.
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut rng = XorShift32::new(seed.wrapping_mul(2_654_435_761).wrapping_add(1));
    (0..n)
        .map(|_| {
            let s = rng.next_u32();
            (s as f32 / u32::MAX as f32) - 0.5
        })
        .collect()
}

/// Every registered format with default options, both directions where it supports them.
fn quantizers() -> Vec<Box<dyn Quantizer>> {
    registry()
        .entries()
        .iter()
        .map(|e| {
            e.from_spec(&[], Usage::BOTH)
                .or_else(|_| e.from_spec(&[], Usage::ROWWISE))
                .unwrap()
        })
        .collect()
}

/// A shape every shipped format accepts.
const SHAPE: [usize; 2] = [128, 256];

/// A valid native file holding `w` quantized by `q`.
fn valid_file(q: &dyn Quantizer) -> (Vec<u8>, Box<dyn Storage>) {
    let v = data(SHAPE[0] * SHAPE[1], 1);
    let s = q.quantize(&HostTensor::f32(&v, &SHAPE).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    save(&path, &[("w", &s)]).unwrap();
    (std::fs::read(&path).unwrap(), s)
}

/// A valid file holding a grouped tensor of `shapes` quantized by `q`.
fn valid_grouped_file(q: &dyn Quantizer, shapes: &[[usize; 2]]) -> Vec<u8> {
    let vals: Vec<Vec<f32>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| data(s[0] * s[1], 10 + i as u32))
        .collect();
    let xs: Vec<HostTensor<'_>> = vals
        .iter()
        .zip(shapes)
        .map(|(v, s)| HostTensor::f32(v, s).unwrap())
        .collect();
    let g = q.quantize_grouped_list(&xs).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    save_items(
        &path,
        &[("experts".to_string(), SaveItem::Grouped(&*g))],
        &Default::default(),
    )
    .unwrap();
    std::fs::read(&path).unwrap()
}

// ---------------------------------------------------------------------------------------
// The container: header length, header JSON, offsets and sizes.

#[test]
fn truncated_and_impossible_header_lengths() {
    let _g = SERIAL.lock().unwrap();
    refused("empty file", &[], &["too short"]);
    refused("7 bytes", &[1, 2, 3, 4, 5, 6, 7], &["too short"]);
    let mut b = u64::MAX.to_le_bytes().to_vec();
    b.extend_from_slice(b"{}");
    refused("header length u64::MAX", &b, &["header length"]);
    let mut b = 1_000_000u64.to_le_bytes().to_vec();
    b.extend_from_slice(b"{}");
    refused("header longer than the file", &b, &["header length"]);
    let mut b = 200_000_000u64.to_le_bytes().to_vec();
    b.extend(std::iter::repeat_n(b' ', 1000));
    refused("header above the 100 MB limit", &b, &["header length"]);
}

#[test]
fn malformed_header_json() {
    let _g = SERIAL.lock().unwrap();
    refused(
        "not UTF-8",
        &raw(&[0xFF, 0xFE, b'{', b'}'], &[]),
        &["UTF-8"],
    );
    refused("not JSON", &raw(b"hello", &[]), &["JSON"]);
    refused("a JSON array", &raw(b"[1,2,3]", &[]), &["JSON"]);
    refused(
        "truncated JSON",
        &raw(br#"{"a": {"dtype": "U8""#, &[]),
        &["JSON"],
    );
    refused(
        "a tensor entry that is a number",
        &raw(br#"{"a": 5}"#, &[]),
        &["`a`", "malformed"],
    );
    refused(
        "an unknown dtype",
        &raw(
            br#"{"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}"#,
            &[0; 16],
        ),
        &["`a`", "malformed"],
    );
    refused(
        "an unknown field in a tensor entry",
        &raw(
            br#"{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}}"#,
            &[0],
        ),
        &["`a`", "malformed"],
    );
    refused(
        "negative offsets",
        &raw(
            br#"{"a": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}}"#,
            &[0],
        ),
        &["`a`"],
    );
    refused(
        "offsets beyond u64",
        &raw(
            br#"{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 99999999999999999999999]}}"#,
            &[0],
        ),
        &["`a`"],
    );
}

#[test]
fn deeply_nested_and_huge_json_is_refused_without_a_stack_overflow() {
    let _g = SERIAL.lock().unwrap();
    // 200 000 nested arrays in the header itself (a naive recursive parser overflows
    // the stack long before that).
    let depth = 200_000;
    let mut h = String::from(r#"{"a": "#);
    h.push_str(&"[".repeat(depth));
    h.push_str(&"]".repeat(depth));
    h.push('}');
    refused(
        "header nested 200k deep",
        &raw(h.as_bytes(), &[]),
        &["JSON"],
    );
    // The same depth inside `__metadata__` (must map strings to strings).
    let mut h = String::from(r#"{"__metadata__": {"x": "#);
    h.push_str(&"{\"y\": ".repeat(1000));
    h.push('1');
    h.push_str(&"}".repeat(1000));
    h.push_str("}}");
    refused("nested __metadata__", &raw(h.as_bytes(), &[]), &["JSON"]);
    // Valid outer JSON, nested `quantfmt` metadata (a JSON document inside a string).
    let (file, _) = valid_file(&*quantizers()[0]);
    let bad = with_meta(&file, |m| {
        let mut v = json!(1);
        for _ in 0..1_000 {
            v = json!([v]);
        }
        m["tensors"]["w"]["options"] = v;
    });
    refused(
        "quantfmt options nested 1000 deep",
        &bad,
        &["quantfmt", "malformed"],
    );
    // Hundreds of thousands of small values: bounded by the file size.
    let mut h = String::from(r#"{"__metadata__": {"#);
    for i in 0..40_000 {
        if i > 0 {
            h.push(',');
        }
        h.push_str(&format!(r#""k{i}": "v""#));
    }
    h.push_str("}, \"a\": 1}");
    refused(
        "40k metadata keys then junk",
        &raw(h.as_bytes(), &[]),
        &["`a`"],
    );
}

#[test]
fn absurd_shapes_and_sizes_never_allocate() {
    let _g = SERIAL.lock().unwrap();
    // A 10^12-element tensor backed by 16 bytes.
    let h = json!({"a": {"dtype": "U8", "shape": [1_000_000, 1_000_000], "data_offsets": [0, 1_000_000_000_000u64]}});
    refused(
        "10^12 elements",
        &with_header(&h, &[0; 16]),
        &["`a`", "run past"],
    );
    // Same claim but consistent offsets are impossible too: the data is not there.
    let h = json!({"a": {"dtype": "F32", "shape": [1 << 20, 1 << 20], "data_offsets": [0, 16]}});
    refused(
        "shape vs offsets",
        &with_header(&h, &[0; 16]),
        &["`a`", "needs"],
    );
    // A shape whose element count overflows u64.
    let h =
        json!({"a": {"dtype": "F32", "shape": [1u64 << 40, 1u64 << 40], "data_offsets": [0, 0]}});
    refused(
        "shape overflow",
        &with_header(&h, &[]),
        &["`a`", "overflows"],
    );
    // Byte size overflow with a non-overflowing element count.
    let h = json!({"a": {"dtype": "F64", "shape": [1u64 << 62], "data_offsets": [0, 0]}});
    refused(
        "byte size overflow",
        &with_header(&h, &[]),
        &["`a`", "overflows"],
    );
    // Rank far above anything real.
    let h = json!({"a": {"dtype": "U8", "shape": vec![1; 100], "data_offsets": [0, 1]}});
    refused("rank 100", &with_header(&h, &[0]), &["`a`", "rank"]);
    // FP4-style sub-byte dtypes that do not fill whole bytes.
    let h = json!({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}});
    refused(
        "odd F4 count",
        &with_header(&h, &[0; 2]),
        &["`a`", "whole bytes"],
    );
}

#[test]
fn overlapping_out_of_range_and_gapped_offsets() {
    let _g = SERIAL.lock().unwrap();
    let e = |a: [u64; 2], b: [u64; 2]| {
        json!({
            "a": {"dtype": "U8", "shape": [a[1] - a[0]], "data_offsets": a},
            "b": {"dtype": "U8", "shape": [b[1].saturating_sub(b[0])], "data_offsets": b},
        })
    };
    refused(
        "overlap",
        &with_header(&e([0, 8], [4, 12]), &[0; 12]),
        &["overlaps"],
    );
    refused(
        "aliasing",
        &with_header(&e([0, 8], [0, 8]), &[0; 8]),
        &["overlaps"],
    );
    refused(
        "gap",
        &with_header(&e([0, 4], [8, 12]), &[0; 12]),
        &["gaps"],
    );
    refused(
        "trailing bytes",
        &with_header(&e([0, 4], [4, 8]), &[0; 12]),
        &["cover 8"],
    );
    refused(
        "past the end",
        &with_header(&e([0, 4], [4, 64]), &[0; 8]),
        &["run past"],
    );
    let h = json!({"a": {"dtype": "U8", "shape": [0], "data_offsets": [8, 4]}});
    refused(
        "end before begin",
        &with_header(&h, &[0; 8]),
        &["`a`", "offsets"],
    );
    let h = json!({"a": {"dtype": "U8", "shape": [1], "data_offsets": [u64::MAX, u64::MAX]}});
    refused("offsets at u64::MAX", &with_header(&h, &[0; 8]), &["`a`"]);
}

#[test]
fn truncated_and_bit_flipped_valid_files_never_panic() {
    let _g = SERIAL.lock().unwrap();
    for q in quantizers() {
        let (file, _) = valid_file(&*q);
        // Every truncation point in the header region, then a stride through the data.
        let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
        let cuts = (0..(8 + n + 64).min(file.len())).chain((8 + n..file.len()).step_by(97));
        for cut in cuts {
            let (r, peak) = measure(|| load_bytes(&file[..cut]).map(|_| ()));
            assert!(r.is_err(), "{}: truncated at {cut} accepted", q.spec());
            assert!(peak < PEAK_LIMIT, "{}: cut {cut}: peak {peak}", q.spec());
        }
        // Single-byte corruptions: header bytes and data bytes. Must not panic; a load
        // that succeeds (a changed data byte is still a valid code) must dequantize.
        let mut rng = XorShift32::new(0x1234_5678);
        for i in 0..600 {
            let s = rng.next_u32();
            let pos = if i % 2 == 0 {
                8 + (s as usize % n)
            } else {
                s as usize % file.len()
            };
            let mut bad = file.clone();
            bad[pos] ^= 1 << (s >> 29);
            let (r, peak) = measure(|| load_bytes(&bad));
            assert!(
                peak < PEAK_LIMIT,
                "{}: flip at {pos}: peak {peak}",
                q.spec()
            );
            if let Ok(f) = r {
                for (_, t) in &f.tensors {
                    if let Loaded::Quantized(t) = t {
                        let _ = t.dequantize_f32();
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The `quantfmt` metadata: formats, options, shapes, buffers.

#[test]
fn metadata_that_is_malformed_or_from_another_version() {
    let _g = SERIAL.lock().unwrap();
    let (file, _) = valid_file(&*quantizers()[0]);
    let (mut header, data) = split(&file);
    header["__metadata__"]["quantfmt"] = json!("{not json");
    refused(
        "quantfmt not JSON",
        &with_header(&header, &data),
        &["malformed"],
    );
    header["__metadata__"]["quantfmt"] = json!("[1, 2]");
    refused(
        "quantfmt an array",
        &with_header(&header, &data),
        &["malformed"],
    );
    refused(
        "version 99",
        &with_meta(&file, |m| m["version"] = json!(99)),
        &["version 99"],
    );
    refused(
        "unknown top-level field",
        &with_meta(&file, |m| m["extra"] = json!(1)),
        &["malformed", "extra"],
    );
    refused(
        "unknown tensor field",
        &with_meta(&file, |m| m["tensors"]["w"]["zzz"] = json!(1)),
        &["malformed", "zzz"],
    );
    refused(
        "integer dtype",
        &with_meta(&file, |m| m["tensors"]["w"]["dtype"] = json!("u8")),
        &["dtype"],
    );
    refused(
        "unknown dtype",
        &with_meta(&file, |m| m["tensors"]["w"]["dtype"] = json!("f64")),
        &["malformed"],
    );
}

#[test]
fn unknown_formats_and_options_are_refused_for_every_format() {
    let _g = SERIAL.lock().unwrap();
    for q in quantizers() {
        let (file, _) = valid_file(&*q);
        let spec = q.spec();
        refused(
            &format!("{spec}: unknown format"),
            &with_meta(&file, |m| m["tensors"]["w"]["format"] = json!("fp3")),
            &["unknown format `fp3`"],
        );
        refused(
            &format!("{spec}: unknown option"),
            &with_meta(&file, |m| m["tensors"]["w"]["options"]["bogus"] = json!(1)),
            &["bogus"],
        );
        refused(
            &format!("{spec}: options not an object"),
            &with_meta(&file, |m| m["tensors"]["w"]["options"] = json!("x")),
            &["options"],
        );
        // Each option field set to values of the wrong kind, or to extremes.
        let opts = q.options().unwrap();
        for key in opts.as_object().unwrap().keys() {
            for v in [
                json!(null),
                json!(-1),
                json!(1e308),
                json!("nan"),
                json!([]),
                json!({"rowwise": false, "columnwise": false}),
                json!(u64::MAX),
            ] {
                let bad = with_meta(&file, |m| m["tensors"]["w"]["options"][key] = v.clone());
                let (r, peak) = measure(|| load_bytes(&bad).map(|_| ()));
                assert!(peak < PEAK_LIMIT);
                // Some values are valid options (e.g. another seed); the rest must be
                // refused with an error, never a panic.
                if let Err(e) = r {
                    assert!(!e.to_string().is_empty());
                }
            }
        }
        // A usage with neither direction holds nothing and is refused.
        refused(
            &format!("{spec}: empty usage"),
            &with_meta(&file, |m| {
                m["tensors"]["w"]["options"]["usage"] =
                    json!({"rowwise": false, "columnwise": false})
            }),
            &["usage"],
        );
    }
}

#[test]
fn shapes_in_metadata_that_the_data_cannot_back() {
    let _g = SERIAL.lock().unwrap();
    for q in quantizers() {
        let (file, _) = valid_file(&*q);
        let spec = q.spec();
        for (what, shape) in [
            ("10^12 elements", json!([1_000_000, 1_000_000])),
            ("2^40 x 2^40", json!([1u64 << 40, 1u64 << 40])),
            ("zero next to a huge dim", json!([0, u64::MAX])),
            ("u64::MAX", json!([u64::MAX])),
            ("rank 9", json!([1, 1, 1, 1, 1, 1, 1, 128, 256])),
            ("rank 0", json!([])),
            ("empty", json!([0, 256])),
            ("other valid shape", json!([256, 128])),
        ] {
            let bad = with_meta(&file, |m| m["tensors"]["w"]["shape"] = shape.clone());
            refused(&format!("{spec}: {what}"), &bad, &["`w`"]);
        }
    }
}

#[test]
fn buffers_of_the_wrong_dtype_shape_or_name() {
    let _g = SERIAL.lock().unwrap();
    for q in quantizers() {
        let (file, s) = valid_file(&*q);
        let spec = q.spec();
        let names: Vec<String> = s.buffers().iter().map(|b| b.name().to_string()).collect();
        refused(
            &format!("{spec}: a buffer missing from the list"),
            &with_meta(&file, |m| {
                m["tensors"]["w"]["buffers"] = json!(names[1..]);
            }),
            &["listed buffers differ"],
        );
        refused(
            &format!("{spec}: a buffer listed twice"),
            &with_meta(&file, |m| {
                let mut v = names.clone();
                v.push(names[0].clone());
                m["tensors"]["w"]["buffers"] = json!(v);
            }),
            &["listed buffers differ"],
        );
        refused(
            &format!("{spec}: an unknown buffer listed"),
            &with_meta(&file, |m| {
                let mut v = names.clone();
                v.push("bogus".into());
                m["tensors"]["w"]["buffers"] = json!(v);
            }),
            &["listed buffers differ"],
        );
        for b in s.buffers() {
            let full = format!("w.{}", b.name());
            let (header, data) = split(&file);
            // Wrong dtype with the same byte count (U8 <-> I32/F32 where sizes allow).
            let other = if b.dtype().size() == 1 {
                ("I8", b.shape().to_vec())
            } else {
                let mut sh = b.shape().to_vec();
                *sh.last_mut().unwrap() *= b.dtype().size();
                ("U8", sh)
            };
            let mut h = header.clone();
            h[&full]["dtype"] = json!(other.0);
            h[&full]["shape"] = json!(other.1);
            refused(
                &format!("{spec}: {full} with dtype {}", other.0),
                &with_header(&h, &data),
                &[b.name(), "dtype"],
            );
            // Same bytes, flattened shape.
            if b.shape().len() > 1 {
                let mut h = header.clone();
                let n: usize = b.shape().iter().product();
                h[&full]["shape"] = json!([n]);
                refused(
                    &format!("{spec}: {full} flattened"),
                    &with_header(&h, &data),
                    &[b.name(), "shape"],
                );
            }
            // The buffer renamed away: missing from the file (and left as a plain tensor).
            let mut h = header.clone();
            let entry = h.as_object_mut().unwrap().remove(&full).unwrap();
            h["renamed"] = entry;
            refused(
                &format!("{spec}: {full} missing"),
                &with_header(&h, &data),
                &[b.name(), "missing"],
            );
        }
    }
}

#[test]
fn ambiguous_names_are_refused() {
    let _g = SERIAL.lock().unwrap();
    let (file, _) = valid_file(&*quantizers()[0]);
    let (mut header, mut data) = split(&file);
    // A plain tensor named like the quantized tensor's logical name.
    let n = data.len() as u64;
    header["w"] = json!({"dtype": "U8", "shape": [4], "data_offsets": [n, n + 4]});
    data.extend_from_slice(&[0; 4]);
    refused(
        "plain tensor shadows a quantized one",
        &with_header(&header, &data),
        &["`w`", "both"],
    );
}

#[test]
fn corrupt_buffer_contents_are_refused_or_harmless() {
    let _g = SERIAL.lock().unwrap();
    // Fill each buffer in turn with every byte pattern a scale can hold badly (NaN for
    // f32, 0xFF for E4M3/E8M0 codes, zero, the sign bit): the load either refuses with an
    // error naming the buffer or gives a tensor that dequantizes without panicking.
    for q in quantizers() {
        let (file, s) = valid_file(&*q);
        let (header, data) = split(&file);
        for b in s.buffers() {
            let full = format!("w.{}", b.name());
            let off = header[&full]["data_offsets"].as_array().unwrap();
            let (lo, hi) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            for fill in [0x00u8, 0xFF, 0x80, 0x7F, 0x7E] {
                let mut d = data.clone();
                d[lo..hi].fill(fill);
                let bad = with_header(&header, &d);
                let (r, peak) = measure(|| load_bytes(&bad));
                assert!(peak < PEAK_LIMIT);
                match r {
                    Err(e) => {
                        let e = e.to_string();
                        assert!(e.contains("`w`"), "{}: {e}", q.spec());
                    }
                    Ok(f) => {
                        let Some(Loaded::Quantized(t)) = f.get("w") else {
                            panic!("{}: w not loaded", q.spec());
                        };
                        for dir in [
                            quantfmt::Direction::Rowwise,
                            quantfmt::Direction::Columnwise,
                        ] {
                            if t.usage().has(dir) {
                                t.dequantize(dir, quantfmt::DType::F32).unwrap();
                            }
                        }
                    }
                }
            }
        }
        // A NaN in the first f32 buffer is refused by every format that stores scales
        // or amaxes as f32 (a NaN scale would poison every value it scales).
        if let Some(b) = s
            .buffers()
            .iter()
            .find(|b| b.dtype() == quantfmt::DType::F32)
        {
            let full = format!("w.{}", b.name());
            let lo = header[&full]["data_offsets"][0].as_u64().unwrap() as usize;
            let mut d = data.clone();
            d[lo..lo + 4].copy_from_slice(&f32::NAN.to_le_bytes());
            refused(
                &format!("{}: NaN in {full}", q.spec()),
                &with_header(&header, &d),
                &[b.name(), "NaN"],
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Grouped tensors.

fn grouped_meta(m: &mut Value) -> &mut Value {
    &mut m["tensors"]["experts"]["grouped"]
}

#[test]
fn grouped_offsets_that_do_not_add_up() {
    let _g = SERIAL.lock().unwrap();
    for q in quantizers() {
        let spec = q.spec();
        let file = valid_grouped_file(&*q, &[[256, 256], [128, 256]]);
        assert!(load_bytes(&file).is_ok(), "{spec}: the valid file loads");
        refused(
            &format!("{spec}: element offsets off by one"),
            &with_meta(&file, |m| {
                grouped_meta(m)["element_offsets"][1] = json!(65535);
            }),
            &["element_offsets"],
        );
        refused(
            &format!("{spec}: element offsets missing an entry"),
            &with_meta(&file, |m| {
                grouped_meta(m)["element_offsets"] = json!([0, 65536]);
            }),
            &["element_offsets"],
        );
        refused(
            &format!("{spec}: element offsets huge"),
            &with_meta(&file, |m| {
                grouped_meta(m)["element_offsets"] = json!([0, u64::MAX, u64::MAX]);
            }),
            &["element_offsets"],
        );
        let first = {
            let (h, _) = split(&file);
            let meta: Value =
                serde_json::from_str(h["__metadata__"]["quantfmt"].as_str().unwrap()).unwrap();
            meta["tensors"]["experts"]["grouped"]["byte_offsets"]
                .as_object()
                .unwrap()
                .keys()
                .next()
                .unwrap()
                .clone()
        };
        refused(
            &format!("{spec}: byte offsets shifted"),
            &with_meta(&file, |m| {
                let v = &mut grouped_meta(m)["byte_offsets"][&first][1];
                *v = json!(v.as_u64().unwrap() + 1);
            }),
            &[&first, "offsets"],
        );
        refused(
            &format!("{spec}: byte offsets of the wrong length"),
            &with_meta(&file, |m| {
                grouped_meta(m)["byte_offsets"][&first] = json!([0]);
            }),
            &[&first, "offsets"],
        );
        refused(
            &format!("{spec}: byte offsets for an unknown buffer"),
            &with_meta(&file, |m| {
                grouped_meta(m)["byte_offsets"]["bogus"] = json!([0, 0, 0]);
            }),
            &["byte_offsets"],
        );
        refused(
            &format!("{spec}: byte offsets of a buffer missing"),
            &with_meta(&file, |m| {
                grouped_meta(m)["byte_offsets"]
                    .as_object_mut()
                    .unwrap()
                    .remove(&first);
            }),
            &["byte_offsets"],
        );
        refused(
            &format!("{spec}: no members"),
            &with_meta(&file, |m| {
                grouped_meta(m)["member_shapes"] = json!([]);
            }),
            &["members"],
        );
        refused(
            &format!("{spec}: member shapes swapped"),
            &with_meta(&file, |m| {
                grouped_meta(m)["member_shapes"] = json!([[128, 256], [256, 256]]);
            }),
            &["`experts`"],
        );
        refused(
            &format!("{spec}: a member of 10^12 elements"),
            &with_meta(&file, |m| {
                grouped_meta(m)["member_shapes"] = json!([[1_000_000, 1_000_000], [128, 256]]);
            }),
            &["`experts`"],
        );
        refused(
            &format!("{spec}: kind does not match the shapes"),
            &with_meta(&file, |m| {
                grouped_meta(m)["kind"] = json!("uniform");
            }),
            &["grouped shape"],
        );
        refused(
            &format!("{spec}: logical shape does not match"),
            &with_meta(&file, |m| {
                m["tensors"]["experts"]["shape"] = json!([384, 512]);
            }),
            &["grouped shape"],
        );
        refused(
            &format!("{spec}: grouped metadata on a plain list"),
            &with_meta(&file, |m| {
                grouped_meta(m)["kind"] = json!("sideways");
            }),
            &["malformed"],
        );
    }
}

#[test]
fn a_member_count_bomb_stays_bounded() {
    let _g = SERIAL.lock().unwrap();
    let n = quantfmt::io::MAX_GROUP_MEMBERS;
    // Every format and usage: the most members a file may declare, each claiming a real
    // shape, with offsets for only two. Refused by the offset counts before the
    // per-member layout is built.
    for e in registry().entries() {
        for usage in [Usage::ROWWISE, Usage::BOTH] {
            let Ok(q) = e.from_spec(&[], usage) else {
                continue;
            };
            let file = valid_grouped_file(&*q, &[[128, 256], [128, 256]]);
            let spec = format!("{} ({usage})", q.spec());
            let bad = with_meta(&file, |m| {
                grouped_meta(m)["member_shapes"] = json!(vec![[128, 256]; n]);
                grouped_meta(m)["kind"] = json!("uniform");
                m["tensors"]["experts"]["shape"] = json!([128 * n, 256]);
            });
            refused(
                &format!("{spec}: {n} members, offsets for 2"),
                &bad,
                &["element_offsets"],
            );
            // Consistent counts everywhere (offsets for every member, all zero): the
            // layout is built, then the offsets or the buffers are refused.
            let bad = with_meta(&file, |m| {
                grouped_meta(m)["member_shapes"] = json!(vec![[0, 256]; n]);
                grouped_meta(m)["kind"] = json!("uniform");
                grouped_meta(m)["element_offsets"] = json!(vec![0; n + 1]);
                let keys: Vec<String> = grouped_meta(m)["byte_offsets"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .cloned()
                    .collect();
                for k in keys {
                    grouped_meta(m)["byte_offsets"][&k] = json!(vec![0; n + 1]);
                }
                m["tensors"]["experts"]["shape"] = json!([0, 256]);
            });
            refused(&format!("{spec}: {n} empty members"), &bad, &["`experts`"]);
            // One more member than the limit is refused before anything else.
            let bad = with_meta(&file, |m| {
                grouped_meta(m)["member_shapes"] = json!(vec![[0, 256]; n + 1]);
            });
            refused(
                &format!("{spec}: {} members", n + 1),
                &bad,
                &[&format!("between 1 and {n}")],
            );
        }
    }
}

#[test]
fn saving_more_members_than_a_file_may_hold_is_refused() {
    let _g = SERIAL.lock().unwrap();
    let q = registry().entries()[0]
        .from_spec(&[], Usage::ROWWISE)
        .unwrap();
    let n = quantfmt::io::MAX_GROUP_MEMBERS + 1;
    let shapes = vec![Shape::new(&[0, 16]).unwrap(); n];
    let Ok(g) = q.quantize_grouped(&HostTensor::f32(&[], &[0]).unwrap(), &shapes) else {
        // A format that refuses empty members cannot build such a group at all.
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let e = save_items(
        dir.path().join("g.safetensors"),
        &[("g".to_string(), SaveItem::Grouped(&*g))],
        &Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("at most"), "{e}");
}

#[test]
fn metadata_above_its_size_limit_is_refused() {
    let _g = SERIAL.lock().unwrap();
    let (file, _) = valid_file(&*quantizers()[0]);
    let bad = with_meta(&file, |m| {
        m["padding"] = json!("x".repeat(quantfmt::io::MAX_METADATA_BYTES));
    });
    let (r, peak) = measure(|| load_bytes(&bad).map(|_| ()));
    let e = r.unwrap_err().to_string();
    assert!(e.contains("limit"), "{e}");
    // Bounded by a small multiple of the file (the header is parsed once, then refused).
    assert!(peak < 4 * bad.len(), "peak {peak} for {} bytes", bad.len());
}

#[test]
fn valid_files_load_within_a_small_multiple_of_their_size() {
    let _g = SERIAL.lock().unwrap();
    for q in quantizers() {
        let (file, s) = valid_file(&*q);
        let (r, peak) = measure(|| load_bytes(&file));
        let f = r.unwrap();
        let Some(Loaded::Quantized(t)) = f.get("w") else {
            panic!("{}: w not loaded", q.spec());
        };
        assert_eq!(t.shape(), &Shape::new(&SHAPE).unwrap());
        assert_eq!(t.nbytes(), s.nbytes());
        eprintln!(
            "{}: valid {}-byte file, peak heap {} KiB",
            q.spec(),
            file.len(),
            peak >> 10
        );
        assert!(
            peak < 4 * file.len() + (1 << 20),
            "{}: peak {peak}",
            q.spec()
        );
    }
}
