//! Property tests over every registered format (proptest): the contract of
//! `tests/conformance.rs`, on random shapes, values, option sets and usages.
//!
//! Nothing here names a format. Quantizers are drawn from `quantfmt::registry()`: an entry,
//! a random subset of its spec options (value options such as `eps=X` or `seed=N` get a
//! fixed value) and a usage; combinations the format refuses are skipped (refusing is
//! part of the contract, checked by the conformance suite). Inputs are f32 tensors with
//! values spread over many binades, zeros and sign changes, from a seeded generator so a
//! failing case reproduces from its seed.
//!
//! # The error bound
//!
//! `dequantize(quantize(x))` must be within `r * |x| + a * A` of `x`, element by element,
//! where `A` is the tensor's amax and `(r, a)` come from the width of the element format,
//! read off the storage itself (data bits per value, from the buffer sizes of a
//! rowwise-only prototype, so scales do not count):
//!
//! * 8-bit floats (E4M3, E5M2) with a block or tensor scale: `r = 2^-3`, half an ulp of
//!   E5M2's 2-bit mantissa relative to the value (E4M3's is 2^-4), which also covers the
//!   saturation of the OCP floor scale rule (a block amax of almost 2 * 2^e lands on the
//!   max 1.75 * 2^e: 12.5 %), and `a = 2^-16` for values that land in the subnormal range
//!   of their block (half of E4M3's smallest subnormal 2^-9, times a scale of at most
//!   2 * amax / 448, is under 2^-16 * A).
//! * 4-bit elements (E2M1 with an E4M3 block scale, or 16-level integers): `r = 2^-2`,
//!   half the widest E2M1 step (4 -> 6) relative to its lower end, including the E4M3
//!   rounding of the scale (which makes the block max land at up to 6 / (1 - 2^-4) and
//!   saturate by at most 6.25 %), and `a = 2^-3` for the small values: half the first step
//!   (0 -> 0.5) of a scale of at most amax / 5.6 is 0.045 * A, and 16-level integers with
//!   scale `(max - min) / 15` round by at most A / 15.
//!
//! Stochastic rounding moves a value to either neighbour, not the nearest one, so a
//! quantizer whose identical rows do not dequantize identically (the observable sign
//! of position-dependent rounding) gets twice the bound: a full step instead of half.
//! A relative slack of 2^-10 absorbs f32 rounding in the kernels' scale arithmetic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use proptest::prelude::*;
use proptest::test_runner::Config;
use quantfmt::io::{Loaded, SaveItem, load, load_bytes, save, save_items};
use quantfmt::{
    Buffer, DType, Direction, Error, HostTensor, Quantizer, Shape, Storage, TensorProto, Usage,
    registry,
};
use quantfmt_testkit::XorShift64;

/// Cases per property: enough to walk every format and many option sets, short enough
/// for CI (each case quantizes a few tensors of up to 256 x 384).
fn config() -> Config {
    Config {
        cases: 64,
        max_global_rejects: 4096,
        ..Config::default()
    }
}

/// A quantizer drawn from the registry: (entry index, option selection, usage).
fn quantizer_strategy() -> impl Strategy<Value = (Box<dyn Quantizer>, String)> {
    let n = registry().entries().len();
    (
        0..n,
        prop::collection::vec(prop::bool::weighted(0.25), 16),
        0..3u8,
    )
        .prop_filter_map("refused option set", |(i, picks, u)| {
            let e = &registry().entries()[i];
            let opts: Vec<String> = e
                .options
                .iter()
                .zip(&picks)
                .filter(|(_, p)| **p)
                .map(|(o, _)| match o.name.split_once('=') {
                    Some((k, v)) if v.bytes().all(|b| b.is_ascii_uppercase()) => {
                        // A placeholder: a float option gets a small epsilon, an integer a seed.
                        if v == "X" {
                            format!("{k}=0.001")
                        } else {
                            format!("{k}=7")
                        }
                    }
                    _ => o.name.to_string(),
                })
                .collect();
            let spec = if opts.is_empty() {
                e.name.to_string()
            } else {
                format!("{}:{}", e.name, opts.join(","))
            };
            let usage = [Usage::ROWWISE, Usage::COLUMNWISE, Usage::BOTH][u as usize];
            registry()
                .parse_spec(&spec, usage)
                .ok()
                .map(|q| (q, format!("{spec} ({usage})")))
        })
}

