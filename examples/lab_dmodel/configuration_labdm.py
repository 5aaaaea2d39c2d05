"""LabDM configuration (remote code, loaded with ``trust_remote_code=True``).

Written the way a research lab writes its own model: short key names of its
own (``d_model``, ``n_layers``, ``n_heads``, ``d_ff``, ``max_seq_len``), none
of the names transformers' models use.
"""

from transformers import PretrainedConfig


class LabDMConfig(PretrainedConfig):
    model_type = "labdm"

    def __init__(
        self,
        vocab_size=256,
        d_model=64,
        n_layers=2,
        n_heads=2,
        d_ff=160,
        max_seq_len=256,
        norm_eps=1e-5,
        rope_theta=10000.0,
        init_std=0.08,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.d_ff = d_ff
        self.max_seq_len = max_seq_len
        self.norm_eps = norm_eps
        self.rope_theta = rope_theta
        self.init_std = init_std
        super().__init__(
            tie_word_embeddings=tie_word_embeddings, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs
        )
