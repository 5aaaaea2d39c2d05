"""An attention that registers its causal mask as a persistent boolean buffer, stored in every layer of the
checkpoint (MOSS's form, CodeGen's lineage; tests/stored_mask_ckpt.py builds it): ported and verified in the real
vLLM engine against transformers running the checkpoint's own remote code."""

from __future__ import annotations

import pytest
from helpers import scaffold, verified_at_parity
from stored_mask_ckpt import build


@pytest.mark.engine
@pytest.mark.extended
def test_a_stored_boolean_mask_buffer_ports_at_parity(tmp_path):
    ckpt = build(tmp_path / "storedmasklab")
    out = tmp_path / "port"
    new = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the checkpoint:\n{new.stderr[-3000:]}"
    verified_at_parity(out, "--trust-remote-code")
