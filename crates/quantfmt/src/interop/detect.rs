//! Planning a checkpoint from its headers: which tensors form one quantized weight, in
//! which layout, and what each becomes natively. No tensor data is read.
//!
//! Recognition is by companion names (the base weight `W`, e.g. `x.weight`):
//!
//! | companions of `W` | dtypes | unit |
//! |---|---|---|
//! | `W_packed`, `W_scale`, `W_global_scale` | U8/F4, F8_E4M3, F32 | compressed-tensors NVFP4 |
//! | `W`, `W_scale`, `W_scale_2` | U8/F4, F8_E4M3, F32 | ModelOpt NVFP4 |
//! | `W`, `W_scale_inv` | F8_E4M3, F32 `[ceil(N/128), ceil(K/128)]` | DeepSeek-V3 FP8 |
//! | `W`, `W_scale` | F8_E4M3, F32 one value | FP8 per-tensor (ModelOpt `[]`, compressed-tensors `[1]`) |
//! | `W`, `W_scale` | F8_E4M3, F32 `[ceil(N/128), ceil(K/128)]` | compressed-tensors FP8 block |
//! | `W`, `W_scale` | F8_E4M3, U8/F8_E8M0 `[..., K/32]` | MXFP8 (compressed-tensors or ModelOpt) |
//!
//! plus `P.input_scale` / `P.input_global_scale` for `W = P.weight`. Native files are
//! recognised by their `quantfmt` metadata; `*._extra_state` tensors (TransformerEngine's
//! pickled recipe state) are skipped with a note; everything else is a plain tensor.
//! Where the configs declare a layout, it decides between layouts that store a scheme
//! the same way (FP8 per-tensor and MXFP8 are identical in ModelOpt and
//! compressed-tensors).

use std::collections::{BTreeMap, BTreeSet};

use quant_core::io::{FileMeta, TensorMeta};
use quant_core::{DType, Error, Result};
use safetensors::Dtype;

use super::canonical::{NativePlan, Scheme, block_scale_shape};
use super::config::CheckpointConfig;
use super::sidecar::{Sidecar, SidecarEntry};
use super::{Layout, module_prefix};

/// A tensor as a header describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDesc {
    /// Name.
    pub name: String,
    /// Element dtype.
    pub dtype: Dtype,
    /// Shape (logical element shape for `F4`).
    pub shape: Vec<usize>,
}

impl TensorDesc {
    /// A description.
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: &[usize]) -> TensorDesc {
        TensorDesc {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    /// Bytes of data (saturating; headers were validated when read).
    pub fn nbytes(&self) -> u64 {
        let n: u64 = self.shape.iter().map(|&d| d as u64).product();
        n.saturating_mul(self.dtype.bitsize() as u64) / 8
    }
}

/// How a unit's tensors are read.
#[derive(Clone, Debug, PartialEq)]
pub enum UnitKind {
    /// A layout weight of this scheme.
    Scheme(Scheme),
    /// A native quantized (or grouped) tensor described by its metadata.
    Native(TensorMeta),
}

/// One quantized weight and the tensors it is stored in.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    /// The weight's name (the native tensor name, e.g. `a.b.weight`).
    pub name: String,
    /// The layout its tensors follow.
    pub layout: Layout,
    /// What it holds.
    pub kind: UnitKind,
    /// Logical shape.
    pub shape: Vec<usize>,
    /// Every tensor it consumes (weight data first).
    pub members: Vec<TensorDesc>,
    /// The companion input-scale tensor, if any (also in `members`).
    pub input_scale: Option<String>,
    /// What it becomes natively.
    pub native: NativePlan,
    /// The sidecar entry that planned it, if one was used.
    pub sidecar: Option<SidecarEntry>,
}

impl Unit {
    /// Bytes of all member tensors.
    pub fn nbytes(&self) -> u64 {
        self.members.iter().map(TensorDesc::nbytes).sum()
    }

