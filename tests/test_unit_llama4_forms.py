"""Llama 4's forms read from what the code computes, on transformers' own file and on a lab's module written
otherwise: one q/k norm module without parameters applied to the queries and the keys after the rotary embedding,
built only in the layers that rotate (and only where a config switch says so)."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape
from helpers import LAB_DECODER, LAB_PRELUDE, detect_until, read, transformers_code

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import attention, chunks, dataflow, layout, temperature
from scaffold.errors import UnsupportedArchitecture

# A lab's attention unlike Llama 4's: the norm calls F.rms_norm (no class of transformers'), is kept as `unit`,
# the rotary flag is `rotates`, the switch `normalize_qk`, the rotation NeoX (rotate_half) on per-head views.
LAB_CODE = "\n" + LAB_PRELUDE + '''class Unscaled(nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.eps = eps

    def forward(self, t):
        return F.rms_norm(t, (t.shape[-1],), eps=self.eps)


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.d_head = config.head_dim
        self.rotates = config.rope_flags[layer_idx]
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.d_head, config.hidden_size, bias=False)
        if self.rotates and config.normalize_qk:
            self.unit = Unscaled(config.rms_norm_eps)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        if self.rotates:
            q, k = apply_rope(q, k, cos, sin)
            if hasattr(self, "unit"):
                q, k = self.unit(q), self.unit(k)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))


''' + LAB_DECODER + '''

class LabForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = LabModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
'''


def _lab(tmp_path, code=LAB_CODE, **extra):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_l2", layers=2,
                  extra={"rope_flags": [1, 0], "normalize_qk": True, **extra})
    read(tmp_path, shape)
    (tmp_path / "modeling_lab.py").write_text(code)
    return read_checkpoint(tmp_path)


def test_llama4_one_weightless_norm_for_q_and_k_after_the_rotary_embedding():
    sources = transformers_code("llama4")
    config = {"no_rope_layers": [1, 0], "use_qk_norm": True}
    # The file also holds the vision encoder's layer stack: the decoder is the one the causal LM builds.
    flow = dataflow.analyze_layer(sources, config)
    attention = flow.attention_flow
    assert attention.cls == "Llama4TextAttention"
    assert (attention.q_norm, attention.k_norm, attention.qk_norm_after_rope) == ("qk_norm", "qk_norm", True)
    assert attention.rotary_guard == "config.no_rope_layers[layer_idx]"
    built = layout._qk_norm_built(sources, attention, config, "config.json", "llama4_text")
    assert built[0] and "builds qk_norm only where `self.use_rope`" in built[1]
    # The 128-expert model turns it off.
    off = layout._qk_norm_built(sources, attention, {**config, "use_qk_norm": False}, "config.json", "llama4_text")
    assert off[0] is False and "`self.config.use_qk_norm`, false in config.json" in off[1]


def test_a_labs_unscaled_qk_norm_is_read_with_its_layers(tmp_path):
    spec = detect_until(_lab(tmp_path), layout)
    assert spec.names["q_norm"] == spec.names["k_norm"] == "unit"
    assert (spec.qk_norm, spec.qk_norm_after_rope, spec.qk_norm_weightless, spec.qk_norm_rope_layers_only) == \
        ("per_head", True, True, True)
    assert "builds unit only where `self.rotates`" in spec.source("qk_norm_rope_layers_only").detail
    assert spec.norm_weightless is False  # the layer norms keep their scale


def test_a_labs_switched_off_qk_norm_is_none(tmp_path):
    spec = detect_until(_lab(tmp_path, normalize_qk=False), layout)
    assert spec.qk_norm == "none" and "`config.normalize_qk`, false in config.json" in spec.source("qk_norm").detail


def test_a_qk_norm_built_under_another_condition_is_refused(tmp_path):
    odd = LAB_CODE.replace("if self.rotates and config.normalize_qk:", "if layer_idx % 2 == 0:")
    with pytest.raises(UnsupportedArchitecture, match=r"q/k norms built under a condition the config does not "
                                                      r"decide \(modeling_lab.py:\d+: `layer_idx % 2 == 0`\)"):
        detect_until(_lab(tmp_path, code=odd), layout)


def test_a_weightless_qk_norm_that_centers_is_refused(tmp_path):
    odd = LAB_CODE.replace("return F.rms_norm(t, (t.shape[-1],), eps=self.eps)",
                           "return F.layer_norm(t, (t.shape[-1],), eps=self.eps)")
    with pytest.raises(UnsupportedArchitecture, match=r"not an RMS norm over each head"):
        detect_until(_lab(tmp_path, code=odd), layout)


# ------------------------------------------------------------------ chunked attention
def test_llama4_chunks_the_layers_of_its_chunked_type():
    found = chunks.chunked_attention(transformers_code("llama4"))
    assert (found.key, found.layer_type) == ("attention_chunk_size", "chunked_attention")
    assert "create_chunked_causal_mask(...) is the mask of the 'chunked_attention' layers" in found.evidence


LAB_CHUNKED = '''
import torch
from torch import nn


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.span = config.local_span
        self.layers = nn.ModuleList([nn.Identity() for _ in range(config.num_hidden_layers)])

    def forward(self, x):
        pos = torch.arange(x.shape[1])
        same = (pos[:, None] // self.span) == (pos[None, :] // self.span)
        allowed = same & (pos[:, None] >= pos[None, :])
        for layer in self.layers:
            x = layer(x, allowed)
        return x
'''


def test_a_labs_own_chunk_comparison_chunks_every_layer():
    found = chunks.chunked_attention({"modeling_lab.py": LAB_CHUNKED})
    assert (found.key, found.layer_type) == ("local_span", None)
    assert found.evidence.startswith("modeling_lab.py:14: pos[:, None] // self.span == pos[None, :] // self.span")


def test_a_chunk_under_a_condition_or_outside_a_mask_per_type_is_refused():
    odd = LAB_CHUNKED.replace("        same = (pos", "        if x.shape[1] > 4:\n            same = (pos")
    with pytest.raises(chunks.Refused, match=r"under a condition \(line 14: x.shape\[1\] > 4\)"):
        chunks.chunked_attention({"modeling_lab.py": odd})
    alone = "def f(config, x):\n    return create_chunked_causal_mask(config=config, inputs_embeds=x)\n"
    with pytest.raises(chunks.Refused, match=r"not kept per layer type"):
        chunks.chunked_attention({"modeling_lab.py": alone})


def test_a_floor_division_by_two_different_keys_is_no_chunk():
    odd = LAB_CHUNKED.replace("(pos[None, :] // self.span)", "(pos[None, :] // 2)")
    assert chunks.chunked_attention({"modeling_lab.py": odd}) is None


def test_the_chunk_size_and_layers_land_in_the_spec(tmp_path):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_chunk", layers=2, extra={"local_span": 8})
    read(tmp_path, shape)
    (tmp_path / "modeling_lab.py").write_text(LAB_CHUNKED)
    spec = detect_until(read_checkpoint(tmp_path), attention)
    assert (spec.attention_chunk_size, spec.chunked_layers) == (8, [0, 1])
    assert spec.source("attention_chunk_size").expr == "config.local_span"


SERVES = {8192: "KV-cache block size).",
          96: "Serve it with `--block-size 32`: the default of 128 does not divide the chunk.",
          8: "No block size of 32, 64 or 128 divides it, so vLLM's CPU build cannot serve this port."}


@pytest.mark.parametrize(("chunk", "says"), SERVES.items())
def test_the_review_says_which_block_size_serves_the_chunk(tmp_path, chunk, says):
    from scaffold.review import decisions

    shape = Shape(architecture="LabForCausalLM", model_type="lab_chunk", layers=2, extra={"local_span": chunk})
    read(tmp_path, shape)
    (tmp_path / "modeling_lab.py").write_text(LAB_CHUNKED)
    line = next(d for d in decisions(detect_until(read_checkpoint(tmp_path), attention)) if "chunked attention" in d)
    assert f"chunk of {chunk} positions" in line and line.endswith(says)



def test_the_engine_block_size_divides_the_chunk():
    from scaffold.detect.chunks import block_size_for

    # CPU blocks are 128 unless told a multiple of 32; ChunkedLocalAttention wants the chunk a multiple of the block.
    assert [block_size_for(c) for c in (None, 8192, 256, 64, 96, 32, 16)] == [None, None, None, 64, 32, 32, None]


# ------------------------------------------------------------------ temperature tuning
def _attention_class(sources, name):
    from scaffold.detect.sourcecode import _classes

    file, cls = _classes(sources)[name]
    return cls, file


def test_llama4_scales_the_queries_of_its_nope_layers():
    cls, file = _attention_class(transformers_code("llama4"), "Llama4TextAttention")
    found = temperature.read_temperature(cls, file, "q_proj", {"attn_temperature_tuning": True},
                                         "config.no_rope_layers[layer_idx]")
    assert (found.floor_key, found.scale_key, found.nope_only, found.switch) == \
        ("floor_scale", "attn_scale", True, "attn_temperature_tuning")


# A lab's temperature: 1 + gain * log(1 + floor(...)), its own names, the scale indexed into shape, the position
# computed outside the branch.
LAB_TEMPERATURE = '''
import torch
from torch import nn


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.knee = config.temp_knee
        self.gain = config.temp_gain
        self.spin = config.rope_flags[layer_idx]
        self.tune = config.tune_temperature
        self.q_proj = nn.Linear(8, 8)

    def forward(self, x, offset=0):
        q = self.q_proj(x)
        idx = torch.arange(x.shape[1]) + offset
        if self.tune and not self.spin:
            temp = 1.0 + self.gain * torch.log(1 + torch.floor((idx + 1) / self.knee))
            q = q * temp[None, :, None]
        return q
'''


def _lab_temperature(code=LAB_TEMPERATURE, config=None):
    cls, file = _attention_class({"modeling_lab.py": code}, "LabAttention")
    return temperature.read_temperature(cls, file, "q_proj", config or {"tune_temperature": True},
                                        "config.rope_flags[layer_idx]")


def test_a_labs_temperature_written_otherwise_is_read_with_its_keys():
    found = _lab_temperature()
    assert (found.floor_key, found.scale_key, found.nope_only, found.switch) == \
        ("temp_knee", "temp_gain", True, "tune_temperature")
    assert found.evidence.startswith("modeling_lab.py:20: queries scaled by log(floor((position + 1) / "
                                     "config.temp_knee) + 1) * config.temp_gain + 1")


def test_another_function_of_the_positions_is_refused():
    odd = LAB_TEMPERATURE.replace("(idx + 1) / self.knee", "idx / self.knee")
    with pytest.raises(temperature.Refused, match=r"not vLLM's temperature tuning"):
        _lab_temperature(odd)
    odd = LAB_TEMPERATURE.replace("torch.log(", "torch.sqrt(")
    with pytest.raises(temperature.Refused, match=r"the formula reader does not follow"):
        _lab_temperature(odd)


def test_a_temperature_under_a_condition_the_config_does_not_decide_is_refused():
    odd = LAB_TEMPERATURE.replace("if self.tune and not self.spin:", "if self.tune and x.shape[1] > 8:")
    with pytest.raises(temperature.Refused, match=r"condition the config does not decide \(modeling_lab.py:\d+: "
                                                  r"`x.shape\[1\] > 8`\)"):
        _lab_temperature(odd)


def test_no_positions_no_temperature():
    plain = LAB_TEMPERATURE.replace("idx = torch.arange(x.shape[1]) + offset", "idx = offset")
    assert _lab_temperature(plain) is None


# ------------------------------------------------------------------ the dense layers' MLP width
def test_the_width_the_decoder_layer_builds_its_mlp_with():
    from scaffold.detect.sizes import _layer_mlp_width

    # Llama 4 (Maverick) interleaves dense layers, built with config.intermediate_size_mlp, with MoE layers.
    found, value = _layer_mlp_width(transformers_code("llama4"), {"intermediate_size_mlp": 192}, {})
    assert (found.expr, value) == ("config.intermediate_size_mlp", 192)
    lab = LAB_CODE.replace("self.mlp = LabMLP(config)", "self.mlp = LabMLP(config, intermediate_size=config.wide)")
    lab = lab.replace("    def __init__(self, config):\n        super().__init__()\n        self.gate_proj",
                      "    def __init__(self, config, intermediate_size=None):\n        super().__init__()\n"
                      "        self.gate_proj")
    found, value = _layer_mlp_width({"modeling_lab.py": lab}, {"wide": 48}, {})
    assert (found.expr, value) == ("config.wide", 48)
    # Built without the keyword: the class's own expression decides (not this).
    assert _layer_mlp_width({"modeling_lab.py": LAB_CODE}, {}, {}) is None
