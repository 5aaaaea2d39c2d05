"""The attention output gate folded into q_proj (Qwen3-Next's form) ported and verified in the real vLLM engine
against transformers running the checkpoint's own remote code (tests/gated_query_ckpt.py builds it): q_proj's rows
hold [query | gate] per head, the port builds them as twice the query heads of QKVParallelLinear and chunks each
head after the projection; Qwen3's q_norm applies to the query half. With full and with partial rotary."""

from __future__ import annotations

import pytest
import tomllib
from gated_query_ckpt import build
from helpers import own_weight_tests_pass, scaffold, verified_at_parity


@pytest.mark.engine
@pytest.mark.extended
@pytest.mark.parametrize("partial_rotary_factor", [None, 0.5], ids=["full-rotary", "partial-rotary"])
def test_query_gate_ports_at_parity(partial_rotary_factor, tmp_path):
    ckpt = build(tmp_path / "gatedq", partial_rotary_factor=partial_rotary_factor)
    out = tmp_path / "port"
    new = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the query-gated checkpoint:\n{new.stderr[-3000:]}"
    spec = tomllib.loads((out / "scaffold_spec.toml").read_text(encoding="utf-8"))["spec"]
    # attn_gate_act is written only where it is not its default, sigmoid
    assert (spec["attn_output_gate"], spec.get("attn_gate_act", "sigmoid"), spec["qk_norm"]) == \
        ("in_query", "sigmoid", "per_head")
    assert spec.get("partial_rotary_factor", 1.0) == (partial_rotary_factor or 1.0)
    model = next(out.glob("*/model.py")).read_text(encoding="utf-8")
    assert "self.total_num_heads * 2," in model and "attn_output * torch.sigmoid(gate)" in model
    checks = verified_at_parity(out, "--trust-remote-code")
    assert "TP=2: ok" in checks["tensor-parallel sharding"]["detail"]
    # The port's own weight-mapping tests: q_proj's [query | gate] rows land in the first 2 x 128 rows of qkv_proj.
    own_weight_tests_pass(out)
