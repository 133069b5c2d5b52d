//! `quantfmt quantize`: quantize a checkpoint into the native layout (see
//! [`crate::pipeline`]); already quantized tensors are kept as they are.

use quant_core::Result;

use crate::pipeline::{self, Options};

/// Runs `quantize`.
pub fn run(o: &Options) -> Result<()> {
    let s = pipeline::run(o)?;
    if o.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        pipeline::print_report(&s);
        let nf: usize = s
            .tensors
            .iter()
            .filter(|t| t.notes.iter().any(|n| n.contains("non-finite")))
            .count();
        if nf > 0 {
            println!(
                "warning: {nf} tensor(s) had non-finite input values (NaN/inf), quantized with the format's saturation rules"
            );
        }
    }
    Ok(())
}
