"""Real third-party remote-code models (../shared/realmodels) ported with no --spec and verified in vLLM.

The checkpoints are built at test time by the `realmodel` fixture from the original modeling code;
the port is derived from what that code computes (scaffold.detect.dataflow), not from a table of names.
"""

from __future__ import annotations

import json

import pytest
import tomllib
from helpers import scaffold, verified_at_parity


@pytest.mark.engine
def test_internlm2_ports_with_grouped_qkv_and_matches_transformers(realmodel, workdir):
    """InternLM2: one wqkv grouped per KV head, w1/w3/w2 with w1 the gate, attention_norm/ffn_norm."""
    ckpt = realmodel("internlm2")
    out = workdir / "port-internlm2"
    scaffold("new", ckpt, "-o", out, "--trust-remote-code", "--force")
    spec = tomllib.loads((out / "scaffold_spec.toml").read_text(encoding="utf-8"))["spec"]
    assert spec["qkv_layout"] == "grouped"
    assert spec["num_kv_heads"] < spec["num_heads"], "the tiny model must have several query heads per KV head"
    names = spec["names"]
    assert (names["self_attn"], names["qkv_proj"], names["o_proj"]) == ("attention", "wqkv", "wo")
    assert (names["mlp"], names["gate_proj"], names["up_proj"], names["down_proj"]) == ("feed_forward", "w1", "w3", "w2")
    assert (names["attn_norm"], names["mlp_norm"]) == ("attention_norm", "ffn_norm")

    verified_at_parity(out, "--trust-remote-code")


@pytest.mark.engine
def test_qwen_ports_with_its_gate_read_from_the_code(realmodel, workdir):
    """Qwen v1: QWenLMHeadModel (named by auto_map), transformer.h.N, fused c_attn with bias, and an MLP
    c_proj(w1(x) * silu(w2(x))) whose gate is w2; sizes under its own keys (kv_channels, intermediate_size // 2)."""
    ckpt = realmodel("qwen")
    out = workdir / "port-qwen"
    scaffold("new", ckpt, "-o", out, "--trust-remote-code", "--force")
    spec = tomllib.loads((out / "scaffold_spec.toml").read_text(encoding="utf-8"))["spec"]
    names = spec["names"]
    assert (names["model"], names["layers"], names["qkv_proj"]) == ("transformer", "h", "c_attn")
    assert (names["gate_proj"], names["up_proj"], names["down_proj"]) == ("w2", "w1", "c_proj")
    assert spec["qkv_layout"] == "fused" and spec["qkv_bias"] is True
    assert spec["intermediate_size"] == json.loads((ckpt / "config.json").read_text())["intermediate_size"] // 2

    verified_at_parity(out, "--trust-remote-code")