/// 2-D shapes with M a multiple of 32 and K a multiple of 128 (what every shipped block
/// size divides), small enough to keep each case fast.
fn shape_strategy() -> impl Strategy<Value = [usize; 2]> {
    (1..=8usize, 1..=3usize).prop_map(|(a, b)| [32 * a, 128 * b])
}

/// Values: sign, binade within `spread` of 2^0, mantissa; 1 in 16 is an exact zero.
fn values(n: usize, seed: u64, spread: i32) -> Vec<f32> {
    let mut rng = XorShift64::new(seed | 1);
    (0..n)
        .map(|_| {
            let s = rng.next_u64();
            if s.is_multiple_of(16) {
                return 0.0;
            }
            let e = ((s >> 8) % (2 * spread as u64 + 1)) as i32 - spread;
            let m = 1.0 + ((s >> 24) & 0xFFFF) as f32 / 65536.0;
            let v = m * 2f32.powi(e);
            if (s >> 40) & 1 == 1 { -v } else { v }
        })
        .collect()
}

fn quantize_or_skip(
    q: &dyn Quantizer,
    x: &HostTensor<'_>,
) -> Result<Box<dyn Storage>, TestCaseError> {
    match q.quantize(x) {
        Ok(s) => Ok(s),
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            Err(TestCaseError::reject(format!("{}: {e}", q.spec())))
        }
    }
}

fn same_bytes(a: &dyn Storage, b: &dyn Storage) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.shape(), b.shape());
    prop_assert_eq!(a.buffers().len(), b.buffers().len());
    for (x, y) in a.buffers().iter().zip(b.buffers()) {
        prop_assert_eq!(x.desc(), y.desc());
        prop_assert!(x.bytes() == y.bytes(), "buffer {} differs", x.name());
    }
    Ok(())
}

