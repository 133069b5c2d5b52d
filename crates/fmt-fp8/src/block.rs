//! FP8 blockwise scaling (`Float8BlockScaling`, DeepSeek-V3 style): one fp32 scale per
//! 1x128 row segment or per 128x128 tile, in TransformerEngine's GEMM-ready layout.
//!
//! | | rowwise scale_inv (f32) | columnwise scale_inv (f32) |
//! |---|---|---|
//! | 1x128 | `[ceil(K/128), roundup(M,4)]`, (m, kb) at `kb*roundup(M,4) + m` | `[ceil(M/128), roundup(K,4)]`, (k, mb) at `mb*roundup(K,4) + k` |
//! | 128x128 | `[ceil(M/128), roundup(ceil(K/128),4)]`, (mb, kb) at `mb*stride + kb` | `[ceil(K/128), roundup(ceil(M/128),4)]`, (kb, mb) at `kb*stride + mb` |
//!
//! Data is `rowwise_data` (u8, input shape) and `columnwise_data` (u8, transposed
//! `[K, d0, ..]`). 1x128 columnwise blocks are 128 consecutive rows of one column,
//! scaled from the high-precision input (never re-quantized from rowwise); 128x128 uses
//! one scale per tile for both directions, so its columnwise data is the exact bitwise
//! transpose of the rowwise data. Ragged edges are partial blocks; scale padding is zero.
//! `value_for_inf` (a subnormal amax) is the input dtype's max finite value.

use std::ops::Range;

use quant_core::format::{buffer_by_name, buffers_by_name_mut, unknown_option};
use quant_core::layout::{block_ranges, gather_col_ranges, gather_row_ranges};
use quant_core::shape::{ceil_div, round_up};
use quant_core::{
    Buffer, BufferDesc, BufferMut, DType, Direction, Element, Error, Format, HostTensor,
    OptionHelp, QuantizedTensor, Result, Shape, Usage, dispatch_elements,
};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::engine::{self, Mode};
use crate::kernels::{WIDE, decode_pow2, decode_scaled};
use crate::scale::{AmaxEpsilon, Fp8Dtype, compute_scale_from_amax};
use crate::transpose::{decode_transposed, transpose_bytes};
use quant_core::simd;

/// Block edge.
pub const BLOCK: usize = 128;

/// Scale granularity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockScaling {
    /// One scale per 128 consecutive elements along a row (activations, gradients).
    #[serde(rename = "1x128")]
    OneD,
    /// One scale per 128x128 tile (weights; the default).
    #[default]
    #[serde(rename = "128x128")]
    TwoD,
}

/// Blockwise FP8 quantizer.
///
/// ```
/// use fmt_fp8::{BlockScaling, Fp8BlockQuantizer};
/// use quant_core::{HostTensor, Usage};
/// let q = Fp8BlockQuantizer::new(BlockScaling::OneD, Usage::ROWWISE);
/// let x: Vec<f32> = (0..3 * 200).map(|i| i as f32).collect();
/// let t = q.quantize(&HostTensor::f32(&x, &[3, 200])?)?;
/// // two 1x128 blocks per row, scales stored transposed: [ceil(200/128), roundup(3, 4)]
/// assert_eq!(t.buffer("rowwise_scale_inv")?.shape(), &[2, 4]);
/// # Ok::<(), quant_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fp8BlockQuantizer {
    dtype: Fp8Dtype,
    block: BlockScaling,
    force_pow2_scales: bool,
    amax_epsilon: AmaxEpsilon,
    usage: Usage,
}

impl Fp8BlockQuantizer {
    /// E4M3, power-of-two scales (TE's default), no epsilon.
    pub fn new(block: BlockScaling, usage: Usage) -> Fp8BlockQuantizer {
        Fp8BlockQuantizer {
            dtype: Fp8Dtype::E4M3,
            block,
            force_pow2_scales: true,
            amax_epsilon: AmaxEpsilon::default(),
            usage,
        }
    }

