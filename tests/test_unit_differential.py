"""Differential attention read from what the attention computes (scaffold/detect/differential.py): transformers'
DiffLlama, a lab's module written otherwise (other names, [b, s, h, d] layout, sdpa, values cut by slicing, the
output pairs split rather than chunked, the offset written in place), and forms that compute something else
(Microsoft's original pairing adjacent half-width heads, adjacent output heads paired, a weighted norm, no 1 - init
scale, an offset that is not arithmetic of the layer index), each refused naming what differs."""

from __future__ import annotations

import math

import pytest
from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import differential
from scaffold.spec import init_problem

CONFIG = {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
          "lambda_std_dev": 0.1, "attention_dropout": 0.0, "attention_bias": False}
DIFF_PARAMS = ["lambda_k1", "lambda_k2", "lambda_q1", "lambda_q2"]


def test_diffllama_is_read_with_its_pairing_offset_and_eps():
    found = differential.read(transformers_code("diffllama"), "DiffLlamaAttention", CONFIG,
                              ("q_proj", "k_proj", "v_proj", "o_proj"), DIFF_PARAMS)
    assert isinstance(found, differential.Differential), found
    assert set(found.lambdas[:2]) == {"lambda_q1", "lambda_k1"} and set(found.lambdas[2:]) == {"lambda_q2",
                                                                                              "lambda_k2"}
    assert found.init == "0.8 - 0.6 * math.exp(-0.3 * layer_idx)"
    assert found.init_line.startswith("modeling_diffllama.py:") and "lambda_init_fn" in found.init_line
    assert (found.norm, found.eps, found.eps_expr) == ("groupnorm", 1e-5, "config.rms_norm_eps")


def test_the_pairs_order_is_what_the_code_subtracts():
    """The same code with the pairs swapped in the subtraction: the other pair is added."""
    code = transformers_code("diffllama")
    (name, text), = code.items()
    swapped = text.replace("lambda_full = lambda_1 - lambda_2 + self.lambda_init",
                           "lambda_full = lambda_2 - lambda_1 + self.lambda_init")
    assert swapped != text
    found = differential.read({name: swapped}, "DiffLlamaAttention", CONFIG, ("q_proj", "k_proj", "v_proj", "o_proj"),
                              DIFF_PARAMS)
    assert set(found.lambdas[:2]) == {"lambda_q2", "lambda_k2"}


# A lab's differential attention: [b, s, h, d] kept until sdpa, the value halves sliced and concatenated, the
# outputs' pairs split by size, the offset written in place, its own eps key, the scale on the right.
LAB = "import math\n" + LAB_PRELUDE + '''

class LabDiffAttention(nn.Module):
    def __init__(self, config, index):
        super().__init__()
        self.nh, self.nkv = config.num_attention_heads, config.num_key_value_heads
        self.hd = config.head_dim
        self.wq = nn.Linear(config.hidden_size, self.nh * self.hd, bias=False)
        self.wk = nn.Linear(config.hidden_size, self.nkv * self.hd, bias=False)
        self.wv = nn.Linear(config.hidden_size, self.nkv * self.hd, bias=False)
        self.wo = nn.Linear(self.nh * self.hd, config.hidden_size, bias=False)
        self.mix_a = nn.Parameter(torch.zeros(self.hd))
        self.mix_b = nn.Parameter(torch.zeros(self.hd))
        self.mix_c = nn.Parameter(torch.zeros(self.hd))
        self.mix_d = nn.Parameter(torch.zeros(self.hd))
        self.offset = 0.8 - 0.6 * math.exp(-0.3 * index)
        self.pair_norm = nn.RMSNorm(2 * self.hd, eps=config.norm_epsilon, elementwise_affine=False)

    def forward(self, x, rotary, mask=None):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.nh, self.hd)
        k = self.wk(x).view(b, s, self.nkv, self.hd)
        v = self.wv(x).view(b, s, self.nkv, self.hd)
        cos, sin = rotary
        q, k = apply_rope(q, k, cos, sin)
        half = self.nkv // 2
        first = torch.cat([v[:, :, :half], v[:, :, :half]], dim=2)
        second = torch.cat([v[:, :, half:], v[:, :, half:]], dim=2)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        out_a = F.scaled_dot_product_attention(q, k, first.transpose(1, 2), is_causal=True, enable_gqa=True)
        out_b = F.scaled_dot_product_attention(q, k, second.transpose(1, 2), is_causal=True, enable_gqa=True)
        both = torch.cat((out_a, out_b), dim=-1)
        left, right = torch.split(both, self.nh // 2, dim=1)
        weight = torch.exp((self.mix_a * self.mix_b).sum(-1)) - torch.exp((self.mix_c * self.mix_d).sum(-1))
        weight = weight + self.offset
        mixed = self.pair_norm(left - weight * right) * (1 - self.offset)
        return self.wo(mixed.transpose(1, 2).reshape(b, s, -1))
'''
LAB_CONFIG = {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
              "norm_epsilon": 1e-6}
