//! The streaming engine behind `quantize` and `convert`.
//!
//! 1. **Plan** (headers only): open every shard, group tensors into units
//!    ([`quantfmt::interop::plan_checkpoint`]), decide per item what happens (copy,
//!    quantize, convert, re-quantize), and compute every output tensor's name, dtype
//!    and shape, so each output shard's header is known before any data is read. Shards
//!    are then split between `--workers` deterministically.
//! 2. **Run**: jobs (one per tensor or weight) run on a few threads, each admitted only
//!    while the bytes in flight stay within a budget (default: twice the largest input
//!    tensor, at least 64 MiB); a job larger than the budget runs alone. Plain tensors
//!    are copied in 16 MiB chunks. Every output shard is written with positioned writes
//!    into a temporary file and renamed as soon as its last tensor is done.
//! 3. **Finish**: the index (`model.safetensors.index.json`, or a per-worker part for
//!    `quantfmt merge-index`) and the layout's config files are written atomically.
//!
//! Peak memory is the budget plus one job's overshoot, whatever the model's size.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use quant_core::grouped::GroupLayout;
use quant_core::io::writer::{StreamWriter, TensorSlot, sort_like_safetensors, write_json_atomic};
use quant_core::io::{FileMeta, GroupedMeta, METADATA_KEY, RawTensor, TensorMeta, tensor_meta};
use quant_core::{DType, Direction, Error, HostTensor, Result, Shape, Storage};
use quantfmt::interop::config::{ConfigEntry, layout_config};
use quantfmt::interop::{
    self, Extras, Item, Layout, SIDECAR_KEY, Scheme, Sidecar, SidecarEntry, TensorDesc, Unit,
    UnitKind, module_prefix,
};
use quantfmt::{AnyQuantizer, Quantizer};
use serde::Serialize;
use serde_json::{Value, json};

use crate::model::{Checkpoint, INDEX_NAME};
use crate::select::Selection;
use crate::table::{Table, bytes};

/// Set by the Ctrl-C handler; jobs stop at the next tensor or chunk.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Chunk size of plain copies.
const COPY_CHUNK: u64 = 16 << 20;
/// Smallest default memory budget.
const MIN_BUDGET: u64 = 64 << 20;

/// What to do.
#[derive(Clone, Debug)]
pub struct Options {
    /// Input file or directory.
    pub input: PathBuf,
    /// Output file (single-file input) or directory.
    pub output: PathBuf,
    /// Target layout.
    pub to: Layout,
    /// Quantize selected plain tensors with this quantizer.
    pub format: Option<AnyQuantizer>,
    /// Store rank-3 tensors as grouped tensors (native only).
    pub grouped: bool,
    /// Re-quantize units the target cannot hold with this quantizer.
    pub requantize: Option<AnyQuantizer>,
    /// Which plain tensors to quantize.
    pub selection: Selection,
    /// Fail if a float tensor stays unquantized (other than by `--exclude`).
    pub strict: bool,
    /// `(worker index, workers)`.
    pub worker: (usize, usize),
    /// In-flight byte budget (None: twice the largest tensor, at least 64 MiB).
    pub max_memory: Option<u64>,
    /// Job threads.
    pub threads: usize,
    /// Machine-readable summary on stdout instead of the table.
    pub json: bool,
}

enum Work {
    Copy,
    Quantize { q: AnyQuantizer, grouped: bool },
    NativeCopy(Box<Unit>),
    Convert(Box<Unit>),
    Requantize(Box<Unit>, AnyQuantizer),
}

struct Job {
    name: String,
    shard: usize,
    work: Work,
    desc: Option<TensorDesc>,
    slots: Vec<TensorSlot>,
    bytes_in: u64,
    cost: u64,
    planned_meta: Option<TensorMeta>,
    planned_sidecar: Option<SidecarEntry>,
    /// torchao file-metadata entry of a quantized weight.
    torchao_entry: Option<String>,
    note: Option<String>,
}

/// One tensor's outcome, for the table and the JSON summary.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// Name (the weight's name for units).
    pub name: String,
    /// Output shard file.
    pub file: String,
    /// copied / quantized / converted / kept / re-quantized / skipped.
    pub action: String,
    /// Logical shape.
    pub shape: Vec<usize>,
    /// Input dtype or source description.
    pub from: String,
    /// What it became.
    pub to: String,
    /// Input bytes.
    pub bytes_in: u64,
    /// Output bytes.
    pub bytes_out: u64,
    /// What was dropped, chosen or noticed.
    pub notes: Vec<String>,
    #[serde(skip)]
    meta: Option<TensorMeta>,
    #[serde(skip)]
    sidecar: Option<SidecarEntry>,
}

/// The run's summary (`--json`).
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Input path.
    pub input: String,
    /// Output path.
    pub output: String,
    /// Source layout.
    pub layout_in: String,
    /// Target layout.
    pub layout_out: String,
    /// This worker.
    pub worker_index: usize,
    /// Workers.
    pub workers: usize,
    /// Output files written by this worker.
    pub files: Vec<String>,
    /// Per-tensor outcomes (this worker's shards).
    pub tensors: Vec<Outcome>,
    /// Run-level notes.
    pub notes: Vec<String>,
    /// Input bytes processed.
    pub bytes_in: u64,
    /// Output bytes written.
    pub bytes_out: u64,
    /// Wall time.
    pub seconds: f64,
    /// The in-flight memory budget used.
    pub memory_budget: u64,
    /// Peak resident set size of this process (`VmHWM`), if the OS reports it.
    pub peak_rss_bytes: Option<u64>,
}

/// Peak RSS of this process from `/proc/self/status` (Linux).
pub fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn is_float(d: safetensors::Dtype) -> bool {
    matches!(
        d,
        safetensors::Dtype::F32 | safetensors::Dtype::BF16 | safetensors::Dtype::F16
    )
}

