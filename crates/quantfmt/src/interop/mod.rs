//! Reading and writing the checkpoint layouts the ecosystem uses: NVIDIA ModelOpt,
//! compressed-tensors (llm-compressor / vLLM), DeepSeek-V3 blockwise FP8, and torchao's
//! int4 tile-packed tensors.
//!
//! This module is where ecosystem knowledge lives: tensor names, dtypes, shapes, scale
//! conventions (multiply or divide) and config JSON. Everything else in quantfmt sees
//! only native storages.
//!
//! The conversion goes through one canonical form per scheme ([`Canonical`]): the
//! rowwise codes and the *logical* (unpadded, unswizzled) scales that every layout
//! stores, plus the one scalar a layout writes in its own convention.
//!
//! ```text
//!  native storage (TE buffers, padded/swizzled scales, columnwise copies)
//!        |  canonical_from_native: drops what no layout holds, says so (notes)
//!        v
//!  Canonical { scheme, shape, codes, logical scales, global amax }
//!        |  modelopt / compressed_tensors / deepseek ::export (names, dtypes, scalars)
//!        v
//!  layout tensors + config JSON + a `quantfmt.interop` sidecar in __metadata__
//! ```
//!
//! Reading is the reverse: [`detect::plan_checkpoint`] groups a checkpoint's tensors into
//! units from names, dtypes, shapes and configs (no data), [`read_unit`] rebuilds a
//! native storage from a unit's tensors. The sidecar records what the layout cannot
//! (the native recipe options, the input dtype, the exact NVFP4 amax), so
//! native -> layout -> native is byte-identical; layouts written by other tools have no
//! sidecar and get the documented defaults and inverse rules.
//!
//! See `docs/interop.md` for every convention with its upstream source.

pub mod canonical;
pub mod classes;
pub mod compressed_tensors;
pub mod config;
pub mod deepseek;
pub mod detect;
pub mod modelopt;
pub mod native;
pub mod sidecar;
pub mod torchao;

use std::fmt;
use std::str::FromStr;

use quant_core::io::RawTensor;
use quant_core::io::writer::TensorSlot;
use quant_core::{Error, Result};

pub use canonical::{Canonical, Scheme, canonical_from_native, native_from_canonical};
pub use classes::TensorClass;
pub use detect::{Item, Plan, TensorDesc, Unit, UnitKind, plan_checkpoint, unread_quantized};
pub use sidecar::{SIDECAR_KEY, Sidecar, SidecarEntry};

/// A checkpoint layout.
///
/// ```
/// use quantfmt::interop::Layout;
/// assert_eq!("ct".parse::<Layout>()?, Layout::CompressedTensors);
/// assert_eq!(Layout::ModelOpt.to_string(), "modelopt");
/// # Ok::<(), quantfmt::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layout {
    /// quantfmt's own layout (one safetensors tensor per buffer, `quantfmt` metadata).
    Native,
    /// NVIDIA ModelOpt HF export (`hf_quant_config.json`).
    ModelOpt,
    /// compressed-tensors (`quant_method: compressed-tensors`).
    CompressedTensors,
    /// DeepSeek-V3 blockwise FP8 (`weight_scale_inv`).
    DeepSeek,
    /// torchao int4 tile-packed (`_weight_qdata`, `_weight_scale_and_zero`).
    TorchAo,
}

impl Layout {
    /// Every layout, for listings.
    pub const ALL: [Layout; 5] = [
        Layout::Native,
        Layout::ModelOpt,
        Layout::CompressedTensors,
        Layout::DeepSeek,
        Layout::TorchAo,
    ];

