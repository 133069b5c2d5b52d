//! Cross-format conformance: every registered format passes the same contract suite.
//!
//! Nothing here names a format: the suite walks the facade's registry, so a new format
//! is covered the moment it is registered.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use quantfmt::io::{Loaded, load, load_bytes, save};
use quantfmt::{
    AnyQuantizer, AnyStorage, Buffer, DType, Direction, Error, HostTensor, Quantizer, Shape,
    Storage, TensorProto, Usage, registry,
};
use quantfmt_testkit::XorShift32;

/// Option combinations exercised on top of each format's defaults (those of formats not
/// in this build are skipped). Stochastic rounding and RHT (bf16 input only) have their
/// own tests in their crate: SR draws depend on the element's position, so moved rows
/// do not equal re-quantized rows there.
const VARIANTS: &[&str] = &[
    "fp8:e5m2,pow2",
    "fp8-block:1x128",
    "fp8-block:fp32-scales,e5m2",
    "mxfp8:2d,swizzled",
    "mxfp8:ocp,e5m2",
    "nvfp4:2d,swizzled",
    "nvfp4:4over6",
    "nvfp4:4over6=mse,e4m3max=256",
    "nvfp4:row-scaled",
    "int4tiled:g64,k4",
];

/// Every registered format with default options and the variants above, with both
/// usages when the quantizer supports them.
fn quantizers() -> Vec<Box<dyn Quantizer>> {
    let names = registry().names();
    let mut specs: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    specs.extend(
        VARIANTS
            .iter()
            .filter(|v| names.contains(&v.split(':').next().unwrap()))
            .map(|v| v.to_string()),
    );
    specs
        .iter()
        .map(|s| {
            registry()
                .parse_spec(s, Usage::BOTH)
                .or_else(|_| registry().parse_spec(s, Usage::ROWWISE))
                .unwrap_or_else(|e| panic!("{s}: {e}"))
        })
        .collect()
}

/// Deterministic weight-like data with an outlier column and a few exact zeros.
fn data(n: usize, k: usize, seed: u32) -> Vec<f32> {
    let mut rng = XorShift32::new(seed.wrapping_mul(2_654_435_761).wrapping_add(1));
    (0..n * k)
        .map(|i| {
            let s = rng.next_u32();
            let u = (s as f32 / u32::MAX as f32) - 0.5;
            if i % 97 == 0 {
                0.0
            } else if i % k == 3 {
                u * 40.0
            } else {
                u
            }
        })
        .collect()
}

const SHAPE: [usize; 2] = [256, 512];

fn sqnr_db(x: &[f32], y: &[f32]) -> f64 {
    let (mut s, mut n) = (0f64, 0f64);
    for (&a, &b) in x.iter().zip(y) {
        s += f64::from(a).powi(2);
        n += (f64::from(a) - f64::from(b)).powi(2);
    }
    10.0 * (s / n).log10()
}

fn assert_same_bytes(a: &dyn Storage, b: &dyn Storage) {
    let spec = a.quantizer().spec();
    assert_eq!(a.shape(), b.shape(), "{spec}");
    assert_eq!(a.buffers().len(), b.buffers().len(), "{spec}");
    for (x, y) in a.buffers().iter().zip(b.buffers()) {
        assert_eq!(x.desc(), y.desc(), "{spec}");
        assert!(
            x.bytes() == y.bytes(),
            "{spec}: buffer {} differs",
            x.name()
        );
    }
}

#[test]
fn quantizers_are_send_sync_and_storages_too() {
    fn check<T: Send + Sync + ?Sized>() {}
    check::<dyn Quantizer>();
    check::<dyn Storage>();
    check::<AnyQuantizer>();
    check::<AnyStorage>();
}

