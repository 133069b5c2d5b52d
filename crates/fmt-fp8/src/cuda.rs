//! Device kernels (feature `cuda`): [`CudaFormat`] for [`Fp8Quantizer`] and
//! [`Fp8BlockQuantizer`], producing the bytes of the CPU path.
//!
//! | quantizer | launches | kernel (`kernels/fp8.cu`) |
//! |---|---|---|
//! | `fp8` | 2: tensor amax, then cast | `qf_amax_T`, `fp8_cast_T`: 64x64 tiles, rowwise and transposed columnwise from one read |
//! | `fp8-block` | 1 | `fp8_block_cast_T`: one 128x128 tile per block, block amaxes, scales and both directions from one read |
//! | dequantize | 1 | `fp8_dequant_row_T` / `fp8_dequant_col_T` (transposed read through shared memory) |
//!
//! The scale arithmetic is [`crate::compute_scale_from_amax`] line for line
//! (`fp8_scale_from_amax`), elements are `fp8(float(x) * scale)` with the bit-exact encoder of
//! `quant_core::codec`, and `scale_inv = 1 / scale` is a correctly rounded reciprocal.

use quant_core::cuda::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use quant_core::cuda::{
    CudaFormat, DeviceBuffer, DeviceQuantized, DeviceTensor, KernelSource, LaunchArgsExt,
    check_dense, check_device_buffers, device_buffer_by_name, device_buffers_by_name_mut,
    dtype_suffix, kernels,
};
use quant_core::parallel::AmaxReducer;
use quant_core::{Direction, Error, Format, Result, Shape};

use crate::{BlockScaling, Fp8BlockQuantizer, Fp8Dtype, Fp8Quantizer};

/// The FP8 kernels.
pub static KERNELS: KernelSource = KernelSource {
    name: "fmt-fp8/kernels/fp8.cu",
    source: include_str!("../kernels/fp8.cu"),
    entry_points: &[
        "fp8_cast_f32",
        "fp8_cast_bf16",
        "fp8_cast_f16",
        "fp8_block_cast_f32",
        "fp8_block_cast_bf16",
        "fp8_block_cast_f16",
        "fp8_dequant_row_f32",
        "fp8_dequant_row_bf16",
        "fp8_dequant_row_f16",
        "fp8_dequant_col_f32",
        "fp8_dequant_col_bf16",
        "fp8_dequant_col_f16",
    ],
};

static SOURCES: [KernelSource; 2] = [quant_core::cuda::CORE_KERNELS, KERNELS];

const THREADS: u32 = 256;

fn e5m2(dt: Fp8Dtype) -> i32 {
    i32::from(dt == Fp8Dtype::E5M2)
}

fn tiles(m: usize, k: usize, edge: usize) -> u64 {
    (m.div_ceil(edge) as u64) * (k.div_ceil(edge) as u64)
}

/// A launch of this crate's kernels (`THREADS` = their `__launch_bounds__`).
fn cfg(blocks: u64, sm: u32) -> LaunchConfig {
    quant_core::cuda::launch_1d(blocks, THREADS, sm)
}

fn missing(name: &str) -> Error {
    Error::buffer(name, "is missing from the device storage")
}

impl Fp8Quantizer {
    /// Quantizes a device tensor with a given tensor-wide amax (e.g. after a cross-rank
    /// reduction): the device twin of [`Fp8Quantizer::quantize_with_amax`].
    pub fn quantize_device_with_amax(
        &self,
        x: &DeviceTensor,
        amax: f32,
    ) -> Result<DeviceQuantized<Self>> {
        x.shape().require_nonempty(<Self as Format>::NAME)?;
        let mut t = DeviceQuantized::allocate(x.device(), self.clone(), x.shape(), x.dtype())?;
        let a = x.device().htod(&amax.to_le_bytes())?;
        self.cast_device(x, &a, t.buffers_mut())?;
        Ok(t)
    }