fn directions(s: &dyn Storage) -> Vec<Direction> {
    [Direction::Rowwise, Direction::Columnwise]
        .into_iter()
        .filter(|d| s.usage().has(*d))
        .collect()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn save_load_is_identity(
        (q, name) in quantizer_strategy(),
        shape in shape_strategy(),
        seed in any::<u64>(),
        dtype in prop::sample::select(vec![DType::F32, DType::BF16, DType::F16]),
    ) {
        let v = values(shape[0] * shape[1], seed, 12);
        let x = HostTensor::f32(&v, &shape).unwrap().to_dtype(dtype).unwrap();
        let s = quantize_or_skip(&*q, &x)?;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        save(&path, &[("t", &s)]).unwrap();
        let f = load(&path).unwrap();
        let Some(Loaded::Quantized(t)) = f.get("t") else {
            return Err(TestCaseError::fail(format!("{name}: not loaded as quantized")));
        };
        same_bytes(&*s, &**t)?;
        prop_assert_eq!(t.dtype(), dtype);
        prop_assert!(t.quantizer().dyn_eq(s.quantizer()), "{}", name);
        let bytes = std::fs::read(&path).unwrap();
        let g = load_bytes(&bytes).unwrap();
        let Some(Loaded::Quantized(u)) = g.get("t") else {
            return Err(TestCaseError::fail(format!("{name}: not loaded from bytes")));
        };
        same_bytes(&*s, &**u)?;
        for d in directions(&*s) {
            prop_assert_eq!(
                s.dequantize(d, DType::F32).unwrap().to_f32_vec(),
                t.dequantize(d, DType::F32).unwrap().to_f32_vec()
            );
        }
    }

    #[test]
    fn flatten_unflatten_is_identity(
        (q, name) in quantizer_strategy(),
        shape in shape_strategy(),
        seed in any::<u64>(),
        reverse in any::<bool>(),
    ) {
        let v = values(shape[0] * shape[1], seed, 20);
        let x = HostTensor::f32(&v, &shape).unwrap();
        let s = quantize_or_skip(&*q, &x)?;
        let mut bufs: Vec<Buffer> = s
            .buffers()
            .iter()
            .map(|b| Buffer::from_bytes(b.desc().clone(), b.bytes()).unwrap())
            .collect();
        if reverse {
            bufs.reverse();
        }
        let t = registry()
            .unflatten(s.format_name(), &s.quantizer().options().unwrap(), s.shape(), s.dtype(), bufs)
            .map_err(|e| TestCaseError::fail(format!("{name}: own buffers refused: {e}")))?;
        same_bytes(&*s, &*t)?;
        prop_assert!(t.quantizer().dyn_eq(s.quantizer()));
        prop_assert_eq!(TensorProto::from_storage(&*t), s.proto());
        for d in directions(&*s) {
            prop_assert_eq!(
                s.dequantize(d, DType::F32).unwrap().to_f32_vec(),
                t.dequantize(d, DType::F32).unwrap().to_f32_vec()
            );
        }
    }

    #[test]
    fn grouped_is_the_concatenation_of_its_members(
        (q, name) in quantizer_strategy(),
        members in prop::collection::vec(shape_strategy(), 1..4),
        same_k in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let k = members[0][1];
        let shapes: Vec<[usize; 2]> = members
            .iter()
            .map(|s| if same_k { [s[0], k] } else { *s })
            .collect();
        let vals: Vec<Vec<f32>> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| values(s[0] * s[1], seed.wrapping_add(i as u64), 10))
            .collect();
        let xs: Vec<HostTensor<'_>> = vals
            .iter()
            .zip(&shapes)
            .map(|(v, s)| HostTensor::f32(v, s).unwrap())
            .collect();
        let alone: Vec<Box<dyn Storage>> = xs
            .iter()
            .map(|x| quantize_or_skip(&*q, x))
            .collect::<Result<_, _>>()?;
        let g = q
            .quantize_grouped_list(&xs)
            .map_err(|e| TestCaseError::fail(format!("{name}: members quantize alone but not grouped: {e}")))?;
        prop_assert_eq!(g.num_members(), shapes.len());
        for (b, gb) in g.buffers().iter().enumerate() {
            let offs = g.byte_offsets(gb.name()).unwrap();
            prop_assert_eq!(offs.len(), shapes.len() + 1);
            prop_assert_eq!(offs[shapes.len()], gb.nbytes());
            for (i, a) in alone.iter().enumerate() {
                prop_assert!(
                    &gb.bytes()[offs[i]..offs[i + 1]] == a.buffers()[b].bytes(),
                    "{}: member {} of buffer {} differs from quantizing it alone", name, i, gb.name()
                );
            }
        }
        let mut total = 0;
        for (i, a) in alone.iter().enumerate() {
            prop_assert_eq!(g.element_offsets()[i], total);
            total += a.shape().numel();
            let m = g.member(i).unwrap();
            same_bytes(&*m, &**a)?;
        }
        prop_assert_eq!(g.element_offsets()[shapes.len()], total);
        // One contiguous input gives the same bytes as the list.
        let flat: Vec<f32> = vals.concat();
        let shp: Vec<Shape> = shapes.iter().map(|s| Shape::new(s).unwrap()).collect();
        let g2 = q.quantize_grouped(&HostTensor::f32(&flat, &[flat.len()]).unwrap(), &shp).unwrap();
        for (a, b) in g.buffers().iter().zip(g2.buffers()) {
            prop_assert!(a.bytes() == b.bytes());
        }
        // And the grouped tensor survives a file round trip.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.safetensors");
        save_items(&path, &[("g".to_string(), SaveItem::Grouped(&*g))], &Default::default()).unwrap();
        let f = load(&path).unwrap();
        let Some(Loaded::Grouped(h)) = f.get("g") else {
            return Err(TestCaseError::fail(format!("{name}: grouped tensor not loaded back")));
        };
        prop_assert_eq!(h.member_shapes(), g.member_shapes());
        for (a, b) in g.buffers().iter().zip(h.buffers()) {
            prop_assert!(a.bytes() == b.bytes());
        }
    }

    #[test]
    fn usage_updates_agree_with_quantizing_that_way(
        (q, name) in quantizer_strategy(),
        shape in shape_strategy(),
        seed in any::<u64>(),
    ) {
        let v = values(shape[0] * shape[1], seed, 8);
        let x = HostTensor::f32(&v, &shape).unwrap();
        let both_q = q.with_usage(Usage::BOTH);
        let both = quantize_or_skip(&*both_q, &x)?;
        for keep in [Usage::ROWWISE, Usage::COLUMNWISE] {
            let mut s = both.clone_box();
            match s.update_usage(keep) {
                Err(e) => {
                    prop_assert!(matches!(e, Error::Unsupported { .. }), "{}: {}", name, e);
                    prop_assert!(q.with_usage(keep).quantize(&x).is_err(), "{}: refused update, but quantizing {} works", name, keep);
                    prop_assert_eq!(s.usage(), Usage::BOTH);
                }
                Ok(()) => {
                    prop_assert_eq!(s.usage(), keep);
                    let only = q.with_usage(keep).quantize(&x).unwrap();
                    same_bytes(&*s, &*only)?;
                    match s.update_usage(Usage::BOTH) {
                        Ok(()) => same_bytes(&*s, &*both)?,
                        Err(e) => {
                            prop_assert!(matches!(e, Error::Unsupported { .. }), "{}: {}", name, e);
                            prop_assert_eq!(s.usage(), keep, "a refused change leaves the tensor as it was");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn slices_and_selections_dequantize_to_the_selected_rows(
        (q, name) in quantizer_strategy(),
        blocks in 2..=4usize,
        k in prop::sample::select(vec![128usize, 256]),
        cuts in prop::collection::vec((0..4usize, 0..4usize), 1..4),
        ragged in 0..200usize,
        seed in any::<u64>(),
    ) {
        let m = 128 * blocks;
        let v = values(m * k, seed, 10);
        let x = HostTensor::f32(&v, &[m, k]).unwrap();
        let s = quantize_or_skip(&*q, &x)?;
        let whole: Vec<Vec<f32>> = directions(&*s)
            .into_iter()
            .map(|d| s.dequantize(d, DType::F32).unwrap().to_f32_vec())
            .collect();
        // Ranges on 128-row boundaries (every shipped granularity divides 128).
        let ranges: Vec<std::ops::Range<usize>> = cuts
            .iter()
            .map(|&(a, b)| {
                let (a, b) = (a % blocks, b % blocks);
                let (lo, hi) = (a.min(b), a.max(b) + 1);
                128 * lo..128 * hi
            })
            .collect();
        match s.gather_dim0(&ranges) {
            Err(e) => prop_assert!(matches!(e, Error::Unsupported { .. }), "{}: {}", name, e),
            Ok(t) => {
                let rows: usize = ranges.iter().map(|r| r.len()).sum();
                prop_assert_eq!(t.shape().dims(), &[rows, k][..]);
                for (di, d) in directions(&*s).into_iter().enumerate() {
                    let got = t.dequantize(d, DType::F32).unwrap().to_f32_vec();
                    let want: Vec<f32> = ranges
                        .iter()
                        .flat_map(|r| whole[di][r.start * k..r.end * k].iter().copied())
                        .collect();
                    prop_assert!(got == want, "{}: gathered rows differ ({})", name, d);
                }
                // A gather equals the concatenation of single slices.
                if ranges.len() > 1 {
                    let parts: Vec<Box<dyn Storage>> =
                        ranges.iter().map(|r| s.slice_dim0(r.clone()).unwrap()).collect();
                    let d = directions(&*s)[0];
                    let cat: Vec<f32> = parts
                        .iter()
                        .flat_map(|p| p.dequantize(d, DType::F32).unwrap().to_f32_vec())
                        .collect();
                    prop_assert_eq!(t.dequantize(d, DType::F32).unwrap().to_f32_vec(), cat);
                }
            }
        }
        // Off-boundary cuts either work (per-row scales) or are refused, never wrong.
        let r = (ragged % m)..m;
        if let Ok(t) = s.slice_dim0(r.clone()) {
            for (di, d) in directions(&*s).into_iter().enumerate() {
                let got = t.dequantize(d, DType::F32).unwrap().to_f32_vec();
                prop_assert!(got[..] == whole[di][r.start * k..], "{}: slice {:?} differs", name, r);
            }
        }
    }

    #[test]
    fn dequantize_is_within_the_element_formats_bound(
        (q, name) in quantizer_strategy(),
        shape in shape_strategy(),
        seed in any::<u64>(),
        spread in 0..40i32,
        outlier in prop::option::of(0..1000usize),
    ) {
        let mut v = values(shape[0] * shape[1], seed, spread);
        if let Some(i) = outlier {
            let n = v.len();
            v[i % n] *= 1e4;
        }
        let x = HostTensor::f32(&v, &shape).unwrap();
        let s = quantize_or_skip(&*q, &x)?;
        let (r, a) = error_model(&*q, &name)?;
        let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        for d in directions(&*s) {
            let y = s.dequantize(d, DType::F32).unwrap().to_f32_vec();
            for (i, (&xi, &yi)) in v.iter().zip(&y).enumerate() {
                let bound = (r * xi.abs() + a * amax) * (1.0 + 2f32.powi(-10)) + f32::MIN_POSITIVE;
                prop_assert!(
                    (xi - yi).abs() <= bound,
                    "{}: {} element {} ({}, {}): x = {:e}, y = {:e}, |x - y| = {:e} > bound {:e} (amax {:e})",
                    name, d, i, i / shape[1], i % shape[1], xi, yi, (xi - yi).abs(), bound, amax
                );
            }
        }
    }
}

/// `(r, a)` of the module docs for quantizer `q`.
fn error_model(q: &dyn Quantizer, name: &str) -> Result<(f32, f32), TestCaseError> {
    // Data bits per value, from a rowwise-only prototype (scale bytes are small next to
    // the data at this size, and the floor below drops them).
    let shape = [512usize, 1024];
    let rowwise = q.with_usage(Usage::ROWWISE);
    let proto = TensorProto::new(&shape, DType::F32, rowwise.as_ref())
        .or_else(|_| TensorProto::new(&shape, DType::F32, q));
    let proto = proto.map_err(|e| TestCaseError::fail(format!("{name}: prototype: {e}")))?;
    let dirs = if proto.usage() == Usage::BOTH {
        2.0
    } else {
        1.0
    };
    let bits = proto.nbytes().unwrap() as f64 * 8.0 / (shape[0] * shape[1]) as f64 / dirs;
    let (r, a) = if bits < 6.0 {
        (0.25f32, 0.125f32)
    } else if bits < 12.0 {
        (0.125, 2f32.powi(-16))
    } else {
        return Err(TestCaseError::fail(format!(
            "{name}: no error model for {bits:.2} data bits per value; add one to tests/properties.rs"
        )));
    };
    Ok(if rounds_stochastically(q) {
        (2.0 * r, 2.0 * a)
    } else {
        (r, a)
    })
}

/// Whether identical rows dequantize differently (position-dependent rounding).
fn rounds_stochastically(q: &dyn Quantizer) -> bool {
    let (m, k) = (64usize, 256usize);
    let row = values(k, 99, 6);
    let v: Vec<f32> = (0..m).flat_map(|_| row.iter().copied()).collect();
    let x = HostTensor::f32(&v, &[m, k]).unwrap();
    let Ok(s) = q.quantize(&x) else {
        return false;
    };
    directions(&*s).into_iter().any(|d| {
        let y = s.dequantize(d, DType::F32).unwrap().to_f32_vec();
        y.chunks(k).any(|r| r != &y[..k])
    })
}

#[test]
fn every_registered_format_has_an_error_model() {
    for e in registry().entries() {
        let q = e
            .from_spec(&[], Usage::ROWWISE)
            .or_else(|_| e.from_spec(&[], Usage::BOTH))
            .unwrap();
        error_model(&*q, e.name).unwrap();
        assert!(
            !rounds_stochastically(&*q),
            "{}: default options round to nearest",
            e.name
        );
    }
}
