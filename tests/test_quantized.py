"""Quantized checkpoints through a generated port, and tensors a port does not know.

An AWQ checkpoint (4-bit GEMM layout, group 64), built at test time from a tiny Llama, is
accepted by `scaffold new`, loads through the port's load_weights into vLLM's AWQ linear
layers, and gives the log-probabilities of vLLM's own LlamaForCausalLM on the same
checkpoint. A sibling holding tensors the port was not generated for is refused at load,
naming the tensor and saying to regenerate.
"""

from __future__ import annotations

import json

import pytest
from conftest import scaffold
from engine_logprobs import logprobs, max_delta
from quantized_ckpt import build_awq

TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def float_llama(workdir):
    from scaffold.tiny import build_tiny

    return build_tiny("llama", workdir / "ckpt-quant-float", architecture="LlamaForCausalLM", seed=2)


def test_scaffold_new_reads_an_awq_checkpoint(float_llama, workdir):
    awq = build_awq(float_llama, workdir / "ckpt-awq-static", "AwqStaticForCausalLM")
    out = workdir / "port-awq-static"
    scaffold("new", awq, "-o", out, "--force")
    spec = (out / "scaffold_spec.toml").read_text()
    assert 'qkv_layout = "separate"' in spec and "num_layers = 3" in spec
    table = json.loads(scaffold("inspect", awq, "--json").stdout)
    assert "model.layers.0.self_attn.q_proj.weight" in json.dumps(table)


def test_awq_with_another_layout_is_refused(float_llama, workdir):
    awq = build_awq(float_llama, workdir / "ckpt-awq-gemv", "AwqGemvForCausalLM")
    config = json.loads((awq / "config.json").read_text())
    config["quantization_config"]["version"] = "gemv"
    (awq / "config.json").write_text(json.dumps(config))
    proc = scaffold("new", awq, "-o", workdir / "port-awq-gemv", "--force", check=False)
    assert proc.returncode != 0 and "GEMM" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.engine
def test_awq_port_matches_vllms_own_llama(float_llama, workdir):
    port_ckpt = build_awq(float_llama, workdir / "ckpt-awq-port", "AwqLlamaForCausalLM")
    ref_ckpt = build_awq(float_llama, workdir / "ckpt-awq-ref", "LlamaForCausalLM")
    out = workdir / "port-awq"
    scaffold("new", port_ckpt, "-o", out, "--force")
    mine = logprobs(port_ckpt, workdir / "engine-awq-port", port=out, dtype="bfloat16")
    theirs = logprobs(ref_ckpt, workdir / "engine-awq-ref", dtype="bfloat16")
    assert mine["model_class"] == "awq_llama_vllm.model.AwqLlamaForCausalLM"
    assert theirs["model_class"] == "vllm.model_executor.models.llama.LlamaForCausalLM"
    delta = max_delta(mine, theirs)
    print(f"AWQ port vs vLLM's LlamaForCausalLM: max |dlogp| {delta:.3g}")
    assert delta <= TOLERANCE


@pytest.mark.engine
def test_the_awq_ports_own_weight_mapping_tests_pass(float_llama, workdir):
    """The generated tests/test_weight_mapping.py on the quantized checkpoint: every tensor, qweight, qzeros
    and scales included, lands in a parameter of its module's role."""
    import os
    import subprocess
    import sys

    from scaffold.verify.port import load_port, stage_install

    awq = build_awq(float_llama, workdir / "ckpt-awq-own-tests", "AwqOwnTestsForCausalLM")
    out = workdir / "port-awq-own-tests"
    scaffold("new", awq, "-o", out, "--force")
    port = load_port(out)
    env = dict(os.environ, PYTHONPATH=str(stage_install(port)), VLLM_PLUGINS=port.spec.package)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(out / "tests" / "test_weight_mapping.py")], capture_output=True, text=True, env=env,
                          cwd=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "failed" not in proc.stdout.strip().splitlines()[-1]


@pytest.mark.engine
def test_a_tensor_the_port_does_not_know_is_refused_at_load(workdir):
    """A port generated without attention biases, given a sibling that has them, names the tensor."""
    from scaffold.tiny import build_tiny

    ckpt = build_tiny("llama", workdir / "ckpt-strict-base", architecture="StrictLlamaForCausalLM")
    biased = build_tiny("llama", workdir / "ckpt-strict-biased", architecture="StrictLlamaForCausalLM",
                        overrides={"attention_bias": True})
    out = workdir / "port-strict"
    scaffold("new", ckpt, "-o", out, "--force")
    proc = logprobs(biased, workdir / "engine-strict", port=out, check=False)
    assert proc.returncode != 0
    assert "model.layers.0.self_attn." in proc.stderr and "_proj.bias" in proc.stderr
    assert "Regenerate the port from this checkpoint" in proc.stderr