#[test]
fn buffers_match_the_description_and_the_prototype() {
    for q in quantizers() {
        let w = data(SHAPE[0], SHAPE[1], 1);
        let x = HostTensor::f32(&w, &SHAPE).unwrap();
        let s = q.quantize(&x).unwrap();
        let want = q.buffers(x.shape()).unwrap();
        let got: Vec<_> = s.buffers().iter().map(|b| b.desc().clone()).collect();
        assert_eq!(got, want, "{}", q.spec());
        let proto = TensorProto::new(&SHAPE, DType::F32, q.as_ref()).unwrap();
        assert_eq!(proto.nbytes().unwrap(), s.nbytes(), "{}", q.spec());
        assert_eq!(proto.buffers().unwrap(), want);
        assert_eq!(TensorProto::from_storage(&*s), proto, "{}", q.spec());
        assert_eq!(s.proto(), proto);
    }
}

#[test]
fn dequantize_is_close_for_f32_bf16_f16_inputs() {
    for q in quantizers() {
        let w = data(SHAPE[0], SHAPE[1], 2);
        let inputs = [
            HostTensor::f32(&w, &SHAPE).unwrap(),
            HostTensor::f32(&w, &SHAPE)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap(),
            HostTensor::f32(&w, &SHAPE)
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap(),
        ];
        for x in &inputs {
            let s = q.quantize(x).unwrap();
            assert_eq!(s.dtype(), x.dtype());
            let exact = x.to_f32_vec();
            for dir in [Direction::Rowwise, Direction::Columnwise] {
                if !s.usage().has(dir) {
                    continue;
                }
                for out in [DType::F32, DType::BF16, DType::F16] {
                    let y = s.dequantize(dir, out).unwrap();
                    assert_eq!(y.shape(), x.shape());
                    assert_eq!(y.dtype(), out);
                    let y = y.to_f32_vec();
                    assert!(y.iter().all(|v| v.is_finite()), "{} {dir}", q.spec());
                    let db = sqnr_db(&exact, &y);
                    assert!(
                        db > 10.0,
                        "{} {dir} {}: SQNR {db:.1} dB",
                        q.spec(),
                        x.dtype()
                    );
                }
            }
        }
    }
}

#[test]
fn flatten_unflatten_is_identity() {
    for q in quantizers() {
        let w = data(SHAPE[0], SHAPE[1], 3);
        let s = q.quantize(&HostTensor::f32(&w, &SHAPE).unwrap()).unwrap();
        // Rebuild from copies of (name, dtype, shape, bytes), in reverse order.
        let bufs: Vec<Buffer> = s
            .buffers()
            .iter()
            .rev()
            .map(|b| Buffer::from_bytes(b.desc().clone(), b.bytes()).unwrap())
            .collect();
        let t = registry()
            .unflatten(
                s.format_name(),
                &s.quantizer().options().unwrap(),
                s.shape(),
                s.dtype(),
                bufs,
            )
            .unwrap();
        assert_same_bytes(&*s, &*t);
        assert!(t.quantizer().dyn_eq(s.quantizer()));
        assert_eq!(t.dequantize_f32().unwrap(), s.dequantize_f32().unwrap());
    }
}

#[test]
fn unflatten_refuses_mismatched_buffers() {
    for q in quantizers() {
        let w = data(SHAPE[0], SHAPE[1], 4);
        let s = q.quantize(&HostTensor::f32(&w, &SHAPE).unwrap()).unwrap();
        let opts = s.quantizer().options().unwrap();
        let copy = |b: &Buffer| Buffer::from_bytes(b.desc().clone(), b.bytes()).unwrap();
        // A missing buffer.
        let mut bufs: Vec<Buffer> = s.buffers().iter().map(copy).collect();
        let gone = bufs.pop().unwrap();
        let e = registry()
            .unflatten(s.format_name(), &opts, s.shape(), s.dtype(), bufs)
            .unwrap_err();
        assert!(e.to_string().contains(gone.name()), "{e}");
        // A buffer with the wrong shape (same byte count).
        let mut bufs: Vec<Buffer> = s.buffers().iter().map(copy).collect();
        let b0 = &bufs[0];
        let mut d = b0.desc().clone();
        let n: usize = d.shape.iter().product();
        d.shape = vec![n];
        if d.shape != b0.shape() {
            bufs[0] = Buffer::from_bytes(d, b0.bytes()).unwrap();
            let e = registry()
                .unflatten(s.format_name(), &opts, s.shape(), s.dtype(), bufs)
                .unwrap_err();
            assert!(e.to_string().contains("shape"), "{e}");
        }
        // An extra, unknown buffer.
        let mut bufs: Vec<Buffer> = s.buffers().iter().map(copy).collect();
        bufs.push(Buffer::from_slice::<u8>("bogus", &[1], &[0]).unwrap());
        let e = registry()
            .unflatten(s.format_name(), &opts, s.shape(), s.dtype(), bufs)
            .unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }
}

