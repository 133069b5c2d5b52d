//! `quantfmt convert`: between checkpoint layouts (see [`crate::pipeline`]).

use quant_core::Result;

use crate::pipeline::{self, Options};

/// Runs `convert`.
pub fn run(o: &Options) -> Result<()> {
    let s = pipeline::run(o)?;
    if o.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        pipeline::print_report(&s);
    }
    Ok(())
}
