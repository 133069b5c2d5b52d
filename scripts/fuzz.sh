#!/usr/bin/env bash
# Runs every cargo-fuzz target for a fixed time (nightly only; not part of CI).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Seeds the corpora first (valid files of every registered format, every spec option),
# runs each target with debug assertions and overflow checks on, a 1 GiB RSS limit
# (ASan's own quarantine included)
# and a 100 MiB limit on any single allocation, and prints each target's summary
# (executions, coverage, crashes). Logs go to fuzz/logs/, crashes to fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs="${1:-600}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(load_bytes interop_load unflatten spec_parse quantize)
fi

mkdir -p logs corpus
cargo +nightly fuzz build --debug-assertions
if [ ! -d corpus/interop_load ] || [ -z "$(ls -A corpus/interop_load 2>/dev/null)" ]; then
    # Built by `cargo fuzz build` with the targets (same flags, so no second build).
    triple="$(rustc +nightly -vV | sed -n 's/^host: //p')"
    "target/$triple/release/seed_corpus"
fi

# AddressSanitizer keeps freed memory in a 256 MiB quarantine by default, which counts
# towards the RSS limit; a smaller quarantine keeps the limit about the code under test.
export ASAN_OPTIONS="${ASAN_OPTIONS:-quarantine_size_mb=64}"

status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    extra=()
    case "$t" in
        # Files: the layout's tokens, inputs up to 64 KiB.
        load_bytes) extra=(-dict=dict/native.dict -max_len=65536) ;;
        # Checkpoints in the interop layouts (seeds up to ~75 KB).
        interop_load) extra=(-dict=dict/interop.dict -max_len=131072) ;;
        # Structured inputs: the trailing value bytes matter from the start, so no slow
        # growth of the length limit.
        quantize | unflatten) extra=(-len_control=0 -max_len=8192) ;;
        *) extra=(-max_len=4096) ;;
    esac
    log="logs/$t-$(date +%Y%m%d-%H%M%S).log"
    echo "== $t: ${secs}s (log: fuzz/$log)"
    if ! cargo +nightly fuzz run --debug-assertions "$t" "corpus/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=1024 -malloc_limit_mb=100 \
        -print_final_stats=1 "${extra[@]}" >"$log" 2>&1; then
        echo "   FAILED (see fuzz/$log and fuzz/artifacts/$t/)"
        status=1
    fi
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added)|Done [0-9]+ runs" "$log" || true
    grep -E "^#[0-9]+.*(DONE|cov:)" "$log" | tail -1 || true
done
exit $status
