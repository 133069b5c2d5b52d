//! [`Nvfp4Quantizer`]: options, validation, buffers and the [`Format`] implementation.

use half::bf16;
use quant_core::format::{buffer_by_name, buffers_by_name_mut, unknown_option};
use std::ops::Range;

use quant_core::layout::{block_ranges, gather_col_ranges, gather_row_ranges};
use quant_core::parallel::AmaxReducer;
use quant_core::{
    Buffer, BufferDesc, BufferMut, DType, Direction, Element, Error, Format, HostTensor,
    OptionHelp, QuantizedTensor, Result, Shape, Usage, dispatch_elements,
};
use serde::{Deserialize, Serialize};

use crate::kernel::{self, Amax, RowQuant};
use crate::layout::{self, scale_shape};
use crate::scale::BLOCK;
use crate::{dequant, engine, rht, sr};

/// The error 4over6 minimises when it picks a block's scale candidate.
///
/// ```
/// use fmt_nvfp4::FourOverSix;
/// assert_eq!(FourOverSix::default(), FourOverSix::Mae);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FourOverSix {
    /// Sum of absolute dequantization errors (TE `kNVTENVFP44Over6MinMAE`, the default).
    #[default]
    Mae,
    /// Sum of squared dequantization errors (TE `kNVTENVFP44Over6MinMSE`).
    Mse,
}

/// NVFP4 quantizer (spec name `nvfp4`): E2M1 elements packed two per byte, one E4M3
/// scale per 16 elements, an FP32 global amax, in TransformerEngine's buffer layout.
///
/// Options (all off by default; spec `nvfp4:2d,swizzled` etc.):
///
/// | option | TE name | meaning |
/// |---|---|---|
/// | `2d` | `with_2d_quantization` | one scale per 16x16 tile (weights) |
/// | `rht` | `with_rht` | random Hadamard transform of the columnwise operand (bf16 input only) |
/// | `sr`, `seed=N` | `stochastic_rounding` | stochastic rounding from a seeded Philox stream |
/// | `row-scaled` | `row_scaled_nvfp4` | one amax (and `S_enc`) per row |
/// | `4over6`, `4over6=mse` | `nvfp4_use_4over6`, `nvfp4_4over6_err_mode` | per-block map-to-4 / map-to-6 choice |
/// | `e4m3max=256` | `nvfp4_e4m3_max` | global-scale E4M3 max 256 (4over6 only) |
/// | `swizzled` | `with_gemm_swizzled_scales` | scales in the cuBLAS 128x4 tile layout |
///
/// ```
/// use fmt_nvfp4::Nvfp4Quantizer;
/// use quant_core::{Direction, DType, Format, HostTensor, Usage};
/// let x: Vec<f32> = (0..32 * 64).map(|i| ((i % 29) as f32 - 14.0) / 3.0).collect();
/// let q = Nvfp4Quantizer::from_spec(&["2d"], Usage::BOTH)?;
/// let t = q.quantize(&HostTensor::f32(&x, &[32, 64])?)?;
/// assert_eq!(t.buffer("rowwise_data")?.shape(), &[32, 32]);
/// assert_eq!(t.buffer("rowwise_scale_inv")?.shape(), &[128, 4]);
/// assert_eq!(t.buffer("columnwise_data")?.shape(), &[64, 16]);
/// // 2-D: both directions hold the same values.
/// let row = t.dequantize(Direction::Rowwise, DType::F32)?.to_f32_vec();
/// let col = t.dequantize(Direction::Columnwise, DType::F32)?.to_f32_vec();
/// assert_eq!(row, col);
/// # Ok::<(), quant_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nvfp4Quantizer {
    two_d: bool,
    rht: bool,
    stochastic_rounding: bool,
    seed: u64,
    row_scaled: bool,
    four_over_six: Option<FourOverSix>,
    e4m3_max: u16,
    swizzled: bool,
    usage: Usage,
}

impl Nvfp4Quantizer {
    /// Plain 1-D NVFP4 (TE's defaults), compact scales, with `usage`.
    pub fn new(usage: Usage) -> Nvfp4Quantizer {
        Nvfp4Quantizer {
            two_d: false,
            rht: false,
            stochastic_rounding: false,
            seed: 0,
            row_scaled: false,
            four_over_six: None,
            e4m3_max: 448,
            swizzled: false,
            usage,
        }
    }

    /// 16x16 tile scales (TE's weight recipe).
    pub fn with_2d(mut self, on: bool) -> Self {
        self.two_d = on;
        self
    }

    /// Random Hadamard transform of the columnwise operand (TE's input/grad recipe).
    pub fn with_rht(mut self, on: bool) -> Self {
        self.rht = on;
        self
    }

    /// Stochastic rounding with the random stream of `seed` (see [`crate::sr`]);
    /// `None` rounds to nearest.
    pub fn with_stochastic_rounding(mut self, seed: Option<u64>) -> Self {
        self.stochastic_rounding = seed.is_some();
        self.seed = seed.unwrap_or(0);
        self
    }

    /// One amax per row (`amax_rowwise` `[M]`, `amax_columnwise` `[K]`).
    pub fn with_row_scaled(mut self, on: bool) -> Self {
        self.row_scaled = on;
        self
    }