    /// The CLI name.
    pub const fn name(self) -> &'static str {
        match self {
            Layout::Native => "native",
            Layout::ModelOpt => "modelopt",
            Layout::CompressedTensors => "compressed-tensors",
            Layout::DeepSeek => "deepseek",
            Layout::TorchAo => "torchao",
        }
    }

    /// The schemes this layout can hold.
    pub fn schemes(self) -> &'static [Scheme] {
        match self {
            Layout::Native => &[
                Scheme::Fp8Tensor,
                Scheme::Fp8Block,
                Scheme::Mxfp8,
                Scheme::Nvfp4,
                Scheme::Int4Tiled,
            ],
            Layout::ModelOpt => &[Scheme::Fp8Tensor, Scheme::Mxfp8, Scheme::Nvfp4],
            Layout::CompressedTensors => &[
                Scheme::Fp8Tensor,
                Scheme::Fp8Block,
                Scheme::Mxfp8,
                Scheme::Nvfp4,
            ],
            Layout::DeepSeek => &[Scheme::Fp8Block],
            Layout::TorchAo => &[Scheme::Int4Tiled],
        }
    }

    /// Whether this layout holds `scheme`.
    pub fn holds(self, scheme: Scheme) -> bool {
        self.schemes().contains(&scheme)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Layout {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "native" | "quantfmt" => Ok(Layout::Native),
            "modelopt" | "model-opt" => Ok(Layout::ModelOpt),
            "compressed-tensors" | "compressed_tensors" | "ct" => Ok(Layout::CompressedTensors),
            "deepseek" | "deepseek-v3" => Ok(Layout::DeepSeek),
            "torchao" => Ok(Layout::TorchAo),
            _ => Err(Error::invalid(
                "layout",
                s,
                "must be one of native, modelopt, compressed-tensors, deepseek, torchao",
            )),
        }
    }
}

/// Activation-side values that travel with a weight in some layouts. Stored in one
/// convention here: the dequantize **multiplier** (ModelOpt's `input_scale`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Extras {
    /// Static input (activation) scale, `amax / (max of the element format)`; for NVFP4
    /// `amax / (6 * 448)`.
    pub input_scale: Option<f32>,
}

/// A layout's tensors for one weight (name, data) and the notes on what it dropped.
pub type LayoutTensors = (Vec<(String, RawTensor)>, Vec<String>);

/// What a unit read from a checkpoint becomes.
#[derive(Debug)]
pub struct Imported {
    /// The native storage.
    pub storage: crate::AnyStorage,
    /// Activation values that came with it.
    pub extras: Extras,
    /// What the reading could not keep exactly, or had to choose.
    pub notes: Vec<String>,
}

/// A weight written in a layout: its tensors and what was dropped.
#[derive(Debug)]
pub struct Exported {
    /// Tensors (name, raw data), in the layout's naming.
    pub tensors: Vec<(String, RawTensor)>,
    /// The sidecar entry that makes the way back byte-identical.
    pub sidecar: SidecarEntry,
    /// What the layout could not hold.
    pub notes: Vec<String>,
}

/// The tensors `layout` writes for a weight `name` of `scheme` and logical `shape`
/// (names, dtypes, shapes; no data), so a file's header can be planned up front.
pub fn export_slots(
    layout: Layout,
    name: &str,
    scheme: Scheme,
    shape: &[usize],
    extras: &Extras,
) -> Result<Vec<TensorSlot>> {
    if !layout.holds(scheme) {
        return Err(unsupported_scheme(layout, scheme));
    }
    match layout {
        Layout::ModelOpt => modelopt::slots(name, scheme, shape, extras),
        Layout::CompressedTensors => compressed_tensors::slots(name, scheme, shape, extras),
        Layout::DeepSeek => deepseek::slots(name, scheme, shape),
        Layout::TorchAo => Err(Error::invalid(
            "layout",
            layout,
            "torchao slots depend on the quantizer: use torchao::slots",
        )),
        Layout::Native => Err(Error::invalid(
            "layout",
            layout,
            "native tensors are planned from their quantizer's buffers",
        )),
    }
}

/// [`export_slots`] for a weight quantized by `q` (torchao's tensor shapes depend on the
/// quantizer's group and padding, not only on the scheme).
pub fn export_slots_for(
    layout: Layout,
    name: &str,
    q: &crate::AnyQuantizer,
    shape: &[usize],
    extras: &Extras,
) -> Result<Vec<TensorSlot>> {
    if layout == Layout::TorchAo {
        return torchao::slots(name, q, shape);
    }
    export_slots(layout, name, Scheme::of(q)?, shape, extras)
}

/// Writes a native storage as `layout` tensors named after `name` (see [`Exported`]).
pub fn export(
    layout: Layout,
    name: &str,
    storage: &dyn quant_core::Storage,
    extras: &Extras,
) -> Result<Exported> {
    if layout == Layout::TorchAo {
        let any = canonical::any_storage(storage)?;
        let q = crate::AnyQuantizer::from_dyn(quant_core::Storage::quantizer(&any))?;
        let sidecar = SidecarEntry::describe(&any, &q)?;
        let (tensors, notes) = torchao::export(name, storage, extras)?;
        return Ok(Exported {
            tensors,
            sidecar,
            notes,
        });
    }
    let (c, mut notes, sidecar) = canonical_from_native(storage)?;
    if !layout.holds(c.scheme) {
        return Err(unsupported_scheme(layout, c.scheme));
    }
    let (tensors, more) = match layout {
        Layout::ModelOpt => modelopt::export(name, &c, extras)?,
        Layout::CompressedTensors => compressed_tensors::export(name, &c, extras)?,
        Layout::DeepSeek => deepseek::export(name, &c, extras)?,
        Layout::Native | Layout::TorchAo => {
            return Err(Error::invalid(
                "layout",
                layout,
                "native storages are saved with quantfmt::io",
            ));
        }
    };
    notes.extend(more);
    Ok(Exported {
        tensors,
        sidecar,
        notes,
    })
}

