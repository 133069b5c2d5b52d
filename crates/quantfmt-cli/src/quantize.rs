//! `quantfmt quantize`: quantize every eligible tensor of a safetensors file.

use std::path::Path;

use quant_core::io::{RawTensor, SaveItem, load_grouped, load_quantized, save_items};
use quant_core::{Error, GroupedStorage, Result, Shape, Storage, Usage};
use quantfmt::{FormatSpec, Quantizer};

use crate::input::{InputFile, as_host, not_candidate};
use crate::progress::Progress;
use crate::table::{Table, bytes};

enum Out {
    Quantized(Box<dyn Storage>),
    Grouped(Box<dyn GroupedStorage>),
    Plain(RawTensor),
}

/// Member shapes of a rank-3 `[E, n, k]` tensor stored as a grouped tensor of E members.
fn expert_shapes(dims: &[usize]) -> Result<Vec<Shape>> {
    let (&experts, member) = dims
        .split_first()
        .ok_or_else(|| Error::invalid("shape", "[]", "a grouped tensor needs dims [E, ...]"))?;
    if experts == 0 || experts > quant_core::io::MAX_GROUP_MEMBERS {
        return Err(Error::invalid(
            "experts (dim 0)",
            experts,
            format!(
                "must be between 1 and {}",
                quant_core::io::MAX_GROUP_MEMBERS
            ),
        ));
    }
    let member = Shape::new(member)?;
    Ok(vec![member; experts])
}

/// Runs `quantize`.
pub fn run(
    input: &Path,
    output: &Path,
    spec: &FormatSpec,
    usage: Usage,
    strict: bool,
    grouped: bool,
) -> Result<()> {
    let q = spec.quantizer(usage)?;
    let mut f = InputFile::open(input)?;
    let mut outs: Vec<(String, Out)> = Vec::new();
    let mut t = Table::new(&["tensor", "action", "shape", "dtype", "in", "out", "note"]);
    let mut skipped = Vec::new();
    let mut non_finite_total = 0usize;

    // Tensors that are already quantized pass through as they are (after validation).
    let registry = quantfmt::registry();
    for (name, tm) in f.meta.tensors.clone() {
        let wrap =
            |e: Error| Error::file(input.display().to_string(), format!("tensor `{name}`: {e}"));
        let (out, n, spec) = if tm.grouped.is_some() {
            let g = load_grouped(&mut f.src, &f.header, &name, &tm, registry).map_err(wrap)?;
            let (n, spec) = (g.nbytes(), g.quantizer().spec());
            (Out::Grouped(g), n, spec)
        } else {
            let s = load_quantized(&mut f.src, &f.header, &name, &tm, registry).map_err(wrap)?;
            let (n, spec) = (s.nbytes(), s.quantizer().spec());
            (Out::Quantized(s), n, spec)
        };
        t.row(vec![
            name.clone(),
            "kept".into(),
            format!("{:?}", tm.shape),
            tm.dtype.to_string(),
            bytes(n as u64),
            bytes(n as u64),
            format!("already quantized ({spec})"),
        ]);
        outs.push((name, out));
    }

    let infos: Vec<_> = f
        .header
        .tensors
        .iter()
        .filter(|i| !f.is_quantized_buffer(i))
        .cloned()
        .collect();
    let total: u64 = infos.iter().map(|i| i.nbytes()).sum();
    let pb = Progress::bytes(total, "quantize");
    for info in infos {
        let as_group = grouped && info.shape.len() == 3;
        let reason = not_candidate(&info).or_else(|| {
            let check = if as_group {
                expert_shapes(&info.shape).and_then(|m| match m.first() {
                    Some(first) => q.check_shape(first),
                    None => Ok(()),
                })
            } else {
                Shape::new(&info.shape).and_then(|s| q.check_shape(&s))
            };
            check.err().map(|e| e.to_string())
        });
        let raw = f.raw(&info)?;
        let dtype = raw.dtype.to_string();
        match reason {
            Some(why) => {
                skipped.push(format!("{}: {why}", info.name));
                t.row(vec![
                    info.name.clone(),
                    "copied".into(),
                    format!("{:?}", info.shape),
                    dtype,
                    bytes(info.nbytes()),
                    bytes(info.nbytes()),
                    why,
                ]);
                outs.push((info.name.clone(), Out::Plain(raw)));
            }
            None => {
                let x = as_host(&raw)?;
                let nf = x.count_non_finite();
                non_finite_total += nf;
                let wrap = |e: Error| {
                    Error::file(
                        input.display().to_string(),
                        format!("tensor `{}`: {e}", info.name),
                    )
                };
                let (out, n, action) = if as_group {
                    let members = expert_shapes(&info.shape)?;
                    let g = q.quantize_grouped(&x, &members).map_err(wrap)?;
                    let n = g.nbytes();
                    (Out::Grouped(g), n, format!("grouped x{}", info.shape[0]))
                } else {
                    let s = Quantizer::quantize(&q, &x).map_err(wrap)?;
                    let n = s.nbytes();
                    (Out::Quantized(s), n, "quantized".to_string())
                };
                t.row(vec![
                    info.name.clone(),
                    action,
                    format!("{:?}", info.shape),
                    dtype,
                    bytes(info.nbytes()),
                    bytes(n as u64),
                    if nf > 0 {
                        format!("{nf} non-finite input values (NaN/inf)")
                    } else {
                        String::new()
                    },
                ]);
                outs.push((info.name.clone(), out));
            }
        }
        pb.inc(info.nbytes());
    }
    pb.finish();

    if strict && !skipped.is_empty() {
        return Err(Error::invalid(
            "--strict",
            format!("{} tensor(s) not quantized", skipped.len()),
            format!("every tensor must be quantizable; first: {}", skipped[0]),
        ));
    }
    let items: Vec<(String, SaveItem<'_>)> = outs
        .iter()
        .map(|(n, o)| {
            (
                n.clone(),
                match o {
                    Out::Quantized(s) => SaveItem::Quantized(&**s),
                    Out::Grouped(g) => SaveItem::Grouped(&**g),
                    Out::Plain(r) => SaveItem::Plain(r),
                },
            )
        })
        .collect();
    let extra = f.header.metadata.clone();
    save_items(output, &items, &extra)?;

    print!("{}", t.render());
    let n_q = outs
        .iter()
        .filter(|(_, o)| matches!(o, Out::Quantized(_)))
        .count();
    let in_total: u64 = f.header.tensors.iter().map(|i| i.nbytes()).sum();
    let out_total = std::fs::metadata(output).map(|m| m.len()).unwrap_or(0);
    println!(
        "{} -> {}: {n_q} quantized with {}, {} copied; {} -> {} on disk",
        input.display(),
        output.display(),
        q.spec(),
        skipped.len(),
        bytes(in_total),
        bytes(out_total)
    );
    if non_finite_total > 0 {
        println!(
            "warning: {non_finite_total} non-finite input values (NaN/inf) were quantized with the format's saturation rules"
        );
    }
    Ok(())
}
