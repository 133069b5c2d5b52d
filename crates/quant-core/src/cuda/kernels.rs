//! Launchers of quant-core's own kernels (`crates/quant-core/kernels/core.cu`): the
//! NaN-ignoring amax reductions the formats share.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::format::{dtype_suffix, grid_1d};
use super::source::CORE_KERNELS;
use super::tensor::DeviceTensor;
use crate::error::{Error, Result};

const THREADS: u32 = 256;

fn check_out(out: &CudaSlice<u8>, need: usize, what: &str) -> Result<()> {
    if out.len() < need {
        return Err(Error::invalid(
            what,
            format!("{} bytes", out.len()),
            format!("must hold at least {need} bytes"),
        ));
    }
    Ok(())
}

/// `out[0..4] = max(out[0..4], amax(x))`, as f32 bits: the NaN-ignoring `max |x|` of the
/// whole tensor (`out` must start zeroed, or hold an amax to fold in).
pub fn tensor_amax(x: &DeviceTensor, out: &mut CudaSlice<u8>) -> Result<()> {
    check_out(out, 4, "amax output")?;
    let dev = x.device();
    let name = format!("qf_amax_{}", dtype_suffix(x.dtype())?);
    let f = dev.function(&CORE_KERNELS, &name)?;
    let n = x.shape().numel() as u64;
    let blocks = grid_1d(
        (n / 4).div_ceil(u64::from(THREADS)),
        u64::from(dev.sm_count()) * 8,
    );
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = dev.stream().launch_builder(&f);
    b.arg(x.data()).arg(&n).arg(out);
    // SAFETY: qf_amax_T(const T* x, u64 n, u32* out): `x` holds n elements of the kernel's
    // type (dtype_suffix picks it from x.dtype()), `out` at least 4 bytes (checked above).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// `out[r] = amax(row r)` (f32 bits) for the `[rows, cols]` view of `x`; `out` holds
/// `rows` f32.
pub fn row_amax(x: &DeviceTensor, rows: usize, cols: usize, out: &mut CudaSlice<u8>) -> Result<()> {
    check_view(x, rows, cols)?;
    check_out(out, rows * 4, "row amax output")?;
    let dev = x.device();
    let name = format!("qf_row_amax_{}", dtype_suffix(x.dtype())?);
    let f = dev.function(&CORE_KERNELS, &name)?;
    let (r, c) = (rows as u64, cols as u64);
    let cfg = LaunchConfig {
        grid_dim: (grid_1d(r, u64::from(dev.sm_count()) * 16), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = dev.stream().launch_builder(&f);
    b.arg(x.data()).arg(&r).arg(&c).arg(out);
    // SAFETY: qf_row_amax_T(const T* x, u64 rows, u64 cols, u32* out): x holds rows*cols
    // elements (checked), out holds rows u32 (checked).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// `out[c] = max(out[c], amax(column c))` (f32 bits) for the `[rows, cols]` view of `x`;
/// `out` holds `cols` f32 and must start zeroed.
pub fn col_amax(x: &DeviceTensor, rows: usize, cols: usize, out: &mut CudaSlice<u8>) -> Result<()> {
    check_view(x, rows, cols)?;
    check_out(out, cols * 4, "column amax output")?;
    let dev = x.device();
    let name = format!("qf_col_amax_{}", dtype_suffix(x.dtype())?);
    let f = dev.function(&CORE_KERNELS, &name)?;
    let (r, c) = (rows as u64, cols as u64);
    let gx = c.div_ceil(u64::from(THREADS));
    // Enough row chunks to fill the machine, each at least 64 rows long.
    let want_y = (u64::from(dev.sm_count()) * 8).div_ceil(gx.max(1)).max(1);
    let rows_per_block = r.div_ceil(want_y).max(64);
    let gy = r.div_ceil(rows_per_block).clamp(1, 65_535);
    let cfg = LaunchConfig {
        grid_dim: (
            u32::try_from(gx).map_err(|_| Error::invalid("cols", cols, "too many columns"))?,
            u32::try_from(gy).unwrap_or(65_535),
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = dev.stream().launch_builder(&f);
    b.arg(x.data())
        .arg(&r)
        .arg(&c)
        .arg(&rows_per_block)
        .arg(out);
    // SAFETY: qf_col_amax_T(const T* x, u64 rows, u64 cols, u64 rows_per_block, u32* out):
    // x holds rows*cols elements, out holds cols u32 (both checked).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

fn check_view(x: &DeviceTensor, rows: usize, cols: usize) -> Result<()> {
    if rows.checked_mul(cols) != Some(x.shape().numel()) {
        return Err(Error::invalid(
            "view",
            format!("[{rows}, {cols}]"),
            format!(
                "must cover the {} elements of the tensor",
                x.shape().numel()
            ),
        ));
    }
    Ok(())
}
