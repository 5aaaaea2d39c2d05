"""The top level of real remote-code models (../shared/realmodels): which class is the causal LM, where the
layer list, embedding, final norm and head sit, and which config keys hold the sizes, read from the
checkpoint's own modeling source (never run).

chatglm2 keeps everything off the usual paths (transformer.encoder.layers.N, transformer.embedding.
word_embeddings, its head transformer.output_layer inside the base model, a stored rotary buffer) and names
its sizes num_layers, padded_vocab_size, kv_channels, multi_query_group_num, ffn_hidden_size. qwen (v1) calls
its causal LM QWenLMHeadModel, its layer list transformer.h, and sizes its MLP config.intermediate_size // 2.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from ckpt_factory import Shape, tensors_for, write_checkpoint
from helpers import detect_until, own_weight_tests_pass, scaffold

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import SpecIncomplete, codekeys, identity, layout, sizes
from scaffold.detect import detect as detect_all
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import Spec

TOLERANCE = 1e-4


def exprs(spec, *fields):
    return {f: spec.source(f).expr for f in fields}


def edited_copy(src, dst, *, config=None, source=None):
    """A copy of a built real model with config.json keys replaced and/or modeling-source text replaced."""
    shutil.copytree(src, dst)
    if config:
        data = json.loads((dst / "config.json").read_text())
        data.update(config)
        (dst / "config.json").write_text(json.dumps(data))
    for file, (old, new) in (source or {}).items():
        text = (dst / file).read_text()
        assert old in text, f"{old!r} not in {file}: the real model's source changed"
        (dst / file).write_text(text.replace(old, new))
    return dst


# ------------------------------------------------------------------ chatglm2
@pytest.mark.slow  # ~13 s on 2 cores: builds chatglm2 from shared/realmodels
def test_chatglm2_top_level_and_sizes_from_its_code(realmodel):
    spec = detect_all(read_checkpoint(realmodel("chatglm2")))
    assert spec.architecture == "CustomChatGLMForConditionalGeneration"  # auto_map's AutoModelForCausalLM
    n = spec.names
    assert (n["model"], n["layers"], n["embed_tokens"], n["norm"], n["lm_head"]) == (
        "transformer", "encoder.layers", "embedding.word_embeddings", "encoder.final_layernorm",
        "transformer.output_layer")
    assert exprs(spec, "num_layers", "vocab_size", "head_dim", "intermediate_size", "num_kv_heads") == {
        "num_layers": "config.num_layers",
        "vocab_size": "config.padded_vocab_size",
        "head_dim": "config.kv_channels",
        "intermediate_size": "config.ffn_hidden_size",
        "num_kv_heads": "(config.multi_query_group_num if config.multi_query_attention "
                        "else config.num_attention_heads)",
    }
    assert (spec.num_layers, spec.vocab_size, spec.head_dim, spec.intermediate_size, spec.num_kv_heads) == (
        2, 512, 32, 512, 2)
    assert spec.norm_eps == 1e-5 and "layernorm_epsilon" in spec.source("norm_eps").detail
    # The stored rotary buffer is registered by the code: dropped on load, and its length says 16 of 32 dims rotate.
    assert spec.skipped_tensors == ["transformer.rotary_pos_emb.inv_freq"]
    assert spec.partial_rotary_factor == 0.5 and spec.rope_neox_style is False
    assert (spec.mlp_kind, spec.gate_up_layout, spec.qkv_layout) == ("gated", "fused", "fused")


@pytest.mark.slow  # shares the ~10 s realmodel fixture (builds chatglm2 from shared/realmodels)
def test_chatglm2_layer_count_is_read_under_the_codes_key(realmodel, tmp_path):
    """num_layers is the key the code counts its layers with: a wrong value there is refused."""
    ckpt = edited_copy(realmodel("chatglm2"), tmp_path / "chatglm2", config={"num_layers": 3})
    with pytest.raises(CheckpointError, match="config.json says 3 layers but the tensors hold layers 0..1"):
        detect_all(read_checkpoint(ckpt))


@pytest.mark.slow  # shares the ~10 s realmodel fixture (builds chatglm2 from shared/realmodels)
def test_chatglm2_vocab_is_read_under_the_codes_key(realmodel, tmp_path):
    ckpt = edited_copy(realmodel("chatglm2"), tmp_path / "chatglm2", config={"padded_vocab_size": 640})
    with pytest.raises(CheckpointError, match="vocab_size 640 .* but transformer.embedding.word_embeddings.weight"):
        detect_all(read_checkpoint(ckpt))


@pytest.mark.slow  # shares the ~10 s realmodel fixture (builds chatglm2 from shared/realmodels)
def test_a_numbered_block_the_code_does_not_build_is_refused(realmodel, tmp_path):
    """The code builds its ModuleList under another name than the tensors' numbered block: no guessing."""
    ckpt = edited_copy(realmodel("chatglm2"), tmp_path / "chatglm2", source={
        "modeling_chatglm.py": ("self.layers = torch.nn.ModuleList(", "self.blocks = torch.nn.ModuleList(")})
    # Not guessed: names.model and names.layers stay unknown, for a spec file to settle.
    with pytest.raises(SpecIncomplete, match=r"names.model, names.layers: the tensors' numbered block is "
                                             r"transformer\.encoder\.layers\.N but the modeling source builds its "
                                             r"layer list as self\.blocks"):
        detect_all(read_checkpoint(ckpt))


