"""vLLM plugin that serves DemoLMForCausalLM with a native port.

vLLM calls `register` in every process through the `vllm.general_plugins` entry
point of this package.
"""

ARCHITECTURE = "DemoLMForCausalLM"
MODEL_CLASS = "demo_lm_vllm.model:DemoLMForCausalLM"


def register() -> None:
    from transformers import AutoConfig

    from demo_lm_vllm.configuration import DemoLMConfig

    # transformers does not know model_type 'demolm': register its
    # config class so the checkpoint serves without trust_remote_code.
    AutoConfig.register("demolm", DemoLMConfig, exist_ok=True)
    from vllm import ModelRegistry

    # Registered over any class vLLM keeps under the same name: a name two model families share
    # may be the other family's class there, and this plugin is installed to serve this
    # checkpoint with this port. vLLM logs that it overwrites the class.
    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
