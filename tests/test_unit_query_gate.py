"""The attention output gate folded into the query projection (Qwen3-Next's and Qwen3.5's form), read from what
the attention's code computes: q's output viewed per head as 2 x head_dim and cut into two halves, the first the
queries, an activation of the second scaling the attention output before the output projection. Any other cut of
such a view is refused with the line that does it, never ported as plain queries."""

from __future__ import annotations

import ast
import re

import pytest
from ckpt_factory import Shape, tensors_for
from helpers import LAB_DECODER, LAB_PRELUDE, detect_until, read, transformers_code

from scaffold.detect import attention, dataflow, layout
from scaffold.detect.sourcecode import _classes
from scaffold.errors import CheckpointError, UnsupportedArchitecture

# A lab's attention written unlike Qwen3-Next's: its own module names (wq, wk, wv, wo, qn, kn), the pair view
# through reshape with the factor first, torch.split(..., head_dim) instead of chunk(2), SiLU instead of sigmoid,
# and the gated product written inside the output projection's call.
LAB_CODE = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.d_head = config.head_dim
        self.wq = nn.Linear(config.hidden_size, 2 * self.n_heads * self.d_head, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.wo = nn.Linear(self.n_heads * self.d_head, config.hidden_size, bias=False)
        self.qn = LabRMSNorm(self.d_head)
        self.kn = LabRMSNorm(self.d_head)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        both = self.wq(x).reshape(b, t, self.n_heads, 2 * self.d_head)
        q, g = torch.split(both, self.d_head, dim=-1)
        q = self.qn(q).transpose(1, 2)
        k = self.kn(self.wk(x).view(b, t, -1, self.d_head)).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.d_head).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        ctx = ctx.transpose(1, 2).reshape(b, t, -1)
        return self.wo(ctx * F.silu(g.reshape(b, t, -1)))


