//! `int4_linear` against a plain multi-threaded bf16 matmul of the same shape.
//!
//! Shapes: W = [n, k] = [4096, 4096] and [4096, 11008] (nn.Linear weights), activations
//! [m, k] bf16 with m = 1, 4, 16, 64. Both kernels take bf16 activations and return bf16,
//! so conversions are timed on both sides. After the criterion groups, a short pass of
//! interleaved runs prints a table with the int4 / bf16 time ratio (minimum times).
//!
//! `cargo bench -p fmt-int4tiled --bench int4_linear` (add `-- --quick` for one short run;
//! set `INT4_BENCH_NO_SUMMARY=1` to skip the ratio table, e.g. when profiling).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fmt_int4tiled::{Int4TiledQuantizer, Int4TiledTensor, int4_linear_slice};
use half::bf16;
use quant_core::HostTensor;
use quantfmt_testkit::XorShift64;
use rayon::prelude::*;

const SHAPES: [(usize, usize); 2] = [(4096, 4096), (4096, 11008)];
const MS: [usize; 4] = [1, 4, 16, 64];

fn rand_bf16(len: usize, seed: u64) -> Vec<bf16> {
    let mut rng = XorShift64::scrambled(seed);
    (0..len)
        .map(|_| bf16::from_f32((rng.next_f32() - 0.5) * 0.2))
        .collect()
}

/// The baseline: y = x W^T with bf16 W [n, k], f32 accumulation, rayon over blocks of rows
/// of W, each row widened to f32 once and dotted with every activation row (8 lanes).
fn bf16_linear(x: &[bf16], m: usize, w: &[bf16], n: usize, k: usize) -> Vec<bf16> {
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let mut yt = vec![0f32; n * m];
    yt.par_chunks_mut(32 * m)
        .enumerate()
        .for_each(|(blk, out)| {
            let mut wf = vec![0f32; k];
            for (r, orow) in out.chunks_mut(m).enumerate() {
                let j = blk * 32 + r;
                for (d, s) in wf.iter_mut().zip(&w[j * k..][..k]) {
                    *d = s.to_f32();
                }
                for (mi, o) in orow.iter_mut().enumerate() {
                    let xr = &xf[mi * k..][..k];
                    let mut acc = [0f32; 8];
                    for (a, b) in xr.chunks_exact(8).zip(wf.chunks_exact(8)) {
                        for l in 0..8 {
                            acc[l] += a[l] * b[l];
                        }
                    }
                    let tail: f32 = xr
                        .chunks_exact(8)
                        .remainder()
                        .iter()
                        .zip(wf.chunks_exact(8).remainder())
                        .map(|(a, b)| a * b)
                        .sum();
                    *o = acc.iter().sum::<f32>() + tail;
                }
            }
        });
    let mut y = vec![bf16::ZERO; m * n];
    for (mi, yrow) in y.chunks_mut(n).enumerate() {
        for (j, o) in yrow.iter_mut().enumerate() {
            *o = bf16::from_f32(yt[j * m + mi]);
        }
    }
    y
}

struct Case {
    n: usize,
    k: usize,
    w: Vec<bf16>,
    q: Int4TiledTensor,
}

fn cases() -> Vec<Case> {
    SHAPES
        .iter()
        .map(|&(n, k)| {
            let w = rand_bf16(n * k, (n + k) as u64);
            let q = Int4TiledQuantizer::new()
                .quantize(&HostTensor::bf16(&w, &[n, k]).unwrap())
                .unwrap();
            Case { n, k, w, q }
        })
        .collect()
}

/// Runs `a` and `b` alternately `iters` times each (after one warm-up of each) and returns
/// their minimum times: interleaving and the minimum keep the comparison fair on a shared,
/// noisy machine.
fn min_times(mut a: impl FnMut(), mut b: impl FnMut(), iters: usize) -> (Duration, Duration) {
    a();
    b();
    let (mut ta, mut tb) = (Duration::MAX, Duration::MAX);
    for _ in 0..iters {
        let s = Instant::now();
        a();
        ta = ta.min(s.elapsed());
        let s = Instant::now();
        b();
        tb = tb.min(s.elapsed());
    }
    (ta, tb)
}

fn bench(c: &mut Criterion) {
    let cases = cases();
    for case in &cases {
        let (n, k) = (case.n, case.k);
        let mut group = c.benchmark_group(format!("linear_{n}x{k}"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1));
        for m in MS {
            let x = rand_bf16(m * k, m as u64);
            group.throughput(Throughput::Elements((m * n * k) as u64));
            group.bench_with_input(BenchmarkId::new("int4", m), &m, |b, &m| {
                b.iter(|| int4_linear_slice(black_box(&x), m, &case.q, None).unwrap())
            });
            group.bench_with_input(BenchmarkId::new("bf16", m), &m, |b, &m| {
                b.iter(|| bf16_linear(black_box(&x), m, &case.w, n, k))
            });
        }
        group.finish();
    }

    if std::env::var_os("INT4_BENCH_NO_SUMMARY").is_some() {
        return;
    }
    eprintln!(
        "\nint4_linear vs bf16 matmul ({} rayon threads), minimum of 7 interleaved runs:",
        rayon::current_num_threads()
    );
    eprintln!(
        "{:>12} {:>4} {:>12} {:>12} {:>8}",
        "W [n, k]", "m", "int4", "bf16", "ratio"
    );
    for case in &cases {
        let (n, k) = (case.n, case.k);
        for m in MS {
            let x = rand_bf16(m * k, m as u64);
            let (ti, tb) = min_times(
                || {
                    black_box(int4_linear_slice(&x, m, &case.q, None).unwrap());
                },
                || {
                    black_box(bf16_linear(&x, m, &case.w, n, k));
                },
                7,
            );
            eprintln!(
                "{:>12} {:>4} {:>12.3?} {:>12.3?} {:>8.2}",
                format!("{n}x{k}"),
                m,
                ti,
                tb,
                ti.as_secs_f64() / tb.as_secs_f64()
            );
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
