//! Reading safetensors inputs tensor by tensor (bounded memory, validated header).

use std::path::Path;

use quant_core::io::reader::{FileSource, Header, read_header};
use quant_core::io::{FileMeta, RawTensor, parse_meta};
use quant_core::{HostTensor, Result};

/// An open safetensors file: its validated header and quantfmt metadata.
pub struct InputFile {
    /// The validated header.
    pub header: Header,
    /// quantfmt metadata, if the file is a native quantized file.
    pub meta: FileMeta,
}

impl InputFile {
    /// Opens and validates `path`.
    pub fn open(path: &Path) -> Result<InputFile> {
        let mut src = FileSource::open(path)?;
        let header = read_header(&mut src)?;
        let meta = parse_meta(&path.display().to_string(), &header)?.unwrap_or_default();
        Ok(InputFile { header, meta })
    }
}

/// A raw float tensor as a [`HostTensor`] (borrowing its bytes).
pub fn as_host(raw: &RawTensor) -> Result<HostTensor<'_>> {
    match raw.as_host() {
        Some(t) => t,
        None => Err(quant_core::Error::invalid(
            "tensor dtype",
            raw.dtype,
            "must be F32, BF16 or F16 to be quantized",
        )),
    }
}
