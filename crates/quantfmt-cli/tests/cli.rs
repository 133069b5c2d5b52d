//! End-to-end tests of the `quantfmt` binary.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::process::{Command, Output};

use quant_core::io::{RawTensor, SaveItem, save_items};
use safetensors::Dtype;

fn quantfmt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quantfmt"))
        .args(args)
        .output()
        .expect("run quantfmt")
}

fn ok(args: &[&str]) -> String {
    let o = quantfmt(args);
    assert!(
        o.status.success(),
        "quantfmt {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let o = quantfmt(args);
    assert!(!o.status.success(), "quantfmt {args:?} should fail");
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(err.starts_with("error: "), "{err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one-line error expected: {err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    err
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn compare_runs_on_the_embedded_default() {
    let out = ok(&["compare", "--formats", "fp8,fp8-block:1x128"]);
    assert!(out.contains("embedded synthetic"), "{out}");
    assert!(
        out.contains("SQNR dB") && out.contains("fp8-block:1x128"),
        "{out}"
    );
    assert!(out.contains("summary"), "{out}");
}

#[test]
fn quantize_inspect_dequantize_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.safetensors");
    let q = dir.path().join("model.q.safetensors");
    let d = dir.path().join("model.deq.safetensors");
    ok(&["example", "-o", p(&model)]);

    let out = ok(&[
        "quantize",
        p(&model),
        "-o",
        p(&q),
        "--format",
        "fp8-block:1x128",
        "--usage",
        "both",
    ]);
    assert!(out.contains("quantized"), "{out}");
    assert!(
        out.contains("copied") && out.contains("rank 1"),
        "norm vector is copied with its reason: {out}"
    );

    let out = ok(&["inspect", p(&q)]);
    assert!(
        out.contains("fp8-block:1x128") && out.contains("rowwise_scale_inv"),
        "{out}"
    );
    assert!(
        out.contains("bits/value") && !out.contains("MISSING"),
        "{out}"
    );
    assert!(
        out.contains("input_layernorm"),
        "plain tensors listed: {out}"
    );

    let out = ok(&["dequantize", p(&q), "-o", p(&d), "--dtype", "f32"]);
    assert!(out.contains("dequantized"), "{out}");
    let out = ok(&["inspect", p(&d)]);
    assert!(
        out.contains("F32") && !out.contains("quantized tensors"),
        "{out}"
    );

    // Quantizing an already quantized file keeps its quantized tensors.
    let q2 = dir.path().join("again.safetensors");
    let out = ok(&["quantize", p(&q), "-o", p(&q2), "--format", "fp8"]);
    assert!(out.contains("already quantized"), "{out}");
}

#[test]
fn grouped_quantize_stores_experts_in_one_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.safetensors");
    let q = dir.path().join("g.safetensors");
    let d = dir.path().join("d.safetensors");
    ok(&["example", "-o", p(&model)]);
    let out = ok(&[
        "quantize",
        p(&model),
        "-o",
        p(&q),
        "--format",
        "fp8",
        "--grouped",
    ]);
    assert!(out.contains("grouped x4"), "{out}");
    let out = ok(&["inspect", p(&q)]);
    assert!(out.contains("grouped: 4 members (Uniform)"), "{out}");
    assert!(
        out.contains("scale_inv") && out.contains("[4]"),
        "one fp8 scale per expert: {out}"
    );
    let out = ok(&["dequantize", p(&q), "-o", p(&d)]);
    assert!(
        out.contains("grouped x4") && out.contains("[4, 1024, 512]"),
        "{out}"
    );
}

#[test]
fn glu_interleave_and_back_on_quantized_weights() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.safetensors");
    let q = dir.path().join("q.safetensors");
    let i = dir.path().join("i.safetensors");
    let b = dir.path().join("b.safetensors");
    ok(&["example", "-o", p(&model)]);
    ok(&[
        "quantize",
        p(&model),
        "-o",
        p(&q),
        "--format",
        "fp8-block:1x128",
    ]);
    let out = ok(&[
        "glu",
        p(&q),
        "-o",
        p(&i),
        "--interleave",
        "64",
        "--pattern",
        "*gate_proj*",
    ]);
    assert!(out.contains("interleaved k=64"), "{out}");
    ok(&[
        "glu",
        p(&i),
        "-o",
        p(&b),
        "--deinterleave",
        "64",
        "--pattern",
        "*gate_proj*",
    ]);
    assert_eq!(
        std::fs::read(&q).unwrap(),
        std::fs::read(&b).unwrap(),
        "round trip is byte-exact"
    );
    let err = fails(&[
        "glu",
        p(&q),
        "-o",
        p(&i),
        "--interleave",
        "1000",
        "--pattern",
        "*gate_proj*",
    ]);
    assert!(err.contains("2816") && err.contains("2000"), "{err}");
    let err = fails(&[
        "glu",
        p(&q),
        "-o",
        p(&i),
        "--interleave",
        "8",
        "--pattern",
        "nothing*",
    ]);
    assert!(err.contains("matched no tensor"), "{err}");
}

