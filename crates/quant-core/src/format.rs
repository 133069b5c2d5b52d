//! The static side of a format: the [`Format`] trait each recipe implements, and the
//! [`QuantizedTensor`] storage generic over it.
//!
//! A format crate writes one type (its quantizer: options only, no state) and implements
//! [`Format`] for it: which buffers a shape needs, how to fill them from a high-precision
//! tensor, and how to read them back. Everything else (zeroed allocation, checking buffers
//! rebuilt from a file, usage changes, the object-safe [`Quantizer`](crate::Quantizer) and
//! [`Storage`](crate::Storage) traits) is written once here, generically, so format
//! knowledge lives in the format's own type and shared code never matches on names.

use std::fmt;
use std::hash::Hash;
use std::ops::Range;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::buffer::{Buffer, BufferDesc, BufferMut};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::HostTensor;
use crate::usage::{Direction, Usage};

/// One option a format accepts in a spec string (`fp8:e5m2,pow2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHelp {
    /// The option as written; `name=` options show their value form, e.g. `seed=N`.
    pub name: &'static str,
    /// One line of help.
    pub help: &'static str,
}

/// A quantization recipe: options only (value-opaque and stateless), plus the kernels.
///
/// Two values with equal options are equal, hash equal and serialize equal; they can be
/// shared across threads. Implementors also get [`Quantizer`](crate::Quantizer) for free.
pub trait Format:
    Clone + fmt::Debug + PartialEq + Eq + Hash + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// Registry key and file-metadata name, e.g. `"fp8-block"`.
    const NAME: &'static str;
    /// The spec options this format understands.
    const OPTIONS: &'static [OptionHelp];
    /// The shape rule in one line, e.g. `"M and K must be multiples of 32"`.
    const SHAPE_RULE: &'static str;

    /// Builds the quantizer from spec options (the part after `NAME:`), split on commas.
    /// Unknown options must fail with [`Error::UnknownOption`] listing [`Self::OPTIONS`].
    fn from_spec(options: &[&str], usage: Usage) -> Result<Self>;

    /// The options that reproduce `self` through [`Format::from_spec`] (usage excluded).
    fn spec_options(&self) -> Vec<String>;

    /// Checks invariants that deserialization alone cannot (values read from a file).
    fn validate_options(&self) -> Result<()> {
        self.usage().require_some().map(|_| ())
    }

    /// Directions this quantizer produces.
    fn usage(&self) -> Usage;

    /// The same options with another usage.
    fn with_usage(&self, usage: Usage) -> Self;

    /// Whether a tensor of `shape` can be quantized, with an error naming the rule.
    fn check_shape(&self, shape: &Shape) -> Result<()>;

    /// The buffers a tensor of `shape` needs under [`Format::usage`], in storage order.
    /// Called only with shapes that passed [`Format::check_shape`].
    fn buffers(&self, shape: &Shape) -> Result<Vec<BufferDesc>>;

    /// Quantizes `x` into `out`, writable views of the buffers of [`Format::buffers`] in
    /// that order, zero-filled. `x.shape()` has passed [`Format::check_shape`]. The views
    /// may be windows of a larger (grouped) allocation.
    fn quantize_into(&self, x: &HostTensor<'_>, out: &mut [BufferMut<'_>]) -> Result<()>;

    /// Dequantizes the `dir` operand into `out` (the logical shape, row-major, never
    /// transposed). `bufs` matches [`Format::buffers`] and `dir` is in the usage.
    fn dequantize_into<T: Element>(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        dir: Direction,
        out: &mut [T],
    ) -> Result<()>;

    /// Builds the buffers a usage change adds, from the buffers present. Formats whose
    /// directions are separately scaled from the high-precision input cannot do this and
    /// keep the default, which refuses with the reason.
    fn derive_buffers(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        missing: &[BufferDesc],
    ) -> Result<Vec<Buffer>> {
        let _ = (shape, bufs);
        let names: Vec<&str> = missing.iter().map(|d| d.name.as_str()).collect();
        Err(Error::unsupported(
            Self::NAME,
            format!("deriving {} from the stored direction", names.join(", ")),
            "this format scales each direction separately from the high-precision input; quantize again with the new usage",
        ))
    }

    /// How many times quantizing reads the input: 1 for block formats whose scales come
    /// from the block itself, 2 where a tensor-wide amax must be known before the first
    /// byte is written (per-tensor scaling). Benchmarks use it for the memory roofline.
    fn input_passes(&self) -> usize {
        1
    }

    /// Row granularity of this quantizer: row ranges given to [`Format::gather_rows`] must
    /// start and end on multiples of it (the height of the tallest scale block, e.g. 128
    /// for 1x128 columnwise or 128x128 tiles, 32 for MXFP8, 16 for NVFP4, 1 for per-row or
    /// per-tensor scales). `None` when the format cannot move rows without requantizing.
    fn row_granularity(&self) -> Option<usize> {
        None
    }

    /// Copies row ranges of the 2-D view `[M, K]` into buffers for a tensor of
    /// `out_shape` (`[sum of range lengths, ...]`), moving every row's scales with it,
    /// without dequantizing. Ranges are already checked against
    /// [`Format::row_granularity`] and `M`. Used for tensor-parallel slicing and for GLU
    /// interleaving of quantized weights.
    fn gather_rows(
        &self,
        shape: &Shape,
        bufs: &[Buffer],
        ranges: &[Range<usize>],
        out_shape: &Shape,
    ) -> Result<Vec<Buffer>> {
        let _ = (shape, bufs, ranges, out_shape);
        Err(Error::unsupported(
            Self::NAME,
            "moving rows of a quantized tensor",
            "this format has no row-gather kernel",
        ))
    }

    /// Quantizes `x` with a tensor-wide amax reduced across ranks by `reducer` (TE's
    /// `with_amax_reduction`), so every shard gets the scale the whole tensor would.
    /// Formats without a tensor-wide amax ignore the reducer.
    fn quantize_reduced(
        &self,
        x: &HostTensor<'_>,
        reducer: &dyn crate::parallel::AmaxReducer,
    ) -> Result<QuantizedTensor<Self>> {
        let _ = reducer;
        quantize(self, x)
    }

    /// Checks buffer *contents* after they were rebuilt from untrusted bytes (shapes
    /// and dtypes are already checked). Default: nothing to check.
    fn validate_buffers(&self, shape: &Shape, bufs: &[Buffer]) -> Result<()> {
        let _ = (shape, bufs);
        Ok(())
    }

    /// The spec string, `NAME` or `NAME:opt,opt`.
    fn spec(&self) -> String {
        let opts = self.spec_options();
        if opts.is_empty() {
            Self::NAME.to_string()
        } else {
            format!("{}:{}", Self::NAME, opts.join(","))
        }
    }
}

