//! [`Int4TiledQuantizer`]: options, shape rule, buffers, and the [`Format`] impl.

use std::fmt;
use std::hash::{Hash, Hasher};

use half::bf16;
use quant_core::format::{buffer_by_name, buffers_by_name_mut, unknown_option};
use quant_core::shape::round_up;
use quant_core::{
    Buffer, BufferDesc, BufferMut, DType, Direction, Element, Error, Format, HostTensor,
    OptionHelp, QuantizedTensor, Result, Shape, Usage, dispatch_elements,
};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::kernels;
use quant_core::simd;
use quant_core::stream::StoreMode;
use quant_core::strips::column_strips;
use std::ops::Range;

use quant_core::layout::{block_ranges, gather_col_ranges, gather_row_ranges};

use crate::layout::{K_TILE, N_TILE, pack_tile, unpack_row};
use crate::qparams::{EPS_V2, QParamsPath, quantize_group};

/// Group sizes the CUDA kernel instantiates (`_weight_int4pack_mm` checks 32/64/128/256).
pub const GROUP_SIZES: [usize; 4] = [32, 64, 128, 256];
/// Inner k-tiles the CUDA kernel instantiates (4-, 8- and 16-byte lane loads).
pub const INNER_K_TILES: [usize; 3] = [2, 4, 8];
/// torchao pads `in_features` to a multiple of this (`find_multiple(k, 1024)`).
pub const TORCHAO_K_MULTIPLE: usize = 1024;

/// How far `k` is zero-padded before the qparams are chosen (`n` is always padded to 8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Padding {
    /// What the kernel needs: `k` to a multiple of `inner_k_tiles·16`.
    #[default]
    Kernel,
    /// What torchao does (`Int4TilePackedTo4dTensor.from_hp`, v1 `TensorCoreTiledLayout`):
    /// `k` to a multiple of 1024, for byte-identical checkpoints.
    Torchao,
}

impl Padding {
    /// The multiple `k` is padded to.
    pub fn k_multiple(self, inner_k_tiles: usize) -> usize {
        match self {
            Padding::Kernel => inner_k_tiles * K_TILE,
            Padding::Torchao => TORCHAO_K_MULTIPLE,
        }
    }

    /// `kernel` or `torchao`.
    pub const fn name(self) -> &'static str {
        match self {
            Padding::Kernel => "kernel",
            Padding::Torchao => "torchao",
        }
    }
}

impl fmt::Display for Padding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The scale floor of `_choose_qparams_affine_tinygemm`, comparable and hashable by bits.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Eps(f32);

impl Eps {
    /// An eps; must be finite and `> 0`.
    pub fn new(eps: f32) -> Result<Eps> {
        let e = Eps(eps);
        e.validate()?;
        Ok(e)
    }

    /// The value.
    pub fn get(self) -> f32 {
        self.0
    }

    /// Checks the invariant (values deserialized from a file are not trusted).
    pub fn validate(self) -> Result<()> {
        if self.0.is_finite() && self.0 > 0.0 {
            Ok(())
        } else {
            Err(Error::invalid(
                "int4tiled eps",
                self.0,
                "must be finite and > 0",
            ))
        }
    }
}

impl Default for Eps {
    fn default() -> Self {
        Eps(EPS_V2)
    }
}

