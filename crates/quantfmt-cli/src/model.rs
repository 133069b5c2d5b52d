//! Opening a checkpoint: one safetensors file, or a directory of shards with
//! `model.safetensors.index.json` (or without one: every `*.safetensors` in it), plus its
//! `config.json` and `hf_quant_config.json`. Only headers are read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use quant_core::io::reader::{FileSource, Header, TensorInfo, read_header, read_tensor};
use quant_core::io::{FileMeta, RawTensor, parse_meta};
use quant_core::{Error, Result};
use quantfmt::interop::config::CheckpointConfig;
use quantfmt::interop::{Sidecar, TensorDesc};
use serde_json::Value;

/// The index file name Hugging Face uses.
pub const INDEX_NAME: &str = "model.safetensors.index.json";

/// One safetensors file of a checkpoint.
pub struct Shard {
    /// File name within the checkpoint directory (or the file's own name).
    pub file_name: String,
    /// Full path.
    pub path: PathBuf,
    /// Validated header.
    pub header: Header,
    /// Size in bytes.
    pub file_len: u64,
}

/// An opened checkpoint.
pub struct Checkpoint {
    /// The path given.
    pub root: PathBuf,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Its index file name, if it had one.
    pub index_name: Option<String>,
    /// Shards in file-name order.
    pub shards: Vec<Shard>,
    /// Where each tensor lives: shard index and header entry.
    pub location: BTreeMap<String, (usize, TensorInfo)>,
    /// Native metadata merged over the shards.
    pub native: FileMeta,
    /// Interop sidecars merged over the shards.
    pub sidecar: Sidecar,
    /// Configs.
    pub config: CheckpointConfig,
    /// Notes from opening (ignored sidecars).
    pub notes: Vec<String>,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::file(path.display().to_string(), e.to_string()))?;
    serde_json::from_str(&text).map(Some).map_err(|e| {
        Error::file(
            path.display().to_string(),
            format!("is not valid JSON: {e}"),
        )
    })
}

impl Checkpoint {
    /// Opens `root` and reads every shard's header.
    pub fn open(root: &Path) -> Result<Checkpoint> {
        let is_dir = root.is_dir();
        let mut index_name = None;
        let files: Vec<(String, PathBuf)> = if is_dir {
            let index = root.join(INDEX_NAME);
            if let Some(v) = read_json(&index)? {
                index_name = Some(INDEX_NAME.to_string());
                let map = v
                    .get("weight_map")
                    .and_then(Value::as_object)
                    .ok_or_else(|| {
                        Error::file(index.display().to_string(), "has no `weight_map` object")
                    })?;
                let mut names = BTreeSet::new();
                for f in map.values() {
                    let f = f.as_str().ok_or_else(|| {
                        Error::file(
                            index.display().to_string(),
                            "maps a tensor to a non-string file",
                        )
                    })?;
                    if f.contains('/') || f.contains('\\') || f.starts_with('.') {
                        return Err(Error::file(
                            index.display().to_string(),
                            format!("names shard `{f}` outside the checkpoint directory"),
                        ));
                    }
                    names.insert(f.to_string());
                }
                names
                    .into_iter()
                    .map(|n| (n.clone(), root.join(n)))
                    .collect()
            } else {
                let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(root)
                    .map_err(|e| Error::file(root.display().to_string(), e.to_string()))?
                    .filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                    .filter_map(|p| {
                        let n = p.file_name()?.to_str()?.to_string();
                        (!n.contains(".tmp-")).then_some((n, p))
                    })
                    .collect();
                v.sort();
                v
            }
        } else {
            let name = root
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("model.safetensors")
                .to_string();
            vec![(name, root.to_path_buf())]
        };
        if files.is_empty() {
            return Err(Error::file(
                root.display().to_string(),
                "holds no .safetensors file",
            ));
        }
        let mut ck = Checkpoint {
            root: root.to_path_buf(),
            is_dir,
            index_name,
            shards: Vec::new(),
            location: BTreeMap::new(),
            native: FileMeta {
                version: quant_core::io::FORMAT_VERSION,
                tensors: BTreeMap::new(),
            },
            sidecar: Sidecar::new(),
            config: CheckpointConfig::default(),
            notes: Vec::new(),
        };
        for (i, (file_name, path)) in files.into_iter().enumerate() {
            let mut src = FileSource::open(&path)?;
            let header = read_header(&mut src)?;
            let src_name = path.display().to_string();
            if let Some(meta) = parse_meta(&src_name, &header)? {
                ck.native.tensors.extend(meta.tensors);
            }
            match Sidecar::from_metadata(&header.metadata) {
                Some(Ok(s)) => ck.sidecar.tensors.extend(s.tensors),
                Some(Err(e)) => ck.notes.push(format!("{file_name}: sidecar ignored: {e}")),
                None => {}
            }
            ck.config.add_file_metadata(&header.metadata);
            if i == 0
                && let Some(qc) = header.metadata.get("quantization_config")
            {
                ck.config.metadata_quantization_config = serde_json::from_str(qc).ok();
            }
            for t in &header.tensors {
                if ck.location.insert(t.name.clone(), (i, t.clone())).is_some() {
                    return Err(Error::file(
                        src_name.clone(),
                        format!("tensor `{}` is also in another shard", t.name),
                    ));
                }
            }
            let file_len = std::fs::metadata(&path)?.len();
            ck.shards.push(Shard {
                file_name,
                path,
                header,
                file_len,
            });
        }
        if is_dir {
            ck.config.config = read_json(&root.join("config.json"))?;
            ck.config.hf_quant_config = read_json(&root.join("hf_quant_config.json"))?;
        }
        Ok(ck)
    }

    /// Every tensor as a description, in name order.
    pub fn descs(&self) -> Vec<TensorDesc> {
        self.location
            .iter()
            .map(|(n, (_, t))| TensorDesc::new(n, t.dtype, &t.shape))
            .collect()
    }

    /// The shard holding `name`.
    pub fn shard_of(&self, name: &str) -> Result<usize> {
        self.location
            .get(name)
            .map(|(i, _)| *i)
            .ok_or_else(|| Error::invalid("tensor", name, "is in no shard of the checkpoint"))
    }

    /// Reads one tensor (opens its shard; positioned reads, no mapping).
    pub fn read(&self, name: &str) -> Result<RawTensor> {
        let (i, info) = self
            .location
            .get(name)
            .ok_or_else(|| Error::invalid("tensor", name, "is in no shard of the checkpoint"))?;
        let shard = &self.shards[*i];
        let mut src = FileSource::open(&shard.path)?;
        let data = read_tensor(&mut src, &shard.header, info)?;
        Ok(RawTensor {
            dtype: info.dtype,
            shape: info.shape.clone(),
            data,
        })
    }

    /// Reads `len` bytes at `offset` within tensor `name` (chunked copies).
    pub fn read_part(&self, name: &str, offset: u64, out: &mut [u8]) -> Result<()> {
        use quant_core::io::reader::Source;
        let (i, info) = self
            .location
            .get(name)
            .ok_or_else(|| Error::invalid("tensor", name, "is in no shard of the checkpoint"))?;
        let shard = &self.shards[*i];
        if offset + out.len() as u64 > info.nbytes() {
            return Err(Error::invalid("read", name, "runs past the tensor"));
        }
        let mut src = FileSource::open(&shard.path)?;
        src.read_at(shard.header.data_start + info.begin + offset, out)
    }
}
