"""detect/latent.py: multi-head latent attention (DeepSeek-V2's MLA) read from tensor names and shapes."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, tensors_for
from helpers import detect_until, read

from scaffold.detect import layout
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.mapping import map_tensor

# 4 heads; rotated part 16, unrotated 24, value 8; latent 32; low-rank query 20.
HEADS, ROPE, NOPE, VALUE, KV_RANK, Q_RANK = 4, 16, 24, 8, 32, 20
SIZES = {"kv_lora_rank": KV_RANK, "q_lora_rank": Q_RANK, "qk_rope_head_dim": ROPE, "qk_nope_head_dim": NOPE,
         "v_head_dim": VALUE}


def latent_tensors(shape: Shape, *, low_rank_q: bool = True, names: dict | None = None) -> dict[str, list[int]]:
    """The Llama layout of `shape` with DeepSeek-V2's latent attention in place of q/k/v (names: renames)."""
    n = {"q_a_proj": "q_a_proj", "q_a_layernorm": "q_a_layernorm", "q_b_proj": "q_b_proj",
         "kv_a_proj_with_mqa": "kv_a_proj_with_mqa", "kv_a_layernorm": "kv_a_layernorm", "kv_b_proj": "kv_b_proj",
         **(names or {})}
    h = shape.hidden
    out = {k: v for k, v in tensors_for(shape).items() if ".self_attn." not in k}
    for i in range(shape.layers):
        p = f"model.layers.{i}.self_attn."
        if low_rank_q:
            out[p + f"{n['q_a_proj']}.weight"] = [Q_RANK, h]
            out[p + f"{n['q_a_layernorm']}.weight"] = [Q_RANK]
            out[p + f"{n['q_b_proj']}.weight"] = [HEADS * (NOPE + ROPE), Q_RANK]
        else:
            out[p + "q_proj.weight"] = [HEADS * (NOPE + ROPE), h]
        out[p + f"{n['kv_a_proj_with_mqa']}.weight"] = [KV_RANK + ROPE, h]
        out[p + f"{n['kv_a_layernorm']}.weight"] = [KV_RANK]
        out[p + f"{n['kv_b_proj']}.weight"] = [HEADS * (NOPE + VALUE), KV_RANK]
        out[p + "o_proj.weight"] = [h, HEADS * VALUE]
    return out


def latent_checkpoint(tmp_path, *, config_sizes: dict | None = None, **kwargs):
    shape = Shape(model_type="lablatent", architecture="LabLatentForCausalLM", extra=dict(config_sizes or {}))
    return read(tmp_path, shape, tensors=latent_tensors(shape, **kwargs))


def test_the_latent_sizes_are_read_from_the_config_where_it_agrees_with_the_tensors(tmp_path):
    spec = detect_until(latent_checkpoint(tmp_path, config_sizes=SIZES), layout)
    assert spec.qkv_layout == "latent" and spec.qkv_bias is False
    for field, value in SIZES.items():
        assert getattr(spec, field) == value, field
        assert spec.source(field).expr == f"config.{field}", field  # the port reads the key at run time
    assert {spec.names[r] for r in ("q_a_proj", "q_a_norm", "q_b_proj", "kv_a_proj", "kv_a_norm", "kv_b_proj")} == {
        "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj"}
    assert spec.names["qkv_proj"] == "fused_qkv_a_proj"


def test_without_config_keys_every_size_follows_from_the_shapes(tmp_path):
    spec = detect_until(latent_checkpoint(tmp_path), layout)
    assert (spec.kv_lora_rank, spec.q_lora_rank, spec.qk_rope_head_dim, spec.qk_nope_head_dim, spec.v_head_dim) == (
        KV_RANK, Q_RANK, ROPE, NOPE, VALUE)
    assert spec.source("kv_lora_rank").kind == "tensor" and spec.source("kv_lora_rank").expr is None


def test_queries_from_one_projection_have_no_low_rank(tmp_path):
    spec = detect_until(latent_checkpoint(tmp_path, low_rank_q=False), layout)
    assert spec.qkv_layout == "latent" and spec.q_lora_rank == 0 and spec.names["q_proj"] == "q_proj"
    assert "q_a_proj" not in spec.names


def test_the_low_rank_query_and_the_latent_load_as_the_two_shards_of_one_parameter(tmp_path):
    spec = detect_until(latent_checkpoint(tmp_path), layout)
    q_a = map_tensor(spec, "model.layers.1.self_attn.q_a_proj.weight")
    kv_a = map_tensor(spec, "model.layers.1.self_attn.kv_a_proj_with_mqa.weight")
    assert [t[:2] for t in q_a] == [("model.layers.1.self_attn.fused_qkv_a_proj.weight", 0)]
    assert [t[:2] for t in kv_a] == [("model.layers.1.self_attn.fused_qkv_a_proj.weight", 1)]
    assert map_tensor(spec, "model.layers.1.self_attn.kv_b_proj.weight")[0][:2] == (
        "model.layers.1.self_attn.kv_b_proj.weight", None)


def test_a_config_size_the_tensors_contradict_is_an_error_naming_the_key(tmp_path):
    with pytest.raises(CheckpointError, match="v_head_dim = 16.*make it 8"):
        detect_until(latent_checkpoint(tmp_path, config_sizes={**SIZES, "v_head_dim": 16}), layout)


def test_a_top_k_token_indexer_is_refused_by_name(tmp_path):
    shape = Shape(model_type="lablatent", architecture="LabLatentForCausalLM")
    tensors = latent_tensors(shape)
    for i in range(shape.layers):
        tensors[f"model.layers.{i}.self_attn.indexer.wk.weight"] = [16, shape.hidden]
    with pytest.raises(UnsupportedArchitecture, match="indexer"):
        detect_until(read(tmp_path, shape, tensors=tensors), layout)


def test_a_latent_attention_that_lacks_its_norm_is_refused_naming_what_is_missing(tmp_path):
    shape = Shape(model_type="lablatent", architecture="LabLatentForCausalLM")
    tensors = {k: v for k, v in latent_tensors(shape).items() if "kv_a_layernorm" not in k}
    with pytest.raises(UnsupportedArchitecture, match="kv_a_norm"):
        detect_until(read(tmp_path, shape, tensors=tensors), layout)


def test_a_spec_file_that_says_latent_must_name_the_latent_modules(tmp_path):
    from scaffold.errors import SpecError
    from scaffold.spec import validate_names

    spec = detect_until(latent_checkpoint(tmp_path), layout)
    validate_names(spec, "spec.toml")
    del spec.names["kv_b_proj"]
    with pytest.raises(SpecError, match="kv_b_proj"):
        validate_names(spec, "spec.toml")
