//! # fmt-fp8
//!
//! The two FP8 recipes of NVIDIA TransformerEngine, on the CPU, bit-exact with its
//! kernels:
//!
//! * [`Fp8Quantizer`] (`fp8`): per-tensor *current scaling*. One fp32 scale from the
//!   tensor's NaN-ignoring amax; E4M3 or E5M2; optional power-of-two scales and amax
//!   epsilon. The columnwise operand is the bitwise transpose of the rowwise bytes.
//! * [`Fp8BlockQuantizer`] (`fp8-block`): DeepSeek-V3-style blockwise scaling, 1x128 or
//!   128x128, power-of-two scales by default, in TE's GEMM-ready scale layout.
//!
//! Element conversion is `fp8(float(x) * scale)` with round-to-nearest-even and
//! saturation to the finite range (CUDA `__NV_SATFINITE`), NaN -> `0x7F`; the scale math
//! is [`compute_scale_from_amax`], TE's `recipe_common.cuh` line for line.
//!
//! ```
//! use fmt_fp8::{BlockScaling, Fp8BlockQuantizer};
//! use quant_core::{Direction, DType, HostTensor, Usage};
//! let w: Vec<f32> = (0..256 * 130).map(|i| ((i % 97) as f32 - 48.0) / 7.0).collect();
//! let x = HostTensor::f32(&w, &[256, 130])?;
//! let q = Fp8BlockQuantizer::new(BlockScaling::TwoD, Usage::BOTH);
//! let t = q.quantize(&x)?;
//! let row = t.dequantize(Direction::Rowwise, DType::F32)?.to_f32_vec();
//! let col = t.dequantize(Direction::Columnwise, DType::F32)?.to_f32_vec();
//! assert_eq!(row, col); // 128x128: both directions hold the same values
//! # Ok::<(), quant_core::Error>(())
//! ```
#![deny(unsafe_code)]

mod block;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // kernel launches; every block has a SAFETY comment
pub mod cuda;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX2 kernels; every block has a SAFETY comment
mod decode_avx2;
mod engine;
mod kernels;
mod per_tensor;
mod scale;
mod transpose;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // the AVX2 transposed decode; every block has a SAFETY comment
mod transposed_avx2;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // the AVX-512 transposed decode; every block has a SAFETY comment
mod transposed_x86;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX-512 kernels; every block has a SAFETY comment
mod x86;

pub use block::{BLOCK, BlockScaling, Fp8BlockQuantizer};
pub use per_tensor::{Fp8Quantizer, tensor_amax};
pub use scale::{AmaxEpsilon, Fp8Dtype, amax_of, compute_scale_from_amax, valid_scale_inv};

/// A per-tensor FP8 storage.
pub type Fp8Tensor = quant_core::QuantizedTensor<Fp8Quantizer>;
/// A blockwise FP8 storage.
pub type Fp8BlockTensor = quant_core::QuantizedTensor<Fp8BlockQuantizer>;
