"""detect/layout.py: module names, fused or separate projections, norms and block order from tensor names."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, tensors_for
from helpers import detect_until, fused_tensors, read

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import layout
from scaffold.errors import UnsupportedArchitecture
from scaffold.spec import DEFAULT_NAMES


def test_a_llama_layout_keeps_llamas_names(tmp_path):
    spec = detect_until(read(tmp_path), layout)
    assert spec.qkv_layout == "separate" and spec.gate_up_layout == "separate"
    assert spec.block == "pre_norm" and spec.norm_kind == "rms" and spec.qk_norm == "none"
    assert {role: spec.names[role] for role in DEFAULT_NAMES if role in spec.names} == {
        role: name for role, name in DEFAULT_NAMES.items() if role in spec.names}
    assert spec.qkv_bias is False and spec.tie_word_embeddings is False


def test_fused_qkv_and_gate_up_tensors_are_the_fused_layout(tmp_path):
    shape = Shape(model_type="phi3", architecture="FusedForCausalLM")
    spec = detect_until(read(tmp_path, shape, tensors=fused_tensors(shape)), layout)
    assert spec.qkv_layout == "fused" and spec.gate_up_layout == "fused"
    assert spec.names["qkv_proj"] == "qkv_proj" and spec.names["gate_up_proj"] == "gate_up_proj"


def test_biases_and_per_head_qk_norm_are_seen_in_the_tensors(tmp_path):
    spec = detect_until(read(tmp_path, Shape(family="qwen3", attention_bias=True)), layout)
    assert spec.qkv_bias is True and spec.o_bias is True
    assert spec.qk_norm == "per_head"


def test_no_lm_head_tensor_means_tied_embeddings(tmp_path):
    spec = detect_until(read(tmp_path, Shape(tie=True)), layout)
    assert spec.tie_word_embeddings is True


def _with_sinks(shape):
    from ckpt_factory import tensors_for

    tensors = tensors_for(shape)
    for i in range(shape.layers):
        tensors[f"model.layers.{i}.self_attn.sinks"] = [shape.heads]
    return tensors


def test_attention_sinks_are_the_per_head_tensor_the_code_hands_the_attention_as_s_aux(tmp_path):
    # transformers' granite_swa code passes s_aux=self.sinks to its attention function.
    shape = Shape(model_type="granite_swa", architecture="SinkForCausalLM")
    spec = detect_until(read(tmp_path, shape, tensors=_with_sinks(shape)), layout)
    assert spec.attention_sinks == "sinks"
    assert "s_aux=self.sinks" in spec.source("attention_sinks").detail


def test_a_per_head_tensor_the_code_does_not_use_as_sinks_is_refused(tmp_path):
    import pytest

    from scaffold.errors import UnsupportedArchitecture

    shape = Shape(architecture="SinkForCausalLM")  # Llama's code has no sinks
    with pytest.raises(UnsupportedArchitecture, match=r"self_attn\.sinks"):
        detect_until(read(tmp_path, shape, tensors=_with_sinks(shape)), layout)


def test_a_down_projection_with_the_mlps_only_bias_is_mlp_down_bias_only(tmp_path):
    # TeleChat's MLP: gate_proj and up_proj without a bias, down_proj with one. Read as mlp_bias alone, the port
    # built gate_up_proj with a bias no tensor fills (load refused: "gate_up_proj.bias shard 0 is never loaded").
    shape = Shape()
    tensors = tensors_for(shape)
    for layer in range(shape.layers):
        tensors[f"model.layers.{layer}.mlp.down_proj.bias"] = [shape.hidden]
    spec = detect_until(read(tmp_path, shape, tensors=tensors), layout)
    assert spec.mlp_bias is True and spec.mlp_down_bias_only is True
    both = Shape(mlp_bias=True)
    spec = detect_until(read(tmp_path / "both", both), layout)
    assert spec.mlp_bias is True and spec.mlp_down_bias_only is False


def test_a_norm_on_the_embeddings_in_a_branch_config_json_rules_out_is_no_embedding_norm(tmp_path):
    # TeleChat: `if self.config.embed_layernorm: hidden_states = self.word_embeddings_layernorm(...)`, false in its
    # config.json: the embeddings reach the first layer as they are (refused before as a norm other than the final).
    modeling = """
import torch
from torch import nn


class LabLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size)

    def forward(self, x):
        return self.input_layernorm(x)


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.embed_layernorm:
            self.embed_layernorm = nn.RMSNorm(config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = nn.RMSNorm(config.hidden_size)

    def forward(self, input_ids):
        hidden_states = self.embed_tokens(input_ids)
        if self.config.embed_layernorm:
            hidden_states = self.embed_layernorm(hidden_states)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.norm(hidden_states)
"""
    for flag, expected in ((False, False), (True, None)):
        root = tmp_path / f"flag-{flag}"
        ckpt = read(root, Shape(extra={"embed_layernorm": flag}))
        (root / "modeling_lab.py").write_text(modeling)
        ckpt = read_checkpoint(root)
        if expected is None:  # the branch taken: still a norm other than the final one, still refused
            with pytest.raises(UnsupportedArchitecture, match="a norm on the embeddings"):
                detect_until(ckpt, layout)
        else:
            assert detect_until(ckpt, layout).embedding_norm is False
