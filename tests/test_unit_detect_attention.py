"""detect/attention.py: projection shapes, scale and soft-capping, sliding-window layers."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, config_for, tensors_for, write_checkpoint
from helpers import detect_until, read

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import attention
from scaffold.errors import CheckpointError


def test_no_sliding_window_and_the_default_scale(tmp_path):
    spec = detect_until(read(tmp_path), attention)
    assert spec.sliding_window is None and spec.sliding_window_layers == []
    assert spec.attention_scale is None and spec.attn_logit_softcap is None


def test_layer_types_pick_the_sliding_layers(tmp_path):
    shape = Shape(family="qwen2", layers=4, sliding_window=8, sliding_layers=(0, 2))
    spec = detect_until(read(tmp_path, shape), attention)
    assert spec.sliding_window == 8 and spec.sliding_window_layers == [0, 2]


def test_a_window_without_layer_types_slides_every_layer(tmp_path):
    spec = detect_until(read(tmp_path, Shape(family="mistral", layers=3, sliding_window=16)), attention)
    assert spec.sliding_window == 16 and spec.sliding_window_layers == [0, 1, 2]


def test_use_sliding_window_false_turns_the_window_off(tmp_path):
    config = {**config_for(Shape(family="qwen2")), "use_sliding_window": False, "sliding_window": 32}
    write_checkpoint(tmp_path, Shape(family="qwen2"), config=config)
    spec = detect_until(read_checkpoint(tmp_path), attention)
    assert spec.sliding_window is None


def test_query_pre_attn_scalar_and_softcap_set_scale_and_cap(tmp_path):
    shape = Shape(extra={"query_pre_attn_scalar": 64, "attn_logit_softcapping": 50.0})
    spec = detect_until(read(tmp_path, shape), attention)
    assert spec.attention_scale == pytest.approx(64**-0.5)
    assert spec.attn_logit_softcap == 50.0


def test_a_k_proj_of_the_wrong_height_is_refused_with_the_shape_it_needs(tmp_path):
    shape = Shape(heads=4, kv_heads=2, head_dim=16, hidden=64)
    tensors = tensors_for(shape)
    for layer in range(shape.layers):  # every layer alike: one odd layer is a different error
        tensors[f"model.layers.{layer}.self_attn.k_proj.weight"] = [16, 64]
    write_checkpoint(tmp_path, shape, tensors=tensors)
    with pytest.raises(CheckpointError, match=r"k_proj.weight has shape \[16, 64\].*need \[32, 64\]"):
        detect_until(read_checkpoint(tmp_path), attention)
