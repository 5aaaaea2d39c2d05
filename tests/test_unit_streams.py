"""Several copies of the residual stream handed through the decoder layers, read from what the model's forward
computes (the layer call's hidden states followed back to a stack or an expansion): Gemma-3n's AltUp and the
hyper-connections of DeepSeek-V4 / HY-V4 are refused by name before any form a layer computes on one copy is read;
one stream, or a stack the layers do not take, names nothing."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape
from helpers import LAB_PRELUDE, read, transformers_code

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import detect, streams
from scaffold.errors import UnsupportedArchitecture

LAB_BLOCKS = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.wq = nn.Linear(config.hidden_size, config.num_attention_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.num_attention_heads * config.head_dim, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        q, k = apply_rope(self.wq(x), self.wk(x), cos, sin)
        return self.wo(F.scaled_dot_product_attention(q, k, self.wv(x), attn_mask=mask))


class LabBlock(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = LabAttention(config, layer_idx)
        self.input_layernorm = LabRMSNorm(config.hidden_size)
        self.mix = nn.Linear(config.n_streams, config.n_streams, bias=False)

    def forward(self, streams, cos, sin, mask):
        lead = streams[0]
        lead = lead + self.self_attn(self.input_layernorm(lead), cos, sin, mask)
        return self.mix(torch.cat([lead[None], streams[1:]]).movedim(0, -1)).movedim(-1, 0)


'''

# A lab's AltUp written unlike Gemma-3n's: the copies a list literal built in one expression, the stack along
# axis 0 under torch.stack's keyword, the layers called by index and the copies summed at the end.
LAB_STACKED = LAB_BLOCKS + '''class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.hidden_size)
        self.widen = nn.ModuleList([nn.Linear(config.hidden_size, config.hidden_size) for _ in range(2)])
        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.num_hidden_layers)])
        self.final = LabRMSNorm(config.hidden_size)

    def forward(self, input_ids, cos, sin, mask):
        x = self.tok(input_ids)
        copies = torch.stack([x, self.widen[0](x), self.widen[1](x)], dim=0)
        h = copies
        for i in range(len(self.blocks)):
            h = self.blocks[i](h, cos, sin, mask)
        return self.final(h.sum(dim=0))
'''

# Hyper-connections written by a lab: one tensor unsqueezed at axis 0 and repeated (not expanded at axis 2), handed
# to the layers by keyword.
LAB_EXPANDED = LAB_BLOCKS + '''class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.hidden_size)
        self.n = config.n_streams
        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.num_hidden_layers)])

    def forward(self, input_ids, cos, sin, mask):
        h = self.tok(input_ids).unsqueeze(0).repeat(self.n, 1, 1, 1)
        for block in self.blocks:
            h = block(hidden_states=h, cos=cos, sin=sin, mask=mask)
        return h[0]
'''

# One stream; every layer's output stacked after the loop (the hidden states a model returns) is no copy.
LAB_ONE = LAB_BLOCKS + '''class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.num_hidden_layers)])

    def forward(self, input_ids, cos, sin, mask):
        h = self.tok(input_ids)
        scales = torch.stack([h.norm(), h.abs().max()])
        outs = []
        for block in self.blocks:
            h = block(h, cos, sin, mask)
            outs.append(h)
        return torch.stack(outs, dim=0).mean(dim=0), scales
'''


def test_gemma3n_stacks_its_altup_copies_and_averages_them_after_the_layers():
    found = streams.read(transformers_code("gemma3n"))
    assert found is not None and not found.expanded and found.model_cls == "Gemma3nTextModel"
    assert found.copies == "self.config.altup_num_inputs"
    assert found.code == "hidden_states = torch.stack(temp_hidden_states, dim=0)"
    assert found.merged.endswith(": torch.mean(hidden_states, dim=0)")
    assert str(found).startswith("alternating updates (AltUp): Gemma3nTextModel.forward stacks "
                                  "self.config.altup_num_inputs copies of the residual stream, which every")


@pytest.mark.parametrize("model", ["deepseek_v4", "hy_v4"])
def test_hyper_connections_expand_the_embedding_into_streams(model):
    found = streams.read(transformers_code(model))
    assert found is not None and found.expanded and found.copies == "self.config.hc_mult"
    assert str(found).startswith("hyper-connections: ") and "into self.config.hc_mult residual streams" in str(found)


@pytest.mark.parametrize("model", ["llama", "gemma4", "gemma3", "deepseek_v3", "longcat_flash"])
def test_one_residual_stream_names_nothing(model):
    assert streams.read(transformers_code(model)) is None


def test_a_lab_stack_and_a_lab_expansion_written_otherwise_are_read():
    stacked = streams.read({"modeling_lab.py": LAB_STACKED})
    assert stacked is not None and (stacked.copies, stacked.expanded) == ("3", False)
    assert stacked.code.startswith("copies = torch.stack([x, self.widen[0](x)")
    assert stacked.merged.endswith(": h.sum(dim=0)")
    expanded = streams.read({"modeling_lab.py": LAB_EXPANDED})
    assert expanded is not None and (expanded.copies, expanded.expanded, expanded.merged) == \
        ("self.n", True, None)


def test_a_stack_the_layers_do_not_take_names_nothing():
    assert streams.read({"modeling_lab.py": LAB_ONE}) is None


def test_detection_refuses_the_copies_by_name(tmp_path):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_streams", extra={"n_streams": 3})
    read(tmp_path, shape)
    (tmp_path / "modeling_lab.py").write_text(LAB_STACKED)
    with pytest.raises(UnsupportedArchitecture, match=r"alternating updates \(AltUp\): LabModel.forward stacks 3 "
                                                      r"copies of the residual stream, .*modeling_lab.py:\d+: "
                                                      r"copies = torch.stack"):
        detect(read_checkpoint(tmp_path))