/// Settles the native options a layout does not record but its data shows, reading only
/// a unit's small scale tensor: an FP8 128x128 weight without a sidecar gets `pow2`
/// scales exactly when every stored scale is a power of two (TE's default recipe), else
/// full f32 scales (DeepSeek's `amax / 448`). The option never changes the bytes or the
/// values; it records how the weight would be quantized again. Call it before planning
/// output headers, so they are exact.
pub fn refine_unit(
    unit: &mut Unit,
    fetch: &mut dyn FnMut(&str) -> Result<RawTensor>,
) -> Result<()> {
    if unit.sidecar.is_some() || unit.kind != UnitKind::Scheme(Scheme::Fp8Block) {
        return Ok(());
    }
    let Some(sname) = unit.members.get(1).map(|d| d.name.clone()) else {
        return Ok(());
    };
    let raw = fetch(&sname)?;
    let canonical::Scales::F32(s) = canonical::scales_from_raw(&raw, Scheme::Fp8Block, &sname)?
    else {
        return Ok(());
    };
    if let crate::AnyQuantizer::Fp8Block(q) = &unit.native.quantizer {
        unit.native.quantizer =
            crate::AnyQuantizer::Fp8Block(q.clone().with_pow2_scales(canonical::all_pow2(&s)));
    }
    Ok(())
}

/// Rebuilds the native storage of `unit`, reading its tensors through `fetch`.
/// `sidecar` is the unit's entry of the file's `quantfmt.interop` metadata, if any.
pub fn read_unit(
    unit: &Unit,
    fetch: &mut dyn FnMut(&str) -> Result<RawTensor>,
    sidecar: Option<&SidecarEntry>,
) -> Result<Imported> {
    match unit.layout {
        Layout::Native => native::read(unit, fetch),
        Layout::ModelOpt => {
            let (c, extras, notes) = modelopt::import(unit, fetch)?;
            finish_import(unit, c, extras, notes, sidecar)
        }
        Layout::CompressedTensors => {
            let (c, extras, notes) = compressed_tensors::import(unit, fetch)?;
            finish_import(unit, c, extras, notes, sidecar)
        }
        Layout::DeepSeek => {
            let (c, extras, notes) = deepseek::import(unit, fetch)?;
            finish_import(unit, c, extras, notes, sidecar)
        }
        Layout::TorchAo => Ok(Imported {
            storage: torchao::import(unit, fetch)?,
            extras: Extras::default(),
            notes: Vec::new(),
        }),
    }
}

fn finish_import(
    unit: &Unit,
    c: Canonical,
    extras: Extras,
    mut notes: Vec<String>,
    sidecar: Option<&SidecarEntry>,
) -> Result<Imported> {
    let storage = native_from_canonical(c, &unit.native, sidecar, &mut notes)?;
    Ok(Imported {
        storage,
        extras,
        notes,
    })
}

