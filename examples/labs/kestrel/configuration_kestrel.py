# Copyright 2026 Kestrel Labs. Released under the Apache License 2.0.
"""Kestrel model configuration."""

from transformers import PretrainedConfig


class KestrelConfig(PretrainedConfig):
    model_type = "kestrel"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        n_vocab=32000,
        d_hidden=2048,
        n_blocks=24,
        n_heads=16,
        n_kv_heads=4,
        d_ffn=8192,
        ln_eps=1e-5,
        rotary_base=10000.0,
        max_seq_len=4096,
        ffn_bias=True,
        init_std=0.02,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        **kwargs,
    ):
        self.n_vocab = n_vocab
        self.d_hidden = d_hidden
        self.n_blocks = n_blocks
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.d_ffn = d_ffn
        self.ln_eps = ln_eps
        self.rotary_base = rotary_base
        self.max_seq_len = max_seq_len
        self.ffn_bias = ffn_bias
        self.init_std = init_std
        super().__init__(
            bos_token_id=bos_token_id, eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs
        )
