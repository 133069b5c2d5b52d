#!/usr/bin/env python3
"""Golden data for NVFP4, from an independent numpy + ml_dtypes model of TransformerEngine.

The structure follows TE's Python oracle
(`transformer_engine/pytorch/custom_recipes/reference_nvfp4.py::NVFP4QuantizerRef`):
flatten to 2-D, quantize `x` rowwise and `x.T` (optionally Hadamard-rotated) columnwise
with `_quantize_blockwise_reference`, vectorised over blocks. Where that oracle and the
CUDA kernels disagree, this script follows the kernels:

* amaxes ignore NaN (CUDA fmaxf / __hmax / max.xorsign.abs); the oracle's torch.max
  propagates it;
* NaN elements encode to code 7 (+6) and -0.0 to code 8 (NVIDIA's host emulation of
  cvt.rn.satfinite.e2m1x2.f32); the oracle's threshold table gives 0 for both;
* the 4over6 2-D error reduction, the RHT (fp32 accumulation in index order from +0,
  rounded to bf16) and all scale arithmetic use the kernels' fp32 operation order.

All arithmetic is numpy float32 (IEEE round-to-nearest-even, no FMA); E4M3 and E2M1
rounding come from ml_dtypes. Writes `data/nvfp4.safetensors`: tensors `caseN.input`,
`caseN.<buffer>` (TE buffer layout, padding zero), `caseN.dequant_rowwise` and
`caseN.dequant_columnwise` (f32, logical layout), and metadata `cases` (JSON list with
the spec, usage, dtype and shape of each case).

Run: python3 tests/golden/nvfp4.py   (deterministic; numpy, ml_dtypes, safetensors)
"""

import json
import os

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

F32 = np.float32
F64 = np.float64
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E2M1 = ml_dtypes.float4_e2m1fn
FLT_MAX = F32(np.finfo(np.float32).max)
BLOCK = 16

# TE pytorch/tensor/nvfp4_tensor.py::get_wgrad_sign_vector
WGRAD_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], dtype=F32)


# ----------------------------------------------------------------------------- codecs

def e4m3_bits(v):
    """float32 -> E4M3 code, RNE with saturation (values here are >= 0 or NaN)."""
    v = np.asarray(v, dtype=F32)
    v = np.where(v > F32(448.0), F32(448.0), v)
    return v.astype(E4M3).view(np.uint8)


def e4m3_value(bits):
    return np.asarray(bits, dtype=np.uint8).view(E4M3).astype(F32)


def e2m1_codes(v):
    """float32 -> 4-bit code: RNE on the grid, saturating, -0 -> 8, NaN -> 7."""
    v = np.asarray(v, dtype=F32)
    with np.errstate(invalid="ignore"):
        clipped = np.clip(v, F32(-6.0), F32(6.0))
    codes = clipped.astype(E2M1).view(np.uint8) & 0xF
    return np.where(np.isnan(v), np.uint8(7), codes).astype(np.uint8)


E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=F32,
)


