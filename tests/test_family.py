"""One port, every checkpoint of its architecture.

A port is generated from one tiny checkpoint, then `scaffold verify PORT --checkpoint SIBLING`
serves a sibling of the same architecture through it: another depth and widths, rope scaling
(llama3, yarn, linear), a tied head, another sliding-window pattern. Everything those change is
read from the config at run time, as vLLM's own models do, so the sibling must match
transformers as the port's own checkpoint does (float32, max |dlogp| <= 1e-4 over the top 20,
identical greedy continuations).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, scaffold
from helpers import engine_sample

TOLERANCE = 1e-4

# name: (model_type, the port's checkpoint overrides, the sibling's overrides)
FAMILIES = {
    "llama": (
        "llama",
        {},
        {"num_hidden_layers": 4, "hidden_size": 192, "intermediate_size": 320, "num_attention_heads": 6,
         "num_key_value_heads": 3, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
         "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    ),
    "gemma2": (
        "gemma2",
        {"sliding_window": 8, "query_pre_attn_scalar": 48, "attn_logit_softcapping": 1.0,
         "final_logit_softcapping": 1.0},
        {"num_hidden_layers": 5, "intermediate_size": 192, "sliding_window": 6, "query_pre_attn_scalar": 32,
         "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
         "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention",
                         "sliding_attention"],
         "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
    ),
    "qwen3": (
        "qwen3",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
        {"num_hidden_layers": 4, "hidden_size": 192, "intermediate_size": 320, "num_attention_heads": 6,
         "num_key_value_heads": 2, "use_sliding_window": True, "sliding_window": 6, "max_window_layers": 2,
         "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                             "original_max_position_embeddings": 128}},
    ),
}


def parity_checks(report: dict) -> dict:
    checks = {c["name"]: c for c in report["checks"]}
    assert report["passed"], json.dumps(report, indent=2)
    assert checks["port loaded by vLLM"]["status"] == "pass"
    assert checks["parity: log-probabilities"]["max_delta"] <= TOLERANCE
    assert checks["parity: greedy continuation"]["status"] == "pass"
    return checks


def family_member(workdir: Path, model_type: str, arch: str, tag: str, overrides: dict) -> Path:
    from scaffold.tiny import build_tiny

    return build_tiny(model_type, workdir / f"ckpt-family-{tag}", architecture=arch, overrides=overrides, seed=1)


@pytest.mark.engine
@pytest.mark.parametrize("name", engine_sample(sorted(FAMILIES), keep=("gemma2",)))
def test_port_serves_a_sibling_checkpoint(name, workdir):
    model_type, base, sibling = FAMILIES[name]
    arch = f"Family{name.capitalize()}ForCausalLM"
    ckpt = family_member(workdir, model_type, arch, f"{name}-base", base)
    other = family_member(workdir, model_type, arch, f"{name}-sibling", sibling)
    out = workdir / f"port-family-{name}"
    scaffold("new", ckpt, "-o", out, "--force")
    model = next(out.glob("*/model.py"))
    text = model.read_text()
    for literal in ("ROPE_PARAMETERS", "SLIDING_WINDOW_LAYERS"):
        assert literal not in text
    report = json.loads(scaffold("verify", out, "--checkpoint", other, "--json").stdout)
    checks = parity_checks(report)
    # The sibling differs in what the port reads from its config, and the check says so.
    spec_check = checks["spec matches checkpoint"]
    assert "read from its config at run time" in spec_check["detail"]
    assert "num_layers" in spec_check["detail"] and "rope_parameters" in spec_check["detail"]
    print(name, "sibling max |dlogp|", checks["parity: log-probabilities"]["max_delta"])


def build_demolm(out: Path, num_layers: int) -> Path:
    """The shipped DemoLM example, rebuilt by its own builder with another number of layers."""
    spec = importlib.util.spec_from_file_location("_demolm_builder", EXAMPLES / "build_examples.py")
    builder = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = builder
    spec.loader.exec_module(builder)
    tokenizer = builder.build_tokenizer()
    config = builder.load_config_class()(bos_token_id=tokenizer.token_to_id("<s>"),
                                          eos_token_id=tokenizer.token_to_id("</s>"), num_hidden_layers=num_layers)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    builder.write_config(config, out)
    builder.write_generation_config(config, out)
    builder.write_tokenizer(tokenizer, out)
    builder.write_weights(builder.make_weights(config, tokenizer.get_vocab_size()), num_layers, out)
    for name in ("configuration_demolm.py", "modeling_demolm.py"):
        shutil.copyfile(builder.SOURCES_DIR / name, out / name)
    return out


@pytest.mark.engine
def test_demolm_port_serves_nine_layers(workdir):
    """The example's port, generated from 6 layers (layers 2 and 5 attend fully), serves 9 (2, 5 and 8)."""
    nine = build_demolm(workdir / "ckpt-demolm-9", 9)
    assert json.loads((nine / "config.json").read_text())["layer_types"][8] == "full_attention"
    out = workdir / "port-family-demolm"
    scaffold("new", EXAMPLES / "demolm", "-o", out, "--force")
    text = next(out.glob("*/configuration.py")).read_text()
    assert "rope_theta=500000.0" in text  # the modeling code's convention, a default of the config class
    report = json.loads(scaffold("verify", out, "--checkpoint", nine, "--json", "--trust-remote-code").stdout)
    checks = parity_checks(report)
    print("demolm 9 layers max |dlogp|", checks["parity: log-probabilities"]["max_delta"])


