//! # quantfmt
//!
//! Low-precision tensor formats in the exact layouts vendor GEMMs and checkpoints use,
//! bit-exact with NVIDIA TransformerEngine and torchao, in Rust.
//!
//! ```
//! use quantfmt::{FormatSpec, HostTensor, Quantizer, Storage, TensorProto, DType, Usage};
//!
//! let weights: Vec<f32> = (0..256 * 512).map(|i| ((i * 37 % 1000) as f32 - 500.0) / 97.0).collect();
//! let w = HostTensor::f32(&weights, &[256, 512])?;                 // borrowed, no copy
//! let q = "fp8-block:128x128".parse::<FormatSpec>()?.quantizer(Usage::BOTH)?;
//! let stored = q.quantize(&w)?;                                   // TE's GEMM-ready buffers
//! let back = stored.dequantize_f32()?;
//! assert_eq!(back.len(), weights.len());
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("model.q.safetensors");
//! quantfmt::io::save(&path, &[("w", &stored)])?;                 // one tensor per buffer
//! let again = quantfmt::io::load(&path)?;                         // rebuilt via the registry
//! assert!(again.get("w").is_some());
//!
//! // No data at all: plan memory from a prototype.
//! let proto = TensorProto::new(&[4096, 11008], DType::BF16, &q)?;
//! for b in proto.buffers()? { println!("{} {} {:?}", b.name, b.dtype, b.shape) }
//! // data in both directions + fp32 scales [32, 88] rowwise and [86, 32] columnwise
//! assert_eq!(proto.nbytes()?, 2 * 4096 * 11008 + 4 * (32 * 88 + 86 * 32));
//! # Ok::<(), quantfmt::Error>(())
//! ```
//!
//! In a loop, allocate the storage and the output once and reuse them: `quantize_into`
//! and `dequantize_into` write into them and allocate nothing the size of the tensor.
//!
//! ```
//! use quantfmt::{DType, Direction, FormatSpec, HostDataMut, HostTensor, Quantizer, Shape, Storage, Usage};
//!
//! let q = "mxfp8".parse::<FormatSpec>()?.quantizer(Usage::ROWWISE)?;
//! let mut stored = q.allocate(&Shape::new(&[64, 128])?, DType::F32)?;
//! let mut back = vec![0.0f32; 64 * 128];
//! for step in 1..=3 {
//!     let x: Vec<f32> = (0..64 * 128).map(|i| (i % 17) as f32 * step as f32).collect();
//!     q.quantize_into(&HostTensor::f32(&x, &[64, 128])?, &mut *stored)?;
//!     stored.dequantize_into(Direction::Rowwise, HostDataMut::from(&mut back[..]))?;
//!     assert_eq!(back[16], 16.0 * step as f32); // on the E4M3 grid: exact
//! }
//! # Ok::<(), quantfmt::Error>(())
//! ```
#![deny(unsafe_code)]

mod any;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod interop;
pub mod io;
mod spec;

use std::sync::OnceLock;

pub use any::{AnyQuantizer, AnyStorage, QuantizerVariant, StorageVariant};
pub use spec::FormatSpec;

pub use quant_core::{
    Buffer, BufferDesc, DType, Direction, Element, Error, Format, GroupKind, GroupedStorage,
    GroupedTensor, HostBytes, HostData, HostDataMut, HostTensor, QuantizedTensor, Quantizer,
    Registry, Result, Shape, Storage, TensorProto, Usage, codec, dispatch_elements, glu, half,
    pages, parallel, plan, quantize, simd,
};

/// The FP8 formats.
pub use fmt_fp8;
pub use fmt_fp8::{BlockScaling, Fp8BlockQuantizer, Fp8Dtype, Fp8Quantizer};

/// The int4 tensor-core tiled (tinygemm) format.
pub use fmt_int4tiled;
pub use fmt_int4tiled::Int4TiledQuantizer;
/// MXFP8.
pub use fmt_mxfp8;
pub use fmt_mxfp8::{
    Mxfp8Dtype, Mxfp8Quantizer, Mxfp8Tensor, Mxfp8TensorExt, ScaleLayout, ScaleRule,
};
/// The NVFP4 format.
pub use fmt_nvfp4;
pub use fmt_nvfp4::Nvfp4Quantizer;

/// The registry of every format this build ships.
pub fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| {
        let mut r = Registry::new();
        any::register_all(&mut r);
        r
    })
}

/// The README's Rust examples, compiled and run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
