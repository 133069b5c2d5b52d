//! The storage side: accessors, experts, slices, and conversion to and from the plain forms
//! other tools use (logical nibbles with scale and zero, integer zero points, torchao's
//! pre-pack bytes, torchao's packed buffers).

use std::ops::Range;

use half::bf16;
use quant_core::format::buffers_by_name_mut;
use quant_core::shape::round_up;
use quant_core::{Buffer, BufferDesc, DType, Error, Format, QuantizedTensor, Result, Shape};
use rayon::prelude::*;

use crate::format::{Geometry, Int4TiledQuantizer, Padding};
use crate::layout::{K_TILE, N_TILE, from_prepacked, pack_tile, to_prepacked, unpack_row};
use crate::qparams::{QParamsPath, quantize_group};

/// An int4 tiled weight: `packed_weight` + `scale_and_zero` and its logical shape.
pub type Int4TiledTensor = QuantizedTensor<Int4TiledQuantizer>;

/// The plain form of an int4 tiled weight: nibbles `u` (`[E,] n, k`, values `0..=15`) and
/// per-group `scale` and float `zero` (`[E,] n, k/g`), so that `w = (u − 8)·scale + zero`.
/// These are torchao's `int_data`, `scale` and `zero_point` before packing.
#[derive(Clone, Debug, PartialEq)]
pub struct Int4Logical {
    /// Logical shape `[E,] n, k`.
    pub shape: Vec<usize>,
    /// Nibbles, row-major `[E,] n, k`.
    pub u: Vec<u8>,
    /// Scales, `[E,] n, k/g`.
    pub scale: Vec<bf16>,
    /// Float zero points, `[E,] n, k/g`.
    pub zero: Vec<bf16>,
}

/// The integer-zero-point form (GPTQ / AWQ / HQQ style): `w ≈ (u − zero_point)·scale`.
#[derive(Clone, Debug, PartialEq)]
pub struct Int4IntZeroPoints {
    /// Logical shape `[E,] n, k`.
    pub shape: Vec<usize>,
    /// Nibbles, row-major `[E,] n, k`.
    pub u: Vec<u8>,
    /// Scales as stored (bf16), `[E,] n, k/g`.
    pub scale: Vec<bf16>,
    /// Zero points `8 − zero/scale`, `[E,] n, k/g`; a float because the bf16 rounding of the
    /// stored zero rarely leaves an integer (round it for integer consumers).
    pub zero_point: Vec<f32>,
}

fn check_len<T>(what: &str, v: &[T], want: usize, shape: &[usize]) -> Result<()> {
    if v.len() == want {
        Ok(())
    } else {
        Err(Error::invalid(
            what,
            format!("{} elements", v.len()),
            format!("a weight of shape {shape:?} needs {want}"),
        ))
    }
}

impl Int4TiledQuantizer {
    /// The `(scale, zero)` torchao gives a group of zeros (what padding holds): `scale = eps`,
    /// `zero = 8·eps`, rounded to bf16.
    pub fn padding_qparams(&self) -> (bf16, bf16) {
        let zeros = vec![0f32; self.group_size()];
        let mut u = vec![0u8; self.group_size()];
        quantize_group(QParamsPath::Bf16, &zeros, self.eps(), &mut u)
    }

