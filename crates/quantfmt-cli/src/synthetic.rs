//! The embedded default model: deterministic synthetic transformer-like weights.
//!
//! Real LLM weights are roughly Gaussian with heavy tails and a few outlier channels
//! (input features whose weights are an order of magnitude larger). That is what makes
//! per-tensor scaling lose precision and block scaling win, so the default set has both:
//! Student-t(4) bulk, a handful of outlier input channels, and per-row magnitude spread.
//! Generated in code from a fixed seed, so `quantfmt compare` needs no download.

use half::bf16;

/// One named synthetic tensor.
pub struct SynthTensor {
    /// Tensor name (Hugging Face Llama-style).
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Values (bf16, as checkpoints store them).
    pub data: Vec<bf16>,
}

/// SplitMix64: tiny, fast, good enough for synthetic data, identical on every machine.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    /// Student-t with 4 degrees of freedom (heavy tails), unit-ish variance.
    fn student_t4(&mut self) -> f64 {
        let z = self.normal();
        let chi2: f64 = (0..4).map(|_| self.normal().powi(2)).sum();
        z / (chi2 / 4.0).sqrt() / 2f64.sqrt()
    }
}

fn weight(rng: &mut Rng, name: &str, shape: &[usize], std: f64, outliers: usize) -> SynthTensor {
    let k = *shape.last().unwrap_or(&1);
    let rows: usize = shape.iter().product::<usize>() / k.max(1);
    // A few input channels carry much larger weights (outlier features).
    let outlier_cols: Vec<usize> = (0..outliers)
        .map(|_| (rng.next_u64() % k as u64) as usize)
        .collect();
    let mut data = Vec::with_capacity(rows * k);
    for _ in 0..rows {
        let row_scale = std * (0.5 + rng.uniform());
        for c in 0..k {
            let boost = if outlier_cols.contains(&c) { 12.0 } else { 1.0 };
            data.push(bf16::from_f64(rng.student_t4() * row_scale * boost));
        }
    }
    SynthTensor {
        name: name.to_string(),
        shape: shape.to_vec(),
        data,
    }
}

/// The default set: one decoder layer (attention with grouped-query K/V, gated MLP,
/// 4 MoE experts) plus a norm vector that is not quantized. About 14 M values.
pub fn default_model() -> Vec<SynthTensor> {
    let mut rng = Rng(0x5EED_0FC0_FFEE);
    let (h, kv, ff, e, eff) = (1024, 256, 2816, 4, 512);
    let p = "model.layers.0";
    let mut t = vec![
        weight(
            &mut rng,
            &format!("{p}.self_attn.q_proj.weight"),
            &[h, h],
            0.02,
            4,
        ),
        weight(
            &mut rng,
            &format!("{p}.self_attn.k_proj.weight"),
            &[kv, h],
            0.02,
            4,
        ),
        weight(
            &mut rng,
            &format!("{p}.self_attn.v_proj.weight"),
            &[kv, h],
            0.02,
            2,
        ),
        weight(
            &mut rng,
            &format!("{p}.self_attn.o_proj.weight"),
            &[h, h],
            0.015,
            2,
        ),
        weight(
            &mut rng,
            &format!("{p}.mlp.gate_proj.weight"),
            &[ff, h],
            0.02,
            6,
        ),
        weight(
            &mut rng,
            &format!("{p}.mlp.up_proj.weight"),
            &[ff, h],
            0.02,
            6,
        ),
        weight(
            &mut rng,
            &format!("{p}.mlp.down_proj.weight"),
            &[h, ff],
            0.012,
            8,
        ),
        weight(
            &mut rng,
            &format!("{p}.mlp.experts.down_proj"),
            &[e, h, eff],
            0.012,
            4,
        ),
    ];
    let norm: Vec<bf16> = (0..h)
        .map(|_| bf16::from_f64(1.0 + 0.1 * rng.normal()))
        .collect();
    t.push(SynthTensor {
        name: format!("{p}.input_layernorm.weight"),
        shape: vec![h],
        data: norm,
    });
    t
}

/// One tensor of the sharded synthetic checkpoint: name, shape, and the standard
/// deviation of its values (0 for norms, which are all ones).
fn llama_tensors(hidden: usize, layers: usize) -> Vec<(String, Vec<usize>, f32)> {
    let h = hidden;
    let ff = (h * 11 / 4).div_ceil(64) * 64;
    let vocab = (16 * h).max(1024);
    let mut v = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![vocab, h],
        0.02,
    )];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        v.push((format!("{p}.input_layernorm.weight"), vec![h], 0.0));
        for n in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            v.push((format!("{p}.self_attn.{n}.weight"), vec![h, h], 0.02));
        }
        v.push((format!("{p}.post_attention_layernorm.weight"), vec![h], 0.0));
        v.push((format!("{p}.mlp.gate_proj.weight"), vec![ff, h], 0.02));
        v.push((format!("{p}.mlp.up_proj.weight"), vec![ff, h], 0.02));
        v.push((format!("{p}.mlp.down_proj.weight"), vec![h, ff], 0.015));
    }
    v.push(("model.norm.weight".to_string(), vec![h], 0.0));
    v.push(("lm_head.weight".to_string(), vec![vocab, h], 0.02));
    v
}

