"""Quantized checkpoints and LoRA adapters built at test time from tiny float checkpoints.

AWQ, 4-bit GEMM layout, group 64 (what AutoAWQ writes): for every linear of the decoder,
`qweight` int32 [in, out / 8] (eight 4-bit values per int32, packed along the output in AWQ's
order), `qzeros` int32 [in / 64, out / 8] packed the same way, `scales` fp16 [in / 64, out];
the weight is (q - zero) * scale. Embedding, norms and head stay in fp16.
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


def build_awq(source: Path, out: Path, architecture: str) -> Path:
    """An AWQ copy of the float Llama-shaped checkpoint `source`, its `architectures` set to `architecture`."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = {}
    for shard in sorted(source.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    quantized = {}
    for name, tensor in tensors.items():
        module, _, kind = name.rpartition(".")
        if kind == "weight" and module.rsplit(".", 1)[-1] in LINEARS:
            quantized[f"{module}.qweight"], quantized[f"{module}.qzeros"], quantized[f"{module}.scales"] = (
                quantize_awq(tensor))
        else:
            quantized[name] = tensor.to(torch.float16)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    save_file(quantized, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config.update(architectures=[architecture], torch_dtype="float16", dtype="float16",
                  quantization_config={"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
                                       "version": "gemm"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for extra in ("generation_config.json",):
        if (source / extra).exists():
            shutil.copyfile(source / extra, out / extra)
    return out


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
