"""A lab checkpoint with the attention output gate folded into q_proj, the way Qwen3-Next and Qwen3.5 write it.

It is a tiny Qwen3 (scaffold.tiny.build_tiny) shipped as remote code: transformers' own modeling_qwen3.py with its
relative imports made absolute, q_proj twice as tall, and the attention changed to

    query_states, gate = torch.chunk(self.q_proj(hidden_states).view(*input_shape, -1, self.head_dim * 2), 2, dim=-1)
    gate = gate.reshape(*input_shape, -1)
    ...
    attn_output = attn_output * torch.sigmoid(gate)

q_proj's rows hold, per head, the Qwen3 query's rows and then fresh random gate rows. Qwen3's q_norm stays on the
query half. With `partial_rotary_factor` the rotary embedding covers that part of each head (Qwen3-Next's
apply_rotary_pos_emb and inverse frequencies, the factor in config.json's rope_parameters).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ckpt_factory import edit_once, lab_modeling_source

NAME = "gatedq"
ARCHITECTURE = "GatedqForCausalLM"


def modeling_source(partial_rotary: bool = False) -> str:
    text = lab_modeling_source("qwen3", "Qwen3Config", NAME, "GatedqConfig")
    text = edit_once(text, "config.hidden_size, config.num_attention_heads * self.head_dim, bias=config.attention_bias",
                 "config.hidden_size, config.num_attention_heads * self.head_dim * 2, bias=config.attention_bias")
    text = edit_once(text, "        query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)\n",
                 "        query_states, gate = torch.chunk(\n"
                 "            self.q_proj(hidden_states).view(*input_shape, -1, self.head_dim * 2), 2, dim=-1\n"
                 "        )\n"
                 "        gate = gate.reshape(*input_shape, -1)\n"
                 "        query_states = self.q_norm(query_states.reshape(hidden_shape)).transpose(1, 2)\n")
    text = edit_once(text, "        attn_output = attn_output.reshape(*input_shape, -1).contiguous()\n",
                 "        attn_output = attn_output.reshape(*input_shape, -1).contiguous()\n"
                 "        attn_output = attn_output * torch.sigmoid(gate)\n")
    text = text.replace("Qwen3ForCausalLM", ARCHITECTURE)
    if partial_rotary:
        # Qwen3-Next's: inverse frequencies over the rotated part of each head, and the rest passed through.
        text = edit_once(text, "        dim = getattr(config, \"head_dim\", None) or config.hidden_size // config.num_attention_heads\n",
                     "        dim = getattr(config, \"head_dim\", None) or config.hidden_size // config.num_attention_heads\n"
                     "        dim = int(dim * config.rope_parameters.get(\"partial_rotary_factor\", 1.0))\n")
        text = edit_once(text, "    q_embed = (q * cos) + (rotate_half(q) * sin)\n    k_embed = (k * cos) + (rotate_half(k) * sin)\n",
                     "    rotary_dim = cos.shape[-1]\n"
                     "    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]\n"
                     "    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]\n"
                     "    q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)\n"
                     "    k_embed = torch.cat([(k_rot * cos) + (rotate_half(k_rot) * sin), k_pass], dim=-1)\n")
    return text


CONFIGURATION = f'''from transformers.models.qwen3.configuration_qwen3 import Qwen3Config


class GatedqConfig(Qwen3Config):
    model_type = "{NAME}"
'''


def build(out: Path, *, partial_rotary_factor: float | None = None, seed: int = 0, std: float = 0.08) -> Path:
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
    heads, dim, hidden = config["num_attention_heads"], config["head_dim"], config["hidden_size"]
    generator = torch.Generator().manual_seed(seed + 1)
    for name in [n for n in tensors if n.endswith("self_attn.q_proj.weight")]:
        query = tensors[name].view(heads, dim, hidden)
        gate = std * torch.randn(heads, dim, hidden, generator=generator)
        tensors[name] = torch.cat([query, gate], dim=1).reshape(2 * heads * dim, hidden).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.update(model_type=NAME, architectures=[ARCHITECTURE],
                  auto_map={"AutoConfig": f"configuration_{NAME}.GatedqConfig",
                            "AutoModelForCausalLM": f"modeling_{NAME}.{ARCHITECTURE}"})
    if partial_rotary_factor is not None:
        config["rope_parameters"] = {**config["rope_parameters"], "partial_rotary_factor": partial_rotary_factor}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / f"configuration_{NAME}.py").write_text(CONFIGURATION)
    (out / f"modeling_{NAME}.py").write_text(modeling_source(partial_rotary_factor is not None))
    shutil.rmtree(base)
    return out
