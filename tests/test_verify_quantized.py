"""`scaffold verify` on a quantized port: the transformers reference runs on the dequantized weights.

transformers cannot load these checkpoints without the methods' own kernel packages, so verify writes
a float32 copy whose linears hold the weights they stand for (scaffold.verify.dequantize) and compares
the port, served by vLLM's quantized kernels (in bfloat16, or float32 where the CPU build runs the scheme so), against transformers on that copy, with the
tolerance stated per scheme (dequantize.TOLERANCES).

The unit tests check the dequantization against the quantizers of tests/quantized_ckpt.py (each
dequantized element within half a quantization step of the float weight); the engine tests check it
against vLLM's own kernels, which unpack the same tensors independently: a wrong nibble order, zero
point or scale would leave the port far outside the tolerance.
"""

from __future__ import annotations

import json

import pytest
from conftest import scaffold
from helpers import engine_sample
from quantized_ckpt import GROUP, SCHEMES, build_quantized

from scaffold.quantized import AWQ, FP8, FP8_BLOCK, GPTQ, INT8, PACKED
from scaffold.verify import dequantize

LAYOUTS = {"awq": AWQ, "gptq": GPTQ, "w8a8-int8": INT8, "w4a16": PACKED, "fp8": FP8, "fp8-block": FP8_BLOCK}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_dequantized_weight_is_within_half_a_step_of_the_float_weight(name):
    import torch

    quantize, config, _ = SCHEMES[name]
    weight = torch.randn(192, 256, generator=torch.Generator().manual_seed(3)) * 0.05
    parts = quantize(weight)
    got = dequantize.dequantized_weight(LAYOUTS[name], parts, {"quantization_config": config})
    assert got.shape == weight.shape and got.dtype == torch.float32
    error = (got - weight).abs()
    if name.startswith("fp8"):  # e4m3 keeps 3 mantissa bits: relative error up to 2**-4
        assert (error <= weight.abs() * 2**-4 + 1e-6).all(), error.max()
        return
    # Integer schemes: one step is the group's scale; rounding leaves at most half of it, plus the fp16
    # rounding of the scale (2**-11 relative) times the largest integer it multiplies.
    step = {"awq": weight.view(192, -1, GROUP).amax(2).sub(weight.view(192, -1, GROUP).amin(2)) / 15,
            "gptq": weight.view(192, -1, GROUP).abs().amax(2) / 7,
            "w4a16": weight.view(192, -1, GROUP).abs().amax(2) / 7,
            "w8a8-int8": weight.abs().amax(1, keepdim=True) / 127}[name]
    step = step.repeat_interleave(GROUP, dim=1) if step.shape[1] > 1 else step
    levels = {"awq": 15, "gptq": 8, "w4a16": 8, "w8a8-int8": 128}[name]
    assert (error <= step * (0.5 + levels * 2**-11) + 1e-7).all(), (error / step).max()
    # and not trivially: the weights are not returned unquantized
    assert (error > 0).any()


def test_a_wrong_nibble_order_is_caught_by_the_bound():
    """The bound above can fail: AWQ unpacked in GPTQ's plain order is far from the float weight."""
    import torch

    quantize, config, _ = SCHEMES["awq"]
    weight = torch.randn(64, 128, generator=torch.Generator().manual_seed(4)) * 0.05
    parts = quantize(weight)
    q = dequantize._unpack(parts["qweight"], 1).float()  # plain order, not AWQ's
    zeros = dequantize._unpack(parts["qzeros"], 1).float().repeat_interleave(GROUP, dim=0)
    wrong = ((q - zeros) * parts["scales"].float().repeat_interleave(GROUP, dim=0)).t()
    right = dequantize.dequantized_weight(AWQ, parts, {"quantization_config": config})
    assert (wrong - weight).abs().max() > 4 * (right - weight).abs().max()


@pytest.mark.slow  # ~12 s: builds the tiny float Llama in transformers first
def test_the_dequantized_copy_is_a_float_checkpoint_transformers_reads(float_llama, tmp_path):
    from scaffold.checkpoint import read_checkpoint

    ckpt = build_quantized(float_llama, tmp_path / "awq", "DeqLlamaForCausalLM", "awq", kv_scales=True)
    out = dequantize.write_dequantized(read_checkpoint(ckpt), tmp_path / "float")
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == "float32"
    copy = read_checkpoint(out)
    assert {info.dtype for info in copy.tensors.values()} == {"F32"}
    assert not [n for n in copy.tensors if n.endswith(("qweight", "qzeros", "scales", "k_scale", "v_scale"))]
    assert copy.tensors["model.layers.0.self_attn.q_proj.weight"].shape == \
        read_checkpoint(float_llama).tensors["model.layers.0.self_attn.q_proj.weight"].shape


VERIFIED = [("awq", "llama"), ("gptq", "qwen3"), ("w8a8-int8", "llama"), ("w4a16", "qwen3")]


@pytest.mark.engine
# The full suite keeps W8A8 here (KV-cache scales included) and AWQ in test_quantized: each scheme once.
@pytest.mark.parametrize(("scheme", "shape"), engine_sample(VERIFIED, keep=("w8a8-int8-llama",)))
def test_verify_of_a_quantized_port_compares_with_the_dequantized_weights(scheme, shape, float_ckpt, workdir):
    prefix = "Verify" + scheme.title().replace("-", "") + shape.title()
    ckpt = build_quantized(float_ckpt(shape), workdir / f"ckpt-verify-{scheme}", f"{prefix}ForCausalLM", scheme,
                           kv_scales=scheme == "w8a8-int8")
    out = workdir / f"port-verify-{scheme}"
    scaffold("new", ckpt, "-o", out, "--force")
    proc = scaffold("verify", out, "--json", check=False)
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    logprobs = checks["parity: log-probabilities"]
    print(f"{scheme} {shape}: {logprobs['detail']}; {checks['parity: greedy continuation']['detail']}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"dequantized {dequantize.scheme(json.loads((ckpt / 'config.json').read_text()))} weights" in \
        logprobs["detail"]
    assert logprobs["max_delta"] <= dequantize.TOLERANCES[scheme]


@pytest.mark.engine
def test_verify_of_a_quantized_port_still_catches_a_wrong_port(float_ckpt, workdir):
    """At the quantized tolerance a real mistake is still far outside it: gate and up swapped in the port."""
    ckpt = build_quantized(float_ckpt("llama"), workdir / "ckpt-verify-mutant", "MutAwqForCausalLM", "awq")
    out = workdir / "port-verify-mutant"
    scaffold("new", ckpt, "-o", out, "--force")
    model = next(out.glob("*/model.py"))
    text = model.read_text()
    assert '("mlp.gate_up_proj", "mlp.gate_proj", 0)' in text
    model.write_text(text.replace('("mlp.gate_up_proj", "mlp.gate_proj", 0)', '("mlp.gate_up_proj", "mlp.gate_proj", 1)')
                     .replace('("mlp.gate_up_proj", "mlp.up_proj", 1)', '("mlp.gate_up_proj", "mlp.up_proj", 0)'))
    proc = scaffold("verify", out, "--json", check=False)
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert proc.returncode != 0
    assert checks["parity: log-probabilities"]["status"] == "FAIL", checks["parity: log-probabilities"]
    assert checks["parity: log-probabilities"]["max_delta"] > 10 * dequantize.TOLERANCES["awq"]
