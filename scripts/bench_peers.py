#!/usr/bin/env python3
"""Side-by-side CPU throughput: quantfmt against the Python peers installed here.

Runs `quantfmt bench --json` (release build) and, in the same process tree and on the
same shape, every peer that is importable:

* ml_dtypes: per-tensor FP8 (amax, scale, `astype(float8_e4m3fn)`) and the E4M3 decode;
* numpy (vectorized, as a user would write it): FP8 1x128 blockwise, MXFP8 (E8M0 per 32)
  and NVFP4 (E4M3 per 16 + E2M1 packed two per byte), int4 per-group qparams + nibble
  packing (torchao's math, without the tile permutation);
* torch, when installed: f32 -> float8_e4m3fn `copy_`, `_convert_weight_to_int4pack_for_cpu`;
* torchao, when installed: `to_mx` (MXFP8) eager and under `torch.compile` (the issue's best
  CPU peer), and `NVFP4Tensor.to_nvfp4`, eager.

Peers are optional and never needed by `cargo test`; a missing one is reported as
skipped. Every number is GB/s of input read for quantize and of output written for
decode, median of `--runs`, and the table shows quantfmt / best peer and quantfmt's
ratio to its same-run copy roofline. Peers run with torch's and numpy's default threads
(numpy's elementwise code is single-threaded; that is what its users get).

    python3 scripts/bench_peers.py                 # 8192x8192, f32 and bf16
    python3 scripts/bench_peers.py --shape 4096x4096 --runs 3 --dtypes f32
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

try:
    import ml_dtypes
except ImportError:  # ml_dtypes peers are skipped
    ml_dtypes = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def median_seconds(fn, runs):
    fn()  # warm-up
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


# --- numpy / ml_dtypes peers (written as a user would, vectorized) -------------------


def peer_fp8_per_tensor(x):
    amax = np.max(np.abs(x))
    scale = np.float32(448.0) / amax
    return (x * scale).astype(ml_dtypes.float8_e4m3fn), np.float32(1.0) / scale


def peer_fp8_block_1x128(x):
    m, k = x.shape
    b = x.reshape(m, k // 128, 128)
    amax = np.abs(b).max(axis=2, keepdims=True)
    scale = np.where(amax > 0, np.float32(448.0) / amax, np.float32(1.0))
    return (b * scale).astype(ml_dtypes.float8_e4m3fn).reshape(m, k), 1.0 / scale


def peer_mxfp8(x):
    m, k = x.shape
    b = x.reshape(m, k // 32, 32)
    amax = np.abs(b).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        e = np.ceil(np.log2(amax * np.float32(1.0 / 448.0)))
    e = np.where(np.isfinite(e), e, -127).astype(np.float32)
    data = (b * np.exp2(-e)).astype(ml_dtypes.float8_e4m3fn).reshape(m, k)
    return data, (e + 127).astype(np.uint8)


def peer_nvfp4(x):
    m, k = x.shape
    gamax = np.max(np.abs(x))
    s_enc = np.float32(448.0 * 6.0) / gamax
    b = x.reshape(m, k // 16, 16)
    bamax = np.abs(b).max(axis=2, keepdims=True)
    sdec = (bamax * (s_enc / np.float32(6.0))).astype(ml_dtypes.float8_e4m3fn)
    sf = sdec.astype(np.float32)
    enc = np.where(sf > 0, s_enc / sf, np.float32(0.0))
    codes = (b * enc).astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(m, k) & 0xF
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, sdec


def peer_int4_qparams_pack(x, group=128):
    n, k = x.shape
    g = x.reshape(n, k // group, group)
    lo, hi = g.min(axis=2, keepdims=True), g.max(axis=2, keepdims=True)
    scale = np.maximum((hi - lo) / np.float32(15.0), np.float32(1e-6))
    zero = lo + scale * np.float32(8.0)
    q = np.clip(np.rint((g - lo) / scale), 0, 15).astype(np.uint8).reshape(n, k)
    return (q[:, 0::2] << 4) | q[:, 1::2], scale, zero


def numpy_peers(x32, xbf16):
    """(format, op, dtype, callable, bytes) for every numpy/ml_dtypes peer."""
    out = []
    if ml_dtypes is None:
        return out
    for dt, x in (("f32", x32), ("bf16", xbf16)):

        def f(fn, x=x):
            # numpy has no bf16 arithmetic: the peer widens first (timed), as its users must.
            if x.dtype == np.float32:
                return lambda: fn(x)
            return lambda: fn(x.astype(np.float32))

        nbytes = x.nbytes
        out += [
            ("fp8", "quantize", dt, "ml_dtypes", f(peer_fp8_per_tensor), nbytes),
            ("fp8-block:1x128", "quantize", dt, "numpy", f(peer_fp8_block_1x128), nbytes),
            ("mxfp8", "quantize", dt, "numpy", f(peer_mxfp8), nbytes),
            ("nvfp4", "quantize", dt, "numpy", f(peer_nvfp4), nbytes),
            ("int4tiled", "quantize", dt, "numpy", f(peer_int4_qparams_pack), nbytes),
        ]
    codes = peer_fp8_per_tensor(x32)[0]
    out.append(
        ("fp8", "dequantize", "f32", "ml_dtypes", lambda: codes.astype(np.float32), x32.nbytes)
    )
    return out


def torch_peers(x32):
    out = []
    try:
        import torch
    except ImportError:
        print("skipped: torch not installed (torch and torchao peers)", file=sys.stderr)
        return out
    t32 = torch.from_numpy(x32)
    tbf = t32.to(torch.bfloat16)
    for dt, t in (("f32", t32), ("bf16", tbf)):
        dst = torch.empty(t.shape, dtype=torch.float8_e4m3fn)
        out.append(("fp8", "quantize", dt, "torch copy_", lambda t=t, dst=dst: dst.copy_(t), t.numel() * t.element_size()))
    codes = t32.to(torch.float8_e4m3fn)
    out.append(("fp8", "dequantize", "f32", "torch", lambda: codes.to(torch.float32), x32.nbytes))
    try:
        from torchao.prototype.mx_formats.mx_tensor import to_mx

        for dt, t in (("f32", t32), ("bf16", tbf)):
            out.append(("mxfp8", "quantize", dt, "torchao to_mx", lambda t=t: to_mx(t, torch.float8_e4m3fn, 32), t.numel() * t.element_size()))
    except Exception as e:  # noqa: BLE001 - any import problem means: no peer
        print(f"skipped: torchao to_mx ({e})", file=sys.stderr)
    else:
        # The issue's best CPU peer: to_mx under torch.compile (Inductor's C++ backend).
        # Compiled and run once here, so compile time and failures stay out of the timing.
        try:
            compiled = torch.compile(to_mx)
            for dt, t in (("f32", t32), ("bf16", tbf)):
                compiled(t, torch.float8_e4m3fn, 32)
                out.append(("mxfp8", "quantize", dt, "torch.compile(to_mx)", lambda t=t: compiled(t, torch.float8_e4m3fn, 32), t.numel() * t.element_size()))
        except Exception as e:  # noqa: BLE001 - no compiler, unsupported op: no peer
            print(f"skipped: torch.compile(to_mx) ({e})", file=sys.stderr)
    try:
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor

        out.append(("nvfp4", "quantize", "bf16", "torchao to_nvfp4", lambda: NVFP4Tensor.to_nvfp4(tbf), tbf.numel() * 2))
    except Exception as e:  # noqa: BLE001
        print(f"skipped: torchao NVFP4Tensor ({e})", file=sys.stderr)
    return out


# --- quantfmt -------------------------------------------------------------------------


def quantfmt_records(shape, dtypes, runs):
    subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "quantfmt-cli"], cwd=ROOT, check=True
    )
    exe = os.path.join(ROOT, "target", "release", "quantfmt")
    recs = []
    for dt in dtypes:
        cmd = [exe, "bench", "--shape", shape, "--dtype", dt, "--runs", str(runs), "--json"]
        res = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
        recs += [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return recs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8192x8192")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print one JSON object per row")
    a = ap.parse_args()
    m, k = (int(v) for v in a.shape.lower().split("x"))
    dtypes = a.dtypes.split(",")

    ours = quantfmt_records(a.shape, dtypes, a.runs)

    rng = np.random.default_rng(0)
    x32 = (rng.standard_normal((m, k), dtype=np.float32) * 2).astype(np.float32)
    xbf = x32.astype(ml_dtypes.bfloat16) if ml_dtypes is not None else x32
    peers = {}
    for fmt, op, dt, who, fn, nbytes in numpy_peers(x32, xbf) + torch_peers(x32):
        if dt not in dtypes:
            continue
        gbps = nbytes / median_seconds(fn, a.runs) / 1e9
        peers.setdefault((fmt, op, dt), []).append((who, gbps))

    rows = []
    for r in ours:
        base = r["format"].split(",")[0]
        key = (base, r["op"], r["dtype"])
        if key not in peers and base.startswith("fp8-block"):
            key = ("fp8-block:1x128", r["op"], r["dtype"])
        best = max(peers.get(key, []), key=lambda p: p[1], default=None)
        rows.append(
            {
                "format": r["format"],
                "op": r["op"],
                "dtype": r["dtype"],
                "threads": r["threads"],
                "quantfmt_gbps": round(r["gbps"], 3),
                "roofline_gbps": round(r["roofline_gbps"], 3),
                "roofline_ratio": round(r["ratio"], 3),
                "best_peer": best[0] if best else None,
                "peer_gbps": round(best[1], 3) if best else None,
                "vs_peer": round(r["gbps"] / best[1], 2) if best else None,
            }
        )
    if a.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"shape {m}x{k}, median of {a.runs} runs, quantfmt on {ours[0]['threads'] if ours else '?'} threads")
    hdr = f"{'format':<28}{'op':<11}{'dtype':<6}{'GB/s':>8}{'roof':>8}{'ratio':>7}  {'best peer':<18}{'GB/s':>8}{'x peer':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        peer = r["best_peer"] or "-"
        pg = f"{r['peer_gbps']:.3f}" if r["peer_gbps"] else "-"
        vs = f"{r['vs_peer']:.1f}" if r["vs_peer"] else "-"
        print(
            f"{r['format']:<28}{r['op']:<11}{r['dtype']:<6}{r['quantfmt_gbps']:>8.2f}"
            f"{r['roofline_gbps']:>8.2f}{r['roofline_ratio']:>7.2f}  {peer:<18}{pg:>8}{vs:>8}"
        )


if __name__ == "__main__":
    main()
