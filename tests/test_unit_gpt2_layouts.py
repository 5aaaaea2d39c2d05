"""GPT-2 style layouts, read from the code: Conv1D weights stored [in, out], learned absolute positions, c_attn.

The code read here is real: the osprey lab example (examples/labs/osprey, a GPT-2 style model written the way a
lab writes one) and transformers' own GPT-2, GPTBigCode and OPT modeling files of the installed version. The
checkpoints are built for real (examples/labs/build.py, scaffold.tiny); nothing is mocked.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import EXAMPLES

from scaffold.analysis import analyze
from scaffold.detect import dataflow, detect
from scaffold.detect.linears import linear_classes
from scaffold.detect.mlp import _activation_functions
from scaffold.detect.positions import learned_positions
from scaffold.errors import ScaffoldError
from scaffold.mapping import weight_table

OSPREY = EXAMPLES / "labs" / "osprey"


def osprey_code() -> dict:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(OSPREY.glob("*.py"))}


def transformers_code(model: str) -> dict:
    root = Path(next(iter(importlib.util.find_spec("transformers").submodule_search_locations)))
    path = root / "models" / model / f"modeling_{model}.py"
    return {path.name: path.read_text(encoding="utf-8")}


@pytest.fixture(scope="module")
def osprey(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("labs")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "labs" / "build.py"), str(out), "osprey"],
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / "osprey"


def test_a_labs_conv1d_is_a_linear_stored_in_out():
    """osprey's Conv1D(nf, nx) computes addmm(b, x, W) with W [nx, nf]: transposed, input width second."""
    found = linear_classes(osprey_code())["Conv1D"]
    assert (found.transposed, found.in_arg, found.out_arg) == (True, 1, 0)
    assert "modeling_osprey.py" in found.where


def test_a_linear_class_that_multiplies_by_the_transpose_is_stored_out_in():
    code = textwrap.dedent("""
        import torch
        from torch import nn
        import torch.nn.functional as F

        class Proj(nn.Module):
            def __init__(self, d_in, d_out):
                super().__init__()
                self.weight = nn.Parameter(torch.empty(d_out, d_in))

            def forward(self, x):
                return F.linear(x, self.weight)

        class Conv1D(nn.Module):  # a lab's own class of that name, stored [out, in]
            def __init__(self, d_in, d_out):
                super().__init__()
                self.weight = nn.Parameter(torch.empty(d_out, d_in))

            def forward(self, x):
                return x @ self.weight.T
    """)
    classes = linear_classes({"m.py": code})
    assert (classes["Proj"].transposed, classes["Proj"].in_arg, classes["Proj"].out_arg) == (False, 0, 1)
    assert classes["Conv1D"].transposed is False


def test_learned_positions_are_the_table_indexed_by_positions():
    found = learned_positions(osprey_code())
    assert (found.tokens, found.positions, found.offset) == ("token_table", "position_table", 0)
    gpt2 = learned_positions(transformers_code("gpt2"))
    assert (gpt2.tokens, gpt2.positions, gpt2.offset) == ("wte", "wpe", 0)
    # OPT's table subclasses nn.Embedding and looks up position + 2.
    opt = learned_positions(transformers_code("opt"))
    assert (opt.tokens, opt.positions, opt.offset) == ("embed_tokens", "embed_positions", 2)
    assert learned_positions(transformers_code("llama")) is None


def test_a_hand_written_tanh_gelu_is_gelu_new():
    assert _activation_functions(osprey_code()) == {"new_gelu": "gelu_new"}


def test_gpt2_self_attention_is_read_without_its_cross_attention_branch():
    """GPT-2's attention class serves cross-attention too (q_attn, encoder_hidden_states): a decoder-only
    checkpoint has neither, and the self-attention path splits c_attn into q, k, v thirds."""
    flow = dataflow.analyze_layer(transformers_code("gpt2"), {"add_cross_attention": False}, "h")
    assert flow.attention == "attn" and flow.attention_flow.layout == "fused"
    assert flow.attention_flow.q == "c_attn" and flow.attention_flow.o == "c_proj"
    assert (flow.mlp_flow.up, flow.mlp_flow.down) == ("c_fc", "c_proj")
    assert flow.norms == {"attn_norm": "ln_1", "mlp_norm": "ln_2"}


