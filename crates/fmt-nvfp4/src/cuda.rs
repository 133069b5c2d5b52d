//! Device kernels (feature `cuda`): [`CudaFormat`] for [`Nvfp4Quantizer`], producing the
//! bytes of the CPU path for every option (1-D, `2d`, `rht`, `sr` + `seed`, `row-scaled`,
//! `4over6`, `e4m3max=256`, `swizzled`).
//!
//! | stage | kernel | launches |
//! |---|---|---|
//! | global amax | `qf_amax_T` (tensor), `qf_row_amax_T` / `qf_col_amax_T` (row-scaled), `nvfp4_rht_amax_T` (amax of `bf16(RHT(x^T))`) | 1 per direction that needs one (the non-RHT columnwise amax is a 4-byte copy of the rowwise one) |
//! | quantize | `nvfp4_quant_T`: 16 operand rows x 16 blocks per thread block, one 16-element block per thread; the columnwise operand `x^T` (rotated with `rht`) is read straight from `x`, never materialised | 1 per direction |
//! | dequantize | `nvfp4_dequant_row_T`, `nvfp4_dequant_col_T` (inverse RHT in f64) | 1 |
//!
//! Stochastic rounding draws the **same** Philox4x32-10 bits as the CPU (`crate::sr`): the
//! counter is `(block, row, row >> 32, direction)` and the key the seed, so each block's
//! bits depend only on its position, not on the thread mapping, and the device bytes equal
//! the CPU bytes for a given seed.

use quant_core::cuda::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use quant_core::cuda::{
    CudaFormat, DeviceBuffer, DeviceQuantized, DeviceTensor, KernelSource, check_dense,
    check_device_buffers, device_buffer_by_name, device_buffers_by_name_mut, dtype_suffix, kernels,
};
use quant_core::parallel::AmaxReducer;
use quant_core::{DType, Direction, Error, Format, Result, Shape};

use crate::{FourOverSix, Nvfp4Quantizer, sr};

/// The NVFP4 kernels.
pub static KERNELS: KernelSource = KernelSource {
    name: "fmt-nvfp4/kernels/nvfp4.cu",
    source: include_str!("../kernels/nvfp4.cu"),
    entry_points: &[
        "nvfp4_quant_f32",
        "nvfp4_quant_bf16",
        "nvfp4_quant_f16",
        "nvfp4_rht_amax_f32",
        "nvfp4_rht_amax_bf16",
        "nvfp4_rht_amax_f16",
        "nvfp4_dequant_row_f32",
        "nvfp4_dequant_row_bf16",
        "nvfp4_dequant_row_f16",
        "nvfp4_dequant_col_f32",
        "nvfp4_dequant_col_bf16",
        "nvfp4_dequant_col_f16",
    ],
};

static SOURCES: [KernelSource; 2] = [quant_core::cuda::CORE_KERNELS, KERNELS];

const THREADS: u32 = 256;

/// A launch of this crate's kernels (`THREADS` = their `__launch_bounds__`).
fn cfg(blocks: u64, sm: u32) -> LaunchConfig {
    quant_core::cuda::launch_1d(blocks, THREADS, sm)
}

fn missing(n: &str) -> Error {
    Error::buffer(n, "is missing from the device storage")
}

/// The buffers of one direction: data, scales, amax.
type Dir<'a> = (
    &'a mut DeviceBuffer,
    &'a mut DeviceBuffer,
    &'a mut DeviceBuffer,
);

impl Nvfp4Quantizer {
    /// Quantizes a device tensor with given global amaxes (e.g. after an all-reduce MAX
    /// across ranks): the device twin of [`Nvfp4Quantizer::quantize_with_amax`], refused
    /// for row-scaled quantizers in the same way.
    pub fn quantize_device_with_amax(
        &self,
        x: &DeviceTensor,
        amax_rowwise: f32,
        amax_columnwise: f32,
    ) -> Result<DeviceQuantized<Self>> {
        if self.row_scaled() {
            return Err(Error::unsupported(
                <Self as Format>::NAME,
                "row-scaled quantization with a given amax (amax reduction)",
                "TransformerEngine refuses quantize_with_amax and amax reduction for row-scaled NVFP4: each row has its own amax",
            ));
        }
        x.shape().require_nonempty(<Self as Format>::NAME)?;
        self.check_shape(x.shape())?;
        let mut t = DeviceQuantized::allocate(x.device(), self.clone(), x.shape(), x.dtype())?;
        self.cast_device(x, Some((amax_rowwise, amax_columnwise)), t.buffers_mut())?;
        Ok(t)
    }

