//! A streaming safetensors writer: the header is planned from names, dtypes and shapes
//! alone, then each tensor's bytes are written at their precomputed offset as soon as
//! they exist, in any order and from any thread. Memory stays proportional to the
//! tensors in flight, never to the file.
//!
//! ```text
//! [8-byte header length n][header JSON, space-padded to n bytes][tensor 0][tensor 1]...
//!                          ^ rewritten in place by `finish` with the final metadata
//! ```
//!
//! The header is reserved with `reserve` spare bytes (the safetensors format allows a
//! header padded with spaces), so metadata that is only known once every tensor is done
//! (per-tensor options inferred from data, interop side information) can still be
//! written first in the file. Everything goes to a temporary sibling path that is renamed
//! onto the destination only by [`StreamWriter::finish`]; a writer dropped before that
//! (an error, a panic, a Ctrl-C that unwinds) removes its temporary file, so no
//! half-written output ever carries the final name.
//!
//! ```
//! use quant_core::io::writer::{StreamWriter, TensorSlot};
//! use std::collections::BTreeMap;
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("t.safetensors");
//! let slots = vec![
//!     TensorSlot::new("a", safetensors::Dtype::F32, &[2]),
//!     TensorSlot::new("b", safetensors::Dtype::U8, &[3]),
//! ];
//! let w = StreamWriter::create(&path, slots, &BTreeMap::new(), 64)?;
//! w.write("b", &[1, 2, 3])?;                       // any order
//! w.write("a", &[0, 0, 128, 63, 0, 0, 0, 64])?;   // 1.0, 2.0
//! let mut md = BTreeMap::new();
//! md.insert("note".to_string(), "written last, stored first".to_string());
//! w.finish(&md)?;
//! let bytes = std::fs::read(&path).unwrap();
//! let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
//! assert_eq!(st.tensor("b").unwrap().data(), &[1, 2, 3]);
//! # Ok::<(), quant_core::Error>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::io::reader::MAX_HEADER_BYTES;
use crate::io::temp_path;
use crate::shape::checked_numel;

/// Where one tensor goes: its name, safetensors dtype and shape (for `F4`, the logical
/// element shape, two elements per byte).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSlot {
    /// Tensor name.
    pub name: String,
    /// Element dtype.
    pub dtype: safetensors::Dtype,
    /// Shape.
    pub shape: Vec<usize>,
}

impl TensorSlot {
    /// A slot.
    pub fn new(name: impl Into<String>, dtype: safetensors::Dtype, shape: &[usize]) -> TensorSlot {
        TensorSlot {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    /// Bytes of data this slot holds, or an error naming it.
    pub fn nbytes(&self) -> Result<u64> {
        let bad = |why: &str| Error::invalid("tensor", &self.name, why.to_string());
        let numel = checked_numel(&self.shape).ok_or_else(|| bad("element count overflows"))?;
        let bits = numel
            .checked_mul(self.dtype.bitsize())
            .ok_or_else(|| bad("byte size overflows"))?;
        if bits % 8 != 0 {
            return Err(bad(&format!(
                "{numel} elements of {} do not fill whole bytes",
                self.dtype
            )));
        }
        Ok((bits / 8) as u64)
    }
}

struct Placed {
    slot: TensorSlot,
    begin: u64,
    end: u64,
}

struct State {
    file: File,
    /// Bytes written so far per tensor.
    written: Vec<u64>,
}

/// A safetensors file being written tensor by tensor (see the module docs).
pub struct StreamWriter {
    path: PathBuf,
    tmp: PathBuf,
    placed: Vec<Placed>,
    index: HashMap<String, usize>,
    header_len: u64,
    state: Mutex<State>,
    finished: bool,
}

impl std::fmt::Debug for StreamWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamWriter")
            .field("path", &self.path)
            .field("tensors", &self.placed.len())
            .field("header_len", &self.header_len)
            .finish()
    }
}

