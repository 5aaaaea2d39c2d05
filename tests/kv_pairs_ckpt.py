"""A lab checkpoint whose keys and values sit in one projection beside the queries' own (TeleChat's form, written
here with other names): a tiny Llama (scaffold.tiny.build_tiny, grouped KV heads) shipped as remote code,
transformers' own modeling_llama.py with its relative imports made absolute and q_proj, k_proj, v_proj replaced by

    self.q_lin = nn.Linear(hidden, heads * head_dim)
    self.kv_lin = nn.Linear(hidden, 2 * kv_heads * head_dim)
    ...
    query_states = self.q_lin(hidden_states).view(hidden_shape).transpose(1, 2)
    pairs = self.kv_lin(hidden_states).view(*input_shape, -1, 2 * self.head_dim)
    key_states, value_states = pairs.chunk(2, dim=-1)

kv_lin's rows hold, per KV head, the Llama k_proj's rows of that head and then its v_proj's. The port must read
the per-head cut from the code (the names say nothing) and de-interleave the rows into QKVParallelLinear's k and
v shards on load, each rank taking its own KV heads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ckpt_factory import edit_once, lab_modeling_source

NAME = "kvpairlab"
ARCHITECTURE = "KvpairlabForCausalLM"


def modeling_source() -> str:
    text = lab_modeling_source("llama", "LlamaConfig", NAME, "KvpairlabConfig")
    text = edit_once(text,
                 "        self.q_proj = nn.Linear(\n"
                 "            config.hidden_size, config.num_attention_heads * self.head_dim, bias=config.attention_bias\n"
                 "        )\n"
                 "        self.k_proj = nn.Linear(\n"
                 "            config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias\n"
                 "        )\n"
                 "        self.v_proj = nn.Linear(\n"
                 "            config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias\n"
                 "        )\n",
                 "        self.q_lin = nn.Linear(\n"
                 "            config.hidden_size, config.num_attention_heads * self.head_dim, bias=config.attention_bias\n"
                 "        )\n"
                 "        self.kv_lin = nn.Linear(\n"
                 "            config.hidden_size, 2 * config.num_key_value_heads * self.head_dim, bias=config.attention_bias\n"
                 "        )\n")
    text = edit_once(text,
                 "        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n"
                 "        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n"
                 "        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n",
                 "        query_states = self.q_lin(hidden_states).view(hidden_shape).transpose(1, 2)\n"
                 "        pairs = self.kv_lin(hidden_states).view(*input_shape, -1, 2 * self.head_dim)\n"
                 "        key_states, value_states = pairs.chunk(2, dim=-1)\n"
                 "        key_states = key_states.transpose(1, 2)\n"
                 "        value_states = value_states.transpose(1, 2)\n")
    return text.replace("LlamaForCausalLM", ARCHITECTURE)


CONFIGURATION = f'''from transformers.models.llama.configuration_llama import LlamaConfig


class KvpairlabConfig(LlamaConfig):
    model_type = "{NAME}"
'''


def build(out: Path, *, seed: int = 0, std: float = 0.08) -> Path:
    """Write the checkpoint into `out` (created; replaced if there) and return it."""
    import torch
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
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    dim = config.get("head_dim") or config["hidden_size"] // heads
    assert kv_heads < heads, "the lab is meant with grouped KV heads"
    for name in [n for n in tensors if n.endswith("self_attn.k_proj.weight")]:
        stem = name[: -len("k_proj.weight")]
        k, v = tensors.pop(name), tensors.pop(f"{stem}v_proj.weight")
        hidden = k.shape[1]
        pairs = torch.stack([k.view(kv_heads, dim, hidden), v.view(kv_heads, dim, hidden)], dim=1)
        tensors[f"{stem}kv_lin.weight"] = pairs.reshape(2 * kv_heads * dim, hidden).contiguous()
        tensors[f"{stem}q_lin.weight"] = tensors.pop(f"{stem}q_proj.weight")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.update(model_type=NAME, architectures=[ARCHITECTURE],
                  auto_map={"AutoConfig": f"configuration_{NAME}.KvpairlabConfig",
                            "AutoModelForCausalLM": f"modeling_{NAME}.{ARCHITECTURE}"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / f"configuration_{NAME}.py").write_text(CONFIGURATION)
    (out / f"modeling_{NAME}.py").write_text(modeling_source())
    shutil.rmtree(base)
    return out
