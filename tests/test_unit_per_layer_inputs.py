"""Per-layer input embeddings (Gemma 4's PLE) read as the port computes them (scaffold.detect.layerinputs.read):
the model's forward and the decoder layer's are evaluated over symbolic terms, and the form is recognized whatever
the modules, methods and variables are called and however the code arranges the arithmetic; another form is refused
naming what differs."""

from __future__ import annotations

import pytest
from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import layerinputs

CONFIG = {"num_hidden_layers": 3, "hidden_size": 128, "hidden_size_per_layer_input": 32,
          "vocab_size_per_layer_input": 256, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6}


class _Info:
    def __init__(self, shape):
        self.shape = shape


def tensors(table: str, width: int = 32, prefix: str = "model") -> dict:
    return {f"{prefix}.embed_tokens.weight": _Info((256, 128)), f"{prefix}.{table}.weight": _Info((256, 3 * width))}


def test_gemma4_per_layer_inputs_are_read_with_their_scales_and_modules():
    form = layerinputs.read(transformers_code("gemma4"), CONFIG, tensors("embed_tokens_per_layer"))
    assert form is not None
    assert (form.table, form.model_projection, form.projection_norm) == (
        "embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm")
    assert (form.gate, form.projection, form.post_norm) == (
        "per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm")
    assert form.table_scale.value == pytest.approx(32 ** 0.5)
    assert form.model_scale.value == pytest.approx(128 ** -0.5)
    assert form.input_scale.value == pytest.approx(2 ** -0.5)
    # The scales the config sizes are read by the port from the config at run time.
    assert form.table_scale.expr == "config.hidden_size_per_layer_input ** 0.5"
    assert form.model_scale.expr == "config.hidden_size ** (-0.5)"
    assert (form.act, form.act_expr) == ("gelu_pytorch_tanh", "hidden_activation")
    assert "modeling_gemma4.py:" in form.evidence


def test_a_model_without_the_table_has_none():
    assert layerinputs.read(transformers_code("gemma4"), CONFIG, {"model.embed_tokens.weight": _Info((256, 128))}) \
        is None


# A lab's backbone computing Gemma 4's form written otherwise: the tables `tok` and `side` (a subclass of nn.Embedding
# whose scale is a plain float it keeps), the projection `mix` and its norm `mix_norm`, constants as math.sqrt and a
# division, the side inputs computed inline with unflatten/view, the sum written table first; the blocks take their
# slice by keyword from `for idx, block in enumerate(self.blocks)`, and each computes the gated term in one
# expression, its modules named `lift`, `drop`, `side_norm`, `squash`.
LAB_PLE = "\n" + LAB_PRELUDE + '''import math
from transformers.activations import ACT2FN


class LabSideTable(nn.Embedding):
    def __init__(self, rows, width, mult):
        super().__init__(rows, width)
        self.mult = mult

    def forward(self, ids):
        return super().forward(ids) * self.mult


class LabBlock(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        self.attn_norm = LabRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.wq = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.lift = nn.Linear(config.hidden_size, config.hidden_size_per_layer_input, bias=False)
        self.drop = nn.Linear(config.hidden_size_per_layer_input, config.hidden_size, bias=False)
        self.side_norm = LabRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.squash = ACT2FN[config.hidden_activation]

    def forward(self, x, side=None):
        x = x + self.wq(self.attn_norm(x))
        return x + self.side_norm(self.drop(self.squash(self.lift(x)) * side))


class LabBackbone(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.width = config.hidden_size_per_layer_input
        self.tok = nn.Embedding(config.vocab_size, config.hidden_size)
        self.side = LabSideTable(config.vocab_size_per_layer_input,
                                 config.num_hidden_layers * config.hidden_size_per_layer_input,
                                 math.sqrt(config.hidden_size_per_layer_input))
        self.mix = nn.Linear(config.hidden_size, config.num_hidden_layers * config.hidden_size_per_layer_input,
                             bias=False)
        self.mix_norm = LabRMSNorm(config.hidden_size_per_layer_input, eps=config.rms_norm_eps)
        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.num_hidden_layers)])
        self.final = LabRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, ids):
        x = self.tok(ids) * math.sqrt(self.config.hidden_size)
        looked_up = self.side(ids).view(*ids.shape, len(self.blocks), self.width)
        mixed = self.mix_norm((self.mix(x) / math.sqrt(self.config.hidden_size)).unflatten(-1, (len(self.blocks),
                                                                                               self.width)))
        sides = (looked_up + mixed) / math.sqrt(2.0)
        for idx, block in enumerate(self.blocks):
            x = block(x, side=sides[..., idx, :])
        return self.final(x)
'''


