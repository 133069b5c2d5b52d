//! CUDA execution (feature `cuda`): device memory, NVRTC-compiled kernels, and the
//! [`CudaFormat`] extension trait that format crates implement.
//!
//! ```text
//!  HostTensor --DeviceTensor::from_host--> DeviceTensor --quantize_device--> DeviceQuantized<F>
//!                                                                                 |  to_host()
//!  QuantizedTensor<F> <----------------------------------------------------------+  (same bytes)
//! ```
//!
//! * **No toolkit at build time.** cudarc loads `libcuda` and `libnvrtc` dynamically. Its
//!   loader panics on a missing library, so every entry point here first checks that the
//!   library is present ([`driver_available`], [`nvrtc_available`]) and returns
//!   [`Error::Cuda`](crate::Error::Cuda) otherwise.
//! * **Kernels** are `.cu` files embedded in the format crates ([`KernelSource`]) plus the
//!   shared headers of the top-level `kernels/` directory ([`HEADERS`], passed to NVRTC as
//!   named headers). [`CudaDevice::function`] compiles a source on first use, to a cubin for
//!   the device's exact `sm_XY`, and caches the module per context keyed by (source hash,
//!   options).
//! * **Exactness.** Kernels are compiled with `--fmad=false --ftz=false --prec-div=true
//!   --prec-sqrt=true` and mirror the CPU code's operation order, so every device kernel
//!   writes the bytes the CPU path writes (`docs/cuda.md` argues it kernel by kernel).
//!
//! This module is the one place in quant-core where `unsafe` is allowed (FFI and kernel
//! launches); every block says why it is sound.
//!
//! ```no_run
//! # #[cfg(feature = "cuda")] {
//! use quant_core::cuda::{CudaDevice, DeviceTensor};
//! use quant_core::HostTensor;
//! let dev = CudaDevice::shared(0)?;                   // Err(Error::Cuda) without a GPU
//! let x = HostTensor::f32(&[1.0, -2.0, 3.0, 4.0], &[2, 2])?;
//! let d = DeviceTensor::from_host(&dev, &x)?;
//! assert_eq!(d.to_host()?.to_f32_vec(), x.to_f32_vec());
//! # }
//! # Ok::<(), quant_core::Error>(())
//! ```

mod device;
mod format;
pub mod kernels;
#[cfg(feature = "nccl")]
mod nccl;
pub mod nvrtc;
mod source;
mod tensor;
pub mod testing;

pub use cudarc;
pub use device::{CudaDevice, device_count, driver_available};
pub use format::{
    CudaFormat, LaunchArgsExt, check_dense, check_device_buffers, dtype_suffix, grid_1d, launch_1d,
    quantize_device, quantize_device_reduced, u64_of,
};
#[cfg(feature = "nccl")]
pub use nccl::{NcclAmaxReducer, nccl_available, new_unique_id};
pub use nvrtc::{compile, nvrtc_available, nvrtc_version};
pub use source::{CORE_KERNELS, HEADERS, Header, KernelSource, SELFTEST_KERNELS};
pub use tensor::{
    DeviceBuffer, DeviceQuantized, DeviceTensor, device_buffer_by_name, device_buffers_by_name_mut,
};
