"""Modules inside a sublayer besides its projections, read from what the sublayer's code computes: an activation
module holding tensors of its own (Apertus' xIELU), matched to the vLLM activation that holds the same ones."""

from __future__ import annotations

import json

import pytest
from ckpt_factory import Shape, tensors_for
from helpers import detect_until, read, transformers_code

from scaffold.detect import dataflow, layout, mlp, submodules
from scaffold.detect.activations import tensor_activation, vllm_activation_call
from scaffold.errors import UnsupportedArchitecture

# A lab's MLP written unlike Apertus': its own names (w_in, nonlin, w_out), transformers' xIELU class built by its
# class name with arguments of its own, the value passed through locals, and no activation named in config.json.
LAB_CODE = '''
import torch
from torch import nn
from transformers.activations import XIELUActivation


class LabRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class LabAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.d_head = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.d_head, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        ctx = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))


class LabFeedForward(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_in = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.nonlin = XIELUActivation(alpha_p_init=0.8, alpha_n_init=0.8, beta=0.5, eps=-1e-6, dtype=torch.float32)
        self.w_out = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        h = self.w_in(x)
        h = self.nonlin(h)
        return self.w_out(h)


class LabLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = LabAttention(config)
        self.mlp = LabFeedForward(config)
        self.input_layernorm = LabRMSNorm(config.hidden_size)
        self.post_attention_layernorm = LabRMSNorm(config.hidden_size)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config) for i in range(config.num_hidden_layers)])
        self.norm = LabRMSNorm(config.hidden_size)
'''

# The same activation by the lab itself: the same tensors, but a class of its own calling a kernel of its own,
# whose stored values the generator cannot tie to vLLM's XIELU.
OWN_CLASS = '''
from lab_kernels import xielu_kernel

class LabXIELU(nn.Module):
    def __init__(self):
        super().__init__()
        self.alpha_p = nn.Parameter(torch.zeros(1))
        self.alpha_n = nn.Parameter(torch.zeros(1))
        self.beta = nn.Buffer(torch.tensor(0.5))
        self.eps = nn.Buffer(torch.tensor(-1e-6))

    def forward(self, x):
        return xielu_kernel(x, self.alpha_p, self.alpha_n, self.beta, self.eps)
'''
XIELU_TENSORS = ("alpha_n", "alpha_p", "beta", "eps")


def _lab_checkpoint(tmp_path, code=LAB_CODE, act_tensors=XIELU_TENSORS):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_xielu", layers=2)
    tensors = tensors_for(shape)
    for i in range(shape.layers):
        base = f"model.layers.{i}.mlp"
        del tensors[f"{base}.gate_proj.weight"]
        tensors[f"{base}.w_in.weight"] = tensors.pop(f"{base}.up_proj.weight")
        tensors[f"{base}.w_out.weight"] = tensors.pop(f"{base}.down_proj.weight")
        for name in act_tensors:
            tensors[f"{base}.nonlin.{name}"] = [1] if name.startswith("alpha") else []
    read(tmp_path, shape, tensors=tensors)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("hidden_act", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "modeling_lab.py").write_text(code)
    from scaffold.checkpoint import read_checkpoint

    return read_checkpoint(tmp_path)


def test_a_lab_activation_module_with_tensors_is_matched_to_vllms_by_what_the_mlp_applies(tmp_path):
    ckpt = _lab_checkpoint(tmp_path)
    assert "hidden_act" not in ckpt.config
    spec = detect_until(ckpt, mlp)
    assert (spec.names["up_proj"], spec.names["down_proj"], spec.names["act_fn"]) == ("w_in", "w_out", "nonlin")
    assert spec.mlp_kind == "plain"
    assert spec.act_tensors == list(XIELU_TENSORS)
    # No activation in config.json: the one the MLP builds, by the class's name in transformers' table.
    assert spec.hidden_act == "xielu" and spec.source("hidden_act").kind == "code"
    line = next(i for i, text in enumerate(LAB_CODE.splitlines(), 1) if "h = self.nonlin(h)" in text)
    assert spec.source("act_tensors").detail.startswith(f"modeling_lab.py:{line}: LabFeedForward applies self.nonlin")


