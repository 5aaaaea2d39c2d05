"""Grok-1's forms, read from a lab-written module (tests' own code, in Grok-1's form): a MoE block holding its experts
as an nn.ModuleList of an MLP class whose projections no known naming fits, a router softmax inside that block,
norms before and after each sublayer keeping their scale as `scale`, and attention scores the forward computes
itself, scaled by a constructor parameter and soft-capped by c * tanh(s / c).

On main each was refused or misread: the experts' list was taken for a second decoder stack (no layer class), the
block's softmax made it attention-like (no MLP, no norms: "layer 0 has the norms none"), the experts' projections
were refused by name, their GELU read as the default silu, and the scores' scale and cap left at head_dim ** -0.5
and none.
"""

from __future__ import annotations

import textwrap

from scaffold.detect import attention, dataflow, moe
from scaffold.detect import mlp as mlp_detector

LAB = textwrap.dedent('''
import torch
import torch.nn.functional as F
from torch import nn


class LabNorm(nn.Module):
    def __init__(self, size, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(size))

    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return self.scale * (x * torch.rsqrt(v + self.eps))


class LabAttention(nn.Module):
    def __init__(self, hidden, heads, score_factor=1.0, score_cap=30.0):
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.score_factor = score_factor
        self.score_cap = score_cap
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x, mask=None):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        w = torch.matmul(q, k.transpose(2, 3)).float()
        w = w * self.score_factor
        w = self.score_cap * torch.tanh(w / self.score_cap)
        if mask is not None:
            w = w + mask
        w = F.softmax(w, dim=-1)
        out = torch.matmul(w, v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out)


class LabExpert(nn.Module):
    def __init__(self, hidden, width):
        super().__init__()
        self.wa = nn.Linear(hidden, width, bias=False)
        self.wb = nn.Linear(width, hidden, bias=False)
        self.wc = nn.Linear(hidden, width, bias=False)
        self.act = nn.GELU()

    def forward(self, x):
        return self.wb(self.act(self.wc(x)) * self.wa(x))


class LabMoe(nn.Module):
    def __init__(self, hidden, width, experts, top_k):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList([LabExpert(hidden, width) for _ in range(experts)])

    def forward(self, x):
        probs = F.softmax(self.gate(x), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            hit = (chosen == e).any(-1)
            out[hit] += expert(x[hit]) * weights[hit][chosen[hit] == e][:, None]
        return out, probs


class LabLayer(nn.Module):
    def __init__(self, hidden, width, heads, experts, top_k, score_factor=1.0, score_cap=30.0):
        super().__init__()
        self.attn = LabAttention(hidden, heads, score_factor=score_factor, score_cap=score_cap)
        self.block = LabMoe(hidden, width, experts, top_k)
        self.n1 = LabNorm(hidden)
        self.n2 = LabNorm(hidden)
        self.n3 = LabNorm(hidden)
        self.n4 = LabNorm(hidden)

    def forward(self, x, mask=None):
        r = x
        x = self.n2(self.attn(self.n1(x), mask=mask))
        x = r + x
        r = x
        x, _ = self.block(self.n3(x))
        x = self.n4(x)
        return r + x


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([
            LabLayer(config.hidden_size, config.intermediate_size, config.num_attention_heads, config.num_experts,
                     config.num_experts_per_tok, score_factor=config.score_factor, score_cap=config.score_cap)
            for i in range(config.num_hidden_layers)
        ])
        self.norm = LabNorm(config.hidden_size)


class LabForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = LabModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
''')
SOURCES = {"modeling_lab.py": LAB}
CONFIG = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 2, "num_hidden_layers": 2,
          "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 100, "score_factor": 0.0883, "score_cap": 7.5}


def test_the_decoder_stack_is_not_the_experts_list_inside_its_layers():
    found = dataflow.layer_class(SOURCES)
    assert found is not None and found[1].name == "LabLayer"


def test_a_block_holding_a_list_of_mlps_is_the_layers_mlp_sublayer_with_its_norms_around_it():
    layer = dataflow.analyze_layer(SOURCES, CONFIG)
    assert layer is not None and layer.attention == "attn" and layer.mlp == "block"
    assert layer.norms == {"attn_norm": "n1", "mlp_norm": "n3", "attn_post_norm": "n2", "mlp_post_norm": "n4"}


def test_the_experts_roles_are_read_from_what_their_class_computes():
    roles, evidence = moe.expert_roles(SOURCES, {"wa", "wb", "wc"}, CONFIG)
    assert roles == ("wc", "wa", "wb")  # gate (activated), up, down
    assert "LabExpert" in evidence
    assert isinstance(moe.expert_roles(SOURCES, {"wa", "wb", "wx"}, CONFIG), str)  # no class declares them: why


def test_the_experts_activation_is_their_class_s():
    found = mlp_detector.code_activation(SOURCES, "block", CONFIG)
    assert found is not None and found[0] == "gelu"


def test_the_scores_scale_and_tanh_cap_are_read_through_the_constructors_to_config():
    found = attention.code_scores(SOURCES, CONFIG)
    assert found is not None
    assert found.scale[:2] == (0.0883, "config.score_factor")
    assert found.cap[:2] == (7.5, "config.score_cap")
    assert "modeling_lab.py:" in found.cap[2]


def test_scores_changed_otherwise_are_not_read():
    other = {"modeling_lab.py": LAB.replace("w = self.score_cap * torch.tanh(w / self.score_cap)",
                                            "w = self.score_cap * torch.tanh(w) / self.score_cap")}
    assert attention.code_scores(other, CONFIG) is None


def test_a_step_on_the_scores_under_a_condition_is_not_read():
    other = {"modeling_lab.py": LAB.replace("            w = w + mask", "            w = w * mask")}
    assert attention.code_scores(other, CONFIG) is None
    cast = {"modeling_lab.py": LAB.replace("w = F.softmax(w, dim=-1)", "w = F.softmax(w, dim=-1).to(v.dtype)")}
    assert attention.code_scores(cast, CONFIG) is not None