@pytest.mark.slow  # 9-20 s on 2 cores: CLI runs in subprocesses that import torch and vLLM
def test_a_sibling_of_another_structure_fails_the_static_checks(workdir):
    """Attention biases are code the port does not have, not a value it reads: verify says so before any
    engine runs (and the engine would refuse the tensors at load, tests/test_quantized.py)."""
    base = family_member(workdir, "llama", "StructLlamaForCausalLM", "struct-base", {})
    biased = family_member(workdir, "llama", "StructLlamaForCausalLM", "struct-biased", {"attention_bias": True})
    out = workdir / "port-family-struct"
    scaffold("new", base, "-o", out, "--force")
    proc = scaffold("verify", out, "--checkpoint", biased, "--static-only", "--json", check=False)
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert proc.returncode != 0 and not report["passed"]
    assert checks["mapping coverage"]["status"] == "FAIL"
    assert "qkv_proj.bias" in checks["mapping coverage"]["detail"]
    assert "qkv_bias" in checks["spec matches checkpoint"]["detail"]


# A MoE family whose dense layers the decoder layer's code chooses by config (GLM-4-MoE's first_k_dense_replace):
# the port reads the condition, so a sibling with more dense layers and another depth loads as its config says.
MOE_FAMILY = ("glm4_moe", {"n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                           "n_shared_experts": 1, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
                           "norm_topk_prob": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2})


@pytest.mark.engine
@pytest.mark.extended
def test_moe_port_serves_a_sibling_with_other_dense_layers(workdir):
    model_type, common = MOE_FAMILY
    arch = "FamilyGlm4MoeForCausalLM"
    ckpt = family_member(workdir, model_type, arch, "moe-base", {**common, "first_k_dense_replace": 1})
    other = family_member(workdir, model_type, arch, "moe-sibling",
                          {**common, "first_k_dense_replace": 2, "num_hidden_layers": 4})
    out = workdir / "port-family-moe"
    scaffold("new", ckpt, "-o", out, "--force")
    text = next(out.glob("*/model.py")).read_text()
    assert "DENSE_LAYERS" not in text and "if layer_idx < config.first_k_dense_replace:" in text
    report = json.loads(scaffold("verify", out, "--checkpoint", other, "--json").stdout)
    checks = parity_checks(report)
    detail = checks["spec matches checkpoint"]["detail"]
    assert "read from its config at run time" in detail and "dense_layers" in detail, detail
    print("moe sibling max |dlogp|", checks["parity: log-probabilities"]["max_delta"])


# Gemma 4's KV-shared layers are read from the code layer by layer, with config.json's values: the port writes the
# map down and checks, at load, the config values the reading followed. A sibling sharing fewer layers is refused
# there, by name, rather than served with the wrong layers' keys and values.
KV_SHARE_BASE = {"global_head_dim": 32, "hidden_size_per_layer_input": 0, "sliding_window": 8, "num_hidden_layers": 5,
                 "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                                 "full_attention"], "num_kv_shared_layers": 2}


@pytest.mark.engine
@pytest.mark.extended
def test_a_kv_shared_port_refuses_a_sibling_that_shares_other_layers(workdir):
    arch = "FamilyGemma4ForCausalLM"
    ckpt = family_member(workdir, "gemma4_text", arch, "kvs-base", KV_SHARE_BASE)
    other = family_member(workdir, "gemma4_text", arch, "kvs-sibling", {**KV_SHARE_BASE, "num_kv_shared_layers": 1})
    out = workdir / "port-family-kvs"
    scaffold("new", ckpt, "-o", out, "--force")
    report = json.loads(scaffold("verify", out, "--checkpoint", other, "--json", check=False).stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert not report["passed"]
    assert checks["port loads in vLLM"]["status"] == "FAIL"
    assert "config.num_kv_shared_layers = 2; this checkpoint's config has 1" in checks["port loads in vLLM"]["detail"]


# HRM-Text's loops are config keys (H_cycles, L_cycles) and so is each stack's depth (num_layers_per_stack, from which
# num_hidden_layers counts the attention calls): the port reads them at run time, each (step, layer) call its own
# Attention, so a checkpoint with other cycle counts and depth is served through the port of the row's checkpoint.
HRM_BASE = {"embedding_scale": 1.0}  # tests/test_architectures.py's hrm_text row: 3 layers a stack, H 2, L 3
HRM_SIBLING = {"embedding_scale": 1.0, "num_hidden_layers": 2, "H_cycles": 3, "L_cycles": 2}


@pytest.mark.engine
@pytest.mark.extended
def test_a_recurrent_port_serves_a_sibling_with_other_cycles_and_depth(workdir):
    arch = "FamilyHrmTextForCausalLM"
    ckpt = family_member(workdir, "hrm_text", arch, "hrm-base", HRM_BASE)
    other = family_member(workdir, "hrm_text", arch, "hrm-sibling", HRM_SIBLING)
    config = json.loads((other / "config.json").read_text())
    assert (config["H_cycles"], config["L_cycles"], config["num_layers_per_stack"]) == (3, 2, 2)
    out = workdir / "port-family-hrm"
    scaffold("new", ckpt, "-o", out, "--force")
    text = next(out.glob("*/model.py")).read_text()
    assert "config.H_cycles" in text and re.search(r"CYCLE_INNER = \[.L_cycles., ..\]", text)
    report = json.loads(scaffold("verify", out, "--checkpoint", other, "--json").stdout)
    checks = parity_checks(report)
    print("hrm sibling max |dlogp|", checks["parity: log-probabilities"]["max_delta"])
