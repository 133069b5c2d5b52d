//! Shared criterion harness for the format crates' throughput benches (each crate's
//! `benches/throughput.rs` includes this file with `#[path]`, so the harness is written
//! once and every crate benches its own concrete types with static dispatch).
//!
//! For each input dtype (f32, bf16) it times, in one criterion group:
//! - `roofline quantize`: [`quant_core::cpu::roofline`] moving the bytes quantize must
//!   move (the input read `input_passes` times, the buffers written once);
//! - `quantize`: re-quantizing into the same storage (`quantize_from`, no allocation);
//! - `roofline dequantize` and `dequantize`: the buffers read, the output written, into
//!   caller memory reused across iterations.
//!
//! Every large buffer (input, output, roofline) is a [`HostBytes`], allocated as a
//! storage's buffers are (huge pages where `quant_core::pages` gets them), as in
//! `quantfmt bench`. Throughput is input bytes for quantize and output bytes for
//! dequantize, as there; divide the two GB/s of a pair for the ratio to the roofline.
//! Shape: `QUANTFMT_BENCH_SHAPE=MxK` (default 8192x8192); threads: `RAYON_NUM_THREADS`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use half::bf16;
use quant_core::{DType, Direction, Element, Format, HostBytes, HostTensor, quantize};
use quantfmt_testkit::XorShift64;

/// `[M, K]` from `QUANTFMT_BENCH_SHAPE`, default 8192x8192.
fn shape() -> [usize; 2] {
    std::env::var("QUANTFMT_BENCH_SHAPE")
        .ok()
        .and_then(|s| {
            let (m, k) = s
                .to_lowercase()
                .split_once('x')
                .map(|(a, b)| (a.to_string(), b.to_string()))?;
            Some([m.parse().ok()?, k.parse().ok()?])
        })
        .unwrap_or([8192, 8192])
}

/// Deterministic weight-like data in [-2, 2).
fn data(n: usize) -> Vec<f32> {
    let mut rng = XorShift64::new(0x2545_F491_4F6C_DD1D);
    (0..n).map(|_| (rng.next_f32() - 0.5) * 4.0).collect()
}

/// Benches quantize and dequantize of `q` (labelled `label`) against the same-run
/// roofline, for f32 and bf16 input. A dtype the format refuses (e.g. RHT on f32) is
/// skipped with a message.
pub fn bench_format<F: Format>(c: &mut Criterion, label: &str, q: &F) {
    let [m, k] = shape();
    let base = data(m * k);
    for dtype in [DType::F32, DType::BF16] {
        let x_bytes = HostTensor::f32(&base, &[m, k])
            .and_then(|t| t.to_dtype(dtype))
            .map(|t| HostBytes::copy_from(t.as_bytes()))
            .expect("bench input");
        let x = HostTensor::from_le_bytes(dtype, x_bytes.as_slice(), &[m, k]).expect("bench input");
        let mut t = match quantize(q, &x) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("skipping {label} on {dtype}: {e}");
                continue;
            }
        };
        let in_bytes = x.as_bytes().len();
        let out_bytes = t.nbytes();
        let mut g = c.benchmark_group(format!("{label}/{dtype}/{m}x{k}"));
        g.sample_size(10).measurement_time(Duration::from_secs(4));

        g.throughput(Throughput::Bytes(in_bytes as u64));
        let mut dst = HostBytes::zeroed(out_bytes);
        g.bench_function("roofline quantize", |b| {
            b.iter(|| quant_core::cpu::roofline(x.as_bytes(), dst.as_mut_slice(), q.input_passes()))
        });
        g.bench_function("quantize", |b| {
            b.iter(|| t.quantize_from(black_box(&x)).expect("quantize"))
        });

        let dir = t.usage().preferred().unwrap_or(Direction::Rowwise);
        let bufs: Vec<u8> = t
            .buffers()
            .iter()
            .flat_map(|b| b.bytes().to_vec())
            .collect();
        let bufs = HostBytes::copy_from(&bufs);
        // Dequantize writes the input's dtype and shape, so its output bytes are `in_bytes`
        // and the group's throughput setting holds for it too.
        let mut out = HostBytes::zeroed(in_bytes);
        g.bench_function("roofline dequantize", |b| {
            b.iter(|| quant_core::cpu::roofline(bufs.as_slice(), out.as_mut_slice(), 1))
        });
        match dtype {
            DType::F32 => dequantize_into::<F, f32>(&mut g, &t, dir, m * k),
            _ => dequantize_into::<F, bf16>(&mut g, &t, dir, m * k),
        }
        g.finish();
    }
}

fn dequantize_into<F: Format, T: Element + bytemuck::Pod>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    t: &quant_core::QuantizedTensor<F>,
    dir: Direction,
    n: usize,
) {
    let mut out = HostBytes::zeroed(n * std::mem::size_of::<T>());
    let out: &mut [T] = bytemuck::cast_slice_mut(out.as_mut_slice());
    g.bench_function("dequantize", |b| {
        b.iter(|| {
            t.dequantize_into(dir, black_box(&mut *out))
                .expect("dequantize")
        })
    });
}
