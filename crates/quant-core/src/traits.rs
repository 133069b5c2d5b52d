//! The object-safe side: [`Quantizer`], [`Storage`] and [`GroupedStorage`].
//!
//! Frameworks hold `Box<dyn Quantizer>` / `Arc<dyn Storage>` chosen at run time; every
//! [`Format`] implements these through the blanket impls below, so a format writes its
//! logic once and gets both static (`QuantizedTensor<F>`, no boxing) and dynamic use.

use std::any::Any;
use std::fmt;
use std::ops::Range;

use crate::buffer::{Buffer, BufferDesc};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::{Format, QuantizedTensor, quantize};
use crate::grouped::{GroupKind, GroupedTensor};
use crate::parallel::AmaxReducer;
use crate::proto::TensorProto;
use crate::shape::Shape;
use crate::tensor::HostTensor;
use crate::usage::{Direction, Usage};

/// A quantization recipe chosen at run time. Stateless: options only.
///
/// ```
/// # #![allow(dead_code)]
/// use quant_core::{Quantizer, Result, Shape};
/// // Any `Format` is a `Quantizer`: plan bytes for a shape without knowing the format.
/// fn describe(q: &dyn Quantizer, shape: &Shape) -> Result<usize> {
///     q.check_shape(shape)?;
///     Ok(q.buffers(shape)?.iter().map(|b| b.nbytes().unwrap_or(0)).sum())
/// }
/// ```
pub trait Quantizer: Send + Sync + fmt::Debug + Any {
    /// Registry key, e.g. `"mxfp8"`.
    fn format_name(&self) -> &'static str;
    /// Canonical spec string; parsing it gives an equal quantizer (usage aside).
    fn spec(&self) -> String;
    /// The options as JSON (what the native file's metadata stores).
    fn options(&self) -> Result<serde_json::Value>;
    /// The shape rule in one line.
    fn shape_rule(&self) -> &'static str;
    /// Directions produced.
    fn usage(&self) -> Usage;
    /// Passes over the input a quantization makes (see [`Format::input_passes`]).
    fn input_passes(&self) -> usize;
    /// The same options with another usage.
    fn with_usage(&self, usage: Usage) -> Box<dyn Quantizer>;
    /// Whether a tensor of `shape` can be quantized, with an error naming the rule.
    fn check_shape(&self, shape: &Shape) -> Result<()>;
    /// The buffers a tensor of `shape` needs (checks the shape first).
    fn buffers(&self, shape: &Shape) -> Result<Vec<BufferDesc>>;
    /// Quantizes into a new storage.
    fn quantize(&self, x: &HostTensor<'_>) -> Result<Box<dyn Storage>>;
    /// Quantizes a shard with the tensor-wide amax reduced across ranks (see
    /// [`crate::parallel`]); formats without a tensor-wide amax ignore `reducer`.
    fn quantize_reduced(
        &self,
        x: &HostTensor<'_>,
        reducer: &dyn AmaxReducer,
    ) -> Result<Box<dyn Storage>>;
    /// Quantizes into an existing storage of the same format and shape, reusing its memory.
    fn quantize_into(&self, x: &HostTensor<'_>, out: &mut dyn Storage) -> Result<()>;
    /// A zero-filled storage for a tensor of `shape` quantized from `dtype`.
    fn allocate(&self, shape: &Shape, dtype: DType) -> Result<Box<dyn Storage>>;
    /// Rebuilds a storage from its buffers, checking every one (see
    /// [`QuantizedTensor::from_buffers`]).
    fn unflatten(
        &self,
        shape: &Shape,
        dtype: DType,
        buffers: Vec<Buffer>,
    ) -> Result<Box<dyn Storage>>;
    /// Quantizes members held back to back in one contiguous input into a grouped tensor.
    fn quantize_grouped(
        &self,
        x: &HostTensor<'_>,
        shapes: &[Shape],
    ) -> Result<Box<dyn GroupedStorage>>;
    /// Quantizes a list of member inputs into a grouped tensor.
    fn quantize_grouped_list(&self, xs: &[HostTensor<'_>]) -> Result<Box<dyn GroupedStorage>>;
    /// Rebuilds a grouped tensor from its grouped buffers, checking each one.
    fn unflatten_grouped(
        &self,
        shapes: &[Shape],
        dtype: DType,
        buffers: Vec<Buffer>,
    ) -> Result<Box<dyn GroupedStorage>>;
    /// Clones into a box.
    fn clone_box(&self) -> Box<dyn Quantizer>;
    /// Equality across the trait object (same format and options).
    fn dyn_eq(&self, other: &dyn Quantizer) -> bool;
    /// Downcasting support.
    fn as_any(&self) -> &dyn Any;
}

impl Clone for Box<dyn Quantizer> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

impl PartialEq for dyn Quantizer {
    fn eq(&self, other: &Self) -> bool {
        self.dyn_eq(other)
    }
}

impl<F: Format> Quantizer for F {
    fn format_name(&self) -> &'static str {
        F::NAME
    }
    fn spec(&self) -> String {
        Format::spec(self)
    }
    fn options(&self) -> Result<serde_json::Value> {
        Ok(serde_json::to_value(self)?)
    }
    fn shape_rule(&self) -> &'static str {
        F::SHAPE_RULE
    }
    fn usage(&self) -> Usage {
        Format::usage(self)
    }
    fn input_passes(&self) -> usize {
        Format::input_passes(self)
    }
    fn with_usage(&self, usage: Usage) -> Box<dyn Quantizer> {
        Box::new(Format::with_usage(self, usage))
    }
    fn check_shape(&self, shape: &Shape) -> Result<()> {
        Format::check_shape(self, shape)
    }
    fn buffers(&self, shape: &Shape) -> Result<Vec<BufferDesc>> {
        Format::check_shape(self, shape)?;
        Format::buffers(self, shape)
    }
    fn quantize(&self, x: &HostTensor<'_>) -> Result<Box<dyn Storage>> {
        Ok(Box::new(quantize(self, x)?))
    }
    fn quantize_reduced(
        &self,
        x: &HostTensor<'_>,
        reducer: &dyn AmaxReducer,
    ) -> Result<Box<dyn Storage>> {
        x.shape().require_nonempty(F::NAME)?;
        Format::check_shape(self, x.shape())?;
        Ok(Box::new(Format::quantize_reduced(self, x, reducer)?))
    }
    fn quantize_into(&self, x: &HostTensor<'_>, out: &mut dyn Storage) -> Result<()> {
        let name = out.format_name();
        let t = out
            .as_any_mut()
            .downcast_mut::<QuantizedTensor<F>>()
            .ok_or_else(|| {
                Error::invalid(
                    "out",
                    format!("a {name} storage"),
                    format!("must be a {} storage to quantize into", F::NAME),
                )
            })?;
        if t.quantizer() != self {
            return Err(Error::invalid(
                "out",
                t.quantizer().spec(),
                format!(
                    "must have been made by the same quantizer ({})",
                    Format::spec(self)
                ),
            ));
        }
        t.quantize_from(x)
    }
    fn allocate(&self, shape: &Shape, dtype: DType) -> Result<Box<dyn Storage>> {
        Ok(Box::new(QuantizedTensor::allocate(
            self.clone(),
            shape,
            dtype,
        )?))
    }
    fn unflatten(
        &self,
        shape: &Shape,
        dtype: DType,
        buffers: Vec<Buffer>,
    ) -> Result<Box<dyn Storage>> {
        Ok(Box::new(QuantizedTensor::from_buffers(
            self.clone(),
            shape,
            dtype,
            buffers,
        )?))
    }
    fn quantize_grouped(
        &self,
        x: &HostTensor<'_>,
        shapes: &[Shape],
    ) -> Result<Box<dyn GroupedStorage>> {
        Ok(Box::new(GroupedTensor::quantize(self, x, shapes)?))
    }
    fn quantize_grouped_list(&self, xs: &[HostTensor<'_>]) -> Result<Box<dyn GroupedStorage>> {
        Ok(Box::new(GroupedTensor::quantize_list(self, xs)?))
    }
    fn unflatten_grouped(
        &self,
        shapes: &[Shape],
        dtype: DType,
        buffers: Vec<Buffer>,
    ) -> Result<Box<dyn GroupedStorage>> {
        Ok(Box::new(GroupedTensor::from_buffers(
            self.clone(),
            shapes,
            dtype,
            buffers,
        )?))
    }
    fn clone_box(&self) -> Box<dyn Quantizer> {
        Box::new(self.clone())
    }
    fn dyn_eq(&self, other: &dyn Quantizer) -> bool {
        other.as_any().downcast_ref::<F>() == Some(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The quantized bytes of one tensor, behind a trait object.
pub trait Storage: Send + Sync + fmt::Debug + Any {
    /// The quantizer that made it.
    fn quantizer(&self) -> &dyn Quantizer;
    /// Registry key of its format.
    fn format_name(&self) -> &'static str {
        self.quantizer().format_name()
    }
    /// Logical shape.
    fn shape(&self) -> &Shape;
    /// High-precision dtype it was quantized from.
    fn dtype(&self) -> DType;
    /// Stored directions.
    fn usage(&self) -> Usage {
        self.quantizer().usage()
    }
    /// The buffers (flatten): name, dtype, shape and bytes of each.
    fn buffers(&self) -> &[Buffer];
    /// One buffer by name.
    fn buffer(&self, name: &str) -> Option<&Buffer> {
        self.buffers().iter().find(|b| b.name() == name)
    }
    /// Total bytes of all buffers.
    fn nbytes(&self) -> usize {
        self.buffers().iter().map(Buffer::nbytes).sum()
    }
    /// Stored bits per logical value (all buffers, padding included).
    fn bits_per_value(&self) -> f64 {
        self.nbytes() as f64 * 8.0 / self.shape().numel().max(1) as f64
    }
    /// Dequantizes one direction to `dtype`, in the logical shape.
    fn dequantize(&self, dir: Direction, dtype: DType) -> Result<HostTensor<'static>>;
    /// Dequantizes the preferred direction (rowwise when stored) to f32.
    fn dequantize_f32(&self) -> Result<Vec<f32>>;
    /// Drops or derives directions.
    fn update_usage(&mut self, usage: Usage) -> Result<()>;
    /// Rows `ranges` of dim 0, concatenated, without dequantizing (scales move with their
    /// rows); boundaries must be multiples of the format's row granularity.
    fn gather_dim0(&self, ranges: &[Range<usize>]) -> Result<Box<dyn Storage>>;
    /// Rows `range` of dim 0 (a tensor-parallel shard), without dequantizing.
    fn slice_dim0(&self, range: Range<usize>) -> Result<Box<dyn Storage>> {
        self.gather_dim0(std::slice::from_ref(&range))
    }
    /// The data-free prototype of this tensor.
    fn proto(&self) -> TensorProto;
    /// Clones into a box (buffers are shared copy-on-write, so this is cheap).
    fn clone_box(&self) -> Box<dyn Storage>;
    /// Downcasting support.
    fn as_any(&self) -> &dyn Any;
    /// Downcasting support.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// Downcasting support for owned boxes.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl Clone for Box<dyn Storage> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

impl<F: Format> Storage for QuantizedTensor<F> {
    fn quantizer(&self) -> &dyn Quantizer {
        QuantizedTensor::<F>::quantizer(self)
    }
    fn shape(&self) -> &Shape {
        QuantizedTensor::<F>::shape(self)
    }
    fn dtype(&self) -> DType {
        QuantizedTensor::<F>::dtype(self)
    }
    fn buffers(&self) -> &[Buffer] {
        QuantizedTensor::<F>::buffers(self)
    }
    fn dequantize(&self, dir: Direction, dtype: DType) -> Result<HostTensor<'static>> {
        QuantizedTensor::dequantize(self, dir, dtype)
    }
    fn dequantize_f32(&self) -> Result<Vec<f32>> {
        QuantizedTensor::dequantize_f32(self)
    }
    fn update_usage(&mut self, usage: Usage) -> Result<()> {
        QuantizedTensor::update_usage(self, usage)
    }
    fn gather_dim0(&self, ranges: &[Range<usize>]) -> Result<Box<dyn Storage>> {
        Ok(Box::new(QuantizedTensor::gather_dim0(self, ranges)?))
    }
    fn proto(&self) -> TensorProto {
        TensorProto::from_storage(self)
    }
    fn clone_box(&self) -> Box<dyn Storage> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// N tensors of one quantizer in one contiguous allocation per buffer kind (MoE experts,
/// grouped GEMM operands), laid out as TransformerEngine's `GroupedTensor`: members back
/// to back, each keeping its own individually padded scale block, per-tensor scalars as
/// arrays of length N. See [`crate::grouped`].
pub trait GroupedStorage: Send + Sync + fmt::Debug + Any {
    /// The quantizer every member shares.
    fn quantizer(&self) -> &dyn Quantizer;
    /// Registry key of the format.
    fn format_name(&self) -> &'static str {
        self.quantizer().format_name()
    }
    /// High-precision dtype of the members.
    fn dtype(&self) -> DType;
    /// Number of members.
    fn num_members(&self) -> usize;
    /// Each member's logical shape.
    fn member_shapes(&self) -> &[Shape];
    /// Which dims vary between members.
    fn kind(&self) -> GroupKind;
    /// The logical 2-D shape (`[sum M_i, K]` for varying first dims, ...).
    fn logical_shape(&self) -> [usize; 2];
    /// The grouped buffers (one 1-D buffer per kind, members concatenated).
    fn buffers(&self) -> &[Buffer];
    /// Prefix sums of member element counts (`num_members + 1` entries).
    fn element_offsets(&self) -> &[usize];
    /// Prefix sums of member byte offsets within buffer `name` (`num_members + 1` entries).
    fn byte_offsets(&self, name: &str) -> Result<&[usize]>;
    /// Member `i` as a zero-copy view that is a full [`Storage`].
    fn member(&self, i: usize) -> Result<Box<dyn Storage>>;
    /// Total bytes.
    fn nbytes(&self) -> usize {
        self.buffers().iter().map(Buffer::nbytes).sum()
    }
    /// Clones into a box (buffers are shared copy-on-write).
    fn clone_box(&self) -> Box<dyn GroupedStorage>;
    /// Downcasting support.
    fn as_any(&self) -> &dyn Any;
    /// Downcasting support for owned boxes.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}
