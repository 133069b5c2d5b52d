#!/usr/bin/env bash
# Builds everything the GPU check needs, here (the GPU machine has no Rust toolchain), into
# .gpu/ (git-ignored): the device test binaries and the benchmark, stripped, plus run.sh.
# Then, from a session that has the GPU machine:  device run, carry [".gpu"],
#   command: bash .gpu/run.sh
# (see docs/cuda.md, "Running the device check").
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu
rm -rf "$out"
mkdir -p "$out"
features="nccl"
profile="${PROFILE:-release}" # PROFILE=dev for a quick check of this script
profile_dir="$([ "$profile" = dev ] && echo debug || echo "$profile")"
cargo build --profile "$profile" -p quantfmt --features "$features" --example cuda_bench
cp "target/$profile_dir/examples/cuda_bench" "$out/"
# Test executables: ask cargo for their paths (JSON messages), copy them by name.
for spec in "quant-core:cuda_device" "quantfmt:cuda_device"; do
    pkg="${spec%%:*}"
    test="${spec##*:}"
    exe="$(cargo test --profile "$profile" -p "$pkg" --features "$features" --test "$test" --no-run \
        --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' | tail -n 1)"
    if [ -z "$exe" ]; then
        echo "error: no test executable for $pkg/$test" >&2
        exit 1
    fi
    cp "$exe" "$out/${pkg}-${test}"
done
strip "$out"/* 2>/dev/null || true
cp tools/gpu/run.sh "$out/run.sh"
du -sh "$out"/*
