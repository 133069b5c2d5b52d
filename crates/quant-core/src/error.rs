//! The one error type of quantfmt.
//!
//! Every message names the argument, the value it had and the rule it broke, so a
//! user reading a CLI one-liner knows what to change without reading the source:
//!
//! ```
//! use quant_core::Error;
//! let e = Error::shape("mxfp8", "K", 100, "must be a multiple of 32");
//! assert_eq!(e.to_string(), "mxfp8: K=100 must be a multiple of 32");
//! ```

use std::fmt::Display;

/// Result alias used throughout quantfmt.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in quantfmt.
///
/// `#[non_exhaustive]`: new formats and devices add variants.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor shape breaks a format's rule (checked before any work).
    #[error("{format}: {arg}={value} {rule}")]
    Shape {
        /// Format (or component) whose rule was broken.
        format: String,
        /// Which dimension or argument, e.g. `K`, `M`, `shape`.
        arg: String,
        /// The offending value.
        value: String,
        /// The rule, phrased to complete the sentence, e.g. "must be a multiple of 32".
        rule: String,
    },
    /// A function argument or option is out of its domain.
    #[error("invalid argument `{arg}` = {value}: {rule}")]
    InvalidArgument {
        /// Argument name.
        arg: String,
        /// The offending value.
        value: String,
        /// The rule it broke.
        rule: String,
    },
    /// A buffer does not match what its format describes (name, dtype, shape, bytes or location).
    #[error("buffer `{name}`: {problem}")]
    Buffer {
        /// Buffer name, e.g. `rowwise_scale_inv`.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A format name that no registry entry knows.
    #[error("unknown format `{name}`; valid formats: {valid}")]
    UnknownFormat {
        /// The name that was asked for.
        name: String,
        /// Comma-separated list of known names.
        valid: String,
    },
    /// A format option that the format does not accept.
    #[error("{format}: unknown option `{option}`; valid options: {valid}")]
    UnknownOption {
        /// The format.
        format: String,
        /// The option as written.
        option: String,
        /// Comma-separated list of valid options.
        valid: String,
    },
    /// A combination the format (or its reference implementation) refuses, with the reason.
    #[error("{format}: {what} is not supported: {reason}")]
    Unsupported {
        /// The format.
        format: String,
        /// What was asked for.
        what: String,
        /// Why it is refused.
        reason: String,
    },
    /// A file (native or interop layout) whose content is malformed or hostile.
    #[error("{path}: {problem}")]
    File {
        /// The file path (or a description of the source).
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// Operating-system I/O error.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// Malformed JSON (metadata, options).
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Error from the safetensors container layer.
    #[error("safetensors: {0}")]
    Safetensors(String),
    /// Error from the CUDA driver, NVRTC or a missing device.
    #[error("cuda: {0}")]
    Cuda(String),
}

impl Error {
    /// A shape-rule violation: `"{format}: {arg}={value} {rule}"`.
    pub fn shape(
        format: impl Into<String>,
        arg: impl Into<String>,
        value: impl Display,
        rule: impl Into<String>,
    ) -> Self {
        Error::Shape {
            format: format.into(),
            arg: arg.into(),
            value: value.to_string(),
            rule: rule.into(),
        }
    }

    /// An argument outside its domain.
    pub fn invalid(arg: impl Into<String>, value: impl Display, rule: impl Into<String>) -> Self {
        Error::InvalidArgument {
            arg: arg.into(),
            value: value.to_string(),
            rule: rule.into(),
        }
    }

    /// A buffer mismatch.
    pub fn buffer(name: impl Into<String>, problem: impl Into<String>) -> Self {
        Error::Buffer {
            name: name.into(),
            problem: problem.into(),
        }
    }

    /// A refused combination.
    pub fn unsupported(
        format: impl Into<String>,
        what: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Error::Unsupported {
            format: format.into(),
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// A malformed file.
    pub fn file(path: impl Into<String>, problem: impl Into<String>) -> Self {
        Error::File {
            path: path.into(),
            problem: problem.into(),
        }
    }
}

impl From<safetensors::SafeTensorError> for Error {
    fn from(e: safetensors::SafeTensorError) -> Self {
        Error::Safetensors(e.to_string())
    }
}
