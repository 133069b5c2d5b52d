//! The native file layout: quantized tensors in safetensors.
//!
//! Each quantized tensor `NAME` is stored as one safetensors tensor per buffer,
//! `NAME.<buffer>` (U8 / I32 / F32 / BF16, shapes exactly as the format describes). The
//! `__metadata__` key `quantfmt` holds JSON:
//!
//! ```json
//! {"version": 1,
//!  "tensors": {"w": {"format": "fp8", "options": {...}, "shape": [4096, 11008],
//!                    "dtype": "bf16", "buffers": ["rowwise_data", "scale_inv"]}}}
//! ```
//!
//! Tensors without an entry pass through untouched. Loading rebuilds each quantized
//! tensor through a [`Registry`] and checks every buffer against the format's
//! description before accepting it.
//!
//! # What a hostile file cannot do
//!
//! Every length, shape, offset and count read from a file is checked before anything is
//! allocated for it: the header against the file size ([`reader`]), the metadata against
//! [`MAX_METADATA_BYTES`] and serde_json's nesting limit, shapes against
//! [`crate::shape::MAX_NUMEL`], each buffer's dtype and shape against what the format
//! describes for the stated shape and options (before its bytes are read), grouped
//! offsets against the member shapes (before the member layout is built), and buffer
//! contents by the format's `validate_buffers`. Memory stays proportional to the file's
//! size. See `docs/SECURITY.md`.
// Indexing here would run on untrusted sizes: every access is checked instead.
#![deny(clippy::indexing_slicing)]

pub mod reader;
pub mod writer;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::buffer::{Buffer, BufferDesc, HostBytes};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::grouped::{GroupKind, GroupLayout};
use crate::registry::Registry;
use crate::shape::Shape;
use crate::tensor::HostTensor;
use crate::traits::{GroupedStorage, Quantizer, Storage};
use reader::{FileSource, Header, SliceSource, Source, read_header, read_tensor};

/// The `__metadata__` key that holds quantfmt's JSON.
pub const METADATA_KEY: &str = "quantfmt";
/// Version of the metadata schema this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Largest metadata JSON accepted (hostile files cannot make us parse more).
pub const MAX_METADATA_BYTES: usize = 16 << 20;
/// Most members a grouped tensor in a file may declare (saving refuses more too).
///
/// TransformerEngine's grouped GEMMs take tens to hundreds of members (one per expert);
/// 16 384 leaves ample room while bounding what a small hostile file can make the loader
/// build: the per-member layout (shapes, buffer descriptions, offsets) of a 16 384-member
/// group is a few MiB.
pub const MAX_GROUP_MEMBERS: usize = 1 << 14;

/// The `quantfmt` metadata of a file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileMeta {
    /// Schema version ([`FORMAT_VERSION`]).
    pub version: u32,
    /// Quantized tensors by name.
    pub tensors: BTreeMap<String, TensorMeta>,
}

/// How one quantized tensor is stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorMeta {
    /// Registry key of the format.
    pub format: String,
    /// The quantizer's options (serde of the format's quantizer type).
    pub options: serde_json::Value,
    /// Logical shape.
    pub shape: Vec<usize>,
    /// High-precision dtype the tensor was quantized from.
    pub dtype: DType,
    /// Buffer names; each is stored as the safetensors tensor `NAME.<buffer>`.
    pub buffers: Vec<String>,
    /// Present for grouped tensors: member shapes and offsets (`shape` is then the logical
    /// 2-D shape and each buffer is the 1-D concatenation of the members' buffers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grouped: Option<GroupedMeta>,
}

/// Member layout of a grouped tensor, as stored in the metadata.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupedMeta {
    /// Which dims vary.
    pub kind: GroupKind,
    /// Member shapes.
    pub member_shapes: Vec<Vec<usize>>,
    /// Prefix sums of member element counts (N+1 entries).
    pub element_offsets: Vec<usize>,
    /// Per buffer: prefix sums of member byte offsets (N+1 entries).
    pub byte_offsets: BTreeMap<String, Vec<usize>>,
}

/// A tensor stored as-is (not quantized): any safetensors dtype.
#[derive(Clone, Debug)]
pub struct RawTensor {
    /// Element dtype.
    pub dtype: safetensors::Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Bytes.
    pub data: HostBytes,
}

