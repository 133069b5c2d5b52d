//! Native file loading (`quantfmt::io::load_bytes`): any bytes are refused with an error
//! or give tensors that behave (see `quantfmt_fuzz::exercise`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use quantfmt::io::{Loaded, load_bytes};

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = load_bytes(data) {
        for (_, t) in &file.tensors {
            match t {
                Loaded::Quantized(s) => quantfmt_fuzz::exercise(&**s),
                Loaded::Grouped(g) => quantfmt_fuzz::exercise_grouped(&**g),
                Loaded::Plain(p) => {
                    if let Some(Ok(h)) = p.as_host() {
                        let _ = h.to_f32_vec();
                    }
                }
            }
        }
    }
});
