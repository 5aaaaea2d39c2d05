"""detect/scaling.py: embedding, residual and logit multipliers, final soft-capping."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, write_checkpoint
from helpers import detect_until, read

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import scaling


def test_a_plain_model_scales_nothing(tmp_path):
    spec = detect_until(read(tmp_path), scaling)
    assert (spec.embedding_multiplier, spec.residual_multiplier, spec.logits_scale, spec.final_logit_softcap) == (
        None, None, None, None)


def test_granite_multipliers_and_logits_scaling_divides(tmp_path):
    shape = Shape(extra={"embedding_multiplier": 12.0, "residual_multiplier": 0.22, "logits_scaling": 4.0,
                         "final_logit_softcapping": 30.0})
    spec = detect_until(read(tmp_path, shape), scaling)
    assert spec.embedding_multiplier == 12.0 and spec.residual_multiplier == 0.22
    assert spec.logits_scale == 0.25 and spec.final_logit_softcap == 30.0
    assert spec.source("logits_scale").expr == "1.0 / config.logits_scaling"


def test_embeddings_scaled_by_sqrt_hidden_in_the_code(tmp_path):
    write_checkpoint(tmp_path, Shape(hidden=64))
    (tmp_path / "modeling_x.py").write_text(
        "class M:\n    def forward(self, x):\n        return x * (self.config.hidden_size**0.5)\n")
    spec = detect_until(read_checkpoint(tmp_path), scaling)
    assert spec.embedding_multiplier == pytest.approx(8.0) and spec.source("embedding_multiplier").kind == "code"
