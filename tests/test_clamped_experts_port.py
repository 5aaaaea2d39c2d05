"""Routed experts computing silu(gate.clamp(max=L)) * up.clamp(-L, L) (HY-V4's and GLM-5-Next's form) ported and
verified in the real vLLM engine against transformers running the checkpoint's own remote code
(tests/clamped_experts_ckpt.py builds it: a lab's experts class in a tiny Qwen3-MoE or GLM-4-MoE, the bound in
config.expert_clip).

vLLM's FusedMoE takes the bound as swiglu_limit, but its CPU kernel does not apply it, so the port computes these
experts itself (the port's ClampedSiluExperts: vLLM's router, FusedMoE's parameters and loader). The bound is far
inside the tiny model's values: without the clamp transformers' own log-probabilities move by about 2."""

from __future__ import annotations

import pytest
import tomllib
from clamped_experts_ckpt import build
from helpers import own_weight_tests_pass, scaffold, verified_at_parity


@pytest.mark.slow
@pytest.mark.parametrize("base", ["qwen3_moe", "glm4_moe"])
def test_the_clamp_matters_on_the_lab_checkpoint(base, tmp_path):
    """The checkpoint's bound changes what transformers computes: a port that dropped the clamp could not pass."""
    import torch
    from transformers import AutoModelForCausalLM

    ckpt = build(tmp_path / "clampmoe", base=base)
    model = AutoModelForCausalLM.from_pretrained(ckpt, trust_remote_code=True, dtype=torch.float32)
    ids = torch.randint(3, 200, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        clamped = model(ids).logits.log_softmax(-1)
        for layer in model.model.layers:
            if hasattr(layer.mlp, "experts"):
                layer.mlp.experts.clip = 1e9
        unclamped = model(ids).logits.log_softmax(-1)
    assert (clamped - unclamped).abs().max().item() > 0.5


@pytest.mark.engine
@pytest.mark.parametrize("base, tp", [
    ("qwen3_moe", 1),
    # HY-V4's routing (sigmoid scores, a correction bias, expert groups, a scaling factor) and shared experts.
    pytest.param("glm4_moe", 1, marks=pytest.mark.extended),
    pytest.param("qwen3_moe", 2, marks=pytest.mark.extended),
], ids=["qwen3_moe-tp1", "glm4_moe-tp1", "qwen3_moe-tp2"])
def test_clamped_silu_experts_port_at_parity(base, tp, tmp_path):
    ckpt = build(tmp_path / "clampmoe", base=base)
    out = tmp_path / "port"
    new = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the clamped-experts checkpoint:\n{new.stderr[-3000:]}"
    spec = tomllib.loads((out / "scaffold_spec.toml").read_text(encoding="utf-8"))["spec"]
    assert (spec["expert_activation"], spec["expert_clamp_limit"]) == ("silu_clamp", 0.25)
    model = next(out.glob("*/model.py")).read_text(encoding="utf-8")
    assert "ClampedSiluExperts(" in model and "swiglu_limit=config.expert_clip" in model
    # Over two ranks each holds half of every expert's width and the partial sums are all-reduced.
    checks = verified_at_parity(out, "--trust-remote-code", "--tp", str(tp))
    if tp > 1:
        assert f"tensor_parallel_size={tp}" in checks["port loaded by vLLM"]["detail"]
        return
    # The port's own weight-mapping tests: each expert's gate and up rows land in w13, down in w2.
    own_weight_tests_pass(out)
