//! `quantfmt inspect`: what a file holds, checked against each format's description
//! without reading tensor data.

use std::path::Path;

use quant_core::{Error, Result, Shape};

use crate::input::InputFile;
use crate::table::{Table, bytes};

/// Runs `inspect`.
pub fn run(path: &Path) -> Result<()> {
    let f = InputFile::open(path)?;
    let src = path.display().to_string();
    let registry = quantfmt::registry();
    let mut claimed = std::collections::BTreeSet::new();
    if !f.meta.tensors.is_empty() {
        println!(
            "quantized tensors (quantfmt metadata version {}):",
            f.meta.version
        );
    }
    for (name, tm) in &f.meta.tensors {
        let q = registry
            .quantizer(&tm.format, &tm.options)
            .map_err(|e| Error::file(&src, format!("tensor `{name}`: {e}")))?;
        let shape = Shape::new(&tm.shape)?;
        let want = match &tm.grouped {
            None => q.buffers(&shape),
            Some(gm) => gm
                .member_shapes
                .iter()
                .map(|d| Shape::new(d))
                .collect::<Result<Vec<_>>>()
                .and_then(|m| quant_core::GroupLayout::new(&*q, &m))
                .map(|l| l.grouped_descs()),
        }
        .map_err(|e| Error::file(&src, format!("tensor `{name}`: {e}")))?;
        let mut total = 0u64;
        let mut t = Table::new(&["buffer", "dtype", "shape", "bytes", "check"]);
        for d in &want {
            let full = format!("{name}.{}", d.name);
            claimed.insert(full.clone());
            let (st, check) = match f.header.get(&full) {
                None => (None, "MISSING".to_string()),
                Some(info) if info.shape != d.shape => (
                    Some(info),
                    format!("shape {:?}, expected {:?}", info.shape, d.shape),
                ),
                Some(info) if Some(info.dtype) != Some(d.dtype.to_safetensors()) => (
                    Some(info),
                    format!("dtype {}, expected {}", info.dtype, d.dtype),
                ),
                Some(info) => (Some(info), "ok".to_string()),
            };
            let n = st.map(|i| i.nbytes()).unwrap_or(0);
            total += n;
            t.row(vec![
                d.name.clone(),
                d.dtype.to_string(),
                format!("{:?}", d.shape),
                bytes(n),
                check,
            ]);
        }
        let numel = shape.numel().max(1) as f64;
        println!(
            "\n{name}: {} usage={} shape={:?} from {} -> {} ({:.3} bits/value)",
            q.spec(),
            q.usage(),
            tm.shape,
            tm.dtype,
            bytes(total),
            total as f64 * 8.0 / numel
        );
        println!("  options: {}", tm.options);
        if let Some(gm) = &tm.grouped {
            println!(
                "  grouped: {} members ({:?}), member shapes {:?}",
                gm.member_shapes.len(),
                gm.kind,
                gm.member_shapes
            );
            println!("  element offsets {:?}", gm.element_offsets);
        }
        print!("{}", indent(&t.render()));
    }
    let plain: Vec<_> = f
        .header
        .tensors
        .iter()
        .filter(|i| !claimed.contains(&i.name))
        .collect();
    if !plain.is_empty() {
        println!("\nplain tensors:");
        let mut t = Table::new(&["tensor", "dtype", "shape", "bytes"]);
        for i in plain {
            t.row(vec![
                i.name.clone(),
                i.dtype.to_string(),
                format!("{:?}", i.shape),
                bytes(i.nbytes()),
            ]);
        }
        print!("{}", indent(&t.render()));
    }
    let extra: Vec<_> = f
        .header
        .metadata
        .keys()
        .filter(|k| *k != "quantfmt")
        .collect();
    if !extra.is_empty() {
        println!("\nother metadata keys: {extra:?}");
    }
    Ok(())
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("  {l}\n")).collect()
}