impl RawTensor {
    /// A copy of a high-precision tensor.
    pub fn from_host(t: &HostTensor<'_>) -> RawTensor {
        RawTensor {
            dtype: t.dtype().to_safetensors(),
            shape: t.shape().dims().to_vec(),
            data: HostBytes::copy_from(t.as_bytes()),
        }
    }

    /// A float tensor view of this one, if its dtype is f32, bf16 or f16.
    pub fn as_host(&self) -> Option<Result<HostTensor<'_>>> {
        let dt = DType::from_safetensors(self.dtype).filter(|d| d.is_float())?;
        Some(HostTensor::from_le_bytes(
            dt,
            self.data.as_slice(),
            &self.shape,
        ))
    }
}

/// One thing to save.
#[derive(Clone, Copy, Debug)]
pub enum SaveItem<'a> {
    /// A quantized tensor (stored as its buffers plus metadata).
    Quantized(&'a dyn Storage),
    /// A grouped tensor (its grouped buffers plus member layout).
    Grouped(&'a dyn GroupedStorage),
    /// A tensor stored untouched.
    Plain(&'a RawTensor),
}

/// What a loaded tensor is.
#[derive(Debug)]
pub enum Loaded {
    /// A quantized tensor, rebuilt and checked.
    Quantized(Box<dyn Storage>),
    /// A grouped tensor, rebuilt and checked.
    Grouped(Box<dyn GroupedStorage>),
    /// A tensor that was stored untouched.
    Plain(RawTensor),
}

/// The contents of a native file, in name order.
#[derive(Debug, Default)]
pub struct LoadedFile {
    /// Tensors by name (quantized ones under their logical name, not `NAME.<buffer>`).
    pub tensors: Vec<(String, Loaded)>,
    /// `__metadata__` entries other than `quantfmt`.
    pub metadata: BTreeMap<String, String>,
}

impl LoadedFile {
    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&Loaded> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

struct View<'a> {
    dtype: safetensors::Dtype,
    shape: &'a [usize],
    data: &'a [u8],
}

impl safetensors::View for View<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// The metadata entry describing `s`.
pub fn tensor_meta(s: &dyn Storage) -> Result<TensorMeta> {
    Ok(TensorMeta {
        format: s.format_name().to_string(),
        options: s.quantizer().options()?,
        shape: s.shape().dims().to_vec(),
        dtype: s.dtype(),
        buffers: s.buffers().iter().map(|b| b.name().to_string()).collect(),
        grouped: None,
    })
}

/// Checks that a grouped tensor of `n` members fits a file (`1..=MAX_GROUP_MEMBERS`);
/// `arg` names the value in the error.
///
/// ```
/// use quant_core::io::{MAX_GROUP_MEMBERS, check_member_count};
/// assert!(check_member_count("experts", 8).is_ok());
/// assert!(check_member_count("experts", 0).is_err());
/// assert!(check_member_count("experts", MAX_GROUP_MEMBERS + 1).is_err());
/// ```
pub fn check_member_count(arg: &str, n: usize) -> Result<()> {
    if n == 0 || n > MAX_GROUP_MEMBERS {
        return Err(Error::invalid(
            arg,
            n,
            format!("must be between 1 and {MAX_GROUP_MEMBERS}"),
        ));
    }
    Ok(())
}

/// The metadata entry describing grouped tensor `g`.
pub fn grouped_meta(g: &dyn GroupedStorage) -> Result<TensorMeta> {
    if g.num_members() > MAX_GROUP_MEMBERS {
        return Err(Error::invalid(
            "grouped members",
            g.num_members(),
            format!("a file holds at most {MAX_GROUP_MEMBERS} (loading refuses more)"),
        ));
    }
    let mut byte_offsets = BTreeMap::new();
    for b in g.buffers() {
        byte_offsets.insert(b.name().to_string(), g.byte_offsets(b.name())?.to_vec());
    }
    Ok(TensorMeta {
        format: g.format_name().to_string(),
        options: g.quantizer().options()?,
        shape: g.logical_shape().to_vec(),
        dtype: g.dtype(),
        buffers: g.buffers().iter().map(|b| b.name().to_string()).collect(),
        grouped: Some(GroupedMeta {
            kind: g.kind(),
            member_shapes: g
                .member_shapes()
                .iter()
                .map(|s| s.dims().to_vec())
                .collect(),
            element_offsets: g.element_offsets().to_vec(),
            byte_offsets,
        }),
    })
}

/// Saves quantized tensors to `path` in the native layout (atomically: a temporary file
/// renamed on success, so an interrupted save leaves no half-written file).
///
/// ```no_run
/// # #![allow(dead_code)]
/// # fn demo(w: &dyn quant_core::Storage) -> quant_core::Result<()> {
/// quant_core::io::save("model.q.safetensors", &[("w", w)])?;
/// # Ok(()) }
/// ```
pub fn save<S: AsDynStorage + ?Sized>(
    path: impl AsRef<Path>,
    tensors: &[(&str, &S)],
) -> Result<()> {
    let items: Vec<(String, SaveItem<'_>)> = tensors
        .iter()
        .map(|(n, s)| (n.to_string(), SaveItem::Quantized(s.as_dyn_storage())))
        .collect();
    save_items(path, &items, &BTreeMap::new())
}

/// Upcast helper so `save` accepts concrete storages, `dyn Storage` and boxes alike.
pub trait AsDynStorage {
    /// `self` as a trait object.
    fn as_dyn_storage(&self) -> &dyn Storage;
}

impl<T: Storage> AsDynStorage for T {
    fn as_dyn_storage(&self) -> &dyn Storage {
        self
    }
}

impl AsDynStorage for dyn Storage {
    fn as_dyn_storage(&self) -> &dyn Storage {
        self
    }
}

impl AsDynStorage for Box<dyn Storage> {
    fn as_dyn_storage(&self) -> &dyn Storage {
        &**self
    }
}

/// Saves a mix of quantized and untouched tensors, plus extra `__metadata__` entries.
pub fn save_items(
    path: impl AsRef<Path>,
    items: &[(String, SaveItem<'_>)],
    extra_metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let path = path.as_ref();
    let mut meta = FileMeta {
        version: FORMAT_VERSION,
        tensors: BTreeMap::new(),
    };
    let mut views: Vec<(String, View<'_>)> = Vec::new();
    let mut names = BTreeSet::new();
    let mut claim = |name: String| -> Result<String> {
        if names.insert(name.clone()) {
            Ok(name)
        } else {
            Err(Error::invalid(
                "tensor name",
                &name,
                "is used twice (a quantized tensor `X` also takes the names `X.<buffer>`)",
            ))
        }
    };
    for (name, item) in items {
        let (tm, bufs) = match item {
            SaveItem::Quantized(s) => (tensor_meta(*s)?, s.buffers()),
            SaveItem::Grouped(g) => (grouped_meta(*g)?, g.buffers()),
            SaveItem::Plain(t) => {
                views.push((
                    claim(name.clone())?,
                    View {
                        dtype: t.dtype,
                        shape: &t.shape,
                        data: t.data.as_slice(),
                    },
                ));
                continue;
            }
        };
        for b in bufs {
            views.push((
                claim(format!("{name}.{}", b.name()))?,
                View {
                    dtype: b.dtype().to_safetensors(),
                    shape: b.shape(),
                    data: b.bytes(),
                },
            ));
        }
        if meta.tensors.insert(name.clone(), tm).is_some() {
            return Err(Error::invalid("tensor name", name, "is used twice"));
        }
    }
    let mut md: HashMap<String, String> = extra_metadata
        .iter()
        .filter(|(k, _)| k.as_str() != METADATA_KEY)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !meta.tensors.is_empty() {
        md.insert(METADATA_KEY.to_string(), serde_json::to_string(&meta)?);
    }
    let tmp = temp_path(path);
    let res =
        safetensors::serialize_to_file(views, if md.is_empty() { None } else { Some(md) }, &tmp)
            .map_err(Error::from)
            .and_then(|()| std::fs::rename(&tmp, path).map_err(Error::from));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// A sibling temporary path for atomic writes.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}

/// Parses the `quantfmt` metadata entry of a header, if any.
pub fn parse_meta(src: &str, header: &Header) -> Result<Option<FileMeta>> {
    let Some(json) = header.metadata.get(METADATA_KEY) else {
        return Ok(None);
    };
    if json.len() > MAX_METADATA_BYTES {
        return Err(Error::file(
            src,
            format!(
                "`{METADATA_KEY}` metadata is {} bytes (limit {MAX_METADATA_BYTES})",
                json.len()
            ),
        ));
    }
    let meta: FileMeta = serde_json::from_str(json)
        .map_err(|e| Error::file(src, format!("`{METADATA_KEY}` metadata is malformed: {e}")))?;
    if meta.version != FORMAT_VERSION {
        return Err(Error::file(
            src,
            format!(
                "`{METADATA_KEY}` metadata version {} is not supported (this build reads version {FORMAT_VERSION})",
                meta.version
            ),
        ));
    }
    Ok(Some(meta))
}

/// Loads a native file, rebuilding quantized tensors through `registry`.
pub fn load(path: impl AsRef<Path>, registry: &Registry) -> Result<LoadedFile> {
    let mut src = FileSource::open(path.as_ref())?;
    load_from(&mut src, registry)
}

/// Loads a native file from memory (same checks as [`load`]).
pub fn load_bytes(bytes: &[u8], registry: &Registry) -> Result<LoadedFile> {
    let mut src = SliceSource::new("<bytes>", bytes);
    load_from(&mut src, registry)
}

/// Loads from any [`Source`].
pub fn load_from<S: Source + ?Sized>(src: &mut S, registry: &Registry) -> Result<LoadedFile> {
    let header = read_header(src)?;
    let name = src.describe().to_string();
    let meta = parse_meta(&name, &header)?.unwrap_or_default();
    let mut claimed: BTreeSet<&str> = BTreeSet::new();
    let mut out = LoadedFile {
        tensors: Vec::new(),
        metadata: header
            .metadata
            .iter()
            .filter(|(k, _)| k.as_str() != METADATA_KEY)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    for (tname, tm) in &meta.tensors {
        let wrap = |e: Error| match e {
            Error::File { .. } => e,
            other => Error::file(&name, format!("tensor `{tname}`: {other}")),
        };
        if header.get(tname).is_some() {
            return Err(Error::file(
                &name,
                format!("tensor `{tname}` is both quantized (in the metadata) and stored as-is"),
            ));
        }
        let item = if tm.grouped.is_some() {
            Loaded::Grouped(load_grouped(src, &header, tname, tm, registry).map_err(wrap)?)
        } else {
            Loaded::Quantized(load_quantized(src, &header, tname, tm, registry).map_err(wrap)?)
        };
        for b in &tm.buffers {
            let full = format!("{tname}.{b}");
            if let Some(info) = header.get(&full)
                && !claimed.insert(info.name.as_str())
            {
                return Err(Error::file(
                    &name,
                    format!("tensor `{full}` is claimed by two quantized tensors"),
                ));
            }
        }
        out.tensors.push((tname.clone(), item));
    }
    for info in &header.tensors {
        if claimed.contains(info.name.as_str()) {
            continue;
        }
        let data = read_tensor(src, &header, info)?;
        out.tensors.push((
            info.name.clone(),
            Loaded::Plain(RawTensor {
                dtype: info.dtype,
                shape: info.shape.clone(),
                data,
            }),
        ));
    }
    out.tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Checks that the metadata lists exactly the buffers `want`, then reads each from the
/// file, checking its dtype and shape against the description before reading any bytes.
fn read_buffers<S: Source + ?Sized>(
    src: &mut S,
    header: &Header,
    name: &str,
    tm: &TensorMeta,
    q: &dyn Quantizer,
    want: Vec<BufferDesc>,
) -> Result<Vec<Buffer>> {
    let listed: BTreeSet<&str> = tm.buffers.iter().map(String::as_str).collect();
    let needed: BTreeSet<&str> = want.iter().map(|d| d.name.as_str()).collect();
    if listed != needed || listed.len() != tm.buffers.len() {
        return Err(Error::buffer(
            tm.buffers.join(", "),
            format!(
                "listed buffers differ from what {} stores ({})",
                q.spec(),
                want.iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let mut buffers = Vec::with_capacity(want.len());
    for desc in want {
        let full = format!("{name}.{}", desc.name);
        let info = header.get(&full).ok_or_else(|| {
            Error::buffer(
                &desc.name,
                format!("tensor `{full}` is missing from the file"),
            )
        })?;
        if DType::from_safetensors(info.dtype) != Some(desc.dtype) {
            return Err(Error::buffer(
                &desc.name,
                format!(
                    "`{full}` has dtype {}, but {} stores {}",
                    info.dtype,
                    q.spec(),
                    desc.dtype.safetensors_name()
                ),
            ));
        }
        if info.shape != desc.shape {
            return Err(Error::buffer(
                &desc.name,
                format!(
                    "`{full}` has shape {:?}, but {} needs {:?}",
                    info.shape,
                    q.spec(),
                    desc.shape
                ),
            ));
        }
        let data = read_tensor(src, header, info)?;
        buffers.push(Buffer::from_host_bytes(desc, data)?);
    }
    Ok(buffers)
}

/// Rebuilds one quantized tensor described by `tm` from the file.
pub fn load_quantized<S: Source + ?Sized>(
    src: &mut S,
    header: &Header,
    name: &str,
    tm: &TensorMeta,
    registry: &Registry,
) -> Result<Box<dyn Storage>> {
    if tm.grouped.is_some() {
        return Err(Error::invalid(
            "tensor",
            name,
            "is grouped; load it with load_grouped",
        ));
    }
    let shape = Shape::new(&tm.shape)?;
    let q = registry.quantizer(&tm.format, &tm.options)?;
    let want = q.buffers(&shape)?;
    let buffers = read_buffers(src, header, name, tm, &*q, want)?;
    q.unflatten(&shape, tm.dtype, buffers)
}

/// Rebuilds one grouped tensor described by `tm` from the file; the stored offsets must
/// equal the ones the member shapes imply.
pub fn load_grouped<S: Source + ?Sized>(
    src: &mut S,
    header: &Header,
    name: &str,
    tm: &TensorMeta,
    registry: &Registry,
) -> Result<Box<dyn GroupedStorage>> {
    let gm = tm
        .grouped
        .as_ref()
        .ok_or_else(|| Error::invalid("tensor", name, "is not grouped"))?;
    let n = gm.member_shapes.len();
    check_member_count("grouped members", n)?;
    // Cheap consistency checks before the per-member layout is built.
    if gm.element_offsets.len() != n + 1 {
        return Err(Error::invalid(
            "element_offsets",
            format!("{} entries", gm.element_offsets.len()),
            format!("must have one entry per member plus one ({})", n + 1),
        ));
    }
    if let Some((b, offs)) = gm.byte_offsets.iter().find(|(_, o)| o.len() != n + 1) {
        return Err(Error::buffer(
            b,
            format!(
                "has {} stored byte offsets; a group of {n} members needs {}",
                offs.len(),
                n + 1
            ),
        ));
    }
    if gm.byte_offsets.len() != tm.buffers.len() {
        return Err(Error::invalid(
            "byte_offsets",
            gm.byte_offsets.len(),
            format!(
                "must list exactly the {} buffers of the tensor",
                tm.buffers.len()
            ),
        ));
    }
    let shapes = gm
        .member_shapes
        .iter()
        .map(|d| Shape::new(d))
        .collect::<Result<Vec<_>>>()?;
    let q = registry.quantizer(&tm.format, &tm.options)?;
    let layout = GroupLayout::new(&*q, &shapes)?;
    if layout.kind() != gm.kind || layout.logical_shape().as_slice() != tm.shape.as_slice() {
        return Err(Error::invalid(
            "grouped shape",
            format!("{:?} {:?}", gm.kind, tm.shape),
            format!(
                "does not match the member shapes ({:?} {:?})",
                layout.kind(),
                layout.logical_shape()
            ),
        ));
    }
    if layout.element_offsets() != &gm.element_offsets[..] {
        return Err(Error::invalid(
            "element_offsets",
            format!("{:?}", gm.element_offsets),
            "do not add up to the member shapes' prefix sums",
        ));
    }
    let want = layout.grouped_descs();
    for (b, d) in want.iter().enumerate() {
        if gm.byte_offsets.get(&d.name).map(Vec::as_slice) != Some(layout.byte_offsets_of(b)) {
            return Err(Error::buffer(
                &d.name,
                "stored byte offsets do not add up to the members' buffer sizes",
            ));
        }
    }
    if gm.byte_offsets.len() != want.len() {
        return Err(Error::invalid(
            "byte_offsets",
            gm.byte_offsets.len(),
            format!("must list exactly the {} grouped buffers", want.len()),
        ));
    }
    // The rebuild computes its own layout: drop this one first so only one is alive.
    drop(layout);
    let buffers = read_buffers(src, header, name, tm, &*q, want)?;
    q.unflatten_grouped(&shapes, tm.dtype, buffers)
}