/// Fills `out` with bf16 values of standard deviation `std` (ones when 0), from a
/// counter-based hash so any chunk can be made independently and in parallel.
fn fill_bf16(out: &mut [u8], seed: u64, std: f32) {
    use rayon::prelude::*;
    out.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut r = Rng(seed ^ ((c as u64) << 20).wrapping_mul(0x9E37_79B9));
            for v in chunk.chunks_exact_mut(2) {
                let x = if std == 0.0 {
                    1.0
                } else {
                    // Sum of four uniforms: bell-shaped, cheap, deterministic.
                    let u = r.next_u64();
                    let s: f32 = (0..4)
                        .map(|i| ((u >> (16 * i)) & 0xFFFF) as f32)
                        .sum::<f32>()
                        / 65536.0
                        - 2.0;
                    s * std * 1.7
                };
                v.copy_from_slice(&bf16::from_f32(x).to_le_bytes());
            }
        });
}

/// Writes a Llama-like checkpoint of about `total` bytes (bf16) into `dir` as `shards`
/// files with `model.safetensors.index.json` and a `config.json`, generating each
/// tensor as it is written (memory stays at one tensor). Returns (tensors, bytes).
pub fn write_sharded(
    dir: &std::path::Path,
    total: u64,
    shards: usize,
    hidden: usize,
) -> quant_core::Result<(usize, u64)> {
    use quant_core::io::writer::{StreamWriter, TensorSlot, write_json_atomic};
    use std::collections::BTreeMap;
    if hidden == 0 || !hidden.is_multiple_of(64) || shards == 0 {
        return Err(quant_core::Error::invalid(
            "--hidden/--shards",
            format!("{hidden}/{shards}"),
            "hidden must be a positive multiple of 64 and shards at least 1",
        ));
    }
    let per_layer = llama_tensors(hidden, 1)
        .iter()
        .map(|(_, s, _)| s.iter().product::<usize>() as u64 * 2)
        .sum::<u64>();
    let fixed = llama_tensors(hidden, 0)
        .iter()
        .map(|(_, s, _)| s.iter().product::<usize>() as u64 * 2)
        .sum::<u64>();
    let layers = (total.saturating_sub(fixed) / (per_layer - fixed).max(1)).max(1) as usize;
    let tensors = llama_tensors(hidden, layers);
    let bytes_of = |s: &[usize]| s.iter().product::<usize>() as u64 * 2;
    let sum: u64 = tensors.iter().map(|(_, s, _)| bytes_of(s)).sum();
    std::fs::create_dir_all(dir)?;
    let names: Vec<String> = (0..shards)
        .map(|i| format!("model-{:05}-of-{:05}.safetensors", i + 1, shards))
        .collect();
    let mut groups: Vec<Vec<&(String, Vec<usize>, f32)>> = vec![Vec::new(); shards];
    let mut acc = 0u64;
    for t in &tensors {
        let i = ((acc * shards as u64) / sum.max(1)).min(shards as u64 - 1) as usize;
        groups[i].push(t);
        acc += bytes_of(&t.1);
    }
    let mut weight_map = BTreeMap::new();
    let mut md = BTreeMap::new();
    md.insert("format".to_string(), "pt".to_string());
    for (i, g) in groups.iter().enumerate() {
        let slots: Vec<TensorSlot> = g
            .iter()
            .map(|(n, s, _)| TensorSlot::new(n, safetensors::Dtype::BF16, s))
            .collect();
        let w = StreamWriter::create(dir.join(&names[i]), slots, &md, 0)?;
        for (k, (n, s, std)) in g.iter().enumerate() {
            let mut buf = vec![0u8; bytes_of(s) as usize];
            fill_bf16(&mut buf, 0x5EED ^ ((i as u64) << 32) ^ k as u64, *std);
            w.write(n, &buf)?;
            weight_map.insert(n.clone(), names[i].clone());
        }
        w.finish(&md)?;
    }
    write_json_atomic(
        dir.join("model.safetensors.index.json"),
        &serde_json::json!({"metadata": {"total_size": sum}, "weight_map": weight_map}),
    )?;
    let ff = (hidden * 11 / 4).div_ceil(64) * 64;
    write_json_atomic(
        dir.join("config.json"),
        &serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": hidden, "intermediate_size": ff, "num_hidden_layers": layers,
            "vocab_size": (16 * hidden).max(1024), "torch_dtype": "bfloat16"
        }),
    )?;
    Ok((tensors.len(), sum))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_heavy_tailed() {
        let a = default_model();
        let b = default_model();
        assert_eq!(a[0].data, b[0].data);
        let x: Vec<f64> = a[0].data.iter().map(|v| f64::from(v.to_f32())).collect();
        let n = x.len() as f64;
        let mean = x.iter().sum::<f64>() / n;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let kurt = x.iter().map(|v| (v - mean).powi(4)).sum::<f64>() / n / var.powi(2);
        assert!(kurt > 4.0, "kurtosis {kurt} should exceed a Gaussian's 3");
    }
}
