//! The FP8 kernels compile with NVRTC for every CI architecture.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use quant_core::cuda::testing::{compile_for_ci_archs, nvrtc_or_skip};

#[test]
fn fp8_kernels_compile() {
    if !nvrtc_or_skip("fp8_kernels_compile").unwrap() {
        return;
    }
    let n = compile_for_ci_archs(std::slice::from_ref(&fmt_fp8::cuda::KERNELS))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, 4);
}
