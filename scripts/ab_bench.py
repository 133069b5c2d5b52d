#!/usr/bin/env python3
"""A/B two builds of `quantfmt bench`: the judge of a kernel change on a noisy machine.

A single bench run on a shared VM moves by +-30 % (docs/BENCHMARKS.md, "Noise"), so a
change is measured by running the old and the new binary alternately, pair after pair,
and taking the median over the pairs of old time / new time per cell (format, op, dtype,
usage). > 1 means the new build is faster.

    # binaries already built:
    python3 scripts/ab_bench.py --old /tmp/old/quantfmt --new target/release/quantfmt \\
        --pairs 7 -- -f mxfp8 --dtype f16 --usage columnwise
    # or a git revision against the working tree (each built once, under target/ab/):
    python3 scripts/ab_bench.py --old-rev HEAD~1 --pairs 7 -- -f nvfp4 --dtype bf16

Everything after `--` goes to `quantfmt bench` (add `--runs 1`-`3` to keep pairs short);
`--json` is added. The order inside a pair alternates (old first, then new first) so that
a drift of the machine within a pair does not favour one side.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_rev(rev: str) -> Path:
    """Builds `quantfmt` at `rev` in a worktree under target/ab/ and returns its path."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short=12", rev],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.strip()
    tree = ROOT / "target" / "ab" / sha
    binary = tree / "target" / "release" / "quantfmt"
    if not tree.exists():
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--force", str(tree), sha],
            cwd=ROOT, check=True,
        )
    if not binary.exists():
        subprocess.run(
            ["cargo", "build", "--release", "-p", "quantfmt-cli"], cwd=tree, check=True
        )
    return binary


def build_tree() -> Path:
    """Builds `quantfmt` from the working tree and copies it aside (a later build of the
    tree would otherwise replace the binary under test)."""
    subprocess.run(["cargo", "build", "--release", "-p", "quantfmt-cli"], cwd=ROOT, check=True)
    out = ROOT / "target" / "ab" / "worktree-quantfmt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes((ROOT / "target" / "release" / "quantfmt").read_bytes())
    out.chmod(0o755)
    return out


def run(binary: Path, args: list[str]) -> dict[tuple, float]:
    """One bench run: seconds per cell."""
    out = subprocess.run(
        [str(binary), "bench", "--json", *args], check=True, capture_output=True, text=True
    ).stdout
    cells = {}
    for line in out.splitlines():
        r = json.loads(line)
        key = (r["format"], r["op"], r["dtype"], r.get("usage", ""))
        cells[key] = r["seconds"]
    return cells


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", type=Path, help="the old build's quantfmt binary")
    p.add_argument("--new", type=Path, help="the new build's quantfmt binary")
    p.add_argument("--old-rev", help="build the old binary from this git revision")
    p.add_argument("--new-rev", help="build the new binary from this revision (default: the working tree)")
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    args = [x for x in a.bench_args if x != "--"]
    old = a.old or (build_rev(a.old_rev) if a.old_rev else None)
    if old is None:
        p.error("give --old or --old-rev")
    new = a.new or (build_rev(a.new_rev) if a.new_rev else build_tree())
    for b in (old, new):
        if not os.access(b, os.X_OK):
            p.error(f"{b} is not an executable")

    ratios: dict[tuple, list[float]] = {}
    for i in range(a.pairs):
        order = [(old, "old"), (new, "new")] if i % 2 == 0 else [(new, "new"), (old, "old")]
        got = {name: run(b, args) for b, name in order}
        for key, t_old in got["old"].items():
            t_new = got["new"].get(key)
            if t_new:
                ratios.setdefault(key, []).append(t_old / t_new)
        print(f"pair {i + 1}/{a.pairs} done", file=sys.stderr)

    print(f"{'format':<22} {'op':<11} {'dtype':<5} {'usage':<11} {'old/new':>8}  range")
    for (fmt, op, dtype, usage), r in sorted(ratios.items()):
        print(
            f"{fmt:<22} {op:<11} {dtype:<5} {usage:<11} {statistics.median(r):>8.3f}"
            f"  {min(r):.2f}-{max(r):.2f} ({len(r)} pairs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
