//! The per-format device extension trait and the generic device entry points.

use cudarc::driver::{CudaSlice, LaunchArgs, LaunchConfig, PushKernelArg};

use super::source::KernelSource;
use super::tensor::{DeviceBuffer, DeviceQuantized, DeviceTensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::Format;
use crate::parallel::AmaxReducer;
use crate::shape::Shape;
use crate::usage::Direction;

/// The device side of a [`Format`]: format crates implement it under their `cuda` feature,
/// next to the CPU kernels it must agree with byte for byte.
///
/// Contract (the same as [`Format::quantize_into`] / [`Format::dequantize_into`]):
/// `out` holds zero-filled device buffers of [`Format::buffers`] for `x.shape()`, in that
/// order; after the call they hold exactly the bytes the CPU path writes for the same input.
/// Work is queued on `x.device()`'s stream; errors are returned, never panics.
pub trait CudaFormat: Format {
    /// Every kernel source the format compiles (for compile checks and warm-up).
    fn kernel_sources() -> &'static [KernelSource];

    /// Quantizes `x` into `out`.
    fn quantize_device_into(&self, x: &DeviceTensor, out: &mut [DeviceBuffer]) -> Result<()>;

    /// Quantizes `x` with its tensor-wide amax reduced across ranks by `reducer` first (TE's
    /// `with_amax_reduction`). Formats without a tensor-wide amax ignore the reducer.
    fn quantize_device_reduced_into(
        &self,
        x: &DeviceTensor,
        reducer: &dyn AmaxReducer,
        out: &mut [DeviceBuffer],
    ) -> Result<()> {
        let _ = reducer;
        self.quantize_device_into(x, out)
    }

    /// Dequantizes the `dir` operand into `out` (the logical shape, row-major; its dtype
    /// chooses f32, bf16 or f16).
    fn dequantize_device_into(
        &self,
        shape: &Shape,
        bufs: &[DeviceBuffer],
        dir: Direction,
        out: &mut DeviceTensor,
    ) -> Result<()>;
}

fn check_input<F: CudaFormat>(format: &F, x: &DeviceTensor) -> Result<()> {
    x.shape().require_nonempty(F::NAME)?;
    format.check_shape(x.shape())
}

/// Quantizes a device tensor into a new device storage (one launch per kernel stage;
/// nothing is copied to the host).
pub fn quantize_device<F: CudaFormat>(format: &F, x: &DeviceTensor) -> Result<DeviceQuantized<F>> {
    check_input(format, x)?;
    let mut t = DeviceQuantized::allocate(x.device(), format.clone(), x.shape(), x.dtype())?;
    format.quantize_device_into(x, t.buffers_mut())?;
    Ok(t)
}

/// Quantizes a device tensor with the tensor-wide amax reduced across ranks (see
/// [`CudaFormat::quantize_device_reduced_into`]).
pub fn quantize_device_reduced<F: CudaFormat>(
    format: &F,
    x: &DeviceTensor,
    reducer: &dyn AmaxReducer,
) -> Result<DeviceQuantized<F>> {
    check_input(format, x)?;
    let mut t = DeviceQuantized::allocate(x.device(), format.clone(), x.shape(), x.dtype())?;
    format.quantize_device_reduced_into(x, reducer, t.buffers_mut())?;
    Ok(t)
}

impl<F: CudaFormat> DeviceQuantized<F> {
    /// Dequantizes the `dir` operand to a new device tensor of `dtype` (f32, bf16, f16).
    pub fn dequantize(&self, dir: Direction, dtype: DType) -> Result<DeviceTensor> {
        self.check_dir(dir)?;
        let mut out = DeviceTensor::zeros(self.device(), self.shape(), dtype)?;
        self.quantizer()
            .dequantize_device_into(self.shape(), self.buffers(), dir, &mut out)?;
        Ok(out)
    }

    /// Re-quantizes `x` into this storage's buffers (cleared first), without reallocating.
    pub fn quantize_from(&mut self, x: &DeviceTensor) -> Result<()> {
        if x.shape() != self.shape() {
            return Err(Error::invalid(
                "x",
                x.shape(),
                format!("must have the destination's shape {}", self.shape()),
            ));
        }
        let device = std::sync::Arc::clone(self.device());
        for b in self.buffers_mut() {
            device.stream().memset_zeros(b.data_mut())?;
        }
        let format = self.quantizer().clone();
        format.quantize_device_into(x, self.buffers_mut())
    }
}

/// Checks device buffers against `format`'s description for `shape` before a launch: every
/// buffer must be one of [`Format::buffers`] (name, dtype, shape) with exactly its byte size.
/// Kernels trust these sizes, so every `CudaFormat` entry point calls this first (the buffers
/// of a `DeviceQuantized` can be swapped through `buffers_mut`).
pub fn check_device_buffers<F: Format>(
    format: &F,
    shape: &Shape,
    bufs: &[DeviceBuffer],
) -> Result<()> {
    shape.require_nonempty(F::NAME)?;
    format.check_shape(shape)?;
    let want = format.buffers(shape)?;
    for b in bufs {
        let d = want.iter().find(|d| d.name == b.name()).ok_or_else(|| {
            Error::buffer(
                b.name(),
                format!("is not a buffer of {} for {shape}", format.spec()),
            )
        })?;
        let n = d.nbytes()?;
        if b.desc() != d || b.nbytes() != n {
            return Err(Error::buffer(
                b.name(),
                format!(
                    "is {} ({} bytes) but {} for {shape} needs {d} ({n} bytes)",
                    b.desc(),
                    b.nbytes(),
                    format.spec()
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that a dense device tensor holds `shape`'s element count (kernels index it as the
/// `[M, K]` view of `shape`).
pub fn check_dense(t: &DeviceTensor, shape: &Shape, what: &str) -> Result<()> {
    if t.shape().numel() != shape.numel() {
        return Err(Error::invalid(
            what,
            t.shape(),
            format!("must have the {} elements of {shape}", shape.numel()),
        ));
    }
    Ok(())
}

/// The kernel-name suffix of an input or output element type: `f32`, `bf16` or `f16`
/// (every templated kernel is instantiated once per type, `name_f32`, `name_bf16`, ...).
pub fn dtype_suffix(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        DType::F16 => Ok("f16"),
        other => Err(Error::invalid(
            "dtype",
            other,
            "device kernels take f32, bf16 or f16 tensors",
        )),
    }
}

/// A null device pointer argument (the kernels test optional outputs against 0).
static NULL_PTR: u64 = 0;

/// Optional buffer arguments for kernel launches: an absent buffer is passed as a null
/// pointer.
pub trait LaunchArgsExt<'a> {
    /// Pushes `s` or a null pointer.
    fn arg_opt(&mut self, s: Option<&'a CudaSlice<u8>>) -> &mut Self;
    /// Pushes `s` (writable) or a null pointer.
    fn arg_opt_mut(&mut self, s: Option<&'a mut CudaSlice<u8>>) -> &mut Self;
}

impl<'a> LaunchArgsExt<'a> for LaunchArgs<'a> {
    fn arg_opt(&mut self, s: Option<&'a CudaSlice<u8>>) -> &mut Self {
        match s {
            Some(s) => self.arg(s),
            None => self.arg(&NULL_PTR),
        }
    }
    fn arg_opt_mut(&mut self, s: Option<&'a mut CudaSlice<u8>>) -> &mut Self {
        match s {
            Some(s) => self.arg(s),
            None => self.arg(&NULL_PTR),
        }
    }
}

/// A 1-D grid of `blocks` blocks, capped at `cap` (kernels loop over the rest) and at
/// least 1.
pub fn grid_1d(blocks: u64, cap: u64) -> u32 {
    u32::try_from(blocks.clamp(1, cap.max(1))).unwrap_or(u32::MAX >> 1)
}

/// A 1-D launch of `blocks` blocks of `threads` threads (the kernel's
/// `__launch_bounds__`), the grid capped at 32 blocks per SM of a device with `sm_count`
/// SMs: the format kernels are grid-stride loops over the rest.
pub fn launch_1d(blocks: u64, threads: u32, sm_count: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid_1d(blocks, u64::from(sm_count) * 32), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `usize` -> `u64` for kernel arguments.
pub fn u64_of(n: usize) -> u64 {
    n as u64
}
