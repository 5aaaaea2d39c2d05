"""Forms no port computes, named from the code before detection (scaffold.detect.forms): each on transformers' own
file and on a lab module that computes the same thing under other names and another structure; a plain lab
decoder, and the same lab models with the form taken out, name nothing."""

from __future__ import annotations

import pytest
from helpers import LAB_DECODER, LAB_PRELUDE, transformers_code

from scaffold.detect import forms

LAB_ATTENTION = '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.wq = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        q, k = apply_rope(self.wq(x), self.wk(x), cos, sin)
        return self.wo(F.scaled_dot_product_attention(q, k, self.wv(x), attn_mask=mask))


'''
PLAIN = LAB_PRELUDE + LAB_ATTENTION + LAB_DECODER


def lab(*parts: str) -> dict[str, str]:
    return {"modeling_lab.py": "\n".join([LAB_PRELUDE, *parts])}


def test_a_plain_lab_decoder_names_no_form():
    assert forms.blocking_forms({"modeling_lab.py": PLAIN}, {"hidden_size": 64}) == []


def test_llama_and_a_moe_decoder_name_no_form():
    assert forms.blocking_forms(transformers_code("llama"), {}) == []
    assert forms.blocking_forms(transformers_code("mixtral"), {}) == []  # routed experts in the MLP, not attention


# ------------------------------------------------------------------ bidirectional attention by config
def test_xlm_and_xlnet_build_their_causal_mask_only_where_config_says():
    xlm = forms.bidirectional_by_config(transformers_code("xlm"), {"causal": False})
    assert xlm.startswith("bidirectional attention by config: the causal mask is built only under `if causal` "
                          "(modeling_xlm.py:")
    assert "config.json's causal = False builds none" in xlm
    assert forms.bidirectional_by_config(transformers_code("xlm"), {"causal": True}) is None
    xlnet = forms.bidirectional_by_config(transformers_code("xlnet"), {"attn_type": "bi"})
    assert "`if self.attn_type == 'uni'`" in xlnet and "attn_type = 'bi' builds none" in xlnet
    assert forms.bidirectional_by_config(transformers_code("xlnet"), {"attn_type": "uni"}) is None


# A lab's mask helper takes the switch as an argument, called with the config's own key through self.config.
LAB_BIDIRECTIONAL = '''def causal_or_full(n, unidirectional):
    full = torch.zeros(n, n)
    if unidirectional:
        return torch.full((n, n), float("-inf")).triu(1)
    return full