/// Fails with [`Error::UnknownOption`] for `option`, listing `F`'s valid options.
pub fn unknown_option<F: Format>(option: &str) -> Error {
    Error::UnknownOption {
        format: F::NAME.to_string(),
        option: option.to_string(),
        valid: if F::OPTIONS.is_empty() {
            "(none)".to_string()
        } else {
            F::OPTIONS
                .iter()
                .map(|o| o.name)
                .collect::<Vec<_>>()
                .join(", ")
        },
    }
}

/// Finds buffer views by name in `bufs`, returning mutable references in the order of
/// `names` (`None` for names not present). Lets a kernel hold several outputs at once.
pub fn buffers_by_name_mut<'a, 'b, const N: usize>(
    bufs: &'a mut [BufferMut<'b>],
    names: [&str; N],
) -> [Option<&'a mut BufferMut<'b>>; N] {
    let mut out: [Option<&'a mut BufferMut<'b>>; N] = std::array::from_fn(|_| None);
    for b in bufs.iter_mut() {
        if let Some(i) = names.iter().position(|n| *n == b.name()) {
            out[i] = Some(b);
        }
    }
    out
}

/// Finds a buffer by name, or an error naming it.
pub fn buffer_by_name<'a>(bufs: &'a [Buffer], name: &str) -> Result<&'a Buffer> {
    bufs.iter()
        .find(|b| b.name() == name)
        .ok_or_else(|| Error::buffer(name, "is missing from the storage"))
}

