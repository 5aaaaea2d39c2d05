"""Model dimensions, read from config.json and checked against tensor shapes."""

from __future__ import annotations

from scaffold.checkpoint import Checkpoint
from scaffold.detect.common import config_value, set_from_config
from scaffold.errors import CheckpointError
from scaffold.spec import Source, Spec, Undetermined


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    set_from_config(spec, ckpt, "hidden_size", ("hidden_size", "n_embd", "d_model"), int)
    set_from_config(spec, ckpt, "num_layers", ("num_hidden_layers", "n_layer", "num_layers"), int)
    set_from_config(spec, ckpt, "num_heads", ("num_attention_heads", "n_head"), int)
    set_from_config(spec, ckpt, "vocab_size", ("vocab_size",), int)
    set_from_config(spec, ckpt, "max_position", ("max_position_embeddings", "n_positions"), int, default=2048)
    if unknown := [spec.unknowns[n] for n in ("hidden_size", "num_layers", "num_heads", "vocab_size")
                   if n in spec.unknowns]:
        raise Undetermined(*unknown)  # the checks and the derived sizes below need them
    key, kv = config_value(ckpt, "num_key_value_heads", "num_kv_heads")
    if key is None:
        spec.set("num_kv_heads", spec.num_heads,
                 Source("default", "no num_key_value_heads: one KV head per query head",
                        spec.source("num_heads").expr))
    else:
        set_from_config(spec, ckpt, "num_kv_heads", (key,), int)
    for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size"):
        if getattr(spec, name) <= 0:
            raise CheckpointError(f"{spec.source(name).detail} must be positive, not {getattr(spec, name)}.", where)
    if spec.num_heads % spec.num_kv_heads:
        raise CheckpointError(
            f"{spec.num_heads} attention heads cannot be shared by {spec.num_kv_heads} KV heads: "
            "the head counts do not divide.",
            where,
        )
    key, head_dim = config_value(ckpt, "head_dim")
    if key is not None:
        set_from_config(spec, ckpt, "head_dim", ("head_dim",), int)
    else:
        if spec.hidden_size % spec.num_heads:
            raise CheckpointError(
                f"hidden size {spec.hidden_size} is not a multiple of {spec.num_heads} heads and there is no head_dim.",
                where,
            )
        hk, nk = spec.source("hidden_size").expr, spec.source("num_heads").expr
        spec.set("head_dim", spec.hidden_size // spec.num_heads,
                 Source("derived", "hidden_size // num_heads", f"{hk} // {nk}" if hk and nk else None))
    key, _ = config_value(ckpt, "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")
    if key is not None:
        set_from_config(spec, ckpt, "intermediate_size", (key,), int)
    else:
        hk = spec.source("hidden_size").expr
        spec.set("intermediate_size", 4 * spec.hidden_size,
                 Source("default", "no intermediate_size: 4 * hidden_size", f"4 * {hk}" if hk else None))
