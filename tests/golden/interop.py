#!/usr/bin/env python3
"""Golden checkpoints in the ecosystem's layouts, for quantfmt's interop reader/writer.

Each checkpoint is made the way its producer makes it, re-implemented here in numpy +
ml_dtypes from the upstream source (never from the Rust code). Every rule names its
source (repository at the commit read, path, function):

ModelOpt  (NVIDIA/Model-Optimizer a2fbac7)
  M1 NVFP4 `weight_scale_2 = amax.float() / (E2M1_MAX * E4M3_MAX)` = f32(amax / 2688)
     - modelopt/torch/quantization/qtensor/nvfp4_tensor.py: get_weights_scaling_factor_2
  M2 per-block `scale = block_amax / (E2M1_MAX * weight_scale_2)`; zeros -> 1.0; clamp to
     [2^-9, 448]; `.to(float8_e4m3fn)`  - nvfp4_tensor.py: get_weights_scaling_factor,
     _cast_per_block_scale_to_fp8
  M3 `scaled = x / (f32(scale) * weight_scale_2)`; E2M1 code by searchsorted over the
     bounds [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5] plus one at the odd bounds (ties to
     even), sign bit 3 from `x < 0`   - nvfp4_tensor.py: quantize, _cast_fp4
  M4 `packed = (q[..., 1::2] << 4) | q[..., 0::2]` (even element -> low nibble) - quantize
  M5 dequant `e2m1 * (f32(scale) * weight_scale_2)`        - nvfp4_tensor.py: dequantize
  M6 FP8 `weight_scale = amax.float() / maxbound` (448), `weight = (w / scale).to(e4m3fn)`
     - modelopt/torch/export/quant_utils.py: get_scaling_factor, to_quantized_weight
  M7 MXFP8 `e = clamp(ceil(log2(amax / 448)), -127, 127)` (-127 for amax 0), byte e + 127,
     `q = clamp(x * 2^(127 - byte), +-448).to(e4m3fn)` - qtensor/mxfp8_tensor.py
  M8 scalars are 0-d tensors (`weight_scale_2`, FP8 `weight_scale`, `input_scale`);
     NVFP4 `input_scale = amax / (6 * 448)` - nvfp4_tensor.py: get_activation_scaling_factor
  M9 hf_quant_config {"producer": {"name": "modelopt"}, "quantization": {"quant_algo",
     "group_size", "exclude_modules", "kv_cache_quant_algo"}}, embedded in the safetensors
     metadata as `quantization_config` - export/unified_export_hf.py, quant_utils.py:
     get_quant_config / process_layer_quant_config

compressed-tensors  (vllm-project/compressed-tensors ac8e2ba)
  C1 `global_scale = 448 * 6 / amax` in f32, shape [1]  - quantization/utils/helpers.py:
     generate_gparam
  C2 block scale `global_scale * (block_amax / 6)` -> clamp to e4m3 range -> e4m3;
     zeros -> finfo(e4m3).eps = 0.125 - helpers.py: calculate_qparams (FP4 range 12 / 2),
     quant_args.py: round_to_quantized_type_dtype
  C3 quantize `x / (f32(scale) / global_scale)`, rounded to bf16 first, then to E2M1 with
     thresholds (> 0.25, >= 0.75, > 1.25, >= 1.75, > 2.5, >= 3.5, > 5)
     - forward_helpers.py: _quantize; utils/fp4_utils.py: _round_to_fp4
  C4 `packed = idx[:, 0] | idx[:, 1] << 4` (even -> low) - compressors/nvfp4/helpers.py
  C5 dequant `x_q * (f32(scale) / global_scale)` in f32 - forward_helpers.py: _dequantize
  C6 names weight_packed / weight_scale / weight_global_scale / input_global_scale
     - compressors/nvfp4/base.py
  C7 FP8 scale `amax / 448` (FP8 range 896 / 2), shape [1]; block strategy per 128x128
     tile, scale [ceil(N/128), ceil(K/128)]; `weight` keeps its name  - helpers.py,
     compressors/naive_quantized/base.py, quant_scheme.py FP8 / FP8_BLOCK
  C8 MXFP8: E8M0 byte = 127 + floor(log2(round_to_power_2(amax))) - 8, scale
     2^(byte - 127), `q = clamp(x / scale, +-448)` -> e4m3 - utils/mxfp_utils.py,
     compressors/mx_utils.py

DeepSeek-V3  (deepseek-ai/DeepSeek-V3 README_WEIGHTS.md, inference/kernel.py weight_dequant)
  D1 `weight_scale_inv` [ceil(N/128), ceil(K/128)] is the dequant multiplier:
     `w = fp8 * weight_scale_inv[i // 128, j // 128]`; ragged tiles are partial;
     here made as s = block_amax / 448, q = e4m3(x / s)

Native (TransformerEngine buffers, what quantfmt must rebuild; docs/formats/*.md)
  N1 FP8: rowwise_data, scale_inv [1] = the multiplier
  N2 FP8 block 128x128: rowwise_scale_inv [ceil(M/128), roundup(ceil(K/128), 4)], zero pad
  N3 MXFP8: rowwise_scale_inv [roundup(M, 128), roundup(K/32, 4)], zero pad
  N4 NVFP4: rowwise_scale_inv [roundup(M, 128), roundup(K/16, 4)], zero pad; amax_rowwise
     [1] = the f32 amax nearest the exact inverse of the stored scalar that reproduces it
     bit for bit (ModelOpt: a / 2688 == weight_scale_2; compressed-tensors:
     2688 / a == weight_global_scale); dequant `e2m1 * ((f32(sdb) * amax) * f32(1/2688))`
     (TE dequantize_nvfp4.cuh)

Output: data/interop/<layout>.safetensors (each a small checkpoint) and
data/interop/expected.safetensors with, per file and weight, `<file>:<weight>:<buffer>`
(native buffers), `:dequant_layout` (the producer's dequantization, f32) and
`:dequant_native` (TE's dequantization of the rebuilt native tensor, f32).

Run: python3 tests/golden/interop.py
"""