LAB_ROLES = ("wq", "wk", "wv", "wo")
LAB_PARAMS = ["mix_a", "mix_b", "mix_c", "mix_d"]


def read_lab(text: str):
    return differential.read({"modeling_lab.py": text}, "LabDiffAttention", LAB_CONFIG, LAB_ROLES, LAB_PARAMS)


def test_a_lab_differential_attention_written_otherwise_is_read():
    found = read_lab(LAB)
    assert isinstance(found, differential.Differential), found
    assert found.lambdas == ("mix_a", "mix_b", "mix_c", "mix_d")
    assert found.init == "0.8 - 0.6 * math.exp(-0.3 * layer_idx)" and "modeling_lab.py:" in found.init_line
    assert (found.norm, found.eps, found.eps_expr) == ("pair_norm", 1e-6, "config.norm_epsilon")


@pytest.mark.parametrize("old, new, words", [
    # Adjacent output heads paired (2i, 2i + 1), not i with i + H/2.
    ("left, right = torch.split(both, self.nh // 2, dim=1)",
     "left, right = both.unflatten(1, (self.nh // 2, 2)).unbind(2)",
     "is not (1 - init) * RMSNorm(a - (exp(sum(p1 * p2)) - exp(sum(p3 * p4)) + init) * b)"),
    # The values repeated per head (v0, v0, v1, v1) rather than tiled.
    ("first = torch.cat([v[:, :, :half], v[:, :, :half]], dim=2)",
     "first = v[:, :, :half].repeat_interleave(2, dim=2)", "method repeat_interleave"),
    # No 1 - init scale after the norm.
    ("mixed = self.pair_norm(left - weight * right) * (1 - self.offset)",
     "mixed = self.pair_norm(left - weight * right)", "is not (1 - init) * RMSNorm("),
    # A norm holding a weight (Microsoft's subln).
    ("elementwise_affine=False", "elementwise_affine=True", "not normed by one RMSNorm without a weight"),
    # The norm of the lab's own class: what it computes is not followed.
    ("nn.RMSNorm(2 * self.hd, eps=config.norm_epsilon, elementwise_affine=False)",
     "LabRMSNorm(2 * self.hd, eps=config.norm_epsilon)", "LabRMSNorm"),
    # An offset that is not arithmetic of the layer index.
    ("self.offset = 0.8 - 0.6 * math.exp(-0.3 * index)", "self.offset = 0.8 - 0.6 * math.tanh(0.3 * index)",
     "not plain arithmetic of numbers, math.exp/log/sqrt and the layer index (math.tanh"),
])
def test_a_lab_form_that_computes_otherwise_is_refused_naming_it(old, new, words):
    assert old in LAB
    found = read_lab(LAB.replace(old, new))
    assert isinstance(found, str) and words in found, found


# Microsoft's original (unilm/Diff-Transformer): q and k as 2H heads of d/2, the maps of heads 2i and 2i + 1
# subtracted before multiplying by v of H heads of d, a weighted subln.
MICROSOFT = "import math\n" + LAB_PRELUDE + '''

class LabDiffAttention(nn.Module):
    def __init__(self, config, depth):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim // 2
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
        self.lambda_q1 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_k1 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_q2 = nn.Parameter(torch.zeros(self.head_dim))
        self.lambda_k2 = nn.Parameter(torch.zeros(self.head_dim))
        self.subln = nn.RMSNorm(2 * self.head_dim, eps=1e-5, elementwise_affine=True)

    def forward(self, x, rotary_pos, attn_mask=None):
        bsz, tgt_len, _ = x.shape
        q = self.q_proj(x).view(bsz, tgt_len, 2 * self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, tgt_len, 2 * self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, tgt_len, self.num_heads, 2 * self.head_dim).transpose(1, 2)
        attn_weights = torch.matmul(q * self.head_dim ** -0.5, k.transpose(-1, -2))
        attn_weights = F.softmax(attn_weights, dim=-1)
        lambda_1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1))
        lambda_2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1))
        lambda_full = lambda_1 - lambda_2 + self.lambda_init
        attn_weights = attn_weights.view(bsz, self.num_heads, 2, tgt_len, tgt_len)
        attn_weights = attn_weights[:, :, 0] - lambda_full * attn_weights[:, :, 1]
        attn = torch.matmul(attn_weights, v)
        attn = self.subln(attn)
        attn = attn * (1 - self.lambda_init)
        attn = attn.transpose(1, 2).reshape(bsz, tgt_len, self.num_heads * 2 * self.head_dim)
        return self.out_proj(attn)
'''