/// Why a plain tensor is not a quantization candidate (dtype, rank, emptiness).
pub fn why_not_candidate(d: &TensorDesc) -> Option<String> {
    if !is_float(d.dtype) {
        return Some(format!("dtype {} is not f32/bf16/f16", d.dtype));
    }
    if d.shape.len() < 2 {
        return Some(format!(
            "rank {} (vectors and scalars stay in high precision)",
            d.shape.len()
        ));
    }
    if d.shape.contains(&0) {
        return Some("empty tensor".into());
    }
    None
}

fn slot_bytes(slots: &[TensorSlot]) -> u64 {
    slots.iter().map(|s| s.nbytes().unwrap_or(0)).sum()
}

fn dtype_of(d: safetensors::Dtype) -> DType {
    DType::from_safetensors(d).unwrap_or(DType::BF16)
}

fn native_slots(name: &str, q: &dyn Quantizer, shape: &[usize]) -> Result<Vec<TensorSlot>> {
    Ok(q.buffers(&Shape::new(shape)?)?
        .into_iter()
        .map(|b| {
            TensorSlot::new(
                format!("{name}.{}", b.name),
                b.dtype.to_safetensors(),
                &b.shape,
            )
        })
        .collect())
}

/// Member shapes of a rank-3 `[E, n, k]` tensor stored as a grouped tensor of E members.
fn expert_shapes(dims: &[usize]) -> Result<Vec<Shape>> {
    let (&experts, member) = dims
        .split_first()
        .ok_or_else(|| Error::invalid("shape", "[]", "a grouped tensor needs dims [E, ...]"))?;
    quant_core::io::check_member_count("experts (dim 0)", experts)?;
    Ok(vec![Shape::new(member)?; experts])
}

fn grouped_plan(
    name: &str,
    q: &AnyQuantizer,
    d: &TensorDesc,
) -> Result<(Vec<TensorSlot>, TensorMeta)> {
    let shapes = expert_shapes(&d.shape)?;
    let layout = GroupLayout::new(q, &shapes)?;
    let descs = layout.grouped_descs();
    let slots = descs
        .iter()
        .map(|b| {
            TensorSlot::new(
                format!("{name}.{}", b.name),
                b.dtype.to_safetensors(),
                &b.shape,
            )
        })
        .collect();
    let byte_offsets = descs
        .iter()
        .enumerate()
        .map(|(i, b)| (b.name.clone(), layout.byte_offsets_of(i).to_vec()))
        .collect();
    let meta = TensorMeta {
        format: q.format_name().to_string(),
        options: q.options()?,
        shape: layout.logical_shape().to_vec(),
        dtype: dtype_of(d.dtype),
        buffers: descs.iter().map(|b| b.name.clone()).collect(),
        grouped: Some(GroupedMeta {
            kind: layout.kind(),
            member_shapes: shapes.iter().map(|s| s.dims().to_vec()).collect(),
            element_offsets: layout.element_offsets().to_vec(),
            byte_offsets,
        }),
    };
    Ok((slots, meta))
}

fn planned_native_meta(q: &AnyQuantizer, shape: &[usize], dtype: DType) -> Result<TensorMeta> {
    Ok(TensorMeta {
        format: q.format_name().to_string(),
        options: q.options()?,
        shape: shape.to_vec(),
        dtype,
        buffers: q
            .buffers(&Shape::new(shape)?)?
            .into_iter()
            .map(|b| b.name)
            .collect(),
        grouped: None,
    })
}

fn planned_sidecar(q: &AnyQuantizer, dtype: DType) -> Result<SidecarEntry> {
    Ok(SidecarEntry {
        format: q.format_name().to_string(),
        options: q.options()?,
        dtype,
        amax: matches!(q, AnyQuantizer::Nvfp4(_)).then(|| "0x00000000".to_string()),
    })
}

fn input_scale_slot(to: Layout, unit: &Unit) -> Option<TensorSlot> {
    // Native outputs keep a static input scale as a plain tensor in ModelOpt's
    // convention (the multiplier), next to the weight.
    if to != Layout::Native || unit.input_scale.is_none() {
        return None;
    }
    module_prefix(&unit.name)
        .map(|p| TensorSlot::new(format!("{p}.input_scale"), safetensors::Dtype::F32, &[]))
}

fn group_of(q: &AnyQuantizer) -> Option<usize> {
    match q {
        AnyQuantizer::Int4Tiled(q) => Some(q.group_size()),
        _ => None,
    }
}

fn torchao_entry(q: &AnyQuantizer, shape: &[usize]) -> Option<String> {
    match q {
        AnyQuantizer::Int4Tiled(q) => Some(interop::torchao::metadata_entry(q, shape)),
        _ => None,
    }
}

/// Assigns shards to workers: largest first, each to the least-loaded worker (ties to
/// the lower index). Deterministic for the same headers.
pub fn partition(sizes: &[(String, u64)], workers: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| {
        sizes[b]
            .1
            .cmp(&sizes[a].1)
            .then(sizes[a].0.cmp(&sizes[b].0))
    });
    let mut load = vec![0u64; workers.max(1)];
    let mut owner = vec![0usize; sizes.len()];
    for i in order {
        let w = (0..load.len()).min_by_key(|&w| (load[w], w)).unwrap_or(0);
        load[w] += sizes[i].1;
        owner[i] = w;
    }
    owner
}

struct Budget {
    limit: u64,
    in_flight: Mutex<u64>,
    cv: Condvar,
}

impl Budget {
    fn acquire(&self, cost: u64) -> Result<()> {
        let mut g = self.in_flight.lock().map_err(|_| poisoned())?;
        while *g > 0 && *g + cost > self.limit {
            g = self.cv.wait(g).map_err(|_| poisoned())?;
        }
        *g += cost;
        Ok(())
    }
    fn release(&self, cost: u64) {
        if let Ok(mut g) = self.in_flight.lock() {
            *g = g.saturating_sub(cost);
        }
        self.cv.notify_all();
    }
}