    /// 4over6 block-scale selection with the given error mode (`None`: off).
    pub fn with_four_over_six(mut self, mode: Option<FourOverSix>) -> Self {
        self.four_over_six = mode;
        self
    }

    /// E4M3 max of the global scale: 448 (default) or 256 (4over6 only).
    pub fn with_e4m3_max(mut self, max: u16) -> Self {
        self.e4m3_max = max;
        self
    }

    /// Scales in the cuBLAS 128x4 tile layout instead of compact row-major.
    pub fn with_swizzled(mut self, on: bool) -> Self {
        self.swizzled = on;
        self
    }

    /// Whether scales are per 16x16 tile.
    pub fn is_2d(&self) -> bool {
        self.two_d
    }

    /// Whether the columnwise operand is Hadamard-rotated.
    pub fn rht(&self) -> bool {
        self.rht
    }

    /// The stochastic-rounding seed, `None` for round-to-nearest.
    pub fn stochastic_rounding(&self) -> Option<u64> {
        self.stochastic_rounding.then_some(self.seed)
    }

    /// Whether amax is per row.
    pub fn row_scaled(&self) -> bool {
        self.row_scaled
    }

    /// The 4over6 error mode, `None` when off.
    pub fn four_over_six(&self) -> Option<FourOverSix> {
        self.four_over_six
    }

    /// E4M3 max of the global scale (448 or 256).
    pub fn e4m3_max(&self) -> u16 {
        self.e4m3_max
    }

    /// Whether scales are GEMM-swizzled.
    pub fn swizzled(&self) -> bool {
        self.swizzled
    }

    /// Quantizes `x` (static dispatch).
    pub fn quantize(&self, x: &HostTensor<'_>) -> Result<QuantizedTensor<Self>> {
        quant_core::quantize(self, x)
    }

    /// Quantizes with given global amaxes instead of computing them, e.g. after an
    /// all-reduce MAX across ranks (TE `with_amax_reduction` / `quantize_with_amax`).
    /// With RHT, `amax_columnwise` is the amax of the rotated operand. Refused for
    /// row-scaled quantizers, as TE does.
    pub fn quantize_with_amax(
        &self,
        x: &HostTensor<'_>,
        amax_rowwise: f32,
        amax_columnwise: f32,
    ) -> Result<QuantizedTensor<Self>> {
        if self.row_scaled {
            return Err(Error::unsupported(
                Self::NAME,
                "row-scaled quantization with a given amax (amax reduction)",
                "TransformerEngine refuses quantize_with_amax and amax reduction for row-scaled NVFP4: each row has its own amax",
            ));
        }
        let mut t = QuantizedTensor::allocate(self.clone(), x.shape(), x.dtype())?;
        t.write_buffers(|bufs| {
            dispatch_elements!(x, |xs| self.cast(
                xs,
                x.shape(),
                Some((amax_rowwise, amax_columnwise)),
                bufs
            ))
        })?;
        Ok(t)
    }

    /// Whether quantizing reads the input once: row-scaled rowwise-only 1-D output,
    /// whose every scale comes from the row itself (each row's amax is taken as the
    /// row is quantized).
    fn one_pass(&self) -> bool {
        self.row_scaled && !self.usage.columnwise && self.four_over_six.is_none() && !self.two_d
    }

    /// Scale buffer shapes `(rowwise, columnwise)` of an `[m, k]` tensor.
    ///
    /// ```
    /// use fmt_nvfp4::Nvfp4Quantizer;
    /// use quant_core::Usage;
    /// let q = Nvfp4Quantizer::new(Usage::BOTH);
    /// assert_eq!(q.scale_shapes(48, 64), ([128, 4], [128, 4]));
    /// assert_eq!(q.scale_shapes(272, 16), ([384, 4], [128, 20]));
    /// ```
    pub fn scale_shapes(&self, m: usize, k: usize) -> ([usize; 2], [usize; 2]) {
        (scale_shape(m, k), scale_shape(k, m))
    }

