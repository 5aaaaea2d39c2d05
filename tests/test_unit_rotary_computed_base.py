"""A rotary base the modeling code computes rather than reads from config.json (TeleChat's: 10000 * alpha ** (d /
(d - 2)), alpha from max(length, config.training_seqlen), and its cos/sin rounded to float16 by `.half()`): read
by running the module over numbers (scaffold.detect.rotaryfreq.read_computed_base) at the lengths the port serves,
its base and its rounding ported, a base that moves with the length named. The lab below is written here in that
form with names of its own (its code is read, never run)."""

from __future__ import annotations

import pytest

from scaffold.detect import rotaryfreq

MODELING = '''
import math
import torch
from torch import nn


class LabTurns(nn.Module):
    def __init__(self, size, cfg, theta=10000):
        super().__init__()
        self.size = size
        self.cfg = cfg
        self.theta = theta

    def forward(self, x):
        n = max(x.shape[0], self.cfg.train_len)
        alpha = max(2 ** math.ceil(math.log(n / 2048, 2) + 1) - 1, 1)
        theta = self.theta * alpha ** (self.size / (self.size - 2))
        inv = 1.0 / (theta ** (torch.arange(0, self.size, 2).float() / self.size))
        t = torch.arange(n).float()
        f = torch.einsum("i,j->ij", t, inv)
        emb = torch.cat((f, f), dim=-1)
        return emb.cos()[:, None, :].half(), emb.sin()[:, None, :].half()


class LabAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.width = config.hidden_size
        self.count = config.num_attention_heads
        self.per_head = self.width // self.count
        self.turns = LabTurns(self.per_head, config)

    def forward(self, x):
        cos, sin = self.turns(x)
        return x * cos + x * sin


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabAttention(config) for _ in range(2)])
'''
CONFIG = {"hidden_size": 256, "num_attention_heads": 8, "train_len": 4096, "vocab_size": 64}


def test_the_base_the_code_computes_is_read_with_its_float16_rounding():
    found = rotaryfreq.read_computed_base({"modeling_lab.py": MODELING}, CONFIG, 32, (40, 256, 4096))
    assert isinstance(found, rotaryfreq.ComputedBase), found
    # Up to train_len positions: alpha = 2 ** (log2(4096 / 2048) + 1) - 1 = 3.
    assert found.base == pytest.approx(10000 * 3 ** (32 / 30), rel=1e-9)
    assert found.float16 and found.cls == "LabTurns"


def test_a_table_kept_in_full_precision_is_read_unrounded():
    modeling = MODELING.replace("[:, None, :].half()", "[:, None, :]")
    found = rotaryfreq.read_computed_base({"modeling_lab.py": modeling}, CONFIG, 32, (40, 256))
    assert isinstance(found, rotaryfreq.ComputedBase) and not found.float16


def test_a_base_that_moves_with_the_length_is_named():
    # Past train_len the code computes another alpha (7 at 4097 positions): not one table the port could hold.
    found = rotaryfreq.read_computed_base({"modeling_lab.py": MODELING}, CONFIG, 32, (40, 4097))
    assert isinstance(found, str) and "LabTurns" in found
    assert "4097 positions" in found or "another rotary table at each length" in found


def test_a_port_whose_max_position_reaches_past_the_constant_base_is_refused_by_name(tmp_path):
    # The same module in a checkpoint whose max_position (8192) lies past train_len (4096): at 8192 positions the
    # code computes alpha 7, at 40 alpha 3; no one rotary table computes both, so the port is refused, naming it.
    import json

    from ckpt_factory import Shape, config_for, tensors_for, write_checkpoint
    from helpers import detect_until

    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import rope
    from scaffold.errors import UnsupportedArchitecture

    shape = Shape(architecture="TurnlabForCausalLM", model_type="turnlab", heads=8, kv_heads=8, head_dim=32,
                  hidden=256)
    root = write_checkpoint(tmp_path / "turnlab", shape, tensors=tensors_for(shape), config=config_for(shape))
    config = json.loads((root / "config.json").read_text())
    for key in ("rope_theta", "rope_parameters", "rope_scaling"):
        config.pop(key, None)
    config.update(train_len=4096, max_position_embeddings=8192,
                  auto_map={"AutoModelForCausalLM": "modeling_turnlab.TurnlabForCausalLM"})
    (root / "config.json").write_text(json.dumps(config))
    (root / "modeling_turnlab.py").write_text(MODELING)
    with pytest.raises(UnsupportedArchitecture, match="a rotary table that changes with the sequence length"):
        detect_until(read_checkpoint(root), rope)
