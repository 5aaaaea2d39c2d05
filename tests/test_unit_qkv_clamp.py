"""q, k and v clamped to [-c, c] as the projections give them (DBRX's and OLMo's clip_qkv), read from what the
attention's code computes: the clamp of a value derived from the q/k/v projections, on the branches config.json runs,
and the config value its bound reads (through a sub-config too). The port clamps its fused qkv output with that value;
a clamp the port would compute otherwise (after a norm, of some of q, k, v only, bounds of their own) is refused with
its line. A bound config.json sets to null clamps nothing."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, config_for, tensors_for
from helpers import LAB_DECODER, LAB_PRELUDE, detect_until, read, transformers_code

from scaffold.detect import dataflow, layout
from scaffold.errors import UnsupportedArchitecture


def _attention(model: str, cls: str, config: dict, sources: dict | None = None) -> dataflow.Attention:
    sources = sources or transformers_code(model)
    file, found = dataflow._class(sources, cls)
    return dataflow.analyze_attention(sources, file, found, config)


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(code.splitlines(), 1) if text in line)


def test_dbrx_clamps_its_fused_output_with_the_sub_config_value():
    code = transformers_code("dbrx")["modeling_dbrx.py"]
    flow = _attention("dbrx", "DbrxAttention", {"attn_config": {"clip_qkv": 8.0}})
    assert (flow.layout, flow.q) == ("fused", "Wqkv")
    line = _line(code, "qkv_states = qkv_states.clamp(")
    assert flow.qkv_clamp == f"modeling_dbrx.py:{line}: qkv_states.clamp(min=min_val, max=self.clip_qkv)"
    assert (flow.qkv_clamp_roles, flow.qkv_clamp_bound, flow.qkv_clamp_value) == ("qkv", "config.attn_config.clip_qkv",
                                                                                   8.0)
    # min_val = -self.clip_qkv if self.clip_qkv is not None else None: the same value, negated.
    assert flow.qkv_clamp_problem == ""


def test_a_null_bound_clamps_nothing():
    assert _attention("dbrx", "DbrxAttention", {"attn_config": {"clip_qkv": None}}).qkv_clamp == ""
    # OLMo's clamps sit under `if self.config.clip_qkv is not None:`, which config.json decides.
    assert _attention("olmo", "OlmoAttention", {"clip_qkv": None}).qkv_clamp == ""


def test_olmo_clamps_each_projection_under_its_config_test():
    flow = _attention("olmo", "OlmoAttention", {"clip_qkv": 0.5})
    assert flow.qkv_clamp.startswith("modeling_olmo.py:") and "query_states.clamp_(" in flow.qkv_clamp
    assert (flow.qkv_clamp_roles, flow.qkv_clamp_bound, flow.qkv_clamp_value, flow.qkv_clamp_problem) == (
        "qkv", "config.clip_qkv", 0.5, "")


def test_olmoe_clamps_after_its_qk_norms_which_the_port_does_not():
    flow = _attention("olmoe", "OlmoeAttention", {"clip_qkv": 0.5})
    code = transformers_code("olmoe")["modeling_olmoe.py"]
    assert flow.qkv_clamp_problem == (f"a norm or rotary call comes first (line "
                                      f"{_line(code, 'query_states = self.q_norm(')})")


# A lab's attention written unlike DBRX's or OLMo's: its own names, a sub-config held by the attention (`self.acfg`),
# torch.clamp as a function with positional bounds, each of q, k and v clamped where it is projected.
LAB_CODE = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.acfg = config.attention
        self.limit = self.acfg.qkv_limit
        self.n_heads = config.num_attention_heads
        self.d_head = config.head_dim
        self.wq = nn.Linear(config.hidden_size, self.n_heads * self.d_head, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.wo = nn.Linear(self.n_heads * self.d_head, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = torch.clamp(self.wq(x), -self.limit, self.limit).view(b, t, -1, self.d_head).transpose(1, 2)
        k = torch.clamp(self.wk(x), -self.limit, self.limit).view(b, t, -1, self.d_head).transpose(1, 2)
        v = torch.clamp(self.wv(x), -self.limit, self.limit).view(b, t, -1, self.d_head).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(ctx.transpose(1, 2).reshape(b, t, -1))


''' + LAB_DECODER
ONLY_KEYS = LAB_CODE.replace("q = torch.clamp(self.wq(x), -self.limit, self.limit)", "q = self.wq(x)").replace(
    "v = torch.clamp(self.wv(x), -self.limit, self.limit)", "v = self.wv(x)")
# The keys clamped after the rotary embedding.
AFTER_ROPE = ONLY_KEYS.replace("k = torch.clamp(self.wk(x), -self.limit, self.limit)", "k = self.wk(x)").replace(
    "        q, k = apply_rope(q, k, cos, sin)\n",
    "        q, k = apply_rope(q, k, cos, sin)\n        k = k.clamp(max=self.limit)\n")


def test_a_lab_clamp_through_a_sub_config_is_read():
    flow = _attention("", "LabAttention", {"attention": {"qkv_limit": 0.25}}, {"modeling_lab.py": LAB_CODE})
    assert flow.qkv_clamp.startswith(f"modeling_lab.py:{_line(LAB_CODE, 'q = torch.clamp(')}: torch.clamp(self.wq(x)")
    assert (flow.qkv_clamp_roles, flow.qkv_clamp_bound, flow.qkv_clamp_value, flow.qkv_clamp_problem) == (
        "qkv", "config.attention.qkv_limit", 0.25, "")


def test_a_lab_clamping_the_keys_alone_or_after_the_rotary_embedding_is_named():
    keys = _attention("", "LabAttention", {"attention": {"qkv_limit": 0.25}}, {"modeling_lab.py": ONLY_KEYS})
    assert keys.qkv_clamp_roles == "k" and keys.qkv_clamp_problem == "only k clamped"
    late = _attention("", "LabAttention", {"attention": {"qkv_limit": 0.25}}, {"modeling_lab.py": AFTER_ROPE})
    assert late.qkv_clamp_roles == "k"
    assert "a value already reshaped or activated is clamped (k.clamp(max=self.limit))" in late.qkv_clamp_problem
    assert "bounds not -c and c of one config value" in late.qkv_clamp_problem


# Qwen v1's form: q, k and v quantized for the KV cache by a helper that clamps to bounds computed from the data,
# not clamped to a config value.
QUANTIZED = LAB_CODE.replace(
    "        q = torch.clamp(self.wq(x), -self.limit, self.limit)",
    "        q = quantize(self.wq(x))").replace(
    "        k = torch.clamp(self.wk(x), -self.limit, self.limit)",
    "        k = quantize(self.wk(x))").replace(
    "        v = torch.clamp(self.wv(x), -self.limit, self.limit)",
    "        v = quantize(self.wv(x))").replace(
    "class LabAttention(nn.Module):",
    "def quantize(x):\n    lo, hi = x.min(), x.max()\n    return torch.clamp(x, lo, hi)\n\n\nclass LabAttention(nn.Module):")


def test_a_clamp_to_bounds_from_the_data_is_no_qkv_clip():
    assert QUANTIZED.count("quantize(self.w") == 3
    flow = _attention("", "LabAttention", {"attention": {"qkv_limit": 0.25}}, {"modeling_lab.py": QUANTIZED})
    assert not flow.qkv_clamp and not flow.qkv_clamp_problem


def _lab_checkpoint(tmp_path, code: str, limit):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_clamp", layers=2)
    names = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo"}
    tensors = {}
    for name, dims in tensors_for(shape).items():
        for old, new in names.items():
            name = name.replace(f"self_attn.{old}.", f"self_attn.{new}.")
        tensors[name] = dims
    read(tmp_path, shape, tensors=tensors, config={**config_for(shape), "attention": {"qkv_limit": limit}})
    (tmp_path / "modeling_lab.py").write_text(code)
    from scaffold.checkpoint import read_checkpoint

    return read_checkpoint(tmp_path)


def test_the_spec_reads_the_bound_at_run_time(tmp_path):
    spec = detect_until(_lab_checkpoint(tmp_path, LAB_CODE, 0.25), layout)
    assert spec.qkv_clip == 0.25
    source = spec.provenance["qkv_clip"]
    assert source.kind == "code" and source.expr == "config.attention.qkv_limit"
    assert "q, k and v clamped to [-c, c], c = config.attention.qkv_limit" in source.detail


def test_a_null_bound_leaves_the_port_unclamped(tmp_path):
    assert detect_until(_lab_checkpoint(tmp_path, LAB_CODE, None), layout).qkv_clip is None


def test_a_clamp_the_port_would_compute_otherwise_is_refused_with_its_line(tmp_path):
    with pytest.raises(UnsupportedArchitecture, match=r"q, k and v clamped, not in the form the port computes "
                                                      r"\(modeling_lab.py:\d+: torch.clamp\(self.wk\(x\).*only k "
                                                      r"clamped\)"):
        detect_until(_lab_checkpoint(tmp_path, ONLY_KEYS, 0.25), layout)