def test_microsofts_adjacent_half_heads_are_refused_naming_the_difference():
    found = differential.read({"modeling_lab.py": MICROSOFT}, "LabDiffAttention",
                              {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 4},
                              ("q_proj", "k_proj", "v_proj", "out_proj"),
                              ["lambda_k1", "lambda_k2", "lambda_q1", "lambda_q2"])
    assert isinstance(found, str)
    assert "computes 0 attention call(s) and its own softmax (line" in found
    assert "attention maps subtracted before multiplying by v" in found


def test_the_offset_expression_is_checked_before_it_becomes_code():
    assert init_problem("0.8 - 0.6 * math.exp(-0.3 * layer_idx)") is None
    assert init_problem("layer_idx / 10 + math.sqrt(2)") is None
    for bad in ("__import__('os').system('x')", "config.x * layer_idx", "math.pi * layer_idx", "9 ** 9 ** 9",
                "layer_idx if layer_idx else 1", "(lambda: 1)()"):
        assert init_problem(bad), bad
    assert differential.evaluate_init("0.8 - 0.6 * math.exp(-0.3 * layer_idx)", 2) == pytest.approx(
        0.8 - 0.6 * math.exp(-0.6))


def test_the_lab_module_computes_what_diffllama_computes():
    """The lab's module is real code: run in torch on DiffLlama's weights, it gives DiffLlama's output."""
    import torch
    from transformers import DiffLlamaConfig
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention

    config = DiffLlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                             rms_norm_eps=1e-6, attn_implementation="sdpa")
    namespace: dict = {}
    exec(compile(LAB, "modeling_lab.py", "exec"), namespace)  # noqa: S102 - the test's own module text
    lab_config = type("C", (), {**LAB_CONFIG, "norm_epsilon": 1e-6})()
    torch.manual_seed(0)
    theirs, ours = DiffLlamaAttention(config, layer_idx=2), namespace["LabDiffAttention"](lab_config, 2)
    with torch.no_grad():
        for mine, hf in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
            getattr(ours, mine).weight.copy_(torch.randn_like(getattr(theirs, hf).weight))
            getattr(theirs, hf).weight.copy_(getattr(ours, mine).weight)
        for mine, hf in zip(LAB_PARAMS, ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")):
            getattr(ours, mine).copy_(torch.randn(4) * 0.3)
            getattr(theirs, hf).copy_(getattr(ours, mine))
    x = torch.randn(1, 5, 16)
    cos, sin = torch.ones(1, 5, 4), torch.zeros(1, 5, 4)
    expected, _ = theirs(x, (cos, sin), attention_mask=None)
    got = ours(x, (cos.unsqueeze(2), sin.unsqueeze(2)))
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()


def test_render_refuses_an_offset_that_would_become_other_code(tmp_path):
    """A spec reaching render with an offset that is not the checked arithmetic is refused before any code is
    written (spec files are checked on load; this is the check of the spec about to be rendered)."""
    from scaffold.errors import ScaffoldError
    from scaffold.render import check_spec
    from scaffold.spec import Spec

    spec = Spec(architecture="LabForCausalLM", model_type="lab", class_prefix="Lab", package="lab_vllm_port_x")
    spec.diff_lambdas, spec.diff_norm_eps = ["a", "b", "c", "d"], 1e-5
    spec.diff_lambda_init = "__import__('os').getcwd()"
    with pytest.raises(ScaffoldError, match="diff_lambda_init"):
        check_spec(spec)
