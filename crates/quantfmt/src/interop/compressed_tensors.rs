//! compressed-tensors (vllm-project/compressed-tensors; llm-compressor writes it, vLLM
//! reads it).
//!
//! | format (`quantization_config.format`) | tensors of weight `W` (`P.weight`) | convention |
//! |---|---|---|
//! | `nvfp4-pack-quantized` | `W_packed` U8 `[N, K/2]`, `W_scale` F8_E4M3 `[N, K/16]`, `W_global_scale` F32 `[1]`, `P.input_global_scale` F32 `[1]` | divide: `w = e2m1 * (f32(W_scale) / W_global_scale)`, `global = 448*6/amax` |
//! | `float-quantized`, strategy `tensor` | `W` F8_E4M3 `[N, K]`, `W_scale` F32 `[1]`, `P.input_scale` F32 `[1]` | multiply: `w = fp8 * W_scale` |
//! | `float-quantized`, strategy `block` `[128, 128]` | `W` F8_E4M3 `[N, K]`, `W_scale` F32 `[ceil(N/128), ceil(K/128)]` | multiply per tile |
//! | `mxfp8-quantized` | `W` F8_E4M3 `[N, K]`, `W_scale` U8 (E8M0) `[N, K/32]` | multiply by `2^(W_scale - 127)` |
//!
//! Sources: `compressors/nvfp4/base.py` (`weight_packed`, `weight_scale`,
//! `weight_global_scale`, `input_global_scale`), `compressors/nvfp4/helpers.py`
//! (`packed = idx[:, 0] | idx[:, 1] << 4`: even element in the low nibble),
//! `quantization/lifecycle/forward_helpers.py` (`_dequantize`: `scale = scale /
//! global_scale; x_q * scale`), `quantization/utils/helpers.py` (`generate_gparam`:
//! `global_scale = 448 * 6 / amax`; `calculate_qparams` reshapes 0-d scales to `[1]`),
//! `compressors/naive_quantized/base.py` (FP8 keeps the name `weight`),
//! `compressors/mx_utils.py` (E8M0 bias 127).
//!
//! The NVFP4 global scale written here is the `S_enc` TransformerEngine quantized with
//! (`fminf(6*448/amax, FLT_MAX)`, 1 for amax 0), equal to compressed-tensors' own value
//! for every normal amax. The static input scale is carried in ModelOpt's multiply
//! convention and written as its reciprocal, as compressed-tensors' ModelOpt converter
//! does (`input_global_scale = 1 / input_scale`, one f32 rounding each way).

use quant_core::io::RawTensor;
use quant_core::io::writer::TensorSlot;
use quant_core::{Error, HostBytes, Result};
use safetensors::Dtype;

use super::canonical::{
    Canonical, Scales, Scheme, StoredScalar, amax_from_global_scale, block_scale_shape,
    codes_from_raw, expect_dtype, expect_shape, global_scale_from_amax, last_div, raw, raw_f32,
    refuse_zero_amax_nan_scales, scalar_f32, scales_from_raw,
};
use super::detect::{Unit, UnitKind};
use super::{Extras, LayoutTensors, module_prefix};

fn input_name(name: &str, scheme: Scheme) -> Option<String> {
    module_prefix(name).map(|p| match scheme {
        Scheme::Nvfp4 => format!("{p}.input_global_scale"),
        _ => format!("{p}.input_scale"),
    })
}

/// The tensors written for weight `name`.
pub fn slots(
    name: &str,
    scheme: Scheme,
    shape: &[usize],
    extras: &Extras,
) -> Result<Vec<TensorSlot>> {
    let mut v = match scheme {
        Scheme::Int4Tiled => {
            return Err(super::unsupported_scheme(
                super::Layout::CompressedTensors,
                scheme,
            ));
        }
        Scheme::Nvfp4 => vec![
            TensorSlot::new(format!("{name}_packed"), Dtype::U8, &last_div(shape, 2)),
            TensorSlot::new(
                format!("{name}_scale"),
                Dtype::F8_E4M3,
                &last_div(shape, 16),
            ),
            TensorSlot::new(format!("{name}_global_scale"), Dtype::F32, &[1]),
        ],
        Scheme::Fp8Tensor => vec![
            TensorSlot::new(name, Dtype::F8_E4M3, shape),
            TensorSlot::new(format!("{name}_scale"), Dtype::F32, &[1]),
        ],
        Scheme::Fp8Block => vec![
            TensorSlot::new(name, Dtype::F8_E4M3, shape),
            TensorSlot::new(
                format!("{name}_scale"),
                Dtype::F32,
                &block_scale_shape(shape),
            ),
        ],
        Scheme::Mxfp8 => vec![
            TensorSlot::new(name, Dtype::F8_E4M3, shape),
            TensorSlot::new(format!("{name}_scale"), Dtype::U8, &last_div(shape, 32)),
        ],
    };
    if let (Some(_), Some(n), false) = (
        extras.input_scale,
        input_name(name, scheme),
        matches!(scheme, Scheme::Fp8Block | Scheme::Mxfp8),
    ) {
        v.push(TensorSlot::new(n, Dtype::F32, &[1]));
    }
    Ok(v)
}

