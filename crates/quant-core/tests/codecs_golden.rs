//! Golden tests: the scalar codecs (E4M3, E5M2, E2M1, E8M0) and the `half` bf16 / f16
//! conversions the library relies on, bit for bit against data made by
//! `tests/golden/codecs.py` (numpy + ml_dtypes with the kernel semantics layered on top).
//!
//! Coverage: every bf16 and every f16 bit pattern (widened to f32) through every codec,
//! every rounding boundary of every codec (midpoints, subnormals, the overflow boundary,
//! zero, +-64 f32 ulps around each, both signs), NaN payloads and infinities, and a strided
//! sweep of 104,755,300 f32 patterns compared as CRC32s of 2^20 outputs.
//!
//! A third, brute-force oracle written here from the format definitions (minifloat bit
//! fields, nearest value with ties to the even code) is checked against the golden arrays
//! too, and is what locates the first differing input when a CRC32 chunk mismatches.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::OnceLock;

use half::{bf16, f16};
use quant_core::codec::{e2m1, e4m3, e5m2, e8m0};
use rayon::prelude::*;
use safetensors::SafeTensors;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden/data/");

// ---------------------------------------------------------------------------------------
// golden files
// ---------------------------------------------------------------------------------------

struct Golden {
    name: &'static str,
    bytes: Vec<u8>,
    meta: serde_json::Value,
}

impl Golden {
    fn load(name: &'static str) -> Golden {
        let path = format!("{DATA}{name}");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!("{path}: {e} (regenerate with `python3 tests/golden/codecs.py`)")
        });
        let (_, m) = SafeTensors::read_metadata(&bytes).unwrap();
        let meta = serde_json::from_str(&m.metadata().as_ref().unwrap()["json"]).unwrap();
        Golden { name, bytes, meta }
    }

    fn raw(&self, key: &str) -> Vec<u8> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st
            .tensor(key)
            .unwrap_or_else(|_| panic!("{}: no tensor {key}", self.name));
        t.data().to_vec()
    }

    fn u8s(&self, key: &str) -> Vec<u8> {
        self.raw(key)
    }

    fn u16s(&self, key: &str) -> Vec<u16> {
        let r = self.raw(key);
        r.chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect()
    }

    fn u32s(&self, key: &str) -> Vec<u32> {
        let r = self.raw(key);
        r.chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    fn meta_u64(&self, path: &[&str]) -> u64 {
        let mut v = &self.meta;
        for p in path {
            v = &v[*p];
        }
        v.as_u64()
            .unwrap_or_else(|| panic!("{}: metadata {path:?} missing", self.name))
    }
}

fn main_file() -> &'static Golden {
    static G: OnceLock<Golden> = OnceLock::new();
    G.get_or_init(|| Golden::load("codecs.safetensors"))
}

// ---------------------------------------------------------------------------------------
// codecs under test, and an independent brute-force oracle
// ---------------------------------------------------------------------------------------

/// NaN -> sign | 0x7FC00000 (payloads are implementation-defined; see codecs.py).
fn canon_f32(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        (b & 0x8000_0000) | 0x7FC0_0000
    } else {
        b
    }
}

fn canon_bf16(h: u16) -> u16 {
    if h & 0x7FFF > 0x7F80 {
        (h & 0x8000) | 0x7FC0
    } else {
        h
    }
}

