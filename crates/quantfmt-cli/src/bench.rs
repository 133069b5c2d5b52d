//! `quantfmt bench`: quantize/dequantize throughput against a same-run memory roofline.
//!
//! Machines are noisy, so every number is a ratio to a copy measured in the same run,
//! moving the same bytes the operation must move: for quantize, read the input as often
//! as the format must (`Quantizer::input_passes`: twice under a tensor-wide amax, whose
//! pass is inherent) and write the quantized buffers; for dequantize, read the buffers
//! of the direction dequantized (not the other direction's, under `--usage both`) and
//! write the output. The roofline and the operation run in interleaved pairs; the ratio
//! is the median of the pairs' ratios, GB/s the medians of each series. The input, the
//! outputs and the roofline's buffers are all [`HostBytes`], allocated as the library
//! allocates a storage (huge pages where [`quant_core::pages`] gets them; the header
//! says which), so the kernels and their roofline run on one kind of page.

use std::hint::black_box;
use std::time::Instant;

use quant_core::{DType, Direction, HostBytes, HostDataMut, HostTensor, Result, Storage, Usage};
use quantfmt::{FormatSpec, Quantizer};
use serde::Serialize;

use crate::table::Table;

/// Formats benchmarked when none is given, each with the usage it is measured in
/// (`None`: `--usage`). The random Hadamard transform applies to the columnwise operand
/// only, so its entry is measured columnwise; rowwise it would time plain NVFP4.
const DEFAULT: &[(&str, Option<Usage>)] = &[
    ("fp8", None),
    ("fp8-block:1x128", None),
    ("fp8-block:128x128", None),
    ("mxfp8", None),
    ("nvfp4", None),
    ("nvfp4:2d", None),
    ("nvfp4:rht", Some(Usage::COLUMNWISE)),
    ("nvfp4:sr", None),
    ("int4tiled", None),
];

/// One measured operation (also the `--json` line).
#[derive(Serialize)]
pub struct Record {
    /// Format spec.
    pub format: String,
    /// `quantize` or `dequantize`.
    pub op: &'static str,
    /// Input dtype (quantize) or output dtype (dequantize).
    pub dtype: String,
    /// `[M, K]`.
    pub shape: [usize; 2],
    /// Usage quantized.
    pub usage: String,
    /// Worker threads.
    pub threads: usize,
    /// Input bytes per second (quantize) or output bytes per second (dequantize), 1e9.
    pub gbps: f64,
    /// The same bytes per second for the roofline copy, 1e9.
    pub roofline_gbps: f64,
    /// Roofline time / operation time: the median over interleaved pairs of runs (so
    /// close to, but not exactly, `gbps / roofline_gbps`, which are separate medians).
    pub ratio: f64,
    /// Median seconds per operation.
    pub seconds: f64,
    /// The kernels' SIMD level and the CPU's ([`quant_core::simd::describe`]), e.g.
    /// `avx512 (cpu: avx512 + avx512bf16 + avx512vbmi)`.
    pub simd: String,
    /// Whether the input, output and roofline buffers were allocated for transparent
    /// huge pages ([`quant_core::pages`]; off under `QUANTFMT_HUGE_PAGES=0`).
    pub huge_pages: bool,
}

/// Options of a bench run.
pub struct Options {
    /// Specs to run (empty: the defaults that this build has).
    pub formats: Vec<String>,
    /// `[M, K]`.
    pub shape: [usize; 2],
    /// Input dtype.
    pub dtype: DType,
    /// Usage.
    pub usage: Usage,
    /// Threads (0: all).
    pub threads: usize,
    /// Timed repetitions.
    pub runs: usize,
    /// Print JSON lines instead of a table.
    pub json: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median times of a kernel and of its roofline, and the median of their per-pair ratio.
struct Timing {
    roofline: f64,
    kernel: f64,
    ratio: f64,
}

/// Times `roofline` and `kernel` in `runs` interleaved pairs after one warm-up of each
/// (page faults, caches, thread pool). Each pair runs back to back, so the ratio of a
/// pair sees one phase of a noisy machine, and the median ratio survives phases that
/// separate medians of two series (one run after the other) do not.
fn time_pairs(
    runs: usize,
    mut roofline: impl FnMut() -> Result<()>,
    mut kernel: impl FnMut() -> Result<()>,
) -> Result<Timing> {
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let t0 = Instant::now();
        f()?;
        Ok(t0.elapsed().as_secs_f64())
    };
    roofline()?;
    kernel()?;
    let (mut tr, mut tk, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let r = time(&mut roofline)?;
        let k = time(&mut kernel)?;
        tr.push(r);
        tk.push(k);
        ratios.push(r / k);
    }
    Ok(Timing {
        roofline: median(tr),
        kernel: median(tk),
        ratio: median(ratios),
    })
}

