//! `quantfmt compare`: quantize every tensor with every format and report the error.

use std::path::PathBuf;
use std::time::Instant;

use quant_core::{Error, HostTensor, Result, Storage, Usage};
use quantfmt::interop::TensorClass;
use quantfmt::{AnyQuantizer, FormatSpec, Quantizer};
use serde_json::json;

use crate::input::as_host;
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
    class: TensorClass,
    format: String,
    outcome: std::result::Result<Measured, String>,
}

/// How `compare` reports.
#[derive(Clone, Debug, Default)]
pub struct Output {
    /// JSON on stdout instead of tables.
    pub json: bool,
    /// CSV (one row per tensor and format) on stdout instead of tables.
    pub csv: bool,
    /// Also write an SVG chart of SQNR against bits per value here.
    pub plot: Option<PathBuf>,
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
pub fn run(input: Option<PathBuf>, formats: &[String], out: &Output) -> Result<()> {
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
            if !out.json && !out.csv {
                println!(
                    "input: embedded synthetic transformer layer (bf16, heavy tails, outlier channels)"
                );
            }
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
            if !out.json && !out.csv {
                println!("input: {}", path.display());
            }
            // A file or a sharded checkpoint directory; quantized weights are not
            // compared again, plain float tensors of rank >= 2 are, one at a time.
            let ck = crate::model::Checkpoint::open(path)?;
            let plan = quantfmt::interop::plan_checkpoint(
                &ck.descs(),
                &ck.native,
                &ck.sidecar,
                &ck.config,
            )?;
            let infos: Vec<quantfmt::interop::TensorDesc> = plan
                .items
                .iter()
                .filter_map(|i| match i {
                    quantfmt::interop::Item::Plain(d)
                        if crate::pipeline::why_not_candidate(d).is_none() =>
                    {
                        Some(d.clone())
                    }
                    _ => None,
                })
                .collect();
            if infos.is_empty() {
                return Err(Error::file(
                    path.display().to_string(),
                    "has no f32/bf16/f16 tensor of rank >= 2 to compare",
                ));
            }
            let pb = Progress::new((infos.len() * quantizers.len()) as u64, "compare");
            for info in infos {
                let raw = ck.read(&info.name)?;
                let x = as_host(&raw)?;
                compare_one(&info.name, &x, &quantizers, &mut rows, &pb);
            }
            pb.finish();
        }
    }
    let source = input
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "embedded synthetic transformer layer".into());
    if out.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json_report(&rows, &quantizers, &source))?
        );
    } else if out.csv {
        print!("{}", csv_report(&rows));
    } else {
        print_report(&rows, &quantizers);
    }
    if let Some(path) = &out.plot {
        let svg = plot_report(&rows, &quantizers, &source);
        let tmp = quant_core::io::temp_path(path);
        std::fs::write(&tmp, svg)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| Error::file(path.display().to_string(), e.to_string()))?;
        if !out.json && !out.csv {
            println!("chart written to {}", path.display());
        }
    }
    Ok(())
}

/// Accumulated statistics of a set of rows.
#[derive(Clone, Copy, Default)]
struct Agg {
    stats: ErrorStats,
    stored: usize,
    numel: usize,
    in_bytes: usize,
    seconds: f64,
    tensors: usize,
    skipped: usize,
}

impl Agg {
    fn of<'a>(rows: impl Iterator<Item = &'a Row>) -> Agg {
        let mut a = Agg::default();
        for r in rows {
            match &r.outcome {
                Ok(m) => {
                    a.stats = a.stats.merge(m.stats);
                    a.stored += m.stored;
                    a.numel += m.numel;
                    a.in_bytes += m.in_bytes;
                    a.seconds += m.seconds;
                    a.tensors += 1;
                }
                Err(_) => a.skipped += 1,
            }
        }
        a
    }
    fn bits(&self) -> f64 {
        self.stored as f64 * 8.0 / self.numel.max(1) as f64
    }
    fn json(&self) -> serde_json::Value {
        json!({
            "tensors": self.tensors,
            "skipped": self.skipped,
            "bits_per_value": self.bits(),
            "sqnr_db": finite_or_null(self.stats.sqnr_db()),
            "rel_fro": finite_or_null(self.stats.rel_fro()),
            "max_abs_err": self.stats.max_abs,
            "mean_abs_err": self.stats.mean_abs(),
            "quant_seconds": self.seconds,
            "quant_gb_per_s": self.in_bytes as f64 / self.seconds.max(1e-12) / 1e9,
        })
    }
}

fn finite_or_null(v: f64) -> serde_json::Value {
    if v.is_finite() {
        json!(v)
    } else {
        serde_json::Value::Null
    }
}

