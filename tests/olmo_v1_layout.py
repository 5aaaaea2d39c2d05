"""OLMo v1's tensor layout (ai2 hf_olmo: `model.transformer.blocks.N.att_proj`), written as a checkpoint here.

OLMo v1's checkpoints ship a modeling_olmo.py that builds the model with the `olmo` package (`from olmo.model import
OLMo`), code the checkpoint does not hold; its user describes the model with a spec file. Its decoder block keeps
every projection as its own module, with no attention or MLP module between:

    model.transformer.wte.weight                     [embedding_size, d_model]   (the head is tied to it)
    model.transformer.blocks.N.att_proj.weight       [3 * d_model, d_model]      q, k, v one after another
    model.transformer.blocks.N.attn_out.weight       [d_model, d_model]
    model.transformer.blocks.N.ff_proj.weight        [2 * F, d_model]            x, then the gate (silu(gate) * x)
    model.transformer.blocks.N.ff_out.weight         [d_model, F]

and its layer norms hold no weight (layer_norm_with_affine: false). SPEC is what that user writes.
"""

from __future__ import annotations

import json
from pathlib import Path

D_MODEL, HEADS, LAYERS, FFN, VOCAB, EMBEDDINGS = 128, 2, 2, 512, 1000, 1024

SPEC = f'''[spec]
num_layers = {LAYERS}
num_kv_heads = {HEADS}
head_dim = {D_MODEL // HEADS}
intermediate_size = {FFN}
vocab_size = {EMBEDDINGS}
qkv_layout = "fused"
qkv_bias = false
o_bias = false
qk_norm = "none"
mlp_kind = "gated"
gate_up_layout = "fused"
gate_up_order = "up_first"
mlp_bias = false
block = "pre_norm"
norm_kind = "layer"
norm_eps = 1e-5
norm_offset = 0.0
norm_bias = false
norm_weightless = true
tie_word_embeddings = true
lm_head_bias = false
skipped_tensors = []
mlp_on_layer = true
attn_on_layer = true

[spec.names]
model = "model"
embed_tokens = "transformer.wte"
layers = "transformer.blocks"
norm = "transformer.ln_f"
lm_head = "transformer.ff_out"
self_attn = "self_attn"
qkv_proj = "att_proj"
o_proj = "attn_out"
mlp = "mlp"
gate_up_proj = "ff_proj"
down_proj = "ff_out"
attn_norm = "attn_norm"
mlp_norm = "ff_norm"

[spec.config_keys]
hidden_size = "d_model"
num_layers = "n_layers"
num_heads = "n_heads"
'''


def write_layout(out: Path) -> tuple[Path, Path]:
    """A checkpoint of OLMo v1's tensor names and config keys (random tensors, no code), and the spec file beside
    it; returns both paths."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["OLMoForCausalLM"], "model_type": "hf_olmo", "d_model": D_MODEL, "n_heads": HEADS,
              "n_layers": LAYERS, "mlp_ratio": 2 * FFN // D_MODEL, "activation_type": "swiglu", "rope": True,
              "layer_norm_type": "default", "layer_norm_with_affine": False, "include_bias": False,
              "weight_tying": True, "vocab_size": VOCAB, "embedding_size": EMBEDDINGS, "max_sequence_length": 512,
              "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(0)
    tensors = {"model.transformer.wte.weight": torch.randn(EMBEDDINGS, D_MODEL, generator=g)}
    for i in range(LAYERS):
        block = f"model.transformer.blocks.{i}"
        tensors[f"{block}.att_proj.weight"] = torch.randn(3 * D_MODEL, D_MODEL, generator=g)
        tensors[f"{block}.attn_out.weight"] = torch.randn(D_MODEL, D_MODEL, generator=g)
        tensors[f"{block}.ff_proj.weight"] = torch.randn(2 * FFN, D_MODEL, generator=g)
        tensors[f"{block}.ff_out.weight"] = torch.randn(D_MODEL, FFN, generator=g)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    spec = out.parent / f"{out.name}.spec.toml"
    spec.write_text(SPEC)
    return out, spec
