//! The device check: every CUDA kernel writes **the same bytes as the CPU path**, for every
//! format and option combination, f32/bf16/f16 inputs, ragged shapes and special values
//! (NaN, ±inf, ±0, subnormals, values at and beyond the element maxima, all-zero, all-NaN
//! and all-subnormal blocks). Dequantization on the device (of device-made and of CPU-made
//! storages) must equal the CPU's to f32, bf16 and f16 bit for bit, NaN payloads aside.
//!
//! Without a GPU every test skips with the reason printed. On the GPU machine run the
//! prebuilt binary with `QUANTFMT_REQUIRE_GPU=1` so a missing device fails instead (see
//! docs/cuda.md).
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use quantfmt::cuda::testing::device_or_skip;
use quantfmt::cuda::{CudaDevice, CudaFormat, DeviceQuantized, DeviceTensor, quantize_device};
use quantfmt::fmt_int4tiled::Int4TiledTensorExt;
use quantfmt::fmt_int4tiled::cuda::{int4_linear_device, pack_device, unpack_device};
use quantfmt::parallel::{AmaxReducer, NoReduction};
use quantfmt::{
    DType, Direction, Format, Fp8BlockQuantizer, Fp8Quantizer, HostTensor, Int4TiledQuantizer,
    Mxfp8Quantizer, Nvfp4Quantizer, QuantizedTensor, Usage, dispatch_elements,
};

const USAGES: [Usage; 3] = [Usage::ROWWISE, Usage::COLUMNWISE, Usage::BOTH];
const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

fn dev(test: &str) -> Option<Arc<CudaDevice>> {
    device_or_skip(test).unwrap()
}

#[path = "support/special_input.rs"]
mod special_input;
use special_input::input;

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Bitwise equality of two dense tensors, any NaN equal to any NaN.
fn dense_diff(a: &HostTensor<'_>, b: &HostTensor<'_>) -> Option<String> {
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return Some(format!(
            "{:?} {} vs {:?} {}",
            a.dtype(),
            a.shape(),
            b.dtype(),
            b.shape()
        ));
    }
    let (x, y) = (a.to_f32_vec(), b.to_f32_vec());
    let (ba, bb) = (a.as_bytes(), b.as_bytes());
    let w = a.dtype().size();
    for i in 0..x.len() {
        let same =
            (x[i].is_nan() && y[i].is_nan()) || ba[i * w..(i + 1) * w] == bb[i * w..(i + 1) * w];
        if !same {
            return Some(format!("element {i}: cpu {} device {}", x[i], y[i]));
        }
    }
    None
}

#[derive(Default)]
struct Report {
    cases: usize,
    failures: Vec<String>,
}

impl Report {
    fn fail(&mut self, s: String) {
        if self.failures.len() < 40 {
            self.failures.push(s);
        } else if self.failures.len() == 40 {
            self.failures.push("...".into());
        }
    }
    fn finish(self, what: &str) {
        eprintln!(
            "{what}: {} cases checked, {} failures",
            self.cases,
            self.failures.len()
        );
        assert!(
            self.failures.is_empty(),
            "{what}:\n{}",
            self.failures.join("\n")
        );
        assert!(self.cases > 0, "{what}: no case ran");
    }
}

fn compare_storages<F: Format>(
    rep: &mut Report,
    case: &str,
    cpu: &QuantizedTensor<F>,
    gpu: &QuantizedTensor<F>,
) {
    for b in cpu.buffers() {
        let g = gpu.buffer(b.name()).unwrap();
        if let Some(i) = first_diff(b.bytes(), g.bytes()) {
            let lo = i.saturating_sub(4);
            let hi = (i + 4).min(b.bytes().len()).min(g.bytes().len());
            rep.fail(format!(
                "{case}: buffer {} differs at byte {i}: cpu {:02x?} device {:02x?}",
                b.name(),
                &b.bytes()[lo..hi],
                &g.bytes()[lo..hi.min(g.bytes().len())]
            ));
        }
    }
}

