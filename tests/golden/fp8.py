#!/usr/bin/env python3
"""Golden data for fmt-fp8: per-tensor current scaling (`fp8`) and blockwise 1x128 /
128x128 scaling (`fp8-block`).

An independent numpy + ml_dtypes model of TransformerEngine's KERNEL semantics (spec
/work/shared/docs/reference/transformer-engine-formats.md sections 0-2; TE sources
`common/recipe/recipe_common.cuh`, `common/recipe/current_scaling.cu`,
`common/transpose/quantize_transpose_{vector,square}_blockwise.cu`). Where TE's Python
oracles (`tests/pytorch/references/*.py`) differ from the kernels, the kernels win:

* cast: `fp8(float(x) * scale)`, one IEEE fp32 multiply, round to nearest even, SATURATING
  to +-max (clip before the ml_dtypes cast: ml_dtypes overflows to NaN / inf); NaN -> 0x7F.
* amax: max |x| starting from 0, NaN ignored (CUDA fmaxf / __hmax): np.fmax.reduce with
  initial 0. Zero padding of ragged blocks cannot change it.
* scale (compute_scale_from_amax): amax < eps -> eps (NaN is not clamped); amax 0 / inf /
  NaN -> 1; scale = max_fp8 / amax in fp32; inf -> value_for_inf; pow2 keeps only the sign
  and exponent bits (bits & 0xFF800000). value_for_inf is FLT_MAX for per-tensor scaling
  and the INPUT dtype's max finite for blockwise (FLT_MAX, bf16 0x7F7F, f16 65504).
  (The Python oracles instead give scale 0 for amax = inf and do not saturate.)
* scale_inv = 1 / scale in fp32 (IEEE; the kernels' `1.0 / scale` in double then rounded
  to float is the same value: 53 >= 2 * 24 + 2 bits, so no double rounding).
* layouts (GEMM-ready, zero padding): per-tensor `scale_inv` f32 [1] shared by both
  directions; 1x128 rowwise scales [ceil(K/128), roundup(M,4)] (transposed), columnwise
  [ceil(M/128), roundup(K,4)]; 128x128 rowwise [ceil(M/128), roundup(ceil(K/128),4)],
  columnwise [ceil(K/128), roundup(ceil(M/128),4)]. Columnwise data is [K, d0, ..] (the
  2-D view transposed); 1x128 columnwise blocks are 128 rows of one column, quantized
  from the high-precision input.
* dequantize: `decode(q) * scale_inv` in fp32, then cast to the output dtype (ml_dtypes
  bfloat16 / numpy float16, round to nearest even), in the LOGICAL (untransposed) shape.

Every case stores `caseN.input` (f32 / bf16 / f16), every quantized buffer under its
library name (`caseN.rowwise_data`, ...), and `caseN.dequant.<rowwise|columnwise>.<f32|bf16|f16>.crc32`,
the CRC32 of the reference dequantization's bytes in that output dtype (kept as a
checksum so the files stay small); the JSON metadata (`__metadata__["json"]`) describes each case.

Run: python3 tests/golden/fp8.py   (writes tests/golden/data/fp8*.safetensors)
"""

import json
import pathlib
import zlib

import ml_dtypes as md
import numpy as np
from safetensors.numpy import save_file

OUT = pathlib.Path(__file__).resolve().parent / "data"
SEED = 20260822
BLOCK = 128

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)

FP8 = {"e4m3": (md.float8_e4m3fn, F32(448.0)), "e5m2": (md.float8_e5m2, F32(57344.0))}

# input dtype -> (numpy dtype, raw bits dtype, max finite as f32)
INPUT = {
    "f32": (np.float32, np.uint32, FLT_MAX),
    "bf16": (md.bfloat16, np.uint16, F32(np.uint16(0x7F7F).view(md.bfloat16))),
    "f16": (np.float16, np.uint16, F32(65504.0)),
}

USAGES = {"rowwise": (True, False), "columnwise": (False, True), "both": (True, True)}


# ---------------------------------------------------------------------------------------
# kernel semantics
# ---------------------------------------------------------------------------------------


