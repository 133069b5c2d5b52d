//! Device throughput of every quantfmt kernel, against a device-to-device copy measured in
//! the same run.
//!
//! ```text
//! cargo build --release -p quantfmt --features cuda --example cuda_bench
//! target/release/examples/cuda_bench [--sizes 8192,16384] [--dtypes bf16,f32] [--iters 20] [--only nvfp4] [--verify]
//! ```
//!
//! For each `S x S` input (`S` in `--sizes`) and input dtype, every kernel configuration is
//! run `--iters` times after a warm-up (which also compiles its kernels); the median of the
//! per-run device-event timings is reported. GB/s counts the fewest bytes the operation must
//! move: the input read once plus every output byte written once (a quantizer's extra amax
//! pass is not counted, so it shows as lost bandwidth). The copy baseline moves `2 x` the
//! input bytes (read + write). `ratio` = kernel GB/s / copy GB/s. Inputs are random (never
//! zeros: unwritten outputs and fast paths on zeros would flatter the numbers).
//!
//! With `--verify`, each device result is also compared byte for byte with the CPU path on
//! the same input (slow at 16384: the CPU quantizes 2^28 values per configuration).

use std::sync::Arc;

use quantfmt::cuda::cudarc::driver::sys::CUevent_flags;
use quantfmt::cuda::{
    CudaDevice, CudaFormat, DeviceQuantized, DeviceTensor, quantize_device, warm_up,
};
use quantfmt::fmt_int4tiled::cuda::int4_linear_device;
use quantfmt::{
    DType, Direction, Format, Fp8BlockQuantizer, Fp8Quantizer, HostTensor, Int4TiledQuantizer,
    Mxfp8Quantizer, Nvfp4Quantizer, Result, Usage,
};
use quantfmt_testkit::XorShift64;

struct Args {
    sizes: Vec<usize>,
    dtypes: Vec<DType>,
    iters: usize,
    only: Option<String>,
    verify: bool,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        sizes: vec![8192, 16384],
        dtypes: vec![DType::BF16, DType::F32],
        iters: 20,
        only: None,
        verify: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let val = || {
            argv.get(i + 1)
                .cloned()
                .ok_or_else(|| quantfmt::Error::invalid(argv[i].as_str(), "", "needs a value"))
        };
        match argv[i].as_str() {
            "--sizes" => {
                a.sizes = val()?
                    .split(',')
                    .map(|s| {
                        s.parse()
                            .map_err(|_| quantfmt::Error::invalid("--sizes", s, "must be integers"))
                    })
                    .collect::<Result<_>>()?;
                i += 1;
            }
            "--dtypes" => {
                a.dtypes = val()?
                    .split(',')
                    .map(|s| s.parse())
                    .collect::<Result<_>>()?;
                i += 1;
            }
            "--iters" => {
                a.iters = val()?
                    .parse()
                    .map_err(|_| quantfmt::Error::invalid("--iters", "", "must be an integer"))?;
                i += 1;
            }
            "--only" => {
                a.only = Some(val()?);
                i += 1;
            }
            "--verify" => a.verify = true,
            other => {
                return Err(quantfmt::Error::invalid(
                    "argument",
                    other,
                    "see the example's docs",
                ));
            }
        }
        i += 1;
    }
    Ok(a)
}