    /// Builds a tensor from the plain form: nibbles `u` (`[E,] n, k`, values `0..=15`) and
    /// bf16 `scale` / `zero` (`[E,] n, k/g`). Padding gets nibble 0 and
    /// [`Int4TiledQuantizer::padding_qparams`], as torchao's zero padding would.
    ///
    /// ```
    /// use fmt_int4tiled::{Int4TiledQuantizer, Int4TiledTensorExt};
    /// use half::bf16;
    /// let q = Int4TiledQuantizer::new().with_group_size(32)?;
    /// let u: Vec<u8> = (0..8 * 64).map(|i| (i % 16) as u8).collect();
    /// let s = vec![bf16::from_f32(0.5); 8 * 2];
    /// let z = vec![bf16::from_f32(0.0); 8 * 2];
    /// let t = q.from_logical(&[8, 64], &u, &s, &z)?;
    /// assert_eq!(t.unpack()?, u);
    /// assert_eq!(t.dequantize_f32()?[15], 3.5); // (15 - 8) * 0.5
    /// # Ok::<(), quant_core::Error>(())
    /// ```
    pub fn from_logical(
        &self,
        shape: &[usize],
        u: &[u8],
        scale: &[bf16],
        zero: &[bf16],
    ) -> Result<Int4TiledTensor> {
        let geo = self.geometry(&Shape::new(shape)?)?;
        let numel = geo.num_experts() * geo.n * geo.k;
        let nq = geo.num_experts() * geo.n * geo.logical_groups();
        check_len("u", u, numel, shape)?;
        check_len("scale", scale, nq, shape)?;
        check_len("zero", zero, nq, shape)?;
        if let Some(i) = u.iter().position(|&v| v > 15) {
            return Err(Error::invalid(
                format!("u[{i}]"),
                u[i],
                "a 4-bit value must be 0..=15",
            ));
        }
        let (ps, pz) = self.padding_qparams();
        let mut t = QuantizedTensor::allocate(self.clone(), &Shape::new(shape)?, DType::BF16)?;
        t.write_buffers(|bufs| {
            let [pw, sz] = buffers_by_name_mut(bufs, ["packed_weight", "scale_and_zero"]);
            let packed = pw
                .ok_or_else(|| Error::buffer("packed_weight", "is missing"))?
                .as_mut_slice::<i32>()?;
            let sz = sz
                .ok_or_else(|| Error::buffer("scale_and_zero", "is missing"))?
                .as_mut_slice::<bf16>()?;
            let (kp, n_tiles) = (geo.k_padded, geo.n_tiles());
            packed
                .par_chunks_mut(kp)
                .enumerate()
                .for_each(|(i, words)| {
                    let (e, nt) = (i / n_tiles, i % n_tiles);
                    let mut rows = vec![0u8; N_TILE * kp];
                    for r in 0..N_TILE {
                        let n = nt * N_TILE + r;
                        if n < geo.n {
                            let src = &u[(e * geo.n + n) * geo.k..][..geo.k];
                            rows[r * kp..][..geo.k].copy_from_slice(src);
                        }
                    }
                    pack_tile(&rows, kp, geo.inner_k_tiles, words);
                });
            let (g_all, g_log) = (geo.groups(), geo.logical_groups());
            for (e, sz) in sz.chunks_mut(geo.expert_scale_and_zero()).enumerate() {
                for gi in 0..g_all {
                    for n in 0..geo.n_padded {
                        let at = (gi * geo.n_padded + n) * 2;
                        let (s, z) = if n < geo.n && gi < g_log {
                            let src = (e * geo.n + n) * g_log + gi;
                            (scale[src], zero[src])
                        } else {
                            (ps, pz)
                        };
                        sz[at] = s;
                        sz[at + 1] = z;
                    }
                }
            }
            Ok(())
        })?;
        Ok(t)
    }

    /// Builds a tensor from integer (or HQQ float) zero points, `w ≈ (u − zp)·scale`.
    ///
    /// The scale is rounded to bf16 (the kernel reads bf16), and the float zero point is
    /// torchao's `_convert_to_affinequantized_format`: `zero = bf16(f32(8 − zp) · f32(scale))`.
    /// GPTQ checkpoints store `zeros − 1` and AWQ interleaves nibbles: undo those first and
    /// pass the true `zp` and `u[n][k]` (`[out][in]`).
    ///
    /// ```
    /// use fmt_int4tiled::{Int4TiledQuantizer, Int4TiledTensorExt};
    /// let q = Int4TiledQuantizer::new().with_group_size(32)?;
    /// let u = vec![3u8; 8 * 32];
    /// let t = q.from_int_zero_points(&[8, 32], &u, &[0.25; 8], &[5.0; 8])?;
    /// assert_eq!(t.to_logical()?.zero[0].to_f32(), 0.75); // (8 - 5) * 0.25
    /// assert_eq!(t.dequantize_f32()?[0], -0.5);            // (3 - 5) * 0.25
    /// assert_eq!(t.to_int_zero_points()?.zero_point[0], 5.0);
    /// # Ok::<(), quant_core::Error>(())
    /// ```
    pub fn from_int_zero_points(
        &self,
        shape: &[usize],
        u: &[u8],
        scale: &[f32],
        zero_point: &[f32],
    ) -> Result<Int4TiledTensor> {
        if scale.len() != zero_point.len() {
            return Err(Error::invalid(
                "zero_point",
                format!("{} elements", zero_point.len()),
                format!("must match scale ({} elements)", scale.len()),
            ));
        }
        let s: Vec<bf16> = scale.iter().map(|&v| bf16::from_f32(v)).collect();
        let z: Vec<bf16> = s
            .iter()
            .zip(zero_point)
            .map(|(s, &zp)| bf16::from_f32((8.0 - zp) * s.to_f32()))
            .collect();
        self.from_logical(shape, u, &s, &z)
    }

