"""Routing read in the branch config.json selects, and divisions by a tensor's size are averages, not
renormalizations: Hunyuan-Large's gate calls `top1gating(logits)` when `self.moe_topk == 1` (softmax, argmax, each
token's expert weighted by its probability; a capacity statistic `/ logits.shape[0]`) and `topkgating` otherwise
(which divides the top-k weights by their sum). Read as one path, both divided, and moe_renormalize kept its
default (True: every top-1 weight 1), so the port's MoE output diverged (relative error 3.2e-01 at layer 0's MLP).
The lab below is written here in that form (its code is read, never run)."""

from __future__ import annotations

import ast

from scaffold.detect import routing

LAB = '''
import torch
import torch.nn.functional as F
from torch import nn


def top1gating(logits):
    gates = F.softmax(logits, dim=1)
    indices = torch.argmax(gates, dim=1)
    mask = F.one_hot(indices, num_classes=gates.shape[1])
    rate = torch.sum(mask) / (logits.shape[0])
    return rate, gates * mask


def topkgating(logits, topk):
    gates = F.softmax(logits, dim=1)
    values, indices = torch.topk(gates, topk, dim=1)
    denom = values.sum(dim=-1, keepdim=True)
    return 0, torch.zeros_like(gates).scatter(1, indices, values / denom)


class LabGate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.moe_topk = config.moe_topk
        self.wg = nn.Linear(config.hidden_size, config.num_experts, bias=False)

    def forward(self, hidden_states):
        logits = self.wg(hidden_states)
        if self.moe_topk == 1:
            return top1gating(logits)
        else:
            return topkgating(logits, self.moe_topk)


class LabMoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate = LabGate(config)
        self.experts = nn.ModuleList([nn.Linear(config.hidden_size, config.hidden_size) for _ in range(4)])

    def forward(self, hidden_states):
        _, weights = self.gate(hidden_states)
        return sum(weights[:, e:e + 1] * expert(hidden_states) for e, expert in enumerate(self.experts))
'''
SOURCES = {"modeling_lab.py": LAB}


def test_the_branch_the_config_selects_is_the_routing_path():
    one = routing.routing(SOURCES, "experts", config={"moe_topk": 1, "hidden_size": 8, "num_experts": 4})
    assert one.helpers == ("top1gating (modeling_lab.py:7)",) and not one.divides  # before: both helpers, divides
    two = routing.routing(SOURCES, "experts", config={"moe_topk": 2, "hidden_size": 8, "num_experts": 4})
    assert two.helpers == ("topkgating (modeling_lab.py:15)",) and two.divides
    # Without config.json (or where it does not decide the test) both branches are the path.
    assert len(routing.routing(SOURCES, "experts").helpers) == 2


def test_a_division_by_a_size_is_not_a_renormalization():
    def divisor(code: str) -> ast.AST:
        return ast.parse(code, mode="eval").body

    assert routing._by_a_size(divisor("logits.shape[0]"))
    assert routing._by_a_size(divisor("(x.size(0) * 2)"))
    assert routing._by_a_size(divisor("len(tokens)"))
    assert not routing._by_a_size(divisor("denom"))
    assert not routing._by_a_size(divisor("values.sum(dim=-1, keepdim=True)"))
    assert not routing._by_a_size(divisor("logits.shape[0] * topk"))
