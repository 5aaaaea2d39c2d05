"""vLLM plugin that serves GoldenGemma2ForCausalLM with a native port.

vLLM calls `register` in every process through the `vllm.general_plugins` entry
point of this package.
"""

ARCHITECTURE = "GoldenGemma2ForCausalLM"
MODEL_CLASS = "golden_gemma2_vllm.model:GoldenGemma2ForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
