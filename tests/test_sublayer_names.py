"""The names a port of sublayers (LongCat-Flash's two attentions per layer) gives vLLM.

Each sublayer's attention needs a KV cache of its own, bound by a layer name holding one integer
(vLLM's extract_layer_index), while its linear layers must keep the prefixes the checkpoint names
them by (`model.layers.L.self_attn.i.q_b_proj`): quantization configs pick modules by those names
(FP8's ignored_layers, AWQ's modules_to_not_convert, per-layer settings). The port is built (not
loaded, not run) in a child process with an FP8 config ignoring two of sublayer 1's and sublayer 0's
projections, and what vLLM sees is read back (interface_probe.py, mode "names").
"""

from __future__ import annotations

import pytest
from catalogue import LATENT_SIZES
from helpers import scaffold
from interface_probe import run

# The longcat_flash row of tests/test_architectures.py: two layers of two sublayers, four attentions.
LONGCAT = {**LATENT_SIZES, "num_hidden_layers": 4, "n_routed_experts": 4, "moe_topk": 2,
           "expert_ffn_hidden_size": 64, "zero_expert_num": 4, "routed_scaling_factor": 2.0}


@pytest.mark.slow
def test_sublayer_attentions_keep_the_checkpoints_prefixes_and_cache_apart(workdir):
    from scaffold.tiny import build_tiny

    ckpt = build_tiny("longcat_flash", workdir / "ckpt-names-longcat", architecture="NamesLongcatFlashForCausalLM",
                      overrides=LONGCAT)
    out = workdir / "port-names-longcat"
    scaffold("new", ckpt, "-o", out, "--force")
    ignored = ["model.layers.0.self_attn.1.q_b_proj", "model.layers.1.self_attn.0.o_proj"]
    probe = run({"mode": "names", "checkpoint": str(ckpt), "ignored": ignored}, workdir / "probe-names", port=out)

    linears = probe["linears"]
    attention_linears = {name for name in linears if ".self_attn." in name}
    # Four projections in each of the four attentions, at the checkpoint's names.
    assert len(attention_linears) == 16
    assert "model.layers.1.self_attn.1.kv_b_proj" in attention_linears
    wrong = {name: v["prefix"] for name, v in linears.items() if v["prefix"] != name}
    assert not wrong, f"linear layers built with another prefix than their own name: {wrong}"
    skipped = {name for name in attention_linears if linears[name]["method"] == "UnquantizedLinearMethod"}
    assert skipped == set(ignored), skipped
    assert {linears[name]["method"] for name in attention_linears - skipped} == {"Fp8LinearMethod"}

    # One KV cache per attention, under a name holding its index over every sublayer of the stack.
    caches = {name.split(".mla_attn")[0]: a for name, a in probe["attention"].items()}
    assert sorted(caches) == [f"model.layers.{layer}.self_attn.{i}" for layer in (0, 1) for i in (0, 1)]
    for name, a in caches.items():
        layer, i = int(name.split(".")[2]), int(name.split(".")[4])
        assert a["index"] == 2 * layer + i, (name, a)
        assert sum(part.isdigit() for part in a["layer_name"].split(".")) == 1, a
    assert len({a["layer_name"] for a in caches.values()}) == 4
