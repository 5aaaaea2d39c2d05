"""Gated attention read from what the attention's code computes: a projection of the attention's input whose
activation scales the attention output before the output projection (AfMoE's gate_proj, Laguna's g_proj), one
value per output element or per head; and a rotary embedding the code applies on some layers only."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, tensors_for
from helpers import LAB_DECODER, LAB_PRELUDE, detect_until, read, transformers_code

from scaffold.detect import dataflow, layout, rope
from scaffold.errors import UnsupportedArchitecture

# A lab's attention written unlike AfMoE's: its own names, the gate per head (one row per head), softplus through
# torch.nn.functional, the context viewed per head and multiplied by the gate broadcast over each head's dims, and
# the rotary embedding skipped on the layers config.rope_layers marks false.
LAB_CODE = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.d_head = config.head_dim
        self.positional = config.rope_layers[layer_idx]
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.headwise = nn.Linear(config.hidden_size, self.n_heads, bias=True)
        self.o_proj = nn.Linear(self.n_heads * self.d_head, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        if self.positional:
            q, k = apply_rope(q, k, cos, sin)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        ctx = ctx.transpose(1, 2)
        weights = F.softplus(self.headwise(x))
        ctx = ctx * weights[..., None]
        return self.o_proj(ctx.reshape(b, t, -1))


''' + LAB_DECODER


def test_a_per_head_gate_under_another_name_is_read_from_the_dataflow():
    attention = dataflow.analyze_layer({"modeling_lab.py": LAB_CODE}, {"rope_layers": [True, False]}).attention_flow
    assert (attention.q, attention.o, attention.output_gate, attention.output_gate_act) == \
        ("q_proj", "o_proj", "headwise", "softplus")
    line = next(i for i, text in enumerate(LAB_CODE.splitlines(), 1) if "ctx = ctx * weights" in text)
    assert attention.output_gate_evidence == f"modeling_lab.py:{line}"
    # The rotary embedding runs under `if self.positional:`, set from a config list indexed by the layer.
    assert attention.rotary_guard == "config.rope_layers[layer_idx]" and attention.rotary_guard_when is True


def _lab_checkpoint(tmp_path, gate_rows=None, code=LAB_CODE):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_gated", layers=2,
                  extra={"rope_layers": [True, False]})
    tensors = tensors_for(shape)
    for i in range(shape.layers):
        tensors[f"model.layers.{i}.self_attn.headwise.weight"] = [gate_rows or shape.heads, shape.hidden]
        tensors[f"model.layers.{i}.self_attn.headwise.bias"] = [gate_rows or shape.heads]
    read(tmp_path, shape, tensors=tensors)  # writes the checkpoint; read again below, with the code beside it
    (tmp_path / "modeling_lab.py").write_text(code)
    from scaffold.checkpoint import read_checkpoint

    return read_checkpoint(tmp_path), shape


def test_the_gate_is_per_head_by_its_rows_with_its_activation_and_bias(tmp_path):
    ckpt, _ = _lab_checkpoint(tmp_path)
    spec = detect_until(ckpt, rope)
    assert spec.names["attn_gate"] == "headwise"
    assert (spec.attn_output_gate, spec.attn_gate_act, spec.attn_gate_bias) == ("per_head", "softplus", True)
    assert "headwise.weight has 4 rows: one per head" in spec.source("attn_output_gate").detail
    # Layer 1 skips the rotary embedding; the port reads the code's own condition at run time.
    assert spec.no_rope_layers == [1]
    assert spec.source("no_rope_layers").expr == "config.rope_layers[layer_idx]"


def test_a_gate_with_one_row_per_output_element_is_elementwise(tmp_path):
    ckpt, _ = _lab_checkpoint(tmp_path, gate_rows=4 * 16)
    assert detect_until(ckpt, layout).attn_output_gate == "elementwise"


def test_a_gate_of_another_height_or_an_unnamed_activation_is_refused(tmp_path):
    ckpt, _ = _lab_checkpoint(tmp_path / "odd", gate_rows=8)
    with pytest.raises(UnsupportedArchitecture, match=r"gated attention .*headwise.weight of shape \[8, 64\]"):
        detect_until(ckpt, layout)
    odd = LAB_CODE.replace("F.softplus(self.headwise(x))", "F.softplus(self.headwise(x), beta=2.0)")
    ckpt, _ = _lab_checkpoint(tmp_path / "beta", code=odd)
    with pytest.raises(UnsupportedArchitecture, match=r"activation the reader does not name"):
        detect_until(ckpt, layout)


def test_a_rotary_condition_the_config_does_not_decide_per_layer_is_refused(tmp_path):
    odd = LAB_CODE.replace("self.positional = config.rope_layers[layer_idx]",
                           "self.positional = layer_idx % config.rope_period")  # a key config.json does not hold
    ckpt, _ = _lab_checkpoint(tmp_path, code=odd)
    with pytest.raises(UnsupportedArchitecture, match=r"rotary embedding applied under a condition"):
        detect_until(ckpt, rope)


def test_a_rotary_condition_of_integer_arithmetic_on_the_layer_index_is_decided(tmp_path):
    """`layer_idx % 3` (true where it is not 0): decided per layer, and read by the port at run time."""
    odd = LAB_CODE.replace("self.positional = config.rope_layers[layer_idx]", "self.positional = layer_idx % 3")
    ckpt, _ = _lab_checkpoint(tmp_path / "mod", code=odd)
    spec = detect_until(ckpt, rope)
    assert spec.no_rope_layers == [0] and spec.source("no_rope_layers").expr == "layer_idx % 3"


def test_afmoe_rotates_its_sliding_layers_only():
    config = {"num_dense_layers": 1, "layer_types": ["sliding_attention", "full_attention"]}
    attention = dataflow.analyze_layer(transformers_code("afmoe"), config).attention_flow
    assert attention.rotary_guard == "config.layer_types[layer_idx] == 'sliding_attention'"
    assert (attention.output_gate, attention.output_gate_act) == ("gate_proj", "sigmoid")


def test_laguna_gate_is_read_and_its_per_layer_head_counts_are_named():
    """Laguna: F.softplus(self.g_proj(x)) on each head (or element); its decoder layer builds each attention
    with config.num_attention_heads_per_layer[layer_idx], the key the port reads each layer's heads from."""
    sources = transformers_code("laguna")
    flow = dataflow.analyze_layer(sources, {"gating": True})
    assert (flow.attention_flow.output_gate, flow.attention_flow.output_gate_act) == ("g_proj", "softplus")
    found = layout._per_layer_attention_argument(sources, flow, flow.attention)
    assert found.key == "num_attention_heads_per_layer"
    assert str(found).startswith("config.num_attention_heads_per_layer[layer_idx] (modeling_laguna.py:")
    assert layout._per_layer_attention_argument(transformers_code("afmoe"),
                                                dataflow.analyze_layer(transformers_code("afmoe"), {}),
                                                "self_attn") is None