fn classes_present(rows: &[Row]) -> Vec<TensorClass> {
    TensorClass::ALL
        .into_iter()
        .filter(|c| rows.iter().any(|r| r.class == *c))
        .collect()
}

fn json_report(rows: &[Row], qs: &[AnyQuantizer], source: &str) -> serde_json::Value {
    let per_tensor: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| match &r.outcome {
            Ok(m) => json!({
                "tensor": r.tensor, "class": r.class.name(), "format": r.format,
                "bits_per_value": m.bits, "sqnr_db": finite_or_null(m.stats.sqnr_db()),
                "rel_fro": finite_or_null(m.stats.rel_fro()), "max_abs_err": m.stats.max_abs,
                "mean_abs_err": m.stats.mean_abs(), "quant_seconds": m.seconds,
            }),
            Err(e) => json!({"tensor": r.tensor, "class": r.class.name(), "format": r.format, "skipped": e}),
        })
        .collect();
    let mut by_class = Vec::new();
    for q in qs {
        let spec = q.spec();
        for c in classes_present(rows) {
            let a = Agg::of(rows.iter().filter(|r| r.format == spec && r.class == c));
            let mut v = a.json();
            v["format"] = json!(spec);
            v["class"] = json!(c.name());
            by_class.push(v);
        }
    }
    let by_format: Vec<serde_json::Value> = qs
        .iter()
        .map(|q| {
            let spec = q.spec();
            let mut v = Agg::of(rows.iter().filter(|r| r.format == spec)).json();
            v["format"] = json!(spec);
            v
        })
        .collect();
    json!({"input": source, "rows": per_tensor, "by_class": by_class, "by_format": by_format})
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn csv_report(rows: &[Row]) -> String {
    let mut out = String::from(
        "tensor,class,format,bits_per_value,sqnr_db,rel_fro,max_abs_err,mean_abs_err,quant_seconds,skipped\n",
    );
    for r in rows {
        let cells = match &r.outcome {
            Ok(m) => vec![
                r.tensor.clone(),
                r.class.name().into(),
                r.format.clone(),
                format!("{}", m.bits),
                format!("{}", m.stats.sqnr_db()),
                format!("{}", m.stats.rel_fro()),
                format!("{}", m.stats.max_abs),
                format!("{}", m.stats.mean_abs()),
                format!("{}", m.seconds),
                String::new(),
            ],
            Err(e) => vec![
                r.tensor.clone(),
                r.class.name().into(),
                r.format.clone(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                e.clone(),
            ],
        };
        out.push_str(
            &cells
                .iter()
                .map(|c| csv_field(c))
                .collect::<Vec<_>>()
                .join(","),
        );
        out.push('\n');
    }
    out
}

fn plot_report(rows: &[Row], qs: &[AnyQuantizer], source: &str) -> String {
    let classes = classes_present(rows);
    let mut pts = Vec::new();
    for q in qs {
        let spec = q.spec();
        let a = Agg::of(rows.iter().filter(|r| r.format == spec));
        if a.tensors > 0 {
            pts.push(crate::plot::Point {
                label: spec.clone(),
                series: "all tensors".into(),
                x: a.bits(),
                y: a.stats.sqnr_db(),
            });
        }
        for c in &classes {
            let a = Agg::of(rows.iter().filter(|r| r.format == spec && r.class == *c));
            if a.tensors > 0 {
                pts.push(crate::plot::Point {
                    label: spec.clone(),
                    series: c.name().into(),
                    x: a.bits(),
                    y: a.stats.sqnr_db(),
                });
            }
        }
    }
    let names: Vec<String> = classes.iter().map(|c| c.name().to_string()).collect();
    crate::plot::svg(
        &pts,
        &format!("quantization error vs size: {source}"),
        &names,
    )
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
            class: TensorClass::of(name),
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
        "class",
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
                r.class.name().into(),
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

    let mut c = Table::new(&[
        "class",
        "format",
        "tensors",
        "bits/val",
        "SQNR dB",
        "rel fro",
        "max abs err",
        "quant ms",
    ]);
    for class in classes_present(rows) {
        for q in qs {
            let spec = q.spec();
            let a = Agg::of(rows.iter().filter(|r| r.format == spec && r.class == class));
            if a.tensors == 0 {
                continue;
            }
            c.row(vec![
                class.name().into(),
                spec,
                a.tensors.to_string(),
                format!("{:.3}", a.bits()),
                fmt_db(a.stats.sqnr_db()),
                format!("{:.3e}", a.stats.rel_fro()),
                format!("{:.3e}", a.stats.max_abs),
                format!("{:.1}", a.seconds * 1e3),
            ]);
        }
    }
    println!("per tensor class (attention, MLP, experts, ...; by name):");
    println!("{}", c.render());
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