import json
import pathlib
import struct

import ml_dtypes as md
import numpy as np
from safetensors.numpy import save_file

OUT = pathlib.Path(__file__).resolve().parent / "data" / "interop"
F32 = np.float32
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=F32)


def bf16_weights(rng, shape, std=0.02, outlier=True, zero_block=None):
    x = rng.standard_t(4, size=shape).astype(F32) * F32(std)
    if outlier:
        x.reshape(-1, shape[-1])[:, 3] *= F32(25.0)
    if zero_block is not None:
        r, c, h, w = zero_block
        x.reshape(-1, shape[-1])[r:r + h, c:c + w] = 0
    return x.astype(md.bfloat16).astype(F32)  # checkpoints hold bf16


def e4m3(x):
    return np.asarray(x, dtype=F32).astype(md.float8_e4m3fn)


def e4m3_bits(x):
    return e4m3(x).view(np.uint8)


def block_amax(x, b):
    s = x.reshape(*x.shape[:-1], x.shape[-1] // b, b)
    return np.abs(s).max(axis=-1).astype(F32)


# ---------------------------------------------------------------- NVFP4 producers

def modelopt_fp4_codes(scaled):
    """M3: _cast_fp4."""
    bounds = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5], dtype=F32)
    a = np.abs(scaled)
    ordv = np.searchsorted(bounds, a, side="left").astype(np.uint8)
    odd = np.isin(a, bounds[[1, 3, 5]]).astype(np.uint8)
    sign = (scaled < 0).astype(np.uint8)
    return (sign << 3) + ordv + odd


def pack(codes):
    """M4 / C4: element 2i in the low nibble."""
    return ((codes[..., 1::2] << 4) | codes[..., 0::2]).astype(np.uint8)


def unpack(packed):
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=np.uint8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out


def modelopt_nvfp4(x):
    amax = F32(np.abs(x).max())
    s2 = F32(amax / F32(2688.0))  # M1
    pba = block_amax(x, 16)
    pbs = (pba / (F32(6.0) * s2)).astype(F32)  # M2
    pbs[pbs == 0] = F32(1.0)
    ws = e4m3(np.clip(pbs, F32(2.0 ** -9), F32(448.0)))
    wsf = ws.astype(F32)
    denom = (wsf * s2).astype(F32)
    scaled = (x.reshape(*x.shape[:-1], -1, 16) / denom[..., None]).astype(F32).reshape(x.shape)
    codes = modelopt_fp4_codes(scaled)
    deq = (E2M1_VALUES[codes].reshape(*x.shape[:-1], -1, 16) * denom[..., None]).astype(F32)  # M5
    return pack(codes), ws.view(np.uint8), s2, deq.reshape(x.shape)


