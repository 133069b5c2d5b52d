//! FP8 per-tensor current scaling (`Float8CurrentScaling`).
//!
//! One fp32 scale for the whole tensor, from its NaN-ignoring amax:
//! `scale = compute_scale_from_amax(amax, fp8_max, pow2, eps, FLT_MAX)`,
//! `q = fp8(x * scale)`, `scale_inv = 1/scale`. The columnwise operand is the bitwise
//! transpose of the rowwise bytes (same scale), stored as `[K, d0, ..., d_{n-2}]`.

use std::ops::Range;

use quant_core::format::{buffer_by_name, buffers_by_name_mut, unknown_option};
use quant_core::layout::{gather_col_ranges, gather_row_ranges};
use quant_core::parallel::AmaxReducer;
use quant_core::{
    Buffer, BufferDesc, BufferMut, DType, Direction, Element, Error, Format, HostTensor,
    OptionHelp, QuantizedTensor, Result, Shape, Usage, dispatch_elements,
};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::engine::{self, Mode};
use crate::kernels::{Folded, Scales, WIDE, decode_run, encode_scaled};
use crate::scale::{AmaxEpsilon, Fp8Dtype, compute_scale_from_amax};
use crate::transpose::{decode_transposed, transpose_bytes};
use quant_core::simd;
use quant_core::stream::{Fence, StoreMode};

/// Elements per parallel work item for streaming passes.
const CHUNK: usize = quant_core::cpu::PAR_CHUNK;

/// Per-tensor current-scaling FP8 quantizer.
///
/// Buffers: `rowwise_data` (u8, input shape), `columnwise_data` (u8,
/// `[K, d0, ..., d_{n-2}]`, the bitwise transpose), `scale_inv` (f32 `[1]`, shared).
///
/// ```
/// use fmt_fp8::Fp8Quantizer;
/// use quant_core::{HostTensor, Usage};
/// let q = Fp8Quantizer::new(Usage::BOTH);
/// let x = HostTensor::f32(&[1.0, -2.0, 3.0, 896.0], &[2, 2])?;
/// let t = q.quantize(&x)?;
/// assert_eq!(t.buffer("scale_inv")?.as_slice::<f32>()?, &[2.0]); // 896/448
/// assert_eq!(t.dequantize_f32()?, vec![1.0, -2.0, 3.0, 896.0]);
/// # Ok::<(), quant_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fp8Quantizer {
    dtype: Fp8Dtype,
    force_pow2_scales: bool,
    amax_epsilon: AmaxEpsilon,
    usage: Usage,
}

impl Fp8Quantizer {
    /// E4M3, fp32 scales, no epsilon, with `usage`.
    pub fn new(usage: Usage) -> Fp8Quantizer {
        Fp8Quantizer {
            dtype: Fp8Dtype::E4M3,
            force_pow2_scales: false,
            amax_epsilon: AmaxEpsilon::default(),
            usage,
        }
    }

