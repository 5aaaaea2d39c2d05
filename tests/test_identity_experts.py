"""LongCat-Flash's MoE block with identity (zero) experts, as the port computes it outside an engine.

The router scores routed and identity experts together; the port adds the identity experts' share
(weight x state) of that top-k itself, and FusedMoE's custom routing function takes the same top-k of
the same logits for the routed experts (a second top-k over a [tokens, experts] score, which keeps
FusedMoE's router-logits contract as vLLM's kernels read it). The block of the port (built and loaded
in a child process: interface_probe.py, mode "routing") is run on random hidden states beside
transformers' LongcatFlashMoE on the same weights.
"""

from __future__ import annotations

import pytest
from helpers import scaffold
from interface_probe import run
from test_sublayer_names import LONGCAT

TOKENS = 64


@pytest.mark.slow
def test_the_ports_block_computes_what_transformers_computes(workdir):
    import torch
    from transformers import LongcatFlashForCausalLM

    from scaffold.tiny import build_tiny

    ckpt = build_tiny("longcat_flash", workdir / "ckpt-routing-longcat", architecture="RoutingLongcatFlashForCausalLM",
                      overrides=LONGCAT)
    out = workdir / "port-routing-longcat"
    scaffold("new", ckpt, "-o", out, "--force")
    probe = run({"mode": "routing", "checkpoint": str(ckpt), "layer": 1, "tokens": TOKENS},
                workdir / "probe-routing", port=out)

    scored = LONGCAT["n_routed_experts"] + LONGCAT["zero_expert_num"]
    # Every top-k the block takes is over the scores of every expert, routed and identity.
    assert probe["topk_calls"] and all(call == [TOKENS, scored] for call in probe["topk_calls"]), probe["topk_calls"]

    hidden = torch.tensor(probe["hidden"])
    reference = LongcatFlashForCausalLM.from_pretrained(ckpt, dtype=torch.float32).model.layers[1].mlp
    with torch.no_grad():
        expected = reference(hidden[None])[0]
        _, _, chosen = reference.router(hidden)
    # Both kinds of expert are chosen, so that both shares count.
    assert (chosen >= LONGCAT["n_routed_experts"]).any() and (chosen < LONGCAT["n_routed_experts"]).any()
    torch.testing.assert_close(torch.tensor(probe["block"]), expected, rtol=1e-4, atol=1e-5)
