//! int4tiled quantize (torchao qparams + tile packing) and dequantize throughput against
//! the same-run copy roofline (harness: `benches/format_throughput.rs` at the workspace
//! root). The weight-only matmul has its own bench, `int4_linear`.
//!
//! `cargo bench -p fmt-int4tiled --bench throughput` (`QUANTFMT_BENCH_SHAPE=MxK` to
//! change the 8192x8192 default).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../benches/format_throughput.rs"]
mod format_throughput;

use criterion::{Criterion, criterion_group, criterion_main};
use fmt_int4tiled::Int4TiledQuantizer;

fn benches(c: &mut Criterion) {
    format_throughput::bench_format(c, "int4tiled g128 ikt8", &Int4TiledQuantizer::new());
}

criterion_group!(throughput, benches);
criterion_main!(throughput);