/// The quantized bytes of one tensor in format `F`: logical shape, input dtype, the
/// quantizer that made it, and its named buffers.
///
/// Owned buffers and zero-copy views (members of a grouped tensor) are the same type:
/// buffers share their allocation and copy on write.
#[derive(Clone, Debug)]
pub struct QuantizedTensor<F: Format> {
    format: F,
    shape: Shape,
    dtype: DType,
    buffers: Vec<Buffer>,
}

impl<F: Format> QuantizedTensor<F> {
    /// A zero-filled tensor of `shape`, ready to be quantized into.
    pub fn allocate(format: F, shape: &Shape, dtype: DType) -> Result<Self> {
        check_input_dtype(dtype)?;
        shape.require_nonempty(F::NAME)?;
        format.usage().require_some()?;
        format.check_shape(shape)?;
        let buffers = format
            .buffers(shape)?
            .into_iter()
            .map(Buffer::zeroed)
            .collect::<Result<Vec<_>>>()?;
        Ok(QuantizedTensor {
            format,
            shape: shape.clone(),
            dtype,
            buffers,
        })
    }

    /// Rebuilds a tensor from buffers (any order), checking each against the format's
    /// description (name, dtype, shape, size) and then its contents. This is the
    /// *unflatten* of the native file layout: nothing from a file is trusted.
    pub fn from_buffers(
        format: F,
        shape: &Shape,
        dtype: DType,
        buffers: Vec<Buffer>,
    ) -> Result<Self> {
        format.validate_options()?;
        check_input_dtype(dtype)?;
        shape.require_nonempty(F::NAME)?;
        format.check_shape(shape)?;
        let want = format.buffers(shape)?;
        let mut given: Vec<Option<Buffer>> = buffers.into_iter().map(Some).collect();
        let mut ordered = Vec::with_capacity(want.len());
        for desc in &want {
            let pos = given
                .iter()
                .position(|b| b.as_ref().is_some_and(|b| b.name() == desc.name))
                .ok_or_else(|| {
                    Error::buffer(
                        &desc.name,
                        format!("is missing; {} {shape} needs it", format.spec()),
                    )
                })?;
            let b = given[pos]
                .take()
                .ok_or_else(|| Error::buffer(&desc.name, "given twice"))?;
            b.check_against(desc)?;
            ordered.push(b);
        }
        if let Some(extra) = given.into_iter().flatten().next() {
            return Err(Error::buffer(
                extra.name(),
                format!(
                    "is not a buffer of {} with usage {}",
                    format.spec(),
                    format.usage()
                ),
            ));
        }
        format.validate_buffers(shape, &ordered)?;
        Ok(QuantizedTensor {
            format,
            shape: shape.clone(),
            dtype,
            buffers: ordered,
        })
    }

    /// The quantizer that made this tensor.
    pub fn quantizer(&self) -> &F {
        &self.format
    }

    /// The logical shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The high-precision dtype the tensor was quantized from.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The stored directions.
    pub fn usage(&self) -> Usage {
        self.format.usage()
    }

    /// The buffers, in the format's order.
    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// One buffer by name.
    pub fn buffer(&self, name: &str) -> Result<&Buffer> {
        buffer_by_name(&self.buffers, name)
    }

    /// Total bytes of all buffers.
    pub fn nbytes(&self) -> usize {
        self.buffers.iter().map(Buffer::nbytes).sum()
    }