def pack(codes):
    """[rows, cols] codes -> [rows, cols/2] bytes, element 2i in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def unpack(packed):
    lo = packed & 0xF
    hi = packed >> 4
    out = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = lo
    out[:, 1::2] = hi
    return out


def self_check_codecs():
    # The e2m1 conversion against the oracle's threshold table on finite, nonzero values.
    rng = np.random.default_rng(1)
    v = np.concatenate([
        rng.uniform(-8, 8, 20000).astype(F32),
        np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=F32),
        -np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=F32),
    ])
    v = v[v != 0]
    a = np.abs(v)
    mag = np.select(
        [a <= 0.25, a < 0.75, a <= 1.25, a < 1.75, a <= 2.5, a < 3.5, a <= 5.0],
        [0, 1, 2, 3, 4, 5, 6], 7).astype(np.uint8)
    want = mag | np.where(v < 0, 8, 0).astype(np.uint8)
    assert np.array_equal(e2m1_codes(v), want)
    assert e2m1_codes(np.array([np.nan, -0.0, np.inf, -np.inf], dtype=F32)).tolist() == [7, 8, 7, 15]
    assert e4m3_bits(np.array([448, 464, 1e30, 2.0 ** -10, 3 * 2.0 ** -10], dtype=F32)).tolist() == [
        0x7E, 0x7E, 0x7E, 0x00, 0x02]


# ----------------------------------------------------------------------------- amax

def abs_ignoring_nan(x):
    a = np.abs(x.astype(F32))
    return np.where(np.isnan(a), F32(0.0), a)


def amax(x):
    return F32(abs_ignoring_nan(x).max()) if x.size else F32(0.0)


def global_encode_scale(a, e4m3_max):
    """TE compute_global_encode_scaling_factor_FP4; `a` scalar or array."""
    a = np.asarray(a, dtype=F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = F32(e4m3_max * 6) / a
    s = np.fmin(s, FLT_MAX)  # fmin drops NaN like fminf
    return np.where((a == F32(0.0)) | (s == F32(0.0)), F32(1.0), s).astype(F32)


# ----------------------------------------------------------------------------- RHT

def rht_matrix():
    h = np.ones((1, 1), dtype=F32)
    while h.shape[0] < BLOCK:
        h = np.block([[h, h], [h, -h]])
    return (WGRAD_SIGNS[:, None] * h * F32(0.25)).astype(F32)


def rht_of_transpose(x_bf16):
    """bf16(RHT(x^T)): rows of x^T in chunks of 16, fp32 accumulation from +0 in index order."""
    m, k = x_bf16.shape
    r = rht_matrix()
    xt = x_bf16.astype(F32).T.reshape(k, m // BLOCK, BLOCK)
    acc = np.zeros_like(xt)
    for i in range(BLOCK):
        acc = acc + xt[:, :, i:i + 1] * r[i]
    return acc.reshape(k, m).astype(BF16)


def inverse_rht_rows(y):
    """[rows, n] f32 chunks of 16 -> R^T applied, f64 sums in index order, rounded to f32."""
    rows, n = y.shape
    r = rht_matrix().astype(F64)
    yb = y.astype(F64).reshape(rows, n // BLOCK, BLOCK)
    acc = np.zeros_like(yb)
    for j in range(BLOCK):
        acc = acc + yb[:, :, j:j + 1] * r[:, j]
    return acc.reshape(rows, n).astype(F32)


# ----------------------------------------------------------------------------- quantize

def tree_sum_16_rows(err):
    """[rows, nb] -> [rows/16, nb]: the CUDA warp tree (8+8, 4+4, 2+2, 1+1)."""
    rows, nb = err.shape
    e = err.reshape(rows // BLOCK, BLOCK, nb)
    e = e[:, 0:8] + e[:, 8:16]
    e = e[:, 0:4] + e[:, 4:8]
    e = e[:, 0:2] + e[:, 2:4]
    return e[:, 0] + e[:, 1]


def quantize_blockwise(x, global_amax, two_d, four_over_six=None, e4m3_max=448):
    """x: [rows, cols] float32. global_amax: scalar or [rows]. Returns (codes, scales)."""
    rows, cols = x.shape
    nb = cols // BLOCK
    xb = x.reshape(rows, nb, BLOCK)
    if two_d:
        tiles = abs_ignoring_nan(x).reshape(rows // BLOCK, BLOCK, nb, BLOCK).max(axis=(1, 3))
        vec_max = np.repeat(tiles, BLOCK, axis=0)[:, :, None]
    else:
        vec_max = abs_ignoring_nan(xb).max(axis=-1, keepdims=True)
    ga = np.asarray(global_amax, dtype=F32)
    if ga.ndim == 1:
        ga = ga.reshape(rows, 1, 1)
    s_enc = global_encode_scale(ga, e4m3_max)
    s_dec = (F32(1.0) / s_enc).astype(F32)

    def enc_for(sdb):
        with np.errstate(divide="ignore"):
            return np.fmin(F32(1.0) / (e4m3_value(sdb) * s_dec), FLT_MAX).astype(F32)

    if four_over_six is None:
        mult = (s_enc * (F32(1.0) / F32(6.0))).astype(F32)
        with np.errstate(over="ignore", invalid="ignore"):
            sdb = e4m3_bits(np.fmin(vec_max * mult, FLT_MAX))
            codes = e2m1_codes(xb * enc_for(sdb))
        return codes.reshape(rows, cols), sdb.reshape(rows, nb)

    # 4over6 (quantize_4over6_nvfp4.cuh)
    denom = F32(6 * e4m3_max)
    with np.errstate(over="ignore", invalid="ignore"):
        base = (vec_max / F32(6.0)) * s_enc
        cands = []
        for sf in (base * F32(1.5), base):  # map4, map6
            sdb = e4m3_bits(np.fmin(sf, F32(448.0)))
            codes = e2m1_codes(xb * enc_for(sdb))
            deq = E2M1_VALUES[codes]
            sdb_f = e4m3_value(sdb)
            err = np.zeros((rows, nb), dtype=F32)
            for i in range(BLOCK):
                val = ((deq[:, :, i] * sdb_f[:, :, 0]) * ga.reshape(-1, 1)) / denom
                d = val - xb[:, :, i]
                err = err + (np.abs(d) if four_over_six == "mae" else d * d)
            cands.append((codes, sdb, err))
    (c4, s4, e4), (c6, s6, e6) = cands
    if two_d:
        pick4 = np.repeat(tree_sum_16_rows(e4) < tree_sum_16_rows(e6), BLOCK, axis=0)
    else:
        pick4 = e4 < e6
    codes = np.where(pick4[:, :, None], c4, c6)
    sdb = np.where(pick4[:, :, None], s4, s6)
    return codes.reshape(rows, cols), sdb.reshape(rows, nb)


def pad_scales(s, rows, cols_blocks):
    r = -(-rows // 128) * 128
    c = -(-cols_blocks // 4) * 4
    out = np.zeros((r, c), dtype=np.uint8)
    out[: s.shape[0], : s.shape[1]] = s
    return out


def swizzle(s):
    r, c = s.shape
    return s.reshape(r // 128, 4, 32, c // 4, 4).transpose(0, 3, 2, 1, 4).reshape(r, c).copy()


def dequantize(codes_packed, scales_compact, amax_vec, rows, cols, e4m3_max):
    codes = unpack(codes_packed)
    sdb = scales_compact[:rows, : cols // BLOCK]
    a = np.asarray(amax_vec, dtype=F32)
    a = a.reshape(-1, 1) if a.size > 1 else a.reshape(1, 1)
    with np.errstate(invalid="ignore"):  # 0 * inf for a zero scale under an infinite amax
        final = ((e4m3_value(sdb) * a) * (F32(1.0) / F32(6 * e4m3_max))).astype(F32)
        vals = E2M1_VALUES[codes].reshape(rows, cols // BLOCK, BLOCK)
        return (vals * final[:, :, None]).reshape(rows, cols).astype(F32)


def reference(x, opts, usage):
    """x: 2-D array (f32/bf16/f16). Returns dict of buffers (and dequantized outputs)."""
    m, k = x.shape
    xf = x.astype(F32)
    two_d = "2d" in opts
    rht = "rht" in opts
    row_scaled = "row-scaled" in opts
    fos = None
    for o in opts:
        if o in ("4over6", "4over6=mae"):
            fos = "mae"
        elif o == "4over6=mse":
            fos = "mse"
    e4m3_max = 256 if "e4m3max=256" in opts else 448
    swz = "swizzled" in opts
    out = {}
    tensor_amax = amax(xf)
    if "rowwise" in usage:
        ga = abs_ignoring_nan(xf).max(axis=1) if row_scaled else tensor_amax
        codes, sdb = quantize_blockwise(xf, ga, two_d, fos, e4m3_max)
        compact = pad_scales(sdb, m, k // BLOCK)
        out["rowwise_data"] = pack(codes)
        out["rowwise_scale_inv"] = swizzle(compact) if swz else compact
        out["amax_rowwise"] = np.atleast_1d(np.asarray(ga, dtype=F32))
        out["dequant_rowwise"] = dequantize(out["rowwise_data"], compact, out["amax_rowwise"],
                                            m, k, e4m3_max)
    if "columnwise" in usage:
        if rht:
            op = rht_of_transpose(x).astype(F32)
        else:
            op = xf.T.copy()
        ga = abs_ignoring_nan(op).max(axis=1) if row_scaled else amax(op)
        codes, sdb = quantize_blockwise(op, ga, two_d, fos, e4m3_max)
        compact = pad_scales(sdb, k, m // BLOCK)
        out["columnwise_data"] = pack(codes)
        out["columnwise_scale_inv"] = swizzle(compact) if swz else compact
        out["amax_columnwise"] = np.atleast_1d(np.asarray(ga, dtype=F32))
        deq_t = dequantize(out["columnwise_data"], compact, out["amax_columnwise"], k, m, e4m3_max)
        if rht:
            deq_t = inverse_rht_rows(deq_t)
        out["dequant_columnwise"] = deq_t.T.copy()
    return out


# ----------------------------------------------------------------------------- inputs

def randn(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(F32)


def with_specials(x, rng):
    """Zeros, an all-zero block, a block that underflows its E4M3 scale, subnormals."""
    x = x.copy()
    m, k = x.shape
    x[0, 0:BLOCK] = 0.0                          # all-zero block
    x[1, 0] = -0.0
    x[1, 1] = 0.0
    x[2, 0:BLOCK] = randn(rng, BLOCK) * F32(1e-7)  # scale underflows -> sdb 0, elements saturate
    x[3, 0:BLOCK] = F32(1e-40)                   # fp32 subnormals
    x[3, 1] = F32(-1e-41)
    x[4, 0:BLOCK] = x[4, 0:BLOCK] * F32(30.0)    # a loud block
    if k >= 2 * BLOCK:
        x[5, BLOCK:2 * BLOCK] = F32(-1.0)        # constant block: all at -max after scaling
    return x


def map4_friendly(x, rng, tiles=((0, 1), (1, 0))):
    """Tiles whose values sit at 0.72..0.9 of the tile amax: the map-to-4 scale (amax -> 4,
    0.8 amax -> 3) fits them better than map-to-6, so 4over6 (1-D and 2-D) picks it."""
    x = x.copy()
    for tr, tc in tiles:
        r0, c0 = tr * BLOCK, tc * BLOCK
        if r0 + BLOCK > x.shape[0] or c0 + BLOCK > x.shape[1]:
            continue
        v = rng.uniform(0.72, 0.9, (BLOCK, BLOCK)) * np.where(rng.random((BLOCK, BLOCK)) < 0.5, -1, 1)
        v[:, 0] = 1.0
        x[r0:r0 + BLOCK, c0:c0 + BLOCK] = (v * 2.0).astype(F32)
    return x


def paren_sensitive_input(rng, tensor_amax=1000.0):
    """Rows whose block amax `a` makes `a * (S_enc * f32(1/6))` (the 1-D/2-D kernels),
    `(a * S_enc) / 6` and `(a / 6) * S_enc` (the 4over6 kernel) round to different E4M3
    scales: f32 values next to 6 * (E4M3 midpoint) / S_enc. Proves the operation order."""
    s_enc = global_encode_scale(F32(tensor_amax), 448)
    vals = np.arange(0, 127, dtype=np.uint8).view(E4M3).astype(F64)
    mids = (vals[:-1] + vals[1:]) / 2
    cand = (mids * 6 / F64(s_enc)).astype(F32)
    for _ in range(3):
        cand = np.concatenate([cand, np.nextafter(cand, F32(np.inf)), np.nextafter(cand, F32(0))])
    cand = np.unique(cand[(cand > 0) & (cand < F32(tensor_amax))])
    order_a = e4m3_bits(np.fmin(cand * (s_enc * (F32(1.0) / F32(6.0))), FLT_MAX))
    order_b = e4m3_bits((cand * s_enc) / F32(6.0))
    order_c = e4m3_bits((cand / F32(6.0)) * s_enc)
    pick = cand[(order_a != order_b) | (order_a != order_c)]
    rows = -(-(len(pick) + 1) // BLOCK) * BLOCK
    x = (rng.uniform(-1, 1, (rows, BLOCK)) * 0.5).astype(F32)
    x[0, 0] = tensor_amax
    for i, a in enumerate(pick):
        x[i + 1] = x[i + 1] * a
        x[i + 1, i % BLOCK] = -a if i % 3 == 0 else a
    return x


def ties_input():
    """One element 2688 makes S_enc = 1; a block with amax 6 gets sdb = 1 and enc = 1, so
    its elements are quantized as written: the E2M1 ties, ±max, just-off-tie values."""
    x = np.zeros((16, 32), dtype=F32)
    x[0, 16:32] = 2688.0                         # block scale 448 (0x7E), elements -> 6
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    row = [6.0] + ties + [-t for t in ties] + [-6.0]
    x[1, 0:16] = row
    up = [np.nextafter(F32(t), F32(10)) for t in ties]
    down = [np.nextafter(F32(t), F32(-10)) for t in ties]
    x[2, 0:16] = [6.0] + up + [-6.0] + [-t for t in up[:7]]
    x[3, 0:16] = [6.0] + down + [-6.0] + [-t for t in down[:7]]
    x[4, 0:16] = [6.0, 7.0, 100.0, -7.0, 5.5, 6.5, 0.1, -0.1] + [0.0] * 8
    x[5, 0:16] = [6.0, np.nan, np.inf * 0, -0.0, 0.0, 3.0, -3.0, 4.0] + [1.0] * 8
    # Exact under both 4over6 candidates (sdb 1 and 1.5): equal errors, map-to-6 kept.
    x[6, 0:16] = [6.0, 3.0, 1.5, 0.0, -6.0, -3.0, -1.5, 0.0] * 2
    return x


def make_cases():
    rng = np.random.default_rng(20260822)
    cases = []

    def add(name, x, spec_opts, usage="both", dtype="f32", shape=None):
        if dtype == "bf16":
            x = x.astype(BF16)
        elif dtype == "f16":
            x = x.astype(np.float16)
        shape = list(shape or x.shape)
        cases.append(dict(name=name, x=x, opts=spec_opts, usage=usage, dtype=dtype, shape=shape))

    base144 = with_specials(randn(rng, (144, 32)), rng)
    add("1d f32 ragged M=144", base144, [])
    add("1d bf16 M=272", with_specials(randn(rng, (272, 32), 3.0), rng), [], dtype="bf16")
    add("1d ties and max", ties_input(), [])
    add("4over6 ties and max", ties_input(), ["4over6"])
    x = with_specials(randn(rng, (48, 32)), rng)
    x[7, 3] = np.nan
    x[9, 20] = np.inf
    x[10, 5] = -np.inf
    add("1d bf16 nan/inf (amax inf -> S_enc 1)", x, [], dtype="bf16")
    x = with_specials(randn(rng, (48, 32), 2.0), rng)
    x[6, 6] = np.nan
    add("1d f32 nan ignored by amax", x, [])
    add("2d f32 M=144", with_specials(randn(rng, (144, 32)), rng), ["2d"])
    add("2d bf16 M=48 K=80", with_specials(randn(rng, (48, 80), 0.01), rng), ["2d"], dtype="bf16")
    add("rht bf16 M=144", with_specials(randn(rng, (144, 32)), rng), ["rht"], dtype="bf16")
    add("rht bf16 M=16", randn(rng, (16, 32), 5.0), ["rht"], dtype="bf16")
    rows = randn(rng, (48, 64)) * np.exp(rng.uniform(-8, 8, (48, 1))).astype(F32)
    add("row-scaled f32", with_specials(rows.astype(F32), rng), ["row-scaled"])
    add("row-scaled bf16 rowwise M=272", randn(rng, (272, 32)), ["row-scaled"], usage="rowwise",
        dtype="bf16")
    x = with_specials(randn(rng, (144, 32)), rng)
    x[20, 3] = np.nan
    add("4over6 mae f32 M=144", x, ["4over6"])
    x = with_specials(randn(rng, (48, 64)), rng)
    x[11, 11] = np.inf
    add("4over6 mse bf16 (inf amax)", x, ["4over6=mse"], dtype="bf16")
    add("4over6 mse bf16", with_specials(randn(rng, (48, 64)), rng), ["4over6=mse"], dtype="bf16")
    add("4over6 2d mae f32", map4_friendly(with_specials(randn(rng, (48, 64)), rng), rng), ["2d", "4over6"])
    add("4over6 2d mse bf16 M=144", map4_friendly(with_specials(randn(rng, (144, 32)), rng), rng),
        ["2d", "4over6=mse"],
        dtype="bf16")
    add("4over6 e4m3max=256 f32", with_specials(randn(rng, (48, 32)), rng), ["4over6", "e4m3max=256"])
    add("4over6 2d e4m3max=256 bf16", map4_friendly(randn(rng, (48, 48), 7.0), rng),
        ["2d", "4over6=mse", "e4m3max=256"],
        dtype="bf16")
    add("4over6 row-scaled f32 rowwise", with_specials(rows[:, :32].copy(), rng), ["row-scaled", "4over6"],
        usage="rowwise")
    add("swizzled 1d f32 M=48 K=80", with_specials(randn(rng, (48, 80)), rng), ["swizzled"])
    add("swizzled 2d bf16 M=272", with_specials(randn(rng, (272, 32)), rng), ["2d", "swizzled"],
        dtype="bf16")
    add("swizzled rht bf16", with_specials(randn(rng, (48, 32)), rng), ["rht", "swizzled"], dtype="bf16")
    add("all zero", np.zeros((16, 32), dtype=F32), [])
    paren = paren_sensitive_input(rng)
    add("operation order of the block scale", paren, [])
    add("operation order of the 4over6 base", paren, ["4over6"])
    add("3-d f32 [2, 24, 32]", with_specials(randn(rng, (48, 32)), rng), [], shape=[2, 24, 32])
    add("1d f16", with_specials(randn(rng, (48, 32), 100.0), rng), [], dtype="f16")
    add("1d f32 columnwise only", with_specials(randn(rng, (48, 32)), rng), [], usage="columnwise")
    x = randn(rng, (48, 32), 1e-3)
    x[0, 0] = 1e4
    add("underflowing block scales", x, [])
    return cases


def main():
    self_check_codecs()
    tensors = {}
    meta = []
    for i, c in enumerate(make_cases()):
        usage = {"both": ("rowwise", "columnwise"), "rowwise": ("rowwise",),
                 "columnwise": ("columnwise",)}[c["usage"]]
        x2d = c["x"]
        bufs = reference(x2d, c["opts"], usage)
        shape = c["shape"]
        tensors[f"case{i}.input"] = np.ascontiguousarray(x2d.reshape(shape))
        for name, v in bufs.items():
            if name == "rowwise_data":
                v = v.reshape(shape[:-1] + [shape[-1] // 2])
            tensors[f"case{i}.{name}"] = np.ascontiguousarray(v)
        spec = "nvfp4" + (":" + ",".join(c["opts"]) if c["opts"] else "")
        meta.append(dict(case=i, name=c["name"], spec=spec, usage=c["usage"], dtype=c["dtype"],
                         shape=shape))
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(os.path.join(here, "data"), exist_ok=True)
    path = os.path.join(here, "data", "nvfp4.safetensors")
    save_file(tensors, path, metadata={"cases": json.dumps(meta), "generator": "tests/golden/nvfp4.py"})
    print(f"wrote {len(meta)} cases to {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
