//! The canonical form between native storages and layouts, and the scalar conventions.
//!
//! | scheme | codes | logical scales | scalar |
//! |---|---|---|---|
//! | `Fp8Tensor` | E4M3 `[..., K]` | f32 `[1]` = dequant multiplier (`scale_inv`) | - |
//! | `Fp8Block` | E4M3 `[..., K]` | f32 `[ceil(M/128), ceil(K/128)]` multipliers | - |
//! | `Mxfp8` | E4M3 `[..., K]` | E8M0 `[M, K/32]` | - |
//! | `Nvfp4` | E2M1 pairs `[..., K/2]`, element 2i low nibble | E4M3 `[M, K/16]` | the tensor amax |
//!
//! `M` is the product of the leading dimensions, `K` the last one. Every layout stores
//! the codes and the logical scales as they are; they differ in names, dtypes and in how
//! they write the NVFP4 tensor-level scalar, which is derived from the amax:
//!
//! ```text
//! ModelOpt           weight_scale_2      = f32(amax / (6 * E))         multiply
//! compressed-tensors weight_global_scale = fminf(6 * E / amax, MAX)    divide (TE's S_enc)
//! native (TE)        amax_rowwise        = amax;  dequant factor = (sdb * amax) * f32(1/(6E))
//! ```
//!
//! with `E` = 448 (or 256 for 4over6 tensors quantized with `e4m3max=256`). Neither
//! scalar determines the amax uniquely; [`amax_from_scale_2`] and
//! [`amax_from_global_scale`] pick the f32 amax closest to the exact inverse among those
//! that reproduce the stored scalar bit for bit, and the sidecar keeps the exact one.

use fmt_fp8::{BlockScaling, Fp8BlockQuantizer, Fp8Dtype, Fp8Quantizer};
use fmt_mxfp8::{Mxfp8Dtype, Mxfp8Quantizer, Mxfp8TensorExt, ScaleLayout};
use fmt_nvfp4::Nvfp4Quantizer;
use quant_core::format::buffer_by_name;
use quant_core::shape::ceil_div;
use quant_core::{
    Buffer, BufferDesc, DType, Direction, Error, HostBytes, QuantizedTensor, Quantizer, Result,
    Shape, Storage, Usage,
};

use crate::{AnyQuantizer, AnyStorage};

use super::sidecar::SidecarEntry;

/// What a quantized weight holds, in the terms every layout shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    /// FP8 E4M3, one f32 multiplier per tensor.
    Fp8Tensor,
    /// FP8 E4M3, one f32 multiplier per 128x128 tile (DeepSeek-V3).
    Fp8Block,
    /// MXFP8: E4M3 with one E8M0 scale per 32 elements of a row.
    Mxfp8,
    /// NVFP4: E2M1 with one E4M3 scale per 16 elements of a row and a tensor scalar.
    Nvfp4,
    /// int4 tinygemm tiles (torchao `Int4TilePackedTo4dTensor`).
    Int4Tiled,
}

