"""vLLM plugin that serves GoldenGemma2ForCausalLM with a native port.

vLLM calls `register` in every process through the `vllm.general_plugins` entry
point of this package.
"""

ARCHITECTURE = "GoldenGemma2ForCausalLM"
MODEL_CLASS = "golden_gemma2_vllm.model:GoldenGemma2ForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    # Registered over any class vLLM keeps under the same name: a name two model families share
    # may be the other family's class there, and this plugin is installed to serve this
    # checkpoint with this port. vLLM logs that it overwrites the class.
    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
