"""detect/moe.py (with layout's MoE names): experts, router, shared expert and dense layers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from ckpt_factory import Shape
from helpers import detect_until, moe_tensors, read

from scaffold.detect import moe

# The installed transformers' folder, found without importing it (that costs each test worker ~4 s).
TRANSFORMERS = Path(importlib.util.find_spec("transformers").submodule_search_locations[0])
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


def _transformers_source(model_type: str) -> dict[str, str]:
    path = TRANSFORMERS / "models" / model_type / f"modeling_{model_type}.py"
    return {path.name: path.read_text(encoding="utf-8")}


@pytest.mark.parametrize("model_type, key", [
    ("cohere2_moe", "intermediate_size"),  # its config class also carries moe_intermediate_size, unread
    ("qwen3_moe", "moe_intermediate_size"),
    ("mixtral", "intermediate_size"),
])
def test_expert_width_key_is_the_one_the_experts_code_reads(model_type, key):
    config = {"intermediate_size": 256, "moe_intermediate_size": 64}
    assert moe.expert_width_key(_transformers_source(model_type), "experts", config) == key


def test_expert_width_key_from_a_module_list_of_mlps():
    lab = ("import torch.nn as nn\n\nclass Mlp(nn.Module):\n    def __init__(self, config, intermediate_size):\n"
           "        super().__init__()\n\nclass Moe(nn.Module):\n    def __init__(self, config):\n"
           "        super().__init__()\n        self.experts = nn.ModuleList(\n"
           "            [Mlp(config, intermediate_size=config.expert_ffn) for _ in range(config.n_exp)])\n")
    assert moe.expert_width_key({"m.py": lab}, "experts", {"expert_ffn": 32, "intermediate_size": 64}) == "expert_ffn"
    assert moe.expert_width_key({"m.py": lab}, "experts", {"intermediate_size": 64}) is None  # key not in config.json
