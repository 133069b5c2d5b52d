//! Tensor classes by name, following the Hugging Face naming of transformer checkpoints
//! (Llama/Mistral/Qwen `self_attn.q_proj`, `mlp.gate_proj`, Mixtral
//! `block_sparse_moe.experts.N.w1`, fused `mlp.experts.down_proj`, GPT-2 `attn.c_attn`,
//! `mlp.c_fc`, ...). Used to report quantization error per class: attention, MLP and
//! expert weights tolerate different formats.

use std::fmt;

/// What a weight is, judged by its name.
///
/// ```
/// use quantfmt::interop::TensorClass;
/// assert_eq!(TensorClass::of("model.layers.0.self_attn.k_proj.weight"), TensorClass::Attention);
/// assert_eq!(TensorClass::of("model.layers.3.mlp.experts.7.down_proj.weight"), TensorClass::Experts);
/// assert_eq!(TensorClass::of("model.layers.0.mlp.up_proj.weight"), TensorClass::Mlp);
/// assert_eq!(TensorClass::of("lm_head.weight"), TensorClass::Output);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorClass {
    /// Attention projections (q, k, v, o, fused qkv).
    Attention,
    /// Dense MLP / feed-forward weights.
    Mlp,
    /// Mixture-of-experts expert weights.
    Experts,
    /// Token or position embeddings.
    Embedding,
    /// Normalisation weights.
    Norm,
    /// The output projection (`lm_head`).
    Output,
    /// Anything else (routers, vision towers, ...).
    Other,
}

impl TensorClass {
    /// Every class, in report order.
    pub const ALL: [TensorClass; 7] = [
        TensorClass::Attention,
        TensorClass::Mlp,
        TensorClass::Experts,
        TensorClass::Embedding,
        TensorClass::Norm,
        TensorClass::Output,
        TensorClass::Other,
    ];

    /// The class of a tensor name.
    pub fn of(name: &str) -> TensorClass {
        let n = name.to_ascii_lowercase();
        let has = |keys: &[&str]| keys.iter().any(|k| n.contains(k));
        if has(&["experts", "expert."]) {
            TensorClass::Experts
        } else if has(&["norm", ".ln_", "ln_f"]) {
            TensorClass::Norm
        } else if has(&["embed", "wte", "wpe"]) {
            TensorClass::Embedding
        } else if has(&["lm_head"]) {
            TensorClass::Output
        } else if has(&["router", ".gate.weight"]) {
            TensorClass::Other
        } else if has(&[
            "attn",
            "attention",
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "qkv",
            "query",
            ".key",
            ".value",
            "wq.",
            "wk.",
            "wv.",
            "wo.",
        ]) {
            TensorClass::Attention
        } else if has(&[
            "mlp",
            "ffn",
            "feed_forward",
            "gate_proj",
            "up_proj",
            "down_proj",
            "fc1",
            "fc2",
            "c_fc",
            "w1.",
            "w2.",
            "w3.",
            "dense_h_to_4h",
            "dense_4h_to_h",
        ]) {
            TensorClass::Mlp
        } else {
            TensorClass::Other
        }
    }

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            TensorClass::Attention => "attention",
            TensorClass::Mlp => "mlp",
            TensorClass::Experts => "experts",
            TensorClass::Embedding => "embedding",
            TensorClass::Norm => "norm",
            TensorClass::Output => "output",
            TensorClass::Other => "other",
        }
    }
}

impl fmt::Display for TensorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