/// Quantizes `x` on both paths and compares everything; then dequantizes on both paths.
fn check<F: CudaFormat>(
    rep: &mut Report,
    d: &Arc<CudaDevice>,
    q: &F,
    x: &HostTensor<'_>,
    case: &str,
) {
    rep.cases += 1;
    let cpu = quantfmt::quantize(q, x);
    let dx = DeviceTensor::from_host(d, x).unwrap();
    let gpu = quantize_device(q, &dx);
    let (cpu, gpu) = match (cpu, gpu) {
        (Ok(c), Ok(g)) => (c, g),
        (Err(_), Err(_)) => return, // refused on both paths (e.g. rht with f32 input)
        (c, g) => {
            rep.fail(format!("{case}: cpu {:?} device {:?}", c.err(), g.err()));
            return;
        }
    };
    let back = match gpu.to_host() {
        Ok(b) => b,
        Err(e) => {
            rep.fail(format!("{case}: device storage does not rebuild: {e}"));
            return;
        }
    };
    compare_storages(rep, case, &cpu, &back);
    let from_cpu = DeviceQuantized::from_host(d, &cpu).unwrap();
    for dir in [Direction::Rowwise, Direction::Columnwise] {
        if !q.usage().has(dir) {
            continue;
        }
        for dt in DTYPES {
            let want = cpu.dequantize(dir, dt).unwrap();
            for (src, t) in [("device-made", &gpu), ("cpu-made", &from_cpu)] {
                let got = t.dequantize(dir, dt).unwrap().to_host().unwrap();
                if let Some(e) = dense_diff(&want, &got) {
                    rep.fail(format!("{case}: dequantize {dir} to {dt} ({src}): {e}"));
                }
            }
        }
    }
}

fn run_format<F: CudaFormat>(test: &str, specs: &[&str], shapes: &[&[usize]]) {
    let Some(d) = dev(test) else {
        return;
    };
    let mut rep = Report::default();
    for spec in specs {
        let opts: Vec<&str> = spec.split(',').filter(|s| !s.is_empty()).collect();
        for usage in USAGES {
            let Ok(q) = F::from_spec(&opts, usage) else {
                continue; // a combination the format refuses (e.g. row-scaled columnwise-only)
            };
            for (si, dims) in shapes.iter().enumerate() {
                let v = input(dims, (si as u64 + 1) * 7919 + spec.len() as u64);
                let x32 = HostTensor::f32(&v, dims).unwrap();
                for dt in DTYPES {
                    let x = x32.to_dtype(dt).unwrap();
                    let case = format!("{}:{spec} {usage} {dims:?} {dt}", F::NAME);
                    check(&mut rep, &d, &q, &x, &case);
                }
            }
        }
    }
    rep.finish(test);
}

const FP8_SHAPES: &[&[usize]] = &[
    &[1, 1],
    &[3, 5],
    &[2, 3, 7],
    &[67, 129],
    &[130, 257],
    &[256, 384],
    &[1, 1000],
    &[1000, 3],
];

#[test]
fn fp8_per_tensor_matches_cpu() {
    run_format::<Fp8Quantizer>(
        "fp8_per_tensor_matches_cpu",
        &["", "e5m2", "pow2", "e5m2,pow2", "eps=0.5", "eps=1e-30"],
        FP8_SHAPES,
    );
}

#[test]
fn fp8_block_matches_cpu() {
    run_format::<Fp8BlockQuantizer>(
        "fp8_block_matches_cpu",
        &[
            "128x128",
            "1x128",
            "1x128,fp32-scales",
            "128x128,fp32-scales,e5m2",
            "1x128,e5m2,eps=1e-3",
        ],
        FP8_SHAPES,
    );
}

#[test]
fn mxfp8_matches_cpu() {
    run_format::<Mxfp8Quantizer>(
        "mxfp8_matches_cpu",
        &[
            "",
            "e5m2",
            "2d",
            "ocp",
            "swizzled",
            "2d,swizzled",
            "ocp,e5m2,swizzled",
            "2d,ocp",
        ],
        &[
            &[32, 32],
            &[64, 96],
            &[96, 160],
            &[160, 224],
            &[2, 48, 256],
            &[288, 1056],
        ],
    );
}

