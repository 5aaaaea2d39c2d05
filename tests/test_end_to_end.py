"""scaffold new + scaffold verify on real checkpoints, in the real vLLM engine (CPU build).

Each architecture is one entry of ARCHITECTURES: (model_type, config overrides).
The checkpoint's `architectures` is renamed so vLLM has no class of its own for
it: the engine can only serve it through the generated plugin.
"""

from __future__ import annotations

import json

import pytest
from helpers import EXAMPLES, engine_sample, scaffold

TOLERANCE = 1e-4

ARCHITECTURES = {
    "llama": ("llama", {}),
    "mistral": ("mistral", {"sliding_window": 8}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
}


def assert_parity(report: dict) -> None:
    checks = {c["name"]: c for c in report["checks"]}
    assert report["passed"], json.dumps(report, indent=2)
    assert checks["port loaded by vLLM"]["status"] == "pass"
    assert checks["parity: log-probabilities"]["max_delta"] <= TOLERANCE
    assert checks["parity: greedy continuation"]["status"] == "pass"
    # The sharding proof ran inside the parity engine's process and keeps its place before parity.
    names = [c["name"] for c in report["checks"]]
    assert names.index("tensor-parallel sharding") < names.index("port loaded by vLLM")
    assert [r["tp"] for r in checks["tensor-parallel sharding"]["results"]] == [2, 4, 8]


@pytest.mark.engine
@pytest.mark.parametrize("name", engine_sample(sorted(ARCHITECTURES), keep=("llama-tied", "mistral")))
def test_new_then_verify(name, tiny, workdir):
    model_type, overrides = ARCHITECTURES[name]
    arch = "Scaffold" + "".join(p.capitalize() for p in name.split("-")) + "ForCausalLM"
    ckpt = tiny(model_type, arch, **overrides)
    out = workdir / f"port-{name}"
    scaffold("new", ckpt, "-o", out, "--force")
    report = json.loads(scaffold("verify", out, "--json").stdout)
    assert_parity(report)


@pytest.mark.engine
def test_demolm_remote_code_example(workdir):
    """The shipped custom architecture: GQA 3:1, gating bias, sliding window every third layer full."""
    out = workdir / "port-demolm"
    scaffold("new", EXAMPLES / "demolm", "-o", out, "--force")
    report = json.loads(scaffold("verify", out, "--json", "--trust-remote-code").stdout)
    assert_parity(report)
    checks = {c["name"]: c for c in report["checks"]}
    assert "70 padded rows" in checks["vocabulary"]["detail"]


@pytest.mark.engine
def test_demolm_without_consent_skips_parity_and_says_why(workdir):
    out = workdir / "port-demolm-untrusted"
    scaffold("new", EXAMPLES / "demolm", "-o", out, "--force")
    report = json.loads(scaffold("verify", out, "--json").stdout)
    parity = next(c for c in report["checks"] if c["name"] == "parity")
    assert parity["status"] == "skipped"
    assert "--trust-remote-code" in parity["detail"] and "modeling_demolm.py" in parity["detail"]


@pytest.mark.engine
@pytest.mark.slow
def test_demolm_tensor_parallel_2_equals_1(workdir):
    """The same port, run with tensor_parallel_size 1 and 2, gives the same tokens and log-probs."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.verify import parity
    from scaffold.verify.port import load_port, stage_install

    out = workdir / "port-demolm-tp"
    scaffold("new", EXAMPLES / "demolm", "-o", out, "--force")
    port = load_port(out)
    ckpt = read_checkpoint(port.checkpoint)
    stage = stage_install(port)
    prompts = parity.prompts_for(ckpt, port.spec.vocab_size)
    runs = {
        tp: parity.vllm_run(ckpt.path, prompts, stage, port.spec.package, 256, workdir, tensor_parallel_size=tp)
        for tp in (1, 2)
    }
    worst = 0.0
    for one, two in zip(runs[1]["results"], runs[2]["results"]):
        assert one["tokens"] == two["tokens"]
        for d1, d2 in zip(one["prompt_logprobs"] + one["sample_logprobs"],
                          two["prompt_logprobs"] + two["sample_logprobs"]):
            assert d1.keys() == d2.keys()
            worst = max(worst, max(abs(d1[k] - d2[k]) for k in d1))
    print(f"demolm TP=2 vs TP=1: max |dlogp| {worst:.2e}")
    assert worst <= TOLERANCE