def ct_round_fp4(v):
    """C3: _round_to_fp4 on a bf16 value."""
    b = v.astype(md.bfloat16).astype(F32)
    a = np.abs(b)
    r = np.zeros_like(a)
    r = np.where(a > 0.25, 0.5, r)
    r = np.where(a >= 0.75, 1.0, r)
    r = np.where(a > 1.25, 1.5, r)
    r = np.where(a >= 1.75, 2.0, r)
    r = np.where(a > 2.5, 3.0, r)
    r = np.where(a >= 3.5, 4.0, r)
    r = np.where(a > 5.0, 6.0, r)
    return np.where(np.signbit(b), -r, r).astype(F32)


def fp4_value_to_code(v):
    lut = {0.0: 0, 0.5: 1, 1.0: 2, 1.5: 3, 2.0: 4, 3.0: 5, 4.0: 6, 6.0: 7}
    mag = np.vectorize(lambda t: lut[float(abs(t))], otypes=[np.uint8])(v)
    return (mag | (np.signbit(v).astype(np.uint8) << 3)).astype(np.uint8)


def ct_nvfp4(x):
    amax = F32(np.abs(x).max())
    gs = F32(F32(448.0 * 6.0) / amax)  # C1
    pba = block_amax(x, 16)
    local = (pba / F32(6.0)).astype(F32)
    sc = (gs * local).astype(F32)  # C2
    sc = e4m3(np.clip(sc, F32(-448.0), F32(448.0))).astype(F32)
    sc[sc == 0] = F32(0.125)
    ws = e4m3(sc)
    eff = (ws.astype(F32) / gs).astype(F32)
    scaled = (x.reshape(*x.shape[:-1], -1, 16) / eff[..., None]).astype(F32)
    q = ct_round_fp4(np.clip(scaled, -6, 6))
    codes = fp4_value_to_code(q).reshape(x.shape)
    deq = (E2M1_VALUES[codes].reshape(*x.shape[:-1], -1, 16) * eff[..., None]).astype(F32)  # C5
    return pack(codes), ws.view(np.uint8), gs, deq.reshape(x.shape)


# ---------------------------------------------------------------- NVFP4 native side

def amax_from(stored, forward, start, target):
    """N4: nearest f32 to `target` among start's neighbours reproducing `stored`."""
    bits = np.array([start], dtype=F32).view(np.uint32)[0].astype(np.int64)
    best = None
    for d in range(-8, 9):
        a = np.array([bits + d], dtype=np.uint32).view(F32)[0]
        if not np.isfinite(a) or a < 0:
            continue
        if np.array([forward(a)], dtype=F32).view(np.uint32)[0] != np.array([stored], dtype=F32).view(np.uint32)[0]:
            continue
        key = (abs(float(a) - target), float(a))
        if best is None or key < best[0]:
            best = (key, a)
    return F32(best[1]) if best is not None else F32(start)


def te_global_encode(a):
    if a == 0:
        return F32(1.0)
    with np.errstate(divide="ignore", over="ignore"):
        s = F32(F32(2688.0) / F32(a))
    s = min(s, np.finfo(F32).max)
    return F32(1.0) if s == 0 else F32(s)


