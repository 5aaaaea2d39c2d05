"""The float32 copy of a quantized checkpoint that verify's transformers reference runs on.

transformers loads AWQ, GPTQ and compressed-tensors checkpoints only through packages with their
own kernels (autoawq, gptqmodel, compressed-tensors), and FP8 only on GPUs. verify does not depend
on any of them: it writes a copy of the checkpoint whose quantized linears hold the weights they
stand for, dequantized here ((q - zero) * scale, per the method's layout), with
`quantization_config` removed, and runs the reference on that. The reference then computes with
exactly the weights the port's kernels compute with; what is left between the two is the kernels'
arithmetic (activations in bf16, or quantized to int8 or fp8 on the fly), which TOLERANCES states
per scheme.

The layouts are scaffold.quantized's (the ones the reader accepts): AWQ 4-bit GEMM, GPTQ 4-bit v1
format without act-order, compressed-tensors int-quantized (W8A8) and pack-quantized (W4A16), FP8
per tensor, per channel or block-wise. One output shard per input shard, so memory stays bounded by
the largest shard in float32.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from scaffold.checkpoint import Checkpoint
from scaffold.errors import CheckpointError
from scaffold.quantized import (
    AWQ,
    AWQ_PACK,
    FP8,
    FP8_BLOCK,
    GPTQ,
    INT8,
    KV_CACHE_SCALES,
    PACKED,
    Layout,
    layout,
    quantization_method,
)

# The dtype the port runs in: float32 where vLLM's CPU build runs the scheme in it (W8A8 int8), else
# bfloat16 (its AWQ and GPTQ kernels take half precision only, its W4A16 kernel no float32).
ENGINE_DTYPES = {"w8a8-int8": "float32"}
DEFAULT_ENGINE_DTYPE = "bfloat16"
# Max |Δ log-prob| (top-20 tokens, every position) allowed between the port, computing with the quantized
# kernels, and transformers in float32 on the dequantized weights. Weight-only schemes differ by the
# bf16 rounding of the activations (0.09 to 0.10 measured on the tests' tiny random checkpoints); W8A8 quantizes
# every activation to int8 per token on the fly, FP8 to fp8 (0.55 measured for W8A8 in float32). Each
# with margin; a port computing something else is off by whole nats (tests/test_verify_quantized.py).
TOLERANCES = {"awq": 0.15, "gptq": 0.15, "w4a16": 0.15, "w8a8-int8": 1.0, "fp8": 1.0}


def engine_dtype(scheme_name: str) -> str:
    return ENGINE_DTYPES.get(scheme_name, DEFAULT_ENGINE_DTYPE)


def scheme(config: dict) -> str | None:
    """The key of TOLERANCES for a quantized checkpoint's config, None for a float one."""
    method = quantization_method(config)
    if method is None:
        return None
    if method in ("awq", "gptq", "fp8"):
        return method
    return "w8a8-int8" if config["quantization_config"].get("format") == "int-quantized" else "w4a16"


AWQ_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # nibble of each of eight consecutive output columns (AutoAWQ's packing)


def _unpack(packed, along: int, order=range(AWQ_PACK)):
    """4-bit values from int32s holding eight each, value i of eight in nibble order[i], spread along dim `along`."""
    import torch  # deferred on purpose: `scaffold verify --static-only` never needs torch

    words = packed.to(torch.int64) & 0xFFFFFFFF
    parts = [(words >> (4 * position)) & 0xF for position in order]
    stacked = torch.stack(parts, dim=along + 1)  # [..., n, 8] along `along`
    shape = list(packed.shape)
    shape[along] *= AWQ_PACK
    return stacked.reshape(shape)



def _group_size(config: dict) -> int:
    quant = config["quantization_config"]
    return quant.get("group_size", quant.get("q_group_size"))


def _ct_weights(config: dict) -> dict:
    groups = config["quantization_config"]["config_groups"]
    return next(iter(groups.values()))["weights"]


