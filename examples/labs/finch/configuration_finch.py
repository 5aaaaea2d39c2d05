# Copyright 2026 Finch Research. Released under the Apache License 2.0.
"""Finch model configuration."""

from transformers import PretrainedConfig


class FinchConfig(PretrainedConfig):
    model_type = "finch"

    def __init__(self, n_tok=100352, hidden=4096, n_stack=32, n_qh=32, n_kv=8, ffn_hidden=14336, norm_eps=1e-5,
                 rope_theta_base=1000000.0, max_ctx=32768, init_std=0.02, tie_word_embeddings=False, **kwargs):
        self.n_tok = n_tok
        self.hidden = hidden
        self.n_stack = n_stack
        self.n_qh = n_qh
        self.n_kv = n_kv
        self.ffn_hidden = ffn_hidden
        self.norm_eps = norm_eps
        self.rope_theta_base = rope_theta_base
        self.max_ctx = max_ctx
        self.init_std = init_std
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
