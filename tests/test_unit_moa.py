"""A mixture of attention heads (JetMoE's MoA) read from what the attention's code computes (scaffold.detect.moa), and
experts kept as banks of 3-D weights run per expert by the MoE block (scaffold.detect.expertbanks): on transformers'
JetMoE file and on lab modules written otherwise (other names, positional constructor arguments, torch.topk, a
method softmax, a tuple-unpacked chunk), with the forms the port does not compute refused by name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import expertbanks, moa

E, KV, D, H, F = 4, 2, 16, 64, 96  # experts, KV heads, head_dim, hidden, expert width


def shapes(**named) -> dict:
    return {name: SimpleNamespace(shape=tuple(shape)) for name, shape in named.items()}


JETMOE_LAYER0 = {
    **shapes(**{"self_attention.experts.input_linear.weight": (E, KV * D, H),
                "self_attention.experts.output_linear.weight": (E, H, KV * D),
                "self_attention.experts.router.layer.weight": (E, H),
                "self_attention.experts.bias": (H,),
                "self_attention.kv_proj.weight": (2 * KV * D, H),
                "mlp.input_linear.weight": (E, 2 * F, H), "mlp.output_linear.weight": (E, H, F),
                "mlp.router.layer.weight": (E, H), "mlp.bias": (H,)}),
}


def test_jetmoe_attention_is_read_from_its_code():
    found = moa.read(transformers_code("jetmoe"), {}, JETMOE_LAYER0, "self_attention")
    assert (found.attr, found.router, found.q_bank, found.o_bank, found.bias, found.kv_proj) == \
        ("experts", "router.layer", "input_linear", "output_linear", "bias", "kv_proj")
    assert (found.top_k, found.experts_expr, found.num_experts) == \
        ("config.num_experts_per_tok", "config.num_local_experts", E)
    assert "queries from self.experts.map (modeling_jetmoe.py:" in found.evidence
    assert "output from self.experts.reduce (modeling_jetmoe.py:" in found.evidence
    assert "routed by JetMoeTopKGating's top-k then softmax" in found.evidence


def test_an_attention_without_routing_is_not_a_mixture():
    assert moa.read(transformers_code("llama"), {}, shapes(**{"self_attn.q_proj.weight": (H, H)}), "self_attn") \
        is None


# A lab's mixture of attention heads written otherwise: its own names (mix, chooser.scorer, q_bank, o_bank, shift,
# kv), sizes handed down by position, torch.topk over float logits and a method softmax of the values, the routed
# module's methods project / merge, the attention computed with sdpa.
LAB_MOA = LAB_PRELUDE + '''class LabTopChooser(nn.Module):
    def __init__(self, width, n_banks, keep):
        super().__init__()
        self.keep = keep
        self.scorer = nn.Linear(width, n_banks, bias=False)

    def forward(self, x):
        logits = self.scorer(x).float()
        best, which = torch.topk(logits, self.keep, dim=-1)
        return best.softmax(dim=-1).type_as(x), which


class LabBank(nn.Module):
    def __init__(self, n, d_in, d_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, d_out, d_in))

    def forward(self, x, which):
        return torch.einsum("btkd,btked->btke", x, self.weight[which])


class LabHeadMixture(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.k = config.banks_per_token
        width = config.head_size * config.kv_groups
        self.chooser = LabTopChooser(config.hidden_size, config.n_banks, self.k)
        self.q_bank = LabBank(config.n_banks, config.hidden_size, width)
        self.o_bank = LabBank(config.n_banks, width, config.hidden_size)
        self.shift = nn.Parameter(torch.zeros(config.hidden_size))

    def project(self, x):
        weights, which = self.chooser(x)
        q = self.q_bank(x[:, :, None, :].expand(-1, -1, self.k, -1), which)
        return q, (weights, which)

    def merge(self, y, state):
        weights, which = state
        out = (self.o_bank(y, which) * weights[..., None]).sum(2)
        return out + self.shift


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.k = config.banks_per_token
        self.d = config.head_size
        self.mix = LabHeadMixture(config)
        self.kv = nn.Linear(config.hidden_size, 2 * config.head_size * config.kv_groups, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q, state = self.mix.project(x)
        key, val = self.kv(x).chunk(2, dim=-1)
        q = q.reshape(b, t, -1, self.d).transpose(1, 2)
        key = key.view(b, t, -1, self.d).transpose(1, 2)
        val = val.view(b, t, -1, self.d).transpose(1, 2)
        q, key = apply_rope(q, key, cos, sin)
        key = key.repeat(1, self.k, 1, 1)
        val = val.repeat(1, self.k, 1, 1)
        y = F.scaled_dot_product_attention(q, key, val, attn_mask=mask)
        return self.mix.merge(y.transpose(1, 2).reshape(b, t, self.k, -1), state)


class LabLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn = LabAttention(config, layer_idx)
        self.norm1 = LabRMSNorm(config.hidden_size)

    def forward(self, x, cos, sin, mask):
        return x + self.attn(self.norm1(x), cos, sin, mask)


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([LabLayer(config, i) for i in range(config.num_hidden_layers)])
'''
LAB_LAYER0 = shapes(**{"attn.mix.q_bank.weight": (E, KV * D, H), "attn.mix.o_bank.weight": (E, H, KV * D),
                       "attn.mix.chooser.scorer.weight": (E, H), "attn.mix.shift": (H,),
                       "attn.kv.weight": (2 * KV * D, H)})


def lab(code: str = LAB_MOA) -> dict[str, str]:
    return {"modeling_lab.py": code}


def test_a_lab_mixture_of_attention_heads_is_read_whatever_its_names():
    found = moa.read(lab(), {}, LAB_LAYER0, "attn")
    assert (found.attr, found.router, found.q_bank, found.o_bank, found.bias, found.kv_proj) == \
        ("mix", "chooser.scorer", "q_bank", "o_bank", "shift", "kv")
    # The sizes through the constructors' positional arguments, up to the config.
    assert (found.top_k, found.experts_expr) == ("config.banks_per_token", "config.n_banks")
    assert "queries from self.mix.project" in found.evidence and "output from self.mix.merge" in found.evidence


@pytest.mark.parametrize(("change", "named"), [
    # The keys repeated per head (grouped) instead of tiled over the query groups: another head pairing.
    (("key = key.repeat(1, self.k, 1, 1)", "key = key.repeat_interleave(self.k, dim=1)"),
     "does not tile its keys and values over the top-k query groups with .repeat(1, k, 1, 1)"),
    # A softmax over every expert before the top-k: weights not renormalized over the chosen.
    (("logits = self.scorer(x).float()", "logits = self.scorer(x).float().softmax(-1)"),
     "a router that scores before its top-k (modeling_lab.py:"),
    # The top-k values used as they are, no softmax over them.
    (("return best.softmax(dim=-1).type_as(x), which", "return best.type_as(x), which"),
     "a router whose weights are not a softmax over its top-k values"),
    # No bias on the output.
    (("        return out + self.shift", "        return out * self.shift"),
     "does not add self.shift to its output"),
])
def test_a_lab_mixture_computed_otherwise_is_refused_by_name(change, named):
    code = LAB_MOA.replace(*change)
    assert code != LAB_MOA
    with pytest.raises(moa.Refused, match=None) as refused:
        moa.read(lab(code), {}, LAB_LAYER0, "attn")
    assert named in str(refused.value)


def test_the_output_bank_must_mirror_the_query_bank():
    wrong = {**LAB_LAYER0, **shapes(**{"attn.mix.o_bank.weight": (E, H, 2 * KV * D)})}
    with pytest.raises(moa.Refused) as refused:
        moa.read(lab(), {}, wrong, "attn")
    assert "not one query bank [experts, rows, hidden], one output bank [experts, hidden, rows]" in str(refused.value)


# ------------------------------------------------------------------ experts kept as banks
def test_jetmoes_moe_block_runs_its_banks_gate_first_with_a_bias():
    read = expertbanks.read(transformers_code("jetmoe"), "layers", "mlp",
                            {"input_linear": [E, 2 * F, H], "output_linear": [E, H, F]})
    assert (read.code.gate_up, read.code.down, read.code.up_first, read.code.in_out) == \
        ("input_linear", "output_linear", False, False)
    assert read.output_bias == "bias" and "JetMoeMoE.forward returns layer_output + self.bias" in read.bias_evidence
    assert read.activation == "config.activation_function"
    assert "JetMoeParallelExperts.forward line" in read.code.storage_evidence
    assert "F.linear(input_list[i], self.weight[i])" in read.code.storage_evidence


LAB_BANKS_MLP = LAB_PRELUDE + '''class LabBank(nn.Module):
    def __init__(self, n, d_in, d_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, d_out, d_in))

    def forward(self, x, which):
        return torch.stack([F.linear(x, self.weight[e]) for e in which.unique()])


class LabExperts(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.up_and_gate = LabBank(config.n_experts, config.hidden_size, 2 * config.expert_width)
        self.back = LabBank(config.n_experts, config.expert_width, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.offset = nn.Parameter(torch.zeros(config.hidden_size))

    def forward(self, x, which):
        both = self.up_and_gate(x, which)
        up, gate = both.chunk(2, dim=-1)
        mixed = self.back(up * self.act(gate), which)
        return mixed + self.offset


class LabLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.ffn = LabExperts(config)

    def forward(self, x, which):
        return x + self.ffn(x, which)


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([LabLayer(config, i) for i in range(config.num_hidden_layers)])
'''


def test_a_lab_bank_block_written_otherwise_is_read():
    read = expertbanks.read(lab(LAB_BANKS_MLP), "layers", "ffn",
                            {"up_and_gate": [E, 2 * F, H], "back": [E, H, F]})
    assert (read.code.gate_up, read.code.down, read.code.up_first) == ("up_and_gate", "back", True)
    assert (read.output_bias, read.activation) == ("offset", "config.hidden_act")


def test_a_bias_the_block_adds_before_its_last_step_is_refused():
    code = LAB_BANKS_MLP.replace("        return mixed + self.offset",
                                 "        mixed = mixed + self.offset\n        return torch.tanh(mixed)")
    found = expertbanks.read(lab(code), "layers", "ffn", {"up_and_gate": [E, 2 * F, H], "back": [E, H, F]})
    assert isinstance(found, str) and "adds self.offset" in found and "elsewhere than to what it returns" in found


def template_expert_bank():
    """The port's bank of per-expert linears, as the routed attention template writes it (plain Python)."""
    import re
    from pathlib import Path

    import torch

    text = (Path(__file__).resolve().parent.parent
            / "templates/package/__package__/_parts/routed_attention.py.j2").read_text()
    source = re.search(r"^def expert_bank\(.*?(?=^def expert_bank_fake)", text, re.S | re.M).group(0)
    namespace = {"torch": torch}
    exec(compile(source, "routed_attention.py.j2", "exec"), namespace)
    return namespace["expert_bank"]