/// The header JSON, formatted exactly as the `safetensors` crate formats it
/// (`__metadata__` first, then the tensors in data order, each as
/// `{"dtype","shape","data_offsets"}`), so a file written here and the same file written
/// by `safetensors::serialize` with the same tensor order are byte-identical.
fn header_json(placed: &[Placed], metadata: &BTreeMap<String, String>) -> Result<String> {
    let mut s = String::from("{");
    if !metadata.is_empty() {
        s.push_str("\"__metadata__\":");
        s.push_str(&serde_json::to_string(metadata)?);
    }
    for (i, p) in placed.iter().enumerate() {
        if i > 0 || !metadata.is_empty() {
            s.push(',');
        }
        s.push_str(&serde_json::to_string(&p.slot.name)?);
        s.push_str(":{\"dtype\":");
        s.push_str(&serde_json::to_string(&p.slot.dtype)?);
        s.push_str(",\"shape\":");
        s.push_str(&serde_json::to_string(&p.slot.shape)?);
        s.push_str(&format!(",\"data_offsets\":[{},{}]}}", p.begin, p.end));
    }
    s.push('}');
    Ok(s)
}

/// Sorts slots the way the `safetensors` crate lays tensors out: by descending dtype
/// alignment, then by name.
pub fn sort_like_safetensors(slots: &mut [TensorSlot]) {
    slots.sort_by(|a, b| b.dtype.cmp(&a.dtype).then(a.name.cmp(&b.name)));
}

