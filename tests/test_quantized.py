"""Quantized checkpoints through a generated port, and tensors a port does not know.

Quantized checkpoints, built at test time from tiny Llama- and Qwen3-shaped float checkpoints
(tests/quantized_ckpt.py), are accepted by `scaffold new`, load through the port's load_weights
into vLLM's quantized linear layers, and give the log-probabilities of vLLM's own class on the
same checkpoint. The schemes with an engine test are those vLLM's CPU build 0.32 serves with its
own Llama: AWQ (4-bit GEMM), GPTQ (4-bit, desc_act false), compressed-tensors W8A8 int8 and W4A16
pack-quantized. FP8 (per-tensor: CPU has no static_scaled_fp8_quant; block-wise: needs AMX) is
read here and served on the GPU (studies/gpu-h200-fp8.md). A layout the port is not generated
for is refused by `scaffold new`, naming config.json and the field; a sibling holding tensors
the port was not generated for is refused at load, naming the tensor and saying to regenerate.
"""

from __future__ import annotations

import json

import pytest
from conftest import scaffold
from engine_logprobs import logprobs, max_delta
from helpers import engine_sample, own_weight_tests_pass, quick_sample
from quantized_ckpt import SCHEMES, SHAPES, build_quantized

TOLERANCE = 1e-3
# Schemes vLLM's CPU build serves (found by running its own Llama on each, tests/quantized_ckpt.py's checkpoints).
CPU_SCHEMES = ("awq", "gptq", "w8a8-int8", "w4a16")
# Every scheme the builder writes but act-order GPTQ, which vLLM 0.32 refuses and so scaffold does too.
READ_SCHEMES = sorted(name for name, (_, config, _) in SCHEMES.items() if not config.get("desc_act"))
# The schemes the CPU build serves, each on the shape it runs on; the full suite serves AWQ and W8A8 (Llama's
# weight-only and activation-quantized layers) and runs GPTQ's generated weight-mapping tests.
SERVED = [("awq", "llama"), ("gptq", "qwen3"), ("w8a8-int8", "llama"), ("w4a16", "qwen3")]


def class_prefix(scheme: str, shape: str) -> str:
    return "".join(part.capitalize() for part in f"{scheme}-{shape}".split("-"))


@pytest.mark.parametrize("scheme", quick_sample(READ_SCHEMES, every=3))
def test_scaffold_new_reads_a_quantized_checkpoint(scheme, float_llama, workdir):
    ckpt = build_quantized(float_llama, workdir / f"ckpt-{scheme}-static", f"{class_prefix(scheme, 'static')}ForCausalLM",
                           scheme, kv_scales=True)
    out = workdir / f"port-{scheme}-static"
    scaffold("new", ckpt, "-o", out, "--force")
    spec = (out / "scaffold_spec.toml").read_text()
    assert 'qkv_layout = "separate"' in spec and "num_layers = 3" in spec
    table = json.dumps(json.loads(scaffold("inspect", ckpt, "--json").stdout))
    # Every quantized linear stands in the table as the weight it quantizes; the KV-cache scales
    # are left to the port's maybe_remap_kv_scale_name.
    for layer in range(3):
        for module in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"):
            assert f"model.layers.{layer}.{module}.weight" in table
    assert "k_scale" not in table and "weight_scale" not in table and "qweight" not in table


