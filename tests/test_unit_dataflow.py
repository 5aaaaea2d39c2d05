"""scaffold.detect.dataflow: roles inside the decoder layer, read from what its code computes.

The code read here is real: the four third-party remote-code models of ../shared/realmodels (read in
place, never copied) and transformers' own modeling files of the installed version.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from helpers import REALMODELS, transformers_code

from scaffold.detect import dataflow


def realmodel_code(name: str) -> tuple[dict, dict]:
    folder = REALMODELS / "src" / name
    if not folder.is_dir():
        pytest.fail(f"{folder} is missing: the real remote-code models live in ../shared/realmodels")
    sources = {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.py"))}
    return sources, json.loads((folder / "config.json").read_text(encoding="utf-8"))


# name -> (attention attr, layout, q, k, v, o), (mlp attr, kind, gate, up, down, fused), (attn_norm, mlp_norm)
REAL = {
    "internlm2": (("attention", "grouped", "wqkv", "wqkv", "wqkv", "wo"),
                  ("feed_forward", "gated", "w1", "w3", "w2", False), ("attention_norm", "ffn_norm")),
    # Qwen v1 computes c_proj(w1(x) * silu(w2(x))): the gate is w2.
    "qwen": (("attn", "fused", "c_attn", "c_attn", "c_attn", "c_proj"),
             ("mlp", "gated", "w2", "w1", "c_proj", False), ("ln_1", "ln_2")),
    "baichuan2": (("self_attn", "fused", "W_pack", "W_pack", "W_pack", "o_proj"),
                  ("mlp", "gated", "gate_proj", "up_proj", "down_proj", False),
                  ("input_layernorm", "post_attention_layernorm")),
    # ChatGLM2's swiglu: chunk(2) then silu(x[0]) * x[1], the gate half first.
    "chatglm2": (("self_attention", "fused", "query_key_value", "query_key_value", "query_key_value", "dense"),
                 ("mlp", "gated", "dense_h_to_4h", "dense_h_to_4h", "dense_4h_to_h", True),
                 ("input_layernorm", "post_attention_layernorm")),
}
TRANSFORMERS = {
    "llama": (("self_attn", "separate", "q_proj", "k_proj", "v_proj", "o_proj"),
              ("mlp", "gated", "gate_proj", "up_proj", "down_proj", False),
              ("input_layernorm", "post_attention_layernorm")),
    "gpt_neox": (("attention", "interleaved", "query_key_value", "query_key_value", "query_key_value", "dense"),
                 ("mlp", "plain", None, "dense_h_to_4h", "dense_4h_to_h", False),
                 ("input_layernorm", "post_attention_layernorm")),
    "phi3": (("self_attn", "fused", "qkv_proj", "qkv_proj", "qkv_proj", "o_proj"),
             ("mlp", "gated", "gate_up_proj", "gate_up_proj", "down_proj", True),
             ("input_layernorm", "post_attention_layernorm")),
}


def check_layer(layer: dataflow.Layer | None, expected) -> None:
    assert layer is not None
    (attn, layout, q, k, v, o), (mlp, kind, gate, up, down, fused), (attn_norm, mlp_norm) = expected
    a, m = layer.attention_flow, layer.mlp_flow
    assert (layer.attention, a.layout, a.q, a.k, a.v, a.o) == (attn, layout, q, k, v, o), a
    assert (layer.mlp, m.kind, m.gate, m.up, m.down, m.fused, m.up_first) == (mlp, kind, gate, up, down, fused,
                                                                              False), m
    assert (layer.norms.get("attn_norm"), layer.norms.get("mlp_norm")) == (attn_norm, mlp_norm)
    assert "attn_post_norm" not in layer.norms and "mlp_post_norm" not in layer.norms
    # Every decision names the file and line that made it.
    for evidence in (a.evidence, m.evidence, *layer.evidence.values()):
        file, line, _ = evidence.split(":", 2)
        assert file == layer.file and int(line) > 0, evidence


@pytest.mark.parametrize("name", list(REAL))
def test_real_remote_code_layers(name):
    sources, config = realmodel_code(name)
    check_layer(dataflow.analyze_layer(sources, config), REAL[name])


@pytest.mark.parametrize("name", list(TRANSFORMERS))
def test_transformers_modeling_files(name):
    check_layer(dataflow.analyze_layer(transformers_code(name), {}), TRANSFORMERS[name])


def test_grouped_evidence_points_at_the_cut():
    """InternLM2's q, k, v are cut where the grouped output is sliced, and the evidence says so."""
    sources, config = realmodel_code("internlm2")
    a = dataflow.analyze_layer(sources, config).attention_flow
    line = int(a.evidence.split(":")[1])
    text = sources["modeling_internlm2.py"].splitlines()[line - 1]
    assert "qkv_states[" in text, text


def test_a_branch_the_config_does_not_decide_leaves_the_layout_undecided():
    """ChatGLM2 cuts its fused output one way with multi-query attention and per head without: with no
    config value to pick the branch, the two layouts disagree and the analysis refuses to choose."""
    sources, config = realmodel_code("chatglm2")
    assert config["multi_query_attention"] is True
    undecided = dict(config)
    del undecided["multi_query_attention"]
    layer = dataflow.analyze_layer(sources, undecided)
    assert layer.attention_flow is None
    assert any(why.startswith("self_attention") and "branch the config does not decide" in why
               for why in layer.undecided), layer.undecided
    # ... while the MLP, which does not depend on it, is still read.
    assert layer.mlp_flow.gate == "dense_h_to_4h"