    /// Checks every option combination; refusals name the combination and TE's reason.
    pub fn validate(&self) -> Result<()> {
        let refuse = |what: &str, why: &str| Err(Error::unsupported(Self::NAME, what, why));
        self.usage.require_some()?;
        if self.e4m3_max != 448 && self.e4m3_max != 256 {
            return Err(Error::invalid(
                "nvfp4 option e4m3max",
                self.e4m3_max,
                "must be 448 or 256",
            ));
        }
        if !self.stochastic_rounding && self.seed != 0 {
            return Err(Error::invalid(
                "nvfp4 option seed",
                self.seed,
                "only applies with sr (stochastic rounding); add `sr`",
            ));
        }
        if self.e4m3_max == 256 && self.four_over_six.is_none() {
            return refuse(
                "e4m3max=256 without 4over6",
                "TransformerEngine requires E4M3 max 448 for non-4over6 NVFP4 (256 only leaves room for 4over6's 1.5x map-to-4 scale)",
            );
        }
        if self.rht && self.two_d {
            return refuse(
                "rht with 2d",
                "TransformerEngine's fused RHT kernel has no 2-D mode and its recipes never combine them (RHT is for activations and gradients, 2-D for weights)",
            );
        }
        if self.row_scaled {
            let reason = "TransformerEngine's row-scaled NVFP4 supports none of RHT, stochastic rounding and 2-D quantization";
            if self.rht {
                return refuse("row-scaled with rht", reason);
            }
            if self.stochastic_rounding {
                return refuse("row-scaled with sr", reason);
            }
            if self.two_d {
                return refuse("row-scaled with 2d", reason);
            }
            if !self.usage.rowwise {
                return refuse(
                    "row-scaled with columnwise-only usage",
                    "TransformerEngine's row-scaled NVFP4 requires rowwise usage",
                );
            }
            if self.four_over_six.is_some() && self.usage.columnwise {
                return refuse(
                    "row-scaled 4over6 with columnwise usage",
                    "TransformerEngine's 4over6 kernel does not consume per-column amaxes, so it refuses row-scaled transpose output",
                );
            }
        }
        if self.four_over_six.is_some() {
            if self.rht {
                return refuse(
                    "4over6 with rht",
                    "TransformerEngine's 4over6 quantization does not support RHT",
                );
            }
            if self.stochastic_rounding {
                return refuse(
                    "4over6 with sr",
                    "TransformerEngine's 4over6 quantization does not support stochastic rounding",
                );
            }
            if self.two_d && !self.usage.rowwise {
                return refuse(
                    "4over6 2d with columnwise-only usage",
                    "TransformerEngine's 4over6 2-D quantization requires rowwise output",
                );
            }
        }
        Ok(())
    }

