"""verify fails on any NaN or +inf, on either side, and says which side and where it started.

Old remote code run under transformers 5 can leave buffers uninitialised and yield NaN: a
verify that compared NaN with `>` would call that a pass.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from conftest import EXAMPLES, scaffold
from robustness_doc import defence

from scaffold.verify.parity import compare
from scaffold.verify.probes import Probe, first_nonfinite, localize


def reference(rows: list[list[float]]) -> dict:
    return {"model_class": "hf", "results": [{"tokens": [0, 1, 2], "logprobs": torch.tensor(rows)}]}


def engine(rows: list[dict]) -> dict:
    return {"model_class": "vllm", "results": [{"tokens": [0, 1, 2], "prompt_logprobs": rows,
                                                "sample_logprobs": []}]}


@pytest.mark.parametrize("hf_row, vllm_row, side", [
    ([-0.1, math.nan, -3.0], {"0": -0.1}, "transformers"),  # NaN on a token vLLM did not rank
    ([-0.1, -2.0, -3.0], {"0": math.nan, "1": -2.0}, "the port in vLLM"),
    ([-0.1, -2.0, -3.0], {"0": math.inf}, "the port in vLLM"),
    ([math.nan, math.nan, math.nan], {"0": math.nan}, "transformers and the port in vLLM"),
], ids=["hf-nan-unranked", "vllm-nan", "vllm-inf", "both-nan"])
def test_a_nonfinite_log_probability_fails_parity_naming_the_side(hf_row, vllm_row, side, request):
    result = compare(reference([hf_row, hf_row]), engine([vllm_row, vllm_row]), [[0, 1, 2]], new_tokens=0)
    ok, detail = result.logprob_check()
    assert not ok and result.max_delta == math.inf
    assert f"{side} gave NaN or +inf at position 0" in detail
    defence(f"nonfinite-{request.node.callspec.id}", f"log-probabilities: transformers {hf_row}, vLLM {vllm_row}",
            "scaffold verify PORT", 1, f"parity: log-probabilities FAIL, {detail}")


def test_equal_minus_infinities_agree_and_finite_values_are_compared():
    """-inf is the log-probability of a token that cannot occur: on both sides it is agreement."""
    result = compare(reference([[-0.5, -math.inf, -1.0]] * 2), engine([{"0": -0.5, "1": -math.inf}] * 2),
                     [[0, 1, 2]], new_tokens=0)
    assert result.logprob_check()[0] and result.max_delta == 0.0
    result = compare(reference([[-0.5, -math.inf]] * 2), engine([{"0": -0.5, "1": -9.0}] * 2), [[0, 1, 2]],
                     new_tokens=0)
    assert not result.logprob_check()[0] and result.max_delta == math.inf


def test_localization_names_the_first_module_holding_nan():
    probes = [Probe("embedding", "embed", "m.embed", "model.embed", "tensor"),
              Probe("layer 0 mlp", "mlp", "m.layers.0.mlp", "model.layers.0.mlp", "first"),
              Probe("final norm", "final_norm", "m.norm", "model.norm", "first")]
    good = torch.ones(2, 4)
    hf = {"embedding": good, "layer 0 mlp": torch.full((2, 4), math.nan), "final norm": torch.full((2, 4), math.nan)}
    port = {"embedding": good, "layer 0 mlp": good, "final norm": good}
    probe, sides = first_nonfinite(hf, port, probes)
    assert probe.label == "layer 0 mlp" and sides == "transformers"
    errors, first = localize(hf, port, probes)
    assert first.label == "layer 0 mlp" and dict(errors)["layer 0 mlp"] == math.inf


@pytest.mark.engine
def test_verify_fails_when_the_reference_yields_nan(tmp_path):
    """The transformers reference of the shipped example, edited to produce NaN after its embedding."""
    ckpt = tmp_path / "demolm"
    shutil.copytree(EXAMPLES / "demolm", ckpt)
    port = tmp_path / "port"
    scaffold("new", ckpt, "-o", port)
    modeling = ckpt / "modeling_demolm.py"
    line = "        hidden_states = self.embed_tokens(input_ids)\n"
    assert line in modeling.read_text()
    modeling.write_text(modeling.read_text().replace(line, line + "        hidden_states = hidden_states * "
                                                                  "float('nan')\n"))
    proc = scaffold("verify", port, "--json", "--trust-remote-code", check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["parity: log-probabilities"]["status"] == "FAIL"
    assert "non-finite log-probabilities" in checks["parity: log-probabilities"]["detail"]
    assert "transformers gave NaN" in checks["parity: log-probabilities"]["detail"]
    divergence = checks["divergence"]
    assert divergence["status"] == "FAIL" and divergence["nonfinite"] == "transformers"
    assert divergence["module"].startswith("layer 0 "), divergence  # the first module after the embedding
