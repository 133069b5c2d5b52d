#!/usr/bin/env bash
# Runs the codec, layout, buffer and shape unit tests (quant-core) and the format crates'
# unit tests under Miri, which checks every memory access, alignment cast (bytemuck views
# of the 8-byte-aligned buffers) and data race. Nightly only and far too slow for CI;
# run it after touching buffers, layouts, codecs or any unsafe code.
#
#   scripts/miri.sh            # quant-core and every fmt-* crate (lib tests)
#   scripts/miri.sh quant-core # one crate
#
# Miri runs each test about 1000x slower than native code; the few unit tests that sweep
# large ranges shrink their sweeps under `cfg(miri)`.
set -euo pipefail
cd "$(dirname "$0")/.."

crates=("$@")
if [ ${#crates[@]} -eq 0 ]; then
    crates=(quant-core fmt-fp8 fmt-mxfp8 fmt-nvfp4 fmt-int4tiled)
fi
# rayon's crossbeam-epoch casts integers to pointers (so: permissive provenance) and
# trips Stacked Borrows' experimental aliasing rules in its epoch list (in the
# dependency, not in quantfmt, which has no unsafe code); Tree Borrows is used instead.
# rayon's global pool threads outlive the tests (so: ignore leaks).
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-tree-borrows -Zmiri-ignore-leaks}"
# Keep Miri's target dir apart so it never invalidates the normal build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/miri}"
cargo +nightly miri setup
for c in "${crates[@]}"; do
    echo "== miri: $c"
    cargo +nightly miri test -p "$c" --lib
done
