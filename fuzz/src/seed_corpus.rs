//! Writes seed inputs: valid native files of every registered format (plain and grouped,
//! several shapes and usages) for `load_bytes`, and every spec and option for
//! `spec_parse`. Run `cargo +nightly run --release --bin seed_corpus` from `fuzz/`.
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
    println!("wrote {n} files under {}", root.display());
}
