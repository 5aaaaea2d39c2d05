"""Sinusoidal absolute positions read from the code that builds the table (scaffold.detect.sinusoid).

The code read is real: transformers' own XGLM and CTRL modeling files of the installed version, and a lab module
written otherwise (another formula spelling, sines and cosines interleaved, the table registered as a buffer in a
constructor). The tables the code computes are compared, number for number, with those transformers' functions
compute when run.
"""

from __future__ import annotations

import re

import pytest
import torch
from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect.positions import computed_positions
from scaffold.detect.sinusoid import SinusoidTable, _candidate, read_table, sinusoid_table, table_functions


def _table(sources: dict, name: str) -> SinusoidTable | str:
    file, func = next((f, fn) for f, fn in table_functions(sources) if fn.name == name)
    return read_table(sources, file, func)


@pytest.mark.parametrize("model, function, shift, padding", [
    ("xglm", "get_embedding", 1, "padding_idx"),
    ("ctrl", "positional_encoding", 0, None),
])
def test_transformers_tables_are_read_and_match_what_transformers_computes(model, function, shift, padding):
    table = _table(transformers_code(model), function)
    assert isinstance(table, SinusoidTable), table
    assert (table.base, table.shift, table.interleaved, table.padding_param) == (10000.0, shift, False, padding)
    # The family the reader settled on, at a real size, against transformers' own function run in torch.
    rows, width = 40, 64
    if model == "xglm":
        from transformers.models.xglm.modeling_xglm import XGLMSinusoidalPositionalEmbedding
        real = XGLMSinusoidalPositionalEmbedding.get_embedding(rows, width, 1)
    else:
        from transformers.models.ctrl.modeling_ctrl import positional_encoding
        real = positional_encoding(rows, width, torch.float)
    expected = torch.tensor(_candidate(rows, width, table.base, table.shift, table.interleaved), dtype=torch.float32)
    if padding:
        expected[1] = 0.0
    assert torch.allclose(real, expected, atol=2e-5), (real - expected).abs().max()


def test_where_the_table_is_added_xglm_module_and_ctrl_buffer():
    found, kind = computed_positions(transformers_code("xglm"))
    assert (found.tokens, found.positions, kind) == ("embed_tokens", "embed_positions",
                                                     "XGLMSinusoidalPositionalEmbedding")
    found, kind = computed_positions(transformers_code("ctrl"))
    assert (found.tokens, found.positions, kind) == ("w", "pos_encoding", "positional_encoding")


# A lab's table: built inline in its module's constructor (the PyTorch tutorial's spelling: exp of arange(0, d, 2)
# times -log(base) / d, sines in the even columns and cosines in the odd ones) and registered as a buffer, indexed
# by the positions in forward; the model adds it to its token embedding through local names.
LAB_POSITIONS = "\n" + LAB_PRELUDE + '''import math


class WaveTable(nn.Module):
    def __init__(self, n_pos, width):
        super().__init__()
        self.width = width
        pe = torch.zeros(n_pos, width)
        where = torch.arange(0, n_pos).unsqueeze(1).float()
        rate = torch.exp(torch.arange(0, width, 2).float() * (-math.log(BASE) / width))
        pe[:, 0::2] = torch.sin(where * rate)
        pe[:, 1::2] = torch.cos(where * rate)
        self.register_buffer("pe", pe)

    def forward(self, where):
        return self.pe[where]


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.vocab = nn.Embedding(config.vocab_size, config.hidden_size)
        self.waves = WaveTable(config.max_position_embeddings, config.hidden_size)

    def forward(self, input_ids, position_ids):
        tokens = self.vocab(input_ids)
        placed = self.waves(position_ids)
        return tokens + placed
'''


def test_a_lab_table_interleaved_and_registered_in_its_constructor():
    sources = {"modeling_lab.py": LAB_POSITIONS.replace("BASE", "10000.0")}
    found, kind = computed_positions(sources)
    assert (found.tokens, found.positions, kind) == ("vocab", "waves", "WaveTable")
    table = sinusoid_table(sources, named=kind)
    assert isinstance(table, SinusoidTable), table
    assert (table.base, table.shift, table.interleaved, table.padding_param) == (10000.0, 0, True, None)
    assert table.describe().endswith("sin and cos interleaved")
    # Another base is read as that base.
    other = sinusoid_table({"modeling_lab.py": LAB_POSITIONS.replace("BASE", "500.0")}, named=kind)
    assert isinstance(other, SinusoidTable) and other.base == 500.0


@pytest.mark.parametrize("change, why", [
    # The cosines first: not a form of the family (the port would add another table).
    (("pe[:, 0::2] = torch.sin(where * rate)\n        pe[:, 1::2] = torch.cos(where * rate)",
      "pe[:, 0::2] = torch.cos(where * rate)\n        pe[:, 1::2] = torch.sin(where * rate)"),
     r"none of sin/cos\(position x base"),
    # A frequency the family has no divisor for.
    (("(-math.log(BASE) / width)", "(-math.log(BASE) / (width + 3))"), r"none of sin/cos\(position x base"),
    # Something the reader does not follow: named with its line.
    (("pe = torch.zeros(n_pos, width)", "pe = torch.randn(n_pos, width)"),
     r"modeling_lab.py:\d+: __init__ computes what the reader does not follow"),
])
def test_a_table_of_another_form_is_named_not_guessed(change, why):
    sources = {"modeling_lab.py": LAB_POSITIONS.replace(*change).replace("BASE", "10000.0")}
    assert sources["modeling_lab.py"] != LAB_POSITIONS.replace("BASE", "10000.0")
    table = sinusoid_table(sources, named="WaveTable")
    assert isinstance(table, str)
    assert re.search(why, table), table


def test_xglm_checkpoint_spec(tmp_path):
    """XGLM: the table's form, offset 2, row config.pad_token_id zeroed, the embeddings scaled by sqrt(d_model)."""
    from test_unit_gpt2_layouts import tiny

    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import detect

    spec = detect(read_checkpoint(tiny("xglm", tmp_path / "ckpt", pad_token_id=3)))
    assert spec.position_scheme == "sinusoidal" and spec.position_offset == 2
    assert (spec.sinusoid_base, spec.sinusoid_shift, spec.sinusoid_interleaved) == (10000.0, 1, False)
    assert spec.sinusoid_padding_row == 3 and spec.source("sinusoid_padding_row").expr == "config.pad_token_id"
    assert "embed_positions" not in spec.names  # no tensor: the port computes the table
    assert spec.embedding_multiplier == pytest.approx(spec.hidden_size ** 0.5)
    from scaffold.review import decisions
    said = [d for d in decisions(spec) if "positions:" in d]
    assert len(said) == 1 and "hidden_size / 2 - 1" in said[0] and "position + 2" in said[0], said
    assert "row `config.pad_token_id` zeroed" in said[0] and "rotary embedding:" not in said[0]