impl Scheme {
    /// A short description for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Scheme::Fp8Tensor => "FP8 per-tensor",
            Scheme::Fp8Block => "FP8 128x128-block",
            Scheme::Mxfp8 => "MXFP8",
            Scheme::Nvfp4 => "NVFP4",
            Scheme::Int4Tiled => "int4 tile-packed",
        }
    }

    /// The native quantizer a weight of this scheme gets when nothing else is known
    /// (rowwise only: layouts store the forward operand).
    pub fn default_quantizer(self) -> AnyQuantizer {
        match self {
            Scheme::Fp8Tensor => AnyQuantizer::Fp8(Fp8Quantizer::new(Usage::ROWWISE)),
            Scheme::Fp8Block => {
                AnyQuantizer::Fp8Block(Fp8BlockQuantizer::new(BlockScaling::TwoD, Usage::ROWWISE))
            }
            Scheme::Mxfp8 => AnyQuantizer::Mxfp8(Mxfp8Quantizer::new(Usage::ROWWISE)),
            Scheme::Nvfp4 => AnyQuantizer::Nvfp4(Nvfp4Quantizer::new(Usage::ROWWISE)),
            Scheme::Int4Tiled => AnyQuantizer::Int4Tiled(
                fmt_int4tiled::Int4TiledQuantizer::new()
                    .with_padding(fmt_int4tiled::Padding::Torchao),
            ),
        }
    }

    /// The scheme of a native quantizer, or why no layout can hold it. Data-free.
    pub fn of(q: &AnyQuantizer) -> Result<Scheme> {
        let refuse = |what: &str, why: &str| Err(Error::unsupported(q.spec(), what, why));
        match q {
            AnyQuantizer::Fp8(f) => {
                if f.dtype() != Fp8Dtype::E4M3 {
                    return refuse(
                        "exporting E5M2",
                        "checkpoint layouts store E4M3 weights only",
                    );
                }
                Ok(Scheme::Fp8Tensor)
            }
            AnyQuantizer::Fp8Block(f) => {
                if f.dtype() != Fp8Dtype::E4M3 {
                    return refuse(
                        "exporting E5M2",
                        "checkpoint layouts store E4M3 weights only",
                    );
                }
                if f.block() != BlockScaling::TwoD {
                    return refuse(
                        "exporting 1x128 block scales",
                        "checkpoint layouts hold 128x128 weight blocks only (1x128 is TE's activation recipe)",
                    );
                }
                Ok(Scheme::Fp8Block)
            }
            AnyQuantizer::Mxfp8(f) => {
                if f.dtype() != Mxfp8Dtype::E4M3 {
                    return refuse(
                        "exporting E5M2",
                        "checkpoint layouts store E4M3 weights only",
                    );
                }
                Ok(Scheme::Mxfp8)
            }
            AnyQuantizer::Nvfp4(f) => {
                if f.row_scaled() {
                    return refuse(
                        "exporting row-scaled NVFP4",
                        "checkpoint layouts hold one tensor scalar, not one amax per row",
                    );
                }
                if !f.usage().rowwise && (f.rht() || !f.is_2d()) {
                    return refuse(
                        "exporting a columnwise-only tensor",
                        "layouts store the rowwise (forward) operand, which cannot be derived from this columnwise one",
                    );
                }
                Ok(Scheme::Nvfp4)
            }
            AnyQuantizer::Int4Tiled(_) => Ok(Scheme::Int4Tiled),
        }
    }

    /// Shape of the logical scales of a tensor of `shape`.
    pub fn scale_shape(self, shape: &[usize]) -> Vec<usize> {
        let k = shape.last().copied().unwrap_or(0);
        let m: usize = shape.iter().rev().skip(1).product();
        match self {
            Scheme::Fp8Tensor => vec![1],
            Scheme::Fp8Block => vec![ceil_div(m, 128), ceil_div(k, 128)],
            Scheme::Mxfp8 => vec![m, k / 32],
            Scheme::Nvfp4 => vec![m, k / 16],
            Scheme::Int4Tiled => Vec::new(),
        }
    }
}

/// Logical scales, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum Scales {
    /// f32 multipliers (FP8 per-tensor and block).
    F32(Vec<f32>),
    /// One byte per scale: E8M0 (MXFP8) or E4M3 (NVFP4).
    U8(Vec<u8>),
}

