"""scaffold.detect.policy: what no port expresses and the shapes config.json fixes, decided above the reader."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, config_for, tensors_for, write_checkpoint
from helpers import scaffold

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import policy, understand
from scaffold.errors import CheckpointError, UnsupportedArchitecture


def test_the_reader_reads_a_state_space_checkpoint_and_policy_refuses_it(tmp_path):
    write_checkpoint(tmp_path, Shape(), config={**config_for(Shape()), "ssm_state_size": 16})
    ckpt = read_checkpoint(tmp_path)  # the files are sound: reading is not refusing
    with pytest.raises(UnsupportedArchitecture, match="state-space") as err:
        policy.check(ckpt)
    assert err.value.path == str(tmp_path / "config.json")
    with pytest.raises(UnsupportedArchitecture, match="state-space"):
        understand(ckpt)  # detection runs the policy first


def test_an_o_proj_the_config_contradicts_is_refused_naming_the_shape(tmp_path):
    tensors = tensors_for(Shape())
    tensors["model.layers.0.self_attn.o_proj.weight"] = [64, 32]
    write_checkpoint(tmp_path, Shape(), tensors=tensors)
    ckpt = read_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=r"o_proj.weight' has shape \[64, 32\]"):
        policy.check(ckpt)


def test_every_path_refuses_a_linear_attention_checkpoint_alike(tmp_path):
    config = {**config_for(Shape()), "layer_types": ["linear_attention", "full_attention"]}
    write_checkpoint(tmp_path / "ckpt", Shape(), config=config)
    errors = {scaffold(*args, check=False).stderr.strip() for args in (
        ["inspect", tmp_path / "ckpt"], ["new", tmp_path / "ckpt", "-o", tmp_path / "out"],
        ["new", tmp_path / "ckpt", "-o", tmp_path / "out", "--impl", "transformers"])}
    assert len(errors) == 1 and "linear or recurrent attention" in errors.pop()
    assert not (tmp_path / "out").exists()
