"""Where every checkpoint tensor goes in the port: vLLM parameter and shard id.

The same table drives `scaffold inspect`, the static checks and REVIEW.md. The
generated model's `load_weights` encodes it independently (its
`stacked_params_mapping`), and the generated tests hold the two against each
other on the real checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scaffold.checkpoint import Checkpoint
from scaffold.spec import Spec

LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

# (checkpoint module within a decoder layer, fused vLLM module, shard id)
STACKED = (
    ("self_attn.q_proj", "self_attn.qkv_proj", "q"),
    ("self_attn.k_proj", "self_attn.qkv_proj", "k"),
    ("self_attn.v_proj", "self_attn.qkv_proj", "v"),
    ("mlp.gate_proj", "mlp.gate_up_proj", 0),
    ("mlp.up_proj", "mlp.gate_up_proj", 1),
)
# Per-layer modules loaded as they are (weight and, where present, bias).
PLAIN_LAYER_MODULES = (
    "input_layernorm",
    "post_attention_layernorm",
    "self_attn.o_proj",
    "self_attn.q_norm",
    "self_attn.k_norm",
    "mlp.down_proj",
)
PLAIN_TOP = ("model.embed_tokens.weight", "model.norm.weight", "model.norm.bias", "lm_head.weight", "lm_head.bias")
# Buffers some checkpoints save that the port recomputes.
SKIPPED = re.compile(r"(^|\.)rotary_emb\.inv_freq$|(^|\.)rotary_emb\.(cos|sin)_cached$")


@dataclass(frozen=True)
class WeightRow:
    checkpoint: str
    param: str | None  # None: skipped on purpose
    shard: str | int | None
    shape: tuple[int, ...]
    note: str = ""


def stacked_modules(spec: Spec) -> list[tuple[str, str, str | int]]:
    """The (checkpoint module, fused module, shard id) entries this spec uses."""
    rows = []
    if spec.qkv_layout == "separate":
        rows += [r for r in STACKED if r[1] == "self_attn.qkv_proj"]
    if spec.mlp_kind == "gated":
        rows += [r for r in STACKED if r[1] == "mlp.gate_up_proj"]
    return rows


def map_tensor(spec: Spec, name: str) -> tuple[str | None, str | int | None] | None:
    """(vLLM parameter, shard id) for one checkpoint tensor; None if the port has no home for it."""
    if SKIPPED.search(name):
        return None, None
    if name in PLAIN_TOP:
        if name.startswith("lm_head") and spec.tie_word_embeddings and name == "lm_head.weight":
            return None, None  # tied: the head is the embedding
        return name, None
    m = LAYER.match(name)
    if not m:
        return None
    layer, rest = m.groups()
    module, _, kind = rest.rpartition(".")
    if kind not in ("weight", "bias"):
        if spec.gate_extra_bias and rest == f"mlp.{spec.gate_extra_bias}":
            return name, None
        return None
    for ckpt_module, fused, shard in stacked_modules(spec):
        if module == ckpt_module:
            return f"model.layers.{layer}.{fused}.{kind}", shard
    if module in PLAIN_LAYER_MODULES:
        return name, None
    if spec.qkv_layout == "fused" and module == "self_attn.qkv_proj":
        return name, None
    if spec.mlp_kind == "gated" and module == "mlp.gate_up_proj":
        return name, None
    return None


def weight_table(spec: Spec, ckpt: Checkpoint) -> tuple[list[WeightRow], list[str]]:
    """Rows for every checkpoint tensor, and the names that have no home in the port."""
    rows, homeless = [], []
    for name in sorted(ckpt.tensors, key=_natural):
        info = ckpt.tensors[name]
        target = map_tensor(spec, name)
        if target is None:
            homeless.append(name)
            continue
        param, shard = target
        note = ""
        if param is None:
            note = "tied to model.embed_tokens.weight" if name.startswith("lm_head") else "recomputed buffer"
        rows.append(WeightRow(name, param, shard, info.shape, note))
    return rows, homeless


def _natural(name: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
