//! `quantfmt compare`: quantize every tensor with every format and report the error.

use std::path::PathBuf;
use std::time::Instant;

use quant_core::{Error, HostTensor, Result, Storage, Usage};
use quantfmt::{AnyQuantizer, FormatSpec, Quantizer};

use crate::input::{InputFile, as_host, not_candidate};
use crate::metrics::ErrorStats;
use crate::progress::Progress;
use crate::synthetic;
use crate::table::Table;

/// Formats compared when `--formats` is not given (those not built in are skipped).
const DEFAULT_FORMATS: &[&str] = &[
    "fp8",
    "fp8-block:1x128",
    "fp8-block:128x128",
    "mxfp8",
    "nvfp4",
    "nvfp4:2d",
    "int4tiled",
];

/// Splits a `--formats` list. Specs may themselves contain commas (`nvfp4:2d,swizzled`),
/// so a comma-separated token that is not a format name continues the previous spec.
pub fn parse_format_list(lists: &[String]) -> Result<Vec<FormatSpec>> {
    let names = quantfmt::registry().names();
    let mut specs: Vec<String> = Vec::new();
    for list in lists {
        for group in list.split([';', ' ']).filter(|s| !s.is_empty()) {
            for tok in group.split(',') {
                let tok = tok.trim();
                if tok.is_empty() {
                    continue;
                }
                let starts_new = tok.contains(':') || names.contains(&tok) || specs.is_empty();
                match specs.last_mut() {
                    Some(last) if !starts_new => {
                        last.push(if last.contains(':') { ',' } else { ':' });
                        last.push_str(tok);
                    }
                    _ => specs.push(tok.to_string()),
                }
            }
        }
    }
    specs.iter().map(|s| s.parse()).collect()
}

fn default_formats() -> Vec<FormatSpec> {
    let names = quantfmt::registry().names();
    DEFAULT_FORMATS
        .iter()
        .filter(|s| names.contains(&s.split(':').next().unwrap_or("")))
        .filter_map(|s| s.parse().ok())
        .collect()
}

struct Row {
    tensor: String,
    format: String,
    outcome: std::result::Result<Measured, String>,
}

#[derive(Clone, Copy)]
struct Measured {
    bits: f64,
    stats: ErrorStats,
    seconds: f64,
    in_bytes: usize,
    numel: usize,
    stored: usize,
}

fn measure(q: &AnyQuantizer, x: &HostTensor<'_>) -> Result<Measured> {
    let t0 = Instant::now();
    let s = q.quantize(x)?;
    let seconds = t0.elapsed().as_secs_f64();
    let back = s.dequantize_f32()?;
    let exact = x.to_f32_vec();
    Ok(Measured {
        bits: s.bits_per_value(),
        stats: ErrorStats::between(&exact, &back),
        seconds,
        in_bytes: x.as_bytes().len(),
        numel: x.shape().numel(),
        stored: s.nbytes(),
    })
}

/// Runs the comparison.
pub fn run(input: Option<PathBuf>, formats: &[String]) -> Result<()> {
    let specs = if formats.is_empty() {
        default_formats()
    } else {
        parse_format_list(formats)?
    };
    if specs.is_empty() {
        return Err(Error::invalid(
            "--formats",
            "(empty)",
            "name at least one format",
        ));
    }
    let quantizers: Vec<AnyQuantizer> = specs
        .iter()
        .map(|s| s.quantizer(Usage::ROWWISE))
        .collect::<Result<_>>()?;

    let mut rows = Vec::new();
    match &input {
        None => {
            println!(
                "input: embedded synthetic transformer layer (bf16, heavy tails, outlier channels)"
            );
            let model = synthetic::default_model();
            let candidates: Vec<_> = model.iter().filter(|t| t.shape.len() >= 2).collect();
            let pb = Progress::new((candidates.len() * quantizers.len()) as u64, "compare");
            for t in candidates {
                let x = HostTensor::bf16(&t.data, &t.shape)?;
                compare_one(&t.name, &x, &quantizers, &mut rows, &pb);
            }
            pb.finish();
        }
        Some(path) => {
            println!("input: {}", path.display());
            let mut f = InputFile::open(path)?;
            let infos: Vec<_> = f
                .header
                .tensors
                .iter()
                .filter(|i| not_candidate(i).is_none() && !f.is_quantized_buffer(i))
                .cloned()
                .collect();
            if infos.is_empty() {
                return Err(Error::file(
                    path.display().to_string(),
                    "has no f32/bf16/f16 tensor of rank >= 2 to compare",
                ));
            }
            let pb = Progress::new((infos.len() * quantizers.len()) as u64, "compare");
            for info in infos {
                let raw = f.raw(&info)?;
                let x = as_host(&raw)?;
                compare_one(&info.name, &x, &quantizers, &mut rows, &pb);
            }
            pb.finish();
        }
    }
    print_report(&rows, &quantizers);
    Ok(())
}

