//! NVFP4 through the facade: spec parsing, static and dynamic dispatch, prototypes, files.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use quantfmt::{
    AnyQuantizer, AnyStorage, DType, FormatSpec, HostTensor, Quantizer, Storage, TensorProto, Usage,
};

#[test]
fn nvfp4_is_registered_and_round_trips_through_a_file() {
    let spec: FormatSpec = "nvfp4:2d,swizzled".parse().unwrap();
    let q = spec.quantizer(Usage::BOTH).unwrap();
    assert!(matches!(q, AnyQuantizer::Nvfp4(_)));
    assert_eq!(q.spec(), "nvfp4:2d,swizzled");
    let x: Vec<f32> = (0..64 * 48)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0)
        .collect();
    let stored = q
        .quantize(&HostTensor::f32(&x, &[64, 48]).unwrap())
        .unwrap();
    assert!(matches!(stored, AnyStorage::Nvfp4(_)));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.q.safetensors");
    quantfmt::io::save(&path, &[("w", &stored)]).unwrap();
    let loaded = quantfmt::io::load(&path).unwrap();
    let Some(quantfmt::io::Loaded::Quantized(back)) = loaded.get("w") else {
        panic!("w was not loaded as a quantized tensor");
    };
    assert_eq!(back.quantizer().spec(), "nvfp4:2d,swizzled");
    assert_eq!(
        back.dequantize_f32().unwrap(),
        stored.dequantize_f32().unwrap()
    );
}

#[test]
fn nvfp4_errors_and_plans_through_the_facade() {
    let e = "nvfp4:2d,rht"
        .parse::<FormatSpec>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("rht with 2d is not supported"), "{e}");
    let e = "nvfp4:3d".parse::<FormatSpec>().unwrap_err().to_string();
    assert!(e.contains("valid options: 1d, 2d, rht, sr"), "{e}");
    let q = "nvfp4"
        .parse::<FormatSpec>()
        .unwrap()
        .boxed(Usage::BOTH)
        .unwrap();
    let proto = TensorProto::new(&[4096, 11008], DType::BF16, &*q).unwrap();
    // data: 2 x 4096*11008/2; scales: [4096, 688] + [11008, 256]; amaxes: 2 x 4 bytes
    assert_eq!(
        proto.nbytes().unwrap(),
        4096 * 11008 + 4096 * 688 + 11008 * 256 + 8
    );
    let e = q
        .check_shape(&quantfmt::Shape::new(&[16, 100]).unwrap())
        .unwrap_err();
    assert_eq!(e.to_string(), "nvfp4: K=100 must be a multiple of 16");
}
