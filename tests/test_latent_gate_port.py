"""A.X-K2's gated latent query ported and verified in the real vLLM engine against transformers running the
checkpoint's own remote code (tests/latent_gate_ckpt.py: transformers' modeling_axk2.py with plain norms, a form the
port refuses on A.X-K2 itself): q_b_proj reads cat([norm(c), c]) of the low-rank query c, each head's rows hold
[query | gate], and the attention output is multiplied by sigmoid(gate) before o_proj; the port computes the query
itself and calls vLLM's MLAAttention. The top-k indexer, the sigmoid router and the fused experts as A.X-K2's; with
one expert group, and with n_group null (A.X-K2-Light's: the code skips its group scoring, the port takes no groups).
"""

from __future__ import annotations

import pytest
import tomllib
from helpers import own_weight_tests_pass, scaffold, verified_at_parity
from latent_gate_ckpt import build


@pytest.mark.engine
@pytest.mark.extended
@pytest.mark.parametrize("groups", [1, None], ids=["one-group", "no-groups"])
def test_gated_latent_query_ports_at_parity(groups, tmp_path):
    ckpt = build(tmp_path / "axk2lab", groups=groups)
    out = tmp_path / "port"
    new = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the gated latent checkpoint:\n{new.stderr[-3000:]}"
    spec = tomllib.loads((out / "scaffold_spec.toml").read_text(encoding="utf-8"))["spec"]
    assert (spec["qkv_layout"], spec["latent_query_input"], spec.get("latent_gate_first", False),
            spec["attn_output_gate"]) == ("latent", "normed+unnormed", False, "in_query")
    assert spec.get("moe_groups", 0) == (groups or 0)
    model = next(out.glob("*/model.py")).read_text(encoding="utf-8")
    assert "torch.cat([self.q_a_layernorm(q_c), q_c], dim=-1)" in model
    assert "attn_out * torch.sigmoid(gate.reshape(attn_out.shape))" in model and "MLAAttention(" in model
    verified_at_parity(out, "--trust-remote-code")
    own_weight_tests_pass(out)
