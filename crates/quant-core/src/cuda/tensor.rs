//! Device memory: high-precision tensors ([`DeviceTensor`]), named buffers
//! ([`DeviceBuffer`]) and quantized storages ([`DeviceQuantized`]).

use std::sync::Arc;

use cudarc::driver::CudaSlice;

use super::device::CudaDevice;
use crate::buffer::{Buffer, BufferDesc};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::{Format, QuantizedTensor};
use crate::shape::Shape;
use crate::tensor::HostTensor;
use crate::usage::{Direction, Usage};

/// A dense row-major f32/bf16/f16 tensor in device memory: what device quantizers read and
/// device dequantizers write (the device twin of [`HostTensor`]).
#[derive(Debug)]
pub struct DeviceTensor {
    device: Arc<CudaDevice>,
    shape: Shape,
    dtype: DType,
    data: CudaSlice<u8>,
}

fn check_float(dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::invalid(
            "dtype",
            dtype,
            "a high-precision tensor must be f32, bf16 or f16",
        ))
    }
}

fn nbytes_of(shape: &Shape, dtype: DType) -> Result<usize> {
    let n = shape
        .numel()
        .checked_mul(dtype.size())
        .ok_or_else(|| Error::invalid("shape", shape, "byte size overflows usize"))?;
    if n == 0 {
        return Err(Error::invalid(
            "shape",
            shape,
            "a device tensor must have at least one element",
        ));
    }
    Ok(n)
}

impl DeviceTensor {
    /// Copies a host tensor to `device`.
    pub fn from_host(device: &Arc<CudaDevice>, x: &HostTensor<'_>) -> Result<DeviceTensor> {
        nbytes_of(x.shape(), x.dtype())?;
        Ok(DeviceTensor {
            device: Arc::clone(device),
            shape: x.shape().clone(),
            dtype: x.dtype(),
            data: device.htod(x.as_bytes())?,
        })
    }

    /// A zero-filled tensor.
    pub fn zeros(device: &Arc<CudaDevice>, shape: &Shape, dtype: DType) -> Result<DeviceTensor> {
        check_float(dtype)?;
        let n = nbytes_of(shape, dtype)?;
        Ok(DeviceTensor {
            device: Arc::clone(device),
            shape: shape.clone(),
            dtype,
            data: device.alloc_zeros(n)?,
        })
    }

    /// Wraps device bytes holding a `dtype` tensor of `shape` (sizes checked).
    pub fn from_slice(
        device: &Arc<CudaDevice>,
        shape: &Shape,
        dtype: DType,
        data: CudaSlice<u8>,
    ) -> Result<DeviceTensor> {
        check_float(dtype)?;
        let n = nbytes_of(shape, dtype)?;
        if data.len() != n {
            return Err(Error::invalid(
                "device data",
                format!("{} bytes", data.len()),
                format!("{dtype} {shape} needs {n} bytes"),
            ));
        }
        Ok(DeviceTensor {
            device: Arc::clone(device),
            shape: shape.clone(),
            dtype,
            data,
        })
    }

    /// Copies the tensor back to the host.
    pub fn to_host(&self) -> Result<HostTensor<'static>> {
        let bytes = self.device.dtoh(&self.data)?;
        Ok(HostTensor::from_le_bytes(self.dtype, &bytes, self.shape.dims())?.into_owned())
    }

    /// The device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }
    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// The element dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The device bytes.
    pub fn data(&self) -> &CudaSlice<u8> {
        &self.data
    }
    /// The device bytes, writable.
    pub fn data_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.data
    }
}

/// One named buffer of a quantized tensor, in device memory.
#[derive(Debug)]
pub struct DeviceBuffer {
    desc: BufferDesc,
    data: CudaSlice<u8>,
}

impl DeviceBuffer {
    /// A zero-filled buffer (padding regions stay zero, as on the host).
    pub fn zeroed(device: &CudaDevice, desc: BufferDesc) -> Result<DeviceBuffer> {
        let n = desc.nbytes()?;
        Ok(DeviceBuffer {
            data: device.alloc_zeros(n).map_err(|e| {
                Error::buffer(
                    &desc.name,
                    format!("cannot be allocated on the device: {e}"),
                )
            })?,
            desc,
        })
    }

    /// A device copy of a host buffer.
    pub fn from_host(device: &CudaDevice, b: &Buffer) -> Result<DeviceBuffer> {
        Ok(DeviceBuffer {
            desc: b.desc().clone(),
            data: device.htod(b.bytes())?,
        })
    }

