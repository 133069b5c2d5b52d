//! Device kernels (feature `cuda`): [`CudaFormat`] for [`Mxfp8Quantizer`], producing the
//! bytes of the CPU path.
//!
//! One launch quantizes both directions from one read of the input (`mxfp8_cast_T`, a
//! 32x128 tile per block, 16 values per thread in registers) and writes the E8M0 scales
//! straight into their compact or swizzled positions (the CPU path writes compact scales and
//! permutes them; the permutation is a bijection, so the bytes agree, padding zero in both).
//! The scale rule ([`crate::ScaleRule`]), the `2d` tiles and TE's sign-of-zero dispatch
//! ([`Mxfp8Quantizer::flushes_negative_zero`], decided on the host and passed in) are the
//! CPU code's, operation for operation. Dequantize is one launch (`mxfp8_dequant_T`).

use quant_core::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use quant_core::cuda::{
    CudaFormat, DeviceBuffer, DeviceTensor, KernelSource, LaunchArgsExt, check_dense,
    check_device_buffers, device_buffer_by_name, device_buffers_by_name_mut, dtype_suffix,
};
use quant_core::{Direction, Error, Format, Result, Shape};

use crate::layout::{columnwise_scale_shape, rowwise_scale_shape};
use crate::quantizer::{COLUMNWISE_DATA, COLUMNWISE_SCALE_INV, ROWWISE_DATA, ROWWISE_SCALE_INV};
use crate::{Mxfp8Dtype, Mxfp8Quantizer, ScaleLayout, ScaleRule};

/// The MXFP8 kernels.
pub static KERNELS: KernelSource = KernelSource {
    name: "fmt-mxfp8/kernels/mxfp8.cu",
    source: include_str!("../kernels/mxfp8.cu"),
    entry_points: &[
        "mxfp8_cast_f32",
        "mxfp8_cast_bf16",
        "mxfp8_cast_f16",
        "mxfp8_dequant_f32",
        "mxfp8_dequant_bf16",
        "mxfp8_dequant_f16",
    ],
};

static SOURCES: [KernelSource; 1] = [KERNELS];

const THREADS: u32 = 256;

/// A launch of this crate's kernels (`THREADS` = their `__launch_bounds__`).
fn cfg(blocks: u64, sm: u32) -> LaunchConfig {
    quant_core::cuda::launch_1d(blocks, THREADS, sm)
}

