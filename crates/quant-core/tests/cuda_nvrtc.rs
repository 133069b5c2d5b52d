//! NVRTC compiles quant-core's kernels for every CI architecture (skips, with the reason
//! printed, when libnvrtc is absent; fails then if QUANTFMT_REQUIRE_NVRTC=1).
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use quant_core::cuda::nvrtc::{CI_ARCHS, compile, image_has_symbol};
use quant_core::cuda::testing::nvrtc_or_skip;
use quant_core::cuda::{CORE_KERNELS, KernelSource};

#[test]
fn core_kernels_compile_for_every_ci_arch() {
    if !nvrtc_or_skip("core_kernels_compile_for_every_ci_arch").unwrap() {
        return;
    }
    for arch in CI_ARCHS {
        let c = compile(&CORE_KERNELS, arch).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.is_cubin);
        for ep in CORE_KERNELS.entry_points {
            assert!(image_has_symbol(&c.image, ep), "{ep} missing for {arch}");
        }
    }
}

#[test]
fn compile_errors_carry_the_log() {
    if !nvrtc_or_skip("compile_errors_carry_the_log").unwrap() {
        return;
    }
    let bad = KernelSource {
        name: "bad.cu",
        source: "extern \"C\" __global__ void k() { this_is_not_defined(); }",
        entry_points: &["k"],
    };
    let e = compile(&bad, "sm_80").unwrap_err().to_string();
    assert!(
        e.contains("bad.cu") && e.contains("this_is_not_defined"),
        "{e}"
    );
    let e = compile(&CORE_KERNELS, "gfx90a").unwrap_err().to_string();
    assert!(e.contains("sm_XY"), "{e}");
}

#[test]
fn ptx_output_for_compute_archs() {
    if !nvrtc_or_skip("ptx_output_for_compute_archs").unwrap() {
        return;
    }
    let c = compile(&CORE_KERNELS, "compute_80").unwrap();
    assert!(!c.is_cubin);
    let text = String::from_utf8(c.image).unwrap();
    assert!(
        text.contains(".entry qf_amax_f32("),
        "{}",
        &text[..200.min(text.len())]
    );
}