    /// The fast path: fills the buffers from `xs` with one read of the input after the
    /// global amax pass (see [`crate::engine`]); `amax` overrides the computed global
    /// amaxes.
    fn cast<T: Element>(
        &self,
        xs: &[T],
        shape: &Shape,
        amax: Option<(f32, f32)>,
        bufs: &mut [BufferMut<'_>],
    ) -> Result<()> {
        if self.rht && T::DTYPE != DType::BF16 {
            return Err(rht_dtype_error(T::DTYPE));
        }
        let (m, k) = shape.as_2d();
        let [rd, rs, ra, cd, cs, ca] = buffers_by_name_mut(
            bufs,
            [
                "rowwise_data",
                "rowwise_scale_inv",
                "amax_rowwise",
                "columnwise_data",
                "columnwise_scale_inv",
                "amax_columnwise",
            ],
        );
        let missing = |n: &str| Error::buffer(n, "is missing from the storage");
        let (rowwise, columnwise) = (self.usage.rowwise, self.usage.columnwise);
        // Row-scaled rowwise-only 1-D output takes each row's amax as it goes.
        let own_rows = self.one_pass();
        let a = engine::amaxes(
            xs,
            m,
            k,
            !self.row_scaled && amax.is_none(),
            self.rht && columnwise && amax.is_none(),
            self.row_scaled && rowwise && !own_rows,
            self.row_scaled && columnwise,
        );
        // Without RHT both directions share the tensor amax (TE copies one into both).
        let shared = match amax {
            _ if self.row_scaled => 0.0,
            Some((r, _)) => r,
            None => a.x,
        };
        let row_amax = if self.row_scaled {
            Amax::PerRow(&a.rows)
        } else {
            Amax::Tensor(shared)
        };
        let col_amax = if self.row_scaled {
            Amax::PerRow(&a.cols)
        } else if self.rht {
            Amax::Tensor(amax.map_or(a.y, |(_, c)| c))
        } else {
            Amax::Tensor(amax.map_or(shared, |(_, c)| c))
        };
        let mut own_row_amax = None;
        let row = if rowwise {
            let ra = ra
                .ok_or_else(|| missing("amax_rowwise"))?
                .as_mut_slice::<f32>()?;
            match row_amax {
                _ if own_rows => own_row_amax = Some(ra),
                Amax::PerRow(v) => ra.copy_from_slice(v),
                Amax::Tensor(v) => ra[0] = v,
            }
            let rd = rd.ok_or_else(|| missing("rowwise_data"))?;
            let rs = rs.ok_or_else(|| missing("rowwise_scale_inv"))?;
            Some((rd.bytes_mut(), rs.bytes_mut()))
        } else {
            None
        };
        let col = if columnwise {
            let ca = ca
                .ok_or_else(|| missing("amax_columnwise"))?
                .as_mut_slice::<f32>()?;
            match col_amax {
                Amax::PerRow(v) => ca.copy_from_slice(v),
                Amax::Tensor(v) => ca[0] = v,
            }
            let cd = cd.ok_or_else(|| missing("columnwise_data"))?;
            let cs = cs.ok_or_else(|| missing("columnwise_scale_inv"))?;
            Some((cd.bytes_mut(), cs.bytes_mut()))
        } else {
            None
        };
        let params = engine::Params {
            level: quant_core::simd::level(),
            two_d: self.two_d,
            e4m3_max: self.e4m3_max,
            four_over_six: self.four_over_six,
            seed: self.stochastic_rounding.then_some(self.seed),
            swizzled: self.swizzled,
            rht: self.rht,
            row_amax,
            col_amax,
        };
        engine::quantize(&params, xs, m, k, row, own_row_amax, col)
    }

    /// The scalar specification of [`Self::cast`] (used by [`crate::reference`]): one
    /// block at a time through [`crate::kernel`], the columnwise operand materialized
    /// as a transposed (or Hadamard-rotated) copy.
    pub(crate) fn reference_cast<T: Element>(
        &self,
        xs: &[T],
        shape: &Shape,
        amax: Option<(f32, f32)>,
        bufs: &mut [BufferMut<'_>],
    ) -> Result<()> {
        if self.rht && T::DTYPE != DType::BF16 {
            return Err(rht_dtype_error(T::DTYPE));
        }
        let (m, k) = shape.as_2d();
        let (ss_r, ss_c) = self.scale_shapes(m, k);
        let [rd, rs, ra, cd, cs, ca] = buffers_by_name_mut(
            bufs,
            [
                "rowwise_data",
                "rowwise_scale_inv",
                "amax_rowwise",
                "columnwise_data",
                "columnwise_scale_inv",
                "amax_columnwise",
            ],
        );
        let missing = |n: &str| Error::buffer(n, "is missing from the storage");
        // Without RHT both directions share the tensor amax (TE copies one into both).
        let shared_amax = if self.row_scaled {
            0.0
        } else if let Some((r, _)) = amax {
            r
        } else {
            kernel::tensor_amax(xs)
        };
        let base = RowQuant {
            rows: m,
            cols: k,
            amax: Amax::Tensor(shared_amax),
            two_d: self.two_d,
            e4m3_max: self.e4m3_max,
            four_over_six: self.four_over_six,
            sr: None,
        };
        if self.usage.rowwise {
            let rd = rd.ok_or_else(|| missing("rowwise_data"))?;
            let rs = rs.ok_or_else(|| missing("rowwise_scale_inv"))?;
            let ra = ra.ok_or_else(|| missing("amax_rowwise"))?;
            let per_row;
            let amax_r = if self.row_scaled {
                per_row = kernel::row_amax(xs, k);
                ra.as_mut_slice::<f32>()?.copy_from_slice(&per_row);
                Amax::PerRow(&per_row)
            } else {
                ra.as_mut_slice::<f32>()?[0] = shared_amax;
                Amax::Tensor(shared_amax)
            };
            let q = RowQuant {
                amax: amax_r,
                sr: self.sr_dir(sr::DIR_ROWWISE),
                ..base
            };
            self.write_direction(xs, &q, rd.bytes_mut(), rs.bytes_mut(), ss_r)?;
        }
        if self.usage.columnwise {
            let cd = cd.ok_or_else(|| missing("columnwise_data"))?;
            let cs = cs.ok_or_else(|| missing("columnwise_scale_inv"))?;
            let ca = ca.ok_or_else(|| missing("amax_columnwise"))?;
            let sr_c = self.sr_dir(sr::DIR_COLUMNWISE);
            if self.rht {
                let y = rht::transposed_rht(xs, m, k);
                let a = match amax {
                    Some((_, c)) => c,
                    None => kernel::tensor_amax(&y),
                };
                ca.as_mut_slice::<f32>()?[0] = a;
                let q = RowQuant {
                    rows: k,
                    cols: m,
                    amax: Amax::Tensor(a),
                    sr: sr_c,
                    ..base
                };
                self.write_direction::<bf16>(&y, &q, cd.bytes_mut(), cs.bytes_mut(), ss_c)?;
            } else {
                let xt = layout::transpose(xs, m, k);
                let per_col;
                let amax_c = if self.row_scaled {
                    per_col = kernel::row_amax(&xt, m);
                    ca.as_mut_slice::<f32>()?.copy_from_slice(&per_col);
                    Amax::PerRow(&per_col)
                } else {
                    let a = amax.map_or(shared_amax, |(_, c)| c);
                    ca.as_mut_slice::<f32>()?[0] = a;
                    Amax::Tensor(a)
                };
                let q = RowQuant {
                    rows: k,
                    cols: m,
                    amax: amax_c,
                    sr: sr_c,
                    ..base
                };
                self.write_direction(&xt, &q, cd.bytes_mut(), cs.bytes_mut(), ss_c)?;
            }
        }
        Ok(())
    }

    fn sr_dir(&self, dir: u32) -> Option<(u64, u32)> {
        self.stochastic_rounding.then_some((self.seed, dir))
    }

    /// Quantizes one operand, writing compact or swizzled scales.
    fn write_direction<T: Element>(
        &self,
        x: &[T],
        q: &RowQuant<'_>,
        data: &mut [u8],
        scales: &mut [u8],
        shape: [usize; 2],
    ) -> Result<()> {
        if self.swizzled {
            let mut compact = vec![0u8; scales.len()];
            kernel::quantize_rows(x, q, data, &mut compact, shape[1]);
            quant_core::layout::swizzle(&compact, scales, shape[0], shape[1])
        } else {
            kernel::quantize_rows(x, q, data, scales, shape[1]);
            Ok(())
        }
    }

    /// The spec options this quantizer accepts, for the registry and `--help`.
    const HELP: &'static [OptionHelp] = &[
        OptionHelp {
            name: "1d",
            help: "one scale per 16 elements of a row (default)",
        },
        OptionHelp {
            name: "2d",
            help: "one scale per 16x16 tile (weights); columnwise = transposed rowwise",
        },
        OptionHelp {
            name: "rht",
            help: "random Hadamard transform of the columnwise operand (bf16 input only)",
        },
        OptionHelp {
            name: "sr",
            help: "stochastic rounding (TE's software rule, Philox4x32-10 stream)",
        },
        OptionHelp {
            name: "seed=N",
            help: "stochastic rounding with this seed, a u64 (implies sr; default seed 0)",
        },
        OptionHelp {
            name: "row-scaled",
            help: "one amax per row (amax_rowwise [M], amax_columnwise [K])",
        },
        OptionHelp {
            name: "4over6",
            help: "per-block map-to-4/map-to-6 scale choice by least absolute error",
        },
        OptionHelp {
            name: "4over6=mse",
            help: "4over6 by least squared error (4over6=mae is the default)",
        },
        OptionHelp {
            name: "e4m3max=256",
            help: "E4M3 max of the global scale: 448 (default) or 256 (4over6 only)",
        },
        OptionHelp {
            name: "swizzled",
            help: "scales in the cuBLAS 128x4 tile layout (GEMM-ready)",
        },
    ];
}

impl Format for Nvfp4Quantizer {
    const NAME: &'static str = "nvfp4";
    const OPTIONS: &'static [OptionHelp] = Self::HELP;
    const SHAPE_RULE: &'static str =
        "M (product of the leading dimensions) and K (last dimension) must be multiples of 16";