def fp8_cast(x32, fmt):
    """Saturating RNE cast of an fp32 array; NaN -> 0x7F."""
    dt, mx = FP8[fmt]
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.clip(x32, -mx, mx).astype(dt).view(np.uint8)
    return np.where(np.isnan(x32), np.uint8(0x7F), q).astype(np.uint8)


def fp8_decode(q, fmt):
    return q.view(FP8[fmt][0]).astype(F32)


def nan_ignoring_amax(a, axis=None):
    """max |a| from 0; fmax returns the non-NaN operand."""
    return np.fmax.reduce(np.abs(a), axis=axis, initial=F32(0)).astype(F32)


def scale_from_amax(amax, fmt, pow2, eps, v_inf):
    amax = np.asarray(amax, dtype=F32)
    a = np.where(amax < eps, F32(eps), amax).astype(F32)  # NaN < eps is False
    unit = np.isinf(a) | (a == 0) | np.isnan(a)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s = (FP8[fmt][1] / a).astype(F32)
    s = np.where(np.isinf(s), F32(v_inf), s).astype(F32)
    if pow2:
        s = (s.view(np.uint32) & np.uint32(0xFF800000)).view(F32)
    return np.where(unit, F32(1.0), s).astype(F32)


def rcp(s):
    with np.errstate(divide="ignore"):
        return (F32(1.0) / np.asarray(s, dtype=F32)).astype(F32)


