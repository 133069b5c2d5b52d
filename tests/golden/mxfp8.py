#!/usr/bin/env python3
"""Golden data for MXFP8 (crate fmt-mxfp8), from an independent numpy + ml_dtypes reference.

Written from the semantics of NVIDIA TransformerEngine's kernels and test oracles, not from
the Rust code:

* TE rule (`common/cast/mxfp8/quantize_mxfp8.cuh`, `util/ptx_arch_spec.cuh::float_to_e8m0`):
  block amax = max|x| starting at 0 with NaN ignored (fmaxf / __hmax); val = amax * float(1/max)
  (one f32 multiply by 0x3B124925 / 0x37924925); code = ceil(log2(val)) + 127 clamped to
  [0, 254] (val 0 -> 0, inf -> 254, NaN -> 255). Here ceil(log2) comes from np.frexp.
* OCP rule (OCP MX v1.0 section 6.3, as torchao `to_mx(..., ScaleCalculationMode.FLOOR)`):
  amax = max|x| with NaN propagating (torch.amax); shared_exp = floor(log2(amax)) - emax_elem
  (emax 8 for E4M3, 15 for E5M2), clamped to [-127, 127]; amax 0 -> code 0; non-finite amax
  -> code 255 (NaN scale). floor(log2) again from np.frexp.
* data = fp8(float32(x) * 2^(127 - code)) (TE exp2f_rcp: code 254 -> 2^-127, 255 -> NaN),
  round-to-nearest-even with saturation to +-max (TE satfinite; torchao clamps), NaN -> 0x7F.
  Rounding is ml_dtypes' cast after np.clip.
* sign of zero: for bf16/fp16 input, 1-D, TE rule, TE (sm_100+) runs its cast-only kernels
  (specialized/quantize_mxfp8.cuh), which scale with fma(x, s, +0): -0.0 -> +0 (0x00); the
  generic kernel (f32 input, 2d) keeps -0 (0x80). All cases here quantize both directions.
* rowwise: 1x32 blocks along K; columnwise: 32x1 blocks along M, same [M, K] layout;
  2d: one code per 32x32 tile for both directions (TE tests/pytorch/test_mxfp8_2d_quantize.py).
* scales: compact [roundup(M,128), roundup(K/32,4)] and [roundup(M/32,4), roundup(K,128)], zero
  padding; swizzled = TE tests/pytorch/mxfp8/mxfp8_utils.py views (rowwise
  view(R/128,4,32,C/4,4).permute(0,3,2,1,4); columnwise view(R/4,4,C/128,4,32).permute(2,0,4,3,1),
  checked equal to the rowwise swizzle of the transpose).
* dequantize (TE dequantize_mxfp8.cuh): out = dtype(2^(code-127) * float(q)); code 0 -> 2^-127,
  255 -> NaN.

Run: python3 tests/golden/mxfp8.py  (writes tests/golden/data/mxfp8.safetensors)
"""

import json
import os

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "mxfp8.safetensors")

ELEMS = {
    "e4m3": dict(max=448.0, emax=8, dt=ml_dtypes.float8_e4m3fn, rcp_bits=0x3B124925),
    "e5m2": dict(max=57344.0, emax=15, dt=ml_dtypes.float8_e5m2, rcp_bits=0x37924925),
}
for _e in ELEMS.values():
    _e["rcp"] = np.float32(1.0 / _e["max"])
    assert int(_e["rcp"].view(np.uint32)) == _e["rcp_bits"]


def roundup(a, b):
    return (a + b - 1) // b * b


# ---------------------------------------------------------------- scale rules


def block_amax(blocks, rule):
    """max |x| over the last axis."""
    a = np.abs(blocks.astype(np.float32))
    if rule == "te":
        return np.max(np.where(np.isnan(a), np.float32(0), a), axis=-1)  # fmaxf from 0
    return np.max(a, axis=-1)  # torch.amax: NaN propagates


def code_te(amax, elem):
    with np.errstate(all="ignore"):
        val = (amax.astype(np.float32) * ELEMS[elem]["rcp"]).astype(np.float32)
        m, e = np.frexp(np.where(np.isfinite(val), val, np.float32(1)))
    ceil_log2 = np.where(m == 0.5, e - 1, e).astype(np.int64)
    code = np.clip(ceil_log2 + 127, 0, 254)
    code = np.where(val == 0, 0, code)
    code = np.where(np.isinf(val), 254, code)
    code = np.where(np.isnan(val), 255, code)
    return code.astype(np.uint8)