impl CudaFormat for Mxfp8Quantizer {
    fn kernel_sources() -> &'static [KernelSource] {
        &SOURCES
    }

    fn quantize_device_into(&self, x: &DeviceTensor, out: &mut [DeviceBuffer]) -> Result<()> {
        check_device_buffers(self, x.shape(), out)?;
        let dev = x.device();
        let (m, k) = x.shape().as_2d();
        let [rd, rs, cd, cs] = device_buffers_by_name_mut(
            out,
            [
                ROWWISE_DATA,
                ROWWISE_SCALE_INV,
                COLUMNWISE_DATA,
                COLUMNWISE_SCALE_INV,
            ],
        );
        let usage = self.usage();
        let (rd, rs) = match (rd, rs, usage.rowwise) {
            (Some(d), Some(s), true) => (Some(d), Some(s)),
            (_, _, false) => (None, None),
            _ => return Err(Error::buffer(ROWWISE_DATA, "or its scale_inv is missing")),
        };
        let (cd, cs) = match (cd, cs, usage.columnwise) {
            (Some(d), Some(s), true) => (Some(d), Some(s)),
            (_, _, false) => (None, None),
            _ => {
                return Err(Error::buffer(
                    COLUMNWISE_DATA,
                    "or its scale_inv is missing",
                ));
            }
        };
        let rshape = rowwise_scale_shape(m, k);
        let cshape = columnwise_scale_shape(m, k);
        let name = format!("mxfp8_cast_{}", dtype_suffix(x.dtype())?);
        let f = dev.function(&KERNELS, &name)?;
        let (mm, kk) = (m as u64, k as u64);
        let e5 = i32::from(self.dtype() == Mxfp8Dtype::E5M2);
        let ocp = i32::from(self.scale_rule() == ScaleRule::Ocp);
        let two_d = i32::from(self.is_2d());
        let plus_zero = i32::from(self.flushes_negative_zero(x.dtype(), m, k));
        let swz = i32::from(self.scale_layout() == ScaleLayout::Swizzled);
        let (rs_stride, cs_stride, cs_rows) =
            (rshape[1] as u64, cshape[1] as u64, cshape[0] as u64);
        let tiles = (m / 32) as u64 * k.div_ceil(128) as u64;
        let mut b = dev.stream().launch_builder(&f);
        b.arg(x.data())
            .arg(&mm)
            .arg(&kk)
            .arg(&e5)
            .arg(&ocp)
            .arg(&two_d)
            .arg(&plus_zero)
            .arg(&swz)
            .arg_opt_mut(rd.map(DeviceBuffer::data_mut))
            .arg_opt_mut(rs.map(DeviceBuffer::data_mut))
            .arg(&rs_stride)
            .arg_opt_mut(cd.map(DeviceBuffer::data_mut))
            .arg_opt_mut(cs.map(DeviceBuffer::data_mut))
            .arg(&cs_stride)
            .arg(&cs_rows);
        // SAFETY: mxfp8_cast_T(const T* x, u64 m, u64 k, int e5m2, int ocp, int two_d,
        // int plus_zero, int swz, u8* rd, u8* rs, u64 rs_stride, u8* cd, u8* cs,
        // u64 cs_stride, u64 cs_rows): x holds m*k elements of the kernel's type, m and k are
        // multiples of 32 (check_shape), rd/cd hold m*k bytes, rs/cs are the padded scale
        // matrices [rows, stride] of layout.rs whose every index the kernel forms is inside
        // them (compact or swizzled, a permutation of the same bytes).
        unsafe { b.launch(cfg(tiles, dev.sm_count())) }?;
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
        check_dense(out, shape, "out")?;
        let (m, k) = shape.as_2d();
        let (dname, sname, sshape, columnwise) = match dir {
            Direction::Rowwise => (
                ROWWISE_DATA,
                ROWWISE_SCALE_INV,
                rowwise_scale_shape(m, k),
                0,
            ),
            Direction::Columnwise => (
                COLUMNWISE_DATA,
                COLUMNWISE_SCALE_INV,
                columnwise_scale_shape(m, k),
                1,
            ),
        };
        let q = device_buffer_by_name(bufs, dname)?;
        let s = device_buffer_by_name(bufs, sname)?;
        if q.nbytes() != m * k || s.nbytes() != sshape[0] * sshape[1] {
            return Err(Error::buffer(dname, "or its scales do not match the shape"));
        }
        let dev = std::sync::Arc::clone(out.device());
        let name = format!("mxfp8_dequant_{}", dtype_suffix(out.dtype())?);
        let f = dev.function(&KERNELS, &name)?;
        let (mm, kk) = (m as u64, k as u64);
        let swz = i32::from(self.scale_layout() == ScaleLayout::Swizzled);
        let (stride, rows) = (sshape[1] as u64, sshape[0] as u64);
        let e5 = i32::from(self.dtype() == Mxfp8Dtype::E5M2);
        let mut b = dev.stream().launch_builder(&f);
        b.arg(q.data())
            .arg(&mm)
            .arg(&kk)
            .arg(s.data())
            .arg(&columnwise)
            .arg(&swz)
            .arg(&stride)
            .arg(&rows)
            .arg(&e5)
            .arg(out.data_mut());
        // SAFETY: mxfp8_dequant_OT(const u8* q, u64 m, u64 k, const u8* s, int columnwise,
        // int swz, u64 stride, u64 rows, int e5m2, OT* out): q holds m*k bytes and s the
        // [rows, stride] scale matrix (both checked), out m*k elements of the kernel's type.
        unsafe {
            b.launch(cfg(
                ((m * k) as u64 / 4).div_ceil(u64::from(THREADS)),
                dev.sm_count(),
            ))
        }?;
        Ok(())
    }
}