#[test]
fn strict_refuses_files_with_unquantizable_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.safetensors");
    ok(&["example", "-o", p(&model)]);
    let out = dir.path().join("o.safetensors");
    let err = fails(&[
        "quantize",
        p(&model),
        "-o",
        p(&out),
        "--format",
        "fp8",
        "--strict",
    ]);
    assert!(err.contains("--strict"), "{err}");
    assert!(!out.exists());
}

#[test]
fn bad_specs_and_files_give_one_line_errors() {
    let err = fails(&["compare", "--formats", "fp9"]);
    assert!(
        err.contains("unknown format `fp9`") && err.contains("fp8-block"),
        "{err}"
    );
    let err = fails(&["compare", "--formats", "fp8:e3m4"]);
    assert!(err.contains("valid options"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.safetensors");
    std::fs::write(&junk, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a header").unwrap();
    let err = fails(&["inspect", p(&junk)]);
    assert!(err.contains("header length"), "{err}");
    let err = fails(&["inspect", p(&dir.path().join("missing.safetensors"))]);
    assert!(err.contains("missing.safetensors"), "{err}");
}

#[test]
fn formats_lists_options() {
    let out = ok(&["formats"]);
    assert!(
        out.contains("fp8-block") && out.contains("1x128") && out.contains("eps=X"),
        "{out}"
    );
}

/// `bench --json`: one object per line for each format and op, with the fields issue 8
/// names, a roofline measured in the same run and finite positive rates.
#[test]
fn bench_json_reports_every_format_and_op() {
    let out = ok(&[
        "bench", "-f", "fp8", "-f", "nvfp4", "--shape", "64x128", "--runs", "3", "--dtype", "f32",
        "--json",
    ]);
    let records: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let want = [
        ("fp8", "quantize"),
        ("fp8", "dequantize"),
        ("nvfp4", "quantize"),
        ("nvfp4", "dequantize"),
    ];
    assert_eq!(records.len(), want.len(), "{out}");
    for (r, (format, op)) in records.iter().zip(want) {
        assert_eq!(r["format"], format);
        assert_eq!(r["op"], op);
        assert_eq!(r["dtype"], "f32");
        assert_eq!(r["shape"], serde_json::json!([64, 128]));
        assert!(r["threads"].as_u64().unwrap() >= 1);
        for field in ["gbps", "roofline_gbps", "ratio", "seconds"] {
            let v = r[field].as_f64().unwrap();
            assert!(v.is_finite() && v > 0.0, "{format} {op} {field} = {v}");
        }
    }
    let err = fails(&["bench", "-f", "fp8", "--runs", "0"]);
    assert!(err.contains("--runs"), "{err}");
    let o = quantfmt(&["bench", "-f", "fp8", "--shape", "0x64"]);
    assert!(!o.status.success() && o.stdout.is_empty(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--shape"));
}

#[test]
fn convert_reports_quantized_tensors_it_cannot_read() {
    // A compressed-tensors W4A16 (pack-quantized int4) weight: no layout quantfmt reads.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("w4a16.safetensors");
    let config = r#"{"quant_method":"compressed-tensors","format":"pack-quantized"}"#;
    let raw = |dtype, shape: &[usize], bytes: &[u8]| RawTensor {
        dtype,
        shape: shape.to_vec(),
        data: quant_core::HostBytes::copy_from(bytes),
    };
    let tensors = [
        ("l.weight_packed", raw(Dtype::I32, &[16, 4], &[0x11; 256])),
        ("l.weight_scale", raw(Dtype::BF16, &[16, 1], &[0x3F; 32])),
        (
            "l.weight_shape",
            raw(
                Dtype::I32,
                &[2],
                &[16i32, 32].map(i32::to_le_bytes).concat(),
            ),
        ),
        ("norm.weight", raw(Dtype::BF16, &[32], &[0x3F; 64])),
    ];
    let items: Vec<_> = tensors
        .iter()
        .map(|(n, t)| (n.to_string(), SaveItem::Plain(t)))
        .collect();
    let metadata = [("quantization_config".to_string(), config.to_string())].into();
    save_items(&src, &items, &metadata).unwrap();
    let out = dir.path().join("native.safetensors");
    let json = ok(&[
        "convert",
        p(&src),
        "-o",
        p(&out),
        "--to",
        "native",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    for t in v["tensors"].as_array().unwrap() {
        let notes = t["notes"].to_string();
        let flagged = notes.contains("copied unchanged, not converted");
        assert_eq!(t["action"], "copied", "{t}");
        assert_eq!(flagged, t["name"] != "norm.weight", "{t}");
    }
    let notes = v["notes"].to_string();
    assert!(notes.contains("3 tensor(s) look quantized"), "{notes}");
    // Quantizing the file leaves them alone too: the bf16 scale is not a weight.
    let json = ok(&[
        "quantize",
        p(&src),
        "-o",
        p(&out),
        "--format",
        "fp8",
        "--all",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    for t in v["tensors"].as_array().unwrap() {
        assert_eq!(t["action"], "copied", "{t}");
        if t["name"] == "l.weight_scale" {
            assert!(t["notes"].to_string().contains("not converted"), "{t}");
        }
    }
}
