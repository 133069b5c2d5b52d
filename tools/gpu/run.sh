#!/usr/bin/env bash
# Runs on the GPU machine (carried in .gpu/ by tools/gpu/prepare.sh): the device checks with
# QUANTFMT_REQUIRE_GPU=1 (a missing GPU fails instead of skipping), then the benchmark.
# Logs go to $OUT (the device tool brings them back) and the end of stdout.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/out}"
mkdir -p "$out"
# The CUDA 13 NVRTC of the machine (the driver's libcuda is on the default path).
nvrtc="$(ldconfig -p 2>/dev/null | grep -o '/[^ ]*libnvrtc\.so[^ ]*' | head -n 1)"
if [ -z "$nvrtc" ]; then
    nvrtc="$(find / -xdev -name 'libnvrtc.so*' -not -path '*/proc/*' 2>/dev/null | grep -v alt | sort -V | tail -n 1)"
fi
if [ -n "$nvrtc" ]; then
    export LD_LIBRARY_PATH="$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
    echo "libnvrtc: ${nvrtc:-not found}"
} | tee "$out/machine.txt"
export QUANTFMT_REQUIRE_GPU=1
status=0
for t in "$here"/quant-core-cuda_device "$here"/quantfmt-cuda_device; do
    echo "== $(basename "$t")"
    "$t" --test-threads=1 --nocapture 2>&1 | tee "$out/$(basename "$t").log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
echo "== cuda_bench"
"$here/cuda_bench" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
