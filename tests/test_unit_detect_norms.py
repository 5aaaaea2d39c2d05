"""detect/norms.py: the norm epsilon, read under any of its config names, defaulted by norm kind."""

from __future__ import annotations

from ckpt_factory import Shape, config_for, write_checkpoint
from helpers import detect_until, read, transformers_code

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import norms


def test_rms_norm_eps_from_the_config(tmp_path):
    spec = detect_until(read(tmp_path, Shape(rms_norm_eps=1e-5)), norms)
    assert spec.norm_eps == 1e-5 and isinstance(spec.norm_eps, float)
    assert spec.source("norm_eps").expr == "config.rms_norm_eps"


def test_an_integer_epsilon_becomes_a_float(tmp_path):
    config = {**config_for(Shape()), "rms_norm_eps": 1}
    write_checkpoint(tmp_path, Shape(), config=config)
    spec = detect_until(read_checkpoint(tmp_path), norms)
    assert spec.norm_eps == 1.0 and isinstance(spec.norm_eps, float)


def test_no_epsilon_in_the_config_is_the_rms_default(tmp_path):
    config = config_for(Shape())
    del config["rms_norm_eps"]
    write_checkpoint(tmp_path, Shape(), config=config)
    spec = detect_until(read_checkpoint(tmp_path), norms)
    assert spec.norm_eps == 1e-6 and spec.source("norm_eps").kind == "default"


def test_norm_classes_without_parameters_are_read_from_their_code():
    """OLMo's OlmoLayerNorm (F.layer_norm with no weight or bias) and NanoChat's RMS norm (x * rsqrt(mean(x^2) +
    eps)) hold no parameter; Llama's RMSNorm holds a weight; a class that builds a submodule is no norm."""
    from scaffold.detect.sourcecode import weightless_norms

    code = transformers_code
    assert weightless_norms(code("olmo")) == {"OlmoLayerNorm"}
    assert weightless_norms(code("nanochat")) == {"NanoChatRMSNorm"}
    assert weightless_norms(code("llama")) == set()
    assert weightless_norms(code("gpt_neox")) == set()


def test_the_final_norm_applied_to_the_embeddings_too_is_read_from_the_base_models_forward():
    """NanoChat's model forward: `hidden_states = self.norm(hidden_states)` before the layer loop, then again
    after it; Llama's applies its norm after the loop only."""
    from scaffold.detect.layout import _embedding_norm, weightless_norm_attributes
    from scaffold.spec import Spec

    for model, expected in (("nanochat", True), ("llama", False)):
        sources, spec = transformers_code(model), Spec()
        _embedding_norm(spec, sources, {"layers": "layers", "norm": "norm"}, "config.json",
                        weightless_norm_attributes(sources))
        assert spec.embedding_norm is expected, model
        assert (spec.source("embedding_norm").kind == "code") is expected
    # MiniMax-M3-VL's file holds a vision tower whose forward calls pre_layrnorm before its own loop over
    # self.layers: not the language model's (the class does not build the token embedding).
    spec = Spec()
    _embedding_norm(spec, transformers_code("minimax_m3_vl"), {"layers": "layers", "norm": "norm",
                                                               "embed_tokens": "embed_tokens"}, "config.json", set())
    assert spec.embedding_norm is False


def test_a_rotation_by_minus_theta_is_named():
    from scaffold.detect.rope import _reversed_rotation

    code = transformers_code
    assert str(_reversed_rotation(code("nanochat"))).startswith("modeling_nanochat.py:")
    assert _reversed_rotation(code("llama")) is None


def test_a_norm_of_its_own_on_the_embeddings_is_the_one_called_before_the_layer_loop():
    # BLOOM: word_embeddings_layernorm before the loop over self.h, ln_f after it.
    from scaffold.detect.layout import _embedding_norm, _norms_before_layers
    from scaffold.spec import Spec

    sources = transformers_code("bloom")
    found = _norms_before_layers(sources, {"ln_f", "word_embeddings_layernorm"})
    assert [attr for attr, _file, _line in found] == ["word_embeddings_layernorm"]
    spec = Spec()
    _embedding_norm(spec, sources, {"layers": "h", "norm": "ln_f", "embed_norm": "word_embeddings_layernorm"},
                    "config.json", set())
    assert spec.embedding_norm is True and spec.source("embedding_norm").kind == "code"