fn poisoned() -> Error {
    Error::invalid("pipeline", "poisoned", "a worker thread panicked")
}

fn interrupted() -> Error {
    Error::invalid(
        "run",
        "interrupted",
        "stopped by Ctrl-C; shards already renamed are complete, no partial file was left",
    )
}

struct ShardOut {
    file_name: String,
    writer: Mutex<Option<StreamWriter>>,
    remaining: AtomicUsize,
    outcomes: Mutex<Vec<Outcome>>,
    base_metadata: BTreeMap<String, String>,
    bar: Mutex<Option<ProgressBar>>,
    total: u64,
}

/// Runs a conversion.
pub fn run(opts: &Options) -> Result<Summary> {
    let t0 = Instant::now();
    let (wi, wn) = opts.worker;
    if wn == 0 || wi >= wn {
        return Err(Error::invalid(
            "--worker-index",
            wi,
            format!("must be below --workers ({wn}), which must be at least 1"),
        ));
    }
    if opts.grouped && opts.to != Layout::Native {
        return Err(Error::invalid(
            "--grouped",
            opts.to,
            "grouped tensors exist only in the native layout",
        ));
    }
    let ck = Checkpoint::open(&opts.input)?;
    if same_path(&opts.input, &opts.output) {
        return Err(Error::invalid(
            "--output",
            opts.output.display(),
            "must differ from the input (shards are read while the output is written)",
        ));
    }
    let mut plan = interop::plan_checkpoint(&ck.descs(), &ck.native, &ck.sidecar, &ck.config)?;
    // Options the data shows (small scale tensors only), so every header is exact.
    for item in &mut plan.items {
        if let Item::Unit(u) = item {
            let mut fetch = |n: &str| ck.read(n);
            interop::refine_unit(u, &mut fetch)?;
        }
    }
    let mut notes: Vec<String> = ck.notes.clone();
    notes.extend(plan.notes.iter().cloned());
    let layout_in = plan.layout.unwrap_or(Layout::Native);

    // ---- plan every job (all shards, so every worker sees the same index/config) ----
    if let Some(q) = &opts.format
        && opts.to != Layout::Native
    {
        let s = Scheme::of(q)?;
        if !opts.to.holds(s) {
            return Err(Error::invalid(
                "--format",
                q.spec(),
                format!(
                    "makes {} weights, which {} cannot hold",
                    s.describe(),
                    opts.to
                ),
            ));
        }
    }
    let mut jobs: Vec<Job> = Vec::new();
    let mut skipped: Vec<Outcome> = Vec::new();
    let mut strict_fail: Vec<String> = Vec::new();
    let mut config_entries: Vec<ConfigEntry> = Vec::new();
    let mut unquantized: Vec<String> = Vec::new();
    for item in &plan.items {
        match item {
            Item::Skip(d, why) => skipped.push(Outcome {
                name: d.name.clone(),
                file: String::new(),
                action: "skipped".into(),
                shape: d.shape.clone(),
                from: d.dtype.to_string(),
                to: String::new(),
                bytes_in: d.nbytes(),
                bytes_out: 0,
                notes: vec![why.clone()],
                meta: None,
                sidecar: None,
            }),
            Item::Plain(d) => {
                let shard = ck.shard_of(&d.name)?;
                // Part of a quantized weight quantfmt does not read (a scale of another
                // layout, say): copied with this note, never quantized as if plain.
                let unread = interop::unread_quantized(d);
                let mut reason = None;
                let mut quantize = None;
                if let Some(q) = &opts.format {
                    let as_group = opts.grouped && d.shape.len() == 3;
                    let r = unread
                        .clone()
                        .or_else(|| why_not_candidate(d))
                        .or_else(|| opts.selection.decide(&d.name).err())
                        .or_else(|| {
                            let check = if as_group {
                                expert_shapes(&d.shape).and_then(|m| q.check_shape(&m[0]))
                            } else {
                                Shape::new(&d.shape).and_then(|s| q.check_shape(&s))
                            };
                            check.err().map(|e| e.to_string())
                        });
                    match r {
                        Some(r) => {
                            if opts.strict && !opts.selection.explicitly_excluded(&d.name) {
                                strict_fail.push(format!("{}: {r}", d.name));
                            }
                            reason = Some(r);
                        }
                        None => quantize = Some((q.clone(), as_group)),
                    }
                }
                match quantize {
                    Some((q, grouped)) => {
                        let (slots, meta) = if grouped {
                            let (s, m) = grouped_plan(&d.name, &q, d)?;
                            (s, Some(m))
                        } else if opts.to == Layout::Native {
                            (
                                native_slots(&d.name, &q, &d.shape)?,
                                Some(planned_native_meta(&q, &d.shape, dtype_of(d.dtype))?),
                            )
                        } else {
                            let scheme = Scheme::of(&q)?;
                            config_entries.push(ConfigEntry {
                                name: d.name.clone(),
                                scheme,
                                input_scale: false,
                                group_size: group_of(&q),
                            });
                            (
                                interop::export_slots_for(
                                    opts.to,
                                    &d.name,
                                    &q,
                                    &d.shape,
                                    &Extras::default(),
                                )?,
                                None,
                            )
                        };
                        let out = slot_bytes(&slots);
                        let entry = torchao_entry(&q, &d.shape);
                        let columnwise = q.usage().columnwise;
                        let sidecar = if opts.to == Layout::Native {
                            None
                        } else {
                            Some(planned_sidecar(&q, dtype_of(d.dtype))?)
                        };
                        jobs.push(Job {
                            name: d.name.clone(),
                            shard,
                            work: Work::Quantize { q, grouped },
                            desc: Some(d.clone()),
                            bytes_in: d.nbytes(),
                            cost: d.nbytes() + out + if columnwise { d.nbytes() } else { 0 },
                            slots,
                            planned_meta: meta,
                            planned_sidecar: sidecar,
                            torchao_entry: entry,
                            note: None,
                        });
                    }
                    None => {
                        let class = interop::TensorClass::of(&d.name);
                        if d.shape.len() >= 2
                            && is_float(d.dtype)
                            && d.name.ends_with(".weight")
                            && !matches!(
                                class,
                                interop::TensorClass::Embedding | interop::TensorClass::Norm
                            )
                        {
                            unquantized.push(d.name.clone());
                        }
                        jobs.push(Job {
                            name: d.name.clone(),
                            shard,
                            work: Work::Copy,
                            slots: vec![TensorSlot::new(&d.name, d.dtype, &d.shape)],
                            desc: Some(d.clone()),
                            bytes_in: d.nbytes(),
                            cost: d.nbytes().min(COPY_CHUNK),
                            planned_meta: None,
                            planned_sidecar: None,
                            torchao_entry: None,
                            note: reason.or(unread),
                        });
                    }
                }
            }
            Item::Unit(u) => {
                let shard = ck.shard_of(&u.members[0].name)?;
                let extras = Extras {
                    input_scale: u.input_scale.as_ref().map(|_| 1.0),
                };
                let bytes_in = u.nbytes();
                let (work, slots, meta, sidecar) = match (&u.kind, opts.to) {
                    (UnitKind::Native(tm), Layout::Native) => (
                        Work::NativeCopy(Box::new(u.clone())),
                        u.members
                            .iter()
                            .map(|m| TensorSlot::new(&m.name, m.dtype, &m.shape))
                            .collect(),
                        Some(tm.clone()),
                        None,
                    ),
                    (_, Layout::Native) => {
                        let mut slots = native_slots(&u.name, &u.native.quantizer, &u.shape)?;
                        slots.extend(input_scale_slot(opts.to, u));
                        (
                            Work::Convert(Box::new(u.clone())),
                            slots,
                            Some(planned_native_meta(
                                &u.native.quantizer,
                                &u.shape,
                                u.native.dtype,
                            )?),
                            None,
                        )
                    }
                    (_, to) => {
                        let scheme = u.scheme();
                        let holds = scheme.as_ref().is_ok_and(|s| to.holds(*s));
                        if holds {
                            let scheme = scheme?;
                            config_entries.push(ConfigEntry {
                                name: u.name.clone(),
                                scheme,
                                input_scale: u.input_scale.is_some(),
                                group_size: group_of(&u.native.quantizer),
                            });
                            (
                                Work::Convert(Box::new(u.clone())),
                                interop::export_slots_for(
                                    to,
                                    &u.name,
                                    &u.native.quantizer,
                                    &u.shape,
                                    &extras,
                                )?,
                                None,
                                Some(planned_sidecar(&u.native.quantizer, u.native.dtype)?),
                            )
                        } else if let Some(rq) = &opts.requantize {
                            let s2 = Scheme::of(rq)?;
                            if !to.holds(s2) {
                                return Err(Error::invalid(
                                    "--requantize",
                                    rq.spec(),
                                    format!(
                                        "makes {} weights, which {to} cannot hold",
                                        s2.describe()
                                    ),
                                ));
                            }
                            rq.check_shape(&Shape::new(&u.shape)?)?;
                            config_entries.push(ConfigEntry {
                                name: u.name.clone(),
                                scheme: s2,
                                input_scale: u.input_scale.is_some(),
                                group_size: group_of(rq),
                            });
                            (
                                Work::Requantize(Box::new(u.clone()), rq.clone()),
                                interop::export_slots_for(to, &u.name, rq, &u.shape, &extras)?,
                                None,
                                Some(planned_sidecar(rq, u.native.dtype)?),
                            )
                        } else {
                            let why = match scheme {
                                Ok(s) => format!(
                                    "is {}, which {to} cannot hold (it holds {})",
                                    s.describe(),
                                    to.schemes()
                                        .iter()
                                        .map(|s| s.describe())
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                ),
                                Err(e) => e.to_string(),
                            };
                            return Err(Error::invalid(
                                "weight",
                                &u.name,
                                format!(
                                    "{why}; pass --requantize SPEC to re-quantize such weights explicitly"
                                ),
                            ));
                        }
                    }
                };
                let out = slot_bytes(&slots);
                let extra = if matches!(work, Work::Requantize(..)) {
                    u.shape.iter().product::<usize>() as u64 * 4
                } else {
                    0
                };
                let cost = match work {
                    Work::NativeCopy(_) => bytes_in.min(COPY_CHUNK),
                    _ => bytes_in + out + extra,
                };
                let torchao = match &work {
                    Work::Convert(u) => torchao_entry(&u.native.quantizer, &u.shape),
                    Work::Requantize(u, rq) => torchao_entry(rq, &u.shape),
                    _ => None,
                };
                jobs.push(Job {
                    name: u.name.clone(),
                    shard,
                    work,
                    desc: None,
                    slots,
                    bytes_in,
                    cost,
                    planned_meta: meta,
                    planned_sidecar: sidecar,
                    torchao_entry: torchao,
                    note: None,
                });
            }
        }
    }
    if !strict_fail.is_empty() {
        return Err(Error::invalid(
            "--strict",
            format!("{} tensor(s) not quantized", strict_fail.len()),
            format!(
                "every tensor must be quantizable; first: {}",
                strict_fail[0]
            ),
        ));
    }
    jobs.sort_by(|a, b| (a.shard, &a.name).cmp(&(b.shard, &b.name)));

    // ---- outputs ----
    let out_dir: PathBuf;
    let out_names: Vec<String>;
    if ck.is_dir {
        out_dir = opts.output.clone();
        std::fs::create_dir_all(&out_dir)
            .map_err(|e| Error::file(out_dir.display().to_string(), e.to_string()))?;
        out_names = ck.shards.iter().map(|s| s.file_name.clone()).collect();
    } else {
        if opts.output.is_dir() {
            return Err(Error::invalid(
                "--output",
                opts.output.display(),
                "is a directory; a single-file input converts to a single file",
            ));
        }
        out_dir = opts
            .output
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."));
        out_names = vec![
            opts.output
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("model.safetensors")
                .to_string(),
        ];
    }
    let sizes: Vec<(String, u64)> = ck
        .shards
        .iter()
        .map(|s| (s.file_name.clone(), s.file_len))
        .collect();
    let owner = partition(&sizes, wn);
    let single_file = !ck.is_dir;
    let cfg = if opts.to == Layout::Native {
        None
    } else {
        Some(layout_config(opts.to, &config_entries, &unquantized))
    };
    let embedded_qc = match (&cfg, single_file) {
        (Some(c), true) => c
            .hf_quant_config
            .as_ref()
            .or(c.quantization_config.as_ref())
            .map(|v| v.to_string()),
        _ => None,
    };

    let largest = ck
        .location
        .values()
        .map(|(_, t)| t.nbytes())
        .max()
        .unwrap_or(0);
    let budget_limit = opts.max_memory.unwrap_or((2 * largest).max(MIN_BUDGET));
    let mp = if opts.json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::hidden())
    } else {
        MultiProgress::new()
    };

    let mut shard_outs: Vec<Option<ShardOut>> = Vec::new();
    let mut weight_map: BTreeMap<String, String> = BTreeMap::new();
    let mut total_size = 0u64;
    let mut my_files = Vec::new();
    for (si, shard) in ck.shards.iter().enumerate() {
        let shard_jobs: Vec<&Job> = jobs.iter().filter(|j| j.shard == si).collect();
        for j in &shard_jobs {
            for s in &j.slots {
                weight_map.insert(s.name.clone(), out_names[si].clone());
                total_size += s.nbytes()?;
            }
        }
        if owner[si] != wi {
            shard_outs.push(None);
            continue;
        }
        let mut base: BTreeMap<String, String> = shard
            .header
            .metadata
            .iter()
            // Input metadata passes through, except what describes the input's own
            // layout: quantfmt's, the sidecar, configs and torchao's per-tensor entries.
            .filter(|(k, v)| {
                ![
                    METADATA_KEY,
                    SIDECAR_KEY,
                    "quantization_config",
                    "tensor_names",
                ]
                .contains(&k.as_str())
                    && !v.starts_with("{\"_type\"")
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(qc) = &embedded_qc {
            base.insert("quantization_config".into(), qc.clone());
        }
        if opts.to == Layout::TorchAo {
            // torchao's flatten_tensor_state_dict metadata: one entry per tensor name.
            let names: Vec<String> = shard_jobs.iter().map(|j| j.name.clone()).collect();
            for j in &shard_jobs {
                base.insert(
                    j.name.clone(),
                    j.torchao_entry
                        .clone()
                        .unwrap_or_else(|| interop::torchao::PLAIN_ENTRY.to_string()),
                );
            }
            base.insert(
                "tensor_names".into(),
                interop::torchao::tensor_names_entry(&names)?,
            );
        }
        let mut slots: Vec<TensorSlot> = Vec::new();
        for j in &shard_jobs {
            slots.extend(j.slots.iter().cloned());
        }
        let planned = shard_metadata(
            &base,
            opts.to,
            shard_jobs
                .iter()
                .filter_map(|j| j.planned_meta.clone().map(|m| (j.name.clone(), m))),
            shard_jobs
                .iter()
                .filter_map(|j| j.planned_sidecar.clone().map(|s| (j.name.clone(), s))),
        )?;
        // Every header is exact (options read from data were settled at planning), so
        // files get the header the `safetensors` crate would write: the same bytes as
        // `quantfmt::io::save`, and the same bytes whichever way they were produced.
        sort_like_safetensors(&mut slots);
        let reserve = 0;
        let path = out_dir.join(&out_names[si]);
        let writer = StreamWriter::create(&path, slots, &planned, reserve)?;
        my_files.push(out_names[si].clone());
        shard_outs.push(Some(ShardOut {
            file_name: out_names[si].clone(),
            writer: Mutex::new(Some(writer)),
            remaining: AtomicUsize::new(shard_jobs.len()),
            outcomes: Mutex::new(Vec::new()),
            base_metadata: base,
            bar: Mutex::new(None),
            total: shard_jobs.iter().map(|j| j.bytes_in).sum(),
        }));
    }
    let my_jobs: Vec<&Job> = jobs
        .iter()
        .filter(|j| shard_outs.get(j.shard).is_some_and(Option::is_some))
        .collect();
    let my_bytes: u64 = my_jobs.iter().map(|j| j.bytes_in).sum();
    let overall = mp.add(ProgressBar::new(my_bytes));
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        overall.set_style(style.progress_chars("=> "));
    }
    overall.set_prefix("total");

    // Shards with no jobs (all tensors skipped) finish at once.
    for so in shard_outs.iter().flatten() {
        if so.remaining.load(Ordering::SeqCst) == 0 {
            finish_shard(so, opts.to)?;
        }
    }

    // ---- run ----
    let budget = Budget {
        limit: budget_limit,
        in_flight: Mutex::new(0),
        cv: Condvar::new(),
    };
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    let stop = AtomicBool::new(false);
    let bytes_out = AtomicU64::new(0);
    let threads = opts.threads.max(1).min(my_jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(job) = my_jobs.get(i) else { break };
                    let res = (|| -> Result<()> {
                        if INTERRUPTED.load(Ordering::SeqCst) {
                            return Err(interrupted());
                        }
                        let so = shard_outs
                            .get(job.shard)
                            .and_then(Option::as_ref)
                            .ok_or_else(|| {
                                Error::invalid("shard", job.shard, "is not this worker's")
                            })?;
                        budget.acquire(job.cost)?;
                        let bar = shard_bar(so, &mp);
                        let out = run_job(job, &ck, opts, so);
                        budget.release(job.cost);
                        let mut out = out?;
                        out.file = so.file_name.clone();
                        if let Some(n) = &job.note {
                            out.notes.insert(0, n.clone());
                        }
                        bytes_out.fetch_add(out.bytes_out, Ordering::SeqCst);
                        overall.inc(job.bytes_in);
                        if let Some(b) = &bar {
                            b.inc(job.bytes_in);
                        }
                        so.outcomes.lock().map_err(|_| poisoned())?.push(out);
                        if so.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
                            finish_shard(so, opts.to)?;
                        }
                        Ok(())
                    })();
                    if let Err(e) = res {
                        stop.store(true, Ordering::SeqCst);
                        if let Ok(mut f) = failed.lock() {
                            f.get_or_insert(e);
                        }
                        budget.cv.notify_all();
                        break;
                    }
                }
            });
        }
    });
    overall.finish_and_clear();
    if let Some(e) = failed.into_inner().map_err(|_| poisoned())? {
        // Unfinished writers are dropped here, removing their temporary files.
        drop(shard_outs);
        return Err(e);
    }
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err(interrupted());
    }

    // ---- index and configs ----
    if ck.is_dir {
        let write_index = ck.index_name.is_some() || ck.shards.len() > 1;
        if write_index {
            let index = json!({
                "metadata": {"total_size": total_size},
                "weight_map": weight_map,
            });
            if wn == 1 {
                write_json_atomic(out_dir.join(INDEX_NAME), &index)?;
            } else {
                let mine: BTreeSet<&String> = my_files.iter().collect();
                let part_map: BTreeMap<&String, &String> = weight_map
                    .iter()
                    .filter(|(_, f)| mine.contains(f))
                    .collect();
                let part = json!({
                    "quantfmt_index_part": {"worker_index": wi, "workers": wn,
                                            "files": my_files, "all_files": out_names,
                                            "total_size": total_size},
                    "weight_map": part_map,
                });
                write_json_atomic(out_dir.join(part_name(wi, wn)), &part)?;
            }
        }
        if wi == 0 {
            write_side_files(&ck, &out_dir, cfg.as_ref())?;
        }
    }

    let mut tensors: Vec<Outcome> = shard_outs
        .iter()
        .flatten()
        .flat_map(|so| so.outcomes.lock().map(|v| v.clone()).unwrap_or_default())
        .collect();
    tensors.extend(skipped.into_iter().filter(|o| {
        ck.shard_of(&o.name)
            .is_ok_and(|s| shard_outs.get(s).is_some_and(Option::is_some))
    }));
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Summary {
        input: opts.input.display().to_string(),
        output: opts.output.display().to_string(),
        layout_in: layout_in.to_string(),
        layout_out: opts.to.to_string(),
        worker_index: wi,
        workers: wn,
        files: my_files,
        bytes_in: my_bytes,
        bytes_out: bytes_out.load(Ordering::SeqCst),
        tensors,
        notes,
        seconds: t0.elapsed().as_secs_f64(),
        memory_budget: budget_limit,
        peak_rss_bytes: peak_rss(),
    })
}

