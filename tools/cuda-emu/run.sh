#!/usr/bin/env bash
# Host emulation check of the CUDA kernels (no GPU needed): writes the CPU path's results
# for a few hundred cases, runs every kernel on the host (tools/cuda-emu/cuda_emu.h) and
# compares the bytes. Usage: tools/cuda-emu/run.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
work="${1:-target/cuda-emu}"
mkdir -p "$work"
cargo run -q -p quantfmt --example cuda_emu_cases -- "$work/cases"
g++ -std=c++20 -O2 -ffp-contract=off -fno-fast-math -Wno-unknown-pragmas -I kernels \
    tools/cuda-emu/emu_check.cpp -o "$work/emu_check"
"$work/emu_check" "$work/cases"