    fn from_spec(options: &[&str], usage: Usage) -> Result<Self> {
        let mut q = Nvfp4Quantizer::new(usage);
        for &o in options {
            match o {
                "1d" => q.two_d = false,
                "2d" => q.two_d = true,
                "rht" => q.rht = true,
                "sr" => q.stochastic_rounding = true,
                "row-scaled" => q.row_scaled = true,
                "4over6" | "4over6=mae" => q.four_over_six = Some(FourOverSix::Mae),
                "4over6=mse" => q.four_over_six = Some(FourOverSix::Mse),
                "swizzled" => q.swizzled = true,
                _ => {
                    if let Some(v) = o.strip_prefix("seed=") {
                        // A seed only means something for stochastic rounding: it implies `sr`.
                        q.stochastic_rounding = true;
                        q.seed = v.parse().map_err(|_| {
                            Error::invalid(
                                "nvfp4 option seed",
                                v,
                                "must be an unsigned 64-bit integer",
                            )
                        })?;
                    } else if let Some(v) = o.strip_prefix("e4m3max=") {
                        q.e4m3_max = match v {
                            "448" => 448,
                            "256" => 256,
                            _ => {
                                return Err(Error::invalid(
                                    "nvfp4 option e4m3max",
                                    v,
                                    "must be 448 or 256",
                                ));
                            }
                        };
                    } else if let Some(v) = o.strip_prefix("4over6=") {
                        return Err(Error::invalid(
                            "nvfp4 option 4over6",
                            v,
                            "must be mae or mse",
                        ));
                    } else {
                        return Err(unknown_option::<Self>(o));
                    }
                }
            }
        }
        q.validate()?;
        Ok(q)
    }

    fn spec_options(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.two_d {
            v.push("2d".to_string());
        }
        if self.rht {
            v.push("rht".to_string());
        }
        if self.stochastic_rounding {
            v.push("sr".to_string());
            if self.seed != 0 {
                v.push(format!("seed={}", self.seed));
            }
        }
        if self.row_scaled {
            v.push("row-scaled".to_string());
        }
        match self.four_over_six {
            Some(FourOverSix::Mae) => v.push("4over6".to_string()),
            Some(FourOverSix::Mse) => v.push("4over6=mse".to_string()),
            None => {}
        }
        if self.e4m3_max != 448 {
            v.push(format!("e4m3max={}", self.e4m3_max));
        }
        if self.swizzled {
            v.push("swizzled".to_string());
        }
        v
    }

    fn validate_options(&self) -> Result<()> {
        self.validate()
    }

    fn usage(&self) -> Usage {
        self.usage
    }

    fn with_usage(&self, usage: Usage) -> Self {
        Nvfp4Quantizer {
            usage,
            ..self.clone()
        }
    }

    fn check_shape(&self, shape: &Shape) -> Result<()> {
        self.validate()?;
        let (m, k) = shape.as_2d();
        if !k.is_multiple_of(BLOCK) {
            return Err(Error::shape(Self::NAME, "K", k, "must be a multiple of 16"));
        }
        if !m.is_multiple_of(BLOCK) {
            return Err(Error::shape(
                Self::NAME,
                "M",
                m,
                format!(
                    "must be a multiple of 16 (M is the product of the leading dimensions of {shape})"
                ),
            ));
        }
        if self.stochastic_rounding {
            for (arg, n) in [("K", k), ("M", m)] {
                if u32::try_from(n / BLOCK).is_err() {
                    return Err(Error::shape(
                        Self::NAME,
                        arg,
                        n,
                        "must have fewer than 2^32 blocks of 16 with sr (the block index is a 32-bit Philox counter word)",
                    ));
                }
            }
        }
        Ok(())
    }

