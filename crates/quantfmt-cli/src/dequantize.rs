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
            Loaded::Grouped(g) => {
                let dt = dtype.unwrap_or(g.dtype());
                let shapes = g.member_shapes();
                let uniform = shapes.iter().all(|s| s == &shapes[0]);
                let mut parts = Vec::with_capacity(shapes.len());
                for i in 0..g.num_members() {
                    let m = g.member(i)?;
                    let dir = m
                        .usage()
                        .preferred()
                        .unwrap_or(quant_core::Direction::Rowwise);
                    parts.push(m.dequantize(dir, dt)?);
                }
                if uniform {
                    // Stack back into [E, member dims...].
                    let mut dims = vec![shapes.len()];
                    dims.extend_from_slice(shapes[0].dims());
                    let bytes: Vec<u8> = parts.iter().flat_map(|p| p.as_bytes().to_vec()).collect();
                    let stacked = quant_core::HostTensor::from_le_bytes(dt, &bytes, &dims)?;
                    t.row(vec![
                        name.clone(),
                        "dequantized".into(),
                        format!("{dims:?}"),
                        dt.to_string(),
                        format!("{} (grouped x{})", g.quantizer().spec(), shapes.len()),
                    ]);
                    outs.push((name.clone(), RawTensor::from_host(&stacked)));
                } else {
                    for (i, p) in parts.iter().enumerate() {
                        let member = format!("{name}.member{i}");
                        t.row(vec![
                            member.clone(),
                            "dequantized".into(),
                            format!("{:?}", p.shape().dims()),
                            dt.to_string(),
                            format!("{} (member {i} of a grouped tensor)", g.quantizer().spec()),
                        ]);
                        outs.push((member, RawTensor::from_host(p)));
                    }
                }
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
