//! NVIDIA ModelOpt HF export (`modelopt/torch/export/unified_export_hf.py`).
//!
//! | scheme | tensors of weight `W` (`P.weight`) | convention |
//! |---|---|---|
//! | NVFP4 | `W` U8 `[..., K/2]`, `W_scale` F8_E4M3 `[..., K/16]`, `W_scale_2` F32 `[]`, `P.input_scale` F32 `[]` | multiply: `w = e2m1 * f32(W_scale) * W_scale_2`, `W_scale_2 = amax/(6*448)` |
//! | FP8 | `W` F8_E4M3 `[..., K]`, `W_scale` F32 `[]`, `P.input_scale` F32 `[]` | multiply: `w = fp8 * W_scale`, `W_scale = amax/448` |
//! | MXFP8 | `W` F8_E4M3 `[..., K]`, `W_scale` U8 (E8M0) `[..., K/32]` | multiply: `w = fp8 * 2^(W_scale - 127)` |
//!
//! Sources: `qtensor/nvfp4_tensor.py` (`get_weights_scaling_factor_2`, `quantize`:
//! `packed = (q[..., 1::2] << 4) | q[..., 0::2]`, even element in the low nibble;
//! `dequantize`: `per_block_scale = f32(scale) * double_scale`), `export/quant_utils.py`
//! (`get_scaling_factor = amax / maxbound`, `to_quantized_weight`: `weight /
//! weights_scaling_factor`), `qtensor/mxfp8_tensor.py` (biased E8M0 scale, bias 127).
//!
//! FP8 and MXFP8 move losslessly both ways: the native `scale_inv` / E8M0 codes are the
//! same multipliers. For NVFP4 the codes and block scales move losslessly; the tensor
//! scalar is written as ModelOpt computes it from the amax, `f32(amax / 2688)`; reading
//! it back gives the f32 amax nearest `W_scale_2 * 2688` that reproduces it
//! ([`super::canonical::amax_from_scale_2`]), or the exact amax from the sidecar.

use quant_core::io::RawTensor;
use quant_core::io::writer::TensorSlot;
use quant_core::{Error, HostBytes, Result};
use safetensors::Dtype;

use super::canonical::{
    Canonical, Scales, Scheme, StoredScalar, amax_from_scale_2, codes_from_raw, expect_dtype,
    expect_shape, last_div, raw, raw_f32, refuse_zero_amax_nan_scales, scalar_f32,
    scale_2_from_amax, scales_from_raw,
};
use super::detect::{Unit, UnitKind};
use super::{Extras, Layout, LayoutTensors, module_prefix, unsupported_scheme};

fn input_scale_name(name: &str) -> Option<String> {
    module_prefix(name).map(|p| format!("{p}.input_scale"))
}

/// The tensors written for weight `name` (see the module table).
pub fn slots(
    name: &str,
    scheme: Scheme,
    shape: &[usize],
    extras: &Extras,
) -> Result<Vec<TensorSlot>> {
    let mut v = match scheme {
        Scheme::Nvfp4 => vec![
            TensorSlot::new(name, Dtype::U8, &last_div(shape, 2)),
            TensorSlot::new(
                format!("{name}_scale"),
                Dtype::F8_E4M3,
                &last_div(shape, 16),
            ),
            TensorSlot::new(format!("{name}_scale_2"), Dtype::F32, &[]),
        ],
        Scheme::Fp8Tensor => vec![
            TensorSlot::new(name, Dtype::F8_E4M3, shape),
            TensorSlot::new(format!("{name}_scale"), Dtype::F32, &[]),
        ],
        Scheme::Mxfp8 => vec![
            TensorSlot::new(name, Dtype::F8_E4M3, shape),
            TensorSlot::new(format!("{name}_scale"), Dtype::U8, &last_div(shape, 32)),
        ],
        Scheme::Fp8Block | Scheme::Int4Tiled => {
            return Err(unsupported_scheme(Layout::ModelOpt, scheme));
        }
    };
    if let (Some(_), Some(n)) = (extras.input_scale, input_scale_name(name)) {
        v.push(TensorSlot::new(n, Dtype::F32, &[]));
    }
    Ok(v)
}

