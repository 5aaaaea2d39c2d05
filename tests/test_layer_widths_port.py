"""MLP widths of each layer's own (Gemma-3n's intermediate_size list) ported and verified in the real vLLM engine
against transformers running the checkpoint's own remote code (tests/layer_widths_ckpt.py builds it: a tiny Qwen3
whose MLP reads config.intermediate_size[layer_idx], layers 192, 320 and 256 wide): the port's decoder layer builds
each MLP from the code's expression, evaluated per layer."""

from __future__ import annotations

import pytest
import tomllib
from helpers import own_weight_tests_pass, scaffold, verified_at_parity
from layer_widths_ckpt import WIDTHS, build


@pytest.mark.engine
@pytest.mark.extended
def test_per_layer_mlp_widths_port_at_parity(tmp_path):
    ckpt = build(tmp_path / "widths")
    out = tmp_path / "port"
    new = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the per-layer widths checkpoint:\n{new.stderr[-3000:]}"
    spec = tomllib.loads((out / "scaffold_spec.toml").read_text(encoding="utf-8"))["spec"]
    assert spec["layer_intermediate_sizes"] == WIDTHS
    model = next(out.glob("*/model.py")).read_text(encoding="utf-8")
    assert "config.intermediate_size[layer_idx]," in model
    checks = verified_at_parity(out, "--trust-remote-code")
    assert "TP=2: ok" in checks["tensor-parallel sharding"]["detail"]
    own_weight_tests_pass(out)
