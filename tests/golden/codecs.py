#!/usr/bin/env python3
"""Golden data for quant-core's scalar codecs and the bf16/f16 conversions.

Independent reference: numpy + ml_dtypes conversions, with the kernel (TransformerEngine /
CUDA / PTX) semantics layered on top *explicitly*, never by porting the Rust code:

* E4M3 / E5M2 (`__nv_cvt_float_to_fp8(x, __NV_SATFINITE)`): clip to +-max, then the
  ml_dtypes round-to-nearest-even cast (ml_dtypes itself overflows to NaN / inf where the
  kernels saturate); every NaN becomes the canonical 0x7F (ml_dtypes gives 0x7E/0xFE for
  E5M2 and keeps the sign for E4M3).
* E2M1 (`cvt.rn.satfinite.e2m1x2.f32`, NVIDIA's host emulation in cuda_fp4.hpp): clip to
  +-6, ml_dtypes float4_e2m1fn cast; NaN -> 0x7 (+6); a negative input keeps its sign bit
  even when it rounds to zero (-0 -> 0x8).
* E8M0 `from_f32_ceil` (TE `float_to_e8m0`, `cvt.rp.satfinite.ue8m0x2.f32`): the biased
  exponent of the smallest power of two >= |x|, from np.frexp in float64, clamped to
  [0, 254]; 0 -> 0, inf -> 254, NaN -> 255.  `from_f32_floor` (OCP MX): floor(log2 |x|)
  biased, clamped to [0, 254], from np.frexp too.  `decode` is ml_dtypes float8_e8m0fnu;
  `exp2_rcp(e) = 2^(127 - e)` via np.ldexp in float64.
* bf16 / f16 (`half::bf16::from_f32`, `half::f16::from_f32`): ml_dtypes bfloat16 and numpy
  float16 casts (IEEE round-to-nearest-even, overflow to inf).  NaN payloads are
  implementation-defined (half keeps the top payload bits and sets the quiet bit, Eigen /
  ml_dtypes canonicalise, numpy keeps the payload unquieted, CUDA returns 0x7FFF), so
  every NaN result is compared as "NaN with this sign": canonicalised to sign|0x7FC0 (bf16),
  sign|0x7E00 (f16), sign|0x7FC00000 (f32) on both sides.

Input sets (the Rust test enumerates the same ones; a CRC32 of each input set's bit
patterns is stored so a drift in enumeration is caught before any output is compared):

* `bf16`: all 65536 bf16 patterns widened to f32 (the widening itself is also golden).
* `f16`: all 65536 f16 patterns widened to f32.
* `specials`: signed zeros, infinities, NaNs with assorted payloads, extreme finite values.
* `bnd.<codec>`: every rounding boundary of the codec, i.e. 0, the exact midpoint between
  each pair of adjacent non-negative representable values (subnormals included) and the
  overflow boundary max + ulp/2 (for E8M0: every power of two 2^-149..2^127, and FLT_MAX),
  each with the 64 f32 patterns either side, both signs.
* `sweep`: every f32 bit pattern `i * 41`, i = 0 .. ceil(2^32 / 41) - 1 (104,755,300
  inputs: all binades, NaN payloads, both signs), stored as one CRC32 per 2^20 outputs.

Run: python3 tests/golden/codecs.py   (writes tests/golden/data/codecs*.safetensors)
"""

import json
import pathlib
import sys
import zlib

import ml_dtypes as md
import numpy as np
from safetensors.numpy import save_file

OUT = pathlib.Path(__file__).resolve().parent / "data"

STRIDE = 41
SWEEP_N = -(-(1 << 32) // STRIDE)  # ceil(2^32 / STRIDE): last pattern < 2^32
CHUNK = 1 << 20
ULPS = 64

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
E2M1_MAX = 6.0

CODECS = ["e4m3", "e5m2", "e2m1", "e8m0_ceil", "e8m0_floor", "bf16", "f16"]


def f32_bits(x):
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def canon_f32_nan(x):
    """NaN -> sign|0x7FC00000 (bit pattern, u32)."""
    b = f32_bits(x).copy()
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    b[nan] = (b[nan] & 0x80000000) | 0x7FC00000
    return b


# ---------------------------------------------------------------------------------------
# Reference encoders: f32 array -> code array
# ---------------------------------------------------------------------------------------


def enc_fp8(x, dt, maxv):
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        c = np.clip(x, np.float32(-maxv), np.float32(maxv)).astype(dt).view(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), c).astype(np.uint8)


def enc_e4m3(x):
    return enc_fp8(x, md.float8_e4m3fn, E4M3_MAX)


def enc_e5m2(x):
    return enc_fp8(x, md.float8_e5m2, E5M2_MAX)


def enc_e2m1(x):
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        c = np.clip(x, np.float32(-E2M1_MAX), np.float32(E2M1_MAX))
        c = c.astype(md.float4_e2m1fn).view(np.uint8) & np.uint8(0xF)
    nan = np.isnan(x)
    # the sign survives rounding to zero (cuda_fp4.hpp host emulation)
    c = np.where(np.signbit(x) & ~nan, c | np.uint8(0x8), c)
    return np.where(nan, np.uint8(0x7), c).astype(np.uint8)