    /// Quantizer::cast on the device: amax passes, then one quantize launch per direction.
    fn cast_device(
        &self,
        x: &DeviceTensor,
        amax: Option<(f32, f32)>,
        out: &mut [DeviceBuffer],
    ) -> Result<()> {
        if self.rht() && x.dtype() != DType::BF16 {
            return Err(Error::unsupported(
                <Self as Format>::NAME,
                format!("rht with {} input", x.dtype()),
                "TransformerEngine's Hadamard kernels take bf16 input only; convert first (HostTensor::to_dtype(DType::BF16)) to get TE's exact bytes",
            ));
        }
        self.validate()?;
        check_device_buffers(self, x.shape(), out)?;
        let dev = x.device();
        let (m, k) = x.shape().as_2d();
        let (ss_r, ss_c) = self.scale_shapes(m, k);
        let [rd, rs, ra, cd, cs, ca] = device_buffers_by_name_mut(
            out,
            [
                "rowwise_data",
                "rowwise_scale_inv",
                "amax_rowwise",
                "columnwise_data",
                "columnwise_scale_inv",
                "amax_columnwise",
            ],
        );
        let usage = self.usage();
        let row: Option<Dir<'_>> = if usage.rowwise {
            Some((
                rd.ok_or_else(|| missing("rowwise_data"))?,
                rs.ok_or_else(|| missing("rowwise_scale_inv"))?,
                ra.ok_or_else(|| missing("amax_rowwise"))?,
            ))
        } else {
            None
        };
        let col: Option<Dir<'_>> = if usage.columnwise {
            Some((
                cd.ok_or_else(|| missing("columnwise_data"))?,
                cs.ok_or_else(|| missing("columnwise_scale_inv"))?,
                ca.ok_or_else(|| missing("amax_columnwise"))?,
            ))
        } else {
            None
        };
        let mut shared: Option<&CudaSlice<u8>> = None;
        if let Some((d, s, a)) = row {
            if self.row_scaled() {
                kernels::row_amax(x, m, k, a.data_mut())?;
            } else if let Some((r, _)) = amax {
                dev.htod_into(&r.to_le_bytes(), a.data_mut())?;
            } else {
                kernels::tensor_amax(x, a.data_mut())?;
            }
            self.launch_quant(x, 0, a.data(), d.data_mut(), s.data_mut(), ss_r[1])?;
            if !self.row_scaled() {
                shared = Some(a.data());
            }
        }
        if let Some((d, s, a)) = col {
            if self.rht() {
                match amax {
                    Some((_, c)) => dev.htod_into(&c.to_le_bytes(), a.data_mut())?,
                    None => self.rht_amax(x, a.data_mut())?,
                }
            } else if self.row_scaled() {
                kernels::col_amax(x, m, k, a.data_mut())?;
            } else if let Some((_, c)) = amax {
                dev.htod_into(&c.to_le_bytes(), a.data_mut())?;
            } else if let Some(src) = shared {
                // Without RHT both directions share the tensor amax (TE copies one into both).
                dev.dtod(src, a.data_mut())?;
            } else {
                kernels::tensor_amax(x, a.data_mut())?;
            }
            self.launch_quant(x, 1, a.data(), d.data_mut(), s.data_mut(), ss_c[1])?;
        }
        Ok(())
    }

    fn rht_amax(&self, x: &DeviceTensor, out: &mut CudaSlice<u8>) -> Result<()> {
        let dev = x.device();
        let (m, k) = x.shape().as_2d();
        let f = dev.function(
            &KERNELS,
            &format!("nvfp4_rht_amax_{}", dtype_suffix(x.dtype())?),
        )?;
        let (mm, kk) = (m as u64, k as u64);
        let work = kk * (mm / 16);
        let mut b = dev.stream().launch_builder(&f);
        b.arg(x.data()).arg(&mm).arg(&kk).arg(out);
        // SAFETY: nvfp4_rht_amax_T(const T* x, u64 m, u64 k, u32* out): x holds m*k elements
        // (m % 16 == 0 by check_shape), out is the 4-byte amax_columnwise buffer.
        unsafe { b.launch(cfg(work.div_ceil(u64::from(THREADS)), dev.sm_count())) }?;
        Ok(())
    }

    fn launch_quant(
        &self,
        x: &DeviceTensor,
        dir: i32,
        amax: &CudaSlice<u8>,
        data: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<u8>,
        stride: usize,
    ) -> Result<()> {
        let dev = x.device();
        let (m, k) = x.shape().as_2d();
        let (rows, cols) = if dir == 0 { (m, k) } else { (k, m) };
        if data.len() != rows * cols / 2 || scales.len() < rows * stride {
            return Err(Error::buffer(
                if dir == 0 {
                    "rowwise_data"
                } else {
                    "columnwise_data"
                },
                "or its scales do not match the shape",
            ));
        }
        let f = dev.function(
            &KERNELS,
            &format!("nvfp4_quant_{}", dtype_suffix(x.dtype())?),
        )?;
        let (mm, kk) = (m as u64, k as u64);
        let rht = i32::from(dir == 1 && self.rht());
        let per_row = i32::from(self.row_scaled());
        let two_d = i32::from(self.is_2d());
        let e4m3_max = i32::from(self.e4m3_max());
        let fos = match self.four_over_six() {
            None => 0i32,
            Some(FourOverSix::Mae) => 1,
            Some(FourOverSix::Mse) => 2,
        };
        let sr_on = i32::from(self.stochastic_rounding().is_some());
        let seed = self.stochastic_rounding().unwrap_or(0);
        let dir_tag = if dir == 0 {
            sr::DIR_ROWWISE
        } else {
            sr::DIR_COLUMNWISE
        } as i32;
        let swz = i32::from(self.swizzled());
        let st = stride as u64;
        let groups = (rows / 16) as u64 * (cols / 16).div_ceil(16) as u64;
        let mut b = dev.stream().launch_builder(&f);
        b.arg(x.data())
            .arg(&mm)
            .arg(&kk)
            .arg(&dir_tag)
            .arg(&rht)
            .arg(amax)
            .arg(&per_row)
            .arg(&two_d)
            .arg(&e4m3_max)
            .arg(&fos)
            .arg(&sr_on)
            .arg(&seed)
            .arg(&swz)
            .arg(data)
            .arg(scales)
            .arg(&st);
        // SAFETY: nvfp4_quant_T(const T* x, u64 m, u64 k, int dir, int rht, const float* amax,
        // int per_row, int two_d, int e4m3_max, int fos, int sr, u64 seed, int swz, u8* data,
        // u8* scales, u64 stride): x holds m*k elements (m, k multiples of 16), data holds
        // rows*cols/2 bytes and scales the padded [>= rows, stride] matrix (checked above);
        // amax holds one f32, or one per operand row when per_row.
        unsafe { b.launch(cfg(groups, dev.sm_count())) }?;
        Ok(())
    }
}

