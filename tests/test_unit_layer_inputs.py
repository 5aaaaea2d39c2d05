"""Per-layer input embeddings (Gemma 3n's and Gemma 4's PLE) are refused by name, read from what the code computes:
a second embedding of the token ids whose output reaches each decoder layer call beside the hidden states."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, tensors_for
from helpers import LAB_PRELUDE, transformers_code

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import layerinputs, policy
from scaffold.errors import UnsupportedArchitecture

GEMMA_TABLE = ["model.embed_tokens.weight", "model.embed_tokens_per_layer.weight"]


@pytest.mark.parametrize("model, model_cls, table_cls", [
    ("gemma4", "Gemma4TextModel", "Gemma4TextScaledWordEmbedding"),
    ("gemma3n", "Gemma3nTextModel", "Gemma3nTextScaledWordEmbedding"),
])
def test_transformers_per_layer_embeddings_are_found(model, model_cls, table_cls):
    found = layerinputs.per_layer_inputs(transformers_code(model), GEMMA_TABLE)
    assert found is not None
    assert (found.model_cls, found.table, found.table_cls, found.stream) == (
        model_cls, "embed_tokens_per_layer", table_cls, "embed_tokens")
    assert found.argument == "per_layer_input"
    assert f"modeling_{model}.py:" in found.table_where and f"modeling_{model}.py:" in found.call_where
    assert str(found).startswith(f"per-layer input embeddings: {model_cls} builds embed_tokens_per_layer")


def test_a_table_the_checkpoint_does_not_hold_is_not_one():
    # Gemma 4 builds the table only where config.hidden_size_per_layer_input is set: no tensor, no form.
    assert layerinputs.per_layer_inputs(transformers_code("gemma4"), ["model.embed_tokens.weight"]) is None


def test_position_embeddings_added_to_the_stream_are_not_per_layer_inputs():
    # GPT-2 adds wpe to wte's output: both reach the hidden states, the layers take nothing else from them.
    assert layerinputs.per_layer_inputs(transformers_code("gpt2"), ["transformer.wte.weight",
                                                                    "transformer.wpe.weight"]) is None


# A lab's backbone written otherwise: its tables are `tok` and `side` (a subclass of a subclass of nn.Embedding),
# its stack `blocks`; a method of its own reshapes the side table's lookup and mixes a projection of the token
# embedding into it, and each block is indexed from the stack and takes its slice by keyword.
LAB_SIDE = "\n" + LAB_PRELUDE + '''class LabTable(nn.Embedding):
    pass


class LabSideTable(LabTable):
    def forward(self, ids):
        return super().forward(ids) * 2.0


class LabBlock(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        self.wq = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.gate = nn.Linear(config.hidden_size, 8, bias=False)
        self.back = nn.Linear(8, config.hidden_size, bias=False)

    def forward(self, x, side=None):
        return x + self.back(F.gelu(self.gate(x)) * side)


class LabBackbone(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.hidden_size)
        self.side = LabSideTable(config.vocab_size, config.num_hidden_layers * 8)
        self.mix = nn.Linear(config.hidden_size, config.num_hidden_layers * 8, bias=False)
        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.num_hidden_layers)])
        self.final = LabRMSNorm(config.hidden_size)

    def _sides(self, ids, x):
        looked_up = self.side(ids).unflatten(-1, (len(self.blocks), 8))
        return looked_up + self.mix(x).unflatten(-1, (len(self.blocks), 8))

    def forward(self, ids):
        x = self.tok(ids)
        sides = self._sides(ids, x)
        for idx in range(len(self.blocks)):
            x = self.blocks[idx](x, side=sides[:, :, idx])
        return self.final(x)
'''


def test_a_lab_side_table_handed_to_each_block_is_named():
    found = layerinputs.per_layer_inputs({"modeling_lab.py": LAB_SIDE}, ["model.tok.weight", "model.side.weight"])
    assert found is not None
    assert (found.model_cls, found.table, found.table_cls, found.stream) == (
        "LabBackbone", "side", "LabSideTable", "tok")
    assert found.argument == "side=sides[:, :, idx]"
    # The same backbone adding the side table's lookup into the stream (a position-like table): not a layer input.
    added = LAB_SIDE.replace("        sides = self._sides(ids, x)\n",
                             "        sides = self._sides(ids, x)\n        x = x + sides.flatten(-2)[..., :1]\n")
    assert layerinputs.per_layer_inputs({"modeling_lab.py": added}, ["model.tok.weight", "model.side.weight"]) is None


def test_the_policy_passes_a_gemma4_checkpoint_whose_form_the_port_computes(tmp_path):
    # Gemma 4's per-layer inputs are ported (scaffold.detect.layerinputs.read): the policy no longer refuses them.
    from ckpt_factory import write_checkpoint

    shape = Shape(model_type="gemma4_text", layers=2, extra={"per_layer_config": {}, "hidden_size_per_layer_input": 8,
                                                            "vocab_size_per_layer_input": 64,
                                                            "hidden_activation": "gelu_pytorch_tanh"})
    tensors = tensors_for(shape)
    tensors["model.embed_tokens_per_layer.weight"] = [64, 2 * 8]
    write_checkpoint(tmp_path, shape, tensors=tensors)
    policy.check(read_checkpoint(tmp_path))
    # Without hidden_size_per_layer_input in config.json the reader cannot tell the slices' width: refused by name.
    shape.extra.pop("hidden_size_per_layer_input")
    write_checkpoint(tmp_path, shape, tensors=tensors)
    with pytest.raises(UnsupportedArchitecture, match=r"per-layer input embeddings computed otherwise than the port "
                                                      r"computes them \(transformers/models/gemma4/modeling_gemma4"
                                                      r"\.py:\d+\): a reshape to"):
        policy.check(read_checkpoint(tmp_path))


def test_per_layer_head_widths_and_per_layer_embeddings_pass_together(tmp_path):
    # Gemma 4's per_layer_config head widths are read as the port's own (scaffold.detect.policy.layer_sizes), and its
    # per-layer input embeddings are ported: the policy passes both.
    from ckpt_factory import write_checkpoint

    shape = Shape(model_type="gemma4_text", layers=2, extra={"per_layer_config": {"1": {"head_dim": 64}},
                                                            "hidden_size_per_layer_input": 8,
                                                            "hidden_activation": "gelu_pytorch_tanh"})
    tensors = tensors_for(shape)
    tensors["model.layers.1.self_attn.o_proj.weight"] = [shape.hidden, 4 * 64]
    tensors["model.embed_tokens_per_layer.weight"] = [shape.vocab, 2 * 8]
    write_checkpoint(tmp_path, shape, tensors=tensors)
    policy.check(read_checkpoint(tmp_path))


def test_the_lab_side_table_is_refused_naming_what_the_port_does_not_compute():
    # LAB_SIDE mixes an unnormed projection into its side table, and its blocks add an unnormed term: not the
    # form the port computes (scaffold.detect.layerinputs.read), refused naming the combination and its line.
    config = {"num_hidden_layers": 3, "hidden_size": 128}
    shapes = {"model.tok.weight": (256, 128), "model.side.weight": (256, 24)}
    tensors = {name: type("Info", (), {"shape": shape})() for name, shape in shapes.items()}
    with pytest.raises(layerinputs.Refused, match=r"computed otherwise than the port computes them \(modeling_lab\.py:"
                                                  r"\d+\): the per-layer inputs are \(side\(ids\) \* 2 \+ "
                                                  r"mix\(tok\(ids\)\)\), not c2 \* \(norm"):
        layerinputs.read({"modeling_lab.py": LAB_SIDE}, config, tensors)