    fn buffers(&self, shape: &Shape) -> Result<Vec<BufferDesc>> {
        let (m, k) = shape.as_2d();
        let (ss_r, ss_c) = self.scale_shapes(m, k);
        let mut v = Vec::with_capacity(6);
        if self.usage.rowwise {
            let mut dims = shape.dims().to_vec();
            if let Some(last) = dims.last_mut() {
                *last /= 2;
            }
            v.push(BufferDesc::new("rowwise_data", DType::U8, &dims));
            v.push(BufferDesc::new("rowwise_scale_inv", DType::U8, &ss_r));
            let n = if self.row_scaled { m } else { 1 };
            v.push(BufferDesc::new("amax_rowwise", DType::F32, &[n]));
        }
        if self.usage.columnwise {
            v.push(BufferDesc::new("columnwise_data", DType::U8, &[k, m / 2]));
            v.push(BufferDesc::new("columnwise_scale_inv", DType::U8, &ss_c));
            let n = if self.row_scaled { k } else { 1 };
            v.push(BufferDesc::new("amax_columnwise", DType::F32, &[n]));
        }
        Ok(v)
    }

    fn quantize_into(&self, x: &HostTensor<'_>, out: &mut [BufferMut<'_>]) -> Result<()> {
        dispatch_elements!(x, |xs| self.cast(xs, x.shape(), None, out))
    }

    fn dequantize_into<T: Element>(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        dir: Direction,
        out: &mut [T],
    ) -> Result<()> {
        let (m, k) = shape.as_2d();
        let (data, scales, amax) = match dir {
            Direction::Rowwise => ("rowwise_data", "rowwise_scale_inv", "amax_rowwise"),
            Direction::Columnwise => ("columnwise_data", "columnwise_scale_inv", "amax_columnwise"),
        };
        let view = dequant::Operand::new(
            buffer_by_name(bufs, data)?.bytes(),
            buffer_by_name(bufs, scales)?.bytes(),
            buffer_by_name(bufs, amax)?.as_slice::<f32>()?,
            self.swizzled,
            self.e4m3_max,
        );
        match dir {
            Direction::Rowwise => dequant::rowwise(&view, m, k, out),
            Direction::Columnwise => dequant::columnwise(&view, m, k, self.rht, out),
        }
        Ok(())
    }

    /// 2-D tiles share one scale and one amax between directions, so each direction is
    /// the nibble-repacked transpose of the other (data and scales) and can be derived
    /// from the stored one. Every other mode scales the directions separately from the
    /// high-precision input (TE's `update_usage` refuses NVFP4 altogether).
    fn derive_buffers(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        missing: &[BufferDesc],
    ) -> Result<Vec<Buffer>> {
        if !self.two_d || self.stochastic_rounding || self.four_over_six.is_some() {
            return Err(Error::unsupported(
                Self::NAME,
                "deriving the other direction",
                "only 2-D NVFP4 without sr or 4over6 shares its scales between directions; quantize again with the new usage",
            ));
        }
        let (m, k) = shape.as_2d();
        let (ss_r, ss_c) = self.scale_shapes(m, k);
        let sw = self.swizzled;
        missing
            .iter()
            .map(|d| {
                let mut b = Buffer::zeroed(d.clone())?;
                match d.name.as_str() {
                    "columnwise_data" => {
                        let src = buffer_by_name(bufs, "rowwise_data")?.bytes();
                        b.bytes_mut()
                            .copy_from_slice(&layout::nibble_transpose(src, m, k)?);
                    }
                    "rowwise_data" => {
                        let src = buffer_by_name(bufs, "columnwise_data")?.bytes();
                        b.bytes_mut()
                            .copy_from_slice(&layout::nibble_transpose(src, k, m)?);
                    }
                    "columnwise_scale_inv" => {
                        let src = buffer_by_name(bufs, "rowwise_scale_inv")?.bytes();
                        let dst = b.bytes_mut();
                        for kk in 0..k {
                            for mb in 0..m / BLOCK {
                                dst[layout::scale_index(kk, mb, ss_c[1], sw)] =
                                    src[layout::scale_index(mb * BLOCK, kk / BLOCK, ss_r[1], sw)];
                            }
                        }
                    }
                    "rowwise_scale_inv" => {
                        let src = buffer_by_name(bufs, "columnwise_scale_inv")?.bytes();
                        let dst = b.bytes_mut();
                        for mm in 0..m {
                            for kb in 0..k / BLOCK {
                                dst[layout::scale_index(mm, kb, ss_r[1], sw)] =
                                    src[layout::scale_index(kb * BLOCK, mm / BLOCK, ss_c[1], sw)];
                            }
                        }
                    }
                    "amax_columnwise" => b
                        .bytes_mut()
                        .copy_from_slice(buffer_by_name(bufs, "amax_rowwise")?.bytes()),
                    "amax_rowwise" => b
                        .bytes_mut()
                        .copy_from_slice(buffer_by_name(bufs, "amax_columnwise")?.bytes()),
                    other => return Err(Error::buffer(other, "cannot be derived")),
                }
                Ok(b)
            })
            .collect()
    }

