//! The `quantfmt.interop` sidecar: what a layout cannot hold, kept in the safetensors
//! `__metadata__` of each file quantfmt writes in a foreign layout.
//!
//! ```json
//! {"version": 1,
//!  "tensors": {"model.layers.0.mlp.up_proj.weight":
//!     {"format": "nvfp4", "options": {...}, "dtype": "bf16", "amax": "0x40c00000"}}}
//! ```
//!
//! Consumers of the layout ignore it (metadata is a free-form string map); quantfmt uses
//! it to restore the native recipe options, usage, input dtype and the exact NVFP4
//! amax, after checking that the stored tensors still agree with it (the amax must
//! reproduce the stored tensor scalar bit for bit, the format must match the scheme).

use std::collections::BTreeMap;

use quant_core::{DType, Error, Result, Storage};
use serde::{Deserialize, Serialize};

use crate::{AnyQuantizer, AnyStorage};

use super::canonical::{NativePlan, Scheme, derivable};

/// The `__metadata__` key.
pub const SIDECAR_KEY: &str = "quantfmt.interop";
/// Schema version written and read.
pub const SIDECAR_VERSION: u32 = 1;

/// One weight's native description.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SidecarEntry {
    /// Native format name.
    pub format: String,
    /// Native quantizer options (serde of the quantizer, usage included).
    pub options: serde_json::Value,
    /// Logical input dtype.
    pub dtype: DType,
    /// NVFP4: the exact amax as f32 bits, `0x%08x`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amax: Option<String>,
}

impl SidecarEntry {
    /// The entry describing a native storage.
    pub fn describe(s: &AnyStorage, q: &AnyQuantizer) -> Result<SidecarEntry> {
        let amax = match s {
            AnyStorage::Nvfp4(t) => {
                let a = t.buffer("amax_rowwise")?.as_slice::<f32>()?;
                a.first().map(|v| format!("{:#010x}", v.to_bits()))
            }
            _ => None,
        };
        Ok(SidecarEntry {
            format: quant_core::Quantizer::format_name(q).to_string(),
            options: quant_core::Quantizer::options(q)?,
            dtype: s.dtype(),
            amax,
        })
    }

    /// The exact amax, if recorded and well-formed.
    pub fn amax(&self) -> Option<f32> {
        let h = self.amax.as_deref()?.strip_prefix("0x")?;
        u32::from_str_radix(h, 16).ok().map(f32::from_bits)
    }

    /// The native plan this entry restores for a weight of `scheme`: its quantizer (usage
    /// kept where the columnwise operand can be derived, else rowwise) and dtype. Fails
    /// when the entry does not describe a `scheme` weight.
    pub fn plan(&self, scheme: Scheme) -> Result<NativePlan> {
        let q = crate::registry().quantizer(&self.format, &self.options)?;
        let q = AnyQuantizer::from_dyn(&*q)?;
        let s = Scheme::of(&q)?;
        if s != scheme {
            return Err(Error::invalid(
                "sidecar format",
                quant_core::Quantizer::spec(&q),
                format!("does not store {} weights", scheme.describe()),
            ));
        }
        if !self.dtype.is_float() {
            return Err(Error::invalid(
                "sidecar dtype",
                self.dtype,
                "must be f32, bf16 or f16",
            ));
        }
        let usage = quant_core::Quantizer::usage(&q);
        let q = if usage == quant_core::Usage::ROWWISE || derivable(&q) {
            q
        } else {
            AnyQuantizer::from_dyn(&*quant_core::Quantizer::with_usage(
                &q,
                quant_core::Usage::ROWWISE,
            ))?
        };
        Ok(NativePlan {
            quantizer: q,
            dtype: self.dtype,
        })
    }
}

/// All entries of one file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sidecar {
    /// [`SIDECAR_VERSION`].
    pub version: u32,
    /// Entries by weight name.
    pub tensors: BTreeMap<String, SidecarEntry>,
}

impl Sidecar {
    /// An empty sidecar of the current version.
    pub fn new() -> Sidecar {
        Sidecar {
            version: SIDECAR_VERSION,
            tensors: BTreeMap::new(),
        }
    }

    /// The sidecar in a file's metadata: `None` if absent; an error names a malformed or
    /// newer one (the caller may ignore it with a note).
    pub fn from_metadata(md: &BTreeMap<String, String>) -> Option<Result<Sidecar>> {
        let json = md.get(SIDECAR_KEY)?;
        Some(
            serde_json::from_str::<Sidecar>(json)
                .map_err(|e| Error::invalid(SIDECAR_KEY, "metadata", format!("is malformed: {e}")))
                .and_then(|s| {
                    if s.version == SIDECAR_VERSION {
                        Ok(s)
                    } else {
                        Err(Error::invalid(
                            SIDECAR_KEY,
                            s.version,
                            format!("version is not {SIDECAR_VERSION}"),
                        ))
                    }
                }),
        )
    }

    /// The JSON string stored under [`SIDECAR_KEY`].
    pub fn to_json(&self) -> Result<String> {
        Ok(serde_json::to_string(self)?)
    }
}
