//! `quantfmt`: quantize, dequantize, inspect and compare low-precision tensor formats.
//!
//! Every error ends the program with a one-line reason and a non-zero exit code.
#![deny(unsafe_code)]

mod bench;
mod compare;
mod dequantize;
mod glu;
mod input;
mod inspect;
mod metrics;
mod progress;
mod quantize;
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
    },
    /// Quantize every f32/bf16/f16 tensor of rank >= 2 that the format accepts; others are
    /// copied and listed with the reason.
    Quantize {
        /// Input safetensors file.
        input: PathBuf,
        /// Output file (native quantfmt layout).
        #[arg(short, long)]
        output: PathBuf,
        /// Format spec `NAME[:OPT[,OPT...]]`, e.g. `fp8-block:1x128` (see `quantfmt formats`).
        #[arg(long, short)]
        format: FormatSpec,
        /// Which operands to store.
        #[arg(long, default_value = "rowwise")]
        usage: Usage,
        /// Fail if any tensor cannot be quantized.
        #[arg(long)]
        strict: bool,
        /// Store every rank-3 tensor `[E, n, k]` as a grouped tensor of E members `[n, k]`
        /// (MoE experts in one allocation per buffer kind).
        #[arg(long)]
        grouped: bool,
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
        /// Which operands to quantize.
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
    /// Write the embedded synthetic model to a safetensors file (to try the other commands).
    Example {
        /// Output safetensors file.
        #[arg(short, long)]
        output: PathBuf,
    },
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Compare { input, formats } => compare::run(input, &formats),
        Command::Quantize {
            input,
            output,
            format,
            usage,
            strict,
            grouped,
        } => quantize::run(&input, &output, &format, usage, strict, grouped),
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
        Command::Example { output } => write_example(&output),
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
