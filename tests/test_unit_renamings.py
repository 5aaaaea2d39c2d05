"""detect/renamings.py: the names transformers gives a checkpoint's tensors on load, read from its table."""

from __future__ import annotations

from ckpt_factory import Shape
from helpers import read

from scaffold.detect import renamings

TABLE = '''
_MODEL_TO_CONVERSION_PATTERN = {"twin": "base"}


def _build_checkpoint_conversion_mapping():
    mapping = {
        "base": [
            WeightConverter(source_patterns="mlp.experts.*.w1.weight", target_patterns="mlp.experts.w1"),
            WeightRenaming(r"\\.block_sparse_moe\\.", r"\\.mlp\\."),
        ],
    }
    mapping["child"] = mapping["base"].copy()
    mapping["child"] += [
        WeightRenaming(source_patterns=r"mlp\\.expert_bias", target_patterns="mlp.e_score_correction_bias"),
        WeightRenaming(source_patterns=r"^(encoder|decoder)\\.", target_patterns=r"\\1.layers."),
    ]
    mapping["own"] = [WeightRenaming("norm1", "layernorm_before")]
    return mapping
'''


def test_plain_renamings_follow_copies_additions_and_shared_tables():
    table = renamings.parse_table(TABLE)
    assert table["base"] == table["twin"] == ((r"\.block_sparse_moe\.", ".mlp."),)
    # The converter merges tensors (not a renaming); a capturing group is no plain renaming.
    assert table["child"] == ((r"\.block_sparse_moe\.", ".mlp."), (r"mlp\.expert_bias", "mlp.e_score_correction_bias"))
    assert table["own"] == (("norm1", "layernorm_before"),)
    assert renamings.code_name(table["child"], "model.layers.3.block_sparse_moe.expert_bias") \
        == "model.layers.3.mlp.e_score_correction_bias"
    assert renamings.code_name(table["child"], "model.layers.3.mlp.gate.weight") == "model.layers.3.mlp.gate.weight"


def test_the_installed_table_renames_hy_v3s_router_bias_and_shared_expert():
    table = renamings._table()["hy_v3"]
    assert [renamings.code_name(table, f"model.layers.1.mlp.{n}") for n in
            ("router.gate.weight", "expert_bias", "shared_mlp.down_proj.weight", "experts.0.up_proj.weight")] == [
        f"model.layers.1.mlp.{n}" for n in
        ("gate.weight", "e_score_correction_bias", "shared_experts.down_proj.weight", "experts.0.up_proj.weight")]


def test_a_checkpoint_with_its_own_code_is_not_renamed_by_transformers_table(tmp_path):
    ckpt = read(tmp_path, Shape(model_type="hy_v3"))
    assert renamings.renamings(ckpt) == renamings._table()["hy_v3"]
    ckpt.sources.update({"modeling_own.py": "class Own: pass\n"})
    assert renamings.renamings(ckpt) == ()


CHUNKS = '''
_MODEL_TO_CONVERSION_PATTERN = {"sibling": "fused"}


def _build_checkpoint_conversion_mapping():
    mapping = {
        "fused": [
            WeightConverter(
                source_patterns="block.wgqkv.weight",
                target_patterns=["attention.gate.weight", "attention.wq.weight", "attention.wk.weight",
                                 "attention.wv.weight"],
                operations=[Chunk(dim=0)],
            ),
            WeightConverter("ffn.w13.weight", ["ffn.w1.weight", "ffn.w3.weight"], [Chunk(0)]),
            WeightRenaming(r"\\.block\\.", ".attention."),
        ],
        "other": [
            WeightConverter(source_patterns="qkv", target_patterns=["q", "k", "v"], operations=[Chunk(dim=1)]),
            WeightConverter(source_patterns="experts.*.w", target_patterns=["experts.w"],
                            operations=[Chunk(dim=0, num_shards_attribute="num_experts")]),
            WeightConverter(source_patterns="qkv", target_patterns=["q", "k", "v"],
                            operations=[Interleave(dim=0), Chunk(dim=0)]),
        ],
    }
    return mapping
'''


def test_chunk_converters_give_the_row_blocks_in_order():
    table = renamings.parse_chunks(CHUNKS)
    assert table["fused"] == table["sibling"] == (
        renamings.Chunked("block.wgqkv.weight", ("attention.gate.weight", "attention.wq.weight", "attention.wk.weight",
                                                 "attention.wv.weight")),
        renamings.Chunked("ffn.w13.weight", ("ffn.w1.weight", "ffn.w3.weight")))  # positional arguments too
    # Cut along columns, into as many pieces as a config key says, or after another operation: not row blocks.
    assert "other" not in table
    assert renamings.parse_table(CHUNKS)["fused"] == ((r"\.block\.", ".attention."),)  # the renamings unchanged


def test_the_installed_table_cuts_hrm_texts_fused_projections(tmp_path):
    assert renamings._chunk_table()["hrm_text"] == (
        renamings.Chunked("mlp.gate_up_proj.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight")),
        renamings.Chunked("attn.gqkv_proj.weight", ("self_attn.gate_proj.weight", "self_attn.q_proj.weight",
                                                    "self_attn.k_proj.weight", "self_attn.v_proj.weight")))
    ckpt = read(tmp_path, Shape(model_type="hrm_text"))
    assert renamings.chunks(ckpt) == renamings._chunk_table()["hrm_text"]
    ckpt.sources.update({"modeling_own.py": "class Own: pass\n"})
    assert renamings.chunks(ckpt) == ()


def test_hy_v4s_mlp_gates_are_read_under_the_names_its_checkpoint_stores(tmp_path):
    """HY-V4's checkpoints keep `linear_gate` for its dense MLP's and shared experts' gate_proj (transformers renames
    `.linear_gate` -> `.gate_proj` on load): read through the table, the projections keep the stored names."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import moe
    from scaffold.tiny import build_tiny

    ckpt = read_checkpoint(build_tiny("hy_v4", tmp_path / "ckpt", overrides={
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "num_local_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_group": 1,
        "topk_group": 1}))

    def layer(i: int) -> dict:
        return {k[len(f"model.layers.{i}."):]: v for k, v in ckpt.tensors.items() if k.startswith(f"model.layers.{i}.")}
    dense, sparse = layer(0), layer(1)
    assert "mlp.linear_gate.weight" in dense and "mlp.gate_proj.weight" not in dense
    code = moe.code_names(ckpt, "model.layers.0.")
    assert [moe.stored_projection(dense, "mlp", p, code) for p in ("gate_proj", "up_proj", "down_proj")] == [
        "linear_gate", "up_proj", "down_proj"]
    # Not through the table: no stored name for the code's gate_proj.
    assert moe.stored_projection(dense, "mlp", "gate_proj") == "gate_proj"
    # The attention's own linear_gate is renamed too, but it is not the MLP's.
    assert moe.stored_projection(dense, "self_attn", "gate_proj", code) == "linear_gate"
    assert moe.stored_projection(dense, "mlp", "q_a_proj", code) == "q_a_proj"
    code = moe.code_names(ckpt, "model.layers.1.")
    assert moe._shared_expert(sparse, "mlp", "gate", code) == "shared_experts"
    assert moe._shared_expert(sparse, "mlp", "gate") is None