pub(crate) fn unsupported_scheme(layout: Layout, scheme: Scheme) -> Error {
    Error::unsupported(
        layout.name(),
        format!("storing {} weights", scheme.describe()),
        format!(
            "this layout holds {}; re-quantize (--requantize SPEC) or choose another layout",
            layout
                .schemes()
                .iter()
                .map(|s| s.describe())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

/// The module prefix of a weight name (`a.b.weight` -> `a.b`), used for activation
/// companions (`a.b.input_scale`) and config module lists. `None` when the name does
/// not end in `.weight` (fused expert tensors such as `mlp.experts.down_proj`).
pub fn module_prefix(name: &str) -> Option<&str> {
    name.strip_suffix(".weight")
}

/// One tensor of a file read with [`load_file`].
#[derive(Debug)]
pub enum LoadedItem {
    /// A quantized weight, rebuilt natively.
    Quantized(Imported),
    /// A tensor stored as it is.
    Plain(RawTensor),
    /// A tensor left out, with the reason (`*._extra_state`).
    Skipped(String),
}

/// A whole safetensors file in any layout (see [`load_file`]).
#[derive(Debug)]
pub struct LoadedFile {
    /// The layout detected (`None` when nothing in it is quantized).
    pub layout: Option<Layout>,
    /// Tensors by name (weights under their native name).
    pub tensors: Vec<(String, LoadedItem)>,
    /// What planning noticed.
    pub notes: Vec<String>,
}

impl LoadedFile {
    /// The item named `name`.
    pub fn get(&self, name: &str) -> Option<&LoadedItem> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

/// Reads one safetensors file in any layout (native, ModelOpt, compressed-tensors,
/// DeepSeek), detecting it from tensor names and the `quantization_config` metadata;
/// every quantized weight comes back as a native storage. For sharded checkpoints and
/// bounded memory, use the `quantfmt convert` command (or [`detect::plan_checkpoint`]
/// and [`read_unit`] directly).
///
/// ```no_run
/// use quantfmt::{Quantizer, Storage};
/// let f = quantfmt::interop::load_file("model-modelopt-nvfp4.safetensors")?;
/// for (name, item) in &f.tensors {
///     if let quantfmt::interop::LoadedItem::Quantized(q) = item {
///         println!("{name}: {}", q.storage.quantizer().spec());
///     }
/// }
/// # Ok::<(), quantfmt::Error>(())
/// ```
pub fn load_file(path: impl AsRef<std::path::Path>) -> Result<LoadedFile> {
    let path = path.as_ref();
    load_source(&mut quant_core::io::reader::FileSource::open(path)?)
}

/// [`load_file`] on the bytes of a whole safetensors file already in memory (`name`
/// labels errors). Every length and offset is checked against `bytes.len()` before
/// anything is read or allocated.
///
/// ```
/// // Not a safetensors file: refused with an error that names it.
/// let e = quantfmt::interop::load_bytes(b"not a file", "download").unwrap_err();
/// assert!(e.to_string().contains("download"));
/// ```
pub fn load_bytes(bytes: &[u8], name: &str) -> Result<LoadedFile> {
    load_source(&mut quant_core::io::reader::SliceSource::new(name, bytes))
}

/// Errors name the source as it describes itself (the path, or the caller's label).
fn load_source<S: quant_core::io::reader::Source>(src: &mut S) -> Result<LoadedFile> {
    use quant_core::io::reader::{read_header, read_tensor};
    let name = src.describe().to_string();
    let header = read_header(src)?;
    let native = quant_core::io::parse_meta(&name, &header)?.unwrap_or_default();
    let mut notes = Vec::new();
    let side = match Sidecar::from_metadata(&header.metadata) {
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            notes.push(format!("sidecar ignored: {e}"));
            Sidecar::new()
        }
        None => Sidecar::new(),
    };
    let mut cfg = config::CheckpointConfig {
        metadata_quantization_config: header
            .metadata
            .get("quantization_config")
            .and_then(|s| serde_json::from_str(s).ok()),
        ..Default::default()
    };
    cfg.add_file_metadata(&header.metadata);
    let descs: Vec<TensorDesc> = header
        .tensors
        .iter()
        .map(|t| TensorDesc::new(&t.name, t.dtype, &t.shape))
        .collect();
    let plan = plan_checkpoint(&descs, &native, &side, &cfg)?;
    notes.extend(plan.notes.iter().cloned());
    let mut fetch = |n: &str| -> Result<RawTensor> {
        let info = header
            .get(n)
            .ok_or_else(|| Error::file(&name, format!("has no tensor `{n}`")))?;
        Ok(RawTensor {
            dtype: info.dtype,
            shape: info.shape.clone(),
            data: read_tensor(src, &header, info)?,
        })
    };
    let mut tensors = Vec::with_capacity(plan.items.len());
    for item in &plan.items {
        let t = match item {
            Item::Plain(d) => LoadedItem::Plain(fetch(&d.name)?),
            Item::Skip(_, why) => LoadedItem::Skipped(why.clone()),
            Item::Unit(u) => {
                let mut u = u.clone();
                refine_unit(&mut u, &mut fetch)?;
                LoadedItem::Quantized(
                    read_unit(&u, &mut fetch, u.sidecar.as_ref())
                        .map_err(|e| Error::file(&name, format!("weight `{}`: {e}", u.name)))?,
                )
            }
        };
        tensors.push((item.name().to_string(), t));
    }
    Ok(LoadedFile {
        layout: plan.layout,
        tensors,
        notes,
    })
}
