"""vLLM plugin that serves TinyMoEForCausalLM with a native port.

vLLM calls `register` in every process through the `vllm.general_plugins` entry
point of this package.
"""

ARCHITECTURE = "TinyMoEForCausalLM"
MODEL_CLASS = "tiny_mo_e_vllm.model:TinyMoEForCausalLM"


def register() -> None:
    from transformers import AutoConfig

    from tiny_mo_e_vllm.configuration import TinyMoEConfig

    # transformers does not know model_type 'tinymoe': register its
    # config class so the checkpoint serves without trust_remote_code.
    AutoConfig.register("tinymoe", TinyMoEConfig, exist_ok=True)
    from vllm import ModelRegistry

    # Registered over any class vLLM keeps under the same name: a name two model families share
    # may be the other family's class there, and this plugin is installed to serve this
    # checkpoint with this port. vLLM logs that it overwrites the class.
    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
