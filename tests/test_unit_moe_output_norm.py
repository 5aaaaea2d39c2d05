"""A norm the MoE block applies to what it returns (A.X-K1's post_mlp_layernorm over the routed and shared experts'
sum): read from the block's code, its tensors found where the checkpoint keeps them (on the decoder layer, renamed
into the block by transformers' conversion table, or in the block), built as the layer's norms are."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape
from helpers import LAB_PRELUDE, detect_until, moe_tensors, read

from scaffold.detect import detect, layout
from scaffold.errors import UnsupportedArchitecture
from scaffold.mapping import weight_table
from scaffold.spec import renamed_suffixes

# A lab's MoE block written otherwise than A.X-K1's: experts in a ModuleList, softmax top-k routing in the block's
# own forward, no shared expert, and the norm (called out_norm) applied to the weighted sum it returns.
LAB_CODE = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.d_head = config.hidden_size // config.num_attention_heads
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))


class LabExpert(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.moe_intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.moe_intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.moe_intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LabSparse(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.k = config.num_experts_per_tok
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList([LabExpert(config) for _ in range(config.num_experts)])
        self.out_norm = LabRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x):
        probs = self.gate(x).softmax(dim=-1)
        weights, chosen = probs.topk(self.k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        mixed = torch.zeros_like(x)
        for slot in range(self.k):
            for e, expert in enumerate(self.experts):
                hit = (chosen[..., slot] == e).unsqueeze(-1)
                mixed = mixed + hit * weights[..., slot, None] * expert(x)
        return self.out_norm(mixed)


class LabLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = LabAttention(config)
        self.mlp = LabSparse(config)
        self.input_layernorm = LabRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LabRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = LabRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
'''


def _lab_checkpoint(tmp_path, code=LAB_CODE, norm_width=None):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_moe_norm", layers=2,
                  extra={"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32})
    tensors = moe_tensors(shape, experts=4, inter=32)
    for i in range(shape.layers):
        tensors[f"model.layers.{i}.mlp.out_norm.weight"] = [norm_width or shape.hidden]
    read(tmp_path, shape, tensors=tensors)
    (tmp_path / "modeling_lab.py").write_text(code)
    from scaffold.checkpoint import read_checkpoint

    return read_checkpoint(tmp_path)


def test_a_lab_blocks_output_norm_is_read_and_kept_in_the_block(tmp_path):
    ckpt = _lab_checkpoint(tmp_path)
    spec = detect(ckpt)
    assert (spec.moe_output_norm, spec.moe_output_norm_on_layer) == ("out_norm", False)
    assert "LabSparse returns self.out_norm(...) of its output" in spec.source("moe_output_norm").detail
    rows, homeless = weight_table(spec, ckpt)
    assert not homeless
    assert "model.layers.1.mlp.out_norm.weight" in {r.param for r in rows}
    assert not any("out_norm" in old for old in renamed_suffixes(spec))  # in the block already: no renaming


def test_a_blocks_output_norm_built_otherwise_than_the_layers_norms_is_refused(tmp_path):
    odd = LAB_CODE.replace("self.out_norm = LabRMSNorm(config.hidden_size, eps=config.rms_norm_eps)",
                           "self.out_norm = nn.LayerNorm(config.hidden_size)")
    with pytest.raises(UnsupportedArchitecture, match=r"a norm on the MoE block's output .* built as LayerNorm"):
        detect_until(_lab_checkpoint(tmp_path, code=odd), layout)


def test_a_blocks_output_norm_of_another_width_is_refused(tmp_path):
    with pytest.raises(UnsupportedArchitecture, match=r"not of the model's width"):
        detect_until(_lab_checkpoint(tmp_path, norm_width=32), layout)


def test_a_norm_the_block_does_not_return_is_not_its_output_norm(tmp_path):
    """Applied to the input instead: the tensor is no output norm, and nothing else computes with it."""
    odd = LAB_CODE.replace("        probs = self.gate(x).softmax(dim=-1)",
                           "        x = self.out_norm(x)\n        probs = self.gate(x).softmax(dim=-1)")
    odd = odd.replace("return self.out_norm(mixed)", "return mixed")
    with pytest.raises(UnsupportedArchitecture, match=r"no part of the port computes with"):
        detect_until(_lab_checkpoint(tmp_path, code=odd), layout)


def test_axk1_keeps_its_norm_on_the_layer_and_the_port_renames_it_into_the_block(tmp_path):
    """transformers' A.X-K1: the checkpoint's layer-level post_mlp_layernorm is the block's (conversion_mapping.py's
    WeightRenaming), on its MoE layers only."""
    from catalogue import overrides_for  # the catalogue's tiny sizes

    from scaffold.tiny import build_tiny

    ckpt_dir = tmp_path / "axk1"
    build_tiny("axk1", str(ckpt_dir), architecture="CatalogueAXK1ForCausalLM", overrides=overrides_for("axk1"))
    from scaffold.checkpoint import read_checkpoint

    ckpt = read_checkpoint(ckpt_dir)
    spec = detect(ckpt)
    assert (spec.moe_output_norm, spec.moe_output_norm_on_layer) == ("post_mlp_layernorm", True)
    assert spec.dense_layers == [0]
    assert renamed_suffixes(spec)[".post_mlp_layernorm.weight"] == ".mlp.post_mlp_layernorm.weight"
    rows, homeless = weight_table(spec, ckpt)
    assert not homeless
    assert {r.param for r in rows if r.checkpoint.endswith("post_mlp_layernorm.weight")} == \
        {f"model.layers.{i}.mlp.post_mlp_layernorm.weight" for i in range(1, spec.num_layers)}
