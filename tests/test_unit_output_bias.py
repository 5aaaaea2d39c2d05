"""An output bias the attention keeps as a parameter of its own and the decoder layer adds to the output
projection's result (GPT-NeoX-Japanese's dense_bias, on its last layer only): read from the code, with the layers
that hold it followed from the parameter's constructor condition to the config and the layer's index."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, tensors_for
from helpers import LAB_PRELUDE, detect_until, read, transformers_code

from scaffold.detect import layout, outbias
from scaffold.errors import UnsupportedArchitecture
from scaffold.mapping import weight_table


def test_gpt_neox_japanese_dense_bias_is_the_last_layers_output_bias():
    found = outbias.code_output_bias(transformers_code("gpt_neox_japanese"), {"num_hidden_layers": 4}, "layers",
                                     "dense", 4, [3], "dense_bias", "config.json", "gpt_neox_japanese")
    assert (found.param, found.layers, found.expr) == ("dense_bias", [3], "layer_idx == config.num_hidden_layers - 1")
    # Where it is made, returned and added (in bias_dropout_add, which the layer hands both to).
    assert "modeling_gpt_neox_japanese.py:159: self.dense_bias" in found.evidence
    assert "x + bias" in found.evidence


def test_gpt_neox_japanese_bias_on_a_layer_the_condition_excludes_is_refused():
    with pytest.raises(UnsupportedArchitecture, match=r"layers \[3\], but the checkpoint holds it in layers \[1\]"):
        outbias.code_output_bias(transformers_code("gpt_neox_japanese"), {"num_hidden_layers": 4}, "layers",
                                 "dense", 4, [1], "dense_bias", "config.json", "gpt_neox_japanese")


# A lab's attention written otherwise: separate projections, the bias made under an `if` block after a None
# default, returned first, and added by the layer itself under `if b is not None`, on the layers a config list names.
LAB_CODE = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config, index):
        super().__init__()
        self.d_head = config.hidden_size // config.num_attention_heads
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.shift = None
        if index in config.shifted_layers:
            self.shift = nn.Parameter(torch.zeros(config.hidden_size))

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        out = self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))
        return self.shift, out


class LabMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LabLayer(nn.Module):
    def __init__(self, config, number):
        super().__init__()
        self.self_attn = LabAttention(config, index=number)
        self.mlp = LabMLP(config)
        self.input_layernorm = LabRMSNorm(config.hidden_size)
        self.post_attention_layernorm = LabRMSNorm(config.hidden_size)

    def forward(self, x, cos, sin, mask):
        shift, attended = self.self_attn(self.input_layernorm(x), cos, sin, mask)
        if shift is not None:
            attended = attended + shift
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x))


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config, n) for n in range(config.num_hidden_layers)])
        self.norm = LabRMSNorm(config.hidden_size)
'''


def _lab_checkpoint(tmp_path, holding=(0, 2), code=LAB_CODE):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_shift", layers=3,
                  extra={"shifted_layers": [0, 2]})
    tensors = tensors_for(shape)
    for i in holding:
        tensors[f"model.layers.{i}.self_attn.shift"] = [shape.hidden]
    read(tmp_path, shape, tensors=tensors)
    (tmp_path / "modeling_lab.py").write_text(code)
    from scaffold.checkpoint import read_checkpoint

    return read_checkpoint(tmp_path)


def test_a_lab_output_bias_added_by_the_layer_is_read_and_loaded_as_o_projs_bias(tmp_path):
    ckpt = _lab_checkpoint(tmp_path)
    spec = detect_until(ckpt, layout)
    assert (spec.o_bias, spec.o_bias_param, spec.o_bias_layers) == (False, "shift", [0, 2])
    assert spec.source("o_bias_layers").expr == "layer_idx in config.shifted_layers"
    assert "modeling_lab.py" in spec.source("o_bias_param").detail
    rows, homeless = weight_table(spec, ckpt)
    assert not homeless
    assert {r.param for r in rows if r.checkpoint.endswith(".self_attn.shift")} == \
        {"model.layers.0.self_attn.o_proj.bias", "model.layers.2.self_attn.o_proj.bias"}


def test_a_lab_bias_added_after_the_output_is_changed_is_not_an_output_bias(tmp_path):
    """Scaled before the bias is added, or added to something else: the parameter has no home; refused."""
    scaled = LAB_CODE.replace("            attended = attended + shift",
                              "            attended = attended * 2\n            attended = attended + shift")
    with pytest.raises(UnsupportedArchitecture, match=r"no home in the port|no part of the port computes with"):
        detect_until(_lab_checkpoint(tmp_path / "scaled", code=scaled), layout)
    elsewhere = LAB_CODE.replace("attended = attended + shift", "x = x + shift")
    with pytest.raises(UnsupportedArchitecture, match=r"no home in the port|no part of the port computes with"):
        detect_until(_lab_checkpoint(tmp_path / "elsewhere", code=elsewhere), layout)


def test_a_lab_bias_on_layers_the_condition_does_not_select_is_refused(tmp_path):
    with pytest.raises(UnsupportedArchitecture, match=r"layers \[0, 2\], but the checkpoint holds it in layers \[1\]"):
        detect_until(_lab_checkpoint(tmp_path, holding=(1,)), layout)