impl PartialEq for Eps {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for Eps {}
impl Hash for Eps {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

/// The dimensions of one int4 tiled tensor, logical and padded.
///
/// ```
/// use fmt_int4tiled::{Int4TiledQuantizer, Padding};
/// use quant_core::Shape;
/// let q = Int4TiledQuantizer::new().with_padding(Padding::Torchao);
/// let g = q.geometry(&Shape::new(&[4100, 11008])?)?;
/// assert_eq!((g.n_padded, g.k_padded), (4104, 11264));
/// assert_eq!(g.packed_shape(), vec![513, 88, 32, 4]);
/// assert_eq!(g.scale_and_zero_shape(), vec![88, 4104, 2]);
/// # Ok::<(), quant_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Number of experts of a 3-D `[E, n, k]` weight; `None` for 2-D.
    pub experts: Option<usize>,
    /// Logical rows (`out_features`).
    pub n: usize,
    /// Logical columns (`in_features`).
    pub k: usize,
    /// `n` rounded up to a multiple of 8.
    pub n_padded: usize,
    /// `k` rounded up to the padding multiple.
    pub k_padded: usize,
    /// Values per scale/zero pair along k.
    pub group_size: usize,
    /// k-tiles of 16 stored back to back per lane (2, 4 or 8).
    pub inner_k_tiles: usize,
}

impl Geometry {
    /// Experts (1 for a 2-D weight).
    pub fn num_experts(&self) -> usize {
        self.experts.unwrap_or(1)
    }
    /// n-tiles of 8 rows.
    pub fn n_tiles(&self) -> usize {
        self.n_padded / N_TILE
    }
    /// k slabs of `inner_k_tiles·16` columns (`packed.size(1)`).
    pub fn k_slabs(&self) -> usize {
        self.k_padded / (self.inner_k_tiles * K_TILE)
    }
    /// Groups along the padded k (`scale_and_zero.size(0)`).
    pub fn groups(&self) -> usize {
        self.k_padded / self.group_size
    }
    /// Groups along the logical k.
    pub fn logical_groups(&self) -> usize {
        self.k / self.group_size
    }
    /// i32 words of one expert's packed weight (`n_padded·k_padded/8`).
    pub fn expert_words(&self) -> usize {
        self.n_padded * self.k_padded / 8
    }
    /// bf16 values of one expert's `scale_and_zero`.
    pub fn expert_scale_and_zero(&self) -> usize {
        self.groups() * self.n_padded * 2
    }
    /// Shape of `packed_weight`: `[E,] n/8, k/(ikt·16), 32, ikt/2`.
    pub fn packed_shape(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.experts.into_iter().collect();
        v.extend([self.n_tiles(), self.k_slabs(), 32, self.inner_k_tiles / 2]);
        v
    }
    /// Shape of `scale_and_zero`: `[E,] k/g, n_padded, 2`.
    pub fn scale_and_zero_shape(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.experts.into_iter().collect();
        v.extend([self.groups(), self.n_padded, 2]);
        v
    }
    /// Logical shape `[E,] n, k`.
    pub fn shape(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.experts.into_iter().collect();
        v.extend([self.n, self.k]);
        v
    }
}

/// int4 tensor-core tiled ("tinygemm") weight quantizer, `int4tiled`.
///
/// Weight-only, group-wise asymmetric int4 in the layout of PyTorch's CUDA
/// `_convert_weight_to_int4pack` and the qparams of torchao. Buffers:
///
/// * `packed_weight`: i32 `[E,] ceil(n/8), k_padded/(ikt·16), 32, ikt/2` (see [`crate::layout`]).
/// * `scale_and_zero`: bf16 `[E,] k_padded/g, n_padded, 2`; `[..][..][0]` is the scale,
///   `[..][..][1]` the float zero point. A weight is `(u − 8)·scale + zero`.
///
/// Options: group size 32/64/128/256 (default 128), inner k-tiles 2/4/8 (default 8), k
/// padding `kernel` (default) or `torchao`, and the eps floor of the scale (default
/// 2⁻¹²⁶, torchao v2; `1e-6` for v1). Only the rowwise (forward) operand exists.
///
/// ```
/// use fmt_int4tiled::Int4TiledQuantizer;
/// use quant_core::{Format, HostTensor, Usage};
/// let q = Int4TiledQuantizer::from_spec(&["g64", "k4"], Usage::ROWWISE)?;
/// assert_eq!(q.spec(), "int4tiled:g64,k4");
/// let w: Vec<f32> = (0..24 * 128).map(|i| ((i * 37) % 100) as f32 / 50.0 - 1.0).collect();
/// let t = q.quantize(&HostTensor::f32(&w, &[24, 128])?)?;
/// assert_eq!(t.buffer("packed_weight")?.shape(), &[3, 2, 32, 2]);
/// assert_eq!(t.buffer("scale_and_zero")?.shape(), &[2, 24, 2]);
/// let back = t.dequantize_f32()?;
/// let err = w.iter().zip(&back).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
/// assert!(err < 2.0 / 15.0); // half a step of (max - min) / 15, plus bf16 rounding
/// # Ok::<(), quant_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Int4TiledQuantizer {
    group_size: usize,
    inner_k_tiles: usize,
    padding: Padding,
    eps: Eps,
    usage: Usage,
}