/// The file name of worker `wi`'s partial index.
pub fn part_name(wi: usize, wn: usize) -> String {
    format!("{INDEX_NAME}.part-{:05}-of-{:05}", wi + 1, wn)
}

fn same_path(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

fn shard_bar(so: &ShardOut, mp: &MultiProgress) -> Option<ProgressBar> {
    let mut g = so.bar.lock().ok()?;
    if g.is_none() {
        let b = mp.add(ProgressBar::new(so.total));
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ) {
            b.set_style(style.progress_chars("=> "));
        }
        let short: String = so
            .file_name
            .chars()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        b.set_prefix(short);
        *g = Some(b);
    }
    g.clone()
}

fn shard_metadata(
    base: &BTreeMap<String, String>,
    to: Layout,
    metas: impl Iterator<Item = (String, TensorMeta)>,
    sidecars: impl Iterator<Item = (String, SidecarEntry)>,
) -> Result<BTreeMap<String, String>> {
    let mut md = base.clone();
    if to == Layout::Native {
        let fm = FileMeta {
            version: quant_core::io::FORMAT_VERSION,
            tensors: metas.collect(),
        };
        if !fm.tensors.is_empty() {
            md.insert(METADATA_KEY.to_string(), serde_json::to_string(&fm)?);
        }
    } else {
        let mut sc = Sidecar::new();
        sc.tensors = sidecars.collect();
        if !sc.tensors.is_empty() {
            md.insert(SIDECAR_KEY.to_string(), sc.to_json()?);
        }
    }
    Ok(md)
}

