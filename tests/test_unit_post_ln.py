"""Post-LN decoder layers (a norm on the sum of the residual and a sublayer's output, block "residual_norm"),
base models without a final norm, and an activation picked from a module-level table: each read from what the
code computes, on GPT-1's own file and on lab-style layers written otherwise."""

from __future__ import annotations

import pytest
from helpers import transformers_code

from scaffold.detect import dataflow
from scaffold.detect.layout import _code_block, _no_final_norm
from scaffold.detect.mlp import code_activation

HEADER = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.q_proj = nn.Linear(8, 8)
        self.k_proj = nn.Linear(8, 8)
        self.v_proj = nn.Linear(8, 8)
        self.out_proj = nn.Linear(8, 8)

    def forward(self, hidden_states):
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        scores = torch.matmul(q, k.transpose(-1, -2)) / 8 ** 0.5
        return self.out_proj(torch.matmul(scores.softmax(-1), v)), scores


class FeedForward(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc_in = nn.Linear(8, 32)
        self.fc_out = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc_out(nn.functional.gelu(self.fc_in(x)))


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.blocks = nn.ModuleList([Layer(config) for _ in range(2)])
'''

# A lab's post-LN layer written unlike GPT-1: named residuals, dropout between, the sums written both ways
# round and on lines of their own, the last norm returned directly.
LAB_POST_LN = HEADER + '''

class Layer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.mixer = Attention(config)
        self.mixer_ln = nn.LayerNorm(8)
        self.ffn = FeedForward(config)
        self.ffn_ln = nn.LayerNorm(8)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden_states, mask=None):
        residual = hidden_states
        hidden_states, _weights = self.mixer(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = residual + hidden_states
        hidden_states = self.mixer_ln(hidden_states)
        residual = hidden_states
        hidden_states = self.ffn(hidden_states)
        hidden_states = self.dropout(hidden_states)
        summed = hidden_states + residual
        return self.ffn_ln(summed)
'''

# OLMo-2's placement: the norm on the sublayer's output, added to the residual afterwards (block post_norm).
NORM_ON_OUTPUT = HEADER + '''

class Layer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.mixer = Attention(config)
        self.mixer_ln = nn.LayerNorm(8)
        self.ffn = FeedForward(config)
        self.ffn_ln = nn.LayerNorm(8)

    def forward(self, x):
        a, _ = self.mixer(x)
        x = x + self.mixer_ln(a)
        return x + self.ffn_ln(self.ffn(x))
'''

# The norms read a product of the residual and the sublayer, not their sum.
PRODUCT = LAB_POST_LN.replace("hidden_states = residual + hidden_states", "hidden_states = residual * hidden_states")

# Post-LN norms, but the layer hands on the sum before the last norm plus its normed value.
RETURNS_MORE = LAB_POST_LN.replace("return self.ffn_ln(summed)", "return self.ffn_ln(summed) + residual")


def layer_of(code: str) -> dataflow.Layer:
    layer = dataflow.analyze_layer({"modeling_lab.py": code}, {})
    assert layer is not None and layer.attention == "mixer", layer
    return layer


def test_gpt1_reads_as_post_ln():
    layer = dataflow.analyze_layer(transformers_code("openai"), {"afn": "gelu"})
    assert layer.norms == {"attn_post_norm": "ln_1", "mlp_post_norm": "ln_2"}
    assert "modeling_openai.py:148" in layer.residual_norm, layer.residual_norm
    assert _code_block(layer.norms, None, layer.mlp_norm_parallel, layer.residual_norm)[0] == "residual_norm"


def test_a_lab_post_ln_layer_written_otherwise():
    layer = layer_of(LAB_POST_LN)
    assert layer.norms == {"attn_post_norm": "mixer_ln", "mlp_post_norm": "ffn_ln"}
    assert "mixer_ln" in layer.residual_norm and "ffn_ln" in layer.residual_norm
    block, _detail, roles = _code_block(layer.norms, None, layer.mlp_norm_parallel, layer.residual_norm)
    assert (block, roles) == ("residual_norm", {"attn_post_norm": "mixer_ln", "mlp_post_norm": "ffn_ln"})


@pytest.mark.parametrize("code", [NORM_ON_OUTPUT, PRODUCT, RETURNS_MORE], ids=["norm-on-output", "product",
                                                                            "returns-more"])
def test_what_is_not_a_post_ln_block_is_not_read_as_one(code):
    layer = layer_of(code)
    assert layer.residual_norm == ""
    found = _code_block(layer.norms, None, layer.mlp_norm_parallel, layer.residual_norm)
    assert found is None or found[0] != "residual_norm"


def test_the_norm_on_the_output_stays_olmo2s_post_norm():
    layer = layer_of(NORM_ON_OUTPUT)
    assert _code_block(layer.norms, None, layer.mlp_norm_parallel, layer.residual_norm)[0] == "post_norm"


@pytest.mark.parametrize("model, config", [("gpt2", {"add_cross_attention": False}), ("llama", {})])
def test_pre_ln_layers_are_untouched(model, config):
    layer = dataflow.analyze_layer(transformers_code(model), config)
    assert layer.residual_norm == ""
    assert _code_block(layer.norms, None, layer.mlp_norm_parallel, layer.residual_norm)[0] == "pre_norm"


def test_no_final_norm_is_read_from_the_base_models_forward():
    said = _no_final_norm(transformers_code("openai"))
    assert "OpenAIGPTModel.forward calls none of its modules after its loop over self.h" in said
    assert _no_final_norm(transformers_code("gpt2")) == ""  # ln_f after the loop
    # A lab's base model that builds no norm but calls a module after its loop: not "no final norm".
    after = HEADER.replace("self.blocks = nn.ModuleList", "self.proj = nn.Linear(8, 8)\n        self.blocks = "
                                                           "nn.ModuleList") + '''

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.proj(x)
'''
    assert _no_final_norm({"modeling_lab.py": after}) == ""


@pytest.mark.parametrize("afn, act", [("gelu", "gelu_new"), ("relu", "relu"), ("silu", "silu")])
def test_an_activation_picked_from_a_module_level_table(afn, act):
    found = code_activation(transformers_code("openai"), "mlp", {"afn": afn})
    assert found is not None and found[0] == act, found
    assert found[1].startswith("modeling_openai.py:")
    assert code_activation(transformers_code("openai"), "mlp", {}) is None  # no key: not guessed


def test_cross_attention_is_the_modules_run_only_on_encoder_states():
    """TrOCR's causal-LM class sets config.is_decoder, so every layer builds encoder_attn (and its norm), run only
    under `encoder_hidden_states is not None`: named, for the layout to refuse where the checkpoint holds them.
    GPT-2's crossattention is named the same way; its checkpoints without add_cross_attention hold no tensor of it."""
    trocr = dataflow.encoder_only_modules(transformers_code("trocr"))
    assert set(trocr) == {"encoder_attn", "encoder_attn_layer_norm"}
    assert "modeling_trocr.py:" in trocr["encoder_attn"] and "encoder_hidden_states is not None" in trocr["encoder_attn"]
    assert set(dataflow.encoder_only_modules(transformers_code("gpt2"))) == {"crossattention", "ln_cross_attn"}
    assert dataflow.encoder_only_modules(transformers_code("openai")) == {}
    assert dataflow.encoder_only_modules(transformers_code("llama")) == {}


GPT1_NAMES = {"model": "transformer", "layers": "h", "embed_positions": "positions_embed",
              "embed_tokens": "tokens_embed", "lm_head": "lm_head", "self_attn": "attn", "qkv_proj": "c_attn",
              "o_proj": "c_proj", "mlp": "mlp", "up_proj": "c_fc", "down_proj": "c_proj",
              "attn_post_norm": "ln_1", "mlp_post_norm": "ln_2"}


def test_a_spec_file_may_leave_out_the_final_norm_but_a_post_ln_block_needs_its_two_norms():
    from scaffold.errors import SpecError
    from scaffold.spec import Spec, validate_names

    spec = Spec(block="residual_norm", names=dict(GPT1_NAMES), position_scheme="learned", mlp_kind="plain")
    validate_names(spec, "spec.toml")  # no names.norm: no final norm
    for change in ({"mlp_norm": "ln_2"}, {"mlp_post_norm": None}):
        names = {k: v for k, v in {**GPT1_NAMES, **change}.items() if v is not None}
        with pytest.raises(SpecError, match="residual_norm"):
            validate_names(Spec(block="residual_norm", names=names, position_scheme="learned", mlp_kind="plain"),
                           "spec.toml")
    with pytest.raises(SpecError, match="embedding_norm"):
        validate_names(Spec(block="residual_norm", names=dict(GPT1_NAMES), position_scheme="learned",
                            mlp_kind="plain", embedding_norm=True), "spec.toml")


def test_opt_350m_reads_as_post_ln_where_its_config_says_so():
    """OPT's layer branches on self.do_layer_norm_before, flattens the tokens around its MLP and views the sum back
    before the last norm: with do_layer_norm_before false it is post-LN, and its base model builds no final norm."""
    post = dataflow.analyze_layer(transformers_code("opt"), {"do_layer_norm_before": False})
    assert post.norms == {"attn_post_norm": "self_attn_layer_norm", "mlp_post_norm": "final_layer_norm"}
    assert "modeling_opt.py:" in post.residual_norm
    pre = dataflow.analyze_layer(transformers_code("opt"), {"do_layer_norm_before": True})
    assert pre.residual_norm == "" and pre.norms == {"attn_norm": "self_attn_layer_norm",
                                                      "mlp_norm": "final_layer_norm"}
    config = {"do_layer_norm_before": False, "_remove_final_layer_norm": False, "word_embed_proj_dim": 8,
              "hidden_size": 8}
    assert "OPTDecoder.forward calls none of its modules after its loop" in _no_final_norm(
        transformers_code("opt"), config)
    assert _no_final_norm(transformers_code("opt"), {**config, "do_layer_norm_before": True}) == ""
    assert _no_final_norm(transformers_code("opt"), {}) == ""  # the branch undecided: the norm may be built


# A lab's post-LN layer that flattens the tokens for its MLP and views the sum back, reshapes written two ways.
LAB_FLATTENED = LAB_POST_LN.replace(
    "        residual = hidden_states\n        hidden_states = self.ffn(hidden_states)",
    "        shape = hidden_states.shape\n        hidden_states = hidden_states.view(-1, shape[-1])\n"
    "        residual = hidden_states\n        hidden_states = self.ffn(hidden_states)").replace(
    "        summed = hidden_states + residual\n",
    "        summed = torch.reshape(hidden_states + residual, shape)\n")


def test_a_lab_post_ln_layer_that_flattens_its_tokens():
    assert "hidden_states.view(-1" in LAB_FLATTENED and "torch.reshape(" in LAB_FLATTENED
    layer = layer_of(LAB_FLATTENED)
    assert layer.norms == {"attn_post_norm": "mixer_ln", "mlp_post_norm": "ffn_ln"}, layer
    assert layer.residual_norm


# A base model that builds its final norm only under a flag config.json turns off.
FLAGGED_FINAL_NORM = HEADER + '''
        if config.final_norm:
            self.norm_out = nn.LayerNorm(8)
        else:
            self.norm_out = None

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        if self.norm_out is not None:
            x = self.norm_out(x)
        return x
'''


def test_a_final_norm_built_only_under_a_flag_config_turns_off():
    code = {"modeling_lab.py": FLAGGED_FINAL_NORM}
    assert "Model.forward calls none of its modules" in _no_final_norm(code, {"final_norm": False})
    assert _no_final_norm(code, {"final_norm": True}) == ""
    assert _no_final_norm(code, {}) == ""
