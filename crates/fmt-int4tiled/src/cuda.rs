//! Device kernels (feature `cuda`): [`CudaFormat`] for [`Int4TiledQuantizer`], plus pack /
//! unpack of plain nibbles and a weight-only int4 matmul for small `m` on the device.
//!
//! | operation | kernel (`kernels/int4tiled.cu`) | launches |
//! |---|---|---|
//! | quantize | `int4_quant_T`: one thread per (expert, row, group): torchao's qparams (the bf16 or f32 path, as the CPU picks by input dtype) and the group's packed words written straight to their tiled positions | 1 |
//! | pack / unpack | `int4_pack` (one thread per word), `int4_unpack` (one thread per nibble) | 1 |
//! | dequantize | `int4_dequant_OT`: `(u − 8)·scale + zero` rounded once (TwoSum in f64, round-to-odd for bf16/f16), bit for bit the CPU's | 1 |
//! | `y = x Wᵀ (+ b)`, m ≤ 16 per launch | `int4_linear_T`: one block per n-tile, warps over k slabs, the packed words read once, `scale·Σx(u−8) + zero·Σx` per 32-column block in f32 | `ceil(m/16)` |
//!
//! Quantize, pack, unpack and dequantize write the CPU path's bytes (scale/zero NaN bits
//! included: see `i4_store_qparam`). The matmul is deterministic for a given launch but, like
//! every int4 matmul, not bit-identical to another summation order: it is checked against the
//! exact reference with a tolerance.

use std::sync::Arc;

use quant_core::cuda::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use quant_core::cuda::{
    CudaDevice, CudaFormat, DeviceBuffer, DeviceQuantized, DeviceTensor, KernelSource,
    LaunchArgsExt, check_dense, check_device_buffers, device_buffer_by_name,
    device_buffers_by_name_mut, dtype_suffix,
};
use quant_core::{Direction, Error, Format, Result, Shape};

use crate::qparams::QParamsPath;
use crate::{Geometry, Int4TiledQuantizer};

/// The int4tiled kernels.
pub static KERNELS: KernelSource = KernelSource {
    name: "fmt-int4tiled/kernels/int4tiled.cu",
    source: include_str!("../kernels/int4tiled.cu"),
    entry_points: &[
        "int4_quant_f32",
        "int4_quant_bf16",
        "int4_quant_f16",
        "int4_unpack",
        "int4_pack",
        "int4_dequant_f32",
        "int4_dequant_bf16",
        "int4_dequant_f16",
        "int4_linear_f32",
        "int4_linear_bf16",
        "int4_linear_f16",
    ],
};

static SOURCES: [KernelSource; 1] = [KERNELS];

const THREADS: u32 = 256;
/// Activation rows per matmul launch.
const M_MAX: usize = 16;

/// A launch of this crate's kernels (`THREADS` = their `__launch_bounds__`).
fn cfg(blocks: u64, sm: u32) -> LaunchConfig {
    quant_core::cuda::launch_1d(blocks, THREADS, sm)
}

fn threads_for(n: u64) -> u64 {
    n.div_ceil(u64::from(THREADS))
}

/// `(experts, n, k, n_padded, k_padded, group, inner_k_tiles)` as kernel arguments.
struct Dims {
    e: u64,
    n: u64,
    k: u64,
    np: u64,
    kp: u64,
    g: i32,
    ikt: i32,
}

fn dims(geo: &Geometry) -> Result<Dims> {
    let int = |v: usize, what: &str| {
        i32::try_from(v).map_err(|_| Error::invalid(what, v, "does not fit the kernel's int"))
    };
    Ok(Dims {
        e: geo.num_experts() as u64,
        n: geo.n as u64,
        k: geo.k as u64,
        np: geo.n_padded as u64,
        kp: geo.k_padded as u64,
        g: int(geo.group_size, "group size")?,
        ikt: int(geo.inner_k_tiles, "inner_k_tiles")?,
    })
}

fn buffers<'a>(
    bufs: &'a [DeviceBuffer],
    geo: &Geometry,
) -> Result<(&'a DeviceBuffer, &'a DeviceBuffer)> {
    let packed = device_buffer_by_name(bufs, "packed_weight")?;
    let sz = device_buffer_by_name(bufs, "scale_and_zero")?;
    if packed.nbytes() != geo.num_experts() * geo.expert_words() * 4
        || sz.nbytes() != geo.num_experts() * geo.expert_scale_and_zero() * 2
    {
        return Err(Error::buffer(
            "packed_weight",
            "or scale_and_zero does not match the weight's geometry",
        ));
    }
    Ok((packed, sz))
}

