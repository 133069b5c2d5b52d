//! `quantfmt`: quantize, dequantize, inspect and compare low-precision tensor formats.
//!
//! Every error ends the program with a one-line reason and a non-zero exit code.
#![deny(unsafe_code)]

mod bench;
mod compare;
mod convert;
mod dequantize;
mod glu;
mod input;
mod inspect;
mod merge_index;
mod metrics;
mod model;
mod pipeline;
mod plot;
mod progress;
mod quantize;
mod select;
mod synthetic;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use quant_core::{DType, Result, Usage};
use quantfmt::FormatSpec;

/// Low-precision tensor formats (FP8, FP8 blockwise, MXFP8, NVFP4, int4 tinygemm),
/// bit-exact with TransformerEngine and torchao.
#[derive(Parser)]
#[command(name = "quantfmt", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Quantize each tensor with each format and print bits per value, SQNR, errors and
    /// time. With no IN, uses an embedded synthetic transformer layer.
    Compare {
        /// A safetensors file (optional).
        input: Option<PathBuf>,
        /// Formats to compare: specs separated by commas, spaces or `;`, or repeated
        /// (`--formats fp8,nvfp4:2d,swizzled,mxfp8`).
        #[arg(long, short)]
        formats: Vec<String>,
        /// Print a JSON report (per tensor, per class, per format) instead of tables.
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// Print CSV (one row per tensor and format) instead of tables.
        #[arg(long)]
        csv: bool,
        /// Write an SVG chart of SQNR against bits per value to this file.
        #[arg(long, value_name = "FILE")]
        plot: Option<PathBuf>,
    },
    /// Quantize a checkpoint (one file, or a directory of shards with an index) into the
    /// native layout, tensor by tensor with bounded memory. Tensors the format or the
    /// selection leaves out are copied and listed with the reason.
    Quantize {
        /// Input safetensors file or checkpoint directory.
        input: PathBuf,
        /// Output file (for a file input) or directory (keeps the input's sharding).
        #[arg(short, long)]
        output: PathBuf,
        /// Format spec `NAME[:OPT[,OPT...]]`, e.g. `fp8-block:1x128` (see `quantfmt formats`).
        #[arg(long, short)]
        format: FormatSpec,
        /// Which operands to store.
        #[arg(long, default_value = "rowwise")]
        usage: Usage,
        /// Fail if any float tensor is left unquantized (other than by --exclude).
        #[arg(long)]
        strict: bool,
        /// Store every rank-3 tensor `[E, n, k]` as a grouped tensor of E members `[n, k]`
        /// (MoE experts in one allocation per buffer kind).
        #[arg(long)]
        grouped: bool,
        #[command(flatten)]
        stream: StreamArgs,
    },
    /// Convert a checkpoint between layouts: native, modelopt, compressed-tensors,
    /// deepseek. The input layout is detected from tensor names and configs; with
    /// --format, plain weights are quantized on the way. Whatever the target cannot hold
    /// is reported (and in --json), never dropped silently.
    Convert {
        /// Input safetensors file or checkpoint directory (any layout).
        input: PathBuf,
        /// Output file (for a file input) or directory (keeps the input's sharding).
        #[arg(short, long)]
        output: PathBuf,
        /// Target layout: native, modelopt, compressed-tensors (ct), deepseek.
        #[arg(long)]
        to: quantfmt::interop::Layout,
        /// Also quantize selected plain weights with this format.
        #[arg(long, short)]
        format: Option<FormatSpec>,
        /// Re-quantize weights the target layout cannot hold with this format
        /// (dequantize, then quantize: values change; each one is reported).
        #[arg(long, value_name = "SPEC")]
        requantize: Option<FormatSpec>,
        /// Fail if any float tensor is left unquantized (with --format).
        #[arg(long)]
        strict: bool,
        #[command(flatten)]
        stream: StreamArgs,
    },
    /// Join the partial indexes of a `--workers N` run into `model.safetensors.index.json`.
    MergeIndex {
        /// The output directory the workers wrote to.
        dir: PathBuf,
        /// Keep the partial index files.
        #[arg(long)]
        keep_parts: bool,
    },
    /// Dequantize a native file back to plain tensors.
    Dequantize {
        /// Input file (native quantfmt layout).
        input: PathBuf,
        /// Output safetensors file.
        #[arg(short, long)]
        output: PathBuf,
        /// Output dtype (default: each tensor's original dtype).
        #[arg(long)]
        dtype: Option<DType>,
    },
    /// Show what a file holds: per tensor its format, options, buffers, bytes and bits per
    /// value, checked against the format's description.
    Inspect {
        /// A safetensors file.
        file: PathBuf,
    },
    /// Convert fused gate/up (fc1) weights between `[W; V]` and block-interleaved
    /// `[W0:k, V0:k, W1:k, V1:k, ...]` along dim 0; quantized tensors are converted without
    /// dequantizing (rows move with their scales).
    Glu {
        /// Input safetensors file (plain or native quantized).
        input: PathBuf,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
        /// Interleave with block size K.
        #[arg(
            long,
            value_name = "K",
            conflicts_with = "deinterleave",
            required_unless_present = "deinterleave"
        )]
        interleave: Option<usize>,
        /// De-interleave with block size K.
        #[arg(long, value_name = "K")]
        deinterleave: Option<usize>,
        /// Glob patterns of tensor names to convert.
        #[arg(long, default_values_t = ["*gate_up*".to_string(), "*fc1*".to_string()])]
        pattern: Vec<String>,
    },
    /// Measure quantize/dequantize throughput against a memory-copy roofline measured in
    /// the same run (GB/s and ratio; median of several runs).
    Bench {
        /// Formats (default: every format of this build with its common variants).
        #[arg(long, short)]
        format: Vec<String>,
        /// Shape `MxK`.
        #[arg(long, default_value = "8192x8192")]
        shape: String,
        /// Input dtype (RHT always runs on bf16).
        #[arg(long, default_value = "bf16")]
        dtype: DType,
        /// Which operands to quantize (the default list measures `nvfp4:rht` columnwise,
        /// where its transform applies).
        #[arg(long, default_value = "rowwise")]
        usage: Usage,
        /// Worker threads (0: all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Timed runs per measurement (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// List the formats this build knows, their options and shape rules.
    Formats,
    /// Write the embedded synthetic model to a safetensors file (to try the other commands),
    /// or with --size a sharded Llama-like checkpoint directory of about that many bytes.
    Example {
        /// Output safetensors file (or directory with --size).
        #[arg(short, long)]
        output: PathBuf,
        /// Write a sharded checkpoint directory of about this size (e.g. 4GiB).
        #[arg(long, value_name = "BYTES")]
        size: Option<String>,
        /// Shards of the sharded checkpoint.
        #[arg(long, default_value_t = 4)]
        shards: usize,
        /// Hidden size of the sharded checkpoint (intermediate 11/4 of it, vocabulary 16x).
        #[arg(long, default_value_t = 2048)]
        hidden: usize,
    },
}