@pytest.mark.slow  # ~12 s on 2 cores: builds the osprey lab model in transformers
def test_osprey_spec_reads_its_gpt2_layout(osprey):
    from scaffold.checkpoint import read_checkpoint

    spec = detect(read_checkpoint(osprey))
    assert spec.position_scheme == "learned" and spec.position_offset == 0
    assert spec.names["embed_positions"] == "position_table" and spec.names["embed_tokens"] == "token_table"
    assert spec.source("max_position").expr == "config.context_length"
    assert spec.source("vocab_size").expr == "config.vocab"
    assert spec.transposed_roles == ["qkv_proj", "o_proj", "up_proj", "down_proj"]
    assert spec.source("intermediate_size").expr == "config.mlp_ratio * config.width"
    assert spec.hidden_act == "gelu_new" and spec.qkv_layout == "fused"


@pytest.mark.slow  # shares the ~12 s osprey fixture
def test_osprey_weight_table_transposes_the_conv1d_weights_only(osprey):
    analysis = analyze(osprey)
    rows = {(r.checkpoint, r.shard): r for r in analysis.rows}
    assert "transposed on load" in rows[("osprey.layers.0.attention.c_attn.weight", "q")].note
    assert "transposed on load" in rows[("osprey.layers.1.mlp.c_down.weight", None)].note
    assert "transposed" not in rows[("osprey.layers.0.attention.c_attn.bias", "q")].note
    assert "transposed" not in rows[("unembed.weight", None)].note  # an nn.Linear
    assert rows[("osprey.position_table.weight", None)].param == "osprey.position_table.weight"


@pytest.mark.slow  # shares the ~12 s osprey fixture
def test_a_spec_can_only_transpose_roles_the_port_has(osprey, tmp_path):
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text('[spec]\ntransposed_roles = ["qkv_proj", "o_proj", "up_proj", "down_proj", "router"]\n')
    with pytest.raises(ScaffoldError, match="transposed_roles lists 'router'"):
        analyze(osprey, spec_file)


def test_gpt_bigcode_multi_query_c_attn_holds_one_kv_head(tmp_path):
    """gpt_bigcode's c_attn (an nn.Linear) holds q, then one k and one v head under multi_query: the rows say
    so, whatever num_key_value_heads a config carries that the code never reads."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.tiny import BASE, build_tiny

    build_tiny("gpt_bigcode", tmp_path / "ckpt", architecture="CatalogueGPTBigCodeForCausalLM",
               overrides={**BASE, "multi_query": True})
    spec = detect(read_checkpoint(tmp_path / "ckpt"))
    assert spec.num_kv_heads == 1 and spec.qkv_layout == "fused"
    assert spec.transposed_roles == [] and spec.position_scheme == "learned"
    assert spec.names["embed_positions"] == "wpe"
    rows, homeless = weight_table(spec, read_checkpoint(tmp_path / "ckpt"))
    assert not homeless and any(r.checkpoint == "transformer.wpe.weight" for r in rows)


def tiny(model_type: str, out: Path, **overrides) -> Path:
    from scaffold.tiny import BASE, build_tiny

    return build_tiny(model_type, out, architecture=f"Catalogue{model_type.title().replace('_', '')}ForCausalLM",
                      overrides={**BASE, **overrides})


def test_gpt2_attention_scaling_flags_are_read_or_refused_by_name(tmp_path):
    from scaffold.checkpoint import read_checkpoint
    from scaffold.errors import UnsupportedArchitecture

    spec = detect(read_checkpoint(tiny("gpt2", tmp_path / "unscaled", scale_attn_weights=False)))
    assert spec.attention_scale == 1.0 and "scale_attn_weights" in str(spec.source("attention_scale"))
    with pytest.raises(UnsupportedArchitecture, match=r"scaled by 1 / \(layer index \+ 1\)"):
        detect(read_checkpoint(tiny("gpt2", tmp_path / "inverse", scale_attn_by_inverse_layer_idx=True)))


def test_gpt_neo_wrapper_unscaled_scores_and_local_window_are_read_from_its_code(tmp_path):
    """GPT-Neo: q/k/v/out_proj one module below the attention wrapper (attn.attention), loaded onto the port's
    attn by whole name components; scores not divided by sqrt(head_dim); the local layers' window built into the
    causal mask (tril(bias, -config.window_size)) on the layers config.attention_layers calls local."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.spec import renamed_substrings

    ckpt = read_checkpoint(tiny("gpt_neo", tmp_path / "ckpt", window_size=8,
                                attention_types=[[["global", "local"], 1], [["global"], 1]]))
    spec = detect(ckpt)
    assert (spec.names["self_attn"], spec.names["attn_inner"]) == ("attn", "attention")
    assert (spec.names["q_proj"], spec.names["o_proj"], spec.qkv_layout) == ("q_proj", "out_proj", "separate")
    assert (spec.qkv_bias, spec.o_bias, spec.position_scheme) == (False, True, "learned")
    assert spec.attention_scale == 1.0 and spec.source("attention_scale").kind == "code"
    assert "modeling_gpt_neo.py:" in spec.source("attention_scale").detail
    assert spec.sliding_window == 8 and spec.source("sliding_window").expr == "config.window_size"
    assert spec.sliding_window_layers == [1]
    assert spec.source("sliding_window_layers").expr == "config.attention_layers[layer_idx] == 'local'"
    assert renamed_substrings(spec) == {".attn.attention.": ".attn."}
    rows, homeless = weight_table(spec, ckpt)
    assert not homeless
    loads = {r.checkpoint: (r.param, r.shard) for r in rows}
    assert loads["transformer.h.1.attn.attention.k_proj.weight"] == ("transformer.h.1.attn.qkv_proj.weight", "k")
    assert loads["transformer.h.1.attn.attention.out_proj.bias"] == ("transformer.h.1.attn.out_proj.bias", None)


