"""detect/latentgate.py: a latent attention whose query up-projection reads the low-rank query and its normed form,
concatenated, and emits an output gate in each head's rows (A.X-K2's q_gate_proj); and expert groups null in config.json where the
code limits its top-k to groups only where they are not None (A.X-K2-Light's routing). Read from transformers' file and from lab modules
written otherwise (other names, the concatenation and the head's rows in the other order, a helper method, the
per-head view by unflatten, the product by .mul)."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape
from helpers import LAB_DECODER, LAB_PRELUDE, detect_until, read, transformers_code
from test_unit_detect_latent import HEADS, KV_RANK, NOPE, Q_RANK, ROPE, VALUE, latent_tensors

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import latentgate, layout, moe, routing
from scaffold.errors import UnsupportedArchitecture

# A lab's gated latent attention: the unnormed query first in the concatenation, each head's rows [gate | query],
# the query computed in a method of its own, the head view by unflatten, the gate applied with .mul after the
# attention output is flattened, F.sigmoid. Checkpoint names the latent reader knows (q_a_proj, q_a_norm, q_b_proj,
# kv_a_proj, kv_a_norm, kv_b_proj); the code's own names and structure elsewhere.
LAB_ATTENTION = '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.h = config.num_attention_heads
        self.rank = config.q_lora_rank
        self.nope, self.rope, self.vdim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.kv_rank = config.kv_lora_rank
        self.q_a_proj = nn.Linear(config.hidden_size, self.rank, bias=False)
        self.q_a_norm = LabRMSNorm(self.rank)
        self.q_b_proj = nn.Linear(2 * self.rank, self.h * (self.vdim + self.nope + self.rope), bias=False)
        self.kv_a_proj = nn.Linear(config.hidden_size, self.kv_rank + self.rope, bias=False)
        self.kv_a_norm = LabRMSNorm(self.kv_rank)
        self.kv_b_proj = nn.Linear(self.kv_rank, self.h * (self.nope + self.vdim), bias=False)
        self.o_proj = nn.Linear(self.h * self.vdim, config.hidden_size, bias=False)

    def _queries(self, x):
        low = self.q_a_proj(x)
        both = torch.concat((low, self.q_a_norm(low)), dim=-1)
        per_head = self.q_b_proj(both).unflatten(-1, (self.h, -1))
        return per_head.split([self.vdim, self.nope + self.rope], dim=-1)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        gate, q = self._queries(x)
        latent, k_rot = self.kv_a_proj(x).split([self.kv_rank, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_norm(latent)).view(b, t, self.h, -1)
        k_nope, v = kv.split([self.nope, self.vdim], dim=-1)
        q_nope, q_rot = q.split([self.nope, self.rope], dim=-1)
        q_rot, k_rot = apply_rope(q_rot, k_rot[:, :, None], cos, sin)
        q = torch.cat([q_nope, q_rot], dim=-1).transpose(1, 2)
        k = torch.cat([k_nope, k_rot.expand(-1, -1, self.h, -1)], dim=-1).transpose(1, 2)
        ctx = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), attn_mask=mask)
        ctx = ctx.transpose(1, 2).reshape(b, t, -1)
        ctx = ctx.mul(F.sigmoid(gate.reshape(b, t, -1)))
        return self.o_proj(ctx)


'''
LAB_CODE = "\n" + LAB_PRELUDE + LAB_ATTENTION + LAB_DECODER
NAMES = ("q_a_proj", "q_a_norm", "q_b_proj", "o_proj")


def _read(code: str, cls: str = "LabAttention", names=NAMES) -> latentgate.QueryGate:
    return latentgate.read({"modeling_lab.py": code}, cls, *names)


def test_transformers_axk2_attention_reads_the_normed_and_the_unnormed_query_and_gates_its_output():
    found = latentgate.read(transformers_code("axk2"), "AXK2Attention", "q_a_proj", "q_a_layernorm", "q_gate_proj",
                            "o_proj")
    assert (found.inputs, found.gate_first, found.act) == (("normed", "unnormed"), False, "sigmoid")
    code = transformers_code("axk2")
    file = next(iter(code))
    lines = code[file].splitlines()
    cat = next(i for i, text in enumerate(lines, 1) if "self.q_gate_proj(torch.cat(" in text)
    product = next(i for i, text in enumerate(lines, 1) if "attn_output * torch.sigmoid(gate_states" in text)
    assert f"{file}:{cat} (concatenation)" in found.evidence and f"{file}:{product} (sigmoid" in found.evidence


def test_a_lab_written_otherwise_is_read_in_its_own_orders():
    found = _read(LAB_CODE)
    assert (found.inputs, found.gate_first, found.act) == (("unnormed", "normed"), True, "sigmoid")
    line = next(i for i, text in enumerate(LAB_CODE.splitlines(), 1) if "ctx.mul(F.sigmoid" in text)
    assert f"modeling_lab.py:{line} (sigmoid gate" in found.evidence


def test_a_query_cut_from_the_whole_output_not_per_head_is_refused_naming_the_line():
    code = LAB_CODE.replace("self.q_b_proj(both).unflatten(-1, (self.h, -1))", "self.q_b_proj(both)")
    with pytest.raises(latentgate.Refused, match=r"modeling_lab.py:\d+: the output of self.q_b_proj is cut along its "
                                                 r"last axis without a view per head"):
        _read(code)


def test_an_up_projection_of_the_unnormed_query_twice_is_refused():
    code = LAB_CODE.replace("torch.concat((low, self.q_a_norm(low)), dim=-1)", "torch.concat((low, low), dim=-1)")
    with pytest.raises(latentgate.Refused, match=r"reads the concatenation of self.q_a_proj\(x\) and "
                                                 r"self.q_a_proj\(x\), not"):
        _read(code)


def test_a_concatenation_along_another_axis_is_not_read_as_the_two_queries():
    code = LAB_CODE.replace("torch.concat((low, self.q_a_norm(low)), dim=-1)",
                            "torch.concat((low, self.q_a_norm(low)), dim=0)")
    with pytest.raises(latentgate.Refused, match="not the low-rank query and its normed form concatenated"):
        _read(code)


def test_a_gate_that_never_multiplies_the_attention_output_is_refused():
    code = LAB_CODE.replace("ctx = ctx.mul(F.sigmoid(gate.reshape(b, t, -1)))", "ctx = ctx + gate.reshape(b, t, -1)")
    with pytest.raises(latentgate.Refused, match="no activation of one piece multiplies the attention output"):
        _read(code)


def _gated_lab_checkpoint(tmp_path, code=LAB_CODE):
    shape = Shape(model_type="lab_gated_latent", architecture="LabForCausalLM",
                  extra={"kv_lora_rank": KV_RANK, "q_lora_rank": Q_RANK, "qk_rope_head_dim": ROPE,
                         "qk_nope_head_dim": NOPE, "v_head_dim": VALUE})
    names = {"q_a_layernorm": "q_a_norm", "kv_a_proj_with_mqa": "kv_a_proj", "kv_a_layernorm": "kv_a_norm"}
    tensors = latent_tensors(shape, names=names)
    for i in range(shape.layers):
        p = f"model.layers.{i}.self_attn."
        tensors[p + "q_b_proj.weight"] = [HEADS * (VALUE + NOPE + ROPE), 2 * Q_RANK]
    read(tmp_path, shape, tensors=tensors)
    (tmp_path / "modeling_lab.py").write_text(code)
    return read_checkpoint(tmp_path)


def test_the_spec_records_the_inputs_the_order_of_each_head_and_the_gate(tmp_path):
    spec = detect_until(_gated_lab_checkpoint(tmp_path), layout)
    assert spec.qkv_layout == "latent"
    assert (spec.q_lora_rank, spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim) == (
        Q_RANK, NOPE, ROPE, VALUE)
    assert (spec.latent_query_input, spec.latent_gate_first) == ("unnormed+normed", True)
    assert (spec.attn_output_gate, spec.attn_gate_act) == ("in_query", "sigmoid")
    assert spec.names["q_b_proj"] == "q_b_proj" and spec.names["q_a_norm"] == "q_a_norm"
    assert "modeling_lab.py:" in spec.source("latent_query_input").detail


def test_a_gated_latent_checkpoint_whose_code_shows_another_form_is_refused_by_name(tmp_path):
    code = LAB_CODE.replace("self.q_b_proj(both).unflatten(-1, (self.h, -1))", "self.q_b_proj(both)")
    with pytest.raises(UnsupportedArchitecture, match=r"query up-projection reads 40 columns .*: modeling_lab.py:\d+: "
                                                      "the output of self.q_b_proj is cut along its last axis"):
        detect_until(_gated_lab_checkpoint(tmp_path, code), layout)


# ------------------------------------------------------------------ expert groups skipped where null
def test_axk2s_group_scoring_runs_only_where_its_groups_are_not_none():
    path = routing.routing(transformers_code("axk2"), "experts")
    assert path is not None and path.none_skipped_attrs == frozenset({"num_group"})
    # DeepSeek-V3 limits its top-k to groups whatever its config says.
    assert routing.routing(transformers_code("deepseek_v3"), "experts").none_skipped_attrs == frozenset()


def test_a_group_scoring_also_called_outside_the_none_test_is_not_skipped():
    code = transformers_code("axk2")
    file = next(iter(code))
    text = code[file].replace("        topk_indices = torch.topk(scores_for_choice, k=self.top_k",
                              "        scores_for_choice = self.apply_group_scoring(scores_for_choice)\n"
                              "        topk_indices = torch.topk(scores_for_choice, k=self.top_k", 1)
    assert text != code[file]
    assert routing.routing({file: text}, "experts").none_skipped_attrs == frozenset()


def test_null_groups_the_code_skips_are_no_groups_in_the_spec(tmp_path):
    from latent_gate_ckpt import build

    ckpt = read_checkpoint(build(tmp_path / "axk2lab", groups=None))
    spec = detect_until(ckpt, moe)
    assert (spec.moe_groups, spec.moe_topk_groups, spec.moe_sigmoid) == (0, 0, True)
    assert "only where self.num_group is not None, and config.json n_group is null" in spec.source("moe_groups").detail