    /// Chooses E4M3 or E5M2.
    pub fn with_dtype(mut self, dtype: Fp8Dtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// Rounds the scale down to a power of two (`NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES`).
    pub fn with_pow2_scales(mut self, pow2: bool) -> Self {
        self.force_pow2_scales = pow2;
        self
    }

    /// Floors amax at `eps` (finite, `>= 0`).
    pub fn with_amax_epsilon(mut self, eps: f32) -> Result<Self> {
        self.amax_epsilon = AmaxEpsilon::new(eps)?;
        Ok(self)
    }

    /// The element format.
    pub fn dtype(&self) -> Fp8Dtype {
        self.dtype
    }

    /// Whether scales are powers of two.
    pub fn pow2_scales(&self) -> bool {
        self.force_pow2_scales
    }

    /// The amax floor.
    pub fn amax_epsilon(&self) -> f32 {
        self.amax_epsilon.get()
    }

    /// Quantizes `x` (static dispatch; see [`quant_core::quantize`]).
    pub fn quantize(&self, x: &HostTensor<'_>) -> Result<QuantizedTensor<Self>> {
        quant_core::quantize(self, x)
    }

    /// The scale TE derives from a tensor-wide amax.
    pub fn scale_from_amax(&self, amax: f32) -> f32 {
        compute_scale_from_amax(
            amax,
            self.dtype.max(),
            self.force_pow2_scales,
            self.amax_epsilon.get(),
            f32::MAX,
        )
    }

    /// Quantizes with a given tensor-wide amax (e.g. after a cross-rank reduction).
    pub fn quantize_with_amax(
        &self,
        x: &HostTensor<'_>,
        amax: f32,
    ) -> Result<QuantizedTensor<Self>> {
        let mut t = QuantizedTensor::allocate(self.clone(), x.shape(), x.dtype())?;
        t.write_buffers(|bufs| dispatch_elements!(x, |xs| self.cast(xs, x.shape(), amax, bufs)))?;
        Ok(t)
    }

    fn cast<T: Element>(
        &self,
        xs: &[T],
        shape: &Shape,
        amax: f32,
        bufs: &mut [BufferMut<'_>],
    ) -> Result<()> {
        let (m, k) = shape.as_2d();
        let scale = self.scale_from_amax(amax);
        let [row, col, sinv] =
            buffers_by_name_mut(bufs, ["rowwise_data", "columnwise_data", "scale_inv"]);
        let sinv = sinv.ok_or_else(|| Error::buffer("scale_inv", "is missing"))?;
        sinv.as_mut_slice::<f32>()?[0] = 1.0 / scale;
        let dt = self.dtype;
        let level = simd::level();
        match (row, col) {
            (Some(row), None) => {
                row.bytes_mut()
                    .par_chunks_mut(CHUNK)
                    .zip(xs.par_chunks(CHUNK))
                    .for_each(|(o, i)| {
                        simd::dispatch(
                            level,
                            #[inline(always)]
                            || encode_scaled(level, dt, i, Scales::One(scale), o, &mut { WIDE }),
                        )
                    });
            }
            (row, Some(col)) => encode_transposed(
                dt,
                xs,
                m,
                k,
                scale,
                row.map(|r| r.bytes_mut()),
                col.bytes_mut(),
            )?,
            (None, None) => {}
        }
        Ok(())
    }
}

/// Quantizes `xs` (`[m, k]`) with one scale into the transposed `col` (`[k, m]`) and,
/// when given, the rowwise `row` (`[m, k]`), reading the input once (see [`engine`]).
fn encode_transposed<T: Element>(
    dt: Fp8Dtype,
    xs: &[T],
    m: usize,
    k: usize,
    scale: f32,
    row: Option<&mut [u8]>,
    col: &mut [u8],
) -> Result<()> {
    if m == 0 || k == 0 {
        return Ok(());
    }
    engine::run(
        dt,
        Mode::Tensor(scale),
        |_| scale,
        xs,
        m,
        k,
        row,
        None,
        Some(col),
        None,
    )
}

/// NaN-ignoring `max |x|` over the whole tensor, in parallel.
pub fn tensor_amax<T: Element>(xs: &[T]) -> f32 {
    quant_core::cpu::par_amax(xs)
}

impl Format for Fp8Quantizer {
    const NAME: &'static str = "fp8";
    const OPTIONS: &'static [OptionHelp] = &[
        OptionHelp {
            name: "e4m3",
            help: "E4M3 elements, max 448 (default)",
        },
        OptionHelp {
            name: "e5m2",
            help: "E5M2 elements, max 57344",
        },
        OptionHelp {
            name: "pow2",
            help: "round the scale down to a power of two",
        },
        OptionHelp {
            name: "eps=X",
            help: "floor amax at X before computing the scale (default 0)",
        },
    ];
    const SHAPE_RULE: &'static str = "any shape (one scale for the whole tensor)";

    fn from_spec(options: &[&str], usage: Usage) -> Result<Self> {
        let mut q = Fp8Quantizer::new(usage);
        for &o in options {
            match o {
                "e4m3" => q.dtype = Fp8Dtype::E4M3,
                "e5m2" => q.dtype = Fp8Dtype::E5M2,
                "pow2" => q.force_pow2_scales = true,
                _ => match o.strip_prefix("eps=") {
                    Some(v) => {
                        let eps: f32 = v
                            .parse()
                            .map_err(|_| Error::invalid("fp8 option eps", v, "must be a number"))?;
                        q = q.with_amax_epsilon(eps)?;
                    }
                    None => return Err(unknown_option::<Self>(o)),
                },
            }
        }
        Ok(q)
    }

    fn spec_options(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.dtype == Fp8Dtype::E5M2 {
            v.push("e5m2".to_string());
        }
        if self.force_pow2_scales {
            v.push("pow2".to_string());
        }
        if self.amax_epsilon.get() != 0.0 {
            v.push(format!("eps={}", self.amax_epsilon.get()));
        }
        v
    }

    fn validate_options(&self) -> Result<()> {
        self.usage.require_some()?;
        self.amax_epsilon.validate()
    }

    fn usage(&self) -> Usage {
        self.usage
    }

    fn with_usage(&self, usage: Usage) -> Self {
        Fp8Quantizer {
            usage,
            ..self.clone()
        }
    }

    fn check_shape(&self, _shape: &Shape) -> Result<()> {
        Ok(())
    }

    fn buffers(&self, shape: &Shape) -> Result<Vec<BufferDesc>> {
        let mut v = Vec::with_capacity(3);
        if self.usage.rowwise {
            v.push(BufferDesc::new("rowwise_data", DType::U8, shape.dims()));
        }
        if self.usage.columnwise {
            v.push(BufferDesc::new(
                "columnwise_data",
                DType::U8,
                shape.transposed().dims(),
            ));
        }
        v.push(BufferDesc::new("scale_inv", DType::F32, &[1]));
        Ok(v)
    }

    fn quantize_into(&self, x: &HostTensor<'_>, out: &mut [BufferMut<'_>]) -> Result<()> {
        dispatch_elements!(x, |xs| self.cast(xs, x.shape(), tensor_amax(xs), out))
    }