def code_ocp(amax, elem):
    finite = np.isfinite(amax)
    with np.errstate(all="ignore"):
        _, e = np.frexp(np.where(finite, amax, np.float32(1)).astype(np.float32))
    floor_log2 = e.astype(np.int64) - 1
    shared = np.clip(floor_log2 - ELEMS[elem]["emax"], -127, 127)
    code = shared + 127
    code = np.where(amax == 0, 0, code)
    code = np.where(finite, code, 255)
    return code.astype(np.uint8)


def codes(blocks, rule, elem):
    amax = block_amax(blocks, rule)
    return code_te(amax, elem) if rule == "te" else code_ocp(amax, elem)


def multiplier(code):
    """2^(127 - code) as float32; 255 -> NaN."""
    c = code.astype(np.int32)
    with np.errstate(under="ignore"):
        m = np.ldexp(np.float32(1.0), 127 - c).astype(np.float32)
    return np.where(c == 255, np.float32(np.nan), m).astype(np.float32)


def descale(code):
    """2^(code - 127) as float32; 0 -> 2^-127 (subnormal), 255 -> NaN."""
    c = code.astype(np.int32)
    with np.errstate(over="ignore"):
        s = np.ldexp(np.float32(1.0), c - 127).astype(np.float32)
    return np.where(c == 255, np.float32(np.nan), s).astype(np.float32)


def to_fp8(v, elem):
    e = ELEMS[elem]
    with np.errstate(all="ignore"):
        c = np.clip(v, -e["max"], e["max"])  # satfinite (inf too); NaN stays NaN
        q = c.astype(e["dt"]).view(np.uint8)
    return np.where(np.isnan(v), np.uint8(0x7F), q).astype(np.uint8)


# ---------------------------------------------------------------- layouts


