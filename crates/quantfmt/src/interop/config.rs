//! Checkpoint-level configuration: reading what a checkpoint declares, and writing the
//! JSON each layout's consumers look for.
//!
//! | layout | files written (directory output) | single-file output |
//! |---|---|---|
//! | ModelOpt | `hf_quant_config.json` + `config.json` `quantization_config` (`quant_method: modelopt`) | `__metadata__["quantization_config"]` = the `hf_quant_config` JSON (as ModelOpt's own export embeds it) |
//! | compressed-tensors | `config.json` `quantization_config` | `__metadata__["quantization_config"]` |
//! | DeepSeek | `config.json` `quantization_config` | `__metadata__["quantization_config"]` |
//!
//! `config.json` is the input's `config.json` (when the input is a directory that has
//! one) with its `quantization_config` replaced, else a file holding only
//! `quantization_config`.

use std::collections::{BTreeMap, BTreeSet};

use quant_core::DType;
use serde_json::{Value, json};

use super::{Layout, Scheme};

/// What a checkpoint declares about itself.
#[derive(Clone, Debug, Default)]
pub struct CheckpointConfig {
    /// `hf_quant_config.json` (ModelOpt).
    pub hf_quant_config: Option<Value>,
    /// `config.json`.
    pub config: Option<Value>,
    /// `__metadata__["quantization_config"]` of the (first) safetensors file.
    pub metadata_quantization_config: Option<Value>,
    /// torchao tensor-subclass entries of the files' metadata, by weight name.
    pub torchao: BTreeMap<String, Value>,
}

impl CheckpointConfig {
    /// Collects what a file's `__metadata__` declares: torchao's per-weight entries
    /// (`{"_type": "Int4TilePackedTo4dTensor", ...}`).
    pub fn add_file_metadata(&mut self, md: &BTreeMap<String, String>) {
        for (k, v) in md {
            if k == "tensor_names" || !v.starts_with('{') {
                continue;
            }
            if let Ok(j) = serde_json::from_str::<Value>(v)
                && j.get("_type").and_then(Value::as_str) == Some(super::torchao::TYPE)
            {
                self.torchao.insert(k.clone(), j);
            }
        }
    }

    /// The `quantization_config` object, from `config.json` or the file metadata.
    pub fn quantization_config(&self) -> Option<&Value> {
        self.config
            .as_ref()
            .and_then(|c| c.get("quantization_config"))
            .or(self.metadata_quantization_config.as_ref())
    }

    /// The layout the configs declare, if any.
    pub fn declared_layout(&self) -> Option<Layout> {
        if let Some(h) = &self.hf_quant_config
            && h.get("quantization").is_some()
        {
            return Some(Layout::ModelOpt);
        }
        let qc = self.quantization_config()?;
        if qc.get("quantization").is_some() && qc.get("producer").is_some() {
            // ModelOpt's hf_quant_config embedded in the metadata.
            return Some(Layout::ModelOpt);
        }
        match qc.get("quant_method").and_then(Value::as_str) {
            Some("torchao") => Some(Layout::TorchAo),
            Some("modelopt") => Some(Layout::ModelOpt),
            Some("compressed-tensors") => Some(Layout::CompressedTensors),
            Some("fp8") if qc.get("weight_block_size").is_some() => Some(Layout::DeepSeek),
            _ => None,
        }
    }

    /// The model's dtype (`torch_dtype` or `dtype` in `config.json`), if a float one.
    pub fn torch_dtype(&self) -> Option<DType> {
        let c = self.config.as_ref()?;
        let s = c
            .get("torch_dtype")
            .or_else(|| c.get("dtype"))
            .and_then(Value::as_str)?;
        match s.trim_start_matches("torch.") {
            "bfloat16" => Some(DType::BF16),
            "float16" | "half" => Some(DType::F16),
            "float32" | "float" => Some(DType::F32),
            _ => None,
        }
    }
}

/// One quantized weight, for the config: its name, scheme and whether it has a static
/// input scale.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigEntry {
    /// Weight name (`a.b.weight`).
    pub name: String,
    /// Scheme.
    pub scheme: Scheme,
    /// Whether a static input scale is written with it.
    pub input_scale: bool,
    /// Group size (int4 weights).
    pub group_size: Option<usize>,
}

