//! `quantfmt glu`: (de)interleave fused gate/up weights, plain or quantized.

use std::path::Path;

use quant_core::glu::{
    deinterleave_glu, deinterleave_glu_storage, interleave_glu, interleave_glu_storage,
};
use quant_core::io::{Loaded, RawTensor, SaveItem, save_items};
use quant_core::{Error, Result, Storage};

use crate::table::Table;

/// Which way to convert.
#[derive(Clone, Copy, Debug)]
pub enum Direction {
    /// `[W; V]` -> `[W0:k, V0:k, ...]`.
    Interleave(usize),
    /// The inverse.
    Deinterleave(usize),
}

enum Out {
    Quantized(Box<dyn Storage>),
    Grouped(Box<dyn quant_core::GroupedStorage>),
    Plain(RawTensor),
}

/// Runs `glu` on every tensor whose name matches one of `patterns`.
pub fn run(input: &Path, output: &Path, dir: Direction, patterns: &[String]) -> Result<()> {
    let pats = patterns
        .iter()
        .map(|p| {
            glob::Pattern::new(p)
                .map_err(|e| Error::invalid("--pattern", p, format!("is not a glob: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let file = quantfmt::io::load(input)?;
    let mut t = Table::new(&["tensor", "action", "shape", "note"]);
    let mut outs: Vec<(String, Out)> = Vec::new();
    let mut matched = 0;
    for (name, item) in file.tensors {
        let hit = pats.iter().any(|p| p.matches(&name));
        if hit {
            matched += 1;
        }
        let out = match (item, hit) {
            (Loaded::Quantized(s), true) => {
                let r = match dir {
                    Direction::Interleave(k) => interleave_glu_storage(&*s, k),
                    Direction::Deinterleave(k) => deinterleave_glu_storage(&*s, k),
                }
                .map_err(|e| {
                    Error::file(input.display().to_string(), format!("tensor `{name}`: {e}"))
                })?;
                t.row(vec![
                    name.clone(),
                    label(dir),
                    format!("{:?}", r.shape().dims()),
                    r.quantizer().spec(),
                ]);
                Out::Quantized(r)
            }
            (Loaded::Plain(raw), true) => match raw.as_host() {
                Some(x) => {
                    let x = x?;
                    let y = match dir {
                        Direction::Interleave(k) => interleave_glu(&x, k),
                        Direction::Deinterleave(k) => deinterleave_glu(&x, k),
                    }
                    .map_err(|e| {
                        Error::file(input.display().to_string(), format!("tensor `{name}`: {e}"))
                    })?;
                    t.row(vec![
                        name.clone(),
                        label(dir),
                        format!("{:?}", raw.shape),
                        raw.dtype.to_string(),
                    ]);
                    Out::Plain(RawTensor::from_host(&y))
                }
                None => {
                    return Err(Error::file(
                        input.display().to_string(),
                        format!(
                            "tensor `{name}` has dtype {} and cannot be interleaved",
                            raw.dtype
                        ),
                    ));
                }
            },
            (Loaded::Grouped(_), true) => {
                return Err(Error::file(
                    input.display().to_string(),
                    format!("tensor `{name}` is grouped; interleave its experts before grouping"),
                ));
            }
            (Loaded::Quantized(s), false) => Out::Quantized(s),
            (Loaded::Grouped(g), false) => Out::Grouped(g),
            (Loaded::Plain(r), false) => Out::Plain(r),
        };
        outs.push((name, out));
    }
    if matched == 0 {
        return Err(Error::invalid(
            "--pattern",
            patterns.join(" "),
            "matched no tensor of the file",
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
    save_items(output, &items, &file.metadata)?;
    print!("{}", t.render());
    println!(
        "{} -> {}: {matched} tensor(s) converted",
        input.display(),
        output.display()
    );
    Ok(())
}

fn label(dir: Direction) -> String {
    match dir {
        Direction::Interleave(k) => format!("interleaved k={k}"),
        Direction::Deinterleave(k) => format!("deinterleaved k={k}"),
    }
}
