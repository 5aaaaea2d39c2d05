"""detect/mlp.py: the activation and the MLP projections' shapes."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, tensors_for, write_checkpoint
from helpers import detect_until, read

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import mlp
from scaffold.errors import CheckpointError, UnsupportedArchitecture


def test_silu_gated_mlp(tmp_path):
    spec = detect_until(read(tmp_path), mlp)
    assert spec.mlp_kind == "gated" and spec.hidden_act == "silu" and spec.mlp_bias is False


def test_the_activation_key_the_code_indexes_act2fn_with_wins(tmp_path):
    shape = Shape(extra={"hidden_act": "silu", "hidden_activation": "gelu_pytorch_tanh"})
    write_checkpoint(tmp_path, shape)
    (tmp_path / "modeling_x.py").write_text("act = ACT2FN[config.hidden_activation]\n")
    spec = detect_until(read_checkpoint(tmp_path), mlp)
    assert spec.hidden_act == "gelu_pytorch_tanh"


def test_an_activation_without_a_vllm_kernel_is_refused(tmp_path):
    with pytest.raises(UnsupportedArchitecture, match="'softsign'"):
        detect_until(read(tmp_path, Shape(extra={"hidden_act": "softsign"})), mlp)


def test_a_down_proj_of_the_wrong_shape_is_refused(tmp_path):
    shape = Shape(hidden=64, intermediate=96)
    tensors = tensors_for(shape)
    for layer in range(shape.layers):  # every layer alike: one odd layer is a different error
        tensors[f"model.layers.{layer}.mlp.down_proj.weight"] = [64, 64]
    write_checkpoint(tmp_path, shape, tensors=tensors)
    with pytest.raises(CheckpointError, match=r"down_proj.weight has shape \[64, 64\].*need \[64, 96\]"):
        detect_until(read_checkpoint(tmp_path), mlp)
