//! `quantfmt dequantize`: turn a native quantized file back into plain tensors.

use std::path::Path;

use quant_core::io::{Loaded, RawTensor, SaveItem, save_items};
use quant_core::{DType, Result};

use crate::table::{Table, bytes};

/// Runs `dequantize`; `dtype` None keeps each tensor's original dtype.
pub fn run(input: &Path, output: &Path, dtype: Option<DType>) -> Result<()> {
    let file = quantfmt::io::load(input)?;
    let mut t = Table::new(&["tensor", "action", "shape", "dtype", "from"]);
    let mut outs: Vec<(String, RawTensor)> = Vec::new();
    for (name, item) in &file.tensors {
        match item {
            Loaded::Quantized(s) => {
                let dt = dtype.unwrap_or(s.dtype());
                let dir = s
                    .usage()
                    .preferred()
                    .unwrap_or(quant_core::Direction::Rowwise);
                let x = s.dequantize(dir, dt)?;
                t.row(vec![
                    name.clone(),
                    "dequantized".into(),
                    format!("{:?}", s.shape().dims()),
                    dt.to_string(),
                    format!("{} ({dir})", s.quantizer().spec()),
                ]);
                outs.push((name.clone(), RawTensor::from_host(&x)));
            }
            Loaded::Plain(r) => {
                t.row(vec![
                    name.clone(),
                    "copied".into(),
                    format!("{:?}", r.shape),
                    r.dtype.to_string(),
                    String::new(),
                ]);
                outs.push((name.clone(), r.clone()));
            }
        }
    }
    let items: Vec<(String, SaveItem<'_>)> = outs
        .iter()
        .map(|(n, r)| (n.clone(), SaveItem::Plain(r)))
        .collect();
    save_items(output, &items, &file.metadata)?;
    print!("{}", t.render());
    let size = std::fs::metadata(output).map(|m| m.len()).unwrap_or(0);
    println!(
        "{} -> {} ({})",
        input.display(),
        output.display(),
        bytes(size)
    );
    Ok(())
}