@pytest.mark.parametrize("model_type, overrides, feature", [
    # OPT-350m: embeddings of width word_embed_proj_dim, projected to the hidden size and back.
    ("opt", {"word_embed_proj_dim": 64}, r"embeddings of width word_embed_proj_dim = 64, where hidden_size is"),
])
def test_gpt2_family_forms_not_expressed_yet_are_refused_by_name(model_type, overrides, feature, tmp_path):
    """Forms of the GPT-2 family the templates cannot express yet: one line naming the form, no field dump."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.errors import UnsupportedArchitecture

    with pytest.raises(UnsupportedArchitecture, match=feature) as refused:
        detect(read_checkpoint(tiny(model_type, tmp_path / "ckpt", **overrides)))
    assert "spec field(s)" not in refused.value.problem


def test_opt_mlp_on_the_layer_learned_positions_offset_by_two(tmp_path):
    """OPT keeps fc1, fc2 on the decoder layer (no MLP module) and looks its position table up at position + 2;
    the port keeps them in an `mlp` module, renamed on load."""
    from scaffold.checkpoint import read_checkpoint

    ckpt = read_checkpoint(tiny("opt", tmp_path / "ckpt"))
    spec = detect(ckpt)
    assert spec.mlp_on_layer and spec.names["mlp"] == "mlp"
    assert (spec.names["up_proj"], spec.names["down_proj"]) == ("fc1", "fc2") and spec.mlp_kind == "plain"
    assert (spec.names["attn_norm"], spec.names["mlp_norm"]) == ("self_attn_layer_norm", "final_layer_norm")
    assert spec.position_scheme == "learned" and spec.position_offset == 2
    assert spec.names["embed_positions"] == "decoder.embed_positions"
    rows, homeless = weight_table(spec, ckpt)
    params = {r.checkpoint: r.param for r in rows}
    assert not homeless
    assert params["model.decoder.layers.1.fc2.weight"] == "model.layers.1.mlp.fc2.weight"
    assert params["model.decoder.embed_positions.weight"] == "model.embed_positions.weight"


def test_biogpt_embedding_scale_switched_on_by_its_config_flag(tmp_path):
    from scaffold.checkpoint import read_checkpoint

    on = detect(read_checkpoint(tiny("biogpt", tmp_path / "on", scale_embedding=True)))
    assert on.embedding_multiplier == pytest.approx(128**0.5) and on.mlp_on_layer
    off = detect(read_checkpoint(tiny("biogpt", tmp_path / "off", scale_embedding=False)))
    assert off.embedding_multiplier is None
