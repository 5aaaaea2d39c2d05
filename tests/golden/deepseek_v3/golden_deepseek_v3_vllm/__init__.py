"""vLLM plugin that serves GoldenDeepseekV3ForCausalLM with a native port.

vLLM calls `register` in every process through the `vllm.general_plugins` entry
point of this package.
"""

ARCHITECTURE = "GoldenDeepseekV3ForCausalLM"
MODEL_CLASS = "golden_deepseek_v3_vllm.model:GoldenDeepseekV3ForCausalLM"
MODEL_TYPE = "deepseek_v3"


def register() -> None:
    _register_latent_attention()
    from vllm import ModelRegistry

    # Registered over any class vLLM keeps under the same name: a name two model families share
    # may be the other family's class there, and this plugin is installed to serve this
    # checkpoint with this port. vLLM logs that it overwrites the class.
    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)


def _register_latent_attention() -> None:
    """Tell vLLM that model_type 'deepseek_v3' is multi-head latent attention.

    vLLM sizes a latent KV cache (one compressed row per token, not per-head keys and
    values) only for the model types it lists as DeepSeek-style MLA; a model type it
    does not list gets the architecture convertor below, keyed by model_type in vLLM's
    table of convertors.
    """
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    base = MODEL_ARCH_CONFIG_CONVERTORS.get(MODEL_TYPE, ModelArchConfigConvertorBase)
    if getattr(base, "latent_attention", False):
        return

    class LatentAttentionConvertor(base):
        latent_attention = True

        def is_deepseek_mla(self) -> bool:
            return True

    MODEL_ARCH_CONFIG_CONVERTORS[MODEL_TYPE] = LatentAttentionConvertor