#[test]
fn save_load_round_trips_and_plain_tensors_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    for (i, q) in quantizers().into_iter().enumerate() {
        let w = data(SHAPE[0], SHAPE[1], 5);
        let x = HostTensor::f32(&w, &SHAPE)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let s = q.quantize(&x).unwrap();
        let path = dir.path().join(format!("t{i}.safetensors"));
        save(&path, &[("layer.weight", &s)]).unwrap();
        let f = load(&path).unwrap();
        match f.get("layer.weight") {
            Some(Loaded::Quantized(t)) => {
                assert_same_bytes(&*s, &**t);
                assert_eq!(t.dtype(), DType::BF16);
                let any = AnyStorage::from_box(t.clone()).unwrap();
                assert_eq!(any.format_name(), q.format_name());
            }
            other => panic!("{}: {other:?}", q.spec()),
        }
        // Bytes round-trip through memory too.
        let bytes = std::fs::read(&path).unwrap();
        assert!(load_bytes(&bytes).is_ok());
    }
}

#[test]
fn file_with_a_wrong_buffer_is_refused_with_a_clear_message() {
    let q = &quantizers()[0];
    let w = data(64, 128, 6);
    let s = q
        .quantize(&HostTensor::f32(&w, &[64, 128]).unwrap())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    save(&path, &[("w", &s)]).unwrap();
    // Re-write the file with the first buffer reshaped (same bytes, different shape).
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    let first = &s.buffers()[0];
    let old = format!("{:?}", first.shape()).replace(' ', "");
    let numel: usize = first.shape().iter().product();
    let new = format!("[{numel}]");
    assert!(header.contains(&old), "{header}");
    let patched = header.replacen(&old, &new, 1);
    let mut out = Vec::new();
    let pad = (8 - (patched.len() % 8)) % 8;
    let h = format!("{patched}{}", " ".repeat(pad));
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    let e = load_bytes(&out).unwrap_err().to_string();
    assert!(e.contains(first.name()) && e.contains("shape"), "{e}");
}

#[test]
fn quantize_into_reuses_the_allocation_and_gives_the_same_bytes() {
    for q in quantizers() {
        let a = data(SHAPE[0], SHAPE[1], 7);
        let b = data(SHAPE[0], SHAPE[1], 8);
        let xa = HostTensor::f32(&a, &SHAPE).unwrap();
        let xb = HostTensor::f32(&b, &SHAPE).unwrap();
        let mut s = q.quantize(&xa).unwrap();
        q.quantize_into(&xb, &mut *s).unwrap();
        let fresh = q.quantize(&xb).unwrap();
        assert_same_bytes(&*s, &*fresh);
        let mut empty = q
            .allocate(&Shape::new(&SHAPE).unwrap(), DType::F32)
            .unwrap();
        q.quantize_into(&xb, &mut *empty).unwrap();
        assert_same_bytes(&*empty, &*fresh);
    }
}

