"""Alternating updates (Gemma-3n's AltUp) read from what the code computes (scaffold.detect.altup): the model's
forward and the decoder layer's interpreted over numbers and followed value by value against vLLM's Gemma-3n form,
so the modules' roles come from the values. Transformers' file, a lab's AltUp written otherwise (other names,
einsum instead of the permuted matmul, a clamp instead of torch.maximum, the layer's steps in another order), and
changes of what the code computes, each refused naming the step."""

from __future__ import annotations

import pytest
from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import altup

CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "intermediate_size": [96, 96], "vocab_size": 50, "vocab_size_per_layer_input": 50,
          "hidden_size_per_layer_input": 8, "altup_num_inputs": 4, "altup_active_idx": 0, "altup_coef_clip": 120.0,
          "altup_correct_scale": True, "laurel_rank": 16, "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
          "activation_sparsity_pattern": [0.0, 0.0], "layer_types": ["sliding_attention", "full_attention"],
          "num_kv_shared_layers": 0, "attention_bias": False, "attention_dropout": 0.0, "sliding_window": 16,
          "pad_token_id": 0, "final_logit_softcapping": 30.0, "max_position_embeddings": 64,
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}


def test_gemma3n_altup_is_read_as_vllm_computes_it():
    form = altup.read(transformers_code("gemma3n"), CONFIG)
    assert (form.count, form.count_expr, form.active, form.active_expr) == (4, "config.altup_num_inputs", 0,
                                                                             "config.altup_active_idx")
    assert (form.scale_output, form.scale_expr, form.eps) == (True, "config.altup_correct_scale", 1e-5)
    assert (form.module, form.prediction, form.correction, form.router, form.router_norm, form.output_scale) == (
        "altup", "prediction_coefs", "correction_coefs", "modality_router", "router_norm", "correct_output_scale")
    assert (form.projections, form.unembed_projections) == ("altup_projections", "altup_unembed_projections")
    assert (form.laurel, form.laurel_down, form.laurel_up, form.laurel_norm, form.laurel_rank_expr) == (
        "laurel", "linear_left", "linear_right", "post_laurel_norm", "config.laurel_rank")
    assert form.roles == {"attn_norm": "input_layernorm", "self_attn": "self_attn",
                          "attn_post_norm": "post_attention_layernorm", "mlp_norm": "pre_feedforward_layernorm",
                          "mlp": "mlp", "mlp_post_norm": "post_feedforward_layernorm",
                          "per_layer_input_gate": "per_layer_input_gate", "per_layer_input_act": "act_fn",
                          "per_layer_input_proj": "per_layer_projection",
                          "per_layer_input_norm": "post_per_layer_input_norm"}


def _changed(old: str, new: str) -> dict[str, str]:
    code = transformers_code("gemma3n")
    (name, text), = code.items()
    assert text.count(old) >= 1, old
    return {name: text.replace(old, new)}


@pytest.mark.parametrize("old, new, named", [
    # The attention and Laurel sum halved, not divided by sqrt(2).
    ("attn_laurel = (attn_gated + laurel_output) / math.sqrt(2)", "attn_laurel = (attn_gated + laurel_output) / 2",
     "(prediction + attention + Laurel) / sqrt(2)"),
    # The correction's coefficients without vLLM's + 1.
    ("all_coefs = self.correction_coefs(modalities) + 1.0", "all_coefs = self.correction_coefs(modalities)",
     "vLLM's correct step"),
    # The router's input scale of another width.
    ("torch.tensor(self.config.hidden_size**-1.0)", "torch.tensor(self.config.hidden_size**-0.5)",
     "no module of the layer is applied to the active copy's prediction"),
    # The per-layer term added to every copy, the active one included.
    ("corrected_predictions[1:] += first_prediction", "corrected_predictions += first_prediction",
     "what the layer returns"),
])
def test_a_layer_computing_otherwise_is_refused_naming_the_step(old, new, named):
    with pytest.raises(altup.Refused) as exc:
        altup.read(_changed(old, new), CONFIG)
    assert named in str(exc.value)
    assert "Gemma3nTextDecoderLayer" in str(exc.value)


