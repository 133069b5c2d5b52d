//! # fmt-int4tiled
//!
//! int4 "tensor-core tiled" weights, the layout of PyTorch's tinygemm kernel
//! (`_weight_int4pack_mm`) and torchao's `Int4TilePackedTo4dTensor`, on the CPU:
//!
//! * [`Int4TiledQuantizer`] (`int4tiled`, options `g32|g64|g128|g256`, `k2|k4|k8`,
//!   `pad=kernel|torchao`, `eps=X`): torchao's qparams ([`qparams`]), packed bit for bit
//!   as CUDA `_convert_weight_to_int4pack` packs them ([`layout`]), with
//!   `scale_and_zero` as `pack_tinygemm_scales_and_zeros` builds it.
//! * dequantization with the kernel's single rounding of `(u − 8)·scale + zero`
//!   ([`dequant`]), so bf16 output equals `_weight_int4pack_mm(eye(k), …)ᵀ`.
//! * 3-D MoE weights `[E, n, k]`, expert selection and n/k slicing without repacking,
//!   import/export of plain nibbles, integer zero points and torchao's pre-pack bytes
//!   ([`Int4TiledTensorExt`], [`Int4TiledQuantizer::from_logical`] and friends).
//! * [`int4_linear`]: a multi-threaded weight-only int4 matmul that decodes tiles on the
//!   fly.
//!
//! ```
//! use fmt_int4tiled::{int4_linear, Int4TiledQuantizer, Int4TiledTensorExt};
//! use quant_core::{DType, Direction, Format, HostTensor, Usage};
//! use half::bf16;
//!
//! let w: Vec<bf16> = (0..40 * 256)
//!     .map(|i| bf16::from_f32(((i * 7919) % 1000) as f32 / 500.0 - 1.0))
//!     .collect();
//! let q = Int4TiledQuantizer::from_spec(&["g64", "k4"], Usage::ROWWISE)?;
//! let t = q.quantize(&HostTensor::bf16(&w, &[40, 256])?)?;
//! assert_eq!((t.padded_n(), t.padded_k()), (40, 256));
//! let wd = t.dequantize(Direction::Rowwise, DType::BF16)?; // the kernel's bf16 weights
//! assert_eq!(wd.shape().dims(), &[40, 256]);
//! let x = vec![bf16::from_f32(0.5); 3 * 256];
//! let y = int4_linear(&HostTensor::bf16(&x, &[3, 256])?, &t, None)?; // [3, 40], bf16
//! assert_eq!(y.shape().dims(), &[3, 40]);
//! # Ok::<(), quant_core::Error>(())
//! ```
//!
//! Specification and sources: `docs/formats/int4tiled.md` in the repository.
#![deny(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX-512 intrinsics; every block has a SAFETY comment
mod batch_x86;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // kernel launches; every block has a SAFETY comment
pub mod cuda;
pub mod dequant;
mod format;
mod kernels;
pub mod layout;
mod linear;
pub mod qparams;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX2 intrinsics; every block has a SAFETY comment
mod quantize_avx2;
pub mod reference;
mod tensor;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX-512 intrinsics; every block has a SAFETY comment
mod x86;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX2 intrinsics; every block has a SAFETY comment
mod x86_avx2;

pub use format::{
    Eps, GROUP_SIZES, Geometry, INNER_K_TILES, Int4TiledQuantizer, Padding, TORCHAO_K_MULTIPLE,
};
pub use linear::{int4_linear, int4_linear_reference, int4_linear_slice, slab_order};
pub use tensor::{Int4IntZeroPoints, Int4Logical, Int4TiledTensor, Int4TiledTensorExt};
