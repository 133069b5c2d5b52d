//! High-precision host tensors: what quantizers read and dequantizers write.

use std::borrow::Cow;

use half::{bf16, f16};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::shape::Shape;

/// The elements of a [`HostTensor`], borrowed or owned.
#[derive(Clone, Debug)]
pub enum HostData<'a> {
    /// f32 elements.
    F32(Cow<'a, [f32]>),
    /// bf16 elements.
    BF16(Cow<'a, [bf16]>),
    /// f16 elements.
    F16(Cow<'a, [f16]>),
}

/// Caller-provided output memory of a float dtype: where
/// [`Storage::dequantize_into`](crate::Storage::dequantize_into) writes without allocating.
///
/// ```
/// use quant_core::{DType, HostDataMut};
/// let mut out = vec![half::bf16::ZERO; 8];
/// let view = HostDataMut::from(&mut out[..]);
/// assert_eq!((view.dtype(), view.len()), (DType::BF16, 8));
/// ```
#[derive(Debug)]
pub enum HostDataMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// bf16 elements.
    BF16(&'a mut [bf16]),
    /// f16 elements.
    F16(&'a mut [f16]),
}

impl HostDataMut<'_> {
    /// The element dtype.
    pub fn dtype(&self) -> DType {
        match self {
            HostDataMut::F32(_) => DType::F32,
            HostDataMut::BF16(_) => DType::BF16,
            HostDataMut::F16(_) => DType::F16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostDataMut::F32(d) => d.len(),
            HostDataMut::BF16(d) => d.len(),
            HostDataMut::F16(d) => d.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a, T: Element> From<&'a mut [T]> for HostDataMut<'a> {
    fn from(data: &'a mut [T]) -> Self {
        // The dtype tag names T exactly; the casts are between identical types.
        match T::DTYPE {
            DType::F32 => HostDataMut::F32(bytemuck::cast_slice_mut(data)),
            DType::BF16 => HostDataMut::BF16(bytemuck::cast_slice_mut(data)),
            _ => HostDataMut::F16(bytemuck::cast_slice_mut(data)),
        }
    }
}

/// A dense row-major f32/bf16/f16 tensor on the host, usually borrowed (no copy).
///
/// ```
/// use quant_core::{HostTensor, DType};
/// let w = vec![0.5f32; 6];
/// let t = HostTensor::f32(&w, &[2, 3]).unwrap();
/// assert_eq!(t.dtype(), DType::F32);
/// assert_eq!(t.shape().as_2d(), (2, 3));
/// assert!(HostTensor::f32(&w, &[4, 4]).is_err()); // 16 elements wanted, 6 given
/// ```
#[derive(Clone, Debug)]
pub struct HostTensor<'a> {
    shape: Shape,
    data: HostData<'a>,
}

/// Runs `$body` with `$data` bound to the tensor's elements as `&[T]` for its element
/// type `T` (f32, bf16 or f16): one monomorphized copy of the body per input dtype.
///
/// ```
/// use quant_core::{dispatch_elements, Element, HostTensor};
/// fn amax<T: Element>(xs: &[T]) -> f32 { xs.iter().fold(0.0, |m, v| m.max(v.to_f32().abs())) }
/// let t = HostTensor::f32(&[1.0, -3.0], &[2]).unwrap();
/// assert_eq!(dispatch_elements!(t, |xs| amax(xs)), 3.0);
/// ```
#[macro_export]
macro_rules! dispatch_elements {
    ($tensor:expr, |$data:ident| $body:expr) => {
        match $tensor.data() {
            $crate::HostData::F32(__d) => {
                let $data: &[f32] = __d;
                $body
            }
            $crate::HostData::BF16(__d) => {
                let $data: &[$crate::half::bf16] = __d;
                $body
            }
            $crate::HostData::F16(__d) => {
                let $data: &[$crate::half::f16] = __d;
                $body
            }
        }
    };
}

fn check_len(len: usize, shape: &Shape) -> Result<()> {
    if len != shape.numel() {
        return Err(Error::invalid(
            "data",
            format!("{len} elements"),
            format!("shape {shape} needs {} elements", shape.numel()),
        ));
    }
    Ok(())
}

impl<'a> HostTensor<'a> {
    /// Borrows f32 data as a tensor of `shape`.
    pub fn f32(data: &'a [f32], shape: &[usize]) -> Result<Self> {
        Self::from_cow(HostData::F32(Cow::Borrowed(data)), shape)
    }

    /// Borrows bf16 data as a tensor of `shape`.
    pub fn bf16(data: &'a [bf16], shape: &[usize]) -> Result<Self> {
        Self::from_cow(HostData::BF16(Cow::Borrowed(data)), shape)
    }

    /// Borrows f16 data as a tensor of `shape`.
    pub fn f16(data: &'a [f16], shape: &[usize]) -> Result<Self> {
        Self::from_cow(HostData::F16(Cow::Borrowed(data)), shape)
    }

    /// Borrows a typed slice as a tensor.
    pub fn from_slice<T: Element>(data: &'a [T], shape: &[usize]) -> Result<Self> {
        let bytes: &'a [u8] = bytemuck::cast_slice(data);
        Self::from_le_bytes(T::DTYPE, bytes, shape)
    }

    /// A tensor over little-endian bytes of a float dtype: borrowed when aligned, copied
    /// otherwise (memory-mapped safetensors data need not be aligned).
    pub fn from_le_bytes(dtype: DType, bytes: &'a [u8], shape: &[usize]) -> Result<Self> {
        let shape = Shape::new(shape)?;
        let want = shape
            .numel()
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::invalid("shape", &shape, "byte size overflows usize"))?;
        if bytes.len() != want {
            return Err(Error::invalid(
                "data",
                format!("{} bytes", bytes.len()),
                format!("{dtype} {shape} needs {want} bytes"),
            ));
        }
        fn cow<'b, T: bytemuck::Pod>(b: &'b [u8]) -> Cow<'b, [T]> {
            match bytemuck::try_cast_slice(b) {
                Ok(s) => Cow::Borrowed(s),
                Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(b)),
            }
        }
        let data = match dtype {
            DType::F32 => HostData::F32(cow(bytes)),
            DType::BF16 => HostData::BF16(cow(bytes)),
            DType::F16 => HostData::F16(cow(bytes)),
            other => {
                return Err(Error::invalid(
                    "dtype",
                    other,
                    "a high-precision tensor must be f32, bf16 or f16",
                ));
            }
        };
        Ok(HostTensor { shape, data })
    }

    fn from_cow(data: HostData<'a>, shape: &[usize]) -> Result<Self> {
        let shape = Shape::new(shape)?;
        let len = match &data {
            HostData::F32(d) => d.len(),
            HostData::BF16(d) => d.len(),
            HostData::F16(d) => d.len(),
        };
        check_len(len, &shape)?;
        Ok(HostTensor { shape, data })
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The element dtype.
    pub fn dtype(&self) -> DType {
        match self.data {
            HostData::F32(_) => DType::F32,
            HostData::BF16(_) => DType::BF16,
            HostData::F16(_) => DType::F16,
        }
    }

    /// The elements.
    pub fn data(&self) -> &HostData<'a> {
        &self.data
    }

    /// The elements as little-endian bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.data {
            HostData::F32(d) => bytemuck::cast_slice(d),
            HostData::BF16(d) => bytemuck::cast_slice(d),
            HostData::F16(d) => bytemuck::cast_slice(d),
        }
    }

    /// The elements widened to f32 (exact).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        dispatch_elements!(self, |xs| xs.iter().map(|v| v.to_f32()).collect())
    }

    /// The elements as `T`: exact when widening, round-to-nearest-even when narrowing.
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        dispatch_elements!(self, |xs| xs
            .iter()
            .map(|v| T::from_f32(v.to_f32()))
            .collect())
    }

    /// The same values converted to `dtype` (round-to-nearest-even when narrowing).
    pub fn to_dtype(&self, dtype: DType) -> Result<HostTensor<'static>> {
        let data = match dtype {
            DType::F32 => HostData::F32(Cow::Owned(self.to_vec::<f32>())),
            DType::BF16 => HostData::BF16(Cow::Owned(self.to_vec::<bf16>())),
            DType::F16 => HostData::F16(Cow::Owned(self.to_vec::<f16>())),
            other => {
                return Err(Error::invalid(
                    "dtype",
                    other,
                    "a high-precision tensor must be f32, bf16 or f16",
                ));
            }
        };
        Ok(HostTensor {
            shape: self.shape.clone(),
            data,
        })
    }

    /// Detaches from borrowed data.
    pub fn into_owned(self) -> HostTensor<'static> {
        let data = match self.data {
            HostData::F32(d) => HostData::F32(Cow::Owned(d.into_owned())),
            HostData::BF16(d) => HostData::BF16(Cow::Owned(d.into_owned())),
            HostData::F16(d) => HostData::F16(Cow::Owned(d.into_owned())),
        };
        HostTensor {
            shape: self.shape,
            data,
        }
    }

    /// Number of NaN and infinite elements (the CLI reports them).
    pub fn count_non_finite(&self) -> usize {
        dispatch_elements!(self, |xs| xs
            .iter()
            .filter(|v| !v.to_f32().is_finite())
            .count())
    }
}

