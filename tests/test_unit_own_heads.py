"""Heads and MLP widths each layer's modules read for themselves (OpenELM's form), piece by piece: the pure helper
written out as an expression (purefuncs), the heads read from the attention's own __init__ (layerheads), a fused qkv
viewed as (…, q + k + v heads, head_dim) and cut along the heads (dataflow), the rotary base passed under a name of
the code's own (rope). The whole is ported and verified in tests/test_own_heads_port.py."""

from __future__ import annotations

import ast
import sys

import pytest
from own_heads_ckpt import modeling_source

from scaffold.detect import conditions, layerheads, layerwidths, purefuncs, rope

MAKE_DIVISIBLE = '''
def make_divisible(v, divisor=8, min_value=None):
    """A width rounded to a multiple of divisor (the form OpenELM's configuration file holds)."""
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v
'''


def _written_out(call: str, sources: dict) -> ast.expr:
    return purefuncs.inline(ast.parse(call, mode="eval").body, sources)


@pytest.mark.parametrize("multiplier", [0.5, 1.67, 2.83, 4.0, 0.1, 7.77])
def test_a_helper_of_the_code_is_written_out_and_evaluates_as_the_code_computes(multiplier):
    expr = _written_out("int(make_divisible(config.m[layer_idx] * config.d, divisor=config.div))",
                        {"configuration_lab.py": MAKE_DIVISIBLE})
    text = ast.unparse(expr)
    assert "make_divisible" not in text and "config.m[layer_idx] * config.d" in text
    namespace: dict = {}
    exec(MAKE_DIVISIBLE, namespace)  # noqa: S102 - the test runs the helper it wrote itself, to compare
    config = {"m": [multiplier], "d": 1280, "div": 256}
    expected = int(namespace["make_divisible"](multiplier * 1280, divisor=256))
    assert conditions._value(expr, config, {"layer_idx": 0}) == expected


def test_a_clamp_in_a_helper_is_written_as_max():
    helper = "def round_up(value, multiple, floor=None):\n    if floor is None:\n        floor = multiple\n" \
             "    rounded = (int(value) + multiple - 1) // multiple * multiple\n    if rounded < floor:\n" \
             "        rounded = floor\n    return rounded\n"
    text = ast.unparse(_written_out("round_up(config.x, config.k)", {"m.py": helper}))
    assert text == "max((int(config.x) + config.k - 1) // config.k * config.k, config.k)"


@pytest.mark.parametrize("body", [
    "    for i in range(3):\n        v += i\n    return v\n",      # a loop
    "    if v > 1:\n        return v\n    return 1\n",              # an early return
    "    return torch.round(v)\n",                                  # a call of anything but the builtins
    "    return v.item()\n",                                        # an attribute of an argument
])
def test_a_helper_of_any_other_form_is_left_as_a_call(body):
    sources = {"m.py": f"def helper(v):\n{body}"}
    assert ast.unparse(_written_out("helper(config.x)", sources)) == "helper(config.x)"


def test_an_over_large_expansion_is_left_as_a_call():
    # Each step doubles the expression: spelled out, it would be no width a port should carry.
    helper = "def grow(v):\n" + "".join("    v = v * v + v\n" for _ in range(12)) + "    return v\n"
    assert ast.unparse(_written_out("grow(config.x)", {"m.py": helper})) == "grow(config.x)"


def test_heads_read_in_the_attentions_own_init_are_each_layers_query_and_kv_heads():
    sources = {"modeling_ownheads.py": modeling_source()}
    config = {"query_heads": [2, 4, 4], "num_kv_heads": [1, 2, 1], "head_dim": 32, "hidden_size": 128}
    found = layerheads.read(sources, config, "config.hidden_size", 3)
    assert (found.attr, found.query_key, found.query, found.kv_key, found.kv) == (
        "self_attn", "query_heads", [2, 4, 4], "num_kv_heads", [1, 2, 1])
    assert found.where.startswith("modeling_ownheads.py:")
    # An MLP whose width is read whole from a per-layer list (Gemma-3n's) holds no head count.
    widths = [(attr, ast.unparse(w)) for attr, w, _ in layerwidths.width_expressions(sources, "config.hidden_size")]
    query_width = ("config.query_heads[layer_idx] * getattr(config, 'head_dim', config.hidden_size // "
                   "config.num_attention_heads)")
    assert ("self_attn", query_width) in widths
    assert layerheads.read(sources, {**config, "query_heads": 4}, "config.hidden_size", 3) is None