def swizzle_rowwise(s):
    r, c = s.shape
    return s.reshape(r // 128, 4, 32, c // 4, 4).transpose(0, 3, 2, 1, 4).reshape(r, c)


def swizzle_columnwise(s):
    r, c = s.shape
    a = s.reshape(r // 4, 4, c // 128, 4, 32).transpose(2, 0, 4, 3, 1).reshape(-1)
    b = swizzle_rowwise(np.ascontiguousarray(s.T)).reshape(-1)
    assert (a == b).all(), "columnwise swizzle sanity check failed"
    return a.reshape(r, c)


# ---------------------------------------------------------------- quantize / dequantize


def te_fast_kernel(rule, two_d, in_dtype, m):
    """TE's dispatch (quantize_mxfp8.cuh) for usage rowwise+columnwise: bf16/fp16 input,
    1-D, ceil(M/32) <= 65535 -> the cast-only kernels of specialized/quantize_mxfp8.cuh,
    which scale with fma.rn.f32x2(x, s, +0): an input -0.0 becomes +0; nonzero products
    round as with a plain multiply (underflow keeps the sign)."""
    return rule == "te" and not two_d and in_dtype in ("bf16", "f16") and -(-m // 32) <= 65535


def quantize(x32, m, k, elem, rule, two_d, layout, in_dtype):
    fast = te_fast_kernel(rule, two_d, in_dtype, m)
    if two_d:
        tiles = x32.reshape(m // 32, 32, k // 32, 32).transpose(0, 2, 1, 3).reshape(m // 32, k // 32, 1024)
        t = codes(tiles, rule, elem)
        row_codes = np.repeat(t, 32, axis=0)  # [M, K/32]
        col_codes = np.repeat(t, 32, axis=1)  # [M/32, K]
    else:
        row_codes = codes(x32.reshape(m, k // 32, 32), rule, elem)
        col_codes = codes(x32.reshape(m // 32, 32, k).transpose(0, 2, 1), rule, elem)
    with np.errstate(all="ignore"):
        row_prod = (x32 * np.repeat(multiplier(row_codes), 32, axis=1)).astype(np.float32)
        col_prod = (x32 * np.repeat(multiplier(col_codes), 32, axis=0)).astype(np.float32)
        if fast:
            # fma(x, s, +0): an exact zero product (x = -0.0) is +0; a nonzero product is
            # rounded once and keeps its sign even when it underflows.
            row_prod = np.where(x32 == 0, np.float32(0.0), row_prod).astype(np.float32)
            col_prod = np.where(x32 == 0, np.float32(0.0), col_prod).astype(np.float32)
        row_data = to_fp8(row_prod, elem)
        col_data = to_fp8(col_prod, elem)
    rs = np.zeros((roundup(m, 128), roundup(k // 32, 4)), np.uint8)
    rs[:m, : k // 32] = row_codes
    cs = np.zeros((roundup(m // 32, 4), roundup(k, 128)), np.uint8)
    cs[: m // 32, :k] = col_codes
    if layout == "swizzled":
        rs = swizzle_rowwise(rs)
        cs = swizzle_columnwise(cs)
    if two_d:
        assert (row_data == col_data).all()
    return dict(
        rowwise_data=row_data,
        rowwise_scale_inv=rs,
        columnwise_data=col_data,
        columnwise_scale_inv=cs,
    ), (row_codes, col_codes)


def dequantize(data, logical_codes, direction, elem):
    vals = data.view(ELEMS[elem]["dt"]).astype(np.float32)
    s = descale(logical_codes)
    s = np.repeat(s, 32, axis=1) if direction == "rowwise" else np.repeat(s, 32, axis=0)
    with np.errstate(all="ignore"):
        return (s * vals).astype(np.float32)


# ---------------------------------------------------------------- inputs


def in_dtype_round(v, in_dtype):
    v = np.asarray(v, np.float32)
    return v.astype(ml_dtypes.bfloat16).astype(np.float32) if in_dtype == "bf16" else v


def next_up(v, in_dtype):
    """The next representable value above v in the input dtype."""
    if in_dtype == "bf16":
        b = np.asarray(v, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
        return (b + 1).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    return np.nextafter(np.float32(v), np.float32(np.inf))


def fp8_midpoints(rng, elem, n):
    """n values exactly halfway between adjacent finite FP8 codes (ties for RNE)."""
    dt = ELEMS[elem]["dt"]
    top = 0x7E if elem == "e4m3" else 0x7B
    c = rng.integers(0, top, size=n).astype(np.uint8)
    lo = c.view(dt).astype(np.float32)
    hi = (c + 1).astype(np.uint8).view(dt).astype(np.float32)
    mid = (lo + hi) / np.float32(2)
    return np.where(rng.random(n) < 0.5, -mid, mid).astype(np.float32)


def make_input(seed, m, k, elem, in_dtype):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    # Magnitudes vary per 32x32 tile and per row, so scales differ in both directions.
    tile_exp = rng.integers(-20, 21, size=(m // 32, k // 32))
    row_exp = rng.integers(-3, 4, size=(m, 1))
    exps = np.repeat(np.repeat(tile_exp, 32, 0), 32, 1) + row_exp
    x = (x * np.ldexp(np.float32(1), exps)).astype(np.float32)
    mx = np.float32(ELEMS[elem]["max"])
    big = np.float32(3.3895314e38) if in_dtype == "bf16" else np.finfo(np.float32).max
    ntiles = (m // 32) * (k // 32)

    def tile(idx):
        t = idx % ntiles
        return (t // (k // 32)) * 32, (t % (k // 32)) * 32

    def row_block(idx):
        r0, c0 = tile(idx)
        return r0 + (5 * idx) % 32, c0

    def col_block(idx):
        r0, c0 = tile(idx + 3)
        return r0, c0 + (11 * idx + 7) % 32

    s = lambda: int(rng.integers(-6, 7))  # noqa: E731
    row_specials = [
        # all-zero 1x32 block
        lambda: np.zeros(32, np.float32),
        # block max exactly max * 2^s: the TE code is 127 + s, no round-up
        lambda: (lambda e: np.concatenate([[mx * e, -mx * e], rng.uniform(-1, 1, 30) * mx * e]))(np.ldexp(1.0, s())),
        # block max just above max * 2^s: TE rounds the scale up
        lambda: (lambda e: np.concatenate([[next_up(mx * e, in_dtype)], rng.uniform(-1, 1, 31) * mx * e]))(np.ldexp(1.0, s())),
        # amax 460/448 * max: TE scale 2, OCP scale 1 and clipping
        lambda: np.concatenate([[mx * np.float32(460.0 / 448.0), -mx * np.float32(470.0 / 448.0)], rng.uniform(-1, 1, 30) * mx]),
        # rounding ties at scale 1 (block max = max keeps the multiplier 1 under both rules)
        lambda: np.concatenate([[mx], fp8_midpoints(rng, elem, 31)]),
        # rounding ties at scale 2^s
        lambda: (lambda e: np.concatenate([[-mx * e], fp8_midpoints(rng, elem, 31) * e]))(np.ldexp(1.0, s())),
        # NaN among normal values
        lambda: np.concatenate([[np.nan], rng.standard_normal(31) * 3]),
        # +inf and -inf
        lambda: np.concatenate([[np.inf], rng.standard_normal(31)]),
        lambda: np.concatenate([rng.standard_normal(31), [-np.inf]]),
        # all NaN
        lambda: np.full(32, np.nan, np.float32),
        # signed zeros and tiny values that flush to zero
        lambda: np.concatenate([[-0.0, 0.0, -0.0], rng.standard_normal(29) * np.float32(2.0**-30) * np.float32(1e-8)]),
        # f32 / bf16 subnormals: amax subnormal, scale code 0
        lambda: rng.uniform(-1, 1, 32) * np.float32(1e-39),
        # tiny normals around the scale-underflow boundary (amax * 1/max ~ 2^-127)
        lambda: rng.uniform(-1, 1, 32) * np.ldexp(np.float32(1), int(rng.integers(-124, -115))),
        # huge values near the input dtype's max
        lambda: np.concatenate([[big, -big], rng.uniform(-1, 1, 30) * big]),
        # huge max with tiny and zero neighbours: products underflow to -0 / +0, and -0.0
        lambda: np.concatenate([[big / 4, np.float32(-1e-30), np.float32(-0.0), np.float32(1e-30)], rng.standard_normal(28)]),
        # a block whose max is a power of two (OCP boundary)
        lambda: np.concatenate([[np.ldexp(np.float32(1), 8 + s())], rng.uniform(-1, 1, 31) * 100]),
    ]
    for idx, f in enumerate(row_specials):
        r, c0 = row_block(idx)
        x[r, c0 : c0 + 32] = np.asarray(f(), np.float32)
    col_specials = [
        lambda: np.zeros(32, np.float32),
        lambda: np.concatenate([[np.nan], rng.standard_normal(31)]),
        lambda: np.concatenate([rng.standard_normal(31), [np.inf]]),
        lambda: (lambda e: np.concatenate([[next_up(mx * e, in_dtype)], rng.uniform(-1, 1, 31) * mx * e]))(np.ldexp(1.0, s())),
        lambda: np.concatenate([[mx], fp8_midpoints(rng, elem, 31)]),
        lambda: rng.uniform(-1, 1, 32) * np.float32(1e-39),
    ]
    for idx, f in enumerate(col_specials):
        r0, c = col_block(idx)
        x[r0 : r0 + 32, c] = np.asarray(f(), np.float32)
    if ntiles >= 4:
        r0, c0 = tile(ntiles - 1)
        x[r0 : r0 + 32, c0 : c0 + 32] = 0.0  # an all-zero tile (all-zero blocks in both directions)
        r0, c0 = tile(ntiles - 2)
        x[r0 : r0 + 32, c0 : c0 + 32] = rng.uniform(-1, 1, (32, 32)) * np.float32(3e-39)  # subnormal tile
    return in_dtype_round(x, in_dtype)


def ties_input(in_dtype, elem):
    """A [32, 64] matrix of nothing but controlled values: every block max is `max`, the
    rest are FP8 midpoints, exact powers of two, or signed zeros."""
    rng = np.random.default_rng(7)
    mx = np.float32(ELEMS[elem]["max"])
    x = fp8_midpoints(rng, elem, 32 * 64).reshape(32, 64)
    x[:, ::32] = mx
    x[0, :] = -mx
    x[5, 7:12] = [0.0, -0.0, 1.0, -2.0, 0.5]
    return in_dtype_round(x, in_dtype)


# ---------------------------------------------------------------- cases

# (shape, input dtype, element, rule, 2d, layout, store dequantized outputs)
CASES = [
    ((32, 32), "f32", "e4m3", "te", False, "compact", True),
    ((96, 64), "f32", "e4m3", "te", False, "compact", True),
    ((160, 160), "bf16", "e4m3", "te", False, "compact", False),
    ((288, 64), "f32", "e4m3", "te", False, "swizzled", False),
    ((64, 288), "bf16", "e4m3", "te", False, "swizzled", False),
    ((160, 64), "f32", "e5m2", "te", False, "compact", True),
    ((96, 160), "bf16", "e5m2", "te", False, "swizzled", False),
    ((288, 32), "f32", "e4m3", "ocp", False, "compact", False),
    ((160, 96), "bf16", "e4m3", "ocp", False, "swizzled", False),
    ((96, 64), "f32", "e5m2", "ocp", False, "compact", False),
    ((96, 160), "f32", "e4m3", "te", True, "compact", False),
    ((288, 64), "bf16", "e4m3", "te", True, "swizzled", False),
    ((32, 288), "f32", "e5m2", "te", True, "compact", False),
    ((160, 64), "f32", "e4m3", "ocp", True, "swizzled", True),
    ((2, 48, 64), "f32", "e4m3", "te", False, "compact", False),
    ((32, 64), "f32", "e4m3", "te", False, "compact", True),  # ties
    ((32, 64), "bf16", "e5m2", "ocp", False, "swizzled", True),  # ties
]


def spec_of(elem, rule, two_d, layout):
    opts = []
    if elem == "e5m2":
        opts.append("e5m2")
    if two_d:
        opts.append("2d")
    if rule == "ocp":
        opts.append("ocp")
    if layout == "swizzled":
        opts.append("swizzled")
    return "mxfp8" + (":" + ",".join(opts) if opts else "")


def main():
    tensors = {}
    meta = []
    for i, (shape, in_dtype, elem, rule, two_d, layout, deq) in enumerate(CASES):
        m = int(np.prod(shape[:-1]))
        k = shape[-1]
        name = f"case{i}"
        if i >= len(CASES) - 2:
            x = ties_input(in_dtype, elem)
            kind = "ties"
        else:
            x = make_input(1000 + i, m, k, elem, in_dtype)
            kind = "random+specials"
        bufs, (row_codes, col_codes) = quantize(x, m, k, elem, rule, two_d, layout, in_dtype)
        if in_dtype == "bf16":
            tensors[f"{name}.input"] = x.astype(ml_dtypes.bfloat16).view(np.uint16).reshape(shape)
        else:
            tensors[f"{name}.input"] = x.reshape(shape)
        for b, v in bufs.items():
            tensors[f"{name}.{b}"] = np.ascontiguousarray(v.reshape(shape) if b.endswith("_data") else v)
        if deq:
            for direction, data, lc in (("rowwise", bufs["rowwise_data"], row_codes), ("columnwise", bufs["columnwise_data"], col_codes)):
                out = dequantize(data, lc, direction, elem)
                tensors[f"{name}.dequant_{direction}_f32"] = out.reshape(shape)
                if direction == "rowwise":
                    tensors[f"{name}.dequant_{direction}_bf16"] = out.astype(ml_dtypes.bfloat16).view(np.uint16).reshape(shape)
        meta.append(
            dict(
                name=name,
                shape=list(shape),
                dtype=in_dtype,
                elem=elem,
                rule=rule,
                two_d=two_d,
                layout=layout,
                spec=spec_of(elem, rule, two_d, layout),
                kind=kind,
                dequant=deq,
                nan_inputs=int(np.isnan(x).sum()),
                inf_inputs=int(np.isinf(x).sum()),
                scale_codes_rowwise=sorted({int(c) for c in np.unique(row_codes)}),
            )
        )
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file(
        tensors,
        OUT,
        metadata={
            "cases": json.dumps(meta),
            "generator": "tests/golden/mxfp8.py (numpy " + np.__version__ + ", ml_dtypes " + ml_dtypes.__version__ + ")",
            "input_encoding": "f32 inputs as F32; bf16 inputs and *_bf16 outputs as U16 bit patterns",
        },
    )
    print(f"wrote {len(CASES)} cases, {len(tensors)} tensors, {os.path.getsize(OUT)} bytes to {OUT}")


if __name__ == "__main__":
    main()
