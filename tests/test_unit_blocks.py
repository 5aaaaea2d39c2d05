"""Attention forms the port refuses, named from the code: a block around the attention that also holds the layer's
norms where the inlining of scaffold.detect.nested does not follow it, and differential attention (DiffLlama's weighted difference of two attentions)."""

from __future__ import annotations

from types import SimpleNamespace

from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import blocks


def _layer0(shapes: dict) -> dict:
    return {name: SimpleNamespace(shape=shape) for name, shape in shapes.items()}


DBRX_LAYER0 = _layer0({"norm_attn_norm.norm_1.weight": [128], "norm_attn_norm.attn.Wqkv.weight": [256, 128],
                       "norm_attn_norm.attn.out_proj.weight": [128, 128], "norm_attn_norm.norm_2.weight": [128],
                       "ffn.router.layer.weight": [4, 128], "ffn.experts.mlp.w1": [256, 128],
                       "ffn.experts.mlp.v1": [256, 128], "ffn.experts.mlp.w2": [256, 128]})


DBRX_CONFIG = {"d_model": 128, "attn_config": {"kv_n_heads": 2, "clip_qkv": None, "attn_pdrop": 0.0},
               "ffn_config": {"ffn_hidden_size": 64, "hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2,
                              "moe_normalize_expert_weights": 1.0}}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(code.splitlines(), 1) if text in line)


# A lab's layer written otherwise: its block is called `pre`, its norms ln_a / ln_b, its attention `mix` with
# separate projections, and it hands back the sum and the normed sum, computed in a method of its own: a block the
# inlining does not follow (scaffold.detect.nested; DBRX's is inlined and ported: tests/test_unit_nested.py).
LAB_BLOCK = "\n" + LAB_PRELUDE + '''class LabMix(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wq = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, mask):
        return self.wo(F.scaled_dot_product_attention(self.wq(x), self.wk(x), self.wv(x), attn_mask=mask))


class LabPre(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_a = LabRMSNorm(config.hidden_size)
        self.mix = LabMix(config)
        self.ln_b = LabRMSNorm(config.hidden_size)

    def forward(self, x, mask):
        summed = self.attend(x, mask)
        return summed, self.ln_b(summed)

    def attend(self, x, mask):
        return x + self.mix(self.ln_a(x), mask)


class LabLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.pre = LabPre(config)
        self.ff = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x, mask):
        kept, normed = self.pre(x, mask)
        return kept + self.ff(normed)


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.stack = nn.ModuleList([LabLayer(config) for _ in range(config.num_hidden_layers)])
'''
LAB_LAYER0 = _layer0({"pre.ln_a.weight": [64], "pre.ln_b.weight": [64], "ff.weight": [64, 64],
                      **{f"pre.mix.{p}.weight": [64, 64] for p in ("wq", "wk", "wv", "wo")}})


def test_a_lab_block_around_the_attention_holding_norms_is_named():
    found = blocks.norm_attention_block({"modeling_lab.py": LAB_BLOCK}, "stack", LAB_LAYER0)
    assert "the layer norms: pre (LabPre, modeling_lab.py:" in found
    assert "holds ln_a, ln_b beside mix (wk, wo, wq, wv) and returns 2 tensors" in found
    assert "Behind it" not in found  # separate projections, sizes in the top-level config


def test_a_wrapper_without_norms_or_returning_one_tensor_is_not_that_block():
    """GPT-Neo's kind of wrapper (no norm, one output) and a block whose norms return nothing else are not named."""
    one = LAB_BLOCK.replace("return summed, self.ln_b(summed)", "return self.ln_b(summed)")
    assert one != LAB_BLOCK
    assert blocks.norm_attention_block({"modeling_lab.py": one}, "stack", LAB_LAYER0) is None
    no_norms = LAB_BLOCK.replace("LabRMSNorm(config.hidden_size)\n        self.mix",
                                 "nn.Identity()\n        self.mix").replace(
        "self.ln_b = LabRMSNorm(config.hidden_size)", "self.ln_b = nn.Identity()")
    assert blocks.norm_attention_block({"modeling_lab.py": no_norms}, "stack", LAB_LAYER0) is None
    assert blocks.norm_attention_block(transformers_code("gpt_neo"), "h", _layer0(
        {"attn.attention.q_proj.weight": [64, 64]})) is None


DIFF_STRAY = ["lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"]


def test_diffllama_differential_attention_is_named_with_its_line():
    found = blocks.differential_attention(transformers_code("diffllama"), "DiffLlamaAttention", DIFF_STRAY)
    assert found.startswith("differential attention: two attention outputs subtracted, the second weighted by a "
                            "value computed from the attention's own parameters (lambda_k1, lambda_k2, lambda_q1, "
                            "lambda_q2): ")
    assert "modeling_diffllama.py:307: attn_output = attn_output1 - lambda_full * attn_output2" in found


# A lab's differential attention written otherwise: one parameter, a sigmoid weight, the weighted map on the right.
LAB_DIFF = "\n" + LAB_PRELUDE + '''class LabDiff(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.mixing = nn.Parameter(torch.zeros(1))

    def forward(self, x, mask):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        first = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        second = F.scaled_dot_product_attention(q, -k, v, attn_mask=mask)
        w = torch.sigmoid(self.mixing)
        both = first - second * w
        return self.out(both)
'''


def test_a_lab_differential_attention_is_named_and_a_plain_difference_is_not():
    found = blocks.differential_attention({"modeling_lab.py": LAB_DIFF}, "LabDiff", ["mixing"])
    assert found.startswith("differential attention") and "(mixing): modeling_lab.py:" in found
    assert "both = first - second * w" in found
    # A weight that is no parameter of the attention's own, or a parameter the checkpoint does not hold apart.
    plain = LAB_DIFF.replace("w = torch.sigmoid(self.mixing)", "w = 0.5")
    assert blocks.differential_attention({"modeling_lab.py": plain}, "LabDiff", ["mixing"]) is None
    assert blocks.differential_attention({"modeling_lab.py": LAB_DIFF}, "LabDiff", []) is None
