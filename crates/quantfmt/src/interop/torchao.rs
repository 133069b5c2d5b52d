//! torchao int4 tile-packed weights (`Int4TilePackedTo4dTensor`) in torchao's safetensors
//! form (`torchao/prototype/safetensors/safetensors_support.py`,
//! `flatten_tensor_state_dict`).
//!
//! Weight `P.W` (usually `P.weight`) is stored as
//!
//! | tensor | dtype | shape |
//! |---|---|---|
//! | `P._W_qdata` | I32 | `[E,] N/8, K/(inner_k_tiles·16), 32, inner_k_tiles/2` |
//! | `P._W_scale_and_zero` | BF16 | `[E,] K/group, N, 2` |
//!
//! (`N` padded to 8, `K` to 1024 as `Int4TilePackedTo4dTensor.from_hp` pads it), with
//! file metadata `"P.W"` = `{"_type": "Int4TilePackedTo4dTensor", "_data": {"block_size":
//! [1, group], "shape": [N, K]}, "_tensor_data_names": ["qdata", "scale_and_zero"]}`,
//! `{"_type": "Tensor"}` (`torch.Tensor.__name__`) for every plain tensor, and `"tensor_names"` listing all of
//! them (JSON as Python's `json.dumps` writes it). The packed words and the scale/zero
//! pairs are quantfmt's `int4tiled` buffers (`packed_weight`, `scale_and_zero`) byte for
//! byte (`docs/formats/int4tiled.md`), so the conversion is a rename both ways.
//!
//! torchao writes `inner_k_tiles = 8` and pads `K` to a multiple of 1024; native tensors
//! quantized otherwise (`int4tiled:k4`, `pad=kernel` with `K % 1024 != 0`) are refused
//! for this layout (re-quantize with `int4tiled:pad=torchao`).

use fmt_int4tiled::{Int4TiledQuantizer, Padding};
use quant_core::io::RawTensor;
use quant_core::io::writer::TensorSlot;
use quant_core::{Buffer, BufferDesc, DType, Error, QuantizedTensor, Result, Shape, Storage};
use safetensors::Dtype;
use serde_json::Value;

use super::detect::{Unit, UnitKind};
use super::{Extras, LayoutTensors, Scheme};
use crate::{AnyQuantizer, AnyStorage};

/// The `_type` of the tensor subclass.
pub const TYPE: &str = "Int4TilePackedTo4dTensor";

/// `(P._W_qdata, P._W_scale_and_zero)` for weight `P.W`.
pub fn member_names(name: &str) -> Result<(String, String)> {
    let (m, w) = name.rsplit_once('.').ok_or_else(|| {
        Error::invalid(
            "torchao weight name",
            name,
            "must be `module.attribute` (torchao keys tensors as `module._attribute_qdata`)",
        )
    })?;
    Ok((
        format!("{m}._{w}_qdata"),
        format!("{m}._{w}_scale_and_zero"),
    ))
}

fn check(q: &Int4TiledQuantizer, shape: &[usize]) -> Result<()> {
    let k = shape.last().copied().unwrap_or(0);
    let torchao_k = quant_core::shape::round_up(k, fmt_int4tiled::TORCHAO_K_MULTIPLE);
    let ok_pad = q.padding() == Padding::Torchao
        || quant_core::shape::round_up(k, q.padding().k_multiple(q.inner_k_tiles())) == torchao_k;
    if q.inner_k_tiles() != 8 || !ok_pad {
        return Err(Error::unsupported(
            "torchao",
            format!("writing {} for K={k}", quant_core::Quantizer::spec(q)),
            "torchao stores inner_k_tiles=8 with K padded to a multiple of 1024; re-quantize with int4tiled:pad=torchao (--requantize)",
        ));
    }
    Ok(())
}

fn quantizer_of(s: &dyn Storage) -> Result<Int4TiledQuantizer> {
    match AnyQuantizer::from_dyn(s.quantizer())? {
        AnyQuantizer::Int4Tiled(q) => Ok(q),
        other => Err(super::unsupported_scheme(
            super::Layout::TorchAo,
            Scheme::of(&other)?,
        )),
    }
}

/// The file-metadata entry of weight `name` as torchao's JSON encoder writes it.
pub fn metadata_entry(q: &Int4TiledQuantizer, shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let mut block: Vec<String> = vec!["1".into(); shape.len().saturating_sub(1)];
    block.push(q.group_size().to_string());
    format!(
        "{{\"_type\": \"{TYPE}\", \"_data\": {{\"block_size\": [{}], \"shape\": [{}]}}, \"_tensor_data_names\": [\"qdata\", \"scale_and_zero\"]}}",
        block.join(", "),
        dims.join(", ")
    )
}

/// The entry of a plain tensor.
pub const PLAIN_ENTRY: &str = "{\"_type\": \"Tensor\"}";

/// `tensor_names` as `json.dumps` writes a list of strings.
pub fn tensor_names_entry(names: &[String]) -> Result<String> {
    let v: Vec<String> = names
        .iter()
        .map(serde_json::to_string)
        .collect::<std::result::Result<_, _>>()?;
    Ok(format!("[{}]", v.join(", ")))
}