@pytest.mark.parametrize(("scheme", "edit", "field"), [
    ("awq", {"version": "gemv"}, "quantization_config.version"),
    ("gptq", {"desc_act": True}, "quantization_config.desc_act"),
    ("gptq", {"bits": 3}, "quantization_config.bits"),
    ("w8a8-int8", {"format": "float-quantized"}, "quantization_config.format"),
    ("fp8", {"weight_block_size": [64]}, "quantization_config.weight_block_size"),
    ("fp8", {"quant_method": "bitsandbytes"}, "quantization_config.quant_method"),
])
def test_a_layout_the_port_is_not_generated_for_is_refused(scheme, edit, field, float_llama, workdir):
    name = f"{scheme}-{'-'.join(edit)}"
    ckpt = build_quantized(float_llama, workdir / f"ckpt-refused-{name}", "RefusedForCausalLM", scheme)
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization_config"].update(edit)
    (ckpt / "config.json").write_text(json.dumps(config))
    proc = scaffold("new", ckpt, "-o", workdir / f"port-refused-{name}", "--force", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert field in proc.stderr and "config.json" in proc.stderr
    assert not (workdir / f"port-refused-{name}").exists()


@pytest.mark.parametrize(("scheme", "change", "named"), [
    ("gptq", "drop", "model.layers.1.mlp.up_proj.scales"),
    ("awq", "add", "model.layers.1.mlp.up_proj.g_idx"),
])
def test_a_quantized_module_with_tensors_missing_or_foreign_is_refused(scheme, change, named, float_llama, workdir):
    """A GPTQ qweight without its scales, an AWQ module with a g_idx (GPTQ's): each named, nothing written."""
    import torch
    from safetensors.torch import load_file, save_file

    ckpt = build_quantized(float_llama, workdir / f"ckpt-{scheme}-{change}", "ForeignForCausalLM", scheme)
    tensors = load_file(str(ckpt / "model.safetensors"))
    if change == "drop":
        del tensors[named]
    else:
        tensors[named] = torch.zeros(256, dtype=torch.int32)
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    out = workdir / f"port-{scheme}-{change}"
    proc = scaffold("new", ckpt, "-o", out, "--force", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert named in proc.stderr and not out.exists()


@pytest.mark.engine
# The full suite keeps AWQ here and W8A8 (with KV-cache scales) in test_verify_quantized: each scheme once.
@pytest.mark.parametrize(("scheme", "shape"), engine_sample(SERVED, keep=("awq-llama",)))
def test_quantized_port_matches_vllms_own_class(scheme, shape, float_ckpt, workdir):
    """Each scheme the CPU build serves, once, on a Llama- or a Qwen3-shaped port (both shapes covered);
    the W8A8 checkpoint also holds KV-cache scales (k_proj.k_scale, v_proj.v_scale)."""
    prefix = class_prefix(scheme, shape)
    kv_scales = scheme == "w8a8-int8"
    port_ckpt = build_quantized(float_ckpt(shape), workdir / f"ckpt-{prefix}-port", f"{prefix}ForCausalLM", scheme,
                                kv_scales=kv_scales)
    ref_ckpt = build_quantized(float_ckpt(shape), workdir / f"ckpt-{prefix}-ref", SHAPES[shape], scheme,
                               kv_scales=kv_scales)
    out = workdir / f"port-{prefix}"
    scaffold("new", port_ckpt, "-o", out, "--force")
    mine = logprobs(port_ckpt, workdir / f"engine-{prefix}-port", port=out, dtype="bfloat16")
    theirs = logprobs(ref_ckpt, workdir / f"engine-{prefix}-ref", dtype="bfloat16")
    assert mine["model_class"].endswith(f"_vllm.model.{prefix}ForCausalLM")
    assert theirs["model_class"] == f"vllm.model_executor.models.{shape}.{SHAPES[shape]}"
    delta = max_delta(mine, theirs)
    print(f"{scheme} {shape} port vs vLLM's {SHAPES[shape]}: max |dlogp| {delta:.3g}")
    assert delta <= TOLERANCE


@pytest.mark.engine
@pytest.mark.parametrize(("scheme", "shape"), engine_sample(SERVED, keep=("gptq-qwen3",)))
def test_the_quantized_ports_own_weight_mapping_tests_pass(scheme, shape, float_ckpt, workdir):
    """The generated tests/test_weight_mapping.py on the quantized checkpoint: every tensor the quantization
    method keeps (qweight, qzeros, scales, weight_packed, weight_scale, KV-cache scales) lands in a parameter of
    its module's role, the names the method drops (GPTQ's g_idx) are dropped as vLLM's loader drops them."""
    name = class_prefix(scheme, shape) + "OwnTests"
    ckpt = build_quantized(float_ckpt(shape), workdir / f"ckpt-{scheme}-{shape}-own-tests", f"{name}ForCausalLM",
                           scheme, kv_scales=scheme == "w8a8-int8")
    out = workdir / f"port-{scheme}-{shape}-own-tests"
    scaffold("new", ckpt, "-o", out, "--force")
    own_weight_tests_pass(out, at_least=6)


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
