#!/usr/bin/env bash
# Peak-RSS check of the streaming converter on a generated multi-shard model.
#
#   scripts/rss_check.sh [SIZE] [FORMAT] [HIDDEN]     (defaults: 4GiB nvfp4 2048)
#
# Builds the release CLI, writes a Llama-like bf16 checkpoint of about SIZE in 8 shards
# (largest tensors: the 16*HIDDEN x HIDDEN embedding and lm_head), quantizes it to
# FORMAT, and reports the peak RSS two ways: the process's own VmHWM (--json
# `peak_rss_bytes`) and GNU time's "Maximum resident set size" (getrusage of the child)
# when /usr/bin/time is installed. Fails if the peak is not below
# 2 x largest tensor + 256 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-4GiB}
FORMAT=${2:-nvfp4}
HIDDEN=${3:-2048}
cargo build --release -p quantfmt-cli >/dev/null
Q=target/release/quantfmt
WORK=$(mktemp -d "${TMPDIR:-/tmp}/quantfmt-rss.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
t0=$(date +%s.%N)
$Q example -o "$WORK/model" --size "$SIZE" --shards 8 --hidden "$HIDDEN"
t1=$(date +%s.%N)
if [ -x /usr/bin/time ]; then
  /usr/bin/time -v "$Q" quantize "$WORK/model" -o "$WORK/out" -f "$FORMAT" --json \
    >"$WORK/summary.json" 2>"$WORK/time.txt"
  GNU_KB=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$WORK/time.txt")
else
  "$Q" quantize "$WORK/model" -o "$WORK/out" -f "$FORMAT" --json >"$WORK/summary.json"
  GNU_KB=
fi
python3 - "$WORK/summary.json" "$SIZE" "$FORMAT" "${GNU_KB:-}" "$t0" "$t1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
size, fmt, gnu_kb = sys.argv[2], sys.argv[3], sys.argv[4]
gen_s = float(sys.argv[6]) - float(sys.argv[5])
largest = max(t["bytes_in"] for t in s["tensors"])
peak = s["peak_rss_bytes"]
bound = 2 * largest + (256 << 20)
mib = lambda b: b / 2**20
print(f"model {size} ({mib(s['bytes_in']):.0f} MiB in, {mib(s['bytes_out']):.0f} MiB out, "
      f"{len(s['files'])} shards), format {fmt}")
print(f"generate {gen_s:.1f} s; quantize {s['seconds']:.1f} s "
      f"({s['bytes_in'] / s['seconds'] / 1e6:.0f} MB/s in)")
print(f"largest tensor {mib(largest):.1f} MiB; memory budget {mib(s['memory_budget']):.1f} MiB")
print(f"peak RSS (VmHWM) {mib(peak):.1f} MiB" + (f"; GNU time max RSS {int(gnu_kb) / 1024:.1f} MiB" if gnu_kb else ""))
print(f"bound 2 x largest + 256 MiB = {mib(bound):.1f} MiB: {'OK' if peak < bound else 'EXCEEDED'}")
sys.exit(0 if peak < bound and (not gnu_kb or int(gnu_kb) * 1024 < bound) else 1)
PY