fn canon_f16(h: u16) -> u16 {
    if h & 0x7FFF > 0x7C00 {
        (h & 0x8000) | 0x7E00
    } else {
        h
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Codec {
    E4m3,
    E5m2,
    E2m1,
    E8m0Ceil,
    E8m0Floor,
    Bf16,
    F16,
}

impl Codec {
    const ALL: [Codec; 7] = [
        Codec::E4m3,
        Codec::E5m2,
        Codec::E2m1,
        Codec::E8m0Ceil,
        Codec::E8m0Floor,
        Codec::Bf16,
        Codec::F16,
    ];

    fn name(self) -> &'static str {
        match self {
            Codec::E4m3 => "e4m3",
            Codec::E5m2 => "e5m2",
            Codec::E2m1 => "e2m1",
            Codec::E8m0Ceil => "e8m0_ceil",
            Codec::E8m0Floor => "e8m0_floor",
            Codec::Bf16 => "bf16",
            Codec::F16 => "f16",
        }
    }

    fn wide(self) -> bool {
        matches!(self, Codec::Bf16 | Codec::F16)
    }

    /// The library (and `half`) under test. bf16/f16 NaNs are canonicalised.
    #[inline(always)]
    fn encode(self, x: f32) -> u16 {
        match self {
            Codec::E4m3 => u16::from(e4m3::encode(x)),
            Codec::E5m2 => u16::from(e5m2::encode(x)),
            Codec::E2m1 => u16::from(e2m1::encode(x)),
            Codec::E8m0Ceil => u16::from(e8m0::from_f32_ceil(x)),
            Codec::E8m0Floor => u16::from(e8m0::from_f32_floor(x)),
            Codec::Bf16 => canon_bf16(bf16::from_f32(x).to_bits()),
            Codec::F16 => canon_f16(f16::from_f32(x).to_bits()),
        }
    }

    /// Encodes a slice into little-endian output bytes (1 or 2 per element), the
    /// representation the golden CRC32s are taken over.
    fn encode_bytes(self, xs: &[f32], out: &mut Vec<u8>) {
        out.clear();
        // One monomorphic loop per codec so each one compiles to a tight loop.
        fn narrow(xs: &[f32], out: &mut Vec<u8>, f: impl Fn(f32) -> u8) {
            out.extend(xs.iter().map(|&x| f(x)));
        }
        fn wide(xs: &[f32], out: &mut Vec<u8>, f: impl Fn(f32) -> u16) {
            out.reserve(xs.len() * 2);
            for &x in xs {
                out.extend_from_slice(&f(x).to_le_bytes());
            }
        }
        match self {
            Codec::E4m3 => narrow(xs, out, e4m3::encode),
            Codec::E5m2 => narrow(xs, out, e5m2::encode),
            Codec::E2m1 => narrow(xs, out, e2m1::encode),
            Codec::E8m0Ceil => narrow(xs, out, e8m0::from_f32_ceil),
            Codec::E8m0Floor => narrow(xs, out, e8m0::from_f32_floor),
            Codec::Bf16 => wide(xs, out, |x| canon_bf16(bf16::from_f32(x).to_bits())),
            Codec::F16 => wide(xs, out, |x| canon_f16(f16::from_f32(x).to_bits())),
        }
    }

    /// Brute force from the format definition: nearest grid value, ties to the even code.
    fn oracle(self, x: f32) -> u16 {
        let neg = x.is_sign_negative();
        let a = f64::from(x.abs());
        match self {
            Codec::E8m0Ceil | Codec::E8m0Floor => {
                if x.is_nan() {
                    return 0xFF;
                }
                if a == 0.0 {
                    return 0;
                }
                let p = |k: i32| 2f64.powi(k);
                let k = if self == Codec::E8m0Ceil {
                    (-127..=127).find(|&k| p(k) >= a).unwrap_or(127)
                } else {
                    (-127..=127).rev().find(|&k| p(k) <= a).unwrap_or(-127)
                };
                (k + 127) as u16
            }
            _ => {
                let g = grid(self);
                let sign = g.sign_bit * u16::from(neg);
                if x.is_nan() {
                    // IEEE types keep the sign of a NaN; the 8-bit encoders return one code
                    return if g.inf_code.is_some() {
                        sign | g.nan_code
                    } else {
                        g.nan_code
                    };
                }
                let v = &g.values;
                let n = v.len();
                let max = v[n - 1];
                let idx = if a >= max {
                    match g.inf_code {
                        // IEEE: overflow to infinity from max + ulp/2 (a tie goes to the
                        // even code, which is infinity's)
                        Some(inf) if a >= max + (max - v[n - 2]) / 2.0 => return sign | inf,
                        _ => n - 1, // satfinite
                    }
                } else {
                    let i = v.partition_point(|&g| g <= a) - 1;
                    // 2a vs lo + hi: both exact in f64
                    let (two_a, sum) = (2.0 * a, v[i] + v[i + 1]);
                    if two_a < sum || (two_a == sum && i % 2 == 0) {
                        i
                    } else {
                        i + 1
                    }
                };
                sign | idx as u16
            }
        }
    }
}

/// The non-negative finite values of a minifloat format in code order.
struct Grid {
    values: Vec<f64>,
    sign_bit: u16,
    nan_code: u16,
    inf_code: Option<u16>,
}

fn minifloat(code: u32, mbits: u32, bias: i32) -> f64 {
    let e = (code >> mbits) as i32;
    let m = f64::from(code & ((1 << mbits) - 1));
    let unit = |e: i32| 2f64.powi(e - bias - mbits as i32);
    if e == 0 {
        m * unit(1)
    } else {
        (f64::from(1u32 << mbits) + m) * unit(e)
    }
}

fn grid(c: Codec) -> &'static Grid {
    static GRIDS: OnceLock<HashMap<&'static str, Grid>> = OnceLock::new();
    let all = GRIDS.get_or_init(|| {
        let mk = |max_code: u32, mbits, bias, sign_bit, nan_code, inf_code| Grid {
            values: (0..=max_code).map(|c| minifloat(c, mbits, bias)).collect(),
            sign_bit,
            nan_code,
            inf_code,
        };
        HashMap::from([
            ("e4m3", mk(0x7E, 3, 7, 0x80, 0x7F, None)),
            ("e5m2", mk(0x7B, 2, 15, 0x80, 0x7F, None)),
            ("e2m1", mk(0x7, 1, 1, 0x8, 0x7, None)),
            ("bf16", mk(0x7F7F, 7, 127, 0x8000, 0x7FC0, Some(0x7F80))),
            ("f16", mk(0x7BFF, 10, 15, 0x8000, 0x7E00, Some(0x7C00))),
        ])
    });
    &all[c.name()]
}