/// Options shared by the streaming commands.
#[derive(clap::Args, Clone, Debug)]
struct StreamArgs {
    /// Quantize only tensors matching these glob patterns (repeatable; an explicit match
    /// also overrides the LLM defaults).
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Never quantize tensors matching these glob patterns (repeatable).
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Turn off the LLM defaults (which keep embeddings, norms, lm_head, biases and MoE
    /// routers in high precision).
    #[arg(long)]
    all: bool,
    /// This process's index among --workers (0-based): it converts its share of shards.
    #[arg(long, default_value_t = 0)]
    worker_index: usize,
    /// Number of processes converting the model together (then run `merge-index`).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Bytes of tensors in flight at once (e.g. 2GiB; default: twice the largest tensor,
    /// at least 64 MiB).
    #[arg(long, value_name = "BYTES")]
    max_memory: Option<String>,
    /// Tensors processed in parallel (default: up to 4, the number of CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Print a machine-readable JSON summary on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| {
        quant_core::Error::invalid(
            "--max-memory",
            s,
            "must be a number with an optional unit (KiB, MiB, GiB)",
        )
    })?;
    let mul = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(quant_core::Error::invalid(
                "--max-memory",
                s,
                "unit must be one of B, KiB, MiB, GiB, TiB",
            ));
        }
    };
    Ok((v * mul as f64) as u64)
}

fn stream_options(
    a: &StreamArgs,
    input: PathBuf,
    output: PathBuf,
    to: quantfmt::interop::Layout,
) -> Result<pipeline::Options> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(pipeline::Options {
        input,
        output,
        to,
        format: None,
        grouped: false,
        requantize: None,
        selection: select::Selection::new(&a.include, &a.exclude, a.all)?,
        strict: false,
        worker: (a.worker_index, a.workers),
        max_memory: a.max_memory.as_deref().map(parse_bytes).transpose()?,
        threads: a.threads.unwrap_or(cpus.min(4)),
        json: a.json,
    })
}

