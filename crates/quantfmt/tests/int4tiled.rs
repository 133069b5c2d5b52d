//! The int4 tiled format through the facade: spec parsing, static and dynamic dispatch,
//! and the native file round trip via the default registry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use quantfmt::fmt_int4tiled::{Int4TiledTensorExt, int4_linear};
use quantfmt::{AnyStorage, DType, Direction, FormatSpec, HostTensor, Quantizer, Storage, Usage};

#[test]
fn spec_quantize_save_load() {
    let spec: FormatSpec = "int4tiled:g64,k4,pad=torchao".parse().unwrap();
    let q = spec.quantizer(Usage::ROWWISE).unwrap();
    assert_eq!(q.spec(), "int4tiled:g64,k4,pad=torchao");
    let w: Vec<f32> = (0..20 * 256)
        .map(|i| ((i * 31) % 97) as f32 / 97.0 - 0.5)
        .collect();
    let x = HostTensor::f32(&w, &[20, 256]).unwrap();
    let stored = q.quantize(&x).unwrap();
    let AnyStorage::Int4Tiled(t) = &stored else {
        panic!("not an int4tiled storage")
    };
    assert_eq!((t.padded_n(), t.padded_k()), (24, 1024));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    quantfmt::io::save(&path, &[("w", &stored)]).unwrap();
    let loaded = quantfmt::io::load(&path).unwrap();
    let Some(quantfmt::io::Loaded::Quantized(back)) = loaded.get("w") else {
        panic!("w not loaded as quantized")
    };
    assert_eq!(back.format_name(), "int4tiled");
    assert_eq!(
        back.dequantize(Direction::Rowwise, DType::BF16)
            .unwrap()
            .as_bytes(),
        stored
            .dequantize(Direction::Rowwise, DType::BF16)
            .unwrap()
            .as_bytes()
    );
    let y = int4_linear(&HostTensor::f32(&w[..2 * 256], &[2, 256]).unwrap(), t, None).unwrap();
    assert_eq!(y.shape().dims(), &[2, 20]);
}

#[test]
fn errors_name_the_rule() {
    let e = "int4tiled:g48"
        .parse::<FormatSpec>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("must be 32, 64, 128 or 256"), "{e}");
    let e = "int4tiled:fast"
        .parse::<FormatSpec>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("valid options: g32|g64|g128|g256"), "{e}");
    let q = "int4tiled"
        .parse::<FormatSpec>()
        .unwrap()
        .boxed(Usage::ROWWISE)
        .unwrap();
    let e = q
        .quantize(&HostTensor::f32(&[0.0; 2 * 96], &[2, 96]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("k=96 must be a multiple of the group size 128"),
        "{e}"
    );
    assert!(
        "int4tiled"
            .parse::<FormatSpec>()
            .unwrap()
            .quantizer(Usage::BOTH)
            .is_err()
    );
}
