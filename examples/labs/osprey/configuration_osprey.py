# Copyright 2026 Osprey AI. Released under the MIT License.
"""Configuration for Osprey language models."""

from transformers import PretrainedConfig


class OspreyConfig(PretrainedConfig):
    model_type = "osprey"

    def __init__(
        self,
        vocab=50304,
        width=768,
        layers=12,
        heads=12,
        mlp_ratio=4,
        context_length=1024,
        eps_ln=1e-5,
        init_scale=0.02,
        tie_word_embeddings=False,
        **kwargs,
    ):
        self.vocab = vocab
        self.width = width
        self.layers = layers
        self.heads = heads
        self.mlp_ratio = mlp_ratio
        self.context_length = context_length
        self.eps_ln = eps_ln
        self.init_scale = init_scale
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