    /// Builds a tensor from the input of PyTorch ≥ 2.5's `_convert_weight_to_int4pack`:
    /// `u8 [E,] n, k/2` with **even k in the high nibble** (torchao's
    /// `(q[:, ::2] << 4 | q[:, 1::2])`), plus `scale` / `zero` as in
    /// [`Int4TiledQuantizer::from_logical`].
    ///
    /// ```
    /// use fmt_int4tiled::{Int4TiledQuantizer, Int4TiledTensorExt};
    /// use half::bf16;
    /// let q = Int4TiledQuantizer::new().with_group_size(32)?.with_inner_k_tiles(2)?;
    /// let bytes = vec![0x12u8; 8 * 16]; // u = 1, 2, 1, 2, ... (even k high)
    /// let t = q.from_prepacked(&[8, 32], &bytes, &[bf16::ONE; 8], &[bf16::ZERO; 8])?;
    /// assert_eq!(&t.unpack()?[..4], &[1, 2, 1, 2]);
    /// assert_eq!(t.to_prepacked()?, bytes);
    /// # Ok::<(), quant_core::Error>(())
    /// ```
    pub fn from_prepacked(
        &self,
        shape: &[usize],
        bytes: &[u8],
        scale: &[bf16],
        zero: &[bf16],
    ) -> Result<Int4TiledTensor> {
        let s = Shape::new(shape)?;
        self.geometry(&s)?;
        check_len("prepacked bytes", bytes, s.numel() / 2, shape)?;
        self.from_logical(shape, &from_prepacked(bytes), scale, zero)
    }

