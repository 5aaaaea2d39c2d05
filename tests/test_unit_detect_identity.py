"""detect/identity.py: names, package and config registration from config.json."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape
from helpers import detect_until, read

from scaffold.detect import identity
from scaffold.errors import CheckpointError, UnsupportedArchitecture


def test_names_come_from_the_architecture(tmp_path):
    spec = detect_until(read(tmp_path, Shape(architecture="DemoLMForCausalLM")), identity)
    assert (spec.architecture, spec.class_prefix, spec.package) == ("DemoLMForCausalLM", "DemoLM", "demo_lm_vllm")
    assert spec.model_type == "llama" and spec.dtype == "float32"
    assert spec.source("architecture").kind == "config"


def test_a_model_type_transformers_knows_registers_no_config_class(tmp_path):
    spec = detect_until(read(tmp_path), identity)
    assert spec.register_config is False and spec.config_class == ""


def test_an_unknown_model_type_gets_its_own_config_class(tmp_path):
    spec = detect_until(read(tmp_path, Shape(model_type="zebra_lm", architecture="ZebraForCausalLM")), identity)
    assert spec.register_config is True and spec.config_class == "ZebraConfig"


def test_a_class_that_is_not_a_causal_lm_is_refused(tmp_path):
    with pytest.raises(UnsupportedArchitecture, match="not a causal language model"):
        detect_until(read(tmp_path, Shape(architecture="LlamaModel")), identity)


def test_an_architecture_that_is_not_an_identifier_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="not a Python class name"):
        detect_until(read(tmp_path, Shape(architecture="Llama-ForCausalLM")), identity)
