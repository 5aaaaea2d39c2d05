"""Cross-layer attention read from the code (scaffold/detect/handoff.py): the model's loop hands one layer's keys
and values to the next layers, and a layer attending over exactly what its source layer's attention took (its KV
cache) is ported as KV sharing; a layer that transforms what it is handed otherwise is refused naming why. The labs
below are written here in Hunyuan-Large's form and others (their code is read, never run); the engine test is
tests/test_cla_port.py."""

from __future__ import annotations

import json

import pytest
from ckpt_factory import Shape, config_for, tensors_for, write_checkpoint
from helpers import detect_until

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import attention
from scaffold.errors import UnsupportedArchitecture

# Hunyuan-Large's form: the handed keys and values are the projections (before the rotary); the sharing layer
# applies the rotary to them itself. KEY_NORM is replaced by a key norm in the variants that have one.
MODELING = '''
import torch
from torch import nn


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


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
        self.key_norm = nn.RMSNorm(self.head_dim)

    def forward(self, hidden_states, cos, sin, kv_states=None):
        q = self.q_proj(hidden_states)
        if self.attention_type == "cross" and kv_states is not None:
            k, v = kv_states
        else:
            k, v = self.k_proj(hidden_states), self.v_proj(hidden_states)
        handed = (k, v)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        KEY_NORM
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out), handed


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

    def forward(self, hidden_states, cos, sin, kv_states=None):
        attn, kv_states = self.self_attn(self.input_layernorm(hidden_states), cos, sin, kv_states=kv_states)
        hidden_states = hidden_states + attn
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states)), kv_states


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.cla = config.use_cla
        self.factor = config.cla_share_factor
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, cos, sin):
        prev = None
        for i, layer in enumerate(self.layers):
            outputs = layer(hidden_states, cos, sin, kv_states=prev)
            hidden_states = outputs[0]
            kv = outputs[-1]
            if self.cla and i % self.factor == 0:
                prev = kv
        return self.norm(hidden_states)


class ClalabForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = LabModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
'''


def _lab(tmp_path, modeling: str, *, layers: int = 4, factor: int = 2, key_norm: bool = False):
    shape = Shape(architecture="ClalabForCausalLM", model_type="clalab", layers=layers,
                  extra={"use_cla": True, "cla_share_factor": factor})
    tensors = {n: d for n, d in tensors_for(shape).items()
               if not (n.startswith("model.layers.") and int(n.split(".")[2]) % factor
                       and (".k_proj." in n or ".v_proj." in n))}
    if key_norm:
        tensors.update({f"model.layers.{i}.self_attn.key_norm.weight": [shape.head_dim] for i in range(layers)})
    root = write_checkpoint(tmp_path / "clalab", shape, tensors=tensors, config=config_for(shape))
    (root / "modeling_clalab.py").write_text(modeling)
    config = json.loads((root / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_clalab.ClalabForCausalLM"}
    (root / "config.json").write_text(json.dumps(config))
    return read_checkpoint(root)


def _refused(ckpt) -> str:
    with pytest.raises(UnsupportedArchitecture) as caught:
        detect_until(ckpt, attention)
    return str(caught.value)


def test_layers_attending_over_what_an_earlier_layer_hands_them_share_its_kv_cache(tmp_path):
    spec = detect_until(_lab(tmp_path, MODELING.replace("KEY_NORM", "")), attention)
    assert (spec.kv_share_layers, spec.kv_share_sources) == ([1, 3], [0, 2])
    assert spec.kv_share_config["cla_share_factor"] == 2 and spec.kv_share_config["use_cla"] is True
    assert "modeling_clalab.py:" in spec.source("kv_share_sources").detail


def test_the_loop_decides_the_sources_per_layer_index(tmp_path):
    # Factor 3 over 4 layers: layers 1 and 2 read layer 0's keys and values; layer 3 computes its own.
    spec = detect_until(_lab(tmp_path, MODELING.replace("KEY_NORM", ""), factor=3), attention)
    assert (spec.kv_share_layers, spec.kv_share_sources) == ([1, 2], [0, 0])


def test_a_key_norm_of_the_sharing_layers_own_over_the_handed_keys_is_refused_naming_it(tmp_path):
    # Hunyuan-Large's: each layer's own key norm after the rotary, over the projections layer 0 hands layer 1.
    message = _refused(_lab(tmp_path, MODELING.replace("KEY_NORM", "k = self.key_norm(k)"), key_norm=True))
    assert "layer 1 takes the keys layer 0 hands it" in message
    assert "applies layer 1's own key_norm and rotary to them" in message
    assert "takes them through layer 0's own key_norm and rotary" in message
    assert "kv_sharing_target_layer_name" in message


def test_keys_handed_after_the_rotary_and_turned_again_are_refused(tmp_path):
    # The source hands the keys it rotated; the sharing layer rotates them a second time: not what layer 0 stored.
    code = MODELING.replace("KEY_NORM", "").replace(
        "        handed = (k, v)\n        q, k = apply_rotary_pos_emb(q, k, cos, sin)\n",
        "        q, k = apply_rotary_pos_emb(q, k, cos, sin)\n        handed = (k, v)\n"
        "        if kv_states is not None:\n            q, k = apply_rotary_pos_emb(q, k, cos, sin)\n")
    assert code.count("handed = (k, v)") == 1 and code.count("apply_rotary_pos_emb(q, k, cos, sin)") == 3
    message = _refused(_lab(tmp_path, code))
    assert "layer 1 applies ['#rotary'] to the keys layer 0 hands it" in message
    assert "they do not attend over the same keys" in message


def test_keys_handed_after_the_rotary_and_taken_as_they_are_share(tmp_path):
    code = MODELING.replace("KEY_NORM", "").replace(
        "        handed = (k, v)\n        q, k = apply_rotary_pos_emb(q, k, cos, sin)\n",
        "        if kv_states is None:\n            q, k = apply_rotary_pos_emb(q, k, cos, sin)\n"
        "        else:\n            q, _ = apply_rotary_pos_emb(q, q, cos, sin)\n        handed = (k, v)\n")
    spec = detect_until(_lab(tmp_path, code), attention)
    assert (spec.kv_share_layers, spec.kv_share_sources) == ([1, 3], [0, 2])


def test_a_layer_taking_the_handed_keys_with_values_of_its_own_is_refused(tmp_path):
    code = MODELING.replace("KEY_NORM", "").replace("            k, v = kv_states\n",
                                                     "            k, _ = kv_states\n            v = q\n")
    message = _refused(_lab(tmp_path, code))
    assert "(layer 1): takes ['@0.0'] and its own values of what layer 0 hands" in message