impl CudaFormat for Int4TiledQuantizer {
    fn kernel_sources() -> &'static [KernelSource] {
        &SOURCES
    }

    fn quantize_device_into(&self, x: &DeviceTensor, out: &mut [DeviceBuffer]) -> Result<()> {
        check_device_buffers(self, x.shape(), out)?;
        let geo = self.geometry(x.shape())?;
        let d = dims(&geo)?;
        let dev = x.device();
        let [packed, sz] = device_buffers_by_name_mut(out, ["packed_weight", "scale_and_zero"]);
        let packed = packed.ok_or_else(|| Error::buffer("packed_weight", "is missing"))?;
        let sz = sz.ok_or_else(|| Error::buffer("scale_and_zero", "is missing"))?;
        if packed.nbytes() != geo.num_experts() * geo.expert_words() * 4
            || sz.nbytes() != geo.num_experts() * geo.expert_scale_and_zero() * 2
        {
            return Err(Error::buffer(
                "packed_weight",
                "or scale_and_zero has the wrong size",
            ));
        }
        let f = dev.function(
            &KERNELS,
            &format!("int4_quant_{}", dtype_suffix(x.dtype())?),
        )?;
        let bf16_path = i32::from(QParamsPath::for_input(x.dtype()) == QParamsPath::Bf16);
        let eps = self.eps();
        let work = d.e * d.np * (d.kp / d.g as u64);
        let mut b = dev.stream().launch_builder(&f);
        b.arg(x.data())
            .arg(&d.e)
            .arg(&d.n)
            .arg(&d.k)
            .arg(&d.np)
            .arg(&d.kp)
            .arg(&d.g)
            .arg(&d.ikt)
            .arg(&bf16_path)
            .arg(&eps)
            .arg(packed.data_mut())
            .arg(sz.data_mut());
        // SAFETY: int4_quant_T(const T* x, u64 e, u64 n, u64 k, u64 n_padded, u64 k_padded,
        // int g, int ikt, int bf16_path, float eps, u32* packed, u16* sz): x holds e*n*k
        // elements of the kernel's type (the geometry comes from x's shape), packed holds
        // e*n_padded*k_padded/8 words and sz e*(k_padded/g)*n_padded*2 bf16 (checked above).
        unsafe { b.launch(cfg(threads_for(work), dev.sm_count())) }?;
        Ok(())
    }

    fn dequantize_device_into(
        &self,
        shape: &Shape,
        bufs: &[DeviceBuffer],
        dir: Direction,
        out: &mut DeviceTensor,
    ) -> Result<()> {
        if dir != Direction::Rowwise {
            return Err(Error::unsupported(
                Self::NAME,
                "the columnwise usage",
                "tinygemm is a weight-only forward format: it stores only the rowwise y = x W^T operand",
            ));
        }
        check_device_buffers(self, shape, bufs)?;
        check_dense(out, shape, "out")?;
        let geo = self.geometry(shape)?;
        let d = dims(&geo)?;
        let (packed, sz) = buffers(bufs, &geo)?;
        let dev = Arc::clone(out.device());
        let f = dev.function(
            &KERNELS,
            &format!("int4_dequant_{}", dtype_suffix(out.dtype())?),
        )?;
        let mut b = dev.stream().launch_builder(&f);
        b.arg(packed.data())
            .arg(sz.data())
            .arg(&d.e)
            .arg(&d.n)
            .arg(&d.k)
            .arg(&d.np)
            .arg(&d.kp)
            .arg(&d.g)
            .arg(&d.ikt)
            .arg(out.data_mut());
        // SAFETY: int4_dequant_OT(const u32* packed, const u16* sz, u64 e, u64 n, u64 k,
        // u64 n_padded, u64 k_padded, int g, int ikt, OT* out): buffers checked against the
        // geometry of `shape`, out holds e*n*k elements of the kernel's output type.
        unsafe { b.launch(cfg(threads_for(d.e * d.n * d.k), dev.sm_count())) }?;
        Ok(())
    }
}

/// The logical nibbles `u8 [E,] n, k` (values `0..=15`) of a device weight: the device twin
/// of [`crate::Int4TiledTensorExt::unpack`].
pub fn unpack_device(t: &DeviceQuantized<Int4TiledQuantizer>) -> Result<CudaSlice<u8>> {
    let geo = t.quantizer().geometry(t.shape())?;
    let d = dims(&geo)?;
    let (packed, _) = buffers(t.buffers(), &geo)?;
    let dev = t.device();
    let mut out = dev.alloc_zeros(t.shape().numel())?;
    let f = dev.function(&KERNELS, "int4_unpack")?;
    let mut b = dev.stream().launch_builder(&f);
    b.arg(packed.data())
        .arg(&d.e)
        .arg(&d.n)
        .arg(&d.k)
        .arg(&d.np)
        .arg(&d.kp)
        .arg(&d.ikt)
        .arg(&mut out);
    // SAFETY: int4_unpack(const u32* packed, u64 e, u64 n, u64 k, u64 n_padded, u64 k_padded,
    // int ikt, u8* out): packed checked against the geometry, out holds e*n*k bytes.
    unsafe { b.launch(cfg(threads_for(d.e * d.n * d.k), dev.sm_count())) }?;
    Ok(out)
}

