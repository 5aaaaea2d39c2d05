"""Hyper-connections read from what the code computes (scaffold.detect.hyperconn): the model's streams, each
sublayer's mixer (its input weights, write-back weights and, with a matrix of 2N + N*N rows, the streams' mixing
matrix made doubly stochastic by Sinkhorn iterations), the layer's write-back and the head, fitted to the form the
port computes and each number traced to the config key it comes from. On transformers' two files (HY-V4's,
DeepSeek-V4's) and a lab's module written otherwise; forms that compute something else are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import LAB_PRELUDE

from scaffold.detect import forms, hyperconn

TF = Path(__import__("transformers").__file__).parent / "models"


def _transformers(model_type: str) -> dict:
    path = TF / model_type / f"modeling_{model_type}.py"
    return {f"transformers/models/{model_type}/{path.name}": path.read_text(encoding="utf-8")}


CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "hc_mult": 4, "hc_eps": 1e-6,
          "hc_magnitude": 1.5, "hc_sinkhorn_iters": 20}


def _numbers(mixer) -> dict:
    return {k: (v.value, v.key) for k, v in mixer.numbers.items()}


def test_hy_v4_mixers_head_and_numbers_read_from_transformers_code():
    found = hyperconn.read(_transformers("hy_v4"), CONFIG)
    assert (found.streams.value, found.streams.key) == (4, "hc_mult")
    assert (found.attn.attr, found.mlp.attr, found.attn.cls) == ("attn_hc", "ffn_hc", "HYV4HyperConnection")
    assert found.attn.params == ("fn", "base", "scale")
    assert (found.head.attr, found.head.params) == ("hc_head", ("hc_fn", "hc_base", "hc_scale"))
    assert (found.attn_chain, found.mlp_chain) == (("input_layernorm", "self_attn"), ("post_attention_layernorm", "mlp"))
    # HY-V4's write-back weights: hc_magnitude * sigmoid(...) + hc_eps; no mixing matrix (the streams kept).
    assert _numbers(found.attn) == {"norm_eps": (1e-5, "rms_norm_eps"), "pre_eps": (1e-6, "hc_eps"),
                                    "post_scale": (1.5, "hc_magnitude"), "post_eps": (1e-6, "hc_eps")}
    assert _numbers(found.head) == {"norm_eps": (1e-5, "rms_norm_eps"), "pre_eps": (1e-6, "hc_eps")}
    # The form the port computes: forms.hyper_connections no longer names it.
    assert forms.hyper_connections(_transformers("hy_v4"), CONFIG) is None


def test_deepseek_v4_sinkhorn_mixing_read_from_transformers_code():
    found = hyperconn.read(_transformers("deepseek_v4"), CONFIG)
    assert found.attn.cls == "DeepseekV4HyperConnection" and found.attn.params == ("fn", "base", "scale")
    # A constant 2 on the write-back weights and no eps; the mixing matrix: softmax + hc_eps, then
    # hc_sinkhorn_iters iterations of Sinkhorn with the same eps.
    assert _numbers(found.attn) == {"norm_eps": (1e-5, "rms_norm_eps"), "pre_eps": (1e-6, "hc_eps"),
                                    "post_scale": (2.0, None), "post_eps": (0.0, None),
                                    "sinkhorn_iters": (20, "hc_sinkhorn_iters"), "sinkhorn_eps": (1e-6, "hc_eps")}


def test_sinkhorn_count_follows_the_config():
    found = hyperconn.read(_transformers("deepseek_v4"), {**CONFIG, "hc_sinkhorn_iters": 3})
    assert _numbers(found.attn)["sinkhorn_iters"] == (3, "hc_sinkhorn_iters")


# A lab's hyper-connections, written unlike either file: a module per sublayer holding `proj`, `shift` and `temp`,
# the streams' RMS divided out with x * x, sigmoid spelled 1 / (1 + exp(-z)), the logits cut with chunk-free
# slices of an einsum, the mixing matrix's Sinkhorn normalisation in a while loop whose count is config.mix_rounds,
# the outputs returned as (write weights, input, matrix); the layer names the mixers `pre_mix`, `post_mix` and
# applies comb^T by an einsum; the head `fold` sums with torch.sum.
LAB_MIXER = '''class Mixer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        k = cfg.streams
        self.k = k
        self.rounds = cfg.mix_rounds
        self.floor = cfg.mix_floor
        self.tiny = cfg.rms_norm_eps
        self.proj = nn.Parameter(torch.zeros((2 + k) * k, k * cfg.hidden_size))
        self.shift = nn.Parameter(torch.zeros((2 + k) * k))
        self.temp = nn.Parameter(torch.ones(3))

    def forward(self, s):
        b, t, k, d = s.shape
        flat = s.reshape(b, t, k * d)
        inv = 1.0 / torch.sqrt((flat * flat).mean(-1, keepdim=True) + self.tiny)
        z = torch.einsum("btc,rc->btr", flat, self.proj) * inv
        read = 1 / (1 + torch.exp(-(z[..., :k] * self.temp[0] + self.shift[:k]))) + self.floor
        write = 3.0 / (1 + torch.exp(-(z[..., k:2 * k] * self.temp[1] + self.shift[k:2 * k])))
        m = z[..., 2 * k:].reshape(b, t, k, k) * self.temp[2] + self.shift[2 * k:].reshape(k, k)
        m = torch.softmax(m, dim=-1) + self.floor
        m = m / (m.sum(-2, keepdim=True) + self.floor)
        i = 1
        while i < self.rounds:
            m = m / (m.sum(-1, keepdim=True) + self.floor)
            m = m / (m.sum(-2, keepdim=True) + self.floor)
            i += 1
        x = torch.einsum("btk,btkd->btd", read, s)
        return write, x, m


class Fold(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tiny = cfg.rms_norm_eps
        self.floor = cfg.mix_floor
        self.proj = nn.Parameter(torch.zeros(cfg.streams, cfg.streams * cfg.hidden_size))
        self.shift = nn.Parameter(torch.zeros(cfg.streams))
        self.temp = nn.Parameter(torch.ones(1))

    def forward(self, s):
        flat = s.flatten(-2)
        inv = 1.0 / torch.sqrt((flat * flat).mean(-1, keepdim=True) + self.tiny)
        w = 1 / (1 + torch.exp(-((flat @ self.proj.t()) * inv * self.temp + self.shift))) + self.floor
        return torch.sum(w[..., None] * s, dim=-2)


'''

LAB_ATTENTION = '''class LabAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.o_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin):
        q, k = apply_rope(self.q_proj(x), self.k_proj(x), cos, sin)
        return self.o_proj(F.scaled_dot_product_attention(q, k, self.v_proj(x), is_causal=True))


class LabMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


'''

LAB_LAYER = '''class LabLayer(nn.Module):
    def __init__(self, cfg, idx):
        super().__init__()
        self.attn = LabAttention(cfg)
        self.ffn = LabMLP(cfg)
        self.norm1 = LabRMSNorm(cfg.hidden_size)
        self.norm2 = LabRMSNorm(cfg.hidden_size)
        self.pre_mix = Mixer(cfg)
        self.post_mix = Mixer(cfg)

    def forward(self, s, cos=None, sin=None):
        w, x, m = self.pre_mix(s)
        a = self.attn(self.norm1(x), cos, sin)
        s = w[..., None] * a[..., None, :] + torch.einsum(WRITE, m, s)
        w, x, m = self.post_mix(s)
        f = self.ffn(self.norm2(x))
        return w[..., None] * f[..., None, :] + torch.einsum(WRITE, m, s)


class LabModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList([LabLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.fold = Fold(cfg)
        self.final = LabRMSNorm(cfg.hidden_size)

    def forward(self, ids):
        h = self.tok(ids)
        s = h.unsqueeze(2).expand(-1, -1, self.cfg.streams, -1)
        for block in self.blocks:
            s = block(s)
        return self.final(self.fold(s))


class LabForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.model = LabModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
'''

LAB_CONFIG = {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 100, "num_hidden_layers": 2,
              "rms_norm_eps": 1e-6, "streams": 3, "mix_rounds": 7, "mix_floor": 0.01}


def _lab(mixer: str = LAB_MIXER, write: str = "btij,btid->btjd") -> dict:
    return {"modeling_lab.py": LAB_PRELUDE + mixer + LAB_ATTENTION
            + LAB_LAYER.replace("WRITE", repr(write))}


def test_a_lab_written_otherwise_is_read_to_the_same_form():
    found = hyperconn.read(_lab(), LAB_CONFIG)
    assert (found.streams.value, found.streams.key) == (3, "streams")
    assert (found.attn.attr, found.mlp.attr, found.attn.params) == ("pre_mix", "post_mix", ("proj", "shift", "temp"))
    assert (found.head.attr, found.head.params) == ("fold", ("proj", "shift", "temp"))
    assert (found.attn_chain, found.mlp_chain) == (("norm1", "attn"), ("norm2", "ffn"))
    assert _numbers(found.attn) == {"norm_eps": (1e-6, "rms_norm_eps"), "pre_eps": (0.01, "mix_floor"),
                                    "post_scale": (3.0, None), "post_eps": (0.0, None),
                                    "sinkhorn_iters": (7, "mix_rounds"), "sinkhorn_eps": (0.01, "mix_floor")}
    assert _numbers(found.head) == {"norm_eps": (1e-6, "rms_norm_eps"), "pre_eps": (0.01, "mix_floor")}


def test_the_mixing_matrix_applied_untransposed_is_refused_by_the_layer_check():
    """sum_j comb_ij * stream_j (comb @ streams) is not the port's sum_i comb_ij * stream_i: Sinkhorn's matrix is
    not symmetric, so the two differ."""
    with pytest.raises(hyperconn.Refused, match=r"LabLayer\.forward .* writes the sublayers' outputs back"):
        hyperconn.read(_lab(write="btij,btjd->btid"), LAB_CONFIG)


def test_input_weights_by_softmax_are_refused_naming_the_class():
    softmax = LAB_MIXER.replace(
        "read = 1 / (1 + torch.exp(-(z[..., :k] * self.temp[0] + self.shift[:k]))) + self.floor",
        "read = torch.softmax(z[..., :k] * self.temp[0] + self.shift[:k], dim=-1)")
    with pytest.raises(hyperconn.Refused, match=r"Mixer\.forward \(modeling_lab\.py:\d+\) does not mix the streams"):
        hyperconn.read(_lab(softmax), LAB_CONFIG)


def test_write_back_weights_of_another_form_are_refused():
    tanh = LAB_MIXER.replace("write = 3.0 / (1 + torch.exp(-(z[..., k:2 * k] * self.temp[1] + self.shift[k:2 * k])))",
                             "write = torch.exp(z[..., k:2 * k] * self.temp[1]) * 0.5")
    with pytest.raises(hyperconn.Refused, match=r"computes the write-back weights otherwise"):
        hyperconn.read(_lab(tanh), LAB_CONFIG)


def test_a_number_neither_in_the_config_nor_in_the_code_is_refused():
    """The floor read from a config key the port could not tell from the code (mix_floor squared)."""
    squared = LAB_MIXER.replace("self.floor = cfg.mix_floor\n        self.tiny",
                                "self.floor = cfg.mix_floor * cfg.mix_floor\n        self.tiny")
    with pytest.raises(hyperconn.Refused, match=r"neither a config key it reads nor a number of its code"):
        hyperconn.read(_lab(squared), LAB_CONFIG)


def test_one_residual_stream_reads_none():
    assert hyperconn.read(_transformers("llama"), {"hidden_size": 64}) is None