fn finish_shard(so: &ShardOut, to: Layout) -> Result<()> {
    let w = so
        .writer
        .lock()
        .map_err(|_| poisoned())?
        .take()
        .ok_or_else(|| Error::invalid("shard", &so.file_name, "was finished twice"))?;
    let outcomes = so.outcomes.lock().map_err(|_| poisoned())?;
    let md = shard_metadata(
        &so.base_metadata,
        to,
        outcomes
            .iter()
            .filter_map(|o| o.meta.clone().map(|m| (o.name.clone(), m))),
        outcomes
            .iter()
            .filter_map(|o| o.sidecar.clone().map(|s| (o.name.clone(), s))),
    )?;
    w.finish(&md)?;
    if let Some(b) = so.bar.lock().map_err(|_| poisoned())?.take() {
        b.finish_and_clear();
    }
    Ok(())
}

fn with_writer<R>(so: &ShardOut, f: impl FnOnce(&StreamWriter) -> Result<R>) -> Result<R> {
    let g = so.writer.lock().map_err(|_| poisoned())?;
    let w = g
        .as_ref()
        .ok_or_else(|| Error::invalid("shard", &so.file_name, "was already finished"))?;
    f(w)
}

fn copy_tensor(ck: &Checkpoint, name: &str, so: &ShardOut) -> Result<u64> {
    let (_, info) = ck
        .location
        .get(name)
        .ok_or_else(|| Error::invalid("tensor", name, "is in no shard"))?;
    let n = info.nbytes();
    let mut buf = vec![0u8; n.min(COPY_CHUNK) as usize];
    let mut at = 0u64;
    while at < n {
        if INTERRUPTED.load(Ordering::SeqCst) {
            return Err(interrupted());
        }
        let len = (n - at).min(COPY_CHUNK) as usize;
        ck.read_part(name, at, &mut buf[..len])?;
        with_writer(so, |w| w.write_at(name, at, &buf[..len]))?;
        at += len as u64;
    }
    if n == 0 {
        with_writer(so, |w| w.write_at(name, 0, &[]))?;
    }
    Ok(n)
}