def test_a_lab_backbone_computing_the_same_form_is_read():
    form = layerinputs.read({"modeling_lab.py": LAB_PLE}, CONFIG, tensors("side"))
    assert form is not None
    assert (form.table, form.model_projection, form.projection_norm) == ("side", "mix", "mix_norm")
    assert (form.gate, form.projection, form.post_norm) == ("lift", "drop", "side_norm")
    assert form.table_scale.value == pytest.approx(32 ** 0.5)
    assert form.model_scale.value == pytest.approx(128 ** -0.5)
    assert form.input_scale.value == pytest.approx(2 ** -0.5)
    assert form.act == "gelu_pytorch_tanh"


@pytest.mark.parametrize("change, words", [
    # The projection's norm over the sum, not over the projection alone.
    (("        mixed = self.mix_norm((self.mix(x)", "        mixed = ((self.mix(x)"),
     "not c2 * (norm(c1 * linear(h)) + c * table(ids))"),
    # The slices packed width-major: [width, layers].
    (("view(*ids.shape, len(self.blocks), self.width)", "view(*ids.shape, self.width, len(self.blocks))"),
     "a reshape to (32.0, 3.0)"),
    # The per-layer term added before the layer's last residual add.
    (("        x = x + self.wq(self.attn_norm(x))\n        return x + self.side_norm(",
      "        return x + self.wq(self.attn_norm(x)) + self.side_norm("),
     "not as norm(linear(act(linear(h)) * side)) added to h"),
    # Its norm built otherwise than the layer's norms.
    (("        self.side_norm = LabRMSNorm(config.hidden_size, eps=config.rms_norm_eps)",
      "        self.side_norm = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)"),
     "not built as the layer's norms are"),
    # The table's lookup of something else than the token ids themselves.
    (("return super().forward(ids) * self.mult", "return super().forward(ids + 1) * self.mult"),
     "the reader finds a lookup of side in 0 of the layer's arguments"),
    # The slice of the layer index taken along the width.
    (("sides[..., idx, :]", "sides[..., idx]"), "not the slice [..., i, :]"),
])
def test_a_lab_backbone_computing_otherwise_is_refused_naming_the_difference(change, words):
    old, new = change
    assert old in LAB_PLE
    with pytest.raises(layerinputs.Refused) as exc:
        layerinputs.read({"modeling_lab.py": LAB_PLE.replace(old, new)}, CONFIG, tensors("side"))
    assert words in str(exc.value), str(exc.value)
    assert "modeling_lab.py:" in str(exc.value)


# ------------------------------------------------------------------ experts beside the dense MLP (forms.py)
def test_gemma4_moe_block_passes_the_form_check():
    from scaffold.detect import forms

    # Ported now (scaffold.detect.parallelmoe; tests/test_unit_parallel_moe.py): the form check lets it through.
    config = {"enable_moe_block": True, "hidden_size_per_layer_input": 0, "num_hidden_layers": 2,
              "hidden_activation": "gelu_pytorch_tanh"}
    assert forms.experts_beside_mlp(transformers_code("gemma4"), config) is None
    assert forms.experts_beside_mlp(transformers_code("gemma4"), dict(config, enable_moe_block=False)) is None


LAB_BANK = "\n" + LAB_PRELUDE + '''class LabDense(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_in = nn.Linear(config.hidden_size, 64, bias=False)
        self.w_out = nn.Linear(64, config.hidden_size, bias=False)

    def forward(self, x):
        return self.w_out(F.gelu(self.w_in(x)))


class LabBank(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_in = nn.Parameter(torch.empty(config.num_experts, 64, config.hidden_size))
        self.w_out = nn.Parameter(torch.empty(config.num_experts, config.hidden_size, 64))

    def forward(self, x, which, weights):
        return (weights[..., None] * torch.einsum("tf,tef->te", x, self.w_in[which])).sum(1)


class LabAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class LabBlock(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        self.mix = LabAttention(config)
        self.ffn = LabDense(config)
        self.pick = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.bank = LabBank(config)
        self.n1 = LabRMSNorm(config.hidden_size)

    def forward(self, x):
        x = x + self.mix(self.n1(x))
        weights, which = self.pick(x).softmax(-1).topk(2)
        routed = self.bank(x, which, weights)
        return x + routed + self.ffn(x)


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.num_hidden_layers)])
'''


def test_a_lab_layer_adding_its_experts_to_its_dense_mlp_is_refused():
    from scaffold.detect import forms

    message = forms.experts_beside_mlp({"modeling_lab.py": LAB_BANK}, {"num_hidden_layers": 2})
    assert message is not None and "LabBlock.forward (modeling_lab.py:" in message, message
    assert "self.bank (LabBank, modeling_lab.py:" in message and "self.ffn (LabDense)" in message
    # The experts' output is added to the residual stream before the dense MLP's (x + routed + ffn(x)), and its
    # router is no module: named as what differs from the form the port computes.
    assert "otherwise than the port's experts beside the dense MLP" in message, message
    # The same layer with the experts alone (no dense MLP beside them) is an ordinary MoE layer.
    alone = LAB_BANK.replace("        return x + routed + self.ffn(x)", "        return x + routed")
    assert forms.experts_beside_mlp({"modeling_lab.py": alone}, {"num_hidden_layers": 2}) is None