/// The tensors written for weight `name` quantized by `q`.
pub fn slots(name: &str, q: &AnyQuantizer, shape: &[usize]) -> Result<Vec<TensorSlot>> {
    let AnyQuantizer::Int4Tiled(q) = q else {
        return Err(super::unsupported_scheme(
            super::Layout::TorchAo,
            Scheme::of(q)?,
        ));
    };
    check(q, shape)?;
    let g = q.geometry(&Shape::new(shape)?)?;
    let (qd, sz) = member_names(name)?;
    Ok(vec![
        TensorSlot::new(qd, Dtype::I32, &g.packed_shape()),
        TensorSlot::new(sz, Dtype::BF16, &g.scale_and_zero_shape()),
    ])
}

/// Writes a native int4tiled storage.
pub fn export(name: &str, s: &dyn Storage, extras: &Extras) -> Result<LayoutTensors> {
    let q = quantizer_of(s)?;
    check(&q, s.shape().dims())?;
    let (qd, sz) = member_names(name)?;
    let raw = |b: &Buffer| RawTensor {
        dtype: b.dtype().to_safetensors(),
        shape: b.shape().to_vec(),
        data: b.host().clone(),
    };
    let pw = s
        .buffer("packed_weight")
        .ok_or_else(|| Error::buffer("packed_weight", "is missing"))?;
    let sc = s
        .buffer("scale_and_zero")
        .ok_or_else(|| Error::buffer("scale_and_zero", "is missing"))?;
    let mut notes = Vec::new();
    if extras.input_scale.is_some() {
        notes.push(format!(
            "static input scale of `{name}` dropped: torchao int4 is weight-only"
        ));
    }
    Ok((vec![(qd, raw(pw)), (sz, raw(sc))], notes))
}

/// Plans a torchao weight from its metadata entry and the two tensors' headers.
pub(crate) fn plan(
    name: &str,
    entry: &Value,
    qdata: &super::TensorDesc,
    sz: &super::TensorDesc,
) -> Result<(Int4TiledQuantizer, Vec<usize>)> {
    let bad = |why: String| Error::invalid("torchao metadata", name, why);
    let data = entry
        .get("_data")
        .ok_or_else(|| bad("has no `_data`".into()))?;
    let dims = |k: &str| -> Result<Vec<usize>> {
        data.get(k)
            .and_then(Value::as_array)
            .ok_or_else(|| bad(format!("has no `{k}` list")))?
            .iter()
            .map(|v| {
                v.as_u64()
                    .map(|x| x as usize)
                    .ok_or_else(|| bad(format!("`{k}` holds a non-integer")))
            })
            .collect()
    };
    let shape = dims("shape")?;
    let block = dims("block_size")?;
    let group = *block
        .last()
        .ok_or_else(|| bad("has an empty block_size".into()))?;
    let ikt = qdata.shape.last().copied().unwrap_or(0) * 2;
    if qdata.dtype != Dtype::I32 || sz.dtype != Dtype::BF16 {
        return Err(bad(format!(
            "expects qdata I32 and scale_and_zero BF16, found {} and {}",
            qdata.dtype, sz.dtype
        )));
    }
    let base = Int4TiledQuantizer::new()
        .with_group_size(group)?
        .with_inner_k_tiles(ikt)?;
    let s = Shape::new(&shape)?;
    for pad in [Padding::Torchao, Padding::Kernel] {
        let q = base.clone().with_padding(pad);
        let g = q.geometry(&s)?;
        if g.packed_shape() == qdata.shape && g.scale_and_zero_shape() == sz.shape {
            return Ok((q, shape));
        }
    }
    Err(bad(format!(
        "qdata {:?} and scale_and_zero {:?} do not fit shape {shape:?} with group {group}",
        qdata.shape, sz.shape
    )))
}

/// Reads a torchao weight into a native int4tiled storage (a rename).
pub fn import(unit: &Unit, fetch: &mut dyn FnMut(&str) -> Result<RawTensor>) -> Result<AnyStorage> {
    if unit.kind != UnitKind::Scheme(Scheme::Int4Tiled) || unit.members.len() < 2 {
        return Err(Error::invalid(
            "unit",
            &unit.name,
            "is not a torchao int4 weight",
        ));
    }
    let AnyQuantizer::Int4Tiled(q) = &unit.native.quantizer else {
        return Err(Error::invalid(
            "unit",
            &unit.name,
            "is not planned as int4tiled",
        ));
    };
    let shape = Shape::new(&unit.shape)?;
    let mut bufs = Vec::with_capacity(2);
    for (member, (buf, dt)) in unit.members.iter().zip([
        ("packed_weight", DType::I32),
        ("scale_and_zero", DType::BF16),
    ]) {
        let r = fetch(&member.name)?;
        bufs.push(Buffer::from_host_bytes(
            BufferDesc::new(buf, dt, &r.shape),
            r.data,
        )?);
    }
    Ok(QuantizedTensor::from_buffers(q.clone(), &shape, unit.native.dtype, bufs)?.into())
}
