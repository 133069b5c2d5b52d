#!/usr/bin/env python3
"""Golden data for the int4 tensor-core tiled (tinygemm) format.

An independent numpy + ml_dtypes model of what PyTorch/torchao compute, written from the
upstream sources (not from the Rust code):

* qparams and quantization: torchao `quant_primitives.py` `_choose_qparams_affine_tinygemm`
  and `_quantize_affine_tinygemm`, evaluated with PyTorch *eager* dtype semantics on CUDA:
  - bf16 input (`Int4TilePackedTo4dTensor.from_hp`, torchao v2): every elementwise op
    computes in float32 and rounds its result to bf16;
  - f32 input (`get_groupwise_affine_qparams(w, dtype=bf16)` then
    `groupwise_affine_quantize_tensor_from_qparams`): scale/zero in f32, zero from the
    unrounded scale, both cast to bf16; `zero - scale * 8` runs on two bf16 tensors
    (result bf16); `(x - min_val) / scale` runs in f32;
  - `x / 15.0` by a CPU scalar is `x * (1.0f / 15.0f)` on CUDA (BinaryDivTrueKernel.cu);
  - `torch.round` is round-half-even; NaN survives clamp and becomes 0 in the CUDA int cast;
  - f16 input is widened to f32 (the quantfmt convention; torchao v2 refuses f16).
* zero padding before the qparams: n to a multiple of 8, k to inner_k_tiles*16
  (pad=kernel) or 1024 (pad=torchao, torchao's `find_multiple(k, 1024)`).
* packing: a literal port of the CUDA kernel `matrix_to_m16n8k16_Bint4_layout`
  (pytorch `aten/src/ATen/native/cuda/int4mm.cu`) applied to the torch >= 2.5 input
  `(q[:, ::2] << 4 | q[:, 1::2]).to(uint8)`.
* scale_and_zero: `pack_tinygemm_scales_and_zeros` = stack([scale, zero], -1).transpose(0, 1).
* dequant: `fma.rn.bf16x2((u - 8), scale, zero)`, i.e. the exact value rounded once;
  computed here with exact rational arithmetic (fractions.Fraction), for bf16 and f32 outputs.

Output: tests/golden/data/int4tiled.safetensors with, per case N,
  caseN.input            f32 / f16 values, or bf16 stored as U16 bit patterns
  caseN.u                u8 logical nibbles [E,] n, k
  caseN.packed_weight    i32, the tiled layout
  caseN.scale_and_zero   bf16 as U16 bits, [E,] k_padded/g, n_padded, 2
  caseN.dequant_bf16     bf16 as U16 bits, logical shape
  caseN.dequant_f32      f32, logical shape
and JSON metadata `cases` describing each case (spec string, shape, input dtype, note).
"""

import json
import math
import os
from fractions import Fraction

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

BF16 = ml_dtypes.bfloat16
RCP15 = np.float32(1.0) / np.float32(15.0)
EPS_V2 = float(np.finfo(np.float32).tiny)  # torch.finfo(torch.bfloat16).smallest_normal = 2^-126
EPS_V1 = 1e-6  # get_groupwise_affine_qparams / Int4CPULayout


def rb(a):
    """Round float32 values to bf16 (RNE), returned as float32."""
    return np.asarray(a, dtype=np.float32).astype(BF16).astype(np.float32)


def find_multiple(n, k):
    return n if n % k == 0 else n + k - n % k


