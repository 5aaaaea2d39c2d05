"""detect/moe.py (with layout's MoE names): experts, router, shared expert and dense layers."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape
from helpers import detect_until, moe_tensors, read

from scaffold.detect import moe
from scaffold.errors import CheckpointError

MOE_CONFIG = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": False}


def test_experts_router_and_sizes(tmp_path):
    shape = Shape(layers=3, extra=MOE_CONFIG)
    spec = detect_until(read(tmp_path, shape, tensors=moe_tensors(shape, experts=4, inter=32, dense_layers=(1,))),
                        moe)
    assert spec.is_moe and spec.num_experts == 4 and spec.num_experts_per_tok == 2
    assert spec.moe_intermediate_size == 32 and spec.moe_renormalize is False
    assert spec.dense_layers == [1] and spec.sparse_layers == [0, 2]
    assert (spec.names["router"], spec.names["expert_gate_proj"], spec.names["expert_down_proj"]) == (
        "gate", "gate_proj", "down_proj")
    assert "shared_expert" not in spec.names and spec.shared_expert_intermediate_size == 0


def test_a_shared_expert_and_its_gate(tmp_path):
    shape = Shape(layers=2, extra={**MOE_CONFIG, "shared_expert_intermediate_size": 48})
    spec = detect_until(read(tmp_path, shape, tensors=moe_tensors(shape, experts=4, inter=32, shared=48)), moe)
    assert spec.names["shared_expert"] == "shared_expert" and spec.names["shared_expert_gate"] == "shared_expert_gate"
    assert spec.shared_expert_intermediate_size == 48 and spec.dense_layers == []


def test_more_experts_in_the_tensors_than_the_config_declares_are_refused(tmp_path):
    shape = Shape(layers=2, extra=MOE_CONFIG)
    tensors = moe_tensors(shape, experts=4, inter=32)
    for layer in range(2):
        tensors[f"model.layers.{layer}.mlp.experts.4.gate_proj.weight"] = [32, 64]
        tensors[f"model.layers.{layer}.mlp.experts.4.up_proj.weight"] = [32, 64]
        tensors[f"model.layers.{layer}.mlp.experts.4.down_proj.weight"] = [64, 32]
    with pytest.raises(CheckpointError, match="experts.4.down_proj.weight is an expert past the 4 that config.json"):
        detect_until(read(tmp_path, shape, tensors=tensors), moe)


def test_routing_to_more_experts_than_exist_is_refused(tmp_path):
    shape = Shape(layers=2, extra={**MOE_CONFIG, "num_experts_per_tok": 5})
    with pytest.raises(CheckpointError, match="routes each token to 5 of 4 experts"):
        detect_until(read(tmp_path, shape, tensors=moe_tensors(shape, experts=4, inter=32)), moe)


def test_a_dense_model_has_no_experts(tmp_path):
    spec = detect_until(read(tmp_path), moe)
    assert not spec.is_moe and spec.num_experts == 0 and spec.sparse_layers == []
