"""Llama-family checkpoints written byte by byte, without torch: config.json, real safetensors headers.

The robustness and property tests build many checkpoints and then break them in
precise ways (a byte of a header, one tensor's shape, one index entry). Writing
the files directly makes each one cost milliseconds and makes every corruption
exact. Tensor data is deterministic random float32 (so a mapping test that
compares values can see a swapped shard), or zeros.
"""

from __future__ import annotations

import importlib.util
import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


@dataclass
class Shape:
    """One Llama-family decoder, in the terms its config.json uses."""

    family: str = "llama"
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    explicit_head_dim: bool = True
    layers: int = 2
    intermediate: int = 96
    vocab: int = 128
    tie: bool = False
    attention_bias: bool = False  # q, k, v (and o for llama/qwen3) biases
    mlp_bias: bool = False  # llama only
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] | None = None  # qwen2/qwen3: which layers slide (None: every layer)
    model_type: str | None = None  # None: the family's own model_type
    architecture: str = "FactoryLlamaForCausalLM"
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    extra: dict = field(default_factory=dict)  # further config.json keys


def config_for(shape: Shape) -> dict:
    family = shape.family
    config = {
        "architectures": [shape.architecture],
        "model_type": shape.model_type or family,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "vocab_size": shape.vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": shape.tie,
        "torch_dtype": "float32",
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    if shape.explicit_head_dim or shape.hidden != shape.heads * shape.head_dim:
        config["head_dim"] = shape.head_dim
    if family in ("llama", "qwen3"):
        config["attention_bias"] = shape.attention_bias
    if family == "llama":
        config["mlp_bias"] = shape.mlp_bias
    if family == "mistral":
        config["sliding_window"] = shape.sliding_window
    if family in ("qwen2", "qwen3"):
        config["use_sliding_window"] = shape.sliding_window is not None
        config["sliding_window"] = shape.sliding_window
        config["max_window_layers"] = shape.layers
        sliding = set(range(shape.layers) if shape.sliding_layers is None else shape.sliding_layers)
        if shape.sliding_window is not None:
            config["layer_types"] = ["sliding_attention" if i in sliding else "full_attention"
                                     for i in range(shape.layers)]
    config.update(shape.extra)
    return config


def tensors_for(shape: Shape) -> dict[str, list[int]]:
    """Tensor name -> shape, as transformers saves the family (biases where the family has them)."""
    h, q, kv, inter = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    qkv_bias = shape.attention_bias or shape.family == "qwen2"
    o_bias = shape.attention_bias and shape.family in ("llama", "qwen3")
    mlp_bias = shape.mlp_bias and shape.family == "llama"
    out: dict[str, list[int]] = {"model.embed_tokens.weight": [shape.vocab, h]}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = [h]
        out[p + "post_attention_layernorm.weight"] = [h]
        for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            out[p + f"self_attn.{proj}.weight"] = [rows, h]
            if qkv_bias:
                out[p + f"self_attn.{proj}.bias"] = [rows]
        out[p + "self_attn.o_proj.weight"] = [h, q]
        if o_bias:
            out[p + "self_attn.o_proj.bias"] = [h]
        if shape.family == "qwen3":
            out[p + "self_attn.q_norm.weight"] = [shape.head_dim]
            out[p + "self_attn.k_norm.weight"] = [shape.head_dim]
        out[p + "mlp.gate_proj.weight"] = [inter, h]
        out[p + "mlp.up_proj.weight"] = [inter, h]
        out[p + "mlp.down_proj.weight"] = [h, inter]
        if mlp_bias:
            out[p + "mlp.gate_proj.bias"] = [inter]
            out[p + "mlp.up_proj.bias"] = [inter]
            out[p + "mlp.down_proj.bias"] = [h]
    out["model.norm.weight"] = [h]
    if not shape.tie:
        out["lm_head.weight"] = [shape.vocab, h]
    return out


def header_bytes(entries: dict[str, dict]) -> bytes:
    """The 8-byte length and the JSON header, compact (no whitespace byte is insignificant)."""
    raw = json.dumps(entries, separators=(",", ":")).encode()
    return struct.pack("<Q", len(raw)) + raw


def write_shard(path: Path, tensors: dict[str, list[int]], *, data: str = "random", seed: int = 0,
                dtype: str = "F32") -> None:
    """One safetensors file: header plus data, each tensor right after the previous one."""
    entries, offset = {}, 0
    for name, dims in tensors.items():
        size = math.prod(dims) * DTYPE_BYTES[dtype]
        entries[name] = {"dtype": dtype, "shape": list(dims), "data_offsets": [offset, offset + size]}
        offset += size
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(header_bytes(entries))
        for name, dims in tensors.items():
            n = math.prod(dims)
            if data == "zeros" or n == 0:
                f.write(bytes(n * DTYPE_BYTES[dtype]))
            elif name.endswith("norm.weight"):
                f.write((1.0 + 0.1 * rng.standard_normal(n)).astype("<f4").tobytes())
            else:
                f.write((0.08 * rng.standard_normal(n)).astype("<f4").tobytes())


def write_checkpoint(root: Path, shape: Shape, *, shards: int = 1, data: str = "random", seed: int = 0,
                     tensors: dict[str, list[int]] | None = None, config: dict | None = None) -> Path:
    """A checkpoint folder: config.json, one or more shards (with an index when more than one)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tensors = tensors_for(shape) if tensors is None else tensors
    (root / "config.json").write_text(json.dumps(config_for(shape) if config is None else config, indent=2))
    names = list(tensors)
    if shards == 1:
        write_shard(root / "model.safetensors", tensors, data=data, seed=seed)
        return root
    per = math.ceil(len(names) / shards)
    weight_map = {}
    for s in range(shards):
        part = names[s * per:(s + 1) * per]
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_shard(root / file, {n: tensors[n] for n in part}, data=data, seed=seed + s)
        weight_map.update({n: file for n in part})
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
    return root


def read_header(path: Path) -> tuple[dict, int]:
    """(header entries, header length) of a shard written here."""
    blob = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), n


def rewrite_header(path: Path, entries: dict, *, data: bytes | None = None) -> None:
    """Replace a shard's header, keeping (or replacing) its data bytes."""
    blob = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    body = blob[8 + n:] if data is None else data
    Path(path).write_bytes(header_bytes(entries) + body)


def shard_of(root: Path, tensor: str) -> Path:
    index = root / "model.safetensors.index.json"
    if index.exists():
        return root / json.loads(index.read_text())["weight_map"][tensor]
    return root / "model.safetensors"


def tiny_base(model_type: str, out: Path, *, overrides: dict, seed: int) -> tuple[dict, dict]:
    """A lab checkpoint's starting point: transformers' tiny `model_type` built beside `out` (random weights, `seed`),
    its tensors and config.json read back and the build removed; `out` made empty (replaced if there)."""
    import shutil

    from safetensors.torch import load_file

    from scaffold.tiny import build_tiny

    tiny = build_tiny(model_type, out.parent / f".{out.name}-{model_type}", overrides=overrides, seed=seed)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tensors = {}
    for file in sorted(tiny.glob("*.safetensors")):
        tensors.update(load_file(file))
    config = json.loads((tiny / "config.json").read_text())
    shutil.rmtree(tiny)
    return tensors, config


def stack_experts(tensors: dict) -> None:
    """Experts transformers saves one tensor per expert and projection, held 3-D as a lab's class holds them:
    [gate; up] rows of every expert in gate_up_proj, and down_proj (in place)."""
    import re

    import torch

    per_expert = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
    experts: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
    for name in [n for n in tensors if per_expert.fullmatch(n)]:
        prefix, e, proj = per_expert.fullmatch(name).groups()
        experts.setdefault(prefix, {})[(int(e), proj)] = tensors.pop(name)
    for prefix, parts in experts.items():
        count = 1 + max(e for e, _ in parts)
        tensors[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([parts[(e, "gate_proj")], parts[(e, "up_proj")]]) for e in range(count)]).contiguous()
        tensors[f"{prefix}.down_proj"] = torch.stack([parts[(e, "down_proj")] for e in range(count)]).contiguous()


def edit_once(text: str, old: str, new: str) -> str:
    """Replace `old`, which must occur exactly once: a transformers release that rewrites it fails here."""
    assert text.count(old) == 1, f"the modeling source: expected one {old!r}, found {text.count(old)}"
    return text.replace(old, new)


def lab_modeling_source(model: str, family_config: str, name: str, lab_config: str, *, before: str = "") -> str:
    """transformers' modeling_{model}.py as a lab's remote code (the lab checkpoint builders edit it further): its
    relative imports made absolute, its config class imported from the lab's configuration_{name}.py under the
    family's name; `before`: text put ahead of that import."""
    root = Path(next(iter(importlib.util.find_spec("transformers").submodule_search_locations)))
    text = (root / "models" / model / f"modeling_{model}.py").read_text(encoding="utf-8")
    text = text.replace("from ... import", "from transformers import").replace("from ...", "from transformers.")
    return edit_once(text, f"from .configuration_{model} import {family_config}",
                     f"{before}from .configuration_{name} import {lab_config} as {family_config}")