    /// The scheme (for layout units) or the native format's scheme.
    pub fn scheme(&self) -> Result<Scheme> {
        match &self.kind {
            UnitKind::Scheme(s) => Ok(*s),
            UnitKind::Native(_) => Scheme::of(&self.native.quantizer),
        }
    }
}

/// One entry of a plan.
// A plan holds one item per tensor (thousands at most); boxing units would only add
// indirection to every match.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    /// A tensor that passes through (or that a caller may quantize).
    Plain(TensorDesc),
    /// A tensor left out, with the reason.
    Skip(TensorDesc, String),
    /// A quantized weight.
    Unit(Unit),
}

impl Item {
    /// The item's name.
    pub fn name(&self) -> &str {
        match self {
            Item::Plain(d) | Item::Skip(d, _) => &d.name,
            Item::Unit(u) => &u.name,
        }
    }
}

/// What a checkpoint holds.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// The layout the checkpoint is in (declared by its configs, else recognised from
    /// its tensors; `Native` when nothing is quantized).
    pub layout: Option<Layout>,
    /// Items in name order.
    pub items: Vec<Item>,
    /// What planning noticed (ignored sidecars, layout disagreements).
    pub notes: Vec<String>,
}

fn is_fp8(d: Dtype) -> bool {
    matches!(d, Dtype::F8_E4M3 | Dtype::U8)
}

/// Name endings of the tensors that quantized layouts quantfmt does not read store a
/// weight in: compressed-tensors' `pack-quantized` / `int-quantized` (`weight_packed`,
/// `weight_shape`, `weight_zero_point`), GPTQ and AWQ (`qweight`, `qzeros`, `scales`,
/// `g_idx`), and the scale companions of a weight left unread (`weight_scale`, ...).
const UNREAD_SUFFIXES: [(&str, &str); 11] = [
    ("weight_packed", "compressed-tensors packed integer weights"),
    ("weight_shape", "compressed-tensors packed integer weights"),
    ("weight_zero_point", "compressed-tensors zero points"),
    (".qweight", "GPTQ/AWQ packed weights"),
    (".qzeros", "GPTQ/AWQ zero points"),
    (".scales", "GPTQ/AWQ scales"),
    (".g_idx", "GPTQ group indices"),
    ("weight_scale", "the scale of a quantized weight"),
    ("weight_scale_inv", "the scale of a quantized weight"),
    ("weight_scale_2", "the scale of a quantized weight"),
    ("weight_global_scale", "the scale of a quantized weight"),
];

/// Why a tensor that planning left as a plain tensor (copied as it is) looks like part
/// of a quantized weight that quantfmt did not read: a low-precision dtype no unit
/// consumed, integer data named `*.weight`, or a name only quantized layouts use. `None`
/// for ordinary tensors. The copy is then reported, not silent: its values are not the
/// weight's.
///
/// ```
/// use quantfmt::interop::{TensorDesc, unread_quantized};
/// use safetensors::Dtype;
/// let w = TensorDesc::new("l.weight_packed", Dtype::I32, &[256, 64]);
/// assert!(unread_quantized(&w).unwrap().contains("packed integer"));
/// assert!(unread_quantized(&TensorDesc::new("l.weight", Dtype::BF16, &[4, 4])).is_none());
/// ```
pub fn unread_quantized(d: &TensorDesc) -> Option<String> {
    let low = matches!(
        d.dtype,
        Dtype::F8_E4M3
            | Dtype::F8_E5M2
            | Dtype::F8_E8M0
            | Dtype::F4
            | Dtype::F6_E2M3
            | Dtype::F6_E3M2
    );
    let integer = matches!(
        d.dtype,
        Dtype::I8 | Dtype::U8 | Dtype::I16 | Dtype::U16 | Dtype::I32 | Dtype::U32
    );
    let kind = if low {
        format!("{} data with no scale quantfmt pairs it with", d.dtype)
    } else if integer && d.name.ends_with(".weight") {
        // compressed-tensors int-quantized (W8A8), bitsandbytes, a unit missing a part.
        format!(
            "{} data named like a weight, in a layout quantfmt does not read",
            d.dtype
        )
    } else {
        let (_, what) = UNREAD_SUFFIXES.iter().find(|(s, _)| d.name.ends_with(s))?;
        format!("named like {what}, in a layout quantfmt does not read")
    };
    Some(format!("{kind}: copied unchanged, not converted"))
}

