"""vLLM plugin that serves GoldenPhi3ForCausalLM with a native port.

vLLM calls `register` in every process through the `vllm.general_plugins` entry
point of this package.
"""

ARCHITECTURE = "GoldenPhi3ForCausalLM"
MODEL_CLASS = "golden_phi3_vllm.model:GoldenPhi3ForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
