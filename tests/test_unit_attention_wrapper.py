"""An attention whose projections sit one module below the layer's attention wrapper (GPT-Neo's
attn.attention.q_proj), unscaled attention scores and a window built into the causal mask, read from the code.

The lab model below is written unlike GPT-Neo: its wrapper is `mixer` (the name Mamba gives its block), the module
holding the projections `core`, the projections wq/wk/wv/wo, the scores an einsum, the local mask cut with `& ~`
and the layer kinds read from another config key through other parameter names. The checkpoints are real
safetensors files (tests/ckpt_factory.py); nothing is mocked.
"""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, tensors_for
from helpers import detect_until, read

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import attention, dataflow, layout, scaling
from scaffold.errors import UnsupportedArchitecture
from scaffold.mapping import weight_table
from scaffold.spec import renamed_substrings

LAB_CODE = '''
import torch
import torch.nn.functional as F
from torch import nn


class LabRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class LabCore(nn.Module):
    def __init__(self, config, kind):
        super().__init__()
        self.h = config.num_attention_heads
        self.d = config.head_dim
        self.wq = nn.Linear(config.hidden_size, self.h * self.d, bias=False)
        self.wk = nn.Linear(config.hidden_size, self.h * self.d, bias=False)
        self.wv = nn.Linear(config.hidden_size, self.h * self.d, bias=False)
        self.wo = nn.Linear(self.h * self.d, config.hidden_size, bias=True)
        n = config.max_position_embeddings
        visible = torch.tril(torch.ones(n, n, dtype=torch.bool))
        if kind == "local":
            visible = visible & ~torch.tril(visible, -config.local_window)
        self.register_buffer("visible", visible, persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.wk(x).view(b, t, self.h, self.d).transpose(1, 2)
        v = self.wv(x).view(b, t, self.h, self.d).transpose(1, 2)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k)
        scores = scores.masked_fill(~self.visible[:t, :t], float("-inf"))
        probs = scores.softmax(-1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, t, -1)
        return self.wo(ctx)


class LabMixer(nn.Module):
    def __init__(self, config, index):
        super().__init__()
        self.core = LabCore(config, config.layer_kinds[index])
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        return self.drop(self.core(x))


class LabMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LabBlock(nn.Module):
    def __init__(self, config, index):
        super().__init__()
        self.pre_mix = LabRMSNorm(config.hidden_size)
        self.mixer = LabMixer(config, index)
        self.pre_ffn = LabRMSNorm(config.hidden_size)
        self.ffn = LabMLP(config)

    def forward(self, x):
        x = x + self.mixer(self.pre_mix(x))
        return x + self.ffn(self.pre_ffn(x))


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabBlock(config, n) for n in range(config.num_hidden_layers)])
        self.norm = LabRMSNorm(config.hidden_size)
'''
RENAMED = {"self_attn.q_proj": "mixer.core.wq", "self_attn.k_proj": "mixer.core.wk", "self_attn.v_proj": "mixer.core.wv",
           "self_attn.o_proj": "mixer.core.wo", "input_layernorm": "pre_mix", "post_attention_layernorm": "pre_ffn",
           "mlp.": "ffn."}
CONFIG = {"layer_kinds": ["global", "local"], "local_window": 8}


def _lab_checkpoint(tmp_path, code=LAB_CODE, extra=CONFIG):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_wrapped", layers=2, kv_heads=4, extra=dict(extra))
    tensors = {}
    for name, rows in tensors_for(shape).items():
        for old, new in RENAMED.items():
            name = name.replace(old, new)
        tensors[name] = rows
    for i in range(shape.layers):
        tensors[f"model.layers.{i}.mixer.core.wo.bias"] = [shape.hidden]
    read(tmp_path, shape, tensors=tensors)
    (tmp_path / "modeling_lab.py").write_text(code)
    return read_checkpoint(tmp_path)


def test_the_dataflow_reads_the_attention_inside_a_wrapper():
    flow = dataflow.analyze_layer({"modeling_lab.py": LAB_CODE}, CONFIG)
    assert (flow.attention, flow.attention_inner, flow.attention_path) == ("mixer", "core", "mixer.core")
    a = flow.attention_flow
    assert (a.cls, a.layout, a.q, a.k, a.v, a.o) == ("LabCore", "separate", "wq", "wk", "wv", "wo")
    assert flow.attention_inner_evidence.startswith("modeling_lab.py:") and "self.core (LabCore)" in \
        flow.attention_inner_evidence
    assert flow.norms == {"attn_norm": "pre_mix", "mlp_norm": "pre_ffn"}
    line = next(i for i, text in enumerate(LAB_CODE.splitlines(), 1) if "torch.einsum" in text)
    assert a.unscaled_scores.startswith(f"modeling_lab.py:{line}: scores = q @ k^T")


