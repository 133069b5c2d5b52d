//! quant-core on a GPU: the shared header's codecs against `quant_core::codec` and `half`,
//! the amax kernels against the CPU folds, device tensors round-tripping. Every test skips
//! with a printed reason when there is no CUDA device (and fails instead with
//! `QUANTFMT_REQUIRE_GPU=1`, which the GPU-machine run sets).
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use half::{bf16, f16};
use quant_core::codec::{e2m1, e4m3, e5m2, e8m0};
use quant_core::cuda::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use quant_core::cuda::testing::device_or_skip;
use quant_core::cuda::{CudaDevice, DeviceTensor, SELFTEST_KERNELS, kernels};
use quant_core::{DType, Element, HostTensor, Shape};
use quantfmt_testkit::{XorShift32, XorShift64};

fn dev(test: &str) -> Option<Arc<CudaDevice>> {
    device_or_skip(test).unwrap()
}

fn zeros<
    T: quant_core::cuda::cudarc::driver::DeviceRepr
        + quant_core::cuda::cudarc::driver::ValidAsZeroBits,
>(
    d: &CudaDevice,
    n: usize,
) -> CudaSlice<T> {
    d.stream().alloc_zeros::<T>(n).unwrap()
}

fn cfg(n: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).min(65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Every encoder of the shared header equals its Rust twin on a stride-257 sweep of all f32
/// bit patterns (16.7M values: every exponent, sign and NaN class) plus the first 2^20
/// patterns after each interesting boundary.
#[test]
fn device_encoders_match_cpu_codecs() {
    let Some(d) = dev("device_encoders_match_cpu_codecs") else {
        return;
    };
    let f = d.function(&SELFTEST_KERNELS, "qf_selftest_encode").unwrap();
    let sweeps: Vec<(u32, u32, u64)> = vec![
        (0, 257, 1 << 24),
        (0x3E80_0000, 1, 1 << 20), // around 0.25 .. (E2M1 thresholds)
        (0x43E0_0000 - (1 << 19), 1, 1 << 20), // around 448
        (0x4760_0000 - (1 << 19), 1, 1 << 20), // around 57344
        (0x7F7F_0000, 1, 1 << 20), // near f32::MAX, inf, NaN
        (0x8000_0000, 1, 1 << 20), // -0 and negative subnormals
    ];
    for (start, step, n) in sweeps {
        let nn = n as usize;
        let mut outs: Vec<CudaSlice<u8>> = (0..7).map(|_| zeros::<u8>(&d, nn)).collect();
        let mut bf: CudaSlice<u16> = zeros(&d, nn);
        let mut hf: CudaSlice<u16> = zeros(&d, nn);
        {
            let (a, rest) = outs.split_at_mut(1);
            let (b, rest) = rest.split_at_mut(1);
            let (c, rest) = rest.split_at_mut(1);
            let (e, rest) = rest.split_at_mut(1);
            let (g, rest) = rest.split_at_mut(1);
            let (h, i) = rest.split_at_mut(1);
            let mut l = d.stream().launch_builder(&f);
            l.arg(&start)
                .arg(&step)
                .arg(&n)
                .arg(&mut a[0])
                .arg(&mut b[0])
                .arg(&mut c[0])
                .arg(&mut e[0])
                .arg(&mut g[0])
                .arg(&mut bf)
                .arg(&mut hf)
                .arg(&mut h[0])
                .arg(&mut i[0]);
            // SAFETY: qf_selftest_encode(u32, u32, u64 n, 7 x u8*, u16*, u16*, 2 x u8*)
            // with every output holding n elements.
            unsafe { l.launch(cfg(n)) }.unwrap();
        }
        let host: Vec<Vec<u8>> = outs.iter().map(|o| d.dtoh(o).unwrap()).collect();
        let bf = d.stream().clone_dtoh(&bf).unwrap();
        let hf = d.stream().clone_dtoh(&hf).unwrap();
        for i in 0..nn {
            let bits = start.wrapping_add((i as u32).wrapping_mul(step));
            let x = f32::from_bits(bits);
            assert_eq!(host[0][i], e4m3::encode(x), "e4m3 {bits:#010x}");
            assert_eq!(host[1][i], e5m2::encode(x), "e5m2 {bits:#010x}");
            assert_eq!(host[2][i], e2m1::encode(x), "e2m1 {bits:#010x}");
            assert_eq!(host[3][i], e8m0::from_f32_ceil(x), "e8m0 ceil {bits:#010x}");
            assert_eq!(
                host[4][i],
                e8m0::from_f32_floor(x),
                "e8m0 floor {bits:#010x}"
            );
            assert_eq!(host[5][i], e4m3::encode(x), "e4m3 (dt) {bits:#010x}");
            assert_eq!(host[6][i], e5m2::encode(x), "e5m2 (dt) {bits:#010x}");
            assert_eq!(bf[i], bf16::from_f32(x).to_bits(), "bf16 {bits:#010x}");
            let want = f16::from_f32(x);
            if want.is_nan() {
                assert!(f16::from_bits(hf[i]).is_nan(), "f16 NaN {bits:#010x}");
            } else {
                assert_eq!(hf[i], want.to_bits(), "f16 {bits:#010x}");
            }
        }
    }
}

#[test]
fn device_decoders_match_cpu_tables() {
    let Some(d) = dev("device_decoders_match_cpu_tables") else {
        return;
    };
    let f = d.function(&SELFTEST_KERNELS, "qf_selftest_decode").unwrap();
    let mut o: Vec<CudaSlice<f32>> = (0..7).map(|_| zeros::<f32>(&d, 256)).collect();
    {
        let mut l = d.stream().launch_builder(&f);
        for s in o.iter_mut() {
            l.arg(s);
        }
        // SAFETY: qf_selftest_decode(7 x float*), each output holds 256 floats.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .unwrap();
    }
    let h: Vec<Vec<f32>> = o
        .iter()
        .map(|s| d.stream().clone_dtoh(s).unwrap())
        .collect();
    for c in 0..=255u8 {
        let i = usize::from(c);
        assert_eq!(
            h[0][i].to_bits(),
            e4m3::decode(c).to_bits(),
            "e4m3 {c:#04x}"
        );
        assert_eq!(
            h[1][i].to_bits(),
            e5m2::decode(c).to_bits(),
            "e5m2 {c:#04x}"
        );
        assert_eq!(
            h[2][i].to_bits(),
            e4m3::decode(c).to_bits(),
            "e4m3 dt {c:#04x}"
        );
        assert_eq!(
            h[3][i].to_bits(),
            e5m2::decode(c).to_bits(),
            "e5m2 dt {c:#04x}"
        );
        if c < 16 {
            assert_eq!(h[4][i].to_bits(), e2m1::decode(c).to_bits(), "e2m1 {c}");
        }
        assert_eq!(h[5][i].to_bits(), e8m0::decode(c).to_bits(), "e8m0 {c}");
        assert_eq!(
            h[6][i].to_bits(),
            e8m0::exp2_rcp(c).to_bits(),
            "e8m0 rcp {c}"
        );
    }
}

/// f64 -> f32/bf16/f16 as `Element::from_f64` rounds (once: round-to-odd through f32), and
/// bf16/f16 widening, on random and boundary values.
#[test]
fn device_conversions_match_element() {
    let Some(d) = dev("device_conversions_match_element") else {
        return;
    };
    let mut vals: Vec<f64> = Vec::new();
    let mut rng = XorShift64::new(0x9E37_79B9_7F4A_7C15);
    for _ in 0..(1 << 20) {
        let s = rng.next_u64();
        let v = f64::from_bits(s);
        vals.push(if v.is_finite() && v.abs() < 1e6 {
            v
        } else {
            (s >> 11) as f64 * 1e-12 - 4e3
        });
    }
    // Ties and near-ties for bf16 and f16, also nudged by f64-only amounts.
    for k in 0..4096u64 {
        let base = 1.0 + (k as f64) / 128.0;
        vals.push(base + 1.0 / 256.0);
        vals.push(f64::from_bits((base + 1.0 / 256.0).to_bits() + 1));
        vals.push(f64::from_bits((base + 1.0 / 256.0).to_bits() - 1));
        vals.push(1.0 + (k as f64) / 1024.0 + 1.0 / 2048.0);
    }
    vals.extend([
        0.0,
        -0.0,
        f64::INFINITY,
        -f64::INFINITY,
        1e-300,
        -1e-300,
        65520.0,
        65519.99,
        3.4e38,
        3.5e38,
    ]);
    let n = vals.len();
    let hin: Vec<u16> = (0..n).map(|i| (i as u16).wrapping_mul(40503)).collect();
    let din = d.stream().clone_htod(&vals).unwrap();
    let hdev = d.stream().clone_htod(&hin).unwrap();
    let mut f32o: CudaSlice<f32> = zeros(&d, n);
    let mut bfo: CudaSlice<u16> = zeros(&d, n);
    let mut hfo: CudaSlice<u16> = zeros(&d, n);
    let mut bw: CudaSlice<f32> = zeros(&d, n);
    let mut hw: CudaSlice<f32> = zeros(&d, n);
    let f = d
        .function(&SELFTEST_KERNELS, "qf_selftest_convert")
        .unwrap();
    let nn = n as u64;
    {
        let mut l = d.stream().launch_builder(&f);
        l.arg(&din)
            .arg(&nn)
            .arg(&mut f32o)
            .arg(&mut bfo)
            .arg(&mut hfo)
            .arg(&hdev)
            .arg(&mut bw)
            .arg(&mut hw);
        // SAFETY: qf_selftest_convert(const double*, u64 n, float*, u16*, u16*, const u16*,
        // float*, float*), every buffer n elements.
        unsafe { l.launch(cfg(nn)) }.unwrap();
    }
    let f32o = d.stream().clone_dtoh(&f32o).unwrap();
    let bfo = d.stream().clone_dtoh(&bfo).unwrap();
    let hfo = d.stream().clone_dtoh(&hfo).unwrap();
    let bw = d.stream().clone_dtoh(&bw).unwrap();
    let hw = d.stream().clone_dtoh(&hw).unwrap();
    for (i, &v) in vals.iter().enumerate() {
        assert_eq!(f32o[i].to_bits(), (v as f32).to_bits(), "f32 {v:e}");
        assert_eq!(
            bfo[i],
            <bf16 as Element>::from_f64(v).to_bits(),
            "bf16 {v:e}"
        );
        assert_eq!(hfo[i], <f16 as Element>::from_f64(v).to_bits(), "f16 {v:e}");
        let b = bf16::from_bits(hin[i]).to_f32();
        let h = f16::from_bits(hin[i]).to_f32();
        if b.is_nan() {
            assert!(bw[i].is_nan());
        } else {
            assert_eq!(bw[i].to_bits(), b.to_bits());
        }
        if h.is_nan() {
            assert!(hw[i].is_nan());
        } else {
            assert_eq!(hw[i].to_bits(), h.to_bits());
        }
    }
}

#[test]
fn device_swizzle_matches_layout() {
    let Some(d) = dev("device_swizzle_matches_layout") else {
        return;
    };
    let (rows, cols) = (384u64, 12u64);
    let mut out: CudaSlice<u64> = zeros(&d, (rows * cols) as usize);
    let f = d
        .function(&SELFTEST_KERNELS, "qf_selftest_swizzle")
        .unwrap();
    {
        let mut l = d.stream().launch_builder(&f);
        l.arg(&rows).arg(&cols).arg(&mut out);
        // SAFETY: qf_selftest_swizzle(u64 rows, u64 cols, u64* out[rows * cols]).
        unsafe { l.launch(cfg(rows * cols)) }.unwrap();
    }
    let out = d.stream().clone_dtoh(&out).unwrap();
    for i in 0..rows as usize {
        for j in 0..cols as usize {
            assert_eq!(
                out[i * cols as usize + j] as usize,
                quant_core::layout::swizzled_index(i, j, cols as usize)
            );
        }
    }
}

fn ragged_input(n: usize, seed: u32) -> Vec<f32> {
    let mut rng = XorShift32::new(seed.wrapping_mul(2_654_435_761).max(1));
    (0..n)
        .map(|i| {
            let s = rng.next_u32();
            match i % 97 {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                2 => -0.0,
                3 => f32::from_bits(1),
                _ => (s as f32 / u32::MAX as f32 - 0.5) * 1000.0,
            }
        })
        .collect()
}

fn amax_cpu(xs: impl IntoIterator<Item = f32>) -> f32 {
    xs.into_iter()
        .fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m })
}