def test_a_fused_qkv_viewed_per_head_is_cut_along_the_heads_only():
    from scaffold.detect import dataflow

    config = {"query_heads": [2, 4, 4], "num_kv_heads": [1, 2, 1], "ffn_multipliers": [0.5, 1.25, 2.0],
              "ffn_divisor": 48, "hidden_size": 128, "head_dim": 32, "num_hidden_layers": 3}
    flow = dataflow.analyze_layer({"modeling_ownheads.py": modeling_source()}, config)
    attn = flow.attention_flow
    assert (attn.layout, attn.q, attn.k, attn.v) == ("fused", "qkv_proj", "qkv_proj", "qkv_proj")
    # The same view cut within each head (the last axis) is no q, k, v split.
    within = modeling_source().replace("qkv.split([self.n_q, self.n_k, self.n_v], dim=2)",
                                       "qkv.split([self.n_q, self.n_k, self.n_v], dim=-1)")
    cut = dataflow.analyze_layer({"modeling_ownheads.py": within}, config)
    assert cut.attention_flow is None  # refused as undecided, not read as a fused split


def test_the_rotary_base_passed_under_a_name_of_the_codes_own_is_read():
    source = '''
import torch
from torch import nn


class LabRotary(nn.Module):
    def __init__(self, model_dim, max_seq_length, freq_constant=10000):
        super().__init__()
        inv_freq = 1.0 / (freq_constant ** (torch.arange(0, model_dim, 2, dtype=torch.float32) / model_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, positions):
        freqs = torch.outer(positions.float(), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.pos_embedding = LabRotary(config.head_dim, config.rope_max_length, freq_constant=config.rope_freq_constant)
'''
    found = rope._passed_base({"modeling_lab.py": source})
    assert found is not None and found.expr == "config.rope_freq_constant"
    assert rope._passed_base({"modeling_lab.py": source.replace("freq_constant=config.rope_freq_constant",
                                                                "freq_constant=500000")}) is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))


def test_the_ports_config_class_gives_vllm_the_keys_the_code_reads_under_its_own_names():
    from scaffold.conventions import config_derived, convention_defaults
    from scaffold.spec import Source, Spec

    spec = Spec()
    spec.set("rope_parameters", {"rope_theta": 10000.0, "rope_type": "default"},
             Source("code", "modeling_lab.py:278: base=config.rope_freq_constant", "config.rope_freq_constant"))
    spec.set("max_position", 2048, Source("config", "config.json max_context_length", "config.max_context_length"))
    config = {"rope_freq_constant": 10000, "max_context_length": 2048, "rope_max_length": 4096}
    assert config_derived(spec, config) == [("rope_theta", "rope_freq_constant"),
                                            ("max_position_embeddings", "max_context_length")]
    assert convention_defaults(spec, config) == [("rope_theta", None), ("max_position_embeddings", None)]
    # Keys vLLM reads itself, where config.json holds them, are left alone.
    assert config_derived(spec, {**config, "rope_theta": 5e5, "max_position_embeddings": 4096}) == []


def test_a_key_naming_the_context_is_the_context_length_before_a_maximum_length():
    from scaffold.detect.sizes import _context_key

    assert _context_key({"max_context_length": 2048, "rope_max_length": 4096}) == "max_context_length"
    assert _context_key({"rope_max_length": 4096}) == "rope_max_length"
    assert _context_key({"max_ctx": 2048, "context_size": 4096}) is None  # two that name it: no choice


def test_a_spec_file_can_hand_the_port_only_pure_arithmetic_helpers(tmp_path):
    from scaffold.purecode import source_problem

    assert source_problem("def half(v, d=2):\n    return v / d\n") is None
    assert "calls os.system" in source_problem("def f(v):\n    return os.system(v)\n")
    assert "not an assignment or a branch" in source_problem("def f(v):\n    import os\n    return v\n")
    assert "not one function definition" in source_problem("x = 1\n")
    assert "Attribute" in source_problem("def f(v):\n    return v.real\n")


def test_verify_names_the_layer_whose_heads_a_tensor_parallel_size_cannot_split():
    from scaffold.spec import Source, Spec
    from scaffold.verify import tp_problem

    spec = Spec()
    for name, value in (("num_layers", 3), ("num_heads", 4), ("num_kv_heads", 2), ("head_dim", 32),
                        ("intermediate_size", 96), ("layer_num_heads", [4, 12, 16]), ("layer_num_kv_heads", [2, 3, 4])):
        spec.set(name, value, Source("config", name))
    assert tp_problem(spec, 1) is None
    assert tp_problem(spec, 2) == ("layer 1's 3 KV heads neither divide into 2 ranks nor replicate evenly on them "
                                   "(vLLM's QKVParallelLinear needs one or the other)")
    spec.set("layer_num_kv_heads", [2, 2, 4], Source("config", "x"))
    assert tp_problem(spec, 2) is None and tp_problem(spec, 4) is None  # 2 KV heads replicate on 4 ranks
    assert tp_problem(spec, 8) == "layer 0's 4 query heads do not divide into 8 ranks"
    spec.set("intermediate_size", 90, Source("config", "x"))
    assert tp_problem(spec, 4) == "layer 0's MLP of 90 rows does not divide into 4 ranks"