impl HostTensor<'static> {
    /// Takes ownership of a typed vector as a tensor.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Self> {
        let shape = Shape::new(shape)?;
        check_len(data.len(), &shape)?;
        // Route through the dtype tag so the variant matches T exactly.
        let data = match T::DTYPE {
            DType::F32 => HostData::F32(Cow::Owned(bytemuck::allocation::cast_vec(data))),
            DType::BF16 => HostData::BF16(Cow::Owned(bytemuck::allocation::cast_vec(data))),
            _ => HostData::F16(Cow::Owned(bytemuck::allocation::cast_vec(data))),
        };
        Ok(HostTensor { shape, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unaligned_bytes_are_copied() {
        let raw: Vec<u8> = (0..9).collect();
        let t = HostTensor::from_le_bytes(DType::BF16, &raw[1..9], &[4]).unwrap();
        assert_eq!(t.as_bytes(), &raw[1..9]);
        assert!(HostTensor::from_le_bytes(DType::U8, &raw, &[9]).is_err());
        assert!(HostTensor::from_le_bytes(DType::F32, &raw[..8], &[3]).is_err());
    }

    #[test]
    fn from_vec_and_convert() {
        let t = HostTensor::from_vec(vec![bf16::from_f32(1.5); 4], &[2, 2]).unwrap();
        assert_eq!(t.dtype(), DType::BF16);
        assert_eq!(t.to_f32_vec(), vec![1.5; 4]);
        let h = t.to_dtype(DType::F16).unwrap();
        assert_eq!(h.dtype(), DType::F16);
        assert!(HostTensor::from_vec(vec![0f32; 3], &[2, 2]).is_err());
    }

    #[test]
    fn counts_non_finite() {
        let t = HostTensor::f32(&[1.0, f32::NAN, f32::INFINITY, -0.0], &[4]).unwrap();
        assert_eq!(t.count_non_finite(), 2);
    }
}