def test_the_models_merge_and_floor_are_read_from_what_it_computes():
    # Another floor of the magnitude rescale is read as that number (it acts where the copies are small).
    form = altup.read(_changed("epsilon_tensor = torch.tensor(1e-5)", "epsilon_tensor = torch.tensor(1e-3)"), CONFIG)
    assert form.eps == 1e-3
    # Copies summed, not averaged, after the layers.
    with pytest.raises(altup.Refused, match="merge the copies as the mean"):
        altup.read(_changed("hidden_states = torch.mean(hidden_states, dim=0)",
                            "hidden_states = torch.sum(hidden_states, dim=0)"), CONFIG)


# A lab's AltUp written unlike Gemma-3n's: the mixer's methods named otherwise, its coefficients applied by einsum,
# the router's norm and scale folded in one line, the magnitudes floored by clamp_min before the square root, the
# copies built and merged by comprehensions, the layer calling the attention before the low-rank branch, the
# per-layer input handed by keyword and the output scale applied without a config switch.
LAB = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.wq = nn.Linear(config.hidden_size, config.num_attention_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.num_attention_heads * config.head_dim, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        q, k = apply_rope(self.wq(x), self.wk(x), cos, sin)
        return self.wo(F.scaled_dot_product_attention(q, k, self.wv(x), attn_mask=mask))


class LabFFN(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w1 = nn.Linear(config.hidden_size, config.ffn_dim, bias=False)
        self.w3 = nn.Linear(config.hidden_size, config.ffn_dim, bias=False)
        self.w2 = nn.Linear(config.ffn_dim, config.hidden_size, bias=False)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x), approximate="tanh") * self.w3(x))


class LowRank(nn.Module):
    def __init__(self, dim, rank):
        super().__init__()
        self.a = nn.Linear(dim, rank, bias=False)
        self.b = nn.Linear(rank, dim, bias=False)
        self.out_norm = LabRMSNorm(dim)

    def forward(self, x):
        return x + self.out_norm(self.b(self.a(x)))


class StreamMixer(nn.Module):
    def __init__(self, dim, k):
        super().__init__()
        self.k = k
        self.gain = nn.Parameter(torch.ones(dim))
        self.fix_w = nn.Linear(k, k, bias=False)
        self.guess_w = nn.Linear(k, k * k, bias=False)
        self.route = nn.Linear(dim, k, bias=False)
        self.route_norm = LabRMSNorm(dim)
        self.inv_dim = 1.0 / dim

    def weights(self, x):
        return torch.tanh(self.route(self.route_norm(x) * self.inv_dim))

    def guess(self, s):
        w = self.guess_w(self.weights(s[0])).view(*s.shape[1:3], self.k, self.k)
        return s + torch.einsum("btjk,kbth->jbth", w, s)

    def fix(self, g, y):
        c = self.fix_w(self.weights(y)) + 1.0
        return g + torch.einsum("btj,bth->jbth", c, y - g[0])


class LabLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn = LabAttention(config, layer_idx)
        self.ffn = LabFFN(config)
        self.mixer = StreamMixer(config.hidden_size, config.n_streams)
        self.branch = LowRank(config.hidden_size, config.branch_rank)
        self.n1 = LabRMSNorm(config.hidden_size)
        self.n2 = LabRMSNorm(config.hidden_size)
        self.n3 = LabRMSNorm(config.hidden_size)
        self.n4 = LabRMSNorm(config.hidden_size)
        self.side_in = nn.Linear(config.hidden_size, config.side_dim, bias=False)
        self.side_out = nn.Linear(config.side_dim, config.hidden_size, bias=False)
        self.side_norm = LabRMSNorm(config.hidden_size)
        self.side_act = nn.GELU(approximate="tanh")

    def forward(self, s, side=None, cos=None, sin=None, mask=None):
        g = self.mixer.guess(s)
        lead = g[0]
        h = self.n1(lead)
        a = self.n2(self.attn(h, cos, sin, mask))
        r = self.branch(h)
        x = (lead + a + r) * (2 ** -0.5)
        x = x + self.n4(self.ffn(self.n3(x)))
        out = self.mixer.fix(g, x)
        top = out[0] * self.mixer.gain
        extra = self.side_norm(self.side_out(self.side_act(self.side_in(top)) * side))
        return torch.cat([out[:1], out[1:] + extra], dim=0)


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tok = nn.Embedding(config.vocab_size, config.hidden_size)
        self.side_tok = nn.Embedding(config.vocab_size, config.num_hidden_layers * config.side_dim)
        self.spread = nn.ModuleList([nn.Linear(config.hidden_size, config.hidden_size, bias=False)
                                     for _ in range(config.n_streams - 1)])
        self.gather = nn.ModuleList([nn.Linear(config.hidden_size, config.hidden_size, bias=False)
                                     for _ in range(config.n_streams - 1)])
        self.blocks = nn.ModuleList([LabLayer(config, i) for i in range(config.num_hidden_layers)])
        self.final = LabRMSNorm(config.hidden_size)

    @staticmethod
    def matched(z, ref):
        want = ref.pow(2).mean(-1, keepdim=True).sqrt()
        return z * want / z.pow(2).mean(-1, keepdim=True).clamp_min(1e-6).sqrt()

    def forward(self, ids, cos=None, sin=None, mask=None):
        x = self.tok(ids)
        side = self.side_tok(ids).view(*ids.shape, self.config.num_hidden_layers, self.config.side_dim)
        h = torch.stack([x] + [self.matched(p(x), x) for p in self.spread])
        for i, block in enumerate(self.blocks):
            h = block(h, side=side[:, :, i], cos=cos, sin=sin, mask=mask)
        merged = torch.stack([h[0]] + [self.matched(q(h[k + 1]), h[0]) for k, q in enumerate(self.gather)])
        return self.final(merged.mean(0))


class LabForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = LabModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
'''

LAB_CONFIG = {"hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 12, "ffn_dim": 80, "vocab_size": 40, "n_streams": 3, "branch_rank": 8, "side_dim": 6}


def test_a_lab_altup_written_otherwise_is_read_by_its_values():
    form = altup.read({"modeling_lab.py": LAB}, LAB_CONFIG)
    assert (form.count, form.count_expr, form.active, form.eps) == (3, "config.n_streams", 0, 1e-6)
    assert (form.scale_output, form.scale_expr) == (True, None)
    assert (form.module, form.prediction, form.correction, form.router, form.router_norm, form.output_scale) == (
        "mixer", "guess_w", "fix_w", "route", "route_norm", "gain")
    assert (form.projections, form.unembed_projections) == ("spread", "gather")
    assert (form.laurel, form.laurel_down, form.laurel_up, form.laurel_norm, form.laurel_rank_expr) == (
        "branch", "a", "b", "out_norm", "config.branch_rank")
    assert form.roles == {"attn_norm": "n1", "self_attn": "attn", "attn_post_norm": "n2", "mlp_norm": "n3",
                          "mlp": "ffn", "mlp_post_norm": "n4", "per_layer_input_gate": "side_in",
                          "per_layer_input_act": "side_act", "per_layer_input_proj": "side_out",
                          "per_layer_input_norm": "side_norm"}


def test_a_lab_mixer_correcting_from_its_guess_of_another_copy_is_refused():
    # The innovation taken against copy 1's prediction while the layer runs on copy 0: not vLLM's correct step.
    with pytest.raises(altup.Refused, match="LabLayer"):
        altup.read({"modeling_lab.py": LAB.replace("y - g[0]", "y - g[1]")}, LAB_CONFIG)


def test_one_residual_stream_reads_no_altup():
    assert altup.read(transformers_code("llama"), {"hidden_size": 64, "num_hidden_layers": 2}) is None


def test_a_step_on_the_copies_the_reader_does_not_run_is_not_skipped_silently():
    # The model's forward steps the reader does not run are skipped (masks, caches); one changing the copies in place
    # leaves them unknown, and the reading refuses rather than compare copies the code does not hand its layers.
    changed = LAB.replace("        for i, block in enumerate(self.blocks):",
                          "        h[1:] = h[1:] * torch.special.erf(h[1:])\n"
                          "        for i, block in enumerate(self.blocks):")
    assert changed != LAB
    with pytest.raises(altup.Refused, match="LabModel.forward hands its layers NoneType"):
        altup.read({"modeling_lab.py": changed}, LAB_CONFIG)