/// Deterministic weight-like data.
fn data(m: usize, k: usize) -> Vec<f32> {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    (0..m * k)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

/// A copy of `t`'s elements in memory allocated as the library allocates a storage's
/// buffers ([`HostBytes::zeroed`]: huge pages where [`quant_core::pages`] gets them),
/// so that the kernels and their roofline copy all run on one kind of page, as they
/// would on a framework's own large tensors.
fn paged(t: &HostTensor<'_>) -> HostBytes {
    HostBytes::copy_from(t.as_bytes())
}

/// The bytes a dequantization in `dir` reads: that direction's buffers and the shared
/// ones (a per-tensor `scale_inv`), not the other direction's (named `columnwise_*`,
/// `amax_columnwise`, and so on).
fn direction_bytes(buffers: &[quant_core::Buffer], dir: Direction) -> Vec<u8> {
    let other = match dir {
        Direction::Rowwise => "columnwise",
        Direction::Columnwise => "rowwise",
    };
    buffers
        .iter()
        .filter(|b| !b.name().contains(other))
        .flat_map(|b| b.bytes().to_vec())
        .collect()
}

/// Runs the benchmark.
pub fn run(opts: &Options) -> Result<()> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .build()
        .map_err(|e| quant_core::Error::invalid("--threads", opts.threads, e.to_string()))?;
    pool.install(|| run_in_pool(opts, pool.current_num_threads()))
}

