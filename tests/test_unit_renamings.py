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
