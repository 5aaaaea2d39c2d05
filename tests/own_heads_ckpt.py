"""A lab checkpoint whose layers have query heads, KV heads and an MLP width of their own, read inside the modules
the way OpenELM writes it (Apple's code is not copied; this is a tiny Qwen3 rewritten so):

    # the attention, one fused projection of this layer's heads
    heads, kv_heads = config.query_heads[layer_idx], config.num_kv_heads[layer_idx]
    self.qkv_proj = nn.Linear(config.hidden_size, (heads + kv_heads + kv_heads) * self.head_dim, ...)
    qkv = self.qkv_proj(hidden_states).view(*input_shape, self.n_q + self.n_k + self.n_v, self.head_dim)
    query_states, key_states, value_states = qkv.split([self.n_q, self.n_k, self.n_v], dim=2)

    # the MLP, one fused gate/up projection, its width from a helper of the lab's own
    width = int(round_up(config.ffn_multipliers[layer_idx] * config.hidden_size, config.ffn_divisor))

config.json holds the lists (num_kv_heads under the name vLLM reads one KV head count from) and keeps Qwen3's
scalar num_attention_heads / num_key_value_heads / intermediate_size, which the code no longer reads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ckpt_factory import edit_once, lab_modeling_source

NAME = "ownheads"
ARCHITECTURE = "OwnHeadsForCausalLM"
QUERY_HEADS = [2, 4, 4]
KV_HEADS = [1, 2, 1]
FFN_MULTIPLIERS = [0.5, 1.25, 2.0]
FFN_DIVISOR = 48
WIDTHS = [96, 192, 288]  # round_up(m * 128, 48)

HELPER = '''

def round_up(value, multiple, floor=None):
    """The lab's rounding of a width: up to a multiple, never below `floor`."""
    if floor is None:
        floor = multiple
    rounded = (int(value) + multiple - 1) // multiple * multiple
    if rounded < floor:
        rounded = floor
    return rounded

'''


def modeling_source() -> str:
    text = lab_modeling_source("qwen3", "Qwen3Config", NAME, "OwnHeadsConfig")
    text = edit_once(text, "\n\nclass Qwen3MLP(nn.Module):", HELPER + "\nclass Qwen3MLP(nn.Module):")
    text = edit_once(text, '''    def __init__(self, config):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.intermediate_size = config.intermediate_size
        self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.up_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj
''', '''    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        multiplier = config.ffn_multipliers[layer_idx]
        width = int(round_up(multiplier * config.hidden_size, config.ffn_divisor))
        self.gate_up_proj = nn.Linear(self.hidden_size, 2 * width, bias=False)
        self.down_proj = nn.Linear(width, self.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)
''')
    text = edit_once(text, "        self.mlp = Qwen3MLP(config)\n", "        self.mlp = Qwen3MLP(config, layer_idx)\n")
    text = edit_once(text, '''        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
''', '''        heads = config.query_heads[layer_idx]
        kv_heads = config.num_kv_heads[layer_idx]
        self.n_q, self.n_k, self.n_v = heads, kv_heads, kv_heads
        self.num_key_value_groups = heads // kv_heads
''')
    text = edit_once(text, '''        self.q_proj = nn.Linear(
            config.hidden_size, config.num_attention_heads * self.head_dim, bias=config.attention_bias
        )
        self.k_proj = nn.Linear(
            config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias
        )
        self.v_proj = nn.Linear(
            config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(
            config.num_attention_heads * self.head_dim, config.hidden_size, bias=config.attention_bias
        )
''', '''        self.qkv_proj = nn.Linear(
            config.hidden_size, (heads + kv_heads + kv_heads) * self.head_dim, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(heads * self.head_dim, config.hidden_size, bias=config.attention_bias)
''')
    text = edit_once(text, '''        query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
''', '''        qkv = self.qkv_proj(hidden_states).view(*input_shape, self.n_q + self.n_k + self.n_v, self.head_dim)
        query_states, key_states, value_states = qkv.split([self.n_q, self.n_k, self.n_v], dim=2)
        query_states = self.q_norm(query_states).transpose(1, 2)
        key_states = self.k_norm(key_states).transpose(1, 2)
        value_states = value_states.transpose(1, 2)
''')
    return text.replace("Qwen3ForCausalLM", ARCHITECTURE)


CONFIGURATION = f'''from huggingface_hub.dataclasses import strict
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config


@strict
class OwnHeadsConfig(Qwen3Config):
    model_type = "{NAME}"
    query_heads: list[int] | None = None
    num_kv_heads: list[int] | None = None
    ffn_multipliers: list[float] | None = None
    ffn_divisor: int = 8
'''


def build(out: Path, *, seed: int = 0, std: float = 0.08) -> Path:
    """Write the checkpoint into `out` (created; replaced if there) and return it: the lab's model built by
    transformers from its own code, its weights random (scaffold.tiny.randomize)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from scaffold.tiny import BASE, randomize

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    config = {**BASE, "model_type": NAME, "architectures": [ARCHITECTURE], "query_heads": QUERY_HEADS,
              "num_kv_heads": KV_HEADS, "ffn_multipliers": FFN_MULTIPLIERS, "ffn_divisor": FFN_DIVISOR,
              "hidden_act": "silu", "rms_norm_eps": 1e-6, "torch_dtype": "float32", "bos_token_id": 0,
              "eos_token_id": 1, "auto_map": {"AutoConfig": f"configuration_{NAME}.OwnHeadsConfig",
                                              "AutoModelForCausalLM": f"modeling_{NAME}.{ARCHITECTURE}"}}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / f"configuration_{NAME}.py").write_text(CONFIGURATION)
    (out / f"modeling_{NAME}.py").write_text(modeling_source())
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out, trust_remote_code=True),
                                             trust_remote_code=True, dtype=torch.float32)
    randomize(model, std)
    model.save_pretrained(out, safe_serialization=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))  # the lab's own, as it shipped
    for layer, (heads, kv, width) in enumerate(zip(QUERY_HEADS, KV_HEADS, WIDTHS)):
        qkv = model.model.layers[layer].self_attn.qkv_proj.weight
        assert qkv.shape[0] == (heads + 2 * kv) * BASE["head_dim"]
        assert model.model.layers[layer].mlp.down_proj.weight.shape[1] == width
    return out
