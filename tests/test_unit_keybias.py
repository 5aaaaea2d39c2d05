"""A bias per key computed from its values, and residuals scaled by parameters of the layer (scaffold.detect.keybias):
read on transformers' Doge and on lab modules that compute the same under other names and another structure; forms
that compute something else stay refused by name (scaffold.detect.forms). The lab's attention is run in torch and
compared with what the port computes (q' = [q, 1], k' = [k, b / scale], heads padded)."""

from __future__ import annotations

import pytest
from helpers import LAB_DECODER, LAB_PRELUDE, transformers_code

from scaffold.detect import forms, keybias

# A lab's dynamic mask: other names (salience, decay, budget), the projection's output read by a helper method, a
# boolean mask (True = attend) combined with torch.where, the query axis inserted by unsqueeze after a permute, the
# exp as a method, the window read through `.size(-1)` and a config key of its own, GQA by repeat_interleave.
LAB_KEYED = '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.heads, self.groups, self.dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.wq = nn.Linear(config.hidden_size, self.heads * self.dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, self.groups * self.dim, bias=False)
        self.wv = nn.Linear(config.hidden_size, self.groups * self.dim, bias=False)
        self.wo = nn.Linear(self.heads * self.dim, config.hidden_size, bias=False)
        self.salience = nn.Linear(self.groups * self.dim, self.groups)
        self.decay = nn.Parameter(torch.zeros(self.groups))
        self.budget = config.max_visible_keys

    def key_weights(self, gate, allowed):
        strength = (F.softplus(gate) * self.decay).exp()
        per_key = strength.permute(0, 2, 1).unsqueeze(-2)
        scores = torch.where(allowed, per_key, float("-inf"))
        if scores.size(-1) > self.budget:
            keep = scores.topk(self.budget, dim=-1).indices
            scores = torch.full_like(scores, float("-inf")).scatter(-1, keep, scores.gather(-1, keep))
        return scores.repeat_interleave(self.heads // self.groups, dim=1)

    def forward(self, x, cos, sin, allowed):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.groups, self.dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.groups, self.dim)
        q, k = apply_rope(q, k, cos, sin)
        gate = self.salience(v.flatten(2))
        bias = self.key_weights(gate, allowed)
        values = v.transpose(1, 2).repeat_interleave(self.heads // self.groups, dim=1)
        k = k.repeat_interleave(self.heads // self.groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, values, attn_mask=bias)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


'''


def lab(*parts: str) -> dict[str, str]:
    return {"modeling_lab.py": "\n".join([LAB_PRELUDE, *parts])}


# ------------------------------------------------------------------ the bias per key
def test_doges_dynamic_mask_is_a_bias_per_key_from_its_values():
    found = keybias.key_bias(transformers_code("doge"), {})
    assert (found.proj, found.param, found.window, found.window_value) == ("dt_proj", "A", "keep_window_size", None)
    assert found.evidence.startswith("DogeAttention.forward (modeling_doge.py:")
    assert "exp(A * softplus(dt_proj(v))) added to each key's scores, a top-k of the keys beyond keep_window_size" \
        in found.evidence
    assert forms.dynamic_mask(transformers_code("doge"), {}) is None  # ported, no longer refused


def test_a_lab_bias_per_key_written_otherwise_is_read():
    found = keybias.key_bias(lab(LAB_KEYED, LAB_DECODER), {})
    assert (found.proj, found.param, found.window) == ("salience", "decay", "max_visible_keys")
    assert forms.blocking_forms(lab(LAB_KEYED, LAB_DECODER), {}) == []


def test_no_mask_from_the_attention_is_no_bias():
    assert keybias.key_bias(transformers_code("llama"), {}) is None
    assert keybias.key_bias(lab(LAB_KEYED.replace("attn_mask=bias", "is_causal=True"), LAB_DECODER), {}) is None


@pytest.mark.parametrize("change, named", [
    # The bias laid along the queries, not the keys.
    (("unsqueeze(-2)", "unsqueeze(-1)"), "the bias is not laid along the keys, the same for every query"),
    # Another formula: a sigmoid of the projection, not exp(P * softplus).
    (("(F.softplus(gate) * self.decay).exp()", "torch.sigmoid(gate) * self.decay"),
     "is not exp(decay * softplus(salience(v)))"),
    # The hidden keys left unmasked.
    (('torch.where(allowed, per_key, float("-inf"))', "per_key"), "a key the causal mask hides is not masked out"),
    # A second parameter beside the first.
    (("(F.softplus(gate) * self.decay).exp()", "(F.softplus(gate) * self.decay).exp() * self.wo.weight"),
     "the reader does not follow how the mask is computed"),
    # A top-k under a condition that is not the keys' count.
    (("if scores.size(-1) > self.budget:", "if self.budget > 0:"), "a top-k of the keys under a condition"),
    # The bias computed from the hidden states, not the values.
    (("gate = self.salience(v.flatten(2))", "gate = self.salience(x)"),
     "the mask is not computed from a projection of the values"),
])
def test_a_lab_mask_that_computes_otherwise_is_refused_by_name(change, named):
    source = LAB_KEYED.replace(*change)
    assert source != LAB_KEYED
    if change[1] == "gate = self.salience(x)":
        source = source.replace("nn.Linear(self.groups * self.dim, self.groups)",
                                "nn.Linear(config.hidden_size, self.groups)")
    with pytest.raises(keybias.Unmatched, match="LabAttention.forward hands bias to scaled_dot_product_attention") as e:
        keybias.key_bias(lab(source, LAB_DECODER), {})
    assert named in str(e.value)
    found = forms.dynamic_mask(lab(source, LAB_DECODER), {})
    assert found.startswith("an attention mask computed from parameters of the attention (")
    assert named in found


def test_the_labs_attention_is_what_the_port_computes():
    """Run the lab's attention (the test's own module) and compute the port's form from its weights: one more
    column per head carrying exp(decay * softplus(salience(v))) / scale, heads zero-padded, causal attention."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    namespace: dict = {}
    exec(compile(LAB_PRELUDE + LAB_KEYED, "modeling_lab.py", "exec"), namespace)  # the test's own lab code
    config = type("Config", (), dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, hidden_size=64,
                                     max_visible_keys=16))
    torch.manual_seed(0)
    attention = namespace["LabAttention"](config)
    with torch.no_grad():
        for p in attention.parameters():
            p.copy_(torch.randn_like(p) * (1.0 if p.dim() == 1 else 0.1))
    t, dim, heads, groups = 12, 32, 4, 2
    x = torch.randn(1, t, 64)
    angles = torch.arange(t)[:, None] * 0.3 ** torch.arange(dim // 2)[None]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    allowed = torch.ones(t, t, dtype=torch.bool).tril()
    with torch.no_grad():
        want = attention(x, cos, sin, allowed)
        dropped = attention(x, cos, sin, torch.where(allowed, 0.0, float("-inf")) == 0)  # same mask, sanity
        q = attention.wq(x).view(t, heads, dim)
        k = attention.wk(x).view(t, groups, dim)
        v = attention.wv(x).view(t, groups, dim)
        q, k = (q * cos[:, None] + namespace["rotate_half"](q) * sin[:, None],
                k * cos[:, None] + namespace["rotate_half"](k) * sin[:, None])
        bias = torch.exp(attention.decay * F.softplus(attention.salience(v.reshape(t, -1))))  # [t, groups]
        scale, size = dim ** -0.5, 64
        q2 = F.pad(torch.cat([q, torch.ones(t, heads, 1)], -1), (0, size - dim - 1))
        k2 = F.pad(torch.cat([k, (bias / scale)[..., None]], -1), (0, size - dim - 1))
        v2 = F.pad(v, (0, size - dim))
        k2, v2 = k2.repeat_interleave(2, 1), v2.repeat_interleave(2, 1)
        scores = torch.einsum("qhd,khd->hqk", q2, k2) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v2)[..., :dim].reshape(1, t, -1)
        got = attention.wo(out)
        without = attention.wo(F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.repeat_interleave(2, 1).transpose(0, 1)[None],
            v.repeat_interleave(2, 1).transpose(0, 1)[None], is_causal=True, scale=scale)[0].transpose(0, 1)
            .reshape(1, t, -1))
    assert torch.allclose(want, dropped)
    assert (got - want).abs().max().item() < 1e-5
    assert (without - want).abs().max().item() > 1e-3  # the bias matters here


# ------------------------------------------------------------------ learned residual scales
def test_doges_residuals_are_scaled_by_its_parameters():
    assert keybias.residual_scales(transformers_code("doge"), "self_attn", "mlp") == {
        "attn": "input_residual", "mlp": "post_attention_residual"}
    assert forms.residual_scales(transformers_code("doge"), {}) is None  # ported


# A lab layer: the scale on the right of the product, the sum written output first, through locals of its own.
LAB_SCALED_LAYER = LAB_DECODER.replace('''        self.post_attention_layernorm = LabRMSNorm(config.hidden_size)
''', '''        self.post_attention_layernorm = LabRMSNorm(config.hidden_size)
        self.skip_in = nn.Parameter(torch.ones(config.hidden_size))
        self.skip_out = nn.Parameter(torch.ones(config.hidden_size))
''').replace('''        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))''', '''        mixed = self.self_attn(self.input_layernorm(x), cos, sin, mask)
        x = mixed + x * self.skip_in
        update = self.mlp(self.post_attention_layernorm(x))
        return update + x * self.skip_out''')


def test_a_lab_layer_scaling_its_residuals_otherwise_is_read():
    sources = lab(LAB_KEYED, LAB_SCALED_LAYER)
    assert keybias.residual_scales(sources, "self_attn", "mlp") == {"attn": "skip_in", "mlp": "skip_out"}
    assert keybias.residual_scales(sources) == {"attn": "skip_in", "mlp": "skip_out"}
    assert forms.residual_scales(sources, {}) is None
    assert keybias.residual_scales(lab(LAB_KEYED, LAB_DECODER)) is None  # no scale


def test_a_scale_on_the_sublayers_output_is_refused_by_name():
    # The attention's output scaled, not the residual: the port does not compute it.
    source = LAB_SCALED_LAYER.replace("x = mixed + x * self.skip_in", "x = x + mixed * self.skip_in")
    with pytest.raises(keybias.Unmatched, match="multiplies by a parameter of its own .skip_in. in a sum the port "
                                                "does not place"):
        keybias.residual_scales(lab(LAB_KEYED, source), "self_attn", "mlp")
    found = forms.residual_scales(lab(LAB_KEYED, source), {})
    assert found.startswith("learned residual scales: LabLayer.forward multiplies the residual by parameters of its "
                            "own (skip_in, skip_out)")
    assert "in a sum the port does not place" in found


# ------------------------------------------------------------------ Doge's CDMoE
def test_doges_cdmoe_is_refused_by_name_where_config_builds_it():
    found = forms.embedded_experts(transformers_code("doge"), {"is_moe": True})
    assert found.startswith("experts kept as rows of embedding tables: DogeCDMoE.forward looks up down_embed, "
                            "up_embed by the indices of its top-k (modeling_doge.py:")
    assert forms.embedded_experts(transformers_code("doge"), {"is_moe": False}) is None
    assert forms.embedded_experts(transformers_code("mixtral"), {}) is None


LAB_EMBEDDED = LAB_DECODER.replace("        self.mlp = LabMLP(config)", '''        self.mlp = LabLookupExperts(config) if config.lookup_experts else LabMLP(config)''').replace(
    "class LabLayer(nn.Module):", '''class LabLookupExperts(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.router = nn.Linear(config.hidden_size, config.n_experts, bias=False)
        self.keys_in = nn.Embedding(config.n_experts, config.hidden_size)
        self.keys_out = nn.Embedding(config.n_experts, config.hidden_size)
        self.k = config.top_k

    def forward(self, x):
        weights, chosen = self.router(x).softmax(-1).topk(self.k, dim=-1)
        h = F.gelu(torch.einsum("btd,btkd->btk", x, self.keys_in(chosen))) * weights
        return torch.einsum("btk,btkd->btd", h, self.keys_out(chosen))


class LabLayer(nn.Module):''')


def test_a_labs_experts_looked_up_in_tables_are_refused_by_name():
    found = forms.embedded_experts(lab(LAB_KEYED, LAB_EMBEDDED), {"lookup_experts": True})
    assert found.startswith("experts kept as rows of embedding tables: LabLookupExperts.forward looks up keys_in, "
                            "keys_out by the indices of its top-k (modeling_lab.py:")
    assert forms.embedded_experts(lab(LAB_KEYED, LAB_EMBEDDED), {"lookup_experts": False}) is None
