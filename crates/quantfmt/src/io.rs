//! Saving and loading the native file layout with every shipped format registered.
//!
//! See [`quant_core::io`] for the layout itself.

use std::path::Path;

use quant_core::Result;
pub use quant_core::io::{
    AsDynStorage, FileMeta, Loaded, LoadedFile, MAX_GROUP_MEMBERS, MAX_METADATA_BYTES, RawTensor,
    SaveItem, TensorMeta, save, save_items,
};

/// Loads a native file; quantized tensors are rebuilt (and checked) through
/// [`crate::registry`].
pub fn load(path: impl AsRef<Path>) -> Result<LoadedFile> {
    quant_core::io::load(path, crate::registry())
}

/// Loads a native file from memory.
pub fn load_bytes(bytes: &[u8]) -> Result<LoadedFile> {
    quant_core::io::load_bytes(bytes, crate::registry())
}