    /// Every byte of the packed data is written by every quantization (each row and
    /// each transposed column is whole blocks), so re-quantizing skips zeroing it.
    /// Scale buffers keep their padding cells, which only the zeroing sets.
    fn overwrites(&self, desc: &BufferDesc) -> bool {
        desc.name.ends_with("_data")
    }

    /// The global amax is needed before the first block scale; with RHT the columnwise
    /// operand is transformed once more for its post-transform amax. Row-scaled
    /// rowwise-only 1-D output reads each row twice, but the second time from cache
    /// (`one_pass`); per-column amaxes (columnwise output) and the 4over6 path take a
    /// separate pass.
    fn input_passes(&self) -> usize {
        if self.one_pass() {
            1
        } else if self.rht && self.usage.columnwise {
            3
        } else {
            2
        }
    }

    /// Rows move in 16-row blocks: columnwise blocks (and 2-D tiles, and Hadamard
    /// chunks) span 16 rows, and the shape rule keeps M a multiple of 16.
    fn row_granularity(&self) -> Option<usize> {
        Some(BLOCK)
    }

    /// Rowwise data rows and scale rows move with their rows; the transposed columnwise
    /// data and scales move as column ranges (2 values per byte, 16 rows per scale).
    /// Global amaxes stay (the moved rows are a subset of the same tensor); per-row
    /// amaxes move with their rows. Swizzled scales are moved in compact order and
    /// swizzled again for the new shape. With stochastic rounding the moved bytes keep
    /// the random draws of their old positions.
    fn gather_rows(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        ranges: &[Range<usize>],
        out_shape: &Shape,
    ) -> Result<Vec<Buffer>> {
        let (m, k) = shape.as_2d();
        let m_out = out_shape.rows();
        let (sr_in, sc_in) = self.scale_shapes(m, k);
        let (sr_out, sc_out) = self.scale_shapes(m_out, k);
        let blocks = block_ranges(ranges, BLOCK);
        let half: Vec<Range<usize>> = ranges.iter().map(|r| r.start / 2..r.end / 2).collect();
        let unswz = |src: &[u8], shp: [usize; 2]| -> Result<Vec<u8>> {
            if self.swizzled {
                layout::unswizzle_scales(src, shp)
            } else {
                Ok(src.to_vec())
            }
        };
        let reswz = |v: Vec<u8>, shp: [usize; 2]| -> Result<Vec<u8>> {
            if self.swizzled {
                layout::swizzle_scales(&v, shp)
            } else {
                Ok(v)
            }
        };
        Format::buffers(self, out_shape)?
            .into_iter()
            .map(|d| {
                let name = d.name.clone();
                let mut b = Buffer::zeroed(d)?;
                let src = buffer_by_name(bufs, &name)?.bytes();
                match name.as_str() {
                    "rowwise_data" => gather_row_ranges(src, k / 2, ranges, b.bytes_mut())?,
                    "columnwise_data" => {
                        gather_col_ranges(src, k, m / 2, b.bytes_mut(), m_out / 2, &half, 1)?
                    }
                    "rowwise_scale_inv" => {
                        let c = unswz(src, sr_in)?;
                        let mut moved = vec![0u8; b.nbytes()];
                        gather_row_ranges(&c, sr_in[1], ranges, &mut moved)?;
                        b.bytes_mut().copy_from_slice(&reswz(moved, sr_out)?);
                    }
                    "columnwise_scale_inv" => {
                        let c = unswz(src, sc_in)?;
                        let mut moved = vec![0u8; b.nbytes()];
                        gather_col_ranges(
                            &c, sc_in[0], sc_in[1], &mut moved, sc_out[1], &blocks, 1,
                        )?;
                        b.bytes_mut().copy_from_slice(&reswz(moved, sc_out)?);
                    }
                    "amax_rowwise" if self.row_scaled => {
                        gather_row_ranges(src, 4, ranges, b.bytes_mut())?
                    }
                    "amax_rowwise" | "amax_columnwise" => b.bytes_mut().copy_from_slice(src),
                    other => return Err(Error::buffer(other, "has no row-gather rule")),
                }
                Ok(b)
            })
            .collect()
    }

    /// Reduces the global amaxes (rowwise, and the post-Hadamard columnwise one with
    /// RHT) across ranks, then quantizes with them (TE `with_amax_reduction`). Row-scaled
    /// rowwise operands have one amax per row, which a row shard already holds in full,
    /// so they need no reduction; a row-scaled columnwise operand would need per-column
    /// amaxes reduced across shards, which TE refuses and so does this.
    fn quantize_reduced(
        &self,
        x: &HostTensor<'_>,
        reducer: &dyn AmaxReducer,
    ) -> Result<QuantizedTensor<Self>> {
        if self.row_scaled {
            if self.usage.columnwise {
                return Err(Error::unsupported(
                    Self::NAME,
                    "amax reduction for a row-scaled tensor with columnwise usage",
                    "the columnwise operand's per-column amaxes span every rank; TransformerEngine refuses amax reduction with row-scaled NVFP4",
                ));
            }
            return quant_core::quantize(self, x);
        }
        let (m, k) = x.shape().as_2d();
        let mut amax = dispatch_elements!(x, |xs| {
            let want_y = self.rht && self.usage.columnwise && is_bf16(xs);
            let a = engine::amaxes(xs, m, k, true, want_y, false, false);
            [a.x, if want_y { a.y } else { a.x }]
        });
        reducer.all_reduce_max(&mut amax)?;
        self.quantize_with_amax(x, amax[0], amax[1])
    }