''' + LAB_DECODER
SPLIT = "        q, g = torch.split(both, self.d_head, dim=-1)\n"


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(code.splitlines(), 1) if text in line)


def _lab_checkpoint(tmp_path, code=LAB_CODE, q_rows_factor=2):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_gatedq", layers=2)
    names = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo"}
    tensors = {}
    for name, dims in tensors_for(shape).items():
        for old, new in names.items():
            name = name.replace(f"self_attn.{old}.", f"self_attn.{new}.")
        tensors[name] = dims
    for i in range(shape.layers):
        tensors[f"model.layers.{i}.self_attn.wq.weight"] = [q_rows_factor * shape.heads * shape.head_dim, shape.hidden]
        tensors[f"model.layers.{i}.self_attn.qn.weight"] = [shape.head_dim]
        tensors[f"model.layers.{i}.self_attn.kn.weight"] = [shape.head_dim]
    read(tmp_path, shape, tensors=tensors)
    (tmp_path / "modeling_lab.py").write_text(code)
    from scaffold.checkpoint import read_checkpoint

    return read_checkpoint(tmp_path)


def test_a_query_gate_under_other_names_cut_by_split_is_read_from_the_dataflow():
    """split(head_dim, dim=-1) of a (…, heads, 2 * head_dim) view cuts the same two halves as chunk(2, dim=-1):
    the same form."""
    flow = dataflow.analyze_layer({"modeling_lab.py": LAB_CODE}, {}).attention_flow
    assert (flow.layout, flow.q, flow.k, flow.v, flow.o) == ("separate", "wq", "wk", "wv", "wo")
    assert (flow.output_gate, flow.output_gate_act) == ("wq", "silu")
    assert flow.query_gate.startswith(f"modeling_lab.py:{_line(LAB_CODE, 'q, g = torch.split')}: wq's output viewed "
                                      "per head as [2 x self.d_head]")
    assert f"activated gate on the attention output (line {_line(LAB_CODE, 'return self.wo(')})" in flow.query_gate
    assert not flow.query_gate_refusal
    # The norms read the query half alone (and the keys).
    assert (flow.q_norm, flow.k_norm, flow.qk_norm_per_head) == ("qn", "kn", True)


def test_the_spec_says_in_query_with_its_activation_and_the_rows_check_counts_the_gate(tmp_path):
    ckpt = _lab_checkpoint(tmp_path)
    spec = detect_until(ckpt, attention)  # attention: the per-layer shape check accepts wq's 2 x 64 rows
    assert (spec.attn_output_gate, spec.attn_gate_act, spec.attn_gate_bias) == ("in_query", "silu", False)
    assert "attn_gate" not in spec.names and spec.names["q_proj"] == "wq"
    assert (spec.qk_norm, spec.names["q_norm"]) == ("per_head", "qn")
    assert spec.query_rows == 128
    detail = spec.source("attn_output_gate").detail
    assert detail.startswith(f"modeling_lab.py:{_line(LAB_CODE, 'q, g = torch.split')}:")
    assert "model.layers.0.self_attn.wq.weight has 128 rows: 4 heads x [query | gate] x 16" in detail


def test_qwen3_next_and_qwen3_5_attention_read_as_query_gates():
    for model, cls in (("qwen3_next", "Qwen3NextAttention"), ("qwen3_5", "Qwen3_5Attention")):
        sources = transformers_code(model)
        file, node = _classes(sources)[cls]
        flow = dataflow.analyze_attention(sources, file, node, {})
        assert (flow.q, flow.output_gate, flow.output_gate_act, flow.q_norm) == ("q_proj", "q_proj", "sigmoid",
                                                                                  "q_norm"), model
        assert "the first half the queries, the second an activated gate" in flow.query_gate, model


# Cuts of the pair view that are not [query | gate] halves of head_dim, the queries first: each is refused with
# the line that cuts (or views) it.
REFUSED = {
    "gate first": (SPLIT, "        g, q = torch.split(both, self.d_head, dim=-1)\n",
                   "g, q = torch.split", r"the queries its half 1"),
    "another axis": (SPLIT, "        q, g = torch.chunk(both, 2, dim=2)\n", "both = self.wq",
                     r"then cut as line \d+: chunk\(…, 2, dim=2\)"),
    "uneven halves": (SPLIT, "        q, g = both.split([self.d_head + 8, self.d_head - 8], dim=-1)\n",
                      "both = self.wq", r"split\(…, \[self.d_head \+ 8, self.d_head - 8\], dim=-1\)"),
    "slices": (SPLIT, "        q, g = both[..., : self.d_head], both[..., self.d_head :]\n", "both = self.wq",
               r"then cut as line \d+: \[:self.d_head\]"),
    "stacked pair": ("both = self.wq(x).reshape(b, t, self.n_heads, 2 * self.d_head)",
                     "both = self.wq(x).reshape(b, t, self.n_heads, 2, self.d_head)", "both = self.wq",
                     r"viewed per head as a pair \(self.wq\(x\).reshape\(b, t, self.n_heads, 2, self.d_head\)\)"),
    "no activation": ("ctx * F.silu(g.reshape(b, t, -1))", "ctx * g.reshape(b, t, -1)", "q, g = torch.split",
                      r"no activation of the second half multiplies the attention output"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_other_cuts_of_a_per_head_pair_are_refused_naming_the_line(tmp_path, case):
    old, new, at, reason = REFUSED[case]
    code = LAB_CODE.replace(old, new)
    assert code != LAB_CODE
    ast.parse(code)
    ckpt = _lab_checkpoint(tmp_path, code=code)
    with pytest.raises(UnsupportedArchitecture, match="output gate folded into the query projection") as info:
        detect_until(ckpt, layout)
    assert f"modeling_lab.py:{_line(code, at)}:" in str(info.value)
    assert re.search(reason, str(info.value)), str(info.value)


def test_a_doubled_query_projection_the_code_does_not_explain_is_named_for_the_gate(tmp_path):
    """Without code that cuts it, a q_proj twice as tall as the heads need is refused by its size, and the reason
    says what such rows usually are instead of only the arithmetic."""
    shape = Shape(layers=2)
    tensors = tensors_for(shape)
    for i in range(shape.layers):
        tensors[f"model.layers.{i}.self_attn.q_proj.weight"] = [2 * shape.heads * shape.head_dim, shape.hidden]
    ckpt = read(tmp_path, shape, tensors=tensors)
    with pytest.raises(CheckpointError, match=r"need \[64, 64\]: twice the query rows, as where the query "
                                              r"projection also emits an output gate per head"):
        detect_until(ckpt, attention)


def test_an_mlp_cut_per_block_in_pairs_is_not_read_as_halves():
    """The halves are an attention reading: an MLP whose projection's output is viewed in blocks of 2 x width and
    chunked is not read as a fused gate/up (gate rows, then up rows: a mis-port of rows interleaved per block)."""
    code = LAB_CODE.replace("        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))",
                            "        gate, up = self.gate_proj(x).view(*x.shape[:-1], -1, 2 * self.block).chunk(2, dim=-1)\n"
                            "        return self.down_proj(F.silu(gate) * up)")
    file, cls = _classes({"modeling_lab.py": code})["LabMLP"]
    try:
        mlp = dataflow.analyze_mlp({"modeling_lab.py": code}, file, cls, {})
    except dataflow.Undecided:
        return
    assert not mlp.fused, mlp


def test_a_rotary_reshape_of_queries_viewed_per_head_is_no_pair():
    """Only the projection's own output viewed as a pair counts: a plain attention whose rotary helper reshapes each
    head into (2, head_dim // 2) keeps porting as plain q, k, v."""
    code = LAB_CODE.replace("both = self.wq(x).reshape(b, t, self.n_heads, 2 * self.d_head)",
                            "q = self.wq(x).view(b, t, -1, self.d_head)").replace(SPLIT, "").replace(
        "return self.wo(ctx * F.silu(g.reshape(b, t, -1)))", "return self.wo(ctx)").replace(
        "    x1, x2 = x.chunk(2, dim=-1)",
        "    x1, x2 = x.reshape(*x.shape[:-1], 2, x.shape[-1] // 2).unbind(-2)")
    flow = dataflow.analyze_layer({"modeling_lab.py": code}, {}).attention_flow
    assert (flow.layout, flow.q, flow.output_gate, flow.query_gate, flow.query_gate_refusal) == \
        ("separate", "wq", None, "", "")
