# Copyright 2026 Heron Research. Released under the Apache License 2.0.
"""Heron configuration."""

from transformers import PretrainedConfig


class HeronConfig(PretrainedConfig):
    r"""
    Args:
        n_words: vocabulary size.
        dim: width of the residual stream.
        n_blocks: number of decoder blocks.
        n_q_heads: number of query heads.
        kv_groups: number of key/value heads; each serves n_q_heads // kv_groups query heads.
        hidden_dim: inner width of the SwiGLU feed-forward.
        rms_eps: epsilon of the RMS norms.
        theta: rotary base.
        max_len: longest sequence trained on.
    """

    model_type = "heron"

    def __init__(self, n_words=92544, dim=4096, n_blocks=32, n_q_heads=32, kv_groups=8, hidden_dim=14336,
                 rms_eps=1e-5, theta=1000000.0, max_len=32768, initializer_range=0.02, tie_word_embeddings=False,
                 **kwargs):
        self.n_words = n_words
        self.dim = dim
        self.n_blocks = n_blocks
        self.n_q_heads = n_q_heads
        self.kv_groups = kv_groups
        self.hidden_dim = hidden_dim
        self.rms_eps = rms_eps
        self.theta = theta
        self.max_len = max_len
        self.initializer_range = initializer_range
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
