"""Per-layer attention sizes: a decoder layer that builds its attention with `config.KEY[layer_idx]` (Laguna's
num_attention_heads_per_layer) gets each layer's query heads from that key, where every layer's tensors say so;
any other use of such a per-layer value stays refused by name. Beside it, what Laguna needed besides: a router
transform under a condition config.json decides (its logit soft-capping, off at 0.0), a partial rotary factor of
each layer type's own, and the routing correction bias the checkpoint keeps under the experts."""

from __future__ import annotations

import re

import pytest
from ckpt_factory import Shape, tensors_for
from helpers import LAB_PRELUDE, detect_until, transformers_code

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import attention, layout, mlp, policy, rope, routing
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.model_context import routing_choices
from scaffold.spec import Spec

# A lab's decoder written unlike Laguna's: the attention is `attention`, its head count a keyword of its own kept as
# self.h, the per-layer list under another key.
LAB_CODE = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx, n_heads):
        super().__init__()
        self.h = n_heads
        self.d = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.d).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))


class LabMLP(nn.Module):
    def __init__(self, config, width):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LabLayer(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        self.attention = LabAttention(config, idx, n_heads=config.heads_by_layer[idx])
        self.mlp = LabMLP(config, config.intermediate_size)
        self.input_layernorm = LabRMSNorm(config.hidden_size)
        self.post_attention_layernorm = LabRMSNorm(config.hidden_size)

    def forward(self, x, cos, sin, mask):
        x = x + self.attention(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = LabRMSNorm(config.hidden_size)
'''


def _lab(tmp_path, heads=(4, 2), stored=None, code=LAB_CODE, extra=None):
    """A lab checkpoint whose layer i has heads[i] query heads in config.json and stored[i] in its tensors."""
    from ckpt_factory import write_checkpoint

    shape = Shape(architecture="LabForCausalLM", model_type="lab_layer_heads", layers=len(heads),
                  extra={"heads_by_layer": list(heads), **(extra or {})})
    tensors = {}
    for name, dims in tensors_for(shape).items():
        name = name.replace(".self_attn.", ".attention.")
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        rows = (stored or heads)[layer] * shape.head_dim if layer is not None else None
        if name.endswith("attention.q_proj.weight"):
            dims = [rows, shape.hidden]
        elif name.endswith("attention.o_proj.weight"):
            dims = [shape.hidden, rows]
        tensors[name] = dims
    write_checkpoint(tmp_path, shape, tensors=tensors)
    (tmp_path / "modeling_lab.py").write_text(code)
    return read_checkpoint(tmp_path)


def test_each_layer_gets_the_heads_the_code_builds_it_with(tmp_path):
    ckpt = _lab(tmp_path)
    policy.check(ckpt)  # layer 1's q_proj and o_proj differ from layer 0's: the code sizes them per layer
    spec = detect_until(ckpt, layout)
    assert spec.names["self_attn"] == "attention"
    assert spec.layer_num_heads == [4, 2] and [spec.heads_of(i) for i in (0, 1)] == [4, 2]
    source = spec.source("layer_num_heads")
    assert source.expr == "config.heads_by_layer"
    line = next(i for i, text in enumerate(LAB_CODE.splitlines(), 1) if "config.heads_by_layer[idx]" in text)
    assert f"config.heads_by_layer[idx] (modeling_lab.py:{line})" in source.detail
    from scaffold.review import decisions

    spec.names.setdefault("qkv_proj", "qkv_proj")
    assert any(d.startswith("- query heads of each layer's own: `config.heads_by_layer[layer_idx]` (4, 2)")
               for d in decisions(spec))


def test_tensors_the_per_layer_value_does_not_size_are_refused(tmp_path):
    # config.json says layer 1 has 2 heads; its tensors hold 4: the value sizes something else (or nothing).
    ckpt = _lab(tmp_path, heads=(4, 2), stored=(4, 4))
    with pytest.raises(UnsupportedArchitecture, match=r"per-layer attention sizes: .*config\.heads_by_layer\[idx\].*"
                                                      r"layer 1's q_proj and o_proj .* not heads_by_layer\[1\] = 2"):
        detect_until(ckpt, layout)


def test_a_count_the_kv_heads_do_not_divide_is_a_checkpoint_error(tmp_path):
    ckpt = _lab(tmp_path, heads=(4, 3))
    with pytest.raises(CheckpointError, match=r"layer 1's 3 heads .* cannot share 2 KV heads"):
        detect_until(ckpt, layout)


def test_a_per_layer_size_of_another_module_is_read_as_its_width(tmp_path):
    # The MLP built with a width of each layer's own from another list (not the width key): read as each layer's MLP
    # width (spec layer_intermediate_sizes, the port evaluating the code's expression), and every layer's tensors
    # checked against it: here they hold 96 rows in both layers, which contradicts layer 1's 48.
    odd = LAB_CODE.replace("LabMLP(config, config.intermediate_size)", "LabMLP(config, config.mlp_widths[idx])")
    ckpt = _lab(tmp_path, heads=(4, 4), code=odd, extra={"mlp_widths": [96, 48]})
    spec = detect_until(ckpt, layout)
    assert spec.layer_intermediate_sizes == [96, 48] and spec.intermediate_size == 96
    assert spec.source("layer_intermediate_sizes").expr == "config.mlp_widths[layer_idx]"
    with pytest.raises(CheckpointError, match=r"layers\.1\.mlp\.gate_proj\.weight has shape \[96, 64\].*"
                                              r"intermediate size 48"):
        detect_until(ckpt, mlp)


def test_without_the_code_the_policy_holds_every_layer_to_one_shape(tmp_path):
    ckpt = _lab(tmp_path, code=LAB_CODE.replace("n_heads=config.heads_by_layer[idx]", "n_heads=4"))
    with pytest.raises(CheckpointError, match=r"o_proj|the same module must have the same shape"):
        policy.check(ckpt)


def test_laguna_router_soft_capping_is_a_branch_config_json_decides():
    path = routing.routing(transformers_code("laguna"), "experts")
    (attr, test, op, constant, _line, calls), = path.guarded_factors
    assert (attr, test, op, constant) == ("router_logit_softcapping", "router_logit_softcapping", ">", 0.0)
    assert calls == ("tanh",)  # a transform of the scores, not a plain scale
    assert "router_logit_softcapping" not in path.factor_attrs
    assert path.config_keys(frozenset({test})) == ["moe_router_logit_softcapping"]
    assert not routing.holds(0.0, op, constant) and routing.holds(30.0, op, constant)


def test_each_layer_type_keeps_its_own_partial_rotary_factor(tmp_path):
    from helpers import read

    per_type = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}
    shape = Shape(family="qwen2", sliding_window=8, sliding_layers=(1,),
                  extra={"rope_parameters": per_type, "layer_types": ["full_attention", "sliding_attention"]})
    spec = detect_until(read(tmp_path, shape), rope)
    assert spec.partial_rotary_factor == 0.5
    assert spec.sliding_rope_parameters["partial_rotary_factor"] == 1.0
    per_type["sliding_attention"]["partial_rotary_factor"] = 1.5
    with pytest.raises(CheckpointError, match=r"partial_rotary_factor must be in \(0, 1\], not 1\.5"):
        detect_until(read(tmp_path / "odd", shape), rope)


def test_a_correction_bias_under_the_experts_is_registered_on_the_fused_experts():
    spec = Spec()
    spec.num_experts, spec.moe_sigmoid = 4, True
    spec.names = {"mlp": "mlp", "experts": "experts", "router": "gate"}
    spec.moe_correction_bias = "experts.e_score_correction_bias"
    found = routing_choices(spec)
    assert (found["bias_holder"], found["bias_on_experts"], found["bias_ref"]) == \
        (None, "e_score_correction_bias", "e_score_correction_bias")
    spec.moe_correction_bias = "gate.e_score_correction_bias"  # on the router (GLM-4-MoE's)
    assert routing_choices(spec)["bias_ref"] == "self.gate.e_score_correction_bias"
    assert routing_choices(spec)["bias_on_experts"] is None


# ---------------------------------------------------------------- sizes the port cannot build, named
def _odd_o_proj(tmp_path, model_type, extra, o_cols, layers=2, code=None):
    """A checkpoint of `model_type` whose layer i's o_proj takes o_cols[i] columns (the rest Llama's shapes)."""
    from ckpt_factory import write_checkpoint

    shape = Shape(model_type=model_type, layers=layers, extra=extra,
                  architecture="LabForCausalLM" if code else "FactoryLlamaForCausalLM")
    tensors = tensors_for(shape)
    for i, cols in enumerate(o_cols):
        tensors[f"model.layers.{i}.self_attn.o_proj.weight"] = [shape.hidden, cols]
    write_checkpoint(tmp_path, shape, tensors=tensors)
    if code:
        (tmp_path / "modeling_lab.py").write_text(code)
    return read_checkpoint(tmp_path)


def test_mimo_v2_sizes_pass_the_policy_and_tensors_other_than_its_code_builds_are_refused(tmp_path):
    # MiMo-V2's KV heads (doubled on sliding layers) and value width (config.v_head_dim) are read from its code
    # (scaffold.detect.headsizes, tests/test_unit_head_sizes.py): o_proj over 4 heads x 32 is what it builds, but
    # the factory's k and v keep Llama's 2 heads x 16 in every layer, which detection names.
    ckpt = _odd_o_proj(tmp_path, "mimo_v2_flash", {"v_head_dim": 32, "attention_value_scale": 0.5,
                                                    "layer_types": ["full_attention", "sliding_attention"]},
                       (4 * 32, 4 * 32))
    policy.check(ckpt)
    with pytest.raises(CheckpointError, match=r"tensor model\.layers\.0\.self_attn\.v_proj\.weight has shape "
                                              r"\[32, 64\], but 4 query heads and 2 KV heads of size 16 \(values "
                                              r"32 wide\)"):
        detect_until(ckpt, attention)


def test_mimo_v2_value_scale_config_json_does_not_decide_is_named(tmp_path):
    # Without attention_value_scale in config.json the code's `X if X is not None else 1.0` is undecided.
    ckpt = _odd_o_proj(tmp_path, "mimo_v2_flash", {"v_head_dim": 32, "layer_types": ["full_attention",
                                                                                        "sliding_attention"]},
                       (4 * 32, 4 * 32))
    with pytest.raises(UnsupportedArchitecture) as exc:
        policy.check(ckpt)
    text = " ".join(str(exc.value).split())
    assert ("attention sizes the port does not build: MiMoV2FlashAttention (transformers/models/mimo_v2_flash/"
            "modeling_mimo_v2_flash.py:") in text
    assert "has the values scaled by self.v_scale" in text


def test_gemma4_per_layer_head_width_is_read_from_per_layer_config(tmp_path):
    # Gemma 4 reads each layer's head width and KV heads from config.per_layer_config[layer_idx]: config.json's
    # override of the layer, else the config's own value. The policy holds each layer to its own sizes.
    ckpt = _odd_o_proj(tmp_path / "ok", "gemma4_text", {"per_layer_config": {"1": {"head_dim": 64}}},
                       (4 * 16, 4 * 64))
    sizes = policy.layer_sizes(ckpt)
    assert sizes is not None and (sizes.head_dim, sizes.num_kv_heads) == ([16, 64], [2, 2])
    assert "config.per_layer_config[layer_idx].head_dim" in sizes.evidence
    policy.check(ckpt)
    # An o_proj that is not the layer's own heads x its own width is still a contradiction.
    ckpt = _odd_o_proj(tmp_path / "bad", "gemma4_text", {"per_layer_config": {"1": {"head_dim": 64}}},
                       (4 * 16, 4 * 32))
    with pytest.raises(UnsupportedArchitecture, match=r"per-layer attention sizes: Gemma4TextAttention \(.*\) builds "
                                                      r"k_proj, o_proj, q_proj, v_proj with sizes of each layer's own "
                                                      r"\(from config\.per_layer_config\[layer_idx\]\.head_dim"):
        policy.check(ckpt)


LAB_WIDTHS = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        dims = config.head_widths[idx]
        self.wq = nn.Linear(config.hidden_size, config.num_attention_heads * dims, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * dims, config.hidden_size, bias=False)
'''


def test_a_lab_head_width_per_layer_is_named_and_plain_contradictions_stay_errors(tmp_path):
    ckpt = _odd_o_proj(tmp_path / "lab", "lab_widths", {"head_widths": [16, 32]}, (64, 128), code=LAB_WIDTHS)
    with pytest.raises(UnsupportedArchitecture, match=r"per-layer attention sizes: LabAttention \(modeling_lab\.py:"
                                                      r"\d+\) builds o_proj with sizes of each layer's own \(from "
                                                      r"config\.head_widths\[idx\]\)"):
        policy.check(ckpt)
    # The same tensors where the code sizes every layer alike: the checkpoint contradicts its config.
    alike = LAB_WIDTHS.replace("config.head_widths[idx]", "config.head_dim")
    ckpt = _odd_o_proj(tmp_path / "alike", "lab_widths", {"head_widths": [16, 32]}, (64, 128), code=alike)
    with pytest.raises(CheckpointError, match=r"o_proj\.weight' has shape \[64, 128\], but 4 heads of size 16"):
        policy.check(ckpt)


# A lab router written unlike Laguna's: a plain boost under one switch, a soft cap under another.
LAB_ROUTER = """
import torch
import torch.nn as nn


class Picker(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.boost = config.router_boost
        self.cap = config.router_cap

    def forward(self, x):
        logits = self.w(x)
        if self.cap >= 1:
            logits = self.cap * torch.tanh(logits / self.cap)
        probs = logits.softmax(-1)
        top, idx = probs.topk(2, dim=-1)
        if self.boost != 1.0:
            top = top * self.boost
        return top, idx


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.router = Picker(config)
        self.experts = nn.ModuleList()

    def forward(self, x):
        return self.router(x)
"""


@pytest.mark.parametrize(("boost", "cap", "outcome"), [
    (1.0, 0, None),  # neither branch runs
    (2.5, 0, 2.5),  # the boost runs: a plain scale, read like an unguarded one
    (1.0, 30, "transforms its router's scores with self.cap (tanh) under `if self.cap >= 1`"),
])
def test_a_guarded_router_branch_counts_where_config_json_runs_it(boost, cap, outcome):
    from types import SimpleNamespace

    from scaffold.detect import moe

    path = routing.routing({"modeling_lab.py": LAB_ROUTER}, "experts")
    calls = {attr: found[-1] for attr, *found in path.guarded_factors}
    assert calls == {"boost": (), "cap": ("tanh",)}
    spec = Spec()
    spec.num_experts, spec.num_experts_per_tok, spec.names = 4, 2, {"experts": "experts"}
    ckpt = SimpleNamespace(config={"router_boost": boost, "router_cap": cap, "num_experts": 4},
                           config_file="config.json")
    if isinstance(outcome, str):
        with pytest.raises(UnsupportedArchitecture, match=re.escape(outcome)):
            moe._routing_fields(spec, ckpt, path)
        return
    moe._routing_fields(spec, ckpt, path)
    assert spec.moe_routed_scaling_factor == outcome


LAB_OWN_CONFIG = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        own = config.per_layer_config[idx]
        self.width = own.head_dim
        self.groups = own.num_key_value_heads
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.width, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.groups * self.width, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.groups * self.width, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.width, config.hidden_size, bias=False)
'''


def test_a_lab_reading_its_layer_config_gets_each_layer_its_sizes_and_another_key_stays_refused(tmp_path):
    extra = {"per_layer_config": {"0": {"head_dim": 32, "num_key_value_heads": 1}}}
    ckpt = _odd_o_proj(tmp_path / "lab", "lab_own", extra, (4 * 32, 4 * 16), code=LAB_OWN_CONFIG)
    sizes = policy.layer_sizes(ckpt)
    assert sizes is not None and (sizes.head_dim, sizes.num_kv_heads) == ([32, 16], [1, 2])
    assert "LabAttention (modeling_lab.py:" in sizes.evidence
    # The heads themselves read per layer: not a size the port takes from per_layer_config.
    heads = LAB_OWN_CONFIG.replace("config.num_attention_heads * self.width", "own.num_attention_heads * self.width")
    ckpt = _odd_o_proj(tmp_path / "heads", "lab_own", extra, (4 * 32, 4 * 16), code=heads)
    assert policy.layer_sizes(ckpt) is None
    with pytest.raises(UnsupportedArchitecture, match=r"per-layer attention sizes: LabAttention"):
        policy.check(ckpt)


def test_gemma4_per_layer_config_keys_written_zero_padded_are_layer_indices(tmp_path):
    # transformers writes per_layer_config's indices padded to the widest one: a 12-layer config (26B-A4B's five
    # sliding layers to one full) holds "05" and "11", read as layers 5 and 11.
    cols = [4 * 64 if i in (5, 11) else 4 * 16 for i in range(12)]
    ckpt = _odd_o_proj(tmp_path, "gemma4_text", {"per_layer_config": {"05": {"head_dim": 64}, "11": {"head_dim": 64}}},
                       cols, layers=12)
    sizes = policy.layer_sizes(ckpt)
    assert sizes is not None and sizes.head_dim == [64 if i in (5, 11) else 16 for i in range(12)]
    policy.check(ckpt)
