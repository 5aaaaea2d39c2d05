"""OLMo v1's layout (ai2 hf_olmo: every projection the decoder block's own module, att_proj and ff_proj fused, ff_proj's
halves (x, gate), weightless layer norms, the head tied to the embedding) described by a spec file, as its users must
(its modeling code is in the olmo package, outside the checkpoint), ported and verified in the real vLLM engine against
transformers running remote code of our own in that form (tests/olmo_v1_layout.py)."""

from __future__ import annotations

import json

import pytest
from helpers import PARITY_TOLERANCE, own_weight_tests_pass, scaffold
from olmo_v1_layout import build_with_code


@pytest.mark.engine
@pytest.mark.extended
def test_olmo_v1_layout_described_by_a_spec_matches_transformers(tmp_path):
    ckpt, spec_file = build_with_code(tmp_path / "olmolab")
    out = tmp_path / "port"
    new = scaffold("new", ckpt, "-o", out, "--spec", spec_file, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the spec-described OLMo v1 layout:\n{new.stderr[-3000:]}"
    model = next(out.glob("*/model.py")).read_text(encoding="utf-8")
    assert '("self_attn.att_proj", ("q", "k", "v"))' in model and '("mlp.ff_proj", (1, 0))' in model
    report = json.loads(scaffold("verify", out, "--json", "--trust-remote-code").stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["passed"], json.dumps(report, indent=2)
    assert checks["parity: log-probabilities"]["max_delta"] <= PARITY_TOLERANCE
    assert checks["parity: greedy continuation"]["status"] == "pass"
    print(f"OLMo v1 layout vs transformers: max |dlogp| {checks['parity: log-probabilities']['max_delta']:.2e}")
    own_weight_tests_pass(out)