impl CudaFormat for Nvfp4Quantizer {
    fn kernel_sources() -> &'static [KernelSource] {
        &SOURCES
    }

    fn quantize_device_into(&self, x: &DeviceTensor, out: &mut [DeviceBuffer]) -> Result<()> {
        self.check_shape(x.shape())?;
        self.cast_device(x, None, out)
    }

    /// Mirrors `quantize_reduced`: the rowwise (tensor) amax and, with RHT, the amax of the
    /// rotated operand are reduced across ranks (through the host), then used for both
    /// directions. Row-scaled tensors need no reduction rowwise and refuse columnwise.
    fn quantize_device_reduced_into(
        &self,
        x: &DeviceTensor,
        reducer: &dyn AmaxReducer,
        out: &mut [DeviceBuffer],
    ) -> Result<()> {
        self.check_shape(x.shape())?;
        if self.row_scaled() {
            if self.usage().columnwise {
                return Err(Error::unsupported(
                    <Self as Format>::NAME,
                    "amax reduction for a row-scaled tensor with columnwise usage",
                    "the columnwise operand's per-column amaxes span every rank; TransformerEngine refuses amax reduction with row-scaled NVFP4",
                ));
            }
            return self.cast_device(x, None, out);
        }
        let dev = x.device();
        let read = |buf: &CudaSlice<u8>| -> Result<f32> {
            let bytes = dev.dtoh(buf)?;
            let b: [u8; 4] = bytes
                .get(..4)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| Error::Cuda("amax readback was short".to_string()))?;
            Ok(f32::from_le_bytes(b))
        };
        let mut lo = dev.alloc_zeros(4)?;
        kernels::tensor_amax(x, &mut lo)?;
        let row = read(&lo)?;
        let col = if self.rht() && self.usage().columnwise && x.dtype() == DType::BF16 {
            let mut hi = dev.alloc_zeros(4)?;
            self.rht_amax(x, &mut hi)?;
            read(&hi)?
        } else {
            row
        };
        let mut v = [row, col];
        reducer.all_reduce_max(&mut v)?;
        self.cast_device(x, Some((v[0], v[1])), out)
    }

    fn dequantize_device_into(
        &self,
        shape: &Shape,
        bufs: &[DeviceBuffer],
        dir: Direction,
        out: &mut DeviceTensor,
    ) -> Result<()> {
        check_device_buffers(self, shape, bufs)?;
        check_dense(out, shape, "out")?;
        let (m, k) = shape.as_2d();
        let (ss_r, ss_c) = self.scale_shapes(m, k);
        let (data, scales, amax, stride, kernel) = match dir {
            Direction::Rowwise => (
                "rowwise_data",
                "rowwise_scale_inv",
                "amax_rowwise",
                ss_r,
                "nvfp4_dequant_row",
            ),
            Direction::Columnwise => (
                "columnwise_data",
                "columnwise_scale_inv",
                "amax_columnwise",
                ss_c,
                "nvfp4_dequant_col",
            ),
        };
        let q = device_buffer_by_name(bufs, data)?;
        let s = device_buffer_by_name(bufs, scales)?;
        let a = device_buffer_by_name(bufs, amax)?;
        let per_row_len = match dir {
            Direction::Rowwise => m,
            Direction::Columnwise => k,
        };
        let want_amax = if self.row_scaled() { per_row_len } else { 1 } * 4;
        if q.nbytes() != m * k / 2 || s.nbytes() != stride[0] * stride[1] || a.nbytes() != want_amax
        {
            return Err(Error::buffer(
                data,
                "or its scales or amax do not match the shape",
            ));
        }
        let dev = std::sync::Arc::clone(out.device());
        let f = dev.function(
            &KERNELS,
            &format!("{kernel}_{}", dtype_suffix(out.dtype())?),
        )?;
        let (mm, kk, st) = (m as u64, k as u64, stride[1] as u64);
        let swz = i32::from(self.swizzled());
        let per_row = i32::from(self.row_scaled());
        let e4m3_max = i32::from(self.e4m3_max());
        let rht = i32::from(self.rht());
        let mut b = dev.stream().launch_builder(&f);
        b.arg(q.data())
            .arg(&mm)
            .arg(&kk)
            .arg(s.data())
            .arg(&st)
            .arg(&swz)
            .arg(a.data())
            .arg(&per_row)
            .arg(&e4m3_max);
        let work = match dir {
            Direction::Rowwise => (m * k / 2) as u64,
            Direction::Columnwise => {
                b.arg(&rht);
                (k * (m / 16)) as u64
            }
        };
        b.arg(out.data_mut());
        // SAFETY: nvfp4_dequant_row_OT(const u8* q, u64 m, u64 k, const u8* scales, u64 stride,
        // int swz, const float* amax, int per_row, int e4m3_max, OT* out) and
        // nvfp4_dequant_col_OT(..., int e4m3_max, int rht, OT* out): q holds m*k/2 bytes, the
        // scales the padded matrix of scale_shapes, amax 1 or one per stored row (all checked
        // above), out m*k elements of the kernel's output type.
        unsafe { b.launch(cfg(work.div_ceil(u64::from(THREADS)), dev.sm_count())) }?;
        Ok(())
    }
}