    /// Wraps torchao's buffers as they are (`Int4TilePackedTo4dTensor.qdata` and
    /// `.scale_and_zero`, or the outputs of `_convert_weight_to_int4pack` and
    /// `pack_tinygemm_scales_and_zeros`), checking shapes and padding.
    ///
    /// ```
    /// use fmt_int4tiled::Int4TiledQuantizer;
    /// use half::bf16;
    /// let q = Int4TiledQuantizer::new().with_group_size(32)?.with_inner_k_tiles(2)?;
    /// // [8, 32]: packed_weight i32 [1, 1, 32, 1], scale_and_zero bf16 [1, 8, 2]
    /// let mut words = vec![0x9191_8080u32 as i32; 32];
    /// let sz = vec![bf16::ONE; 16];
    /// assert!(q.from_packed(&[8, 32], &words, &sz).is_ok());
    /// words.truncate(31);
    /// assert!(q.from_packed(&[8, 32], &words, &sz).is_err()); // wrong size, named
    /// # Ok::<(), quant_core::Error>(())
    /// ```
    pub fn from_packed(
        &self,
        shape: &[usize],
        packed_weight: &[i32],
        scale_and_zero: &[bf16],
    ) -> Result<Int4TiledTensor> {
        let geo = self.geometry(&Shape::new(shape)?)?;
        QuantizedTensor::from_buffers(
            self.clone(),
            &Shape::new(shape)?,
            DType::BF16,
            vec![
                Buffer::from_slice("packed_weight", &geo.packed_shape(), packed_weight)?,
                Buffer::from_slice(
                    "scale_and_zero",
                    &geo.scale_and_zero_shape(),
                    scale_and_zero,
                )?,
            ],
        )
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Int4TiledTensor {}
}

/// Operations on an [`Int4TiledTensor`]: geometry, experts, slices, unpacking and export.
///
/// ```
/// use fmt_int4tiled::{Int4TiledQuantizer, Int4TiledTensorExt, Padding};
/// use quant_core::HostTensor;
/// let w: Vec<f32> = (0..2 * 20 * 256).map(|i| (i % 29) as f32 - 14.0).collect();
/// let q = Int4TiledQuantizer::new().with_padding(Padding::Torchao);
/// let t = q.quantize(&HostTensor::f32(&w, &[2, 20, 256])?)?;
/// assert_eq!((t.num_experts(), t.padded_n(), t.padded_k()), (Some(2), 24, 1024));
/// let e1 = t.select_expert(1)?;               // zero-copy view, [20, 256]
/// assert_eq!(e1.shape().dims(), &[20, 256]);
/// let top = e1.slice_n(0..16)?;               // n in multiples of 8
/// assert_eq!(top.shape().dims(), &[16, 256]);
/// assert!(e1.slice_n(0..12).is_err());        // 12 is not a multiple of 8
/// # Ok::<(), quant_core::Error>(())
/// ```
pub trait Int4TiledTensorExt: sealed::Sealed {
    /// Logical and padded dimensions.
    fn geometry(&self) -> Geometry;
    /// Values per scale/zero pair along k.
    fn group_size(&self) -> usize;
    /// Inner k-tiles (2, 4 or 8).
    fn inner_k_tiles(&self) -> usize;
    /// The k padding rule.
    fn padding(&self) -> Padding;
    /// `n` rounded up to 8.
    fn padded_n(&self) -> usize;
    /// `k` rounded up to the padding multiple.
    fn padded_k(&self) -> usize;
    /// Experts of a 3-D weight, `None` for 2-D.
    fn num_experts(&self) -> Option<usize>;
    /// The `packed_weight` words.
    fn packed_weight(&self) -> Result<&[i32]>;
    /// The `scale_and_zero` pairs.
    fn scale_and_zero(&self) -> Result<&[bf16]>;
    /// The logical nibbles `u`, `[E,] n, k` (lossless).
    fn unpack(&self) -> Result<Vec<u8>>;
    /// Nibbles with scale and float zero, logical shapes.
    fn to_logical(&self) -> Result<Int4Logical>;
    /// `_convert_weight_to_int4pack`'s input, `u8 [E,] n, k/2`, even k in the high nibble.
    fn to_prepacked(&self) -> Result<Vec<u8>>;
    /// Nibbles, scale and zero point `8 − zero/scale` (computed in f64, rounded to f32).
    fn to_int_zero_points(&self) -> Result<Int4IntZeroPoints>;
    /// Expert `e` of a 3-D weight as a 2-D tensor (zero-copy: views of both buffers).
    fn select_expert(&self, e: usize) -> Result<Int4TiledTensor>;
    /// Rows `range` (along n; dim 1 of a 3-D weight). Start and end must be multiples of
    /// 8, or end = n. No repacking: whole n-tiles are copied.
    fn slice_n(&self, range: Range<usize>) -> Result<Int4TiledTensor>;
    /// Columns `range` (along k). Start and end must be multiples of
    /// `lcm(inner_k_tiles·16, group_size)`, or end = k. No repacking: whole slabs and
    /// groups are copied. The slice keeps the padding rule when its stored k range
    /// allows it and otherwise falls back to [`Padding::Kernel`].
    fn slice_k(&self, range: Range<usize>) -> Result<Int4TiledTensor>;
}

fn geometry_of(t: &Int4TiledTensor) -> Geometry {
    let q = t.quantizer();
    let d = t.shape().dims();
    let (experts, n, k) = match *d {
        [e, n, k] => (Some(e), n, k),
        _ => (None, t.shape().rows(), t.shape().cols()),
    };
    Geometry {
        experts,
        n,
        k,
        n_padded: round_up(n, N_TILE),
        k_padded: round_up(k, q.padding().k_multiple(q.inner_k_tiles())),
        group_size: q.group_size(),
        inner_k_tiles: q.inner_k_tiles(),
    }
}

impl Int4TiledTensorExt for Int4TiledTensor {
    fn geometry(&self) -> Geometry {
        geometry_of(self)
    }
    fn group_size(&self) -> usize {
        self.quantizer().group_size()
    }
    fn inner_k_tiles(&self) -> usize {
        self.quantizer().inner_k_tiles()
    }
    fn padding(&self) -> Padding {
        self.quantizer().padding()
    }
    fn padded_n(&self) -> usize {
        geometry_of(self).n_padded
    }
    fn padded_k(&self) -> usize {
        geometry_of(self).k_padded
    }
    fn num_experts(&self) -> Option<usize> {
        geometry_of(self).experts
    }
    fn packed_weight(&self) -> Result<&[i32]> {
        self.buffer("packed_weight")?.as_slice::<i32>()
    }
    fn scale_and_zero(&self) -> Result<&[bf16]> {
        self.buffer("scale_and_zero")?.as_slice::<bf16>()
    }

