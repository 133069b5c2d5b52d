//! Quantize the activations routed to 8 MoE experts as one grouped tensor.
//!
//! Each expert receives a different number of tokens, so the members vary in their first
//! dimension (`[tokens_i, hidden]`). All members live in one allocation per buffer kind
//! (TransformerEngine's `GroupedTensor` layout), are quantized in one parallel pass, and
//! come out as zero-copy views that behave like any storage.
//!
//! ```text
//! cargo run --example grouped_moe                 # fp8-block:1x128 (the activation recipe)
//! cargo run --example grouped_moe -- fp8          # any format spec
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use quantfmt::{FormatSpec, HostTensor, Quantizer, Shape, Usage};

fn main() {
    let arg = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "fp8-block:1x128".into());
    let spec: FormatSpec = match arg.parse() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let q = spec.quantizer(Usage::BOTH).expect("quantizer");
    let hidden = 512;
    // Token counts per expert after routing (multiples of 128 keep every format happy).
    let tokens = [256usize, 128, 384, 128, 512, 256, 128, 256];
    let shapes: Vec<Shape> = tokens
        .iter()
        .map(|&t| Shape::new(&[t, hidden]).unwrap())
        .collect();
    let total: usize = tokens.iter().sum::<usize>() * hidden;
    let acts: Vec<f32> = (0..total)
        .map(|i| {
            ((i as f32 * 0.754_877_7).fract() - 0.5) * if i % hidden == 5 { 30.0 } else { 1.0 }
        })
        .collect();
    let x = HostTensor::f32(&acts, &[total]).unwrap();

    let g = q.quantize_grouped(&x, &shapes).expect("quantize grouped");
    println!(
        "{} experts, {:?} layout, logical shape {:?}, format {}",
        g.num_members(),
        g.kind(),
        g.logical_shape(),
        q.spec()
    );
    println!("element offsets: {:?}", g.element_offsets());
    for b in g.buffers() {
        println!(
            "{:<22} {:>4} {:>10} bytes, member byte offsets {:?}",
            b.name(),
            b.dtype(),
            b.nbytes(),
            g.byte_offsets(b.name()).unwrap()
        );
    }
    println!("total {} bytes for {} values", g.nbytes(), total);

    // Members are zero-copy views: dequantize expert 2 alone.
    let m = g.member(2).unwrap();
    let back = m.dequantize_f32().unwrap();
    let start = g.element_offsets()[2];
    let err = back
        .iter()
        .zip(&acts[start..])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!("expert 2: shape {}, max abs error {err:.4}", m.shape());
}
