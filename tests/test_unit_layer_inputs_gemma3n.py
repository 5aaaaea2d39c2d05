"""Gemma-3n's per-layer inputs as layerinputs reads them: the lookup of its table sliced [..., :num_hidden_layers, :]
after the reshape to [layers, width] keeps every layer (a no-op the reader drops), so its model-side form reads as
Gemma 4's s * (norm(m * proj(h0)) + t * table(ids)) up to what its projection reads: the embedding, copy 0 of the
AltUp stack the first layer takes (named behind the AltUp refusal). A slice that drops layers stays refused."""

from __future__ import annotations

import pytest
from helpers import transformers_code

from scaffold.detect import layerinputs

CONFIG = {"num_hidden_layers": 3, "hidden_size": 128, "hidden_size_per_layer_input": 32, "vocab_size": 256,
          "vocab_size_per_layer_input": 256, "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh"}
TENSORS = {"model.embed_tokens_per_layer.weight": [256, 96], "model.per_layer_model_projection.weight": [96, 128],
           "model.per_layer_projection_norm.weight": [32]}


def test_the_whole_layer_slice_is_dropped_and_the_projection_input_named():
    with pytest.raises(layerinputs.Refused) as err:
        layerinputs.read(transformers_code("gemma3n"), CONFIG, TENSORS)
    assert "num_hidden_layers, :)]" not in str(err.value)
    assert ("per_layer_projection_norm norms per_layer_model_projection(embed_tokens(input_ids) * 11.3137) * "
            "0.0883883, not a linear map of the hidden states the first layer takes") in str(err.value)


def test_a_slice_that_drops_layers_is_kept_and_refused():
    code = {name: text.replace("per_layer_inputs[..., : self.config.num_hidden_layers, :]",
                               "per_layer_inputs[..., :2, :]")
            for name, text in transformers_code("gemma3n").items()}
    assert code != transformers_code("gemma3n")
    with pytest.raises(layerinputs.Refused, match=r"\[\(\.\.\., :2, :\)\]\) \* 0\.707107, not c2 \* \(norm"):
        layerinputs.read(code, CONFIG, TENSORS)


@pytest.mark.parametrize("index, kept", [("(..., :self.config.num_hidden_layers, :)", True),
                                         ("(..., :3, :)", True), ("(..., :2, :)", False),
                                         ("(..., 1:3, :)", False), ("(:, :3, :)", False), ("(..., :3)", False)])
def test_which_indices_keep_every_layer(index, kept):
    assert layerinputs._whole_layer_axis(index, 3, {"num_hidden_layers": 3}) is kept
