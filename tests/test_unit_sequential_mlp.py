"""An MLP built as nn.Sequential(Linear, activation module, Linear), read from the code (CTRL's ffn, built by
point_wise_feed_forward_network): its numbered children are the up and down projections, the activation is the
module between them, the width is the config value the builder is handed; the port calls the children by their
roles and maps the checkpoint's numbered names onto them on load. With it, CTRL's other forms: the embedding
scaled in place (`inputs_embeds *= np.sqrt(self.d_model_size)`) and the layer's norms built with an eps written as
a number.

The code read is real: transformers' own CTRL modeling file, a lab layer written otherwise (the Sequential built in
the layer's constructor, with a dropout, a GELU, other indices), and a tiny CTRL checkpoint built by transformers.
"""

from __future__ import annotations

import pytest
from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import dataflow
from scaffold.spec import Spec, port_names, renamed_substrings


def test_ctrl_ffn_is_a_plain_mlp_of_numbered_children():
    layer = dataflow.analyze_layer(transformers_code("ctrl"), {"n_embd": 128, "n_head": 4, "dff": 512})
    assert (layer.attention, layer.mlp) == ("multi_head_attention", "ffn")
    mlp = layer.mlp_flow
    assert (mlp.kind, mlp.up, mlp.down, mlp.activation) == ("plain", "0", "2", "relu")
    assert layer.norms == {"attn_norm": "layernorm1", "mlp_norm": "layernorm2"}


# A lab's layer: the Sequential built inline in the constructor, a dropout first (the indices shift), GELU.
LAB_LAYER = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.o_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True))


class LabBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = LabAttention(config)
        self.pre = nn.LayerNorm(config.hidden_size)
        self.post = nn.LayerNorm(config.hidden_size)
        self.feed = nn.Sequential(
            nn.Dropout(0.1),
            nn.Linear(config.hidden_size, config.ffn_width),
            ACTIVATION,
            nn.Linear(config.ffn_width, config.hidden_size),
        )

    def forward(self, x):
        x = x + self.attn(self.pre(x))
        return x + self.feed(self.post(x))


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.blocks = nn.ModuleList([LabBlock(config) for _ in range(config.num_hidden_layers)])
'''


def test_a_lab_sequential_built_in_the_layer_with_other_indices():
    sources = {"modeling_lab.py": LAB_LAYER.replace("ACTIVATION", "nn.GELU()")}
    layer = dataflow.analyze_layer(sources, {})
    mlp = layer.mlp_flow
    assert (layer.mlp, mlp.kind, mlp.up, mlp.down, mlp.activation) == ("feed", "plain", "1", "3", "gelu")
    assert layer.norms == {"attn_norm": "pre", "mlp_norm": "post"}


@pytest.mark.parametrize("activation", ["nn.Linear(config.ffn_width, config.ffn_width)", "Swish()"])
def test_a_sequential_of_another_shape_is_not_read_as_an_mlp(activation):
    """Three linears, or a module the reader does not know between them: no MLP is read (never a guess)."""
    sources = {"modeling_lab.py": LAB_LAYER.replace("ACTIVATION", activation)}
    layer = dataflow.analyze_layer(sources, {})
    assert layer.mlp is None and layer.mlp_flow is None


def test_numbered_children_are_called_by_their_roles_and_renamed_on_load():
    names = {"model": "transformer", "layers": "h", "mlp": "ffn", "up_proj": "0", "down_proj": "2",
             "self_attn": "attn", "attn_inner": "inner"}
    spec = Spec(names=names)
    assert port_names(names)["up_proj"] == "up_proj" and port_names(names)["down_proj"] == "down_proj"
    assert renamed_substrings(spec) == {".attn.inner.": ".attn.", ".ffn.0.": ".ffn.up_proj.",
                                        ".ffn.2.": ".ffn.down_proj."}
    # Names that are identifiers stay as they are.
    plain = {**names, "up_proj": "fc1", "down_proj": "fc2"}
    assert port_names(plain)["up_proj"] == "fc1" and ".ffn.fc1." not in renamed_substrings(Spec(names=plain))


@pytest.fixture(scope="module")
def ctrl_checkpoint(tmp_path_factory):
    from test_unit_gpt2_layouts import tiny

    from scaffold.checkpoint import read_checkpoint

    return read_checkpoint(tiny("ctrl", tmp_path_factory.mktemp("ctrl") / "ckpt", dff=320))


def test_ctrl_checkpoint_spec_and_weight_table(ctrl_checkpoint):
    from scaffold.detect import detect
    from scaffold.mapping import weight_table

    spec = detect(ctrl_checkpoint)
    assert (spec.names["mlp"], spec.names["up_proj"], spec.names["down_proj"]) == ("ffn", "0", "2")
    assert spec.intermediate_size == 320 and spec.source("intermediate_size").expr == "config.dff"
    assert spec.hidden_act == "relu" and spec.mlp_kind == "plain"
    assert spec.embedding_multiplier == pytest.approx(spec.hidden_size ** 0.5)
    assert spec.source("embedding_multiplier").expr == "(config.n_embd) ** 0.5"
    assert spec.position_scheme == "sinusoidal" and spec.sinusoid_shift == 0 and spec.position_offset == 0
    assert spec.norm_eps == 1e-6 and spec.source("norm_eps").kind == "code"
    rows, homeless = weight_table(spec, ctrl_checkpoint)
    assert not homeless
    loads = {r.checkpoint: r.param for r in rows}
    assert loads["transformer.h.1.ffn.0.weight"] == "transformer.h.1.ffn.up_proj.weight"
    assert loads["transformer.h.1.ffn.2.bias"] == "transformer.h.1.ffn.down_proj.bias"


def test_layer_norms_with_another_written_eps_are_refused(tmp_path):
    """CTRL's layers build their norms with eps=1e-6 written in the code; its final norm reads
    config.layer_norm_epsilon. Where the two differ, the port (one eps for every norm) would compute otherwise."""
    from test_unit_gpt2_layouts import tiny

    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import detect
    from scaffold.errors import UnsupportedArchitecture

    with pytest.raises(UnsupportedArchitecture, match=r"norms use eps=1e-06 written in the code \(.*modeling_ctrl"
                                                      r"\.py:\d+\), the other norms 1e-05"):
        detect(read_checkpoint(tiny("ctrl", tmp_path / "ckpt", layer_norm_epsilon=1e-5)))

