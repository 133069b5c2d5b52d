//! native -> layout -> native round trips, in memory: byte-identical buffers, spec and
//! dtype where the layout holds the recipe (with the sidecar), and the documented
//! losses where it does not.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use quant_core::io::{FileMeta, RawTensor};
use quantfmt::interop::config::CheckpointConfig;
use quantfmt::interop::{
    self, Extras, Imported, Item, Layout, Scheme, Sidecar, TensorDesc, plan_checkpoint, read_unit,
};
use quantfmt::{AnyStorage, FormatSpec, HostTensor, Storage, Usage};

fn weights(shape: &[usize], seed: u32) -> Vec<f32> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(40503));
            let u = (h >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            let boost = if i % 97 == 3 { 40.0 } else { 1.0 };
            u * 0.05 * boost
        })
        .collect()
}

fn quantize(spec: &str, usage: Usage, shape: &[usize], bf16: bool) -> AnyStorage {
    let q = spec
        .parse::<FormatSpec>()
        .unwrap()
        .quantizer(usage)
        .unwrap();
    let w = weights(shape, 7);
    if bf16 {
        let b: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
        q.quantize(&HostTensor::bf16(&b, shape).unwrap()).unwrap()
    } else {
        q.quantize(&HostTensor::f32(&w, shape).unwrap()).unwrap()
    }
}

struct Back {
    storage: AnyStorage,
    export_notes: Vec<String>,
    import_notes: Vec<String>,
    tensors: BTreeMap<String, RawTensor>,
}

fn round_trip(layout: Layout, name: &str, s: &AnyStorage, use_sidecar: bool) -> Back {
    let ex = interop::export(layout, name, s, &Extras::default()).unwrap();
    // The planned slots describe exactly what export wrote.
    let scheme = Scheme::of(&quantfmt::AnyQuantizer::from_dyn(s.quantizer()).unwrap()).unwrap();
    let slots =
        interop::export_slots(layout, name, scheme, s.shape().dims(), &Extras::default()).unwrap();
    assert_eq!(slots.len(), ex.tensors.len());
    for (slot, (n, t)) in slots.iter().zip(&ex.tensors) {
        assert_eq!(
            (&slot.name, slot.dtype, &slot.shape),
            (n, t.dtype, &t.shape)
        );
    }
    let tensors: BTreeMap<String, RawTensor> = ex.tensors.into_iter().collect();
    let mut sidecar = Sidecar::new();
    if use_sidecar {
        sidecar.tensors.insert(name.to_string(), ex.sidecar);
    }
    let imp = import(&tensors, name, &sidecar).unwrap();
    Back {
        storage: imp.storage,
        export_notes: ex.notes,
        import_notes: imp.notes,
        tensors,
    }
}

fn assert_identical(a: &AnyStorage, b: &AnyStorage) {
    assert_eq!(a.quantizer().spec(), b.quantizer().spec());
    assert_eq!(a.usage(), b.usage());
    assert_eq!(a.dtype(), b.dtype());
    assert_eq!(a.shape(), b.shape());
    let an: Vec<&str> = a.buffers().iter().map(|b| b.name()).collect();
    let bn: Vec<&str> = b.buffers().iter().map(|b| b.name()).collect();
    assert_eq!(an, bn);
    for (x, y) in a.buffers().iter().zip(b.buffers()) {
        assert!(x.bytes() == y.bytes(), "buffer {} differs", x.name());
    }
}

const CASES: &[(&str, &[usize])] = &[
    ("fp8", &[48, 96]),
    ("fp8:pow2", &[3, 40, 72]),
    ("fp8:eps=0.001", &[16, 16]),
    ("fp8-block", &[200, 300]),
    ("fp8-block:fp32-scales", &[130, 129]),
    ("fp8-block", &[2, 128, 200]),
    ("mxfp8", &[64, 96]),
    ("mxfp8:swizzled", &[160, 64]),
    ("mxfp8:ocp", &[32, 32]),
    ("nvfp4", &[48, 96]),
    ("nvfp4:2d", &[144, 64]),
    ("nvfp4:swizzled", &[32, 160]),
    ("nvfp4:4over6", &[64, 64]),
    ("nvfp4:4over6,e4m3max=256", &[64, 64]),
    ("nvfp4:sr,seed=5", &[16, 32]),
    ("nvfp4", &[2, 48, 64]),
];

fn layouts_for(spec: &str) -> Vec<Layout> {
    let s = spec
        .parse::<FormatSpec>()
        .unwrap()
        .quantizer(Usage::ROWWISE)
        .unwrap();
    let scheme = Scheme::of(&s).unwrap();
    [
        Layout::ModelOpt,
        Layout::CompressedTensors,
        Layout::DeepSeek,
    ]
    .into_iter()
    .filter(|l| l.holds(scheme))
    .collect()
}

