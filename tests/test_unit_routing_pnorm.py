"""Top-k routing weights divided by their p-norm (scaffold.detect.routing, moe._norm_division): DBRX's
`router_top_value / torch.norm(router_top_value, p=moe_normalize_expert_weights)` and a lab's router written
otherwise (the top-k's result kept whole and read by `.values`, torch.linalg.vector_norm(ord=...), other names):
p = 1 stays FusedMoE's renormalize, null divides by nothing, any other number is the port's routing function;
a norm of every score before the top-k, a p that is not a number, or another p beside the DeepSeek-V3 routing
parts are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import transformers_code

from scaffold.checkpoint import Checkpoint, TokenizerInfo
from scaffold.detect.moe import _norm_division, _routing_fields
from scaffold.detect.routing import routing
from scaffold.errors import ScaffoldError
from scaffold.spec import Spec

LAB = '''
import torch
import torch.nn as nn


class TokenDispatcher(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w_gate = nn.Linear(cfg.width, cfg.n_exp, bias=False)
        self.fanout = cfg.fanout
        self.lp = cfg.gate_norm_order

    def forward(self, h):
        probs = torch.softmax(self.w_gate(h).float(), dim=-1)
        picked = torch.topk(probs, k=self.fanout, dim=-1)
        vals = picked.values
        ids = picked.indices
        if self.lp is not None:
            vals = vals / torch.linalg.vector_norm(vals, ord=self.lp, dim=-1, keepdim=True)
        return vals.to(h.dtype), ids


class ExpertLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.dispatch = TokenDispatcher(cfg)
        self.ffns = nn.ModuleList([nn.Linear(cfg.width, cfg.width) for _ in range(cfg.n_exp)])

    def forward(self, h):
        vals, ids = self.dispatch(h)
        return h
'''


def _spec(code: str, config: dict) -> Spec:
    """The routing fields and the norm division as moe.py sets them for the lab block, with config.json `config`."""
    ckpt = Checkpoint(Path("/lab"), config, {}, [], None, TokenizerInfo(), {"modeling_lab.py": code})
    path = routing(ckpt.sources, "ffns")
    assert path.problem() is None, path.problem()
    spec = Spec()
    _routing_fields(spec, ckpt, path)
    _norm_division(spec, ckpt, path)
    return spec


def test_dbrx_divides_the_top_k_values_by_their_own_norm():
    found = routing(transformers_code("dbrx"), "experts")
    assert found.norm_of_topk and found.problem() is None


def test_a_labs_router_reading_the_top_k_by_values_is_followed_to_its_norm():
    found = routing({"modeling_lab.py": LAB}, "ffns")
    assert (found.norm_p_attr, found.norm_guard, found.norm_of_topk) == ("lp", "lp", True)
    assert ("lp", "gate_norm_order") in found.config_attrs and found.problem() is None


@pytest.mark.parametrize(("p", "renormalize"), [(1, True), (2, False), (3.5, False), (None, False)])
def test_any_number_p_ports_and_p_one_stays_the_sum(p, renormalize):
    spec = _spec(LAB, {"gate_norm_order": p})
    assert (spec.moe_pnorm, spec.moe_norm_p, spec.moe_renormalize) == (True, None if p is None else float(p),
                                                                      renormalize)
    assert spec.source("moe_norm_p").expr == "config.gate_norm_order"


def test_a_norm_of_every_score_before_the_top_k_is_refused_by_name():
    before = LAB.replace(
        "        picked = torch.topk(probs, k=self.fanout, dim=-1)\n",
        "        if self.lp is not None:\n"
        "            probs = probs / torch.linalg.vector_norm(probs, ord=self.lp, dim=-1, keepdim=True)\n"
        "        picked = torch.topk(probs, k=self.fanout, dim=-1)\n").replace(
        "        if self.lp is not None:\n            vals = vals / torch.linalg.vector_norm(vals, ord=self.lp, dim=-1, "
        "keepdim=True)\n", "")
    assert before.count("vector_norm") == 1 and "probs / torch.linalg" in before
    problem = routing({"modeling_lab.py": before}, "ffns").problem()
    assert "something other than the top-k's values by their own norm" in problem
    assert "TokenDispatcher" not in problem and "ExpertLayer (modeling_lab.py:" in problem
    # Dividing the top-k's values by the norm of every score is not their own norm either.
    other = LAB.replace("vector_norm(vals, ord=", "vector_norm(probs, ord=")
    assert "something other than the top-k's values" in routing({"modeling_lab.py": other}, "ffns").problem()


def test_a_p_that_is_not_a_number_is_refused_by_name():
    with pytest.raises(ScaffoldError, match="p = config.gate_norm_order = 'fro'"):
        _spec(LAB, {"gate_norm_order": "fro"})


def test_another_p_beside_sigmoid_scores_is_refused_and_p_one_is_not():
    sigmoid = LAB.replace("torch.softmax(self.w_gate(h).float(), dim=-1)", "torch.sigmoid(self.w_gate(h).float())")
    assert sigmoid != LAB
    with pytest.raises(ScaffoldError, match="beside sigmoid"):
        _spec(sigmoid, {"gate_norm_order": 2})
    assert _spec(sigmoid, {"gate_norm_order": 1}).moe_renormalize is True
