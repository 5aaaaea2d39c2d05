"""Forms named behind several copies of the residual stream (scaffold.detect.branches): a low-rank residual branch
(Gemma-3n's Laurel) and a statistical cutoff on a projection's output (its activation sparsity), read from what the
code computes on transformers' file and on lab modules written otherwise; an MLP with its residual inside, a gated
per-layer block and a cutoff no layer takes name nothing."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape
from helpers import LAB_PRELUDE, read, transformers_code
from test_unit_streams import LAB_STACKED

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import branches, detect
from scaffold.errors import UnsupportedArchitecture
from scaffold.model_context import choices
from scaffold.spec import Source, Spec

# A lab's layer written unlike Gemma-3n's: the branch's linears a and b through config.branch_rank, applied in one
# expression, normed, the input added on the right; the cutoff a method `cut` (torch.special.ndtri, clamp_min of the
# centred gate) called under a flag read from a config list by the layer's index.
LAB = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.wq = nn.Linear(config.hidden_size, config.num_attention_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.num_attention_heads * config.head_dim, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        return self.wo(self.wq(x))


class LabShortcut(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.a = nn.Linear(config.hidden_size, config.branch_rank, bias=False)
        self.b = nn.Linear(config.branch_rank, config.hidden_size, bias=False)
        self.n = LabRMSNorm(config.hidden_size)

    def forward(self, h):
        return self.n(self.b(self.a(h))) + h


class LabMLP(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.sparse = config.sparse_layers[layer_idx]

    def cut(self, g):
        z = torch.special.ndtri(torch.tensor(0.9))
        centred = g - g.mean(-1, keepdim=True) - g.std(-1, keepdim=True) * z
        return torch.clamp_min(centred, 0.0)

    def forward(self, x):
        g = self.gate_proj(x)
        if self.sparse:
            g = self.cut(g)
        return self.down_proj(F.gelu(g) * self.up_proj(x))


class LabLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = LabAttention(config, layer_idx)
        self.mlp = LabMLP(config, layer_idx)
        self.side = LabShortcut(config)
        self.input_layernorm = LabRMSNorm(config.hidden_size)

    def forward(self, x, cos, sin, mask):
        h = self.input_layernorm(x)
        x = x + self.self_attn(h, cos, sin, mask) + self.side(h)
        return x + self.mlp(x)


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config, i) for i in range(config.num_hidden_layers)])
'''


def test_gemma3n_laurel_and_activation_sparsity_are_named():
    code = transformers_code("gemma3n")
    laurel = branches.low_rank_branch(code)
    assert laurel.startswith("a low-rank residual branch (Laurel): the decoder layer's laurel "
                             "(Gemma3nTextLaurelBlock, modeling_gemma3n.py:")
    assert "linear_right(linear_left(x))" in laurel and "config.laurel_rank features" in laurel
    pattern = {"activation_sparsity_pattern": [0.95, 0.0, 0.95]}
    cutoff = branches.gate_cutoff(code, pattern, 3)
    assert cutoff.startswith("a statistical cutoff on a projection's output (activation sparsity): "
                             "Gemma3nTextMLP._gaussian_topk")
    assert cutoff.endswith("where config.activation_sparsity_pattern[layer_idx] > 0.0: layers [0, 2]")
    # The catalogue's tiny config (every layer 0.0) takes the branch nowhere: nothing to port there.
    assert branches.gate_cutoff(code, {"activation_sparsity_pattern": [0.0] * 3}, 3) is None


def test_a_lab_branch_and_cutoff_written_otherwise_are_named():
    code = {"modeling_lab.py": LAB}
    laurel = branches.low_rank_branch(code)
    assert laurel is not None and "layer's side (LabShortcut" in laurel and "b(a(x))" in laurel
    assert "config.branch_rank features" in laurel
    cutoff = branches.gate_cutoff(code, {"sparse_layers": [False, True]}, 2)
    assert cutoff is not None and "LabMLP.cut" in cutoff and cutoff.endswith(": layers [1]")
    assert branches.gate_cutoff(code, {"sparse_layers": [False, False]}, 2) is None
    assert "does not decide" in branches.gate_cutoff(code, {}, 2)


def test_a_branch_with_an_activation_or_a_second_input_and_a_cutoff_without_statistics_name_nothing():
    activated = LAB.replace("self.n(self.b(self.a(h))) + h", "self.n(self.b(F.relu(self.a(h)))) + h")
    assert branches.low_rank_branch({"modeling_lab.py": activated}) is None
    plain = LAB.replace("g.std(-1, keepdim=True) * z", "z")
    assert branches.gate_cutoff({"modeling_lab.py": plain}, {"sparse_layers": [True, True]}, 2) is None
    # TimesFM's MLP adds its input inside (through an activation); EmbeddingGemma-2's per-layer block gates by a
    # second input; Llama has neither form.
    for model in ("timesfm", "embedding_gemma2", "llama"):
        assert branches.low_rank_branch(transformers_code(model)) is None, model
        assert branches.gate_cutoff(transformers_code(model), {}, 2) is None, model


def test_the_streams_refusal_names_the_forms_behind_it(tmp_path):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_streams", extra={"branch_rank": 8})
    read(tmp_path, shape)
    stacked = LAB_STACKED.replace("class LabModel(", LAB.split("class LabShortcut(")[1].split("class LabMLP(")[0]
                                  .join(["class LabShortcut(", "class LabModel("]))
    stacked = stacked.replace("        self.mix = nn.Linear(", "        self.side = LabShortcut(config)\n"
                                                               "        self.mix = nn.Linear(")
    (tmp_path / "modeling_lab.py").write_text(stacked)
    with pytest.raises(UnsupportedArchitecture, match=r"alternating updates \(AltUp\): .*; behind it, a low-rank "
                                                      r"residual branch \(Laurel\): the decoder layer's side"):
        detect(read_checkpoint(tmp_path))


# The cutoff read to be ported (branches.read_cutoff): interpreted over numbers (the normal quantile, the population
# std, the relu) and compared with vLLM's relu(g - (mean + std * icdf(f))), applied to the gate projection's output
# before the activation, each layer's fraction from the code's expression. A lab's cutoff written otherwise: another
# distribution's spelling, torch.std(correction=0), F.relu of the centred gate in one line, a config list of its own.
LAB_CUT = LAB.replace('''        self.sparse = config.sparse_layers[layer_idx]

    def cut(self, g):
        z = torch.special.ndtri(torch.tensor(0.9))
        centred = g - g.mean(-1, keepdim=True) - g.std(-1, keepdim=True) * z
        return torch.clamp_min(centred, 0.0)

    def forward(self, x):
        g = self.gate_proj(x)
        if self.sparse:
            g = self.cut(g)''', '''        self.keep = config.cut_fractions[layer_idx]

    def thin(self, g):
        q = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(self.keep))
        mu = g.mean(dim=-1, keepdim=True)
        return F.relu(g - mu - torch.std(g, dim=-1, keepdim=True, correction=0) * q)

    def forward(self, x):
        g = self.gate_proj(x)
        if self.keep > 0:
            g = self.thin(g)''')


def test_the_port_reads_each_layers_fraction_with_the_codes_expression():
    """What the port's MLP is rendered with (model_context.choices): the code's per-layer expression where the
    reader kept one, else the list indexed by the layer (the merge of Gemma-3n had dropped `import re` here: every
    port with activation sparsity failed with a NameError)."""
    from scaffold.model_context import choices
    from scaffold.spec import Source, Spec

    spec = Spec()
    spec.set("activation_sparsity", [0.95, 0.0, 0.6],
             Source("code", "modeling_gemma3n.py:1: cutoff", "config.activation_sparsity_pattern[layer_idx]"))
    assert choices(spec, set())["sparsity_expr"] == "config.activation_sparsity_pattern[layer_idx]"
    assert choices(spec, {"activation_sparsity"})["sparsity_expr"] == "[0.95, 0.0, 0.6][layer_idx]"
    spec.set("activation_sparsity", [0.95, 0.0, 0.6], Source("code", "lab.py:1: cutoff", "self.fractions[layer_idx]"))
    assert choices(spec, set())["sparsity_expr"] == "[0.95, 0.0, 0.6][layer_idx]"


def test_gemma3n_activation_sparsity_is_read_with_each_layers_fraction():
    found = branches.read_cutoff(transformers_code("gemma3n"), {"activation_sparsity_pattern": [0.95, 0.0, 0.6]}, 3,
                                 "gate_proj")
    assert (found.module, found.method, found.fraction) == ("mlp", "_gaussian_topk",
                                                            "config.activation_sparsity_pattern[layer_idx]")
    assert (found.fractions, found.layers) == ([0.95, 0.0, 0.6], [0, 2])
    assert found.evidence.startswith("modeling_gemma3n.py:")
    # Read where no layer takes it (the catalogue's tiny config): fractions all 0.
    assert branches.read_cutoff(transformers_code("gemma3n"), {"activation_sparsity_pattern": [0.0] * 3}, 3,
                                "gate_proj").layers == []


def test_a_lab_cutoff_written_otherwise_is_read_and_one_computing_otherwise_refused():
    assert LAB_CUT != LAB
    found = branches.read_cutoff({"modeling_lab.py": LAB_CUT}, {"cut_fractions": [0.0, 0.8]}, 2, "gate_proj")
    assert (found.method, found.fraction, found.fractions, found.layers) == (
        "thin", "config.cut_fractions[layer_idx]", [0.0, 0.8], [1])
    # The sample std (Bessel's correction), not the population std vLLM computes.
    with pytest.raises(branches.Refused, match="population std"):
        branches.read_cutoff({"modeling_lab.py": LAB_CUT.replace("correction=0", "correction=1")},
                             {"cut_fractions": [0.0, 0.8]}, 2, "gate_proj")
    with pytest.raises(branches.Refused, match="population std"):
        code = transformers_code("gemma3n")
        (name, text), = code.items()
        branches.read_cutoff({name: text.replace("unbiased=False", "unbiased=True")},
                             {"activation_sparsity_pattern": [0.95, 0.0, 0.6]}, 3, "gate_proj")
    # A fixed fraction in the code (the first lab's ndtri(0.9)), not the layer's own.
    with pytest.raises(branches.Refused, match="not one fraction"):
        branches.read_cutoff({"modeling_lab.py": LAB}, {"sparse_layers": [False, True]}, 2, "gate_proj")
    # Applied to the up projection's output: not the gate's.
    with pytest.raises(branches.Refused, match="not applied to the gate"):
        branches.read_cutoff({"modeling_lab.py": LAB_CUT}, {"cut_fractions": [0.0, 0.8]}, 2, "up_proj")


def test_a_cutoff_read_from_the_code_is_the_ports_per_layer_expression():
    """Every Gemma-3n checkpoint cuts its first layers (0.95): the fraction the code reads, config.K[layer_idx], is
    what the port's decoder layer evaluates; a fraction the code does not read so (an override) is the list."""
    spec = Spec()
    spec.set("activation_sparsity", [0.95, 0.0], Source("code", "modeling_gemma3n.py:1",
                                                        "config.activation_sparsity_pattern[layer_idx]"))
    assert choices(spec, set())["sparsity_expr"] == "config.activation_sparsity_pattern[layer_idx]"
    assert choices(spec, {"activation_sparsity"})["sparsity_expr"] == "[0.95, 0.0][layer_idx]"
