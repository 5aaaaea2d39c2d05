"""The activation names a port may use are read from the installed vLLM's registries, not kept by hand."""

from __future__ import annotations

import pytest

from scaffold.detect.activations import _dict_keys, gated_forms, transformers_activations, vllm_registry


def test_registry_read_from_source_equals_the_imported_registry():
    from vllm.model_executor.layers import activation  # the real registries, for comparison

    registry = vllm_registry()
    assert registry.plain == frozenset(activation._ACTIVATION_REGISTRY.keys())
    assert registry.and_mul == frozenset(activation._ACTIVATION_AND_MUL_REGISTRY.keys())


def test_transformers_names_read_from_source_equal_act2cls():
    from transformers.activations import ACT2CLS

    assert transformers_activations() == frozenset(ACT2CLS)


@pytest.mark.parametrize("name, forms", [
    ("silu", ("and_mul", "plain")),
    ("gelu_pytorch_tanh", ("and_mul", "plain")),
    ("relu2", ("plain",)),  # no fused kernel: act(gate) * up
    ("gelu_new", ("plain",)),
    ("laplace", ()),  # transformers has it, vLLM does not
])
def test_gated_forms(name, forms):
    assert gated_forms(name) == forms


def test_dict_keys_reads_plain_wrapped_and_annotated_literals(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('A = {"x": 1, "y": 2}\nB: dict = Lazy({"z": f})\nC = make()\nD = {k: 1 for k in "ab"}\n')
    assert _dict_keys(path, "A") == {"x", "y"}
    assert _dict_keys(path, "B") == {"z"}
    assert _dict_keys(path, "C") == frozenset()  # not a literal: nothing is assumed
    assert _dict_keys(path, "D") == frozenset()
    assert _dict_keys(path, "missing") == frozenset()