    fn unpack(&self) -> Result<Vec<u8>> {
        let geo = geometry_of(self);
        let packed = self.packed_weight()?;
        let mut out = vec![0u8; geo.num_experts() * geo.n * geo.k];
        let kp = geo.k_padded;
        out.par_chunks_mut(geo.k).enumerate().for_each_init(
            || vec![0u8; kp],
            |row, (i, dst)| {
                let (e, n) = (i / geo.n, i % geo.n);
                let words = &packed[e * geo.expert_words()..][..geo.expert_words()];
                unpack_row(words, n, kp, geo.inner_k_tiles, 0, row);
                dst.copy_from_slice(&row[..geo.k]);
            },
        );
        Ok(out)
    }

    fn to_logical(&self) -> Result<Int4Logical> {
        let geo = geometry_of(self);
        let sz = self.scale_and_zero()?;
        let g_log = geo.logical_groups();
        let mut scale = Vec::with_capacity(geo.num_experts() * geo.n * g_log);
        let mut zero = Vec::with_capacity(scale.capacity());
        for e in 0..geo.num_experts() {
            let sz = &sz[e * geo.expert_scale_and_zero()..][..geo.expert_scale_and_zero()];
            for n in 0..geo.n {
                for gi in 0..g_log {
                    let at = (gi * geo.n_padded + n) * 2;
                    scale.push(sz[at]);
                    zero.push(sz[at + 1]);
                }
            }
        }
        Ok(Int4Logical {
            shape: geo.shape(),
            u: self.unpack()?,
            scale,
            zero,
        })
    }

    fn to_prepacked(&self) -> Result<Vec<u8>> {
        Ok(to_prepacked(&self.unpack()?))
    }

    fn to_int_zero_points(&self) -> Result<Int4IntZeroPoints> {
        let l = self.to_logical()?;
        let zero_point = l
            .scale
            .iter()
            .zip(&l.zero)
            .map(|(s, z)| (8.0 - f64::from(z.to_f32()) / f64::from(s.to_f32())) as f32)
            .collect();
        Ok(Int4IntZeroPoints {
            shape: l.shape,
            u: l.u,
            scale: l.scale,
            zero_point,
        })
    }

    fn select_expert(&self, e: usize) -> Result<Int4TiledTensor> {
        let geo = geometry_of(self);
        let experts = geo.experts.ok_or_else(|| {
            Error::invalid(
                "select_expert",
                self.shape(),
                "needs a 3-D [E, n, k] weight",
            )
        })?;
        if e >= experts {
            return Err(Error::invalid(
                "expert",
                e,
                format!("must be < {experts} (the number of experts)"),
            ));
        }
        let two_d = Geometry {
            experts: None,
            ..geo
        };
        let pw = self.buffer("packed_weight")?;
        let sz = self.buffer("scale_and_zero")?;
        let words = geo.expert_words();
        let pairs = geo.expert_scale_and_zero();
        QuantizedTensor::from_buffers(
            self.quantizer().clone(),
            &Shape::new(&[geo.n, geo.k])?,
            self.dtype(),
            vec![
                pw.view(
                    BufferDesc::new("packed_weight", DType::I32, &two_d.packed_shape()),
                    e * words * 4,
                )?,
                sz.view(
                    BufferDesc::new("scale_and_zero", DType::BF16, &two_d.scale_and_zero_shape()),
                    e * pairs * 2,
                )?,
            ],
        )
    }

    fn slice_n(&self, range: Range<usize>) -> Result<Int4TiledTensor> {
        let geo = geometry_of(self);
        let Range { start, end } = range;
        check_range("n", start, end, geo.n, N_TILE)?;
        let n2 = end - start;
        let np2 = round_up(n2, N_TILE);
        let new = Geometry {
            n: n2,
            n_padded: np2,
            ..geo
        };
        let packed = self.packed_weight()?;
        let sz = self.scale_and_zero()?;
        let tile = geo.k_padded; // words per n-tile
        let mut pw = Vec::with_capacity(geo.num_experts() * new.expert_words());
        let mut sz2 = Vec::with_capacity(geo.num_experts() * new.expert_scale_and_zero());
        for e in 0..geo.num_experts() {
            let src = &packed[e * geo.expert_words()..][..geo.expert_words()];
            pw.extend_from_slice(&src[start / N_TILE * tile..][..np2 / N_TILE * tile]);
            let src = &sz[e * geo.expert_scale_and_zero()..][..geo.expert_scale_and_zero()];
            for gi in 0..geo.groups() {
                sz2.extend_from_slice(&src[(gi * geo.n_padded + start) * 2..][..np2 * 2]);
            }
        }
        let mut shape = geo.shape();
        let nd = shape.len() - 2;
        shape[nd] = n2;
        rebuild(self, self.quantizer().clone(), &shape, &new, &pw, &sz2)
    }