/// The two output buffers both quantize paths write: `packed_weight` words and
/// `scale_and_zero` pairs.
fn output_slices<'a>(out: &'a mut [BufferMut<'_>]) -> Result<(&'a mut [i32], &'a mut [bf16])> {
    let [packed, sz] = buffers_by_name_mut(out, ["packed_weight", "scale_and_zero"]);
    let packed = packed
        .ok_or_else(|| Error::buffer("packed_weight", "is missing"))?
        .as_mut_slice::<i32>()?;
    let sz = sz
        .ok_or_else(|| Error::buffer("scale_and_zero", "is missing"))?
        .as_mut_slice::<bf16>()?;
    Ok((packed, sz))
}

impl Default for Int4TiledQuantizer {
    fn default() -> Self {
        Int4TiledQuantizer::new()
    }
}

impl Int4TiledQuantizer {
    /// Group size 128, inner k-tiles 8, kernel padding, eps 2⁻¹²⁶ (torchao v2's defaults
    /// apart from the padding).
    pub fn new() -> Int4TiledQuantizer {
        Int4TiledQuantizer {
            group_size: 128,
            inner_k_tiles: 8,
            padding: Padding::Kernel,
            eps: Eps::default(),
            usage: Usage::ROWWISE,
        }
    }

    /// Sets the group size (32, 64, 128 or 256).
    pub fn with_group_size(mut self, g: usize) -> Result<Self> {
        check_group_size(g)?;
        self.group_size = g;
        Ok(self)
    }

    /// Sets the inner k-tiles (2, 4 or 8).
    pub fn with_inner_k_tiles(mut self, ikt: usize) -> Result<Self> {
        check_inner_k_tiles(ikt)?;
        self.inner_k_tiles = ikt;
        Ok(self)
    }

    /// Sets the k padding rule.
    pub fn with_padding(mut self, padding: Padding) -> Self {
        self.padding = padding;
        self
    }

    /// Sets the scale floor (finite, `> 0`); [`crate::qparams::EPS_V1`] is torchao v1's.
    pub fn with_eps(mut self, eps: f32) -> Result<Self> {
        self.eps = Eps::new(eps)?;
        Ok(self)
    }

    /// Values per scale/zero pair along k.
    pub fn group_size(&self) -> usize {
        self.group_size
    }

    /// k-tiles of 16 per lane word group (2, 4 or 8).
    pub fn inner_k_tiles(&self) -> usize {
        self.inner_k_tiles
    }

    /// The k padding rule.
    pub fn padding(&self) -> Padding {
        self.padding
    }

    /// The scale floor.
    pub fn eps(&self) -> f32 {
        self.eps.get()
    }

    /// The geometry of a weight of `shape` (checks the shape rule first).
    pub fn geometry(&self, shape: &Shape) -> Result<Geometry> {
        self.check_shape(shape)?;
        let d = shape.dims();
        let (experts, n, k) = match *d {
            [n, k] => (None, n, k),
            [e, n, k] => (Some(e), n, k),
            _ => return Err(rank_error(shape)),
        };
        Ok(Geometry {
            experts,
            n,
            k,
            n_padded: round_up(n, N_TILE),
            k_padded: round_up(k, self.padding.k_multiple(self.inner_k_tiles)),
            group_size: self.group_size,
            inner_k_tiles: self.inner_k_tiles,
        })
    }

    /// Quantizes `x` (`[n, k]` or `[E, n, k]`; static dispatch, see [`quant_core::quantize`]).
    pub fn quantize(&self, x: &HostTensor<'_>) -> Result<QuantizedTensor<Self>> {
        quant_core::quantize(self, x)
    }

