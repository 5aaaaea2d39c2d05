"""The generated plugin registers its port even where vLLM keeps a class under the same architecture name.

vLLM 0.32 keeps `DeciLMForCausalLM` for Nemotron-NAS (built from block_configs); DeciLM-7B's remote code uses the
same name for a Llama with num_key_value_heads_per_layer. A plugin that deferred to any class of that name left
the port unused (verify: "AttributeError: 'DeciLMConfig' object has no attribute 'block_configs'").
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden" / "llama" / "golden_llama_vllm" / "__init__.py"


def _register_with(supported: list[str]) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []
    registry = types.SimpleNamespace(get_supported_archs=lambda: list(supported),
                                     register_model=lambda arch, cls: calls.append((arch, cls)))
    spec = importlib.util.spec_from_file_location("golden_plugin_under_test", GOLDEN)
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    saved = sys.modules.get("vllm")
    sys.modules["vllm"] = types.SimpleNamespace(ModelRegistry=registry)
    try:
        plugin.register()
    finally:
        if saved is None:
            sys.modules.pop("vllm", None)
        else:
            sys.modules["vllm"] = saved
    return calls


def test_plugin_registers_its_port_over_a_class_of_the_same_name():
    calls = _register_with(["GoldenLlamaForCausalLM", "LlamaForCausalLM"])
    assert calls == [("GoldenLlamaForCausalLM", "golden_llama_vllm.model:GoldenLlamaForCausalLM")]


def test_plugin_registers_its_port_where_vllm_has_no_such_class():
    calls = _register_with(["LlamaForCausalLM"])
    assert calls == [("GoldenLlamaForCausalLM", "golden_llama_vllm.model:GoldenLlamaForCausalLM")]
