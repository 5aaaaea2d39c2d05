"""vLLM plugin that serves GoldenLlamaForCausalLM with a native port.

vLLM calls `register` in every process through the `vllm.general_plugins` entry
point of this package.
"""

ARCHITECTURE = "GoldenLlamaForCausalLM"
MODEL_CLASS = "golden_llama_vllm.model:GoldenLlamaForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
