# Copyright 2026 Shrike Intelligence. Released under the Apache License 2.0.
"""Shrike configuration.

The config stores the names our training code uses (dim, depth, ...); ``attribute_map`` makes
them readable under transformers' usual names too (config.hidden_size is config.dim).
"""

from transformers import PretrainedConfig


class ShrikeConfig(PretrainedConfig):
    model_type = "shrike"
    attribute_map = {
        "hidden_size": "dim",
        "num_hidden_layers": "depth",
        "num_attention_heads": "n_heads",
        "num_key_value_heads": "n_kv_heads",
        "intermediate_size": "ffn_dim",
        "vocab_size": "n_vocab",
        "rms_norm_eps": "norm_eps",
        "max_position_embeddings": "max_context",
    }

    def __init__(self, n_vocab=100352, dim=2560, depth=30, n_heads=20, n_kv_heads=4, ffn_dim=6912, norm_eps=1e-6,
                 rope_base=10000.0, max_context=16384, initializer_range=0.02, tie_word_embeddings=False, **kwargs):
        self.n_vocab = n_vocab
        self.dim = dim
        self.depth = depth
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.ffn_dim = ffn_dim
        self.norm_eps = norm_eps
        self.rope_base = rope_base
        self.max_context = max_context
        self.initializer_range = initializer_range
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
