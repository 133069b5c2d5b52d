//! # quant-core
//!
//! The format-agnostic core of [quantfmt](https://docs.rs/quantfmt): the contract every
//! low-precision format implements, and the machinery they share. It knows no format.
//!
//! | concept | type | what it is |
//! |---|---|---|
//! | recipe (static) | [`Format`] | options + kernels of one format; implemented by format crates |
//! | recipe (dynamic) | [`Quantizer`] | object-safe view of any `Format`, for run-time choice |
//! | quantized tensor | [`QuantizedTensor<F>`] / [`Storage`] | shape, dtype, quantizer and named [`Buffer`]s |
//! | grouped tensors | [`GroupedStorage`] | N members in one allocation per buffer kind |
//! | prototype | [`TensorProto`] | shape + dtype + quantizer, no data: buffers and bytes up front |
//! | registry | [`Registry`] | format name -> rebuild from options and buffers |
//! | codecs | [`codec`] | bit-exact E4M3, E5M2, E8M0, E2M1 |
//! | CPU kernels | [`simd`], [`cpu`], [`block_max`], [`bf16_narrow`] | run-time SIMD dispatch, amax, block maxima, bf16 narrowing |
//! | files | [`io`] | the native safetensors layout, validated on load |
//!
//! Buffers are described before they exist ([`BufferDesc`]), so frameworks can plan
//! memory, and every buffer rebuilt from bytes is checked against its description.
//!
//! ```
//! use quant_core::{codec::e4m3, Shape, Usage};
//! assert_eq!(e4m3::encode(500.0), 0x7E); // saturates to 448
//! assert_eq!(Shape::new(&[2, 64, 128])?.as_2d(), (128, 128));
//! assert_eq!(Usage::default(), Usage::ROWWISE);
//! # Ok::<(), quant_core::Error>(())
//! ```
#![deny(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

pub mod bf16_narrow;
pub mod block_max;
pub mod buffer;
pub mod codec;
pub mod cpu;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // FFI and kernel launches; every block has a SAFETY comment
pub mod cuda;
pub mod dtype;
pub mod error;
#[cfg(target_arch = "x86_64")]
mod f16c;
pub mod format;
pub mod glu;
pub mod grouped;
pub mod io;
pub mod layout;
pub mod pages;
pub mod parallel;
pub mod plan;
pub mod proto;
pub mod registry;
pub mod shape;
pub mod simd;
pub mod stream;
pub mod strips;
pub mod tensor;
pub mod traits;
pub mod usage;

pub use buffer::{Buffer, BufferDesc, BufferElem, BufferMut, HostBytes};
pub use dtype::{DType, Element, narrowed, widened};
pub use error::{Error, Result};
pub use format::{Format, OptionHelp, QuantizedTensor, quantize};
pub use grouped::{GroupKind, GroupLayout, GroupedTensor};
pub use proto::TensorProto;
pub use registry::{FormatEntry, Registry};
pub use shape::Shape;
pub use tensor::{HostData, HostDataMut, HostTensor};
pub use traits::{GroupedStorage, Quantizer, Storage};
pub use usage::{Direction, Usage};

/// Re-export so format crates and users agree on one `half`.
pub use half;
