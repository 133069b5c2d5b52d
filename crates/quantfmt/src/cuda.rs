//! CUDA execution (feature `cuda`): quantize and dequantize in device memory with NVRTC
//! kernels that produce the CPU path's bytes. Everything of [`quant_core::cuda`] is here,
//! plus the list of every kernel source this build ships.
//!
//! ```no_run
//! use quantfmt::cuda::{CudaDevice, DeviceTensor, quantize_device};
//! use quantfmt::{Fp8BlockQuantizer, BlockScaling, HostTensor, Usage};
//! let dev = CudaDevice::shared(0)?;                       // an error, not a panic, without a GPU
//! let w: Vec<f32> = (0..256 * 512).map(|i| (i % 251) as f32 / 25.0).collect();
//! let x = DeviceTensor::from_host(&dev, &HostTensor::f32(&w, &[256, 512])?)?;
//! let q = Fp8BlockQuantizer::new(BlockScaling::TwoD, Usage::BOTH);
//! let on_gpu = quantize_device(&q, &x)?;                  // device buffers, TE's layout
//! let on_cpu = q.quantize(&HostTensor::f32(&w, &[256, 512])?)?;
//! let back = on_gpu.to_host()?;
//! for (a, b) in back.buffers().iter().zip(on_cpu.buffers()) {
//!     assert_eq!(a.bytes(), b.bytes());                   // the same bytes
//! }
//! # Ok::<(), quantfmt::Error>(())
//! ```

pub use quant_core::cuda::*;

/// Every kernel source of every format this build ships, quant-core's own first (each
/// once): what CI compiles for every architecture, and what [`warm_up`] loads.
pub fn all_kernel_sources() -> Vec<KernelSource> {
    let mut v = vec![CORE_KERNELS, SELFTEST_KERNELS];
    for s in [
        fmt_fp8::cuda::KERNELS,
        fmt_mxfp8::cuda::KERNELS,
        fmt_nvfp4::cuda::KERNELS,
        fmt_int4tiled::cuda::KERNELS,
    ] {
        if !v.iter().any(|k| k.name == s.name) {
            v.push(s);
        }
    }
    v
}

/// Compiles and loads every kernel on `device` now (NVRTC takes seconds per source), so the
/// first quantization does not pay for it.
pub fn warm_up(device: &CudaDevice) -> crate::Result<()> {
    for s in all_kernel_sources() {
        device.module(&s)?;
    }
    Ok(())
}