    /// Block scales must be non-negative E4M3 codes (`0x00..=0x7E`: the kernels never
    /// write NaN or a negative scale) and amaxes must be `>= 0` (`+inf` is valid: an
    /// infinite input). Scale padding is not inspected (TE leaves it uninitialised).
    fn validate_buffers(&self, shape: &Shape, bufs: &[Buffer]) -> Result<()> {
        let (m, k) = shape.as_2d();
        let (ss_r, ss_c) = self.scale_shapes(m, k);
        let checks = [
            ("rowwise_scale_inv", "amax_rowwise", ss_r, m, k / BLOCK),
            (
                "columnwise_scale_inv",
                "amax_columnwise",
                ss_c,
                k,
                m / BLOCK,
            ),
        ];
        for (sname, aname, padded, rows, cols) in checks {
            let Some(s) = bufs.iter().find(|b| b.name() == sname) else {
                continue;
            };
            let s = s.bytes();
            for r in 0..rows {
                for c in 0..cols {
                    let code = s[layout::scale_index(r, c, padded[1], self.swizzled)];
                    if code > 0x7E {
                        return Err(Error::buffer(
                            sname,
                            format!(
                                "block ({r}, {c}) holds E4M3 code {code:#04x}; block scales must be non-negative and not NaN (0x00..=0x7E)"
                            ),
                        ));
                    }
                }
            }
            let a = buffer_by_name(bufs, aname)?.as_slice::<f32>()?;
            if let Some((i, v)) = a.iter().enumerate().find(|(_, v)| v.is_nan() || **v < 0.0) {
                return Err(Error::buffer(
                    aname,
                    format!("entry {i} holds {v}; an amax must be >= 0 and not NaN"),
                ));
            }
        }
        Ok(())
    }
}

/// The same tensor with its scales in the other layout: `swizzled = true` gives the
/// cuBLAS 128x4 tile layout, `false` compact row-major. Exact both ways (a permutation
/// of the padded scale matrices); data and amaxes are shared, not copied.
///
/// ```
/// use fmt_nvfp4::{Nvfp4Quantizer, with_scale_layout};
/// use quant_core::{HostTensor, Usage};
/// let x: Vec<f32> = (0..48 * 32).map(|i| (i % 13) as f32 - 6.0).collect();
/// let t = Nvfp4Quantizer::new(Usage::BOTH).quantize(&HostTensor::f32(&x, &[48, 32])?)?;
/// let s = with_scale_layout(&t, true)?;
/// assert!(s.quantizer().swizzled());
/// let back = with_scale_layout(&s, false)?;
/// assert_eq!(back.buffer("rowwise_scale_inv")?.bytes(), t.buffer("rowwise_scale_inv")?.bytes());
/// assert_eq!(s.dequantize_f32()?, t.dequantize_f32()?);
/// # Ok::<(), quant_core::Error>(())
/// ```
pub fn with_scale_layout(
    t: &QuantizedTensor<Nvfp4Quantizer>,
    swizzled: bool,
) -> Result<QuantizedTensor<Nvfp4Quantizer>> {
    let q = t.quantizer();
    if q.swizzled == swizzled {
        return Ok(t.clone());
    }
    let (m, k) = t.shape().as_2d();
    let (ss_r, ss_c) = q.scale_shapes(m, k);
    let bufs = t
        .buffers()
        .iter()
        .map(|b| {
            let shape = match b.name() {
                "rowwise_scale_inv" => ss_r,
                "columnwise_scale_inv" => ss_c,
                _ => return Ok(b.clone()),
            };
            let bytes = if swizzled {
                layout::swizzle_scales(b.bytes(), shape)?
            } else {
                layout::unswizzle_scales(b.bytes(), shape)?
            };
            Buffer::from_bytes(b.desc().clone(), &bytes)
        })
        .collect::<Result<Vec<_>>>()?;
    QuantizedTensor::from_buffers(
        q.clone().with_swizzled(swizzled),
        t.shape(),
        t.dtype(),
        bufs,
    )
}

fn rht_dtype_error(dtype: DType) -> Error {
    Error::unsupported(
        Nvfp4Quantizer::NAME,
        format!("rht with {dtype} input"),
        "TransformerEngine's Hadamard kernels take bf16 input only; convert first (HostTensor::to_dtype(DType::BF16)) to get TE's exact bytes",
    )
}

/// Whether the elements are bf16 (the only input TE's Hadamard kernels take).
fn is_bf16<T: Element>(_: &[T]) -> bool {
    T::DTYPE == DType::BF16
}