/// Writes a canonical weight.
pub fn export(name: &str, c: &Canonical, extras: &Extras) -> Result<LayoutTensors> {
    let mut notes = Vec::new();
    let mut v = match (c.scheme, &c.scales) {
        (Scheme::Nvfp4, Scales::U8(s)) => vec![
            (
                format!("{name}_packed"),
                raw(Dtype::U8, &last_div(&c.shape, 2), c.codes.clone()),
            ),
            (
                format!("{name}_scale"),
                raw(
                    Dtype::F8_E4M3,
                    &last_div(&c.shape, 16),
                    HostBytes::copy_from(s),
                ),
            ),
            (
                format!("{name}_global_scale"),
                raw_f32(&[1], &[global_scale_from_amax(c.amax, c.e4m3_max)]),
            ),
        ],
        (Scheme::Fp8Tensor, Scales::F32(s)) => vec![
            (
                name.to_string(),
                raw(Dtype::F8_E4M3, &c.shape, c.codes.clone()),
            ),
            (format!("{name}_scale"), raw_f32(&[1], s)),
        ],
        (Scheme::Fp8Block, Scales::F32(s)) => vec![
            (
                name.to_string(),
                raw(Dtype::F8_E4M3, &c.shape, c.codes.clone()),
            ),
            (
                format!("{name}_scale"),
                raw_f32(&block_scale_shape(&c.shape), s),
            ),
        ],
        (Scheme::Mxfp8, Scales::U8(s)) => vec![
            (
                name.to_string(),
                raw(Dtype::F8_E4M3, &c.shape, c.codes.clone()),
            ),
            (
                format!("{name}_scale"),
                raw(Dtype::U8, &last_div(&c.shape, 32), HostBytes::copy_from(s)),
            ),
        ],
        (scheme, _) => {
            return Err(Error::invalid(
                "canonical scales",
                scheme.describe(),
                "do not match the scheme",
            ));
        }
    };
    if let Some(x) = extras.input_scale {
        match input_name(name, c.scheme) {
            Some(n) if c.scheme == Scheme::Nvfp4 => {
                notes.push(format!(
                    "`{n}` written as 1/input_scale (compressed-tensors divides by it; one f32 rounding)"
                ));
                v.push((n, raw_f32(&[1], &[1.0 / x])));
            }
            Some(n) if c.scheme == Scheme::Fp8Tensor => v.push((n, raw_f32(&[1], &[x]))),
            _ => notes.push(format!(
                "static input scale of `{name}` dropped: this compressed-tensors scheme quantizes activations dynamically"
            )),
        }
    }
    Ok((v, notes))
}

/// Reads a compressed-tensors weight.
pub fn import(
    unit: &Unit,
    fetch: &mut dyn FnMut(&str) -> Result<RawTensor>,
) -> Result<(Canonical, Extras, Vec<String>)> {
    let UnitKind::Scheme(scheme) = unit.kind else {
        return Err(Error::invalid(
            "unit",
            &unit.name,
            "is not a compressed-tensors weight",
        ));
    };
    let names: Vec<String> = unit.members.iter().map(|d| d.name.clone()).collect();
    if names.len() < 2 {
        return Err(Error::invalid("unit", &unit.name, "has too few tensors"));
    }
    let mut notes = Vec::new();
    let (codes, shape) = codes_from_raw(fetch(&names[0])?, scheme, &names[0])?;
    let s = fetch(&names[1])?;
    let scales = scales_from_raw(&s, scheme, &names[1])?;
    let mut c = Canonical {
        scheme,
        shape: shape.clone(),
        codes,
        scales,
        amax: 0.0,
        e4m3_max: 448,
        stored: None,
    };
    match scheme {
        Scheme::Int4Tiled => {
            return Err(super::unsupported_scheme(
                super::Layout::CompressedTensors,
                scheme,
            ));
        }
        Scheme::Nvfp4 => {
            expect_dtype(&s, &names[1], &[Dtype::F8_E4M3, Dtype::U8])?;
            expect_shape(&s, &names[1], &last_div(&shape, 16))?;
            let gname = names
                .get(2)
                .ok_or_else(|| Error::invalid("unit", &unit.name, "has no global scale"))?;
            let g = scalar_f32(&fetch(gname)?, gname)?;
            refuse_zero_amax_nan_scales(&s, &names[1], (g, gname), g == f32::INFINITY)?;
            let all_zero = s.data.as_slice().iter().all(|&b| b == 0);
            let (amax, exact) = amax_from_global_scale(g, 448, all_zero);
            if !exact {
                notes.push(format!(
                    "`{gname}` = {g:e} is not 2688/amax of any f32 amax; writing it back gives {:e}",
                    global_scale_from_amax(amax, 448)
                ));
            }
            c.amax = amax;
            c.stored = Some(StoredScalar::GlobalScale(g));
        }
        Scheme::Fp8Tensor => {
            scalar_f32(&s, &names[1])?;
        }
        Scheme::Fp8Block => {
            expect_shape(&s, &names[1], &block_scale_shape(&shape))?;
        }
        Scheme::Mxfp8 => {
            expect_shape(&s, &names[1], &last_div(&shape, 32))?;
        }
    }
    let mut extras = Extras::default();
    if let Some(n) = &unit.input_scale {
        let v = scalar_f32(&fetch(n)?, n)?;
        extras.input_scale = Some(if scheme == Scheme::Nvfp4 {
            notes.push(format!(
                "`{n}` read as input_scale = 1/{v:e} (one f32 rounding)"
            ));
            1.0 / v
        } else {
            v
        });
    }
    Ok((c, extras, notes))
}
