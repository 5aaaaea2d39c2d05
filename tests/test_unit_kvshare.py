"""Where each layer's attention takes its keys and values from (detect/kvshare.py), read layer by layer from what the
code computes: Gemma 4's KV-shared layers and keys used as values, a lab's attention written otherwise (another
container, another rule for which layer publishes, the values recomputed from the keys' projection), and the
refusals: keys normed before they become values, a key read before any layer stored it."""

from __future__ import annotations

from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import kvshare

LT5 = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def _gemma4(**extra) -> dict:
    return {"num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "hidden_size": 128, "layer_types": LT5, "num_kv_shared_layers": 0, "attention_k_eq_v": False,
            "hidden_size_per_layer_input": 0, "sliding_window": 8, "rms_norm_eps": 1e-6, "attention_bias": False,
            **extra}


def test_gemma4_shared_layers_read_the_last_earlier_layer_of_their_type():
    found = kvshare.read(transformers_code("gemma4"), _gemma4(num_kv_shared_layers=2))
    assert isinstance(found, kvshare.LayerSources)
    assert found.kinds == ("own", "own", "own", 1, 2)
    assert found.shared == {3: 1, 4: 2} and found.k_eq_v == []
    assert "modeling_gemma4.py:" in found.evidence and "layer(s) 3 read layer 1's keys and values" in found.evidence
    assert "modeling_gemma4.py:" in found.store_line


def test_gemma4_keys_as_values_in_the_full_attention_layers():
    found = kvshare.read(transformers_code("gemma4"), _gemma4(attention_k_eq_v=True))
    assert isinstance(found, kvshare.LayerSources)
    assert found.kinds == ("own", "own", "k_eq_v", "own", "k_eq_v") and found.shared == {}
    assert "take the keys' projection k_proj as values" in found.evidence


def test_gemma4_both_forms_together():
    # Six layers, the last two shared: the full-attention one reads layer 2, itself a layer of keys as values.
    types = LT5[:3] + ["sliding_attention", "sliding_attention", "full_attention"]
    found = kvshare.read(transformers_code("gemma4"), _gemma4(num_hidden_layers=6, layer_types=types,
                                                              num_kv_shared_layers=2, attention_k_eq_v=True))
    assert isinstance(found, kvshare.LayerSources)
    assert found.kinds == ("own", "own", "k_eq_v", "own", 3, 2)


def test_gemma4_without_either_form_is_every_layer_alike():
    assert kvshare.read(transformers_code("gemma4"), _gemma4()) is None


def test_a_shared_layer_with_no_earlier_layer_of_its_type_is_refused():
    # Three shared layers of five: layer 2 (full attention) has no earlier full-attention layer to read.
    found = kvshare.read(transformers_code("gemma4"), _gemma4(num_kv_shared_layers=3))
    assert isinstance(found, str)
    assert "(layer 2): keys and values read shared_kv_states['full_attention'] before any layer stored it" in found


