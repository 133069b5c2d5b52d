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

/// Compiles every source for every architecture of [`CI_ARCHS`] to a cubin and checks that
/// each promised entry point is in the image. The (source, arch) pairs are compiled on
/// `QUANTFMT_NVRTC_THREADS` threads (default: the available parallelism). Returns the
/// number of pairs compiled; the first failure is an error carrying the NVRTC log.
///
/// [`CI_ARCHS`]: super::nvrtc::CI_ARCHS
pub fn compile_for_ci_archs(sources: &[super::source::KernelSource]) -> Result<usize> {
    let jobs: Vec<(&super::source::KernelSource, &str)> = sources
        .iter()
        .flat_map(|s| super::nvrtc::CI_ARCHS.iter().map(move |a| (s, *a)))
        .collect();
    let threads = std::env::var("QUANTFMT_NVRTC_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Result<usize>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Result<usize> {
                    let mut done = 0;
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(src, arch)) = jobs.get(i) else {
                            return Ok(done);
                        };
                        compile_one(src, arch)?;
                        done += 1;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Cuda("a compile thread panicked".to_string())))
            })
            .collect()
    });
    let mut n = 0;
    for r in results {
        n += r?;
    }
    Ok(n)
}

fn compile_one(src: &super::source::KernelSource, arch: &str) -> Result<()> {
    let t = std::time::Instant::now();
    let c = super::nvrtc::compile(src, arch)?;
    for ep in src.entry_points {
        if !super::nvrtc::image_has_symbol(&c.image, ep) {
            return Err(Error::Cuda(format!(
                "{}: entry point {ep} is missing from the {arch} cubin",
                src.name
            )));
        }
    }
    say(&format!(
        "compiled {} for {arch}: {} bytes of cubin in {:.1} s",
        src.name,
        c.image.len(),
        t.elapsed().as_secs_f64()
    ));
    if !c.log.trim().is_empty() {
        say(&format!("NVRTC log for {} ({arch}):\n{}", src.name, c.log));
    }
    Ok(())
}