#[test]
fn amax_kernels_match_cpu_folds() {
    let Some(d) = dev("amax_kernels_match_cpu_folds") else {
        return;
    };
    for (m, k) in [(1, 1), (3, 5), (129, 77), (1000, 1001), (64, 4096)] {
        let x = ragged_input(m * k, (m * 31 + k) as u32);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let h = HostTensor::f32(&x, &[m, k])
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let xs = h.to_f32_vec();
            let t = DeviceTensor::from_host(&d, &h).unwrap();
            let mut a = d.alloc_zeros(4).unwrap();
            kernels::tensor_amax(&t, &mut a).unwrap();
            let got = f32::from_le_bytes(d.dtoh(&a).unwrap().try_into().unwrap());
            assert_eq!(
                got.to_bits(),
                amax_cpu(xs.iter().copied()).to_bits(),
                "{dtype} {m}x{k}"
            );
            let mut r = d.alloc_zeros(4 * m).unwrap();
            kernels::row_amax(&t, m, k, &mut r).unwrap();
            let r = d.dtoh(&r).unwrap();
            for i in 0..m {
                let want = amax_cpu(xs[i * k..(i + 1) * k].iter().copied());
                let got = f32::from_le_bytes(r[4 * i..4 * i + 4].try_into().unwrap());
                assert_eq!(got.to_bits(), want.to_bits(), "row {i}");
            }
            let mut c = d.alloc_zeros(4 * k).unwrap();
            kernels::col_amax(&t, m, k, &mut c).unwrap();
            let c = d.dtoh(&c).unwrap();
            for j in 0..k {
                let want = amax_cpu((0..m).map(|i| xs[i * k + j]));
                let got = f32::from_le_bytes(c[4 * j..4 * j + 4].try_into().unwrap());
                assert_eq!(got.to_bits(), want.to_bits(), "col {j}");
            }
        }
    }
}