/// The configuration JSON a layout's consumers read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayoutConfig {
    /// `hf_quant_config.json` (ModelOpt only).
    pub hf_quant_config: Option<Value>,
    /// `config.json`'s `quantization_config`.
    pub quantization_config: Option<Value>,
}

fn module(name: &str) -> String {
    name.strip_suffix(".weight").unwrap_or(name).to_string()
}

fn modelopt_algo(s: Scheme) -> (&'static str, Option<u32>) {
    match s {
        Scheme::Fp8Tensor => ("FP8", None),
        Scheme::Fp8Block => ("FP8_PB_WO", Some(128)),
        Scheme::Mxfp8 => ("MXFP8", Some(32)),
        Scheme::Nvfp4 => ("NVFP4", Some(16)),
        Scheme::Int4Tiled => ("W4A16", Some(128)),
    }
}

/// The producer block written into ModelOpt configs. `name` stays `modelopt` because
/// consumers key the format on it; the version says who wrote the file.
fn producer() -> Value {
    json!({"name": "modelopt", "version": format!("quantfmt-{}", env!("CARGO_PKG_VERSION"))})
}

/// Builds the configs for `layout` from the quantized weights and the names of
/// rank >= 2 weights left unquantized (`ignored`, written as module names).
pub fn layout_config(layout: Layout, entries: &[ConfigEntry], ignored: &[String]) -> LayoutConfig {
    let ignore: Vec<String> = ignored
        .iter()
        .map(|n| module(n))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let schemes: BTreeSet<Scheme> = entries.iter().map(|e| e.scheme).collect();
    match layout {
        Layout::Native => LayoutConfig::default(),
        Layout::ModelOpt => {
            let mut q = serde_json::Map::new();
            if schemes.len() == 1 {
                let s = *schemes.iter().next().unwrap_or(&Scheme::Nvfp4);
                let (algo, gs) = modelopt_algo(s);
                q.insert("quant_algo".into(), json!(algo));
                if let Some(gs) = gs {
                    q.insert("group_size".into(), json!(gs));
                }
            } else {
                q.insert("quant_algo".into(), json!("MIXED_PRECISION"));
                let layers: BTreeMap<String, Value> = entries
                    .iter()
                    .map(|e| {
                        let (algo, gs) = modelopt_algo(e.scheme);
                        let mut v = json!({"quant_algo": algo});
                        if let Some(gs) = gs {
                            v["group_size"] = json!(gs);
                        }
                        (module(&e.name), v)
                    })
                    .collect();
                q.insert("quantized_layers".into(), json!(layers));
            }
            q.insert("kv_cache_quant_algo".into(), Value::Null);
            q.insert("exclude_modules".into(), json!(ignore));
            let hf = json!({"producer": producer(), "quantization": Value::Object(q)});
            let qc = modelopt_quantization_config(&hf, entries);
            LayoutConfig {
                hf_quant_config: Some(hf),
                quantization_config: Some(qc),
            }
        }
        Layout::CompressedTensors => {
            let mut groups = serde_json::Map::new();
            let mixed = schemes.len() > 1;
            for (i, s) in schemes.iter().enumerate() {
                let with_input = entries.iter().any(|e| e.scheme == *s && e.input_scale);
                let mut g = ct_scheme(*s, with_input);
                let targets: Vec<String> = if mixed {
                    entries
                        .iter()
                        .filter(|e| e.scheme == *s)
                        .map(|e| module(&e.name))
                        .collect()
                } else {
                    vec!["Linear".to_string()]
                };
                g["targets"] = json!(targets);
                groups.insert(format!("group_{i}"), g);
            }
            let format = if mixed {
                "mixed-precision".to_string()
            } else {
                schemes
                    .iter()
                    .next()
                    .map(|s| ct_format(*s).to_string())
                    .unwrap_or_else(|| "dense".into())
            };
            LayoutConfig {
                hf_quant_config: None,
                quantization_config: Some(json!({
                    "quant_method": "compressed-tensors",
                    "format": format,
                    "quantization_status": "compressed",
                    "config_groups": Value::Object(groups),
                    "ignore": ignore,
                    "kv_cache_scheme": Value::Null,
                })),
            }
        }
        Layout::TorchAo => {
            let group = entries.iter().find_map(|e| e.group_size).unwrap_or(128);
            LayoutConfig {
                hf_quant_config: None,
                quantization_config: Some(json!({
                    "quant_method": "torchao",
                    "quant_type": {"default": {
                        "_type": "Int4WeightOnlyConfig",
                        "_version": 2,
                        "_data": {
                            "group_size": group,
                            "int4_packing_format": {"_type": "Int4PackingFormat", "_data": "TILE_PACKED_TO_4D"},
                        },
                    }},
                    "modules_to_not_convert": ignore,
                })),
            }
        }
        Layout::DeepSeek => {
            let mut qc = json!({
                "activation_scheme": "dynamic",
                "fmt": "e4m3",
                "quant_method": "fp8",
                "weight_block_size": [128, 128],
            });
            if !ignore.is_empty() {
                // transformers' FineGrainedFP8Config field for modules kept in high precision.
                qc["modules_to_not_convert"] = json!(ignore);
            }
            LayoutConfig {
                hf_quant_config: None,
                quantization_config: Some(qc),
            }
        }
    }
}