fn run_in_pool(opts: &Options, threads: usize) -> Result<()> {
    let names = quantfmt::registry().names();
    let specs: Vec<(FormatSpec, Usage)> = if opts.formats.is_empty() {
        DEFAULT
            .iter()
            .filter(|(s, _)| names.contains(&s.split(':').next().unwrap_or("")))
            .filter_map(|(s, u)| Some((s.parse().ok()?, u.unwrap_or(opts.usage))))
            .collect()
    } else {
        crate::compare::parse_format_list(&opts.formats)?
            .into_iter()
            .map(|s| (s, opts.usage))
            .collect()
    };
    let [m, k] = opts.shape;
    let base = data(m, k);
    let x_bytes = paged(&HostTensor::f32(&base, &[m, k])?.to_dtype(opts.dtype)?);
    drop(base);
    // Borrowed in place (`HostBytes` start on a 64-byte line, so no copy is made).
    let x = HostTensor::from_le_bytes(opts.dtype, x_bytes.as_slice(), &[m, k])?;
    let in_bytes = x.as_bytes().len();
    let mut records = Vec::new();
    let simd = quant_core::simd::describe();
    let huge_pages = x_bytes.huge_pages_advised();
    if !opts.json {
        println!(
            "shape [{m}, {k}] {} usage={} threads={threads}, median of {} runs; simd {}; {}",
            opts.dtype,
            opts.usage,
            opts.runs,
            simd,
            quant_core::pages::describe()
        );
    }
    for (spec, usage) in &specs {
        let q = spec
            .quantizer(*usage)
            .or_else(|_| spec.quantizer(Usage::ROWWISE))?;
        if let Err(e) = q.check_shape(x.shape()) {
            eprintln!("skipping {}: {e}", q.spec());
            continue;
        }
        // RHT takes bf16 input only; bench it on bf16 whatever --dtype says.
        let bf16_bytes;
        let xin = match q.quantize(&x) {
            Ok(_) => x.clone(),
            Err(_) => {
                bf16_bytes = paged(&x.to_dtype(DType::BF16)?);
                HostTensor::from_le_bytes(DType::BF16, bf16_bytes.as_slice(), &[m, k])?
            }
        };
        let stored = q.quantize(&xin)?;
        let out_bytes = stored.nbytes();
        let usage = stored.usage();
        // Per-tensor scales need the tensor's amax before the first byte is written.
        let reads = q.input_passes();
        let mut dst = HostBytes::zeroed(out_bytes);
        let mut reuse = q.quantize(&xin)?;
        let tq = time_pairs(
            opts.runs,
            || {
                quant_core::cpu::roofline(xin.as_bytes(), dst.as_mut_slice(), reads);
                Ok(())
            },
            || q.quantize_into(&xin, &mut reuse),
        )?;
        let in_b = xin.as_bytes().len() as f64;
        records.push(Record {
            format: q.spec(),
            op: "quantize",
            dtype: xin.dtype().to_string(),
            shape: [m, k],
            usage: usage.to_string(),
            threads,
            gbps: in_b / tq.kernel / 1e9,
            roofline_gbps: in_b / tq.roofline / 1e9,
            ratio: tq.ratio,
            seconds: tq.kernel,
            simd: simd.clone(),
            huge_pages,
        });
        let dir = usage.preferred().unwrap_or(Direction::Rowwise);
        let dq_out = in_bytes / opts.dtype.size() * opts.dtype.size();
        let buf_bytes = HostBytes::copy_from(&direction_bytes(stored.buffers(), dir));
        let mut out = HostBytes::zeroed(dq_out);
        // Into caller memory, reused across runs, as a framework would (no page faults).
        let mut dq = HostBytes::zeroed(dq_out);
        let td = time_pairs(
            opts.runs,
            || {
                quant_core::cpu::roofline(buf_bytes.as_slice(), out.as_mut_slice(), 1);
                Ok(())
            },
            || {
                let bytes = dq.as_mut_slice();
                let out = match opts.dtype {
                    DType::F32 => HostDataMut::F32(bytemuck::cast_slice_mut(bytes)),
                    DType::F16 => HostDataMut::F16(bytemuck::cast_slice_mut(bytes)),
                    _ => HostDataMut::BF16(bytemuck::cast_slice_mut(bytes)),
                };
                stored.dequantize_into(dir, out)
            },
        )?;
        black_box(&dq);
        records.push(Record {
            format: q.spec(),
            op: "dequantize",
            dtype: opts.dtype.to_string(),
            shape: [m, k],
            usage: dir.to_string(),
            threads,
            gbps: dq_out as f64 / td.kernel / 1e9,
            roofline_gbps: dq_out as f64 / td.roofline / 1e9,
            ratio: td.ratio,
            seconds: td.kernel,
            simd: simd.clone(),
            huge_pages,
        });
    }
    if opts.json {
        for r in &records {
            println!(
                "{}",
                serde_json::to_string(r).map_err(quant_core::Error::from)?
            );
        }
    } else {
        let mut t = Table::new(&[
            "format",
            "op",
            "dtype",
            "usage",
            "GB/s",
            "roofline GB/s",
            "ratio",
            "ms",
        ]);
        for r in &records {
            t.row(vec![
                r.format.clone(),
                r.op.to_string(),
                r.dtype.clone(),
                r.usage.clone(),
                format!("{:.2}", r.gbps),
                format!("{:.2}", r.roofline_gbps),
                format!("{:.2}", r.ratio),
                format!("{:.2}", r.seconds * 1e3),
            ]);
        }
        print!("{}", t.render());
        println!(
            "GB/s: input bytes for quantize, output bytes for dequantize; roofline: a parallel pass moving the same bytes (the input read as often as the format must: twice under a tensor-wide amax); ratio: median over runs of roofline time / kernel time, each pair timed back to back."
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes of the buffers named in `names`.
    fn named_bytes(buffers: &[quant_core::Buffer], names: &[&str]) -> usize {
        buffers
            .iter()
            .filter(|b| names.contains(&b.name()))
            .map(|b| b.nbytes())
            .sum()
    }

    #[test]
    fn a_dequantization_roofline_reads_one_direction() {
        let values = data(256, 256);
        let x = HostTensor::f32(&values, &[256, 256]).unwrap();
        let nvfp4: FormatSpec = "nvfp4".parse().unwrap();
        let both = nvfp4.quantizer(Usage::BOTH).unwrap().quantize(&x).unwrap();
        let bufs = both.buffers();
        let row = direction_bytes(bufs, Direction::Rowwise).len();
        let col = direction_bytes(bufs, Direction::Columnwise).len();
        assert_eq!(
            row,
            named_bytes(bufs, &["rowwise_data", "rowwise_scale_inv", "amax_rowwise"])
        );
        assert_eq!(
            col,
            named_bytes(
                bufs,
                &["columnwise_data", "columnwise_scale_inv", "amax_columnwise"]
            )
        );
        assert_eq!(row + col, both.nbytes());
        // A per-tensor scale is shared: both directions read it.
        let fp8: FormatSpec = "fp8".parse().unwrap();
        let fp8 = fp8.quantizer(Usage::BOTH).unwrap().quantize(&x).unwrap();
        let shared = named_bytes(fp8.buffers(), &["scale_inv"]);
        assert_eq!(shared, 4);
        assert_eq!(
            direction_bytes(fp8.buffers(), Direction::Rowwise).len(),
            256 * 256 + shared
        );
    }
}
