"""detect/longrope.py: which LongRoPE factors a checkpoint's own rotary module applies, read by running its code.

MiniCPM4's remote code builds its cos/sin table once, for max_position_embeddings positions, and takes the long
factors for every position when max_position_embeddings > original_max_position_embeddings (its table scaled by
sqrt(1 + ln(s) / ln(original))); vLLM's Phi3LongRoPEScaledRotaryEmbedding picks by max_model_len, so the port
handed it the config's two sets and diverged (MiniCPM4 lab at 4096 > 2048: 7.43e-01, 28/64 greedy). The lab here
(tests/longrope_ckpt.py, written for these tests: a cached-table base class, a subclass choosing its divisors when
it builds, built by the decoder stack's _init_rope) is read on header-only checkpoints; the forms that must keep
the config's parameters (a choice by sequence length at run time, transformers' own Phi-3) or be refused are read
beside it."""

from __future__ import annotations

import math

import pytest
from ckpt_factory import Shape
from helpers import detect_until, read, transformers_code
from longrope_ckpt import modeling_source

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import longrope, rope
from scaffold.errors import UnsupportedArchitecture

HEAD_DIM = 16
SHORT = [1.0 + 0.25 * k for k in range(HEAD_DIM // 2)]
LONG = [1.0 + 0.75 * k for k in range(HEAD_DIM // 2)]


def _params(original=256):
    return {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": original,
            "short_factor": SHORT, "long_factor": LONG}


def _lab(tmp_path, longest=512, original=256, code=None):
    shape = Shape(architecture="LonglabForCausalLM", model_type="longlab", head_dim=HEAD_DIM,
                  extra={"max_position_embeddings": longest, "rope_parameters": _params(original)})
    read(tmp_path, shape)
    (tmp_path / "modeling_longlab.py").write_text(code or modeling_source())
    return read_checkpoint(tmp_path)


def test_past_the_original_length_the_long_factors_apply_at_every_position(tmp_path):
    found = longrope.read({"modeling_longlab.py": modeling_source()},
                          {"max_position_embeddings": 512, "hidden_size": 64, "num_attention_heads": 4,
                           "head_dim": HEAD_DIM, "rope_parameters": _params()}, HEAD_DIM, _params())
    assert isinstance(found, longrope.LongRopeTable), found
    assert found.which == "long_factor" and list(found.factors) == LONG
    assert found.mscale == pytest.approx(math.sqrt(1 + math.log(2) / math.log(256)), rel=1e-12)
    assert found.positions == 512 and found.cls == "LonglabScaledRotary"


def test_the_port_hands_vllm_the_factors_and_scale_the_code_applies(tmp_path):
    spec = detect_until(_lab(tmp_path), rope)
    params = spec.rope_parameters
    assert params["short_factor"] == LONG and params["long_factor"] == LONG
    scale = math.sqrt(1 + math.log(2) / math.log(256))
    assert params["short_mscale"] == pytest.approx(scale) and params["long_mscale"] == pytest.approx(scale)
    assert params["original_max_position_embeddings"] == 256
    detail = spec.source("rope_parameters").detail
    assert "LonglabScaledRotary applies rope_scaling.long_factor at every position 0..511" in detail
    assert "both of vLLM's LongRoPE factor sets" in detail


def test_within_the_original_length_the_short_factors_apply_unscaled(tmp_path):
    spec = detect_until(_lab(tmp_path, longest=256), rope)
    params = spec.rope_parameters
    assert params["short_factor"] == SHORT and params["long_factor"] == SHORT
    assert params["short_mscale"] == 1.0 and params["long_mscale"] == 1.0


RUNTIME_CHOICE = '''    def forward(self, x, position_ids):
        self.build_tables(max(position_ids.shape[-1], self.original_length))
        return self.cos_table[position_ids].to(x.dtype), self.sin_table[position_ids].to(x.dtype)
'''


def test_a_choice_by_sequence_length_at_run_time_keeps_the_config_parameters(tmp_path):
    """Short factors for sequences within the original length, long ones past it (transformers' Phi-3 form, which
    vLLM's own LongRoPE follows): the config's two sets, as they are."""
    code = modeling_source().replace(
        '        self.register_buffer("sin_table", both.sin() * self.magnitude, persistent=False)\n',
        '        self.register_buffer("sin_table", both.sin() * self.magnitude, persistent=False)\n\n' + RUNTIME_CHOICE)
    assert code.count(RUNTIME_CHOICE) == 1
    assert longrope.read({"m.py": code}, {"max_position_embeddings": 512, "hidden_size": 64,
                                          "num_attention_heads": 4, "head_dim": HEAD_DIM,
                                          "rope_parameters": _params()}, HEAD_DIM, _params()) is None
    spec = detect_until(_lab(tmp_path, code=code), rope)
    assert spec.rope_parameters["short_factor"] == SHORT and spec.rope_parameters["long_factor"] == LONG
    assert "short_mscale" not in spec.rope_parameters


def test_a_table_of_neither_set_is_refused_by_name(tmp_path):
    code = modeling_source().replace("self.inv_freq / divisors", "self.inv_freq * divisors")
    with pytest.raises(UnsupportedArchitecture, match=r"LongRoPE rotary embedding vLLM's "
                                                      r"Phi3LongRoPEScaledRotaryEmbedding does not compute "
                                                      r"\(modeling_longlab.py:\d+: LonglabScaledRotary rotates at "
                                                      r"frequencies that are neither the short nor the long"):
        detect_until(_lab(tmp_path, code=code), rope)


def test_transformers_phi3_keeps_its_longrope_parameters():
    """transformers' own Phi-3 builds its rotary from the config (no short_factor= / long_factor= of its own)."""
    assert longrope.read(transformers_code("phi3"), {"max_position_embeddings": 1024}, 16, _params()) is None
