//! Writes seed inputs: valid native files of every registered format (plain and grouped,
//! several shapes and usages) for `load_bytes`, and every spec and option for
//! `spec_parse`, and checkpoints in every interop layout for `interop_load`. Run `cargo +nightly run --release --bin seed_corpus` from `fuzz/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use quantfmt::io::{RawTensor, SaveItem, save_items};
use quantfmt::{HostTensor, Usage, registry};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let files = root.join("load_bytes");
    let specs = root.join("spec_parse");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::create_dir_all(&specs).unwrap();
    let mut n = 0;
    for e in registry().entries() {
        let mut variants = vec![e.name.to_string()];
        for o in e.options {
            variants.push(format!("{}:{}", e.name, o.name));
        }
        for (i, v) in variants.iter().enumerate() {
            std::fs::write(specs.join(format!("{}-{i}", e.name)), v).unwrap();
        }
        for (vi, spec) in variants.iter().enumerate() {
            for usage in [Usage::ROWWISE, Usage::BOTH] {
                let Ok(q) = registry().parse_spec(spec, usage) else {
                    continue;
                };
                for shape in [[32usize, 64], [64, 32], [128, 128]] {
                    let x: Vec<f32> = (0..shape[0] * shape[1])
                        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                        .collect();
                    let t = HostTensor::f32(&x, &shape).unwrap();
                    let Ok(s) = q.quantize(&t) else { continue };
                    let plain = RawTensor::from_host(&HostTensor::f32(&x[..8], &[8]).unwrap());
                    let mut items = vec![
                        ("w".to_string(), SaveItem::Quantized(&*s)),
                        ("bias".to_string(), SaveItem::Plain(&plain)),
                    ];
                    let g = q.quantize_grouped_list(&[t.clone(), t.clone()]);
                    if let Ok(g) = &g {
                        items.push(("experts".to_string(), SaveItem::Grouped(&**g)));
                    }
                    let path = files.join(format!(
                        "{}-{vi}-{}-{}x{}.safetensors",
                        e.name, usage, shape[0], shape[1]
                    ));
                    save_items(&path, &items, &Default::default()).unwrap();
                    n += 1;
                }
            }
        }
    }
    n += seed_interop(&root.join("interop_load"));
    println!("wrote {n} files under {}", root.display());
}

/// Seeds for `interop_load`: the interop golden checkpoints (built by
/// `tests/golden/interop.py` with the upstream conventions) and, for every registered
/// format and every layout that holds it, a small weight exported to that layout.
fn seed_interop(dir: &Path) -> usize {
    use quantfmt::interop::{Extras, Layout, export};
    std::fs::create_dir_all(dir).unwrap();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/data/interop");
    let mut n = 0;
    for entry in std::fs::read_dir(&golden).unwrap() {
        let p = entry.unwrap().path();
        // `expected.safetensors` holds reference values, not a checkpoint, and is large.
        if p.file_name().is_some_and(|f| f != "expected.safetensors") {
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
            n += 1;
        }
    }
    let x: Vec<f32> = (0..64 * 128).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
    let t = HostTensor::f32(&x, &[64, 128]).unwrap();
    // `pad=torchao` is what the torchao layout stores; other formats refuse the option.
    let specs = registry()
        .entries()
        .iter()
        .flat_map(|e| [e.name.to_string(), format!("{}:pad=torchao", e.name)]);
    for spec in specs {
        let Ok(q) = registry().parse_spec(&spec, Usage::ROWWISE) else {
            continue;
        };
        let Ok(s) = q.quantize(&t) else { continue };
        for layout in Layout::ALL {
            let Ok(out) = export(layout, "model.layers.0.mlp.down_proj", &*s, &Extras::default())
            else {
                continue;
            };
            let items: Vec<_> = out
                .tensors
                .iter()
                .map(|(name, raw)| (name.clone(), SaveItem::Plain(raw)))
                .collect();
            let path = dir.join(format!("{}-{layout:?}.safetensors", spec.replace(':', "_")));
            save_items(&path, &items, &Default::default()).unwrap();
            n += 1;
        }
    }
    n
}