    /// The cast kernel, given the amax (f32 bits) in device memory.
    fn cast_device(
        &self,
        x: &DeviceTensor,
        amax: &CudaSlice<u8>,
        out: &mut [DeviceBuffer],
    ) -> Result<()> {
        check_device_buffers(self, x.shape(), out)?;
        let dev = x.device();
        let (m, k) = x.shape().as_2d();
        let [row, col, sinv] =
            device_buffers_by_name_mut(out, ["rowwise_data", "columnwise_data", "scale_inv"]);
        let sinv = sinv.ok_or_else(|| missing("scale_inv"))?;
        if row.is_none() && col.is_none() {
            return Err(missing("rowwise_data"));
        }
        let name = format!("fp8_cast_{}", dtype_suffix(x.dtype())?);
        let f = dev.function(&KERNELS, &name)?;
        let (mm, kk) = (m as u64, k as u64);
        let (maxv, e5, pow2, eps) = (
            self.dtype().max(),
            e5m2(self.dtype()),
            i32::from(self.pow2_scales()),
            self.amax_epsilon(),
        );
        let mut b = dev.stream().launch_builder(&f);
        b.arg(x.data())
            .arg(&mm)
            .arg(&kk)
            .arg(amax)
            .arg(&maxv)
            .arg(&e5)
            .arg(&pow2)
            .arg(&eps)
            .arg_opt_mut(row.map(DeviceBuffer::data_mut))
            .arg_opt_mut(col.map(DeviceBuffer::data_mut))
            .arg(sinv.data_mut());
        // SAFETY: fp8_cast_T(const T* x, u64 m, u64 k, const u32* amax, float max, int e5m2,
        // int pow2, float eps, u8* row, u8* col, float* scale_inv): x holds m*k elements of
        // the kernel's type; row (or null) holds m*k bytes and col (or null) k*m bytes, as
        // Format::buffers describes them; amax and scale_inv hold one f32.
        unsafe { b.launch(cfg(tiles(m, k, 64), dev.sm_count())) }?;
        Ok(())
    }
}

impl CudaFormat for Fp8Quantizer {
    fn kernel_sources() -> &'static [KernelSource] {
        &SOURCES
    }

    fn quantize_device_into(&self, x: &DeviceTensor, out: &mut [DeviceBuffer]) -> Result<()> {
        let mut amax = x.device().alloc_zeros(4)?;
        kernels::tensor_amax(x, &mut amax)?;
        self.cast_device(x, &amax, out)
    }

    /// Reduces the shard's amax across ranks first (the amax goes through the host: the
    /// reducer trait is device-agnostic), then casts with it.
    fn quantize_device_reduced_into(
        &self,
        x: &DeviceTensor,
        reducer: &dyn AmaxReducer,
        out: &mut [DeviceBuffer],
    ) -> Result<()> {
        let dev = x.device();
        let mut amax = dev.alloc_zeros(4)?;
        kernels::tensor_amax(x, &mut amax)?;
        let mut v = [f32_of(&dev.dtoh(&amax)?)?];
        reducer.all_reduce_max(&mut v)?;
        dev.htod_into(&v[0].to_le_bytes(), &mut amax)?;
        self.cast_device(x, &amax, out)
    }

    fn dequantize_device_into(
        &self,
        shape: &Shape,
        bufs: &[DeviceBuffer],
        dir: Direction,
        out: &mut DeviceTensor,
    ) -> Result<()> {
        check_device_buffers(self, shape, bufs)?;
        let sinv = device_buffer_by_name(bufs, "scale_inv")?;
        dequantize(shape, bufs, dir, out, self.dtype(), 0, 0, sinv)
    }
}