    /// Re-quantizes `x` into this tensor's buffers without reallocating.
    /// `x` must have this tensor's shape; its dtype becomes the tensor's dtype.
    pub fn quantize_from(&mut self, x: &HostTensor<'_>) -> Result<()> {
        if x.shape() != &self.shape {
            return Err(Error::invalid(
                "x",
                x.shape(),
                format!("must have the destination's shape {}", self.shape),
            ));
        }
        let mut views: Vec<BufferMut<'_>> =
            self.buffers.iter_mut().map(Buffer::as_mut_view).collect();
        for v in &mut views {
            v.bytes_mut().fill(0);
        }
        self.format.quantize_into(x, &mut views)?;
        self.dtype = x.dtype();
        Ok(())
    }

    fn check_dir(&self, dir: Direction) -> Result<()> {
        if self.usage().has(dir) {
            Ok(())
        } else {
            Err(Error::invalid(
                "direction",
                dir,
                format!("is not stored (usage is {})", self.usage()),
            ))
        }
    }

    /// Dequantizes the `dir` operand into a new vector of `T` in the logical shape.
    pub fn dequantize_as<T: Element>(&self, dir: Direction) -> Result<Vec<T>> {
        self.check_dir(dir)?;
        let mut out = vec![T::from_f32(0.0); self.shape.numel()];
        if !out.is_empty() {
            self.format
                .dequantize_into(&self.shape, &self.buffers, dir, &mut out)?;
        }
        Ok(out)
    }

