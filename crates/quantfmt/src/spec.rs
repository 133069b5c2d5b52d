//! Format specs: `NAME[:OPT[,OPT...]]`, parsed into a quantizer at run time.

use std::fmt;
use std::str::FromStr;

use quant_core::registry::split_spec;
use quant_core::{Error, Quantizer, Result, Usage};

use crate::any::AnyQuantizer;

/// A parsed and validated format spec such as `fp8-block:1x128` or `nvfp4:2d,swizzled`.
///
/// Parsing checks the name and every option against the registry, so an unknown name or
/// option fails here, with the list of what is valid.
///
/// ```
/// use quantfmt::{FormatSpec, Usage, Quantizer};
/// let spec: FormatSpec = "fp8:e5m2,pow2".parse()?;
/// let q = spec.quantizer(Usage::BOTH)?;
/// assert_eq!(q.spec(), "fp8:e5m2,pow2");
/// let e = "fp8:e3m4".parse::<FormatSpec>().unwrap_err();
/// assert!(e.to_string().contains("valid options: e4m3, e5m2, pow2"), "{e}");
/// # Ok::<(), quantfmt::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FormatSpec {
    name: String,
    options: Vec<String>,
}

impl FormatSpec {
    /// The format name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The options as written.
    pub fn options(&self) -> &[String] {
        &self.options
    }

    /// The quantizer for this spec with `usage` (static-dispatch enum).
    pub fn quantizer(&self, usage: Usage) -> Result<AnyQuantizer> {
        AnyQuantizer::from_dyn(&*self.boxed(usage)?)
    }

    /// The quantizer for this spec with `usage`, as a trait object.
    pub fn boxed(&self, usage: Usage) -> Result<Box<dyn Quantizer>> {
        let opts: Vec<&str> = self.options.iter().map(String::as_str).collect();
        crate::registry().get(&self.name)?.from_spec(&opts, usage)
    }
}

impl FromStr for FormatSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let (name, opts) = split_spec(s)?;
        let spec = FormatSpec {
            name: name.to_string(),
            options: opts.iter().map(|o| o.to_string()).collect(),
        };
        spec.boxed(Usage::ROWWISE)?;
        Ok(spec)
    }
}

impl fmt::Display for FormatSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.options.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}:{}", self.name, self.options.join(","))
        }
    }
}
