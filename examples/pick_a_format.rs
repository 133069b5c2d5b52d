//! Pick a format at run time from a string, and under an error budget, per tensor class.
//!
//! ```text
//! cargo run --example pick_a_format                  # default budget 30 dB
//! cargo run --example pick_a_format -- 25 fp8:e5m2   # budget 25 dB, plus an extra candidate
//! cargo run --example pick_a_format -- 30 fp8:e3m4   # a bad spec: the error lists what is valid
//! ```
//!
//! Three weight-like tensors stand for the tensor classes of a transformer layer
//! (attention, MLP with outlier input channels, heavy-tailed MoE experts; classified by
//! name with [`quantfmt::interop::TensorClass`]). Every candidate is quantized; for each
//! class, and for all tensors together, the smallest format (bits per value) whose SQNR
//! meets the budget wins. Bad specs are reported with the library's error, which names
//! the valid formats or options. `quantfmt compare --plot report.svg` does the same on a
//! real checkpoint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use quantfmt::interop::TensorClass;
use quantfmt::{FormatSpec, HostTensor, Quantizer, Storage, Usage};

fn sqnr_db(signal: f64, noise: f64) -> f64 {
    if noise == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (signal / noise).log10()
    }
}

/// A deterministic weight-like tensor: uniform-ish bulk, `outlier` boosts one input
/// column, `tail` cubes the values (heavier tails).
fn tensor(n: usize, k: usize, seed: f32, outlier: f32, tail: bool) -> Vec<f32> {
    (0..n * k)
        .map(|i| {
            let u = ((i as f32 * 0.618_034 + seed).fract() - 0.5) * 2.0;
            let v = if tail { u * u * u * 0.05 } else { u * 0.02 };
            if i % k == 7 { v * outlier } else { v }
        })
        .collect()
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

    let (n, k) = (256, 512);
    let weights = [
        (
            "layers.0.self_attn.q_proj.weight",
            tensor(n, k, 0.1, 1.0, false),
        ),
        (
            "layers.0.mlp.down_proj.weight",
            tensor(n, k, 0.3, 20.0, false),
        ),
        (
            "layers.0.mlp.experts.3.up_proj.weight",
            tensor(n, k, 0.7, 1.0, true),
        ),
    ];

    // (class, spec) -> (stored bytes, values, signal, noise); class None = all tensors.
    type Key = (Option<TensorClass>, String);
    let mut acc: BTreeMap<Key, (usize, usize, f64, f64)> = BTreeMap::new();
    let mut specs = Vec::new();
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
        specs.push(q.spec());
        for (name, w) in &weights {
            let x = HostTensor::f32(w, &[n, k]).unwrap();
            let stored = match q.quantize(&x) {
                Ok(s) => s,
                Err(e) => {
                    println!("{:<20} cannot take {name}: {e}", q.spec());
                    continue;
                }
            };
            let back = stored.dequantize_f32().unwrap();
            let signal: f64 = w.iter().map(|&a| f64::from(a).powi(2)).sum();
            let noise: f64 = w
                .iter()
                .zip(&back)
                .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
                .sum();
            for class in [Some(TensorClass::of(name)), None] {
                let e = acc.entry((class, q.spec())).or_default();
                e.0 += stored.nbytes();
                e.1 += w.len();
                e.2 += signal;
                e.3 += noise;
            }
        }
    }

    let classes = [
        Some(TensorClass::Attention),
        Some(TensorClass::Mlp),
        Some(TensorClass::Experts),
        None,
    ];
    for class in classes {
        let label = class.map_or("all tensors".to_string(), |c| format!("{c} tensors"));
        println!("{label}:");
        let mut best: Option<(f64, String, f64)> = None;
        for spec in &specs {
            let Some(&(bytes, values, signal, noise)) = acc.get(&(class, spec.clone())) else {
                continue;
            };
            let bits = bytes as f64 * 8.0 / values as f64;
            let db = sqnr_db(signal, noise);
            println!("  {spec:<20} {bits:6.3} bits/value  SQNR {db:6.2} dB");
            if db >= budget && best.as_ref().is_none_or(|b| bits < b.0) {
                best = Some((bits, spec.clone(), db));
            }
        }
        match best {
            Some((bits, spec, db)) => println!(
                "  smallest format with SQNR >= {budget} dB: {spec} ({bits:.3} bits/value, {db:.2} dB)"
            ),
            None => println!("  no candidate reaches {budget} dB"),
        }
    }
}