#[test]
fn usage_changes_drop_or_derive_consistently() {
    for q in quantizers() {
        if !(q.usage().rowwise && q.usage().columnwise) {
            continue;
        }
        let w = data(SHAPE[0], SHAPE[1], 9);
        let x = HostTensor::f32(&w, &SHAPE).unwrap();
        let both = q.quantize(&x).unwrap();
        for keep in [Usage::ROWWISE, Usage::COLUMNWISE] {
            let mut s = both.clone();
            if let Err(e) = s.update_usage(keep) {
                // Some recipes cannot exist with only one direction (e.g. row-scaled NVFP4
                // requires rowwise); the refusal must be the same as quantizing that way.
                assert!(matches!(e, Error::Unsupported { .. }), "{}: {e}", q.spec());
                assert!(q.with_usage(keep).quantize(&x).is_err());
                assert_eq!(
                    s.usage(),
                    Usage::BOTH,
                    "a refused change leaves the tensor as it was"
                );
                continue;
            }
            assert_eq!(s.usage(), keep);
            let only = q.with_usage(keep).quantize(&x).unwrap();
            assert_same_bytes(&*s, &*only);
            // Deriving back either works and equals the original, or is refused.
            match s.update_usage(Usage::BOTH) {
                Ok(()) => assert_same_bytes(&*s, &*both),
                Err(e) => assert!(matches!(e, Error::Unsupported { .. }), "{e}"),
            }
        }
        let mut s = both.clone();
        assert!(
            s.update_usage(Usage {
                rowwise: false,
                columnwise: false
            })
            .is_err()
        );
    }
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    for q in quantizers() {
        // Shapes that break most rules, an empty tensor and a rank-1 tensor.
        for dims in [
            vec![3usize, 5],
            vec![0, 16],
            vec![7],
            vec![1, 1],
            vec![100, 100],
        ] {
            let n: usize = dims.iter().product();
            let v = vec![1.0f32; n];
            let x = HostTensor::f32(&v, &dims).unwrap();
            match q.quantize(&x) {
                Ok(s) => assert_eq!(s.shape().dims(), &dims[..]),
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
        // Non-finite values follow the format's saturation rules; nothing panics.
        let mut v = data(SHAPE[0], SHAPE[1], 10);
        v[0] = f32::NAN;
        v[1] = f32::INFINITY;
        v[2] = f32::NEG_INFINITY;
        v[600] = 1e-42;
        let x = HostTensor::f32(&v, &SHAPE).unwrap();
        if let Ok(s) = q.quantize(&x) {
            let _ = s.dequantize_f32().unwrap();
        }
        // Wrong destination for quantize_into.
        let other = quantizers()
            .into_iter()
            .find(|o| o.format_name() != q.format_name());
        if let Some(o) = other {
            let w = data(SHAPE[0], SHAPE[1], 11);
            let x = HostTensor::f32(&w, &SHAPE).unwrap();
            let mut dst = o.quantize(&x).unwrap();
            assert!(q.quantize_into(&x, &mut *dst).is_err());
        }
    }
}

/// Misuse of a storage through the traits is an error that names the argument: a
/// destination of another shape, an output one element short or long, a reversed or
/// overflowing row range.
#[test]
fn storage_misuse_is_an_error_naming_the_argument() {
    let has = |r: Result<(), quantfmt::Error>, what: &str, needle: &str| match r {
        Ok(()) => panic!("{what}: accepted"),
        Err(e) => assert!(
            e.to_string().contains(needle),
            "{what}: `{e}` lacks `{needle}`"
        ),
    };
    for q in quantizers() {
        let spec = q.spec();
        let w = data(SHAPE[0], SHAPE[1], 12);
        let x = HostTensor::f32(&w, &SHAPE).unwrap();
        let half = Shape::new(&[SHAPE[0] / 2, SHAPE[1]]).unwrap();
        let mut small = q.allocate(&half, DType::F32).unwrap();
        has(
            q.quantize_into(&x, &mut *small),
            &format!("{spec} quantize_into"),
            "`x`",
        );
        let s = q.quantize(&x).unwrap();
        let n = SHAPE[0] * SHAPE[1];
        let dir = if q.usage().rowwise {
            Direction::Rowwise
        } else {
            Direction::Columnwise
        };
        for len in [n - 1, n + 16] {
            let mut out = vec![0f32; len];
            let r = s.dequantize_into(dir, quantfmt::HostDataMut::from(&mut out[..]));
            has(r, &format!("{spec} dequantize_into {len}"), "`out`");
        }
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = s.slice_dim0(40..20).map(|_| ());
        has(reversed, &format!("{spec} slice 40..20"), "`range`");
        let huge = s
            .gather_dim0(std::slice::from_ref(&(0..usize::MAX)))
            .map(|_| ());
        has(huge, &format!("{spec} gather 0..MAX"), "`range`");
    }
}

#[test]
fn any_quantizer_serializes_through_the_registry() {
    for q in quantizers() {
        let any = AnyQuantizer::from_dyn(q.as_ref()).unwrap();
        let json = serde_json::to_string(&any).unwrap();
        let back: AnyQuantizer = serde_json::from_str(&json).unwrap();
        assert_eq!(back, any);
        assert_eq!(back.spec(), q.spec());
        let respec: quantfmt::FormatSpec = q.spec().parse().unwrap();
        let again = respec.quantizer(q.usage()).unwrap();
        assert_eq!(
            again,
            any,
            "{} does not round-trip through its spec",
            q.spec()
        );
    }
}

// ---------------------------------------------------------------------------------------
// Grouped storage: the same contract for every format.

fn member_inputs(shapes: &[[usize; 2]], seed: u32) -> Vec<Vec<f32>> {
    shapes
        .iter()
        .enumerate()
        .map(|(i, s)| data(s[0], s[1], seed + i as u32))
        .collect()
}

fn check_grouped_equals_members(q: &dyn Quantizer, shapes: &[[usize; 2]]) {
    let vals = member_inputs(shapes, 20);
    let xs: Vec<HostTensor<'_>> = vals
        .iter()
        .zip(shapes)
        .map(|(v, s)| HostTensor::f32(v, s).unwrap())
        .collect();
    let g = q.quantize_grouped_list(&xs).unwrap();
    assert_eq!(g.num_members(), shapes.len());
    // One contiguous input gives the same bytes as the list.
    let flat: Vec<f32> = vals.concat();
    let shp: Vec<Shape> = shapes.iter().map(|s| Shape::new(s).unwrap()).collect();
    let g2 = q
        .quantize_grouped(&HostTensor::f32(&flat, &[flat.len()]).unwrap(), &shp)
        .unwrap();
    for (a, b) in g.buffers().iter().zip(g2.buffers()) {
        assert!(a.bytes() == b.bytes(), "{} {}", q.spec(), a.name());
    }
    // Grouped bytes == concatenation of quantizing each member alone.
    let alone: Vec<_> = xs.iter().map(|x| q.quantize(x).unwrap()).collect();
    for (bi, gb) in g.buffers().iter().enumerate() {
        let offs = g.byte_offsets(gb.name()).unwrap();
        assert_eq!(offs.len(), shapes.len() + 1);
        assert_eq!(*offs.last().unwrap(), gb.nbytes());
        for (i, alone) in alone.iter().enumerate() {
            let mb = &alone.buffers()[bi];
            assert_eq!(mb.name(), gb.name());
            assert!(
                &gb.bytes()[offs[i]..offs[i + 1]] == mb.bytes(),
                "{}: member {i} buffer {} differs from quantizing it alone",
                q.spec(),
                gb.name()
            );
        }
    }
    // Members are zero-copy views that behave like any storage.
    for (i, (x, alone)) in xs.iter().zip(&alone).enumerate() {
        let m = g.member(i).unwrap();
        assert_eq!(m.shape(), x.shape());
        for (mb, gb) in m.buffers().iter().zip(g.buffers()) {
            assert!(
                mb.host().shares_allocation(gb.host()),
                "member {i} is a view"
            );
        }
        assert_eq!(m.dequantize_f32().unwrap(), alone.dequantize_f32().unwrap());
        assert_eq!(m.proto(), alone.proto());
    }
    let offs = g.element_offsets();
    assert_eq!(offs[0], 0);
    assert_eq!(*offs.last().unwrap(), flat.len());
}

#[test]
fn grouped_uniform_and_varying_first_dims_equal_their_members() {
    for q in quantizers() {
        check_grouped_equals_members(q.as_ref(), &[[128, 256], [128, 256], [128, 256]]);
        check_grouped_equals_members(q.as_ref(), &[[256, 256], [128, 256], [384, 256]]);
    }
}

#[test]
fn grouped_varying_last_and_both_dims() {
    for q in quantizers() {
        check_grouped_equals_members(q.as_ref(), &[[128, 256], [128, 512]]);
        check_grouped_equals_members(q.as_ref(), &[[128, 256], [256, 512], [128, 128]]);
    }
}

#[test]
fn grouped_save_load_round_trip_and_offsets_are_checked() {
    use quantfmt::io::{SaveItem, save_items};
    let dir = tempfile::tempdir().unwrap();
    for (qi, q) in quantizers().into_iter().enumerate() {
        let shapes = [[256, 256], [128, 256]];
        let vals = member_inputs(&shapes, 30);
        let xs: Vec<HostTensor<'_>> = vals
            .iter()
            .zip(&shapes)
            .map(|(v, s)| HostTensor::f32(v, s).unwrap())
            .collect();
        let g = q.quantize_grouped_list(&xs).unwrap();
        let path = dir.path().join(format!("g{qi}.safetensors"));
        save_items(
            &path,
            &[("experts".to_string(), SaveItem::Grouped(&*g))],
            &Default::default(),
        )
        .unwrap();
        let f = load(&path).unwrap();
        let Some(Loaded::Grouped(h)) = f.get("experts") else {
            panic!("{}: grouped tensor not loaded back", q.spec());
        };
        assert_eq!(h.member_shapes(), g.member_shapes());
        for (a, b) in g.buffers().iter().zip(h.buffers()) {
            assert!(a.bytes() == b.bytes());
        }
        // Tamper with the stored element offsets: refused with the rule.
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
        let total = 256 * 256 + 128 * 256;
        let bad = header.replacen(
            &format!("element_offsets\\\":[0,65536,{total}]"),
            &format!("element_offsets\\\":[0,65535,{total}]"),
            1,
        );
        assert_ne!(bad, header, "{header}");
        let mut out = (bad.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(bad.as_bytes());
        out.extend_from_slice(&bytes[8 + n..]);
        let e = load_bytes(&out).unwrap_err().to_string();
        assert!(e.contains("element_offsets"), "{e}");
    }
}

/// A member with zero rows (an expert that received no tokens) is allowed in a grouped
/// tensor of every format (`GroupLayout::new`'s rule): its data takes no bytes, its
/// neighbours are quantized as if alone, and its view has the shape `[0, K]`.
#[test]
fn grouped_members_may_have_zero_rows() {
    for q in quantizers() {
        let (a, b) = (data(128, 256, 3), data(256, 256, 4));
        let xs = [
            HostTensor::f32(&a, &[128, 256]).unwrap(),
            HostTensor::f32(&[], &[0, 256]).unwrap(),
            HostTensor::f32(&b, &[256, 256]).unwrap(),
        ];
        let g = q
            .quantize_grouped_list(&xs)
            .unwrap_or_else(|e| panic!("{}: {e}", q.spec()));
        assert_eq!(g.num_members(), 3);
        let alone = [
            (0, q.quantize(&xs[0]).unwrap()),
            (2, q.quantize(&xs[2]).unwrap()),
        ];
        for gb in g.buffers() {
            let offs = g.byte_offsets(gb.name()).unwrap();
            // Its data takes no bytes (a per-tensor scale still has its slot).
            if gb.name().contains("data") || gb.name().contains("weight") {
                assert_eq!(
                    offs[1],
                    offs[2],
                    "{}: {} of the empty member",
                    q.spec(),
                    gb.name()
                );
            }
            for (i, a) in &alone {
                let mb = a.buffer(gb.name()).unwrap();
                assert!(
                    &gb.bytes()[offs[*i]..offs[i + 1]] == mb.bytes(),
                    "{}: member {i} buffer {} differs from quantizing it alone",
                    q.spec(),
                    gb.name()
                );
            }
        }
        let empty = g.member(1).unwrap();
        assert_eq!(empty.shape().dims(), &[0, 256], "{}", q.spec());
        assert_eq!(g.element_offsets(), &[0, 128 * 256, 128 * 256, 384 * 256]);
    }
}

#[test]
fn grouped_errors_name_the_member() {
    for q in quantizers() {
        let a = data(128, 256, 1);
        let b = data(128, 256, 2);
        let x = HostTensor::f32(&a, &[128, 256]).unwrap();
        let y = HostTensor::f32(&b, &[128, 256])
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let e = q
            .quantize_grouped_list(&[x.clone(), y])
            .unwrap_err()
            .to_string();
        assert!(e.contains("member 1"), "{e}");
        assert!(q.quantize_grouped_list(&[]).is_err());
        let shp = [
            Shape::new(&[128, 256]).unwrap(),
            Shape::new(&[128, 256]).unwrap(),
        ];
        let e = q.quantize_grouped(&x, &shp).unwrap_err().to_string();
        assert!(e.contains("elements"), "{e}");
    }
}

// ---------------------------------------------------------------------------------------
// Slicing, GLU interleave and sharded quantization.

use quantfmt::glu::{
    deinterleave_glu, deinterleave_glu_storage, interleave_glu, interleave_glu_storage,
};
use quantfmt::parallel::InProcessGroup;

#[test]
fn sharded_quantization_agrees_with_the_whole_tensor() {
    let (m, k) = (1024, 256);
    let w = data(m, k, 40);
    let whole_x = HostTensor::f32(&w, &[m, k]).unwrap();
    for q in quantizers() {
        let whole = q.quantize(&whole_x).unwrap();
        for ranks in [2usize, 4, 8] {
            let rows = m / ranks;
            let group = InProcessGroup::new(ranks).unwrap();
            let shards: Vec<quantfmt::Result<Box<dyn Storage>>> = std::thread::scope(|s| {
                let handles: Vec<_> = group
                    .iter()
                    .enumerate()
                    .map(|(r, rank)| {
                        let q = &q;
                        let w = &w;
                        s.spawn(move || {
                            let part = &w[r * rows * k..(r + 1) * rows * k];
                            let x = HostTensor::f32(part, &[rows, k]).unwrap();
                            q.quantize_reduced(&x, rank)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            if let Some(Err(e)) = shards.iter().find(|s| s.is_err()) {
                assert!(matches!(e, Error::Unsupported { .. }), "{}: {e}", q.spec());
                assert!(
                    shards.iter().all(|s| s.is_err()),
                    "{}: ranks disagree",
                    q.spec()
                );
                continue;
            }
            for (r, shard) in shards.iter().map(|s| s.as_ref().unwrap()).enumerate() {
                let cut = whole
                    .slice_dim0(r * rows..(r + 1) * rows)
                    .unwrap_or_else(|e| panic!("{}: slicing the whole tensor: {e}", q.spec()));
                assert_same_bytes(&**shard, &*cut);
            }
        }
    }
}

#[test]
fn glu_interleave_round_trips_on_plain_and_quantized_tensors() {
    let (m, k) = (1024, 256);
    let w = data(m, k, 41);
    let x = HostTensor::f32(&w, &[m, k]).unwrap();
    for q in quantizers() {
        let block = 128;
        let s = q.quantize(&x).unwrap();
        let inter = interleave_glu_storage(&*s, block).unwrap();
        let back = deinterleave_glu_storage(&*inter, block).unwrap();
        assert_same_bytes(&*s, &*back);
        // Moving quantized rows equals quantizing the moved rows.
        let xi = interleave_glu(&x, block).unwrap();
        let direct = q.quantize(&xi).unwrap();
        assert_same_bytes(&*inter, &*direct);
        assert_eq!(deinterleave_glu(&xi, block).unwrap().to_f32_vec(), w);
    }
}

#[test]
fn misaligned_row_moves_are_refused_with_the_rule() {
    let w = data(512, 256, 42);
    let x = HostTensor::f32(&w, &[512, 256]).unwrap();
    for q in quantizers() {
        let s = q.quantize(&x).unwrap();
        let e = interleave_glu_storage(&*s, 3).unwrap_err().to_string();
        assert!(e.contains("512") && e.contains('6'), "{}: {e}", q.spec());
        let e = interleave_glu_storage(&*s, 0).unwrap_err().to_string();
        assert!(e.contains("interleave_size"), "{e}");
        assert!(s.slice_dim0(0..600).is_err());
        // A cut at row 1 is fine for per-row scales and refused for row blocks.
        match s.slice_dim0(0..1) {
            Ok(t) => assert_eq!(t.shape().dims(), &[1, 256]),
            Err(e) => assert!(e.to_string().contains("multiples of"), "{}: {e}", q.spec()),
        }
    }
}

#[test]
fn plan_linear_answers_shapes_usages_and_bytes() {
    use quantfmt::plan::{Parallelism, plan_linear};
    let q = registry().parse_spec("fp8", Usage::ROWWISE).unwrap();
    let x = TensorProto::new(&[512, 4, 1024], DType::BF16, q.as_ref()).unwrap();
    let w = TensorProto::new(&[2816, 1024], DType::BF16, q.as_ref()).unwrap();
    let p = plan_linear(&x, &w, q.as_ref(), true, Parallelism::None).unwrap();
    assert_eq!(p.output_shape, vec![512, 4, 2816]);
    assert_eq!(p.weight.dgrad, Some(Usage::COLUMNWISE));
    assert_eq!(p.input.wgrad, Some(Usage::COLUMNWISE));
    assert_eq!(p.grad_output.proto.shape().dims(), &[512, 4, 2816]);
    // Saved: x and W columnwise (fp8: transposed data + shared scale).
    assert_eq!(p.saved_bytes, 512 * 4 * 1024 + 4 + 2816 * 1024 + 4);
    assert_eq!(
        p.total_bytes,
        x.with_usage(Usage::BOTH).unwrap().nbytes().unwrap()
            + w.with_usage(Usage::BOTH).unwrap().nbytes().unwrap()
            + p.grad_output.proto.nbytes().unwrap()
            + 2816 * 2
            + 512 * 4 * 2816 * 2
    );
    // Column-parallel with sequence parallelism gathers the input's leading dim.
    let p = plan_linear(
        &x,
        &w,
        q.as_ref(),
        false,
        Parallelism::Column {
            tp: 4,
            sequence_parallel: true,
        },
    )
    .unwrap();
    assert_eq!(p.gemm_input_shape, vec![2048, 4, 1024]);
    assert_eq!(p.output_shape, vec![2048, 4, 2816]);
    // Row-parallel with sequence parallelism scatters the output's leading dim.
    let p = plan_linear(
        &x,
        &w,
        q.as_ref(),
        false,
        Parallelism::Row {
            tp: 4,
            sequence_parallel: true,
        },
    )
    .unwrap();
    assert_eq!(p.output_shape, vec![128, 4, 2816]);
    // K mismatch is named.
    let bad = TensorProto::new(&[16, 1000], DType::BF16, q.as_ref()).unwrap();
    let e = plan_linear(&bad, &w, q.as_ref(), false, Parallelism::None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("K = 1024"), "{e}");
}
