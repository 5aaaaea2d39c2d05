"""Cross-layer attention (Hunyuan-Large's CLA form) ported and verified in the real vLLM engine against transformers
running the checkpoint's own remote code (tests/cla_ckpt.py builds it: a tiny Llama whose layer 1 builds no k_proj /
v_proj and attends over the keys and values layer 0 projected, handed through the model's loop before the rotary):
the port reads layer 0's KV cache in layer 1 (vLLM's kv_sharing_target_layer_name)."""

from __future__ import annotations

import pytest
import tomllib
from cla_ckpt import build
from helpers import own_weight_tests_pass, scaffold, verified_at_parity


@pytest.mark.engine
@pytest.mark.extended
def test_cross_layer_attention_ports_at_parity(tmp_path):
    ckpt = build(tmp_path / "clalab")
    out = tmp_path / "port"
    new = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the cross-layer attention checkpoint:\n{new.stderr[-3000:]}"
    spec = tomllib.loads((out / "scaffold_spec.toml").read_text(encoding="utf-8"))["spec"]
    assert (spec["kv_share_layers"], spec["kv_share_sources"]) == ([1], [0])
    assert spec["kv_share_config"]["kv_share_every"] == 2
    model = next(out.glob("*/model.py")).read_text(encoding="utf-8")
    assert "KV_SHARE_SOURCES = {1: 0}" in model
    verified_at_parity(out, "--trust-remote-code")
    own_weight_tests_pass(out)
