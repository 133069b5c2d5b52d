//! NVFP4 quantize/dequantize throughput against the same-run copy roofline (harness:
//! `benches/format_throughput.rs` at the workspace root): 1-D, 2-D, RHT (bf16 only) and
//! stochastic rounding.
//!
//! `cargo bench -p fmt-nvfp4 --bench throughput` (`QUANTFMT_BENCH_SHAPE=MxK` to change
//! the 8192x8192 default).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../benches/format_throughput.rs"]
mod format_throughput;

use criterion::{Criterion, criterion_group, criterion_main};
use fmt_nvfp4::Nvfp4Quantizer;
use quant_core::Usage;

fn benches(c: &mut Criterion) {
    use format_throughput::bench_format;
    let q = || Nvfp4Quantizer::new(Usage::BOTH);
    bench_format(c, "nvfp4 rowwise", &Nvfp4Quantizer::new(Usage::ROWWISE));
    bench_format(c, "nvfp4 both", &q());
    bench_format(c, "nvfp4 2d both", &q().with_2d(true));
    bench_format(c, "nvfp4 rht both", &q().with_rht(true));
    bench_format(c, "nvfp4 sr both", &q().with_stochastic_rounding(Some(7)));
}

criterion_group!(throughput, benches);
criterion_main!(throughput);
