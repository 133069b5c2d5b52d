//! `quantfmt merge-index DIR`: joins the partial indexes that `--workers N` runs wrote
//! into one `model.safetensors.index.json`, after checking that every worker finished,
//! every shard is listed by exactly one worker and exists, and no tensor is mapped twice.
//! The index is written atomically; the parts are removed afterwards (unless
//! `--keep-parts`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use quant_core::io::writer::write_json_atomic;
use quant_core::{Error, Result};
use serde_json::{Value, json};

use crate::model::INDEX_NAME;

/// (worker index, workers, files written, all files of the run, total size) of a part.
type PartInfo = (usize, usize, Vec<String>, Vec<String>, u64);

/// Merges the parts in `dir`; returns (shards, tensors).
pub fn run(dir: &Path, keep_parts: bool) -> Result<(usize, usize)> {
    let bad = |p: &Path, why: String| Error::file(p.display().to_string(), why);
    let prefix = format!("{INDEX_NAME}.part-");
    let mut parts: Vec<(std::path::PathBuf, Value)> = Vec::new();
    for e in std::fs::read_dir(dir)
        .map_err(|e| bad(dir, e.to_string()))?
        .flatten()
    {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with(&prefix) && !name.contains(".tmp-") {
            let text = std::fs::read_to_string(e.path())?;
            let v: Value = serde_json::from_str(&text)
                .map_err(|err| bad(&e.path(), format!("is not valid JSON: {err}")))?;
            parts.push((e.path(), v));
        }
    }
    if parts.is_empty() {
        return Err(bad(dir, format!("holds no `{prefix}*` files to merge")));
    }
    parts.sort_by(|a, b| a.0.cmp(&b.0));
    let info = |v: &Value, p: &Path| -> Result<PartInfo> {
        let q = v
            .get("quantfmt_index_part")
            .ok_or_else(|| bad(p, "is not a quantfmt index part".into()))?;
        let n = |k: &str| {
            q.get(k)
                .and_then(Value::as_u64)
                .ok_or_else(|| bad(p, format!("lacks `{k}`")))
        };
        let strs = |k: &str| -> Result<Vec<String>> {
            q.get(k)
                .and_then(Value::as_array)
                .ok_or_else(|| bad(p, format!("lacks `{k}`")))?
                .iter()
                .map(|s| {
                    s.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| bad(p, format!("`{k}` holds a non-string")))
                })
                .collect()
        };
        Ok((
            n("worker_index")? as usize,
            n("workers")? as usize,
            strs("files")?,
            strs("all_files")?,
            n("total_size")?,
        ))
    };
    let (_, workers, _, all_files, total_size) = info(&parts[0].1, &parts[0].0)?;
    let mut seen_workers = BTreeSet::new();
    let mut owner: BTreeMap<String, usize> = BTreeMap::new();
    let mut weight_map: BTreeMap<String, String> = BTreeMap::new();
    for (p, v) in &parts {
        let (wi, wn, files, all, ts) = info(v, p)?;
        if wn != workers || all != all_files || ts != total_size {
            return Err(bad(
                p,
                format!("belongs to another run ({wn} workers; expected {workers})"),
            ));
        }
        if !seen_workers.insert(wi) {
            return Err(bad(p, format!("repeats worker {}", wi + 1)));
        }
        for f in files {
            if let Some(o) = owner.insert(f.clone(), wi) {
                return Err(bad(
                    p,
                    format!("lists shard `{f}`, also written by worker {}", o + 1),
                ));
            }
            if !dir.join(&f).is_file() {
                return Err(bad(
                    dir,
                    format!("lacks shard `{f}` that worker {} wrote", wi + 1),
                ));
            }
        }
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(p, "has no weight_map".into()))?;
        for (k, f) in map {
            let f = f
                .as_str()
                .ok_or_else(|| bad(p, format!("maps `{k}` to a non-string")))?;
            if weight_map.insert(k.clone(), f.to_string()).is_some() {
                return Err(bad(
                    p,
                    format!("maps tensor `{k}` that another part maps too"),
                ));
            }
        }
    }
    if seen_workers.len() != workers {
        let missing: Vec<String> = (0..workers)
            .filter(|w| !seen_workers.contains(w))
            .map(|w| (w + 1).to_string())
            .collect();
        return Err(bad(
            dir,
            format!(
                "is missing the index parts of worker(s) {} of {workers}",
                missing.join(", ")
            ),
        ));
    }
    let with_tensors: BTreeSet<&String> = weight_map.values().collect();
    for f in &with_tensors {
        if !owner.contains_key(*f) {
            return Err(bad(
                dir,
                format!("maps tensors to `{f}`, which no worker wrote"),
            ));
        }
    }
    let index = json!({"metadata": {"total_size": total_size}, "weight_map": weight_map});
    write_json_atomic(dir.join(INDEX_NAME), &index)?;
    if !keep_parts {
        for (p, _) in &parts {
            std::fs::remove_file(p)?;
        }
    }
    Ok((owner.len(), weight_map.len()))
}