impl Scales {
    /// The scales as little-endian bytes.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            Scales::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Scales::U8(v) => v.clone(),
        }
    }

    /// Number of scales.
    pub fn len(&self) -> usize {
        match self {
            Scales::F32(v) => v.len(),
            Scales::U8(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The NVFP4 tensor scalar as a layout stored it, kept to check a sidecar's amax.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StoredScalar {
    /// ModelOpt `weight_scale_2` (multiply).
    Scale2(f32),
    /// compressed-tensors `weight_global_scale` (divide).
    GlobalScale(f32),
}

impl StoredScalar {
    /// Whether `amax` (with `e4m3_max`) gives exactly this stored value.
    pub fn matches(self, amax: f32, e4m3_max: u16) -> bool {
        match self {
            StoredScalar::Scale2(s) => scale_2_from_amax(amax, e4m3_max).to_bits() == s.to_bits(),
            StoredScalar::GlobalScale(g) => {
                global_scale_from_amax(amax, e4m3_max).to_bits() == g.to_bits()
            }
        }
    }
}

/// One weight in canonical form.
#[derive(Clone, Debug)]
pub struct Canonical {
    /// What it holds.
    pub scheme: Scheme,
    /// Logical shape `[..., K]`.
    pub shape: Vec<usize>,
    /// Rowwise codes, row-major (FP8: one byte per value; NVFP4: two values per byte).
    pub codes: HostBytes,
    /// Logical scales ([`Scheme::scale_shape`]).
    pub scales: Scales,
    /// NVFP4: the tensor amax (native convention). Unused otherwise.
    pub amax: f32,
    /// NVFP4: the E4M3 max the scalar was normalised with (448, or 256 for 4over6).
    pub e4m3_max: u16,
    /// NVFP4 read from a layout: the scalar as stored, to validate a sidecar amax.
    pub stored: Option<StoredScalar>,
}

/// ModelOpt's `weight_scale_2 = amax / (6 * E)` in f32
/// (`NVFP4QTensor.get_weights_scaling_factor_2`: `amax.float() / (E2M1_MAX * E4M3_MAX)`).
///
/// ```
/// use quantfmt::interop::canonical::scale_2_from_amax;
/// assert_eq!(scale_2_from_amax(2688.0, 448), 1.0);
/// ```
pub fn scale_2_from_amax(amax: f32, e4m3_max: u16) -> f32 {
    amax / (6.0 * f32::from(e4m3_max))
}

/// compressed-tensors' `weight_global_scale`, written as the `S_enc` TE quantized with:
/// `fminf(6 * E / amax, FLT_MAX)`, 1 for a zero amax (`fmt_nvfp4::scale`). For a
/// normal amax this equals compressed-tensors' own `generate_gparam`
/// (`448 * 6 / amax` in f32).
pub fn global_scale_from_amax(amax: f32, e4m3_max: u16) -> f32 {
    fmt_nvfp4::scale::global_encode_scale(amax, e4m3_max)
}

/// The f32 amax closest to `target` (an exact inverse in f64) among the neighbours of
/// `start` for which `forward(amax) == stored` bit for bit; `None` if none does.
fn invert(start: f32, target: f64, stored: f32, forward: impl Fn(f32) -> f32) -> Option<f32> {
    if !start.is_finite() || start < 0.0 {
        return None;
    }
    let bits = start.to_bits() as i64;
    (-8i64..=8)
        .filter_map(|d| u32::try_from(bits + d).ok().map(f32::from_bits))
        .filter(|a| a.is_finite() && *a >= 0.0 && forward(*a).to_bits() == stored.to_bits())
        .min_by(|a, b| {
            let da = (f64::from(*a) - target).abs();
            let db = (f64::from(*b) - target).abs();
            da.total_cmp(&db).then(a.total_cmp(b))
        })
}

/// The amax a ModelOpt `weight_scale_2` implies: the f32 `a` nearest `s * 6E` with
/// `a / (6E) == s` exactly; `(a, exact)` where `exact` is false when no f32 reproduces
/// `s` (then `f32(s * 6E)`).
///
/// ```
/// use quantfmt::interop::canonical::{amax_from_scale_2, scale_2_from_amax};
/// let a = 3.75f32;
/// let (b, exact) = amax_from_scale_2(scale_2_from_amax(a, 448), 448);
/// assert!(exact);
/// assert_eq!(scale_2_from_amax(b, 448), scale_2_from_amax(a, 448));
/// ```
pub fn amax_from_scale_2(s: f32, e4m3_max: u16) -> (f32, bool) {
    let d = 6.0 * f32::from(e4m3_max);
    let start = s * d;
    match invert(start, f64::from(s) * f64::from(d), s, |a| a / d) {
        Some(a) => (a, true),
        None => (start, false),
    }
}

/// The amax a compressed-tensors `weight_global_scale` implies (the f32 nearest
/// `6E / g` with `global_scale_from_amax(a) == g` exactly). `g == 1` with all-zero
/// block scales is an all-zero tensor (amax 0, as TE stores it).
pub fn amax_from_global_scale(g: f32, e4m3_max: u16, all_zero: bool) -> (f32, bool) {
    if g == 1.0 && all_zero {
        return (0.0, true);
    }
    let n = 6.0 * f32::from(e4m3_max);
    let start = n / g;
    match invert(start, f64::from(n) / f64::from(g), g, |a| {
        global_scale_from_amax(a, e4m3_max)
    }) {
        Some(a) => (a, true),
        None => (start, false),
    }
}

/// `s` as the enum of shipped formats (a cheap clone: buffers are shared).
pub(crate) fn any_storage(s: &dyn Storage) -> Result<AnyStorage> {
    if let Some(a) = s.as_any().downcast_ref::<AnyStorage>() {
        return Ok(a.clone());
    }
    AnyStorage::from_box(s.clone_box())
}

fn logical_2d(shape: &[usize]) -> Result<(usize, usize)> {
    let s = Shape::new(shape)?;
    Ok(s.as_2d())
}

/// Copies the `rows x cols` logical corner out of a padded row-major matrix of width
/// `stride`.
fn unpad<T: Copy>(src: &[T], rows: usize, cols: usize, stride: usize) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row = src
            .get(r * stride..r * stride + cols)
            .ok_or_else(|| Error::buffer("scales", "are smaller than their shape says"))?;
        out.extend_from_slice(row);
    }
    Ok(out)
}

