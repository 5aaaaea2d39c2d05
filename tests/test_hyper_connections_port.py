"""Hyper-connections ported and verified in the real vLLM engine against transformers running the checkpoint's own
remote code (tests/hyper_ckpt.py: a tiny Llama whose residual is kept as several streams, with HY-V4's classes, with
DeepSeek-V4's Sinkhorn-mixed ones, or with a lab's written otherwise). The port keeps the streams as
[tokens, N, hidden] between its layers (and between pipeline ranks), computes each sublayer's mixer and write-back as
vLLM's mhc_pre / mhc_post do, in float32, and collapses the streams with the head before the final norm."""

from __future__ import annotations

import pytest
import tomllib
from helpers import own_weight_tests_pass, scaffold, verified_at_parity
from hyper_ckpt import build


@pytest.mark.slow
@pytest.mark.parametrize("style", ["hy_v4", "deepseek_v4", "lab"])
def test_the_streams_matter_on_the_lab_checkpoint(style, tmp_path):
    """Every part of the form changes what transformers computes: the mixers' matrices, the write-back weights'
    scale and (DeepSeek-V4's) the mixing matrix; a port that dropped one could not pass."""
    import torch
    from transformers import AutoModelForCausalLM

    ckpt = build(tmp_path / "hyper", style=style)
    model = AutoModelForCausalLM.from_pretrained(ckpt, trust_remote_code=True, dtype=torch.float32)
    ids = torch.randint(3, 200, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(ids).logits.log_softmax(-1)
        for layer in model.model.layers:
            for module in layer.children():
                for name, param in module.named_parameters(recurse=False):
                    if param.dim() == 2:  # the mixers' matrices: the streams read and written with their biases only
                        param.zero_()
        unmixed = model(ids).logits.log_softmax(-1)
    assert (reference - unmixed).abs().max().item() > 0.05


@pytest.mark.slow
def test_the_mixing_matrix_applied_untransposed_is_refused(tmp_path):
    """DeepSeek-V4's layer applies comb^T to the streams; a lab applying comb itself computes something else
    (Sinkhorn's matrix is not symmetric): refused naming the layer, before any port is written."""
    ckpt = build(tmp_path / "hyper", style="deepseek_v4")
    code = ckpt / "modeling_hyperllama.py"
    text = code.read_text()
    assert text.count("comb.to(dtype).transpose(-1, -2)") == 2
    code.write_text(text.replace("comb.to(dtype).transpose(-1, -2)", "comb.to(dtype)"))
    out = scaffold("new", ckpt, "-o", tmp_path / "port", "--trust-remote-code", check=False)
    assert out.returncode != 0
    assert "LlamaDecoderLayer.forward" in out.stderr and "writes the sublayers' outputs back" in out.stderr
    assert not (tmp_path / "port").exists()


@pytest.mark.engine
@pytest.mark.parametrize("style, tp", [
    ("hy_v4", 1),
    pytest.param("deepseek_v4", 1, marks=pytest.mark.extended),
    pytest.param("lab", 1, marks=pytest.mark.extended),
    pytest.param("deepseek_v4", 2, marks=pytest.mark.extended),
], ids=["hy_v4-tp1", "deepseek_v4-tp1", "lab-tp1", "deepseek_v4-tp2"])
def test_hyper_connections_port_at_parity(style, tp, tmp_path):
    ckpt = build(tmp_path / "hyper", style=style)
    out = tmp_path / "port"
    new = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the hyper-connections checkpoint:\n{new.stderr[-3000:]}"
    spec = tomllib.loads((out / "scaffold_spec.toml").read_text(encoding="utf-8"))["spec"]
    assert spec["hyper_streams"] == 3
    assert spec.get("hyper_sinkhorn_iters", 0) == (5 if style == "deepseek_v4" else 0)
    model = next(out.glob("*/model.py")).read_text(encoding="utf-8")
    assert "HyperConnection(config, hidden_size)" in model and "HyperHead(config, hidden_size)" in model
    checks = verified_at_parity(out, "--trust-remote-code", "--tp", str(tp))
    if tp > 1:
        assert f"tensor_parallel_size={tp}" in checks["port loaded by vLLM"]["detail"]
        return
    own_weight_tests_pass(out)


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.extended
def test_the_streams_cross_pipeline_stages(tmp_path):
    """The port hands the streams to the next pipeline stage as [tokens, N, hidden] in its intermediate tensors
    (make_empty_intermediate_tensors gives the receiving buffer that shape). Served live at pipeline_parallel_size 2
    (3 layers, split [2, 1]), the port gives what it gives on one stage, which the tp1 case holds to transformers."""
    from engine_logprobs import logprobs, max_delta

    ckpt = build(tmp_path / "hyper", style="deepseek_v4")
    out = tmp_path / "port"
    scaffold("new", ckpt, "-o", out, "--trust-remote-code")
    one = logprobs(ckpt, tmp_path / "pp1", port=out, trust_remote_code=True)
    two = logprobs(ckpt, tmp_path / "pp2", port=out, pipeline_parallel_size=2, trust_remote_code=True)
    delta = max_delta(one, two)
    print(f"hyper-connections (deepseek_v4 style) PP=2 vs PP=1: max |dlogp| {delta:.2e}")
    assert delta <= 1e-4
