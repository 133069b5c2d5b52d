//! A bounded, validating safetensors reader.
//!
//! The header is parsed and checked in full (offsets contiguous, in range, sizes equal to
//! `numel * dtype size`, no overflow) before a single tensor byte is allocated, and each
//! tensor is then read on demand with positioned reads. Memory stays proportional to
//! what the caller asks for, never to what a hostile header claims.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde::Deserialize;

use crate::buffer::HostBytes;
use crate::error::{Error, Result};
use crate::shape::checked_numel;

/// The safetensors limit on header size (100 MB).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The largest rank a tensor in a file may declare (PyTorch's own limit is 64 dims).
pub const MAX_FILE_RANK: usize = 64;

/// One tensor entry of a safetensors header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Element dtype.
    pub dtype: safetensors::Dtype,
    /// Shape (for `F4`, the logical element shape).
    pub shape: Vec<usize>,
    /// Byte range within the data section.
    pub begin: u64,
    /// End of the byte range (exclusive).
    pub end: u64,
}

impl TensorInfo {
    /// Bytes of data.
    pub fn nbytes(&self) -> u64 {
        self.end - self.begin
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInfo {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data_offsets: (u64, u64),
}

/// The parsed header of a safetensors file or byte slice.
#[derive(Clone, Debug)]
pub struct Header {
    /// Tensors sorted by data offset.
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` string map.
    pub metadata: BTreeMap<String, String>,
    /// Absolute offset of the data section.
    pub data_start: u64,
}

impl Header {
    /// Parses and validates a header given the total size of its container.
    pub fn parse(src: &str, header_json: &[u8], total_len: u64) -> Result<Header> {
        let bad = |p: String| Error::file(src, p);
        let text = std::str::from_utf8(header_json)
            .map_err(|e| bad(format!("header is not UTF-8: {e}")))?;
        let raw: BTreeMap<String, serde_json::Value> = serde_json::from_str(text)
            .map_err(|e| bad(format!("header is not a JSON object of tensors: {e}")))?;
        let data_start = 8 + header_json.len() as u64;
        let data_len = total_len
            .checked_sub(data_start)
            .ok_or_else(|| bad("header runs past the end of the file".into()))?;
        let mut metadata = BTreeMap::new();
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, v) in raw {
            if name == "__metadata__" {
                metadata = serde_json::from_value(v)
                    .map_err(|e| bad(format!("`__metadata__` must map strings to strings: {e}")))?;
                continue;
            }
            let info: RawInfo = serde_json::from_value(v)
                .map_err(|e| bad(format!("tensor `{name}`: malformed entry: {e}")))?;
            let (begin, end) = info.data_offsets;
            if info.shape.len() > MAX_FILE_RANK {
                return Err(bad(format!(
                    "tensor `{name}`: rank {} is above the limit of {MAX_FILE_RANK}",
                    info.shape.len()
                )));
            }
            let numel = checked_numel(&info.shape)
                .ok_or_else(|| bad(format!("tensor `{name}`: shape {:?} overflows", info.shape)))?;
            let bits = numel
                .checked_mul(info.dtype.bitsize())
                .ok_or_else(|| bad(format!("tensor `{name}`: byte size overflows")))?;
            if bits % 8 != 0 {
                return Err(bad(format!(
                    "tensor `{name}`: {} elements of {} do not fill whole bytes",
                    numel, info.dtype
                )));
            }
            if end < begin || end - begin != (bits / 8) as u64 {
                return Err(bad(format!(
                    "tensor `{name}`: offsets [{begin}, {end}) hold {} bytes, but {} {:?} needs {}",
                    end.saturating_sub(begin),
                    info.dtype,
                    info.shape,
                    bits / 8
                )));
            }
            if end > data_len {
                return Err(bad(format!(
                    "tensor `{name}`: offsets [{begin}, {end}) run past the {data_len} data bytes"
                )));
            }
            tensors.push(TensorInfo {
                name,
                dtype: info.dtype,
                shape: info.shape,
                begin,
                end,
            });
        }
        tensors.sort_by_key(|t| (t.begin, t.end));
        let mut at = 0u64;
        for t in &tensors {
            if t.begin != at {
                return Err(bad(format!(
                    "tensor `{}`: data starts at {} but the previous tensor ends at {at} (gaps and overlaps are refused)",
                    t.name, t.begin
                )));
            }
            at = t.end;
        }
        if at != data_len {
            return Err(bad(format!(
                "the tensors cover {at} data bytes but the file has {data_len}"
            )));
        }
        Ok(Header {
            tensors,
            metadata,
            data_start,
        })
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Where tensor bytes come from: a file read on demand, or a byte slice.
pub trait Source {
    /// A description for error messages (usually the path).
    fn describe(&self) -> &str;
    /// Total length in bytes.
    fn len(&self) -> u64;
    /// Whether the source is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reads exactly `out.len()` bytes at `offset`.
    fn read_at(&mut self, offset: u64, out: &mut [u8]) -> Result<()>;
}

/// A file source.
#[derive(Debug)]
pub struct FileSource {
    path: String,
    file: File,
    len: u64,
}

impl FileSource {
    /// Opens `path`.
    pub fn open(path: &Path) -> Result<FileSource> {
        let file =
            File::open(path).map_err(|e| Error::file(path.display().to_string(), e.to_string()))?;
        let len = file.metadata()?.len();
        Ok(FileSource {
            path: path.display().to_string(),
            file,
            len,
        })
    }
}

impl Source for FileSource {
    fn describe(&self) -> &str {
        &self.path
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&mut self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.file.seek(SeekFrom::Start(offset))?;
        self.file
            .read_exact(out)
            .map_err(|e| Error::file(&self.path, format!("short read at byte {offset}: {e}")))
    }
}

/// An in-memory source.
#[derive(Debug)]
pub struct SliceSource<'a> {
    name: String,
    bytes: &'a [u8],
}

impl<'a> SliceSource<'a> {
    /// Wraps bytes; `name` appears in error messages.
    pub fn new(name: impl Into<String>, bytes: &'a [u8]) -> SliceSource<'a> {
        SliceSource {
            name: name.into(),
            bytes,
        }
    }
}

impl Source for SliceSource<'_> {
    fn describe(&self) -> &str {
        &self.name
    }
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_at(&mut self, offset: u64, out: &mut [u8]) -> Result<()> {
        let start = usize::try_from(offset).ok();
        let slice = start
            .and_then(|s| s.checked_add(out.len()).map(|e| (s, e)))
            .and_then(|(s, e)| self.bytes.get(s..e))
            .ok_or_else(|| {
                Error::file(&self.name, format!("read past the end at byte {offset}"))
            })?;
        out.copy_from_slice(slice);
        Ok(())
    }
}

/// Reads and validates the header of `src`.
pub fn read_header<S: Source + ?Sized>(src: &mut S) -> Result<Header> {
    let total = src.len();
    let name = src.describe().to_string();
    if total < 8 {
        return Err(Error::file(
            name,
            format!(
                "{total} bytes is too short for a safetensors file (8-byte header length first)"
            ),
        ));
    }
    let mut n = [0u8; 8];
    src.read_at(0, &mut n)?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER_BYTES || n > total - 8 {
        return Err(Error::file(
            name,
            format!(
                "header length {n} is impossible (file has {total} bytes, limit {MAX_HEADER_BYTES})"
            ),
        ));
    }
    let mut json = vec![0u8; n as usize];
    src.read_at(8, &mut json)?;
    Header::parse(&name, &json, total)
}

/// Reads one tensor's bytes into aligned host memory.
pub fn read_tensor<S: Source + ?Sized>(
    src: &mut S,
    header: &Header,
    info: &TensorInfo,
) -> Result<HostBytes> {
    let len = usize::try_from(info.nbytes()).map_err(|_| {
        Error::file(
            src.describe(),
            format!("tensor `{}` is too large for memory", info.name),
        )
    })?;
    let mut out = HostBytes::zeroed(len);
    src.read_at(header.data_start + info.begin, out.as_mut_slice())?;
    Ok(out)
}
