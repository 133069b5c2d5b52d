//! CI's kernel check: every kernel source of every format compiles with NVRTC to a cubin for
//! sm_80, sm_89, sm_90a and sm_100a, and every promised entry point is in each cubin.
//!
//! Without libnvrtc the test skips with the reason printed; `.ci/run` installs NVRTC into a
//! virtual environment and runs it with `QUANTFMT_REQUIRE_NVRTC=1`, where a missing library
//! or any compile error fails.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use quantfmt::cuda::testing::{compile_for_ci_archs, nvrtc_or_skip};
use quantfmt::cuda::{all_kernel_sources, nvrtc::CI_ARCHS, nvrtc_version};

#[test]
fn every_kernel_compiles_for_every_ci_arch() {
    if !nvrtc_or_skip("every_kernel_compiles_for_every_ci_arch").unwrap() {
        return;
    }
    let sources = all_kernel_sources();
    let (major, minor) = nvrtc_version().unwrap();
    let n = compile_for_ci_archs(&sources).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, sources.len() * CI_ARCHS.len());
    eprintln!(
        "NVRTC {major}.{minor}: {} sources x {:?} compiled",
        sources.len(),
        CI_ARCHS
    );
}

#[test]
fn every_format_lists_its_sources() {
    use quantfmt::cuda::CudaFormat;
    let all: Vec<&str> = all_kernel_sources().iter().map(|s| s.name).collect();
    for srcs in [
        quantfmt::Fp8Quantizer::kernel_sources(),
        quantfmt::Fp8BlockQuantizer::kernel_sources(),
        quantfmt::Mxfp8Quantizer::kernel_sources(),
        quantfmt::Nvfp4Quantizer::kernel_sources(),
        quantfmt::Int4TiledQuantizer::kernel_sources(),
    ] {
        assert!(!srcs.is_empty());
        for s in srcs {
            assert!(
                all.contains(&s.name),
                "{} is not in all_kernel_sources",
                s.name
            );
            // Every entry point is defined in its source text.
            for ep in s.entry_points {
                let suffix = ["_f32", "_bf16", "_f16"]
                    .iter()
                    .find(|x| ep.ends_with(*x))
                    .copied()
                    .unwrap_or("");
                let stem = &ep[..ep.len() - suffix.len()];
                assert!(
                    s.source.contains(&format!(" {ep}("))
                        || s.source.contains(&format!(", {stem})")),
                    "{ep} is not defined in {}",
                    s.name
                );
            }
        }
    }
}