    /// Dequantizes the `dir` operand to `dtype` (f32, bf16 or f16).
    pub fn dequantize(&self, dir: Direction, dtype: DType) -> Result<HostTensor<'static>> {
        let dims = self.shape.dims();
        match dtype {
            DType::F32 => HostTensor::from_vec(self.dequantize_as::<f32>(dir)?, dims),
            DType::BF16 => HostTensor::from_vec(self.dequantize_as::<half::bf16>(dir)?, dims),
            DType::F16 => HostTensor::from_vec(self.dequantize_as::<half::f16>(dir)?, dims),
            other => Err(Error::invalid(
                "dtype",
                other,
                "dequantize writes f32, bf16 or f16",
            )),
        }
    }

    /// Dequantizes the preferred direction (rowwise when stored) to f32.
    pub fn dequantize_f32(&self) -> Result<Vec<f32>> {
        let dir = self
            .usage()
            .preferred()
            .ok_or_else(|| Error::invalid("usage", "none", "the tensor stores no direction"))?;
        self.dequantize_as::<f32>(dir)
    }

    /// Changes the stored directions: drops buffers no longer needed, and derives new
    /// ones from the stored bytes where the format allows it (else an error naming why).
    pub fn update_usage(&mut self, usage: Usage) -> Result<()> {
        usage.require_some()?;
        if usage == self.usage() {
            return Ok(());
        }
        let new_format = self.format.with_usage(usage);
        new_format.validate_options()?;
        let want = new_format.buffers(&self.shape)?;
        let missing: Vec<BufferDesc> = want
            .iter()
            .filter(|d| !self.buffers.iter().any(|b| b.name() == d.name))
            .cloned()
            .collect();
        let mut derived = if missing.is_empty() {
            Vec::new()
        } else {
            self.format
                .derive_buffers(&self.shape, &self.buffers, &missing)?
        };
        let mut next = Vec::with_capacity(want.len());
        for desc in &want {
            let b = if let Some(pos) = derived.iter().position(|b| b.name() == desc.name) {
                derived.swap_remove(pos)
            } else {
                self.buffer(&desc.name)?.clone()
            };
            b.check_against(desc)?;
            next.push(b);
        }
        self.format = new_format;
        self.buffers = next;
        Ok(())
    }

    /// Lets a format's own entry points (quantizing with an externally reduced amax,
    /// interop importers) write the buffers' bytes through views; descriptions cannot
    /// change, so the storage stays consistent.
    pub fn write_buffers<R>(
        &mut self,
        f: impl FnOnce(&mut [BufferMut<'_>]) -> Result<R>,
    ) -> Result<R> {
        let mut views: Vec<BufferMut<'_>> =
            self.buffers.iter_mut().map(Buffer::as_mut_view).collect();
        f(&mut views)
    }

    /// Assembles a tensor from parts the caller has already checked against the format
    /// (grouped member views). Members with zero rows are allowed here.
    pub(crate) fn from_parts_trusted(
        format: F,
        shape: Shape,
        dtype: DType,
        buffers: Vec<Buffer>,
    ) -> Self {
        QuantizedTensor {
            format,
            shape,
            dtype,
            buffers,
        }
    }

    /// The rows `ranges` of the leading dimension (dim 0), concatenated, without
    /// dequantizing: each row keeps its bytes and scales. Every range boundary must be a
    /// multiple of the format's row granularity (in rows of the 2-D view).
    ///
    /// This is how a tensor-parallel shard is cut from a quantized weight, and how GLU
    /// weights are (de)interleaved in quantized form.
    pub fn gather_dim0(&self, ranges: &[Range<usize>]) -> Result<Self> {
        let dims = self.shape.dims();
        if dims.len() < 2 {
            return Err(Error::invalid(
                "tensor",
                &self.shape,
                "has rank 1; rows can only be gathered from a tensor of rank >= 2",
            ));
        }
        let d0 = dims[0];
        let inner: usize = dims[1..dims.len() - 1].iter().product();
        let gran = self.format.row_granularity().ok_or_else(|| {
            Error::unsupported(
                F::NAME,
                "moving rows of a quantized tensor",
                format!("{} scales blocks that cannot be split", self.format.spec()),
            )
        })?;
        let m = self.shape.rows();
        let mut rows = Vec::with_capacity(ranges.len());
        let mut total = 0usize;
        for (i, r) in ranges.iter().enumerate() {
            if r.start > r.end || r.end > d0 {
                return Err(Error::invalid(
                    "range",
                    format!("{}..{}", r.start, r.end),
                    format!("must lie within dim 0 of size {d0}"),
                ));
            }
            let (a, b) = (r.start * inner, r.end * inner);
            // A partial block at the end of the tensor may only stay at the end.
            let end_ok = b % gran == 0 || (b == m && i + 1 == ranges.len());
            if a % gran != 0 || !end_ok {
                return Err(Error::invalid(
                    "range",
                    format!("{}..{}", r.start, r.end),
                    format!(
                        "must start and end on multiples of {gran} rows ({} keeps one scale per {gran} rows)",
                        self.format.spec()
                    ),
                ));
            }
            total += r.end - r.start;
            rows.push(a..b);
        }
        let mut out_dims = dims.to_vec();
        out_dims[0] = total;
        let out_shape = Shape::new(&out_dims)?;
        out_shape.require_nonempty(F::NAME)?;
        self.format.check_shape(&out_shape)?;
        let bufs = self
            .format
            .gather_rows(&self.shape, &self.buffers, &rows, &out_shape)?;
        QuantizedTensor::from_buffers(self.format.clone(), &out_shape, self.dtype, bufs)
    }

    /// Rows `range` of dim 0 (see [`QuantizedTensor::gather_dim0`]).
    pub fn slice_dim0(&self, range: Range<usize>) -> Result<Self> {
        self.gather_dim0(std::slice::from_ref(&range))
    }

    /// Splits into parts (for grouped layouts and interop).
    pub fn into_parts(self) -> (F, Shape, DType, Vec<Buffer>) {
        (self.format, self.shape, self.dtype, self.buffers)
    }
}

/// Quantizes `x` with `format` into a new tensor (static dispatch, no boxing).
pub fn quantize<F: Format>(format: &F, x: &HostTensor<'_>) -> Result<QuantizedTensor<F>> {
    let mut t = QuantizedTensor::allocate(format.clone(), x.shape(), x.dtype())?;
    let mut views: Vec<BufferMut<'_>> = t.buffers.iter_mut().map(Buffer::as_mut_view).collect();
    format.quantize_into(x, &mut views)?;
    Ok(t)
}

fn check_input_dtype(dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::invalid(
            "dtype",
            dtype,
            "the logical dtype of a quantized tensor must be f32, bf16 or f16",
        ))
    }
}