def native_nvfp4(packed, sdb, amax, m, k):
    mp, kp = -(-m // 128) * 128, -(-(k // 16) // 4) * 4
    scales = np.zeros((mp, kp), dtype=np.uint8)
    scales[:m, :k // 16] = sdb.reshape(m, k // 16)
    codes = unpack(packed.reshape(m, k // 2))
    sdbf = sdb.reshape(m, k // 16).view(md.float8_e4m3fn).astype(F32)
    factor = ((sdbf * F32(amax)).astype(F32) * F32(1.0 / 2688.0)).astype(F32)
    deq = (E2M1_VALUES[codes].reshape(m, -1, 16) * factor[..., None]).astype(F32).reshape(m, k)
    return {
        "rowwise_data": packed.reshape(m, k // 2),
        "rowwise_scale_inv": scales,
        "amax_rowwise": np.array([amax], dtype=F32),
    }, deq


# ---------------------------------------------------------------- FP8 producers

def fp8_tensor(x):
    s = F32(F32(np.abs(x).max()) / F32(448.0))  # M6 / C7
    q = e4m3_bits(np.clip((x / s).astype(F32), -448, 448))
    deq = (q.view(md.float8_e4m3fn).astype(F32) * s).astype(F32)
    return q, s, deq


def fp8_block(x):
    n, k = x.shape
    nb, kb = -(-n // 128), -(-k // 128)
    s = np.zeros((nb, kb), dtype=F32)
    q = np.zeros(x.shape, dtype=np.uint8)
    deq = np.zeros(x.shape, dtype=F32)
    for i in range(nb):
        for j in range(kb):
            blk = x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            sc = F32(F32(np.abs(blk).max()) / F32(448.0))  # C7 / D1
            s[i, j] = sc
            qq = e4m3_bits(np.clip((blk / sc).astype(F32), -448, 448))
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = qq
            deq[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (qq.view(md.float8_e4m3fn).astype(F32) * sc).astype(F32)
    return q, s, deq


def modelopt_mxfp8(x):
    amax = block_amax(x, 32)
    d = (amax / F32(448.0)).astype(F32)
    with np.errstate(divide="ignore"):
        lg = np.where(d > 0, np.log2(d.astype(np.float64)), -127.0)
    e = np.clip(np.ceil(lg), -127, 127)  # M7
    byte = (e + 127).astype(np.uint8)
    mult = np.exp2(127.0 - byte.astype(np.float64)).astype(F32)
    scaled = (x.reshape(*x.shape[:-1], -1, 32) * mult[..., None]).astype(F32)
    q = e4m3_bits(np.clip(scaled, -448, 448)).reshape(x.shape)
    return q, byte


def ct_round_to_power_2(a):
    bits = a.astype(F32).view(np.uint32).astype(np.int64)
    bits = (bits + (1 << 21)) & 0xFF800000
    return bits.astype(np.uint32).view(F32)


def ct_mxfp8(x):
    amax = block_amax(x, 32)
    p2 = ct_round_to_power_2(amax)
    with np.errstate(divide="ignore"):
        byte = (127 + np.floor(np.log2(p2.astype(np.float64))) - 8)  # C8
    byte = np.clip(np.nan_to_num(byte, neginf=0), 0, 254).astype(np.uint8)
    scale = np.exp2(byte.astype(np.float64) - 127).astype(F32)
    scaled = (x.reshape(*x.shape[:-1], -1, 32) / scale[..., None]).astype(F32)
    q = e4m3_bits(np.clip(scaled, -448, 448)).reshape(x.shape)
    return q, byte


def mx_dequant(q, byte):
    m = q.shape[0]
    v = q.view(md.float8_e4m3fn).astype(F32).reshape(m, -1, 32)
    return (v * np.exp2(byte.astype(np.float64) - 127).astype(F32)[..., None]).astype(F32).reshape(q.shape)


def native_mxfp8(q, byte):
    m, k = q.shape
    s = np.zeros((-(-m // 128) * 128, -(-(k // 32) // 4) * 4), dtype=np.uint8)
    s[:m, :k // 32] = byte
    return {"rowwise_data": q, "rowwise_scale_inv": s}


def native_block(q, s):
    nb, kb = s.shape
    p = np.zeros((nb, -(-kb // 4) * 4), dtype=F32)
    p[:, :kb] = s
    return {"rowwise_data": q, "rowwise_scale_inv": p}


def fp8_dequant_block(q, s):
    n, k = q.shape
    idx_r = np.arange(n) // 128
    idx_c = np.arange(k) // 128
    return (q.view(md.float8_e4m3fn).astype(F32) * s[idx_r][:, idx_c]).astype(F32)


# ---------------------------------------------------------------- writing

def write_f4(path, tensors, metadata):
    """A minimal safetensors writer for a file holding an `F4` tensor (numpy has no F4
    dtype): tensors is [(name, dtype_str, shape, bytes)]."""
    header = {"__metadata__": metadata}
    off = 0
    for name, dt, shape, b in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, b in tensors:
            f.write(b)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20260822)
    expected = {}
    plain = {
        "model.embed_tokens.weight": bf16_weights(rng, (64, 32)).astype(md.bfloat16),
        "model.norm.weight": np.ones(32, dtype=md.bfloat16),
    }

    def put(file, weight, bufs, deq_layout, deq_native):
        # rowwise_data is the layout's data tensor byte for byte (the Rust test checks
        # that); only buffers that differ from the layout are stored.
        for b, v in bufs.items():
            if b != "rowwise_data":
                expected[f"{file}:{weight}:{b}"] = np.ascontiguousarray(v)
        expected[f"{file}:{weight}:dequant_layout"] = deq_layout.astype(F32)
        if not np.array_equal(deq_layout.view(np.uint32), deq_native.view(np.uint32)):
            expected[f"{file}:{weight}:dequant_native"] = deq_native.astype(F32)

    nvfp4_shapes = {
        "model.layers.0.mlp.up_proj.weight": ((48, 64), (0, 16, 2, 16)),
        "model.layers.0.mlp.down_proj.weight": ((32, 160), None),
        "model.layers.0.self_attn.q_proj.weight": ((144, 32), (128, 0, 16, 32)),
    }

    # ModelOpt NVFP4 (weight, weight_scale, weight_scale_2, input_scale)
    t = dict(plain)
    for name, (shape, zb) in nvfp4_shapes.items():
        x = bf16_weights(rng, shape, zero_block=zb)
        packed, ws, s2, deq = modelopt_nvfp4(x)
        t[name] = packed
        t[name + "_scale"] = ws  # written as F8_E4M3 below
        t[name + "_scale_2"] = np.array(s2, dtype=F32)  # M8: 0-d
        t[name.replace(".weight", ".input_scale")] = np.array(F32(3.5) / F32(2688.0), dtype=F32)
        m, k = shape
        amax = amax_from(s2, lambda a: F32(a / F32(2688.0)), F32(s2 * F32(2688.0)), float(s2) * 2688.0)
        bufs, deq_native = native_nvfp4(packed, ws, amax, m, k)
        put("modelopt_nvfp4", name, bufs, deq, deq_native)
    hf = {"producer": {"name": "modelopt", "version": "0.0.0-golden"},
          "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                           "exclude_modules": ["lm_head"]}}
    save_typed("modelopt_nvfp4", t, {"quantization_config": json.dumps(hf), "format": "pt"},
               f8=[n for n in t if n.endswith("_scale") and not n.endswith("input_scale")])

    # compressed-tensors NVFP4, and the same weights with the data as safetensors F4
    t = dict(plain)
    f4 = []
    for name, (shape, zb) in nvfp4_shapes.items():
        x = bf16_weights(rng, shape, zero_block=zb)
        packed, ws, gs, deq = ct_nvfp4(x)
        t[name + "_packed"] = packed
        t[name + "_scale"] = ws
        t[name + "_global_scale"] = np.array([gs], dtype=F32)  # C1: [1]
        t[name.replace(".weight", ".input_global_scale")] = np.array([F32(2688.0) / F32(3.5)], dtype=F32)
        m, k = shape
        all_zero = not ws.any()
        if gs == 1.0 and all_zero:
            amax = F32(0.0)
        else:
            amax = amax_from(gs, te_global_encode, F32(F32(2688.0) / gs), 2688.0 / float(gs))
        bufs, deq_native = native_nvfp4(packed, ws, amax, m, k)
        put("ct_nvfp4", name, bufs, deq, deq_native)
        put("ct_nvfp4_f4", name, bufs, deq, deq_native)
        f4.append((name, shape, packed, ws, gs))
    ct_qc = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
             "quantization_status": "compressed", "ignore": ["lm_head"],
             "config_groups": {"group_0": {"targets": ["Linear"], "format": "nvfp4-pack-quantized",
                                           "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                                       "group_size": 16, "symmetric": True, "dynamic": False}}}}
    save_typed("ct_nvfp4", t, {"quantization_config": json.dumps(ct_qc)},
               f8=[n for n in t if n.endswith(".weight_scale")])
    tensors = []
    for name, shape, packed, ws, gs in f4:
        tensors.append((name + "_packed", "F4", shape, packed.tobytes()))
        tensors.append((name + "_scale", "F8_E4M3", ws.shape, ws.tobytes()))
        tensors.append((name + "_global_scale", "F32", (1,), np.array([gs], dtype=F32).tobytes()))
    write_f4(OUT / "ct_nvfp4_f4.safetensors", tensors, {"quantization_config": json.dumps(ct_qc)})

    fp8_shapes = {
        "model.layers.0.self_attn.o_proj.weight": (48, 96),
        "model.layers.0.mlp.gate_proj.weight": (136, 144),
    }
    # ModelOpt FP8 and compressed-tensors FP8 (per tensor): same bytes, scalar shapes differ
    for file, sshape in (("modelopt_fp8", ()), ("ct_fp8", (1,))):
        t = dict(plain)
        for name, shape in fp8_shapes.items():
            x = bf16_weights(rng, shape)
            q, s, deq = fp8_tensor(x)
            t[name] = q
            t[name + "_scale"] = np.array(s, dtype=F32).reshape(sshape)
            t[name.replace(".weight", ".input_scale")] = np.array(F32(0.5), dtype=F32).reshape(sshape)
            put(file, name, {"rowwise_data": q, "scale_inv": np.array([s], dtype=F32)}, deq, deq)
        if file == "modelopt_fp8":
            t["model.layers.0.self_attn.o_proj._extra_state"] = np.frombuffer(b"\x80\x04N.", dtype=np.uint8)
            qc = {"producer": {"name": "modelopt", "version": "0.0.0-golden"},
                  "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": []}}
        else:
            qc = {"quant_method": "compressed-tensors", "format": "float-quantized"}
        save_typed(file, t, {"quantization_config": json.dumps(qc)},
                   f8=[n for n in fp8_shapes])

    # FP8 128x128 blocks: compressed-tensors (weight_scale) and DeepSeek (weight_scale_inv)
    for file, suffix, qc in (
        ("ct_fp8_block", "_scale", {"quant_method": "compressed-tensors", "format": "float-quantized"}),
        ("deepseek", "_scale_inv", {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                    "weight_block_size": [128, 128]}),
    ):
        t = dict(plain)
        for name, shape in {"model.layers.0.mlp.down_proj.weight": (136, 260),
                            "model.layers.0.self_attn.k_proj.weight": (128, 256)}.items():
            x = bf16_weights(rng, shape)
            q, s, deq = fp8_block(x)
            t[name] = q
            t[name + suffix] = s
            put(file, name, native_block(q, s), deq, fp8_dequant_block(q, s))
        save_typed(file, t, {"quantization_config": json.dumps(qc)}, f8=[n for n in t if n.endswith(".weight") and t[n].dtype == np.uint8])

    # MXFP8: ModelOpt and compressed-tensors
    for file, prod, qc in (
        ("modelopt_mxfp8", modelopt_mxfp8, {"producer": {"name": "modelopt", "version": "0.0.0-golden"},
                                            "quantization": {"quant_algo": "MXFP8", "group_size": 32}}),
        ("ct_mxfp8", ct_mxfp8, {"quant_method": "compressed-tensors", "format": "mxfp8-quantized"}),
    ):
        t = dict(plain)
        for name, shape in {"model.layers.0.mlp.up_proj.weight": (64, 96),
                            "model.layers.0.mlp.gate_proj.weight": (160, 64)}.items():
            x = bf16_weights(rng, shape, zero_block=(32, 0, 32, 32))
            q, byte = prod(x)
            t[name] = q
            t[name + "_scale"] = byte
            deq = mx_dequant(q, byte)
            put(file, name, native_mxfp8(q, byte), deq, deq)
        save_typed(file, t, {"quantization_config": json.dumps(qc)}, f8=list(fp8_names(t)))

    save_file(expected, str(OUT / "expected.safetensors"), metadata={"source": "tests/golden/interop.py"})
    print(f"wrote {len(list(OUT.glob('*.safetensors')))} files to {OUT}")


def fp8_names(t):
    return [n for n in t if n.endswith(".weight") and t[n].dtype == np.uint8]


def save_typed(stem, tensors, metadata, f8):
    """safetensors.numpy writes neither F8_E4M3 nor BF16: write the bytes as U8 / U16,
    then rewrite the header with the real dtype strings (offsets are relative to the
    data section, so only the header changes)."""
    path = OUT / f"{stem}.safetensors"
    fixed = {}
    for k, v in tensors.items():
        v = np.asarray(v)
        if not v.flags.c_contiguous:
            v = v.copy()  # (np.ascontiguousarray would turn 0-d scalars into [1])
        if v.dtype == md.bfloat16:
            v = v.view(np.uint16)
        fixed[k] = v
    save_file(fixed, str(path), metadata=metadata)
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    for name, v in tensors.items():
        if np.asarray(v).dtype == md.bfloat16:
            header[name]["dtype"] = "BF16"
    for name in f8:
        assert header[name]["dtype"] == "U8", name
        header[name]["dtype"] = "F8_E4M3"
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n:])


if __name__ == "__main__":
    main()