fn write_storage(so: &ShardOut, name: &str, s: &dyn Storage) -> Result<u64> {
    let mut n = 0;
    for b in s.buffers() {
        with_writer(so, |w| w.write(&format!("{name}.{}", b.name()), b.bytes()))?;
        n += b.nbytes() as u64;
    }
    Ok(n)
}

fn write_raws(so: &ShardOut, ts: &[(String, RawTensor)]) -> Result<u64> {
    let mut n = 0;
    for (name, t) in ts {
        with_writer(so, |w| w.write(name, t.data.as_slice()))?;
        n += t.data.len() as u64;
    }
    Ok(n)
}

fn run_job(job: &Job, ck: &Checkpoint, opts: &Options, so: &ShardOut) -> Result<Outcome> {
    let wrap = |e: Error| match e {
        Error::File { .. } => e,
        other => Error::invalid("tensor", &job.name, other.to_string()),
    };
    let mut o = Outcome {
        name: job.name.clone(),
        file: String::new(),
        action: String::new(),
        shape: Vec::new(),
        from: String::new(),
        to: String::new(),
        bytes_in: job.bytes_in,
        bytes_out: 0,
        notes: Vec::new(),
        meta: None,
        sidecar: None,
    };
    match &job.work {
        Work::Copy => {
            let d = job
                .desc
                .as_ref()
                .ok_or_else(|| Error::invalid("job", &job.name, "has no tensor"))?;
            o.action = "copied".into();
            o.shape = d.shape.clone();
            o.from = d.dtype.to_string();
            o.to = d.dtype.to_string();
            o.bytes_out = copy_tensor(ck, &job.name, so)?;
        }
        Work::NativeCopy(u) => {
            let UnitKind::Native(tm) = &u.kind else {
                return Err(Error::invalid("job", &job.name, "is not native"));
            };
            for m in &u.members {
                o.bytes_out += copy_tensor(ck, &m.name, so)?;
            }
            o.action = "kept".into();
            o.shape = tm.shape.clone();
            o.from = tm.dtype.to_string();
            o.to = u.native.quantizer.spec();
            o.notes
                .push(format!("already quantized ({})", u.native.quantizer.spec()));
            o.meta = Some(tm.clone());
        }
        Work::Quantize { q, grouped } => {
            let raw = ck.read(&job.name)?;
            let x = crate::input::as_host(&raw)?;
            let nf = x.count_non_finite();
            if nf > 0 {
                o.notes.push(format!("{nf} non-finite input values (NaN/inf) quantized with the format's saturation rules"));
            }
            o.shape = raw.shape.clone();
            o.from = dtype_of(raw.dtype).to_string();
            o.to = q.spec();
            if *grouped {
                let members = expert_shapes(&raw.shape)?;
                let g = q.quantize_grouped(&x, &members).map_err(wrap)?;
                for b in g.buffers() {
                    with_writer(so, |w| {
                        w.write(&format!("{}.{}", job.name, b.name()), b.bytes())
                    })?;
                    o.bytes_out += b.nbytes() as u64;
                }
                o.meta = Some(quant_core::io::grouped_meta(&*g)?);
                o.action = format!("grouped x{}", raw.shape[0]);
            } else {
                let s = q.quantize(&x).map_err(wrap)?;
                drop(x);
                drop(raw);
                if opts.to == Layout::Native {
                    o.bytes_out = write_storage(so, &job.name, &s)?;
                    o.meta = Some(tensor_meta(&s)?);
                } else {
                    let ex = interop::export(opts.to, &job.name, &s, &Extras::default())
                        .map_err(wrap)?;
                    o.bytes_out = write_raws(so, &ex.tensors)?;
                    o.notes.extend(ex.notes);
                    o.sidecar = Some(ex.sidecar);
                }
                o.action = "quantized".into();
            }
        }
        Work::Convert(u) | Work::Requantize(u, _) => {
            let mut fetch = |n: &str| ck.read(n);
            let imp = interop::read_unit(u, &mut fetch, u.sidecar.as_ref()).map_err(wrap)?;
            o.notes.extend(imp.notes);
            o.shape = u.shape.clone();
            o.from = match &u.kind {
                UnitKind::Native(_) => u.native.quantizer.spec(),
                UnitKind::Scheme(s) => format!("{} {}", u.layout, s.describe()),
            };
            let mut storage = imp.storage;
            if let Work::Requantize(_, rq) = &job.work {
                let dir = storage.usage().preferred().unwrap_or(Direction::Rowwise);
                let x: HostTensor<'static> = storage.dequantize(dir, storage.dtype())?;
                let s2 = rq.quantize(&x).map_err(wrap)?;
                o.notes.push(format!(
                    "re-quantized from {} to {}: values change (dequantized, then quantized again)",
                    storage.quantizer().spec(),
                    rq.spec()
                ));
                storage = s2;
                o.action = "re-quantized".into();
            } else {
                o.action = "converted".into();
            }
            if opts.to == Layout::Native {
                o.bytes_out = write_storage(so, &u.name, &storage)?;
                o.meta = Some(tensor_meta(&storage)?);
                o.to = storage.quantizer().spec();
                if let (Some(v), Some(slot)) =
                    (imp.extras.input_scale, input_scale_slot(opts.to, u))
                {
                    with_writer(so, |w| w.write(&slot.name, &v.to_le_bytes()))?;
                    o.bytes_out += 4;
                    o.notes.push(format!(
                        "static input scale kept as the plain tensor `{}` (multiplier)",
                        slot.name
                    ));
                }
            } else {
                let ex = interop::export(opts.to, &u.name, &storage, &imp.extras).map_err(wrap)?;
                o.bytes_out = write_raws(so, &ex.tensors)?;
                o.notes.extend(ex.notes);
                o.sidecar = Some(ex.sidecar);
                o.to = format!("{} ({})", opts.to, storage.quantizer().spec());
            }
        }
    }
    Ok(o)
}

