//! MXFP8 quantize/dequantize throughput against the same-run copy roofline (harness:
//! `benches/format_throughput.rs` at the workspace root).
//!
//! `cargo bench -p fmt-mxfp8 --bench throughput` (`QUANTFMT_BENCH_SHAPE=MxK` to change
//! the 8192x8192 default).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../benches/format_throughput.rs"]
mod format_throughput;

use criterion::{Criterion, criterion_group, criterion_main};
use fmt_mxfp8::{Mxfp8Quantizer, ScaleLayout};
use quant_core::Usage;

fn benches(c: &mut Criterion) {
    use format_throughput::bench_format;
    bench_format(c, "mxfp8 rowwise", &Mxfp8Quantizer::new(Usage::ROWWISE));
    bench_format(c, "mxfp8 both", &Mxfp8Quantizer::new(Usage::BOTH));
    let swizzled = Mxfp8Quantizer::new(Usage::BOTH).with_scale_layout(ScaleLayout::Swizzled);
    bench_format(c, "mxfp8 both swizzled", &swizzled);
}

criterion_group!(throughput, benches);
criterion_main!(throughput);