fn compare_one(
    name: &str,
    x: &HostTensor<'_>,
    qs: &[AnyQuantizer],
    rows: &mut Vec<Row>,
    pb: &Progress,
) {
    for q in qs {
        let outcome = q
            .check_shape(x.shape())
            .and_then(|()| measure(q, x))
            .map_err(|e| e.to_string());
        rows.push(Row {
            tensor: name.to_string(),
            format: q.spec(),
            outcome,
        });
        pb.inc(1);
    }
}

fn fmt_db(v: f64) -> String {
    if v.is_infinite() {
        "exact".into()
    } else {
        format!("{v:.2}")
    }
}

fn print_report(rows: &[Row], qs: &[AnyQuantizer]) {
    let mut t = Table::new(&[
        "tensor",
        "format",
        "bits/val",
        "SQNR dB",
        "rel fro",
        "max abs err",
        "mean abs err",
        "quant ms",
    ]);
    for r in rows {
        match &r.outcome {
            Ok(m) => t.row(vec![
                r.tensor.clone(),
                r.format.clone(),
                format!("{:.3}", m.bits),
                fmt_db(m.stats.sqnr_db()),
                format!("{:.3e}", m.stats.rel_fro()),
                format!("{:.3e}", m.stats.max_abs),
                format!("{:.3e}", m.stats.mean_abs()),
                format!("{:.1}", m.seconds * 1e3),
            ]),
            Err(e) => t.row(vec![
                r.tensor.clone(),
                r.format.clone(),
                format!("skipped: {e}"),
            ]),
        }
    }
    println!("{}", t.render());

    let mut s = Table::new(&[
        "format",
        "",
        "tensors",
        "bits/val",
        "SQNR dB",
        "rel fro",
        "max abs err",
        "quant GB/s",
    ]);
    for q in qs {
        let spec = q.spec();
        let ok: Vec<&Measured> = rows
            .iter()
            .filter(|r| r.format == spec)
            .filter_map(|r| r.outcome.as_ref().ok())
            .collect();
        let skipped = rows
            .iter()
            .filter(|r| r.format == spec && r.outcome.is_err())
            .count();
        if ok.is_empty() {
            s.row(vec![spec, String::new(), format!("0 ({skipped} skipped)")]);
            continue;
        }
        let stats = ok
            .iter()
            .fold(ErrorStats::default(), |a, m| a.merge(m.stats));
        let stored: usize = ok.iter().map(|m| m.stored).sum();
        let numel: usize = ok.iter().map(|m| m.numel).sum();
        let in_bytes: usize = ok.iter().map(|m| m.in_bytes).sum();
        let secs: f64 = ok.iter().map(|m| m.seconds).sum();
        s.row(vec![
            spec,
            String::new(),
            if skipped > 0 {
                format!("{} ({skipped} skipped)", ok.len())
            } else {
                ok.len().to_string()
            },
            format!("{:.3}", stored as f64 * 8.0 / numel as f64),
            fmt_db(stats.sqnr_db()),
            format!("{:.3e}", stats.rel_fro()),
            format!("{:.3e}", stats.max_abs),
            format!("{:.2}", in_bytes as f64 / secs.max(1e-12) / 1e9),
        ]);
    }
    println!("summary (all tensors together; SQNR over the total signal and noise):");
    println!("{}", s.render());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_lists_keep_spec_options() {
        let v = parse_format_list(&["fp8,fp8-block:1x128,fp8:e5m2,pow2".into()]).unwrap();
        let s: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        assert_eq!(s, vec!["fp8", "fp8-block:1x128", "fp8:e5m2,pow2"]);
        assert!(parse_format_list(&["nope".into()]).is_err());
        let v = parse_format_list(&["fp8 fp8-block".into(), "fp8:e5m2".into()]).unwrap();
        assert_eq!(v.len(), 3);
    }
}
