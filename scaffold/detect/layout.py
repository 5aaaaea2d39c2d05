"""Tensor layout: which projections are fused, which carry biases, what is tied.

The tensors are the ground truth here; config flags such as attention_bias only
say what the author meant.
"""

from __future__ import annotations

import re

from scaffold.checkpoint import Checkpoint
from scaffold.detect.sourcecode import added_to_call
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import Source, Spec

# Tensor names that mean an architecture this generator cannot express.
UNSUPPORTED_MARKERS = (
    (re.compile(r"\.(mamba|ssm|mixer)\.|\.A_log$|\.dt_bias$|\.conv1d\."), "state-space (Mamba-style) blocks"),
    (re.compile(r"\.linear_attn\.|\.(recurrent|rwkv|time_mix)\w*\."), "linear or recurrent attention"),
    (re.compile(r"\.(experts|block_sparse_moe|shared_expert)\."), "mixture-of-experts blocks"),
)


def _layer0(ckpt: Checkpoint, rest: str) -> str | None:
    name = f"model.layers.0.{rest}"
    return name if name in ckpt.tensors else None


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    for pattern, feature in UNSUPPORTED_MARKERS:
        hits = sorted(n for n in ckpt.tensors if pattern.search(n))
        if hits:
            raise UnsupportedArchitecture(
                f"the checkpoint uses {feature} (e.g. tensor {hits[0]!r}), which the generator cannot express "
                "yet. If the model's code is compliant with vLLM's transformers backend, serve it with "
                "`vllm serve CKPT --model-impl transformers` instead.",
                where,
            )
    if "model.embed_tokens.weight" not in ckpt.tensors or not _layer0(ckpt, "input_layernorm.weight"):
        sample = ", ".join(sorted(ckpt.tensors)[:4])
        raise UnsupportedArchitecture(
            "the tensors do not follow the decoder layout the generator knows "
            f"(model.embed_tokens, model.layers.N.input_layernorm, ...); found e.g. {sample}.",
            where,
        )

    def has(rest: str) -> bool:
        return _layer0(ckpt, rest) is not None

    def tensor_source(rest: str) -> Source:
        return Source("tensor", f"model.layers.0.{rest}")

    if has("self_attn.q_proj.weight"):
        spec.set("qkv_layout", "separate", tensor_source("self_attn.q_proj.weight"))
        spec.set("qkv_bias", has("self_attn.q_proj.bias"), tensor_source("self_attn.q_proj.bias"))
    elif has("self_attn.qkv_proj.weight"):
        spec.set("qkv_layout", "fused", tensor_source("self_attn.qkv_proj.weight"))
        spec.set("qkv_bias", has("self_attn.qkv_proj.bias"), tensor_source("self_attn.qkv_proj.bias"))
    else:
        raise UnsupportedArchitecture("layer 0 has no q_proj and no qkv_proj weight.", where)
    spec.set("o_bias", has("self_attn.o_proj.bias"), tensor_source("self_attn.o_proj.bias"))
    if has("self_attn.q_norm.weight"):
        rows = ckpt.tensors["model.layers.0.self_attn.q_norm.weight"].shape[0]
        kind = "per_head" if rows == spec.head_dim else "full"
        spec.set("qk_norm", kind, Source("tensor", f"model.layers.0.self_attn.q_norm.weight has {rows} rows"))
    else:
        spec.set("qk_norm", "none", tensor_source("self_attn.q_norm.weight (absent)"))

    if has("mlp.gate_proj.weight") or has("mlp.gate_up_proj.weight"):
        spec.set("mlp_kind", "gated", tensor_source("mlp.gate_proj.weight"))
        spec.set("mlp_bias", has("mlp.gate_proj.bias") or has("mlp.down_proj.bias"), tensor_source("mlp.down_proj.bias"))
    else:
        raise UnsupportedArchitecture("layer 0 has no gated MLP (gate_proj / up_proj / down_proj).", where)

    # A 1-D tensor on the MLP besides the projections: an extra bias the code adds somewhere.
    extra = sorted(
        n.rsplit(".", 1)[1]
        for n in ckpt.tensors
        if n.startswith("model.layers.0.mlp.") and n.count(".") == 4
    )
    for name in extra:
        found = added_to_call(ckpt, "gate_proj", name)
        if found is None:
            raise UnsupportedArchitecture(
                f"tensor model.layers.0.mlp.{name} has no home in the port: the modeling source does not show "
                "it added to gate_proj's output, and the generator does not know where else it would go.",
                where,
            )
        spec.set("gate_extra_bias", name, Source("code", f"{found}: added to gate_proj(x)"))

    spec.set("norm_kind", "layer" if has("input_layernorm.bias") else "rms",
             tensor_source("input_layernorm.bias"))

    head = "lm_head.weight" in ckpt.tensors
    key = "tie_word_embeddings"
    configured = ckpt.config.get(key)
    if not head:
        if configured is False:
            raise CheckpointError(
                "config.json says tie_word_embeddings is false but the checkpoint has no lm_head.weight: "
                "the output head would have no weights.",
                where,
            )
        spec.set("tie_word_embeddings", True, Source("tensor", "no lm_head.weight: the head is the embedding"))
    else:
        spec.set("tie_word_embeddings", bool(configured),
                 Source("config", f"config.json {key}" if configured is not None else "lm_head.weight present"))
    spec.set("lm_head_bias", "lm_head.bias" in ckpt.tensors, Source("tensor", "lm_head.bias"))

    embed_rows = ckpt.tensors["model.embed_tokens.weight"].shape[0]
    if embed_rows != spec.vocab_size:
        raise CheckpointError(
            f"config.json vocab_size is {spec.vocab_size} but model.embed_tokens.weight has {embed_rows} rows.",
            where,
        )
    if head and ckpt.tensors["lm_head.weight"].shape[0] != spec.vocab_size:
        raise CheckpointError(
            f"config.json vocab_size is {spec.vocab_size} but lm_head.weight has "
            f"{ckpt.tensors['lm_head.weight'].shape[0]} rows.",
            where,
        )