#[test]
fn nvfp4_matches_cpu() {
    run_format::<Nvfp4Quantizer>(
        "nvfp4_matches_cpu",
        &[
            "",
            "2d",
            "rht",
            "sr",
            "sr,seed=12345678901",
            "2d,sr,seed=7",
            "row-scaled",
            "4over6",
            "4over6=mse",
            "4over6,2d",
            "4over6=mse,e4m3max=256",
            "swizzled",
            "2d,swizzled",
            "rht,sr,swizzled",
            "row-scaled,swizzled",
            "4over6,row-scaled",
        ],
        &[
            &[16, 16],
            &[48, 80],
            &[144, 272],
            &[2, 32, 64],
            &[272, 1040],
        ],
    );
}

/// A reducer that folds a fixed value into the amax, so the test sees that the reduced
/// value (not the local one) scales the tensor.
struct FoldIn(f32);

impl AmaxReducer for FoldIn {
    fn all_reduce_max(&self, values: &mut [f32]) -> quantfmt::Result<()> {
        for v in values {
            if self.0 > *v {
                *v = self.0;
            }
        }
        Ok(())
    }
    fn world_size(&self) -> usize {
        2
    }
}

fn check_reduced<F: CudaFormat>(
    rep: &mut Report,
    d: &Arc<CudaDevice>,
    q: &F,
    x: &HostTensor<'_>,
    r: &dyn AmaxReducer,
    case: &str,
) {
    rep.cases += 1;
    let cpu = Format::quantize_reduced(q, x, r);
    let dx = DeviceTensor::from_host(d, x).unwrap();
    let gpu = quantfmt::cuda::quantize_device_reduced(q, &dx, r);
    match (cpu, gpu) {
        (Ok(c), Ok(g)) => compare_storages(rep, case, &c, &g.to_host().unwrap()),
        (Err(_), Err(_)) => {}
        (c, g) => rep.fail(format!("{case}: cpu {:?} device {:?}", c.err(), g.err())),
    }
}

#[test]
fn amax_reduction_matches_cpu() {
    let Some(d) = dev("amax_reduction_matches_cpu") else {
        return;
    };
    let mut rep = Report::default();
    let v = input(&[64, 96], 3);
    let x32 = HostTensor::f32(&v, &[64, 96]).unwrap();
    for dt in DTYPES {
        let x = x32.to_dtype(dt).unwrap();
        for (name, r) in [
            ("none", &NoReduction as &dyn AmaxReducer),
            ("fold 1e4", &FoldIn(1e4)),
        ] {
            for spec in ["", "e5m2,pow2"] {
                let opts: Vec<&str> = spec.split(',').filter(|s| !s.is_empty()).collect();
                let q = Fp8Quantizer::from_spec(&opts, Usage::BOTH).unwrap();
                check_reduced(&mut rep, &d, &q, &x, r, &format!("fp8:{spec} {dt} {name}"));
            }
            for spec in ["", "rht", "2d", "row-scaled"] {
                for usage in [Usage::ROWWISE, Usage::BOTH] {
                    let opts: Vec<&str> = spec.split(',').filter(|s| !s.is_empty()).collect();
                    let q = Nvfp4Quantizer::from_spec(&opts, usage).unwrap();
                    check_reduced(
                        &mut rep,
                        &d,
                        &q,
                        &x,
                        r,
                        &format!("nvfp4:{spec} {usage} {dt} {name}"),
                    );
                }
            }
        }
        // Given amaxes (quantize_with_amax) on both paths.
        let q = Nvfp4Quantizer::new(Usage::BOTH);
        let dx = DeviceTensor::from_host(&d, &x).unwrap();
        let c = q.quantize_with_amax(&x, 300.0, 700.0).unwrap();
        let g = q
            .quantize_device_with_amax(&dx, 300.0, 700.0)
            .unwrap()
            .to_host()
            .unwrap();
        rep.cases += 1;
        compare_storages(&mut rep, &format!("nvfp4 with amax {dt}"), &c, &g);
        let q = Fp8Quantizer::new(Usage::BOTH);
        let c = q.quantize_with_amax(&x, 123.0).unwrap();
        let g = q
            .quantize_device_with_amax(&dx, 123.0)
            .unwrap()
            .to_host()
            .unwrap();
        rep.cases += 1;
        compare_storages(&mut rep, &format!("fp8 with amax {dt}"), &c, &g);
    }
    rep.finish("amax_reduction_matches_cpu");
}

