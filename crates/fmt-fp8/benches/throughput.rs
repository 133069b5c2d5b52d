//! FP8 quantize/dequantize throughput against the same-run copy roofline (harness:
//! `benches/format_throughput.rs` at the workspace root).
//!
//! `cargo bench -p fmt-fp8 --bench throughput` (`QUANTFMT_BENCH_SHAPE=MxK` to change the
//! 8192x8192 default).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../benches/format_throughput.rs"]
mod format_throughput;

use criterion::{Criterion, criterion_group, criterion_main};
use fmt_fp8::{BlockScaling, Fp8BlockQuantizer, Fp8Quantizer};
use quant_core::Usage;

fn benches(c: &mut Criterion) {
    use format_throughput::bench_format;
    bench_format(c, "fp8 rowwise", &Fp8Quantizer::new(Usage::ROWWISE));
    bench_format(c, "fp8 both", &Fp8Quantizer::new(Usage::BOTH));
    bench_format(
        c,
        "fp8-block 1x128 both",
        &Fp8BlockQuantizer::new(BlockScaling::OneD, Usage::BOTH),
    );
    bench_format(
        c,
        "fp8-block 128x128 both",
        &Fp8BlockQuantizer::new(BlockScaling::TwoD, Usage::BOTH),
    );
}

criterion_group!(throughput, benches);
criterion_main!(throughput);