/// Places a logical `rows x cols` matrix into a zeroed padded matrix of `padded` shape.
fn pad<T: Copy + Default>(src: &[T], rows: usize, cols: usize, padded: [usize; 2]) -> Vec<T> {
    let mut out = vec![T::default(); padded[0] * padded[1]];
    for r in 0..rows {
        out[r * padded[1]..r * padded[1] + cols].copy_from_slice(&src[r * cols..(r + 1) * cols]);
    }
    out
}

fn f32s(b: &Buffer) -> Result<Vec<f32>> {
    Ok(b.as_slice::<f32>()?.to_vec())
}

/// Native storage -> canonical form, the notes on what no layout holds, and the sidecar
/// entry that restores the rest.
pub fn canonical_from_native(s: &dyn Storage) -> Result<(Canonical, Vec<String>, SidecarEntry)> {
    let mut any = any_storage(s)?;
    let q = AnyQuantizer::from_dyn(any.quantizer())?;
    Scheme::of(&q)?;
    let mut notes = Vec::new();
    let usage = any.usage();
    if !usage.rowwise {
        any.update_usage(Usage::BOTH).map_err(|e| {
            Error::unsupported(
                q.spec(),
                "exporting a columnwise-only tensor",
                format!("layouts store the rowwise operand and it cannot be derived here: {e}"),
            )
        })?;
        notes.push(
            "rowwise operand derived from the stored columnwise one (exact for 2-D recipes)".into(),
        );
    }
    if usage.columnwise {
        notes.push(format!(
            "columnwise copy not stored by checkpoint layouts ({})",
            if derivable(&q) {
                "restored from the sidecar on the way back: exact for this 2-D recipe"
            } else {
                "dropped: quantize again with columnwise usage to get it back"
            }
        ));
    }
    let shape = any.shape().dims().to_vec();
    let (m, k) = logical_2d(&shape)?;
    let sidecar = SidecarEntry::describe(&any, &q)?;
    let c = match &any {
        AnyStorage::Fp8(t) => {
            let qz = t.quantizer();
            if qz.pow2_scales() || qz.amax_epsilon() != 0.0 {
                notes.push(format!(
                    "recipe options of {} kept in the quantfmt sidecar only",
                    qz.spec()
                ));
            }
            Canonical {
                scheme: Scheme::Fp8Tensor,
                shape,
                codes: t.buffer("rowwise_data")?.host().clone(),
                scales: Scales::F32(f32s(t.buffer("scale_inv")?)?),
                amax: 0.0,
                e4m3_max: 448,
                stored: None,
            }
        }
        AnyStorage::Fp8Block(t) => {
            let (sr, _) = t.quantizer().scale_shapes(m, k);
            let s = t.buffer("rowwise_scale_inv")?.as_slice::<f32>()?;
            let (nmb, nkb) = (ceil_div(m, 128), ceil_div(k, 128));
            if shape.len() > 2 && shape[shape.len() - 2] % 128 != 0 {
                return Err(Error::unsupported(
                    t.quantizer().spec(),
                    format!("exporting the {}-D tensor {shape:?}", shape.len()),
                    "its 128x128 blocks straddle the leading dimension; layouts keep one block grid per 2-D matrix",
                ));
            }
            Canonical {
                scheme: Scheme::Fp8Block,
                shape,
                codes: t.buffer("rowwise_data")?.host().clone(),
                scales: Scales::F32(unpad(s, nmb, nkb, sr[1])?),
                amax: 0.0,
                e4m3_max: 448,
                stored: None,
            }
        }
        AnyStorage::Mxfp8(t) => {
            let qz = t.quantizer();
            if qz.scale_layout() == ScaleLayout::Swizzled {
                notes.push("scales reordered from the cuBLAS swizzle to row-major (exact)".into());
            }
            Canonical {
                scheme: Scheme::Mxfp8,
                shape,
                codes: t.buffer(fmt_mxfp8::ROWWISE_DATA)?.host().clone(),
                scales: Scales::U8(t.scale_codes(Direction::Rowwise)?),
                amax: 0.0,
                e4m3_max: 448,
                stored: None,
            }
        }
        AnyStorage::Nvfp4(t) => {
            let qz = t.quantizer();
            if qz.swizzled() {
                notes.push("scales reordered from the cuBLAS swizzle to row-major (exact)".into());
            }
            let compact = fmt_nvfp4::with_scale_layout(t, false)?;
            let stride = fmt_nvfp4::layout::scale_shape(m, k)[1];
            let sb = compact.buffer("rowwise_scale_inv")?.bytes();
            let amax = compact.buffer("amax_rowwise")?.as_slice::<f32>()?;
            let amax = *amax
                .first()
                .ok_or_else(|| Error::buffer("amax_rowwise", "is empty"))?;
            Canonical {
                scheme: Scheme::Nvfp4,
                shape,
                codes: compact.buffer("rowwise_data")?.host().clone(),
                scales: Scales::U8(unpad(sb, m, k / 16, stride)?),
                amax,
                e4m3_max: qz.e4m3_max(),
                stored: None,
            }
        }
        AnyStorage::Int4Tiled(t) => {
            return Err(Error::unsupported(
                t.quantizer().spec(),
                "storing int4 tiles in this layout",
                "only the torchao layout holds int4 tile-packed weights",
            ));
        }
    };
    Ok((c, notes, sidecar))
}