/// The NCCL reducer on a single-rank communicator gives the bytes of the unreduced path.
#[cfg(feature = "nccl")]
#[test]
fn nccl_single_rank_reduction() {
    let Some(d) = dev("nccl_single_rank_reduction") else {
        return;
    };
    if !quantfmt::cuda::nccl_available() {
        eprintln!("SKIPPED nccl_single_rank_reduction: libnccl.so not found");
        assert!(
            std::env::var("QUANTFMT_REQUIRE_NCCL").is_err(),
            "QUANTFMT_REQUIRE_NCCL set but no NCCL"
        );
        return;
    }
    let r = quantfmt::cuda::NcclAmaxReducer::single(&d).unwrap();
    let mut v = [3.0f32, 1.5];
    r.all_reduce_max(&mut v).unwrap();
    assert_eq!(v, [3.0, 1.5]);
    let mut rep = Report::default();
    let v = input(&[64, 96], 9);
    let x = HostTensor::f32(&v, &[64, 96]).unwrap();
    check_reduced(
        &mut rep,
        &d,
        &Fp8Quantizer::new(Usage::BOTH),
        &x,
        &r,
        "fp8 nccl",
    );
    check_reduced(
        &mut rep,
        &d,
        &Nvfp4Quantizer::new(Usage::BOTH),
        &x,
        &r,
        "nvfp4 nccl",
    );
    rep.finish("nccl_single_rank_reduction");
}

/// Re-quantizing into an existing device storage (buffers cleared first) gives the same bytes.
#[test]
fn quantize_from_reuses_buffers() {
    let Some(d) = dev("quantize_from_reuses_buffers") else {
        return;
    };
    let v = input(&[64, 128], 11);
    let w = input(&[64, 128], 12);
    let x = HostTensor::f32(&v, &[64, 128]).unwrap();
    let y = HostTensor::f32(&w, &[64, 128]).unwrap();
    let q = Nvfp4Quantizer::new(Usage::BOTH);
    let mut t = quantize_device(&q, &DeviceTensor::from_host(&d, &x).unwrap()).unwrap();
    t.quantize_from(&DeviceTensor::from_host(&d, &y).unwrap())
        .unwrap();
    let mut rep = Report {
        cases: 1,
        ..Default::default()
    };
    compare_storages(
        &mut rep,
        "quantize_from",
        &q.quantize(&y).unwrap(),
        &t.to_host().unwrap(),
    );
    rep.finish("quantize_from_reuses_buffers");
}

#[test]
fn int4tiled_matches_cpu() {
    run_format::<Int4TiledQuantizer>(
        "int4tiled_matches_cpu",
        &[
            "g32",
            "g64,k4",
            "g128,k2",
            "g256",
            "g32,pad=torchao",
            "g64,eps=1e-6",
        ],
        &[&[8, 256], &[13, 256], &[2, 9, 256], &[24, 512], &[40, 1024]],
    );
}

