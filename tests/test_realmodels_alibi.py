"""Baichuan 2 (../shared/realmodels' baichuan2): fused W_pack, ALiBi, a normalized head, ported with no --spec
and verified at parity with its own remote code in the real vLLM engine (CPU build, float32)."""

from __future__ import annotations

import json

import pytest
import tomllib
from helpers import scaffold

TOLERANCE = 1e-4


@pytest.mark.engine
def test_baichuan2_ports_at_parity_without_a_spec(realmodel, workdir):
    ckpt = realmodel("baichuan2")
    out = workdir / "port-baichuan2"
    scaffold("new", ckpt, "-o", out, "--trust-remote-code", "--force")
    spec = tomllib.loads((out / "scaffold_spec.toml").read_text())["spec"]
    assert spec["position_scheme"] == "alibi" and spec["normalized_head"] is True
    assert spec["names"]["qkv_proj"] == "W_pack" and spec["qkv_layout"] == "fused"
    model = next(out.glob("*/model.py")).read_text()
    assert "alibi_slopes=slopes" in model and "self.rotary_emb" not in model

    report = json.loads(scaffold("verify", out, "--json").stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["passed"], json.dumps(report, indent=2)
    assert checks["port loaded by vLLM"]["status"] == "pass"
    assert checks["parity: log-probabilities"]["status"] == "pass"
    assert checks["parity: log-probabilities"]["max_delta"] <= TOLERANCE
    greedy = checks["parity: greedy continuation"]
    assert greedy["status"] == "pass", greedy["detail"]
    matched, total = greedy["detail"].split(" ", 1)[0].split("/")
    assert matched == total and int(total) > 0, greedy["detail"]