#[test]
fn device_tensors_round_trip() {
    let Some(d) = dev("device_tensors_round_trip") else {
        return;
    };
    let x = ragged_input(3 * 7, 5);
    let h = HostTensor::f32(&x, &[3, 7])
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let t = DeviceTensor::from_host(&d, &h).unwrap();
    assert_eq!(t.to_host().unwrap().as_bytes(), h.as_bytes());
    let z = DeviceTensor::zeros(&d, &Shape::new(&[2, 2]).unwrap(), DType::F16).unwrap();
    assert_eq!(z.to_host().unwrap().as_bytes(), &[0u8; 8]);
    assert!(DeviceTensor::zeros(&d, &Shape::new(&[0, 2]).unwrap(), DType::F16).is_err());
    assert!(DeviceTensor::zeros(&d, &Shape::new(&[2]).unwrap(), DType::U8).is_err());
}

/// Without a device every entry point returns an error instead of panicking (this runs
/// everywhere; on a GPU machine it checks an out-of-range ordinal).
#[test]
fn missing_device_is_an_error_not_a_panic() {
    match quant_core::cuda::device_count() {
        Ok(n) => assert!(CudaDevice::new(n + 7).is_err()),
        Err(e) => {
            assert!(e.to_string().starts_with("cuda: "), "{e}");
            assert!(CudaDevice::new(0).is_err());
            assert!(CudaDevice::shared(0).is_err());
        }
    }
}
