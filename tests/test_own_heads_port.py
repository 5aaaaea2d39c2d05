"""Query heads, KV heads and MLP widths each layer reads for itself from lists in config.json (OpenELM's form),
ported and verified in the real vLLM engine against transformers running the checkpoint's own remote code
(tests/own_heads_ckpt.py builds it): one fused qkv projection of each layer's own heads, cut along the heads by the
code; a fused gate/up projection whose width a helper of the lab's code computes from a per-layer multiplier."""

from __future__ import annotations

import pytest
import tomllib
from helpers import own_weight_tests_pass, scaffold, verified_at_parity
from own_heads_ckpt import KV_HEADS, QUERY_HEADS, WIDTHS, build


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("own-heads")
    ckpt = build(tmp / "ckpt")
    out = tmp / "port"
    new = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the per-layer heads checkpoint:\n{new.stderr[-3000:]}"
    return out


@pytest.mark.slow
def test_each_layers_heads_and_width_come_from_the_code(port):
    spec = tomllib.loads((port / "scaffold_spec.toml").read_text(encoding="utf-8"))["spec"]
    assert (spec["qkv_layout"], spec["gate_up_layout"]) == ("fused", "fused")
    assert spec["layer_num_heads"] == QUERY_HEADS and spec["layer_num_kv_heads"] == KV_HEADS
    assert spec["layer_intermediate_sizes"] == WIDTHS
    model = next(port.glob("*/model.py")).read_text(encoding="utf-8")
    # The port reads the lists at run time, so a sibling checkpoint with other counts is served too.
    assert "self.total_num_heads = config.query_heads[layer_idx]" in model
    assert "self.total_num_kv_heads = config.num_kv_heads[layer_idx]" in model
    assert "config.ffn_multipliers[layer_idx] * config.hidden_size" in model
    # The lab's rounding helper is carried as a function of the port (ruff's max() for its clamp), called by name.
    assert "def round_up(value, multiple, floor=None):" in model and "rounded = max(rounded, floor)" in model
    assert spec["code_helpers"][0].startswith("def round_up(value, multiple, floor=None):")
    init = next(port.glob("*/__init__.py")).read_text(encoding="utf-8")
    assert "_register_layer_heads()" in init  # vLLM reads num_kv_heads as one count: the plugin gives it the largest


@pytest.mark.engine
@pytest.mark.extended
def test_own_heads_port_at_parity(port):
    checks = verified_at_parity(port, "--trust-remote-code")
    assert "layers of 2/4 query heads" in checks["per-shard shapes"]["detail"]
    own_weight_tests_pass(port)
