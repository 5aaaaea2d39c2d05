"""detect/sizes.py: model dimensions from config.json, derived where the config leaves them out."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, config_for, write_checkpoint
from helpers import detect_until, read

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import sizes
from scaffold.errors import CheckpointError


def test_sizes_are_read_from_the_config(tmp_path):
    spec = detect_until(read(tmp_path, Shape(hidden=64, heads=4, kv_heads=2, head_dim=32, layers=3,
                                             intermediate=96, vocab=128)), sizes)
    assert (spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (64, 4, 2, 32)
    assert (spec.num_layers, spec.intermediate_size, spec.vocab_size, spec.max_position) == (3, 96, 128, 512)
    assert spec.source("head_dim").expr == "config.head_dim"


def test_head_dim_is_derived_when_the_config_has_none(tmp_path):
    spec = detect_until(read(tmp_path, Shape(hidden=64, heads=4, head_dim=16, explicit_head_dim=False)), sizes)
    assert spec.head_dim == 16
    assert spec.source("head_dim").kind == "derived" and spec.source("head_dim").expr == "config.hidden_size // config.num_attention_heads"


def test_missing_kv_heads_means_one_per_query_head(tmp_path):
    config = config_for(Shape(kv_heads=4))
    del config["num_key_value_heads"]
    write_checkpoint(tmp_path, Shape(kv_heads=4), config=config)
    spec = detect_until(read_checkpoint(tmp_path), sizes)
    assert spec.num_kv_heads == spec.num_heads == 4 and spec.source("num_kv_heads").kind == "default"


def test_heads_that_do_not_share_kv_heads_evenly_are_refused(tmp_path):
    config = {**config_for(Shape()), "num_key_value_heads": 3}
    write_checkpoint(tmp_path, Shape(), config=config)
    with pytest.raises(CheckpointError, match="4 attention heads cannot be shared by 3 KV heads"):
        detect_until(read_checkpoint(tmp_path), sizes)


@pytest.mark.parametrize("key", ["max_seq_len", "ctx_len", "max_ctx", "context_length", "max_len", "seq_len"])
def test_a_context_length_under_the_labs_own_key_is_read_when_no_code_reads_one(tmp_path, key):
    config = config_for(Shape())
    del config["max_position_embeddings"]
    write_checkpoint(tmp_path, Shape(), config={**config, key: 640})
    spec = detect_until(read_checkpoint(tmp_path), sizes)
    assert spec.max_position == 640 and spec.source("max_position").expr == f"config.{key}"


def test_two_keys_that_could_be_the_context_length_leave_the_default(tmp_path):
    config = config_for(Shape())
    del config["max_position_embeddings"]
    write_checkpoint(tmp_path, Shape(), config={**config, "max_seq_len": 640, "ctx_len": 320,
                                                "original_max_position_embeddings": 99, "position_offset": 2})
    spec = detect_until(read_checkpoint(tmp_path), sizes)
    assert spec.max_position == 2048 and spec.source("max_position").kind == "default"
