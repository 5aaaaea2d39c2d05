"""detect/routing.py: how a mixture-of-experts block routes, read from its code (never run).

FusedMoE computes softmax, top-k (renormalized or not). A block that routes otherwise is refused by
name, wherever its code keeps the routing: the block, its router's class, or a helper function."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from scaffold.detect.routing import routing

MODELS = Path(transformers.__file__).parent / "models"


def transformers_source(model_type: str) -> dict[str, str]:
    path = MODELS / model_type / f"modeling_{model_type}.py"
    return {f"transformers/models/{model_type}/{path.name}": path.read_text(encoding="utf-8")}


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "qwen2_moe", "olmoe"])
def test_softmax_top_k_routing_is_what_fused_moe_computes(model_type):
    found = routing(transformers_source(model_type), "experts")
    assert found is not None and found.standard, found
    assert found.problem() is None


def test_phimoe_sparsemixer_is_named_with_its_line():
    found = routing(transformers_source("phimoe"), "experts")
    problem = found.problem()
    assert problem is not None and "without a top-k" in problem
    assert "sparsemixer (transformers/models/phimoe/modeling_phimoe.py:" in problem


def test_sigmoid_scores_are_named():
    problem = routing(transformers_source("deepseek_v3"), "experts").problem()
    assert problem is not None and "sigmoid scores" in problem


LAB = '''
import torch
import torch.nn as nn


def pick_experts(logits, k):
    scores = logits.sigmoid()
    weights, chosen = scores.topk(k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), chosen


class Scorer(nn.Module):
    def __init__(self, dim, n):
        super().__init__()
        self.proj = nn.Linear(dim, n, bias=False)

    def forward(self, x):
        return pick_experts(self.proj(x), 2)


class FfnBank(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.scorer = Scorer(cfg.d, cfg.n)
        self.bank = nn.ModuleList([nn.Linear(cfg.d, cfg.d) for _ in range(cfg.n)])

    def forward(self, x):
        weights, chosen = self.scorer(x)
        return sum(self.bank[i](x) for i in range(len(self.bank)))
'''


def test_a_labs_routing_under_its_own_names_is_followed_into_its_helper():
    found = routing({"modeling_lab.py": LAB}, "bank")
    assert found.block == "FfnBank"
    assert any(h.startswith("pick_experts (modeling_lab.py:") for h in found.helpers)
    assert "sigmoid scores" in found.problem()


def test_the_same_lab_block_with_softmax_scores_ports():
    found = routing({"modeling_lab.py": LAB.replace("logits.sigmoid()", "logits.softmax(-1)")}, "bank")
    assert found.problem() is None


def test_no_class_owning_the_experts_says_nothing():
    assert routing({"modeling_lab.py": LAB}, "experts") is None
    assert routing({}, "experts") is None


def test_a_routers_own_methods_are_followed():
    """longcat_flash's router takes its top-k in a method of its own class, called as self.method(...)."""
    lab = LAB.replace("        return pick_experts(self.proj(x), 2)\n",
                      "        return self.choose(self.proj(x).softmax(-1))\n\n"
                      "    def choose(self, probs):\n        return probs.topk(2, dim=-1)\n")
    lab = lab.replace("    scores = logits.sigmoid()\n    weights, chosen = scores.topk(k, dim=-1)\n",
                      "    weights, chosen = logits, logits\n")
    found = routing({"modeling_lab.py": lab}, "bank")
    assert found.problem() is None, found
    assert routing({"modeling_lab.py": lab.replace("probs.topk(2, dim=-1)", "probs.max(-1)")}, "bank").problem()