/// Median device time (ms) of `iters` runs of `f`, after one warm-up run.
fn time_ms(dev: &CudaDevice, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    dev.synchronize()?;
    let mut t = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let start = dev
            .stream()
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        f()?;
        let end = dev
            .stream()
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        t.push(f64::from(start.elapsed_ms(&end)?));
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

struct Row {
    kernel: String,
    shape: String,
    dtype: DType,
    ms: f64,
    gbs: f64,
    ratio: f64,
}

fn random_input(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = XorShift64::new(seed | 1);
    (0..n).map(|_| (rng.next_f32() - 0.5) * 8.0).collect()
}

#[allow(clippy::too_many_arguments)]
fn bench_quantizer<F: CudaFormat>(
    rows: &mut Vec<Row>,
    dev: &Arc<CudaDevice>,
    label: &str,
    q: &F,
    x: &DeviceTensor,
    host: Option<&HostTensor<'_>>,
    iters: usize,
    copy_gbs: f64,
) -> Result<()> {
    let mut t: DeviceQuantized<F> = quantize_device(q, x)?;
    if let Some(h) = host {
        let cpu = quantfmt::quantize(q, h)?;
        let back = t.to_host()?;
        for b in cpu.buffers() {
            if back.buffer(b.name())?.bytes() != b.bytes() {
                return Err(quantfmt::Error::Cuda(format!(
                    "{label}: {} differs from the CPU path",
                    b.name()
                )));
            }
        }
    }
    let in_bytes = x.data().len() as f64;
    let out_bytes = t.nbytes() as f64;
    // Repeated runs on the same buffers: every kernel overwrites its outputs, and the amax
    // accumulators see the same maximum again, so the bytes do not change.
    let ms = time_ms(dev, iters, || q.quantize_device_into(x, t.buffers_mut()))?;
    let gbs = (in_bytes + out_bytes) / (ms * 1e6);
    let (m, k) = x.shape().as_2d();
    rows.push(Row {
        kernel: format!("quantize {label}"),
        shape: format!("{m}x{k}"),
        dtype: x.dtype(),
        ms,
        gbs,
        ratio: gbs / copy_gbs,
    });
    let dir = q.usage().preferred().unwrap_or(Direction::Rowwise);
    let mut out = DeviceTensor::zeros(dev, x.shape(), x.dtype())?;
    let shape = x.shape().clone();
    let ms = time_ms(dev, iters, || {
        q.dequantize_device_into(&shape, t.buffers(), dir, &mut out)
    })?;
    let gbs = (out_bytes + in_bytes) / (ms * 1e6);
    rows.push(Row {
        kernel: format!("dequantize {label} ({dir})"),
        shape: format!("{m}x{k}"),
        dtype: x.dtype(),
        ms,
        gbs,
        ratio: gbs / copy_gbs,
    });
    Ok(())
}

/// Weight-only int4 matmul at m = 1 (and 16): the S x S input as the weight, GB/s of the
/// bytes it must stream (packed words + scale/zero + x + y), ratio to the copy.
fn bench_int4_linear(
    rows: &mut Vec<Row>,
    dev: &Arc<CudaDevice>,
    w: &DeviceTensor,
    iters: usize,
    copy_gbs: f64,
) -> Result<()> {
    let q = Int4TiledQuantizer::new();
    let t = quantize_device(&q, w)?;
    let (n, k) = w.shape().as_2d();
    for m in [1usize, 16] {
        let xv = random_input(m * k, 7 + m as u64);
        let x = HostTensor::f32(&xv, &[m, k])?.to_dtype(w.dtype())?;
        let dx = DeviceTensor::from_host(dev, &x)?;
        let ms = time_ms(dev, iters, || int4_linear_device(&dx, &t, None).map(|_| ()))?;
        let bytes = t.nbytes() as f64 + ((m * k + m * n) * w.dtype().size()) as f64;
        let gbs = bytes / (ms * 1e6);
        rows.push(Row {
            kernel: format!("int4 gemv/gemm m={m} (weight bytes streamed)"),
            shape: format!("{n}x{k}"),
            dtype: w.dtype(),
            ms,
            gbs,
            ratio: gbs / copy_gbs,
        });
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let dev = CudaDevice::shared(0)?;
    println!(
        "device: {} (sm_{}{}, {} SMs); warming up (NVRTC compiles every kernel once)...",
        dev.name(),
        dev.compute_capability().0,
        dev.compute_capability().1,
        dev.sm_count()
    );
    warm_up(&dev)?;
    let mut rows = Vec::new();
    let keep = |label: &str| args.only.as_deref().is_none_or(|o| label.contains(o));
    for &s in &args.sizes {
        let host32 = random_input(s * s, s as u64);
        for &dt in &args.dtypes {
            let h = HostTensor::f32(&host32, &[s, s])?.to_dtype(dt)?;
            let x = DeviceTensor::from_host(&dev, &h)?;
            let n = x.data().len();
            let mut scratch = dev.alloc_zeros(n)?;
            let copy_ms = time_ms(&dev, args.iters, || dev.dtod(x.data(), &mut scratch))?;
            let copy_gbs = 2.0 * n as f64 / (copy_ms * 1e6);
            rows.push(Row {
                kernel: "device-to-device copy".into(),
                shape: format!("{s}x{s}"),
                dtype: dt,
                ms: copy_ms,
                gbs: copy_gbs,
                ratio: 1.0,
            });
            let host = args.verify.then_some(&h);
            macro_rules! run {
                ($label:expr, $q:expr) => {
                    if keep($label) {
                        bench_quantizer(
                            &mut rows, &dev, $label, &$q, &x, host, args.iters, copy_gbs,
                        )?;
                    }
                };
            }
            run!("fp8 rowwise", Fp8Quantizer::new(Usage::ROWWISE));
            run!("fp8 both", Fp8Quantizer::new(Usage::BOTH));
            run!(
                "fp8-block 1x128 both",
                Fp8BlockQuantizer::from_spec(&["1x128"], Usage::BOTH)?
            );
            run!(
                "fp8-block 128x128 both",
                Fp8BlockQuantizer::from_spec(&["128x128"], Usage::BOTH)?
            );
            run!("mxfp8 rowwise", Mxfp8Quantizer::new(Usage::ROWWISE));
            run!("mxfp8 both", Mxfp8Quantizer::new(Usage::BOTH));
            run!(
                "mxfp8 both swizzled",
                Mxfp8Quantizer::from_spec(&["swizzled"], Usage::BOTH)?
            );
            run!("nvfp4 rowwise", Nvfp4Quantizer::new(Usage::ROWWISE));
            run!("nvfp4 both", Nvfp4Quantizer::new(Usage::BOTH));
            run!(
                "nvfp4 2d both",
                Nvfp4Quantizer::from_spec(&["2d"], Usage::BOTH)?
            );
            run!(
                "nvfp4 sr both",
                Nvfp4Quantizer::from_spec(&["sr", "seed=1"], Usage::BOTH)?
            );
            run!(
                "nvfp4 4over6 rowwise",
                Nvfp4Quantizer::from_spec(&["4over6"], Usage::ROWWISE)?
            );
            run!(
                "nvfp4 row-scaled rowwise",
                Nvfp4Quantizer::from_spec(&["row-scaled"], Usage::ROWWISE)?
            );
            if dt == DType::BF16 {
                run!(
                    "nvfp4 rht both",
                    Nvfp4Quantizer::from_spec(&["rht"], Usage::BOTH)?
                );
            }
            run!("int4tiled g128", Int4TiledQuantizer::new());
            if keep("int4 gemv") {
                bench_int4_linear(&mut rows, &dev, &x, args.iters, copy_gbs)?;
            }
        }
    }
    println!();
    println!("| kernel | shape | input | ms (median) | GB/s | ratio to copy |");
    println!("|---|---|---|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.3} | {:.0} | {:.2} |",
            r.kernel, r.shape, r.dtype, r.ms, r.gbs, r.ratio
        );
    }
    Ok(())
}