/// Packs logical nibbles `u` (`u8 [E,] n, k`, device memory; only the low 4 bits are read)
/// into `packed_weight` words of `geo` (rows and columns past `n`, `k` hold nibble 0): the
/// device twin of [`crate::layout::pack_tile`] over every tile. Returns the words as bytes.
pub fn pack_device(
    device: &Arc<CudaDevice>,
    u: &CudaSlice<u8>,
    geo: &Geometry,
) -> Result<CudaSlice<u8>> {
    let d = dims(geo)?;
    let want = geo.num_experts() * geo.n * geo.k;
    if u.len() != want {
        return Err(Error::invalid(
            "u",
            format!("{} bytes", u.len()),
            format!("a weight of shape {:?} needs {want} nibbles", geo.shape()),
        ));
    }
    let words = geo.num_experts() * geo.expert_words();
    let mut out = device.alloc_zeros(words * 4)?;
    let f = device.function(&KERNELS, "int4_pack")?;
    let mut b = device.stream().launch_builder(&f);
    b.arg(u)
        .arg(&d.e)
        .arg(&d.n)
        .arg(&d.k)
        .arg(&d.np)
        .arg(&d.kp)
        .arg(&d.ikt)
        .arg(&mut out);
    // SAFETY: int4_pack(const u8* u, u64 e, u64 n, u64 k, u64 n_padded, u64 k_padded, int ikt,
    // u32* packed): u holds e*n*k bytes (checked), out e*n_padded*k_padded/8 words.
    unsafe { b.launch(cfg(threads_for(words as u64), device.sm_count())) }?;
    Ok(out)
}

/// `y = x Wᵀ (+ bias)` on the device for `x` of shape `[..., k]` (f32, bf16 or f16) and a
/// 2-D int4 weight `[n, k]`: the output `[..., n]` has `x`'s dtype; `bias` (`n` elements)
/// must have it too. Runs one launch per 16 rows of `x` (the kernel is written for the
/// decode regime, m = 1..16). Deterministic, accumulated in f32 with the exact weights,
/// like [`crate::int4_linear`].
pub fn int4_linear_device(
    x: &DeviceTensor,
    w: &DeviceQuantized<Int4TiledQuantizer>,
    bias: Option<&DeviceTensor>,
) -> Result<DeviceTensor> {
    let geo = w.quantizer().geometry(w.shape())?;
    if geo.experts.is_some() {
        return Err(Error::invalid(
            "w",
            w.shape(),
            "int4_linear_device takes a 2-D [n, k] weight; select an expert first",
        ));
    }
    if x.shape().cols() != geo.k {
        return Err(Error::invalid(
            "x",
            x.shape(),
            format!(
                "last dimension must be k = {} (the weight's in_features)",
                geo.k
            ),
        ));
    }
    if let Some(b) = bias
        && (b.dtype() != x.dtype() || b.shape().numel() != geo.n)
    {
        return Err(Error::invalid(
            "bias",
            format!("{} {}", b.dtype(), b.shape()),
            format!("must hold n = {} values of x's dtype {}", geo.n, x.dtype()),
        ));
    }
    let d = dims(&geo)?;
    let (packed, sz) = buffers(w.buffers(), &geo)?;
    let dev = x.device();
    let m = x.shape().rows();
    let mut dims_out = x.shape().dims().to_vec();
    if let Some(last) = dims_out.last_mut() {
        *last = geo.n;
    }
    let mut y = DeviceTensor::zeros(dev, &Shape::new(&dims_out)?, x.dtype())?;
    let f = dev.function(
        &KERNELS,
        &format!("int4_linear_{}", dtype_suffix(x.dtype())?),
    )?;
    let esize = x.dtype().size();
    let n_tiles = geo.n_tiles() as u64;
    for m0 in (0..m).step_by(M_MAX) {
        let mc = (m - m0).min(M_MAX) as u64;
        let rows = |lo: usize, hi: usize, what: &str| {
            Error::invalid(what, format!("bytes {lo}..{hi}"), "lie outside the tensor")
        };
        let (xlo, xhi) = (m0 * geo.k * esize, (m0 + mc as usize) * geo.k * esize);
        let xs = x
            .data()
            .try_slice(xlo..xhi)
            .ok_or_else(|| rows(xlo, xhi, "x rows"))?;
        let (ylo, yhi) = (m0 * geo.n * esize, (m0 + mc as usize) * geo.n * esize);
        let mut ys = y
            .data_mut()
            .try_slice_mut(ylo..yhi)
            .ok_or_else(|| rows(ylo, yhi, "y rows"))?;
        let mut b = dev.stream().launch_builder(&f);
        b.arg(&xs)
            .arg(&mc)
            .arg(packed.data())
            .arg(sz.data())
            .arg(&d.n)
            .arg(&d.k)
            .arg(&d.np)
            .arg(&d.kp)
            .arg(&d.g)
            .arg(&d.ikt)
            .arg_opt(bias.map(DeviceTensor::data))
            .arg(&mut ys);
        // SAFETY: int4_linear_T(const T* x, u64 m, const u32* packed, const u16* sz, u64 n,
        // u64 k, u64 n_padded, u64 k_padded, int g, int ikt, const T* bias, T* y): the x
        // view holds mc*k elements and the y view mc*n (mc <= 16 rows), the weight buffers
        // match the geometry (checked), bias is null or n elements of x's dtype (checked).
        unsafe { b.launch(cfg(n_tiles, dev.sm_count())) }?;
    }
    Ok(y)
}