    /// The fast path (see [`crate::kernels`]): one task per n-tile of 8 rows, writing its
    /// words and its scale/zero strip in place.
    fn quantize_typed<T: Element>(
        &self,
        xs: &[T],
        shape: &Shape,
        out: &mut [BufferMut<'_>],
    ) -> Result<()> {
        let geo = self.geometry(shape)?;
        let path = QParamsPath::for_input(T::DTYPE);
        let (packed, sz) = output_slices(out)?;
        let eps = self.eps.get();
        let g = geo.group_size;
        let pad = quantize_group(path, &vec![0.0; g], eps, &mut vec![0u8; g]);
        let mut strips = Vec::with_capacity(geo.num_experts() * geo.n_tiles());
        for e in sz.chunks_mut(geo.expert_scale_and_zero().max(1)) {
            strips.extend(column_strips(e, geo.n_padded * 2, N_TILE * 2)?.collect::<Vec<_>>());
        }
        let n_tiles = geo.n_tiles();
        let expert = geo.n * geo.k;
        let level = simd::level();
        // Streamed stores are AVX-512 only (`write_bytes`); elsewhere staging the tile
        // would only add a copy.
        let mode = match level {
            simd::Level::Avx512 => StoreMode::for_output_bytes(std::mem::size_of_val(packed)),
            _ => StoreMode::Cached,
        };
        packed
            .par_chunks_mut(geo.k_padded)
            .zip(strips)
            .enumerate()
            .for_each_init(
                || kernels::Scratch::new(&geo, mode),
                |scratch, (i, (words, mut strip))| {
                    let (e, nt) = (i / n_tiles, i % n_tiles);
                    let x = &xs[e * expert..(e + 1) * expert];
                    simd::dispatch(
                        level,
                        #[inline(always)]
                        || {
                            kernels::quantize_tile(
                                level, path, eps, &geo, x, nt, words, &mut strip, pad, scratch,
                            )
                        },
                    )
                },
            );
        Ok(())
    }

    /// The scalar specification of [`Self::quantize_typed`]: torchao's element-wise
    /// division, [`pack_tile`], scales collected and scattered afterwards.
    pub(crate) fn reference_quantize<T: Element>(
        &self,
        xs: &[T],
        shape: &Shape,
        out: &mut [BufferMut<'_>],
    ) -> Result<()> {
        let geo = self.geometry(shape)?;
        let path = QParamsPath::for_input(T::DTYPE);
        let (packed, sz) = output_slices(out)?;
        let eps = self.eps.get();
        let (n_tiles, kp, g) = (geo.n_tiles(), geo.k_padded, geo.group_size);
        let groups = geo.groups();
        let per_tile: Vec<Vec<bf16>> = packed
            .par_chunks_mut(kp)
            .enumerate()
            .map(|(i, words)| {
                let (e, nt) = (i / n_tiles, i % n_tiles);
                let x = &xs[e * geo.n * geo.k..][..geo.n * geo.k];
                let mut u = vec![0u8; N_TILE * kp];
                let mut local = vec![bf16::ZERO; N_TILE * groups * 2];
                let mut grp = vec![0f32; g];
                for r in 0..N_TILE {
                    let n = nt * N_TILE + r;
                    for gi in 0..groups {
                        if n < geo.n && gi < geo.logical_groups() {
                            let src = &x[n * geo.k + gi * g..][..g];
                            grp.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
                        } else {
                            grp.fill(0.0);
                        }
                        let (s, z) =
                            quantize_group(path, &grp, eps, &mut u[r * kp + gi * g..][..g]);
                        local[(r * groups + gi) * 2] = s;
                        local[(r * groups + gi) * 2 + 1] = z;
                    }
                }
                pack_tile(&u, kp, geo.inner_k_tiles, words);
                local
            })
            .collect();
        let np = geo.n_padded;
        for (i, local) in per_tile.iter().enumerate() {
            let (e, nt) = (i / n_tiles, i % n_tiles);
            let dst = &mut sz[e * geo.expert_scale_and_zero()..][..geo.expert_scale_and_zero()];
            for r in 0..N_TILE {
                let n = nt * N_TILE + r;
                for gi in 0..groups {
                    let d = (gi * np + n) * 2;
                    let s = (r * groups + gi) * 2;
                    dst[d] = local[s];
                    dst[d + 1] = local[s + 1];
                }
            }
        }
        Ok(())
    }
}

fn check_group_size(g: usize) -> Result<()> {
    if GROUP_SIZES.contains(&g) {
        Ok(())
    } else {
        Err(Error::invalid(
            "int4tiled group_size",
            g,
            "must be 32, 64, 128 or 256 (the group sizes _weight_int4pack_mm instantiates)",
        ))
    }
}

fn check_inner_k_tiles(ikt: usize) -> Result<()> {
    if INNER_K_TILES.contains(&ikt) {
        Ok(())
    } else {
        Err(Error::invalid(
            "int4tiled inner_k_tiles",
            ikt,
            "must be 2, 4 or 8 (4-, 8- or 16-byte lane loads)",
        ))
    }
}

fn rank_error(shape: &Shape) -> Error {
    Error::shape(
        Int4TiledQuantizer::NAME,
        "shape",
        shape,
        "must be [n, k] (an nn.Linear weight) or [E, n, k] (MoE experts)",
    )
}

fn columnwise_error() -> Error {
    Error::unsupported(
        Int4TiledQuantizer::NAME,
        "the columnwise usage",
        "tinygemm is a weight-only forward format: it stores only the rowwise y = x W^T operand",
    )
}

fn parse_value<T: std::str::FromStr>(opt: &str, v: &str, rule: &str) -> Result<T> {
    v.parse()
        .map_err(|_| Error::invalid(format!("int4tiled option {opt}"), v, rule))
}

impl Format for Int4TiledQuantizer {
    const NAME: &'static str = "int4tiled";
    const OPTIONS: &'static [OptionHelp] = &[
        OptionHelp {
            name: "g32|g64|g128|g256",
            help: "group size along k (default g128)",
        },
        OptionHelp {
            name: "k2|k4|k8",
            help: "inner k-tiles per lane (default k8; torchao v2 uses 8)",
        },
        OptionHelp {
            name: "pad=kernel",
            help: "pad k to inner_k_tiles*16, n to 8 (default)",
        },
        OptionHelp {
            name: "pad=torchao",
            help: "pad k to 1024 as torchao does, for byte-identical checkpoints",
        },
        OptionHelp {
            name: "eps=X",
            help: "scale floor (default 2^-126 = torchao v2; 1e-6 = torchao v1)",
        },
    ];
    const SHAPE_RULE: &'static str = "[n, k] or [E, n, k] with k a multiple of the group size (n is padded to 8, k to inner_k_tiles*16 or, with pad=torchao, 1024)";

    fn from_spec(options: &[&str], usage: Usage) -> Result<Self> {
        let mut q = Int4TiledQuantizer::new().with_usage_checked(usage)?;
        for &o in options {
            if let Some(v) = o.strip_prefix("pad=") {
                q.padding = match v {
                    "kernel" => Padding::Kernel,
                    "torchao" => Padding::Torchao,
                    _ => {
                        return Err(Error::invalid(
                            "int4tiled option pad",
                            v,
                            "must be kernel or torchao",
                        ));
                    }
                };
            } else if let Some(v) = o.strip_prefix("eps=") {
                q = q.with_eps(parse_value(o, v, "must be a number")?)?;
            } else if let Some(v) = o
                .strip_prefix('g')
                .filter(|v| v.starts_with(|c: char| c.is_ascii_digit()))
            {
                q = q.with_group_size(parse_value(o, v, "must be 32, 64, 128 or 256")?)?;
            } else if let Some(v) = o
                .strip_prefix('k')
                .filter(|v| v.starts_with(|c: char| c.is_ascii_digit()))
            {
                q = q.with_inner_k_tiles(parse_value(o, v, "must be 2, 4 or 8")?)?;
            } else {
                return Err(unknown_option::<Self>(o));
            }
        }
        Ok(q)
    }

    fn spec_options(&self) -> Vec<String> {
        let d = Int4TiledQuantizer::new();
        let mut v = Vec::new();
        if self.group_size != d.group_size {
            v.push(format!("g{}", self.group_size));
        }
        if self.inner_k_tiles != d.inner_k_tiles {
            v.push(format!("k{}", self.inner_k_tiles));
        }
        if self.padding != d.padding {
            v.push(format!("pad={}", self.padding));
        }
        if self.eps != d.eps {
            v.push(format!("eps={}", self.eps.get()));
        }
        v
    }

    fn validate_options(&self) -> Result<()> {
        self.usage.require_some()?;
        if self.usage.columnwise {
            return Err(columnwise_error());
        }
        check_group_size(self.group_size)?;
        check_inner_k_tiles(self.inner_k_tiles)?;
        self.eps.validate()
    }

    fn usage(&self) -> Usage {
        self.usage
    }

    fn with_usage(&self, usage: Usage) -> Self {
        Int4TiledQuantizer {
            usage,
            ..self.clone()
        }
    }

    fn check_shape(&self, shape: &Shape) -> Result<()> {
        if self.usage.columnwise {
            return Err(columnwise_error());
        }
        let d = shape.dims();
        let k = match *d {
            [_, k] | [_, _, k] => k,
            _ => return Err(rank_error(shape)),
        };
        if !k.is_multiple_of(self.group_size) {
            return Err(Error::shape(
                Self::NAME,
                "k",
                k,
                format!(
                    "must be a multiple of the group size {} (torchao leaves such layers unquantized)",
                    self.group_size
                ),
            ));
        }
        Ok(())
    }

    fn buffers(&self, shape: &Shape) -> Result<Vec<BufferDesc>> {
        let geo = self.geometry(shape)?;
        Ok(vec![
            BufferDesc::new("packed_weight", DType::I32, &geo.packed_shape()),
            BufferDesc::new("scale_and_zero", DType::BF16, &geo.scale_and_zero_shape()),
        ])
    }

    fn quantize_into(&self, x: &HostTensor<'_>, out: &mut [BufferMut<'_>]) -> Result<()> {
        dispatch_elements!(x, |xs| self.quantize_typed(xs, x.shape(), out))
    }

