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


def test_embeddings_narrower_than_the_hidden_size_are_refused_as_a_feature(tmp_path):
    """OPT-350m: embedding and head of width word_embed_proj_dim, projected to the hidden size and back. Named as the
    form it is where a config key about the embedding gives that width; a head that is merely wrong stays bad input."""
    shape = Shape()
    tensors = tensors_for(shape)
    vocab = config_for(shape)["vocab_size"]
    tensors["lm_head.weight"] = [vocab, 16]
    write_checkpoint(tmp_path / "proj", shape, tensors=tensors,
                     config={**config_for(shape), "word_embed_proj_dim": 16})
    with pytest.raises(UnsupportedArchitecture, match=r"embeddings of width word_embed_proj_dim = 16, where "
                                                      r"hidden_size is \d+ \(tensor 'lm_head.weight'") as refused:
        policy.check(read_checkpoint(tmp_path / "proj"))
    assert "project_in" in refused.value.problem
    write_checkpoint(tmp_path / "wrong", shape, tensors=tensors)  # no key says 16: a head of the wrong width
    with pytest.raises(CheckpointError, match=r"lm_head.weight' has shape") as wrong:
        policy.check(read_checkpoint(tmp_path / "wrong"))
    assert not isinstance(wrong.value, UnsupportedArchitecture)


def test_every_path_refuses_a_linear_attention_checkpoint_alike(tmp_path):
    config = {**config_for(Shape()), "layer_types": ["linear_attention", "full_attention"]}
    write_checkpoint(tmp_path / "ckpt", Shape(), config=config)
    errors = {scaffold(*args, check=False).stderr.strip() for args in (
        ["inspect", tmp_path / "ckpt"], ["new", tmp_path / "ckpt", "-o", tmp_path / "out"],
        ["new", tmp_path / "ckpt", "-o", tmp_path / "out", "--impl", "transformers"])}
    assert len(errors) == 1 and "linear or recurrent attention" in errors.pop()
    assert not (tmp_path / "out").exists()
