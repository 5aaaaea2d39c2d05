"""Quantized checkpoints and LoRA adapters built at test time from tiny float checkpoints.

`build_quantized(source, out, architecture, scheme)` quantizes every linear of the decoder of a
Llama- or Qwen3-shaped float checkpoint with torch, in the layout each method's writer produces
(SCHEMES; embedding, norms and head stay float):
- awq: 4-bit GEMM layout, group 64 (AutoAWQ): `qweight` int32 [in, out / 8] (eight 4-bit values
  per int32, packed along the output in AWQ's order), `qzeros` int32 [in / 64, out / 8] packed the
  same way, `scales` fp16 [in / 64, out]; the weight is (q - zero) * scale.
- gptq, gptq-desc-act: 4-bit symmetric, group 64, GPTQ's v1 format (AutoGPTQ): `qweight` int32
  [in / 8, out] packed along the input, `qzeros` [in / 64, out / 8] (zero 8 stored as 7), `scales`
  fp16, `g_idx` int32 [in] (sequential, or permuted for act-order).
- w8a8-int8: compressed-tensors `int-quantized`: `weight` int8 [out, in], `weight_scale` [out, 1];
  activations per token at run time.
- w4a16: compressed-tensors `pack-quantized`: `weight_packed` int32 [out, in / 8] (value + 8),
  `weight_scale` [out, in / 64], `weight_shape` int64 [2].
- fp8, fp8-block: `weight` float8_e4m3fn [out, in] with `weight_scale` [] (per tensor) or
  `weight_scale_inv` [out / 64, in / 64] (block-wise); dynamic activations.
`kv_scales=True` adds `k_proj.k_scale` / `v_proj.v_scale`, as FP8 checkpoints store them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# Nibble position of each of eight consecutive output columns inside one int32 (AWQ's order;
# vLLM unpacks with its inverse, [0, 4, 1, 5, 2, 6, 3, 7]).
AWQ_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]
GROUP = 64
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# vLLM's own class for each float shape the tests quantize, and the model_type scaffold.tiny builds it from.
SHAPES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def pack_awq(values):
    """int32 [rows, cols / 8] from 4-bit values [rows, cols]: column 8j + i in nibble AWQ_ORDER[i] of int j."""
    import torch

    rows, cols = values.shape
    grouped = values.to(torch.int64).view(rows, cols // 8, 8)
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for i, position in enumerate(AWQ_ORDER):
        packed |= grouped[:, :, i] << (4 * position)
    return packed.to(torch.int32)  # values above 2**31 wrap, as AutoAWQ's int32 does


def quantize_awq(weight):
    """(qweight, qzeros, scales) of a [out, in] float weight, asymmetric 4-bit per group of 64 inputs."""
    import torch

    w = weight.float().t().contiguous()  # [in, out]
    fan_in, out = w.shape
    groups = w.view(fan_in // GROUP, GROUP, out)
    low, high = groups.amin(dim=1), groups.amax(dim=1)
    scales = ((high - low).clamp(min=1e-5) / 15).to(torch.float16)
    zeros = torch.round(-low / scales.float()).clamp(0, 15)
    q = torch.round(groups / scales.float()[:, None, :] + zeros[:, None, :]).clamp(0, 15)
    return pack_awq(q.view(fan_in, out)), pack_awq(zeros), scales


def quantize_gptq(weight, desc_act: bool):
    """GPTQ v1 layout, symmetric 4-bit per group of 64 inputs: (qweight int32 [in / 8, out], packed along the
    input, value i of eight in bits 4i; qzeros int32 [in / 64, out / 8], zero 8 stored as 7 (v1 stores
    zero - 1); scales fp16 [in / 64, out]; g_idx int32 [in], the group of each input). With desc_act the
    groups take the inputs in a permuted order, as act-order quantization writes them."""
    import torch

    w = weight.float().t().contiguous()  # [in, out]
    fan_in, out = w.shape
    order = torch.randperm(fan_in, generator=torch.Generator().manual_seed(1)) if desc_act else torch.arange(fan_in)
    g_idx = torch.empty(fan_in, dtype=torch.int32)
    g_idx[order] = (torch.arange(fan_in) // GROUP).to(torch.int32)
    scales = torch.empty(fan_in // GROUP, out)
    for group in range(fan_in // GROUP):
        scales[group] = w[g_idx == group].abs().amax(dim=0).clamp(min=1e-5) / 7
    scales = scales.to(torch.float16)
    q = (torch.round(w / scales.float()[g_idx.long()]) + 8).clamp(0, 15).to(torch.int64)
    qweight = torch.zeros(fan_in // 8, out, dtype=torch.int64)
    for i in range(8):
        qweight |= q[i::8] << (4 * i)
    zeros = torch.full((fan_in // GROUP, out // 8), sum(7 << (4 * i) for i in range(8)), dtype=torch.int64)
    return {"qweight": qweight.to(torch.int32), "qzeros": zeros.to(torch.int32), "scales": scales,
            "g_idx": g_idx}


def quantize_int8(weight):
    """compressed-tensors W8A8 int8: weight int8 [out, in], symmetric per output channel, weight_scale [out, 1]."""
    import torch

    w = weight.float()
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-5) / 127
    return {"weight": torch.round(w / scale).clamp(-128, 127).to(torch.int8), "weight_scale": scale.to(torch.float16)}


def quantize_w4a16(weight):
    """compressed-tensors pack-quantized W4A16: weight_packed int32 [out, in / 8] (value + 8, value i of eight
    along the input in bits 4i), weight_scale [out, in / 64], weight_shape int64 [out, in]."""
    import torch

    w = weight.float()
    rows, cols = w.shape
    scale = w.view(rows, cols // GROUP, GROUP).abs().amax(dim=2).clamp(min=1e-5) / 7
    q = torch.round(w / scale.repeat_interleave(GROUP, dim=1)).clamp(-8, 7).to(torch.int64) + 8
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for i in range(8):
        packed |= q[:, i::8] << (4 * i)
    return {"weight_packed": packed.to(torch.int32), "weight_scale": scale.to(torch.float16),
            "weight_shape": torch.tensor([rows, cols], dtype=torch.int64)}


def quantize_fp8(weight, block: int | None = None):
    """FP8 (e4m3) weight [out, in] with one float32 scale (weight_scale) or, block-wise, one per block of
    block x block (weight_scale_inv [out / block, in / block]; despite its name the weight is fp8 times it,
    as DeepSeek-V3's checkpoints store it)."""
    import torch

    w = weight.float()
    top = torch.finfo(torch.float8_e4m3fn).max
    if block is None:
        scale = w.abs().amax().clamp(min=1e-5) / top
        return {"weight": (w / scale).to(torch.float8_e4m3fn), "weight_scale": scale.reshape(())}
    rows, cols = w.shape
    blocks = w.view(rows // block, block, cols // block, block)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-5) / top
    q = (blocks / scale[:, None, :, None]).view(rows, cols).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": scale}


def ct_config(fmt: str, weights: dict, activations: dict | None) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": activations, "output_activations": None}}}


def _int_args(bits: int, strategy: str, **extra) -> dict:
    return {"num_bits": bits, "type": "int", "symmetric": True, "strategy": strategy, "dynamic": False, **extra}


FP8_BLOCK = 64
# Each scheme: (quantize one [out, in] weight into its tensors, quantization_config, dtype of the rest).
SCHEMES = {
    "awq": (lambda w: dict(zip(("qweight", "qzeros", "scales"), quantize_awq(w), strict=True)),
            {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"},
            "float16"),
    "gptq": (lambda w: quantize_gptq(w, desc_act=False),
             {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": True,
              "checkpoint_format": "gptq"}, "float16"),
    "gptq-desc-act": (lambda w: quantize_gptq(w, desc_act=True),
                      {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": True, "sym": True,
                       "checkpoint_format": "gptq"}, "float16"),
    "w8a8-int8": (quantize_int8,
                  ct_config("int-quantized", _int_args(8, "channel"),
                            {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}),
                  "float16"),
    "w4a16": (quantize_w4a16, ct_config("pack-quantized", _int_args(4, "group", group_size=GROUP), None), "float16"),
    "fp8": (quantize_fp8, {"quant_method": "fp8", "activation_scheme": "dynamic"}, "bfloat16"),
    "fp8-block": (lambda w: quantize_fp8(w, block=FP8_BLOCK),
                  {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [FP8_BLOCK] * 2},
                  "bfloat16"),
}
def build_quantized(source: Path, out: Path, architecture: str, scheme: str, kv_scales: bool = False) -> Path:
    """A copy of the float Llama-shaped checkpoint `source` with every linear of the decoder quantized by
    `scheme` (a key of SCHEMES), its `architectures` set to `architecture`. kv_scales adds per-layer
    k_scale / v_scale tensors under k_proj / v_proj, where FP8 checkpoints keep them."""
    import torch
    from safetensors.torch import load_file, save_file

    quantize, quant_config, dtype = SCHEMES[scheme]
    tensors = {}
    for shard in sorted(source.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    quantized = {}
    for name, tensor in tensors.items():
        module, _, kind = name.rpartition(".")
        if kind == "weight" and module.rsplit(".", 1)[-1] in LINEARS:
            for part, value in quantize(tensor).items():
                quantized[f"{module}.{part}"] = value
            if kv_scales and module.endswith((".k_proj", ".v_proj")):
                quantized[f"{module}.{module[-6]}_scale"] = torch.tensor(1.0)
        else:
            quantized[name] = tensor.to(getattr(torch, dtype))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    save_file(quantized, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config.update(architectures=[architecture], torch_dtype=dtype, dtype=dtype, quantization_config=quant_config)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for extra in ("generation_config.json",):
        if (source / extra).exists():
            shutil.copyfile(source / extra, out / extra)
    return out


def build_awq(source: Path, out: Path, architecture: str) -> Path:
    """An AWQ copy of the float Llama-shaped checkpoint `source`, its `architectures` set to `architecture`."""
    return build_quantized(source, out, architecture, "awq")


def with_architecture(source: Path, out: Path, architecture: str) -> Path:
    """A copy of `source` whose config.json names `architecture` (the same tensors)."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source, out)
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = [architecture]
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def build_lora(base: Path, out: Path, rank: int = 8, seed: int = 0) -> Path:
    """A PEFT-layout LoRA adapter for every linear of the decoder of the Llama-shaped `base`.

    adapter_config.json and adapter_model.safetensors with
    base_model.model.<module>.lora_A.weight [rank, in] and .lora_B.weight [out, rank]; B is
    not zero, so the adapter changes every projection.
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    shapes = {}
    for shard in sorted(base.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                module, _, kind = name.rpartition(".")
                if kind == "weight" and module.rsplit(".", 1)[-1] in LINEARS:
                    shapes[module] = tuple(f.get_slice(name).get_shape())
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (rows, cols) in sorted(shapes.items()):
        tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, cols, generator=generator) * 0.1
        tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(rows, rank, generator=generator) * 0.1
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 16, "lora_dropout": 0.0,
              "bias": "none", "target_modules": list(LINEARS), "base_model_name_or_path": str(base),
              "fan_in_fan_out": False, "inference_mode": True}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
