"""Layouts a family keeps behind its config flags (Falcon's three q/k/v layouts and two block forms), read as the
checkpoint's config selects them; and the pieces they needed: a linear subclass, a parallel block with two norms
read from the code, config values the code sets itself, an ALiBi bias scaled with the scores."""

from __future__ import annotations

import textwrap

from helpers import transformers_code

from scaffold.detect import dataflow
from scaffold.detect.linears import linear_classes
from scaffold.detect.positions import alibi_scaled
from scaffold.detect.sourcecode import configured

# A lab's decoder layer with two norms under names of its own, whose MLP branch reads either the layer's input
# (side by side with attention) or the attention's output (one after the other), by a flag of its config.
LAYER = textwrap.dedent('''
    class TernLinear(nn.Linear):
        def forward(self, x):
            return x @ self.weight.T + self.bias


    class TernAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.wq = TernLinear(config.width, config.width)
            self.wk = TernLinear(config.width, config.width)
            self.wv = TernLinear(config.width, config.width)
            self.wo = TernLinear(config.width, config.width)

        def forward(self, x):
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
            return self.wo(torch.softmax(q @ k.transpose(-1, -2), -1) @ v)


    class TernMLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.up = TernLinear(config.width, 4 * config.width)
            self.down = TernLinear(4 * config.width, config.width)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))


    class TernBlock(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            if config.mix_norms is None:
                config.mix_norms = 2
            self.mixer = TernAttention(config)
            self.ffn = TernMLP(config)
            self.pre_mix = nn.LayerNorm(config.width)
            self.pre_ffn = nn.LayerNorm(config.width)

        def forward(self, x):
            mixed = self.mixer(self.pre_mix(x))
            if self.config.side_by_side and self.config.mix_norms == 2:
                return x + mixed + self.ffn(self.pre_ffn(x))
            h = x + mixed
            return h + self.ffn(self.pre_ffn(h))


    class TernModel(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.blocks = nn.ModuleList([TernBlock(config) for _ in range(config.depth)])
''')


def test_a_subclass_of_nn_linear_that_keeps_its_storage_is_a_linear_layer():
    found = linear_classes({"modeling_tern.py": LAYER})["TernLinear"]
    assert (found.transposed, found.in_arg, found.out_arg) == (False, 0, 1)
    assert "FalconLinear" in linear_classes(transformers_code("falcon"))


def test_the_config_values_the_code_sets_itself_are_applied():
    sources = {"modeling_tern.py": LAYER}
    assert configured(sources, {"mix_norms": None})["mix_norms"] == 2
    assert configured(sources, {"mix_norms": 1})["mix_norms"] == 1
    falcon = configured(transformers_code("falcon"), {"num_ln_in_parallel_attn": None,
                                                      "new_decoder_architecture": True})
    assert falcon["num_ln_in_parallel_attn"] == 2


def test_the_mlp_norm_reading_the_layer_input_makes_the_block_parallel():
    sources = {"modeling_tern.py": LAYER}
    side = dataflow.analyze_layer(sources, configured(sources, {"side_by_side": True, "mix_norms": None}), "blocks")
    assert side.norms == {"attn_norm": "pre_mix", "mlp_norm": "pre_ffn"} and side.mlp_norm_parallel is True
    # One norm only where the code sets two: the branch that adds the MLP after the attention.
    after = dataflow.analyze_layer(sources, {"side_by_side": True, "mix_norms": 1}, "blocks")
    assert after.norms == {"attn_norm": "pre_mix", "mlp_norm": "pre_ffn"} and after.mlp_norm_parallel is False
    assert dataflow.analyze_layer(sources, {"side_by_side": False, "mix_norms": 2},
                                  "blocks").mlp_norm_parallel is False


def test_falcons_new_decoder_reads_two_norms_side_by_side():
    code = transformers_code("falcon")
    config = {"new_decoder_architecture": True, "num_ln_in_parallel_attn": None, "parallel_attn": True}
    layer = dataflow.analyze_layer(code, configured(code, config), "h")
    assert layer.norms == {"attn_norm": "ln_attn", "mlp_norm": "ln_mlp"} and layer.mlp_norm_parallel is True


def test_an_alibi_bias_scaled_with_the_scores():
    assert alibi_scaled(transformers_code("falcon")) is not None  # (scores + alibi) * inv_norm_factor
    assert alibi_scaled(transformers_code("bloom")) is None  # baddbmm(alibi, q, k, beta=1.0, alpha=1/sqrt(d))
    assert alibi_scaled(transformers_code("mpt")) is None
    lab = textwrap.dedent('''
        def attend(q, k, bias_alibi, scale):
            logits = q @ k.transpose(-1, -2) + bias_alibi
            logits *= scale
            return logits
    ''')
    assert alibi_scaled({"modeling_lab.py": lab}).line == 4
