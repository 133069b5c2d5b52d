//! [`Mxfp8Quantizer`]: the options, the [`Format`] implementation, and storage helpers.

use std::ops::Range;

use quant_core::format::{buffer_by_name, unknown_option};
use quant_core::layout::{block_ranges, gather_row_ranges};
use quant_core::{
    Buffer, BufferDesc, BufferMut, DType, Direction, Element, Error, Format, HostTensor,
    OptionHelp, QuantizedTensor, Result, Shape, Usage, dispatch_elements,
};
use serde::{Deserialize, Serialize};

use crate::kernels::{self, Cfg};
use crate::layout::{
    ScaleLayout, columnwise_scale_index, columnwise_scale_shape, convert_scales,
    rowwise_scale_index, rowwise_scale_shape, scale_shape,
};
use crate::scale::{BLOCK, Mxfp8Dtype, ScaleRule};

/// Buffer names, in storage order.
pub const ROWWISE_DATA: &str = "rowwise_data";
/// Rowwise E8M0 scales.
pub const ROWWISE_SCALE_INV: &str = "rowwise_scale_inv";
/// Columnwise FP8 data (input shape, not transposed).
pub const COLUMNWISE_DATA: &str = "columnwise_data";
/// Columnwise E8M0 scales.
pub const COLUMNWISE_SCALE_INV: &str = "columnwise_scale_inv";

/// The MXFP8 quantizer (format name `mxfp8`): E4M3 or E5M2 elements, one E8M0 scale per
/// 32 elements, TransformerEngine's scale rule by default.
///
/// Options (spec `mxfp8[:e4m3|e5m2][,2d][,ocp][,swizzled]`, all combinable):
///
/// | option | field (file metadata) | meaning |
/// |---|---|---|
/// | `e4m3` / `e5m2` | `dtype` | element format (default E4M3) |
/// | `2d` | `with_2d_quantization` | one scale per 32x32 tile; both directions identical |
/// | `ocp` | `scale_rule: "ocp"` | OCP floor rule instead of TE's ceil rule ([`ScaleRule`]) |
/// | `swizzled` | `scale_layout: "swizzled"` | cuBLAS 128x4-tile scale order ([`ScaleLayout`]) |
///
/// Buffers for an `[.., K]` tensor with `M` rows (`M`, `K` multiples of 32), all `u8`:
/// `rowwise_data` (input shape), `rowwise_scale_inv` `[roundup(M,128), roundup(K/32,4)]`,
/// `columnwise_data` (input shape), `columnwise_scale_inv` `[roundup(M/32,4),
/// roundup(K,128)]`; padding zero-filled. See [`crate::layout`] for the byte maps.
///
/// ```
/// use fmt_mxfp8::Mxfp8Quantizer;
/// use quant_core::{Direction, DType, HostTensor, Usage};
/// let x: Vec<f32> = (0..64 * 96).map(|i| ((i % 89) as f32 - 44.0) / 3.0).collect();
/// let q = Mxfp8Quantizer::new(Usage::BOTH);
/// let t = q.quantize(&HostTensor::f32(&x, &[64, 96])?)?;
/// assert_eq!(t.buffer("rowwise_scale_inv")?.shape(), &[128, 4]);
/// assert_eq!(t.buffer("columnwise_scale_inv")?.shape(), &[4, 128]);
/// assert_eq!(t.buffer("columnwise_data")?.shape(), &[64, 96]); // not transposed
/// let back = t.dequantize(Direction::Columnwise, DType::F32)?.to_f32_vec();
/// assert!(back.iter().zip(&x).all(|(b, x)| (b - x).abs() <= x.abs() / 16.0));
/// # Ok::<(), quant_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mxfp8Quantizer {
    dtype: Mxfp8Dtype,
    scale_rule: ScaleRule,
    #[serde(rename = "with_2d_quantization")]
    two_d: bool,
    scale_layout: ScaleLayout,
    usage: Usage,
}

impl Mxfp8Quantizer {
    /// E4M3, TE scale rule, 1-D blocks, compact scales, with `usage`.
    pub fn new(usage: Usage) -> Mxfp8Quantizer {
        Mxfp8Quantizer {
            dtype: Mxfp8Dtype::E4M3,
            scale_rule: ScaleRule::Te,
            two_d: false,
            scale_layout: ScaleLayout::Compact,
            usage,
        }
    }