def _frexp_abs(x):
    a = np.abs(np.asarray(x, dtype=np.float32).astype(np.float64))
    with np.errstate(invalid="ignore"):
        m, e = np.frexp(np.where(np.isfinite(a), a, 1.0))  # a = m * 2^e, m in [0.5, 1)
    return a, m, e.astype(np.int64)


def _e8m0_specials(a, code):
    code = np.where(a == 0, 0, code)
    code = np.where(np.isinf(a), 254, code)
    code = np.where(np.isnan(a), 255, code)
    return code.astype(np.uint8)


def enc_e8m0_ceil(x):
    a, m, e = _frexp_abs(x)
    ceil_log2 = np.where(m == 0.5, e - 1, e)  # exact power of two: log2 = e - 1
    return _e8m0_specials(a, np.clip(ceil_log2 + 127, 0, 254))


def enc_e8m0_floor(x):
    a, m, e = _frexp_abs(x)
    return _e8m0_specials(a, np.clip((e - 1) + 127, 0, 254))


def enc_bf16(x):
    x = np.asarray(x, dtype=np.float32)
    h = x.astype(md.bfloat16).view(np.uint16).copy()
    nan = np.isnan(x)
    h[nan] = (f32_bits(x)[nan] >> 16).astype(np.uint16) & 0x8000 | 0x7FC0
    return h


def enc_f16(x):
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16).view(np.uint16).copy()
    nan = np.isnan(x)
    h[nan] = (f32_bits(x)[nan] >> 16).astype(np.uint16) & 0x8000 | 0x7E00
    return h


ENCODERS = {
    "e4m3": enc_e4m3,
    "e5m2": enc_e5m2,
    "e2m1": enc_e2m1,
    "e8m0_ceil": enc_e8m0_ceil,
    "e8m0_floor": enc_e8m0_floor,
    "bf16": enc_bf16,
    "f16": enc_f16,
}


def crc(a):
    return zlib.crc32(np.ascontiguousarray(a).tobytes()) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------
# Input sets
# ---------------------------------------------------------------------------------------


def widened_bf16():
    return canon_f32_nan(
        np.arange(1 << 16, dtype=np.uint16).view(md.bfloat16).astype(np.float32)
    ).view(np.float32)


def widened_f16():
    return canon_f32_nan(
        np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    ).view(np.float32)


def specials():
    bits = [
        0x00000000, 0x80000000,  # +-0
        0x7F800000, 0xFF800000,  # +-inf
        0x7FC00000, 0xFFC00000,  # canonical quiet NaN
        0x7F800001, 0xFF800001,  # signalling NaN, lowest payload
        0x7FBFFFFF, 0xFFBFFFFF,  # signalling NaN, highest payload
        0x7FC00001, 0x7FFFFFFF, 0xFFFFFFFF,  # quiet NaN payloads
        0x7F802000, 0x7F810000, 0x7FA00000, 0xFFE00000,  # payloads that survive narrowing
        0x7F7FFFFF, 0xFF7FFFFF,  # +-FLT_MAX
        0x00000001, 0x80000001,  # +-smallest subnormal
        0x007FFFFF, 0x807FFFFF,  # +-largest subnormal
        0x00800000, 0x80800000,  # +-smallest normal
        0x00400000, 0x00400001, 0x003FFFFF,  # 2^-127 and neighbours (E8M0 code 0)
        0x3F800000, 0xBF800000,  # +-1
        0x7F000000, 0x7EFFFFFF, 0x7F000001,  # 2^127 and neighbours
    ]
    return np.array(bits, dtype=np.uint32).view(np.float32)


def positive_grid(codec):
    """Sorted non-negative finite values (float64) of a codec, code order."""
    if codec == "e4m3":
        return np.arange(0x7F, dtype=np.uint8).view(md.float8_e4m3fn).astype(np.float64)
    if codec == "e5m2":
        return np.arange(0x7C, dtype=np.uint8).view(md.float8_e5m2).astype(np.float64)
    if codec == "e2m1":
        return np.arange(8, dtype=np.uint8).view(md.float4_e2m1fn).astype(np.float64)
    if codec == "bf16":
        return np.arange(0x7F80, dtype=np.uint16).view(md.bfloat16).astype(np.float64)
    if codec == "f16":
        return np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    raise ValueError(codec)


def boundaries(codec):
    """Non-negative boundary points (float64, each exactly an f32)."""
    if codec == "e8m0":
        b = np.concatenate(
            [[0.0], np.ldexp(1.0, np.arange(-149, 128)), [float(np.finfo(np.float32).max)]]
        )
    else:
        v = positive_grid(codec)
        assert np.all(np.diff(v) > 0)
        mids = (v[:-1] + v[1:]) / 2
        over = v[-1] + (v[-1] - v[-2]) / 2
        b = np.concatenate([[0.0], mids, [over]])
    assert np.all(b.astype(np.float32).astype(np.float64) == b), codec
    return b