# A lab's attention written otherwise: projections wq/wk/wv/wo, a `bank` argument keyed by the layer's kind, the
# layers listed in config.borrowers reading it, only the layers below config.publishers writing it (so the last
# global layer before the borrowers does not publish), and with tie_values the global layers recomputing their
# values from wk (no wv built there), the values not normed.
LAB_SHARE = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        self.width = config.head_dim
        self.kind = config.attn_kinds[idx]
        self.borrow = idx in config.borrowers
        self.publish = not self.borrow and idx < config.publishers
        self.tie = config.tie_values and self.kind == "global"
        self.wq = nn.Linear(config.hidden_size, config.num_attention_heads * self.width, bias=False)
        if not self.borrow:
            self.wk = nn.Linear(config.hidden_size, config.num_key_value_heads * self.width, bias=False)
            if not self.tie:
                self.wv = nn.Linear(config.hidden_size, config.num_key_value_heads * self.width, bias=False)
            self.kn = LabRMSNorm(self.width)
        self.qn = LabRMSNorm(self.width)
        self.wo = nn.Linear(config.num_attention_heads * self.width, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, bank):
        q = self.qn(self.wq(x).unflatten(-1, (-1, self.width)))
        if self.borrow:
            k, v = bank[self.kind]
            q = q * cos + rotate_half(q) * sin
        else:
            k = self.kn(self.wk(x).unflatten(-1, (-1, self.width)))
            v = (self.wk(x) if self.tie else self.wv(x)).unflatten(-1, (-1, self.width))
            q, k = apply_rope(q, k, cos, sin)
            if self.publish:
                bank[self.kind] = (k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(out.flatten(-2))


class LabLayer(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        self.mix = LabAttention(config, idx)
        self.ln_a = LabRMSNorm(config.hidden_size)

    def forward(self, x, cos, sin, mask, bank):
        return x + self.mix(self.ln_a(x), cos, sin, mask, bank)


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config, i) for i in range(config.num_hidden_layers)])
'''


def _lab(**extra) -> dict:
    return {"num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "hidden_size": 128, "attn_kinds": ["local", "global"] * 3, "borrowers": [4, 5], "publishers": 3,
            "tie_values": False, **extra}


def test_a_lab_bank_read_by_the_rule_its_code_computes():
    found = kvshare.read({"modeling_lab.py": LAB_SHARE}, _lab())
    assert isinstance(found, kvshare.LayerSources)
    # Layer 5 (global) reads layer 1, the last global layer that published, not layer 3.
    assert found.kinds == ("own", "own", "own", "own", 2, 1)
    assert "modeling_lab.py:" in found.evidence


def test_a_lab_recomputing_its_values_from_the_keys_projection():
    found = kvshare.read({"modeling_lab.py": LAB_SHARE}, _lab(tie_values=True))
    assert isinstance(found, kvshare.LayerSources)
    assert found.kinds == ("own", "k_eq_v", "own", "k_eq_v", 2, 1)


def test_the_config_keys_the_reading_followed_are_recorded():
    # What a port checks against the config it is served with: the keys that decided which layer reads which.
    gemma = kvshare.read(transformers_code("gemma4"), _gemma4(num_kv_shared_layers=2))
    assert {"num_hidden_layers", "num_kv_shared_layers", "layer_types"} <= set(gemma.config_keys)
    assert "vocab_size" not in gemma.config_keys and "rms_norm_eps" not in gemma.config_keys
    lab = kvshare.read({"modeling_lab.py": LAB_SHARE}, _lab())
    assert {"num_hidden_layers", "attn_kinds", "borrowers", "publishers"} <= set(lab.config_keys)
    assert "num_kv_shared_layers" not in lab.config_keys


def test_a_lab_that_borrows_nothing_is_every_layer_alike():
    assert kvshare.read({"modeling_lab.py": LAB_SHARE}, _lab(borrowers=[])) is None


def test_keys_normed_before_they_become_values_are_refused():
    # The lab of test_unit_gemma4_forms: without wv, v = vn(kn(wk(x))), the keys' norm applied to the values; the
    # port's keys-as-values would compute vn(wk(x)).
    from test_unit_gemma4_forms import LAB_G4, _config

    found = kvshare.read({"modeling_lab.py": LAB_G4}, _config(value_every=2))
    assert isinstance(found, str)
    assert "(layer 1): keys through" in found and "'#kn'" in found and "values through" in found


def test_an_mlp_sized_from_the_layer_index_is_named():
    # Gemma 4's use_double_wide_mlp doubles the MLP of its KV-shared layers: refused naming the code's line.
    code = transformers_code("gemma4")
    wide = kvshare.sizes_by_layer(code, _gemma4(num_kv_shared_layers=2, use_double_wide_mlp=True,
                                                intermediate_size=256), "mlp", (0, 3))
    assert wide is not None and "modeling_gemma4.py:" in wide
    assert "Gemma4TextMLP.__init__ computes intermediate_size = 256 in layer 0 and 512 in layer 3" in wide
    assert kvshare.sizes_by_layer(code, _gemma4(num_kv_shared_layers=2, use_double_wide_mlp=False,
                                                intermediate_size=256), "mlp", (0, 3)) is None


LAB_WIDE = "\n" + LAB_PRELUDE + '''class LabFFN(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        width = cfg.ffn_width + cfg.ffn_growth * i
        self.w_in = nn.Linear(cfg.hidden_size, width)
        self.w_out = nn.Linear(width, cfg.hidden_size)
        self.width = width

    def forward(self, x):
        return self.w_out(F.gelu(self.w_in(x)))


class LabLayer(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        self.ffn = LabFFN(cfg, i)

    def forward(self, x):
        return x + self.ffn(x)


class LabModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.layers = nn.ModuleList([LabLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
'''


def test_a_lab_ffn_growing_with_depth_is_named():
    config = {"num_hidden_layers": 3, "hidden_size": 64, "ffn_width": 128, "ffn_growth": 32}
    found = kvshare.sizes_by_layer({"modeling_lab.py": LAB_WIDE}, config, "ffn", (0, 2))
    assert found is not None and "LabFFN.__init__ computes width = 128 in layer 0 and 192 in layer 2" in found
    assert kvshare.sizes_by_layer({"modeling_lab.py": LAB_WIDE}, {**config, "ffn_growth": 0}, "ffn", (0, 2)) is None
