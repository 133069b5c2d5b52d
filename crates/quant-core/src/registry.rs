//! Format name -> how to rebuild a quantizer (and so a storage) without knowing formats.
//!
//! The facade crate registers every format it ships; a file written by one program is
//! read by another through the registry, so shared code never matches on format names.

use std::fmt;

use crate::buffer::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::format::{Format, OptionHelp};
use crate::shape::Shape;
use crate::traits::{Quantizer, Storage};
use crate::usage::Usage;

/// Builds a quantizer from spec options and a usage.
type FromSpecFn = fn(&[&str], Usage) -> Result<Box<dyn Quantizer>>;
/// Builds a quantizer from serialized options.
type FromOptionsFn = fn(&serde_json::Value) -> Result<Box<dyn Quantizer>>;

/// One registered format.
#[derive(Clone, Copy)]
pub struct FormatEntry {
    /// Registry key.
    pub name: &'static str,
    /// Spec options with help.
    pub options: &'static [OptionHelp],
    /// The shape rule in one line.
    pub shape_rule: &'static str,
    from_spec: FromSpecFn,
    from_options: FromOptionsFn,
}

impl FormatEntry {
    /// The entry for `F`.
    pub fn of<F: Format>() -> FormatEntry {
        FormatEntry {
            name: F::NAME,
            options: F::OPTIONS,
            shape_rule: F::SHAPE_RULE,
            from_spec: |opts, usage| {
                let q = F::from_spec(opts, usage)?;
                q.validate_options()?;
                Ok(Box::new(q))
            },
            from_options: |v| {
                let q: F = serde_json::from_value(v.clone()).map_err(|e| {
                    Error::invalid(
                        format!("{} options", F::NAME),
                        v,
                        format!("are not valid options of this format: {e}"),
                    )
                })?;
                q.validate_options()?;
                Ok(Box::new(q))
            },
        }
    }

    /// A quantizer from spec options.
    pub fn from_spec(&self, options: &[&str], usage: Usage) -> Result<Box<dyn Quantizer>> {
        (self.from_spec)(options, usage)
    }

    /// A quantizer from serialized options (as stored in file metadata).
    pub fn from_options(&self, options: &serde_json::Value) -> Result<Box<dyn Quantizer>> {
        (self.from_options)(options)
    }
}

impl fmt::Debug for FormatEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FormatEntry")
            .field("name", &self.name)
            .field("options", &self.options)
            .finish()
    }
}

/// The set of formats a program knows.
///
/// ```
/// use quant_core::Registry;
/// let r = Registry::new();
/// let e = r.parse_spec("nope:x", Default::default()).unwrap_err();
/// assert!(e.to_string().starts_with("unknown format `nope`"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct Registry {
    entries: Vec<FormatEntry>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Registers `F` (replacing an entry of the same name).
    pub fn register<F: Format>(&mut self) -> &mut Registry {
        let e = FormatEntry::of::<F>();
        self.entries.retain(|x| x.name != e.name);
        self.entries.push(e);
        self
    }

    /// Registered entries, in registration order.
    pub fn entries(&self) -> &[FormatEntry] {
        &self.entries
    }

    /// Registered names.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.name).collect()
    }

    /// The entry for `name`, or an error listing the known names.
    pub fn get(&self, name: &str) -> Result<&FormatEntry> {
        self.entries
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| Error::UnknownFormat {
                name: name.to_string(),
                valid: if self.entries.is_empty() {
                    "(none registered)".to_string()
                } else {
                    self.names().join(", ")
                },
            })
    }

    /// Parses a spec `NAME[:OPT[,OPT...]]` into a quantizer with `usage`.
    pub fn parse_spec(&self, spec: &str, usage: Usage) -> Result<Box<dyn Quantizer>> {
        let (name, opts) = split_spec(spec)?;
        self.get(name)?.from_spec(&opts, usage)
    }

    /// Rebuilds a quantizer from a format name and serialized options.
    pub fn quantizer(&self, name: &str, options: &serde_json::Value) -> Result<Box<dyn Quantizer>> {
        self.get(name)?.from_options(options)
    }

    /// Rebuilds a storage from a format name, options and buffers (every buffer checked).
    pub fn unflatten(
        &self,
        name: &str,
        options: &serde_json::Value,
        shape: &Shape,
        dtype: DType,
        buffers: Vec<Buffer>,
    ) -> Result<Box<dyn Storage>> {
        self.quantizer(name, options)?
            .unflatten(shape, dtype, buffers)
    }
}

/// Splits `NAME[:OPT[,OPT...]]` into the name and its options (empty options refused).
///
/// ```
/// let (n, o) = quant_core::registry::split_spec("nvfp4:2d,swizzled").unwrap();
/// assert_eq!((n, o), ("nvfp4", vec!["2d", "swizzled"]));
/// assert!(quant_core::registry::split_spec("fp8:").is_err());
/// ```
pub fn split_spec(spec: &str) -> Result<(&str, Vec<&str>)> {
    let spec = spec.trim();
    let (name, rest) = match spec.split_once(':') {
        Some((n, r)) => (n.trim(), Some(r)),
        None => (spec, None),
    };
    if name.is_empty() {
        return Err(Error::invalid(
            "format spec",
            format!("{spec:?}"),
            "must start with a format name: NAME[:OPT[,OPT...]]",
        ));
    }
    let opts = match rest {
        None => Vec::new(),
        Some(r) => {
            let opts: Vec<&str> = r.split(',').map(str::trim).collect();
            if opts.iter().any(|o| o.is_empty()) {
                return Err(Error::invalid(
                    "format spec",
                    format!("{spec:?}"),
                    "has an empty option; write NAME:OPT[,OPT...]",
                ));
            }
            opts
        }
    };
    Ok((name, opts))
}
