//! MXFP8 through the facade: spec parsing, static and dynamic dispatch, files, protos.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use quantfmt::io::Loaded;
use quantfmt::{
    AnyQuantizer, AnyStorage, DType, Direction, FormatSpec, HostTensor, Mxfp8Quantizer,
    Mxfp8Tensor, Quantizer, ScaleLayout, ScaleRule, Shape, TensorProto, Usage,
};

fn data(m: usize, k: usize) -> Vec<f32> {
    (0..m * k)
        .map(|i| ((i * 37 % 1009) as f32 - 504.0) / 13.0)
        .collect()
}

#[test]
fn spec_strings_reach_the_mxfp8_quantizer() {
    assert!(quantfmt::registry().names().contains(&"mxfp8"));
    let spec: FormatSpec = "mxfp8:e5m2,swizzled".parse().unwrap();
    let q = spec.quantizer(Usage::BOTH).unwrap();
    let AnyQuantizer::Mxfp8(inner) = &q else {
        panic!("{q:?}")
    };
    assert_eq!(inner.scale_layout(), ScaleLayout::Swizzled);
    assert_eq!(Quantizer::spec(&q), "mxfp8:e5m2,swizzled");
    let e = "mxfp8:fp4".parse::<FormatSpec>().unwrap_err();
    assert!(
        e.to_string()
            .contains("valid options: e4m3, e5m2, 2d, ocp, swizzled"),
        "{e}"
    );
    let x = data(100, 32);
    let e = q
        .quantize(&HostTensor::f32(&x, &[100, 32]).unwrap())
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.to_string(), "mxfp8: M=100 must be a multiple of 32");
}

#[test]
fn static_and_dynamic_dispatch_agree_and_files_round_trip() {
    let x = data(160, 96);
    let xt = HostTensor::f32(&x, &[160, 96]).unwrap();
    let q = "mxfp8:2d,ocp"
        .parse::<FormatSpec>()
        .unwrap()
        .quantizer(Usage::BOTH)
        .unwrap();
    let any = q.quantize(&xt).unwrap();
    let AnyStorage::Mxfp8(t) = &any else {
        panic!("variant")
    };
    let direct = Mxfp8Quantizer::new(Usage::BOTH)
        .with_2d(true)
        .with_scale_rule(ScaleRule::Ocp)
        .quantize(&xt)
        .unwrap();
    for b in direct.buffers() {
        assert_eq!(t.buffer(b.name()).unwrap().bytes(), b.bytes());
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.q.safetensors");
    quantfmt::io::save(&path, &[("w", &direct)]).unwrap();
    let loaded = quantfmt::io::load(&path).unwrap();
    let Some(Loaded::Quantized(s)) = loaded.get("w") else {
        panic!("missing")
    };
    assert_eq!(s.format_name(), "mxfp8");
    assert_eq!(s.quantizer().spec(), "mxfp8:2d,ocp");
    let back = s.as_any().downcast_ref::<Mxfp8Tensor>().unwrap();
    // 2d: the columnwise operand holds the rowwise values.
    assert_eq!(
        back.dequantize_as::<f32>(Direction::Columnwise).unwrap(),
        direct.dequantize_as::<f32>(Direction::Rowwise).unwrap()
    );
}

#[test]
fn protos_plan_mxfp8_buffers() {
    let q = "mxfp8"
        .parse::<FormatSpec>()
        .unwrap()
        .quantizer(Usage::BOTH)
        .unwrap();
    let proto = TensorProto::new(&[4096, 11008], DType::BF16, &q).unwrap();
    let bufs = proto.buffers().unwrap();
    assert_eq!(bufs[1].shape, [4096, 344]);
    assert_eq!(bufs[3].shape, [128, 11008]);
    assert_eq!(
        proto.nbytes().unwrap(),
        2 * 4096 * 11008 + 4096 * 344 + 128 * 11008
    );
    // Quantize into a pre-allocated (zeroed) storage through the trait objects.
    let small = q.with_usage(Usage::ROWWISE);
    let mut t = small
        .allocate(&Shape::new(&[4096, 64]).unwrap(), DType::F32)
        .unwrap();
    let x = data(4096, 64);
    small
        .quantize_into(&HostTensor::f32(&x, &[4096, 64]).unwrap(), &mut *t)
        .unwrap();
    assert_eq!(t.dequantize_f32().unwrap().len(), 4096 * 64);
}
