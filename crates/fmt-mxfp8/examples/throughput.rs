//! Rough CPU throughput of MXFP8 quantize / dequantize (release build):
//! `cargo run --release -p fmt-mxfp8 --example throughput [M K]`.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use fmt_mxfp8::{Mxfp8Quantizer, ScaleLayout};
use quant_core::half::bf16;
use quant_core::{Direction, HostTensor, Usage};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (m, k) = match args[..] {
        [m, k] => (m, k),
        _ => (4096, 4096),
    };
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i.wrapping_mul(2_654_435_761) % 20_011) as f32 - 10_005.0) / 977.0)
        .collect();
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    println!("[{m}, {k}], {} threads", rayon::current_num_threads());
    for layout in [ScaleLayout::Compact, ScaleLayout::Swizzled] {
        for (usage, name) in [
            (Usage::ROWWISE, "rowwise"),
            (Usage::COLUMNWISE, "columnwise"),
            (Usage::BOTH, "both"),
        ] {
            let q = Mxfp8Quantizer::new(usage).with_scale_layout(layout);
            for (label, t) in [
                ("f32 ", HostTensor::f32(&x, &[m, k]).unwrap()),
                ("bf16", HostTensor::bf16(&xb, &[m, k]).unwrap()),
            ] {
                let _ = q.quantize(&t).unwrap(); // warm up
                let n = 3;
                let start = Instant::now();
                for _ in 0..n {
                    std::hint::black_box(q.quantize(&t).unwrap());
                }
                let s = start.elapsed().as_secs_f64() / f64::from(n);
                let gbs = (t.as_bytes().len() as f64) / s / 1e9;
                println!(
                    "quantize {label} {name:10} {layout:?}: {:7.2} ms  ({gbs:.2} GB/s of input)",
                    s * 1e3
                );
            }
        }
    }
    let t = Mxfp8Quantizer::new(Usage::BOTH)
        .quantize(&HostTensor::f32(&x, &[m, k]).unwrap())
        .unwrap();
    for dir in [Direction::Rowwise, Direction::Columnwise] {
        let start = Instant::now();
        let out = t.dequantize_as::<bf16>(dir).unwrap();
        std::hint::black_box(out);
        println!(
            "dequantize {dir} -> bf16: {:7.2} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
    }
}