fn install_ctrlc() {
    let _ = ctrlc::set_handler(|| {
        pipeline::INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
    });
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Compare {
            input,
            formats,
            json,
            csv,
            plot,
        } => compare::run(input, &formats, &compare::Output { json, csv, plot }),
        Command::Quantize {
            input,
            output,
            format,
            usage,
            strict,
            grouped,
            stream,
        } => {
            install_ctrlc();
            let mut o = stream_options(&stream, input, output, quantfmt::interop::Layout::Native)?;
            o.format = Some(format.quantizer(usage)?);
            o.strict = strict;
            o.grouped = grouped;
            quantize::run(&o)
        }
        Command::Convert {
            input,
            output,
            to,
            format,
            requantize,
            strict,
            stream,
        } => {
            install_ctrlc();
            let mut o = stream_options(&stream, input, output, to)?;
            o.format = format.map(|f| f.quantizer(Usage::ROWWISE)).transpose()?;
            o.requantize = requantize
                .map(|f| f.quantizer(Usage::ROWWISE))
                .transpose()?;
            o.strict = strict;
            convert::run(&o)
        }
        Command::MergeIndex { dir, keep_parts } => {
            let (shards, tensors) = merge_index::run(&dir, keep_parts)?;
            println!(
                "wrote {}: {tensors} tensors in {shards} shards",
                dir.join(model::INDEX_NAME).display()
            );
            Ok(())
        }
        Command::Dequantize {
            input,
            output,
            dtype,
        } => dequantize::run(&input, &output, dtype),
        Command::Inspect { file } => inspect::run(&file),
        Command::Glu {
            input,
            output,
            interleave,
            deinterleave,
            pattern,
        } => {
            let dir = match (interleave, deinterleave) {
                (Some(k), None) => glu::Direction::Interleave(k),
                (None, Some(k)) => glu::Direction::Deinterleave(k),
                _ => {
                    return Err(quant_core::Error::invalid(
                        "glu",
                        "--interleave/--deinterleave",
                        "give exactly one of them",
                    ));
                }
            };
            glu::run(&input, &output, dir, &pattern)
        }
        Command::Bench {
            format,
            shape,
            dtype,
            usage,
            threads,
            runs,
            json,
        } => {
            let dims: Vec<usize> = shape
                .split(['x', 'X'])
                .map(|d| d.trim().parse::<usize>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| {
                    quant_core::Error::invalid("--shape", &shape, "must be MxK, e.g. 8192x8192")
                })?;
            let [m, k] = dims[..] else {
                return Err(quant_core::Error::invalid(
                    "--shape",
                    &shape,
                    "must be MxK, e.g. 8192x8192",
                ));
            };
            if m == 0 || k == 0 {
                // No format quantizes an empty tensor.
                return Err(quant_core::Error::invalid(
                    "--shape",
                    &shape,
                    "both dimensions must be at least 1",
                ));
            }
            if runs == 0 {
                return Err(quant_core::Error::invalid("--runs", 0, "must be >= 1"));
            }
            bench::run(&bench::Options {
                formats: format,
                shape: [m, k],
                dtype,
                usage,
                threads,
                runs,
                json,
            })
        }
        Command::Formats => {
            list_formats();
            Ok(())
        }
        Command::Example {
            output, size: None, ..
        } => write_example(&output),
        Command::Example {
            output,
            size: Some(size),
            shards,
            hidden,
        } => {
            let (n, total) =
                synthetic::write_sharded(&output, parse_bytes(&size)?, shards, hidden)?;
            println!(
                "wrote {n} tensors ({}) in {shards} shards to {}",
                table::bytes(total),
                output.display()
            );
            Ok(())
        }
    }
}

fn list_formats() {
    for e in quantfmt::registry().entries() {
        println!("{}: {}", e.name, e.shape_rule);
        for o in e.options {
            println!("    {:<14} {}", o.name, o.help);
        }
    }
}

fn write_example(path: &std::path::Path) -> Result<()> {
    let model = synthetic::default_model();
    let raws: Vec<(String, quant_core::io::RawTensor)> = model
        .iter()
        .map(|t| {
            let x = quant_core::HostTensor::bf16(&t.data, &t.shape)?;
            Ok((t.name.clone(), quant_core::io::RawTensor::from_host(&x)))
        })
        .collect::<Result<_>>()?;
    let items: Vec<_> = raws
        .iter()
        .map(|(n, r)| (n.clone(), quant_core::io::SaveItem::Plain(r)))
        .collect();
    quant_core::io::save_items(path, &items, &Default::default())?;
    println!("wrote {} tensors to {}", raws.len(), path.display());
    Ok(())
}

fn main() -> ExitCode {
    // A bug must still end in one line, never a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        eprintln!("error: internal error (please report): {msg}");
    }));
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
