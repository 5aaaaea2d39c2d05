"""Sizes and the activation read from what lab-style code computes (examples/labs, read as text, never run)."""

from __future__ import annotations

from helpers import EXAMPLES, transformers_code

from scaffold.detect.mlp import code_activation
from scaffold.detect.sizes import _divisor, _kv_keys

LABS = EXAMPLES / "labs"


def sources(name: str) -> dict[str, str]:
    path = LABS / name / f"modeling_{name}.py"
    return {path.name: path.read_text(encoding="utf-8")}


def test_the_head_count_is_the_divisor_of_the_hidden_size():
    found = _divisor(sources("kestrel"), {"n_heads": 4}, "config.d_hidden")
    assert found is not None and found[0].expr == "config.n_heads" and found[1] == 4
    assert _divisor(sources("plover"), {"attn_heads": 8}, "config.embed_dim")[0].expr == "config.attn_heads"


def test_no_divisor_or_a_non_number_gives_nothing():
    assert _divisor(sources("kestrel"), {"n_heads": 4}, "config.width") is None  # not the hidden key
    assert _divisor(sources("kestrel"), {"n_heads": "4"}, "config.d_hidden") is None
    two = {"m.py": "class A:\n    def f(self, config):\n        a = config.d // config.h\n        b = config.d // config.g\n"}
    assert _divisor(two, {"h": 2, "g": 4}, "config.d") is None  # two readings: not guessed


def test_kv_heads_from_the_group_divisor_or_a_kv_attribute():
    assert _kv_keys(sources("heron"), "config.n_q_heads") == ("kv_groups",)
    assert _kv_keys(sources("kestrel"), "config.n_heads") == ("n_kv_heads",)
    # An attribute that merely mentions kv (a channel count) is not a head count.
    assert _kv_keys({"m.py": "class A:\n    def __init__(self, config):\n        self.kv_channels = config.c\n"},
                    "config.h") == ()


def test_the_activation_the_mlp_applies():
    assert code_activation(sources("kestrel"), "ffn")[0] == "gelu_pytorch_tanh"
    relu2 = {"m.py": "class M:\n    def forward(self, x):\n        return self.down(F.relu(self.up(x)) ** 2)\n"
                     "class B:\n    def __init__(self):\n        self.ffn = M()\n"}
    assert code_activation(relu2, "ffn")[0] == "relu2"
    both = {"m.py": "class M:\n    def forward(self, x):\n        return F.silu(x) + F.gelu(x)\n"
                    "class B:\n    def __init__(self):\n        self.ffn = M()\n"}
    assert code_activation(both, "ffn") is None  # two activations: undecided
    assert code_activation(sources("kestrel"), "no_such_module") is None


def lab_checkpoint(name: str, config: dict):
    from scaffold.checkpoint import Checkpoint, TokenizerInfo

    return Checkpoint(path=LABS / name, config=config, tensors={}, shards=[], index_file=None,
                      tokenizer=TokenizerInfo(), sources=sources(name))


def test_multipliers_under_the_labs_own_keys():
    from scaffold.detect.scaling import _as_multiplier, _scaled_call, _scaled_scores

    config = {"mup_emb_mult": 6.0, "mup_res_mult": 0.6, "mup_attn_mult": 0.25, "mup_logit_div": 2.0}
    ckpt = lab_checkpoint("plover", config)
    assert _as_multiplier(ckpt, _scaled_call(ckpt, "wtok"), "x")[0] == 6.0
    assert _as_multiplier(ckpt, _scaled_call(ckpt, "attn", "mlp"), "x")[0] == 0.6  # through self.res_mult
    value, source = _as_multiplier(ckpt, _scaled_call(ckpt, "output"), "x")
    assert value == 0.5 and source.expr == "1.0 / config.mup_logit_div"
    assert _as_multiplier(ckpt, _scaled_scores(ckpt), "x")[0] == 0.25
    # A model that scales nothing reads as nothing.
    plain = lab_checkpoint("kestrel", {})
    assert _scaled_call(plain, "tok_emb") is None and _scaled_scores(plain) is None


def test_a_positional_argument_is_read_under_its_parameters_name():
    """`FinchRoPE(self.head_dim, config.rope_theta_base)` with `def __init__(self, head_dim, base)`: the base,
    and `nn.LayerNorm(config.width, config.eps_ln)`: the eps, though neither call names the parameter."""
    from scaffold.detect.codekeys import keyword_reads

    assert [f.expr for f in keyword_reads(sources("finch"), "base")] == ["config.rope_theta_base"]
    code = {"m.py": "class Block:\n    def __init__(self, config):\n        self.ln = nn.LayerNorm(config.width, "
                    "config.eps_ln)\n        self.other = Other(config.eps_ln)\n"}
    assert [f.expr for f in keyword_reads(code, "eps")] == ["config.eps_ln"]  # Other's parameters are unknown


def test_the_activation_a_transformers_mlp_builds_when_the_config_names_none():
    """MPT's MptMLP builds nn.GELU(approximate="none") in __init__; its config has no hidden_act."""
    act, where = code_activation(transformers_code("mpt"), "ffn")
    assert act == "gelu" and where.startswith("modeling_mpt.py:")


def test_an_activation_module_reaching_its_formula_through_an_autograd_function():
    # BLOOM: BloomMLP builds BloomGelu(), whose forward is GeLUFunction.apply(x), whose forward calls
    # bloom_gelu_forward: x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x))), the tanh GELU.
    act, where = code_activation(transformers_code("bloom"), "mlp")
    assert act == "gelu_new" and where.startswith("modeling_bloom.py:")