def dequantized_weight(lay: Layout, parts: dict, config: dict):
    """The float32 [out, in] weight of one module stored in layout `lay`; parts maps its suffixes to tensors."""
    import torch  # deferred on purpose, as above

    if lay is AWQ:
        group = _group_size(config)
        q = _unpack(parts["qweight"], 1, AWQ_ORDER).float()  # [in, out]
        zeros = _unpack(parts["qzeros"], 1, AWQ_ORDER).float().repeat_interleave(group, dim=0)
        scales = parts["scales"].float().repeat_interleave(group, dim=0)
        return ((q - zeros) * scales).t().contiguous()
    if lay is GPTQ:
        q = _unpack(parts["qweight"], 0).float()  # [in, out], input 8k + i in bits 4i of row k
        fan_in = q.shape[0]
        g_idx = parts.get("g_idx")
        g_idx = g_idx.long() if g_idx is not None else torch.arange(fan_in) // _group_size(config)
        zeros = _unpack(parts["qzeros"], 1).float() + 1  # v1 format stores zero - 1
        return ((q - zeros[g_idx]) * parts["scales"].float()[g_idx]).t().contiguous()
    if lay is INT8:
        q = parts["weight"].float()
        zero = parts.get("weight_zero_point")
        scale = parts["weight_scale"].float()
        return (q - (zero.float() if zero is not None else 0.0)) * _per_row(scale, q.shape)
    if lay is PACKED:
        rows, cols = (int(v) for v in parts["weight_shape"].tolist())
        if "weight_zero_point" in parts:
            raise ValueError("asymmetric pack-quantized weights (weight_zero_point) are not dequantized here")
        q = _unpack(parts["weight_packed"], 1)[:, :cols].float() - 8
        scale = parts["weight_scale"].float()
        if scale.dim() == 2 and scale.shape[1] > 1:
            group = _ct_weights(config).get("group_size") or math.ceil(cols / scale.shape[1])
            scale = scale.repeat_interleave(group, dim=1)[:, :cols]
        return q[:rows] * _per_row(scale, (rows, cols))
    if lay is FP8:
        w = parts["weight"].float()
        return w * _per_row(parts["weight_scale"].float(), w.shape)
    if lay is FP8_BLOCK:
        w = parts["weight"].float()
        rows, cols = config["quantization_config"]["weight_block_size"]
        scale = parts["weight_scale_inv"].float().repeat_interleave(rows, dim=0).repeat_interleave(cols, dim=1)
        return w * scale[: w.shape[0], : w.shape[1]]
    raise ValueError(f"no dequantization for layout {lay.main}")


def _per_row(scale, shape):
    """A scale of one value, one per output row or one per element, broadcast over [out, in]."""
    if scale.numel() == 1:
        return scale.reshape(())
    if scale.numel() == shape[0]:
        return scale.reshape(shape[0], 1)
    return scale.reshape(shape)


def write_dequantized(ckpt: Checkpoint, out: Path) -> Path:
    """A float32 copy of the quantized checkpoint at `out` (see the module docstring); returns `out`."""
    import torch  # deferred on purpose, as above
    from safetensors import safe_open
    from safetensors.torch import save_file

    config = json.loads(ckpt.config_file.read_text(encoding="utf-8"))
    layouts = layout(config, ckpt.config_file)
    files = {}  # tensor name -> shard file
    for shard in sorted(ckpt.path.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            files.update(dict.fromkeys(f.keys(), shard))
    modules = {}  # module -> layout, for every module whose main tensor is quantized
    for name in files:
        module, _, kind = name.rpartition(".")
        for lay in layouts:
            if kind == lay.main and (lay.main != "weight" or f"{module}.{lay.required[0]}" in files):
                modules[module] = lay
    taken = {f"{m}.{p}" for m, lay in modules.items() for p in (lay.main, *lay.required, *lay.optional)}
    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for shard in sorted(set(files.values())):
        tensors = {}
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                module, _, kind = name.rpartition(".")
                if name.endswith(KV_CACHE_SCALES) or (name in taken and kind != modules[module].main):
                    continue
                if name in taken:
                    lay = modules[module]
                    parts = {}
                    for part in (lay.main, *lay.required, *lay.optional):
                        where = files.get(f"{module}.{part}")
                        if where is not None:
                            with safe_open(str(where), framework="pt") as g:
                                parts[part] = g.get_tensor(f"{module}.{part}")
                    try:
                        tensors[f"{module}.weight"] = dequantized_weight(lay, parts, config)
                    except (ValueError, RuntimeError) as exc:
                        raise CheckpointError(f"cannot dequantize {module} for the reference: {exc}", shard) from exc
                else:
                    tensors[name] = f.get_tensor(name).to(torch.float32)
        save_file(tensors, str(out / shard.name), metadata={"format": "pt"})
        index.update(dict.fromkeys(tensors, shard.name))
    if len(set(index.values())) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=2))
    config.pop("quantization_config", None)
    config["torch_dtype"] = config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for extra in ckpt.path.iterdir():  # tokenizer, generation config, the modeling source
        if extra.is_file() and not extra.name.endswith((".safetensors", ".safetensors.index.json")) \
                and extra.name != "config.json":
            shutil.copyfile(extra, out / extra.name)
    return out
