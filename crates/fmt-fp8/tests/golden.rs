//! Golden tests: `Fp8Quantizer` (per-tensor current scaling) and `Fp8BlockQuantizer`
//! (1x128 / 128x128) byte for byte against `tests/golden/fp8.py`, an independent numpy +
//! ml_dtypes model of TransformerEngine's kernels.
//!
//! For every case: every quantized buffer (data, scales with their zero padding) must
//! equal the reference bytes; each stored direction's dequantization to f32, bf16 and f16
//! must have the CRC32 of the reference `decode(q) * scale_inv` then cast; the reference
//! buffers must load back through `from_buffers` (validation included) and dequantize to
//! the same bytes; and where a direction can be derived from the other (per-tensor,
//! 128x128), deriving it from the reference rowwise buffers must give the reference
//! columnwise buffers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fmt_fp8::{BlockScaling, Fp8BlockQuantizer, Fp8Dtype, Fp8Quantizer};
use quant_core::{
    Buffer, BufferDesc, DType, Direction, Format, HostTensor, QuantizedTensor, Shape, Usage,
};
use safetensors::SafeTensors;
use serde_json::Value;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden/data/");

struct Golden {
    bytes: Vec<u8>,
    cases: Vec<Value>,
}

impl Golden {
    fn load(name: &str) -> Golden {
        let path = format!("{DATA}{name}");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!("{path}: {e} (regenerate with `python3 tests/golden/fp8.py`)")
        });
        let (_, m) = SafeTensors::read_metadata(&bytes).unwrap();
        let meta: Value = serde_json::from_str(&m.metadata().as_ref().unwrap()["json"]).unwrap();
        let cases = meta["cases"].as_array().unwrap().clone();
        Golden { bytes, cases }
    }

    fn tensor(&self, key: &str) -> (safetensors::Dtype, Vec<usize>, Vec<u8>) {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(key).unwrap_or_else(|_| panic!("no tensor {key}"));
        (t.dtype(), t.shape().to_vec(), t.data().to_vec())
    }
}

fn dtype(s: &str) -> DType {
    match s {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        other => panic!("dtype {other}"),
    }
}

fn usage(s: &str) -> Usage {
    match s {
        "rowwise" => Usage::ROWWISE,
        "columnwise" => Usage::COLUMNWISE,
        "both" => Usage::BOTH,
        other => panic!("usage {other}"),
    }
}

fn fp8(s: &str) -> Fp8Dtype {
    match s {
        "e4m3" => Fp8Dtype::E4M3,
        "e5m2" => Fp8Dtype::E5M2,
        other => panic!("fp8 {other}"),
    }
}