/// ModelOpt's `convert_hf_quant_config_format` for the algorithms written here
/// (`modelopt/torch/export/convert_hf_config.py`).
fn modelopt_quantization_config(hf: &Value, entries: &[ConfigEntry]) -> Value {
    let q = &hf["quantization"];
    let algo = q["quant_algo"].as_str().unwrap_or("");
    let group = |s: Scheme| -> Value {
        let (_, gs) = modelopt_algo(s);
        let bits = if s == Scheme::Nvfp4 { 4 } else { 8 };
        let mut w = json!({"dynamic": false, "num_bits": bits, "type": "float"});
        if let Some(gs) = gs {
            w["group_size"] = json!(gs);
        }
        json!({"input_activations": w.clone(), "weights": w})
    };
    let mut out = serde_json::Map::new();
    if algo == "MIXED_PRECISION" {
        let mut groups = serde_json::Map::new();
        let schemes: BTreeSet<Scheme> = entries.iter().map(|e| e.scheme).collect();
        for (i, s) in schemes.iter().enumerate() {
            let mut g = group(*s);
            let targets: Vec<String> = entries
                .iter()
                .filter(|e| e.scheme == *s)
                .map(|e| module(&e.name))
                .collect();
            g["targets"] = json!(targets);
            groups.insert(format!("group_{i}"), g);
        }
        out.insert("config_groups".into(), Value::Object(groups));
        out.insert("quantized_layers".into(), q["quantized_layers"].clone());
    } else if let Some(s) = entries.first().map(|e| e.scheme) {
        let mut g = group(s);
        g["targets"] = json!(["Linear"]);
        out.insert("config_groups".into(), json!({"group_0": g}));
    }
    out.insert("ignore".into(), q["exclude_modules"].clone());
    if !algo.is_empty() {
        out.insert("quant_algo".into(), json!(algo));
    }
    out.insert("producer".into(), hf["producer"].clone());
    out.insert("quant_method".into(), json!("modelopt"));
    Value::Object(out)
}

fn ct_format(s: Scheme) -> &'static str {
    match s {
        Scheme::Fp8Tensor | Scheme::Fp8Block => "float-quantized",
        Scheme::Mxfp8 => "mxfp8-quantized",
        Scheme::Nvfp4 => "nvfp4-pack-quantized",
        Scheme::Int4Tiled => "pack-quantized",
    }
}

