//! Which tensors to quantize: `--include` / `--exclude` glob patterns over tensor names,
//! and defaults for LLM checkpoints that `--all` turns off.
//!
//! A tensor is quantized when it matches an `--include` pattern (default `*`), matches
//! no `--exclude` pattern, and is not left out by the defaults, unless an explicit
//! `--include` pattern names it. The defaults keep in high precision what quantized
//! inference keeps there: embeddings, norms, `lm_head`, biases and MoE routers.

use glob::Pattern;
use quant_core::{Error, Result};

/// Default patterns left unquantized, with the reason shown to the user.
pub const DEFAULT_SKIPS: &[(&str, &str)] = &[
    ("*embed*", "embedding"),
    ("*wte*", "embedding"),
    ("*wpe*", "embedding"),
    ("*norm*", "norm"),
    ("*.ln_*", "norm"),
    ("*lm_head*", "lm_head"),
    ("*.bias", "bias"),
    ("*.gate.weight", "MoE router"),
    ("*router*", "MoE router"),
];

/// The selection rules.
#[derive(Clone, Debug)]
pub struct Selection {
    include: Vec<Pattern>,
    exclude: Vec<Pattern>,
    all: bool,
}

fn patterns(v: &[String], flag: &str) -> Result<Vec<Pattern>> {
    v.iter()
        .map(|p| {
            Pattern::new(p)
                .map_err(|e| Error::invalid(flag, p, format!("is not a glob pattern: {e}")))
        })
        .collect()
}

impl Selection {
    /// Builds the rules; `all` turns the LLM defaults off.
    pub fn new(include: &[String], exclude: &[String], all: bool) -> Result<Selection> {
        Ok(Selection {
            include: patterns(include, "--include")?,
            exclude: patterns(exclude, "--exclude")?,
            all,
        })
    }

    /// `Ok(())` when `name` is selected, else the reason it is not.
    pub fn decide(&self, name: &str) -> std::result::Result<(), String> {
        if let Some(p) = self.exclude.iter().find(|p| p.matches(name)) {
            return Err(format!("excluded by --exclude {p}"));
        }
        let explicit = self.include.iter().any(|p| p.matches(name));
        if !self.include.is_empty() && !explicit {
            return Err("matches no --include pattern".into());
        }
        if !self.all
            && !explicit
            && let Some((p, why)) = DEFAULT_SKIPS
                .iter()
                .find(|(p, _)| Pattern::new(p).is_ok_and(|p| p.matches(name)))
        {
            return Err(format!(
                "{why} kept in high precision by default ({p}; --all quantizes it)"
            ));
        }
        Ok(())
    }

    /// Whether the user excluded `name` explicitly.
    pub fn explicitly_excluded(&self, name: &str) -> bool {
        self.exclude.iter().any(|p| p.matches(name))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let s = Selection::new(&[], &[], false).unwrap();
        assert!(s.decide("model.layers.0.mlp.gate_proj.weight").is_ok());
        assert!(
            s.decide("model.embed_tokens.weight")
                .unwrap_err()
                .contains("embedding")
        );
        assert!(s.decide("lm_head.weight").is_err());
        assert!(s.decide("model.layers.0.input_layernorm.weight").is_err());
        assert!(
            s.decide("model.layers.0.block_sparse_moe.gate.weight")
                .is_err()
        );
        assert!(s.decide("model.layers.0.self_attn.q_proj.bias").is_err());
        let all = Selection::new(&[], &[], true).unwrap();
        assert!(all.decide("lm_head.weight").is_ok());
        let inc = Selection::new(&["*lm_head*".into()], &["*.0.*".into()], false).unwrap();
        assert!(inc.decide("lm_head.weight").is_ok());
        assert!(inc.decide("model.layers.0.mlp.up_proj.weight").is_err());
        assert!(Selection::new(&["[".into()], &[], false).is_err());
    }
}
