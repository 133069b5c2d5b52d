//! A framework-side view: layers hold weights of mixed formats behind trait objects.
//!
//! A downstream framework does not know at compile time which format each layer uses
//! (it comes from a checkpoint or a config). It keeps `Arc<dyn Storage>` weights and
//! `Box<dyn Quantizer>` recipes, plans memory from data-free prototypes, and falls back to
//! dequantized weights on the CPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use quantfmt::{DType, FormatSpec, HostTensor, Quantizer, Storage, TensorProto, Usage};

/// A linear layer with a quantized weight of any format.
struct Linear {
    name: String,
    weight: Arc<dyn Storage>,
}

impl Linear {
    /// `y = x W^T` with the weight dequantized on the fly (the CPU fallback path).
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let (n, k) = self.weight.shape().as_2d();
        let w = self.weight.dequantize_f32().expect("dequantize");
        (0..n)
            .map(|i| (0..k).map(|j| w[i * k + j] * x[j]).sum())
            .collect()
    }
}

fn main() {
    let recipes: Vec<Box<dyn Quantizer>> = ["fp8", "fp8-block:1x128", "fp8-block:128x128"]
        .iter()
        .map(|s| {
            s.parse::<FormatSpec>()
                .unwrap()
                .boxed(Usage::ROWWISE)
                .unwrap()
        })
        .collect();

    // Plan before allocating: bytes per layer from prototypes, no data touched.
    for q in &recipes {
        let proto = TensorProto::new(&[4096, 4096], DType::BF16, q.as_ref()).unwrap();
        println!(
            "{:<20} 4096x4096 bf16 weight -> {} bytes",
            q.spec(),
            proto.nbytes().unwrap()
        );
    }

    let (n, k) = (64, 256);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 31 % 97) as f32 - 48.0) / 100.0)
        .collect();
    let x_in: Vec<f32> = (0..k).map(|i| (i as f32 / k as f32) - 0.5).collect();
    let layers: Vec<Linear> = recipes
        .iter()
        .enumerate()
        .map(|(i, q)| Linear {
            name: format!("layer{i} ({})", q.spec()),
            weight: Arc::from(q.quantize(&HostTensor::f32(&w, &[n, k]).unwrap()).unwrap()),
        })
        .collect();

    let exact: Vec<f32> = (0..n)
        .map(|i| (0..k).map(|j| w[i * k + j] * x_in[j]).sum())
        .collect();
    for l in &layers {
        let y = l.forward(&x_in);
        let err = y
            .iter()
            .zip(&exact)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        println!(
            "{:<30} {:>6} bytes  max |y - y_exact| = {err:.4}",
            l.name,
            l.weight.nbytes()
        );
    }
}
