"""A projection layer 0 holds and a later layer lacks, where the code builds none there: Hunyuan-Large's cross-layer
attention (config use_cla, cla_share_factor) builds no k_proj/v_proj in its odd layers, which take the previous
layer's projected keys and values through the model's loop. Refused naming the layer, the class and the config
values that decide it, not reported as a missing tensor of a broken checkpoint. The lab below is written here in
that form (its code is read, never run)."""

from __future__ import annotations

import json

import pytest
from ckpt_factory import Shape, config_for, tensors_for, write_checkpoint
from helpers import detect_until

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import attention
from scaffold.errors import CheckpointError, UnsupportedArchitecture

MODELING = '''
import torch
from torch import nn


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        self.layer_idx = layer_idx
        self.attention_type = "cross" if config.use_cla and layer_idx % config.cla_share_factor != 0 else "self"
        self.num_heads = config.num_attention_heads
        self.num_kv = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        if self.attention_type == "self":
            self.k_proj = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=False)
            self.v_proj = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, hidden_states, kv_states=None):
        q = self.q_proj(hidden_states)
        if self.attention_type == "cross" and kv_states is not None:
            k, v = kv_states
        else:
            k, v = self.k_proj(hidden_states), self.v_proj(hidden_states)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out), (k, v)


class LabMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LabDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = LabAttention(config, layer_idx=layer_idx)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LabMLP(config)

    def forward(self, hidden_states, kv_states=None):
        attn, kv_states = self.self_attn(self.input_layernorm(hidden_states), kv_states)
        hidden_states = hidden_states + attn
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states)), kv_states


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states):
        prev = None
        for i, layer in enumerate(self.layers):
            hidden_states, kv = layer(hidden_states, prev)
            if i % self.config.cla_share_factor == 0:
                prev = kv
        return self.norm(hidden_states)


class ClalabForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = LabModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
'''


def _lab(tmp_path, modeling: str = MODELING):
    shape = Shape(architecture="ClalabForCausalLM", model_type="clalab", extra={"use_cla": True,
                                                                                "cla_share_factor": 2})
    tensors = {n: d for n, d in tensors_for(shape).items()
               if not (n.startswith("model.layers.1.") and (".k_proj." in n or ".v_proj." in n))}
    root = write_checkpoint(tmp_path / "clalab", shape, tensors=tensors, config=config_for(shape))
    (root / "modeling_clalab.py").write_text(modeling)
    config = json.loads((root / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_clalab.ClalabForCausalLM"}
    (root / "config.json").write_text(json.dumps(config))
    return read_checkpoint(root)


def test_the_lab_hands_its_keys_and_values_through_the_loop_as_kv_sharing(tmp_path):
    # Positional handoff, a tuple returned and unpacked, the factor through self.config (handoff.py reads it): layer 1
    # attends over what layer 0's attention takes, layer 0's KV cache.
    spec = detect_until(_lab(tmp_path), attention)
    assert (spec.kv_share_layers, spec.kv_share_sources) == ([1], [0])


# The handoff through a list the loop appends to is not read (handoff.py follows one local): refused by name.
LISTED = MODELING.replace("        prev = None\n", "        kept = []\n").replace(
    "layer(hidden_states, prev)", "layer(hidden_states, kept[-1] if kept else None)").replace(
    "                prev = kv\n", "                kept.append(kv)\n")


def test_a_layer_whose_attention_the_code_builds_without_keys_and_values_is_refused_naming_why(tmp_path):
    assert LISTED.count("kept") == 4
    with pytest.raises(UnsupportedArchitecture) as caught:
        detect_until(_lab(tmp_path, LISTED), attention)  # before: "tensor model.layers.1.self_attn.k_proj.weight is missing."
    message = str(caught.value)
    assert "layer 1's attention builds no k_proj: LabAttention.__init__ (modeling_clalab.py:" in message
    assert "builds it in layer 0 but not for layer_idx 1, as config.json cla_share_factor = 2, use_cla = True decide" \
        in message


def test_a_projection_the_code_builds_in_every_layer_is_still_a_missing_tensor(tmp_path):
    every = LISTED.replace('"cross" if config.use_cla and layer_idx % config.cla_share_factor != 0 else "self"',
                             '"self"')
    with pytest.raises(CheckpointError, match=r"tensor model\.layers\.1\.self_attn\.k_proj\.weight is missing\."):
        detect_until(_lab(tmp_path, every), attention)