/// Writes `config.json` (and `hf_quant_config.json` for ModelOpt) and copies the input
/// directory's other small files (tokenizer, generation config, ...).
fn write_side_files(
    ck: &Checkpoint,
    out: &Path,
    cfg: Option<&quantfmt::interop::config::LayoutConfig>,
) -> Result<()> {
    const KEEP_MAX: u64 = 64 << 20;
    if let Ok(rd) = std::fs::read_dir(&ck.root) {
        for e in rd.flatten() {
            let p = e.path();
            let Some(name) = p.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
                continue;
            };
            let skip = name.ends_with(".safetensors")
                || name.contains(".tmp-")
                || name.starts_with(INDEX_NAME)
                || ["config.json", "hf_quant_config.json"].contains(&name.as_str())
                || [".bin", ".pt", ".pth", ".gguf", ".ckpt"]
                    .iter()
                    .any(|x| name.ends_with(x));
            let small = e
                .metadata()
                .is_ok_and(|m| m.is_file() && m.len() <= KEEP_MAX);
            if !skip && small {
                let dst = out.join(&name);
                let tmp = quant_core::io::temp_path(&dst);
                std::fs::copy(&p, &tmp).and_then(|_| std::fs::rename(&tmp, &dst))?;
            }
        }
    }
    let mut config = ck.config.config.clone();
    match cfg {
        Some(c) => {
            if let Some(h) = &c.hf_quant_config {
                write_json_atomic(out.join("hf_quant_config.json"), h)?;
            }
            if let Some(qc) = &c.quantization_config {
                let mut v = config.take().unwrap_or_else(|| json!({}));
                if let Some(o) = v.as_object_mut() {
                    o.insert("quantization_config".into(), qc.clone());
                }
                config = Some(v);
            }
        }
        None => {
            // Native output: whatever quantization the input declared no longer applies.
            if let Some(o) = config.as_mut().and_then(Value::as_object_mut) {
                o.remove("quantization_config");
            }
        }
    }
    if let Some(v) = config {
        write_json_atomic(out.join("config.json"), &v)?;
    }
    Ok(())
}