#[test]
fn rowwise_round_trips_are_byte_identical_with_the_sidecar() {
    for &(spec, shape) in CASES {
        for bf16 in [false, true] {
            let s = quantize(spec, Usage::ROWWISE, shape, bf16);
            for layout in layouts_for(spec) {
                let back = round_trip(layout, "m.layers.0.proj.weight", &s, true);
                assert!(
                    back.import_notes.is_empty(),
                    "{spec} {layout}: {:?}",
                    back.import_notes
                );
                assert_identical(&s, &back.storage);
            }
        }
    }
}

#[test]
fn without_the_sidecar_codes_and_scales_survive_and_values_agree() {
    for &(spec, shape) in CASES {
        let s = quantize(spec, Usage::ROWWISE, shape, true);
        for layout in layouts_for(spec) {
            let back = round_trip(layout, "w.weight", &s, false);
            let b = &back.storage;
            // Data bytes always move unchanged.
            let data = |x: &AnyStorage| x.buffer("rowwise_data").unwrap().bytes().to_vec();
            assert_eq!(data(&s), data(b), "{spec} {layout}");
            // Values: exact for FP8/MXFP8 multipliers; NVFP4 within the rounding of
            // the tensor scalar's inverse (documented in docs/interop.md).
            let x = s.dequantize_f32().unwrap();
            let y = b.dequantize_f32().unwrap();
            let nvfp4 = spec.starts_with("nvfp4");
            for (i, (a, c)) in x.iter().zip(&y).enumerate() {
                if nvfp4 {
                    assert!(
                        (a - c).abs() <= a.abs() * 2e-6,
                        "{spec} {layout} [{i}]: {a} vs {c}"
                    );
                } else {
                    assert_eq!(a.to_bits(), c.to_bits(), "{spec} {layout} [{i}]");
                }
            }
            // Writing it again gives the same layout tensors bit for bit.
            let again = round_trip(layout, "w.weight", b, false);
            assert_eq!(
                again.tensors.keys().collect::<Vec<_>>(),
                back.tensors.keys().collect::<Vec<_>>()
            );
            for (n, t) in &back.tensors {
                assert_eq!(
                    t.data.as_slice(),
                    again.tensors[n].data.as_slice(),
                    "{spec} {layout} {n}"
                );
            }
        }
    }
}

#[test]
fn columnwise_copies_are_dropped_with_a_note_or_restored_when_derivable() {
    for (spec, shape, derivable) in [
        ("nvfp4:2d", &[64usize, 64][..], true),
        ("fp8", &[32, 48][..], true),
        ("fp8-block", &[130, 200][..], true),
        ("mxfp8:2d", &[64, 64][..], true),
        ("nvfp4", &[64, 64][..], false),
        ("nvfp4:rht", &[64, 64][..], false),
        ("mxfp8", &[64, 64][..], false),
    ] {
        let s = quantize(spec, Usage::BOTH, shape, true);
        for layout in layouts_for(spec) {
            let back = round_trip(layout, "w.weight", &s, true);
            let note = back
                .export_notes
                .iter()
                .find(|n| n.contains("columnwise"))
                .cloned();
            assert!(note.is_some(), "{spec}: {:?}", back.export_notes);
            if derivable {
                assert_identical(&s, &back.storage);
            } else {
                assert!(note.unwrap().contains("dropped"));
                assert_eq!(back.storage.usage(), Usage::ROWWISE);
                let mut row = s.clone();
                row.update_usage(Usage::ROWWISE).unwrap();
                assert_eq!(
                    row.buffers()
                        .iter()
                        .map(|b| b.bytes().to_vec())
                        .collect::<Vec<_>>(),
                    back.storage
                        .buffers()
                        .iter()
                        .map(|b| b.bytes().to_vec())
                        .collect::<Vec<_>>()
                );
            }
        }
    }
}

#[test]
fn swizzled_scales_are_reported_as_reordered() {
    let s = quantize("nvfp4:swizzled", Usage::ROWWISE, &[32, 64], true);
    let back = round_trip(Layout::ModelOpt, "w.weight", &s, true);
    assert!(
        back.export_notes.iter().any(|n| n.contains("swizzle")),
        "{:?}",
        back.export_notes
    );
}