/// Whether a quantizer's columnwise buffers can be derived from its rowwise ones.
pub fn derivable(q: &AnyQuantizer) -> bool {
    match q {
        AnyQuantizer::Fp8(_) => true,
        AnyQuantizer::Fp8Block(f) => f.block() == BlockScaling::TwoD,
        AnyQuantizer::Mxfp8(f) => f.is_2d(),
        AnyQuantizer::Nvfp4(f) => f.is_2d() && !f.rht(),
        AnyQuantizer::Int4Tiled(_) => false,
    }
}

/// What a unit read from a layout becomes natively: the quantizer (with the usage to
/// restore) and the logical input dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct NativePlan {
    /// The quantizer (planned from the sidecar, or the scheme's default).
    pub quantizer: AnyQuantizer,
    /// The logical (input) dtype.
    pub dtype: DType,
}

impl NativePlan {
    /// The buffers this plan produces for `shape` (to plan a native file's header).
    pub fn buffers(&self, shape: &[usize]) -> Result<Vec<BufferDesc>> {
        self.quantizer.buffers(&Shape::new(shape)?)
    }
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::buffer(
            what,
            format!("holds {got} values, but the shape needs {want}"),
        ))
    }
}

/// Canonical form -> native storage following `plan`; `sidecar` (already matched to
/// this unit) supplies the exact NVFP4 amax when it reproduces the stored scalar.
pub fn native_from_canonical(
    c: Canonical,
    plan: &NativePlan,
    sidecar: Option<&SidecarEntry>,
    notes: &mut Vec<String>,
) -> Result<AnyStorage> {
    let shape = Shape::new(&c.shape)?;
    let (m, k) = shape.as_2d();
    let want_scales: usize = c.scheme.scale_shape(&c.shape).iter().product();
    check_len("scales", c.scales.len(), want_scales)?;
    let rowwise = plan.quantizer.with_usage(Usage::ROWWISE);
    let rowwise = AnyQuantizer::from_dyn(&*rowwise)?;
    let dtype = plan.dtype;
    let data_desc = |name: &str, dims: &[usize]| BufferDesc::new(name, DType::U8, dims);
    let mut storage: AnyStorage = match (&rowwise, &c.scales) {
        (AnyQuantizer::Fp8(q), Scales::F32(s)) => {
            let bufs = vec![
                Buffer::from_host_bytes(data_desc("rowwise_data", shape.dims()), c.codes)?,
                Buffer::from_slice::<f32>("scale_inv", &[1], s)?,
            ];
            QuantizedTensor::from_buffers(q.clone(), &shape, dtype, bufs)?.into()
        }
        (AnyQuantizer::Fp8Block(q), Scales::F32(s)) => {
            let q = q.clone();
            let (sr, _) = q.scale_shapes(m, k);
            let padded = pad(s, ceil_div(m, 128), ceil_div(k, 128), sr);
            let bufs = vec![
                Buffer::from_host_bytes(data_desc("rowwise_data", shape.dims()), c.codes)?,
                Buffer::from_slice::<f32>("rowwise_scale_inv", &sr, &padded)?,
            ];
            QuantizedTensor::from_buffers(q, &shape, dtype, bufs)?.into()
        }
        (AnyQuantizer::Mxfp8(q), Scales::U8(s)) => {
            let compact_q = q.clone().with_scale_layout(ScaleLayout::Compact);
            let (sr, _) = compact_q.scale_shapes(m, k);
            let padded = pad(s, m, k / 32, sr);
            let bufs = vec![
                Buffer::from_host_bytes(data_desc(fmt_mxfp8::ROWWISE_DATA, shape.dims()), c.codes)?,
                Buffer::from_slice::<u8>(fmt_mxfp8::ROWWISE_SCALE_INV, &sr, &padded)?,
            ];
            let t = QuantizedTensor::from_buffers(compact_q, &shape, dtype, bufs)?;
            t.to_scale_layout(q.scale_layout())?.into()
        }
        (AnyQuantizer::Nvfp4(q), Scales::U8(s)) => {
            let compact_q = q.clone().with_swizzled(false);
            let amax = match (sidecar.and_then(|e| e.amax()), c.stored) {
                (Some(a), Some(stored)) if stored.matches(a, q.e4m3_max()) => a,
                (Some(_), Some(_)) => {
                    notes.push("sidecar amax does not reproduce the stored tensor scale (file edited?); using the inverse of the stored scale".into());
                    c.amax
                }
                (Some(a), None) => a,
                (None, _) => c.amax,
            };
            let sr = fmt_nvfp4::layout::scale_shape(m, k);
            let padded = pad(s, m, k / 16, sr);
            let mut data_dims = shape.dims().to_vec();
            if let Some(last) = data_dims.last_mut() {
                *last /= 2;
            }
            let bufs = vec![
                Buffer::from_host_bytes(data_desc("rowwise_data", &data_dims), c.codes)?,
                Buffer::from_slice::<u8>("rowwise_scale_inv", &sr, &padded)?,
                Buffer::from_slice::<f32>("amax_rowwise", &[1], &[amax])?,
            ];
            let t = QuantizedTensor::from_buffers(compact_q, &shape, dtype, bufs)?;
            fmt_nvfp4::with_scale_layout(&t, q.swizzled())?.into()
        }
        (q, _) => {
            return Err(Error::invalid(
                "native plan",
                q.spec(),
                format!("does not store {} weights", c.scheme.describe()),
            ));
        }
    };
    let usage = quant_core::Quantizer::usage(&plan.quantizer);
    if usage != Usage::ROWWISE {
        storage.update_usage(usage)?;
    }
    Ok(storage)
}

