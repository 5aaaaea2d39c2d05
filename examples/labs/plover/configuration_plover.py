# Copyright 2026 Plover Systems. Released under the Apache License 2.0.
"""Plover configuration: ALiBi positions and muP (maximal update) multipliers."""

from transformers import PretrainedConfig


class PloverConfig(PretrainedConfig):
    model_type = "plover"

    def __init__(
        self,
        vocab_sz=65536,
        embed_dim=2048,
        num_blocks=24,
        attn_heads=16,
        mlp_dim=5632,
        norm_epsilon=1e-5,
        seq_len=4096,
        # muP: tuned on a small proxy model and transferred, see the model card
        mup_emb_mult=10.0,  # multiplies the token embeddings
        mup_res_mult=0.22,  # multiplies each branch before it joins the residual stream
        mup_attn_mult=0.0078125,  # replaces 1/sqrt(head_dim) as the attention score scale
        mup_logit_div=8.0,  # divides the output logits
        init_std=0.02,
        tie_word_embeddings=False,
        **kwargs,
    ):
        self.vocab_sz = vocab_sz
        self.embed_dim = embed_dim
        self.num_blocks = num_blocks
        self.attn_heads = attn_heads
        self.mlp_dim = mlp_dim
        self.norm_epsilon = norm_epsilon
        self.seq_len = seq_len
        self.mup_emb_mult = mup_emb_mult
        self.mup_res_mult = mup_res_mult
        self.mup_attn_mult = mup_attn_mult
        self.mup_logit_div = mup_logit_div
        self.init_std = init_std
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