#[test]
fn unrepresentable_recipes_are_refused_with_the_reason() {
    let cases = [
        ("fp8-block:1x128", Layout::DeepSeek, "1x128"),
        ("fp8:e5m2", Layout::ModelOpt, "E5M2"),
        ("nvfp4:row-scaled", Layout::CompressedTensors, "row-scaled"),
        ("nvfp4", Layout::DeepSeek, "holds FP8 128x128-block"),
        ("fp8-block", Layout::ModelOpt, "FP8 128x128-block"),
    ];
    for (spec, layout, want) in cases {
        let s = quantize(spec, Usage::ROWWISE, &[128, 128], true);
        let e = interop::export(layout, "w.weight", &s, &Extras::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{spec} -> {layout}: {e}");
    }
}

#[test]
fn input_scales_follow_each_convention() {
    let s = quantize("nvfp4", Usage::ROWWISE, &[32, 32], true);
    let extras = Extras {
        input_scale: Some(0.0123),
    };
    let mo = interop::export(Layout::ModelOpt, "a.weight", &s, &extras).unwrap();
    let get = |ts: &[(String, RawTensor)], n: &str| {
        let t = &ts.iter().find(|(k, _)| k == n).expect(n).1;
        f32::from_le_bytes(t.data.as_slice().try_into().unwrap())
    };
    assert_eq!(get(&mo.tensors, "a.input_scale"), 0.0123);
    let ct = interop::export(Layout::CompressedTensors, "a.weight", &s, &extras).unwrap();
    assert_eq!(get(&ct.tensors, "a.input_global_scale"), 1.0 / 0.0123f32);
    let ds = interop::export(
        Layout::DeepSeek,
        "a.weight",
        &quantize("fp8-block", Usage::ROWWISE, &[32, 32], true),
        &extras,
    )
    .unwrap();
    assert!(
        ds.notes.iter().any(|n| n.contains("dropped")),
        "{:?}",
        ds.notes
    );
}

/// Plans `tensors` (with `sidecar`) as a checkpoint, which must hold one unit, weight
/// `name`, and reads it; the reading's error as text.
fn import(
    tensors: &BTreeMap<String, RawTensor>,
    name: &str,
    sidecar: &Sidecar,
) -> Result<Imported, String> {
    let descs: Vec<TensorDesc> = tensors
        .iter()
        .map(|(n, t)| TensorDesc::new(n, t.dtype, &t.shape))
        .collect();
    let plan = plan_checkpoint(
        &descs,
        &FileMeta::default(),
        sidecar,
        &CheckpointConfig::default(),
    )
    .unwrap();
    let units: Vec<_> = plan
        .items
        .iter()
        .filter_map(|i| match i {
            Item::Unit(u) => Some(u),
            _ => None,
        })
        .collect();
    assert_eq!(units.len(), 1, "{:?}", plan.items);
    let u = units[0];
    assert_eq!(u.name, name);
    let mut fetch = |n: &str| Ok(tensors.get(n).cloned().expect(n));
    read_unit(u, &mut fetch, u.sidecar.as_ref()).map_err(|e| e.to_string())
}

/// An all-zero NVFP4 weight as its producers write it, dividing by its zero amax:
/// ModelOpt's `weight_scale_2 = 0` and compressed-tensors' `weight_global_scale = inf`
/// over NaN block scales. The import refuses it naming the scales and the scalar and
/// saying why; NaN block scales under an ordinary scalar get the generic refusal.
#[test]
fn all_zero_nvfp4_weights_are_refused_with_the_reason() {
    let s = quantize("nvfp4", Usage::ROWWISE, &[32, 64], true);
    let cases = [
        (Layout::ModelOpt, "w.weight_scale_2", 0.0f32),
        (
            Layout::CompressedTensors,
            "w.weight_global_scale",
            f32::INFINITY,
        ),
    ];
    for (layout, scalar_name, zero_amax) in cases {
        let ex = interop::export(layout, "w.weight", &s, &Extras::default()).unwrap();
        let exported: BTreeMap<String, RawTensor> = ex.tensors.into_iter().collect();
        let none = Sidecar::new();
        assert!(import(&exported, "w.weight", &none).is_ok(), "{layout:?}");
        for scalar in [zero_amax, 1.0] {
            let mut t = exported.clone();
            t.get_mut(scalar_name).expect(scalar_name).data =
                quant_core::HostBytes::copy_from(&scalar.to_le_bytes());
            let scales = t.get_mut("w.weight_scale").expect("w.weight_scale");
            scales.data = quant_core::HostBytes::copy_from(&vec![0x7F; scales.data.len()]);
            let Err(e) = import(&t, "w.weight", &none) else {
                panic!("{layout:?}: converted")
            };
            if scalar == zero_amax {
                assert!(
                    e.contains("w.weight_scale")
                        && e.contains(scalar_name)
                        && e.contains("amax is 0"),
                    "{layout:?}: {e}"
                );
            } else {
                // The caller (`quantfmt convert`) adds the weight's name to this one.
                assert!(
                    e.contains("not NaN") && !e.contains("amax is 0"),
                    "{layout:?}: {e}"
                );
            }
        }
    }
}