/// Reads the logical scales of a layout tensor (f32 or one byte per scale).
pub(crate) fn scales_from_raw(
    raw: &quant_core::io::RawTensor,
    scheme: Scheme,
    what: &str,
) -> Result<Scales> {
    let bytes = raw.data.as_slice();
    Ok(match scheme {
        Scheme::Int4Tiled => {
            return Err(Error::buffer(
                what,
                "int4 tiles have no separate scale tensor",
            ));
        }
        Scheme::Fp8Tensor | Scheme::Fp8Block => {
            if raw.dtype != safetensors::Dtype::F32 {
                return Err(Error::buffer(
                    what,
                    format!(
                        "has dtype {}, but {} scales are F32",
                        raw.dtype,
                        scheme.describe()
                    ),
                ));
            }
            Scales::F32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            )
        }
        Scheme::Mxfp8 | Scheme::Nvfp4 => {
            if raw.dtype.bitsize() != 8 {
                return Err(Error::buffer(
                    what,
                    format!(
                        "has dtype {}, but {} scales are one byte each",
                        raw.dtype,
                        scheme.describe()
                    ),
                ));
            }
            Scales::U8(bytes.to_vec())
        }
    })
}

/// Refuses an NVFP4 weight whose producer divided by a zero amax: block scales
/// (`scales`, E4M3 bytes) holding NaN under a tensor scalar (`scalar`, named
/// `scalar_name`) that says the amax was 0 (`degenerate`: ModelOpt's `weight_scale_2 =
/// 0`, compressed-tensors' `weight_global_scale = inf`). Such a file has no NVFP4
/// encoding of the weight to convert (`0 / 0` in every block), and the error says why,
/// naming both tensors, where the generic check would only report a NaN block scale.
pub(crate) fn refuse_zero_amax_nan_scales(
    scales: &quant_core::io::RawTensor,
    scales_name: &str,
    (scalar, scalar_name): (f32, &str),
    degenerate: bool,
) -> Result<()> {
    let nan = scales.data.as_slice().iter().any(|&b| b & 0x7F == 0x7F);
    if degenerate && nan {
        return Err(Error::buffer(
            scales_name,
            format!(
                "holds NaN block scales, and `{scalar_name}` = {scalar} says the weight's \
                 amax is 0: an all-zero weight whose producer divided by its amax, which \
                 has no NVFP4 encoding to convert (re-export it unquantized, or quantize \
                 it with `quantfmt quantize`)"
            ),
        ));
    }
    Ok(())
}

