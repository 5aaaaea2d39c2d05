# Copyright 2026 Wren Labs. Released under the Apache License 2.0.
"""Wren model configuration."""

from transformers import PretrainedConfig


class WrenConfig(PretrainedConfig):
    model_type = "wren"

    def __init__(self, tokens=128256, model_dim=3072, blocks=28, q_heads=24, kv_heads=8, ff_dim=8192, eps=1e-6,
                 rope_freq_base=500000.0, ctx_len=8192, init_range=0.02, tie_word_embeddings=False, **kwargs):
        self.tokens = tokens
        self.model_dim = model_dim
        self.blocks = blocks
        self.q_heads = q_heads
        self.kv_heads = kv_heads
        self.ff_dim = ff_dim
        self.eps = eps
        self.rope_freq_base = rope_freq_base
        self.ctx_len = ctx_len
        self.init_range = init_range
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