AMBIGUOUS = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 8)
        self.o = nn.Linear(8, 8)

    def forward(self, x, flip):
        first, second, third = self.a(x), self.b(x), self.c(x)
        if flip:
            first, second = second, first
        scores = torch.matmul(first, second.transpose(-1, -2))
        return self.o(torch.matmul(scores.softmax(-1), third))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x):
        return self.down(self.up(x) * self.up(x))


class Layer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.attn = Attention(config)
        self.mlp = MLP(config)

    def forward(self, x):
        return x + self.mlp(self.attn(self.norm(x)))


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([Layer(config) for _ in range(2)])
'''


def test_ambiguous_q_k_v_provenance_is_refused():
    """Which projection gives the queries depends on a runtime flag: the analysis says so, not a guess."""
    layer = dataflow.analyze_layer({"modeling_x.py": AMBIGUOUS}, {})
    assert layer is not None and layer.cls == "Layer"
    assert layer.attention_flow is None
    assert any(why.startswith("attn (Attention)") for why in layer.undecided), layer.undecided
    # An MLP without an activated factor is no gated MLP either.
    assert layer.mlp_flow is None


def test_the_same_code_without_the_flag_is_decided():
    """The control for the test above: without the swap, q is a, k is b, v is c."""
    source = AMBIGUOUS.replace("        if flip:\n            first, second = second, first\n", "")
    layer = dataflow.analyze_layer({"modeling_x.py": source}, {})
    a = layer.attention_flow
    assert (a.layout, a.q, a.k, a.v, a.o) == ("separate", "a", "b", "c", "o")


def test_a_fused_gate_up_with_the_up_half_first_is_marked():
    """silu(x[1]) * x[0]: the gate is the second half, and the analysis marks it."""
    sources, config = realmodel_code("chatglm2")
    flipped = {n: t.replace("return F.silu(x[0]) * x[1]", "return x[0] * F.silu(x[1])") for n, t in sources.items()}
    assert flipped != sources
    mlp = dataflow.analyze_layer(flipped, config).mlp_flow
    assert (mlp.gate, mlp.fused, mlp.up_first) == ("dense_h_to_4h", True, True)


def test_no_decoder_layer_list_gives_none():
    assert dataflow.analyze_layer({"m.py": textwrap.dedent("class A:\n    pass\n")}, {}) is None


def test_the_mapping_loads_an_up_first_gate_up_in_order():
    """A fused gate_up with the up half first: its first rows fill shard 1 (up), the rest shard 0 (gate)."""
    from scaffold.mapping import _Modules, map_in_layer
    from scaffold.spec import Spec

    spec = Spec(intermediate_size=32, mlp_kind="gated", gate_up_layout="fused", gate_up_order="up_first")
    spec.names.update(gate_up_proj="dense_h_to_4h")
    targets = map_in_layer(spec, "mlp.dense_h_to_4h.weight", _Modules.of(spec))
    assert targets == [("mlp.dense_h_to_4h.weight", 1, "rows 0:32"), ("mlp.dense_h_to_4h.weight", 0, "rows 32:64")]
    spec.gate_up_order = "gate_first"
    assert map_in_layer(spec, "mlp.dense_h_to_4h.weight", _Modules.of(spec))[0][1] == 0


# model -> (q norm, k norm, after the rotary embedding), read from transformers' own modeling files
QK_NORMS = {
    "qwen3": ("q_norm", "k_norm", False),
    "hunyuan_v1_dense": ("query_layernorm", "key_layernorm", True),  # norms the rotated q and k
    "nanochat": ("q_norm", "k_norm", True),
    "llama": (None, None, None),
}


@pytest.mark.parametrize("name", sorted(QK_NORMS))
def test_q_k_norms_are_the_modules_applied_to_q_and_to_k_alone(name):
    attention = dataflow.analyze_layer(transformers_code(name), {}).attention_flow
    assert (attention.q_norm, attention.k_norm, attention.qk_norm_after_rope) == QK_NORMS[name]
    if attention.q_norm:
        assert attention.q_norm in attention.qk_norm_evidence


def test_a_fused_projection_viewed_as_heads_by_3_by_head_dim_is_cut_per_head():
    """Persimmon: query_key_value's output viewed (batch, seq, heads, 3, head_dim), then [..., 0, :] etc."""
    attention = dataflow.analyze_layer(transformers_code("persimmon"), {"qk_layernorm": True}).attention_flow
    assert (attention.layout, attention.q) == ("interleaved", "query_key_value")
    assert (attention.q_norm, attention.k_norm, attention.qk_norm_after_rope) == ("q_layernorm", "k_layernorm", False)


# model -> the projection whose activation scales the attention output before o_proj (a gated attention)
OUTPUT_GATES = {"afmoe": "gate_proj", "hy_v3": None, "qwen3": None, "olmo2": None}


@pytest.mark.parametrize("name", sorted(OUTPUT_GATES))
def test_a_gate_on_the_attention_output_is_the_projection_its_activation_multiplies(name):
    """AfMoE: `output * torch.sigmoid(self.gate_proj(hidden_states))` before o_proj (ported: attn_output_gate)."""
    attention = dataflow.analyze_layer(transformers_code(name), {"num_dense_layers": 1}).attention_flow
    assert attention.output_gate == OUTPUT_GATES[name] and attention.o == "o_proj"
    if attention.output_gate:
        line = next(i for i, text in enumerate(transformers_code(name)[f"modeling_{name}.py"].splitlines(), 1)
                    if "output * torch.sigmoid(gate_states)" in text)
        assert attention.output_gate_evidence == f"modeling_{name}.py:{line}"
