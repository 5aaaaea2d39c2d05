"""detect/norms.py: the norm epsilon, read under any of its config names, defaulted by norm kind."""

from __future__ import annotations

from ckpt_factory import Shape, config_for, write_checkpoint
from helpers import detect_until, read

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import norms


def test_rms_norm_eps_from_the_config(tmp_path):
    spec = detect_until(read(tmp_path, Shape(rms_norm_eps=1e-5)), norms)
    assert spec.norm_eps == 1e-5 and isinstance(spec.norm_eps, float)
    assert spec.source("norm_eps").expr == "config.rms_norm_eps"


def test_an_integer_epsilon_becomes_a_float(tmp_path):
    config = {**config_for(Shape()), "rms_norm_eps": 1}
    write_checkpoint(tmp_path, Shape(), config=config)
    spec = detect_until(read_checkpoint(tmp_path), norms)
    assert spec.norm_eps == 1.0 and isinstance(spec.norm_eps, float)


def test_no_epsilon_in_the_config_is_the_rms_default(tmp_path):
    config = config_for(Shape())
    del config["rms_norm_eps"]
    write_checkpoint(tmp_path, Shape(), config=config)
    spec = detect_until(read_checkpoint(tmp_path), norms)
    assert spec.norm_eps == 1e-6 and spec.source("norm_eps").kind == "default"