/// A compressed-tensors `QuantizationScheme` (the presets of
/// `quantization/quant_scheme.py`: FP8, FP8_BLOCK, MXFP8, NVFP4 and their weight-only
/// variants when no static input scale is written).
fn ct_scheme(s: Scheme, static_input: bool) -> Value {
    let base = |bits: u32| {
        json!({"num_bits": bits, "type": "float", "symmetric": true, "dynamic": false,
               "group_size": Value::Null, "strategy": Value::Null, "block_structure": Value::Null,
               "actorder": Value::Null, "scale_dtype": Value::Null, "zp_dtype": Value::Null,
               "observer": "minmax", "observer_kwargs": {}})
    };
    let (weights, input) = match s {
        Scheme::Fp8Tensor => {
            let mut w = base(8);
            w["strategy"] = json!("tensor");
            let mut a = base(8);
            if static_input {
                a["strategy"] = json!("tensor");
            } else {
                a["strategy"] = json!("token");
                a["dynamic"] = json!(true);
                a["observer"] = Value::Null;
            }
            (w, Some(a))
        }
        Scheme::Fp8Block => {
            let mut w = base(8);
            w["strategy"] = json!("block");
            w["block_structure"] = json!([128, 128]);
            let mut a = base(8);
            a["strategy"] = json!("group");
            a["group_size"] = json!(128);
            a["dynamic"] = json!(true);
            a["observer"] = Value::Null;
            (w, Some(a))
        }
        Scheme::Mxfp8 => {
            let mut w = base(8);
            w["strategy"] = json!("group");
            w["group_size"] = json!(32);
            w["scale_dtype"] = json!("torch.uint8");
            w["zp_dtype"] = json!("torch.uint8");
            let mut a = w.clone();
            a["dynamic"] = json!(true);
            a["observer"] = Value::Null;
            (w, Some(a))
        }
        Scheme::Int4Tiled => {
            let mut w = base(4);
            w["type"] = json!("int");
            w["symmetric"] = json!(false);
            w["strategy"] = json!("group");
            w["group_size"] = json!(128);
            (w, None)
        }
        Scheme::Nvfp4 => {
            let mut w = base(4);
            w["strategy"] = json!("tensor_group");
            w["group_size"] = json!(16);
            w["scale_dtype"] = json!("torch.float8_e4m3fn");
            w["zp_dtype"] = json!("torch.float8_e4m3fn");
            let a = if static_input {
                let mut a = w.clone();
                a["dynamic"] = json!("local");
                a["observer"] = json!("static_minmax");
                Some(a)
            } else {
                None
            };
            (w, a)
        }
    };
    json!({
        "weights": weights,
        "input_activations": input.unwrap_or(Value::Null),
        "output_activations": Value::Null,
        "format": ct_format(s),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn declared_layouts() {
        let c = CheckpointConfig {
            config: Some(json!({"quantization_config": {"quant_method": "compressed-tensors"}})),
            ..Default::default()
        };
        assert_eq!(c.declared_layout(), Some(Layout::CompressedTensors));
        let c = CheckpointConfig {
            config: Some(
                json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}, "torch_dtype": "bfloat16"}),
            ),
            ..Default::default()
        };
        assert_eq!(c.declared_layout(), Some(Layout::DeepSeek));
        assert_eq!(c.torch_dtype(), Some(DType::BF16));
        let c = CheckpointConfig {
            hf_quant_config: Some(
                json!({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}),
            ),
            ..Default::default()
        };
        assert_eq!(c.declared_layout(), Some(Layout::ModelOpt));
    }

    #[test]
    fn mixed_modelopt_lists_layers() {
        let e = vec![
            ConfigEntry {
                name: "a.weight".into(),
                scheme: Scheme::Nvfp4,
                input_scale: false,
                group_size: None,
            },
            ConfigEntry {
                name: "b.weight".into(),
                scheme: Scheme::Fp8Tensor,
                input_scale: false,
                group_size: None,
            },
        ];
        let c = layout_config(Layout::ModelOpt, &e, &["lm_head.weight".into()]);
        let hf = c.hf_quant_config.unwrap();
        assert_eq!(hf["quantization"]["quant_algo"], "MIXED_PRECISION");
        assert_eq!(
            hf["quantization"]["quantized_layers"]["a"]["quant_algo"],
            "NVFP4"
        );
        assert_eq!(hf["quantization"]["exclude_modules"], json!(["lm_head"]));
        let qc = c.quantization_config.unwrap();
        assert_eq!(qc["quant_method"], "modelopt");
        let ct = layout_config(Layout::CompressedTensors, &e, &[]);
        let qc = ct.quantization_config.unwrap();
        assert_eq!(qc["format"], "mixed-precision");
        assert_eq!(qc["config_groups"]["group_0"]["targets"], json!(["b"]));
        assert_eq!(
            qc["config_groups"]["group_1"]["format"],
            "nvfp4-pack-quantized"
        );
    }
}