@pytest.mark.parametrize("tokens", [1, 3, 17])
def test_the_ports_expert_bank_computes_each_chosen_experts_rows(tokens):
    """Grouped by expert, one matmul each, the rows equal the dense product over every expert gathered at the chosen
    ones (the form the port had), for the queries (each token's top-k rows) and the output (one row per group); an
    expert no token chose is skipped."""
    import torch

    bank = template_expert_bank()
    torch.manual_seed(tokens)
    experts, top_k, rows, hidden = 5, 2, 12, 8
    weight = torch.randn(experts, rows, hidden)
    x = torch.randn(tokens, hidden)
    # Expert 4 never chosen; the groups of a token in either order.
    chosen = torch.stack([torch.randperm(4)[:top_k] for _ in range(tokens)])
    dense = torch.einsum("th,erh->ter", x, weight)
    expected = dense.gather(1, chosen.unsqueeze(-1).expand(-1, -1, rows))
    q = bank(x, chosen.reshape(-1), weight, top_k).view(tokens, top_k, rows)
    torch.testing.assert_close(q, expected, rtol=1e-5, atol=1e-5)
    # The output side: one input row per (token, group).
    grouped = torch.randn(tokens * top_k, hidden)
    out = bank(grouped, chosen.reshape(-1), weight, 1)
    every = torch.einsum("nh,erh->ner", grouped, weight)
    torch.testing.assert_close(out, every[torch.arange(tokens * top_k), chosen.reshape(-1)], rtol=1e-5, atol=1e-5)
