"""Keys and values fused in one projection beside the queries' own (qkv_layout "kv_pairs", TeleChat's query and
key_value) ported and verified in the real vLLM engine against transformers running the checkpoint's own remote
code (tests/kv_pairs_ckpt.py builds it, with names of its own and grouped KV heads): the port reads the per-head
cut from the code, loads q from the queries' tensor and de-interleaves each KV head's key and value rows into
QKVParallelLinear's k and v shards. Served live over two ranks, each rank takes its own KV head's key and value."""

from __future__ import annotations

import json

import pytest
import tomllib
from helpers import PARITY_TOLERANCE, own_weight_tests_pass, scaffold
from kv_pairs_ckpt import build


@pytest.mark.engine
@pytest.mark.extended
def test_kv_pairs_port_matches_transformers_over_two_ranks(tmp_path):
    ckpt = build(tmp_path / "kvpairlab")
    out = tmp_path / "port"
    new = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the key-value-pairs checkpoint:\n{new.stderr[-3000:]}"
    spec = tomllib.loads((out / "scaffold_spec.toml").read_text(encoding="utf-8"))["spec"]
    assert (spec["qkv_layout"], spec["num_kv_heads"], spec["num_heads"]) == ("kv_pairs", 2, 4)
    assert (spec["names"]["q_proj"], spec["names"]["kv_proj"]) == ("q_lin", "kv_lin")
    model = next(out.glob("*/model.py")).read_text(encoding="utf-8")
    assert '("self_attn.qkv_proj", "self_attn.kv_lin", ("k", "v"))' in model
    report = json.loads(scaffold("verify", out, "--tp", "2", "--json", "--trust-remote-code").stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["passed"], json.dumps(report, indent=2)
    assert "tensor_parallel_size=2" in checks["port loaded by vLLM"]["detail"]
    assert checks["parity: log-probabilities"]["max_delta"] <= PARITY_TOLERANCE
    assert checks["parity: greedy continuation"]["status"] == "pass"
    print(f"kv_pairs lab TP=2 vs transformers: max |dlogp| {checks['parity: log-probabilities']['max_delta']:.2e}")
    # The port's own weight-mapping tests: each KV head's key rows land in the k shard, its value rows in v.
    own_weight_tests_pass(out)
