"""scaffold/mapping.py: where each checkpoint tensor lands in the port (parameter, shard, rows)."""

from __future__ import annotations

from ckpt_factory import Shape, tensors_for
from helpers import fused_tensors, moe_tensors, read

from scaffold.detect import detect
from scaffold.mapping import embedding_tensor, head_tensor, stacked_modules, weight_table


def table(ckpt, spec=None) -> tuple[dict[str, list], list[str]]:
    """checkpoint tensor -> [(param, shard, note)], and the tensors with no home."""
    rows, homeless = weight_table(spec or detect(ckpt), ckpt)
    out: dict[str, list] = {}
    for row in rows:
        out.setdefault(row.checkpoint, []).append((row.param, row.shard, row.note))
    return out, homeless


def test_separate_projections_are_shards_of_the_fused_parameters(tmp_path):
    ckpt = read(tmp_path, Shape(layers=2))
    rows, homeless = table(ckpt)
    layer = "model.layers.1."
    assert rows[layer + "self_attn.q_proj.weight"] == [(layer + "self_attn.qkv_proj.weight", "q", "")]
    assert rows[layer + "self_attn.v_proj.weight"] == [(layer + "self_attn.qkv_proj.weight", "v", "")]
    assert rows[layer + "mlp.gate_proj.weight"] == [(layer + "mlp.gate_up_proj.weight", 0, "")]
    assert rows[layer + "mlp.up_proj.weight"] == [(layer + "mlp.gate_up_proj.weight", 1, "")]
    assert rows[layer + "self_attn.o_proj.weight"] == [(layer + "self_attn.o_proj.weight", None, "")]
    assert set(rows) == set(ckpt.tensors) and homeless == []


def test_a_fused_tensor_is_cut_into_its_shards_by_rows(tmp_path):
    shape = Shape(layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=96, model_type="phi3")
    ckpt = read(tmp_path, shape, tensors=fused_tensors(shape))
    rows, homeless = table(ckpt)
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    assert rows[qkv] == [(qkv, "q", "rows 0:64"), (qkv, "k", "rows 64:96"), (qkv, "v", "rows 96:128")]
    gate_up = "model.layers.0.mlp.gate_up_proj.weight"
    assert rows[gate_up] == [(gate_up, 0, "rows 0:96"), (gate_up, 1, "rows 96:192")]
    assert homeless == []


def test_each_expert_is_a_shard_of_fusedmoes_stacked_weights(tmp_path):
    shape = Shape(layers=2, extra={"num_experts": 3, "num_experts_per_tok": 1, "moe_intermediate_size": 32})
    ckpt = read(tmp_path, shape, tensors=moe_tensors(shape, experts=3, inter=32))
    rows, _ = table(ckpt)
    mlp = "model.layers.1.mlp."
    assert rows[mlp + "experts.2.gate_proj.weight"] == [(mlp + "experts.routed_experts.w13_weight", (2, "w1"),
                                                         "expert 2, w1")]
    assert rows[mlp + "experts.2.up_proj.weight"][0][:2] == (mlp + "experts.routed_experts.w13_weight", (2, "w3"))
    assert rows[mlp + "experts.0.down_proj.weight"][0][:2] == (mlp + "experts.routed_experts.w2_weight", (0, "w2"))
    assert rows[mlp + "gate.weight"] == [(mlp + "gate.weight", None, "")]
    assert stacked_modules(detect(ckpt))[-1] == ("self_attn.v_proj", "self_attn.qkv_proj", "v")  # no dense gate/up


def test_a_router_kept_deeper_loads_into_the_ports_router(tmp_path):
    """HunYuan-MoE's mlp.gate.wg: the port keeps the router as mlp.wg, the one parameter the static check expects."""
    from scaffold.verify.static import expected_params

    shape = Shape(layers=2, extra={"num_experts": 3, "num_experts_per_tok": 1, "moe_intermediate_size": 32})
    tensors = {name.replace(".mlp.gate.weight", ".mlp.gate.wg.weight"): dims
               for name, dims in moe_tensors(shape, experts=3, inter=32).items()}
    ckpt = read(tmp_path, shape, tensors=tensors)
    spec = detect(ckpt)
    rows, homeless = table(ckpt, spec)
    mlp = "model.layers.1.mlp."
    assert rows[mlp + "gate.wg.weight"] == [(mlp + "wg.weight", None, "")] and homeless == []
    assert mlp + "wg.weight" in expected_params(spec) and mlp + "gate.wg.weight" not in expected_params(spec)


def test_tied_embeddings_have_no_head_tensor(tmp_path):
    ckpt = read(tmp_path, Shape(tie=True))
    spec = detect(ckpt)
    rows, _ = table(ckpt, spec)
    assert head_tensor(spec) == "lm_head.weight" and head_tensor(spec) not in rows
    assert rows[embedding_tensor(spec)] == [("model.embed_tokens.weight", None, "")]


def test_rotary_buffers_are_skipped_and_unknown_tensors_have_no_home(tmp_path):
    spec = detect(read(tmp_path / "clean", Shape(layers=2)))
    tensors = tensors_for(Shape(layers=2))
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = [8]
    tensors["model.layers.0.self_attn.extra_proj.weight"] = [4, 64]
    ckpt = read(tmp_path / "extra", Shape(layers=2), tensors=tensors)
    rows, homeless = table(ckpt, spec)
    assert rows["model.layers.0.self_attn.rotary_emb.inv_freq"][0][0] is None
    assert homeless == ["model.layers.0.self_attn.extra_proj.weight"]
