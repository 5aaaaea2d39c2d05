"""A lab checkpoint whose MLP has a width of each layer's own, the way Gemma-3n writes it (config.json's
intermediate_size holds one width per layer; the MLP's __init__ takes the layer's index and reads its own entry).

It is a tiny Qwen3 (scaffold.tiny.build_tiny) shipped as remote code: transformers' own modeling_qwen3.py with its
relative imports made absolute and

    self.mlp = Qwen3MLP(config, layer_idx)          # the decoder layer
    self.intermediate_size = config.intermediate_size[layer_idx]   # the MLP

each layer's gate, up and down projections cut (or grown with fresh random rows) to that layer's width.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ckpt_factory import edit_once, lab_modeling_source

NAME = "widths"
ARCHITECTURE = "WidthsForCausalLM"
WIDTHS = [192, 320, 256]  # BASE's 3 layers (its intermediate_size is 256)


def modeling_source() -> str:
    text = lab_modeling_source("qwen3", "Qwen3Config", NAME, "WidthsConfig")
    text = edit_once(text, "class Qwen3MLP(nn.Module):\n    def __init__(self, config):\n",
                 "class Qwen3MLP(nn.Module):\n    def __init__(self, config, layer_idx):\n")
    text = edit_once(text, "        self.intermediate_size = config.intermediate_size\n",
                 "        self.intermediate_size = config.intermediate_size[layer_idx]\n")
    text = edit_once(text, "        self.mlp = Qwen3MLP(config)\n", "        self.mlp = Qwen3MLP(config, layer_idx)\n")
    return text.replace("Qwen3ForCausalLM", ARCHITECTURE)


CONFIGURATION = f'''from huggingface_hub.dataclasses import strict
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config


@strict
class WidthsConfig(Qwen3Config):
    model_type = "{NAME}"
    intermediate_size: int | list[int] = 22016
'''


def build(out: Path, *, widths: list[int] = WIDTHS, seed: int = 0, std: float = 0.08) -> Path:
    """Write the checkpoint into `out` (created; replaced if there) and return it."""
    import torch
    from safetensors.torch import load_file, save_file

    from scaffold.tiny import build_tiny

    out = Path(out)
    base = build_tiny("qwen3", out.parent / f".{out.name}-qwen3", seed=seed, std=std)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tensors = {}
    for file in sorted(base.glob("*.safetensors")):
        tensors.update(load_file(file))
    config = json.loads((base / "config.json").read_text())
    assert len(widths) == config["num_hidden_layers"]
    generator = torch.Generator().manual_seed(seed + 1)
    for layer, width in enumerate(widths):
        for proj, axis in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
            name = f"model.layers.{layer}.mlp.{proj}.weight"
            weight = tensors[name]
            have = weight.shape[axis]
            if width <= have:
                weight = weight.narrow(axis, 0, width)
            else:
                shape = list(weight.shape)
                shape[axis] = width - have
                weight = torch.cat([weight, std * torch.randn(*shape, generator=generator)], dim=axis)
            tensors[name] = weight.contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.update(model_type=NAME, architectures=[ARCHITECTURE], intermediate_size=list(widths),
                  auto_map={"AutoConfig": f"configuration_{NAME}.WidthsConfig",
                            "AutoModelForCausalLM": f"modeling_{NAME}.{ARCHITECTURE}"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / f"configuration_{NAME}.py").write_text(CONFIGURATION)
    (out / f"modeling_{NAME}.py").write_text(modeling_source())
    shutil.rmtree(base)
    return out