impl CudaFormat for Fp8BlockQuantizer {
    fn kernel_sources() -> &'static [KernelSource] {
        &SOURCES
    }

    fn quantize_device_into(&self, x: &DeviceTensor, out: &mut [DeviceBuffer]) -> Result<()> {
        check_device_buffers(self, x.shape(), out)?;
        let dev = x.device();
        let (m, k) = x.shape().as_2d();
        let (sr, sc) = self.scale_shapes(m, k);
        let [rd, rs, cd, cs] = device_buffers_by_name_mut(
            out,
            [
                "rowwise_data",
                "rowwise_scale_inv",
                "columnwise_data",
                "columnwise_scale_inv",
            ],
        );
        let rowwise = rd.zip(rs);
        let columnwise = cd.zip(cs);
        if rowwise.is_none() && columnwise.is_none() {
            return Err(missing("rowwise_data"));
        }
        let (rd, rs) = rowwise.map_or((None, None), |(d, s)| (Some(d), Some(s)));
        let (cd, cs) = columnwise.map_or((None, None), |(d, s)| (Some(d), Some(s)));
        let name = format!("fp8_block_cast_{}", dtype_suffix(x.dtype())?);
        let f = dev.function(&KERNELS, &name)?;
        let (mm, kk) = (m as u64, k as u64);
        let two_d = i32::from(self.block() == BlockScaling::TwoD);
        let (e5, maxv, pow2, eps) = (
            e5m2(self.dtype()),
            self.dtype().max(),
            i32::from(self.pow2_scales()),
            self.amax_epsilon(),
        );
        let (rs_stride, cs_stride) = (sr[1] as u64, sc[1] as u64);
        let mut b = dev.stream().launch_builder(&f);
        b.arg(x.data())
            .arg(&mm)
            .arg(&kk)
            .arg(&two_d)
            .arg(&e5)
            .arg(&maxv)
            .arg(&pow2)
            .arg(&eps)
            .arg_opt_mut(rd.map(DeviceBuffer::data_mut))
            .arg_opt_mut(rs.map(DeviceBuffer::data_mut))
            .arg(&rs_stride)
            .arg_opt_mut(cd.map(DeviceBuffer::data_mut))
            .arg_opt_mut(cs.map(DeviceBuffer::data_mut))
            .arg(&cs_stride);
        // SAFETY: fp8_block_cast_T(const T* x, u64 m, u64 k, int two_d, int e5m2, float max,
        // int pow2, float eps, u8* rd, float* rs, u64 rs_stride, u8* cd, float* cs,
        // u64 cs_stride): x holds m*k elements; rd/cd hold m*k bytes; rs/cs are the padded
        // scale matrices of scale_shapes(m, k) whose row strides are passed; a direction's
        // pointers are both set or both null.
        unsafe { b.launch(cfg(tiles(m, k, 128), dev.sm_count())) }?;
        Ok(())
    }

    fn dequantize_device_into(
        &self,
        shape: &Shape,
        bufs: &[DeviceBuffer],
        dir: Direction,
        out: &mut DeviceTensor,
    ) -> Result<()> {
        check_device_buffers(self, shape, bufs)?;
        let (m, k) = shape.as_2d();
        let (sr, sc) = self.scale_shapes(m, k);
        let (name, stride) = match dir {
            Direction::Rowwise => ("rowwise_scale_inv", sr[1]),
            Direction::Columnwise => ("columnwise_scale_inv", sc[1]),
        };
        let sinv = device_buffer_by_name(bufs, name)?;
        let mode = match self.block() {
            BlockScaling::OneD => 1,
            BlockScaling::TwoD => 2,
        };
        dequantize(shape, bufs, dir, out, self.dtype(), mode, stride, sinv)
    }
}

#[allow(clippy::too_many_arguments)]
fn dequantize(
    shape: &Shape,
    bufs: &[DeviceBuffer],
    dir: Direction,
    out: &mut DeviceTensor,
    dtype: Fp8Dtype,
    mode: i32,
    stride: usize,
    sinv: &DeviceBuffer,
) -> Result<()> {
    let (m, k) = shape.as_2d();
    check_dense(out, shape, "out")?;
    let dev = std::sync::Arc::clone(out.device());
    let (data, kernel) = match dir {
        Direction::Rowwise => ("rowwise_data", "fp8_dequant_row"),
        Direction::Columnwise => ("columnwise_data", "fp8_dequant_col"),
    };
    let q = device_buffer_by_name(bufs, data)?;
    if q.nbytes() != m * k {
        return Err(Error::buffer(data, format!("must hold {} bytes", m * k)));
    }
    let name = format!("{kernel}_{}", dtype_suffix(out.dtype())?);
    let f = dev.function(&KERNELS, &name)?;
    let (mm, kk, st, e5) = (m as u64, k as u64, stride as u64, e5m2(dtype));
    let blocks = match dir {
        Direction::Rowwise => ((m * k) as u64).div_ceil(u64::from(THREADS)),
        Direction::Columnwise => (k.div_ceil(32) as u64) * (m.div_ceil(128) as u64),
    };
    let mut b = dev.stream().launch_builder(&f);
    b.arg(q.data())
        .arg(&mm)
        .arg(&kk)
        .arg(sinv.data())
        .arg(&mode)
        .arg(&st)
        .arg(&e5)
        .arg(out.data_mut());
    // SAFETY: fp8_dequant_{row,col}_OT(const u8* q, u64 m, u64 k, const float* sinv, int mode,
    // u64 stride, int e5m2, OT* out): q holds m*k bytes (checked), out m*k elements of the
    // kernel's output type (checked), sinv is the direction's scale buffer described by
    // Format::buffers, whose entries the mode/stride address stay inside.
    unsafe { b.launch(cfg(blocks, dev.sm_count())) }?;
    Ok(())
}

fn f32_of(bytes: &[u8]) -> Result<f32> {
    let b: [u8; 4] = bytes
        .get(..4)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| Error::Cuda("amax readback was short".to_string()))?;
    Ok(f32::from_le_bytes(b))
}
