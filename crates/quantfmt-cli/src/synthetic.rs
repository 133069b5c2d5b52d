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