def qparams_and_quantize(x, group, eps, path):
    """x: float32 array [n_p, k_p] (already zero padded, values exact in the input dtype)."""
    n_p, k_p = x.shape
    xg = x.reshape(n_p, k_p // group, group)
    with np.errstate(all="ignore"):
        mn = xg.min(axis=-1)  # NaN propagates, like torch.amin
        mx = xg.max(axis=-1)
        eps32 = np.float32(eps)
        if path == "bf16":
            rng = rb(mx - mn)
            scale = rb(rng * RCP15)
            scale = rb(np.maximum(scale, eps32))  # torch.clamp(min=eps); NaN stays NaN
            s8 = rb(scale * np.float32(8.0))
            zero = rb(mn + s8)
            min_val = rb(zero - s8)
            t = rb(xg - min_val[..., None])
            q = rb(t / scale[..., None])
        else:
            scale_f = np.maximum((mx - mn) * RCP15, eps32)
            zero = rb(mn + scale_f * np.float32(8.0))
            scale = rb(scale_f)
            min_val = rb(zero - rb(scale * np.float32(8.0)))
            q = (xg - min_val[..., None]) / scale[..., None]
        r = np.clip(np.rint(q), 0, 15)
        u = np.where(np.isnan(r), 0, r).astype(np.uint8)
    return u.reshape(n_p, k_p), scale, zero


def kernel_pack(prepacked, inner_k_tiles):
    """Literal port of matrix_to_m16n8k16_Bint4_layout (NVIDIA branch).

    prepacked: uint8 [n][k/2], byte j = (u[2j] << 4) | u[2j+1].
    returns int32 [ceil(n/8)][k/(ikt*16)][32][ikt/2]
    """
    n, half_k = prepacked.shape
    k_tile, n_tile = 16, 8
    n_tiles = -(-n // n_tile)
    k_super = (half_k * 2) // (inner_k_tiles * k_tile)
    out = np.zeros((n_tiles, k_super, 32, inner_k_tiles // 2), dtype=np.uint32)
    for k_outer in range(k_super):  # blockIdx.x
        for n_t in range(n_tiles):  # blockIdx.y
            for t in range(32):  # threadIdx.x
                for inner in range(0, inner_k_tiles, 2):
                    n0 = n_t * n_tile + t // 4
                    valid = n0 < n
                    k_base0 = (k_outer * inner_k_tiles + inner) * k_tile // 2
                    ks = [k_base0 + t % 4, k_base0 + t % 4 + 4]
                    k_base1 = k_base0 + k_tile // 2
                    ks += [k_base1 + t % 4, k_base1 + t % 4 + 4]
                    v = [int(prepacked[n0, kk]) if valid and kk < half_k else 0 for kk in ks]
                    pack = (
                        ((v[3] & 0xF) << 28)
                        | ((v[2] & 0xF) << 24)
                        | ((v[1] & 0xF) << 20)
                        | ((v[0] & 0xF) << 16)
                        | ((v[3] & 0xF0) << 8)
                        | ((v[2] & 0xF0) << 4)
                        | (v[1] & 0xF0)
                        | ((v[0] & 0xF0) >> 4)
                    )
                    out[n_t, k_outer, t, inner // 2] = pack
    return out.view(np.int32)


def round_fraction(fr, mant_bits, emin):
    """Round an exact rational to a binary float with `mant_bits` significant bits and
    minimum normal exponent `emin` (RNE, subnormals on the 2^(emin-mant_bits+1) grid).
    Returns a Python float (exact: the result fits in a double); overflow is left to the caller."""
    if fr == 0:
        return 0.0
    sign = -1 if fr < 0 else 1
    a = abs(fr)
    e = math.floor(math.log2(a.numerator) - math.log2(a.denominator))
    # fix e so that 2^e <= a < 2^(e+1)
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    lsb = max(e, emin) - (mant_bits - 1)
    q = a / (Fraction(2) ** lsb)
    fl = q.numerator // q.denominator
    rem = q - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2 == 1):
        fl += 1
    return sign * math.ldexp(fl, lsb)


def exact_dequant(u, scale, zero):
    """(u - 8) * scale + zero, exact, rounded once to bf16 and to f32."""
    s, z = float(scale), float(zero)
    if not (math.isfinite(s) and math.isfinite(z)):
        v = (u - 8) * s + z  # IEEE: inf/NaN propagate (0 * inf = NaN)
        return np.float32(v).astype(BF16), np.float32(v)
    fr = Fraction(u - 8) * Fraction(s) + Fraction(z)
    b = round_fraction(fr, 8, -126)
    f = round_fraction(fr, 24, -126)
    bmax = float(np.float32(ml_dtypes.finfo(BF16).max))
    bhalf = math.ldexp(1.0, 127 - 8)  # half an ulp at the top binade
    # overflow: anything at or beyond max + half ulp rounds to inf (RNE: max is odd)
    bb = np.float32(b).astype(BF16) if abs(b) < bmax + bhalf else np.float32(math.copysign(math.inf, b)).astype(BF16)
    fmax = float(np.finfo(np.float32).max)
    ff = np.float32(f) if abs(f) < fmax + math.ldexp(1.0, 127 - 24) else np.float32(math.copysign(math.inf, f))
    return bb, ff


def make_case(name, x, in_dtype, group, ikt, pad, eps, note, experts=None):
    """x: float32 array [E?, n, k] holding values exact in `in_dtype`."""
    x3 = x if experts is not None else x[None]
    e_cnt, n, k = x3.shape
    n_p = find_multiple(n, 8)
    k_p = find_multiple(k, 1024 if pad == "torchao" else ikt * 16)
    path = "bf16" if in_dtype == "bf16" else "f32"
    packs, szs, us, dq_b, dq_f = [], [], [], [], []
    for e in range(e_cnt):
        xp = np.zeros((n_p, k_p), dtype=np.float32)
        xp[:n, :k] = x3[e]
        u, scale, zero = qparams_and_quantize(xp, group, eps, path)
        pre = ((u[:, ::2] << 4) | u[:, 1::2]).astype(np.uint8)
        packs.append(kernel_pack(pre, ikt))
        sz = np.stack([scale, zero], axis=-1).transpose(1, 0, 2)  # [k_p/g, n_p, 2]
        szs.append(sz.astype(BF16))
        us.append(u[:n, :k])
        db = np.zeros((n, k), dtype=BF16)
        df = np.zeros((n, k), dtype=np.float32)
        for r in range(n):
            for gi in range(k // group):
                tb = [exact_dequant(v, scale[r, gi], zero[r, gi]) for v in range(16)]
                for kk in range(gi * group, (gi + 1) * group):
                    db[r, kk], df[r, kk] = tb[u[r, kk]]
        dq_b.append(db)
        dq_f.append(df)

    def cat(lst):
        a = np.stack(lst)
        return a if experts is not None else a[0]

    spec_opts = []
    if group != 128:
        spec_opts.append(f"g{group}")
    if ikt != 8:
        spec_opts.append(f"k{ikt}")
    if pad != "kernel":
        spec_opts.append(f"pad={pad}")
    if eps != EPS_V2:
        spec_opts.append(f"eps={eps}")
    if in_dtype == "bf16":
        inp = x.astype(BF16).view(np.uint16)
    elif in_dtype == "f16":
        inp = x.astype(np.float16)
    else:
        inp = x.astype(np.float32)
    tensors = {
        f"{name}.input": np.ascontiguousarray(inp),
        f"{name}.u": np.ascontiguousarray(cat(us)),
        f"{name}.packed_weight": np.ascontiguousarray(cat(packs)),
        f"{name}.scale_and_zero": np.ascontiguousarray(cat(szs).view(np.uint16)),
        f"{name}.dequant_bf16": np.ascontiguousarray(cat(dq_b).view(np.uint16)),
        f"{name}.dequant_f32": np.ascontiguousarray(cat(dq_f)),
    }
    meta = {
        "spec": "int4tiled" + (":" + ",".join(spec_opts) if spec_opts else ""),
        "shape": list(x.shape),
        "dtype": in_dtype,
        "note": note,
    }
    return tensors, meta


def special_matrix(rng, n, k, dtype):
    """Random weights plus rows of special values (exact in `dtype`)."""
    x = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    x[0] = 0.0  # all-zero groups
    x[1] = 0.5  # all-equal groups
    x[2, 3] = np.nan  # NaN group
    x[2, 40] = np.inf  # +inf group
    x[2, 70] = -np.inf  # -inf group
    big = 3.0e38 if dtype != "f16" else 60000.0
    x[3, :] = np.where(np.arange(k) % 2 == 0, big, -big)  # range overflows
    x[3, 32:64] = np.linspace(-big, big, 32)
    tiny = 1e-39 if dtype != "f16" else 1e-7
    x[4, :] = tiny * (np.arange(k) % 7 - 3)  # subnormals
    # rounding ties: group [0, 15, 0.5, 1.5, ..., 14.5]: scale 1, zero 8, q = x exactly
    ties = np.concatenate([[0.0, 15.0], np.arange(0.5, 15.0, 1.0), np.arange(1.0, 16.0)])
    x[5, : len(ties[:32])] = ties[:32]
    x[6, :] = -x[5, :]
    if n > 7:
        x[7, :] = np.arange(k, dtype=np.float32) / 8.0  # ramps
    return cast_exact(x, dtype)


def rcp_sensitive_matrix(rng, n, k, group):
    """f32 groups whose bf16 scale or zero differs between CUDA's `x * (1/15)` and a true
    division `x / 15`: min and max are searched for, interior values drawn between them."""
    m = 2_000_000
    mn = rng.standard_normal(m).astype(np.float32)
    mx = mn + np.abs(rng.standard_normal(m)).astype(np.float32)
    with np.errstate(all="ignore"):
        s1, s2 = (mx - mn) * RCP15, (mx - mn) / np.float32(15.0)
        diff = (rb(s1) != rb(s2)) | (rb(mn + s1 * 8) != rb(mn + s2 * 8))
    idx = np.nonzero(diff)[0]
    need = n * (k // group)
    assert len(idx) >= need, len(idx)
    x = np.empty((n, k // group, group), dtype=np.float32)
    for j, i in enumerate(idx[:need]):
        g = x.reshape(-1, group)[j]
        g[:] = rng.uniform(mn[i], mx[i], group).astype(np.float32)
        g[0], g[-1] = mn[i], mx[i]
    return x.reshape(n, k)


def cast_exact(x, dtype):
    if dtype == "bf16":
        return x.astype(BF16).astype(np.float32)
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    return x.astype(np.float32)


def dequant_tie_case(rng, n=16, k=64, group=32):
    """Scale/zero pairs where (u - 8) * scale is a bf16 midpoint and zero is tiny (2^-30 or
    2^-100 relative, either sign): rounding p + z in f32 (or even f64) first and then to
    bf16 gives the wrong neighbour; only a single rounding is right. u runs over 0..15."""
    pairs = []
    while len(pairs) < n * (k // group):
        s = float(np.float32(rng.uniform(0.5, 4.0)).astype(BF16))
        du = int(rng.integers(-8, 8))
        p = Fraction(du) * Fraction(s)
        if p == 0:
            continue
        b = round_fraction(p, 8, -126)
        if abs(Fraction(b) - p) == 0:
            continue
        # a midpoint: p lies exactly half way between two bf16 neighbours
        lo = round_fraction(p - abs(p) / 2**20, 8, -126)
        hi = round_fraction(p + abs(p) / 2**20, 8, -126)
        if lo == hi or Fraction(lo) + Fraction(hi) != 2 * p:
            continue
        gap = [30, 100][len(pairs) % 2]
        sign = [1, -1][(len(pairs) // 2) % 2]
        z = float(np.float32(sign * math.ldexp(abs(float(p)), -gap)).astype(BF16))
        pairs.append((s, z, du + 8))
    scale = np.array([q[0] for q in pairs], dtype=np.float32).reshape(n, k // group)
    zero = np.array([q[1] for q in pairs], dtype=np.float32).reshape(n, k // group)
    u = np.zeros((n, k), dtype=np.uint8)
    for r in range(n):
        for gi in range(k // group):
            tie_u = pairs[r * (k // group) + gi][2]
            grp = np.arange(group) % 16
            grp[::4] = tie_u  # every 4th value is the tie
            u[r, gi * group:(gi + 1) * group] = grp
    db = np.zeros((n, k), dtype=BF16)
    df = np.zeros((n, k), dtype=np.float32)
    for r in range(n):
        for kk in range(k):
            db[r, kk], df[r, kk] = exact_dequant(int(u[r, kk]), scale[r, kk // group], zero[r, kk // group])
    return {
        "dq.u": u,
        "dq.scale": scale.astype(BF16).view(np.uint16),
        "dq.zero": zero.astype(BF16).view(np.uint16),
        "dq.dequant_bf16": db.view(np.uint16),
        "dq.dequant_f32": df,
    }


def main():
    rng = np.random.default_rng(20261121)
    tensors, cases = {}, {}

    def add(x, dtype, g, ikt, pad, eps, note, experts=None):
        name = f"case{len(cases)}"
        t, m = make_case(name, x, dtype, g, ikt, pad, eps, note, experts)
        tensors.update(t)
        cases[name] = m

    add(special_matrix(rng, 13, 96, "bf16"), "bf16", 32, 2, "kernel", EPS_V2,
        "bf16 specials: zero/equal groups, NaN, inf, overflow, subnormals, ties; ragged n")
    add(special_matrix(rng, 13, 96, "f32"), "f32", 32, 2, "kernel", EPS_V2,
        "f32 specials: zero/equal groups, NaN, inf, overflow, subnormals, ties; ragged n")
    add(cast_exact(rng.standard_normal((20, 256)).astype(np.float32), "bf16"), "bf16",
        64, 8, "kernel", EPS_V2, "bf16 random, g64 k8")
    add(cast_exact(rng.standard_normal((5, 128)).astype(np.float32) * 3, "bf16"), "bf16",
        128, 8, "torchao", EPS_V2, "bf16, pad=torchao: k 128 -> 1024, padded groups and rows")
    add((rng.standard_normal((24, 512)) * 0.02).astype(np.float32), "f32", 256, 4,
        "kernel", 1e-6, "f32 random, g256 k4, v1 eps 1e-6")
    add((rng.standard_normal((17, 192)) + 1.0).astype(np.float32), "f32", 64, 2,
        "kernel", EPS_V2, "f32 random offset, ragged n, k2 (scale rcp vs div matters)")
    add(cast_exact(rng.standard_normal((8, 64)).astype(np.float32), "f16"), "f16", 32, 4,
        "kernel", EPS_V2, "f16 input (widened to f32)")
    add(cast_exact(rng.standard_normal((3, 12, 128)).astype(np.float32), "bf16"), "bf16",
        64, 4, "kernel", EPS_V2, "3-D MoE [3, 12, 128]", experts=3)
    add(cast_exact(rng.standard_normal((9, 96)).astype(np.float32) * 0.1, "bf16"), "bf16",
        32, 8, "kernel", EPS_V2, "bf16 k=96 padded to 128 with ikt=8: padded k groups")
    add(cast_exact(np.tile(np.array([1e-3, 1e-3 + 2**-17], dtype=np.float32), (8, 32)), "bf16"),
        "bf16", 32, 4, "kernel", EPS_V1, "two-valued groups near the eps floor (v1 eps)")

    add(rcp_sensitive_matrix(rng, 8, 256, 32), "f32", 32, 8, "kernel", EPS_V2,
        "f32 groups where x*(1/15) and x/15 give different bf16 scale or zero (CUDA rcp)")

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "int4tiled.safetensors")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tensors.update(dequant_tie_case(rng))
    dq_meta = {"spec": "int4tiled:g32", "shape": [16, 64],
               "note": "dequant-only: logical u/scale/zero imported; bf16 midpoints plus tiny zeros"}
    save_file(tensors, out, metadata={"cases": json.dumps(cases), "dequant_case": json.dumps(dq_meta),
                                      "generator": "tests/golden/int4tiled.py"})
    print(f"wrote {out}: {len(cases)} cases, {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main()
