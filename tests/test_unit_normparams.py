"""detect/normparams.py: norms whose scale the code keeps under another name than `weight`.

Read from what the class computes (it normalizes and learns one scale), never from its name; only the
attributes the code builds from such a class are renamed."""

from __future__ import annotations

from pathlib import Path

import transformers
from helpers import REPO

from scaffold.detect.codekeys import self_assignments
from scaffold.detect.normparams import scale_parameter

WREN = REPO / "examples" / "labs" / "wren" / "modeling_wren.py"


def test_wren_keeps_its_norm_scale_as_scale():
    scale, where, attrs = scale_parameter({WREN.name: WREN.read_text(encoding="utf-8")})
    assert scale == "scale" and where.startswith("modeling_wren.py:") and "WrenNorm" in where
    assert attrs == {"pre_attn_norm", "pre_ffn_norm", "norm_final"}


def test_norms_named_weight_need_no_rename():
    llama = Path(transformers.__file__).parent / "models" / "llama" / "modeling_llama.py"
    assert scale_parameter({llama.name: llama.read_text(encoding="utf-8")}) is None


LAB = '''
import torch
import torch.nn as nn


class Gain(nn.Module):
    """Not a norm: learns a scale but normalizes nothing."""

    def __init__(self, dim):
        super().__init__()
        self.g = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.g


class Ln(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.g = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5) * self.g + self.bias


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln_a, self.gain = Ln(dim), Gain(dim)
'''


def test_a_layer_norm_with_bias_and_a_gain_that_is_not_a_norm():
    scale, _, attrs = scale_parameter({"m.py": LAB})
    assert scale == "g" and attrs == {"ln_a"}  # the tuple assignment is read; Gain is not a norm


def test_tuple_assignments_are_read_pair_by_pair():
    found = {(attr, value.id if hasattr(value, "id") else type(value).__name__)
             for _f, _c, _fn, attr, value in self_assignments({"m.py": "class A:\n    def __init__(self, x, y):\n"
                                                                        "        self.a, self.b = x, y\n"})}
    assert found == {("a", "x"), ("b", "y")}
