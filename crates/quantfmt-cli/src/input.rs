//! Reading safetensors inputs tensor by tensor (bounded memory, validated header).

use std::path::Path;

use quant_core::io::reader::{FileSource, Header, TensorInfo, read_header, read_tensor};
use quant_core::io::{FileMeta, RawTensor, parse_meta};
use quant_core::{DType, HostTensor, Result};

/// An open safetensors file: its validated header and quantfmt metadata.
pub struct InputFile {
    /// The byte source.
    pub src: FileSource,
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
        Ok(InputFile { src, header, meta })
    }

    /// Whether `info` is a buffer of a quantized tensor listed in the metadata.
    pub fn is_quantized_buffer(&self, info: &TensorInfo) -> bool {
        self.meta.tensors.iter().any(|(name, tm)| {
            tm.buffers
                .iter()
                .any(|b| info.name == format!("{name}.{b}"))
        })
    }

    /// Reads a tensor as stored.
    pub fn raw(&mut self, info: &TensorInfo) -> Result<RawTensor> {
        let data = read_tensor(&mut self.src, &self.header, info)?;
        Ok(RawTensor {
            dtype: info.dtype,
            shape: info.shape.clone(),
            data,
        })
    }
}

/// Why a tensor is not a quantization candidate, or `None` if it is one.
pub fn not_candidate(info: &TensorInfo) -> Option<String> {
    match DType::from_safetensors(info.dtype) {
        Some(d) if d.is_float() => {}
        _ => return Some(format!("dtype {} is not f32/bf16/f16", info.dtype)),
    }
    if info.shape.len() < 2 {
        return Some(format!(
            "rank {} (vectors and scalars stay in high precision)",
            info.shape.len()
        ));
    }
    if info.shape.contains(&0) {
        return Some("empty tensor".to_string());
    }
    None
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
