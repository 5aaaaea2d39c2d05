"""LongRoPE applied as the remote code applies it (tests/longrope_ckpt.py builds it: MiniCPM4's form, one set of
factors at every position chosen once by max_position_embeddings 512 > original 256, cos/sin scaled by
sqrt(1 + ln 2 / ln 256)): ported and verified in the real vLLM engine, whose max_model_len there (256) would
otherwise make vLLM's LongRoPE take the short factors, against transformers running the checkpoint's own code."""

from __future__ import annotations

import pytest
from helpers import scaffold, verified_at_parity
from longrope_ckpt import build


@pytest.mark.engine
@pytest.mark.extended
def test_longrope_factors_chosen_by_the_config_port_at_parity(tmp_path):
    ckpt = build(tmp_path / "longlab")
    out = tmp_path / "port"
    new = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the checkpoint:\n{new.stderr[-3000:]}"
    assert "both of vLLM's LongRoPE factor sets are rope_scaling.long_factor" in (
        out / "scaffold_spec.toml").read_text()
    verified_at_parity(out, "--trust-remote-code")
