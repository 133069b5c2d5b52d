//! DeepSeek-V3 / R1 blockwise FP8 (deepseek-ai/DeepSeek-V3 `README_WEIGHTS.md`,
//! `inference/kernel.py: weight_dequant`).
//!
//! Weight `W`: `W` F8_E4M3 `[N, K]` and `W_scale_inv` F32 `[ceil(N/128), ceil(K/128)]`.
//! Despite its name, `weight_scale_inv` is the dequantize **multiplier**:
//! `w[i, j] = fp8[i, j] * weight_scale_inv[i / 128, j / 128]`; ragged edge tiles are
//! partial. `quantization_config`: `{"activation_scheme": "dynamic", "fmt": "e4m3",
//! "quant_method": "fp8", "weight_block_size": [128, 128]}`; activations are quantized
//! dynamically (1x128 per token), so no input scale is stored.
//!
//! TransformerEngine's 128x128 `rowwise_scale_inv` holds the same multipliers, padded to
//! `[ceil(N/128), roundup(ceil(K/128), 4)]`; the move is lossless both ways.

use quant_core::io::RawTensor;
use quant_core::io::writer::TensorSlot;
use quant_core::{Error, Result};
use safetensors::Dtype;

use super::canonical::{
    Canonical, Scales, Scheme, block_scale_shape, codes_from_raw, expect_shape, raw, raw_f32,
    scales_from_raw,
};
use super::detect::{Unit, UnitKind};
use super::{Extras, Layout, LayoutTensors, unsupported_scheme};

/// The tensors written for weight `name`.
pub fn slots(name: &str, scheme: Scheme, shape: &[usize]) -> Result<Vec<TensorSlot>> {
    if scheme != Scheme::Fp8Block {
        return Err(unsupported_scheme(Layout::DeepSeek, scheme));
    }
    Ok(vec![
        TensorSlot::new(name, Dtype::F8_E4M3, shape),
        TensorSlot::new(
            format!("{name}_scale_inv"),
            Dtype::F32,
            &block_scale_shape(shape),
        ),
    ])
}

/// Writes a canonical weight.
pub fn export(name: &str, c: &Canonical, extras: &Extras) -> Result<LayoutTensors> {
    let Scales::F32(s) = &c.scales else {
        return Err(unsupported_scheme(Layout::DeepSeek, c.scheme));
    };
    if c.scheme != Scheme::Fp8Block {
        return Err(unsupported_scheme(Layout::DeepSeek, c.scheme));
    }
    let mut notes = Vec::new();
    if extras.input_scale.is_some() {
        notes.push(format!(
            "static input scale of `{name}` dropped: DeepSeek-V3 quantizes activations dynamically"
        ));
    }
    Ok((
        vec![
            (
                name.to_string(),
                raw(Dtype::F8_E4M3, &c.shape, c.codes.clone()),
            ),
            (
                format!("{name}_scale_inv"),
                raw_f32(&block_scale_shape(&c.shape), s),
            ),
        ],
        notes,
    ))
}

/// Reads a DeepSeek weight.
pub fn import(
    unit: &Unit,
    fetch: &mut dyn FnMut(&str) -> Result<RawTensor>,
) -> Result<(Canonical, Extras, Vec<String>)> {
    if unit.kind != UnitKind::Scheme(Scheme::Fp8Block) || unit.members.len() < 2 {
        return Err(Error::invalid(
            "unit",
            &unit.name,
            "is not a DeepSeek FP8 weight",
        ));
    }
    let (wn, sn) = (&unit.members[0].name, &unit.members[1].name);
    let (codes, shape) = codes_from_raw(fetch(wn)?, Scheme::Fp8Block, wn)?;
    let s = fetch(sn)?;
    expect_shape(&s, sn, &block_scale_shape(&shape))?;
    let scales = scales_from_raw(&s, Scheme::Fp8Block, sn)?;
    Ok((
        Canonical {
            scheme: Scheme::Fp8Block,
            shape,
            codes,
            scales,
            amax: 0.0,
            e4m3_max: 448,
            stored: None,
        },
        Extras::default(),
        Vec::new(),
    ))
}
