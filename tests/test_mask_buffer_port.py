"""A base model that registers its causal mask as a non-persistent buffer named `bias` (CodeShell's form), beside
LayerNorms whose `bias` is a parameter, the final norm's included (tests/mask_buffer_ckpt.py builds it): ported and
verified in the real vLLM engine against transformers running the checkpoint's own remote code."""

from __future__ import annotations

import pytest
from helpers import scaffold, verified_at_parity
from mask_buffer_ckpt import build


@pytest.mark.engine
@pytest.mark.extended
def test_a_mask_buffer_named_bias_ports_at_parity(tmp_path):
    ckpt = build(tmp_path / "masklab")
    out = tmp_path / "port"
    new = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the checkpoint:\n{new.stderr[-3000:]}"
    verified_at_parity(out, "--trust-remote-code")
