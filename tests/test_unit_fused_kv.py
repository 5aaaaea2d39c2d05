"""Keys and values fused in one projection, the queries in another (TeleChat's `query` beside `key_value`, its
key_value output viewed per head as [k | v]): no qkv_layout fills the port's QKVParallelLinear from that pair, so
the checkpoint is refused naming the two tensors, not left as an unknown field a spec file could not set either.
The lab below is written here in that form (its code is read, never run)."""

from __future__ import annotations

import json

import pytest
from ckpt_factory import Shape, config_for, tensors_for, write_checkpoint
from helpers import detect_until

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import layout
from scaffold.errors import UnsupportedArchitecture
from scaffold.spec import Undetermined

MODELING = '''
import torch
from torch import nn


class LabAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.query = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.key_value = nn.Linear(config.hidden_size, 2 * self.num_kv * self.head_dim, bias=False)
        self.dense = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def _split(self, tensor, parts):
        return torch.split(tensor, tensor.size(-1) // parts, dim=-1)

    def forward(self, hidden_states, mask):
        s, b, _ = hidden_states.shape
        q = self.query(hidden_states).view(s, b * self.num_heads, self.head_dim)
        kv = self.key_value(hidden_states).view(s, b, self.num_kv, 2 * self.head_dim)
        k, v = self._split(kv, 2)
        k = k.reshape(s, b * self.num_kv, self.head_dim)
        v = v.reshape(s, b * self.num_kv, self.head_dim)
        scores = torch.einsum("bik,bkj->bij", q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2))
        probs = torch.softmax(scores.masked_fill(mask, -1e4), dim=-1)
        return self.dense(torch.bmm(probs, v.transpose(0, 1)).transpose(0, 1).reshape(s, b, -1))


class LabMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LabDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attention = LabAttention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LabMLP(config)

    def forward(self, hidden_states, mask):
        hidden_states = hidden_states + self.self_attention(self.input_layernorm(hidden_states), mask)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabDecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class KvlabForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = LabModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
'''


def _lab(tmp_path, kv_heads: int, modeling: str = MODELING):
    shape = Shape(architecture="KvlabForCausalLM", model_type="kvlab", heads=4, kv_heads=kv_heads, head_dim=16,
                  hidden=64)
    tensors = {}
    for name, dims in tensors_for(shape).items():
        for old, new in (("self_attn.q_proj", "self_attention.query"), ("self_attn.o_proj", "self_attention.dense")):
            name = name.replace(old, new)
        if "self_attn.k_proj" in name:
            name, dims = name.replace("self_attn.k_proj", "self_attention.key_value"), [2 * dims[0], dims[1]]
        if "self_attn.v_proj" in name:
            continue
        tensors[name] = dims
    root = write_checkpoint(tmp_path / f"kvlab{kv_heads}", shape, tensors=tensors, config=config_for(shape))
    (root / "modeling_kvlab.py").write_text(modeling)
    config = json.loads((root / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_kvlab.KvlabForCausalLM"}
    (root / "config.json").write_text(json.dumps(config))
    return read_checkpoint(root)


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_a_key_value_projection_beside_a_query_projection_is_refused_naming_both(tmp_path, kv_heads):
    ckpt = _lab(tmp_path, kv_heads)
    with pytest.raises(UnsupportedArchitecture) as caught:
        detect_until(ckpt, layout)
    message = str(caught.value)
    assert "keys and values fused in one projection without the queries" in message
    if kv_heads == 4:
        assert ("self_attention.key_value holds 128 rows, keys and values for 4 KV head(s) of 16, beside "
                "self_attention.query with the 64 rows of the 4 query heads") in message
    else:  # key_value as tall as query: both named, neither guessed
        assert ("self_attention.key_value and self_attention.query both hold 64 rows, the 4 query heads of 16 in "
                "one, keys and values for 2 KV heads in the other") in message
    assert "--spec" not in message and "dense" not in message


def test_a_query_and_a_key_projection_whose_value_projection_is_missing_are_not_read_as_that_form(tmp_path):
    # The code builds a third input projection the checkpoint does not hold: a broken checkpoint, left unknown.
    modeling = MODELING.replace(
        "        self.dense = nn.Linear(",
        "        self.value = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=False)\n"
        "        self.dense = nn.Linear(")
    ckpt = _lab(tmp_path, 4, modeling)
    with pytest.raises(Undetermined, match="has no q_proj/k_proj/v_proj and no fused q/k/v weight"):
        detect_until(ckpt, layout)