class LabEncoderish(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config

    def forward(self, x):
        return causal_or_full(x.shape[1], self.config.left_to_right)
'''


def test_a_lab_mask_switched_off_by_its_config_key_is_named():
    found = forms.bidirectional_by_config(lab(LAB_BIDIRECTIONAL), {"left_to_right": False})
    assert "`if unidirectional` (modeling_lab.py:" in found and "left_to_right = False builds none" in found
    assert forms.bidirectional_by_config(lab(LAB_BIDIRECTIONAL), {"left_to_right": True}) is None
    assert forms.bidirectional_by_config(lab(LAB_BIDIRECTIONAL), {}) is None  # undecided: not named


# ------------------------------------------------------------------ a layer stack run more than once
def test_hrm_text_runs_its_stacks_in_cycles_as_the_port_does():
    # The stacks' cycles are the port's (scaffold.detect.recurrence.Plan; test_unit_recurrence refuses other forms).
    assert forms.repeated_stack(transformers_code("hrm_text"), {}) is None


# A lab's model loops over its own list of layers inside a loop of refinement steps.
LAB_LOOPED = LAB_ATTENTION + LAB_DECODER.replace('''        self.norm = LabRMSNorm(config.hidden_size)
''', '''        self.norm = LabRMSNorm(config.hidden_size)
        self.steps = config.refine_steps

    def forward(self, x, cos, sin, mask):
        step = 0
        while step < self.steps:
            for block in self.layers:
                x = block(x, cos, sin, mask)
            step += 1
        return self.norm(x)
''')


def test_a_lab_stack_iterated_in_a_while_loop_is_named():
    found = forms.repeated_stack(lab(LAB_LOOPED), {})
    assert "LabModel.forward iterates self.layers inside a loop (LabLayer layers, modeling_lab.py:" in found
    assert "`while step < self.steps`" in found
    assert forms.repeated_stack({"modeling_lab.py": PLAIN}, {}) is None


# ------------------------------------------------------------------ reversible residual streams
def test_reformer_adds_its_attention_to_the_other_stream():
    found = forms.reversible_residual(transformers_code("reformer"), {})
    assert found.startswith("reversible residual streams: ReformerLayer.forward adds the attention's output to "
                            "prev_attn_output while the attention reads hidden_states (modeling_reformer.py:")
    assert "attn_output = prev_attn_output + attn_output" in found


LAB_REVERSIBLE = LAB_ATTENTION + '''class LabRevBlock(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.mix = LabAttention(config, layer_idx)
        self.ff = nn.Linear(config.hidden_size, config.hidden_size)
        self.n1 = LabRMSNorm(config.hidden_size)
        self.n2 = LabRMSNorm(config.hidden_size)

    def forward(self, left, right, cos, sin, mask):
        mixed = self.mix(self.n1(right), cos, sin, mask)
        out_left = mixed + left
        out_right = right + self.ff(self.n2(out_left))
        return out_left, out_right


class LabRevModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.blocks = nn.ModuleList([LabRevBlock(config, i) for i in range(config.num_hidden_layers)])
'''


def test_a_lab_two_stream_block_is_named_and_a_plain_residual_is_not():
    found = forms.reversible_residual(lab(LAB_REVERSIBLE), {})
    assert "LabRevBlock.forward adds the attention's output to left while the attention reads right" in found
    assert forms.reversible_residual({"modeling_lab.py": PLAIN}, {}) is None


# A fused-add-norm layer (vLLM's own style): the layer takes its input already normed and the residual stream as a
# second argument, adds the attention's output to the residual and hands back (normed, residual). Two arguments,
# the attention reading one and its output added to the other, as in RevNet; but the normed input is never a
# stream of its own (nothing is added to it): one residual stream, which the port keeps.
LAB_FUSED_ADD_NORM = LAB_ATTENTION + '''class LabFusedLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn = LabAttention(config, layer_idx)
        self.mlp = nn.Linear(config.hidden_size, config.hidden_size)
        self.post_norm = LabRMSNorm(config.hidden_size)
        self.next_norm = LabRMSNorm(config.hidden_size)

    def forward(self, hidden, residual, cos, sin, mask):
        residual = residual + self.attn(hidden, cos, sin, mask)
        residual = residual + self.mlp(self.post_norm(residual))
        return self.next_norm(residual), residual


class LabFusedModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.first_norm = LabRMSNorm(config.hidden_size)
        self.layers = nn.ModuleList([LabFusedLayer(config, i) for i in range(config.num_hidden_layers)])

    def forward(self, input_ids, cos, sin, mask):
        residual = self.embed(input_ids)
        hidden = self.first_norm(residual)
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos, sin, mask)
        return residual
'''


def test_a_fused_add_norm_layer_with_a_residual_argument_is_not_reversible():
    assert forms.reversible_residual(lab(LAB_FUSED_ADD_NORM), {}) is None
    # The same layer made RevNet's (the feed-forward's output added to the stream the attention reads) is named.
    coupled = LAB_FUSED_ADD_NORM.replace(
        "residual = residual + self.mlp(self.post_norm(residual))",
        "hidden = hidden + self.mlp(self.post_norm(residual))").replace(
        "return self.next_norm(residual), residual", "return hidden, residual")
    found = forms.reversible_residual(lab(coupled), {})
    assert found is not None and "LabFusedLayer.forward adds the attention's output to residual while the " \
        "attention reads hidden" in found, found


# ------------------------------------------------------------------ hyper-connections
@pytest.mark.parametrize("model_type, cls, mixer", [("hy_v4", "HYV4DecoderLayer", "attn_hc (HYV4HyperConnection)"),
                                                    ("deepseek_v4", "DeepseekV4DecoderLayer",
                                                     "attn_hc (DeepseekV4HyperConnection)")])
def test_hy_v4_and_deepseek_v4_mix_residual_streams_around_each_sublayer(model_type, cls, mixer):
    found = forms.hyper_connections(transformers_code(model_type), {})
    assert found.startswith(f"hyper-connections: {cls}.forward computes the attention's input with self.{mixer} "
                            "from the layer's input hidden_states"), found
    assert "the port's decoder layer keeps one residual stream" in found


# A lab's hyper-connections written otherwise: the mixer returns (mixed, gains) in the other order, the streams
# axis is the last but one, the gains broadcast with [..., None], the residual added on the left.
LAB_STREAMS = LAB_ATTENTION + '''class LabStreamMixer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n = config.n_streams
        self.proj = nn.Linear(config.n_streams * config.hidden_size, 2 * config.n_streams, bias=False)

    def forward(self, streams):
        logits = self.proj(streams.flatten(-2))
        pick, gains = logits.chunk(2, dim=-1)
        return (pick.softmax(-1)[..., None] * streams).sum(-2), 2 * gains.sigmoid()


class LabStreamBlock(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.mixer = LabStreamMixer(config)
        self.attention = LabAttention(config, layer_idx)
        self.ln = LabRMSNorm(config.hidden_size)

    def forward(self, streams, cos, sin, mask):
        mixed, gains = self.mixer(streams)
        out = self.attention(self.ln(mixed), cos, sin, mask)
        return streams + gains[..., None] * out[..., None, :]


class LabStreamModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.blocks = nn.ModuleList([LabStreamBlock(config, i) for i in range(config.num_hidden_layers)])
'''

# A gated residual: a module of the layer weights the attention's output, but the attention reads the plain
# normed input, not what that module computes: one residual stream.
LAB_GATED_RESIDUAL = LAB_STREAMS.replace("out = self.attention(self.ln(mixed), cos, sin, mask)",
                                         "out = self.attention(self.ln(streams), cos, sin, mask)")


def test_a_labs_stream_mixer_is_named_and_a_gated_residual_or_a_parallel_block_is_not():
    found = forms.hyper_connections(lab(LAB_STREAMS), {})
    assert found is not None and found.startswith(
        "hyper-connections: LabStreamBlock.forward computes the attention's input with self.mixer (LabStreamMixer) "
        "from the layer's input streams"), found
    assert forms.hyper_connections(lab(LAB_GATED_RESIDUAL), {}) is None
    assert forms.hyper_connections({"modeling_lab.py": PLAIN}, {}) is None
    # Parallel blocks: the MLP reads the attention's normed input and its output is added beside the attention's.
    for model_type in ("phi", "codegen", "gpt_neox", "llama"):
        assert forms.hyper_connections(transformers_code(model_type), {}) is None, model_type


# ------------------------------------------------------------------ several attentions in one layer
def test_longcat_flash_computes_two_attentions_per_layer():
    # Two pre-norm sublayers and a shortcut MoE: the form the port runs (scaffold.detect.sublayers), not refused.
    code = transformers_code("longcat_flash")
    assert forms.several_attentions(code, {}) is None
    # The shortcut's output added after the first sublayer only: another form, named.
    file = next(iter(code))
    moved = code[file].replace("        hidden_states = residual + hidden_states\n\n        # shortcut connection",
                               "        hidden_states = residual + hidden_states + shortcut_mlp_output\n\n"
                               "        # shortcut connection").replace(
        "hidden_states = residual + hidden_states + shortcut_mlp_output\n\n        return",
        "hidden_states = residual + hidden_states\n\n        return")
    assert moved != code[file]
    found = forms.several_attentions({file: moved}, {})
    assert found.startswith("several attention computations in one decoder layer: LongcatFlashDecoderLayer.forward "
                            "calls LongcatFlashMLA 2 times (modeling_longcat_flash.py:")
    assert "self.self_attn[0](...)" in found and "self.self_attn[1](...)" in found
    assert "do not compute pre-norm residual sublayers with the shortcut's output added to the layer's output" in found


LAB_TWO_ATTENTIONS = LAB_ATTENTION + LAB_DECODER.replace(
    "        self.self_attn = LabAttention(config, layer_idx)\n",
    "        self.near = LabAttention(config, layer_idx)\n        self.far = LabAttention(config, layer_idx)\n").replace(
    "        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)\n",
    "        x = x + self.near(self.input_layernorm(x), cos, sin, mask)\n"
    "        x = x + self.far(self.input_layernorm(x), cos, sin, None)\n")


def test_a_lab_layer_with_two_attention_modules_is_named():
    found = forms.several_attentions(lab(LAB_TWO_ATTENTIONS), {})
    assert found.startswith("several attention computations in one decoder layer: LabLayer.forward calls "
                            "LabAttention 2 times (modeling_lab.py:")
    assert "self.near(...)" in found and "self.far(...)" in found
    assert forms.several_attentions({"modeling_lab.py": PLAIN}, {}) is None


def test_cross_attention_under_encoder_states_is_left_to_the_layout():
    # TrOCR's encoder_attn runs only on an encoder's states: scaffold.detect.layout names it as the decoder half of
    # an encoder-decoder, not as a second attention of the layer.
    assert forms.several_attentions(transformers_code("trocr"), {}) is None


# ------------------------------------------------------------------ routed attention
def test_jetmoe_routes_its_queries_through_attention_experts():
    found = forms.routed_attention(transformers_code("jetmoe"), {})
    assert found.startswith("routed attention (a mixture of attention heads): JetMoeAttention.forward computes "
                            "through self.experts, which routes each token to top-k experts (JetMoeMoA built at "
                            "modeling_jetmoe.py:")
    assert "JetMoeTopKGating's top-k at modeling_jetmoe.py:" in found
    assert "self.experts.map(hidden_states) before the attention (modeling_jetmoe.py:" in found
    assert "self.experts.reduce(attn_output, topo_info) on the attention's output (modeling_jetmoe.py:" in found


LAB_ROUTED = '''class LabHeadRouter(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.k = config.heads_per_token
        self.score = nn.Linear(config.hidden_size, config.n_head_experts, bias=False)
        self.banks = nn.Parameter(torch.empty(config.n_head_experts, config.hidden_size, config.hidden_size))

    def forward(self, x):
        weights, chosen = self.score(x).softmax(-1).topk(self.k, dim=-1)
        return torch.einsum("btk,btkd->btd", weights, torch.einsum("btd,btkde->btke", x, self.banks[chosen]))


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.query_bank = LabHeadRouter(config)
        self.wk = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        q, k = apply_rope(self.query_bank(x), self.wk(x), cos, sin)
        return F.scaled_dot_product_attention(q, k, self.wv(x), attn_mask=mask)


''' + LAB_DECODER


def test_a_lab_attention_whose_queries_come_from_routed_experts_is_named():
    found = forms.routed_attention(lab(LAB_ROUTED), {})
    assert "LabAttention.forward computes through self.query_bank, which routes" in found
    assert "(LabHeadRouter built at modeling_lab.py:" in found and "LabHeadRouter's top-k at modeling_lab.py:" in found
    assert forms.routed_attention({"modeling_lab.py": PLAIN}, {}) is None


# A lab's mixture of attention heads written otherwise: no config key names experts, the router is F.linear over a
# parameter and torch.topk of its softmax, the queries and the output both come from a bank of per-head
# projections the router's choice indexes, and the attention runs in a function of the module's own.
LAB_BANKS = '''class LabBankRouter(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.pick = config.banks_per_token
        self.route = nn.Parameter(torch.empty(config.n_banks, config.hidden_size))
        self.w_in = nn.Parameter(torch.empty(config.n_banks, config.hidden_size, config.hidden_size))
        self.w_out = nn.Parameter(torch.empty(config.n_banks, config.hidden_size, config.hidden_size))

    def choose(self, x):
        probs = F.softmax(F.linear(x, self.route), dim=-1)
        top = torch.topk(probs, self.pick, dim=-1)
        return top.values / top.values.sum(-1, keepdim=True), top.indices

    def project_in(self, x, which):
        return torch.einsum("btd,btkde->btke", x, self.w_in[which])

    def project_out(self, y, weights, which):
        return torch.einsum("btk,btke->bte", weights, torch.einsum("btkd,btkde->btke", y, self.w_out[which]))


def attend(q, k, v, mask):
    return torch.softmax(q @ k.transpose(-1, -2) + mask, dim=-1) @ v


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.banks = LabBankRouter(config)
        self.shared_kv = nn.Linear(config.hidden_size, 2 * config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        weights, which = self.banks.choose(x)
        k, v = self.shared_kv(x).chunk(2, dim=-1)
        q, k = apply_rope(self.banks.project_in(x, which), k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.banks.project_out(y, weights, which)


''' + LAB_DECODER

# Not a router: a top-k of the keys each query scores highest (a product of queries and keys, DeepSeek-V3.2's
# indexer's kind), chosen among tokens rather than among a projection's outputs.
LAB_TOP_KEYS = '''class LabKeyPicker(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.keep = config.keys_kept
        self.wq = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x):
        scores = self.wq(x) @ self.wk(x).transpose(-1, -2)
        return scores.topk(self.keep, dim=-1).indices


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.picker = LabKeyPicker(config)
        self.wq = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        keep = self.picker(x)
        mask = mask.masked_fill(~torch.zeros_like(mask, dtype=torch.bool).scatter(-1, keep, True), float("-inf"))
        q, k = apply_rope(self.wq(x), self.wk(x), cos, sin)
        return F.scaled_dot_product_attention(q, k, self.wv(x), attn_mask=mask)


''' + LAB_DECODER


def test_a_lab_bank_of_query_and_output_projections_is_named_whatever_its_names():
    found = forms.routed_attention(lab(LAB_BANKS), {})
    assert found.startswith("routed attention (a mixture of attention heads): LabAttention.forward computes through "
                            "self.banks, which routes each token to top-k experts (LabBankRouter built at "
                            "modeling_lab.py:")
    assert "LabBankRouter's top-k at modeling_lab.py:" in found
    assert "self.banks.project_in(x, which) before the attention (modeling_lab.py:" in found
    assert "self.banks.project_out(y, weights, which) on the attention's output (modeling_lab.py:" in found
    assert "each token's queries and output are computed by the projections of the top-k experts" in found
    # The router's choice alone, taken out (a fixed bank): no form named.
    fixed = LAB_BANKS.replace("top = torch.topk(probs, self.pick, dim=-1)", "top = probs.max(dim=-1)")
    assert forms.routed_attention(lab(fixed), {}) is None


def test_a_top_k_of_the_keys_is_not_routed_attention():
    assert forms.routed_attention(lab(LAB_TOP_KEYS), {}) is None


# ------------------------------------------------------------------ a mask from the attention's own parameters
def test_doges_dynamic_mask_is_a_bias_per_key_the_port_computes():
    # dt_proj and A over the values: a bias per key (scaffold.detect.keybias, tests/test_unit_keybias.py).
    assert forms.dynamic_mask(transformers_code("doge"), {}) is None


def test_deepseek_v32s_indexer_is_not_read_as_a_dynamic_mask():
    # Its indexer scores from the low-rank query, which the queries read too; scaffold.detect.latent names it.
    assert forms.dynamic_mask(transformers_code("deepseek_v32"), {}) is None


LAB_DYNAMIC = LAB_ATTENTION.replace('''        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
''', '''        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.keep = nn.Linear(config.hidden_size, 1)
        self.temperature = nn.Parameter(torch.ones(1))
''').replace('''        q, k = apply_rope(self.wq(x), self.wk(x), cos, sin)
''', '''        q, k = apply_rope(self.wq(x), self.wk(x), cos, sin)
        salience = self.keep(x).squeeze(-1) / self.temperature
        mask = mask + torch.log_softmax(salience, dim=-1)[:, None, None, :]
''') + LAB_DECODER


def test_a_lab_mask_biased_by_a_learned_salience_is_named():
    found = forms.dynamic_mask(lab(LAB_DYNAMIC), {})
    assert found.startswith("an attention mask computed from parameters of the attention (keep, temperature): "
                            "LabAttention.forward hands mask to scaled_dot_product_attention (modeling_lab.py:")
    assert "the mask is not computed from a projection of the values" in found  # from the hidden states
    assert forms.dynamic_mask({"modeling_lab.py": PLAIN}, {}) is None


# ------------------------------------------------------------------ learned residual scales
def test_doges_residual_scales_are_ported():
    # A residual times a parameter before each sublayer's output is added (scaffold.detect.keybias).
    assert forms.residual_scales(transformers_code("doge"), {}) is None


LAB_SCALED = LAB_ATTENTION + LAB_DECODER.replace('''        self.post_attention_layernorm = LabRMSNorm(config.hidden_size)
''', '''        self.post_attention_layernorm = LabRMSNorm(config.hidden_size)
        self.skip_gain = nn.Parameter(torch.ones(config.hidden_size))
''').replace("        x = x + self.self_attn(", "        x = self.self_attn(").replace(
    "cos, sin, mask)\n        return", "cos, sin, mask) + x * self.skip_gain\n        return")


def test_a_lab_residual_times_a_gain_is_ported_and_a_gain_on_the_output_named():
    assert forms.residual_scales(lab(LAB_SCALED), {}) is None
    on_output = LAB_SCALED.replace("cos, sin, mask) + x * self.skip_gain", "cos, sin, mask) * self.skip_gain + x")
    found = forms.residual_scales(lab(on_output), {})
    assert "LabLayer.forward multiplies the residual by parameters of its own (skip_gain)" in found
    assert "in a sum the port does not place" in found
    assert forms.residual_scales({"modeling_lab.py": PLAIN}, {}) is None


# ------------------------------------------------------------------ a learned relative position bias
def test_cpmant_looks_up_a_relative_position_bias():
    found = forms.relative_position_bias(transformers_code("cpmant"), {})
    assert found.startswith("a learned relative position bias: CpmAntSegmentPositionEmbedding.forward looks up its "
                            "table relative_attention_bias by the key-query distance "
                            "(modeling_cpmant.py:")
    assert found.endswith("the attention adds it to its scores, and vLLM's CPU attention adds no such bias (ALiBi "
                          "slopes only; FlexAttention's score_mod, the one backend hook for it, does not run in the CPU "
                          "build)")


def test_alibi_is_not_a_learned_relative_bias():
    for model in ("bloom", "mpt", "falcon"):
        assert forms.relative_position_bias(transformers_code(model), {}) is None, model


# T5's way, written by a lab: the distances through locals, bucketed, looked up in an nn.Embedding by calling it.
LAB_RELATIVE = '''class LabDistanceBias(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.buckets = nn.Embedding(config.distance_buckets, config.num_attention_heads)

    def forward(self, q_len, k_len):
        here = torch.arange(q_len)[:, None]
        there = torch.arange(k_len)[None, :]
        distance = (there - here).clamp(-16, 16) + 16
        return self.buckets(distance).permute(2, 0, 1)
'''


def test_a_lab_distance_table_is_named():
    found = forms.relative_position_bias(lab(LAB_RELATIVE), {})
    assert "LabDistanceBias.forward looks up its table buckets by the key-query distance" in found
    assert forms.relative_position_bias({"modeling_lab.py": PLAIN}, {}) is None


# ------------------------------------------------------------------ an integer table looked up by token ids
def test_deepseek_v4s_hash_routing_table_is_named():
    found = forms.integer_table(transformers_code("deepseek_v4"), "model.layers.0.ffn.gate.tid2eid", "I64")
    assert found.startswith("an integer table looked up by token ids: DeepseekV4HashRouter.forward indexes tid2eid "
                            "by input_ids for the experts each token is routed to (hash routing) "
                            "(modeling_deepseek_v4.py:")
    assert "stored as I64 tensor 'model.layers.0.ffn.gate.tid2eid')" in found
    # A tensor the code does not index by token ids is left to the reader's own error.
    assert forms.integer_table(transformers_code("deepseek_v4"), "model.layers.0.ffn.gate.weight", "I64") is None


LAB_TABLE = '''class LabTokenGate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.register_buffer("lane_of_token", torch.zeros(config.vocab_size, dtype=torch.int32))
        self.lanes = nn.ModuleList([nn.Linear(config.hidden_size, config.hidden_size) for _ in range(4)])

    def forward(self, x, token_ids):
        lane = self.lane_of_token[token_ids]
        return torch.stack([self.lanes[i](x) for i in range(4)], -2).gather(-2, lane[..., None, None])
'''


def test_a_lab_lookup_by_token_ids_is_named_without_experts():
    found = forms.integer_table(lab(LAB_TABLE), "model.layers.3.gate.lane_of_token", "I32")
    assert found.startswith("an integer table looked up by token ids: LabTokenGate.forward indexes lane_of_token by "
                            "token_ids for a value per token (modeling_lab.py:")


# ------------------------------------------------------------------ a causal LM taking image inputs
def test_fuyu_takes_image_patches():
    found = forms.media_inputs(transformers_code("fuyu"), {})
    assert found.startswith("a multimodal model: FuyuForCausalLM.forward takes image_patches (modeling_fuyu.py:")


def test_a_lab_causal_lm_taking_audio_is_named_and_a_text_class_beside_it_is_not():
    audio = LAB_ATTENTION + LAB_DECODER + '''

class LabForCausalLM(nn.Module):
    def forward(self, input_ids, speech_frames=None, audio_lengths=None):
        return input_ids[:, :audio_lengths]
'''
    assert "LabForCausalLM.forward takes audio_lengths (modeling_lab.py:" in forms.media_inputs(lab(audio), {})
    text = audio + '''

class LabTextForCausalLM(nn.Module):
    def forward(self, input_ids):
        return input_ids
'''
    assert forms.media_inputs(lab(text), {}) is None  # a text causal LM beside it: not every class is multimodal
    assert forms.media_inputs(transformers_code("llama4"), {}) is None


LAB_ROUTED_MEDIA = '''
class LabMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.multi_gate = config.multi_gate
        self.gate = nn.Linear(config.hidden_size, 4)
        if self.multi_gate:
            self.image_gate = nn.Linear(config.hidden_size, 4)

    def forward(self, hidden_states, image_start_indices=None, image_end_indices=None):
        logits = self.gate(hidden_states)
        if self.multi_gate:
            if len(image_start_indices) != 0:
                logits = logits + self.image_gate(hidden_states)[image_start_indices[0]:image_end_indices[0]]
        return logits


class LabDenseMlp(nn.Module):
    def forward(self, x):
        return x


class LabLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.mlp = LabMoeBlock(config) if layer_idx >= config.first_k_dense_replace else LabDenseMlp()

    def forward(self, hidden_states, image_start_indices=None, image_end_indices=None):
        return self.mlp(hidden_states, image_start_indices, image_end_indices)


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([LabLayer(config, i) for i in range(config.num_hidden_layers)])

    def forward(self, hidden_states, image_start_indices=None, image_end_indices=None):
        for layer in self.layers:
            hidden_states = layer(hidden_states, image_start_indices=image_start_indices,
                                  image_end_indices=image_end_indices)
        return hidden_states


class LabForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = LabModel(config)

    def forward(self, input_ids, image_start_indices=None, image_end_indices=None):
        return self.model(input_ids, image_start_indices=image_start_indices, image_end_indices=image_end_indices)

    def prepare_inputs_for_generation(self, input_ids, image_start_indices=None, **kwargs):
        return {"input_ids": input_ids, "image_start_indices": image_start_indices}
'''


def test_media_inputs_read_only_on_branches_config_json_turns_off_are_no_media_inputs():
    """Ming's Bailing MoE: image/audio span indices handed down (by keyword, by position, in a dict) to the MoE block,
    read only under `if self.multi_gate:` (config.multi_gate): a text checkpoint (multi_gate false) is a text model;
    one that routes image spans, or whose config.json does not say, stays refused naming where the input is read."""
    assert forms.media_inputs(lab(LAB_ROUTED_MEDIA), {"multi_gate": False}) is None
    for config in ({"multi_gate": True}, {}):
        found = forms.media_inputs(lab(LAB_ROUTED_MEDIA), config)
        assert found.startswith("a multimodal model: LabForCausalLM.forward takes image_start_indices, "
                                "image_end_indices (modeling_lab.py:")
        assert "read at modeling_lab.py:" in found and "image_start_indices" in found.split("read at ")[1]
    # read outside the config branch: a media input again
    read = LAB_ROUTED_MEDIA.replace("        logits = self.gate(hidden_states)\n",
                                    "        logits = self.gate(hidden_states)[:len(image_start_indices)]\n")
    assert read != LAB_ROUTED_MEDIA
    assert forms.media_inputs(lab(read), {"multi_gate": False}) is not None


# ------------------------------------------------------------------ attention scores summed from products
def test_xlnets_relative_attention_sums_its_score_terms():
    found = forms.summed_scores(transformers_code("xlnet"), {})
    assert found.startswith("attention scores summed from several products (XLNetRelativeAttention.rel_attn_core, "
                            "modeling_xlnet.py:")
    assert "attn_score = (ac + bd + ef) * self.scale" in found


LAB_SUMMED = '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.wq = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.rel = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        by_content = q @ k.transpose(-1, -2)
        by_offset = torch.matmul(q, self.rel(sin).transpose(-1, -2))
        logits = by_content + by_offset + mask
        return torch.softmax(logits, dim=-1) @ v


''' + LAB_DECODER


def test_a_lab_attention_adding_a_position_product_is_named():
    found = forms.summed_scores(lab(LAB_SUMMED), {})
    assert "(LabAttention.forward, modeling_lab.py:" in found and "logits = by_content + by_offset + mask" in found
    assert forms.summed_scores({"modeling_lab.py": PLAIN}, {}) is None


def test_gemma4s_audio_attention_is_not_the_text_decoders():
    assert forms.summed_scores(transformers_code("gemma4"), {}) is None


# ------------------------------------------------------------------ layers kept as parallel lists
def test_xlm_keeps_its_layers_as_parallel_lists():
    found = forms.parallel_lists(transformers_code("xlm"), {})
    assert found.startswith("layers kept as parallel module lists: XLMModel appends one module per layer to each of "
                            "attentions, ffns, layer_norm1, layer_norm2 (modeling_xlm.py:")


LAB_LISTS = LAB_ATTENTION + LAB_DECODER.split("class LabLayer")[0] + '''class LabStack(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.depth = config.num_hidden_layers
        self.mixers, self.feeds = nn.ModuleList(), nn.ModuleList()
        self.pre_mix, self.pre_feed = nn.ModuleList(), nn.ModuleList()
        for _ in range(self.depth):
            self.pre_mix.append(LabRMSNorm(config.hidden_size))
            self.mixers.append(LabAttention(config))
            self.pre_feed.append(LabRMSNorm(config.hidden_size))
            self.feeds.append(LabMLP(config))

    def forward(self, x, cos, sin, mask):
        for i in range(self.depth):
            x = x + self.mixers[i](self.pre_mix[i](x), cos, sin, mask)
            x = x + self.feeds[i](self.pre_feed[i](x))
        return x
'''


def test_a_lab_stack_of_parallel_lists_is_named():
    found = forms.parallel_lists(lab(LAB_LISTS), {})
    assert "LabStack appends one module per layer to each of feeds, mixers, pre_feed, pre_mix (modeling_lab.py:" in found
    assert forms.parallel_lists({"modeling_lab.py": PLAIN}, {}) is None


def test_an_attention_called_in_either_branch_of_an_if_is_one_attention():
    either = LAB_ATTENTION + LAB_DECODER.replace(
        "        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)\n",
        "        if mask is None:\n"
        "            x = x + self.self_attn(self.input_layernorm(x), cos, sin, None)\n"
        "        else:\n"
        "            x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)\n")
    assert forms.several_attentions(lab(either), {}) is None


# ------------------------------------------------------------------ bidirectional attention by a term filled with ones
def test_cpmant_fills_the_context_that_lifts_its_causal_mask_with_ones():
    found = forms.bidirectional_by_fill(transformers_code("cpmant"), {})
    assert found.startswith("bidirectional attention: CpmAntModel.forward fills context with ones (modeling_cpmant.py:")
    assert "context = torch.full((batch, seq_length), 1" in found
    assert ("which lifts the causal mask at every key (CpmAntModel._prepare_attention_mask, modeling_cpmant.py:"
            in found)
    assert "context[:, None, :] OR'ed with the causal mask directional_mask_2d), so every position" in found
    assert found.endswith("so every position attends to the positions after it (an encoder), which a decoder's cache "
                          "cannot serve")
    # The first form named: before the relative bias, which the same file also computes.
    named = forms.blocking_forms(transformers_code("cpmant"), {})
    assert named[0] == found and named[1].startswith("a learned relative position bias")


def test_causal_decoders_fill_nothing_that_lifts_their_mask():
    for model in ("llama", "gpt2", "bloom", "xglm", "mixtral"):
        assert forms.bidirectional_by_fill(transformers_code(model), {}) is None, model


# A lab's prefix-LM mask: a helper ORs its triangle with a flag per key; the model passes flags it builds with
# torch.ones (every key flagged), through a keyword and a local of its own.
LAB_FLAGGED = '''def prefix_mask(n, visible):
    lower = torch.arange(n)[:, None] >= torch.arange(n)[None, :]
    return visible[None, :].bool() | lower


class LabPrefixModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([LabLayer(config, i) for i in range(config.num_hidden_layers)])

    def forward(self, x, cos, sin):
        everywhere = torch.ones(x.shape[1], dtype=torch.bool)
        mask = prefix_mask(x.shape[1], visible=everywhere)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return x
'''


def test_a_lab_prefix_mask_flagged_everywhere_is_named_and_one_flagged_by_the_tokens_is_not():
    found = forms.bidirectional_by_fill(lab(LAB_ATTENTION, LAB_DECODER, LAB_FLAGGED), {})
    assert found.startswith("bidirectional attention: LabPrefixModel.forward fills visible with ones (modeling_lab.py:")
    assert "everywhere = torch.ones(x.shape[1], dtype=torch.bool)" in found
    assert "lifts the causal mask at every key (prefix_mask, modeling_lab.py:" in found
    assert "visible[None, :].bool() OR'ed with the causal mask lower)" in found
    # Flags read from the input (a real prefix-LM: only the prompt's keys are visible to all): a causal decoder for
    # the tokens after it, which this finder leaves to the others.
    by_tokens = LAB_FLAGGED.replace("torch.ones(x.shape[1], dtype=torch.bool)", "x[0, :, 0] > 0")
    assert forms.bidirectional_by_fill(lab(LAB_ATTENTION, LAB_DECODER, by_tokens), {}) is None
    assert forms.bidirectional_by_fill({"modeling_lab.py": PLAIN}, {}) is None


# ------------------------------------------------------------------ keys chosen per token by hashing (LSH attention)
def test_reformer_hashes_its_keys_by_a_random_rotation():
    found = forms.hashed_keys(transformers_code("reformer"), {"hash_seed": None, "attn_layers": ["local", "lsh"]})
    assert found.startswith("LSH attention: LSHSelfAttention attends each query only to keys in its hash bucket, "
                            "hashing the vectors by a random rotation drawn anew at every call (config.json's hash_seed "
                            "is null) (_hash_vectors, modeling_reformer.py:")
    assert "torch.argmax(rotated_vectors, dim=-1)) and sorting the keys by bucket (modeling_reformer.py:" in found
    assert found.endswith("; paged attention reads a query's keys by position, not a set chosen per token by hashing")
    seeded = forms.hashed_keys(transformers_code("reformer"), {"hash_seed": 7, "attn_layers": ["lsh"]})
    assert "by a random rotation seeded with config.json's hash_seed = 7 (" in seeded
    # Only local (chunked) layers: no layer builds LSHSelfAttention; the reversible residual is named instead.
    local = {"hash_seed": None, "attn_layers": ["local", "local"]}
    assert forms.hashed_keys(transformers_code("reformer"), local) is None
    assert forms.blocking_forms(transformers_code("reformer"), local)[0].startswith("reversible residual streams: ")
    named = forms.blocking_forms(transformers_code("reformer"), {"attn_layers": ["local", "lsh"]})
    assert named[0].startswith("LSH attention: ") and named[1].startswith("reversible residual streams: ")


def test_decoders_without_hashing_are_not_named():
    for model in ("llama", "gpt2", "mixtral", "cpmant", "bloom"):
        assert forms.hashed_keys(transformers_code(model), {}) is None, model


# A lab's hashed attention: random planes drawn through a generator in a method of its own, the bucket an argmax over
# the keys' projection (the `@` operator, a method call), the keys sorted by bucket; a layer builds it where the
# config's list of mixers says "hashed".
LAB_HASHED = '''class LabHashedAttention(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.qk = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.n_planes = config.hash_planes
        self.seed = config.rotation_seed

    def bucketize(self, keys):
        gen = torch.Generator(device=keys.device)
        if self.seed is not None:
            gen.manual_seed(self.seed)
        planes = torch.empty(keys.shape[-1], self.n_planes).normal_(generator=gen)
        proj = keys @ planes
        return proj.argmax(dim=-1)

    def forward(self, x, cos, sin, mask):
        k = self.qk(x)
        order = torch.sort(self.bucketize(k), dim=-1).indices
        ks = k.gather(1, order[..., None].expand_as(k))
        vs = self.v(x).gather(1, order[..., None].expand_as(k))
        weights = torch.softmax(ks @ ks.transpose(-1, -2), dim=-1)
        return self.out(weights @ vs)


class LabMixedLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        if config.mixers[layer_idx] == "hashed":
            self.mix = LabHashedAttention(config, layer_idx)
        else:
            self.mix = LabAttention(config, layer_idx)
        self.norm = LabRMSNorm(config.hidden_size)

    def forward(self, x, cos, sin, mask):
        return x + self.mix(self.norm(x), cos, sin, mask)


class LabMixedModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([LabMixedLayer(config, i) for i in range(config.num_hidden_layers)])
'''


def test_a_lab_hashed_attention_is_named_where_the_config_builds_it():
    sources = lab(LAB_ATTENTION, LAB_HASHED)
    found = forms.hashed_keys(sources, {"mixers": ["plain", "hashed"], "rotation_seed": None})
    assert found.startswith("LSH attention: LabHashedAttention attends each query only to keys in its hash bucket, "
                            "hashing the vectors by a random rotation drawn anew at every call (config.json's "
                            "rotation_seed is null) (bucketize, modeling_lab.py:")
    assert "proj.argmax(dim=-1)) and sorting the keys by bucket (modeling_lab.py:" in found
    assert forms.hashed_keys(sources, {"mixers": ["plain", "plain"], "rotation_seed": None}) is None
    assert forms.hashed_keys({"modeling_lab.py": PLAIN}, {}) is None
    # Planes the module keeps (a buffer drawn once): still a key set chosen by hashing, named without a draw.
    fixed = sources["modeling_lab.py"].replace(
        "planes = torch.empty(keys.shape[-1], self.n_planes).normal_(generator=gen)", "planes = self.planes")
    kept = forms.hashed_keys({"modeling_lab.py": fixed}, {"mixers": ["hashed"]})
    assert "hashing the vectors by a projection it keeps (self.planes; bucketize, modeling_lab.py:" in kept
    # The same argmax with no sort of the keys by it (a pick of one value per token, not of the keys attended): not
    # this form.
    unsorted = sources["modeling_lab.py"].replace("order = torch.sort(self.bucketize(k), dim=-1).indices",
                                                  "order = self.bucketize(k)")
    assert forms.hashed_keys({"modeling_lab.py": unsorted}, {"mixers": ["hashed"]}) is None
