"""Tiny random-weight checkpoints built from transformers, for tests and twins.

`build_tiny("llama", out, architecture="MyLlamaForCausalLM")` writes a checkpoint
whose `architectures` names a class vLLM does not have, so vLLM can only serve it
through a generated port. Weights are random but deterministic, norm weights are
non-trivial (1 + noise), biases are non-zero, and sizes keep head_dim >= 32 (the
CPU attention backend rejects 16).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

BASE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=256,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)


def tiny_sizes(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """BASE with `overrides`; an override of None removes a BASE key the family's config cannot take
    (Falcon's head_dim is a read-only property)."""
    merged = {**BASE, **(overrides or {})}
    return {k: v for k, v in merged.items() if not (v is None and k in BASE and k in (overrides or {}))}


def randomize(model, std: float) -> None:
    """Deterministic-under-the-seed random weights that make every part matter: norm weights
    1 + noise (never the identity), non-zero biases (routing correction biases too), other weights N(0, std)."""
    import torch  # deferred on purpose: importing scaffold.tiny (verify.twin does) must not import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and param.dim() == 1 and name.endswith("weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn_like(param))
            else:
                param.copy_(std * torch.randn_like(param))
        for name, buffer in model.named_buffers():
            # DeepSeek-V3-style routers keep their correction bias as a buffer (zero at init): random, it
            # changes which experts are chosen, so a port that drops it fails.
            if name.endswith("correction_bias"):
                buffer.copy_(0.1 * torch.randn_like(buffer))
            # Gemma 4 keeps each layer's output scale as a buffer (one at init): far from one, a port that drops it
            # fails.
            if name.endswith("layer_scalar"):
                buffer.copy_(0.5 + torch.rand_like(buffer))


def build_tiny(
    model_type: str,
    out: str | Path,
    *,
    architecture: str | None = None,
    overrides: dict[str, Any] | None = None,
    seed: int = 0,
    std: float = 0.08,
    max_shard_size: str = "500KB",
) -> Path:
    # Deferred on purpose: torch and transformers take seconds to import, and only building a model needs them.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(out)
    config = AutoConfig.for_model(model_type, **tiny_sizes(overrides))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, std)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent if out.parent.exists() else None))
    try:
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size=max_shard_size)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        if architecture:
            cfg["architectures"] = [architecture]
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(tmp), out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