fn default_plan(scheme: Scheme, dtype: DType) -> NativePlan {
    NativePlan {
        quantizer: scheme.default_quantizer(),
        dtype,
    }
}

/// Plans a checkpoint: `tensors` from all headers, `native` and `sidecar` merged from
/// all files' metadata, `cfg` from its config files.
pub fn plan_checkpoint(
    tensors: &[TensorDesc],
    native: &FileMeta,
    sidecar: &Sidecar,
    cfg: &CheckpointConfig,
) -> Result<Plan> {
    let by_name: BTreeMap<&str, &TensorDesc> =
        tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    if by_name.len() != tensors.len() {
        return Err(Error::invalid(
            "checkpoint",
            "tensor names",
            "a tensor name appears in more than one file",
        ));
    }
    let declared = cfg.declared_layout();
    let dtype = cfg.torch_dtype().unwrap_or(DType::BF16);
    let mut used: BTreeSet<&str> = BTreeSet::new();
    let mut items = Vec::new();
    let mut notes = Vec::new();
    let mut seen_layouts = BTreeSet::new();

    // Native tensors first: their buffers are `NAME.<buffer>`.
    for (name, tm) in &native.tensors {
        let mut members = Vec::new();
        for b in &tm.buffers {
            let full = format!("{name}.{b}");
            let d = by_name.get(full.as_str()).ok_or_else(|| {
                Error::invalid(
                    "native tensor",
                    name,
                    format!("lists buffer `{b}`, but `{full}` is in no file"),
                )
            })?;
            used.insert(d.name.as_str());
            members.push((*d).clone());
        }
        let q = crate::registry().quantizer(&tm.format, &tm.options)?;
        let quantizer = crate::AnyQuantizer::from_dyn(&*q)?;
        seen_layouts.insert(Layout::Native);
        items.push(Item::Unit(Unit {
            name: name.clone(),
            layout: Layout::Native,
            kind: UnitKind::Native(tm.clone()),
            shape: tm.shape.clone(),
            members,
            input_scale: None,
            native: NativePlan {
                quantizer,
                dtype: tm.dtype,
            },
            sidecar: None,
        }));
    }

    // torchao int4 weights: declared in the files' metadata.
    for (name, entry) in &cfg.torchao {
        let (qn, sn) = super::torchao::member_names(name)?;
        let (Some(qd), Some(sd)) = (by_name.get(qn.as_str()), by_name.get(sn.as_str())) else {
            notes.push(format!(
                "torchao metadata names `{name}` but `{qn}` / `{sn}` are missing; ignored"
            ));
            continue;
        };
        let (q, shape) = super::torchao::plan(name, entry, qd, sd)?;
        let (native, side) = match sidecar.tensors.get(name) {
            Some(e) => match e.plan(Scheme::Int4Tiled) {
                Ok(p) => (p, Some(e.clone())),
                Err(err) => {
                    notes.push(format!("`{name}`: sidecar entry ignored: {err}"));
                    (
                        NativePlan {
                            quantizer: crate::AnyQuantizer::Int4Tiled(q),
                            dtype: DType::BF16,
                        },
                        None,
                    )
                }
            },
            None => (
                NativePlan {
                    quantizer: crate::AnyQuantizer::Int4Tiled(q),
                    dtype: DType::BF16,
                },
                None,
            ),
        };
        used.insert(qd.name.as_str());
        used.insert(sd.name.as_str());
        seen_layouts.insert(Layout::TorchAo);
        items.push(Item::Unit(Unit {
            name: name.clone(),
            layout: Layout::TorchAo,
            kind: UnitKind::Scheme(Scheme::Int4Tiled),
            shape,
            members: vec![(*qd).clone(), (*sd).clone()],
            input_scale: None,
            native,
            sidecar: side,
        }));
    }

    let get = |n: &str| by_name.get(n).copied();
    for t in tensors {
        let n = t.name.as_str();
        if used.contains(n) {
            continue;
        }
        let found: Option<(Layout, Scheme, String, Vec<&TensorDesc>)> = if let Some(base) =
            n.strip_suffix("_packed")
        {
            match (
                get(&format!("{base}_scale")),
                get(&format!("{base}_global_scale")),
            ) {
                (Some(s), Some(g)) => Some((
                    Layout::CompressedTensors,
                    Scheme::Nvfp4,
                    base.to_string(),
                    vec![t, s, g],
                )),
                _ => None,
            }
        } else if let (true, Some(s), Some(s2)) = (
            matches!(t.dtype, Dtype::U8 | Dtype::F4),
            get(&format!("{n}_scale")),
            get(&format!("{n}_scale_2")),
        ) {
            Some((
                Layout::ModelOpt,
                Scheme::Nvfp4,
                n.to_string(),
                vec![t, s, s2],
            ))
        } else if let (true, Some(si)) = (is_fp8(t.dtype), get(&format!("{n}_scale_inv"))) {
            Some((
                Layout::DeepSeek,
                Scheme::Fp8Block,
                n.to_string(),
                vec![t, si],
            ))
        } else if let (true, Some(s)) = (is_fp8(t.dtype), get(&format!("{n}_scale"))) {
            let numel: usize = s.shape.iter().product();
            let k = t.shape.last().copied().unwrap_or(0);
            let per_block = block_scale_shape(&t.shape);
            let mut lead = t.shape.clone();
            if let Some(l) = lead.last_mut() {
                *l /= 32;
            }
            let scheme = if s.dtype == Dtype::F32 && numel == 1 {
                Some(Scheme::Fp8Tensor)
            } else if s.dtype == Dtype::F32 && t.shape.len() >= 2 && s.shape == per_block {
                Some(Scheme::Fp8Block)
            } else if matches!(s.dtype, Dtype::U8 | Dtype::F8_E8M0)
                && s.shape == lead
                && k % 32 == 0
            {
                Some(Scheme::Mxfp8)
            } else {
                None
            };
            match scheme {
                Some(scheme) => {
                    let layout = match (declared, scheme) {
                        (Some(Layout::ModelOpt), Scheme::Fp8Tensor | Scheme::Mxfp8) => {
                            Layout::ModelOpt
                        }
                        (Some(Layout::CompressedTensors), _) | (_, Scheme::Fp8Block) => {
                            Layout::CompressedTensors
                        }
                        (_, Scheme::Fp8Tensor) if s.shape.is_empty() => Layout::ModelOpt,
                        _ => Layout::CompressedTensors,
                    };
                    Some((layout, scheme, n.to_string(), vec![t, s]))
                }
                None => {
                    return Err(Error::unsupported(
                        "interop",
                        format!(
                            "reading `{n}` ({} {:?}) with `{}` ({} {:?})",
                            t.dtype, t.shape, s.name, s.dtype, s.shape
                        ),
                        "this scale shape (per-channel or grouped FP8) has no native quantfmt format; supported are one scale per tensor, per 128x128 block, or E8M0 per 32 values",
                    ));
                }
            }
        } else {
            None
        };
        let Some((layout, scheme, base, mut members)) = found else {
            continue;
        };
        let mut input_scale = None;
        if let Some(p) = module_prefix(&base) {
            let name = match layout {
                Layout::CompressedTensors if scheme == Scheme::Nvfp4 => {
                    format!("{p}.input_global_scale")
                }
                _ => format!("{p}.input_scale"),
            };
            if let Some(d) = get(&name) {
                members.push(d);
                input_scale = Some(name);
            }
        }
        let data = members[0];
        let mut shape = data.shape.clone();
        if scheme == Scheme::Nvfp4
            && data.dtype == Dtype::U8
            && let Some(l) = shape.last_mut()
        {
            *l *= 2;
        }
        let (native, side) = match sidecar.tensors.get(&base) {
            Some(e) => match e.plan(scheme) {
                Ok(p) => (p, Some(e.clone())),
                Err(err) => {
                    notes.push(format!("`{base}`: sidecar entry ignored: {err}"));
                    (default_plan(scheme, dtype), None)
                }
            },
            None => (default_plan(scheme, dtype), None),
        };
        for m in &members {
            used.insert(m.name.as_str());
        }
        seen_layouts.insert(layout);
        items.push(Item::Unit(Unit {
            name: base,
            layout,
            kind: UnitKind::Scheme(scheme),
            shape,
            members: members.into_iter().cloned().collect(),
            input_scale,
            native,
            sidecar: side,
        }));
    }
    for t in tensors {
        if used.contains(t.name.as_str()) {
            continue;
        }
        if t.name.ends_with("._extra_state") || t.name.ends_with("_extra_state") {
            items.push(Item::Skip(
                t.clone(),
                "TransformerEngine `_extra_state` (pickled recipe state) is not read; skipped"
                    .into(),
            ));
        } else {
            items.push(Item::Plain(t.clone()));
        }
    }
    let unread: Vec<&str> = items
        .iter()
        .filter_map(|i| match i {
            Item::Plain(d) if unread_quantized(d).is_some() => Some(d.name.as_str()),
            _ => None,
        })
        .collect();
    if let Some(first) = unread.first() {
        notes.push(format!(
            "{} tensor(s) look quantized in a layout quantfmt does not read (e.g. `{first}`); they are copied unchanged, not converted",
            unread.len()
        ));
    }
    items.sort_by(|a, b| a.name().cmp(b.name()));
    let found = seen_layouts.iter().copied().find(|l| *l != Layout::Native);
    let layout = match (declared, found) {
        (Some(d), Some(f)) if d != f && !(d == Layout::ModelOpt && seen_layouts.contains(&d)) => {
            notes.push(format!(
                "configs declare {d} but the tensors are named as {f}; following the tensor names"
            ));
            Some(f)
        }
        (Some(d), _) => Some(d),
        (None, Some(f)) => Some(f),
        (None, None) => seen_layouts.iter().next().copied(),
    };
    Ok(Plan {
        layout,
        items,
        notes,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn d(n: &str, t: Dtype, s: &[usize]) -> TensorDesc {
        TensorDesc::new(n, t, s)
    }

    #[test]
    fn quantized_tensors_it_does_not_read_are_plain_with_a_note() {
        let cfg = CheckpointConfig::default();
        let plan = |ts: &[TensorDesc]| {
            plan_checkpoint(ts, &FileMeta::default(), &Sidecar::new(), &cfg).unwrap()
        };
        // compressed-tensors W4A16 (pack-quantized), and an E5M2 weight with a scale.
        for ts in [
            vec![
                d("l.weight_packed", Dtype::I32, &[256, 64]),
                d("l.weight_scale", Dtype::BF16, &[256, 4]),
                d("l.weight_shape", Dtype::I32, &[2]),
            ],
            vec![
                d("l.weight", Dtype::F8_E5M2, &[256, 512]),
                d("l.weight_scale", Dtype::F32, &[1]),
            ],
            // compressed-tensors int-quantized (W8A8): I8 weights, per-channel scales.
            vec![
                d("l.weight", Dtype::I8, &[256, 512]),
                d("l.weight_scale", Dtype::F32, &[256, 1]),
            ],
        ] {
            let p = plan(&ts);
            assert!(p.items.iter().all(|i| matches!(i, Item::Plain(_))));
            let note = p.notes.iter().find(|n| n.contains("look quantized"));
            let note = note.unwrap_or_else(|| panic!("{:?}", p.notes));
            assert!(
                note.starts_with(&format!("{} tensor(s)", ts.len())),
                "{note}"
            );
            for t in &ts {
                let why = unread_quantized(t).unwrap();
                assert!(why.ends_with("copied unchanged, not converted"), "{why}");
            }
        }
        // An ordinary model: no note (integer tensors not named as weights included).
        let p = plan(&[
            d("l.weight", Dtype::BF16, &[256, 512]),
            d("l.bias", Dtype::F32, &[256]),
            d("l.self_attn.k_scale", Dtype::F32, &[]),
            d("position_ids", Dtype::I64, &[1, 512]),
            d("l.attn.bias_mask", Dtype::U8, &[512, 512]),
        ]);
        assert!(p.notes.is_empty(), "{:?}", p.notes);
    }

    #[test]
    fn recognises_each_layout() {
        let ts = vec![
            d("a.weight_packed", Dtype::U8, &[32, 16]),
            d("a.weight_scale", Dtype::F8_E4M3, &[32, 2]),
            d("a.weight_global_scale", Dtype::F32, &[1]),
            d("a.input_global_scale", Dtype::F32, &[1]),
            d("b.weight", Dtype::U8, &[32, 16]),
            d("b.weight_scale", Dtype::F8_E4M3, &[32, 2]),
            d("b.weight_scale_2", Dtype::F32, &[]),
            d("c.weight", Dtype::F8_E4M3, &[200, 300]),
            d("c.weight_scale_inv", Dtype::F32, &[2, 3]),
            d("e.weight", Dtype::F8_E4M3, &[64, 64]),
            d("e.weight_scale", Dtype::F32, &[]),
            d("f.weight", Dtype::F8_E4M3, &[64, 64]),
            d("f.weight_scale", Dtype::U8, &[64, 2]),
            d("g.weight", Dtype::F8_E4M3, &[200, 300]),
            d("g.weight_scale", Dtype::F32, &[2, 3]),
            d("norm.weight", Dtype::BF16, &[64]),
            d("te.linear._extra_state", Dtype::U8, &[0]),
        ];
        let p = plan_checkpoint(
            &ts,
            &FileMeta::default(),
            &Sidecar::new(),
            &CheckpointConfig::default(),
        )
        .unwrap();
        let units: Vec<(String, Layout, UnitKind, Vec<usize>)> = p
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Unit(u) => Some((u.name.clone(), u.layout, u.kind.clone(), u.shape.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            units,
            vec![
                (
                    "a.weight".into(),
                    Layout::CompressedTensors,
                    UnitKind::Scheme(Scheme::Nvfp4),
                    vec![32, 32]
                ),
                (
                    "b.weight".into(),
                    Layout::ModelOpt,
                    UnitKind::Scheme(Scheme::Nvfp4),
                    vec![32, 32]
                ),
                (
                    "c.weight".into(),
                    Layout::DeepSeek,
                    UnitKind::Scheme(Scheme::Fp8Block),
                    vec![200, 300]
                ),
                (
                    "e.weight".into(),
                    Layout::ModelOpt,
                    UnitKind::Scheme(Scheme::Fp8Tensor),
                    vec![64, 64]
                ),
                (
                    "f.weight".into(),
                    Layout::CompressedTensors,
                    UnitKind::Scheme(Scheme::Mxfp8),
                    vec![64, 64]
                ),
                (
                    "g.weight".into(),
                    Layout::CompressedTensors,
                    UnitKind::Scheme(Scheme::Fp8Block),
                    vec![200, 300]
                ),
            ]
        );
        assert!(
            p.items
                .iter()
                .any(|i| matches!(i, Item::Skip(d, _) if d.name.ends_with("_extra_state")))
        );
        assert!(
            p.items
                .iter()
                .any(|i| matches!(i, Item::Plain(d) if d.name == "norm.weight"))
        );
        let a = p.items.iter().find(|i| i.name() == "a.weight").unwrap();
        let Item::Unit(a) = a else { panic!() };
        assert_eq!(a.input_scale.as_deref(), Some("a.input_global_scale"));
    }

    #[test]
    fn per_channel_fp8_is_refused_by_name() {
        let ts = vec![
            d("w.weight", Dtype::F8_E4M3, &[64, 64]),
            d("w.weight_scale", Dtype::F32, &[64, 1]),
        ];
        let e = plan_checkpoint(
            &ts,
            &FileMeta::default(),
            &Sidecar::new(),
            &CheckpointConfig::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("w.weight") && e.contains("per-channel"), "{e}");
    }
}