fn shape_of(c: &Value) -> Vec<usize> {
    c["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect()
}

fn eps_of(c: &Value) -> f32 {
    f32::from_bits(c["eps_bits"].as_u64().unwrap() as u32)
}

fn describe(i: usize, c: &Value) -> String {
    format!("case{i} {c}")
}

fn dirs(u: Usage) -> Vec<(Direction, &'static str)> {
    let mut v = Vec::new();
    if u.rowwise {
        v.push((Direction::Rowwise, "rowwise"));
    }
    if u.columnwise {
        v.push((Direction::Columnwise, "columnwise"));
    }
    v
}

/// The reference dequantization re-derived here from the golden buffers (only to locate
/// the first differing element when a CRC32 mismatches).
fn first_dequant_difference(got: &[u8], want_elems: &[u8], width: usize) -> String {
    match got
        .chunks(width)
        .zip(want_elems.chunks(width))
        .position(|(a, b)| a != b)
    {
        Some(i) => format!(
            "first difference at element {i}: library {:02x?}, re-derived reference {:02x?}",
            &got[i * width..(i + 1) * width],
            &want_elems[i * width..(i + 1) * width]
        ),
        None => "the library agrees with the re-derived reference (suspect the CRC)".into(),
    }
}

/// `decode(q) * scale_inv` in f32 then cast, per logical element, from golden buffers.
fn rederive_dequant<F: Format>(
    t: &QuantizedTensor<F>,
    per_elem_scale: &dyn Fn(usize, usize) -> f32,
    table: &[f32; 256],
    dir: Direction,
    out: DType,
) -> Vec<u8> {
    let (m, k) = t.shape().as_2d();
    let q = match dir {
        Direction::Rowwise => t.buffer("rowwise_data").unwrap().bytes(),
        Direction::Columnwise => t.buffer("columnwise_data").unwrap().bytes(),
    };
    let mut bytes = Vec::with_capacity(m * k * out.size());
    for i in 0..m {
        for j in 0..k {
            let b = match dir {
                Direction::Rowwise => q[i * k + j],
                Direction::Columnwise => q[j * m + i],
            };
            let v = table[b as usize] * per_elem_scale(i, j);
            match out {
                DType::F32 => bytes.extend_from_slice(&v.to_le_bytes()),
                DType::BF16 => bytes.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
                DType::F16 => bytes.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
                _ => unreachable!(),
            }
        }
    }
    bytes
}

/// Looks up the scale_inv of logical element (i, j) in one direction (diagnostics).
type ScaleAt<F> = fn(&QuantizedTensor<F>, Direction, usize, usize) -> f32;

fn check_case<F: Format>(
    g: &Golden,
    i: usize,
    c: &Value,
    q: F,
    quantize: &dyn Fn(&HostTensor<'_>) -> quant_core::Result<QuantizedTensor<F>>,
    scale_at: ScaleAt<F>,
    table: &[f32; 256],
) -> usize {
    let ctx = describe(i, c);
    let shape = shape_of(c);
    let in_dtype = dtype(c["dtype"].as_str().unwrap());
    let (st_dtype, in_shape, in_bytes) = g.tensor(&format!("case{i}.input"));
    assert_eq!(in_shape, shape, "{ctx}: input shape");
    assert_eq!(
        DType::from_safetensors(st_dtype),
        Some(in_dtype),
        "{ctx}: input dtype"
    );
    let x = HostTensor::from_le_bytes(in_dtype, &in_bytes, &shape).unwrap();
    let t = quantize(&x).unwrap_or_else(|e| panic!("{ctx}: {e}"));

    // every buffer, in the library's storage order, byte for byte
    let names: Vec<&str> = c["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let got_names: Vec<&str> = t.buffers().iter().map(|b| b.name()).collect();
    assert_eq!(got_names, names, "{ctx}: buffer list");
    let mut golden_bufs = Vec::new();
    let mut compared = 0;
    for b in t.buffers() {
        let (dt, sh, want) = g.tensor(&format!("case{i}.{}", b.name()));
        assert_eq!(b.shape(), &sh[..], "{ctx}: {} shape", b.name());
        assert_eq!(
            Some(b.dtype()),
            DType::from_safetensors(dt),
            "{ctx}: {} dtype",
            b.name()
        );
        if let Some(p) = b.bytes().iter().zip(&want).position(|(a, w)| a != w) {
            let w = b.dtype().size();
            let e = p / w;
            panic!(
                "{ctx}: buffer {} differs at element {e} (flat): library {:02x?}, golden {:02x?}; input there (if data) {:02x?}",
                b.name(),
                &b.bytes()[e * w..(e + 1) * w],
                &want[e * w..(e + 1) * w],
                in_bytes.get(e * in_dtype.size()..(e + 1) * in_dtype.size()),
            );
        }
        assert_eq!(b.bytes().len(), want.len(), "{ctx}: {} size", b.name());
        compared += want.len();
        golden_bufs
            .push(Buffer::from_bytes(BufferDesc::new(b.name(), b.dtype(), &sh), &want).unwrap());
    }

    // dequantization: CRC32 of the reference bytes, for every output dtype
    let loaded = QuantizedTensor::from_buffers(q.clone(), t.shape(), in_dtype, golden_bufs)
        .unwrap_or_else(|e| panic!("{ctx}: golden buffers do not load: {e}"));
    for (dir, dname) in dirs(q.usage()) {
        for (out, oname) in [
            (DType::F32, "f32"),
            (DType::BF16, "bf16"),
            (DType::F16, "f16"),
        ] {
            let key = format!("case{i}.dequant.{dname}.{oname}.crc32");
            let (_, _, want) = g.tensor(&key);
            let want = u32::from_le_bytes(want[..4].try_into().unwrap());
            let got = t.dequantize(dir, out).unwrap();
            let got = got.as_bytes();
            assert_eq!(got.len(), shape.iter().product::<usize>() * out.size());
            if crc32fast::hash(got) != want {
                let re = rederive_dequant(&t, &|r, col| scale_at(&t, dir, r, col), table, dir, out);
                panic!(
                    "{ctx}: {dname} dequantize to {out} differs from the reference; {}",
                    first_dequant_difference(got, &re, out.size())
                );
            }
            let from_golden = loaded.dequantize(dir, out).unwrap();
            assert_eq!(
                crc32fast::hash(from_golden.as_bytes()),
                want,
                "{ctx}: {dname} dequantize to {out} of the golden buffers"
            );
        }
    }
    compared
}

/// Per-element scale_inv lookups (for diagnostics only).
fn fp8_scale(t: &QuantizedTensor<Fp8Quantizer>, _: Direction, _: usize, _: usize) -> f32 {
    t.buffer("scale_inv").unwrap().as_slice::<f32>().unwrap()[0]
}

fn block_scale(t: &QuantizedTensor<Fp8BlockQuantizer>, dir: Direction, i: usize, j: usize) -> f32 {
    let (m, k) = t.shape().as_2d();
    let (sr, sc) = t.quantizer().scale_shapes(m, k);
    let one_d = t.quantizer().block() == BlockScaling::OneD;
    let (name, idx) = match (dir, one_d) {
        (Direction::Rowwise, true) => ("rowwise_scale_inv", (j / 128) * sr[1] + i),
        (Direction::Rowwise, false) => ("rowwise_scale_inv", (i / 128) * sr[1] + j / 128),
        (Direction::Columnwise, true) => ("columnwise_scale_inv", (i / 128) * sc[1] + j),
        (Direction::Columnwise, false) => ("columnwise_scale_inv", (j / 128) * sc[1] + i / 128),
    };
    t.buffer(name).unwrap().as_slice::<f32>().unwrap()[idx]
}

/// Deriving the columnwise buffers from the golden rowwise ones (TE's `update_usage`)
/// gives the golden columnwise buffers.
fn check_derived<F: Format>(g: &Golden, i: usize, c: &Value, q: F) {
    let ctx = describe(i, c);
    let shape = Shape::new(&shape_of(c)).unwrap();
    let in_dtype = dtype(c["dtype"].as_str().unwrap());
    let row_q = q.with_usage(Usage::ROWWISE);
    let bufs: Vec<Buffer> = row_q
        .buffers(&shape)
        .unwrap()
        .into_iter()
        .map(|d| {
            let (_, _, bytes) = g.tensor(&format!("case{i}.{}", d.name));
            Buffer::from_bytes(d, &bytes).unwrap()
        })
        .collect();
    let mut t = QuantizedTensor::from_buffers(row_q, &shape, in_dtype, bufs).unwrap();
    t.update_usage(Usage::BOTH)
        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
    for b in t.buffers() {
        let (_, _, want) = g.tensor(&format!("case{i}.{}", b.name()));
        assert!(b.bytes() == &want[..], "{ctx}: derived {}", b.name());
    }
}

#[test]
fn per_tensor_current_scaling_matches_reference() {
    let g = Golden::load("fp8.safetensors");
    let mut bytes = 0;
    let mut derived = 0;
    let mut overrides = 0;
    for (i, c) in g.cases.iter().enumerate() {
        assert_eq!(c["format"], "fp8");
        let q = Fp8Quantizer::new(usage(c["usage"].as_str().unwrap()))
            .with_dtype(fp8(c["fp8"].as_str().unwrap()))
            .with_pow2_scales(c["pow2"].as_bool().unwrap())
            .with_amax_epsilon(eps_of(c))
            .unwrap();
        let table = q.dtype().decode_table();
        // an amax given from outside (amax reduction) goes through quantize_with_amax
        let amax = c["amax_bits"].as_u64().map(|b| f32::from_bits(b as u32));
        let quantize = |x: &HostTensor<'_>| match amax {
            Some(a) => q.quantize_with_amax(x, a),
            None => q.quantize(x),
        };
        bytes += check_case(&g, i, c, q.clone(), &quantize, fp8_scale, table);
        overrides += usize::from(amax.is_some());
        if q.usage() == Usage::BOTH {
            check_derived(&g, i, c, q);
            derived += 1;
        }
    }
    assert!(g.cases.len() >= 40 && derived >= 10 && overrides >= 8);
    eprintln!(
        "fp8: {} cases, {bytes} buffer bytes, {derived} derivations",
        g.cases.len()
    );
}

#[test]
fn blockwise_matches_reference() {
    let g = Golden::load("fp8_block.safetensors");
    let mut bytes = 0;
    let mut derived = 0;
    for (i, c) in g.cases.iter().enumerate() {
        assert_eq!(c["format"], "fp8-block");
        let block = match c["block"].as_str().unwrap() {
            "1x128" => BlockScaling::OneD,
            "128x128" => BlockScaling::TwoD,
            other => panic!("{other}"),
        };
        let q = Fp8BlockQuantizer::new(block, usage(c["usage"].as_str().unwrap()))
            .with_dtype(fp8(c["fp8"].as_str().unwrap()))
            .with_pow2_scales(c["pow2"].as_bool().unwrap())
            .with_amax_epsilon(eps_of(c))
            .unwrap();
        let table = q.dtype().decode_table();
        bytes += check_case(&g, i, c, q.clone(), &|x| q.quantize(x), block_scale, table);
        if q.usage() == Usage::BOTH && block == BlockScaling::TwoD {
            check_derived(&g, i, c, q);
            derived += 1;
        }
    }
    assert!(g.cases.len() >= 60 && derived >= 5, "{}", g.cases.len());
    eprintln!(
        "fp8-block: {} cases, {bytes} buffer bytes, {derived} derivations",
        g.cases.len()
    );
}

/// The golden data exercises what it claims to: both element formats, all input dtypes
/// and usages, both scale modes, epsilon, and value_for_inf for every input dtype.
#[test]
fn golden_cases_cover_the_matrix() {
    let pt = Golden::load("fp8.safetensors");
    let bl = Golden::load("fp8_block.safetensors");
    let all: Vec<&Value> = pt.cases.iter().chain(&bl.cases).collect();
    for key in ["dtype", "fp8", "usage", "pow2"] {
        for fmt in ["fp8", "fp8-block"] {
            let mut seen: Vec<String> = all
                .iter()
                .filter(|c| c["format"] == fmt)
                .map(|c| c[key].to_string())
                .collect();
            seen.sort();
            seen.dedup();
            let want = match key {
                "fp8" | "pow2" => 2,
                _ => 3,
            };
            assert_eq!(seen.len(), want, "{fmt} {key}: {seen:?}");
        }
    }
    // value_for_inf of the block recipe: the input dtype's max (pow2 rounds it down)
    let mut vinf = std::collections::BTreeSet::new();
    for (i, c) in bl.cases.iter().enumerate() {
        if c["content"] == "zeros" && eps_of(c) == f32::from_bits(1) {
            let (_, _, s) = bl.tensor(&format!("case{i}.rowwise_scale_inv"));
            let s = f32::from_le_bytes(s[..4].try_into().unwrap());
            vinf.insert((
                c["dtype"].as_str().unwrap().to_string(),
                c["pow2"].as_bool().unwrap(),
                s.to_bits(),
            ));
        }
    }
    let expect = [
        (
            "bf16",
            false,
            (1.0f32 / f32::from_bits(0x7F7F_0000)).to_bits(),
        ),
        ("bf16", true, 0x0040_0000), // 2^-127
        ("f16", false, (1.0f32 / 65504.0).to_bits()),
        ("f16", true, (1.0f32 / 32768.0).to_bits()),
        ("f32", false, (1.0f32 / f32::MAX).to_bits()),
        ("f32", true, 0x0040_0000),
    ];
    let got: Vec<(String, bool, u32)> = vinf.into_iter().collect();
    let want: Vec<(String, bool, u32)> = expect
        .iter()
        .map(|(d, p, b)| (d.to_string(), *p, *b))
        .collect();
    assert_eq!(got, want);
}