def boundary_inputs(codec):
    """For each boundary b (ascending): patterns bits(b)+d, d = -64..64, each followed by
    its negation; patterns outside [0, 0x7FFFFFFF] are skipped."""
    bb = f32_bits(boundaries(codec).astype(np.float32)).astype(np.int64)
    p = (bb[:, None] + np.arange(-ULPS, ULPS + 1)[None, :]).ravel()
    p = p[(p >= 0) & (p <= 0x7FFFFFFF)].astype(np.uint32)
    return np.stack([p, p | np.uint32(0x80000000)], axis=1).ravel().view(np.float32)


def sweep_chunk(c):
    i = np.arange(c * CHUNK, min((c + 1) * CHUNK, SWEEP_N), dtype=np.uint64)
    return (i * STRIDE).astype(np.uint32).view(np.float32)


# ---------------------------------------------------------------------------------------


def decode_tables():
    t = {}
    codes = np.arange(256, dtype=np.uint8)
    t["decode.e4m3"] = canon_f32_nan(codes.view(md.float8_e4m3fn).astype(np.float32))
    t["decode.e5m2"] = canon_f32_nan(codes.view(md.float8_e5m2).astype(np.float32))
    t["decode.e8m0"] = canon_f32_nan(codes.view(md.float8_e8m0fnu).astype(np.float32))
    rcp = np.ldexp(1.0, 127 - codes.astype(np.int64)).astype(np.float32)
    rcp[255] = np.nan
    t["exp2_rcp.e8m0"] = canon_f32_nan(rcp)
    t["decode.e2m1"] = canon_f32_nan(
        np.arange(16, dtype=np.uint8).view(md.float4_e2m1fn).astype(np.float32)
    )
    lo, hi = np.meshgrid(np.arange(16), np.arange(16))  # index = hi * 16 + lo
    # element 2i in the low nibble, 2i+1 in the high nibble
    t["pack.e2m1"] = (lo.ravel() | (hi.ravel() << 4)).astype(np.uint8)
    b = np.arange(256, dtype=np.uint16)
    t["unpack.e2m1.lo"] = (b & 0xF).astype(np.uint8)
    t["unpack.e2m1.hi"] = (b >> 4).astype(np.uint8)
    return t


def full_set(name, x, codecs, tensors, meta):
    meta["sets"][name] = {"count": int(x.size), "input_crc32": crc(f32_bits(x))}
    for c in codecs:
        tensors[f"{name}.{c}"] = ENCODERS[c](x)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    common = {"stride": STRIDE, "sweep_count": SWEEP_N, "chunk": CHUNK, "ulps": ULPS}

    # bf16 / f16: every bit pattern
    for kind, widen in (("bf16", widened_bf16), ("f16", widened_f16)):
        x = widen()
        meta = dict(common, sets={})
        t = {f"widen.{kind}": f32_bits(x).copy()}
        full_set(kind, x, CODECS, t, meta)
        save_file(t, OUT / f"codecs_{kind}.safetensors", metadata={"json": json.dumps(meta)})

    meta = dict(common, sets={}, crc_sets={})
    t = decode_tables()
    full_set("specials", specials(), CODECS, t, meta)

    # rounding boundaries: full arrays for the 8-bit-and-smaller codecs
    for codec, outs in (
        ("e4m3", ["e4m3"]),
        ("e5m2", ["e5m2"]),
        ("e2m1", ["e2m1"]),
        ("e8m0", ["e8m0_ceil", "e8m0_floor"]),
    ):
        full_set(f"bnd.{codec}", boundary_inputs(codec), outs, t, meta)

    # rounding boundaries of bf16 / f16: ~8.4M each, one CRC32 per CHUNK outputs
    for codec in ("bf16", "f16"):
        x = boundary_inputs(codec)
        name = f"bnd.{codec}"
        meta["crc_sets"][name] = {"count": int(x.size), "input_crc32": crc(f32_bits(x))}
        t[f"{name}.{codec}.crc"] = np.array(
            [crc(ENCODERS[codec](x[s : s + CHUNK])) for s in range(0, x.size, CHUNK)],
            dtype=np.uint32,
        )

    # the strided sweep over all f32 patterns: one CRC32 per CHUNK outputs, per codec
    nchunks = -(-SWEEP_N // CHUNK)
    crcs = {c: np.zeros(nchunks, dtype=np.uint32) for c in CODECS}
    in_crc = 0
    for ci in range(nchunks):
        x = sweep_chunk(ci)
        in_crc = zlib.crc32(x.tobytes(), in_crc)
        for c in CODECS:
            crcs[c][ci] = crc(ENCODERS[c](x))
        if ci % 10 == 0:
            print(f"sweep chunk {ci}/{nchunks}", file=sys.stderr)
    meta["crc_sets"]["sweep"] = {"count": SWEEP_N, "input_crc32": in_crc & 0xFFFFFFFF}
    for c in CODECS:
        t[f"sweep.{c}.crc"] = crcs[c]

    save_file(t, OUT / "codecs.safetensors", metadata={"json": json.dumps(meta)})
    for f in sorted(OUT.glob("codecs*.safetensors")):
        print(f"{f.name}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
