//! Which GEMM operands a quantized tensor must serve.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The directions a quantized tensor is stored in.
///
/// *Rowwise* serves the forward `y = x W^T` operand (blocks run along `K`). *Columnwise*
/// serves the transposed operand used by the backward GEMMs. Each format decides what a
/// direction means physically (a transposed copy, separately scaled blocks, ...).
///
/// ```
/// use quant_core::Usage;
/// assert_eq!("both".parse::<Usage>().unwrap(), Usage::BOTH);
/// assert!(Usage::ROWWISE.rowwise && !Usage::ROWWISE.columnwise);
/// assert_eq!(Usage::COLUMNWISE.to_string(), "columnwise");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Keep the rowwise (forward) operand.
    pub rowwise: bool,
    /// Keep the columnwise (transposed / backward) operand.
    pub columnwise: bool,
}

impl Usage {
    /// Forward operand only.
    pub const ROWWISE: Usage = Usage {
        rowwise: true,
        columnwise: false,
    };
    /// Transposed operand only.
    pub const COLUMNWISE: Usage = Usage {
        rowwise: false,
        columnwise: true,
    };
    /// Both operands.
    pub const BOTH: Usage = Usage {
        rowwise: true,
        columnwise: true,
    };

    /// Whether the direction is kept.
    pub fn has(self, dir: Direction) -> bool {
        match dir {
            Direction::Rowwise => self.rowwise,
            Direction::Columnwise => self.columnwise,
        }
    }

    /// Fails when neither direction is set: such a tensor would hold nothing.
    pub fn require_some(self) -> Result<Usage> {
        if self.rowwise || self.columnwise {
            Ok(self)
        } else {
            Err(Error::invalid(
                "usage",
                "none",
                "at least one of rowwise and columnwise must be kept",
            ))
        }
    }

    /// The direction a reader should prefer (rowwise when present).
    pub fn preferred(self) -> Option<Direction> {
        if self.rowwise {
            Some(Direction::Rowwise)
        } else if self.columnwise {
            Some(Direction::Columnwise)
        } else {
            None
        }
    }
}

impl Default for Usage {
    fn default() -> Self {
        Usage::ROWWISE
    }
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (self.rowwise, self.columnwise) {
            (true, true) => "both",
            (true, false) => "rowwise",
            (false, true) => "columnwise",
            (false, false) => "none",
        })
    }
}

impl FromStr for Usage {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "rowwise" | "row" => Ok(Usage::ROWWISE),
            "columnwise" | "col" | "column" => Ok(Usage::COLUMNWISE),
            "both" => Ok(Usage::BOTH),
            _ => Err(Error::invalid(
                "usage",
                s,
                "must be one of rowwise, columnwise, both",
            )),
        }
    }
}

/// One of the two stored directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Blocks along `K`; the forward operand.
    Rowwise,
    /// Blocks along `M`; the transposed operand.
    Columnwise,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Rowwise => "rowwise",
            Direction::Columnwise => "columnwise",
        })
    }
}

impl FromStr for Direction {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "rowwise" | "row" => Ok(Direction::Rowwise),
            "columnwise" | "col" | "column" => Ok(Direction::Columnwise),
            _ => Err(Error::invalid(
                "direction",
                s,
                "must be rowwise or columnwise",
            )),
        }
    }
}