// ---------------------------------------------------------------------------------------
// input sets (enumerated exactly as codecs.py does; their CRC32 is checked)
// ---------------------------------------------------------------------------------------

fn input_crc(xs: &[f32]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for x in xs {
        h.update(&x.to_bits().to_le_bytes());
    }
    h.finalize()
}

fn widened_bf16() -> Vec<f32> {
    (0..=u16::MAX)
        .map(|i| f32::from_bits(canon_f32(bf16::from_bits(i).to_f32())))
        .collect()
}

fn widened_f16() -> Vec<f32> {
    (0..=u16::MAX)
        .map(|i| f32::from_bits(canon_f32(f16::from_bits(i).to_f32())))
        .collect()
}

fn specials() -> Vec<f32> {
    [
        0x0000_0000u32,
        0x8000_0000,
        0x7F80_0000,
        0xFF80_0000,
        0x7FC0_0000,
        0xFFC0_0000,
        0x7F80_0001,
        0xFF80_0001,
        0x7FBF_FFFF,
        0xFFBF_FFFF,
        0x7FC0_0001,
        0x7FFF_FFFF,
        0xFFFF_FFFF,
        0x7F80_2000,
        0x7F81_0000,
        0x7FA0_0000,
        0xFFE0_0000,
        0x7F7F_FFFF,
        0xFF7F_FFFF,
        0x0000_0001,
        0x8000_0001,
        0x007F_FFFF,
        0x807F_FFFF,
        0x0080_0000,
        0x8080_0000,
        0x0040_0000,
        0x0040_0001,
        0x003F_FFFF,
        0x3F80_0000,
        0xBF80_0000,
        0x7F00_0000,
        0x7EFF_FFFF,
        0x7F00_0001,
    ]
    .into_iter()
    .map(f32::from_bits)
    .collect()
}

