//! Checkpoint reading in every interop layout (`quantfmt::interop::load_bytes`: ModelOpt,
//! compressed-tensors, DeepSeek, torchao, native, detected from names and metadata): any
//! bytes are refused with an error or give native storages that behave (see
//! `quantfmt_fuzz::exercise`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use quantfmt::interop::{LoadedItem, load_bytes};

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = load_bytes(data, "fuzz input") {
        for (_, item) in &file.tensors {
            match item {
                LoadedItem::Quantized(imported) => quantfmt_fuzz::exercise(&imported.storage),
                LoadedItem::Plain(p) => {
                    if let Some(Ok(h)) = p.as_host() {
                        let _ = h.to_f32_vec();
                    }
                }
                LoadedItem::Skipped(_) => {}
            }
        }
    }
});