    fn dequantize_into<T: Element>(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        dir: Direction,
        out: &mut [T],
    ) -> Result<()> {
        if dir != Direction::Rowwise {
            return Err(columnwise_error());
        }
        let geo = self.geometry(shape)?;
        let packed = buffer_by_name(bufs, "packed_weight")?.as_slice::<i32>()?;
        let sz = buffer_by_name(bufs, "scale_and_zero")?.as_slice::<bf16>()?;
        let (n, k) = (geo.n, geo.k);
        let rows_per_task = ((1 << 16) / k.max(1)).clamp(1, n.max(1));
        let level = simd::level();
        let mode = StoreMode::for_output_bytes(std::mem::size_of_val(out));
        out.par_chunks_mut(n * k)
            .enumerate()
            .flat_map(|(e, o)| {
                o.par_chunks_mut(rows_per_task * k)
                    .enumerate()
                    .map(move |(t, o)| (e, t * rows_per_task, o))
            })
            .for_each_init(
                || kernels::RowTables::new(mode),
                |scratch, (e, n0, o)| {
                    let words = &packed[e * geo.expert_words()..][..geo.expert_words()];
                    let sz = &sz[e * geo.expert_scale_and_zero()..][..geo.expert_scale_and_zero()];
                    simd::dispatch(
                        level,
                        #[inline(always)]
                        || kernels::dequantize_rows(level, &geo, words, sz, n0, o, scratch),
                    )
                },
            );
        Ok(())
    }