/// Device pack/unpack equal the CPU's; the device matmul equals the f64 reference within
/// the exact-vs-bf16-weight and f32-summation tolerance, for m = 1, 3, 16, 17 (two launches),
/// with and without bias, f32/bf16/f16 activations.
#[test]
fn int4_pack_unpack_and_linear() {
    let Some(d) = dev("int4_pack_unpack_and_linear") else {
        return;
    };
    let mut rep = Report::default();
    for (spec, n, k) in [
        ("g32", 13usize, 256usize),
        ("g64,k4", 40, 512),
        ("g128", 24, 1024),
        ("g256,k2", 8, 512),
    ] {
        let opts: Vec<&str> = spec.split(',').collect();
        let q = Int4TiledQuantizer::from_spec(&opts, Usage::ROWWISE).unwrap();
        let wv: Vec<f32> = (0..n * k)
            .map(|i| ((i * 4793 % 2001) as f32 - 1000.0) / 700.0)
            .collect();
        let t = q.quantize(&HostTensor::f32(&wv, &[n, k]).unwrap()).unwrap();
        let dt_w = DeviceQuantized::from_host(&d, &t).unwrap();
        rep.cases += 1;
        let u = d.dtoh(&unpack_device(&dt_w).unwrap()).unwrap();
        if u != t.unpack().unwrap() {
            rep.fail(format!("int4tiled:{spec} unpack differs"));
        }
        let geo = t.geometry();
        let ud = d.htod(&u).unwrap();
        let packed = d.dtoh(&pack_device(&d, &ud, &geo).unwrap()).unwrap();
        if packed != t.buffer("packed_weight").unwrap().bytes() {
            rep.fail(format!("int4tiled:{spec} pack differs"));
        }
        let wd = t.dequantize_as::<f32>(Direction::Rowwise).unwrap();
        for m in [1usize, 3, 16, 17] {
            for dt in DTYPES {
                for with_bias in [false, true] {
                    rep.cases += 1;
                    let xv: Vec<f32> = (0..m * k)
                        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 250.0)
                        .collect();
                    let x = HostTensor::f32(&xv, &[m, k]).unwrap().to_dtype(dt).unwrap();
                    let bv: Vec<f32> = (0..n).map(|j| j as f32 * 0.125 - 1.0).collect();
                    let b = HostTensor::f32(&bv, &[n]).unwrap().to_dtype(dt).unwrap();
                    let dx = DeviceTensor::from_host(&d, &x).unwrap();
                    let db = DeviceTensor::from_host(&d, &b).unwrap();
                    let y = int4_linear_device(&dx, &dt_w, with_bias.then_some(&db))
                        .unwrap()
                        .to_host()
                        .unwrap();
                    let yv = y.to_f32_vec();
                    let (xs, bs) = (x.to_f32_vec(), b.to_f32_vec());
                    let reference = dispatch_elements!(x, |xx| {
                        let bb: Vec<_> = dispatch_elements!(b, |b2| b2
                            .iter()
                            .map(|v| quantfmt::Element::from_f32(quantfmt::Element::to_f32(*v)))
                            .collect());
                        quantfmt::fmt_int4tiled::int4_linear_reference(
                            xx,
                            m,
                            &t,
                            with_bias.then_some(&bb[..]),
                        )
                        .unwrap()
                    });
                    for i in 0..m * n {
                        let (r, j) = (i / n, i % n);
                        let absw: f64 = (0..k)
                            .map(|kk| {
                                f64::from(xs[r * k + kk]).abs() * f64::from(wd[j * k + kk]).abs()
                            })
                            .sum();
                        let tol = absw / 256.0 + reference[i].abs() / 256.0 + 1e-6;
                        if (f64::from(yv[i]) - reference[i]).abs() > tol {
                            rep.fail(format!(
                                "int4tiled:{spec} linear m={m} {dt} bias={with_bias}: y[{i}] = {} vs reference {} (bias {})",
                                yv[i], reference[i], if with_bias { bs[j] } else { 0.0 }
                            ));
                            break;
                        }
                    }
                }
            }
        }
    }
    rep.finish("int4_pack_unpack_and_linear");
}

/// Buffers swapped between storages of different shapes are refused before any launch
/// (kernels trust the buffer sizes).
#[test]
fn mismatched_buffers_are_refused() {
    let Some(d) = dev("mismatched_buffers_are_refused") else {
        return;
    };
    let (va, vb) = (input(&[64, 96], 1), input(&[32, 32], 2));
    let xa = DeviceTensor::from_host(&d, &HostTensor::f32(&va, &[64, 96]).unwrap()).unwrap();
    let xb = DeviceTensor::from_host(&d, &HostTensor::f32(&vb, &[32, 32]).unwrap()).unwrap();
    let q = Mxfp8Quantizer::new(Usage::BOTH);
    let mut a = quantize_device(&q, &xa).unwrap();
    let mut b = quantize_device(&q, &xb).unwrap();
    std::mem::swap(&mut a.buffers_mut()[0], &mut b.buffers_mut()[0]);
    let e = a
        .dequantize(Direction::Rowwise, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rowwise_data"), "{e}");
    assert!(a.quantize_from(&xa).is_err());
    assert!(b.dequantize(Direction::Rowwise, DType::F32).is_err());
}
