//! # fmt-nvfp4
//!
//! NVIDIA's NVFP4 on the CPU, byte-identical with TransformerEngine's quantize kernels:
//! E2M1 elements packed two per byte, one E4M3 scale per 16 consecutive elements, and an
//! FP32 global amax that folds the tensor's range into the E4M3 scales.
//!
//! ```
//! use fmt_nvfp4::Nvfp4Quantizer;
//! use quant_core::{Direction, DType, Format, HostTensor, Usage};
//! let x: Vec<f32> = (0..64 * 128).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 250.0).collect();
//! let q = Nvfp4Quantizer::from_spec(&["2d", "swizzled"], Usage::BOTH)?;
//! let t = q.quantize(&HostTensor::f32(&x, &[64, 128])?)?;
//! let names: Vec<&str> = t.buffers().iter().map(|b| b.name()).collect();
//! assert_eq!(names, ["rowwise_data", "rowwise_scale_inv", "amax_rowwise",
//!                    "columnwise_data", "columnwise_scale_inv", "amax_columnwise"]);
//! let back = t.dequantize(Direction::Rowwise, DType::F32)?.to_f32_vec();
//! let worst = x.iter().zip(&back).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
//! assert!(worst <= 0.5); // |x| <= 2: half the top E2M1 step (2) times the block scale (1/3)
//! # Ok::<(), quant_core::Error>(())
//! ```
//!
//! ## Buffers (TE `NVFP4Quantizer::create_tensor`)
//!
//! `M` is the product of the leading dimensions, `K` the last one; both must be
//! multiples of 16.
//!
//! | buffer | dtype | shape | content |
//! |---|---|---|---|
//! | `rowwise_data` | u8 | `[..., K/2]` | E2M1 codes of `x`, element `2i` in the low nibble |
//! | `rowwise_scale_inv` | u8 (E4M3) | `[roundup(M,128), roundup(K/16,4)]` | block `(m, k/16)` |
//! | `amax_rowwise` | f32 | `[1]`, or `[M]` row-scaled | global amax of `x` |
//! | `columnwise_data` | u8 | `[K, M/2]` | E2M1 codes of `x^T` (Hadamard-rotated with `rht`) |
//! | `columnwise_scale_inv` | u8 (E4M3) | `[roundup(K,128), roundup(M/16,4)]` | block `(k, m/16)` |
//! | `amax_columnwise` | f32 | `[1]`, or `[K]` row-scaled | amax of `x^T` (post-RHT with `rht`) |
//!
//! ```text
//! rowwise_data, one row (K = 32):   byte:    0        1      ...     15
//!                                   nibbles: hi lo    hi lo          hi lo
//!                                   element: 1  0     3  2           31 30
//! block b = elements 16b..16b+15 = bytes 8b..8b+7, scale at rowwise_scale_inv[m][b]
//!
//! columnwise_data = the same packing applied to x^T: byte (k, j) holds
//!   low nibble  x[2j][k],  high nibble  x[2j+1][k];  block (k, b) = x[16b..16b+16][k]
//!
//! compact scales [R, C] (R = roundup(rows,128), C = roundup(cols/16,4)), zero padding:
//!   (i, j) at i*C + j
//! swizzled (`swizzled`): 512-byte tiles of 128 rows x 4 columns, tiles row-major over
//!   (i/128, j/4); inside a tile (i%32)*16 + ((i%128)/32)*4 + j%4   (cuBLAS VEC16_UE4M3)
//! ```
//!
//! ## Scale math ([`scale`], TE `core_nvfp4.cuh` and the quantize kernels, bit for bit)
//!
//! ```text
//! S_enc = fminf(448*6 / amax, FLT_MAX); if amax == 0 || S_enc == 0 { S_enc = 1 }; S_dec = 1/S_enc
//! sdb   = e4m3_rne_satfinite(fminf(block_amax * (S_enc * f32(1/6)), FLT_MAX))
//! enc   = fminf(1 / (float(sdb) * S_dec), FLT_MAX)
//! q     = e2m1_rne_satfinite(x * enc)
//! ```
//!
//! Amaxes ignore NaN (CUDA `fmaxf`/`__hmax`/`max.xorsign.abs`); `+inf` counts. A NaN
//! global amax (possible only through [`Nvfp4Quantizer::quantize_with_amax`]) gives
//! `S_enc = FLT_MAX` because `fminf` drops the NaN quotient. A block whose scale
//! underflows E4M3 stores `sdb = 0`; its `enc` is then `FLT_MAX` and every nonzero
//! element saturates to ±6 (it still dequantizes to zero). NaN elements encode as `+6`
//! (code 7) and `-0.0` as code 8, following NVIDIA's host emulation of the PTX `cvt`.
//!
//! ## Options
//!
//! * `2d`: the block amax is taken over a 16x16 tile; the columnwise data is then the
//!   nibble-repacked transpose of the rowwise data, so either direction can be derived
//!   from the other ([`quant_core::QuantizedTensor::update_usage`]).
//! * `rht`: the columnwise operand is `bf16(RHT(x^T))` ([`rht`]); its amax is taken on
//!   that bf16 result. bf16 input only (as in TE): f32/f16 input is refused with the
//!   conversion to make, since TE has no bytes to match for it.
//! * `sr`, `seed=N`: TE's software stochastic rounding with a Philox4x32-10 stream whose
//!   bits are a pure function of `(seed, direction, row, block)` ([`sr`]).
//! * `row-scaled`: one amax and `S_enc` per row (`amax_columnwise[k]` per column of `x`).
//! * `4over6`, `4over6=mse`, `e4m3max=256`: per block, quantize with `sdb6 =
//!   e4m3(min(base, 448))` and `sdb4 = e4m3(min(1.5 base, 448))`, `base = (block_amax/6) *
//!   S_enc`, and keep the candidate with the smaller summed absolute (or squared) error
//!   in the input domain; ties keep map-to-6; in 2-D the 16 row errors of a tile are
//!   tree-summed in the order of the CUDA warp reduction.
//! * `swizzled`: both scale buffers in the cuBLAS tile layout; [`with_scale_layout`]
//!   converts a stored tensor exactly in either direction.
//!
//! Refused combinations (each error names TE's reason): `rht`+`2d`, `row-scaled` with
//! `rht`, `sr`, `2d` or columnwise-only usage, `4over6` with `rht` or `sr`, `row-scaled`
//! `4over6` with columnwise usage, `4over6`+`2d` with columnwise-only usage,
//! `e4m3max=256` without `4over6`, and amax reduction
//! ([`Nvfp4Quantizer::quantize_with_amax`]) for `row-scaled`. `seed=N` implies `sr`.
//!
//! ## Where TE's kernels, its Python oracle and its C++ test oracle differ
//!
//! The kernels are followed. `reference_nvfp4.py` propagates NaN into amaxes (`torch.max`)
//! and encodes NaN and `-0.0` as code 0; the kernels ignore NaN in amaxes and encode NaN
//! as 7 and `-0.0` as 8. The C++ test oracle (`test_cast_nvfp4_transpose.cu`) sets
//! `enc = 0` for a zero block scale where the kernels use `FLT_MAX`. TE's fused RHT
//! cast kernel (`row_cast_col_hadamard_transform_cast_fusion.cu`, bf16 with `M % 64 ==
//! 0`, `K % 128 == 0` on sm100) propagates NaN into block amaxes and keeps `S_enc = 0`
//! for an infinite amax; this crate follows the unfused kernels, which agree with the
//! fused one on all finite inputs. Row-scaled columnwise output exists in TE only for
//! bf16 with `M`, `K` multiples of 32; it is computed here for every input with the same
//! arithmetic. The full list is in `docs/formats/nvfp4.md`.
#![deny(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // kernel launches; every block has a SAFETY comment
pub mod cuda;
mod dequant;
mod engine;
mod kernel;
pub mod layout;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX2 intrinsics; every block has a SAFETY comment
mod philox_avx2;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX-512 intrinsics; every block has a SAFETY comment
mod philox_x86;
mod quantizer;
pub mod reference;
pub mod rht;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX2 intrinsics; every block has a SAFETY comment
mod rht_avx2;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX-512 intrinsics; every block has a SAFETY comment
mod rht_int;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX-512 intrinsics; every block has a SAFETY comment
mod rht_x86;
pub mod scale;
pub mod sr;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX2 intrinsics; every block has a SAFETY comment
mod transposed_avx2;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX-512 intrinsics; every block has a SAFETY comment
mod transposed_x86;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX-512 intrinsics; every block has a SAFETY comment
mod x86;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX2 intrinsics; every block has a SAFETY comment
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // AVX-512 intrinsics; every block has a SAFETY comment
mod x86_encode;

pub use quantizer::{FourOverSix, Nvfp4Quantizer, with_scale_layout};

/// An NVFP4 storage.
pub type Nvfp4Tensor = quant_core::QuantizedTensor<Nvfp4Quantizer>;