/// Prints the human-readable report.
pub fn print_report(s: &Summary) {
    let mut t = Table::new(&[
        "tensor", "action", "shape", "from", "to", "in", "out", "note",
    ]);
    for o in &s.tensors {
        t.row(vec![
            o.name.clone(),
            o.action.clone(),
            format!("{:?}", o.shape),
            o.from.clone(),
            o.to.clone(),
            bytes(o.bytes_in),
            bytes(o.bytes_out),
            o.notes.join("; "),
        ]);
    }
    print!("{}", t.render());
    for n in &s.notes {
        println!("note: {n}");
    }
    let count = |a: &str| s.tensors.iter().filter(|o| o.action.starts_with(a)).count();
    println!(
        "{} -> {} ({} -> {}{}): {} quantized, {} converted, {} re-quantized, {} kept, {} copied, {} skipped; {} -> {} in {:.2} s; memory budget {}{}",
        s.input,
        s.output,
        s.layout_in,
        s.layout_out,
        if s.workers > 1 {
            format!(", worker {}/{}", s.worker_index + 1, s.workers)
        } else {
            String::new()
        },
        count("quantized") + count("grouped"),
        count("converted"),
        count("re-quantized"),
        count("kept"),
        count("copied"),
        count("skipped"),
        bytes(s.bytes_in),
        bytes(s.bytes_out),
        s.seconds,
        bytes(s.memory_budget),
        s.peak_rss_bytes
            .map(|r| format!(", peak RSS {}", bytes(r)))
            .unwrap_or_default(),
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn partition_is_balanced_and_deterministic() {
        let s: Vec<(String, u64)> = (0..7)
            .map(|i| (format!("s{i}"), 10 + (i as u64 % 3)))
            .collect();
        let a = partition(&s, 3);
        assert_eq!(a, partition(&s, 3));
        let mut load = [0u64; 3];
        for (i, w) in a.iter().enumerate() {
            load[*w] += s[i].1;
        }
        assert!(
            load.iter().max().unwrap() - load.iter().min().unwrap() <= 12,
            "{load:?}"
        );
        assert_eq!(partition(&s, 1), vec![0; 7]);
    }
}