    fn slice_k(&self, range: Range<usize>) -> Result<Int4TiledTensor> {
        let geo = geometry_of(self);
        let Range { start, end } = range;
        let slab = geo.inner_k_tiles * K_TILE;
        let unit = slab.max(geo.group_size); // lcm of two powers of two
        check_range("k", start, end, geo.k, unit)?;
        let k2 = end - start;
        let keep = self.padding();
        let kp_keep = round_up(k2, keep.k_multiple(geo.inner_k_tiles));
        // The stored range must end at real padding, never at weights beyond `end`.
        let padding = if start + kp_keep <= geo.k_padded && (end == geo.k || kp_keep == k2) {
            keep
        } else {
            Padding::Kernel
        };
        let kp2 = round_up(k2, padding.k_multiple(geo.inner_k_tiles));
        let q = self.quantizer().clone().with_padding(padding);
        let new = Geometry {
            k: k2,
            k_padded: kp2,
            ..geo
        };
        let packed = self.packed_weight()?;
        let sz = self.scale_and_zero()?;
        let tile = geo.k_padded; // words per n-tile
        let slab_words = 32 * geo.inner_k_tiles / 2; // words per n-tile and slab
        let (s0, ns) = (start / slab, kp2 / slab);
        let (g0, ng) = (start / geo.group_size, kp2 / geo.group_size);
        let mut pw = Vec::with_capacity(geo.num_experts() * new.expert_words());
        let mut sz2 = Vec::with_capacity(geo.num_experts() * new.expert_scale_and_zero());
        for e in 0..geo.num_experts() {
            let src = &packed[e * geo.expert_words()..][..geo.expert_words()];
            for nt in 0..geo.n_tiles() {
                pw.extend_from_slice(&src[nt * tile + s0 * slab_words..][..ns * slab_words]);
            }
            let src = &sz[e * geo.expert_scale_and_zero()..][..geo.expert_scale_and_zero()];
            sz2.extend_from_slice(&src[g0 * geo.n_padded * 2..][..ng * geo.n_padded * 2]);
        }
        let mut shape = geo.shape();
        let last = shape.len() - 1;
        shape[last] = k2;
        rebuild(self, q, &shape, &new, &pw, &sz2)
    }
}

fn check_range(dim: &str, start: usize, end: usize, len: usize, unit: usize) -> Result<()> {
    if start >= end || end > len {
        return Err(Error::invalid(
            format!("{dim} slice"),
            format!("{start}..{end}"),
            format!("must be a non-empty range within 0..{len}"),
        ));
    }
    let rule = if dim == "n" {
        "8 (the n-tile)".to_string()
    } else {
        format!("{unit} (lcm(inner_k_tiles*16, group_size))")
    };
    if !start.is_multiple_of(unit) {
        return Err(Error::shape(
            Int4TiledQuantizer::NAME,
            format!("{dim} slice start"),
            start,
            format!("must be a multiple of {rule}"),
        ));
    }
    if !end.is_multiple_of(unit) && end != len {
        return Err(Error::shape(
            Int4TiledQuantizer::NAME,
            format!("{dim} slice end"),
            end,
            format!("must be a multiple of {rule} or {dim}={len}"),
        ));
    }
    Ok(())
}

fn rebuild(
    src: &Int4TiledTensor,
    q: Int4TiledQuantizer,
    shape: &[usize],
    geo: &Geometry,
    packed: &[i32],
    sz: &[bf16],
) -> Result<Int4TiledTensor> {
    QuantizedTensor::from_buffers(
        q,
        &Shape::new(shape)?,
        src.dtype(),
        vec![
            Buffer::from_slice("packed_weight", &geo.packed_shape(), packed)?,
            Buffer::from_slice("scale_and_zero", &geo.scale_and_zero_shape(), sz)?,
        ],
    )
}