const ULPS: i64 = 64;

/// Non-negative rounding boundaries: 0, each midpoint between adjacent values, and the
/// overflow boundary max + ulp/2; for E8M0 every f32 power of two and FLT_MAX.
fn boundaries(set: &str) -> Vec<f64> {
    let mut b = vec![0.0];
    if set == "e8m0" {
        b.extend((-149..=127).map(|k| 2f64.powi(k)));
        b.push(f64::from(f32::MAX));
    } else {
        let codec = match set {
            "e4m3" => Codec::E4m3,
            "e5m2" => Codec::E5m2,
            "e2m1" => Codec::E2m1,
            "bf16" => Codec::Bf16,
            "f16" => Codec::F16,
            other => panic!("{other}"),
        };
        let v = &grid(codec).values;
        b.extend(v.windows(2).map(|w| (w[0] + w[1]) / 2.0));
        let n = v.len();
        b.push(v[n - 1] + (v[n - 1] - v[n - 2]) / 2.0);
    }
    for &x in &b {
        assert_eq!(
            f64::from(x as f32),
            x,
            "boundary {x} of {set} is not an f32"
        );
    }
    b
}

fn boundary_inputs(set: &str) -> Vec<f32> {
    let mut out = Vec::new();
    for b in boundaries(set) {
        let bb = i64::from((b as f32).to_bits());
        for d in -ULPS..=ULPS {
            let p = bb + d;
            if (0..=0x7FFF_FFFF).contains(&p) {
                out.push(f32::from_bits(p as u32));
                out.push(f32::from_bits(p as u32 | 0x8000_0000));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// comparison helpers
// ---------------------------------------------------------------------------------------

fn check_input_set(g: &Golden, group: &str, set: &str, xs: &[f32]) {
    let count = g.meta_u64(&[group, set, "count"]);
    assert_eq!(xs.len() as u64, count, "{}: input set {set} size", g.name);
    let want = g.meta_u64(&[group, set, "input_crc32"]) as u32;
    assert_eq!(
        input_crc(xs),
        want,
        "{}: input set {set} is not enumerated as codecs.py does",
        g.name
    );
}

/// Compares a codec over a full-array set, and checks the brute-force oracle against the
/// golden values too (so the oracle is trustworthy when it diagnoses a CRC mismatch).
fn compare_full(g: &Golden, set: &str, xs: &[f32], codec: Codec) -> usize {
    let key = format!("{set}.{}", codec.name());
    let want: Vec<u16> = if codec.wide() {
        g.u16s(&key)
    } else {
        g.u8s(&key).into_iter().map(u16::from).collect()
    };
    assert_eq!(want.len(), xs.len(), "{key}: length");
    let got: Vec<u16> = xs.par_iter().map(|&x| codec.encode(x)).collect();
    let bad: Vec<usize> = (0..xs.len()).filter(|&i| got[i] != want[i]).collect();
    if let Some(&i) = bad.first() {
        panic!(
            "{}: {key}: {} of {} differ; first at #{i}: input {:e} (bits {:#010x}) -> library {:#06x}, golden {:#06x}, oracle {:#06x}",
            g.name,
            bad.len(),
            xs.len(),
            xs[i],
            xs[i].to_bits(),
            got[i],
            want[i],
            codec.oracle(xs[i]),
        );
    }
    let oracle_bad = xs
        .par_iter()
        .zip(&want)
        .filter(|(x, w)| codec.oracle(**x) != **w)
        .count();
    assert_eq!(oracle_bad, 0, "{key}: the test's own oracle disagrees");
    xs.len()
}

/// Reports where a CRC32 chunk differs, using the brute-force oracle element by element.
fn diagnose_chunk(codec: Codec, what: &str, xs: &[f32]) -> String {
    let mut lines = Vec::new();
    for &x in xs {
        let (lib, ora) = (codec.encode(x), codec.oracle(x));
        if lib != ora {
            lines.push(format!(
                "  input {x:e} (bits {:#010x}): library {lib:#06x}, oracle {ora:#06x}",
                x.to_bits()
            ));
            if lines.len() == 5 {
                break;
            }
        }
    }
    if lines.is_empty() {
        format!(
            "{} {what}: CRC32 differs but the oracle agrees with the library on every element (suspect the golden data); first input bits {:#010x}",
            codec.name(),
            xs.first().map_or(0, |x| x.to_bits())
        )
    } else {
        format!(
            "{} {what}: first differing inputs:\n{}",
            codec.name(),
            lines.join("\n")
        )
    }
}

/// Compares a codec over a set stored as one CRC32 per `chunk` outputs.
fn compare_crc(xs: &[f32], codec: Codec, want: &[u32], chunk: usize, what: &str) -> Vec<String> {
    assert_eq!(want.len(), xs.len().div_ceil(chunk), "{what}: chunk count");
    xs.par_chunks(chunk)
        .zip(want)
        .enumerate()
        .filter_map(|(ci, (c, &w))| {
            let mut out = Vec::new();
            codec.encode_bytes(c, &mut out);
            (crc32fast::hash(&out) != w)
                .then(|| diagnose_chunk(codec, &format!("{what} chunk {ci}"), c))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// tests
// ---------------------------------------------------------------------------------------

#[test]
fn decode_tables_and_e2m1_packing() {
    let g = main_file();
    let tables: [(&str, Vec<f32>); 5] = [
        ("decode.e4m3", (0..=255).map(e4m3::decode).collect()),
        ("decode.e5m2", (0..=255).map(e5m2::decode).collect()),
        ("decode.e8m0", (0..=255).map(e8m0::decode).collect()),
        ("exp2_rcp.e8m0", (0..=255).map(e8m0::exp2_rcp).collect()),
        ("decode.e2m1", (0..16).map(e2m1::decode).collect()),
    ];
    for (key, got) in tables {
        let want = g.u32s(key);
        assert_eq!(want.len(), got.len(), "{key}");
        for (c, (&w, &v)) in want.iter().zip(&got).enumerate() {
            assert_eq!(canon_f32(v), w, "{key}[{c:#04x}]: library {v:e}");
        }
    }
    // every f32 the decoders produce is the oracle grid's value too
    for c in 0..=0x7Eu32 {
        assert_eq!(
            f64::from(e4m3::decode(c as u8)),
            grid(Codec::E4m3).values[c as usize]
        );
    }
    let pack = g.u8s("pack.e2m1");
    let (lo, hi) = (g.u8s("unpack.e2m1.lo"), g.u8s("unpack.e2m1.hi"));
    for h in 0..16u8 {
        for l in 0..16u8 {
            assert_eq!(e2m1::pack(l, h), pack[usize::from(h) * 16 + usize::from(l)]);
        }
    }
    for b in 0..=255u8 {
        assert_eq!(e2m1::unpack(b), (lo[usize::from(b)], hi[usize::from(b)]));
    }
}

#[test]
fn widening_every_bf16_and_f16_pattern() {
    for (file, key, xs) in [
        ("codecs_bf16.safetensors", "widen.bf16", widened_bf16()),
        ("codecs_f16.safetensors", "widen.f16", widened_f16()),
    ] {
        let g = Golden::load(file);
        let want = g.u32s(key);
        assert_eq!(want.len(), 65536);
        for (i, (x, w)) in xs.iter().zip(&want).enumerate() {
            assert_eq!(x.to_bits(), *w, "{key}: pattern {i:#06x}");
        }
    }
}

#[test]
fn every_bf16_pattern_through_every_codec() {
    let g = Golden::load("codecs_bf16.safetensors");
    let xs = widened_bf16();
    check_input_set(&g, "sets", "bf16", &xs);
    for c in Codec::ALL {
        compare_full(&g, "bf16", &xs, c);
    }
}

#[test]
fn every_f16_pattern_through_every_codec() {
    let g = Golden::load("codecs_f16.safetensors");
    let xs = widened_f16();
    check_input_set(&g, "sets", "f16", &xs);
    for c in Codec::ALL {
        compare_full(&g, "f16", &xs, c);
    }
}

#[test]
fn special_values_through_every_codec() {
    let g = main_file();
    let xs = specials();
    check_input_set(g, "sets", "specials", &xs);
    for c in Codec::ALL {
        compare_full(g, "specials", &xs, c);
    }
}

#[test]
fn every_rounding_boundary() {
    let g = main_file();
    let mut total = 0;
    for (set, codecs) in [
        ("e4m3", &[Codec::E4m3][..]),
        ("e5m2", &[Codec::E5m2]),
        ("e2m1", &[Codec::E2m1]),
        ("e8m0", &[Codec::E8m0Ceil, Codec::E8m0Floor]),
    ] {
        let name = format!("bnd.{set}");
        let xs = boundary_inputs(set);
        check_input_set(g, "sets", &name, &xs);
        for &c in codecs {
            total += compare_full(g, &name, &xs, c);
        }
    }
    let chunk = g.meta_u64(&["chunk"]) as usize;
    let mut errors = Vec::new();
    for (set, c) in [("bf16", Codec::Bf16), ("f16", Codec::F16)] {
        let name = format!("bnd.{set}");
        let xs = boundary_inputs(set);
        check_input_set(g, "crc_sets", &name, &xs);
        let want = g.u32s(&format!("{name}.{set}.crc"));
        errors.extend(compare_crc(&xs, c, &want, chunk, &name));
        total += xs.len();
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    assert!(total > 16_000_000, "{total}");
}

#[test]
fn strided_sweep_over_all_f32_patterns() {
    let g = main_file();
    let stride = g.meta_u64(&["stride"]);
    let n = g.meta_u64(&["sweep_count"]);
    let chunk = g.meta_u64(&["chunk"]);
    assert_eq!(n, (1u64 << 32).div_ceil(stride));
    assert!(n > 100_000_000);
    let wants: Vec<Vec<u32>> = Codec::ALL
        .iter()
        .map(|c| g.u32s(&format!("sweep.{}.crc", c.name())))
        .collect();
    let nchunks = n.div_ceil(chunk) as usize;
    let t0 = std::time::Instant::now();
    let results: Vec<(crc32fast::Hasher, Vec<String>)> = (0..nchunks)
        .into_par_iter()
        .map(|ci| {
            let (s, e) = (ci as u64 * chunk, ((ci as u64 + 1) * chunk).min(n));
            let xs: Vec<f32> = (s..e)
                .map(|i| f32::from_bits((i * stride) as u32))
                .collect();
            let mut h = crc32fast::Hasher::new();
            for x in &xs {
                h.update(&x.to_bits().to_le_bytes());
            }
            let mut errors = Vec::new();
            let mut out = Vec::with_capacity(xs.len() * 2);
            for (c, want) in Codec::ALL.iter().zip(&wants) {
                c.encode_bytes(&xs, &mut out);
                if crc32fast::hash(&out) != want[ci] {
                    errors.push(diagnose_chunk(*c, &format!("sweep chunk {ci}"), &xs));
                }
            }
            (h, errors)
        })
        .collect();
    let mut input = crc32fast::Hasher::new();
    let mut errors = Vec::new();
    for (h, e) in results {
        input.combine(&h);
        errors.extend(e);
    }
    assert_eq!(
        input.finalize(),
        g.meta_u64(&["crc_sets", "sweep", "input_crc32"]) as u32,
        "sweep inputs are not enumerated as codecs.py does"
    );
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    eprintln!(
        "sweep: {n} inputs x {} codecs in {:.1} s",
        Codec::ALL.len(),
        t0.elapsed().as_secs_f64()
    );
}
