"""Attention: head shapes checked against the tensors, and sliding-window layers."""

from __future__ import annotations

from scaffold.checkpoint import Checkpoint
from scaffold.detect.common import config_value
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import Source, Spec


def _rows(ckpt: Checkpoint, name: str) -> int | None:
    info = ckpt.tensors.get(name)
    return info.shape[0] if info else None


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    expected = {"q_proj": q, "k_proj": kv, "v_proj": kv} if spec.qkv_layout == "separate" else {"qkv_proj": q + 2 * kv}
    for layer in range(spec.num_layers):
        for proj, rows in expected.items():
            name = f"model.layers.{layer}.self_attn.{proj}.weight"
            info = ckpt.tensors.get(name)
            if info is None:
                raise CheckpointError(f"tensor {name} is missing.", where)
            if info.shape != (rows, spec.hidden_size):
                raise CheckpointError(
                    f"tensor {name} has shape {list(info.shape)}, but {spec.num_heads} query heads and "
                    f"{spec.num_kv_heads} KV heads of size {spec.head_dim} over hidden size {spec.hidden_size} "
                    f"need [{rows}, {spec.hidden_size}].",
                    where,
                )
    if spec.head_dim % 2:
        raise UnsupportedArchitecture(f"head_dim {spec.head_dim} is odd; rotary embeddings need an even size.", where)

    key, window = config_value(ckpt, "sliding_window")
    enabled = ckpt.config.get("use_sliding_window", True) is not False
    if key is None or not enabled:
        spec.set("sliding_window", None, Source("config", "no sliding_window in config.json" if key is None
                                                 else "config.json use_sliding_window is false"))
        spec.set("sliding_window_layers", [], Source("config", "no sliding window"))
        return
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise CheckpointError(f"config key 'sliding_window' must be a positive integer, not {window!r}.", where)
    spec.set("sliding_window", window, Source("config", "config.json sliding_window", "config.sliding_window"))
    layer_types = ckpt.config.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != spec.num_layers:
            raise CheckpointError(f"config key 'layer_types' must list one type for each of {spec.num_layers} layers.",
                                  where)
        unknown = sorted({t for t in layer_types if t not in ("sliding_attention", "full_attention")})
        if unknown:
            raise UnsupportedArchitecture(f"layer type(s) {unknown} in 'layer_types' are not supported.", where)
        layers = [i for i, t in enumerate(layer_types) if t == "sliding_attention"]
        spec.set("sliding_window_layers", layers, Source("config", "config.json layer_types"))
    else:
        spec.set("sliding_window_layers", list(range(spec.num_layers)),
                 Source("config", "sliding_window without layer_types: every layer"))