    /// Both buffers are written in full (padding rows and columns included).
    fn overwrites(&self, _desc: &BufferDesc) -> bool {
        true
    }

    /// Rows (n) move in whole n-tiles of 8: the packed layout interleaves 8 rows per
    /// lane group. A 3-D weight moves whole experts.
    fn row_granularity(&self) -> Option<usize> {
        Some(N_TILE)
    }

    /// 2-D: n-tile blocks of `packed_weight` move as they are, and the matching `n`
    /// columns of `scale_and_zero` move with them (a ragged last tile keeps its padding
    /// columns, which hold the qparams of the zero padding rows). 3-D `[E, n, k]`: whole
    /// experts move (both buffers are stored expert by expert).
    fn gather_rows(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        ranges: &[Range<usize>],
        out_shape: &Shape,
    ) -> Result<Vec<Buffer>> {
        let geo = self.geometry(shape)?;
        let out = self.geometry(out_shape)?;
        let packed = buffer_by_name(bufs, "packed_weight")?.bytes();
        let sz = buffer_by_name(bufs, "scale_and_zero")?.bytes();
        let descs = Format::buffers(self, out_shape)?;
        let mut packed_out = Buffer::zeroed(descs[0].clone())?;
        let mut sz_out = Buffer::zeroed(descs[1].clone())?;
        if geo.experts.is_some() {
            let experts: Vec<Range<usize>> = ranges
                .iter()
                .map(|r| r.start / geo.n..r.end / geo.n)
                .collect();
            gather_row_ranges(
                packed,
                geo.expert_words() * 4,
                &experts,
                packed_out.bytes_mut(),
            )?;
            gather_row_ranges(
                sz,
                geo.expert_scale_and_zero() * 2,
                &experts,
                sz_out.bytes_mut(),
            )?;
        } else {
            let tiles = block_ranges(ranges, N_TILE);
            let tile_bytes = geo.expert_words() / geo.n_tiles() * 4;
            gather_row_ranges(packed, tile_bytes, &tiles, packed_out.bytes_mut())?;
            let cols: Vec<Range<usize>> = tiles
                .iter()
                .map(|t| t.start * N_TILE..t.end * N_TILE)
                .collect();
            gather_col_ranges(
                sz,
                geo.groups(),
                geo.n_padded,
                sz_out.bytes_mut(),
                out.n_padded,
                &cols,
                4,
            )?;
        }
        Ok(vec![packed_out, sz_out])
    }

