"""Keys and values fused in one projection, the queries in another (TeleChat's `query` beside `key_value`, its
key_value output viewed per head as [k | v]): read from the code as qkv_layout "kv_pairs" (the port fills its
QKVParallelLinear's q from the one, k and v from each head's halves of the other); a pair the code cuts otherwise
is refused naming the two tensors, not left as an unknown field a spec file could not set either. The lab below is
written here in that form (its code is read, never run); tests/test_kv_pairs_port.py runs one in the engine."""

from __future__ import annotations

import json

import pytest
from ckpt_factory import Shape, config_for, tensors_for, write_checkpoint
from helpers import detect_until

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import layout
from scaffold.errors import UnsupportedArchitecture
from scaffold.mapping import map_tensor
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


def _lab(tmp_path, kv_heads: int, modeling: str = MODELING, rename: dict[str, str] | None = None):
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
        for old, new in (rename or {}).items():
            name = name.replace(f"self_attention.{old}.", f"self_attention.{new}.")
        tensors[name] = dims
    root = write_checkpoint(tmp_path / f"kvlab{kv_heads}", shape, tensors=tensors, config=config_for(shape))
    (root / "modeling_kvlab.py").write_text(modeling)
    config = json.loads((root / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_kvlab.KvlabForCausalLM"}
    (root / "config.json").write_text(json.dumps(config))
    return read_checkpoint(root)


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_a_key_value_projection_cut_per_head_beside_a_query_projection_is_read_as_kv_pairs(tmp_path, kv_heads):
    # Refused by name before (commit 1f78605); now the code's per-head view [..., kv, 2 * head_dim] and its
    # two-way cut say the rows hold each KV head's key then its value. With 2 KV heads key_value is as tall as
    # query: the shapes cannot tell them apart, the code does.
    ckpt = _lab(tmp_path, kv_heads)
    spec = detect_until(ckpt, layout)
    assert spec.qkv_layout == "kv_pairs"
    assert (spec.names["q_proj"], spec.names["kv_proj"], spec.names["qkv_proj"]) == ("query", "key_value", "qkv_proj")
    assert "k_proj" not in spec.names and "v_proj" not in spec.names
    assert spec.num_kv_heads == kv_heads
    assert "modeling_kvlab.py:" in spec.source("qkv_layout").detail
    # Each checkpoint tensor's home: query is the q shard; key_value fills both k and v.
    assert map_tensor(spec, "model.layers.0.self_attention.query.weight") == [
        ("model.layers.0.self_attention.qkv_proj.weight", "q", "")]
    assert [(p, s) for p, s, _n in map_tensor(spec, "model.layers.0.self_attention.key_value.weight")] == [
        ("model.layers.0.self_attention.qkv_proj.weight", "k"), ("model.layers.0.self_attention.qkv_proj.weight", "v")]


def test_the_same_form_under_other_names_is_read_so(tmp_path):
    # Nothing is read from the names: the attributes, the helper and the variables renamed.
    modeling = (MODELING.replace("self.query", "self.wq").replace("self.key_value", "self.wkv")
                .replace("_split", "_halves").replace("k, v = ", "a, b = ").replace("k = k.", "k = a.")
                .replace("v = v.", "v = b."))
    ckpt = _lab(tmp_path, 4, modeling, rename={"query": "wq", "key_value": "wkv"})
    spec = detect_until(ckpt, layout)
    assert (spec.qkv_layout, spec.names["q_proj"], spec.names["kv_proj"]) == ("kv_pairs", "wq", "wkv")


def test_values_before_keys_in_each_head_are_refused_by_name(tmp_path):
    # The first half goes to the product with the probabilities, the second to the scores: values first.
    modeling = MODELING.replace("k, v = self._split(kv, 2)", "v, k = self._split(kv, 2)")
    ckpt = _lab(tmp_path, 4, modeling)
    with pytest.raises(UnsupportedArchitecture, match="each KV head's value rows before its key rows"):
        detect_until(ckpt, layout)


def test_keys_and_values_cut_into_halves_without_a_per_head_view_stay_refused_naming_both(tmp_path):
    # All key rows, then all value rows: not the per-head form; no qkv_layout is guessed for it.
    modeling = MODELING.replace(
        "        kv = self.key_value(hidden_states).view(s, b, self.num_kv, 2 * self.head_dim)\n"
        "        k, v = self._split(kv, 2)\n",
        "        kv = self.key_value(hidden_states)\n"
        "        k, v = self._split(kv, 2)\n")
    assert modeling != MODELING
    ckpt = _lab(tmp_path, 4, modeling)
    with pytest.raises(UnsupportedArchitecture) as caught:
        detect_until(ckpt, layout)
    assert ("keys and values fused in one projection without the queries: layer 0's self_attention.key_value holds "
            "128 rows") in str(caught.value)


def test_a_query_and_a_key_projection_whose_value_projection_is_missing_are_not_read_as_that_form(tmp_path):
    # The code builds a third input projection the checkpoint does not hold: a broken checkpoint, left unknown.
    modeling = MODELING.replace(
        "        self.dense = nn.Linear(",
        "        self.value = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=False)\n"
        "        self.dense = nn.Linear(")
    ckpt = _lab(tmp_path, 4, modeling)
    with pytest.raises(Undetermined, match="has no q_proj/k_proj/v_proj and no fused q/k/v weight"):
        detect_until(ckpt, layout)
