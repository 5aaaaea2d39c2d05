"""The reader (scaffold/checkpoint.py) on its own: what it reads from config, headers, index and sources."""

from __future__ import annotations

import json
import struct

import pytest
from ckpt_factory import Shape, config_for, tensors_for, write_checkpoint
from helpers import detect_until, read

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import sizes
from scaffold.errors import CheckpointError, UnsupportedArchitecture


def test_every_tensor_header_is_read_with_dtype_shape_and_shard(tmp_path):
    shape = Shape(layers=3)
    ckpt = read(tmp_path, shape, shards=2)
    weight_map = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(ckpt.tensors) == set(tensors_for(shape))
    for name, dims in tensors_for(shape).items():
        info = ckpt.tensors[name]
        assert (info.name, info.dtype, info.shape, info.file) == (name, "F32", tuple(dims), weight_map[name])
    assert ckpt.shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert ckpt.index_file == "model.safetensors.index.json"
    assert ckpt.config["num_hidden_layers"] == 3 and ckpt.config_file == tmp_path / "config.json"


def test_a_single_shard_has_no_index(tmp_path):
    ckpt = read(tmp_path)
    assert ckpt.shards == ["model.safetensors"] and ckpt.index_file is None
    assert {info.file for info in ckpt.tensors.values()} == {"model.safetensors"}
    assert ckpt.tensor("model.embed_tokens.weight").numel == 128 * 64
    assert ckpt.tensor("no.such.weight") is None


def test_no_tokenizer_files_means_no_tokenizer_size(tmp_path):
    tokenizer = read(tmp_path).tokenizer
    assert tokenizer.files == [] and tokenizer.vocab_size is None


def test_modeling_source_is_read_as_text_never_run(tmp_path):
    write_checkpoint(tmp_path, Shape())
    (tmp_path / "modeling_demo.py").write_text("raise SystemExit('this file was executed')\nROPE_THETA = 5\n")
    ckpt = read_checkpoint(tmp_path)
    assert ckpt.sources == {"modeling_demo.py": "raise SystemExit('this file was executed')\nROPE_THETA = 5\n"}


def test_auto_map_naming_a_missing_file_is_an_error_naming_config(tmp_path):
    config = {**config_for(Shape()), "auto_map": {"AutoModelForCausalLM": "modeling_gone.GoneForCausalLM"}}
    write_checkpoint(tmp_path, Shape(), config=config)
    with pytest.raises(CheckpointError, match="modeling_gone.py") as err:
        read_checkpoint(tmp_path)
    assert err.value.path == str(tmp_path / "config.json")


def test_header_longer_than_the_file_is_an_error_naming_the_shard(tmp_path):
    write_checkpoint(tmp_path, Shape())
    shard = tmp_path / "model.safetensors"
    blob = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", len(blob) * 2) + blob[8:])
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(tmp_path)
    assert "model.safetensors" in err.value.message


def test_data_offsets_past_the_end_are_refused(tmp_path):
    write_checkpoint(tmp_path, Shape())
    shard = tmp_path / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4])  # the last tensor now ends past the data
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(tmp_path)
    assert "model.safetensors" in err.value.message


def test_config_that_is_not_json_is_an_error_naming_it(tmp_path):
    write_checkpoint(tmp_path, Shape())
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(tmp_path)
    assert err.value.message.startswith(str(tmp_path / "config.json"))


def test_a_size_given_per_layer_is_refused_as_a_feature_not_as_bad_input(tmp_path):
    # Gemma-3n's config.json: intermediate_size holds one width per layer. Well-formed; the reader leaves an MLP
    # width list to detect.sizes, which ports it only where the code builds each layer's MLP from its own entry
    # (Llama's code does not: refused there, tests/test_unit_layer_widths.py); any other size given per layer is
    # refused as the reader reads it.
    write_checkpoint(tmp_path, Shape())
    config = json.loads((tmp_path / "config.json").read_text())
    config["intermediate_size"] = [256] * config["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    ckpt = read_checkpoint(tmp_path)
    with pytest.raises(UnsupportedArchitecture) as err:
        detect_until(ckpt, sizes)
    assert err.value.message.startswith(str(tmp_path / "config.json"))
    assert "per-layer sizes: config key 'intermediate_size' holds one value per layer" in err.value.message
    config["intermediate_size"] = 256
    config["num_attention_heads"] = [4] * config["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitecture, match="per-layer sizes: config key 'num_attention_heads' holds one "
                                                      "value per layer"):
        read_checkpoint(tmp_path)
    config["num_attention_heads"] = 4
    config["intermediate_size"] = [256, 0]  # a list with a size that is no size stays bad input
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="must be a positive integer"):
        read_checkpoint(tmp_path)


LAYERWISE_ATTENTION = '''
from torch import nn


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        q_heads = config.num_query_heads[layer_idx]
        kv_heads = config.num_kv_heads[layer_idx]
        self.qkv_proj = nn.Linear(config.model_dim, (q_heads + 2 * kv_heads) * config.head_dim, bias=False)
'''


def test_a_size_given_per_layer_is_refused_naming_where_the_code_reads_it_per_layer(tmp_path):
    # A width key held per layer (hidden_size) that the code reads by the layer's index: the port builds the layers
    # from one width. The refusal names the file, the line and the class, not the config key alone.
    write_checkpoint(tmp_path, Shape())
    config = json.loads((tmp_path / "config.json").read_text())
    config["hidden_size"] = [config["hidden_size"]] * config["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "modeling_lab.py").write_text(LAYERWISE_ATTENTION.replace("config.model_dim",
                                                                         "config.hidden_size[layer_idx]"))
    with pytest.raises(UnsupportedArchitecture) as err:
        read_checkpoint(tmp_path)
    assert "per-layer sizes: config key 'hidden_size' holds one value per layer" in err.value.message
    assert ("which the code reads per layer (modeling_lab.py:10: config.hidden_size[layer_idx] in "
            "LabAttention.__init__)") in err.value.message
    (tmp_path / "modeling_lab.py").write_text("def broken(:\n")  # code that does not parse: the key alone
    with pytest.raises(UnsupportedArchitecture) as err:
        read_checkpoint(tmp_path)
    assert "which the code reads" not in err.value.message


def test_head_counts_given_per_layer_reach_detection_where_the_code_reads_them_per_layer(tmp_path):
    # OpenELM's form: the attention reads its own KV heads (and query heads) from a list in config.json by the
    # layer's index: the reader lets the list through (scaffold.detect.layerheads ports it); a list no code
    # indexes by the layer is refused naming the key.
    write_checkpoint(tmp_path, Shape())
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_kv_heads"] = [2, 1][: config["num_hidden_layers"]] + [2] * (config["num_hidden_layers"] - 2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "modeling_lab.py").write_text(LAYERWISE_ATTENTION)
    assert read_checkpoint(tmp_path).config["num_kv_heads"] == config["num_kv_heads"]
    (tmp_path / "modeling_lab.py").write_text(LAYERWISE_ATTENTION.replace("config.num_kv_heads[layer_idx]", "2"))
    with pytest.raises(UnsupportedArchitecture, match="config key 'num_kv_heads' holds one value per layer"):
        read_checkpoint(tmp_path)
