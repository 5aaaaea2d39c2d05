"""Config class for model_type 'tinymoe', which transformers does not ship.

Generated from the checkpoint's config.json so the model loads without running the
checkpoint's own code. Defaults are the values of that config.json, and the
conventions its modeling code decides where config.json is silent (scaffold_spec.toml
says which).
"""

from transformers import PretrainedConfig


class TinyMoEConfig(PretrainedConfig):
    model_type = "tinymoe"

    def __init__(
        self,
        attention_dropout=0.0,
        head_dim=32,
        hidden_act="silu",
        hidden_size=128,
        initializer_range=0.08,
        max_position_embeddings=512,
        moe_intermediate_size=64,
        norm_topk_prob=True,
        num_attention_heads=4,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_key_value_heads=2,
        rms_norm_eps=1e-06,
        rope_theta=10000.0,
        vocab_size=256,
        **kwargs,
    ):
        self.attention_dropout = attention_dropout
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.hidden_size = hidden_size
        self.initializer_range = initializer_range
        self.max_position_embeddings = max_position_embeddings
        self.moe_intermediate_size = moe_intermediate_size
        self.norm_topk_prob = norm_topk_prob
        self.num_attention_heads = num_attention_heads
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.num_hidden_layers = num_hidden_layers
        self.num_key_value_heads = num_key_value_heads
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.vocab_size = vocab_size
        super().__init__(**kwargs)