    /// Checks what a file could get wrong that shapes cannot: the padding. Rows `≥ n` and
    /// columns `≥ k` must hold nibble 0 (as `_convert_weight_to_int4pack` and torchao's
    /// zero padding write them), and the scale and zero of padded k groups must be finite,
    /// since the kernel multiplies them by the zero-padded activation and `0·∞` would
    /// poison every output.
    fn validate_buffers(&self, shape: &Shape, bufs: &[Buffer]) -> Result<()> {
        let geo = self.geometry(shape)?;
        let packed = buffer_by_name(bufs, "packed_weight")?.as_slice::<i32>()?;
        let sz = buffer_by_name(bufs, "scale_and_zero")?.as_slice::<bf16>()?;
        let mut u = vec![0u8; geo.k_padded];
        for e in 0..geo.num_experts() {
            let words = &packed[e * geo.expert_words()..][..geo.expert_words()];
            let slab = geo.inner_k_tiles * K_TILE;
            for n in 0..geo.n_padded {
                // Only the slabs that hold padding need unpacking.
                let from = if n < geo.n { geo.k } else { 0 };
                unpack_row(
                    words,
                    n,
                    geo.k_padded,
                    geo.inner_k_tiles,
                    from / slab,
                    &mut u,
                );
                if let Some(pos) = u[from..].iter().position(|&v| v != 0) {
                    return Err(Error::buffer(
                        "packed_weight",
                        format!(
                            "holds nibble {} at padded position (expert {e}, n={n}, k={}); padding (n >= {} or k >= {}) must be 0",
                            u[from + pos],
                            from + pos,
                            geo.n,
                            geo.k
                        ),
                    ));
                }
            }
            let sz = &sz[e * geo.expert_scale_and_zero()..][..geo.expert_scale_and_zero()];
            let first_pad = geo.logical_groups() * geo.n_padded * 2;
            if let Some(pos) = sz[first_pad..].iter().position(|v| !v.to_f32().is_finite()) {
                let at = first_pad + pos;
                return Err(Error::buffer(
                    "scale_and_zero",
                    format!(
                        "holds {} at padded group {} (expert {e}, n={}); padded k groups must be finite (0 * inf poisons the matmul)",
                        sz[at],
                        at / (geo.n_padded * 2),
                        (at / 2) % geo.n_padded
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Int4TiledQuantizer {
    fn with_usage_checked(self, usage: Usage) -> Result<Self> {
        usage.require_some()?;
        if usage.columnwise {
            return Err(columnwise_error());
        }
        Ok(Format::with_usage(&self, usage))
    }
}