def test_an_activation_class_of_the_labs_own_with_tensors_is_refused_where_it_is_applied(tmp_path):
    code = LAB_CODE.replace("XIELUActivation(alpha_p_init=0.8, alpha_n_init=0.8, beta=0.5, eps=-1e-6, "
                            "dtype=torch.float32)", "LabXIELU()") + OWN_CLASS
    ckpt = _lab_checkpoint(tmp_path, code=code)
    line = next(i for i, text in enumerate(code.splitlines(), 1) if "h = self.nonlin(h)" in text)
    with pytest.raises(UnsupportedArchitecture, match=rf"modeling_lab.py:{line}: LabFeedForward applies self.nonlin "
                                                      r"\(LabXIELU\(\)\), a module holding tensors of its own"):
        detect_until(ckpt, layout)


def test_an_activation_missing_tensors_vllms_class_holds_is_refused(tmp_path):
    ckpt = _lab_checkpoint(tmp_path, act_tensors=("alpha_n", "alpha_p"))
    with pytest.raises(UnsupportedArchitecture, match=r"vLLM's XIELU holds alpha_n, alpha_p, beta, eps"):
        detect_until(ckpt, layout)


def test_apertus_xielu_is_read_from_its_mlp():
    sources = transformers_code("apertus")
    config = {"hidden_act": "xielu"}
    flow = dataflow.analyze_layer(sources, config)
    layer0 = {f"mlp.{r}.weight": None for r in ("up_proj", "down_proj")}
    layer0.update({f"mlp.act_fn.{t}": None for t in XIELU_TENSORS})
    found = submodules.activation_module(sources, config, flow.mlp_flow, "mlp", layer0)
    assert (found.attr, found.name, found.tensors) == ("act_fn", "xielu", XIELU_TENSORS)
    # Both of ApertusMLP's assignments (ACT2FN[config.hidden_act], then ACT2CLS["xielu"](dtype=...)) say xielu.
    assert "built from transformers' 'xielu' (XIELUActivation)" in found.evidence


@pytest.mark.slow  # 4 to 5 s (builds transformers models, runs the CLI): the full suite keeps it, not the quick tier
def test_the_tensors_read_from_source_are_the_real_modules_state():
    from transformers.activations import XIELUActivation
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import XIELU, get_act_fn

    both = tensor_activation("xielu")
    with set_current_vllm_config(VllmConfig()):
        assert both.vllm_tensors == set(XIELU().state_dict())
        # Built per layer as the registry builds it: get_act_fn hands every caller one shared module.
        assert get_act_fn("xielu") is get_act_fn("xielu")
    assert both.transformers_tensors == set(XIELUActivation().state_dict())
    assert both.same_formula
    assert vllm_activation_call("xielu") == "XIELU()"


# A lab's BitNet-style sublayers written unlike BitNet's: other names (out_norm, inner_norm, w1/w3/w2), the norm
# applied through locals, the attention's output kept per head until the norm's input is flattened.
NORM_CODE = LAB_CODE.replace("from transformers.activations import XIELUActivation\n", "").replace(
    "        return self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))",
    "        flat = ctx.transpose(1, 2).reshape(b, t, -1)\n"
    "        normed = self.out_norm(flat)\n"
    "        return self.o_proj(normed)").replace(
    "        self.o_proj = nn.Linear(config.num_attention_heads * self.d_head, config.hidden_size, bias=False)\n",
    "        self.o_proj = nn.Linear(config.num_attention_heads * self.d_head, config.hidden_size, bias=False)\n"
    "        self.out_norm = LabRMSNorm(config.num_attention_heads * self.d_head)\n").replace(
    LAB_CODE[LAB_CODE.index("class LabFeedForward"):LAB_CODE.index("class LabLayer")],
    '''class LabFeedForward(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w3 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.inner_norm = LabRMSNorm(config.intermediate_size)

    def forward(self, x):
        h = nn.functional.silu(self.w1(x)) * self.w3(x)
        h = self.inner_norm(h)
        return self.w2(h)


''')


def _norm_checkpoint(tmp_path, code=NORM_CODE, widths=None):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_subnorm", layers=2)
    tensors = tensors_for(shape)
    for i in range(shape.layers):
        base = f"model.layers.{i}"
        for old, new in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
            tensors[f"{base}.mlp.{new}.weight"] = tensors.pop(f"{base}.mlp.{old}.weight")
        attn_width, mlp_width = widths or (shape.heads * shape.head_dim, shape.intermediate)
        tensors[f"{base}.self_attn.out_norm.weight"] = [attn_width]
        tensors[f"{base}.mlp.inner_norm.weight"] = [mlp_width]
    read(tmp_path, shape, tensors=tensors)
    (tmp_path / "modeling_lab.py").write_text(code)
    from scaffold.checkpoint import read_checkpoint

    return read_checkpoint(tmp_path)