/// One f32 read from a scalar (`[]` or `[1]`) tensor.
pub(crate) fn scalar_f32(raw: &quant_core::io::RawTensor, what: &str) -> Result<f32> {
    if raw.dtype != safetensors::Dtype::F32 || raw.data.len() != 4 {
        return Err(Error::buffer(
            what,
            format!("must be one F32 value, found {} {:?}", raw.dtype, raw.shape),
        ));
    }
    let b = raw.data.as_slice();
    Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Checks a layout tensor's dtype against what the scheme stores there.
pub(crate) fn expect_dtype(
    raw: &quant_core::io::RawTensor,
    what: &str,
    ok: &[safetensors::Dtype],
) -> Result<()> {
    if ok.contains(&raw.dtype) {
        Ok(())
    } else {
        Err(Error::buffer(
            what,
            format!(
                "has dtype {}, expected {}",
                raw.dtype,
                ok.iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        ))
    }
}

/// Checks a layout tensor's shape.
pub(crate) fn expect_shape(
    raw: &quant_core::io::RawTensor,
    what: &str,
    want: &[usize],
) -> Result<()> {
    if raw.shape == want {
        Ok(())
    } else {
        Err(Error::buffer(
            what,
            format!("has shape {:?}, expected {want:?}", raw.shape),
        ))
    }
}

/// The codes of a layout weight: FP8 (`F8_E4M3` or `U8`) one per value, or packed
/// E2M1 as `U8 [..., K/2]` or safetensors `F4 [..., K]` (same bytes: element 2i in the
/// low nibble). Returns the codes and the logical shape.
pub(crate) fn codes_from_raw(
    raw: quant_core::io::RawTensor,
    scheme: Scheme,
    what: &str,
) -> Result<(HostBytes, Vec<usize>)> {
    let mut shape = raw.shape.clone();
    match scheme {
        Scheme::Nvfp4 => match raw.dtype {
            safetensors::Dtype::U8 => {
                if let Some(last) = shape.last_mut() {
                    *last *= 2;
                }
            }
            safetensors::Dtype::F4 => {}
            other => {
                return Err(Error::buffer(
                    what,
                    format!("has dtype {other}; packed E2M1 is U8 [.., K/2] or F4 [.., K]"),
                ));
            }
        },
        _ => expect_dtype(
            &raw,
            what,
            &[safetensors::Dtype::F8_E4M3, safetensors::Dtype::U8],
        )?,
    }
    if shape.len() < 2 {
        return Err(Error::buffer(
            what,
            format!("has shape {:?}; weights have rank >= 2", raw.shape),
        ));
    }
    Ok((raw.data, shape))
}

/// Reads a buffer of a native storage by name (helper for tests and exporters).
pub fn native_buffer<'a>(s: &'a AnyStorage, name: &str) -> Result<&'a Buffer> {
    buffer_by_name(quant_core::Storage::buffers(s), name)
}

