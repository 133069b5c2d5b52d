//! Data-free prototypes: everything knowable about a quantized tensor before allocation.

use std::fmt;
use std::sync::Arc;

use crate::buffer::BufferDesc;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::traits::{Quantizer, Storage};
use crate::usage::Usage;

/// Shape + input dtype + quantizer (with its usage), and no data.
///
/// Frameworks use it to plan memory and trace graphs without touching a device: it
/// lists buffers and bytes, validates the shape against the format's rule, changes
/// usage, and allocates a zeroed storage when the time comes.
#[derive(Clone)]
pub struct TensorProto {
    shape: Shape,
    dtype: DType,
    quantizer: Arc<dyn Quantizer>,
}

impl TensorProto {
    /// A prototype. Fails on an invalid shape (rank 0, overflow) or a non-float dtype;
    /// the format's own shape rule is checked by [`TensorProto::validate`] and every query.
    pub fn new<Q: Quantizer + ?Sized>(
        shape: &[usize],
        dtype: DType,
        quantizer: &Q,
    ) -> Result<TensorProto> {
        let shape = Shape::new(shape)?;
        if !dtype.is_float() {
            return Err(Error::invalid(
                "dtype",
                dtype,
                "a prototype's input dtype must be f32, bf16 or f16",
            ));
        }
        let q: Box<dyn Quantizer> = quantizer_box(quantizer);
        Ok(TensorProto {
            shape,
            dtype,
            quantizer: Arc::from(q),
        })
    }

    /// The prototype of an existing storage (round-trips: its buffers equal the storage's).
    pub fn from_storage<S: Storage + ?Sized>(s: &S) -> TensorProto {
        TensorProto {
            shape: s.shape().clone(),
            dtype: s.dtype(),
            quantizer: Arc::from(s.quantizer().clone_box()),
        }
    }

    /// Logical shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Input dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The quantizer.
    pub fn quantizer(&self) -> &dyn Quantizer {
        &*self.quantizer
    }

    /// Stored directions.
    pub fn usage(&self) -> Usage {
        self.quantizer.usage()
    }

    /// Checks the shape against the format's rule; the error names the rule.
    pub fn validate(&self) -> Result<()> {
        self.shape.require_nonempty(self.quantizer.format_name())?;
        self.quantizer.check_shape(&self.shape)
    }

    /// The buffers a tensor of this prototype holds.
    pub fn buffers(&self) -> Result<Vec<BufferDesc>> {
        self.validate()?;
        self.quantizer.buffers(&self.shape)
    }

    /// Total bytes of all buffers.
    pub fn nbytes(&self) -> Result<usize> {
        self.buffers()?.iter().try_fold(0usize, |acc, b| {
            acc.checked_add(b.nbytes()?)
                .ok_or_else(|| Error::buffer(&b.name, "total size overflows usize"))
        })
    }

    /// Stored bits per logical value.
    pub fn bits_per_value(&self) -> Result<f64> {
        Ok(self.nbytes()? as f64 * 8.0 / self.shape.numel() as f64)
    }

    /// The same prototype with another usage.
    pub fn with_usage(&self, usage: Usage) -> Result<TensorProto> {
        usage.require_some()?;
        Ok(TensorProto {
            shape: self.shape.clone(),
            dtype: self.dtype,
            quantizer: Arc::from(self.quantizer.with_usage(usage)),
        })
    }

    /// A zero-filled storage, ready to be quantized into.
    pub fn allocate(&self) -> Result<Box<dyn Storage>> {
        self.validate()?;
        self.quantizer.allocate(&self.shape, self.dtype)
    }
}

fn quantizer_box<Q: Quantizer + ?Sized>(q: &Q) -> Box<dyn Quantizer> {
    q.clone_box()
}

impl PartialEq for TensorProto {
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape
            && self.dtype == other.dtype
            && self.quantizer.dyn_eq(&*other.quantizer)
    }
}

impl fmt::Debug for TensorProto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorProto")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("quantizer", &self.quantizer.spec())
            .field("usage", &self.usage())
            .finish()
    }
}
