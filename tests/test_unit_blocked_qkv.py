"""A fused q/k/v projection cut in row blocks, read by the dataflow (scaffold.detect.dataflow): CodeGen views its
qkv_proj output as [..., mp_num = 4, -1] and cuts each block into q, v, k parts along the last axis.

The code read is real: transformers' own CodeGen modeling file, and a lab attention written otherwise (unflatten
instead of reshape, chunk instead of split, another block count and part order).
"""

from __future__ import annotations

import ast

import pytest
from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import dataflow


def test_codegen_qkv_read_as_four_blocks_of_q_v_k():
    config = {"n_embd": 128, "n_head": 4, "rotary_dim": 16, "n_layer": 2}
    layer = dataflow.analyze_layer(transformers_code("codegen"), config)
    attn = layer.attention_flow
    assert (attn.layout, attn.q, attn.qkv_blocks, attn.qkv_block_order, attn.o) == (
        "blocked", "qkv_proj", 4, "qvk", "out_proj")


# A lab's attention: two blocks made by unflatten, each chunked into k, q, v (in that order) along the last axis.
LAB_BLOCKS = "\n" + LAB_PRELUDE + '''class BlockAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.dh = config.hidden_size // config.num_attention_heads
        self.wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        shards = SHARDS
        fused = self.wqkv(x).unflatten(-1, (shards, -1))
        k, q, v = fused.chunk(3, dim=CUT_AXIS)
        q = q.reshape(b, t, self.heads, self.dh).transpose(1, 2)
        k = k.reshape(b, t, self.heads, self.dh).transpose(1, 2)
        v = v.reshape(b, t, self.heads, self.dh).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, t, -1))
'''


def _lab_attention(shards: str, axis: str) -> dataflow.Attention:
    text = LAB_BLOCKS.replace("SHARDS", shards).replace("CUT_AXIS", axis)
    cls = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef) and n.name == "BlockAttention")
    return dataflow.analyze_attention({"modeling_lab.py": text}, "modeling_lab.py", cls, {})


def test_a_lab_attention_in_two_blocks_of_k_q_v():
    attn = _lab_attention("2", "-1")
    assert (attn.layout, attn.q, attn.qkv_blocks, attn.qkv_block_order, attn.o) == ("blocked", "wqkv", 2, "kqv",
                                                                                    "proj")


@pytest.mark.parametrize("shards, axis", [("2", "-2"), ("config.blocks", "-1")])
def test_blocks_the_code_does_not_fix_are_not_read_as_blocks(shards, axis):
    """A cut across the blocks (dim -2) or a block count the code does not write as a number is no blocked
    layout: the attention's q, k and v stay undecided rather than guessed."""
    with pytest.raises(dataflow.Undecided):
        _lab_attention(shards, axis)