def test_a_wrapper_that_adds_anything_of_its_own_is_not_taken_for_one():
    # A residual inside the "wrapper" (DBRX's NormAttentionNorm keeps norms and the residual around its attention):
    # the wrapper's output is not the attention's alone.
    odd = LAB_CODE.replace("return self.drop(self.core(x))", "return x + self.drop(self.core(x))")
    assert dataflow.analyze_layer({"modeling_lab.py": odd}, CONFIG).attention is None


def test_scaled_scores_are_not_read_as_unscaled():
    for scaled in ('torch.einsum("bhqd,bhkd->bhqk", q, k) / self.d ** 0.5',
                   'torch.einsum("bhqd,bhkd->bhqk", q * self.d ** -0.5, k)',
                   'torch.einsum("bhqd,bhkd->bhqk", q, k).mul(0.125)',
                   'torch.mul(torch.einsum("bhqd,bhkd->bhqk", q, k), 0.125)'):
        odd = LAB_CODE.replace('torch.einsum("bhqd,bhkd->bhqk", q, k)', scaled)
        assert dataflow.analyze_layer({"modeling_lab.py": odd}, CONFIG).attention_flow.unscaled_scores == "", scaled
    sdpa = LAB_CODE.replace("scores = torch.einsum(", "ctx = F.scaled_dot_product_attention(q, k, v)\n"
                                                      "        scores = torch.einsum(")
    assert dataflow.analyze_layer({"modeling_lab.py": sdpa}, CONFIG).attention_flow.unscaled_scores == ""


def test_the_lab_model_is_detected_with_its_wrapper_scale_and_window(tmp_path):
    ckpt = _lab_checkpoint(tmp_path)
    spec = detect_until(ckpt, scaling)
    assert (spec.names["self_attn"], spec.names["attn_inner"]) == ("mixer", "core")
    assert (spec.names["q_proj"], spec.names["o_proj"], spec.names["attn_norm"]) == ("wq", "wo", "pre_mix")
    assert (spec.qkv_bias, spec.o_bias) == (False, True)
    assert spec.attention_scale == 1.0 and spec.source("attention_scale").detail.startswith("modeling_lab.py:")
    assert spec.sliding_window == 8 and spec.source("sliding_window").expr == "config.local_window"
    assert spec.sliding_window_layers == [1]
    assert spec.source("sliding_window_layers").expr == "config.layer_kinds[layer_idx] == 'local'"
    # Whole name components: `.mixer.core.` onto the port's `.mixer.`.
    assert renamed_substrings(spec) == {".mixer.core.": ".mixer."}
    rows, homeless = weight_table(spec, ckpt)
    assert not homeless
    loads = {r.checkpoint: (r.param, r.shard) for r in rows}
    assert loads["model.layers.1.mixer.core.wv.weight"] == ("model.layers.1.mixer.qkv_proj.weight", "v")
    assert loads["model.layers.0.mixer.core.wo.bias"] == ("model.layers.0.mixer.wo.bias", None)


def test_a_state_space_tensor_under_the_wrapper_is_still_refused(tmp_path):
    # The wrapper named `mixer` ports (above); a Mamba tensor under it (A_log) is still refused by the marker.
    shape = Shape(architecture="LabForCausalLM", model_type="lab_wrapped", layers=2, kv_heads=4, extra=CONFIG)
    tensors = {}
    for name, rows in tensors_for(shape).items():
        for old, new in RENAMED.items():
            name = name.replace(old, new)
        tensors[name] = rows
    tensors["model.layers.0.mixer.A_log"] = [4]
    read(tmp_path, shape, tensors=tensors)
    (tmp_path / "modeling_lab.py").write_text(LAB_CODE)
    with pytest.raises(UnsupportedArchitecture, match=r"state-space \(Mamba-style\) blocks"):
        detect_until(read_checkpoint(tmp_path), layout)


def test_a_window_condition_that_is_not_the_config_and_the_layer_is_refused(tmp_path):
    odd = LAB_CODE.replace("LabCore(config, config.layer_kinds[index])", "LabCore(config, KINDS[index])")
    with pytest.raises(UnsupportedArchitecture, match=r"sliding window on the layers where kind == 'local' .*"
                                                      r"KINDS\[layer_idx\] == 'local', which reads KINDS"):
        detect_until(_lab_checkpoint(tmp_path / "a", code=odd), attention)
    with pytest.raises(UnsupportedArchitecture, match=r"config\.json does not decide"):
        detect_until(_lab_checkpoint(tmp_path / "b", extra={"local_window": 8}), attention)


def test_a_window_in_a_form_the_reader_does_not_follow_is_refused(tmp_path):
    odd = LAB_CODE.replace("visible = visible & ~torch.tril(visible, -config.local_window)",
                           "visible = visible.logical_and(torch.tril(visible, -config.local_window).logical_not())")
    with pytest.raises(UnsupportedArchitecture, match=r"causal mask narrowed to a window in a form the reader"):
        detect_until(_lab_checkpoint(tmp_path, code=odd), attention)
