"""A rotary module handed a projection's output only for its dtype and device (Llama's older
`cos, sin = self.rotary_emb(value_states, seq_len=kv_seq_len)`, Hunyuan-Large's): its table comes from positions,
so the rotated queries and keys do not come from v_proj too. Hunyuan-Large normalizes q and k after the rotary
embedding; with cos/sin taken as derived from v_proj, the norms were not found in its code and the order fell back
to the default (before), and the port diverged at layer 0's attention. The lab is written here in that form (its
code is read, never run)."""

from __future__ import annotations

import json

from ckpt_factory import Shape, config_for, tensors_for, write_checkpoint
from helpers import detect_until

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import layout

MODELING = '''
import torch
from torch import nn


class LabRotary(nn.Module):
    def __init__(self, dim, base=10000):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), persistent=False)

    def forward(self, x, seq_len=None):
        t = torch.arange(seq_len, device=x.device, dtype=self.inv_freq.dtype)
        emb = torch.cat((torch.outer(t, self.inv_freq),) * 2, dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class LabNTKRotary(LabRotary):
    def __init__(self, dim, base=10000, alpha=1.0):
        super().__init__(dim, base * alpha ** (dim / (dim - 2)))


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids):
    cos, sin = cos[position_ids].unsqueeze(1), sin[position_ids].unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class LabRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class LabAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.q_norm = LabRMSNorm(self.head_dim)
        self.k_norm = LabRMSNorm(self.head_dim)
        self._init_rope(config)

    def _init_rope(self, config):
        # Built in a helper, one class per scaling type (Hunyuan-Large's, Llama's older code).
        if config.rope_scaling is None:
            self.rotary_emb = LabRotary(self.head_dim)
        else:
            self.rotary_emb = LabNTKRotary(self.head_dim, alpha=config.rope_scaling["alpha"])

    def forward(self, hidden_states, position_ids):
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, s, self.num_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, s, self.num_kv, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary_emb(v, seq_len=s)
        q, k = apply_rotary_pos_emb(q, k, cos, sin, position_ids)
        q = self.q_norm(q)
        k = self.k_norm(k)
        k = k.repeat_interleave(self.num_heads // self.num_kv, dim=1)
        v = v.repeat_interleave(self.num_heads // self.num_kv, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) / self.head_dim ** 0.5
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, -1)
        return self.o_proj(out)


class LabMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LabDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.input_layernorm = LabRMSNorm(config.hidden_size)
        self.self_attn = LabAttention(config)
        self.post_attention_layernorm = LabRMSNorm(config.hidden_size)
        self.mlp = LabMLP(config)

    def forward(self, hidden_states, position_ids):
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), position_ids)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabDecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = LabRMSNorm(config.hidden_size)


class RotlabForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = LabModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
'''


def _lab(tmp_path, modeling: str):
    shape = Shape(family="qwen3", architecture="RotlabForCausalLM", model_type="rotlab", extra={"rope_scaling": None})
    root = write_checkpoint(tmp_path / "rotlab", shape, tensors=tensors_for(shape), config=config_for(shape))
    (root / "modeling_rotlab.py").write_text(modeling)
    config = json.loads((root / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_rotlab.RotlabForCausalLM"}
    (root / "config.json").write_text(json.dumps(config))
    return read_checkpoint(root)


def test_q_k_norms_after_a_rotary_fed_the_values_for_their_dtype_are_read_after(tmp_path):
    spec = detect_until(_lab(tmp_path, MODELING), layout)  # before: False, "(the code did not say)"
    assert spec.qk_norm == "per_head" and spec.qk_norm_after_rope is True
    assert spec.source("qk_norm_after_rope").kind == "code"


def test_a_rotary_module_that_computes_with_its_input_still_carries_it(tmp_path):
    # Its forward multiplies its argument: what it returns derives from that projection, the order stays unread.
    scaled = MODELING.replace("return emb.cos().to(x.dtype), emb.sin().to(x.dtype)",
                              "return emb.cos() * x.mean(), emb.sin() * x.mean()")
    spec = detect_until(_lab(tmp_path, scaled), layout)
    assert spec.source("qk_norm_after_rope").kind == "default"
