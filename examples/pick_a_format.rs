//! Pick a format at run time from a string, and under an error budget.
//!
//! ```text
//! cargo run --example pick_a_format                  # default budget 30 dB
//! cargo run --example pick_a_format -- 25 fp8:e5m2   # budget 25 dB, plus an extra candidate
//! cargo run --example pick_a_format -- 30 fp8:e3m4   # a bad spec: the error lists what is valid
//! ```
//!
//! The candidates are quantized in turn; the smallest one (bits per value) whose SQNR
//! meets the budget wins. Bad specs are reported with the library's error, which names
//! the valid formats or options.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use quantfmt::{FormatSpec, HostTensor, Quantizer, Storage, Usage};

fn sqnr_db(x: &[f32], y: &[f32]) -> f64 {
    let (mut s, mut n) = (0f64, 0f64);
    for (&a, &b) in x.iter().zip(y) {
        s += f64::from(a) * f64::from(a);
        n += (f64::from(a) - f64::from(b)).powi(2);
    }
    if n == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (s / n).log10()
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let budget: f64 = args
        .next()
        .map(|a| a.parse().expect("budget in dB"))
        .unwrap_or(30.0);
    let mut candidates: Vec<String> = [
        "int4tiled",
        "nvfp4",
        "nvfp4:2d",
        "mxfp8",
        "fp8",
        "fp8-block:1x128",
        "fp8-block:128x128",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    candidates.extend(args);

    // A weight-like tensor: Gaussian-ish bulk with one outlier column.
    let (n, k) = (256, 512);
    let w: Vec<f32> = (0..n * k)
        .map(|i| {
            let v = ((i as f32 * 0.618_034).fract() - 0.5) * 0.04;
            if i % k == 7 { v * 20.0 } else { v }
        })
        .collect();
    let x = HostTensor::f32(&w, &[n, k]).unwrap();

    let mut best: Option<(f64, String, f64)> = None;
    for c in &candidates {
        let q = match c
            .parse::<FormatSpec>()
            .and_then(|s| s.quantizer(Usage::ROWWISE))
        {
            Ok(q) => q,
            Err(e) => {
                println!("{c:<20} not available: {e}");
                continue;
            }
        };
        let stored = match q.quantize(&x) {
            Ok(s) => s,
            Err(e) => {
                println!("{c:<20} cannot take this tensor: {e}");
                continue;
            }
        };
        let db = sqnr_db(&w, &stored.dequantize_f32().unwrap());
        let bits = stored.bits_per_value();
        println!("{:<20} {bits:6.3} bits/value  SQNR {db:6.2} dB", q.spec());
        if db >= budget && best.as_ref().is_none_or(|b| bits < b.0) {
            best = Some((bits, q.spec(), db));
        }
    }
    match best {
        Some((bits, spec, db)) => {
            println!(
                "smallest format with SQNR >= {budget} dB: {spec} ({bits:.3} bits/value, {db:.2} dB)"
            )
        }
        None => println!("no candidate reaches {budget} dB"),
    }
}
