//! Native units: a quantized tensor described by a file's `quantfmt` metadata, rebuilt
//! from its `NAME.<buffer>` tensors with every check `quant_core::io` applies.

use quant_core::io::RawTensor;
use quant_core::{Buffer, DType, Error, Quantizer, Result, Shape};

use super::Imported;
use super::detect::{Unit, UnitKind};
use crate::AnyStorage;

/// Rebuilds the native storage of `unit` (grouped tensors are refused: they are moved
/// as they are between native files and have no layout form).
pub fn read(unit: &Unit, fetch: &mut dyn FnMut(&str) -> Result<RawTensor>) -> Result<Imported> {
    let UnitKind::Native(tm) = &unit.kind else {
        return Err(Error::invalid("unit", &unit.name, "is not a native tensor"));
    };
    if tm.grouped.is_some() {
        return Err(Error::unsupported(
            "interop",
            format!("converting the grouped tensor `{}`", unit.name),
            "checkpoint layouts store one tensor per weight; save the experts as a 3-D tensor instead of a grouped one",
        ));
    }
    let shape = Shape::new(&tm.shape)?;
    let q = &unit.native.quantizer;
    let want = q.buffers(&shape)?;
    let mut bufs = Vec::with_capacity(want.len());
    for desc in want {
        let full = format!("{}.{}", unit.name, desc.name);
        let r = fetch(&full)?;
        if DType::from_safetensors(r.dtype) != Some(desc.dtype) || r.shape != desc.shape {
            return Err(Error::buffer(
                &desc.name,
                format!(
                    "`{full}` is {} {:?}, but {} stores {} {:?}",
                    r.dtype,
                    r.shape,
                    q.spec(),
                    desc.dtype,
                    desc.shape
                ),
            ));
        }
        bufs.push(Buffer::from_host_bytes(desc, r.data)?);
    }
    let s = q.unflatten(&shape, tm.dtype, bufs)?;
    Ok(Imported {
        storage: AnyStorage::from_box(s)?,
        extras: super::Extras::default(),
        notes: Vec::new(),
    })
}
