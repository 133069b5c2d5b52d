//! Helpers for tests and benchmarks that need a GPU or NVRTC: they **skip with a printed
//! reason** when the machine has none, and fail instead when the environment says the
//! hardware must be there (`QUANTFMT_REQUIRE_GPU=1`, `QUANTFMT_REQUIRE_NVRTC=1`), so a CI
//! step or a GPU session cannot pass by silently skipping.
//!
//! The reason goes straight to the process's stderr, past the test harness's output capture,
//! so `cargo test` shows it even for passing tests.

use std::io::Write;
use std::sync::Arc;

use super::device::CudaDevice;
use super::nvrtc::nvrtc_available;
use crate::error::{Error, Result};

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// The shared device 0, or `Ok(None)` after printing why `test` is skipped. With
/// `QUANTFMT_REQUIRE_GPU=1` a missing device is an error instead.
pub fn device_or_skip(test: &str) -> Result<Option<Arc<CudaDevice>>> {
    match CudaDevice::shared(0) {
        Ok(d) => Ok(Some(d)),
        Err(e) if !required("QUANTFMT_REQUIRE_GPU") => {
            say(&format!("SKIPPED {test}: no CUDA device ({e})"));
            Ok(None)
        }
        Err(e) => Err(Error::Cuda(format!(
            "{test}: QUANTFMT_REQUIRE_GPU=1 but no CUDA device: {e}"
        ))),
    }
}

/// Whether NVRTC can be loaded; prints why `test` is skipped when not. With
/// `QUANTFMT_REQUIRE_NVRTC=1` a missing NVRTC is an error instead.
pub fn nvrtc_or_skip(test: &str) -> Result<bool> {
    if nvrtc_available() {
        return Ok(true);
    }
    if required("QUANTFMT_REQUIRE_NVRTC") {
        return Err(Error::Cuda(format!(
            "{test}: QUANTFMT_REQUIRE_NVRTC=1 but libnvrtc.so is not on the library path"
        )));
    }
    say(&format!(
        "SKIPPED {test}: libnvrtc.so not found (set LD_LIBRARY_PATH to a CUDA 13 lib directory, \
         e.g. .venv/lib/python3.11/site-packages/nvidia/cu13/lib after `.ci/run`)"
    ));
    Ok(false)
}
