//! Everything a storage holds or gives back, as bytes: what the tests that compare two
//! runs of the same quantization (levels, pool sizes) compare.

use quantfmt::{DType, Direction, Storage};

/// Every buffer's bytes, in the storage's order.
pub fn buffer_bytes(s: &dyn Storage) -> Vec<Vec<u8>> {
    s.buffers().iter().map(|b| b.bytes().to_vec()).collect()
}

/// Every dequantization `s` gives (both directions, into f32, bf16 and f16), `None`
/// where it refuses.
pub fn dequantizations(s: &dyn Storage) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::new();
    for dir in [Direction::Rowwise, Direction::Columnwise] {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            out.push(s.dequantize(dir, dtype).ok().map(|t| t.as_bytes().to_vec()));
        }
    }
    out
}