    /// Chooses E4M3 or E5M2.
    pub fn with_dtype(mut self, dtype: Fp8Dtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// `false` keeps full fp32 scales (`NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1`).
    pub fn with_pow2_scales(mut self, pow2: bool) -> Self {
        self.force_pow2_scales = pow2;
        self
    }

    /// Floors each block amax at `eps` (finite, `>= 0`).
    pub fn with_amax_epsilon(mut self, eps: f32) -> Result<Self> {
        self.amax_epsilon = AmaxEpsilon::new(eps)?;
        Ok(self)
    }

    /// The element format.
    pub fn dtype(&self) -> Fp8Dtype {
        self.dtype
    }

    /// The block shape.
    pub fn block(&self) -> BlockScaling {
        self.block
    }

    /// Whether scales are powers of two.
    pub fn pow2_scales(&self) -> bool {
        self.force_pow2_scales
    }

    /// The floor applied to every block amax.
    pub fn amax_epsilon(&self) -> f32 {
        self.amax_epsilon.get()
    }

    /// Quantizes `x` (static dispatch).
    pub fn quantize(&self, x: &HostTensor<'_>) -> Result<QuantizedTensor<Self>> {
        quant_core::quantize(self, x)
    }

    /// Shapes of (rowwise, columnwise) scale_inv buffers for a `[m, k]` view.
    pub fn scale_shapes(&self, m: usize, k: usize) -> ([usize; 2], [usize; 2]) {
        match self.block {
            BlockScaling::OneD => (
                [ceil_div(k, BLOCK), round_up(m, 4)],
                [ceil_div(m, BLOCK), round_up(k, 4)],
            ),
            BlockScaling::TwoD => (
                [ceil_div(m, BLOCK), round_up(ceil_div(k, BLOCK), 4)],
                [ceil_div(k, BLOCK), round_up(ceil_div(m, BLOCK), 4)],
            ),
        }
    }

    #[inline(always)]
    fn scale<T: Element>(&self, amax: f32) -> f32 {
        compute_scale_from_amax(
            amax,
            self.dtype.max(),
            self.force_pow2_scales,
            self.amax_epsilon.get(),
            T::MAX_FINITE,
        )
    }

    fn cast<T: Element>(&self, xs: &[T], shape: &Shape, bufs: &mut [BufferMut<'_>]) -> Result<()> {
        let (m, k) = shape.as_2d();
        if m == 0 || k == 0 {
            return Ok(());
        }
        let [rd, rs, cd, cs] = buffers_by_name_mut(
            bufs,
            [
                "rowwise_data",
                "rowwise_scale_inv",
                "columnwise_data",
                "columnwise_scale_inv",
            ],
        );
        let (ss_r, ss_c) = self.scale_shapes(m, k);
        let (row, row_s) = match (rd, rs) {
            (Some(d), Some(s)) => (
                Some(d.bytes_mut()),
                Some((s.as_mut_slice::<f32>()?, ss_r[1])),
            ),
            _ => (None, None),
        };
        let (col, col_s) = match (cd, cs) {
            (Some(d), Some(s)) => (
                Some(d.bytes_mut()),
                Some((s.as_mut_slice::<f32>()?, ss_c[1])),
            ),
            _ => (None, None),
        };
        let mode = match self.block {
            BlockScaling::OneD => Mode::OneD,
            BlockScaling::TwoD => Mode::TwoD,
        };
        engine::run(
            self.dtype,
            mode,
            |a| self.scale::<T>(a),
            xs,
            m,
            k,
            row,
            row_s,
            col,
            col_s,
        )
    }
}

impl Format for Fp8BlockQuantizer {
    const NAME: &'static str = "fp8-block";
    const OPTIONS: &'static [OptionHelp] = &[
        OptionHelp {
            name: "128x128",
            help: "one scale per 128x128 tile (default; weights)",
        },
        OptionHelp {
            name: "1x128",
            help: "one scale per 128 elements of a row (activations)",
        },
        OptionHelp {
            name: "fp32-scales",
            help: "keep full fp32 scales instead of powers of two",
        },
        OptionHelp {
            name: "pow2",
            help: "power-of-two scales (default)",
        },
        OptionHelp {
            name: "e4m3",
            help: "E4M3 elements (default)",
        },
        OptionHelp {
            name: "e5m2",
            help: "E5M2 elements",
        },
        OptionHelp {
            name: "eps=X",
            help: "floor each block amax at X (default 0)",
        },
    ];
    const SHAPE_RULE: &'static str =
        "any shape: nothing to check (ragged edges become partial 128-blocks)";

    fn from_spec(options: &[&str], usage: Usage) -> Result<Self> {
        let mut q = Fp8BlockQuantizer::new(BlockScaling::TwoD, usage);
        for &o in options {
            match o {
                "128x128" => q.block = BlockScaling::TwoD,
                "1x128" => q.block = BlockScaling::OneD,
                "fp32-scales" => q.force_pow2_scales = false,
                "pow2" => q.force_pow2_scales = true,
                "e4m3" => q.dtype = Fp8Dtype::E4M3,
                "e5m2" => q.dtype = Fp8Dtype::E5M2,
                _ => match o.strip_prefix("eps=") {
                    Some(v) => {
                        let eps: f32 = v.parse().map_err(|_| {
                            Error::invalid("fp8-block option eps", v, "must be a number")
                        })?;
                        q = q.with_amax_epsilon(eps)?;
                    }
                    None => return Err(unknown_option::<Self>(o)),
                },
            }
        }
        Ok(q)
    }

    fn spec_options(&self) -> Vec<String> {
        let mut v = vec![match self.block {
            BlockScaling::OneD => "1x128".to_string(),
            BlockScaling::TwoD => "128x128".to_string(),
        }];
        if !self.force_pow2_scales {
            v.push("fp32-scales".into());
        }
        if self.dtype == Fp8Dtype::E5M2 {
            v.push("e5m2".into());
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
        Fp8BlockQuantizer {
            usage,
            ..self.clone()
        }
    }

    fn check_shape(&self, _shape: &Shape) -> Result<()> {
        Ok(())
    }

    fn buffers(&self, shape: &Shape) -> Result<Vec<BufferDesc>> {
        let (m, k) = shape.as_2d();
        let (sr, sc) = self.scale_shapes(m, k);
        let mut v = Vec::with_capacity(4);
        if self.usage.rowwise {
            v.push(BufferDesc::new("rowwise_data", DType::U8, shape.dims()));
            v.push(BufferDesc::new("rowwise_scale_inv", DType::F32, &sr));
        }
        if self.usage.columnwise {
            v.push(BufferDesc::new(
                "columnwise_data",
                DType::U8,
                shape.transposed().dims(),
            ));
            v.push(BufferDesc::new("columnwise_scale_inv", DType::F32, &sc));
        }
        Ok(v)
    }

    fn quantize_into(&self, x: &HostTensor<'_>, out: &mut [BufferMut<'_>]) -> Result<()> {
        dispatch_elements!(x, |xs| self.cast(xs, x.shape(), out))
    }

    fn dequantize_into<T: Element>(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        dir: Direction,
        out: &mut [T],
    ) -> Result<()> {
        let (m, k) = shape.as_2d();
        let (sr, sc) = self.scale_shapes(m, k);
        let (block, dt) = (self.block, self.dtype);
        match dir {
            Direction::Rowwise => {
                let q = buffer_by_name(bufs, "rowwise_data")?.bytes();
                let s = buffer_by_name(bufs, "rowwise_scale_inv")?.as_slice::<f32>()?;
                let level = simd::level();
                out.par_chunks_mut(BLOCK * k)
                    .zip(q.par_chunks(BLOCK * k))
                    .enumerate()
                    .for_each(|(mb, (o, q))| {
                        simd::dispatch(
                            level,
                            #[inline(always)]
                            || {
                                let (mut wide, mut js) = (WIDE, Vec::new());
                                let whole = k / BLOCK * BLOCK;
                                for (r, (o, q)) in o.chunks_mut(k).zip(q.chunks(k)).enumerate() {
                                    let i = mb * BLOCK + r;
                                    let si = |kb: usize| match block {
                                        BlockScaling::OneD => s[kb * sr[1] + i],
                                        BlockScaling::TwoD => s[mb * sr[1] + kb],
                                    };
                                    // The row's whole blocks in one call where they all
                                    // take the 16-bit lanes, else block by block.
                                    let (ow, qw) = (&mut o[..whole], &q[..whole]);
                                    let done = if decode_pow2(level, dt, qw, si, &mut js, ow) {
                                        whole
                                    } else {
                                        0
                                    };
                                    for (kb, (ob, qb)) in o[done..]
                                        .chunks_mut(BLOCK)
                                        .zip(q[done..].chunks(BLOCK))
                                        .enumerate()
                                    {
                                        let kb = done / BLOCK + kb;
                                        // (A partial last block is refused: not whole.)
                                        let one = |_| si(kb);
                                        if !decode_pow2(level, dt, qb, one, &mut js, ob) {
                                            decode_scaled(dt, qb, si(kb), ob, &mut wide);
                                        }
                                    }
                                }
                            },
                        )
                    });
            }
            Direction::Columnwise => {
                let q = buffer_by_name(bufs, "columnwise_data")?.bytes();
                let s = buffer_by_name(bufs, "columnwise_scale_inv")?.as_slice::<f32>()?;
                // q is [K, M]: the scale of logical (i, j) is that of stored (j, i);
                // columnwise blocks are 128 rows tall, one per slab of the decoder.
                const _: () = assert!(BLOCK == crate::transpose::SLAB);
                decode_transposed(
                    dt,
                    q,
                    m,
                    k,
                    |i, j0, si: &mut [f32]| {
                        let mb = i / BLOCK;
                        match block {
                            BlockScaling::OneD => {
                                si.copy_from_slice(&s[mb * sc[1] + j0..mb * sc[1] + j0 + si.len()])
                            }
                            BlockScaling::TwoD => {
                                // Runs of one block column each; `j0` need not start one.
                                let mut at = 0;
                                while at < si.len() {
                                    let j = j0 + at;
                                    let end = (at + BLOCK - j % BLOCK).min(si.len());
                                    si[at..end].fill(s[j / BLOCK * sc[1] + mb]);
                                    at = end;
                                }
                            }
                        }
                    },
                    out,
                );
            }
        }
        Ok(())
    }

    /// Data buffers are written in full; scale buffers have zero padding and are zeroed.
    fn overwrites(&self, desc: &BufferDesc) -> bool {
        desc.name.ends_with("_data")
    }

    /// 128x128 shares one scale per tile between directions, so either direction is the
    /// bitwise transpose of the other (data and scales), as TE's `update_usage` allows.
    /// 1x128 blocks are scaled separately per direction and refuse.
    fn derive_buffers(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        missing: &[BufferDesc],
    ) -> Result<Vec<Buffer>> {
        if self.block == BlockScaling::OneD {
            return Err(Error::unsupported(
                Self::NAME,
                "deriving the other direction of a 1x128 tensor",
                "1x128 rowwise and columnwise blocks have different scales; quantize again with the new usage",
            ));
        }
        let (m, k) = shape.as_2d();
        let (sr, sc) = self.scale_shapes(m, k);
        let (nmb, nkb) = (ceil_div(m, BLOCK), ceil_div(k, BLOCK));
        missing
            .iter()
            .map(|d| {
                let mut b = Buffer::zeroed(d.clone())?;
                match d.name.as_str() {
                    "columnwise_data" => transpose_bytes(
                        buffer_by_name(bufs, "rowwise_data")?.bytes(),
                        b.bytes_mut(),
                        m,
                        k,
                    ),
                    "rowwise_data" => transpose_bytes(
                        buffer_by_name(bufs, "columnwise_data")?.bytes(),
                        b.bytes_mut(),
                        k,
                        m,
                    ),
                    "columnwise_scale_inv" => {
                        let src = buffer_by_name(bufs, "rowwise_scale_inv")?.as_slice::<f32>()?;
                        let dst = b.as_mut_slice::<f32>()?;
                        for mb in 0..nmb {
                            for kb in 0..nkb {
                                dst[kb * sc[1] + mb] = src[mb * sr[1] + kb];
                            }
                        }
                    }
                    "rowwise_scale_inv" => {
                        let src =
                            buffer_by_name(bufs, "columnwise_scale_inv")?.as_slice::<f32>()?;
                        let dst = b.as_mut_slice::<f32>()?;
                        for mb in 0..nmb {
                            for kb in 0..nkb {
                                dst[mb * sr[1] + kb] = src[kb * sc[1] + mb];
                            }
                        }
                    }
                    other => return Err(Error::buffer(other, "cannot be derived")),
                }
                Ok(b)
            })
            .collect()
    }

    /// 1x128 rowwise scales are per row; columnwise and 128x128 blocks span 128 rows.
    fn row_granularity(&self) -> Option<usize> {
        match (self.block, self.usage.columnwise) {
            (BlockScaling::OneD, false) => Some(1),
            _ => Some(BLOCK),
        }
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
        let (sr, sc) = self.scale_shapes(m, k);
        let (sr_out, sc_out) = self.scale_shapes(m_out, k);
        let blocks = block_ranges(ranges, BLOCK);
        Format::buffers(self, out_shape)?
            .into_iter()
            .map(|d| {
                let name = d.name.clone();
                let mut b = Buffer::zeroed(d)?;
                let src = buffer_by_name(bufs, &name)?.bytes();
                let dst = b.bytes_mut();
                match (name.as_str(), self.block) {
                    ("rowwise_data", _) => gather_row_ranges(src, k, ranges, dst)?,
                    ("columnwise_data", _) => gather_col_ranges(src, k, m, dst, m_out, ranges, 1)?,
                    // [ceil(K/128), roundup(M,4)]: rows are columns here.
                    ("rowwise_scale_inv", BlockScaling::OneD) => {
                        gather_col_ranges(src, sr[0], sr[1], dst, sr_out[1], ranges, 4)?
                    }
                    // [ceil(M/128), roundup(K,4)] and [ceil(M/128), ...]: block rows.
                    ("columnwise_scale_inv", BlockScaling::OneD) => {
                        gather_row_ranges(src, sc[1] * 4, &blocks, dst)?
                    }
                    ("rowwise_scale_inv", BlockScaling::TwoD) => {
                        gather_row_ranges(src, sr[1] * 4, &blocks, dst)?
                    }
                    // [ceil(K/128), roundup(ceil(M/128),4)]: block columns.
                    ("columnwise_scale_inv", BlockScaling::TwoD) => {
                        gather_col_ranges(src, sc[0], sc[1], dst, sc_out[1], &blocks, 4)?
                    }
                    (other, _) => return Err(Error::buffer(other, "has no row-gather rule")),
                }
                Ok(b)
            })
            .collect()
    }

    fn validate_buffers(&self, shape: &Shape, bufs: &[Buffer]) -> Result<()> {
        let (m, k) = shape.as_2d();
        let (sr, sc) = self.scale_shapes(m, k);
        let (nmb, nkb) = (ceil_div(m, BLOCK), ceil_div(k, BLOCK));
        // Logical region of each scale matrix: (rows, cols) used within its padded shape.
        let regions: [(&str, [usize; 2], usize, usize); 2] = match self.block {
            BlockScaling::OneD => [
                ("rowwise_scale_inv", sr, nkb, m),
                ("columnwise_scale_inv", sc, nmb, k),
            ],
            BlockScaling::TwoD => [
                ("rowwise_scale_inv", sr, nmb, nkb),
                ("columnwise_scale_inv", sc, nkb, nmb),
            ],
        };
        for (name, padded, rows, cols) in regions {
            let Some(b) = bufs.iter().find(|b| b.name() == name) else {
                continue;
            };
            let s = b.as_slice::<f32>()?;
            for r in 0..rows {
                for c in 0..cols {
                    let v = s[r * padded[1] + c];
                    if !crate::scale::valid_scale_inv(v) {
                        return Err(Error::buffer(
                            name,
                            format!(
                                "entry ({r}, {c}) holds {v}; block scales must be finite and \
                                 >= +0 (+0: an all-zero block)"
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
