"""detect/gatednorm.py: a decoder layer's norm whose output is gated by a small MLP of that output (A.X-K2's
AXK2GatedRMSNorm: y = norm(x); y * sigmoid(fc2(silu(fc1(y)))), built on input_layernorm in every layer and on
post_attention_layernorm in the sparse layers only). Read from transformers' file and from a lab module written
otherwise: the gate's linears held by the norm itself, the product written gate-first, the width passed as a
parameter from the config, the condition an if/else statement over another config key; the spec the layout
detector records from a lab checkpoint, and the forms it refuses by name."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, tensors_for
from helpers import LAB_PRELUDE, detect_until, read, transformers_code

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import gatednorm, layout, sizes
from scaffold.errors import UnsupportedArchitecture

# A lab's gated norm: its own names (ln, squeeze, expand), the linears on the norm itself, the width a parameter.
LAB_GATED_NORM = '''class LabGatedNorm(nn.Module):
    def __init__(self, dim, rank):
        super().__init__()
        self.ln = LabRMSNorm(dim)
        self.squeeze = nn.Linear(dim, rank, bias=False)
        self.expand = nn.Linear(rank, dim, bias=False)

    def forward(self, x):
        h = self.ln(x)
        g = self.expand(F.silu(self.squeeze(h)))
        return torch.sigmoid(g) * h


'''

LAB_LAYER = '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.d_head = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.d_head, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))


class LabMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LabLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = LabAttention(config, layer_idx)
        self.mlp = LabMLP(config)
        self.input_layernorm = LabGatedNorm(config.hidden_size, config.norm_gate_rank)
        if layer_idx < config.gated_from:
            self.post_attention_layernorm = LabRMSNorm(config.hidden_size)
        else:
            self.post_attention_layernorm = LabGatedNorm(config.hidden_size, config.norm_gate_rank)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = LabRMSNorm(config.hidden_size)
'''

LAB_CODE = "\n" + LAB_PRELUDE + LAB_GATED_NORM + LAB_LAYER
RANK = 4


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(code.splitlines(), 1) if text in line)


def test_transformers_axk2_gated_norms_are_read_with_their_condition_and_gate():
    found = gatednorm.read(transformers_code("axk2"), {"mlp_layer_types": ["dense", "sparse", "sparse"]}, None, 3)
    assert found.attrs == ("input_layernorm", "post_attention_layernorm")
    assert found.conditional == ("post_attention_layernorm",)
    assert found.condition == "config.mlp_layer_types[layer_idx] == 'sparse'"
    assert found.layers == {"input_layernorm": [0, 1, 2], "post_attention_layernorm": [1, 2]}
    assert (found.parts, found.mlp_act, found.gate_act, found.rank) == (
        ("norm", "mlp", "fc1", "fc2"), "silu", "sigmoid", "config.gated_norm_rank")
    assert "modeling_axk2.py:100: self.norm(x) * sigmoid(self.mlp(self.norm(x)))" in found.evidence
    # The MLP's width is read from the classes the decoder layer builds as its mlp (AXK2MoE, AXK2MLP), not from
    # the gate's AXK2GateMLP (self.mlp of the gated norm, gated_norm_rank wide): AXK2MLP's width is
    # `config.intermediate_size if intermediate_size is None else intermediate_size`, no one config expression,
    # so the size detector takes config.json's intermediate_size.
    code = transformers_code("axk2")
    assert sizes._mlp_classes(code) == {"AXK2MoE", "AXK2MLP"}
    assert sizes._mlp_width(code, _Hidden(), {"intermediate_size": 48, "gated_norm_rank": 16}, {}) is None


class _Hidden:
    """The part of a spec _mlp_width reads: where hidden_size and num_heads come from."""

    def source(self, field):
        return type("S", (), {"expr": {"hidden_size": "config.hidden_size",
                                       "num_heads": "config.num_attention_heads"}[field]})()


def test_a_lab_gated_norm_written_otherwise_is_read_and_plain_norms_are_not():
    config = {"gated_from": 1}
    found = gatednorm.read({"modeling_lab.py": LAB_CODE}, config, None, 3)
    assert found.attrs == ("input_layernorm", "post_attention_layernorm")
    assert found.condition == "layer_idx >= config.gated_from"  # the else branch builds the gated class
    assert found.layers == {"input_layernorm": [0, 1, 2], "post_attention_layernorm": [1, 2]}
    assert (found.parts, found.mlp_act, found.rank) == (("ln", "", "squeeze", "expand"), "silu",
                                                         "config.norm_gate_rank")
    assert f"modeling_lab.py:{_line(LAB_CODE, 'return torch.sigmoid(g) * h')}" in found.evidence
    plain = LAB_CODE.replace("LabGatedNorm(config.hidden_size, config.norm_gate_rank)",
                             "LabRMSNorm(config.hidden_size)")
    assert gatednorm.read({"modeling_lab.py": plain}, config, None, 3) is None


@pytest.mark.parametrize(("old", "new", "message"), [
    ("self.squeeze = nn.Linear(dim, rank, bias=False)", "self.squeeze = nn.Linear(dim, rank)", "with a bias"),
    ("return torch.sigmoid(g) * h", "return torch.tanh(g) * h", "gates by tanh, not a sigmoid"),
    ("self.ln = LabRMSNorm(dim)", "self.ln = nn.LayerNorm(dim)",
     "normalizes with LayerNorm, not the class the model builds its own final norm with"),
    ("g = self.expand(F.silu(self.squeeze(h)))", "g = self.expand(self.squeeze(h))",
     r"modeling_lab.py:\d+\) gates the norm's output by something other than a small MLP"),
])
def test_gated_norms_in_other_forms_are_refused_naming_the_line(old, new, message):
    code = LAB_CODE.replace(old, new)
    assert code != LAB_CODE
    with pytest.raises(gatednorm.Refused, match=message):
        gatednorm.read({"modeling_lab.py": code}, {"gated_from": 1}, None, 3)


def _lab_checkpoint(tmp_path, code=LAB_CODE, gated=(0, 1, 2), extra_tensor=None):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_gated_norm", layers=3,
                  extra={"gated_from": 1, "norm_gate_rank": RANK})
    tensors = tensors_for(shape)
    for i in range(shape.layers):
        for attr in ("input_layernorm", "post_attention_layernorm"):
            if attr == "input_layernorm" or i in gated[1:]:
                p = f"model.layers.{i}.{attr}"
                tensors[f"{p}.ln.weight"] = tensors.pop(f"{p}.weight")
                tensors[f"{p}.squeeze.weight"] = [RANK, shape.hidden]
                tensors[f"{p}.expand.weight"] = [shape.hidden, RANK]
    if extra_tensor:
        tensors.update(extra_tensor)
    read(tmp_path, shape, tensors=tensors)
    (tmp_path / "modeling_lab.py").write_text(code)
    return read_checkpoint(tmp_path)


def test_the_spec_records_the_gated_norms_under_the_checkpoints_names(tmp_path):
    spec = detect_until(_lab_checkpoint(tmp_path), layout)
    assert (spec.gated_norms, spec.gated_norms_conditional) == (["input_layernorm"], ["post_attention_layernorm"])
    assert (spec.gated_norm_condition, spec.gated_norm_layers) == ("layer_idx >= config.gated_from", [1, 2])
    assert (spec.gated_norm_parts, spec.gated_norm_acts) == (["ln", "", "squeeze", "expand"], ["silu", "sigmoid"])
    assert spec.gated_norm_rank == "config.norm_gate_rank"
    assert (spec.block, spec.norm_kind) == ("pre_norm", "rms")
    assert "modeling_lab.py:" in spec.source("gated_norms").detail


def test_a_checkpoint_whose_gated_layers_differ_from_the_code_is_refused(tmp_path):
    with pytest.raises(UnsupportedArchitecture, match=r"layer 0 holds a gated norm's tensors at "
                                                      r"model.layers.0.post_attention_layernorm"):
        detect_until(_lab_checkpoint(tmp_path, gated=(0, 0, 1, 2)), layout)
