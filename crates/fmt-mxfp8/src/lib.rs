//! # fmt-mxfp8
//!
//! MXFP8 on the CPU, byte-identical with NVIDIA TransformerEngine's kernels
//! (`common/cast/mxfp8/quantize_mxfp8.cuh`, `dequantize_mxfp8.cuh`): FP8 elements (E4M3
//! or E5M2) with one E8M0 power-of-two scale per 32 elements, in TE's buffer layout.
//!
//! * **Scale rule** ([`ScaleRule`]): TE's by default — `val = amax * float(1/max)`
//!   (`0x3B124925` / `0x37924925`) rounded **up** to a power of two, so the block max
//!   never clips — or, with `ocp`, the OCP MX v1.0 floor rule `floor(log2 amax) - emax`,
//!   byte-identical with torchao's `to_mx(.., FLOOR)`. They differ exactly where the
//!   amax significand is above 1.75 (e.g. amax 460: TE scale 2, OCP scale 1 and 460
//!   clips to 448), and on non-finite blocks; see [`scale`] for the full table.
//! * **Elements**: `q = fp8(x * 2^(127 - e))`, one f32 multiply, round-to-nearest-even,
//!   saturating to ±max (infinity included), NaN -> `0x7F`.
//! * **Directions**: rowwise (1x32 blocks along K) and columnwise (32x1 blocks along M,
//!   **not** transposed: same `[.., K]` shape as the input), each computed from the
//!   high-precision input; `2d` gives one scale per 32x32 tile, both directions then
//!   hold the same bytes.
//! * **Scales**: compact `[roundup(M,128), roundup(K/32,4)]` / `[roundup(M/32,4),
//!   roundup(K,128)]` (zero padding), or with `swizzled` the cuBLAS 128x4-tile order —
//!   columnwise scales swizzled as their transpose. Conversions both ways are exact
//!   ([`layout`], [`Mxfp8TensorExt::to_scale_layout`]).
//! * **Dequantize** either direction from either layout: `x = T(float(q) * 2^(e-127))`,
//!   `e = 0` -> 2^-127, `e = 255` -> NaN.
//! * **Shapes**: `M` (product of leading dims) and `K` must be multiples of 32, checked
//!   before any work: `mxfp8: K=100 must be a multiple of 32`.
//! * **Usage changes**: dropping a direction always works; adding one is refused for 1-D
//!   tensors (TE refuses too: the directions have different scales) and derived for
//!   `2d` tensors, whose directions are identical.
//!
//! ```
//! use fmt_mxfp8::{Mxfp8Quantizer, Mxfp8TensorExt, ScaleRule};
//! use quant_core::{Direction, Format, HostTensor, Usage};
//! let mut x = vec![0.5f32; 32 * 32];
//! x[0] = 470.0; // one block whose max is above 448
//! let x = HostTensor::f32(&x, &[32, 32])?;
//!
//! let te = Mxfp8Quantizer::new(Usage::ROWWISE).quantize(&x)?;
//! assert_eq!(te.scale_codes(Direction::Rowwise)?[0], 128); // scale 2: 470 -> 235
//! assert_eq!(te.dequantize_f32()?[0], 480.0);               // 235 rounds to 240 in E4M3
//!
//! let ocp = Mxfp8Quantizer::from_spec(&["ocp"], Usage::ROWWISE)?.quantize(&x)?;
//! assert_eq!(ocp.quantizer().scale_rule(), ScaleRule::Ocp);
//! assert_eq!(ocp.scale_codes(Direction::Rowwise)?[0], 127); // scale 1
//! assert_eq!(ocp.dequantize_f32()?[0], 448.0);               // clipped
//! # Ok::<(), quant_core::Error>(())
//! ```
//!
//! ## Where the reference spec and the source disagree (source followed)
//!
//! * The spec calls the PyTorch oracles' `amax / 448.0` (division) equivalent and asks
//!   for the kernel's multiply by `float(1/448)`; implemented as the multiply, with a
//!   test that `448·2^k` and its next float land on the expected codes. (A numpy sweep
//!   over every 7th finite f32 amax, 611M values for E4M3 and E5M2 together, found no
//!   code where the division and the multiply differ.)
//! * TE's specialized cast-only kernel has an `_ENABLE_MXFMA` variant that multiplies a
//!   bf16/fp16 amax by a **bf16** `1/max` (`0x3B12`); no build defines it, so the
//!   default `__fmaf_ieee_rn(amax, 0x3B124925, 0)` (= the multiply) is followed.
//! * The spec marks NaN handling of `max.xorsign.abs` uncertain; per the PTX ISA it
//!   returns the non-NaN operand (no `.NaN` modifier), i.e. NaN-ignoring like `fmaxf`,
//!   which is what the TE rule implements for every input dtype.
//! * TE's `MXFP8TensorStorage.update_usage` refuses to add a direction even in 2-D mode;
//!   quantfmt derives it there (the directions are identical by construction).
//! * The spec gives one element formula, `fp8(x * mult)`; TE's bf16/fp16 cast-only fast
//!   kernels compute `fma(x, mult, +0)` instead, which stores an input `-0.0` as `+0`.
//!   quantfmt reproduces TE's dispatch for the sign of zero
//!   ([`Mxfp8Quantizer::flushes_negative_zero`]); nothing else depends on the path.
//! * TE's bf16 both-directions fast kernel takes the columnwise amax with
//!   `redux.sync.max.abs.f32` on sm_100/103 but with an integer bit-pattern max elsewhere
//!   (NaN would win there); quantfmt is NaN-ignoring everywhere.
#![deny(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // kernel launches; every block has a SAFETY comment
pub mod cuda;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX2 kernels; every block has a SAFETY comment
mod decode_avx2;
mod kernels;
pub mod layout;
mod quantizer;
pub mod reference;
pub mod scale;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX-512 kernels; every block has a SAFETY comment
mod x86;

pub use layout::ScaleLayout;
pub use quantizer::{
    COLUMNWISE_DATA, COLUMNWISE_SCALE_INV, Mxfp8Quantizer, Mxfp8TensorExt, ROWWISE_DATA,
    ROWWISE_SCALE_INV,
};
pub use scale::{BLOCK, Mxfp8Dtype, ScaleRule};

/// An MXFP8 storage.
pub type Mxfp8Tensor = quant_core::QuantizedTensor<Mxfp8Quantizer>;