/// Writes a canonical weight; returns its tensors and notes.
pub fn export(name: &str, c: &Canonical, extras: &Extras) -> Result<LayoutTensors> {
    let mut notes = Vec::new();
    let mut v = match (c.scheme, &c.scales) {
        (Scheme::Nvfp4, Scales::U8(s)) => {
            let s2 = scale_2_from_amax(c.amax, c.e4m3_max);
            vec![
                (
                    name.to_string(),
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
                (format!("{name}_scale_2"), raw_f32(&[], &[s2])),
            ]
        }
        (Scheme::Fp8Tensor, Scales::F32(s)) => vec![
            (
                name.to_string(),
                raw(Dtype::F8_E4M3, &c.shape, c.codes.clone()),
            ),
            (format!("{name}_scale"), raw_f32(&[], s)),
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
        (scheme, _) => return Err(unsupported_scheme(Layout::ModelOpt, scheme)),
    };
    match (extras.input_scale, input_scale_name(name)) {
        (Some(x), Some(n)) => v.push((n, raw_f32(&[], &[x]))),
        (Some(_), None) => notes.push(format!(
            "input scale of `{name}` dropped: ModelOpt names it after a `.weight` module"
        )),
        _ => {}
    }
    Ok((v, notes))
}

fn fetch_checked(
    fetch: &mut dyn FnMut(&str) -> Result<RawTensor>,
    unit: &Unit,
    i: usize,
) -> Result<RawTensor> {
    let d = unit
        .members
        .get(i)
        .ok_or_else(|| Error::invalid("unit", &unit.name, "has too few tensors"))?;
    fetch(&d.name)
}

/// Reads a ModelOpt weight.
pub fn import(
    unit: &Unit,
    fetch: &mut dyn FnMut(&str) -> Result<RawTensor>,
) -> Result<(Canonical, Extras, Vec<String>)> {
    let UnitKind::Scheme(scheme) = unit.kind else {
        return Err(Error::invalid(
            "unit",
            &unit.name,
            "is not a ModelOpt weight",
        ));
    };
    let mut notes = Vec::new();
    let w = fetch_checked(fetch, unit, 0)?;
    let s = fetch_checked(fetch, unit, 1)?;
    let wname = unit.members[0].name.clone();
    let sname = unit.members[1].name.clone();
    let (codes, shape) = codes_from_raw(w, scheme, &wname)?;
    let scales = scales_from_raw(&s, scheme, &sname)?;
    let c = match scheme {
        Scheme::Nvfp4 => {
            expect_dtype(&s, &sname, &[Dtype::F8_E4M3, Dtype::U8])?;
            expect_shape(&s, &sname, &last_div(&shape, 16))?;
            let s2raw = fetch_checked(fetch, unit, 2)?;
            let s2name = &unit.members[2].name;
            let s2 = scalar_f32(&s2raw, s2name)?;
            refuse_zero_amax_nan_scales(&s, &sname, (s2, s2name), s2 == 0.0)?;
            let (amax, exact) = amax_from_scale_2(s2, 448);
            if !exact {
                notes.push(format!(
                    "`{}` = {s2:e} is not amax/2688 of any f32 amax; writing it back gives {:e}",
                    unit.members[2].name,
                    scale_2_from_amax(amax, 448)
                ));
            }
            Canonical {
                scheme,
                shape,
                codes,
                scales,
                amax,
                e4m3_max: 448,
                stored: Some(StoredScalar::Scale2(s2)),
            }
        }
        Scheme::Fp8Tensor => {
            scalar_f32(&s, &sname)?;
            Canonical {
                scheme,
                shape,
                codes,
                scales,
                amax: 0.0,
                e4m3_max: 448,
                stored: None,
            }
        }
        Scheme::Mxfp8 => {
            expect_shape(&s, &sname, &last_div(&shape, 32))?;
            Canonical {
                scheme,
                shape,
                codes,
                scales,
                amax: 0.0,
                e4m3_max: 448,
                stored: None,
            }
        }
        Scheme::Fp8Block | Scheme::Int4Tiled => {
            return Err(unsupported_scheme(Layout::ModelOpt, scheme));
        }
    };
    let mut extras = Extras::default();
    if let Some(n) = &unit.input_scale {
        let r = fetch(n)?;
        extras.input_scale = Some(scalar_f32(&r, n)?);
    }
    Ok((c, extras, notes))
}
