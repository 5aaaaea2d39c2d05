"""Gemma 4's decoder forms read from what the code computes: a norm over the values alone without a scale (v_norm),
the layer's output times a one-element tensor of its own (layer_scalar), a constant score scale handed to the
attention function (scaling = 1.0), branches __init__ decides from the layer's index alike in every layer (no KV
sharing, no keys reused as values), and the refusal where they are decided differently per layer."""

from __future__ import annotations

import ast
from types import SimpleNamespace

from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import attention, dataflow
from scaffold.detect.layout import layer_output_scalar

LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention"]


def _config(**extra) -> dict:
    return {"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "hidden_size": 128, "layer_types": LAYER_TYPES, "num_kv_shared_layers": 0, "attention_k_eq_v": False,
            "hidden_size_per_layer_input": 0, **extra}


def _class(sources: dict, name: str) -> tuple[str, ast.ClassDef]:
    found = dataflow._class(sources, name)
    assert found is not None
    return found


def test_gemma4_attention_reads_as_separate_projections_with_a_value_norm():
    code = transformers_code("gemma4")
    flow = dataflow.analyze_attention(code, *_class(code, "Gemma4TextAttention"), _config())
    assert (flow.layout, flow.q, flow.k, flow.v, flow.o) == ("separate", "q_proj", "k_proj", "v_proj", "o_proj")
    assert (flow.q_norm, flow.k_norm, flow.v_norm) == ("q_norm", "k_norm", "v_norm")
    assert "modeling_gemma4.py:" in flow.v_norm_evidence and "v_norm on the values" in flow.v_norm_evidence
    assert dataflow.attention_layer_branches(code, _config()) is None


def test_gemma4_kv_sharing_and_keys_as_values_are_named_per_layer():
    code = transformers_code("gemma4")
    shared = dataflow.attention_layer_branches(code, _config(num_kv_shared_layers=1))
    assert shared is not None
    assert "Gemma4TextAttention.forward branches on `self.is_kv_shared_layer`, which holds in layer(s) 2 only" in shared
    k_eq_v = dataflow.attention_layer_branches(code, _config(attention_k_eq_v=True))
    assert k_eq_v is not None
    assert "branches on `self.v_proj is not None`, which holds in layer(s) 0, 1 only" in k_eq_v


def test_gemma4_layer_scalar_and_constant_scale():
    code = transformers_code("gemma4")
    layer0 = {"layer_scalar": SimpleNamespace(shape=(1,)), "input_layernorm.weight": SimpleNamespace(shape=(128,))}
    found = layer_output_scalar(code, "layers", layer0)
    assert found is not None and found[0] == "layer_scalar"
    assert "hidden_states *= self.layer_scalar" in found[1]
    assert layer_output_scalar(code, "layers", {"input_layernorm.weight": SimpleNamespace(shape=(128,))}) is None
    scale = attention.constant_scaling(code, "self_attn")
    assert scale is not None and scale[0] == 1.0 and "self.scaling = 1.0" in scale[1]


def test_scales_that_are_not_one_constant_are_left_to_the_config():
    # GPT-2 assigns self.scaling twice (1.0, then head_dim ** -0.5 under scale_attn_weights) and divides it again;
    # Llama's is head_dim ** -0.5.
    assert attention.constant_scaling(transformers_code("gpt2"), "attn") is None
    assert attention.constant_scaling(transformers_code("llama"), "self_attn") is None


# A lab's decoder written otherwise: projections wq/wk/wv/wo, norms qn/kn and a scale-free norm class of its own on
# the values, the value projection built only on even layers, its scale a constant handed to sdpa as `scale=`, and
# its layer returning the sum times a one-element parameter `gain`.
LAB_G4 = "\n" + LAB_PRELUDE + '''class LabScaleFreeNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class LabAttention(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        self.width = config.head_dim
        self.temperature = 1.0
        self.wq = nn.Linear(config.hidden_size, config.num_attention_heads * self.width, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.num_key_value_heads * self.width, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.num_key_value_heads * self.width, bias=False) \\
            if idx % config.value_every == 0 else None
        self.wo = nn.Linear(config.num_attention_heads * self.width, config.hidden_size, bias=False)
        self.qn = LabRMSNorm(self.width)
        self.kn = LabRMSNorm(self.width)
        self.vn = LabScaleFreeNorm(self.width)

    def forward(self, x, cos, sin, mask):
        q = self.qn(self.wq(x).unflatten(-1, (-1, self.width)))
        k = self.kn(self.wk(x).unflatten(-1, (-1, self.width)))
        v = self.wv(x).unflatten(-1, (-1, self.width)) if self.wv is not None else k
        v = self.vn(v)
        q, k = apply_rope(q, k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.temperature)
        return self.wo(out.flatten(-2))


class LabMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x)) * self.up_proj(x))


class LabLayer(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        self.mix = LabAttention(config, idx)
        self.mlp = LabMLP(config)
        self.ln_a = LabRMSNorm(config.hidden_size)
        self.ln_b = LabRMSNorm(config.hidden_size)
        self.gain = nn.Parameter(torch.ones(1))

    def forward(self, x, cos, sin, mask):
        h = x + self.mix(self.ln_a(x), cos, sin, mask)
        h = h + self.mlp(self.ln_b(h))
        return h * self.gain


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = LabRMSNorm(config.hidden_size)
'''


def test_a_lab_decoder_written_otherwise():
    code = {"modeling_lab.py": LAB_G4}
    every = _config(value_every=1)  # a value projection in every layer: the branch is the same everywhere
    flow = dataflow.analyze_attention(code, *_class(code, "LabAttention"), every)
    assert (flow.q, flow.k, flow.v, flow.o, flow.q_norm, flow.k_norm, flow.v_norm) == (
        "wq", "wk", "wv", "wo", "qn", "kn", "vn")
    assert dataflow.attention_layer_branches(code, every) is None
    alternate = dataflow.attention_layer_branches(code, _config(value_every=2))
    assert alternate is not None and "LabAttention.forward branches on `self.wv is not None`, which holds in " \
                                     "layer(s) 0, 2 only" in alternate
    scale = attention.constant_scaling(code, "mix")
    assert scale is not None and scale[0] == 1.0 and "scale=self.temperature" in scale[1]
    found = layer_output_scalar(code, "layers", {"gain": SimpleNamespace(shape=(1,))})
    assert found is not None and found[0] == "gain" and "return h * self.gain" in found[1]
    # A gain of the hidden size's width is not a scalar of the layer's output.
    assert layer_output_scalar(code, "layers", {"gain": SimpleNamespace(shape=(128,))}) is None