@pytest.mark.slow  # shares the ~10 s realmodel fixture (builds chatglm2 from shared/realmodels)
def test_auto_map_naming_another_class_is_refused(realmodel, tmp_path):
    ckpt = edited_copy(realmodel("chatglm2"), tmp_path / "chatglm2", config={
        "auto_map": {"AutoModelForCausalLM": "modeling_chatglm.ChatGLMForSequenceClassification"}})
    with pytest.raises(UnsupportedArchitecture, match="auto_map names 'ChatGLMForSequenceClassification'"):
        detect_all(read_checkpoint(ckpt))


@pytest.mark.engine
def test_chatglm2_ports_and_verifies_at_parity(realmodel, workdir):
    out = workdir / "port-chatglm2-toplevel"
    scaffold("new", realmodel("chatglm2"), "-o", out, "--force", "--trust-remote-code")
    model = next(out.glob("*/model.py")).read_text()
    assert '"transformer.encoder.layers.": "transformer.layers."' in model  # WeightsMapper, vLLM's idiom
    report = json.loads(scaffold("verify", out, "--json", "--trust-remote-code").stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["passed"], json.dumps(report, indent=2)
    assert checks["port loaded by vLLM"]["status"] == "pass"
    assert checks["parity: log-probabilities"]["max_delta"] <= TOLERANCE
    assert checks["parity: greedy continuation"]["status"] == "pass"
    # The port's own weight-mapping tests, which read the checkpoint's names through its hf_to_vllm_mapper.
    assert re.search(r"\b8 passed\b", own_weight_tests_pass(out, at_least=8))


# ------------------------------------------------------------------ qwen (v1)
@pytest.mark.slow  # ~14 s on 2 cores: builds qwen from shared/realmodels
def test_qwen_gets_past_identity_layer_list_and_sizes(realmodel):
    ckpt = read_checkpoint(realmodel("qwen"))
    spec = detect_until(ckpt, sizes)
    assert (spec.architecture, spec.class_prefix) == ("QWenLMHeadModel", "QWen")
    assert exprs(spec, "head_dim", "intermediate_size", "num_layers") == {
        "head_dim": "config.kv_channels", "intermediate_size": "config.intermediate_size // 2",
        "num_layers": "config.num_hidden_layers"}
    assert (spec.head_dim, spec.intermediate_size) == (32, 512)  # 1024 // 2: w1, w2 and c_proj's width
    code = codekeys.code_sources(ckpt)
    prefix, layers = layout.layer_list(ckpt, code)
    assert (prefix, layers) == ("transformer", "h")
    # Inside a layer, the roles come from its code: c_attn fused, and w2 (the activated operand) is the gate.
    layout.detect(ckpt, spec)
    n = spec.names
    assert (n["self_attn"], n["qkv_proj"], spec.qkv_layout, spec.qkv_bias) == ("attn", "c_attn", "fused", True)
    assert (n["gate_proj"], n["up_proj"], n["down_proj"]) == ("w2", "w1", "c_proj")


# ------------------------------------------------------------------ transformers' gpt2 (no source)
def test_gpt2_sizes_through_its_config_class_attribute_map(tmp_path):
    """GPT2Config keeps hidden_size as n_embd (attribute_map), read from transformers' configuration file."""
    shape = Shape()
    config = {"model_type": "gpt2", "architectures": ["TinyGPT2ForCausalLM"], "n_embd": shape.hidden,
              "n_layer": shape.layers, "n_head": shape.heads, "n_positions": 64, "vocab_size": shape.vocab}
    write_checkpoint(tmp_path, shape, tensors=tensors_for(shape), config=config)
    ckpt = read_checkpoint(tmp_path)
    assert codekeys.attribute_map(ckpt)["hidden_size"] == "n_embd"
    spec = detect_until(ckpt, sizes)
    assert exprs(spec, "hidden_size", "num_layers", "num_heads", "max_position") == {
        "hidden_size": "config.n_embd", "num_layers": "config.n_layer", "num_heads": "config.n_head",
        "max_position": "config.n_positions"}
    assert "attribute_map: hidden_size" in spec.source("hidden_size").detail
    assert (spec.hidden_size, spec.num_layers, spec.max_position) == (shape.hidden, shape.layers, 64)


def test_gpt2_architecture_without_auto_map_keeps_transformers_naming_rule(tmp_path):
    """No auto_map: the class must be named ...ForCausalLM (GPT2LMHeadModel is refused as before)."""
    shape = Shape()
    write_checkpoint(tmp_path, shape, config={"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                                              "n_embd": shape.hidden, "n_layer": 2, "n_head": 2,
                                              "vocab_size": shape.vocab})
    with pytest.raises(UnsupportedArchitecture, match="is not a causal language model"):
        identity.detect(read_checkpoint(tmp_path), Spec())


def test_code_expressions_follow_assignments_and_refuse_other_names():
    import ast

    func = ast.parse("def __init__(self, config):\n    self.n = config.num_layers\n    d = config.intermediate_size"
                     " // 2\n    w = d\n    x = other.size\n").body[0]
    values = {n.targets[0].attr if isinstance(n.targets[0], ast.Attribute) else n.targets[0].id: n.value
              for n in func.body}
    assert codekeys.config_expr(ast.parse("self.n", mode="eval").body, func)[0] == "config.num_layers"
    assert codekeys.config_expr(ast.parse("w", mode="eval").body, func)[0] == "config.intermediate_size // 2"
    assert codekeys.config_expr(values["x"], func) is None  # not an expression over config
    assert codekeys.evaluate("config.intermediate_size // 2", {"intermediate_size": 1024}) == 512
    assert codekeys.evaluate("config.n_embd", {"hidden_size": 8}, {"n_embd": "hidden_size"}) == 8
    assert codekeys.evaluate("config.missing", {}) is None
