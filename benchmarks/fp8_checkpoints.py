"""FP8 checkpoints for the GPU comparison: quant_method "fp8", per-tensor weight scales, dynamic activations.

The layout FP8 releases of Qwen3 and Llama use (and vLLM's Fp8Config reads): every linear of the
decoder as an F8_E4M3 `weight` [out, in] with a float32 `weight_scale` [] (the weight is
fp8 * scale), activations quantized per token at run time (`activation_scheme: dynamic`, so no
`input_scale`); embedding, norms and head in bf16.

    python benchmarks/fp8_checkpoints.py sparse qwen3-4b OUT --architecture BenchQwen3Fp8ForCausalLM
    python benchmarks/fp8_checkpoints.py random qwen3-4b OUT --architecture ...   (on the GPU)

`sparse` writes the headers with holes for the data (what `scaffold new` reads, a few KB on
disk); `random` writes real weights, random bf16 (std 0.02, norms 1) quantized with torch.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkpoints import SHAPES, decoder_tensors

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUANTIZATION_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic"}
DTYPE_BYTES = {"BF16": 2, "F8_E4M3": 1, "F32": 4}


def fp8_tensors(config: dict) -> dict[str, tuple[str, list[int]]]:
    """Name -> (safetensors dtype, shape) of the FP8 checkpoint of `config`."""
    out = {}
    for name, shape in decoder_tensors(config).items():
        module, _, kind = name.rpartition(".")
        if kind == "weight" and module.rsplit(".", 1)[-1] in LINEARS:
            out[name] = ("F8_E4M3", shape)
            out[f"{module}.weight_scale"] = ("F32", [])
        else:
            out[name] = ("BF16", shape)
    return out


def fp8_config(config: dict, architecture: str) -> dict:
    return {**config, "architectures": [architecture], "torch_dtype": "bfloat16",
            "quantization_config": dict(QUANTIZATION_CONFIG)}


def shard_plan(tensors: dict[str, tuple[str, list[int]]], shards: int) -> list[list[str]]:
    """Consecutive names in `shards` groups of about equal bytes."""
    sizes = {n: DTYPE_BYTES[d] * math.prod(s) for n, (d, s) in tensors.items()}
    per_shard, groups, filled = sum(sizes.values()) / shards, [[] for _ in range(shards)], 0
    current = 0
    for name in tensors:
        if filled >= per_shard * (current + 1) and current < shards - 1:
            current += 1
        groups[current].append(name)
        filled += sizes[name]
    return groups


def write_index(root: Path, weight_map: dict[str, str], total: int) -> None:
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def write_sparse(root: Path, config: dict, shards: int, architecture: str) -> Path:
    """config.json, index and safetensors headers of the FP8 checkpoint, the data left as holes."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(fp8_config(config, architecture), indent=2) + "\n")
    tensors = fp8_tensors(config)
    weight_map, total = {}, 0
    for s, group in enumerate(shard_plan(tensors, shards)):
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name in group:
            dtype, shape = tensors[name]
            size = DTYPE_BYTES[dtype] * math.prod(shape)
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(root / fname, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)  # a hole, not data
        weight_map.update(dict.fromkeys(group, fname))
        total += offset
    write_index(root, weight_map, total)
    return root


def quantize_per_tensor(weight):
    """(fp8 weight, float32 scale []) with weight ~= fp8 * scale, the scale mapping |weight|'s max to e4m3's."""
    import torch

    scale = weight.float().abs().amax().clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
    return (weight.float() / scale).to(torch.float8_e4m3fn), scale.reshape(())


def write_random(root: Path, config: dict, shards: int, architecture: str, device: str = "cuda",
                 std: float = 0.02, seed: int = 0) -> Path:
    """Real weights: random bf16 (std `std`, norms 1), every decoder linear quantized to FP8 per tensor."""
    import torch
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(fp8_config(config, architecture), indent=2) + "\n")
    generator = torch.Generator(device=device).manual_seed(seed)
    plan = fp8_tensors(config)
    weight_map, total = {}, 0
    for s, group in enumerate(shard_plan(plan, shards)):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for name in group:
            dtype, shape = plan[name]
            if name.endswith(".weight_scale"):
                continue  # written with its weight
            if "norm" in name:
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
                continue
            value = torch.randn(shape, generator=generator, device=device, dtype=torch.bfloat16) * std
            if dtype == "F8_E4M3":
                weight, scale = quantize_per_tensor(value)
                tensors[name], tensors[name.removesuffix("weight") + "weight_scale"] = weight.cpu(), scale.cpu()
            else:
                tensors[name] = value.cpu()
        save_file(tensors, str(root / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    write_index(root, weight_map, total)
    return root


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["sparse", "random"])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--architecture", required=True)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="where random weights are made (random only)")
    args = parser.parse_args()
    shape = dict(SHAPES[args.shape])
    if args.kind == "sparse":
        print(write_sparse(args.out, shape, args.shards, args.architecture))
    else:
        print(write_random(args.out, shape, args.shards, args.architecture, device=args.device))