/// A raw tensor from bytes.
pub(crate) fn raw(
    dtype: safetensors::Dtype,
    shape: &[usize],
    bytes: HostBytes,
) -> quant_core::io::RawTensor {
    quant_core::io::RawTensor {
        dtype,
        shape: shape.to_vec(),
        data: bytes,
    }
}

/// A raw F32 tensor.
pub(crate) fn raw_f32(shape: &[usize], v: &[f32]) -> quant_core::io::RawTensor {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    raw(safetensors::Dtype::F32, shape, HostBytes::copy_from(&b))
}

/// `shape` with its last dimension divided by `d`.
pub(crate) fn last_div(shape: &[usize], d: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    if let Some(l) = s.last_mut() {
        *l /= d;
    }
    s
}

/// The block-scale shape a layout stores for an FP8 128x128 weight of `shape`: the
/// leading dimensions, then `[ceil(N/128), ceil(K/128)]` of the last two.
pub(crate) fn block_scale_shape(shape: &[usize]) -> Vec<usize> {
    let r = shape.len();
    let mut s: Vec<usize> = shape.iter().take(r.saturating_sub(2)).copied().collect();
    let n = if r >= 2 { shape[r - 2] } else { 1 };
    let k = shape.last().copied().unwrap_or(0);
    s.push(ceil_div(n, 128));
    s.push(ceil_div(k, 128));
    s
}

/// Whether every scale is a positive power of two (an FP8 block recipe with `pow2`).
pub(crate) fn all_pow2(s: &[f32]) -> bool {
    s.iter()
        .all(|v| v.is_finite() && *v > 0.0 && v.to_bits() & 0x007F_FFFF == 0)
}