def test_a_fused_qkv_viewed_per_head_in_a_helper_method_is_interleaved():
    # BLOOM's forward hands query_key_value's output to self._reshape, which views it (..., heads, 3, head_dim).
    from scaffold.detect.sourcecode import interleaved_qkv

    assert interleaved_qkv(transformers_code("bloom"), "query_key_value") is not None
    assert interleaved_qkv(transformers_code("gpt2"), "c_attn") is None  # q, k, v one after another


LAB_MLP = '''
import torch
from torch import nn


class Wiggle(nn.Module):
    def forward(self, x):
        return x * torch.erf(x) * 0.7


class LabMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)
        self.drop = nn.Dropout(0.1)
        self.wiggle = Wiggle()

    def forward(self, x):
        return self.drop(self.down(self.wiggle(self.up(x))))


class LabLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ffn = LabMLP(config)
'''


def test_an_activation_module_the_reader_does_not_know_is_reported_not_defaulted():
    from scaffold.detect.mlp import _unread_activation

    sources = {"modeling_lab.py": LAB_MLP}
    assert code_activation(sources, "ffn") is None
    assert _unread_activation(sources, "ffn", {"up", "down"}) == "modeling_lab.py:20: self.wiggle"
    known = {"modeling_lab.py": LAB_MLP.replace("self.wiggle = Wiggle()", "self.wiggle = nn.GELU()")}
    assert code_activation(known, "ffn")[0] == "gelu"


# A lab's attention that keeps three q/k/v layouts behind its config flags, as Falcon's _split_heads does, under
# names of its own: the layout is the one the checkpoint's config selects.
FLAGGED_LAYOUTS = '''
class TernAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_kv = config.n_kv
        self.dim_head = config.width // config.n_head
        self.grouped_kv = config.grouped_kv
        self.shared_kv = config.shared_kv
        self.wqkv = nn.Linear(config.width, 3 * config.width)

    def _heads(self, fused):
        b, s, _ = fused.shape
        if self.grouped_kv:
            qkv = fused.reshape(b, s, -1, self.n_head // self.n_kv + 2, self.dim_head)
            return qkv[..., :-2, :], qkv[..., [-2], :], qkv[..., [-1], :]
        elif not self.shared_kv:
            qkv = fused.reshape(b, s, self.n_head, 3, self.dim_head)
            return qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
        qkv = fused.reshape(b, s, self.n_head + 2, self.dim_head)
        return qkv[..., :-2, :], qkv[..., [-2], :], qkv[..., [-1], :]

    def forward(self, x):
        q, k, v = self._heads(self.wqkv(x))
'''


def test_the_qkv_layout_is_the_branch_the_config_selects():
    from scaffold.detect.sourcecode import interleaved_qkv

    code = {"modeling_tern.py": FLAGGED_LAYOUTS}
    grouped = interleaved_qkv(code, "wqkv", {"grouped_kv": True, "shared_kv": False})
    assert grouped is not None and grouped.value == "grouped" and grouped.line == 15
    per_head = interleaved_qkv(code, "wqkv", {"grouped_kv": False, "shared_kv": False})
    assert per_head is not None and per_head.value == "interleaved" and per_head.line == 18
    assert interleaved_qkv(code, "wqkv", {"grouped_kv": False, "shared_kv": True}) is None  # q, k, v one after another
    # Flags config.json does not hold rule nothing out: the first view the class holds counts, as before.
    assert interleaved_qkv(code, "wqkv", {}).value == "grouped"


def test_falcons_multi_query_branch_is_fused_and_its_activation_key_is_read():
    from scaffold.detect.sourcecode import interleaved_qkv

    falcon = transformers_code("falcon")
    assert interleaved_qkv(falcon, "query_key_value", {"new_decoder_architecture": False, "multi_query": True}) is None
    assert interleaved_qkv(falcon, "query_key_value",
                           {"new_decoder_architecture": True, "multi_query": True}).value == "grouped"
    assert interleaved_qkv(falcon, "query_key_value",
                           {"new_decoder_architecture": False, "multi_query": False}).value == "interleaved"


# MiniCPM's form (its remote code, the labs' report): head_dim from the module's own attributes, and a width ratio
# `config.hidden_size / config.dim_model_base` dividing the hidden states before the head. The ratio is a logits
# scale, not hidden_size // heads: config.dim_model_base read as the head count gave 32 heads of 8 for 8 of 32.
MUP_HEAD = '''
class LabAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.hidden_size // self.num_heads


class LabForCausalLM(nn.Module):
    def forward(self, hidden_states):
        return self.lm_head(hidden_states / (self.config.hidden_size / self.config.dim_model_base))
'''


def test_a_width_ratio_that_scales_the_hidden_states_is_not_the_head_count():
    config = {"hidden_size": 256, "num_attention_heads": 8, "dim_model_base": 32}
    assert _divisor({"modeling_lab.py": MUP_HEAD}, config, "config.hidden_size") is None
    # The same division as a size (assigned, or as a module's width) still names the head count.
    sized = MUP_HEAD.replace("self.head_dim = self.hidden_size // self.num_heads",
                             "self.head_dim = config.hidden_size // config.num_attention_heads")
    found = _divisor({"modeling_lab.py": sized}, config, "config.hidden_size")
    assert found is not None and found[0].expr == "config.num_attention_heads" and found[1] == 8