    /// Chooses E4M3 or E5M2 elements.
    pub fn with_dtype(mut self, dtype: Mxfp8Dtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// Chooses the TE (default) or OCP scale rule.
    pub fn with_scale_rule(mut self, rule: ScaleRule) -> Self {
        self.scale_rule = rule;
        self
    }

    /// One scale per 32x32 tile (TE `with_2d_quantization`, used for weights).
    pub fn with_2d(mut self, two_d: bool) -> Self {
        self.two_d = two_d;
        self
    }

    /// Chooses compact or cuBLAS-swizzled scale buffers.
    pub fn with_scale_layout(mut self, layout: ScaleLayout) -> Self {
        self.scale_layout = layout;
        self
    }

    /// The element format.
    pub fn dtype(&self) -> Mxfp8Dtype {
        self.dtype
    }

    /// The scale rule.
    pub fn scale_rule(&self) -> ScaleRule {
        self.scale_rule
    }

    /// Whether scales are per 32x32 tile.
    pub fn is_2d(&self) -> bool {
        self.two_d
    }

    /// The scale buffers' byte order.
    pub fn scale_layout(&self) -> ScaleLayout {
        self.scale_layout
    }

    /// Quantizes `x` (static dispatch).
    pub fn quantize(&self, x: &HostTensor<'_>) -> Result<QuantizedTensor<Self>> {
        quant_core::quantize(self, x)
    }

    /// Padded shapes of the (rowwise, columnwise) scale buffers of an `[m, k]` tensor.
    pub fn scale_shapes(&self, m: usize, k: usize) -> ([usize; 2], [usize; 2]) {
        (rowwise_scale_shape(m, k), columnwise_scale_shape(m, k))
    }

    /// Whether quantizing an `[m, k]` tensor of `input` dtype maps an input `-0.0` to
    /// `+0` (byte `0x00`) instead of `-0` (`0x80`), as TransformerEngine does on the path
    /// it takes for that call; nothing else about the bytes depends on the path.
    ///
    /// On sm_100+, TE's `quantize_mxfp8.cuh::quantize` dispatches bf16/fp16 inputs
    /// (without fused activation, dbias or noop flag, and without 2-D scaling) to the
    /// cast-only kernels of `specialized/quantize_mxfp8.cuh` when
    ///
    /// * rowwise only: `K % 128 == 0` and `ceil(M/4) <= 65535`, or
    /// * both directions: `ceil(M/32) <= 65535` (M, K multiples of 32 always hold);
    ///
    /// those compute `x * s` as `fma.rn.f32x2(x, s, +0)`: for `x = -0.0` the exact result
    /// is `-0 + +0 = +0`, while a nonzero product keeps its sign even when it underflows
    /// (one rounding of a nonzero value). Every other
    /// case — f32 input, columnwise only, `2d`, larger `M`, rowwise with `K % 128 != 0` —
    /// runs the generic kernel's `mul.f32x2`, which keeps the sign. The `ocp` rule follows
    /// torchao's plain multiply and always keeps it.
    ///
    /// ```
    /// use fmt_mxfp8::Mxfp8Quantizer;
    /// use quant_core::{DType, Usage};
    /// let both = Mxfp8Quantizer::new(Usage::BOTH);
    /// assert!(both.flushes_negative_zero(DType::BF16, 4096, 4096));
    /// assert!(!both.flushes_negative_zero(DType::F32, 4096, 4096));
    /// assert!(!both.with_2d(true).flushes_negative_zero(DType::BF16, 4096, 4096));
    /// let row = Mxfp8Quantizer::new(Usage::ROWWISE);
    /// assert!(row.flushes_negative_zero(DType::F16, 64, 256));
    /// assert!(!row.flushes_negative_zero(DType::F16, 64, 96)); // K % 128 != 0
    /// assert!(!Mxfp8Quantizer::new(Usage::COLUMNWISE).flushes_negative_zero(DType::BF16, 64, 256));
    /// ```
    pub fn flushes_negative_zero(&self, input: DType, m: usize, k: usize) -> bool {
        const MAX_GRID_Y: usize = 65535;
        if self.scale_rule != ScaleRule::Te
            || self.two_d
            || !matches!(input, DType::BF16 | DType::F16)
        {
            return false;
        }
        match (self.usage.rowwise, self.usage.columnwise) {
            (true, false) => k.is_multiple_of(128) && m.div_ceil(4) <= MAX_GRID_Y,
            (true, true) => m.div_ceil(32) <= MAX_GRID_Y,
            _ => false,
        }
    }

    fn cfg(&self, input: DType, m: usize, k: usize) -> Cfg {
        Cfg {
            level: quant_core::simd::level(),
            dtype: self.dtype,
            rule: self.scale_rule,
            plus_zero: self.flushes_negative_zero(input, m, k),
        }
    }

    fn cast<T: Element>(
        &self,
        xs: &[T],
        m: usize,
        k: usize,
        bufs: &mut [BufferMut<'_>],
    ) -> Result<()> {
        let [rd, rs, cd, cs] = quant_core::format::buffers_by_name_mut(
            bufs,
            [
                ROWWISE_DATA,
                ROWWISE_SCALE_INV,
                COLUMNWISE_DATA,
                COLUMNWISE_SCALE_INV,
            ],
        );
        let rowwise = pair(rd, rs, ROWWISE_DATA, self.usage.rowwise)?;
        let columnwise = pair(cd, cs, COLUMNWISE_DATA, self.usage.columnwise)?;
        let (rshape, cshape) = self.scale_shapes(m, k);
        let n = m * k;
        for (p, shape) in [(&rowwise, rshape), (&columnwise, cshape)] {
            if let Some((d, s)) = p {
                check_len(d.name(), d.bytes().len(), n)?;
                check_len(s.name(), s.bytes().len(), shape[0] * shape[1])?;
            }
        }
        let cfg = self.cfg(T::DTYPE, m, k);
        kernels::quantize(
            cfg,
            self.two_d,
            self.scale_layout,
            xs,
            m,
            k,
            rowwise.map(|(d, s)| (d.bytes_mut(), s.bytes_mut())),
            columnwise.map(|(d, s)| (d.bytes_mut(), s.bytes_mut())),
        )
    }

    fn swizzled(&self) -> bool {
        self.scale_layout == ScaleLayout::Swizzled
    }

    /// The code of 32x32 tile `(mb, kb)` as stored in a direction's scale buffer.
    fn tile_code(&self, dir: Direction, s: &[u8], m: usize, k: usize, mb: usize, kb: usize) -> u8 {
        let idx = match dir {
            Direction::Rowwise => rowwise_scale_index(self.scale_layout, m, k, mb * BLOCK, kb),
            Direction::Columnwise => {
                columnwise_scale_index(self.scale_layout, m, k, mb, kb * BLOCK)
            }
        };
        s.get(idx).copied().unwrap_or(0)
    }

    /// Checks that every entry of a 2-D tensor's `dir` scales equals its tile's code.
    fn check_tiles(&self, dir: Direction, s: &[u8], m: usize, k: usize) -> Result<()> {
        let name = scale_name(dir);
        let [a, b] = scale_shape(dir, m, k);
        check_len(name, s.len(), a * b)?;
        let layout = self.scale_layout;
        let (rows, cols) = match dir {
            Direction::Rowwise => (m, k / BLOCK),
            Direction::Columnwise => (m / BLOCK, k),
        };
        for r in 0..rows {
            for c in 0..cols {
                let (idx, mb, kb) = match dir {
                    Direction::Rowwise => (rowwise_scale_index(layout, m, k, r, c), r / BLOCK, c),
                    Direction::Columnwise => {
                        (columnwise_scale_index(layout, m, k, r, c), r, c / BLOCK)
                    }
                };
                let (got, want) = (s.get(idx).copied(), self.tile_code(dir, s, m, k, mb, kb));
                if got != Some(want) {
                    return Err(Error::buffer(
                        name,
                        format!(
                            "entry ({r}, {c}) is {:#04x} but its 32x32 tile ({mb}, {kb}) has {want:#04x}; \
                             a 2d tensor holds one scale per tile",
                            got.unwrap_or(0)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn scale_name(dir: Direction) -> &'static str {
    match dir {
        Direction::Rowwise => ROWWISE_SCALE_INV,
        Direction::Columnwise => COLUMNWISE_SCALE_INV,
    }
}

fn data_name(dir: Direction) -> &'static str {
    match dir {
        Direction::Rowwise => ROWWISE_DATA,
        Direction::Columnwise => COLUMNWISE_DATA,
    }
}

type Pair<'a, 'b> = Option<(&'a mut BufferMut<'b>, &'a mut BufferMut<'b>)>;

fn pair<'a, 'b>(
    d: Option<&'a mut BufferMut<'b>>,
    s: Option<&'a mut BufferMut<'b>>,
    name: &str,
    wanted: bool,
) -> Result<Pair<'a, 'b>> {
    match (d, s, wanted) {
        (Some(d), Some(s), true) => Ok(Some((d, s))),
        (_, _, false) => Ok(None),
        _ => Err(Error::buffer(
            name,
            "or its scale_inv is missing from the output buffers",
        )),
    }
}

fn check_len(name: &str, len: usize, n: usize) -> Result<()> {
    if len == n {
        Ok(())
    } else {
        Err(Error::buffer(
            name,
            format!("has {len} bytes, {n} expected"),
        ))
    }
}

fn dir_bytes(bufs: &[Buffer], dir: Direction, m: usize, k: usize) -> Result<(&[u8], &[u8])> {
    let d = buffer_by_name(bufs, data_name(dir))?;
    let s = buffer_by_name(bufs, scale_name(dir))?;
    check_len(d.name(), d.bytes().len(), m * k)?;
    let [a, b] = scale_shape(dir, m, k);
    check_len(s.name(), s.bytes().len(), a * b)?;
    Ok((d.bytes(), s.bytes()))
}

impl Format for Mxfp8Quantizer {
    const NAME: &'static str = "mxfp8";
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
            name: "2d",
            help: "one scale per 32x32 tile; rowwise and columnwise data identical",
        },
        OptionHelp {
            name: "ocp",
            help: "OCP floor scale rule (torchao FLOOR) instead of TransformerEngine's ceil rule",
        },
        OptionHelp {
            name: "swizzled",
            help: "scales in the cuBLAS 128x4-tile layout (columnwise: of the transpose)",
        },
    ];
    const SHAPE_RULE: &'static str =
        "M (product of the leading dims) and K (last dim) must be multiples of 32";

    fn from_spec(options: &[&str], usage: Usage) -> Result<Self> {
        let mut q = Mxfp8Quantizer::new(usage);
        for &o in options {
            match o {
                "e4m3" => q.dtype = Mxfp8Dtype::E4M3,
                "e5m2" => q.dtype = Mxfp8Dtype::E5M2,
                "2d" => q.two_d = true,
                "ocp" => q.scale_rule = ScaleRule::Ocp,
                "swizzled" => q.scale_layout = ScaleLayout::Swizzled,
                _ => return Err(unknown_option::<Self>(o)),
            }
        }
        Ok(q)
    }

    fn spec_options(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.dtype == Mxfp8Dtype::E5M2 {
            v.push("e5m2".to_string());
        }
        if self.two_d {
            v.push("2d".to_string());
        }
        if self.scale_rule == ScaleRule::Ocp {
            v.push("ocp".to_string());
        }
        if self.swizzled() {
            v.push("swizzled".to_string());
        }
        v
    }

    fn usage(&self) -> Usage {
        self.usage
    }

    fn with_usage(&self, usage: Usage) -> Self {
        Mxfp8Quantizer {
            usage,
            ..self.clone()
        }
    }

    /// `K` (last dim) and `M` (product of the leading dims) must be multiples of 32, as
    /// TE's `MXFP8Quantizer::create_tensor` requires; checked before any work. `M = 0`
    /// passes, as in every format: a grouped tensor may hold a member with no rows (an
    /// expert that received no tokens), while quantizing or allocating an empty tensor
    /// on its own is refused by the shared entry points.
    fn check_shape(&self, shape: &Shape) -> Result<()> {
        let (m, k) = shape.as_2d();
        if !k.is_multiple_of(BLOCK) {
            return Err(Error::shape(Self::NAME, "K", k, "must be a multiple of 32"));
        }
        if !m.is_multiple_of(BLOCK) {
            let rule = if shape.rank() == 2 {
                "must be a multiple of 32".to_string()
            } else {
                format!(
                    "must be a multiple of 32 (M is the product of the leading dims of {shape})"
                )
            };
            return Err(Error::shape(Self::NAME, "M", m, rule));
        }
        Ok(())
    }

    fn buffers(&self, shape: &Shape) -> Result<Vec<BufferDesc>> {
        self.check_shape(shape)?;
        let (m, k) = shape.as_2d();
        let (sr, sc) = self.scale_shapes(m, k);
        let mut v = Vec::with_capacity(4);
        if self.usage.rowwise {
            v.push(BufferDesc::new(ROWWISE_DATA, DType::U8, shape.dims()));
            v.push(BufferDesc::new(ROWWISE_SCALE_INV, DType::U8, &sr));
        }
        if self.usage.columnwise {
            v.push(BufferDesc::new(COLUMNWISE_DATA, DType::U8, shape.dims()));
            v.push(BufferDesc::new(COLUMNWISE_SCALE_INV, DType::U8, &sc));
        }
        Ok(v)
    }

    fn quantize_into(&self, x: &HostTensor<'_>, out: &mut [BufferMut<'_>]) -> Result<()> {
        self.check_shape(x.shape())?;
        let (m, k) = x.shape().as_2d();
        dispatch_elements!(x, |xs| self.cast(xs, m, k, out))
    }

    /// Data buffers are written in full; scale padding is left alone (zeroed).
    fn overwrites(&self, desc: &BufferDesc) -> bool {
        desc.name == ROWWISE_DATA || desc.name == COLUMNWISE_DATA
    }

    fn dequantize_into<T: Element>(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        dir: Direction,
        out: &mut [T],
    ) -> Result<()> {
        self.check_shape(shape)?;
        let (m, k) = shape.as_2d();
        if out.len() != m * k {
            return Err(Error::invalid(
                "out",
                format!("{} elements", out.len()),
                format!("must hold the {} elements of {shape}", m * k),
            ));
        }
        let (q, s) = dir_bytes(bufs, dir, m, k)?;
        match dir {
            Direction::Rowwise => {
                kernels::dequantize_rowwise(self.dtype, self.scale_layout, m, k, q, s, out)
            }
            Direction::Columnwise => {
                kernels::dequantize_columnwise(self.dtype, self.scale_layout, m, k, q, s, out)
            }
        }
        Ok(())
    }

    /// Only 2-D tensors can change usage upwards: their directions share one scale per
    /// 32x32 tile and hold identical data, so the missing direction is a copy of the
    /// data plus the tile codes re-spread. 1-D rowwise (1x32) and columnwise (32x1)
    /// blocks have different scales, so they refuse — as TE's
    /// `MXFP8TensorStorage.update_usage` does (it only ever drops a direction; TE
    /// refuses in 2-D mode too, where quantfmt derives).
    fn derive_buffers(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        missing: &[BufferDesc],
    ) -> Result<Vec<Buffer>> {
        if !self.two_d {
            return Err(Error::unsupported(
                Self::NAME,
                "deriving one direction of a 1-D MXFP8 tensor from the other",
                "1x32 rowwise and 32x1 columnwise blocks have different scales (TransformerEngine \
                 refuses too); quantize again with the new usage, or use the 2d option",
            ));
        }
        let (m, k) = shape.as_2d();
        let have = if self.usage.rowwise {
            Direction::Rowwise
        } else {
            Direction::Columnwise
        };
        let (q, s) = dir_bytes(bufs, have, m, k)?;
        let (nmb, nkb) = (m / BLOCK, k / BLOCK);
        let mut tiles = vec![0u8; nmb * nkb];
        for (t, code) in tiles.iter_mut().enumerate() {
            *code = self.tile_code(have, s, m, k, t / nkb.max(1), t % nkb.max(1));
        }
        let (sr, sc) = self.scale_shapes(m, k);
        missing
            .iter()
            .map(|d| {
                let mut b = Buffer::zeroed(d.clone())?;
                let (dir, shape) = match d.name.as_str() {
                    ROWWISE_DATA | COLUMNWISE_DATA => {
                        check_len(&d.name, b.bytes().len(), q.len())?;
                        b.bytes_mut().copy_from_slice(q);
                        return Ok(b);
                    }
                    ROWWISE_SCALE_INV => (Direction::Rowwise, sr),
                    COLUMNWISE_SCALE_INV => (Direction::Columnwise, sc),
                    other => return Err(Error::buffer(other, "cannot be derived")),
                };
                check_len(&d.name, b.bytes().len(), shape[0] * shape[1])?;
                let mut compact = vec![0u8; shape[0] * shape[1]];
                match dir {
                    Direction::Rowwise => {
                        kernels::tiles_to_rowwise(&tiles, m, k, &mut compact, shape[1])
                    }
                    Direction::Columnwise => {
                        kernels::tiles_to_columnwise(&tiles, m, k, &mut compact, shape[1])
                    }
                }
                convert_scales(
                    dir,
                    ScaleLayout::Compact,
                    self.scale_layout,
                    &compact,
                    b.bytes_mut(),
                    m,
                    k,
                )?;
                Ok(b)
            })
            .collect()
    }

    /// Rowwise scales are per row and columnwise scales per 32 rows (and the shape rule
    /// keeps M a multiple of 32), so rows move in blocks of 32.
    fn row_granularity(&self) -> Option<usize> {
        Some(BLOCK)
    }

    /// Data rows move as they are (both directions are stored `[M, K]`); rowwise scale
    /// rows and columnwise scale block-rows move with them. Swizzled scales are moved in
    /// their compact order and swizzled again for the new shape.
    fn gather_rows(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        ranges: &[Range<usize>],
        out_shape: &Shape,
    ) -> Result<Vec<Buffer>> {
        let (m, k) = shape.as_2d();
        let m_out = out_shape.rows();
        let blocks = block_ranges(ranges, BLOCK);
        Format::buffers(self, out_shape)?
            .into_iter()
            .map(|d| {
                let name = d.name.clone();
                let mut b = Buffer::zeroed(d)?;
                let src = buffer_by_name(bufs, &name)?.bytes();
                let dir = match name.as_str() {
                    ROWWISE_DATA | COLUMNWISE_DATA => {
                        gather_row_ranges(src, k, ranges, b.bytes_mut())?;
                        return Ok(b);
                    }
                    ROWWISE_SCALE_INV => Direction::Rowwise,
                    COLUMNWISE_SCALE_INV => Direction::Columnwise,
                    other => return Err(Error::buffer(other, "has no row-gather rule")),
                };
                let [rows, cols] = scale_shape(dir, m, k);
                let mut compact = vec![0u8; rows * cols];
                convert_scales(
                    dir,
                    self.scale_layout,
                    ScaleLayout::Compact,
                    src,
                    &mut compact,
                    m,
                    k,
                )?;
                let mut moved = vec![0u8; b.nbytes()];
                let row_ranges = match dir {
                    Direction::Rowwise => ranges,
                    Direction::Columnwise => &blocks[..],
                };
                gather_row_ranges(&compact, cols, row_ranges, &mut moved)?;
                convert_scales(
                    dir,
                    ScaleLayout::Compact,
                    self.scale_layout,
                    &moved,
                    b.bytes_mut(),
                    m_out,
                    k,
                )?;
                Ok(b)
            })
            .collect()
    }

    /// What a file may hold, and what is refused:
    ///
    /// * Every E8M0 byte is accepted, `0xFF` included: it is the E8M0 NaN, which the OCP
    ///   rule writes for blocks holding NaN or inf (and TE's `float_to_e8m0` for a NaN
    ///   amax); such a block dequantizes to NaN, as the format defines.
    /// * Every FP8 byte is a valid E4M3/E5M2 code.
    /// * Scale padding is accepted whatever it holds and never read: TE leaves compact
    ///   padding uninitialised (`at::empty`), so files written from TE tensors may carry
    ///   garbage there; quantfmt itself writes zeros.
    /// * A `2d` tensor must be one: every scale entry equals its 32x32 tile's code, and
    ///   with both directions present their codes and data bytes are identical. (Usage
    ///   changes copy one direction into the other on that premise.)
    fn validate_buffers(&self, shape: &Shape, bufs: &[Buffer]) -> Result<()> {
        if !self.two_d {
            return Ok(());
        }
        let (m, k) = shape.as_2d();
        let mut present = Vec::new();
        for dir in [Direction::Rowwise, Direction::Columnwise] {
            if self.usage.has(dir) {
                let (q, s) = dir_bytes(bufs, dir, m, k)?;
                self.check_tiles(dir, s, m, k)?;
                present.push((dir, q, s));
            }
        }
        if let [(_, qr, sr), (_, qc, sc)] = present[..] {
            for mb in 0..m / BLOCK {
                for kb in 0..k / BLOCK {
                    let r = self.tile_code(Direction::Rowwise, sr, m, k, mb, kb);
                    let c = self.tile_code(Direction::Columnwise, sc, m, k, mb, kb);
                    if r != c {
                        return Err(Error::buffer(
                            COLUMNWISE_SCALE_INV,
                            format!(
                                "tile ({mb}, {kb}) is {c:#04x} but rowwise_scale_inv has {r:#04x}; \
                                 a 2d tensor's directions share one scale per tile"
                            ),
                        ));
                    }
                }
            }
            if let Some(i) = qr.iter().zip(qc).position(|(a, b)| a != b) {
                return Err(Error::buffer(
                    COLUMNWISE_DATA,
                    format!(
                        "differs from rowwise_data at element {i}; a 2d tensor's directions hold identical data"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Storage-level helpers for [`crate::Mxfp8Tensor`].
///
/// ```
/// use fmt_mxfp8::{Mxfp8Quantizer, Mxfp8TensorExt, ScaleLayout};
/// use quant_core::{Direction, HostTensor, Usage};
/// let x: Vec<f32> = (0..160 * 64).map(|i| (i as f32).sin() * (i % 7) as f32).collect();
/// let t = Mxfp8Quantizer::new(Usage::BOTH).quantize(&HostTensor::f32(&x, &[160, 64])?)?;
/// let sw = t.to_scale_layout(ScaleLayout::Swizzled)?;
/// assert_eq!(sw.quantizer().scale_layout(), ScaleLayout::Swizzled);
/// assert_eq!(sw.scale_codes(Direction::Rowwise)?, t.scale_codes(Direction::Rowwise)?);
/// assert_eq!(sw.dequantize_f32()?, t.dequantize_f32()?);
/// let back = sw.to_scale_layout(ScaleLayout::Compact)?;
/// assert_eq!(back.buffer("columnwise_scale_inv")?.bytes(), t.buffer("columnwise_scale_inv")?.bytes());
/// # Ok::<(), quant_core::Error>(())
/// ```
pub trait Mxfp8TensorExt: Sized {
    /// The same tensor with its scale buffers permuted into `layout` (exact, padding
    /// carried along; a clone when the layout is already `layout`). The quantizer's
    /// recorded layout changes with it, so files stay self-describing.
    fn to_scale_layout(&self, layout: ScaleLayout) -> Result<Self>;

    /// The logical (unpadded) scale codes of `dir`, row-major, whatever the layout:
    /// rowwise `[M, K/32]`, columnwise `[M/32, K]`.
    fn scale_codes(&self, dir: Direction) -> Result<Vec<u8>>;
}

impl Mxfp8TensorExt for QuantizedTensor<Mxfp8Quantizer> {
    fn to_scale_layout(&self, layout: ScaleLayout) -> Result<Self> {
        let q = self.quantizer();
        if q.scale_layout == layout {
            return Ok(self.clone());
        }
        let (m, k) = self.shape().as_2d();
        let bufs = self
            .buffers()
            .iter()
            .map(|b| {
                let dir = match b.name() {
                    ROWWISE_SCALE_INV => Direction::Rowwise,
                    COLUMNWISE_SCALE_INV => Direction::Columnwise,
                    _ => return Ok(b.clone()),
                };
                let mut out = vec![0u8; b.bytes().len()];
                convert_scales(dir, q.scale_layout, layout, b.bytes(), &mut out, m, k)?;
                Buffer::from_bytes(b.desc().clone(), &out)
            })
            .collect::<Result<Vec<_>>>()?;
        QuantizedTensor::from_buffers(
            q.clone().with_scale_layout(layout),
            self.shape(),
            self.dtype(),
            bufs,
        )
    }

    fn scale_codes(&self, dir: Direction) -> Result<Vec<u8>> {
        let q = self.quantizer();
        let (m, k) = self.shape().as_2d();
        if !q.usage.has(dir) {
            return Err(Error::invalid(
                "direction",
                dir,
                format!("is not stored (usage is {})", q.usage),
            ));
        }
        let s = self.buffer(scale_name(dir))?.bytes();
        let (rows, cols) = match dir {
            Direction::Rowwise => (m, k / BLOCK),
            Direction::Columnwise => (m / BLOCK, k),
        };
        let mut out = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                let idx = match dir {
                    Direction::Rowwise => rowwise_scale_index(q.scale_layout, m, k, r, c),
                    Direction::Columnwise => columnwise_scale_index(q.scale_layout, m, k, r, c),
                };
                let code = s.get(idx).copied().ok_or_else(|| {
                    Error::buffer(scale_name(dir), format!("is too short for index {idx}"))
                })?;
                out.push(code);
            }
        }
        Ok(out)
    }
}
