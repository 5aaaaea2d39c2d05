"""The float32 noise floor: where parity fails, verify runs transformers again in float64 and says whether the
port's difference is float32 rounding the checkpoint amplifies (transformers in float32 is as far from float64) or
the port's own.

A deep stack of large random weights is such a checkpoint: a 12-layer Llama with weights N(0, 0.4) moves by
about 1e-3 in its top-20 log-probabilities between float32 and float64 in transformers itself, ten times the
parity tolerance. A port wrong by a small amount on that same checkpoint must still be blamed.
"""

from __future__ import annotations

import json

import pytest
from helpers import scaffold

from scaffold.tiny import build_tiny
from scaffold.verify import parity


@pytest.fixture(scope="module")
def ill_conditioned(tmp_path_factory):
    root = tmp_path_factory.mktemp("noise-floor")
    ckpt = build_tiny("llama", root / "deep", architecture="DeepNoiseForCausalLM", std=0.4,
                      overrides={"num_hidden_layers": 12})
    return root, ckpt


def _verify(port) -> dict:
    proc = scaffold("verify", port, "--json", check=False)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return {c["name"]: c for c in json.loads(proc.stdout)["checks"]}


@pytest.mark.slow
def test_a_reference_measured_against_itself_and_in_float64(ill_conditioned, tmp_path):
    """as_candidate shapes a transformers run as an engine's result: against itself it is exact; float32 against
    float64 on the deep checkpoint is past the tolerance, on a shallow one of small weights within it."""
    _, deep = ill_conditioned
    shallow = build_tiny("llama", tmp_path / "shallow", architecture="ShallowForCausalLM")
    floors = {}
    for name, ckpt in (("deep", deep), ("shallow", shallow)):
        # A 24-token prompt too: against a float64 reference that stays float64 (scaffold.verify.wide), the two
        # short ones move the deep checkpoint by 9.5e-05 only (1.4e-04 while its softmax and RMSNorm ran in float32).
        prompts = [[3, 14, 15, 92, 65], [35, 89, 79, 32, 38, 46, 26, 43],
                   [225, 59, 3, 46, 17, 42, 50, 181, 121, 8, 15, 8, 177, 247, 237, 76, 46, 93, 58, 7, 249, 127, 33, 238]]
        hf32 = parity.hf_reference(ckpt, prompts, False, tmp_path)
        hf64 = parity.hf_reference(ckpt, prompts, False, tmp_path, dtype="float64")
        itself = parity.compare(hf32, parity.as_candidate(hf32, prompts), prompts)
        assert itself.max_delta == 0.0 and itself.greedy_ok
        floors[name] = parity.compare(hf64, parity.as_candidate(hf32, prompts), prompts).max_delta
    assert 0.0 < floors["shallow"] < parity.TOLERANCE < floors["deep"], floors


@pytest.mark.engine
def test_float32_rounding_of_the_checkpoint_is_not_blamed_on_the_port(ill_conditioned):
    root, ckpt = ill_conditioned
    port = root / "port"
    scaffold("new", ckpt, "-o", port, "--force")
    checks = _verify(port)
    assert checks["parity: log-probabilities"]["status"] == "FAIL"
    floor = checks["float32 noise floor"]
    assert floor["within"] and floor["reference_delta"] > parity.TOLERANCE, floor
    assert "float32 rounding explains the difference, not the port" in floor["detail"]
    assert "first diverging module" not in checks["divergence"]["detail"], checks["divergence"]


@pytest.mark.engine
@pytest.mark.extended
def test_a_wrong_port_on_that_checkpoint_is_still_blamed(ill_conditioned):
    """The floor cannot excuse a real error: the same checkpoint, the port's norm epsilon wrong."""
    root, ckpt = ill_conditioned
    spec = root / "wrong-eps.toml"
    spec.write_text("[spec]\nnorm_eps = 0.05\n")
    port = root / "port-wrong-eps"
    scaffold("new", ckpt, "-o", port, "--force", "--spec", spec)
    checks = _verify(port)
    floor = checks["float32 noise floor"]
    assert not floor["within"] and "the port's own" in floor["detail"], floor
    assert "input_layernorm" in checks["divergence"]["detail"] and "norm_eps" in checks["divergence"]["detail"]
