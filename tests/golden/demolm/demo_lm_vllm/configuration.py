"""Config class for model_type 'demolm', which transformers does not ship.

Generated from the checkpoint's config.json so the model loads without running the
checkpoint's own code. Defaults are the values of that config.json, and the
conventions its modeling code decides where config.json is silent (scaffold_spec.toml
says which).
"""

from transformers import PretrainedConfig


class DemoLMConfig(PretrainedConfig):
    model_type = "demolm"

    def __init__(
        self,
        full_attention_interval=3,
        head_dim=32,
        hidden_size=128,
        initializer_range=0.08,
        intermediate_size=256,
        layer_types=None,
        max_position_embeddings=512,
        num_attention_heads=6,
        num_hidden_layers=6,
        num_key_value_heads=2,
        rms_norm_eps=1e-05,
        sliding_window=8,
        vocab_size=320,
        rope_theta=500000.0,
        **kwargs,
    ):
        self.full_attention_interval = full_attention_interval
        self.head_dim = head_dim
        self.hidden_size = hidden_size
        self.initializer_range = initializer_range
        self.intermediate_size = intermediate_size
        if layer_types is None:
            layer_types = [
                "sliding_attention",
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "sliding_attention",
                "full_attention",
            ]
        self.layer_types = layer_types
        self.max_position_embeddings = max_position_embeddings
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        self.num_key_value_heads = num_key_value_heads
        self.rms_norm_eps = rms_norm_eps
        self.sliding_window = sliding_window
        self.vocab_size = vocab_size
        self.rope_theta = rope_theta
        super().__init__(**kwargs)