impl StreamWriter {
    /// Plans `path`: tensors are laid out in the order of `slots` (names must be unique),
    /// the header holds `metadata` plus at least `reserve` spare bytes for the final
    /// metadata given to [`StreamWriter::finish`]. Creates the temporary file at once,
    /// sized to its final length (sparse), so a full disk shows up early where it can.
    pub fn create(
        path: impl AsRef<Path>,
        slots: Vec<TensorSlot>,
        metadata: &BTreeMap<String, String>,
        reserve: usize,
    ) -> Result<StreamWriter> {
        let path = path.as_ref().to_path_buf();
        let mut placed = Vec::with_capacity(slots.len());
        let mut index = HashMap::with_capacity(slots.len());
        let mut at = 0u64;
        for (i, slot) in slots.into_iter().enumerate() {
            if slot.name == "__metadata__" {
                return Err(Error::invalid(
                    "tensor name",
                    &slot.name,
                    "is reserved by the safetensors format",
                ));
            }
            if index.insert(slot.name.clone(), i).is_some() {
                return Err(Error::invalid("tensor name", &slot.name, "is used twice"));
            }
            let n = slot.nbytes()?;
            let end = at
                .checked_add(n)
                .ok_or_else(|| Error::invalid("tensor", &slot.name, "file size overflows"))?;
            placed.push(Placed {
                slot,
                begin: at,
                end,
            });
            at = end;
        }
        let json = header_json(&placed, metadata)?;
        let header_len = (json.len() + reserve).div_ceil(8) as u64 * 8;
        if header_len > MAX_HEADER_BYTES {
            return Err(Error::invalid(
                "header",
                format!("{header_len} bytes"),
                format!("must stay within the safetensors limit of {MAX_HEADER_BYTES} bytes"),
            ));
        }
        let tmp = temp_path(&path);
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| Error::file(tmp.display().to_string(), e.to_string()))?;
        let mut w = StreamWriter {
            path,
            tmp,
            placed,
            index,
            header_len,
            state: Mutex::new(State {
                file,
                written: Vec::new(),
            }),
            finished: false,
        };
        {
            let n = w.placed.len();
            let total = 8 + header_len + at;
            let st = w.state.get_mut().map_err(|_| poisoned())?;
            st.written = vec![0; n];
            st.file.set_len(total)?;
        }
        w.write_header(&json)?;
        Ok(w)
    }

    /// The destination path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Total bytes of the finished file.
    pub fn file_len(&self) -> u64 {
        8 + self.header_len + self.placed.last().map_or(0, |p| p.end)
    }

    /// Bytes of tensor data.
    pub fn data_len(&self) -> u64 {
        self.placed.last().map_or(0, |p| p.end)
    }

    /// The planned slots, in file order.
    pub fn slots(&self) -> impl Iterator<Item = &TensorSlot> {
        self.placed.iter().map(|p| &p.slot)
    }

    fn grow_header(&mut self, json: &str) -> Result<()> {
        use std::io::Read;
        let new_len = (json.len() as u64).div_ceil(8) * 8;
        let data_len = self.data_len();
        let old_len = self.header_len;
        let mut tmp2 = self.tmp.clone().into_os_string();
        tmp2.push(".grow");
        let tmp2 = PathBuf::from(tmp2);
        let tmp = self.tmp.clone();
        let st = self.state.get_mut().map_err(|_| poisoned())?;
        let res = (|| -> Result<()> {
            let mut out = File::create(&tmp2)?;
            out.write_all(&new_len.to_le_bytes())?;
            let mut h = json.as_bytes().to_vec();
            h.resize(new_len as usize, b' ');
            out.write_all(&h)?;
            st.file.seek(SeekFrom::Start(8 + old_len))?;
            let mut buf = vec![0u8; 16 << 20];
            let mut left = data_len;
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                let chunk = buf.get_mut(..n).ok_or_else(internal)?;
                st.file.read_exact(chunk)?;
                out.write_all(chunk)?;
                left -= n as u64;
            }
            out.sync_all()?;
            std::fs::rename(&tmp2, &tmp)?;
            st.file = File::options().read(true).write(true).open(&tmp)?;
            Ok(())
        })();
        if res.is_err() {
            let _ = std::fs::remove_file(&tmp2);
        } else {
            self.header_len = new_len;
        }
        res
    }

    fn write_header(&self, json: &str) -> Result<()> {
        let cap = self.header_len as usize;
        if json.len() > cap {
            return Err(Error::invalid(
                "header metadata",
                format!("{} bytes", json.len()),
                format!("must fit the {cap} bytes reserved when the file was planned"),
            ));
        }
        let mut buf = Vec::with_capacity(8 + cap);
        buf.extend_from_slice(&self.header_len.to_le_bytes());
        buf.extend_from_slice(json.as_bytes());
        buf.resize(8 + cap, b' ');
        let mut st = self.state.lock().map_err(|_| poisoned())?;
        st.file.seek(SeekFrom::Start(0))?;
        st.file.write_all(&buf)?;
        Ok(())
    }

    /// Writes the bytes of tensor `name` (exactly its planned size), once.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let want = self.planned_len(name)?;
        if bytes.len() as u64 != want {
            let (_, p) = self.slot(name)?;
            return Err(Error::invalid(
                "tensor",
                name,
                format!(
                    "has {} bytes, but {} {:?} needs {want}",
                    bytes.len(),
                    p.slot.dtype,
                    p.slot.shape
                ),
            ));
        }
        self.write_at(name, 0, bytes)
    }

    /// Writes `bytes` at byte `offset` within tensor `name` (chunked copies of large
    /// tensors). Every byte of a tensor must be written exactly once, in any order of
    /// non-overlapping parts; the writer counts bytes, so an overlap shows up as a
    /// tensor written past its size.
    pub fn write_at(&self, name: &str, offset: u64, bytes: &[u8]) -> Result<()> {
        let (i, p) = self.slot(name)?;
        let size = p.end - p.begin;
        let end = offset
            .checked_add(bytes.len() as u64)
            .filter(|&e| e <= size);
        if end.is_none() {
            return Err(Error::invalid(
                "tensor",
                name,
                format!(
                    "write of {} bytes at {offset} runs past its {size} bytes",
                    bytes.len()
                ),
            ));
        }
        let mut st = self.state.lock().map_err(|_| poisoned())?;
        let st = &mut *st;
        let written = st.written.get_mut(i).ok_or_else(internal)?;
        if *written + bytes.len() as u64 > size {
            return Err(Error::invalid("tensor", name, "was written twice"));
        }
        st.file
            .seek(SeekFrom::Start(8 + self.header_len + p.begin + offset))?;
        st.file.write_all(bytes)?;
        *written += bytes.len() as u64;
        Ok(())
    }

    /// The index and placement of tensor `name`.
    fn slot(&self, name: &str) -> Result<(usize, &Placed)> {
        self.index
            .get(name)
            .and_then(|&i| Some((i, self.placed.get(i)?)))
            .ok_or_else(|| Error::invalid("tensor", name, "was not planned in this file's header"))
    }

    /// The planned byte size of tensor `name`.
    pub fn planned_len(&self, name: &str) -> Result<u64> {
        let (_, p) = self.slot(name)?;
        Ok(p.end - p.begin)
    }

    /// Rewrites the header with the final `metadata` (it must fit the reserved space),
    /// checks that every tensor was written, flushes to disk and renames the temporary
    /// file onto the destination.
    pub fn finish(mut self, metadata: &BTreeMap<String, String>) -> Result<()> {
        {
            let st = self.state.get_mut().map_err(|_| poisoned())?;
            let short = st
                .written
                .iter()
                .zip(&self.placed)
                .position(|(w, p)| *w != p.end - p.begin);
            if let Some(p) = short.and_then(|i| self.placed.get(i)) {
                return Err(Error::invalid(
                    "tensor",
                    &p.slot.name,
                    "was never written; the file is incomplete",
                ));
            }
        }
        let json = header_json(&self.placed, metadata)?;
        if json.len() as u64 > self.header_len {
            // The metadata outgrew its reservation: move the data behind a larger header
            // (a streamed copy; only happens when a caller under-reserved).
            self.grow_header(&json)?;
        } else {
            self.write_header(&json)?;
        }
        {
            let st = self.state.get_mut().map_err(|_| poisoned())?;
            st.file.sync_all()?;
        }
        std::fs::rename(&self.tmp, &self.path)
            .map_err(|e| Error::file(self.path.display().to_string(), e.to_string()))?;
        self.finished = true;
        Ok(())
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// An index the writer built itself was out of range (a bug in this module, reported
/// rather than panicking).
fn internal() -> Error {
    Error::invalid(
        "writer",
        "internal index",
        "out of range (a bug in quantfmt's writer)",
    )
}

fn poisoned() -> Error {
    Error::invalid(
        "writer",
        "poisoned",
        "a thread panicked while writing this file",
    )
}

/// Writes `value` as pretty JSON to `path` atomically (temporary sibling, then rename),
/// so an index or config file is either the old one or the complete new one.
pub fn write_json_atomic(path: impl AsRef<Path>, value: &Value) -> Result<()> {
    let path = path.as_ref();
    let tmp = temp_path(path);
    let res = (|| -> Result<()> {
        let mut f = File::create(&tmp)?;
        serde_json::to_writer_pretty(&mut f, value)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.map_err(|e| match e {
        Error::Io(io) => Error::file(path.display().to_string(), io.to_string()),
        other => other,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "file system: Miri isolates the process")]
    fn reads_back_with_the_safetensors_crate_and_our_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        let a: Vec<u8> = (0..40u8).collect();
        let slots = vec![
            TensorSlot::new("z.first", safetensors::Dtype::BF16, &[4, 5]),
            TensorSlot::new("a.second", safetensors::Dtype::F8_E4M3, &[3]),
            TensorSlot::new("f4", safetensors::Dtype::F4, &[2, 4]),
        ];
        let mut md = BTreeMap::new();
        md.insert("k".into(), "v".into());
        let w = StreamWriter::create(&path, slots, &md, 0).unwrap();
        w.write("f4", &[0x21, 0x43, 0x65, 0x87]).unwrap();
        w.write("a.second", &[7, 8, 9]).unwrap();
        assert!(w.write("a.second", &[7, 8, 9]).is_err());
        assert!(w.write("nope", &[]).is_err());
        assert!(w.write("z.first", &a[..39]).is_err());
        w.write_at("z.first", 20, &a[20..]).unwrap();
        assert!(w.write_at("z.first", 19, &a[19..20]).is_ok());
        assert!(w.write_at("z.first", 0, &a[..20]).is_err()); // overlaps: 41 bytes in all
        w.write_at("z.first", 0, &a[..19]).unwrap();
        w.finish(&md).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let (n, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(n % 8, 0);
        assert_eq!(meta.metadata().as_ref().unwrap()["k"], "v");
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("z.first").unwrap().data(), &a[..]);
        assert_eq!(st.tensor("a.second").unwrap().data(), &[7, 8, 9]);
        assert_eq!(st.tensor("f4").unwrap().shape(), &[2, 4]);
        let mut src = crate::io::reader::FileSource::open(&path).unwrap();
        let h = crate::io::reader::read_header(&mut src).unwrap();
        assert_eq!(h.tensors.len(), 3);
        assert_eq!(h.tensors[0].name, "z.first");
    }

    #[test]
    #[cfg_attr(miri, ignore = "file system: Miri isolates the process")]
    fn metadata_grows_into_the_reserve_or_moves_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        let slots = vec![TensorSlot::new("t", safetensors::Dtype::U8, &[1])];
        let w = StreamWriter::create(&path, slots.clone(), &BTreeMap::new(), 100).unwrap();
        w.write("t", &[5]).unwrap();
        let mut md = BTreeMap::new();
        md.insert("grown".into(), "x".repeat(60));
        w.finish(&md).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("t").unwrap().data(), &[5]);

        // Outgrowing the reserve moves the data behind a larger header.
        let w = StreamWriter::create(&path, slots, &BTreeMap::new(), 0).unwrap();
        w.write("t", &[6]).unwrap();
        md.insert("grown".into(), "x".repeat(600));
        w.finish(&md).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("t").unwrap().data(), &[6]);
        let (_, m) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(m.metadata().as_ref().unwrap()["grown"].len(), 600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    #[cfg_attr(miri, ignore = "file system: Miri isolates the process")]
    fn unfinished_writers_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        let slots = vec![
            TensorSlot::new("a", safetensors::Dtype::U8, &[1]),
            TensorSlot::new("b", safetensors::Dtype::U8, &[1]),
        ];
        let w = StreamWriter::create(&path, slots.clone(), &BTreeMap::new(), 0).unwrap();
        w.write("a", &[1]).unwrap();
        let e = w.finish(&BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("never written"), "{e}");
        let w = StreamWriter::create(&path, slots, &BTreeMap::new(), 0).unwrap();
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert!(
            StreamWriter::create(
                &path,
                vec![TensorSlot::new("a", safetensors::Dtype::U8, &[1]); 2],
                &BTreeMap::new(),
                0
            )
            .is_err()
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "file system: Miri isolates the process")]
    fn headers_match_the_safetensors_crate_byte_for_byte() {
        use std::borrow::Cow;
        struct V(safetensors::Dtype, Vec<usize>, Vec<u8>);
        impl safetensors::View for &V {
            fn dtype(&self) -> safetensors::Dtype {
                self.0
            }
            fn shape(&self) -> &[usize] {
                &self.1
            }
            fn data(&self) -> Cow<'_, [u8]> {
                Cow::Borrowed(&self.2)
            }
            fn data_len(&self) -> usize {
                self.2.len()
            }
        }
        let ts = [
            (
                "w.rowwise_data",
                V(safetensors::Dtype::U8, vec![2, 3], vec![1; 6]),
            ),
            (
                "a.scale",
                V(safetensors::Dtype::F32, vec![1], vec![0, 0, 128, 63]),
            ),
            ("norm", V(safetensors::Dtype::BF16, vec![3], vec![7; 6])),
        ];
        let mut md = std::collections::HashMap::new();
        md.insert("quantfmt".to_string(), "{\"x\":1}".to_string());
        let want =
            safetensors::serialize(ts.iter().map(|(n, v)| (*n, v)), Some(md.clone())).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        let mut slots: Vec<TensorSlot> = ts
            .iter()
            .map(|(n, v)| TensorSlot::new(*n, v.0, &v.1))
            .collect();
        sort_like_safetensors(&mut slots);
        let md: BTreeMap<String, String> = md.into_iter().collect();
        let w = StreamWriter::create(&path, slots, &md, 0).unwrap();
        for (n, v) in &ts {
            w.write(n, &v.2).unwrap();
        }
        w.finish(&md).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), want);
    }

    #[test]
    #[cfg_attr(miri, ignore = "file system: Miri isolates the process")]
    fn atomic_json() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("index.json");
        write_json_atomic(&p, &serde_json::json!({"a": 1})).unwrap();
        let v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(v["a"], 1);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