    fn dequantize_into<T: Element>(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        dir: Direction,
        out: &mut [T],
    ) -> Result<()> {
        let (m, k) = shape.as_2d();
        let sinv = buffer_by_name(bufs, "scale_inv")?.as_slice::<f32>()?[0];
        let dt = self.dtype;
        match dir {
            Direction::Rowwise => {
                let q = buffer_by_name(bufs, "rowwise_data")?.bytes();
                let level = simd::level();
                let mode = StoreMode::for_output_bytes(std::mem::size_of_val(out));
                out.par_chunks_mut(CHUNK)
                    .zip(q.par_chunks(CHUNK))
                    .for_each(|(o, q)| {
                        simd::dispatch(
                            level,
                            #[inline(always)]
                            || {
                                let scale = (Scales::One(sinv), Folded::one(dt, sinv));
                                let fence = Fence::new();
                                decode_run((level, mode, &fence), dt, q, scale, o, &mut { WIDE })
                            },
                        )
                    });
            }
            Direction::Columnwise => {
                let q = buffer_by_name(bufs, "columnwise_data")?.bytes();
                decode_transposed(dt, q, m, k, |_, _, s: &mut [f32]| s.fill(sinv), out);
            }
        }
        Ok(())
    }

    /// Either direction is the bitwise transpose of the other (same scale), so a usage
    /// change can derive the missing one, as TE's `update_usage` does.
    fn derive_buffers(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        missing: &[BufferDesc],
    ) -> Result<Vec<Buffer>> {
        let (m, k) = shape.as_2d();
        missing
            .iter()
            .map(|d| {
                let mut b = Buffer::zeroed(d.clone())?;
                match d.name.as_str() {
                    "columnwise_data" => {
                        let src = buffer_by_name(bufs, "rowwise_data")?;
                        transpose_bytes(src.bytes(), b.bytes_mut(), m, k);
                    }
                    "rowwise_data" => {
                        let src = buffer_by_name(bufs, "columnwise_data")?;
                        transpose_bytes(src.bytes(), b.bytes_mut(), k, m);
                    }
                    other => return Err(Error::buffer(other, "cannot be derived")),
                }
                Ok(b)
            })
            .collect()
    }

    /// Every byte of every buffer is written (no padding): no zeroing before a re-quantize.
    fn overwrites(&self, _desc: &BufferDesc) -> bool {
        true
    }

    /// The tensor amax is needed before the first byte is cast.
    fn input_passes(&self) -> usize {
        2
    }

    /// One scale for the whole tensor: any rows can move.
    fn row_granularity(&self) -> Option<usize> {
        Some(1)
    }

    fn gather_rows(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        ranges: &[Range<usize>],
        out_shape: &Shape,
    ) -> Result<Vec<Buffer>> {
        let (m, k) = shape.as_2d();
        let m_out = out_shape.rows();
        Format::buffers(self, out_shape)?
            .into_iter()
            .map(|d| {
                let mut b = Buffer::zeroed(d)?;
                let src = buffer_by_name(bufs, b.name())?.bytes();
                match b.name() {
                    "rowwise_data" => gather_row_ranges(src, k, ranges, b.bytes_mut())?,
                    "columnwise_data" => {
                        gather_col_ranges(src, k, m, b.bytes_mut(), m_out, ranges, 1)?
                    }
                    _ => b.bytes_mut().copy_from_slice(src),
                }
                Ok(b)
            })
            .collect()
    }

    /// Reduces the shard's amax across ranks first, so each shard gets the whole tensor's
    /// scale (and bytes equal to the matching slice of the whole tensor's quantization).
    fn quantize_reduced(
        &self,
        x: &HostTensor<'_>,
        reducer: &dyn AmaxReducer,
    ) -> Result<QuantizedTensor<Self>> {
        let mut amax = [dispatch_elements!(x, |xs| tensor_amax(xs))];
        reducer.all_reduce_max(&mut amax)?;
        self.quantize_with_amax(x, amax[0])
    }

    fn validate_buffers(&self, _shape: &Shape, bufs: &[Buffer]) -> Result<()> {
        let s = buffer_by_name(bufs, "scale_inv")?.as_slice::<f32>()?[0];
        if crate::scale::valid_scale_inv(s) {
            Ok(())
        } else {
            Err(Error::buffer(
                "scale_inv",
                format!(
                    "holds {s}; a per-tensor scale_inv must be finite and >= +0 (+0: an \
                     all-zero tensor)"
                ),
            ))
        }
    }
}