def round_up(a, b):
    return -(-a // b) * b


def ceil_div(a, b):
    return -(-a // b)


def col_shape(shape):
    return [shape[-1]] + list(shape[:-1])


def quantize_per_tensor(x, c):
    shape = list(x.shape)
    x2 = x.astype(F32).reshape(-1, shape[-1])
    # an amax given from outside (TE's amax reduction group / use_existing_amax)
    amax = c["amax"] if "amax" in c else nan_ignoring_amax(x2)
    s = scale_from_amax(amax, c["fp8"], c["pow2"], c["eps"], FLT_MAX)
    with np.errstate(over="ignore", invalid="ignore"):
        q = fp8_cast(x2 * s, c["fp8"])
    row, col = USAGES[c["usage"]]
    bufs, deq_scales = {}, {}
    sinv = rcp(s)
    if row:
        bufs["rowwise_data"] = q.reshape(shape)
        deq_scales["rowwise"] = np.full(q.shape, sinv, dtype=F32)
    if col:
        bufs["columnwise_data"] = np.ascontiguousarray(q.T).reshape(col_shape(shape))
        deq_scales["columnwise"] = np.full(q.T.shape, sinv, dtype=F32)
    bufs["scale_inv"] = np.array([sinv], dtype=F32)
    return bufs, deq_scales


def blocks_1x128(a, c, v_inf):
    """Blocks of 128 consecutive elements along the last axis of 2-D `a` (zero padded)."""
    r, k = a.shape
    nb = ceil_div(k, BLOCK)
    ap = np.zeros((r, nb * BLOCK), dtype=F32)
    ap[:, :k] = a
    amax = nan_ignoring_amax(ap.reshape(r, nb, BLOCK), axis=2)
    s = scale_from_amax(amax, c["fp8"], c["pow2"], c["eps"], v_inf)  # [r, nb]
    with np.errstate(over="ignore", invalid="ignore"):
        q = fp8_cast(ap * np.repeat(s, BLOCK, axis=1), c["fp8"])[:, :k]
    sinv = rcp(s)
    return np.ascontiguousarray(q), sinv, np.repeat(sinv, BLOCK, axis=1)[:, :k]


def quantize_block(x, c):
    shape = list(x.shape)
    x2 = x.astype(F32).reshape(-1, shape[-1])
    m, k = x2.shape
    v_inf = INPUT[c["dtype"]][2]
    row, col = USAGES[c["usage"]]
    bufs, deq_scales = {}, {}
    nmb, nkb = ceil_div(m, BLOCK), ceil_div(k, BLOCK)
    if c["block"] == "1x128":
        if row:
            q, sinv, full = blocks_1x128(x2, c, v_inf)  # sinv [m, nkb]
            bufs["rowwise_data"] = q.reshape(shape)
            s = np.zeros((nkb, round_up(m, 4)), dtype=F32)
            s[:, :m] = sinv.T
            bufs["rowwise_scale_inv"] = s
            deq_scales["rowwise"] = full
        if col:
            q, sinv, full = blocks_1x128(np.ascontiguousarray(x2.T), c, v_inf)  # [k, nmb]
            bufs["columnwise_data"] = q.reshape(col_shape(shape))
            s = np.zeros((nmb, round_up(k, 4)), dtype=F32)
            s[:, :k] = sinv.T
            bufs["columnwise_scale_inv"] = s
            deq_scales["columnwise"] = full
    else:
        xp = np.zeros((nmb * BLOCK, nkb * BLOCK), dtype=F32)
        xp[:m, :k] = x2
        t = xp.reshape(nmb, BLOCK, nkb, BLOCK)
        amax = nan_ignoring_amax(nan_ignoring_amax(t, axis=3), axis=1)  # [nmb, nkb]
        s = scale_from_amax(amax, c["fp8"], c["pow2"], c["eps"], v_inf)
        sfull = np.repeat(np.repeat(s, BLOCK, axis=0), BLOCK, axis=1)
        with np.errstate(over="ignore", invalid="ignore"):
            q = fp8_cast(xp * sfull, c["fp8"])[:m, :k]
        sinv = rcp(s)
        full = np.repeat(np.repeat(sinv, BLOCK, axis=0), BLOCK, axis=1)[:m, :k]
        if row:
            bufs["rowwise_data"] = np.ascontiguousarray(q).reshape(shape)
            rs = np.zeros((nmb, round_up(nkb, 4)), dtype=F32)
            rs[:, :nkb] = sinv
            bufs["rowwise_scale_inv"] = rs
            deq_scales["rowwise"] = full
        if col:
            bufs["columnwise_data"] = np.ascontiguousarray(q.T).reshape(col_shape(shape))
            cs = np.zeros((nkb, round_up(nmb, 4)), dtype=F32)
            cs[:, :nmb] = sinv.T
            bufs["columnwise_scale_inv"] = cs
            deq_scales["columnwise"] = np.ascontiguousarray(full.T)
    return bufs, deq_scales


def cast_out(v32, dtype):
    if dtype == "f32":
        return v32.astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        return v32.astype(INPUT[dtype][0])


DEQUANT_DTYPES = ["f32", "bf16", "f16"]


def dequantize(bufs, deq_scales, shape, c):
    """decode(q) * scale_inv per element in fp32, then cast to each output dtype, in the
    logical shape: {(direction, dtype): array}."""
    out = {}
    m = int(np.prod(shape[:-1]))
    k = shape[-1]
    for d, s in deq_scales.items():
        q = bufs[f"{d}_data"].reshape(m, k) if d == "rowwise" else bufs[f"{d}_data"].reshape(k, m)
        with np.errstate(over="ignore"):
            v = fp8_decode(q, c["fp8"]) * s  # may overflow to inf (e.g. a saturated 448)
        if d == "columnwise":
            v = v.T
        for dt in DEQUANT_DTYPES:
            out[(d, dt)] = np.ascontiguousarray(cast_out(v, dt)).reshape(shape)
    return out


# ---------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------


def in_cast(x, dtype):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float64).astype(F32).astype(INPUT[dtype][0])


def from_bits(bits, dtype):
    return np.asarray(bits, dtype=INPUT[dtype][1]).view(INPUT[dtype][0])


def midpoints(fmt):
    """Exact midpoints between adjacent non-negative finite FP8 values below max."""
    n = 0x7F if fmt == "e4m3" else 0x7C
    v = np.arange(n, dtype=np.uint8).view(FP8[fmt][0]).astype(np.float64)
    return (v[:-1] + v[1:]) / 2


def tie_shift(rng, dtype, fmt):
    """k such that midpoints * 2^-k and max * 2^-k are exact in the input dtype."""
    if dtype == "f16":
        lo, hi = (-7, 14) if fmt == "e4m3" else (0, 7)
    else:
        lo, hi = (-40, 60)
    return int(rng.integers(lo, hi + 1))


def signs(rng, n):
    return np.where(rng.random(n) < 0.5, -1.0, 1.0)


def fill(kind, rng, shape, dtype, fmt, pos=None):
    """Values of one content kind, in the input dtype (flat, len prod(shape))."""
    n = int(np.prod(shape))
    mx = float(INPUT[dtype][2])
    if kind == "zeros":
        return in_cast(np.zeros(n), dtype)
    if kind == "randn":
        return in_cast(rng.standard_normal(n) * 10 ** rng.uniform(-3, 3), dtype)
    if kind == "wide":
        lo, hi = (-24, 15) if dtype == "f16" else (-140, 100)
        return in_cast(signs(rng, n) * np.exp2(rng.uniform(lo, hi, n)), dtype)
    if kind == "tiny":
        # subnormals of the input dtype: for f32/bf16 max/amax overflows -> value_for_inf
        top = 0x3FFFFF if dtype == "f32" else 0x7F if dtype == "bf16" else 0x3FF
        b = rng.integers(1, top + 1, n)
        b = b | np.where(rng.random(n) < 0.5, 0x80000000 if dtype == "f32" else 0x8000, 0)
        return from_bits(b, dtype).copy()
    if kind == "nan_sub":
        x = in_cast(rng.standard_normal(n) * 10 ** rng.uniform(-2, 2), dtype)
        r = rng.random(n)
        x[r < 0.03] = np.nan
        x[(r >= 0.03) & (r < 0.05)] = -np.nan
        x[(r >= 0.05) & (r < 0.07)] = 0.0
        x[(r >= 0.07) & (r < 0.09)] = -0.0
        sub = (r >= 0.09) & (r < 0.12)
        top = 0x7FFFFF if dtype == "f32" else 0x7F if dtype == "bf16" else 0x3FF
        sb = rng.integers(1, top + 1, int(sub.sum()))
        x[sub] = from_bits(sb, dtype) * np.where(rng.random(sb.size) < 0.5, -1, 1).astype(
            INPUT[dtype][0]
        )
        return x
    if kind == "inf":
        x = in_cast(rng.standard_normal(n) * 10 ** rng.uniform(-2, 2), dtype)
        x[rng.integers(0, n)] = np.inf
        x[rng.integers(0, n)] = -np.inf
        return x
    if kind == "dtype_max":
        x = in_cast(rng.standard_normal(n) * 10 ** rng.uniform(-2, 2), dtype)
        i = rng.integers(0, n, 3)
        x[i[0]] = mx
        x[i[1]] = -mx
        x[i[2]] = np.nextafter(F32(mx), F32(0)) if dtype == "f32" else -mx
        return x
    if kind == "near_max":
        # values within a few ulps of an amax A for which fl(fl(max / A) * A) > max: the
        # amax element itself lands just above the FP8 max and must saturate
        fmax_ = FP8[fmt][1]
        for _ in range(10000):
            a32 = in_cast([10 ** rng.uniform(-2, 3)], dtype).astype(F32)[0]
            if (fmax_ / a32).astype(F32) * a32 > fmax_:
                break
        a = float(a32)
        ulp = 2.0 ** (np.floor(np.log2(a)) - (23 if dtype == "f32" else 7 if dtype == "bf16" else 10))
        x = in_cast(signs(rng, n) * (a - ulp * rng.integers(0, 4, n)), dtype)
        x[rng.integers(0, n)] = a
        return x
    if kind == "ties":
        k = tie_shift(rng, dtype, fmt)
        mids = midpoints(fmt)
        x = signs(rng, n) * mids[rng.integers(0, mids.size, n)]
        mxv = float(FP8[fmt][1])
        # one +-max per row segment / column segment of every full block: (i + j) % 128 == 0
        if pos is None:
            x[rng.integers(0, n)] = mxv
        else:
            x[pos] = signs(rng, int(pos.sum())) * mxv
        return in_cast(np.ldexp(x, -k), dtype)
    raise ValueError(kind)


def all_codes(shape, dtype, fmt, amax):
    """Every finite FP8 value d (both signs) as d / scale for the scale an amax of `amax`
    gives, plus `amax` itself, tiled over the tensor: each code's dequantization
    d * scale_inv is then checked, including the fp32-then-cast double rounding (these
    amax values were searched so that the f32 product rounded to bf16 / f16 differs from
    the exact product rounded once)."""
    n = int(np.prod(shape))
    dt, mx = FP8[fmt]
    top = 0x7F if fmt == "e4m3" else 0x7C
    d = np.arange(top, dtype=np.uint8).view(dt).astype(F32)
    d = np.concatenate([d, -d])
    scale = (mx / F32(amax)).astype(F32)
    v = (d / scale).astype(F32)
    v = np.concatenate([[F32(amax)], v[np.abs(v) < F32(amax)]])
    x = np.resize(v, n).astype(INPUT[dtype][0])
    assert nan_ignoring_amax(x.astype(F32)) == F32(amax) and x.astype(F32)[0] == F32(amax)
    return x.reshape(shape)


KINDS = ["randn", "zeros", "nan_sub", "inf", "tiny", "ties", "wide", "near_max", "dtype_max"]


def mixed(rng, shape, dtype, fmt, block):
    """Regions of different kinds: 128x128 tiles (128x128 cases) or 8-row x 128-column
    regions (1x128 cases), plus an all-zero column, an all-NaN column and an all-zero row."""
    m = int(np.prod(shape[:-1]))
    k = shape[-1]
    rh = BLOCK if block == "128x128" else 8
    x = np.zeros((m, k), dtype=INPUT[dtype][0])
    ii, jj = np.meshgrid(np.arange(m), np.arange(k), indexing="ij")
    diag = (ii + jj) % BLOCK == 0
    off = int(rng.integers(0, len(KINDS)))
    for r0 in range(0, m, rh):
        for c0 in range(0, k, BLOCK):
            r1, c1 = min(r0 + rh, m), min(c0 + BLOCK, k)
            kind = KINDS[(off + (r0 // rh) * 4 + (c0 // BLOCK) * 7) % len(KINDS)]
            pos = diag[r0:r1, c0:c1].ravel() if kind == "ties" else None
            x[r0:r1, c0:c1] = fill(kind, rng, (r1 - r0, c1 - c0), dtype, fmt, pos).reshape(
                r1 - r0, c1 - c0
            )
    if k > 7 and m > 1:
        x[:, 5] = 0
        x[:, 6] = np.nan
    if m > 3:
        x[2, :] = 0
    return x.reshape(shape)


# ---------------------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------------------


def eps_value(kind):
    return {
        "0": F32(0.0),
        "tiny": F32(np.uint32(1).view(F32)),  # 2^-149: all-zero blocks -> value_for_inf
        "1": F32(1.0),
        "big": F32(3.0e4),
    }[kind]


def make_cases():
    rng = np.random.default_rng(SEED)
    small = [[1, 1], [3, 130], [130], [2, 7, 130], [5, 300], [16, 64]]
    dtypes = ["f32", "bf16", "f16"]
    fmts = ["e4m3", "e5m2"]
    usages = ["both", "rowwise", "columnwise"]
    cases = []

    def add(**c):
        c.setdefault("eps_kind", "0")
        c["eps"] = eps_value(c["eps_kind"])
        cases.append(c)

    # ---- per-tensor current scaling: every content kind x every input dtype
    i = 0
    for kind in KINDS:
        for dtype in dtypes:
            add(
                format="fp8", shape=small[i % len(small)], dtype=dtype, fp8=fmts[i % 2],
                pow2=bool((i // 2) % 2), usage=usages[i % 3],
                content=kind,
            )
            i += 1
    # large / ragged shapes
    for j, (shape, dtype) in enumerate(
        [([129, 257], "f32"), ([200, 128], "bf16"), ([2, 70, 130], "f16"), ([129, 257], "bf16")]
    ):
        add(format="fp8", shape=shape, dtype=dtype, fp8=fmts[j % 2], pow2=bool(j % 2),
            usage="both", content="randn" if j % 2 else "wide")
    # ties after scaling, both formats, pow2 on and off (scale is exactly 2^k either way)
    for j in range(8):
        add(format="fp8", shape=[3, 130], dtype=dtypes[j % 3], fp8=fmts[j % 2],
            pow2=bool((j // 2) % 2), usage=usages[j % 3],
            content="ties")
    # amax epsilon: tiny (zeros -> value_for_inf = FLT_MAX), 1 (floor above a small
    # amax), big; NaN amax is never clamped
    for j, (kind, ek) in enumerate(
        [("zeros", "tiny"), ("zeros", "tiny"), ("randn", "1"), ("randn", "big"),
         ("nan_sub", "1"), ("tiny", "1"), ("ties", "1"), ("zeros", "1")]
    ):
        add(format="fp8", shape=small[j % len(small)], dtype=dtypes[j % 3], fp8=fmts[j % 2],
            pow2=bool(j % 2 == 0) if j < 2 else bool((j // 2) % 2), usage=usages[j % 3],
            content=kind, eps_kind=ek)
    add(format="fp8", shape=[4, 8], dtype="f32", fp8="e4m3", pow2=False, usage="both",
        content="nan_only")
    # an amax supplied from outside (after a cross-rank reduction): NaN is not clamped by
    # eps and gives scale 1, as do inf and 0; a larger amax than the local one; a tiny one
    for j, (amax, ek, pow2) in enumerate(
        [(np.nan, "1", False), (np.inf, "0", True), (0.0, "0", False), (1234.5, "0", False),
         (1234.5, "0", True), (1e-42, "0", True), (1e-42, "0", False), (0.5, "1", False)]
    ):
        add(format="fp8", shape=small[j % len(small)], dtype=dtypes[j % 3], fp8=fmts[j % 2],
            pow2=pow2, usage=usages[j % 3], content="randn",
            eps_kind=ek, amax=F32(amax))

    # every FP8 code dequantized, with amax values where fp32-then-cast double rounding
    # differs from a single rounding of the exact product
    for fmt, amax in [("e4m3", 627.0385131835938), ("e4m3", 267.0),
                      ("e5m2", 124.75000762939453)]:
        add(format="fp8", shape=[2, 128], dtype="f32", fp8=fmt, pow2=False, usage="both",
            content="all_codes", code_amax=amax)

    # ---- blockwise: every shape x block x input dtype, mixed regions
    j = 0
    for block in ["1x128", "128x128"]:
        for shape in small:
            for dtype in dtypes:
                add(format="fp8-block", block=block, shape=shape, dtype=dtype,
                    fp8=fmts[j % 2], pow2=(j // 2) % 3 != 0, usage=usages[j % 3],
                    content="mixed")
                j += 1
        large = {
            "1x128": [([129, 257], "f32"), ([200, 128], "bf16"), ([2, 70, 130], "f16")],
            "128x128": [([129, 257], "bf16"), ([200, 128], "f16"), ([2, 70, 130], "f32")],
        }
        for shape, dtype in large[block]:
            add(format="fp8-block", block=block, shape=shape, dtype=dtype, fp8=fmts[j % 2],
                pow2=j % 3 != 0, usage="both", content="mixed")
            j += 1
    # value_for_inf per input dtype: all-zero blocks with eps = 2^-149, pow2 on and off
    # (f32 -> FLT_MAX / 2^127, bf16 -> 0x7F7F0000 / 2^127, f16 -> 65504 / 2^15)
    for block in ["1x128", "128x128"]:
        for dtype in dtypes:
            for pow2 in [True, False]:
                add(format="fp8-block", block=block, shape=[3, 130], dtype=dtype,
                    fp8="e4m3" if pow2 else "e5m2", pow2=pow2, usage="both",
                    content="zeros", eps_kind="tiny")
    for block in ["1x128", "128x128"]:
        add(format="fp8-block", block=block, shape=[1, 256], dtype="f32", fp8="e4m3",
            pow2=False, usage="rowwise", content="all_codes", code_amax=267.0)
    # ties, near-max, epsilon
    for jj, (kind, ek) in enumerate(
        [("ties", "0"), ("ties", "0"), ("ties", "1"), ("near_max", "0"), ("near_max", "0"),
         ("randn", "big"), ("tiny", "1"), ("mixed", "1")]
    ):
        for block in ["1x128", "128x128"]:
            if kind == "ties":  # full blocks, so that the scale is exactly 2^k
                shape = [5, 256] if block == "1x128" else [128, 130]
            else:
                shape = [5, 300]
            add(format="fp8-block", block=block, shape=shape,
                dtype=dtypes[jj % 3], fp8=fmts[jj % 2], pow2=jj % 2 == 0 if kind != "ties" else jj != 1,
                usage=usages[jj % 3], content=kind, eps_kind=ek)
    return rng, cases


def make_input(rng, c):
    shape = c["shape"]
    kind = c["content"]
    if kind == "all_codes":
        return all_codes(shape, c["dtype"], c["fp8"], c["code_amax"])
    if kind == "mixed":
        return mixed(rng, shape, c["dtype"], c["fp8"], c.get("block", "128x128"))
    if kind == "nan_only":
        x = np.full(int(np.prod(shape)), np.nan, dtype=INPUT[c["dtype"]][0])
        x[1::2] = -np.nan
        return x.reshape(shape)
    if kind == "ties":
        m = int(np.prod(shape[:-1]))
        ii, jj = np.meshgrid(np.arange(m), np.arange(shape[-1]), indexing="ij")
        pos = ((ii + jj) % BLOCK == 0).ravel()
        return fill(kind, rng, shape, c["dtype"], c["fp8"], pos).reshape(shape)
    return fill(kind, rng, shape, c["dtype"], c["fp8"]).reshape(shape)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rng, cases = make_cases()
    files = {"fp8": ({}, []), "fp8-block": ({}, [])}
    for c in cases:
        x = make_input(rng, c)
        tensors, metas = files[c["format"]]
        n = len(metas)
        if c["format"] == "fp8":
            bufs, deq_scales = quantize_per_tensor(x, c)
        else:
            bufs, deq_scales = quantize_block(x, c)
        deq = dequantize(bufs, deq_scales, list(x.shape), c)
        tensors[f"case{n}.input"] = np.ascontiguousarray(x)
        for name, b in bufs.items():
            tensors[f"case{n}.{name}"] = np.ascontiguousarray(b)
        for (d, dt), v in deq.items():
            # the reference dequantization is kept as a CRC32 of its bytes (little-endian,
            # output dtype): the Rust test compares the library output's CRC32
            tensors[f"case{n}.dequant.{d}.{dt}.crc32"] = np.array(
                [zlib.crc32(v.tobytes()) & 0xFFFFFFFF], dtype=np.uint32
            )
        meta = {
            "format": c["format"],
            "shape": c["shape"],
            "dtype": c["dtype"],
            "fp8": c["fp8"],
            "pow2": bool(c["pow2"]),
            "eps_bits": int(np.asarray(c["eps"], dtype=F32).view(np.uint32)),
            "usage": c["usage"],
            "content": c["content"],
            "buffers": list(bufs.keys()),
        }
        if "block" in c:
            meta["block"] = c["block"]
        if "amax" in c:
            meta["amax_bits"] = int(np.asarray(c["amax"], dtype=F32).view(np.uint32))
        metas.append(meta)
    for fmt, fname in (("fp8", "fp8.safetensors"), ("fp8-block", "fp8_block.safetensors")):
        tensors, metas = files[fmt]
        save_file(tensors, OUT / fname, metadata={"json": json.dumps({"cases": metas})})
        print(f"{fname}: {len(metas)} cases, {(OUT / fname).stat().st_size} bytes")


if __name__ == "__main__":
    main()
