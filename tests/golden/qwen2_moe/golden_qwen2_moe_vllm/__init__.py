"""vLLM plugin that serves GoldenQwen2MoeForCausalLM with a native port.

vLLM calls `register` in every process through the `vllm.general_plugins` entry
point of this package.
"""

ARCHITECTURE = "GoldenQwen2MoeForCausalLM"
MODEL_CLASS = "golden_qwen2_moe_vllm.model:GoldenQwen2MoeForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