def test_norms_inside_the_sublayers_are_read_from_the_dataflow(tmp_path):
    spec = detect_until(_norm_checkpoint(tmp_path), layout)
    assert (spec.names["attn_sub_norm"], spec.names["mlp_sub_norm"]) == ("out_norm", "inner_norm")
    assert spec.attn_sub_norm and spec.mlp_sub_norm
    assert (spec.names["gate_proj"], spec.names["up_proj"], spec.names["down_proj"]) == ("w1", "w3", "w2")
    line = next(i for i, text in enumerate(NORM_CODE.splitlines(), 1) if "h = self.inner_norm(h)" in text)
    assert spec.source("mlp_sub_norm").detail.startswith(
        f"modeling_lab.py:{line}: LabFeedForward applies self.inner_norm to what w1, w3 computed, and w2 reads its "
        "output alone")
    assert "applies self.out_norm to what k_proj, q_proj, v_proj computed" in spec.source("attn_sub_norm").detail


def test_a_norm_on_one_factor_of_the_gated_product_is_not_a_sub_norm(tmp_path):
    # inner_norm(w3(x)) * silu(w1(x)): the norm sees the up projection alone; the port's norm would see the product.
    code = NORM_CODE.replace("        h = nn.functional.silu(self.w1(x)) * self.w3(x)\n        h = self.inner_norm(h)\n",
                             "        h = nn.functional.silu(self.w1(x)) * self.inner_norm(self.w3(x))\n")
    with pytest.raises(UnsupportedArchitecture, match=r"no part of the port computes with \(.*mlp\.inner_norm"):
        detect_until(_norm_checkpoint(tmp_path, code=code), layout)


def test_a_sub_norm_built_unlike_the_layers_norms_or_of_another_width_is_refused(tmp_path):
    code = NORM_CODE.replace("self.out_norm = LabRMSNorm(config.num_attention_heads * self.d_head)",
                             "self.out_norm = LabRMSNorm(config.num_attention_heads * self.d_head, eps=1e-3)")
    with pytest.raises(UnsupportedArchitecture, match=r"self.out_norm .* built as LabRMSNorm\(\.\.\., eps=0.001\), "
                                                      r"not as the layer's norms are \(LabRMSNorm\(\.\.\.\)\)"):
        detect_until(_norm_checkpoint(tmp_path / "eps", code=code), layout)
    with pytest.raises(UnsupportedArchitecture, match=r"a norm over the activated width one of 96, but layer 0 "
                                                      r"holds \{'mlp.inner_norm.weight': \[48\]\}"):
        detect_until(_norm_checkpoint(tmp_path / "width", widths=(64, 48)), layout)


def test_bitnet_sub_norms_are_read_from_its_code():
    sources = transformers_code("bitnet")
    flow = dataflow.analyze_layer(sources, {})
    a, m = flow.attention_flow, flow.mlp_flow
    (attn,) = submodules.norm_before(sources, {}, a.cls, set(a.linears), a.o, {"attn_sub_norm", "rotary_fn"}, a.v,
                                     False)
    (mlp_norm,) = submodules.norm_before(sources, {}, m.cls, set(m.linears), m.down, {"ffn_sub_norm", "act_fn"}, m.up,
                                         True)
    assert (attn.attr, attn.cls, mlp_norm.attr, mlp_norm.cls) == ("attn_sub_norm", "BitNetRMSNorm", "ffn_sub_norm",
                                                                  "BitNetRMSNorm")
    assert attn.arguments == mlp_norm.arguments == ("eps=config.rms_norm_eps",)


def test_a_bitnet_quantized_checkpoint_is_refused_by_its_method(tmp_path):
    from scaffold.quantized import check_supported

    config = {"quantization_config": {"quant_method": "bitnet", "linear_class": "bitlinear",
                                      "quantization_mode": "offline"}}
    with pytest.raises(UnsupportedArchitecture, match=r"quantized \(quantization_config.quant_method 'bitnet'\)"):
        check_supported(config, tmp_path / "config.json")