    /// The bytes back on the host.
    pub fn to_host(&self, device: &CudaDevice) -> Result<Buffer> {
        Buffer::from_bytes(self.desc.clone(), &device.dtoh(&self.data)?)
    }

    /// The description.
    pub fn desc(&self) -> &BufferDesc {
        &self.desc
    }
    /// The name.
    pub fn name(&self) -> &str {
        &self.desc.name
    }
    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.data.len()
    }
    /// The device bytes.
    pub fn data(&self) -> &CudaSlice<u8> {
        &self.data
    }
    /// The device bytes, writable.
    pub fn data_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.data
    }
}

/// Finds device buffers by name, returning mutable references in the order of `names`
/// (`None` for names not present); the device twin of
/// [`crate::format::buffers_by_name_mut`].
pub fn device_buffers_by_name_mut<'a, const N: usize>(
    bufs: &'a mut [DeviceBuffer],
    names: [&str; N],
) -> [Option<&'a mut DeviceBuffer>; N] {
    let mut out: [Option<&'a mut DeviceBuffer>; N] = std::array::from_fn(|_| None);
    for b in bufs.iter_mut() {
        if let Some(i) = names.iter().position(|n| *n == b.name()) {
            out[i] = Some(b);
        }
    }
    out
}

/// Finds a device buffer by name, or an error naming it.
pub fn device_buffer_by_name<'a>(bufs: &'a [DeviceBuffer], name: &str) -> Result<&'a DeviceBuffer> {
    bufs.iter()
        .find(|b| b.name() == name)
        .ok_or_else(|| Error::buffer(name, "is missing from the device storage"))
}

/// A quantized tensor whose buffers live in device memory: the device twin of
/// [`QuantizedTensor`], with the same buffers (names, dtypes, shapes, bytes).
#[derive(Debug)]
pub struct DeviceQuantized<F: Format> {
    device: Arc<CudaDevice>,
    format: F,
    shape: Shape,
    dtype: DType,
    buffers: Vec<DeviceBuffer>,
}

impl<F: Format> DeviceQuantized<F> {
    /// Zero-filled device buffers for a tensor of `shape` quantized from `dtype`.
    pub fn allocate(
        device: &Arc<CudaDevice>,
        format: F,
        shape: &Shape,
        dtype: DType,
    ) -> Result<Self> {
        check_float(dtype)?;
        shape.require_nonempty(F::NAME)?;
        format.validate_options()?;
        format.check_shape(shape)?;
        let buffers = format
            .buffers(shape)?
            .into_iter()
            .map(|d| DeviceBuffer::zeroed(device, d))
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceQuantized {
            device: Arc::clone(device),
            format,
            shape: shape.clone(),
            dtype,
            buffers,
        })
    }

    /// Copies a host storage to the device.
    pub fn from_host(device: &Arc<CudaDevice>, t: &QuantizedTensor<F>) -> Result<Self> {
        let buffers = t
            .buffers()
            .iter()
            .map(|b| DeviceBuffer::from_host(device, b))
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceQuantized {
            device: Arc::clone(device),
            format: t.quantizer().clone(),
            shape: t.shape().clone(),
            dtype: t.dtype(),
            buffers,
        })
    }

    /// Copies the buffers to the host and rebuilds the storage (every buffer checked
    /// against the format's description, as for a file).
    pub fn to_host(&self) -> Result<QuantizedTensor<F>> {
        let bufs = self
            .buffers
            .iter()
            .map(|b| b.to_host(&self.device))
            .collect::<Result<Vec<_>>>()?;
        QuantizedTensor::from_buffers(self.format.clone(), &self.shape, self.dtype, bufs)
    }

    /// The device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }
    /// The quantizer that made it.
    pub fn quantizer(&self) -> &F {
        &self.format
    }
    /// The logical shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// The high-precision dtype it was quantized from.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The stored directions.
    pub fn usage(&self) -> Usage {
        self.format.usage()
    }
    /// The buffers, in the format's order.
    pub fn buffers(&self) -> &[DeviceBuffer] {
        &self.buffers
    }
    /// One buffer by name.
    pub fn buffer(&self, name: &str) -> Result<&DeviceBuffer> {
        device_buffer_by_name(&self.buffers, name)
    }
    /// Total bytes of all buffers.
    pub fn nbytes(&self) -> usize {
        self.buffers.iter().map(DeviceBuffer::nbytes).sum()
    }

    /// The buffers, writable (their bytes; descriptions cannot change). Format kernels
    /// write through this.
    pub fn buffers_mut(&mut self) -> &mut [DeviceBuffer] {
        &mut self.buffers
    }

    pub(crate) fn check_dir(&self, dir: Direction) -> Result<()> {
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
}
