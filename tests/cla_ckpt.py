"""A lab checkpoint with cross-layer attention (CLA) in the form Hunyuan-Large writes it, in code written here: every
`kv_share_every`-th layer projects keys and values and hands them, as projected (before the rotary embedding), to
the next layers through the model's loop; the layers between build no k_proj / v_proj and attend over what they
are handed, through their own rotary embedding.

It is a tiny Llama (scaffold.tiny.build_tiny) shipped as remote code: transformers' own modeling_llama.py with its
relative imports made absolute and

    self.shares = layer_idx % config.kv_share_every != 0          # the attention's __init__: no k_proj / v_proj
    if shared_kv is not None and self.shares:                     # its forward
        key_states, value_states = shared_kv
    handed = (key_states, value_states)                           # returned third, before the rotary
    hidden_states, kv = decoder_layer(..., shared_kv=shared_kv)   # the model's loop, which keeps the layer's
    if layer_idx % self.config.kv_share_every == 0:                # own when the index says so
        shared_kv = kv

The decoder layer passes shared_kv on and returns (hidden_states, kv). Unlike Hunyuan-Large's, no layer has a
key norm: what a sharing layer attends over is what its source layer's attention takes (its KV cache).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ckpt_factory import edit_once, lab_modeling_source

NAME = "clalab"
ARCHITECTURE = "ClaLabForCausalLM"
EVERY = 2  # layers 0 and 2 (BASE has 3) project their own; layer 1 attends over layer 0's


def modeling_source() -> str:
    text = lab_modeling_source("llama", "LlamaConfig", NAME, "ClaLabConfig")
    # The attention: no k_proj / v_proj in a sharing layer; the handed keys and values in place of its own.
    text = edit_once(text, "        self.k_proj = nn.Linear(\n",
                 "        self.shares = layer_idx % config.kv_share_every != 0\n"
                 "        if not self.shares:\n"
                 "            self.k_proj = nn.Linear(\n")
    text = edit_once(text, "            config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias\n"
                       "        )\n        self.v_proj = nn.Linear(\n"
                       "            config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias\n"
                       "        )\n",
                 "                config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias\n"
                 "            )\n            self.v_proj = nn.Linear(\n"
                 "                config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias\n"
                 "            )\n")
    text = edit_once(text, "        past_key_values: Cache | None = None,\n        **kwargs: Unpack[TransformersKwargs],\n"
                       "    ) -> tuple[torch.Tensor, torch.Tensor]:\n",
                 "        past_key_values: Cache | None = None,\n        shared_kv=None,\n"
                 "        **kwargs: Unpack[TransformersKwargs],\n    ) -> tuple[torch.Tensor, torch.Tensor]:\n")
    text = edit_once(text, "        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n"
                       "        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n",
                 "        if shared_kv is not None and self.shares:\n"
                 "            key_states, value_states = shared_kv\n"
                 "        else:\n"
                 "            key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n"
                 "            value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n"
                 "        handed = (key_states, value_states)\n")
    text = edit_once(text, "        attn_output = self.o_proj(attn_output)\n        return attn_output, attn_weights\n",
                 "        attn_output = self.o_proj(attn_output)\n        return attn_output, attn_weights, handed\n")
    # The decoder layer: shared_kv passed on, the attention's handed pair returned beside the hidden states.
    text = edit_once(text, "        use_cache: bool | None = False,\n"
                       "        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,\n"
                       "        **kwargs: Unpack[TransformersKwargs],\n    ) -> torch.Tensor:\n",
                 "        use_cache: bool | None = False,\n"
                 "        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,\n"
                 "        shared_kv=None,\n"
                 "        **kwargs: Unpack[TransformersKwargs],\n    ) -> torch.Tensor:\n")
    text = edit_once(text, "        hidden_states, _ = self.self_attn(\n",
                 "        hidden_states, _, kv = self.self_attn(\n")
    text = edit_once(text, "            position_embeddings=position_embeddings,\n            **kwargs,\n        )\n"
                       "        hidden_states = residual + hidden_states\n",
                 "            position_embeddings=position_embeddings,\n            shared_kv=shared_kv,\n"
                 "            **kwargs,\n        )\n        hidden_states = residual + hidden_states\n")
    text = edit_once(text, "        hidden_states = residual + hidden_states\n        return hidden_states\n",
                 "        hidden_states = residual + hidden_states\n        return hidden_states, kv\n")
    # The model's loop: what every kv_share_every-th layer hands, passed to the layers after it.
    text = edit_once(text, "        for decoder_layer in self.layers[: self.config.num_hidden_layers]:\n"
                       "            hidden_states = decoder_layer(\n",
                 "        shared_kv = None\n"
                 "        for layer_idx, decoder_layer in enumerate(self.layers[: self.config.num_hidden_layers]):\n"
                 "            hidden_states, kv = decoder_layer(\n")
    text = edit_once(text, "                use_cache=use_cache,\n                **kwargs,\n            )\n\n"
                       "        hidden_states = self.norm(hidden_states)\n",
                 "                use_cache=use_cache,\n                shared_kv=shared_kv,\n                **kwargs,\n"
                 "            )\n            if layer_idx % self.config.kv_share_every == 0:\n"
                 "                shared_kv = kv\n\n        hidden_states = self.norm(hidden_states)\n")
    return text.replace("LlamaForCausalLM", ARCHITECTURE)


CONFIGURATION = f'''from huggingface_hub.dataclasses import strict
from transformers.models.llama.configuration_llama import LlamaConfig


@strict
class ClaLabConfig(LlamaConfig):
    model_type = "{NAME}"
    kv_share_every: int = 1
'''


def build(out: Path, *, every: int = EVERY, seed: int = 0, std: float = 0.08) -> Path:
    """Write the checkpoint into `out` (created; replaced if there) and return it."""
    from safetensors.torch import load_file, save_file

    from scaffold.tiny import build_tiny

    out = Path(out)
    base = build_tiny("llama", out.parent / f".{out.name}-llama", seed=seed, std=std)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tensors = {}
    for file in sorted(base.glob("*.safetensors")):
        tensors.update(load_file(file))
    config = json.loads((base / "config.json").read_text())
    # The sharing layers hold no keys' or values' projection (their code builds none).
    tensors = {n: t for n, t in tensors.items() if not any(
        n.startswith(f"model.layers.{i}.self_attn.{p}.") for i in range(config["num_hidden_layers"]) if i % every
        for p in ("k_proj", "v_proj"))}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.update(model_type=NAME, architectures=[ARCHITECTURE], kv_share_every=every,
                  auto_map={"AutoConfig": f"configuration_{NAME}.ClaLabConfig",
                            "AutoModelForCausalLM": f"modeling_{NAME}.{ARCHITECTURE}"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / f"configuration_{NAME}.py").write_text(CONFIGURATION)
    (out / f"modeling_{NAME}.py").write_text(modeling_source())
    shutil.rmtree(base)
    return out
